//! A batch of packets handed to [`Transform::seal_batch`](super::Transform::seal_batch): each in the tunnel's own
//! buffer, with the room the transform asked for ([`Room`]) in front and behind, so that a protocol that wraps a
//! packet (a header in front, padding and a tag behind) seals it where it was read, with no copy.

use turbotun_wire::Batch;

use super::Sealed;

/// Room a transform needs around each packet to seal it where the tunnel read it ([`super::Transform::seal_room`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Room {
    /// Bytes in front of the packet (WireGuard: its 16-byte message header).
    pub front: usize,
    /// Bytes behind it (WireGuard: up to 15 bytes of padding and the 16-byte tag).
    pub back: usize,
}

/// One packet of a [`SealBatch`] with its room: `buf` is `[front room][packet][back room]`.
#[derive(Debug)]
pub struct PacketRoom<'a> {
    /// The packet and the room around it.
    pub buf: &'a mut [u8],
    /// Where the packet starts in `buf` (the front room's length).
    pub start: usize,
    /// The packet's length.
    pub len: usize,
}

impl PacketRoom<'_> {
    /// The packet alone.
    pub fn packet(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// Buffers of their own for packets sealed with [`super::Transform::seal`] (what the default
/// [`super::Transform::seal_batch`] does): one per packet of a batch, `size` bytes each, allocated on first use, so
/// that a transform that seals in place never has them.
#[derive(Debug, Default)]
pub struct SealOut {
    arena: Vec<u8>,
    size: usize,
    count: usize,
}

impl SealOut {
    /// Room for `count` packets of `size` bytes (0: a transform whose `seal` never writes a buffer of its own).
    pub fn new(size: usize, count: usize) -> Self {
        SealOut { arena: Vec::new(), size, count }
    }

    /// Buffer `i` (empty past `count`, or with `size` 0).
    fn get_mut(&mut self, i: usize) -> &mut [u8] {
        if self.size == 0 || i >= self.count {
            return &mut [];
        }
        if self.arena.is_empty() {
            // Large enough to be mapped: its pages become resident only as packets reach them.
            self.arena = vec![0u8; self.size * self.count];
        }
        &mut self.arena[i * self.size..(i + 1) * self.size]
    }

    /// What buffer `i` holds (empty if it was never used).
    pub(super) fn get(&self, i: usize) -> &[u8] {
        self.arena.get(i * self.size..(i + 1) * self.size).unwrap_or_default()
    }
}

/// The packets of one batch read from the device, in order, for [`super::Transform::seal_batch`]: packet `i` is
/// `bufs[i][offset..offset + lens[i]]`, with [`Self::room`] around it; the transform answers each with
/// [`Self::set`].
#[derive(Debug)]
pub struct SealBatch<'a, 'b> {
    bufs: &'a mut [&'b mut [u8]],
    lens: &'a [usize],
    offset: usize,
    room: Room,
    out: &'a mut SealOut,
    sealed: &'a mut [Sealed],
}

impl<'a, 'b> SealBatch<'a, 'b> {
    /// The packets of `batch`, each with `room` around it (where its buffer has it), their answers into `sealed`
    /// (one per packet; what it holds beforehand is the answer for a packet the transform does not answer), and
    /// `out` for packets sealed into buffers of their own.
    pub fn new(batch: Batch<'a, &'b mut [u8]>, room: Room, out: &'a mut SealOut, sealed: &'a mut [Sealed]) -> Self {
        let n = batch.capacity().min(sealed.len());
        let Batch { bufs, lens, offset } = batch;
        SealBatch { bufs: &mut bufs[..n], lens: &lens[..n], offset, room, out, sealed: &mut sealed[..n] }
    }

    /// How many packets.
    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// The room each packet has around it (at least what the transform asked for, when the tunnel sized the
    /// buffers).
    pub fn room_size(&self) -> Room {
        self.room
    }

    /// Packet `i` (empty for a buffer shorter than its length).
    ///
    /// # Panics
    /// If `i >= self.len()`, as indexing does.
    pub fn packet(&self, i: usize) -> &[u8] {
        self.bufs[i].get(self.offset..self.offset + self.lens[i]).unwrap_or_default()
    }

    /// Packet `i`, to change in place.
    ///
    /// # Panics
    /// If `i >= self.len()`, as indexing does.
    pub fn packet_mut(&mut self, i: usize) -> &mut [u8] {
        self.bufs[i].get_mut(self.offset..self.offset + self.lens[i]).unwrap_or_default()
    }

    /// Packet `i` with its room, `None` if its buffer does not have that much room.
    ///
    /// # Panics
    /// If `i >= self.len()`, as indexing does.
    pub fn room(&mut self, i: usize) -> Option<PacketRoom<'_>> {
        let (from, len) = (self.offset.checked_sub(self.room.front)?, self.lens[i]);
        let to = self.offset.checked_add(len)?.checked_add(self.room.back)?;
        let buf = self.bufs[i].get_mut(from..to)?;
        Some(PacketRoom { buf, start: self.room.front, len })
    }

    /// Packet `i` and a buffer of its own to seal it into ([`super::Transform::seal`]'s arguments).
    ///
    /// # Panics
    /// If `i >= self.len()`, as indexing does.
    pub fn packet_and_out(&mut self, i: usize) -> (&mut [u8], &mut [u8]) {
        let packet = self.bufs[i].get_mut(self.offset..self.offset + self.lens[i]).unwrap_or_default();
        (packet, self.out.get_mut(i))
    }

    /// Answers packet `i`: [`Sealed::Grown`] positions are in [`Self::room`]'s buffer, [`Sealed::Out`] in
    /// [`Self::packet_and_out`]'s.
    ///
    /// # Panics
    /// If `i >= self.len()`, as indexing does.
    pub fn set(&mut self, i: usize, sealed: Sealed) {
        self.sealed[i] = sealed;
    }

    /// The answer given for packet `i` so far.
    ///
    /// # Panics
    /// If `i >= self.len()`, as indexing does.
    pub fn answer(&self, i: usize) -> Sealed {
        self.sealed[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::stats::DropReason;
    use std::net::SocketAddr;

    #[test]
    fn test_each_packet_has_its_room_and_a_buffer_too_short_has_none() {
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 20];
        a[8..12].copy_from_slice(b"abcd");
        let mut bufs: Vec<&mut [u8]> = vec![&mut a, &mut b];
        let mut lens = [4, 8];
        let mut out = SealOut::new(0, 2);
        let mut sealed = [Sealed::Held; 2];
        let mut batch =
            SealBatch::new(Batch::new(&mut bufs, &mut lens, 8), Room { front: 4, back: 6 }, &mut out, &mut sealed);
        assert_eq!((batch.len(), batch.packet(0)), (2, &b"abcd"[..]));
        let room = batch.room(0).expect("room around packet 0");
        assert_eq!((room.buf.len(), room.start, room.len), (4 + 4 + 6, 4, 4));
        assert_eq!(&room.buf[4..8], b"abcd");
        assert!(batch.room(1).is_none(), "8 + 8 + 6 does not fit 20 bytes");
        assert!(batch.packet_and_out(0).1.is_empty(), "no buffers of their own at size 0");
        let to: SocketAddr = "192.0.2.1:1".parse().unwrap();
        batch.set(1, Sealed::Dropped(DropReason::TooBig));
        batch.set(0, Sealed::Grown { start: 0, len: 14, to });
        assert_eq!(sealed, [Sealed::Grown { start: 0, len: 14, to }, Sealed::Dropped(DropReason::TooBig)]);
    }

    #[test]
    fn test_buffers_of_their_own_are_made_on_first_use() {
        let mut out = SealOut::new(100, 3);
        assert!(out.get(0).is_empty(), "nothing allocated before use");
        assert_eq!(out.get_mut(2).len(), 100);
        out.get_mut(1)[0] = 7;
        assert_eq!((out.get(1)[0], out.get(2).len()), (7, 100));
        assert!(out.get_mut(3).is_empty() && out.get(3).is_empty(), "past the batch");
    }
}
