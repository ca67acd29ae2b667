//! ECN AIMD on one path's window.

use crate::time::Instant;

use super::{AckReport, ONE_PACKET};

/// One path's ECN AIMD state: its window (1/256 packet units) and its last cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathAimd {
    window: u32,
    cut_at: Option<Instant>,
}

impl PathAimd {
    /// A path at `max_window` packets.
    pub fn new(max_window: u32) -> Self {
        PathAimd {
            window: max_window.max(1).saturating_mul(ONE_PACKET),
            cut_at: None,
        }
    }

    /// The window, 1/256 packet units.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// A marked ACK halves the window (not below one packet), at most once per `srtt`; an
    /// unmarked one adds `acked` packets' worth of one packet per window (at most a SACK window of
    /// 256 at once), up to `max_window` packets. Returns whether the window was cut.
    pub fn on_ack(&mut self, ack: AckReport, max_window: u32) -> bool {
        let max = max_window.max(1).saturating_mul(ONE_PACKET);
        if ack.marked {
            let due = self.cut_at.is_none_or(|t| ack.now.since(t) >= ack.srtt);
            if self.window > ONE_PACKET && due {
                self.window = (self.window / 2).max(ONE_PACKET);
                self.cut_at = Some(ack.now);
                return true;
            }
        } else if ack.acked > 0 && self.window < max {
            let inc = (ack.acked.min(256) * ONE_PACKET * ONE_PACKET / self.window).max(1);
            self.window = (self.window + inc).min(max);
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::at;

    fn ack(acked: u32, marked: bool, now: u64) -> AckReport {
        AckReport {
            acked,
            marked,
            srtt: 10_000,
            now: at(now),
            hint_mbps: 0,
        }
    }

    #[test]
    fn a_mark_halves_the_window_once_per_rtt_and_never_below_one_packet() {
        let mut p = PathAimd::new(16);
        assert_eq!(p.window(), 16 * 256);
        assert!(p.on_ack(ack(1, true, 1_000), 16));
        assert_eq!(p.window(), 8 * 256);
        // Within the same RTT (10 us): no second cut.
        assert!(!p.on_ack(ack(1, true, 10_999), 16));
        assert_eq!(p.window(), 8 * 256);
        // One RTT later: 4, 2, 1 packets, then no further.
        for (t, w) in [(11_000, 4), (21_000, 2), (31_000, 1), (41_000, 1)] {
            p.on_ack(ack(1, true, t), 16);
            assert_eq!(p.window(), w * 256, "at {t}");
        }
    }

    #[test]
    fn unmarked_acks_add_one_packet_per_window_up_to_the_maximum() {
        let mut p = PathAimd::new(16);
        p.on_ack(ack(1, true, 0), 16);
        assert_eq!(p.window(), 8 * 256);
        // One packet acknowledged at a window of 8: 256 * 256 / 2048 = 32, an eighth of a packet.
        p.on_ack(ack(1, false, 1), 16);
        assert_eq!(p.window(), 8 * 256 + 32);
        // A whole window acknowledged at once adds about one packet (8 * 65536 / 2080 = 252).
        p.on_ack(ack(8, false, 2), 16);
        assert_eq!(p.window(), 8 * 256 + 32 + 252);
        // Never beyond the maximum.
        for t in 3..1000 {
            p.on_ack(ack(256, false, t), 16);
        }
        assert_eq!(p.window(), 16 * 256);
    }
}
