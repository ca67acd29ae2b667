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
    /// Packets sent again to repair a loss (or a spurious timeout), all connections.
    pub retransmits: u64,
    /// Packets sent again because the peer had no receive buffer ready (not losses), all
    /// connections.
    pub rnr_retries: u64,
    /// Congestion Experienced marks the peer reported back, all connections.
    pub ecn_marks_echoed: u64,
    /// Times a path's congestion window was halved for those marks, all connections.
    pub cwnd_cuts: u64,
    /// Paths that carried packets, on the connection that used the fewest.
    pub paths_used: usize,
    /// Paths declared failed (each then took a new UDP source port), all connections.
    pub path_failures: u64,
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
            retransmits: parts.iter().map(|p| p.retransmits).sum(),
            rnr_retries: parts.iter().map(|p| p.rnr_retries).sum(),
            ecn_marks_echoed: parts.iter().map(|p| p.ecn_marks_echoed).sum(),
            cwnd_cuts: parts.iter().map(|p| p.cwnd_cuts).sum(),
            paths_used: parts.iter().map(|p| p.paths_used).min().unwrap_or(0),
            path_failures: parts.iter().map(|p| p.path_failures).sum(),
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

fn matches(mr: &Mr, offset: usize, tmp: &mut [u8], seed: u64, q: usize, slot: usize) -> bool {
    pattern(tmp, seed, q, slot);
    mr.equals(offset, tmp)
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
    bufs + recvs + 2 * size as u64
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

/// The client's side of one phase.
pub(super) fn client_phase(
    cfg: &PerfConfig,
    ep: &Endpoint,
    chan: &mut Channel,
    size: usize,
) -> Result<Report, PerfError> {
    let slots = slots_for(size, cfg.iters, cfg.qps, cfg.duration.is_some());
    check_memory(cfg, ep.len(), slots, size)?;
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
        r.paths_used = ep.paths_used();
        r.path_failures = added(|c| c.path_failures);
        let counts_s = counts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        chan.send(&Message::new("done").with("counts", counts_s))?;
        let result = next_message(ep, chan, super::PHASE_GAP)?;
        let server_ok = result.get::<u8>("verified")? == 1;
        if cfg.test == Test::ReadBw {
            let mut tmp = vec![0u8; size];
            let sseed = server_seed(seed);
            r.verified = counts.iter().enumerate().all(|(q, &c)| {
                (0..slots.min(c as usize))
                    .all(|s| matches(&bufs.dst[q], s * size, &mut tmp, sseed, q, s))
            }) && server_ok;
        } else {
            r.verified = server_ok;
        }
        return Ok(Report::Bw(r));
    };
    chan.send(&Message::new("done").with("counts", cfg.iters))?;
    let result = next_message(ep, chan, super::PHASE_GAP)?;
    let server_ok = result.get::<u8>("verified")? == 1;
    Ok(match report {
        Report::Lat(mut l) => {
            l.verified &= server_ok;
            Report::Lat(l)
        }
        other => other,
    })
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

fn client_bw(
    cfg: &PerfConfig,
    ep: &Endpoint,
    chan: &mut Channel,
    ph: &Phase<'_>,
    publisher: &mut Publisher,
) -> Result<(BwResult, Vec<u64>), PerfError> {
    let Phase {
        bufs,
        peer_dst,
        peer_src,
        size,
        slots,
        ..
    } = *ph;
    let q = ep.len();
    let streams = ep.streams() as u64;
    let mut posted = vec![0u64; q];
    let mut done = vec![0u64; q];
    let depth = u64::from(cfg.tx_depth);
    let start = Instant::now();
    let mut last_completion = start;
    let mut last_print = start;
    // Bytes completed per 1 ms bucket, for the peak.
    let mut buckets: Vec<u64> = Vec::new();
    let mut wcs = Vec::with_capacity(256);
    let mut watch = Watch::new();
    loop {
        watch.tick(chan)?;
        let now = Instant::now();
        let elapsed = now - start;
        let stop = cfg.duration.is_some_and(|d| elapsed >= d);
        for i in 0..q {
            while !stop
                && posted[i] - done[i] < depth
                && (cfg.duration.is_some() || posted[i] < cfg.iters)
            {
                let n = posted[i];
                let slot = (n % slots as u64) as usize;
                let (op, local, remote) = match cfg.test {
                    Test::WriteBw => (WrOp::Write, &bufs.src[i], peer_dst[i].at(slot * size)),
                    Test::ReadBw => (WrOp::Read, &bufs.dst[i], peer_src[i].at(slot * size)),
                    _ => (WrOp::Send, &bufs.src[i], RemoteAddr::default()),
                };
                let stream = (n % streams) as u16;
                if !ep.post_send(i, wr_id(i, n), op, stream, local, slot * size, size, remote)? {
                    break; // The send queue is full.
                }
                posted[i] += 1;
            }
        }
        wcs.clear();
        ep.poll(&mut wcs, 256)?;
        if !wcs.is_empty() {
            last_completion = now;
            let b = elapsed.as_millis() as usize;
            if buckets.len() <= b {
                buckets.resize(b + 1, 0);
            }
            for wc in &wcs {
                check(wc)?;
                done[qp_of(wc.wr_id)] += 1;
                buckets[b] += size as u64;
            }
        } else if now - last_completion > STALL && posted != done {
            return Err(PerfError::Stalled(format!(
                "no completion for {} s ({} of {} done); counters: {:?}",
                STALL.as_secs(),
                done.iter().sum::<u64>(),
                posted.iter().sum::<u64>(),
                ep.describe()
            )));
        }
        let finished = posted == done
            && (stop || (cfg.duration.is_none() && posted.iter().all(|&p| p >= cfg.iters)));
        if finished {
            break;
        }
        publisher.tick(ep);
        if cfg.progress
            && elapsed >= Duration::from_secs(3)
            && now - last_print >= Duration::from_secs(1)
        {
            last_print = now;
            let bytes: u64 = done.iter().sum::<u64>() * size as u64;
            eprintln!(
                "  {:6.1} s  {:10} messages  {:8.2} Gb/s average",
                elapsed.as_secs_f64(),
                done.iter().sum::<u64>(),
                bytes as f64 * 8.0 / elapsed.as_secs_f64() / 1e9
            );
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let iterations: u64 = done.iter().sum();
    let total = iterations * size as u64;
    // Peak: the best window of a tenth of the run, at least 10 ms.
    let w = (buckets.len() / 10).max(10);
    let peak = if buckets.len() <= w {
        total as f64 / secs
    } else {
        let mut sum: u64 = buckets[..w].iter().sum();
        let mut best = sum;
        for i in w..buckets.len() {
            sum += buckets[i];
            sum -= buckets[i - w];
            best = best.max(sum);
        }
        best as f64 / (w as f64 / 1000.0)
    };
    let avg = total as f64 / secs;
    Ok((
        BwResult {
            size,
            iterations,
            total_bytes: total,
            seconds: secs,
            bw_peak_gbps: peak.max(avg) * 8.0 / 1e9,
            bw_avg_gbps: avg * 8.0 / 1e9,
            msg_rate_mpps: iterations as f64 / secs / 1e6,
            verified: false,
            retransmits: 0,
            rnr_retries: 0,
            ecn_marks_echoed: 0,
            cwnd_cuts: 0,
            paths_used: 0,
            path_failures: 0,
        },
        done,
    ))
}

/// Receive buffers per connection for latency tests.
const LAT_RECVS: usize = 16;

fn client_lat(
    cfg: &PerfConfig,
    ep: &Endpoint,
    chan: &mut Channel,
    ph: &Phase<'_>,
    publisher: &mut Publisher,
) -> Result<LatResult, PerfError> {
    let Phase {
        bufs,
        peer_dst,
        peer_src,
        size,
        slots,
        seed,
    } = *ph;
    let rbuf = ep.reg_mr(LAT_RECVS * size.max(1))?;
    let uses_recv = matches!(cfg.test, Test::WriteLat | Test::SendLat);
    if uses_recv {
        for b in 0..LAT_RECVS {
            ep.post_recv(0, b as u64, 0, &rbuf, b * size, size)?;
        }
    }
    let sseed = server_seed(seed);
    let mut tmp = vec![0u8; size];
    let mut samples = Vec::with_capacity(cfg.iters as usize);
    let mut verified = true;
    let mut wcs = Vec::new();
    let mut outstanding_sends = 0u64;
    let mut watch = Watch::new();
    for i in 0..cfg.iters {
        let slot = (i % slots as u64) as usize;
        let (op, local, remote) = match cfg.test {
            Test::WriteLat => (
                WrOp::WriteWithImm(i as u32),
                &bufs.src[0],
                peer_dst[0].at(slot * size),
            ),
            Test::SendLat => (WrOp::Send, &bufs.src[0], RemoteAddr::default()),
            _ => (WrOp::Read, &bufs.dst[0], peer_src[0].at(slot * size)),
        };
        // Sends complete when acknowledged; keep the queue from filling with them.
        while outstanding_sends >= 64 {
            wcs.clear();
            ep.poll(&mut wcs, 64)?;
            for wc in &wcs {
                check(wc)?;
                outstanding_sends -= 1;
            }
        }
        let t0 = Instant::now();
        post_one(ep, 0, wr_id(0, i), op, local, slot * size, size, remote)?;
        if uses_recv {
            outstanding_sends += 1;
        }
        // Wait for the answer: the server's Write with immediate, Send, or our Read's data.
        let mut spins = 0u32;
        let t = loop {
            wcs.clear();
            ep.poll(&mut wcs, 16)?;
            let mut hit = None;
            for wc in &wcs {
                check(wc)?;
                match wc.kind {
                    CompletionKind::Recv | CompletionKind::RecvWriteImm => {
                        hit = Some(t0.elapsed());
                        let b = wc.wr_id as usize;
                        if cfg.test == Test::WriteLat {
                            verified &= wc.imm == Some(i as u32)
                                && matches(&bufs.dst[0], slot * size, &mut tmp, sseed, 0, slot);
                        } else {
                            verified &= wc.byte_len as usize == size
                                && matches(&rbuf, b * size, &mut tmp, sseed, 0, slot);
                        }
                        ep.post_recv(0, b as u64, 0, &rbuf, b * size, size)?;
                    }
                    CompletionKind::Read => {
                        hit = Some(t0.elapsed());
                        verified &= matches(&bufs.dst[0], slot * size, &mut tmp, sseed, 0, slot);
                    }
                    _ => outstanding_sends -= 1,
                }
            }
            if let Some(t) = hit {
                break t;
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                watch.tick(chan)?;
            }
            if spins % 1024 == 0 && t0.elapsed() > STALL {
                return Err(PerfError::Stalled(format!(
                    "no answer to ping {i} for {} s; counters {}",
                    STALL.as_secs(),
                    ep.describe()
                )));
            }
        };
        samples.push(t.as_nanos() as f64 / 1000.0);
        publisher.tick(ep);
        watch.tick(chan)?;
    }
    // Let the last Writes and Sends be acknowledged.
    let end = Instant::now() + Duration::from_secs(5);
    while outstanding_sends > 0 && Instant::now() < end {
        wcs.clear();
        ep.poll(&mut wcs, 64)?;
        for wc in &wcs {
            check(wc)?;
            if !matches!(wc.kind, CompletionKind::Recv | CompletionKind::RecvWriteImm) {
                outstanding_sends -= 1;
            }
        }
    }
    if cfg.test != Test::ReadLat {
        // perftest reports half the round trip for ping-pong tests.
        for s in &mut samples {
            *s /= 2.0;
        }
    }
    let in_order = if cfg.samples {
        samples.clone()
    } else {
        Vec::new()
    };
    let mut r = lat_stats(size, &mut samples, verified);
    r.samples_us = in_order;
    Ok(r)
}

fn lat_stats(size: usize, samples: &mut [f64], verified: bool) -> LatResult {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len().max(1) as f64;
    let avg = samples.iter().sum::<f64>() / n;
    let var = samples.iter().map(|s| (s - avg) * (s - avg)).sum::<f64>() / n;
    let pct = |p: f64| {
        if samples.is_empty() {
            0.0
        } else {
            samples[((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1]
        }
    };
    LatResult {
        size,
        iterations: samples.len() as u64,
        t_min_us: samples.first().copied().unwrap_or(0.0),
        t_avg_us: avg,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        p999_us: pct(0.999),
        t_max_us: samples.last().copied().unwrap_or(0.0),
        t_stdev_us: var.sqrt(),
        verified,
        samples_us: Vec::new(),
    }
}

/// The server's side of one phase; returns whether everything it checked was right and how
/// many bytes it checked.
pub(super) fn server_phase(
    cfg: &PerfConfig,
    ep: &Endpoint,
    chan: &mut Channel,
    go: &Message,
) -> Result<(bool, u64), PerfError> {
    let size: usize = go.get("size")?;
    let iters: u64 = go.get("iters")?;
    let slots: usize = go.get("slots")?;
    let seed: u64 = go.get("seed")?;
    let q = ep.len();
    // Every number the client sends is checked before anything is allocated: the slots are
    // the ones its parameters give, the buffers fit this end's memory cap, and its buffer list
    // names one buffer per connection, each large enough.
    if size == 0 || size > (1 << 30) || iters == 0 {
        return Err(PerfError::Invalid(format!(
            "size {size} with {iters} iterations"
        )));
    }
    let expected = slots_for(size, iters, cfg.qps, cfg.duration.is_some());
    if slots != expected {
        return Err(PerfError::Mismatch(format!(
            "{slots} slots of {size} bytes asked; these parameters give {expected}"
        )));
    }
    check_memory(cfg, q, slots, size)?;
    let client_dst = decode_bufs(go.text("dst")?)?;
    let need = (slots * size) as u64;
    if client_dst.len() != q || client_dst.iter().any(|b| b.len < need) {
        return Err(PerfError::Mismatch(format!(
            "the client's buffers do not hold {slots} slots of {size} bytes for each of {q} \
             connections"
        )));
    }
    let sseed = server_seed(seed);
    let bufs = buffers(ep, slots, size, sseed)?;
    let streams = ep.streams();
    // Receive buffers.
    let recv_count = recv_count(cfg.test, q, size);
    let mut rbufs = Vec::new();
    for i in 0..q {
        if recv_count == 0 {
            break;
        }
        let r = ep.reg_mr(recv_count * size)?;
        for b in 0..recv_count {
            let stream = if cfg.test == Test::SendBw {
                b % streams
            } else {
                0
            };
            ep.post_recv(i, wr_id(i, b as u64), stream as u16, &r, b * size, size)?;
        }
        rbufs.push(r);
    }
    chan.send(
        &Message::new("ready")
            .with("dst", encode_bufs(&bufs.dst))
            .with("src", encode_bufs(&bufs.src)),
    )?;
    let mut publisher = Publisher::new(
        format!("metaroce {} server", cfg.test.name()),
        cfg.publish_stats,
    );
    let mut ok = true;
    let mut checked = 0u64;
    let mut tmp = vec![0u8; size];
    let mut per_stream = vec![[0u64; STREAMS]; q];
    let mut received = vec![0u64; q];
    let mut wcs = Vec::new();
    let mut done_counts: Option<Vec<u64>> = None;
    let mut done_at = None;
    let mut last_check = Instant::now();
    let mut spins = 0u32;
    // A client that stops driving the phase (no data, no acknowledgements, no done) while its
    // heartbeat goes on: the phase ends after STALL. (Over verbs the NIC keeps no such counts
    // for this end to read, and a Write's target sees nothing: there the client's own stall
    // deadline and its heartbeat are what end a dead phase.)
    let watched = !ep.conn_counters().is_empty();
    let progress = || {
        ep.conn_counters()
            .iter()
            .map(|c| c.data_received + c.acked)
            .sum::<u64>()
    };
    let (mut seen, mut moved_at) = (progress(), Instant::now());
    loop {
        wcs.clear();
        ep.poll(&mut wcs, 64)?;
        for wc in &wcs {
            check(wc)?;
            let i = qp_of(wc.wr_id);
            let b = (wc.wr_id & 0xffff_ffff_ffff) as usize;
            match (cfg.test, wc.kind) {
                (Test::SendBw, CompletionKind::Recv) => {
                    let s = usize::from(wc.stream);
                    let m = s as u64 + streams as u64 * per_stream[i][s];
                    per_stream[i][s] += 1;
                    received[i] += 1;
                    let slot = (m % slots as u64) as usize;
                    ok &= wc.byte_len as usize == size
                        && matches(&rbufs[i], b * size, &mut tmp, seed, i, slot);
                    checked += size as u64;
                    ep.post_recv(i, wc.wr_id, wc.stream, &rbufs[i], b * size, size)?;
                }
                (
                    Test::WriteLat | Test::SendLat,
                    CompletionKind::Recv | CompletionKind::RecvWriteImm,
                ) => {
                    let n = received[i];
                    received[i] += 1;
                    let slot = (n % slots as u64) as usize;
                    // Answer first (the ping's round trip is being timed), then check it:
                    // nothing is written to memory before the next poll.
                    let (op, remote) = if cfg.test == Test::WriteLat {
                        (WrOp::WriteWithImm(n as u32), client_dst[i].at(slot * size))
                    } else {
                        (WrOp::Send, RemoteAddr::default())
                    };
                    let id = wr_id(i, 1 << 40 | n);
                    post_one(ep, i, id, op, &bufs.src[i], slot * size, size, remote)?;
                    ok &= if cfg.test == Test::WriteLat {
                        wc.imm == Some(n as u32)
                            && matches(&bufs.dst[i], slot * size, &mut tmp, seed, i, slot)
                    } else {
                        wc.byte_len as usize == size
                            && matches(&rbufs[i], b * size, &mut tmp, seed, i, slot)
                    };
                    checked += size as u64;
                    ep.post_recv(i, wc.wr_id, 0, &rbufs[i], b * size, size)?;
                }
                _ => {}
            }
        }
        publisher.tick(ep);
        spins = spins.wrapping_add(1);
        if wcs.is_empty() && spins % 64 == 0 && last_check.elapsed() >= Duration::from_millis(2) {
            last_check = Instant::now();
            let now_seen = progress();
            if now_seen != seen {
                (seen, moved_at) = (now_seen, last_check);
            } else if watched && done_counts.is_none() && moved_at.elapsed() > STALL {
                return Err(PerfError::Stalled(format!(
                    "the client sent no data and no done for {} s",
                    STALL.as_secs()
                )));
            }
            if done_counts.is_none() {
                if let Some(m) = chan.poll()? {
                    if m.verb != "done" {
                        return Err(PerfError::Invalid(format!("expected done, got {}", m.verb)));
                    }
                    let counts = m
                        .text("counts")?
                        .split(',')
                        .map(|c| c.parse::<u64>())
                        .collect::<Result<Vec<u64>, _>>()
                        .map_err(|_| OobError::Field(format!("counts {:?}", m.text("counts"))))?;
                    if counts.len() != if cfg.test.is_latency() { 1 } else { q } {
                        return Err(PerfError::Mismatch(format!(
                            "{} counts for {q} connections",
                            counts.len()
                        )));
                    }
                    done_counts = Some(counts);
                    done_at = Some(Instant::now());
                }
            }
        }
        if let Some(counts) = &done_counts {
            let all_in = match cfg.test {
                Test::SendBw => received.iter().zip(counts).all(|(r, c)| r >= c),
                _ => true,
            };
            let idle = (0..q).all(|i| ep.is_idle(i));
            let late = done_at.is_some_and(|t| t.elapsed() > Duration::from_secs(5));
            if (all_in && idle) || late {
                // Every message exactly once: more would mean a duplicate delivery.
                if !all_in
                    || (cfg.test == Test::SendBw
                        && received.iter().zip(counts).any(|(r, c)| r != c))
                {
                    ok = false;
                }
                if cfg.test == Test::WriteBw {
                    for (i, &c) in counts.iter().enumerate().take(q) {
                        for s in 0..slots.min(c as usize) {
                            ok &= matches(&bufs.dst[i], s * size, &mut tmp, seed, i, s);
                            checked += size as u64;
                        }
                    }
                }
                break;
            }
        }
    }
    chan.send(
        &Message::new("result")
            .with("verified", u8::from(ok))
            .with("checked", checked),
    )?;
    Ok((ok, checked))
}
