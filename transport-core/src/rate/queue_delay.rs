//! The queueing a receiver's data met on the way, from one-way delays: each data packet carries
//! the sender's clock (the low 32 bits of its nanoseconds); the receiver's clock less it is the
//! one-way delay plus the offset between the two clocks. Neither is known alone, but the offset
//! is the same for every packet of a path, so a sample above the least of the recent samples is
//! time the packet spent queued (or on a longer route) beyond the fastest recent packet.
//!
//! "Recent" is a window of `window_ns` (the least over the current and the previous window):
//! clocks drift apart by tens of parts per million, so a least sample kept for ever would turn
//! the drift into a phantom queue (100 ppm is 100 us per second); one kept for 10 ms mistakes at
//! most about a microsecond. A queue that stands for longer than the windows becomes the new
//! floor: the estimate is for queues that come and go (an incast's), not for standing ones.

use crate::time::Instant;

/// One path's one-way delays, wrapping 32-bit nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct QueueDelay {
    window_ns: u64,
    window_at: Instant,
    /// The least sample of the current window and of the previous one.
    current: Option<u32>,
    previous: Option<u32>,
}

/// Whether wrapping sample `a` is below `b` (samples within 2^31 ns of each other).
fn below(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

fn least(a: Option<u32>, b: u32) -> u32 {
    match a {
        Some(a) if below(a, b) => a,
        _ => b,
    }
}

impl QueueDelay {
    /// A path with no sample yet, keeping its least sample over windows of `window_ns`.
    pub const fn new(window_ns: u64) -> Self {
        QueueDelay {
            window_ns,
            window_at: Instant::ZERO,
            current: None,
            previous: None,
        }
    }

    /// A packet stamped `sent` by the sender's clock arrived at `now` by the receiver's: its
    /// delay above the least recent sample, ns (0 for the least); None for the path's first
    /// sample, which has nothing to be compared with (it may have queued as long as any).
    pub fn on_sample(&mut self, now: Instant, sent: u32) -> Option<u32> {
        let first = self.current.is_none() && self.previous.is_none();
        let sample = now.wire_timestamp().wrapping_sub(sent);
        if self.current.is_none() || now.since(self.window_at) >= self.window_ns {
            self.previous = self.current;
            self.current = None;
            self.window_at = now;
        }
        let current = least(self.current, sample);
        self.current = Some(current);
        let floor = least(self.previous, current);
        // A sample below the floor cannot be: the floor takes it above.
        (!first).then(|| sample.wrapping_sub(floor).min(i32::MAX as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::at;

    #[test]
    fn the_delay_above_the_fastest_packet() {
        // The sender's clock is 1 s behind: samples are 1 s plus the way.
        let mut q = QueueDelay::new(10_000_000);
        let behind = |t: u64| (t as u32).wrapping_sub(1_000_000_000);
        assert_eq!(q.on_sample(at(5_000), behind(3_000)), None);
        // 2 us of way, then 7 us: 5 us queued.
        assert_eq!(q.on_sample(at(20_000), behind(13_000)), Some(5_000));
        // A faster packet is the new floor.
        assert_eq!(q.on_sample(at(30_000), behind(29_000)), Some(0));
        assert_eq!(q.on_sample(at(40_000), behind(38_000)), Some(1_000));
    }

    #[test]
    fn the_clocks_wrap() {
        let mut q = QueueDelay::new(10_000_000);
        // The sender's stamp is just below 2^32, the receiver's just past it.
        assert_eq!(q.on_sample(at(1 << 32), u32::MAX - 1_999), None);
        assert_eq!(q.on_sample(at((1 << 32) + 10_000), 2_000), Some(6_000));
    }

    #[test]
    fn drift_is_forgotten_after_two_windows() {
        // The receiver's clock gains 100 ppm: 1 us per 10 ms on a 2 us way.
        let mut q = QueueDelay::new(10_000_000);
        let mut worst = 0;
        for k in 1..=100u64 {
            let now = k * 1_000_000; // every ms, for 100 ms
            let sent = (now - 2_000) as u32;
            let drifted = now + now / 10_000;
            worst = worst.max(q.on_sample(at(drifted), sent).unwrap_or(0));
        }
        // Never more than two windows' drift (2 us), against 10 us kept from the first sample.
        assert!(worst <= 2_000, "{worst}");
        assert!(worst >= 1_000, "{worst}");
    }
}
