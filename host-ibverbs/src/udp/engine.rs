//! The progress engine: one receive socket, one send socket per UDP source port, the
//! connections of a device, and the loop that moves datagrams between them and memory.
//!
//! Everything runs on the thread that owns the device, inside calls to the API (polling a
//! completion queue, or `Context::progress`). Memory regions are the only memory the engine
//! writes, and it checks every write against the live regions of the device before doing it,
//! independently of the core's own checks.

use super::socket::{
    RecvBatch, RecvMeta, SocketOptions, UdpSocket, GSO_MAX_BYTES, GSO_MAX_SEGMENTS,
};
use super::stats::{EngineCounters, QpSnapshot};
use super::WorkCompletion;
use metaroce_frames::capture::PcapWriter;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::BufWriter;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;
use transport_core::conn::{Applied, Connection, Event, Memory, Region};
use transport_core::wire::{Ecn, EtherType, EthernetRepr, Ipv4Repr, Ipv6Repr, MacAddr, UdpRepr};

/// Paths per connection at most.
pub const MAX_PATHS: usize = 64;
/// Packets in flight per connection at most.
pub const MAX_INFLIGHT: usize = 2048;
/// Ordered streams per connection.
pub const STREAMS: usize = 8;
/// Messages in flight, and receive buffers, per stream.
pub const QUEUE: usize = 128;
/// Memory regions a connection can reach.
pub const REGIONS: usize = 32;

pub(crate) type Conn = Connection<MAX_PATHS, MAX_INFLIGHT, STREAMS, QUEUE, REGIONS>;

/// A multiplicative hasher for the engine's small tables, whose keys are its own numbers (QPNs,
/// ports, request ids): SipHash's flooding resistance buys nothing there and cost 6% of a ping.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A hash map with [`FastHasher`].
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// Receive buffers per batch. Each may hold a GRO batch of up to 64 KiB: 8 of them (512 KiB)
/// still sit in the cache when the engine reads them after the call; 32 (2 MiB) did not, and
/// every datagram's first read missed (across a veth, 4 queue pairs: 14 Gb/s at 32, 20 at 8).
const RX_BATCH: usize = 8;
/// Receive batches per progress call before the engine transmits again.
const RX_ROUNDS: usize = 4;

/// A live memory region, as the engine knows it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemEntry {
    pub len: u64,
    pub key: u32,
    pub pd: u32,
    pub access: transport_core::conn::Access,
}

/// The live memory regions of a device by base address, with the last one a check found (most
/// packets of a flow fall in the same region). Every change of the set forgets it.
pub(crate) struct Mems {
    map: BTreeMap<u64, MemEntry>,
    /// (base, end) of the region the last successful check found; empty when (MAX, 0).
    hint: std::cell::Cell<(u64, u64)>,
}

impl Mems {
    const NO_HINT: (u64, u64) = (u64::MAX, 0);

    pub fn new() -> Mems {
        Mems {
            map: BTreeMap::new(),
            hint: std::cell::Cell::new(Self::NO_HINT),
        }
    }

    pub fn insert(&mut self, base: u64, e: MemEntry) {
        self.hint.set(Self::NO_HINT);
        self.map.insert(base, e);
    }

    pub fn remove(&mut self, base: u64) {
        self.hint.set(Self::NO_HINT);
        self.map.remove(&base);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&u64, &MemEntry)> {
        self.map.iter()
    }

    /// Whether `addr..addr+len` lies inside one live region.
    pub fn contains(&self, addr: u64, len: usize) -> bool {
        let Some(end) = addr.checked_add(len as u64) else {
            return false;
        };
        let (b, e) = self.hint.get();
        if addr >= b && end <= e {
            return true;
        }
        match self.map.range(..=addr).next_back() {
            Some((start, m)) if end <= start + m.len => {
                self.hint.set((*start, start + m.len));
                true
            }
            _ => false,
        }
    }
}

/// The engine's side of the core's runner contract: a connection reads payloads from and places
/// deliveries into live regions only, each access checked against the region table first.
impl Memory for Mems {
    #[inline]
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        if len == 0 {
            return Some(&[]);
        }
        if !self.contains(addr, len) {
            return None;
        }
        // SAFETY: `addr..addr+len` lies inside a live region (checked just above), readable for
        // `len` bytes; a region's memory stays allocated while its entry is in the table, which
        // the shared borrow of `self` keeps unchanged for the slice's life; no mutable Rust
        // reference to region memory exists (the region API copies in and out).
        Some(unsafe { std::slice::from_raw_parts(addr as *const u8, len) })
    }

    #[inline]
    fn write(&mut self, addr: u64, bytes: &[u8]) -> bool {
        if bytes.is_empty() {
            return true;
        }
        if !self.contains(addr, bytes.len()) {
            return false;
        }
        // SAFETY: the destination lies inside a live region (checked just above); a region's
        // memory stays allocated while its entry is in the table; no Rust reference to region
        // memory exists outside the engine's own copies, and `bytes` is a received datagram in
        // the engine's buffers, which cannot overlap region memory.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len());
        }
        true
    }
}

/// Something that keeps a posted buffer's memory alive until its completion.
pub(crate) type Keepalive = Rc<dyn std::any::Any>;

pub(crate) struct Pending {
    pub user_id: u64,
    pub keep: Keepalive,
}

/// The requests of a queue pair waiting for their completions, by the internal id the connection
/// knows them by: a slot index (low 32 bits) and the slot's generation (high 32), so that posting
/// and completing are an index each instead of a hash map insert and remove. Slots are reused;
/// there are never more than requests in flight at once.
#[derive(Default)]
pub(crate) struct Requests {
    slots: Vec<(u32, Option<Pending>)>,
    /// The empty slots.
    free: Vec<u32>,
}

impl Requests {
    /// The id the next `insert` gives.
    pub fn next_id(&self) -> u64 {
        match self.free.last() {
            Some(&i) => u64::from(self.slots[i as usize].0) << 32 | u64::from(i),
            None => self.slots.len() as u64,
        }
    }

    /// Remembers `p` under `next_id()`.
    pub fn insert(&mut self, p: Pending) {
        match self.free.pop() {
            Some(i) => self.slots[i as usize].1 = Some(p),
            None => self.slots.push((0, Some(p))),
        }
    }

    /// The request of `id`, if it is waiting.
    pub fn remove(&mut self, id: u64) -> Option<Pending> {
        let i = (id & 0xffff_ffff) as u32;
        let slot = self.slots.get_mut(i as usize)?;
        if u64::from(slot.0) != id >> 32 {
            return None;
        }
        let p = slot.1.take()?;
        slot.0 = slot.0.wrapping_add(1);
        self.free.push(i);
        Some(p)
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Every waiting request's keepalive (the queue pair is going).
    pub fn into_keepalives(self) -> impl Iterator<Item = Keepalive> {
        self.slots
            .into_iter()
            .filter_map(|(_, p)| p.map(|p| p.keep))
    }
}

/// Completions waiting to be polled.
#[derive(Default)]
pub(crate) struct CqShared {
    pub queue: RefCell<VecDeque<WorkCompletion>>,
}

pub(crate) struct QpState {
    pub pd: u32,
    pub cq: Rc<CqShared>,
    pub conn: Option<Box<Conn>>,
    pub peer: Option<SocketAddr>,
    pub pending: Requests,
}

/// Datagrams waiting to leave from one source port to one destination: one buffer, cut into
/// messages of one `sendmmsg` call, each a single datagram or a GSO run of equal segments (the
/// last may be shorter).
struct Stage {
    key: (u16, SocketAddr),
    buf: Vec<u8>,
    msgs: Vec<Run>,
    /// It holds a datagram with payload (sent before those with headers only).
    data: bool,
    /// Listed in `Engine::queued`.
    queued: bool,
}

use super::socket::SendRun as Run;

/// Where the last datagram staged went: its path's port, its destination, the port it really
/// leaves from and its stage.
#[derive(Debug, Clone, Copy)]
struct LastPath {
    path_port: u16,
    dst: SocketAddr,
    wire_port: u16,
    stage: usize,
}

/// Messages per `sendmmsg` call.
const TX_BATCH: usize = 64;
/// A round that starts this much later than the engine asked to run means this host did not
/// give it the CPU (half the host transport's shortest retransmission timeout).
const STALL_NS: u64 = 500_000;

/// A path's send socket and the UDP source port its datagrams really carry.
struct TxSocket {
    /// None: nothing could be bound; the receive socket sends for the path.
    sock: Option<UdpSocket>,
    port: u16,
}

/// The send socket of path port `src_port` (bound and connected to `dst` on first use) and the
/// source port it really sends from. When another process holds the path's port, a free port
/// carries the path instead (counted): the ICRC covers the UDP source port, so the runner seals
/// every datagram over the port on the wire.
fn tx_socket<'a>(
    tx: &'a mut HashMap<u16, TxSocket>,
    counters: &mut EngineCounters,
    rx: &UdpSocket,
    opts: &SocketOptions,
    local_ip: IpAddr,
    src_port: u16,
    dst: SocketAddr,
) -> &'a TxSocket {
    tx.entry(src_port).or_insert_with(|| {
        let opts = SocketOptions {
            gro: false,
            ..*opts
        };
        let bind = |port| {
            UdpSocket::bind(SocketAddr::new(local_ip, port), &opts)
                .ok()
                .map(|mut s| {
                    // A send-only socket: connecting it caches the route to its first peer.
                    let _ = s.connect(dst);
                    s
                })
        };
        let mut sock = bind(src_port);
        if sock.is_none() {
            counters.tx_port_fallback += 1;
            sock = bind(0);
        }
        let port = sock.as_ref().unwrap_or(rx).local_addr().port();
        TxSocket { sock, port }
    })
}

/// Nanoseconds since `epoch` (a `monotonic_ns` reading).
fn since(epoch: u64) -> u64 {
    super::socket::monotonic_ns().saturating_sub(epoch)
}

/// The stage of (path port, destination) `key`, made on first use.
fn stage_of(
    stages: &mut Vec<Stage>,
    index: &mut HashMap<(u16, SocketAddr), usize>,
    key: (u16, SocketAddr),
) -> usize {
    *index.entry(key).or_insert_with(|| {
        stages.push(Stage {
            key,
            buf: Vec::with_capacity(GSO_MAX_BYTES),
            msgs: Vec::with_capacity(TX_BATCH),
            data: false,
            queued: false,
        });
        stages.len() - 1
    })
}

/// The engine of one device.
pub(crate) struct Engine {
    /// `monotonic_ns` when the device opened.
    epoch: u64,
    /// The latest time handed to any connection: a datagram's kernel arrival time is used when it
    /// is later than this (it waited in the socket for this host's CPU), never earlier, so that
    /// the connections' clock never goes back.
    clock_floor: u64,
    pub rx: UdpSocket,
    pub local_ip: IpAddr,
    opts: SocketOptions,
    tx: HashMap<u16, TxSocket>,
    pub qps: HashMap<u32, QpState>,
    pub mems: Mems,
    pub counters: EngineCounters,
    pcap: Option<PcapWriter<BufWriter<File>>>,
    /// Taken out while its datagrams are dispatched (`dispatch` needs the engine).
    rx_batch: Option<Box<RecvBatch>>,
    scratch: Vec<u8>,
    stages: Vec<Stage>,
    /// Where each (source port, destination) stages, in `stages`.
    stage_of: HashMap<(u16, SocketAddr), usize>,
    /// The last path port and destination a datagram was staged for, the port it left from and
    /// its stage: a ping-pong (one path while idle) finds both without a lookup. Send sockets
    /// and stages are never removed, so it does not go stale.
    last_path: Option<LastPath>,
    /// Stages holding datagrams, to be flushed.
    queued: Vec<usize>,
    /// Datagrams the next receive call asks for (1 to `RX_BATCH`).
    rx_want: usize,
    /// The last receive call filled up.
    rx_full: bool,
    /// Reused by `transmit` (no allocation per round).
    qpn_list: Vec<u32>,
    /// Progress rounds so far.
    rounds: u64,
    /// When the engine may next be expected to run: the start of the last round, or the end of
    /// the sleep it chose. A round that starts much later than this was not given the CPU.
    expected_at: u64,

    /// Something arrived or was posted since the last send: the next round sends and completes.
    dirty: bool,
    /// The earliest timer of any connection (`u64::MAX`: none), valid unless `deadline_stale`.
    deadline: u64,
    /// A connection changed since `deadline` was computed.
    pub deadline_stale: bool,
    pub gso: bool,
    /// Several datagrams per system call; off, one.
    batch: bool,
    pub busy_poll: bool,
    /// Keepalives released inside the engine, dropped by the caller after the engine is
    /// released (their drop may deregister memory, which needs the engine).
    pub release: Vec<Keepalive>,
}

impl Engine {
    pub fn new(
        rx: UdpSocket,
        opts: SocketOptions,
        gso: bool,
        batch: bool,
        busy_poll: bool,
        pcap: Option<PcapWriter<BufWriter<File>>>,
    ) -> Engine {
        let local_ip = rx.local_addr().ip();
        Engine {
            epoch: super::socket::monotonic_ns(),
            clock_floor: 0,
            rx,
            local_ip,
            opts,
            tx: HashMap::default(),
            qps: HashMap::default(),
            mems: Mems::new(),
            counters: EngineCounters::default(),
            pcap,
            rx_batch: Some(Box::new(RecvBatch::new(RX_BATCH, 65536))),
            scratch: vec![0u8; 65536],
            stages: Vec::new(),
            stage_of: HashMap::default(),
            last_path: None,
            queued: Vec::new(),
            qpn_list: Vec::new(),
            rounds: 0,
            expected_at: 0,
            rx_want: 1,
            rx_full: false,
            dirty: true,
            deadline: u64::MAX,
            deadline_stale: true,
            gso,
            batch,
            busy_poll,
            release: Vec::new(),
        }
    }

    /// Nanoseconds since the device opened.
    pub fn now(&self) -> u64 {
        since(self.epoch)
    }

    /// `now()`, for a call into a connection: later arrivals are never dated before it.
    pub fn stamp(&mut self) -> u64 {
        let t = self.now();
        self.clock_floor = self.clock_floor.max(t);
        t
    }

    /// The regions of protection domain `pd`, as the core registers them.
    pub fn regions_of(&self, pd: u32) -> Vec<Region> {
        self.mems
            .iter()
            .filter(|(_, e)| e.pd == pd)
            .map(|(base, e)| Region {
                key: e.key,
                base: *base,
                len: e.len,
                access: e.access,
            })
            .collect()
    }

    /// One round: timers, arrivals, transmissions, completions. Waits up to `wait` for
    /// something to arrive when there is nothing to do. Returns whether anything happened.
    pub fn progress(&mut self, wait: Duration) -> bool {
        // Send what is waiting first (posts already rang their doorbell), then read, then hand
        // completions over; acknowledgements the arrivals call for go out next round. A round
        // in which nothing arrived and no timer fired has nothing to send or complete, so an
        // idle spin is one timer check and one receive call (with a full round now and then).
        let now = self.now();
        self.rounds = self.rounds.wrapping_add(1);
        if now.saturating_sub(self.expected_at) > STALL_NS && self.expected_at != 0 {
            self.host_stalled(now);
        }
        self.expected_at = now;
        self.clock_floor = self.clock_floor.max(now);
        if self.deadline_stale {
            self.refresh_deadline();
        }
        let fired = now >= self.deadline && self.run_timers(now);
        let full = fired || self.dirty || self.rounds % 256 == 0;
        let mut busy = fired;
        if full {
            self.dirty = false;
            busy |= self.transmit(now);
        }
        // Datagrams asked for per call: one while they come one at a time (a ping-pong: no
        // second attempt on an empty queue inside the call, and an answer is handed over before
        // what arrived after it is read), doubling while calls in a row fill up, to a full
        // batch. A call that fills up after empty ones (the next ping) does not double.
        let mut got_any = false;
        for _ in 0..RX_ROUNDS {
            let want = self.rx_want;
            let got = self.receive(now, want);
            got_any |= got > 0;
            if got == want {
                if self.rx_full {
                    self.rx_want = (want * 2).min(RX_BATCH);
                }
                self.rx_full = true;
            } else {
                self.rx_full = false;
                if got > 0 {
                    self.rx_want = got / 2 + 1;
                }
            }
            if got < RX_BATCH {
                break;
            }
        }
        if got_any {
            // Arrivals may call for acknowledgements and open windows: send next round.
            self.dirty = true;
            busy = true;
        }
        if full || got_any {
            busy |= self.drain_events() > 0;
            self.deadline_stale = true;
        }
        if !busy && !wait.is_zero() && !self.busy_poll {
            if self.deadline_stale {
                self.refresh_deadline();
            }
            let timeout = (wait.as_nanos() as u64).min(self.deadline.saturating_sub(now));
            // Waking later than asked (or than a datagram came) is the host's delay, not ours.
            self.expected_at = now + timeout;
            if timeout > 0 && self.rx.wait_readable_ns(timeout).unwrap_or(false) {
                // What arrived while this end slept is dated by the kernel: the time to wake up
                // counts in no RTT and no ACK delay.
                let now = self.now();
                if self.receive(now, RX_BATCH) > 0 {
                    busy = true;
                }
                self.clock_floor = self.clock_floor.max(now);
                busy |= self.transmit(now);
                self.drain_events();
                self.deadline_stale = true;
            }
        }
        busy
    }

    /// The engine did not run for a while although it had asked to: what the connections'
    /// timers wait for may be sitting in this host's socket buffers, so everything that arrived
    /// is read first, and then the timers restart from now (a timeout must not count the time a
    /// packet waited for this host's own CPU).
    fn host_stalled(&mut self, now: u64) {
        self.counters.host_stalls += 1;
        for _ in 0..16 {
            if self.receive(now, RX_BATCH) < RX_BATCH {
                break;
            }
        }
        for qp in self.qps.values_mut() {
            if let Some(conn) = qp.conn.as_mut() {
                conn.handle_host_stall(now);
            }
        }
        self.dirty = true;
        self.deadline_stale = true;
    }

    fn refresh_deadline(&mut self) {
        self.deadline = self
            .qps
            .values()
            .filter_map(|qp| qp.conn.as_ref()?.poll_timeout())
            .min()
            .unwrap_or(u64::MAX);
        self.deadline_stale = false;
    }

    fn run_timers(&mut self, now: u64) -> bool {
        let mut fired = false;
        for qp in self.qps.values_mut() {
            if let Some(conn) = qp.conn.as_mut() {
                if conn.poll_timeout().is_some_and(|t| t <= now) {
                    conn.handle_timeout(now);
                    fired = true;
                }
            }
        }
        fired
    }

    /// Reads what waits on the receive socket and hands it to the connections.
    /// Without batched calls, up to `want` calls of one datagram each, until one finds none.
    fn receive(&mut self, now: u64, want: usize) -> usize {
        if self.batch {
            return self.receive_call(now, want);
        }
        let mut got = 0;
        while got < want {
            let n = self.receive_call(now, 1);
            if n == 0 {
                break;
            }
            got += n;
        }
        got
    }

    /// One receive call for up to `want` datagrams.
    fn receive_call(&mut self, now: u64, want: usize) -> usize {
        let Some(mut batch) = self.rx_batch.take() else {
            return 0;
        };
        let n = match self.rx.recv_batch(&mut batch, want) {
            Ok(n) => n,
            Err(_) => {
                self.counters.rx_errors += 1;
                0
            }
        };
        if n > 0 {
            self.counters.rx_syscalls += 1;
        }
        // Each datagram is dated by the kernel's arrival time where that is later than what the
        // connections were last told (it waited in the socket while this end slept or was
        // descheduled: neither an RTT sample nor an ACK delay may count that), else by now,
        // after the call: an ACK read with the round's start time would shorten its RTT sample
        // by the round's transmissions (and a data packet's time would lengthen the ACK delay
        // its receiver reports, shortening the sender's sample again).
        let (now, real) = if n > 0 {
            (self.now(), super::socket::realtime_ns())
        } else {
            (now, 0)
        };
        for i in 0..n {
            let (data, meta) = batch.get(i);
            let at = if meta.arrived_realtime > 0 {
                let waited = real.saturating_sub(meta.arrived_realtime);
                now.saturating_sub(waited)
                    .clamp(self.clock_floor.min(now), now)
            } else {
                now
            };
            self.clock_floor = self.clock_floor.max(at);
            let now = at;
            let seg = if meta.segment > 0 {
                meta.segment
            } else {
                data.len().max(1)
            };
            if data.len() > seg {
                self.counters.rx_gro_batches += 1;
            }
            let mut chunks = data.chunks(seg).peekable();
            while let Some(d) = chunks.next() {
                // The kernel wrote these bytes; their first read misses the cache. Ask for the
                // next datagram's headers while this one is handled.
                match chunks.peek() {
                    Some(next) => prefetch(next),
                    None if i + 1 < n => prefetch(batch.get(i + 1).0),
                    None => {}
                }
                self.dispatch(now, meta, d);
            }
        }
        self.rx_batch = Some(batch);
        n
    }

    /// One datagram: demultiplex by destination QP, check the sender, hand it to the core and
    /// do what it answers.
    fn dispatch(&mut self, now: u64, meta: RecvMeta, d: &[u8]) {
        let c = &mut self.counters;
        c.rx_packets += 1;
        c.rx_bytes += d.len() as u64;
        let ce = meta.ecn == Ecn::Ce.bits();
        if ce {
            c.rx_ecn_ce += 1;
        }
        let Some(src) = meta.src else {
            c.rx_drop_runt += 1;
            return;
        };
        if let Some(p) = self.pcap.as_mut() {
            let t = since(self.epoch);
            write_pcap(
                p,
                t,
                src,
                SocketAddr::new(self.local_ip, self.rx.local_addr().port()),
                meta.ecn,
                d,
            );
        }
        if d.len() < 12 {
            self.counters.rx_drop_runt += 1;
            return;
        }
        let qpn = u32::from_be_bytes([0, d[5], d[6], d[7]]);
        let Some(qp) = self.qps.get_mut(&qpn) else {
            self.counters.rx_drop_unknown_qp += 1;
            return;
        };
        let (Some(conn), Some(peer)) = (qp.conn.as_mut(), qp.peer) else {
            self.counters.rx_drop_not_connected += 1;
            return;
        };
        if src.ip() != peer.ip() {
            self.counters.rx_drop_wrong_peer += 1;
            return;
        }
        if let Ok(delivery) = conn.handle_datagram(now, src.port(), ce, d) {
            if conn.apply(&mut self.mems, d, delivery) == Applied::OutOfMemory {
                self.counters.rx_drop_bad_place += 1;
            }
        }
    }

    /// Asks every connection for what it has to send, fills in payloads from memory, and sends
    /// it, one GSO call per path where consecutive datagrams allow.
    fn transmit(&mut self, now: u64) -> bool {
        let mut qpns = std::mem::take(&mut self.qpn_list);
        qpns.clear();
        qpns.extend(self.qps.keys().copied());
        let mut sent = false;
        for &qpn in &qpns {
            sent |= self.transmit_qp(qpn, now, false);
        }
        self.qpn_list = qpns;
        self.flush();
        sent
    }

    /// Sends at once what a queue pair can send, right after a post (a doorbell): an answer to
    /// a ping leaves without waiting for the next round of the loop. When the window is full (a
    /// bulk transfer) the connection has nothing to give and this costs one check.
    pub fn kick(&mut self, qpn: u32, now: u64) {
        self.dirty = true;
        // Data first, sent at once; then what else waits (the ACKs of what arrived).
        if self.transmit_qp(qpn, now, true) {
            self.flush();
        }
        if self.transmit_qp(qpn, now, false) {
            self.flush();
        }
    }

    /// Stages everything one queue pair has to send (only data packets with `data_only`).
    fn transmit_qp(&mut self, qpn: u32, now: u64, data_only: bool) -> bool {
        let mut sent = false;
        let mut scratch = std::mem::take(&mut self.scratch);
        while let Some(qp) = self.qps.get_mut(&qpn) {
            let (Some(conn), Some(peer)) = (qp.conn.as_mut(), qp.peer) else {
                break;
            };
            let next = if data_only {
                conn.poll_transmit_data(now, &mut scratch)
            } else {
                conn.poll_transmit(now, &mut scratch)
            };
            let Some(tx) = next else {
                break;
            };
            let path_port = tx.src_port;
            let (wire_port, stage) = match self.last_path {
                Some(l) if l.path_port == path_port && l.dst == peer => (l.wire_port, l.stage),
                _ => {
                    let w = tx_socket(
                        &mut self.tx,
                        &mut self.counters,
                        &self.rx,
                        &self.opts,
                        self.local_ip,
                        path_port,
                        peer,
                    )
                    .port;
                    let i = stage_of(&mut self.stages, &mut self.stage_of, (path_port, peer));
                    self.last_path = Some(LastPath {
                        path_port,
                        dst: peer,
                        wire_port: w,
                        stage: i,
                    });
                    (w, i)
                }
            };
            let tx = transport_core::conn::Transmit {
                src_port: wire_port,
                ..tx
            };
            // The datagram is built where it leaves from, the stage's buffer: headers from the
            // scratch buffer, the payload straight from the region (one copy, not two), then
            // pad and ICRC in place.
            let buf = &mut self.stages[stage].buf;
            let start = buf.len();
            buf.reserve(tx.len);
            buf.extend_from_slice(&scratch[..tx.header_len]);
            // (`Connection::fill_and_seal` wants the datagram's room laid out first, which here
            // would zero the payload's bytes before copying them: the copy appends instead.)
            match self.mems.read(tx.payload_addr, tx.payload_len) {
                Some(payload) => buf.extend_from_slice(payload),
                None => {
                    // Cannot happen for buffers checked at post time; send zeros, count it.
                    buf.resize(start + tx.header_len + tx.payload_len, 0);
                    self.counters.tx_bad_local += 1;
                }
            }
            buf.resize(start + tx.len, 0);
            conn.seal(&tx, &mut buf[start..]);
            sent = true;
            self.staged(stage, wire_port, peer, start, tx.payload_len > 0);
        }
        self.scratch = scratch;
        sent
    }

    /// Queues the datagram built at `start` of stage `idx`'s buffer (to its end; see `stage_of`),
    /// whose path leaves from `wire_port`.
    fn staged(&mut self, idx: usize, wire_port: u16, dst: SocketAddr, start: usize, data: bool) {
        let d = &self.stages[idx].buf[start..];
        let len = d.len();
        self.counters.tx_packets += 1;
        self.counters.tx_bytes += len as u64;
        if let Some(p) = self.pcap.as_mut() {
            let t = since(self.epoch);
            write_pcap(
                p,
                t,
                SocketAddr::new(self.local_ip, wire_port),
                dst,
                super::socket::ECT0,
                d,
            );
        }
        let gso = self.gso;
        let s = &mut self.stages[idx];
        if s.msgs.is_empty() {
            s.data = false;
        }
        if !s.queued {
            s.queued = true;
            self.queued.push(idx);
        }
        s.data |= data;
        let extend = s.msgs.last().is_some_and(|r| {
            gso && len <= r.segment
                && r.len % r.segment == 0
                && r.len / r.segment < GSO_MAX_SEGMENTS
                && r.len + len <= GSO_MAX_BYTES
        });
        if extend {
            if let Some(r) = s.msgs.last_mut() {
                r.len += len;
            }
        } else {
            s.msgs.push(Run {
                start,
                len,
                segment: len,
            });
        }
        if s.msgs.len() >= TX_BATCH {
            self.flush_one(idx);
        }
    }

    fn flush(&mut self) {
        // Payload before acknowledgements: an answer to a ping should not wait behind an ACK.
        let queued = std::mem::take(&mut self.queued);
        for data_pass in [true, false] {
            for &i in &queued {
                if self.stages[i].data == data_pass {
                    self.flush_one(i);
                }
            }
        }
        for &i in &queued {
            self.stages[i].queued = false;
        }
        self.queued = queued;
        self.queued.clear();
    }

    fn flush_one(&mut self, idx: usize) {
        let batch = self.batch;
        let s = &mut self.stages[idx];
        if s.msgs.is_empty() {
            return;
        }
        let (src_port, dst) = s.key;
        let sock = self.tx[&src_port].sock.as_ref().unwrap_or(&self.rx);
        let mut runs: &[Run] = &s.msgs;
        while !runs.is_empty() {
            self.counters.tx_syscalls += 1;
            // One message per call without batching (a GSO run is still one message).
            let call = if batch { runs } else { &runs[..1] };
            match sock.send_many(&dst, &s.buf, call) {
                Ok(0) => break,
                Ok(n) => {
                    self.counters.tx_gso_batches +=
                        runs[..n].iter().filter(|r| r.len > r.segment).count() as u64;
                    runs = &runs[n..];
                }
                Err(e)
                    if runs[0].len > runs[0].segment
                        && matches!(
                            e.raw_os_error(),
                            Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT)
                        ) =>
                {
                    // The route cannot segment: datagrams one by one from now on.
                    self.gso = false;
                    self.counters.tx_gso_disabled += 1;
                    let r = runs[0];
                    runs = &runs[1..];
                    for d in s.buf[r.start..r.start + r.len].chunks(r.segment) {
                        self.counters.tx_syscalls += 1;
                        if sock.send(&dst, d, 0).is_err() {
                            self.counters.tx_errors += 1;
                        }
                    }
                }
                Err(_) => {
                    // Buffer full or unreachable: these are lost; the connection repairs them.
                    let r = runs[0];
                    runs = &runs[1..];
                    self.counters.tx_errors += r.len.div_ceil(r.segment.max(1)) as u64;
                }
            }
        }
        s.buf.clear();
        s.msgs.clear();
    }

    /// Moves the connections' events into their completion queues; returns how many
    /// completions it moved.
    fn drain_events(&mut self) -> usize {
        let mut moved = 0;
        for (qpn, qp) in self.qps.iter_mut() {
            let Some(conn) = qp.conn.as_mut() else {
                continue;
            };
            while let Some(ev) = conn.poll_event() {
                match ev {
                    Event::Completion(c) => {
                        let Some(p) = qp.pending.remove(c.id) else {
                            continue;
                        };
                        self.release.push(p.keep);
                        moved += 1;
                        qp.cq.queue.borrow_mut().push_back(WorkCompletion {
                            wr_id: p.user_id,
                            status: c.status,
                            kind: c.kind,
                            byte_len: c.byte_len,
                            imm: c.imm,
                            qp_num: *qpn,
                            stream: c.stream,
                        });
                    }
                    // Counted by the connection (`path_failures`, path state in the stats).
                    Event::PathFailed { .. } | Event::PathRestored { .. } => {}
                }
            }
        }
        moved
    }

    /// A snapshot of every queue pair's counters.
    pub fn snapshot(&self) -> Vec<QpSnapshot> {
        let mut v: Vec<QpSnapshot> = self
            .qps
            .iter()
            .filter_map(|(qpn, qp)| {
                let conn = qp.conn.as_ref()?;
                let paths = (0..usize::from(conn.config().paths))
                    .filter_map(|i| conn.path_stats(i))
                    .collect();
                Some(QpSnapshot {
                    qpn: *qpn,
                    peer: qp.peer,
                    counters: *conn.counters(),
                    paths,
                })
            })
            .collect();
        v.sort_by_key(|s| s.qpn);
        v
    }

    /// What the engine holds: (send sockets, staging buffers, queue pairs, requests in flight,
    /// regions). None of it grows with what arrives, only with what this end creates and posts.
    pub fn footprint(&self) -> [usize; 5] {
        [
            self.tx.len(),
            self.stages.len(),
            self.qps.len(),
            self.qps.values().map(|q| q.pending.len()).sum(),
            self.mems.len(),
        ]
    }

    /// Flushes the capture file.
    pub fn finish_pcap(&mut self) -> std::io::Result<()> {
        if let Some(p) = self.pcap.take() {
            p.finish()?;
        }
        Ok(())
    }
}

/// Writes `payload` to the capture as the Ethernet/IP/UDP frame that carried it.
fn write_pcap(
    p: &mut PcapWriter<BufWriter<File>>,
    t: u64,
    src: SocketAddr,
    dst: SocketAddr,
    ecn: u8,
    payload: &[u8],
) {
    let mut frame = vec![0u8; 14 + 40 + 8 + payload.len()];
    let v6 = src.is_ipv6();
    let eth = EthernetRepr {
        dst: MacAddr([0x02, 0, 0, 0, 0, 2]),
        src: MacAddr([0x02, 0, 0, 0, 0, 1]),
        vlan: None,
        ethertype: if v6 { EtherType::IPV6 } else { EtherType::IPV4 },
    };
    let udp_len = 8 + payload.len();
    let Ok(rest) = eth.emit(&mut frame) else {
        return;
    };
    let ecn = Ecn::from_bits(ecn);
    let rest = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Ipv4Repr {
            dscp: 0,
            ecn,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            src: s,
            dst: d,
            options: &[],
        }
        .emit(rest, udp_len),
        (IpAddr::V6(s), IpAddr::V6(d)) => Ipv6Repr {
            dscp: 0,
            ecn,
            flow_label: 0,
            hop_limit: 64,
            src: s,
            dst: d,
        }
        .emit(rest, udp_len),
        _ => return,
    };
    let Ok(rest) = rest else {
        return;
    };
    let rest_len = rest.len();
    let Ok(rest) = (UdpRepr {
        src_port: src.port(),
        dst_port: dst.port(),
        checksum: false,
    })
    .emit(rest, payload.len()) else {
        return;
    };
    rest[..payload.len()].copy_from_slice(payload);
    let used = frame.len() - rest_len + udp_len;
    let _ = p.write(t, &frame[..used]);
}

#[cfg(test)]
mod mems_tests {
    use super::*;

    fn entry(len: u64) -> MemEntry {
        MemEntry {
            len,
            key: 1,
            pd: 0,
            access: transport_core::conn::Access::LOCAL_WRITE,
        }
    }

    #[test]
    fn a_removed_region_is_not_remembered() {
        let mut m = Mems::new();
        assert!(!m.contains(0, 0) && !m.contains(4096, 1));
        m.insert(4096, entry(100));
        m.insert(8192, entry(50));
        assert!(m.contains(4096, 100) && m.contains(4150, 10)); // the second hits the hint
        assert!(!m.contains(4150, 51) && !m.contains(4095, 2) && !m.contains(u64::MAX, 2));
        assert!(m.contains(8192, 50) && !m.contains(8192, 51));
        m.remove(4096);
        assert!(!m.contains(4150, 10), "the hint went with the region");
        assert!(m.contains(8200, 8));
        m.remove(8192);
        assert!(!m.contains(8200, 8));
    }
}

#[cfg(test)]
mod requests_tests {
    use super::*;

    fn pending(user_id: u64) -> Pending {
        Pending {
            user_id,
            keep: Rc::new(user_id),
        }
    }

    #[test]
    fn requests_reuse_slots_and_refuse_stale_ids() {
        let mut r = Requests::default();
        let mut ids = Vec::new();
        for u in 0..4 {
            let id = r.next_id();
            r.insert(pending(u));
            ids.push(id);
        }
        assert_eq!(ids, [0, 1, 2, 3], "fresh slots, generation 0");
        assert_eq!(r.len(), 4);
        assert_eq!(r.remove(ids[1]).map(|p| p.user_id), Some(1));
        assert!(r.remove(ids[1]).is_none(), "completed once only");
        // The slot comes back under its next generation; the old id does not reach it.
        let again = r.next_id();
        assert_eq!(again, 1 << 32 | 1);
        r.insert(pending(9));
        assert!(r.remove(ids[1]).is_none(), "a stale id");
        assert!(
            r.remove(7).is_none() && r.remove(u64::MAX).is_none(),
            "never given"
        );
        assert_eq!(r.remove(again).map(|p| p.user_id), Some(9));
        assert_eq!(r.len(), 3);
        let kept: Vec<u64> = r
            .into_keepalives()
            .map(|k| *k.downcast::<u64>().unwrap())
            .collect();
        assert_eq!(kept, [0, 2, 3]);
    }
}

/// Asks the CPU to bring the first cache lines of `d` (a datagram's headers) closer.
#[inline(always)]
fn prefetch(d: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for at in [0usize, 64] {
            if at < d.len() {
                // SAFETY: a prefetch is a hint that never faults or changes memory; the address
                // lies inside `d` anyway. SSE is part of the x86-64 baseline.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(d.as_ptr().add(at).cast::<i8>()) };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = d;
}
