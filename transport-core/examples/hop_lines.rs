//! The ping-pong of the conn bench (two connections as the UDP transport configures them, a
//! 2-byte Write with immediate each way, each answer carrying the ACK of its ping), with a store
//! to a marker word before each half hop, so that a memory trace (valgrind's lackey) can be cut
//! into half hops. `scripts/hop-lines.sh` runs it and maps every cache line a half hop touches to
//! the connection's fields.
//!
//! Prints on stderr the marker's address, both connections' addresses, their size and the
//! datagram buffer's address. Usage: `hop_lines [ROUND_TRIPS]` (default 40).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use transport_core::time::Instant as CoreInstant;

#[path = "../benches/common/hop.rs"]
mod hop;
use hop::*;

/// Stored to before each step: 1 and 2 (a sends, b receives), 3 and 4 (b sends, a receives),
/// 9 after a round trip.
static MARK: AtomicU64 = AtomicU64::new(0);

fn mark(step: u64) {
    MARK.store(step, Ordering::SeqCst);
}

fn main() {
    let n: u64 = match std::env::args().nth(1) {
        Some(s) => match s.parse() {
            Ok(n) => n,
            Err(_) => {
                eprintln!("usage: hop_lines [ROUND_TRIPS]");
                std::process::exit(2);
            }
        },
        None => 40,
    };
    let (mut a, mut b) = (end(1, 2), end(2, 1));
    let mut buf = vec![0u8; 8192];
    eprintln!(
        "MARK {:x} A {:x} B {:x} SIZE {} BUF {:x} BUFLEN {}",
        &MARK as *const AtomicU64 as usize,
        &*a as *const HostConn as usize,
        &*b as *const HostConn as usize,
        std::mem::size_of::<HostConn>(),
        buf.as_ptr() as usize,
        buf.len(),
    );
    let mut now = CoreInstant::from_nanos(1_000);
    let mut id = 1u64;
    for _ in 0..n {
        now += 1_000;
        id += 2;
        round_trip_halves(&mut a, &mut b, now, id, |k, from, to, at, id| {
            mark(1 + 2 * k);
            let len = hop_send(from, at, id, &mut buf);
            black_box(from.poll_timeout());
            mark(2 + 2 * k);
            hop_receive(from, to, at, &buf, len);
            black_box(to.poll_timeout());
        });
        mark(9);
    }
}
