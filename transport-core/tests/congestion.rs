//! ECN AIMD per path: marks on one path shrink that path's window and move its share of new
//! packets to the clear paths; without marks the windows stay at their maximum; once the marks
//! stop, the window grows back.

mod common;

use common::{Pair, BASE, MEM};
use transport_core::conn::PathId;
use transport_core::conn::{Event, RemoteAddr, Status, WorkRequest, WrOp};
use transport_core::time::Instant;

const KEY: u32 = 0x51;
const LEN: u32 = 512 * 1024;

fn pair() -> Pair {
    Pair::granting_writes(KEY)
}

/// Writes `LEN` bytes from `a` to `b` and checks they landed and completed.
fn transfer(p: &mut Pair, id: u64) {
    p.a.conn
        .post(
            p.now,
            WorkRequest {
                id,
                op: WrOp::Write,
                stream: 0,
                local_addr: BASE,
                len: LEN,
                remote: RemoteAddr {
                    va: BASE + MEM as u64 / 2,
                    rkey: KEY,
                },
            },
        )
        .unwrap();
    settle_over_delay(p, DELAY);
    let half = MEM / 2;
    assert!(p.b.mem[half..half + LEN as usize] == p.a.mem[..LEN as usize]);
    assert!(p.a.events.iter().any(|e| matches!(
        e,
        Event::Completion(c) if c.id == id && c.status == Status::Success
    )));
}

/// One-way delay of the virtual link, in 1 us rounds.
const DELAY: u64 = 5;

/// Runs both sides until idle over a link that holds every datagram `delay` rounds of 1 us.
fn settle_over_delay(p: &mut Pair, delay: u64) {
    let mut link: Vec<(Instant, bool, u16, Vec<u8>)> = Vec::new();
    for _ in 0..200_000 {
        p.transmit();
        let now = p.now;
        link.extend(
            std::mem::take(&mut p.wire)
                .into_iter()
                .map(|(to_b, port, d)| (now + delay * 1_000, to_b, port, d)),
        );
        let (due, later): (Vec<_>, Vec<_>) = link.into_iter().partition(|x| x.0 <= now);
        link = later;
        for (_, to_b, port, d) in due {
            let _ = p.deliver(to_b, port, &d);
        }
        for side in [&mut p.a, &mut p.b] {
            while let Some(e) = side.conn.poll_event() {
                side.events.push(e);
            }
            if side.conn.poll_timeout().is_some_and(|t| t <= now) {
                side.conn.handle_timeout(now);
            }
        }
        if link.is_empty() && p.a.conn.is_idle() && p.b.conn.is_idle() {
            return;
        }
        p.now += 1_000;
    }
    panic!("not idle after 200 ms of virtual time");
}

fn sent(p: &Pair) -> Vec<u64> {
    (0..4)
        .map(|i| p.a.conn.path_stats(PathId(i)).unwrap().sent)
        .collect()
}

#[test]
fn without_marks_every_window_stays_at_its_maximum() {
    let mut p = pair();
    transfer(&mut p, 1);
    let max = p.a.conn.config().window_per_path;
    for i in 0..4 {
        let s = p.a.conn.path_stats(PathId(i)).unwrap();
        assert_eq!((s.cwnd, s.cwnd_cuts), (max, 0), "path {i}");
    }
    assert_eq!(p.a.conn.counters().cwnd_cuts, 0);
    let s = sent(&p);
    assert!(s.iter().all(|&n| n >= 100), "spread evenly: {s:?}");
}

#[test]
fn marks_on_one_path_shrink_its_window_and_steer_packets_away() {
    let mut p = pair();
    let marked = p.a.conn.path_stats(PathId(0)).unwrap().src_port;
    p.ce_ports.push(marked);
    transfer(&mut p, 1);
    let s0 = p.a.conn.path_stats(PathId(0)).unwrap();
    let max = p.a.conn.config().window_per_path;
    assert!(s0.ecn_marks > 0);
    // From 16 packets down to 1, halving at most once per round trip: four cuts, though
    // every one of its packets came back marked.
    assert_eq!((s0.cwnd, s0.cwnd_cuts), (1, 4), "{s0:?}");
    assert!(s0.ecn_marks > 4 * s0.cwnd_cuts, "{s0:?}");
    for i in 1..4 {
        let s = p.a.conn.path_stats(PathId(i)).unwrap();
        assert_eq!((s.cwnd, s.cwnd_cuts), (max, 0), "clear path {i}");
    }
    let s = sent(&p);
    assert!(
        s[0] * 3 < s[1].min(s[2]).min(s[3]),
        "the marked path carries a small share: {s:?}"
    );
    assert_eq!(p.a.conn.counters().cwnd_cuts, s0.cwnd_cuts);
}

#[test]
fn the_window_grows_back_once_marks_stop() {
    let mut p = pair();
    let marked = p.a.conn.path_stats(PathId(0)).unwrap().src_port;
    p.ce_ports.push(marked);
    transfer(&mut p, 1);
    let low = p.a.conn.path_stats(PathId(0)).unwrap().cwnd;
    p.ce_ports.clear();
    transfer(&mut p, 2);
    let grown = p.a.conn.path_stats(PathId(0)).unwrap().cwnd;
    // About one packet per round trip: a few more transfers bring it to the maximum.
    let max = p.a.conn.config().window_per_path;
    for id in 3..10 {
        transfer(&mut p, id);
    }
    let s0 = p.a.conn.path_stats(PathId(0)).unwrap();
    assert!(
        low == 1 && grown > low + 4 && s0.cwnd == max,
        "{low} -> {grown} -> {}",
        s0.cwnd
    );
    assert_eq!(s0.cwnd_cuts, 4, "no cut without marks");
}

fn pair_with(cc: transport_core::rate::Algorithm) -> Pair {
    let cfg = |l, r| {
        let mut c = common::config(l, r);
        c.cc = cc;
        c
    };
    let mut p = Pair::with_configs(cfg(1, 2), cfg(2, 1));
    p.grant_writes(KEY);
    p
}

#[test]
fn metaroce_marks_trim_the_path_that_saw_them_and_the_connection() {
    let mut p = pair_with(transport_core::rate::Algorithm::MetaRoce);
    let max = p.a.conn.config().window_per_path;
    assert_eq!(p.a.conn.rate_status().connection_window, 4 * max);
    let marked = p.a.conn.path_stats(PathId(0)).unwrap().src_port;
    p.ce_ports.push(marked);
    transfer(&mut p, 1);
    let s0 = p.a.conn.path_stats(PathId(0)).unwrap();
    assert!(s0.cwnd < max && s0.cwnd_cuts > 0, "{s0:?}");
    let conn = p.a.conn.rate_status().connection_window;
    assert!(
        conn < 4 * max,
        "the connection window was trimmed too: {conn}"
    );
    // The clear paths keep their own windows; the connection's bounds what they may carry.
    for i in 1..4 {
        assert_eq!(
            p.a.conn.path_stats(PathId(i)).unwrap().cwnd,
            max,
            "path {i}"
        );
    }
    // Without marks the connection window grows back.
    p.ce_ports.clear();
    for id in 2..12 {
        transfer(&mut p, id);
    }
    assert!(p.a.conn.rate_status().connection_window > conn);
}

#[test]
fn the_receivers_hint_rides_in_every_ack_and_caps_a_metaroce_senders_rate() {
    let mut p = pair_with(transport_core::rate::Algorithm::MetaRoce);
    assert_eq!(
        p.a.conn.rate_status().rate_mbps,
        0,
        "no limit before any hint"
    );
    p.b.conn.set_rate_hint(6_250);
    transfer(&mut p, 1);
    let s = p.a.conn.rate_status();
    assert_eq!((s.hint_received_mbps, s.rate_mbps), (6_250, 6_250));
    assert_eq!(p.b.conn.rate_status().hint_sent_mbps, 6_250);
    // Under ECN AIMD alone the hint is reported but does not limit.
    let mut q = pair_with(transport_core::rate::Algorithm::EcnAimd);
    q.b.conn.set_rate_hint(6_250);
    transfer(&mut q, 1);
    let s = q.a.conn.rate_status();
    assert_eq!((s.hint_received_mbps, s.rate_mbps), (6_250, 0));
}

#[test]
fn a_cnp_cuts_a_dcqcn_senders_rate() {
    let params = transport_core::rate::DcqcnParams::vendor(100_000);
    let mut p = pair_with(transport_core::rate::Algorithm::Dcqcn(params));
    assert_eq!(p.a.conn.rate_status().rate_mbps, 100_000);
    assert!(p.a.conn.handle_cnp(Instant::from_nanos(10_000)));
    assert_eq!(p.a.conn.rate_status().rate_mbps, 100_000 * 513 / 1024);
    assert!(
        !p.a.conn.handle_cnp(Instant::from_nanos(12_000)),
        "within the monitor period"
    );
    assert_eq!(p.a.conn.counters().cwnd_cuts, 1);
}

/// RoCEv2 mode: a DCQCN receiver answers CE-marked data with CNPs (BTH opcode 0x81), at most
/// one per its interval, and the sender's rate falls on them; under ECN AIMD no CNP is sent.
#[test]
fn ce_marks_bring_cnps_on_the_wire_under_dcqcn() {
    let params = transport_core::rate::DcqcnParams::vendor(100_000);
    let mut p = pair_with(transport_core::rate::Algorithm::Dcqcn(params));
    p.ce_ports = (0..4u8)
        .map(|i| p.a.conn.path_stats(PathId(i)).unwrap().src_port)
        .collect();
    let start = p.now;
    // Watch the wire for the CNPs themselves.
    let mut cnps_seen = 0;
    p.a.conn
        .post(p.now, common::write_at(1, 0, LEN, KEY))
        .unwrap();
    for _ in 0..20_000 {
        p.transmit();
        cnps_seen += p
            .wire
            .iter()
            .filter(|(to_b, _, d)| !to_b && d[0] == 0x81 && d.len() == 12 + 16 + 4)
            .count();
        p.deliver_and_tick(&mut |_, _| false);
        if p.a.events.iter().any(|e| matches!(e, Event::Completion(_))) {
            break;
        }
    }
    let (sent, got) = (
        p.b.conn.counters().cnps_sent,
        p.a.conn.counters().cnps_received,
    );
    assert!(
        sent > 0 && sent == got && got == cnps_seen as u64,
        "{sent} {got} {cnps_seen}"
    );
    // One per 4 us interval at most over the transfer.
    let elapsed = p.now.since(start);
    assert!(
        sent <= elapsed / params.cnp_interval_ns + 1,
        "{sent} in {elapsed} ns"
    );
    assert!(p.a.conn.rate_status().rate_mbps < 100_000);
    assert!(p.a.conn.counters().cwnd_cuts > 0);
    // ECN AIMD echoes marks in ACKs and sends no CNP.
    let mut q = pair_with(transport_core::rate::Algorithm::EcnAimd);
    q.ce_ports = (0..4u8)
        .map(|i| q.a.conn.path_stats(PathId(i)).unwrap().src_port)
        .collect();
    transfer(&mut q, 1);
    assert_eq!(q.b.conn.counters().cnps_sent, 0);
    assert!(q.a.conn.counters().ecn_marks_echoed > 0);
}

/// A peer that floods CNPs (its own genuine one, replayed ten thousand times at one instant) cuts
/// the rate once per DCQCN's least time between cuts, never below its minimum, and each costs a
/// counter: nothing is kept per CNP. A CNP to a connection not running DCQCN changes nothing.
#[test]
fn a_cnp_flood_cuts_once_per_interval_and_keeps_nothing() {
    let params = transport_core::rate::DcqcnParams::vendor(100_000);
    let mut p = pair_with(transport_core::rate::Algorithm::Dcqcn(params));
    p.ce_ports = (0..4u8)
        .map(|i| p.a.conn.path_stats(PathId(i)).unwrap().src_port)
        .collect();
    p.a.conn
        .post(p.now, common::write_at(1, 0, 64 * 1024, KEY))
        .unwrap();
    let mut cnp = None;
    for _ in 0..1000 {
        p.transmit();
        cnp = cnp.or_else(|| {
            p.wire
                .iter()
                .find(|(to_b, _, d)| !to_b && d[0] == 0x81)
                .map(|(_, port, d)| (*port, d.clone()))
        });
        p.deliver_and_tick(&mut |_, _| false);
        if cnp.is_some() {
            break;
        }
    }
    let (port, cnp) = cnp.expect("B sends a CNP for the marked data");
    let (cuts, got) = (
        p.a.conn.counters().cwnd_cuts,
        p.a.conn.counters().cnps_received,
    );
    for _ in 0..10_000 {
        assert!(p.deliver(false, port, &cnp).is_ok());
    }
    let c = p.a.conn.counters();
    assert_eq!(c.cnps_received, got + 10_000);
    assert!(
        c.cwnd_cuts <= cuts + 1,
        "{} cuts at one instant",
        c.cwnd_cuts - cuts
    );
    assert!(p.a.conn.rate_status().rate_mbps >= params.min_mbps);
    // Under ECN AIMD the same datagram counts and changes no window.
    let mut q = pair_with(transport_core::rate::Algorithm::EcnAimd);
    let before = q.a.conn.path_stats(PathId(0)).unwrap().cwnd;
    let _ = q.deliver(false, port, &cnp);
    assert_eq!(q.a.conn.path_stats(PathId(0)).unwrap().cwnd, before);
    assert_eq!(q.a.conn.counters().cwnd_cuts, 0);
}

#[test]
fn what_left_before_the_first_hint_is_paid_for_at_it() {
    // The Write starts before any hint: the first window leaves at once. The first ACK brings
    // 1000 Mb/s, and the whole Write then takes its time at that rate, the first window included
    // (without that it finishes a window's worth early, and an incast's first round stays in the
    // queue).
    let mut p = pair_with(transport_core::rate::Algorithm::MetaRoce);
    p.b.conn.set_rate_hint(1_000);
    let start = p.now;
    transfer(&mut p, 1);
    assert_eq!(p.a.conn.rate_status().rate_mbps, 1_000);
    let took = p.now.since(start);
    let window = u64::from(p.a.conn.config().window_per_path) * 4 * 1100;
    let bytes = u64::from(LEN) * 1100 / 1024;
    let at_rate = bytes * 8; // ns at 1000 Mb/s
    assert!(
        window * 8 > at_rate / 20,
        "the first window is a visible share of the Write"
    );
    assert!(
        took >= at_rate * 97 / 100 && took <= at_rate * 12 / 10,
        "took {took} ns, {at_rate} ns at the hinted rate (a window of {window} bytes)"
    );
}

#[test]
fn a_metaroce_sender_paces_to_the_receivers_hint() {
    // B's hint: 1000 Mb/s. A Write of 512 KiB in packets of 1024 bytes (about 1100 bytes each on
    // the wire) then takes about 4.6 ms instead of the few hundred microseconds of an unpaced one.
    let mut p = pair_with(transport_core::rate::Algorithm::MetaRoce);
    p.b.conn.set_rate_hint(1_000);
    // A first small Write brings the hint over.
    p.a.conn
        .post(p.now, common::write_at(1, 0, 1024, KEY))
        .unwrap();
    settle_over_delay(&mut p, DELAY);
    assert_eq!(p.a.conn.rate_status().rate_mbps, 1_000);
    let start = p.now;
    transfer(&mut p, 2);
    let took = p.now.since(start);
    let bytes = u64::from(LEN) * 1100 / 1024;
    let at_rate = bytes * 8 * 1_000 / 1_000; // ns at 1000 Mb/s
    assert!(
        took >= at_rate * 9 / 10 && took <= at_rate * 12 / 10,
        "took {took} ns, {at_rate} ns at the hinted rate"
    );
    // Unpaced (no hint), the same transfer is many times faster.
    let mut q = pair_with(transport_core::rate::Algorithm::MetaRoce);
    let start = q.now;
    transfer(&mut q, 1);
    assert!(
        (q.now.since(start)) * 4 < took,
        "{} against {took}",
        q.now.since(start)
    );
}

#[test]
fn a_tiny_hint_cannot_put_loss_detection_off_for_long() {
    // B's hint: 1 Mb/s (a hostile peer's, or a share collapsed for a moment). A's data in flight
    // would take seconds to leave at it; its retransmission timer waits at most sixteen long
    // timeouts more than the long timeout.
    let mut p = pair_with(transport_core::rate::Algorithm::MetaRoce);
    p.b.conn.set_rate_hint(1);
    p.a.conn
        .post(p.now, common::write_at(1, 0, 1024, KEY))
        .unwrap();
    settle_over_delay(&mut p, DELAY);
    assert_eq!(p.a.conn.rate_status().rate_mbps, 1);
    // A write that then never gets through: everything A sends is lost.
    p.a.conn
        .post(p.now, common::write_at(2, 0, 256 * 1024, KEY))
        .unwrap();
    let in_flight = |p: &common::Pair| {
        (0..4)
            .filter_map(|i| p.a.conn.path_stats(PathId(i)))
            .map(|s| s.in_flight)
            .sum::<u32>()
    };
    let mut worst = 0u64;
    for _ in 0..20_000 {
        p.round(&mut |to_b, _| to_b);
        // While data is in flight the earliest deadline is its retransmission's (the pacer's
        // next departure, a packet's time at 1 Mb/s, is 8.6 ms away).
        if in_flight(&p) > 0 {
            if let Some(t) = p.a.conn.poll_timeout() {
                worst = worst.max(t.since(p.now));
            }
        }
    }
    let rto_high = p.a.conn.config().rto_high;
    assert!(worst > 0, "a timer is armed while data is in flight");
    assert!(
        worst <= 17 * rto_high + 1_000,
        "{worst} ns against a long timeout of {rto_high}"
    );
}
