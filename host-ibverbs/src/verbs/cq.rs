//! Completion queues and their completions, polled or waited for on a completion channel.

use super::*;

/// The name libibverbs gives a completion status (`IBV_WC_RETRY_EXC_ERR` is "transport retry
/// counter exceeded").
pub fn wc_status_name(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for every value (an "unknown" one for
    // values it does not know).
    let p = unsafe { sys::ibv_wc_status_str(status) };
    if p.is_null() {
        return format!("status {status}");
    }
    // SAFETY: a NUL-terminated static string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

pub(super) struct CqInner {
    pub(super) cq: NonNull<sys::ibv_cq>,
    /// The completion channel of a CQ made with events; destroyed after the CQ.
    pub(super) channel: Option<NonNull<sys::ibv_comp_channel>>,
    pub(super) _ctx: Rc<CtxInner>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq; its queue pairs hold this Rc. Every event taken
        // from the channel was acknowledged when taken, as ibv_destroy_cq requires.
        unsafe { sys::ibv_destroy_cq(self.cq.as_ptr()) };
        if let Some(ch) = self.channel {
            // SAFETY: created by ibv_create_comp_channel; its only CQ is gone.
            unsafe { sys::ibv_destroy_comp_channel(ch.as_ptr()) };
        }
    }
}

/// A completion queue.
pub struct CompletionQueue {
    pub(super) inner: Rc<CqInner>,
}

/// A completion, as verbs reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// The work request id.
    pub wr_id: u64,
    /// `IBV_WC_SUCCESS` is 0.
    pub status: u32,
    /// The verbs opcode.
    pub opcode: u32,
    /// Bytes.
    pub byte_len: u32,
    /// Immediate data, when the completion carries some.
    pub imm: Option<u32>,
    /// The vendor's syndrome of an error completion (a ConnectX's names the cause).
    pub vendor_err: u32,
    /// The local queue pair it belongs to.
    pub qp_num: u32,
}

impl Wc {
    /// What completed, in the UDP transport's terms (None for opcodes it has no name for).
    pub fn kind(&self) -> Option<crate::udp::CompletionKind> {
        use crate::udp::CompletionKind as K;
        use sys::ibv_wc_opcode as op;
        Some(match self.opcode {
            op::IBV_WC_SEND => K::Send,
            op::IBV_WC_RDMA_WRITE => K::Write,
            op::IBV_WC_RDMA_READ => K::Read,
            op::IBV_WC_COMP_SWAP | op::IBV_WC_FETCH_ADD => K::Atomic,
            op::IBV_WC_RECV => K::Recv,
            op::IBV_WC_RECV_RDMA_WITH_IMM => K::RecvWriteImm,
            _ => return None,
        })
    }

    /// Whether it succeeded.
    pub fn is_success(&self) -> bool {
        self.status == sys::ibv_wc_status::IBV_WC_SUCCESS
    }
}

impl CompletionQueue {
    /// Polls up to `out.len()` completions.
    pub fn poll(&self, out: &mut Vec<Wc>, max: usize) -> Result<usize, VerbsError> {
        // SAFETY: plain C structures; all-zero is valid.
        let mut wcs: [sys::ibv_wc; 16] = unsafe { zeroed() };
        let n = max.min(wcs.len()) as i32;
        // SAFETY: the CQ is live and `wcs` has room for `n` entries.
        let got = unsafe { sys::ibv_poll_cq(self.inner.cq.as_ptr(), n, wcs.as_mut_ptr()) };
        if got < 0 {
            // ibv_poll_cq returns a negative number and sets no errno.
            return Err(VerbsError::Verb {
                verb: "ibv_poll_cq",
                source: io::Error::other(format!(
                    "returned {got} (the completion queue overran or is in error)"
                )),
            });
        }
        for wc in &wcs[..got as usize] {
            let with_imm = wc.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
            out.push(Wc {
                wr_id: wc.wr_id,
                status: wc.status,
                opcode: wc.opcode,
                byte_len: wc.byte_len,
                // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate data.
                imm: with_imm
                    .then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })),
                vendor_err: wc.vendor_err,
                qp_num: wc.qp_num,
            });
        }
        Ok(got as usize)
    }

    /// Whether the queue was made with a completion channel.
    pub fn has_events(&self) -> bool {
        self.inner.channel.is_some()
    }

    fn channel(&self) -> Result<NonNull<sys::ibv_comp_channel>, VerbsError> {
        self.inner.channel.ok_or(VerbsError::Invalid(
            "completion event on a CQ made without a channel",
        ))
    }

    /// Asks for an event on the next completion (`ibv_req_notify_cq`). Poll once more after
    /// arming: a completion that came before it raises no event.
    pub fn arm(&self) -> Result<(), VerbsError> {
        self.channel()?;
        // SAFETY: the CQ is live.
        let rc = unsafe { sys::ibv_req_notify_cq(self.inner.cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(rc_err("ibv_req_notify_cq", rc));
        }
        Ok(())
    }

    /// Sleeps until the armed queue raises its event or `timeout` passes; whether an event
    /// came. The event is acknowledged at once; the queue must be armed again for the next.
    pub fn wait(&self, timeout: std::time::Duration) -> Result<bool, VerbsError> {
        let ch = self.channel()?;
        // SAFETY: the channel is live for as long as this queue.
        let fd = unsafe { ch.as_ref().fd };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as i32;
        // SAFETY: one live pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            return no_event_unless("poll(completion channel)", io::ErrorKind::Interrupted);
        }
        if r == 0 {
            return Ok(false);
        }
        let mut cq: *mut sys::ibv_cq = null_mut();
        let mut ctx: *mut std::ffi::c_void = null_mut();
        // SAFETY: the channel is live and non-blocking; the out pointers are valid.
        let rc = unsafe { sys::ibv_get_cq_event(ch.as_ptr(), &mut cq, &mut ctx) };
        if rc != 0 {
            return no_event_unless("ibv_get_cq_event", io::ErrorKind::WouldBlock);
        }
        // SAFETY: `cq` is the queue the event was for (this channel has one queue); one event
        // taken, one acknowledged.
        unsafe { sys::ibv_ack_cq_events(cq, 1) };
        Ok(true)
    }
}

/// No event (`Ok(false)`) if the call that just failed failed with `benign`, else its error.
pub(super) fn no_event_unless(
    verb: &'static str,
    benign: io::ErrorKind,
) -> Result<bool, VerbsError> {
    let source = io::Error::last_os_error();
    if source.kind() == benign {
        Ok(false)
    } else {
        Err(VerbsError::Verb { verb, source })
    }
}
