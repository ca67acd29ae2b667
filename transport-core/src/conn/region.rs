//! Registered memory regions and the check every incoming Write, Read and atomic passes before
//! anything is placed: the key names a region, the whole access lies inside it without overflow,
//! and the region grants the access.

use crate::wire::metaroce::NackReason;

/// Access rights of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Access(u8);

impl Access {
    /// Local writes (receive buffers, Read responses).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote peers may write.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Remote peers may read.
    pub const REMOTE_READ: Access = Access(4);
    /// Remote peers may perform atomics.
    pub const REMOTE_ATOMIC: Access = Access(8);

    /// Both sets of rights.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    /// These rights without those of `other`.
    pub const fn without(self, other: Access) -> Access {
        Access(self.0 & !other.0)
    }

    /// Whether every right in `need` is granted.
    pub const fn grants(self, need: Access) -> bool {
        self.0 & need.0 == need.0
    }
}

/// A registered region: `len` bytes from `base` in the owner's address space, reachable with `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Region {
    /// The key a peer must present (the R_Key).
    pub key: u32,
    /// First address.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// What peers may do.
    pub access: Access,
}

/// Why a region could not be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RegionError {
    /// The table is full.
    TableFull,
    /// Another region already uses this key.
    DuplicateKey(u32),
    /// `base + len` overflows the address space.
    Overflow,
}

impl core::fmt::Display for RegionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RegionError::TableFull => f.write_str("the connection's region table is full"),
            RegionError::DuplicateKey(k) => write!(f, "key {k:#x} is already registered"),
            RegionError::Overflow => f.write_str("the region wraps the address space"),
        }
    }
}

impl core::error::Error for RegionError {}

/// A bounded table of regions.
#[derive(Debug, Clone)]
pub struct RegionTable<const R: usize> {
    slots: [Option<Region>; R],
}

impl<const R: usize> Default for RegionTable<R> {
    fn default() -> Self {
        RegionTable { slots: [None; R] }
    }
}

impl<const R: usize> RegionTable<R> {
    /// Registers a region.
    pub fn register(&mut self, region: Region) -> Result<(), RegionError> {
        if region.base.checked_add(region.len).is_none() {
            return Err(RegionError::Overflow);
        }
        if self.slots.iter().flatten().any(|r| r.key == region.key) {
            return Err(RegionError::DuplicateKey(region.key));
        }
        let slot = self
            .slots
            .iter_mut()
            .find(|s| s.is_none())
            .ok_or(RegionError::TableFull)?;
        *slot = Some(region);
        Ok(())
    }

    /// Removes the region with `key`; returns whether there was one.
    pub fn deregister(&mut self, key: u32) -> bool {
        match self
            .slots
            .iter_mut()
            .find(|s| s.is_some_and(|r| r.key == key))
        {
            Some(slot) => {
                *slot = None;
                true
            }
            None => false,
        }
    }

    /// Checks an access of `len` bytes at `va` with `key` needing `need`; returns `va` when allowed.
    pub fn check(&self, key: u32, va: u64, len: u64, need: Access) -> Result<u64, NackReason> {
        let region = self
            .slots
            .iter()
            .flatten()
            .find(|r| r.key == key)
            .ok_or(NackReason::InvalidRkey)?;
        let end = va.checked_add(len).ok_or(NackReason::OutOfBounds)?;
        if va < region.base || end > region.base + region.len {
            return Err(NackReason::OutOfBounds);
        }
        if !region.access.grants(need) {
            return Err(NackReason::AccessDenied);
        }
        Ok(va)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_key_bounds_overflow_and_rights() {
        let mut t = RegionTable::<2>::default();
        let rw = Access::REMOTE_WRITE.union(Access::LOCAL_WRITE);
        t.register(Region {
            key: 7,
            base: 0x1000,
            len: 0x100,
            access: rw,
        })
        .unwrap();
        assert_eq!(t.check(7, 0x1000, 0x100, Access::REMOTE_WRITE), Ok(0x1000));
        assert_eq!(
            t.check(8, 0x1000, 1, Access::REMOTE_WRITE),
            Err(NackReason::InvalidRkey)
        );
        assert_eq!(
            t.check(7, 0x1001, 0x100, Access::REMOTE_WRITE),
            Err(NackReason::OutOfBounds)
        );
        assert_eq!(
            t.check(7, 0xfff, 1, Access::REMOTE_WRITE),
            Err(NackReason::OutOfBounds)
        );
        assert_eq!(
            t.check(7, u64::MAX, 2, Access::REMOTE_WRITE),
            Err(NackReason::OutOfBounds)
        );
        assert_eq!(
            t.check(7, 0x1000, 1, Access::REMOTE_READ),
            Err(NackReason::AccessDenied)
        );
        assert_eq!(
            t.register(Region {
                key: 7,
                base: 0,
                len: 1,
                access: rw
            }),
            Err(RegionError::DuplicateKey(7))
        );
        assert_eq!(
            t.register(Region {
                key: 9,
                base: u64::MAX,
                len: 2,
                access: rw
            }),
            Err(RegionError::Overflow)
        );
        t.register(Region {
            key: 9,
            base: 0,
            len: 1,
            access: rw,
        })
        .unwrap();
        assert_eq!(
            t.register(Region {
                key: 10,
                base: 0,
                len: 1,
                access: rw
            }),
            Err(RegionError::TableFull)
        );
        assert!(t.deregister(7));
        assert_eq!(
            t.check(7, 0x1000, 1, Access::REMOTE_WRITE),
            Err(NackReason::InvalidRkey)
        );
    }
}
