//! `Config::spray_burst`: a path, once picked, takes that many packets in a row while it stays
//! open; 1 (the default) picks a path per packet.

mod common;

use common::{config, write_at, Pair};
use transport_core::conn::{Config, Event, Status};
use transport_core::rate::Algorithm;
use transport_core::time::Instant;

const KEY: u32 = 7;

fn pair(burst: u8, window: u32, cc: Algorithm) -> Pair {
    let with = |mut c: Config| {
        c.spray_burst = burst;
        c.window_per_path = window;
        c.cc = cc;
        c
    };
    let mut p = Pair::with_configs(with(config(1, 2)), with(config(2, 1)));
    p.grant_writes(KEY);
    p
}

/// The paths of the data packets A sends for a Write of `packets` packets, before any ACK.
fn first_flight(p: &mut Pair, packets: u32) -> Vec<u8> {
    p.a.conn
        .post(Instant::ZERO, write_at(1, 0, packets * 1024, KEY))
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let mut paths = Vec::new();
    while let Some(tx) = p.a.conn.poll_transmit(Instant::ZERO, &mut buf) {
        if tx.payload_len > 0 {
            paths.push(tx.path.0);
        }
    }
    paths
}

/// Lengths of the runs of equal paths.
fn runs(paths: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    for w in paths.chunk_by(|a, b| a == b) {
        out.push(w.len());
    }
    out
}

#[test]
fn a_picked_path_takes_a_burst_then_the_next_is_picked() {
    for cc in [Algorithm::EcnAimd, Algorithm::MetaRoce] {
        // Per packet: four paths in turn.
        let paths = first_flight(&mut pair(1, 32, cc), 32);
        assert_eq!(paths.len(), 32, "{cc:?}");
        assert!(runs(&paths).iter().all(|&r| r == 1), "{cc:?} {paths:?}");
        // Bursts of four: runs of four, every path as often.
        let paths = first_flight(&mut pair(4, 32, cc), 32);
        assert_eq!(paths.len(), 32, "{cc:?}");
        assert!(runs(&paths).iter().all(|&r| r == 4), "{cc:?} {paths:?}");
        for i in 0..4 {
            assert_eq!(
                paths.iter().filter(|&&x| x == i).count(),
                8,
                "{cc:?} {paths:?}"
            );
        }
        // A path whose window fills ends its burst: windows of 6 hold 24 packets, none more.
        let paths = first_flight(&mut pair(4, 6, cc), 32);
        assert_eq!(paths.len(), 24, "{cc:?} {paths:?}");
        assert!(runs(&paths).iter().all(|&r| r <= 4), "{cc:?} {paths:?}");
        for i in 0..4 {
            assert_eq!(
                paths.iter().filter(|&&x| x == i).count(),
                6,
                "{cc:?} {paths:?}"
            );
        }
    }
}

#[test]
fn read_requests_and_empty_writes_pick_a_path_each() {
    let mut p = pair(4, 32, Algorithm::MetaRoce);
    for id in 0..8u64 {
        let mut wr = write_at(id, id * 1024, 1024, KEY);
        wr.op = transport_core::conn::WrOp::Read;
        p.a.conn.post(Instant::ZERO, wr).unwrap();
    }
    let mut buf = vec![0u8; 4096];
    let mut paths = Vec::new();
    while let Some(tx) = p.a.conn.poll_transmit(Instant::ZERO, &mut buf) {
        paths.push(tx.path.0);
    }
    assert_eq!(paths.len(), 8, "{paths:?}");
    assert!(runs(&paths).iter().all(|&r| r == 1), "{paths:?}");
    // So do empty Writes (no payload to carry in a burst).
    let mut p = pair(4, 32, Algorithm::MetaRoce);
    for id in 0..8u64 {
        p.a.conn
            .post(Instant::ZERO, write_at(id, 0, 0, KEY))
            .unwrap();
    }
    let mut paths = Vec::new();
    while let Some(tx) = p.a.conn.poll_transmit(Instant::ZERO, &mut buf) {
        paths.push(tx.path.0);
    }
    assert_eq!(paths.len(), 8, "{paths:?}");
    assert!(runs(&paths).iter().all(|&r| r == 1), "{paths:?}");
}

#[test]
fn bursts_deliver_every_byte() {
    let mut p = pair(8, 32, Algorithm::MetaRoce);
    for (off, b) in p.a.mem.iter_mut().enumerate() {
        *b = (off as u8).wrapping_mul(13);
    }
    p.a.conn
        .post(Instant::ZERO, write_at(1, 0, 200 * 1024, KEY))
        .unwrap();
    for _ in 0..400 {
        p.transmit();
        p.deliver_and_tick(&mut |_, _| false);
    }
    assert!(p
        .a
        .events
        .iter()
        .any(|e| matches!(e, Event::Completion(c) if c.id == 1 && c.status == Status::Success)));
    assert_eq!(p.a.mem[..200 * 1024], p.b.mem[..200 * 1024]);
    assert_eq!(p.a.conn.counters().retransmitted, 0);
}
