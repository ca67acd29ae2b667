//! Receive: the checks every datagram passes, probes, paths and NACKs.

use super::*;

impl<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize>
    Connection<P, W, S, Q, R>
{
    // ----- receive ----------------------------------------------------------------------

    /// Handles an arrived datagram (BTH to ICRC) that came from UDP source port `src_port`, with
    /// `ce` when its IP header was marked Congestion Experienced. Returns what to place where, or
    /// why it was dropped.
    ///
    /// The ACK a data packet carries (flag A) is taken after the packet's own work: by the next
    /// call of this function, [`Connection::poll_transmit`] or [`Connection::handle_timeout`]
    /// (as of its arrival time; [`Connection::poll_timeout`] asks for the call at once). A runner
    /// that answers a ping at once (completion, post, [`Connection::poll_transmit_data`]) so
    /// sends the answer before the sender-side work of the ACK, which the answer does not need:
    /// until then the acknowledged requests count as in flight, which may hold back new data (a
    /// full window) or completions, never retransmit anything.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        src_port: u16,
        ce: bool,
        datagram: &[u8],
    ) -> Result<Delivery, DropReason> {
        match Datagram::parse(datagram) {
            Ok(d) => self.receive(now, src_port, ce, &d),
            Err(_) => {
                self.abandon_atomic();
                self.settle_carried();
                self.counters.drop_malformed += 1;
                Err(DropReason::Malformed)
            }
        }
    }

    /// [`Connection::handle_datagram`] for a datagram the runner has already parsed (to find
    /// the connection it names by its destination QP): nothing is parsed again.
    pub fn handle_parsed(
        &mut self,
        now: Instant,
        src_port: u16,
        ce: bool,
        view: &Datagram<'_>,
    ) -> Result<Delivery, DropReason> {
        self.receive(now, src_port, ce, view)
    }

    /// The work of both entry points, inlined into each.
    #[inline(always)]
    fn receive(
        &mut self,
        now: Instant,
        src_port: u16,
        ce: bool,
        view: &Datagram<'_>,
    ) -> Result<Delivery, DropReason> {
        self.abandon_atomic();
        self.settle_carried();
        if !self.icrc_ok(src_port, view) {
            self.counters.drop_bad_icrc += 1;
            return Err(DropReason::BadIcrc);
        }
        let bth = view.bth;
        if bth.dest_qp != self.cfg.local_qpn {
            self.counters.drop_wrong_qp += 1;
            return Err(DropReason::WrongQp);
        }
        if bth.pkey != self.cfg.pkey {
            self.counters.drop_wrong_pkey += 1;
            return Err(DropReason::WrongPkey);
        }
        if ce {
            self.counters.ecn_ce_received += 1;
        }
        // The peer is alive and this end is hearing it: a path whose probes go unanswered
        // meanwhile is at fault, not the hosts (but see `peer_wait_ends` for a peer catching up).
        if let Some(h) = self.last_heard {
            if now.since(h) >= self.cfg.rto_low {
                self.silence = Some((h, now));
            }
        }
        self.last_heard = Some(now);
        match view.ext {
            Extensions::MrAck(ack) => self
                .on_ack(now, AckOrigin::Own { src_port }, bth.psn, &ack)
                .map(|()| Delivery::Nothing),
            Extensions::MrNack(nack) => self
                .on_nack(now, src_port, bth.psn, &nack)
                .map(|()| Delivery::Nothing),
            Extensions::MrProbe(probe) => self
                .on_probe(now, src_port, bth.opcode, &probe)
                .map(|()| Delivery::Nothing),
            Extensions::Cnp => {
                self.counters.cnps_received += 1;
                self.handle_cnp(now);
                Ok(Delivery::Nothing)
            }
            _ => match view.ext.mr_data() {
                Some(data) => {
                    if let Some(p) = view.piggy {
                        self.counters.acks_piggyback_received += 1;
                        let origin = AckOrigin::Carried {
                            src_port,
                            via_path: PathId(data.path_id),
                        };
                        self.carried = Some(CarriedAck {
                            at: now,
                            origin,
                            cum_psn: p.cum_psn,
                            ack: p.ack,
                        });
                    }
                    self.on_data(
                        now,
                        ce,
                        src_port,
                        &bth,
                        &view.ext,
                        data,
                        view.payload_at,
                        view.payload_len,
                    )
                }
                None => {
                    self.counters.drop_unsupported_opcode += 1;
                    Err(DropReason::UnsupportedOpcode)
                }
            },
        }
    }

    /// Whether the datagram's ICRC is right, or this end does not check it (`Config::icrc`).
    #[inline(always)]
    fn icrc_ok(&mut self, src_port: u16, d: &Datagram<'_>) -> bool {
        !self.cfg.icrc.checks()
            || d.icrc()
                == self.icrc_rx.icrc(
                    (self.cfg.remote_ip, self.cfg.local_ip),
                    (src_port, self.cfg.local_port),
                    &[d.covered()],
                    self.cfg.icrc_engine,
                    icrc_set(path_byte(&d.ext), src_port),
                )
    }

    /// A probe from the peer (answered from any port: after a failover the peer's path probes
    /// from its new port), or the reply to ours, which counts only if it names the probe that is
    /// outstanding and echoes its timestamp. Such a reply also teaches the port the peer's path
    /// now sends from.
    pub(super) fn on_probe(
        &mut self,
        now: Instant,
        src_port: u16,
        opcode: Opcode,
        probe: &MrProbeRepr,
    ) -> Result<(), DropReason> {
        let i = self.known_path(probe.path_id)?;
        if opcode == Opcode::MrProbe {
            let rx = &mut self.rx_paths[i];
            rx.probe_reply = Some((probe.probe_seq, probe.timestamp));
            // And an ACK echoing the probe: it reports what arrived on the path before it.
            rx.ts = probe.timestamp;
            rx.ts_at = now;
            self.acks.at_once(i);
            self.control_dirty = true;
            return Ok(());
        }
        let p = &mut self.paths[i];
        // The answer must echo one of the last probes, not answered before (its sequence number
        // and the timestamp it carried).
        let slot = probe.probe_seq as usize % PROBE_HISTORY;
        let recent = (p.probe_seq.wrapping_sub(probe.probe_seq) as usize) < PROBE_HISTORY;
        if !recent || probe.ts_echo == 0 || p.probe_history[slot] != probe.ts_echo {
            self.counters.drop_bad_probe += 1;
            return Err(DropReason::Inconsistent);
        }
        p.probe_history[slot] = 0;
        let latest = probe.probe_seq == p.probe_seq;
        if latest {
            p.probe_outstanding = false;
        } else if !p.failed {
            // A late answer to an earlier probe of a path still in its first probing: the
            // latest one decides. One of a path declared failed brings it back: it carries,
            // behind a queue that holds packets longer than the probe interval.
            return Ok(());
        }
        self.rx_paths[i].peer_port = Some(src_port);
        if p.state == PathState::Probing {
            p.state = PathState::Active;
            p.timeouts_in_row = 0;
            p.probes_unanswered = 0;
            p.quiet_probes = 0;
            // (The probe's timestamp is its departure with the lowest bit set: measured from
            // the bit cleared, the sample is never negative.)
            let rtt = u64::from(now.wire_timestamp().wrapping_sub(probe.ts_echo & !1));
            rtt_sample(p, rtt);
            if p.failed {
                p.failed = false;
                self.push_event(Event::PathRestored {
                    path: PathId(i as u8),
                });
            }
            self.probing.remove(i);
        }
        Ok(())
    }

    /// Path `path_id` as an index, if this connection has it (otherwise counted and refused).
    pub(super) fn known_path(&mut self, path_id: u8) -> Result<usize, DropReason> {
        let i = usize::from(path_id);
        if i >= usize::from(self.cfg.paths) {
            self.counters.drop_unknown_path += 1;
            return Err(DropReason::UnknownPath);
        }
        Ok(i)
    }

    /// Whether a control packet for path `i` (an ACK, a NACK) comes from the port the peer's
    /// path sends from; until that is known, any port (the first packet that passes every other
    /// check teaches it).
    pub(super) fn on_path_port(&mut self, i: usize, src_port: u16) -> bool {
        let ok = self.rx_paths[i].peer_port.is_none_or(|p| p == src_port);
        if !ok {
            self.counters.drop_wrong_port += 1;
        }
        ok
    }

    /// Whether `seq` is one of the last [`SEQ_HISTORY`] sequence numbers sent on path `i`.
    pub(super) fn was_sent(&self, i: usize, seq: PathSeq) -> bool {
        let p = &self.paths[i];
        let behind = p.next_seq.diff(seq);
        behind >= 1 && behind as u64 <= p.stats.sent.min(SEQ_HISTORY)
    }

    /// A NACK. As responder: the requester's confirmation of a refusal we hold, which must
    /// name it exactly. As requester: a refusal of one of our packets, which must name a PSN we
    /// sent and a transmission of it on the path it names; a fatal one is confirmed (also when
    /// repeated) and fails its message.
    pub(super) fn on_nack(
        &mut self,
        now: Instant,
        src_port: u16,
        psn: Psn,
        nack: &MrNackRepr,
    ) -> Result<(), DropReason> {
        let i = self.known_path(nack.path_id)?;
        // A confirmation must name a held refusal exactly, which no port adds to; and the
        // requester's path may have moved to a new port since (its confirmations go on the
        // refused packet's path).
        if nack.reason != NackReason::RefusalSeen && !self.on_path_port(i, src_port) {
            return Err(DropReason::WrongPort);
        }
        if nack.reason == NackReason::RefusalSeen {
            // As responder: the requester has our refusal of `psn`.
            if !self.refusals.confirm(psn, nack) {
                self.counters.drop_bad_nack += 1;
                return Err(DropReason::Inconsistent);
            }
            self.counters.nacks_received += 1;
            self.counters.refusals_confirmed += 1;
            if !self.refusals.any() {
                // The requester's window waits for an ACK without the refusals flag.
                self.acks.at_once(i);
                self.control_dirty = true;
            }
            return Ok(());
        }
        let fatal = nack.reason != NackReason::ReceiverNotReady;
        // The window cannot have passed a fatally refused PSN: it moves only on ACKs without the
        // refusals flag, which come after our confirmation. Just behind the window means a
        // repeat whose confirmation was lost: confirmed again, nothing more.
        let in_window = self.in_tx_window(psn);
        let repeat = !in_window && fatal && (-(W as i32)..0).contains(&psn_diff(psn, self.una));
        let consistent = (in_window || repeat) && self.was_sent(i, PathSeq(nack.path_seq));
        if fatal {
            // As requester: confirm every fatal refusal, also a repeated one (the previous
            // confirmation may have been lost), and also one of a packet this end never sent (a
            // forgery the peer refused): the peer holds it, and flags every ACK, until confirmed.
            // A confirmation acts only where it names a refusal exactly. The unverified ones share
            // one slot, so that forged NACKs cannot crowd out the rest.
            let confirm = PendingNack {
                path: PathId(nack.path_id),
                psn,
                nack: MrNackRepr {
                    reason: NackReason::RefusalSeen,
                    ..*nack
                },
            };
            if !consistent {
                self.unverified_confirm = Some(confirm);
                self.control_dirty = true;
            } else if !self
                .nacks
                .iter()
                .flatten()
                .any(|q| q.psn == confirm.psn && q.nack == confirm.nack)
            {
                if let Some(slot) = self.nacks.iter_mut().find(|s| s.is_none()) {
                    *slot = Some(confirm);
                    self.control_dirty = true;
                }
            }
        }
        if !consistent {
            self.counters.drop_bad_nack += 1;
            return Err(DropReason::Inconsistent);
        }
        self.counters.nacks_received += 1;
        self.rx_paths[i].peer_port = Some(src_port);
        if repeat {
            return Ok(());
        }
        let idx = psn.get() as usize % W;
        if nack.reason == NackReason::ReceiverNotReady {
            self.pkts[idx].acked = false;
            // Forget which transmission this was, so that its ACK cannot mark it delivered.
            self.pkts[idx].path = NO_PATH;
            let wake = now + (self.cfg.rnr_delay << self.rnr_streak.min(RNR_BACKOFF_SHIFT));
            self.rnr_streak = self.rnr_streak.saturating_add(1);
            self.queue_retx(psn, wake);
            self.retx_wake = Some(self.retx_wake.map_or(wake, |w| w.min(wake)));
            return Ok(());
        }
        if let Some(m) = self.msgs.get_mut(self.pkts[idx].msg) {
            if !m.done {
                if matches!(m.kind, MsgKind::Read | MsgKind::Atomic) && m.next_pkt > 0 {
                    self.requests_out = self.requests_out.saturating_sub(1);
                }
                m.done = true;
                m.status = Status::Refused(nack.reason);
                m.next_pkt = m.npkts;
            }
        }
        self.complete_in_order();
        Ok(())
    }
}

/// Where an ACK came from: a packet of its own, or carried by a data packet of path `via_path`.
#[derive(Debug, Clone, Copy)]
pub(super) enum AckOrigin {
    Own { src_port: u16 },
    Carried { src_port: u16, via_path: PathId },
}
