//! Rate control: the windows a connection may fill, as pure state machines.
//!
//! The connection reports what it learns (an ACK with the packets it acknowledged and whether it
//! carried ECN marks, the path's smoothed RTT, a loss, a timeout) and asks for each path's window;
//! nothing else in the connection touches a window. A controller holds no references and does no
//! I/O: the same inputs give the same outputs. Integer state only (windows in 1/256 of a packet),
//! so that a hardware pipeline can mirror it bit for bit. Controllers are chosen by enum, without
//! allocation: today's ECN AIMD per path ([`Algorithm::EcnAimd`]) is the one built.

mod aimd;

pub use aimd::PathAimd;

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
}

/// What an ACK told the sender about path `path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckReport {
    /// Packets it acknowledged for the first time.
    pub acked: u32,
    /// Whether it reported CE marks (or an ECN echo).
    pub marked: bool,
    /// The path's smoothed RTT, ns (the controller's notion of "once per RTT").
    pub srtt: u64,
    /// When it arrived, ns.
    pub now: u64,
}

/// The windows of a connection's `P` paths under one controller.
#[derive(Debug, Clone)]
pub struct RateControl<const P: usize> {
    algorithm: Algorithm,
    /// The largest window of a path, packets.
    max_window: u32,
    paths: [PathAimd; P],
}

impl<const P: usize> RateControl<P> {
    /// Every path starts at `max_window` packets (at least one).
    pub fn new(algorithm: Algorithm, max_window: u32) -> Self {
        let max_window = max_window.max(1);
        RateControl {
            algorithm,
            max_window,
            paths: [PathAimd::new(max_window); P],
        }
    }

    /// The controller.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// An ACK of path `path`. Returns whether it cut the path's window.
    pub fn on_ack(&mut self, path: usize, ack: AckReport) -> bool {
        let max = self.max_window;
        match (self.algorithm, self.paths.get_mut(path)) {
            (Algorithm::EcnAimd, Some(p)) => p.on_ack(ack, max),
            (_, None) => false,
        }
    }

    /// Path `path` lost a packet. ECN AIMD does not react: the fabric is lossy by design.
    pub fn on_loss(&mut self, path: usize, _now: u64) {
        let _ = path;
    }

    /// Path `path` timed out. ECN AIMD does not react: timeouts lead to probes and failover.
    pub fn on_timeout(&mut self, path: usize, _now: u64) {
        let _ = path;
    }

    /// Path `path`'s window, whole packets (at least one).
    pub fn window(&self, path: usize) -> u32 {
        self.paths
            .get(path)
            .map_or(1, |p| (p.window() / ONE_PACKET).max(1))
    }
}
