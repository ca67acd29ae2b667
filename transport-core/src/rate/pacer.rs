//! A pacer: a rate turned into departure times.

use crate::time::Instant;

/// Departure times at a rate: each packet leaves no earlier than the previous one plus its bytes
/// at the rate, and a sender that was idle does not save up more than `burst_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Pacer {
    /// When the link is free again at the paced rate, ns.
    next_free: Instant,
}

/// Nanoseconds `bytes` take at `rate_mbps` (rounded up); 0 for an unlimited rate (0).
pub const fn serialisation_ns(bytes: u64, rate_mbps: u32) -> u64 {
    if rate_mbps == 0 {
        return 0;
    }
    // bits / (Mb/s) = bits / (1e6 b/s) s = bits * 1000 / rate ns
    (bytes * 8 * 1_000).div_ceil(rate_mbps as u64)
}

impl Pacer {
    /// When a packet of `bytes` ready at `now` may leave at `rate_mbps` (0: at once); the pacer
    /// books it. A sender that was idle may send `burst_bytes` at once (a token bucket of that
    /// size), then at the rate.
    pub fn depart(
        &mut self,
        now: Instant,
        bytes: u64,
        rate_mbps: u32,
        burst_bytes: u64,
    ) -> Instant {
        let credit = serialisation_ns(burst_bytes.saturating_sub(bytes), rate_mbps);
        let start = self.next_free.max(now.before(credit));
        self.next_free = start + serialisation_ns(bytes, rate_mbps);
        start.max(now)
    }

    /// `bytes` left from `since` on before the rate was known: the pacer books them at
    /// `rate_mbps` from `since`, so that what the sender sent early is paid for before it sends
    /// more (a sender that learns its share after its first window has sent that window already,
    /// and the queue holds what it sent beyond the share).
    pub fn owe(&mut self, since: Instant, bytes: u64, rate_mbps: u32) {
        self.next_free = self
            .next_free
            .max(since + serialisation_ns(bytes, rate_mbps));
    }

    /// When the next packet may leave (the pacer books nothing).
    pub const fn next_free(&self) -> Instant {
        self.next_free
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::at;

    #[test]
    fn packets_leave_one_serialisation_time_apart() {
        // 4096 bytes at 10 Gb/s: 32768 bits / 10000 Mb/s = 3276.8 -> 3277 ns.
        assert_eq!(serialisation_ns(4096, 10_000), 3_277);
        let mut p = Pacer::default();
        let a = p.depart(at(1_000_000), 4096, 10_000, 0);
        let b = p.depart(at(1_000_000), 4096, 10_000, 0);
        let c = p.depart(at(1_000_000), 4096, 10_000, 0);
        assert_eq!((a, b, c), (at(1_000_000), at(1_003_277), at(1_006_554)));
    }

    #[test]
    fn idleness_saves_up_at_most_the_burst() {
        let mut p = Pacer::default();
        p.depart(at(0), 4096, 10_000, 0);
        // Idle for 1 ms, burst of two packets: the first two leave at once, the third waits.
        let t = at(1_000_000);
        let a = p.depart(t, 4096, 10_000, 8192);
        let b = p.depart(t, 4096, 10_000, 8192);
        let c = p.depart(t, 4096, 10_000, 8192);
        assert_eq!((a, b), (t, t));
        assert_eq!(c, t + 3_277);
    }

    #[test]
    fn what_left_before_the_rate_is_paid_for() {
        // Ten 4096-byte packets left from 1 ms on, unpaced; then the rate became 10 Gb/s: they
        // take 32768 ns at it, so the next may leave at 1.032768 ms, not at once.
        let mut p = Pacer::default();
        p.owe(at(1_000_000), 40_960, 10_000);
        assert_eq!(p.depart(at(1_010_000), 4096, 10_000, 0), at(1_032_768));
        // Owing less than what is booked changes nothing.
        p.owe(at(0), 4096, 10_000);
        assert_eq!(p.next_free(), at(1_036_045));
    }

    #[test]
    fn rate_zero_means_unpaced() {
        let mut p = Pacer::default();
        assert_eq!(p.depart(at(5), 1 << 20, 0, 0), at(5));
        assert_eq!(p.depart(at(5), 1 << 20, 0, 0), at(5));
    }
}
