//! Transmit: control packets first, then retransmissions, then new data; headers, and the seal.

use super::*;
use crate::wire::{self, DatagramHeaders};

/// What a paced connection may send at once after idleness: one GSO batch of a host runner.
pub(super) const PACE_BURST: u64 = 64 * 1024;

impl<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize>
    Connection<P, W, S, Q, R>
{
    // ----- transmit ---------------------------------------------------------------------

    /// Writes the next datagram's headers into `buf` (which must hold an MTU plus 128 bytes):
    /// control packets first (NACKs, ACKs, probes: small, and the peer's timers wait on them),
    /// then data; except that the first packet of a Read or atomic response just queued goes
    /// before them, carrying the ACK of its request.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.settle_carried();
        if self.rack_dirty {
            self.detect_overdue(now);
        }
        if buf.len() < self.cfg.mtu as usize + 128 {
            return None;
        }
        if self.response_ready {
            // A response the connection made itself (nobody rings a doorbell for it): its
            // first packet goes first and carries the ACK of the request.
            self.response_ready = false;
            if let Some(t) = self.poll_transmit_data(now, buf) {
                return Some(t);
            }
        }
        if let Some(t) = self.transmit_control(now, buf) {
            return Some(t);
        }
        self.poll_transmit_data(now, buf)
    }

    /// Like [`Connection::poll_transmit`], but only data packets (retransmissions first, then
    /// new ones), leaving NACKs, probes and the ACKs that found no packet to ride on for the
    /// next `poll_transmit`. A runner that has just been handed a request (a doorbell) calls
    /// this first: the answer to a ping leaves at once and carries the ACK of the ping (flag A,
    /// when the packet has room), so a ping-pong needs one datagram each way.
    pub fn poll_transmit_data(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if buf.len() < self.cfg.mtu as usize + 128 {
            return None;
        }
        if self.rate.paced() {
            return self.transmit_paced(now, buf);
        }
        self.transmit_data(now, buf)
    }

    /// Whether [`Connection::poll_transmit_data`] may have another data packet to give now: a
    /// retransmission is queued, or a message has packets left to send. False only when it
    /// surely has none, so that a runner staging what a doorbell made ready can send it without
    /// asking once more (a ping's answer: one call, not two). True does not promise a packet
    /// (the window or the pacer may hold it).
    #[inline]
    pub fn may_transmit_data(&self) -> bool {
        if !self.retx.is_empty() {
            return true;
        }
        let m = self.send_hint;
        if m == self.msgs.tail() {
            return false;
        }
        match self.msgs.get(m) {
            // The search starts here: a message with packets left, or any later one.
            Some(msg) if msg.done || msg.next_pkt >= msg.npkts => {
                m.wrapping_add(1) != self.msgs.tail()
            }
            // Packets left, or a hint the ring has moved past (the search starts at the head).
            _ => true,
        }
    }

    /// A retransmission if one is due, else a new packet; the controller counts it.
    #[inline(always)]
    fn transmit_data(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let t = match self.transmit_retx(now, buf) {
            Some(t) => t,
            None => self.transmit_new(now, buf)?,
        };
        self.rate.on_departure(now, t.len as u64, PACE_BURST);
        Some(t)
    }

    /// The data of a rate-limited connection (a rate controller, or the receiver's hint): held
    /// back until the pacer's departure time, which `poll_timeout` then reports.
    #[inline(never)]
    fn transmit_paced(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let full = u64::from(self.cfg.mtu) + 64;
        if let Some(at) = self.rate.next_departure(now, full, PACE_BURST) {
            if at > now {
                self.pace_at = Some(at);
                return None;
            }
        }
        self.pace_at = None;
        self.transmit_data(now, buf)
    }

    /// The BTH of a datagram to the peer (its pad count is set when the headers are written).
    pub(super) fn bth(&self, opcode: Opcode, psn: Psn, ack_req: bool) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: self.cfg.pkey,
            fecn: false,
            becn: false,
            dest_qp: self.cfg.remote_qpn,
            ack_req,
            psn,
        }
    }

    /// Writes the headers of a datagram on `path` into `buf` (the wire lays them out, the carried
    /// ACK included): what the runner needs to copy the payload after them and seal it.
    pub(super) fn write_headers(
        &self,
        buf: &mut [u8],
        headers: DatagramHeaders,
        path: PathId,
        payload_addr: u64,
        payload_len: usize,
    ) -> Option<Transmit> {
        let header_len = headers.emit(buf).ok()?;
        Some(Transmit {
            path,
            src_port: self.paths[path.index()].stats.src_port,
            header_len,
            payload_addr,
            payload_len,
            len: headers.datagram_len(header_len, payload_len),
        })
    }

    /// Headers of a control datagram (no payload): an ACK, a NACK, a probe or its reply.
    pub(super) fn write_control(
        &self,
        buf: &mut [u8],
        opcode: Opcode,
        psn: Psn,
        ext: Extensions,
        path: PathId,
    ) -> Option<Transmit> {
        let headers = DatagramHeaders::new(self.bth(opcode, psn, false), ext, None, 0);
        self.write_headers(buf, headers, path, 0, 0)
    }

    /// Path `i`'s acknowledgement as of `now`; what it reports no longer waits.
    pub(super) fn take_ack(&mut self, i: usize, now: Instant) -> MrAckRepr {
        let refusals = self.refusals.any();
        let rx = &mut self.rx_paths[i];
        let ack = MrAckRepr {
            ece: rx.ece,
            refusals,
            path_id: i as u8,
            ce_count: rx.ce,
            cum_seq: rx.sack.cumulative().0,
            ts_echo: rx.ts,
            ack_delay: now.since(rx.ts_at).min(u64::from(u32::MAX)) as u32,
            rate_hint: self.hint_out,
            sack: rx.sack.to_wire(),
        };
        self.acks.sent(i);
        rx.unacked = 0;
        rx.ce = 0;
        rx.ece = false;
        self.counters.acks_sent += 1;
        ack
    }

    /// A path whose acknowledgement waits (due now first, then delayed ones).
    pub(super) fn waiting_ack(&self) -> Option<usize> {
        self.acks.next()
    }

    pub(super) fn transmit_control(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if !self.control_dirty {
            return None;
        }
        let found = self.transmit_control_scan(now, buf);
        if found.is_none() {
            self.control_dirty = false;
        }
        found
    }

    pub(super) fn transmit_control_scan(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let n = usize::from(self.cfg.paths);
        // A CNP first: the peer's rate cut should not wait behind anything.
        if let Some(path) = self.cnp_due.take() {
            self.counters.cnps_sent += 1;
            let psn = Psn::new(0);
            return self.write_control(buf, Opcode::Cnp, psn, Extensions::Cnp, path);
        }
        // NACKs next: they are rare and unblock the peer.
        let mut pending = self
            .nacks
            .iter_mut()
            .find_map(Option::take)
            .or_else(|| self.unverified_confirm.take());
        if pending.is_none() {
            let next = now + self.cfg.refusal_resend;
            if let Some(r) = self.refusals.due(now) {
                if r.due.is_some() {
                    self.counters.nacks_resent += 1;
                }
                r.due = Some(next);
                pending = Some(r.pending);
            }
        }
        if let Some(pn) = pending {
            self.counters.nacks_sent += 1;
            return self.write_control(
                buf,
                Opcode::MrNack,
                pn.psn,
                Extensions::MrNack(pn.nack),
                pn.path,
            );
        }
        for i in 0..n {
            let rx = &mut self.rx_paths[i];
            if let Some((seq, ts)) = rx.probe_reply.take() {
                let probe = MrProbeRepr {
                    path_id: i as u8,
                    probe_seq: seq,
                    timestamp: now.wire_timestamp(),
                    ts_echo: ts,
                };
                let ext = Extensions::MrProbe(probe);
                return self.write_control(
                    buf,
                    Opcode::MrProbeReply,
                    Psn::new(0),
                    ext,
                    PathId(i as u8),
                );
            }
            if self.acks.is_due_now(i) {
                let ack = self.take_ack(i, now);
                let path = PathId(i as u8);
                return self.write_control(
                    buf,
                    Opcode::MrAck,
                    self.rx_cum,
                    Extensions::MrAck(ack),
                    path,
                );
            }
        }
        for i in 0..n {
            let p = &mut self.paths[i];
            if p.tail_probe_pending {
                p.tail_probe_pending = false;
                p.tail_probe_ts = Some(now.probe_timestamp());
                p.tail_probe_at = now;
                if p.tail_probe_tries == 0 {
                    p.tail_probe_cut = p.next_seq;
                }
                p.tail_probe_tries = p.tail_probe_tries.saturating_add(1);
                return self.send_probe(now, buf, i);
            }
        }
        for i in 0..n {
            if !(self.paths[i].state == PathState::Probing && self.paths[i].probe_pending) {
                continue;
            }
            // Whether the connection waits for the peer: then a silence of every path may be the
            // peer's host (stalled), not the routes.
            let waiting = self.una != self.nxt;
            let heard = self.heard_since(self.paths[i].probe_at);
            let p = &mut self.paths[i];
            p.probe_pending = false;
            // A probe left unanswered counts against the path when the peer was heard since
            // it left (on any path: the peer runs, this route does not carry), when the
            // connection waits for nothing (no evidence the other way), or once the whole
            // peer has been silent for `QUIET_PROBES` probes (every route may be dead: the
            // paths must take new ones). Otherwise the peer's host or this one was stalled
            // and no path is at fault.
            if p.probes_unanswered == 0 || heard || !waiting || p.quiet_probes >= QUIET_PROBES {
                p.probes_unanswered = p.probes_unanswered.saturating_add(1);
                p.quiet_probes = 0;
            } else {
                p.quiet_probes += 1;
            }
            p.probe_at = now;
            if p.probes_unanswered > self.cfg.probes_to_fail {
                // Declare the route dead: new entropy, and keep probing on it.
                p.generation = p.generation.wrapping_add(1);
                p.stats.src_port =
                    entropy_port(self.cfg.entropy_seed, PathId(i as u8), p.generation);
                p.stats.failures += 1;
                p.probes_unanswered = 1;
                let first = !p.failed;
                p.failed = true;
                let port = p.stats.src_port;
                if first {
                    self.counters.path_failures += 1;
                }
                self.push_event(Event::PathFailed {
                    path: PathId(i as u8),
                    new_src_port: port,
                });
            }
            return self.send_probe(now, buf, i);
        }
        None
    }

    /// Writes the next probe of path `i` (a new probe sequence number, this end's clock).
    pub(super) fn send_probe(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        i: usize,
    ) -> Option<Transmit> {
        let p = &mut self.paths[i];
        p.probe_seq = p.probe_seq.wrapping_add(1);
        // A timestamp of 0 marks an answered slot: a probe's is odd, never 0.
        p.probe_ts = now.probe_timestamp();
        p.probe_outstanding = true;
        p.probe_history[p.probe_seq as usize % PROBE_HISTORY] = p.probe_ts;
        let probe = MrProbeRepr {
            path_id: i as u8,
            probe_seq: p.probe_seq,
            timestamp: p.probe_ts,
            ts_echo: 0,
        };
        self.counters.probes_sent += 1;
        let ext = Extensions::MrProbe(probe);
        self.write_control(buf, Opcode::MrProbe, Psn::new(0), ext, PathId(i as u8))
    }

    /// The active path with room that comes next in the round-robin, avoiding `avoid` if another
    /// one has room. With `burst` (a new packet with payload), the path the last such pick took
    /// takes it while its burst lasts (`Config::spray_burst`) and it stays open.
    pub(super) fn pick_path(&mut self, avoid: Option<PathId>, burst: bool) -> Option<PathId> {
        let n = usize::from(self.cfg.paths);
        let last = (self.rr + n - 1) % n;
        if avoid.is_none() && self.idle_but_carried(last) {
            // Nothing in flight (one message at a time, a ping-pong): spraying gains nothing, so
            // stay on the last path while it is idle and healthy; its socket and route stay warm.
            let p = &self.paths[last];
            if p.state == PathState::Active && p.stats.sent > 0 {
                return Some(PathId(last as u8));
            }
        }
        if !self.connection_open() {
            return None;
        }
        let (i, left) = self.burst;
        if burst && left > 0 {
            if Some(PathId(i as u8)) != avoid && self.path_open(i) {
                self.burst.1 = left - 1;
                return Some(PathId(i as u8));
            }
            self.burst.1 = 0;
        }
        let picked = if self.rate.limits_connection() {
            self.pick_roomiest(avoid)
        } else {
            self.pick_next(avoid)
        };
        if let (Some(p), true) = (picked, burst) {
            self.burst = (usize::from(p.0), self.cfg.spray_burst.saturating_sub(1));
        }
        picked
    }

    /// The next path with room in the round-robin, avoiding `avoid` if another one has room.
    fn pick_next(&mut self, avoid: Option<PathId>) -> Option<PathId> {
        let n = usize::from(self.cfg.paths);
        let mut fallback = None;
        for k in 0..n {
            let i = (self.rr + k) % n;
            if !self.path_open(i) {
                continue;
            }
            let id = PathId(i as u8);
            if Some(id) == avoid {
                fallback = Some(id);
                continue;
            }
            self.rr = (i + 1) % n;
            return Some(id);
        }
        fallback
    }

    /// With a connection window (MetaRoCE, Swift) the paths are seldom full, so a round-robin
    /// would spread packets evenly over marked and clear paths alike: the path with the most
    /// room left in its window takes the packet (the next in the round-robin on a tie), so a
    /// path whose window marks have cut carries less, as its window says.
    fn pick_roomiest(&mut self, avoid: Option<PathId>) -> Option<PathId> {
        let n = usize::from(self.cfg.paths);
        let mut best: Option<(u32, usize)> = None;
        let mut fallback = None;
        for k in 0..n {
            let i = (self.rr + k) % n;
            if !self.path_open(i) {
                continue;
            }
            if Some(PathId(i as u8)) == avoid {
                fallback = Some(PathId(i as u8));
                continue;
            }
            let p = &self.paths[i];
            let room = self.rate.window(PathId(i as u8)) - p.next_seq.diff(p.una) as u32;
            if best.is_none_or(|(r, _)| room > r) {
                best = Some((room, i));
                if room >= self.cfg.window_per_path {
                    break; // an idle path with a full window: none has more room
                }
            }
        }
        match best {
            Some((_, i)) => {
                self.rr = (i + 1) % n;
                Some(PathId(i as u8))
            }
            None => fallback,
        }
    }

    /// The path of a packet. An atomic (message `atomic`) sent while another atomic is in
    /// flight keeps to that one's path: atomics must reach the responder in order, which packets
    /// on one path do (one that overtook an earlier packet would be refused receiver-not-ready
    /// and sent again later), so it waits for that path to have room rather than take another,
    /// unless the path failed. Any other packet, and an atomic with none before it in flight,
    /// takes the next path with room, avoiding `avoid` if it can.
    pub(super) fn path_for(
        &mut self,
        atomic: Option<u32>,
        avoid: Option<PathId>,
        burst: bool,
    ) -> Option<PathId> {
        let Some(msg) = atomic else {
            return self.pick_path(avoid, burst);
        };
        if let Some(p) = self.atomic_path {
            let others = self.msgs.seqs().any(|m| {
                m != msg
                    && self
                        .msgs
                        .get(m)
                        .is_some_and(|x| x.kind == MsgKind::Atomic && !x.done && x.next_pkt > 0)
            });
            if others && self.paths[p.index()].state == PathState::Active {
                return (self.path_open(p.index()) && self.connection_open()).then_some(p);
            }
        }
        let p = self.pick_path(avoid, false)?;
        self.atomic_path = Some(p);
        Some(p)
    }

    /// Whether the connection's window (for the controllers that keep one) has room.
    pub(super) fn connection_open(&self) -> bool {
        if !self.rate.limits_connection() {
            return true;
        }
        let n = usize::from(self.cfg.paths);
        let in_flight: u32 = self.paths[..n]
            .iter()
            .map(|p| p.next_seq.diff(p.una) as u32)
            .sum();
        in_flight < self.rate.connection_window()
    }

    /// Whether path `i` is active and has room in its window (the connection's window is
    /// [`Self::connection_open`]'s to check).
    pub(super) fn path_open(&self, i: usize) -> bool {
        let Some(p) = self.paths.get(i) else {
            return false;
        };
        p.state == PathState::Active
            && (p.next_seq.diff(p.una) as u32) < self.rate.window(PathId(i as u8))
    }

    /// Whether nothing is in flight, or nothing would be once the carried ACK not yet taken is
    /// (it reports every transmission of path `last`, and no other path has any in flight).
    pub(super) fn idle_but_carried(&self, last: usize) -> bool {
        if self.una == self.nxt {
            let p = &self.paths[last];
            return p.next_seq == p.una;
        }
        let Some(CarriedAck { ack, .. }) = &self.carried else {
            return false;
        };
        usize::from(ack.path_id) == last
            && PathSeq(ack.cum_seq) == self.paths[last].next_seq
            && self.retx.is_empty()
            && self.inflight.at_most(last)
    }

    pub(super) fn transmit_retx(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        while let Some(&psn) = self.retx.front() {
            let live = self.in_tx_window(psn) && !self.pkts[psn.get() as usize % W].acked;
            if !live {
                // A stale entry: clear the flag only if the slot still holds this PSN.
                let pk = &mut self.pkts[psn.get() as usize % W];
                if pk.psn == psn {
                    pk.queued = false;
                }
                self.retx.pop();
                continue;
            }
            let not_before = self.pkts[psn.get() as usize % W].not_before;
            if not_before > now {
                // Held back (receiver not ready): make sure a timer brings it. An earlier wake
                // may have fired for another packet and left none for this one.
                self.retx_wake = Some(self.retx_wake.map_or(not_before, |w| w.min(not_before)));
                return None;
            }
            let pk = self.pkts[psn.get() as usize % W];
            let atomic = self
                .msgs
                .get(pk.msg)
                .is_some_and(|m| m.kind == MsgKind::Atomic);
            let path = self.path_for(atomic.then_some(pk.msg), Some(pk.path), false)?;
            self.retx.pop();
            self.pkts[psn.get() as usize % W].queued = false;
            if self.pkts[psn.get() as usize % W].path == NO_PATH {
                // Sent again after a receiver-not-ready NACK, not after a loss.
                self.counters.rnr_retries += 1;
            }
            self.counters.retransmitted += 1;
            self.paths[path.index()].stats.retransmitted += 1;
            return self.send_packet(now, buf, psn, path, true);
        }
        None
    }

    pub(super) fn transmit_new(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if psn_diff(self.nxt, self.una) as usize >= W {
            return None;
        }
        // The oldest message with packets left to send, from the hint on, but a Read or atomic
        // request beyond the initiator depth waits, and its stream's later messages with it.
        let mut m = if self.msgs.contains(self.send_hint) || self.send_hint == self.msgs.tail() {
            self.send_hint
        } else {
            self.msgs.head()
        };
        let mut held = [false; S];
        let mut first = None;
        let depth = u16::from(self.cfg.max_rd_atomic.max(1));
        debug_assert_eq!(usize::from(self.requests_out), self.count_requests_out());
        let found = loop {
            if m == self.msgs.tail() {
                if let Some(f) = first {
                    self.send_hint = f;
                }
                return None;
            }
            if let Some(msg) = self.msgs.get(m) {
                if !msg.done && msg.next_pkt < msg.npkts {
                    first.get_or_insert(m);
                    let stream = usize::from(msg.stream) % S;
                    match msg.kind {
                        // Responses answer the peer's requests: never held.
                        MsgKind::ReadResponse | MsgKind::AtomicResponse => break m,
                        _ if held[stream] => {}
                        MsgKind::Read | MsgKind::Atomic
                            if msg.next_pkt == 0 && self.requests_out >= depth =>
                        {
                            let first_hold = !msg.held;
                            if first_hold {
                                // Counted again over the ring once per request held: a count
                                // that drifted would hold every request for good.
                                self.requests_out = self.count_requests_out() as u16;
                                if self.requests_out < depth {
                                    break m;
                                }
                                self.counters.requests_waited += 1;
                            }
                            held[stream] = true;
                            if let Some(x) = self.msgs.get_mut(m) {
                                x.held = true;
                            }
                        }
                        _ => break m,
                    }
                }
            }
            m = m.wrapping_add(1);
        };
        // The next search starts at the oldest message left, a held request included.
        self.send_hint = first.unwrap_or(found);
        let (kind, len) = self
            .msgs
            .get(found)
            .map_or((None, 0), |m| (Some(m.kind), m.len));
        let atomic = kind == Some(MsgKind::Atomic);
        // Packets with payload spray in bursts; requests, atomics and empty messages pick a
        // path each.
        let burst = len > 0
            && matches!(
                kind,
                Some(MsgKind::Send | MsgKind::Write | MsgKind::ReadResponse)
            );
        let path = self.path_for(atomic.then_some(found), None, burst)?;
        let psn = self.nxt;
        self.nxt = self.nxt.wrapping_add(1);
        let msg = self.msgs.get_mut(found)?;
        let idx = msg.next_pkt;
        if idx == 0 && matches!(msg.kind, MsgKind::Read | MsgKind::Atomic) {
            self.requests_out += 1;
        }
        msg.next_pkt += 1;
        msg.last_psn = Some(psn);
        self.pkts[psn.get() as usize % W] = TxPkt {
            psn,
            msg: found,
            idx,
            path,
            ..TxPkt::default()
        };
        self.counters.data_sent += 1;
        self.send_packet(now, buf, psn, path, false)
    }

    /// Read and atomic requests sent and not yet answered, counted over the ring (what
    /// `requests_out` keeps; checked against it in debug builds).
    fn count_requests_out(&self) -> usize {
        let mut n = 0;
        let mut m = self.msgs.head();
        while m != self.msgs.tail() {
            if let Some(msg) = self.msgs.get(m) {
                if matches!(msg.kind, MsgKind::Read | MsgKind::Atomic)
                    && msg.next_pkt > 0
                    && !msg.done
                {
                    n += 1;
                }
            }
            m = m.wrapping_add(1);
        }
        n
    }

    pub(super) fn send_packet(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        psn: Psn,
        path: PathId,
        retransmit: bool,
    ) -> Option<Transmit> {
        let pk = self.pkts[psn.get() as usize % W];
        let msg = *self.msgs.get(pk.msg)?;
        let p = &mut self.paths[path.index()];
        let seq = p.next_seq;
        p.next_seq = seq.add(1);
        self.inflight.insert(path.index());
        let slot = seq.0 as usize % PATH_RING;
        p.ring_psn[slot] = psn.get();
        p.ring_sent[slot] = now;
        p.stats.sent += 1;
        let pk = &mut self.pkts[psn.get() as usize % W];
        pk.path = path;
        pk.seq = seq;
        pk.sent_at = now;
        let idx = pk.idx;

        let mtu = self.cfg.mtu;
        let offset = idx * mtu;
        let (len, opcode) = match msg.kind {
            MsgKind::Read => (0, Opcode::MrReadRequest),
            MsgKind::Atomic if matches!(msg.atomic, AtomicOperands::CompareSwap { .. }) => {
                (0, Opcode::MrCompareSwap)
            }
            MsgKind::Atomic => (0, Opcode::MrFetchAdd),
            MsgKind::AtomicResponse => (0, Opcode::MrAtomicResponse),
            MsgKind::ReadResponse => (
                msg.len.saturating_sub(offset).min(mtu),
                Opcode::MrReadResponse,
            ),
            MsgKind::Send => (
                msg.len.saturating_sub(offset).min(mtu),
                if msg.imm.is_some() {
                    Opcode::MrSendImm
                } else {
                    Opcode::MrSend
                },
            ),
            MsgKind::Write => (
                msg.len.saturating_sub(offset).min(mtu),
                if msg.imm.is_some() {
                    Opcode::MrWriteImm
                } else {
                    Opcode::MrWrite
                },
            ),
        };
        // An acknowledgement that waits rides along when the packet stays within a full one.
        let piggy = if len as usize + PiggyAck::LEN <= mtu as usize {
            self.waiting_ack().map(|i| PiggyAck {
                cum_psn: self.rx_cum,
                ack: self.take_ack(i, now),
            })
        } else {
            None
        };
        if piggy.is_some() {
            self.counters.acks_piggybacked += 1;
        }
        let data = MrDataRepr {
            retransmit,
            ack: piggy.is_some(),
            path_id: path.0,
            stream_id: msg.stream,
            path_seq: seq.0,
            msn: msg.msn,
            msg_offset: offset,
            msg_len: msg.len,
            timestamp: now.data_timestamp(),
        };
        let remote = MrRemoteRepr {
            va: msg.remote.va,
            rkey: msg.remote.rkey,
        };
        let ext = match (opcode, msg.imm) {
            (Opcode::MrWrite | Opcode::MrReadRequest, _) => Extensions::MrRemote(data, remote),
            (Opcode::MrWriteImm, Some(i)) => Extensions::MrRemoteImm(data, remote, i),
            (Opcode::MrSendImm, Some(i)) => Extensions::MrDataImm(data, i),
            (Opcode::MrCompareSwap | Opcode::MrFetchAdd, _) => Extensions::MrAtomic(
                data,
                AtomicEthRepr {
                    va: msg.remote.va,
                    rkey: msg.remote.rkey,
                    swap_add: msg.atomic.eth_values().0,
                    compare: msg.atomic.eth_values().1,
                },
            ),
            (Opcode::MrAtomicResponse, _) => {
                let orig = match msg.atomic {
                    AtomicOperands::Original(v) => v,
                    _ => 0,
                };
                Extensions::MrAtomicAck(data, AtomicAckEthRepr { orig })
            }
            _ => Extensions::MrData(data),
        };
        let last = idx + 1 == msg.npkts;
        let headers = DatagramHeaders::new(self.bth(opcode, psn, last), ext, piggy, len as usize);
        let addr = msg.local_addr + u64::from(offset);
        self.write_headers(buf, headers, path, addr, len as usize)
    }

    /// Adds the pad and the ICRC to a datagram whose headers came from
    /// [`Connection::poll_transmit`] and whose payload the runner has copied in after them.
    pub fn seal(&mut self, tx: &Transmit, buf: &mut [u8]) {
        let Some(datagram) = buf.get_mut(..tx.len) else {
            return;
        };
        let payload_end = tx.header_len + tx.payload_len;
        let (icrc_tx, cfg) = (&mut self.icrc_tx, &self.cfg);
        // A Transmit from this connection always fits (its len counts the ICRC).
        let _ = wire::seal(datagram, payload_end, |covered| {
            if !cfg.icrc.sends() {
                return 0;
            }
            icrc_tx.icrc(
                (cfg.local_ip, cfg.remote_ip),
                (tx.src_port, cfg.dst_port),
                &[covered],
                cfg.icrc_engine,
                icrc_set(Some(tx.path.0), tx.src_port),
            )
        });
    }

    /// [`Connection::seal`] for a datagram whose payload stays where it lies (a runner that sends
    /// it from there, such as by `sendmsg` with the headers, the payload and the trailer as three
    /// pieces): `head` holds the headers from [`Connection::poll_transmit`] and room for the
    /// trailer after them (`tx.len - tx.payload_len` bytes in all), `payload` the
    /// `tx.payload_len` bytes. Writes the pad and the ICRC into the trailer; the ICRC is the one
    /// [`Connection::seal`] computes over the same bytes joined. Returns false, and leaves `head`
    /// untouched, for a `head` or `payload` of the wrong length.
    pub fn seal_split(&mut self, tx: &Transmit, head: &mut [u8], payload: &[u8]) -> bool {
        let trailer_len = tx.len.saturating_sub(tx.header_len + tx.payload_len);
        if trailer_len < 4
            || payload.len() != tx.payload_len
            || head.len() != tx.header_len + trailer_len
        {
            return false;
        }
        let icrc_at = head.len() - 4;
        head[tx.header_len..icrc_at].fill(0);
        let value = if self.cfg.icrc.sends() {
            let (headers, pad) = head[..icrc_at].split_at(tx.header_len);
            self.icrc_tx.icrc(
                (self.cfg.local_ip, self.cfg.remote_ip),
                (tx.src_port, self.cfg.dst_port),
                &[headers, payload, pad],
                self.cfg.icrc_engine,
                icrc_set(Some(tx.path.0), tx.src_port),
            )
        } else {
            0
        };
        head[icrc_at..].copy_from_slice(&value.to_le_bytes());
        true
    }
}
