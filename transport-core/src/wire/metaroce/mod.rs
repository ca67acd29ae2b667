//! The MetaRoCE headers, version 1, as specified in `docs/PROTOCOL.md`.
//!
//! They follow a standard BTH whose opcode lies in the manufacturer-specific range 0xC0-0xFF, on
//! UDP port 4791, and are covered by the ordinary RoCEv2 ICRC. Every MetaRoCE header that starts
//! a packet's extension headers opens with a byte whose high nibble is the protocol version.
//!
//! ```text
//! data    (24) |ver|flg| path |  stream id  |     path seq      |        msn        |
//!              |    message offset     |    message length     |   timestamp (ns)  |
//! remote  (12) |          virtual address (64)          |        R_Key (32)         |
//! ACK     (52) |ver|flg| path |  CE count   |   cumulative path seq  |  ts echo    |
//!              |   ACK delay (ns)  |  rate hint (Mb/s)  |  SACK bitvector (256 bits) |
//! NACK    (16) |ver|flg| path |reason| rsvd |     path seq      | stream id | rsvd  |  msn  |
//! probe   (16) |ver|flg| path |    rsvd     |     probe seq     | timestamp | ts echo |
//! piggyback ACK (56), opening the body of a data packet whose data header has flag A:
//!              | rsvd | cumulative PSN (24) |        ACK header (52)                    |
//! ```

mod ack;
mod control;
mod data;

pub use ack::{MrAckRepr, PiggyAck, SACK_BITS};
pub use control::{MrNackRepr, MrProbeRepr, NackReason};
pub use data::{MrDataRepr, MrRemoteRepr};

use super::{Error, Header};

/// The MetaRoCE wire-format version this crate speaks.
pub const VERSION: u8 = 1;

/// Checks the version nibble of a header's first byte and returns the flag nibble.
#[inline(always)]
fn check_version(first: u8, header: Header) -> Result<u8, Error> {
    let found = first >> 4;
    if found != VERSION {
        return Err(Error::MetaRoceVersion { header, found });
    }
    Ok(first & 0x0f)
}

/// The first byte of a header: version and flags.
#[inline(always)]
const fn version_byte(flags: u8) -> u8 {
    (VERSION << 4) | (flags & 0x0f)
}
