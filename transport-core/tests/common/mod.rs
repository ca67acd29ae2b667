//! The core's tests drive `netsim::pair`: a lossless pair of connections, each side with one flat
//! memory at a fixed base address, at the sizes below.

#![allow(dead_code, unused_imports)]

pub use netsim::pair::{at_base, config, path_base, write_at, BASE, MEM};

pub type Conn = transport_core::conn::Connection<4, 256, 2, 16, 4>;
pub type Pair = netsim::pair::Pair<4, 256, 2, 16, 4>;
