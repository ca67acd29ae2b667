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
//! - Congestion: every path has its own window, AIMD on ECN. An ACK that reports CE marks halves
//!   the window of the path that carried them (at most once per that path's RTT); unmarked ACKs
//!   grow it by one packet per window acknowledged, up to [`Config::window_per_path`]. New packets
//!   go round-robin to paths with room, so a marked path carries less and its share moves to the
//!   clear ones. Loss alone does not shrink a window: the fabric is lossy by design, and
//!   timeouts lead to probing and failover instead.
//!
//! Capacities: `W` packets in flight per connection (and the receive PSN window), `Q` messages in
//! flight and receive buffers per stream, `R` memory regions. Every operation is bounded by them.

mod region;
mod sack;
mod seq;
mod types;

pub use region::{Access, Region, RegionError, RegionTable};
pub use sack::{Arrival, SackBitmap};
pub use seq::{psn_before, psn_diff, PathSeq};
pub use types::*;

use crate::icrc;
use crate::wire::metaroce::{
    MrAckRepr, MrDataRepr, MrNackRepr, MrProbeRepr, MrRemoteRepr, NackReason, PiggyAck, SACK_BITS,
};
use crate::wire::{AtomicAckEthRepr, AtomicEthRepr, BthRepr, Extensions, Opcode, Psn, Qpn};
use core::net::IpAddr;

/// Slots of a path's in-flight ring: one per bit of the SACK bitvector.
const PATH_RING: usize = SACK_BITS;
/// An empty slot in a path ring.
const NO_PSN: u32 = u32::MAX;
/// The path of a packet whose last transmission no longer counts (refused receiver-not-ready).
const NO_PATH: u8 = u8::MAX;
/// Tail probes sent before the silence of a path's tail is taken as the loss of what it carried
/// (one more than one: a lost probe or a lost answer alone must not declare a window lost).
const TAIL_PROBE_TRIES: u8 = 2;
/// Pending NACKs at most.
const NACK_QUEUE: usize = 16;
/// Fatal refusals a responder holds until the requester confirms them; while all are taken, a
/// packet that would be refused is not accepted (the requester sends it again later).
const REFUSALS: usize = 8;

/// How a connection behaves. Times are nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Config {
    /// This end's connection number (the peer's destination QP).
    pub local_qpn: Qpn,
    /// The peer's connection number.
    pub remote_qpn: Qpn,
    /// The partition key both ends use.
    pub pkey: u16,
    /// This end's IP address (it enters the ICRC).
    #[cfg_attr(feature = "defmt", defmt(Debug2Format))]
    pub local_ip: IpAddr,
    /// The peer's IP address.
    #[cfg_attr(feature = "defmt", defmt(Debug2Format))]
    pub remote_ip: IpAddr,
    /// UDP port the peer receives on: the destination port of what this end sends (4791).
    pub dst_port: u16,
    /// UDP port this end receives on (4791); it enters the ICRC of arriving datagrams.
    pub local_port: u16,
    /// Paths in use (at most the capacity `P`, at most 256).
    pub paths: u8,
    /// Seed of the source ports (entropy) the paths use.
    pub entropy_seed: u32,
    /// Payload bytes per packet.
    pub mtu: u32,
    /// The first PSN this end sends.
    pub initial_psn: Psn,
    /// The first PSN the peer sends.
    pub peer_initial_psn: Psn,
    /// Where this end's path sequence numbers start (path `i` at
    /// [`path_origin`]`(initial_path_seq, i)`). Runners draw it at random per connection, as the
    /// initial PSN, so that a blind forger has to guess a path sequence to be believed.
    pub initial_path_seq: u32,
    /// Where the peer's path sequence numbers start (its `initial_path_seq`).
    pub peer_initial_path_seq: u32,
    /// Where this end's probe sequence numbers start; drawn at random per connection, so that a
    /// forged probe reply cannot name an outstanding probe.
    pub initial_probe_seq: u32,
    /// Packets in flight per path at most (up to 255): where each path's congestion window
    /// starts and the most it grows to.
    pub window_per_path: u32,
    /// Retransmission timeout with few packets in flight.
    pub rto_low: u64,
    /// Retransmission timeout otherwise.
    pub rto_high: u64,
    /// "Few packets": at most this many in flight on the path.
    pub rto_low_inflight: u32,
    /// Consecutive timeouts on a path before it stops carrying data and is probed.
    pub timeouts_to_probe: u8,
    /// Time between probes.
    pub probe_interval: u64,
    /// Unanswered probes before the path is declared failed and given new entropy.
    pub probes_to_fail: u8,
    /// ACK after this many packets on a path at most.
    pub ack_every: u16,
    /// ACK at most this long after an unacknowledged arrival.
    pub ack_delay: u64,
    /// Wait before sending again a packet the peer refused for want of a receive buffer.
    pub rnr_delay: u64,
    /// Wait for the requester's confirmation of a refusal before sending its NACK again.
    pub refusal_resend: u64,
    /// Check the ICRC of arriving datagrams (turn off only where the NIC already did).
    pub verify_icrc: bool,
    /// The CRC-32 engine of the ICRCs (this build's by default; a runner may hand in one for
    /// its machine, such as PCLMULQDQ block folding on x86_64).
    #[cfg_attr(feature = "defmt", defmt(Debug2Format))]
    pub icrc_engine: icrc::Engine,
}

impl Config {
    /// A configuration with the defaults below for everything but the addresses.
    pub fn new(local_ip: IpAddr, remote_ip: IpAddr, local_qpn: Qpn, remote_qpn: Qpn) -> Self {
        Config {
            local_qpn,
            remote_qpn,
            pkey: 0xffff,
            local_ip,
            remote_ip,
            dst_port: crate::wire::ROCEV2_PORT,
            local_port: crate::wire::ROCEV2_PORT,
            paths: 16,
            entropy_seed: 1,
            mtu: 4096,
            initial_psn: Psn::new(0),
            peer_initial_psn: Psn::new(0),
            initial_path_seq: 0,
            peer_initial_path_seq: 0,
            initial_probe_seq: 0,
            window_per_path: 16,
            rto_low: 100_000,
            rto_high: 320_000,
            rto_low_inflight: 3,
            timeouts_to_probe: 2,
            probe_interval: 50_000,
            probes_to_fail: 3,
            ack_every: 4,
            ack_delay: 5_000,
            rnr_delay: 50_000,
            refusal_resend: 50_000,
            verify_icrc: true,
            icrc_engine: icrc::Engine::BuiltIn,
        }
    }
}

/// The first sequence number of path `path` when a connection's path sequences start at `base`
/// (paths start far apart, so one path's numbers say nothing of another's).
pub fn path_origin(base: u32, path: u8) -> PathSeq {
    PathSeq(base.wrapping_add(u32::from(path).wrapping_mul(0x9e37_79b9)))
}

/// How far back from a path's next sequence number an ACK or NACK may name a transmission. A
/// receiver's cumulative point trails the sender's next number by at most its window plus the
/// 256 numbers of the bitvector; a refusal comes back within a round trip.
const SEQ_HISTORY: u64 = 1 << 16;

/// The UDP source port of a path: a hash of the seed, the path and how many times it failed,
/// in the range 0xC000-0xFFFF that RoCEv2 uses for entropy.
pub fn entropy_port(seed: u32, path: u8, generation: u16) -> u16 {
    let mut x = seed ^ (u32::from(path) << 16) ^ u32::from(generation).wrapping_mul(0x9e37_79b9);
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    0xc000 | (x as u16 & 0x3fff)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MsgKind {
    Send,
    Write,
    Read,
    ReadResponse,
    Atomic,
    AtomicResponse,
}

#[derive(Debug, Clone, Copy)]
struct TxMsg {
    wr_id: u64,
    kind: MsgKind,
    imm: Option<u32>,
    stream: u16,
    msn: u32,
    local_addr: u64,
    len: u32,
    remote: RemoteAddr,
    npkts: u32,
    next_pkt: u32,
    last_psn: Option<Psn>,
    resp_bytes: u32,
    /// Atomic: (swap or add value, compare value, is compare-and-swap); response: (original, _, _).
    atomic: (u64, u64, bool),
    done: bool,
    status: Status,
    reported: bool,
}

impl TxMsg {
    /// A message the responder sends on its own (Read response, atomic response): no work
    /// request behind it, so no completion is reported.
    fn response(kind: MsgKind, stream: u16, msn: u32, npkts: u32) -> Self {
        TxMsg {
            wr_id: 0,
            kind,
            imm: None,
            stream,
            msn,
            local_addr: 0,
            len: 0,
            remote: RemoteAddr::default(),
            npkts,
            next_pkt: 0,
            last_psn: None,
            resp_bytes: 0,
            atomic: (0, 0, false),
            done: false,
            status: Status::Success,
            reported: false,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct TxPkt {
    psn: Psn,
    msg: u32,
    idx: u32,
    path: u8,
    seq: PathSeq,
    sent_at: Instant,
    acked: bool,
    queued: bool,
    not_before: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathState {
    Active,
    Probing,
}

#[derive(Debug, Clone, Copy)]
struct TxPath {
    state: PathState,
    generation: u16,
    failed: bool,
    next_seq: PathSeq,
    una: PathSeq,
    ring_psn: [u32; PATH_RING],
    ring_sent: [Instant; PATH_RING],
    srtt: u64,
    rttvar: u64,
    timeouts_in_row: u8,
    /// The last probe sent (its sequence number) and the timestamp it carried: a reply counts
    /// only if it echoes both while the probe is outstanding.
    probe_seq: u32,
    probe_ts: u32,
    probe_outstanding: bool,
    /// The probe sent before the outstanding one, if it was still unanswered then (sequence,
    /// timestamp): its late answer is genuine, not counted as a bad probe, and changes nothing.
    probe_superseded: Option<(u32, u32)>,
    probe_due: Instant,
    probe_pending: bool,
    probes_unanswered: u8,
    /// A tail probe is to be sent (first timeout on an active path).
    tail_probe_pending: bool,
    /// The timestamp of the tail probe in flight: the ACK that echoes it settles the tail.
    tail_probe_ts: Option<u32>,
    /// When that tail probe left.
    tail_probe_at: Instant,
    /// When the first tail probe of this round left: what left before it and is unresolved when
    /// the round ends is lost.
    tail_probe_cut: Instant,
    /// Tail probes sent this round (a round ends with an answer, or with `TAIL_PROBE_TRIES`
    /// unanswered).
    tail_probe_tries: u8,
    /// The retransmission timer runs from the later of this and the oldest transmission.
    timer_from: Instant,
    /// When the last consistent ACK of this path arrived.
    last_ack_at: Instant,
    /// Congestion window, 1/256 packet units ([`CWND_ONE`] is one packet).
    cwnd: u32,
    /// When the window was last halved for ECN marks.
    cwnd_cut_at: Option<Instant>,
    stats: PathStats,
}

/// One packet in congestion window units.
const CWND_ONE: u32 = 256;

/// A set of path indices (at most 256 paths), for finding a flagged path without walking every
/// path's state.
#[derive(Debug, Clone, Copy, Default)]
struct PathSet([u64; 4]);

impl PathSet {
    fn insert(&mut self, i: usize) {
        self.0[(i / 64) % 4] |= 1 << (i % 64);
    }

    fn remove(&mut self, i: usize) {
        self.0[(i / 64) % 4] &= !(1 << (i % 64));
    }

    fn contains(&self, i: usize) -> bool {
        self.0[(i / 64) % 4] & (1 << (i % 64)) != 0
    }

    fn first(&self) -> Option<usize> {
        self.0
            .iter()
            .position(|&w| w != 0)
            .map(|k| k * 64 + self.0[k].trailing_zeros() as usize)
    }
}

#[derive(Debug, Clone, Copy)]
struct RxPath {
    sack: SackBitmap,
    unacked: u16,
    ack_due: Option<Instant>,
    ce: u16,
    ece: bool,
    ts: u32,
    ts_at: Instant,
    probe_reply: Option<(u32, u32)>,
    /// The UDP source port the peer's path sends from, learned from what it sent that passed
    /// every check (see [`Connection::handle_datagram`]); its ACKs, NACKs and probe replies for
    /// this path must come from it.
    peer_port: Option<u16>,
}

#[derive(Debug, Clone, Copy, Default)]
struct RecvSlot {
    id: u64,
    addr: u64,
    cap: u32,
    got: u32,
    msg_len: u32,
    started: bool,
    imm: Option<u32>,
    write_imm: bool,
    done: bool,
    status: Option<NackReason>,
}

#[derive(Debug, Clone, Copy)]
struct RxStream<const Q: usize> {
    slots: [RecvSlot; Q],
    /// Receive buffers posted (counter; slot = counter % Q).
    posted: u32,
    /// Receive buffers completed (the MSN of the oldest outstanding one).
    completed: u32,
}

#[derive(Debug, Clone, Copy)]
struct TxStream {
    next_msn: u32,
    next_read: u32,
}

#[derive(Debug, Clone, Copy)]
struct PendingAtomic {
    stream: u16,
    msn: u32,
    psn: Psn,
    path: u8,
    path_seq: u32,
}

#[derive(Debug, Clone, Copy)]
struct PendingNack {
    path: u8,
    psn: Psn,
    nack: MrNackRepr,
}

/// A fatal refusal the requester has not confirmed yet: its NACK goes again every
/// `refusal_resend`, and every ACK says refusals are outstanding.
#[derive(Debug, Clone, Copy)]
struct Refusal {
    pending: PendingNack,
    /// When its NACK goes again; `None` until it is first sent (it goes at once).
    due: Option<Instant>,
}

/// A connection with capacities: `P` paths, `W` packets in flight, `S` streams, `Q` messages and
/// receive buffers per stream, `R` memory regions.
#[derive(Debug, Clone)]
pub struct Connection<
    const P: usize,
    const W: usize,
    const S: usize,
    const Q: usize,
    const R: usize,
> {
    cfg: Config,
    regions: RegionTable<R>,
    counters: Counters,
    // Sender.
    msgs: [Option<TxMsg>; Q],
    msg_head: u32,
    msg_tail: u32,
    pkts: [TxPkt; W],
    una: Psn,
    nxt: Psn,
    peer_cum: Psn,
    retx: [Psn; W],
    retx_head: u32,
    retx_tail: u32,
    /// When a packet held back after a receiver-not-ready NACK may go again.
    retx_wake: Option<Instant>,
    paths: [TxPath; P],
    rr: usize,
    /// Messages before this one have no packets left to send for the first time.
    send_hint: u32,
    /// Something may be waiting in the control queues (ACK, probe reply, probe, NACK).
    control_dirty: bool,
    /// A Read or atomic response was queued since the last `poll_transmit`.
    response_ready: bool,
    /// The ACK the last data packet carried (flag A) and when it arrived: taken after that
    /// packet's own work and after the answer a runner sends at once (see `handle_datagram`).
    carried: Option<(Instant, AckOrigin, Psn, MrAckRepr)>,
    tx_streams: [TxStream; S],
    // Receiver.
    rx_paths: [RxPath; P],
    rx_cum: Psn,
    rx_seen: [bool; W],
    rx_streams: [RxStream<Q>; S],
    nacks: [Option<PendingNack>; NACK_QUEUE],
    /// The latest send time of any transmission acknowledged so far, on any path: a transmission
    /// sent before it and still unresolved past its own path's round trip is overdue (lost).
    rack_sent: Instant,
    /// An ACK moved `rack_sent` since overdue transmissions were last looked for.
    rack_dirty: bool,
    /// The confirmation of the last fatal NACK that named nothing this end sent (a refusal of a
    /// forged packet, or a forgery itself): one slot, whatever the number of such NACKs.
    unverified_confirm: Option<PendingNack>,
    refusals: [Option<Refusal>; REFUSALS],
    /// How many entries of `refusals` are taken.
    refusals_held: u8,
    /// Paths whose ACK is to go now (an ACK that goes now lives only here).
    acks_now: PathSet,
    /// Paths whose `ack_due` is set (an index of `rx_paths`, checked in debug builds).
    acks_due: PathSet,
    pending_atomic: Option<PendingAtomic>,
    events: [Option<Event>; Q],
    ev_head: u32,
    ev_tail: u32,
    events_lost: u64,
    /// ICRC prefixes of what this end sends and receives.
    icrc_tx: IcrcPrefixes,
    icrc_rx: IcrcPrefixes,
}

impl<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize>
    Connection<P, W, S, Q, R>
{
    /// A connection in the connected state.
    pub fn new(mut cfg: Config) -> Self {
        cfg.paths = cfg.paths.clamp(1, P.min(256) as u8);
        cfg.window_per_path = cfg.window_per_path.clamp(1, PATH_RING as u32 - 1);
        cfg.mtu = cfg.mtu.max(1);
        let path = |i: usize| TxPath {
            state: PathState::Active,
            generation: 0,
            failed: false,
            next_seq: path_origin(cfg.initial_path_seq, i as u8),
            una: path_origin(cfg.initial_path_seq, i as u8),
            ring_psn: [NO_PSN; PATH_RING],
            ring_sent: [0; PATH_RING],
            srtt: 0,
            rttvar: 0,
            timeouts_in_row: 0,
            probe_seq: cfg
                .initial_probe_seq
                .wrapping_add((i as u32).wrapping_mul(0x85eb_ca6b)),
            probe_ts: 0,
            probe_outstanding: false,
            probe_superseded: None,
            probe_due: 0,
            probe_pending: false,
            probes_unanswered: 0,
            tail_probe_pending: false,
            tail_probe_ts: None,
            tail_probe_at: 0,
            tail_probe_cut: 0,
            tail_probe_tries: 0,
            timer_from: 0,
            last_ack_at: 0,
            cwnd: cfg.window_per_path * CWND_ONE,
            cwnd_cut_at: None,
            stats: PathStats {
                src_port: entropy_port(cfg.entropy_seed, i as u8, 0),
                active: i < usize::from(cfg.paths),
                ..PathStats::default()
            },
        };
        let rx_path = |i: usize| RxPath {
            sack: SackBitmap::new(path_origin(cfg.peer_initial_path_seq, i as u8)),
            unacked: 0,
            ack_due: None,
            ce: 0,
            ece: false,
            ts: 0,
            ts_at: 0,
            probe_reply: None,
            peer_port: None,
        };
        Connection {
            regions: RegionTable::default(),
            counters: Counters::default(),
            msgs: [None; Q],
            msg_head: 0,
            msg_tail: 0,
            pkts: [TxPkt::default(); W],
            una: cfg.initial_psn,
            nxt: cfg.initial_psn,
            peer_cum: cfg.initial_psn,
            retx: [Psn::new(0); W],
            retx_head: 0,
            retx_tail: 0,
            retx_wake: None,
            paths: core::array::from_fn(path),
            rr: 0,
            send_hint: 0,
            control_dirty: false,
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
            }; S],
            nacks: [None; NACK_QUEUE],
            unverified_confirm: None,
            rack_sent: 0,
            rack_dirty: false,
            refusals: [None; REFUSALS],
            refusals_held: 0,
            acks_now: PathSet::default(),
            acks_due: PathSet::default(),
            pending_atomic: None,
            events: [None; Q],
            ev_head: 0,
            ev_tail: 0,
            events_lost: 0,
            icrc_tx: IcrcPrefixes::default(),
            icrc_rx: IcrcPrefixes::default(),
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

    /// A path's counters and state.
    pub fn path_stats(&self, path: usize) -> Option<PathStats> {
        let p = self.paths.get(path)?;
        let mut s = p.stats;
        s.active = path < usize::from(self.cfg.paths) && p.state == PathState::Active;
        s.in_flight = p.next_seq.diff(p.una) as u32;
        s.rtt_smoothed = p.srtt;
        s.cwnd = p.cwnd / CWND_ONE;
        Some(s)
    }

    /// Events that could not be queued because the event queue was full.
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
        if self.msg_tail.wrapping_sub(self.msg_head) as usize >= Q {
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
            WrOp::CompareSwap { compare, swap } => (swap, compare, true),
            WrOp::FetchAdd(add) => (add, 0, false),
            _ => (0, 0, false),
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
        });
        Ok(())
    }

    fn push_msg(&mut self, m: TxMsg) {
        self.msgs[self.msg_tail as usize % Q] = Some(m);
        self.msg_tail = self.msg_tail.wrapping_add(1);
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

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        if self.ev_head == self.ev_tail {
            return None;
        }
        let e = self.events[self.ev_head as usize % Q].take();
        self.ev_head = self.ev_head.wrapping_add(1);
        e
    }

    fn push_event(&mut self, e: Event) {
        if self.ev_tail.wrapping_sub(self.ev_head) as usize >= Q {
            self.events_lost += 1;
            return;
        }
        self.events[self.ev_tail as usize % Q] = Some(e);
        self.ev_tail = self.ev_tail.wrapping_add(1);
    }

    /// Whether everything posted has completed and nothing is waiting to be sent.
    pub fn is_idle(&self) -> bool {
        self.msg_head == self.msg_tail && self.una == self.nxt && self.refusals_held == 0
    }

    // ----- timers -----------------------------------------------------------------------

    fn rto(&self, p: &TxPath) -> u64 {
        let inflight = p.next_seq.diff(p.una) as u32;
        let base = if inflight <= self.cfg.rto_low_inflight {
            self.cfg.rto_low
        } else {
            self.cfg.rto_high
        };
        base.max(p.srtt + 4 * p.rttvar)
    }

    /// When [`Connection::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut at = |x: Instant| t = Some(t.map_or(x, |y| y.min(x)));
        if let Some((arrived, ..)) = self.carried {
            at(arrived);
        }
        for (i, p) in self
            .paths
            .iter()
            .enumerate()
            .take(usize::from(self.cfg.paths))
        {
            if p.una != p.next_seq {
                let slot = p.una.0 as usize % PATH_RING;
                at(p.ring_sent[slot].max(p.timer_from) + self.rto(p));
            }
            if p.state == PathState::Probing {
                at(p.probe_due);
            }
            if let Some(d) = self.rx_paths[i].ack_due {
                at(d);
            }
        }
        if self.una != self.nxt {
            let oldest = &self.pkts[self.una.get() as usize % W];
            if oldest.acked {
                at(oldest.sent_at + self.cfg.rto_high);
            }
        }
        if let Some(w) = self.retx_wake {
            at(w);
        }
        for i in 0..usize::from(self.cfg.paths) {
            if let Some(d) = self.overdue_at(i) {
                at(d);
            }
        }
        if self.refusals_held > 0 {
            for r in self.refusals.iter().flatten() {
                at(r.due.unwrap_or(0));
            }
        }
        t
    }

    /// Fires the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.settle_carried();
        for i in 0..usize::from(self.cfg.paths) {
            let p = &self.paths[i];
            if p.una != p.next_seq {
                let slot = p.una.0 as usize % PATH_RING;
                if now >= p.ring_sent[slot].max(p.timer_from) + self.rto(p) {
                    self.path_timeout(i, now);
                }
            }
            if let Some(d) = self.rx_paths[i].ack_due {
                if now >= d {
                    self.acks_now.insert(i);
                    self.control_dirty = true;
                    self.rx_paths[i].ack_due = None;
                    self.acks_due.remove(i);
                }
            }
            let p = &mut self.paths[i];
            if p.state == PathState::Probing && now >= p.probe_due {
                p.probe_pending = true;
                p.probe_due = now + self.cfg.probe_interval;
                self.control_dirty = true;
            }
        }
        self.detect_overdue(now);
        if self.retx_wake.is_some_and(|w| now >= w) {
            self.retx_wake = None;
        }
        if self.refusals_held > 0
            && self
                .refusals
                .iter()
                .flatten()
                .any(|r| r.due.is_none_or(|d| now >= d))
        {
            self.control_dirty = true;
        }
        // A packet the path layer saw arrive but the peer never accepted (refused while its
        // refusal table was full, or the ACK that would have covered it was lost): send it
        // again once the long timeout has passed.
        if self.una != self.nxt {
            let idx = self.una.get() as usize % W;
            let pk = self.pkts[idx];
            if pk.acked && now >= pk.sent_at + self.cfg.rto_high {
                self.pkts[idx].acked = false;
                self.pkts[idx].sent_at = now;
                self.queue_retx(self.una, now);
            }
        }
    }

    /// The runner did not run for a while although it had asked to (its host gave it no CPU):
    /// every path's retransmission timer, and every probe's, restarts from `now`. What the timers
    /// wait for may have arrived meanwhile and be waiting in the host's buffers; a timeout must
    /// not count the time a packet waited for this host's own CPU. Call it after handing over
    /// what arrived during the stall.
    pub fn handle_host_stall(&mut self, now: Instant) {
        for p in self.paths.iter_mut().take(usize::from(self.cfg.paths)) {
            p.timer_from = p.timer_from.max(now);
            if p.state == PathState::Probing {
                p.probe_due = p.probe_due.max(now + self.cfg.probe_interval);
            }
        }
    }

    fn path_timeout(&mut self, i: usize, now: Instant) {
        let p = &mut self.paths[i];
        if p.state == PathState::Active && p.timeouts_in_row == 0 {
            // First silence: probe the tail instead of declaring it lost. The probe follows the
            // same in-order route; the ACK it triggers tells exactly what arrived before it.
            p.timeouts_in_row = 1;
            p.stats.timeouts += 1;
            p.tail_probe_pending = true;
            p.timer_from = now;
            self.control_dirty = true;
            return;
        }
        let mut lost = 0;
        let (una, next) = (self.paths[i].una, self.paths[i].next_seq);
        let mut s = una;
        while s != next {
            lost += u64::from(self.drop_transmission(i, s, now));
            s = s.add(1);
        }
        let p = &mut self.paths[i];
        p.una = next;
        p.stats.lost += lost;
        // Everything in flight is resolved: a tail probe round still open has nothing to settle.
        p.tail_probe_pending = false;
        p.tail_probe_ts = None;
        p.tail_probe_tries = 0;
        self.counters.lost_by_timeout += lost;
        self.path_silent(i, now);
    }

    /// Path `i` lost what it carried and did not answer in time (a second timeout, or a probe of
    /// its tail left unanswered): after `timeouts_to_probe` of these in a row it stops carrying
    /// data and is probed.
    fn path_silent(&mut self, i: usize, now: Instant) {
        let p = &mut self.paths[i];
        p.stats.timeouts += 1;
        p.timeouts_in_row = p.timeouts_in_row.saturating_add(1);
        if p.state == PathState::Active && p.timeouts_in_row >= self.cfg.timeouts_to_probe {
            p.state = PathState::Probing;
            p.probes_unanswered = 0;
            p.probe_pending = true;
            p.probe_due = now + self.cfg.probe_interval;
            self.control_dirty = true;
        }
    }

    /// Forgets transmission `seq` on path `i` as lost; queues its packet again if this was its
    /// latest transmission and it is not acknowledged. Returns whether a live slot was dropped.
    fn drop_transmission(&mut self, i: usize, seq: PathSeq, now: Instant) -> bool {
        let slot = seq.0 as usize % PATH_RING;
        let raw = self.paths[i].ring_psn[slot];
        if raw == NO_PSN {
            return false;
        }
        self.paths[i].ring_psn[slot] = NO_PSN;
        let psn = Psn::new(raw);
        if self.in_tx_window(psn) {
            let pk = self.pkts[psn.get() as usize % W];
            if !pk.acked && usize::from(pk.path) == i && pk.seq == seq {
                self.queue_retx(psn, now);
            }
        }
        true
    }

    fn in_tx_window(&self, psn: Psn) -> bool {
        let d = psn_diff(psn, self.una);
        d >= 0 && psn_diff(psn, self.nxt) < 0
    }

    fn queue_retx(&mut self, psn: Psn, not_before: Instant) {
        let pk = &mut self.pkts[psn.get() as usize % W];
        if pk.queued {
            return;
        }
        pk.queued = true;
        pk.not_before = not_before;
        self.retx[self.retx_tail as usize % W] = psn;
        self.retx_tail = self.retx_tail.wrapping_add(1);
    }

    // ----- transmit ---------------------------------------------------------------------

    /// Writes the next datagram's headers into `buf` (which must hold an MTU plus 128 bytes):
    /// control packets first (NACKs, ACKs, probes: small, and the peer's timers wait on them),
    /// then data; except that the first packet of a Read or atomic response just queued goes
    /// before them, carrying the ACK of its request.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.settle_carried();
        if self.rack_dirty {
            self.detect_overdue(now);
        }
        if buf.len() < self.cfg.mtu as usize + 128 {
            return None;
        }
        if self.response_ready {
            // A response the connection made itself (nobody rings a doorbell for it): its
            // first packet goes first and carries the ACK of the request.
            self.response_ready = false;
            if let Some(t) = self.poll_transmit_data(now, buf) {
                return Some(t);
            }
        }
        if let Some(t) = self.transmit_control(now, buf) {
            return Some(t);
        }
        self.poll_transmit_data(now, buf)
    }

    /// Like [`Connection::poll_transmit`], but only data packets (retransmissions first, then
    /// new ones), leaving NACKs, probes and the ACKs that found no packet to ride on for the
    /// next `poll_transmit`. A runner that has just been handed a request (a doorbell) calls
    /// this first: the answer to a ping leaves at once and carries the ACK of the ping (flag A,
    /// when the packet has room), so a ping-pong needs one datagram each way.
    pub fn poll_transmit_data(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if buf.len() < self.cfg.mtu as usize + 128 {
            return None;
        }
        if let Some(t) = self.transmit_retx(now, buf) {
            return Some(t);
        }
        self.transmit_new(now, buf)
    }

    fn bth(&self, opcode: Opcode, psn: Psn, pad: u8, ack_req: bool) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: pad,
            tver: 0,
            pkey: self.cfg.pkey,
            fecn: false,
            becn: false,
            dest_qp: self.cfg.remote_qpn,
            ack_req,
            psn,
        }
    }

    fn write_headers(
        &self,
        buf: &mut [u8],
        bth: BthRepr,
        ext: Extensions,
        path: usize,
        payload_addr: u64,
        payload_len: usize,
    ) -> Option<Transmit> {
        let rest = bth.emit(buf).ok()?;
        let before = rest.len();
        let rest = ext.emit(bth.opcode.layout(), rest).ok()?;
        let header_len = BthRepr::LEN + before - rest.len();
        let pad = usize::from(bth.pad_count);
        Some(Transmit {
            path: path as u8,
            src_port: self.paths[path].stats.src_port,
            header_len,
            payload_addr,
            payload_len,
            len: header_len + payload_len + pad + 4,
        })
    }

    /// Path `i`'s acknowledgement as of `now`; what it reports no longer waits.
    fn take_ack(&mut self, i: usize, now: Instant) -> MrAckRepr {
        let refusals = self.refusals_held > 0;
        debug_assert_eq!(
            usize::from(self.refusals_held),
            self.refusals.iter().flatten().count()
        );
        let rx = &mut self.rx_paths[i];
        let ack = MrAckRepr {
            ece: rx.ece,
            refusals,
            path_id: i as u8,
            ce_count: rx.ce,
            cum_seq: rx.sack.cumulative().0,
            ts_echo: rx.ts,
            ack_delay: now.saturating_sub(rx.ts_at).min(u64::from(u32::MAX)) as u32,
            rate_hint: 0,
            sack: rx.sack.to_wire(),
        };
        rx.ack_due = None;
        self.acks_now.remove(i);
        self.acks_due.remove(i);
        rx.unacked = 0;
        rx.ce = 0;
        rx.ece = false;
        self.counters.acks_sent += 1;
        ack
    }

    /// A path whose acknowledgement waits (due now first, then delayed ones).
    fn waiting_ack(&self) -> Option<usize> {
        debug_assert_eq!(
            self.acks_due.first(),
            self.rx_paths[..usize::from(self.cfg.paths)]
                .iter()
                .position(|r| r.ack_due.is_some())
        );
        self.acks_now.first().or_else(|| self.acks_due.first())
    }

    fn transmit_control(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if !self.control_dirty {
            return None;
        }
        let found = self.transmit_control_scan(now, buf);
        if found.is_none() {
            self.control_dirty = false;
        }
        found
    }

    fn transmit_control_scan(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let n = usize::from(self.cfg.paths);
        // NACKs first: they are rare and unblock the peer.
        let mut pending = self
            .nacks
            .iter_mut()
            .find_map(Option::take)
            .or_else(|| self.unverified_confirm.take());
        if pending.is_none() {
            let next = now + self.cfg.refusal_resend;
            if let Some(r) = self
                .refusals
                .iter_mut()
                .flatten()
                .find(|r| r.due.is_none_or(|d| now >= d))
            {
                if r.due.is_some() {
                    self.counters.nacks_resent += 1;
                }
                r.due = Some(next);
                pending = Some(r.pending);
            }
        }
        if let Some(pn) = pending {
            self.counters.nacks_sent += 1;
            let bth = self.bth(Opcode::MrNack, pn.psn, 0, false);
            return self.write_headers(
                buf,
                bth,
                Extensions::MrNack(pn.nack),
                usize::from(pn.path),
                0,
                0,
            );
        }
        for i in 0..n {
            let rx = &mut self.rx_paths[i];
            if let Some((seq, ts)) = rx.probe_reply.take() {
                let probe = MrProbeRepr {
                    path_id: i as u8,
                    probe_seq: seq,
                    timestamp: now as u32,
                    ts_echo: ts,
                };
                let bth = self.bth(Opcode::MrProbeReply, Psn::new(0), 0, false);
                return self.write_headers(buf, bth, Extensions::MrProbe(probe), i, 0, 0);
            }
            if self.acks_now.contains(i) {
                let ack = self.take_ack(i, now);
                let bth = self.bth(Opcode::MrAck, self.rx_cum, 0, false);
                return self.write_headers(buf, bth, Extensions::MrAck(ack), i, 0, 0);
            }
        }
        for i in 0..n {
            let p = &mut self.paths[i];
            if p.tail_probe_pending {
                p.tail_probe_pending = false;
                p.tail_probe_ts = Some(now as u32);
                p.tail_probe_at = now;
                if p.tail_probe_tries == 0 {
                    p.tail_probe_cut = now;
                }
                p.tail_probe_tries = p.tail_probe_tries.saturating_add(1);
                return self.send_probe(now, buf, i);
            }
        }
        for i in 0..n {
            let p = &mut self.paths[i];
            if p.state == PathState::Probing && p.probe_pending {
                p.probe_pending = false;
                p.probes_unanswered = p.probes_unanswered.saturating_add(1);
                if p.probes_unanswered > self.cfg.probes_to_fail {
                    // Declare the route dead: new entropy, and keep probing on it.
                    p.generation = p.generation.wrapping_add(1);
                    p.stats.src_port = entropy_port(self.cfg.entropy_seed, i as u8, p.generation);
                    p.stats.failures += 1;
                    p.probes_unanswered = 1;
                    let first = !p.failed;
                    p.failed = true;
                    let port = p.stats.src_port;
                    if first {
                        self.counters.path_failures += 1;
                    }
                    self.push_event(Event::PathFailed {
                        path: i as u8,
                        new_src_port: port,
                    });
                }
                return self.send_probe(now, buf, i);
            }
        }
        None
    }

    /// Writes the next probe of path `i` (a new probe sequence number, this end's clock).
    fn send_probe(&mut self, now: Instant, buf: &mut [u8], i: usize) -> Option<Transmit> {
        let p = &mut self.paths[i];
        p.probe_superseded = p.probe_outstanding.then_some((p.probe_seq, p.probe_ts));
        p.probe_seq = p.probe_seq.wrapping_add(1);
        p.probe_ts = now as u32;
        p.probe_outstanding = true;
        let probe = MrProbeRepr {
            path_id: i as u8,
            probe_seq: p.probe_seq,
            timestamp: p.probe_ts,
            ts_echo: 0,
        };
        self.counters.probes_sent += 1;
        let bth = self.bth(Opcode::MrProbe, Psn::new(0), 0, false);
        self.write_headers(buf, bth, Extensions::MrProbe(probe), i, 0, 0)
    }

    /// The active path with room that comes next in the round-robin, avoiding `avoid` if another
    /// one has room.
    fn pick_path(&mut self, avoid: Option<usize>) -> Option<usize> {
        let n = usize::from(self.cfg.paths);
        let last = (self.rr + n - 1) % n;
        if avoid.is_none() && self.idle_but_carried(last) {
            // Nothing in flight (one message at a time, a ping-pong): spraying gains nothing, so
            // stay on the last path while it is idle and healthy; its socket and route stay warm.
            let p = &self.paths[last];
            if p.state == PathState::Active && p.stats.sent > 0 {
                return Some(last);
            }
        }
        let mut fallback = None;
        for k in 0..n {
            let i = (self.rr + k) % n;
            let p = &self.paths[i];
            let room = (p.next_seq.diff(p.una) as u32) < (p.cwnd / CWND_ONE).max(1);
            if p.state != PathState::Active || !room {
                continue;
            }
            if Some(i) == avoid {
                fallback = Some(i);
                continue;
            }
            self.rr = (i + 1) % n;
            return Some(i);
        }
        fallback
    }

    /// Whether nothing is in flight, or nothing would be once the carried ACK not yet taken is
    /// (it reports every transmission of path `last`, and no other path has any in flight).
    fn idle_but_carried(&self, last: usize) -> bool {
        if self.una == self.nxt {
            let p = &self.paths[last];
            return p.next_seq == p.una;
        }
        let Some((.., ack)) = &self.carried else {
            return false;
        };
        usize::from(ack.path_id) == last
            && PathSeq(ack.cum_seq) == self.paths[last].next_seq
            && self.retx_head == self.retx_tail
            && self.paths[..usize::from(self.cfg.paths)]
                .iter()
                .enumerate()
                .all(|(i, p)| i == last || p.next_seq == p.una)
    }

    fn transmit_retx(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        while self.retx_head != self.retx_tail {
            let psn = self.retx[self.retx_head as usize % W];
            let live = self.in_tx_window(psn) && !self.pkts[psn.get() as usize % W].acked;
            if !live {
                // A stale entry: clear the flag only if the slot still holds this PSN.
                let pk = &mut self.pkts[psn.get() as usize % W];
                if pk.psn == psn {
                    pk.queued = false;
                }
                self.retx_head = self.retx_head.wrapping_add(1);
                continue;
            }
            let not_before = self.pkts[psn.get() as usize % W].not_before;
            if not_before > now {
                // Held back (receiver not ready): make sure a timer brings it. An earlier wake
                // may have fired for another packet and left none for this one.
                self.retx_wake = Some(self.retx_wake.map_or(not_before, |w| w.min(not_before)));
                return None;
            }
            let avoid = Some(usize::from(self.pkts[psn.get() as usize % W].path));
            let path = self.pick_path(avoid)?;
            self.retx_head = self.retx_head.wrapping_add(1);
            self.pkts[psn.get() as usize % W].queued = false;
            if self.pkts[psn.get() as usize % W].path == NO_PATH {
                // Sent again after a receiver-not-ready NACK, not after a loss.
                self.counters.rnr_retries += 1;
            }
            self.counters.retransmitted += 1;
            self.paths[path].stats.retransmitted += 1;
            return self.send_packet(now, buf, psn, path, true);
        }
        None
    }

    fn transmit_new(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if psn_diff(self.nxt, self.una) as usize >= W {
            return None;
        }
        // The oldest message with packets left to send, from the hint on.
        let ahead = self.send_hint.wrapping_sub(self.msg_head);
        let mut m = if ahead <= self.msg_tail.wrapping_sub(self.msg_head) {
            self.send_hint
        } else {
            self.msg_head
        };
        let found = loop {
            if m == self.msg_tail {
                return None;
            }
            if let Some(msg) = &self.msgs[m as usize % Q] {
                if !msg.done && msg.next_pkt < msg.npkts {
                    break m;
                }
            }
            m = m.wrapping_add(1);
        };
        self.send_hint = found;
        let path = self.pick_path(None)?;
        let psn = self.nxt;
        self.nxt = self.nxt.wrapping_add(1);
        let msg = self.msgs[found as usize % Q].as_mut()?;
        let idx = msg.next_pkt;
        msg.next_pkt += 1;
        msg.last_psn = Some(psn);
        self.pkts[psn.get() as usize % W] = TxPkt {
            psn,
            msg: found,
            idx,
            path: path as u8,
            ..TxPkt::default()
        };
        self.counters.data_sent += 1;
        self.send_packet(now, buf, psn, path, false)
    }

    fn send_packet(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        psn: Psn,
        path: usize,
        retransmit: bool,
    ) -> Option<Transmit> {
        let pk = self.pkts[psn.get() as usize % W];
        let msg = self.msgs[pk.msg as usize % Q]?;
        let p = &mut self.paths[path];
        let seq = p.next_seq;
        p.next_seq = seq.add(1);
        let slot = seq.0 as usize % PATH_RING;
        p.ring_psn[slot] = psn.get();
        p.ring_sent[slot] = now;
        p.stats.sent += 1;
        let pk = &mut self.pkts[psn.get() as usize % W];
        pk.path = path as u8;
        pk.seq = seq;
        pk.sent_at = now;
        let idx = pk.idx;

        let mtu = self.cfg.mtu;
        let offset = idx * mtu;
        let (len, opcode) = match msg.kind {
            MsgKind::Read => (0, Opcode::MrReadRequest),
            MsgKind::Atomic if msg.atomic.2 => (0, Opcode::MrCompareSwap),
            MsgKind::Atomic => (0, Opcode::MrFetchAdd),
            MsgKind::AtomicResponse => (0, Opcode::MrAtomicResponse),
            MsgKind::ReadResponse => (
                msg.len.saturating_sub(offset).min(mtu),
                Opcode::MrReadResponse,
            ),
            MsgKind::Send => (
                msg.len.saturating_sub(offset).min(mtu),
                if msg.imm.is_some() {
                    Opcode::MrSendImm
                } else {
                    Opcode::MrSend
                },
            ),
            MsgKind::Write => (
                msg.len.saturating_sub(offset).min(mtu),
                if msg.imm.is_some() {
                    Opcode::MrWriteImm
                } else {
                    Opcode::MrWrite
                },
            ),
        };
        // An acknowledgement that waits rides along when the packet stays within a full one.
        let piggy = if len as usize + PiggyAck::LEN <= mtu as usize {
            self.waiting_ack().map(|i| PiggyAck {
                cum_psn: self.rx_cum,
                ack: self.take_ack(i, now),
            })
        } else {
            None
        };
        if piggy.is_some() {
            self.counters.acks_piggybacked += 1;
        }
        let data = MrDataRepr {
            retransmit,
            ack: piggy.is_some(),
            path_id: path as u8,
            stream_id: msg.stream,
            path_seq: seq.0,
            msn: msg.msn,
            msg_offset: offset,
            msg_len: msg.len,
            timestamp: now as u32,
        };
        let remote = MrRemoteRepr {
            va: msg.remote.va,
            rkey: msg.remote.rkey,
        };
        let ext = match (opcode, msg.imm) {
            (Opcode::MrWrite | Opcode::MrReadRequest, _) => Extensions::MrRemote(data, remote),
            (Opcode::MrWriteImm, Some(i)) => Extensions::MrRemoteImm(data, remote, i),
            (Opcode::MrSendImm, Some(i)) => Extensions::MrDataImm(data, i),
            (Opcode::MrCompareSwap | Opcode::MrFetchAdd, _) => Extensions::MrAtomic(
                data,
                AtomicEthRepr {
                    va: msg.remote.va,
                    rkey: msg.remote.rkey,
                    swap_add: msg.atomic.0,
                    compare: msg.atomic.1,
                },
            ),
            (Opcode::MrAtomicResponse, _) => {
                Extensions::MrAtomicAck(data, AtomicAckEthRepr { orig: msg.atomic.0 })
            }
            _ => Extensions::MrData(data),
        };
        let pad = ((4 - len % 4) % 4) as u8;
        let last = idx + 1 == msg.npkts;
        let bth = self.bth(opcode, psn, pad, last);
        let addr = msg.local_addr + u64::from(offset);
        let mut tx = self.write_headers(buf, bth, ext, path, addr, len as usize)?;
        if let Some(p) = piggy {
            p.emit(buf.get_mut(tx.header_len..)?).ok()?;
            tx.header_len += PiggyAck::LEN;
            tx.len += PiggyAck::LEN;
        }
        Some(tx)
    }

    /// Adds the pad and the ICRC to a datagram whose headers came from
    /// [`Connection::poll_transmit`] and whose payload the runner has copied in after them.
    pub fn seal(&mut self, tx: &Transmit, buf: &mut [u8]) {
        let Some(datagram) = buf.get_mut(..tx.len) else {
            return;
        };
        let pad_at = tx.header_len + tx.payload_len;
        let icrc_at = tx.len - 4;
        datagram[pad_at..icrc_at].fill(0);
        let value = self.icrc_tx.icrc(
            (self.cfg.local_ip, self.cfg.remote_ip),
            (tx.src_port, self.cfg.dst_port),
            &datagram[..icrc_at],
            self.cfg.icrc_engine,
        );
        datagram[icrc_at..].copy_from_slice(&value.to_le_bytes());
    }

    // ----- receive ----------------------------------------------------------------------

    /// Handles an arrived datagram (BTH to ICRC) that came from UDP source port `src_port`, with
    /// `ce` when its IP header was marked Congestion Experienced. Returns what to place where, or
    /// why it was dropped.
    ///
    /// The ACK a data packet carries (flag A) is taken after the packet's own work: by the next
    /// call of this function, [`Connection::poll_transmit`] or [`Connection::handle_timeout`]
    /// (as of its arrival time; [`Connection::poll_timeout`] asks for the call at once). A runner
    /// that answers a ping at once (completion, post, [`Connection::poll_transmit_data`]) so
    /// sends the answer before the sender-side work of the ACK, which the answer does not need:
    /// until then the acknowledged requests count as in flight, which may hold back new data (a
    /// full window) or completions, never retransmit anything.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        src_port: u16,
        ce: bool,
        datagram: &[u8],
    ) -> Result<Delivery, DropReason> {
        self.abandon_atomic();
        self.settle_carried();
        let Some(view) = self.check_datagram(src_port, datagram) else {
            self.counters.drop_malformed += 1;
            return Err(DropReason::Malformed);
        };
        let bth = view.bth;
        if bth.dest_qp != self.cfg.local_qpn {
            self.counters.drop_wrong_qp += 1;
            return Err(DropReason::WrongQp);
        }
        if bth.pkey != self.cfg.pkey {
            self.counters.drop_wrong_pkey += 1;
            return Err(DropReason::WrongPkey);
        }
        if ce {
            self.counters.ecn_ce_received += 1;
        }
        match view.ext {
            Extensions::MrAck(ack) => self
                .on_ack(now, AckOrigin::Own { src_port }, bth.psn, &ack)
                .map(|()| Delivery::Nothing),
            Extensions::MrNack(nack) => self
                .on_nack(now, src_port, bth.psn, &nack)
                .map(|()| Delivery::Nothing),
            Extensions::MrProbe(probe) => self
                .on_probe(now, src_port, bth.opcode, &probe)
                .map(|()| Delivery::Nothing),
            _ => match view.ext.mr_data() {
                Some(data) => {
                    if let Some(p) = view.piggy {
                        self.counters.acks_piggyback_received += 1;
                        let origin = AckOrigin::Carried {
                            src_port,
                            via_path: data.path_id,
                        };
                        self.carried = Some((now, origin, p.cum_psn, p.ack));
                    }
                    self.on_data(
                        now,
                        ce,
                        src_port,
                        &bth,
                        &view.ext,
                        data,
                        view.payload_at,
                        view.payload_len,
                    )
                }
                None => {
                    self.counters.drop_other += 1;
                    Err(DropReason::UnsupportedOpcode)
                }
            },
        }
    }

    #[inline(always)]
    fn check_datagram(&mut self, src_port: u16, d: &[u8]) -> Option<Checked> {
        if d.len() < BthRepr::LEN + 4 {
            return None;
        }
        let (bth, rest) = BthRepr::parse(d).ok()?;
        let (ext, body) = Extensions::parse(Opcode::layout_of(d[0]), rest).ok()?;
        let (piggy, body) = match ext.mr_data() {
            Some(data) if data.ack => {
                let (p, body) = PiggyAck::parse(body).ok()?;
                (Some(p), body)
            }
            _ => (None, body),
        };
        let payload_and_pad = body.len().checked_sub(4)?;
        let payload_len = payload_and_pad.checked_sub(usize::from(bth.pad_count))?;
        if self.cfg.verify_icrc {
            let icrc_at = d.len() - 4;
            let stored =
                u32::from_le_bytes([d[icrc_at], d[icrc_at + 1], d[icrc_at + 2], d[icrc_at + 3]]);
            let computed = self.icrc_rx.icrc(
                (self.cfg.remote_ip, self.cfg.local_ip),
                (src_port, self.cfg.local_port),
                &d[..icrc_at],
                self.cfg.icrc_engine,
            );
            if stored != computed {
                return None;
            }
        }
        Some(Checked {
            bth,
            ext,
            piggy,
            payload_at: d.len() - 4 - payload_and_pad,
            payload_len,
        })
    }

    /// A probe from the peer (answered from any port: after a failover the peer's path probes
    /// from its new port), or the reply to ours, which counts only if it names the probe that is
    /// outstanding and echoes its timestamp. Such a reply also teaches the port the peer's path
    /// now sends from.
    fn on_probe(
        &mut self,
        now: Instant,
        src_port: u16,
        opcode: Opcode,
        probe: &MrProbeRepr,
    ) -> Result<(), DropReason> {
        let i = self.known_path(probe.path_id)?;
        if opcode == Opcode::MrProbe {
            let rx = &mut self.rx_paths[i];
            rx.probe_reply = Some((probe.probe_seq, probe.timestamp));
            // And an ACK echoing the probe: it reports what arrived on the path before it.
            rx.ts = probe.timestamp;
            rx.ts_at = now;
            self.acks_now.insert(i);
            self.control_dirty = true;
            return Ok(());
        }
        let p = &mut self.paths[i];
        if p.probe_superseded == Some((probe.probe_seq, probe.ts_echo)) {
            p.probe_superseded = None;
            return Ok(());
        }
        if !p.probe_outstanding || probe.probe_seq != p.probe_seq || probe.ts_echo != p.probe_ts {
            self.counters.drop_bad_probe += 1;
            return Err(DropReason::Inconsistent);
        }
        p.probe_outstanding = false;
        self.rx_paths[i].peer_port = Some(src_port);
        if p.state == PathState::Probing {
            p.state = PathState::Active;
            p.timeouts_in_row = 0;
            p.probes_unanswered = 0;
            let rtt = u64::from((now as u32).wrapping_sub(probe.ts_echo));
            rtt_sample(p, rtt);
            if p.failed {
                p.failed = false;
                self.push_event(Event::PathRestored { path: i as u8 });
            }
        }
        Ok(())
    }

    /// Path `path_id` as an index, if this connection has it (otherwise counted and refused).
    fn known_path(&mut self, path_id: u8) -> Result<usize, DropReason> {
        let i = usize::from(path_id);
        if i >= usize::from(self.cfg.paths) {
            self.counters.drop_other += 1;
            return Err(DropReason::UnknownPath);
        }
        Ok(i)
    }

    /// Whether a control packet for path `i` (an ACK, a NACK) comes from the port the peer's
    /// path sends from; until that is known, any port (the first packet that passes every other
    /// check teaches it).
    fn on_path_port(&mut self, i: usize, src_port: u16) -> bool {
        let ok = self.rx_paths[i].peer_port.is_none_or(|p| p == src_port);
        if !ok {
            self.counters.drop_wrong_port += 1;
        }
        ok
    }

    /// Whether `seq` is one of the last [`SEQ_HISTORY`] sequence numbers sent on path `i`.
    fn was_sent(&self, i: usize, seq: PathSeq) -> bool {
        let p = &self.paths[i];
        let behind = p.next_seq.diff(seq);
        behind >= 1 && behind as u64 <= p.stats.sent.min(SEQ_HISTORY)
    }

    /// A NACK. As responder: the requester's confirmation of a refusal we hold, which must
    /// name it exactly. As requester: a refusal of one of our packets, which must name a PSN we
    /// sent and a transmission of it on the path it names; a fatal one is confirmed (also when
    /// repeated) and fails its message.
    fn on_nack(
        &mut self,
        now: Instant,
        src_port: u16,
        psn: Psn,
        nack: &MrNackRepr,
    ) -> Result<(), DropReason> {
        let i = self.known_path(nack.path_id)?;
        // A confirmation must name a held refusal exactly, which no port adds to; and the
        // requester's path may have moved to a new port since (its confirmations go on the
        // refused packet's path).
        if nack.reason != NackReason::RefusalSeen && !self.on_path_port(i, src_port) {
            return Err(DropReason::WrongPort);
        }
        if nack.reason == NackReason::RefusalSeen {
            // As responder: the requester has our refusal of `psn`.
            let Some(slot) = self.refusals.iter_mut().find(|r| {
                r.is_some_and(|r| {
                    r.pending.psn == psn
                        && r.pending.nack
                            == MrNackRepr {
                                reason: r.pending.nack.reason,
                                ..*nack
                            }
                })
            }) else {
                self.counters.drop_bad_nack += 1;
                return Err(DropReason::Inconsistent);
            };
            *slot = None;
            self.refusals_held -= 1;
            self.counters.nacks_received += 1;
            self.counters.refusals_confirmed += 1;
            if self.refusals_held == 0 {
                // The requester's window waits for an ACK without the refusals flag.
                self.acks_now.insert(i);
                self.control_dirty = true;
            }
            return Ok(());
        }
        let fatal = nack.reason != NackReason::ReceiverNotReady;
        // The window cannot have passed a fatally refused PSN: it moves only on ACKs without the
        // refusals flag, which come after our confirmation. Just behind the window means a
        // repeat whose confirmation was lost: confirmed again, nothing more.
        let in_window = self.in_tx_window(psn);
        let repeat = !in_window && fatal && (-(W as i32)..0).contains(&psn_diff(psn, self.una));
        let consistent = (in_window || repeat) && self.was_sent(i, PathSeq(nack.path_seq));
        if fatal {
            // As requester: confirm every fatal refusal, also a repeated one (the previous
            // confirmation may have been lost), and also one of a packet this end never sent (a
            // forgery the peer refused): the peer holds it, and flags every ACK, until confirmed.
            // A confirmation acts only where it names a refusal exactly. The unverified ones share
            // one slot, so that forged NACKs cannot crowd out the rest.
            let confirm = PendingNack {
                path: nack.path_id,
                psn,
                nack: MrNackRepr {
                    reason: NackReason::RefusalSeen,
                    ..*nack
                },
            };
            if !consistent {
                self.unverified_confirm = Some(confirm);
                self.control_dirty = true;
            } else if !self
                .nacks
                .iter()
                .flatten()
                .any(|q| q.psn == confirm.psn && q.nack == confirm.nack)
            {
                if let Some(slot) = self.nacks.iter_mut().find(|s| s.is_none()) {
                    *slot = Some(confirm);
                    self.control_dirty = true;
                }
            }
        }
        if !consistent {
            self.counters.drop_bad_nack += 1;
            return Err(DropReason::Inconsistent);
        }
        self.counters.nacks_received += 1;
        self.rx_paths[i].peer_port = Some(src_port);
        if repeat {
            return Ok(());
        }
        let idx = psn.get() as usize % W;
        if nack.reason == NackReason::ReceiverNotReady {
            self.pkts[idx].acked = false;
            // Forget which transmission this was, so that its ACK cannot mark it delivered.
            self.pkts[idx].path = NO_PATH;
            let wake = now + self.cfg.rnr_delay;
            self.queue_retx(psn, wake);
            self.retx_wake = Some(self.retx_wake.map_or(wake, |w| w.min(wake)));
            return Ok(());
        }
        if let Some(m) = self.msgs[self.pkts[idx].msg as usize % Q].as_mut() {
            if !m.done {
                m.done = true;
                m.status = Status::Refused(nack.reason);
                m.next_pkt = m.npkts;
            }
        }
        self.complete_in_order();
        Ok(())
    }

    /// ECN AIMD on path `i`: an ACK reporting marks halves its window, at most once per RTT
    /// (a window's worth of marks is one congestion event); unmarked ACKs add one packet per
    /// window acknowledged.
    fn congestion(&mut self, i: usize, now: Instant, marked: bool, acked: u32) {
        let max = self.cfg.window_per_path * CWND_ONE;
        let rto_low = self.cfg.rto_low;
        let p = &mut self.paths[i];
        if marked {
            // The smoothed RTT once there is a sample (it may round to 0 on a local link).
            let rtt = if p.stats.rtt_min > 0 { p.srtt } else { rto_low };
            if p.cwnd > CWND_ONE && p.cwnd_cut_at.is_none_or(|t| now.saturating_sub(t) >= rtt) {
                p.cwnd = (p.cwnd / 2).max(CWND_ONE);
                p.cwnd_cut_at = Some(now);
                p.stats.cwnd_cuts += 1;
                self.counters.cwnd_cuts += 1;
            }
        } else if acked > 0 && p.cwnd < max {
            let inc = (acked.min(PATH_RING as u32) * CWND_ONE * CWND_ONE / p.cwnd).max(1);
            p.cwnd = (p.cwnd + inc).min(max);
        }
    }

    /// Takes the ACK the last data packet carried, if it has not been taken yet.
    fn settle_carried(&mut self) {
        if let Some((at, origin, cum_psn, ack)) = self.carried.take() {
            // A carried ACK that fails its checks is counted there; its packet stands.
            let _ = self.on_ack(at, origin, cum_psn, &ack);
        }
    }

    /// Whether an ACK for path `i` names only what was sent: its cumulative point among the
    /// path's last numbers sent (or at the next one), every bit of its bitvector below the next
    /// number, and a cumulative PSN not past the next PSN.
    /// `highest_bit` is the ACK's highest SACK bit.
    fn ack_is_consistent(
        &self,
        i: usize,
        cum_psn: Psn,
        ack: &MrAckRepr,
        highest_bit: Option<usize>,
    ) -> bool {
        let p = &self.paths[i];
        let behind = p.next_seq.diff(PathSeq(ack.cum_seq));
        let cum_ok = behind == 0 || self.was_sent(i, PathSeq(ack.cum_seq));
        let bits_ok = highest_bit.is_none_or(|b| (b as i64) + 1 < behind as i64);
        cum_ok && bits_ok && psn_diff(cum_psn, self.nxt) <= 0
    }

    fn on_ack(
        &mut self,
        now: Instant,
        origin: AckOrigin,
        cum_psn: Psn,
        ack: &MrAckRepr,
    ) -> Result<(), DropReason> {
        let i = self.known_path(ack.path_id)?;
        // An ACK of its own comes from the port of the path it acknowledges; a carried one rides
        // on a data packet of any path, from that path's port.
        let (port_path, src_port) = match origin {
            AckOrigin::Own { src_port } => (i, src_port),
            AckOrigin::Carried { src_port, via_path } => (usize::from(via_path), src_port),
        };
        if port_path >= usize::from(self.cfg.paths) || !self.on_path_port(port_path, src_port) {
            return Err(DropReason::WrongPort);
        }
        let highest_bit = highest_sack_bit(&ack.sack);
        if !self.ack_is_consistent(i, cum_psn, ack, highest_bit) {
            self.counters.drop_bad_ack += 1;
            return Err(DropReason::Inconsistent);
        }
        if let AckOrigin::Own { src_port } = origin {
            self.rx_paths[i].peer_port = Some(src_port);
        }
        self.paths[i].last_ack_at = self.paths[i].last_ack_at.max(now);
        self.counters.ecn_marks_echoed += u64::from(ack.ce_count);
        self.paths[i].stats.ecn_marks += u64::from(ack.ce_count);
        let cum = PathSeq(ack.cum_seq);
        let (una, next) = (self.paths[i].una, self.paths[i].next_seq);
        // The highest transmission this ACK reports as arrived.
        let highest = match highest_bit {
            Some(bit) => cum.add(1 + bit as u32),
            None => cum.add(u32::MAX), // cum - 1
        };
        let mut newly_acked = false;
        let mut acked_now = 0u32;
        // When the oldest transmission this ACK newly reports left: an RTT sample cannot be
        // longer than its age (an echoed timestamp older than that is not one of ours).
        let mut oldest_sent = now;
        let mut newest_sent = 0;
        let mut s = una;
        while s != next && !highest.before(s) {
            let slot = s.0 as usize % PATH_RING;
            let raw = self.paths[i].ring_psn[slot];
            if raw != NO_PSN {
                let d = s.diff(cum);
                let arrived = d < 0
                    || (d >= 1 && {
                        let b = (d - 1) as usize;
                        b < SACK_BITS && ack.sack[b / 8] & (1 << (b % 8)) != 0
                    });
                if arrived {
                    oldest_sent = oldest_sent.min(self.paths[i].ring_sent[slot]);
                    newest_sent = newest_sent.max(self.paths[i].ring_sent[slot]);
                    self.paths[i].ring_psn[slot] = NO_PSN;
                    self.paths[i].stats.acked += 1;
                    acked_now += 1;
                    let psn = Psn::new(raw);
                    let pk = &self.pkts[psn.get() as usize % W];
                    // Only the packet's latest transmission counts: an older one may have been
                    // refused for want of a receive buffer and be waiting to go again.
                    let latest = usize::from(pk.path) == i && pk.seq == s;
                    if self.in_tx_window(psn) && !pk.acked && latest {
                        self.pkts[psn.get() as usize % W].acked = true;
                        self.counters.acked += 1;
                        if d >= 1 {
                            self.counters.sacked += 1;
                        }
                    }
                    newly_acked = true;
                } else {
                    // Below a transmission that arrived on the same in-order path: lost.
                    self.declare_lost(i, s, now);
                }
            }
            s = s.add(1);
        }
        self.settle_path_una(i);
        if newest_sent > self.rack_sent {
            self.rack_sent = newest_sent;
            self.rack_dirty = true;
        }
        self.congestion(i, now, ack.ce_count > 0 || ack.ece, acked_now);
        let p = &mut self.paths[i];
        if newly_acked {
            p.timeouts_in_row = 0;
            let rtt = u64::from(
                (now as u32)
                    .wrapping_sub(ack.ts_echo)
                    .wrapping_sub(ack.ack_delay),
            );
            if rtt <= now.saturating_sub(oldest_sent) {
                rtt_sample(p, rtt);
            }
        }
        if self.paths[i].tail_probe_ts == Some(ack.ts_echo) {
            // The ACK the tail probe triggered: the path is alive, and whatever left before the
            // probe and is still unacknowledged was lost.
            let p = &mut self.paths[i];
            p.timeouts_in_row = 0;
            p.timer_from = now;
            self.lose_before_tail_probe(i, now);
        }
        // The connection-level cumulative PSN: what the peer has accepted for good. While the
        // peer holds refusals we have not confirmed, it may cover refused packets: wait.
        if !ack.refusals && psn_diff(cum_psn, self.peer_cum) > 0 {
            self.peer_cum = cum_psn;
        }
        self.advance_window();
        Ok(())
    }

    /// How long after it left a transmission on path `i` is overdue once a later one is
    /// acknowledged: the path's smoothed round trip and four times its variation (the
    /// retransmission timeout without its floors), and the longest a receiver holds an ACK back.
    fn overdue_after(&self, i: usize) -> u64 {
        let p = &self.paths[i];
        // A path without an RTT sample yet (its first flight may be the one lost) takes the
        // fastest measured path's: the paths cross the same fabric.
        let measured = if p.stats.rtt_min > 0 {
            Some(p)
        } else {
            self.paths[..usize::from(self.cfg.paths)]
                .iter()
                .filter(|q| q.stats.rtt_min > 0)
                .min_by_key(|q| q.srtt)
        };
        match measured {
            Some(q) => q.srtt + 4 * q.rttvar + self.cfg.ack_delay,
            None => self.cfg.rto_low + self.cfg.ack_delay,
        }
    }

    /// The oldest unresolved transmission of path `i` that left before the latest acknowledged
    /// one: its sequence number and when it becomes overdue.
    fn overdue_candidate(&self, i: usize) -> Option<(PathSeq, Instant)> {
        let p = &self.paths[i];
        if p.state != PathState::Active || p.una == p.next_seq {
            return None;
        }
        let slot = p.una.0 as usize % PATH_RING;
        let sent = p.ring_sent[slot];
        // Measured from the later of its departure and the path's last ACK: a path that is still
        // acknowledging (its ACK of this packet was lost, or is behind) is left to its SACK.
        (p.ring_psn[slot] != NO_PSN && sent < self.rack_sent)
            .then(|| (p.una, sent.max(p.last_ack_at) + self.overdue_after(i)))
    }

    fn overdue_at(&self, i: usize) -> Option<Instant> {
        let p = &self.paths[i];
        if p.tail_probe_pending {
            return None;
        }
        let (_, at) = self.overdue_candidate(i)?;
        Some(match p.tail_probe_ts {
            // A tail probe is out: its answer is due a round trip after it left.
            Some(_) => p.tail_probe_at + self.overdue_after(i),
            None => at,
        })
    }

    /// Time-ordered loss detection across paths, in the manner of RACK: a transmission still
    /// unresolved although one that left after it, on any path, has been acknowledged, while its
    /// own path has been silent for a round trip (plus variation and ACK delay), is lost. A run of losses
    /// that takes a path's whole flight leaves no later packet on that path to show a SACK gap;
    /// the other paths show it, in about a round trip instead of a retransmission timeout. It runs
    /// after a batch of arrivals (from `poll_transmit`) and from the timer, not inside each ACK: a
    /// peer that was stalled answers for every path at once, and the first of those ACKs must not
    /// condemn what the next ones acknowledge.
    fn detect_overdue(&mut self, now: Instant) {
        self.rack_dirty = false;
        for i in 0..usize::from(self.cfg.paths) {
            while let Some((seq, due)) = self.overdue_candidate(i) {
                // A packet the peer's cumulative PSN already covers arrived: its path ACK is
                // only late. Resolve it without counting it lost.
                let slot = seq.0 as usize % PATH_RING;
                let raw = self.paths[i].ring_psn[slot];
                if !self.in_tx_window(Psn::new(raw)) || self.pkts[raw as usize % W].acked {
                    self.paths[i].ring_psn[slot] = NO_PSN;
                    self.settle_path_una(i);
                    continue;
                }
                let wait = self.overdue_after(i);
                let p = &mut self.paths[i];
                if p.tail_probe_pending {
                    break;
                }
                if p.tail_probe_ts.is_some() {
                    // A probe is out. Its answer settles the path; none within a round trip
                    // means the probe or its answer was lost, or the route lost what left before
                    // it. One more probe tells which (a lost probe or answer must not cost a
                    // window of needless retransmissions); when it is not answered either, what
                    // left before the first is declared lost, not at the retransmission timeout.
                    if now < p.tail_probe_at + wait {
                        break;
                    }
                    if p.tail_probe_tries < TAIL_PROBE_TRIES {
                        p.tail_probe_pending = true;
                        self.control_dirty = true;
                        break;
                    }
                    // The probe counts as the first silence, its lack of answer as the second:
                    // a dead route fails over as it would by its timeouts, only sooner.
                    p.timeouts_in_row = p.timeouts_in_row.max(1);
                    self.lose_before_tail_probe(i, now);
                    self.path_silent(i, now);
                    continue;
                }
                // Overdue: probe the path's tail now rather than at its retransmission timeout.
                // The ACK the probe triggers says exactly what arrived before it; the rest is
                // declared lost then (a lost ACK must not cost a window of needless
                // retransmissions).
                if now >= due {
                    p.tail_probe_pending = true;
                    p.timer_from = now;
                    self.counters.overdue_probes += 1;
                    self.control_dirty = true;
                }
                break;
            }
        }
    }

    /// Ends path `i`'s tail probe: whatever left before it and is still unresolved was lost (the
    /// probe's ACK did not report it, or no answer came).
    fn lose_before_tail_probe(&mut self, i: usize, now: Instant) {
        let p = &mut self.paths[i];
        p.tail_probe_ts = None;
        p.tail_probe_tries = 0;
        let (before, una, next) = (p.tail_probe_cut, p.una, p.next_seq);
        let mut s = una;
        while s != next {
            let p = &self.paths[i];
            let slot = s.0 as usize % PATH_RING;
            if p.ring_psn[slot] != NO_PSN && p.ring_sent[slot] <= before {
                self.declare_lost(i, s, now);
            }
            s = s.add(1);
        }
        self.settle_path_una(i);
    }

    /// Declares transmission `seq` on path `i` lost (a gap, or left before a tail probe).
    fn declare_lost(&mut self, i: usize, seq: PathSeq, now: Instant) {
        self.drop_transmission(i, seq, now);
        self.paths[i].stats.lost += 1;
        self.counters.lost_by_sack += 1;
    }

    /// Moves a path's oldest unresolved transmission past resolved ones.
    fn settle_path_una(&mut self, i: usize) {
        let p = &mut self.paths[i];
        while p.una != p.next_seq && p.ring_psn[p.una.0 as usize % PATH_RING] == NO_PSN {
            p.una = p.una.add(1);
        }
    }

    fn advance_window(&mut self) {
        while self.una != self.peer_cum {
            let idx = self.una.get() as usize % W;
            let pk = self.pkts[idx];
            self.pkts[idx].acked = true;
            if let Some(m) = self.msgs[pk.msg as usize % Q].as_mut() {
                if m.last_psn == Some(self.una)
                    && m.next_pkt == m.npkts
                    && !matches!(m.kind, MsgKind::Read | MsgKind::Atomic)
                {
                    m.done = true;
                }
            }
            self.una = self.una.wrapping_add(1);
        }
        self.complete_in_order();
    }

    /// Reports finished messages in order within each stream and frees the ring's head.
    fn complete_in_order(&mut self) {
        let mut blocked = [false; S];
        let mut m = self.msg_head;
        while m != self.msg_tail {
            let slot = m as usize % Q;
            let Some(msg) = self.msgs[slot] else {
                m = m.wrapping_add(1);
                continue;
            };
            let s = usize::from(msg.stream) % S;
            if !msg.reported && msg.done && !blocked[s] {
                if let Some(x) = self.msgs[slot].as_mut() {
                    x.reported = true;
                }
                let kind = match msg.kind {
                    MsgKind::Send => Some(CompletionKind::Send),
                    MsgKind::Write => Some(CompletionKind::Write),
                    MsgKind::Read => Some(CompletionKind::Read),
                    MsgKind::Atomic => Some(CompletionKind::Atomic),
                    MsgKind::ReadResponse | MsgKind::AtomicResponse => None,
                };
                if let Some(kind) = kind {
                    self.push_event(Event::Completion(Completion {
                        id: msg.wr_id,
                        status: msg.status,
                        kind,
                        byte_len: msg.len,
                        imm: msg.imm,
                        stream: msg.stream,
                    }));
                }
            } else if !msg.reported {
                blocked[s] = true;
            }
            m = m.wrapping_add(1);
        }
        // Free reported messages at the head whose packets have all left the window.
        while self.msg_head != self.msg_tail {
            let slot = self.msg_head as usize % Q;
            let free = match self.msgs[slot] {
                None => true,
                Some(msg) => msg.reported && msg.last_psn.is_none_or(|l| !self.in_tx_window(l)),
            };
            if !free {
                break;
            }
            self.msgs[slot] = None;
            self.msg_head = self.msg_head.wrapping_add(1);
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn on_data(
        &mut self,
        now: Instant,
        ce: bool,
        src_port: u16,
        bth: &BthRepr,
        ext: &Extensions,
        data: MrDataRepr,
        payload_at: usize,
        payload_len: usize,
    ) -> Result<Delivery, DropReason> {
        let i = self.known_path(data.path_id)?;
        let offset_psn = psn_diff(bth.psn, self.rx_cum);
        if offset_psn >= W as i32 {
            self.counters.drop_out_of_window += 1;
            return Err(DropReason::OutOfWindow);
        }
        // The PSN and the duplicate are checked before any path state moves. A duplicate still
        // enters the path's bitvector (a spurious retransmission must be acknowledged on the path
        // that carried it), but it never slides the path's window: only a new packet in the
        // receive window may (a forged old PSN with a far path sequence would otherwise give up
        // on every missing number of the path).
        let duplicate = offset_psn < 0 || self.rx_seen[bth.psn.get() as usize % W];
        let rx = &mut self.rx_paths[i];
        if duplicate && PathSeq(data.path_seq).diff(rx.sack.cumulative()) > SACK_BITS as i32 {
            self.counters.duplicates += 1;
            return Err(DropReason::Duplicate);
        }
        let arrival = rx.sack.insert(PathSeq(data.path_seq));
        rx.unacked += 1;
        // What the ACK echoes (the timestamp, the CE marks) comes from new packets only: a
        // duplicate is what a forger can produce without guessing the window.
        let marked = ce && !duplicate;
        if !duplicate {
            rx.ts = data.timestamp;
            rx.ts_at = now;
        }
        if marked {
            rx.ce = rx.ce.saturating_add(1);
            rx.ece = true;
        }
        let urgent = marked || bth.ack_req || arrival != Arrival::InOrder || rx.sack.has_gap();
        if urgent || rx.unacked >= self.cfg.ack_every {
            self.acks_now.insert(i);
            self.control_dirty = true;
        } else if rx.ack_due.is_none() {
            rx.ack_due = Some(now + self.cfg.ack_delay);
            self.acks_due.insert(i);
        }
        if duplicate {
            self.counters.duplicates += 1;
            return Err(DropReason::Duplicate);
        }
        let stream = usize::from(data.stream_id);
        if stream >= S {
            return self.refuse(bth.psn, i, &data, NackReason::InvalidRequest, true);
        }
        let end = u64::from(data.msg_offset) + payload_len as u64;
        if end > u64::from(data.msg_len) {
            return self.refuse(bth.psn, i, &data, NackReason::InvalidRequest, true);
        }
        let delivery = match bth.opcode {
            Opcode::MrWrite | Opcode::MrWriteImm => {
                let Some(remote) = remote_of(ext) else {
                    return self.refuse(bth.psn, i, &data, NackReason::InvalidRequest, true);
                };
                let len = u64::from(data.msg_len);
                let addr =
                    match self.check_region(remote.rkey, remote.va, len, Access::REMOTE_WRITE) {
                        Ok(base) => base + u64::from(data.msg_offset),
                        Err(reason) => return self.refuse(bth.psn, i, &data, reason, true),
                    };
                if bth.opcode == Opcode::MrWriteImm {
                    if let Err(reason) = self.receive_into(&data, payload_len, ext.immdt(), true) {
                        return self.refuse_receive(bth.psn, i, &data, reason);
                    }
                }
                Delivery::Place {
                    addr,
                    offset: payload_at,
                    len: payload_len,
                }
            }
            Opcode::MrSend | Opcode::MrSendImm => {
                match self.receive_into(&data, payload_len, ext.immdt(), false) {
                    Ok(addr) => Delivery::Place {
                        addr,
                        offset: payload_at,
                        len: payload_len,
                    },
                    Err(reason) => return self.refuse_receive(bth.psn, i, &data, reason),
                }
            }
            Opcode::MrReadRequest => {
                let Some(remote) = remote_of(ext) else {
                    return self.refuse(bth.psn, i, &data, NackReason::InvalidRequest, true);
                };
                let len = u64::from(data.msg_len);
                let va = match self.check_region(remote.rkey, remote.va, len, Access::REMOTE_READ) {
                    Ok(va) => va,
                    Err(reason) => return self.refuse(bth.psn, i, &data, reason, true),
                };
                if self.msg_tail.wrapping_sub(self.msg_head) as usize >= Q {
                    return self.refuse(bth.psn, i, &data, NackReason::ReceiverNotReady, false);
                }
                let npkts = data.msg_len.div_ceil(self.cfg.mtu).max(1);
                let mut m = TxMsg::response(MsgKind::ReadResponse, data.stream_id, data.msn, npkts);
                m.local_addr = va;
                m.len = data.msg_len;
                self.push_response(m);
                Delivery::Nothing
            }
            Opcode::MrReadResponse => self.read_response(&data, payload_at, payload_len),
            Opcode::MrCompareSwap | Opcode::MrFetchAdd => {
                let Extensions::MrAtomic(_, a) = *ext else {
                    return self.refuse(bth.psn, i, &data, NackReason::InvalidRequest, true);
                };
                if a.va % 8 != 0 {
                    return self.refuse(bth.psn, i, &data, NackReason::InvalidRequest, true);
                }
                let addr = match self.check_region(a.rkey, a.va, 8, Access::REMOTE_ATOMIC) {
                    Ok(addr) => addr,
                    Err(reason) => return self.refuse(bth.psn, i, &data, reason, true),
                };
                // Atomics execute in order after everything sent before them (as Verbs orders
                // them): one that overtook an earlier packet on another path waits, answered
                // receiver-not-ready, and comes again.
                if offset_psn != 0 || self.msg_tail.wrapping_sub(self.msg_head) as usize >= Q {
                    return self.refuse(bth.psn, i, &data, NackReason::ReceiverNotReady, false);
                }
                self.pending_atomic = Some(PendingAtomic {
                    stream: data.stream_id,
                    msn: data.msn,
                    psn: bth.psn,
                    path: i as u8,
                    path_seq: data.path_seq,
                });
                let compare = (bth.opcode == Opcode::MrCompareSwap).then_some(a.compare);
                Delivery::Atomic {
                    addr,
                    compare,
                    swap_add: a.swap_add,
                }
            }
            Opcode::MrAtomicResponse => match *ext {
                Extensions::MrAtomicAck(_, orig) => self.atomic_response(&data, orig.orig),
                _ => Delivery::Nothing,
            },
            _ => {
                self.counters.drop_other += 1;
                return Err(DropReason::UnsupportedOpcode);
            }
        };
        self.accept(bth.psn);
        // A new packet in the receive window: the port its path sends from (see
        // `on_path_port`).
        self.rx_paths[i].peer_port = Some(src_port);
        self.counters.data_received += 1;
        if let Delivery::Place { len, .. } = delivery {
            self.counters.bytes_placed += len as u64;
        }
        Ok(delivery)
    }

    /// Marks a PSN received and advances the cumulative PSN.
    fn accept(&mut self, psn: Psn) {
        self.rx_seen[psn.get() as usize % W] = true;
        while self.rx_seen[self.rx_cum.get() as usize % W] {
            self.rx_seen[self.rx_cum.get() as usize % W] = false;
            self.rx_cum = self.rx_cum.wrapping_add(1);
        }
    }

    /// Checks a remote access against the region table, counting a violation.
    fn check_region(
        &mut self,
        key: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<u64, NackReason> {
        self.regions
            .check(key, va, len, need)
            .inspect_err(|_| self.counters.access_violations += 1)
    }

    /// Refuses a Send or Write-with-immediate that found no usable receive buffer: waiting for
    /// one is transient, anything else is fatal.
    fn refuse_receive(
        &mut self,
        psn: Psn,
        path: usize,
        data: &MrDataRepr,
        reason: NackReason,
    ) -> Result<Delivery, DropReason> {
        let fatal = reason != NackReason::ReceiverNotReady;
        self.refuse(psn, path, data, reason, fatal)
    }

    /// Refuses a packet with a NACK. A fatal refusal consumes the PSN (nothing is placed, the
    /// connection goes on); a transient one leaves it to be sent again.
    fn refuse(
        &mut self,
        psn: Psn,
        path: usize,
        data: &MrDataRepr,
        reason: NackReason,
        fatal: bool,
    ) -> Result<Delivery, DropReason> {
        let nack = MrNackRepr {
            path_id: path as u8,
            reason,
            path_seq: data.path_seq,
            stream_id: data.stream_id,
            msn: data.msn,
        };
        let pending = PendingNack {
            path: path as u8,
            psn,
            nack,
        };
        if fatal {
            // Kept, and repeated, until the requester confirms it: until then no ACK lets the
            // requester count this PSN as accepted.
            let Some(slot) = self.refusals.iter_mut().find(|r| r.is_none()) else {
                // Too many unconfirmed: do not accept it now; it comes again.
                self.counters.drop_refusals_full += 1;
                return Err(DropReason::RefusalsFull);
            };
            *slot = Some(Refusal { pending, due: None });
            self.refusals_held += 1;
            self.accept(psn);
        } else if let Some(slot) = self.nacks.iter_mut().find(|s| s.is_none()) {
            *slot = Some(pending);
        }
        self.control_dirty = true;
        Ok(Delivery::Nothing)
    }

    /// Matches a Send or Write-with-immediate packet to the receive buffer posted for its MSN and
    /// returns where its payload goes.
    fn receive_into(
        &mut self,
        data: &MrDataRepr,
        payload_len: usize,
        imm: Option<u32>,
        write_imm: bool,
    ) -> Result<u64, NackReason> {
        let s = &mut self.rx_streams[usize::from(data.stream_id)];
        let ahead = data.msn.wrapping_sub(s.completed);
        if ahead >= s.posted.wrapping_sub(s.completed) {
            return Err(if ahead < 1 << 31 {
                NackReason::ReceiverNotReady
            } else {
                NackReason::InvalidRequest
            });
        }
        let slot = &mut s.slots[data.msn as usize % Q];
        if !write_imm && data.msg_len > slot.cap {
            return Err(NackReason::MessageTooLong);
        }
        if slot.started && slot.msg_len != data.msg_len {
            return Err(NackReason::InvalidRequest);
        }
        slot.started = true;
        slot.msg_len = data.msg_len;
        slot.write_imm = write_imm;
        if imm.is_some() {
            slot.imm = imm;
        }
        let addr = slot.addr + u64::from(data.msg_offset);
        slot.got += payload_len as u32;
        if slot.got == slot.msg_len {
            slot.done = true;
            self.complete_receives(usize::from(data.stream_id));
        }
        Ok(addr)
    }

    fn complete_receives(&mut self, stream: usize) {
        loop {
            let s = &mut self.rx_streams[stream];
            if s.completed == s.posted {
                return;
            }
            let slot = s.slots[s.completed as usize % Q];
            if !slot.done {
                return;
            }
            s.completed = s.completed.wrapping_add(1);
            self.push_event(Event::Completion(Completion {
                id: slot.id,
                status: slot.status.map_or(Status::Success, Status::Refused),
                kind: if slot.write_imm {
                    CompletionKind::RecvWriteImm
                } else {
                    CompletionKind::Recv
                },
                byte_len: slot.msg_len,
                imm: slot.imm,
                stream: stream as u16,
            }));
        }
    }

    /// Reports the original value of the atomic the last [`Delivery::Atomic`] asked for; the
    /// response goes back to the requester reliably.
    pub fn atomic_result(&mut self, orig: u64) {
        let Some(p) = self.pending_atomic.take() else {
            return;
        };
        let mut m = TxMsg::response(MsgKind::AtomicResponse, p.stream, p.msn, 1);
        m.len = 8;
        m.atomic = (orig, 0, false);
        self.push_response(m);
    }

    /// An atomic the runner was asked to perform but never reported: refuse it.
    fn abandon_atomic(&mut self) {
        if let Some(p) = self.pending_atomic.take() {
            let data = MrDataRepr {
                path_seq: p.path_seq,
                stream_id: p.stream,
                msn: p.msn,
                ..MrDataRepr::default()
            };
            let _ = self.refuse(
                p.psn,
                usize::from(p.path),
                &data,
                NackReason::RemoteOperational,
                true,
            );
        }
    }

    fn atomic_response(&mut self, data: &MrDataRepr, orig: u64) -> Delivery {
        let mut m = self.msg_head;
        while m != self.msg_tail {
            if let Some(msg) = self.msgs[m as usize % Q].as_mut() {
                if msg.kind == MsgKind::Atomic
                    && msg.stream == data.stream_id
                    && msg.msn == data.msn
                    && !msg.done
                {
                    msg.done = true;
                    let addr = msg.local_addr;
                    self.complete_in_order();
                    return Delivery::Value { addr, value: orig };
                }
            }
            m = m.wrapping_add(1);
        }
        Delivery::Nothing
    }

    fn read_response(
        &mut self,
        data: &MrDataRepr,
        payload_at: usize,
        payload_len: usize,
    ) -> Delivery {
        let mut m = self.msg_head;
        while m != self.msg_tail {
            let slot = m as usize % Q;
            if let Some(msg) = self.msgs[slot].as_mut() {
                if msg.kind == MsgKind::Read
                    && msg.stream == data.stream_id
                    && msg.msn == data.msn
                    && !msg.done
                {
                    if u64::from(data.msg_offset) + payload_len as u64 > u64::from(msg.len) {
                        return Delivery::Nothing;
                    }
                    msg.resp_bytes += payload_len as u32;
                    let addr = msg.local_addr + u64::from(data.msg_offset);
                    if msg.resp_bytes >= msg.len {
                        msg.done = true;
                        self.complete_in_order();
                    }
                    return Delivery::Place {
                        addr,
                        offset: payload_at,
                        len: payload_len,
                    };
                }
            }
            m = m.wrapping_add(1);
        }
        Delivery::Nothing
    }
}

/// Where an ACK came from: a packet of its own, or carried by a data packet of path `via_path`.
#[derive(Debug, Clone, Copy)]
enum AckOrigin {
    Own { src_port: u16 },
    Carried { src_port: u16, via_path: u8 },
}

/// What a datagram's check yields.
struct Checked {
    bth: BthRepr,
    ext: Extensions,
    piggy: Option<PiggyAck>,
    payload_at: usize,
    payload_len: usize,
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

/// The highest bit set in a SACK bitvector (bit `b` is byte `b / 8`, bit `b % 8`).
fn highest_sack_bit(sack: &[u8]) -> Option<usize> {
    // Eight bytes at a time from the top (bit k of byte i is bit 8i + k): an ACK without gaps,
    // the usual one, is four zero tests.
    let words = sack.len() / 8;
    let (head, tail) = sack.split_at(words * 8);
    if let Some((i, b)) = tail.iter().enumerate().rev().find(|(_, b)| **b != 0) {
        return Some((words * 8 + i) * 8 + 7 - b.leading_zeros() as usize);
    }
    head.chunks_exact(8).enumerate().rev().find_map(|(w, c)| {
        let v = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        (v != 0).then(|| w * 64 + 63 - v.leading_zeros() as usize)
    })
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

/// The ICRC of a datagram sent over UDP from `src` to `dst`: computed over the canonical IP
/// header a UDP socket cannot see (IPv4: identification 0, DF set; IPv6: no extension headers)
/// and the UDP header, so that both ends agree without reading each other's IP headers.
pub fn compute_icrc(
    src: IpAddr,
    dst: IpAddr,
    src_port: u16,
    dst_port: u16,
    transport: &[u8],
) -> u32 {
    let (ip, ip_len, udp) = icrc_headers(src, dst, src_port, dst_port, transport.len());
    icrc::finish(icrc::prefix(&ip[..ip_len], &udp), transport)
}

/// The canonical IP header (and its length) and the UDP header of a datagram of
/// `transport_len` bytes (BTH to pad) from `src` to `dst`: the part of [`compute_icrc`] that
/// depends on the addresses, ports and length alone.
fn icrc_headers(
    src: IpAddr,
    dst: IpAddr,
    src_port: u16,
    dst_port: u16,
    transport_len: usize,
) -> ([u8; 40], usize, [u8; 8]) {
    let udp_len = (8 + transport_len + 4) as u16;
    let mut udp = [0u8; 8];
    udp[..2].copy_from_slice(&src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
            ip[6] = 0x40;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let mut out = [0u8; 40];
            out[..20].copy_from_slice(&ip);
            (out, 20, udp)
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V6(x) => x.octets(),
                IpAddr::V4(x) => x.to_ipv6_mapped().octets(),
            };
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
            ip[6] = 17;
            ip[8..24].copy_from_slice(&v6(s));
            ip[24..40].copy_from_slice(&v6(d));
            (ip, 40, udp)
        }
    }
}

/// Slots of an [`IcrcPrefixes`] cache.
const ICRC_SLOTS: usize = 8;

/// The ICRC prefixes (the CRC of the headers of `icrc_headers`, split for whole blocks: see
/// [`icrc::SplitPrefix`]) of one direction of a connection, by UDP source port (it varies with
/// the path) and datagram length, so that a datagram like a recent one (the same path, the same
/// size: a ping-pong, full-sized bulk packets) hashes its own bytes only. The addresses and the
/// destination port are fixed for the direction (the configuration does not change after the
/// connection is made).
#[derive(Debug, Clone, Default)]
struct IcrcPrefixes([Option<(u64, icrc::SplitPrefix)>; ICRC_SLOTS]);

impl IcrcPrefixes {
    /// [`compute_icrc`] through the cache.
    fn icrc(
        &mut self,
        (src, dst): (IpAddr, IpAddr),
        (src_port, dst_port): (u16, u16),
        transport: &[u8],
        engine: icrc::Engine,
    ) -> u32 {
        let key = (u64::from(src_port) << 32) | transport.len() as u64;
        let slot = &mut self.0[(usize::from(src_port) ^ transport.len()) % ICRC_SLOTS];
        let prefix = match slot {
            Some((k, p)) if *k == key => *p,
            _ => {
                let (ip, ip_len, udp) = icrc_headers(src, dst, src_port, dst_port, transport.len());
                let p = icrc::split_prefix(&ip[..ip_len], &udp, transport.len());
                *slot = Some((key, p));
                p
            }
        };
        icrc::finish_split(&prefix, transport, engine)
    }
}

#[cfg(test)]
mod unit {
    use super::{compute_icrc, highest_sack_bit, IcrcPrefixes, ICRC_SLOTS};
    use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
                for port in [49152u16, 49153, 49152 + ICRC_SLOTS as u16, 50000] {
                    for len in [0usize, 5, 60, 60 + ICRC_SLOTS, 1500, 1500] {
                        let t = &data[round..round + len];
                        let want = compute_icrc(ips.0, ips.1, port, 4791, t);
                        let engine = crate::icrc::Engine::BuiltIn;
                        assert_eq!(
                            cache.icrc(ips, (port, 4791), t, engine),
                            want,
                            "{port} {len}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn highest_sack_bit_matches_a_bit_by_bit_scan() {
        let slow = |s: &[u8; 32]| (0..256).rev().find(|b| s[b / 8] & (1 << (b % 8)) != 0);
        let mut s = [0u8; 32];
        assert_eq!(highest_sack_bit(&s), None);
        for b in 0..256 {
            s = [0; 32];
            s[b / 8] |= 1 << (b % 8);
            s[0] |= 1; // a lower bit set too
            assert_eq!(highest_sack_bit(&s), Some(b), "bit {b}");
            assert_eq!(highest_sack_bit(&s), slow(&s));
        }
        // Lengths that are not whole words.
        let slow_n = |s: &[u8]| {
            (0..s.len() * 8)
                .rev()
                .find(|b| s[b / 8] & (1 << (b % 8)) != 0)
        };
        for n in [0usize, 1, 7, 9, 13] {
            for b in 0..n * 8 {
                let mut v = std::vec![0u8; n];
                v[b / 8] |= 1 << (b % 8);
                assert_eq!(highest_sack_bit(&v), Some(b), "{n} bytes, bit {b}");
                assert_eq!(highest_sack_bit(&v), slow_n(&v));
            }
            assert_eq!(highest_sack_bit(&std::vec![0u8; n]), None);
        }
    }
}
