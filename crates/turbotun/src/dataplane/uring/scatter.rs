//! The scattered read of offload through io_uring: one read in flight over spare slots, laid out by the shape of
//! the last super-packet so that each segment's payload lands in its own slot behind room for its headers. The
//! layout, the zero-copy split and the join of a frame of another shape are `turbotun_wire::scatter`'s, the
//! same as the blocking path's; what is here is only which slot holds which piece.

use std::ops::Range;

use turbotun_wire::scatter::{Placement, ScatterShape};
use turbotun_wire::virtio_net::VirtioNetHdrRepr;
use turbotun_wire::Batch;

use super::offload::{ReadMode, UringOffload};
use super::OFFSET;
use crate::dataplane::stats::DropReason;
use crate::devices::queue::MAX_PACKET;
use crate::error::Result;

impl UringOffload {
    /// Queues the next read (submitted by the next round's `io_uring_enter`) once the last one was handled,
    /// laid out by the prediction if there is one and enough spares are free.
    pub(super) fn plan_read(&mut self) -> Result<()> {
        let ReadMode::Scattered(sc) = &mut self.read else { return Ok(()) };
        if self.ring.readv_in_flight() > 0
            || !self.rx.is_empty()
            || self.splitting.is_some()
            || !self.ready_segments.is_empty()
        {
            return Ok(());
        }
        let mut plan = std::mem::take(&mut sc.plan);
        plan.clear();
        let k = self.batch_max.min(crate::sys::MAX_SCATTER - 2).min(self.spares.len().saturating_sub(1));
        let stride = self.ring.stride();
        match sc.predicted {
            Some(shape) if k >= 2 && OFFSET + shape.buffer_len() <= stride => {
                // No more segment slots than the largest frame of this shape can fill.
                let k = k.min(MAX_PACKET.saturating_sub(shape.hdr_len).div_ceil(shape.gso_size)).max(2);
                let shape = shape.with_segments(k);
                for i in 0..k {
                    let slot = self.spares.pop().unwrap_or_default();
                    let piece = shape.piece(i);
                    // The first slot also takes the virtio header, in front of the packet.
                    let start = if i == 0 { 0 } else { OFFSET + piece.start };
                    plan.push((slot, start..OFFSET + piece.end));
                }
                let overflow = self.spares.pop().unwrap_or_default();
                plan.push((overflow, OFFSET..stride));
                sc.shape_in_flight = Some(shape);
            }
            _ => {
                let Some(slot) = self.spares.pop() else {
                    // Every spare is being written: the next round, after their completions.
                    sc.plan = plan;
                    return Ok(());
                };
                plan.push((slot, 0..stride));
                sc.shape_in_flight = None;
            }
        }
        let queued = self.ring.readv_into(&plan);
        if queued.is_err() {
            self.spares.extend(plan.iter().map(|(slot, _)| *slot));
            plan.clear();
        }
        sc.plan = plan;
        queued.map_err(|e| self.ring_error(e))
    }

    /// A scattered read of `n` bytes completed: its frame goes into the receive ring as one slot holding the
    /// virtio header and the whole frame, or, when it is the predicted super-packet, becomes segments whose
    /// payload is already in place (only their headers are written).
    pub(super) fn scattered_read(&mut self, n: usize) -> Result<()> {
        let ReadMode::Scattered(sc) = &mut self.read else { return Ok(()) };
        let plan = std::mem::take(&mut sc.plan);
        let shape = sc.shape_in_flight.take();
        let result = self.place_scattered(n, &plan, shape);
        if let ReadMode::Scattered(sc) = &mut self.read {
            sc.plan = plan;
            sc.plan.clear();
        }
        result
    }

    fn place_scattered(&mut self, n: usize, plan: &[(u32, Range<usize>)], shape: Option<ScatterShape>) -> Result<()> {
        // What the read's pieces hold together; with a shape the overflow slot also has room for the segments'
        // part when a frame of another shape is joined in it (its capacity bounds the whole frame).
        let capacity = match shape {
            None => plan.iter().map(|(_, r)| r.len()).sum(),
            Some(_) => self.ring.stride(),
        };
        let len = match crate::dataplane::batch::frame_len(n, OFFSET, capacity) {
            Ok(len) if !plan.is_empty() => len,
            // No plan means no read was queued: nothing to place (cannot happen), counted all the same.
            Ok(_) => {
                self.stats.drops.add(DropReason::Malformed, 1);
                return Ok(());
            }
            Err(reason) => {
                self.stats.drops.add(reason, 1);
                self.spares.extend(plan.iter().map(|(s, _)| *s));
                return Ok(());
            }
        };
        let Some(shape) = shape else {
            // One slot holds the header and the whole frame: as the multishot read leaves it.
            if self.rx.push(crate::dataplane::ring::Slot { index: plan[0].0, len: n as u32 }).is_err() {
                self.stats.drops.add(DropReason::Malformed, 1);
                self.spares.extend(plan.iter().map(|(s, _)| *s));
            }
            return Ok(());
        };
        if self.split_in_place(len, plan, shape)? {
            return Ok(());
        }
        // Not the predicted shape: joined into the overflow slot (virtio header and frame) and taken from the
        // receive ring like any other frame.
        let k = shape.segments;
        let overflow = plan[k].0;
        self.slot_ids.clear();
        self.slot_ids.extend(plan.iter().map(|(s, _)| *s));
        let mut bufs =
            self.ring.slots_mut(&self.slot_ids).map_err(|e| super::ring_error(&self.src_name, &self.dst_name, e))?;
        let (segments, rest) = bufs.split_at_mut(k);
        let over = &mut rest[0];
        let joined = shape.join(segments, OFFSET, len, &mut over[OFFSET..]);
        over[..OFFSET].copy_from_slice(&segments[0][..OFFSET]);
        drop(bufs);
        self.spares.extend(plan[..k].iter().map(|(s, _)| *s));
        if !joined || self.rx.push(crate::dataplane::ring::Slot { index: overflow, len: n as u32 }).is_err() {
            self.stats.drops.add(DropReason::Malformed, 1);
            self.spares.push(overflow);
        }
        Ok(())
    }

    /// The predicted super-packet (or a packet that fits the first slot): each segment's payload already sits
    /// in its own slot; only the headers are written. False if the frame has another shape.
    fn split_in_place(&mut self, len: usize, plan: &[(u32, Range<usize>)], shape: ScatterShape) -> Result<bool> {
        // The header alone decides; the segment slots are borrowed only for a split.
        let Some(Ok(hdr)) = self.ring.slot(plan[0].0 as usize).map(|b| VirtioNetHdrRepr::parse(&b[..OFFSET])) else {
            return Ok(false);
        };
        match shape.placement(&hdr, len) {
            Placement::Whole => {
                // Delivered where it is, as a multishot read leaves it.
                if self.rx.push(crate::dataplane::ring::Slot { index: plan[0].0, len: (OFFSET + len) as u32 }).is_err()
                {
                    return Ok(false);
                }
                self.spares.extend(plan[1..].iter().map(|(s, _)| *s));
                Ok(true)
            }
            Placement::Segments => {
                let k = shape.segments;
                self.slot_ids.clear();
                self.slot_ids.extend(plan[..k].iter().map(|(s, _)| *s));
                let mut bufs = self
                    .ring
                    .slots_mut(&self.slot_ids)
                    .map_err(|e| super::ring_error(&self.src_name, &self.dst_name, e))?;
                let mut lens = [0usize; crate::sys::MAX_SCATTER];
                let split = shape.split_in_place(
                    &hdr,
                    len,
                    self.framing,
                    self.partial,
                    &mut Batch::new(&mut bufs, &mut lens, OFFSET),
                );
                drop(bufs);
                let Some((count, _)) = split else { return Ok(false) };
                self.ready_segments.extend(plan[..count].iter().zip(&lens).map(|((slot, _), &len)| (*slot, len)));
                self.spares.extend(plan[count..].iter().map(|(s, _)| *s));
                self.stats.super_packets += 1;
                self.stats.zero_copy_splits += 1;
                self.stats.segments += count as u64;
                Ok(true)
            }
            Placement::Join => Ok(false),
        }
    }
}
