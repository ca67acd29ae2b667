//! Wire-layer benchmarks, each beside a baseline measured in the same run:
//! - parse a 4 KiB RoCEv2 RDMA WRITE ONLY and a MetaRoCE ACK (full validation, ICRC skipped and
//!   included) against etherparse slicing the same frame's Ethernet, IP and UDP headers;
//! - emit the same frames (lengths, IP checksum and ICRC included) against etherparse building
//!   Ethernet, IPv4 and UDP headers for the same payload;
//! - CRC-32 and ICRC throughput on 4 KiB against the `crc` crate's tables, and the CRC-32 by length
//!   (64 bytes to 64 KiB, the payloads the tools send among them) against its slice-by-16 table.
//!
//! `cargo bench -p transport-core --bench wire`; results in docs/BENCHMARKS.md.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::net::Ipv4Addr;
use transport_core::icrc;
use transport_core::wire::metaroce::MrAckRepr;
use transport_core::wire::{
    parse_with, BthRepr, Ecn, EtherType, EthernetRepr, Extensions, FrameRepr, FrameView, IcrcCheck,
    IpRepr, Ipv4Repr, MacAddr, Opcode, ParseOptions, Psn, Qpn, RethRepr, UdpRepr,
};

fn frame(opcode: Opcode, ext: Extensions, payload: &[u8]) -> Vec<u8> {
    let repr = FrameRepr {
        eth: EthernetRepr {
            dst: MacAddr([2, 0, 0, 0, 0, 1]),
            src: MacAddr([2, 0, 0, 0, 0, 2]),
            vlan: None,
            ethertype: EtherType::IPV4,
        },
        ip: IpRepr::V4(Ipv4Repr {
            dscp: 26,
            ecn: Ecn::Ect0,
            ident: 1,
            dont_frag: true,
            ttl: 64,
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            options: &[],
        }),
        udp: UdpRepr {
            src_port: 0xc123,
            dst_port: 4791,
            checksum: false,
        },
        bth: BthRepr {
            opcode,
            solicited: false,
            mig_req: true,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x1234),
            ack_req: true,
            psn: Psn::new(77),
        },
        ext,
        payload,
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf).unwrap();
    buf
}

fn write_4k() -> Vec<u8> {
    let payload = vec![0x5a; 4096];
    let ext = Extensions::Reth(RethRepr {
        va: 0x7f00_0000_1000,
        rkey: 0xabcd,
        dma_len: 4096,
    });
    frame(Opcode::RcWriteOnly, ext, &payload)
}

fn mr_ack() -> Vec<u8> {
    let ext = Extensions::MrAck(MrAckRepr {
        path_id: 3,
        cum_seq: 1000,
        sack: [0x55; 32],
        ..Default::default()
    });
    frame(Opcode::MrAck, ext, &[])
}

fn bench_parse(c: &mut Criterion) {
    let no_icrc = ParseOptions {
        icrc: IcrcCheck::Skip,
        ..ParseOptions::default()
    };
    let full = ParseOptions::default();
    let mut g = c.benchmark_group("parse");
    for (name, bytes) in [("rocev2_write_4k", write_4k()), ("metaroce_ack", mr_ack())] {
        g.bench_with_input(
            BenchmarkId::new("etherparse_eth_ip_udp", name),
            &bytes,
            |b, f| {
                b.iter(|| {
                    let s = etherparse::SlicedPacket::from_ethernet(black_box(f)).unwrap();
                    black_box(s.transport.is_some())
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("ours_view_no_icrc", name),
            &bytes,
            |b, f| {
                b.iter(|| {
                    black_box(
                        FrameView::new_checked(black_box(f), &no_icrc)
                            .unwrap()
                            .psn(),
                    )
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("ours_repr_no_icrc", name),
            &bytes,
            |b, f| b.iter(|| black_box(parse_with(black_box(f), &no_icrc).unwrap().repr.bth.psn)),
        );
        g.bench_with_input(
            BenchmarkId::new("ours_view_with_icrc", name),
            &bytes,
            |b, f| b.iter(|| black_box(FrameView::new_checked(black_box(f), &full).unwrap().psn())),
        );
    }
    g.finish();
}

fn bench_emit(c: &mut Criterion) {
    let mut g = c.benchmark_group("emit");
    for (name, bytes) in [("rocev2_write_4k", write_4k()), ("metaroce_ack", mr_ack())] {
        let parsed = parse_with(&bytes, &ParseOptions::default()).unwrap();
        let repr = parsed.repr;
        let mut out = vec![0u8; bytes.len()];
        let udp_payload_len = repr.transport_len();
        let udp_payload = vec![0u8; udp_payload_len];
        g.bench_function(BenchmarkId::new("etherparse_eth_ip_udp", name), |b| {
            let mut v = Vec::with_capacity(bytes.len() + 64);
            b.iter(|| {
                v.clear();
                etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1])
                    .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
                    .udp(0xc123, 4791)
                    .write(&mut v, black_box(&udp_payload))
                    .unwrap();
                black_box(v.len())
            })
        });
        g.bench_function(BenchmarkId::new("ours_with_icrc", name), |b| {
            b.iter(|| black_box(black_box(&repr).emit(&mut out).unwrap()))
        });
    }
    g.finish();
}

fn bench_crc(c: &mut Criterion) {
    let data = vec![0xa5u8; 4096];
    let table16 = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);
    let table1 = crc::Crc::<u32, crc::Table<1>>::new(&crc::CRC_32_ISO_HDLC);
    let mut g = c.benchmark_group("crc32_4k");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("crc_table1", |b| {
        b.iter(|| black_box(table1.checksum(black_box(&data))))
    });
    g.bench_function("crc_table16", |b| {
        b.iter(|| black_box(table16.checksum(black_box(&data))))
    });
    g.bench_function("ours", |b| {
        b.iter(|| black_box(icrc::crc32(black_box(&data))))
    });
    let frame = write_4k();
    let ip = 14;
    g.bench_function("ours_icrc_of_write_4k_frame", |b| {
        b.iter(|| {
            black_box(icrc::compute(
                black_box(&frame[ip..ip + 20]),
                &frame[ip + 20..ip + 28],
                &frame[ip + 28..frame.len() - 4],
            ))
        })
    });
    g.finish();
}

/// The CRC-32 by length, warm: what one packet's ICRC costs at each payload the tools use (1408
/// bytes at MTU 1500, 8896 at 9000, 16 KiB on loopback) and where the folding reaches its
/// throughput on this CPU (the carry-less multiplier's rate bounds it), against the `crc` crate's
/// slice-by-16 table as the baseline.
fn bench_crc_lengths(c: &mut Criterion) {
    let table16 = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);
    let data = vec![0xa5u8; 65536];
    let mut g = c.benchmark_group("crc32_by_length");
    for len in [64usize, 256, 1408, 4096, 8896, 16384, 65536] {
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(BenchmarkId::new("crc_table16", len), |b| {
            b.iter(|| black_box(table16.checksum(black_box(&data[..len]))))
        });
        g.bench_function(BenchmarkId::new("ours", len), |b| {
            b.iter(|| black_box(icrc::crc32(black_box(&data[..len]))))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_parse,
    bench_emit,
    bench_crc,
    bench_crc_lengths
);
criterion_main!(benches);
