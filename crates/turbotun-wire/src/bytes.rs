//! Big-endian fields of the header views: one place for the reads and writes every view makes (the virtio
//! header is little-endian and keeps its own).

use std::ops::Range;

/// The big-endian u16 at the start of `at` (callers have checked the length on construction).
#[inline]
pub(crate) fn be16(b: &[u8], at: Range<usize>) -> u16 {
    u16::from_be_bytes([b[at.start], b[at.start + 1]])
}

/// The big-endian u32 at the start of `at`.
#[inline]
pub(crate) fn be32(b: &[u8], at: Range<usize>) -> u32 {
    u32::from_be_bytes([b[at.start], b[at.start + 1], b[at.start + 2], b[at.start + 3]])
}

/// Writes `v` big-endian into the two bytes of `at`.
#[inline]
pub(crate) fn put_be16(b: &mut [u8], at: Range<usize>, v: u16) {
    b[at].copy_from_slice(&v.to_be_bytes())
}

/// Writes `v` big-endian into the four bytes of `at`.
#[inline]
pub(crate) fn put_be32(b: &mut [u8], at: Range<usize>, v: u32) {
    b[at].copy_from_slice(&v.to_be_bytes())
}
