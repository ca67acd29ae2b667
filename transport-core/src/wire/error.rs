//! What can be wrong with a frame, named precisely.

use super::layout::Layout;
use core::fmt;

/// The header (or trailing part) of a frame that a problem was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Header {
    /// Ethernet II header.
    Ethernet,
    /// 802.1Q tag.
    Vlan,
    /// IPv4 header.
    Ipv4,
    /// IPv4 options (the part of the header beyond 20 bytes that IHL announces).
    Ipv4Options,
    /// IPv6 header.
    Ipv6,
    /// UDP header.
    Udp,
    /// InfiniBand base transport header.
    Bth,
    /// RDMA extended transport header.
    Reth,
    /// ACK extended transport header.
    Aeth,
    /// Immediate data.
    ImmDt,
    /// Invalidate extended transport header.
    Ieth,
    /// Datagram extended transport header.
    Deth,
    /// Atomic extended transport header.
    AtomicEth,
    /// Atomic ACK extended transport header.
    AtomicAckEth,
    /// The 16 reserved bytes of a congestion notification packet.
    Cnp,
    /// MetaRoCE data header.
    MrData,
    /// MetaRoCE remote-address header.
    MrRemote,
    /// MetaRoCE ACK header.
    MrAck,
    /// MetaRoCE NACK header.
    MrNack,
    /// MetaRoCE path probe header.
    MrProbe,
    /// The payload and its pad.
    Payload,
    /// The invariant CRC.
    Icrc,
}

impl Header {
    /// The header's name as this project's tools print it.
    pub const fn name(self) -> &'static str {
        match self {
            Header::Ethernet => "Ethernet",
            Header::Vlan => "802.1Q",
            Header::Ipv4 => "IPv4",
            Header::Ipv4Options => "IPv4 options",
            Header::Ipv6 => "IPv6",
            Header::Udp => "UDP",
            Header::Bth => "BTH",
            Header::Reth => "RETH",
            Header::Aeth => "AETH",
            Header::ImmDt => "ImmDt",
            Header::Ieth => "IETH",
            Header::Deth => "DETH",
            Header::AtomicEth => "AtomicETH",
            Header::AtomicAckEth => "AtomicAckETH",
            Header::Cnp => "CNP",
            Header::MrData => "MetaRoCE data header",
            Header::MrRemote => "MetaRoCE remote header",
            Header::MrAck => "MetaRoCE ACK header",
            Header::MrNack => "MetaRoCE NACK header",
            Header::MrProbe => "MetaRoCE probe header",
            Header::Payload => "payload",
            Header::Icrc => "ICRC",
        }
    }
}

/// Why a frame could not be parsed or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Error {
    /// A header is cut short: `needed` bytes were required, `available` were present.
    Truncated {
        /// The header that is cut short.
        header: Header,
        /// Bytes it needs.
        needed: usize,
        /// Bytes present.
        available: usize,
    },
    /// The EtherType is neither IPv4 nor IPv6 (nor an 802.1Q tag in front of them).
    UnsupportedEtherType(u16),
    /// The IP version nibble disagrees with the EtherType.
    IpVersion {
        /// The version the EtherType announced.
        expected: u8,
        /// The version found in the header.
        found: u8,
    },
    /// The IPv4 IHL is below 5 words.
    Ipv4HeaderLength(u8),
    /// The IPv4 header checksum is wrong.
    Ipv4Checksum {
        /// The checksum in the header.
        stored: u16,
        /// The checksum the header should carry.
        computed: u16,
    },
    /// The IPv4 packet is a fragment (MF set or a non-zero offset); RoCEv2 is never fragmented.
    Ipv4Fragment,
    /// The IP length (IPv4 total length or IPv6 payload length) disagrees with the frame.
    IpLength {
        /// The length the IP header claims for the whole IP packet, in bytes.
        claimed: usize,
        /// Bytes the frame holds from the IP header on.
        available: usize,
    },
    /// The IP payload is not UDP (IPv4 protocol or IPv6 next header).
    NotUdp(u8),
    /// The UDP length disagrees with the IP length.
    UdpLength {
        /// The UDP length field.
        claimed: u16,
        /// Bytes the IP packet holds from the UDP header on.
        available: usize,
    },
    /// A non-zero UDP checksum is wrong.
    UdpChecksum {
        /// The checksum in the header.
        stored: u16,
        /// The checksum the datagram should carry.
        computed: u16,
    },
    /// The UDP destination port is not the RoCEv2 port the parser was configured with.
    NotRoce(u16),
    /// The BTH pad count is larger than the bytes after the headers.
    PadCount {
        /// The BTH PadCnt field.
        pad: u8,
        /// Payload bytes including the pad.
        available: usize,
    },
    /// The ICRC is wrong.
    Icrc {
        /// The ICRC at the end of the frame.
        stored: u32,
        /// The ICRC the frame should carry.
        computed: u32,
    },
    /// A MetaRoCE header carries a protocol version this implementation does not speak.
    MetaRoceVersion {
        /// The header it was found in.
        header: Header,
        /// The version found.
        found: u8,
    },
    /// Building: the opcode needs an extension header that the fields do not hold.
    MissingHeader(Header),
    /// Emitting or building: the extension headers do not form the opcode's layout.
    ExtensionMismatch {
        /// The layout the opcode carries.
        expected: Layout,
        /// The layout the headers form.
        found: Layout,
    },
    /// Emitting: a field does not fit its width on the wire (IP length, IPv4 options, pad count).
    FieldRange(&'static str),
    /// Emitting: the caller's buffer is too small.
    BufferTooSmall {
        /// Bytes the frame needs.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated { header, needed, available } => write!(
                f,
                "truncated {} header: needs {needed} bytes, {available} present",
                header.name()
            ),
            Error::UnsupportedEtherType(t) => write!(f, "unsupported EtherType 0x{t:04x}"),
            Error::IpVersion { expected, found } => {
                write!(f, "IP version {found} where the EtherType announced IPv{expected}")
            }
            Error::Ipv4HeaderLength(ihl) => write!(f, "IPv4 IHL {ihl} is below the minimum of 5"),
            Error::Ipv4Checksum { stored, computed } => write!(
                f,
                "bad IPv4 header checksum: 0x{stored:04x} stored, 0x{computed:04x} computed"
            ),
            Error::Ipv4Fragment => write!(f, "IPv4 fragment (RoCEv2 is never fragmented)"),
            Error::IpLength { claimed, available } => write!(
                f,
                "IP length mismatch: the header claims {claimed} bytes, {available} present"
            ),
            Error::NotUdp(p) => write!(f, "IP protocol {p} is not UDP"),
            Error::UdpLength { claimed, available } => write!(
                f,
                "UDP length mismatch: the header claims {claimed} bytes, the IP packet holds {available}"
            ),
            Error::UdpChecksum { stored, computed } => write!(
                f,
                "bad UDP checksum: 0x{stored:04x} stored, 0x{computed:04x} computed"
            ),
            Error::NotRoce(port) => write!(f, "UDP destination port {port} is not RoCEv2"),
            Error::PadCount { pad, available } => write!(
                f,
                "BTH pad count {pad} exceeds the {available} payload bytes"
            ),
            Error::Icrc { stored, computed } => write!(
                f,
                "bad ICRC: 0x{stored:08x} stored, 0x{computed:08x} computed"
            ),
            Error::MetaRoceVersion { header, found } => write!(
                f,
                "{} has unsupported MetaRoCE version {found}",
                header.name()
            ),
            Error::MissingHeader(h) => write!(f, "the opcode needs a {} header", h.name()),
            Error::ExtensionMismatch { expected, found } => write!(
                f,
                "the opcode carries the extension headers {expected:?}, not {found:?}"
            ),
            Error::FieldRange(what) => write!(f, "{what} does not fit its field"),
            Error::BufferTooSmall { needed, available } => write!(
                f,
                "buffer too small: the frame needs {needed} bytes, {available} available"
            ),
        }
    }
}

impl core::error::Error for Error {}

/// Shorthand for a truncation error.
pub(crate) const fn truncated(header: Header, needed: usize, available: usize) -> Error {
    Error::Truncated {
        header,
        needed,
        available,
    }
}
