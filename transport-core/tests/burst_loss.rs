//! A run of losses that takes a path's whole flight leaves no later packet on that path to show
//! a SACK gap. The other paths show it: once a packet that left later is acknowledged and the
//! path has been silent for its round trip, the connection probes the path's tail at once, and
//! what the probe's answer does not report (or everything that left before it, when no answer
//! comes within a round trip) goes again, long before the retransmission timeout.

mod common;

use common::Pair;
use proptest::prelude::*;
use transport_core::conn::{Event, Status};
use transport_core::time::Instant;
use transport_core::wire::{BthRepr, Extensions, Opcode};

const KEY: u32 = 0x44;

/// The path a data packet from A names.
fn data_path(d: &[u8]) -> Option<u8> {
    let (bth, rest) = BthRepr::parse(d).ok()?;
    let (ext, _) = Extensions::parse(bth.opcode.layout(), rest).ok()?;
    ext.mr_data().map(|m| m.path_id)
}

/// The path an ACK names (alone or carried).
fn ack_path(d: &[u8]) -> Option<u8> {
    let (bth, rest) = BthRepr::parse(d).ok()?;
    let (ext, _) = Extensions::parse(bth.opcode.layout(), rest).ok()?;
    ext.mr_ack().map(|a| a.path_id)
}

/// The path a probe (not a probe reply) names.
fn probe_path(d: &[u8]) -> Option<u8> {
    let (bth, rest) = BthRepr::parse(d).ok()?;
    if bth.opcode != Opcode::MrProbe {
        return None;
    }
    match Extensions::parse(bth.opcode.layout(), rest).ok()?.0 {
        Extensions::MrProbe(p) => Some(p.path_id),
        _ => None,
    }
}

/// Delivers `wire` except the ACKs of path 2 to A (lost).
fn deliver_losing_path_2_acks(p: &mut Pair, wire: Vec<(bool, u16, Vec<u8>)>) {
    for (to_b, port, d) in wire {
        if to_b || ack_path(&d) != Some(2) {
            let _ = p.deliver(to_b, port, &d);
        }
    }
}

/// Both sides send: A takes what B sends (B's answer); what A sends joins `held`, behind it.
fn answer_holding_as(p: &mut Pair, held: &mut Vec<(bool, u16, Vec<u8>)>) {
    p.transmit();
    for w in std::mem::take(&mut p.wire) {
        if w.0 {
            held.push(w);
        } else {
            let _ = p.deliver(false, w.1, &w.2);
        }
    }
}

/// Delivers what was held back and lets the pair settle; then every Write in `ids` completed,
/// the first `bytes` of A's memory are in B's, exactly `lost` packets were declared lost and sent
/// again, and none arrived twice.
fn finish(
    p: &mut Pair,
    held: Vec<(bool, u16, Vec<u8>)>,
    ids: std::ops::RangeInclusive<u64>,
    bytes: usize,
    lost: u64,
) {
    for (to_b, port, d) in held {
        let _ = p.deliver(to_b, port, &d);
    }
    p.settle();
    assert!(all_completed(p, ids), "{:?}", p.a.events);
    assert!(p.a.mem[..bytes] == p.b.mem[..bytes]);
    let (a, b) = (*p.a.conn.counters(), *p.b.conn.counters());
    assert_eq!((a.lost_by_sack, a.retransmitted), (lost, lost), "{a:?}");
    assert_eq!(b.duplicates, 0, "{b:?}");
}

/// Whether A completed every Write in `ids`.
fn all_completed(p: &Pair, ids: impl IntoIterator<Item = u64>) -> bool {
    ids.into_iter().all(|id| {
        p.a.events
            .iter()
            .any(|e| matches!(e, Event::Completion(c) if c.id == id && c.status == Status::Success))
    })
}

/// Moves 256 KiB from A to B; `lose` sees (to B, bytes) and the probes A has sent so far on
/// path 2. Returns the time taken and A's counters.
fn transfer(
    lose: &mut impl FnMut(bool, &[u8], u64) -> bool,
) -> (u64, transport_core::conn::Counters) {
    let mut p = Pair::granting_writes(KEY);
    p.a.conn
        .post(Instant::ZERO, common::write_at(1, 0, 256 * 1024, KEY))
        .unwrap();
    let start = p.now;
    let mut probes = 0u64;
    for _ in 0..200_000 {
        p.round(&mut |to_b, d| {
            if to_b && probe_path(d) == Some(2) {
                probes += 1;
            }
            lose(to_b, d, probes)
        });
        if p.a.events.iter().any(|e| matches!(e, Event::Completion(_))) {
            break;
        }
    }
    assert!(p
        .a
        .events
        .iter()
        .any(|e| matches!(e, Event::Completion(c) if c.id == 1 && c.status == Status::Success)));
    assert!(p.a.mem[..256 * 1024] == p.b.mem[..256 * 1024]);
    (p.now.since(start), *p.a.conn.counters())
}

/// Path 2's first flight is lost whole (until its tail is probed).
fn run() -> (u64, transport_core::conn::Counters) {
    transfer(&mut |to_b, d, probes| to_b && probes == 0 && data_path(d) == Some(2))
}

#[test]
fn a_path_whose_whole_flight_is_lost_is_repaired_within_round_trips_not_a_timeout() {
    let (took, c) = run();
    assert!(c.overdue_probes >= 1, "{c:?}");
    assert_eq!(c.lost_by_timeout, 0, "{c:?}");
    // Exactly the lost packets went again: the probe's answer told which.
    assert_eq!(c.retransmitted, c.lost_by_sack, "{c:?}");
    // The pair's round trip is a few microseconds; its timeouts are 100 and 320 us.
    assert!(took < 100_000, "took {took} ns: {c:?}");
}

#[test]
fn a_lost_tail_probe_is_sent_again_before_the_flight_is_declared_lost() {
    // Path 2's first flight and the first probe of its tail are lost: the second probe's answer
    // says what to send again, still within round trips.
    let mut flight = true;
    let (took, c) = transfer(&mut |to_b, d, probes| {
        if probes > 0 {
            flight = false;
        }
        (to_b && flight && data_path(d) == Some(2)) || (probes == 1 && probe_path(d) == Some(2))
    });
    assert!(c.probes_sent >= 2, "{c:?}");
    assert_eq!(c.lost_by_timeout, 0, "{c:?}");
    assert_eq!(c.retransmitted, c.lost_by_sack, "{c:?}");
    assert!(c.retransmitted > 0, "{c:?}");
    assert!(took < 100_000, "took {took} ns: {c:?}");
}

#[test]
fn a_tail_whose_acks_and_first_probe_are_lost_is_not_sent_again() {
    // Every ACK is lost until path 2's tail is probed, and that first probe is lost too; the
    // first data packet is lost three times, so that the cumulative PSN cannot vouch for what
    // path 2 carried. One unanswered probe proves nothing: the second one's answer shows that
    // path 2's flight arrived, and only the first packet goes again.
    let mut first_psn = None;
    let mut first_lost = 0;
    let (_, c) = transfer(&mut |to_b, d, probes| {
        if to_b && data_path(d).is_some() {
            let psn = BthRepr::parse(d).unwrap().0.psn;
            if *first_psn.get_or_insert(psn) == psn && first_lost < 3 {
                first_lost += 1;
                return true;
            }
        }
        (!to_b && probes == 0 && ack_path(d).is_some()) || (probes == 1 && probe_path(d) == Some(2))
    });
    assert!(c.probes_sent >= 2, "{c:?}");
    assert_eq!(first_lost, 3);
    assert_eq!(c.retransmitted, 3, "{c:?}");
}

/// Moves 256 KiB from A to B while runs of A's data packets are lost: a run starts on a packet
/// of path p when the next draw of a small generator falls below `share`, and takes that packet
/// and the next `run - 1` of the same path. Returns the time taken, the data packets lost and A's
/// counters.
fn run_with_bursts(
    seed: u64,
    run: u32,
    share_per_mille: u64,
) -> (u64, u64, transport_core::conn::Counters) {
    let mut state = seed | 1;
    let mut left = [0u32; 256];
    let mut lost = 0u64;
    let (took, c) = transfer(&mut |to_b, d, _| {
        let Some(path) = to_b.then(|| data_path(d)).flatten() else {
            return false;
        };
        let l = &mut left[usize::from(path)];
        // xorshift64: a draw per data packet outside a run.
        let drop = if *l > 0 {
            *l -= 1;
            true
        } else {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if state % 1000 < share_per_mille {
                *l = run - 1;
                true
            } else {
                false
            }
        };
        lost += u64::from(drop);
        drop
    });
    (took, lost, c)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever the run length (one packet to twice a path's window) and the share lost (up to
    /// 20%), every byte arrives, and nothing goes again that arrived: the ACKs all arrive here,
    /// so a retransmission is owed only for a packet lost.
    #[test]
    fn runs_of_losses_are_repaired_exactly(seed in any::<u64>(), run in 1u32..=32, share in 0u64..=200) {
        let (_, lost, c) = run_with_bursts(seed, run, share);
        prop_assert!(c.retransmitted <= lost, "{} retransmissions for {} lost: {:?}", c.retransmitted, lost, c);
    }
}

/// What a path sends in the same instant as its tail probe, after the probe, did not leave
/// before it: the probe's answer, which the peer sends before those packets arrive, must not
/// declare them lost. (A runner stamps a whole round with one clock reading, so the time of
/// departure cannot tell them apart; the path's sequence can.)
#[test]
fn what_leaves_with_a_tail_probe_is_not_lost_by_its_answer() {
    let mut p = Pair::granting_writes(KEY);
    p.a.conn
        .post(p.now, common::write_at(1, 0, 8 * 1024, KEY))
        .unwrap();
    // Path 2's ACKs are lost until A probes its tail: its data arrive, A hears nothing of them.
    let mut held = Vec::new();
    let mut probed = false;
    for _ in 0..10_000 {
        p.transmit();
        let wire = std::mem::take(&mut p.wire);
        let probe = wire
            .iter()
            .position(|(to_b, _, d)| *to_b && probe_path(d) == Some(2));
        if let Some(k) = probe {
            // In the same instant, after the probe, A has more to send, on every path.
            p.a.conn
                .post(p.now, common::write_at(2, 8 * 1024, 8 * 1024, KEY))
                .unwrap();
            p.doorbell(true);
            let after = std::mem::take(&mut p.wire);
            // The probe arrives first; what left after it is delayed behind B's answer.
            for (i, w) in wire.into_iter().enumerate() {
                if i <= k || !w.0 {
                    let _ = p.deliver(w.0, w.1, &w.2);
                } else {
                    held.push(w);
                }
            }
            held.extend(after);
            assert!(
                held.iter()
                    .any(|(to_b, _, d)| *to_b && data_path(d) == Some(2)),
                "A sent data on path 2 after its probe, in the same instant"
            );
            // B answers the probe (an ACK echoing it, and the reply); A takes the answer.
            answer_holding_as(&mut p, &mut held);
            probed = true;
            break;
        }
        deliver_losing_path_2_acks(&mut p, wire);
        p.deliver_and_tick(&mut |_, _| false);
    }
    assert!(probed, "A never probed path 2's tail");
    // Nothing was lost: nothing is declared lost, nothing goes again, nothing arrives twice.
    finish(&mut p, held, 1..=2, 16 * 1024, 0);
}

/// A data packet that leaves on a path in the same instant as the path's tail probe, before it,
/// does not carry the probe's timestamp: the ACK it brings back, which reaches A before the probe
/// has even arrived, must not be taken for the probe's answer (which would declare lost what
/// left between the two).
#[test]
fn an_ack_of_data_that_left_with_a_probe_is_not_the_probes_answer() {
    let mut p = Pair::granting_writes(KEY);
    let mut posted = 0u64;
    let mut post = |p: &mut Pair| {
        posted += 1;
        let at = ((posted - 1) % 64) * 8192;
        p.a.conn
            .post(p.now, common::write_at(posted, at, 8192, KEY))
            .unwrap();
    };
    let mut held = Vec::new();
    let (mut probed, mut lost_first) = (false, false);
    for _ in 0..2_000 {
        // A posts every round and rings its doorbell (the data leaves at once), then sends the
        // rest of its round (a probe among it), all in one instant.
        post(&mut p);
        p.doorbell(true);
        p.transmit();
        let wire = std::mem::take(&mut p.wire);
        let probe = wire
            .iter()
            .position(|(to_b, _, d)| *to_b && probe_path(d) == Some(2));
        let before: Vec<usize> = (0..probe.unwrap_or(0))
            .filter(|&i| wire[i].0 && data_path(&wire[i].2) == Some(2))
            .collect();
        if let (Some(k), [first, ..]) = (probe, &before[..]) {
            let (first, second) = (*first, before.get(1).copied());
            assert!(
                second.is_some(),
                "two data packets on path 2 before its probe"
            );
            // The first data packet on path 2 arrives; what left after it on the path, the
            // probe included, is delayed behind the ACK B sends for it.
            for (i, w) in wire.into_iter().enumerate() {
                let later_on_2 = w.0 && i > first && (i >= k || data_path(&w.2) == Some(2));
                if later_on_2 {
                    held.push(w);
                } else {
                    let _ = p.deliver(w.0, w.1, &w.2);
                }
            }
            answer_holding_as(&mut p, &mut held);
            probed = true;
            break;
        }
        for (to_b, port, d) in wire {
            // Path 2's first data packet is lost (the cumulative PSN stops below it), and its
            // ACKs to A: A hears nothing of path 2.
            let lost = if to_b {
                let first = !lost_first && data_path(&d) == Some(2);
                lost_first |= first;
                first
            } else {
                ack_path(&d) == Some(2)
            };
            if !lost {
                let _ = p.deliver(to_b, port, &d);
            }
        }
        p.deliver_and_tick(&mut |_, _| false);
    }
    assert!(
        probed,
        "A never probed path 2's tail with data before the probe"
    );
    // Only path 2's first packet was lost: it alone is declared lost and goes again.
    finish(
        &mut p,
        held,
        1..=posted,
        (posted.min(64) * 8192) as usize,
        1,
    );
}

/// The probe arrives and, right behind it in the same batch, data the path sent after it: the
/// peer's ACK echoes that data packet, not the probe. It reports a transmission that left after
/// the probe, so it ends the probe's round all the same. A round left open keeps its old cut:
/// the next loss on the path took a probe more to find (3 probes where 2 do), and a round open
/// long enough may take a healthy path out of service.
#[test]
fn an_ack_past_the_probe_ends_its_round() {
    let mut p = Pair::granting_writes(KEY);
    p.a.conn
        .post(p.now, common::write_at(1, 0, 8 * 1024, KEY))
        .unwrap();
    let mut posted = 1u64;
    let mut probed = false;
    for _ in 0..10_000 {
        p.transmit();
        let wire = std::mem::take(&mut p.wire);
        if wire
            .iter()
            .any(|(to_b, _, d)| *to_b && probe_path(d) == Some(2))
        {
            // In the same instant, after the probe, A sends more, on every path; B takes it
            // all (the probe first) before it answers.
            posted += 1;
            p.a.conn
                .post(p.now, common::write_at(posted, 8 * 1024, 8 * 1024, KEY))
                .unwrap();
            p.doorbell(true);
            let after = std::mem::take(&mut p.wire);
            assert!(
                after
                    .iter()
                    .any(|(to_b, _, d)| *to_b && data_path(d) == Some(2)),
                "A sent data on path 2 after its probe"
            );
            for (to_b, port, d) in wire.into_iter().chain(after) {
                let _ = p.deliver(to_b, port, &d);
            }
            p.deliver_and_tick(&mut |_, _| false);
            probed = true;
            break;
        }
        deliver_losing_path_2_acks(&mut p, wire);
        p.deliver_and_tick(&mut |_, _| false);
    }
    assert!(probed, "A never probed path 2's tail");
    // Then more Writes, nothing lost; path 2's ACKs come two rounds after the others' (a path
    // a little slower: A sees later packets acknowledged first, as over any fabric).
    let mut late: std::collections::VecDeque<Vec<(bool, u16, Vec<u8>)>> =
        std::collections::VecDeque::from([Vec::new(), Vec::new()]);
    for _ in 0..300 {
        posted += 1;
        let at = 16 * 1024 + ((posted - 3) % 32) * 8192;
        p.a.conn
            .post(p.now, common::write_at(posted, at, 8192, KEY))
            .unwrap();
        p.doorbell(true);
        p.transmit();
        let wire = std::mem::take(&mut p.wire);
        for (to_b, port, d) in late.pop_front().unwrap_or_default() {
            let _ = p.deliver(to_b, port, &d);
        }
        late.push_back(Vec::new());
        for w in wire {
            if !w.0 && ack_path(&w.2) == Some(2) {
                late.back_mut().unwrap().push(w);
            } else {
                let _ = p.deliver(w.0, w.1, &w.2);
            }
        }
        p.deliver_and_tick(&mut |_, _| false);
    }
    for (to_b, port, d) in late.into_iter().flatten() {
        let _ = p.deliver(to_b, port, &d);
    }
    p.settle();
    // Then a real loss: path 2's next flight is lost whole, until A probes its tail again. A
    // new round, with a new cut, finds it at once.
    let mut lost = 0u64;
    let mut probes = 0;
    for _ in 0..2_000 {
        if probes == 0 {
            posted += 1;
            let at = ((posted - 3) % 32) * 8192;
            p.a.conn
                .post(p.now, common::write_at(posted, 16 * 1024 + at, 8192, KEY))
                .unwrap();
            p.doorbell(true);
        }
        p.round(&mut |to_b, d| {
            if to_b && probe_path(d) == Some(2) {
                probes += 1;
            }
            let drop = to_b && probes == 0 && data_path(d) == Some(2);
            lost += u64::from(drop);
            drop
        });
        if probes > 0 && p.a.conn.is_idle() {
            break;
        }
    }
    p.settle();
    assert!(all_completed(&p, 1..=posted), "{:?}", p.a.events);
    let a = *p.a.conn.counters();
    // Two probes, each answered: what the second found lost, and only that, went again.
    assert!(lost > 0);
    assert_eq!(a.probes_sent, 2, "{a:?}");
    assert_eq!((a.lost_by_sack, a.retransmitted), (lost, lost), "{a:?}");
    assert_eq!((a.lost_by_timeout, a.path_failures), (0, 0), "{a:?}");
}
