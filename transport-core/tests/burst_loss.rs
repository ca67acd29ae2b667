//! A run of losses that takes a path's whole flight leaves no later packet on that path to show
//! a SACK gap. The other paths show it: once a packet that left later is acknowledged and the
//! path has been silent for its round trip, the connection probes the path's tail at once, and
//! what the probe's answer does not report (or everything that left before it, when no answer
//! comes within a round trip) goes again, long before the retransmission timeout.

mod common;

use common::Pair;
use transport_core::conn::{Event, Status};
use transport_core::wire::{BthRepr, Extensions};

const KEY: u32 = 0x44;

/// The path a data packet from A names.
fn data_path(d: &[u8]) -> Option<u8> {
    let (bth, rest) = BthRepr::parse(d).ok()?;
    let (ext, _) = Extensions::parse(bth.opcode.layout(), rest).ok()?;
    ext.mr_data().map(|m| m.path_id)
}

fn run() -> (u64, transport_core::conn::Counters) {
    let mut p = Pair::granting_writes(KEY);
    let wr = common::write_at(1, 0, 256 * 1024, KEY);

    p.a.conn.post(0, wr).unwrap();
    // Path 2's first flight is lost whole.
    let mut first_flight = true;
    let start = p.now;
    for _ in 0..20_000 {
        p.round(&mut |to_b, d| to_b && first_flight && data_path(d) == Some(2));
        if p.a.conn.counters().overdue_probes > 0 {
            first_flight = false;
        }
        if p.a.events.iter().any(|e| matches!(e, Event::Completion(_))) {
            break;
        }
    }
    assert!(p
        .a
        .events
        .iter()
        .any(|e| matches!(e, Event::Completion(c) if c.id == 1 && c.status == Status::Success)));
    assert!(p.a.mem[..256 * 1024] == p.b.mem[..256 * 1024]);
    (p.now - start, *p.a.conn.counters())
}

#[test]
fn a_path_whose_whole_flight_is_lost_is_repaired_within_round_trips_not_a_timeout() {
    let (took, c) = run();
    assert!(c.overdue_probes >= 1, "{c:?}");
    assert_eq!(c.lost_by_timeout, 0, "{c:?}");
    // Exactly the lost packets went again: the probe's answer told which.
    assert_eq!(c.retransmitted, c.lost_by_sack, "{c:?}");
    // The pair's round trip is a few microseconds; its timeouts are 100 and 320 us.
    assert!(took < 100_000, "took {took} ns: {c:?}");
}
