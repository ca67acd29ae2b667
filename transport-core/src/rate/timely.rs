//! Timely (Mittal et al., "TIMELY: RTT-based Congestion Control for the Datacenter", SIGCOMM
//! 2015, Algorithm 1): the sender's rate follows the gradient of the RTT.
//!
//! Units: rates in Mb/s, time in ns, weights and gradients in 1/1024.

/// 1 in the fixed point of weights and gradients.
pub const FRAC_ONE: i64 = 1024;

/// Timely's parameters (the paper's Table 1 where it gives them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TimelyParams {
    /// The line rate, Mb/s: the start rate and the ceiling.
    pub line_mbps: u32,
    /// The lowest rate, Mb/s.
    pub min_mbps: u32,
    /// T_low: below it, the rate grows additively whatever the gradient. ns.
    pub t_low_ns: u64,
    /// T_high: above it, the rate is cut in proportion to how far. ns.
    pub t_high_ns: u64,
    /// The minimum RTT that normalises the gradient. ns.
    pub min_rtt_ns: u64,
    /// α, the EWMA weight of a new RTT difference, 1/1024.
    pub alpha: i64,
    /// β, the multiplicative decrease factor, 1/1024.
    pub beta: i64,
    /// δ, the additive increase, Mb/s.
    pub delta_mbps: u32,
    /// Completions with a gradient at or below zero before hyper-active increase (N = 5).
    pub hai_after: u32,
}

impl TimelyParams {
    /// The paper's values: T_low 50 us, T_high 500 us, minRTT 20 us, α 0.875, β 0.8, δ 10 Mb/s,
    /// N = 5.
    pub const fn paper(line_mbps: u32) -> Self {
        TimelyParams {
            line_mbps,
            min_mbps: 1,
            t_low_ns: 50_000,
            t_high_ns: 500_000,
            min_rtt_ns: 20_000,
            alpha: 896,
            beta: 819,
            delta_mbps: 10,
            hai_after: 5,
        }
    }
}

/// One sender's Timely state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Timely {
    p: TimelyParams,
    rate: u32,
    prev_rtt: Option<u64>,
    /// The smoothed RTT difference, ns (signed).
    rtt_diff: i64,
    /// Completions in a row with a gradient at or below zero.
    calm: u32,
}

impl Timely {
    /// A sender at line rate.
    pub const fn new(p: TimelyParams) -> Self {
        Timely {
            p,
            rate: p.line_mbps,
            prev_rtt: None,
            rtt_diff: 0,
            calm: 0,
        }
    }

    /// The rate, Mb/s.
    pub const fn rate_mbps(&self) -> u32 {
        self.rate
    }

    /// The smoothed RTT difference, ns.
    pub const fn rtt_diff_ns(&self) -> i64 {
        self.rtt_diff
    }

    /// A completion with RTT `rtt_ns`. The first sample only sets the reference.
    pub fn on_rtt(&mut self, rtt_ns: u64) {
        let Some(prev) = self.prev_rtt.replace(rtt_ns) else {
            return;
        };
        let new_diff = rtt_ns as i64 - prev as i64;
        self.rtt_diff =
            ((FRAC_ONE - self.p.alpha) * self.rtt_diff + self.p.alpha * new_diff) / FRAC_ONE;
        let gradient = self.rtt_diff * FRAC_ONE / self.p.min_rtt_ns.max(1) as i64;
        let rate = i64::from(self.rate);
        let new = if rtt_ns < self.p.t_low_ns {
            self.calm = 0;
            rate + i64::from(self.p.delta_mbps)
        } else if rtt_ns > self.p.t_high_ns {
            self.calm = 0;
            // rate (1 - β (1 - T_high / rtt))
            let over = FRAC_ONE - self.p.t_high_ns as i64 * FRAC_ONE / rtt_ns as i64;
            rate * (FRAC_ONE * FRAC_ONE - self.p.beta * over) / (FRAC_ONE * FRAC_ONE)
        } else if gradient <= 0 {
            self.calm = self.calm.saturating_add(1);
            let n = if self.calm >= self.p.hai_after { 5 } else { 1 };
            rate + n * i64::from(self.p.delta_mbps)
        } else {
            self.calm = 0;
            // rate (1 - β gradient), not below zero
            let cut = (self.p.beta * gradient / FRAC_ONE).min(FRAC_ONE);
            rate * (FRAC_ONE - cut) / FRAC_ONE
        };
        self.rate = new.clamp(i64::from(self.p.min_mbps), i64::from(self.p.line_mbps)) as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // By hand from Algorithm 1 of the paper with its parameters (α 0.875 = 896/1024, β 0.8 =
    // 819/1024, δ 10 Mb/s, minRTT 20 us, T_low 50 us, T_high 500 us).

    #[test]
    fn a_low_rtt_adds_delta() {
        let mut t = Timely::new(TimelyParams::paper(10_000));
        t.on_rtt(30_000);
        t.on_rtt(40_000);
        // rtt 40 us < T_low: +10, clamped at the line.
        assert_eq!(t.rate_mbps(), 10_000);
        let mut t = Timely::new(TimelyParams::paper(10_000));
        t.rate = 5_000;
        t.on_rtt(30_000);
        t.on_rtt(40_000);
        assert_eq!(t.rate_mbps(), 5_010);
    }

    #[test]
    fn a_rising_rtt_cuts_by_beta_times_the_normalised_gradient() {
        let mut t = Timely::new(TimelyParams::paper(10_000));
        t.on_rtt(100_000);
        t.on_rtt(110_000);
        // diff = 896 * 10000 / 1024 = 8750 ns; gradient = 8750 * 1024 / 20000 = 448 (0.4375);
        // cut = 819 * 448 / 1024 = 358; rate = 10000 * (1024 - 358) / 1024 = 6503.
        assert_eq!(t.rtt_diff_ns(), 8_750);
        assert_eq!(t.rate_mbps(), 6_503);
    }

    #[test]
    fn a_high_rtt_cuts_in_proportion_to_how_far_above_t_high() {
        let mut t = Timely::new(TimelyParams::paper(10_000));
        t.on_rtt(1_000_000);
        t.on_rtt(1_000_000);
        // 1 - T_high/rtt = 1 - 512/1024; rate = 10000 (1 - 819 * 512 / 1024^2) = 6000.9 -> 6000.
        assert_eq!(t.rate_mbps(), 6_000);
    }

    #[test]
    fn five_calm_completions_switch_to_hyper_increase() {
        let mut t = Timely::new(TimelyParams::paper(10_000));
        t.rate = 1_000;
        t.on_rtt(100_000);
        for i in 1..=6 {
            t.on_rtt(100_000);
            let want = if i < 5 {
                1_000 + 10 * i
            } else {
                1_040 + 50 * (i - 4)
            };
            assert_eq!(t.rate_mbps(), want, "completion {i}");
        }
    }
}
