//! Which extension headers each opcode carries ([`Opcode::layout`](super::Opcode::layout)), and
//! their length: what the BTH decides and the extension headers follow.

/// Bytes of the MetaRoCE data header (`MR_DATA_LEN`).
pub(super) const MR_DATA_LEN: usize = 24;
/// Bytes of the MetaRoCE remote header (`MR_REMOTE_LEN`).
pub(super) const MR_REMOTE_LEN: usize = 12;
/// Bytes of the MetaRoCE ACK header (`MR_ACK_LEN`).
pub(super) const MR_ACK_LEN: usize = 52;
/// Bytes of the MetaRoCE NACK header (`MR_NACK_LEN`).
pub(super) const MR_NACK_LEN: usize = 16;
/// Bytes of the MetaRoCE probe header (`MR_PROBE_LEN`).
pub(super) const MR_PROBE_LEN: usize = 16;

/// The extension headers an opcode carries, in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Layout {
    /// No extension header.
    None,
    /// RETH.
    Reth,
    /// RETH, ImmDt.
    RethImm,
    /// ImmDt.
    Imm,
    /// IETH.
    Ieth,
    /// AETH.
    Aeth,
    /// AETH, AtomicAckETH.
    AethAtomicAck,
    /// AtomicETH.
    AtomicEth,
    /// DETH.
    Deth,
    /// DETH, ImmDt.
    DethImm,
    /// The CNP's 16 reserved bytes.
    Cnp,
    /// MetaRoCE data.
    MrData,
    /// MetaRoCE data, ImmDt.
    MrDataImm,
    /// MetaRoCE data, MetaRoCE remote.
    MrRemote,
    /// MetaRoCE data, MetaRoCE remote, ImmDt.
    MrRemoteImm,
    /// MetaRoCE data, AtomicETH.
    MrAtomic,
    /// MetaRoCE data, AtomicAckETH.
    MrAtomicAck,
    /// MetaRoCE ACK.
    MrAck,
    /// MetaRoCE NACK.
    MrNack,
    /// MetaRoCE probe.
    MrProbe,
}

impl Layout {
    /// Bytes the headers of this layout occupy.
    #[inline(always)]
    pub const fn len(self) -> usize {
        match self {
            Layout::None => 0,
            Layout::Reth => 16,
            Layout::RethImm => 20,
            Layout::Imm | Layout::Ieth | Layout::Aeth => 4,
            Layout::AethAtomicAck => 12,
            Layout::AtomicEth => 28,
            Layout::Deth => 8,
            Layout::DethImm => 12,
            Layout::Cnp => 16,
            Layout::MrData => MR_DATA_LEN,
            Layout::MrDataImm => MR_DATA_LEN + 4,
            Layout::MrRemote => MR_DATA_LEN + MR_REMOTE_LEN,
            Layout::MrRemoteImm => MR_DATA_LEN + MR_REMOTE_LEN + 4,
            Layout::MrAtomic => MR_DATA_LEN + 28,
            Layout::MrAtomicAck => MR_DATA_LEN + 8,
            Layout::MrAck => MR_ACK_LEN,
            Layout::MrNack => MR_NACK_LEN,
            Layout::MrProbe => MR_PROBE_LEN,
        }
    }

    /// Whether the layout has no extension header.
    pub const fn is_empty(self) -> bool {
        matches!(self, Layout::None)
    }

    /// Whether the layout carries a RETH.
    pub const fn has_reth(self) -> bool {
        matches!(self, Layout::Reth | Layout::RethImm)
    }
    /// Whether the layout carries an AETH.
    pub const fn has_aeth(self) -> bool {
        matches!(self, Layout::Aeth | Layout::AethAtomicAck)
    }
    /// Whether the layout carries immediate data.
    pub const fn has_immdt(self) -> bool {
        matches!(
            self,
            Layout::RethImm
                | Layout::Imm
                | Layout::DethImm
                | Layout::MrDataImm
                | Layout::MrRemoteImm
        )
    }
    /// Whether the layout carries an IETH.
    pub const fn has_ieth(self) -> bool {
        matches!(self, Layout::Ieth)
    }
    /// Whether the layout carries a DETH.
    pub const fn has_deth(self) -> bool {
        matches!(self, Layout::Deth | Layout::DethImm)
    }
    /// Whether the layout carries an AtomicETH.
    pub const fn has_atomic_eth(self) -> bool {
        matches!(self, Layout::AtomicEth | Layout::MrAtomic)
    }
    /// Whether the layout carries an AtomicAckETH.
    pub const fn has_atomic_ack_eth(self) -> bool {
        matches!(self, Layout::AethAtomicAck | Layout::MrAtomicAck)
    }
    /// Whether the layout carries the CNP's reserved bytes.
    pub const fn has_cnp(self) -> bool {
        matches!(self, Layout::Cnp)
    }
    /// Whether the layout carries a MetaRoCE data header.
    pub const fn has_mr_data(self) -> bool {
        matches!(
            self,
            Layout::MrData
                | Layout::MrDataImm
                | Layout::MrRemote
                | Layout::MrRemoteImm
                | Layout::MrAtomic
                | Layout::MrAtomicAck
        )
    }
    /// Whether the layout carries a MetaRoCE remote header.
    pub const fn has_mr_remote(self) -> bool {
        matches!(self, Layout::MrRemote | Layout::MrRemoteImm)
    }
    /// Whether the layout carries a MetaRoCE ACK header.
    pub const fn has_mr_ack(self) -> bool {
        matches!(self, Layout::MrAck)
    }
    /// Whether the layout carries a MetaRoCE NACK header.
    pub const fn has_mr_nack(self) -> bool {
        matches!(self, Layout::MrNack)
    }
    /// Whether the layout carries a MetaRoCE probe header.
    pub const fn has_mr_probe(self) -> bool {
        matches!(self, Layout::MrProbe)
    }
}
