//! `metaroce`: the command-line tools of the MetaRoCE transport.

use clap::{Parser, Subcommand, ValueEnum};
use metaroce_frames::capture::{self, PcapWriter, LINKTYPE_ETHERNET};
use metaroce_frames::decode::{self, DecodeOptions};
use metaroce_frames::gen::{self, Kind, Rng};
use netsim as selftest;
use serde_json::json;
use std::io::{self, BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

mod tools;
use host_ibverbs::perf::Test;

#[derive(Parser)]
#[command(
    name = "metaroce",
    version,
    about = "MetaRoCE-class RDMA transport tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decode RoCEv2 and MetaRoCE frames and print every field.
    ///
    /// Frames come as hex arguments, as hex lines on standard input (blank lines and lines
    /// starting with '#' are skipped), or from a pcap/pcapng file. A frame that cannot be parsed
    /// is reported and decoding goes on; the exit status is 1 if any frame could not be parsed.
    Decode {
        /// Frames as hex (whitespace and ':' are ignored).
        hex: Vec<String>,
        /// Read frames from a pcap or pcapng capture.
        #[arg(short = 'r', long = "pcap", value_name = "FILE")]
        pcap: Option<PathBuf>,
        /// Print one JSON object per frame.
        #[arg(long)]
        json: bool,
        /// The RoCEv2 UDP destination port.
        #[arg(long, default_value_t = transport_core::wire::ROCEV2_PORT)]
        port: u16,
    },
    /// Write random valid frames, as hex lines or into a pcap file.
    Gen {
        /// How many frames.
        #[arg(long, short = 'n', default_value_t = 16)]
        count: u64,
        /// The seed: the same seed gives the same frames on every machine.
        #[arg(long, short = 's', default_value_t = 1)]
        seed: u64,
        /// Which opcodes to draw from.
        #[arg(long, value_enum, default_value_t = GenKind::Mixed)]
        kind: GenKind,
        /// Write a pcap file instead of hex lines.
        #[arg(long, value_name = "FILE")]
        pcap: Option<PathBuf>,
    },
    /// Run two connections against each other over a virtual lossy link in virtual time, move
    /// real bytes and verify every one. Exits 1 if any byte is wrong, missing or delivered twice.
    Selftest(SelftestArgs),
    /// RDMA Write bandwidth test (server without an address, client with one).
    #[command(name = "write-bw")]
    WriteBw(tools::PerfArgs),
    /// RDMA Write latency test (ping-pong of Writes with immediate).
    #[command(name = "write-lat")]
    WriteLat(tools::PerfArgs),
    /// Send bandwidth test.
    #[command(name = "send-bw")]
    SendBw(tools::PerfArgs),
    /// Send latency test (ping-pong).
    #[command(name = "send-lat")]
    SendLat(tools::PerfArgs),
    /// RDMA Read bandwidth test.
    #[command(name = "read-bw")]
    ReadBw(tools::PerfArgs),
    /// RDMA Read latency test.
    #[command(name = "read-lat")]
    ReadLat(tools::PerfArgs),
    /// Atomic bandwidth test: fetch-and-add (or compare-and-swap, -A) on one 8-byte word of the
    /// peer per connection, -t deep.
    #[command(name = "atomic-bw")]
    AtomicBw(tools::PerfArgs),
    /// Atomic latency test: one fetch-and-add (or compare-and-swap, -A) at a time.
    #[command(name = "atomic-lat")]
    AtomicLat(tools::PerfArgs),
    /// A Write bandwidth and a Write latency run over UDP on 127.0.0.1 inside this process:
    /// no configuration, no privileges.
    Loopback {
        /// Seconds of the bandwidth run.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// List RDMA devices (each port's state, link layer and GID table with types, as
    /// `show_gids` does, and the GID the verbs backend takes by default) and the interfaces the
    /// UDP transport can use.
    Devices {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Read the RDMA devices from this copy of /sys/class/infiniband.
        #[arg(long, value_name = "DIR", default_value = host_ibverbs::gids::SYSFS_ROOT)]
        sysfs: std::path::PathBuf,
    },
    /// Show the counters of running endpoints (ethtool -S style).
    Stats {
        /// Only this process.
        #[arg(long)]
        pid: Option<u32>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct SelftestArgs {
    /// Payload bytes to move (suffixes KiB, MiB, GiB, KB, MB, GB): 64 MiB by default; with
    /// --senders, per sender and 2 MB by default.
    #[arg(long, value_parser = parse_size)]
    bytes: Option<u64>,
    /// Paths per connection (1-64).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u8).range(1..=64))]
    paths: u8,
    /// The share of packets the link loses.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// How losses fall: 1 (each packet on its own), N (a run of the next N packets of one path
    /// in one direction), or `flight` (a path's whole window). The share stays --loss.
    #[arg(long, default_value = "1", value_parser = parse_burst)]
    burst: selftest::Burst,
    /// Probability that a packet is delayed (reordered against other paths).
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Probability that a packet is duplicated.
    #[arg(long, default_value_t = 0.0)]
    dup: f64,
    /// Probability that a packet is corrupted.
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// Seed of everything random.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A path whose route dies during the transfer.
    #[arg(long)]
    fail_path: Option<u8>,
    /// When it dies (suffixes ns, us, ms, s).
    #[arg(long, default_value = "2ms", value_parser = parse_duration)]
    fail_at: u64,
    /// The workload.
    #[arg(long, value_enum, default_value_t = SelftestOps::Write)]
    ops: SelftestOps,
    /// The first PSN each end sends (0xfff000 crosses the 24-bit wrap early).
    #[arg(long, default_value_t = 0)]
    psn_start: u32,
    /// An incast instead: this many senders, each writing --bytes (default 2 MB) to one receiver
    /// through a switch port with a finite buffer and ECN marking (netsim::incast).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    senders: Option<u16>,
    /// Incast: the senders' rate controller.
    #[arg(long, default_value = "metaroce", value_parser = tools::cc_name_parser())]
    cc: host_ibverbs::perf::Cc,
    /// Incast: the receiver does not put each sender's fair share in its ACKs.
    #[arg(long)]
    no_hint: bool,
    /// Incast: the receiver shares out the whole line whatever queue its data meets (no drain).
    #[arg(long)]
    no_drain: bool,
    /// Incast: the line rate of every link, Gb/s.
    #[arg(long, default_value_t = 100.0)]
    link_gbps: f64,
    /// Incast: the switch buffer of the receiver's port (suffixes as --bytes).
    #[arg(long, default_value = "32MB", value_parser = parse_size)]
    buffer: u64,
    /// Incast: ECN marking starts above this queue (suffixes as --bytes).
    #[arg(long, default_value = "400KB", value_parser = parse_size)]
    kmin: u64,
    /// Incast: every packet is marked above this queue (suffixes as --bytes).
    #[arg(long, default_value = "1600KB", value_parser = parse_size)]
    kmax: u64,
    /// Incast: the marking probability at --kmax.
    #[arg(long, default_value_t = 0.2)]
    pmax: f64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a size"))?;
    let mult = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        u => return Err(format!("unknown size unit '{u}'")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("'{s}' is too large"))
}

fn parse_burst(s: &str) -> Result<selftest::Burst, String> {
    match s.trim() {
        "flight" => Ok(selftest::Burst::Flight),
        t => match t.parse::<u32>() {
            Ok(1) => Ok(selftest::Burst::Independent),
            Ok(n @ 2..=4096) => Ok(selftest::Burst::Run(n)),
            _ => Err(format!(
                "'{s}' is not a burst: 1, a run length up to 4096, or 'flight'"
            )),
        },
    }
}

fn parse_duration(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration"))?;
    let mult = match unit.trim() {
        "ns" => 1.0,
        "us" => 1e3,
        "ms" | "" => 1e6,
        "s" => 1e9,
        u => return Err(format!("unknown duration unit '{u}'")),
    };
    Ok((n * mult) as u64)
}

#[derive(Clone, Copy, ValueEnum)]
enum SelftestOps {
    /// Writes only.
    Write,
    /// Writes, Sends (with and without immediate) and Reads on several streams.
    Mixed,
}

#[derive(Clone, Copy, ValueEnum)]
enum GenKind {
    /// IBTA opcodes: RC, UC, UD and CNP.
    Rocev2,
    /// MetaRoCE opcodes.
    Metaroce,
    /// Both.
    Mixed,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Decode {
            hex,
            pcap,
            json,
            port,
        } => run_decode(hex, pcap, json, port),
        Command::Gen {
            count,
            seed,
            kind,
            pcap,
        } => run_gen(count, seed, kind, pcap),
        Command::Selftest(args) => run_selftest(&args),
        Command::WriteBw(a) => return tools::run_perf(Test::WriteBw, &a),
        Command::WriteLat(a) => return tools::run_perf(Test::WriteLat, &a),
        Command::SendBw(a) => return tools::run_perf(Test::SendBw, &a),
        Command::SendLat(a) => return tools::run_perf(Test::SendLat, &a),
        Command::ReadBw(a) => return tools::run_perf(Test::ReadBw, &a),
        Command::ReadLat(a) => return tools::run_perf(Test::ReadLat, &a),
        Command::AtomicBw(a) => return tools::run_perf(Test::AtomicBw, &a),
        Command::AtomicLat(a) => return tools::run_perf(Test::AtomicLat, &a),
        Command::Loopback { seconds, json } => return tools::run_loopback(json, seconds),
        Command::Devices { json, sysfs } => return tools::run_devices(json, &sysfs),
        Command::Stats { pid, json } => return tools::run_stats(pid, json),
    };
    match result {
        Ok(code) => code,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("metaroce: {e}");
            ExitCode::from(2)
        }
    }
}

/// A frame to decode, or the reason its input could not become one.
type Input = Result<Vec<u8>, String>;

fn parse_hex(s: &str) -> Input {
    let digits: String = s
        .chars()
        .filter(|c| !c.is_whitespace() && *c != ':')
        .collect();
    let digits = digits.strip_prefix("0x").unwrap_or(&digits);
    if digits.len() % 2 != 0 {
        return Err(format!(
            "invalid hex: odd number of digits ({})",
            digits.len()
        ));
    }
    (0..digits.len() / 2)
        .map(|i| {
            u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).map_err(|_| {
                format!(
                    "invalid hex: '{}' at digit {}",
                    &digits[2 * i..2 * i + 2],
                    2 * i
                )
            })
        })
        .collect()
}

fn run_decode(
    hex: Vec<String>,
    pcap: Option<PathBuf>,
    as_json: bool,
    port: u16,
) -> io::Result<ExitCode> {
    let opts = DecodeOptions { port };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut failed = false;
    let mut index = 0usize;
    let mut emit = |out: &mut BufWriter<_>, input: Input| -> io::Result<()> {
        index += 1;
        let value = match input {
            Ok(bytes) => decode::to_json(index, &bytes, &opts),
            Err(e) => json!({"frame": index, "error": e}),
        };
        failed |= value.get("error").is_some();
        if as_json {
            serde_json::to_writer(&mut *out, &value)?;
            out.write_all(b"\n")
        } else {
            out.write_all(decode::to_text(&value).as_bytes())
        }
    };
    if let Some(path) = pcap {
        let bytes = std::fs::read(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let (packets, err) = capture::read(&bytes);
        for p in packets {
            let input = if p.linktype == LINKTYPE_ETHERNET {
                Ok(p.data)
            } else {
                Err(format!("link type {} is not Ethernet", p.linktype))
            };
            emit(&mut out, input)?;
        }
        if let Some(e) = err {
            out.flush()?;
            eprintln!("metaroce: {}: {e}", path.display());
            failed = true;
        }
    } else if !hex.is_empty() {
        for h in &hex {
            emit(&mut out, parse_hex(h))?;
        }
    } else {
        for line in io::stdin().lock().lines() {
            let line = line?;
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            emit(&mut out, parse_hex(t))?;
        }
    }
    out.flush()?;
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn run_gen(count: u64, seed: u64, kind: GenKind, pcap: Option<PathBuf>) -> io::Result<ExitCode> {
    let kind = match kind {
        GenKind::Rocev2 => Kind::Rocev2,
        GenKind::Metaroce => Kind::Metaroce,
        GenKind::Mixed => Kind::Mixed,
    };
    let mut rng = Rng::new(seed);
    if let Some(path) = pcap {
        let file = std::fs::File::create(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let mut w = PcapWriter::new(BufWriter::new(file))?;
        for i in 0..count {
            w.write(i * 1000, &gen::frame(&mut rng, kind))?;
        }
        w.finish()?;
    } else {
        let stdout = io::stdout();
        let mut out = BufWriter::new(stdout.lock());
        let mut line = String::new();
        for _ in 0..count {
            line.clear();
            for b in gen::frame(&mut rng, kind) {
                line.push_str(&format!("{b:02x}"));
            }
            line.push('\n');
            out.write_all(line.as_bytes())?;
        }
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

fn run_incast(a: &SelftestArgs, senders: u16) -> io::Result<ExitCode> {
    if !(a.link_gbps > 0.0 && a.link_gbps <= 4_000.0 && (0.0..=1.0).contains(&a.pmax)) {
        eprintln!("metaroce: --link-gbps must be above 0 (at most 4000) and --pmax a probability");
        return Ok(ExitCode::from(2));
    }
    let bytes = a.bytes.unwrap_or(2_000_000);
    if a.kmin > a.kmax || bytes > u64::from(u32::MAX) || bytes == 0 {
        eprintln!("metaroce: --kmin must not exceed --kmax, and --bytes must be 1 B to 4 GiB");
        return Ok(ExitCode::from(2));
    }
    let line = (a.link_gbps * 1000.0) as u32;
    let defaults = netsim::incast::IncastConfig::default();
    let cfg = netsim::incast::IncastConfig {
        senders: usize::from(senders),
        bytes,
        link_gbps: a.link_gbps,
        buffer_bytes: a.buffer,
        kmin_bytes: a.kmin,
        kmax_bytes: a.kmax,
        pmax: a.pmax,
        cc: a.cc.algorithm(line, defaults.window_per_path),
        // Only MetaRoCE senders act on the hint.
        hint: !a.no_hint && a.cc == host_ibverbs::perf::Cc::MetaRoce,
        drain: !a.no_drain,
        seed: a.seed,
        ..defaults
    };
    let r = netsim::incast::run(&cfg);
    let v = json!({
        "senders": r.senders,
        "cc": a.cc.name(),
        "hint": cfg.hint,
        "drain": cfg.hint && cfg.drain,
        "per_sender_goodput": r.per_sender_goodput,
        "jain_index": r.jain_index,
        "link_utilisation": r.link_utilisation,
        "max_queue_bytes": r.max_queue_bytes,
        "drops": r.drops,
        "marks": r.marks,
        "cnps": r.cnps,
        "settle_rtts": r.settle_rtts,
        "settle_window_rtts": r.settle_window_rtts,
        "base_rtt_ns": r.base_rtt_ns,
        "virtual_time_us": r.virtual_time_us,
        "retransmissions": r.retransmissions,
        "ok": r.ok,
    });
    let mut out = io::stdout().lock();
    if a.json {
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "senders               {}", r.senders)?;
        writeln!(
            out,
            "controller            {}{}",
            a.cc.name(),
            if cfg.hint { " + hint" } else { "" }
        )?;
        writeln!(out, "jain index            {:.4}", r.jain_index)?;
        writeln!(out, "link utilisation      {:.3}", r.link_utilisation)?;
        writeln!(out, "max queue             {} bytes", r.max_queue_bytes)?;
        writeln!(
            out,
            "drops, marks, cnps    {} {} {}",
            r.drops, r.marks, r.cnps
        )?;
        match r.settle_rtts {
            Some(s) => writeln!(out, "settled after         {s} RTTs")?,
            None => writeln!(out, "settled after         never")?,
        }
        writeln!(out, "virtual time          {:.1} us", r.virtual_time_us)?;
        writeln!(out, "every byte verified   {}", r.ok)?;
    }
    Ok(if r.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn run_selftest(a: &SelftestArgs) -> io::Result<ExitCode> {
    if let Some(n) = a.senders {
        return run_incast(a, n);
    }
    for (name, p) in [
        ("loss", a.loss),
        ("reorder", a.reorder),
        ("dup", a.dup),
        ("corrupt", a.corrupt),
    ] {
        if !(0.0..=1.0).contains(&p) {
            eprintln!("metaroce: --{name} must be a probability between 0 and 1");
            return Ok(ExitCode::from(2));
        }
    }
    if a.fail_path.is_some_and(|p| p >= a.paths) {
        eprintln!("metaroce: --fail-path must be below --paths");
        return Ok(ExitCode::from(2));
    }
    let cfg = selftest::SelftestConfig {
        bytes: a.bytes.unwrap_or(64 << 20),
        paths: a.paths,
        loss: a.loss,
        burst: a.burst,
        reorder: a.reorder,
        dup: a.dup,
        corrupt: a.corrupt,
        seed: a.seed,
        fail_path: a.fail_path,
        fail_at_ns: a.fail_at,
        initial_psn: a.psn_start & 0xff_ffff,
        ops: match a.ops {
            SelftestOps::Write => selftest::Ops::Write,
            SelftestOps::Mixed => selftest::Ops::Mixed,
        },
        ..selftest::SelftestConfig::default()
    };
    let r = selftest::run(&cfg);
    let mut out = io::stdout().lock();
    if a.json {
        let v = json!({
            "bytes_posted": r.bytes_posted,
            "bytes_delivered": r.bytes_delivered,
            "bytes_verified": r.bytes_verified,
            "duplicates_delivered": r.duplicates_delivered,
            "goodput_fraction": r.goodput_fraction,
            "retransmits_per_loss": r.retransmits_per_loss,
            "failover_stall_rtts": r.failover_stall_rtts,
            "virtual_time_us": r.virtual_time_us,
            "data_packets_lost": r.data_packets_lost,
            "retransmissions": r.retransmissions,
            "completions": r.completions,
            "completion_errors": r.completion_errors,
            "path_failure_detected": r.path_failure_detected,
            "failure_detect_rtts": r.failure_detect_rtts,
            "atomics": r.atomics,
            "atomics_exact": r.atomics_exact,
            "finished": r.finished,
            "ok": r.ok(),
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "bytes posted          {}", r.bytes_posted)?;
        writeln!(out, "bytes delivered       {}", r.bytes_delivered)?;
        writeln!(out, "bytes verified equal  {}", r.bytes_verified)?;
        writeln!(out, "duplicates delivered  {}", r.duplicates_delivered)?;
        writeln!(
            out,
            "goodput               {:.3} of the link",
            r.goodput_fraction
        )?;
        writeln!(
            out,
            "retransmits per loss  {:.3} ({} retransmissions, {} data packets lost)",
            r.retransmits_per_loss, r.retransmissions, r.data_packets_lost
        )?;
        if a.fail_path.is_some() {
            writeln!(
                out,
                "failover stall        {:.1} RTTs (path declared failed: {}, after {:.1} RTTs)",
                r.failover_stall_rtts, r.path_failure_detected, r.failure_detect_rtts
            )?;
        }
        if r.atomics > 0 {
            writeln!(
                out,
                "fetch-and-adds        {} (exactly once: {})",
                r.atomics, r.atomics_exact
            )?;
        }
        writeln!(out, "virtual time          {:.1} us", r.virtual_time_us)?;
        writeln!(
            out,
            "completions           {} ({} out of order or failed)",
            r.completions, r.completion_errors
        )?;
        writeln!(
            out,
            "result                {}",
            if r.ok() { "OK" } else { "FAILED" }
        )?;
    }
    Ok(if r.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
