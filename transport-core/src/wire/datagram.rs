//! A RoCEv2 datagram as a UDP socket hands it over (BTH to ICRC, without the IP and UDP headers
//! the kernel took off), parsed once: a runner finds the queue pair by it and the connection
//! acts on the same view, so no byte is parsed twice.

use super::metaroce::PiggyAck;
use super::{BthRepr, Error, Extensions, Header, Opcode};

/// A parsed datagram: its headers, the ACK a data packet carries (flag A), and where its payload
/// and ICRC lie. The ICRC is not checked here: it covers the IP and UDP headers too, which only
/// the receiving end knows (`conn::Connection` checks it).
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// The base transport header.
    pub bth: BthRepr,
    /// The extension headers its opcode carries.
    pub ext: Extensions,
    /// The ACK carried by a MetaRoCE data packet with flag A.
    pub piggy: Option<PiggyAck>,
    /// Where the payload starts.
    pub payload_at: usize,
    /// Payload bytes (pad excluded).
    pub payload_len: usize,
    bytes: &'a [u8],
}

impl<'a> Datagram<'a> {
    /// Parses `bytes` (BTH to ICRC). Never panics; a datagram too short for its headers, its pad
    /// and its ICRC is an error.
    #[inline(always)]
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Error> {
        let truncated = |header, needed| Error::Truncated {
            header,
            needed,
            available: bytes.len(),
        };
        if bytes.len() < BthRepr::LEN + 4 {
            return Err(truncated(Header::Bth, BthRepr::LEN + 4));
        }
        let (bth, rest) = BthRepr::parse(bytes)?;
        let (ext, body) = Extensions::parse(Opcode::layout_of(bytes[0]), rest)?;
        let (piggy, body) = match ext.mr_data() {
            Some(data) if data.ack => {
                let (p, body) = PiggyAck::parse(body)?;
                (Some(p), body)
            }
            _ => (None, body),
        };
        let payload_and_pad = body
            .len()
            .checked_sub(4)
            .ok_or(truncated(Header::Icrc, bytes.len() - body.len() + 4))?;
        let payload_len = payload_and_pad
            .checked_sub(usize::from(bth.pad_count))
            .ok_or(Error::PadCount {
                pad: bth.pad_count,
                available: payload_and_pad,
            })?;
        Ok(Datagram {
            bth,
            ext,
            piggy,
            payload_at: bytes.len() - 4 - payload_and_pad,
            payload_len,
            bytes,
        })
    }

    /// The whole datagram.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The bytes the ICRC covers after the IP and UDP headers: everything before it.
    pub fn covered(&self) -> &'a [u8] {
        &self.bytes[..self.bytes.len() - 4]
    }

    /// The ICRC the datagram carries.
    pub fn icrc(&self) -> u32 {
        let n = self.bytes.len();
        u32::from_le_bytes([
            self.bytes[n - 4],
            self.bytes[n - 3],
            self.bytes[n - 2],
            self.bytes[n - 1],
        ])
    }

    /// The payload.
    pub fn payload(&self) -> &'a [u8] {
        &self.bytes[self.payload_at..self.payload_at + self.payload_len]
    }
}
