//! UDP (RFC 768). RoCEv2 uses destination port 4791; the source port carries ECMP entropy.
//!
//! ```text
//! +-------------------------------+-------------------------------+
//! |          source port          |       destination port        |
//! +-------------------------------+-------------------------------+
//! |            length             |           checksum            |
//! +-------------------------------+-------------------------------+
//! ```
//! RoCEv2 NICs send a zero checksum; a non-zero checksum is verified when asked.

use super::{split, split_mut, Error, Header};
use zerocopy::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The IANA-assigned RoCEv2 UDP destination port.
pub const ROCEV2_PORT: u16 = 4791;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct UdpHeader {
    pub(crate) src_port: U16,
    pub(crate) dst_port: U16,
    pub(crate) length: U16,
    pub(crate) checksum: U16,
}
const _: () = assert!(core::mem::size_of::<UdpHeader>() == 8);

/// A UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct UdpRepr {
    /// Source port (the path's entropy for RoCEv2 and MetaRoCE).
    pub src_port: u16,
    /// Destination port (4791 for RoCEv2).
    pub dst_port: u16,
    /// Whether the datagram carries a checksum (emitting computes it; RoCEv2 NICs send none).
    pub checksum: bool,
}

impl UdpRepr {
    /// Bytes this header occupies on the wire.
    pub const LEN: usize = 8;

    /// Parses the header, returning it, the stored checksum and the datagram payload cut at the
    /// UDP length. `ip_payload` is the IP packet's payload.
    pub fn parse(ip_payload: &[u8]) -> Result<(Self, u16, &[u8]), Error> {
        let (h, rest) = split::<UdpHeader>(ip_payload, Header::Udp)?;
        let claimed = h.length.get();
        let len = usize::from(claimed);
        if len < Self::LEN || len > ip_payload.len() {
            return Err(Error::UdpLength {
                claimed,
                available: ip_payload.len(),
            });
        }
        let stored = h.checksum.get();
        let repr = UdpRepr {
            src_port: h.src_port.get(),
            dst_port: h.dst_port.get(),
            checksum: stored != 0,
        };
        Ok((repr, stored, &rest[..len - Self::LEN]))
    }

    /// Writes the header for `payload_len` bytes with a zero checksum (the frame emitter fills
    /// it in afterwards when [`UdpRepr::checksum`] asks for one).
    pub fn emit<'b>(&self, buf: &'b mut [u8], payload_len: usize) -> Result<&'b mut [u8], Error> {
        let len =
            u16::try_from(payload_len + Self::LEN).map_err(|_| Error::FieldRange("UDP length"))?;
        let (h, rest) = split_mut::<UdpHeader>(buf, Header::Udp)?;
        h.src_port.set(self.src_port);
        h.dst_port.set(self.dst_port);
        h.length.set(len);
        h.checksum.set(0);
        Ok(rest)
    }
}
