//! Time as the core sees it: an [`Instant`] is a count of nanoseconds from an epoch the runner
//! chooses (a monotonic clock on a host, the simulated clock in `netsim`, a cycle counter on an
//! FPGA). The core never reads a clock; every entry point that needs the time takes an `Instant`.
//! Spans of time are plain `u64` nanoseconds, named `_ns`.

use core::ops::{Add, AddAssign};

/// A point in time, in nanoseconds from the runner's epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Instant(u64);

impl Instant {
    /// The runner's epoch.
    pub const ZERO: Instant = Instant(0);
    /// The last representable instant (584 years after the epoch): "never".
    pub const MAX: Instant = Instant(u64::MAX);

    /// The instant `ns` nanoseconds after the epoch.
    #[inline]
    pub const fn from_nanos(ns: u64) -> Self {
        Instant(ns)
    }

    /// Nanoseconds since the epoch.
    #[inline]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Nanoseconds from `earlier` to `self`; 0 if `earlier` is later (a runner's clock that
    /// stepped back, or a sample from the future, never yields a huge span).
    #[inline]
    pub const fn since(self, earlier: Instant) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// The low 32 bits of the nanosecond count: what a MetaRoCE header's timestamp carries (it
    /// wraps every 4.3 s; an echo is subtracted with wrapping arithmetic).
    #[inline]
    pub const fn wire_timestamp(self) -> u32 {
        self.0 as u32
    }

    /// The timestamp a data packet carries: [`Instant::wire_timestamp`] with its lowest bit
    /// clear. A probe's ([`Instant::probe_timestamp`]) has it set, so that an ACK echoing a data
    /// packet is never taken for the answer to a probe that left in the same nanosecond (a
    /// runner stamps a whole round with one clock reading).
    #[inline]
    pub const fn data_timestamp(self) -> u32 {
        self.wire_timestamp() & !1
    }

    /// The timestamp a probe carries: [`Instant::wire_timestamp`] with its lowest bit set (never
    /// a data packet's, never 0).
    #[inline]
    pub const fn probe_timestamp(self) -> u32 {
        self.wire_timestamp() | 1
    }

    /// `ns` nanoseconds after `self`, saturating at [`Instant::MAX`].
    #[inline]
    pub const fn after(self, ns: u64) -> Instant {
        Instant(self.0.saturating_add(ns))
    }

    /// `ns` nanoseconds before `self`, saturating at the epoch.
    #[inline]
    pub const fn before(self, ns: u64) -> Instant {
        Instant(self.0.saturating_sub(ns))
    }
}

/// `instant + ns`: saturating, as [`Instant::after`].
impl Add<u64> for Instant {
    type Output = Instant;
    #[inline]
    fn add(self, ns: u64) -> Instant {
        self.after(ns)
    }
}

impl AddAssign<u64> for Instant {
    #[inline]
    fn add_assign(&mut self, ns: u64) {
        *self = self.after(ns);
    }
}

impl core::fmt::Display for Instant {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ns", self.0)
    }
}

/// `Instant::from_nanos`, short for the core's unit tests.
#[cfg(test)]
pub(crate) const fn at(ns: u64) -> Instant {
    Instant::from_nanos(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_saturate_instead_of_wrapping() {
        let a = Instant::from_nanos(1_000);
        let b = a + 500;
        assert_eq!(b.as_nanos(), 1_500);
        assert_eq!(b.since(a), 500);
        assert_eq!(a.since(b), 0);
        assert_eq!(Instant::MAX + 1, Instant::MAX);
        assert_eq!(a.before(5_000), Instant::ZERO);
        let mut c = a;
        c += 7;
        assert_eq!(c.as_nanos(), 1_007);
    }
}
