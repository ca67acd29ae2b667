//! The InfiniBand base transport header (IBTA vol. 1 section 9.2, RoCEv2 per Annex A17) and the
//! opcodes of every RC, UC and UD operation, the CNP and this project's MetaRoCE operations.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |    OpCode     |S|M|Pad|  TVer |            P_Key              |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |F|B|  resv6    |              destination QP                   |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |A|   resv7     |           packet sequence number              |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//! S solicited event, M migration request, Pad pad count, F FECN, B BECN, A acknowledge request.
//! Reserved bits are ignored on parse and written as zero.

use super::layout::Layout;
use super::{split, split_mut, Error, Header};
use core::fmt;
use zerocopy::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct BthHeader {
    opcode: u8,
    flags: u8,
    pkey: U16,
    /// FECN, BECN, resv6 and the destination QP (24-bit field under a mask).
    fb_qp: U32,
    /// AckReq, resv7 and the PSN (24-bit field under a mask).
    a_psn: U32,
}
const _: () = assert!(core::mem::size_of::<BthHeader>() == 12);

const MASK24: u32 = 0x00ff_ffff;

/// A 24-bit packet sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Psn(u32);

impl Psn {
    /// The PSN space: 2^24 values.
    pub const MODULUS: u32 = 1 << 24;

    /// The PSN of `value`'s low 24 bits.
    pub const fn new(value: u32) -> Self {
        Psn(value & MASK24)
    }

    /// The 24-bit value.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    pub const fn wrapping_add(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_add(n))
    }
}

/// A 24-bit queue pair number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Qpn(u32);

impl Qpn {
    /// The QPN of `value`'s low 24 bits.
    pub const fn new(value: u32) -> Self {
        Qpn(value & MASK24)
    }

    /// The 24-bit value.
    pub const fn get(self) -> u32 {
        self.0
    }
}

/// The transport service an opcode belongs to (its top three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Transport {
    /// Reliable connection (000).
    Rc,
    /// Unreliable connection (001).
    Uc,
    /// Reliable datagram (010).
    Rd,
    /// Unreliable datagram (011).
    Ud,
    /// Congestion notification (100).
    Cnp,
    /// Extended reliable connection (101).
    Xrc,
    /// Manufacturer-specific (110 and 111): MetaRoCE lives here.
    Vendor,
}

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $name:ident = $val:literal, $text:literal, $layout:expr; )*) => {
        /// A BTH opcode. Unknown values are kept as [`Opcode::Unknown`]; build opcodes from bytes
        /// with [`Opcode::from_u8`] so that a known value is never wrapped as unknown.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "defmt", derive(defmt::Format))]
        pub enum Opcode {
            $( $(#[$doc])* $name, )*
            /// An opcode this crate does not know (RD, XRC, reserved or another vendor's).
            Unknown(u8),
        }

        impl Opcode {
            /// Every opcode this crate knows.
            pub const KNOWN: &'static [Opcode] = &[$( Opcode::$name, )*];

            /// The opcode of a byte.
            pub const fn from_u8(value: u8) -> Self {
                match value {
                    $( $val => Opcode::$name, )*
                    other => Opcode::Unknown(other),
                }
            }

            /// The byte on the wire.
            pub const fn to_u8(self) -> u8 {
                match self {
                    $( Opcode::$name => $val, )*
                    Opcode::Unknown(v) => v,
                }
            }

            /// The specification's name, e.g. `RC_RDMA_WRITE_ONLY`.
            pub const fn name(self) -> &'static str {
                match self {
                    $( Opcode::$name => $text, )*
                    Opcode::Unknown(_) => "UNKNOWN",
                }
            }

            /// The extension headers that follow the BTH for this opcode.
            pub const fn layout(self) -> Layout {
                match self {
                    $( Opcode::$name => $layout, )*
                    Opcode::Unknown(_) => Layout::None,
                }
            }

            /// The layout of an opcode byte, by table lookup (the receive path's way).
            #[inline(always)]
            pub const fn layout_of(value: u8) -> Layout {
                const TABLE: [Layout; 256] = {
                    let mut t = [Layout::None; 256];
                    let mut i = 0;
                    while i < 256 {
                        t[i] = Opcode::from_u8(i as u8).layout();
                        i += 1;
                    }
                    t
                };
                TABLE[value as usize]
            }
        }
    };
}

opcodes! {
    /// RC SEND first.
    RcSendFirst = 0x00, "RC_SEND_FIRST", Layout::None;
    /// RC SEND middle.
    RcSendMiddle = 0x01, "RC_SEND_MIDDLE", Layout::None;
    /// RC SEND last.
    RcSendLast = 0x02, "RC_SEND_LAST", Layout::None;
    /// RC SEND last with immediate.
    RcSendLastImm = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", Layout::Imm;
    /// RC SEND only.
    RcSendOnly = 0x04, "RC_SEND_ONLY", Layout::None;
    /// RC SEND only with immediate.
    RcSendOnlyImm = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", Layout::Imm;
    /// RC RDMA WRITE first.
    RcWriteFirst = 0x06, "RC_RDMA_WRITE_FIRST", Layout::Reth;
    /// RC RDMA WRITE middle.
    RcWriteMiddle = 0x07, "RC_RDMA_WRITE_MIDDLE", Layout::None;
    /// RC RDMA WRITE last.
    RcWriteLast = 0x08, "RC_RDMA_WRITE_LAST", Layout::None;
    /// RC RDMA WRITE last with immediate.
    RcWriteLastImm = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Layout::Imm;
    /// RC RDMA WRITE only.
    RcWriteOnly = 0x0a, "RC_RDMA_WRITE_ONLY", Layout::Reth;
    /// RC RDMA WRITE only with immediate.
    RcWriteOnlyImm = 0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Layout::RethImm;
    /// RC RDMA READ request.
    RcReadRequest = 0x0c, "RC_RDMA_READ_REQUEST", Layout::Reth;
    /// RC RDMA READ response first.
    RcReadResponseFirst = 0x0d, "RC_RDMA_READ_RESPONSE_FIRST", Layout::Aeth;
    /// RC RDMA READ response middle.
    RcReadResponseMiddle = 0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE", Layout::None;
    /// RC RDMA READ response last.
    RcReadResponseLast = 0x0f, "RC_RDMA_READ_RESPONSE_LAST", Layout::Aeth;
    /// RC RDMA READ response only.
    RcReadResponseOnly = 0x10, "RC_RDMA_READ_RESPONSE_ONLY", Layout::Aeth;
    /// RC acknowledge.
    RcAck = 0x11, "RC_ACKNOWLEDGE", Layout::Aeth;
    /// RC atomic acknowledge.
    RcAtomicAck = 0x12, "RC_ATOMIC_ACKNOWLEDGE", Layout::AethAtomicAck;
    /// RC compare and swap.
    RcCompareSwap = 0x13, "RC_CMP_SWAP", Layout::AtomicEth;
    /// RC fetch and add.
    RcFetchAdd = 0x14, "RC_FETCH_ADD", Layout::AtomicEth;
    /// RC SEND last with invalidate.
    RcSendLastInv = 0x16, "RC_SEND_LAST_WITH_INVALIDATE", Layout::Ieth;
    /// RC SEND only with invalidate.
    RcSendOnlyInv = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", Layout::Ieth;
    /// UC SEND first.
    UcSendFirst = 0x20, "UC_SEND_FIRST", Layout::None;
    /// UC SEND middle.
    UcSendMiddle = 0x21, "UC_SEND_MIDDLE", Layout::None;
    /// UC SEND last.
    UcSendLast = 0x22, "UC_SEND_LAST", Layout::None;
    /// UC SEND last with immediate.
    UcSendLastImm = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE", Layout::Imm;
    /// UC SEND only.
    UcSendOnly = 0x24, "UC_SEND_ONLY", Layout::None;
    /// UC SEND only with immediate.
    UcSendOnlyImm = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", Layout::Imm;
    /// UC RDMA WRITE first.
    UcWriteFirst = 0x26, "UC_RDMA_WRITE_FIRST", Layout::Reth;
    /// UC RDMA WRITE middle.
    UcWriteMiddle = 0x27, "UC_RDMA_WRITE_MIDDLE", Layout::None;
    /// UC RDMA WRITE last.
    UcWriteLast = 0x28, "UC_RDMA_WRITE_LAST", Layout::None;
    /// UC RDMA WRITE last with immediate.
    UcWriteLastImm = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Layout::Imm;
    /// UC RDMA WRITE only.
    UcWriteOnly = 0x2a, "UC_RDMA_WRITE_ONLY", Layout::Reth;
    /// UC RDMA WRITE only with immediate.
    UcWriteOnlyImm = 0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Layout::RethImm;
    /// UD SEND only.
    UdSendOnly = 0x64, "UD_SEND_ONLY", Layout::Deth;
    /// UD SEND only with immediate.
    UdSendOnlyImm = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", Layout::DethImm;
    /// Congestion notification packet (RoCEv2 Annex A17.9.3).
    Cnp = 0x81, "CNP", Layout::Cnp;
    /// MetaRoCE SEND data.
    MrSend = 0xc0, "MR_SEND", Layout::MrData;
    /// MetaRoCE SEND data with immediate.
    MrSendImm = 0xc1, "MR_SEND_WITH_IMMEDIATE", Layout::MrDataImm;
    /// MetaRoCE WRITE data.
    MrWrite = 0xc2, "MR_WRITE", Layout::MrRemote;
    /// MetaRoCE WRITE data with immediate.
    MrWriteImm = 0xc3, "MR_WRITE_WITH_IMMEDIATE", Layout::MrRemoteImm;
    /// MetaRoCE READ request.
    MrReadRequest = 0xc4, "MR_READ_REQUEST", Layout::MrRemote;
    /// MetaRoCE READ response data.
    MrReadResponse = 0xc5, "MR_READ_RESPONSE", Layout::MrData;
    /// MetaRoCE compare and swap.
    MrCompareSwap = 0xc6, "MR_CMP_SWAP", Layout::MrAtomic;
    /// MetaRoCE fetch and add.
    MrFetchAdd = 0xc7, "MR_FETCH_ADD", Layout::MrAtomic;
    /// MetaRoCE atomic response.
    MrAtomicResponse = 0xc8, "MR_ATOMIC_RESPONSE", Layout::MrAtomicAck;
    /// MetaRoCE per-path ACK with SACK bitvector.
    MrAck = 0xe0, "MR_ACK", Layout::MrAck;
    /// MetaRoCE NACK.
    MrNack = 0xe1, "MR_NACK", Layout::MrNack;
    /// MetaRoCE path probe.
    MrProbe = 0xe2, "MR_PROBE", Layout::MrProbe;
    /// MetaRoCE path probe reply.
    MrProbeReply = 0xe3, "MR_PROBE_REPLY", Layout::MrProbe;
}

impl Opcode {
    /// The transport service of the opcode.
    pub const fn transport(self) -> Transport {
        match self.to_u8() >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            5 => Transport::Xrc,
            _ => Transport::Vendor,
        }
    }

    /// Whether this is one of this project's MetaRoCE opcodes.
    pub const fn is_metaroce(self) -> bool {
        matches!(self.transport(), Transport::Vendor) && !matches!(self, Opcode::Unknown(_))
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opcode::Unknown(v) => write!(f, "UNKNOWN(0x{v:02x})"),
            known => f.write_str(known.name()),
        }
    }
}

/// A base transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BthRepr {
    /// Operation code.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request (ConnectX sets it on RC and UD traffic).
    pub mig_req: bool,
    /// Pad bytes after the payload, 0-3.
    pub pad_count: u8,
    /// Transport header version, 0-15 (0 for IBTA).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward explicit congestion notification.
    pub fecn: bool,
    /// Backward explicit congestion notification.
    pub becn: bool,
    /// Destination queue pair.
    pub dest_qp: Qpn,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// Bytes this header occupies on the wire.
    pub const LEN: usize = 12;

    /// Parses the header, returning it and the bytes after it.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<(Self, &[u8]), Error> {
        let (h, rest) = split::<[u8; 12]>(buf, Header::Bth)?;
        Ok((Self::from_bytes(h), rest))
    }

    /// Reads the 12 bytes of a BTH; every bit pattern is a valid header.
    #[inline]
    pub fn from_bytes(b: &[u8; 12]) -> Self {
        let flags = b[1];
        let fb_qp = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        let a_psn = u32::from_be_bytes([b[8], b[9], b[10], b[11]]);
        BthRepr {
            opcode: Opcode::from_u8(b[0]),
            solicited: flags & 0x80 != 0,
            mig_req: flags & 0x40 != 0,
            pad_count: (flags >> 4) & 3,
            tver: flags & 0x0f,
            pkey: u16::from_be_bytes([b[2], b[3]]),
            fecn: fb_qp & 0x8000_0000 != 0,
            becn: fb_qp & 0x4000_0000 != 0,
            dest_qp: Qpn::new(fb_qp),
            ack_req: a_psn & 0x8000_0000 != 0,
            psn: Psn::new(a_psn),
        }
    }

    /// Writes the header, returning the bytes after it.
    pub fn emit<'b>(&self, buf: &'b mut [u8]) -> Result<&'b mut [u8], Error> {
        if self.pad_count > 3 {
            return Err(Error::FieldRange("BTH pad count"));
        }
        if self.tver > 15 {
            return Err(Error::FieldRange("BTH TVer"));
        }
        let (h, rest) = split_mut::<BthHeader>(buf, Header::Bth)?;
        h.opcode = self.opcode.to_u8();
        h.flags = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | (self.pad_count << 4)
            | self.tver;
        h.pkey.set(self.pkey);
        h.fb_qp
            .set((u32::from(self.fecn) << 31) | (u32::from(self.becn) << 30) | self.dest_qp.get());
        h.a_psn
            .set((u32::from(self.ack_req) << 31) | self.psn.get());
        Ok(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_cnp_bth() {
        // BTH of the ConnectX CNP vector: opcode 0x81, P_Key 0xffff, BECN, QP 0x000118.
        let bytes = [0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0, 0, 0, 0];
        let (r, rest) = BthRepr::parse(&bytes).unwrap();
        assert!(rest.is_empty());
        assert_eq!(r.opcode, Opcode::Cnp);
        assert!(r.becn && !r.fecn);
        assert_eq!(r.dest_qp, Qpn::new(0x118));
        assert_eq!(r.pkey, 0xffff);
        let mut out = [0u8; 12];
        r.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn every_byte_round_trips_through_opcode() {
        for v in 0..=255u8 {
            assert_eq!(Opcode::from_u8(v).to_u8(), v);
        }
        for op in Opcode::KNOWN {
            assert_eq!(Opcode::from_u8(op.to_u8()), *op);
        }
    }

    #[test]
    fn transports() {
        assert_eq!(Opcode::RcAck.transport(), Transport::Rc);
        assert_eq!(Opcode::UcWriteOnly.transport(), Transport::Uc);
        assert_eq!(Opcode::UdSendOnly.transport(), Transport::Ud);
        assert_eq!(Opcode::Cnp.transport(), Transport::Cnp);
        assert!(Opcode::MrAck.is_metaroce());
        assert!(!Opcode::from_u8(0xff).is_metaroce());
    }
}
