//! Reading pcap and pcapng captures, and writing pcap, without trusting a byte of the input.
//!
//! Classic pcap (microsecond and nanosecond magic, either byte order) and pcapng (section header,
//! interface description, enhanced and simple packet blocks, either byte order) are read. Only
//! Ethernet link types are decoded as frames; anything else is reported per packet.

use std::fmt;
use std::io::{self, Write};

/// The pcap link type of Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;

/// One captured packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The link type of the interface it was captured on.
    pub linktype: u32,
    /// Timestamp in nanoseconds since the epoch (as the capture records it).
    pub timestamp_ns: u64,
    /// The captured bytes.
    pub data: Vec<u8>,
}

/// Why a capture could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaptureError {
    /// The file starts with neither the pcap nor the pcapng magic.
    UnknownFormat,
    /// The file ends inside a header or a record.
    Truncated {
        /// Byte offset where the cut record starts.
        offset: usize,
    },
    /// A pcapng block length is impossible.
    BadBlockLength {
        /// Byte offset of the block.
        offset: usize,
        /// Its length field.
        length: u32,
    },
    /// A pcapng packet names an interface that was never described.
    UnknownInterface(u32),
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureError::UnknownFormat => write!(f, "not a pcap or pcapng file"),
            CaptureError::Truncated { offset } => {
                write!(f, "capture truncated in the record at byte {offset}")
            }
            CaptureError::BadBlockLength { offset, length } => {
                write!(
                    f,
                    "pcapng block at byte {offset} has impossible length {length}"
                )
            }
            CaptureError::UnknownInterface(i) => {
                write!(f, "pcapng packet names undescribed interface {i}")
            }
        }
    }
}

impl std::error::Error for CaptureError {}

#[derive(Clone, Copy)]
struct Endian(bool);

impl Endian {
    fn u16(self, b: &[u8], at: usize) -> Option<u16> {
        let s: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
        Some(if self.0 {
            u16::from_be_bytes(s)
        } else {
            u16::from_le_bytes(s)
        })
    }

    fn u32(self, b: &[u8], at: usize) -> Option<u32> {
        let s: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        Some(if self.0 {
            u32::from_be_bytes(s)
        } else {
            u32::from_le_bytes(s)
        })
    }
}

/// Reads every packet of a pcap or pcapng file. Packets read before an error are returned with it.
pub fn read(bytes: &[u8]) -> (Vec<Packet>, Option<CaptureError>) {
    match bytes.get(..4) {
        Some([0x0a, 0x0d, 0x0d, 0x0a]) => read_pcapng(bytes),
        Some(m) => {
            let magic_le = u32::from_le_bytes([m[0], m[1], m[2], m[3]]);
            let magic_be = u32::from_be_bytes([m[0], m[1], m[2], m[3]]);
            match (magic_le, magic_be) {
                (0xa1b2_c3d4, _) => read_pcap(bytes, Endian(false), 1000),
                (0xa1b2_3c4d, _) => read_pcap(bytes, Endian(false), 1),
                (_, 0xa1b2_c3d4) => read_pcap(bytes, Endian(true), 1000),
                (_, 0xa1b2_3c4d) => read_pcap(bytes, Endian(true), 1),
                _ => (Vec::new(), Some(CaptureError::UnknownFormat)),
            }
        }
        None => (Vec::new(), Some(CaptureError::UnknownFormat)),
    }
}

fn read_pcap(bytes: &[u8], e: Endian, frac_ns: u64) -> (Vec<Packet>, Option<CaptureError>) {
    let mut out = Vec::new();
    let Some(linktype) = e.u32(bytes, 20) else {
        return (out, Some(CaptureError::Truncated { offset: 0 }));
    };
    let linktype = linktype & 0x0fff_ffff;
    let mut at = 24;
    while at < bytes.len() {
        let rec = (|| {
            let sec = u64::from(e.u32(bytes, at)?);
            let frac = u64::from(e.u32(bytes, at + 4)?);
            let incl = e.u32(bytes, at + 8)? as usize;
            let data = bytes.get(at + 16..(at + 16).checked_add(incl)?)?;
            Some((sec * 1_000_000_000 + frac * frac_ns, data, incl))
        })();
        let Some((timestamp_ns, data, incl)) = rec else {
            return (out, Some(CaptureError::Truncated { offset: at }));
        };
        out.push(Packet {
            linktype,
            timestamp_ns,
            data: data.to_vec(),
        });
        at += 16 + incl;
    }
    (out, None)
}

fn read_pcapng(bytes: &[u8]) -> (Vec<Packet>, Option<CaptureError>) {
    let mut out = Vec::new();
    let mut e = Endian(false);
    let mut interfaces: Vec<(u32, u64)> = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if bytes.get(at..at + 4) == Some(&[0x0a, 0x0d, 0x0d, 0x0a]) {
            match bytes.get(at + 8..at + 12) {
                Some([0x1a, 0x2b, 0x3c, 0x4d]) => e = Endian(true),
                Some([0x4d, 0x3c, 0x2b, 0x1a]) => e = Endian(false),
                _ => return (out, Some(CaptureError::Truncated { offset: at })),
            }
            interfaces.clear();
        }
        let (Some(kind), Some(len)) = (e.u32(bytes, at), e.u32(bytes, at + 4)) else {
            return (out, Some(CaptureError::Truncated { offset: at }));
        };
        let end = at.checked_add(len as usize);
        if len < 12 || len % 4 != 0 || end.is_none_or(|end| end > bytes.len()) {
            return (
                out,
                Some(CaptureError::BadBlockLength {
                    offset: at,
                    length: len,
                }),
            );
        }
        let block = &bytes[at + 8..at + len as usize - 4];
        match kind {
            1 => {
                let linktype = e.u16(block, 0).map_or(0, u32::from);
                interfaces.push((linktype, tsresol_ns(6)));
                // An if_tsresol option (code 9) changes the timestamp unit.
                let mut opt = 8;
                while let (Some(code), Some(olen)) = (e.u16(block, opt), e.u16(block, opt + 2)) {
                    if code == 0 {
                        break;
                    }
                    if code == 9 {
                        if let (Some(res), Some(last)) = (block.get(opt + 4), interfaces.last_mut())
                        {
                            last.1 = tsresol_ns(*res);
                        }
                    }
                    opt += 4 + usize::from(olen).div_ceil(4) * 4;
                }
            }
            6 => {
                let pkt = (|| {
                    let iface = e.u32(block, 0)?;
                    let ts = (u64::from(e.u32(block, 4)?) << 32) | u64::from(e.u32(block, 8)?);
                    let caplen = e.u32(block, 12)? as usize;
                    let data = block.get(20..20usize.checked_add(caplen)?)?;
                    Some((iface, ts, data))
                })();
                let Some((iface, ts, data)) = pkt else {
                    return (out, Some(CaptureError::Truncated { offset: at }));
                };
                let Some(&(linktype, unit)) = interfaces.get(iface as usize) else {
                    return (out, Some(CaptureError::UnknownInterface(iface)));
                };
                let timestamp_ns = ts.saturating_mul(unit) / 1000;
                out.push(Packet {
                    linktype,
                    timestamp_ns,
                    data: data.to_vec(),
                });
            }
            3 => {
                let Some(&(linktype, _)) = interfaces.first() else {
                    return (out, Some(CaptureError::UnknownInterface(0)));
                };
                let orig = e.u32(block, 0).unwrap_or(0) as usize;
                let data = block.get(4..).unwrap_or(&[]);
                let data = &data[..orig.min(data.len())];
                out.push(Packet {
                    linktype,
                    timestamp_ns: 0,
                    data: data.to_vec(),
                });
            }
            _ => {}
        }
        at += len as usize;
    }
    (out, None)
}

/// Picoseconds per tick of an `if_tsresol` value (ticks * result / 1000 is nanoseconds).
fn tsresol_ns(res: u8) -> u64 {
    let exp = u32::from(res & 0x7f);
    if res & 0x80 != 0 {
        // 2^-exp seconds per tick.
        return (1_000_000_000_000u64 >> exp.min(63)).max(1);
    }
    // 10^-exp seconds per tick.
    10u64.checked_pow(12u32.saturating_sub(exp)).unwrap_or(1)
}

/// Writes a classic pcap (microsecond timestamps, Ethernet link type).
pub struct PcapWriter<W: Write> {
    out: W,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header.
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&65535u32.to_le_bytes());
        h.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out })
    }

    /// Appends one frame.
    pub fn write(&mut self, timestamp_ns: u64, frame: &[u8]) -> io::Result<()> {
        let len = u32::try_from(frame.len()).map_err(io::Error::other)?;
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&((timestamp_ns / 1_000_000_000) as u32).to_le_bytes());
        h[4..8].copy_from_slice(&((timestamp_ns % 1_000_000_000 / 1000) as u32).to_le_bytes());
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[12..16].copy_from_slice(&len.to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(frame)
    }

    /// Flushes and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcap_round_trip_and_truncation() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write(1_500_000_000, &[1, 2, 3]).unwrap();
        w.write(2_000_001_000, &[4; 70]).unwrap();
        let bytes = w.finish().unwrap();
        let (pkts, err) = read(&bytes);
        assert!(err.is_none());
        assert_eq!(pkts.len(), 2);
        assert_eq!(pkts[0].data, [1, 2, 3]);
        assert_eq!(pkts[0].timestamp_ns, 1_500_000_000);
        assert_eq!(pkts[1].timestamp_ns, 2_000_001_000);
        let (pkts, err) = read(&bytes[..bytes.len() - 1]);
        assert_eq!(pkts.len(), 1);
        assert_eq!(
            err,
            Some(CaptureError::Truncated {
                offset: 24 + 16 + 3
            })
        );
        for cut in 0..bytes.len() {
            let _ = read(&bytes[..cut]);
        }
    }

    #[test]
    fn pcapng_enhanced_packets() {
        let mut b = Vec::new();
        // SHB
        b.extend_from_slice(&[0x0a, 0x0d, 0x0d, 0x0a]);
        b.extend_from_slice(&28u32.to_le_bytes());
        b.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
        b.extend_from_slice(&[1, 0, 0, 0]);
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        b.extend_from_slice(&28u32.to_le_bytes());
        // IDB, Ethernet
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&20u32.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&20u32.to_le_bytes());
        // EPB with 5 bytes of data padded to 8
        b.extend_from_slice(&6u32.to_le_bytes());
        b.extend_from_slice(&40u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&7u32.to_le_bytes());
        b.extend_from_slice(&5u32.to_le_bytes());
        b.extend_from_slice(&5u32.to_le_bytes());
        b.extend_from_slice(&[9, 8, 7, 6, 5, 0, 0, 0]);
        b.extend_from_slice(&40u32.to_le_bytes());
        let (pkts, err) = read(&b);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(pkts.len(), 1);
        assert_eq!(pkts[0].data, [9, 8, 7, 6, 5]);
        assert_eq!(pkts[0].timestamp_ns, 7000);
        assert_eq!(pkts[0].linktype, LINKTYPE_ETHERNET);
        for cut in 0..b.len() {
            let _ = read(&b[..cut]);
        }
    }
}
