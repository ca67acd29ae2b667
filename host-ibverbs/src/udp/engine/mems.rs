//! The live memory regions of a device, as the engine checks every access against them.

use super::*;

/// A live memory region, as the engine knows it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemEntry {
    pub len: u64,
    pub key: u32,
    pub pd: u32,
    pub access: transport_core::conn::Access,
}

/// The live memory regions of a device by base address, with the last two regions checks found,
/// the latest first: most packets of a flow fall in the same region, and an end that answers
/// what it receives alternates between two (its send buffer, read for the answer, and its
/// receive buffer, written by the placement), which one remembered region missed every time.
/// Every change of the set forgets them.
pub(crate) struct Mems {
    map: BTreeMap<u64, MemEntry>,
    /// (base, end) of the regions the last successful checks found; empty when (MAX, 0).
    hints: std::cell::Cell<[(u64, u64); 2]>,
}

impl Mems {
    const NO_HINTS: [(u64, u64); 2] = [(u64::MAX, 0); 2];

    pub fn new() -> Mems {
        Mems {
            map: BTreeMap::new(),
            hints: std::cell::Cell::new(Self::NO_HINTS),
        }
    }

    pub fn insert(&mut self, base: u64, e: MemEntry) {
        self.hints.set(Self::NO_HINTS);
        self.map.insert(base, e);
    }

    pub fn remove(&mut self, base: u64) {
        self.hints.set(Self::NO_HINTS);
        self.map.remove(&base);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&u64, &MemEntry)> {
        self.map.iter()
    }

    /// Whether `addr..addr+len` lies inside one live region.
    pub fn contains(&self, addr: u64, len: usize) -> bool {
        let Some(end) = addr.checked_add(len as u64) else {
            return false;
        };
        let [first, second] = self.hints.get();
        if addr >= first.0 && end <= first.1 {
            return true;
        }
        if addr >= second.0 && end <= second.1 {
            self.hints.set([second, first]);
            return true;
        }
        match self.map.range(..=addr).next_back() {
            Some((start, m)) if end <= start + m.len => {
                self.hints.set([(*start, start + m.len), first]);
                true
            }
            _ => false,
        }
    }
}

/// The engine's side of the core's runner contract: a connection reads payloads from and places
/// deliveries into live regions only, each access checked against the region table first.
impl Memory for Mems {
    #[inline]
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        if len == 0 {
            return Some(&[]);
        }
        if !self.contains(addr, len) {
            return None;
        }
        // SAFETY: `addr..addr+len` lies inside a live region (checked just above), readable for
        // `len` bytes; a region's memory stays allocated while its entry is in the table, which
        // the shared borrow of `self` keeps unchanged for the slice's life; no mutable Rust
        // reference to region memory exists (the region API copies in and out).
        Some(unsafe { std::slice::from_raw_parts(addr as *const u8, len) })
    }

    #[inline]
    fn write(&mut self, addr: u64, bytes: &[u8]) -> bool {
        if bytes.is_empty() {
            return true;
        }
        if !self.contains(addr, bytes.len()) {
            return false;
        }
        // SAFETY: the destination lies inside a live region (checked just above); a region's
        // memory stays allocated while its entry is in the table; no Rust reference to region
        // memory exists outside the engine's own copies, and `bytes` is a received datagram in
        // the engine's buffers, which cannot overlap region memory.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len());
        }
        true
    }
}

#[cfg(test)]
mod mems_tests {
    use super::*;

    fn entry(len: u64) -> MemEntry {
        MemEntry {
            len,
            key: 1,
            pd: 0,
            access: transport_core::conn::Access::LOCAL_WRITE,
        }
    }

    #[test]
    fn a_removed_region_is_not_remembered() {
        let mut m = Mems::new();
        assert!(!m.contains(0, 0) && !m.contains(4096, 1));
        m.insert(4096, entry(100));
        m.insert(8192, entry(50));
        assert!(m.contains(4096, 100) && m.contains(4150, 10)); // the second hits the hint
        assert!(!m.contains(4150, 51) && !m.contains(4095, 2) && !m.contains(u64::MAX, 2));
        assert!(m.contains(8192, 50) && !m.contains(8192, 51));
        // Alternating between two regions: both are remembered, and the checks stay exact.
        for _ in 0..3 {
            assert!(m.contains(4100, 4) && m.contains(8200, 4));
            assert!(!m.contains(4196, 1) && !m.contains(8242, 1) && !m.contains(8000, 4));
        }
        m.remove(4096);
        assert!(!m.contains(4150, 10), "the hint went with the region");
        assert!(m.contains(8200, 8));
        m.insert(4096, entry(100));
        assert!(m.contains(4150, 10) && m.contains(8200, 8));
        m.remove(8192);
        assert!(
            !m.contains(8200, 8),
            "both hints went with the set's change"
        );
        assert!(m.contains(4150, 10));
        m.insert(8192, entry(50));
        assert!(m.contains(8200, 8));
        m.remove(8192);
        assert!(!m.contains(8200, 8));
    }
}
