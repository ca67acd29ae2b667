//! The AF_XDP datapath (`DeviceConfig::xdp`, the tools' `--xdp`): the engine's datagrams leave
//! and arrive as raw Ethernet frames through AF_XDP sockets in copy mode, one on each receive
//! queue of the interface that holds the local address, instead of through the kernel's UDP
//! stack.
//!
//! - **Arrivals** are read from the socket's RX ring in user space, without a system call: a
//!   spinning end notices a datagram as soon as the kernel has copied it in (in the softirq that
//!   received it). An XDP program on the interface hands the socket the IPv4 UDP frames for the
//!   engine's port (not fragments, no IP options) and passes everything else to the kernel's
//!   stack as before (ARP, the connection exchange, other ports); the engine still reads its UDP
//!   socket now and then for what comes that way (another interface, this host, fragments).
//!   Each receive queue has a socket of its own (the program hands a frame to the socket of the
//!   queue it arrived on, as the NIC's RSS spread them), up to [`MAX_QUEUES`]; a frame on a queue
//!   beyond those goes to the stack, and through the UDP socket.
//! - **Departures** are written into frame buffers with their Ethernet, IPv4 and UDP headers
//!   (UDP checksum computed, ECT(0) and the traffic class's DSCP, DF) and sent with one `sendto`
//!   per flush (copy mode: the kernel copies each into a buffer of its own and transmits it),
//!   through queue 0's socket. The
//!   next hop's MAC comes from the kernel's route for it (asked over netlink, as `ip route get`
//!   does: policy rules and every table count; `/proc/net/route`'s main table where netlink does
//!   not answer) and its neighbour table (`/proc/net/arp`); a datagram to an address without one yet (never resolved, or this host)
//!   goes through the UDP socket as without XDP, which also makes the kernel resolve it.
//!
//! The wire is the same either way: an end with `--xdp` talks to one without. Limits: IPv4;
//! sends leave by queue 0 only; frames of at most
//! [`CHUNK`] bytes (an MTU up to 3.5 KB or so, which XDP in a veth's driver also needs); no
//! kernel arrival times (arrivals are dated when read, which a spinning end does at once); the
//! XDP program is detached when the device closes (a BPF link). Frames leave without the
//! interface's queueing discipline (tc shaping and priorities, `SO_PRIORITY`, do not apply) and
//! arrive before netfilter (firewall rules on the engine's port and address are not consulted).
//! Needs CAP_NET_ADMIN and CAP_BPF (root).

use super::socket::{RecvMeta, ECT0};
use std::collections::HashMap;
use std::ffi::c_void;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use transport_core::wire::{EtherType, EthernetRepr, IpRepr, Ipv4Repr, MacAddr, UdpRepr};

/// Bytes of each frame buffer: the largest frame the datapath sends or takes.
pub const CHUNK: usize = 4096;
/// Frame buffers of queue 0's socket: the first half is lent to the kernel for arrivals, the
/// second sends.
const FRAMES: usize = 4096;
/// Receive queues with a socket of their own at most (frames on a queue beyond go to the stack).
pub const MAX_QUEUES: usize = 64;
/// Entries in each of the four rings.
const RING: u32 = 4096;
/// Ethernet (untagged), IPv4 without options and UDP headers.
pub const HEADERS: usize = 14 + 20 + 8;
/// How long an address without a next-hop MAC is not looked up again (its datagrams go through
/// the UDP socket meanwhile).
const NEIGHBOUR_RETRY: Duration = Duration::from_millis(100);
/// How long a next-hop MAC found is used before the kernel's tables are read again (a moved
/// neighbour, a changed route).
const NEIGHBOUR_TTL: Duration = Duration::from_secs(1);
/// How long a queue held by a socket being released is waited for.
const BIND_RETRY: Duration = Duration::from_secs(2);
/// `sendto` calls one kick makes at most while the kernel keeps taking frames.
const KICKS: usize = 256;

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// One of the socket's four rings, mapped from the kernel.
struct Ring {
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    slots: *mut u8,
    map: *mut c_void,
    map_len: usize,
}

impl Ring {
    /// Maps ring `pgoff` of socket `fd` with the offsets the kernel gave, `entry` bytes a slot.
    fn map(fd: RawFd, off: &libc::xdp_ring_offset, pgoff: u64, entry: usize) -> io::Result<Ring> {
        let map_len = off.desc as usize + RING as usize * entry;
        // SAFETY: a shared mapping of a ring the kernel set up for this socket, at the page
        // offset and of the length its XDP_MMAP_OFFSETS name; checked before any use.
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
            return Err(os_err("mmap of an AF_XDP ring"));
        }
        let base = map.cast::<u8>();
        // SAFETY: the offsets lie inside the mapping (the kernel's layout of this ring).
        unsafe {
            Ok(Ring {
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                slots: base.add(off.desc as usize),
                map,
                map_len,
            })
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: a 4-byte aligned u32 inside the live mapping (unmapped only on drop), which
        // the kernel reads and writes concurrently: accessed as an atomic only.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as `producer`.
        unsafe { &*self.consumer }
    }

    /// Slot `i` (taken modulo the ring's size) as a `T` (u64 or xdp_desc, 8-byte aligned).
    fn slot<T>(&self, i: u32) -> *mut T {
        // SAFETY: the index is reduced to the ring's size, so the slot lies in the mapping.
        unsafe {
            self.slots
                .add((i & (RING - 1)) as usize * size_of::<T>())
                .cast()
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; nothing refers to it afterwards.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// The frame memory shared with the kernel.
struct Umem {
    base: *mut u8,
    len: usize,
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: unmaps the anonymous mapping made in `Queue::open`, after the socket that used
        // it (field order in `Queue`).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn set_xdp_opt<T>(fd: RawFd, name: i32, v: &T, what: &str) -> io::Result<()> {
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
        return Err(os_err(what));
    }
    Ok(())
}

/// The bpf(2) system call with a zeroed 128-byte attribute block laid out by `fill`; its
/// result (a new descriptor for the commands that make one, 0 for the others).
fn bpf(cmd: i32, fill: impl FnOnce(&mut [u8; 128])) -> io::Result<i64> {
    let mut attr = [0u8; 128];
    fill(&mut attr);
    bpf_attr(cmd, &mut attr)
}

/// The bpf(2) system call on `attr`, which the kernel may write back into.
fn bpf_attr(cmd: i32, attr: &mut [u8; 128]) -> io::Result<i64> {
    // SAFETY: `attr` is a live, writable block of the size passed, laid out as the kernel's
    // `union bpf_attr` for `cmd` (every pointer in it points at live memory of this frame or
    // the caller's).
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// [`bpf`] for a command that makes a descriptor: the descriptor, owned.
fn bpf_fd(cmd: i32, fill: impl FnOnce(&mut [u8; 128])) -> io::Result<OwnedFd> {
    let fd = RawFd::try_from(bpf(cmd, fill)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bpf: not a descriptor"))?;
    // SAFETY: BPF_MAP_CREATE, BPF_PROG_LOAD and BPF_LINK_CREATE return a new descriptor,
    // owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The bpf(2) system call for a command that makes a descriptor, with a zeroed 128-byte
/// attribute block laid out by `fill`: the descriptor, owned. For code outside the datapath (the
/// tools' probes: `examples/udp_pingpong.rs --doorbell`).
///
/// # Safety
///
/// `cmd` must be a command that returns a new descriptor (BPF_MAP_CREATE, BPF_PROG_LOAD,
/// BPF_LINK_CREATE), and every address `fill` writes into the block must point at memory laid out
/// as the kernel reads or writes it for `cmd`, live for the duration of the call.
pub unsafe fn bpf_new_fd(cmd: i32, fill: impl FnOnce(&mut [u8; 128])) -> io::Result<OwnedFd> {
    bpf_fd(cmd, fill)
}

/// Writes `v` at byte `at` of a bpf(2) attribute block.
pub fn put32(a: &mut [u8; 128], at: usize, v: u32) {
    a[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

/// Writes `v` at byte `at` of a bpf(2) attribute block.
pub fn put64(a: &mut [u8; 128], at: usize, v: u64) {
    a[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// One eBPF instruction: opcode, destination and source registers, offset, immediate.
pub fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut i = [0u8; 8];
    i[0] = code;
    i[1] = (src << 4) | (dst & 0xf);
    i[2..4].copy_from_slice(&off.to_le_bytes());
    i[4..8].copy_from_slice(&imm.to_le_bytes());
    i
}

/// The XDP program: an IPv4 frame without options and not a fragment, carrying UDP to `local`
/// (address and port), goes to the socket in XSKMAP `map_fd` at the frame's queue (to the stack
/// if there is none); every other frame to the stack.
pub fn program(map_fd: RawFd, local: SocketAddrV4) -> Vec<u8> {
    const LDXW: u8 = 0x61;
    const LDXH: u8 = 0x69;
    const LDXB: u8 = 0x71;
    const MOV64X: u8 = 0xbf;
    const MOV64K: u8 = 0xb7;
    const ADD64K: u8 = 0x07;
    const AND64K: u8 = 0x57;
    const JGTX: u8 = 0x2d;
    const JNEK: u8 = 0x55;
    const JNE32K: u8 = 0x56;
    const LDDW: u8 = 0x18;
    const CALL: u8 = 0x85;
    const EXIT: u8 = 0x95;
    const XDP_PASS: i32 = 2;
    const REDIRECT_MAP: i32 = 51;
    const PSEUDO_MAP_FD: u8 = 1;
    // 16-bit loads are little-endian here: a field's network-order bytes read swapped.
    let be16 = |v: u16| i32::from(u16::from_le_bytes(v.to_be_bytes()));
    let pass = 24i16; // index of the "pass" instruction (the wide load takes two slots)
    let port = local.port();
    // The address's network-order bytes as a little-endian 32-bit load reads them, compared in
    // 32 bits (a 64-bit compare would sign-extend the immediate).
    let addr = i32::from_le_bytes(local.ip().octets());
    let to_pass = |at: i16| pass - at - 1;
    [
        insn(LDXW, 2, 1, 0, 0),                     // 0: r2 = ctx->data
        insn(LDXW, 3, 1, 4, 0),                     // 1: r3 = ctx->data_end
        insn(MOV64X, 4, 2, 0, 0),                   // 2: r4 = r2
        insn(ADD64K, 4, 0, 0, HEADERS as i32),      // 3: r4 += 42
        insn(JGTX, 4, 3, to_pass(4), 0),            // 4: shorter than the headers: pass
        insn(LDXH, 5, 2, 12, 0),                    // 5: r5 = EtherType
        insn(JNEK, 5, 0, to_pass(6), be16(0x0800)), // 6: not IPv4: pass
        insn(LDXB, 5, 2, 14, 0),                    // 7: r5 = version and header length
        insn(JNEK, 5, 0, to_pass(8), 0x45),         // 8: options: pass
        insn(LDXB, 5, 2, 23, 0),                    // 9: r5 = protocol
        insn(JNEK, 5, 0, to_pass(10), 17),          // 10: not UDP: pass
        insn(LDXH, 5, 2, 20, 0),                    // 11: r5 = flags and fragment offset
        insn(AND64K, 5, 0, 0, be16(0x3fff)),        // 12: more fragments, or an offset
        insn(JNEK, 5, 0, to_pass(13), 0),           // 13: a fragment: pass (the stack joins them)
        insn(LDXH, 5, 2, 36, 0),                    // 14: r5 = UDP destination port
        insn(JNEK, 5, 0, to_pass(15), be16(port)),  // 15: another port: pass
        insn(LDXW, 5, 2, 30, 0),                    // 16: r5 = IPv4 destination
        insn(JNE32K, 5, 0, to_pass(17), addr),      // 17: another address: pass
        insn(LDXW, 2, 1, 16, 0),                    // 18: r2 = ctx->rx_queue_index
        insn(LDDW, 1, PSEUDO_MAP_FD, 0, map_fd),    // 19: r1 = the map
        insn(0, 0, 0, 0, 0),                        // 20: (its upper half)
        insn(MOV64K, 3, 0, 0, XDP_PASS),            // 21: r3 = pass if no socket
        insn(CALL, 0, 0, 0, REDIRECT_MAP),          // 22: r0 = bpf_redirect_map(r1, r2, r3)
        insn(EXIT, 0, 0, 0, 0),                     // 23
        insn(MOV64K, 0, 0, 0, XDP_PASS),            // 24: pass: r0 = XDP_PASS
        insn(EXIT, 0, 0, 0, 0),                     // 25
    ]
    .concat()
}

/// The interface holding IPv4 address `ip`: its name and index.
fn interface_of(ip: Ipv4Addr) -> io::Result<(String, u32)> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    let mut found = None;
    // SAFETY: getifaddrs fills `list`, freed below; its entries are read only while it lives.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return Err(os_err("getifaddrs"));
        }
        let mut p = list;
        while !p.is_null() {
            let e = &*p;
            if !e.ifa_addr.is_null() && i32::from((*e.ifa_addr).sa_family) == libc::AF_INET {
                let sin = &*(e.ifa_addr as *const libc::sockaddr_in);
                if Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)) == ip {
                    // An address with a label (`eth0:1`) belongs to the interface before it.
                    found = std::ffi::CStr::from_ptr(e.ifa_name)
                        .to_str()
                        .ok()
                        .and_then(|n| n.split(':').next())
                        .map(str::to_owned);
                }
            }
            p = e.ifa_next;
        }
        libc::freeifaddrs(list);
    }
    let name = found.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface holds {ip} (XDP needs the address of one interface)"),
        )
    })?;
    let c = std::ffi::CString::new(name.clone())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name"))?;
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        return Err(os_err(&format!("the index of {name}")));
    }
    Ok((name, index))
}

/// A socket for an interface request in the caller's network namespace, and a request naming
/// interface `dev`.
fn interface_request(dev: &str) -> io::Result<(OwnedFd, libc::ifreq)> {
    // SAFETY: plain socket creation; the result is checked and owned below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(os_err("socket for an interface request"));
    }
    // SAFETY: a new descriptor owned by nothing else.
    let s = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: all-zero is a valid ifreq.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    if dev.len() >= ifr.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name",
        ));
    }
    for (d, b) in ifr.ifr_name.iter_mut().zip(dev.bytes()) {
        *d = b as libc::c_char;
    }
    Ok((s, ifr))
}

/// The receive queues of interface `dev`: its receive and combined channels as its driver
/// reports them (`ETHTOOL_GCHANNELS`, in the caller's network namespace), else the `rx-*`
/// entries of `/sys/class/net/<dev>/queues` (the namespace `/sys` was mounted in), else one.
fn receive_queues(dev: &str) -> usize {
    let channels = || -> Option<usize> {
        let (s, mut ifr) = interface_request(dev).ok()?;
        // struct ethtool_channels: cmd, then max rx, tx, other, combined, then the counts of
        // rx, tx, other and combined channels.
        let mut ch = [0u32; 9];
        ch[0] = 0x3c; // ETHTOOL_GCHANNELS
        ifr.ifr_ifru.ifru_data = ch.as_mut_ptr().cast();
        // SAFETY: `ifr` names the interface and points at `ch`, a live, writable
        // ethtool_channels, which SIOCETHTOOL fills.
        let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCETHTOOL, &mut ifr) };
        let n = (ch[5] + ch[8]) as usize;
        (r == 0 && n > 0).then_some(n)
    };
    channels()
        .or_else(|| {
            let d = std::fs::read_dir(format!("/sys/class/net/{dev}/queues")).ok()?;
            let n = d
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count();
            (n > 0).then_some(n)
        })
        .unwrap_or(1)
}

/// The MAC of interface `dev` (`SIOCGIFHWADDR`: the caller's network namespace, whatever
/// `/sys` shows).
fn hardware_address(dev: &str) -> io::Result<MacAddr> {
    let (s, mut ifr) = interface_request(dev)?;
    // SAFETY: `ifr` is a live ifreq naming the interface (NUL-terminated: zeroed past the
    // name); SIOCGIFHWADDR fills its hardware address.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFHWADDR, &mut ifr) } != 0 {
        return Err(os_err(&format!("the MAC of {dev}")));
    }
    // SAFETY: SIOCGIFHWADDR wrote the `ifru_hwaddr` member of the union.
    let sa = unsafe { ifr.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (m, &b) in mac.iter_mut().zip(sa.sa_data.iter()) {
        *m = b as u8;
    }
    if i32::from(sa.sa_family) != i32::from(libc::ARPHRD_ETHER) || mac == [0; 6] {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{dev} is no Ethernet interface with a MAC address"),
        ));
    }
    Ok(MacAddr(mac))
}

/// A MAC address as `/sys` and `/proc/net/arp` write it (`aa:bb:cc:dd:ee:ff`).
pub fn parse_mac(text: &str) -> Option<MacAddr> {
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for m in &mut mac {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *m = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(MacAddr(mac))
}

/// The route the kernel's main table takes towards `dst`, from `/proc/net/route`'s text (its
/// addresses are the kernel's network-order words printed as host integers, in hex): the
/// longest matching prefix among the routes that are up and not rejecting, the lower metric
/// among equals; its interface and next hop (the gateway, or `dst` itself on a link route).
/// None: no route. (Policy routing and the local table are not read: a destination of this host
/// or one that only another table reaches goes through the UDP socket when its route leaves by
/// another interface, or has no neighbour entry.)
pub fn route_to(routes: &str, dst: Ipv4Addr) -> Option<(&str, Ipv4Addr)> {
    const RTF_UP: u32 = 0x1;
    const RTF_REJECT: u32 = 0x200;
    let word = |s: &str| u32::from_str_radix(s, 16).ok();
    let addr = |v: u32| Ipv4Addr::from(v.to_ne_bytes());
    let mut best: Option<(u32, u32, &str, Ipv4Addr)> = None;
    for line in routes.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let (Some(net), Some(gw), Some(flags), Some(metric), Some(mask)) = (
            word(f[1]),
            word(f[2]),
            word(f[3]),
            f[6].parse::<u32>().ok(),
            word(f[7]),
        ) else {
            continue;
        };
        if flags & RTF_UP == 0 || flags & RTF_REJECT != 0 {
            continue;
        }
        let (net, mask, gw) = (u32::from(addr(net)), u32::from(addr(mask)), addr(gw));
        if u32::from(dst) & mask != net & mask {
            continue;
        }
        let len = mask.count_ones();
        let better = match best {
            None => true,
            Some((l, m, _, _)) => len > l || (len == l && metric < m),
        };
        if better {
            let hop = if gw.is_unspecified() { dst } else { gw };
            best = Some((len, metric, f[0], hop));
        }
    }
    best.map(|(_, _, dev, hop)| (dev, hop))
}

/// The next hop towards `dst` when the kernel's route to it leaves by interface `dev`
/// ([`route_to`]); None when it leaves by another one, or there is none.
pub fn next_hop(routes: &str, dev: &str, dst: Ipv4Addr) -> Option<Ipv4Addr> {
    route_to(routes, dst).and_then(|(d, hop)| (d == dev).then_some(hop))
}

/// The kernel's answer to "which route does a datagram from `src` to `dst` take?": the
/// interface it leaves by and its next hop (the gateway, or `dst` on a link route).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteAnswer {
    /// The outgoing interface's index.
    pub oif: u32,
    /// The next hop.
    pub hop: Ipv4Addr,
}

const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const NLMSG_ERROR: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_SRC: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTN_UNICAST: u8 = 1;

/// An `RTM_GETROUTE` request for `src` to `dst`, as `ip route get DST from SRC` sends it:
/// netlink header (16 bytes), `rtmsg` (12), `RTA_DST` and `RTA_SRC` (8 each).
pub(crate) fn route_request(seq: u32, src: Ipv4Addr, dst: Ipv4Addr) -> [u8; 44] {
    let mut m = [0u8; 44];
    m[0..4].copy_from_slice(&44u32.to_ne_bytes());
    m[4..6].copy_from_slice(&RTM_GETROUTE.to_ne_bytes());
    m[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    // rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags (u32).
    m[16] = libc::AF_INET as u8;
    m[17] = 32;
    m[18] = 32;
    for (at, kind, ip) in [(28, RTA_DST, dst), (36, RTA_SRC, src)] {
        m[at..at + 2].copy_from_slice(&8u16.to_ne_bytes());
        m[at + 2..at + 4].copy_from_slice(&kind.to_ne_bytes());
        m[at + 4..at + 8].copy_from_slice(&ip.octets());
    }
    m
}

/// The route in the kernel's reply to [`route_request`] number `seq` for `dst`: `Ok(None)` for
/// no route (an error the kernel returns, such as unreachable) or one that does not leave as
/// unicast (this host's own address, a blackhole); `Err` for a reply that is not one.
pub(crate) fn parse_route_reply(
    reply: &[u8],
    seq: u32,
    dst: Ipv4Addr,
) -> Result<Option<RouteAnswer>, ()> {
    let u16_at = |b: &[u8], at: usize| -> Option<u16> {
        Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
    };
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let len = u32_at(reply, 0).ok_or(())? as usize;
    let kind = u16_at(reply, 4).ok_or(())?;
    if len < 16 || len > reply.len() || u32_at(reply, 8) != Some(seq) {
        return Err(());
    }
    let msg = &reply[..len];
    match kind {
        // The error (negative errno) or acknowledgement (0) of the request.
        NLMSG_ERROR => match u32_at(msg, 16) {
            Some(0) | None => Err(()),
            Some(_) => Ok(None),
        },
        RTM_NEWROUTE => {
            let rtm = msg.get(16..28).ok_or(())?;
            if rtm[0] != libc::AF_INET as u8 {
                return Err(());
            }
            if rtm[7] != RTN_UNICAST {
                return Ok(None);
            }
            let (mut oif, mut gateway) = (None, None);
            let mut at = 28;
            while at + 4 <= msg.len() {
                let alen = usize::from(u16_at(msg, at).ok_or(())?);
                let akind = u16_at(msg, at + 2).ok_or(())? & 0x3fff;
                if alen < 4 || at + alen > msg.len() {
                    return Err(());
                }
                let data = &msg[at + 4..at + alen];
                match (akind, data.len()) {
                    (RTA_OIF, 4) => oif = u32_at(data, 0),
                    (RTA_GATEWAY, 4) => {
                        gateway = Some(Ipv4Addr::new(data[0], data[1], data[2], data[3]))
                    }
                    _ => {}
                }
                at += alen.div_ceil(4) * 4;
            }
            Ok(oif.map(|oif| RouteAnswer {
                oif,
                hop: gateway.unwrap_or(dst),
            }))
        }
        _ => Err(()),
    }
}

/// Asks the kernel (netlink, `RTM_GETROUTE`) which route a datagram from `src` to `dst` takes:
/// policy rules and every table included, as the UDP socket's own datagrams are routed.
/// `Ok(None)`: no unicast route. An error: netlink is not there or gave no answer.
pub fn route_get(src: Ipv4Addr, dst: Ipv4Addr) -> io::Result<Option<RouteAnswer>> {
    static SEQ: AtomicU32 = AtomicU32::new(1);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    // SAFETY: socket(2) with constant arguments; the descriptor is owned at once below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(os_err("netlink socket"));
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // A reply that never comes must not hold the engine: 100 ms at most.
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: `tv` is a valid timeval of the size passed.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let req = route_request(seq, src, dst);
    // SAFETY: all-zero is a valid sockaddr_nl (the kernel: pid 0, no groups).
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `req` and `kernel` are valid for the lengths passed.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent != req.len() as isize {
        return Err(os_err("netlink request"));
    }
    let mut buf = [0u8; 1024];
    for _ in 0..4 {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(os_err("netlink reply"));
        }
        // (This fresh socket gets only this request's reply; what does not parse is skipped.)
        if let Ok(answer) = parse_route_reply(&buf[..n as usize], seq, dst) {
            return Ok(answer);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "no route in netlink's reply",
    ))
}

/// The MAC of `ip` on interface `dev` in `/proc/net/arp`'s text, if resolved (flag 0x2).
pub fn neighbour_mac(arp: &str, dev: &str, ip: Ipv4Addr) -> Option<MacAddr> {
    for line in arp.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[5] != dev || f[0].parse::<Ipv4Addr>().ok() != Some(ip) {
            continue;
        }
        let flags = u32::from_str_radix(f[2].trim_start_matches("0x"), 16).ok()?;
        if flags & 0x2 == 0 {
            return None;
        }
        return parse_mac(f[3]).filter(|m| m.0 != [0; 6]);
    }
    None
}

/// Writes the Ethernet, IPv4 and UDP headers of a datagram of `len` bytes into `f` (at least
/// [`HEADERS`] + `len` bytes, the datagram already after the headers), UDP checksum included.
/// Returns the frame's length.
#[allow(clippy::too_many_arguments)]
pub fn emit_headers(
    f: &mut [u8],
    dst_mac: MacAddr,
    src_mac: MacAddr,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    tos: u8,
    len: usize,
) -> Option<usize> {
    let total = HEADERS + len;
    let f = f.get_mut(..total)?;
    let eth = EthernetRepr {
        dst: dst_mac,
        src: src_mac,
        vlan: None,
        ethertype: EtherType::IPV4,
    };
    let ip = Ipv4Repr {
        dscp: tos >> 2,
        ecn: transport_core::wire::Ecn::from_bits(tos),
        ident: 0,
        dont_frag: true,
        ttl: 64,
        src: *src.ip(),
        dst: *dst.ip(),
        options: &[],
    };
    let udp = UdpRepr {
        src_port: src.port(),
        dst_port: dst.port(),
        checksum: true,
    };
    let rest = eth.emit(f).ok()?;
    let rest = ip.emit(rest, UdpRepr::LEN + len).ok()?;
    udp.emit(rest, len).ok()?;
    let sum = transport_core::wire::frame::udp_checksum(&IpRepr::V4(ip), &f[34..]);
    f[40..42].copy_from_slice(&sum.to_be_bytes());
    Some(total)
}

/// What a frame the program handed over carries: the sender, the IP header's ECN bits and DSCP,
/// and the UDP payload. None: not an IPv4 UDP datagram to `local` (its lengths are checked).
pub fn parse_frame(f: &[u8], local: SocketAddrV4) -> Option<(RecvMeta, &[u8])> {
    let (eth, rest) = EthernetRepr::parse(f).ok()?;
    if eth.ethertype != EtherType::IPV4 {
        return None;
    }
    // A fragment never reaches here (the program passes them to the stack); checked anyway.
    if rest.len() < 20 || u16::from_be_bytes([rest[6], rest[7]]) & 0x3fff != 0 {
        return None;
    }
    let (ip, _, ip_payload) = Ipv4Repr::parse(rest, false).ok()?;
    if ip.dst != *local.ip() || rest[9] != 17 {
        return None;
    }
    let (udp, _, payload) = UdpRepr::parse(ip_payload).ok()?;
    if udp.dst_port != local.port() {
        return None;
    }
    let meta = RecvMeta {
        len: payload.len(),
        src: Some(SocketAddr::V4(SocketAddrV4::new(ip.src, udp.src_port))),
        ecn: ip.ecn.bits(),
        dscp: ip.dscp,
        segment: 0,
        arrived_realtime: 0,
    };
    Some((meta, payload))
}

/// Counters of the datapath (the engine reports them as its `xdp_*` counters).
#[derive(Debug, Default, Clone, Copy)]
pub struct XdpCounters {
    /// Datagrams handed over.
    pub rx_frames: u64,
    /// Frames that were no IPv4 UDP datagram to the local address and port.
    pub rx_dropped: u64,
    /// Datagrams queued for sending.
    pub tx_frames: u64,
    /// `sendto` calls that asked the kernel to send.
    pub tx_kicks: u64,
    /// Datagrams without a buffer or ring room (lost).
    pub tx_no_room: u64,
    /// Kicks the kernel refused for another reason than a busy ring (the interface down...).
    pub tx_errors: u64,
}

/// The AF_XDP sockets of an interface's receive queues, their frame memory and rings, and the
/// XDP program (see the module's text).
pub struct Xdp {
    // Field order is drop order: the link (detaching the program) and the program first, then
    // the sockets (each before its rings and memory).
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
    /// Queue 0's first (it sends too), then the others in order.
    queues: Vec<Queue>,
    /// The queue whose ring is read first next time (arrivals on every queue get their turn).
    next_rx: usize,
    /// Send buffers neither in the TX ring nor awaiting their completion.
    free_tx: Vec<u64>,
    /// Frames in the TX ring the kernel has not taken yet.
    unsent: bool,
    dev: String,
    /// The interface's index (what the kernel's route answers name).
    index: u32,
    mac: MacAddr,
    local: SocketAddrV4,
    tos: u8,
    /// Next-hop MACs by destination (None: looked up and not found, at that time).
    neighbours: HashMap<Ipv4Addr, (Option<MacAddr>, Instant)>,
    /// What the datapath did.
    pub counters: XdpCounters,
}

/// One AF_XDP socket, bound to one receive queue, with its own frame memory and rings.
struct Queue {
    // Field order is drop order: the socket before the rings and the memory it used.
    fd: OwnedFd,
    rx: Ring,
    /// Queue 0's socket only: the datapath sends through it.
    tx: Option<Ring>,
    fill: Ring,
    comp: Ring,
    umem: Umem,
    /// Receive buffers: the first `rx_frames` chunks of the memory (queue 0 sends from the rest).
    rx_frames: usize,
    /// Datagrams it handed over.
    handed: u64,
}

impl Queue {
    /// A socket on receive queue `queue` of interface `index` (`dev`), with `frames` buffers of
    /// which the first `rx_frames` are lent to the kernel for arrivals; a TX ring when `send`.
    fn open(
        dev: &str,
        index: u32,
        queue: u32,
        frames: usize,
        rx_frames: usize,
        send: bool,
    ) -> io::Result<Queue> {
        debug_assert!(rx_frames <= frames && rx_frames <= RING as usize);
        // SAFETY: plain socket creation; the result is checked.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(os_err("socket(AF_XDP)"));
        }
        // SAFETY: a new descriptor owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = frames * CHUNK;
        // SAFETY: a fresh anonymous mapping, checked; unmapped by `Umem`'s drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(os_err("mmap of the AF_XDP frame memory"));
        }
        let umem = Umem {
            base: base.cast(),
            len,
        };
        let reg = libc::xdp_umem_reg {
            addr: base as u64,
            len: len as u64,
            chunk_size: CHUNK as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        set_xdp_opt(
            raw,
            libc::XDP_UMEM_REG,
            &reg,
            "register the AF_XDP frame memory",
        )?;
        let mut rings = vec![
            libc::XDP_UMEM_FILL_RING,
            libc::XDP_UMEM_COMPLETION_RING,
            libc::XDP_RX_RING,
        ];
        if send {
            rings.push(libc::XDP_TX_RING);
        }
        for name in rings {
            set_xdp_opt(raw, name, &(RING as i32), "size an AF_XDP ring")?;
        }
        // SAFETY: all-zero is a valid xdp_mmap_offsets; the kernel fills it in.
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
            return Err(os_err("the AF_XDP ring offsets"));
        }
        let desc = size_of::<libc::xdp_desc>();
        let rx = Ring::map(raw, &off.rx, libc::XDP_PGOFF_RX_RING as u64, desc)?;
        let tx = match send {
            true => Some(Ring::map(
                raw,
                &off.tx,
                libc::XDP_PGOFF_TX_RING as u64,
                desc,
            )?),
            false => None,
        };
        let fill = Ring::map(raw, &off.fr, libc::XDP_UMEM_PGOFF_FILL_RING, 8)?;
        let comp = Ring::map(raw, &off.cr, libc::XDP_UMEM_PGOFF_COMPLETION_RING, 8)?;
        for i in 0..rx_frames {
            // SAFETY: a slot of the fill ring, which only this end produces into (it has room
            // for every receive buffer: RING >= rx_frames).
            unsafe { *fill.slot::<u64>(i as u32) = (i * CHUNK) as u64 };
        }
        fill.producer().store(rx_frames as u32, Ordering::Release);
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_COPY,
            sxdp_ifindex: index,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // The queue is free once the socket that held it before (this process's last device, a
        // server's last client) is released, which the kernel finishes a little after the close:
        // tried again for a while.
        let tried_until = Instant::now() + BIND_RETRY;
        loop {
            // SAFETY: `sa` is a live sockaddr_xdp of the length passed.
            let r = unsafe {
                libc::bind(
                    raw,
                    (&sa as *const libc::sockaddr_xdp).cast(),
                    size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            if r == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) || Instant::now() > tried_until {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "bind an AF_XDP socket to queue {queue} of {dev} (another one holds \
                         it?): {e}"
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(Queue {
            fd,
            rx,
            tx,
            fill,
            comp,
            umem,
            rx_frames,
            handed: 0,
        })
    }

    /// Frames waiting in the RX ring.
    fn pending(&self) -> bool {
        self.rx.producer().load(Ordering::Acquire) != self.rx.consumer().load(Ordering::Relaxed)
    }

    /// As [`Xdp::receive`], from this queue's ring.
    fn receive(
        &mut self,
        max: usize,
        local: SocketAddrV4,
        counters: &mut XdpCounters,
        f: &mut dyn FnMut(RecvMeta, &[u8]),
    ) -> usize {
        let prod = self.rx.producer().load(Ordering::Acquire);
        let mut cons = self.rx.consumer().load(Ordering::Relaxed);
        let mut fill = self.fill.producer().load(Ordering::Relaxed);
        let mut handed = 0;
        while cons != prod && handed < max {
            // SAFETY: an RX slot the kernel produced (before `prod`).
            let d = unsafe { *self.rx.slot::<libc::xdp_desc>(cons) };
            cons = cons.wrapping_add(1);
            let (addr, len) = (d.addr as usize, d.len as usize);
            // The kernel gives buffers it was lent, in the receive part; checked anyway (a
            // buffer outside it is not lent again either).
            if addr + len > self.rx_frames * CHUNK || len > CHUNK {
                counters.rx_dropped += 1;
                continue;
            }
            // SAFETY: inside the receive part of the frame memory (checked), a buffer the
            // kernel has handed over and takes back only from the fill ring, below.
            let frame = unsafe { std::slice::from_raw_parts(self.umem.base.add(addr), len) };
            match parse_frame(frame, local) {
                Some((meta, payload)) => {
                    counters.rx_frames += 1;
                    handed += 1;
                    f(meta, payload);
                }
                None => counters.rx_dropped += 1,
            }
            // SAFETY: a fill slot: every receive buffer is either in the fill ring, in the RX
            // ring or here, so the fill ring (RING >= rx_frames slots) has room for it.
            unsafe { *self.fill.slot::<u64>(fill) = (addr - addr % CHUNK) as u64 };
            fill = fill.wrapping_add(1);
        }
        self.rx.consumer().store(cons, Ordering::Release);
        self.fill.producer().store(fill, Ordering::Release);
        self.handed += handed as u64;
        handed
    }
}

/// Receive buffers of each socket after queue 0's when the interface has `queues` receive
/// queues: as many as queue 0 has for two, fewer for more (a NIC with 64 queues takes 79 MiB:
/// queue 0's 16 and 1 for each other).
fn other_queue_frames(queues: usize) -> usize {
    (FRAMES / queues.max(1)).clamp(256, FRAMES / 2)
}

impl Xdp {
    /// Opens the datapath on the interface holding `local`'s address, for datagrams to its
    /// port, sending with DSCP `dscp` and ECT(0): a socket on each of its receive queues (up to
    /// [`MAX_QUEUES`]).
    pub fn open(local: SocketAddrV4, dscp: u8) -> io::Result<Xdp> {
        let (dev, index) = interface_of(*local.ip())?;
        let queues = receive_queues(&dev).clamp(1, MAX_QUEUES);
        let mac = hardware_address(&dev)?;
        let mut socks = vec![Queue::open(&dev, index, 0, FRAMES, FRAMES / 2, true)?];
        let others = other_queue_frames(queues);
        for q in 1..queues {
            socks.push(Queue::open(&dev, index, q as u32, others, others, false)?);
        }
        let map = bpf_fd(0, |a| {
            put32(a, 0, 17); // BPF_MAP_CREATE: BPF_MAP_TYPE_XSKMAP
            put32(a, 4, 4);
            put32(a, 8, 4);
            put32(a, 12, socks.len() as u32);
        })
        .map_err(|e| io::Error::new(e.kind(), format!("create the XSKMAP: {e}")))?;
        for (key, q) in socks.iter().enumerate() {
            let (key, value) = (key as u32, q.fd.as_raw_fd() as u32);
            bpf(2, |a| {
                // BPF_MAP_UPDATE_ELEM
                put32(a, 0, map.as_raw_fd() as u32);
                put64(a, 8, &key as *const u32 as u64);
                put64(a, 16, &value as *const u32 as u64);
            })
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("put queue {key}'s socket in the XSKMAP: {e}"),
                )
            })?;
        }
        let code = program(map.as_raw_fd(), local);
        let license = c"GPL";
        let mut log = vec![0u8; 16384];
        let prog = bpf_fd(5, |a| {
            put32(a, 0, 6); // BPF_PROG_LOAD: BPF_PROG_TYPE_XDP
            put32(a, 4, (code.len() / 8) as u32);
            put64(a, 8, code.as_ptr() as u64);
            put64(a, 16, license.as_ptr() as u64);
            put32(a, 24, 1); // log level
            put32(a, 28, log.len() as u32);
            put64(a, 32, log.as_mut_ptr() as u64);
            put32(a, 68, 37); // expected attach type: BPF_XDP
        })
        .map_err(|e| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            io::Error::new(
                e.kind(),
                format!(
                    "load the XDP program: {e}: {}",
                    String::from_utf8_lossy(&log[..end]).trim()
                ),
            )
        })?;
        let link = bpf_fd(28, |a| {
            put32(a, 0, prog.as_raw_fd() as u32); // BPF_LINK_CREATE
            put32(a, 4, index);
            put32(a, 8, 37); // BPF_XDP
            put32(a, 12, 4); // XDP_FLAGS_DRV_MODE
        })
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "attach the XDP program to {dev} in its driver: {e} (a driver without XDP, \
                     another program there, or an MTU too large for XDP)"
                ),
            )
        })?;
        Ok(Xdp {
            _link: link,
            _prog: prog,
            _map: map,
            queues: socks,
            next_rx: 0,
            free_tx: (FRAMES / 2..FRAMES).map(|i| (i * CHUNK) as u64).collect(),
            unsent: false,
            dev,
            index,
            mac,
            local,
            tos: (dscp << 2) | ECT0,
            neighbours: HashMap::new(),
            counters: XdpCounters::default(),
        })
    }

    /// Runs the datapath's XDP program, as the kernel verified it, on `frame` as if it had
    /// arrived on receive queue `queue` of the interface (`BPF_PROG_TEST_RUN`) and returns its
    /// verdict: 2 (`XDP_PASS`) for a frame the kernel's stack keeps, 4 (`XDP_REDIRECT`) for one
    /// a socket of the datapath takes.
    pub fn test_run(&self, frame: &[u8], queue: u32) -> io::Result<u32> {
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex (the kernel wants the frame from offset 0 to its end, no metadata).
        let md = [0, frame.len() as u32, 0, self.index, queue, 0];
        let mut a = [0u8; 128];
        put32(&mut a, 0, self._prog.as_raw_fd() as u32);
        put32(&mut a, 8, frame.len() as u32);
        put64(&mut a, 16, frame.as_ptr() as u64);
        put32(&mut a, 32, 1); // repeat
        put32(&mut a, 40, size_of_val(&md) as u32); // ctx_size_in
        put64(&mut a, 48, md.as_ptr() as u64); // ctx_in
        bpf_attr(10, &mut a)?; // BPF_PROG_TEST_RUN
        Ok(u32::from_ne_bytes([a[4], a[5], a[6], a[7]]))
    }

    /// The sockets, to sleep on (POLLIN when an RX ring holds frames).
    pub fn raw_fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.queues.iter().map(|q| q.fd.as_raw_fd())
    }

    /// The receive queues with a socket.
    pub fn queues(&self) -> usize {
        self.queues.len()
    }

    /// Frames the kernel dropped on their way into the sockets' RX rings (`XDP_STATISTICS`: a
    /// full RX ring, no free buffer in the fill ring, or another reason), over every queue. An
    /// end that reads its rings too slowly loses frames here, where no other counter sees them.
    pub fn kernel_drops(&self) -> u64 {
        self.queues
            .iter()
            .filter_map(|q| {
                // SAFETY: all-zero is a valid xdp_statistics; the kernel fills it in.
                let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
                let mut len = size_of::<libc::xdp_statistics>() as libc::socklen_t;
                // SAFETY: `st` and `len` are live and writable, of the length passed.
                let r = unsafe {
                    libc::getsockopt(
                        q.fd.as_raw_fd(),
                        libc::SOL_XDP,
                        libc::XDP_STATISTICS,
                        (&mut st as *mut libc::xdp_statistics).cast(),
                        &mut len,
                    )
                };
                (r == 0).then(|| st.rx_dropped + st.rx_ring_full)
            })
            .sum()
    }

    /// The receive queues whose socket has handed over a datagram.
    pub fn queues_used(&self) -> usize {
        self.queues.iter().filter(|q| q.handed > 0).count()
    }

    /// The interface the datapath runs on.
    pub fn device(&self) -> &str {
        &self.dev
    }

    /// The next hop's MAC towards `dst`, from the kernel's tables, when the route to it leaves by
    /// this interface (cached for [`NEIGHBOUR_TTL`]; an address without one is looked up again
    /// after [`NEIGHBOUR_RETRY`]).
    pub fn neighbour(&mut self, dst: Ipv4Addr) -> Option<MacAddr> {
        if let Some(&(mac, at)) = self.neighbours.get(&dst) {
            let keep = if mac.is_some() {
                NEIGHBOUR_TTL
            } else {
                NEIGHBOUR_RETRY
            };
            if at.elapsed() < keep {
                return mac;
            }
        }
        let now = Instant::now();
        // The kernel's own answer (policy rules and every table: the route a datagram from this
        // end's address would take), else the main table as `/proc/net/route` shows it.
        let hop = match route_get(*self.local.ip(), dst) {
            Ok(answer) => answer.and_then(|r| (r.oif == self.index).then_some(r.hop)),
            Err(_) => {
                let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
                next_hop(&routes, &self.dev, dst)
            }
        };
        let arp = std::fs::read_to_string("/proc/net/arp").unwrap_or_default();
        let mac = hop.and_then(|hop| neighbour_mac(&arp, &self.dev, hop));
        // The cache stays small: a device talks to few peers; a flood of addresses is bounded.
        if self.neighbours.len() >= 1024 {
            self.neighbours.clear();
        }
        self.neighbours.insert(dst, (mac, now));
        mac
    }

    /// Takes back the send buffers the kernel is done with.
    fn reap(&mut self) {
        let comp = &self.queues[0].comp;
        let prod = comp.producer().load(Ordering::Acquire);
        let mut cons = comp.consumer().load(Ordering::Relaxed);
        while cons != prod {
            // SAFETY: a completion slot the kernel produced (before `prod`).
            let addr = unsafe { *comp.slot::<u64>(cons) };
            if (addr as usize) >= FRAMES / 2 * CHUNK && (addr as usize) < FRAMES * CHUNK {
                self.free_tx.push(addr - addr % CHUNK as u64);
            }
            cons = cons.wrapping_add(1);
        }
        comp.consumer().store(cons, Ordering::Release);
    }

    /// A send buffer, reaping completions (and sending what waits) when none is free.
    fn buffer(&mut self) -> Option<u64> {
        if let Some(b) = self.free_tx.pop() {
            return Some(b);
        }
        self.reap();
        if self.free_tx.is_empty() && self.unsent {
            self.kick();
            self.reap();
        }
        self.free_tx.pop()
    }

    /// Queues one datagram (the concatenation of `pieces`, at most `len` bytes of them) to
    /// `dst` via `mac`, from UDP port `src_port`. False: no buffer or ring room (the datagram
    /// is lost, as a full socket buffer loses it: the connection repairs it).
    pub fn send(
        &mut self,
        mac: MacAddr,
        src_port: u16,
        dst: SocketAddrV4,
        pieces: &mut dyn Iterator<Item = &[u8]>,
        len: usize,
    ) -> bool {
        if HEADERS + len > CHUNK {
            self.counters.tx_no_room += 1;
            return false;
        }
        let Some(buf) = self.buffer() else {
            self.counters.tx_no_room += 1;
            return false;
        };
        // SAFETY: `buf` is a send buffer of CHUNK bytes inside the frame memory, owned by this
        // end (off the rings) until it is queued below.
        let f = unsafe {
            std::slice::from_raw_parts_mut(self.queues[0].umem.base.add(buf as usize), CHUNK)
        };
        let mut at = HEADERS;
        for p in pieces {
            let n = p.len().min(HEADERS + len - at);
            f[at..at + n].copy_from_slice(&p[..n]);
            at += n;
            if at == HEADERS + len {
                break;
            }
        }
        f[at..HEADERS + len].fill(0);
        let src = SocketAddrV4::new(*self.local.ip(), src_port);
        let Some(total) = emit_headers(f, mac, self.mac, src, dst, self.tos, len) else {
            self.free_tx.push(buf);
            self.counters.tx_no_room += 1;
            return false;
        };
        let full = |x: &Self| {
            x.queues[0].tx.as_ref().is_none_or(|tx| {
                let prod = tx.producer().load(Ordering::Relaxed);
                prod.wrapping_sub(tx.consumer().load(Ordering::Acquire)) >= RING
            })
        };
        if full(self) {
            self.kick();
            if full(self) {
                self.free_tx.push(buf);
                self.counters.tx_no_room += 1;
                return false;
            }
        }
        let Some(tx) = self.queues[0].tx.as_ref() else {
            // (Queue 0 always has a TX ring: `full` said so above. The buffer goes back anyway.)
            self.free_tx.push(buf);
            self.counters.tx_no_room += 1;
            return false;
        };
        let prod = tx.producer().load(Ordering::Relaxed);
        // SAFETY: a TX slot this end owns (the ring is not full, checked above).
        unsafe {
            *tx.slot::<libc::xdp_desc>(prod) = libc::xdp_desc {
                addr: buf,
                len: total as u32,
                options: 0,
            };
        }
        tx.producer().store(prod.wrapping_add(1), Ordering::Release);
        self.unsent = true;
        self.counters.tx_frames += 1;
        true
    }

    /// Asks the kernel to send what the TX ring holds. In copy mode each call sends a batch (32
    /// frames in Linux 6.x) and says EAGAIN when more wait: called again while the kernel takes
    /// frames, so none is left behind for the next flush (a bounded number of times; what is
    /// still there then is sent at the engine's next round, [`Xdp::unsent`]).
    pub fn kick(&mut self) {
        for _ in 0..KICKS {
            if !self.unsent {
                break;
            }
            let q = &self.queues[0];
            let Some(tx) = q.tx.as_ref() else {
                break;
            };
            let before = tx.consumer().load(Ordering::Acquire);
            self.counters.tx_kicks += 1;
            // (syscall(2), not glibc's cancellable wrapper: see `UdpSocket::recv_batch`.)
            // SAFETY: a send of nothing on this socket: the kernel takes the frames from its
            // ring.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_sendto,
                    q.fd.as_raw_fd(),
                    std::ptr::null::<u8>(),
                    0usize,
                    libc::MSG_DONTWAIT,
                    std::ptr::null::<libc::sockaddr>(),
                    0,
                )
            };
            let err = (r < 0).then(io::Error::last_os_error);
            let prod = tx.producer().load(Ordering::Relaxed);
            let after = tx.consumer().load(Ordering::Acquire);
            self.unsent = after != prod;
            match err.and_then(|e| e.raw_os_error()) {
                // Busy or out of buffers: the frames stay in the ring for the next kick.
                None | Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ENOBUFS) => {}
                Some(_) => self.counters.tx_errors += 1,
            }
            if after == before {
                break;
            }
        }
        self.reap();
    }

    /// Frames in the TX ring the kernel has not taken yet.
    pub fn unsent(&self) -> bool {
        self.unsent
    }

    /// Frames waiting in an RX ring.
    pub fn pending(&self) -> bool {
        self.queues.iter().any(Queue::pending)
    }

    /// Hands up to `max` arrivals to `f` (sender and ECN, UDP payload) and lends their buffers
    /// back to the kernel. Frames that are not IPv4 UDP to the local address and port are
    /// dropped and counted. Returns the datagrams handed over. The queues' rings are read in
    /// turn, each call starting after the queue the last one stopped at.
    pub fn receive(&mut self, max: usize, f: &mut dyn FnMut(RecvMeta, &[u8])) -> usize {
        let n = self.queues.len();
        let mut handed = 0;
        for k in 0..n {
            let i = (self.next_rx + k) % n;
            handed += self.queues[i].receive(max - handed, self.local, &mut self.counters, f);
            if handed >= max {
                self.next_rx = (i + 1) % n;
                break;
            }
        }
        handed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // As a little-endian host prints them: 192.168.0.0/24 is 0000A8C0.
    const ROUTES: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
        eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
        eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
        veth1\t00004E0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
        docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
        eth1\t0000000A\t00000000\t0001\t0\t0\t100\t000000FF\t0\t0\t0\n\
        eth2\t0000000A\t00000000\t0001\t0\t0\t50\t000000FF\t0\t0\t0\n\
        eth0\t0000C8C0\t00000000\t0201\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
        eth0\t0000C9C0\t00000000\t0000\t0\t0\t0\t0000FFFF\t0\t0\t0\n";
    const ARP: &str =
        "IP address       HW type     Flags       HW address            Mask     Device\n\
        192.168.0.1      0x1         0x2         52:54:00:12:34:56     *        eth0\n\
        192.168.0.7      0x1         0x0         00:00:00:00:00:00     *        eth0\n\
        10.78.0.2        0x1         0x2         1e:18:4c:b0:90:77     *        veth1\n";

    #[test]
    fn the_next_hop_is_the_longest_prefix_on_the_interface() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        // On the link: the address itself; elsewhere: the default route's gateway.
        assert_eq!(
            next_hop(ROUTES, "eth0", ip("192.168.0.9")),
            Some(ip("192.168.0.9"))
        );
        assert_eq!(
            next_hop(ROUTES, "eth0", ip("8.8.8.8")),
            Some(ip("192.168.0.1"))
        );
        assert_eq!(
            next_hop(ROUTES, "veth1", ip("10.78.0.2")),
            Some(ip("10.78.0.2"))
        );
        // The kernel's route leaves by another interface: not this one's (its default route
        // would send the frames to a gateway that is not on the way).
        assert_eq!(next_hop(ROUTES, "veth1", ip("8.8.8.8")), None);
        assert_eq!(next_hop(ROUTES, "eth0", ip("172.17.0.5")), None);
        assert_eq!(
            route_to(ROUTES, ip("172.17.0.5")),
            Some(("docker0", ip("172.17.0.5")))
        );
        assert_eq!(next_hop(ROUTES, "eth0", ip("10.78.0.2")), None);
        assert_eq!(next_hop(ROUTES, "lo", ip("10.78.0.2")), None);
        assert_eq!(next_hop("", "eth0", ip("10.78.0.2")), None);
        // Equal prefixes: the lower metric.
        assert_eq!(
            route_to(ROUTES, ip("10.1.2.3")),
            Some(("eth2", ip("10.1.2.3")))
        );
        // A reject route and a route that is down are not taken (the default route is).
        assert_eq!(
            route_to(ROUTES, ip("192.200.1.1")),
            Some(("eth0", ip("192.168.0.1")))
        );
        assert_eq!(
            route_to(ROUTES, ip("192.201.1.1")),
            Some(("eth0", ip("192.168.0.1")))
        );
        // Lines that do not parse are skipped.
        assert_eq!(
            route_to("header\nnonsense\neth0 zz 0 1 0 0 0 0\n", ip("1.2.3.4")),
            None
        );
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    /// A route reply as the kernel writes it: netlink header, `rtmsg` of route type `kind`, then
    /// the attributes (type, data), each padded to four bytes.
    fn reply(seq: u32, kind: u8, attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut m = vec![0u8; 28];
        m[4..6].copy_from_slice(&RTM_NEWROUTE.to_ne_bytes());
        m[8..12].copy_from_slice(&seq.to_ne_bytes());
        m[16] = libc::AF_INET as u8;
        m[17] = 32;
        m[23] = kind;
        for (t, data) in attrs {
            let len = 4 + data.len();
            m.extend_from_slice(&(len as u16).to_ne_bytes());
            m.extend_from_slice(&t.to_ne_bytes());
            m.extend_from_slice(data);
            m.resize(m.len().div_ceil(4) * 4, 0);
        }
        let n = m.len() as u32;
        m[0..4].copy_from_slice(&n.to_ne_bytes());
        m
    }

    #[test]
    fn a_route_request_is_what_ip_route_get_sends() {
        let r = route_request(7, ip("10.0.0.1"), ip("10.1.2.3"));
        assert_eq!(u32::from_ne_bytes(r[0..4].try_into().unwrap()), 44);
        assert_eq!(
            u16::from_ne_bytes(r[4..6].try_into().unwrap()),
            RTM_GETROUTE
        );
        assert_eq!(u32::from_ne_bytes(r[8..12].try_into().unwrap()), 7);
        assert_eq!((r[16], r[17], r[18]), (libc::AF_INET as u8, 32, 32));
        let attr = |kind: u16, a: [u8; 4]| {
            let mut v = 8u16.to_ne_bytes().to_vec();
            v.extend_from_slice(&kind.to_ne_bytes());
            v.extend_from_slice(&a);
            v
        };
        assert_eq!(r[28..36], attr(RTA_DST, [10, 1, 2, 3])[..], "RTA_DST");
        assert_eq!(r[36..44], attr(RTA_SRC, [10, 0, 0, 1])[..], "RTA_SRC");
    }

    #[test]
    fn route_replies_give_the_interface_and_next_hop_or_nothing() {
        let dst = ip("10.1.2.3");
        let oif = 5u32.to_ne_bytes();
        let gw = [10, 0, 0, 254];
        let via = reply(
            9,
            RTN_UNICAST,
            &[
                (RTA_DST, &dst.octets()),
                (RTA_OIF, &oif),
                (RTA_GATEWAY, &gw),
            ],
        );
        assert_eq!(
            parse_route_reply(&via, 9, dst),
            Ok(Some(RouteAnswer {
                oif: 5,
                hop: ip("10.0.0.254")
            }))
        );
        let link = reply(9, RTN_UNICAST, &[(RTA_OIF, &oif), (15, &[1, 2, 3])]);
        assert_eq!(
            parse_route_reply(&link, 9, dst),
            Ok(Some(RouteAnswer { oif: 5, hop: dst })),
            "a link route: the destination is the next hop"
        );
        let local = reply(9, 2, &[(RTA_OIF, &1u32.to_ne_bytes())]);
        assert_eq!(
            parse_route_reply(&local, 9, dst),
            Ok(None),
            "this host's address"
        );
        let mut unreachable = vec![0u8; 36];
        unreachable[0..4].copy_from_slice(&36u32.to_ne_bytes());
        unreachable[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        unreachable[8..12].copy_from_slice(&9u32.to_ne_bytes());
        unreachable[16..20].copy_from_slice(&(-libc::ENETUNREACH).to_ne_bytes());
        assert_eq!(parse_route_reply(&unreachable, 9, dst), Ok(None));
        assert_eq!(
            parse_route_reply(&via, 8, dst),
            Err(()),
            "another request's"
        );
        assert_eq!(parse_route_reply(&via[..20], 9, dst), Err(()), "cut short");
        let mut bad = via.clone();
        bad[28..30].copy_from_slice(&200u16.to_ne_bytes());
        assert_eq!(
            parse_route_reply(&bad, 9, dst),
            Err(()),
            "an attribute longer than the message"
        );
        bad[28..30].copy_from_slice(&2u16.to_ne_bytes());
        assert_eq!(
            parse_route_reply(&bad, 9, dst),
            Err(()),
            "an attribute shorter than its header"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_route_reply_parses_or_is_refused(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        ) {
            let _ = parse_route_reply(&bytes, 1, Ipv4Addr::new(10, 0, 0, 1));
        }
    }

    /// The kernel answers for this host's own address with a local route: none to send on.
    #[test]
    fn the_kernel_routes_this_hosts_own_address_locally() {
        let lo = ip("127.0.0.1");
        assert_eq!(route_get(lo, lo).unwrap(), None);
    }

    #[test]
    fn only_resolved_neighbours_on_the_interface_have_a_mac() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            neighbour_mac(ARP, "eth0", ip("192.168.0.1")),
            Some(MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]))
        );
        assert_eq!(
            neighbour_mac(ARP, "eth0", ip("192.168.0.7")),
            None,
            "incomplete"
        );
        assert_eq!(
            neighbour_mac(ARP, "eth0", ip("10.78.0.2")),
            None,
            "another interface"
        );
        assert_eq!(neighbour_mac(ARP, "veth1", ip("10.78.0.3")), None);
        assert_eq!(
            parse_mac("1e:18:4c:b0:90:77\n"),
            Some(MacAddr([0x1e, 0x18, 0x4c, 0xb0, 0x90, 0x77]))
        );
        for bad in [
            "",
            "1e:18:4c:b0:90",
            "1e:18:4c:b0:90:77:00",
            "1e:18:4c:b0:90:7",
            "zz:18:4c:b0:90:77",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_frame_built_here_parses_with_its_checksums_and_back() {
        let src = SocketAddrV4::new(Ipv4Addr::new(10, 78, 0, 1), 49152);
        let dst = SocketAddrV4::new(Ipv4Addr::new(10, 78, 0, 2), 4791);
        let datagram: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let mut f = vec![0u8; CHUNK];
        f[HEADERS..HEADERS + datagram.len()].copy_from_slice(&datagram);
        let tos = (26 << 2) | ECT0;
        let n = emit_headers(
            &mut f,
            MacAddr([2; 6]),
            MacAddr([4; 6]),
            src,
            dst,
            tos,
            datagram.len(),
        )
        .unwrap();
        assert_eq!(n, HEADERS + 300);
        let (meta, payload) = parse_frame(&f[..n], dst).expect("ours");
        assert_eq!(payload, &datagram[..]);
        assert_eq!(meta.src, Some(SocketAddr::V4(src)));
        assert_eq!((meta.dscp, meta.ecn), (26, ECT0));
        // The IPv4 checksum, checked by the core's parser; the UDP checksum by summing the
        // pseudo header and the whole segment, checksum included, which gives all ones
        // (RFC 768), here without the core's code.
        Ipv4Repr::parse(&f[14..n], true).expect("IPv4 checksum");
        let words = |b: &[u8]| -> u32 {
            b.chunks(2)
                .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
                .sum()
        };
        let mut sum = words(&f[26..34]) + 17 + (n - 34) as u32 + words(&f[34..n]);
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
        assert_ne!([f[40], f[41]], [0, 0], "a checksum is sent");
        // Not ours: another address, another port, a fragment, cut short.
        assert!(parse_frame(&f[..n], src).is_none());
        assert!(parse_frame(&f[..n], SocketAddrV4::new(*dst.ip(), 4792)).is_none());
        let mut frag = f[..n].to_vec();
        frag[20] |= 0x20;
        assert!(parse_frame(&frag, dst).is_none());
        for cut in [0, 13, 14, 33, 41] {
            assert!(parse_frame(&f[..cut], dst).is_none(), "{cut}");
        }
        // Too little room for the frame: refused, not written past.
        assert!(emit_headers(
            &mut f[..100],
            MacAddr([2; 6]),
            MacAddr([4; 6]),
            src,
            dst,
            tos,
            300
        )
        .is_none());
    }

    /// The program as the kernel verified and runs it (`BPF_PROG_TEST_RUN`), on frames built
    /// here: the engine's frames go to the socket, everything else to the kernel's stack.
    #[test]
    #[ignore = "needs root for a network namespace and BPF; scripts/test.sh runs it"]
    fn the_program_takes_the_engines_frames_and_leaves_all_else_to_the_stack() {
        use std::process::Command;
        let ns = format!("mrxdpt{}", std::process::id());
        let sh = |args: &[&str]| {
            let ok = Command::new(args[0])
                .args(&args[1..])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "{args:?} failed");
        };
        struct Gone(String);
        impl Drop for Gone {
            fn drop(&mut self) {
                let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
            }
        }
        sh(&["ip", "netns", "add", &ns]);
        let _gone = Gone(ns.clone());
        // Two receive queues (and two to send on, which XDP in a veth's driver wants of its
        // peer).
        sh(&[
            "ip",
            "-n",
            &ns,
            "link",
            "add",
            "xa",
            "numtxqueues",
            "2",
            "numrxqueues",
            "2",
            "type",
            "veth",
            "peer",
            "name",
            "xb",
            "numtxqueues",
            "2",
            "numrxqueues",
            "2",
        ]);
        sh(&[
            "ip",
            "-n",
            &ns,
            "addr",
            "add",
            "10.79.5.200/24",
            "dev",
            "xa",
        ]);
        sh(&["ip", "-n", &ns, "link", "set", "xa", "up"]);
        sh(&["ip", "-n", &ns, "link", "set", "xb", "up"]);
        let path = format!("/var/run/netns/{ns}");
        let verdicts = std::thread::spawn(move || {
            let f = std::fs::File::open(path).expect("the namespace");
            // SAFETY: moves this thread alone into the namespace `f` names.
            assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
            // (An address whose last byte is 200: negative as a 32-bit immediate.)
            let local = SocketAddrV4::new(Ipv4Addr::new(10, 79, 5, 200), 4791);
            let x = Xdp::open(local, 0).expect("the AF_XDP datapath on a veth");
            assert_eq!(x.queues(), 2, "a socket on each receive queue");
            let peer = SocketAddrV4::new(Ipv4Addr::new(10, 79, 5, 1), 50000);
            let mut ours = vec![0u8; HEADERS + 64];
            emit_headers(
                &mut ours,
                MacAddr([2; 6]),
                MacAddr([4; 6]),
                peer,
                local,
                ECT0,
                64,
            )
            .unwrap();
            let mut cases: Vec<(&str, Vec<u8>, u32, u32)> = vec![
                ("ours on queue 0", ours.clone(), 0, 4),
                ("ours on queue 1", ours.clone(), 1, 4),
            ];
            let mut other = |what: &'static str, change: &dyn Fn(&mut Vec<u8>)| {
                let mut f = ours.clone();
                change(&mut f);
                cases.push((what, f.clone(), 0, 2));
                cases.push((what, f, 1, 2));
            };
            other("another port", &|f| {
                f[36..38].copy_from_slice(&4792u16.to_be_bytes())
            });
            other("another address", &|f| f[33] = 201);
            other("a first fragment", &|f| f[20] |= 0x20);
            other("a later fragment", &|f| f[21] = 1);
            other("IP options", &|f| f[14] = 0x46);
            other("TCP", &|f| f[23] = 6);
            other("ARP", &|f| f[12..14].copy_from_slice(&[0x08, 0x06]));
            other("IPv6", &|f| f[12..14].copy_from_slice(&[0x86, 0xdd]));
            other("cut short", &|f| f.truncate(40));
            cases
                .into_iter()
                .map(|(what, f, queue, want)| {
                    let got = x.test_run(&f, queue).expect("test run");
                    (format!("{what}, queue {queue}"), got, want)
                })
                .collect::<Vec<_>>()
        })
        .join()
        .expect("the namespace thread");
        for (what, got, want) in verdicts {
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn the_program_is_whole_instructions_that_end_in_exits() {
        let p = program(7, SocketAddrV4::new(Ipv4Addr::new(10, 78, 0, 200), 4791));
        assert_eq!(p.len() % 8, 0);
        let insns: Vec<&[u8]> = p.chunks(8).collect();
        assert_eq!(insns.len(), 26);
        assert_eq!(insns[insns.len() - 1][0], 0x95);
        // Every conditional jump to "pass" lands on `r0 = XDP_PASS`.
        let pass = insns.len() - 2;
        assert_eq!(insns[pass][0], 0xb7);
        assert_eq!(i32::from_le_bytes(insns[pass][4..8].try_into().unwrap()), 2);
        for (i, x) in insns.iter().enumerate() {
            if matches!(x[0], 0x2d | 0x55 | 0x56) {
                let off = i16::from_le_bytes([x[2], x[3]]);
                assert_eq!(i as i64 + 1 + i64::from(off), pass as i64, "jump at {i}");
            }
        }
        // The port is compared in network order: 4791 is 0x12b7, read little-endian as 0xb712.
        assert!(insns
            .iter()
            .any(|x| x[0] == 0x55 && i32::from_le_bytes(x[4..8].try_into().unwrap()) == 0xb712));
        // The address is compared in 32 bits (10.78.0.200 reads 0xc8004e0a, negative as an
        // i32: a 64-bit compare would sign-extend it and never match).
        let a = insns
            .iter()
            .find(|x| x[0] == 0x56)
            .expect("a 32-bit compare");
        assert_eq!(u32::from_le_bytes(a[4..8].try_into().unwrap()), 0xc800_4e0a);
        // The map is a pseudo map fd load of descriptor 7.
        let ld = insns.iter().position(|x| x[0] == 0x18).unwrap();
        assert_eq!(insns[ld][1] >> 4, 1);
        assert_eq!(i32::from_le_bytes(insns[ld][4..8].try_into().unwrap()), 7);
    }
}
