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

pub mod crc_engine;
mod engine;
mod error;
pub mod socket;
pub mod stats;

pub use engine::{MAX_INFLIGHT, MAX_PATHS, QUEUE, REGIONS, STREAMS};
pub use error::{Error, ErrorKind};
pub use transport_core::conn::{Access, CompletionKind, IcrcMode, RemoteAddr, Status, WrOp};

use engine::{CqShared, Engine, MemEntry, Pending, QpState};
use metaroce_frames::capture::PcapWriter;
use socket::{SocketOptions, UdpSocket};
use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::io::BufWriter;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::rc::Rc;
use std::time::{Duration, Instant};
use transport_core::conn::{Config, RecvRequest, Region, WorkRequest};
use transport_core::wire::{Psn, Qpn, ROCEV2_PORT};

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
    /// Several datagrams per system call (`sendmmsg`, `recvmmsg`); off, one per call.
    pub batch: bool,
    /// Socket buffer size to ask for, bytes.
    pub socket_buffer: usize,
    /// Write every datagram sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
}

impl DeviceConfig {
    /// Defaults: port 4791, GSO, GRO and batched calls on, 8 MiB socket buffers, no busy
    /// polling, no capture.
    pub fn new(local_ip: IpAddr) -> DeviceConfig {
        DeviceConfig {
            local_ip,
            port: ROCEV2_PORT,
            busy_poll: false,
            gso: true,
            gro: true,
            batch: true,
            socket_buffer: 8 << 20,
            pcap: None,
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

/// Packets in flight per path by default (see [`QpAttr::default`]).
pub const DEFAULT_WINDOW: u32 = 32;

/// A queue pair's connection parameters.
#[derive(Debug, Clone, Copy)]
pub struct QpAttr {
    /// Paths (1 to 64).
    pub paths: u8,
    /// Payload bytes per packet.
    pub mtu: u32,
    /// Packets in flight per path.
    pub window_per_path: u32,
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
    /// The ICRC of the datagrams: computed and checked (the default), or, where both ends
    /// agree, neither (`IcrcMode::Off`: the UDP checksum and the links' frame checks guard the
    /// datagram, as they do TCP's segments; docs/PROTOCOL.md 4.1).
    pub icrc: IcrcMode,
}

impl Default for QpAttr {
    /// 8 paths, 4096-byte packets, 32 packets in flight per path, and timers sized for a host:
    /// a software endpoint can be descheduled for hundreds of microseconds, so the RTO starts at
    /// 1 ms rather than the 100 us a NIC would use. The window too is sized for a host: its
    /// round trip includes batching in both kernels and both engines (tens of microseconds):
    /// across a veth 16 packets per path (a NIC's few-microsecond round trip) held write-bw to
    /// 0.8x of one TCP stream, and 64 held send-bw back (more in flight than the receiver's
    /// cache holds).
    fn default() -> Self {
        QpAttr {
            paths: 8,
            mtu: 4096,
            window_per_path: DEFAULT_WINDOW,
            pkey: 0xffff,
            rto_low: 1_000_000,
            rto_high: 4_000_000,
            probe_interval: 1_000_000,
            ack_delay: 20_000,
            icrc: IcrcMode::Full,
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

fn random_seed() -> u64 {
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
            busy_poll_us: if cfg.busy_poll { 50 } else { 0 },
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
        let engine = Engine::new(rx, opts, cfg.gso, cfg.batch, cfg.busy_poll, pcap);
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

    /// Device-wide counters.
    pub fn counters(&self) -> stats::EngineCounters {
        self.with(|e| e.counters)
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

struct PdInner {
    ctx: Context,
    id: u32,
}

/// A protection domain: memory regions and queue pairs that may be used together.
pub struct ProtectionDomain {
    inner: Rc<PdInner>,
}

struct MrInner {
    pd: Rc<PdInner>,
    ptr: NonNull<u8>,
    layout: Layout,
    len: usize,
    key: u32,
    access: Access,
}

impl Drop for MrInner {
    fn drop(&mut self) {
        let base = self.ptr.as_ptr() as u64;
        let (pd, key) = (self.pd.id, self.key);
        self.pd.ctx.with(|e| {
            e.mems.remove(base);
            for qp in e.qps.values_mut().filter(|q| q.pd == pd) {
                if let Some(c) = qp.conn.as_mut() {
                    c.deregister(key);
                }
            }
        });
        // SAFETY: `ptr` came from `alloc_zeroed(layout)` and is freed once, here, after the
        // engine forgot the region (so nothing writes to it any more).
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A registered memory region: its own zeroed, page-aligned memory, reachable by peers through
/// its key with the rights it was registered with. The memory is read and written by copying
/// (`read`, `write`), never borrowed, because peers write into it while the program runs.
pub struct MemoryRegion {
    inner: Rc<MrInner>,
}

impl ProtectionDomain {
    /// Registers a new memory region of `len` bytes.
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<MemoryRegion, Error> {
        if len == 0 {
            return Err(Error::new("reg_mr", ErrorKind::EmptyRegion));
        }
        let layout = Layout::from_size_align(len, 4096)
            .map_err(|_| Error::new("reg_mr", ErrorKind::OutOfMemory(len)))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or(Error::new("reg_mr", ErrorKind::OutOfMemory(len)))?;
        let ctx = &self.inner.ctx;
        let key = loop {
            let k = ctx.random() as u32;
            if k != 0 && ctx.with(|e| e.mems.iter().all(|(_, m)| m.key != k)) {
                break k;
            }
        };
        let mr = MemoryRegion {
            inner: Rc::new(MrInner {
                pd: self.inner.clone(),
                ptr,
                layout,
                len,
                key,
                access,
            }),
        };
        let base = ptr.as_ptr() as u64;
        let region = Region {
            key,
            base,
            len: len as u64,
            access,
        };
        let pd = self.inner.id;
        ctx.with(|e| {
            e.mems.insert(
                base,
                MemEntry {
                    len: len as u64,
                    key,
                    pd,
                    access,
                },
            );
            for qp in e.qps.values_mut().filter(|q| q.pd == pd) {
                if let Some(c) = qp.conn.as_mut() {
                    c.register(region)
                        .map_err(|r| Error::new("reg_mr", ErrorKind::Region(r)))?;
                }
            }
            Ok::<(), Error>(())
        })?;
        Ok(mr)
    }

    /// Creates a queue pair whose completions go to `cq`. Connect it with
    /// [`QueuePair::connect`] once the peer's [`QpInfo`] is known.
    pub fn create_qp(&self, cq: &CompletionQueue, attr: &QpAttr) -> Result<QueuePair, Error> {
        if attr.paths == 0 || usize::from(attr.paths) > MAX_PATHS {
            return Err(Error::new(
                "create_qp",
                ErrorKind::Invalid("path count (1 to 64)"),
            ));
        }
        if attr.mtu < 256 || attr.mtu > 65_000 - 128 {
            return Err(Error::new(
                "create_qp",
                ErrorKind::Invalid("mtu (256 to 64872)"),
            ));
        }
        if !Rc::ptr_eq(&cq.ctx.inner, &self.inner.ctx.inner) {
            return Err(Error::new(
                "create_qp",
                ErrorKind::Invalid("completion queue of another device"),
            ));
        }
        let ctx = &self.inner.ctx;
        let qpn = loop {
            let q = (ctx.random() as u32) & 0x00ff_ffff;
            if q > 1 && ctx.with(|e| !e.qps.contains_key(&q)) {
                break q;
            }
        };
        // Every number a forger would have to guess starts at random: the PSN, the path
        // sequences, the probe sequences, and the paths' source ports (the entropy seed).
        let psn = (ctx.random() as u32) & 0x00ff_ffff;
        let seed = ctx.random() as u32;
        let path_seq = ctx.random() as u32;
        let probe_seq = ctx.random() as u32;
        ctx.with(|e| {
            e.qps.insert(
                qpn,
                QpState {
                    pd: self.inner.id,
                    cq: cq.shared.clone(),
                    conn: None,
                    peer: None,
                    pending: engine::Requests::default(),
                },
            )
        });
        Ok(QueuePair {
            inner: Rc::new(QpInner {
                pd: self.inner.clone(),
                _cq: cq.shared.clone(),
                qpn,
                psn,
                seed,
                path_seq,
                probe_seq,
                attr: *attr,
            }),
        })
    }
}

impl MemoryRegion {
    /// Bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Never true: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The address peers use (the start of the memory).
    pub fn addr(&self) -> u64 {
        self.inner.ptr.as_ptr() as u64
    }

    /// The key peers present (R_Key); also the local key.
    pub fn rkey(&self) -> u32 {
        self.inner.key
    }

    /// The rights it was registered with.
    pub fn access(&self) -> Access {
        self.inner.access
    }

    fn check(&self, op: &'static str, offset: usize, len: usize) -> Result<(), Error> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.inner.len)
        {
            return Err(Error::new(
                op,
                ErrorKind::LocalBounds {
                    offset,
                    len,
                    region_len: self.inner.len,
                },
            ));
        }
        Ok(())
    }

    /// Copies `out.len()` bytes from `offset` out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        self.check("mr_read", offset, out.len())?;
        // SAFETY: the range is inside the allocation (checked); the engine writes region
        // memory only inside API calls on this thread, never during this copy.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.inner.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), Error> {
        self.check("mr_write", offset, data.len())?;
        // SAFETY: as in `read`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.inner.ptr.as_ptr().add(offset),
                data.len(),
            )
        };
        Ok(())
    }

    /// The whole region as a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.inner.len];
        self.read(0, &mut v).expect("whole region is in bounds");
        v
    }

    /// Whether `len` bytes at `offset` equal `expected`, compared in place (no copy, no
    /// scratch buffer).
    pub fn equals(&self, offset: usize, expected: &[u8]) -> Result<bool, Error> {
        self.check("mr_compare", offset, expected.len())?;
        // SAFETY: the range is inside the allocation (checked); the engine writes region memory
        // only inside API calls on this thread, and the slice does not outlive this comparison.
        let got = unsafe {
            std::slice::from_raw_parts(self.inner.ptr.as_ptr().add(offset), expected.len())
        };
        Ok(got == expected)
    }

    /// A scatter-gather element over `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Sge<'_> {
        Sge {
            mr: self,
            offset,
            len,
        }
    }

    /// The remote address of `offset` in this region, for a peer.
    pub fn remote(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            va: self.addr() + offset,
            rkey: self.rkey(),
        }
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
        let mut q = self.shared.queue.borrow_mut();
        let n = max.min(q.len());
        if n > 0 {
            out.extend(q.drain(..n));
        }
        (n, active)
    }

    /// Runs the engine until a completion is there or `timeout` passes.
    pub fn wait(&self, timeout: Duration) -> Option<WorkCompletion> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(wc) = self.shared.queue.borrow_mut().pop_front() {
                return Some(wc);
            }
            let now = Instant::now();
            if now >= end {
                return None;
            }
            self.ctx
                .progress((end - now).min(Duration::from_millis(10)));
        }
    }
}

struct QpInner {
    pd: Rc<PdInner>,
    _cq: Rc<CqShared>,
    qpn: u32,
    psn: u32,
    seed: u32,
    path_seq: u32,
    probe_seq: u32,
    attr: QpAttr,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        let qpn = self.qpn;
        self.pd.ctx.with(|e| {
            if let Some(qp) = e.qps.remove(&qpn) {
                e.release.extend(qp.pending.into_keepalives());
            }
        });
    }
}

/// A scatter-gather element: `len` bytes at `offset` of a memory region.
#[derive(Clone, Copy)]
pub struct Sge<'a> {
    /// The region.
    pub mr: &'a MemoryRegion,
    /// Offset in it.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

/// A send-queue work request.
#[derive(Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: WrOp,
    /// The ordered stream (below [`STREAMS`]).
    pub stream: u16,
    /// Local memory: the source of a Send or Write, the destination of a Read or an atomic's
    /// original value.
    pub local: Sge<'a>,
    /// Peer memory (Write, Read, atomics).
    pub remote: RemoteAddr,
}

/// A queue pair: one MetaRoCE connection with its paths and streams.
pub struct QueuePair {
    inner: Rc<QpInner>,
}

impl QueuePair {
    /// Its number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// What the peer needs to connect to it.
    pub fn info(&self) -> QpInfo {
        QpInfo {
            qpn: self.inner.qpn,
            psn: self.inner.psn,
            path_seq: self.inner.path_seq,
            addr: self.inner.pd.ctx.local_addr(),
        }
    }

    /// Connects it to the peer's queue pair (Verbs' RTR and RTS in one step).
    pub fn connect(&self, remote: &QpInfo) -> Result<(), Error> {
        let ctx = &self.inner.pd.ctx;
        let local = ctx.local_addr();
        if local.is_ipv4() != remote.addr.is_ipv4() {
            return Err(Error::new("connect", ErrorKind::AddressFamily));
        }
        if remote.qpn > 0x00ff_ffff || remote.psn > 0x00ff_ffff {
            return Err(Error::new("connect", ErrorKind::Invalid("peer QPN or PSN")));
        }
        let a = self.inner.attr;
        let mut cfg = Config::new(
            local.ip(),
            remote.addr.ip(),
            Qpn::new(self.inner.qpn),
            Qpn::new(remote.qpn),
        );
        cfg.pkey = a.pkey;
        cfg.dst_port = remote.addr.port();
        cfg.local_port = local.port();
        cfg.paths = a.paths;
        cfg.mtu = a.mtu;
        cfg.entropy_seed = self.inner.seed;
        cfg.initial_psn = Psn::new(self.inner.psn);
        cfg.peer_initial_psn = Psn::new(remote.psn);
        cfg.initial_path_seq = self.inner.path_seq;
        cfg.peer_initial_path_seq = remote.path_seq;
        cfg.initial_probe_seq = self.inner.probe_seq;
        cfg.window_per_path = a.window_per_path;
        cfg.rto_low = a.rto_low;
        cfg.rto_high = a.rto_high;
        cfg.probe_interval = a.probe_interval;
        cfg.ack_delay = a.ack_delay;
        cfg.timeouts_to_probe = 3;
        cfg.icrc = a.icrc;
        cfg.icrc_engine = crc_engine::engine();
        let qpn = self.inner.qpn;
        let pd = self.inner.pd.id;
        ctx.with(|e| {
            let regions = e.regions_of(pd);
            let qp = e
                .qps
                .get_mut(&qpn)
                .ok_or(Error::new("connect", ErrorKind::NoSuchQp(qpn)))?;
            if qp.conn.is_some() {
                return Err(Error::new("connect", ErrorKind::AlreadyConnected));
            }
            let mut conn = Box::new(engine::Conn::new(cfg));
            for r in regions {
                conn.register(r)
                    .map_err(|err| Error::new("connect", ErrorKind::Region(err)))?;
            }
            qp.conn = Some(conn);
            qp.peer = Some(remote.addr);
            e.deadline_stale = true;
            Ok(())
        })
    }

    fn check_local(&self, op: &'static str, sge: &Sge<'_>, write: bool) -> Result<(), Error> {
        if !Rc::ptr_eq(&sge.mr.inner.pd, &self.inner.pd) {
            return Err(Error::new(op, ErrorKind::WrongProtectionDomain));
        }
        sge.mr.check(op, sge.offset, sge.len)?;
        if write && !sge.mr.inner.access.grants(Access::LOCAL_WRITE) {
            return Err(Error::new(op, ErrorKind::NoLocalWrite));
        }
        Ok(())
    }

    /// Posts a work request on the send queue.
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<(), Error> {
        const OP: &str = "post_send";
        let writes_local = matches!(
            wr.op,
            WrOp::Read | WrOp::CompareSwap { .. } | WrOp::FetchAdd(_)
        );
        self.check_local(OP, &wr.local, writes_local)?;
        let len = u32::try_from(wr.local.len).map_err(|_| {
            Error::new(
                OP,
                ErrorKind::Post(transport_core::conn::PostError::BadLength),
            )
        })?;
        let local_addr = wr.local.mr.addr() + wr.local.offset as u64;
        self.post(OP, wr.wr_id, wr.local.mr, true, |conn, id, now| {
            conn.post(
                now,
                WorkRequest {
                    id,
                    op: wr.op,
                    stream: wr.stream,
                    local_addr,
                    len,
                    remote: wr.remote,
                },
            )
        })
    }

    /// Posts a receive buffer for the next message on `stream`.
    pub fn post_recv(&self, wr_id: u64, stream: u16, local: Sge<'_>) -> Result<(), Error> {
        const OP: &str = "post_recv";
        self.check_local(OP, &local, true)?;
        let len = u32::try_from(local.len).map_err(|_| {
            Error::new(
                OP,
                ErrorKind::Post(transport_core::conn::PostError::BadLength),
            )
        })?;
        let addr = local.mr.addr() + local.offset as u64;
        self.post(OP, wr_id, local.mr, false, |conn, id, _| {
            conn.post_recv(RecvRequest {
                id,
                stream,
                addr,
                len,
            })
        })
    }

    /// Hands a request to the connection under a fresh internal id and remembers the caller's
    /// id and the region to keep alive until it completes.
    fn post(
        &self,
        op: &'static str,
        user_id: u64,
        mr: &MemoryRegion,
        doorbell: bool,
        f: impl FnOnce(&mut engine::Conn, u64, u64) -> Result<(), transport_core::conn::PostError>,
    ) -> Result<(), Error> {
        let keep: engine::Keepalive = mr.inner.clone();
        let qpn = self.inner.qpn;
        self.inner.pd.ctx.with(|e| {
            let now = e.stamp();
            let qp = e
                .qps
                .get_mut(&qpn)
                .ok_or(Error::new(op, ErrorKind::NoSuchQp(qpn)))?;
            let conn = qp
                .conn
                .as_mut()
                .ok_or(Error::new(op, ErrorKind::NotConnected))?;
            let id = qp.pending.next_id();
            f(conn, id, now).map_err(|p| Error::new(op, ErrorKind::Post(p)))?;
            qp.pending.insert(Pending { user_id, keep });
            e.deadline_stale = true;
            if doorbell {
                e.kick(qpn, now);
            }
            Ok(())
        })
    }

    /// Whether everything posted has been acknowledged and nothing is left to send.
    pub fn is_idle(&self) -> bool {
        let qpn = self.inner.qpn;
        self.inner.pd.ctx.with(|e| {
            e.qps
                .get(&qpn)
                .and_then(|q| q.conn.as_ref())
                .is_none_or(|c| c.is_idle())
        })
    }

    /// The connection's counters (zero before it connects).
    pub fn counters(&self) -> transport_core::conn::Counters {
        let qpn = self.inner.qpn;
        self.inner.pd.ctx.with(|e| {
            e.qps
                .get(&qpn)
                .and_then(|q| q.conn.as_ref())
                .map(|c| *c.counters())
                .unwrap_or_default()
        })
    }
}

#[cfg(test)]
mod tests;
