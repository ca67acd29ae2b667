//! The responder: data placed, receives matched, refusals, Read and atomic responses.

use super::*;

impl<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize>
    Connection<P, W, S, Q, R>
{
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn on_data(
        &mut self,
        now: Instant,
        ce: bool,
        src_port: u16,
        bth: &BthRepr,
        ext: &Extensions,
        data: MrDataRepr,
        payload_at: usize,
        payload_len: usize,
    ) -> Result<Delivery, DropReason> {
        let i = self.known_path(data.path_id)?;
        let path = PathId(i as u8);
        let offset_psn = psn_diff(bth.psn, self.rx_cum);
        if offset_psn >= W as i32 {
            self.counters.drop_out_of_window += 1;
            return Err(DropReason::OutOfWindow);
        }
        // The PSN and the duplicate are checked before any path state moves. A duplicate still
        // enters the path's bitvector (a spurious retransmission must be acknowledged on the path
        // that carried it), but it never slides the path's window: only a new packet in the
        // receive window may (a forged old PSN with a far path sequence would otherwise give up
        // on every missing number of the path).
        let duplicate = offset_psn < 0 || self.rx_seen[bth.psn.get() as usize % W];
        let rx = &mut self.rx_paths[i];
        if duplicate && PathSeq(data.path_seq).diff(rx.sack.cumulative()) > SACK_BITS as i32 {
            self.counters.duplicates += 1;
            return Err(DropReason::Duplicate);
        }
        let arrival = rx.sack.insert(PathSeq(data.path_seq));
        rx.unacked = rx.unacked.saturating_add(1);
        // What the ACK echoes (the timestamp, the CE marks) comes from new packets only: a
        // duplicate is what a forger can produce without guessing the window.
        let marked = ce && !duplicate;
        if !duplicate {
            rx.ts = data.timestamp;
            rx.ts_at = now;
            if let Some(q) = rx.owd.on_sample(now, data.timestamp) {
                self.queue_delay = q;
            }
        }
        if marked {
            // DCQCN's notification point: a CNP back, at most one per interval.
            if let Some(interval) = self.rate.cnp_interval_ns() {
                if self.cnp_gate.on_marked(now, interval) {
                    self.cnp_due = Some(path);
                    self.control_dirty = true;
                }
            }
            rx.ce = rx.ce.saturating_add(1);
            rx.ece = true;
        }
        let urgent = marked || bth.ack_req || arrival != Arrival::InOrder || rx.sack.has_gap();
        if urgent || rx.unacked >= self.cfg.ack_every {
            self.acks.at_once(i);
            self.control_dirty = true;
        } else {
            self.acks.by(i, now + self.cfg.ack_delay);
        }
        if duplicate {
            self.counters.duplicates += 1;
            return Err(DropReason::Duplicate);
        }
        // A new packet in the receive window, also one refused below: the port its path sends
        // from (see `on_path_port`). A path that moved to a new port must teach it with a packet
        // refused for now (receiver not ready) too, or its ACKs from there are dropped while
        // what they acknowledge fills the queue that keeps refusing it.
        self.rx_paths[i].peer_port = Some(src_port);
        let stream = usize::from(data.stream_id);
        if stream >= S {
            return self.refuse_invalid(bth.psn, path, &data);
        }
        let end = u64::from(data.msg_offset) + payload_len as u64;
        if end > u64::from(data.msg_len) {
            return self.refuse_invalid(bth.psn, path, &data);
        }
        let delivery = match bth.opcode {
            Opcode::MrWrite | Opcode::MrWriteImm => {
                let Some(remote) = remote_of(ext) else {
                    return self.refuse_invalid(bth.psn, path, &data);
                };
                let len = u64::from(data.msg_len);
                // A Write with immediate needs its receive first: refused for good before one
                // is posted, it would spend an MSN no receive then stood for.
                if bth.opcode == Opcode::MrWriteImm {
                    if let Err(reason) = self.receive_posted(&data) {
                        return self.refuse_message(bth.psn, path, &data, reason);
                    }
                }
                let addr =
                    match self.check_region(remote.rkey, remote.va, len, Access::REMOTE_WRITE) {
                        Ok(base) => base + u64::from(data.msg_offset),
                        Err(reason) if bth.opcode == Opcode::MrWriteImm => {
                            return self.refuse_message(bth.psn, path, &data, reason)
                        }
                        Err(reason) => return self.refuse(bth.psn, path, &data, reason, true),
                    };
                if bth.opcode == Opcode::MrWriteImm {
                    if let Err(reason) = self.receive_into(&data, payload_len, ext.immdt(), true) {
                        return self.refuse_message(bth.psn, path, &data, reason);
                    }
                }
                Delivery::Place {
                    addr,
                    offset: payload_at,
                    len: payload_len,
                }
            }
            Opcode::MrSend | Opcode::MrSendImm => {
                match self.receive_into(&data, payload_len, ext.immdt(), false) {
                    Ok(addr) => Delivery::Place {
                        addr,
                        offset: payload_at,
                        len: payload_len,
                    },
                    Err(reason) => return self.refuse_message(bth.psn, path, &data, reason),
                }
            }
            Opcode::MrReadRequest => {
                let Some(remote) = remote_of(ext) else {
                    return self.refuse_invalid(bth.psn, path, &data);
                };
                let len = u64::from(data.msg_len);
                let va = match self.check_region(remote.rkey, remote.va, len, Access::REMOTE_READ) {
                    Ok(va) => va,
                    Err(reason) => return self.refuse(bth.psn, path, &data, reason, true),
                };
                if self.msgs.is_full() {
                    return self.refuse(bth.psn, path, &data, NackReason::ReceiverNotReady, false);
                }
                let npkts = data.msg_len.div_ceil(self.cfg.mtu).max(1);
                let mut m = TxMsg::response(MsgKind::ReadResponse, data.stream_id, data.msn, npkts);
                m.local_addr = va;
                m.len = data.msg_len;
                self.push_response(m);
                Delivery::Nothing
            }
            Opcode::MrReadResponse => self.read_response(&data, payload_at, payload_len),
            Opcode::MrCompareSwap | Opcode::MrFetchAdd => {
                let Extensions::MrAtomic(_, a) = *ext else {
                    return self.refuse_invalid(bth.psn, path, &data);
                };
                if a.va % 8 != 0 {
                    return self.refuse_invalid(bth.psn, path, &data);
                }
                let addr = match self.check_region(a.rkey, a.va, 8, Access::REMOTE_ATOMIC) {
                    Ok(addr) => addr,
                    Err(reason) => return self.refuse(bth.psn, path, &data, reason, true),
                };
                // Atomics execute in order after everything sent before them (as Verbs orders
                // them): one that overtook an earlier packet on another path waits, answered
                // receiver-not-ready, and comes again.
                if offset_psn != 0 || self.msgs.is_full() {
                    return self.refuse(bth.psn, path, &data, NackReason::ReceiverNotReady, false);
                }
                self.pending_atomic = Some(PendingAtomic {
                    stream: data.stream_id,
                    msn: data.msn,
                    psn: bth.psn,
                    path,
                    path_seq: data.path_seq,
                });
                let compare = (bth.opcode == Opcode::MrCompareSwap).then_some(a.compare);
                Delivery::Atomic {
                    addr,
                    compare,
                    swap_add: a.swap_add,
                }
            }
            Opcode::MrAtomicResponse => match *ext {
                Extensions::MrAtomicAck(_, orig) => self.atomic_response(&data, orig.orig),
                _ => Delivery::Nothing,
            },
            _ => {
                self.counters.drop_unsupported_opcode += 1;
                return Err(DropReason::UnsupportedOpcode);
            }
        };
        // An atomic's PSN is accepted once its runner reports the result (`atomic_result`) or
        // fails to (`abandon_atomic`): until then no ACK may cover it, since the requester
        // takes a refusal of a PSN already acknowledged for a repeat.
        if !matches!(delivery, Delivery::Atomic { .. }) {
            self.accept(bth.psn);
        }
        self.counters.data_received += 1;
        if let Delivery::Place { len, .. } = delivery {
            self.counters.bytes_placed += len as u64;
        }
        Ok(delivery)
    }

    /// Marks a PSN received and advances the cumulative PSN.
    pub(super) fn accept(&mut self, psn: Psn) {
        self.rx_seen[psn.get() as usize % W] = true;
        while self.rx_seen[self.rx_cum.get() as usize % W] {
            self.rx_seen[self.rx_cum.get() as usize % W] = false;
            self.rx_cum = self.rx_cum.wrapping_add(1);
        }
    }

    /// Checks a remote access against the region table, counting a violation.
    pub(super) fn check_region(
        &mut self,
        key: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<u64, NackReason> {
        self.regions
            .check(key, va, len, need)
            .inspect_err(|_| self.counters.access_violations += 1)
    }

    /// Refuses a malformed request (a stream it does not have, an offset past its message, a
    /// missing header): fatal, with NACK reason InvalidRequest.
    pub(super) fn refuse_invalid(
        &mut self,
        psn: Psn,
        path: PathId,
        data: &MrDataRepr,
    ) -> Result<Delivery, DropReason> {
        self.refuse(psn, path, data, NackReason::InvalidRequest, true)
    }

    /// Refuses a packet of a Send or Write-with-immediate: waiting for a receive buffer
    /// (receiver not ready) is transient; anything else is for good, and also ends the receive
    /// posted for its MSN (`consume_receive`), since its requester's message has failed and no
    /// more of it comes.
    fn refuse_message(
        &mut self,
        psn: Psn,
        path: PathId,
        data: &MrDataRepr,
        reason: NackReason,
    ) -> Result<Delivery, DropReason> {
        let fatal = reason != NackReason::ReceiverNotReady;
        let refused = self.refuse(psn, path, data, reason, fatal);
        if refused.is_ok() && fatal {
            self.consume_receive(data, reason);
        }
        refused
    }

    /// Refuses a packet with a NACK. A fatal refusal consumes the PSN (nothing is placed, the
    /// connection goes on); a transient one leaves it to be sent again.
    pub(super) fn refuse(
        &mut self,
        psn: Psn,
        path: PathId,
        data: &MrDataRepr,
        reason: NackReason,
        fatal: bool,
    ) -> Result<Delivery, DropReason> {
        let nack = MrNackRepr {
            path_id: path.0,
            reason,
            path_seq: data.path_seq,
            stream_id: data.stream_id,
            msn: data.msn,
        };
        let pending = PendingNack { path, psn, nack };
        if fatal {
            // Kept, and repeated, until the requester confirms it: until then no ACK lets the
            // requester count this PSN as accepted.
            if !self.refusals.hold(pending) {
                // Too many unconfirmed: do not accept it now; it comes again.
                self.counters.drop_refusals_full += 1;
                return Err(DropReason::RefusalsFull);
            }
            self.accept(psn);
        } else if let Some(slot) = self.nacks.iter_mut().find(|s| s.is_none()) {
            *slot = Some(pending);
        }
        self.control_dirty = true;
        Ok(Delivery::Nothing)
    }

    /// Whether a receive is posted for the MSN of a Send or Write-with-immediate packet: receiver
    /// not ready when none is yet; for one already completed, the refusal that consumed it (the
    /// rest of a refused message's packets get the same reason), else invalid.
    fn receive_posted(&self, data: &MrDataRepr) -> Result<(), NackReason> {
        let s = &self.rx_streams[usize::from(data.stream_id)];
        let ahead = data.msn.wrapping_sub(s.completed);
        if ahead < s.posted.wrapping_sub(s.completed) {
            return Ok(());
        }
        Err(match s.refused {
            Some((msn, reason)) if msn == data.msn => reason,
            _ if ahead < 1 << 31 => NackReason::ReceiverNotReady,
            _ => NackReason::InvalidRequest,
        })
    }

    /// Matches a Send or Write-with-immediate packet to the receive buffer posted for its MSN and
    /// returns where its payload goes.
    pub(super) fn receive_into(
        &mut self,
        data: &MrDataRepr,
        payload_len: usize,
        imm: Option<u32>,
        write_imm: bool,
    ) -> Result<u64, NackReason> {
        self.receive_posted(data)?;
        let s = &mut self.rx_streams[usize::from(data.stream_id)];
        let slot = &mut s.slots[data.msn as usize % Q];
        if slot.done {
            // Its message is whole, or was refused (its completion may wait behind an earlier
            // receive's, or for room in the event queue): a packet with a fresh PSN for it is
            // not the peer's, or belongs to the refused message.
            return Err(slot.status.unwrap_or(NackReason::InvalidRequest));
        }
        if !write_imm && data.msg_len > slot.cap {
            return Err(NackReason::MessageTooLong);
        }
        if slot.started && (slot.msg_len != data.msg_len || slot.write_imm != write_imm) {
            return Err(NackReason::InvalidRequest);
        }
        // Every byte of a message arrives once (a packet sent again keeps its PSN, and a
        // duplicate PSN never gets here): more than the message holds is not the peer's.
        let got = match slot.got.checked_add(payload_len as u32) {
            Some(got) if got <= data.msg_len => got,
            _ => return Err(NackReason::InvalidRequest),
        };
        slot.started = true;
        slot.msg_len = data.msg_len;
        slot.write_imm = write_imm;
        if imm.is_some() {
            slot.imm = imm;
        }
        let addr = slot.addr + u64::from(data.msg_offset);
        slot.got = got;
        if slot.got == slot.msg_len {
            slot.done = true;
            self.complete_receives(usize::from(data.stream_id));
        }
        Ok(addr)
    }

    /// A Send or Write-with-immediate refused for good (too long for the receive posted for its
    /// MSN, inconsistent with what arrived of its message, a Write outside its grant) consumes
    /// that receive, which completes with the refusal (as a NIC completes it with an error), so
    /// that the stream's later receives complete in turn instead of waiting for good.
    fn consume_receive(&mut self, data: &MrDataRepr, reason: NackReason) {
        if self.receive_posted(data).is_err() {
            return;
        }
        let stream = usize::from(data.stream_id);
        let s = &mut self.rx_streams[stream];
        let slot = &mut s.slots[data.msn as usize % Q];
        if slot.done {
            return;
        }
        slot.done = true;
        slot.status = Some(reason);
        slot.msg_len = 0;
        s.refused = Some((data.msn, reason));
        self.complete_receives(stream);
    }

    pub(super) fn complete_receives(&mut self, stream: usize) {
        loop {
            let s = &mut self.rx_streams[stream];
            if s.completed == s.posted {
                return;
            }
            let slot = s.slots[s.completed as usize % Q];
            if !slot.done {
                return;
            }
            let c = Completion {
                id: slot.id,
                status: slot.status.map_or(Status::Success, Status::Refused),
                kind: if slot.write_imm {
                    CompletionKind::RecvWriteImm
                } else {
                    CompletionKind::Recv
                },
                byte_len: slot.msg_len,
                imm: slot.imm,
                stream: stream as u16,
            };
            if !self.push_completion(c) {
                // The queue is full: the receive stays posted and done until `poll_event`.
                return;
            }
            self.rx_streams[stream].completed = self.rx_streams[stream].completed.wrapping_add(1);
        }
    }

    /// Reports the original value of the atomic the last [`Delivery::Atomic`] asked for; the
    /// response goes back to the requester reliably.
    pub fn atomic_result(&mut self, orig: u64) {
        let Some(p) = self.pending_atomic.take() else {
            return;
        };
        self.accept(p.psn);
        // The cumulative PSN moved now, not when the request arrived: say so at once (an ACK
        // that left meanwhile stopped short of it).
        self.acks.at_once(p.path.index());
        self.control_dirty = true;
        let mut m = TxMsg::response(MsgKind::AtomicResponse, p.stream, p.msn, 1);
        m.len = 8;
        m.atomic = AtomicOperands::Original(orig);
        self.push_response(m);
    }

    /// An atomic the runner was asked to perform but never reported: refuse it (its PSN, not
    /// accepted until now, is accepted with the refusal).
    pub(super) fn abandon_atomic(&mut self) {
        if let Some(p) = self.pending_atomic.take() {
            let data = MrDataRepr {
                path_seq: p.path_seq,
                stream_id: p.stream,
                msn: p.msn,
                ..MrDataRepr::default()
            };
            let _ = self.refuse(p.psn, p.path, &data, NackReason::RemoteOperational, true);
        }
    }

    pub(super) fn atomic_response(&mut self, data: &MrDataRepr, orig: u64) -> Delivery {
        for m in self.msgs.seqs() {
            if let Some(msg) = self.msgs.get_mut(m) {
                if msg.kind == MsgKind::Atomic
                    && msg.stream == data.stream_id
                    && msg.msn == data.msn
                    && msg.next_pkt > 0
                    && !msg.done
                {
                    self.requests_out = self.requests_out.saturating_sub(1);
                    msg.done = true;
                    let addr = msg.local_addr;
                    self.complete_in_order();
                    return Delivery::Value { addr, value: orig };
                }
            }
        }
        Delivery::Nothing
    }

    pub(super) fn read_response(
        &mut self,
        data: &MrDataRepr,
        payload_at: usize,
        payload_len: usize,
    ) -> Delivery {
        for m in self.msgs.seqs() {
            if let Some(msg) = self.msgs.get_mut(m) {
                if msg.kind == MsgKind::Read
                    && msg.stream == data.stream_id
                    && msg.msn == data.msn
                    && msg.next_pkt > 0
                    && !msg.done
                {
                    if u64::from(data.msg_offset) + payload_len as u64 > u64::from(msg.len) {
                        return Delivery::Nothing;
                    }
                    msg.resp_bytes += payload_len as u32;
                    let addr = msg.local_addr + u64::from(data.msg_offset);
                    if msg.resp_bytes >= msg.len {
                        self.requests_out = self.requests_out.saturating_sub(1);
                        msg.done = true;
                        self.complete_in_order();
                    }
                    return Delivery::Place {
                        addr,
                        offset: payload_at,
                        len: payload_len,
                    };
                }
            }
        }
        Delivery::Nothing
    }
}
