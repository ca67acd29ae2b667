//! A path that moves to a new UDP source port (its route failed and it took new entropy) is
//! followed by the peer: the first new packet in the peer's receive window from the new port
//! teaches it, also one the peer refuses for now (receiver not ready), and the ACKs from the new
//! port are taken from then on.

mod common;

use common::{config, Pair, BASE};
use transport_core::conn::{
    compute_icrc, Access, Event, PathId, Region, RemoteAddr, Status, WorkRequest, WrOp,
};
use transport_core::time::Instant;
use transport_core::wire::Opcode;

const KEY: u32 = 0x77;

/// The datagram `bytes` that A sent from its path's port, as A sends it after its path moved to
/// `port`: the ICRC covers the source port and is sealed again.
fn from_port(bytes: &[u8], port: u16) -> Vec<u8> {
    let cfg = config(1, 2);
    let mut moved = bytes.to_vec();
    let n = moved.len() - 4;
    let icrc = compute_icrc(cfg.local_ip, cfg.remote_ip, port, 4791, &moved[..n]);
    moved[n..].copy_from_slice(&icrc.to_le_bytes());
    moved
}

/// A pair of one path each, both granting Writes, after a Write from A has taught B the port of A's
/// path; with that port and the one A's path moves to.
fn moved_pair() -> (Pair, u16, u16) {
    let one_path = |l, r| {
        let mut c = config(l, r);
        c.paths = 1;
        c
    };
    let mut p = Pair::with_configs(one_path(1, 2), one_path(2, 1));
    p.grant_writes(KEY);
    let len = p.a.mem.len() as u64;
    p.a.conn
        .register(Region {
            key: KEY,
            base: BASE,
            len,
            access: Access::REMOTE_WRITE,
        })
        .unwrap();
    p.a.conn
        .post(Instant::ZERO, common::write_at(1, 0, 1024, KEY))
        .unwrap();
    p.settle();
    let old = p.a.conn.path_stats(PathId(0)).unwrap().src_port;
    (p, old, old ^ 0x0101)
}

/// The livelock this prevents (found with Reads under qemu): the requester's paths failed over to
/// new ports; the responder, its queue full of Read responses waiting for ACKs, refused every new
/// Read request (receiver not ready) and so never learned the new ports; it dropped the ACKs of
/// its responses, which came from them, and its queue stayed full.
#[test]
fn a_refused_packet_from_a_paths_new_port_teaches_the_peer_that_port() {
    let (mut p, old, new) = moved_pair();
    // B writes to A; A's path has moved: A's ACK of it, and A's Send (B has no receive posted: it
    // refuses it, receiver not ready), come from the new port.
    p.b.conn
        .post(p.now, common::write_at(2, 4096, 1024, KEY))
        .unwrap();
    p.transmit();
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        assert!(!to_b);
        p.deliver(false, port, &bytes).unwrap();
    }
    let send = WorkRequest {
        id: 3,
        op: WrOp::Send,
        stream: 0,
        local_addr: BASE,
        len: 64,
        remote: RemoteAddr::default(),
    };
    p.a.conn.post(p.now, send).unwrap();
    p.a.conn.handle_timeout(p.now + 1_000_000);
    p.now += 1_000_000;
    p.transmit();
    let mut from_a: Vec<_> = std::mem::take(&mut p.wire)
        .into_iter()
        .filter(|(to_b, _, _)| *to_b)
        .collect();
    // The Send first, then the stand-alone ACK.
    from_a.sort_by_key(|(_, _, bytes)| bytes[0] == Opcode::MrAck.to_u8());
    let acks = from_a
        .iter()
        .filter(|(_, _, b)| b[0] == Opcode::MrAck.to_u8())
        .count();
    assert_eq!((from_a.len(), acks), (2, 1), "A's Send and its ACK");
    for (_, port, bytes) in &from_a {
        assert_eq!(*port, old);
        p.deliver(true, new, &from_port(bytes, new)).unwrap();
    }
    p.transmit();
    let c = *p.b.conn.counters();
    assert_eq!(
        (c.data_received, c.nacks_sent),
        (1, 1),
        "B refused the Send for now (receiver not ready): {c:?}"
    );
    assert_eq!(c.drop_wrong_port, 0, "and took the ACK: {c:?}");
    while let Some(e) = p.b.conn.poll_event() {
        p.b.events.push(e);
    }
    assert!(
        p.b.events.iter().any(|e| matches!(
            e,
            Event::Completion(c) if c.id == 2 && c.status == Status::Success
        )),
        "B's Write is acknowledged: {:?}",
        p.b.events
    );
}

/// A path that moved has nothing new to send (the end of a run: only ACKs and repeats are left):
/// the peer's tail probe, sent when its data goes unacknowledged, is answered from the new port;
/// the probe reply (it names the outstanding probe and echoes its timestamp) teaches the port, and
/// the ACK that comes with it is taken: one ACK dropped, nothing sent again, no path failed.
#[test]
fn the_answer_to_a_tail_probe_teaches_a_port_that_moved() {
    let (mut p, old, new) = moved_pair();
    p.b.conn
        .post(p.now, common::write_at(2, 4096, 1024, KEY))
        .unwrap();
    let mut dropped = 0;
    for _ in 0..200 {
        // Everything both sides have to say, until neither has more.
        loop {
            p.transmit();
            let wire = std::mem::take(&mut p.wire);
            if wire.is_empty() {
                break;
            }
            for (to_b, port, bytes) in wire {
                if to_b {
                    assert_eq!(port, old);
                    if p.deliver(true, new, &from_port(&bytes, new)).is_err() {
                        dropped += 1;
                    }
                } else {
                    let _ = p.deliver(false, port, &bytes);
                }
            }
            p.now += 1_000;
        }
        while let Some(e) = p.b.conn.poll_event() {
            p.b.events.push(e);
        }
        if !p.b.events.is_empty() {
            break;
        }
        // Nothing else moves: on to the next timer of either side.
        let next = [p.a.conn.poll_timeout(), p.b.conn.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .expect("B waits for its ACK");
        p.now = p.now.max(next);
        for side in [&mut p.a, &mut p.b] {
            if side.conn.poll_timeout().is_some_and(|t| t <= p.now) {
                side.conn.handle_timeout(p.now);
            }
        }
    }
    assert!(
        p.b.events.iter().any(|e| matches!(
            e,
            Event::Completion(c) if c.id == 2 && c.status == Status::Success
        )),
        "B's Write is acknowledged: {:?}",
        p.b.events
    );
    let c = p.b.conn.counters();
    assert_eq!(dropped, 1, "only the ACK before the probe: {c:?}");
    assert_eq!((c.retransmitted, c.path_failures), (0, 0), "{c:?}");
}

/// Hostile: a genuine data packet replayed from another port (a duplicate, or outside the window)
/// teaches no port, refused or not: only a new packet in the window does. The path's genuine ACKs
/// from its own port are still taken.
#[test]
fn a_replayed_packet_from_a_stranger_port_teaches_nothing() {
    let (mut p, old, stranger) = moved_pair();
    p.a.conn
        .post(p.now, common::write_at(5, 8192, 1024, KEY))
        .unwrap();
    p.transmit();
    let sent: Vec<_> = std::mem::take(&mut p.wire);
    assert_eq!(sent.len(), 1);
    let (_, port, bytes) = &sent[0];
    assert_eq!(*port, old);
    p.deliver(true, old, bytes).unwrap();
    for _ in 0..3 {
        assert!(p
            .deliver(true, stranger, &from_port(bytes, stranger))
            .is_err());
    }
    // B writes to A: A's ACK from the path's own port is taken, nothing is dropped as from a
    // wrong port, and both Writes complete.
    p.b.conn
        .post(p.now, common::write_at(6, 12288, 1024, KEY))
        .unwrap();
    p.settle();
    assert_eq!(p.b.conn.counters().drop_wrong_port, 0);
    assert!(p.b.events.iter().any(|e| matches!(
        e,
        Event::Completion(c) if c.id == 6 && c.status == Status::Success
    )));
    assert!(p.a.events.iter().any(|e| matches!(
        e,
        Event::Completion(c) if c.id == 5 && c.status == Status::Success
    )));
}
