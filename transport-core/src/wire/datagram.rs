//! A RoCEv2 datagram as a UDP socket hands it over (BTH to ICRC, without the IP and UDP headers
//! the kernel took off), parsed once: a runner finds the queue pair by it and the connection
//! acts on the same view, so no byte is parsed twice. The sender's side is the same layout
//! written the other way: [`DatagramHeaders::emit`] writes the headers (the carried ACK
//! included), the runner copies the payload after them, and [`seal`] adds the pad and the ICRC.

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

/// The headers of a datagram to send, as [`Datagram::parse`] reads them back: the BTH (its pad
/// count follows from the payload length), the extension headers of its opcode and, on a
/// MetaRoCE data packet, a carried ACK (the data header's flag A must say so).
#[derive(Debug, Clone, Copy)]
pub struct DatagramHeaders {
    /// The base transport header. [`DatagramHeaders::new`] sets its pad count.
    pub bth: BthRepr,
    /// The extension headers of `bth.opcode`.
    pub ext: Extensions,
    /// The ACK carried after a MetaRoCE data header.
    pub piggy: Option<PiggyAck>,
}

/// The pad that ends a payload of `payload_len` bytes on a four-byte boundary.
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - payload_len % 4) % 4) as u8
}

impl DatagramHeaders {
    /// The headers of a datagram with `payload_len` bytes of payload: the BTH's pad count is set
    /// to what the payload needs.
    pub fn new(
        mut bth: BthRepr,
        ext: Extensions,
        piggy: Option<PiggyAck>,
        payload_len: usize,
    ) -> Self {
        bth.pad_count = pad_for(payload_len);
        DatagramHeaders { bth, ext, piggy }
    }

    /// Writes the headers at the start of `buf`; returns their length (where the payload goes).
    /// A buffer too short is an error and nothing after its end is touched. A carried ACK goes
    /// only behind a MetaRoCE data header whose flag A says so, and such a header needs one:
    /// anything else is an error, since a receiver would read the ACK as payload or the payload
    /// as an ACK.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let flag_a = self.ext.mr_data().is_some_and(|d| d.ack);
        match (flag_a, self.piggy.is_some()) {
            (true, false) => return Err(Error::MissingHeader(Header::MrAck)),
            (false, true) => return Err(Error::FieldRange("a carried ACK without flag A")),
            _ => {}
        }
        let total = buf.len();
        let rest = self.bth.emit(buf)?;
        let rest = self.ext.emit(self.bth.opcode.layout(), rest)?;
        let rest = match self.piggy {
            Some(p) => p.emit(rest)?,
            None => rest,
        };
        Ok(total - rest.len())
    }

    /// The length of the whole datagram with `payload_len` bytes after headers of `header_len`:
    /// payload, pad and ICRC.
    pub const fn datagram_len(&self, header_len: usize, payload_len: usize) -> usize {
        header_len + payload_len + self.bth.pad_count as usize + 4
    }
}

/// Finishes a datagram whose headers and payload (ending at `payload_end`) are in place: zeroes
/// the pad between the payload and the last four bytes, then writes there what `icrc` computes
/// over everything before them (little-endian, as RoCEv2 carries the ICRC). A datagram too short
/// for its payload and ICRC is an error and is left untouched.
pub fn seal(
    datagram: &mut [u8],
    payload_end: usize,
    icrc: impl FnOnce(&[u8]) -> u32,
) -> Result<(), Error> {
    let icrc_at = datagram
        .len()
        .checked_sub(4)
        .filter(|&at| at >= payload_end)
        .ok_or(Error::Truncated {
            header: Header::Icrc,
            needed: payload_end + 4,
            available: datagram.len(),
        })?;
    datagram[payload_end..icrc_at].fill(0);
    let value = icrc(&datagram[..icrc_at]);
    datagram[icrc_at..].copy_from_slice(&value.to_le_bytes());
    Ok(())
}
