//! Frames of MetaRoCE and RoCEv2 as tools and checkers see them, apart from any runner: what the
//! `metaroce` tools decode, generate and capture, and what the FPGA bridge and the simulator can
//! use without sockets, argument parsing or RDMA libraries.
//!
//! - [`decode`]: a frame (Ethernet to ICRC) to one JSON object per frame, one key per header.
//! - [`gen`]: seeded frames of every kind, for decoders, fuzzers and golden vectors.
//! - [`capture`]: pcap and pcapng files, read and written.

pub mod capture;
pub mod decode;
pub mod gen;
