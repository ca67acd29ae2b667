//! The ICRC modes (`Config::icrc`, docs/PROTOCOL.md 4.1): what leaves in the ICRC field and
//! what an arrival is checked against.

mod common;

use common::{at_base, config, write_at, Pair};
use transport_core::conn::PathId;
use transport_core::conn::{compute_icrc, Config, DropReason, Event, IcrcMode, Status};
use transport_core::time::Instant;

const KEY: u32 = 7;

fn pair(a: IcrcMode, b: IcrcMode) -> Pair {
    let with = |mut c: Config, m| {
        c.icrc = m;
        c
    };
    let mut p = Pair::with_configs(with(config(1, 2), a), with(config(2, 1), b));
    p.grant_writes(KEY);
    p
}

fn icrc_field(d: &[u8]) -> u32 {
    u32::from_le_bytes(d[d.len() - 4..].try_into().unwrap())
}

/// Runs rounds until nothing is left on the wire, keeping a copy of every datagram.
fn run(p: &mut Pair, rounds: usize) -> Vec<(bool, u16, Vec<u8>)> {
    let mut seen = Vec::new();
    for _ in 0..rounds {
        p.transmit();
        seen.extend(p.wire.iter().cloned());
        p.deliver_and_tick(&mut |_, _| false);
    }
    seen
}

fn completed(p: &Pair, id: u64) -> bool {
    p.a.events
        .iter()
        .any(|e| matches!(e, Event::Completion(c) if c.id == id && c.status == Status::Success))
}

#[test]
fn two_ends_without_the_icrc_send_zero_and_deliver_every_byte() {
    let mut p = pair(IcrcMode::Off, IcrcMode::Off);
    p.a.conn
        .post(Instant::ZERO, write_at(1, 4096, 50_000, KEY))
        .unwrap();
    let seen = run(&mut p, 200);
    assert!(completed(&p, 1), "{:?}", p.a.events);
    assert_eq!(p.a.mem[4096..54_096], p.b.mem[4096..54_096]);
    assert!(seen.len() > 50, "data and ACKs: {}", seen.len());
    for (_, _, d) in &seen {
        assert_eq!(icrc_field(d), 0, "every datagram, both directions");
    }
    assert_eq!(p.b.conn.counters().drop_bad_icrc, 0);
}

#[test]
fn full_icrc_is_the_default_and_matches_an_independent_computation() {
    assert_eq!(
        Config::new(
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            transport_core::wire::Qpn::new(1),
            transport_core::wire::Qpn::new(2)
        )
        .icrc,
        IcrcMode::Full
    );
    let mut p = pair(IcrcMode::Full, IcrcMode::Full);
    p.a.conn
        .post(Instant::ZERO, write_at(1, 0, 10_000, KEY))
        .unwrap();
    let seen = run(&mut p, 100);
    assert!(completed(&p, 1));
    for (to_b, port, d) in &seen {
        let (src, dst) = if *to_b { (1, 2) } else { (2, 1) };
        let ip = |x: u8| core::net::IpAddr::from([10, 0, 0, x]);
        let want = compute_icrc(ip(src), ip(dst), *port, 4791, &d[..d.len() - 4]);
        assert_eq!(icrc_field(d), want);
    }
}

#[test]
fn an_end_that_checks_drops_every_datagram_without_the_icrc_and_counts_it() {
    let mut p = pair(IcrcMode::Off, IcrcMode::Full);
    p.a.conn
        .post(Instant::ZERO, write_at(1, 0, 8_192, KEY))
        .unwrap();
    let before = p.b.mem.clone();
    let mut dropped = 0;
    for _ in 0..50 {
        p.transmit();
        for (to_b, port, d) in std::mem::take(&mut p.wire) {
            let r = p.deliver(to_b, port, &d);
            if to_b {
                assert_eq!(r, Err(DropReason::BadIcrc));
                dropped += 1;
            }
        }
        p.now += 1_000;
    }
    assert!(dropped >= 8, "{dropped}");
    assert_eq!(p.b.conn.counters().drop_bad_icrc, dropped);
    assert_eq!(p.b.conn.counters().drop_malformed, 0);
    assert_eq!(p.b.mem, before, "nothing placed");
    assert!(!completed(&p, 1));
}

#[test]
fn send_only_sends_the_icrc_and_accepts_arrivals_unchecked() {
    let mut p = pair(IcrcMode::Full, IcrcMode::SendOnly);
    p.a.conn
        .post(Instant::ZERO, write_at(1, 0, 4_096, KEY))
        .unwrap();
    p.transmit();
    let wire = std::mem::take(&mut p.wire);
    // A corrupted ICRC, which a checking end would drop, is accepted by B: its NIC checked.
    for (to_b, port, mut d) in wire {
        let n = d.len();
        d[n - 1] ^= 0xff;
        assert!(p.deliver(to_b, port, &d).is_ok());
    }
    let seen = run(&mut p, 100);
    assert!(completed(&p, 1));
    assert_eq!(p.a.mem[..4096], p.b.mem[..4096]);
    // B's own datagrams (ACKs) carry a real ICRC, which A checks.
    assert!(seen.iter().any(|(to_b, _, _)| !to_b));
    assert_eq!(p.a.conn.counters().drop_bad_icrc, 0);
    for (to_b, _, d) in &seen {
        if !to_b {
            assert_ne!(icrc_field(d), 0);
        }
    }
}

/// A runner that could not bind a path's port tells the connection the one it sends from: the
/// path's datagrams then name it, and their ICRC covers it (the peer checks it and accepts).
#[test]
fn a_port_the_runner_bound_instead_names_the_path_and_enters_its_icrc() {
    let mut p = pair(IcrcMode::Full, IcrcMode::Full);
    for path in 0..4u8 {
        p.a.conn
            .bind_path_port(PathId(path), 40_000 + u16::from(path));
    }
    p.a.conn
        .post(Instant::ZERO, write_at(1, 0, 16_384, KEY))
        .unwrap();
    let seen = run(&mut p, 100);
    assert!(completed(&p, 1));
    let from_a: Vec<_> = seen.iter().filter(|(to_b, ..)| *to_b).collect();
    assert!(from_a.len() >= 16);
    for (_, port, _) in &from_a {
        assert!((40_000..40_004).contains(port), "{port}");
    }
    for path in 0..4 {
        assert_eq!(
            p.a.conn.path_stats(PathId(path)).unwrap().src_port,
            40_000 + path as u16
        );
    }
    assert_eq!(p.b.conn.counters().drop_bad_icrc, 0);
}

/// A runner that leaves the payload where it lies (`Connection::seal_split`: headers and trailer
/// in one buffer, the payload read from memory) puts the same bytes on the wire as one that
/// copies it in (`Connection::seal`), in both modes, whatever the pad.
#[test]
fn sealing_around_the_payload_gives_the_datagram_sealed_whole() {
    use transport_core::conn::Memory;
    for mode in [IcrcMode::Full, IcrcMode::Off] {
        let mut p = pair(mode, mode);
        for (off, b) in p.a.mem.iter_mut().enumerate() {
            *b = (off as u8).wrapping_mul(7);
        }
        // 10,001 bytes: full packets and a last one of one byte, three bytes of pad.
        p.a.conn
            .post(Instant::ZERO, write_at(1, 4096, 10_001, KEY))
            .unwrap();
        let (mut whole, mut head) = (vec![0u8; 9000], vec![0u8; 9000]);
        let mut sent = 0;
        let mut pads = 0;
        while let Some(tx) = p.a.conn.poll_transmit(Instant::ZERO, &mut whole) {
            let mem = at_base(&mut p.a.mem);
            let payload = mem.read(tx.payload_addr, tx.payload_len).unwrap().to_vec();
            let trailer = tx.len - tx.header_len - tx.payload_len;
            pads += usize::from(trailer > 4);
            head[..tx.header_len].copy_from_slice(&whole[..tx.header_len]);
            whole[tx.header_len..tx.header_len + tx.payload_len].copy_from_slice(&payload);
            p.a.conn.seal(&tx, &mut whole);
            let h = &mut head[..tx.header_len + trailer];
            h[tx.header_len..].fill(0xa5);
            assert!(p.a.conn.seal_split(&tx, h, &payload));
            let mut joined = h[..tx.header_len].to_vec();
            joined.extend_from_slice(&payload);
            joined.extend_from_slice(&h[tx.header_len..]);
            assert_eq!(joined, whole[..tx.len], "{mode:?} packet {sent}");
            if mode == IcrcMode::Full {
                assert_ne!(icrc_field(&joined), 0);
            }
            // A payload of the wrong length leaves the head as it was.
            if let Some(short) = payload.get(1..) {
                let before = h.to_vec();
                assert!(!p.a.conn.seal_split(&tx, h, short));
                assert_eq!(*h, before[..]);
            }
            sent += 1;
        }
        assert!(sent >= 3 && pads == 1, "{sent} packets, {pads} padded");
    }
}
