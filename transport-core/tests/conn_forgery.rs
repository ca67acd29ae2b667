//! A third party who knows a connection's queue pair number, its initial PSN and even the UDP
//! ports of its paths, but not its path and probe sequence numbers (random per connection), forges
//! control packets and old data. None of it may complete a work request the peer did not
//! acknowledge, fail one the peer did not refuse, revive a failed path or move a path's receive
//! window; each forgery is dropped and counted by reason.

mod common;

use common::{path_base, Pair, BASE};
use proptest::prelude::*;
use transport_core::conn::PathId;
use transport_core::conn::{
    compute_icrc, path_origin, Delivery, DropReason, Event, Status, WorkRequest,
};
use transport_core::time::Instant;
use transport_core::wire::metaroce::{
    MrAckRepr, MrDataRepr, MrNackRepr, MrProbeRepr, MrRemoteRepr, NackReason, SACK_BITS,
};
use transport_core::wire::{BthRepr, Extensions, Opcode, Psn, Qpn};

const KEY: u32 = 0x5a;

fn pair() -> Pair {
    Pair::granting_writes(KEY)
}

fn write(id: u64, offset: u64, len: u32) -> WorkRequest {
    common::write_at(id, offset, len, KEY)
}

/// A datagram to side A (`to_b` false) or B, as its peer would send it from `src_port`, with a
/// good ICRC: a forger can compute that as well as the peer.
fn forge(to_b: bool, src_port: u16, psn: u32, opcode: Opcode, ext: Extensions) -> Vec<u8> {
    let (from, to) = if to_b { (1, 2) } else { (2, 1) };
    let cfg = common::config(from, to);
    let bth = BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: Qpn::new(u32::from(to)),
        ack_req: false,
        psn: Psn::new(psn),
    };
    let mut buf = vec![0u8; 256];
    let rest = bth.emit(&mut buf).unwrap();
    let left = ext.emit(opcode.layout(), rest).unwrap().len();
    let mut n = 256 - left;
    if ext.mr_data().is_some() {
        buf[n..n + 8].copy_from_slice(&[0xee; 8]);
        n += 8;
    }
    let icrc = compute_icrc(cfg.local_ip, cfg.remote_ip, src_port, 4791, &buf[..n]);
    buf[n..n + 4].copy_from_slice(&icrc.to_le_bytes());
    buf.truncate(n + 4);
    buf
}

fn ack(path: u8, cum_seq: u32, sack: [u8; SACK_BITS / 8]) -> Extensions {
    Extensions::MrAck(MrAckRepr {
        ece: false,
        refusals: false,
        path_id: path,
        ce_count: 0,
        cum_seq,
        ts_echo: 0,
        ack_delay: 0,
        rate_hint: 0,
        sack,
    })
}

fn nack(path: u8, reason: NackReason, path_seq: u32) -> Extensions {
    Extensions::MrNack(MrNackRepr {
        path_id: path,
        reason,
        path_seq,
        stream_id: 0,
        msn: 0,
    })
}

/// The UDP source port B's path `i` sends from (what a local user could read off a stats file).
fn b_port(p: &Pair, i: u8) -> u16 {
    p.b.conn.path_stats(PathId(i)).unwrap().src_port
}

fn a_port(p: &Pair, i: u8) -> u16 {
    p.a.conn.path_stats(PathId(i)).unwrap().src_port
}

fn completions(events: &[Event]) -> Vec<(u64, Status)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Completion(c) => Some((c.id, c.status)),
            _ => None,
        })
        .collect()
}

/// Delivers everything held, settles, and checks the Write of `len` bytes at `offset` completed
/// once as successful with B's memory equal to A's.
fn finish_and_check(
    p: &mut Pair,
    held: Vec<(bool, u16, Vec<u8>)>,
    id: u64,
    offset: usize,
    len: usize,
) {
    for (to_b, port, bytes) in held {
        let _ = p.deliver(to_b, port, &bytes);
    }
    p.settle();
    assert_eq!(completions(&p.a.events), vec![(id, Status::Success)]);
    assert!(
        p.a.mem[offset..offset + len] == p.b.mem[offset..offset + len],
        "the Write's bytes did not land"
    );
}

#[test]
fn forged_nacks_in_the_window_neither_fail_nor_hold_up_a_write() {
    let mut p = pair();
    p.a.conn.post(Instant::ZERO, write(7, 0, 4096)).unwrap();
    p.transmit();
    let held = std::mem::take(&mut p.wire);
    // Every fatal reason, every path, PSNs in the window, path sequences a blind forger would
    // try, from B's real ports and from another.
    let mut dropped = 0;
    for path in 0..4u8 {
        for reason in [
            NackReason::InvalidRkey,
            NackReason::AccessDenied,
            NackReason::InvalidRequest,
        ] {
            for psn in 0..4 {
                for guess in [0u32, 1, 2, 3, 0xffff_ffff] {
                    for port in [b_port(&p, path), 0xc001] {
                        let d = forge(false, port, psn, Opcode::MrNack, nack(path, reason, guess));
                        let r = p.deliver(false, port, &d);
                        assert!(
                            matches!(r, Err(DropReason::Inconsistent | DropReason::WrongPort)),
                            "{r:?}"
                        );
                        dropped += 1;
                    }
                }
            }
        }
    }
    assert_eq!(p.a.conn.counters().drop_bad_nack, dropped);
    assert_eq!(p.a.conn.counters().nacks_received, 0);
    // A confirms what looks like a refusal (B would hold a genuine one until it is confirmed);
    // B holds none of them and drops every confirmation.
    p.transmit();
    let answers = std::mem::take(&mut p.wire);
    // However many forged NACKs came, their confirmations share one slot: they cannot crowd
    // out the confirmations of genuine refusals.
    assert_eq!(answers.len(), 1);
    for (to_b, port, bytes) in &answers {
        assert!(to_b);
        assert_eq!(p.deliver(true, *port, bytes), Err(DropReason::Inconsistent));
    }
    assert_eq!(p.b.conn.counters().drop_bad_nack, answers.len() as u64);
    assert_eq!(p.b.conn.counters().refusals_confirmed, 0);
    finish_and_check(&mut p, held, 7, 0, 4096);
}

#[test]
fn forged_acks_never_complete_a_write_the_peer_did_not_place() {
    let mut p = pair();
    p.a.conn.post(Instant::ZERO, write(9, 4096, 4096)).unwrap();
    p.transmit();
    // Nothing reaches B yet.
    let held = std::mem::take(&mut p.wire);
    let full = [0xffu8; SACK_BITS / 8];
    for path in 0..4u8 {
        let port = b_port(&p, path);
        // A cumulative PSN over the whole Write, with cumulative path points and bitvectors a
        // forger would try (the sequence numbers start at random in a real connection).
        for cum_seq in [0u32, 1, 4, 16, 0x8000_0000, u32::MAX] {
            for sack in [[0u8; SACK_BITS / 8], full] {
                let d = forge(false, port, 4, Opcode::MrAck, ack(path, cum_seq, sack));
                assert_eq!(p.deliver(false, port, &d), Err(DropReason::Inconsistent));
            }
        }
    }
    p.round(&mut |_, _| true);
    assert!(completions(&p.a.events).is_empty(), "{:?}", p.a.events);
    assert_eq!(p.a.conn.counters().drop_bad_ack, 48);
    assert_eq!(p.a.conn.counters().acked, 0);
    finish_and_check(&mut p, held, 9, 4096, 4096);
}

#[test]
fn control_from_another_port_of_the_peer_is_refused_once_the_path_port_is_known() {
    let mut p = pair();
    p.a.conn.post(Instant::ZERO, write(1, 0, 1024)).unwrap();
    p.settle();
    assert_eq!(completions(&p.a.events), vec![(1, Status::Success)]);
    // A second Write; B's genuine ACK for it, replayed from another port of B's host, is
    // refused; from the path's own port it is taken.
    p.a.events.clear();
    p.a.conn.post(p.now, write(2, 1024, 1024)).unwrap();
    p.transmit();
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        let _ = p.deliver(to_b, port, &bytes);
    }
    p.b.conn.handle_timeout(p.now + 1_000_000);
    p.transmit();
    let acks: Vec<_> = std::mem::take(&mut p.wire);
    assert!(!acks.is_empty());
    for (to_b, port, bytes) in &acks {
        assert!(!to_b);
        let stranger = port ^ 0x0101;
        // The ICRC covers the port: the forger seals it for its own.
        let mut forged = bytes.clone();
        let n = forged.len() - 4;
        let cfg = common::config(2, 1);
        let icrc = compute_icrc(cfg.local_ip, cfg.remote_ip, stranger, 4791, &forged[..n]);
        forged[n..].copy_from_slice(&icrc.to_le_bytes());
        assert_eq!(
            p.deliver(false, stranger, &forged),
            Err(DropReason::WrongPort)
        );
    }
    while let Some(e) = p.a.conn.poll_event() {
        p.a.events.push(e);
    }
    assert!(completions(&p.a.events).is_empty(), "{:?}", p.a.events);
    for (_, port, bytes) in &acks {
        let _ = p.deliver(false, *port, bytes);
    }
    p.settle();
    assert_eq!(completions(&p.a.events), vec![(2, Status::Success)]);
    assert_eq!(p.a.conn.counters().drop_wrong_port, acks.len() as u64);
}

#[test]
fn forged_probe_replies_do_not_revive_a_failed_path() {
    let mut p = pair();
    let dead = a_port(&p, 0);
    p.a.conn
        .post(Instant::ZERO, write(3, 0, 16 * 1024))
        .unwrap();
    // Path 0 loses everything until it has failed over at least once.
    let mut failed = false;
    for _ in 0..200_000 {
        p.round(&mut |to_b, b| to_b && path_of(b) == Some(0));
        if p.a.events.iter().any(|e| {
            matches!(
                e,
                Event::PathFailed {
                    path: PathId(0),
                    ..
                }
            )
        }) {
            failed = true;
            break;
        }
    }
    assert!(failed, "path 0 never failed");
    assert_ne!(a_port(&p, 0), dead, "a failed path takes a new port");
    // The forger answers every probe sequence it might guess, with timestamps it might guess.
    let port = b_port(&p, 0);
    for seq in (0..64u32).chain((0..64).map(|k| u32::MAX - k)) {
        for ts in [0u32, 1, p.now.wire_timestamp(), p.now.probe_timestamp()] {
            let probe = MrProbeRepr {
                path_id: 0,
                probe_seq: seq,
                timestamp: 0,
                ts_echo: ts,
            };
            let d = forge(
                false,
                port,
                0,
                Opcode::MrProbeReply,
                Extensions::MrProbe(probe),
            );
            assert_eq!(p.deliver(false, port, &d), Err(DropReason::Inconsistent));
        }
    }
    assert_eq!(p.a.conn.counters().drop_bad_probe, 128 * 4);
    while let Some(e) = p.a.conn.poll_event() {
        p.a.events.push(e);
    }
    assert!(!p
        .a
        .events
        .iter()
        .any(|e| matches!(e, Event::PathRestored { .. })));
    // The route comes back: the genuine reply revives it, and the Write completes.
    let restored = |p: &Pair| {
        p.a.events
            .iter()
            .any(|e| matches!(e, Event::PathRestored { path: PathId(0) }))
    };
    for _ in 0..100_000 {
        if restored(&p) {
            break;
        }
        p.round(&mut |_, _| false);
    }
    assert!(restored(&p), "{:?}", p.a.conn.counters());
    p.settle();
    assert_eq!(completions(&p.a.events), vec![(3, Status::Success)]);
    assert!(p.a.mem[..16 * 1024] == p.b.mem[..16 * 1024]);
}

/// A failed path whose probes are answered late (behind a queue longer than the probe interval:
/// each answer comes after the next probe left) comes back on the late answer; the same answer
/// again is refused, as is one for a probe never sent.
#[test]
fn a_late_answer_brings_a_failed_path_back() {
    let mut p = pair();
    p.a.conn
        .post(Instant::ZERO, write(3, 0, 16 * 1024))
        .unwrap();
    // Path 0 loses everything until it has failed; then its probes are held, not delivered.
    let mut held: Vec<(u16, Vec<u8>)> = Vec::new();
    let mut failed = false;
    for _ in 0..400_000 {
        p.transmit();
        if failed {
            for (to_b, src, d) in &p.wire {
                if *to_b && d[0] == 0xe2 && path_of(d) == Some(0) {
                    held.push((*src, d.clone()));
                }
            }
        }
        p.deliver_and_tick(&mut |to_b, b| to_b && path_of(b) == Some(0));
        failed |= p.a.events.iter().any(|e| {
            matches!(
                e,
                Event::PathFailed {
                    path: PathId(0),
                    ..
                }
            )
        });
        if held.len() >= 3 {
            break;
        }
    }
    assert!(
        held.len() >= 3,
        "path 0 failed: {failed}, probes held: {}",
        held.len()
    );
    // The first held probe reaches B now; its reply reaches A after two newer probes left.
    p.deliver(true, held[0].0, &held[0].1).unwrap();
    p.transmit();
    let reply = p
        .wire
        .iter()
        .find(|(to_b, _, d)| !to_b && d[0] == 0xe3)
        .map(|(_, src, d)| (*src, d.clone()))
        .expect("B answers the probe");
    p.wire.clear();
    assert_eq!(p.deliver(false, reply.0, &reply.1), Ok(Delivery::Nothing));
    while let Some(e) = p.a.conn.poll_event() {
        p.a.events.push(e);
    }
    assert!(p
        .a
        .events
        .iter()
        .any(|e| matches!(e, Event::PathRestored { path: PathId(0) })));
    // The same answer again is a replay.
    let bad = p.a.conn.counters().drop_bad_probe;
    assert_eq!(
        p.deliver(false, reply.0, &reply.1),
        Err(DropReason::Inconsistent)
    );
    assert_eq!(p.a.conn.counters().drop_bad_probe, bad + 1);
    p.settle();
    assert_eq!(completions(&p.a.events), vec![(3, Status::Success)]);
}

/// The path a data packet or a probe names (None for other packets).
fn path_of(d: &[u8]) -> Option<u8> {
    let (bth, rest) = BthRepr::parse(d).ok()?;
    let (ext, _) = Extensions::parse(bth.opcode.layout(), rest).ok()?;
    match ext {
        Extensions::MrProbe(p) => Some(p.path_id),
        _ => ext.mr_data().map(|m| m.path_id),
    }
}

#[test]
fn an_old_psn_with_a_far_path_sequence_moves_no_path_state() {
    let mut p = pair();
    p.a.conn.post(Instant::ZERO, write(1, 0, 4096)).unwrap();
    p.settle();
    assert_eq!(completions(&p.a.events), vec![(1, Status::Success)]);
    p.a.events.clear();
    // PSN 0 has arrived: a copy of it claiming a path sequence far ahead is a duplicate, and is
    // dropped before it can slide path 0's window past everything in between.
    let far = path_origin(path_base(1), PathId(0)).0.wrapping_add(100_000);
    let data = MrDataRepr {
        path_id: 0,
        path_seq: far,
        msg_len: 8,
        ..Default::default()
    };
    let ext = Extensions::MrRemote(
        data,
        MrRemoteRepr {
            va: BASE,
            rkey: KEY,
        },
    );
    let d = forge(true, a_port(&p, 0), 0, Opcode::MrWrite, ext);
    assert_eq!(
        p.deliver(true, a_port(&p, 0), &d),
        Err(DropReason::Duplicate)
    );
    p.transmit();
    assert!(p.wire.is_empty(), "B acknowledged a forged duplicate");
    // The next Write loses one packet on path 0: the repair comes from the SACK of the packets
    // behind it at once, not from a timeout.
    p.a.conn.post(p.now, write(2, 8192, 16 * 1024)).unwrap();
    let mut lost = false;
    let start = p.now;
    for _ in 0..2000 {
        p.round(&mut |to_b, b| {
            let drop = !lost && to_b && path_of(b) == Some(0) && bth_is_data(b);
            lost |= drop;
            drop
        });
        if !completions(&p.a.events).is_empty() {
            break;
        }
    }
    assert_eq!(completions(&p.a.events), vec![(2, Status::Success)]);
    let c = p.a.conn.counters();
    assert_eq!((c.lost_by_sack, c.lost_by_timeout), (1, 0), "{c:?}");
    assert!(
        p.now.since(start) < 100_000,
        "the repair took {} ns",
        p.now.since(start)
    );
    assert!(p.a.mem[8192..8192 + 16 * 1024] == p.b.mem[8192..8192 + 16 * 1024]);
}

fn bth_is_data(d: &[u8]) -> bool {
    BthRepr::parse(d).is_ok_and(|(bth, _)| bth.opcode != Opcode::MrProbe)
}

/// Duplicates need no guess of the window. Marked Congestion Experienced, they must not reach
/// the sender as ECN marks; and a forged probe's timestamp, echoed by the next ACK, must not
/// become an RTT sample of hundreds of milliseconds.
#[test]
fn forged_duplicates_and_probes_inject_no_marks_and_no_rtt() {
    let mut p = pair();
    p.a.conn.post(Instant::ZERO, write(1, 0, 8192)).unwrap();
    p.settle();
    let old = |p: &Pair, path: u8| {
        let data = MrDataRepr {
            path_id: path,
            path_seq: path_origin(path_base(1), PathId(path)).0,
            msg_len: 8,
            ..Default::default()
        };
        let ext = Extensions::MrRemote(
            data,
            MrRemoteRepr {
                va: BASE,
                rkey: KEY,
            },
        );
        forge(true, a_port(p, path), 0, Opcode::MrWrite, ext)
    };
    for round in 0..50 {
        for path in 0..4u8 {
            let d = old(&p, path);
            let port = a_port(&p, path);
            assert_eq!(
                p.deliver_marked(true, port, &d, true),
                Err(DropReason::Duplicate)
            );
        }
        if round % 10 == 0 {
            p.round(&mut |_, _| false);
        }
    }
    // A Write in flight; B has its packets; then a probe with a timestamp 400 ms old.
    p.a.conn.post(p.now, write(2, 8192, 8192)).unwrap();
    p.a.conn.handle_timeout(p.now);
    let mut buf = vec![0u8; 2048];
    while let Some(tx) = p.a.conn.poll_transmit_data(p.now, &mut buf) {
        let at = (tx.payload_addr - BASE) as usize;
        buf[tx.header_len..tx.header_len + tx.payload_len]
            .copy_from_slice(&p.a.mem[at..at + tx.payload_len]);
        p.a.conn.seal(&tx, &mut buf);
        let d = buf[..tx.len].to_vec();
        p.deliver(true, tx.src_port, &d).unwrap();
    }
    for path in 0..4u8 {
        let probe = MrProbeRepr {
            path_id: path,
            probe_seq: 1,
            timestamp: (p.now.wire_timestamp()).wrapping_sub(400_000_000),
            ts_echo: 0,
        };
        let port = a_port(&p, path);
        let d = forge(true, port, 0, Opcode::MrProbe, Extensions::MrProbe(probe));
        p.deliver(true, port, &d).unwrap();
    }
    p.settle();
    let c = p.a.conn.counters();
    assert_eq!((c.ecn_marks_echoed, c.cwnd_cuts), (0, 0), "{c:?}");
    for path in 0..4 {
        let s = p.a.conn.path_stats(PathId(path)).unwrap();
        assert!(
            s.rtt_smoothed < 1_000_000,
            "path {path}: srtt {} ns",
            s.rtt_smoothed
        );
    }
    assert_eq!(
        completions(&p.a.events),
        vec![(1, Status::Success), (2, Status::Success)]
    );
}

/// The requester's confirmation of a refusal comes from another port than the path's first
/// (the path failed over meanwhile): the responder takes it, since it names the refusal
/// exactly, and the connection goes on.
#[test]
fn a_refusal_confirmed_from_a_moved_port_is_released() {
    let mut p = pair();
    p.a.conn.post(Instant::ZERO, write(1, 0, 1024)).unwrap();
    p.settle();
    // A Write with a key B never granted: B refuses it and holds the refusal.
    let mut bad = write(2, 1024, 1024);
    bad.remote.rkey = KEY + 1;
    p.a.conn.post(p.now, bad).unwrap();
    let mut moved = 0;
    for _ in 0..1000 {
        p.transmit();
        for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
            let confirmation =
                to_b && BthRepr::parse(&bytes).is_ok_and(|(b, _)| b.opcode == Opcode::MrNack);
            if confirmation {
                // As if A's path had moved to a new port since.
                let new_port = port ^ 0x0202;
                let mut d = bytes.clone();
                let n = d.len() - 4;
                let cfg = common::config(1, 2);
                let icrc = compute_icrc(cfg.local_ip, cfg.remote_ip, new_port, 4791, &d[..n]);
                d[n..].copy_from_slice(&icrc.to_le_bytes());
                let _ = p.deliver(true, new_port, &d);
                moved += 1;
            } else {
                let _ = p.deliver(to_b, port, &bytes);
            }
        }
        p.deliver_and_tick(&mut |_, _| false);
        if p.b.conn.counters().refusals_confirmed > 0 && p.a.conn.is_idle() {
            break;
        }
    }
    assert!(moved > 0);
    assert_eq!(p.b.conn.counters().refusals_confirmed, 1);
    assert_eq!(
        completions(&p.a.events),
        vec![
            (1, Status::Success),
            (2, Status::Refused(NackReason::InvalidRkey))
        ]
    );
    // The connection goes on.
    p.a.conn.post(p.now, write(3, 2048, 1024)).unwrap();
    p.settle();
    assert_eq!(completions(&p.a.events).last(), Some(&(3, Status::Success)));
}

#[derive(Debug, Clone)]
enum Forgery {
    Ack {
        path: u8,
        cum_seq: u32,
        psn: u32,
        sack: u8,
    },
    Nack {
        path: u8,
        reason: u8,
        path_seq: u32,
        psn: u32,
    },
    ProbeReply {
        path: u8,
        seq: u32,
        ts: u32,
    },
    Probe {
        path: u8,
        seq: u32,
    },
}

fn forgery() -> impl Strategy<Value = (bool, bool, Forgery)> {
    let f = prop_oneof![
        (0u8..5, any::<u32>(), 0u32..64, any::<u8>()).prop_map(|(path, cum_seq, psn, sack)| {
            Forgery::Ack {
                path,
                cum_seq,
                psn,
                sack,
            }
        }),
        (0u8..5, 0u8..8, any::<u32>(), 0u32..64).prop_map(|(path, reason, path_seq, psn)| {
            Forgery::Nack {
                path,
                reason,
                path_seq,
                psn,
            }
        }),
        (0u8..5, any::<u32>(), any::<u32>()).prop_map(|(path, seq, ts)| Forgery::ProbeReply {
            path,
            seq,
            ts
        }),
        (0u8..5, any::<u32>()).prop_map(|(path, seq)| Forgery::Probe { path, seq }),
    ];
    (any::<bool>(), any::<bool>(), f)
}

fn forged_bytes(p: &Pair, to_b: bool, real_port: bool, f: &Forgery) -> (u16, Vec<u8>) {
    let path = |x: u8| x % 4;
    let port = |x: u8| match (real_port, to_b) {
        (false, _) => 0xc000 | u16::from(x) << 4,
        (true, false) => b_port(p, path(x)),
        (true, true) => a_port(p, path(x)),
    };
    let reason = |r: u8| {
        [
            NackReason::InvalidRkey,
            NackReason::AccessDenied,
            NackReason::InvalidRequest,
            NackReason::ReceiverNotReady,
            NackReason::MessageTooLong,
            NackReason::RemoteOperational,
            NackReason::RefusalSeen,
            NackReason::InvalidRkey,
        ][usize::from(r % 8)]
    };
    match *f {
        Forgery::Ack {
            path,
            cum_seq,
            psn,
            sack,
        } => {
            let mut bits = [0u8; SACK_BITS / 8];
            bits[usize::from(sack) % bits.len()] = sack;
            (
                port(path),
                forge(
                    to_b,
                    port(path),
                    psn,
                    Opcode::MrAck,
                    ack(path, cum_seq, bits),
                ),
            )
        }
        Forgery::Nack {
            path,
            reason: r,
            path_seq,
            psn,
        } => (
            port(path),
            forge(
                to_b,
                port(path),
                psn,
                Opcode::MrNack,
                nack(path, reason(r), path_seq),
            ),
        ),
        Forgery::ProbeReply { path, seq, ts } => {
            let probe = MrProbeRepr {
                path_id: path,
                probe_seq: seq,
                timestamp: 0,
                ts_echo: ts,
            };
            (
                port(path),
                forge(
                    to_b,
                    port(path),
                    0,
                    Opcode::MrProbeReply,
                    Extensions::MrProbe(probe),
                ),
            )
        }
        Forgery::Probe { path, seq } => {
            let probe = MrProbeRepr {
                path_id: path,
                probe_seq: seq,
                timestamp: 0,
                ts_echo: 0,
            };
            (
                port(path),
                forge(
                    to_b,
                    port(path),
                    0,
                    Opcode::MrProbe,
                    Extensions::MrProbe(probe),
                ),
            )
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Any sequence of forged control packets from a third party, against both ends of a running
    /// transfer over a wire that also loses packets: every Write completes exactly once, as
    /// successful, and only after B has placed every one of its bytes.
    #[test]
    fn forged_control_never_completes_fails_or_loses_a_write(
        forgeries in prop::collection::vec(forgery(), 1..200),
        lose_every in 5usize..50,
    ) {
        let mut p = pair();
        let writes: Vec<(u64, usize, usize)> = (0..6).map(|k| (k + 1, k as usize * 20_000, 3000 + k as usize * 2500)).collect();
        for &(id, off, len) in &writes {
            p.a.conn.post(Instant::ZERO, write(id, off as u64, len as u32)).unwrap();
        }
        let mut n = 0usize;
        let mut fi = forgeries.iter().cycle();
        let mut seen = 0usize;
        for _round in 0..50_000 {
            // A forgery (or a few) before each round while they last.
            if seen < forgeries.len() {
                let (to_b, real, f) = fi.next().unwrap();
                seen += 1;
                let (port, d) = forged_bytes(&p, *to_b, *real, f);
                let _ = p.deliver(*to_b, port, &d);
            }
            p.round(&mut |_, _| { n += 1; n % lose_every == 0 });
            // Every completion so far: successful, once, and its bytes already placed.
            for (id, status) in completions(&p.a.events) {
                prop_assert_eq!(status, Status::Success, "write {} failed", id);
                let &(_, off, len) = writes.iter().find(|w| w.0 == id).unwrap();
                prop_assert!(p.a.mem[off..off + len] == p.b.mem[off..off + len], "write {} completed before its bytes landed", id);
            }
            if completions(&p.a.events).len() == writes.len() && seen >= forgeries.len() {
                break;
            }
        }
        let done = completions(&p.a.events);
        prop_assert_eq!(done.len(), writes.len(), "not every write completed: {:?}", done);
        let mut ids: Vec<u64> = done.iter().map(|d| d.0).collect();
        ids.sort_unstable();
        ids.dedup();
        prop_assert_eq!(ids.len(), writes.len());
    }
}

/// Each reason a datagram is dropped for has its own counter: an ACK naming a path the
/// connection does not have, and a RoCEv2 opcode the connection does not act on.
#[test]
fn an_unknown_path_and_an_unsupported_opcode_are_counted_apart() {
    let mut p = pair();
    let port = b_port(&p, 0);
    let unknown_path = forge(
        false,
        port,
        0,
        Opcode::MrAck,
        ack(200, 0, [0; SACK_BITS / 8]),
    );
    assert_eq!(
        p.deliver(false, port, &unknown_path),
        Err(DropReason::UnknownPath)
    );
    let c = *p.a.conn.counters();
    assert_eq!((c.drop_unknown_path, c.drop_unsupported_opcode), (1, 0));
    // An IBTA RC Send-only packet: it parses, but this connection speaks MetaRoCE.
    let rc_send = forge(false, port, 0, Opcode::RcSendOnly, Extensions::None);
    assert_eq!(
        p.deliver(false, port, &rc_send),
        Err(DropReason::UnsupportedOpcode)
    );
    let c = *p.a.conn.counters();
    assert_eq!((c.drop_unknown_path, c.drop_unsupported_opcode), (1, 1));
}

/// A Read response for a Read that A holds at its initiator depth (posted, never sent) completes
/// nothing and lands nothing, even when it passes every other check: this one carries B's own
/// first PSN and path sequence, as the peer itself (or a forger who has learned them) could send.
#[test]
fn a_forged_response_to_a_held_read_completes_nothing() {
    use transport_core::conn::{Access, Config, Region, RemoteAddr, WrOp};
    let depth_one = |mut c: Config| {
        c.max_rd_atomic = 1;
        c
    };
    let mut p = Pair::with_configs(depth_one(common::config(1, 2)), common::config(2, 1));
    let len = p.b.mem.len() as u64;
    for (side, access) in [
        (&mut p.b, Access::REMOTE_READ),
        (&mut p.a, Access::LOCAL_WRITE),
    ] {
        side.conn
            .register(Region {
                key: KEY,
                base: BASE,
                len,
                access,
            })
            .unwrap();
    }
    let read = |id: u64, at: u64| WorkRequest {
        id,
        op: WrOp::Read,
        stream: 0,
        local_addr: BASE + at,
        len: 8,
        remote: RemoteAddr {
            va: BASE + at,
            rkey: KEY,
        },
    };
    // Read 1 (MSN 0) goes; Read 2 (MSN 1) is held behind it.
    p.a.conn.post(p.now, read(1, 0x100)).unwrap();
    p.a.conn.post(p.now, read(2, 0x200)).unwrap();
    p.transmit();
    let sent = p.wire.len();
    assert_eq!(sent, 1, "one Read request on the wire");
    // The forger answers Read 2 from B's port of path 0, in B's first PSN and path sequence.
    let data = MrDataRepr {
        path_id: 0,
        path_seq: path_origin(path_base(2), PathId(0)).0,
        stream_id: 0,
        msn: 1,
        msg_offset: 0,
        msg_len: 8,
        ..Default::default()
    };
    let d = forge(
        false,
        b_port(&p, 0),
        0,
        Opcode::MrReadResponse,
        Extensions::MrData(data),
    );
    let _ = p.deliver(false, b_port(&p, 0), &d);
    while let Some(e) = p.a.conn.poll_event() {
        p.a.events.push(e);
    }
    assert!(completions(&p.a.events).is_empty(), "{:?}", p.a.events);
    assert_ne!(p.a.mem[0x200..0x208], [0xee; 8], "the forged bytes landed");
}

/// A receive whose message is whole but whose completion waits (behind an earlier receive of its
/// stream, or for room in the event queue) is not open to more bytes: a Send packet with a fresh
/// PSN naming its MSN, even on an unused path sequence of the peer's, is refused (the receive is
/// whole, and the bytes would be more than its message holds: either check refuses it) and
/// places nothing, and the receive completes with the peer's own bytes.
#[test]
fn a_send_for_a_receive_that_is_whole_but_not_yet_completed_is_refused() {
    use transport_core::conn::{RecvRequest, RemoteAddr, WrOp};
    let mut p = pair();
    for (i, b) in p.a.mem.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13).wrapping_add(1);
    }
    for (id, at) in [(10u64, 0x1000u64), (11, 0x2000)] {
        p.b.conn
            .post_recv(RecvRequest {
                id,
                stream: 0,
                addr: BASE + at,
                len: 64,
            })
            .unwrap();
    }
    let send = |id: u64, at: u64| WorkRequest {
        id,
        op: WrOp::Send,
        stream: 0,
        local_addr: BASE + at,
        len: 8,
        remote: RemoteAddr::default(),
    };
    p.a.conn.post(p.now, send(1, 0)).unwrap();
    p.a.conn.post(p.now, send(2, 8)).unwrap();
    p.transmit();
    let to_b: Vec<(u16, Vec<u8>)> = p
        .wire
        .iter()
        .filter(|(to_b, _, _)| *to_b)
        .map(|(_, port, d)| (*port, d.clone()))
        .collect();
    p.wire.clear();
    assert_eq!(to_b.len(), 2, "two Sends");
    // Only the second arrives: receive 11 is whole, and waits behind receive 10.
    let psn_of = |d: &[u8]| BthRepr::parse(d).unwrap().0.psn.get();
    let (first, second) = if psn_of(&to_b[0].1) < psn_of(&to_b[1].1) {
        (to_b[0].clone(), to_b[1].clone())
    } else {
        (to_b[1].clone(), to_b[0].clone())
    };
    assert!(matches!(
        p.deliver(true, second.0, &second.1),
        Ok(Delivery::Place { .. })
    ));
    // The forged Send: MSN 1, the next PSN, path 3's first sequence (no packet used it).
    let data = MrDataRepr {
        path_id: 3,
        path_seq: path_origin(path_base(1), PathId(3)).0,
        stream_id: 0,
        msn: 1,
        msg_offset: 0,
        msg_len: 8,
        ..Default::default()
    };
    let d = forge(
        true,
        a_port(&p, 3),
        psn_of(&second.1) + 1,
        Opcode::MrSend,
        Extensions::MrData(data),
    );
    let forged = p.deliver(true, a_port(&p, 3), &d);
    assert!(
        !matches!(forged, Ok(Delivery::Place { .. })),
        "placed: {forged:?}"
    );
    assert_eq!(p.b.mem[0x2000..0x2008], p.a.mem[8..16]);
    // The first Send arrives; both receives complete with the peer's bytes.
    let _ = p.deliver(true, first.0, &first.1);
    p.settle();
    let got: Vec<(u64, Status)> =
        p.b.events
            .iter()
            .filter_map(|e| match e {
                Event::Completion(c) => Some((c.id, c.status)),
                _ => None,
            })
            .collect();
    assert_eq!(got, [(10, Status::Success), (11, Status::Success)]);
    assert_eq!(p.b.mem[0x1000..0x1008], p.a.mem[0..8]);
    assert_eq!(p.b.mem[0x2000..0x2008], p.a.mem[8..16]);
}

/// Send packets whose bytes add up to more than their message (overlapping offsets, each with a
/// fresh PSN: no honest requester sends them, since a packet sent again keeps its PSN) are
/// refused: the receive ends with the refusal instead of counting past its message (a count
/// that overflowed, or a receive that never completed and held every later one of its stream),
/// and the stream's next messages complete.
#[test]
fn send_packets_that_overfill_their_message_end_its_receive_and_the_stream_goes_on() {
    use transport_core::conn::{CompletionKind, RecvRequest};
    let mut p = pair();
    for id in 0..3u64 {
        p.b.conn
            .post_recv(RecvRequest {
                id: 20 + id,
                stream: 0,
                addr: BASE + 0x1000 * (id + 1),
                len: 64,
            })
            .unwrap();
    }
    // (MSN, offset, message length): MSN 0 is 12 bytes, given 8 at 0 and then 8 at 4; MSNs 1
    // and 2 are whole 8-byte messages. Each packet carries eight 0xee bytes, on its own path
    // sequence, with the next PSN.
    let packets = [(0u32, 0u32, 12u32), (0, 4, 12), (1, 0, 8), (2, 0, 8)];
    let mut results = Vec::new();
    for (k, (msn, offset, msg_len)) in packets.into_iter().enumerate() {
        let path = (k % 4) as u8;
        let data = MrDataRepr {
            path_id: path,
            path_seq: path_origin(path_base(1), PathId(path))
                .0
                .wrapping_add((k / 4) as u32),
            stream_id: 0,
            msn,
            msg_offset: offset,
            msg_len,
            ..Default::default()
        };
        let d = forge(
            true,
            a_port(&p, path),
            k as u32,
            Opcode::MrSend,
            Extensions::MrData(data),
        );
        results.push(p.deliver(true, a_port(&p, path), &d));
    }
    assert!(
        matches!(results[0], Ok(Delivery::Place { .. })),
        "{results:?}"
    );
    assert!(
        !matches!(results[1], Ok(Delivery::Place { .. })),
        "16 bytes counted into a 12-byte message: {results:?}"
    );
    assert!(
        matches!(results[2], Ok(Delivery::Place { .. })),
        "{results:?}"
    );
    assert!(
        matches!(results[3], Ok(Delivery::Place { .. })),
        "{results:?}"
    );
    while let Some(e) = p.b.conn.poll_event() {
        p.b.events.push(e);
    }
    let got: Vec<(u64, CompletionKind, Status)> =
        p.b.events
            .iter()
            .filter_map(|e| match e {
                Event::Completion(c) => Some((c.id, c.kind, c.status)),
                _ => None,
            })
            .collect();
    assert_eq!(
        got,
        [
            (
                20,
                CompletionKind::Recv,
                Status::Refused(NackReason::InvalidRequest)
            ),
            (21, CompletionKind::Recv, Status::Success),
            (22, CompletionKind::Recv, Status::Success),
        ]
    );
}
