//! What goes in and out of a connection: work requests, receive buffers, completions, events,
//! transmits and placements, and the counters.

use crate::wire::metaroce::NackReason;

pub use crate::path::PathId;
pub use crate::time::Instant;

/// The operation of a work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum WrOp {
    /// Send into the peer's next posted receive buffer on the stream.
    Send,
    /// Send with immediate data.
    SendWithImm(u32),
    /// Write into the peer's memory.
    Write,
    /// Write, then consume a receive buffer on the peer with immediate data.
    WriteWithImm(u32),
    /// Read from the peer's memory into the local buffer.
    Read,
    /// Compare the peer's 8 bytes with `compare` and, if equal, replace them with `swap`; the
    /// original value lands in the local buffer.
    CompareSwap {
        /// The value expected.
        compare: u64,
        /// The value written when it matches.
        swap: u64,
    },
    /// Add to the peer's 8 bytes; the original value lands in the local buffer.
    FetchAdd(u64),
}

/// The peer's memory a Write or Read addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RemoteAddr {
    /// Address in the peer's region.
    pub va: u64,
    /// The peer's key for the region.
    pub rkey: u32,
}

/// A work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct WorkRequest {
    /// Returned in the completion.
    pub id: u64,
    /// What to do.
    pub op: WrOp,
    /// The ordered stream it belongs to.
    pub stream: u16,
    /// Local buffer: the source of a Send or Write, the destination of a Read.
    pub local_addr: u64,
    /// Bytes.
    pub len: u32,
    /// Peer memory (Write and Read).
    pub remote: RemoteAddr,
}

/// A receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RecvRequest {
    /// Returned in the completion.
    pub id: u64,
    /// The stream whose next message it receives.
    pub stream: u16,
    /// Local address.
    pub addr: u64,
    /// Capacity in bytes.
    pub len: u32,
}

/// How a work request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Status {
    /// Done.
    Success,
    /// The peer refused it.
    Refused(NackReason),
}

/// Which kind of work a completion reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CompletionKind {
    /// A Send (with or without immediate) was delivered.
    Send,
    /// A Write (with or without immediate) was placed.
    Write,
    /// A Read's data arrived.
    Read,
    /// An atomic was performed and its original value arrived.
    Atomic,
    /// A receive buffer was filled by a Send.
    Recv,
    /// A receive buffer was consumed by a Write with immediate.
    RecvWriteImm,
}

/// A completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Completion {
    /// The work request or receive buffer's id.
    pub id: u64,
    /// How it ended.
    pub status: Status,
    /// What it was.
    pub kind: CompletionKind,
    /// Bytes transferred.
    pub byte_len: u32,
    /// Immediate data, when the message carried some.
    pub imm: Option<u32>,
    /// Its stream.
    pub stream: u16,
}

/// Something the runner should know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Event {
    /// A work request or receive completed.
    Completion(Completion),
    /// A path stopped delivering and was taken out of service (it will be probed on new entropy).
    PathFailed {
        /// The path.
        path: PathId,
        /// Its new UDP source port.
        new_src_port: u16,
    },
    /// A failed path answered its probes and carries data again.
    PathRestored {
        /// The path.
        path: PathId,
    },
}

/// A datagram to send: the connection wrote its headers into the caller's buffer.
///
/// The runner copies `payload_len` bytes from local address `payload_addr` to
/// `buf[header_len..]`, then calls [`Connection::seal`](super::Connection::seal) to add the pad and
/// the ICRC, and sends `buf[..len]` from UDP source port `src_port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Transmit {
    /// The path it goes on.
    pub path: PathId,
    /// UDP source port of that path.
    pub src_port: u16,
    /// Bytes of headers written.
    pub header_len: usize,
    /// Local address of the payload.
    pub payload_addr: u64,
    /// Payload bytes that follow the headers.
    pub payload_len: usize,
    /// The whole datagram's length, pad and ICRC included.
    pub len: usize,
}

/// The rate controller's outputs, as a runner reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RateStatus {
    /// The rate the connection may send at, Mb/s (0: no limit).
    pub rate_mbps: u32,
    /// The connection's window, packets.
    pub connection_window: u32,
    /// The last rate hint the peer's ACKs carried, Mb/s (0: none).
    pub hint_received_mbps: u32,
    /// The rate hint this end's ACKs carry, Mb/s (0: none).
    pub hint_sent_mbps: u32,
    /// The queueing delay the last new data packet met on its way here, ns: its one-way delay
    /// (this end's clock less the sender's timestamp) above the least of its path's recent ones
    /// ([`crate::rate::QueueDelay`]).
    pub queue_delay_ns: u32,
}

/// What the runner does with an arrived datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Delivery {
    /// Nothing to place.
    Nothing,
    /// Copy `len` bytes from the datagram at `offset` to local address `addr` (already checked).
    Place {
        /// Destination.
        addr: u64,
        /// Where the bytes start in the datagram.
        offset: usize,
        /// How many.
        len: usize,
    },
    /// Perform an atomic on the 8 bytes at `addr` (already checked: granted, aligned), in native
    /// byte order: compare-and-swap when `compare` is given, fetch-and-add of `swap_add` otherwise.
    /// Then call [`Connection::atomic_result`](super::Connection::atomic_result) with the original
    /// value before handling the next datagram.
    Atomic {
        /// The 8-byte target.
        addr: u64,
        /// The value expected (compare-and-swap), or `None` (fetch-and-add).
        compare: Option<u64>,
        /// The value to swap in, or to add.
        swap_add: u64,
    },
    /// Write `value` as 8 bytes in native byte order at `addr`: an atomic's original value.
    Value {
        /// Destination.
        addr: u64,
        /// The value.
        value: u64,
    },
}

/// Why a datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DropReason {
    /// It did not parse (truncated, unknown layout, lengths that do not add up).
    Malformed,
    /// Its ICRC does not match its bytes (or it carries none and this end checks:
    /// [`IcrcMode`](super::IcrcMode) differs between the ends).
    BadIcrc,
    /// Its destination QP is not this connection.
    WrongQp,
    /// Its P_Key is not this connection's.
    WrongPkey,
    /// Its PSN lies outside the receive window.
    OutOfWindow,
    /// It names a path this connection does not have.
    UnknownPath,
    /// Already received.
    Duplicate,
    /// An opcode this connection does not act on.
    UnsupportedOpcode,
    /// A control packet (ACK, NACK) from a UDP source port the peer's path does not send from.
    WrongPort,
    /// A control packet that names what was never sent or is not outstanding: a path sequence
    /// or PSN this end did not send, a refusal it does not hold, a probe that is not the one
    /// outstanding. Dropped whole: nothing of it is acted on.
    Inconsistent,
    /// It would be refused, but too many earlier refusals await the requester's confirmation:
    /// not accepted (the requester sends it again).
    RefusalsFull,
}

/// Why a work request was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PostError {
    /// The queue is full; poll completions first.
    QueueFull,
    /// The stream number is not below the connection's stream count.
    NoSuchStream,
    /// A Read of zero bytes, an atomic not of 8 bytes, or a message longer than 2^31 bytes.
    BadLength,
    /// An atomic's remote or local address is not 8-byte aligned.
    Misaligned,
}

/// Connection-wide counters. The eight a ping-pong of Writes moves come first, in one cache
/// line of their own (`repr(C, align(64))`): data packets sent, acknowledged and received, bytes
/// placed, ACKs sent, carried and received, and the ECN marks the ACKs echo; such a hop touches
/// no other. The rest move only on losses and retransmissions, refusals and NACKs, drops and
/// duplicates, held Read and atomic requests, probes, CE marks and congestion notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(C, align(64))]
pub struct Counters {
    /// Data packets sent for the first time.
    pub data_sent: u64,
    /// Data packets acknowledged.
    pub acked: u64,
    /// ACKs sent (stand-alone and carried by data packets).
    pub acks_sent: u64,
    /// ACKs carried by data packets (included in `acks_sent`).
    pub acks_piggybacked: u64,
    /// ACKs received riding on data packets.
    pub acks_piggyback_received: u64,
    /// Data packets received and accepted.
    pub data_received: u64,
    /// Payload bytes placed.
    pub bytes_placed: u64,
    /// CE marks reported back by the peer's ACKs.
    pub ecn_marks_echoed: u64,
    /// Data packets sent again (after a loss, or after a receiver-not-ready NACK).
    pub retransmitted: u64,
    /// Packets sent again because the peer was not ready (a receiver-not-ready NACK: no
    /// receive buffer, a full queue, or an atomic that overtook earlier packets); not losses.
    /// Included in `retransmitted`.
    pub rnr_retries: u64,
    /// Read and atomic requests that waited before their first transmission because as many
    /// as `Config::max_rd_atomic` were outstanding (each counted once).
    pub requests_waited: u64,
    /// Data packets acknowledged selectively (above a gap).
    pub sacked: u64,
    /// Losses detected from SACK gaps.
    pub lost_by_sack: u64,
    /// Losses declared by a retransmission timeout.
    pub lost_by_timeout: u64,
    /// Tail probes sent because a transmission that left later, on any path, was acknowledged
    /// while this one stayed unresolved past its path's round trip (instead of waiting for the
    /// path's retransmission timeout).
    pub overdue_probes: u64,
    /// Tail probes sent again, instead of declaring a path's flight lost, because the whole
    /// peer had been silent (on every path) since the last one left: the peer's host stalled,
    /// not the path (up to thirty-two long timeouts of silence; while it catches up after one,
    /// up to two such waits from the start of its silence).
    pub peer_silent_waits: u64,
    /// NACKs sent.
    pub nacks_sent: u64,
    /// NACKs received.
    pub nacks_received: u64,
    /// Refusal NACKs sent again because the requester had not confirmed them.
    pub nacks_resent: u64,
    /// Refusals the requester confirmed.
    pub refusals_confirmed: u64,
    /// Duplicates received (dropped).
    pub duplicates: u64,
    /// Drops by reason: malformed.
    pub drop_malformed: u64,
    /// Drops by reason: bad ICRC.
    pub drop_bad_icrc: u64,
    /// Drops by reason: wrong QPN.
    pub drop_wrong_qp: u64,
    /// Drops by reason: wrong P_Key.
    pub drop_wrong_pkey: u64,
    /// Drops by reason: PSN or path sequence outside the window.
    pub drop_out_of_window: u64,
    /// Drops by reason: a path this connection does not have.
    pub drop_unknown_path: u64,
    /// Drops by reason: an opcode this connection does not act on.
    pub drop_unsupported_opcode: u64,
    /// Packets that would have been refused while every refusal slot waited for its
    /// confirmation: not accepted, the requester sends them again.
    pub drop_refusals_full: u64,
    /// Drops by reason: ACKs and NACKs from a source port the peer's path does not send from.
    pub drop_wrong_port: u64,
    /// Drops by reason: ACKs that name a path sequence not sent or a PSN past the next one.
    pub drop_bad_ack: u64,
    /// Drops by reason: NACKs that name a PSN or path sequence not sent, or a refusal not held.
    pub drop_bad_nack: u64,
    /// Drops by reason: probe replies that do not name the outstanding probe.
    pub drop_bad_probe: u64,
    /// Requests refused for memory access (key, bounds, rights).
    pub access_violations: u64,
    /// CE marks seen on arrival.
    pub ecn_ce_received: u64,
    /// Times a path's congestion window was halved for ECN marks.
    pub cwnd_cuts: u64,
    /// Congestion notification packets sent (RoCEv2 CNPs, BTH opcode 0x81, for CE-marked data
    /// when the connection runs DCQCN; at most one per the controller's CNP interval).
    pub cnps_sent: u64,
    /// Congestion notification packets received.
    pub cnps_received: u64,
    /// Probes sent.
    pub probes_sent: u64,
    /// Paths declared failed.
    pub path_failures: u64,
}

/// One path's health and counters. The port and the counters each packet of the path moves
/// (sent, acknowledged, ECN marks, least RTT) come first, in the first cache line (`repr(C)`);
/// the state fields beside them (`active`, `in_flight`, `rtt_smoothed`) are filled in when the
/// statistics are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(C)]
pub struct PathStats {
    /// Current UDP source port.
    pub src_port: u16,
    /// Whether it carries data now.
    pub active: bool,
    /// Packets in flight now.
    pub in_flight: u32,
    /// Packets sent on it (first transmissions and retransmissions).
    pub sent: u64,
    /// Packets acknowledged on it.
    pub acked: u64,
    /// CE marks the peer reported for it.
    pub ecn_marks: u64,
    /// Smallest RTT sample, ns (0 before the first sample).
    pub rtt_min: u64,
    /// Smoothed RTT, ns.
    pub rtt_smoothed: u64,
    /// Retransmissions sent on it.
    pub retransmitted: u64,
    /// Packets it lost (SACK gap or timeout).
    pub lost: u64,
    /// Congestion window now, packets.
    pub cwnd: u32,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Times its window was halved for ECN marks.
    pub cwnd_cuts: u64,
    /// Times it failed.
    pub failures: u64,
}

impl core::fmt::Display for PostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            PostError::QueueFull => "the send queue is full; poll completions before posting more",
            PostError::NoSuchStream => "no such stream",
            PostError::BadLength => {
                "bad length (Read of 0 bytes, atomic not of 8 bytes, or over 2 GiB)"
            }
            PostError::Misaligned => "an atomic's addresses must be 8-byte aligned",
        })
    }
}

impl core::error::Error for PostError {}

impl core::fmt::Display for DropReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            DropReason::Malformed => "malformed (truncated or unknown layout)",
            DropReason::BadIcrc => "bad ICRC (corrupted, or the ends disagree on the ICRC mode)",
            DropReason::WrongQp => "for another queue pair",
            DropReason::WrongPkey => "another partition key",
            DropReason::OutOfWindow => "PSN outside the receive window",
            DropReason::UnknownPath => "names a path this connection does not have",
            DropReason::Duplicate => "already received",
            DropReason::UnsupportedOpcode => "an opcode this connection does not act on",
            DropReason::WrongPort => "from a port the peer's path does not send from",
            DropReason::Inconsistent => "names what was never sent or is not outstanding",
            DropReason::RefusalsFull => {
                "would be refused, and too many refusals await confirmation"
            }
        })
    }
}

impl core::error::Error for DropReason {}
