//! The InfiniBand extension headers (RETH, AETH, DETH, AtomicETH, AtomicAckETH): their
//! representations, and parsing and emitting each.

use crate::wire::bth::Qpn;
use crate::wire::{split, split_mut, Error, Header};
use zerocopy::network_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(super) struct RethHeader {
    pub(super) va: U64,
    pub(super) rkey: U32,
    pub(super) dma_len: U32,
}

const _: () = assert!(core::mem::size_of::<RethHeader>() == 16);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(super) struct AtomicEthHeader {
    pub(super) va: U64,
    pub(super) rkey: U32,
    pub(super) swap_add: U64,
    pub(super) compare: U64,
}

const _: () = assert!(core::mem::size_of::<AtomicEthHeader>() == 28);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(super) struct DethHeader {
    pub(super) qkey: U32,
    pub(super) src_qp: U32,
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

#[inline(always)]
pub(super) fn be32(buf: &[u8], header: Header) -> Result<(u32, &[u8]), Error> {
    let (v, rest) = split::<U32>(buf, header)?;
    Ok((v.get(), rest))
}

#[inline(always)]
pub(super) fn put32(buf: &mut [u8], header: Header, value: u32) -> Result<&mut [u8], Error> {
    let (v, rest) = split_mut::<U32>(buf, header)?;
    v.set(value);
    Ok(rest)
}

#[inline(always)]
pub(super) fn parse_reth(buf: &[u8]) -> Result<(RethRepr, &[u8]), Error> {
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
pub(super) fn parse_aeth(buf: &[u8]) -> Result<(AethRepr, &[u8]), Error> {
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
pub(super) fn parse_deth(buf: &[u8]) -> Result<(DethRepr, &[u8]), Error> {
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
pub(super) fn parse_atomic(buf: &[u8]) -> Result<(AtomicEthRepr, &[u8]), Error> {
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
pub(super) fn parse_atomic_ack(buf: &[u8]) -> Result<(AtomicAckEthRepr, &[u8]), Error> {
    let (v, rest) = split::<U64>(buf, Header::AtomicAckEth)?;
    Ok((AtomicAckEthRepr { orig: v.get() }, rest))
}

pub(super) fn emit_reth(r: RethRepr, buf: &mut [u8]) -> Result<&mut [u8], Error> {
    let (h, rest) = split_mut::<RethHeader>(buf, Header::Reth)?;
    h.va.set(r.va);
    h.rkey.set(r.rkey);
    h.dma_len.set(r.dma_len);
    Ok(rest)
}

pub(super) fn emit_aeth(r: AethRepr, buf: &mut [u8]) -> Result<&mut [u8], Error> {
    if r.msn > 0x00ff_ffff {
        return Err(Error::FieldRange("AETH MSN"));
    }
    put32(buf, Header::Aeth, (u32::from(r.syndrome) << 24) | r.msn)
}

pub(super) fn emit_deth(r: DethRepr, buf: &mut [u8]) -> Result<&mut [u8], Error> {
    let (h, rest) = split_mut::<DethHeader>(buf, Header::Deth)?;
    h.qkey.set(r.qkey);
    h.src_qp.set(r.src_qp.get());
    Ok(rest)
}

pub(super) fn emit_atomic(r: AtomicEthRepr, buf: &mut [u8]) -> Result<&mut [u8], Error> {
    let (h, rest) = split_mut::<AtomicEthHeader>(buf, Header::AtomicEth)?;
    h.va.set(r.va);
    h.rkey.set(r.rkey);
    h.swap_add.set(r.swap_add);
    h.compare.set(r.compare);
    Ok(rest)
}

pub(super) fn emit_atomic_ack(r: AtomicAckEthRepr, buf: &mut [u8]) -> Result<&mut [u8], Error> {
    let (h, rest) = split_mut::<U64>(buf, Header::AtomicAckEth)?;
    h.set(r.orig);
    Ok(rest)
}
