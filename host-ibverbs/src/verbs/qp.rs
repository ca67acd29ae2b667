//! RC queue pairs: their state transitions (INIT, RTR, RTS) and work requests.

use super::*;

/// What the RTR transition needs of the peer.
#[derive(Debug, Clone, Copy)]
pub struct RtrAttr {
    /// The peer's QP number.
    pub dest_qpn: u32,
    /// The peer's first PSN.
    pub rq_psn: u32,
    /// The peer's GID.
    pub dgid: [u8; 16],
    /// Our GID index (RoCEv2 GIDs are usually 1 or 3).
    pub sgid_index: u8,
    /// Path MTU as the verbs enum (5 = 4096).
    pub mtu: u32,
    /// Port.
    pub port: u8,
    /// The traffic class of the GRH: the IP header's DSCP and ECN byte on RoCE v2 (perftest's
    /// `--tclass`; the fabric's lossless or ECN class is usually chosen by DSCP).
    pub traffic_class: u8,
    /// Service level (perftest's `-S`; on RoCE the PCP of a VLAN tag).
    pub sl: u8,
    /// Reads and atomics the peer may have outstanding at this end (responder resources).
    pub max_dest_rd_atomic: u8,
}

/// What the RTS transition needs.
#[derive(Debug, Clone, Copy)]
pub struct RtsAttr {
    /// Our first PSN.
    pub sq_psn: u32,
    /// Local ACK timeout exponent (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Retries on timeout.
    pub retry_cnt: u8,
    /// Retries on receiver-not-ready (7: forever).
    pub rnr_retry: u8,
    /// Reads and atomics this end may have outstanding (initiator depth).
    pub max_rd_atomic: u8,
}

/// A send-queue work request on a verbs queue pair.
#[derive(Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: crate::udp::WrOp,
    /// Local memory.
    pub mr: &'a MemoryRegion,
    /// Offset in it.
    pub offset: usize,
    /// Bytes.
    pub len: u32,
    /// Peer memory (Write, Read, atomics).
    pub remote: crate::udp::RemoteAddr,
}

/// The registrations of a queue pair's outstanding requests: each posted request holds (one
/// reference to) the region it was posted on until its completion is polled, and the queue
/// pair's destruction releases what is left. So a posted receive or send can never outlive its
/// memory: dropping the [`MemoryRegion`] a request is outstanding on only drops the caller's
/// handle, and the region is deregistered and freed once no request on it can run.
pub(crate) struct Holds<T>(std::cell::RefCell<std::collections::HashMap<u64, Vec<Rc<T>>>>);

impl<T> Default for Holds<T> {
    fn default() -> Self {
        Holds(std::cell::RefCell::new(std::collections::HashMap::new()))
    }
}

impl<T> Holds<T> {
    /// Request `wr_id` was posted on `r`.
    pub(crate) fn hold(&self, wr_id: u64, r: &Rc<T>) {
        self.0
            .borrow_mut()
            .entry(wr_id)
            .or_default()
            .push(r.clone());
    }

    /// Request `wr_id` completed (successfully or not): its region is no longer its to hold.
    pub(crate) fn release(&self, wr_id: u64) {
        let mut m = self.0.borrow_mut();
        if let Some(v) = m.get_mut(&wr_id) {
            v.pop();
            if v.is_empty() {
                m.remove(&wr_id);
            }
        }
    }

    /// Requests outstanding.
    pub(crate) fn len(&self) -> usize {
        self.0.borrow().values().map(Vec::len).sum()
    }
}

/// An RC queue pair.
pub struct QueuePair {
    pub(super) qp: NonNull<sys::ibv_qp>,
    /// The regions of outstanding requests; what is left is dropped after the queue pair is
    /// destroyed (`Drop` runs before the fields are dropped).
    pub(super) held: Holds<MrInner>,
    pub(super) _pd: Rc<PdInner>,
    pub(super) _cq: Rc<CqInner>,
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp and destroyed once, before its PD and CQ and before
        // the regions its requests were posted on.
        let rc = unsafe { sys::ibv_destroy_qp(self.qp.as_ptr()) };
        if rc != 0 {
            // Its requests may still run: keep their regions registered and allocated.
            eprintln!(
                "metaroce: {}; the regions of its {} outstanding requests stay registered",
                rc_err("ibv_destroy_qp", rc),
                self.held.len()
            );
            std::mem::forget(std::mem::take(&mut *self.held.0.borrow_mut()));
        }
    }
}

impl QueuePair {
    /// A completion of this queue pair was polled: the region of request `wr_id` is released
    /// (the caller reports every completion of the queue pair, errors and flushes included).
    pub fn completed(&self, wr_id: u64) {
        self.held.release(wr_id);
    }

    /// Its number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: the QP is live.
        unsafe { self.qp.as_ref().qp_num }
    }

    fn modify(
        &self,
        verb: &'static str,
        attr: &mut sys::ibv_qp_attr,
        mask: u32,
    ) -> Result<(), VerbsError> {
        // SAFETY: the QP is live and `attr` is filled in for the bits of `mask`.
        let rc = unsafe { sys::ibv_modify_qp(self.qp.as_ptr(), attr, mask as i32) };
        if rc != 0 {
            return Err(rc_err(verb, rc));
        }
        Ok(())
    }

    /// RESET to INIT, RTR and RTS in one call, as the UDP transport's `connect`.
    pub fn connect(&self, access: Access, rtr: &RtrAttr, rts: &RtsAttr) -> Result<(), VerbsError> {
        self.to_init(rtr.port, access)?;
        self.to_rtr(rtr)?;
        self.to_rts(rts)
    }

    /// RESET to INIT on `port` with `access` for remote peers.
    pub fn to_init(&self, port: u8, access: Access) -> Result<(), VerbsError> {
        use sys::ibv_qp_attr_mask as m;
        // SAFETY: plain C structure; all-zero is valid.
        let mut a: sys::ibv_qp_attr = unsafe { zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = access_flags(access) as u32;
        self.modify(
            "ibv_modify_qp(INIT)",
            &mut a,
            (m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS).0,
        )
    }

    /// INIT to RTR.
    pub fn to_rtr(&self, r: &RtrAttr) -> Result<(), VerbsError> {
        use sys::ibv_qp_attr_mask as m;
        if r.dest_qpn > 0xff_ffff || r.rq_psn > 0xff_ffff || !(1..=5).contains(&r.mtu) || r.sl > 15
        {
            return Err(VerbsError::Invalid("RTR attributes (QPN, PSN, MTU or SL)"));
        }
        // SAFETY: plain C structure; all-zero is valid.
        let mut a: sys::ibv_qp_attr = unsafe { zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = r.mtu;
        a.dest_qp_num = r.dest_qpn;
        a.rq_psn = r.rq_psn;
        a.max_dest_rd_atomic = r.max_dest_rd_atomic;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = r.port;
        a.ah_attr.sl = r.sl;
        a.ah_attr.grh.dgid.raw = r.dgid;
        a.ah_attr.grh.sgid_index = r.sgid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.grh.traffic_class = r.traffic_class;
        self.modify(
            "ibv_modify_qp(RTR)",
            &mut a,
            (m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER)
                .0,
        )
    }

    /// RTR to RTS.
    pub fn to_rts(&self, r: &RtsAttr) -> Result<(), VerbsError> {
        use sys::ibv_qp_attr_mask as m;
        if r.sq_psn > 0xff_ffff || r.timeout > 31 || r.retry_cnt > 7 || r.rnr_retry > 7 {
            return Err(VerbsError::Invalid(
                "RTS attributes (PSN, timeout or retry counts)",
            ));
        }
        // SAFETY: plain C structure; all-zero is valid.
        let mut a: sys::ibv_qp_attr = unsafe { zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = r.sq_psn;
        a.timeout = r.timeout;
        a.retry_cnt = r.retry_cnt;
        a.rnr_retry = r.rnr_retry;
        a.max_rd_atomic = r.max_rd_atomic;
        self.modify(
            "ibv_modify_qp(RTS)",
            &mut a,
            (m::IBV_QP_STATE
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_MAX_QP_RD_ATOMIC)
                .0,
        )
    }

    /// Posts a work request, the same operations as the UDP transport's
    /// [`QueuePair::post_send`](crate::udp::QueuePair::post_send): Send and Write (with or
    /// without immediate data), Read, compare-and-swap and fetch-and-add (`len` 8).
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<(), VerbsError> {
        let mr = wr.mr;
        mr.check(wr.offset, wr.len as usize)?;
        check_atomic(wr)?;
        let mut sge = sys::ibv_sge {
            addr: mr.addr() + wr.offset as u64,
            length: wr.len,
            lkey: mr.lkey(),
        };
        // SAFETY: plain C structure; all-zero is valid.
        let mut w: sys::ibv_send_wr = unsafe { zeroed() };
        w.wr_id = wr.wr_id;
        w.sg_list = &mut sge;
        w.num_sge = 1;
        w.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let rdma = sys::rdma_t {
            remote_addr: wr.remote.va,
            rkey: wr.remote.rkey,
        };
        use crate::udp::WrOp;
        use sys::ibv_wr_opcode as op;
        match wr.op {
            WrOp::Send => w.opcode = op::IBV_WR_SEND,
            WrOp::SendWithImm(imm) => {
                w.opcode = op::IBV_WR_SEND_WITH_IMM;
                w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
            WrOp::Write => {
                w.opcode = op::IBV_WR_RDMA_WRITE;
                w.wr.rdma = rdma;
            }
            WrOp::WriteWithImm(imm) => {
                w.opcode = op::IBV_WR_RDMA_WRITE_WITH_IMM;
                w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                w.wr.rdma = rdma;
            }
            WrOp::Read => {
                w.opcode = op::IBV_WR_RDMA_READ;
                w.wr.rdma = rdma;
            }
            WrOp::CompareSwap { compare, swap } => {
                w.opcode = op::IBV_WR_ATOMIC_CMP_AND_SWP;
                w.wr.atomic = sys::atomic_t {
                    remote_addr: wr.remote.va,
                    compare_add: compare,
                    swap,
                    rkey: wr.remote.rkey,
                };
            }
            WrOp::FetchAdd(add) => {
                w.opcode = op::IBV_WR_ATOMIC_FETCH_AND_ADD;
                w.wr.atomic = sys::atomic_t {
                    remote_addr: wr.remote.va,
                    compare_add: add,
                    swap: 0,
                    rkey: wr.remote.rkey,
                };
            }
        }
        let mut bad = null_mut();
        // SAFETY: the QP is live; `w` and `sge` outlive the call; the buffer is registered.
        let rc = unsafe { sys::ibv_post_send(self.qp.as_ptr(), &mut w, &mut bad) };
        if rc != 0 {
            return Err(rc_err("ibv_post_send", rc));
        }
        self.held.hold(wr.wr_id, &mr.inner);
        Ok(())
    }

    /// Posts a receive of up to `len` bytes at `offset` of `mr`.
    pub fn post_recv(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        offset: usize,
        len: u32,
    ) -> Result<(), VerbsError> {
        mr.check(offset, len as usize)?;
        let mut sge = sys::ibv_sge {
            addr: mr.addr() + offset as u64,
            length: len,
            lkey: mr.lkey(),
        };
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = null_mut();
        // SAFETY: the QP is live; `wr` and `sge` outlive the call; the buffer is registered.
        let rc = unsafe { sys::ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(rc_err("ibv_post_recv", rc));
        }
        self.held.hold(wr_id, &mr.inner);
        Ok(())
    }
}

/// An atomic moves 8 bytes at an 8-byte-aligned remote address, into an 8-byte-aligned local
/// buffer (the NIC answers anything else with a completion error after the fact, or undefined
/// results); other operations pass.
pub fn check_atomic(wr: &SendWr<'_>) -> Result<(), VerbsError> {
    check_atomic_args(wr.op, wr.len, wr.remote.va, wr.mr.addr() + wr.offset as u64)
}

/// [`check_atomic`] on the values alone.
pub fn check_atomic_args(
    op: crate::udp::WrOp,
    len: u32,
    remote_va: u64,
    local_addr: u64,
) -> Result<(), VerbsError> {
    use crate::udp::WrOp;
    if !matches!(op, WrOp::CompareSwap { .. } | WrOp::FetchAdd(_)) {
        return Ok(());
    }
    if len != 8 {
        return Err(VerbsError::Invalid("atomic length (it is 8 bytes)"));
    }
    if remote_va % 8 != 0 || local_addr % 8 != 0 {
        return Err(VerbsError::Invalid(
            "atomic address (remote and local must be 8-byte aligned)",
        ));
    }
    Ok(())
}
