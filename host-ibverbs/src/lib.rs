//! Host runners for the MetaRoCE transport and the library behind the `metaroce` tool: frame
//! decoding to JSON and text, random frame generation, and pcap/pcapng capture files.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod capture;
pub mod decode;
pub mod gen;
pub mod selftest;
pub mod udp;
