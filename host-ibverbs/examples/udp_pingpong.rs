//! The latency baseline for `metaroce write-lat`: a plain UDP ping-pong of the same size between
//! two processes, spinning on non-blocking sockets as the tool's completion polling does, and
//! reporting half the round trip as perftest does.
//!
//! ```text
//! udp_pingpong server PORT [--like-transport] [--work NS] [--doorbell]
//! udp_pingpong client HOST:PORT SIZE ITERATIONS [--like-transport] [--work NS] [--doorbell] [--samples FILE]   # one JSON line
//! ```
//!
//! `--like-transport` (both ends) gives the ping-pong the socket features the UDP transport uses,
//! and nothing of its engine: datagrams as long as the transport's for a Write with immediate of
//! SIZE bytes (SIZE + 58: BTH, MetaRoCE headers, immediate, pad, ICRC), ECT(0) and DF on every
//! datagram, 8 MiB socket buffers, UDP GRO on the receiving socket, arrivals read with `recvmsg`
//! and their ECN bits (`IP_RECVTOS`), answers sent from eight connected sockets in turn (the
//! paths). It separates what those features cost from what the engine costs. `--without LIST`
//! (both ends; comma-separated: ect, df, buffers, recvtos, gro, timestamp, paths) leaves the named
//! features out, to tell what each one costs (`paths`: every answer from the first path socket).
//!
//! `--samples FILE` (client) also writes every half round trip, in microseconds, one per line in
//! the order measured, for analyses that pool the samples of several runs
//! (`scripts/bench-lat-pooled.sh`).
//!
//! `--work NS` (both ends) spins NS nanoseconds between receiving a datagram and answering it, as
//! an engine's processing would: it shows what a given cost per hop does to p50 and p99 on the
//! machine at hand (`scripts/bench-lat-budget.sh`).
//!
//! `--doorbell` (both ends; root, or CAP_BPF and CAP_NET_ADMIN) notices an arrival without an
//! empty system call: a socket filter (eBPF) counts every datagram it passes on the receiving
//! socket (the kernel queues it right after) in a map this process has mapped into its memory,
//! and the end spins on that counter, calling `recv` only once it has moved (and again while the
//! kernel has not queued the datagram yet). It tells whether the half of an empty receive call
//! that an arrival waits on average, and the kernel's socket work of the empty calls, are worth
//! removing from a spinning receiver (`DOORBELL=1 scripts/bench-lat-budget.sh`). A datagram the
//! filter passes but the kernel drops (a full socket buffer) leaves the count ahead for good: the
//! end then spins on `recv` as without the option.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes a 2-byte Write with immediate adds on the wire, from the BTH to the ICRC.
const TRANSPORT_OVERHEAD: usize = 58;
const PATHS: usize = 8;

/// setsockopt with an int value; whether it was accepted.
fn try_set(s: &UdpSocket, level: i32, name: i32, value: i32) -> bool {
    host_ibverbs::udp::socket::set_int_option(s.as_fd(), level, name, value).is_ok()
}

fn set(s: &UdpSocket, level: i32, name: i32, value: i32) {
    if let Err(e) = host_ibverbs::udp::socket::set_int_option(s.as_fd(), level, name, value) {
        panic!("setsockopt({level}, {name}): {e}");
    }
}

/// Whether `--without` names socket feature `f` (what each one costs, alone).
fn without(f: &str) -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--without")
        .and_then(|i| args.get(i + 1))
        .is_some_and(|list| list.split(',').any(|x| x == f))
}

/// The UDP transport's socket options (IPv4), less those `--without` names.
fn like_transport(s: &UdpSocket, receives: bool) {
    if !without("ect") {
        set(s, libc::IPPROTO_IP, libc::IP_TOS, 0b10); // ECT(0)
    }
    if !without("df") {
        set(
            s,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        );
    }
    if !without("buffers") {
        set_buffers(s);
    }
    if receives {
        if !without("recvtos") {
            set(s, libc::IPPROTO_IP, libc::IP_RECVTOS, 1);
        }
        if !without("gro") {
            set(s, libc::SOL_UDP, libc::UDP_GRO, 1);
        }
        if !without("timestamp") {
            // The kernel's arrival time on every datagram (SO_TIMESTAMPNS, the 64-bit layout).
            set(s, libc::SOL_SOCKET, 35, 1);
        }
    }
}

/// 8 MiB buffers (needs CAP_NET_ADMIN for the FORCE options; falls back to the plain ones).
fn set_buffers(s: &UdpSocket) {
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if !try_set(s, libc::SOL_SOCKET, force, 8 << 20) {
            set(s, libc::SOL_SOCKET, plain, 8 << 20);
        }
    }
}

/// One datagram, spinning until it comes: `recv_from`, or with `cmsg` a `recvmsg` that also reads
/// the ECN bits as the transport does.
fn spin_recv(s: &UdpSocket, buf: &mut [u8], cmsg: bool) -> (usize, SocketAddr, u8) {
    loop {
        if !cmsg {
            match s.recv_from(buf) {
                Ok((n, from)) => return (n, from, 0),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => panic!("recv: {e}"),
            }
            continue;
        }
        // SAFETY: all-zero is valid for these C structures.
        let mut name: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut control = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: as above.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_name = (&mut name as *mut libc::sockaddr_in).cast();
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        h.msg_iov = &mut iov;
        h.msg_iovlen = 1;
        h.msg_control = control.as_mut_ptr().cast();
        h.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: `h` points at live name, iovec and control buffers for the call.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut h, libc::MSG_DONTWAIT) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "recvmsg: {e}");
            std::hint::spin_loop();
            continue;
        }
        let mut ecn = 0;
        // SAFETY: the kernel wrote `msg_controllen` bytes of cmsgs; the macros stay inside them.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&h);
            while !c.is_null() {
                if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_TOS {
                    ecn = libc::CMSG_DATA(c).read() & 0b11;
                }
                c = libc::CMSG_NXTHDR(&h, c);
            }
        }
        let from = SocketAddr::from((
            u32::from_be(name.sin_addr.s_addr).to_be_bytes(),
            u16::from_be(name.sin_port),
        ));
        return (n as usize, from, ecn);
    }
}

/// A counter of the datagrams a socket filter passed on one socket (each is queued right after,
/// unless the socket's buffer is full), kept in a BPF array map that this process maps into its
/// memory; `taken` is how many of them were read.
struct Doorbell {
    count: *const AtomicU64,
    taken: u64,
    _map: OwnedFd,
    _prog: OwnedFd,
}

impl Doorbell {
    /// Attaches the counting filter to `s`. Attach it before the peer sends: a datagram queued
    /// before is never counted (refused here if one is there).
    fn attach(s: &UdpSocket) -> std::io::Result<Doorbell> {
        use host_ibverbs::udp::xdp::{bpf_new_fd, insn, put32, put64};
        const MAP_CREATE: i32 = 0;
        const PROG_LOAD: i32 = 5;
        const MAP_TYPE_ARRAY: u32 = 2;
        const F_MMAPABLE: u32 = 1 << 10;
        const PROG_TYPE_SOCKET_FILTER: u32 = 1;
        const SO_ATTACH_BPF: i32 = 50;
        // SAFETY: BPF_MAP_CREATE returns a new descriptor; its attributes hold no address.
        let map = unsafe {
            bpf_new_fd(MAP_CREATE, |a| {
                put32(a, 0, MAP_TYPE_ARRAY);
                put32(a, 4, 4); // key size
                put32(a, 8, 8); // value size
                put32(a, 12, 1); // entries
                put32(a, 16, F_MMAPABLE);
            })
        }?;
        // r6 = ctx; key 0 on the stack; r0 = lookup(map, &key); if r0: atomic *r0 += 1;
        // return skb->len (the datagram whole).
        let program: Vec<[u8; 8]> = vec![
            insn(0xbf, 6, 1, 0, 0),
            insn(0x62, 10, 0, -4, 0),
            insn(0xbf, 2, 10, 0, 0),
            insn(0x07, 2, 0, 0, -4),
            insn(0x18, 1, 1, 0, map.as_raw_fd()),
            insn(0, 0, 0, 0, 0),
            insn(0x85, 0, 0, 0, 1),
            insn(0x15, 0, 0, 2, 0),
            insn(0xb7, 1, 0, 0, 1),
            insn(0xdb, 0, 1, 0, 0),
            insn(0x61, 0, 6, 0, 0),
            insn(0x95, 0, 0, 0, 0),
        ];
        let code: Vec<u8> = program.concat();
        let license = b"GPL\0";
        // SAFETY: BPF_PROG_LOAD returns a new descriptor; the kernel reads `insn_cnt` eight-byte
        // instructions at `code` and the NUL-terminated `license`, both live for the call.
        let prog = unsafe {
            bpf_new_fd(PROG_LOAD, |a| {
                put32(a, 0, PROG_TYPE_SOCKET_FILTER);
                put32(a, 4, program.len() as u32);
                put64(a, 8, code.as_ptr() as u64);
                put64(a, 16, license.as_ptr() as u64);
            })
        }?;
        let pfd = prog.as_raw_fd();
        // SAFETY: `pfd` is a live int for the duration of the call, its size given.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_ATTACH_BPF,
                (&pfd as *const RawFd).cast(),
                std::mem::size_of::<RawFd>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, the size of the next datagram waiting, to `queued`.
        if unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut queued) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if queued > 0 {
            return Err(std::io::Error::other(
                "a datagram came before the doorbell was attached",
            ));
        }
        // SAFETY: a new shared, read-only mapping of the map's one page (its value at offset
        // 0), which nothing unmaps: the counter is read through it with relaxed atomic loads
        // only, as read-only memory allows.
        let mem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                0,
            )
        };
        if mem == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Doorbell {
            count: mem.cast(),
            taken: 0,
            _map: map,
            _prog: prog,
        })
    }

    /// Spins until the filter has passed a datagram not yet taken, and takes it from the count
    /// (the caller then spins on `recv` for the moment until the kernel has queued it).
    fn wait(&mut self) {
        // SAFETY: `count` points into the read-only mapping made in `attach`, never unmapped
        // (it lives as long as the process); the kernel updates the counter atomically, and it
        // is only read, with relaxed loads (the datagram itself comes through `recv`).
        let count = unsafe { &*self.count };
        while count.load(Ordering::Relaxed) == self.taken {
            std::hint::spin_loop();
        }
        self.taken += 1;
    }
}

/// Spins for `work` (an engine's processing of one arrival and its answer, emulated).
fn busy(work: Option<Duration>) {
    if let Some(w) = work {
        let t = Instant::now();
        while t.elapsed() < w {
            std::hint::spin_loop();
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let like = args.iter().any(|a| a == "--like-transport");
    // The value after option `name`, if given.
    let value = |name: &str| {
        let i = args.iter().position(|a| a == name)?;
        Some(
            args.get(i + 1)
                .unwrap_or_else(|| panic!("{name} needs a value"))
                .clone(),
        )
    };
    let work =
        value("--work").map(|v| Duration::from_nanos(v.parse().expect("--work NANOSECONDS")));
    let doorbell = |s: &UdpSocket| {
        args.iter()
            .any(|a| a == "--doorbell")
            .then(|| Doorbell::attach(s).unwrap_or_else(|e| panic!("--doorbell: {e} (needs root)")))
    };
    match args.get(1).map(String::as_str) {
        Some("server") => {
            let port = args.get(2).map_or("18700", String::as_str);
            let s = UdpSocket::bind(format!("0.0.0.0:{port}")).expect("bind");
            s.set_nonblocking(true).expect("nonblocking");
            if like {
                like_transport(&s, true);
            }
            let mut bell = doorbell(&s);
            let mut paths: Vec<UdpSocket> = Vec::new();
            let mut turn = 0;
            let mut buf = vec![0u8; 65536];
            loop {
                if let Some(b) = bell.as_mut() {
                    b.wait();
                }
                let (n, from, _ecn) = spin_recv(&s, &mut buf, like);
                busy(work);
                if n == 1 && buf[0] == 0xff {
                    return;
                }
                if !like {
                    s.send_to(&buf[..n], from).expect("send");
                    continue;
                }
                if paths.is_empty() {
                    for _ in 0..PATHS {
                        let p = UdpSocket::bind("0.0.0.0:0").expect("bind");
                        like_transport(&p, false);
                        p.connect(from).expect("connect");
                        paths.push(p);
                    }
                }
                paths[turn % PATHS].send(&buf[..n]).expect("send");
                if !without("paths") {
                    turn += 1;
                }
            }
        }
        Some("client") => {
            let peer: SocketAddr = args[2].parse().expect("HOST:PORT");
            let size: usize = args[3].parse().expect("size");
            let iters: usize = args[4].parse().expect("iterations");
            let samples_file = value("--samples");
            let s = UdpSocket::bind("0.0.0.0:0").expect("bind");
            if like {
                // Answers come from the server's path sockets: no connect() filter here.
                like_transport(&s, true);
            } else {
                s.connect(peer).expect("connect");
            }
            s.set_nonblocking(true).expect("nonblocking");
            let mut bell = doorbell(&s);
            let len = if like {
                size + TRANSPORT_OVERHEAD
            } else {
                size.max(2)
            };
            let msg = vec![0x5au8; len];
            let mut buf = vec![0u8; 65536];
            let mut samples = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t0 = Instant::now();
                if like {
                    s.send_to(&msg, peer).expect("send");
                } else {
                    s.send(&msg).expect("send");
                }
                if let Some(b) = bell.as_mut() {
                    b.wait();
                }
                spin_recv(&s, &mut buf, like);
                busy(work);
                samples.push(t0.elapsed().as_nanos() as f64 / 2000.0);
            }
            let _ = if like {
                s.send_to(&[0xff], peer)
            } else {
                s.send(&[0xff])
            };
            if let Some(path) = samples_file {
                let text: String = samples.iter().map(|v| format!("{v:.3}\n")).collect();
                std::fs::write(&path, text).expect("--samples FILE");
            }
            samples.sort_by(f64::total_cmp);
            let p = |q: f64| {
                samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1]
            };
            println!(
                "{{\"bytes\":{size},\"iterations\":{iters},\"t_min_us\":{:.3},\"p50_us\":{:.3},\"p99_us\":{:.3},\"p999_us\":{:.3},\"t_max_us\":{:.3}}}",
                samples[0],
                p(0.5),
                p(0.99),
                p(0.999),
                samples[samples.len() - 1]
            );
        }
        _ => {
            eprintln!(
                "usage: udp_pingpong server PORT [--like-transport] [--work NS] [--doorbell] | client HOST:PORT SIZE ITERATIONS [--like-transport] [--work NS] [--doorbell] [--samples FILE]"
            );
            std::process::exit(2);
        }
    }
}
