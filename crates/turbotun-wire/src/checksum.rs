//! The Internet checksum (RFC 1071): a fast portable sum, pseudo-headers, incremental update (RFC 1624) and
//! completion of a partial checksum (virtio `NEEDS_CSUM`).
//!
//! Conventions: [`sum`] returns a *partial sum*, a `u32` that is already folded to at most `0xffff` so that
//! partial sums can be added with [`add`]; [`fold`] folds carries into 16 bits without complementing; [`finish`]
//! returns the value to store in a checksum field (`!fold`). A packet verifies when `fold(sum over it and its
//! pseudo-header) == 0xffff`.
//!
//! Speed: [`sum`] and [`copy_and_sum`] pass the bulk of the data to two internal loops (`sum_lanes` and
//! `copy_sum_lanes`), which add 16-bit words into sixteen 32-bit lanes, 64 bytes per iteration: no carries to
//! handle, and a shape that compilers turn into SIMD. The crate forbids `unsafe`, so the SIMD versions come from
//! the `multiversion` crate, which compiles each loop for AVX-512BW, AVX2 and the baseline (SSE2 on x86-64), or
//! NEON on aarch64, and picks one at run time from the CPU's features. Tests check every path against the scalar reference [`sum_reference`]. Because one's-complement
//! addition is byte-order independent (RFC 1071 §2(B)), the native-endian sum is byte swapped once at the end.

use crate::WireError;

/// Folds carries into 16 bits (no complement).
#[inline]
pub fn fold(sum: u32) -> u16 {
    let s = (sum & 0xffff) + (sum >> 16);
    let s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// Folds a 64-bit accumulator into 16 bits (no complement).
#[inline]
fn fold64(sum: u64) -> u16 {
    let s = (sum & 0xffff_ffff) + (sum >> 32);
    let s = (s & 0xffff_ffff) + (s >> 32);
    fold((s & 0xffff_ffff) as u32 + (s >> 32) as u32)
}

/// The value to store in a checksum field: `!fold(sum)`.
#[inline]
pub fn finish(sum: u32) -> u16 {
    !fold(sum)
}

/// Adds two partial sums (one's-complement), result folded to at most `0xffff`.
#[inline]
pub fn add(a: u32, b: u32) -> u32 {
    fold(fold(a) as u32 + fold(b) as u32) as u32
}

/// Adds partial sum `b` of bytes that follow `a_len` bytes summed into `a` (handles an odd `a_len`).
#[inline]
pub fn combine(a: u32, b: u32, a_len: usize) -> u32 {
    if a_len % 2 == 1 {
        add(a, fold(b).swap_bytes() as u32)
    } else {
        add(a, b)
    }
}

#[inline(always)]
fn ne32(c: &[u8]) -> u64 {
    let mut a = [0u8; 4];
    a.copy_from_slice(c);
    u32::from_ne_bytes(a) as u64
}

/// Bytes one lane pass may cover: each of the 16 u32 lanes gains at most 2 * 0xffff per 64 bytes, so 1 MiB
/// (16384 iterations) keeps every lane below 2^32.
const LANE_BLOCK: usize = 1 << 20;

/// Sum of the native-endian 16-bit words of `data[..len - len % 64]` (at most [`LANE_BLOCK`] bytes), unfolded.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512bw", "x86_64+avx2", "aarch64+neon"))]
fn sum_lanes(data: &[u8]) -> u64 {
    let mut lanes = [0u32; 16];
    for c in data.chunks_exact(64) {
        for (j, lane) in lanes.iter_mut().enumerate() {
            *lane += u32::from(u16::from_ne_bytes([c[2 * j], c[2 * j + 1]]))
                + u32::from(u16::from_ne_bytes([c[32 + 2 * j], c[33 + 2 * j]]));
        }
    }
    lanes.iter().map(|&l| u64::from(l)).sum()
}

/// [`sum_lanes`] that also copies those bytes from `src` to `dst` (equal lengths) in the same pass.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512bw", "x86_64+avx2", "aarch64+neon"))]
fn copy_sum_lanes(dst: &mut [u8], src: &[u8]) -> u64 {
    let mut lanes = [0u32; 16];
    for (d, c) in dst.chunks_exact_mut(64).zip(src.chunks_exact(64)) {
        d.copy_from_slice(c);
        for (j, lane) in lanes.iter_mut().enumerate() {
            *lane += u32::from(u16::from_ne_bytes([c[2 * j], c[2 * j + 1]]))
                + u32::from(u16::from_ne_bytes([c[32 + 2 * j], c[33 + 2 * j]]));
        }
    }
    lanes.iter().map(|&l| u64::from(l)).sum()
}

/// Sum of native-endian 16-bit words of a block of at most 1 GiB (the odd last byte padded with zero), as a
/// 64-bit value that still has to be folded. Each accumulator grows by < 2^33 per 32 bytes, so < 2^58 per GiB.
#[inline(always)]
fn sum_block(block: &[u8]) -> u64 {
    let bulk = block.len() - block.len() % 64;
    let mut total: u64 = 0;
    for piece in block[..bulk].chunks(LANE_BLOCK) {
        total += sum_lanes(piece);
    }
    total + sum_tail(&block[bulk..])
}

/// Sum of a short tail (under 64 bytes, starting at an even offset), unfolded.
#[inline(always)]
fn sum_tail(rest: &[u8]) -> u64 {
    let mut a = [0u64; 4];
    let mut words = rest.chunks_exact(4);
    for w in &mut words {
        a[0] += ne32(w);
    }
    // The last 0..=3 bytes; an odd byte is padded with zero at its position within its 16-bit word.
    match *words.remainder() {
        [x] => a[1] += u16::from_ne_bytes([x, 0]) as u64,
        [x, y] => a[1] += u16::from_ne_bytes([x, y]) as u64,
        [x, y, z] => a[1] += u16::from_ne_bytes([x, y]) as u64 + u16::from_ne_bytes([z, 0]) as u64,
        _ => {}
    }
    a[0] + a[1] + a[2] + a[3]
}

/// Sum of native-endian 16-bit words, folded to 16 bits.
#[inline]
fn sum_ne(data: &[u8]) -> u16 {
    const BLOCK: usize = 1 << 30;
    if data.len() <= BLOCK {
        return fold64(sum_block(data));
    }
    let mut total: u64 = 0;
    for block in data.chunks(BLOCK) {
        total = fold64(total + fold64(sum_block(block)) as u64) as u64;
    }
    total as u16
}

/// One's-complement sum of `data` as big-endian 16-bit words (an odd last byte is padded with zero), plus
/// `initial`. Returns a partial sum folded to at most `0xffff`.
///
/// Only the last of several chained pieces may have odd length (or use [`combine`]).
#[inline]
pub fn sum(data: &[u8], initial: u32) -> u32 {
    let ne = sum_ne(data);
    let be = if cfg!(target_endian = "little") { ne.swap_bytes() } else { ne };
    add(be as u32, initial)
}

/// Copies `src` into the start of `dst` and returns the one's-complement sum of `src` plus `initial`, as
/// [`sum`] would, in one pass over the data: the bytes are summed while they are in registers for the copy, so
/// a segment costs one read instead of two. Copies and sums `min(dst.len(), src.len())` bytes.
#[inline]
pub fn copy_and_sum(dst: &mut [u8], src: &[u8], initial: u32) -> u32 {
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    if n > 1 << 30 {
        dst.copy_from_slice(src);
        return sum(src, initial);
    }
    let bulk = n - n % 64;
    let mut total: u64 = 0;
    for (d, c) in dst[..bulk].chunks_mut(LANE_BLOCK).zip(src[..bulk].chunks(LANE_BLOCK)) {
        total += copy_sum_lanes(d, c);
    }
    dst[bulk..].copy_from_slice(&src[bulk..]);
    let ne = fold64(total + sum_tail(&src[bulk..]));
    let be = if cfg!(target_endian = "little") { ne.swap_bytes() } else { ne };
    add(be as u32, initial)
}

/// The simple scalar RFC 1071 sum, used as the reference in tests.
pub fn sum_reference(data: &[u8], initial: u32) -> u32 {
    let mut acc: u64 = fold(initial) as u64;
    let mut it = data.chunks_exact(2);
    for w in &mut it {
        acc += u16::from_be_bytes([w[0], w[1]]) as u64;
    }
    if let [b] = it.remainder() {
        acc += (*b as u64) << 8;
    }
    fold64(acc) as u32
}

/// Checksum of `data` ready to store: `finish(sum(data, initial))`.
pub fn checksum(data: &[u8], initial: u32) -> u16 {
    finish(sum(data, initial))
}

/// IPv4 pseudo-header partial sum (source, destination, zero, protocol, L4 length).
pub fn pseudo_header_v4(src: impl Into<[u8; 4]>, dst: impl Into<[u8; 4]>, proto: u8, len: u32) -> u32 {
    let (s, d) = (src.into(), dst.into());
    let acc = u16::from_be_bytes([s[0], s[1]]) as u32
        + u16::from_be_bytes([s[2], s[3]]) as u32
        + u16::from_be_bytes([d[0], d[1]]) as u32
        + u16::from_be_bytes([d[2], d[3]]) as u32
        + proto as u32
        + (len >> 16)
        + (len & 0xffff);
    fold(acc) as u32
}

/// IPv6 pseudo-header partial sum (source, destination, 32-bit L4 length, next header).
pub fn pseudo_header_v6(src: impl Into<[u8; 16]>, dst: impl Into<[u8; 16]>, proto: u8, len: u32) -> u32 {
    let (s, d) = (src.into(), dst.into());
    let mut acc: u32 = proto as u32 + (len >> 16) + (len & 0xffff);
    for i in (0..16).step_by(2) {
        acc += u16::from_be_bytes([s[i], s[i + 1]]) as u32 + u16::from_be_bytes([d[i], d[i + 1]]) as u32;
    }
    fold(acc) as u32
}

/// RFC 1624 eqn. 3: the new checksum field after a 16-bit word of the covered data changed from `old` to `new`.
#[inline]
pub fn update16(check: u16, old: u16, new: u16) -> u16 {
    !fold(!check as u32 + !old as u32 + new as u32)
}

/// RFC 1624 for a 32-bit field (e.g. a TCP sequence number).
#[inline]
pub fn update32(check: u16, old: u32, new: u32) -> u16 {
    let c = update16(check, (old >> 16) as u16, (new >> 16) as u16);
    update16(c, old as u16, new as u16)
}

/// RFC 1624 over byte strings of equal, even length at an even offset of the covered data.
/// Returns `None` if the lengths differ or are odd.
pub fn update_bytes(check: u16, old: &[u8], new: &[u8]) -> Option<u16> {
    if old.len() != new.len() || old.len() % 2 == 1 {
        return None;
    }
    // ~HC + ~m + m' == ~HC + sum(m') - sum(m); subtracting is adding the complement.
    let acc = !check as u32 + !fold(sum(old, 0)) as u32 + fold(sum(new, 0)) as u32;
    Some(!fold(acc))
}

/// Completes a partial checksum the way a device does for `NEEDS_CSUM`: sums `packet[start..]` (the checksum
/// field holds the pseudo-header sum) and stores the complement at `start + offset` (0 is sent as `0xffff`).
pub fn complete_partial(packet: &mut [u8], start: usize, offset: usize) -> Result<(), WireError> {
    let len = packet.len();
    let at = start.checked_add(offset).filter(|&a| a.checked_add(2).is_some_and(|e| e <= len));
    let Some(at) = at else {
        return Err(WireError::ChecksumOutOfRange { start, offset, len });
    };
    let c = checksum(&packet[start..], 0);
    let c = if c == 0 { 0xffff } else { c };
    packet[at..at + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift so the test needs no dependency.
    fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    #[test]
    fn fast_sum_equals_reference_every_length_and_alignment() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut backing = vec![0u8; 2000 + 64];
        for len in 0..2000usize {
            for _ in 0..3 {
                for b in backing.iter_mut() {
                    *b = rng(&mut seed) as u8;
                }
                let align = (rng(&mut seed) % 64) as usize;
                let init = rng(&mut seed) as u32;
                let data = &backing[align..align + len];
                assert_eq!(sum(data, init), sum_reference(data, init), "len {len} align {align}");
            }
        }
        // Saturated input: all 0xff.
        let ones = vec![0xffu8; 70000];
        for len in [0, 1, 2, 31, 32, 33, 65535, 70000] {
            assert_eq!(sum(&ones[..len], 0xffff_ffff), sum_reference(&ones[..len], 0xffff_ffff));
        }
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&d, 0)), 0xddf2);
        assert_eq!(checksum(&d, 0), !0xddf2);
    }

    #[test]
    fn combine_odd_split() {
        let d: Vec<u8> = (0..101u32).map(|i| (i * 7 + 3) as u8).collect();
        for cut in 0..d.len() {
            let a = sum(&d[..cut], 0);
            let b = sum(&d[cut..], 0);
            assert_eq!(fold(combine(a, b, cut)), fold(sum(&d, 0)), "cut {cut}");
        }
    }

    /// 0x0000 and 0xffff are the two one's-complement zeros.
    fn same(a: u16, b: u16) -> bool {
        a == b || (a == 0 && b == 0xffff) || (a == 0xffff && b == 0)
    }

    #[test]
    fn incremental_matches_recompute() {
        let mut seed = 99u64;
        for _ in 0..1000 {
            let mut d = [0u8; 20];
            for b in d.iter_mut() {
                *b = rng(&mut seed) as u8;
            }
            let c = checksum(&d, 0);
            let old = u16::from_be_bytes([d[4], d[5]]);
            let new = rng(&mut seed) as u16;
            d[4..6].copy_from_slice(&new.to_be_bytes());
            let c2 = checksum(&d, 0);
            assert!(same(update16(c, old, new), c2));
            let old32 = u32::from_be_bytes([d[8], d[9], d[10], d[11]]);
            let new32 = rng(&mut seed) as u32;
            d[8..12].copy_from_slice(&new32.to_be_bytes());
            let c3 = checksum(&d, 0);
            assert!(same(update32(c2, old32, new32), c3));
            let o = d[12..16].to_vec();
            let n = [1u8, 2, 3, 4];
            d[12..16].copy_from_slice(&n);
            assert!(same(update_bytes(c3, &o, &n).unwrap(), checksum(&d, 0)));
        }
        assert_eq!(update_bytes(0, &[1], &[2]), None);
    }

    #[test]
    fn pseudo_headers() {
        // 192.0.2.1 -> 198.51.100.2, TCP, 20 bytes.
        let p = pseudo_header_v4([192, 0, 2, 1], [198, 51, 100, 2], 6, 20);
        let mut raw = vec![192, 0, 2, 1, 198, 51, 100, 2, 0, 6, 0, 20];
        assert_eq!(p, sum_reference(&raw, 0));
        let src: [u8; 16] = std::array::from_fn(|i| i as u8);
        let dst: [u8; 16] = std::array::from_fn(|i| 0xf0 | i as u8);
        let p6 = pseudo_header_v6(src, dst, 17, 70000);
        raw.clear();
        raw.extend_from_slice(&src);
        raw.extend_from_slice(&dst);
        raw.extend_from_slice(&70000u32.to_be_bytes());
        raw.extend_from_slice(&[0, 0, 0, 17]);
        assert_eq!(p6, sum_reference(&raw, 0));
        assert_eq!(
            pseudo_header_v4(std::net::Ipv4Addr::new(10, 0, 0, 1).octets(), [10, 0, 0, 2], 17, 8),
            sum_reference(&[10, 0, 0, 1, 10, 0, 0, 2, 0, 17, 0, 8], 0)
        );
    }

    #[test]
    fn complete_partial_bounds_and_value() {
        let mut pkt = [0u8; 28];
        pkt[0..4].copy_from_slice(&[1, 2, 3, 4]);
        pkt[8..12].copy_from_slice(&[0xab, 0xcd, 0x00, 0x10]);
        let ph = pseudo_header_v4([10, 0, 0, 1], [10, 0, 0, 2], 17, 20);
        pkt[8 + 6..8 + 8].copy_from_slice(&fold(ph).to_be_bytes());
        complete_partial(&mut pkt, 8, 6).unwrap();
        assert_eq!(fold(sum(&pkt[8..], ph)), 0xffff);
        assert!(complete_partial(&mut pkt, 27, 0).is_err());
        assert!(complete_partial(&mut pkt, 26, 0).is_ok());
        assert!(complete_partial(&mut pkt, usize::MAX, 1).is_err());
        assert!(complete_partial(&mut pkt, 1, usize::MAX).is_err());
        assert!(complete_partial(&mut [], 0, 0).is_err());
    }
}

#[cfg(test)]
mod copy_and_sum_tests {
    use super::*;

    /// The fused copy returns exactly what `sum` returns and copies every byte, for every length and alignment.
    #[test]
    fn test_copy_and_sum_equals_copy_then_sum() {
        let mut x: u32 = 0x1234_5678;
        let src: Vec<u8> = (0..2100)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        for start in 0..4 {
            for len in 0..2000 {
                let s = &src[start..start + len];
                let mut dst = vec![0xAAu8; len + 3];
                let got = copy_and_sum(&mut dst, s, 0x1_2345);
                assert_eq!(got, sum(s, 0x1_2345), "len {len} start {start}");
                assert_eq!(&dst[..len], s, "len {len} start {start}");
                assert!(dst[len..].iter().all(|&b| b == 0xAA), "nothing written past the source");
            }
        }
        let mut short = [0u8; 3];
        assert_eq!(copy_and_sum(&mut short, &src[..10], 0), sum(&src[..3], 0), "copies the shorter length");
    }
}
