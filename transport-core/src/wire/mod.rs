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
mod datagram;
mod error;
mod ethernet;
mod ext;
pub mod frame;
mod ip;
mod layout;
pub mod metaroce;
mod options;
mod udp;
mod view;

pub use bth::{BthRepr, Opcode, Psn, Qpn, Transport};
pub use datagram::{pad_for, seal, Datagram, DatagramHeaders};
pub use error::{Error, Header};
pub use ethernet::{EtherType, EthernetRepr, MacAddr, VlanTag};
pub use ext::{
    AckSyndrome, AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, ExtensionFields, Extensions,
    NakCode, RethRepr,
};
pub use frame::{parse, parse_with, FrameRepr, Parsed};
pub use ip::{Ecn, IpRepr, Ipv4Repr, Ipv6Repr};
pub use layout::Layout;
pub use options::{IcrcCheck, ParseOptions};
pub use udp::{UdpRepr, ROCEV2_PORT};
pub use view::FrameView;

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

/// The Internet checksum (RFC 1071) of `bytes` added to `acc`, folded to 16 bits, before the
/// final complement. Sums 32-bit big-endian words into a 64-bit accumulator (RFC 1071 section 2's
/// "deferred carries"), which is exact because end-around carry makes the sum width-independent.
#[inline]
pub(crate) fn ones_complement_sum(acc: u32, bytes: &[u8]) -> u32 {
    let mut wide = u64::from(acc);
    let mut words = bytes.chunks_exact(4);
    for w in &mut words {
        wide += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let mut tail = words.remainder();
    if tail.len() >= 2 {
        wide += u64::from(u16::from_be_bytes([tail[0], tail[1]]));
        tail = &tail[2..];
    }
    if let [last] = tail {
        wide += u64::from(*last) << 8;
    }
    // Fold 64 -> 32 -> 16 bits with end-around carry.
    let mut x = (wide & 0xffff_ffff) + (wide >> 32);
    x = (x & 0xffff_ffff) + (x >> 32);
    fold(x as u32)
}

/// Folds a 32-bit one's-complement accumulator to 16 bits.
#[inline]
pub(crate) fn fold(mut acc: u32) -> u32 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

#[cfg(test)]
mod checksum_tests {
    use super::*;

    /// The textbook 16-bit loop, as the reference.
    fn reference(mut acc: u32, bytes: &[u8]) -> u32 {
        for c in bytes.chunks(2) {
            acc += u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0));
            acc = (acc & 0xffff) + (acc >> 16);
        }
        fold(acc)
    }

    #[test]
    fn wide_sum_matches_the_16_bit_loop() {
        let data: std::vec::Vec<u8> = (0..300u32).map(|i| (i * 97 + 13) as u8).collect();
        for len in 0..data.len() {
            for acc in [0, 1, 0xffff, 0x1_2345] {
                assert_eq!(
                    ones_complement_sum(acc, &data[..len]),
                    reference(acc, &data[..len])
                );
            }
        }
        assert_eq!(ones_complement_sum(0, &[0xff; 64]), 0xffff);
    }
}
