//! The ICRC of short datagrams (a ping, an ACK, a small message) on the built-in CRC engine
//! (crc32fast: a 16 KiB slice-by-16 table below 128 bytes) and on the UDP transport's PCLMULQDQ
//! engine (no tables), measured in the same run: with warm caches, and with the caches flushed
//! before every ICRC by a walk over 8 MiB outside the timing (each ICRC timed alone, so the
//! cold figures include a clock reading, the same for both engines), as an engine meets them
//! between the hops of a ping-pong.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use transport_core::icrc::{finish_split, split_prefix, Engine};

fn icrc(c: &mut Criterion) {
    let runner = host_ibverbs::udp::crc_engine::engine();
    let ip = [
        0x45u8, 0, 0, 100, 0, 0, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1,
    ];
    let udp = [0xc0u8, 1, 0x12, 0xb7, 0, 108, 0, 0];
    let mut junk = vec![0u8; 8 << 20];
    for len in [56usize, 100, 1040, 4136] {
        let data: Vec<u8> = (0..len as u32).map(|i| (i * 7) as u8).collect();
        let p = split_prefix(&ip, &udp, len);
        let mut g = c.benchmark_group(format!("icrc_{len}_bytes"));
        for (name, engine) in [("built_in", Engine::BuiltIn), (runner.name(), runner)] {
            g.bench_function(format!("{name}_warm"), |b| {
                b.iter(|| finish_split(&p, black_box(&data), engine))
            });
            g.bench_function(format!("{name}_cold"), |b| {
                b.iter_custom(|iters| {
                    let mut total = std::time::Duration::ZERO;
                    for _ in 0..iters {
                        for k in (0..junk.len()).step_by(64) {
                            junk[k] = junk[k].wrapping_add(1);
                        }
                        let t = std::time::Instant::now();
                        black_box(finish_split(&p, black_box(&data), engine));
                        total += t.elapsed();
                    }
                    total
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, icrc);
criterion_main!(benches);
