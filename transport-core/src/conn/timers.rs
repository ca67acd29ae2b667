//! Timers: retransmission timeouts per path, probes, and what a stalled host restarts.

use super::*;
use crate::rate::serialisation_ns;

/// The connection's timers, by what they wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// An ACK carried by data that waits to be acted on (settled at the next entry point).
    Carried,
    /// A path's retransmission timeout.
    Retransmit(usize),
    /// A failing path's next probe.
    Probe(usize),
    /// A path's delayed ACK.
    Ack(usize),
    /// The pacer lets the next data packet go.
    Pace,
    /// The oldest packet the peer saw but never accepted.
    Unaccepted,
    /// A packet held back after a receiver-not-ready NACK may go again.
    RetransmitWake,
    /// A path silent for its round trip while later transmissions were acknowledged.
    Overdue(usize),
    /// A refusal whose NACK goes again unless confirmed.
    Refusal,
}

impl<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize>
    Connection<P, W, S, Q, R>
{
    pub(super) fn rto(&self, p: &TxPath) -> u64 {
        let inflight = p.next_seq.diff(p.una) as u32;
        let base = if inflight <= self.cfg.rto_low_inflight {
            self.cfg.rto_low
        } else {
            self.cfg.rto_high
        };
        // A tiny hint (the peer's, or a share collapsed for a moment) must not put loss
        // detection off for seconds: at most sixteen long timeouts more.
        let drain = self.drain_ns().min(self.cfg.rto_high.saturating_mul(16));
        base.max(p.srtt + 4 * p.rttvar)
            .max(drain.saturating_add(base))
    }

    /// How long what the connection has in flight takes to leave at its rate (0 when the rate
    /// is not limited): a paced sender's last packet reaches the peer only after the rest, so a
    /// queue that holds the connection's packets at its share (an incast's, before the first
    /// hint paced it) must not pass for loss.
    #[inline]
    fn drain_ns(&self) -> u64 {
        if !self.rate.paced() {
            return 0;
        }
        let rate = self.rate.rate_mbps();
        if rate == 0 {
            return 0;
        }
        let packets = u64::from(psn_diff(self.nxt, self.una).max(0) as u32);
        serialisation_ns(packets * (u64::from(self.cfg.mtu) + 64), rate)
    }

    /// When path `i`'s retransmission timer fires: its oldest unresolved transmission (or the
    /// restart after a stall, if later) plus its timeout; none while nothing is in flight on it.
    /// Both timer entry points read the deadlines from here and from [`Self::unaccepted_at`].
    fn rto_at(&self, i: usize) -> Option<Instant> {
        let p = &self.paths[i];
        (p.una != p.next_seq).then(|| {
            let slot = p.una.0 as usize % PATH_RING;
            p.ring_sent[slot].max(p.timer_from) + self.rto(p)
        })
    }

    /// Whether `inflight` names exactly the paths with unresolved transmissions, and `probing`
    /// the paths that probe.
    fn inflight_consistent(&self) -> bool {
        let n = usize::from(self.cfg.paths);
        self.paths[..n].iter().enumerate().all(|(i, p)| {
            self.inflight.contains(i) == (p.una != p.next_seq)
                && self.probing.contains(i) == (p.state == PathState::Probing)
        })
    }

    /// When the oldest packet in flight, which the path layer saw arrive but the peer never
    /// accepted (refused while its refusal table was full, or the ACK that would have covered it
    /// was lost), is sent again: the long timeout after it left.
    fn unaccepted_at(&self) -> Option<Instant> {
        if self.una == self.nxt {
            return None;
        }
        let oldest = &self.pkts[self.una.get() as usize % W];
        oldest.acked.then(|| oldest.sent_at + self.cfg.rto_high)
    }

    /// When timer `t` fires, if it is armed: the one definition of every deadline, which both
    /// [`Connection::poll_timeout`] and [`Connection::handle_timeout`] read.
    #[inline(always)]
    fn deadline(&self, t: Timer) -> Option<Instant> {
        match t {
            Timer::Carried => self.carried.map(|c| c.at),
            Timer::Retransmit(i) => self.rto_at(i),
            Timer::Probe(i) => {
                let p = &self.paths[i];
                (p.state == PathState::Probing).then_some(p.probe_due)
            }
            Timer::Ack(i) => self.acks.deadline(i),
            Timer::Unaccepted => self.unaccepted_at(),
            Timer::RetransmitWake => self.retx_wake,
            Timer::Overdue(i) => self.overdue_at(i),
            Timer::Refusal => self.refusals.next_due(),
            Timer::Pace => self.pace_at,
        }
    }

    /// When [`Connection::handle_timeout`] should next be called: the earliest deadline of
    /// every timer (plain loops: the runner asks after every round).
    pub fn poll_timeout(&self) -> Option<Instant> {
        debug_assert!(self.inflight_consistent(), "a set of paths is stale");
        let mut t: Option<Instant> = None;
        let mut at = |timer| {
            if let Some(x) = self.deadline(timer) {
                t = Some(t.map_or(x, |y| y.min(x)));
            }
        };
        for timer in [
            Timer::Carried,
            Timer::Unaccepted,
            Timer::RetransmitWake,
            Timer::Refusal,
            Timer::Pace,
        ] {
            at(timer);
        }
        // An ACK timer is armed only while its path owes a delayed ACK, a probe timer only
        // while its path probes, retransmission and overdue timers only while it has something
        // in flight: the sets name them, and the timers of the other paths are not read (a
        // path's records are lines of their own).
        for i in self.acks.delayed() {
            at(Timer::Ack(i));
        }
        for i in self.probing.iter() {
            at(Timer::Probe(i));
        }
        for i in self.inflight.iter() {
            at(Timer::Retransmit(i));
            at(Timer::Overdue(i));
        }
        t
    }

    /// Fires the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due = |c: &Self, t| c.deadline(t).is_some_and(|d| now >= d);
        self.settle_carried();
        for i in 0..usize::from(self.cfg.paths) {
            if due(self, Timer::Retransmit(i)) {
                self.path_timeout(i, now);
            }
            if due(self, Timer::Ack(i)) {
                self.acks.expire(i);
                self.control_dirty = true;
            }
            if due(self, Timer::Probe(i)) {
                let p = &mut self.paths[i];
                p.probe_pending = true;
                p.probe_due = now + self.cfg.probe_interval;
                self.control_dirty = true;
            }
        }
        // Overdue paths (`Timer::Overdue`) are found and probed across all paths at once.
        self.detect_overdue(now);
        if due(self, Timer::RetransmitWake) {
            self.retx_wake = None;
        }
        if due(self, Timer::Pace) {
            // The runner asks for data again now.
            self.pace_at = None;
        }
        if self.refusals.due(now).is_some() {
            self.control_dirty = true;
        }
        if due(self, Timer::Unaccepted) {
            let idx = self.una.get() as usize % W;
            self.pkts[idx].acked = false;
            self.pkts[idx].sent_at = now;
            self.queue_retx(self.una, now);
        }
    }

    /// The runner did not run for a while although it had asked to (its host gave it no CPU):
    /// every path's retransmission timer, and every probe's, restarts from `now`. What the timers
    /// wait for may have arrived meanwhile and be waiting in the host's buffers; a timeout must
    /// not count the time a packet waited for this host's own CPU. Call it after handing over
    /// what arrived during the stall.
    ///
    /// A host that stalls again and again must not put the timers off for ever: a path takes at
    /// most [`HOST_STALL_RESTARTS`] restarts in a row while it does not move (its oldest packet in
    /// flight unresolved, no probe sent); then its timer runs through the stalls.
    pub fn handle_host_stall(&mut self, now: Instant) {
        for p in self.paths.iter_mut().take(usize::from(self.cfg.paths)) {
            let mark = (p.una, p.probe_seq);
            if p.stall_mark != mark || p.una == p.next_seq {
                p.stall_mark = mark;
                p.stall_restarts = 0;
            }
            if p.stall_restarts >= HOST_STALL_RESTARTS {
                continue;
            }
            p.stall_restarts += 1;
            p.timer_from = p.timer_from.max(now);
            if p.state == PathState::Probing {
                p.probe_due = p.probe_due.max(now + self.cfg.probe_interval);
            }
        }
    }

    pub(super) fn path_timeout(&mut self, i: usize, now: Instant) {
        let p = &mut self.paths[i];
        if p.state == PathState::Active && p.timeouts_in_row == 0 {
            // First silence: probe the tail instead of declaring it lost. The probe follows the
            // same in-order route; the ACK it triggers tells exactly what arrived before it.
            p.timeouts_in_row = 1;
            p.stats.timeouts += 1;
            p.tail_probe_pending = true;
            p.timer_from = now;
            self.control_dirty = true;
            return;
        }
        if self.paths[i].state == PathState::Active
            && self.waits_for_peer(self.paths[i].tail_probe_at, now)
        {
            // The whole peer has been silent since the tail probe left: no evidence against
            // this path. Probe its tail again; the answer tells what was lost.
            let p = &mut self.paths[i];
            p.tail_probe_pending = true;
            p.timer_from = now;
            self.counters.peer_silent_waits += 1;
            self.control_dirty = true;
            return;
        }
        let mut lost = 0;
        let (una, next) = (self.paths[i].una, self.paths[i].next_seq);
        let mut s = una;
        while s != next {
            lost += u64::from(self.drop_transmission(i, s, now));
            s = s.add(1);
        }
        let p = &mut self.paths[i];
        p.una = next;
        self.inflight.remove(i);
        p.stats.lost += lost;
        // Everything in flight is resolved: a tail probe round still open has nothing to settle.
        p.tail_probe_pending = false;
        p.tail_probe_ts = None;
        p.tail_probe_tries = 0;
        self.counters.lost_by_timeout += lost;
        self.rate.on_timeout(PathId(i as u8), now);
        self.path_silent(i, now);
    }

    /// Whether a path whose tail probe left at `probe_at` and was not answered should wait for
    /// the peer instead of declaring what it carried lost: nothing at all came from the peer, on
    /// any path, since the probe left (the peer was heard before: a peer never heard gives no
    /// reason to wait), and for less than [`PEER_SILENCE_RTOS`] long timeouts; or a peer catching
    /// up after such a silence, as [`Self::peer_wait_ends`] says. Evidence against the path is the
    /// peer answering while the path does not.
    pub(super) fn waits_for_peer(&self, probe_at: Instant, now: Instant) -> bool {
        self.peer_wait_ends(probe_at).is_some_and(|end| now < end)
    }

    /// When the wait for a silent peer ([`Self::waits_for_peer`]) of a probe that left at
    /// `probe_at` ends: [`PEER_SILENCE_RTOS`] long timeouts after the peer was last heard, if
    /// that was before the probe left; `None` if there is no wait (heard since, or never).
    ///
    /// A peer whose last silence (of at least `rto_low`) began before the probe left, and who
    /// is heard again, may be catching up: its first ACKs report what reached it before the
    /// probe, and the probe's answer is further back in its queue (a trace showed a path's flight
    /// declared lost 22 us after such a peer was first heard again, 8.6 ms into its silence).
    /// Until it acknowledges a transmission that left after the probe (on any path: its queue is
    /// then past the probe), the wait goes on, counted from its last progress: the start of its
    /// silence, or the last ACK that acknowledged something for the first time, if later, but
    /// no later than one wait into the silence (so while the peer is heard the wait ends at most
    /// two waits after its silence began, whatever it acknowledges: a dead route must still be
    /// found while the peer works through a deep queue). A backlog takes about as long to work
    /// through as the silence that built it (a slow peer's socket buffer holds a whole flight:
    /// 2.8 MB is 28 ms at 0.8 Gb/s), so counting from the start of the silence alone took it for
    /// loss. That holds for the probes sent again while it catches up too, which leave after it
    /// is heard. Only the peer's last silence counts: if it falls silent again, a probe sent
    /// during the new silence is waited for a wait from when the peer was last heard, while one
    /// sent before it is waited for as above until the peer is heard again, and then not at all
    /// (its path is judged by the usual rules).
    pub(super) fn peer_wait_ends(&self, probe_at: Instant) -> Option<Instant> {
        let heard = self.last_heard?;
        let wait = self.cfg.rto_high.saturating_mul(PEER_SILENCE_RTOS);
        let quiet_since = if heard <= probe_at {
            heard
        } else {
            match self.silence {
                Some((from, _)) if from <= probe_at && self.rack_sent < probe_at => {
                    from.max(self.progress_at.min(from + wait))
                }
                _ => return None,
            }
        };
        Some(quiet_since + wait)
    }

    /// Whether the peer has answered since `t`: heard, and not only catching up on what reached
    /// it before ([`Self::peer_wait_ends`]).
    pub(super) fn heard_since(&self, t: Instant) -> bool {
        self.last_heard > Some(t) && self.peer_wait_ends(t).is_none()
    }

    /// Path `i` lost what it carried and did not answer in time (a second timeout, or a probe of
    /// its tail left unanswered): after `timeouts_to_probe` of these in a row it stops carrying
    /// data and is probed.
    pub(super) fn path_silent(&mut self, i: usize, now: Instant) {
        let p = &mut self.paths[i];
        p.stats.timeouts += 1;
        p.timeouts_in_row = p.timeouts_in_row.saturating_add(1);
        if p.state == PathState::Active && p.timeouts_in_row >= self.cfg.timeouts_to_probe {
            p.state = PathState::Probing;
            p.probes_unanswered = 0;
            p.quiet_probes = 0;
            p.probe_pending = true;
            p.probe_due = now + self.cfg.probe_interval;
            self.control_dirty = true;
            self.probing.insert(i);
        }
    }

    /// Forgets transmission `seq` on path `i` as lost; queues its packet again if this was its
    /// latest transmission and it is not acknowledged. Returns whether a live slot was dropped.
    pub(super) fn drop_transmission(&mut self, i: usize, seq: PathSeq, now: Instant) -> bool {
        let slot = seq.0 as usize % PATH_RING;
        let raw = self.paths[i].ring_psn[slot];
        if raw == NO_PSN {
            return false;
        }
        self.paths[i].ring_psn[slot] = NO_PSN;
        let psn = Psn::new(raw);
        if self.in_tx_window(psn) {
            let pk = self.pkts[psn.get() as usize % W];
            if !pk.acked && pk.path.index() == i && pk.seq == seq {
                self.queue_retx(psn, now);
            }
        }
        true
    }

    pub(super) fn in_tx_window(&self, psn: Psn) -> bool {
        let d = psn_diff(psn, self.una);
        d >= 0 && psn_diff(psn, self.nxt) < 0
    }

    pub(super) fn queue_retx(&mut self, psn: Psn, not_before: Instant) {
        let pk = &mut self.pkts[psn.get() as usize % W];
        if pk.queued {
            return;
        }
        pk.not_before = not_before;
        // Full only with stale entries of earlier tenants of the slots; a packet left out now
        // is queued by a later timeout.
        pk.queued = self.retx.push(psn).is_ok();
    }
}
