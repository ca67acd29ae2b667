//! Acknowledgements: ACK checks, SACK and overdue loss detection, the window and completions.

use super::*;

impl<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize>
    Connection<P, W, S, Q, R>
{
    /// Takes the ACK the last data packet carried, if it has not been taken yet.
    pub(super) fn settle_carried(&mut self) {
        if let Some(c) = self.carried.take() {
            // A carried ACK that fails its checks is counted there; its packet stands.
            let _ = self.on_ack(c.at, c.origin, c.cum_psn, &c.ack);
        }
    }

    /// Whether an ACK for path `i` names only what was sent: its cumulative point among the
    /// path's last numbers sent (or at the next one), every bit of its bitvector below the next
    /// number, and a cumulative PSN not past the next PSN.
    /// `highest_bit` is the ACK's highest SACK bit.
    pub(super) fn ack_is_consistent(
        &self,
        i: usize,
        cum_psn: Psn,
        ack: &MrAckRepr,
        highest_bit: Option<usize>,
    ) -> bool {
        let p = &self.paths[i];
        let behind = p.next_seq.diff(PathSeq(ack.cum_seq));
        let cum_ok = behind == 0 || self.was_sent(i, PathSeq(ack.cum_seq));
        let bits_ok = highest_bit.is_none_or(|b| (b as i64) + 1 < behind as i64);
        cum_ok && bits_ok && psn_diff(cum_psn, self.nxt) <= 0
    }

    pub(super) fn on_ack(
        &mut self,
        now: Instant,
        origin: AckOrigin,
        cum_psn: Psn,
        ack: &MrAckRepr,
    ) -> Result<(), DropReason> {
        let i = self.known_path(ack.path_id)?;
        // An ACK of its own comes from the port of the path it acknowledges; a carried one rides
        // on a data packet of any path, from that path's port.
        let (port_path, src_port) = match origin {
            AckOrigin::Own { src_port } => (i, src_port),
            AckOrigin::Carried { src_port, via_path } => (via_path.index(), src_port),
        };
        if port_path >= usize::from(self.cfg.paths) || !self.on_path_port(port_path, src_port) {
            return Err(DropReason::WrongPort);
        }
        let highest_bit = ack.highest_sacked();
        if !self.ack_is_consistent(i, cum_psn, ack, highest_bit) {
            self.counters.drop_bad_ack += 1;
            return Err(DropReason::Inconsistent);
        }
        if let AckOrigin::Own { src_port } = origin {
            self.rx_paths[i].peer_port = Some(src_port);
        }
        self.paths[i].last_ack_at = self.paths[i].last_ack_at.max(now);
        self.counters.ecn_marks_echoed += u64::from(ack.ce_count);
        self.paths[i].stats.ecn_marks += u64::from(ack.ce_count);
        let cum = PathSeq(ack.cum_seq);
        let (una, next) = (self.paths[i].una, self.paths[i].next_seq);
        // The highest transmission this ACK reports as arrived.
        let highest = match highest_bit {
            Some(bit) => cum.add(1 + bit as u32),
            None => cum.add(u32::MAX), // cum - 1
        };
        let mut newly_acked = false;
        let mut acked_now = 0u32;
        // When the oldest transmission this ACK newly reports left: an RTT sample cannot be
        // longer than its age (an echoed timestamp older than that is not one of ours).
        let mut oldest_sent = now;
        let mut newest_sent = Instant::ZERO;
        let mut s = una;
        while s != next && !highest.before(s) {
            let slot = s.0 as usize % PATH_RING;
            let raw = self.paths[i].ring_psn[slot];
            if raw != NO_PSN {
                let d = s.diff(cum);
                let arrived = d < 0
                    || (d >= 1 && {
                        let b = (d - 1) as usize;
                        b < SACK_BITS && ack.sack[b / 8] & (1 << (b % 8)) != 0
                    });
                if arrived {
                    oldest_sent = oldest_sent.min(self.paths[i].ring_sent[slot]);
                    newest_sent = newest_sent.max(self.paths[i].ring_sent[slot]);
                    self.paths[i].ring_psn[slot] = NO_PSN;
                    self.paths[i].stats.acked += 1;
                    acked_now += 1;
                    let psn = Psn::new(raw);
                    let pk = &self.pkts[psn.get() as usize % W];
                    // Only the packet's latest transmission counts: an older one may have been
                    // refused for want of a receive buffer and be waiting to go again.
                    let latest = pk.path.index() == i && pk.seq == s;
                    if self.in_tx_window(psn) && !pk.acked && latest {
                        self.pkts[psn.get() as usize % W].acked = true;
                        self.counters.acked += 1;
                        if d >= 1 {
                            self.counters.sacked += 1;
                        }
                    }
                    newly_acked = true;
                } else {
                    // Below a transmission that arrived on the same in-order path: lost.
                    self.declare_lost(i, s, now);
                }
            }
            s = s.add(1);
        }
        self.settle_path_una(i);
        if acked_now > 0 {
            self.progress_at = now;
        }
        if newest_sent > self.rack_sent {
            self.rack_sent = newest_sent;
            self.rack_dirty = true;
        }
        self.congestion(
            i,
            now,
            ack.ce_count > 0 || ack.ece,
            acked_now,
            ack.rate_hint,
        );
        let p = &mut self.paths[i];
        if newly_acked {
            p.timeouts_in_row = 0;
            let rtt = u64::from(
                now.wire_timestamp()
                    .wrapping_sub(ack.ts_echo)
                    .wrapping_sub(ack.ack_delay),
            );
            // (A data packet's timestamp is its departure with the lowest bit cleared: up to 1 ns
            // early.)
            if rtt <= now.since(oldest_sent) + 1 {
                rtt_sample(p, rtt);
                let srtt = p.srtt;
                if self.rate.on_rtt(PathId(i as u8), rtt, srtt, now) {
                    self.paths[i].stats.cwnd_cuts += 1;
                    self.counters.cwnd_cuts += 1;
                }
            }
        }
        // A tail probe's round ends with its answer: the ACK that echoes the probe, or any ACK
        // that reports a transmission that left after it (the peer's echo names the last packet
        // that arrived, which may be one that followed the probe; the path is in order, so
        // what left before the probe and is unreported was lost either way), or one after which
        // nothing on the path is unresolved. A round left open would probe again at once and
        // take a healthy path out of service.
        let p = &self.paths[i];
        let answered = p.tail_probe_ts.is_some()
            && (p.tail_probe_ts == Some(ack.ts_echo)
                || !highest.before(p.tail_probe_cut)
                || p.una == p.next_seq);
        if answered {
            // The path is alive, and whatever left before the probe and is still unacknowledged
            // was lost.
            let p = &mut self.paths[i];
            p.timeouts_in_row = 0;
            p.timer_from = now;
            self.lose_before_tail_probe(i, now);
        }
        // The connection-level cumulative PSN: what the peer has accepted for good. While the
        // peer holds refusals we have not confirmed, it may cover refused packets: wait.
        if !ack.refusals && psn_diff(cum_psn, self.peer_cum) > 0 {
            self.peer_cum = cum_psn;
        }
        self.advance_window();
        Ok(())
    }

    /// How long after it left a transmission on path `i` is overdue once a later one is
    /// acknowledged: the path's smoothed round trip and four times its variation (the
    /// retransmission timeout without its floors), and the longest a receiver holds an ACK back.
    pub(super) fn overdue_after(&self, i: usize) -> u64 {
        let p = &self.paths[i];
        // A path without an RTT sample yet (its first flight may be the one lost) takes the
        // fastest measured path's: the paths cross the same fabric.
        let measured = if p.stats.rtt_min > 0 {
            Some(p)
        } else {
            self.paths[..usize::from(self.cfg.paths)]
                .iter()
                .filter(|q| q.stats.rtt_min > 0)
                .min_by_key(|q| q.srtt)
        };
        match measured {
            Some(q) => q.srtt + 4 * q.rttvar + self.cfg.ack_delay,
            None => self.cfg.rto_low + self.cfg.ack_delay,
        }
    }

    /// The oldest unresolved transmission of path `i` that left before the latest acknowledged
    /// one: its sequence number and when it becomes overdue.
    pub(super) fn overdue_candidate(&self, i: usize) -> Option<(PathSeq, Instant)> {
        let p = &self.paths[i];
        if p.state != PathState::Active || p.una == p.next_seq {
            return None;
        }
        let slot = p.una.0 as usize % PATH_RING;
        let sent = p.ring_sent[slot];
        // Measured from the later of its departure and the path's last ACK: a path that is still
        // acknowledging (its ACK of this packet was lost, or is behind) is left to its SACK.
        (p.ring_psn[slot] != NO_PSN && sent < self.rack_sent)
            .then(|| (p.una, sent.max(p.last_ack_at) + self.overdue_after(i)))
    }

    pub(super) fn overdue_at(&self, i: usize) -> Option<Instant> {
        let p = &self.paths[i];
        if p.tail_probe_pending {
            return None;
        }
        let (_, at) = self.overdue_candidate(i)?;
        Some(match p.tail_probe_ts {
            Some(_) => self.tail_probe_due(i),
            None => at,
        })
    }

    /// When path `i`'s outstanding tail probe is taken as unanswered: a round trip after it
    /// left; after its second try, while the whole peer has been silent since it left, a long
    /// timeout after it left (one probe per timeout), but no later than the end of the wait for
    /// the peer ([`Self::waits_for_peer`]). `detect_overdue` acts at this time and the timer
    /// (`overdue_at`) fires at it: the two must agree, or the timer would stay due while nothing
    /// happens, and a runner would spin until the later one.
    pub(super) fn tail_probe_due(&self, i: usize) -> Instant {
        let p = &self.paths[i];
        let round_trip = p.tail_probe_at + self.overdue_after(i);
        match self.peer_wait_ends(p.tail_probe_at) {
            Some(waited) if p.tail_probe_tries >= TAIL_PROBE_TRIES => {
                let next_probe = p.tail_probe_at + self.rto(p);
                round_trip.max(next_probe.min(waited))
            }
            _ => round_trip,
        }
    }

    /// Time-ordered loss detection across paths, in the manner of RACK: a transmission still
    /// unresolved although one that left after it, on any path, has been acknowledged, while its
    /// own path has been silent for a round trip (plus variation and ACK delay), is lost. A run of losses
    /// that takes a path's whole flight leaves no later packet on that path to show a SACK gap;
    /// the other paths show it, in about a round trip instead of a retransmission timeout. It runs
    /// after a batch of arrivals (from `poll_transmit`) and from the timer, not inside each ACK: a
    /// peer that was stalled answers for every path at once, and the first of those ACKs must not
    /// condemn what the next ones acknowledge.
    pub(super) fn detect_overdue(&mut self, now: Instant) {
        self.rack_dirty = false;
        // Only a path with something in flight has a candidate.
        for i in self.inflight.iter() {
            while let Some((seq, due)) = self.overdue_candidate(i) {
                // A packet the peer's cumulative PSN already covers arrived: its path ACK is
                // only late. Resolve it without counting it lost.
                let slot = seq.0 as usize % PATH_RING;
                let raw = self.paths[i].ring_psn[slot];
                if !self.in_tx_window(Psn::new(raw)) || self.pkts[raw as usize % W].acked {
                    self.paths[i].ring_psn[slot] = NO_PSN;
                    self.settle_path_una(i);
                    continue;
                }
                let due_probe = self.tail_probe_due(i);
                let waits_for_peer = self.waits_for_peer(self.paths[i].tail_probe_at, now);
                let p = &mut self.paths[i];
                if p.tail_probe_pending {
                    break;
                }
                if p.tail_probe_ts.is_some() {
                    // A probe is out. Its answer settles the path; none within a round trip
                    // means the probe or its answer was lost, or the route lost what left before
                    // it. One more probe tells which (a lost probe or answer must not cost a
                    // window of needless retransmissions); when it is not answered either, what
                    // left before the first is declared lost, not at the retransmission timeout.
                    if now < due_probe {
                        break;
                    }
                    if p.tail_probe_tries < TAIL_PROBE_TRIES || waits_for_peer {
                        // Not answered: probe again, also while the whole peer has been
                        // silent since the probe left (no evidence against this path).
                        if p.tail_probe_tries >= TAIL_PROBE_TRIES {
                            self.counters.peer_silent_waits += 1;
                        }
                        p.tail_probe_pending = true;
                        self.control_dirty = true;
                        break;
                    }
                    // The probe counts as the first silence, its lack of answer as the second:
                    // a dead route fails over as it would by its timeouts, only sooner.
                    p.timeouts_in_row = p.timeouts_in_row.max(1);
                    self.lose_before_tail_probe(i, now);
                    self.path_silent(i, now);
                    continue;
                }
                // Overdue: probe the path's tail now rather than at its retransmission timeout.
                // The ACK the probe triggers says exactly what arrived before it; the rest is
                // declared lost then (a lost ACK must not cost a window of needless
                // retransmissions).
                if now >= due {
                    p.tail_probe_pending = true;
                    p.timer_from = now;
                    self.counters.overdue_probes += 1;
                    self.control_dirty = true;
                }
                break;
            }
        }
    }

    /// Ends path `i`'s tail probe: whatever left before it and is still unresolved was lost (the
    /// probe's ACK did not report it, or no answer came).
    pub(super) fn lose_before_tail_probe(&mut self, i: usize, now: Instant) {
        let p = &mut self.paths[i];
        p.tail_probe_ts = None;
        p.tail_probe_tries = 0;
        // Up to the cut: a path's sequence numbers follow the order its transmissions left in.
        let (cut, una) = (p.tail_probe_cut, p.una);
        let mut s = una;
        while s.before(cut) {
            let slot = s.0 as usize % PATH_RING;
            if self.paths[i].ring_psn[slot] != NO_PSN {
                self.declare_lost(i, s, now);
            }
            s = s.add(1);
        }
        self.settle_path_una(i);
    }

    /// Declares transmission `seq` on path `i` lost (a gap, or left before a tail probe).
    pub(super) fn declare_lost(&mut self, i: usize, seq: PathSeq, now: Instant) {
        self.drop_transmission(i, seq, now);
        self.paths[i].stats.lost += 1;
        self.counters.lost_by_sack += 1;
        self.rate.on_loss(PathId(i as u8), now);
    }

    /// Moves a path's oldest unresolved transmission past resolved ones.
    pub(super) fn settle_path_una(&mut self, i: usize) {
        let p = &mut self.paths[i];
        while p.una != p.next_seq && p.ring_psn[p.una.0 as usize % PATH_RING] == NO_PSN {
            p.una = p.una.add(1);
        }
        if p.una == p.next_seq {
            self.inflight.remove(i);
        }
    }

    pub(super) fn advance_window(&mut self) {
        if self.una != self.peer_cum {
            // The peer accepted something new: its resources came back.
            self.rnr_streak = 0;
        }
        while self.una != self.peer_cum {
            let idx = self.una.get() as usize % W;
            let pk = self.pkts[idx];
            self.pkts[idx].acked = true;
            if let Some(m) = self.msgs.get_mut(pk.msg) {
                if m.last_psn == Some(self.una)
                    && m.next_pkt == m.npkts
                    && !matches!(m.kind, MsgKind::Read | MsgKind::Atomic)
                {
                    m.done = true;
                }
            }
            self.una = self.una.wrapping_add(1);
        }
        self.complete_in_order();
    }

    /// Reports finished messages in order within each stream and frees the ring's head.
    pub(super) fn complete_in_order(&mut self) {
        let mut blocked = [false; S];
        // The event queue filled: no completion more this pass (responses, which report
        // nothing, are still marked, so that the ring's head can be freed).
        let mut full = false;
        for m in self.msgs.seqs() {
            let Some(&msg) = self.msgs.get(m) else {
                continue;
            };
            let s = usize::from(msg.stream) % S;
            if !msg.reported && msg.done && !blocked[s] {
                let kind = match msg.kind {
                    MsgKind::Send => Some(CompletionKind::Send),
                    MsgKind::Write => Some(CompletionKind::Write),
                    MsgKind::Read => Some(CompletionKind::Read),
                    MsgKind::Atomic => Some(CompletionKind::Atomic),
                    MsgKind::ReadResponse | MsgKind::AtomicResponse => None,
                };
                if let Some(kind) = kind {
                    let c = Completion {
                        id: msg.wr_id,
                        status: msg.status,
                        kind,
                        byte_len: msg.len,
                        imm: msg.imm,
                        stream: msg.stream,
                    };
                    if full || !self.push_completion(c) {
                        // The queue is full: this message and every later one of its stream
                        // wait, unreported.
                        full = true;
                        blocked[s] = true;
                        continue;
                    }
                }
                if let Some(x) = self.msgs.get_mut(m) {
                    x.reported = true;
                }
            } else if !msg.reported {
                blocked[s] = true;
            }
        }
        // Free reported messages at the head whose packets have all left the window.
        while let Some(&msg) = self.msgs.front() {
            if !(msg.reported && msg.last_psn.is_none_or(|l| !self.in_tx_window(l))) {
                break;
            }
            self.msgs.pop();
        }
    }
}
