//! A runner whose host gave it no CPU for a while tells the connection so: the retransmission
//! timers restart, and what arrived meanwhile (handed over first) settles the packets in flight
//! instead of a timeout declaring them lost.

mod common;

use common::Pair;
use transport_core::conn::Status;
use transport_core::time::Instant;

const KEY: u32 = 0x33;
/// The wait for a silent peer, in long timeouts (`PEER_SILENCE_RTOS` in the connection).
const PEER_SILENCE_RTOS: u64 = 32;

/// A pair with A's Write of 256 KiB to B posted.
fn writing_256_kib() -> Pair {
    let mut p = Pair::granting_writes(KEY);
    p.a.conn
        .post(Instant::ZERO, common::write_at(1, 0, 256 * 1024, KEY))
        .unwrap();
    p
}

#[test]
fn a_stall_restarts_the_timers_and_what_arrived_meanwhile_settles_the_flight() {
    let mut p = Pair::granting_writes(KEY);
    let wr = common::write_at(1, 0, 8192, KEY);

    p.a.conn.post(Instant::ZERO, wr).unwrap();
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

/// Moves 256 KiB from A to B while B sends nothing back from 3 us to `stall` ns after the start
/// (its host gave it no CPU); returns A's events and counters, and whether a path of A stopped
/// carrying data (was probed) meanwhile.
fn with_a_silent_peer(
    stall: u64,
) -> (
    Vec<transport_core::conn::Event>,
    transport_core::conn::Counters,
    bool,
) {
    use transport_core::conn::Event;
    let mut p = writing_256_kib();
    let start = p.now;
    let mut done = false;
    let mut probing = false;
    for _ in 0..200_000 {
        let stalled = (start + 3_000..start + stall).contains(&p.now);
        p.round(&mut |to_b, _| stalled && !to_b);
        probing |= (0..4).any(|i| {
            p.a.conn
                .path_stats(transport_core::path::PathId(i))
                .is_some_and(|s| !s.active)
        });
        if p.a.events.iter().any(|e| matches!(e, Event::Completion(_))) {
            done = true;
            break;
        }
    }
    assert!(done, "{:?}", p.a.conn.counters());
    assert!(p.a.mem[..256 * 1024] == p.b.mem[..256 * 1024]);
    (
        std::mem::take(&mut p.a.events),
        *p.a.conn.counters(),
        probing,
    )
}

/// The peer's host stalls for the wait for a silent peer and 1 ms more (thirty-two long timeouts
/// of this configuration, 10.24 ms, then twenty probe intervals, where four unanswered probes
/// declare a path failed): after the wait the paths stop carrying data and are probed, but none
/// is declared failed, since nothing shows that a route rather than the peer is at fault; when
/// the peer runs again everything completes. A path that alone goes silent while the others are
/// heard is still declared failed (`forged_probe_replies_do_not_revive_a_failed_path`, the
/// selftest's dead path).
#[test]
fn a_stalled_peer_gets_no_path_declared_failed() {
    let wait = common::config(1, 2).rto_high * PEER_SILENCE_RTOS;
    let (events, c, probing) = with_a_silent_peer(wait + 1_000_000);
    assert!(probing, "the paths were probed: {c:?}");
    assert_eq!(c.path_failures, 0, "{events:?}");
}

/// A silence of the whole peer much longer than a host stall (twice the wait for it, 400 probe
/// intervals more) may be every route dying at once: the paths are then declared failed and
/// take new ones.
#[test]
fn a_silence_long_enough_fails_the_paths_over() {
    let wait = common::config(1, 2).rto_high * PEER_SILENCE_RTOS;
    let (_, c, _) = with_a_silent_peer(2 * wait + 20_000_000);
    assert!(c.path_failures > 0, "{c:?}");
}

/// The peer's host stalls for 2 ms, about six long timeouts of this configuration (320 us), and
/// for 8 ms, twenty-five (more than the eight the connection once waited): every path's flight
/// and its tail probes go unanswered meanwhile, but nothing came from the peer on any path
/// either, so no path's silence is evidence of loss. The tail probes go again (one per timeout)
/// and the answers, when the peer runs, show everything arrived: nothing is declared lost,
/// nothing is sent twice and no path is declared failed. (Before this rule, the second timeout
/// declared every path's flight lost: a window of needless retransmissions per path.)
#[test]
fn a_stalled_peer_costs_no_retransmission() {
    for stall in [2_000_000, 8_000_000] {
        let (_, c, _) = with_a_silent_peer(stall);
        assert!(
            c.peer_silent_waits > 0,
            "{stall} ns: the paths waited for the peer: {c:?}"
        );
        assert_eq!(
            (
                c.retransmitted,
                c.lost_by_timeout,
                c.lost_by_sack,
                c.path_failures
            ),
            (0, 0, 0, 0),
            "{stall} ns: {c:?}"
        );
    }
}

/// A silence longer than the wait may be every route dying: what the paths carried is then
/// declared lost (to go again as soon as a path carries data), as before the peer's silence
/// counted.
#[test]
fn a_long_silence_declares_the_flight_lost() {
    let wait = common::config(1, 2).rto_high * PEER_SILENCE_RTOS;
    let (_, c, _) = with_a_silent_peer(2 * wait);
    assert!(c.lost_by_timeout + c.lost_by_sack > 0, "{c:?}");
}

/// The path a data packet from A names.
fn data_path(d: &[u8]) -> Option<u8> {
    use transport_core::wire::{BthRepr, Extensions};
    let (bth, rest) = BthRepr::parse(d).ok()?;
    let (ext, _) = Extensions::parse(bth.opcode.layout(), rest).ok()?;
    ext.mr_data().map(|m| m.path_id)
}

/// While the peer is silent, a path's timer is due only when something is to be done (a probe
/// to send again, or the wait to end): a deadline left in the past has a runner spin instead of
/// sleep. Path 1's data is lost, so its flight becomes overdue (later packets on the other
/// paths are acknowledged) and its tail is probed; then the whole peer goes silent for 2 ms.
/// A's timers are due in few of those 1 us rounds; when the overdue probe's deadline did not
/// follow the longer wait for the peer, they were due in most of them.
#[test]
fn a_silent_peer_leaves_no_timer_due_in_the_past() {
    let mut p = writing_256_kib();
    let mut stall_from = None;
    let (mut due, mut rounds) = (0, 0);
    for _ in 0..100_000 {
        if stall_from.is_some_and(|t| p.now >= t + 2_000_000) {
            break;
        }
        let stalled = stall_from.is_some();
        if stalled {
            rounds += 1;
            due += usize::from(p.a.conn.poll_timeout().is_some_and(|t| t <= p.now));
        }
        p.round(&mut |to_b, d| {
            if to_b {
                !stalled && data_path(d) == Some(1)
            } else {
                stalled
            }
        });
        if stall_from.is_none() && p.a.conn.counters().overdue_probes > 0 {
            stall_from = Some(p.now);
        }
    }
    let c = p.a.conn.counters();
    assert!(stall_from.is_some() && c.peer_silent_waits > 0, "{c:?}");
    assert!(due * 20 < rounds, "due in {due} of {rounds} rounds: {c:?}");
}

/// The peer's host stalls, and a path's timer fires while it catches up: the peer has read
/// one path's run of datagrams from its socket (a sender using GSO leaves each path's at once)
/// and acknowledged it, while the other paths' runs, their tail probes behind them, still wait
/// in its socket. That ACK is no evidence against the other paths: nothing is declared lost
/// when their timers fire, nor while the peer goes on reading slowly and the paths probe again
/// (the probes sent after its silence are queued behind the rest), and when the peer has read
/// the rest nothing was sent twice. (While any datagram from the peer counted as its answer, the
/// other paths' flights were declared lost at that timer, as across a veth: a path's flight
/// declared lost 22 us after its peer was first heard again, 8.6 ms into its silence.)
#[test]
fn a_peer_catching_up_after_a_stall_costs_no_retransmission() {
    let mut p = writing_256_kib();
    let from = p.now + 3_000;
    // What reached B's socket while its host was stalled, not yet read.
    let mut backlog: Vec<(u16, Vec<u8>)> = Vec::new();
    let hold = |p: &mut Pair, backlog: &mut Vec<(u16, Vec<u8>)>| {
        p.transmit();
        for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
            if to_b {
                backlog.push((port, bytes));
            }
        }
        p.deliver_and_tick(&mut |_, _| false);
    };
    while p.now < from {
        p.round(&mut |_, _| false);
    }
    // Stalled until the paths have waited for the silent peer once and probed again.
    while p.a.conn.counters().peer_silent_waits < 4 {
        hold(&mut p, &mut backlog);
    }
    let due = p.a.conn.poll_timeout().expect("the paths' timers");
    while p.now + 2_000 < due {
        hold(&mut p, &mut backlog);
    }
    // B runs again: it reads the first path's run and answers it, just before A's timers fire.
    backlog.sort_by_key(|(port, _)| *port);
    let first = backlog[0].0;
    let run = backlog
        .iter()
        .take_while(|(port, _)| *port == first)
        .count();
    for (port, bytes) in backlog.drain(..run) {
        let _ = p.deliver(true, port, &bytes);
    }
    p.transmit();
    for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
        assert!(!to_b, "A's window is full");
        let _ = p.deliver(false, port, &bytes);
    }
    p.now = due;
    p.a.conn.handle_timeout(due);
    let c = *p.a.conn.counters();
    assert_eq!(
        c.lost_by_timeout, 0,
        "at the timer, the peer catching up: {c:?}"
    );
    // B goes on reading slowly, one datagram every 10 us, its answers reaching A, while A's
    // timers fire and it probes again (its new datagrams queue behind the backlog): for 500 us
    // the last path's run is not reached.
    let last = backlog.last().map(|(port, _)| *port).expect("a backlog");
    for k in 0..500 {
        if k % 10 == 0 && backlog.first().is_some_and(|(port, _)| *port != last) {
            let (port, bytes) = backlog.remove(0);
            let _ = p.deliver(true, port, &bytes);
        }
        p.transmit();
        for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
            if to_b {
                backlog.push((port, bytes));
            } else {
                let _ = p.deliver(false, port, &bytes);
            }
        }
        p.deliver_and_tick(&mut |_, _| false);
    }
    let c = *p.a.conn.counters();
    assert_eq!(
        (c.lost_by_timeout, c.lost_by_sack),
        (0, 0),
        "while the peer catches up slowly: {c:?}"
    );
    let c = deliver_the_rest_and_complete(&mut p, backlog);
    assert_eq!(
        (c.retransmitted, c.lost_by_timeout, c.lost_by_sack),
        (0, 0, 0),
        "{c:?}"
    );
}

/// Delivers the rest of B's `backlog` at once, then runs both ends until A's Write of 256 KiB
/// completes; checks that every byte arrived and returns A's counters.
fn deliver_the_rest_and_complete(
    p: &mut Pair,
    backlog: impl IntoIterator<Item = (u16, Vec<u8>)>,
) -> transport_core::conn::Counters {
    use transport_core::conn::Event;
    for (port, bytes) in backlog {
        let _ = p.deliver(true, port, &bytes);
    }
    for _ in 0..200_000 {
        if p.a.events.iter().any(|e| matches!(e, Event::Completion(_))) {
            break;
        }
        p.round(&mut |_, _| false);
    }
    let c = *p.a.conn.counters();
    assert!(p.a.mem[..256 * 1024] == p.b.mem[..256 * 1024], "{c:?}");
    c
}

/// The peer's host stalls for three quarters of the wait for a silent peer (7.7 ms), then reads
/// the backlog its socket holds slowly, one datagram every 90 us (a debug build beside busy loops
/// reads 0.8 Gb/s: a flight of 2.8 MB is 28 ms), each read within the short timeout of the one
/// before (so the peer is heard throughout): the last path's run, and A's tail probes at its end,
/// are read after the wait for a silent peer counted from the start of its silence. The peer
/// acknowledges something for the first time at every read of a data packet (the tail probes
/// between them, about as many, acknowledge nothing new), so nothing is declared lost, nothing
/// is sent twice and no path is declared failed. (While the wait was counted from the start of
/// the silence alone, it ended before the last path's run was read, and that path's flight was
/// declared lost.)
#[test]
fn a_backlog_read_for_longer_than_the_wait_costs_no_retransmission() {
    let wait = common::config(1, 2).rto_high * PEER_SILENCE_RTOS;
    after_a_stall_the_peer_reads_its_backlog(wait * 3 / 4, None);
}

/// The peer's host stalls for 3 ms, reads the first half of the backlog its socket holds (one
/// datagram every 90 us), stalls again for 2 ms (longer than the short timeout: a new silence,
/// which began after A's first tail probes left) and reads the rest: nothing is declared lost,
/// nothing is sent twice and no path is declared failed. The paths not yet read probe again
/// during the second stall (one probe per long timeout, 320 us), and those probes wait behind
/// it. It guards the length of the wait across a second stall (the first is longer than the
/// eight long timeouts the connection once waited), not the progress rule: it passes without
/// that. A pause shorter than a long timeout may fall between a path's probes: a probe sent
/// before the new silence is then judged by the usual rules once the peer is heard again.
#[test]
fn a_catch_up_interrupted_by_a_second_stall_costs_no_retransmission() {
    after_a_stall_the_peer_reads_its_backlog(3_000_000, Some(2_000_000));
}

/// Moves 256 KiB from A to B while B's host stalls for `stall` ns (from 3 us after the start),
/// then reads the backlog its socket holds by path (as a sender using GSO leaves each path's
/// run at once), one datagram every 90 us (within the short timeout), stalling again for
/// `pause` ns halfway if given; what A sends meanwhile queues behind. Asserts that nothing was
/// declared lost while B read, that everything arrived, and that nothing was sent twice and no
/// path declared failed.
fn after_a_stall_the_peer_reads_its_backlog(stall: u64, pause: Option<u64>) {
    let mut p = writing_256_kib();
    let from = p.now + 3_000;
    while p.now < from {
        p.round(&mut |_, _| false);
    }
    // What reaches B's socket from now on, in order, until B reads it.
    let mut backlog: std::collections::VecDeque<(u16, Vec<u8>)> = Default::default();
    let exchange = |p: &mut Pair, backlog: &mut std::collections::VecDeque<_>| {
        p.transmit();
        for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
            if to_b {
                backlog.push_back((port, bytes));
            } else {
                let _ = p.deliver(false, port, &bytes);
            }
        }
        p.deliver_and_tick(&mut |_, _| false);
    };
    while p.now < from + stall {
        exchange(&mut p, &mut backlog);
    }
    assert!(
        p.a.conn.counters().peer_silent_waits > 0 || p.a.conn.counters().overdue_probes > 0,
        "A probed the silent paths"
    );
    backlog.make_contiguous().sort_by_key(|(port, _)| *port);
    let every = common::config(1, 2).rto_low * 9 / 10;
    let stalled = backlog.len();
    let until = p.now + stalled as u64 * every + pause.unwrap_or(0);
    if pause.is_none() {
        // The last path's first tail probe (its run's data before it) is read after the wait
        // counted from the start of the silence.
        let wait = common::config(1, 2).rto_high * PEER_SILENCE_RTOS;
        let last = backlog.back().map(|(port, _)| *port);
        let probe = backlog
            .iter()
            .position(|(port, d)| Some(*port) == last && data_path(d).is_none())
            .expect("the last path's tail probe");
        assert!(
            p.now + probe as u64 * every > from + wait,
            "the last path's probe ({probe} of {stalled}) is read within the wait"
        );
    }
    let (mut next_read, mut read) = (p.now, 0);
    while p.now < until {
        if p.now >= next_read {
            next_read += every;
            if read == stalled / 2 {
                next_read += pause.unwrap_or(0);
            }
            if let Some((port, bytes)) = backlog.pop_front() {
                let _ = p.deliver(true, port, &bytes);
                read += 1;
            }
        }
        exchange(&mut p, &mut backlog);
    }
    let c = *p.a.conn.counters();
    assert_eq!(
        (c.lost_by_timeout, c.lost_by_sack, c.path_failures),
        (0, 0, 0),
        "while the peer reads its backlog: {c:?}"
    );
    let c = deliver_the_rest_and_complete(&mut p, backlog);
    assert_eq!(
        (c.retransmitted, c.lost_by_timeout, c.path_failures),
        (0, 0, 0),
        "{c:?}"
    );
}

/// A route that dies while the peer catches up is still found: the wait for a peer catching up
/// runs from its last progress, but from no later than one wait into its silence. Here the wait
/// is 3.2 ms (long and short timeouts of 100 us); B stalls for half of it, and path 3's route
/// dies from then on (nothing A sends on it reaches B). B then reads its backlog one datagram
/// every 90 us, acknowledging something for the first time at every read of a data packet, for
/// longer than two waits. Path 3's flight is declared lost before B has read what reached it
/// during the stall (nothing sent after path 3's probes is acknowledged before that), and within
/// two waits of the silence's start and a few timeouts more; the other paths lose nothing.
#[test]
fn a_route_dead_while_the_peer_catches_up_is_found_within_two_waits() {
    use transport_core::path::PathId;
    let mut cfg = [common::config(1, 2), common::config(2, 1)];
    for c in &mut cfg {
        c.rto_high = c.rto_low;
    }
    let wait = cfg[0].rto_high * PEER_SILENCE_RTOS;
    let mut p = Pair::with_configs(cfg[0], cfg[1]);
    p.grant_writes(KEY);
    p.a.conn
        .post(Instant::ZERO, common::write_at(1, 0, 256 * 1024, KEY))
        .unwrap();
    let from = p.now + 3_000;
    while p.now < from {
        p.round(&mut |_, _| false);
    }
    let dead = p.a.conn.path_stats(PathId(3)).expect("path 3").src_port;
    let mut backlog: std::collections::VecDeque<(u16, Vec<u8>)> = Default::default();
    let exchange = |p: &mut Pair, backlog: &mut std::collections::VecDeque<_>| {
        p.transmit();
        for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
            if to_b {
                if port != dead {
                    backlog.push_back((port, bytes));
                }
            } else {
                let _ = p.deliver(false, port, &bytes);
            }
        }
        p.deliver_and_tick(&mut |_, _| false);
    };
    while p.now < from + wait / 2 {
        exchange(&mut p, &mut backlog);
    }
    let mut stalled = backlog.len();
    let every = cfg[0].rto_low * 9 / 10;
    assert!(
        p.now + stalled as u64 * every > from + 2 * wait,
        "the stall's backlog ({stalled}) takes longer than two waits to read"
    );
    let mut next_read = p.now;
    let found = loop {
        if p.a.conn.path_stats(PathId(3)).unwrap().lost > 0 {
            break p.now;
        }
        assert!(
            stalled > 0,
            "B read the stall's backlog first: {:?}",
            p.a.conn.counters()
        );
        if p.now >= next_read {
            next_read += every;
            if let Some((port, bytes)) = backlog.pop_front() {
                let _ = p.deliver(true, port, &bytes);
                stalled -= 1;
            }
        }
        exchange(&mut p, &mut backlog);
    };
    assert!(
        found <= from + 2 * wait + 4 * cfg[0].rto_high,
        "found {} ns after the silence began",
        found.since(from)
    );
    let c = p.a.conn.counters();
    for i in 0..3 {
        assert_eq!(
            p.a.conn.path_stats(PathId(i)).unwrap().lost,
            0,
            "path {i}: {c:?}"
        );
    }
}

/// A host that stalls again and again (a slow or overloaded machine, a runner whose every round
/// runs long) must not put a path's timer off for ever: after eight restarts in a row while the
/// path does not move, its timer runs through the stalls, and a packet that was really lost is
/// found and sent again. (Before the bound, a responder under qemu never timed out its Read
/// responses.)
#[test]
fn a_host_that_stalls_every_round_still_finds_a_loss() {
    let mut p = Pair::granting_writes(KEY);
    let rto_low = common::config(1, 2).rto_low;
    p.a.conn
        .post(Instant::ZERO, common::write_at(1, 0, 1024, KEY))
        .unwrap();
    p.transmit();
    assert_eq!(p.wire.len(), 1);
    p.wire.clear();
    let mut done_at = None;
    for _ in 0..1_000 {
        // Every round comes late, by less than a timeout: each restart alone would keep the
        // timer from ever firing.
        p.now += rto_low * 9 / 10;
        p.a.conn.handle_host_stall(p.now);
        p.round(&mut |_, _| false);
        if p.a.events.iter().any(|e| {
            matches!(e, transport_core::conn::Event::Completion(c)
                if c.id == 1 && c.status == Status::Success)
        }) {
            done_at = Some(p.now);
            break;
        }
    }
    let done_at = done_at.expect("the lost packet is found and the Write completes");
    let c = p.a.conn.counters();
    assert_eq!(c.retransmitted, 1, "{c:?}");
    // The timer runs through the stalls after eight restarts and sends a tail probe; its answer
    // comes after eight more (a probe that left is the path moving): about 18 rounds.
    assert!(
        done_at.since(Instant::ZERO) <= 20 * rto_low,
        "completed at {} ns",
        done_at.since(Instant::ZERO)
    );
}
