//! The receiver's fair share: its inbound capacity divided among the connections sending to it,
//! max-min over their demands, so that each ACK can carry the sender's share (the rate hint).
//!
//! Units: rates in Mb/s, time in ns. Bounded: at most `N` senders are tracked at once.

use crate::time::Instant;

use heapless::Vec;

/// One sender as the receiver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
struct Sender {
    id: u32,
    demand_mbps: u32,
    last_seen: Instant,
}

/// Why a sender was not taken in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FairShareError {
    /// `N` senders are active already.
    Full,
}

impl core::fmt::Display for FairShareError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("the fair-share table is full")
    }
}

impl core::error::Error for FairShareError {}

/// The fair shares of up to `N` senders into one receiver of `capacity_mbps`.
#[derive(Debug, Clone)]
pub struct FairShare<const N: usize> {
    capacity_mbps: u32,
    /// A sender not heard from for this long gives its share back. ns.
    idle_ns: u64,
    senders: Vec<Sender, N>,
}

impl<const N: usize> FairShare<N> {
    /// A receiver of `capacity_mbps` (its configured line rate) that forgets a sender after
    /// `idle_ns` without hearing from it (a few RTTs).
    pub const fn new(capacity_mbps: u32, idle_ns: u64) -> Self {
        FairShare {
            capacity_mbps,
            idle_ns,
            senders: Vec::new(),
        }
    }

    /// Senders tracked.
    pub fn len(&self) -> usize {
        self.senders.len()
    }

    /// Whether no sender is tracked.
    pub fn is_empty(&self) -> bool {
        self.senders.is_empty()
    }

    /// Sender `id` was heard from at `now`, wanting `demand_mbps` (what it sent lately, or more
    /// when it is held back: the runner's estimate). A new sender is taken in at once.
    pub fn heard(&mut self, id: u32, demand_mbps: u32, now: Instant) -> Result<(), FairShareError> {
        self.expire(now);
        if let Some(s) = self.senders.iter_mut().find(|s| s.id == id) {
            s.demand_mbps = demand_mbps;
            s.last_seen = now;
            return Ok(());
        }
        self.senders
            .push(Sender {
                id,
                demand_mbps,
                last_seen: now,
            })
            .map_err(|_| FairShareError::Full)
    }

    /// Forgets the senders not heard from within `idle_ns` of `now`.
    pub fn expire(&mut self, now: Instant) {
        let idle = self.idle_ns;
        self.senders.retain(|s| now.since(s.last_seen) <= idle);
    }

    /// Sender `id`'s share, Mb/s: max-min fairness over every tracked sender's demand (a sender
    /// that wants less than an equal split gets what it wants, the rest is split among the
    /// others). None for a sender not tracked.
    pub fn share(&self, id: u32) -> Option<u32> {
        let me = self.senders.iter().find(|s| s.id == id)?;
        Some(max_min_share(
            self.capacity_mbps,
            self.senders.iter().map(|s| s.demand_mbps),
            me.demand_mbps,
        ))
    }
}

/// The max-min share of a sender with demand `mine` among `demands` (which include it) on a
/// capacity: the water level L such that sum(min(d, L)) = capacity (or every demand met), then
/// min(mine, L). Integer arithmetic; no allocation.
pub fn max_min_share(capacity: u32, demands: impl Iterator<Item = u32> + Clone, mine: u32) -> u32 {
    // Water-filling without sorting: raise the level to each demand in increasing order of
    // demand, found by scanning for the next larger one.
    let n = demands.clone().count() as u64;
    if n == 0 {
        return 0;
    }
    let mut left = u64::from(capacity);
    let mut level = 0u64;
    loop {
        // The next demand above the current level, and how many senders still want more than
        // the level (a demand of 0 is met before the first step).
        let next = demands.clone().map(u64::from).filter(|&d| d > level).min();
        let Some(next) = next else {
            // Every demand met.
            return mine;
        };
        let above = demands.clone().filter(|&d| u64::from(d) > level).count() as u64;
        // Raising everyone above the level to `next` costs (next - level) each.
        let cost = (next - level) * above;
        if cost > left {
            level += left / above;
            return u64::from(mine).min(level) as u32;
        }
        left -= cost;
        level = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::at;

    #[test]
    fn shares_by_hand() {
        // 100 among demands 10, 50, 80: 10 gets 10; 90 left for two: 45 each.
        let d = [10u32, 50, 80];
        assert_eq!(max_min_share(100, d.iter().copied(), 10), 10);
        assert_eq!(max_min_share(100, d.iter().copied(), 50), 45);
        assert_eq!(max_min_share(100, d.iter().copied(), 80), 45);
        // A sender that wants nothing takes nothing from the others (found by the property test:
        // 343 among 0 and 173 gave 171).
        assert_eq!(max_min_share(343, [0u32, 173].iter().copied(), 173), 173);
        // Everyone met: each gets its demand.
        assert_eq!(max_min_share(1000, d.iter().copied(), 80), 80);
        // Sixteen equal senders on 100 Gb/s: 6250 Mb/s each.
        let d = [u32::MAX; 16];
        assert_eq!(max_min_share(100_000, d.iter().copied(), u32::MAX), 6_250);
    }

    #[test]
    fn a_new_sender_gets_its_share_at_once_and_a_quiet_one_gives_it_back() {
        let mut f: FairShare<8> = FairShare::new(100_000, 50_000);
        f.heard(1, u32::MAX, at(0)).unwrap();
        assert_eq!(f.share(1), Some(100_000));
        f.heard(2, u32::MAX, at(10_000)).unwrap();
        assert_eq!(f.share(1), Some(50_000));
        assert_eq!(f.share(2), Some(50_000));
        // Sender 1 goes quiet; 50 us after it was last heard, 2 gets everything.
        f.heard(2, u32::MAX, at(60_000)).unwrap();
        assert_eq!(f.share(1), None);
        assert_eq!(f.share(2), Some(100_000));
    }

    #[test]
    fn the_table_is_bounded() {
        let mut f: FairShare<2> = FairShare::new(1_000, 1_000_000);
        f.heard(1, 10, at(0)).unwrap();
        f.heard(2, 10, at(0)).unwrap();
        assert_eq!(f.heard(3, 10, at(0)), Err(FairShareError::Full));
        assert_eq!(f.len(), 2);
        // Heard again: an update, not a new entry.
        f.heard(2, 20, at(1)).unwrap();
        assert_eq!(f.share(2), Some(20));
    }
}
