//! The zero-copy split, written once for every I/O path: a read is scattered so that each segment's payload
//! lands in its own buffer behind room for the segment's headers, laid out by the shape of the last
//! super-packet ([`ScatterShape`]); a frame of that shape then only needs its headers written
//! ([`ScatterShape::split_in_place`]), a packet that is no super-packet and fits the first buffer is used where
//! it is, and anything else is joined back into one contiguous frame ([`ScatterShape::join`]) and split by
//! copying.
//!
//! Positions are relative to where the packet starts in each buffer (`offset`: the blocking path keeps its
//! virtio header elsewhere, io_uring keeps it in front of the packet in the first slot).

use core::ops::Range;

use crate::gso::{Splitter, MAX_HEADER_LEN};
use crate::virtio_net::VirtioNetHdrRepr;
use crate::{Batch, Framing};

/// The shape a scattered read is laid out for: the header length and segment size of the last super-packet,
/// and how many segment buffers the read fills before the overflow buffer that takes the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScatterShape {
    /// Header bytes in front of each segment's payload (the super-packet's `hdr_len`).
    pub hdr_len: usize,
    /// Payload bytes per segment (`gso_size`).
    pub gso_size: usize,
    /// Segment buffers the read fills before the overflow buffer (at least 2).
    pub segments: usize,
}

/// What became of a scattered read (see [`ScatterShape::placement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Not a super-packet, and within the first buffer: it is used where the read put it.
    Whole,
    /// A super-packet that may be the predicted shape: try [`ScatterShape::split_in_place`].
    Segments,
    /// Anything else: [`ScatterShape::join`] it, then split by copying.
    Join,
}

impl ScatterShape {
    /// The shape of `splitter`'s super-packet laid over `segments` buffers; `None` for a packet that is not a
    /// super-packet, or fewer than two buffers.
    pub fn of(splitter: &Splitter<'_>, segments: usize) -> Option<Self> {
        (splitter.is_gso() && segments >= 2 && splitter.gso_size() > 0).then(|| ScatterShape {
            hdr_len: splitter.hdr_len(),
            gso_size: splitter.gso_size(),
            segments,
        })
    }

    /// The same shape over `segments` buffers.
    pub fn with_segments(self, segments: usize) -> Self {
        ScatterShape { segments, ..self }
    }

    /// Room each segment buffer needs behind the packet's offset.
    pub fn buffer_len(&self) -> usize {
        self.hdr_len + self.gso_size
    }

    /// Where the read puts its bytes in segment buffer `i`: the headers and the first payload in the first, each
    /// further payload behind room for the headers.
    pub fn piece(&self, i: usize) -> Range<usize> {
        let start = if i == 0 { 0 } else { self.hdr_len };
        start..self.buffer_len()
    }

    /// Packet bytes the segment buffers hold together; the rest of a longer frame is in the overflow buffer.
    pub fn in_segments(&self) -> usize {
        self.hdr_len + self.segments * self.gso_size
    }

    /// What a read of a `len`-byte frame with header `hdr` is, laid out this way.
    pub fn placement(&self, hdr: &VirtioNetHdrRepr, len: usize) -> Placement {
        if !hdr.is_gso() {
            if len <= self.buffer_len() {
                Placement::Whole
            } else {
                Placement::Join
            }
        } else if len >= self.hdr_len && len <= self.in_segments() {
            Placement::Segments
        } else {
            Placement::Join
        }
    }

    /// Writes each segment's headers in front of its payload, which the read already put in the batch's `bufs[i]`
    /// (at `offset`), and each segment's length into `lens[i]`. Returns the number of segments and whether their
    /// checksums were left partial (with `partial`; see [`Splitter::leave_checksums_partial`]); `None` (nothing
    /// written) if the frame is not of this shape, for [`Self::join`].
    pub fn split_in_place<B: AsMut<[u8]>>(
        &self,
        hdr: &VirtioNetHdrRepr,
        len: usize,
        framing: Framing,
        partial: bool,
        batch: &mut Batch<'_, B>,
    ) -> Option<(usize, bool)> {
        let Batch { bufs, lens, offset } = batch;
        let offset = *offset;
        let h = self.hdr_len;
        if h > MAX_HEADER_LEN || bufs.len() < self.segments {
            return None;
        }
        let mut template = [0u8; MAX_HEADER_LEN];
        let template = &mut template[..h];
        template.copy_from_slice(bufs[0].as_mut().get(offset..offset + h)?);
        let splitter = Splitter::from_head(hdr, template, len, framing).ok()?.leave_checksums_partial(partial);
        let count = splitter.segment_count();
        if splitter.gso_size() != self.gso_size || count == 0 || count > self.segments || count > lens.len() {
            return None;
        }
        for (i, (buf, slot)) in bufs.iter_mut().zip(lens.iter_mut()).take(count).enumerate() {
            let plen = splitter.segment_payload_len(i);
            let (front, back) = buf.as_mut().get_mut(offset..)?.split_at_mut(h);
            // Cannot fail for a validated splitter and room checked by the layout; if it did, the caller joins.
            splitter.write_header(i, back.get(..plen)?, front).ok()?;
            *slot = h + plen;
        }
        Some((count, splitter.checksums_left_partial()))
    }

    /// Joins a scattered frame of `len` bytes into `overflow[..len]`, where the read put the bytes past the
    /// segment buffers at the start of `overflow` (`bufs[i]` hold their pieces at `offset`). `overflow` must hold
    /// `len` bytes; false (nothing moved) otherwise.
    pub fn join<B: AsMut<[u8]>>(&self, bufs: &mut [B], offset: usize, len: usize, overflow: &mut [u8]) -> bool {
        let in_segments = self.in_segments().min(len);
        if overflow.len() < len || bufs.len() < self.segments {
            return false;
        }
        // What overflowed goes behind the part that was in the segment buffers.
        overflow.copy_within(..len - in_segments, in_segments);
        let mut at = 0;
        for (i, buf) in bufs.iter_mut().take(self.segments).enumerate() {
            if at >= in_segments {
                break;
            }
            let piece = self.piece(i);
            let n = piece.len().min(in_segments - at);
            let Some(src) = buf.as_mut().get(offset + piece.start..offset + piece.start + n) else { return false };
            overflow[at..at + n].copy_from_slice(src);
            at += n;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::{payload, Spec};
    use crate::partial::same_up_to_checksum_zero;

    /// A super-packet of `segments` x `gso` payload bytes (and `extra` more), scattered as `shape` lays a read out
    /// over buffers with the packet at `offset`, the rest in an overflow buffer: what a scattered read leaves.
    fn scattered(
        spec: &Spec,
        payload_len: usize,
        gso: u16,
        shape: ScatterShape,
        offset: usize,
    ) -> (VirtioNetHdrRepr, Vec<u8>, Vec<Vec<u8>>, Vec<u8>) {
        let (hdr, frame) = spec.build_gso(&payload(payload_len, 3), gso);
        let mut bufs = vec![vec![0u8; offset + shape.buffer_len()]; shape.segments];
        let mut at = 0;
        for (i, buf) in bufs.iter_mut().enumerate() {
            let piece = shape.piece(i);
            let n = piece.len().min(frame.len().saturating_sub(at));
            buf[offset + piece.start..offset + piece.start + n].copy_from_slice(&frame[at..at + n]);
            at += n;
        }
        let mut overflow = vec![0u8; 65_536];
        overflow[..frame.len() - at].copy_from_slice(&frame[at..]);
        (hdr, frame, bufs, overflow)
    }

    #[test]
    fn a_frame_of_the_shape_is_split_in_place_like_the_copying_split() {
        for (spec, offset) in [(Spec::tcp4(), 10), (Spec::tcp6(), 12), (Spec::udp4(), 0), (Spec::tcp4(), 24)] {
            let h = spec.hdr_len();
            let shape = ScatterShape { hdr_len: h, gso_size: 1000, segments: 8 };
            for payload_len in [1000, 1500, 7999, 8000] {
                let (hdr, frame, mut bufs, _) = scattered(&spec, payload_len, 1000, shape, offset);
                assert_eq!(shape.placement(&hdr, frame.len()), Placement::Segments);
                let mut lens = vec![0; 8];
                let (count, partial) = shape
                    .split_in_place(
                        &hdr,
                        frame.len(),
                        Framing::Ip,
                        false,
                        &mut Batch::new(&mut bufs, &mut lens, offset),
                    )
                    .expect("the predicted shape");
                assert!(!partial);
                let copied = spec.segments(&payload(payload_len, 3), 1000);
                assert_eq!(count, copied.len(), "{payload_len}");
                for (i, want) in copied.iter().enumerate() {
                    let got = &bufs[i][offset..offset + lens[i]];
                    assert!(same_up_to_checksum_zero(got, want, Framing::Ip), "{spec:?} {payload_len} segment {i}");
                }
            }
        }
    }

    #[test]
    fn anything_else_is_joined_back_whole() {
        let spec = Spec::tcp4();
        let shape = ScatterShape { hdr_len: spec.hdr_len(), gso_size: 1000, segments: 4 };
        // Another segment size, and more payload than the segment buffers hold.
        for (payload_len, gso) in [(3000, 800), (9000, 1000)] {
            let (hdr, frame, mut bufs, mut overflow) = scattered(&spec, payload_len, gso, shape, 10);
            let mut lens = vec![0; 4];
            let placed = shape.placement(&hdr, frame.len());
            if placed == Placement::Segments {
                let split = shape.split_in_place(
                    &hdr,
                    frame.len(),
                    Framing::Ip,
                    false,
                    &mut Batch::new(&mut bufs, &mut lens, 10),
                );
                assert!(split.is_none(), "another segment size is not the shape");
            } else {
                assert_eq!(placed, Placement::Join);
            }
            assert!(shape.join(&mut bufs, 10, frame.len(), &mut overflow));
            assert_eq!(&overflow[..frame.len()], &frame[..], "{payload_len}/{gso}");
        }
        // A packet that is no super-packet: whole if it fits the first buffer.
        let plain = VirtioNetHdrRepr::default();
        assert_eq!(shape.placement(&plain, shape.buffer_len()), Placement::Whole);
        assert_eq!(shape.placement(&plain, shape.buffer_len() + 1), Placement::Join);
        // Too little room: nothing moved, nothing panics.
        assert!(!shape.join(&mut [vec![0u8; 4]], 10, 5000, &mut [0u8; 100]));
    }

    #[test]
    fn the_pieces_tile_the_frame() {
        let shape = ScatterShape { hdr_len: 52, gso_size: 1448, segments: 3 };
        assert_eq!(shape.piece(0), 0..1500);
        assert_eq!(shape.piece(2), 52..1500);
        assert_eq!(shape.in_segments(), 52 + 3 * 1448);
        let total: usize = (0..3).map(|i| shape.piece(i).len()).sum();
        assert_eq!(total, shape.in_segments());
    }
}
