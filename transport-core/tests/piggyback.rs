//! Acknowledgements riding on data going the other way (flag A of the data header): a
//! ping-pong needs one datagram each way, the ACK it carries works like a stand-alone one, and
//! full-size packets never grow past a full packet.

mod common;

use common::{Pair, BASE};
use transport_core::conn::PathId;
use transport_core::conn::{
    Access, CompletionKind, Event, RecvRequest, Region, RemoteAddr, Status, WorkRequest, WrOp,
};
use transport_core::wire::metaroce::{MrDataRepr, PiggyAck};
use transport_core::wire::{BthRepr, Extensions, Opcode};

const KEY: u32 = 0x42;

fn grant_both(p: &mut Pair) {
    for side in [&mut p.a, &mut p.b] {
        side.conn
            .register(Region {
                key: KEY,
                base: BASE,
                len: 1 << 16,
                access: Access::REMOTE_WRITE.union(Access::LOCAL_WRITE),
            })
            .unwrap();
    }
}

fn write_imm(id: u64, len: u32, at: u64, imm: u32) -> WorkRequest {
    WorkRequest {
        id,
        op: WrOp::WriteWithImm(imm),
        stream: 0,
        local_addr: BASE + 0x8000,
        len,
        remote: RemoteAddr {
            va: BASE + at,
            rkey: KEY,
        },
    }
}

fn recv(id: u64) -> RecvRequest {
    RecvRequest {
        id,
        stream: 0,
        addr: BASE + 0xc000,
        len: 0,
    }
}

/// What one datagram is: (is an ACK alone, carries an ACK riding on data).
fn kind(bytes: &[u8]) -> (bool, bool) {
    let (_, rest) = BthRepr::parse(bytes).unwrap();
    let ext = Extensions::parse(Opcode::layout_of(bytes[0]), rest)
        .unwrap()
        .0;
    (
        bytes[0] == Opcode::MrAck.to_u8(),
        ext.mr_data().is_some_and(|d: MrDataRepr| d.ack),
    )
}

/// Moves everything on the wire, counting stand-alone ACKs and carried ones.
fn exchange(p: &mut Pair, alone: &mut usize, carried: &mut usize) {
    p.transmit();
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        let (a, c) = kind(&bytes);
        *alone += usize::from(a);
        *carried += usize::from(c);
        p.deliver(to_b, port, &bytes).unwrap();
    }
    for side in [&mut p.a, &mut p.b] {
        while let Some(e) = side.conn.poll_event() {
            side.events.push(e);
        }
    }
}

/// Successful completions of `kind`.
fn done(events: &[Event], kind: CompletionKind) -> usize {
    events
        .iter()
        .filter(|e| {
            matches!(e, Event::Completion(c)
            if c.kind == kind && c.status == Status::Success)
        })
        .count()
}

fn recv_completions(events: &[Event]) -> usize {
    done(events, CompletionKind::RecvWriteImm)
}

/// A ping-pong of Writes with immediate: each answer carries the ACK of the ping it answers and
/// each ping the ACK of the previous answer, so no ACK travels alone until the exchange stops.
#[test]
fn a_ping_pong_carries_its_acks_on_the_data() {
    let mut p = Pair::new();
    grant_both(&mut p);
    let (mut alone, mut carried) = (0, 0);
    for i in 0..50u64 {
        p.a.conn.post_recv(recv(1000 + i)).unwrap();
        p.b.conn.post_recv(recv(2000 + i)).unwrap();
        p.a.conn
            .post(p.now, write_imm(i, 8, 0x100, i as u32))
            .unwrap();
        p.doorbell(true);
        exchange(&mut p, &mut alone, &mut carried);
        assert_eq!(recv_completions(&p.b.events), i as usize + 1);
        // B answers at once, before its next round could send the ACK on its own.
        p.b.conn
            .post(p.now, write_imm(i, 8, 0x200, i as u32))
            .unwrap();
        p.doorbell(false);
        exchange(&mut p, &mut alone, &mut carried);
        assert_eq!(recv_completions(&p.a.events), i as usize + 1);
        p.now += 1_000;
    }
    // Every ping after the first carried the ACK of the previous answer; every answer the ACK of
    // its ping.
    assert_eq!(carried, 99, "{alone} alone");
    assert_eq!(alone, 0);
    let (a, b) = (*p.a.conn.counters(), *p.b.conn.counters());
    assert_eq!(a.acks_piggybacked, 49);
    assert_eq!(b.acks_piggyback_received, 49);
    assert_eq!(b.acks_piggybacked, 50);
    assert_eq!(a.acks_piggyback_received, 50);
    // The last answer is acknowledged alone, after the ACK delay; then everything completes.
    p.settle();
    assert_eq!(done(&p.a.events, CompletionKind::Write), 50);
    assert_eq!(done(&p.b.events, CompletionKind::Write), 50);
    assert!(p.a.conn.is_idle() && p.b.conn.is_idle());
    // One message at a time: every ping stayed on the first path (nothing in flight to spray),
    // and its RTT is measured through the carried ACKs (B held each ping 0 ns here).
    let used: Vec<_> = (0..4)
        .map(|i| p.a.conn.path_stats(PathId(i)).unwrap())
        .filter(|s| s.sent > 0)
        .collect();
    assert_eq!(used.len(), 1, "{used:?}");
    assert_eq!(used[0].sent, 50);
    assert!(used[0].rtt_min > 0 && used[0].rtt_min < 1_000, "{used:?}");
}

/// A packet that fills the MTU carries no ACK (it would grow past a full packet); a short one
/// does, and still carries its whole payload.
#[test]
fn only_packets_with_room_carry_an_ack() {
    let mut p = Pair::new();
    grant_both(&mut p);
    let mtu = p.a.conn.config().mtu;
    // Data from A to B so that B owes ACKs; B then answers with two Writes: one of a full packet,
    // one with room for the ACK.
    p.a.conn.post(p.now, write_imm(1, 64, 0x100, 1)).unwrap();
    p.b.conn.post_recv(recv(7)).unwrap();
    p.transmit();
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        p.deliver(to_b, port, &bytes).unwrap();
    }
    let mut full = write_imm(2, mtu, 0x1000, 2);
    full.op = WrOp::Write;
    p.b.conn.post(p.now, full).unwrap();
    p.doorbell(false);
    p.transmit();
    let sent = std::mem::take(&mut p.wire);
    let data: Vec<_> = sent
        .iter()
        .filter(|w| w.2[0] == Opcode::MrWrite.to_u8())
        .collect();
    assert_eq!(data.len(), 1);
    assert!(!kind(&data[0].2).1, "a full packet carried an ACK");
    assert!(
        data[0].2.len() <= BthRepr::LEN + 24 + 12 + mtu as usize + 4,
        "{} bytes",
        data[0].2.len()
    );
    // Its ACK went alone instead.
    assert!(sent.iter().any(|w| kind(&w.2).0));
    for (to_b, port, bytes) in sent {
        p.deliver(to_b, port, &bytes).unwrap();
    }
    // Now a short Write from B while an ACK is owed: it carries it, and the payload lands whole.
    p.a.conn.post(p.now, write_imm(3, 64, 0x100, 3)).unwrap();
    p.b.conn.post_recv(recv(8)).unwrap();
    p.transmit();
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        p.deliver(to_b, port, &bytes).unwrap();
    }
    let short_src = 0x8000usize;
    p.b.mem[short_src..short_src + 100].copy_from_slice(&[0xab; 100]);
    let mut short = write_imm(4, 100, 0x3000, 4);
    short.op = WrOp::Write;
    p.b.conn.post(p.now, short).unwrap();
    p.doorbell(false);
    p.transmit();
    let sent = std::mem::take(&mut p.wire);
    let carrying: Vec<_> = sent.iter().filter(|w| kind(&w.2).1).collect();
    assert_eq!(carrying.len(), 1);
    assert_eq!(
        carrying[0].2.len(),
        BthRepr::LEN + 24 + 12 + PiggyAck::LEN + 100 + 4
    );
    for (to_b, port, bytes) in sent {
        p.deliver(to_b, port, &bytes).unwrap();
    }
    assert!(p.a.mem[0x3000..0x3000 + 100].iter().all(|&b| b == 0xab));
    p.settle();
    assert!(p.a.conn.is_idle() && p.b.conn.is_idle());
}

/// A Read response the connection sends on its own (no doorbell) goes before the control
/// queue and carries the ACK of the Read request: one datagram each way.
#[test]
fn a_read_response_carries_the_ack_of_its_request() {
    let mut p = Pair::new();
    p.b.conn
        .register(Region {
            key: KEY,
            base: BASE,
            len: 1 << 16,
            access: Access::REMOTE_READ,
        })
        .unwrap();
    p.a.conn
        .register(Region {
            key: KEY,
            base: BASE,
            len: 1 << 16,
            access: Access::LOCAL_WRITE,
        })
        .unwrap();
    p.b.mem[0x100..0x140].copy_from_slice(&[0x5a; 64]);
    let (mut alone, mut carried) = (0, 0);
    for i in 0..10u64 {
        p.a.conn
            .post(
                p.now,
                WorkRequest {
                    id: i,
                    op: WrOp::Read,
                    stream: 0,
                    local_addr: BASE + 0x2000,
                    len: 64,
                    remote: RemoteAddr {
                        va: BASE + 0x100,
                        rkey: KEY,
                    },
                },
            )
            .unwrap();
        p.doorbell(true);
        exchange(&mut p, &mut alone, &mut carried);
        exchange(&mut p, &mut alone, &mut carried);
        assert_eq!(done(&p.a.events, CompletionKind::Read), i as usize + 1);
        p.now += 1_000;
    }
    assert_eq!(alone, 0, "{carried} carried");
    // Every response carried the ACK of its request; every request after the first, the ACK of
    // the previous response.
    assert_eq!(carried, 19);
    assert!(p.a.mem[0x2000..0x2040].iter().all(|&b| b == 0x5a));
}

/// The ACK a ping carries is taken after the ping's own work and after the answer a runner sends
/// at once: the completion it brings comes with the next `handle_datagram`, `poll_transmit` or
/// `handle_timeout` (which `poll_timeout` asks for at once), and the round trip it measures ends
/// when it arrived, not when it was taken.
#[test]
fn a_carried_ack_is_taken_after_the_answer_as_of_its_arrival() {
    let mut p = Pair::new();
    grant_both(&mut p);
    p.a.conn.post_recv(recv(100)).unwrap();
    p.b.conn.post_recv(recv(200)).unwrap();
    p.a.conn.post(p.now, write_imm(1, 8, 0x100, 1)).unwrap();
    p.doorbell(true);
    p.now += 3_000;
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        p.deliver(to_b, port, &bytes).unwrap();
    }
    while let Some(e) = p.b.conn.poll_event() {
        p.b.events.push(e);
    }
    assert_eq!(recv_completions(&p.b.events), 1);
    // B answers at once; the answer carries the ACK of the ping.
    p.b.conn.post(p.now, write_imm(2, 8, 0x200, 2)).unwrap();
    p.doorbell(false);
    let answer = std::mem::take(&mut p.wire);
    assert_eq!(answer.len(), 1);
    assert!(kind(&answer[0].2).1, "the answer carries the ACK");
    p.now += 4_000;
    let arrived = p.now;
    for (to_b, port, bytes) in answer {
        p.deliver(to_b, port, &bytes).unwrap();
    }
    while let Some(e) = p.a.conn.poll_event() {
        p.a.events.push(e);
    }
    // The answer is in; the ACK it carried is not taken yet.
    assert_eq!(recv_completions(&p.a.events), 1);
    assert_eq!(done(&p.a.events, CompletionKind::Write), 0);
    assert!(!p.a.conn.is_idle());
    assert_eq!(
        p.a.conn.poll_timeout(),
        Some(arrived),
        "asks to be taken at once"
    );
    // Taken half a millisecond later, it still measures the 7 us round trip.
    p.now += 500_000;
    p.a.conn.handle_timeout(p.now);
    while let Some(e) = p.a.conn.poll_event() {
        p.a.events.push(e);
    }
    assert_eq!(done(&p.a.events, CompletionKind::Write), 1);
    assert!(p.a.conn.is_idle());
    let path = (0..4)
        .map(|i| p.a.conn.path_stats(PathId(i)).unwrap())
        .find(|s| s.sent > 0)
        .unwrap();
    assert_eq!((path.acked, path.retransmitted), (1, 0));
    assert!(
        (6_000..8_000).contains(&path.rtt_min),
        "round trip {} ns",
        path.rtt_min
    );
    // B has the answer acknowledged alone, after its ACK delay; then both are idle.
    p.settle();
    assert_eq!(done(&p.b.events, CompletionKind::Write), 1);
    assert!(p.a.conn.is_idle() && p.b.conn.is_idle());
}

/// The ACK of one path rides on a data packet of another, which comes from that other path's
/// port: it is taken (checked against the port of the path that carried it), and it teaches no
/// port, so the stand-alone ACKs of its own path are taken later too.
#[test]
fn an_ack_carried_on_another_paths_packet_is_taken() {
    let mut p = Pair::new();
    grant_both(&mut p);
    let write = |id: u64, at: u64| WorkRequest {
        id,
        op: WrOp::Write,
        stream: 0,
        local_addr: BASE + 0x8000,
        len: 64,
        remote: RemoteAddr {
            va: BASE + at,
            rkey: KEY,
        },
    };
    // B's first Write leaves on its path 0, A's on A's path 0; each arrives.
    p.b.conn.post(p.now, write(1, 0)).unwrap();
    p.doorbell(false);
    p.a.conn.post(p.now, write(2, 0x100)).unwrap();
    p.doorbell(true);
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        p.deliver(to_b, port, &bytes).unwrap();
    }
    // B's second Write goes on B's path 1 and carries the ACK of A's path 0.
    p.b.conn.post(p.now, write(3, 0x200)).unwrap();
    p.doorbell(false);
    let wire = std::mem::take(&mut p.wire);
    assert_eq!(wire.len(), 1);
    let (to_b, port, bytes) = &wire[0];
    assert!(!to_b && kind(bytes).1, "a data packet carrying an ACK");
    assert_ne!(*port, p.b.conn.path_stats(PathId(0)).unwrap().src_port);
    p.deliver(false, *port, bytes).unwrap();
    p.a.conn.handle_timeout(p.now);
    let c = p.a.conn.counters();
    assert_eq!((c.drop_wrong_port, c.acked), (0, 1), "{c:?}");
    while let Some(e) = p.a.conn.poll_event() {
        p.a.events.push(e);
    }
    assert!(p.a.events.iter().any(|e| matches!(
        e,
        Event::Completion(c) if c.id == 2 && c.status == Status::Success
    )));
    // The rest settles with the stand-alone ACKs of every path taken.
    p.settle();
    assert_eq!(p.a.conn.counters().drop_wrong_port, 0);
    assert_eq!(p.b.conn.counters().drop_wrong_port, 0);
}
