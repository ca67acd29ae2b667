//! A packet-level simulator of MetaRoCE connections: two endpoints over a seeded virtual link in
//! virtual time, with loss (independent or in runs), reordering, duplication, corruption and
//! delay per path, and optionally a path that dies. It moves real bytes between two memories and
//! verifies every one of them. `metaroce selftest` runs it; the cluster-scale simulator grows
//! from it.
//!
//! - [`config`]: what to run and what it found.
//! - [`incast`]: N senders into one receiver through a switch port with a finite buffer and ECN
//!   marking, to compare the rate controllers.
//! - [`pair`]: two connections on a lossless wire in stepped time, driven by hand (the core's
//!   tests and the connection's fuzz target).
//! - `link`: the ECMP link model (routes by UDP source port).
//! - `endpoint`: the runner of one connection and its memory.
//! - `workload`: the messages A posts and the completions they give.
//! - `verify`: every byte and every atomic checked at the end.
//!
//! The same seed gives the same run, to the byte.

pub mod config;
mod endpoint;
pub mod incast;
mod link;
pub mod pair;
mod verify;
mod workload;

pub use config::{Burst, Ops, SelftestConfig, SelftestReport};

use endpoint::{Endpoint, BASE_B};
use link::Link;
use metaroce_frames::gen::Rng;
use std::net::{IpAddr, Ipv4Addr};
use transport_core::conn::{Access, Applied, Connection, Event, PathId, Region};
use transport_core::time::Instant;
use workload::{Workload, COUNTERS, KEY_ATOM, KEY_B};

/// Paths at most.
pub const MAX_PATHS: usize = 64;
/// Packets in flight per connection at most.
const W: usize = 4096;
/// Streams.
const S: usize = 4;
/// Work requests queued.
const Q: usize = 64;
/// Refusals held.
const R: usize = 4;
type Conn = Connection<MAX_PATHS, W, S, Q, R>;

/// Virtual time after which a run that has not finished stops: 10 s.
const TIME_LIMIT_NS: u64 = 10_000_000_000;

/// Runs the simulation (on a thread of its own: see [`on_own_stack`]).
pub fn run(cfg: &SelftestConfig) -> SelftestReport {
    let cfg = cfg.clone();
    on_own_stack("selftest", move || simulate(&cfg))
}

/// Runs a simulation on a thread of its own with a 64 MiB stack: the connections are built by
/// value before they are boxed, and in a debug build that wants more stack than a test thread
/// has.
pub(crate) fn on_own_stack<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    std::thread::Builder::new()
        .name(name.into())
        .stack_size(64 << 20)
        .spawn(f)
        .unwrap_or_else(|e| panic!("spawn the {name} thread: {e}"))
        .join()
        .unwrap_or_else(|_| panic!("the {name} thread panicked"))
}

fn simulate(cfg: &SelftestConfig) -> SelftestReport {
    let mut rng = Rng::new(cfg.seed);
    let size = cfg.bytes as usize;
    let ip_a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let ip_b = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let seed = cfg.seed as u32;
    let cfg_a = endpoint::config(cfg, (ip_a, ip_b), (0x11, 0x22), seed);
    let cfg_b = endpoint::config(cfg, (ip_b, ip_a), (0x22, 0x11), seed ^ 0x5555);
    let mut a = Endpoint::new(cfg_a, true, size, 0, &mut rng);
    let mut b = Endpoint::new(cfg_b, false, size, 8 * COUNTERS, &mut rng);
    let all = Access::REMOTE_WRITE
        .union(Access::REMOTE_READ)
        .union(Access::LOCAL_WRITE);
    // B exposes one region covering both of its buffers: dst at BASE_B, src right after.
    b.conn
        .register(Region {
            key: KEY_B,
            base: BASE_B,
            len: 2 * size as u64,
            access: all,
        })
        .expect("register");
    let mut work = Workload::new(workload::plan(cfg, &mut rng), cfg.bytes);
    b.conn
        .register(Region {
            key: KEY_ATOM,
            base: work.atom_base(),
            len: 8 * COUNTERS as u64,
            access: Access::REMOTE_ATOMIC,
        })
        .expect("register counters");
    a.atom = vec![0; 8 * work.plan.len()];

    let mut link = Link::new(cfg);
    let base_rtt = 2 * cfg.delay_ns
        + link.serialisation(cfg.window_per_path as usize)
        + link.serialisation(4096 + 52);
    let mut report = SelftestReport {
        bytes_posted: cfg.bytes,
        ..Default::default()
    };
    let mut failed = cfg.fail_path.is_none();
    let mut placed: std::collections::HashMap<u64, u32> = Default::default(); // address -> length
    let mut last_delivery = Instant::ZERO;
    let mut max_gap_after_fail = 0u64;
    let mut now = Instant::ZERO;
    let mut buf = vec![0u8; 4096 + 256];
    let mut done_at = Instant::ZERO;
    let fail_at = Instant::from_nanos(cfg.fail_at_ns);

    loop {
        // Kill the route of the failing path at its time.
        if !failed && now >= fail_at {
            let p = PathId(cfg.fail_path.unwrap_or(0));
            if let (Some(sa), Some(sb)) = (a.conn.path_stats(p), b.conn.path_stats(p)) {
                link.kill((true, sa.src_port));
                link.kill((false, sb.src_port));
            }
            failed = true;
            last_delivery = now;
        }
        work.post(now, &mut a, &mut b);
        // Completions.
        for (is_a, ep) in [(true, &mut a), (false, &mut b)] {
            while let Some(ev) = ep.conn.poll_event() {
                match ev {
                    Event::Completion(c) => {
                        if work.complete(is_a, &c, &mut report) {
                            done_at = now;
                        }
                    }
                    Event::PathFailed { path, .. } => {
                        if Some(path.0) == cfg.fail_path && is_a && !report.path_failure_detected {
                            report.path_failure_detected = true;
                            report.failure_detect_rtts =
                                now.since(fail_at) as f64 / base_rtt as f64;
                        }
                    }
                    Event::PathRestored { .. } => {}
                }
            }
        }
        if work.done(&report) {
            report.finished = true;
            break;
        }
        report.data_packets_lost += a.transmit(now, &mut buf, &mut link, &mut rng);
        report.data_packets_lost += b.transmit(now, &mut buf, &mut link, &mut rng);
        // Next instant.
        let mut next = Instant::MAX;
        for t in [link.next_at(), a.next_at(now), b.next_at(now)]
            .into_iter()
            .flatten()
        {
            next = next.min(t);
        }
        if !failed {
            next = next.min(fail_at);
        }
        if next == Instant::MAX || next > Instant::from_nanos(TIME_LIMIT_NS) {
            break;
        }
        now = next;
        // Arrivals due now.
        while let Some(x) = link.pop_due(now) {
            let ep = if x.to_b { &mut b } else { &mut a };
            match ep.receive(now, &x) {
                Applied::Atomic { .. } => report.atomics += 1,
                Applied::Placed { addr, len } => {
                    if placed.insert(addr, len as u32).is_some() {
                        report.duplicates_delivered += 1;
                    } else {
                        report.bytes_delivered += len as u64;
                    }
                    if failed && cfg.fail_path.is_some() {
                        max_gap_after_fail = max_gap_after_fail.max(now.since(last_delivery));
                    }
                    last_delivery = now;
                }
                _ => {}
            }
        }
        a.timers(now);
        b.timers(now);
    }

    verify::verify(&work.plan, &a, &b, &mut report);
    if std::env::var_os("METAROCE_SELFTEST_DEBUG").is_some() {
        eprintln!("A {:?}", a.conn.counters());
        eprintln!("B {:?}", b.conn.counters());
    }
    // Packets sent again after a receiver-not-ready NACK are not loss repairs.
    let retx = |c: &transport_core::conn::Counters| c.retransmitted.saturating_sub(c.rnr_retries);
    report.retransmissions = retx(a.conn.counters()) + retx(b.conn.counters());
    report.retransmits_per_loss = if report.data_packets_lost == 0 {
        0.0
    } else {
        report.retransmissions as f64 / report.data_packets_lost as f64
    };
    let t = done_at.as_nanos().max(1);
    report.virtual_time_us = t as f64 / 1000.0;
    report.goodput_fraction = report.bytes_delivered as f64 / (t as f64 * link.rate_bytes_per_ns());
    if cfg.fail_path.is_some() {
        report.failover_stall_rtts = max_gap_after_fail as f64 / base_rtt as f64;
    }
    report
}
