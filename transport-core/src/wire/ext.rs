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

use super::layout::Layout;
use super::metaroce::{MrAckRepr, MrDataRepr, MrNackRepr, MrProbeRepr, MrRemoteRepr};
use super::{split, split_mut, Error, Header};

mod ib;
pub use ib::*;

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
