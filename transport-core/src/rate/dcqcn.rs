//! DCQCN as RoCEv2 NICs run it (Zhu et al., "Congestion Control for Large-Scale RDMA
//! Deployments", SIGCOMM 2015): the reaction point at the sender, which cuts its rate on a
//! congestion notification packet (CNP) and recovers on a timer and a byte counter, and the
//! notification point at the receiver, which sends at most one CNP per interval per queue pair.
//!
//! Units: rates in Mb/s, time in ns, bytes, and α in 1/1024 (`ALPHA_ONE`).

use crate::time::Instant;

/// α = 1 in its fixed point.
pub const ALPHA_ONE: u32 = 1024;

/// The parameters of DCQCN. Two profiles: [`DcqcnParams::paper`] and [`DcqcnParams::vendor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DcqcnParams {
    /// The line rate, Mb/s: the start rate and the ceiling.
    pub line_mbps: u32,
    /// The lowest rate, Mb/s.
    pub min_mbps: u32,
    /// α's gain g, in 1/1024.
    pub g: u32,
    /// α at the first CNP, in 1/1024.
    pub initial_alpha: u32,
    /// Without a CNP for this long, α decays: α ← (1 − g) α. ns.
    pub alpha_interval_ns: u64,
    /// A cut happens at most once per this period (later CNPs in it are ignored). ns.
    pub min_cut_interval_ns: u64,
    /// The largest cut, in 1/1024 of the rate (512: at most halves).
    pub max_cut: u32,
    /// The rate timer T: one increase event per period without a cut. ns.
    pub rate_timer_ns: u64,
    /// The byte counter B: one increase event per this many bytes sent.
    pub byte_counter: u64,
    /// F: increase events in fast recovery before additive increase.
    pub fast_recovery_steps: u32,
    /// R_AI: the additive increase of the target rate, Mb/s.
    pub ai_mbps: u32,
    /// R_HAI: the hyper increase of the target rate, Mb/s.
    pub hai_mbps: u32,
    /// The notification point's interval: at most one CNP per queue pair per this long. ns.
    pub cnp_interval_ns: u64,
}

impl DcqcnParams {
    /// The paper's authors' simulator (ns3-rdma `mix/config.txt`): CNP interval 50 us, α resume
    /// interval 55 us, rate timer 60 us, byte counter 300 000 B, F = 5, g = 1/256, R_AI = 40 Mb/s,
    /// R_HAI = 200 Mb/s; cuts unbounded but by α/2 (at most a half), any number per interval.
    pub const fn paper(line_mbps: u32) -> Self {
        DcqcnParams {
            line_mbps,
            min_mbps: 1,
            g: 4,
            initial_alpha: ALPHA_ONE,
            alpha_interval_ns: 55_000,
            min_cut_interval_ns: 0,
            max_cut: 512,
            rate_timer_ns: 60_000,
            byte_counter: 300_000,
            fast_recovery_steps: 5,
            ai_mbps: 40,
            hai_mbps: 200,
            cnp_interval_ns: 50_000,
        }
    }

    /// NVIDIA ConnectX firmware defaults (DOCA "DCQCN CC parameters"): dce_tcp_g 1019 (g =
    /// 5/1024), α period 1 us, initial α 1023, rate_reduce_monitor_period 4 us,
    /// rpg_min_dec_fac 50 %, rpg_time_reset 300 us, rpg_byte_reset 32 767 B, rpg_threshold 1,
    /// rpg_ai_rate 5 Mb/s, rpg_hai_rate 50 Mb/s, rpg_min_rate 1 Mb/s, min_time_between_cnps 4 us.
    pub const fn vendor(line_mbps: u32) -> Self {
        DcqcnParams {
            line_mbps,
            min_mbps: 1,
            g: 5,
            initial_alpha: 1023,
            alpha_interval_ns: 1_000,
            min_cut_interval_ns: 4_000,
            max_cut: 512,
            rate_timer_ns: 300_000,
            byte_counter: 32_767,
            fast_recovery_steps: 1,
            ai_mbps: 5,
            hai_mbps: 50,
            cnp_interval_ns: 4_000,
        }
    }
}

/// The reaction point of one queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Dcqcn {
    p: DcqcnParams,
    /// RC, the current rate, Mb/s.
    rc: u32,
    /// RT, the target rate, Mb/s.
    rt: u32,
    /// α, 1/1024.
    alpha: u32,
    /// Timer events since the last cut (T).
    timer_events: u32,
    /// Byte-counter events since the last cut (BC).
    byte_events: u32,
    /// Bytes sent toward the next byte-counter event.
    bytes: u64,
    /// When the rate timer last fired (or was reset by a cut).
    timer_at: Instant,
    /// When α last decayed (or was raised by a CNP).
    alpha_at: Instant,
    /// When the rate was last cut.
    cut_at: Option<Instant>,
}

impl Dcqcn {
    /// A queue pair starting at line rate, with α at its initial value.
    pub const fn new(p: DcqcnParams, now: Instant) -> Self {
        Dcqcn {
            p,
            rc: p.line_mbps,
            rt: p.line_mbps,
            alpha: p.initial_alpha,
            timer_events: 0,
            byte_events: 0,
            bytes: 0,
            timer_at: now,
            alpha_at: now,
            cut_at: None,
        }
    }

    /// The current rate RC, Mb/s.
    pub const fn rate_mbps(&self) -> u32 {
        self.rc
    }

    /// The target rate RT, Mb/s.
    pub const fn target_mbps(&self) -> u32 {
        self.rt
    }

    /// α, 1/1024.
    pub const fn alpha(&self) -> u32 {
        self.alpha
    }

    /// A CNP arrived: RT ← RC; RC ← RC (1 − α/2) (by at most `max_cut`, not below the minimum);
    /// α ← (1 − g) α + g; the timer and the byte counter start over. Returns whether the rate
    /// was cut (not within `min_cut_interval_ns` of the last cut).
    pub fn on_cnp(&mut self, now: Instant) -> bool {
        self.advance(now);
        if self
            .cut_at
            .is_some_and(|t| now.since(t) < self.p.min_cut_interval_ns)
        {
            return false;
        }
        let cut = (self.alpha / 2).min(self.p.max_cut);
        self.rt = self.rc;
        let rc = u64::from(self.rc) * u64::from(ALPHA_ONE - cut) / u64::from(ALPHA_ONE);
        self.rc = (rc as u32).max(self.p.min_mbps);
        self.alpha = ((u64::from(ALPHA_ONE - self.p.g) * u64::from(self.alpha)
            + u64::from(self.p.g) * u64::from(ALPHA_ONE))
            / u64::from(ALPHA_ONE)) as u32;
        self.alpha_at = now;
        self.timer_events = 0;
        self.byte_events = 0;
        self.bytes = 0;
        self.timer_at = now;
        self.cut_at = Some(now);
        true
    }

    /// `bytes` left at `now`: byte-counter events.
    pub fn on_sent(&mut self, now: Instant, bytes: u64) {
        self.advance(now);
        if self.p.byte_counter == 0 {
            return;
        }
        self.bytes += bytes;
        while self.bytes >= self.p.byte_counter {
            self.bytes -= self.p.byte_counter;
            self.byte_events = self.byte_events.saturating_add(1);
            self.increase();
        }
    }

    /// Time passes to `now`: once the queue pair is rate-limited (after its first CNP), α decays
    /// once per α interval without a CNP, and the rate timer fires once per period (each an
    /// increase event).
    pub fn advance(&mut self, now: Instant) {
        if self.cut_at.is_none() {
            // Not rate-limited yet (no CNP so far): at line rate, α not kept.
            self.alpha_at = now;
            self.timer_at = now;
            return;
        }
        if let Some(n) = now
            .since(self.alpha_at)
            .checked_div(self.p.alpha_interval_ns)
        {
            // After enough decays α is 0 whatever it was; no need to step further.
            for _ in 0..n.min(4096) {
                self.alpha = (u64::from(ALPHA_ONE - self.p.g) * u64::from(self.alpha)
                    / u64::from(ALPHA_ONE)) as u32;
            }
            self.alpha_at += n * self.p.alpha_interval_ns;
        }
        if let Some(n) = now.since(self.timer_at).checked_div(self.p.rate_timer_ns) {
            for _ in 0..n.min(4096) {
                self.timer_events = self.timer_events.saturating_add(1);
                self.increase();
            }
            self.timer_at += n * self.p.rate_timer_ns;
        }
    }

    /// One increase event. Fast recovery while both counters are below F: RC ← (RT + RC) / 2.
    /// Hyper increase once both exceed F: RT += R_HAI · (min(T, BC) − F), then the same. Additive
    /// increase otherwise: RT += R_AI, then the same. RT and RC never exceed the line rate.
    fn increase(&mut self) {
        let f = self.p.fast_recovery_steps;
        let (t, bc) = (self.timer_events, self.byte_events);
        if t.max(bc) < f {
            // Fast recovery: RT stays.
        } else if t.min(bc) > f {
            let steps = t.min(bc) - f;
            self.rt = self
                .rt
                .saturating_add(self.p.hai_mbps.saturating_mul(steps))
                .min(self.p.line_mbps);
        } else {
            self.rt = self.rt.saturating_add(self.p.ai_mbps).min(self.p.line_mbps);
        }
        self.rc = ((u64::from(self.rt) + u64::from(self.rc)) / 2) as u32;
    }
}

/// The notification point of one queue pair: a CE-marked arrival asks for a CNP, at most one
/// per `cnp_interval_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CnpGate {
    last: Option<Instant>,
}

impl CnpGate {
    /// A CE-marked packet arrived at `now`: whether to send a CNP.
    pub fn on_marked(&mut self, now: Instant, interval_ns: u64) -> bool {
        if self.last.is_some_and(|t| now.since(t) < interval_ns) {
            return false;
        }
        self.last = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::at;

    // Values computed by hand from the equations of Zhu et al. (SIGCOMM 2015), section 3.3:
    // RC <- RC (1 - a/2), a <- (1 - g) a + g on a CNP; a <- (1 - g) a per interval without one;
    // RC <- (RT + RC) / 2 on each increase event, RT += R_AI or R_HAI outside fast recovery.

    #[test]
    fn a_cnp_cuts_by_half_alpha_and_raises_alpha() {
        let p = DcqcnParams::paper(100_000);
        let mut d = Dcqcn::new(p, at(0));
        assert!(d.on_cnp(at(0)));
        // a = 1: RC = 100000 * (1 - 1/2) = 50000; RT = 100000; a = (1020 * 1024 + 4 * 1024) / 1024.
        assert_eq!(
            (d.rate_mbps(), d.target_mbps(), d.alpha()),
            (50_000, 100_000, 1024)
        );
        // A second CNP at once (no α decay yet): 50000 * (1 - 512/1024) = 25000.
        assert!(d.on_cnp(at(0)));
        assert_eq!(d.rate_mbps(), 25_000);
        assert_eq!(d.target_mbps(), 50_000);
    }

    #[test]
    fn alpha_decays_by_one_minus_g_per_interval() {
        let p = DcqcnParams::paper(100_000);
        let mut d = Dcqcn::new(p, at(0));
        d.on_cnp(at(0));
        // Two intervals of 55 us: 1024 * 1020/1024 = 1020, then 1020 * 1020 / 1024 = 1016.02 -> 1016.
        d.advance(at(110_000));
        assert_eq!(d.alpha(), 1016);
        // A cut now takes a/2 = 508/1024 of the rate.
        let before = d.rate_mbps();
        d.on_cnp(at(110_000));
        assert_eq!(
            d.rate_mbps(),
            (u64::from(before) * (1024 - 508) / 1024) as u32
        );
    }

    #[test]
    fn recovery_runs_fast_then_additive_then_hyper() {
        // Timer only (no bytes sent), F = 5, R_AI = 40, R_HAI = 200, T = 60 us.
        let p = DcqcnParams::paper(100_000);
        let mut d = Dcqcn::new(p, at(0));
        d.on_cnp(at(0)); // RC 50000, RT 100000
        d.advance(at(60_000)); // T = 1 < F: RC = (100000 + 50000) / 2 = 75000
        assert_eq!((d.rate_mbps(), d.target_mbps()), (75_000, 100_000));
        d.advance(at(240_000)); // T = 2..4: 87500, 93750, 96875
        assert_eq!(d.rate_mbps(), 96_875);
        // T = 5 = F (BC = 0 < F): additive, RT = 100000 (clamped at the line), RC = 98437.
        d.advance(at(300_000));
        assert_eq!((d.rate_mbps(), d.target_mbps()), (98_437, 100_000));
        // Below the line to see the increases: cut twice, then run the timer to T = 6 with BC > F.
        let mut d = Dcqcn::new(DcqcnParams::paper(100_000), at(0));
        d.on_cnp(at(0)); // 50000 / RT 100000
        d.on_cnp(at(0)); // 25000 / RT 50000
        d.advance(at(300_000)); // T = 1..5: 37500, 43750, 46875, 48437, then AI: RT 50040, RC 49238
        assert_eq!((d.rate_mbps(), d.target_mbps()), (49_238, 50_040));
        // Six byte-counter events (1.8 MB) at T = 5: BC = 1..6, min(T, BC) <= 5: additive each.
        d.on_sent(at(300_000), 6 * 300_000);
        assert_eq!(d.target_mbps(), 50_040 + 6 * 40);
        // T = 6 with BC = 6: hyper, RT += 200 * (6 - 5).
        let rt = d.target_mbps();
        d.advance(at(360_000));
        assert_eq!(d.target_mbps(), rt + 200);
    }

    #[test]
    fn the_vendor_profile_cuts_once_per_monitor_period_and_never_below_the_minimum() {
        let mut d = Dcqcn::new(DcqcnParams::vendor(25_000), at(0));
        assert!(d.on_cnp(at(10_000)));
        // a = 1023: the cut is 511/1024: 25000 * 513 / 1024 = 12524.
        assert_eq!(d.rate_mbps(), 12_524);
        assert!(!d.on_cnp(at(13_999)), "within 4 us of the last cut");
        assert!(d.on_cnp(at(14_000)));
        for t in 0..200 {
            d.on_cnp(at(14_000 + 4_000 * (t + 1)));
        }
        assert!(d.rate_mbps() >= 1);
    }

    #[test]
    fn the_notification_point_sends_one_cnp_per_interval() {
        let mut g = CnpGate::default();
        assert!(g.on_marked(at(0), 50_000));
        assert!(!g.on_marked(at(49_999), 50_000));
        assert!(g.on_marked(at(50_000), 50_000));
    }
}
