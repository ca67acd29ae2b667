//! Whole frames: [`parse`] walks Ethernet, IP, UDP, BTH, the extension headers, payload, pad and
//! ICRC of any byte string without panicking; [`FrameRepr::emit`] writes a complete frame into a
//! caller's buffer with every length, the IPv4 checksum, the optional UDP checksum and the ICRC.
//! `parse(emit(x)) == x` for every valid `x`.
//!
//! RoCEv2 and MetaRoCE frames go through the same entry point: they differ only in the BTH opcode,
//! which selects the extension headers ([`Opcode::layout`](super::Opcode::layout)).

use super::ip::IpRepr;
pub use super::options::{IcrcCheck, ParseOptions};
use super::view::FrameView;
use super::{
    fold, ones_complement_sum, BthRepr, Error, EtherType, EthernetRepr, Extensions, UdpRepr,
};
use crate::icrc;

/// A RoCEv2 or MetaRoCE frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FrameRepr<'a> {
    /// Ethernet header; its EtherType must name the IP version of `ip`.
    pub eth: EthernetRepr,
    /// IP header.
    pub ip: IpRepr<'a>,
    /// UDP header.
    pub udp: UdpRepr,
    /// Base transport header; its pad count says how many zero bytes follow the payload.
    pub bth: BthRepr,
    /// Extension headers: exactly those the opcode carries.
    pub ext: Extensions,
    /// Payload (without the pad).
    pub payload: &'a [u8],
}

/// A parsed frame with what was learned about its ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Parsed<'a> {
    /// The frame.
    pub repr: FrameRepr<'a>,
    /// The ICRC the frame carries.
    pub icrc: u32,
    /// The ICRC computed over the frame, unless [`IcrcCheck::Skip`] was asked for.
    pub icrc_computed: Option<u32>,
    /// Bytes after the IP packet (Ethernet padding), not covered by anything.
    pub trailer_len: usize,
}

impl Parsed<'_> {
    /// Whether the stored ICRC is the computed one (`None` when it was not computed).
    pub fn icrc_ok(&self) -> Option<bool> {
        self.icrc_computed.map(|c| c == self.icrc)
    }
}

/// Parses a frame with every check on: IPv4 checksum, non-zero UDP checksums and the ICRC.
pub fn parse(frame: &[u8]) -> Result<Parsed<'_>, Error> {
    parse_with(frame, &ParseOptions::default())
}

/// Parses a frame with the given checks. Never panics, whatever the bytes.
pub fn parse_with<'a>(frame: &'a [u8], opts: &ParseOptions) -> Result<Parsed<'a>, Error> {
    let view = FrameView::new_checked(frame, opts)?;
    Ok(view.to_parsed())
}

impl<'a> FrameView<'a> {
    /// Every header of the frame as a representation.
    pub fn to_parsed(&self) -> Parsed<'a> {
        let repr = FrameRepr {
            eth: self.ethernet(),
            ip: self.ip(),
            udp: self.udp(),
            bth: self.bth(),
            ext: self.extensions(),
            payload: self.payload(),
        };
        Parsed {
            repr,
            icrc: self.icrc(),
            icrc_computed: self.icrc_computed(),
            trailer_len: self.trailer_len(),
        }
    }
}

/// The UDP checksum a datagram should carry, computed with its checksum field taken as zero
/// (`udp_bytes`: the UDP header and payload).
pub fn udp_checksum(ip: &IpRepr<'_>, udp_bytes: &[u8]) -> u16 {
    // (A buffer shorter than a header sums what it has: no panic on any input.)
    let head = udp_bytes.get(..6).unwrap_or(udp_bytes);
    let body = udp_bytes.get(8..).unwrap_or(&[]);
    let acc = ones_complement_sum(ip.pseudo_header_sum(udp_bytes.len()), head);
    let acc = ones_complement_sum(acc, body);
    match !(fold(acc) as u16) {
        0 => 0xffff,
        c => c,
    }
}

impl FrameRepr<'_> {
    /// Bytes from the BTH to the end of the ICRC.
    pub fn transport_len(&self) -> usize {
        BthRepr::LEN + self.ext.len() + self.payload.len() + usize::from(self.bth.pad_count) + 4
    }

    /// Bytes the whole frame occupies (no Ethernet padding, no FCS).
    pub fn buffer_len(&self) -> usize {
        self.eth.header_len() + self.ip.header_len() + UdpRepr::LEN + self.transport_len()
    }

    /// Writes the frame to the front of `buf` and returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let expected_type = match self.ip {
            IpRepr::V4(_) => EtherType::IPV4,
            IpRepr::V6(_) => EtherType::IPV6,
        };
        if self.eth.ethertype != expected_type {
            return Err(Error::FieldRange("EtherType (it must name the IP version)"));
        }
        let total = self.buffer_len();
        let Some(frame) = buf.get_mut(..total) else {
            return Err(Error::BufferTooSmall {
                needed: total,
                available: buf.len(),
            });
        };
        let udp_len = UdpRepr::LEN + self.transport_len();
        let rest = self.eth.emit(frame)?;
        let rest = match &self.ip {
            IpRepr::V4(r) => r.emit(rest, udp_len)?,
            IpRepr::V6(r) => r.emit(rest, udp_len)?,
        };
        let rest = self.udp.emit(rest, udp_len - UdpRepr::LEN)?;
        let rest = self.bth.emit(rest)?;
        let rest = self.ext.emit(self.bth.opcode.layout(), rest)?;
        let (payload, rest) = rest.split_at_mut(self.payload.len());
        payload.copy_from_slice(self.payload);
        let (pad, _icrc) = rest.split_at_mut(usize::from(self.bth.pad_count));
        pad.fill(0);

        let ip_start = self.eth.header_len();
        let udp_start = ip_start + self.ip.header_len();
        let bth_start = udp_start + UdpRepr::LEN;
        let icrc_start = total - 4;
        let value = icrc::compute(
            &frame[ip_start..udp_start],
            &frame[udp_start..bth_start],
            &frame[bth_start..icrc_start],
        );
        frame[icrc_start..].copy_from_slice(&value.to_le_bytes());
        if self.udp.checksum {
            let c = udp_checksum(&self.ip, &frame[udp_start..]);
            frame[udp_start + 6..udp_start + 8].copy_from_slice(&c.to_be_bytes());
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parsed_frames_stay_small() {
        // The hot path moves these by value; a fat `Extensions` (one Option per header, 264 bytes)
        // once made parsing three times slower.
        assert!(core::mem::size_of::<super::Extensions>() <= 64);
        assert!(core::mem::size_of::<super::Parsed<'_>>() <= 192);
    }
}
