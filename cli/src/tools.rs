//! The perftest-shaped commands, `devices`, `stats` and `loopback`.

use host_ibverbs::devices;
use host_ibverbs::perf::{self, PerfConfig, PerfError, Report, Test};
use host_ibverbs::udp::stats;
use std::io::{self, Write};
use std::net::{IpAddr, TcpListener};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The rate controllers by name, for other commands.
pub fn cc_name_parser() -> impl clap::builder::TypedValueParser<Value = perf::Cc> {
    cc_parser()
}

/// The rate controllers by the names the exchange uses (`perf::Cc::name`).
fn cc_parser() -> impl clap::builder::TypedValueParser<Value = perf::Cc> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(perf::Cc::ALL.map(perf::Cc::name))
        .map(|s| perf::Cc::from_name(&s).unwrap_or_default())
}

/// A line rate in Gb/s, as Mb/s.
fn parse_gbps(s: &str) -> Result<u32, String> {
    match s.trim().parse::<f64>() {
        Ok(g) if g > 0.0 && g <= 4_000.0 => Ok((g * 1000.0).round() as u32),
        _ => Err(format!(
            "{s:?} is not a line rate (Gb/s, above 0 and at most 4000)"
        )),
    }
}

/// The atomic operations by perftest's names.
fn atomic_parser() -> impl clap::builder::TypedValueParser<Value = perf::AtomicKind> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["FETCH_AND_ADD", "CMP_AND_SWAP"]).map(|s| {
        if s == "CMP_AND_SWAP" {
            perf::AtomicKind::CmpAndSwap
        } else {
            perf::AtomicKind::FetchAndAdd
        }
    })
}

/// The backends by the names the exchange uses (`perf::Transport::name`).
fn transport_parser() -> impl clap::builder::TypedValueParser<Value = perf::Transport> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["udp", "verbs"])
        .map(|s| perf::Transport::from_name(&s).unwrap_or(perf::Transport::Udp))
}

/// perftest's flags, where they apply.
#[derive(clap::Args, Debug, Clone)]
pub struct PerfArgs {
    /// The server to connect to; without it, run as the server and wait for one client.
    pub server: Option<String>,
    /// Device: an RDMA device with --transport verbs, a network interface (its address is used)
    /// with --transport udp.
    #[arg(short = 'd', long = "ib-dev")]
    pub device: Option<String>,
    /// Message size in bytes.
    #[arg(short = 's', long = "size")]
    pub size: Option<usize>,
    /// Iterations per connection.
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<f64>,
    /// Connections (queue pairs).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// TCP port of the connection exchange.
    #[arg(short = 'p', long = "port", default_value_t = host_ibverbs::oob::DEFAULT_PORT)]
    pub port: u16,
    /// Accepted for perftest compatibility (there is no CPU frequency check to silence).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Report bandwidth in Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Run every size from 2 bytes to 8 MiB.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Work requests in flight per connection (bandwidth tests).
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    pub tx_depth: u32,
    /// Read and atomic requests outstanding per connection at most (the initiator depth); on
    /// verbs no more than the device allows, and 16 at most.
    #[arg(short = 'o', long = "outs", default_value_t = host_ibverbs::udp::DEFAULT_MAX_RD_ATOMIC,
          value_parser = clap::value_parser!(u8).range(1..))]
    pub outs: u8,
    /// Payload bytes per packet. Verbs: a RoCE MTU (256 to 4096), by default the port's. UDP
    /// transport: by default the largest multiple of 64 bytes that fits the interface without IP
    /// fragmentation, up to 16 KiB (1408 at MTU 1500, 8896 at 9000); a receiver takes any size,
    /// whatever its own.
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,
    /// Paths per connection, each with its own UDP source port.
    #[arg(long, default_value_t = 8)]
    pub paths: u8,
    /// Packets in flight per path (1 to 255). By default up to 4 MiB of packets shared by the
    /// paths of the connections a thread drives, 128 KiB to 512 KiB a path (or 64 packets where
    /// they fit in 256 KiB), 16 to 255 packets (one connection of 8 paths: 255 at the 1408-byte
    /// payload of MTU 1500, 58 at 8896, 32 at 16 KiB; from four: 93, 16, 16), starting at 32 KiB
    /// of packets (2 to 32) and growing while nothing is marked.
    #[arg(long)]
    pub window: Option<u32>,
    /// The backend: udp (MetaRoCE over UDP sockets, runs anywhere) or verbs (libibverbs on an
    /// RDMA NIC, RoCEv2 RC queue pairs).
    #[arg(long, value_parser = transport_parser(), default_value = "udp")]
    pub transport: perf::Transport,
    /// Verbs: the port of the RDMA device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Verbs: the GID index of the local address (`metaroce devices` lists them). By default
    /// the port's best RoCE v2 GID, IPv4 before IPv6, as perftest chooses it.
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<u8>,
    /// The traffic class: on RoCE v2 the IP header's DSCP and ECN byte (a fabric's lossless or
    /// ECN-marked class is usually chosen by DSCP: 106 is DSCP 26 with ECT(0)); on the UDP
    /// transport its DSCP, with ECT(0) always.
    #[arg(long, default_value_t = 0)]
    pub tclass: u8,
    /// The service level: verbs 0 to 15 (the VLAN priority on RoCE); the UDP transport 0 to 6,
    /// the sockets' priority (SO_PRIORITY).
    #[arg(short = 'S', long = "sl", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..16))]
    pub sl: u8,
    /// UDP port to receive data on.
    #[arg(long, default_value_t = transport_core::wire::ROCEV2_PORT)]
    pub data_port: u16,
    /// Local IP address to use.
    #[arg(long)]
    pub bind: Option<IpAddr>,
    /// UDP transport: never sleep. The kernel busy-polls the NIC's receive queue (SO_BUSY_POLL,
    /// 50 us), the engine never sleeps in its waits, and bandwidth tests poll without pause
    /// (by default they spin for 200 us after the last work, or not at all while the thread has
    /// lately waited for a CPU, then sleep on the sockets until a datagram or a timer, so that
    /// the kernel and a peer on the same host get the CPU they need; latency tests always spin,
    /// as perftest's do).
    #[arg(long)]
    pub busy_poll: bool,
    /// Sleep while waiting for completions instead of polling, at once: the UDP transport's
    /// engine sleeps until a datagram or a timer (with --busy-poll it spins inside the wait);
    /// verbs sleeps on the completion queue's channel (ibv_req_notify_cq, ibv_get_cq_event).
    #[arg(short = 'e', long = "use_event")]
    pub use_event: bool,
    /// UDP transport: no ICRC on the data path, on both ends (the server takes the client's
    /// choice): datagrams carry 0 in the field and arrivals are not checked, which saves a
    /// CRC-32 over every byte on each end. Only between two metaroce ends: the UDP checksum and
    /// the links' frame checks then guard the data, as they guard TCP's; a RoCE NIC, tshark's
    /// ICRC check and an older metaroce server reject such datagrams. The default when the
    /// server is on this host (loopback), no --pcap is written and no --allow-data-redirect
    /// given, unless the server keeps the ICRC (its --icrc or --pcap); elsewhere it is on.
    #[arg(long, conflicts_with = "icrc")]
    pub no_icrc: bool,
    /// UDP transport: the ICRC on the data path, computed and checked on both ends, also when
    /// the server is on this host (where the default is --no-icrc: those datagrams go from
    /// memory to memory, and the kernel checks no UDP or TCP checksum there either). On a
    /// server: kept over a client that left it to the address, and a client's --no-icrc refused.
    #[arg(long)]
    pub icrc: bool,
    /// UDP transport: the rate controller, on both ends (the server takes the client's choice;
    /// docs/CONGESTION.md). By default metaroce: ECN AIMD per path and per connection, paced to
    /// the receiver's hint when the receiver has a --line-rate.
    #[arg(long, value_parser = cc_parser())]
    pub cc: Option<perf::Cc>,
    /// UDP transport: this end's line rate, Gb/s. On the receiving end, every ACK then carries
    /// each sender's max-min share of it (the rate hint a metaroce sender paces to); the
    /// rate-based controllers (dcqcn, timely) start from it (100 Gb/s when not given).
    #[arg(long, value_name = "GBPS", value_parser = parse_gbps)]
    pub line_rate: Option<u32>,
    /// UDP transport, with --line-rate: the table in shared memory through which every engine
    /// receiving on this address at this line rate (other server processes, a client's worker
    /// threads) divides it among all their connections; by default
    /// /dev/shm/metaroce-fair-share-<uid>; `none`: this process's connections have the line to
    /// themselves.
    #[arg(long, value_name = "PATH|none")]
    pub share_table: Option<PathBuf>,
    /// UDP transport: no UDP GSO (one datagram per message of a send call).
    #[arg(long)]
    pub no_gso: bool,
    /// UDP transport: packets in a row a path takes once picked (1: a path per packet, as a NIC
    /// sprays); a local choice of the sender.
    #[arg(long, default_value_t = host_ibverbs::udp::DEFAULT_SPRAY_BURST,
          value_parser = clap::value_parser!(u8).range(1..))]
    pub spray_burst: u8,
    /// UDP transport: copy every payload next to its headers before the send call (by default
    /// a payload of 512 bytes or more is read by the kernel where it lies in its region).
    #[arg(long)]
    pub copy_send: bool,
    /// UDP transport: no UDP GRO (the kernel hands over datagrams one by one). A latency test
    /// that spins (without -e) leaves it off anyway for messages of one packet, and leaves the
    /// kernel's arrival times off for all: it reads each datagram as it comes.
    #[arg(long)]
    pub no_gro: bool,
    /// UDP transport: send and receive through an AF_XDP socket on the interface of the local
    /// address (copy mode), not the kernel's UDP stack: arrivals are read without a system call
    /// (a shorter round trip), each datagram a frame of its own (less bulk than GSO and GRO).
    /// IPv4, XDP in the interface's driver (a veth), root; a socket on each receive queue (up to
    /// 64; sends leave by queue 0); a peer on this
    /// host or not yet in the neighbour table goes through the socket. The wire is the same: the
    /// peer need not use it. Keeps the ICRC (no --no-icrc)
    #[arg(long)]
    pub xdp: bool,
    /// UDP transport: one message per system call (no sendmmsg/recvmmsg batches; GSO and GRO
    /// still coalesce unless turned off too).
    #[arg(long)]
    pub no_batch: bool,
    /// Write every datagram sent and received to this pcap file.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Bandwidth tests: worker threads, each with its own UDP socket, engine and share of the
    /// -q connections (use one per core the transport may take).
    #[arg(long, default_value_t = 1)]
    pub threads: u32,
    /// Latency tests: print every sample, sorted, before the summary line (perftest's format:
    /// `#, usec` then `N, value`); with --json, a `samples_us` array in the order measured.
    #[arg(short = 'H', long = "report-histogram")]
    pub report_histogram: bool,
    /// Latency tests: as -H, and the samples in the order measured before the sorted ones.
    #[arg(short = 'U', long = "report-unsorted")]
    pub report_unsorted: bool,
    /// Atomic tests: the operation, FETCH_AND_ADD (the default) or CMP_AND_SWAP.
    #[arg(short = 'A', long = "atomic_type", value_parser = atomic_parser())]
    pub atomic_type: Option<perf::AtomicKind>,
    /// Print one JSON object per result line.
    #[arg(long)]
    pub json: bool,
    /// Most memory for the buffers of one phase, all connections together (a number of bytes,
    /// or with K, M or G): a peer cannot make this end take more.
    #[arg(long, value_name = "BYTES", default_value = "1G", value_parser = parse_bytes)]
    pub max_memory: u64,
    /// Server: serve one client, then exit (perftest's behaviour); otherwise the server goes
    /// back to waiting after each client, also after one that failed. A connection that never
    /// sends a valid hello does not count.
    #[arg(long)]
    pub once: bool,
    /// Send data to the address the peer names even when it is not the address its control
    /// connection comes from (a data path on another interface); otherwise refused.
    #[arg(long)]
    pub allow_data_redirect: bool,
}

/// A size in bytes: a number, or with a suffix K, M or G (powers of 1024).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{s:?} is not a size (a number of bytes, or with K, M or G)"))
}

fn config(test: Test, a: &PerfArgs) -> Result<PerfConfig, String> {
    let mut c = PerfConfig::new(test);
    c.server = a.server.clone();
    if let Some(s) = a.size {
        c.size = s;
    }
    if let Some(n) = a.iters {
        c.iters = n;
    }
    if let Some(d) = a.duration {
        if !(d > 0.0 && d < 1e6) {
            return Err("-D must be a positive number of seconds".into());
        }
        c.duration = Some(Duration::from_secs_f64(d));
    }
    c.qps = a.qps;
    c.port = a.port;
    c.all_sizes = a.all;
    c.tx_depth = a.tx_depth;
    c.mtu = a.mtu;
    c.paths = a.paths;
    c.window = a.window;
    match (a.cc, a.transport) {
        (Some(_), perf::Transport::Verbs) => {
            return Err("--cc applies to the UDP transport (a RoCE NIC runs its own)".into())
        }
        (Some(cc), _) => c.cc = cc,
        (None, _) => {}
    }
    c.line_rate_mbps = a.line_rate.unwrap_or(0);
    c.share_table = match &a.share_table {
        Some(p) if p.as_os_str() == "none" => None,
        Some(p) => Some(p.clone()),
        None if c.line_rate_mbps > 0 => Some(host_ibverbs::udp::share_table::default_path()),
        None => None,
    };
    if a.no_icrc {
        c.icrc = Some(host_ibverbs::udp::IcrcMode::Off);
    } else if a.icrc {
        c.icrc = Some(host_ibverbs::udp::IcrcMode::Full);
    }
    c.data_port = a.data_port;
    c.busy_poll = a.busy_poll;
    c.use_event = a.use_event;
    c.gso = !a.no_gso;
    c.copy_send = a.copy_send;
    c.spray_burst = a.spray_burst;
    c.outs = a.outs;
    c.gro = !a.no_gro;
    c.xdp = a.xdp;
    c.batch = !a.no_batch;
    c.threads = a.threads;
    c.samples = a.report_histogram || a.report_unsorted;
    c.pcap = a.pcap.clone();
    c.bind = a.bind;
    c.ib_port = a.ib_port;
    c.gid_index = a.gid_index;
    c.tclass = a.tclass;
    match (a.atomic_type, test.is_atomic()) {
        (Some(k), true) => c.atomic = k,
        (Some(_), false) => return Err("-A applies to atomic-bw and atomic-lat".into()),
        (None, _) => {}
    }
    c.sl = a.sl;
    c.max_memory = a.max_memory;
    c.once = a.once;
    c.allow_data_redirect = a.allow_data_redirect;
    c.transport = a.transport;
    match a.transport {
        perf::Transport::Verbs => {
            c.device = a.device.clone();
        }
        perf::Transport::Udp => {
            if let Some(dev) = &a.device {
                let v6 = a.server.as_deref().is_some_and(|s| s.contains(':'));
                c.bind = Some(devices::address_of(dev, v6).ok_or_else(|| {
                    format!("no interface {dev:?} with an IP address (see `metaroce devices`)")
                })?);
            }
        }
    }
    Ok(c)
}

/// Runs one of the six tests.
pub fn run_perf(test: Test, a: &PerfArgs) -> ExitCode {
    if a.transport == perf::Transport::Verbs {
        // Say plainly why not before any exchange starts.
        if let Err(e) = host_ibverbs::verbs_status() {
            eprintln!("metaroce: {e}; use --transport udp (the default)");
            return ExitCode::from(1);
        }
    }
    let cfg = match config(test, a) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("metaroce: {e}");
            return ExitCode::from(2);
        }
    };
    let code = if cfg.server.is_some() {
        client(&cfg, a)
    } else {
        server(&cfg, a.json)
    };
    stats::unpublish();
    code
}

/// One result line (JSON, or perftest's table with its header before the first line). A latency
/// result's samples, if it has them, come before its line: sorted, and with `unsorted` first in
/// the order measured, as perftest's -H and -U print them.
fn print_report(
    test: Test,
    json: bool,
    gbits: bool,
    unsorted: bool,
    r: &Report,
    header: &mut bool,
) {
    let mut out = io::stdout().lock();
    if json {
        let _ = writeln!(out, "{}", r.to_json(test));
    } else {
        if !*header {
            let _ = writeln!(out, "{}", perf::table_header(test, gbits));
            *header = true;
        }
        if let Report::Lat(l) = r {
            if !l.samples_us.is_empty() {
                let mut sorted = l.samples_us.clone();
                sorted.sort_by(f64::total_cmp);
                let lists = if unsorted {
                    vec![&l.samples_us, &sorted]
                } else {
                    vec![&sorted]
                };
                for list in lists {
                    let _ = writeln!(out, "#, usec");
                    for (i, v) in list.iter().enumerate() {
                        let _ = writeln!(out, "{}, {}", i + 1, perf::sample_text(*v));
                    }
                }
            }
        }
        let _ = writeln!(out, "{}", perf::table_line(r, gbits));
    }
    let _ = out.flush();
}

fn client(cfg: &PerfConfig, a: &PerfArgs) -> ExitCode {
    let mut header = false;
    let result = perf::run_client(cfg, |r| {
        print_report(
            cfg.test,
            a.json,
            a.report_gbits,
            a.report_unsorted,
            r,
            &mut header,
        )
    });
    match result {
        Ok(reports) => {
            if !a.json {
                println!("---------------------------------------------------------------------------------------");
            }
            if reports.iter().all(Report::verified) {
                ExitCode::SUCCESS
            } else {
                match reports.iter().find_map(Report::why) {
                    Some(why) => eprintln!("metaroce: data verification FAILED: {why}"),
                    None => eprintln!("metaroce: data verification FAILED"),
                }
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("metaroce: {e}");
            ExitCode::from(1)
        }
    }
}

fn server(cfg: &PerfConfig, json: bool) -> ExitCode {
    let addr = (
        cfg.bind
            .unwrap_or(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)),
        cfg.port,
    );
    let listener = TcpListener::bind(addr).or_else(|_| {
        TcpListener::bind((
            cfg.bind
                .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
            cfg.port,
        ))
    });
    let listener = match listener {
        Ok(l) => l,
        Err(e) => {
            eprintln!("metaroce: cannot listen on TCP port {}: {e}", cfg.port);
            return ExitCode::from(1);
        }
    };
    loop {
        eprintln!(
            "************************************\n* Waiting for client to connect... *\n************************************"
        );
        let served = match perf::serve_one(cfg, &listener) {
            Ok(s) => s,
            Err(PerfError::NoSession(e)) => {
                // A port scanner or a stranger: not a client, also for --once.
                eprintln!("metaroce: a connection that was not a client: {e}");
                // Never a hot loop, whatever fails (a full file table fails every accept).
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(e) => {
                eprintln!("metaroce: lost the client: {e}");
                if cfg.once {
                    return ExitCode::from(1);
                }
                continue;
            }
        };
        eprintln!(
            "served {} ({} phase(s)), {} bytes checked, verified: {}{}",
            served.test.name(),
            served.phases,
            served.bytes_checked,
            served.verified,
            served
                .why
                .as_deref()
                .map_or(String::new(), |w| format!(" ({w})"))
        );
        if json {
            let mut v = serde_json::json!({
                "role": "server",
                "test": served.test.name(),
                "phases": served.phases,
                "verified": served.verified,
                "bytes_checked": served.bytes_checked,
                "stats": served.stats,
            });
            if let Some(w) = &served.why {
                v["verify_error"] = serde_json::json!(w);
            }
            println!("{v}");
        }
        if cfg.once {
            return if served.verified {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            };
        }
    }
}

/// `metaroce loopback`: a bandwidth and a latency run between two threads of this process over
/// 127.0.0.1, with no configuration and no privileges.
pub fn run_loopback(json: bool, seconds: f64) -> ExitCode {
    let mut ok = true;
    for test in [Test::WriteBw, Test::WriteLat] {
        let listener = match TcpListener::bind("127.0.0.1:0") {
            Ok(l) => l,
            Err(e) => {
                eprintln!("metaroce: cannot listen on 127.0.0.1: {e}");
                return ExitCode::from(1);
            }
        };
        let mut cfg = PerfConfig::new(test);
        cfg.port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        cfg.data_port = 0;
        cfg.progress = false;
        if test == Test::WriteBw {
            cfg.duration = Some(Duration::from_secs_f64(seconds));
        } else {
            cfg.iters = 10_000;
        }
        let scfg = cfg.clone();
        let server = std::thread::Builder::new()
            .name("server".into())
            .stack_size(64 << 20)
            .spawn(move || perf::serve_one(&scfg, &listener));
        let server = match server {
            Ok(s) => s,
            Err(e) => {
                eprintln!("metaroce: cannot start the server thread: {e}");
                return ExitCode::from(1);
            }
        };
        cfg.server = Some("127.0.0.1".into());
        let mut header = false;
        if !json {
            println!(
                "metaroce {} over UDP on 127.0.0.1, 8 paths, no ICRC (memory to memory)",
                test.name()
            );
        }
        let r: Result<_, PerfError> = perf::run_client(&cfg, |r| {
            print_report(test, json, true, false, r, &mut header)
        });
        let served = server.join();
        match (r, served) {
            (Ok(reports), Ok(Ok(s))) => {
                ok &= reports.iter().all(Report::verified) && s.verified;
            }
            (Err(e), _) => {
                eprintln!("metaroce: {e}");
                ok = false;
            }
            (_, Ok(Err(e))) => {
                eprintln!("metaroce: server: {e}");
                ok = false;
            }
            (_, Err(_)) => {
                eprintln!("metaroce: the server thread failed");
                ok = false;
            }
        }
    }
    stats::unpublish();
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `metaroce devices`.
pub fn run_devices(json: bool, sysfs: &std::path::Path) -> ExitCode {
    use host_ibverbs::gids::{self, GidType, LinkLayer};
    let verbs = host_ibverbs::verbs_devices();
    let rdma = gids::read_devices(sysfs);
    let ifs = devices::interfaces().unwrap_or_default();
    let link = |l: LinkLayer| match l {
        LinkLayer::Ethernet => "Ethernet",
        LinkLayer::InfiniBand => "InfiniBand",
        LinkLayer::Other => "other",
    };
    if json {
        let ports = |d: &gids::RdmaDevice| {
            d.ports
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "port": p.num,
                        "state": p.state,
                        "active": p.is_active(),
                        "link_layer": link(p.link_layer),
                        "mtu": p.netdev_mtu,
                        "roce_mtu": p.netdev_mtu.and_then(gids::roce_mtu),
                        "best_gid_index": (p.link_layer == LinkLayer::Ethernet)
                            .then(|| gids::best_gid(p, false).map(|g| g.index))
                            .flatten(),
                        "gids": p.gids.iter().map(|g| serde_json::json!({
                            "index": g.index,
                            "gid": std::net::Ipv6Addr::from(g.gid).to_string(),
                            "ipv4": g.ipv4().map(|a| a.to_string()),
                            "type": g.kind.map(GidType::name),
                            "netdev": g.netdev,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect::<Vec<_>>()
        };
        let v = serde_json::json!({
            "verbs": match &verbs {
                Ok(d) => serde_json::json!(d),
                Err(e) => serde_json::json!({ "error": e.to_string() }),
            },
            "rdma": match &rdma {
                Ok(devs) => serde_json::json!(devs.iter().map(|d| serde_json::json!({
                    "name": d.name,
                    "ports": ports(d),
                })).collect::<Vec<_>>()),
                Err(e) => serde_json::json!({ "error": format!("{}: {e}", sysfs.display()) }),
            },
            "udp": ifs.iter().map(|i| serde_json::json!({
                "name": i.name,
                "addrs": i.addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                "up": i.up,
                "loopback": i.loopback,
                "mtu": i.mtu,
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
        return ExitCode::SUCCESS;
    }
    println!("RDMA (verbs) devices:");
    match (&verbs, &rdma) {
        (_, Ok(devs)) if !devs.is_empty() => {
            if let Err(e) = &verbs {
                println!("    ({e}; the table below is the kernel's)");
            }
            for d in devs {
                for p in &d.ports {
                    let mtu = match p.netdev_mtu {
                        Some(m) => format!(
                            ", mtu {m} (RoCE {})",
                            gids::roce_mtu(m).map_or("none".into(), |r| r.to_string())
                        ),
                        None => String::new(),
                    };
                    println!(
                        "    {} port {}: {}, {}{mtu}",
                        d.name,
                        p.num,
                        p.state,
                        link(p.link_layer)
                    );
                    if p.gids.is_empty() {
                        println!("        no GID in use");
                        continue;
                    }
                    let best = (p.link_layer == LinkLayer::Ethernet)
                        .then(|| gids::best_gid(p, false).map(|g| g.index))
                        .flatten();
                    println!("        {:>3} {:<40} {:<10} NETDEV", "IDX", "GID", "TYPE");
                    for g in &p.gids {
                        let mark = if Some(g.index) == best {
                            "  <- default"
                        } else {
                            ""
                        };
                        println!("        {g}{mark}");
                    }
                }
            }
        }
        (Ok(d), _) if d.is_empty() => println!("    none"),
        (Ok(d), _) => {
            for name in d {
                println!("    {name}");
            }
        }
        (Err(e), _) => println!("    {e}; the UDP transport below works without one"),
    }
    println!("UDP transport interfaces:");
    for i in &ifs {
        let addrs: Vec<String> = i.addrs.iter().map(|a| a.to_string()).collect();
        println!(
            "    {:<12} {:<5} mtu {:<6} {}",
            i.name,
            if i.up { "UP" } else { "DOWN" },
            i.mtu.map_or("?".into(), |m| m.to_string()),
            addrs.join(" ")
        );
    }
    ExitCode::SUCCESS
}

/// `metaroce stats`.
pub fn run_stats(pid: Option<u32>, json: bool) -> ExitCode {
    let found = match stats::collect(pid) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("metaroce: {e}");
            return ExitCode::from(1);
        }
    };
    for s in &found.skipped {
        eprintln!("metaroce: warning: {s}");
    }
    let snaps = found.snapshots;
    if snaps.is_empty() {
        eprintln!(
            "metaroce: no running endpoint{} publishes statistics in {}",
            pid.map_or(String::new(), |p| format!(" with pid {p}")),
            stats::run_dir().display()
        );
        return ExitCode::from(1);
    }
    for s in &snaps {
        if json {
            println!("{s}");
        } else {
            print!("{}", stats::to_text(s));
        }
    }
    ExitCode::SUCCESS
}
