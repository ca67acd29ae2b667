//! A ping-pong hop between two connections configured as the UDP transport configures them (8
//! paths, 4 KiB MTU, ICRC checked): shared by the conn bench's round trip and the `hop_lines`
//! example, which counts the cache lines a hop touches.
#![allow(dead_code)] // each includer uses its own part

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use transport_core::conn::{
    Access, CompletionKind, Config, Connection, Event, IcrcMode, RecvRequest, Region, RemoteAddr,
    WorkRequest, WrOp,
};
use transport_core::time::Instant as CoreInstant;
use transport_core::wire::{Psn, Qpn};

/// A connection's configuration between 10.0.0.`local` and 10.0.0.`remote` (QPNs the same),
/// 255 packets a path; the ICRC checked on arrival, or only sent.
pub fn config(local: u8, remote: u8, verify_icrc: bool) -> Config {
    let ip = |x| IpAddr::V4(Ipv4Addr::new(10, 0, 0, x));
    let mut c = Config::new(
        ip(local),
        ip(remote),
        Qpn::new(local.into()),
        Qpn::new(remote.into()),
    );
    c.window_per_path = 255;
    c.icrc = if verify_icrc {
        IcrcMode::Full
    } else {
        IcrcMode::SendOnly
    };
    c
}

/// As the UDP transport instantiates it (host-ibverbs/src/udp/engine.rs).
pub type HostConn = Connection<64, 2048, 8, 128, 32>;

pub const KEY: u32 = 0x77;
pub const BASE: u64 = 0x10_0000;

pub fn end(local: u8, remote: u8) -> Box<HostConn> {
    let mut c = config(local, remote, true);
    c.paths = 8;
    c.mtu = 4096;
    c.window_per_path = 16;
    c.initial_psn = Psn::new(100 * u32::from(local));
    c.peer_initial_psn = Psn::new(100 * u32::from(remote));
    let mut conn = Box::new(HostConn::new(c));
    conn.register(Region {
        key: KEY,
        base: BASE,
        len: 4096,
        access: Access::REMOTE_WRITE,
    })
    .expect("region");
    for i in 0..16 {
        conn.post_recv(RecvRequest {
            id: 1000 + i,
            stream: 0,
            addr: 0x9000,
            len: 64,
        })
        .expect("recv");
    }
    conn
}

/// One hop: `from` posts a 2-byte Write with immediate and sends it; `to` takes it in, hands
/// over its completions and posts its receive buffer again. Returns the datagram's length.
pub fn hop(
    from: &mut HostConn,
    to: &mut HostConn,
    now: CoreInstant,
    id: u64,
    buf: &mut [u8],
) -> usize {
    let len = hop_send(from, now, id, buf);
    hop_receive(from, to, now, buf, len);
    len
}

/// The sending half of a hop: the post, the data packet and its seal. Returns its length and
/// leaves the datagram at the start of `buf`; its source port in `buf`'s last two bytes.
pub fn hop_send(from: &mut HostConn, now: CoreInstant, id: u64, buf: &mut [u8]) -> usize {
    from.post(
        now,
        WorkRequest {
            id,
            op: WrOp::WriteWithImm(id as u32),
            stream: 0,
            local_addr: 0x2000,
            len: 2,
            remote: RemoteAddr {
                va: BASE,
                rkey: KEY,
            },
        },
    )
    .expect("post");
    let tx = from.poll_transmit_data(now, buf).expect("a data packet");
    buf[tx.header_len..tx.header_len + tx.payload_len].fill(0x5a);
    from.seal(&tx, buf);
    let n = buf.len();
    buf[n - 2..].copy_from_slice(&tx.src_port.to_le_bytes());
    tx.len
}

/// The receiving half of a hop: the datagram `hop_send` left in `buf` taken in, both ends'
/// events handed over, the receive buffer posted again.
pub fn hop_receive(
    from: &mut HostConn,
    to: &mut HostConn,
    now: CoreInstant,
    buf: &[u8],
    len: usize,
) {
    let n = buf.len();
    let port = u16::from_le_bytes([buf[n - 2], buf[n - 1]]);
    to.handle_datagram(now, port, false, &buf[..len])
        .expect("accepted");
    while let Some(ev) = from.poll_event() {
        black_box(ev);
    }
    while let Some(ev) = to.poll_event() {
        if let Event::Completion(c) = ev {
            if c.kind == CompletionKind::RecvWriteImm {
                to.post_recv(RecvRequest {
                    id: c.id,
                    stream: 0,
                    addr: 0x9000,
                    len: 64,
                })
                .expect("recv");
            }
        }
    }
}

/// Walks `junk` (larger than the first-level data cache), as a hop's system calls and the
/// kernel's packet path do between two steps of the transport's own work: the connection's
/// state is then read back from the second level, as in a real ping-pong.
pub fn evict(junk: &mut [u8]) {
    for i in (0..junk.len()).step_by(64) {
        junk[i] = junk[i].wrapping_add(1);
    }
    black_box(&junk[0]);
}

/// Both half hops of round trip `id`: `a` to `b` at `now` with work request `id`, then `b` to
/// `a` 500 ns later with `id + 1`; `half(k, from, to, at, id)` runs half hop `k` (0, then 1).
pub fn round_trip_halves(
    a: &mut HostConn,
    b: &mut HostConn,
    now: CoreInstant,
    id: u64,
    mut half: impl FnMut(u64, &mut HostConn, &mut HostConn, CoreInstant, u64),
) {
    half(0, a, b, now, id);
    half(1, b, a, now + 500, id + 1);
}
