//! Swift (Kumar et al., "Swift: Delay is Simple and Effective for Congestion Control in the
//! Datacenter", SIGCOMM 2020, Algorithm 1): a window kept against a target delay that grows with
//! the hops of the path and shrinks as the window grows (flow scaling).
//!
//! Units: windows in 1/256 packet ([`super::ONE_PACKET`]), time in ns, factors in 1/1024.

use crate::time::Instant;

use super::ONE_PACKET;

/// 1 in the fixed point of factors.
pub const FACTOR_ONE: u64 = 1024;

/// Swift's parameters. The defaults are uet-htsim's (`htsim/sim/swift.cpp`), which the paper's
/// structure with values the paper does not publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SwiftParams {
    /// The base target delay. ns.
    pub base_target_ns: u64,
    /// h: target delay added per hop. ns.
    pub per_hop_ns: u64,
    /// fs_range: the most flow scaling adds. ns.
    pub fs_range_ns: u64,
    /// fs_min_cwnd and fs_max_cwnd: the windows between which flow scaling runs, 1/256 packet.
    pub fs_min_cwnd: u32,
    /// See `fs_min_cwnd`.
    pub fs_max_cwnd: u32,
    /// ai: the additive increase per window acknowledged, 1/256 packet.
    pub ai: u32,
    /// β: the multiplicative decrease gain, 1/1024.
    pub beta: u64,
    /// max_mdf: the largest decrease at once, 1/1024.
    pub max_mdf: u64,
    /// The window's bounds, 1/256 packet.
    pub min_cwnd: u32,
    /// See `min_cwnd`.
    pub max_cwnd: u32,
}

impl SwiftParams {
    /// htsim's values: base target 20 us, h = base / 6.55 (3053 ns), fs_range 5 x base,
    /// fs_min_cwnd 0.1 packet, fs_max_cwnd 100 packets, ai 1 packet, β 0.8, max_mdf 0.5; a window
    /// of 1/256 to `max_packets` packets.
    pub const fn htsim(max_packets: u32) -> Self {
        SwiftParams {
            base_target_ns: 20_000,
            per_hop_ns: 3_053,
            fs_range_ns: 100_000,
            fs_min_cwnd: 26,
            fs_max_cwnd: 100 * ONE_PACKET,
            ai: ONE_PACKET,
            beta: 819,
            max_mdf: 512,
            min_cwnd: 1,
            max_cwnd: max_packets.saturating_mul(ONE_PACKET),
        }
    }
}

/// floor(sqrt(x)).
const fn isqrt(x: u64) -> u64 {
    if x < 2 {
        return x;
    }
    let mut r = 1u64 << ((64 - x.leading_zeros()).div_ceil(2));
    loop {
        let next = (r + x / r) / 2;
        if next >= r {
            return r;
        }
        r = next;
    }
}

/// 1/sqrt(w) for a window `w` in 1/256 packet, as a 1/65536 fraction: 65536 * 16 / sqrt(w).
fn inv_sqrt(w: u32) -> u64 {
    (65_536 * 16) / isqrt(u64::from(w.max(1)))
}

/// One sender's Swift state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Swift {
    p: SwiftParams,
    cwnd: u32,
    decreased_at: Option<Instant>,
}

impl Swift {
    /// A sender at its largest window.
    pub const fn new(p: SwiftParams) -> Self {
        Swift {
            p,
            cwnd: p.max_cwnd,
            decreased_at: None,
        }
    }

    /// The window, 1/256 packet.
    pub const fn cwnd(&self) -> u32 {
        self.cwnd
    }

    /// The target delay for a path of `hops` at the current window: base + hops h +
    /// clamp(α / sqrt(cwnd) + β', 0, fs_range), with α = fs_range / (1/sqrt(fs_min) −
    /// 1/sqrt(fs_max)) and β' = −α / sqrt(fs_max).
    pub fn target_ns(&self, hops: u32) -> u64 {
        let range = self.p.fs_range_ns;
        let (lo, hi) = (inv_sqrt(self.p.fs_min_cwnd), inv_sqrt(self.p.fs_max_cwnd));
        let span = lo.saturating_sub(hi).max(1);
        // fs = range (1/sqrt(cwnd) - 1/sqrt(fs_max)) / (1/sqrt(fs_min) - 1/sqrt(fs_max))
        let fs = range * inv_sqrt(self.cwnd).saturating_sub(hi) / span;
        self.p.base_target_ns + u64::from(hops) * self.p.per_hop_ns + fs.min(range)
    }

    /// An ACK of `acked` packets with delay `delay_ns` on a path of `hops`, at `now`, on a
    /// connection whose RTT is `rtt_ns`. Below the target the window grows by ai per window
    /// (ai x acked when below one packet); at or above it, at most once per RTT, it shrinks by
    /// β (delay − target) / delay, at most max_mdf. Returns whether it shrank.
    pub fn on_ack(
        &mut self,
        now: Instant,
        acked: u32,
        delay_ns: u64,
        hops: u32,
        rtt_ns: u64,
    ) -> bool {
        let target = self.target_ns(hops);
        if delay_ns < target {
            let a = u64::from(acked);
            let inc = if self.cwnd >= ONE_PACKET {
                (u64::from(self.p.ai) * a * u64::from(ONE_PACKET) / u64::from(self.cwnd)).max(1)
            } else {
                u64::from(self.p.ai) * a
            };
            self.cwnd = (u64::from(self.cwnd) + inc).min(u64::from(self.p.max_cwnd)) as u32;
            return false;
        }
        if self.decreased_at.is_some_and(|t| now.since(t) < rtt_ns) {
            return false;
        }
        let cut = (self.p.beta * (delay_ns - target) / delay_ns.max(1)).min(self.p.max_mdf);
        let w = u64::from(self.cwnd) * (FACTOR_ONE - cut) / FACTOR_ONE;
        self.cwnd = (w as u32).max(self.p.min_cwnd);
        self.decreased_at = Some(now);
        true
    }

    /// A retransmission timeout: the window falls to its minimum (Algorithm 1's retransmit
    /// timer with its retransmit count over the threshold, taken at once here).
    pub fn on_timeout(&mut self) {
        self.cwnd = self.p.min_cwnd;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::at;

    #[test]
    fn isqrt_is_the_floor_of_the_square_root() {
        for x in [
            0u64,
            1,
            2,
            3,
            4,
            15,
            16,
            17,
            255,
            256,
            25_600,
            u64::from(u32::MAX),
        ] {
            let r = isqrt(x);
            assert!(r * r <= x && (r + 1) * (r + 1) > x, "{x}: {r}");
        }
    }

    #[test]
    fn the_target_grows_with_hops_and_shrinks_as_the_window_grows() {
        // htsim values, by hand: at the largest flow-scaling window (100 packets) fs = 0; at
        // 1 packet, 1/sqrt(1) = 65536/65536: fs = 100000 (65536 - 6553) / (209715 - 6553) =
        // 29032, where 1/sqrt(0.1 packet) = 1048576 / isqrt(26) = 209715 and 1/sqrt(100) = 6553.
        let s = Swift::new(SwiftParams::htsim(100));
        assert_eq!(s.target_ns(0), 20_000);
        assert_eq!(s.target_ns(3), 20_000 + 3 * 3_053);
        let mut one = s;
        one.cwnd = ONE_PACKET;
        let (lo, hi) = (209_715u64, 6_553u64);
        assert_eq!(inv_sqrt(26), lo);
        assert_eq!(inv_sqrt(100 * 256), hi);
        assert_eq!(one.target_ns(0), 20_000 + 29_032);
        assert_eq!(100_000 * (65_536 - hi) / (lo - hi), 29_032);
        assert!(one.target_ns(0) > s.target_ns(0));
    }

    #[test]
    fn below_the_target_the_window_grows_by_ai_per_window() {
        let mut s = Swift::new(SwiftParams::htsim(100));
        s.cwnd = 10 * ONE_PACKET;
        // One packet acknowledged at 10 packets: + 256 * 256 / 2560 = 25.6 -> 25.
        assert!(!s.on_ack(at(0), 1, 10_000, 0, 50_000));
        assert_eq!(s.cwnd(), 10 * 256 + 25);
        // Below one packet: ai x acked.
        s.cwnd = 128;
        s.on_ack(at(0), 1, 10_000, 0, 50_000);
        assert_eq!(s.cwnd(), 128 + 256);
    }

    #[test]
    fn above_the_target_it_shrinks_once_per_rtt_by_at_most_max_mdf() {
        let mut s = Swift::new(SwiftParams::htsim(100));
        // At 100 packets the target is 20 us. Delay 40 us: cut = 819 * 20000 / 40000 = 409;
        // cwnd = 25600 * 615 / 1024 = 15375.
        assert!(s.on_ack(at(1_000), 1, 40_000, 0, 50_000));
        assert_eq!(s.cwnd(), 15_375);
        assert!(
            !s.on_ack(at(50_999), 1, 400_000, 0, 50_000),
            "within one RTT"
        );
        // A huge delay cuts by max_mdf (a half): 15375 * 512 / 1024 = 7687.
        assert!(s.on_ack(at(51_000), 1, 10_000_000, 0, 50_000));
        assert_eq!(s.cwnd(), 7_687);
    }
}
