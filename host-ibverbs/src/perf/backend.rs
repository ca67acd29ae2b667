//! What the tests run on: the UDP transport, or libibverbs on an RDMA NIC (feature `verbs`).
//! Both offer the same few things to the test code: memory regions it can fill and check,
//! posting sends and receives on the n-th connection, polling completions, and the strings the
//! two ends trade to connect.

use super::{PerfConfig, PerfError, ALL_ACCESS};
use crate::oob::OobError;
use crate::udp::{self, RemoteAddr, WorkCompletion, WrOp};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

mod open;
pub(crate) mod verbs_addr;
use open::*;

/// Which backend carries a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// MetaRoCE over UDP sockets (runs anywhere).
    Udp,
    /// libibverbs on an RDMA NIC (RoCEv2 RC queue pairs).
    Verbs,
}

impl Transport {
    /// The name the exchange and the command line use.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Verbs => "verbs",
        }
    }

    /// The transport named `s`.
    pub fn from_name(s: &str) -> Option<Transport> {
        match s {
            "udp" => Some(Transport::Udp),
            "verbs" => Some(Transport::Verbs),
            _ => None,
        }
    }
}

/// A verbs scatter-gather length (32 bits).
#[cfg(feature = "verbs")]
fn verbs_len(len: usize) -> Result<u32, PerfError> {
    u32::try_from(len).map_err(|_| PerfError::Invalid("message larger than 4 GiB".into()))
}

/// A registered memory region of either backend.
pub(crate) enum Mr {
    Udp(udp::MemoryRegion),
    #[cfg(feature = "verbs")]
    Verbs(crate::verbs::MemoryRegion),
}

impl Mr {
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), PerfError> {
        match self {
            Mr::Udp(m) => m.write(offset, data).map_err(PerfError::from),
            #[cfg(feature = "verbs")]
            Mr::Verbs(m) => m.write(offset, data).map_err(PerfError::from),
        }
    }

    /// Copies `out.len()` bytes at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), PerfError> {
        match self {
            Mr::Udp(m) => m.read(offset, out).map_err(PerfError::from),
            #[cfg(feature = "verbs")]
            Mr::Verbs(m) => m.read(offset, out).map_err(PerfError::from),
        }
    }

    /// Whether the region holds `data` at `offset` (false when the range is outside it).
    pub fn equals(&self, offset: usize, data: &[u8]) -> bool {
        match self {
            Mr::Udp(m) => m.equals(offset, data).unwrap_or(false),
            #[cfg(feature = "verbs")]
            Mr::Verbs(m) => {
                let mut got = vec![0u8; data.len()];
                m.read(offset, &mut got).is_ok() && got == data
            }
        }
    }

    pub fn addr(&self) -> u64 {
        match self {
            Mr::Udp(m) => m.addr(),
            #[cfg(feature = "verbs")]
            Mr::Verbs(m) => m.addr(),
        }
    }

    pub fn rkey(&self) -> u32 {
        match self {
            Mr::Udp(m) => m.rkey(),
            #[cfg(feature = "verbs")]
            Mr::Verbs(m) => m.rkey(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Mr::Udp(m) => m.len(),
            #[cfg(feature = "verbs")]
            Mr::Verbs(m) => m.len(),
        }
    }
}

struct UdpEp {
    ctx: udp::Context,
    pd: udp::ProtectionDomain,
    cq: udp::CompletionQueue,
    qps: Vec<udp::QueuePair>,
    /// What an empty poll does.
    wait: Wait,
    /// Since when polls have found nothing to do (adaptive waiting).
    idle_since: std::cell::Cell<Option<std::time::Instant>>,
    /// Whether this thread waits for a CPU (adaptive waiting then sleeps at once).
    cpu_wait: std::cell::RefCell<udp::cpu_wait::CpuWait>,
    /// Payload bytes per packet.
    payload: u32,
}

/// What an empty poll of the UDP transport does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Returns at once (`--busy-poll`): the loop spins, as perftest's does.
    Spin,
    /// Spins while there was work within [`SPIN_BUDGET`], then sleeps on the sockets until a
    /// datagram or a timer (the default): a software transport must not take the CPU that the
    /// kernel needs to carry its packets, nor the peer's on a shared host. While the thread has
    /// lately waited for a CPU (other tasks want the host's CPUs: `udp::cpu_wait`), it sleeps
    /// as soon as it has nothing to do.
    Adaptive,
    /// Sleeps on the sockets at once (`-e`, perftest's `--use_event`).
    Event,
}

/// How long an empty poll waits (sleeping) before returning nothing.
const EVENT_WAIT: Duration = Duration::from_millis(1);
/// How long adaptive waiting spins after the last work before it sleeps: far above a round trip
/// on one host (2-10 us) and above the gaps of a bulk transfer on loopback (50 us lost 9% of
/// write-bw there: a sleeping end takes tens of microseconds to wake), far below a timeout.
const SPIN_BUDGET: Duration = Duration::from_micros(200);

#[cfg(feature = "verbs")]
struct VerbsEp {
    // Field order is drop order: queue pairs before the CQ and PD, all before the device.
    qps: Vec<crate::verbs::QueuePair>,
    cq: crate::verbs::CompletionQueue,
    pd: crate::verbs::ProtectionDomain,
    ctx: crate::verbs::Context,
    port: u8,
    gid_index: u8,
    /// What this end offers the peer: its GID, the GID's type and its MTU.
    local: verbs_addr::VerbsAddr,
    /// The traffic class and service level of the connections.
    tclass: u8,
    sl: u8,
    /// Reads and atomics this end has in flight per connection (the device's limit, at most 16,
    /// and `-o`).
    rd_atomic: u8,
    /// Reads and atomics this end takes from the peer per connection (the device's limit, at
    /// most 16; not `-o`, which is the requester's choice).
    dest_rd_atomic: u8,
    /// Access of regions and queue pairs: remote atomics only where the device has them.
    access: crate::udp::Access,
    psns: Vec<u32>,
    /// Scratch for polling.
    wcs: std::cell::RefCell<Vec<crate::verbs::Wc>>,
    /// An empty poll sleeps on the completion channel (perftest's `-e`).
    use_event: bool,
}

enum Be {
    Udp(UdpEp),
    #[cfg(feature = "verbs")]
    Verbs(VerbsEp),
}

/// One end's device, protection domain, completion queue and connections.
pub(crate) struct Endpoint {
    be: Be,
}

impl Endpoint {
    /// Opens the backend `cfg` names with `cfg.qps` connections (not yet connected).
    /// `local_ip` is the UDP transport's address; with `fallback_port` it takes any UDP port
    /// when the data port is taken (both ends on one host).
    pub fn open(
        cfg: &PerfConfig,
        local_ip: IpAddr,
        fallback_port: bool,
    ) -> Result<Endpoint, PerfError> {
        match cfg.transport {
            Transport::Udp => open_udp(cfg, local_ip, fallback_port),
            Transport::Verbs => open_verbs(cfg),
        }
    }

    /// Connections.
    pub fn len(&self) -> usize {
        match &self.be {
            Be::Udp(u) => u.qps.len(),
            #[cfg(feature = "verbs")]
            Be::Verbs(v) => v.qps.len(),
        }
    }

    /// Ordered streams per connection the tests spread messages over (RC has one).
    pub fn streams(&self) -> usize {
        match &self.be {
            Be::Udp(_) => udp::STREAMS,
            #[cfg(feature = "verbs")]
            Be::Verbs(_) => 1,
        }
    }

    pub fn reg_mr(&self, len: usize) -> Result<Mr, PerfError> {
        match &self.be {
            Be::Udp(u) => Ok(Mr::Udp(u.pd.reg_mr(len, ALL_ACCESS)?)),
            #[cfg(feature = "verbs")]
            Be::Verbs(v) => {
                // Pinned memory counts against RLIMIT_MEMLOCK: say so before ibv_reg_mr fails
                // with a bare ENOMEM.
                let pinned = crate::memlock::pinned_bytes();
                crate::memlock::check(pinned + len as u64)
                    .map_err(|e| PerfError::Invalid(e.to_string()))?;
                let mr = v.pd.reg_mr(len, v.access).map_err(|e| match e {
                    crate::verbs::VerbsError::Verb { source, .. }
                        if source.raw_os_error() == Some(libc::ENOMEM) =>
                    {
                        PerfError::Invalid(format!(
                            "ibv_reg_mr of {len} bytes: {source} (with {pinned} bytes pinned \
                             before: the locked-memory limit, `ulimit -l`, or the NIC's \
                             translation tables are full)"
                        ))
                    }
                    e => e.into(),
                })?;
                Ok(Mr::Verbs(mr))
            }
        }
    }

    /// Posts `op` on connection `qp` from `len` bytes at `offset` of `mr`. `Ok(false)`: the
    /// send queue is full, try again after polling.
    #[allow(clippy::too_many_arguments)]
    pub fn post_send(
        &self,
        qp: usize,
        wr_id: u64,
        op: WrOp,
        stream: u16,
        mr: &Mr,
        offset: usize,
        len: usize,
        remote: RemoteAddr,
    ) -> Result<bool, PerfError> {
        match (&self.be, mr) {
            (Be::Udp(u), Mr::Udp(m)) => {
                let wr = udp::SendWr {
                    wr_id,
                    op,
                    stream,
                    local: m.sge(offset, len),
                    remote,
                };
                match u.qps[qp].post_send(&wr) {
                    Ok(()) => Ok(true),
                    Err(e)
                        if matches!(
                            e.kind,
                            udp::ErrorKind::Post(transport_core::conn::PostError::QueueFull)
                        ) =>
                    {
                        Ok(false)
                    }
                    Err(e) => Err(e.into()),
                }
            }
            #[cfg(feature = "verbs")]
            (Be::Verbs(v), Mr::Verbs(m)) => {
                let len = verbs_len(len)?;
                let wr = crate::verbs::SendWr {
                    wr_id,
                    op,
                    mr: m,
                    offset,
                    len,
                    remote,
                };
                match v.qps[qp].post_send(&wr) {
                    Ok(()) => Ok(true),
                    Err(crate::verbs::VerbsError::Verb { source, .. })
                        if source.raw_os_error() == Some(libc::ENOMEM) =>
                    {
                        Ok(false)
                    }
                    Err(e) => Err(e.into()),
                }
            }
            #[cfg(feature = "verbs")]
            _ => Err(PerfError::Invalid("a region of the other backend".into())),
        }
    }

    /// Posts a receive on connection `qp` into `len` bytes at `offset` of `mr`.
    pub fn post_recv(
        &self,
        qp: usize,
        wr_id: u64,
        stream: u16,
        mr: &Mr,
        offset: usize,
        len: usize,
    ) -> Result<(), PerfError> {
        match (&self.be, mr) {
            (Be::Udp(u), Mr::Udp(m)) => {
                u.qps[qp].post_recv(wr_id, stream, m.sge(offset, len))?;
                Ok(())
            }
            #[cfg(feature = "verbs")]
            (Be::Verbs(v), Mr::Verbs(m)) => {
                let len = verbs_len(len)?;
                v.qps[qp].post_recv(wr_id, m, offset, len)?;
                Ok(())
            }
            #[cfg(feature = "verbs")]
            _ => Err(PerfError::Invalid("a region of the other backend".into())),
        }
    }

    /// Appends up to `max` completions to `out`. A verbs completion with an error status is an
    /// error here; the UDP transport's refusals come back as completions (see `check`).
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize, PerfError> {
        match &self.be {
            Be::Udp(u) => {
                let (n, active) = u.cq.poll_active(out, max);
                if n > 0 || active || max == 0 {
                    u.idle_since.set(None);
                    return Ok(n);
                }
                match u.wait {
                    Wait::Spin => return Ok(0),
                    Wait::Event => {}
                    Wait::Adaptive => {
                        let now = std::time::Instant::now();
                        let since = *u.idle_since.get().get_or_insert(now);
                        u.idle_since.set(Some(since));
                        if now - since < SPIN_BUDGET && !u.cpu_wait.borrow_mut().contended(now) {
                            return Ok(0);
                        }
                    }
                }
                // Sleep until a completion comes (or a short while passes), then take what is
                // there with it.
                match u.cq.wait(EVENT_WAIT) {
                    Some(wc) => {
                        // Work again: spin again.
                        u.idle_since.set(None);
                        out.push(wc);
                        // What else is there, without another round: the ACKs the arrivals
                        // call for then wait for the tool's answers to carry them.
                        Ok(1 + u.cq.take_ready(out, max - 1))
                    }
                    None => Ok(0),
                }
            }
            #[cfg(feature = "verbs")]
            Be::Verbs(v) => {
                let mut wcs = v.wcs.borrow_mut();
                wcs.clear();
                let mut n = v.cq.poll(&mut wcs, max)?;
                if n == 0 && v.use_event && max > 0 {
                    // Arm, look once more (what completed before the arming raises no event),
                    // then sleep on the channel until the event or a short while passes.
                    v.cq.arm()?;
                    n = v.cq.poll(&mut wcs, max)?;
                    if n == 0 && v.cq.wait(EVENT_WAIT)? {
                        n = v.cq.poll(&mut wcs, max)?;
                    }
                }
                for wc in wcs.iter() {
                    if let Some(q) = v.qps.iter().find(|q| q.qpn() == wc.qp_num) {
                        q.completed(wc.wr_id);
                    }
                    if !wc.is_success() {
                        return Err(PerfError::Completion(format!(
                            "work request {:#x} on QP {:#x}: {} (status {}, vendor syndrome \
                             {:#x})",
                            wc.wr_id,
                            wc.qp_num,
                            crate::verbs::wc_status_name(wc.status),
                            wc.status,
                            wc.vendor_err
                        )));
                    }
                    let kind = wc.kind().ok_or_else(|| {
                        PerfError::Completion(format!("unexpected opcode {}", wc.opcode))
                    })?;
                    out.push(WorkCompletion {
                        wr_id: wc.wr_id,
                        status: transport_core::conn::Status::Success,
                        kind,
                        byte_len: wc.byte_len,
                        imm: wc.imm,
                        qp_num: 0,
                        stream: 0,
                    });
                }
                Ok(n)
            }
        }
    }

    /// Before a phase of `size`-byte messages: UDP GRO on if the phase wants it
    /// ([`open::phase_gro`]; once on, it stays on for the later phases).
    pub fn prepare_phase(&self, cfg: &PerfConfig, size: usize) {
        match &self.be {
            Be::Udp(u) => {
                if phase_gro(cfg, size, u.payload) {
                    u.ctx.enable_gro();
                }
            }
            #[cfg(feature = "verbs")]
            Be::Verbs(_) => {}
        }
    }

    /// Whether the UDP transport's receive socket coalesces arrivals now (false on verbs).
    #[cfg(test)]
    pub fn gro(&self) -> bool {
        match &self.be {
            Be::Udp(u) => u.ctx.gro(),
            #[cfg(feature = "verbs")]
            Be::Verbs(_) => false,
        }
    }

    /// Lets the transport work for up to `wait` (the NIC needs nothing: a short sleep).
    pub fn progress(&self, wait: Duration) {
        match &self.be {
            Be::Udp(u) => {
                u.ctx.progress(wait);
            }
            #[cfg(feature = "verbs")]
            Be::Verbs(_) => std::thread::sleep(wait.min(Duration::from_micros(200))),
        }
    }

    /// Whether connection `qp` has nothing left to send or acknowledge (the NIC's ACKs are its
    /// own business: always true).
    pub fn is_idle(&self, qp: usize) -> bool {
        match &self.be {
            Be::Udp(u) => u.qps[qp].is_idle(),
            #[cfg(feature = "verbs")]
            Be::Verbs(_) => {
                let _ = qp;
                true
            }
        }
    }

    /// The connections' counters (none for verbs: the NIC keeps its own, see `ethtool -S`).
    pub fn conn_counters(&self) -> Vec<transport_core::conn::Counters> {
        match &self.be {
            Be::Udp(u) => u.qps.iter().map(|q| q.counters()).collect(),
            #[cfg(feature = "verbs")]
            Be::Verbs(_) => Vec::new(),
        }
    }

    /// Each connection's rate controller (none for verbs).
    pub fn conn_rates(&self) -> Vec<super::run::ConnRate> {
        match &self.be {
            Be::Udp(u) => u
                .ctx
                .snapshot()
                .iter()
                .map(|q| super::run::ConnRate {
                    rate_mbps: q.rate.rate_mbps,
                    connection_window: q.rate.connection_window,
                    hint_received_mbps: q.rate.hint_received_mbps,
                    path_windows: q.paths.iter().map(|p| p.cwnd).collect(),
                })
                .collect(),
            #[cfg(feature = "verbs")]
            Be::Verbs(_) => Vec::new(),
        }
    }

    /// Paths that carried packets, on the connection that used the fewest (1 for verbs).
    pub fn paths_used(&self) -> usize {
        match &self.be {
            Be::Udp(u) => u
                .ctx
                .snapshot()
                .iter()
                .map(|q| q.paths.iter().filter(|p| p.sent > 0).count())
                .min()
                .unwrap_or(0),
            #[cfg(feature = "verbs")]
            Be::Verbs(_) => 1,
        }
    }

    /// The device counters, for messages about stalls.
    pub fn describe(&self) -> String {
        match &self.be {
            // The engine's counters, then each connection's: its counters, paths and rate.
            Be::Udp(u) => format!(
                "{:?}; connections: {:?}",
                u.ctx.counters(),
                u.ctx.snapshot()
            ),
            #[cfg(feature = "verbs")]
            Be::Verbs(v) => format!(
                "verbs device {} (see its ethtool -S counters)",
                v.ctx.name()
            ),
        }
    }

    /// The snapshot `metaroce stats` shows.
    pub fn stats_json(&self, name: &str) -> serde_json::Value {
        self.stats_parts().to_json(name)
    }

    /// What `stats_json` is made of, taken without formatting anything: cheap enough for a
    /// measuring loop, and `Send`, so the formatting and the file can be left to another thread.
    pub fn stats_parts(&self) -> StatsParts {
        match &self.be {
            Be::Udp(u) => StatsParts::Udp(Box::new(u.ctx.counters()), u.ctx.snapshot()),
            #[cfg(feature = "verbs")]
            Be::Verbs(v) => StatsParts::Verbs(v.ctx.name().to_string()),
        }
    }

    /// What the peer needs to reach this end: the data address and the queue pairs
    /// (`qpn:psn,...`). For verbs the address is this port's GID in hex.
    pub fn local_info(&self) -> (String, String) {
        match &self.be {
            Be::Udp(u) => (
                u.ctx.local_addr().to_string(),
                u.qps
                    .iter()
                    .map(|q| {
                        let i = q.info();
                        format!("{}:{}:{}", i.qpn, i.psn, i.path_seq)
                    })
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            #[cfg(feature = "verbs")]
            Be::Verbs(v) => (
                v.local.encode(),
                v.qps
                    .iter()
                    .zip(&v.psns)
                    .map(|(q, psn)| format!("{}:{psn}", q.qpn()))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        }
    }

    /// Connects every connection to the peer's, from what its `local_info` said.
    pub fn connect(&self, data: &str, qps: &str) -> Result<(), PerfError> {
        let peers = decode_qps(qps)?;
        if peers.len() != self.len() {
            return Err(PerfError::Mismatch(format!(
                "the peer has {} connections, this end {}",
                peers.len(),
                self.len()
            )));
        }
        match &self.be {
            Be::Udp(u) => {
                let addr: SocketAddr = data
                    .parse()
                    .map_err(|_| OobError::Field(format!("data address {data:?}")))?;
                for (q, peer) in u.qps.iter().zip(peers) {
                    let path_seq = peer.path_seq.ok_or_else(|| {
                        OobError::Field("a queue pair without its path sequence".into())
                    })?;
                    q.connect(&udp::QpInfo {
                        qpn: peer.qpn,
                        psn: peer.psn,
                        path_seq,
                        addr,
                    })?;
                }
                Ok(())
            }
            #[cfg(feature = "verbs")]
            Be::Verbs(v) => {
                let peer_addr = verbs_addr::VerbsAddr::decode(data)?;
                let mtu = verbs_addr::agree(&v.local, &peer_addr).map_err(PerfError::Mismatch)?;
                let mtu = verbs_addr::mtu_enum(mtu).ok_or_else(|| {
                    PerfError::Mismatch(format!("no path MTU agreed ({mtu} bytes)"))
                })?;
                for ((q, peer), my_psn) in v.qps.iter().zip(peers).zip(&v.psns) {
                    q.connect(
                        v.access,
                        &crate::verbs::RtrAttr {
                            dest_qpn: peer.qpn,
                            rq_psn: peer.psn,
                            dgid: peer_addr.gid,
                            sgid_index: v.gid_index,
                            mtu,
                            port: v.port,
                            traffic_class: v.tclass,
                            sl: v.sl,
                            max_dest_rd_atomic: v.dest_rd_atomic,
                        },
                        &crate::verbs::RtsAttr {
                            sq_psn: *my_psn,
                            timeout: 14,
                            retry_cnt: 7,
                            rnr_retry: 7,
                            max_rd_atomic: v.rd_atomic,
                        },
                    )?;
                }
                Ok(())
            }
        }
    }

    /// Flushes the capture file, if any.
    pub fn finish(&self) -> Result<(), PerfError> {
        match &self.be {
            Be::Udp(u) => u
                .ctx
                .finish_pcap()
                .map_err(|e| PerfError::Invalid(format!("capture: {e}"))),
            #[cfg(feature = "verbs")]
            Be::Verbs(_) => Ok(()),
        }
    }
}

/// An endpoint's counters as taken by [`Endpoint::stats_parts`].
pub enum StatsParts {
    /// The UDP transport: device counters and each connected queue pair.
    Udp(Box<udp::stats::EngineCounters>, Vec<udp::stats::QpSnapshot>),
    /// A verbs device, by name (its counters are the kernel's: `rdma statistic`).
    #[cfg(feature = "verbs")]
    Verbs(String),
}

impl StatsParts {
    /// The snapshot `metaroce stats` reads, for the endpoint called `name`.
    pub fn to_json(&self, name: &str) -> serde_json::Value {
        match self {
            StatsParts::Udp(counters, qps) => {
                udp::stats::to_json(std::process::id(), name, counters, qps)
            }
            #[cfg(feature = "verbs")]
            StatsParts::Verbs(device) => serde_json::json!({
                "pid": std::process::id(),
                "name": name,
                "device": { "verbs_device": device },
                "qps": [],
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever queue pair list a peer sends, it decodes or is refused with a clear error.
        #[test]
        fn any_queue_pair_list_decodes_or_is_refused(text in "[0-9:,x]{0,80}") {
            if let Err(e) = decode_qps(&text) {
                proptest::prop_assert!(e.to_string().contains("qp"), "{}", e);
            }
        }
    }

    #[test]
    fn queue_pair_lists_parse_and_bad_ones_are_named() {
        let qp = |qpn, psn, path_seq| PeerQp { qpn, psn, path_seq };
        assert_eq!(
            decode_qps("1:2,300:4:4294967295").unwrap(),
            vec![qp(1, 2, None), qp(300, 4, Some(u32::MAX))]
        );
        for bad in [
            "",
            "1",
            "x:2",
            "1:y",
            "1:2,",
            "1:2:z",
            "1:2:3:4",
            "16777216:0",
            "1:16777216",
        ] {
            let e = decode_qps(bad).unwrap_err().to_string();
            assert!(e.contains("qp") || e.contains("psn"), "{bad:?}: {e}");
        }
    }

    /// A latency test's spinning ends open without GRO and the kernel's arrival times; one that
    /// sleeps (-e) and every bandwidth test keep both, and `--no-gro` turns GRO off.
    #[test]
    fn spinning_latency_ends_open_without_gro_and_arrival_times() {
        use super::super::Test;
        let ip = IpAddr::from([127, 0, 0, 1]);
        for (test, use_event, gro, want) in [
            (Test::WriteLat, false, true, (false, false)),
            (Test::ReadLat, false, true, (false, false)),
            (Test::SendLat, false, true, (false, false)),
            (Test::AtomicLat, false, true, (false, false)),
            (Test::WriteLat, true, true, (true, true)),
            (Test::WriteBw, false, true, (true, true)),
            (Test::ReadBw, true, true, (true, true)),
            (Test::WriteBw, false, false, (false, true)),
        ] {
            let mut cfg = PerfConfig::new(test);
            cfg.use_event = use_event;
            cfg.gro = gro;
            let dc = device_config(&cfg, ip);
            assert_eq!((dc.gro, dc.arrival_times), want, "{test:?} -e {use_event}");
        }
    }

    /// A phase turns GRO on the device's receive socket on for a spinning latency test's
    /// messages longer than a packet, and it stays on (what it coalesced may still be queued);
    /// every other test has it from the start; never on against `--no-gro`. Phase after phase
    /// on one device, as `-a` runs them.
    #[test]
    fn a_phase_sets_gro_by_its_message_size() {
        use super::super::Test;
        let ip = IpAddr::from([127, 0, 0, 1]);
        let big = 1 << 20;
        for (test, use_event, gro, phases) in [
            (
                Test::WriteLat,
                false,
                true,
                &[(2, false), (2, false), (big, true), (2, true)][..],
            ),
            (Test::ReadLat, false, true, &[(64, false), (big, true)][..]),
            (Test::WriteLat, true, true, &[(2, true), (big, true)][..]),
            (Test::WriteBw, false, true, &[(2, true), (big, true)][..]),
            (
                Test::WriteLat,
                false,
                false,
                &[(big, false), (2, false)][..],
            ),
            (Test::WriteBw, false, false, &[(65536, false)][..]),
        ] {
            let mut cfg = PerfConfig::new(test);
            cfg.data_port = 0;
            cfg.use_event = use_event;
            cfg.gro = gro;
            let ep = Endpoint::open(&cfg, ip, false).unwrap();
            for &(size, want) in phases {
                ep.prepare_phase(&cfg, size);
                assert_eq!(
                    ep.gro(),
                    want,
                    "{test:?} -e {use_event} gro {gro} size {size}"
                );
            }
        }
    }

    /// A bandwidth test's idle poll spins for its budget while the CPU is free (one round of
    /// the engine, no sleep), and sleeps at once (until a datagram, or the wait's millisecond)
    /// while the thread waits for a CPU. Judged by the engine's rounds and the time a sleep
    /// takes at least, not by the thread's voluntary switches alone: under qemu-user (the aarch64
    /// run) a thread that never sleeps still blocks on the emulator's own locks. A thread that
    /// the scheduler took off its CPU for the whole wait (a busy host) may not have slept itself:
    /// the voluntary switch is asked for only of a poll the scheduler left alone.
    #[test]
    fn an_idle_poll_sleeps_at_once_when_the_cpu_is_contended() {
        use super::super::Test;
        let ip = IpAddr::from([127, 0, 0, 1]);
        let mut cfg = PerfConfig::new(Test::WriteBw);
        cfg.data_port = 0;
        let ep = Endpoint::open(&cfg, ip, false).unwrap();
        // (Without the verbs feature the backend has one kind.)
        #[allow(irrefutable_let_patterns)]
        let Be::Udp(u) = &ep.be
        else {
            panic!("the UDP transport")
        };
        let mut wcs = Vec::new();
        for contended in [false, true] {
            u.cpu_wait.borrow_mut().force(contended);
            u.idle_since.set(None);
            let rounds = u.ctx.counters().rounds;
            let ((sw, isw), t) = (
                crate::udp::cpu_wait::context_switches(),
                std::time::Instant::now(),
            );
            assert_eq!(ep.poll(&mut wcs, 16).unwrap(), 0);
            let (sw2, isw2) = crate::udp::cpu_wait::context_switches();
            let (slept, preempted, took) = (sw2 - sw, isw2 - isw, t.elapsed());
            let rounds = u.ctx.counters().rounds - rounds;
            let seen = format!(
                "{rounds} rounds, {slept} voluntary and {preempted} involuntary switches, {took:?}"
            );
            if contended {
                assert!(
                    rounds >= 2,
                    "contended: the poll goes on into a wait ({seen})"
                );
                assert!(
                    slept >= 1 || preempted >= 1,
                    "contended: the first empty poll sleeps ({seen})"
                );
                assert!(
                    took >= EVENT_WAIT,
                    "contended: it sleeps the wait out ({seen})"
                );
            } else {
                assert_eq!(rounds, 1, "free: the first empty poll spins ({seen})");
            }
        }
    }

    #[test]
    fn transports_are_named_both_ways() {
        for t in [Transport::Udp, Transport::Verbs] {
            assert_eq!(Transport::from_name(t.name()), Some(t));
        }
        assert_eq!(Transport::from_name("tcp"), None);
    }
}
