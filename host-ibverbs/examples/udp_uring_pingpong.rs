//! The plain UDP ping-pong of `udp_pingpong`, through io_uring: what io_uring would buy the UDP
//! transport's latency on the machine at hand. Each hop's send and the wait for the answer are
//! one submission (a `Send` and a `Recv` queued together), then either
//!
//! - `wait`: one `io_uring_enter` that submits both and sleeps until both complete, or
//! - `spin`: one `io_uring_enter` that submits them, then the completion ring is read in user
//!   space without further system calls until the answer is there (the kernel posts the
//!   completion from its task work, which it runs when it interrupts this task), or
//! - `defer`: as `wait`, on a ring set up for one issuer with its task work deferred to its own
//!   `io_uring_enter` (`IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN`, Linux 6.1),
//!
//! against the plain ping-pong's `send` and a `recv` spun on a non-blocking socket. Reports half
//! the round trip, as perftest and `udp_pingpong` do.
//!
//! ```text
//! udp_uring_pingpong server PORT wait|spin|defer
//! udp_uring_pingpong client HOST:PORT SIZE ITERATIONS wait|spin|defer    # one JSON line
//! ```

use io_uring::{opcode, types, IoUring};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Instant;

/// Sends `out` and waits for one datagram into `buf` through `ring`; returns its length.
fn hop(ring: &mut IoUring, s: &UdpSocket, out: &[u8], buf: &mut [u8], spin: bool) -> usize {
    let fd = types::Fd(s.as_raw_fd());
    let send = opcode::Send::new(fd, out.as_ptr(), out.len() as u32)
        .build()
        .user_data(1);
    let recv = opcode::Recv::new(fd, buf.as_mut_ptr(), buf.len() as u32)
        .build()
        .user_data(2);
    // SAFETY: both buffers outlive the operations: this function returns only after both
    // completions, and any failure before then aborts the process (no unwinding frees them).
    unsafe {
        let mut sq = ring.submission();
        sq.push(&send).expect("room for the send");
        sq.push(&recv).expect("room for the recv");
    }
    let mut got = None;
    let mut sent = false;
    let submitted = if spin {
        ring.submit()
    } else {
        ring.submit_and_wait(2)
    };
    if submitted.is_err() {
        std::process::abort();
    }
    while got.is_none() || !sent {
        for cqe in ring.completion() {
            if cqe.result() < 0 {
                eprintln!("io_uring op {}: error {}", cqe.user_data(), -cqe.result());
                std::process::abort();
            }
            match cqe.user_data() {
                1 => sent = true,
                _ => got = Some(cqe.result() as usize),
            }
        }
        if (got.is_none() || !sent) && !spin && ring.submit_and_wait(1).is_err() {
            // (A wait cut short, by a signal, waits again; that also runs deferred task work.)
            std::process::abort();
        }
        std::hint::spin_loop();
    }
    got.unwrap_or(0)
}

/// The first ping names the peer (a plain `recv_from`); then each hop answers the last ping and
/// waits for the next.
fn serve(port: &str, mode: &str) {
    let spin = mode == "spin";
    let s = UdpSocket::bind(format!("0.0.0.0:{port}")).expect("bind");
    let mut ring = ring(mode);
    let mut buf = vec![0u8; 65536];
    let (n, from) = s.recv_from(&mut buf).expect("the first ping");
    s.connect(from).expect("connect");
    let mut out = buf[..n].to_vec();
    loop {
        let n = hop(&mut ring, &s, &out, &mut buf, spin);
        if n == 1 && buf[0] == 0xff {
            return;
        }
        out.clear();
        out.extend_from_slice(&buf[..n]);
    }
}

fn client(peer: SocketAddr, size: usize, iters: usize, mode: &str) {
    let spin = mode == "spin";
    let s = UdpSocket::bind("0.0.0.0:0").expect("bind");
    s.connect(peer).expect("connect");
    let mut ring = ring(mode);
    let msg = vec![0x5au8; size.max(2)];
    let mut buf = vec![0u8; 65536];
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        hop(&mut ring, &s, &msg, &mut buf, spin);
        samples.push(t0.elapsed().as_nanos() as f64 / 2000.0);
    }
    s.send(&[0xff]).expect("send the end");
    samples.sort_by(f64::total_cmp);
    let p =
        |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    println!(
        "{{\"bytes\":{size},\"iterations\":{iters},\"t_min_us\":{:.3},\"p50_us\":{:.3},\"p99_us\":{:.3}}}",
        samples[0],
        p(0.5),
        p(0.99)
    );
}

/// A ring of eight entries, set up for `mode`.
fn ring(mode: &str) -> IoUring {
    match mode {
        "wait" | "spin" => IoUring::new(8),
        "defer" => IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(8),
        _ => panic!("wait, spin or defer"),
    }
    .expect("io_uring_setup")
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let mode = |s: &str| s.to_string();
    match a.get(1).map(String::as_str) {
        Some("server") if a.len() == 4 => serve(&a[2], &mode(&a[3])),
        Some("client") if a.len() == 6 => client(
            a[2].parse().expect("HOST:PORT"),
            a[3].parse().expect("SIZE"),
            a[4].parse().expect("ITERATIONS"),
            &mode(&a[5]),
        ),
        _ => {
            eprintln!(
                "usage: udp_uring_pingpong server PORT wait|spin|defer | client HOST:PORT SIZE ITERATIONS wait|spin|defer"
            );
            std::process::exit(2);
        }
    }
}
