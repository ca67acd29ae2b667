//! A two-endpoint harness: two connections over a seeded virtual link in virtual time, with loss
//! (independent or in runs), reordering, duplication, corruption and delay per path, and optionally
//! a path that dies. It moves real bytes between two memories and verifies every one of them.
//!
//! The link follows ECMP: each UDP source port is a route; packets of one route keep their order
//! (a delayed packet delays those behind it), packets of different routes overtake each other.
//! A failed route drops everything sent on it, in both directions; a path that moves to a new
//! source port moves to a new route.

use crate::gen::Rng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use transport_core::conn::{
    Access, Applied, CompletionKind, Config, Connection, Event, FlatMemory, Memory, RecvRequest,
    Region, RemoteAddr, Status, WorkRequest, WrOp,
};
use transport_core::wire::{Opcode, Psn, Qpn};

/// Paths at most.
pub const MAX_PATHS: usize = 64;
const W: usize = 4096;
const S: usize = 4;
const Q: usize = 64;
const R: usize = 4;
type Conn = Connection<MAX_PATHS, W, S, Q, R>;

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

#[derive(Debug, Clone, Copy)]
struct Msg {
    op: WrOp,
    stream: u16,
    offset: u64,
    len: u32,
}

const BASE_A: u64 = 0x1000_0000;
const BASE_B: u64 = 0x9000_0000;
const KEY_B: u32 = 0xb0b;
const KEY_ATOM: u32 = 0xa70;
/// Counters B exposes to fetch-and-add.
const COUNTERS: usize = 8;

struct Endpoint {
    conn: Box<Conn>,
    /// Source data (A) or the responder's readable data (B).
    src: Vec<u8>,
    /// Destination of Writes and Sends (B) or of Reads (A).
    dst: Vec<u8>,
    link_free: u64,
    wake: Option<u64>,
    /// B: the counters; A: the original values returned, 8 bytes per work request.
    atom: Vec<u8>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Arrival {
    at: u64,
    seq: u64,
    to_b: bool,
    src_port: u16,
    bytes: Vec<u8>,
}

/// Runs the harness (on a thread of its own: the connections are built by value before they are
/// boxed, and in a debug build that wants more stack than a test thread has).
pub fn run(cfg: &SelftestConfig) -> SelftestReport {
    let cfg = cfg.clone();
    std::thread::Builder::new()
        .name("selftest".into())
        .stack_size(64 << 20)
        .spawn(move || simulate(&cfg))
        .expect("spawn the selftest thread")
        .join()
        .expect("the selftest thread finished")
}

/// Where the path sequences of the end with entropy seed `seed` start.
fn path_seq_origin(seed: u32) -> u32 {
    seed.wrapping_mul(0x9e37_79b9).rotate_left(13) ^ 0xfff0_0000
}

fn simulate(cfg: &SelftestConfig) -> SelftestReport {
    let mut rng = Rng::new(cfg.seed);
    let size = cfg.bytes as usize;
    let ip_a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let ip_b = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let mk = |local, remote, lq, rq, seed, psn: u32, peer: u32| {
        let mut c = Config::new(local, remote, Qpn::new(lq), Qpn::new(rq));
        c.paths = cfg.paths;
        c.entropy_seed = seed;
        c.initial_psn = Psn::new(psn);
        c.peer_initial_psn = Psn::new(peer);
        // Path and probe sequences start where a runner's random draw would put them: from the
        // seeds of both ends, so that every run crosses different points of the 32-bit space.
        c.initial_path_seq = path_seq_origin(seed);
        // The two ends' entropy seeds differ by 0x5555.
        c.peer_initial_path_seq = path_seq_origin(seed ^ 0x5555);
        c.initial_probe_seq = path_seq_origin(!seed);
        c.window_per_path = cfg.window_per_path;
        // Timer floors for this link's few-microsecond RTT (the defaults suit real fabrics).
        c.rto_low = 10_000;
        c.rto_high = 16_000;
        c.probe_interval = 8_000;
        c.timeouts_to_probe = 2;
        c.probes_to_fail = 2;
        c
    };
    let psn0 = cfg.initial_psn;
    let mut a = Endpoint {
        conn: Box::new(Conn::new(mk(
            ip_a,
            ip_b,
            0x11,
            0x22,
            cfg.seed as u32,
            psn0,
            psn0,
        ))),
        src: (0..size).map(|_| rng.next_u64() as u8).collect(),
        dst: vec![0; size],
        link_free: 0,
        wake: Some(0),
        atom: Vec::new(),
    };
    let mut b = Endpoint {
        conn: Box::new(Conn::new(mk(
            ip_b,
            ip_a,
            0x22,
            0x11,
            cfg.seed as u32 ^ 0x5555,
            psn0,
            psn0,
        ))),
        src: (0..size).map(|_| rng.next_u64() as u8).collect(),
        dst: vec![0; size],
        link_free: 0,
        wake: None,
        atom: vec![0; 8 * COUNTERS],
    };
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
    let atom_base = BASE_B + 2 * size as u64;
    b.conn
        .register(Region {
            key: KEY_ATOM,
            base: atom_base,
            len: 8 * COUNTERS as u64,
            access: Access::REMOTE_ATOMIC,
        })
        .expect("register counters");

    // The workload: messages covering [0, size) in order, with their operations and streams.
    let mut plan = Vec::new();
    let mut off = 0u64;
    while off < cfg.bytes {
        let len = (16_384 + rng.below(1 << 20)).min(cfg.bytes - off) as u32;
        let (op, stream) = match cfg.ops {
            Ops::Write => (WrOp::Write, 0),
            Ops::Mixed => {
                let op = match rng.below(5) {
                    0 => WrOp::Write,
                    1 => WrOp::WriteWithImm(rng.next_u64() as u32),
                    2 => WrOp::Send,
                    3 => WrOp::SendWithImm(rng.next_u64() as u32),
                    _ => WrOp::Read,
                };
                (op, rng.below(S as u64) as u16)
            }
        };
        plan.push(Msg {
            op,
            stream,
            offset: off,
            len,
        });
        off += u64::from(len);
        if cfg.ops == Ops::Mixed && rng.below(3) == 0 {
            let stream = rng.below(S as u64) as u16;
            plan.push(Msg {
                op: WrOp::FetchAdd(1),
                stream,
                offset: 0,
                len: 8,
            });
        }
    }
    a.atom = vec![0; 8 * plan.len()];
    let res_base = BASE_A + 2 * size as u64;

    let rate_bytes_per_ns = cfg.link_gbps / 8.0;
    let ser = |len: usize| ((len + 66) as f64 / rate_bytes_per_ns).ceil() as u64;
    let base_rtt = 2 * cfg.delay_ns + ser(cfg.window_per_path as usize) + ser(4096 + 52);
    let mut report = SelftestReport {
        bytes_posted: cfg.bytes,
        ..Default::default()
    };
    let mut heap: BinaryHeap<Reverse<Arrival>> = BinaryHeap::new();
    let mut route_last: HashMap<(bool, u16), u64> = HashMap::new();
    let mut dead_ports: Vec<(bool, u16)> = Vec::new();
    // Losses in runs: a loss event starts with probability `start` on a datagram outside a run and
    // takes it and the next `run - 1` datagrams of its kind on its route. With f the share to lose and N the
    // run, a cycle is 1/start - 1 datagrams kept then N lost, so start = f / (N (1 - f) + f) keeps
    // the share at f.
    let run = cfg.burst.len(cfg.window_per_path);
    let start = if cfg.loss >= 1.0 {
        1.0
    } else {
        cfg.loss / (f64::from(run) * (1.0 - cfg.loss) + cfg.loss)
    };
    // Runs take data datagrams of one route, and a run counts only those: the data share lost
    // stays f whatever control traffic goes between them. Control datagrams (ACKs, NACKs, probes)
    // are lost one by one at the same share: they are sparse on a route, and a run of them would
    // span many round trips, an outage that `fail_path` models instead.
    let mut run_left: HashMap<(bool, u16), u32> = HashMap::new();
    let mut failed = cfg.fail_path.is_none();
    let mut placed: HashMap<u64, u32> = HashMap::new(); // destination address -> length
    let mut next_post = 0usize;
    let mut in_flight = 0usize;
    let mut expected_next: HashMap<(bool, u16), u64> = HashMap::new();
    let mut last_delivery = 0u64;
    let mut max_gap_after_fail = 0u64;
    let mut now = 0u64;
    let mut seq = 0u64;
    let mut buf = vec![0u8; 4096 + 256];
    let mut done_at = 0u64;
    let limit = 10_000_000_000u64; // 10 s of virtual time

    loop {
        // Kill the route of the failing path at its time.
        if !failed && now >= cfg.fail_at_ns {
            let p = usize::from(cfg.fail_path.unwrap_or(0));
            if let (Some(sa), Some(sb)) = (a.conn.path_stats(p), b.conn.path_stats(p)) {
                dead_ports.push((true, sa.src_port));
                dead_ports.push((false, sb.src_port));
            }
            failed = true;
            last_delivery = now;
        }
        // Post work while there is room.
        while next_post < plan.len() && in_flight < Q / 2 {
            let m = plan[next_post];
            let id = next_post as u64;
            let remote = match m.op {
                WrOp::Read => RemoteAddr {
                    va: BASE_B + size as u64 + m.offset,
                    rkey: KEY_B,
                },
                WrOp::FetchAdd(_) => RemoteAddr {
                    va: atom_base + 8 * (id % COUNTERS as u64),
                    rkey: KEY_ATOM,
                },
                _ => RemoteAddr {
                    va: BASE_B + m.offset,
                    rkey: KEY_B,
                },
            };
            let local_addr = match m.op {
                WrOp::Read => BASE_A + size as u64 + m.offset,
                WrOp::FetchAdd(_) => res_base + 8 * id,
                _ => BASE_A + m.offset,
            };
            if matches!(
                m.op,
                WrOp::Send | WrOp::SendWithImm(_) | WrOp::WriteWithImm(_)
            ) {
                let rr = RecvRequest {
                    id,
                    stream: m.stream,
                    addr: BASE_B + m.offset,
                    len: m.len,
                };
                if b.conn.post_recv(rr).is_err() {
                    break;
                }
            }
            let wr = WorkRequest {
                id,
                op: m.op,
                stream: m.stream,
                local_addr,
                len: m.len,
                remote,
            };
            if a.conn.post(now, wr).is_err() {
                break;
            }
            next_post += 1;
            in_flight += 1;
            a.wake = Some(now);
        }
        // Completions.
        for (is_a, ep) in [(true, &mut a), (false, &mut b)] {
            while let Some(ev) = ep.conn.poll_event() {
                match ev {
                    Event::Completion(c) => {
                        let requester = matches!(
                            c.kind,
                            CompletionKind::Send
                                | CompletionKind::Write
                                | CompletionKind::Read
                                | CompletionKind::Atomic
                        );
                        let exp = expected_next.entry((is_a, c.stream)).or_insert(0);
                        // In order within a stream: ids of one stream on one side increase.
                        if c.id < *exp || c.status != Status::Success {
                            report.completion_errors += 1;
                        }
                        *exp = c.id + 1;
                        if requester && is_a {
                            report.completions += 1;
                            in_flight -= 1;
                            done_at = now;
                        }
                    }
                    Event::PathFailed { path, .. } => {
                        if Some(path) == cfg.fail_path && is_a && !report.path_failure_detected {
                            report.path_failure_detected = true;
                            report.failure_detect_rtts =
                                now.saturating_sub(cfg.fail_at_ns) as f64 / base_rtt as f64;
                        }
                    }
                    Event::PathRestored { .. } => {}
                }
            }
        }
        if report.completions as usize == plan.len() {
            report.finished = true;
            break;
        }
        // Transmit.
        for (is_a, ep) in [(true, &mut a), (false, &mut b)] {
            while ep.wake.is_some_and(|w| w <= now) && ep.link_free <= now {
                let Some(tx) = ep.conn.poll_transmit(now, &mut buf) else {
                    ep.wake = None;
                    break;
                };
                let mem = memory_of(is_a, size, &mut ep.src, &mut ep.dst, &mut ep.atom);
                assert!(ep.conn.fill_and_seal(&tx, &mut buf, &mem), "{tx:?}");
                let bytes = buf[..tx.len].to_vec();
                ep.link_free = now + ser(tx.len);
                ep.wake = Some(ep.link_free);
                // The link.
                let data = Opcode::from_u8(bytes[0]).is_metaroce() && bytes[0] < 0xe0;
                let dead = dead_ports.contains(&(is_a, tx.src_port));
                let left = run_left.entry((is_a, tx.src_port)).or_insert(0);
                let lost = dead
                    || if !data {
                        rng.chance_f(cfg.loss)
                    } else if *left > 0 {
                        *left -= 1;
                        true
                    } else if rng.chance_f(start) {
                        *left = run - 1;
                        true
                    } else {
                        false
                    };
                let corrupt = !lost && rng.chance_f(cfg.corrupt);
                if data && (lost || corrupt) {
                    report.data_packets_lost += 1;
                }
                if lost {
                    continue;
                }
                let mut bytes = bytes;
                if corrupt {
                    let i = rng.below(bytes.len() as u64) as usize;
                    bytes[i] ^= 1 << rng.below(8);
                }
                let mut at = ep.link_free + cfg.delay_ns;
                if rng.chance_f(cfg.reorder) {
                    at += rng.below(cfg.jitter_ns + 1);
                }
                let last = route_last.entry((is_a, tx.src_port)).or_insert(0);
                at = at.max(*last);
                *last = at;
                let copies = if rng.chance_f(cfg.dup) { 2 } else { 1 };
                for c in 0..copies {
                    seq += 1;
                    heap.push(Reverse(Arrival {
                        at: at + c,
                        seq,
                        to_b: is_a,
                        src_port: tx.src_port,
                        bytes: bytes.clone(),
                    }));
                }
            }
        }
        // Next instant.
        let mut next = u64::MAX;
        if let Some(Reverse(x)) = heap.peek() {
            next = next.min(x.at);
        }
        for ep in [&a, &b] {
            if let Some(t) = ep.conn.poll_timeout() {
                next = next.min(t.max(now));
            }
            if let Some(w) = ep.wake {
                next = next.min(w.max(ep.link_free).max(now));
            }
        }
        if !failed {
            next = next.min(cfg.fail_at_ns);
        }
        if next == u64::MAX || next > limit {
            break;
        }
        now = next;
        // Arrivals due now.
        while heap.peek().is_some_and(|Reverse(x)| x.at <= now) {
            let Reverse(x) = heap.pop().expect("peeked");
            let ep = if x.to_b { &mut b } else { &mut a };
            let is_a = !x.to_b;
            let delivery = ep.conn.handle_datagram(now, x.src_port, false, &x.bytes);
            let mut mem = memory_of(is_a, size, &mut ep.src, &mut ep.dst, &mut ep.atom);
            let applied = match delivery {
                Ok(d) => ep.conn.apply(&mut mem, &x.bytes, d),
                Err(_) => Applied::Nothing,
            };
            assert_ne!(applied, Applied::OutOfMemory, "{delivery:?}");
            if let Applied::Atomic { .. } = applied {
                report.atomics += 1;
            }
            if let Applied::Placed { addr, len } = applied {
                if placed.insert(addr, len as u32).is_some() {
                    report.duplicates_delivered += 1;
                } else {
                    report.bytes_delivered += len as u64;
                }
                if failed && cfg.fail_path.is_some() {
                    max_gap_after_fail = max_gap_after_fail.max(now - last_delivery);
                }
                last_delivery = now;
            }
            ep.wake = Some(now);
        }
        for ep in [&mut a, &mut b] {
            if ep.conn.poll_timeout().is_some_and(|t| t <= now) {
                ep.conn.handle_timeout(now);
                ep.wake = Some(now);
            }
        }
    }

    // Verify: each counter ends at the number of its fetch-and-adds, and the original values
    // returned for it are exactly 0, 1, ..., n - 1.
    let mut per_counter: Vec<Vec<u64>> = vec![Vec::new(); COUNTERS];
    for (id, m) in plan.iter().enumerate() {
        if matches!(m.op, WrOp::FetchAdd(_)) {
            let v = u64::from_ne_bytes(a.atom[8 * id..8 * id + 8].try_into().expect("8 bytes"));
            per_counter[id % COUNTERS].push(v);
        }
    }
    report.atomics_exact = per_counter.iter_mut().enumerate().all(|(c, origs)| {
        origs.sort_unstable();
        let count = u64::from_ne_bytes(b.atom[8 * c..8 * c + 8].try_into().expect("8 bytes"));
        count == origs.len() as u64 && origs.iter().enumerate().all(|(i, v)| *v == i as u64)
    });
    for m in plan.iter().filter(|m| !matches!(m.op, WrOp::FetchAdd(_))) {
        let r = m.offset as usize..(m.offset + u64::from(m.len)) as usize;
        let equal = match m.op {
            WrOp::Read => a.dst[r.clone()]
                .iter()
                .zip(&b.src[r])
                .filter(|(x, y)| x == y)
                .count(),
            _ => b.dst[r.clone()]
                .iter()
                .zip(&a.src[r])
                .filter(|(x, y)| x == y)
                .count(),
        };
        report.bytes_verified += equal as u64;
    }
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
    let t = done_at.max(1);
    report.virtual_time_us = t as f64 / 1000.0;
    report.goodput_fraction = report.bytes_delivered as f64 / (t as f64 * rate_bytes_per_ns);
    if cfg.fail_path.is_some() {
        report.failover_stall_rtts = max_gap_after_fail as f64 / base_rtt as f64;
    }
    report
}

/// An endpoint's memory as the connection addresses it. A sends from `src` (at BASE_A), receives
/// Read data into `dst` (after it) and the original values of its atomics into `atom` (after
/// that); B receives Writes and Sends into `dst` (at BASE_B), serves Reads from `src` (after it)
/// and keeps the atomics' counters in `atom` (after that).
fn memory_of<'a>(
    is_a: bool,
    size: usize,
    src: &'a mut [u8],
    dst: &'a mut [u8],
    atom: &'a mut [u8],
) -> Segments<'a> {
    let n = size as u64;
    let flat = |base, bytes| FlatMemory { base, bytes };
    if is_a {
        Segments([
            flat(BASE_A, src),
            flat(BASE_A + n, dst),
            flat(BASE_A + 2 * n, atom),
        ])
    } else {
        Segments([
            flat(BASE_B, dst),
            flat(BASE_B + n, src),
            flat(BASE_B + 2 * n, atom),
        ])
    }
}

/// Memory in three segments, each at its base address.
struct Segments<'a>([FlatMemory<'a>; 3]);

impl Memory for Segments<'_> {
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        self.0.iter().find_map(|m| m.read(addr, len))
    }

    fn write(&mut self, addr: u64, bytes: &[u8]) -> bool {
        self.0
            .iter_mut()
            .find(|m| m.offset_of(addr, bytes.len()).is_some())
            .is_some_and(|m| m.write(addr, bytes))
    }
}
