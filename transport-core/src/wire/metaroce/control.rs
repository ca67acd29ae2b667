//! The MetaRoCE NACK and path probe headers.

use super::{check_version, version_byte};
use crate::wire::layout;
use crate::wire::{split, split_mut, Error, Header};
use zerocopy::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct NackHeader {
    ver_flags: u8,
    path_id: u8,
    reason: u8,
    reserved0: u8,
    path_seq: U32,
    stream_id: U16,
    reserved1: U16,
    msn: U32,
}
const _: () = assert!(core::mem::size_of::<NackHeader>() == 16);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ProbeHeader {
    ver_flags: u8,
    path_id: u8,
    reserved: U16,
    probe_seq: U32,
    timestamp: U32,
    ts_echo: U32,
}
const _: () = assert!(core::mem::size_of::<ProbeHeader>() == 16);

macro_rules! reasons {
    ($( $(#[$doc:meta])* $name:ident = $val:literal, $text:literal; )*) => {
        /// Why a receiver refused a packet.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "defmt", derive(defmt::Format))]
        pub enum NackReason {
            $( $(#[$doc])* $name, )*
            /// A code this version does not define.
            Unknown(u8),
        }

        impl NackReason {
            /// The reason of a code.
            pub const fn from_u8(v: u8) -> Self {
                match v { $( $val => NackReason::$name, )* other => NackReason::Unknown(other) }
            }

            /// The code on the wire.
            pub const fn to_u8(self) -> u8 {
                match self { $( NackReason::$name => $val, )* NackReason::Unknown(v) => v }
            }

            /// A short name for printing.
            pub const fn name(self) -> &'static str {
                match self { $( NackReason::$name => $text, )* NackReason::Unknown(_) => "unknown" }
            }
        }
    };
}

reasons! {
    /// The R_Key names no registered region.
    InvalidRkey = 0x01, "invalid rkey";
    /// The access falls outside the region (or its address plus length overflows).
    OutOfBounds = 0x02, "out of bounds";
    /// The region does not grant the access (remote write, read or atomic).
    AccessDenied = 0x03, "access denied";
    /// No receive buffer is posted for the Send's message sequence number.
    ReceiverNotReady = 0x04, "receiver not ready";
    /// The Send is longer than the receive buffer it matched.
    MessageTooLong = 0x05, "message too long";
    /// The request is malformed (bad alignment, inconsistent lengths, unknown stream).
    InvalidRequest = 0x06, "invalid request";
    /// The sequence number lies outside the receive window.
    OutOfWindow = 0x07, "out of window";
    /// The responder could not complete the operation for a local reason.
    RemoteOperational = 0x08, "remote operational error";
    /// Not a refusal: the requester confirms that it received the refusal of this PSN, so the
    /// responder may stop repeating it (section 6.4 of docs/PROTOCOL.md).
    RefusalSeen = 0x09, "refusal seen";
}

/// A negative acknowledgement of one data packet, with its reason.
///
/// The BTH PSN carries the connection-level PSN of the refused packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MrNackRepr {
    /// The path the refused packet arrived on.
    pub path_id: u8,
    /// Why it was refused.
    pub reason: NackReason,
    /// Its path sequence number.
    pub path_seq: u32,
    /// Its stream.
    pub stream_id: u16,
    /// Its message sequence number.
    pub msn: u32,
}

impl MrNackRepr {
    /// Bytes this header occupies on the wire.
    pub const LEN: usize = layout::MR_NACK_LEN;

    /// Parses the header, returning it and the bytes after it.
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), Error> {
        let (h, rest) = split::<NackHeader>(buf, Header::MrNack)?;
        check_version(h.ver_flags, Header::MrNack)?;
        let repr = MrNackRepr {
            path_id: h.path_id,
            reason: NackReason::from_u8(h.reason),
            path_seq: h.path_seq.get(),
            stream_id: h.stream_id.get(),
            msn: h.msn.get(),
        };
        Ok((repr, rest))
    }

    /// Writes the header, returning the bytes after it.
    pub fn emit(self, buf: &mut [u8]) -> Result<&mut [u8], Error> {
        let (h, rest) = split_mut::<NackHeader>(buf, Header::MrNack)?;
        h.ver_flags = version_byte(0);
        h.path_id = self.path_id;
        h.reason = self.reason.to_u8();
        h.reserved0 = 0;
        h.path_seq.set(self.path_seq);
        h.stream_id.set(self.stream_id);
        h.reserved1.set(0);
        h.msn.set(self.msn);
        Ok(rest)
    }
}

/// A path probe (opcode `MR_PROBE`) or its reply (`MR_PROBE_REPLY`), sent on the probed path's
/// UDP source port. The reply copies `path_id` and `probe_seq`, echoes `timestamp` in `ts_echo`
/// and puts its own clock in `timestamp`; a probe's `ts_echo` is zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MrProbeRepr {
    /// The probed path.
    pub path_id: u8,
    /// The probe's number on that path.
    pub probe_seq: u32,
    /// The sender's clock in nanoseconds, wrapping.
    pub timestamp: u32,
    /// The probe's timestamp, in a reply.
    pub ts_echo: u32,
}

impl MrProbeRepr {
    /// Bytes this header occupies on the wire.
    pub const LEN: usize = layout::MR_PROBE_LEN;

    /// Parses the header, returning it and the bytes after it.
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), Error> {
        let (h, rest) = split::<ProbeHeader>(buf, Header::MrProbe)?;
        check_version(h.ver_flags, Header::MrProbe)?;
        let repr = MrProbeRepr {
            path_id: h.path_id,
            probe_seq: h.probe_seq.get(),
            timestamp: h.timestamp.get(),
            ts_echo: h.ts_echo.get(),
        };
        Ok((repr, rest))
    }

    /// Writes the header, returning the bytes after it.
    pub fn emit(self, buf: &mut [u8]) -> Result<&mut [u8], Error> {
        let (h, rest) = split_mut::<ProbeHeader>(buf, Header::MrProbe)?;
        h.ver_flags = version_byte(0);
        h.path_id = self.path_id;
        h.reserved.set(0);
        h.probe_seq.set(self.probe_seq);
        h.timestamp.set(self.timestamp);
        h.ts_echo.set(self.ts_echo);
        Ok(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_nack() {
        let bytes = [
            0x10, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x09, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x11,
        ];
        let (r, _) = MrNackRepr::parse(&bytes).unwrap();
        assert_eq!(
            r,
            MrNackRepr {
                path_id: 2,
                reason: NackReason::AccessDenied,
                path_seq: 9,
                stream_id: 4,
                msn: 17
            }
        );
        let mut out = [0u8; 16];
        r.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn reasons_round_trip() {
        for v in 0..=255u8 {
            assert_eq!(NackReason::from_u8(v).to_u8(), v);
        }
    }

    #[test]
    fn golden_probe() {
        let bytes = [0x10, 0x05, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3];
        let (r, _) = MrProbeRepr::parse(&bytes).unwrap();
        assert_eq!(
            r,
            MrProbeRepr {
                path_id: 5,
                probe_seq: 1,
                timestamp: 2,
                ts_echo: 3
            }
        );
        let mut out = [0u8; 16];
        r.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
    }
}
