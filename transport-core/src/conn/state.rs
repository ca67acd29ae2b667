//! The connection's internal state: messages and packets in flight, paths, streams, pending
//! answers and refusals.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MsgKind {
    Send,
    Write,
    Read,
    ReadResponse,
    Atomic,
    AtomicResponse,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct TxMsg {
    pub(super) wr_id: u64,
    pub(super) kind: MsgKind,
    pub(super) imm: Option<u32>,
    pub(super) stream: u16,
    pub(super) msn: u32,
    pub(super) local_addr: u64,
    pub(super) len: u32,
    pub(super) remote: RemoteAddr,
    pub(super) npkts: u32,
    pub(super) next_pkt: u32,
    pub(super) last_psn: Option<Psn>,
    pub(super) resp_bytes: u32,
    /// What an atomic request asks, or what an atomic response answers.
    pub(super) atomic: AtomicOperands,
    pub(super) done: bool,
    pub(super) status: Status,
    pub(super) reported: bool,
    /// A Read or atomic request that waited for the initiator depth (counted once).
    pub(super) held: bool,
}

/// The operands an atomic message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AtomicOperands {
    /// Not an atomic message.
    None,
    /// A compare-and-swap request.
    CompareSwap {
        /// The value compared with the target.
        compare: u64,
        /// The value written when they are equal.
        swap: u64,
    },
    /// A fetch-and-add request.
    FetchAdd(u64),
    /// A response: the target's original value.
    Original(u64),
}

impl AtomicOperands {
    /// The AtomicETH fields (swap or add value, compare value) of a request.
    pub(super) fn eth_values(self) -> (u64, u64) {
        match self {
            AtomicOperands::CompareSwap { compare, swap } => (swap, compare),
            AtomicOperands::FetchAdd(add) => (add, 0),
            AtomicOperands::None | AtomicOperands::Original(_) => (0, 0),
        }
    }
}

impl TxMsg {
    /// A message the responder sends on its own (Read response, atomic response): no work
    /// request behind it, so no completion is reported.
    pub(super) fn response(kind: MsgKind, stream: u16, msn: u32, npkts: u32) -> Self {
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
            atomic: AtomicOperands::None,
            done: false,
            status: Status::Success,
            reported: false,
            held: false,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct TxPkt {
    pub(super) psn: Psn,
    pub(super) msg: u32,
    pub(super) idx: u32,
    pub(super) path: PathId,
    pub(super) seq: PathSeq,
    pub(super) sent_at: Instant,
    pub(super) acked: bool,
    pub(super) queued: bool,
    pub(super) not_before: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PathState {
    Active,
    Probing,
}

#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct TxPath {
    // What a hop reads and writes first (`#[repr(C)]`): a line of scalars, then the counters.
    pub(super) una: PathSeq,
    pub(super) next_seq: PathSeq,
    pub(super) srtt: u64,
    pub(super) rttvar: u64,
    /// The retransmission timer runs from the later of this and the oldest transmission.
    pub(super) timer_from: Instant,
    /// When the last consistent ACK of this path arrived.
    pub(super) last_ack_at: Instant,
    /// The timestamp of the tail probe in flight: the ACK that echoes it settles the tail.
    pub(super) tail_probe_ts: Option<u32>,
    pub(super) state: PathState,
    /// A tail probe is to be sent (first timeout on an active path).
    pub(super) tail_probe_pending: bool,
    pub(super) timeouts_in_row: u8,
    pub(super) failed: bool,
    pub(super) generation: u16,
    pub(super) stats: PathStats,
    // The rings and the probes' state.
    pub(super) ring_psn: [u32; PATH_RING],
    pub(super) ring_sent: [Instant; PATH_RING],
    /// The last probe sent (its sequence number) and the timestamp it carried: a reply counts
    /// only if it echoes both while the probe is outstanding.
    pub(super) probe_seq: u32,
    pub(super) probe_ts: u32,
    pub(super) probe_outstanding: bool,
    /// The timestamps of the last [`PROBE_HISTORY`] probes, by sequence number modulo the
    /// history; 0 once answered (or never sent). A late answer to one of them is genuine: the
    /// path carries, behind a queue that holds packets longer than the probe interval.
    pub(super) probe_history: [u32; PROBE_HISTORY],
    pub(super) probe_due: Instant,
    pub(super) probe_pending: bool,
    pub(super) probes_unanswered: u8,
    /// When the latest probe (not a tail probe) left.
    pub(super) probe_at: Instant,
    /// Probes in a row left unanswered while nothing came from the peer on any path.
    pub(super) quiet_probes: u8,
    /// When that tail probe left.
    pub(super) tail_probe_at: Instant,
    /// The path's next sequence number when the first tail probe of this round left: what left
    /// before it (a lower sequence number) and is unresolved when the round ends is lost. Not a
    /// time: a runner stamps a whole round with one clock reading, and what leaves after the
    /// probe in that round has the probe's time but did not leave before it.
    pub(super) tail_probe_cut: PathSeq,
    /// Tail probes sent this round (a round ends with an answer, or with `TAIL_PROBE_TRIES`
    /// unanswered).
    pub(super) tail_probe_tries: u8,
    /// Restarts for host stalls since the path last moved (its oldest packet in flight was
    /// resolved or a probe left), and where it stood then (`una`, probe sequence).
    pub(super) stall_restarts: u8,
    pub(super) stall_mark: (PathSeq, u32),
}

/// A set of path indices (at most 256 paths), for finding a flagged path without walking every
/// path's state.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PathSet([u64; 4]);

impl PathSet {
    pub(super) fn insert(&mut self, i: usize) {
        self.0[(i / 64) % 4] |= 1 << (i % 64);
    }

    pub(super) fn remove(&mut self, i: usize) {
        self.0[(i / 64) % 4] &= !(1 << (i % 64));
    }

    pub(super) fn contains(&self, i: usize) -> bool {
        self.0[(i / 64) % 4] & (1 << (i % 64)) != 0
    }

    /// Whether no path is in the set.
    pub(super) fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }

    /// Whether no path but `i` is in the set.
    pub(super) fn at_most(&self, i: usize) -> bool {
        let mut rest = *self;
        rest.remove(i);
        rest.is_empty()
    }

    /// The paths in the set, lowest first (of a copy: the caller may change the set meanwhile).
    pub(super) fn iter(&self) -> impl Iterator<Item = usize> + use<> {
        let words = self.0;
        (0..4).flat_map(move |k| {
            let mut w = words[k];
            core::iter::from_fn(move || {
                (w != 0).then(|| {
                    let b = w.trailing_zeros() as usize;
                    w &= w - 1;
                    k * 64 + b
                })
            })
        })
    }

    pub(super) fn first(&self) -> Option<usize> {
        self.0
            .iter()
            .position(|&w| w != 0)
            .map(|k| k * 64 + self.0[k].trailing_zeros() as usize)
    }
}

/// An ACK a data packet carried, held until that packet's own work (and the answer a runner
/// sends at once) is done: [`Connection::handle_datagram`], [`Connection::poll_transmit`] and
/// [`Connection::handle_timeout`] take it first thing, whichever comes next.
#[derive(Debug, Clone, Copy)]
pub(super) struct CarriedAck {
    /// When its packet arrived.
    pub(super) at: Instant,
    /// Where it came from (the port and path of the packet that carried it).
    pub(super) origin: AckOrigin,
    /// The cumulative PSN it carried.
    pub(super) cum_psn: Psn,
    /// The path's ACK.
    pub(super) ack: MrAckRepr,
}

/// Which paths owe the peer an ACK, at once or by a deadline. It owns the deadlines, so the set
/// of paths with a delayed ACK is always the set with a deadline.
///
/// The two sets first, in one cache line (`repr(C, align(64))`): what every hop reads; a
/// deadline only for a path with a delayed ACK.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct AckSchedule<const P: usize> {
    now: PathSet,
    delayed: PathSet,
    deadline: [Option<Instant>; P],
}

impl<const P: usize> AckSchedule<P> {
    pub(super) const fn new() -> Self {
        AckSchedule {
            now: PathSet([0; 4]),
            delayed: PathSet([0; 4]),
            deadline: [None; P],
        }
    }

    /// Path `i`'s ACK goes at the next chance.
    pub(super) fn at_once(&mut self, i: usize) {
        self.now.insert(i);
    }

    /// Path `i`'s ACK goes by `at` at the latest (an earlier deadline stands).
    pub(super) fn by(&mut self, i: usize, at: Instant) {
        if self.deadline[i].is_none() {
            self.deadline[i] = Some(at);
            self.delayed.insert(i);
        }
    }

    /// Path `i`'s delayed ACK is due: it goes at the next chance.
    pub(super) fn expire(&mut self, i: usize) {
        self.deadline[i] = None;
        self.delayed.remove(i);
        self.now.insert(i);
    }

    /// Path `i`'s ACK left: it owes nothing.
    pub(super) fn sent(&mut self, i: usize) {
        self.deadline[i] = None;
        self.delayed.remove(i);
        self.now.remove(i);
    }

    /// When path `i`'s delayed ACK is due.
    pub(super) fn deadline(&self, i: usize) -> Option<Instant> {
        self.deadline[i]
    }

    /// Whether path `i`'s ACK goes at the next chance.
    pub(super) fn is_due_now(&self, i: usize) -> bool {
        self.now.contains(i)
    }

    /// The paths with a delayed ACK (the paths with a deadline), lowest first.
    pub(super) fn delayed(&self) -> impl Iterator<Item = usize> + use<P> {
        self.delayed.iter()
    }

    /// A path that owes an ACK: due at once first, then delayed ones.
    pub(super) fn next(&self) -> Option<usize> {
        self.now.first().or_else(|| self.delayed.first())
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct RxPath {
    pub(super) sack: SackBitmap,
    pub(super) unacked: u16,
    pub(super) ce: u16,
    pub(super) ece: bool,
    pub(super) ts: u32,
    pub(super) ts_at: Instant,
    /// One-way delays of the path's data: the queueing they met.
    pub(super) owd: QueueDelay,
    pub(super) probe_reply: Option<(u32, u32)>,
    /// The UDP source port the peer's path sends from, learned from what it sent that passed
    /// every check (see [`Connection::handle_datagram`]); its ACKs, NACKs and probe replies for
    /// this path must come from it.
    pub(super) peer_port: Option<u16>,
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RecvSlot {
    pub(super) id: u64,
    pub(super) addr: u64,
    pub(super) cap: u32,
    pub(super) got: u32,
    pub(super) msg_len: u32,
    pub(super) started: bool,
    pub(super) imm: Option<u32>,
    pub(super) write_imm: bool,
    pub(super) done: bool,
    pub(super) status: Option<NackReason>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct RxStream<const Q: usize> {
    pub(super) slots: [RecvSlot; Q],
    /// Receive buffers posted (counter; slot = counter % Q).
    pub(super) posted: u32,
    /// Receive buffers completed (the MSN of the oldest outstanding one).
    pub(super) completed: u32,
    /// The last receive a refused message consumed (`consume_receive`): its MSN and the
    /// refusal, given again to the rest of that message's packets.
    pub(super) refused: Option<(u32, NackReason)>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct TxStream {
    pub(super) next_msn: u32,
    pub(super) next_read: u32,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct PendingAtomic {
    pub(super) stream: u16,
    pub(super) msn: u32,
    pub(super) psn: Psn,
    pub(super) path: PathId,
    pub(super) path_seq: u32,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct PendingNack {
    pub(super) path: PathId,
    pub(super) psn: Psn,
    pub(super) nack: MrNackRepr,
}

/// Probes whose answers a path still takes (see `TxPath::probe_history`).
pub(super) const PROBE_HISTORY: usize = 16;
