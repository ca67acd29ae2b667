//! Rate control: the windows and the rate a connection may send at, as pure state machines.
//!
//! One interface for the connection, the simulator and a C ABI. Inputs are plain values: an
//! ACK (the path it came on, the packets it acknowledged for the first time, whether it reported
//! ECN marks, the receiver's rate hint), an RTT sample, a loss, a timeout, a CNP, bytes sent, and
//! always the time. Outputs are plain values: each path's window, the connection's window, the
//! rate, and the departure time of the next packet. A controller holds no references and does no
//! I/O: the same inputs give the same outputs. Integer and fixed-point arithmetic only, every unit
//! named (windows in 1/256 packet, rates in Mb/s, time in ns, fractions in 1/1024), so that a
//! hardware pipeline can mirror each controller bit for bit. Controllers are chosen by enum,
//! without allocation. docs/CONGESTION.md gives each one's equations, parameters and sources.

mod aimd;
mod dcqcn;
mod fair_share;
mod pacer;
mod queue_delay;
mod swift;
mod timely;

pub use crate::path::PathId;
pub use crate::time::Instant;
pub use aimd::{ConnAimd, PathAimd, CONN_ALPHA_ONE};
pub use dcqcn::{CnpGate, Dcqcn, DcqcnParams, ALPHA_ONE};
pub use fair_share::{max_min_share, Drain, FairShare, FairShareError, GROWTH, HELD, QUIET_GAPS};
pub use pacer::{serialisation_ns, Pacer};
pub use queue_delay::QueueDelay;
pub use swift::{Swift, SwiftParams};
pub use timely::{Timely, TimelyParams};

/// One packet in the controllers' window units (windows are kept in 1/256 of a packet).
pub const ONE_PACKET: u32 = 256;

/// The controller a connection runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Algorithm {
    /// ECN AIMD on each path's window: a marked ACK halves the window of the path that carried the
    /// marks, at most once per that path's RTT; unmarked ACKs add one packet per window
    /// acknowledged, up to the configured window. Loss alone does not shrink a window.
    #[default]
    EcnAimd,
    /// MetaRoCE: ECN AIMD on each path's window and on the connection's (a mark trims the path
    /// that saw it and the connection, each at most once per RTT), and a rate no higher than the
    /// receiver's hint.
    MetaRoce,
    /// DCQCN's reaction point: a rate cut by CNPs and recovered by a timer and a byte counter.
    Dcqcn(DcqcnParams),
    /// Timely: a rate that follows the RTT gradient.
    Timely(TimelyParams),
    /// Swift: the connection's window against a target delay.
    Swift(SwiftParams),
}

/// Which windows an ACK cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Cuts {
    /// The window of the path it came on.
    pub path: bool,
    /// The connection's window (MetaRoCE).
    pub connection: bool,
}

impl Cuts {
    /// Whether it cut any window.
    pub fn any(self) -> bool {
        self.path || self.connection
    }
}

/// What an ACK told the sender about path `path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckReport {
    /// Packets it acknowledged for the first time.
    pub acked: u32,
    /// Whether it reported CE marks (or an ECN echo).
    pub marked: bool,
    /// The path's smoothed RTT, ns (the controllers' notion of "once per RTT").
    pub srtt: u64,
    /// When it arrived, ns.
    pub now: Instant,
    /// The receiver's fair share for this sender, Mb/s (0: none).
    pub hint_mbps: u32,
}

/// The rate-based controllers' state.
#[derive(Debug, Clone, Copy)]
enum RateState {
    None,
    Dcqcn(Dcqcn),
    Timely(Timely),
    Swift(Swift),
}

/// The windows and rate of a connection's `P` paths under one controller.
///
/// In this order (`repr(C)`): what every ACK and every packet sent reads comes first, so the
/// controller's part of a hop is a few cache lines, not one per field.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct RateControl<const P: usize> {
    /// The last rate hint an ACK carried, Mb/s (0: none).
    hint_mbps: u32,
    /// The largest window of a path, packets.
    max_window: u32,
    /// MetaRoCE before its first hint: since when it has sent unpaced, and how many bytes (the
    /// pacer books them at the first hint).
    unpaced: Option<(Instant, u64)>,
    algorithm: Algorithm,
    rate: RateState,
    /// What the first hint booked, until the sender sends again: a lower hint before then books
    /// it again at the lower rate.
    owed: Option<(Instant, u64)>,
    /// The connection's window (MetaRoCE), 1/256 packet.
    conn: ConnAimd,
    pacer: Pacer,
    paths: [PathAimd; P],
}

impl<const P: usize> RateControl<P> {
    /// Every path starts at `max_window` packets (at least one), the connection at `P` times
    /// that, a rate-based controller at its line rate.
    pub fn new(algorithm: Algorithm, max_window: u32) -> Self {
        let max_window = max_window.max(1);
        let rate = match algorithm {
            Algorithm::Dcqcn(p) => RateState::Dcqcn(Dcqcn::new(p, Instant::ZERO)),
            Algorithm::Timely(p) => RateState::Timely(Timely::new(p)),
            Algorithm::Swift(p) => RateState::Swift(Swift::new(p)),
            Algorithm::EcnAimd | Algorithm::MetaRoce => RateState::None,
        };
        RateControl {
            algorithm,
            max_window,
            paths: [PathAimd::new(max_window); P],
            conn: ConnAimd::new(Self::conn_max(max_window)),
            rate,
            hint_mbps: 0,
            unpaced: None,
            owed: None,
            pacer: Pacer::default(),
        }
    }

    /// The same controller with each path's window (ECN AIMD, MetaRoCE) starting at `start`
    /// packets (1 to the maximum; 0 leaves it at the maximum), and MetaRoCE's connection window
    /// at the paths' together; both grow from there to their maximum on unmarked ACKs. The
    /// rate- and delay-based controllers keep the maximum as their cap.
    pub fn starting_at(mut self, start: u32) -> Self {
        if start != 0 {
            let start = start.min(self.max_window);
            self.paths = [PathAimd::new(start); P];
            self.conn = ConnAimd::new(Self::conn_max(start));
        }
        self
    }

    fn conn_max(max_window: u32) -> u32 {
        max_window.saturating_mul(P.max(1) as u32)
    }

    /// The controller.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// DCQCN's notification point: the least time between two CNPs this end sends the peer for
    /// CE-marked packets; `None` for the controllers that do not use CNPs.
    pub fn cnp_interval_ns(&self) -> Option<u64> {
        match self.algorithm {
            Algorithm::Dcqcn(p) => Some(p.cnp_interval_ns),
            _ => None,
        }
    }

    /// An ACK of path `path`. Returns which windows it cut.
    pub fn on_ack(&mut self, path: PathId, ack: AckReport) -> Cuts {
        let max = self.max_window;
        if ack.hint_mbps == 0 {
            // A peer that gives no hint: nothing sent so far is owed to a later one.
            self.unpaced = None;
        } else {
            if self.hint_mbps == 0 && self.algorithm == Algorithm::MetaRoce {
                // The first hint: what left since the last ACK without one (the first window)
                // is paid for at the hint before more leaves.
                self.owed = self.unpaced.take();
            }
            if let Some((since, bytes)) = self.owed {
                // Until the sender sends again, at the lowest hint so far: the first hints of
                // an incast count the senders the receiver has heard of yet, fewer than a
                // moment later (sender 0 of 64 was first given a fourteenth of the line).
                self.pacer.owe(since, bytes, ack.hint_mbps);
            }
            self.hint_mbps = ack.hint_mbps;
        }
        let mut cuts = Cuts::default();
        match self.algorithm {
            Algorithm::EcnAimd | Algorithm::MetaRoce => {
                let Some(p) = self.paths.get_mut(path.index()) else {
                    return cuts;
                };
                cuts.path = p.on_ack(ack, max);
                if self.algorithm == Algorithm::MetaRoce {
                    cuts.connection = self.conn.on_ack(ack, Self::conn_max(max));
                }
            }
            // DCQCN acts on CNPs, Timely and Swift on delay (`on_rtt`).
            Algorithm::Dcqcn(_) | Algorithm::Timely(_) | Algorithm::Swift(_) => {}
        }
        cuts
    }

    /// An RTT sample of path `path` (ns) at `now`, for the delay-based controllers: Timely's
    /// gradient, Swift's delay against its target (as one hop; a fabric that reports hops would
    /// pass them). Returns whether it cut the rate or the window.
    pub fn on_rtt(&mut self, path: PathId, rtt_ns: u64, srtt_ns: u64, now: Instant) -> bool {
        let _ = path;
        match &mut self.rate {
            RateState::Timely(t) => {
                let before = t.rate_mbps();
                t.on_rtt(rtt_ns);
                t.rate_mbps() < before
            }
            RateState::Swift(s) => s.on_ack(now, 1, rtt_ns, 1, srtt_ns.max(rtt_ns)),
            RateState::None | RateState::Dcqcn(_) => false,
        }
    }

    /// A congestion notification packet arrived (RoCEv2 mode). Returns whether it cut the rate.
    pub fn on_cnp(&mut self, now: Instant) -> bool {
        match &mut self.rate {
            RateState::Dcqcn(d) => d.on_cnp(now),
            _ => false,
        }
    }

    /// `bytes` left at `now` (DCQCN's byte counter and timers).
    pub fn on_sent(&mut self, now: Instant, bytes: u64) {
        if let RateState::Dcqcn(d) = &mut self.rate {
            d.on_sent(now, bytes);
        }
    }

    /// Path `path` lost a packet. The ECN controllers do not react: the fabric is lossy by
    /// design, and a loss is repaired, not read as congestion.
    pub fn on_loss(&mut self, path: PathId, _now: Instant) {
        let _ = path;
    }

    /// Path `path` timed out. Swift's window falls to its minimum; the others do not react
    /// (timeouts lead to probes and failover).
    pub fn on_timeout(&mut self, path: PathId, _now: Instant) {
        let _ = path;
        if let RateState::Swift(s) = &mut self.rate {
            s.on_timeout();
        }
    }

    /// Path `path`'s window, whole packets (at least one).
    pub fn window(&self, path: PathId) -> u32 {
        match self.algorithm {
            Algorithm::EcnAimd | Algorithm::MetaRoce => self
                .paths
                .get(path.index())
                .map_or(1, |p| (p.window() / ONE_PACKET).max(1)),
            _ => self.max_window,
        }
    }

    /// Whether the connection's window can be smaller than the sum of its paths' (MetaRoCE,
    /// Swift): only then does the connection count what all its paths have in flight.
    pub fn limits_connection(&self) -> bool {
        matches!(self.algorithm, Algorithm::MetaRoce | Algorithm::Swift(_))
    }

    /// The connection's window, whole packets (at least one): the sum of what its paths may
    /// have in flight that it allows.
    pub fn connection_window(&self) -> u32 {
        let w = match (&self.algorithm, &self.rate) {
            (Algorithm::MetaRoce, _) => self.conn.window(),
            (_, RateState::Swift(s)) => s.cwnd(),
            _ => Self::conn_max(self.max_window).saturating_mul(ONE_PACKET),
        };
        (w / ONE_PACKET).max(1)
    }

    /// The rate the connection may send at, Mb/s (0: no limit): the controller's rate, and with
    /// MetaRoCE the receiver's hint.
    pub fn rate_mbps(&self) -> u32 {
        let own = match &self.rate {
            RateState::Dcqcn(d) => d.rate_mbps(),
            RateState::Timely(t) => t.rate_mbps(),
            RateState::Swift(_) | RateState::None => 0,
        };
        let hint = if self.algorithm == Algorithm::MetaRoce {
            self.hint_mbps
        } else {
            0
        };
        match (own, hint) {
            (0, h) => h,
            (r, 0) => r,
            (r, h) => r.min(h),
        }
    }

    /// Whether a rate may limit this connection (a rate-based controller, or MetaRoCE once a
    /// hint has arrived): the per-packet pacing work is skipped otherwise.
    #[inline(always)]
    pub fn paced(&self) -> bool {
        match self.rate {
            RateState::Dcqcn(_) | RateState::Timely(_) => true,
            RateState::Swift(_) => false,
            RateState::None => self.hint_mbps != 0 && self.algorithm == Algorithm::MetaRoce,
        }
    }

    /// The last rate hint an ACK carried, Mb/s (0: none).
    pub fn hint_mbps(&self) -> u32 {
        self.hint_mbps
    }

    /// When a packet of `bytes` ready at `now` may leave at the current rate (with a burst of
    /// `burst_bytes` after idleness); the pacer books it.
    pub fn departure(&mut self, now: Instant, bytes: u64, burst_bytes: u64) -> Instant {
        let rate = self.rate_mbps();
        self.pacer.depart(now, bytes, rate, burst_bytes)
    }

    /// When a packet of `bytes` ready at `now` may leave (the pacer books nothing): `None` while
    /// the rate is unlimited.
    #[inline]
    pub fn next_departure(&self, now: Instant, bytes: u64, burst_bytes: u64) -> Option<Instant> {
        if !self.paced() {
            return None;
        }
        let rate = self.rate_mbps();
        if rate == 0 {
            return None;
        }
        let credit = serialisation_ns(burst_bytes.saturating_sub(bytes), rate);
        Some(self.pacer.next_free().max(now.before(credit)).max(now))
    }

    /// A data packet of `bytes` left at `now`: the pacer books it (at a limited rate) and DCQCN's
    /// byte counter counts it. MetaRoCE before its first hint counts it to book at the hint.
    #[inline]
    pub fn on_departure(&mut self, now: Instant, bytes: u64, burst_bytes: u64) {
        if !self.paced() {
            if matches!(self.algorithm, Algorithm::MetaRoce) {
                self.unpaced.get_or_insert((now, 0)).1 += bytes;
            }
            return;
        }
        let rate = self.rate_mbps();
        if rate != 0 {
            self.pacer.depart(now, bytes, rate, burst_bytes);
        }
        self.owed = None;
        self.on_sent(now, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::at;

    fn ack(now: u64, hint_mbps: u32) -> AckReport {
        AckReport {
            acked: 1,
            marked: false,
            srtt: 5_000,
            now: at(now),
            hint_mbps,
        }
    }

    /// A window started below its maximum grows one packet per window's worth of unmarked
    /// ACKs, to the maximum and no further; the connection's starts at the paths' together. A
    /// start of 0 or above the maximum is the maximum; DCQCN keeps the maximum as its cap.
    #[test]
    fn a_window_started_low_grows_to_its_maximum() {
        let unmarked = |acked, t| AckReport {
            acked,
            marked: false,
            srtt: 5_000,
            now: at(t),
            hint_mbps: 0,
        };
        let mut r: RateControl<4> = RateControl::new(Algorithm::MetaRoce, 128).starting_at(32);
        assert_eq!((r.window(PathId(0)), r.connection_window()), (32, 4 * 32));
        r.on_ack(PathId(0), unmarked(32, 1_000));
        assert_eq!(r.window(PathId(0)), 33);
        for t in 0..1_000 {
            r.on_ack(PathId(0), unmarked(255, 2_000 + t));
        }
        assert_eq!((r.window(PathId(0)), r.window(PathId(1))), (128, 32));
        let marked = AckReport {
            marked: true,
            ..unmarked(1, 10_000_000)
        };
        r.on_ack(PathId(0), marked);
        assert_eq!(r.window(PathId(0)), 64);
        let start = |cc, max, start| {
            RateControl::<4>::new(cc, max)
                .starting_at(start)
                .window(PathId(0))
        };
        assert_eq!(start(Algorithm::MetaRoce, 128, 0), 128);
        assert_eq!(start(Algorithm::EcnAimd, 16, 32), 16);
        assert_eq!(start(Algorithm::EcnAimd, 128, 32), 32);
        let dcqcn = Algorithm::Dcqcn(DcqcnParams::vendor(100_000));
        assert_eq!(start(dcqcn, 128, 32), 128);
    }

    #[test]
    fn the_first_window_is_paid_for_at_the_lowest_hint_before_the_sender_resumes() {
        let mut r: RateControl<4> = RateControl::new(Algorithm::MetaRoce, 16);
        // Sixteen 4000-byte packets leave unpaced from 1 us on.
        for k in 0..16 {
            r.on_departure(at(1_000 + k * 100), 4_000, 65_536);
        }
        // The first hint, 8000 Mb/s (the receiver has heard of few senders yet): 64,000 bytes
        // take 64 us at it, so nothing leaves before 65 us.
        r.on_ack(PathId(0), ack(5_000, 8_000));
        assert_eq!(r.next_departure(at(6_000), 4_000, 65_536), Some(at(65_000)));
        // A lower hint before the sender resumes (the receiver has heard of more): 2000 Mb/s,
        // 256 us from 1 us on.
        r.on_ack(PathId(1), ack(7_000, 2_000));
        assert_eq!(
            r.next_departure(at(8_000), 4_000, 65_536),
            Some(at(257_000))
        );
        // The sender resumes; a lower hint then paces what follows, and books nothing again.
        r.on_departure(at(257_000), 4_000, 65_536);
        r.on_ack(PathId(0), ack(258_000, 1_000));
        assert_eq!(
            r.next_departure(at(258_000), 4_000, 65_536),
            Some(at(257_000 + 16_000))
        );
    }

    #[test]
    fn a_peer_without_hints_leaves_nothing_owed() {
        let mut r: RateControl<4> = RateControl::new(Algorithm::MetaRoce, 16);
        for k in 0..16 {
            r.on_departure(at(k * 100), 4_000, 65_536);
        }
        // An ACK without a hint: what left so far is not owed to a later hint.
        r.on_ack(PathId(0), ack(5_000, 0));
        r.on_ack(PathId(0), ack(6_000, 1_000));
        assert_eq!(r.next_departure(at(6_000), 4_000, 0), Some(at(6_000)));
    }
}
