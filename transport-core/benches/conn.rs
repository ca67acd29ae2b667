//! The connection's per-packet cost, payload copies excluded, each beside a baseline measured in
//! the same run:
//! - send path: `poll_transmit` for a new data packet of a large Write (path choice, sequence
//!   and window bookkeeping, header build) against emitting the same BTH and extension headers
//!   with the wire emitters alone; and `seal` (pad + ICRC) on its own;
//! - receive path: `handle_datagram` on an arriving 4 KiB Write packet (parse, validation, SACK
//!   update, PSN dedup, region check, placement decision, ACK decision), with and without the
//!   ICRC check, against parsing the same BTH and extension headers alone.
//!
//! - ping-pong round trip (`ping_pong_round_trip_2_bytes`): two connections configured as the
//!   UDP transport configures them (8 paths, 4 KiB MTU, ICRC checked) exchange a 2-byte Write
//!   with immediate each way, each answer carrying the acknowledgement of its ping: post,
//!   `poll_transmit_data`, `seal`, `handle_datagram` with the placement, the completions and the
//!   receive buffer posted again, on both ends; what `metaroce write-lat` asks of the core per
//!   ping. Against the same two datagrams emitted with the wire emitters, their ICRC computed
//!   and checked and parsed back, and nothing else: the least any implementation of this frame
//!   format does per round trip.
//!
//! `cargo bench -p transport-core --bench conn`; results in docs/BENCHMARKS.md.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use transport_core::conn::{
    compute_icrc, Access, Config, Connection, Region, RemoteAddr, WorkRequest, WrOp,
};
use transport_core::rate::Algorithm;
use transport_core::time::Instant as CoreInstant;
use transport_core::wire::{BthRepr, Extensions};

#[path = "common/hop.rs"]
mod hop;
use hop::*;

type Conn = Connection<16, 4096, 2, 64, 4>;

fn sender() -> Box<Conn> {
    sender_with(config(1, 2, true))
}

fn sender_with(cfg: Config) -> Box<Conn> {
    let mut a = Box::new(Conn::new(cfg));
    let wr = WorkRequest {
        id: 1,
        op: WrOp::Write,
        stream: 0,
        local_addr: 0x1000,
        len: 1 << 30,
        remote: RemoteAddr {
            va: 0x10_0000,
            rkey: 9,
        },
    };
    a.post(CoreInstant::ZERO, wr).unwrap();
    a
}

fn receiver(verify_icrc: bool) -> Box<Conn> {
    let mut b = Box::new(Conn::new(config(2, 1, verify_icrc)));
    b.register(Region {
        key: 9,
        base: 0x10_0000,
        len: 1 << 31,
        access: Access::REMOTE_WRITE,
    })
    .unwrap();
    b
}

/// Datagrams of a large Write as the sender produces them (payload zero-filled, sealed).
fn datagrams(n: usize) -> Vec<(u16, Vec<u8>)> {
    let mut a = sender();
    let mut buf = vec![0u8; 8192];
    let mut out = Vec::new();
    while out.len() < n {
        let Some(tx) = a.poll_transmit(CoreInstant::ZERO, &mut buf) else {
            break;
        };
        buf[tx.header_len..tx.header_len + tx.payload_len].fill(0x3c);
        a.seal(&tx, &mut buf);
        out.push((tx.src_port, buf[..tx.len].to_vec()));
    }
    out
}

fn bench_send(c: &mut Criterion) {
    let mut g = c.benchmark_group("send_path");
    let batch = 16 * 255;
    g.bench_function("baseline_emit_headers_only", |b| {
        let d = datagrams(1);
        let (bth, rest) = BthRepr::parse(&d[0].1).unwrap();
        let (ext, _) = Extensions::parse(bth.opcode.layout(), rest).unwrap();
        let mut buf = vec![0u8; 128];
        b.iter(|| {
            let rest = black_box(&bth).emit(&mut buf).unwrap();
            black_box(ext.emit(bth.opcode.layout(), rest).unwrap().len())
        })
    });
    for (name, cc) in [
        ("poll_transmit_new_data_packet", Algorithm::EcnAimd),
        // The tools' default: the path with the most room takes each packet.
        (
            "poll_transmit_new_data_packet_metaroce",
            Algorithm::MetaRoce,
        ),
    ] {
        g.bench_function(name, |b| {
            let mut cfg = config(1, 2, true);
            cfg.cc = cc;
            let template = sender_with(cfg);
            let mut buf = vec![0u8; 8192];
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let mut a = template.clone();
                    let n = left.min(batch as u64);
                    let start = Instant::now();
                    for _ in 0..n {
                        black_box(a.poll_transmit(CoreInstant::ZERO, &mut buf).unwrap());
                    }
                    total += start.elapsed();
                    left -= n;
                }
                total
            })
        });
    }
    g.bench_function("seal_4k_icrc", |b| {
        let mut a = sender();
        let mut buf = vec![0u8; 8192];
        let tx = a.poll_transmit(CoreInstant::ZERO, &mut buf).unwrap();
        b.iter(|| a.seal(black_box(&tx), &mut buf))
    });
    g.finish();
}

fn bench_receive(c: &mut Criterion) {
    let packets = datagrams(4000);
    let mut g = c.benchmark_group("receive_path");
    g.bench_function("baseline_parse_headers_only", |b| {
        let d = &packets[0].1;
        b.iter(|| {
            let (bth, rest) = BthRepr::parse(black_box(d)).unwrap();
            black_box(Extensions::parse(bth.opcode.layout(), rest).unwrap().0)
        })
    });
    for (name, verify) in [
        ("handle_datagram_no_icrc", false),
        ("handle_datagram_with_icrc", true),
    ] {
        let template = receiver(verify);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let mut rx = template.clone();
                    let n = left.min(packets.len() as u64) as usize;
                    let start = Instant::now();
                    for (port, d) in &packets[..n] {
                        black_box(
                            rx.handle_datagram(CoreInstant::ZERO, *port, false, d)
                                .unwrap(),
                        );
                    }
                    total += start.elapsed();
                    left -= n as u64;
                }
                total
            })
        });
    }
    g.finish();
}

fn round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("ping_pong_round_trip_2_bytes");
    let (mut a, mut b) = (end(1, 2), end(2, 1));
    let mut buf = vec![0u8; 8192];
    // Warm up into the steady state: every answer carries the ACK of its ping.
    let mut now = CoreInstant::from_nanos(1_000);
    let mut id = 1;
    for _ in 0..64 {
        hop(&mut a, &mut b, now, id, &mut buf);
        hop(&mut b, &mut a, now + 500, id + 1, &mut buf);
        now += 1_000;
        id += 2;
    }
    let len_ab = hop(&mut a, &mut b, now, id, &mut buf);
    let frame_ab = buf[..len_ab].to_vec();
    let len_ba = hop(&mut b, &mut a, now, id + 1, &mut buf);
    let frame_ba = buf[..len_ba].to_vec();
    let ip = |x| IpAddr::V4(Ipv4Addr::new(10, 0, 0, x));

    g.bench_function("baseline_emit_parse_icrc", |bench| {
        let mut out = vec![0u8; 256];
        bench.iter(|| {
            for (frame, src, dst) in [(&frame_ab, 1, 2), (&frame_ba, 2, 1)] {
                // Emit: BTH and extensions from their representations, the payload, the ICRC.
                let n = frame.len();
                let (bth, rest) = BthRepr::parse(frame).expect("bth");
                let layout = bth.opcode.layout();
                let (ext, _) = Extensions::parse(layout, rest).expect("ext");
                let tail = ext
                    .emit(layout, bth.emit(&mut out[..n]).expect("bth"))
                    .expect("ext");
                let head = n - tail.len();
                out[head..n - 4].copy_from_slice(&frame[head..n - 4]);
                let icrc = compute_icrc(ip(src), ip(dst), 49152, 4791, &out[..n - 4]);
                out[n - 4..n].copy_from_slice(&icrc.to_le_bytes());
                // Receive: ICRC check, then parse.
                let got = compute_icrc(ip(src), ip(dst), 49152, 4791, black_box(&out[..n - 4]));
                black_box(got == icrc);
                let (bth, rest) = BthRepr::parse(black_box(&out[..n])).expect("bth");
                black_box(Extensions::parse(bth.opcode.layout(), rest).expect("ext"));
            }
        })
    });
    g.bench_function("connection_write_imm_round_trip", |bench| {
        bench.iter(|| {
            now += 1_000;
            id += 2;
            hop(&mut a, &mut b, now, id, &mut buf);
            hop(&mut b, &mut a, now + 500, id + 1, &mut buf);
        })
    });
    // The same round trip with a cache level walked over before each half hop, only the halves
    // timed: 96 KiB (twice the first level here) for what the connection costs when its state
    // comes from the second level, as it does between a ping's system calls; 4 MiB (past the
    // second level of both machines in docs/BENCHMARKS.md) for a host whose kernel work or
    // neighbours also push the state out of the second level.
    for (name, walk) in [("l1_cold", 96 << 10), ("l2_cold", 4 << 20)] {
        g.bench_function(format!("connection_write_imm_round_trip_{name}"), |bench| {
            let mut junk = vec![0u8; walk];
            bench.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    now += 1_000;
                    id += 2;
                    round_trip_halves(&mut a, &mut b, now, id, |_, from, to, at, id| {
                        evict(&mut junk);
                        let t = Instant::now();
                        let len = hop_send(from, at, id, &mut buf);
                        total += t.elapsed();
                        evict(&mut junk);
                        let t = Instant::now();
                        hop_receive(from, to, at, &buf, len);
                        total += t.elapsed();
                    });
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_send, bench_receive, round_trip);
criterion_main!(benches);
