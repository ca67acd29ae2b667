//! Property tests of the connection's parts and of the whole: the SACK bitmap against a set
//! model, serial ordering laws across the wrap, and random operations over a random lossy,
//! reordering, duplicating, corrupting wire: never a panic, never a completion twice, never a
//! placement outside a granted region.

mod common;

use common::{Pair, BASE, MEM};
use proptest::prelude::*;
use std::collections::{BTreeSet, HashSet};
use transport_core::conn::PathId;
use transport_core::conn::{
    psn_before, psn_diff, Access, Arrival, CompletionKind, Delivery, Event, PathSeq, RecvRequest,
    Region, RemoteAddr, SackBitmap, Status, WorkRequest, WrOp,
};
use transport_core::wire::Psn;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn sack_bitmap_matches_a_set(start in any::<u32>(), offsets in prop::collection::vec(0u32..600, 0..700)) {
        let mut s = SackBitmap::new(PathSeq(start));
        let mut arrived: BTreeSet<u32> = BTreeSet::new(); // offsets from start
        let mut given_up = 0u32; // everything below this offset counts as arrived or abandoned
        for off in offsets {
            let seq = PathSeq(start.wrapping_add(off));
            let expected = if off < given_up || arrived.contains(&off) {
                Arrival::Duplicate
            } else {
                let cum = (given_up..).find(|o| !arrived.contains(o)).unwrap();
                if off == cum { Arrival::InOrder } else if off > cum + 256 { Arrival::Slid } else { Arrival::AboveGap }
            };
            let got = s.insert(seq);
            prop_assert_eq!(got, expected, "offset {}", off);
            if got != Arrival::Duplicate {
                arrived.insert(off);
            }
            if got == Arrival::Slid {
                given_up = off - 256;
            }
            let cum = (given_up..).find(|o| !arrived.contains(o)).unwrap();
            prop_assert_eq!(s.cumulative(), PathSeq(start.wrapping_add(cum)));
            for probe in cum..cum + 300 {
                prop_assert_eq!(s.contains(PathSeq(start.wrapping_add(probe))), arrived.contains(&probe) && probe > cum);
            }
            let wire = s.to_wire();
            for bit in 0..256u32 {
                let set = wire[bit as usize / 8] & (1 << (bit % 8)) != 0;
                prop_assert_eq!(set, arrived.contains(&(cum + 1 + bit)));
            }
        }
    }

    #[test]
    fn psn_order_laws(a in 0u32..1 << 24, d in 1u32..(1 << 23)) {
        let x = Psn::new(a);
        let y = x.wrapping_add(d);
        prop_assert!(psn_before(x, y));
        prop_assert!(!psn_before(y, x));
        prop_assert_eq!(psn_diff(y, x), d as i32);
        prop_assert_eq!(psn_diff(x, y), -(d as i32));
        prop_assert_eq!(psn_diff(x, x), 0);
        let z = y.wrapping_add(d / 2);
        if d + d / 2 < 1 << 23 {
            prop_assert!(psn_before(x, z), "transitive");
        }
    }

    #[test]
    fn path_seq_order_laws(a in any::<u32>(), d in 1u32..(1 << 31)) {
        let x = PathSeq(a);
        let y = x.add(d);
        prop_assert!(x.before(y) && !y.before(x));
        prop_assert_eq!(y.diff(x), d as i32);
    }
}

#[derive(Debug, Clone)]
enum Step {
    Post {
        op: u8,
        stream: u16,
        len: u32,
        offset: u32,
    },
    Recv {
        stream: u16,
        len: u32,
    },
    Deliver {
        pick: usize,
        fate: u8,
        byte: usize,
    },
    Tick {
        us: u32,
    },
    /// The runners hand their events over (only here: the event queues fill between).
    Drain,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0u8..7, 0u16..3, 0u32..6000, 0u32..(MEM as u32)).prop_map(|(op, stream, len, offset)| Step::Post { op, stream, len, offset }),
        1 => (0u16..3, 0u32..6000).prop_map(|(stream, len)| Step::Recv { stream, len }),
        6 => (any::<usize>(), 0u8..10, any::<usize>()).prop_map(|(pick, fate, byte)| Step::Deliver { pick, fate, byte }),
        1 => (1u32..500).prop_map(|us| Step::Tick { us }),
        1 => Just(Step::Drain),
    ]
}

const KEY: u32 = 0x51;
/// B grants the middle half of its memory.
const GRANT_BASE: u64 = BASE + (MEM as u64) / 4;
const GRANT_LEN: u64 = (MEM as u64) / 2;

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_over_a_hostile_wire(
        steps in prop::collection::vec(step(), 1..300),
        burst in 1u8..=8,
        depth in 1u8..=4,
    ) {
        // Paths per packet, or in spray bursts (`Config::spray_burst`), on both sides; one to
        // four Reads and atomics outstanding (`Config::max_rd_atomic`; the count the connection
        // keeps is checked against its ring in every transmission, debug builds).
        let with_burst = |mut c: transport_core::conn::Config| {
            c.spray_burst = burst;
            c.max_rd_atomic = depth;
            c
        };
        let mut p = Pair::with_configs(
            with_burst(common::config(1, 2)),
            with_burst(common::config(2, 1)),
        );
        p.b.conn.register(Region { key: KEY, base: GRANT_BASE, len: GRANT_LEN, access: Access::REMOTE_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC) }).unwrap();
        p.a.conn.register(Region { key: KEY, base: BASE, len: MEM as u64, access: Access::LOCAL_WRITE }).unwrap();
        let mut completed: HashSet<(bool, u64)> = HashSet::new();
        // The last completion id per side, stream and direction (ids grow with posting order).
        let mut last: std::collections::HashMap<(bool, u16, bool), u64> = Default::default();
        // Writes aimed (partly) outside B's grant: refused, whatever the wire loses or reorders.
        let mut must_refuse: HashSet<u64> = HashSet::new();
        let mut next_id = 1u64;
        let mut recv_at = 0u64;
        for s in steps {
            let drain = matches!(s, Step::Drain);
            match s {
                Step::Post { op, stream, len, offset } => {
                    let op = [WrOp::Write, WrOp::WriteWithImm(7), WrOp::Send, WrOp::SendWithImm(9), WrOp::Read, WrOp::FetchAdd(3), WrOp::CompareSwap { compare: 0, swap: 1 }][op as usize];
                    let len = if matches!(op, WrOp::FetchAdd(_) | WrOp::CompareSwap { .. }) { 8 } else { len };
                    let offset = if matches!(op, WrOp::FetchAdd(_) | WrOp::CompareSwap { .. }) { offset & !7 } else { offset };
                    // Remote addresses anywhere in B's memory and beyond: some inside the grant, some not.
                    let va = BASE + u64::from(offset);
                    let wr = WorkRequest { id: next_id, op, stream, local_addr: BASE, len: len.min(MEM as u32 / 8), remote: RemoteAddr { va, rkey: KEY } };
                    let outside = va < GRANT_BASE || va + u64::from(wr.len) > GRANT_BASE + GRANT_LEN;
                    if p.a.conn.post(p.now, wr).is_ok()
                        && outside
                        && matches!(op, WrOp::Write | WrOp::WriteWithImm(_))
                    {
                        must_refuse.insert(next_id);
                    }
                    next_id += 1;
                }
                Step::Recv { stream, len } => {
                    let addr = BASE + (recv_at % (MEM as u64 / 2));
                    recv_at += 8192;
                    let _ = p.b.conn.post_recv(RecvRequest { id: next_id, stream, addr, len });
                    next_id += 1;
                }
                Step::Deliver { pick, fate, byte } => {
                    p.transmit();
                    if p.wire.is_empty() {
                        continue;
                    }
                    let i = pick % p.wire.len();
                    let (to_b, port, mut bytes) = p.wire.remove(i);
                    match fate {
                        0 => continue, // lost
                        1 => { let at = byte % bytes.len(); bytes[at] ^= 0x20; } // corrupted
                        2 => p.wire.push((to_b, port, bytes.clone())), // duplicated
                        _ => {}
                    }
                    let side_is_b = to_b;
                    // Fate 3: arrives marked Congestion Experienced.
                    if let Ok(Delivery::Place { addr, len, .. }) = p.deliver_marked(to_b, port, &bytes, fate == 3) {
                        let end = addr + len as u64;
                        prop_assert!(addr >= BASE && end <= BASE + MEM as u64, "placement outside memory");
                        if side_is_b {
                            // Writes land inside the grant; Sends inside posted receive buffers
                            // (the lower half of memory).
                            let in_grant = addr >= GRANT_BASE && end <= GRANT_BASE + GRANT_LEN;
                            let in_recv = end <= BASE + MEM as u64 / 2 + 8192;
                            prop_assert!(in_grant || in_recv, "placement at {:#x}+{} outside grant and receive area", addr, len);
                        }
                    }
                }
                Step::Drain => {}
                Step::Tick { us } => {
                    p.now += u64::from(us) * 1000;
                    for side in [&mut p.a, &mut p.b] {
                        if side.conn.poll_timeout().is_some_and(|t| t <= p.now) {
                            side.conn.handle_timeout(p.now);
                        }
                    }
                }
            }
            for side in [&p.a, &p.b] {
                // A runner that stops asking for data when `may_transmit_data` says none is left
                // (the UDP engine after a doorbell) leaves nothing behind that a call would give.
                if !side.conn.may_transmit_data() {
                    let mut probe = side.conn.clone();
                    let mut buf = vec![0u8; 1 << 16];
                    prop_assert!(probe.poll_transmit_data(p.now, &mut buf).is_none(), "may_transmit_data said no data was left");
                }
                // The congestion windows stay between one packet and the configured maximum, and
                // are cut no more often than marks came back.
                let max = side.conn.config().window_per_path;
                let mut cuts = 0;
                for i in 0..side.conn.config().paths {
                    let s = side.conn.path_stats(PathId(i)).unwrap();
                    prop_assert!(s.cwnd >= 1 && s.cwnd <= max, "path {} window {}", i, s.cwnd);
                    prop_assert!(s.cwnd_cuts <= s.ecn_marks, "path {}: {:?}", i, s);
                    cuts += s.cwnd_cuts;
                }
                prop_assert_eq!(cuts, side.conn.counters().cwnd_cuts);
            }
            if !drain {
                continue;
            }
            for (is_a, side) in [(true, &mut p.a), (false, &mut p.b)] {
                while let Some(e) = side.conn.poll_event() {
                    if let Event::Completion(c) = e {
                        prop_assert!(completed.insert((is_a, c.id)), "completion {} reported twice", c.id);
                        let recv = matches!(c.kind, CompletionKind::Recv | CompletionKind::RecvWriteImm);
                        let before = last.insert((is_a, c.stream, recv), c.id);
                        prop_assert!(before.is_none_or(|b| b < c.id), "completion {} after {:?} on stream {}", c.id, before, c.stream);
                        prop_assert!(
                            !(is_a && must_refuse.contains(&c.id) && c.status == Status::Success),
                            "write {} outside the grant completed as successful", c.id
                        );
                    }
                }
            }
        }
    }
}
