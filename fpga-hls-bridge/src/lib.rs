//! The bridge between `transport-core` and an FPGA pipeline. It holds nothing yet; see README.md
//! for what it will hold.
#![forbid(unsafe_code)]
