//! One end of the simulation: a connection, its memory and its side of the link. This is the
//! runner: it drives the connection through the core's contract (`poll_transmit`,
//! `fill_and_seal`, `handle_datagram`, `apply`, `poll_timeout`, `handle_timeout`).

use crate::config::SelftestConfig;
use crate::link::{Arrival, Link};
use crate::Conn;
use metaroce_frames::gen::Rng;
use std::net::IpAddr;
use transport_core::conn::{Applied, Config, FlatMemory, Memory};
use transport_core::time::Instant;
use transport_core::wire::{Psn, Qpn};

/// Where A's memory starts: its source data, then Read destinations, then atomic results.
pub(crate) const BASE_A: u64 = 0x1000_0000;
/// Where B's memory starts: Write and Send destinations, then Read sources, then counters.
pub(crate) const BASE_B: u64 = 0x9000_0000;

pub(crate) struct Endpoint {
    pub conn: Box<Conn>,
    /// Source data (A) or the responder's readable data (B).
    pub src: Vec<u8>,
    /// Destination of Writes and Sends (B) or of Reads (A).
    pub dst: Vec<u8>,
    /// B: the counters; A: the original values returned, 8 bytes per work request.
    pub atom: Vec<u8>,
    /// When this end's side of the link is free to send again.
    link_free: Instant,
    /// When the connection may have something to send.
    wake: Option<Instant>,
    is_a: bool,
}

/// Where the path sequences of the end with entropy seed `seed` start.
fn path_seq_origin(seed: u32) -> u32 {
    seed.wrapping_mul(0x9e37_79b9).rotate_left(13) ^ 0xfff0_0000
}

/// The configuration of one end: entropy from `seed` (the two ends' seeds differ by 0x5555),
/// both ends starting at `cfg.initial_psn`, timers for this link's few-microsecond RTT.
pub(crate) fn config(
    cfg: &SelftestConfig,
    (local, remote): (IpAddr, IpAddr),
    (local_qpn, remote_qpn): (u32, u32),
    seed: u32,
) -> Config {
    let mut c = Config::new(local, remote, Qpn::new(local_qpn), Qpn::new(remote_qpn));
    c.paths = cfg.paths;
    c.entropy_seed = seed;
    c.initial_psn = Psn::new(cfg.initial_psn);
    c.peer_initial_psn = Psn::new(cfg.initial_psn);
    // Path and probe sequences start where a runner's random draw would put them: from the
    // seeds of both ends, so that every run crosses different points of the 32-bit space.
    c.initial_path_seq = path_seq_origin(seed);
    c.peer_initial_path_seq = path_seq_origin(seed ^ 0x5555);
    c.initial_probe_seq = path_seq_origin(!seed);
    c.window_per_path = cfg.window_per_path;
    // Timer floors for this link's few-microsecond RTT (the defaults suit real fabrics).
    c.rto_low = 10_000;
    c.rto_high = 16_000;
    c.probe_interval = 8_000;
    c.timeouts_to_probe = 2;
    c.probes_to_fail = 2;
    c
}

impl Endpoint {
    /// End A (`is_a`) or B with `size` bytes of random source data drawn from `rng` and
    /// `atom_bytes` for atomics.
    pub fn new(conn: Config, is_a: bool, size: usize, atom_bytes: usize, rng: &mut Rng) -> Self {
        Endpoint {
            conn: Box::new(Conn::new(conn)),
            src: (0..size).map(|_| rng.next_u64() as u8).collect(),
            dst: vec![0; size],
            atom: vec![0; atom_bytes],
            link_free: Instant::ZERO,
            wake: is_a.then_some(Instant::ZERO),
            is_a,
        }
    }

    /// The connection may have something to send from `now` on.
    pub fn wake(&mut self, now: Instant) {
        self.wake = Some(now);
    }

    /// Sends what the connection has while this end's side of the link is free, one datagram
    /// after another at the link rate. Returns the data packets the link lost.
    pub fn transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        link: &mut Link,
        rng: &mut Rng,
    ) -> u64 {
        let mut lost = 0;
        while self.wake.is_some_and(|w| w <= now) && self.link_free <= now {
            let Some(tx) = self.conn.poll_transmit(now, buf) else {
                self.wake = None;
                break;
            };
            let mem = memory_of(self.is_a, &mut self.src, &mut self.dst, &mut self.atom);
            assert!(self.conn.fill_and_seal(&tx, buf, &mem), "{tx:?}");
            self.link_free = now + link.serialisation(tx.len);
            self.wake = Some(self.link_free);
            let route = (self.is_a, tx.src_port);
            if link.carry(rng, route, buf[..tx.len].to_vec(), self.link_free) {
                lost += 1;
            }
        }
        lost
    }

    /// Hands an arrival to the connection and applies what it delivers to this end's memory.
    pub fn receive(&mut self, now: Instant, x: &Arrival) -> Applied {
        let delivery = self.conn.handle_datagram(now, x.src_port, false, &x.bytes);
        let mut mem = memory_of(self.is_a, &mut self.src, &mut self.dst, &mut self.atom);
        let applied = match delivery {
            Ok(d) => self.conn.apply(&mut mem, &x.bytes, d),
            Err(_) => Applied::Nothing,
        };
        assert_ne!(applied, Applied::OutOfMemory, "{delivery:?}");
        self.wake = Some(now);
        applied
    }

    /// Fires the connection's timers if they are due.
    pub fn timers(&mut self, now: Instant) {
        if self.conn.poll_timeout().is_some_and(|t| t <= now) {
            self.conn.handle_timeout(now);
            self.wake = Some(now);
        }
    }

    /// The next instant this end has something to do (a timer, or a send once its link is free).
    pub fn next_at(&self, now: Instant) -> Option<Instant> {
        let timer = self.conn.poll_timeout().map(|t| t.max(now));
        let send = self.wake.map(|w| w.max(self.link_free).max(now));
        match (timer, send) {
            (Some(t), Some(s)) => Some(t.min(s)),
            (t, s) => t.or(s),
        }
    }
}

/// An endpoint's memory as the connection addresses it. A sends from `src` (at BASE_A), receives
/// Read data into `dst` (after it) and the original values of its atomics into `atom` (after
/// that); B receives Writes and Sends into `dst` (at BASE_B), serves Reads from `src` (after it)
/// and keeps the atomics' counters in `atom` (after that).
fn memory_of<'a>(
    is_a: bool,
    src: &'a mut [u8],
    dst: &'a mut [u8],
    atom: &'a mut [u8],
) -> Segments<'a> {
    let n = src.len() as u64;
    let flat = |base, bytes| FlatMemory { base, bytes };
    if is_a {
        Segments([
            flat(BASE_A, src),
            flat(BASE_A + n, dst),
            flat(BASE_A + 2 * n, atom),
        ])
    } else {
        Segments([
            flat(BASE_B, dst),
            flat(BASE_B + n, src),
            flat(BASE_B + 2 * n, atom),
        ])
    }
}

/// Memory in three segments, each at its base address.
struct Segments<'a>([FlatMemory<'a>; 3]);

impl Memory for Segments<'_> {
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        self.0.iter().find_map(|m| m.read(addr, len))
    }

    fn write(&mut self, addr: u64, bytes: &[u8]) -> bool {
        self.0
            .iter_mut()
            .find(|m| m.offset_of(addr, bytes.len()).is_some())
            .is_some_and(|m| m.write(addr, bytes))
    }
}
