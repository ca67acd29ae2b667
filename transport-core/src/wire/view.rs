//! A checked, zero-copy view of a whole frame: [`FrameView::new_checked`] validates everything
//! [`parse`](super::parse) validates (lengths, IPv4 checksum, UDP checksum, RoCEv2 port, extension
//! headers present and of a known MetaRoCE version, pad count, ICRC) but keeps only offsets. Fields
//! are read on demand, so the receive path pays for the fields it uses and nothing more.

use super::ip::{check_ipv4, check_ipv6, IpRepr, Ipv4Repr, Ipv6Repr};
use super::metaroce::VERSION;
use super::options::{IcrcCheck, ParseOptions};
use super::{
    ones_complement_sum, truncated, BthRepr, Error, EtherType, EthernetRepr, Extensions, Header,
    Layout, MacAddr, Opcode, Psn, Qpn, UdpRepr, VlanTag,
};
use crate::icrc;

/// A validated frame, read in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameView<'a> {
    /// The frame up to the end of the IP packet (Ethernet padding cut off).
    bytes: &'a [u8],
    /// Bytes of Ethernet padding after the IP packet.
    trailer_len: u32,
    ip_start: u8,
    udp_start: u8,
    ext_start: u8,
    layout: Layout,
    payload_start: u32,
    payload_end: u32,
    icrc_computed: Option<u32>,
}

#[inline(always)]
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline(always)]
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl<'a> FrameView<'a> {
    /// Validates a frame. Never panics, whatever the bytes.
    #[inline]
    pub fn new_checked(frame: &'a [u8], opts: &ParseOptions) -> Result<Self, Error> {
        if frame.len() < 14 {
            return Err(truncated(Header::Ethernet, 14, frame.len()));
        }
        let mut ethertype = be16(frame, 12);
        let mut ip_start = 14;
        if ethertype == EtherType::VLAN {
            if frame.len() < 18 {
                return Err(truncated(Header::Vlan, 4, frame.len() - 14));
            }
            ethertype = be16(frame, 16);
            ip_start = 18;
        }
        let ip = &frame[ip_start..];
        let (ip_header_len, ip_len) = match ethertype {
            EtherType::IPV4 => check_ipv4(ip, opts.verify_ip_checksum)?,
            EtherType::IPV6 => check_ipv6(ip)?,
            other => return Err(Error::UnsupportedEtherType(other)),
        };
        let ip_end = ip_start + ip_len;
        let udp_start = ip_start + ip_header_len;
        let ip_payload = &frame[udp_start..ip_end];
        if ip_payload.len() < UdpRepr::LEN {
            return Err(truncated(Header::Udp, UdpRepr::LEN, ip_payload.len()));
        }
        let udp_claimed = be16(ip_payload, 4);
        let udp_len = usize::from(udp_claimed);
        if udp_len < UdpRepr::LEN || udp_len > ip_payload.len() {
            return Err(Error::UdpLength {
                claimed: udp_claimed,
                available: ip_payload.len(),
            });
        }
        let dst_port = be16(ip_payload, 2);
        if dst_port != opts.port {
            return Err(Error::NotRoce(dst_port));
        }
        let udp = &ip_payload[..udp_len];
        let stored_udp = be16(udp, 6);
        if opts.verify_udp_checksum && stored_udp != 0 {
            let pseudo = pseudo_sum(frame, ip_start, ethertype == EtherType::IPV6, udp_len);
            if ones_complement_sum(pseudo, udp) != 0xffff {
                let acc = ones_complement_sum(ones_complement_sum(pseudo, &udp[..6]), &udp[8..]);
                let computed = match !(acc as u16) {
                    0 => 0xffff,
                    c => c,
                };
                return Err(Error::UdpChecksum {
                    stored: stored_udp,
                    computed,
                });
            }
        }
        let transport = &udp[UdpRepr::LEN..];
        if transport.len() < BthRepr::LEN {
            return Err(truncated(Header::Bth, BthRepr::LEN, transport.len()));
        }
        let layout = Opcode::layout_of(transport[0]);
        let pad = (transport[1] >> 4) & 3;
        let body = &transport[BthRepr::LEN..];
        let ext_len = layout.len();
        let mr_version_ok =
            !layout_has_version(layout) || body.first().map(|b| b >> 4) == Some(VERSION);
        if body.len() < ext_len || !mr_version_ok {
            // The slow path names the exact header that is cut short or of another version.
            return Err(match Extensions::parse(layout, body) {
                Err(e) => e,
                Ok(_) => truncated(Header::Payload, ext_len, body.len()),
            });
        }
        let after = &body[ext_len..];
        let Some(payload_and_pad) = after.len().checked_sub(4) else {
            return Err(truncated(Header::Icrc, 4, after.len()));
        };
        let Some(payload_len) = payload_and_pad.checked_sub(usize::from(pad)) else {
            return Err(Error::PadCount {
                pad,
                available: payload_and_pad,
            });
        };
        let ext_start = udp_start + UdpRepr::LEN + BthRepr::LEN;
        let payload_start = ext_start + ext_len;
        let icrc_at = udp_start + udp_len - 4;
        let icrc_computed = match opts.icrc {
            IcrcCheck::Skip => None,
            IcrcCheck::Verify | IcrcCheck::Report => {
                let computed = icrc::compute(
                    &frame[ip_start..udp_start],
                    &frame[udp_start..udp_start + UdpRepr::LEN],
                    &frame[udp_start + UdpRepr::LEN..icrc_at],
                );
                let stored = u32::from_le_bytes([
                    frame[icrc_at],
                    frame[icrc_at + 1],
                    frame[icrc_at + 2],
                    frame[icrc_at + 3],
                ]);
                if opts.icrc == IcrcCheck::Verify && computed != stored {
                    return Err(Error::Icrc { stored, computed });
                }
                Some(computed)
            }
        };
        Ok(FrameView {
            bytes: &frame[..ip_end],
            trailer_len: (frame.len() - ip_end) as u32,
            ip_start: ip_start as u8,
            udp_start: udp_start as u8,
            ext_start: ext_start as u8,
            layout,
            payload_start: payload_start as u32,
            payload_end: (payload_start + payload_len) as u32,
            icrc_computed,
        })
    }

    /// The frame's bytes up to the end of the IP packet.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Bytes after the IP packet (Ethernet padding).
    pub fn trailer_len(&self) -> usize {
        self.trailer_len as usize
    }

    /// Whether the frame carries IPv6.
    pub fn is_ipv6(&self) -> bool {
        self.bytes[usize::from(self.ip_start)] >> 4 == 6
    }

    /// The UDP source port (the path's entropy).
    pub fn src_port(&self) -> u16 {
        be16(self.bytes, usize::from(self.udp_start))
    }

    #[inline]
    fn bth_at(&self) -> usize {
        usize::from(self.udp_start) + UdpRepr::LEN
    }

    /// The BTH opcode.
    #[inline]
    pub fn opcode(&self) -> Opcode {
        Opcode::from_u8(self.bytes[self.bth_at()])
    }

    /// The BTH partition key.
    #[inline]
    pub fn pkey(&self) -> u16 {
        be16(self.bytes, self.bth_at() + 2)
    }

    /// The BTH destination QP.
    #[inline]
    pub fn dest_qp(&self) -> Qpn {
        Qpn::new(be32(self.bytes, self.bth_at() + 4))
    }

    /// The BTH PSN.
    #[inline]
    pub fn psn(&self) -> Psn {
        Psn::new(be32(self.bytes, self.bth_at() + 8))
    }

    /// The extension headers' layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The payload, without the pad.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.bytes[self.payload_start as usize..self.payload_end as usize]
    }

    /// Where the payload starts within the frame.
    pub fn payload_offset(&self) -> usize {
        self.payload_start as usize
    }

    /// The ICRC the frame carries.
    pub fn icrc(&self) -> u32 {
        let at = self.bytes.len() - 4;
        u32::from_le_bytes([
            self.bytes[at],
            self.bytes[at + 1],
            self.bytes[at + 2],
            self.bytes[at + 3],
        ])
    }

    /// The ICRC computed over the frame, unless the check was skipped.
    pub fn icrc_computed(&self) -> Option<u32> {
        self.icrc_computed
    }

    /// The Ethernet header.
    pub fn ethernet(&self) -> EthernetRepr {
        let b = self.bytes;
        let tagged = self.ip_start == 18;
        let at = if tagged { 16 } else { 12 };
        EthernetRepr {
            dst: MacAddr([b[0], b[1], b[2], b[3], b[4], b[5]]),
            src: MacAddr([b[6], b[7], b[8], b[9], b[10], b[11]]),
            vlan: tagged.then(|| VlanTag::from_tci(be16(b, 14))),
            ethertype: be16(b, at),
        }
    }

    /// The IP header.
    pub fn ip(&self) -> IpRepr<'a> {
        let ip = &self.bytes[usize::from(self.ip_start)..usize::from(self.udp_start)];
        if self.is_ipv6() {
            IpRepr::V6(Ipv6Repr::read(ip))
        } else {
            IpRepr::V4(Ipv4Repr::read(ip))
        }
    }

    /// The UDP header.
    pub fn udp(&self) -> UdpRepr {
        let u = usize::from(self.udp_start);
        UdpRepr {
            src_port: be16(self.bytes, u),
            dst_port: be16(self.bytes, u + 2),
            checksum: be16(self.bytes, u + 6) != 0,
        }
    }

    /// The BTH.
    pub fn bth(&self) -> BthRepr {
        let at = self.bth_at();
        BthRepr::from_bytes(&core::array::from_fn(|i| self.bytes[at + i]))
    }

    /// The extension headers.
    pub fn extensions(&self) -> Extensions {
        // Their presence, length and MetaRoCE version were checked at construction, so the
        // parse succeeds; the default is never taken.
        Extensions::parse(self.layout, &self.bytes[usize::from(self.ext_start)..])
            .map(|(e, _)| e)
            .unwrap_or_default()
    }
}

/// Whether the layout opens with a MetaRoCE header that carries the version nibble.
const fn layout_has_version(layout: Layout) -> bool {
    layout.has_mr_data() || layout.has_mr_ack() || layout.has_mr_nack() || layout.has_mr_probe()
}

/// The UDP pseudo-header sum read straight from the IP header.
fn pseudo_sum(frame: &[u8], ip_start: usize, v6: bool, udp_len: usize) -> u32 {
    let addrs = if v6 {
        &frame[ip_start + 8..ip_start + 40]
    } else {
        &frame[ip_start + 12..ip_start + 20]
    };
    let mut acc = ones_complement_sum(0, addrs);
    acc += u32::from(super::ip::PROTO_UDP);
    acc += (udp_len as u32) >> 16;
    acc += (udp_len as u32) & 0xffff;
    acc
}
