//! What a simulation runs (`SelftestConfig`) and what it found (`SelftestReport`).

/// Which operations the workload uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ops {
    /// Writes only (the goodput measurement).
    Write,
    /// Writes, Writes with immediate, Sends, Sends with immediate and Reads on several streams.
    Mixed,
}

/// How the link's losses fall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Burst {
    /// Each datagram is lost on its own.
    Independent,
    /// A loss takes the next N datagrams of one route (one path in one direction), as a switch
    /// whose buffer is full drops what arrives next, or a kernel that moves a path's consecutive
    /// datagrams as one buffer (GSO, GRO) drops them together.
    Run(u32),
    /// A loss takes a path's whole flight: the next `window_per_path` datagrams of its route.
    Flight,
}

impl Burst {
    /// Datagrams one loss event takes.
    pub fn len(self, window_per_path: u32) -> u32 {
        match self {
            Burst::Independent => 1,
            Burst::Run(n) => n.max(1),
            Burst::Flight => window_per_path.max(1),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct SelftestConfig {
    /// Payload bytes to move.
    pub bytes: u64,
    /// Paths per connection.
    pub paths: u8,
    /// The share of datagrams lost (in expectation; see `burst` for how they fall).
    pub loss: f64,
    /// How losses fall: one by one, or in runs on one route.
    pub burst: Burst,
    /// Probability that a packet is delayed by up to `jitter_ns` (reordering across routes).
    pub reorder: f64,
    /// Probability that a packet is delivered twice.
    pub dup: f64,
    /// Probability that a packet has a byte flipped (the ICRC catches it).
    pub corrupt: f64,
    /// Seed of everything random.
    pub seed: u64,
    /// A path whose route dies.
    pub fail_path: Option<u8>,
    /// When it dies, ns.
    pub fail_at_ns: u64,
    /// Link rate in Gb/s, each direction.
    pub link_gbps: f64,
    /// One-way propagation delay, ns.
    pub delay_ns: u64,
    /// Extra delay of a reordered packet, at most, ns.
    pub jitter_ns: u64,
    /// The first PSN each end sends (to test the wrap).
    pub initial_psn: u32,
    /// The workload.
    pub ops: Ops,
    /// Packets in flight per path.
    pub window_per_path: u32,
}

impl Default for SelftestConfig {
    fn default() -> Self {
        SelftestConfig {
            bytes: 64 << 20,
            paths: 16,
            loss: 0.0,
            burst: Burst::Independent,
            reorder: 0.0,
            dup: 0.0,
            corrupt: 0.0,
            seed: 1,
            fail_path: None,
            fail_at_ns: 2_000_000,
            link_gbps: 100.0,
            delay_ns: 2_000,
            jitter_ns: 4_000,
            initial_psn: 0,
            ops: Ops::Write,
            window_per_path: 16,
        }
    }
}

/// What happened.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SelftestReport {
    /// Payload bytes posted.
    pub bytes_posted: u64,
    /// Payload bytes placed, counted once per byte.
    pub bytes_delivered: u64,
    /// Bytes found equal at the end.
    pub bytes_verified: u64,
    /// Placements of data that had already been placed.
    pub duplicates_delivered: u64,
    /// Payload bytes per unit of link capacity over the run.
    pub goodput_fraction: f64,
    /// Retransmissions per data packet the link lost.
    pub retransmits_per_loss: f64,
    /// The longest pause in delivery after the path failure, in base RTTs (0 without a failure).
    pub failover_stall_rtts: f64,
    /// Virtual time at the last completion, microseconds.
    pub virtual_time_us: f64,
    /// Data packets the link lost (dropped, corrupted or on a dead route).
    pub data_packets_lost: u64,
    /// Retransmissions sent.
    pub retransmissions: u64,
    /// Work requests completed with success.
    pub completions: u64,
    /// Completions out of order within a stream, or with an error status.
    pub completion_errors: u64,
    /// Whether the failed path was declared failed (when one failed).
    pub path_failure_detected: bool,
    /// Time from the failure to its declaration, in base RTTs.
    pub failure_detect_rtts: f64,
    /// Whether everything completed before the time limit.
    pub finished: bool,
    /// Fetch-and-add operations performed (mixed workload).
    pub atomics: u64,
    /// Whether every counter ended at the number of its fetch-and-adds and every original value
    /// came back exactly once (true when there were none).
    pub atomics_exact: bool,
}

impl SelftestReport {
    /// Whether every byte arrived exactly once and equal, and every completion was in order.
    pub fn ok(&self) -> bool {
        self.finished
            && self.bytes_delivered == self.bytes_posted
            && self.bytes_verified == self.bytes_posted
            && self.duplicates_delivered == 0
            && self.completion_errors == 0
            && self.atomics_exact
    }
}
