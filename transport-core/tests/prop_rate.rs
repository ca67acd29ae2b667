//! Properties of the rate controllers (`transport_core::rate`) over random inputs: windows and
//! rates stay within their bounds and never overflow, a mark or a CNP never raises a rate or a
//! window, a clear ACK never lowers a window; the receiver's fair share equals a brute-force
//! max-min allocation.

use proptest::prelude::*;
use transport_core::rate::{
    max_min_share, serialisation_ns, AckReport, Dcqcn, DcqcnParams, Drain, FairShare, Instant,
    Pacer, PathAimd, Swift, SwiftParams, Timely, TimelyParams, ONE_PACKET,
};

/// Max-min by the textbook: repeatedly give every unsatisfied sender an equal split of what is
/// left, freeze those whose demand it meets, until nothing changes. Shares in f64.
fn brute_max_min(capacity: u32, demands: &[u32]) -> Vec<f64> {
    let mut share = vec![0f64; demands.len()];
    let mut frozen = vec![false; demands.len()];
    let mut left = f64::from(capacity);
    loop {
        let open: Vec<usize> = (0..demands.len()).filter(|&i| !frozen[i]).collect();
        if open.is_empty() || left <= 0.0 {
            break;
        }
        let split = left / open.len() as f64;
        let mut changed = false;
        for &i in &open {
            let want = f64::from(demands[i]) - share[i];
            if want <= split {
                share[i] = f64::from(demands[i]);
                left -= want;
                frozen[i] = true;
                changed = true;
            }
        }
        if !changed {
            for &i in &open {
                share[i] += split;
            }
            break;
        }
    }
    share
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_fair_share_is_max_min(
        capacity in 1u32..400_000,
        // Small demands (0 among them) and repeats are where a water level goes wrong.
        demands in prop::collection::vec(prop_oneof![0u32..4, 0u32..200_000, Just(100_000u32)], 1..24),
    ) {
        let want = brute_max_min(capacity, &demands);
        let mut total = 0u64;
        for (i, &d) in demands.iter().enumerate() {
            let got = max_min_share(capacity, demands.iter().copied(), d);
            total += u64::from(got);
            prop_assert!(got <= d, "never more than the demand");
            // Integer water level: within one Mb/s of the exact share.
            prop_assert!((f64::from(got) - want[i]).abs() <= 1.0, "{} against {}", got, want[i]);
        }
        prop_assert!(total <= u64::from(capacity), "never more than the capacity");
    }

    #[test]
    fn measured_demands_never_share_out_more_than_the_line(
        capacity in 1u32..400_000,
        // (sender, bytes, ns later), any order, silences and bursts alike.
        arrivals in prop::collection::vec((0u32..12, 0u64..1 << 24, 0u64..200_000), 1..300),
        drain in any::<bool>(),
        queue in 0u64..10_000_000,
    ) {
        let mut f: FairShare<8> = FairShare::new(capacity, 50_000, 4096);
        if drain {
            f = f.with_drain(Drain {
                target_ns: 1_000,
                horizon_ns: 100_000,
                floor: 128,
                first_window_bytes: 65_536,
            });
        }
        let mut now = Instant::ZERO;
        for (id, bytes, dt) in arrivals {
            now += dt;
            let taken = f.received(id, bytes, now).is_ok();
            f.set_queue_delay(now, queue);
            prop_assert!(f.len() <= 8);
            if taken {
                prop_assert!(f.share(id).is_some(), "a sender just heard has a share");
            }
            let shares: Vec<u64> = (0..12).filter_map(|i| f.share(i)).map(u64::from).collect();
            let total: u64 = shares.iter().sum();
            // Every share is at least 1 Mb/s (a hint of 0 means none): on a line of fewer Mb/s
            // than senders, each gets that floor and no more.
            let line = u64::from(capacity).max(shares.len() as u64);
            prop_assert!(total <= line, "{} shared out of {}", total, capacity);
            if u64::from(capacity) < shares.len() as u64 {
                prop_assert!(shares.iter().all(|&s| s == 1), "{:?} of {}", shares, capacity);
            }
        }
    }

    #[test]
    fn path_aimd_stays_in_bounds_marks_never_raise_and_clear_acks_never_lower(
        max in 1u32..256,
        steps in prop::collection::vec((any::<bool>(), 0u32..300, 0u64..100_000), 1..200),
    ) {
        let mut p = PathAimd::new(max);
        let mut now = Instant::ZERO;
        for (marked, acked, dt) in steps {
            now += dt;
            let before = p.window();
            p.on_ack(AckReport { acked, marked, srtt: 10_000, now, hint_mbps: 0 }, max);
            prop_assert!(p.window() >= ONE_PACKET && p.window() <= max * ONE_PACKET);
            if marked {
                prop_assert!(p.window() <= before);
            } else {
                prop_assert!(p.window() >= before);
            }
        }
    }

    #[test]
    fn dcqcn_stays_between_its_minimum_and_the_line_and_a_cnp_never_raises(
        vendor in any::<bool>(),
        line in 1_000u32..400_000,
        events in prop::collection::vec((0u8..3, 0u64..200_000, 0u64..1_000_000), 1..200),
    ) {
        let p = if vendor { DcqcnParams::vendor(line) } else { DcqcnParams::paper(line) };
        let mut d = Dcqcn::new(p, Instant::ZERO);
        let mut now = Instant::ZERO;
        for (kind, dt, bytes) in events {
            now += dt;
            match kind {
                0 => {
                    d.advance(now);
                    let before = d.rate_mbps();
                    d.on_cnp(now);
                    prop_assert!(d.rate_mbps() <= before);
                }
                1 => d.on_sent(now, bytes),
                _ => d.advance(now),
            }
            prop_assert!(d.rate_mbps() >= p.min_mbps && d.rate_mbps() <= line);
            prop_assert!(d.target_mbps() <= line);
            prop_assert!(d.alpha() <= 1024);
        }
    }

    #[test]
    fn timely_stays_between_its_minimum_and_the_line(
        line in 1_000u32..400_000,
        rtts in prop::collection::vec(0u64..5_000_000, 1..300),
    ) {
        let mut t = Timely::new(TimelyParams::paper(line));
        for r in rtts {
            t.on_rtt(r);
            prop_assert!(t.rate_mbps() >= 1 && t.rate_mbps() <= line);
        }
    }

    #[test]
    fn swift_stays_in_bounds_and_a_delay_above_target_never_raises(
        max in 1u32..1_000,
        acks in prop::collection::vec((0u64..2_000_000, 0u32..64, 0u64..200_000, 0u32..8), 1..300),
    ) {
        let p = SwiftParams::htsim(max);
        let mut s = Swift::new(p);
        let mut now = Instant::ZERO;
        for (delay, acked, dt, hops) in acks {
            now += dt;
            let before = s.cwnd();
            let above = delay >= s.target_ns(hops);
            s.on_ack(now, acked, delay, hops, 50_000);
            prop_assert!(s.cwnd() >= p.min_cwnd && s.cwnd() <= p.max_cwnd);
            if above {
                prop_assert!(s.cwnd() <= before);
            } else {
                prop_assert!(s.cwnd() >= before);
            }
        }
    }

    /// The rate in a hint comes from the peer: any value, even 1 Mb/s or u32::MAX, gives
    /// departure times that never go back, never precede the packet, and never overflow.
    #[test]
    fn the_pacer_takes_any_rate_a_peer_can_name(
        steps in prop::collection::vec((any::<u32>(), 0u64..70_000, 0u64..1_000_000), 1..200),
    ) {
        let mut p = Pacer::default();
        let (mut now, mut last) = (Instant::ZERO, Instant::ZERO);
        for (rate, bytes, dt) in steps {
            now += dt;
            let at = p.depart(now, bytes, rate, 65_536);
            prop_assert!(at >= now && at >= last);
            prop_assert!(serialisation_ns(bytes, rate) <= bytes * 8_000 + 1);
            last = at;
        }
    }
}
