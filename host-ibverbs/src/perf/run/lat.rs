//! The client's side of a latency phase: a ping-pong of one message, timed per round trip.

use super::*;

/// Receive buffers per connection for latency tests.
pub(super) const LAT_RECVS: usize = 16;

pub(super) fn client_lat(
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
    // One answer per ping: exactly `iters` receives over the phase, none left posted.
    let mut budget = RecvBudget::new(Some(cfg.iters));
    if uses_recv {
        for b in 0..LAT_RECVS {
            if budget.take() {
                ep.post_recv(0, b as u64, 0, &rbuf, b * size, size)?;
            }
        }
    }
    let sseed = server_seed(seed);
    let mut expected = Expected::new(sseed, size);
    let mut samples = Vec::with_capacity(cfg.iters as usize);
    // What the first failed check found (none: every byte verified).
    let mut why: Option<String> = None;
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
            Test::AtomicLat => (cfg.atomic.op(i), &bufs.dst[0], peer_dst[0].at(0)),
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
                        let good = if cfg.test == Test::WriteLat {
                            wc.imm == Some(i as u32)
                                && matches(&bufs.dst[0], slot * size, &mut expected, 0, slot)
                        } else {
                            wc.byte_len as usize == size
                                && matches(&rbuf, b * size, &mut expected, 0, slot)
                        };
                        note_failure(&mut why, good, || {
                            format!(
                                "answer {i}: {} bytes, immediate {:?}, or its bytes differ",
                                wc.byte_len, wc.imm
                            )
                        });
                        if budget.take() {
                            ep.post_recv(0, b as u64, 0, &rbuf, b * size, size)?;
                        }
                    }
                    CompletionKind::Atomic => {
                        hit = Some(t0.elapsed());
                        // The i-th atomic on the word found i.
                        let mut got = [0u8; 8];
                        let found = atomic_found(&bufs.dst[0], slot * size, &mut got);
                        note_failure(&mut why, found == Some(i), || {
                            format!("atomic {i} found {found:?}, not {i}")
                        });
                    }
                    CompletionKind::Read => {
                        hit = Some(t0.elapsed());
                        let good = matches(&bufs.dst[0], slot * size, &mut expected, 0, slot);
                        note_failure(&mut why, good, || {
                            format!("Read {i}: its bytes differ from the server's")
                        });
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
    let mut r = lat_stats(size, &mut samples, why.is_none());
    r.samples_us = in_order;
    r.why = why;
    Ok(r)
}

pub(super) fn lat_stats(size: usize, samples: &mut [f64], verified: bool) -> LatResult {
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
        why: None,
        samples_us: Vec::new(),
    }
}
