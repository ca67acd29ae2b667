//! Host runners for the MetaRoCE transport and the library behind the `metaroce` tool.
//!
//! - [`udp`]: the software transport over UDP sockets behind a Verbs-shaped API (the host
//!   fallback, also for BlueField DPU Arm cores);
//! - `verbs` (feature `verbs`): the ibverbs backend over `rdma-sys` for RDMA NICs;
//! - [`perf`] and [`oob`]: the perftest-style bandwidth and latency tests and their TCP exchange;
//! - [`devices`]: the interfaces the UDP transport can use;
//! - [`decode`], [`gen`], [`capture`]: frame decoding to JSON and text, random frame generation,
//!   pcap/pcapng files; [`selftest`]: two connections over a virtual lossy link.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod devices;
pub mod gids;
pub mod memlock;
pub mod oob;
pub mod perf;
pub mod udp;

#[cfg(feature = "verbs")]
pub mod verbs;

/// Why the verbs backend cannot be used.
#[derive(Debug)]
pub enum VerbsUnavailable {
    /// This build was made without the `verbs` feature.
    NotBuilt,
    /// libibverbs found no RDMA device.
    #[cfg(feature = "verbs")]
    Backend(verbs::VerbsError),
}

impl std::fmt::Display for VerbsUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VerbsUnavailable::NotBuilt => write!(
                f,
                "this build has no verbs backend (build with `--features verbs`, which needs libibverbs-dev)"
            ),
            #[cfg(feature = "verbs")]
            VerbsUnavailable::Backend(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for VerbsUnavailable {}

/// The names of the RDMA devices libibverbs sees.
pub fn verbs_devices() -> Result<Vec<String>, VerbsUnavailable> {
    #[cfg(feature = "verbs")]
    {
        verbs::device_list()
            .map(|d| d.into_iter().map(|d| d.name).collect())
            .map_err(VerbsUnavailable::Backend)
    }
    #[cfg(not(feature = "verbs"))]
    {
        Err(VerbsUnavailable::NotBuilt)
    }
}

/// How many RDMA devices the verbs backend could use.
pub fn verbs_status() -> Result<usize, VerbsUnavailable> {
    verbs_devices().map(|d| d.len())
}
