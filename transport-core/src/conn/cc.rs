//! Congestion control: what the connection tells its rate controller (`crate::rate`).

use super::*;

impl<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize>
    Connection<P, W, S, Q, R>
{
    /// Reports an ACK of path `i` to the rate controller (packets newly acknowledged, whether
    /// it carried marks, the receiver's rate hint) and counts the cuts (a path's own on the path,
    /// every cut on the connection). The controller's notion of "once
    /// per RTT" is the path's smoothed RTT once there is a sample (it may round to 0 on a local
    /// link), `rto_low` before.
    pub(super) fn congestion(
        &mut self,
        i: usize,
        now: Instant,
        marked: bool,
        acked: u32,
        hint_mbps: u32,
    ) {
        let p = &self.paths[i];
        let srtt = if p.stats.rtt_min > 0 {
            p.srtt
        } else {
            self.cfg.rto_low
        };
        let report = AckReport {
            acked,
            marked,
            srtt,
            now,
            hint_mbps,
        };
        let cuts = self.rate.on_ack(PathId(i as u8), report);
        // A path counts its own cuts; the connection counts every cut of either window.
        if cuts.path {
            self.paths[i].stats.cwnd_cuts += 1;
        }
        if cuts.any() {
            self.counters.cwnd_cuts += 1;
        }
    }
}
