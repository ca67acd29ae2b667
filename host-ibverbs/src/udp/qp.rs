//! Queue pairs and their work requests: posting sends, receives, Writes, Reads and atomics.

use super::*;

pub(super) struct QpInner {
    pub(super) pd: Rc<PdInner>,
    pub(super) _cq: Rc<CqShared>,
    pub(super) qpn: u32,
    pub(super) psn: u32,
    pub(super) seed: u32,
    pub(super) path_seq: u32,
    pub(super) probe_seq: u32,
    pub(super) attr: QpAttr,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        let qpn = self.qpn;
        self.pd.ctx.with(|e| {
            if let Some(qp) = e.qps.remove(&qpn) {
                e.release.extend(qp.pending.into_keepalives());
            }
        });
    }
}

/// A scatter-gather element: `len` bytes at `offset` of a memory region.
#[derive(Clone, Copy)]
pub struct Sge<'a> {
    /// The region.
    pub mr: &'a MemoryRegion,
    /// Offset in it.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

/// A send-queue work request.
#[derive(Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: WrOp,
    /// The ordered stream (below [`STREAMS`]).
    pub stream: u16,
    /// Local memory: the source of a Send or Write, the destination of a Read or an atomic's
    /// original value.
    pub local: Sge<'a>,
    /// Peer memory (Write, Read, atomics).
    pub remote: RemoteAddr,
}

/// A queue pair: one MetaRoCE connection with its paths and streams.
pub struct QueuePair {
    pub(super) inner: Rc<QpInner>,
}

impl QueuePair {
    /// Its number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// What the peer needs to connect to it.
    pub fn info(&self) -> QpInfo {
        QpInfo {
            qpn: self.inner.qpn,
            psn: self.inner.psn,
            path_seq: self.inner.path_seq,
            addr: self.inner.pd.ctx.local_addr(),
        }
    }

    /// Connects it to the peer's queue pair (Verbs' RTR and RTS in one step).
    pub fn connect(&self, remote: &QpInfo) -> Result<(), Error> {
        let ctx = &self.inner.pd.ctx;
        let local = ctx.local_addr();
        if local.is_ipv4() != remote.addr.is_ipv4() {
            return Err(Error::new("connect", ErrorKind::AddressFamily));
        }
        if remote.qpn > 0x00ff_ffff || remote.psn > 0x00ff_ffff {
            return Err(Error::new("connect", ErrorKind::Invalid("peer QPN or PSN")));
        }
        let a = self.inner.attr;
        let mut cfg = Config::new(
            local.ip(),
            remote.addr.ip(),
            Qpn::new(self.inner.qpn),
            Qpn::new(remote.qpn),
        );
        cfg.pkey = a.pkey;
        cfg.dst_port = remote.addr.port();
        cfg.local_port = local.port();
        cfg.paths = a.paths;
        cfg.mtu = a.mtu;
        cfg.entropy_seed = self.inner.seed;
        cfg.initial_psn = Psn::new(self.inner.psn);
        cfg.peer_initial_psn = Psn::new(remote.psn);
        cfg.initial_path_seq = self.inner.path_seq;
        cfg.peer_initial_path_seq = remote.path_seq;
        cfg.initial_probe_seq = self.inner.probe_seq;
        cfg.window_per_path = a.window_per_path;
        cfg.start_window_per_path = a.start_window_per_path;
        cfg.rto_low = a.rto_low;
        cfg.rto_high = a.rto_high;
        cfg.probe_interval = a.probe_interval;
        cfg.ack_delay = a.ack_delay;
        cfg.timeouts_to_probe = 3;
        cfg.icrc = a.icrc;
        cfg.cc = a.cc;
        cfg.icrc_engine = crc_engine::engine();
        cfg.spray_burst = a.spray_burst;
        cfg.max_rd_atomic = a.max_rd_atomic;
        let qpn = self.inner.qpn;
        let pd = self.inner.pd.id;
        ctx.with(|e| {
            let regions = e.regions_of(pd);
            let qp = e
                .qps
                .get_mut(&qpn)
                .ok_or(Error::new("connect", ErrorKind::NoSuchQp(qpn)))?;
            if qp.conn.is_some() {
                return Err(Error::new("connect", ErrorKind::AlreadyConnected));
            }
            if e.xdp.is_some() && cfg.icrc != IcrcMode::Full {
                // Nothing checks the UDP checksum of a frame the AF_XDP socket hands over.
                return Err(Error::new(
                    "connect",
                    ErrorKind::Invalid(
                        "ICRC mode: the AF_XDP datapath checks arrivals by the full ICRC alone",
                    ),
                ));
            }
            let mut conn = Box::new(engine::Conn::new(cfg));
            for r in regions {
                conn.register(r)
                    .map_err(|err| Error::new("connect", ErrorKind::Region(err)))?;
            }
            qp.conn = Some(conn);
            qp.peer = Some(remote.addr);
            e.deadline_stale = true;
            Ok(())
        })
    }

    pub(super) fn check_local(
        &self,
        op: &'static str,
        sge: &Sge<'_>,
        write: bool,
    ) -> Result<(), Error> {
        if !Rc::ptr_eq(&sge.mr.inner.pd, &self.inner.pd) {
            return Err(Error::new(op, ErrorKind::WrongProtectionDomain));
        }
        sge.mr.check(op, sge.offset, sge.len)?;
        if write && !sge.mr.inner.access.grants(Access::LOCAL_WRITE) {
            return Err(Error::new(op, ErrorKind::NoLocalWrite));
        }
        Ok(())
    }

    /// Posts a work request on the send queue.
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<(), Error> {
        const OP: &str = "post_send";
        let writes_local = matches!(
            wr.op,
            WrOp::Read | WrOp::CompareSwap { .. } | WrOp::FetchAdd(_)
        );
        self.check_local(OP, &wr.local, writes_local)?;
        let len = u32::try_from(wr.local.len).map_err(|_| {
            Error::new(
                OP,
                ErrorKind::Post(transport_core::conn::PostError::BadLength),
            )
        })?;
        let local_addr = wr.local.mr.addr() + wr.local.offset as u64;
        self.post(OP, wr.wr_id, wr.local.mr, true, |conn, id, now| {
            conn.post(
                now,
                WorkRequest {
                    id,
                    op: wr.op,
                    stream: wr.stream,
                    local_addr,
                    len,
                    remote: wr.remote,
                },
            )
        })
    }

    /// Posts a receive buffer for the next message on `stream`.
    pub fn post_recv(&self, wr_id: u64, stream: u16, local: Sge<'_>) -> Result<(), Error> {
        const OP: &str = "post_recv";
        self.check_local(OP, &local, true)?;
        let len = u32::try_from(local.len).map_err(|_| {
            Error::new(
                OP,
                ErrorKind::Post(transport_core::conn::PostError::BadLength),
            )
        })?;
        let addr = local.mr.addr() + local.offset as u64;
        self.post(OP, wr_id, local.mr, false, |conn, id, _| {
            conn.post_recv(RecvRequest {
                id,
                stream,
                addr,
                len,
            })
        })
    }

    /// Hands a request to the connection under a fresh internal id and remembers the caller's
    /// id and the region to keep alive until it completes.
    pub(super) fn post(
        &self,
        op: &'static str,
        user_id: u64,
        mr: &MemoryRegion,
        doorbell: bool,
        f: impl FnOnce(
            &mut engine::Conn,
            u64,
            transport_core::time::Instant,
        ) -> Result<(), transport_core::conn::PostError>,
    ) -> Result<(), Error> {
        let keep: engine::Keepalive = mr.inner.clone();
        let qpn = self.inner.qpn;
        self.inner.pd.ctx.with(|e| {
            let now = e.stamp();
            let qp = e
                .qps
                .get_mut(&qpn)
                .ok_or(Error::new(op, ErrorKind::NoSuchQp(qpn)))?;
            let conn = qp
                .conn
                .as_mut()
                .ok_or(Error::new(op, ErrorKind::NotConnected))?;
            let id = qp.pending.next_id();
            f(conn, id, now).map_err(|p| Error::new(op, ErrorKind::Post(p)))?;
            qp.pending.insert(Pending { user_id, keep });
            e.deadline_stale = true;
            if doorbell {
                e.kick(qpn, now);
            }
            Ok(())
        })
    }

    /// Moves every path of the connection to source port `first + i` (what a path failure
    /// does, one new port each), for the tests of what the engine keeps per port.
    #[cfg(test)]
    pub(crate) fn move_paths(&self, first: u16) {
        let qpn = self.inner.qpn;
        self.inner.pd.ctx.with(|e| {
            if let Some(conn) = e.qps.get_mut(&qpn).and_then(|q| q.conn.as_mut()) {
                for i in 0..conn.config().paths {
                    let path = transport_core::conn::PathId(i);
                    conn.bind_path_port(path, first.wrapping_add(u16::from(i)));
                }
            }
        })
    }

    /// Whether everything posted has been acknowledged and nothing is left to send.
    pub fn is_idle(&self) -> bool {
        let qpn = self.inner.qpn;
        self.inner.pd.ctx.with(|e| {
            e.qps
                .get(&qpn)
                .and_then(|q| q.conn.as_ref())
                .is_none_or(|c| c.is_idle())
        })
    }

    /// The connection's counters (zero before it connects).
    pub fn counters(&self) -> transport_core::conn::Counters {
        let qpn = self.inner.qpn;
        self.inner.pd.ctx.with(|e| {
            e.qps
                .get(&qpn)
                .and_then(|q| q.conn.as_ref())
                .map(|c| *c.counters())
                .unwrap_or_default()
        })
    }
}
