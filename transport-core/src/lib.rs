//! The MetaRoCE-class RDMA transport, as pure functions and state machines.
//!
//! `transport-core` holds the protocol and nothing else: the wire formats of RoCEv2 and of this
//! project's MetaRoCE headers ([`wire`]), the invariant CRC ([`icrc`]) and, in later modules, the
//! connection state machines. It never performs I/O, never reads a clock, never allocates and
//! contains no `unsafe` code, so the same code runs on a host, on a DPU's Arm cores, on a
//! bare-metal microcontroller, inside the network simulator and behind the FPGA bridge's C ABI.
//!
//! The wire format of the MetaRoCE headers is specified in `docs/PROTOCOL.md`.
//!
//! # Features
//! - `fast-crc` (default): compute the ICRC with `crc32fast` (PCLMULQDQ on x86_64, the CRC32
//!   instructions on aarch64). Without it the `crc` crate's slice-by-16 table is used.
//! - `defmt`: derive `defmt::Format` on the public types.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(test)]
extern crate std;

pub mod conn;
pub mod icrc;
pub mod path;
pub mod rate;
pub mod time;
pub mod wire;
