//! The extension transport headers that follow the BTH (IBTA vol. 1 section 9.3) and the set of
//! them each opcode carries.
//!
//! ```text
//! RETH (16)     | virtual address (64) | R_Key (32) | DMA length (32) |
//! AETH (4)      | syndrome (8) | MSN (24) |
//! AtomicETH (28)| virtual address (64) | R_Key (32) | swap or add data (64) | compare data (64) |
//! AtomicAckETH  | original remote data (64) |
//! ImmDt (4)     | immediate data (32) |
//! IETH (4)      | R_Key to invalidate (32) |
//! DETH (8)      | Q_Key (32) | reserved (8) | source QP (24) |
//! CNP (16)      | reserved, zero (128) |
//! ```
//! AETH syndrome: bit 7 reserved; bits 6-5 type (00 ACK, 01 RNR NAK, 11 NAK); bits 4-0 the
//! credit count, the RNR timer or the NAK code.
//!
//! Headers appear in this order: MetaRoCE data, DETH, MetaRoCE remote, RETH, AtomicETH, AETH,
//! AtomicAckETH, ImmDt, IETH, CNP, MetaRoCE ACK, NACK, probe. No opcode carries two that conflict.

use super::bth::Qpn;
use super::metaroce::{MrAckRepr, MrDataRepr, MrNackRepr, MrProbeRepr, MrRemoteRepr};
use super::{split, split_mut, Error, Header};
use zerocopy::network_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The set of extension headers an opcode carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Layout(u16);

macro_rules! layout_bits {
    ($( $bit:literal $name:ident $has:ident $doc:literal; )*) => {
        impl Layout {
            $(
                #[doc = concat!("This layout plus ", $doc, ".")]
                pub const fn $name(self) -> Self { Layout(self.0 | (1 << $bit)) }
                #[doc = concat!("Whether the layout carries ", $doc, ".")]
                pub const fn $has(self) -> bool { self.0 & (1 << $bit) != 0 }
            )*
        }
    };
}

layout_bits! {
    0 reth has_reth "a RETH";
    1 aeth has_aeth "an AETH";
    2 immdt has_immdt "immediate data";
    3 ieth has_ieth "an IETH";
    4 deth has_deth "a DETH";
    5 atomic_eth has_atomic_eth "an AtomicETH";
    6 atomic_ack_eth has_atomic_ack_eth "an AtomicAckETH";
    7 cnp has_cnp "the CNP's reserved bytes";
    8 mr_data has_mr_data "a MetaRoCE data header";
    9 mr_remote has_mr_remote "a MetaRoCE remote header";
    10 mr_ack has_mr_ack "a MetaRoCE ACK header";
    11 mr_nack has_mr_nack "a MetaRoCE NACK header";
    12 mr_probe has_mr_probe "a MetaRoCE probe header";
}

impl Layout {
    /// No extension header.
    pub const NONE: Layout = Layout(0);
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RethHeader {
    va: U64,
    rkey: U32,
    dma_len: U32,
}
const _: () = assert!(core::mem::size_of::<RethHeader>() == 16);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AtomicEthHeader {
    va: U64,
    rkey: U32,
    swap_add: U64,
    compare: U64,
}
const _: () = assert!(core::mem::size_of::<AtomicEthHeader>() == 28);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct DethHeader {
    qkey: U32,
    src_qp: U32,
}
const _: () = assert!(core::mem::size_of::<DethHeader>() == 8);

/// RDMA extended transport header: where a Write or Read goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole DMA transfer in bytes.
    pub dma_len: u32,
}

/// What an AETH syndrome says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AckSyndrome {
    /// Positive acknowledgement with a credit count (31 means invalid or unlimited credit).
    Ack {
        /// The 5-bit credit count code.
        credit: u8,
    },
    /// Receiver not ready, retry after the encoded timer.
    RnrNak {
        /// The 5-bit RNR timer code.
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// A reserved syndrome value.
    Reserved(u8),
}

/// The code of a NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum NakCode {
    /// PSN sequence error (0).
    PsnSequenceError,
    /// Invalid request (1).
    InvalidRequest,
    /// Remote access error (2).
    RemoteAccessError,
    /// Remote operational error (3).
    RemoteOperationalError,
    /// Invalid RD request (4).
    InvalidRdRequest,
    /// A reserved code.
    Reserved(u8),
}

impl NakCode {
    /// A short name for printing.
    pub const fn name(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => "PSN sequence error",
            NakCode::InvalidRequest => "invalid request",
            NakCode::RemoteAccessError => "remote access error",
            NakCode::RemoteOperationalError => "remote operational error",
            NakCode::InvalidRdRequest => "invalid RD request",
            NakCode::Reserved(_) => "reserved",
        }
    }
}

impl AckSyndrome {
    /// Decodes a syndrome byte.
    pub const fn from_u8(s: u8) -> Self {
        let value = s & 0x1f;
        if s & 0x80 != 0 {
            return AckSyndrome::Reserved(s);
        }
        match (s >> 5) & 3 {
            0 => AckSyndrome::Ack { credit: value },
            1 => AckSyndrome::RnrNak { timer: value },
            3 => AckSyndrome::Nak(match value {
                0 => NakCode::PsnSequenceError,
                1 => NakCode::InvalidRequest,
                2 => NakCode::RemoteAccessError,
                3 => NakCode::RemoteOperationalError,
                4 => NakCode::InvalidRdRequest,
                other => NakCode::Reserved(other),
            }),
            _ => AckSyndrome::Reserved(s),
        }
    }
}

/// ACK extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AethRepr {
    /// The raw syndrome byte; [`AethRepr::kind`] decodes it.
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// What the syndrome says.
    pub const fn kind(&self) -> AckSyndrome {
        AckSyndrome::from_u8(self.syndrome)
    }
}

/// Datagram extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source queue pair.
    pub src_qp: Qpn,
}

/// Atomic extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AtomicEthRepr {
    /// Remote virtual address (8-byte aligned for a valid request).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap data (compare and swap) or add data (fetch and add).
    pub swap_add: u64,
    /// Compare data (compare and swap).
    pub compare: u64,
}

/// Atomic ACK extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AtomicAckEthRepr {
    /// The remote data before the atomic operation.
    pub orig: u64,
}

/// The extension headers of one packet: exactly those its opcode's [`Layout`] names are present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Extensions {
    /// MetaRoCE data header.
    pub mr_data: Option<MrDataRepr>,
    /// DETH.
    pub deth: Option<DethRepr>,
    /// MetaRoCE remote header.
    pub mr_remote: Option<MrRemoteRepr>,
    /// RETH.
    pub reth: Option<RethRepr>,
    /// AtomicETH.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH.
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data.
    pub immdt: Option<u32>,
    /// IETH: the R_Key to invalidate.
    pub ieth: Option<u32>,
    /// Whether the CNP's 16 reserved bytes are present.
    pub cnp: bool,
    /// MetaRoCE ACK header.
    pub mr_ack: Option<MrAckRepr>,
    /// MetaRoCE NACK header.
    pub mr_nack: Option<MrNackRepr>,
    /// MetaRoCE probe header.
    pub mr_probe: Option<MrProbeRepr>,
}

fn be32(buf: &[u8], header: Header) -> Result<(u32, &[u8]), Error> {
    let (v, rest) = split::<U32>(buf, header)?;
    Ok((v.get(), rest))
}

fn put32(buf: &mut [u8], header: Header, value: u32) -> Result<&mut [u8], Error> {
    let (v, rest) = split_mut::<U32>(buf, header)?;
    v.set(value);
    Ok(rest)
}

/// Emits an optional header the layout requires, or refuses one it does not carry.
macro_rules! emit_one {
    ($buf:ident, $wanted:expr, $value:expr, $header:expr, |$v:ident, $b:ident| $body:expr) => {
        match ($wanted, $value) {
            (true, Some($v)) => {
                let $b = $buf;
                $buf = $body?;
            }
            (true, None) => return Err(Error::MissingHeader($header)),
            (false, Some(_)) => return Err(Error::UnexpectedHeader($header)),
            (false, None) => {}
        }
    };
}

impl Extensions {
    /// Parses the headers `layout` names, returning them and the bytes after them.
    #[inline]
    pub fn parse(layout: Layout, mut buf: &[u8]) -> Result<(Self, &[u8]), Error> {
        let mut ext = Extensions::default();
        if layout.0 == 0 {
            return Ok((ext, buf));
        }
        if layout.has_mr_data() {
            let (r, rest) = MrDataRepr::parse(buf)?;
            ext.mr_data = Some(r);
            buf = rest;
        }
        if layout.has_deth() {
            let (h, rest) = split::<DethHeader>(buf, Header::Deth)?;
            ext.deth = Some(DethRepr { qkey: h.qkey.get(), src_qp: Qpn::new(h.src_qp.get()) });
            buf = rest;
        }
        if layout.has_mr_remote() {
            let (r, rest) = MrRemoteRepr::parse(buf)?;
            ext.mr_remote = Some(r);
            buf = rest;
        }
        if layout.has_reth() {
            let (h, rest) = split::<RethHeader>(buf, Header::Reth)?;
            ext.reth =
                Some(RethRepr { va: h.va.get(), rkey: h.rkey.get(), dma_len: h.dma_len.get() });
            buf = rest;
        }
        if layout.has_atomic_eth() {
            let (h, rest) = split::<AtomicEthHeader>(buf, Header::AtomicEth)?;
            ext.atomic_eth = Some(AtomicEthRepr {
                va: h.va.get(),
                rkey: h.rkey.get(),
                swap_add: h.swap_add.get(),
                compare: h.compare.get(),
            });
            buf = rest;
        }
        if layout.has_aeth() {
            let (v, rest) = be32(buf, Header::Aeth)?;
            ext.aeth = Some(AethRepr { syndrome: (v >> 24) as u8, msn: v & 0x00ff_ffff });
            buf = rest;
        }
        if layout.has_atomic_ack_eth() {
            let (v, rest) = split::<U64>(buf, Header::AtomicAckEth)?;
            ext.atomic_ack_eth = Some(AtomicAckEthRepr { orig: v.get() });
            buf = rest;
        }
        if layout.has_immdt() {
            let (v, rest) = be32(buf, Header::ImmDt)?;
            ext.immdt = Some(v);
            buf = rest;
        }
        if layout.has_ieth() {
            let (v, rest) = be32(buf, Header::Ieth)?;
            ext.ieth = Some(v);
            buf = rest;
        }
        if layout.has_cnp() {
            let (_, rest) = split::<[u8; 16]>(buf, Header::Cnp)?;
            ext.cnp = true;
            buf = rest;
        }
        if layout.has_mr_ack() {
            let (r, rest) = MrAckRepr::parse(buf)?;
            ext.mr_ack = Some(r);
            buf = rest;
        }
        if layout.has_mr_nack() {
            let (r, rest) = MrNackRepr::parse(buf)?;
            ext.mr_nack = Some(r);
            buf = rest;
        }
        if layout.has_mr_probe() {
            let (r, rest) = MrProbeRepr::parse(buf)?;
            ext.mr_probe = Some(r);
            buf = rest;
        }
        Ok((ext, buf))
    }

    /// Bytes these headers occupy on the wire.
    pub fn len(&self) -> usize {
        let sizes = [
            (self.mr_data.is_some(), MrDataRepr::LEN),
            (self.deth.is_some(), 8),
            (self.mr_remote.is_some(), MrRemoteRepr::LEN),
            (self.reth.is_some(), 16),
            (self.atomic_eth.is_some(), 28),
            (self.aeth.is_some(), 4),
            (self.atomic_ack_eth.is_some(), 8),
            (self.immdt.is_some(), 4),
            (self.ieth.is_some(), 4),
            (self.cnp, 16),
            (self.mr_ack.is_some(), MrAckRepr::LEN),
            (self.mr_nack.is_some(), MrNackRepr::LEN),
            (self.mr_probe.is_some(), MrProbeRepr::LEN),
        ];
        sizes.iter().filter(|(present, _)| *present).map(|(_, n)| n).sum()
    }

    /// Whether no extension header is present.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the headers, which must be exactly those `layout` names, returning the bytes after.
    pub fn emit<'b>(&self, layout: Layout, mut buf: &'b mut [u8]) -> Result<&'b mut [u8], Error> {
        emit_one!(buf, layout.has_mr_data(), self.mr_data, Header::MrData, |r, b| r.emit(b));
        emit_one!(buf, layout.has_deth(), self.deth, Header::Deth, |r, b| {
            split_mut::<DethHeader>(b, Header::Deth).map(|(h, rest)| {
                h.qkey.set(r.qkey);
                h.src_qp.set(r.src_qp.get());
                rest
            })
        });
        emit_one!(buf, layout.has_mr_remote(), self.mr_remote, Header::MrRemote, |r, b| r
            .emit(b));
        emit_one!(buf, layout.has_reth(), self.reth, Header::Reth, |r, b| {
            split_mut::<RethHeader>(b, Header::Reth).map(|(h, rest)| {
                h.va.set(r.va);
                h.rkey.set(r.rkey);
                h.dma_len.set(r.dma_len);
                rest
            })
        });
        emit_one!(buf, layout.has_atomic_eth(), self.atomic_eth, Header::AtomicEth, |r, b| {
            split_mut::<AtomicEthHeader>(b, Header::AtomicEth).map(|(h, rest)| {
                h.va.set(r.va);
                h.rkey.set(r.rkey);
                h.swap_add.set(r.swap_add);
                h.compare.set(r.compare);
                rest
            })
        });
        emit_one!(buf, layout.has_aeth(), self.aeth, Header::Aeth, |r, b| {
            if r.msn > 0x00ff_ffff {
                return Err(Error::FieldRange("AETH MSN"));
            }
            put32(b, Header::Aeth, (u32::from(r.syndrome) << 24) | r.msn)
        });
        emit_one!(buf, layout.has_atomic_ack_eth(), self.atomic_ack_eth, Header::AtomicAckEth, |r, b| {
            split_mut::<U64>(b, Header::AtomicAckEth).map(|(h, rest)| {
                h.set(r.orig);
                rest
            })
        });
        emit_one!(buf, layout.has_immdt(), self.immdt, Header::ImmDt, |v, b| put32(
            b,
            Header::ImmDt,
            v
        ));
        emit_one!(buf, layout.has_ieth(), self.ieth, Header::Ieth, |v, b| put32(
            b,
            Header::Ieth,
            v
        ));
        let cnp = self.cnp.then_some(());
        emit_one!(buf, layout.has_cnp(), cnp, Header::Cnp, |_v, b| {
            split_mut::<[u8; 16]>(b, Header::Cnp).map(|(h, rest)| {
                *h = [0; 16];
                rest
            })
        });
        emit_one!(buf, layout.has_mr_ack(), self.mr_ack, Header::MrAck, |r, b| r.emit(b));
        emit_one!(buf, layout.has_mr_nack(), self.mr_nack, Header::MrNack, |r, b| r.emit(b));
        emit_one!(buf, layout.has_mr_probe(), self.mr_probe, Header::MrProbe, |r, b| r.emit(b));
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_decode() {
        assert_eq!(AckSyndrome::from_u8(0x1f), AckSyndrome::Ack { credit: 31 });
        assert_eq!(AckSyndrome::from_u8(0x00), AckSyndrome::Ack { credit: 0 });
        assert_eq!(AckSyndrome::from_u8(0x2e), AckSyndrome::RnrNak { timer: 14 });
        assert_eq!(AckSyndrome::from_u8(0x60), AckSyndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(AckSyndrome::from_u8(0x61), AckSyndrome::Nak(NakCode::InvalidRequest));
        assert_eq!(AckSyndrome::from_u8(0x62), AckSyndrome::Nak(NakCode::RemoteAccessError));
        assert_eq!(AckSyndrome::from_u8(0x63), AckSyndrome::Nak(NakCode::RemoteOperationalError));
        assert_eq!(AckSyndrome::from_u8(0x6a), AckSyndrome::Nak(NakCode::Reserved(10)));
        assert_eq!(AckSyndrome::from_u8(0x40), AckSyndrome::Reserved(0x40));
        assert_eq!(AckSyndrome::from_u8(0x80), AckSyndrome::Reserved(0x80));
    }

    #[test]
    fn write_only_imm_golden() {
        // RETH then ImmDt.
        let bytes = [
            0, 0, 0, 1, 2, 3, 4, 5, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0x10, 0, 0xca, 0xfe, 0xba, 0xbe,
        ];
        let layout = super::super::Opcode::RcWriteOnlyImm.layout();
        let (ext, rest) = Extensions::parse(layout, &bytes).unwrap();
        assert!(rest.is_empty());
        assert_eq!(ext.reth, Some(RethRepr { va: 0x0102030405, rkey: 0xdeadbeef, dma_len: 4096 }));
        assert_eq!(ext.immdt, Some(0xcafebabe));
        assert_eq!(ext.len(), 20);
        let mut out = [0u8; 20];
        ext.emit(layout, &mut out).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn emit_refuses_a_layout_mismatch() {
        let mut out = [0u8; 64];
        let ext = Extensions { reth: Some(RethRepr::default()), ..Default::default() };
        assert_eq!(
            ext.emit(Layout::NONE.aeth(), &mut out).unwrap_err(),
            Error::UnexpectedHeader(Header::Reth)
        );
        assert_eq!(
            Extensions::default().emit(Layout::NONE.aeth(), &mut out).unwrap_err(),
            Error::MissingHeader(Header::Aeth)
        );
    }
}
