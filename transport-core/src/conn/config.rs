//! The connection's configuration, and the numbers derived from it per path.

use super::*;

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
    /// Packets in flight per path at most (up to 255): the most each path's congestion window
    /// grows to, and where it starts unless `start_window_per_path` says otherwise.
    pub window_per_path: u32,
    /// Where each path's window starts under ECN AIMD and MetaRoCE (packets, at most
    /// `window_per_path`; 0, the default: at `window_per_path`). Unmarked ACKs grow it by one
    /// packet per window's worth, up to `window_per_path`: senders that meet at a bottleneck
    /// start from a flight the queue holds, and a clear path still opens to the whole window.
    pub start_window_per_path: u32,
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
    /// The rate controller (`crate::rate`): ECN AIMD per path by default.
    #[cfg_attr(feature = "defmt", defmt(Debug2Format))]
    pub cc: crate::rate::Algorithm,
    /// What the ICRC of each datagram is: computed and checked (RoCEv2, the default), computed
    /// but not checked (a NIC already checked it), or absent by agreement of two software ends
    /// (docs/PROTOCOL.md 4.1).
    pub icrc: IcrcMode,
    /// The CRC-32 engine of the ICRCs (this build's by default; a runner may hand in one for
    /// its machine, such as PCLMULQDQ block folding on x86_64).
    #[cfg_attr(feature = "defmt", defmt(Debug2Format))]
    pub icrc_engine: icrc::Engine,
    /// New packets with payload (Write, Send, Read response) a path takes in a row once picked,
    /// while it stays open (1, the default: every packet picks a path). Requests, atomics and
    /// retransmissions pick a path each. A software runner, whose every pick costs CPU time
    /// per packet, picks once per few packets.
    pub spray_burst: u8,
    /// Read and atomic requests this end has outstanding at most (the initiator depth, verbs'
    /// `max_rd_atomic`; 0 counts as 1): one more waits until a response completes an earlier
    /// one, and holds the messages posted after it on its stream (a send queue issues in
    /// order); other streams go on.
    pub max_rd_atomic: u8,
}

/// What the ICRC field of a connection's datagrams holds, and whether arrivals are checked
/// (docs/PROTOCOL.md 4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum IcrcMode {
    /// Every datagram carries its ICRC and every arrival's is checked: RoCEv2, the default.
    #[default]
    Full,
    /// Datagrams carry their ICRC; arrivals are not checked, because the runner's NIC already
    /// checked them and drops those that fail.
    SendOnly,
    /// Datagrams carry 0 in the ICRC field and arrivals are not checked. Both ends must agree:
    /// an end that checks drops every datagram of an end that does not send. Only for two
    /// software ends over a socket layer that already guards each datagram end to end (the UDP
    /// checksum, the links' frame check), as TCP relies on; a RoCE NIC drops such datagrams.
    Off,
}

impl IcrcMode {
    /// Whether datagrams leave with their ICRC computed.
    pub const fn sends(self) -> bool {
        !matches!(self, IcrcMode::Off)
    }

    /// Whether the ICRC of arrivals is checked.
    pub const fn checks(self) -> bool {
        matches!(self, IcrcMode::Full)
    }
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
            start_window_per_path: 0,
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
            icrc: IcrcMode::Full,
            cc: crate::rate::Algorithm::EcnAimd,
            icrc_engine: icrc::Engine::BuiltIn,
            spray_burst: 1,
            max_rd_atomic: 16,
        }
    }
}

/// The first sequence number of path `path` when a connection's path sequences start at `base`
/// (paths start far apart, so one path's numbers say nothing of another's).
pub fn path_origin(base: u32, path: PathId) -> PathSeq {
    PathSeq(base.wrapping_add(u32::from(path.0).wrapping_mul(0x9e37_79b9)))
}

/// How far back from a path's next sequence number an ACK or NACK may name a transmission. A
/// receiver's cumulative point trails the sender's next number by at most its window plus the
/// 256 numbers of the bitvector; a refusal comes back within a round trip.
pub(super) const SEQ_HISTORY: u64 = 1 << 16;

/// The UDP source port of a path: a hash of the seed, the path and how many times it failed,
/// in the range 0xC000-0xFFFF that RoCEv2 uses for entropy.
pub fn entropy_port(seed: u32, path: PathId, generation: u16) -> u16 {
    let mut x = seed ^ (u32::from(path.0) << 16) ^ u32::from(generation).wrapping_mul(0x9e37_79b9);
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    0xc000 | (x as u16 & 0x3fff)
}
