//! What AF_XDP would buy the UDP transport on the machine at hand, measured without the transport:
//! a ping-pong and a bulk sender and receiver of raw Ethernet/IPv4/UDP frames through AF_XDP
//! sockets in copy mode, to run beside `udp_pingpong` and `udp_ceiling` over the same interface
//! (`scripts/bench-xdp.sh`: two namespaces joined by a veth pair).
//!
//! ```text
//! xdp_probe server IFACE PORT                                # answers every frame to PORT
//! xdp_probe client IFACE PORT PEER_IP:PORT SIZE ITERATIONS   # one JSON line, half round trips
//! xdp_probe recv IFACE PORT SECONDS                          # one JSON line: Gb/s of UDP payload
//! xdp_probe send IFACE PORT PEER_IP:PORT SIZE SECONDS
//! ```
//!
//! Each end loads the UDP transport's XDP program (`host_ibverbs::udp::xdp::program`) on its
//! interface (driver mode: a veth runs it in the NAPI poll of its receive queue), which hands the
//! unfragmented IPv4 UDP frames for the interface's address and PORT to its AF_XDP socket
//! through an XSKMAP and passes every other frame to the kernel's stack as before; the program
//! is detached when the process exits (a BPF link). Frames leave through the socket's TX ring
//! with a `sendto` that asks the kernel to send them (copy mode: the kernel copies each into an
//! skb and transmits it); frames arrive in the RX ring, read in user space without a system
//! call (the kernel copies each into the socket's memory in the softirq that received it,
//! which on a veth runs on the sending CPU). The server answers from the frame it received,
//! with the addresses and ports swapped, without copying it.
//!
//! SIZE is the UDP payload; frames are 42 bytes longer, sent to the broadcast MAC (the peer's
//! program takes them before any MAC check). Only for Linux, as root, on an interface with one
//! receive queue and XDP in its driver (a veth pair as `ip link add` makes it; not `lo`, which
//! runs XDP only in the generic mode, and where two ends would need one socket's memory between
//! them: a queue takes one AF_XDP socket unless they share it). A client that has no answer
//! after 100 ms sends its ping again and counts it lost (`lost` in its JSON line).

use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Bytes of each frame buffer in the shared memory (the smallest AF_XDP allows).
const CHUNK: usize = 2048;
/// Frame buffers: the first half is lent to the kernel for arrivals, the second sends.
const FRAMES: usize = 4096;
/// Entries in each of the four rings.
const RING: u32 = 2048;
/// Ethernet, IPv4 (no options) and UDP headers.
const HEADERS: usize = 42;

fn die(what: &str) -> ! {
    eprintln!("{what}: {}", std::io::Error::last_os_error());
    std::process::exit(1);
}

/// One of the socket's four rings, mapped from the kernel.
struct Ring {
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    descs: *mut u8,
    map: *mut c_void,
    map_len: usize,
}

impl Ring {
    /// Maps ring `pgoff` of `fd` with the offsets the kernel gave and `entry` bytes a slot.
    fn map(fd: i32, off: &libc::xdp_ring_offset, pgoff: u64, entry: usize) -> Ring {
        let map_len = off.desc as usize + RING as usize * entry;
        // SAFETY: a shared mapping of the ring the kernel set up for this socket, at the page
        // offset and length its XDP_MMAP_OFFSETS name; checked for failure before any use.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff as libc::off_t,
            )
        };
        if map == libc::MAP_FAILED {
            die("mmap of a ring");
        }
        let base = map.cast::<u8>();
        // SAFETY: the offsets lie inside the mapping (the kernel's layout of this ring); the
        // producer and consumer are 4-byte aligned u32 the kernel updates concurrently, hence
        // atomics.
        unsafe {
            Ring {
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                descs: base.add(off.desc as usize),
                map,
                map_len,
            }
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping (see `map`), unmapped only on drop.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as `producer`.
        unsafe { &*self.consumer }
    }

    /// Slot `i` (any index: taken modulo the ring's size) as a `T`.
    fn slot<T>(&self, i: u32) -> *mut T {
        // SAFETY: the index is reduced to the ring's size, and every slot lies in the mapping;
        // the slots are 8-byte aligned (the kernel's layout for u64 and xdp_desc entries).
        unsafe {
            self.descs
                .add((i & (RING - 1)) as usize * size_of::<T>())
                .cast()
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference to it outlives self.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// An AF_XDP socket in copy mode on queue 0 of an interface, with its frame memory and rings,
/// and the XDP program that steers one UDP port's frames to it.
struct Xsk {
    fd: OwnedFd,
    umem: *mut u8,
    rx: Ring,
    tx: Ring,
    fill: Ring,
    comp: Ring,
    /// Frame buffers for sending not in the TX ring or awaiting their completion.
    free_tx: Vec<u64>,
    _prog: OwnedFd,
    _map: OwnedFd,
    _link: OwnedFd,
}

fn setsockopt<T>(fd: i32, name: i32, v: &T) {
    // SAFETY: `v` is a live value of the size passed; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            name,
            (v as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r != 0 {
        die(&format!("setsockopt(SOL_XDP, {name})"));
    }
}

/// The bpf(2) system call with an attribute block of 128 bytes.
fn bpf(cmd: i32, attr: &mut [u8; 128]) -> i64 {
    // SAFETY: `attr` is a live, writable, zero-initialised block of the size passed, laid out
    // as the kernel's `union bpf_attr` for `cmd` by the caller.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) }
}

fn put32(a: &mut [u8; 128], at: usize, v: u32) {
    a[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(a: &mut [u8; 128], at: usize, v: u64) {
    a[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

fn ifindex(iface: &str) -> u32 {
    let name = std::ffi::CString::new(iface).expect("interface name");
    // SAFETY: a NUL-terminated name.
    let i = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if i == 0 {
        die(&format!("interface {iface}"));
    }
    i
}

impl Xsk {
    fn open(iface: &str, port: u16) -> Xsk {
        let index = ifindex(iface);
        // SAFETY: plain socket creation; the result is checked.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            die("socket(AF_XDP)");
        }
        // SAFETY: `raw` is a new descriptor owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = FRAMES * CHUNK;
        // SAFETY: a fresh anonymous mapping, checked for failure; it lives as long as the
        // process (the kernel pins it for the socket).
        let umem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if umem == libc::MAP_FAILED {
            die("mmap of the frame memory");
        }
        let reg = libc::xdp_umem_reg {
            addr: umem as u64,
            len: len as u64,
            chunk_size: CHUNK as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(raw, libc::XDP_UMEM_REG, &reg);
        for name in [
            libc::XDP_UMEM_FILL_RING,
            libc::XDP_UMEM_COMPLETION_RING,
            libc::XDP_RX_RING,
            libc::XDP_TX_RING,
        ] {
            setsockopt(raw, name, &(RING as i32));
        }
        // SAFETY: all-zero is a valid xdp_mmap_offsets; the kernel fills it.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut olen = size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off` and `olen` are live and writable, of the length passed.
        let r = unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut olen,
            )
        };
        if r != 0 {
            die("getsockopt(XDP_MMAP_OFFSETS)");
        }
        let desc = size_of::<libc::xdp_desc>();
        let rx = Ring::map(raw, &off.rx, libc::XDP_PGOFF_RX_RING as u64, desc);
        let tx = Ring::map(raw, &off.tx, libc::XDP_PGOFF_TX_RING as u64, desc);
        let fill = Ring::map(raw, &off.fr, libc::XDP_UMEM_PGOFF_FILL_RING, 8);
        let comp = Ring::map(raw, &off.cr, libc::XDP_UMEM_PGOFF_COMPLETION_RING, 8);
        // The first half of the frames waits for arrivals.
        for i in 0..FRAMES / 2 {
            // SAFETY: slot of the fill ring, which only this thread produces into.
            unsafe { *fill.slot::<u64>(i as u32) = (i * CHUNK) as u64 };
        }
        fill.producer()
            .store((FRAMES / 2) as u32, Ordering::Release);
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_COPY,
            sxdp_ifindex: index,
            sxdp_queue_id: 0,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `sa` is a live sockaddr_xdp of the length passed.
        let r = unsafe {
            libc::bind(
                raw,
                (&sa as *const libc::sockaddr_xdp).cast(),
                size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if r != 0 {
            die("bind(AF_XDP)");
        }
        // The XSKMAP with this socket at queue 0.
        let mut a = [0u8; 128];
        put32(&mut a, 0, 17); // BPF_MAP_TYPE_XSKMAP
        put32(&mut a, 4, 4);
        put32(&mut a, 8, 4);
        put32(&mut a, 12, 1);
        let map = bpf(0, &mut a); // BPF_MAP_CREATE
        if map < 0 {
            die("bpf(BPF_MAP_CREATE)");
        }
        // SAFETY: a new descriptor owned by nothing else.
        let map = unsafe { OwnedFd::from_raw_fd(map as i32) };
        let (key, value) = (0u32, raw as u32);
        let mut a = [0u8; 128];
        put32(&mut a, 0, map.as_raw_fd() as u32);
        put64(&mut a, 8, &key as *const u32 as u64);
        put64(&mut a, 16, &value as *const u32 as u64);
        if bpf(2, &mut a) < 0 {
            // BPF_MAP_UPDATE_ELEM
            die("bpf(BPF_MAP_UPDATE_ELEM)");
        }
        let (_, ip) = addresses(iface);
        let code = host_ibverbs::udp::xdp::program(
            map.as_raw_fd(),
            std::net::SocketAddrV4::new(ip.into(), port),
        );
        let license = c"GPL";
        let mut log = vec![0u8; 65536];
        let mut a = [0u8; 128];
        put32(&mut a, 0, 6); // BPF_PROG_TYPE_XDP
        put32(&mut a, 4, (code.len() / 8) as u32);
        put64(&mut a, 8, code.as_ptr() as u64);
        put64(&mut a, 16, license.as_ptr() as u64);
        put32(&mut a, 24, 1); // log level
        put32(&mut a, 28, log.len() as u32);
        put64(&mut a, 32, log.as_mut_ptr() as u64);
        put32(&mut a, 68, 37); // expected attach type BPF_XDP
        let prog = bpf(5, &mut a); // BPF_PROG_LOAD
        if prog < 0 {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            eprintln!("{}", String::from_utf8_lossy(&log[..end]));
            die("bpf(BPF_PROG_LOAD)");
        }
        // SAFETY: a new descriptor owned by nothing else.
        let prog = unsafe { OwnedFd::from_raw_fd(prog as i32) };
        let mut a = [0u8; 128];
        put32(&mut a, 0, prog.as_raw_fd() as u32);
        put32(&mut a, 4, index);
        put32(&mut a, 8, 37); // BPF_XDP
        put32(&mut a, 12, 4); // XDP_FLAGS_DRV_MODE
        let link = bpf(28, &mut a); // BPF_LINK_CREATE
        if link < 0 {
            die("bpf(BPF_LINK_CREATE) of the XDP program");
        }
        // SAFETY: a new descriptor owned by nothing else.
        let link = unsafe { OwnedFd::from_raw_fd(link as i32) };
        Xsk {
            fd,
            umem: umem.cast(),
            rx,
            tx,
            fill,
            comp,
            free_tx: (FRAMES / 2..FRAMES).map(|i| (i * CHUNK) as u64).collect(),
            _prog: prog,
            _map: map,
            _link: link,
        }
    }

    /// The bytes of the frame buffer at `addr`.
    fn frame(&mut self, addr: u64, len: usize) -> &mut [u8] {
        assert!(addr as usize + len <= FRAMES * CHUNK);
        // SAFETY: inside the frame memory (checked); a buffer is either the kernel's (in a ring)
        // or this end's, and only this end's are handed out.
        unsafe { std::slice::from_raw_parts_mut(self.umem.add(addr as usize), len) }
    }

    /// Takes back the send buffers the kernel is done with.
    fn reap(&mut self) {
        let prod = self.comp.producer().load(Ordering::Acquire);
        let mut cons = self.comp.consumer().load(Ordering::Relaxed);
        while cons != prod {
            // SAFETY: a completion slot the kernel produced (before `prod`).
            self.free_tx.push(unsafe { *self.comp.slot::<u64>(cons) });
            cons = cons.wrapping_add(1);
        }
        self.comp.consumer().store(cons, Ordering::Release);
    }

    /// Queues frames (buffer, length) on the TX ring; returns how many fit.
    fn queue(&mut self, frames: &[(u64, u32)]) -> usize {
        let prod = self.tx.producer().load(Ordering::Relaxed);
        let cons = self.tx.consumer().load(Ordering::Acquire);
        let room = (RING - prod.wrapping_sub(cons)) as usize;
        let n = room.min(frames.len());
        for (k, &(addr, len)) in frames[..n].iter().enumerate() {
            let d = self.tx.slot::<libc::xdp_desc>(prod.wrapping_add(k as u32));
            // SAFETY: a TX slot this end owns (between the consumer and the producer plus room).
            unsafe {
                *d = libc::xdp_desc {
                    addr,
                    len,
                    options: 0,
                }
            };
        }
        self.tx
            .producer()
            .store(prod.wrapping_add(n as u32), Ordering::Release);
        n
    }

    /// Asks the kernel to send what the TX ring holds (copy mode sends in this call).
    fn kick(&self) {
        // SAFETY: a send of nothing on this socket: the kernel takes the frames from the ring.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ENOBUFS) => {}
                _ => die("sendto (AF_XDP kick)"),
            }
        }
    }

    /// Takes up to `out.len()` arrivals (buffer, length) from the RX ring, without waiting.
    fn receive(&mut self, out: &mut Vec<(u64, u32)>, max: usize) {
        let prod = self.rx.producer().load(Ordering::Acquire);
        let mut cons = self.rx.consumer().load(Ordering::Relaxed);
        while cons != prod && out.len() < max {
            // SAFETY: an RX slot the kernel produced (before `prod`).
            let d = unsafe { *self.rx.slot::<libc::xdp_desc>(cons) };
            out.push((d.addr, d.len));
            cons = cons.wrapping_add(1);
        }
        self.rx.consumer().store(cons, Ordering::Release);
    }

    /// Lends arrival buffers back to the kernel.
    fn refill(&mut self, addrs: impl Iterator<Item = u64>) {
        let mut prod = self.fill.producer().load(Ordering::Relaxed);
        for a in addrs {
            // SAFETY: the fill ring has a slot for every receive buffer (RING >= FRAMES / 2),
            // and only this thread produces into it.
            unsafe { *self.fill.slot::<u64>(prod) = a };
            prod = prod.wrapping_add(1);
        }
        self.fill.producer().store(prod, Ordering::Release);
    }
}

/// The interface's MAC and IPv4 address (from sysfs and getifaddrs).
fn addresses(iface: &str) -> ([u8; 6], [u8; 4]) {
    let text = std::fs::read_to_string(format!("/sys/class/net/{iface}/address"))
        .unwrap_or_else(|_| die("the interface's MAC"));
    let mut mac = [0u8; 6];
    for (m, h) in mac.iter_mut().zip(text.trim().split(':')) {
        *m = u8::from_str_radix(h, 16).expect("MAC");
    }
    let mut ip = None;
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below; entries are read while it is live.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            die("getifaddrs");
        }
        let mut p = list;
        while !p.is_null() {
            let e = &*p;
            if !e.ifa_addr.is_null()
                && i32::from((*e.ifa_addr).sa_family) == libc::AF_INET
                && std::ffi::CStr::from_ptr(e.ifa_name).to_str() == Ok(iface)
            {
                let sin = &*(e.ifa_addr as *const libc::sockaddr_in);
                ip = Some(sin.sin_addr.s_addr.to_ne_bytes());
            }
            p = e.ifa_next;
        }
        libc::freeifaddrs(list);
    }
    (
        mac,
        ip.unwrap_or_else(|| die("the interface has no IPv4 address")),
    )
}

/// Writes an Ethernet/IPv4/UDP frame of `payload` bytes from `(ip, sport)` to `(peer, dport)`
/// into `f` (broadcast destination MAC).
fn frame(
    f: &mut [u8],
    mac: [u8; 6],
    ip: [u8; 4],
    sport: u16,
    peer: std::net::SocketAddrV4,
    payload: usize,
) {
    let dport = peer.port();
    f[..6].fill(0xff);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = (20 + 8 + payload) as u16;
    let h = &mut f[14..34];
    h.copy_from_slice(&[
        0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    h[2..4].copy_from_slice(&ip_len.to_be_bytes());
    h[12..16].copy_from_slice(&ip);
    h[16..20].copy_from_slice(&peer.ip().octets());
    let mut sum: u32 = h
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let u = &mut f[34..42];
    u[..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
    u[6..8].fill(0); // no UDP checksum
    f[HEADERS..HEADERS + payload].fill(0x5a);
}

/// Swaps the frame's MACs, IPv4 addresses and UDP ports (an answer to its sender).
fn turn_around(f: &mut [u8]) {
    for (a, b, n) in [(0, 6, 6), (26, 30, 4), (34, 36, 2)] {
        let (x, y) = f.split_at_mut(b);
        x[a..a + n].swap_with_slice(&mut y[..n]);
    }
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
        eprintln!("{what} expected (see the usage at the top of examples/xdp_probe.rs)");
        std::process::exit(2)
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("");
    let iface: String = arg(&args, 2, "IFACE");
    let port: u16 = arg(&args, 3, "PORT");
    let mut x = Xsk::open(&iface, port);
    let (mac, ip) = addresses(&iface);
    let mut got = Vec::with_capacity(64);
    match mode {
        "server" => loop {
            // Answer each arrival from its own buffer; the RX buffer goes back to the fill ring
            // once the kernel has sent it (its completion).
            got.clear();
            x.receive(&mut got, 64);
            let mut stop = false;
            let mut answers = Vec::with_capacity(got.len());
            for &(addr, len) in &got {
                let f = x.frame(addr, len as usize);
                stop |= len as usize == HEADERS + 1;
                turn_around(f);
                answers.push((addr, len));
            }
            if !answers.is_empty() {
                let n = x.queue(&answers);
                assert_eq!(n, answers.len(), "TX ring full");
                x.kick();
            }
            let before = x.free_tx.len();
            x.reap();
            let back: Vec<u64> = x
                .free_tx
                .drain(before..)
                .filter(|&a| (a as usize) < FRAMES / 2 * CHUNK)
                .collect();
            x.refill(back.into_iter());
            if stop {
                return;
            }
        },
        "client" => {
            let peer: std::net::SocketAddrV4 = arg(&args, 4, "PEER_IP:PORT");
            let size: usize = arg(&args, 5, "SIZE");
            let iters: usize = arg(&args, 6, "ITERATIONS");
            assert!(
                size >= 2 && HEADERS + size <= CHUNK,
                "SIZE from 2 to {}",
                CHUNK - HEADERS
            );
            let buf = x.free_tx.pop().expect("a send buffer");
            frame(x.frame(buf, HEADERS + size), mac, ip, port, peer, size);
            let mut samples = Vec::with_capacity(iters);
            let mut lost = 0u64;
            while samples.len() < iters {
                let t0 = Instant::now();
                assert_eq!(x.queue(&[(buf, (HEADERS + size) as u32)]), 1);
                x.kick();
                let mut spins = 0u32;
                let answered = loop {
                    got.clear();
                    x.receive(&mut got, 1);
                    if let Some(&(addr, _)) = got.first() {
                        x.refill(std::iter::once(addr));
                        break true;
                    }
                    spins = spins.wrapping_add(1);
                    if spins % 4096 == 0 && t0.elapsed() > Duration::from_millis(100) {
                        break false;
                    }
                };
                if answered {
                    samples.push(t0.elapsed().as_nanos() as f64 / 2000.0);
                } else {
                    lost += 1;
                }
                x.reap();
                x.free_tx.retain(|&a| a != buf);
            }
            let stop = x.free_tx.pop().expect("a send buffer");
            frame(x.frame(stop, HEADERS + 1), mac, ip, port, peer, 1);
            x.queue(&[(stop, (HEADERS + 1) as u32)]);
            x.kick();
            std::thread::sleep(Duration::from_millis(50));
            samples.sort_by(f64::total_cmp);
            let q = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
            println!(
                "{{\"bytes\":{size},\"iterations\":{iters},\"lost\":{lost},\"t_min_us\":{:.3},\"p50_us\":{:.3},\"p99_us\":{:.3},\"p999_us\":{:.3}}}",
                samples[0],
                q(0.5),
                q(0.99),
                q(0.999)
            );
        }
        "recv" => {
            let secs: f64 = arg(&args, 4, "SECONDS");
            let (mut frames, mut bytes) = (0u64, 0u64);
            let mut first: Option<Instant> = None;
            let mut last = Instant::now();
            let end = Instant::now() + Duration::from_secs_f64(secs + 5.0);
            loop {
                got.clear();
                x.receive(&mut got, 64);
                if got.is_empty() {
                    if Instant::now() > end
                        || (first.is_some() && last.elapsed() > Duration::from_millis(300))
                    {
                        break;
                    }
                    continue;
                }
                last = Instant::now();
                first.get_or_insert(last);
                for &(addr, len) in &got {
                    let f = x.frame(addr, len as usize);
                    bytes += (len as usize - HEADERS) as u64;
                    std::hint::black_box(f[HEADERS]);
                }
                frames += got.len() as u64;
                let addrs: Vec<u64> = got.iter().map(|g| g.0).collect();
                x.refill(addrs.into_iter());
            }
            let t = first.map_or(0.0, |f| (last - f).as_secs_f64());
            println!(
                "{{\"frames\":{frames},\"bytes\":{bytes},\"seconds\":{t:.3},\"gbps\":{:.3}}}",
                if t > 0.0 {
                    bytes as f64 * 8.0 / t / 1e9
                } else {
                    0.0
                }
            );
        }
        "send" => {
            let peer: std::net::SocketAddrV4 = arg(&args, 4, "PEER_IP:PORT");
            let size: usize = arg(&args, 5, "SIZE");
            let secs: f64 = arg(&args, 6, "SECONDS");
            assert!(
                size >= 1 && HEADERS + size <= CHUNK,
                "SIZE from 1 to {}",
                CHUNK - HEADERS
            );
            let bufs: Vec<u64> = x.free_tx.clone();
            for &b in &bufs {
                frame(x.frame(b, HEADERS + size), mac, ip, port, peer, size);
            }
            let end = Instant::now() + Duration::from_secs_f64(secs);
            let mut batch = Vec::with_capacity(64);
            while Instant::now() < end {
                x.reap();
                batch.clear();
                while batch.len() < 64 {
                    match x.free_tx.pop() {
                        Some(b) => batch.push((b, (HEADERS + size) as u32)),
                        None => break,
                    }
                }
                let n = x.queue(&batch);
                x.free_tx.extend(batch[n..].iter().map(|b| b.0));
                x.kick();
            }
        }
        _ => {
            eprintln!("usage: xdp_probe server|client|recv|send ... (see examples/xdp_probe.rs)");
            std::process::exit(2);
        }
    }
}
