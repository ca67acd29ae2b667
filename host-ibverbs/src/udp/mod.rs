//! The UDP software transport: MetaRoCE connections over UDP sockets, behind a Verbs-shaped API.
//!
//! ```text
//! Context (device) ── ProtectionDomain ── MemoryRegion
//!        │                   └─────────── QueuePair ── CompletionQueue
//!        └── CompletionQueue
//! ```
//!
//! Ownership encodes the Verbs destroy order: a queue pair holds its protection domain and
//! completion queue, a memory region holds its protection domain, and both hold the device, so
//! nothing can be destroyed while something built on it lives. A posted buffer's memory region
//! stays alive until the work request completes, even if the caller drops its handle.
//!
//! The datagram payload is the frame from BTH to ICRC, sent to UDP port 4791 by default, each
//! path from its own UDP source port, as ECT(0); CE marks on arrival go to the connection. The
//! engine runs on the calling thread inside [`CompletionQueue::poll`], [`CompletionQueue::wait`]
//! and [`Context::progress`]; everything here is single-threaded (`!Send`), one device per thread.

pub mod cpu_wait;
pub mod crc_engine;
mod engine;
pub(crate) use engine::HashMap as FastMap;
mod error;
pub mod share_table;
pub mod socket;
pub mod stats;
pub mod xdp;

pub use engine::{MAX_INFLIGHT, MAX_PATHS, QUEUE, REGIONS, STREAMS};
pub use error::{Error, ErrorKind};
pub use transport_core::conn::{Access, CompletionKind, IcrcMode, RemoteAddr, Status, WrOp};

use engine::{CqShared, Engine, MemEntry, Pending, QpState};
use metaroce_frames::capture::PcapWriter;
use socket::{SocketOptions, UdpSocket};
use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::io;
use std::io::BufWriter;
use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::rc::Rc;
use std::time::{Duration, Instant};
use transport_core::conn::{Config, RecvRequest, Region, WorkRequest};
use transport_core::wire::{Psn, Qpn, ROCEV2_PORT};

mod memory;
mod qp;
pub use memory::*;
pub use qp::*;

/// How to open a device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The local address to send from and receive on (the peer sees it; it enters the ICRC).
    pub local_ip: IpAddr,
    /// UDP port to receive on (4791 by default; 0 picks a free one).
    pub port: u16,
    /// Spin instead of sleeping when a wait finds nothing to do ([`CompletionQueue::wait`],
    /// [`Context::progress`] with a timeout), and let the kernel busy-poll the NIC's receive
    /// queue (SO_BUSY_POLL, 50 us): lower latency for a whole core.
    pub busy_poll: bool,
    /// Send consecutive datagrams of a path in one call (UDP GSO).
    pub gso: bool,
    /// Let the kernel coalesce arrivals (UDP GRO).
    pub gro: bool,
    /// Ask the kernel for each datagram's arrival time (`SO_TIMESTAMPNS`): the time a datagram
    /// waited in the socket while this end slept, or was descheduled, then counts in no RTT
    /// sample and no ACK delay. Without it an arrival is dated when it is read, which an end
    /// that only spins (a latency test) does within a round of its loop; after a stall of the
    /// host such a date is late, so an RTT sample comes out long (never short: no spurious
    /// timeout from it). The kernel dates every datagram of the host while any socket asks
    /// (about 0.1 us a hop on loopback, docs/BENCHMARKS.md).
    pub arrival_times: bool,
    /// Copy every payload next to its headers before the send call; off (the default), a
    /// payload of 512 bytes or more is read by the send call where it lies in its region (one
    /// copy, the kernel's, instead of two). A capture (`pcap`) copies always.
    pub copy_send: bool,
    /// Several datagrams per system call (`sendmmsg`, `recvmmsg`); off, one per call.
    pub batch: bool,
    /// Socket buffer size to ask for, bytes.
    pub socket_buffer: usize,
    /// Write every datagram sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
    /// This end's inbound capacity, Mb/s: when set, every ACK carries each sender's max-min
    /// share of it (the receiver's rate hint); 0, no hint.
    pub line_rate_mbps: u32,
    /// With a line rate: the table in shared memory through which the engines receiving on
    /// this address at this line rate (other processes, other threads) divide it among all
    /// their connections ([`share_table`]); None, or a table that cannot be opened (said on
    /// stderr), this engine's connections have it to themselves.
    pub share_table: Option<PathBuf>,
    /// The traffic class of what is sent: its DSCP (upper six bits) goes in the IP header, with
    /// ECT(0) always in the ECN bits (as perftest's `--tclass` on a RoCE NIC).
    pub traffic_class: u8,
    /// The sockets' priority (`SO_PRIORITY`, 0 to 6; on a VLAN the PCP the interface maps it
    /// to): the UDP transport's counterpart of a RoCE service level (`-S`).
    pub priority: u8,
    /// Send and receive through AF_XDP sockets on the interface of `local_ip` ([`xdp`]), one on
    /// each of its receive queues (up to 64): arrivals read without a system call. IPv4, XDP in
    /// the interface's driver, root.
    pub xdp: bool,
}

impl DeviceConfig {
    /// Defaults: port 4791, GSO, GRO, arrival times and batched calls on, 8 MiB socket
    /// buffers, no busy polling, no capture.
    pub fn new(local_ip: IpAddr) -> DeviceConfig {
        DeviceConfig {
            local_ip,
            port: ROCEV2_PORT,
            busy_poll: false,
            gso: true,
            gro: true,
            arrival_times: true,
            copy_send: false,
            batch: true,
            socket_buffer: 8 << 20,
            pcap: None,
            line_rate_mbps: 0,
            share_table: None,
            traffic_class: 0,
            priority: 0,
            xdp: false,
        }
    }
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The caller's work request id.
    pub wr_id: u64,
    /// How it ended.
    pub status: Status,
    /// What completed.
    pub kind: CompletionKind,
    /// Bytes transferred (received, for a receive).
    pub byte_len: u32,
    /// Immediate data, when the message carried some.
    pub imm: Option<u32>,
    /// The local queue pair.
    pub qp_num: u32,
    /// The stream.
    pub stream: u16,
}

/// Packets in flight per path by default at the default payload, 4096 bytes (see
/// [`QpAttr::default`] and [`window_for`]).
pub const DEFAULT_WINDOW: u32 = 32;
/// The largest payload a packet may carry (`QpAttr::mtu`): its datagram, with every header and
/// the ICRC, stays within 65,000 bytes, below the 65,507 of a UDP datagram over IPv4.
pub const MAX_MTU: u32 = 65_000 - 128;

/// Packets in a row a path takes by default once picked ([`QpAttr::spray_burst`]).
pub const DEFAULT_SPRAY_BURST: u8 = 8;

/// Bytes in flight per path by default for a [`QpAttr`] that sets its `mtu` ([`window_for`]), the
/// least of the tools' default (which gives one connection up to 512 KiB a path) and the cap of
/// their rate- and delay-based controllers: the window is a byte budget (what a round trip holds
/// is bytes), taken in packets of the payload in use.
pub const DEFAULT_WINDOW_BYTES: u32 = 128 << 10;

/// Packets in flight per path by default at least, where that takes no more than twice
/// [`DEFAULT_WINDOW_BYTES`] ([`window_for`]).
pub const MIN_WINDOW_PACKETS: u32 = 64;

/// Bytes a path starts with by default (before its window grows, or its first rate hint comes):
/// 32 packets of 1 KiB, the flight four senders were measured to fit into a shared 2 MB queue
/// with their fair shares kept (docs/BENCHMARKS.md, four clients through a tbf), taken in packets
/// of the payload in use by [`start_window_for`]. A start in packets would grow with the payload
/// (2 MiB a connection at 16 KiB): a MetaRoCE sender pays for its first window at its first
/// hint, and one that was alone then paid at the whole line and kept several MB more than the
/// senders that joined it.
pub const START_WINDOW_BYTES: u32 = 32 << 10;

/// The window per path a connection starts with by default, packets, for `payload`-byte
/// packets: [`START_WINDOW_BYTES`] of them, 2 to [`DEFAULT_WINDOW`] (32 at 1024 bytes, 23 at
/// 1408, 8 at 4096, 3 at 8896, 2 at 16 KiB).
pub fn start_window_for(payload: u32) -> u32 {
    (START_WINDOW_BYTES / payload.max(1)).clamp(2, DEFAULT_WINDOW)
}

/// The window per path, packets, for `payload`-byte packets at [`DEFAULT_WINDOW_BYTES`]
/// ([`window_of`]): [`DEFAULT_WINDOW_BYTES`] of them, or [`MIN_WINDOW_PACKETS`] where they fit in
/// twice that, 16 to 255 packets (the 256-bit SACK bitmap bounds a path's flight). 64 at 4096
/// bytes and 2048, 128 at 1024.
///
/// Measured (docs/BENCHMARKS.md), with the sender that copied every payload into staging
/// buffers: across a veth at MTU 1500 (1024-byte payloads), 32 packets a path held write-bw
/// 10-20% below 128, and 255 held it 5-20% below (since payloads leave from their regions, 255
/// of 1408 bytes moved 11% more than 93 for one connection); with 4096-byte payloads
/// (loopback, veth at MTU 9000), since payloads leave from their regions, 64 packets moved
/// 10-15% more than 32 (a 64 KB GSO send holds 15 of them: a path needs a few sends in flight,
/// not only bytes), where the copying sender of before lost a quarter or more at 128 (its
/// staging buffers left the caches).
pub fn window_for(payload: u32) -> u32 {
    window_of(DEFAULT_WINDOW_BYTES, payload)
}

/// A window per path of `bytes` in `payload`-byte packets, or [`MIN_WINDOW_PACKETS`] where
/// they fit in twice [`DEFAULT_WINDOW_BYTES`], 16 to 255 packets (the 256-bit SACK bitmap
/// bounds a path's flight).
pub fn window_of(bytes: u32, payload: u32) -> u32 {
    let payload = payload.max(1);
    let by_bytes = bytes / payload;
    let fits = MIN_WINDOW_PACKETS.saturating_mul(payload) <= 2 * DEFAULT_WINDOW_BYTES;
    let packets = if fits {
        by_bytes.max(MIN_WINDOW_PACKETS)
    } else {
        by_bytes
    };
    packets.clamp(16, 255)
}

/// A queue pair's connection parameters.
#[derive(Debug, Clone, Copy)]
pub struct QpAttr {
    /// Paths (1 to 64).
    pub paths: u8,
    /// Payload bytes per packet.
    pub mtu: u32,
    /// Packets in flight per path at most.
    pub window_per_path: u32,
    /// Where each path's window starts under ECN AIMD and MetaRoCE, packets (0: at
    /// `window_per_path`; `transport_core::conn::Config::start_window_per_path`).
    pub start_window_per_path: u32,
    /// Partition key.
    pub pkey: u16,
    /// Retransmission timeout with few packets in flight, ns.
    pub rto_low: u64,
    /// Retransmission timeout otherwise, ns.
    pub rto_high: u64,
    /// Time between probes of a failing path, ns.
    pub probe_interval: u64,
    /// Longest delay of an ACK, ns.
    pub ack_delay: u64,
    /// The rate controller (`transport_core::rate`; ECN AIMD per path by default).
    pub cc: transport_core::rate::Algorithm,
    /// The ICRC of the datagrams: computed and checked (the default), or, where both ends
    /// agree, neither (`IcrcMode::Off`: the UDP checksum and the links' frame checks guard the
    /// datagram, as they do TCP's segments; docs/PROTOCOL.md 4.1).
    pub icrc: IcrcMode,
    /// Packets in a row a path takes once picked (`transport_core::conn::Config::spray_burst`;
    /// 1: a path per packet). 8 by default: the engine sends each path's packets in one GSO
    /// call anyway, and a pick per packet cost a tenth of the sender's CPU at 1024-byte
    /// payloads (docs/BENCHMARKS.md).
    pub spray_burst: u8,
    /// Read and atomic requests outstanding at most (the initiator depth, verbs'
    /// `max_rd_atomic`; `transport_core::conn::Config::max_rd_atomic`): one more waits for a
    /// response, and holds its stream's later messages. 16 by default, as RDMA NICs allow.
    pub max_rd_atomic: u8,
}

/// Read and atomic requests a queue pair has outstanding by default ([`QpAttr::max_rd_atomic`]).
pub const DEFAULT_MAX_RD_ATOMIC: u8 = 16;

impl Default for QpAttr {
    /// 8 paths, 4096-byte packets, 32 packets (128 KiB; the tools' default grows to what
    /// [`window_of`] gives their payload and their share of 4 MiB) in flight per path, and
    /// timers sized for a host: a software endpoint can be descheduled for hundreds of
    /// microseconds, so the RTO starts at 1 ms rather than the 100 us a NIC would use. The window
    /// too is sized for a host: its round trip includes batching in both kernels and both
    /// engines (tens of microseconds): across a veth 16 packets of 1024 bytes per path (a NIC's
    /// few-microsecond round trip) held write-bw to 0.8x of one TCP stream and 32 to 0.9x of
    /// 128. Once payloads left from their regions (no staging copy), one connection moved more
    /// with 255 packets a path than with 128 KiB (6-13% idle and 22-24% beside two busy loops,
    /// at MTU 1500 and 9000), where four connections with 359 KiB a path once had timeouts fire
    /// with nothing dropped (the tools share 4 MiB among an engine's paths). A runner that sets
    /// `mtu` sets the window with it.
    fn default() -> Self {
        QpAttr {
            paths: 8,
            mtu: 4096,
            window_per_path: DEFAULT_WINDOW,
            start_window_per_path: 0,
            pkey: 0xffff,
            rto_low: 1_000_000,
            rto_high: 4_000_000,
            probe_interval: 1_000_000,
            ack_delay: 20_000,
            icrc: IcrcMode::Full,
            spray_burst: DEFAULT_SPRAY_BURST,
            max_rd_atomic: DEFAULT_MAX_RD_ATOMIC,
            cc: transport_core::rate::Algorithm::EcnAimd,
        }
    }
}

/// What a peer needs to connect to a queue pair (exchanged out of band).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// Queue pair number.
    pub qpn: u32,
    /// First PSN it sends.
    pub psn: u32,
    /// Where its path sequence numbers start (`Config::initial_path_seq`).
    pub path_seq: u32,
    /// Its data address (IP and UDP port it receives on).
    pub addr: SocketAddr,
}

struct CtxInner {
    engine: RefCell<Engine>,
    next_pd: Cell<u32>,
    rng: Cell<u64>,
}

/// An open device: the sockets and the engine. Cheap to clone (a handle).
#[derive(Clone)]
pub struct Context {
    inner: Rc<CtxInner>,
}

/// 64 random bits from the kernel (for session numbers and seeds).
pub fn random_u64() -> u64 {
    random_seed()
}

pub(crate) fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is a live, writable 8-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == 8 {
        u64::from_ne_bytes(b)
    } else {
        // No entropy source: time and pid still make keys differ between runs.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (u64::from(std::process::id()) << 32)
    }
}

impl Context {
    /// Opens a device on `cfg.local_ip`.
    pub fn open(cfg: &DeviceConfig) -> Result<Context, Error> {
        let opts = SocketOptions {
            rcvbuf: cfg.socket_buffer,
            sndbuf: cfg.socket_buffer,
            gro: cfg.gro,
            arrival_times: cfg.arrival_times,
            busy_poll_us: if cfg.busy_poll { 50 } else { 0 },
            dscp: cfg.traffic_class >> 2,
            priority: cfg.priority,
        };
        let addr = SocketAddr::new(cfg.local_ip, cfg.port);
        let rx = UdpSocket::bind(addr, &opts)
            .map_err(|e| Error::io("open_device", "bind UDP", Some(addr), e))?;
        let pcap = match &cfg.pcap {
            None => None,
            Some(p) => {
                let f = std::fs::File::create(p)
                    .map_err(|e| Error::io("open_device", "create the capture file", None, e))?;
                Some(
                    PcapWriter::new(BufWriter::new(f))
                        .map_err(|e| Error::io("open_device", "write the capture", None, e))?,
                )
            }
        };
        let xdp = if cfg.xdp {
            let IpAddr::V4(ip) = cfg.local_ip else {
                return Err(Error::io(
                    "open_device",
                    "open the AF_XDP datapath",
                    Some(addr),
                    io::Error::new(io::ErrorKind::Unsupported, "IPv4 only"),
                ));
            };
            let local = SocketAddrV4::new(ip, rx.local_addr().port());
            Some(Box::new(
                xdp::Xdp::open(local, cfg.traffic_class >> 2).map_err(|e| {
                    Error::io("open_device", "open the AF_XDP datapath", Some(addr), e)
                })?,
            ))
        } else {
            None
        };
        let mut engine = Engine::new(
            rx,
            opts,
            cfg.gso,
            !cfg.copy_send,
            cfg.batch,
            cfg.busy_poll,
            pcap,
        );
        engine.xdp = xdp;
        if cfg.line_rate_mbps > 0 {
            engine.fair = Some(transport_core::rate::FairShare::new(
                cfg.line_rate_mbps,
                engine::SHARE_IDLE_NS,
                // The largest payload a connection may use: the longest gap a paced sender
                // leaves between its packets.
                4096,
            ));
            if let Some(path) = &cfg.share_table {
                // Without the table the engine still shares its line among its own connections:
                // said, not fatal.
                match share_table::ShareTable::open(path, cfg.local_ip, cfg.line_rate_mbps) {
                    Ok(t) => engine.share_table = Some(t),
                    Err(e) => eprintln!(
                        "metaroce: no fair-share table ({e}): this engine divides the line among \
                         its own connections only"
                    ),
                }
            }
        }
        Ok(Context {
            inner: Rc::new(CtxInner {
                engine: RefCell::new(engine),
                next_pd: Cell::new(1),
                rng: Cell::new(random_seed() | 1),
            }),
        })
    }

    fn random(&self) -> u64 {
        // SplitMix64.
        let s = self.inner.rng.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        self.inner.rng.set(s);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Runs `f` on the engine, then drops what the engine released (outside the borrow: a
    /// released memory region deregisters itself from the engine).
    fn with<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        let (r, mut released) = {
            let mut e = self.inner.engine.borrow_mut();
            let r = f(&mut e);
            let released = if e.release.is_empty() {
                Vec::new()
            } else {
                std::mem::take(&mut e.release)
            };
            (r, released)
        };
        if !released.is_empty() {
            // Dropped outside the engine (a last reference may deregister a region), and the
            // list handed back so that completing does not allocate.
            released.clear();
            let mut e = self.inner.engine.borrow_mut();
            if e.release.capacity() == 0 {
                e.release = released;
            }
        }
        r
    }

    /// The address datagrams arrive at.
    pub fn local_addr(&self) -> SocketAddr {
        self.with(|e| e.rx.local_addr())
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        let id = self.inner.next_pd.get();
        self.inner.next_pd.set(id + 1);
        ProtectionDomain {
            inner: Rc::new(PdInner {
                ctx: self.clone(),
                id,
            }),
        }
    }

    /// Creates a completion queue.
    pub fn create_cq(&self) -> CompletionQueue {
        CompletionQueue {
            ctx: self.clone(),
            shared: Rc::new(CqShared::default()),
        }
    }

    /// Runs the engine once: timers, arrivals, transmissions. Sleeps up to `wait` when there is
    /// nothing to do. Returns whether anything happened.
    pub fn progress(&self, wait: Duration) -> bool {
        self.with(|e| e.progress(wait))
    }

    /// Lets the kernel coalesce arrivals (UDP GRO) from now on, on a device opened without it:
    /// GRO saves a receive call per datagram of a message that takes several, and costs a ping
    /// that takes one about 0.1 us a hop on loopback. It stays on: datagrams it coalesced may
    /// still wait in the socket (and the kernel keeps a host-wide switch of its UDP receive path
    /// on for as long as the socket lives). A kernel that refuses it is asked once.
    pub fn enable_gro(&self) {
        self.with(|e| e.enable_gro())
    }

    /// Whether the kernel coalesces arrivals (UDP GRO) now.
    pub fn gro(&self) -> bool {
        self.with(|e| e.gro())
    }

    /// Device-wide counters.
    pub fn counters(&self) -> stats::EngineCounters {
        self.with(|e| e.device_counters())
    }

    /// Every connected queue pair's counters and paths.
    pub fn snapshot(&self) -> Vec<stats::QpSnapshot> {
        self.with(|e| e.snapshot())
    }

    /// What the device holds: send sockets, staging buffers, queue pairs, requests in flight and
    /// regions. Arrivals never add to it (see the flood test).
    pub fn footprint(&self) -> [usize; 5] {
        self.with(|e| e.footprint())
    }

    /// Flushes and closes the capture file, if any.
    pub fn finish_pcap(&self) -> std::io::Result<()> {
        self.with(|e| e.finish_pcap())
    }
}

/// Completions of one or more queue pairs.
pub struct CompletionQueue {
    ctx: Context,
    shared: Rc<CqShared>,
}

impl CompletionQueue {
    /// Runs the engine once without sleeping, then moves up to `max` completions into `out`;
    /// returns how many.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        self.poll_active(out, max).0
    }

    /// As [`CompletionQueue::poll`], and whether the engine did anything (sent, received or
    /// fired a timer) when it ran: a caller deciding whether to sleep needs both.
    pub fn poll_active(&self, out: &mut Vec<WorkCompletion>, max: usize) -> (usize, bool) {
        let mut active = false;
        if self.shared.queue.borrow().is_empty() {
            active = self.ctx.progress(Duration::ZERO);
        }
        (self.take_ready(out, max), active)
    }

    /// Moves up to `max` completions already waiting into `out`, without running the engine;
    /// returns how many. (After [`CompletionQueue::wait`]: a round now would send the ACKs the
    /// arrivals call for before the caller could answer them.)
    pub fn take_ready(&self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        let mut q = self.shared.queue.borrow_mut();
        let n = max.min(q.len());
        // One by one: `extend` over a drain cost a ping about a hundred instructions for the
        // single completion it moves.
        out.reserve(n);
        for _ in 0..n {
            if let Some(wc) = q.pop_front() {
                out.push(wc);
            }
        }
        n
    }

    /// Runs the engine until a completion is there or `timeout` passes: at least one round,
    /// also when the thread gets the CPU back only after `timeout` (a contended host), so that
    /// what arrived meanwhile is taken now and not at the next call.
    pub fn wait(&self, timeout: Duration) -> Option<WorkCompletion> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(wc) = self.shared.queue.borrow_mut().pop_front() {
                return Some(wc);
            }
            let left = end.saturating_duration_since(Instant::now());
            self.ctx.progress(left.min(Duration::from_millis(10)));
            if left.is_zero() {
                return self.shared.queue.borrow_mut().pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests;
