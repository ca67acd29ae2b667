//! The MetaRoCE data header and remote-address header.

use super::{check_version, version_byte};
use crate::wire::layout;
use crate::wire::{split, split_mut, Error, Header};
use zerocopy::network_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct DataHeader {
    ver_flags: u8,
    path_id: u8,
    stream_id: U16,
    path_seq: U32,
    msn: U32,
    msg_offset: U32,
    msg_len: U32,
    timestamp: U32,
}
const _: () = assert!(core::mem::size_of::<DataHeader>() == 24);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RemoteHeader {
    va: U64,
    rkey: U32,
}
const _: () = assert!(core::mem::size_of::<RemoteHeader>() == 12);

const FLAG_RETRANSMIT: u8 = 0x1;
const FLAG_ACK: u8 = 0x2;

/// The data header: what makes every MetaRoCE data packet self-describing.
///
/// The BTH PSN of a data packet is its connection-level sequence number, which stays the same when
/// the packet is sent again; `path_seq` numbers transmissions on one path, so a gap in it is loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MrDataRepr {
    /// This transmission repeats an earlier one.
    pub retransmit: bool,
    /// An acknowledgement rides along: the packet's body opens with a [`PiggyAck`](super::PiggyAck) (56 bytes)
    /// before the payload.
    pub ack: bool,
    /// The path the packet was sent on.
    pub path_id: u8,
    /// The ordered stream the message belongs to.
    pub stream_id: u16,
    /// The packet's sequence number on its path.
    pub path_seq: u32,
    /// The message's sequence number within its stream (the receive match for a Send).
    pub msn: u32,
    /// Byte offset of this packet's payload within the message.
    pub msg_offset: u32,
    /// Length of the whole message in bytes.
    pub msg_len: u32,
    /// The sender's clock when the packet left, in nanoseconds, wrapping.
    pub timestamp: u32,
}

impl MrDataRepr {
    /// Bytes this header occupies on the wire.
    pub const LEN: usize = layout::MR_DATA_LEN;

    /// Parses the header, returning it and the bytes after it.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), Error> {
        let (h, rest) = split::<DataHeader>(buf, Header::MrData)?;
        let flags = check_version(h.ver_flags, Header::MrData)?;
        let repr = MrDataRepr {
            retransmit: flags & FLAG_RETRANSMIT != 0,
            ack: flags & FLAG_ACK != 0,
            path_id: h.path_id,
            stream_id: h.stream_id.get(),
            path_seq: h.path_seq.get(),
            msn: h.msn.get(),
            msg_offset: h.msg_offset.get(),
            msg_len: h.msg_len.get(),
            timestamp: h.timestamp.get(),
        };
        Ok((repr, rest))
    }

    /// Writes the header, returning the bytes after it.
    #[inline]
    pub fn emit(self, buf: &mut [u8]) -> Result<&mut [u8], Error> {
        let (h, rest) = split_mut::<DataHeader>(buf, Header::MrData)?;
        let flags =
            if self.retransmit { FLAG_RETRANSMIT } else { 0 } | if self.ack { FLAG_ACK } else { 0 };
        h.ver_flags = version_byte(flags);
        h.path_id = self.path_id;
        h.stream_id.set(self.stream_id);
        h.path_seq.set(self.path_seq);
        h.msn.set(self.msn);
        h.msg_offset.set(self.msg_offset);
        h.msg_len.set(self.msg_len);
        h.timestamp.set(self.timestamp);
        Ok(rest)
    }
}

/// The remote-address header on every Write packet and Read request: the message's base address
/// in the responder's memory and the key that grants it. A packet lands at `va + msg_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MrRemoteRepr {
    /// Base virtual address of the message in the remote region.
    pub va: u64,
    /// Remote key of the region.
    pub rkey: u32,
}

impl MrRemoteRepr {
    /// Bytes this header occupies on the wire.
    pub const LEN: usize = layout::MR_REMOTE_LEN;

    /// Parses the header, returning it and the bytes after it.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), Error> {
        let (h, rest) = split::<RemoteHeader>(buf, Header::MrRemote)?;
        Ok((
            MrRemoteRepr {
                va: h.va.get(),
                rkey: h.rkey.get(),
            },
            rest,
        ))
    }

    /// Writes the header, returning the bytes after it.
    #[inline]
    pub fn emit(self, buf: &mut [u8]) -> Result<&mut [u8], Error> {
        let (h, rest) = split_mut::<RemoteHeader>(buf, Header::MrRemote)?;
        h.va.set(self.va);
        h.rkey.set(self.rkey);
        Ok(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_data_header() {
        let bytes = [
            0x11, 0x07, 0x00, 0x02, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2a, 0x00, 0x00,
            0x10, 0x00, 0x00, 0x01, 0x00, 0x00, 0x12, 0x34, 0x56, 0x78,
        ];
        let (r, rest) = MrDataRepr::parse(&bytes).unwrap();
        assert!(rest.is_empty());
        assert_eq!(
            r,
            MrDataRepr {
                retransmit: true,
                ack: false,
                path_id: 7,
                stream_id: 2,
                path_seq: 256,
                msn: 42,
                msg_offset: 4096,
                msg_len: 65536,
                timestamp: 0x12345678,
            }
        );
        let mut out = [0u8; 24];
        r.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
        // Flag A (0x2): an acknowledgement rides along.
        let mut with_ack = bytes;
        with_ack[0] = 0x13;
        let (a, _) = MrDataRepr::parse(&with_ack).unwrap();
        assert!(a.ack && a.retransmit);
        a.emit(&mut out).unwrap();
        assert_eq!(out, with_ack);
    }

    #[test]
    fn other_versions_are_refused() {
        let mut bytes = [0u8; 24];
        bytes[0] = 0x20;
        assert_eq!(
            MrDataRepr::parse(&bytes).unwrap_err(),
            Error::MetaRoceVersion {
                header: Header::MrData,
                found: 2
            }
        );
    }
}
