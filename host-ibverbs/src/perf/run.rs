//! The phases: what the client and the server do for one message size.

use super::backend::StatsParts;
use super::{
    decode_bufs, encode_bufs, pattern, slots_for, Endpoint, Mr, PerfConfig, PerfError, RemoteBuf,
    Report, Test,
};
use crate::oob::{Channel, Message, OobError};
use crate::udp::{stats, CompletionKind, RemoteAddr, Status, WorkCompletion, WrOp, STREAMS};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod bw;
mod lat;
mod server;
use bw::*;
use lat::*;
pub(super) use server::server_phase;
#[cfg(test)]
pub(super) use server::SPOIL_SIZE;

/// Results of a bandwidth phase.
#[derive(Debug, Clone, Default)]
pub struct BwResult {
    /// Message size.
    pub size: usize,
    /// Messages completed, all connections.
    pub iterations: u64,
    /// Bytes moved.
    pub total_bytes: u64,
    /// Seconds from the first post to the last completion.
    pub seconds: f64,
    /// Highest bandwidth over a tenth of the run (at least 10 ms), Gb/s.
    pub bw_peak_gbps: f64,
    /// Average bandwidth, Gb/s.
    pub bw_avg_gbps: f64,
    /// Messages per second, millions.
    pub msg_rate_mpps: f64,
    /// Whether every byte was verified equal (by the server for Writes and Sends, by the
    /// client for Reads).
    pub verified: bool,
    /// What the first failed check found, when one failed.
    pub why: Option<String>,
    /// Packets sent again to repair a loss (or a spurious timeout), all connections.
    pub retransmits: u64,
    /// Packets sent again because the peer had no receive buffer ready (not losses), all
    /// connections.
    pub rnr_retries: u64,
    /// Congestion Experienced marks the peer reported back, all connections.
    pub ecn_marks_echoed: u64,
    /// Times a path's congestion window was halved for those marks, all connections.
    pub cwnd_cuts: u64,
    /// Congestion notification packets the peer sent for CE-marked data (`--cc dcqcn`), all
    /// connections.
    pub cnps_received: u64,
    /// Paths that carried packets, on the connection that used the fewest.
    pub paths_used: usize,
    /// Paths declared failed (each then took a new UDP source port), all connections.
    pub path_failures: u64,
    /// Why packets were sent again: transmissions declared lost by SACK gaps or by a tail
    /// probe's answer, and by a retransmission timeout, all connections. A packet found
    /// acknowledged before its retransmission leaves is not sent again, so these may exceed
    /// `retransmits` (beside busy loops: 58 declared, none sent again).
    pub lost_by_sack: u64,
    /// See `lost_by_sack`.
    pub lost_by_timeout: u64,
    /// Tail probes sent again while the whole peer was silent, instead of declaring a window
    /// lost (the peer's host stalled), all connections.
    pub peer_silent_waits: u64,
    /// Read and atomic requests that waited for the initiator depth (`-o`), all connections
    /// (UDP transport).
    pub requests_waited: u64,
    /// Each connection's rate controller at the end of the phase (UDP transport; none for
    /// verbs, whose NIC runs its own).
    pub connections: Vec<ConnRate>,
}

/// A connection's rate controller as a phase leaves it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnRate {
    /// The rate it may send at, Mb/s (0: not limited).
    pub rate_mbps: u32,
    /// Its connection window, packets.
    pub connection_window: u32,
    /// The last rate hint the receiver's ACKs carried, Mb/s (0: none).
    pub hint_received_mbps: u32,
    /// Each path's window, packets.
    pub path_windows: Vec<u32>,
}

impl BwResult {
    /// Several workers' results for one size as one: bytes and messages added over the
    /// longest worker's time; the peak is the sum of the peaks (each worker's best window).
    pub fn sum(parts: &[&BwResult]) -> BwResult {
        let seconds = parts
            .iter()
            .map(|p| p.seconds)
            .fold(0.0, f64::max)
            .max(1e-9);
        let iterations: u64 = parts.iter().map(|p| p.iterations).sum();
        let total_bytes: u64 = parts.iter().map(|p| p.total_bytes).sum();
        let avg = total_bytes as f64 * 8.0 / seconds / 1e9;
        BwResult {
            size: parts.first().map_or(0, |p| p.size),
            iterations,
            total_bytes,
            seconds,
            bw_peak_gbps: parts.iter().map(|p| p.bw_peak_gbps).sum::<f64>().max(avg),
            bw_avg_gbps: avg,
            msg_rate_mpps: iterations as f64 / seconds / 1e6,
            verified: !parts.is_empty() && parts.iter().all(|p| p.verified),
            why: parts.iter().find_map(|p| p.why.clone()),
            retransmits: parts.iter().map(|p| p.retransmits).sum(),
            rnr_retries: parts.iter().map(|p| p.rnr_retries).sum(),
            ecn_marks_echoed: parts.iter().map(|p| p.ecn_marks_echoed).sum(),
            cwnd_cuts: parts.iter().map(|p| p.cwnd_cuts).sum(),
            cnps_received: parts.iter().map(|p| p.cnps_received).sum(),
            paths_used: parts.iter().map(|p| p.paths_used).min().unwrap_or(0),
            path_failures: parts.iter().map(|p| p.path_failures).sum(),
            lost_by_sack: parts.iter().map(|p| p.lost_by_sack).sum(),
            lost_by_timeout: parts.iter().map(|p| p.lost_by_timeout).sum(),
            peer_silent_waits: parts.iter().map(|p| p.peer_silent_waits).sum(),
            requests_waited: parts.iter().map(|p| p.requests_waited).sum(),
            connections: parts.iter().flat_map(|p| p.connections.clone()).collect(),
        }
    }
}

/// Results of a latency phase (microseconds; half the round trip for Write and Send, as
/// perftest reports them, the whole operation for Read).
#[derive(Debug, Clone, Default)]
pub struct LatResult {
    /// Message size.
    pub size: usize,
    /// Samples.
    pub iterations: u64,
    /// Smallest.
    pub t_min_us: f64,
    /// Mean.
    pub t_avg_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest.
    pub t_max_us: f64,
    /// Standard deviation.
    pub t_stdev_us: f64,
    /// Whether every byte was right.
    pub verified: bool,
    /// What the first failed check found, when one failed.
    pub why: Option<String>,
    /// Every sample in the order measured (microseconds, as the figures above), when asked for
    /// (`PerfConfig::samples`); empty otherwise.
    pub samples_us: Vec<f64>,
}

/// No completion for this long is a stall.
const STALL: Duration = Duration::from_secs(15);

struct Buffers {
    /// Own pattern, source of Writes and Sends, target of the peer's Reads.
    src: Vec<Mr>,
    /// Target of the peer's Writes, destination of Reads and receives.
    dst: Vec<Mr>,
}

fn buffers(ep: &Endpoint, slots: usize, size: usize, seed: u64) -> Result<Buffers, PerfError> {
    let bytes = (slots * size).max(8);
    let mut src = Vec::new();
    let mut dst = Vec::new();
    let mut tmp = vec![0u8; size];
    for q in 0..ep.len() {
        let s = ep.reg_mr(bytes)?;
        for slot in 0..slots {
            pattern(&mut tmp, seed, q, slot);
            s.write(slot * size, &tmp)?;
        }
        src.push(s);
        dst.push(ep.reg_mr(bytes)?);
    }
    Ok(Buffers { src, dst })
}

/// The 8 bytes at `offset` of `mr` as a u64 in the host's order (as an atomic reads and writes
/// memory).
fn atomic_found(mr: &Mr, offset: usize, tmp: &mut [u8; 8]) -> Option<u64> {
    mr.read(offset, tmp).ok().map(|()| u64::from_ne_bytes(*tmp))
}

fn server_seed(seed: u64) -> u64 {
    seed.rotate_left(17) ^ 0xdead_beef
}

fn check(wc: &WorkCompletion) -> Result<(), PerfError> {
    match wc.status {
        Status::Success => Ok(()),
        Status::Refused(r) => Err(PerfError::Completion(format!(
            "work request {:#x} on qp {:#x}: refused by the peer ({})",
            wc.wr_id,
            wc.qp_num,
            r.name()
        ))),
    }
}

/// Posts one request that must find room (latency tests keep a few in flight).
#[allow(clippy::too_many_arguments)]
fn post_one(
    ep: &Endpoint,
    qp: usize,
    id: u64,
    op: WrOp,
    mr: &Mr,
    offset: usize,
    len: usize,
    remote: RemoteAddr,
) -> Result<(), PerfError> {
    if ep.post_send(qp, id, op, 0, mr, offset, len, remote)? {
        Ok(())
    } else {
        Err(PerfError::Invalid("the send queue is full".into()))
    }
}

fn qp_of(wr_id: u64) -> usize {
    (wr_id >> 48) as usize
}

fn wr_id(qp: usize, n: u64) -> u64 {
    ((qp as u64) << 48) | (n & 0xffff_ffff_ffff)
}

/// Publishes the endpoint's counters for `metaroce stats` every half second while a phase runs.
/// The measuring loop only takes the counters (2-7 us measured); a writer thread formats
/// them and writes the file (hundreds of microseconds, which would otherwise stall a ping).
struct Publisher {
    last: Instant,
    /// Calls since the clock was last read (read every 256th: a spinning loop calls it).
    calls: u32,
    name: String,
    on: bool,
    writer: Option<(SyncSender<StatsParts>, JoinHandle<()>)>,
}

impl Publisher {
    fn new(name: String, on: bool) -> Publisher {
        Publisher {
            last: Instant::now() - Duration::from_secs(1),
            calls: 0,
            name,
            on,
            writer: None,
        }
    }

    fn tick(&mut self, ep: &Endpoint) {
        self.calls = self.calls.wrapping_add(1);
        if self.on && self.calls % 256 == 1 && self.last.elapsed() >= Duration::from_millis(500) {
            self.last = Instant::now();
            let parts = ep.stats_parts();
            let writer = self.writer.get_or_insert_with(|| {
                let (tx, rx) = sync_channel::<StatsParts>(1);
                let name = self.name.clone();
                let handle = std::thread::spawn(move || {
                    for parts in rx {
                        stats::publish_best_effort(&parts.to_json(&name));
                    }
                });
                (tx, handle)
            });
            // A writer still busy with the last snapshot skips this one.
            let _ = writer.0.try_send(parts);
        }
    }
}

impl Drop for Publisher {
    /// The last snapshot is on disk before the phase ends (and before the tool removes it).
    fn drop(&mut self) {
        if let Some((tx, handle)) = self.writer.take() {
            drop(tx);
            let _ = handle.join();
        }
    }
}

/// The data each slot of each connection must hold, from one seed: the first slots' drawn once
/// and kept (up to [`EXPECTED_BYTES`], what a timed run cycles through), so that a check of a
/// slot used again compares memory instead of drawing the pattern again (two multiplies per 8
/// bytes: a third of the server's time in send-bw); beyond that, drawn for each check. Messages
/// of [`DRAWN_BYTES`] or less are drawn for each check: a word or eight cost less than a lookup
/// in a table of thousands of slots (a latency test's), and nothing is allocated per message.
pub(super) struct Expected {
    seed: u64,
    size: usize,
    /// By connection and slot, with the engine's hasher rather than SipHash.
    made: crate::udp::FastMap<(usize, usize), Box<[u8]>>,
    /// Bytes that may still be kept.
    room: usize,
    scratch: Vec<u8>,
}

/// Pattern bytes an [`Expected`] keeps at most (counted by [`phase_bytes`]).
/// 1 MiB: more than a timed run cycles through ([`super::CYCLE_BYTES`]), so that runs of
/// large messages or many connections, which keep one message each, still compare memory.
const EXPECTED_BYTES: usize = 1 << 20;

/// Messages up to this size are drawn for each check, never kept.
const DRAWN_BYTES: usize = 64;

impl Expected {
    pub(super) fn new(seed: u64, size: usize) -> Self {
        Self {
            seed,
            size,
            made: Default::default(),
            room: EXPECTED_BYTES,
            scratch: Vec::new(),
        }
    }

    /// The pattern of connection `q`'s slot `slot`.
    pub(super) fn of(&mut self, q: usize, slot: usize) -> &[u8] {
        let (seed, size) = (self.seed, self.size);
        if size <= DRAWN_BYTES || (!self.made.contains_key(&(q, slot)) && self.room < size) {
            self.scratch.resize(size, 0);
            pattern(&mut self.scratch, seed, q, slot);
            return &self.scratch;
        }
        let room = &mut self.room;
        self.made.entry((q, slot)).or_insert_with(|| {
            *room -= size;
            let mut p = vec![0u8; size].into_boxed_slice();
            pattern(&mut p, seed, q, slot);
            p
        })
    }
}

/// Whether `mr` holds connection `q`'s slot `slot` at `offset`.
/// Keeps what a failed check found, unless an earlier one failed first (`why` stays `None`
/// while every check passes).
pub(super) fn note_failure(why: &mut Option<String>, good: bool, what: impl FnOnce() -> String) {
    if !good && why.is_none() {
        *why = Some(what());
    }
}

/// Characters of a server's account of a failed check that a client passes on.
const WHY_MAX: usize = 240;

/// The server's verdict in its result message: `None` when everything it checked was right,
/// else what its first failed check found. The account is the peer's text, printed on this
/// end's console: control characters become `?` and it is cut at [`WHY_MAX`] characters.
pub(super) fn server_failure(result: &Message) -> Result<Option<String>, PerfError> {
    if result.get::<u8>("verified")? == 1 {
        return Ok(None);
    }
    Ok(Some(result.text("why").map_or_else(
        |_| "the server found a byte or a count wrong".into(),
        |w| {
            let w: String = w
                .chars()
                .take(WHY_MAX)
                .map(|c| if c.is_control() { '?' } else { c })
                .collect();
            format!("the server: {w}")
        },
    )))
}

fn matches(mr: &Mr, offset: usize, expected: &mut Expected, q: usize, slot: usize) -> bool {
    mr.equals(offset, expected.of(q, slot))
}

/// Waits up to `timeout` for the peer's next message while keeping the transport going
/// (acknowledgements and retransmissions still flow while the other end works). A peer that
/// closes, reports an error or goes silent ends the wait at once.
pub(super) fn next_message(
    ep: &Endpoint,
    chan: &mut Channel,
    timeout: Duration,
) -> Result<Message, PerfError> {
    let end = Instant::now() + timeout;
    loop {
        ep.progress(Duration::from_millis(1));
        if let Some(m) = chan.poll()? {
            return Ok(m);
        }
        if Instant::now() >= end {
            return Err(OobError::TimedOut(timeout).into());
        }
    }
}

/// Looks at the control connection now and then from a loop that spins (every 64th call, at
/// most every 2 ms): the peer's error, its close, its silence or anything unexpected from it
/// ends the phase.
struct Watch {
    calls: u32,
    last: Instant,
}

impl Watch {
    fn new() -> Watch {
        Watch {
            calls: 0,
            last: Instant::now(),
        }
    }

    fn tick(&mut self, chan: &mut Channel) -> Result<(), PerfError> {
        self.calls = self.calls.wrapping_add(1);
        if self.calls % 64 != 0 {
            return Ok(());
        }
        let now = Instant::now();
        if now - self.last < Duration::from_millis(2) {
            return Ok(());
        }
        self.last = now;
        match chan.poll()? {
            None => Ok(()),
            Some(m) => Err(PerfError::Invalid(format!(
                "unexpected {} from the peer during a phase",
                m.verb
            ))),
        }
    }
}

/// Bytes of buffers one end takes for a phase of `test` with `q` connections: its own pattern
/// and the peer's target per connection, the receive buffers (send-bw's are the most: up to
/// [`STREAMS`] x 32 per connection), and two messages of scratch (a pattern being written, one
/// being compared).
pub(super) fn phase_bytes(test: Test, q: usize, slots: usize, size: usize) -> u64 {
    let q = q as u64;
    let bufs = 2 * q * (slots as u64 * size as u64).max(8);
    let recvs = recv_count(test, q as usize, size) as u64 * size as u64 * q;
    // The expected patterns kept, and a scratch one.
    let expected = (EXPECTED_BYTES as u64).min(q * slots as u64 * size as u64);
    bufs + recvs + expected + 2 * size as u64
}

/// How many receives a connection may still post in a phase. A receive left posted when a phase
/// ends would take the first Send of the next one, which may be larger than its buffer (a local
/// length error on a NIC) and lands in the old phase's memory: so when the number of messages is
/// known (a run of iterations), a connection posts exactly that many receives over the phase,
/// and none is left. A timed run (-D) cannot know, and may end with receives posted.
pub(super) struct RecvBudget {
    left: Option<u64>,
}

impl RecvBudget {
    /// `messages` to receive in the phase (`None`: unknown, unbounded).
    pub(super) fn new(messages: Option<u64>) -> Self {
        RecvBudget { left: messages }
    }

    /// Whether one more receive may be posted (and counts it).
    pub(super) fn take(&mut self) -> bool {
        match &mut self.left {
            None => true,
            Some(0) => false,
            Some(n) => {
                *n -= 1;
                true
            }
        }
    }
}

/// Receive buffers per connection for a phase.
fn recv_count(test: Test, q: usize, size: usize) -> usize {
    match test {
        Test::SendBw => ((64usize << 20) / q.max(1) / size.max(1)).clamp(STREAMS, STREAMS * 32),
        Test::SendLat | Test::WriteLat => LAT_RECVS,
        _ => 0,
    }
}

/// Refuses a phase whose buffers exceed the memory this end allows.
fn check_memory(cfg: &PerfConfig, q: usize, slots: usize, size: usize) -> Result<(), PerfError> {
    let need = phase_bytes(cfg.test, q, slots, size);
    if need > cfg.max_memory {
        return Err(PerfError::Memory {
            need,
            cap: cfg.max_memory,
        });
    }
    Ok(())
}

/// What a client phase works with: its buffers, the server's, the message size, the slots and
/// the pattern seed.
struct Phase<'a> {
    bufs: &'a Buffers,
    peer_dst: &'a [RemoteBuf],
    peer_src: &'a [RemoteBuf],
    size: usize,
    slots: usize,
    seed: u64,
}

/// The client's side of one phase.
pub(super) fn client_phase(
    cfg: &PerfConfig,
    ep: &Endpoint,
    chan: &mut Channel,
    size: usize,
) -> Result<Report, PerfError> {
    let slots = slots_for(size, cfg.iters, cfg.qps, cfg.duration.is_some());
    check_memory(cfg, ep.len(), slots, size)?;
    ep.prepare_phase(cfg, size);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 20)
        ^ size as u64;
    let bufs = buffers(ep, slots, size, seed)?;
    chan.send(
        &Message::new("go")
            .with("size", size)
            .with("iters", cfg.iters)
            .with("slots", slots)
            .with("seed", seed)
            .with("dst", encode_bufs(&bufs.dst))
            .with("src", encode_bufs(&bufs.src)),
    )?;
    // The server may be filling buffers of many megabytes.
    let ready = next_message(ep, chan, super::PHASE_GAP)?;
    if ready.verb != "ready" {
        return Err(PerfError::Invalid(format!(
            "expected ready, got {}",
            ready.verb
        )));
    }
    let peer_dst = decode_bufs(ready.text("dst")?)?;
    let peer_src = decode_bufs(ready.text("src")?)?;
    let need = (slots * size) as u64;
    if peer_dst.len() != ep.len()
        || peer_src.len() != ep.len()
        || peer_dst.iter().chain(&peer_src).any(|b| b.len < need)
    {
        return Err(PerfError::Mismatch(format!(
            "the server's buffers do not hold {slots} slots of {size} bytes per connection"
        )));
    }
    let mut publisher = Publisher::new(
        format!("metaroce {} client", cfg.test.name()),
        cfg.publish_stats,
    );
    // The connections' counters before the phase; the report gives what the phase added.
    let before = ep.conn_counters();
    let ph = Phase {
        bufs: &bufs,
        peer_dst: &peer_dst,
        peer_src: &peer_src,
        size,
        slots,
        seed,
    };
    let report = if cfg.test.is_latency() {
        Report::Lat(client_lat(cfg, ep, chan, &ph, &mut publisher)?)
    } else {
        let (mut r, counts) = client_bw(cfg, ep, chan, &ph, &mut publisher)?;
        let after = ep.conn_counters();
        let added = |f: fn(&transport_core::conn::Counters) -> u64| -> u64 {
            after.iter().map(f).sum::<u64>() - before.iter().map(f).sum::<u64>()
        };
        let rnr = added(|c| c.rnr_retries);
        r.retransmits = added(|c| c.retransmitted).saturating_sub(rnr);
        r.rnr_retries = rnr;
        r.ecn_marks_echoed = added(|c| c.ecn_marks_echoed);
        r.cwnd_cuts = added(|c| c.cwnd_cuts);
        r.cnps_received = added(|c| c.cnps_received);
        r.paths_used = ep.paths_used();
        r.connections = ep.conn_rates();
        r.path_failures = added(|c| c.path_failures);
        r.lost_by_sack = added(|c| c.lost_by_sack);
        r.lost_by_timeout = added(|c| c.lost_by_timeout);
        r.peer_silent_waits = added(|c| c.peer_silent_waits);
        r.requests_waited = added(|c| c.requests_waited);
        let counts_s = counts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        chan.send(&Message::new("done").with("counts", counts_s))?;
        let result = next_message(ep, chan, super::PHASE_GAP)?;
        let server = server_failure(&result)?;
        if cfg.test.is_atomic() {
            r.verified &= server.is_none();
        } else if cfg.test == Test::ReadBw {
            let mut expected = Expected::new(server_seed(seed), size);
            let bad = counts.iter().enumerate().find_map(|(q, &c)| {
                (0..slots.min(c as usize))
                    .find(|&s| !matches(&bufs.dst[q], s * size, &mut expected, q, s))
                    .map(|s| (q, s))
            });
            if let Some((q, s)) = bad {
                r.why = Some(format!(
                    "connection {q}: the bytes Read into slot {s} differ from the server's"
                ));
            }
            r.verified = bad.is_none() && server.is_none();
        } else {
            r.verified = server.is_none();
        }
        r.why = r.why.take().or(server);
        return Ok(Report::Bw(r));
    };
    chan.send(&Message::new("done").with("counts", cfg.iters))?;
    let result = next_message(ep, chan, super::PHASE_GAP)?;
    let server = server_failure(&result)?;
    Ok(match report {
        Report::Lat(mut l) => {
            l.verified &= server.is_none();
            l.why = l.why.take().or(server);
            Report::Lat(l)
        }
        other => other,
    })
}

#[cfg(test)]
mod checks {
    use super::*;
    use crate::perf::{PerfConfig, Test};

    /// A region of three slots of `size` bytes holding connection `q`'s patterns from `seed`
    /// (the endpoint it belongs to comes along).
    fn three_slots(seed: u64, q: usize, size: usize) -> (Endpoint, Mr) {
        let mut cfg = PerfConfig::new(Test::SendBw);
        cfg.data_port = 0;
        let ep = Endpoint::open(&cfg, "127.0.0.1".parse().unwrap(), false).unwrap();
        let mr = ep.reg_mr(3 * size).unwrap();
        let mut p = vec![0u8; size];
        for slot in 0..3 {
            pattern(&mut p, seed, q, slot);
            mr.write(slot * size, &p).unwrap();
        }
        (ep, mr)
    }

    /// A slot matches its own connection's pattern and nothing else: not another slot's, not
    /// another connection's, and not with one byte changed (first or last), also when the
    /// pattern comes from the cache the second time.
    #[test]
    fn a_slot_matches_only_its_own_pattern_to_the_byte() {
        let size = 1000;
        let (_ep, mr) = three_slots(7, 1, size);
        let mut e = Expected::new(7, size);
        for _ in 0..2 {
            for slot in 0..3 {
                assert!(matches(&mr, slot * size, &mut e, 1, slot));
            }
            assert!(!matches(&mr, 0, &mut e, 1, 1), "another slot's pattern");
            assert!(!matches(&mr, 0, &mut e, 0, 0), "another connection's");
            assert!(
                !matches(&mr, 0, &mut Expected::new(8, size), 1, 0),
                "another seed's"
            );
            for at in [0, size - 1] {
                let mut b = [0u8];
                mr.read(at, &mut b).unwrap();
                mr.write(at, &[b[0] ^ 0x10]).unwrap();
                assert!(!matches(&mr, 0, &mut e, 1, 0), "byte {at} changed");
                mr.write(at, &b).unwrap();
            }
        }
    }

    /// Past the bytes an `Expected` keeps, slots are drawn for each check and still compared
    /// to the byte; what it keeps stays within its bound.
    #[test]
    fn slots_past_the_kept_bytes_are_still_checked_to_the_byte() {
        let size = EXPECTED_BYTES / 2 + 1;
        let (_ep, mr) = three_slots(9, 0, size);
        let mut e = Expected::new(9, size);
        for _ in 0..2 {
            for slot in 0..3 {
                assert!(matches(&mr, slot * size, &mut e, 0, slot), "slot {slot}");
            }
            assert!(!matches(&mr, 2 * size, &mut e, 0, 1));
        }
        assert_eq!(e.made.len(), 1, "one slot of this size fits the kept bytes");
        let mut b = [0u8];
        mr.read(3 * size - 1, &mut b).unwrap();
        mr.write(3 * size - 1, &[!b[0]]).unwrap();
        assert!(
            !matches(&mr, 2 * size, &mut e, 0, 2),
            "the last byte of a slot not kept"
        );
        assert!(phase_bytes(Test::SendBw, 1, 3, size) >= (3 * size + EXPECTED_BYTES / 2) as u64);
    }
}
