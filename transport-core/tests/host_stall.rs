//! A runner whose host gave it no CPU for a while tells the connection so: the retransmission
//! timers restart, and what arrived meanwhile (handed over first) settles the packets in flight
//! instead of a timeout declaring them lost.

mod common;

use common::Pair;
use transport_core::conn::Status;

const KEY: u32 = 0x33;

#[test]
fn a_stall_restarts_the_timers_and_what_arrived_meanwhile_settles_the_flight() {
    let mut p = Pair::granting_writes(KEY);
    let wr = common::write_at(1, 0, 8192, KEY);

    p.a.conn.post(0, wr).unwrap();
    p.transmit();
    let first_deadline = p.a.conn.poll_timeout().expect("a timer for the flight");
    // B takes everything and answers; A's host gives A no CPU until well past its timeout.
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        assert!(to_b);
        p.deliver(true, port, &bytes).unwrap();
    }
    p.now += 1_000;
    p.transmit();
    let acks = std::mem::take(&mut p.wire);
    assert!(!acks.is_empty());
    let late = first_deadline + 5_000_000;
    // The runner wakes late: it tells the connection, then hands over what waited in its buffer.
    p.a.conn.handle_host_stall(late);
    assert!(
        p.a.conn.poll_timeout().is_some_and(|t| t > late),
        "the timers restarted"
    );
    p.now = late;
    for (_, port, bytes) in acks {
        let _ = p.deliver(false, port, &bytes);
    }
    p.a.conn.handle_timeout(late);
    p.settle();
    let c = p.a.conn.counters();
    assert_eq!((c.retransmitted, c.lost_by_timeout), (0, 0), "{c:?}");
    assert!(p.a.events.iter().any(|e| matches!(
        e,
        transport_core::conn::Event::Completion(c) if c.id == 1 && c.status == Status::Success
    )));
}
