//! [`Batch`]: the packets of one batch call, in the caller's buffers.

use std::ops::Range;

/// The packets of one batch call, in the caller's buffers: packet `i` is `bufs[i][offset .. offset + lens[i]]`,
/// and the `offset` bytes in front of each leave room for its virtio header. Every batch step takes its packets
/// this way (a read split into the buffers, a batch coalesced, its write units written); the three travel as one
/// value so that a function says "the batch" instead of three arguments that must agree.
///
/// A batch holds as many packets as it has buffers with a length slot each ([`Self::capacity`]).
#[derive(Debug)]
pub struct Batch<'a, B> {
    /// The buffers, one packet each.
    pub bufs: &'a mut [B],
    /// The length of each packet (after `offset`).
    pub lens: &'a mut [usize],
    /// Where every packet starts in its buffer.
    pub offset: usize,
}

impl<'a, B> Batch<'a, B> {
    /// The batch of `bufs` and `lens`, packets at `offset`.
    pub fn new(bufs: &'a mut [B], lens: &'a mut [usize], offset: usize) -> Self {
        Batch { bufs, lens, offset }
    }

    /// How many packets it holds at most: the buffers that have a length slot.
    pub fn capacity(&self) -> usize {
        self.bufs.len().min(self.lens.len())
    }

    /// Packets `range` of this batch as a batch of their own, at the same offset (packet 0 of the result is
    /// packet `range.start` of this one).
    ///
    /// # Panics
    /// If `range` reaches past [`Self::capacity`], as slicing does.
    pub fn range(&mut self, range: Range<usize>) -> Batch<'_, B> {
        Batch { bufs: &mut self.bufs[range.clone()], lens: &mut self.lens[range], offset: self.offset }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_range_is_the_same_packets() {
        let mut bufs = vec![vec![0u8; 8]; 4];
        let mut lens = vec![1, 2, 3];
        let mut batch = Batch::new(&mut bufs, &mut lens, 2);
        assert_eq!(batch.capacity(), 3, "one packet per buffer with a length slot");
        let tail = batch.range(1..3);
        assert_eq!((tail.capacity(), tail.offset, &tail.lens[..]), (2, 2, &[2, 3][..]));
        tail.bufs[0][tail.offset] = 7;
        tail.lens[1] = 5;
        assert_eq!((bufs[1][2], lens[2]), (7, 5), "a range borrows the batch's own buffers");
    }
}
