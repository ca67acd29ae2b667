//! The server's side of a phase: its buffers, its receives, and the check of what arrived.

use super::*;

/// A send-bw server spoils one byte of the first message of this size before checking it (tests
/// of what a failed check reports; no other test uses the size).
#[cfg(test)]
pub(in crate::perf) static SPOIL_SIZE: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// The server's side of one phase; returns how many bytes it checked and what its first failed
/// check found (none: everything it checked was right).
pub(in crate::perf) fn server_phase(
    cfg: &PerfConfig,
    ep: &Endpoint,
    chan: &mut Channel,
    go: &Message,
) -> Result<(u64, Option<String>), PerfError> {
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
    ep.prepare_phase(cfg, size);
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
    // A run of iterations sends `iters` messages on each connection (latency tests on the
    // first), message m of send-bw on stream m % streams: post exactly that many receives on
    // each stream over the phase (see `RecvBudget`).
    let recv_streams = if cfg.test == Test::SendBw { streams } else { 1 };
    let per_stream = |s: usize| {
        let (n, k) = (iters, recv_streams as u64);
        n / k + u64::from((s as u64) < n % k)
    };
    let mut budgets: Vec<Vec<RecvBudget>> = (0..q)
        .map(|_| {
            (0..recv_streams)
                .map(|s| RecvBudget::new(cfg.duration.is_none().then(|| per_stream(s))))
                .collect()
        })
        .collect();
    let mut rbufs = Vec::new();
    for (i, budget) in budgets.iter_mut().enumerate() {
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
            if budget[stream].take() {
                ep.post_recv(i, wr_id(i, b as u64), stream as u16, &r, b * size, size)?;
            }
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
    // What the first failed check found (none: everything checked was right).
    let mut why: Option<String> = None;
    let mut checked = 0u64;
    let mut expected = Expected::new(seed, size);
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
                    #[cfg(test)]
                    if size == SPOIL_SIZE.load(std::sync::atomic::Ordering::Relaxed) && m == 0 {
                        let want = expected.of(i, slot)[size / 2];
                        rbufs[i].write(b * size + size / 2, &[!want])?;
                    }
                    let good = wc.byte_len as usize == size
                        && matches(&rbufs[i], b * size, &mut expected, i, slot);
                    note_failure(&mut why, good, || {
                        format!(
                            "connection {i}, stream {s}: message {m} of {} bytes in receive \
                                 {b} is not the {size} bytes sent",
                            wc.byte_len
                        )
                    });
                    checked += size as u64;
                    if budgets[i][s].take() {
                        ep.post_recv(i, wc.wr_id, wc.stream, &rbufs[i], b * size, size)?;
                    }
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
                    let good = if cfg.test == Test::WriteLat {
                        wc.imm == Some(n as u32)
                            && matches(&bufs.dst[i], slot * size, &mut expected, i, slot)
                    } else {
                        wc.byte_len as usize == size
                            && matches(&rbufs[i], b * size, &mut expected, i, slot)
                    };
                    note_failure(&mut why, good, || {
                        format!(
                            "ping {n}: {} bytes, immediate {:?}, or its bytes differ",
                            wc.byte_len, wc.imm
                        )
                    });
                    checked += size as u64;
                    if budgets[i][0].take() {
                        ep.post_recv(i, wc.wr_id, 0, &rbufs[i], b * size, size)?;
                    }
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
                    "the client sent no data and no done for {} s; counters: {}",
                    STALL.as_secs(),
                    ep.describe()
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
                    note_failure(&mut why, false, || {
                        format!("messages received {received:?}, the client sent {counts:?}")
                    });
                }
                if cfg.test.is_atomic() {
                    // Each connection's word was incremented once per atomic (atomic-lat runs
                    // on the first connection only).
                    let mut got = [0u8; 8];
                    for (i, &c) in counts.iter().enumerate().take(q) {
                        let found = atomic_found(&bufs.dst[i], 0, &mut got);
                        note_failure(&mut why, found == Some(c), || {
                            format!("connection {i}: the word holds {found:?} after {c} atomics")
                        });
                        checked += 8;
                    }
                }
                if cfg.test == Test::WriteBw {
                    for (i, &c) in counts.iter().enumerate().take(q) {
                        for s in 0..slots.min(c as usize) {
                            let good = matches(&bufs.dst[i], s * size, &mut expected, i, s);
                            note_failure(&mut why, good, || {
                                format!("connection {i}: the bytes written to slot {s} differ")
                            });
                            checked += size as u64;
                        }
                    }
                }
                break;
            }
        }
    }
    let mut result = Message::new("result")
        .with("verified", u8::from(why.is_none()))
        .with("checked", checked);
    if let Some(w) = &why {
        result = result.with("why", w);
    }
    chan.send(&result)?;
    Ok((checked, why))
}
