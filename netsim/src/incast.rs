//! An incast through one bottleneck: `N` senders, each with its own connection to one receiver,
//! through a switch whose egress port toward the receiver has a finite buffer and marks ECN
//! between a low and a high threshold (`Kmin`, `Kmax`, `Pmax`, as DCQCN's switches do). The
//! senders' access links and the return path are never the bottleneck. Every sender starts at
//! once and writes `bytes` to the receiver; every byte is checked.
//!
//! The receiver gives each connection its max-min share of the line rate in every ACK (the
//! MetaRoCE hint, [`transport_core::rate::FairShare`]) when `hint` is on, and answers CE marks
//! with CNPs (at most one per connection per interval) for DCQCN.

use metaroce_frames::gen::Rng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr};
use transport_core::conn::{
    Access, Applied, Config, Connection, Delivery, Event, FlatMemory, Region, RemoteAddr, Status,
    WorkRequest, WrOp,
};
use transport_core::rate::{Algorithm, Drain, FairShare};
use transport_core::time::Instant;
use transport_core::wire::{Psn, Qpn};

/// Senders at most.
pub const MAX_SENDERS: usize = 256;
/// The connections' sizes (paths, packets in flight, streams, queue, regions).
type Conn = Connection<16, 1024, 1, 16, 2>;

const BASE: u64 = 0x1000_0000;
const KEY: u32 = 0x1c;
/// Bytes a packet takes on the wire beyond BTH to ICRC (Ethernet with preamble, gap and FCS, IPv4,
/// UDP).
const FRAMING: usize = 66;

/// What to run.
#[derive(Debug, Clone)]
pub struct IncastConfig {
    /// Senders, each with its own connection to the receiver.
    pub senders: usize,
    /// Bytes each sender writes.
    pub bytes: u64,
    /// The line rate of every link, Gb/s.
    pub link_gbps: f64,
    /// One-way propagation delay sender to receiver (and back), ns.
    pub delay_ns: u64,
    /// The switch's buffer for the receiver's port, bytes.
    pub buffer_bytes: u64,
    /// ECN: no mark below `kmin_bytes` of queue; probability rising to `pmax` at `kmax_bytes`;
    /// every packet above.
    pub kmin_bytes: u64,
    /// See `kmin_bytes`.
    pub kmax_bytes: u64,
    /// See `kmin_bytes`.
    pub pmax: f64,
    /// The senders' rate controller.
    pub cc: Algorithm,
    /// Whether the receiver puts each sender's fair share in its ACKs.
    pub hint: bool,
    /// Whether the shares drain a queue the receiver's data meets (`rate::Drain`, from the
    /// one-way delays of its data) instead of dividing the whole line.
    pub drain: bool,
    /// Paths per connection.
    pub paths: u8,
    /// Packets in flight per path.
    pub window_per_path: u32,
    /// The CNP interval of the receiver's notification point, ns.
    pub cnp_interval_ns: u64,
    /// Seed of the marking decisions.
    pub seed: u64,
}

impl Default for IncastConfig {
    /// 16 senders of 2 MB each at 100 Gb/s, 2 us one way; HPCC's switch at 100 Gb/s (32 MB
    /// buffer, Kmin 400 KB, Kmax 1600 KB, Pmax 0.2); MetaRoCE with the hint and the drain;
    /// 4 paths of 4 packets: 64 KiB in flight per connection, about one BDP (54 KB), as IRN
    /// caps a connection's flight.
    fn default() -> Self {
        IncastConfig {
            senders: 16,
            bytes: 2_000_000,
            link_gbps: 100.0,
            delay_ns: 2_000,
            buffer_bytes: 32_000_000,
            kmin_bytes: 400_000,
            kmax_bytes: 1_600_000,
            pmax: 0.2,
            cc: Algorithm::MetaRoce,
            hint: true,
            drain: true,
            paths: 4,
            window_per_path: 4,
            cnp_interval_ns: 50_000,
            seed: 1,
        }
    }
}

/// What happened.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IncastReport {
    /// Senders.
    pub senders: usize,
    /// Each sender's goodput, Gb/s: its bytes over the time to its completion.
    pub per_sender_goodput: Vec<f64>,
    /// Jain's fairness index over the senders' goodputs (1: all equal).
    pub jain_index: f64,
    /// Bytes delivered over the line rate times the time to the last completion.
    pub link_utilisation: f64,
    /// The deepest the switch queue got, bytes.
    pub max_queue_bytes: u64,
    /// Packets the switch dropped (buffer full).
    pub drops: u64,
    /// Packets the switch marked CE.
    pub marks: u64,
    /// CNPs the receiver sent.
    pub cnps: u64,
    /// Base RTTs from the start until every sender's delivery rate (over windows of
    /// `settle_window_rtts`) is within 10% of its share and stays so until the first finishes;
    /// None if never.
    pub settle_rtts: Option<u64>,
    /// The window the delivery rates are measured over, base RTTs.
    pub settle_window_rtts: u64,
    /// The base RTT (propagation both ways and one packet's serialisation), ns.
    pub base_rtt_ns: u64,
    /// Virtual time at the last completion, us.
    pub virtual_time_us: f64,
    /// Retransmissions, all senders.
    pub retransmissions: u64,
    /// Whether every sender completed and every byte arrived once and equal.
    pub ok: bool,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Hop {
    /// A data packet reaches the switch from sender `i`.
    Switch,
    /// A data packet leaves the switch and reaches the receiver's connection `i`.
    Receiver { marked: bool },
    /// A receiver's packet (an ACK, a CNP) reaches sender `i`.
    Sender,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: Instant,
    seq: u64,
    hop: Hop,
    i: usize,
    src_port: u16,
    bytes: Vec<u8>,
}

struct End {
    conn: Box<Conn>,
    mem: Vec<u8>,
    link_free: Instant,
    wake: Option<Instant>,
}

impl End {
    fn transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        ns_per_byte: f64,
    ) -> Vec<(Instant, u16, Vec<u8>)> {
        let mut out = Vec::new();
        while self.wake.is_some_and(|w| w <= now) && self.link_free <= now {
            let Some(tx) = self.conn.poll_transmit(now, buf) else {
                self.wake = None;
                break;
            };
            let mem = FlatMemory {
                base: BASE,
                bytes: &mut self.mem,
            };
            assert!(self.conn.fill_and_seal(&tx, buf, &mem), "{tx:?}");
            self.link_free = now + ((tx.len + FRAMING) as f64 * ns_per_byte).ceil() as u64;
            self.wake = Some(self.link_free);
            out.push((self.link_free, tx.src_port, buf[..tx.len].to_vec()));
        }
        out
    }

    fn next_at(&self, now: Instant) -> Option<Instant> {
        let timer = self.conn.poll_timeout().map(|t| t.max(now));
        let send = self.wake.map(|w| w.max(self.link_free).max(now));
        match (timer, send) {
            (Some(t), Some(s)) => Some(t.min(s)),
            (t, s) => t.or(s),
        }
    }
}

fn end_config(cfg: &IncastConfig, i: usize, sender: bool) -> Config {
    let ip = |x: usize| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + x as u32));
    let (me, peer) = if sender {
        (ip(i + 1), ip(0))
    } else {
        (ip(0), ip(i + 1))
    };
    let (lq, rq) = if sender {
        (0x100 + i as u32, 0x1000 + i as u32)
    } else {
        (0x1000 + i as u32, 0x100 + i as u32)
    };
    let mut c = Config::new(me, peer, Qpn::new(lq), Qpn::new(rq));
    c.paths = cfg.paths;
    c.mtu = 4096;
    c.entropy_seed = (i as u32).wrapping_mul(7919) ^ u32::from(sender);
    c.initial_psn = Psn::new(0);
    c.peer_initial_psn = Psn::new(0);
    c.window_per_path = cfg.window_per_path;
    c.cc = match cfg.cc {
        // The receiver is DCQCN's notification point: its CNPs (on the wire, from the core) come
        // at most once per the incast's CNP interval per connection.
        Algorithm::Dcqcn(mut p) if !sender => {
            p.cnp_interval_ns = cfg.cnp_interval_ns;
            Algorithm::Dcqcn(p)
        }
        cc => cc,
    };
    // The timers keep the core's defaults for a fabric (100 and 320 us): an incast's queue holds
    // packets for hundreds of microseconds before the first RTT sample arrives.
    c
}

/// Jain's fairness index: (sum x)^2 / (n sum x^2).
pub fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    if q == 0.0 {
        return 0.0;
    }
    s * s / (x.len() as f64 * q)
}

/// Runs the incast (on a thread of its own, for the connections' stack).
pub fn run(cfg: &IncastConfig) -> IncastReport {
    let cfg = cfg.clone();
    crate::on_own_stack("incast", move || simulate(&cfg))
}

fn simulate(cfg: &IncastConfig) -> IncastReport {
    let n = cfg.senders.clamp(1, MAX_SENDERS);
    let size = cfg.bytes as usize;
    let mut rng = Rng::new(cfg.seed);
    let ns_per_byte = 8.0 / cfg.link_gbps;
    let bytes_per_ns = cfg.link_gbps / 8.0;
    let line_mbps = (cfg.link_gbps * 1000.0) as u32;
    let mut senders: Vec<End> = (0..n)
        .map(|i| {
            let mut conn = Box::new(Conn::new(end_config(cfg, i, true)));
            conn.post(
                Instant::ZERO,
                WorkRequest {
                    id: i as u64,
                    op: WrOp::Write,
                    stream: 0,
                    local_addr: BASE,
                    len: cfg.bytes as u32,
                    remote: RemoteAddr {
                        va: BASE,
                        rkey: KEY,
                    },
                },
            )
            .expect("post");
            End {
                conn,
                mem: (0..size)
                    .map(|k| (k as u64 * 31 + i as u64) as u8)
                    .collect(),
                link_free: Instant::ZERO,
                wake: Some(Instant::ZERO),
            }
        })
        .collect();
    let mut receivers: Vec<End> = (0..n)
        .map(|i| {
            let mut conn = Box::new(Conn::new(end_config(cfg, i, false)));
            conn.register(Region {
                key: KEY,
                base: BASE,
                len: cfg.bytes,
                access: Access::REMOTE_WRITE,
            })
            .expect("register");
            End {
                conn,
                mem: vec![0; size],
                link_free: Instant::ZERO,
                wake: None,
            }
        })
        .collect();
    let base_rtt = 2 * cfg.delay_ns + ((4096 + 52 + FRAMING) as f64 * ns_per_byte) as u64;
    // A sender silent for four base RTTs, or four of its packets at its share, gives its share
    // back.
    // A sender silent for four base RTTs, or eight of its packets at its share, gives its share
    // back. With the drain, the capacity shared out falls while the receiver's data meets more
    // than two base RTTs of queueing, by the excess over 64 base RTTs, to half the line at most.
    // The senders pace datagrams (BTH to ICRC); each also takes FRAMING bytes of the line, so
    // what is shared out is the line's rate in datagram bytes.
    let datagram_mbps = (u64::from(line_mbps) * (4096 + 52) / (4096 + 52 + FRAMING as u64)) as u32;
    let mut fair: FairShare<MAX_SENDERS> = FairShare::new(datagram_mbps, 4 * base_rtt, 4096 + 52);
    if cfg.drain {
        fair = fair.with_drain(Drain {
            target_ns: 2 * base_rtt,
            horizon_ns: 64 * base_rtt,
            floor: 512,
            first_window_bytes: u64::from(cfg.paths)
                * u64::from(cfg.window_per_path)
                * (4096 + 52 + FRAMING as u64),
        });
    }
    let mut report = IncastReport {
        senders: n,
        base_rtt_ns: base_rtt,
        ..Default::default()
    };
    let mut heap: BinaryHeap<Reverse<InFlight>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut egress_free = Instant::ZERO;
    let mut done_at: Vec<Option<Instant>> = vec![None; n];
    // Bytes delivered per sender per base RTT, for the settling time.
    let mut delivered: Vec<Vec<u64>> = vec![Vec::new(); n];
    let mut share_at = Instant::ZERO;
    // The largest queueing delay a data packet met since the shares were last computed.
    let mut queue_delay: Option<u64> = None;
    let mut now = Instant::ZERO;
    let mut buf = vec![0u8; 8192];
    let limit = Instant::from_nanos(1_000_000_000); // 1 s of virtual time
    let push = |heap: &mut BinaryHeap<Reverse<InFlight>>, seq: &mut u64, x: InFlight| {
        *seq += 1;
        heap.push(Reverse(InFlight { seq: *seq, ..x }));
    };
    loop {
        // Completions.
        for (i, s) in senders.iter_mut().enumerate() {
            while let Some(ev) = s.conn.poll_event() {
                if let Event::Completion(c) = ev {
                    if c.status == Status::Success {
                        done_at[i] = Some(now);
                    }
                }
            }
        }
        for r in receivers.iter_mut() {
            while r.conn.poll_event().is_some() {}
        }
        if done_at.iter().all(Option::is_some) {
            break;
        }
        // Transmit: senders onto their access links, the receiver's connections onto the
        // return path.
        for (i, s) in senders.iter_mut().enumerate() {
            for (at, port, bytes) in s.transmit(now, &mut buf, ns_per_byte) {
                let hop = if transport_core::wire::Opcode::from_u8(bytes[0]).is_metaroce()
                    && bytes[0] < 0xe0
                {
                    Hop::Switch
                } else {
                    // A sender's control packet (probe) goes straight to the receiver.
                    Hop::Receiver { marked: false }
                };
                let at = at + cfg.delay_ns / 2;
                push(
                    &mut heap,
                    &mut seq,
                    InFlight {
                        at,
                        seq: 0,
                        hop,
                        i,
                        src_port: port,
                        bytes,
                    },
                );
            }
        }
        for (i, r) in receivers.iter_mut().enumerate() {
            for (at, port, bytes) in r.transmit(now, &mut buf, ns_per_byte) {
                push(
                    &mut heap,
                    &mut seq,
                    InFlight {
                        at: at + cfg.delay_ns,
                        seq: 0,
                        hop: Hop::Sender,
                        i,
                        src_port: port,
                        bytes,
                    },
                );
            }
        }
        // Next instant.
        let mut next = heap.peek().map_or(Instant::MAX, |Reverse(x)| x.at);
        for e in senders.iter().chain(receivers.iter()) {
            if let Some(t) = e.next_at(now) {
                next = next.min(t);
            }
        }
        if next == Instant::MAX || next > limit {
            break;
        }
        now = next.max(now);
        // The receiver's fair shares, once per microsecond.
        if cfg.hint && now >= share_at {
            share_at = now + 1_000;
            if let Some(q) = queue_delay.take() {
                fair.set_queue_delay(now, q);
            }
            fair.expire(now);
            for (i, r) in receivers.iter_mut().enumerate() {
                r.conn.set_rate_hint(fair.share(i as u32).unwrap_or(0));
            }
        }
        while heap.peek().is_some_and(|Reverse(x)| x.at <= now) {
            let Reverse(x) = heap.pop().expect("peeked");
            match x.hop {
                Hop::Switch => {
                    // The egress queue: its backlog is the time the port is busy for.
                    let q = (egress_free.since(now) as f64 * bytes_per_ns) as u64;
                    let len = (x.bytes.len() + FRAMING) as u64;
                    if q + len > cfg.buffer_bytes {
                        report.drops += 1;
                        continue;
                    }
                    report.max_queue_bytes = report.max_queue_bytes.max(q + len);
                    let p = if q <= cfg.kmin_bytes {
                        0.0
                    } else if q >= cfg.kmax_bytes {
                        1.0
                    } else {
                        cfg.pmax * (q - cfg.kmin_bytes) as f64
                            / (cfg.kmax_bytes - cfg.kmin_bytes) as f64
                    };
                    let marked = p > 0.0 && rng.chance_f(p);
                    report.marks += u64::from(marked);
                    egress_free = egress_free.max(now) + (len as f64 * ns_per_byte).ceil() as u64;
                    let at = egress_free + cfg.delay_ns / 2;
                    push(
                        &mut heap,
                        &mut seq,
                        InFlight {
                            at,
                            hop: Hop::Receiver { marked },
                            ..x
                        },
                    );
                }
                Hop::Receiver { marked } => {
                    let r = &mut receivers[x.i];
                    let d = r.conn.handle_datagram(now, x.src_port, marked, &x.bytes);
                    if let Ok(delivery) = d {
                        if let Delivery::Place { len, .. } = delivery {
                            if cfg.hint {
                                let _ = fair.received(x.i as u32, len as u64, now);
                                // The largest of the period: a path whose least delay was
                                // learnt behind a queue reads low.
                                let q = u64::from(r.conn.rate_status().queue_delay_ns);
                                queue_delay = Some(queue_delay.map_or(q, |d: u64| d.max(q)));
                            }
                            let slot = (now.as_nanos() / base_rtt.max(1)) as usize;
                            let v = &mut delivered[x.i];
                            if v.len() <= slot {
                                v.resize(slot + 1, 0);
                            }
                            v[slot] += len as u64;
                        }
                        let mut mem = FlatMemory {
                            base: BASE,
                            bytes: &mut r.mem,
                        };
                        let applied = r.conn.apply(&mut mem, &x.bytes, delivery);
                        assert_ne!(applied, Applied::OutOfMemory);
                    }
                    r.wake = Some(now);
                }
                Hop::Sender => {
                    let s = &mut senders[x.i];
                    let _ = s.conn.handle_datagram(now, x.src_port, false, &x.bytes);
                    s.wake = Some(now);
                }
            }
        }
        for e in senders.iter_mut().chain(receivers.iter_mut()) {
            if e.conn.poll_timeout().is_some_and(|t| t <= now) {
                e.conn.handle_timeout(now);
                e.wake = Some(now);
            }
        }
    }
    let end = done_at
        .iter()
        .flatten()
        .copied()
        .max()
        .unwrap_or(now)
        .as_nanos()
        .max(1);
    report.per_sender_goodput = done_at
        .iter()
        .map(|d| d.map_or(0.0, |t| cfg.bytes as f64 * 8.0 / t.as_nanos().max(1) as f64))
        .collect();
    report.jain_index = jain(&report.per_sender_goodput);
    report.link_utilisation = (cfg.bytes * n as u64) as f64 / (end as f64 * bytes_per_ns);
    report.virtual_time_us = end as f64 / 1000.0;
    report.cnps = receivers.iter().map(|r| r.conn.counters().cnps_sent).sum();
    report.retransmissions = senders
        .iter()
        .map(|s| s.conn.counters().retransmitted)
        .sum();
    report.ok = done_at.iter().all(Option::is_some)
        && senders.iter().zip(&receivers).all(|(s, r)| s.mem == r.mem);
    // Settling: windows of W base RTTs, W enough for 32 packets at the share (a window of a few
    // packets cannot tell 10% from one packet more or less).
    let share_bytes_per_rtt = cfg.link_gbps / 8.0 * base_rtt as f64 / n as f64;
    let w = ((32.0 * 4096.0 / share_bytes_per_rtt).ceil() as usize).max(1);
    report.settle_window_rtts = w as u64;
    let first_done = done_at
        .iter()
        .flatten()
        .copied()
        .min()
        .unwrap_or(Instant::ZERO);
    let last_slot = (first_done.as_nanos() / base_rtt.max(1)) as usize;
    let within = |k: usize| {
        delivered.iter().all(|v| {
            let got: u64 = (k..k + w).map(|s| v.get(s).copied().unwrap_or(0)).sum();
            let want = share_bytes_per_rtt * w as f64;
            (got as f64 / want - 1.0).abs() <= 0.1
        })
    };
    let mut settled = None;
    for k in (0..last_slot.saturating_sub(w)).rev() {
        if within(k) {
            settled = Some(k as u64);
        } else {
            break;
        }
    }
    report.settle_rtts = settled;
    report
}

#[cfg(test)]
mod tests {
    use super::jain;

    #[test]
    fn jain_by_hand() {
        assert_eq!(jain(&[1.0, 1.0, 1.0, 1.0]), 1.0);
        // (1 + 3)^2 / (2 (1 + 9)) = 16 / 20
        assert!((jain(&[1.0, 3.0]) - 0.8).abs() < 1e-12);
    }
}
