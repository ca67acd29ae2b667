//! Random valid frames for test benches: every opcode, IPv4 and IPv6, with and without an 802.1Q
//! tag, payloads of 0 to 4096 bytes, reproducible from a seed.

use std::net::{Ipv4Addr, Ipv6Addr};
use transport_core::wire::metaroce::{
    MrAckRepr, MrDataRepr, MrNackRepr, MrProbeRepr, MrRemoteRepr, NackReason, PiggyAck,
};
use transport_core::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Ecn, EtherType, EthernetRepr,
    ExtensionFields, Extensions, FrameRepr, IpRepr, Ipv4Repr, Ipv6Repr, MacAddr, Opcode, Psn, Qpn,
    RethRepr, Transport, UdpRepr, VlanTag, ROCEV2_PORT,
};

/// Which opcodes to draw from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The IBTA opcodes: RC, UC, UD and CNP.
    Rocev2,
    /// The MetaRoCE opcodes.
    Metaroce,
    /// Both.
    Mixed,
}

/// SplitMix64: small, fast and the same on every platform, so a seed names the same frames
/// everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// True with probability `p` (0 never, 1 always).
    pub fn chance_f(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn u32(&mut self) -> u32 {
        self.next_u64() as u32
    }

    fn u16(&mut self) -> u16 {
        self.next_u64() as u16
    }

    fn u8(&mut self) -> u8 {
        self.next_u64() as u8
    }

    fn bool(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

/// Whether an opcode carries payload bytes.
pub fn carries_payload(op: Opcode) -> bool {
    let l = op.layout();
    let control = l.has_cnp() || l.has_mr_ack() || l.has_mr_nack() || l.has_mr_probe();
    let request_only = matches!(
        op,
        Opcode::RcReadRequest
            | Opcode::RcAck
            | Opcode::RcAtomicAck
            | Opcode::RcCompareSwap
            | Opcode::RcFetchAdd
            | Opcode::MrReadRequest
            | Opcode::MrCompareSwap
            | Opcode::MrFetchAdd
            | Opcode::MrAtomicResponse
    );
    !(control || request_only)
}

/// Draws one frame and writes it to a new vector.
pub fn frame(rng: &mut Rng, kind: Kind) -> Vec<u8> {
    let opcodes: Vec<Opcode> = Opcode::KNOWN
        .iter()
        .copied()
        .filter(|op| match kind {
            Kind::Rocev2 => op.transport() != Transport::Vendor,
            Kind::Metaroce => op.is_metaroce(),
            Kind::Mixed => true,
        })
        .collect();
    let opcode = opcodes[rng.below(opcodes.len() as u64) as usize];
    let payload_len = if carries_payload(opcode) {
        rng.below(4097) as usize
    } else {
        0
    };
    let payload: Vec<u8> = (0..payload_len).map(|_| rng.u8()).collect();

    let v6 = rng.bool();
    let eth = EthernetRepr {
        dst: MacAddr(mac(rng)),
        src: MacAddr(mac(rng)),
        vlan: rng.bool().then(|| VlanTag {
            pcp: rng.below(8) as u8,
            dei: rng.chance(1, 8),
            vid: 1 + rng.below(4094) as u16,
        }),
        ethertype: if v6 { EtherType::IPV6 } else { EtherType::IPV4 },
    };
    let dscp = rng.below(64) as u8;
    let ecn = Ecn::from_bits(rng.u8());
    let ip = if v6 {
        IpRepr::V6(Ipv6Repr {
            dscp,
            ecn,
            flow_label: rng.u32() & 0xf_ffff,
            hop_limit: rng.u8(),
            src: Ipv6Addr::from(u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64())),
            dst: Ipv6Addr::from(u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64())),
        })
    } else {
        IpRepr::V4(Ipv4Repr {
            dscp,
            ecn,
            ident: rng.u16(),
            dont_frag: rng.chance(7, 8),
            ttl: rng.u8(),
            src: Ipv4Addr::from(rng.u32()),
            dst: Ipv4Addr::from(rng.u32()),
            options: &[],
        })
    };
    let udp = UdpRepr {
        src_port: 0xc000 | rng.u16(),
        dst_port: ROCEV2_PORT,
        checksum: rng.chance(1, 4),
    };
    let bth = BthRepr {
        opcode,
        solicited: rng.bool(),
        mig_req: rng.bool(),
        pad_count: ((4 - payload_len % 4) % 4) as u8,
        tver: 0,
        pkey: rng.u16(),
        fecn: rng.chance(1, 8),
        becn: opcode == Opcode::Cnp || rng.chance(1, 8),
        dest_qp: Qpn::new(rng.u32()),
        ack_req: rng.bool(),
        psn: Psn::new(rng.u32()),
    };
    let ext = extensions(rng, opcode, payload_len);
    // A data packet with flag A opens its body with the acknowledgement it carries.
    let payload = if ext.mr_data().is_some_and(|d| d.ack) {
        let mut body = vec![0u8; PiggyAck::LEN];
        PiggyAck {
            cum_psn: Psn::new(rng.u32() & 0x00ff_ffff),
            ack: mr_ack(rng),
        }
        .emit(&mut body)
        .expect("the buffer has its length");
        body.extend_from_slice(&payload);
        body
    } else {
        payload
    };
    let repr = FrameRepr {
        eth,
        ip,
        udp,
        bth,
        ext,
        payload: &payload,
    };
    let mut out = vec![0u8; repr.buffer_len()];
    let n = repr
        .emit(&mut out)
        .expect("a generated frame is valid by construction");
    out.truncate(n);
    out
}

fn mr_ack(rng: &mut Rng) -> MrAckRepr {
    let mut sack = [0u8; 32];
    sack.iter_mut().for_each(|b| *b = rng.u8());
    MrAckRepr {
        ece: rng.chance(1, 4),
        refusals: rng.chance(1, 8),
        path_id: rng.u8(),
        ce_count: rng.u16() >> rng.below(16),
        cum_seq: rng.u32(),
        ts_echo: rng.u32(),
        ack_delay: rng.u32() >> 12,
        rate_hint: rng.u32() >> 8,
        sack,
    }
}

fn mac(rng: &mut Rng) -> [u8; 6] {
    let b = rng.next_u64().to_be_bytes();
    // Unicast, locally administered.
    [(b[0] & 0xfc) | 0x02, b[1], b[2], b[3], b[4], b[5]]
}

fn extensions(rng: &mut Rng, opcode: Opcode, payload_len: usize) -> Extensions {
    let l = opcode.layout();
    let mut ext = ExtensionFields::default();
    if l.has_mr_data() {
        let msg_len = (rng.u32() >> rng.below(32)).max(payload_len as u32);
        let msg_offset = rng.below(u64::from(msg_len) - payload_len as u64 + 1) as u32;
        ext.mr_data = Some(MrDataRepr {
            retransmit: rng.chance(1, 8),
            ack: rng.chance(1, 4),
            path_id: rng.u8(),
            stream_id: rng.u16(),
            path_seq: rng.u32(),
            msn: rng.u32(),
            msg_offset,
            msg_len,
            timestamp: rng.u32(),
        });
    }
    if l.has_deth() {
        ext.deth = Some(DethRepr {
            qkey: rng.u32(),
            src_qp: Qpn::new(rng.u32()),
        });
    }
    if l.has_mr_remote() {
        ext.mr_remote = Some(MrRemoteRepr {
            va: rng.next_u64(),
            rkey: rng.u32(),
        });
    }
    if l.has_reth() {
        ext.reth = Some(RethRepr {
            va: rng.next_u64(),
            rkey: rng.u32(),
            dma_len: rng.u32(),
        });
    }
    if l.has_atomic_eth() {
        ext.atomic_eth = Some(AtomicEthRepr {
            va: rng.next_u64() & !7,
            rkey: rng.u32(),
            swap_add: rng.next_u64(),
            compare: rng.next_u64(),
        });
    }
    if l.has_aeth() {
        // ACK with credit, RNR NAK or one of the defined NAK codes.
        let syndrome = match rng.below(3) {
            0 => rng.below(32) as u8,
            1 => 0x20 | rng.below(32) as u8,
            _ => 0x60 | rng.below(5) as u8,
        };
        ext.aeth = Some(AethRepr {
            syndrome,
            msn: rng.u32() & 0xff_ffff,
        });
    }
    if l.has_atomic_ack_eth() {
        ext.atomic_ack_eth = Some(AtomicAckEthRepr {
            orig: rng.next_u64(),
        });
    }
    if l.has_immdt() {
        ext.immdt = Some(rng.u32());
    }
    if l.has_ieth() {
        ext.ieth = Some(rng.u32());
    }
    ext.cnp = l.has_cnp();
    if l.has_mr_ack() {
        ext.mr_ack = Some(mr_ack(rng));
    }
    if l.has_mr_nack() {
        ext.mr_nack = Some(MrNackRepr {
            path_id: rng.u8(),
            reason: NackReason::from_u8(1 + rng.below(9) as u8),
            path_seq: rng.u32(),
            stream_id: rng.u16(),
            msn: rng.u32(),
        });
    }
    if l.has_mr_probe() {
        let reply = opcode == Opcode::MrProbeReply;
        ext.mr_probe = Some(MrProbeRepr {
            path_id: rng.u8(),
            probe_seq: rng.u32(),
            timestamp: rng.u32(),
            ts_echo: if reply { rng.u32() } else { 0 },
        });
    }
    Extensions::from_fields(l, &ext).expect("fields drawn from the opcode's own layout")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_frames_and_all_parse() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..300 {
            let fa = frame(&mut a, Kind::Mixed);
            assert_eq!(fa, frame(&mut b, Kind::Mixed));
            let p = transport_core::wire::parse(&fa).expect("generated frames parse");
            assert_eq!(p.icrc_ok(), Some(true));
        }
    }
}
