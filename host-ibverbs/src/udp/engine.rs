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
use transport_core::time::Instant;
use transport_core::wire::{Ecn, EtherType, EthernetRepr, Ipv4Repr, Ipv6Repr, MacAddr, UdpRepr};

mod mems;
mod pcap;
mod receive;
mod requests;
mod transmit;

pub(crate) use mems::{MemEntry, Mems};
use pcap::write_pcap;
pub(crate) use requests::{Keepalive, Pending, Requests};
use transmit::{Stage, StagedPath, TxSocket, PATH_CACHE};

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

/// Most receive buffers per batch. Each may hold a GRO batch of up to 64 KiB, which the engine
/// reads (ICRC, placement) after the call: the batch must still sit in the second-level cache
/// then. On an Intel Xeon VM (2 MiB L2) 8 of them (512 KiB) did; 32 (2 MiB) did not, and
/// every datagram's first read missed (across a veth, 4 queue pairs: 14 Gb/s at 32, 20 at 8). On
/// an AMD EPYC VM (512 KiB L2) 4 moved more than 8 and than 2 ([`rx_batch_for_l2`]).
const RX_BATCH_MAX: usize = 8;
/// Fewest receive buffers per batch.
const RX_BATCH_MIN: usize = 2;
/// Bytes of one receive buffer: a GRO batch of up to 64 KiB.
const RX_BUF: usize = 65536;

/// Receive buffers per batch for a CPU with `l2` bytes of second-level cache to itself: as many as
/// fill half of it, from [`RX_BATCH_MIN`] to [`RX_BATCH_MAX`] ([`RX_BATCH_MAX`] when the size is
/// not known). Across a veth at MTU 1500 on an AMD EPYC VM (512 KiB L2 per core), `write-bw -D 3`,
/// medians of interleaved rounds, idle and beside two busy loops: 8 buffers 16.80 and 7.46 Gb/s
/// against 4 buffers' 17.37 and 8.46 (six rounds; ten more: 16.48 and 7.19 against 17.11 and
/// 8.18); in another series 2 buffers 16.30 and 7.93 against 4 buffers' 17.17 and 8.41
/// (docs/BENCHMARKS.md).
pub(crate) fn rx_batch_for_l2(l2: Option<usize>) -> usize {
    l2.map_or(RX_BATCH_MAX, |b| {
        (b / 2 / RX_BUF).clamp(RX_BATCH_MIN, RX_BATCH_MAX)
    })
}

/// The size of a cache in sysfs's notation (`512K`, `2048K`, `32M`), in bytes.
pub(crate) fn parse_cache_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let n: usize = digits.parse().ok()?;
    let mult = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// The second-level cache of the first CPU, divided among the CPUs that share it, if the system
/// says. (The engine's thread may run on any CPU; where they differ, as on hybrid parts, the
/// first one's stands for all.)
fn l2_bytes() -> Option<usize> {
    l2_bytes_in(std::path::Path::new("/sys/devices/system/cpu/cpu0/cache"))
}

/// The second-level cache (the unified or data cache of level 2) among the `index*` entries of
/// `dir`, as Linux lists a CPU's caches in sysfs: its size divided by the CPUs in its
/// `shared_cpu_list` (a cluster's shared L2 counts for each of its cores by its share).
pub(crate) fn l2_bytes_in(dir: &std::path::Path) -> Option<usize> {
    (0..8).find_map(|i| {
        let dir = dir.join(format!("index{i}"));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        let level = read("level")?;
        let kind = read("type")?;
        if level.trim() != "2" || kind.trim() == "Instruction" {
            return None;
        }
        let size = parse_cache_size(&read("size")?)?;
        let sharers = read("shared_cpu_list")
            .and_then(|l| count_cpu_list(&l))
            .unwrap_or(1);
        Some(size / sharers.max(1))
    })
}

/// How many CPUs a list in the kernel's notation names (`0`, `0-3`, `0,2,4-5`).
pub(crate) fn count_cpu_list(text: &str) -> Option<usize> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    t.split(',').try_fold(0usize, |n, part| {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        n.checked_add(hi.checked_sub(lo)?.checked_add(1)?)
    })
}
/// Receive batches per progress call before the engine transmits again.
const RX_ROUNDS: usize = 4;

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
    /// When data for this queue pair last arrived (its sender counts in the fair share).
    pub data_at: Option<Instant>,
    /// Data bytes that arrived since the fair shares were last computed (its sender's demand).
    pub data_bytes: u64,
}

/// How often the receiver's fair shares are computed again. ns.
const SHARE_PERIOD_NS: u64 = 50_000;
/// A sender not heard from for this long gives its share back: a few host round trips, and
/// longer than a paced sender's gaps when its host is busy (at 500 us, a test run beside other
/// tests lost senders between their packets and gave the rest more than the line). ns.
pub(crate) const SHARE_IDLE_NS: u64 = 2_000_000;

/// A round that starts this much later than the engine asked to run means this host did not
/// give it the CPU (half the host transport's shortest retransmission timeout).
const STALL_NS: u64 = 500_000;

/// Nanoseconds since `epoch` (a `monotonic_ns` reading).
fn since(epoch: u64) -> u64 {
    super::socket::monotonic_ns().saturating_sub(epoch)
}

/// The engine of one device.
pub(crate) struct Engine {
    /// `monotonic_ns` when the device opened.
    epoch: u64,
    /// The latest time handed to any connection: a datagram's kernel arrival time is used when it
    /// is later than this (it waited in the socket for this host's CPU), never earlier, so that
    /// the connections' clock never goes back.
    clock_floor: Instant,
    pub rx: UdpSocket,
    pub local_ip: IpAddr,
    opts: SocketOptions,
    tx: HashMap<u16, TxSocket>,
    /// Send sockets or stages beyond which `drop_unused_paths` runs.
    tx_limit: usize,
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
    /// The path ports and destinations datagrams were staged for lately, the port each left
    /// from and its stage, by path port (direct-mapped, [`PATH_CACHE`] entries): a connection
    /// sprays consecutive packets over its paths, and each finds its socket and stage without
    /// two hash lookups. Cleared whenever unused sockets and stages are dropped
    /// (`drop_unused_paths`), so entries never name a stage that moved.
    path_cache: [Option<StagedPath>; PATH_CACHE],
    /// Stages holding datagrams, to be flushed.
    queued: Vec<usize>,
    /// Receive buffers in `rx_batch`: the most datagrams (or GRO batches) one call reads.
    rx_batch_len: usize,
    /// Datagrams the next receive call asks for (1 to `rx_batch_len`).
    rx_want: usize,
    /// The last receive call filled up.
    rx_full: bool,
    /// Reused by `transmit` (no allocation per round).
    qpn_list: Vec<u32>,
    /// When the engine may next be expected to run: the start of the last round, or the end of
    /// the sleep it chose. A round that starts much later than this was not given the CPU.
    expected_at: Instant,

    /// Something arrived or was posted since the last send: the next round sends and completes.
    dirty: bool,
    /// The earliest timer of any connection (`Instant::MAX`: none), valid unless `deadline_stale`.
    deadline: Instant,
    /// A connection changed since `deadline` was computed.
    pub deadline_stale: bool,
    pub gso: bool,
    /// Payloads of [`transmit::IN_PLACE_MIN`] bytes or more leave from their regions (off: every
    /// payload is copied next to its headers; always off with a capture).
    in_place: bool,
    /// Several datagrams per system call; off, one.
    batch: bool,
    pub busy_poll: bool,
    /// Keepalives released inside the engine, dropped by the caller after the engine is
    /// released (their drop may deregister memory, which needs the engine).
    pub release: Vec<Keepalive>,
    /// The receiver's fair share of its line rate among the connections sending to it, when a
    /// line rate is configured.
    pub fair: Option<transport_core::rate::FairShare<QUEUE>>,
    /// The other engines on this line ([`crate::udp::share_table`]).
    pub share_table: Option<crate::udp::share_table::ShareTable>,
    /// When the fair shares are next computed.
    share_at: Instant,
    /// The last round handed over what waited during a stall and sent no ACKs: the next one is
    /// a full round, stalled or not.
    handed_over: bool,
    /// The kernel refused UDP GRO when `enable_gro` asked: not asked again.
    gro_refused: bool,
    /// The AF_XDP datapath, when the device has one (`DeviceConfig::xdp`): datagrams leave and
    /// arrive through it, and through the UDP socket only where it cannot take them.
    pub xdp: Option<Box<super::xdp::Xdp>>,
}

impl Engine {
    pub fn new(
        rx: UdpSocket,
        opts: SocketOptions,
        gso: bool,
        in_place: bool,
        batch: bool,
        busy_poll: bool,
        pcap: Option<PcapWriter<BufWriter<File>>>,
    ) -> Engine {
        let local_ip = rx.local_addr().ip();
        let in_place = in_place && pcap.is_none();
        let rx_batch_len = rx_batch_for_l2(l2_bytes());
        Engine {
            epoch: super::socket::monotonic_ns(),
            clock_floor: Instant::ZERO,
            rx,
            local_ip,
            opts,
            tx: HashMap::default(),
            tx_limit: transmit::MIN_TX_LIMIT,
            qps: HashMap::default(),
            mems: Mems::new(),
            counters: EngineCounters::default(),
            pcap,
            rx_batch: Some(Box::new(RecvBatch::new(rx_batch_len, RX_BUF))),
            rx_batch_len,
            scratch: vec![0u8; 65536],
            stages: Vec::new(),
            stage_of: HashMap::default(),
            path_cache: [None; PATH_CACHE],
            queued: Vec::new(),
            qpn_list: Vec::new(),
            expected_at: Instant::ZERO,
            rx_want: 1,
            rx_full: false,
            dirty: true,
            deadline: Instant::MAX,
            deadline_stale: true,
            gso,
            in_place,
            batch,
            busy_poll,
            release: Vec::new(),
            fair: None,
            share_table: None,
            share_at: Instant::ZERO,
            gro_refused: false,
            handed_over: false,
            xdp: None,
        }
    }

    /// UDP GRO on the receive socket from now on, and for good: what it coalesced may still
    /// wait in the socket, and read without GRO such a datagram would lose its segment size.
    /// A kernel that refuses it is asked once.
    pub fn enable_gro(&mut self) {
        if !self.rx.gro() && !self.gro_refused {
            self.gro_refused = self.rx.set_gro(true).is_err();
        }
    }

    /// Whether the receive socket has UDP GRO on.
    pub fn gro(&self) -> bool {
        self.rx.gro()
    }

    /// The device-wide counters, the AF_XDP datapath's included.
    pub fn device_counters(&self) -> EngineCounters {
        let mut c = self.counters;
        if let Some(x) = &self.xdp {
            c.xdp_rx_frames = x.counters.rx_frames;
            c.xdp_rx_dropped = x.counters.rx_dropped;
            c.xdp_tx_frames = x.counters.tx_frames;
            c.xdp_tx_kicks = x.counters.tx_kicks;
            c.xdp_tx_no_room = x.counters.tx_no_room;
            c.xdp_queues = x.queues() as u64;
            c.xdp_rx_queues_used = x.queues_used() as u64;
            c.xdp_rx_kernel_dropped = x.kernel_drops();
            c.tx_errors += x.counters.tx_errors;
        }
        c
    }

    /// Nanoseconds since the device opened.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(since(self.epoch))
    }

    /// `now()`, for a call into a connection: later arrivals are never dated before it.
    pub fn stamp(&mut self) -> Instant {
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
        self.counters.rounds = self.counters.rounds.wrapping_add(1);
        let stalled = now.since(self.expected_at) > STALL_NS && self.expected_at != Instant::ZERO;
        // At most one such round in a row: a caller that keeps the engine waiting between its
        // calls while traffic keeps coming still gets full rounds (timers, ACKs, probes).
        let hand_over = !core::mem::take(&mut self.handed_over);
        if stalled && self.host_stalled(now) && hand_over {
            self.hand_over(now);
            // This round's own work (a socket's backlog) is not the next round's lateness.
            self.expected_at = self.now();
            return true;
        }
        self.expected_at = now;
        self.clock_floor = self.clock_floor.max(now);
        if self.deadline_stale {
            self.refresh_deadline();
        }
        if self.fair.is_some() && now >= self.share_at {
            self.share(now);
        }
        let fired = now >= self.deadline && self.run_timers(now);
        let full = fired || self.dirty || self.counters.rounds % 256 == 0;
        let mut busy = fired;
        if full {
            self.dirty = false;
            busy |= self.transmit(now);
        }
        if let Some(x) = self.xdp.as_mut().filter(|x| x.unsent()) {
            // Frames the last kick left in the TX ring (the kernel takes a batch a call).
            x.kick();
            busy = true;
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
                    self.rx_want = (want * 2).min(self.rx_batch_len);
                }
                self.rx_full = true;
            } else {
                self.rx_full = false;
                if got > 0 {
                    self.rx_want = (got / 2 + 1).min(self.rx_batch_len);
                }
            }
            if got < self.rx_batch_len {
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
            let timeout = (wait.as_nanos() as u64).min(self.deadline.since(now));
            // Waking later than asked (or than a datagram came) is the host's delay, not ours.
            self.expected_at = now + timeout;
            if timeout > 0 && self.wait_readable(timeout) {
                // What arrived while this end slept is dated by the kernel: the time to wake up
                // counts in no RTT and no ACK delay.
                let now = self.now();
                if self.receive_all(now, self.rx_batch_len) > 0 {
                    self.hand_over(now);
                    busy = true;
                } else {
                    self.clock_floor = self.clock_floor.max(now);
                    busy |= self.transmit(now);
                    self.drain_events();
                }
                self.deadline_stale = true;
            }
        }
        busy
    }

    /// What arrived after a stall or a sleep is handed over before an ACK is sent: the answers
    /// the tool posts now carry the ACKs those arrivals call for (sent first, each would go on
    /// its own, and the answer without it); they go next round, as after any arrival, and the
    /// next round is a full one. Data the arrivals let go (a window that opened) leaves now.
    fn hand_over(&mut self, now: Instant) {
        self.clock_floor = self.clock_floor.max(now);
        self.drain_events();
        self.transmit_all(now, true);
        self.dirty = true;
        self.handed_over = true;
    }

    /// Sleeps until a datagram waits on the UDP socket or an AF_XDP socket, or `timeout_ns`
    /// passes; whether one waits.
    fn wait_readable(&self, timeout_ns: u64) -> bool {
        let ready = match &self.xdp {
            Some(x) => {
                let mut fds = [self.rx.raw_fd(); 1 + super::xdp::MAX_QUEUES];
                let mut n = 1;
                for (slot, fd) in fds[1..].iter_mut().zip(x.raw_fds()) {
                    *slot = fd;
                    n += 1;
                }
                super::socket::wait_readable_fds(&fds[..n], timeout_ns)
            }
            None => self.rx.wait_readable_ns(timeout_ns),
        };
        ready.unwrap_or(false)
    }

    /// The engine did not run for a while although it had asked to: what the connections'
    /// timers wait for may be sitting in this host's socket buffers, so everything that arrived
    /// is read first, and then the timers restart from now (a timeout must not count the time a
    /// packet waited for this host's own CPU).
    /// Returns whether anything arrived.
    fn host_stalled(&mut self, now: Instant) -> bool {
        self.counters.host_stalls += 1;
        let mut got = 0;
        for _ in 0..16 {
            let n = self.receive_all(now, self.rx_batch_len);
            got += n;
            if n < self.rx_batch_len {
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
        got > 0
    }

    /// The receiver's fair share: every connection that delivered data within
    /// [`SHARE_IDLE_NS`] counts as a sender wanting all it can get, and each connection's ACKs
    /// carry its max-min share of the line rate (with the other engines on the line, through
    /// the share table). Demands are not measured here (`FairShare::received`, as the simulator
    /// does): a software host's own stalls, its CPU given to other work, would read as senders
    /// wanting less, and their shares and the line's use would fall with them (the four-sender
    /// test moved 0.69 of its 1 Gb/s beside the other tests).
    fn share(&mut self, now: Instant) {
        self.share_at = now + SHARE_PERIOD_NS;
        let Some(fair) = self.fair.as_mut() else {
            return;
        };
        for (qpn, qp) in self.qps.iter_mut() {
            // Only what delivered since the last time: a connection long idle is not taken in
            // again every period, to be forgotten again.
            if core::mem::take(&mut qp.data_bytes) > 0 {
                if let Some(at) = qp.data_at {
                    // A full table leaves the newcomer without a hint until a slot frees.
                    let _ = fair.heard(*qpn, u32::MAX, at);
                }
            }
        }
        fair.expire(now);
        if let Some(t) = self.share_table.as_mut() {
            let (unbounded, bounded) = fair.summary();
            // What this engine publishes holds as long as its senders do without a word from
            // them (an engine that then blocks does not hold the others back for long).
            let (u, b) = t.exchange(unbounded, bounded, SHARE_IDLE_NS);
            fair.set_others(u, b);
        }
        let level = fair.level_mbps();
        for (qpn, qp) in self.qps.iter_mut() {
            if let Some(conn) = qp.conn.as_mut() {
                conn.set_rate_hint(fair.share_at(*qpn, level).unwrap_or(0));
            }
        }
    }

    fn refresh_deadline(&mut self) {
        self.deadline = self
            .qps
            .values()
            .filter_map(|qp| qp.conn.as_ref()?.poll_timeout())
            .min()
            .unwrap_or(Instant::MAX);
        self.deadline_stale = false;
    }

    fn run_timers(&mut self, now: Instant) -> bool {
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
                let paths = (0..conn.config().paths)
                    .filter_map(|i| conn.path_stats(transport_core::conn::PathId(i)))
                    .collect();
                Some(QpSnapshot {
                    qpn: *qpn,
                    peer: qp.peer,
                    counters: *conn.counters(),
                    paths,
                    rate: conn.rate_status(),
                    icrc: conn.config().icrc,
                })
            })
            .collect();
        v.sort_by_key(|s| s.qpn);
        v
    }

    /// What the engine holds: (send sockets, staging buffers, queue pairs, requests in flight,
    /// regions). None of it grows with what arrives, only with what this end creates and posts;
    /// the sockets and stages of path ports left behind by paths that moved (a peer can make
    /// paths fail) are closed past twice those in use (`drop_unused_paths`).
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
