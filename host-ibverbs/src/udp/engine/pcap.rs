//! Captures of what the engine sends and receives.

use super::*;

/// Writes `payload` to the capture as the Ethernet/IP/UDP frame that carried it.
pub(super) fn write_pcap(
    p: &mut PcapWriter<BufWriter<File>>,
    t: u64,
    src: SocketAddr,
    dst: SocketAddr,
    ecn: u8,
    payload: &[u8],
) {
    let mut frame = vec![0u8; 14 + 40 + 8 + payload.len()];
    let v6 = src.is_ipv6();
    let eth = EthernetRepr {
        dst: MacAddr([0x02, 0, 0, 0, 0, 2]),
        src: MacAddr([0x02, 0, 0, 0, 0, 1]),
        vlan: None,
        ethertype: if v6 { EtherType::IPV6 } else { EtherType::IPV4 },
    };
    let udp_len = 8 + payload.len();
    let Ok(rest) = eth.emit(&mut frame) else {
        return;
    };
    let ecn = Ecn::from_bits(ecn);
    let rest = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Ipv4Repr {
            dscp: 0,
            ecn,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            src: s,
            dst: d,
            options: &[],
        }
        .emit(rest, udp_len),
        (IpAddr::V6(s), IpAddr::V6(d)) => Ipv6Repr {
            dscp: 0,
            ecn,
            flow_label: 0,
            hop_limit: 64,
            src: s,
            dst: d,
        }
        .emit(rest, udp_len),
        _ => return,
    };
    let Ok(rest) = rest else {
        return;
    };
    let rest_len = rest.len();
    let Ok(rest) = (UdpRepr {
        src_port: src.port(),
        dst_port: dst.port(),
        checksum: false,
    })
    .emit(rest, payload.len()) else {
        return;
    };
    rest[..payload.len()].copy_from_slice(payload);
    let used = frame.len() - rest_len + udp_len;
    let _ = p.write(t, &frame[..used]);
}
