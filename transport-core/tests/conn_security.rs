//! What a peer may touch: only memory it was granted (key, bounds, rights), only on its own
//! connection (QPN, P_Key, window). Violations become NACKs and counters, never writes, and the
//! connection goes on. Floods stay bounded.

mod common;

use common::{Pair, BASE, MEM};
use transport_core::conn::PathId;
use transport_core::conn::{
    compute_icrc, Access, CompletionKind, Delivery, DropReason, Event, RecvRequest, Region,
    RemoteAddr, Status, WorkRequest, WrOp,
};
use transport_core::time::Instant;
use transport_core::wire::metaroce::{MrDataRepr, MrRemoteRepr, NackReason};
use transport_core::wire::{BthRepr, Extensions, Opcode, Psn, Qpn};

const KEY: u32 = 0x77;

fn grant(p: &mut Pair, access: Access, base: u64, len: u64) {
    p.b.conn
        .register(Region {
            key: KEY,
            base,
            len,
            access,
        })
        .unwrap();
}

fn write(id: u64, local: u64, len: u32, va: u64, rkey: u32) -> WorkRequest {
    WorkRequest {
        id,
        op: WrOp::Write,
        stream: 0,
        local_addr: local,
        len,
        remote: RemoteAddr { va, rkey },
    }
}

/// Each completion's id and status, in order.
fn outcomes(events: &[Event]) -> Vec<(u64, Status)> {
    completions(events)
        .iter()
        .map(|c| (c.id, c.status))
        .collect()
}

fn completions(events: &[Event]) -> Vec<transport_core::conn::Completion> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Completion(c) => Some(*c),
            _ => None,
        })
        .collect()
}

#[test]
fn a_granted_write_lands_and_completes() {
    let mut p = Pair::new();
    grant(&mut p, Access::REMOTE_WRITE, BASE, MEM as u64);
    p.a.conn
        .post(Instant::ZERO, write(1, BASE, 5000, BASE + 100, KEY))
        .unwrap();
    p.settle();
    assert!(p.b.mem[100..5100] == p.a.mem[..5000]);
    let c = completions(&p.a.events);
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].id, c[0].status, c[0].kind),
        (1, Status::Success, CompletionKind::Write)
    );
}

#[test]
fn wrong_key_bounds_overflow_and_rights_are_refused_and_nothing_is_written() {
    for (name, va, rkey, len, access, reason) in [
        (
            "unknown rkey",
            BASE,
            KEY + 1,
            100,
            Access::REMOTE_WRITE,
            NackReason::InvalidRkey,
        ),
        (
            "past the end",
            BASE + MEM as u64 - 50,
            KEY,
            100,
            Access::REMOTE_WRITE,
            NackReason::OutOfBounds,
        ),
        (
            "below the start",
            BASE - 1,
            KEY,
            100,
            Access::REMOTE_WRITE,
            NackReason::OutOfBounds,
        ),
        (
            "address overflow",
            u64::MAX - 10,
            KEY,
            100,
            Access::REMOTE_WRITE,
            NackReason::OutOfBounds,
        ),
        (
            "read-only region",
            BASE,
            KEY,
            100,
            Access::REMOTE_READ,
            NackReason::AccessDenied,
        ),
    ] {
        let mut p = Pair::new();
        grant(&mut p, access, BASE, MEM as u64);
        let before = p.b.mem.clone();
        p.a.conn
            .post(Instant::ZERO, write(1, BASE, len, va, rkey))
            .unwrap();
        // The connection goes on: a good write after the bad one.
        grant_more(&mut p);
        p.a.conn
            .post(Instant::ZERO, write(2, BASE, 64, BASE2, KEY2))
            .unwrap();
        p.settle();
        let c = completions(&p.a.events);
        assert_eq!(c.len(), 2, "{name}: {c:?}");
        assert_eq!(c[0].status, Status::Refused(reason), "{name}");
        assert_eq!(c[1].status, Status::Success, "{name}");
        assert_eq!(p.b.conn.counters().access_violations, 1, "{name}");
        assert_eq!(p.b.conn.counters().nacks_sent, 1, "{name}");
        // Only the good write touched memory.
        let changed: Vec<usize> = (0..MEM).filter(|&i| p.b.mem[i] != before[i]).collect();
        assert!(
            changed
                .iter()
                .all(|&i| (BASE2 - BASE) as usize <= i && i < (BASE2 - BASE) as usize + 64),
            "{name}: wrote outside the grant"
        );
    }
}

const KEY2: u32 = 0x99;
const BASE2: u64 = BASE + 0x8_0000;

fn grant_more(p: &mut Pair) {
    p.b.conn
        .register(Region {
            key: KEY2,
            base: BASE2,
            len: 4096,
            access: Access::REMOTE_WRITE,
        })
        .unwrap();
}

/// A forged data packet: a Write of 8 bytes at `va` with `rkey`, from path 0.
fn forged(qpn: u32, pkey: u16, psn: u32, va: u64, rkey: u32) -> (u16, Vec<u8>) {
    forged_with(qpn, pkey, psn, va, rkey, false, &[])
}

/// The same, with flag A set as `ack` says and `before` between the headers and the payload.
fn forged_with(
    qpn: u32,
    pkey: u16,
    psn: u32,
    va: u64,
    rkey: u32,
    ack: bool,
    before: &[u8],
) -> (u16, Vec<u8>) {
    let cfg = common::config(1, 2);
    let port = transport_core::conn::entropy_port(cfg.entropy_seed, PathId(0), 0);
    let bth = BthRepr {
        opcode: Opcode::MrWrite,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        tver: 0,
        pkey,
        fecn: false,
        becn: false,
        dest_qp: Qpn::new(qpn),
        ack_req: false,
        psn: Psn::new(psn),
    };
    let data = MrDataRepr {
        ack,
        path_id: 0,
        path_seq: 0,
        msg_len: 8,
        ..Default::default()
    };
    let ext = Extensions::MrRemote(data, MrRemoteRepr { va, rkey });
    let mut buf = vec![0u8; 128 + before.len()];
    let rest = bth.emit(&mut buf).unwrap();
    ext.emit(bth.opcode.layout(), rest).unwrap();
    let mut n = 12 + ext.len();
    buf[n..n + before.len()].copy_from_slice(before);
    n += before.len();
    buf[n..n + 8].copy_from_slice(&[0xee; 8]);
    let icrc = compute_icrc(cfg.local_ip, cfg.remote_ip, port, 4791, &buf[..n + 8]);
    buf[n + 8..n + 12].copy_from_slice(&icrc.to_le_bytes());
    buf.truncate(n + 12);
    (port, buf)
}

#[test]
fn forged_qpn_pkey_window_and_corruption_are_dropped_and_counted() {
    let mut p = Pair::new();
    grant(&mut p, Access::REMOTE_WRITE, BASE, MEM as u64);
    let before = p.b.mem.clone();
    let (port, bytes) = forged(3, 0xffff, 0, BASE, KEY);
    assert_eq!(p.deliver(true, port, &bytes), Err(DropReason::WrongQp));
    let (port, bytes) = forged(2, 0x1234, 0, BASE, KEY);
    assert_eq!(p.deliver(true, port, &bytes), Err(DropReason::WrongPkey));
    let (port, bytes) = forged(2, 0xffff, 100_000, BASE, KEY);
    assert_eq!(p.deliver(true, port, &bytes), Err(DropReason::OutOfWindow));
    let (port, mut bytes) = forged(2, 0xffff, 0, BASE, KEY);
    bytes[20] ^= 1;
    assert_eq!(p.deliver(true, port, &bytes), Err(DropReason::BadIcrc));
    assert_eq!(
        p.deliver(true, port, &bytes[..10]),
        Err(DropReason::Malformed)
    );
    assert!(p.b.mem == before, "a dropped packet wrote memory");
    let c = p.b.conn.counters();
    assert_eq!(
        (
            c.drop_wrong_qp,
            c.drop_wrong_pkey,
            c.drop_out_of_window,
            c.drop_bad_icrc,
            c.drop_malformed
        ),
        (1, 1, 1, 1, 1)
    );
    // A well-formed packet from the right peer is placed, once.
    let (port, bytes) = forged(2, 0xffff, 0, BASE + 8, KEY);
    assert!(
        matches!(p.deliver(true, port, &bytes), Ok(Delivery::Place { addr, len: 8, .. }) if addr == BASE + 8)
    );
    assert_eq!(p.deliver(true, port, &bytes), Err(DropReason::Duplicate));
    assert_eq!(p.b.conn.counters().duplicates, 1);
}

#[test]
fn a_flood_from_an_unknown_peer_leaves_the_real_peer_served_and_memory_bounded() {
    let mut p = Pair::new();
    grant(&mut p, Access::REMOTE_WRITE, BASE, MEM as u64);
    for i in 0..100_000u32 {
        // Unknown peers: other connection numbers, or this one with a foreign partition key.
        let (qpn, pkey) = if i % 2 == 0 {
            (3 + (i % 5), 0xffff)
        } else {
            (2, 0x1000 + (i % 0x1000) as u16)
        };
        let (port, bytes) = forged(qpn, pkey, i * 7919, BASE, KEY);
        let _ = p.deliver(true, port, &bytes);
        let mut junk = bytes.clone();
        let at = (i as usize) % junk.len();
        junk[at] ^= 0x40;
        let _ = p.deliver(true, port.wrapping_add(1), &junk);
    }
    // NACKs are bounded by their queue; nothing grew.
    p.transmit();
    assert!(
        p.wire.len() <= 16 + 4,
        "{} datagrams queued after the flood",
        p.wire.len()
    );
    p.wire.clear();
    // The real peer is still served.
    let mut q = Pair::new();
    std::mem::swap(&mut q.b, &mut p.b);
    q.a.conn
        .post(Instant::ZERO, write(1, BASE, 3000, BASE + 0x1000, KEY))
        .unwrap();
    q.settle();
    let c = completions(&q.a.events);
    assert_eq!(c.last().map(|c| c.status), Some(Status::Success), "{c:?}");
    assert!(
        q.b.mem[0x1000..0x1000 + 3000] == q.a.mem[..3000],
        "the real peer's write did not land"
    );
    let c = q.b.conn.counters();
    assert!(
        c.drop_wrong_qp + c.drop_wrong_pkey >= 100_000
            && c.drop_malformed + c.drop_bad_icrc >= 90_000,
        "{c:?}"
    );
}

#[test]
fn sends_match_receives_by_msn_and_overlong_sends_are_refused() {
    let mut p = Pair::new();
    p.b.conn
        .post_recv(RecvRequest {
            id: 10,
            stream: 1,
            addr: BASE,
            len: 4000,
        })
        .unwrap();
    p.b.conn
        .post_recv(RecvRequest {
            id: 11,
            stream: 1,
            addr: BASE + 8192,
            len: 100,
        })
        .unwrap();
    p.b.conn
        .post_recv(RecvRequest {
            id: 12,
            stream: 1,
            addr: BASE + 16384,
            len: 100,
        })
        .unwrap();
    let send = |id, len, op| WorkRequest {
        id,
        op,
        stream: 1,
        local_addr: BASE,
        len,
        remote: RemoteAddr::default(),
    };
    p.a.conn
        .post(Instant::ZERO, send(1, 3000, WrOp::SendWithImm(0xabcd)))
        .unwrap();
    p.a.conn
        .post(Instant::ZERO, send(2, 200, WrOp::Send))
        .unwrap(); // too long for receive 11
    p.a.conn
        .post(Instant::ZERO, send(3, 50, WrOp::Send))
        .unwrap();
    let before = p.b.mem.clone();
    p.settle();
    assert!(p.b.mem[..3000] == p.a.mem[..3000]);
    assert!(
        p.b.mem[8192..8292] == before[8192..8292],
        "the refused send wrote something"
    );
    assert!(p.b.mem[16384..16434] == p.a.mem[..50]);
    let ca = completions(&p.a.events);
    assert_eq!(
        ca.iter().map(|c| c.status).collect::<Vec<_>>(),
        [
            Status::Success,
            Status::Refused(NackReason::MessageTooLong),
            Status::Success
        ]
    );
    let cb = completions(&p.b.events);
    assert_eq!(cb[0].id, 10);
    assert_eq!(cb[0].imm, Some(0xabcd));
    assert_eq!(cb[0].byte_len, 3000);
    // The refused Send consumed receive 11, which completes with the refusal; receive 12, which
    // holds Send 3, completes after it (before, neither ever completed).
    assert_eq!(
        cb.iter()
            .map(|c| (c.id, c.status, c.byte_len))
            .collect::<Vec<_>>(),
        [
            (10, Status::Success, 3000),
            (11, Status::Refused(NackReason::MessageTooLong), 0),
            (12, Status::Success, 50),
        ]
    );
    // The stream goes on: a fourth Send lands in a fourth receive.
    p.b.conn
        .post_recv(RecvRequest {
            id: 13,
            stream: 1,
            addr: BASE + 24576,
            len: 100,
        })
        .unwrap();
    p.a.conn
        .post(Instant::ZERO, send(4, 60, WrOp::Send))
        .unwrap();
    p.settle();
    let cb = completions(&p.b.events);
    assert_eq!(
        (cb[3].id, cb[3].status, cb[3].byte_len),
        (13, Status::Success, 60)
    );
    assert!(p.b.mem[24576..24636] == p.a.mem[..60]);
}

#[test]
fn reads_need_read_rights() {
    let mut p = Pair::new();
    grant(&mut p, Access::REMOTE_READ, BASE, 4096);
    let read = |id, va| WorkRequest {
        id,
        op: WrOp::Read,
        stream: 0,
        local_addr: BASE + 0x4_0000,
        len: 2000,
        remote: RemoteAddr { va, rkey: KEY },
    };
    p.a.conn.post(Instant::ZERO, read(1, BASE + 10)).unwrap();
    p.a.conn.post(Instant::ZERO, read(2, BASE + 3000)).unwrap(); // runs past the region
    p.settle();
    assert!(p.a.mem[0x4_0000..0x4_0000 + 2000] == p.b.mem[10..2010]);
    let c = completions(&p.a.events);
    assert_eq!(
        c.iter().map(|c| c.status).collect::<Vec<_>>(),
        [Status::Success, Status::Refused(NackReason::OutOfBounds)]
    );
}

#[test]
fn atomics_compare_swap_and_fetch_add_with_rights() {
    let mut p = Pair::new();
    let target = BASE + 0x100;
    p.b.mem[0x100..0x108].copy_from_slice(&41u64.to_ne_bytes());
    grant(&mut p, Access::REMOTE_ATOMIC, BASE, 0x1000);
    p.b.conn
        .register(Region {
            key: KEY2,
            base: BASE2,
            len: 0x1000,
            access: Access::REMOTE_WRITE,
        })
        .unwrap();
    let atomic = |id, op, va, rkey| WorkRequest {
        id,
        op,
        stream: 0,
        local_addr: BASE + 0x8000 + 8 * id,
        len: 8,
        remote: RemoteAddr { va, rkey },
    };
    let cas = |compare, swap| WrOp::CompareSwap { compare, swap };
    for (id, op, va, rkey) in [
        (1, WrOp::FetchAdd(1), target, KEY),
        (2, cas(42, 7), target, KEY),
        (3, cas(42, 9), target, KEY),
        (4, WrOp::FetchAdd(1), BASE2, KEY2), // no atomic rights
    ] {
        p.a.conn
            .post(Instant::ZERO, atomic(id, op, va, rkey))
            .unwrap();
    }
    assert_eq!(
        p.a.conn
            .post(Instant::ZERO, atomic(5, WrOp::FetchAdd(1), target + 4, KEY)),
        Err(transport_core::conn::PostError::Misaligned)
    );
    p.settle();
    let value = |mem: &[u8], at: usize| u64::from_ne_bytes(mem[at..at + 8].try_into().unwrap());
    assert_eq!(
        value(&p.b.mem, 0x100),
        7,
        "41 + 1 = 42, swapped for 7, then no match"
    );
    assert_eq!(value(&p.a.mem, 0x8008), 41);
    assert_eq!(value(&p.a.mem, 0x8010), 42);
    assert_eq!(value(&p.a.mem, 0x8018), 7);
    let c = completions(&p.a.events);
    assert_eq!(
        c.iter()
            .map(|c| (c.id, c.status, c.kind))
            .collect::<Vec<_>>(),
        [
            (1, Status::Success, CompletionKind::Atomic),
            (2, Status::Success, CompletionKind::Atomic),
            (3, Status::Success, CompletionKind::Atomic),
            (
                4,
                Status::Refused(NackReason::AccessDenied),
                CompletionKind::Atomic
            ),
        ]
    );
    assert_eq!(p.b.conn.counters().access_violations, 1);
}

/// Atomics execute in the order they were posted even when the second overtakes the first on
/// another path: the early one is answered receiver-not-ready and comes again.
#[test]
fn an_atomic_that_overtakes_an_earlier_one_waits_for_it() {
    let mut p = Pair::new();
    p.b.mem[0x100..0x108].copy_from_slice(&40u64.to_ne_bytes());
    grant(&mut p, Access::REMOTE_ATOMIC, BASE, 0x1000);
    for (id, op) in [
        (1, WrOp::FetchAdd(2)),
        (
            2,
            WrOp::CompareSwap {
                compare: 42,
                swap: 7,
            },
        ),
    ] {
        p.a.conn
            .post(
                Instant::ZERO,
                WorkRequest {
                    id,
                    op,
                    stream: 0,
                    local_addr: BASE + 0x8000 + 8 * id,
                    len: 8,
                    remote: RemoteAddr {
                        va: BASE + 0x100,
                        rkey: KEY,
                    },
                },
            )
            .unwrap();
    }
    p.transmit();
    let wire = std::mem::take(&mut p.wire);
    let to_b: Vec<_> = wire.iter().filter(|w| w.0).cloned().collect();
    assert_eq!(to_b.len(), 2, "one packet per atomic");
    // The compare-and-swap arrives first: it must not run before the fetch-and-add.
    let early = p.deliver(true, to_b[1].1, &to_b[1].2);
    assert!(
        matches!(early, Ok(transport_core::conn::Delivery::Nothing)),
        "{early:?}"
    );
    let value = |mem: &[u8], at: usize| u64::from_ne_bytes(mem[at..at + 8].try_into().unwrap());
    assert_eq!(value(&p.b.mem, 0x100), 40, "nothing executed yet");
    let _ = p.deliver(true, to_b[0].1, &to_b[0].2);
    assert_eq!(value(&p.b.mem, 0x100), 42);
    p.settle();
    assert_eq!(
        value(&p.b.mem, 0x100),
        7,
        "then the compare-and-swap matched 42"
    );
    assert_eq!(value(&p.a.mem, 0x8008), 40);
    assert_eq!(value(&p.a.mem, 0x8010), 42);
    assert!(p.a.conn.counters().rnr_retries >= 1);
    let c = completions(&p.a.events);
    assert_eq!(c.len(), 2);
    assert!(c.iter().all(|c| c.status == Status::Success));
}

/// A refused Read whose NACK is overtaken by an ACK on another path (the ACK moves the window
/// past the Read) still completes as refused instead of waiting forever for data.
#[test]
fn a_refused_read_completes_even_when_an_ack_overtakes_its_nack() {
    let mut p = Pair::new();
    p.b.conn
        .register(Region {
            key: KEY,
            base: BASE,
            len: 0x1000,
            access: Access::REMOTE_READ.union(Access::REMOTE_WRITE),
        })
        .unwrap();
    let wr = |id, op, stream, va| WorkRequest {
        id,
        op,
        stream,
        local_addr: BASE + 0x8000,
        len: 64,
        remote: RemoteAddr { va, rkey: KEY },
    };
    // Out of bounds: refused. Then a good Write on another stream.
    p.a.conn
        .post(Instant::ZERO, wr(1, WrOp::Read, 0, BASE + 0x1000))
        .unwrap();
    p.a.conn
        .post(Instant::ZERO, wr(2, WrOp::Write, 1, BASE))
        .unwrap();
    p.transmit();
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        assert!(to_b);
        let _ = p.deliver(to_b, port, &bytes);
    }
    p.b.conn.handle_timeout(p.now + 1_000_000);
    p.transmit();
    let back = std::mem::take(&mut p.wire);
    let is_nack = |b: &[u8]| b[0] == Opcode::MrNack.to_u8();
    assert!(back.iter().any(|w| is_nack(&w.2)), "the Read was refused");
    // ACKs first, the NACK last.
    for (to_b, port, bytes) in back.iter().filter(|w| !is_nack(&w.2)) {
        let _ = p.deliver(*to_b, *port, bytes);
    }
    for (to_b, port, bytes) in back.iter().filter(|w| is_nack(&w.2)) {
        let _ = p.deliver(*to_b, *port, bytes);
    }
    p.settle();
    let c = completions(&p.a.events);
    let read = c.iter().find(|c| c.id == 1).expect("the Read completed");
    assert_eq!(read.status, Status::Refused(NackReason::OutOfBounds));
    let write = c.iter().find(|c| c.id == 2).expect("the Write completed");
    assert_eq!(write.status, Status::Success);
}

fn is_nack(b: &[u8]) -> bool {
    b[0] == Opcode::MrNack.to_u8()
}

/// The NACK's reason byte (BTH, then version, path id, reason).
fn nack_reason(b: &[u8]) -> NackReason {
    NackReason::from_u8(b[BthRepr::LEN + 2])
}

/// A refusal whose NACK is lost (the ACKs that cover its PSN arrive) must not complete the Write
/// as successful: the ACKs say refusals are outstanding, the responder sends the NACK again, the
/// requester completes the Write as refused and confirms, and only then does its window move.
#[test]
fn a_lost_refusal_is_sent_again_and_the_write_never_completes_as_successful() {
    let mut p = Pair::new();
    grant(&mut p, Access::REMOTE_WRITE, BASE, 0x1000);
    // Refused (past the end), then a good Write on the same stream.
    p.a.conn
        .post(Instant::ZERO, write(1, BASE, 64, BASE + 0x2000, KEY))
        .unwrap();
    p.a.conn
        .post(Instant::ZERO, write(2, BASE, 64, BASE, KEY))
        .unwrap();
    let mut first_nacks = 0;
    for _ in 0..20 {
        p.round(&mut |to_b, b| {
            let lost = !to_b && is_nack(b) && first_nacks == 0;
            first_nacks += usize::from(lost);
            lost
        });
    }
    assert_eq!(first_nacks, 1, "the refusal was sent once and lost");
    assert_eq!(p.b.conn.counters().nacks_sent, 1);
    assert!(
        completions(&p.a.events).is_empty(),
        "completed on ACKs that carry the refusals flag: {:?}",
        completions(&p.a.events)
    );
    assert!(p.a.conn.counters().acked >= 2, "the ACKs did arrive");
    assert!(!p.b.conn.is_idle(), "the responder still holds the refusal");
    // The resend timer brings the NACK again; everything flows from here.
    p.settle();
    let c = completions(&p.a.events);
    assert_eq!(
        c.iter().map(|c| (c.id, c.status)).collect::<Vec<_>>(),
        [
            (1, Status::Refused(NackReason::OutOfBounds)),
            (2, Status::Success)
        ]
    );
    let b = p.b.conn.counters();
    assert_eq!((b.nacks_resent, b.refusals_confirmed), (1, 1));
    assert_eq!(
        b.access_violations, 1,
        "refused once, repeated, never re-evaluated"
    );
    assert!(p.a.conn.is_idle() && p.b.conn.is_idle());
    assert!(p.b.mem[..64] == p.a.mem[..64], "the good Write landed");
}

/// The NACK arrives after ACKs on other paths that moved the responder's cumulative PSN past
/// the refused Write, and the requester's confirmation is lost once: still refused, confirmed
/// again when the NACK repeats, and the responder stops repeating it.
#[test]
fn an_overtaken_refusal_with_a_lost_confirmation_still_refuses_the_write() {
    let mut p = Pair::new();
    grant(&mut p, Access::REMOTE_WRITE, BASE, 0x1000);
    p.a.conn
        .post(Instant::ZERO, write(1, BASE, 64, BASE, KEY + 5))
        .unwrap();
    for i in 0..6u64 {
        p.a.conn
            .post(Instant::ZERO, write(2 + i, BASE, 64, BASE + 64 * i, KEY))
            .unwrap();
    }
    p.transmit();
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        let _ = p.deliver(to_b, port, &bytes);
    }
    p.b.conn.handle_timeout(p.now + 1_000_000);
    p.transmit();
    let back = std::mem::take(&mut p.wire);
    assert_eq!(back.iter().filter(|w| is_nack(&w.2)).count(), 1);
    for (to_b, port, bytes) in back.iter().filter(|w| !is_nack(&w.2)) {
        let _ = p.deliver(*to_b, *port, bytes);
    }
    p.a.conn.handle_timeout(p.now);
    while let Some(e) = p.a.conn.poll_event() {
        p.a.events.push(e);
    }
    assert!(
        completions(&p.a.events).is_empty(),
        "completed before the refusal arrived: {:?}",
        completions(&p.a.events)
    );
    for (to_b, port, bytes) in back.iter().filter(|w| is_nack(&w.2)) {
        let _ = p.deliver(*to_b, *port, bytes);
    }
    let mut confirmations_lost = 0;
    for _ in 0..200 {
        p.round(&mut |to_b, b| {
            let lost = to_b
                && is_nack(b)
                && nack_reason(b) == NackReason::RefusalSeen
                && confirmations_lost == 0;
            confirmations_lost += usize::from(lost);
            lost
        });
    }
    p.settle();
    assert_eq!(confirmations_lost, 1);
    let c = completions(&p.a.events);
    assert_eq!(c.len(), 7, "{c:?}");
    assert_eq!(c[0].id, 1);
    assert_eq!(c[0].status, Status::Refused(NackReason::InvalidRkey));
    assert!(c[1..].iter().all(|c| c.status == Status::Success), "{c:?}");
    let b = p.b.conn.counters();
    assert_eq!(b.refusals_confirmed, 1);
    assert!(b.nacks_resent >= 1);
    assert!(p.a.conn.is_idle() && p.b.conn.is_idle());
}

/// A requester that never confirms cannot make the responder hold more than a few refusals:
/// the rest are not accepted (counted), the responder's NACKs per resend period stay bounded,
/// and once confirmations flow every request completes as refused, none as successful.
#[test]
fn unconfirmed_refusals_are_bounded_and_every_request_still_completes_refused() {
    let mut p = Pair::new();
    grant(&mut p, Access::REMOTE_WRITE, BASE, 0x1000);
    // Two streams, the queue's 16 messages.
    for i in 0..16u64 {
        let mut wr = write(i, BASE, 64, BASE + 0x4000, KEY);
        wr.stream = (i % 2) as u16;
        p.a.conn.post(Instant::ZERO, wr).unwrap();
    }
    let mut nacks_from_b = 0;
    for _ in 0..100 {
        p.round(&mut |to_b, b| {
            if !to_b && is_nack(b) {
                nacks_from_b += 1;
            }
            to_b && is_nack(b)
        });
    }
    let b = *p.b.conn.counters();
    assert!(b.drop_refusals_full > 0, "{b:?}");
    assert_eq!(b.access_violations, 8 + b.drop_refusals_full);
    assert_eq!(b.refusals_confirmed, 0);
    // 100 us, a resend every 50 us: each held refusal went at most three times.
    assert!(nacks_from_b <= 8 * 3, "{nacks_from_b} NACKs");
    assert!(completions(&p.a.events)
        .iter()
        .all(|c| c.status != Status::Success));
    p.settle();
    let c = completions(&p.a.events);
    assert_eq!(c.len(), 16, "{c:?}");
    assert!(c
        .iter()
        .all(|c| c.status == Status::Refused(NackReason::OutOfBounds)));
    assert_eq!(p.b.conn.counters().refusals_confirmed, 16);
    assert!(p.a.conn.is_idle() && p.b.conn.is_idle());
}

/// Two Sends refused for want of a receive buffer at different times: each goes again after its
/// own `rnr_delay`. The timer that brings the first must not leave the second without one (it
/// used to: the second waited forever once nothing else was in flight).
#[test]
fn every_send_held_back_for_a_receive_buffer_goes_again_in_its_time() {
    let mut p = Pair::new();
    let send = |id: u64, stream: u16| WorkRequest {
        id,
        op: WrOp::Send,
        stream,
        local_addr: BASE,
        len: 64,
        remote: RemoteAddr::default(),
    };
    p.a.conn.post(p.now, send(1, 0)).unwrap();
    p.a.conn.post(p.now, send(2, 1)).unwrap();
    p.transmit();
    let sends = std::mem::take(&mut p.wire);
    assert_eq!(sends.len(), 2);
    // The first arrives now, the second 20 us later: two refusals, two different wake times.
    let _ = p.deliver(sends[0].0, sends[0].1, &sends[0].2);
    p.transmit();
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        let _ = p.deliver(to_b, port, &bytes);
    }
    p.now += 20_000;
    let _ = p.deliver(sends[1].0, sends[1].1, &sends[1].2);
    p.transmit();
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        let _ = p.deliver(to_b, port, &bytes);
    }
    assert_eq!(p.a.conn.counters().nacks_received, 2);
    // Buffers now; from here on nothing but the wake-ups can move the Sends.
    for (id, stream) in [(10, 0), (11, 1)] {
        p.b.conn
            .post_recv(RecvRequest {
                id,
                stream,
                addr: BASE + 0x4000 + 0x100 * id,
                len: 64,
            })
            .unwrap();
    }
    // Driven by the timers alone, as a runner that sleeps until `poll_timeout` is.
    for _ in 0..1000 {
        p.transmit();
        for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
            let _ = p.deliver(to_b, port, &bytes);
        }
        p.transmit();
        if !p.wire.is_empty() {
            continue;
        }
        let next = [p.a.conn.poll_timeout(), p.b.conn.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = next else { break };
        p.now = p.now.max(t);
        for side in [&mut p.a, &mut p.b] {
            if side.conn.poll_timeout().is_some_and(|t| t <= p.now) {
                side.conn.handle_timeout(p.now);
            }
        }
    }
    while let Some(e) = p.a.conn.poll_event() {
        p.a.events.push(e);
    }
    let c = completions(&p.a.events);
    assert_eq!(
        c.iter().map(|c| (c.id, c.status)).collect::<Vec<_>>(),
        [(1, Status::Success), (2, Status::Success)]
    );
    assert_eq!(p.a.conn.counters().rnr_retries, 2);
    assert!(p.a.conn.is_idle());
}

/// A data packet whose flag A promises a carried ACK must hold one: too short a body is
/// malformed (nothing placed, nothing acknowledged); a whole one is processed as an ACK and the
/// payload after it lands.
#[test]
fn a_carried_ack_must_be_whole() {
    use transport_core::wire::metaroce::{MrAckRepr, PiggyAck};
    let mut block = vec![0u8; PiggyAck::LEN];
    PiggyAck {
        cum_psn: Psn::new(0),
        ack: MrAckRepr::default(),
    }
    .emit(&mut block)
    .unwrap();
    let mut p = Pair::new();
    grant(&mut p, Access::REMOTE_WRITE, BASE, MEM as u64);
    let before = p.b.mem.clone();
    let (port, short) = forged_with(2, 0xffff, 0, BASE + 0x40, KEY, true, &[]);
    assert_eq!(p.deliver(true, port, &short), Err(DropReason::Malformed));
    assert!(p.b.mem == before);
    let c = *p.b.conn.counters();
    assert_eq!((c.acks_piggyback_received, c.data_received), (0, 0));
    let (port, whole) = forged_with(2, 0xffff, 0, BASE + 0x40, KEY, true, &block);
    assert!(p.deliver(true, port, &whole).is_ok());
    assert_eq!(&p.b.mem[0x40..0x48], &[0xee; 8]);
    let c = *p.b.conn.counters();
    assert_eq!((c.acks_piggyback_received, c.data_received), (1, 1));
}

#[test]
fn errors_say_what_went_wrong() {
    use transport_core::conn::{DropReason, PostError, RegionError};
    assert!(PostError::QueueFull
        .to_string()
        .contains("poll completions"));
    assert!(PostError::Misaligned.to_string().contains("8-byte aligned"));
    assert_eq!(
        RegionError::DuplicateKey(0x51).to_string(),
        "key 0x51 is already registered"
    );
    assert!(DropReason::OutOfWindow
        .to_string()
        .contains("receive window"));
    // Usable as errors.
    let e: &dyn core::error::Error = &DropReason::Inconsistent;
    assert!(e.to_string().contains("never sent"));
}

/// Atomics in flight together keep to one path, so they reach the responder in the order they
/// were posted (spraying them let later ones overtake earlier ones, each then refused
/// receiver-not-ready and sent again): twelve fetch-and-adds leave on one path and find 0 to 11.
#[test]
fn atomics_in_flight_keep_to_one_path() {
    let mut p = Pair::new();
    p.b.mem[0x100..0x108].fill(0);
    grant(&mut p, Access::REMOTE_ATOMIC, BASE, 0x1000);
    let paths = usize::from(p.a.conn.config().paths);
    assert!(paths > 1);
    let sent = |p: &Pair| -> Vec<u64> {
        (0..paths as u8)
            .map(|i| p.a.conn.path_stats(PathId(i)).unwrap().sent)
            .collect()
    };
    let before = sent(&p);
    for id in 0..12u64 {
        let wr = WorkRequest {
            id,
            op: WrOp::FetchAdd(1),
            stream: (id % 2) as u16,
            local_addr: BASE + 0x8000 + 8 * id,
            len: 8,
            remote: RemoteAddr {
                va: BASE + 0x100,
                rkey: KEY,
            },
        };
        p.a.conn.post(Instant::ZERO, wr).unwrap();
    }
    p.settle();
    let used: Vec<u64> = sent(&p).iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(used.iter().filter(|&&n| n > 0).count(), 1, "{used:?}");
    assert_eq!(used.iter().sum::<u64>(), 12);
    for id in 0..12usize {
        let at = 0x8000 + 8 * id;
        let found = u64::from_ne_bytes(p.a.mem[at..at + 8].try_into().unwrap());
        assert_eq!(found, id as u64);
    }
    assert_eq!(p.a.conn.counters().rnr_retries, 0);
    assert_eq!(completions(&p.a.events).len(), 12);
}

/// A peer that keeps refusing for want of a receive buffer is asked again less and less often:
/// each refusal in a row doubles the wait (50, 100, 200 us... up to 1.6 ms), so a responder whose
/// resources stay taken is not flooded; once it accepts, the next refusal waits 50 us again.
#[test]
fn a_peer_refusing_again_and_again_is_asked_less_often() {
    let mut p = Pair::new();
    let rnr_delay = common::config(1, 2).rnr_delay;
    let send = |id: u64| WorkRequest {
        id,
        op: WrOp::Send,
        stream: 0,
        local_addr: BASE,
        len: 64,
        remote: RemoteAddr::default(),
    };
    // Drives the pair by its timers alone for `until` ns; returns when A's Sends went.
    let run = |p: &mut Pair, until: u64| {
        let end = p.now + until;
        let mut sent_at = Vec::new();
        loop {
            p.transmit();
            let wire = std::mem::take(&mut p.wire);
            if wire.is_empty() {
                let next = [p.a.conn.poll_timeout(), p.b.conn.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min();
                match next {
                    Some(t) if t <= end => p.now = p.now.max(t),
                    _ => break,
                }
                for side in [&mut p.a, &mut p.b] {
                    if side.conn.poll_timeout().is_some_and(|t| t <= p.now) {
                        side.conn.handle_timeout(p.now);
                    }
                }
                continue;
            }
            for (to_b, port, bytes) in wire {
                if to_b && bytes[0] == transport_core::wire::Opcode::MrSend.to_u8() {
                    sent_at.push(p.now.since(Instant::ZERO));
                }
                let _ = p.deliver(to_b, port, &bytes);
            }
            p.now += 1_000;
        }
        sent_at
    };
    p.a.conn.post(p.now, send(1)).unwrap();
    let sent_at = run(&mut p, 10_000_000);
    let gaps: Vec<u64> = sent_at.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.len() >= 8, "{sent_at:?}");
    // Each gap is the wait (plus the 1 us rounds of the exchange): doubling, then capped.
    for (k, gap) in gaps.iter().enumerate() {
        let wait = rnr_delay << k.min(5);
        assert!(
            (wait..wait + 10_000).contains(gap),
            "gap {k}: {gap} ns, wait {wait}: {gaps:?}"
        );
    }
    // A buffer: the next try is taken; a second Send, refused, goes again after 50 us.
    p.b.conn
        .post_recv(RecvRequest {
            id: 10,
            stream: 0,
            addr: BASE + 0x4000,
            len: 64,
        })
        .unwrap();
    run(&mut p, 2_000_000);
    p.a.conn.post(p.now, send(2)).unwrap();
    let sent_at = run(&mut p, 2 * rnr_delay);
    assert_eq!(sent_at.len(), 2, "sent, refused, sent again: {sent_at:?}");
    assert!(sent_at[1] - sent_at[0] < rnr_delay + 10_000, "{sent_at:?}");
}

/// A Write with immediate refused at the responder (here an R_Key it never registered) fails at
/// the requester and consumes the receive posted for its MSN, which completes with the same
/// refusal: the stream's next message lands in the next receive instead of every later
/// receive waiting for good behind one that nothing will fill.
#[test]
fn a_refused_write_with_immediate_ends_its_receive_and_the_stream_goes_on() {
    let mut p = Pair::new();
    for (id, at) in [(30u64, 0x1000u64), (31, 0x2000)] {
        p.b.conn
            .post_recv(RecvRequest {
                id,
                stream: 0,
                addr: BASE + at,
                len: 64,
            })
            .unwrap();
    }
    let wr = |id, op, rkey| WorkRequest {
        id,
        op,
        stream: 0,
        local_addr: BASE,
        len: 32,
        remote: RemoteAddr {
            va: BASE + 0x4000,
            rkey,
        },
    };
    p.a.conn
        .post(Instant::ZERO, wr(1, WrOp::WriteWithImm(5), 0x99))
        .unwrap();
    p.a.conn.post(Instant::ZERO, wr(2, WrOp::Send, 0)).unwrap();
    p.settle();
    let ca = outcomes(&p.a.events);
    assert_eq!(
        ca,
        [
            (1, Status::Refused(NackReason::InvalidRkey)),
            (2, Status::Success)
        ]
    );
    let cb: Vec<(u64, Status, CompletionKind)> = completions(&p.b.events)
        .iter()
        .map(|c| (c.id, c.status, c.kind))
        .collect();
    assert_eq!(
        cb,
        [
            (
                30,
                Status::Refused(NackReason::InvalidRkey),
                CompletionKind::Recv
            ),
            (31, Status::Success, CompletionKind::Recv),
        ]
    );
    assert!(p.b.mem[0x2000..0x2020] == p.a.mem[..32]);
}

/// A runner that is handed an atomic and never reports its result (`atomic_result`): the atomic
/// is refused (remote operational), and nothing else changes: every Write after it, past a
/// whole window of PSNs, lands and completes once. (The refusal used to mark the atomic's PSN
/// accepted a second time, after the cumulative PSN had passed it: the mark stood for the PSN a
/// window later, which was then dropped as a duplicate and acknowledged without being placed.)
#[test]
fn an_atomic_its_runner_never_reports_is_refused_and_the_window_stays_sound() {
    const W: u64 = 256; // the pair's window (common::Pair)
    let mut p = Pair::new();
    let len = p.b.mem.len() as u64;
    p.b.conn
        .register(Region {
            key: KEY,
            base: BASE,
            len,
            access: Access::REMOTE_ATOMIC.union(Access::REMOTE_WRITE),
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
    for (i, b) in p.a.mem.iter_mut().enumerate() {
        *b = (i * 11 + 7) as u8;
    }
    let remote = |at: u64| RemoteAddr {
        va: BASE + at,
        rkey: KEY,
    };
    p.a.conn
        .post(
            Instant::ZERO,
            WorkRequest {
                id: 1,
                op: WrOp::FetchAdd(1),
                stream: 0,
                local_addr: BASE,
                len: 8,
                remote: remote(0),
            },
        )
        .unwrap();
    p.transmit();
    let wire = std::mem::take(&mut p.wire);
    assert_eq!(wire.len(), 1);
    let (_, port, atomic) = &wire[0];
    // B's runner takes the atomic and drops it: no apply, no atomic_result.
    let d = p.b.conn.handle_datagram(p.now, *port, false, atomic);
    assert!(matches!(d, Ok(Delivery::Atomic { .. })), "{d:?}");
    // More than a window of 8-byte Writes after it, from 64 KiB on.
    let writes = W + 64;
    let (mut posted, mut done) = (0u64, 0u64);
    let mut statuses = Vec::new();
    for _ in 0..200 {
        while posted < writes {
            let wr = WorkRequest {
                id: 100 + posted,
                op: WrOp::Write,
                stream: 1,
                local_addr: BASE + 0x10000 + posted * 8,
                len: 8,
                remote: remote(0x10000 + posted * 8),
            };
            if p.a.conn.post(p.now, wr).is_err() {
                break;
            }
            posted += 1;
        }
        p.settle();
        for e in p.a.events.drain(..) {
            if let Event::Completion(c) = e {
                statuses.push((c.id, c.status));
                done += 1;
            }
        }
        if done == writes + 1 {
            break;
        }
    }
    assert_eq!(done, writes + 1, "every work request completes once");
    assert!(statuses.contains(&(1, Status::Refused(NackReason::RemoteOperational))));
    let writes_ok = statuses
        .iter()
        .filter(|&&(id, s)| id >= 100 && s == Status::Success)
        .count() as u64;
    assert_eq!(writes_ok, writes);
    let at = 0x10000usize;
    let n = (writes * 8) as usize;
    assert!(
        p.b.mem[at..at + n] == p.a.mem[at..at + n],
        "a Write completed that never landed"
    );
}

/// The NACK reasons B sent since the wire was last emptied.
fn nack_reasons(p: &Pair) -> Vec<NackReason> {
    p.wire
        .iter()
        .filter(|(to_b, _, _)| !*to_b)
        .filter_map(
            |(_, _, d)| match transport_core::wire::Datagram::parse(d).ok()?.ext {
                Extensions::MrNack(n) => Some(n.reason),
                _ => None,
            },
        )
        .collect()
}

/// A Send too long for its receive, in three packets that arrive last first: every packet is
/// refused as too long (not the first to arrive as too long and the others as invalid, once its
/// receive is consumed), the receive completes with that refusal, and the next Send lands.
#[test]
fn every_packet_of_an_overlong_send_is_refused_with_the_same_reason() {
    let mut p = Pair::new();
    for (id, at, len) in [(40u64, 0x1000u64, 100u32), (41, 0x4000, 4000)] {
        p.b.conn
            .post_recv(RecvRequest {
                id,
                stream: 1,
                addr: BASE + at,
                len,
            })
            .unwrap();
    }
    let send = |id, len| WorkRequest {
        id,
        op: WrOp::Send,
        stream: 1,
        local_addr: BASE,
        len,
        remote: RemoteAddr::default(),
    };
    p.a.conn.post(Instant::ZERO, send(1, 3000)).unwrap();
    p.transmit();
    let mut first: Vec<(bool, u16, Vec<u8>)> = std::mem::take(&mut p.wire);
    assert_eq!(first.len(), 3, "three packets of 1024 bytes at most");
    first.reverse();
    let mut reasons = Vec::new();
    for (to_b, port, d) in first {
        let _ = p.deliver(to_b, port, &d);
        p.transmit();
        reasons.extend(nack_reasons(&p));
        // B's NACKs are held back here: only the reasons are looked at.
        p.wire.retain(|(to_b, _, _)| *to_b);
    }
    assert!(
        reasons.len() >= 3 && reasons.iter().all(|r| *r == NackReason::MessageTooLong),
        "{reasons:?}"
    );
    p.a.conn.post(Instant::ZERO, send(2, 50)).unwrap();
    p.settle();
    let ca = outcomes(&p.a.events);
    assert_eq!(
        ca,
        [
            (1, Status::Refused(NackReason::MessageTooLong)),
            (2, Status::Success)
        ]
    );
    let cb: Vec<(u64, Status, u32)> = completions(&p.b.events)
        .iter()
        .map(|c| (c.id, c.status, c.byte_len))
        .collect();
    assert_eq!(
        cb,
        [
            (40, Status::Refused(NackReason::MessageTooLong), 0),
            (41, Status::Success, 50)
        ]
    );
}

/// A Write with immediate with a bad R_Key that arrives before its receive is posted waits
/// (receiver not ready) instead of being refused at once: refused then, it would spend an MSN
/// that no receive stood for, and the receive posted for it later would never complete, nor any
/// after it. Once the receive is posted, the Write is refused, its receive completes with the
/// refusal, and the next message lands in the next receive.
#[test]
fn a_bad_write_with_immediate_before_its_receive_waits_for_it() {
    let mut p = Pair::new();
    let wr = |id, op, rkey| WorkRequest {
        id,
        op,
        stream: 0,
        local_addr: BASE,
        len: 32,
        remote: RemoteAddr {
            va: BASE + 0x4000,
            rkey,
        },
    };
    p.a.conn
        .post(Instant::ZERO, wr(1, WrOp::WriteWithImm(5), 0x99))
        .unwrap();
    p.transmit();
    let early: Vec<(bool, u16, Vec<u8>)> = std::mem::take(&mut p.wire);
    for (to_b, port, d) in &early {
        let _ = p.deliver(*to_b, *port, d);
    }
    p.transmit();
    assert_eq!(nack_reasons(&p), [NackReason::ReceiverNotReady]);
    for (id, at) in [(50u64, 0x1000u64), (51, 0x2000)] {
        p.b.conn
            .post_recv(RecvRequest {
                id,
                stream: 0,
                addr: BASE + at,
                len: 64,
            })
            .unwrap();
    }
    p.a.conn.post(Instant::ZERO, wr(2, WrOp::Send, 0)).unwrap();
    // The requester comes again after its receiver-not-ready wait.
    for _ in 0..100 {
        p.settle();
        if completions(&p.b.events).len() >= 2 {
            break;
        }
        p.now += 1_000_000;
    }
    let cb = outcomes(&p.b.events);
    assert_eq!(
        cb,
        [
            (50, Status::Refused(NackReason::InvalidRkey)),
            (51, Status::Success)
        ]
    );
    assert!(p.b.mem[0x2000..0x2020] == p.a.mem[..32]);
}
