//! Congestion control: ECN AIMD on each path's window.

use super::*;

impl<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize>
    Connection<P, W, S, Q, R>
{
    /// ECN AIMD on path `i`: an ACK reporting marks halves its window, at most once per RTT
    /// (a window's worth of marks is one congestion event); unmarked ACKs add one packet per
    /// window acknowledged.
    pub(super) fn congestion(&mut self, i: usize, now: Instant, marked: bool, acked: u32) {
        let max = self.cfg.window_per_path * CWND_ONE;
        let rto_low = self.cfg.rto_low;
        let p = &mut self.paths[i];
        if marked {
            // The smoothed RTT once there is a sample (it may round to 0 on a local link).
            let rtt = if p.stats.rtt_min > 0 { p.srtt } else { rto_low };
            if p.cwnd > CWND_ONE && p.cwnd_cut_at.is_none_or(|t| now.saturating_sub(t) >= rtt) {
                p.cwnd = (p.cwnd / 2).max(CWND_ONE);
                p.cwnd_cut_at = Some(now);
                p.stats.cwnd_cuts += 1;
                self.counters.cwnd_cuts += 1;
            }
        } else if acked > 0 && p.cwnd < max {
            let inc = (acked.min(PATH_RING as u32) * CWND_ONE * CWND_ONE / p.cwnd).max(1);
            p.cwnd = (p.cwnd + inc).min(max);
        }
    }
}
