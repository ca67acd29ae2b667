//! The connection's per-packet cost, payload copies excluded, each beside a baseline measured in
//! the same run:
//! - send path: `poll_transmit` for a new data packet of a large Write (path choice, sequence
//!   and window bookkeeping, header build) against emitting the same BTH and extension headers
//!   with the wire emitters alone; and `seal` (pad + ICRC) on its own;
//! - receive path: `handle_datagram` on an arriving 4 KiB Write packet (parse, validation, SACK
//!   update, PSN dedup, region check, placement decision, ACK decision), with and without the
//!   ICRC check, against parsing the same BTH and extension headers alone.
//!
//! `cargo bench -p transport-core --bench conn`; results in docs/BENCHMARKS.md.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use transport_core::conn::{Access, Config, Connection, Region, RemoteAddr, WorkRequest, WrOp};
use transport_core::wire::{BthRepr, Extensions, Qpn};

type Conn = Connection<16, 4096, 2, 64, 4>;

fn config(local: u8, remote: u8, verify_icrc: bool) -> Config {
    let ip = |x| IpAddr::V4(Ipv4Addr::new(10, 0, 0, x));
    let mut c = Config::new(
        ip(local),
        ip(remote),
        Qpn::new(local.into()),
        Qpn::new(remote.into()),
    );
    c.window_per_path = 255;
    c.verify_icrc = verify_icrc;
    c
}

fn sender() -> Box<Conn> {
    let mut a = Box::new(Conn::new(config(1, 2, true)));
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
    a.post(0, wr).unwrap();
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
        let Some(tx) = a.poll_transmit(0, &mut buf) else {
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
    g.bench_function("poll_transmit_new_data_packet", |b| {
        let template = sender();
        let mut buf = vec![0u8; 8192];
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let mut a = template.clone();
                let n = left.min(batch as u64);
                let start = Instant::now();
                for _ in 0..n {
                    black_box(a.poll_transmit(0, &mut buf).unwrap());
                }
                total += start.elapsed();
                left -= n;
            }
            total
        })
    });
    g.bench_function("seal_4k_icrc", |b| {
        let mut a = sender();
        let mut buf = vec![0u8; 8192];
        let tx = a.poll_transmit(0, &mut buf).unwrap();
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
                        black_box(rx.handle_datagram(0, *port, false, d).unwrap());
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

criterion_group!(benches, bench_send, bench_receive);
criterion_main!(benches);
