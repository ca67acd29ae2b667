//! The receive side of one path: which path sequence numbers have arrived, as a cumulative point
//! and the 256-bit bitvector above it that the ACK carries.

use super::seq::PathSeq;
use crate::wire::metaroce::SACK_BITS;

/// What the arrival of one sequence number means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Arrival {
    /// First arrival, in order (it advanced the cumulative point).
    InOrder,
    /// First arrival above a gap: something earlier on this path is missing.
    AboveGap,
    /// It had arrived before.
    Duplicate,
    /// Far ahead: the window slid forward to it, giving up on the oldest missing numbers (the
    /// sender, whose window on a path is below 256 packets, has already resolved them).
    Slid,
}

/// Arrivals on one path: everything below `cum` and the set bits above it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SackBitmap {
    cum: PathSeq,
    /// Bit `i` (word `i / 64`, bit `i % 64`) set when `cum + 1 + i` has arrived.
    bits: [u64; SACK_BITS / 64],
}

impl SackBitmap {
    /// A bitmap expecting `first` next.
    pub const fn new(first: PathSeq) -> Self {
        SackBitmap {
            cum: first,
            bits: [0; SACK_BITS / 64],
        }
    }

    /// The first sequence number not yet arrived.
    pub const fn cumulative(&self) -> PathSeq {
        self.cum
    }

    /// Whether `seq` has arrived.
    pub fn contains(&self, seq: PathSeq) -> bool {
        let d = seq.diff(self.cum);
        if d < 0 {
            return true;
        }
        if d == 0 || d > SACK_BITS as i32 {
            return false;
        }
        let i = (d - 1) as usize;
        self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    /// Whether anything above the cumulative point has arrived (there is a gap).
    pub fn has_gap(&self) -> bool {
        self.bits.iter().any(|w| *w != 0)
    }

    /// Records an arrival.
    pub fn insert(&mut self, seq: PathSeq) -> Arrival {
        let d = seq.diff(self.cum);
        if d < 0 {
            return Arrival::Duplicate;
        }
        if d > SACK_BITS as i32 {
            if d > 2 * SACK_BITS as i32 {
                // The whole window is passed: nothing in it survives.
                self.bits = [0; SACK_BITS / 64];
                self.cum = seq.add((SACK_BITS as u32).wrapping_neg());
            }
            // Give up on missing numbers one at a time (each step also absorbs whatever had
            // arrived just above) until `seq` fits.
            while seq.diff(self.cum) > SACK_BITS as i32 {
                self.advance();
            }
            // Absorbing arrivals may have brought the cumulative point up to `seq` itself.
            match seq.diff(self.cum) {
                0 => self.advance(),
                d2 if d2 > 0 => {
                    let i = (d2 - 1) as usize;
                    self.bits[i / 64] |= 1 << (i % 64);
                }
                _ => {}
            }
            return Arrival::Slid;
        }
        if d == 0 {
            self.advance();
            return Arrival::InOrder;
        }
        let i = (d - 1) as usize;
        let (w, b) = (i / 64, i % 64);
        if self.bits[w] & (1 << b) != 0 {
            return Arrival::Duplicate;
        }
        self.bits[w] |= 1 << b;
        Arrival::AboveGap
    }

    /// Moves the cumulative point past its number (arrived or given up) and past whatever had
    /// arrived right above it.
    fn advance(&mut self) {
        loop {
            let next_present = self.bits[0] & 1 != 0;
            self.shift(1);
            self.cum = self.cum.add(1);
            if !next_present {
                return;
            }
        }
    }

    /// Shifts the bitvector down by `n` bits (0 < n < 64).
    fn shift(&mut self, n: u32) {
        for w in 0..self.bits.len() {
            let next = self.bits.get(w + 1).copied().unwrap_or(0);
            self.bits[w] = (self.bits[w] >> n) | (next << (64 - n));
        }
    }

    /// The bitvector as the ACK header carries it.
    pub fn to_wire(&self) -> [u8; SACK_BITS / 8] {
        let mut out = [0u8; SACK_BITS / 8];
        for (i, w) in self.bits.iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_gap_fill_and_duplicates() {
        let mut s = SackBitmap::new(PathSeq(10));
        assert_eq!(s.insert(PathSeq(10)), Arrival::InOrder);
        assert_eq!(s.insert(PathSeq(12)), Arrival::AboveGap);
        assert_eq!(s.insert(PathSeq(13)), Arrival::AboveGap);
        assert_eq!(s.cumulative(), PathSeq(11));
        assert!(s.has_gap());
        let wire = s.to_wire();
        assert_eq!(wire[0], 0b11); // 12 and 13 are cum+1 and cum+2
        assert_eq!(s.insert(PathSeq(12)), Arrival::Duplicate);
        assert_eq!(s.insert(PathSeq(11)), Arrival::InOrder);
        assert_eq!(s.cumulative(), PathSeq(14));
        assert!(!s.has_gap());
        assert_eq!(s.insert(PathSeq(5)), Arrival::Duplicate);
        assert_eq!(s.insert(PathSeq(14 + 256)), Arrival::AboveGap);
        assert!(s.contains(PathSeq(14 + 256)));
        // Far ahead: the window slides, giving up on 14 and 15.
        assert_eq!(s.insert(PathSeq(14 + 258)), Arrival::Slid);
        assert!(s.contains(PathSeq(14 + 258)));
        assert_eq!(s.cumulative(), PathSeq(16));
        assert!(s.contains(PathSeq(14 + 256)));
        assert_eq!(s.insert(PathSeq(10_000)), Arrival::Slid);
        assert_eq!(s.cumulative(), PathSeq(10_000 - 256));
        assert!(s.contains(PathSeq(10_000)) && !s.contains(PathSeq(9_999)));
    }

    #[test]
    fn sliding_onto_a_full_window() {
        // 256 arrivals above a hole, then one more: giving up the hole absorbs them all.
        let mut s = SackBitmap::new(PathSeq(0));
        for seq in 1..=256 {
            assert_eq!(s.insert(PathSeq(seq)), Arrival::AboveGap);
        }
        assert_eq!(s.insert(PathSeq(257)), Arrival::Slid);
        assert_eq!(s.cumulative(), PathSeq(258));
        assert!(!s.has_gap());
    }

    #[test]
    fn wraps() {
        let mut s = SackBitmap::new(PathSeq(u32::MAX));
        assert_eq!(s.insert(PathSeq(0)), Arrival::AboveGap);
        assert_eq!(s.insert(PathSeq(u32::MAX)), Arrival::InOrder);
        assert_eq!(s.cumulative(), PathSeq(1));
    }
}
