//! Protection domains and memory regions: memory the engine may place into, registered and
//! deregistered through the device.

use super::*;

pub(super) struct PdInner {
    pub(super) ctx: Context,
    pub(super) id: u32,
}

/// A protection domain: memory regions and queue pairs that may be used together.
pub struct ProtectionDomain {
    pub(super) inner: Rc<PdInner>,
}

pub(super) struct MrInner {
    pub(super) pd: Rc<PdInner>,
    pub(super) ptr: NonNull<u8>,
    pub(super) layout: Layout,
    pub(super) len: usize,
    pub(super) key: u32,
    pub(super) access: Access,
}

impl Drop for MrInner {
    fn drop(&mut self) {
        let base = self.ptr.as_ptr() as u64;
        let (pd, key) = (self.pd.id, self.key);
        self.pd.ctx.with(|e| {
            e.mems.remove(base);
            for qp in e.qps.values_mut().filter(|q| q.pd == pd) {
                if let Some(c) = qp.conn.as_mut() {
                    c.deregister(key);
                }
            }
        });
        // SAFETY: `ptr` came from `alloc_zeroed(layout)` and is freed once, here, after the
        // engine forgot the region (so nothing writes to it any more).
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A registered memory region: its own zeroed, page-aligned memory, reachable by peers through
/// its key with the rights it was registered with. The memory is read and written by copying
/// (`read`, `write`), never borrowed, because peers write into it while the program runs.
pub struct MemoryRegion {
    pub(super) inner: Rc<MrInner>,
}

impl ProtectionDomain {
    /// Registers a new memory region of `len` bytes.
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<MemoryRegion, Error> {
        if len == 0 {
            return Err(Error::new("reg_mr", ErrorKind::EmptyRegion));
        }
        let layout = Layout::from_size_align(len, 4096)
            .map_err(|_| Error::new("reg_mr", ErrorKind::OutOfMemory(len)))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or(Error::new("reg_mr", ErrorKind::OutOfMemory(len)))?;
        let ctx = &self.inner.ctx;
        let key = loop {
            let k = ctx.random() as u32;
            if k != 0 && ctx.with(|e| e.mems.iter().all(|(_, m)| m.key != k)) {
                break k;
            }
        };
        let mr = MemoryRegion {
            inner: Rc::new(MrInner {
                pd: self.inner.clone(),
                ptr,
                layout,
                len,
                key,
                access,
            }),
        };
        let base = ptr.as_ptr() as u64;
        let region = Region {
            key,
            base,
            len: len as u64,
            access,
        };
        let pd = self.inner.id;
        ctx.with(|e| {
            e.mems.insert(
                base,
                MemEntry {
                    len: len as u64,
                    key,
                    pd,
                    access,
                },
            );
            for qp in e.qps.values_mut().filter(|q| q.pd == pd) {
                if let Some(c) = qp.conn.as_mut() {
                    c.register(region)
                        .map_err(|r| Error::new("reg_mr", ErrorKind::Region(r)))?;
                }
            }
            Ok::<(), Error>(())
        })?;
        Ok(mr)
    }

    /// Creates a queue pair whose completions go to `cq`. Connect it with
    /// [`QueuePair::connect`] once the peer's [`QpInfo`] is known.
    pub fn create_qp(&self, cq: &CompletionQueue, attr: &QpAttr) -> Result<QueuePair, Error> {
        if attr.paths == 0 || usize::from(attr.paths) > MAX_PATHS {
            return Err(Error::new(
                "create_qp",
                ErrorKind::Invalid("path count (1 to 64)"),
            ));
        }
        if attr.mtu < 256 || attr.mtu > super::MAX_MTU {
            return Err(Error::new(
                "create_qp",
                ErrorKind::Invalid("mtu (256 to 64872)"),
            ));
        }
        if !Rc::ptr_eq(&cq.ctx.inner, &self.inner.ctx.inner) {
            return Err(Error::new(
                "create_qp",
                ErrorKind::Invalid("completion queue of another device"),
            ));
        }
        let ctx = &self.inner.ctx;
        let qpn = loop {
            let q = (ctx.random() as u32) & 0x00ff_ffff;
            if q > 1 && ctx.with(|e| !e.qps.contains_key(&q)) {
                break q;
            }
        };
        // Every number a forger would have to guess starts at random: the PSN, the path
        // sequences, the probe sequences, and the paths' source ports (the entropy seed).
        let psn = (ctx.random() as u32) & 0x00ff_ffff;
        let seed = ctx.random() as u32;
        let path_seq = ctx.random() as u32;
        let probe_seq = ctx.random() as u32;
        ctx.with(|e| {
            e.qps.insert(
                qpn,
                QpState {
                    pd: self.inner.id,
                    cq: cq.shared.clone(),
                    conn: None,
                    peer: None,
                    pending: engine::Requests::default(),
                    data_at: None,
                    data_bytes: 0,
                },
            )
        });
        Ok(QueuePair {
            inner: Rc::new(QpInner {
                pd: self.inner.clone(),
                _cq: cq.shared.clone(),
                qpn,
                psn,
                seed,
                path_seq,
                probe_seq,
                attr: *attr,
            }),
        })
    }
}

impl MemoryRegion {
    /// Bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Never true: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The address peers use (the start of the memory).
    pub fn addr(&self) -> u64 {
        self.inner.ptr.as_ptr() as u64
    }

    /// The key peers present (R_Key); also the local key.
    pub fn rkey(&self) -> u32 {
        self.inner.key
    }

    /// The rights it was registered with.
    pub fn access(&self) -> Access {
        self.inner.access
    }

    pub(super) fn check(&self, op: &'static str, offset: usize, len: usize) -> Result<(), Error> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.inner.len)
        {
            return Err(Error::new(
                op,
                ErrorKind::LocalBounds {
                    offset,
                    len,
                    region_len: self.inner.len,
                },
            ));
        }
        Ok(())
    }

    /// Copies `out.len()` bytes from `offset` out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        self.check("mr_read", offset, out.len())?;
        // SAFETY: the range is inside the allocation (checked); the engine writes region
        // memory only inside API calls on this thread, never during this copy.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.inner.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), Error> {
        self.check("mr_write", offset, data.len())?;
        // SAFETY: as in `read`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.inner.ptr.as_ptr().add(offset),
                data.len(),
            )
        };
        Ok(())
    }

    /// The whole region as a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.inner.len];
        self.read(0, &mut v).expect("whole region is in bounds");
        v
    }

    /// Whether `len` bytes at `offset` equal `expected`, compared in place (no copy, no
    /// scratch buffer).
    pub fn equals(&self, offset: usize, expected: &[u8]) -> Result<bool, Error> {
        self.check("mr_compare", offset, expected.len())?;
        // SAFETY: the range is inside the allocation (checked); the engine writes region memory
        // only inside API calls on this thread, and the slice does not outlive this comparison.
        let got = unsafe {
            std::slice::from_raw_parts(self.inner.ptr.as_ptr().add(offset), expected.len())
        };
        Ok(got == expected)
    }

    /// A scatter-gather element over `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Sge<'_> {
        Sge {
            mr: self,
            offset,
            len,
        }
    }

    /// The remote address of `offset` in this region, for a peer.
    pub fn remote(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            va: self.addr() + offset,
            rkey: self.rkey(),
        }
    }
}
