//! The bandwidth ceiling of bare UDP for `metaroce write-bw`: a sender that sends datagrams of
//! one size for a while with UDP GSO (64 KB a call, as the transport's engine does at most), and
//! a receiver that reads them with UDP GRO and `recvmmsg`, counting the UDP payload bytes. No
//! headers are built, nothing is checked or copied in user space: what the kernel can carry
//! between two processes at that datagram size, on the machine at hand.
//!
//! ```text
//! udp_ceiling recv ADDRESS:PORT                    # prints one JSON line when the sender ends
//! udp_ceiling send HOST:PORT DATAGRAM_BYTES SECONDS
//! ```
//!
//! The sender ends with a few one-byte datagrams from another socket (GRO never merges them into
//! the data's last run); the receiver reports the bytes it counted between the first datagram and
//! the first end marker (`gbps` is payload bits per second).

use host_ibverbs::udp::socket::{RecvBatch, SendRun, SocketOptions, UdpSocket, GSO_MAX_BYTES};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

fn opts(gro: bool) -> SocketOptions {
    SocketOptions {
        rcvbuf: 8 << 20,
        sndbuf: 8 << 20,
        gro,
        busy_poll_us: 0,
        dscp: 0,
        priority: 0,
    }
}

fn recv(at: SocketAddr) {
    let sock = UdpSocket::bind(at, &opts(true)).expect("bind the receive socket");
    let mut batch = RecvBatch::new(64, 65_536);
    let (mut bytes, mut first) = (0u64, None::<Instant>);
    loop {
        let _ = sock.wait_readable_ns(100_000_000);
        let n = sock.recv_batch(&mut batch, 64).expect("recvmmsg");
        for i in 0..n {
            let (d, _) = batch.get(i);
            if d.len() == 1 {
                let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64()).max(1e-9);
                println!(
                    "{{\"bytes\": {bytes}, \"seconds\": {secs:.6}, \"gbps\": {:.4}}}",
                    bytes as f64 * 8.0 / secs / 1e9
                );
                return;
            }
            first.get_or_insert_with(Instant::now);
            bytes += d.len() as u64;
        }
    }
}

fn send(dst: &str, size: usize, seconds: f64) {
    let dst: SocketAddr = dst
        .to_socket_addrs()
        .expect("resolve")
        .next()
        .expect("an address");
    let local: SocketAddr = if dst.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let sock = UdpSocket::bind(local, &opts(false)).expect("bind the send socket");
    let per_call = (GSO_MAX_BYTES / size).clamp(1, 64) * size;
    let buf = vec![0x5au8; per_call];
    let run = [SendRun {
        start: 0,
        len: per_call,
        segment: size,
    }];
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        // A full send buffer: try again at once (the transport's engine spins too).
        let _ = sock.send_many(&dst, &buf, &run);
    }
    // The end markers from another socket: GRO would append a short datagram of the same flow
    // to the last coalesced run instead of handing it over alone.
    let sock = UdpSocket::bind(local, &opts(false)).expect("bind the end socket");
    for _ in 0..5 {
        let _ = sock.send_many(
            &dst,
            &[0],
            &[SendRun {
                start: 0,
                len: 1,
                segment: 1,
            }],
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    match a.get(1).map(String::as_str) {
        Some("recv") if a.len() == 3 => recv(a[2].parse().expect("ADDRESS:PORT")),
        Some("send") if a.len() == 5 => send(
            &a[2],
            a[3].parse().expect("DATAGRAM_BYTES"),
            a[4].parse().expect("SECONDS"),
        ),
        _ => {
            eprintln!(
                "usage: udp_ceiling recv ADDRESS:PORT | udp_ceiling send HOST:PORT DATAGRAM_BYTES SECONDS"
            );
            std::process::exit(2);
        }
    }
}
