//! The bandwidth ceiling of bare UDP for `metaroce write-bw`: a sender that sends datagrams of
//! one size for a while with UDP GSO (64 KB a call, as the transport's engine does at most), and
//! a receiver that reads them with UDP GRO and `recvmmsg`, counting the UDP payload bytes. No
//! headers are built, nothing is checked or copied in user space: what the kernel can carry
//! between two processes at that datagram size, on the machine at hand.
//!
//! ```text
//! udp_ceiling recv ADDRESS:PORT                    # prints one JSON line when the sender ends
//! udp_ceiling send HOST:PORT DATAGRAM_BYTES SECONDS [--zerocopy]
//! ```
//!
//! `--zerocopy` sends with `MSG_ZEROCOPY` (`SO_ZEROCOPY`; Linux 5.0 on for UDP): the kernel pins
//! the buffer instead of copying it, and reports on the socket's error queue when each call's
//! pages are free again; the sender reads those reports and keeps at most 64 calls unreported.
//! It shows what zero-copy sending would buy the transport on the machine at hand (the kernel
//! copies zero-copy buffers that are delivered to a local socket, as over loopback or a veth).
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
        arrival_times: true,
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

/// The zero-copy sender: `sendmsg` of `per_call` bytes cut into `size`-byte datagrams, with
/// `MSG_ZEROCOPY`, until `end`; returns (calls, calls the kernel reported it had copied anyway).
fn send_zerocopy(dst: SocketAddr, size: usize, per_call: usize, end: Instant) -> (u64, u64) {
    use std::os::fd::{AsFd, AsRawFd};
    let sock = std::net::UdpSocket::bind(if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
        .expect("bind the send socket");
    sock.connect(dst).expect("connect");
    sock.set_nonblocking(true).expect("non-blocking");
    let fd = sock.as_raw_fd();
    let set = |level, name, v| {
        host_ibverbs::udp::socket::set_int_option(sock.as_fd(), level, name, v)
            .expect("setsockopt");
    };
    set(libc::SOL_SOCKET, libc::SO_ZEROCOPY, 1);
    set(libc::SOL_SOCKET, libc::SO_SNDBUF, 8 << 20);
    let buf = vec![0x5au8; per_call];
    let (mut calls, mut done, mut copied) = (0u64, 0u64, 0u64);
    let mut control = [0u64; 8];
    let reap = |done: &mut u64, copied: &mut u64| loop {
        let mut errq = [0u64; 16];
        // SAFETY: all-zero is a valid msghdr; it points at a live control buffer for the call.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_control = errq.as_mut_ptr().cast();
        h.msg_controllen = size_of_val(&errq) as _;
        // SAFETY: as above; the error queue carries no data, only the control message.
        if unsafe { libc::recvmsg(fd, &mut h, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) } < 0 {
            return;
        }
        // SAFETY: the kernel wrote `msg_controllen` bytes of cmsgs; the macros stay inside them.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&h);
            let whole = libc::CMSG_LEN(size_of::<libc::sock_extended_err>() as u32) as usize;
            let recverr = |c: &libc::cmsghdr| {
                (c.cmsg_level == libc::SOL_IP && c.cmsg_type == libc::IP_RECVERR)
                    || (c.cmsg_level == libc::SOL_IPV6 && c.cmsg_type == libc::IPV6_RECVERR)
            };
            if !c.is_null() && recverr(&*c) && (*c).cmsg_len as usize >= whole {
                let e = libc::CMSG_DATA(c)
                    .cast::<libc::sock_extended_err>()
                    .read_unaligned();
                if e.ee_origin == 5 {
                    // SO_EE_ORIGIN_ZEROCOPY (5); its code SO_EE_CODE_ZEROCOPY_COPIED (1).
                    // Calls ee_info..=ee_data are complete.
                    let n = u64::from(e.ee_data.wrapping_sub(e.ee_info)) + 1;
                    *done += n;
                    if e.ee_code & 1 != 0 {
                        *copied += n;
                    }
                }
            }
        }
    };
    while Instant::now() < end {
        if calls - done >= 64 {
            reap(&mut done, &mut copied);
            continue;
        }
        let mut iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: all-zero is a valid msghdr.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_iov = &mut iov;
        h.msg_iovlen = 1;
        h.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a pure computation.
        h.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as _;
        // SAFETY: the control buffer holds one cmsg of a u16 (64 bytes, CMSG_SPACE(2) is 24).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&h);
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = 103; // UDP_SEGMENT
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
            libc::CMSG_DATA(c)
                .cast::<u16>()
                .write_unaligned(size as u16);
        }
        // SAFETY: `h` points at the live buffer and control block for the call; the buffer
        // outlives every call (the kernel reads it until the call is reported complete; it is
        // dropped only after every report is read below, and otherwise never freed).
        if unsafe { libc::sendmsg(fd, &h, libc::MSG_ZEROCOPY) } >= 0 {
            calls += 1;
        }
        reap(&mut done, &mut copied);
    }
    let wait = Instant::now() + Duration::from_millis(200);
    while done < calls && Instant::now() < wait {
        reap(&mut done, &mut copied);
    }
    if done < calls {
        // The kernel may still read it: never freed (the process ends soon after).
        std::mem::forget(buf);
    }
    (calls, copied)
}

fn send(dst: &str, size: usize, seconds: f64, zerocopy: bool) {
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
    let per_call = (GSO_MAX_BYTES / size).clamp(1, 64) * size;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    if zerocopy {
        let (calls, copied) = send_zerocopy(dst, size, per_call, end);
        eprintln!("zerocopy: {calls} calls, {copied} reported copied by the kernel");
    }
    let sock = UdpSocket::bind(local, &opts(false)).expect("bind the send socket");
    let buf = vec![0x5au8; per_call];
    let run = [SendRun {
        start: 0,
        len: per_call,
        segment: size,
    }];
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
        Some("send") if a.len() == 5 || (a.len() == 6 && a[5] == "--zerocopy") => send(
            &a[2],
            a[3].parse().expect("DATAGRAM_BYTES"),
            a[4].parse().expect("SECONDS"),
            a.len() == 6,
        ),
        _ => {
            eprintln!(
                "usage: udp_ceiling recv ADDRESS:PORT | udp_ceiling send HOST:PORT DATAGRAM_BYTES SECONDS [--zerocopy]"
            );
            std::process::exit(2);
        }
    }
}
