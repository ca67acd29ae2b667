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
use super::layout::Layout;
use super::metaroce::{MrAckRepr, MrDataRepr, MrNackRepr, MrProbeRepr, MrRemoteRepr};
use super::{split, split_mut, Error, Header};
use zerocopy::network_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

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

/// The extension headers of one packet, as compact as the hot path wants them: one variant per
/// [`Layout`], so a parsed frame carries only the headers its opcode has. [`ExtensionFields`]
/// is the same information as one optional field per header, for code that builds or prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[allow(missing_docs)] // each variant is named after its Layout
pub enum Extensions {
    #[default]
    None,
    Reth(RethRepr),
    RethImm(RethRepr, u32),
    Imm(u32),
    Ieth(u32),
    Aeth(AethRepr),
    AethAtomicAck(AethRepr, AtomicAckEthRepr),
    AtomicEth(AtomicEthRepr),
    Deth(DethRepr),
    DethImm(DethRepr, u32),
    Cnp,
    MrData(MrDataRepr),
    MrDataImm(MrDataRepr, u32),
    MrRemote(MrDataRepr, MrRemoteRepr),
    MrRemoteImm(MrDataRepr, MrRemoteRepr, u32),
    MrAtomic(MrDataRepr, AtomicEthRepr),
    MrAtomicAck(MrDataRepr, AtomicAckEthRepr),
    MrAck(MrAckRepr),
    MrNack(MrNackRepr),
    MrProbe(MrProbeRepr),
}

/// The extension headers as one optional field each: the convenient form for building frames and
/// printing them. [`Extensions::from_fields`] and [`Extensions::fields`] convert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ExtensionFields {
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

#[inline(always)]
fn be32(buf: &[u8], header: Header) -> Result<(u32, &[u8]), Error> {
    let (v, rest) = split::<U32>(buf, header)?;
    Ok((v.get(), rest))
}

#[inline(always)]
fn put32(buf: &mut [u8], header: Header, value: u32) -> Result<&mut [u8], Error> {
    let (v, rest) = split_mut::<U32>(buf, header)?;
    v.set(value);
    Ok(rest)
}

#[inline(always)]
fn parse_reth(buf: &[u8]) -> Result<(RethRepr, &[u8]), Error> {
    let (h, rest) = split::<RethHeader>(buf, Header::Reth)?;
    Ok((
        RethRepr {
            va: h.va.get(),
            rkey: h.rkey.get(),
            dma_len: h.dma_len.get(),
        },
        rest,
    ))
}

#[inline(always)]
fn parse_aeth(buf: &[u8]) -> Result<(AethRepr, &[u8]), Error> {
    let (v, rest) = be32(buf, Header::Aeth)?;
    Ok((
        AethRepr {
            syndrome: (v >> 24) as u8,
            msn: v & 0x00ff_ffff,
        },
        rest,
    ))
}

#[inline(always)]
fn parse_deth(buf: &[u8]) -> Result<(DethRepr, &[u8]), Error> {
    let (h, rest) = split::<DethHeader>(buf, Header::Deth)?;
    Ok((
        DethRepr {
            qkey: h.qkey.get(),
            src_qp: Qpn::new(h.src_qp.get()),
        },
        rest,
    ))
}

#[inline(always)]
fn parse_atomic(buf: &[u8]) -> Result<(AtomicEthRepr, &[u8]), Error> {
    let (h, rest) = split::<AtomicEthHeader>(buf, Header::AtomicEth)?;
    let r = AtomicEthRepr {
        va: h.va.get(),
        rkey: h.rkey.get(),
        swap_add: h.swap_add.get(),
        compare: h.compare.get(),
    };
    Ok((r, rest))
}

#[inline(always)]
fn parse_atomic_ack(buf: &[u8]) -> Result<(AtomicAckEthRepr, &[u8]), Error> {
    let (v, rest) = split::<U64>(buf, Header::AtomicAckEth)?;
    Ok((AtomicAckEthRepr { orig: v.get() }, rest))
}

fn emit_reth(r: RethRepr, buf: &mut [u8]) -> Result<&mut [u8], Error> {
    let (h, rest) = split_mut::<RethHeader>(buf, Header::Reth)?;
    h.va.set(r.va);
    h.rkey.set(r.rkey);
    h.dma_len.set(r.dma_len);
    Ok(rest)
}

fn emit_aeth(r: AethRepr, buf: &mut [u8]) -> Result<&mut [u8], Error> {
    if r.msn > 0x00ff_ffff {
        return Err(Error::FieldRange("AETH MSN"));
    }
    put32(buf, Header::Aeth, (u32::from(r.syndrome) << 24) | r.msn)
}

fn emit_deth(r: DethRepr, buf: &mut [u8]) -> Result<&mut [u8], Error> {
    let (h, rest) = split_mut::<DethHeader>(buf, Header::Deth)?;
    h.qkey.set(r.qkey);
    h.src_qp.set(r.src_qp.get());
    Ok(rest)
}

fn emit_atomic(r: AtomicEthRepr, buf: &mut [u8]) -> Result<&mut [u8], Error> {
    let (h, rest) = split_mut::<AtomicEthHeader>(buf, Header::AtomicEth)?;
    h.va.set(r.va);
    h.rkey.set(r.rkey);
    h.swap_add.set(r.swap_add);
    h.compare.set(r.compare);
    Ok(rest)
}

fn emit_atomic_ack(r: AtomicAckEthRepr, buf: &mut [u8]) -> Result<&mut [u8], Error> {
    let (h, rest) = split_mut::<U64>(buf, Header::AtomicAckEth)?;
    h.set(r.orig);
    Ok(rest)
}

impl Extensions {
    /// Parses the headers `layout` names, returning them and the bytes after them.
    #[inline]
    pub fn parse(layout: Layout, buf: &[u8]) -> Result<(Self, &[u8]), Error> {
        Ok(match layout {
            Layout::None => (Extensions::None, buf),
            Layout::Reth => {
                let (r, rest) = parse_reth(buf)?;
                (Extensions::Reth(r), rest)
            }
            Layout::RethImm => {
                let (r, rest) = parse_reth(buf)?;
                let (i, rest) = be32(rest, Header::ImmDt)?;
                (Extensions::RethImm(r, i), rest)
            }
            Layout::Imm => {
                let (i, rest) = be32(buf, Header::ImmDt)?;
                (Extensions::Imm(i), rest)
            }
            Layout::Ieth => {
                let (i, rest) = be32(buf, Header::Ieth)?;
                (Extensions::Ieth(i), rest)
            }
            Layout::Aeth => {
                let (a, rest) = parse_aeth(buf)?;
                (Extensions::Aeth(a), rest)
            }
            Layout::AethAtomicAck => {
                let (a, rest) = parse_aeth(buf)?;
                let (o, rest) = parse_atomic_ack(rest)?;
                (Extensions::AethAtomicAck(a, o), rest)
            }
            Layout::AtomicEth => {
                let (a, rest) = parse_atomic(buf)?;
                (Extensions::AtomicEth(a), rest)
            }
            Layout::Deth => {
                let (d, rest) = parse_deth(buf)?;
                (Extensions::Deth(d), rest)
            }
            Layout::DethImm => {
                let (d, rest) = parse_deth(buf)?;
                let (i, rest) = be32(rest, Header::ImmDt)?;
                (Extensions::DethImm(d, i), rest)
            }
            Layout::Cnp => {
                let (_, rest) = split::<[u8; 16]>(buf, Header::Cnp)?;
                (Extensions::Cnp, rest)
            }
            Layout::MrData => {
                let (d, rest) = MrDataRepr::parse(buf)?;
                (Extensions::MrData(d), rest)
            }
            Layout::MrDataImm => {
                let (d, rest) = MrDataRepr::parse(buf)?;
                let (i, rest) = be32(rest, Header::ImmDt)?;
                (Extensions::MrDataImm(d, i), rest)
            }
            Layout::MrRemote => {
                let (d, rest) = MrDataRepr::parse(buf)?;
                let (r, rest) = MrRemoteRepr::parse(rest)?;
                (Extensions::MrRemote(d, r), rest)
            }
            Layout::MrRemoteImm => {
                let (d, rest) = MrDataRepr::parse(buf)?;
                let (r, rest) = MrRemoteRepr::parse(rest)?;
                let (i, rest) = be32(rest, Header::ImmDt)?;
                (Extensions::MrRemoteImm(d, r, i), rest)
            }
            Layout::MrAtomic => {
                let (d, rest) = MrDataRepr::parse(buf)?;
                let (a, rest) = parse_atomic(rest)?;
                (Extensions::MrAtomic(d, a), rest)
            }
            Layout::MrAtomicAck => {
                let (d, rest) = MrDataRepr::parse(buf)?;
                let (o, rest) = parse_atomic_ack(rest)?;
                (Extensions::MrAtomicAck(d, o), rest)
            }
            Layout::MrAck => {
                let (a, rest) = MrAckRepr::parse(buf)?;
                (Extensions::MrAck(a), rest)
            }
            Layout::MrNack => {
                let (n, rest) = MrNackRepr::parse(buf)?;
                (Extensions::MrNack(n), rest)
            }
            Layout::MrProbe => {
                let (p, rest) = MrProbeRepr::parse(buf)?;
                (Extensions::MrProbe(p), rest)
            }
        })
    }

    /// The layout these headers form.
    pub const fn layout(&self) -> Layout {
        match self {
            Extensions::None => Layout::None,
            Extensions::Reth(_) => Layout::Reth,
            Extensions::RethImm(..) => Layout::RethImm,
            Extensions::Imm(_) => Layout::Imm,
            Extensions::Ieth(_) => Layout::Ieth,
            Extensions::Aeth(_) => Layout::Aeth,
            Extensions::AethAtomicAck(..) => Layout::AethAtomicAck,
            Extensions::AtomicEth(_) => Layout::AtomicEth,
            Extensions::Deth(_) => Layout::Deth,
            Extensions::DethImm(..) => Layout::DethImm,
            Extensions::Cnp => Layout::Cnp,
            Extensions::MrData(_) => Layout::MrData,
            Extensions::MrDataImm(..) => Layout::MrDataImm,
            Extensions::MrRemote(..) => Layout::MrRemote,
            Extensions::MrRemoteImm(..) => Layout::MrRemoteImm,
            Extensions::MrAtomic(..) => Layout::MrAtomic,
            Extensions::MrAtomicAck(..) => Layout::MrAtomicAck,
            Extensions::MrAck(_) => Layout::MrAck,
            Extensions::MrNack(_) => Layout::MrNack,
            Extensions::MrProbe(_) => Layout::MrProbe,
        }
    }

    /// Bytes these headers occupy on the wire.
    pub const fn len(&self) -> usize {
        self.layout().len()
    }

    /// Whether no extension header is present.
    pub const fn is_empty(&self) -> bool {
        matches!(self, Extensions::None)
    }

    /// Writes the headers, which must form exactly `layout`, returning the bytes after them.
    pub fn emit<'b>(&self, layout: Layout, buf: &'b mut [u8]) -> Result<&'b mut [u8], Error> {
        if self.layout() != layout {
            return Err(Error::ExtensionMismatch {
                expected: layout,
                found: self.layout(),
            });
        }
        match *self {
            Extensions::None => Ok(buf),
            Extensions::Reth(r) => emit_reth(r, buf),
            Extensions::RethImm(r, i) => put32(emit_reth(r, buf)?, Header::ImmDt, i),
            Extensions::Imm(i) => put32(buf, Header::ImmDt, i),
            Extensions::Ieth(i) => put32(buf, Header::Ieth, i),
            Extensions::Aeth(a) => emit_aeth(a, buf),
            Extensions::AethAtomicAck(a, o) => emit_atomic_ack(o, emit_aeth(a, buf)?),
            Extensions::AtomicEth(a) => emit_atomic(a, buf),
            Extensions::Deth(d) => emit_deth(d, buf),
            Extensions::DethImm(d, i) => put32(emit_deth(d, buf)?, Header::ImmDt, i),
            Extensions::Cnp => {
                let (h, rest) = split_mut::<[u8; 16]>(buf, Header::Cnp)?;
                *h = [0; 16];
                Ok(rest)
            }
            Extensions::MrData(d) => d.emit(buf),
            Extensions::MrDataImm(d, i) => put32(d.emit(buf)?, Header::ImmDt, i),
            Extensions::MrRemote(d, r) => r.emit(d.emit(buf)?),
            Extensions::MrRemoteImm(d, r, i) => put32(r.emit(d.emit(buf)?)?, Header::ImmDt, i),
            Extensions::MrAtomic(d, a) => emit_atomic(a, d.emit(buf)?),
            Extensions::MrAtomicAck(d, o) => emit_atomic_ack(o, d.emit(buf)?),
            Extensions::MrAck(a) => a.emit(buf),
            Extensions::MrNack(n) => n.emit(buf),
            Extensions::MrProbe(p) => p.emit(buf),
        }
    }

    /// The headers as one optional field each.
    pub fn fields(&self) -> ExtensionFields {
        let mut f = ExtensionFields::default();
        match *self {
            Extensions::None => {}
            Extensions::Reth(r) => f.reth = Some(r),
            Extensions::RethImm(r, i) => (f.reth, f.immdt) = (Some(r), Some(i)),
            Extensions::Imm(i) => f.immdt = Some(i),
            Extensions::Ieth(i) => f.ieth = Some(i),
            Extensions::Aeth(a) => f.aeth = Some(a),
            Extensions::AethAtomicAck(a, o) => (f.aeth, f.atomic_ack_eth) = (Some(a), Some(o)),
            Extensions::AtomicEth(a) => f.atomic_eth = Some(a),
            Extensions::Deth(d) => f.deth = Some(d),
            Extensions::DethImm(d, i) => (f.deth, f.immdt) = (Some(d), Some(i)),
            Extensions::Cnp => f.cnp = true,
            Extensions::MrData(d) => f.mr_data = Some(d),
            Extensions::MrDataImm(d, i) => (f.mr_data, f.immdt) = (Some(d), Some(i)),
            Extensions::MrRemote(d, r) => (f.mr_data, f.mr_remote) = (Some(d), Some(r)),
            Extensions::MrRemoteImm(d, r, i) => {
                (f.mr_data, f.mr_remote, f.immdt) = (Some(d), Some(r), Some(i))
            }
            Extensions::MrAtomic(d, a) => (f.mr_data, f.atomic_eth) = (Some(d), Some(a)),
            Extensions::MrAtomicAck(d, o) => (f.mr_data, f.atomic_ack_eth) = (Some(d), Some(o)),
            Extensions::MrAck(a) => f.mr_ack = Some(a),
            Extensions::MrNack(n) => f.mr_nack = Some(n),
            Extensions::MrProbe(p) => f.mr_probe = Some(p),
        }
        f
    }

    /// The headers `layout` names, taken from `f`; the ones it does not name must be absent.
    pub fn from_fields(layout: Layout, f: &ExtensionFields) -> Result<Self, Error> {
        fn need<T>(v: Option<T>, h: Header) -> Result<T, Error> {
            v.ok_or(Error::MissingHeader(h))
        }
        let ext = match layout {
            Layout::None => Extensions::None,
            Layout::Reth => Extensions::Reth(need(f.reth, Header::Reth)?),
            Layout::RethImm => {
                Extensions::RethImm(need(f.reth, Header::Reth)?, need(f.immdt, Header::ImmDt)?)
            }
            Layout::Imm => Extensions::Imm(need(f.immdt, Header::ImmDt)?),
            Layout::Ieth => Extensions::Ieth(need(f.ieth, Header::Ieth)?),
            Layout::Aeth => Extensions::Aeth(need(f.aeth, Header::Aeth)?),
            Layout::AethAtomicAck => Extensions::AethAtomicAck(
                need(f.aeth, Header::Aeth)?,
                need(f.atomic_ack_eth, Header::AtomicAckEth)?,
            ),
            Layout::AtomicEth => Extensions::AtomicEth(need(f.atomic_eth, Header::AtomicEth)?),
            Layout::Deth => Extensions::Deth(need(f.deth, Header::Deth)?),
            Layout::DethImm => {
                Extensions::DethImm(need(f.deth, Header::Deth)?, need(f.immdt, Header::ImmDt)?)
            }
            Layout::Cnp => need(f.cnp.then_some(Extensions::Cnp), Header::Cnp)?,
            Layout::MrData => Extensions::MrData(need(f.mr_data, Header::MrData)?),
            Layout::MrDataImm => Extensions::MrDataImm(
                need(f.mr_data, Header::MrData)?,
                need(f.immdt, Header::ImmDt)?,
            ),
            Layout::MrRemote => Extensions::MrRemote(
                need(f.mr_data, Header::MrData)?,
                need(f.mr_remote, Header::MrRemote)?,
            ),
            Layout::MrRemoteImm => Extensions::MrRemoteImm(
                need(f.mr_data, Header::MrData)?,
                need(f.mr_remote, Header::MrRemote)?,
                need(f.immdt, Header::ImmDt)?,
            ),
            Layout::MrAtomic => Extensions::MrAtomic(
                need(f.mr_data, Header::MrData)?,
                need(f.atomic_eth, Header::AtomicEth)?,
            ),
            Layout::MrAtomicAck => Extensions::MrAtomicAck(
                need(f.mr_data, Header::MrData)?,
                need(f.atomic_ack_eth, Header::AtomicAckEth)?,
            ),
            Layout::MrAck => Extensions::MrAck(need(f.mr_ack, Header::MrAck)?),
            Layout::MrNack => Extensions::MrNack(need(f.mr_nack, Header::MrNack)?),
            Layout::MrProbe => Extensions::MrProbe(need(f.mr_probe, Header::MrProbe)?),
        };
        if ext.fields() != *f {
            return Err(Error::ExtensionMismatch {
                expected: layout,
                found: Layout::None,
            });
        }
        Ok(ext)
    }

    /// The RETH, if present.
    pub const fn reth(&self) -> Option<RethRepr> {
        match *self {
            Extensions::Reth(r) | Extensions::RethImm(r, _) => Some(r),
            _ => None,
        }
    }

    /// The AETH, if present.
    pub const fn aeth(&self) -> Option<AethRepr> {
        match *self {
            Extensions::Aeth(a) | Extensions::AethAtomicAck(a, _) => Some(a),
            _ => None,
        }
    }

    /// The immediate data, if present.
    pub const fn immdt(&self) -> Option<u32> {
        match *self {
            Extensions::RethImm(_, i)
            | Extensions::Imm(i)
            | Extensions::DethImm(_, i)
            | Extensions::MrDataImm(_, i)
            | Extensions::MrRemoteImm(_, _, i) => Some(i),
            _ => None,
        }
    }

    /// The DETH, if present.
    pub const fn deth(&self) -> Option<DethRepr> {
        match *self {
            Extensions::Deth(d) | Extensions::DethImm(d, _) => Some(d),
            _ => None,
        }
    }

    /// The MetaRoCE data header, if present.
    pub const fn mr_data(&self) -> Option<MrDataRepr> {
        match *self {
            Extensions::MrData(d)
            | Extensions::MrDataImm(d, _)
            | Extensions::MrRemote(d, _)
            | Extensions::MrRemoteImm(d, _, _)
            | Extensions::MrAtomic(d, _)
            | Extensions::MrAtomicAck(d, _) => Some(d),
            _ => None,
        }
    }

    /// The MetaRoCE ACK header, if present.
    pub const fn mr_ack(&self) -> Option<MrAckRepr> {
        match *self {
            Extensions::MrAck(a) => Some(a),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_decode() {
        assert_eq!(AckSyndrome::from_u8(0x1f), AckSyndrome::Ack { credit: 31 });
        assert_eq!(AckSyndrome::from_u8(0x00), AckSyndrome::Ack { credit: 0 });
        assert_eq!(
            AckSyndrome::from_u8(0x2e),
            AckSyndrome::RnrNak { timer: 14 }
        );
        assert_eq!(
            AckSyndrome::from_u8(0x60),
            AckSyndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            AckSyndrome::from_u8(0x61),
            AckSyndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            AckSyndrome::from_u8(0x62),
            AckSyndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            AckSyndrome::from_u8(0x63),
            AckSyndrome::Nak(NakCode::RemoteOperationalError)
        );
        assert_eq!(
            AckSyndrome::from_u8(0x6a),
            AckSyndrome::Nak(NakCode::Reserved(10))
        );
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
        assert_eq!(
            ext.reth(),
            Some(RethRepr {
                va: 0x0102030405,
                rkey: 0xdeadbeef,
                dma_len: 4096
            })
        );
        assert_eq!(ext.immdt(), Some(0xcafebabe));
        assert_eq!(ext.len(), 20);
        let mut out = [0u8; 20];
        ext.emit(layout, &mut out).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn emit_refuses_a_layout_mismatch() {
        let mut out = [0u8; 64];
        let ext = Extensions::Reth(RethRepr::default());
        assert_eq!(
            ext.emit(Layout::Aeth, &mut out).unwrap_err(),
            Error::ExtensionMismatch {
                expected: Layout::Aeth,
                found: Layout::Reth
            }
        );
    }

    #[test]
    fn fields_convert_both_ways() {
        let f = ExtensionFields {
            aeth: Some(AethRepr {
                syndrome: 0x61,
                msn: 5,
            }),
            ..Default::default()
        };
        let ext = Extensions::from_fields(Layout::Aeth, &f).unwrap();
        assert_eq!(
            ext,
            Extensions::Aeth(AethRepr {
                syndrome: 0x61,
                msn: 5
            })
        );
        assert_eq!(ext.fields(), f);
        assert_eq!(
            Extensions::from_fields(Layout::Reth, &f).unwrap_err(),
            Error::MissingHeader(Header::Reth)
        );
        let extra = ExtensionFields {
            immdt: Some(1),
            ..f
        };
        assert!(Extensions::from_fields(Layout::Aeth, &extra).is_err());
    }
}
