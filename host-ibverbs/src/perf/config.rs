//! What a test runs: the test, its parameters, and their checks (`validate`, the packet size).

use super::*;

/// The rate controller a test runs (`--cc`; docs/CONGESTION.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cc {
    /// ECN AIMD on each path's window (the default of clients from before `--cc`).
    EcnAimd,
    /// MetaRoCE: path and connection windows, and the receiver's rate hint (the default).
    #[default]
    MetaRoce,
    /// DCQCN with ConnectX firmware defaults.
    Dcqcn,
    /// DCQCN with the paper's parameters.
    DcqcnPaper,
    /// Timely.
    Timely,
    /// Swift.
    Swift,
}

impl Cc {
    /// Every controller, by the name the command line and the exchange use.
    pub const ALL: [Cc; 6] = [
        Cc::EcnAimd,
        Cc::MetaRoce,
        Cc::Dcqcn,
        Cc::DcqcnPaper,
        Cc::Timely,
        Cc::Swift,
    ];

    /// The name the command line and the exchange use.
    pub fn name(self) -> &'static str {
        match self {
            Cc::EcnAimd => "ecn-aimd",
            Cc::MetaRoce => "metaroce",
            Cc::Dcqcn => "dcqcn",
            Cc::DcqcnPaper => "dcqcn-paper",
            Cc::Timely => "timely",
            Cc::Swift => "swift",
        }
    }

    /// The controller named `s`.
    pub fn from_name(s: &str) -> Option<Cc> {
        Cc::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Whether the controller's windows grow on unmarked ACKs (ECN AIMD, MetaRoCE): only then
    /// does a window start below its maximum.
    pub fn grows_windows(self) -> bool {
        matches!(self, Cc::EcnAimd | Cc::MetaRoce)
    }

    /// The core's controller at line rate `line_mbps` (the rate-based ones start there) and a
    /// window of `window` packets per path.
    pub fn algorithm(self, line_mbps: u32, window: u32) -> transport_core::rate::Algorithm {
        use transport_core::rate::{Algorithm, DcqcnParams, SwiftParams, TimelyParams};
        match self {
            Cc::EcnAimd => Algorithm::EcnAimd,
            Cc::MetaRoce => Algorithm::MetaRoce,
            Cc::Dcqcn => Algorithm::Dcqcn(DcqcnParams::vendor(line_mbps)),
            Cc::DcqcnPaper => Algorithm::Dcqcn(DcqcnParams::paper(line_mbps)),
            Cc::Timely => Algorithm::Timely(TimelyParams::paper(line_mbps)),
            Cc::Swift => Algorithm::Swift(SwiftParams::htsim(window)),
        }
    }
}

/// The line rate the rate-based controllers start from when `--line-rate` is not given, Mb/s.
pub const DEFAULT_LINE_MBPS: u32 = 100_000;

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
    /// Atomic bandwidth: compare-and-swap or fetch-and-add on one 8-byte word of the peer.
    AtomicBw,
    /// Atomic latency: one atomic at a time.
    AtomicLat,
}

/// The atomic operation of the atomic tests (perftest's `-A`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtomicKind {
    /// Fetch-and-add of 1: the k-th operation on the word returns k.
    #[default]
    FetchAndAdd,
    /// Compare-and-swap of k with k + 1: as an increment when every operation finds what it
    /// expects, so the k-th returns k again.
    CmpAndSwap,
}

impl AtomicKind {
    /// perftest's name (`FETCH_AND_ADD`, `CMP_AND_SWAP`).
    pub fn name(self) -> &'static str {
        match self {
            AtomicKind::FetchAndAdd => "FETCH_AND_ADD",
            AtomicKind::CmpAndSwap => "CMP_AND_SWAP",
        }
    }

    /// The `n`-th operation on a word that every operation increments (from 0).
    pub fn op(self, n: u64) -> crate::udp::WrOp {
        match self {
            AtomicKind::FetchAndAdd => crate::udp::WrOp::FetchAdd(1),
            AtomicKind::CmpAndSwap => crate::udp::WrOp::CompareSwap {
                compare: n,
                swap: n.wrapping_add(1),
            },
        }
    }
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
            Test::AtomicBw => "atomic-bw",
            Test::AtomicLat => "atomic-lat",
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
            Test::AtomicBw,
            Test::AtomicLat,
        ]
        .into_iter()
        .find(|t| t.name() == s)
    }

    /// Whether it measures latency.
    pub fn is_latency(self) -> bool {
        matches!(
            self,
            Test::WriteLat | Test::SendLat | Test::ReadLat | Test::AtomicLat
        )
    }

    /// Whether it runs atomics (8 bytes each).
    pub fn is_atomic(self) -> bool {
        matches!(self, Test::AtomicBw | Test::AtomicLat)
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
    /// Payload bytes per packet; None: the largest that fits the local interface's MTU without
    /// IP fragmentation, in multiples of 64 bytes, up to [`MAX_DEFAULT_PAYLOAD`] ([`payload_for`]).
    pub mtu: Option<u32>,
    /// A server: the payload the client sends (its hello's `payload`); this end's packets carry
    /// no more, so that Read responses and answers fit the path the client's do.
    pub peer_payload: Option<u32>,
    /// Packets in flight per path at most; None: see [`windows`]. The client's is the server's.
    pub window: Option<u32>,
    /// Where each path's window starts, packets; None: see [`windows`]. The client's is the
    /// server's.
    pub start_window: Option<u32>,
    /// UDP transport: the rate controller, for both ends (the client's choice is the server's).
    pub cc: Cc,
    /// UDP transport: this end's line rate, Mb/s (0: not given). A receiver gives each sender
    /// its max-min share of it in every ACK; a rate-based controller starts from it.
    pub line_rate_mbps: u32,
    /// UDP transport, with a line rate: the fair-share table shared with the other engines
    /// (processes, worker threads) receiving on the same address at the same line rate
    /// (`udp::share_table`); None, each engine divides the line among its own connections.
    pub share_table: Option<PathBuf>,
    /// UDP transport: the ICRC of the data path, for both ends (the client's choice is the
    /// server's): computed and checked (`--icrc`), or neither (`--no-icrc`). None: the client
    /// chooses ([`icrc_for`]): off when the server is on this host and no capture is written
    /// (the datagrams never leave memory, where the kernel checksums neither UDP nor TCP),
    /// computed and checked otherwise. A server runs the client's choice, but one that keeps the
    /// ICRC (its own `--icrc` or `--pcap`) keeps it over a choice left to the address and refuses
    /// a client's `--no-icrc`.
    pub icrc: Option<udp::IcrcMode>,
    /// Work requests in flight per connection (bandwidth tests).
    pub tx_depth: u32,
    /// Read and atomic requests outstanding per connection at most (perftest's `-o`): the UDP
    /// transport's initiator depth (`udp::QpAttr::max_rd_atomic`); on verbs, `max_rd_atomic`
    /// and `max_dest_rd_atomic`, no more than the device allows.
    pub outs: u8,
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
    /// UDP transport: copy every payload next to its headers before sending it (off: large
    /// payloads leave from their regions; `udp::DeviceConfig::copy_send`).
    pub copy_send: bool,
    /// UDP transport: packets in a row a path takes once picked (`udp::QpAttr::spray_burst`).
    pub spray_burst: u8,
    /// UDP transport: UDP GRO on receives.
    pub gro: bool,
    /// UDP transport: datagrams through an AF_XDP socket (`udp::DeviceConfig::xdp`).
    pub xdp: bool,
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
    /// Verbs: the GID index of the local address; `None` takes the best RoCE v2 one of the
    /// port (`gids::best_gid`), as perftest does.
    pub gid_index: Option<u8>,
    /// The traffic class of the connections: on RoCE v2 the GRH's, the IP header's DSCP and ECN
    /// byte; on the UDP transport its DSCP (ECN stays ECT(0)).
    pub tclass: u8,
    /// Verbs: the service level (the VLAN PCP on RoCE), 0 to 15; the UDP transport: the
    /// sockets' priority, 0 to 6.
    pub sl: u8,
    /// Atomic tests: the operation.
    pub atomic: AtomicKind,
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
            size: if test.is_atomic() {
                8
            } else if test.is_latency() {
                2
            } else {
                65536
            },
            iters: if test.is_latency() { 1000 } else { 5000 },
            duration: None,
            qps: 1,
            paths: 8,
            mtu: None,
            peer_payload: None,
            window: None,
            start_window: None,
            icrc: None,
            cc: Cc::MetaRoce,
            line_rate_mbps: 0,
            share_table: None,
            tx_depth: 128,
            outs: udp::DEFAULT_MAX_RD_ATOMIC,
            all_sizes: false,
            busy_poll: false,
            use_event: false,
            gso: true,
            copy_send: false,
            spray_burst: udp::DEFAULT_SPRAY_BURST,
            gro: true,
            xdp: false,
            batch: true,
            pcap: None,
            progress: true,
            publish_stats: true,
            threads: 1,
            samples: false,
            transport: Transport::Udp,
            device: None,
            ib_port: 1,
            gid_index: None,
            tclass: 0,
            sl: 0,
            atomic: AtomicKind::FetchAndAdd,
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

/// A server's payload: its own (`own`, what its interface fits) or the client's (`peer`, from
/// its hello), whichever is less, so that it sends no larger packets than its client does; never
/// below 256 bytes, whatever a hello says.
pub fn payload_with_peer(own: u32, peer: Option<u32>) -> u32 {
    own.min(peer.unwrap_or(u32::MAX).max(256))
}

/// The ICRC a client runs, and has its server run, toward `peer` from `local`: the one chosen
/// (`--icrc`, `--no-icrc`), else none between two ends on this host (a loopback address, or the
/// server on an address of this host, which the route gives as the local one), where the
/// datagrams go from memory to memory and the kernel checks no UDP or TCP checksum either, unless
/// a capture is written (`--pcap`: what it holds should read as the wire, ICRC and all, in any
/// RoCE dissector) or the data may go elsewhere than the control connection
/// (`--allow-data-redirect`) or the AF_XDP datapath runs (`--xdp`: its arrivals are checked by
/// no UDP checksum); the ICRC everywhere else. A server that keeps it (its own `--icrc`
/// or `--pcap`) overrides a mode left to the address in its answer.
pub fn icrc_for(cfg: &PerfConfig, local: IpAddr, peer: IpAddr) -> udp::IcrcMode {
    if let Some(m) = cfg.icrc {
        return m;
    }
    let (local, peer) = (local.to_canonical(), peer.to_canonical());
    let same_host = peer.is_loopback() || peer == local;
    // With --allow-data-redirect the data may go elsewhere than the control connection.
    if cfg.transport == Transport::Udp
        && same_host
        && cfg.pcap.is_none()
        && !cfg.xdp
        && !cfg.allow_data_redirect
    {
        udp::IcrcMode::Off
    } else {
        udp::IcrcMode::Full
    }
}

/// The ICRC a client runs once the server answered: `asked` when the client chose it; when the
/// client left it to the address, the ICRC if the server keeps it (its answer says `full`, or, from
/// a server before the field, says nothing), never the other way: a server cannot turn off what
/// the address kept.
pub fn icrc_after_answer(asked: udp::IcrcMode, auto: bool, answer: Option<&str>) -> udp::IcrcMode {
    if auto && answer != Some("off") {
        udp::IcrcMode::Full
    } else {
        asked
    }
}

/// The name of an ICRC mode in the connection exchange (`icrc=full|off`).
pub(super) fn icrc_name(m: udp::IcrcMode) -> &'static str {
    match m {
        udp::IcrcMode::Off => "off",
        _ => "full",
    }
}

/// Bytes a packet adds to its payload: IP, UDP, BTH, the largest MetaRoCE data headers, pad
/// and ICRC.
fn packet_overhead(ipv4: bool) -> u32 {
    (if ipv4 { 20 } else { 40 }) + 8 + 64
}

/// Bytes in flight by default at most on all the connections of one engine (a worker thread's
/// socket) together, where few connections share it ([`path_window_bytes`]).
pub const FLIGHT_BYTES: u32 = 4 << 20;

/// Bytes in flight by default at most on one path ([`path_window_bytes`]).
pub const MAX_PATH_WINDOW_BYTES: u32 = 512 << 10;

/// The byte budget of a path's window by default: [`FLIGHT_BYTES`] shared by the paths of the
/// connections one engine drives (`qps`: with `--threads` each worker runs with its own share and
/// one thread), from [`udp::DEFAULT_WINDOW_BYTES`] to [`MAX_PATH_WINDOW_BYTES`]: 512 KiB a path
/// for one connection of 8 paths, 256 KiB for two, and from four connections (or 32 paths) on
/// the 128 KiB of before, so that more connections put more in flight, as they did before. A
/// round trip across a host's kernels holds the time the receiving process waits for a CPU: one
/// connection at 128 KiB a path moved 11% less idle across a veth at MTU 1500 and 18% less
/// beside two busy loops than at 255 packets (359 KiB; medians of six alternating rounds), where
/// four connections with 2.7 times the flight each once had timeouts fire with nothing dropped
/// (docs/BENCHMARKS.md).
pub fn path_window_bytes(cfg: &PerfConfig) -> u32 {
    let paths = cfg.qps.max(1).saturating_mul(u32::from(cfg.paths.max(1)));
    (FLIGHT_BYTES / paths).clamp(udp::DEFAULT_WINDOW_BYTES, MAX_PATH_WINDOW_BYTES)
}

/// The window per path at most and where it starts, packets, for `payload`-byte packets. Given
/// (`--window`), both are it. By default, with a controller whose windows grow (ECN AIMD,
/// MetaRoCE), [`path_window_bytes`] of packets at most (`udp::window_of`; one connection of 8
/// paths: 255 of 1408 bytes (MTU 1500), 128 of 4096, 58 of 8896 (MTU 9000), 32 of 16 KiB; from
/// 4 connections: 93 of 1408, 64 of 4096, 16 of 8896 or 16 KiB),
/// starting at 32 KiB of packets (`udp::start_window_for`: 32 of 1024 bytes, 23 of 1408, 8 of
/// 4096, 2 of 16 KiB), the flight a shared bottleneck's queue was measured to take from four
/// senders (docs/BENCHMARKS.md: four clients through a 2 MB queue lost their fair shares when
/// each started at 128 of 1024 bytes); with the others, whose rate or own window is the control
/// and this only a cap, 32 packets or the 128 KiB of `udp::window_for`, whichever is less (16 of
/// 8896 or 16 KiB: a cap in bytes as well, so that the flight before the first cut does not grow
/// with the payload; on loopback DCQCN and Swift moved the same at 16 and 32 of 16 KiB).
pub fn windows(cfg: &PerfConfig, payload: u32) -> (u32, u32) {
    match cfg.window {
        Some(w) => (w, cfg.start_window.unwrap_or(w).min(w)),
        None if cfg.cc.grows_windows() => {
            let max = udp::window_of(path_window_bytes(cfg), payload);
            (
                max,
                cfg.start_window
                    .unwrap_or(udp::start_window_for(payload))
                    .min(max),
            )
        }
        None => {
            let cap = udp::window_for(payload).min(udp::DEFAULT_WINDOW);
            (cap, cap)
        }
    }
}

/// The default payload per packet of the UDP transport at most, bytes. Larger packets cost less
/// a byte on every end (fewer headers to build, parse and acknowledge, fewer packets a system call
/// carries): on loopback 16 KiB moved 1.22x what 4096 did (docs/BENCHMARKS.md, "Payloads that fill
/// the link"); beyond it GSO carries fewer packets a call (three of 16 KiB in 64 KB) and the rate
/// fell again, and a lost packet costs more to send again.
pub const MAX_DEFAULT_PAYLOAD: u32 = 16 * 1024;

/// The payload per packet: `explicit` if it fits the interface of `local_ip`, else the largest
/// that does (datagrams are never fragmented: a lost fragment loses the packet).
pub fn packet_mtu(explicit: Option<u32>, local_ip: IpAddr) -> Result<u32, PerfError> {
    let link = crate::devices::mtu_of(local_ip).unwrap_or(1500);
    payload_for(explicit, link, local_ip.is_ipv4())
}

/// [`packet_mtu`] for an interface MTU of `link` bytes. By default the UDP transport fills the
/// link: the largest multiple of 64 bytes that fits beside the headers (IP, UDP and the largest
/// MetaRoCE header set), up to [`MAX_DEFAULT_PAYLOAD`], 1408 bytes at MTU 1500 and 8896 at 9000
/// over IPv4. Unlike a RoCE NIC's it need not be a power of two: every packet says where its
/// payload goes, and a receiver takes any size up to 64 KB, whatever its own default.
pub fn payload_for(explicit: Option<u32>, link: u32, ipv4: bool) -> Result<u32, PerfError> {
    let overhead = packet_overhead(ipv4);
    // Within the transport's largest payload too (a loopback MTU of 65536 leaves more room).
    let room = link.saturating_sub(overhead).min(udp::MAX_MTU);
    let best = (room / 64 * 64).min(MAX_DEFAULT_PAYLOAD);
    if best < 256 {
        return Err(PerfError::Invalid(format!(
            "the interface MTU {link} is too small: a packet needs room for 256 bytes of payload \
             and {overhead} of headers"
        )));
    }
    match explicit {
        None => Ok(best),
        Some(m) if m <= room => Ok(m),
        Some(m) if m > udp::MAX_MTU => Err(PerfError::Invalid(format!(
            "-m {m} is more than the transport's largest payload, {}",
            udp::MAX_MTU
        ))),
        Some(m) => Err(PerfError::Invalid(format!(
            "-m {m} does not fit the MTU {link} of the interface without fragmentation; the \
             largest payload that does is {room}"
        ))),
    }
}

pub(super) fn validate(cfg: &PerfConfig) -> Result<(), PerfError> {
    if cfg.qps == 0 || cfg.qps > 64 {
        return Err(PerfError::Invalid("-q must be 1 to 64".into()));
    }
    if cfg.paths == 0 || usize::from(cfg.paths) > udp::MAX_PATHS {
        return Err(PerfError::Invalid("--paths must be 1 to 64".into()));
    }
    if cfg.test.is_atomic() && (cfg.size != 8 || cfg.all_sizes) {
        return Err(PerfError::Invalid(
            "atomic tests move 8 bytes each: -s 8, and no -a".into(),
        ));
    }
    if cfg.transport == Transport::Udp && cfg.sl > 6 {
        return Err(PerfError::Invalid(
            "-S on the UDP transport is the socket priority, 0 to 6 (higher needs CAP_NET_ADMIN)"
                .into(),
        ));
    }
    if cfg.test == Test::SendBw && cfg.all_sizes && cfg.duration.is_some() {
        // A timed phase cannot know how many receives its Sends take; those left posted would
        // take the next, larger size's first Sends (too short, in the old phase's memory).
        return Err(PerfError::Invalid(
            "send-bw cannot combine -a with -D: a timed phase leaves receives posted for the \
             next size (use -n)"
                .into(),
        ));
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
    if cfg.xdp && cfg.transport != Transport::Udp {
        return Err(PerfError::Invalid(
            "--xdp applies to the UDP transport".into(),
        ));
    }
    if cfg.xdp && cfg.threads > 1 {
        return Err(PerfError::Invalid(
            "--xdp takes one worker thread (an interface's queue takes one AF_XDP socket)".into(),
        ));
    }
    if cfg.xdp && cfg.icrc == Some(udp::IcrcMode::Off) {
        return Err(PerfError::Invalid(
            "--xdp needs the ICRC: no UDP checksum is checked on the frames it reads (no \
             --no-icrc)"
                .into(),
        ));
    }
    if cfg.icrc.is_some_and(|m| m != udp::IcrcMode::Full) && cfg.transport != Transport::Udp {
        return Err(PerfError::Invalid(
            "--no-icrc applies to the UDP transport (a RoCE NIC always sends and checks it)".into(),
        ));
    }
    if cfg.cc != Cc::default() && cfg.transport != Transport::Udp {
        return Err(PerfError::Invalid(
            "--cc applies to the UDP transport (a RoCE NIC runs its own)".into(),
        ));
    }
    if cfg.icrc == Some(udp::IcrcMode::SendOnly) {
        return Err(PerfError::Invalid(
            "the tools' ICRC is full or off (send-only is for a runner whose NIC checks it)".into(),
        ));
    }
    if cfg.window.is_some_and(|w| w == 0 || w > 255)
        || cfg.start_window.is_some_and(|w| w == 0 || w > 255)
    {
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
