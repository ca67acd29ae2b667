//! The send side of the engine: what the connections have to send, staged per path and
//! destination, and sent a GSO run per `sendmmsg` message. A datagram leaves in pieces: its
//! headers and its pad and ICRC from the stage's buffer, its payload straight from the registered
//! memory it lies in (the kernel gathers them; no copy of the payload in user space).

use super::*;
use crate::udp::socket::GatherMsg;
use std::io::IoSlice;
use std::ops::Range;

/// A piece of a staged datagram.
#[derive(Debug, Clone, Copy)]
pub(super) enum Seg {
    /// Bytes of the stage's buffer (headers, pad and ICRC; consecutive ones merged).
    Buf { start: usize, len: usize },
    /// Registered memory (a payload), read again when the stage is sent: it cannot be
    /// deregistered meanwhile, since a stage is always sent before the engine returns.
    Mem { addr: u64, len: usize },
}

/// One message of a `sendmmsg` call: a datagram, or a GSO run of equal segments (the last may be
/// shorter), made of the stage's pieces `segs`.
#[derive(Debug, Clone)]
pub(super) struct Run {
    pub(super) segs: Range<usize>,
    pub(super) len: usize,
    pub(super) segment: usize,
}

/// Datagrams waiting to leave from one source port to one destination: their pieces, cut into
/// messages of one `sendmmsg` call.
pub(super) struct Stage {
    pub(super) key: (u16, SocketAddr),
    pub(super) buf: Vec<u8>,
    pub(super) segs: Vec<Seg>,
    pub(super) msgs: Vec<Run>,
    /// It holds a datagram with payload (sent before those with headers only).
    pub(super) data: bool,
    /// Listed in `Engine::queued`.
    pub(super) queued: bool,
}

/// Where the last datagram staged went: its source port, its destination and its stage.
#[derive(Debug, Clone, Copy)]
pub(super) struct LastPath {
    pub(super) port: u16,
    pub(super) dst: SocketAddr,
    pub(super) stage: usize,
}

/// Payloads up to this long are copied into the stage's buffer (a ping, an atomic, a small
/// message: one piece for the kernel); longer ones leave from registered memory.
const COPY_BELOW: usize = 256;

/// Messages per `sendmmsg` call.
pub(super) const TX_BATCH: usize = 64;

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
        let opts = SocketOptions {
            gro: false,
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

/// Adds `len` bytes of the buffer from `start` as the next piece, joined to the last piece when
/// that one ends where this starts and `join` allows (the same message).
fn push_buf(segs: &mut Vec<Seg>, start: usize, len: usize, join: bool) {
    if len == 0 {
        return;
    }
    if join {
        if let Some(Seg::Buf { start: s, len: l }) = segs.last_mut() {
            if *s + *l == start {
                *l += len;
                return;
            }
        }
    }
    segs.push(Seg::Buf { start, len });
}

/// Whether a datagram of `len` bytes joins the last message of `s` as one more GSO segment.
fn joins(s: &Stage, len: usize, gso: bool) -> bool {
    s.msgs.last().is_some_and(|r| {
        gso && len <= r.segment
            && r.len % r.segment == 0
            && r.len / r.segment < GSO_MAX_SEGMENTS
            && r.len + len <= GSO_MAX_BYTES
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
            segs: Vec::with_capacity(2 * GSO_MAX_SEGMENTS + 1),
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
        let mut qpns = std::mem::take(&mut self.qpn_list);
        qpns.clear();
        qpns.extend(self.qps.keys().copied());
        let mut sent = false;
        for &qpn in &qpns {
            sent |= self.transmit_qp(qpn, now, false);
        }
        self.qpn_list = qpns;
        self.flush();
        sent
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
            let port = tx.src_port;
            let stage = match self.last_path {
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
                    self.last_path = Some(LastPath {
                        port: w,
                        dst: peer,
                        stage: i,
                    });
                    i
                }
            };
            let wire_port = tx.src_port;
            // The datagram is staged in pieces: its headers (from the scratch buffer) and its pad
            // and ICRC in the stage's buffer, its payload where it lies in registered memory
            // (the ICRC reads it there; the kernel copies it from there).
            let s = &mut self.stages[stage];
            let join = joins(s, tx.len, self.gso);
            let first = s.segs.len();
            let start = s.buf.len();
            s.buf.extend_from_slice(&scratch[..tx.header_len]);
            push_buf(&mut s.segs, start, tx.header_len, join);
            let zeros;
            let payload = match self.mems.read(tx.payload_addr, tx.payload_len) {
                Some(p) if p.len() <= COPY_BELOW => {
                    // A small payload is copied: one piece is cheaper for the kernel than three.
                    let at = s.buf.len();
                    s.buf.extend_from_slice(p);
                    push_buf(&mut s.segs, at, p.len(), true);
                    p
                }
                Some(p) => {
                    s.segs.push(Seg::Mem {
                        addr: tx.payload_addr,
                        len: p.len(),
                    });
                    p
                }
                None => {
                    // Cannot happen for buffers checked at post time; send zeros, count it.
                    self.counters.tx_bad_local += 1;
                    let at = s.buf.len();
                    s.buf.resize(at + tx.payload_len, 0);
                    push_buf(&mut s.segs, at, tx.payload_len, true);
                    zeros = vec![0u8; tx.payload_len];
                    &zeros[..]
                }
            };
            let at = s.buf.len();
            let trailer = tx.len - tx.header_len - tx.payload_len;
            s.buf.resize(at + trailer, 0);
            conn.seal_parts(&tx, &scratch[..tx.header_len], payload, &mut s.buf[at..]);
            if let Some(p) = self.pcap.as_mut() {
                let mut d = scratch[..tx.header_len].to_vec();
                d.extend_from_slice(payload);
                d.extend_from_slice(&s.buf[at..]);
                let src = SocketAddr::new(self.local_ip, wire_port);
                write_pcap(
                    p,
                    since(self.epoch),
                    src,
                    peer,
                    crate::udp::socket::ECT0,
                    &d,
                );
            }
            push_buf(&mut s.segs, at, trailer, true);
            sent = true;
            self.staged(stage, first, tx.len, join, tx.payload_len > 0);
        }
        self.scratch = scratch;
        sent
    }

    /// Queues the datagram of `len` bytes whose pieces were just staged in stage `idx` from piece
    /// `first` on: one more segment of the last message when `join`, else a message of its own.
    pub(super) fn staged(&mut self, idx: usize, first: usize, len: usize, join: bool, data: bool) {
        self.counters.tx_packets += 1;
        self.counters.tx_bytes += len as u64;
        let s = &mut self.stages[idx];
        if s.msgs.is_empty() {
            s.data = false;
        }
        if !s.queued {
            s.queued = true;
            self.queued.push(idx);
        }
        s.data |= data;
        let end = s.segs.len();
        match s.msgs.last_mut() {
            Some(r) if join => {
                r.len += len;
                r.segs.end = end;
            }
            _ => s.msgs.push(Run {
                segs: first..end,
                len,
                segment: len,
            }),
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
    }

    pub(super) fn flush_one(&mut self, idx: usize) {
        let batch = self.batch;
        let s = &mut self.stages[idx];
        if s.msgs.is_empty() {
            return;
        }
        let (src_port, dst) = s.key;
        let sock = self.tx[&src_port].sock.as_ref().unwrap_or(&self.rx);
        // The pieces as the kernel reads them: the buffer's, and the payloads in registered
        // memory, which the engine cannot have deregistered since they were staged.
        let mems = &self.mems;
        let mut lost = 0u64;
        let iov: Vec<IoSlice<'_>> = s
            .segs
            .iter()
            .map(|seg| match *seg {
                Seg::Buf { start, len } => IoSlice::new(&s.buf[start..start + len]),
                Seg::Mem { addr, len } => IoSlice::new(mems.read(addr, len).unwrap_or_else(|| {
                    lost += 1;
                    &[]
                })),
            })
            .collect();
        if lost > 0 {
            // Cannot happen (see `Seg::Mem`); the stage is dropped whole, the connections repair it.
            self.counters.tx_errors += s.msgs.len() as u64;
            s.buf.clear();
            s.segs.clear();
            s.msgs.clear();
            return;
        }
        let msgs: Vec<GatherMsg<'_>> = s
            .msgs
            .iter()
            .map(|r| GatherMsg {
                iov: &iov[r.segs.clone()],
                len: r.len,
                segment: r.segment,
            })
            .collect();
        let mut runs: &[GatherMsg<'_>] = &msgs;
        while !runs.is_empty() {
            self.counters.tx_syscalls += 1;
            // One message per call without batching (a GSO run is still one message).
            let call = if batch { runs } else { &runs[..1] };
            match sock.send_gather(&dst, call) {
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
                    // The route cannot segment: datagrams one by one from now on.
                    self.gso = false;
                    self.counters.tx_gso_disabled += 1;
                    let r = runs[0];
                    runs = &runs[1..];
                    let whole: Vec<u8> = r.iov.iter().flat_map(|p| p.iter().copied()).collect();
                    for d in whole.chunks(r.segment) {
                        self.counters.tx_syscalls += 1;
                        if sock.send(&dst, d, 0).is_err() {
                            self.counters.tx_errors += 1;
                        }
                    }
                }
                Err(_) => {
                    // Buffer full or unreachable: these are lost; the connection repairs them.
                    let r = runs[0];
                    runs = &runs[1..];
                    self.counters.tx_errors += r.len.div_ceil(r.segment.max(1)) as u64;
                }
            }
        }
        drop(msgs);
        drop(iov);
        s.buf.clear();
        s.segs.clear();
        s.msgs.clear();
    }
}
