//! The client's side of a bandwidth phase: every connection kept `-t` deep in work requests until
//! the iterations or the time are done, with a peak over a tenth of the run.

use super::*;

pub(super) fn client_bw(
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
    // An atomic's original value lands in its own 8 bytes of `bufs.dst`, one slot per operation
    // in flight: no more in flight than slots.
    let depth = if cfg.test.is_atomic() {
        u64::from(cfg.tx_depth).min(slots as u64)
    } else {
        u64::from(cfg.tx_depth)
    };
    let mut atomics_ok = true;
    let mut got = [0u8; 8];
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
                    // Every atomic of a connection on the first word of the peer's buffer.
                    Test::AtomicBw => (cfg.atomic.op(n), &bufs.dst[i], peer_dst[i].at(0)),
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
                let i = qp_of(wc.wr_id);
                if cfg.test.is_atomic() {
                    // A connection's atomics run in the order they were posted (completions come
                    // in order per stream only): the n-th found n.
                    let n = wc.wr_id & 0xffff_ffff_ffff;
                    atomics_ok &= wc.kind == CompletionKind::Atomic
                        && atomic_found(&bufs.dst[i], (n % slots as u64) as usize * 8, &mut got)
                            == Some(n);
                }
                done[i] += 1;
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
            // For atomics, what this end saw; the caller adds the peer's word.
            verified: cfg.test.is_atomic() && atomics_ok,
            why: (cfg.test.is_atomic() && !atomics_ok).then(|| {
                "an atomic's original value was not the number of atomics before it".into()
            }),
            retransmits: 0,
            rnr_retries: 0,
            ecn_marks_echoed: 0,
            cwnd_cuts: 0,
            cnps_received: 0,
            connections: Vec::new(),
            paths_used: 0,
            path_failures: 0,
            lost_by_sack: 0,
            lost_by_timeout: 0,
            peer_silent_waits: 0,
            requests_waited: 0,
        },
        done,
    ))
}
