//! The real ConnectX frames of `tests/data/rocev2-connectx.{hex,pcap}` parse with the right fields
//! and a correct ICRC. Expected values are read off the hex by hand, per IBTA Annex A17.

use metaroce_frames::capture;
use std::net::Ipv4Addr;
use tests::{data, hex_frames};
use transport_core::wire::{
    parse, AckSyndrome, Ecn, Extensions, IpRepr, MacAddr, Opcode, Parsed, Psn, Qpn, VlanTag,
};

fn v4(p: &Parsed<'_>) -> (Ipv4Addr, Ipv4Addr, u8, Ecn) {
    match p.repr.ip {
        IpRepr::V4(r) => (r.src, r.dst, r.dscp, r.ecn),
        IpRepr::V6(_) => panic!("expected IPv4"),
    }
}

#[test]
fn connectx_frames_parse_with_the_right_fields() {
    let frames = hex_frames(&data("rocev2-connectx.hex"));
    assert_eq!(frames.len(), 8);
    let parsed: Vec<Parsed<'_>> = frames
        .iter()
        .map(|f| parse(f).expect("a real NIC frame parses"))
        .collect();
    for p in &parsed {
        assert_eq!(p.icrc_ok(), Some(true));
    }

    // 1: CNP from a ConnectX-4 Lx: TOS 0xc2, UDP source port 0, BECN, P_Key 0xffff.
    let cnp = &parsed[0].repr;
    assert_eq!(cnp.eth.dst, MacAddr([0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2]));
    assert_eq!(
        v4(&parsed[0]),
        (
            Ipv4Addr::new(10, 0, 17, 1),
            Ipv4Addr::new(10, 0, 18, 1),
            48,
            Ecn::Ect0
        )
    );
    assert_eq!((cnp.udp.src_port, cnp.udp.dst_port), (0, 4791));
    assert_eq!(cnp.bth.opcode, Opcode::Cnp);
    assert!(cnp.bth.becn && !cnp.bth.fecn);
    assert_eq!((cnp.bth.pkey, cnp.bth.dest_qp), (0xffff, Qpn::new(0x118)));
    assert!(cnp.ext == Extensions::Cnp && cnp.payload.is_empty());
    assert_eq!(parsed[0].icrc, 0x2a00_fd82);

    // 2 and 3: UD SEND_ONLY carrying a CM MAD on VLAN 1, QP1, Q_Key 0x80010000.
    for (i, psn) in [(1, 0x1cc), (2, 0x1cd)] {
        let r = &parsed[i].repr;
        assert_eq!(
            r.eth.vlan,
            Some(VlanTag {
                pcp: 0,
                dei: false,
                vid: 1
            })
        );
        assert_eq!(v4(&parsed[i]).0, Ipv4Addr::new(192, 170, 1, 2));
        assert_eq!(r.udp.src_port, 0xfa4f);
        assert_eq!(r.bth.opcode, Opcode::UdSendOnly);
        assert!(r.bth.mig_req);
        assert_eq!((r.bth.dest_qp, r.bth.psn), (Qpn::new(1), Psn::new(psn)));
        let deth = r.ext.deth().expect("UD carries a DETH");
        assert_eq!((deth.qkey, deth.src_qp), (0x8001_0000, Qpn::new(1)));
        assert_eq!(r.payload.len(), 256);
        assert_eq!(r.payload[..4], [0x01, 0x07, 0x02, 0x03]); // MAD header: CM class version 2
    }

    // 4: RC SEND_ONLY to QP 0xdeaded with AckReq, PSN 0xfedfed, 192 bytes.
    let send = &parsed[3].repr;
    assert_eq!(send.bth.opcode, Opcode::RcSendOnly);
    assert!(send.bth.ack_req);
    assert_eq!(
        (send.bth.dest_qp, send.bth.psn),
        (Qpn::new(0xdeaded), Psn::new(0xfedfed))
    );
    assert_eq!(send.payload.len(), 192);

    // 5 and 6: RC ACKs, MSN 2 and 4, syndrome "ACK, credit 0".
    for (i, psn, msn) in [(4, 0xcf7bf7, 2), (5, 0xcf7bf9, 4)] {
        let r = &parsed[i].repr;
        assert_eq!(r.bth.opcode, Opcode::RcAck);
        assert_eq!(r.bth.psn, Psn::new(psn));
        let aeth = r.ext.aeth().expect("an ACK carries an AETH");
        assert_eq!(aeth.msn, msn);
        assert_eq!(aeth.kind(), AckSyndrome::Ack { credit: 0 });
    }

    // 7: CNP from an SR-IOV VF; 8: ACK with MSN 0x0e6f02.
    assert_eq!(parsed[6].repr.bth.opcode, Opcode::Cnp);
    assert_eq!(parsed[6].repr.bth.dest_qp, Qpn::new(0xd1e));
    assert_eq!(parsed[6].repr.udp.src_port, 0);
    let ack = &parsed[7].repr;
    assert_eq!(ack.bth.psn, Psn::new(0x466f1e));
    assert_eq!(ack.ext.aeth().map(|a| a.msn), Some(0x0e6f02));
}

#[test]
fn the_pcap_holds_the_same_frames() {
    let hex = hex_frames(&data("rocev2-connectx.hex"));
    let (packets, err) = capture::read(&std::fs::read(data("rocev2-connectx.pcap")).unwrap());
    assert!(err.is_none(), "{err:?}");
    let from_pcap: Vec<Vec<u8>> = packets.into_iter().map(|p| p.data).collect();
    assert_eq!(from_pcap, hex);
}

#[test]
fn every_flipped_bit_of_a_real_frame_is_caught() {
    // From the IP header on, a flipped bit must make the frame fail: the ICRC covers all but the
    // variant fields, the IP checksum covers TOS and TTL, and a zero UDP checksum turned non-zero
    // no longer verifies.
    for frame in hex_frames(&data("rocev2-connectx.hex")) {
        let ip_start = if frame[12] == 0x81 { 18 } else { 14 };
        for byte in ip_start..frame.len() {
            // BTH byte 4 (FECN, BECN, resv6) is the one byte nothing covers.
            if byte - ip_start == 20 + 8 + 4 {
                continue;
            }
            for bit in 0..8 {
                let mut f = frame.clone();
                f[byte] ^= 1 << bit;
                let r = parse(&f);
                assert!(r.is_err(), "flip of byte {byte} bit {bit} went unnoticed");
            }
        }
    }
}
