//! Serial-number arithmetic (RFC 1982) for the 24-bit BTH PSN and the 32-bit path sequence.
//!
//! Two numbers compare by the signed distance between them, so order holds across the wrap as
//! long as they are less than half the space apart; every window in the connection is far smaller.

use crate::wire::Psn;

/// A 32-bit path sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PathSeq(pub u32);

impl PathSeq {
    /// `self + n`, wrapping.
    pub const fn add(self, n: u32) -> Self {
        PathSeq(self.0.wrapping_add(n))
    }

    /// The signed distance `self - other`.
    pub const fn diff(self, other: PathSeq) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }

    /// Whether `self` comes before `other`.
    pub const fn before(self, other: PathSeq) -> bool {
        self.diff(other) < 0
    }
}

/// The signed distance `a - b` between two 24-bit PSNs.
pub const fn psn_diff(a: Psn, b: Psn) -> i32 {
    // Shift the 24-bit difference into the top of an i32 and back to sign-extend it.
    ((a.get().wrapping_sub(b.get()) << 8) as i32) >> 8
}

/// Whether PSN `a` comes before `b`.
pub const fn psn_before(a: Psn, b: Psn) -> bool {
    psn_diff(a, b) < 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_order_across_the_wrap() {
        let top = Psn::new(0xff_fffe);
        let wrapped = top.wrapping_add(5);
        assert_eq!(wrapped.get(), 3);
        assert_eq!(psn_diff(wrapped, top), 5);
        assert_eq!(psn_diff(top, wrapped), -5);
        assert!(psn_before(top, wrapped));
        assert!(!psn_before(wrapped, top));
        assert_eq!(psn_diff(Psn::new(0x80_0000), Psn::new(0)), -0x80_0000);
    }

    #[test]
    fn path_seq_order_across_the_wrap() {
        let a = PathSeq(u32::MAX - 1);
        let b = a.add(3);
        assert_eq!(b.0, 1);
        assert_eq!(b.diff(a), 3);
        assert!(a.before(b) && !b.before(a));
    }
}
