//! Thin, safe wrappers over the Linux UDP socket calls the transport needs and `std::net` lacks:
//! ECN (IP_TOS / IPV6_TCLASS on send, IP_RECVTOS / IPV6_RECVTCLASS on receive), UDP GSO
//! (`UDP_SEGMENT`), UDP GRO (`UDP_GRO`), batched receive (`recvmmsg`), large socket buffers and
//! busy polling.

use std::io;
use std::mem::{size_of, zeroed, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

#[cfg(test)]
thread_local! {
    /// Tests: sends that ask the kernel to segment fail with EIO on this thread, as on a route
    /// that cannot segment (an IPsec policy, a device without checksum offload), where the
    /// kernel refuses UDP GSO. The messages before the first such one still go, as `sendmmsg`
    /// returns how many it sent before an error.
    pub(crate) static REFUSE_GSO: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Tests: the calls `REFUSE_GSO` refused on this thread.
    pub(crate) static GSO_REFUSED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

// Linux ABI values, the same on every architecture; not all are exported by the `libc` crate.
const IP_RECVTOS: libc::c_int = 13;
const IPV6_RECVTCLASS: libc::c_int = 66;
const IPV6_TCLASS: libc::c_int = 67;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// `SO_TIMESTAMPNS` with the native `timespec` of 64-bit Linux (also its `SCM_TIMESTAMPNS`).
const SO_TIMESTAMPNS_OLD: libc::c_int = 35;
/// Control buffer per received message: room for IP_TOS or IPV6_TCLASS, UDP_GRO and
/// SCM_TIMESTAMPNS (24 + 24 + 32 bytes), with room to spare.
const CONTROL_WORDS: usize = 16;
const SOL_UDP: libc::c_int = 17;

/// ECN-capable transport, code point 0: how every datagram leaves.
pub const ECT0: u8 = 0b10;
/// The most segments one GSO send may carry (the kernel's `UDP_MAX_SEGMENTS`).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// The most bytes one GSO send may carry.
pub const GSO_MAX_BYTES: usize = 65_000;

/// Socket options.
#[derive(Debug, Clone, Copy)]
pub struct SocketOptions {
    /// Bytes of receive buffer to ask for.
    pub rcvbuf: usize,
    /// Bytes of send buffer to ask for.
    pub sndbuf: usize,
    /// Ask the kernel to coalesce arriving datagrams (UDP GRO).
    pub gro: bool,
    /// Ask the kernel for each datagram's arrival time (`SO_TIMESTAMPNS`), reported in
    /// [`RecvMeta::arrived_realtime`].
    pub arrival_times: bool,
    /// Microseconds of busy polling in the kernel on blocking receives (0: off).
    pub busy_poll_us: u32,
    /// The DSCP of what is sent (the traffic class's upper six bits; the ECN bits are always
    /// ECT(0)).
    pub dscp: u8,
    /// The socket priority (`SO_PRIORITY`: the egress queue and, on a VLAN, the PCP the
    /// interface's egress map gives it); 0 leaves the default.
    pub priority: u8,
}

impl SocketOptions {
    /// The TOS byte (IPv4) or traffic class (IPv6) of what is sent: the DSCP and ECT(0).
    pub fn tos(&self) -> i32 {
        i32::from(self.dscp & 0x3f) << 2 | i32::from(ECT0)
    }
}

/// Buffers and headers for `recvmmsg`, set up once and reused: each receive call only resets
/// two lengths per message.
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    names: Box<[libc::sockaddr_storage]>,
    // Only reached through `hdrs`, which point into them; kept here so they live as long.
    _iovs: Box<[libc::iovec]>,
    _controls: Box<[[u64; CONTROL_WORDS]]>,
    hdrs: Box<[libc::mmsghdr]>,
    meta: Vec<RecvMeta>,
}

impl RecvBatch {
    /// `count` buffers of `size` bytes.
    pub fn new(count: usize, size: usize) -> RecvBatch {
        let mut bufs: Vec<Vec<u8>> = (0..count).map(|_| vec![0u8; size]).collect();
        // SAFETY: all-zero is valid for these plain C structures.
        let mut names: Box<[libc::sockaddr_storage]> =
            (0..count).map(|_| unsafe { zeroed() }).collect();
        let mut iovs: Box<[libc::iovec]> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        let mut controls: Box<[[u64; CONTROL_WORDS]]> =
            vec![[0u64; CONTROL_WORDS]; count].into_boxed_slice();
        let hdrs: Box<[libc::mmsghdr]> = (0..count)
            .map(|i| {
                // SAFETY: all-zero is a valid mmsghdr; the pointers set point into the boxed
                // slices above and the buffers, which the batch keeps (heap memory never moves).
                let mut h: libc::mmsghdr = unsafe { zeroed() };
                h.msg_hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
                h.msg_hdr.msg_iov = &mut iovs[i];
                h.msg_hdr.msg_iovlen = 1;
                h.msg_hdr.msg_control = controls[i].as_mut_ptr().cast();
                h
            })
            .collect();
        RecvBatch {
            bufs,
            names,
            _iovs: iovs,
            _controls: controls,
            hdrs,
            meta: vec![RecvMeta::default(); count],
        }
    }

    /// Message `i` of the last receive: its bytes and what came with them.
    pub fn get(&self, i: usize) -> (&[u8], RecvMeta) {
        let m = self.meta[i];
        (&self.bufs[i][..m.len.min(self.bufs[i].len())], m)
    }
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RecvBatch({} x {})",
            self.bufs.len(),
            self.bufs.first().map_or(0, Vec::len)
        )
    }
}

/// A non-blocking UDP socket.
#[derive(Debug)]
pub struct UdpSocket {
    fd: OwnedFd,
    local: SocketAddr,
    gro: bool,
    peer: Option<SocketAddr>,
}

/// One message of a [`UdpSocket::send_many`] call: `len` bytes from `start` of the buffer, cut
/// into datagrams of `segment` bytes when longer (UDP GSO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendRun {
    /// Where it starts in the buffer.
    pub start: usize,
    /// Bytes.
    pub len: usize,
    /// Datagram size (the last may be shorter).
    pub segment: usize,
}

/// One message of a [`UdpSocket::send_many_pieces`] call: pieces `first..end`, cut into
/// datagrams of `segment` bytes when longer (UDP GSO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PieceMsg {
    /// Its first piece.
    pub first: usize,
    /// One past its last piece.
    pub end: usize,
    /// Datagram size (the last may be shorter).
    pub segment: usize,
}

/// What one received message held.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecvMeta {
    /// Bytes in the buffer.
    pub len: usize,
    /// Sender.
    pub src: Option<SocketAddr>,
    /// The IP header's ECN bits.
    pub ecn: u8,
    /// The IP header's DSCP.
    pub dscp: u8,
    /// With GRO: the size of each coalesced datagram (the last may be shorter); 0 otherwise.
    pub segment: usize,
    /// When the kernel received it (`SO_TIMESTAMPNS`, CLOCK_REALTIME, ns); 0 when unknown.
    pub arrived_realtime: u64,
}

/// CLOCK_MONOTONIC (the clock `Instant` reads) in nanoseconds, as one integer: without `Instant`'s
/// checked timespec arithmetic, which costs more than reading the clock in a spinning loop.
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in nanoseconds (the clock of the kernel's receive timestamps).
pub(crate) fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clocks used exist on every Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `setsockopt` with an int value on socket `fd` (an error, such as ENOPROTOOPT, if the socket
/// does not take the option).
pub fn set_int_option(
    fd: std::os::fd::BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    set_opt(fd.as_raw_fd(), level, name, value)
}

fn set_opt(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the option value is a live c_int of the stated size; the kernel checks `fd` (this
    // module's own sockets, or a borrowed one through `set_int_option`).
    let ret = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    cvt(ret).map(drop)
}

/// A `sockaddr_storage` holding `addr`, and its length.
fn to_raw(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data for which all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe {
                (&mut storage as *mut libc::sockaddr_storage)
                    .cast::<libc::sockaddr_in>()
                    .write(sin)
            };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe {
                (&mut storage as *mut libc::sockaddr_storage)
                    .cast::<libc::sockaddr_in6>()
                    .write(sin6)
            };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

fn from_raw(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

impl UdpSocket {
    /// Opens a socket bound to `addr` (port 0: any free port), sending ECT(0) and reporting the
    /// ECN bits of what arrives.
    pub fn bind(addr: SocketAddr, opts: &SocketOptions) -> io::Result<UdpSocket> {
        let v6 = addr.is_ipv6();
        let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        // SAFETY: plain system call; the result is checked before use.
        let raw = cvt(unsafe {
            libc::socket(
                family,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        })?;
        // SAFETY: `raw` is a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if v6 {
            set_opt(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
            set_opt(raw, libc::IPPROTO_IPV6, IPV6_TCLASS, opts.tos())?;
            set_opt(raw, libc::IPPROTO_IPV6, IPV6_RECVTCLASS, 1)?;
            // Never fragment: a datagram too large for the path fails to send instead.
            set_opt(
                raw,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            )?;
        } else {
            set_opt(raw, libc::IPPROTO_IP, libc::IP_TOS, opts.tos())?;
            set_opt(raw, libc::IPPROTO_IP, IP_RECVTOS, 1)?;
            set_opt(
                raw,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )?;
        }
        // Ask for the buffers; without CAP_NET_ADMIN the kernel caps them at rmem_max/wmem_max.
        let rcv = i32::try_from(opts.rcvbuf).unwrap_or(i32::MAX);
        if set_opt(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, rcv).is_err() {
            set_opt(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, rcv)?;
        }
        let snd = i32::try_from(opts.sndbuf).unwrap_or(i32::MAX);
        if set_opt(raw, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, snd).is_err() {
            set_opt(raw, libc::SOL_SOCKET, libc::SO_SNDBUF, snd)?;
        }
        if opts.busy_poll_us > 0 {
            // Needs CAP_NET_ADMIN above net.core.busy_poll; best effort.
            let _ = set_opt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_BUSY_POLL,
                opts.busy_poll_us as i32,
            );
        }
        if opts.priority > 0 {
            // Priorities 0-6 need no privilege; the caller keeps to them.
            set_opt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_PRIORITY,
                i32::from(opts.priority),
            )?;
        }
        let gro = opts.gro && set_opt(raw, SOL_UDP, UDP_GRO, 1).is_ok();
        // The kernel's arrival time of each datagram (best effort): the time a datagram waited
        // in the socket for this host's CPU is then not counted in RTTs and ACK delays.
        if opts.arrival_times {
            let _ = set_opt(raw, libc::SOL_SOCKET, SO_TIMESTAMPNS_OLD, 1);
        }
        let (storage, len) = to_raw(&addr);
        // SAFETY: `storage` holds a valid socket address of `len` bytes.
        cvt(unsafe { libc::bind(raw, (&storage as *const libc::sockaddr_storage).cast(), len) })?;
        let mut bound: libc::sockaddr_storage =
            // SAFETY: all-zero is a valid sockaddr_storage.
            unsafe { zeroed() };
        let mut blen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: `bound` and `blen` describe a writable sockaddr_storage.
        cvt(unsafe {
            libc::getsockname(
                raw,
                (&mut bound as *mut libc::sockaddr_storage).cast(),
                &mut blen,
            )
        })?;
        let local = from_raw(&bound).ok_or_else(|| io::Error::other("unknown address family"))?;
        Ok(UdpSocket {
            fd,
            local,
            gro,
            peer: None,
        })
    }

    /// Connects the socket to `peer`: sends to it then use the cached route (no lookup per
    /// datagram). Datagrams to other addresses can still be sent.
    pub fn connect(&mut self, peer: SocketAddr) -> io::Result<()> {
        let (storage, len) = to_raw(&peer);
        // SAFETY: `storage` holds a valid socket address of `len` bytes.
        cvt(unsafe {
            libc::connect(
                self.fd.as_raw_fd(),
                (&storage as *const libc::sockaddr_storage).cast(),
                len,
            )
        })?;
        self.peer = Some(peer);
        Ok(())
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Whether the kernel coalesces arrivals for this socket.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Turns UDP GRO on or off for what arrives from now on. Off only on a socket with nothing
    /// queued: a datagram GRO coalesced, read after, comes without its segment size.
    pub fn set_gro(&mut self, on: bool) -> io::Result<()> {
        set_opt(self.fd.as_raw_fd(), SOL_UDP, UDP_GRO, i32::from(on))?;
        self.gro = on;
        Ok(())
    }

    /// Sends `buf` to `dst` as one datagram, or, with `segment` > 0 and `buf` longer than it, as
    /// datagrams of `segment` bytes (the last may be shorter) in one call (UDP GSO).
    pub fn send(&self, dst: &SocketAddr, buf: &[u8], segment: usize) -> io::Result<usize> {
        let run = SendRun {
            start: 0,
            len: buf.len(),
            segment: if segment == 0 { buf.len() } else { segment },
        };
        match self.send_many(dst, buf, &[run])? {
            1 => Ok(buf.len()),
            _ => Err(io::Error::from(io::ErrorKind::WouldBlock)),
        }
    }

    /// Sends several messages to `dst` in one call (`sendmmsg`): each run of `buf` is one
    /// datagram, or, when longer than its segment, datagrams of `segment` bytes (UDP GSO).
    /// Returns how many runs the kernel took (it may take fewer than given).
    pub fn send_many(&self, dst: &SocketAddr, buf: &[u8], runs: &[SendRun]) -> io::Result<usize> {
        const MAX: usize = 64;
        let n = runs.len().min(MAX);
        if n == 0 {
            return Ok(0);
        }
        if runs[..n]
            .iter()
            .any(|r| r.start.checked_add(r.len).is_none_or(|e| e > buf.len()))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "run outside the buffer",
            ));
        }
        let named = self.peer != Some(*dst);
        if n == 1 && !named && !(runs[0].segment > 0 && runs[0].len > runs[0].segment) {
            // One plain datagram on a connected socket: send(2), without sendmmsg's headers.
            let r = runs[0];
            // SAFETY: the range was checked against `buf` above; the kernel only reads it.
            let sent = unsafe {
                libc::syscall(
                    libc::SYS_sendto,
                    self.fd.as_raw_fd(),
                    buf[r.start..].as_ptr(),
                    r.len,
                    0,
                    std::ptr::null::<libc::sockaddr>(),
                    0,
                )
            };
            if sent < 0 {
                return Err(io::Error::last_os_error());
            }
            return Ok(1);
        }
        // Each run is a message of one piece.
        let iovs: [io::IoSlice<'_>; MAX] = std::array::from_fn(|i| match runs.get(i) {
            Some(r) if i < n => io::IoSlice::new(&buf[r.start..r.start + r.len]),
            _ => io::IoSlice::new(&[]),
        });
        let msgs: [PieceMsg; MAX] = std::array::from_fn(|i| PieceMsg {
            first: i,
            end: i + 1,
            segment: runs.get(i).map_or(0, |r| r.segment),
        });
        self.send_many_pieces(dst, &iovs[..n], &msgs[..n])
    }

    /// [`UdpSocket::send_many`] for messages in pieces: message `m` is `iovs[m.first..m.end]`
    /// joined (headers from one buffer, a payload from where it lies, a trailer), cut into
    /// datagrams of `m.segment` bytes when longer (UDP GSO). Returns how many messages the
    /// kernel took.
    pub fn send_many_pieces(
        &self,
        dst: &SocketAddr,
        iovs: &[io::IoSlice<'_>],
        msgs: &[PieceMsg],
    ) -> io::Result<usize> {
        const MAX: usize = 64;
        let n = msgs.len().min(MAX);
        if n == 0 {
            return Ok(0);
        }
        if msgs[..n]
            .iter()
            .any(|m| m.first > m.end || m.end > iovs.len())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "message outside the pieces",
            ));
        }
        let named = self.peer != Some(*dst);
        let (mut storage, len) = to_raw(dst);
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
        assert!(space <= size_of::<[u64; 4]>());
        let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX];
        let mut controls = [const { MaybeUninit::<[u64; 4]>::uninit() }; MAX];
        for i in 0..n {
            let m = msgs[i];
            let pieces = &iovs[m.first..m.end];
            let bytes: usize = pieces.iter().map(|p| p.len()).sum();
            // SAFETY: all-zero is a valid mmsghdr.
            let h = hdrs[i].write(unsafe { zeroed() });
            if named {
                h.msg_hdr.msg_name = (&mut storage as *mut libc::sockaddr_storage).cast();
                h.msg_hdr.msg_namelen = len;
            }
            // IoSlice is ABI-compatible with iovec on Unix (std's guarantee); the kernel only
            // reads through it, the cast to *mut is what the C type wants.
            h.msg_hdr.msg_iov = pieces.as_ptr() as *mut libc::iovec;
            h.msg_hdr.msg_iovlen = pieces.len() as _;
            if m.segment > 0 && bytes > m.segment {
                let seg = u16::try_from(m.segment).map_err(io::Error::other)?;
                let control = controls[i].write([0u64; 4]);
                h.msg_hdr.msg_control = control.as_mut_ptr().cast();
                h.msg_hdr.msg_controllen = space as _;
                // SAFETY: msg_control points at this message's own zeroed control buffer, large
                // enough for one cmsg of a u16 (asserted above).
                unsafe {
                    let cmsg = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                    (*cmsg).cmsg_level = SOL_UDP;
                    (*cmsg).cmsg_type = UDP_SEGMENT;
                    (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                    libc::CMSG_DATA(cmsg).cast::<u16>().write_unaligned(seg);
                }
            }
        }
        #[cfg(test)]
        let n = if REFUSE_GSO.get() {
            let segmenting = |m: &PieceMsg| {
                let bytes: usize = iovs[m.first..m.end].iter().map(|p| p.len()).sum();
                m.segment > 0 && bytes > m.segment
            };
            match msgs[..n].iter().position(segmenting) {
                Some(0) => {
                    GSO_REFUSED.set(GSO_REFUSED.get() + 1);
                    return Err(io::Error::from_raw_os_error(libc::EIO));
                }
                Some(k) => k,
                None => n,
            }
        } else {
            n
        };
        // SAFETY: the first `n` headers are initialised above; each points at pieces of `iovs`
        // (checked in range above), live slices for the duration of the call, and at its own
        // control buffer; MaybeUninit<T> has T's layout.
        let sent = unsafe {
            libc::syscall(
                libc::SYS_sendmmsg,
                self.fd.as_raw_fd(),
                hdrs.as_mut_ptr().cast::<libc::mmsghdr>(),
                n as libc::c_uint,
                0,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(sent as usize)
    }

    // The datapath's send and receive calls (`recv_batch` here, `send_many` and
    // `send_many_pieces` above, the AF_XDP kick in `xdp.rs`) go
    // through syscall(2), not glibc's wrappers: those are cancellation points, which in a
    // process with a second thread (the tools' heartbeat and statistics writer) wrap every call
    // in two atomic updates of the thread's cancellation state (3-6% of a spinning latency
    // test's samples). No thread is ever cancelled here.
    /// Receives up to a batch's capacity of messages in one call without blocking; returns how
    /// many arrived (0 when none were waiting). Read them with [`RecvBatch::get`].
    pub fn recv_batch(&self, batch: &mut RecvBatch, max: usize) -> io::Result<usize> {
        let n = batch.hdrs.len().min(max);
        for h in batch.hdrs[..n].iter_mut() {
            // The kernel shrinks these to what it wrote: give the full room back.
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = size_of::<[u64; CONTROL_WORDS]>() as _;
        }
        // SAFETY (both calls): every header points at the batch's own names, iovecs, controls
        // and buffers, heap allocations that live as long as the batch and do not move with it.
        let got = if n == 1 {
            // One datagram asked for: recvmsg(2), without recvmmsg's header array.
            let h = &mut batch.hdrs[0];
            // SAFETY: as above, for the first header.
            let len = unsafe {
                libc::syscall(
                    libc::SYS_recvmsg,
                    self.fd.as_raw_fd(),
                    &mut h.msg_hdr as *mut libc::msghdr,
                    libc::MSG_DONTWAIT,
                )
            };
            if len >= 0 {
                h.msg_len = len as libc::c_uint;
                1
            } else {
                -1
            }
        } else {
            // SAFETY: as above.
            unsafe {
                libc::syscall(
                    libc::SYS_recvmmsg,
                    self.fd.as_raw_fd(),
                    batch.hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut::<libc::timespec>(),
                )
            }
        };
        if got < 0 {
            // Read errno itself: an empty poll (the common case of a spinning loop) then builds
            // and drops no `io::Error`.
            // SAFETY: errno is this thread's and always readable.
            let code = unsafe { *libc::__errno_location() };
            return match code {
                libc::EAGAIN | libc::EINTR => Ok(0),
                _ => Err(io::Error::from_raw_os_error(code)),
            };
        }
        let got = got as usize;
        for i in 0..got {
            let h = &batch.hdrs[i].msg_hdr;
            let mut m = RecvMeta {
                len: batch.hdrs[i].msg_len as usize,
                src: from_raw(&batch.names[i]),
                ecn: 0,
                dscp: 0,
                segment: 0,
                arrived_realtime: 0,
            };
            // SAFETY: the kernel filled `msg_control` with `msg_controllen` bytes of cmsgs; the
            // CMSG_* macros walk them within those bounds.
            unsafe {
                let mut cmsg = libc::CMSG_FIRSTHDR(h);
                while !cmsg.is_null() {
                    let (level, kind) = ((*cmsg).cmsg_level, (*cmsg).cmsg_type);
                    let data = libc::CMSG_DATA(cmsg);
                    if (level == libc::IPPROTO_IP && kind == libc::IP_TOS)
                        || (level == libc::IPPROTO_IPV6 && kind == IPV6_TCLASS)
                    {
                        // IP_TOS arrives as one byte, IPV6_TCLASS as an int.
                        let v = if level == libc::IPPROTO_IP {
                            i32::from(data.read())
                        } else {
                            data.cast::<i32>().read_unaligned()
                        };
                        m.ecn = (v & 0b11) as u8;
                        m.dscp = ((v >> 2) & 0x3f) as u8;
                    } else if level == SOL_UDP && kind == UDP_GRO {
                        m.segment = data.cast::<i32>().read_unaligned().max(0) as usize;
                    } else if level == libc::SOL_SOCKET && kind == SO_TIMESTAMPNS_OLD {
                        let ts = data.cast::<libc::timespec>().read_unaligned();
                        m.arrived_realtime = (ts.tv_sec.max(0) as u64)
                            .wrapping_mul(1_000_000_000)
                            .wrapping_add(ts.tv_nsec.max(0) as u64);
                    }
                    cmsg = libc::CMSG_NXTHDR(h, cmsg);
                }
            }
            batch.meta[i] = m;
        }
        Ok(got)
    }

    /// Waits until the socket is readable or `timeout_ns` passes, with nanosecond resolution
    /// (`ppoll`): the connection's timers are microseconds.
    pub fn wait_readable_ns(&self, timeout_ns: u64) -> io::Result<bool> {
        wait_readable_fds(&[self.fd.as_raw_fd()], timeout_ns)
    }

    /// The socket's descriptor (to wait on it beside others).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// Sleeps until one of `fds` (the first 65) is readable or `timeout_ns` passes (a signal ends it
/// early); whether one is.
pub fn wait_readable_fds(fds: &[std::os::fd::RawFd], timeout_ns: u64) -> io::Result<bool> {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 1 + super::xdp::MAX_QUEUES];
    let n = fds.len().min(pfds.len());
    for (p, &fd) in pfds.iter_mut().zip(&fds[..n]) {
        p.fd = fd;
    }
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as _,
    };
    // SAFETY: `pfds` holds `n` live pollfds and `ts` is a live timespec; no signal mask is
    // changed.
    let r = unsafe { libc::ppoll(pfds.as_mut_ptr(), n as libc::nfds_t, &ts, std::ptr::null()) };
    if r < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(err);
    }
    Ok(r > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> SocketOptions {
        SocketOptions {
            rcvbuf: 1 << 20,
            sndbuf: 1 << 20,
            gro: true,
            arrival_times: true,
            busy_poll_us: 0,
            dscp: 0,
            priority: 0,
        }
    }

    fn recv_all(s: &UdpSocket) -> Vec<(Vec<u8>, RecvMeta)> {
        let mut batch = RecvBatch::new(8, 65536);
        let mut out = Vec::new();
        for _ in 0..100 {
            let _ = s.wait_readable_ns(50_000_000);
            let n = s.recv_batch(&mut batch, usize::MAX).unwrap();
            for i in 0..n {
                let (d, m) = batch.get(i);
                out.push((d.to_vec(), m));
            }
            if n == 0 && !out.is_empty() {
                break;
            }
        }
        out
    }

    #[test]
    fn ect0_leaves_and_is_reported_v4() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        a.send(&b.local_addr(), b"hello", 0).unwrap();
        let got = recv_all(&b);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, b"hello");
        assert_eq!(got[0].1.ecn, ECT0, "the receiver sees ECT(0)");
        assert_eq!(got[0].1.src, Some(a.local_addr()));
    }

    /// `--tclass` and `-S` on the UDP transport: the DSCP goes in the IP header beside ECT(0),
    /// on IPv4 and IPv6, and the socket takes the priority.
    #[test]
    fn the_traffic_class_and_priority_are_set() {
        let marked = SocketOptions {
            dscp: 26,
            priority: 3,
            ..opts()
        };
        for (a_addr, b_addr) in [("127.0.0.1:0", "127.0.0.1:0"), ("[::1]:0", "[::1]:0")] {
            let Ok(a) = UdpSocket::bind(a_addr.parse().unwrap(), &marked) else {
                continue; // no IPv6 on this host
            };
            let b = UdpSocket::bind(b_addr.parse().unwrap(), &opts()).unwrap();
            a.send(&b.local_addr(), b"af31", 0).unwrap();
            let got = recv_all(&b);
            assert_eq!(got.len(), 1);
            assert_eq!((got[0].1.dscp, got[0].1.ecn), (26, ECT0), "{a_addr}");
            let mut prio: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: `prio` and `len` are live out-parameters of the sizes given.
            let rc = unsafe {
                libc::getsockopt(
                    a.fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_PRIORITY,
                    (&mut prio as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            assert_eq!((rc, prio), (0, 3));
            // Unmarked, the DSCP is 0 (best effort).
            let c = UdpSocket::bind(a_addr.parse().unwrap(), &opts()).unwrap();
            c.send(&b.local_addr(), b"be", 0).unwrap();
            assert_eq!(recv_all(&b)[0].1.dscp, 0);
        }
    }

    #[test]
    #[cfg_attr(
        target_arch = "aarch64",
        ignore = "the CI runs aarch64 tests under qemu-user, which drops SCM_TIMESTAMPNS (the \
                  engine then dates arrivals when it reads them); runs natively on x86-64"
    )]
    fn the_kernel_dates_each_arrival() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        // The kernel turns receive timestamps on for the first socket that asks a moment later
        // (a deferred switch); until then it dates a datagram when it is read.
        a.send(&b.local_addr(), b"warm-up", 0).unwrap();
        assert_eq!(recv_all(&b).len(), 1);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let before = realtime_ns();
        a.send(&b.local_addr(), b"first", 0).unwrap();
        // The second datagram waits in the socket for 30 ms before it is read: its date is
        // when it arrived, not when it was read.
        std::thread::sleep(std::time::Duration::from_millis(30));
        a.send(&b.local_addr(), b"second", 0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let read_at = realtime_ns();
        let got = recv_all(&b);
        assert_eq!(got.len(), 2);
        let (first, second) = (got[0].1.arrived_realtime, got[1].1.arrived_realtime);
        assert!(
            before <= first && first < second && second <= read_at,
            "{got:?}"
        );
        assert!(second - first >= 25_000_000, "{got:?}");
        assert!(first - before < 25_000_000, "{got:?}");
        assert!(read_at - second >= 25_000_000, "{got:?}");
    }

    /// Without arrival times a socket's datagrams carry no date (the engine dates them when it
    /// reads them), although another socket of the host asks for them.
    #[test]
    #[cfg_attr(
        target_arch = "aarch64",
        ignore = "qemu-user drops SCM_TIMESTAMPNS, so no date proves nothing there"
    )]
    fn a_socket_without_arrival_times_gets_no_date() {
        let dated = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let o = SocketOptions {
            arrival_times: false,
            ..opts()
        };
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &o).unwrap();
        for _ in 0..3 {
            dated.send(&b.local_addr(), b"undated", 0).unwrap();
        }
        let got = recv_all(&b);
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|(_, m)| m.arrived_realtime == 0), "{got:?}");
    }

    #[test]
    fn ect0_leaves_and_is_reported_v6() {
        let Ok(a) = UdpSocket::bind("[::1]:0".parse().unwrap(), &opts()) else {
            eprintln!("no IPv6 loopback here");
            return;
        };
        let b = UdpSocket::bind("[::1]:0".parse().unwrap(), &opts()).unwrap();
        a.send(&b.local_addr(), b"hello6", 0).unwrap();
        let got = recv_all(&b);
        assert_eq!(got[0].0, b"hello6");
        assert_eq!(got[0].1.ecn, ECT0);
    }

    #[test]
    fn gso_send_arrives_as_segments() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let mut o = opts();
        o.gro = false;
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &o).unwrap();
        let buf: Vec<u8> = (0..1000u32 * 3 + 10).map(|i| i as u8).collect();
        assert_eq!(a.send(&b.local_addr(), &buf, 1000).unwrap(), buf.len());
        let got = recv_all(&b);
        let lens: Vec<usize> = got.iter().map(|g| g.0.len()).collect();
        assert_eq!(lens, [1000, 1000, 1000, 10]);
        let joined: Vec<u8> = got.into_iter().flat_map(|g| g.0).collect();
        assert_eq!(joined, buf);
    }

    #[test]
    fn send_many_mixes_single_datagrams_and_gso_batches() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let mut o = opts();
        o.gro = false;
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &o).unwrap();
        let big: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        let mut buf = b"one".to_vec();
        buf.extend_from_slice(&big);
        buf.extend_from_slice(b"three");
        let run = |start, len, segment| SendRun {
            start,
            len,
            segment,
        };
        let runs = [run(0, 3, 3), run(3, 2500, 1000), run(2503, 5, 5)];
        assert_eq!(a.send_many(&b.local_addr(), &buf, &runs).unwrap(), 3);
        assert!(a
            .send_many(&b.local_addr(), &buf, &[run(2503, 6, 6)])
            .is_err());
        let got: Vec<Vec<u8>> = recv_all(&b).into_iter().map(|g| g.0).collect();
        assert_eq!(
            got,
            [
                b"one".to_vec(),
                big[..1000].to_vec(),
                big[1000..2000].to_vec(),
                big[2000..].to_vec(),
                b"three".to_vec()
            ]
        );
    }

    /// GRO turned off on a socket that had it: a GSO burst arrives datagram by datagram; on
    /// again, coalesced.
    #[test]
    fn gro_turns_off_and_on() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let mut b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let buf = vec![7u8; 1200 * 4];
        for on in [false, true, false] {
            b.set_gro(on).unwrap();
            assert_eq!(b.gro(), on);
            a.send(&b.local_addr(), &buf, 1200).unwrap();
            let got = recv_all(&b);
            assert_eq!(got.iter().map(|g| g.0.len()).sum::<usize>(), buf.len());
            if on {
                assert!(got.iter().any(|g| g.0.len() > 1200), "GRO on: {got:?}");
            } else {
                assert!(got.iter().all(|g| g.0.len() == 1200 && g.1.segment == 0));
            }
        }
    }

    #[test]
    fn gro_reports_segment_size() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        assert!(b.gro());
        let buf = vec![7u8; 1200 * 4];
        a.send(&b.local_addr(), &buf, 1200).unwrap();
        let got = recv_all(&b);
        let total: usize = got.iter().map(|g| g.0.len()).sum();
        assert_eq!(total, buf.len());
        for (bytes, meta) in &got {
            if bytes.len() > 1200 {
                assert_eq!(
                    meta.segment, 1200,
                    "a coalesced buffer names its segment size"
                );
            }
        }
    }
}
