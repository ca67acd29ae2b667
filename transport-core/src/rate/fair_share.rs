//! The receiver's fair share: its inbound capacity divided among the connections sending to it,
//! max-min over their demands, so that each ACK can carry the sender's share (the rate hint).
//!
//! Units: rates in Mb/s, time in ns. Bounded: at most `N` senders are tracked at once.

use crate::rate::serialisation_ns;
use crate::time::Instant;

use heapless::Vec;

/// One sender as the receiver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
struct Sender {
    id: u32,
    demand_mbps: u32,
    last_seen: Instant,
    /// The demand's measurement ([`FairShare::received`]): bytes since `since`.
    since: Instant,
    bytes: u64,
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

/// A sender is quiet once it has been silent for this many of its packet gaps at its share (a
/// sender paced at its share sends one packet per gap; one held by its window sends a window's
/// packets together and then waits: at four gaps, 64 senders held by windows of a few packets
/// behind a queue were dropped between their bursts and the others given more than the line).
pub const QUIET_GAPS: u64 = 8;

/// A sender's demand is measured over at least this many of its packet gaps at its share: a
/// count of sixteen packets tells a sender held at its share (one packet more or less) from one
/// that sends three quarters of it.
pub const MEASURE_GAPS: u64 = 16;
/// A sender that sends at least this share of its share (3/4) is held back by it.
pub const HELD: (u64, u64) = (3, 4);
/// A sender held back by its application wants what it sends and this much more (1/4).
pub const GROWTH: (u64, u64) = (1, 4);

/// The most senders of other runners a table counts (see [`FairShare::set_others`]).
pub const MAX_OTHERS: u32 = 1 << 16;

/// The fair shares of up to `N` senders into one receiver of `capacity_mbps`.
#[derive(Debug, Clone)]
pub struct FairShare<const N: usize> {
    capacity_mbps: u32,
    /// A sender not heard from for this long (or [`QUIET_GAPS`] of its packet gaps, if longer)
    /// gives its share back. ns.
    idle_ns: u64,
    /// The senders' packet size, bytes (their gaps at a share).
    packet_bytes: u32,
    drain: Option<Drain>,
    /// Senders of other runners on the same receiver (other processes or threads sharing its
    /// line): how many want all they can get, and what the rest want together, Mb/s.
    others_unbounded: u32,
    others_mbps: u64,
    /// Until when the first windows of the senders taken in may still be in the queue: the
    /// drain holds off until then (see [`Drain`]).
    first_windows_until: Instant,
    /// The queueing delay the receiver's data last met, ns (see [`Drain`]), and when.
    queue_ns: u64,
    queue_at: Instant,
    senders: Vec<Sender, N>,
}

/// Draining the queue in front of the receiver: while its data meets more than `target_ns` of
/// queueing delay, the capacity shared out falls below the line in proportion,
/// `capacity (1 - (q - target) / horizon)`, down to [`DRAIN_FLOOR`] of it, so that the senders
/// together send less than the line drains and the queue empties in about `horizon_ns`. Shares
/// at exactly the line would hold any queue the senders built before their first hint (an
/// incast's first round trip) for as long as they send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Drain {
    /// Queueing delay left alone, ns.
    pub target_ns: u64,
    /// The time the queue above the target takes to drain, ns (at least 1).
    pub horizon_ns: u64,
    /// The least share of the line it leaves, 1/1024 (at most 1024).
    pub floor: u16,
    /// What a sender sends before its first hint (its first window), bytes: the drain holds
    /// off while the line may still be carrying the first windows of the senders that arrived
    /// (each new sender adds its first window's time at the line rate). Those senders pay for
    /// their first windows at their hints before they send again, which drains that queue; a
    /// drain on top would have them pay twice over, and the line go idle.
    pub first_window_bytes: u64,
}

impl<const N: usize> FairShare<N> {
    /// A receiver of `capacity_mbps` (its configured line rate) whose senders send packets of
    /// `packet_bytes`. It forgets a sender silent for `idle_ns` (a few RTTs) or for
    /// [`QUIET_GAPS`] packets at its share, whichever is longer: a sender paced at a small share
    /// is silent between its packets for longer than a round trip, and one that stopped gives
    /// its share back after a few of those gaps, not after a fixed time sized for the smallest
    /// share.
    pub const fn new(capacity_mbps: u32, idle_ns: u64, packet_bytes: u32) -> Self {
        FairShare {
            capacity_mbps,
            idle_ns,
            packet_bytes,
            drain: None,
            others_unbounded: 0,
            others_mbps: 0,
            first_windows_until: Instant::ZERO,
            queue_ns: 0,
            queue_at: Instant::ZERO,
            senders: Vec::new(),
        }
    }

    /// The same receiver, draining the queue in front of it ([`Drain`]).
    pub const fn with_drain(mut self, drain: Drain) -> Self {
        self.drain = Some(drain);
        self
    }

    /// The queueing delay the receiver's data met lately, ns (a one-way delay above its least,
    /// [`crate::rate::QueueDelay`]): the drain's input.
    pub fn set_queue_delay(&mut self, now: Instant, ns: u64) {
        self.queue_ns = ns;
        self.queue_at = now;
    }

    /// The senders that other runners on the same receiver track (other processes or engines
    /// whose connections arrive over the same line): `unbounded` of them want all they can get,
    /// the rest want `bounded_mbps` together. They count in the water level as senders of this
    /// table's own: the unbounded ones at the level, the others at their demands, which are taken
    /// to be met (they are under their shares where they were measured).
    pub fn set_others(&mut self, unbounded: u32, bounded_mbps: u64) {
        // Another runner's counts come from outside this one: no more senders than a receiver
        // can have, no more demand than the line.
        self.others_unbounded = unbounded.min(MAX_OTHERS);
        self.others_mbps = bounded_mbps.min(u64::from(self.capacity_mbps));
    }

    /// What this table's own senders want, for other runners' [`FairShare::set_others`]: how
    /// many want all they can get, and what the others want together, Mb/s.
    pub fn summary(&self) -> (u32, u64) {
        let unbounded = self
            .senders
            .iter()
            .filter(|s| s.demand_mbps == u32::MAX)
            .count() as u32;
        let bounded = self
            .senders
            .iter()
            .filter(|s| s.demand_mbps != u32::MAX)
            .map(|s| u64::from(s.demand_mbps))
            .sum();
        (unbounded, bounded)
    }

    /// The capacity shared out now, Mb/s: the line, less the drain's cut.
    pub fn capacity_now_mbps(&self) -> u32 {
        let c = u64::from(self.capacity_mbps);
        let Some(d) = self.drain else {
            return self.capacity_mbps;
        };
        if self.queue_at < self.first_windows_until {
            return self.capacity_mbps;
        }
        let over = self.queue_ns.saturating_sub(d.target_ns);
        let cut = over.saturating_mul(1024) / d.horizon_ns.max(1);
        let frac = 1024u64
            .saturating_sub(cut)
            .max(u64::from(d.floor.min(1024)));
        (c * frac / 1024) as u32
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
                since: now,
                bytes: 0,
            })
            .map_err(|_| FairShareError::Full)?;
        self.first_window(now);
        Ok(())
    }

    /// `bytes` of sender `id`'s data arrived by `now` (since its last call): its demand is
    /// estimated from what it sends. A new sender wants all it can get and has its share at
    /// once. Then, over each interval of at least `idle_ns` or [`QUIET_GAPS`] of its packet gaps
    /// at its share: a sender that sent at least [`HELD`] of its share is held back by it and
    /// wants more than it was given (unbounded); one that sent less wants what it sent and
    /// [`GROWTH`] more, so that a sender the application holds back leaves the rest of the
    /// line to the others and still finds room to grow (a full share once it uses what it has).
    pub fn received(&mut self, id: u32, bytes: u64, now: Instant) -> Result<(), FairShareError> {
        self.expire(now);
        let level = self.level_mbps();
        let (idle, packet) = (self.idle_ns, u64::from(self.packet_bytes));
        let Some(s) = self.senders.iter_mut().find(|s| s.id == id) else {
            self.senders
                .push(Sender {
                    id,
                    demand_mbps: u32::MAX,
                    last_seen: now,
                    since: now,
                    bytes,
                })
                .map_err(|_| FairShareError::Full)?;
            self.first_window(now);
            return Ok(());
        };
        s.last_seen = now;
        s.bytes = s.bytes.saturating_add(bytes);
        let share = s.demand_mbps.min(level);
        let interval = idle.max(MEASURE_GAPS.saturating_mul(serialisation_ns(packet, share)));
        let dt = now.since(s.since);
        if dt > interval.max(1).saturating_mul(2) {
            // Silent for most of the interval, then back: a sender paying for its first window
            // at its hint, or stalled. Silence says nothing of what it wants (a demand cut for
            // it would cut its hint, and lengthen a debt booked at the hint): measure afresh.
            s.since = now;
            s.bytes = bytes;
        } else if dt >= interval.max(1) {
            // bytes * 8 bits / dt ns is Gb/s; Mb/s is a thousand times that.
            let rate = (u128::from(s.bytes) * 8_000 / u128::from(dt)).min(u128::from(u32::MAX));
            let rate = rate as u64;
            s.demand_mbps = if rate * HELD.1 >= u64::from(share) * HELD.0 {
                u32::MAX
            } else {
                (rate + rate * GROWTH.0 / GROWTH.1).clamp(1, u64::from(u32::MAX - 1)) as u32
            };
            s.since = now;
            s.bytes = 0;
        }
        Ok(())
    }

    /// A new sender at `now`: its first window, sent before any hint, joins those before it in
    /// the queue, and the drain holds off for the line to carry it (see [`Drain`]).
    fn first_window(&mut self, now: Instant) {
        if let Some(d) = self.drain {
            let take = serialisation_ns(d.first_window_bytes, self.capacity_mbps);
            self.first_windows_until = self.first_windows_until.max(now) + take;
        }
    }

    /// Forgets the senders silent since before `now` less `idle_ns` or [`QUIET_GAPS`] of their
    /// packet gaps at their share, whichever is longer.
    pub fn expire(&mut self, now: Instant) {
        let level = self.level_mbps();
        let (idle, packet) = (self.idle_ns, u64::from(self.packet_bytes));
        self.senders.retain(|s| {
            let share = s.demand_mbps.min(level);
            // A sender with no share (a zero demand) is kept for `idle_ns` only.
            let gaps = QUIET_GAPS.saturating_mul(serialisation_ns(packet, share));
            now.since(s.last_seen) <= idle.max(gaps)
        });
    }

    /// The water level over the tracked senders, Mb/s: every sender's share is the lesser of
    /// its demand and this (`u32::MAX` while every demand is met).
    pub fn level_mbps(&self) -> u32 {
        let capacity = u64::from(self.capacity_now_mbps()).saturating_sub(self.others_mbps);
        water_level_with(
            capacity.max(1) as u32,
            self.senders.iter().map(|s| s.demand_mbps),
            u64::from(self.others_unbounded),
        )
        .map_or(u32::MAX, |l| l.min(u64::from(u32::MAX)) as u32)
    }

    /// Sender `id`'s share, Mb/s: max-min fairness over every tracked sender's demand (a sender
    /// that wants less than an equal split gets what it wants, the rest is split among the
    /// others), at least 1 (a hint of 0 means none: a sender given 0 would run unpaced). None
    /// for a sender not tracked.
    pub fn share(&self, id: u32) -> Option<u32> {
        self.share_at(id, self.level_mbps())
    }

    /// [`FairShare::share`] at a water level from [`FairShare::level_mbps`], for a runner that
    /// hands out every sender's share at once (one level, not one per sender).
    pub fn share_at(&self, id: u32, level_mbps: u32) -> Option<u32> {
        let me = self.senders.iter().find(|s| s.id == id)?;
        Some(me.demand_mbps.min(level_mbps).max(1))
    }
}

/// The max-min share of a sender with demand `mine` among `demands` (which include it) on a
/// capacity: the water level L such that sum(min(d, L)) = capacity (or every demand met), then
/// min(mine, L). Integer arithmetic; no allocation.
pub fn max_min_share(capacity: u32, demands: impl Iterator<Item = u32> + Clone, mine: u32) -> u32 {
    if demands.clone().next().is_none() {
        return 0;
    }
    match water_level(capacity, demands) {
        Some(level) => u64::from(mine).min(level) as u32,
        None => mine,
    }
}

/// The water level L of `capacity` over `demands`: sum(min(d, L)) = capacity; None when the
/// capacity meets every demand (or there is none).
fn water_level(capacity: u32, demands: impl Iterator<Item = u32> + Clone) -> Option<u64> {
    water_level_with(capacity, demands, 0)
}

/// [`water_level`] with `extra` more senders that want all they can get (`u32::MAX`), counted
/// rather than listed.
fn water_level_with(
    capacity: u32,
    demands: impl Iterator<Item = u32> + Clone,
    extra: u64,
) -> Option<u64> {
    const ALL: u64 = u32::MAX as u64;
    // Water-filling without sorting: raise the level to each demand in increasing order of
    // demand, found by scanning for the next larger one.
    let mut left = u64::from(capacity);
    let mut level = 0u64;
    loop {
        // The next demand above the current level, and how many senders still want more than
        // the level (a demand of 0 is met before the first step).
        let own = demands.clone().map(u64::from).filter(|&d| d > level).min();
        let extra_above = if level < ALL { extra } else { 0 };
        let next = match own {
            Some(n) => n,
            None if extra_above > 0 => ALL,
            None => return None,
        };
        let above = (demands.clone().filter(|&d| u64::from(d) > level).count() as u64)
            .saturating_add(extra_above);
        // Raising everyone above the level to `next` costs (next - level) each.
        let cost = (next - level).saturating_mul(above);
        if cost > left {
            return Some(level + left / above);
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
        let mut f: FairShare<8> = FairShare::new(100_000, 50_000, 4096);
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

    /// A target of 2 us, a horizon of 40 us, a floor of an eighth, first windows as given.
    fn drain(first_window_bytes: u64) -> Drain {
        Drain {
            target_ns: 2_000,
            horizon_ns: 40_000,
            floor: 128,
            first_window_bytes,
        }
    }

    #[test]
    fn a_queue_in_front_drains() {
        // 100 Gb/s, 4 senders; a target of 2 us and a horizon of 40 us.
        let mut f: FairShare<8> = FairShare::new(100_000, 50_000, 4096).with_drain(drain(0));
        for id in 0..4 {
            f.heard(id, u32::MAX, at(0)).unwrap();
        }
        assert_eq!(f.share(0), Some(25_000));
        // At the target: the whole line.
        f.set_queue_delay(at(0), 2_000);
        assert_eq!(f.share(0), Some(25_000));
        // 10 us above it: 1 - 10/40 of the line, 1024 - 256 = 768/1024 = 75 Gb/s, 18.75 each.
        f.set_queue_delay(at(0), 12_000);
        assert_eq!(f.capacity_now_mbps(), 75_000);
        assert_eq!(f.share(0), Some(18_750));
        // Far above: never below an eighth of the line.
        f.set_queue_delay(at(0), 1_000_000);
        assert_eq!(f.capacity_now_mbps(), 12_500);
        assert_eq!(f.share(3), Some(3_125));
    }

    #[test]
    fn the_drain_waits_for_the_line_to_carry_the_first_windows() {
        // 100 Gb/s; first windows of 125 KB take 10 us each at the line.
        let mut f: FairShare<8> =
            FairShare::new(100_000, 1_000_000, 4096).with_drain(drain(125_000));
        // Four senders arrive at 0, 1, 2 and 3 us: their first windows keep the line busy
        // until 40 us.
        for id in 0..4u32 {
            f.heard(id, u32::MAX, at(u64::from(id) * 1_000)).unwrap();
        }
        // 22 us of queue at 39 us: no cut yet (the senders pay for their first windows).
        f.set_queue_delay(at(39_000), 22_000);
        assert_eq!(f.capacity_now_mbps(), 100_000);
        // The same queue at 40 us: 20 of the 40 us horizon above the target, half the line.
        f.set_queue_delay(at(40_000), 22_000);
        assert_eq!(f.capacity_now_mbps(), 50_000);
        // A sender arriving later puts off the drain by its own first window from then on.
        f.heard(9, u32::MAX, at(45_000)).unwrap();
        f.set_queue_delay(at(54_000), 22_000);
        assert_eq!(f.capacity_now_mbps(), 100_000);
        f.set_queue_delay(at(55_000), 22_000);
        assert_eq!(f.capacity_now_mbps(), 50_000);
    }

    #[test]
    fn a_paced_sender_is_not_forgotten_between_its_packets() {
        // 64 senders on 100 Gb/s: 1562 Mb/s each, a 4 KiB packet every 21 us; a floor of 20 us.
        let mut f: FairShare<64> = FairShare::new(100_000, 20_000, 4096);
        for id in 0..64 {
            f.heard(id, u32::MAX, at(0)).unwrap();
        }
        // Silent for 160 us (under eight gaps of 20.98 us): all still there.
        f.expire(at(160_000));
        assert_eq!(f.len(), 64);
        // Silent for eight gaps and more: gone.
        f.expire(at(168_000));
        assert_eq!(f.len(), 0);
    }

    #[test]
    fn a_sender_that_sends_less_than_its_share_leaves_the_rest_to_the_others() {
        // 10 Gb/s shared by two senders, 1 KiB packets; intervals of at least 10 us. Sender 1
        // sends 1 Gb/s (a 1 KiB packet every 8192 ns), sender 2 all its share allows.
        let mut f: FairShare<4> = FairShare::new(10_000, 10_000, 1024);
        f.received(1, 1024, at(0)).unwrap();
        f.received(2, 1024, at(0)).unwrap();
        // New: both want all they can get.
        assert_eq!((f.share(1), f.share(2)), (Some(5_000), Some(5_000)));
        // What a sender at `mbps` sends in 8192 ns.
        let per_step = |mbps: u32| u64::from(mbps) * 8_192 / 8_000;
        let mut t = 0;
        for k in 1..=40u64 {
            t = k * 8_192;
            f.received(1, 1024, at(t)).unwrap();
            // Sender 2 sends at its share, whatever it is.
            f.received(2, per_step(f.share(2).unwrap()), at(t)).unwrap();
        }
        // Sender 1 wants about 1 Gb/s and a quarter more; sender 2 is held back: the rest.
        let one = f.share(1).unwrap();
        assert!((1_200..=1_300).contains(&one), "{one}");
        assert_eq!(f.share(2), Some(10_000 - one));
        // Sender 1 speeds up to what it was given: held back again, equal shares.
        for k in 1..=40u64 {
            let now = t + k * 8_192;
            f.received(1, per_step(f.share(1).unwrap()), at(now))
                .unwrap();
            f.received(2, per_step(f.share(2).unwrap()), at(now))
                .unwrap();
        }
        assert_eq!((f.share(1), f.share(2)), (Some(5_000), Some(5_000)));
    }

    #[test]
    fn senders_of_other_runners_on_the_same_line_count() {
        // 1000 Mb/s; one sender here, three that want all they can get elsewhere: a quarter.
        let mut f: FairShare<4> = FairShare::new(1_000, 1_000_000, 4096);
        f.heard(1, u32::MAX, at(0)).unwrap();
        assert_eq!(f.summary(), (1, 0));
        f.set_others(3, 0);
        assert_eq!(f.share(1), Some(250));
        // One elsewhere wants 400 and one wants all: (1000 - 400) / 2.
        f.set_others(1, 400);
        assert_eq!(f.share(1), Some(300));
        // A sender here that wants 100 counts as bounded in the summary.
        f.heard(2, 100, at(0)).unwrap();
        assert_eq!(f.summary(), (1, 100));
        assert_eq!(f.share(2), Some(100));
        assert_eq!(f.share(1), Some(250));
    }

    #[test]
    fn silence_then_a_packet_is_no_measure_of_demand() {
        // Two senders on 10 Gb/s; intervals of at least 10 us. Sender 1 sends its first window
        // and then nothing for 300 us (paying for it at its hint), then one packet: its demand
        // is not cut to what that packet over 300 us would say.
        let mut f: FairShare<4> = FairShare::new(10_000, 1_000_000, 1024);
        f.received(1, 64 * 1024, at(0)).unwrap();
        f.received(2, 1024, at(0)).unwrap();
        f.received(1, 1024, at(300_000)).unwrap();
        f.received(2, 1024, at(300_000)).unwrap();
        assert_eq!(f.share(1), Some(5_000));
        // A share of 0 is never handed out: a hint of 0 means none.
        let mut g: FairShare<4> = FairShare::new(10_000, 1_000_000, 1024);
        g.heard(1, u32::MAX, at(0)).unwrap();
        g.heard(2, u32::MAX, at(0)).unwrap();
        g.set_others(u32::MAX, u64::MAX);
        assert_eq!(g.share(1), Some(1));
    }

    #[test]
    fn the_table_is_bounded() {
        let mut f: FairShare<2> = FairShare::new(1_000, 1_000_000, 4096);
        f.heard(1, 10, at(0)).unwrap();
        f.heard(2, 10, at(0)).unwrap();
        assert_eq!(f.heard(3, 10, at(0)), Err(FairShareError::Full));
        assert_eq!(f.len(), 2);
        // Heard again: an update, not a new entry.
        f.heard(2, 20, at(1)).unwrap();
        assert_eq!(f.share(2), Some(20));
    }
}
