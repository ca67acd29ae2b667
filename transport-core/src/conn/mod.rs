//! The connection: the sans-IO state machine that turns work requests into packets and packets
//! into placed data and completions.
//!
//! - Many paths (const `P`), each with its UDP source port (entropy), its own 32-bit sequence
//!   space, send window and 256-bit receive bitmap. New packets are sprayed round-robin over the
//!   active paths with room in their window.
//! - Loss: every path delivers in order, so a gap below a selectively acknowledged sequence is
//!   loss; exactly the missing packet is queued again at once and goes out on another healthy path.
//!   A per-path retransmission timeout with two levels (as IRN: short with few packets in flight,
//!   long otherwise) covers tail loss; repeated timeouts stop data on the path and start probes;
//!   unanswered probes declare it failed, give it a new source port and keep probing it until it
//!   answers, and only then does it carry data again.
//! - Delivery: the BTH PSN numbers data packets connection-wide. The receiver drops duplicates by
//!   PSN, places each packet at its final address as it arrives (after the region check for
//!   Writes and Reads), and reports its cumulative PSN in every ACK; the sender completes a message
//!   only when that cumulative PSN has passed it.
//! - Streams (const `S`): completions are delivered in order within a stream, never held up by
//!   another stream. A Send matches the receive buffer posted for its message sequence number.
//! - Congestion (`crate::rate`, reached through `cc`): every path has its own window, AIMD on
//!   ECN. An ACK that reports CE marks halves the window of the path that carried them (at most
//!   once per that path's RTT); unmarked ACKs grow it by one packet per window acknowledged, up to
//!   [`Config::window_per_path`]. New packets go round-robin to paths with room, so a marked path
//!   carries less and its share moves to the clear ones. Loss alone does not shrink a window: the
//!   fabric is lossy by design, and timeouts lead to probing and failover instead.
//!
//! Capacities: `W` packets in flight per connection (and the receive PSN window), `Q` messages in
//! flight and receive buffers per stream, `R` memory regions. Every operation is bounded by them.
//!
//! Where things are: `config` (what a connection is told), `state` (its inner records: messages,
//! packets, paths, streams, pending answers), this file (the `Connection` itself, posting and
//! events), `transmit` (what leaves next, headers, the seal), `receive` (the checks every datagram
//! passes, probes, NACKs), `ack` (ACKs, SACK and overdue loss detection, the window, completions),
//! `responder` (placement, receives, refusals, Read and atomic responses), `refusals` (the table
//! of refusals held until confirmed, which keeps its own count), `timers`
//! (retransmission timeouts, probes, host stalls), `cc` (congestion control), `crc` (the ICRC over
//! UDP), `region`, `sack`, `seq` and `types` (the public records).

mod ack;
mod cc;
mod config;
mod crc;
mod receive;
mod refusals;
mod region;
mod responder;
mod ring;
mod runner;
mod sack;
mod seq;
mod state;
mod timers;
mod transmit;
mod types;

pub use region::{Access, Region, RegionError, RegionTable};
pub use sack::{Arrival, SackBitmap};
pub use seq::{psn_before, psn_diff, PathSeq};
pub use types::*;

pub use config::{entropy_port, path_origin, Config, IcrcMode};
pub use crc::compute_icrc;
pub use runner::{Applied, FlatMemory, Memory};

use crate::icrc;
use crate::rate::{AckReport, QueueDelay, RateControl};
use crate::wire::metaroce::{
    MrAckRepr, MrDataRepr, MrNackRepr, MrProbeRepr, MrRemoteRepr, NackReason, PiggyAck, SACK_BITS,
};
use crate::wire::{
    AtomicAckEthRepr, AtomicEthRepr, BthRepr, Datagram, Extensions, Opcode, Psn, Qpn,
};
use core::net::IpAddr;

/// Slots of a path's in-flight ring: one per bit of the SACK bitvector.
const PATH_RING: usize = SACK_BITS;
/// An empty slot in a path ring.
const NO_PSN: u32 = u32::MAX;
/// The path of a packet whose last transmission no longer counts (refused receiver-not-ready).
const NO_PATH: PathId = PathId(u8::MAX);
/// Tail probes sent before the silence of a path's tail is taken as the loss of what it carried
/// (one more than one: a lost probe or a lost answer alone must not declare a window lost).
const TAIL_PROBE_TRIES: u8 = 2;
/// Probes in a row that a path may leave unanswered, while the whole peer is silent and the
/// connection waits for it, before they count towards declaring the path failed: a stalled peer
/// host is not a dead route, but a silence this long may be every route dying at once.
const QUIET_PROBES: u8 = 8;
/// How long, in long retransmission timeouts (`Config::rto_high`), the whole peer may be silent
/// before a path's unanswered tail probe counts as the loss of what the path carried. While the
/// peer answers nothing on any path, one path's silence is no evidence against that path: the peer's
/// host may be stalled (a software peer whose CPU went to other work), and what it answers when it
/// runs again tells exactly what was lost. A silence this long may be every route dying at once.
///
/// Thirty-two: 128 ms at the host transport's 4 ms, 10.24 ms at the default 320 us. A software
/// peer stopped for 25-40 ms at a time (a debug build beside busy loops; a CI run's failure with
/// nothing dropped looked the same) takes about as long again to work through the backlog its
/// socket holds; eight (32 ms) took such stalls for loss (a window of needless retransmissions
/// on every path, and a path declared failed). Waiting longer costs where every route dies at
/// once, and where a path's tail is lost while nothing else the peer could answer is in flight
/// (or while it catches up): the loss is declared that much later.
const PEER_SILENCE_RTOS: u64 = 32;
/// Restarts for host stalls a path's timers take while the path does not move (its oldest packet
/// in flight stays unresolved, no probe leaves): a host that stalls again and again (an
/// overloaded machine, a runner whose every round runs long) must still find a loss.
const HOST_STALL_RESTARTS: u8 = 8;
/// Doublings of `Config::rnr_delay` at most while a peer keeps refusing for want of resources
/// (32 times: 1.6 ms at the default 50 us). A responder whose queue stays full (Read responses
/// waiting for ACKs on a slow host) would otherwise be asked again every 50 us, by every
/// refused packet.
const RNR_BACKOFF_SHIFT: u8 = 5;
/// Pending NACKs at most.
const NACK_QUEUE: usize = 16;
/// Fatal refusals a responder holds until the requester confirms them; while all are taken, a
/// packet that would be refused is not accepted (the requester sends it again later).
const REFUSALS: usize = 8;
/// The window over which a path's least one-way delay is kept, ns: short enough that the clocks'
/// drift does not pass for a queue (see `crate::rate::QueueDelay`).
const OWD_WINDOW_NS: u64 = 10_000_000;

use config::*;
use crc::*;
use receive::*;
use refusals::*;
use ring::Ring;
use state::*;

/// A connection with capacities: `P` paths, `W` packets in flight, `S` streams, `Q` messages and
/// receive buffers per stream, `R` memory regions.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct Connection<
    const P: usize,
    const W: usize,
    const S: usize,
    const Q: usize,
    const R: usize,
> {
    // What a hop reads and writes (`#[repr(C)]`: in this order, a few cache lines; the
    // scalars first, then the sets of paths, the timers, the carried ACK, the counters
    // and the ACK schedule). docs/BENCHMARKS.md counts the lines a hop touches
    // (`scripts/hop-lines.sh`).
    una: Psn,
    nxt: Psn,
    peer_cum: Psn,
    rx_cum: Psn,
    /// Messages before this one have no packets left to send for the first time.
    send_hint: u32,
    /// The fair share this end's ACKs give the peer, Mb/s (0: none): the runner's to set.
    hint_out: u32,
    /// The queueing delay the last new data packet met, ns (its path's one-way delay above the
    /// path's least recent one): the runner's drain input (`crate::rate::Drain`).
    queue_delay: u32,
    /// Read and atomic requests sent and not yet answered (against `Config::max_rd_atomic`).
    requests_out: u16,
    /// Receiver-not-ready NACKs since the peer last accepted something new: each doubles the
    /// wait before the refused packet goes again, up to [`RNR_BACKOFF_SHIFT`] doublings.
    rnr_streak: u8,
    /// Something may be waiting in the control queues (ACK, probe reply, probe, NACK).
    control_dirty: bool,
    /// An ACK moved `rack_sent` since overdue transmissions were last looked for.
    rack_dirty: bool,
    /// A completion waits for room in the event queue (`poll_event` reports it).
    completions_deferred: bool,
    /// A Read or atomic response was queued since the last `poll_transmit`.
    response_ready: bool,
    /// The latest send time of any transmission acknowledged so far, on any path: a transmission
    /// sent before it and still unresolved past its own path's round trip is overdue (lost).
    rack_sent: Instant,
    /// When an ACK last acknowledged a transmission for the first time, on any path: the peer's
    /// last progress through what this end sent (a stalled peer catching up on its backlog
    /// makes progress at every ACK, whichever path's run it reads).
    progress_at: Instant,
    rr: usize,
    /// The path the last atomic took: atomics keep to one path while it has room, so they
    /// reach the responder in order (one that overtakes an earlier packet is refused
    /// receiver-not-ready and sent again).
    atomic_path: Option<PathId>,
    /// A CNP is due, on this path.
    cnp_due: Option<PathId>,
    /// The paths with transmissions not yet resolved (`una != next_seq`): what a ping-pong's
    /// path choice, loss detection and timers look at, without reading every path's state
    /// (each path's rings span kilobytes; a hop that reads eight paths misses the cache eight
    /// times).
    inflight: PathSet,
    /// The paths in `PathState::Probing`: the only ones whose probe timer runs.
    probing: PathSet,
    /// When a packet held back after a receiver-not-ready NACK may go again.
    retx_wake: Option<Instant>,
    /// When a datagram of this connection last passed the checks (from any path); `None` until
    /// the first.
    last_heard: Option<Instant>,
    /// When a paced connection may send its next data packet (held back until then).
    pace_at: Option<Instant>,
    /// The path the last pick took and how many more packets it takes without a new pick
    /// (`Config::spray_burst`).
    burst: (usize, u8),
    /// The ACK the last data packet carried (flag A) and when it arrived: taken after that
    /// packet's own work and after the answer a runner sends at once (see `handle_datagram`).
    carried: Option<CarriedAck>,
    pending_atomic: Option<PendingAtomic>,
    counters: Counters,
    /// Which paths owe the peer an ACK, at once or by a deadline.
    acks: AckSchedule<P>,
    // The records by message, packet, path and stream, the tables and the controller.
    cfg: Config,
    regions: RegionTable<R>,
    /// Messages posted (and responses this end sends), by message number until freed.
    msgs: Ring<TxMsg, Q>,
    pkts: [TxPkt; W],
    /// Packets to send again, in order.
    retx: Ring<Psn, W>,
    paths: [TxPath; P],
    /// DCQCN's notification point: when the last CNP left.
    cnp_gate: crate::rate::CnpGate,
    tx_streams: [TxStream; S],
    rx_paths: [RxPath; P],
    rx_seen: [bool; W],
    rx_streams: [RxStream<Q>; S],
    nacks: [Option<PendingNack>; NACK_QUEUE],
    /// The confirmation of the last fatal NACK that named nothing this end sent (a refusal of a
    /// forged packet, or a forgery itself): one slot, whatever the number of such NACKs.
    unverified_confirm: Option<PendingNack>,
    refusals: RefusalTable<REFUSALS>,
    events: Ring<Event, Q>,
    /// Path events dropped because the event queue was full (completions never are: see
    /// `push_completion`).
    events_lost: u64,
    /// ICRC prefixes of what this end sends and receives.
    icrc_tx: IcrcPrefixes,
    icrc_rx: IcrcPrefixes,
    /// The paths' windows: only the controller changes them (`cc`).
    rate: RateControl<P>,
    /// The peer's last silence of at least `rto_low`: when it was last heard before, and first
    /// heard after. What it sends right after such a silence is its backlog (a stalled host
    /// catching up), not an answer to what left meanwhile.
    silence: Option<(Instant, Instant)>,
}

impl<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize>
    Connection<P, W, S, Q, R>
{
    /// The rings are indexed by sequence numbers modulo their sizes, across the wrap of the
    /// 24-bit PSN and the 32-bit MSN: only powers of two keep that consistent.
    const SIZES_ARE_POWERS_OF_TWO: () = assert!(
        W.is_power_of_two() && Q.is_power_of_two() && W <= 1 << 23,
        "W and Q must be powers of two (W at most 2^23)"
    );

    /// A connection in the connected state.
    pub fn new(mut cfg: Config) -> Self {
        let () = Self::SIZES_ARE_POWERS_OF_TWO;
        // A path is named by a u8 on the wire: 255 at most, also when `P` has room for more
        // (`P.min(256) as u8` was 0 at `P` = 256, and the clamp panicked).
        cfg.paths = cfg.paths.clamp(1, P.min(255) as u8);
        cfg.window_per_path = cfg.window_per_path.clamp(1, PATH_RING as u32 - 1);
        cfg.mtu = cfg.mtu.max(1);
        let path = |i: usize| TxPath {
            state: PathState::Active,
            generation: 0,
            failed: false,
            next_seq: path_origin(cfg.initial_path_seq, PathId(i as u8)),
            una: path_origin(cfg.initial_path_seq, PathId(i as u8)),
            ring_psn: [NO_PSN; PATH_RING],
            ring_sent: [Instant::ZERO; PATH_RING],
            srtt: 0,
            rttvar: 0,
            timeouts_in_row: 0,
            probe_seq: cfg
                .initial_probe_seq
                .wrapping_add((i as u32).wrapping_mul(0x85eb_ca6b)),
            probe_ts: 0,
            probe_outstanding: false,
            probe_history: [0; PROBE_HISTORY],
            probe_due: Instant::ZERO,
            probe_pending: false,
            probes_unanswered: 0,
            probe_at: Instant::ZERO,
            quiet_probes: 0,
            tail_probe_pending: false,
            tail_probe_ts: None,
            tail_probe_at: Instant::ZERO,
            tail_probe_cut: PathSeq(0),
            tail_probe_tries: 0,
            timer_from: Instant::ZERO,
            stall_restarts: 0,
            stall_mark: (PathSeq(0), 0),
            last_ack_at: Instant::ZERO,
            stats: PathStats {
                src_port: entropy_port(cfg.entropy_seed, PathId(i as u8), 0),
                active: i < usize::from(cfg.paths),
                ..PathStats::default()
            },
        };
        let rx_path = |i: usize| RxPath {
            sack: SackBitmap::new(path_origin(cfg.peer_initial_path_seq, PathId(i as u8))),
            unacked: 0,
            ce: 0,
            ece: false,
            ts: 0,
            ts_at: Instant::ZERO,
            owd: QueueDelay::new(OWD_WINDOW_NS),
            probe_reply: None,
            peer_port: None,
        };
        Connection {
            regions: RegionTable::default(),
            counters: Counters::default(),
            msgs: Ring::new(),
            pkts: [TxPkt::default(); W],
            una: cfg.initial_psn,
            nxt: cfg.initial_psn,
            peer_cum: cfg.initial_psn,
            retx: Ring::new(),
            retx_wake: None,
            rnr_streak: 0,
            paths: core::array::from_fn(path),
            rr: 0,
            burst: (0, 0),
            atomic_path: None,
            send_hint: 0,
            requests_out: 0,
            control_dirty: false,
            cnp_gate: crate::rate::CnpGate::default(),
            cnp_due: None,
            response_ready: false,
            carried: None,
            tx_streams: [TxStream {
                next_msn: 0,
                next_read: 0,
            }; S],
            rx_paths: core::array::from_fn(rx_path),
            rx_cum: cfg.peer_initial_psn,
            rx_seen: [false; W],
            rx_streams: [RxStream {
                slots: [RecvSlot::default(); Q],
                posted: 0,
                completed: 0,
                refused: None,
            }; S],
            nacks: [None; NACK_QUEUE],
            unverified_confirm: None,
            rack_sent: Instant::ZERO,
            progress_at: Instant::ZERO,
            rack_dirty: false,
            inflight: PathSet::default(),
            probing: PathSet::default(),
            refusals: RefusalTable::new(),
            acks: AckSchedule::new(),
            pending_atomic: None,
            events: Ring::new(),
            events_lost: 0,
            completions_deferred: false,
            icrc_tx: IcrcPrefixes::default(),
            icrc_rx: IcrcPrefixes::default(),
            rate: RateControl::new(cfg.cc, cfg.window_per_path)
                .starting_at(cfg.start_window_per_path),
            hint_out: 0,
            queue_delay: 0,
            pace_at: None,
            last_heard: None,
            silence: None,
            cfg,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Connection-wide counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The fair share (Mb/s, 0 for none) this end's ACKs give the peer from now on: the runner
    /// computes it for all the connections sending to it (`crate::rate::FairShare`).
    pub fn set_rate_hint(&mut self, mbps: u32) {
        self.hint_out = mbps;
    }

    /// A congestion notification packet for this connection arrived (RoCEv2 mode, DCQCN): as a
    /// CNP datagram through `handle_datagram`, or told by a runner that models them. Returns
    /// whether it cut the rate.
    pub fn handle_cnp(&mut self, now: Instant) -> bool {
        let cut = self.rate.on_cnp(now);
        if cut {
            self.counters.cwnd_cuts += 1;
        }
        cut
    }

    /// The rate the connection may send at, Mb/s (0: no limit), its window in packets, and the
    /// last rate hint the peer's ACKs carried (Mb/s, 0: none).
    pub fn rate_status(&self) -> RateStatus {
        RateStatus {
            rate_mbps: self.rate.rate_mbps(),
            connection_window: self.rate.connection_window(),
            hint_received_mbps: self.rate.hint_mbps(),
            hint_sent_mbps: self.hint_out,
            queue_delay_ns: self.queue_delay,
        }
    }

    /// The runner sends path `path`'s datagrams from UDP source port `port` instead of the one
    /// the connection chose (another process holds that one on this host): from now on the
    /// path's datagrams name `port`, in their [`Transmit`], their ICRC and the path's
    /// statistics, until the path takes new entropy after a failure. A path this connection
    /// does not have is ignored.
    pub fn bind_path_port(&mut self, path: PathId, port: u16) {
        if let Some(p) = self.paths.get_mut(path.index()) {
            p.stats.src_port = port;
        }
    }

    /// A path's counters and state.
    pub fn path_stats(&self, path: PathId) -> Option<PathStats> {
        let p = self.paths.get(path.index())?;
        let mut s = p.stats;
        s.active = path.0 < self.cfg.paths && p.state == PathState::Active;
        s.in_flight = p.next_seq.diff(p.una) as u32;
        s.rtt_smoothed = p.srtt;
        s.cwnd = self.rate.window(path);
        Some(s)
    }

    /// Path events (failed, restored) that could not be queued because the event queue was
    /// full; they are counted in the counters and path stats all the same. Completions are never
    /// lost: one that finds the queue full waits, its message or receive kept, until
    /// [`Connection::poll_event`] has room for it.
    pub fn events_lost(&self) -> u64 {
        self.events_lost
    }

    /// Registers a memory region peers may access.
    pub fn register(&mut self, region: Region) -> Result<(), RegionError> {
        self.regions.register(region)
    }

    /// Removes a region.
    pub fn deregister(&mut self, key: u32) -> bool {
        self.regions.deregister(key)
    }

    /// Posts a work request.
    pub fn post(&mut self, _now: Instant, wr: WorkRequest) -> Result<(), PostError> {
        let stream = usize::from(wr.stream);
        if stream >= S {
            return Err(PostError::NoSuchStream);
        }
        if self.msgs.is_full() {
            return Err(PostError::QueueFull);
        }
        let is_atomic = matches!(wr.op, WrOp::CompareSwap { .. } | WrOp::FetchAdd(_));
        if wr.len > 1 << 31
            || (wr.len == 0 && matches!(wr.op, WrOp::Read))
            || (is_atomic && wr.len != 8)
        {
            return Err(PostError::BadLength);
        }
        if is_atomic && (wr.remote.va % 8 != 0 || wr.local_addr % 8 != 0) {
            return Err(PostError::Misaligned);
        }
        let ts = &mut self.tx_streams[stream];
        let (kind, imm, msn) = match wr.op {
            WrOp::Send => (MsgKind::Send, None, post_inc(&mut ts.next_msn)),
            WrOp::SendWithImm(i) => (MsgKind::Send, Some(i), post_inc(&mut ts.next_msn)),
            WrOp::Write => (MsgKind::Write, None, ts.next_msn),
            WrOp::WriteWithImm(i) => (MsgKind::Write, Some(i), post_inc(&mut ts.next_msn)),
            WrOp::Read => (MsgKind::Read, None, post_inc(&mut ts.next_read)),
            WrOp::CompareSwap { .. } | WrOp::FetchAdd(_) => {
                (MsgKind::Atomic, None, post_inc(&mut ts.next_read))
            }
        };
        let atomic = match wr.op {
            WrOp::CompareSwap { compare, swap } => AtomicOperands::CompareSwap { compare, swap },
            WrOp::FetchAdd(add) => AtomicOperands::FetchAdd(add),
            _ => AtomicOperands::None,
        };
        let npkts = if matches!(kind, MsgKind::Read | MsgKind::Atomic) {
            1
        } else {
            wr.len.div_ceil(self.cfg.mtu).max(1)
        };
        self.push_msg(TxMsg {
            wr_id: wr.id,
            kind,
            imm,
            stream: wr.stream,
            msn,
            local_addr: wr.local_addr,
            len: wr.len,
            remote: wr.remote,
            npkts,
            next_pkt: 0,
            last_psn: None,
            resp_bytes: 0,
            atomic,
            done: false,
            status: Status::Success,
            reported: false,
            held: false,
        });
        Ok(())
    }

    /// Queues a message; the callers checked that the ring has room.
    fn push_msg(&mut self, m: TxMsg) {
        let _ = self.msgs.push(m);
    }

    /// Queues a response (Read or atomic) this end sends on its own.
    fn push_response(&mut self, m: TxMsg) {
        self.push_msg(m);
        self.response_ready = true;
    }

    /// Posts a receive buffer for the stream's next message.
    pub fn post_recv(&mut self, rr: RecvRequest) -> Result<(), PostError> {
        let s = self
            .rx_streams
            .get_mut(usize::from(rr.stream))
            .ok_or(PostError::NoSuchStream)?;
        if s.posted.wrapping_sub(s.completed) as usize >= Q {
            return Err(PostError::QueueFull);
        }
        s.slots[s.posted as usize % Q] = RecvSlot {
            id: rr.id,
            addr: rr.addr,
            cap: rr.len,
            ..RecvSlot::default()
        };
        s.posted = s.posted.wrapping_add(1);
        Ok(())
    }

    /// The next event, if any. Completions come in order within each stream; any number of them
    /// may be due at once (receives on every stream, messages acknowledged together), more than
    /// the queue holds: those wait in the connection and come once the queue is drained.
    pub fn poll_event(&mut self) -> Option<Event> {
        if let Some(e) = self.events.pop() {
            return Some(e);
        }
        if !core::mem::take(&mut self.completions_deferred) {
            return None;
        }
        self.complete_in_order();
        for stream in 0..S {
            self.complete_receives(stream);
        }
        self.events.pop()
    }

    /// Queues a path event; one that finds the queue full is dropped and counted.
    fn push_event(&mut self, e: Event) {
        if self.events.push(e).is_err() {
            self.events_lost += 1;
        }
    }

    /// Queues a completion; false when the queue is full, and the caller keeps what it would
    /// have completed (a message unreported, a receive not yet completed) for `poll_event`.
    fn push_completion(&mut self, c: Completion) -> bool {
        if self.events.is_full() {
            self.completions_deferred = true;
            return false;
        }
        self.events.push(Event::Completion(c)).is_ok()
    }

    /// Whether everything posted has completed and nothing is waiting to be sent.
    pub fn is_idle(&self) -> bool {
        self.msgs.is_empty() && self.una == self.nxt && !self.refusals.any()
    }
}

fn remote_of(ext: &Extensions) -> Option<MrRemoteRepr> {
    match *ext {
        Extensions::MrRemote(_, r) | Extensions::MrRemoteImm(_, r, _) => Some(r),
        _ => None,
    }
}

fn post_inc(x: &mut u32) -> u32 {
    let v = *x;
    *x = x.wrapping_add(1);
    v
}

fn rtt_sample(p: &mut TxPath, rtt: u64) {
    if p.stats.rtt_min == 0 || rtt < p.stats.rtt_min {
        p.stats.rtt_min = rtt.max(1);
    }
    if p.srtt == 0 {
        p.srtt = rtt;
        p.rttvar = rtt / 2;
    } else {
        let err = p.srtt.abs_diff(rtt);
        p.rttvar = (3 * p.rttvar + err) / 4;
        p.srtt = (7 * p.srtt + rtt) / 8;
    }
}

/// The value an atomic leaves in memory: `swap_add` when a compare-and-swap's `compare` matches
/// `current` (unchanged when it does not), `current + swap_add` for a fetch-and-add. Runners use it
/// to carry out [`Delivery::Atomic`].
pub fn atomic_new_value(current: u64, compare: Option<u64>, swap_add: u64) -> u64 {
    match compare {
        Some(c) if c == current => swap_add,
        Some(_) => current,
        None => current.wrapping_add(swap_add),
    }
}

#[cfg(test)]
mod unit {
    use super::{compute_icrc, icrc_set, IcrcPrefixes, ICRC_SETS};
    use crate::icrc::Engine::BuiltIn;
    use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    /// Eight paths' ports (as `entropy_port` draws them) sprayed in turn with full-sized
    /// packets, and their ACKs' length too: after the first round every prefix stays cached
    /// (one slot per port's low bits evicted most of them on every packet).
    #[test]
    fn the_icrc_prefixes_of_eight_sprayed_paths_stay_cached() {
        let ips = (
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        );
        let data = [0x5au8; 1100];
        let mut missing = 0;
        for seed in 0..64u32 {
            let ports: std::vec::Vec<u16> = (0..8)
                .map(|i| super::entropy_port(seed, crate::path::PathId(i), 0))
                .collect();
            let mut cache = IcrcPrefixes::default();
            for _ in 0..2 {
                for (path, &port) in (0u8..).zip(&ports) {
                    for len in [1076, 40] {
                        let set = icrc_set(Some(path), port);
                        cache.icrc(ips, (port, 4791), &[&data[..len]], BuiltIn, set);
                    }
                }
            }
            missing += ports
                .iter()
                .flat_map(|&p| [(p, 1076), (p, 40)])
                .filter(|&(p, len)| !cache.holds(p, len))
                .count();
        }
        // With one slot per hash of the port's low bits (8 of them), most were missing.
        assert_eq!(missing, 0);
    }

    #[test]
    fn cached_icrc_prefixes_give_the_icrc_of_every_port_and_length() {
        // Ports and lengths that share slots, repeat, and alternate, in both IP versions: every
        // result equals the uncached computation (a stale prefix would give another CRC).
        let data: std::vec::Vec<u8> = (0..2000u32).map(|i| (i * 31 + 7) as u8).collect();
        let v4 = (
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        );
        let v6 = (
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 9)),
        );
        for ips in [v4, v6] {
            let mut cache = IcrcPrefixes::default();
            for round in 0..3 {
                for port in [49152u16, 49153, 49152 + ICRC_SETS as u16, 50000] {
                    for len in [0usize, 5, 60, 60 + ICRC_SETS, 1500, 1500] {
                        let t = &data[round..round + len];
                        let want = compute_icrc(ips.0, ips.1, port, 4791, t);
                        let engine = crate::icrc::Engine::BuiltIn;
                        // Paths named right, wrong, or not at all: the same CRC.
                        let set = icrc_set([None, Some(0), Some(3)][round], port);
                        assert_eq!(
                            cache.icrc(ips, (port, 4791), &[t], engine, set),
                            want,
                            "{port} {len}"
                        );
                    }
                }
            }
        }
    }
}
