//! Property tests of the wire layer: every Repr round-trips, parse never panics on any bytes,
//! mutated valid frames never panic, and every flipped bit the ICRC covers is detected.

use core::net::{Ipv4Addr, Ipv6Addr};
use proptest::prelude::*;
use transport_core::wire::metaroce::{
    MrAckRepr, MrDataRepr, MrNackRepr, MrProbeRepr, MrRemoteRepr, NackReason, PiggyAck,
};
use transport_core::wire::{
    parse, parse_with, seal, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, Datagram,
    DatagramHeaders, DethRepr, Ecn, EtherType, EthernetRepr, ExtensionFields, Extensions,
    FrameRepr, IcrcCheck, IpRepr, Ipv4Repr, Ipv6Repr, MacAddr, Opcode, ParseOptions, Psn, Qpn,
    RethRepr, UdpRepr, VlanTag,
};

fn ecn() -> impl Strategy<Value = Ecn> {
    (0u8..4).prop_map(Ecn::from_bits)
}

fn opcode() -> impl Strategy<Value = Opcode> {
    prop_oneof![
        3 => prop::sample::select(Opcode::KNOWN),
        1 => any::<u8>().prop_map(Opcode::from_u8),
    ]
}

fn bth(op: Opcode) -> impl Strategy<Value = BthRepr> {
    (
        any::<[bool; 6]>(),
        0u8..4,
        0u8..16,
        any::<u16>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(move |(b, pad_count, tver, pkey, qp, psn)| BthRepr {
            opcode: op,
            solicited: b[0],
            mig_req: b[1],
            pad_count,
            tver,
            pkey,
            fecn: b[2],
            becn: b[3],
            dest_qp: Qpn::new(qp),
            ack_req: b[4],
            psn: Psn::new(psn),
        })
}

prop_compose! {
    fn mr_data()(b in any::<bool>(), ack in any::<bool>(), path_id in any::<u8>(), stream_id in any::<u16>(),
                 w in any::<[u32; 5]>()) -> MrDataRepr {
        MrDataRepr { retransmit: b, ack, path_id, stream_id, path_seq: w[0], msn: w[1],
                     msg_offset: w[2], msg_len: w[3], timestamp: w[4] }
    }
}

prop_compose! {
    fn mr_ack()(ece in any::<bool>(), refusals in any::<bool>(), path_id in any::<u8>(), ce_count in any::<u16>(),
                w in any::<[u32; 4]>(), sack in any::<[u8; 32]>()) -> MrAckRepr {
        MrAckRepr { ece, refusals, path_id, ce_count, cum_seq: w[0], ts_echo: w[1], ack_delay: w[2],
                    rate_hint: w[3], sack }
    }
}

prop_compose! {
    fn mr_nack()(path_id in any::<u8>(), reason in any::<u8>(), path_seq in any::<u32>(),
                 stream_id in any::<u16>(), msn in any::<u32>()) -> MrNackRepr {
        MrNackRepr { path_id, reason: NackReason::from_u8(reason), path_seq, stream_id, msn }
    }
}

prop_compose! {
    fn mr_probe()(path_id in any::<u8>(), w in any::<[u32; 3]>()) -> MrProbeRepr {
        MrProbeRepr { path_id, probe_seq: w[0], timestamp: w[1], ts_echo: w[2] }
    }
}

prop_compose! {
    /// Every extension header, then kept only where the opcode's layout carries it.
    fn extensions(op: Opcode)(
        data in mr_data(), ack in mr_ack(), nack in mr_nack(), probe in mr_probe(),
        q in any::<[u64; 6]>(), d in any::<[u32; 8]>(), syndrome in any::<u8>(),
    ) -> Extensions {
        let l = op.layout();
        let fields = ExtensionFields {
            mr_data: l.has_mr_data().then_some(data),
            deth: l.has_deth().then_some(DethRepr { qkey: d[0], src_qp: Qpn::new(d[1]) }),
            mr_remote: l.has_mr_remote().then_some(MrRemoteRepr { va: q[0], rkey: d[2] }),
            reth: l.has_reth().then_some(RethRepr { va: q[1], rkey: d[3], dma_len: d[4] }),
            atomic_eth: l.has_atomic_eth().then_some(AtomicEthRepr {
                va: q[2], rkey: d[5], swap_add: q[3], compare: q[4] }),
            aeth: l.has_aeth().then_some(AethRepr { syndrome, msn: d[6] & 0xff_ffff }),
            atomic_ack_eth: l.has_atomic_ack_eth().then_some(AtomicAckEthRepr { orig: q[5] }),
            immdt: l.has_immdt().then_some(d[7]),
            ieth: l.has_ieth().then_some(d[0] ^ d[7]),
            cnp: l.has_cnp(),
            mr_ack: l.has_mr_ack().then_some(ack),
            mr_nack: l.has_mr_nack().then_some(nack),
            mr_probe: l.has_mr_probe().then_some(probe),
        };
        Extensions::from_fields(l, &fields).expect("fields follow the layout")
    }
}

/// The owned parts of a frame; `repr` borrows the options and payload from it.
#[derive(Debug, Clone)]
struct Parts {
    eth: EthernetRepr,
    v6: Option<Ipv6Repr>,
    v4: (u8, Ecn, u16, bool, u8, u32, u32),
    options: Vec<u8>,
    udp: UdpRepr,
    bth: BthRepr,
    ext: Extensions,
    payload: Vec<u8>,
}

impl Parts {
    fn repr(&self) -> FrameRepr<'_> {
        let ip = match self.v6 {
            Some(v6) => IpRepr::V6(v6),
            None => {
                let (dscp, ecn, ident, dont_frag, ttl, src, dst) = self.v4;
                IpRepr::V4(Ipv4Repr {
                    dscp,
                    ecn,
                    ident,
                    dont_frag,
                    ttl,
                    src: Ipv4Addr::from(src),
                    dst: Ipv4Addr::from(dst),
                    options: &self.options,
                })
            }
        };
        FrameRepr {
            eth: self.eth,
            ip,
            udp: self.udp,
            bth: self.bth,
            ext: self.ext,
            payload: &self.payload,
        }
    }
}

fn parts() -> impl Strategy<Value = Parts> {
    opcode().prop_flat_map(|op| {
        (
            (
                any::<[u8; 6]>(),
                any::<[u8; 6]>(),
                prop::option::of((0u8..8, any::<bool>(), 0u16..4096)),
            ),
            prop::option::of((
                0u8..64,
                ecn(),
                0u32..(1 << 20),
                any::<u8>(),
                any::<u128>(),
                any::<u128>(),
            )),
            (
                0u8..64,
                ecn(),
                any::<u16>(),
                any::<bool>(),
                any::<u8>(),
                any::<u32>(),
                any::<u32>(),
            ),
            (0usize..=10).prop_flat_map(|words| prop::collection::vec(any::<u8>(), words * 4)),
            (any::<u16>(), any::<bool>()),
            bth(op),
            extensions(op),
            prop::collection::vec(any::<u8>(), 0..600),
        )
            .prop_map(
                |(e, v6, v4, options, (sport, checksum), bth, ext, payload)| {
                    let v6 = v6.map(|(dscp, ecn, flow_label, hop_limit, s, d)| Ipv6Repr {
                        dscp,
                        ecn,
                        flow_label,
                        hop_limit,
                        src: Ipv6Addr::from(s),
                        dst: Ipv6Addr::from(d),
                    });
                    Parts {
                        eth: EthernetRepr {
                            dst: MacAddr(e.0),
                            src: MacAddr(e.1),
                            vlan: e.2.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
                            ethertype: if v6.is_some() {
                                EtherType::IPV6
                            } else {
                                EtherType::IPV4
                            },
                        },
                        v6,
                        v4,
                        options: if v6.is_some() { Vec::new() } else { options },
                        udp: UdpRepr {
                            src_port: sport,
                            dst_port: 4791,
                            checksum,
                        },
                        bth,
                        ext,
                        payload,
                    }
                },
            )
    })
}

fn emit(repr: &FrameRepr<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut buf).expect("valid frames emit");
    assert_eq!(n, buf.len());
    buf
}

/// Whether the ICRC leaves out bit `bit` of byte `at` (counted from the IP header).
fn variant_bit(repr: &FrameRepr<'_>, at: usize, bit: u8) -> bool {
    let ip_len = repr.ip.header_len();
    let ip_variant = match repr.ip {
        IpRepr::V4(_) => matches!(at, 1 | 8 | 10 | 11),
        // Byte 0 holds the version (high nibble) and the top of the traffic class (low nibble).
        IpRepr::V6(_) => matches!(at, 1 | 2 | 3 | 7) || (at == 0 && bit < 4),
    };
    ip_variant || at == ip_len + 6 || at == ip_len + 7 || at == ip_len + 8 + 4
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn a_sent_datagram_parses_back(
        (_op, bth, ext) in prop::sample::select(Opcode::KNOWN).prop_flat_map(|op| (Just(op), bth(op), extensions(op))),
        cum_psn in 0u32..1 << 24,
        ack in mr_ack(),
        payload in prop::collection::vec(any::<u8>(), 0..300),
        short in 1usize..8,
    ) {
        // Headers for any known opcode; a MetaRoCE data header with flag A carries an ACK.
        let piggy = ext.mr_data().is_some_and(|d| d.ack).then_some(PiggyAck { cum_psn: Psn::new(cum_psn), ack });
        let headers = DatagramHeaders::new(bth, ext, piggy, payload.len());
        let mut buf = vec![0xa5u8; 512];
        let header_len = headers.emit(&mut buf).expect("fits");
        let len = headers.datagram_len(header_len, payload.len());
        prop_assert_eq!(len % 4, 0, "pad ends the payload on four bytes");
        buf[header_len..header_len + payload.len()].copy_from_slice(&payload);
        let datagram = &mut buf[..len];
        let sum = |b: &[u8]| b.iter().fold(7u32, |a, &x| a.rotate_left(5) ^ u32::from(x));
        seal(datagram, header_len + payload.len(), sum).unwrap();
        let d = Datagram::parse(datagram).expect("a sealed datagram parses");
        prop_assert_eq!(d.bth, headers.bth);
        prop_assert_eq!(d.ext, ext);
        prop_assert_eq!(d.piggy, piggy);
        prop_assert_eq!(d.payload(), &payload[..]);
        prop_assert_eq!(d.icrc(), sum(d.covered()));
        prop_assert!(datagram[header_len + payload.len()..len - 4].iter().all(|&b| b == 0), "zero pad");
        // Too short for the headers, or for the payload and the ICRC: an error, nothing written
        // beyond the buffer, and a datagram left as it was.
        let mut small = vec![0u8; header_len - short.min(header_len)];
        prop_assert!(headers.emit(&mut small).is_err());
        let before = datagram.to_vec();
        prop_assert!(seal(datagram, len - 3, sum).is_err());
        prop_assert_eq!(&datagram[..], &before[..]);
        // A carried ACK without flag A, or flag A without one, is refused.
        let odd = DatagramHeaders { piggy: if piggy.is_some() { None } else { Some(PiggyAck { cum_psn: Psn::new(cum_psn), ack }) }, ..headers };
        prop_assert!(odd.emit(&mut buf).is_err());
    }

    #[test]
    fn frame_round_trips(p in parts()) {
        let repr = p.repr();
        let bytes = emit(&repr);
        let parsed = parse(&bytes).expect("an emitted frame parses");
        prop_assert_eq!(parsed.repr, repr);
        prop_assert_eq!(parsed.icrc_ok(), Some(true));
        prop_assert_eq!(parsed.trailer_len, 0);
    }

    #[test]
    fn parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..1600)) {
        let _ = parse(&bytes);
        let _ = parse_with(&bytes, &ParseOptions { icrc: IcrcCheck::Report, ..Default::default() });
    }

    #[test]
    fn a_datagram_view_never_panics_and_agrees_with_the_frame_parser(p in parts(), cut in any::<prop::sample::Index>(), junk in prop::collection::vec(any::<u8>(), 0..600)) {
        // What a UDP socket hands over (BTH to ICRC) of a valid frame parses to the same headers
        // and payload as the whole frame; cut anywhere, or replaced by junk, it is an error or a
        // view, never a panic, and a view's parts lie inside the bytes.
        let repr = p.repr();
        let bytes = emit(&repr);
        let udp_end = repr.eth.header_len() + repr.ip.header_len() + 8;
        let dgram = &bytes[udp_end..];
        // (A data packet with flag A opens its payload with a carried ACK, which the frame
        // parser leaves in the payload and the view takes out: those are compared elsewhere.)
        if !repr.ext.mr_data().is_some_and(|d| d.ack) {
            let v = transport_core::wire::Datagram::parse(dgram).expect("an emitted datagram parses");
            prop_assert_eq!(v.bth, repr.bth);
            prop_assert_eq!(v.ext, repr.ext);
            prop_assert_eq!(v.payload(), repr.payload);
            prop_assert!(v.piggy.is_none());
        }
        for d in [dgram, &dgram[..cut.index(dgram.len() + 1)], &junk[..]] {
            if let Ok(v) = transport_core::wire::Datagram::parse(d) {
                prop_assert!(v.payload_at + v.payload_len + 4 <= d.len());
                let _ = (v.payload(), v.covered(), v.icrc());
            }
        }
    }

    #[test]
    fn parse_never_panics_on_plausible_prefixes(p in parts(), tail in prop::collection::vec(any::<u8>(), 0..64), cut in any::<prop::sample::Index>()) {
        // A valid frame cut anywhere, or with junk appended: an error or a frame, never a panic.
        let bytes = emit(&p.repr());
        let at = cut.index(bytes.len() + 1);
        let _ = parse(&bytes[..at]);
        let mut longer = bytes.clone();
        longer.extend_from_slice(&tail);
        let _ = parse(&longer);
    }

    #[test]
    fn mutations_never_panic_and_covered_flips_are_caught(p in parts(), flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..4)) {
        let repr = p.repr();
        let bytes = emit(&repr);
        let ip_start = repr.eth.header_len();
        let no_other_checks = ParseOptions { verify_ip_checksum: false, verify_udp_checksum: false, ..Default::default() };
        // One flipped bit in a covered byte is always detected.
        let (idx, bit) = flips[0];
        let at = ip_start + idx.index(bytes.len() - 4 - ip_start);
        let mut one = bytes.clone();
        one[at] ^= 1 << bit;
        if !variant_bit(&repr, at - ip_start, bit) {
            prop_assert!(parse_with(&one, &no_other_checks).is_err(), "flip at {} bit {} undetected", at, bit);
        }
        // Several flips anywhere: never a panic.
        let mut many = bytes.clone();
        for (idx, bit) in &flips {
            let at = idx.index(many.len());
            many[at] ^= 1 << bit;
        }
        let _ = parse(&many);
        let _ = parse_with(&many, &no_other_checks);
    }

    #[test]
    fn headers_round_trip_alone(e in (any::<[u8; 6]>(), any::<[u8; 6]>(), prop::option::of((0u8..8, any::<bool>(), 0u16..4096)), prop_oneof![Just(EtherType::VLAN), any::<u16>()]),
                                b in opcode().prop_flat_map(bth)) {
        let eth = EthernetRepr { dst: MacAddr(e.0), src: MacAddr(e.1), vlan: e.2.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }), ethertype: e.3 };
        let mut buf = [0u8; 18];
        if eth.vlan.is_none() && eth.ethertype == EtherType::VLAN {
            // Untagged, the TPID as EtherType would be read back as a tag: emit refuses it.
            prop_assert!(eth.emit(&mut buf).is_err());
        } else {
            eth.emit(&mut buf).unwrap();
            let (back, rest) = EthernetRepr::parse(&buf[..eth.header_len()]).unwrap();
            prop_assert!(rest.is_empty());
            prop_assert_eq!(back, eth);
        }
        let mut buf = [0u8; 12];
        b.emit(&mut buf).unwrap();
        prop_assert_eq!(BthRepr::parse(&buf).unwrap().0, b);
    }

    #[test]
    fn metaroce_headers_round_trip(d in mr_data(), a in mr_ack(), n in mr_nack(), p in mr_probe(), va in any::<u64>(), rkey in any::<u32>(), psn in 0u32..1 << 24) {
        let mut buf = [0u8; 64];
        d.emit(&mut buf).unwrap();
        prop_assert_eq!(MrDataRepr::parse(&buf).unwrap().0, d);
        a.emit(&mut buf).unwrap();
        prop_assert_eq!(MrAckRepr::parse(&buf).unwrap().0, a);
        let piggy = PiggyAck { cum_psn: Psn::new(psn), ack: a };
        let rest = piggy.emit(&mut buf).unwrap().len();
        prop_assert_eq!(rest, 64 - PiggyAck::LEN);
        prop_assert_eq!(PiggyAck::parse(&buf).unwrap().0, piggy);
        prop_assert!(PiggyAck::parse(&buf[..PiggyAck::LEN - 1]).is_err());
        n.emit(&mut buf).unwrap();
        prop_assert_eq!(MrNackRepr::parse(&buf).unwrap().0, n);
        p.emit(&mut buf).unwrap();
        prop_assert_eq!(MrProbeRepr::parse(&buf).unwrap().0, p);
        let r = MrRemoteRepr { va, rkey };
        r.emit(&mut buf).unwrap();
        prop_assert_eq!(MrRemoteRepr::parse(&buf).unwrap().0, r);
    }

    #[test]
    fn ip_and_udp_round_trip_alone(v4 in (0u8..64, ecn(), any::<u16>(), any::<bool>(), any::<u8>(), any::<u32>(), any::<u32>()),
                                   words in 0usize..=10, len in 0usize..2000, sport in any::<u16>()) {
        let options = vec![1u8; words * 4];
        let r = Ipv4Repr { dscp: v4.0, ecn: v4.1, ident: v4.2, dont_frag: v4.3, ttl: v4.4, src: Ipv4Addr::from(v4.5), dst: Ipv4Addr::from(v4.6), options: &options };
        let mut buf = vec![0u8; r.header_len() + len];
        r.emit(&mut buf, len).unwrap();
        let (back, header, payload) = Ipv4Repr::parse(&buf, true).unwrap();
        prop_assert_eq!(back, r);
        prop_assert_eq!(header.len(), r.header_len());
        prop_assert_eq!(payload.len(), len);
        let u = UdpRepr { src_port: sport, dst_port: 4791, checksum: false };
        let mut buf = vec![0u8; 8 + len];
        u.emit(&mut buf, len).unwrap();
        let (back, _, payload) = UdpRepr::parse(&buf).unwrap();
        prop_assert_eq!(back, u);
        prop_assert_eq!(payload.len(), len);
    }
}
