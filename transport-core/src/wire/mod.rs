//! Wire formats: Ethernet, 802.1Q, IPv4, IPv6, UDP, the InfiniBand transport headers of RoCEv2
//! (IBTA Annex A17) and this project's MetaRoCE headers (`docs/PROTOCOL.md`).
//!
//! Each header has a private `#[repr(C)]` zerocopy layout whose size is asserted at compile time,
//! and a public `Repr` with `parse` (never panics; returns the header and the bytes after it),
//! `LEN` or `header_len`, and `emit`. [`frame::parse`] walks a whole frame and
//! [`frame::FrameRepr::emit`] writes one, lengths, checksums and ICRC included.
//!
//! ```text
//! Ethernet | [802.1Q] | IPv4 or IPv6 | UDP (dst 4791) | BTH | extension headers | payload | pad | ICRC
//! ```

mod bth;
mod error;
mod ethernet;
mod ext;
pub mod frame;
mod ip;
pub mod metaroce;
mod udp;

pub use bth::{BthRepr, Opcode, Psn, Qpn, Transport};
pub use error::{Error, Header};
pub use ethernet::{EtherType, EthernetRepr, MacAddr, VlanTag};
pub use ext::{
    AckSyndrome, AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, ExtensionFields, Extensions,
    Layout,
    NakCode, RethRepr,
};
pub use frame::{parse, parse_with, FrameRepr, IcrcCheck, ParseOptions, Parsed};
pub use ip::{Ecn, IpRepr, Ipv4Repr, Ipv6Repr};
pub use udp::{UdpRepr, ROCEV2_PORT};

use error::truncated;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Splits a fixed-size header off the front of `buf`, or names the truncated header.
#[inline(always)]
fn split<H>(buf: &[u8], header: Header) -> Result<(&H, &[u8]), Error>
where
    H: FromBytes + KnownLayout + Immutable + Unaligned,
{
    H::ref_from_prefix(buf).map_err(|_| truncated(header, core::mem::size_of::<H>(), buf.len()))
}

/// Splits a fixed-size header off the front of a mutable buffer, for emitting.
#[inline(always)]
fn split_mut<H>(buf: &mut [u8], header: Header) -> Result<(&mut H, &mut [u8]), Error>
where
    H: FromBytes + IntoBytes + KnownLayout + Immutable + Unaligned,
{
    let available = buf.len();
    H::mut_from_prefix(buf).map_err(|_| truncated(header, core::mem::size_of::<H>(), available))
}

/// The Internet checksum (RFC 1071) folded to 16 bits, before the final complement.
#[inline]
pub(crate) fn ones_complement_sum(mut acc: u32, bytes: &[u8]) -> u32 {
    let mut chunks = bytes.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    fold(acc)
}

/// Folds a 32-bit one's-complement accumulator to 16 bits.
#[inline]
pub(crate) fn fold(mut acc: u32) -> u32 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}
