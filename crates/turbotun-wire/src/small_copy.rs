//! Copies and comparisons of header-sized runs of bytes.
//!
//! A `copy_from_slice` whose length is only known at run time becomes a call to `memcpy`; for the 12 to 80 bytes
//! of a packet header the call costs more than the copy, and the forwarder makes one per segment (3 % of its
//! time in the profile). Two fixed-size moves that overlap in the middle cover every length between one size
//! and twice it, and compile to a handful of vector loads and stores. Comparing two such runs with `==` calls
//! `bcmp` for the same reason; [`same`] compares them the same way.

/// Copies `src` into `dst`, which must have the same length (as `copy_from_slice`, which panics otherwise).
#[inline(always)]
pub(crate) fn copy(dst: &mut [u8], src: &[u8]) {
    let n = dst.len();
    assert_eq!(n, src.len(), "small_copy::copy: lengths differ");
    macro_rules! two {
        ($w:literal) => {{
            dst[..$w].copy_from_slice(&src[..$w]);
            dst[n - $w..].copy_from_slice(&src[n - $w..]);
        }};
    }
    match n {
        4..=8 => two!(4),
        9..=16 => two!(8),
        17..=32 => two!(16),
        33..=64 => two!(32),
        65..=128 => two!(64),
        _ => dst.copy_from_slice(src),
    }
}

/// Whether `a` and `b` (of the same length, at most a few dozen bytes: TCP options, IPv6 extension headers,
/// a layer-2 header) are equal; `false` when the lengths differ.
#[inline(always)]
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    macro_rules! two {
        ($w:literal) => {{
            a[..$w] == b[..$w] && a[n - $w..] == b[n - $w..]
        }};
    }
    match n {
        0 => true,
        4..=8 => two!(4),
        9..=16 => two!(8),
        17..=32 => two!(16),
        33..=64 => two!(32),
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn equals_copy_from_slice_for_every_length() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for n in 0..=300 {
            let mut a = vec![0xeeu8; n];
            super::copy(&mut a, &src[..n]);
            assert_eq!(a, src[..n], "length {n}");
        }
    }

    #[test]
    fn same_equals_eq_for_every_length_and_every_differing_byte() {
        let a: Vec<u8> = (0..100u32).map(|i| (i * 13 + 1) as u8).collect();
        for n in 0..=100 {
            assert!(super::same(&a[..n], &a[..n]), "length {n}");
            for at in 0..n {
                let mut b = a[..n].to_vec();
                b[at] ^= 0x10;
                assert!(!super::same(&a[..n], &b), "length {n}, byte {at}");
            }
        }
        assert!(!super::same(&a[..4], &a[..5]));
    }
}
