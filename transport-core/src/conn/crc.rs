//! The ICRC of datagrams over UDP, with the headers' CRC cached per port and length.

use super::*;

/// The ICRC of a datagram sent over UDP from `src` to `dst`: computed over the canonical IP
/// header a UDP socket cannot see (IPv4: identification 0, DF set; IPv6: no extension headers)
/// and the UDP header, so that both ends agree without reading each other's IP headers.
pub fn compute_icrc(
    src: IpAddr,
    dst: IpAddr,
    src_port: u16,
    dst_port: u16,
    transport: &[u8],
) -> u32 {
    let (ip, ip_len, udp) = icrc_headers(src, dst, src_port, dst_port, transport.len());
    icrc::finish(icrc::prefix(&ip[..ip_len], &udp), transport)
}

/// The canonical IP header (and its length) and the UDP header of a datagram of
/// `transport_len` bytes (BTH to pad) from `src` to `dst`: the part of [`compute_icrc`] that
/// depends on the addresses, ports and length alone.
pub(super) fn icrc_headers(
    src: IpAddr,
    dst: IpAddr,
    src_port: u16,
    dst_port: u16,
    transport_len: usize,
) -> ([u8; 40], usize, [u8; 8]) {
    let udp_len = (8 + transport_len + 4) as u16;
    let mut udp = [0u8; 8];
    udp[..2].copy_from_slice(&src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
            ip[6] = 0x40;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let mut out = [0u8; 40];
            out[..20].copy_from_slice(&ip);
            (out, 20, udp)
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V6(x) => x.octets(),
                IpAddr::V4(x) => x.to_ipv6_mapped().octets(),
            };
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
            ip[6] = 17;
            ip[8..24].copy_from_slice(&v6(s));
            ip[24..40].copy_from_slice(&v6(d));
            (ip, 40, udp)
        }
    }
}

/// Sets of an [`IcrcPrefixes`] cache, of two slots each: one per path (paths beyond share).
pub(super) const ICRC_SETS: usize = 16;

/// The ICRC prefixes (the CRC of the headers of `icrc_headers`, split for whole blocks: see
/// [`icrc::SplitPrefix`]) of one direction of a connection, by UDP source port (it varies with
/// the path) and datagram length, so that a datagram like a recent one (the same path, the same
/// size: a ping-pong, full-sized bulk packets) hashes its own bytes only. The addresses and the
/// destination port are fixed for the direction (the configuration does not change after the
/// connection is made).
///
/// A set of two slots per path (the most recently used first: a path's full-sized packets and
/// its last ones, or its ACKs), chosen by the path's index, which the caller knows (the sender's
/// path, or the path byte of an arriving MetaRoCE header; a hash of the port otherwise). The
/// index only places an entry: a port and length are always checked, so a wrong or hostile
/// path byte costs a recomputation, never a wrong CRC. The ports of a connection's paths are
/// drawn at random: one slot per hash of their low bits had eight paths sprayed in turn evict
/// each other for about three packets in five.
#[derive(Debug, Clone)]
pub(super) struct IcrcPrefixes([[Option<(u64, icrc::SplitPrefix)>; 2]; ICRC_SETS]);

impl Default for IcrcPrefixes {
    fn default() -> Self {
        Self([[None; 2]; ICRC_SETS])
    }
}

/// The path byte of a MetaRoCE header (data, ACK, NACK or probe), which the peer sets.
#[inline]
pub(super) fn path_byte(ext: &crate::wire::Extensions) -> Option<u8> {
    use crate::wire::Extensions as E;
    match ext {
        E::MrAck(a) => Some(a.path_id),
        E::MrNack(n) => Some(n.path_id),
        E::MrProbe(p) => Some(p.path_id),
        e => e.mr_data().map(|d| d.path_id),
    }
}

/// What an [`IcrcPrefixes`] entry is for: a source port and a transport length.
#[inline]
fn prefix_key(src_port: u16, len: usize) -> u64 {
    (u64::from(src_port) << 32) | len as u64
}

/// The set of [`IcrcPrefixes`] for a datagram of path `path`, if known, from `src_port`.
#[inline]
pub(super) fn icrc_set(path: Option<u8>, src_port: u16) -> usize {
    match path {
        Some(p) => usize::from(p) % ICRC_SETS,
        None => usize::from(src_port ^ (src_port >> 8)) % ICRC_SETS,
    }
}

impl IcrcPrefixes {
    /// [`compute_icrc`] through the cache, over the transport's bytes in `parts` (joined).
    #[inline]
    pub(super) fn icrc(
        &mut self,
        (src, dst): (IpAddr, IpAddr),
        (src_port, dst_port): (u16, u16),
        parts: &[&[u8]],
        engine: icrc::Engine,
        set: usize,
    ) -> u32 {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let key = prefix_key(src_port, len);
        let ways = &mut self.0[set % ICRC_SETS];
        let prefix = match *ways {
            [Some((k, p)), _] if k == key => p,
            [first, Some((k, p))] if k == key => {
                *ways = [Some((k, p)), first];
                p
            }
            [first, _] => {
                let (ip, ip_len, udp) = icrc_headers(src, dst, src_port, dst_port, len);
                let p = icrc::split_prefix(&ip[..ip_len], &udp, len);
                *ways = [Some((key, p)), first];
                p
            }
        };
        match parts {
            [whole] => icrc::finish_split(&prefix, whole, engine),
            _ => icrc::finish_split_parts(&prefix, parts, engine),
        }
    }

    /// Whether the prefix of (`src_port`, `len`) is cached.
    #[cfg(test)]
    pub(super) fn holds(&self, src_port: u16, len: usize) -> bool {
        let key = prefix_key(src_port, len);
        self.0.iter().flatten().flatten().any(|(k, _)| *k == key)
    }
}
