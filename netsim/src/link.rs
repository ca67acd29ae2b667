//! The virtual link between two endpoints.
//!
//! It follows ECMP: each UDP source port is a route; packets of one route keep their order (a
//! delayed packet delays those behind it), packets of different routes overtake each other. Each
//! direction serialises at the link rate; then propagation delay, and per datagram loss (one by
//! one, or in runs on one route), corruption, reordering and duplication. A dead route drops
//! everything sent on it.

use crate::config::SelftestConfig;
use metaroce_frames::gen::Rng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use transport_core::time::Instant;
use transport_core::wire::Opcode;

/// A datagram on its way, ordered by arrival time (then by when it was sent).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Arrival {
    /// When it arrives, ns.
    pub at: Instant,
    seq: u64,
    /// Whether it goes from A to B.
    pub to_b: bool,
    /// The UDP source port it was sent from.
    pub src_port: u16,
    /// The datagram, BTH to ICRC.
    pub bytes: Vec<u8>,
}

/// A route: a direction (from A or not) and a UDP source port.
pub(crate) type Route = (bool, u16);

/// Bytes a datagram takes on the wire beyond BTH to ICRC: Ethernet with preamble, gap and FCS,
/// IPv4 and UDP.
const FRAMING: usize = 66;

pub(crate) struct Link {
    rate_bytes_per_ns: f64,
    delay_ns: u64,
    jitter_ns: u64,
    loss: f64,
    corrupt: f64,
    reorder: f64,
    dup: f64,
    /// Data datagrams one loss event takes.
    run: u32,
    /// Probability that a data datagram outside a run starts one.
    start: f64,
    in_flight: BinaryHeap<Reverse<Arrival>>,
    route_last: HashMap<Route, Instant>,
    dead: Vec<Route>,
    run_left: HashMap<Route, u32>,
    seq: u64,
}

impl Link {
    pub fn new(cfg: &SelftestConfig) -> Link {
        // Losses in runs: a loss event starts with probability `start` on a datagram outside a
        // run and takes it and the next `run - 1` datagrams of its kind on its route. With f the
        // share to lose and N the run, a cycle is 1/start - 1 datagrams kept then N lost, so
        // start = f / (N (1 - f) + f) keeps the share at f.
        let run = cfg.burst.len(cfg.window_per_path);
        let start = if cfg.loss >= 1.0 {
            1.0
        } else {
            cfg.loss / (f64::from(run) * (1.0 - cfg.loss) + cfg.loss)
        };
        Link {
            rate_bytes_per_ns: cfg.link_gbps / 8.0,
            delay_ns: cfg.delay_ns,
            jitter_ns: cfg.jitter_ns,
            loss: cfg.loss,
            corrupt: cfg.corrupt,
            reorder: cfg.reorder,
            dup: cfg.dup,
            run,
            start,
            in_flight: BinaryHeap::new(),
            route_last: HashMap::new(),
            dead: Vec::new(),
            run_left: HashMap::new(),
            seq: 0,
        }
    }

    /// The link rate in bytes per nanosecond.
    pub fn rate_bytes_per_ns(&self) -> f64 {
        self.rate_bytes_per_ns
    }

    /// Time a datagram of `len` bytes (BTH to ICRC) takes to leave, ns.
    pub fn serialisation(&self, len: usize) -> u64 {
        ((len + FRAMING) as f64 / self.rate_bytes_per_ns).ceil() as u64
    }

    /// From now on `route` drops everything.
    pub fn kill(&mut self, route: Route) {
        self.dead.push(route);
    }

    /// Carries a datagram that finished leaving at `departed` on `route`. Returns whether it was
    /// a data packet the link lost or corrupted.
    ///
    /// Runs take data datagrams of one route, and a run counts only those: the data share lost
    /// stays f whatever control traffic goes between them. Control datagrams (ACKs, NACKs,
    /// probes) are lost one by one at the same share: they are sparse on a route, and a run of
    /// them would span many round trips, an outage that a dead route models instead.
    pub fn carry(
        &mut self,
        rng: &mut Rng,
        route: Route,
        mut bytes: Vec<u8>,
        departed: Instant,
    ) -> bool {
        let data = Opcode::from_u8(bytes[0]).is_metaroce() && bytes[0] < 0xe0;
        let dead = self.dead.contains(&route);
        let left = self.run_left.entry(route).or_insert(0);
        let lost = dead
            || if !data {
                rng.chance_f(self.loss)
            } else if *left > 0 {
                *left -= 1;
                true
            } else if rng.chance_f(self.start) {
                *left = self.run - 1;
                true
            } else {
                false
            };
        let corrupt = !lost && rng.chance_f(self.corrupt);
        let data_lost = data && (lost || corrupt);
        if lost {
            return data_lost;
        }
        if corrupt {
            let i = rng.below(bytes.len() as u64) as usize;
            bytes[i] ^= 1 << rng.below(8);
        }
        let mut at = departed + self.delay_ns;
        if rng.chance_f(self.reorder) {
            at += rng.below(self.jitter_ns + 1);
        }
        let last = self.route_last.entry(route).or_insert(Instant::ZERO);
        at = at.max(*last);
        *last = at;
        let copies = if rng.chance_f(self.dup) { 2 } else { 1 };
        for c in 0..copies {
            self.seq += 1;
            self.in_flight.push(Reverse(Arrival {
                at: at + c,
                seq: self.seq,
                to_b: route.0,
                src_port: route.1,
                bytes: bytes.clone(),
            }));
        }
        data_lost
    }

    /// When the next datagram arrives.
    pub fn next_at(&self) -> Option<Instant> {
        self.in_flight.peek().map(|Reverse(x)| x.at)
    }

    /// The next datagram due by `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<Arrival> {
        if self.next_at()? <= now {
            self.in_flight.pop().map(|Reverse(x)| x)
        } else {
            None
        }
    }
}
