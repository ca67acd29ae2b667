//! perftest-style bandwidth and latency tests over the UDP transport: `write-bw`, `write-lat`,
//! `send-bw`, `send-lat`, `read-bw`, `read-lat`.
//!
//! A server (no address) waits for one client on a TCP port; the client sends its parameters,
//! both ends create their queue pairs and trade them, then every message size runs as a phase:
//! the client says `go` with its memory keys, the server answers `ready` with its own, the
//! client runs, says `done`, and the server answers `result` saying whether every byte it
//! received was right. Data is a pattern unique per connection and slot, so a misplaced packet
//! fails verification.

mod backend;
mod run;

use crate::oob::{Channel, Message, OobError};
use crate::udp::{self, Access, RemoteAddr};
use backend::{Endpoint, Mr};
use serde_json::json;
use std::fmt;
use std::net::{IpAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use backend::Transport;
pub use run::{BwResult, LatResult};

/// Which test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// RDMA Write bandwidth.
    WriteBw,
    /// RDMA Write latency (ping-pong of Writes with immediate).
    WriteLat,
    /// Send bandwidth.
    SendBw,
    /// Send latency (ping-pong).
    SendLat,
    /// RDMA Read bandwidth.
    ReadBw,
    /// RDMA Read latency.
    ReadLat,
}

impl Test {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write-bw",
            Test::WriteLat => "write-lat",
            Test::SendBw => "send-bw",
            Test::SendLat => "send-lat",
            Test::ReadBw => "read-bw",
            Test::ReadLat => "read-lat",
        }
    }

    /// The test of a name.
    pub fn from_name(s: &str) -> Option<Test> {
        [
            Test::WriteBw,
            Test::WriteLat,
            Test::SendBw,
            Test::SendLat,
            Test::ReadBw,
            Test::ReadLat,
        ]
        .into_iter()
        .find(|t| t.name() == s)
    }

    /// Whether it measures latency.
    pub fn is_latency(self) -> bool {
        matches!(self, Test::WriteLat | Test::SendLat | Test::ReadLat)
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct PerfConfig {
    /// The test.
    pub test: Test,
    /// The server to connect to (client mode), or None (server mode).
    pub server: Option<String>,
    /// TCP port of the exchange.
    pub port: u16,
    /// UDP port to receive data on.
    pub data_port: u16,
    /// Local address to use (default: the one the exchange's TCP connection uses).
    pub bind: Option<IpAddr>,
    /// Message size.
    pub size: usize,
    /// Iterations per connection.
    pub iters: u64,
    /// Run for this long instead of a number of iterations.
    pub duration: Option<Duration>,
    /// Connections.
    pub qps: u32,
    /// Paths per connection.
    pub paths: u8,
    /// Payload bytes per packet; None picks the largest RoCE MTU (256 to 4096) that fits the
    /// local interface's MTU without IP fragmentation.
    pub mtu: Option<u32>,
    /// Packets in flight per path.
    pub window: u32,
    /// UDP transport: the ICRC of the data path, for both ends (the client's choice is the
    /// server's): computed and checked (the default), or neither (`--no-icrc`).
    pub icrc: udp::IcrcMode,
    /// Work requests in flight per connection (bandwidth tests).
    pub tx_depth: u32,
    /// All sizes from 2 bytes to 8 MiB.
    pub all_sizes: bool,
    /// UDP transport: SO_BUSY_POLL on the sockets, no sleeping in the engine's waits, and
    /// bandwidth tests poll without pause (by default they sleep after 200 us without work;
    /// latency tests always spin).
    pub busy_poll: bool,
    /// UDP transport: wait for completions sleeping at once (perftest's `-e`).
    pub use_event: bool,
    /// UDP transport: UDP GSO on sends.
    pub gso: bool,
    /// UDP transport: UDP GRO on receives.
    pub gro: bool,
    /// UDP transport: several datagrams per system call (`sendmmsg`, `recvmmsg`).
    pub batch: bool,
    /// Capture file.
    pub pcap: Option<PathBuf>,
    /// Print a progress line every second on long runs.
    pub progress: bool,
    /// Publish counters for `metaroce stats`.
    pub publish_stats: bool,
    /// Bandwidth tests: worker threads per end, each with its own device (UDP socket and
    /// engine) and its share of the connections.
    pub threads: u32,
    /// Latency tests: every sample in the result (`LatResult::samples_us`), as perftest's `-H`
    /// and `-U` print them.
    pub samples: bool,
    /// The backend.
    pub transport: Transport,
    /// Verbs: the RDMA device (default: the first).
    pub device: Option<String>,
    /// Verbs: the port.
    pub ib_port: u8,
    /// Verbs: the GID index of the local address (RoCEv2 GIDs are often 1 or 3).
    pub gid_index: u8,
    /// Bytes of buffers one end may register for a phase, all connections and workers
    /// together (`--max-memory`): a peer cannot make this end take more.
    pub max_memory: u64,
    /// Server: serve one client and exit, as perftest does (`--once`); otherwise a server that
    /// loses or finishes a client goes back to waiting.
    pub once: bool,
    /// Send data to whatever address the peer names, not only to the address its control
    /// connection comes from (`--allow-data-redirect`; for a data path on another interface).
    pub allow_data_redirect: bool,
}

impl PerfConfig {
    /// perftest's defaults for `test`: 65536 bytes and 5000 iterations for bandwidth, 2 bytes
    /// and 1000 iterations for latency.
    pub fn new(test: Test) -> PerfConfig {
        PerfConfig {
            test,
            server: None,
            port: crate::oob::DEFAULT_PORT,
            data_port: transport_core::wire::ROCEV2_PORT,
            bind: None,
            size: if test.is_latency() { 2 } else { 65536 },
            iters: if test.is_latency() { 1000 } else { 5000 },
            duration: None,
            qps: 1,
            paths: 8,
            mtu: None,
            window: udp::DEFAULT_WINDOW,
            icrc: udp::IcrcMode::Full,
            tx_depth: 128,
            all_sizes: false,
            busy_poll: false,
            use_event: false,
            gso: true,
            gro: true,
            batch: true,
            pcap: None,
            progress: true,
            publish_stats: true,
            threads: 1,
            samples: false,
            transport: Transport::Udp,
            device: None,
            ib_port: 1,
            gid_index: 0,
            max_memory: DEFAULT_MAX_MEMORY,
            once: false,
            allow_data_redirect: false,
        }
    }

    /// The sizes the run covers.
    pub fn sizes(&self) -> Vec<usize> {
        if self.all_sizes {
            (1..=23).map(|i| 1usize << i).collect()
        } else {
            vec![self.size]
        }
    }
}

/// Why a run failed.
#[derive(Debug)]
pub enum PerfError {
    /// The exchange failed.
    Oob(OobError),
    /// The transport failed.
    Transport(udp::Error),
    /// A verb failed.
    #[cfg(feature = "verbs")]
    Verbs(crate::verbs::VerbsError),
    /// A work request completed with an error.
    Completion(String),
    /// Nothing completed for too long.
    Stalled(String),
    /// The two ends disagree on what to run.
    Mismatch(String),
    /// A parameter is out of range.
    Invalid(String),
    /// A phase would take more memory than `--max-memory` allows.
    Memory {
        /// Bytes the phase needs.
        need: u64,
        /// Bytes allowed.
        cap: u64,
    },
    /// A connection came and went without becoming a session (no valid hello in time): a port
    /// scanner, a stranger, another protocol. A server goes on waiting, also with `--once`.
    NoSession(Box<PerfError>),
}

impl fmt::Display for PerfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PerfError::Oob(e) => write!(f, "exchange: {e}"),
            PerfError::Transport(e) => write!(f, "{e}"),
            #[cfg(feature = "verbs")]
            PerfError::Verbs(e) => write!(f, "{e}"),
            PerfError::Completion(m) => write!(f, "completion error: {m}"),
            PerfError::Stalled(m) => write!(f, "stalled: {m}"),
            PerfError::Mismatch(m) => write!(f, "{m}"),
            PerfError::Invalid(m) => write!(f, "{m}"),
            PerfError::Memory { need, cap } => write!(
                f,
                "the phase needs {} MiB of buffers, more than the {} MiB allowed \
                 (--max-memory on the end that refused)",
                need.div_ceil(1 << 20),
                cap >> 20
            ),
            PerfError::NoSession(e) => write!(f, "no session: {e}"),
        }
    }
}

impl std::error::Error for PerfError {}

impl From<OobError> for PerfError {
    fn from(e: OobError) -> Self {
        PerfError::Oob(e)
    }
}

impl From<udp::Error> for PerfError {
    fn from(e: udp::Error) -> Self {
        PerfError::Transport(e)
    }
}

#[cfg(feature = "verbs")]
impl From<crate::verbs::VerbsError> for PerfError {
    fn from(e: crate::verbs::VerbsError) -> Self {
        PerfError::Verbs(e)
    }
}

/// One line of results.
#[derive(Debug, Clone)]
pub enum Report {
    /// A bandwidth phase.
    Bw(BwResult),
    /// A latency phase.
    Lat(LatResult),
}

impl Report {
    /// The JSON object with the documented keys.
    pub fn to_json(&self, test: Test) -> serde_json::Value {
        match self {
            Report::Bw(r) => json!({
                "test": test.name(),
                "bytes": r.size,
                "iterations": r.iterations,
                "total_bytes": r.total_bytes,
                "bw_peak_gbps": r.bw_peak_gbps,
                "bw_avg_gbps": r.bw_avg_gbps,
                "msg_rate_mpps": r.msg_rate_mpps,
                "verified": r.verified,
                "seconds": r.seconds,
                "retransmits": r.retransmits,
                "rnr_retries": r.rnr_retries,
                "ecn_marks_echoed": r.ecn_marks_echoed,
                "cwnd_cuts": r.cwnd_cuts,
                "paths_used": r.paths_used,
                "path_failures": r.path_failures,
            }),
            Report::Lat(r) => {
                let mut v = json!({
                "test": test.name(),
                "bytes": r.size,
                "iterations": r.iterations,
                "t_min_us": r.t_min_us,
                "t_avg_us": r.t_avg_us,
                "p50_us": r.p50_us,
                "p99_us": r.p99_us,
                "p999_us": r.p999_us,
                "t_max_us": r.t_max_us,
                "t_stdev_us": r.t_stdev_us,
                "verified": r.verified,
                });
                if !r.samples_us.is_empty() {
                    v["samples_us"] = json!(r.samples_us);
                }
                v
            }
        }
    }

    /// Whether every byte checked out.
    pub fn verified(&self) -> bool {
        match self {
            Report::Bw(r) => r.verified,
            Report::Lat(r) => r.verified,
        }
    }
}

const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// perftest's table header.
pub fn table_header(test: Test, gbits: bool) -> String {
    if test.is_latency() {
        format!(
            "{RULE}\n #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
        )
    } else {
        let unit = if gbits { "Gb/sec" } else { "MB/sec" };
        format!(
            "{RULE}\n #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"
        )
    }
}

/// perftest's table line.
pub fn table_line(r: &Report, gbits: bool) -> String {
    match r {
        Report::Bw(b) => {
            let conv = |gbps: f64| if gbits { gbps } else { gbps * 1e9 / 8.0 / 1048576.0 };
            format!(
                " {:<10} {:<10}       {:.2}            {:.2}\t\t   {:.6}",
                b.size,
                b.iterations,
                conv(b.bw_peak_gbps),
                conv(b.bw_avg_gbps),
                b.msg_rate_mpps
            )
        }
        Report::Lat(l) => format!(
            " {:<7} {:<10}   {:<7.2}        {:<7.2}      {:<7.2}          {:<7.2}        {:<7.2}         {:<7.2}                {:<7.2}",
            l.size,
            l.iterations,
            l.t_min_us,
            l.t_max_us,
            l.p50_us,
            l.t_avg_us,
            l.t_stdev_us,
            l.p99_us,
            l.p999_us
        ),
    }
}

/// A sample as perftest's `-H` prints it (`%g`: six significant digits, no trailing zeros).
pub fn sample_text(us: f64) -> String {
    if !us.is_finite() || us == 0.0 {
        return format!("{us}");
    }
    let digits = (5 - us.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let s = format!("{us:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A peer's buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RemoteBuf {
    pub va: u64,
    pub rkey: u32,
    pub len: u64,
}

impl RemoteBuf {
    pub fn at(&self, offset: usize) -> RemoteAddr {
        RemoteAddr {
            va: self.va + offset as u64,
            rkey: self.rkey,
        }
    }
}

pub(crate) const ALL_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

/// Message buffers a timed (`-D`) run cycles through per connection: 1 MiB (at least one
/// message). As perftest's cycle buffer and iperf3's single buffer, the memory stays in the
/// cache, so the run measures the transport rather than the host's DRAM: cycling 64 MiB per
/// connection instead cost a veth run 19.5 of 28 Gb/s (every payload read and placed from and
/// to DRAM). A run of `-n` messages keeps one buffer per message (up to `BUF_BYTES`), so that
/// every message's landing place is checked.
const CYCLE_BYTES: usize = 1 << 20;
/// Buffer bytes per connection at most.
const BUF_BYTES: usize = 64 << 20;

/// `--max-memory`'s default: what the largest default phases need (two 64 MiB buffer sets, and
/// send-bw's receive buffers), with room.
pub const DEFAULT_MAX_MEMORY: u64 = 1 << 30;
/// Time allowed for each message of the set-up.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed for the whole set-up, workers included.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Time allowed between phases (the other end may be filling large buffers; its heartbeat
/// shows it is alive meanwhile).
pub(crate) const PHASE_GAP: Duration = Duration::from_secs(60);
/// Longest `-D` a peer may ask for.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Slots (distinct message buffers) per connection for a phase.
pub(crate) fn slots_for(size: usize, iters: u64, qps: u32, duration: bool) -> usize {
    let cap = (BUF_BYTES / qps.max(1) as usize / size.max(1)).max(1);
    if duration {
        cap.min((CYCLE_BYTES / size.max(1)).max(1))
    } else {
        cap.min(iters.max(1) as usize)
    }
}

pub(crate) fn encode_bufs(mrs: &[Mr]) -> String {
    mrs.iter()
        .map(|m| format!("{}:{}:{}", m.addr(), m.rkey(), m.len()))
        .collect::<Vec<_>>()
        .join(",")
}

pub(crate) fn decode_bufs(s: &str) -> Result<Vec<RemoteBuf>, OobError> {
    s.split(',')
        .map(|p| {
            let mut it = p.split(':');
            let mut next = || {
                it.next()
                    .and_then(|x| x.parse::<u64>().ok())
                    .ok_or_else(|| OobError::Field(format!("buffer {p:?}")))
            };
            let (va, rkey, len) = (next()?, next()?, next()?);
            if it.next().is_some() {
                return Err(OobError::Field(format!("buffer {p:?}")));
            }
            Ok(RemoteBuf {
                va,
                rkey: u32::try_from(rkey)
                    .map_err(|_| OobError::Field(format!("rkey of buffer {p:?}")))?,
                len,
            })
        })
        .collect()
}

/// The name of an ICRC mode in the connection exchange (`icrc=full|off`).
fn icrc_name(m: udp::IcrcMode) -> &'static str {
    match m {
        udp::IcrcMode::Off => "off",
        _ => "full",
    }
}

/// Bytes a packet adds to its payload: IP, UDP, BTH, the largest MetaRoCE data headers, pad
/// and ICRC.
fn packet_overhead(ip: IpAddr) -> u32 {
    (if ip.is_ipv4() { 20 } else { 40 }) + 8 + 64
}

/// The payload per packet: `explicit` if it fits the interface of `local_ip`, else the largest
/// RoCE MTU that does (datagrams are never fragmented: a lost fragment loses the packet).
pub fn packet_mtu(explicit: Option<u32>, local_ip: IpAddr) -> Result<u32, PerfError> {
    let link = crate::devices::mtu_of(local_ip).unwrap_or(1500);
    let room = link.saturating_sub(packet_overhead(local_ip));
    let best = [4096u32, 2048, 1024, 512, 256]
        .into_iter()
        .find(|m| *m <= room)
        .ok_or_else(|| PerfError::Invalid(format!("the interface MTU {link} is too small")))?;
    match explicit {
        None => Ok(best),
        Some(m) if m <= room => Ok(m),
        Some(m) => Err(PerfError::Invalid(format!(
            "-m {m} does not fit the MTU {link} of the interface of {local_ip} without \
             fragmentation; the largest RoCE MTU that does is {best}"
        ))),
    }
}

fn validate(cfg: &PerfConfig) -> Result<(), PerfError> {
    if cfg.qps == 0 || cfg.qps > 64 {
        return Err(PerfError::Invalid("-q must be 1 to 64".into()));
    }
    if cfg.paths == 0 || usize::from(cfg.paths) > udp::MAX_PATHS {
        return Err(PerfError::Invalid("--paths must be 1 to 64".into()));
    }
    if cfg.size == 0 && !cfg.all_sizes {
        return Err(PerfError::Invalid("-s must be at least 1".into()));
    }
    if cfg.size > (1 << 30) {
        return Err(PerfError::Invalid("-s must be at most 1 GiB".into()));
    }
    if cfg.iters == 0 && cfg.duration.is_none() {
        return Err(PerfError::Invalid("-n must be at least 1".into()));
    }
    if cfg.threads == 0 || cfg.threads > cfg.qps {
        return Err(PerfError::Invalid(
            "--threads must be at least 1 and at most -q".into(),
        ));
    }
    if cfg.samples && !cfg.test.is_latency() {
        return Err(PerfError::Invalid(
            "-H and -U (every sample) apply to latency tests".into(),
        ));
    }
    if cfg.threads > 1 && cfg.test.is_latency() {
        return Err(PerfError::Invalid(
            "--threads applies to bandwidth tests".into(),
        ));
    }
    if cfg.tx_depth == 0 {
        return Err(PerfError::Invalid("-t must be at least 1".into()));
    }
    if cfg.icrc != udp::IcrcMode::Full && cfg.transport != Transport::Udp {
        return Err(PerfError::Invalid(
            "--no-icrc applies to the UDP transport (a RoCE NIC always sends and checks it)".into(),
        ));
    }
    if cfg.icrc == udp::IcrcMode::SendOnly {
        return Err(PerfError::Invalid(
            "the tools' ICRC is full or off (send-only is for a runner whose NIC checks it)".into(),
        ));
    }
    if cfg.window == 0 || cfg.window > 255 {
        return Err(PerfError::Invalid(
            "the window must be 1 to 255 packets".into(),
        ));
    }
    if cfg.duration.is_some_and(|d| d > MAX_DURATION) {
        return Err(PerfError::Invalid("-D must be at most 24 hours".into()));
    }
    if cfg.transport == Transport::Verbs && cfg.pcap.is_some() {
        return Err(PerfError::Invalid(
            "--pcap captures the UDP transport; over verbs use the NIC's own capture (ibdump, \
             or tcpdump on a ConnectX interface with sniffer mode)"
                .into(),
        ));
    }
    Ok(())
}

/// Runs the client side: connects, runs every phase, returns one report per size. With
/// `threads` > 1, each worker thread runs its own exchange, device and share of the
/// connections, and the reports are added up per size.
pub fn run_client(
    cfg: &PerfConfig,
    mut on_report: impl FnMut(&Report),
) -> Result<Vec<Report>, PerfError> {
    validate(cfg)?;
    // The workers of one client show the server the same session number, so that nobody else
    // can join the session as a worker.
    let session = crate::udp::random_u64();
    if cfg.threads <= 1 {
        return run_client_one(cfg, 1, session, on_report);
    }
    let t = cfg.threads;
    let workers: Vec<_> = (0..t)
        .map(|w| {
            let mut c = cfg.clone();
            c.qps = cfg.qps / t + u32::from(w < cfg.qps % t);
            c.threads = 1;
            c.max_memory = cfg.max_memory / u64::from(t);
            c.progress = cfg.progress && w == 0;
            c.publish_stats = cfg.publish_stats && w == 0;
            std::thread::Builder::new()
                .name(format!("worker{w}"))
                .stack_size(64 << 20)
                .spawn(move || run_client_one(&c, t, session, |_| {}))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| PerfError::Invalid(format!("cannot start a worker thread: {e}")))?;
    let mut all = Vec::new();
    for w in workers {
        let r = w
            .join()
            .map_err(|_| PerfError::Invalid("a worker thread panicked".into()))??;
        all.push(r);
    }
    let merged: Vec<Report> = (0..all[0].len())
        .map(|i| {
            let parts: Vec<&BwResult> = all
                .iter()
                .filter_map(|r| match r.get(i) {
                    Some(Report::Bw(b)) => Some(b),
                    _ => None,
                })
                .collect();
            Report::Bw(BwResult::sum(&parts))
        })
        .collect();
    for r in &merged {
        on_report(r);
    }
    Ok(merged)
}

/// The peer's data address, which must be the address its control connection comes from
/// (unless `--allow-data-redirect`): a peer cannot have this end send its data to a third host.
fn check_data_address(cfg: &PerfConfig, chan: &Channel, data: &str) -> Result<(), PerfError> {
    if cfg.transport != Transport::Udp || cfg.allow_data_redirect {
        return Ok(());
    }
    let addr: std::net::SocketAddr = data
        .parse()
        .map_err(|_| OobError::Field(format!("data address {data:?}")))?;
    let peer = chan.peer_addr().map_err(OobError::Io)?.ip().to_canonical();
    if addr.ip().to_canonical() != peer {
        return Err(PerfError::Mismatch(format!(
            "the peer asks for its data at {addr}, but its control connection comes from {peer} \
             (--allow-data-redirect on this end permits a data path on another address)"
        )));
    }
    Ok(())
}

fn run_client_one(
    cfg: &PerfConfig,
    workers: u32,
    session: u64,
    mut on_report: impl FnMut(&Report),
) -> Result<Vec<Report>, PerfError> {
    validate(cfg)?;
    let host = cfg.server.clone().unwrap_or_default();
    let mut chan = Channel::connect(&host, cfg.port, Duration::from_secs(5))?;
    let local_ip = cfg
        .bind
        .unwrap_or(chan.local_addr().map_err(OobError::Io)?.ip().to_canonical());
    // The server opens its device first (so it gets the data port it asks for, 4791 by
    // default, even when both ends share a host); the client then takes the same port if it is
    // free, any other if not, and sends its queue pairs.
    let mut hello = Message::new("hello")
        .with("test", cfg.test.name())
        .with("transport", cfg.transport.name())
        .with("qps", cfg.qps)
        .with("paths", cfg.paths)
        .with("window", cfg.window)
        .with("icrc", icrc_name(cfg.icrc))
        .with("busy", u8::from(cfg.busy_poll))
        .with("workers", workers)
        .with("session", session);
    if let Some(d) = cfg.duration {
        hello = hello.with("duration_ms", d.as_millis());
    }
    chan.send(&hello)?;
    let reply = chan.expect("hello", Some(MESSAGE_TIMEOUT))?;
    let (peer_data, peer_qps) = (reply.text("data")?, reply.text("qp")?);
    check_data_address(cfg, &chan, peer_data)?;
    let ep = Endpoint::open(cfg, local_ip, true)?;
    let (data, qps) = ep.local_info();
    chan.send(&Message::new("qps").with("data", data).with("qp", qps))?;
    ep.connect(peer_data, peer_qps)?;
    chan.start_heartbeat()?;
    let mut reports = Vec::new();
    for size in cfg.sizes() {
        let r = run::client_phase(cfg, &ep, &mut chan, size)?;
        on_report(&r);
        reports.push(r);
    }
    chan.send(&Message::new("bye"))?;
    ep.finish()?;
    Ok(reports)
}

/// What a server did for one client.
#[derive(Debug, Clone)]
pub struct Served {
    /// The client's test.
    pub test: Test,
    /// Phases run.
    pub phases: u32,
    /// Whether everything the server checked was right.
    pub verified: bool,
    /// Bytes the server checked.
    pub bytes_checked: u64,
    /// The server's counters at the end (`metaroce stats --json` format).
    pub stats: serde_json::Value,
}

impl Served {
    /// The workers' results as one: phases of the slowest, all verified, bytes and counters
    /// added (device counters summed, connections listed together).
    fn sum(parts: Vec<Served>) -> Served {
        let mut out = Served {
            test: parts[0].test,
            phases: parts.iter().map(|p| p.phases).max().unwrap_or(0),
            verified: parts.iter().all(|p| p.verified),
            bytes_checked: parts.iter().map(|p| p.bytes_checked).sum(),
            stats: parts[0].stats.clone(),
        };
        for p in &parts[1..] {
            if let (Some(dev), Some(more)) = (
                out.stats["device"].as_object_mut(),
                p.stats["device"].as_object(),
            ) {
                for (k, v) in more {
                    let sum =
                        dev.get(k).and_then(|x| x.as_u64()).unwrap_or(0) + v.as_u64().unwrap_or(0);
                    dev.insert(k.clone(), sum.into());
                }
            }
            if let (Some(qps), Some(more)) =
                (out.stats["qps"].as_array_mut(), p.stats["qps"].as_array())
            {
                qps.extend(more.iter().cloned());
            }
        }
        out
    }
}

/// Most worker connections one client may run.
const MAX_WORKERS: u32 = 64;

/// Runs the server side for one client on `listener` (and, when the client runs several worker
/// threads, for each of its workers, each in a thread with its own device).
///
/// A connection that fails before its hello is accepted (no valid hello within the set-up time,
/// a hello this server cannot serve, a connection reset while it waited) is answered with an
/// error where possible and returned as [`PerfError::NoSession`]. Every failure after that is
/// the session's. Every worker thread has ended when this returns.
pub fn serve_one(cfg: &PerfConfig, listener: &TcpListener) -> Result<Served, PerfError> {
    let no_session = |e: PerfError| PerfError::NoSession(Box::new(e));
    let mut chan = Channel::accept(listener).map_err(|e| no_session(e.into()))?;
    let setup_until = Instant::now() + SETUP_TIMEOUT;
    let first = chan
        .expect("hello", Some(MESSAGE_TIMEOUT))
        .map_err(PerfError::from)
        .and_then(|h| session_config(cfg, &h));
    let mine = match first {
        Ok(x) => x,
        Err(e) => {
            chan.send_error(&e.to_string());
            return Err(no_session(e));
        }
    };
    let workers = mine.workers;
    if workers == 1 {
        return serve_logged(&mine.cfg, chan, 1, setup_until);
    }
    // The other workers: connections from the same host that name the same session, until all
    // have come or the set-up time is over; anybody else is told the server is busy.
    let session = mine.session;
    let peer_ip = chan.peer_addr().map_err(OobError::Io)?.ip().to_canonical();
    let mut joined = vec![(chan, mine.cfg)];
    while joined.len() < workers as usize {
        let mut c = match Channel::accept_until(listener, setup_until) {
            Ok(c) => c,
            Err(e) => {
                for (c, _) in &mut joined {
                    c.send_error(&format!("not every worker came: {e}"));
                }
                return Err(PerfError::Oob(e));
            }
        };
        let same_host = c
            .peer_addr()
            .is_ok_and(|a| a.ip().to_canonical() == peer_ip);
        let left = setup_until.saturating_duration_since(Instant::now());
        let worker = c
            .expect("hello", Some(left.min(MESSAGE_TIMEOUT)))
            .map_err(PerfError::from)
            .and_then(|h| session_config(cfg, &h));
        match worker {
            Ok(w) if same_host && w.session == session && w.workers == workers => {
                joined.push((c, w.cfg))
            }
            Ok(_) => c.send_error("busy: this server is serving another client"),
            Err(e) => c.send_error(&e.to_string()),
        }
    }
    let mut threads = Vec::new();
    for (w, (chan, mut c)) in joined.into_iter().enumerate() {
        c.publish_stats = cfg.publish_stats && w == 0;
        let t = std::thread::Builder::new()
            .name(format!("server{w}"))
            .stack_size(64 << 20)
            .spawn(move || serve_logged(&c, chan, workers, setup_until));
        match t {
            Ok(t) => threads.push(t),
            // The workers started end on their own: their client cannot run without this one.
            Err(e) => {
                return Err(PerfError::Invalid(format!(
                    "cannot start a worker thread: {e}"
                )))
            }
        }
    }
    // Every worker is waited for, also after one failed (a worker whose client stopped
    // driving it ends at its own deadline), so that none outlives the session.
    let mut parts = Vec::new();
    let mut first_error = None;
    for t in threads {
        match t.join() {
            Ok(Ok(s)) => parts.push(s),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(PerfError::Invalid("a worker thread panicked".into()));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(Served::sum(parts)),
    }
}

/// What a client's hello asks of this server, checked.
struct SessionConfig {
    /// This end's configuration for the session (or for one of its workers).
    cfg: PerfConfig,
    /// Worker connections of the client.
    workers: u32,
    /// The number its workers name (0 when it has one).
    session: u64,
}

/// Checks a hello against what this server runs and against the limits, before anything is
/// opened for it.
fn session_config(cfg: &PerfConfig, hello: &Message) -> Result<SessionConfig, PerfError> {
    let test_name = hello.text("test")?;
    let test = Test::from_name(test_name)
        .ok_or_else(|| PerfError::Mismatch(format!("unknown test {test_name:?}")))?;
    if test != cfg.test {
        return Err(PerfError::Mismatch(format!(
            "the server runs {}, the client asked for {}",
            cfg.test.name(),
            test.name()
        )));
    }
    // A client from before the field existed speaks udp.
    let transport = hello.text("transport").unwrap_or("udp");
    if transport != cfg.transport.name() {
        return Err(PerfError::Mismatch(format!(
            "the server runs over {}, the client asked for {transport}",
            cfg.transport.name()
        )));
    }
    let workers: u32 = hello.get("workers")?;
    if workers == 0 || workers > MAX_WORKERS {
        return Err(PerfError::Invalid(format!(
            "workers={workers}: 1 to {MAX_WORKERS}"
        )));
    }
    let session = if workers > 1 {
        hello.get("session")?
    } else {
        0
    };
    let mut mine = cfg.clone();
    // The client decides how many workers there are; each server thread serves one of them,
    // with its share of the memory.
    mine.threads = 1;
    mine.max_memory = cfg.max_memory / u64::from(workers);
    mine.qps = hello.get("qps")?;
    mine.paths = hello.get("paths")?;
    mine.window = hello.get("window")?;
    // A client from before the field existed sends and checks the ICRC.
    mine.icrc = match hello.text("icrc").unwrap_or("full") {
        "full" => udp::IcrcMode::Full,
        "off" => udp::IcrcMode::Off,
        other => {
            return Err(PerfError::Mismatch(format!(
                "unknown ICRC mode {other:?} (full or off)"
            )))
        }
    };
    mine.duration = match hello.text("duration_ms") {
        Ok(_) => Some(Duration::from_millis(hello.get("duration_ms")?)),
        Err(_) => None,
    };
    validate(&mine)?;
    Ok(SessionConfig {
        cfg: mine,
        workers,
        session,
    })
}

fn serve_logged(
    mine: &PerfConfig,
    mut chan: Channel,
    workers: u32,
    setup_until: Instant,
) -> Result<Served, PerfError> {
    let r = serve_channel(mine, &mut chan, workers, setup_until);
    if let Err(e) = &r {
        chan.send_error(&e.to_string());
    }
    r
}

/// Serves one (worker) connection whose hello `session_config` accepted as `mine`.
fn serve_channel(
    mine: &PerfConfig,
    chan: &mut Channel,
    workers: u32,
    setup_until: Instant,
) -> Result<Served, PerfError> {
    let local_ip = mine
        .bind
        .unwrap_or(chan.local_addr().map_err(OobError::Io)?.ip().to_canonical());
    // Several workers share the host: the first takes the data port, the others any port.
    let ep = Endpoint::open(mine, local_ip, workers > 1)?;
    let (data, qps) = ep.local_info();
    chan.send(&Message::new("hello").with("data", data).with("qp", qps))?;
    let left = setup_until.saturating_duration_since(Instant::now());
    let qps = chan.expect("qps", Some(left.min(MESSAGE_TIMEOUT)))?;
    check_data_address(mine, chan, qps.text("data")?)?;
    ep.connect(qps.text("data")?, qps.text("qp")?)?;
    chan.start_heartbeat()?;
    let mut served = Served {
        test: mine.test,
        phases: 0,
        verified: true,
        bytes_checked: 0,
        stats: serde_json::Value::Null,
    };
    loop {
        let m = run::next_message(&ep, chan, PHASE_GAP)?;
        match m.verb.as_str() {
            "go" => {
                let (ok, bytes) = run::server_phase(mine, &ep, chan, &m)?;
                served.phases += 1;
                served.verified &= ok;
                served.bytes_checked += bytes;
            }
            "bye" => {
                served.stats = ep.stats_json(&format!("metaroce {} server", mine.test.name()));
                break;
            }
            other => {
                return Err(PerfError::Invalid(format!("unexpected {other}")));
            }
        }
    }
    ep.finish()?;
    Ok(served)
}

/// Fills `out` with the pattern of connection `qp`, slot `slot`, phase seed `seed`.
pub(crate) fn pattern(out: &mut [u8], seed: u64, qp: usize, slot: usize) {
    let mut s = seed ^ ((qp as u64) << 40) ^ ((slot as u64) << 8) ^ 0x5851_f42d_4c95_7f2d;
    for chunk in out.chunks_mut(8) {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests;
