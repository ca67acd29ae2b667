//! The event queue holds `Q` events, but more completions than that can be due at once:
//! receives on every stream, and messages acknowledged together. None is ever lost: those that
//! find the queue full wait in the connection (their messages and receives kept) and come, in
//! order within each stream, once the runner has drained the queue.

mod common;

use common::{Pair, BASE};
use transport_core::conn::{
    Completion, CompletionKind, Event, RecvRequest, RemoteAddr, Status, WorkRequest, WrOp,
};

/// The test pair's event queue (`Q` of `common::Pair`).
const Q: usize = 16;
/// Its streams.
const S: u16 = 2;
const LEN: u32 = 64;

/// Receive `i` of `stream`: id `stream * 1000 + i`, its own 64 bytes at 512 KiB and above.
fn recv(stream: u16, i: u64) -> RecvRequest {
    RecvRequest {
        id: u64::from(stream) * 1000 + i,
        stream,
        addr: BASE + (1 << 19) + (u64::from(stream) * 1000 + i) * u64::from(LEN),
        len: LEN,
    }
}

/// Send `n`: id `n`, stream `n % S`, 64 bytes from `n * 64`.
fn send(n: u64) -> WorkRequest {
    WorkRequest {
        id: n,
        op: WrOp::Send,
        stream: (n % u64::from(S)) as u16,
        local_addr: BASE + n * u64::from(LEN),
        len: LEN,
        remote: RemoteAddr::default(),
    }
}

/// Runs the wire until nothing moves, handing no event over on either side.
fn run_undrained(p: &mut Pair) {
    for _ in 0..10_000 {
        p.transmit();
        if p.wire.is_empty() {
            for side in [&mut p.a, &mut p.b] {
                if side.conn.poll_timeout().is_some_and(|t| t <= p.now) {
                    side.conn.handle_timeout(p.now);
                }
            }
            p.now += 1_000;
            p.transmit();
            if p.wire.is_empty() {
                return;
            }
        }
        for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
            let _ = p.deliver(to_b, port, &bytes);
        }
        p.now += 1_000;
    }
    panic!("the wire never went quiet");
}

/// Every completion a side has waiting.
fn drain(conn: &mut common::Conn) -> Vec<Completion> {
    let mut got = Vec::new();
    while let Some(e) = conn.poll_event() {
        match e {
            Event::Completion(c) => got.push(c),
            other => panic!("unexpected {other:?}"),
        }
    }
    got
}

fn ids(got: &[Completion], kind: CompletionKind, stream: u16) -> Vec<u64> {
    got.iter()
        .filter(|c| c.kind == kind && c.stream == stream)
        .map(|c| c.id)
        .collect()
}

#[test]
fn receives_beyond_the_event_queue_complete_once_it_is_drained() {
    let mut p = Pair::new();
    for (i, b) in p.a.mem.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let per_stream = Q as u64;
    for stream in 0..S {
        for i in 0..per_stream {
            p.b.conn.post_recv(recv(stream, i)).unwrap();
        }
    }
    // A sends one message per receive, Q at a time (its own ring's size), draining its own
    // events; B hands over none, so twice the queue's worth of receives complete at B.
    let total = per_stream * u64::from(S);
    let mut posted = 0;
    let mut a_done = 0;
    while a_done < total {
        while posted < total && p.a.conn.post(p.now, send(posted)).is_ok() {
            posted += 1;
        }
        run_undrained(&mut p);
        a_done += drain(&mut p.a.conn).len() as u64;
    }
    let got = drain(&mut p.b.conn);
    assert_eq!(got.len() as u64, total, "every receive completes once");
    for stream in 0..S {
        let want: Vec<u64> = (0..per_stream).map(|i| recv(stream, i).id).collect();
        assert_eq!(ids(&got, CompletionKind::Recv, stream), want, "in order");
    }
    for c in &got {
        assert_eq!((c.status, c.byte_len), (Status::Success, LEN));
        // Receive `i` of `stream` holds message `i * S + stream`.
        let (stream, i) = (u64::from(c.stream), c.id % 1000);
        let n = (i * u64::from(S) + stream) as usize;
        let at = (recv(c.stream, i).addr - BASE) as usize;
        let len = LEN as usize;
        assert_eq!(p.b.mem[at..at + len], p.a.mem[n * len..(n + 1) * len]);
    }
    assert_eq!(p.b.conn.events_lost(), 0);
    // The receive ring has room again: a new receive posts.
    p.b.conn.post_recv(recv(0, per_stream)).unwrap();
}

#[test]
fn sends_and_receives_due_together_beyond_the_queue_all_complete() {
    let mut p = Pair::new();
    // Each side: Q receives on each stream, then Q Sends (its whole message ring), with no
    // event handed over until both sides are quiet: 2 Q completions due on each side (its Q
    // Sends, and Q receives of the peer's), twice.
    for side in [&mut p.a, &mut p.b] {
        for stream in 0..S {
            for i in 0..Q as u64 {
                side.conn.post_recv(recv(stream, i)).unwrap();
            }
        }
    }
    for round in 0..2u64 {
        for side in [&mut p.a, &mut p.b] {
            for n in round * Q as u64..(round + 1) * Q as u64 {
                side.conn.post(p.now, send(n)).unwrap();
            }
        }
        run_undrained(&mut p);
        for side in [&mut p.a, &mut p.b] {
            let got = drain(&mut side.conn);
            assert_eq!(got.len(), 2 * Q, "round {round}: Q Sends and Q receives");
            let first = round * Q as u64;
            for stream in 0..S {
                let sends: Vec<u64> = (first..first + Q as u64)
                    .filter(|n| n % u64::from(S) == u64::from(stream))
                    .collect();
                assert_eq!(ids(&got, CompletionKind::Send, stream), sends);
                let half = Q as u64 / u64::from(S);
                let recvs: Vec<u64> = (round * half..(round + 1) * half)
                    .map(|i| recv(stream, i).id)
                    .collect();
                assert_eq!(ids(&got, CompletionKind::Recv, stream), recvs);
            }
            assert!(side.conn.is_idle());
            assert_eq!(side.conn.events_lost(), 0);
        }
    }
}

#[test]
fn three_queues_worth_come_in_order_through_a_partial_drain() {
    let mut p = Pair::new();
    for (i, b) in p.b.mem.iter_mut().enumerate() {
        *b = (i * 5 + 1) as u8;
    }
    // A: Q receives on each stream and Q Sends of its own; B sends 2 Q messages to A, handing
    // its own events over; A hands over five events halfway and the rest at the end: 3 Q
    // completions due at A, more than the queue holds even after the first refill.
    for stream in 0..S {
        for i in 0..Q as u64 {
            p.a.conn.post_recv(recv(stream, i)).unwrap();
        }
    }
    for n in 0..Q as u64 {
        p.a.conn.post(p.now, send(n)).unwrap();
    }
    // B's receives for A's Sends.
    for stream in 0..S {
        for i in 0..Q as u64 / u64::from(S) {
            p.b.conn.post_recv(recv(stream, i)).unwrap();
        }
    }
    let total = 2 * Q as u64;
    let (mut posted, mut b_done) = (0u64, 0u64);
    let mut got = Vec::new();
    let mut halfway = false;
    while b_done < total {
        while posted < total && p.b.conn.post(p.now, send(posted)).is_ok() {
            posted += 1;
        }
        run_undrained(&mut p);
        b_done += drain(&mut p.b.conn)
            .iter()
            .filter(|c| c.kind == CompletionKind::Send)
            .count() as u64;
        if !halfway && b_done >= total / 2 {
            halfway = true;
            for _ in 0..5 {
                match p.a.conn.poll_event() {
                    Some(Event::Completion(c)) => got.push(c),
                    other => panic!("expected a completion, got {other:?}"),
                }
            }
        }
    }
    assert!(halfway);
    got.extend(drain(&mut p.a.conn));
    assert_eq!(got.len(), 3 * Q, "Q Sends and 2 Q receives, each once");
    for stream in 0..S {
        let sends: Vec<u64> = (0..Q as u64)
            .filter(|n| n % u64::from(S) == u64::from(stream))
            .collect();
        assert_eq!(ids(&got, CompletionKind::Send, stream), sends);
        let recvs: Vec<u64> = (0..Q as u64).map(|i| recv(stream, i).id).collect();
        assert_eq!(ids(&got, CompletionKind::Recv, stream), recvs);
    }
    for c in got.iter().filter(|c| c.kind == CompletionKind::Recv) {
        let (stream, i) = (u64::from(c.stream), c.id % 1000);
        let n = (i * u64::from(S) + stream) as usize;
        let at = (recv(c.stream, i).addr - BASE) as usize;
        let len = LEN as usize;
        assert_eq!(p.a.mem[at..at + len], p.b.mem[n * len..(n + 1) * len]);
    }
    assert!(p.a.conn.is_idle());
    assert_eq!(p.a.conn.events_lost(), 0);
}
