//! The invariant CRC of RoCEv2 (IBTA Annex A17.3.3), computed exactly as ConnectX NICs and
//! Linux rxe compute it.
//!
//! ICRC = CRC-32 (the zlib / IEEE 802.3 polynomial, reflected, initial and final XOR all ones) over
//! eight bytes of `0xff` standing for the masked LRH, then the IP header, the UDP header, the BTH,
//! the extension headers, the payload and the pad, with the fields that routers and switches may
//! change replaced by all ones: IPv4 TOS, TTL and header checksum; IPv6 traffic class, flow label
//! and hop limit; the UDP checksum; BTH byte 4 (FECN, BECN and six reserved bits). It is stored
//! least significant byte first. IPv4 options, when present, are covered as they stand.
//!
//! [`crc32`] is the one function behind which the CRC engine sits: with the default `fast-crc`
//! feature it is `crc32fast` (PCLMULQDQ folding on x86_64, the ARMv8 CRC32 instructions on
//! aarch64; detected at run time when the final binary enables `crc32fast/std`), otherwise the
//! `crc` crate's slice-by-16 table, which builds for every target. `docs/BENCHMARKS.md` holds the
//! measurement that chose them. A connection hashes through an [`Engine`]: this build's, or one
//! its runner hands in for the machine (the UDP transport's PCLMULQDQ block folding for short
//! datagrams, which needs no tables), fed whole 16-byte blocks through [`SplitPrefix`].

/// Bytes of the masked prefix: 8 (LRH) + 60 (largest IPv4 header) + 8 (UDP) + 12 (BTH).
const PREFIX_MAX: usize = 8 + 60 + 8 + 12;

#[cfg(not(feature = "fast-crc"))]
static TABLE: crc::Crc<u32, crc::Table<16>> =
    crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);

/// An incremental CRC-32 (zlib) over the engine this build selected.
struct Hasher {
    #[cfg(feature = "fast-crc")]
    inner: crc32fast::Hasher,
    #[cfg(not(feature = "fast-crc"))]
    inner: crc::Digest<'static, u32, crc::Table<16>>,
}

impl Hasher {
    #[inline(always)]
    fn new() -> Self {
        #[cfg(feature = "fast-crc")]
        let inner = crc32fast::Hasher::new();
        #[cfg(not(feature = "fast-crc"))]
        let inner = TABLE.digest();
        Hasher { inner }
    }

    /// Continues from `crc`, the CRC-32 of the bytes hashed so far.
    #[inline(always)]
    fn resume(crc: u32) -> Self {
        #[cfg(feature = "fast-crc")]
        let inner = crc32fast::Hasher::new_with_initial(crc);
        // The table engine takes the register's value before the final XOR, unreflected.
        #[cfg(not(feature = "fast-crc"))]
        let inner = TABLE.digest_with_initial((crc ^ 0xffff_ffff).reverse_bits());
        Hasher { inner }
    }

    #[inline(always)]
    fn update(&mut self, bytes: &[u8]) {
        self.inner.update(bytes);
    }

    #[inline(always)]
    fn finish(self) -> u32 {
        #[cfg(feature = "fast-crc")]
        return self.inner.finalize();
        #[cfg(not(feature = "fast-crc"))]
        return self.inner.finalize();
    }
}

/// A CRC-32 (zlib) engine: the CRC-32 of some bytes and the bytes that follow them in, the CRC-32
/// of all of them out. [`Engine::BuiltIn`] is this build's ([`crc32_update`]); a runner may hand
/// the connections a faster one for the machine it runs on ([`crate::conn::Config::icrc_engine`]).
/// Every ICRC of a connection reaches it through [`finish_split`], in whole 16-byte blocks where
/// the datagram allows (see [`SplitPrefix`]).
#[derive(Clone, Copy, Default)]
pub enum Engine {
    /// This build's engine.
    #[default]
    BuiltIn,
    /// A runner's engine, known by its name (for `Debug` and equality: function addresses are
    /// not a reliable identity).
    Runner {
        /// What it is, such as "pclmulqdq".
        name: &'static str,
        /// The CRC-32 of the bytes so far and the next bytes in, of all of them out.
        update: fn(u32, &[u8]) -> u32,
    },
}

impl Engine {
    /// Continues the CRC-32 `crc` over `bytes`.
    #[inline]
    pub fn update(&self, crc: u32, bytes: &[u8]) -> u32 {
        match self {
            Engine::BuiltIn => crc32_update(crc, bytes),
            Engine::Runner { update, .. } => update(crc, bytes),
        }
    }

    /// Its name ("built-in" for this build's).
    pub fn name(&self) -> &'static str {
        match self {
            Engine::BuiltIn => "built-in",
            Engine::Runner { name, .. } => name,
        }
    }
}

impl core::fmt::Debug for Engine {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Engine({})", self.name())
    }
}

impl PartialEq for Engine {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Engine {}

/// CRC-32 (zlib) of the bytes before, `crc`, continued over `bytes`, on this build's engine.
#[inline]
pub fn crc32_update(crc: u32, bytes: &[u8]) -> u32 {
    let mut h = Hasher::resume(crc);
    h.update(bytes);
    h.finish()
}

/// CRC-32 as zlib computes it, on this build's fastest engine.
#[inline]
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut h = Hasher::new();
    h.update(bytes);
    h.finish()
}

/// The ICRC of a RoCEv2 packet.
///
/// `ip_header` is the whole IPv4 (options included) or IPv6 header as it is on the wire,
/// `udp_header` the 8-byte UDP header, and `transport` everything from the BTH to the end of the
/// pad (the ICRC itself excluded). Which IP version applies is read from `ip_header`. Inputs that
/// are shorter than their headers are hashed as they are; this function never panics.
pub fn compute(ip_header: &[u8], udp_header: &[u8], transport: &[u8]) -> u32 {
    finish(prefix(ip_header, udp_header), transport)
}

/// The first half of [`compute`]: the CRC-32 of the masked LRH, IP header and UDP header alone.
/// A sender or receiver that sees the same addresses, ports and length again can keep it and
/// hand it to [`finish`] with each packet's transport bytes.
pub fn prefix(ip_header: &[u8], udp_header: &[u8]) -> u32 {
    let (bytes, n) = prefix_bytes(ip_header, udp_header);
    crc32(&bytes[..n])
}

/// The masked LRH, IP header and UDP header that [`prefix`] hashes, and how many of the bytes
/// they are.
fn prefix_bytes(ip_header: &[u8], udp_header: &[u8]) -> ([u8; PREFIX_MAX], usize) {
    let mut prefix = [0xffu8; PREFIX_MAX];
    let ip_len = ip_header.len().min(60);
    let ip = &mut prefix[8..8 + ip_len];
    ip.copy_from_slice(&ip_header[..ip_len]);
    let version = ip.first().map_or(0, |b| b >> 4);
    let masks: &[usize] = if version == 6 {
        &[1, 2, 3, 7]
    } else {
        &[1, 8, 10, 11]
    };
    for &i in masks {
        if let Some(b) = ip.get_mut(i) {
            *b = 0xff;
        }
    }
    if version == 6 {
        if let Some(b) = ip.first_mut() {
            *b |= 0x0f;
        }
    }
    let mut n = 8 + ip_len;
    let udp_len = udp_header.len().min(8);
    prefix[n..n + udp_len].copy_from_slice(&udp_header[..udp_len]);
    if udp_len == 8 {
        prefix[n + 6] = 0xff;
        prefix[n + 7] = 0xff;
    }
    n += udp_len;
    (prefix, n)
}

/// [`prefix`] cut so that what is left of it and `transport_len` transport bytes make whole
/// 16-byte blocks: the CRC-32 of the masked headers but their last `tail_len` bytes, and those
/// bytes. [`finish_split`] hashes the tail and the transport bytes in one call of the engine,
/// which a block-folding engine (PCLMULQDQ) takes without a byte-by-byte start or end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SplitPrefix {
    /// CRC-32 of the masked headers without the tail.
    pub crc: u32,
    /// The last bytes of the masked headers.
    pub tail: [u8; 16],
    /// How many of `tail` are used (0 to 15).
    pub tail_len: u8,
}

/// [`prefix`] as a [`SplitPrefix`] for transports of `transport_len` bytes.
pub fn split_prefix(ip_header: &[u8], udp_header: &[u8], transport_len: usize) -> SplitPrefix {
    let (bytes, n) = prefix_bytes(ip_header, udp_header);
    let t = ((16 - transport_len % 16) % 16).min(n);
    let mut tail = [0u8; 16];
    tail[..t].copy_from_slice(&bytes[n - t..n]);
    SplitPrefix {
        crc: crc32(&bytes[..n - t]),
        tail,
        tail_len: t as u8,
    }
}

/// Transports up to this long are hashed with their prefix tail in one engine call.
const ONE_CALL: usize = 240;

/// [`finish`] from a [`SplitPrefix`], on `engine`: the same ICRC for any transport, in one call
/// of whole blocks for a short one (the ICRC of a ping, an ACK or a small message), in two for a
/// long one (the blocks holding the BTH, then the rest).
pub fn finish_split(p: &SplitPrefix, transport: &[u8], engine: Engine) -> u32 {
    // (The same as `finish_split_parts` over one piece, written out: through the general form,
    // the receive side's ICRC of a whole datagram took 2-13% longer, `cargo bench -p
    // host-ibverbs --bench icrc_engine`, warm.)
    let t = usize::from(p.tail_len).min(16);
    let mut head = [0u8; 16 + ONE_CALL];
    head[..t].copy_from_slice(&p.tail[..t]);
    let in_head = if transport.len() <= ONE_CALL {
        transport.len()
    } else {
        (t + 12).next_multiple_of(16) - t
    };
    head[t..t + in_head].copy_from_slice(&transport[..in_head]);
    if in_head > 4 {
        head[t + 4] = 0xff;
    }
    let crc = engine.update(p.crc, &head[..t + in_head]);
    match &transport[in_head..] {
        [] => crc,
        rest => engine.update(crc, rest),
    }
}

/// [`finish_split`] over a transport in pieces (headers, a payload read where it lies, the pad):
/// the same ICRC as over the pieces joined, without joining them.
pub fn finish_split_parts(p: &SplitPrefix, parts: &[&[u8]], engine: Engine) -> u32 {
    let t = usize::from(p.tail_len).min(16);
    let total: usize = parts.iter().map(|x| x.len()).sum();
    let mut head = [0u8; 16 + ONE_CALL];
    head[..t].copy_from_slice(&p.tail[..t]);
    // The first call takes the prefix's tail and the whole first piece (the headers, in front
    // of a payload sent where it lies), rounded up to whole blocks from the next: the rest is
    // then whole blocks in as few calls as there are pieces left.
    // (At least the BTH, whose byte 4 is masked in the head.)
    let first = parts.first().map_or(0, |p| p.len());
    let bth = (t + 12).next_multiple_of(16) - t;
    let in_head = if total <= ONE_CALL {
        total
    } else if t + first + 15 <= 16 + ONE_CALL {
        ((t + first).next_multiple_of(16) - t).max(bth).min(total)
    } else {
        bth
    };
    let mut n = 0;
    for part in parts {
        if n == in_head {
            break;
        }
        let take = (in_head - n).min(part.len());
        head[t + n..t + n + take].copy_from_slice(&part[..take]);
        n += take;
    }
    if in_head > 4 {
        head[t + 4] = 0xff;
    }
    let mut crc = engine.update(p.crc, &head[..t + in_head]);
    let mut skip = in_head;
    for part in parts {
        if skip >= part.len() {
            skip -= part.len();
            continue;
        }
        crc = engine.update(crc, &part[skip..]);
        skip = 0;
    }
    crc
}

/// The second half of [`compute`]: continues the CRC `prefix` (from [`prefix`]) over the
/// transport bytes, BTH byte 4 masked, and returns the ICRC.
pub fn finish(prefix: u32, transport: &[u8]) -> u32 {
    let whole = SplitPrefix {
        crc: prefix,
        ..SplitPrefix::default()
    };
    finish_split(&whole, transport, Engine::BuiltIn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value() {
        // The CRC-32/ISO-HDLC check value.
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        let reference = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
        let data: std::vec::Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0, 1, 15, 16, 63, 64, 65, 4096, 5000] {
            assert_eq!(crc32(&data[..len]), reference.checksum(&data[..len]));
        }
    }

    #[test]
    fn connectx_cnp_icrc() {
        // The CNP captured on a ConnectX-4 Lx (scapy's roce.uts): ICRC 0x2a00fd82 stored LSB first.
        let hex = "45c2003c718c4000401191610a0011010a001201000012b7002800008100ffff40000118\
                   000000000000000000000000000000000000000082fd002a";
        let frame: std::vec::Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let frame = &frame[..frame.len() - 4];
        let icrc = compute(&frame[..20], &frame[20..28], &frame[28..]);
        assert_eq!(icrc.to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);
    }

    #[test]
    fn prefix_then_finish_is_one_pass_over_the_masked_bytes() {
        // Against a one-pass reference over the masked pseudo-packet, built by hand.
        let reference = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
        let data: std::vec::Vec<u8> = (0..300u32).map(|i| (i * 13 + 5) as u8).collect();
        let mut ip = [0u8; 20];
        ip.copy_from_slice(&data[..20]);
        ip[0] = 0x45;
        let udp = &data[20..28];
        for len in [0, 3, 5, 12, 13, 60, 256] {
            let t = &data[28..28 + len];
            let mut masked = std::vec![0xffu8; 8];
            let mut m = ip;
            for i in [1, 8, 10, 11] {
                m[i] = 0xff;
            }
            masked.extend_from_slice(&m);
            masked.extend_from_slice(&udp[..6]);
            masked.extend_from_slice(&[0xff, 0xff]);
            masked.extend_from_slice(t);
            if len > 4 {
                masked[8 + 20 + 8 + 4] = 0xff;
            }
            let want = reference.checksum(&masked);
            assert_eq!(finish(prefix(&ip, udp), t), want, "len {len}");
            assert_eq!(compute(&ip, udp, t), want, "len {len}");
        }
    }

    std::thread_local! {
        /// Calls of [`COUNTING`] on this thread, and those of partial 16-byte blocks.
        static COUNTS: core::cell::Cell<(usize, usize)> = const { core::cell::Cell::new((0, 0)) };
    }

    fn counting(crc: u32, bytes: &[u8]) -> u32 {
        COUNTS.with(|c| {
            let (calls, partial) = c.get();
            c.set((calls + 1, partial + usize::from(bytes.len() % 16 != 0)));
        });
        crc32_update(crc, bytes)
    }

    /// The built-in CRC, counting its calls ([`counts`]).
    const COUNTING: Engine = Engine::Runner {
        name: "counting",
        update: counting,
    };

    /// (calls, calls of partial blocks) of [`COUNTING`] on this thread so far.
    fn counts() -> (usize, usize) {
        COUNTS.with(|c| c.get())
    }

    /// The split prefix gives the same ICRC for every transport length, short (one call of the
    /// engine) and long (two), with IPv4 options and IPv6, and hands the engine whole 16-byte
    /// blocks only, whatever the length it was split for.
    #[test]
    fn split_prefix_then_finish_is_finish_in_whole_blocks() {
        let data: std::vec::Vec<u8> = (0..2000u32).map(|i| (i * 29 + 3) as u8).collect();
        let mut v4 = [0u8; 24];
        v4.copy_from_slice(&data[..24]);
        v4[0] = 0x46; // one word of options
        let mut v6 = [0u8; 40];
        v6.copy_from_slice(&data[100..140]);
        v6[0] = 0x60;
        let udp = &data[200..208];
        for ip in [&v4[..20], &v4[..], &v6[..]] {
            for len in 0..600 {
                let t = &data[300..300 + len];
                let want = finish(prefix(ip, udp), t);
                let p = split_prefix(ip, udp, len);
                assert_eq!((usize::from(p.tail_len) + len) % 16, 0, "len {len}");
                assert_eq!(finish_split(&p, t, Engine::BuiltIn), want, "len {len}");
                let before = counts().0;
                assert_eq!(finish_split(&p, t, COUNTING), want, "len {len}");
                let calls = counts().0 - before;
                assert_eq!(calls, if len <= ONE_CALL { 1 } else { 2 }, "len {len}");
                // Split for another length: still right, if not in whole blocks.
                let other = split_prefix(ip, udp, len + 5);
                assert_eq!(finish_split(&other, t, Engine::BuiltIn), want, "len {len}");
            }
        }
        assert!(counts().0 > 1000);
        assert_eq!(counts().1, 0, "calls of partial blocks");
        assert_eq!(Engine::default(), Engine::BuiltIn);
        assert_ne!(COUNTING, Engine::BuiltIn);
        assert_eq!(std::format!("{COUNTING:?}"), "Engine(counting)");
    }

    /// The ICRC over a transport in pieces is the ICRC over the pieces joined, wherever the
    /// cuts fall (inside the first block, at its end, empty pieces, a long payload).
    #[test]
    fn finish_over_parts_is_finish_over_the_joined_bytes() {
        // Headers, a payload and no pad: two calls of whole blocks (the tail and the headers
        // with the payload's first bytes, then the rest of the payload).
        {
            let data: std::vec::Vec<u8> = (0..5000u32).map(|i| (i * 41 + 5) as u8).collect();
            for (h, pl) in [(40usize, 1024usize), (52, 1024), (36, 4096), (64, 2048)] {
                let (ip, udp) = (&data[..20], &data[20..28]);
                let (hd, payload) = (&data[100..100 + h], &data[300..300 + pl]);
                let p = split_prefix(ip, udp, h + pl);
                let mut joined = hd.to_vec();
                joined.extend_from_slice(payload);
                let want = finish_split(&p, &joined, Engine::BuiltIn);
                let (c0, p0) = counts();
                assert_eq!(finish_split_parts(&p, &[hd, payload, &[]], COUNTING), want);
                let (c1, p1) = counts();
                assert_eq!((c1 - c0, p1 - p0), (2, 0), "{h} + {pl}: calls, partial");
            }
        }
        let data: std::vec::Vec<u8> = (0..1200u32).map(|i| (i * 37 + 11) as u8).collect();
        let ip = &data[..20];
        let udp = &data[20..28];
        for len in [0usize, 3, 12, 36, 52, 239, 240, 241, 300, 1076] {
            let t = &data[100..100 + len];
            let p = split_prefix(ip, udp, len);
            let want = finish_split(&p, t, Engine::BuiltIn);
            for a in [0, 1, 4, 5, 11, 12, 27, 28, 36, 52]
                .into_iter()
                .filter(|&a| a <= len)
            {
                for b in [a, a + 1, a + 16, len].into_iter().filter(|&b| b <= len) {
                    let parts = [&t[..a], &t[a..b], &[][..], &t[b..]];
                    assert_eq!(
                        finish_split_parts(&p, &parts, Engine::BuiltIn),
                        want,
                        "len {len} cut at {a} and {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn short_inputs_never_panic() {
        for ip in 0..3 {
            for udp in 0..9 {
                for t in 0..14 {
                    let buf = [0x60u8; 64];
                    let _ = compute(&buf[..ip], &buf[..udp], &buf[..t]);
                }
            }
        }
        let _ = compute(&[0x45; 100], &[0; 8], &[0; 12]);
    }
}
