//! The MetaRoCE ACK header: one path's cumulative sequence, a 256-bit SACK bitvector, the echoed
//! timestamp, ECN echo and the receiver's fair-share rate hint.

use super::{check_version, version_byte};
use crate::wire::layout;
use crate::wire::{split, split_mut, Error, Header, Psn};
use zerocopy::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Bits in the SACK bitvector.
pub const SACK_BITS: usize = 256;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AckHeader {
    ver_flags: u8,
    path_id: u8,
    ce_count: U16,
    cum_seq: U32,
    ts_echo: U32,
    ack_delay: U32,
    rate_hint: U32,
    sack: [u8; SACK_BITS / 8],
}
const _: () = assert!(core::mem::size_of::<AckHeader>() == 52);

const FLAG_ECE: u8 = 0x1;
const FLAG_REFUSALS: u8 = 0x2;

/// A per-path acknowledgement.
///
/// Every path sequence number below `cum_seq` has arrived. Bit `i` of `sack` (byte `i / 8`, bit
/// `i % 8` counted from the least significant) says whether `cum_seq + 1 + i` has arrived; `cum_seq`
/// itself is by definition missing. The BTH PSN of an ACK carries the receiver's connection-level
/// cumulative PSN: every data packet with a lower PSN has arrived on some path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MrAckRepr {
    /// ECN echo: a packet acknowledged here arrived with CE.
    pub ece: bool,
    /// Refusals outstanding: the receiver refused packets whose NACKs the sender has not yet
    /// confirmed, so the cumulative PSN may cover refused packets and must not complete
    /// anything.
    pub refusals: bool,
    /// The path being acknowledged.
    pub path_id: u8,
    /// CE-marked packets on this path since the previous ACK (saturating).
    pub ce_count: u16,
    /// The first path sequence number not yet received.
    pub cum_seq: u32,
    /// The timestamp of the packet that triggered this ACK, echoed.
    pub ts_echo: u32,
    /// Nanoseconds the receiver held that packet before acknowledging it.
    pub ack_delay: u32,
    /// The receiver's fair share of its inbound bandwidth for this sender, in Mb/s; 0 for none.
    pub rate_hint: u32,
    /// The selective-acknowledgement bitvector above `cum_seq`.
    pub sack: [u8; SACK_BITS / 8],
}

impl MrAckRepr {
    /// Bytes this header occupies on the wire.
    pub const LEN: usize = layout::MR_ACK_LEN;

    /// Whether path sequence `cum_seq + 1 + i` is acknowledged selectively (false beyond 255).
    pub fn sacked(&self, i: usize) -> bool {
        self.sack
            .get(i / 8)
            .is_some_and(|b| b & (1 << (i % 8)) != 0)
    }

    /// The highest `i` for which [`MrAckRepr::sacked`] holds: the furthest transmission the ACK
    /// reports as arrived is `cum_seq + 1 + i`.
    pub fn highest_sacked(&self) -> Option<usize> {
        // Eight bytes at a time from the top (bit k of byte j is bit 8j + k): an ACK without
        // gaps, the usual one, is four zero tests.
        self.sack
            .chunks_exact(8)
            .enumerate()
            .rev()
            .find_map(|(w, c)| {
                let v = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                (v != 0).then(|| w * 64 + 63 - v.leading_zeros() as usize)
            })
    }

    /// Parses the header, returning it and the bytes after it.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), Error> {
        let (h, rest) = split::<AckHeader>(buf, Header::MrAck)?;
        let flags = check_version(h.ver_flags, Header::MrAck)?;
        let repr = MrAckRepr {
            ece: flags & FLAG_ECE != 0,
            refusals: flags & FLAG_REFUSALS != 0,
            path_id: h.path_id,
            ce_count: h.ce_count.get(),
            cum_seq: h.cum_seq.get(),
            ts_echo: h.ts_echo.get(),
            ack_delay: h.ack_delay.get(),
            rate_hint: h.rate_hint.get(),
            sack: h.sack,
        };
        Ok((repr, rest))
    }

    /// Writes the header, returning the bytes after it.
    #[inline]
    pub fn emit(self, buf: &mut [u8]) -> Result<&mut [u8], Error> {
        let (h, rest) = split_mut::<AckHeader>(buf, Header::MrAck)?;
        let flags =
            if self.ece { FLAG_ECE } else { 0 } | if self.refusals { FLAG_REFUSALS } else { 0 };
        h.ver_flags = version_byte(flags);
        h.path_id = self.path_id;
        h.ce_count.set(self.ce_count);
        h.cum_seq.set(self.cum_seq);
        h.ts_echo.set(self.ts_echo);
        h.ack_delay.set(self.ack_delay);
        h.rate_hint.set(self.rate_hint);
        h.sack = self.sack;
        Ok(rest)
    }
}

/// An acknowledgement carried by a data packet going the other way (flag `A` of its data header):
/// the connection-level cumulative PSN that a stand-alone ACK carries in its BTH, then the ACK
/// header. It opens the packet's body, before the payload; the ICRC covers it as any other byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PiggyAck {
    /// The receiver's connection-level cumulative PSN (24 bits).
    pub cum_psn: Psn,
    /// The path acknowledgement.
    pub ack: MrAckRepr,
}

impl PiggyAck {
    /// Bytes it occupies: the PSN in a 32-bit field (high byte reserved, zero), then the ACK.
    pub const LEN: usize = 4 + MrAckRepr::LEN;

    /// Parses it from the start of a packet body, returning it and the bytes after it.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), Error> {
        let (psn, rest) = split::<U32>(buf, Header::MrAck)?;
        let (ack, rest) = MrAckRepr::parse(rest)?;
        Ok((
            PiggyAck {
                cum_psn: Psn::new(psn.get() & 0x00ff_ffff),
                ack,
            },
            rest,
        ))
    }

    /// Writes it, returning the bytes after it.
    #[inline]
    pub fn emit(self, buf: &mut [u8]) -> Result<&mut [u8], Error> {
        let (psn, rest) = split_mut::<U32>(buf, Header::MrAck)?;
        psn.set(self.cum_psn.get());
        self.ack.emit(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_sacked_bit_matches_a_bit_by_bit_scan() {
        let mut r = MrAckRepr {
            ece: false,
            refusals: false,
            path_id: 0,
            ce_count: 0,
            cum_seq: 0,
            ts_echo: 0,
            ack_delay: 0,
            rate_hint: 0,
            sack: [0; 32],
        };
        let slow = |r: &MrAckRepr| (0..256).rev().find(|&b| r.sacked(b));
        assert_eq!(r.highest_sacked(), None);
        for b in 0..256 {
            r.sack = [0; 32];
            r.sack[b / 8] |= 1 << (b % 8);
            r.sack[0] |= 1; // a lower bit set too
            assert_eq!(r.highest_sacked(), Some(b), "bit {b}");
            assert_eq!(r.highest_sacked(), slow(&r));
        }
    }

    #[test]
    fn golden_ack() {
        let mut bytes = [0u8; 52];
        bytes[..20].copy_from_slice(&[
            0x11, 0x03, 0x00, 0x05, 0x00, 0x00, 0x00, 0x64, 0xaa, 0xbb, 0xcc, 0xdd, 0x00, 0x00,
            0x03, 0xe8, 0x00, 0x00, 0x61, 0xa8,
        ]);
        bytes[20] = 0b0000_0101;
        bytes[51] = 0x80;
        let (r, rest) = MrAckRepr::parse(&bytes).unwrap();
        assert!(rest.is_empty());
        assert!(r.ece && !r.refusals);
        assert_eq!((r.path_id, r.ce_count, r.cum_seq), (3, 5, 100));
        assert_eq!(
            (r.ts_echo, r.ack_delay, r.rate_hint),
            (0xaabbccdd, 1000, 25000)
        );
        assert!(r.sacked(0) && !r.sacked(1) && r.sacked(2) && r.sacked(255));
        assert!(!r.sacked(256));
        assert_eq!(r.highest_sacked(), Some(255));
        let mut out = [0u8; 52];
        r.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn refusals_flag_is_bit_1_of_the_first_byte() {
        let mut bytes = [0u8; 52];
        for (first, ece, refusals) in [
            (0x12, false, true),
            (0x13, true, true),
            (0x10, false, false),
        ] {
            bytes[0] = first;
            let (r, _) = MrAckRepr::parse(&bytes).unwrap();
            assert_eq!((r.ece, r.refusals), (ece, refusals), "{first:#x}");
            let mut out = [0u8; 52];
            r.emit(&mut out).unwrap();
            assert_eq!(out, bytes);
        }
    }
}
