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
mod config;
mod report;
mod run;
mod session;

use crate::oob::{Channel, Message, OobError};
use crate::udp::{self, Access, RemoteAddr};
use backend::{Endpoint, Mr};
use serde_json::json;
use std::fmt;
use std::net::{IpAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use backend::Transport;
pub use config::*;
pub use report::*;
pub use run::{BwResult, ConnRate, LatResult};
pub use session::*;

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

/// A peer's buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RemoteBuf {
    pub va: u64,
    pub rkey: u32,
    pub len: u64,
}

impl RemoteBuf {
    /// The address `offset` bytes into the buffer. `decode_bufs` refuses a buffer whose end
    /// wraps the address space; an offset past the end saturates, and the peer's bounds check
    /// refuses the access (never an overflow here).
    pub fn at(&self, offset: usize) -> RemoteAddr {
        RemoteAddr {
            va: self.va.saturating_add(offset as u64),
            rkey: self.rkey,
        }
    }
}

pub(crate) const ALL_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

/// Message buffers a timed (`-D`) run cycles through: 256 KiB shared out among its connections
/// (at least one message each). As perftest's cycle buffer (a message or two per queue pair at
/// these sizes) and iperf3's single buffer, the memory
/// stays in the cache, so the run measures the transport rather than the host's memory: cycling
/// 64 MiB per connection instead cost a veth run 19.5 of 28 Gb/s (every payload read and placed
/// from and to DRAM); 1 MiB in all moved 0.94x what 256 KiB did on loopback (five alternating
/// pairs, Intel Xeon VM: the kernel's copies push a mebibyte out of L2, and the ICRC then reads the
/// payloads from L3; docs/BENCHMARKS.md, "Payloads that fill the link"). A run of `-n` messages
/// keeps one buffer per message (up to `BUF_BYTES`), so that every message's landing place is
/// checked.
const CYCLE_BYTES: usize = 256 << 10;
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
        cap.min((CYCLE_BYTES / qps.max(1) as usize / size.max(1)).max(1))
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
            if va.checked_add(len).is_none() {
                return Err(OobError::Field(format!(
                    "buffer {p:?} wraps the address space"
                )));
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

/// Fills `out` with the pattern of connection `qp`, slot `slot`, phase seed `seed`.
pub(crate) fn pattern(out: &mut [u8], seed: u64, qp: usize, slot: usize) {
    let mut s = seed ^ ((qp as u64) << 40) ^ ((slot as u64) << 8) ^ 0x5851_f42d_4c95_7f2d;
    let mut next = || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)).to_le_bytes()
    };
    // Whole words with one store each (a copy of a slice of unknown length was a call per 8
    // bytes), then the last bytes.
    let mut words = out.chunks_exact_mut(8);
    for w in &mut words {
        w.copy_from_slice(&next());
    }
    let tail = words.into_remainder();
    let n = tail.len();
    tail.copy_from_slice(&next()[..n]);
}

#[cfg(test)]
mod tests;
