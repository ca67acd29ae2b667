//! IPv4 (RFC 791, with DSCP and ECN per RFC 2474 and RFC 3168) and IPv6 (RFC 8200).
//!
//! ```text
//! IPv4                                 IPv6
//! +-------+-------+-----------+---+    +-------+---------------+---------------------------+
//! |Ver=4  | IHL   | DSCP      |ECN|    |Ver=6  | DSCP      |ECN|        flow label         |
//! +-------+-------+-----------+---+    +-------+---------------+-------+-------+-----------+
//! |        total length           |    |   payload length      | next hdr=17 | hop limit   |
//! |        identification         |    |            source address (16 bytes)              |
//! |R|D|M|    fragment offset      |    |         destination address (16 bytes)            |
//! |  TTL  | protocol=17 | checksum|    +---------------------------------------------------+
//! | source address | dest address |
//! | options (IHL*4 - 20 bytes)    |
//! +-------------------------------+
//! ```
//! Only UDP payloads are accepted, IPv4 fragments are refused (RoCEv2 never fragments), IPv4
//! options are honoured through IHL, and bytes beyond the IP length (Ethernet padding) are ignored.
//! IPv6 extension headers are not accepted: RoCEv2 NICs never send them.

use super::{ones_complement_sum, split, split_mut, truncated, Error, Header};
use core::net::{Ipv4Addr, Ipv6Addr};
use zerocopy::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct Ipv4Header {
    ver_ihl: u8,
    tos: u8,
    total_len: U16,
    ident: U16,
    flags_frag: U16,
    ttl: u8,
    protocol: u8,
    checksum: U16,
    src: [u8; 4],
    dst: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<Ipv4Header>() == 20);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct Ipv6Header {
    ver_tc_flow: U32,
    payload_len: U16,
    next_header: u8,
    hop_limit: u8,
    src: [u8; 16],
    dst: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<Ipv6Header>() == 40);

/// The two ECN bits of the IP header (RFC 3168).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Ecn {
    /// Not ECN-capable transport.
    #[default]
    NotEct = 0,
    /// ECN-capable transport (1).
    Ect1 = 1,
    /// ECN-capable transport (0).
    Ect0 = 2,
    /// Congestion experienced.
    Ce = 3,
}

impl Ecn {
    /// Decodes the low two bits of `bits`.
    pub const fn from_bits(bits: u8) -> Self {
        match bits & 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    /// The two-bit code point.
    pub const fn bits(self) -> u8 {
        self as u8
    }
}

/// An IPv4 header carrying UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Ipv4Repr<'a> {
    /// Differentiated services code point (6 bits).
    pub dscp: u8,
    /// ECN code point.
    pub ecn: Ecn,
    /// Identification.
    pub ident: u16,
    /// Don't fragment.
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
    /// Source address.
    #[cfg_attr(feature = "defmt", defmt(Debug2Format))]
    pub src: Ipv4Addr,
    /// Destination address.
    #[cfg_attr(feature = "defmt", defmt(Debug2Format))]
    pub dst: Ipv4Addr,
    /// Options, a multiple of 4 bytes, at most 40.
    pub options: &'a [u8],
}

impl<'a> Ipv4Repr<'a> {
    /// Parses an IPv4 header, returning it, the raw header bytes (for the ICRC) and the IP payload
    /// cut at the total length. `verify_checksum` checks the header checksum.
    pub fn parse(
        buf: &'a [u8],
        verify_checksum: bool,
    ) -> Result<(Self, &'a [u8], &'a [u8]), Error> {
        let (header_len, total) = check_ipv4(buf, verify_checksum)?;
        let (header, rest) = buf.split_at(header_len);
        Ok((Self::read(header), header, &rest[..total - header_len]))
    }

    /// Reads a header that [`check_ipv4`] accepted (`header` is exactly IHL * 4 bytes, at least 20).
    pub(crate) fn read(header: &'a [u8]) -> Self {
        let tos = header[1];
        Ipv4Repr {
            dscp: tos >> 2,
            ecn: Ecn::from_bits(tos),
            ident: u16::from_be_bytes([header[4], header[5]]),
            dont_frag: header[6] & 0x40 != 0,
            ttl: header[8],
            src: Ipv4Addr::new(header[12], header[13], header[14], header[15]),
            dst: Ipv4Addr::new(header[16], header[17], header[18], header[19]),
            options: &header[20..],
        }
    }

    /// Bytes this header occupies on the wire.
    pub const fn header_len(&self) -> usize {
        20 + self.options.len()
    }

    /// Writes the header for a payload of `payload_len` bytes, checksum included, returning the
    /// bytes after it.
    pub fn emit<'b>(&self, buf: &'b mut [u8], payload_len: usize) -> Result<&'b mut [u8], Error> {
        if self.options.len() > 40 || self.options.len() % 4 != 0 {
            return Err(Error::FieldRange("IPv4 options length"));
        }
        let header_len = self.header_len();
        let total = u16::try_from(header_len + payload_len)
            .map_err(|_| Error::FieldRange("IPv4 total length"))?;
        if buf.len() < header_len {
            return Err(Error::BufferTooSmall {
                needed: header_len,
                available: buf.len(),
            });
        }
        let (header, rest) = buf.split_at_mut(header_len);
        let (h, opts) = split_mut::<Ipv4Header>(header, Header::Ipv4)?;
        h.ver_ihl = 0x40 | (header_len / 4) as u8;
        h.tos = (self.dscp << 2) | self.ecn.bits();
        h.total_len.set(total);
        h.ident.set(self.ident);
        h.flags_frag.set(if self.dont_frag { 0x4000 } else { 0 });
        h.ttl = self.ttl;
        h.protocol = PROTO_UDP;
        h.checksum.set(0);
        h.src = self.src.octets();
        h.dst = self.dst.octets();
        opts.copy_from_slice(self.options);
        let sum = !(ones_complement_sum(0, header) as u16);
        header[10..12].copy_from_slice(&sum.to_be_bytes());
        Ok(rest)
    }
}

/// An IPv6 header carrying UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Ipv6Repr {
    /// Differentiated services code point (6 bits).
    pub dscp: u8,
    /// ECN code point.
    pub ecn: Ecn,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source address.
    #[cfg_attr(feature = "defmt", defmt(Debug2Format))]
    pub src: Ipv6Addr,
    /// Destination address.
    #[cfg_attr(feature = "defmt", defmt(Debug2Format))]
    pub dst: Ipv6Addr,
}

impl Ipv6Repr {
    /// Bytes this header occupies on the wire.
    pub const LEN: usize = 40;

    /// Parses an IPv6 header, returning it, the raw header bytes and the payload cut at the
    /// payload length.
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8], &[u8]), Error> {
        let (_, total) = check_ipv6(buf)?;
        Ok((Self::read(buf), &buf[..40], &buf[40..total]))
    }

    /// Reads a header that [`check_ipv6`] accepted (`buf` holds at least 40 bytes).
    pub(crate) fn read(buf: &[u8]) -> Self {
        let vtf = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let tc = (vtf >> 20) as u8;
        let addr = |at: usize| Ipv6Addr::from(core::array::from_fn::<u8, 16, _>(|i| buf[at + i]));
        Ipv6Repr {
            dscp: tc >> 2,
            ecn: Ecn::from_bits(tc),
            flow_label: vtf & 0x000f_ffff,
            hop_limit: buf[7],
            src: addr(8),
            dst: addr(24),
        }
    }

    /// Writes the header for a payload of `payload_len` bytes, returning the bytes after it.
    pub fn emit<'b>(&self, buf: &'b mut [u8], payload_len: usize) -> Result<&'b mut [u8], Error> {
        let len =
            u16::try_from(payload_len).map_err(|_| Error::FieldRange("IPv6 payload length"))?;
        let (h, rest) = split_mut::<Ipv6Header>(buf, Header::Ipv6)?;
        let tc = u32::from((self.dscp << 2) | self.ecn.bits());
        h.ver_tc_flow
            .set((6 << 28) | (tc << 20) | (self.flow_label & 0x000f_ffff));
        h.payload_len.set(len);
        h.next_header = PROTO_UDP;
        h.hop_limit = self.hop_limit;
        h.src = self.src.octets();
        h.dst = self.dst.octets();
        Ok(rest)
    }
}

/// The one's-complement sum of an IPv4 header: the fixed 20 bytes unrolled (the receive path
/// checks one per packet), options through the general loop.
#[inline(always)]
fn header_sum(header: &[u8]) -> u32 {
    let Some((fixed, options)) = header.split_first_chunk::<20>() else {
        return ones_complement_sum(0, header);
    };
    let w = |i: usize| {
        u64::from(u32::from_be_bytes([
            fixed[i],
            fixed[i + 1],
            fixed[i + 2],
            fixed[i + 3],
        ]))
    };
    let wide = w(0) + w(4) + w(8) + w(12) + w(16);
    let acc = ((wide & 0xffff_ffff) + (wide >> 32)) as u32;
    let acc = (acc & 0xffff) + (acc >> 16);
    if options.is_empty() {
        super::fold(acc)
    } else {
        ones_complement_sum(acc, options)
    }
}

/// Validates an IPv4 header carrying UDP and returns its length and the IP total length.
#[inline]
pub(crate) fn check_ipv4(buf: &[u8], verify_checksum: bool) -> Result<(usize, usize), Error> {
    let (h, _) = split::<Ipv4Header>(buf, Header::Ipv4)?;
    let version = h.ver_ihl >> 4;
    if version != 4 {
        return Err(Error::IpVersion {
            expected: 4,
            found: version,
        });
    }
    let ihl = h.ver_ihl & 0x0f;
    if ihl < 5 {
        return Err(Error::Ipv4HeaderLength(ihl));
    }
    let header_len = usize::from(ihl) * 4;
    if buf.len() < header_len {
        return Err(truncated(
            Header::Ipv4Options,
            header_len - 20,
            buf.len() - 20,
        ));
    }
    let total = usize::from(h.total_len.get());
    if total < header_len || total > buf.len() {
        return Err(Error::IpLength {
            claimed: total,
            available: buf.len(),
        });
    }
    if h.flags_frag.get() & 0x3fff != 0 {
        return Err(Error::Ipv4Fragment);
    }
    if h.protocol != PROTO_UDP {
        return Err(Error::NotUdp(h.protocol));
    }
    if verify_checksum {
        let header = &buf[..header_len];
        if header_sum(header) != 0xffff {
            let before = ones_complement_sum(0, &header[..10]);
            let computed = !(ones_complement_sum(before, &header[12..]) as u16);
            return Err(Error::Ipv4Checksum {
                stored: h.checksum.get(),
                computed,
            });
        }
    }
    Ok((header_len, total))
}

/// Validates an IPv6 header carrying UDP and returns its length and the IP packet's length.
#[inline]
pub(crate) fn check_ipv6(buf: &[u8]) -> Result<(usize, usize), Error> {
    let (h, rest) = split::<Ipv6Header>(buf, Header::Ipv6)?;
    let version = (h.ver_tc_flow.get() >> 28) as u8;
    if version != 6 {
        return Err(Error::IpVersion {
            expected: 6,
            found: version,
        });
    }
    let payload_len = usize::from(h.payload_len.get());
    if payload_len > rest.len() {
        return Err(Error::IpLength {
            claimed: payload_len + 40,
            available: buf.len(),
        });
    }
    if h.next_header != PROTO_UDP {
        return Err(Error::NotUdp(h.next_header));
    }
    Ok((40, 40 + payload_len))
}

/// Either IP version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum IpRepr<'a> {
    /// IPv4.
    V4(Ipv4Repr<'a>),
    /// IPv6.
    V6(Ipv6Repr),
}

impl IpRepr<'_> {
    /// Bytes the IP header occupies on the wire.
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(r) => r.header_len(),
            IpRepr::V6(_) => Ipv6Repr::LEN,
        }
    }

    /// The ECN code point.
    pub const fn ecn(&self) -> Ecn {
        match self {
            IpRepr::V4(r) => r.ecn,
            IpRepr::V6(r) => r.ecn,
        }
    }

    /// The UDP pseudo-header sum (RFC 768 / RFC 8200 section 8.1) for `udp_len` bytes.
    pub(crate) fn pseudo_header_sum(&self, udp_len: usize) -> u32 {
        let mut acc = match self {
            IpRepr::V4(r) => {
                let acc = ones_complement_sum(0, &r.src.octets());
                ones_complement_sum(acc, &r.dst.octets())
            }
            IpRepr::V6(r) => {
                let acc = ones_complement_sum(0, &r.src.octets());
                ones_complement_sum(acc, &r.dst.octets())
            }
        };
        acc += u32::from(PROTO_UDP);
        acc += (udp_len as u32) >> 16;
        acc += (udp_len as u32) & 0xffff;
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The IPv4 header of the ConnectX CNP vector.
    const CNP_IP: [u8; 20] = [
        0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11,
        0x01, 0x0a, 0x00, 0x12, 0x01,
    ];

    #[test]
    fn golden_header_and_checksum() {
        let mut pkt = [0u8; 60];
        pkt[..20].copy_from_slice(&CNP_IP);
        let (r, raw, payload) = Ipv4Repr::parse(&pkt, true).unwrap();
        assert_eq!(r.dscp, 0x30);
        assert_eq!(r.ecn, Ecn::Ect0);
        assert!(r.dont_frag);
        assert_eq!(r.src, Ipv4Addr::new(10, 0, 17, 1));
        assert_eq!(raw.len(), 20);
        assert_eq!(payload.len(), 40);
        let mut out = [0u8; 20];
        r.emit(&mut out, 40).unwrap();
        assert_eq!(out, CNP_IP);
    }

    #[test]
    fn bad_checksum_reports_the_right_one() {
        let mut pkt = [0u8; 60];
        pkt[..20].copy_from_slice(&CNP_IP);
        pkt[10] = 0x12;
        assert_eq!(
            Ipv4Repr::parse(&pkt, true).unwrap_err(),
            Error::Ipv4Checksum {
                stored: 0x1261,
                computed: 0x9161
            }
        );
    }

    #[test]
    fn options_honoured_through_ihl() {
        let r = Ipv4Repr {
            dscp: 1,
            ecn: Ecn::Ce,
            ident: 7,
            dont_frag: false,
            ttl: 3,
            src: Ipv4Addr::new(1, 2, 3, 4),
            dst: Ipv4Addr::new(5, 6, 7, 8),
            options: &[1, 1, 1, 0],
        };
        let mut buf = [0u8; 30];
        r.emit(&mut buf, 6).unwrap();
        assert_eq!(buf[0], 0x46);
        let (p, raw, payload) = Ipv4Repr::parse(&buf, true).unwrap();
        assert_eq!(p, r);
        assert_eq!(raw.len(), 24);
        assert_eq!(payload.len(), 6);
    }

    #[test]
    fn length_and_fragment_errors() {
        let mut pkt = [0u8; 40];
        pkt[..20].copy_from_slice(&CNP_IP);
        assert_eq!(
            Ipv4Repr::parse(&pkt, false).unwrap_err(),
            Error::IpLength {
                claimed: 60,
                available: 40
            }
        );
        let mut pkt = [0u8; 60];
        pkt[..20].copy_from_slice(&CNP_IP);
        pkt[6] = 0x20; // MF
        assert_eq!(
            Ipv4Repr::parse(&pkt, false).unwrap_err(),
            Error::Ipv4Fragment
        );
        pkt[6] = 0x40;
        pkt[0] = 0x44;
        assert_eq!(
            Ipv4Repr::parse(&pkt, false).unwrap_err(),
            Error::Ipv4HeaderLength(4)
        );
    }

    #[test]
    fn ipv6_round_trip() {
        let r = Ipv6Repr {
            dscp: 26,
            ecn: Ecn::Ect0,
            flow_label: 0xabcde,
            hop_limit: 64,
            src: Ipv6Addr::LOCALHOST,
            dst: Ipv6Addr::new(0xfe80, 0, 0, 0, 1, 2, 3, 4),
        };
        let mut buf = [0u8; 48];
        r.emit(&mut buf, 8).unwrap();
        let (p, _, payload) = Ipv6Repr::parse(&buf).unwrap();
        assert_eq!(p, r);
        assert_eq!(payload.len(), 8);
    }
}
