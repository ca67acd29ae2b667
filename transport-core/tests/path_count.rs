//! The number of paths: a connection takes as many as its capacity `P` and the wire allow (a
//! path is named by one byte, so 255 at most), and moves data over all of them.

use netsim::pair::{config, write_at, Pair};
use transport_core::conn::{Config, Event, PathId, Status};
use transport_core::time::Instant;

const KEY: u32 = 7;

/// A pair with room for 256 paths, each side asking for `paths`, moving one Write of `packets`
/// packets; returns the paths each side has and how many of A's paths carried data.
fn run(paths: u8, packets: u32) -> (u8, u8, usize) {
    let with = |mut c: Config| {
        c.paths = paths;
        c.window_per_path = 4;
        c
    };
    let mut p: Box<Pair<256, 1024, 1, 8, 2>> =
        Box::new(Pair::with_configs(with(config(1, 2)), with(config(2, 1))));
    p.grant_writes(KEY);
    for (off, b) in p.a.mem.iter_mut().enumerate() {
        *b = (off as u8).wrapping_mul(13);
    }
    p.a.conn
        .post(Instant::ZERO, write_at(1, 0, packets * 1024, KEY))
        .unwrap();
    let done = |p: &Pair<256, 1024, 1, 8, 2>| {
        p.a.events
            .iter()
            .any(|e| matches!(e, Event::Completion(c) if c.id == 1 && c.status == Status::Success))
    };
    for _ in 0..10_000 {
        if done(&p) {
            break;
        }
        p.transmit();
        p.deliver_and_tick(&mut |_, _| false);
    }
    assert!(done(&p), "the Write did not complete");
    let len = (packets * 1024) as usize;
    assert_eq!(p.a.mem[..len], p.b.mem[..len], "every byte arrived");
    let n = p.a.conn.config().paths;
    let used = (0..n)
        .filter(|&i| p.a.conn.path_stats(PathId(i)).unwrap().sent > 0)
        .count();
    (n, p.b.conn.config().paths, used)
}

/// Connections of this size take a few megabytes: built on a thread with room for them.
fn on_big_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn a_connection_with_room_for_256_paths_takes_255() {
    on_big_stack(|| {
        let (a, b, used) = run(255, 600);
        assert_eq!((a, b), (255, 255));
        assert_eq!(used, 255, "every path carries data");
    });
}

#[test]
fn a_path_count_is_at_least_one() {
    on_big_stack(|| {
        let (a, b, used) = run(0, 8);
        assert_eq!((a, b, used), (1, 1, 1));
    });
}
