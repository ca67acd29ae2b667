//! How strictly a frame is parsed: what [`parse_with`](super::parse_with) checks.

use super::ROCEV2_PORT;

/// What to do with the ICRC while parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum IcrcCheck {
    /// Compute it and refuse the frame when it is wrong.
    Verify,
    /// Compute it and report both values in [`Parsed`], without refusing the frame.
    Report,
    /// Do not compute it (the NIC or a lower layer already checked it).
    Skip,
}

/// How strictly to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ParseOptions {
    /// The UDP destination port that marks RoCEv2 (4791 unless configured otherwise).
    pub port: u16,
    /// Verify the IPv4 header checksum.
    pub verify_ip_checksum: bool,
    /// Verify the UDP checksum when it is not zero.
    pub verify_udp_checksum: bool,
    /// What to do with the ICRC.
    pub icrc: IcrcCheck,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions {
            port: ROCEV2_PORT,
            verify_ip_checksum: true,
            verify_udp_checksum: true,
            icrc: IcrcCheck::Verify,
        }
    }
}
