//! `Config::max_rd_atomic`, the initiator depth: no more Read and atomic requests outstanding
//! than it allows; one beyond waits for a response, and holds the messages posted after it on
//! its stream, while other streams go on.

mod common;

use common::{config, Pair, BASE};
use transport_core::conn::{
    Access, CompletionKind, Config, Event, Region, RemoteAddr, Status, WorkRequest, WrOp,
};
use transport_core::wire::{BthRepr, Opcode};

const KEY: u32 = 0x51;

/// A pair whose A may have `depth` requests outstanding; B grants Reads, atomics and Writes on
/// all of its memory, A lets responses land in its own.
fn pair(depth: u8) -> Pair {
    let with = |mut c: Config| {
        c.max_rd_atomic = depth;
        c
    };
    let mut p = Pair::with_configs(with(config(1, 2)), with(config(2, 1)));
    let len = p.b.mem.len() as u64;
    p.b.conn
        .register(Region {
            key: KEY,
            base: BASE,
            len,
            access: Access::REMOTE_READ
                .union(Access::REMOTE_ATOMIC)
                .union(Access::REMOTE_WRITE),
        })
        .unwrap();
    p.a.conn
        .register(Region {
            key: KEY,
            base: BASE,
            len,
            access: Access::LOCAL_WRITE,
        })
        .unwrap();
    p
}

fn wr(id: u64, op: WrOp, stream: u16, at: u64, len: u32) -> WorkRequest {
    WorkRequest {
        id,
        op,
        stream,
        local_addr: BASE + at,
        len,
        remote: RemoteAddr {
            va: BASE + at,
            rkey: KEY,
        },
    }
}

/// The opcodes A put on the wire since the last call.
fn sent_by_a(p: &Pair) -> Vec<Opcode> {
    p.wire
        .iter()
        .filter(|(to_b, _, _)| *to_b)
        .map(|(_, _, d)| BthRepr::parse(d).unwrap().0.opcode)
        .collect()
}

fn is_request(o: &Opcode) -> bool {
    matches!(
        o,
        Opcode::MrReadRequest | Opcode::MrFetchAdd | Opcode::MrCompareSwap
    )
}

/// Completions A reported, by id.
fn completed(p: &Pair) -> Vec<(u64, CompletionKind, Status)> {
    p.a.events
        .iter()
        .filter_map(|e| match e {
            Event::Completion(c) => Some((c.id, c.kind, c.status)),
            _ => None,
        })
        .collect()
}

/// Runs the pair for a while (it is quiet long before the end), checking after every round
/// that A never had more than `depth` requests outstanding; returns the opcodes A sent in the
/// first round and the requests it sent in all.
fn run(p: &mut Pair, depth: usize) -> (Vec<Opcode>, usize) {
    let (mut first, mut sent) = (None, 0);
    for _ in 0..2_000 {
        p.transmit();
        let ops = sent_by_a(p);
        sent += ops.iter().filter(|o| is_request(o)).count();
        first.get_or_insert(ops);
        let answered = completed(p)
            .iter()
            .filter(|(_, k, _)| matches!(k, CompletionKind::Read | CompletionKind::Atomic))
            .count();
        assert!(sent <= answered + depth, "{sent} sent, {answered} answered");
        p.deliver_and_tick(&mut |_, _| false);
    }
    (first.unwrap_or_default(), sent)
}

#[test]
fn reads_beyond_the_depth_wait_for_a_response() {
    for depth in [1u8, 2, 3] {
        let mut p = pair(depth);
        for (i, b) in p.b.mem[..8 * 1024].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(29);
        }
        for i in 0..8u64 {
            p.a.conn
                .post(p.now, wr(i, WrOp::Read, 0, i * 1024, 1024))
                .unwrap();
        }
        let (first, sent) = run(&mut p, usize::from(depth));
        // The first flight: exactly `depth` Read requests; none sent twice on a clean wire.
        assert_eq!(
            first.iter().filter(|o| is_request(o)).count(),
            usize::from(depth),
            "{first:?}"
        );
        assert_eq!(sent, 8);
        let done = completed(&p);
        assert_eq!(done.len(), 8, "{done:?}");
        // In order, every one whole.
        let ids: Vec<u64> = done.iter().map(|c| c.0).collect();
        assert_eq!(ids, (0..8).collect::<Vec<_>>());
        assert!(done.iter().all(|c| c.2 == Status::Success), "{done:?}");
        assert_eq!(p.a.mem[..8 * 1024], p.b.mem[..8 * 1024]);
    }
}

#[test]
fn atomics_count_with_reads() {
    let mut p = pair(1);
    p.b.mem[0x800..0x808].copy_from_slice(&5u64.to_le_bytes());
    p.a.conn
        .post(p.now, wr(1, WrOp::FetchAdd(3), 0, 0x800, 8))
        .unwrap();
    p.a.conn
        .post(p.now, wr(2, WrOp::Read, 0, 0x1000, 512))
        .unwrap();
    p.a.conn
        .post(
            p.now,
            wr(
                3,
                WrOp::CompareSwap {
                    compare: 8,
                    swap: 100,
                },
                0,
                0x800,
                8,
            ),
        )
        .unwrap();
    let (first, sent) = run(&mut p, 1);
    assert_eq!(first, vec![Opcode::MrFetchAdd]);
    assert_eq!(sent, 3);
    let done = completed(&p);
    assert_eq!(
        done.iter().map(|c| (c.0, c.2)).collect::<Vec<_>>(),
        vec![
            (1, Status::Success),
            (2, Status::Success),
            (3, Status::Success)
        ]
    );
    // 5 + 3 = 8, then swapped for 100.
    assert_eq!(p.b.mem[0x800..0x808], 100u64.to_le_bytes());
}

/// A Write posted behind a held Read on its stream waits with it; a Write on another stream
/// goes at once.
#[test]
fn a_held_request_holds_its_stream_only() {
    let mut p = pair(1);
    for (id, op, stream, at) in [
        (1, WrOp::Read, 0, 0x0),
        (2, WrOp::Read, 0, 0x100),
        (3, WrOp::Write, 0, 0x2000),
        (4, WrOp::Write, 1, 0x3000),
    ] {
        p.a.conn.post(p.now, wr(id, op, stream, at, 256)).unwrap();
    }
    p.transmit();
    let first = sent_by_a(&p);
    assert_eq!(
        first.iter().filter(|o| is_request(o)).count(),
        1,
        "{first:?}"
    );
    // One Write went: stream 1's.
    let writes: Vec<&Opcode> = first.iter().filter(|o| !is_request(o)).collect();
    assert_eq!(writes, vec![&Opcode::MrWrite], "{first:?}");
    p.deliver_and_tick(&mut |_, _| false);
    // Stream 1's Write has landed; stream 0's has not.
    assert_eq!(p.b.mem[0x3000..0x3100], p.a.mem[0x3000..0x3100]);
    assert_ne!(p.b.mem[0x2000..0x2100], p.a.mem[0x2000..0x2100]);
    // The second Read goes once the first is answered, and stream 0's Write after it.
    let mut order = Vec::new();
    for _ in 0..200 {
        p.transmit();
        order.extend(sent_by_a(&p).into_iter().filter(|o| *o != Opcode::MrAck));
        p.deliver_and_tick(&mut |_, _| false);
    }
    assert_eq!(
        order,
        vec![Opcode::MrReadRequest, Opcode::MrWrite],
        "{order:?}"
    );
    assert_eq!(p.a.conn.counters().requests_waited, 1);
    let ids: Vec<u64> = completed(&p).iter().map(|c| c.0).collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert_eq!(p.b.mem[0x2000..0x2100], p.a.mem[0x2000..0x2100]);
}

/// While an end's own requests wait for its depth, the responses it owes the peer still go.
#[test]
fn responses_go_while_own_requests_wait() {
    let mut p = pair(1);
    // B reads from A too: A grants it, B lets the data land.
    let len = p.a.mem.len() as u64;
    p.a.conn
        .register(Region {
            key: KEY + 1,
            base: BASE,
            len,
            access: Access::REMOTE_READ,
        })
        .unwrap();
    p.b.conn
        .register(Region {
            key: KEY + 1,
            base: BASE,
            len,
            access: Access::LOCAL_WRITE,
        })
        .unwrap();
    for i in 0..4u64 {
        p.a.conn
            .post(p.now, wr(i, WrOp::Read, 0, i * 0x400, 0x400))
            .unwrap();
        let mut r = wr(10 + i, WrOp::Read, 0, 0x4000 + i * 0x400, 0x400);
        r.remote.rkey = KEY + 1;
        p.b.conn.post(p.now, r).unwrap();
    }
    let (mut a_requests, mut a_responses) = (0, 0);
    for _ in 0..2_000 {
        p.transmit();
        for o in sent_by_a(&p) {
            match o {
                Opcode::MrReadRequest => a_requests += 1,
                Opcode::MrReadResponse => a_responses += 1,
                _ => {}
            }
        }
        p.deliver_and_tick(&mut |_, _| false);
    }
    assert_eq!(a_requests, 4);
    // One response packet per 1 KiB Read of B's: all four answered.
    assert_eq!(a_responses, 4);
    assert_eq!(completed(&p).len(), 4);
    let b_done =
        p.b.events
            .iter()
            .filter(|e| matches!(e, Event::Completion(c) if c.status == Status::Success))
            .count();
    assert_eq!(b_done, 4);
    assert_eq!(p.a.mem[..0x1000], p.b.mem[..0x1000]);
    assert_eq!(p.a.mem[0x4000..0x5000], p.b.mem[0x4000..0x5000]);
}

/// A refused request frees its place: the next one goes and completes.
#[test]
fn a_refused_read_frees_its_place() {
    let mut p = pair(1);
    let mut bad = wr(1, WrOp::Read, 0, 0, 256);
    bad.remote.rkey = KEY + 7;
    p.a.conn.post(p.now, bad).unwrap();
    p.a.conn
        .post(p.now, wr(2, WrOp::Read, 1, 0x800, 256))
        .unwrap();
    let (_, sent) = run(&mut p, 1);
    assert_eq!(sent, 2);
    let done = completed(&p);
    assert_eq!(done.len(), 2, "{done:?}");
    assert!(matches!(done[0].2, Status::Refused(_)), "{done:?}");
    assert_eq!((done[1].0, done[1].2), (2, Status::Success));
    assert_eq!(p.a.conn.counters().requests_waited, 1);
}
