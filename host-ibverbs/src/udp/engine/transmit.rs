//! The send side of the engine: what the connections have to send, built in place in a stage per
//! path and destination, and sent a GSO run per `sendmmsg` message.

use super::*;
use crate::udp::socket::{PieceMsg, SendRun};
use std::io::IoSlice;

/// Payloads this long or longer leave from where they lie in their region (the send call reads
/// them there: no copy into the stage); shorter ones are copied in with their headers, which
/// costs less than a piece of their own in the call (a ping's two bytes).
pub(super) const IN_PLACE_MIN: usize = 512;

/// A piece of a staged datagram: bytes of the stage's buffer, or a payload in a region, read by
/// the send call where it lies.
#[derive(Debug, Clone, Copy)]
pub(super) enum Piece {
    Staged { start: usize, len: usize },
    Region { addr: u64, len: usize },
}

/// A message of one `sendmmsg` call: a single datagram or a GSO run of equal segments (the last
/// may be shorter), made of the stage's pieces `first..end`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    pub(super) first: usize,
    pub(super) end: usize,
    pub(super) len: usize,
    pub(super) segment: usize,
}

/// Datagrams waiting to leave from one source port to one destination: their headers (and
/// short payloads) in one buffer, the pieces they are made of, and the messages of one
/// `sendmmsg` call they are cut into.
pub(super) struct Stage {
    pub(super) key: (u16, SocketAddr),
    pub(super) buf: Vec<u8>,
    pub(super) pieces: Vec<Piece>,
    /// Some piece is a payload in a region (else every message is one run of `buf`).
    pub(super) in_place: bool,
    pub(super) msgs: Vec<Run>,
    /// It holds a datagram with payload (sent before those with headers only).
    pub(super) data: bool,
    /// Listed in `Engine::queued`.
    pub(super) queued: bool,
}

/// Where a datagram of a path port went: its source port, its destination and its stage.
#[derive(Debug, Clone, Copy)]
pub(super) struct StagedPath {
    pub(super) port: u16,
    pub(super) dst: SocketAddr,
    pub(super) stage: usize,
}

/// Entries of the engine's path cache (`Engine::path_cache`): more than the paths of a few
/// connections.
pub(super) const PATH_CACHE: usize = 64;

/// Messages per `sendmmsg` call.
pub(super) const TX_BATCH: usize = 64;

/// Send sockets (and stages) an engine keeps before it looks for unused ones
/// (`Engine::drop_unused_paths`).
pub(super) const MIN_TX_LIMIT: usize = 256;

/// A path's send socket and the UDP source port its datagrams really carry.
pub(super) struct TxSocket {
    /// None: nothing could be bound; the receive socket sends for the path.
    pub(super) sock: Option<UdpSocket>,
    pub(super) port: u16,
}

/// The send socket of path port `src_port` (bound and connected to `dst` on first use) and the
/// source port it really sends from. When another process holds the path's port, a free port
/// carries the path instead (counted): the ICRC covers the UDP source port, so the runner seals
/// every datagram over the port on the wire.
pub(super) fn tx_socket<'a>(
    tx: &'a mut HashMap<u16, TxSocket>,
    counters: &mut EngineCounters,
    rx: &UdpSocket,
    opts: &SocketOptions,
    local_ip: IpAddr,
    src_port: u16,
    dst: SocketAddr,
) -> &'a TxSocket {
    tx.entry(src_port).or_insert_with(|| {
        // Send-only: nothing arrives on it for the engine to date or coalesce.
        let opts = SocketOptions {
            gro: false,
            arrival_times: false,
            ..*opts
        };
        let bind = |port| {
            UdpSocket::bind(SocketAddr::new(local_ip, port), &opts)
                .ok()
                .map(|mut s| {
                    // A send-only socket: connecting it caches the route to its first peer.
                    let _ = s.connect(dst);
                    s
                })
        };
        let mut sock = bind(src_port);
        if sock.is_none() {
            counters.tx_port_fallback += 1;
            sock = bind(0);
        }
        let port = sock.as_ref().unwrap_or(rx).local_addr().port();
        TxSocket { sock, port }
    })
}

/// The stage of (path port, destination) `key`, made on first use.
pub(super) fn stage_of(
    stages: &mut Vec<Stage>,
    index: &mut HashMap<(u16, SocketAddr), usize>,
    key: (u16, SocketAddr),
) -> usize {
    *index.entry(key).or_insert_with(|| {
        stages.push(Stage {
            key,
            buf: Vec::with_capacity(GSO_MAX_BYTES),
            pieces: Vec::with_capacity(3 * GSO_MAX_SEGMENTS),
            in_place: false,
            msgs: Vec::with_capacity(TX_BATCH),
            data: false,
            queued: false,
        });
        stages.len() - 1
    })
}

impl Engine {
    /// Asks every connection for what it has to send, fills in payloads from memory, and sends
    /// it, one GSO call per path where consecutive datagrams allow.
    pub(super) fn transmit(&mut self, now: Instant) -> bool {
        self.transmit_all(now, false)
    }

    /// Sends what every queue pair has to send (only data packets with `data_only`).
    pub(super) fn transmit_all(&mut self, now: Instant, data_only: bool) -> bool {
        if self.tx.len() > self.tx_limit || self.stages.len() > self.tx_limit {
            self.drop_unused_paths();
        }
        let mut qpns = std::mem::take(&mut self.qpn_list);
        qpns.clear();
        qpns.extend(self.qps.keys().copied());
        let mut sent = false;
        for &qpn in &qpns {
            sent |= self.transmit_qp(qpn, now, data_only);
        }
        self.qpn_list = qpns;
        self.flush();
        sent
    }

    /// Closes the send sockets and frees the stages of path ports no connection uses any more: a
    /// path that fails moves to a new port (a new ECMP route), and a peer that makes paths fail
    /// again and again (or queue pairs that come and go) would otherwise leave a socket and a
    /// 64 KiB stage behind each time, without bound. Runs when either count passes twice what
    /// was in use at the last pass (at least [`MIN_TX_LIMIT`]), between rounds, when no stage
    /// holds datagrams.
    pub(super) fn drop_unused_paths(&mut self) {
        if !self.queued.is_empty() {
            return;
        }
        let mut in_use: Vec<u16> = self
            .qps
            .values()
            .filter_map(|qp| qp.conn.as_ref())
            .flat_map(|c| {
                (0..c.config().paths)
                    .filter_map(|i| Some(c.path_stats(transport_core::conn::PathId(i))?.src_port))
            })
            .collect();
        in_use.sort_unstable();
        let used = |port: &u16| in_use.binary_search(port).is_ok();
        let before = self.tx.len() + self.stages.len();
        self.tx.retain(|port, _| used(port));
        self.stages.retain(|s| used(&s.key.0));
        self.stage_of.clear();
        for (i, s) in self.stages.iter().enumerate() {
            self.stage_of.insert(s.key, i);
        }
        self.path_cache = [None; PATH_CACHE];
        self.counters.tx_paths_dropped += (before - self.tx.len() - self.stages.len()) as u64;
        self.tx_limit = (2 * self.tx.len().max(self.stages.len())).max(MIN_TX_LIMIT);
    }

    /// Sends at once what a queue pair can send, right after a post (a doorbell): an answer to
    /// a ping leaves without waiting for the next round of the loop. When the window is full (a
    /// bulk transfer) the connection has nothing to give and this costs one check.
    pub fn kick(&mut self, qpn: u32, now: Instant) {
        self.dirty = true;
        // Data first, sent at once; then what else waits (the ACKs of what arrived).
        if self.transmit_qp(qpn, now, true) {
            self.flush();
        }
        if self.transmit_qp(qpn, now, false) {
            self.flush();
        }
    }

    /// Stages everything one queue pair has to send (only data packets with `data_only`).
    pub(super) fn transmit_qp(&mut self, qpn: u32, now: Instant, data_only: bool) -> bool {
        let mut sent = false;
        let mut scratch = std::mem::take(&mut self.scratch);
        while let Some(qp) = self.qps.get_mut(&qpn) {
            let (Some(conn), Some(peer)) = (qp.conn.as_mut(), qp.peer) else {
                break;
            };
            let next = if data_only {
                conn.poll_transmit_data(now, &mut scratch)
            } else {
                conn.poll_transmit(now, &mut scratch)
            };
            let Some(mut tx) = next else {
                break;
            };
            let more = !data_only || conn.may_transmit_data();
            let port = tx.src_port;
            let slot = usize::from(port) % PATH_CACHE;
            let stage = match self.path_cache[slot] {
                Some(l) if l.port == port && l.dst == peer => l.stage,
                _ => {
                    let w = tx_socket(
                        &mut self.tx,
                        &mut self.counters,
                        &self.rx,
                        &self.opts,
                        self.local_ip,
                        port,
                        peer,
                    )
                    .port;
                    if w != port {
                        // Another process holds the path's port: the socket bound instead
                        // carries the path, and the connection learns its port, so that this
                        // datagram's ICRC, the wire and the path's statistics agree on it.
                        conn.bind_path_port(tx.path, w);
                        if let Some(s) = self.tx.remove(&port) {
                            self.tx.insert(w, s);
                        }
                        tx.src_port = w;
                    }
                    let i = stage_of(&mut self.stages, &mut self.stage_of, (w, peer));
                    self.path_cache[usize::from(w) % PATH_CACHE] = Some(StagedPath {
                        port: w,
                        dst: peer,
                        stage: i,
                    });
                    i
                }
            };
            let wire_port = tx.src_port;
            let buf = &mut self.stages[stage].buf;
            let start = buf.len();
            let trailer = tx.len - tx.header_len - tx.payload_len;
            let payload = match self.mems.read(tx.payload_addr, tx.payload_len) {
                Some(p) => Some(p),
                None => {
                    // Cannot happen for buffers checked at post time; send zeros, count it.
                    self.counters.tx_bad_local += 1;
                    None
                }
            };
            let mut in_place = None;
            if let Some(p) = payload.filter(|_| self.in_place && tx.payload_len >= IN_PLACE_MIN) {
                // Headers and trailer here, the payload read from its region by the send call:
                // no copy of it in user space.
                buf.reserve(tx.header_len + trailer);
                buf.extend_from_slice(&scratch[..tx.header_len]);
                buf.resize(start + tx.header_len + trailer, 0);
                if conn.seal_split(&tx, &mut buf[start..], p) {
                    self.counters.tx_in_place += 1;
                    in_place = Some(tx.header_len);
                } else {
                    // (Lengths a Transmit always has right; copied below if ever not.)
                    buf.truncate(start);
                }
            }
            if in_place.is_none() {
                // The datagram is built where it leaves from, the stage's buffer: headers from
                // the scratch buffer, the payload from the region (one copy), then pad and ICRC
                // in place. (`Connection::fill_and_seal` wants the datagram's room laid out
                // first, which here would zero the payload's bytes before copying them: the copy
                // appends instead.)
                buf.reserve(tx.len);
                buf.extend_from_slice(&scratch[..tx.header_len]);
                match payload {
                    Some(p) => buf.extend_from_slice(p),
                    None => buf.resize(start + tx.header_len + tx.payload_len, 0),
                }
                buf.resize(start + tx.len, 0);
                conn.seal(&tx, &mut buf[start..]);
            }
            sent = true;
            let shape = Datagram {
                start,
                len: tx.len,
                in_place: in_place.map(|h| (h, tx.payload_addr, tx.payload_len)),
            };
            self.staged(stage, wire_port, peer, shape, tx.payload_len > 0);
            if !more {
                // What the doorbell made ready is staged: it goes now, without asking again.
                break;
            }
        }
        self.scratch = scratch;
        sent
    }

    /// Queues datagram `d` of stage `idx`, whose path leaves from `wire_port`.
    pub(super) fn staged(
        &mut self,
        idx: usize,
        wire_port: u16,
        dst: SocketAddr,
        d: Datagram,
        data: bool,
    ) {
        let len = d.len;
        self.counters.tx_packets += 1;
        self.counters.tx_bytes += len as u64;
        if let Some(p) = self.pcap.as_mut() {
            // (A capture turns payloads in place off: the datagram is whole in the buffer.)
            let t = since(self.epoch);
            write_pcap(
                p,
                t,
                SocketAddr::new(self.local_ip, wire_port),
                dst,
                crate::udp::socket::ECT0,
                &self.stages[idx].buf[d.start..],
            );
        }
        let gso = self.gso;
        let s = &mut self.stages[idx];
        if s.msgs.is_empty() {
            s.data = false;
        }
        if !s.queued {
            s.queued = true;
            self.queued.push(idx);
        }
        s.data |= data;
        let extend = s.msgs.last().is_some_and(|r| {
            gso && len <= r.segment
                && r.len % r.segment == 0
                && r.len / r.segment < GSO_MAX_SEGMENTS
                && r.len + len <= GSO_MAX_BYTES
        });
        if !extend {
            let at = s.pieces.len();
            s.msgs.push(Run {
                first: at,
                end: at,
                len: 0,
                segment: len,
            });
        }
        let first = s.msgs.last().map_or(0, |r| r.first);
        let mut push = |p: Piece| {
            // Bytes that follow the message's last piece in the buffer join it.
            if let (Some(Piece::Staged { start, len }), Piece::Staged { start: s2, len: l2 }) =
                (s.pieces[first..].last_mut(), p)
            {
                if *start + *len == s2 {
                    *len += l2;
                    return;
                }
            }
            s.pieces.push(p);
        };
        match d.in_place {
            None => push(Piece::Staged {
                start: d.start,
                len,
            }),
            Some((header_len, addr, payload_len)) => {
                push(Piece::Staged {
                    start: d.start,
                    len: header_len,
                });
                push(Piece::Region {
                    addr,
                    len: payload_len,
                });
                push(Piece::Staged {
                    start: d.start + header_len,
                    len: len - header_len - payload_len,
                });
                s.in_place = true;
            }
        }
        let end = s.pieces.len();
        if let Some(r) = s.msgs.last_mut() {
            r.end = end;
            r.len += len;
        }
        if s.msgs.len() >= TX_BATCH {
            self.flush_one(idx);
        }
    }

    pub(super) fn flush(&mut self) {
        // Payload before acknowledgements: an answer to a ping should not wait behind an ACK.
        let queued = std::mem::take(&mut self.queued);
        for data_pass in [true, false] {
            for &i in &queued {
                if self.stages[i].data == data_pass {
                    self.flush_one(i);
                }
            }
        }
        for &i in &queued {
            self.stages[i].queued = false;
        }
        self.queued = queued;
        self.queued.clear();
        if let Some(x) = self.xdp.as_mut() {
            x.kick();
        }
    }

    /// Sends stage `idx` through the AF_XDP socket (the caller asks the kernel to send at the
    /// end of the flush). False: its destination has no next-hop MAC yet, or is not IPv4; the
    /// UDP socket sends it.
    fn flush_xdp(&mut self, idx: usize) -> bool {
        let (src_port, dst) = self.stages[idx].key;
        let (Some(x), SocketAddr::V4(dst)) = (self.xdp.as_mut(), dst) else {
            return false;
        };
        let s = &mut self.stages[idx];
        let Some(mac) = x.neighbour(*dst.ip()) else {
            self.counters.xdp_tx_via_socket += s
                .msgs
                .iter()
                .map(|r| r.len.div_ceil(r.segment.max(1)) as u64)
                .sum::<u64>();
            return false;
        };
        let mems = &self.mems;
        let bytes = |p: &Piece| -> &[u8] {
            match *p {
                Piece::Staged { start, len } => &s.buf[start..start + len],
                Piece::Region { addr, len } => mems
                    .read(addr, len)
                    .unwrap_or(&ZEROS[..len.min(ZEROS.len())]),
            }
        };
        // Each run is datagrams of `segment` bytes (the last may be shorter), its pieces read
        // in order and cut there: one frame each.
        // (A datagram is at most three pieces: the end of one staged piece, a payload in a
        // region, the start of the next staged piece.)
        let mut parts: [&[u8]; 8] = [&[]; 8];
        for r in &s.msgs {
            let mut pieces = s.pieces[r.first..r.end].iter().map(bytes);
            let mut cur: &[u8] = &[];
            let mut left = r.len;
            while left > 0 {
                let len = left.min(r.segment.max(1));
                let (mut np, mut need, mut whole) = (0, len, true);
                while need > 0 {
                    if cur.is_empty() {
                        match pieces.next() {
                            Some(p) => cur = p,
                            None => break,
                        }
                        continue;
                    }
                    let n = need.min(cur.len());
                    match parts.get_mut(np) {
                        Some(slot) => *slot = &cur[..n],
                        None => whole = false,
                    }
                    np += 1;
                    cur = &cur[n..];
                    need -= n;
                }
                if whole && need == 0 {
                    x.send(mac, src_port, dst, &mut parts[..np].iter().copied(), len);
                } else {
                    // (Never, as staging lays datagrams out; not sent rather than sent wrong.)
                    self.counters.tx_errors += 1;
                }
                left -= len;
            }
        }
        s.buf.clear();
        s.pieces.clear();
        s.in_place = false;
        s.msgs.clear();
        true
    }

    pub(super) fn flush_one(&mut self, idx: usize) {
        if self.stages[idx].msgs.is_empty() || self.flush_xdp(idx) {
            return;
        }
        let batch = self.batch;
        let s = &mut self.stages[idx];
        let (src_port, dst) = s.key;
        let sock = self.tx[&src_port].sock.as_ref().unwrap_or(&self.rx);
        // The pieces as the call reads them: the stage's buffer, and payloads read from their
        // regions, checked against the live regions again (nothing ran between staging and here
        // that could remove one; a region that were gone would send zeros, as at staging).
        let mems = &self.mems;
        let iovs: Vec<IoSlice<'_>> = if s.in_place {
            s.pieces
                .iter()
                .map(|p| match *p {
                    Piece::Staged { start, len } => IoSlice::new(&s.buf[start..start + len]),
                    Piece::Region { addr, len } => IoSlice::new(
                        mems.read(addr, len)
                            .unwrap_or(&ZEROS[..len.min(ZEROS.len())]),
                    ),
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut runs: &[Run] = &s.msgs;
        // A run the route cannot segment goes datagram by datagram, its pieces joined.
        let apart = |r: Run, counters: &mut EngineCounters| {
            let joined: Vec<u8> = if s.in_place {
                iovs[r.first..r.end]
                    .iter()
                    .flat_map(|p| p.iter().copied())
                    .collect()
            } else {
                Vec::new()
            };
            let bytes = if s.in_place {
                &joined[..]
            } else {
                match s.pieces[r.first] {
                    Piece::Staged { start, .. } => &s.buf[start..start + r.len],
                    Piece::Region { .. } => &[][..],
                }
            };
            for d in bytes.chunks(r.segment) {
                counters.tx_syscalls += 1;
                if sock.send(&dst, d, 0).is_err() {
                    counters.tx_errors += 1;
                }
            }
        };
        while !runs.is_empty() {
            if !self.gso && runs[0].len > runs[0].segment {
                // Staged before the route was found unable to segment: not offered again.
                apart(runs[0], &mut self.counters);
                runs = &runs[1..];
                continue;
            }
            self.counters.tx_syscalls += 1;
            // One message per call without batching (a GSO run is still one message); once
            // GSO is off, only the runs before the next one that would need it.
            let call = if batch { runs } else { &runs[..1] };
            let call = if self.gso {
                call
            } else {
                let k = call.iter().position(|r| r.len > r.segment);
                &call[..k.unwrap_or(call.len())]
            };
            // (A call of one message, a ping's answer, fills no table of TX_BATCH entries.)
            let piece_msg = |r: &Run| PieceMsg {
                first: r.first,
                end: r.end,
                segment: r.segment,
            };
            let send_run = |r: &Run| SendRun {
                start: match s.pieces[r.first] {
                    Piece::Staged { start, .. } => start,
                    Piece::Region { .. } => 0,
                },
                len: r.len,
                segment: r.segment,
            };
            let result = if call.len() == 1 {
                if s.in_place {
                    sock.send_many_pieces(&dst, &iovs, &[piece_msg(&call[0])])
                } else {
                    sock.send_many(&dst, &s.buf, &[send_run(&call[0])])
                }
            } else if s.in_place {
                let mut msgs = [PieceMsg {
                    first: 0,
                    end: 0,
                    segment: 0,
                }; TX_BATCH];
                let n = call.len().min(TX_BATCH);
                for (m, r) in msgs.iter_mut().zip(&call[..n]) {
                    *m = piece_msg(r);
                }
                sock.send_many_pieces(&dst, &iovs, &msgs[..n])
            } else {
                let mut msgs = [SendRun {
                    start: 0,
                    len: 0,
                    segment: 0,
                }; TX_BATCH];
                let n = call.len().min(TX_BATCH);
                for (m, r) in msgs.iter_mut().zip(&call[..n]) {
                    *m = send_run(r);
                }
                sock.send_many(&dst, &s.buf, &msgs[..n])
            };
            match result {
                Ok(0) => break,
                Ok(n) => {
                    self.counters.tx_gso_batches +=
                        runs[..n].iter().filter(|r| r.len > r.segment).count() as u64;
                    runs = &runs[n..];
                }
                Err(e)
                    if runs[0].len > runs[0].segment
                        && matches!(
                            e.raw_os_error(),
                            Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT)
                        ) =>
                {
                    // The route cannot segment: datagrams one by one from now on, the runs of
                    // this flush staged for GSO included.
                    if self.gso {
                        self.gso = false;
                        self.counters.tx_gso_disabled += 1;
                    }
                    apart(runs[0], &mut self.counters);
                    runs = &runs[1..];
                }
                Err(_) => {
                    // Buffer full or unreachable: these are lost; the connection repairs them.
                    let r = runs[0];
                    runs = &runs[1..];
                    self.counters.tx_errors += r.len.div_ceil(r.segment.max(1)) as u64;
                }
            }
        }
        s.buf.clear();
        s.pieces.clear();
        s.in_place = false;
        s.msgs.clear();
    }
}

/// Zeros for a payload whose region is gone (never, as the engine runs: see `flush_one`).
static ZEROS: [u8; 65536] = [0; 65536];

/// Where a datagram lies in its stage's buffer: `len` bytes from `start`, or, with
/// `in_place` (header length, payload address, payload length), its headers and trailer there
/// and its payload in a region.
#[derive(Debug, Clone, Copy)]
pub(super) struct Datagram {
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) in_place: Option<(usize, u64, usize)>,
}
