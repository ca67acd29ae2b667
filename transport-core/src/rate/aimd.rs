//! ECN AIMD on one path's window, and on a connection's (in proportion to the marks).

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

/// `alpha`'s unit: 1024 is 1.0.
pub const CONN_ALPHA_ONE: u32 = 1024;
/// `alpha`'s gain per round trip, 1/16 (DCTCP's g).
const CONN_ALPHA_GAIN_SHIFT: u32 = 4;

/// A connection's ECN AIMD over all its paths, in proportion to the marks (as DCTCP): once per
/// round trip, `alpha <- alpha (1 - g) + g F` with F the share of the round trip's acknowledged
/// packets that came back marked and g = 1/16, and when any was marked the window falls by
/// `alpha / 2`. A mark on every packet halves it, as a path's cut; marks on a few paths (a
/// hot spot that the paths' own windows steer around) take little, so the connection does not
/// collapse while its clear paths have room. Unmarked ACKs add one packet per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnAimd {
    window: u32,
    /// 1/1024 units; starts at 1.0, so the first round trip with marks halves the window.
    alpha: u32,
    acked: u32,
    marked: u32,
    round_at: Option<Instant>,
}

impl ConnAimd {
    /// A connection at `max_window` packets.
    pub fn new(max_window: u32) -> Self {
        ConnAimd {
            window: max_window.max(1).saturating_mul(ONE_PACKET),
            alpha: CONN_ALPHA_ONE,
            acked: 0,
            marked: 0,
            round_at: None,
        }
    }

    /// The window, 1/256 packet units.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// `alpha`, 1/1024 units.
    pub fn alpha(&self) -> u32 {
        self.alpha
    }

    /// An ACK. Returns whether the window was cut (at the end of a round trip with marks).
    pub fn on_ack(&mut self, ack: AckReport, max_window: u32) -> bool {
        let max = max_window.max(1).saturating_mul(ONE_PACKET);
        let n = ack.acked.max(1);
        self.acked = self.acked.saturating_add(n);
        if ack.marked {
            self.marked = self.marked.saturating_add(n);
        } else if ack.acked > 0 && self.window < max {
            let inc = (ack.acked.min(256) * ONE_PACKET * ONE_PACKET / self.window).max(1);
            self.window = (self.window + inc).min(max);
        }
        // A round trip ends after the smoothed RTT; the connection's very first ACK, if marked,
        // ends one at once (a path cuts at its first mark too).
        let first = self.round_at.is_none();
        let start = *self.round_at.get_or_insert(ack.now);
        if !(first && ack.marked) && ack.now.since(start) < ack.srtt {
            return false;
        }
        let f = (u64::from(self.marked) * u64::from(CONN_ALPHA_ONE) / u64::from(self.acked)) as u32;
        self.alpha =
            self.alpha - (self.alpha >> CONN_ALPHA_GAIN_SHIFT) + (f >> CONN_ALPHA_GAIN_SHIFT);
        let cut = self.marked > 0 && self.window > ONE_PACKET;
        if cut {
            let less = (u64::from(self.window) * u64::from(self.alpha)
                / u64::from(2 * CONN_ALPHA_ONE)) as u32;
            self.window = self.window.saturating_sub(less).max(ONE_PACKET);
        }
        self.acked = 0;
        self.marked = 0;
        self.round_at = Some(ack.now);
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // By hand, from DCTCP's equations (Alizadeh et al., SIGCOMM 2010, section 3.1) in this
    // module's units: alpha in 1/1024, g = 1/16, the window in 1/256 packet.
    #[test]
    fn the_connection_cuts_in_proportion_to_the_marks() {
        let mut c = ConnAimd::new(100);
        assert_eq!((c.window(), c.alpha()), (25_600, 1024));
        // The first ACK is marked: a round of F = 1 ends at once, alpha stays 1024 and the
        // window halves: 25600 - 25600 * 1024 / 2048 = 12800.
        assert!(c.on_ack(ack(1, true, 0), 100));
        assert_eq!((c.window(), c.alpha()), (12_800, 1024));
        // The next round (10 us): 8 packets, 2 of them marked. Unmarked ACKs grow the window by
        // 256 * 256 / w each: 12800 -> +5 -> 12805, +5 -> 12810, +5 -> 12815 (six of them, one ack
        // each: 12800 + 6 * 5 = 12830).
        for k in 0..6 {
            assert!(!c.on_ack(ack(1, false, 1_000 + k), 100));
        }
        assert!(!c.on_ack(ack(1, true, 2_000), 100));
        assert_eq!(c.window(), 12_830);
        // The round ends at 10 us with its eighth ACK, marked: F = 2/8 = 256; alpha = 1024 - 64 +
        // 16 = 976; the window falls by 12830 * 976 / 2048 = 6114 -> 6716.
        assert!(c.on_ack(ack(1, true, 10_000), 100));
        assert_eq!((c.alpha(), c.window()), (976, 6_716));
        // A round without marks: alpha decays (976 - 61 = 915), no cut.
        assert!(!c.on_ack(ack(4, false, 15_000), 100));
        assert!(!c.on_ack(ack(4, false, 20_000), 100));
        assert_eq!(c.alpha(), 915);
    }

    #[test]
    fn a_few_marked_paths_take_a_little_each_round() {
        // One packet in sixteen marked, round after round: alpha settles near 1/16 (64) and a
        // round with marks then takes about 3% of the window, where a path's cut takes half.
        let mut c = ConnAimd::new(1000);
        let mut now = 0;
        for _ in 0..200 {
            for k in 0..16 {
                c.on_ack(ack(1, k == 0, now), 1000);
                now += 10_000 / 16;
            }
        }
        assert!((60..=80).contains(&c.alpha()), "{}", c.alpha());
        let before = c.window();
        for k in 0..16 {
            c.on_ack(ack(1, k == 0, now), 1000);
            now += 10_000 / 16;
        }
        let after = c.window();
        assert!(after * 100 >= before * 96, "{before} -> {after}");
    }
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
