//! Naming a connection's paths: shared by the connection and its rate controllers.

/// One of a connection's paths: its index, 0 to the configured number of paths less one. On the
/// wire it is the MetaRoCE header's path byte; each path has its own UDP source port, sequence
/// space, window and RTT estimate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PathId(pub u8);

impl PathId {
    /// The path as an index into per-path tables.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl core::fmt::Display for PathId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "path {}", self.0)
    }
}
