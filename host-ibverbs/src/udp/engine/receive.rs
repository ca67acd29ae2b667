//! The receive side of the engine: batches from the receive socket, each datagram demultiplexed
//! to its connection and what it delivers applied to memory.

use super::*;
use transport_core::wire::Datagram;

/// With the AF_XDP datapath, the UDP socket is read every this many rounds.
const XDP_SOCKET_ROUNDS: u64 = 64;

impl Engine {
    /// Reads what waits on the receive socket and hands it to the connections.
    /// Without batched calls, up to `want` calls of one datagram each, until one finds none.
    pub(super) fn receive(&mut self, now: Instant, want: usize) -> usize {
        // With the AF_XDP datapath arrivals come through its ring (no system call); the UDP
        // socket still gets what the XDP program leaves to the kernel's stack (fragments, another
        // interface, this host): read every few rounds, and by `receive_all`.
        self.receive_from(now, want, self.counters.rounds % XDP_SOCKET_ROUNDS == 0)
    }

    /// As `receive`, reading the UDP socket too with the AF_XDP datapath (after a sleep, which
    /// either may have ended, or a stall).
    pub(super) fn receive_all(&mut self, now: Instant, want: usize) -> usize {
        self.receive_from(now, want, true)
    }

    /// The AF_XDP ring (with the datapath), then the UDP socket: always without the datapath,
    /// with it when `socket` says so.
    fn receive_from(&mut self, now: Instant, want: usize, socket: bool) -> usize {
        if self.xdp.is_none() {
            return self.receive_socket(now, want);
        }
        // The ring's frames sit in the UMEM, not in the socket's receive buffers: a full batch
        // takes as many as it did before the buffers followed the cache.
        let ring_want = if want >= self.rx_batch_len {
            super::RX_BATCH_MAX
        } else {
            want
        };
        let got = self.receive_xdp(ring_want);
        if socket {
            got + self.receive_socket(now, want)
        } else {
            got
        }
    }

    /// Reads what waits on the UDP socket and hands it to the connections.
    fn receive_socket(&mut self, now: Instant, want: usize) -> usize {
        if self.batch {
            return self.receive_call(now, want);
        }
        let mut got = 0;
        while got < want {
            let n = self.receive_call(now, 1);
            if n == 0 {
                break;
            }
            got += n;
        }
        got
    }

    /// Hands up to `want` datagrams waiting in the AF_XDP socket's ring to the connections,
    /// dated when read (a spinning end reads them at once; the ring has no arrival times).
    fn receive_xdp(&mut self, want: usize) -> usize {
        let Some(mut x) = self.xdp.take() else {
            return 0;
        };
        let mut n = 0;
        if x.pending() {
            let now = self.now();
            self.clock_floor = self.clock_floor.max(now);
            n = x.receive(want, &mut |meta, d| self.dispatch(now, meta, d));
        }
        self.xdp = Some(x);
        n
    }

    /// One receive call for up to `want` datagrams.
    pub(super) fn receive_call(&mut self, now: Instant, want: usize) -> usize {
        let Some(mut batch) = self.rx_batch.take() else {
            return 0;
        };
        let n = match self.rx.recv_batch(&mut batch, want) {
            Ok(n) => n,
            Err(_) => {
                self.counters.rx_errors += 1;
                0
            }
        };
        if n > 0 {
            self.counters.rx_syscalls += 1;
        }
        // Each datagram is dated by the kernel's arrival time where that is later than what the
        // connections were last told (it waited in the socket while this end slept or was
        // descheduled: neither an RTT sample nor an ACK delay may count that), else by now,
        // after the call: an ACK read with the round's start time would shorten its RTT sample
        // by the round's transmissions (and a data packet's time would lengthen the ACK delay
        // its receiver reports, shortening the sender's sample again).
        let (now, real) = match n {
            0 => (now, 0),
            _ if self.opts.arrival_times => (self.now(), crate::udp::socket::realtime_ns()),
            // Nothing is dated by the kernel: no second clock to read.
            _ => (self.now(), 0),
        };
        for i in 0..n {
            let (data, meta) = batch.get(i);
            let at = if meta.arrived_realtime > 0 {
                let waited = real.saturating_sub(meta.arrived_realtime);
                now.before(waited).clamp(self.clock_floor.min(now), now)
            } else {
                now
            };
            self.clock_floor = self.clock_floor.max(at);
            let now = at;
            let seg = if meta.segment > 0 {
                meta.segment
            } else {
                data.len().max(1)
            };
            if data.len() > seg {
                self.counters.rx_gro_batches += 1;
            }
            let mut chunks = data.chunks(seg).peekable();
            while let Some(d) = chunks.next() {
                // The kernel wrote these bytes; their first read misses the cache. Ask for the
                // next datagram's headers while this one is handled.
                match chunks.peek() {
                    Some(next) => prefetch(next),
                    None if i + 1 < n => prefetch(batch.get(i + 1).0),
                    None => {}
                }
                self.dispatch(now, meta, d);
            }
        }
        self.rx_batch = Some(batch);
        n
    }

    /// One datagram: demultiplex by destination QP, check the sender, hand it to the core and
    /// do what it answers.
    pub(super) fn dispatch(&mut self, now: Instant, meta: RecvMeta, d: &[u8]) {
        let c = &mut self.counters;
        c.rx_packets += 1;
        c.rx_bytes += d.len() as u64;
        let ce = meta.ecn == Ecn::Ce.bits();
        if ce {
            c.rx_ecn_ce += 1;
        }
        let Some(src) = meta.src else {
            c.rx_drop_runt += 1;
            return;
        };
        if let Some(p) = self.pcap.as_mut() {
            let t = since(self.epoch);
            write_pcap(
                p,
                t,
                src,
                SocketAddr::new(self.local_ip, self.rx.local_addr().port()),
                meta.ecn,
                d,
            );
        }
        if d.len() < 12 {
            self.counters.rx_drop_runt += 1;
            return;
        }
        // Parsed once: the connection acts on the same view. A datagram that does not parse is
        // still charged to the queue pair its BTH names, whose connection counts it malformed.
        let parsed = Datagram::parse(d);
        let qpn = match &parsed {
            Ok(v) => v.bth.dest_qp.get(),
            Err(_) => u32::from_be_bytes([0, d[5], d[6], d[7]]),
        };
        let Some(qp) = self.qps.get_mut(&qpn) else {
            self.counters.rx_drop_unknown_qp += 1;
            return;
        };
        let (Some(conn), Some(peer)) = (qp.conn.as_mut(), qp.peer) else {
            self.counters.rx_drop_not_connected += 1;
            return;
        };
        if src.ip() != peer.ip() {
            self.counters.rx_drop_wrong_peer += 1;
            return;
        }
        let handled = match &parsed {
            Ok(v) => conn.handle_parsed(now, src.port(), ce, v),
            Err(_) => conn.handle_datagram(now, src.port(), ce, d),
        };
        if let Ok(delivery) = handled {
            if let transport_core::conn::Delivery::Place { len, .. } = delivery {
                qp.data_at = Some(now);
                qp.data_bytes += len as u64;
            }
            if conn.apply(&mut self.mems, d, delivery) == Applied::OutOfMemory {
                self.counters.rx_drop_bad_place += 1;
            }
        }
    }
}

/// Asks the CPU to bring the first cache lines of `d` (a datagram's headers) closer.
#[inline(always)]
pub(super) fn prefetch(d: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for at in [0usize, 64] {
            if at < d.len() {
                // SAFETY: a prefetch is a hint that never faults or changes memory; the address
                // lies inside `d` anyway. SSE is part of the x86-64 baseline.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(d.as_ptr().add(at).cast::<i8>()) };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = d;
}
