//! `metaroce`: the command-line tools of the MetaRoCE transport.

use clap::{Parser, Subcommand, ValueEnum};
use host_ibverbs::capture::{self, PcapWriter, LINKTYPE_ETHERNET};
use host_ibverbs::decode::{self, DecodeOptions};
use host_ibverbs::gen::{self, Kind, Rng};
use serde_json::json;
use std::io::{self, BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

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
