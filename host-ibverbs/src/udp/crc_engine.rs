//! The ICRC's CRC-32 on this machine: on x86_64 with PCLMULQDQ and SSE4.1 (detected at run time),
//! a carry-less multiply fold of 16-byte blocks and a Barrett reduction, with no tables, for the
//! short datagrams that make up a ping-pong, ACKs and small messages (48 to 127 bytes, where
//! crc32fast reads its tables); otherwise the core's built-in engine (crc32fast, which folds
//! four blocks at a time with PCLMULQDQ from 128 bytes on).
//!
//! The fold works in the bit-reflected domain of the zlib CRC-32 (polynomial 0x04C11DB7): a
//! 128-bit remainder `x` absorbs the next block as `x.lo * (x^160 mod P) ^ x.hi * (x^96 mod P) ^
//! block` (constants bit-reflected and shifted left by one, as the reflected product needs), then
//! folds to 64 bits with `x^96 mod P` and `x^64 mod P` and reduces to 32 with Barrett's `floor(x^64 /
//! P)`. The constants are derived in the tests below from the polynomial, not taken on trust.

use transport_core::icrc::Engine;

/// The engine to hand the connections: PCLMULQDQ folding where the CPU has it.
pub fn engine() -> Engine {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("pclmulqdq")
            && std::arch::is_x86_feature_detected!("sse4.1")
        {
            return Engine::Runner {
                name: "pclmulqdq",
                update: x86::update,
            };
        }
    }
    Engine::BuiltIn
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use transport_core::icrc::crc32_update;

    /// Inputs at least this long go to the built-in engine: from 128 bytes on, crc32fast folds
    /// four blocks at a time with PCLMULQDQ itself; below, it reads its 16 KiB of tables.
    const LONG: usize = 128;
    /// Inputs shorter than this go to the built-in engine too: the first blocks of a long
    /// datagram (`finish_split` hands over the masked headers' last bytes and the BTH, 16 or 32
    /// bytes, before the rest), where crc32fast's tables are warm and the fold's reduction costs
    /// more than it saves (a 1040-byte transport 89 ns with the fold against 64 ns without,
    /// 4136 bytes 161 against 123 ns; `cargo bench -p host-ibverbs --bench icrc_engine`).
    const SHORT: usize = 48;

    /// `x^160 mod P`, reflected and shifted: folds the low half of the remainder one block on.
    pub(super) const K160: u64 = 0x1_7519_97d0;
    /// `x^96 mod P`: folds the high half one block on, and 128 bits to 96.
    pub(super) const K96: u64 = 0x0_ccaa_009e;
    /// `x^64 mod P`: folds 96 bits to 64.
    pub(super) const K64: u64 = 0x1_63cd_6124;
    /// The polynomial, reflected over 33 bits.
    pub(super) const P: u64 = 0x1_db71_0641;
    /// Barrett's `floor(x^64 / P)`, reflected over 33 bits.
    pub(super) const MU: u64 = 0x1_f701_1641;

    /// Continues the CRC-32 `crc` over `data`. Only `super::engine` hands it out, after
    /// detecting PCLMULQDQ and SSE4.1.
    pub(super) fn update(crc: u32, data: &[u8]) -> u32 {
        if data.len() < SHORT || data.len() >= LONG {
            return crc32_update(crc, data);
        }
        // Bytes before the last whole blocks go first, byte-wise (none for the connection's
        // split prefixes, which make whole blocks).
        let (head, blocks) = data.split_at(data.len() % 16);
        let crc = if head.is_empty() {
            crc
        } else {
            crc32_update(crc, head)
        };
        // SAFETY: this function is only reachable through `engine`, which returns it only when
        // the CPU has PCLMULQDQ and SSE4.1, the features `fold` is compiled for.
        unsafe { fold(crc, blocks) }
    }

    /// A 16-byte block as the low (first eight bytes) and high halves of a register.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn block(b: &[u8]) -> __m128i {
        let lo = u64::from_le_bytes(b[..8].try_into().unwrap_or_default());
        let hi = u64::from_le_bytes(b[8..16].try_into().unwrap_or_default());
        _mm_set_epi64x(hi as i64, lo as i64)
    }

    /// The CRC-32 `crc` continued over `data`, whole 16-byte blocks (at least one).
    #[target_feature(enable = "pclmulqdq,sse4.1")]
    pub(super) fn fold(crc: u32, data: &[u8]) -> u32 {
        debug_assert!(data.len() >= 16 && data.len() % 16 == 0);
        let mut chunks = data.chunks_exact(16);
        let Some(first) = chunks.next() else {
            return crc;
        };
        // The register (the CRC before its final inversion) enters the first four bytes.
        let mut x = _mm_xor_si128(block(first), _mm_cvtsi32_si128(!crc as i32));
        let k = _mm_set_epi64x(K96 as i64, K160 as i64);
        for c in chunks {
            let lo = _mm_clmulepi64_si128::<0x00>(x, k);
            let hi = _mm_clmulepi64_si128::<0x11>(x, k);
            x = _mm_xor_si128(_mm_xor_si128(lo, hi), block(c));
        }
        // 128 bits to 96: the low half times x^96, plus the high half.
        x = _mm_xor_si128(_mm_clmulepi64_si128::<0x10>(x, k), _mm_srli_si128::<8>(x));
        // 96 bits to 64: the low 32 bits times x^64, plus the rest.
        let low32 = _mm_set_epi32(0, 0, 0, -1);
        let k64 = _mm_set_epi64x(0, K64 as i64);
        x = _mm_xor_si128(
            _mm_clmulepi64_si128::<0x00>(_mm_and_si128(x, low32), k64),
            _mm_srli_si128::<4>(x),
        );
        // Barrett: the quotient's low 32 bits, times P, cancel the remainder's low half.
        let pmu = _mm_set_epi64x(MU as i64, P as i64);
        let q = _mm_and_si128(
            _mm_clmulepi64_si128::<0x10>(_mm_and_si128(x, low32), pmu),
            low32,
        );
        let r = _mm_xor_si128(_mm_clmulepi64_si128::<0x00>(q, pmu), x);
        !(_mm_extract_epi32::<1>(r) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use transport_core::icrc::crc32_update;

    /// `x^n mod P` in the usual bit order.
    #[cfg(target_arch = "x86_64")]
    fn xpow_mod(n: u32) -> u64 {
        let p = 0x1_04c1_1db7u64;
        let mut r = 1u64;
        for _ in 0..n {
            r <<= 1;
            if r & (1 << 32) != 0 {
                r ^= p;
            }
        }
        r
    }

    #[cfg(target_arch = "x86_64")]
    fn reflect(v: u64, bits: u32) -> u64 {
        v.reverse_bits() >> (64 - bits)
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_fold_constants_follow_from_the_polynomial() {
        assert_eq!(reflect(xpow_mod(160), 32) << 1, x86::K160);
        assert_eq!(reflect(xpow_mod(96), 32) << 1, x86::K96);
        assert_eq!(reflect(xpow_mod(64), 32) << 1, x86::K64);
        assert_eq!(reflect(0x1_04c1_1db7, 33), x86::P);
        // floor(x^64 / P) by long division.
        let (mut rem, mut q) = (1u128 << 64, 0u128);
        while 128 - rem.leading_zeros() >= 33 {
            let s = 128 - rem.leading_zeros() - 33;
            q |= 1 << s;
            rem ^= 0x1_04c1_1db7u128 << s;
        }
        assert_eq!(reflect(q as u64, 33), x86::MU);
    }

    /// Every length from 0 to past the long cut, every start offset in a block, several
    /// registers: the same CRC as the built-in engine and as the `crc` crate.
    #[test]
    fn the_engine_agrees_with_the_built_in_one_and_the_crc_crate() {
        let e = engine();
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("pclmulqdq")
            && std::arch::is_x86_feature_detected!("sse4.1")
        {
            assert_eq!(e.name(), "pclmulqdq");
        }
        let reference = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
        let data: Vec<u8> = (0..2000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in 0..16 {
            for len in (0..600).chain([1023, 1024, 1500, 1984 - start]) {
                let d = &data[start..start + len];
                for before in [&data[..0], &data[1990..], &data[1000..1037]] {
                    let crc = crc32_update(0, before);
                    let mut all = before.to_vec();
                    all.extend_from_slice(d);
                    let want = reference.checksum(&all);
                    assert_eq!(e.update(crc, d), want, "len {len} at {start}");
                    assert_eq!(Engine::BuiltIn.update(crc, d), want);
                }
            }
        }
    }
}
