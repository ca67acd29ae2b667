//! Two connections joined by a lossless wire in stepped time, each with one flat memory at a
//! fixed base address: the harness the core's tests and the connection's fuzz target drive. A
//! test moves time, loses, reorders, forges or marks datagrams by hand between its calls.

use std::net::{IpAddr, Ipv4Addr};
use transport_core::conn::{
    Access, Applied, Config, Connection, Delivery, DropReason, Event, FlatMemory, Region,
    RemoteAddr, WorkRequest, WrOp,
};
use transport_core::time::Instant;
use transport_core::wire::Qpn;

/// Where each side's memory starts.
pub const BASE: u64 = 0x10_0000;
/// Bytes of memory per side, unless [`Pair::with_memory`] says otherwise.
pub const MEM: usize = 1 << 20;
/// Room for the largest datagram a test configures (4096-byte payloads and every header).
const DATAGRAM_ROOM: usize = 4096 + 512;

/// One end: its connection, its memory (at [`BASE`]) and the events it has handed over.
pub struct Side<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize> {
    /// The connection.
    pub conn: Box<Connection<P, W, S, Q, R>>,
    /// Its memory, at [`BASE`].
    pub mem: Vec<u8>,
    /// The events it handed over in [`Pair::deliver_and_tick`] and [`Pair::settle`].
    pub events: Vec<Event>,
}

/// Sides A (address 10.0.0.1) and B (10.0.0.2) and what is on the wire between them.
pub struct Pair<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize> {
    /// Side A, 10.0.0.1.
    pub a: Side<P, W, S, Q, R>,
    /// Side B, 10.0.0.2.
    pub b: Side<P, W, S, Q, R>,
    /// The time, ns.
    pub now: Instant,
    /// Datagrams in flight: (to_b, src_port, bytes).
    pub wire: Vec<(bool, u16, Vec<u8>)>,
    /// Datagrams from `a` with these UDP source ports arrive marked Congestion Experienced.
    pub ce_ports: Vec<u16>,
}

/// The configuration of the side with address 10.0.0.`local` talking to 10.0.0.`remote`: QPNs
/// equal to the addresses, 4 paths, 1024-byte packets, and sequence origins near the wrap.
pub fn config(local: u8, remote: u8) -> Config {
    let ip = |x| IpAddr::V4(Ipv4Addr::new(10, 0, 0, x));
    let mut c = Config::new(
        ip(local),
        ip(remote),
        Qpn::new(u32::from(local)),
        Qpn::new(u32::from(remote)),
    );
    c.paths = 4;
    c.mtu = 1024;
    // Path and probe sequences start where a runner's random draw may put them: just below the
    // wrap of the 32-bit space, so that every test crosses it.
    c.initial_path_seq = path_base(local);
    c.peer_initial_path_seq = path_base(remote);
    c.initial_probe_seq = u32::MAX - 2 - u32::from(local);
    c
}

/// A Write of `len` bytes from A's memory at `offset` to the same offset of B's, under `rkey`.
pub fn write_at(id: u64, offset: u64, len: u32, rkey: u32) -> WorkRequest {
    WorkRequest {
        id,
        op: WrOp::Write,
        stream: 0,
        local_addr: BASE + offset,
        len,
        remote: RemoteAddr {
            va: BASE + offset,
            rkey,
        },
    }
}

/// Where the path sequences of the side with address `x` start.
pub fn path_base(x: u8) -> u32 {
    0xffff_ffc0_u32.wrapping_add(u32::from(x) * 8)
}

/// A side's memory, at address [`BASE`].
pub fn at_base(mem: &mut [u8]) -> FlatMemory<'_> {
    FlatMemory {
        base: BASE,
        bytes: mem,
    }
}

impl<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize>
    Pair<P, W, S, Q, R>
{
    /// A pair with [`config`] on both sides.
    pub fn new() -> Self {
        Self::with_configs(config(1, 2), config(2, 1))
    }

    /// A pair whose B grants all of its memory for remote Writes under `key`.
    pub fn granting_writes(key: u32) -> Self {
        let mut p = Self::new();
        p.grant_writes(key);
        p
    }

    /// B grants all of its memory for remote Writes under `key`.
    pub fn grant_writes(&mut self, key: u32) {
        let len = self.b.mem.len() as u64;
        self.b
            .conn
            .register(Region {
                key,
                base: BASE,
                len,
                access: Access::REMOTE_WRITE,
            })
            .expect("a fresh connection takes a region");
    }

    /// A pair whose sides A (address 1) and B (address 2) run these configurations.
    pub fn with_configs(a: Config, b: Config) -> Self {
        Self::with_memory(a, b, MEM)
    }

    /// As [`Pair::with_configs`], with `mem` bytes of memory per side (filled with a pattern
    /// that differs between the sides).
    pub fn with_memory(a: Config, b: Config, mem: usize) -> Self {
        let side = |cfg: Config, l: u8| Side {
            conn: Box::new(Connection::new(cfg)),
            mem: (0..mem).map(|i| (i * 7 + l as usize) as u8).collect(),
            events: Vec::new(),
        };
        Pair {
            a: side(a, 1),
            b: side(b, 2),
            now: Instant::ZERO,
            wire: Vec::new(),
            ce_ports: Vec::new(),
        }
    }

    /// Lets both sides transmit everything they have onto the wire.
    pub fn transmit(&mut self) {
        self.send_from(true, false);
        self.send_from(false, false);
    }

    /// What a runner does right after a post on one side (its doorbell): the data packets first,
    /// with `poll_transmit_data`, so that an ACK that waits rides on them.
    pub fn doorbell(&mut self, on_a: bool) {
        self.send_from(on_a, true);
    }

    fn send_from(&mut self, on_a: bool, data_only: bool) {
        let mut buf = vec![0u8; DATAGRAM_ROOM];
        let (side, to_b) = if on_a {
            (&mut self.a, true)
        } else {
            (&mut self.b, false)
        };
        loop {
            let next = if data_only {
                side.conn.poll_transmit_data(self.now, &mut buf)
            } else {
                side.conn.poll_transmit(self.now, &mut buf)
            };
            let Some(tx) = next else { break };
            // After a doorbell a runner may stop asking once `may_transmit_data` says none is
            // left (the UDP engine does): check that it never leaves a data packet behind.
            let last = data_only && !side.conn.may_transmit_data();
            assert!(side
                .conn
                .fill_and_seal(&tx, &mut buf, &at_base(&mut side.mem)));
            self.wire.push((to_b, tx.src_port, buf[..tx.len].to_vec()));
            if last {
                let mut probe = side.conn.clone();
                assert!(
                    probe.poll_transmit_data(self.now, &mut buf).is_none(),
                    "may_transmit_data said no data packet was left"
                );
                break;
            }
        }
    }

    /// Delivers one datagram to its side, placing what it says.
    pub fn deliver(
        &mut self,
        to_b: bool,
        src_port: u16,
        bytes: &[u8],
    ) -> Result<Delivery, DropReason> {
        let ce = to_b && self.ce_ports.contains(&src_port);
        self.deliver_marked(to_b, src_port, bytes, ce)
    }

    /// Delivers one datagram, marked Congestion Experienced when `ce`. What the connection
    /// delivers must lie inside the side's memory.
    pub fn deliver_marked(
        &mut self,
        to_b: bool,
        src_port: u16,
        bytes: &[u8],
        ce: bool,
    ) -> Result<Delivery, DropReason> {
        let side = if to_b { &mut self.b } else { &mut self.a };
        let d = side.conn.handle_datagram(self.now, src_port, ce, bytes);
        if let Ok(delivery) = d {
            let applied = side
                .conn
                .apply(&mut at_base(&mut side.mem), bytes, delivery);
            assert_ne!(applied, Applied::OutOfMemory, "{delivery:?}");
        }
        d
    }

    /// One round of the wire: everything both sides send, minus what `lose` picks (`to_b`,
    /// bytes), then events and timers, then 1 us.
    pub fn round(&mut self, lose: &mut impl FnMut(bool, &[u8]) -> bool) {
        self.transmit();
        self.deliver_and_tick(lose);
    }

    /// Delivers what is on the wire except what `lose` picks, hands the events over, fires the
    /// timers that are due and advances time by 1 us.
    pub fn deliver_and_tick(&mut self, lose: &mut impl FnMut(bool, &[u8]) -> bool) {
        for (to_b, port, bytes) in std::mem::take(&mut self.wire) {
            if !lose(to_b, &bytes) {
                let _ = self.deliver(to_b, port, &bytes);
            }
        }
        for side in [&mut self.a, &mut self.b] {
            while let Some(e) = side.conn.poll_event() {
                side.events.push(e);
            }
            if side.conn.poll_timeout().is_some_and(|t| t <= self.now) {
                side.conn.handle_timeout(self.now);
            }
        }
        self.now += 1_000;
    }

    /// Runs until nothing moves, advancing time by 1 us per round.
    pub fn settle(&mut self) {
        for _ in 0..10_000 {
            self.transmit();
            if self.wire.is_empty() {
                for side in [&mut self.a, &mut self.b] {
                    if side.conn.poll_timeout().is_some_and(|t| t <= self.now) {
                        side.conn.handle_timeout(self.now);
                    }
                }
                self.now += 1_000;
                self.transmit();
                if self.wire.is_empty() && self.a.conn.is_idle() && self.b.conn.is_idle() {
                    break;
                }
            }
            self.deliver_and_tick(&mut |_, _| false);
        }
        for side in [&mut self.a, &mut self.b] {
            while let Some(e) = side.conn.poll_event() {
                side.events.push(e);
            }
        }
    }
}

impl<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize> Default
    for Pair<P, W, S, Q, R>
{
    fn default() -> Self {
        Self::new()
    }
}
