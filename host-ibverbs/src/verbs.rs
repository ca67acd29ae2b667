//! The ibverbs backend over `rdma-sys`: the same shape as the UDP transport's API (device,
//! protection domain, memory region, completion queue, RC queue pair with the INIT, RTR and
//! RTS transitions, post and poll) on a real RoCE NIC.
//!
//! Ownership encodes the destroy order (a queue pair holds its protection domain and completion
//! queue, a memory region its protection domain, all of them the device), and every failing
//! verb is reported with its name and the system's error. With no RDMA device present,
//! `ibv_get_device_list` fails (ENOSYS where the kernel has no RDMA support) or lists nothing:
//! [`device_list`] says "no RDMA device" plainly.

use rdma_sys as sys;
use std::alloc::Layout;
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::mem::zeroed;
use std::ptr::{null_mut, NonNull};
use std::rc::Rc;

mod cq;
mod qp;
pub use cq::*;
pub use qp::*;

/// A verb failed.
#[derive(Debug)]
pub enum VerbsError {
    /// No RDMA device is present (or the kernel has no RDMA support).
    NoDevice(Option<io::Error>),
    /// The named device does not exist.
    NoSuchDevice(String),
    /// A verb failed.
    Verb {
        /// The verb (`ibv_open_device`, `ibv_modify_qp(RTR)`, ...).
        verb: &'static str,
        /// The system's error.
        source: io::Error,
    },
    /// A parameter is out of range.
    Invalid(&'static str),
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::NoDevice(None) => write!(f, "no RDMA device"),
            VerbsError::NoDevice(Some(e)) => {
                write!(f, "no RDMA device (ibv_get_device_list: {e})")
            }
            VerbsError::NoSuchDevice(n) => write!(f, "no RDMA device named {n:?}"),
            VerbsError::Verb { verb, source } => write!(f, "{verb}: {source}"),
            VerbsError::Invalid(what) => write!(f, "invalid {what}"),
        }
    }
}

impl std::error::Error for VerbsError {}

fn verb_err(verb: &'static str) -> VerbsError {
    VerbsError::Verb {
        verb,
        source: io::Error::last_os_error(),
    }
}

fn rc_err(verb: &'static str, rc: i32) -> VerbsError {
    // Verbs return a positive errno, or -1 with errno set.
    let source = if rc > 0 {
        io::Error::from_raw_os_error(rc)
    } else {
        io::Error::last_os_error()
    };
    VerbsError::Verb { verb, source }
}

/// A device as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its name (`mlx5_0`, ...).
    pub name: String,
}

/// The RDMA devices present.
pub fn device_list() -> Result<Vec<DeviceInfo>, VerbsError> {
    let mut n: i32 = 0;
    // SAFETY: `n` is a live out-parameter; the list is freed below.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(VerbsError::NoDevice(Some(io::Error::last_os_error())));
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: `dev` is a device of the list; its name is a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) };
        out.push(DeviceInfo {
            name: name.to_string_lossy().into_owned(),
        });
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { sys::ibv_free_device_list(list) };
    if out.is_empty() {
        return Err(VerbsError::NoDevice(None));
    }
    Ok(out)
}

struct CtxInner {
    ctx: NonNull<sys::ibv_context>,
    name: String,
}

impl Drop for CtxInner {
    fn drop(&mut self) {
        // SAFETY: the context is open and everything built on it is gone (they hold this Rc).
        unsafe { sys::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// An open device.
#[derive(Clone)]
pub struct Context {
    inner: Rc<CtxInner>,
}

/// A device's limits.
#[derive(Debug, Clone, Copy)]
pub struct DeviceAttr {
    /// Queue pairs at most.
    pub max_qp: i32,
    /// Work requests per queue at most.
    pub max_qp_wr: i32,
    /// Completion queues at most.
    pub max_cq: i32,
    /// Memory regions at most.
    pub max_mr: i32,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Physical ports.
    pub phys_port_cnt: u8,
    /// Entries per completion queue at most.
    pub max_cqe: i32,
    /// Reads and atomics a queue pair may answer at once (its responder resources).
    pub max_qp_rd_atom: i32,
    /// Reads and atomics a queue pair may have outstanding as initiator.
    pub max_qp_init_rd_atom: i32,
    /// Atomic support (`IBV_ATOMIC_NONE` is 0).
    pub atomic_cap: u32,
}

impl DeviceAttr {
    /// Whether the device does remote atomics at all.
    pub fn has_atomics(&self) -> bool {
        self.atomic_cap != sys::ibv_atomic_cap::IBV_ATOMIC_NONE
    }
}

/// A port's state.
#[derive(Debug, Clone, Copy)]
pub struct PortAttr {
    /// `IBV_PORT_ACTIVE` is 4.
    pub state: u32,
    /// Active MTU as the verbs enum (1 = 256 ... 5 = 4096).
    pub active_mtu: u32,
    /// GID table length.
    pub gid_tbl_len: i32,
    /// `IBV_LINK_LAYER_ETHERNET` (2) for RoCE, `IBV_LINK_LAYER_INFINIBAND` (1).
    pub link_layer: u8,
}

/// The name of a port state (`ibv_port_state`).
pub fn port_state_name(state: u32) -> &'static str {
    match state {
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "NOP",
    }
}

/// Ethernet, the link layer of a RoCE port.
pub const LINK_LAYER_ETHERNET: u8 = 2;

impl Context {
    /// Opens the device `name`, or the first one.
    pub fn open(name: Option<&str>) -> Result<Context, VerbsError> {
        let mut n: i32 = 0;
        // SAFETY: as in `device_list`.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(VerbsError::NoDevice(Some(io::Error::last_os_error())));
        }
        let mut chosen = None;
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` device pointers with NUL-terminated names.
            let (dev, dname) = unsafe {
                let dev = *list.add(i);
                (
                    dev,
                    CStr::from_ptr(sys::ibv_get_device_name(dev))
                        .to_string_lossy()
                        .into_owned(),
                )
            };
            if name.is_none_or(|want| want == dname) {
                chosen = Some((dev, dname));
                break;
            }
        }
        let result = match chosen {
            None if n == 0 => Err(VerbsError::NoDevice(None)),
            None => Err(VerbsError::NoSuchDevice(name.unwrap_or("").into())),
            Some((dev, dname)) => {
                // SAFETY: `dev` is a device of the live list.
                let ctx = unsafe { sys::ibv_open_device(dev) };
                NonNull::new(ctx)
                    .map(|ctx| Context {
                        inner: Rc::new(CtxInner { ctx, name: dname }),
                    })
                    .ok_or_else(|| verb_err("ibv_open_device"))
            }
        };
        // SAFETY: freed once; an opened context stays valid after the list is freed.
        unsafe { sys::ibv_free_device_list(list) };
        result
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device's limits.
    pub fn query(&self) -> Result<DeviceAttr, VerbsError> {
        // SAFETY: plain C structure; all-zero is valid.
        let mut a: sys::ibv_device_attr = unsafe { zeroed() };
        // SAFETY: the context is open and `a` is writable.
        let rc = unsafe { sys::ibv_query_device(self.inner.ctx.as_ptr(), &mut a) };
        if rc != 0 {
            return Err(rc_err("ibv_query_device", rc));
        }
        Ok(DeviceAttr {
            max_qp: a.max_qp,
            max_qp_wr: a.max_qp_wr,
            max_cq: a.max_cq,
            max_mr: a.max_mr,
            max_mr_size: a.max_mr_size,
            phys_port_cnt: a.phys_port_cnt,
            max_cqe: a.max_cqe,
            max_qp_rd_atom: a.max_qp_rd_atom,
            max_qp_init_rd_atom: a.max_qp_init_rd_atom,
            atomic_cap: a.atomic_cap,
        })
    }

    /// A port's state.
    pub fn query_port(&self, port: u8) -> Result<PortAttr, VerbsError> {
        // SAFETY: plain C structure; all-zero is valid.
        let mut a: sys::ibv_port_attr = unsafe { zeroed() };
        // SAFETY: the context is open and `a` is writable.
        let rc = unsafe { sys::___ibv_query_port(self.inner.ctx.as_ptr(), port, &mut a) };
        if rc != 0 {
            return Err(rc_err("ibv_query_port", rc));
        }
        Ok(PortAttr {
            state: a.state,
            active_mtu: a.active_mtu,
            gid_tbl_len: a.gid_tbl_len,
            link_layer: a.link_layer,
        })
    }

    /// A GID of a port.
    pub fn query_gid(&self, port: u8, index: i32) -> Result<[u8; 16], VerbsError> {
        // SAFETY: plain C union; all-zero is valid.
        let mut gid: sys::ibv_gid = unsafe { zeroed() };
        // SAFETY: the context is open and `gid` is writable.
        let rc = unsafe { sys::ibv_query_gid(self.inner.ctx.as_ptr(), port, index, &mut gid) };
        if rc != 0 {
            return Err(rc_err("ibv_query_gid", rc));
        }
        // SAFETY: every bit pattern of the union is a valid byte array.
        Ok(unsafe { gid.raw })
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, VerbsError> {
        // SAFETY: the context is open.
        let pd = unsafe { sys::ibv_alloc_pd(self.inner.ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| verb_err("ibv_alloc_pd"))?;
        Ok(ProtectionDomain {
            inner: Rc::new(PdInner {
                pd,
                _ctx: self.inner.clone(),
            }),
        })
    }

    /// Creates a completion queue of `depth` entries, polled only.
    pub fn create_cq(&self, depth: i32) -> Result<CompletionQueue, VerbsError> {
        self.create_cq_inner(depth, false)
    }

    /// Creates a completion queue of `depth` entries with a completion channel, so a caller
    /// can sleep until a completion comes ([`CompletionQueue::wait`], perftest's `-e`).
    pub fn create_cq_with_events(&self, depth: i32) -> Result<CompletionQueue, VerbsError> {
        self.create_cq_inner(depth, true)
    }

    fn create_cq_inner(&self, depth: i32, events: bool) -> Result<CompletionQueue, VerbsError> {
        let channel = if events {
            // SAFETY: the context is open.
            let ch = unsafe { sys::ibv_create_comp_channel(self.inner.ctx.as_ptr()) };
            let ch = NonNull::new(ch).ok_or_else(|| verb_err("ibv_create_comp_channel"))?;
            // The channel's descriptor is only read after poll(2) says it is readable; make
            // it non-blocking so a spurious wake-up cannot hang `ibv_get_cq_event`.
            // SAFETY: the channel is live; fcntl on its descriptor has no memory effects.
            let ok = unsafe {
                let fd = ch.as_ref().fd;
                let flags = libc::fcntl(fd, libc::F_GETFL);
                flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
            };
            if !ok {
                let e = verb_err("fcntl(completion channel, O_NONBLOCK)");
                // SAFETY: created just above and used by nothing else.
                unsafe { sys::ibv_destroy_comp_channel(ch.as_ptr()) };
                return Err(e);
            }
            Some(ch)
        } else {
            None
        };
        let ch_ptr = channel.map_or(null_mut(), NonNull::as_ptr);
        // SAFETY: the context is open; the channel (if any) is live; no context pointer.
        let cq =
            unsafe { sys::ibv_create_cq(self.inner.ctx.as_ptr(), depth, null_mut(), ch_ptr, 0) };
        let Some(cq) = NonNull::new(cq) else {
            let e = verb_err("ibv_create_cq");
            if let Some(ch) = channel {
                // SAFETY: created above; no CQ uses it.
                unsafe { sys::ibv_destroy_comp_channel(ch.as_ptr()) };
            }
            return Err(e);
        };
        Ok(CompletionQueue {
            inner: Rc::new(CqInner {
                cq,
                channel,
                _ctx: self.inner.clone(),
            }),
        })
    }
}

struct PdInner {
    pd: NonNull<sys::ibv_pd>,
    _ctx: Rc<CtxInner>,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; its regions and queue pairs hold this Rc.
        unsafe { sys::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// A protection domain.
pub struct ProtectionDomain {
    inner: Rc<PdInner>,
}

/// Access rights, as the verbs flags.
pub use crate::udp::Access;

fn access_flags(a: Access) -> i32 {
    let mut f = 0;
    for (ours, theirs) in [
        (
            Access::LOCAL_WRITE,
            sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0,
        ),
        (
            Access::REMOTE_WRITE,
            sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0,
        ),
        (
            Access::REMOTE_READ,
            sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0,
        ),
        (
            Access::REMOTE_ATOMIC,
            sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0,
        ),
    ] {
        if a.grants(ours) {
            f |= theirs as i32;
        }
    }
    f
}

struct MrInner {
    mr: NonNull<sys::ibv_mr>,
    buf: NonNull<u8>,
    layout: Layout,
    _pd: Rc<PdInner>,
}

impl Drop for MrInner {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr and deregistered once; no queue pair holds it any
        // more (they hold this Rc while a request on it may be posted).
        let rc = unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            // The NIC may still write into the memory: leave it allocated (a leak, not a
            // use after free) and say so.
            eprintln!(
                "metaroce: {}; its {} bytes stay allocated",
                rc_err("ibv_dereg_mr", rc),
                self.layout.size()
            );
            return;
        }
        // SAFETY: allocated with `layout` in `reg_mr`; the registration is gone.
        unsafe { std::alloc::dealloc(self.buf.as_ptr(), self.layout) };
    }
}

/// A registered memory region with its own page-aligned memory.
pub struct MemoryRegion {
    inner: Rc<MrInner>,
}

impl ProtectionDomain {
    /// Registers `len` bytes of new zeroed memory.
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        if len == 0 {
            return Err(VerbsError::Invalid("memory region length 0"));
        }
        let layout = Layout::from_size_align(len, 4096)
            .map_err(|_| VerbsError::Invalid("memory region length"))?;
        // SAFETY: non-zero size.
        let buf = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or(VerbsError::Invalid("memory region length (out of memory)"))?;
        // SAFETY: the PD is live and `buf` holds `len` bytes that outlive the registration.
        let mr = unsafe {
            sys::ibv_reg_mr(
                self.inner.pd.as_ptr(),
                buf.as_ptr().cast(),
                len,
                access_flags(access),
            )
        };
        let Some(mr) = NonNull::new(mr) else {
            let e = verb_err("ibv_reg_mr");
            // SAFETY: allocated above with `layout`, never registered.
            unsafe { std::alloc::dealloc(buf.as_ptr(), layout) };
            return Err(e);
        };
        Ok(MemoryRegion {
            inner: Rc::new(MrInner {
                mr,
                buf,
                layout,
                _pd: self.inner.clone(),
            }),
        })
    }

    /// Creates an RC queue pair on `cq` (sends and receives) with room for `depth` requests.
    pub fn create_qp(&self, cq: &CompletionQueue, depth: u32) -> Result<QueuePair, VerbsError> {
        // SAFETY: plain C structure; all-zero is valid.
        let mut init: sys::ibv_qp_init_attr = unsafe { zeroed() };
        init.send_cq = cq.inner.cq.as_ptr();
        init.recv_cq = cq.inner.cq.as_ptr();
        init.cap.max_send_wr = depth;
        init.cap.max_recv_wr = depth;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 1;
        // SAFETY: the PD and CQ are live; `init` is filled in.
        let qp = unsafe { sys::ibv_create_qp(self.inner.pd.as_ptr(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(|| verb_err("ibv_create_qp"))?;
        Ok(QueuePair {
            qp,
            held: Holds::default(),
            _pd: self.inner.clone(),
            _cq: cq.inner.clone(),
        })
    }
}

impl MemoryRegion {
    /// Bytes.
    pub fn len(&self) -> usize {
        self.inner.layout.size()
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The address peers use.
    pub fn addr(&self) -> u64 {
        self.inner.buf.as_ptr() as u64
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the registration is live.
        unsafe { self.inner.mr.as_ref().lkey }
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: the registration is live.
        unsafe { self.inner.mr.as_ref().rkey }
    }

    pub(super) fn check(&self, offset: usize, len: usize) -> Result<(), VerbsError> {
        if offset.checked_add(len).is_none_or(|e| e > self.len()) {
            return Err(VerbsError::Invalid("range outside the memory region"));
        }
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), VerbsError> {
        self.check(offset, data.len())?;
        // SAFETY: the range lies inside the region's own allocation (checked); the NIC may
        // write other parts of it at any time, so the memory is only ever copied, never
        // borrowed as a Rust reference.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.inner.buf.as_ptr().add(offset),
                data.len(),
            )
        };
        Ok(())
    }

    /// Copies `out.len()` bytes of the region at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), VerbsError> {
        self.check(offset, out.len())?;
        // SAFETY: as in `write`; `out` is the caller's memory, never region memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.inner.buf.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With no RDMA device (this kernel has no RDMA support), listing and opening say so
    /// plainly instead of failing obscurely.
    #[test]
    fn no_device_is_reported_plainly() {
        if std::env::var_os("METAROCE_VERBS_DEVICE").is_some() {
            return; // a machine with a device runs `real_device_round_trip` instead
        }
        let e = device_list().unwrap_err();
        assert!(e.to_string().starts_with("no RDMA device"), "{e}");
        let e = Context::open(None).map(|_| ()).unwrap_err();
        assert!(e.to_string().starts_with("no RDMA device"), "{e}");
    }

    #[test]
    fn completions_are_named_as_the_udp_transport_names_them() {
        use crate::udp::CompletionKind as K;
        use sys::ibv_wc_opcode as op;
        let wc = |opcode, status| Wc {
            wr_id: 1,
            status,
            opcode,
            byte_len: 8,
            imm: None,
            vendor_err: 0,
            qp_num: 7,
        };
        for (opcode, kind) in [
            (op::IBV_WC_SEND, K::Send),
            (op::IBV_WC_RDMA_WRITE, K::Write),
            (op::IBV_WC_RDMA_READ, K::Read),
            (op::IBV_WC_COMP_SWAP, K::Atomic),
            (op::IBV_WC_FETCH_ADD, K::Atomic),
            (op::IBV_WC_RECV, K::Recv),
            (op::IBV_WC_RECV_RDMA_WITH_IMM, K::RecvWriteImm),
        ] {
            assert_eq!(wc(opcode, 0).kind(), Some(kind));
        }
        assert_eq!(wc(op::IBV_WC_BIND_MW, 0).kind(), None);
        assert!(wc(op::IBV_WC_SEND, sys::ibv_wc_status::IBV_WC_SUCCESS).is_success());
        assert!(!wc(op::IBV_WC_SEND, sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR).is_success());
    }

    /// Each outstanding request holds its region, though the caller dropped its handle, until
    /// its completion is polled or the queue pair is destroyed: a posted receive never outlives
    /// its memory, and a finished phase's regions do not stay pinned.
    #[test]
    fn outstanding_requests_hold_their_regions() {
        struct Region(std::rc::Rc<std::cell::Cell<bool>>);
        impl Drop for Region {
            fn drop(&mut self) {
                self.0.set(true);
            }
        }
        let flag = || std::rc::Rc::new(std::cell::Cell::new(false));
        let (freed_a, freed_b) = (flag(), flag());
        let a = Rc::new(Region(freed_a.clone()));
        let b = Rc::new(Region(freed_b.clone()));
        let qp: Holds<Region> = Holds::default();
        qp.hold(1, &a);
        qp.hold(2, &a);
        qp.hold(3, &b);
        qp.hold(3, &b); // a wr_id posted again before its completion
        drop((a, b)); // the phase ends; its handles go
        assert_eq!(qp.len(), 4);
        qp.release(1);
        assert!(!freed_a.get(), "deregistered under a posted request");
        qp.release(2);
        assert!(freed_a.get(), "released with its last request");
        qp.release(3);
        qp.release(99); // a completion of no held request
        assert!(!freed_b.get());
        drop(qp); // the queue pair is destroyed with a request still posted
        assert!(freed_b.get());
    }

    #[test]
    fn atomics_are_eight_aligned_bytes() {
        use crate::udp::WrOp;
        let cas = WrOp::CompareSwap {
            compare: 1,
            swap: 2,
        };
        for op in [cas, WrOp::FetchAdd(1)] {
            assert!(check_atomic_args(op, 8, 0x1000, 0x2008).is_ok());
            for (len, va, local) in [
                (4, 0x1000, 0x2000),
                (16, 0x1000, 0x2000),
                (8, 0x1004, 0x2000),
                (8, 0x1000, 0x2001),
            ] {
                let e = check_atomic_args(op, len, va, local)
                    .unwrap_err()
                    .to_string();
                assert!(e.starts_with("invalid atomic"), "{e}");
            }
        }
        assert!(check_atomic_args(WrOp::Write, 3, 0x1001, 0x2003).is_ok());
        assert_eq!(port_state_name(4), "ACTIVE");
        assert_eq!(port_state_name(1), "DOWN");
    }

    /// The device the build names, with port 1's GID at `METAROCE_VERBS_GID` (default 1).
    #[cfg(metaroce_verbs_device)]
    struct TestDevice {
        ctx: Context,
        gid_index: u8,
        gid: [u8; 16],
        mtu: u32,
    }

    #[cfg(metaroce_verbs_device)]
    const RW: Access = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ);

    #[cfg(metaroce_verbs_device)]
    impl TestDevice {
        fn open() -> TestDevice {
            let name = std::env::var("METAROCE_VERBS_DEVICE").expect("METAROCE_VERBS_DEVICE");
            let ctx = Context::open(Some(&name)).unwrap();
            assert!(ctx.query().unwrap().phys_port_cnt >= 1);
            let mtu = ctx.query_port(1).unwrap().active_mtu;
            let gid_index: u8 = std::env::var("METAROCE_VERBS_GID")
                .ok()
                .and_then(|g| g.parse().ok())
                .unwrap_or(1);
            let gid = ctx.query_gid(1, i32::from(gid_index)).unwrap();
            TestDevice {
                ctx,
                gid_index,
                gid,
                mtu,
            }
        }

        /// Takes `q` to RTS towards queue pair `peer` on the same port.
        fn connect(&self, q: &QueuePair, peer: u32, sq_psn: u32, rq_psn: u32) {
            q.connect(
                RW,
                &RtrAttr {
                    dest_qpn: peer,
                    rq_psn,
                    dgid: self.gid,
                    sgid_index: self.gid_index,
                    mtu: self.mtu,
                    port: 1,
                    traffic_class: 0,
                    sl: 0,
                    max_dest_rd_atomic: 16,
                },
                &RtsAttr {
                    sq_psn,
                    timeout: 14,
                    retry_cnt: 7,
                    rnr_retry: 7,
                    max_rd_atomic: 16,
                },
            )
            .unwrap();
        }
    }

    /// Exists only when the build names a device:
    /// `METAROCE_VERBS_DEVICE=mlx5_0 cargo test -p host-ibverbs --features verbs` (and
    /// `METAROCE_VERBS_GID`, default 1).
    #[cfg(metaroce_verbs_device)]
    #[test]
    fn real_device_round_trip() {
        let dev = TestDevice::open();
        let pd = dev.ctx.alloc_pd().unwrap();
        let cq = dev.ctx.create_cq(64).unwrap();
        let a = pd.reg_mr(1 << 20, RW).unwrap();
        let b = pd.reg_mr(1 << 20, RW).unwrap();
        let qa = pd.create_qp(&cq, 64).unwrap();
        let qb = pd.create_qp(&cq, 64).unwrap();
        dev.connect(&qa, qb.qpn(), 100, 200);
        dev.connect(&qb, qa.qpn(), 200, 100);
        qa.post_send(&SendWr {
            wr_id: 1,
            op: crate::udp::WrOp::Write,
            mr: &a,
            offset: 0,
            len: 1 << 20,
            remote: crate::udp::RemoteAddr {
                va: b.addr(),
                rkey: b.rkey(),
            },
        })
        .unwrap();
        let mut out = Vec::new();
        while out.is_empty() {
            cq.poll(&mut out, 1).unwrap();
        }
        assert_eq!(out[0].status, 0);
    }

    /// A queue made with a channel raises its event for a completion after it was armed, and
    /// none while nothing completes; one made without refuses to arm.
    #[cfg(metaroce_verbs_device)]
    #[test]
    fn real_device_completion_event() {
        use std::time::Duration;
        let dev = TestDevice::open();
        assert!(dev.ctx.create_cq(8).unwrap().arm().is_err());
        let pd = dev.ctx.alloc_pd().unwrap();
        let cq = dev.ctx.create_cq_with_events(64).unwrap();
        assert!(cq.has_events());
        let a = pd.reg_mr(4096, RW).unwrap();
        let q = pd.create_qp(&cq, 8).unwrap();
        dev.connect(&q, q.qpn(), 7, 7);
        cq.arm().unwrap();
        assert!(
            !cq.wait(Duration::from_millis(50)).unwrap(),
            "an event with nothing done"
        );
        q.post_send(&SendWr {
            wr_id: 9,
            op: crate::udp::WrOp::Write,
            mr: &a,
            offset: 0,
            len: 64,
            remote: crate::udp::RemoteAddr {
                va: a.addr() + 1024,
                rkey: a.rkey(),
            },
        })
        .unwrap();
        assert!(
            cq.wait(Duration::from_secs(5)).unwrap(),
            "no event for the completion"
        );
        let mut out = Vec::new();
        cq.poll(&mut out, 4).unwrap();
        assert_eq!((out.len(), out[0].wr_id, out[0].status), (1, 9, 0));
    }
}
