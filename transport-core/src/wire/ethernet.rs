//! Ethernet II (IEEE 802.3 clause 3.2.6) with an optional IEEE 802.1Q tag.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                  destination MAC (6 bytes)                    |
//! +                               +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                               |                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+      source MAC (6 bytes)     +
//! |                                                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |   EtherType (0x8100 if tagged)| PCP |D|     VLAN id (802.1Q)  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |  inner EtherType (if tagged)  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//! The PCP of the tag is where PFC priorities live.

use super::{split, split_mut, Error, Header};
use core::fmt;
use zerocopy::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct EthHeader {
    dst: [u8; 6],
    src: [u8; 6],
    ethertype: U16,
}
const _: () = assert!(core::mem::size_of::<EthHeader>() == 14);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct TagHeader {
    tci: U16,
    ethertype: U16,
}
const _: () = assert!(core::mem::size_of::<TagHeader>() == 4);

/// EtherType values this crate recognises.
pub struct EtherType;

impl EtherType {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
    /// IEEE 802.1Q customer tag.
    pub const VLAN: u16 = 0x8100;
}

/// A 48-bit MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// An 802.1Q tag: priority code point, drop eligible indicator and VLAN id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct VlanTag {
    /// Priority code point, 0-7 (the PFC priority).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier, 0-4095.
    pub vid: u16,
}

impl VlanTag {
    fn tci(self) -> u16 {
        (u16::from(self.pcp & 0x7) << 13) | (u16::from(self.dei) << 12) | (self.vid & 0x0fff)
    }

    pub(crate) fn from_tci(tci: u16) -> Self {
        VlanTag {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }
}

/// An Ethernet II header with an optional 802.1Q tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct EthernetRepr {
    /// Destination MAC.
    pub dst: MacAddr,
    /// Source MAC.
    pub src: MacAddr,
    /// The 802.1Q tag, if the frame is tagged.
    pub vlan: Option<VlanTag>,
    /// The EtherType of the payload (after the tag, if any).
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Parses the header (and tag), returning it and the bytes after it.
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), Error> {
        let (h, rest) = split::<EthHeader>(buf, Header::Ethernet)?;
        let mut repr = EthernetRepr {
            dst: MacAddr(h.dst),
            src: MacAddr(h.src),
            vlan: None,
            ethertype: h.ethertype.get(),
        };
        if repr.ethertype != EtherType::VLAN {
            return Ok((repr, rest));
        }
        let (t, rest) = split::<TagHeader>(rest, Header::Vlan)?;
        repr.vlan = Some(VlanTag::from_tci(t.tci.get()));
        repr.ethertype = t.ethertype.get();
        Ok((repr, rest))
    }

    /// Bytes this header occupies on the wire.
    pub const fn header_len(&self) -> usize {
        if self.vlan.is_some() {
            18
        } else {
            14
        }
    }

    /// Writes the header to the front of `buf`, returning the bytes after it.
    ///
    /// An untagged header whose EtherType is the 802.1Q TPID (0x8100) is refused: a receiver
    /// would read the bytes after it as a tag.
    pub fn emit<'b>(&self, buf: &'b mut [u8]) -> Result<&'b mut [u8], Error> {
        if self.vlan.is_none() && self.ethertype == EtherType::VLAN {
            return Err(Error::FieldRange(
                "an untagged EtherType of 0x8100 (the 802.1Q TPID)",
            ));
        }
        let (h, rest) = split_mut::<EthHeader>(buf, Header::Ethernet)?;
        h.dst = self.dst.0;
        h.src = self.src.0;
        match self.vlan {
            None => {
                h.ethertype.set(self.ethertype);
                Ok(rest)
            }
            Some(tag) => {
                h.ethertype.set(EtherType::VLAN);
                let (t, rest) = split_mut::<TagHeader>(rest, Header::Vlan)?;
                t.tci.set(tag.tci());
                t.ethertype.set(self.ethertype);
                Ok(rest)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_untagged_tpid_is_refused_a_tagged_one_is_not() {
        let mut buf = [0u8; 18];
        let mut eth = EthernetRepr {
            dst: MacAddr([2; 6]),
            src: MacAddr([4; 6]),
            vlan: None,
            ethertype: EtherType::VLAN,
        };
        assert!(matches!(eth.emit(&mut buf), Err(Error::FieldRange(_))));
        eth.vlan = Some(VlanTag {
            pcp: 3,
            dei: false,
            vid: 7,
        });
        eth.emit(&mut buf).unwrap();
        assert_eq!(EthernetRepr::parse(&buf).unwrap().0, eth);
    }

    #[test]
    fn tagged_golden() {
        // dst 10:e2:d5:00:00:00, src b8:59:9f:07:7e:2a, VLAN 1 PCP 0, IPv4 (a ConnectX frame).
        let bytes = [
            0x10, 0xe2, 0xd5, 0, 0, 0, 0xb8, 0x59, 0x9f, 0x07, 0x7e, 0x2a, 0x81, 0x00, 0x00, 0x01,
            0x08, 0x00, 0xaa,
        ];
        let (r, rest) = EthernetRepr::parse(&bytes).unwrap();
        assert_eq!(
            r.vlan,
            Some(VlanTag {
                pcp: 0,
                dei: false,
                vid: 1
            })
        );
        assert_eq!(r.ethertype, EtherType::IPV4);
        assert_eq!(rest, &[0xaa]);
        let mut out = [0u8; 18];
        r.emit(&mut out).unwrap();
        assert_eq!(out[..], bytes[..18]);
    }

    #[test]
    fn pcp_and_dei_bits() {
        let tag = VlanTag {
            pcp: 5,
            dei: true,
            vid: 0xabc,
        };
        assert_eq!(tag.tci(), 0xbabc);
        assert_eq!(VlanTag::from_tci(0xbabc), tag);
    }

    #[test]
    fn truncated_tag_is_named() {
        let bytes = [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x81, 0x00, 0x00];
        assert_eq!(
            EthernetRepr::parse(&bytes).unwrap_err(),
            Error::Truncated {
                header: Header::Vlan,
                needed: 4,
                available: 1
            }
        );
    }
}
