//! The runner contract: what every runner (the UDP engine, the selftest's virtual link, the tests'
//! pair, the fuzz targets) does around the connection's two packet calls, written once.
//!
//! - Out: [`Connection::poll_transmit`] writes the headers, the runner copies the payload from its
//!   memory after them and calls [`Connection::seal`]: [`Connection::fill_and_seal`].
//! - In: [`Connection::handle_datagram`] says what to do with the datagram, the runner does it in
//!   its memory (place a payload, perform an atomic and report its original value, store an
//!   atomic's returned value): [`Connection::apply`].

use super::*;

/// The memory a connection's packets come from and land in: the runner's, addressed by the
/// addresses the connection was given (work requests, receive buffers, regions).
pub trait Memory {
    /// The `len` bytes at `addr`, or `None` when they are not all in this memory.
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]>;
    /// Writes `bytes` at `addr`. Returns `false`, writing nothing, when they do not all fit.
    fn write(&mut self, addr: u64, bytes: &[u8]) -> bool;
}

/// One contiguous memory at a base address: the simplest [`Memory`] (a test's, a harness's
/// segment).
#[derive(Debug)]
pub struct FlatMemory<'a> {
    /// The address of `bytes[0]`.
    pub base: u64,
    /// The memory.
    pub bytes: &'a mut [u8],
}

impl FlatMemory<'_> {
    /// Where `len` bytes at `addr` lie in `bytes`, if they all do.
    pub fn offset_of(&self, addr: u64, len: usize) -> Option<usize> {
        let at = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        (at.checked_add(len)? <= self.bytes.len()).then_some(at)
    }
}

impl Memory for FlatMemory<'_> {
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let at = self.offset_of(addr, len)?;
        Some(&self.bytes[at..at + len])
    }

    fn write(&mut self, addr: u64, bytes: &[u8]) -> bool {
        match self.offset_of(addr, bytes.len()) {
            Some(at) => {
                self.bytes[at..at + bytes.len()].copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }
}

/// What [`Connection::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Nothing was asked.
    Nothing,
    /// `len` payload bytes were placed at `addr`.
    Placed {
        /// Destination.
        addr: u64,
        /// Bytes placed.
        len: usize,
    },
    /// An atomic was performed at `addr` and its original value reported to the connection.
    Atomic {
        /// The target.
        addr: u64,
        /// Its value before.
        orig: u64,
    },
    /// An atomic's returned value was stored at `addr`.
    Value {
        /// Destination.
        addr: u64,
    },
    /// What the delivery names lies outside the runner's memory (or the datagram): nothing was
    /// done. (The connection checked it against its regions: a runner whose memory does not back
    /// a registered region is at fault.)
    OutOfMemory,
}

impl<const P: usize, const W: usize, const S: usize, const Q: usize, const R: usize>
    Connection<P, W, S, Q, R>
{
    /// Copies the payload `tx` names from `mem` after the headers in `buf`, then seals the
    /// datagram. A payload not in `mem` goes as zeros (the connection checked it at post time,
    /// so this is the runner's fault); returns whether the payload was found.
    #[inline]
    pub fn fill_and_seal(&mut self, tx: &Transmit, buf: &mut [u8], mem: &impl Memory) -> bool {
        let mut found = true;
        if tx.payload_len > 0 {
            let Some(dst) = buf.get_mut(tx.header_len..tx.header_len + tx.payload_len) else {
                return false;
            };
            match mem.read(tx.payload_addr, tx.payload_len) {
                Some(src) => dst.copy_from_slice(src),
                None => {
                    dst.fill(0);
                    found = false;
                }
            }
        }
        self.seal(tx, buf);
        found
    }

    /// Does what `delivery` (the answer of [`Connection::handle_datagram`] for `datagram`) asks
    /// of the runner, in `mem`; an atomic's original value goes back to the connection at once.
    #[inline]
    pub fn apply(&mut self, mem: &mut impl Memory, datagram: &[u8], delivery: Delivery) -> Applied {
        match delivery {
            Delivery::Nothing => Applied::Nothing,
            Delivery::Place { addr, offset, len } => {
                match datagram.get(offset..offset.saturating_add(len)) {
                    Some(bytes) if mem.write(addr, bytes) => Applied::Placed { addr, len },
                    _ => Applied::OutOfMemory,
                }
            }
            Delivery::Atomic {
                addr,
                compare,
                swap_add,
            } => {
                let Some(orig) = mem
                    .read(addr, 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_ne_bytes)
                else {
                    return Applied::OutOfMemory;
                };
                let new = atomic_new_value(orig, compare, swap_add);
                if !mem.write(addr, &new.to_ne_bytes()) {
                    return Applied::OutOfMemory;
                }
                self.atomic_result(orig);
                Applied::Atomic { addr, orig }
            }
            Delivery::Value { addr, value } => {
                if mem.write(addr, &value.to_ne_bytes()) {
                    Applied::Value { addr }
                } else {
                    Applied::OutOfMemory
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    fn conn() -> Connection<2, 16, 1, 4, 2> {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        Connection::new(Config::new(ip, ip, Qpn::new(1), Qpn::new(2)))
    }

    #[test]
    fn placements_values_and_atomics_land_where_they_are_told() {
        let mut c = conn();
        let mut bytes = [0u8; 64];
        let mut m = FlatMemory {
            base: 0x1000,
            bytes: &mut bytes,
        };
        let datagram = [9u8, 8, 7, 6, 5];
        let placed = c.apply(
            &mut m,
            &datagram,
            Delivery::Place {
                addr: 0x1004,
                offset: 1,
                len: 3,
            },
        );
        assert_eq!(
            placed,
            Applied::Placed {
                addr: 0x1004,
                len: 3
            }
        );
        assert_eq!(&m.bytes[3..8], &[0, 8, 7, 6, 0]);
        let stored = c.apply(
            &mut m,
            &[],
            Delivery::Value {
                addr: 0x1010,
                value: 41,
            },
        );
        assert_eq!(stored, Applied::Value { addr: 0x1010 });
        let added = Delivery::Atomic {
            addr: 0x1010,
            compare: None,
            swap_add: 1,
        };
        assert_eq!(
            c.apply(&mut m, &[], added),
            Applied::Atomic {
                addr: 0x1010,
                orig: 41
            }
        );
        assert_eq!(u64::from_ne_bytes(m.bytes[16..24].try_into().unwrap()), 42);
    }

    #[test]
    fn what_lies_outside_the_memory_or_the_datagram_is_not_done() {
        let mut c = conn();
        let mut bytes = [0u8; 64];
        let mut m = FlatMemory {
            base: 0x1000,
            bytes: &mut bytes,
        };
        let outside = Delivery::Place {
            addr: 0x103e,
            offset: 0,
            len: 4,
        };
        assert_eq!(
            c.apply(&mut m, &[1, 2, 3, 4], outside),
            Applied::OutOfMemory
        );
        let beyond_datagram = Delivery::Place {
            addr: 0x1000,
            offset: 2,
            len: 4,
        };
        assert_eq!(
            c.apply(&mut m, &[1, 2, 3, 4], beyond_datagram),
            Applied::OutOfMemory
        );
        let atomic = Delivery::Atomic {
            addr: 0x2000,
            compare: Some(0),
            swap_add: 1,
        };
        assert_eq!(c.apply(&mut m, &[], atomic), Applied::OutOfMemory);
        assert_eq!(m.bytes, &[0; 64]);
    }
}
