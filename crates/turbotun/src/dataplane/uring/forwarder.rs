//! Plain and passthrough forwarding through io_uring: one multishot read over a ring of provided slots, each
//! frame written from the slot it was read into.

use std::os::fd::AsFd;
use std::time::Duration;

use turbotun_wire::virtio_net::VirtioNetHdr;

use crate::dataplane::stats::{Counters, DropReason, WhenFull};
use crate::dataplane::write_policy::{on_write_error, WriteFailure};
use crate::devices::queue::{Queue, MAX_PACKET};
use crate::error::{queue_io_error, ConfigError, Error, Result};
use crate::sys::uring::{Completion, ForwardRing, Op};

/// One direction, `src` to `dst`, over a ring of its own.
#[derive(Debug)]
pub struct UringForwarder {
    ring: ForwardRing,
    /// Frames read, in read order (the kernel's side of the slot ring).
    rx: crate::dataplane::ring::SlotRing,
    /// Frames handed back for writing: their writes are in flight until completed and released in order.
    tx: crate::dataplane::ring::SlotRing,
    /// Per slot: its position in the transmit ring while it is being written.
    tx_pos: Vec<u32>,
    src_name: String,
    dst_name: String,
    vnet_hdr_len: usize,
    lens: Vec<usize>,
    completions: Vec<Completion>,
    stats: Counters,
    when_full: WhenFull,
}

impl UringForwarder {
    /// Default number of frames in flight per direction: in `turbotun bench` (plain, TCP) 64 used the least
    /// forwarder CPU per Gbps; 1 and 4 were slower than blocking reads, 256 lost to retransmits.
    pub const DEFAULT_DEPTH: usize = 64;

    /// A forwarder with `depth` slots (a power of two), each large enough for a super-packet and its virtio header (only the
    /// pages a frame touches become resident). Both queues must use the same virtio header size.
    pub fn new(src: &Queue, dst: &Queue, depth: usize) -> Result<Self> {
        if src.vnet_hdr_len() != dst.vnet_hdr_len() {
            return Err(Error::Config(ConfigError::VnetHdrSizesDiffer {
                a: src.name().to_string(),
                a_len: src.vnet_hdr_len(),
                b: dst.name().to_string(),
                b_len: dst.vnet_hdr_len(),
                needs: "frames cannot be forwarded as they are",
            }));
        }
        let stride = src.vnet_hdr_len() + MAX_PACKET;
        let ring = ForwardRing::new(src.as_fd(), dst.as_fd(), depth, stride)
            .map_err(|e| Error::io(format!("setting up io_uring for {} -> {}", src.name(), dst.name()), e))?;
        Ok(UringForwarder {
            ring,
            rx: crate::dataplane::ring::SlotRing::new(depth)?,
            tx: crate::dataplane::ring::SlotRing::new(depth)?,
            tx_pos: vec![0; depth],
            src_name: src.name().to_string(),
            dst_name: dst.name().to_string(),
            vnet_hdr_len: src.vnet_hdr_len(),
            lens: vec![0; depth],
            completions: Vec::with_capacity(depth),
            stats: Counters::default(),
            when_full: WhenFull::default(),
        })
    }

    /// What to do when the destination is full (default: write the frame again until it is taken).
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// What this forwarder moved (reads, packets = frames written, bytes, super-packets, drops by reason).
    pub fn stats(&self) -> Counters {
        self.stats
    }

    /// One round: submits what is queued, waits up to `timeout` for completions and handles them (a frame
    /// read is queued for writing, a slot written goes back to the kernel for reading). Returns false if nothing
    /// completed (timeout, or a signal interrupted the wait). A deleted device is [`Error::DeviceGone`].
    pub fn poll(&mut self, timeout: Duration) -> Result<bool> {
        self.poll_with(timeout, |_| {})
    }

    /// [`Self::poll`], handing every frame read to `per_frame` before it is written (the packet after its virtio
    /// header, if any; it may be rewritten in place, keeping its length and leaving its checksums right).
    pub fn poll_with(&mut self, timeout: Duration, mut per_frame: impl FnMut(&mut [u8])) -> Result<bool> {
        let ready = self.ring.submit_and_wait(timeout).map_err(|e| self.ring_error(e))?;
        self.completions.clear();
        self.ring.reap(&mut self.completions);
        // Every completion is handled (its slot written or recycled) even after an error, so that no slot is
        // stranded; the first error is returned at the end.
        let mut first_error = None;
        for i in 0..self.completions.len() {
            let Completion { slot, op, result } = self.completions[i];
            if let Err(e) = self.handle(op, slot, result) {
                first_error.get_or_insert(e);
            }
        }
        // Forwarding moves indices: every frame read goes from the receive ring to the transmit ring and is
        // written from the slot it was read into.
        while let Some((_, frame)) = self.rx.take() {
            self.rx.release();
            let slot = frame.index as usize;
            if let Some(bytes) = self.ring.slot_mut(slot) {
                per_frame(&mut bytes[self.vnet_hdr_len..frame.len as usize]);
            }
            let queued = match self.tx.push(frame) {
                Ok(()) => {
                    let (pos, _) = self.tx.take().unwrap_or_default();
                    self.tx_pos[slot] = pos;
                    self.ring.write_from(slot, frame.len as usize).map_err(|e| self.ring_error(e))
                }
                // Cannot happen (the transmit ring has a place for every slot); dropped, never lost.
                Err(_) => {
                    self.stats.drops.add(DropReason::Malformed, 1);
                    self.ring.recycle(slot).map_err(|e| self.ring_error(e))
                }
            };
            if let Err(e) = queued {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(ready && !self.completions.is_empty()),
        }
    }

    /// Waits up to `timeout` for the writes already submitted to complete (reads that complete meanwhile are
    /// written too), so that a forwarder that stops counts what it read as written or dropped. Returns how many
    /// writes are still in flight.
    pub fn drain(&mut self, timeout: Duration) -> Result<usize> {
        super::until_written(timeout, |s: &mut Self| s.ring.writes_in_flight(), |s, left| s.poll(left), self)?;
        Ok(self.ring.writes_in_flight())
    }

    /// After a failure that ends the forwarder: the frames read whose writes are still in flight will never be
    /// seen through, and are counted as dropped for `reason`.
    pub fn abandon(&mut self, reason: DropReason) {
        let held = self.ring.writes_in_flight() + self.rx.len();
        self.stats.drops.add(reason, held as u64);
    }

    fn handle(&mut self, op: Op, slot: Option<usize>, result: std::result::Result<usize, i32>) -> Result<()> {
        let Some(slot) = slot else {
            // A read that ended without a buffer: EAGAIN/EINTR end the multishot read, which the next round arms
            // again; anything else is the device's error.
            return match result {
                Err(errno) if !matches!(errno, libc::EAGAIN | libc::EINTR) => {
                    Err(queue_io_error(&self.src_name, "read", std::io::Error::from_raw_os_error(errno)))
                }
                _ => Ok(()),
            };
        };
        match (op, result) {
            (Op::Read, Ok(n)) => {
                self.stats.reads += 1;
                if n == 0 {
                    return self.ring.recycle(slot).map_err(|e| self.ring_error(e));
                }
                if let Err(reason) = crate::dataplane::batch::frame_len(n, self.vnet_hdr_len, self.ring.stride()) {
                    self.stats.drops.add(reason, 1);
                    return self.ring.recycle(slot).map_err(|e| self.ring_error(e));
                }
                if self.vnet_hdr_len > 0
                    && n > self.vnet_hdr_len
                    && self.ring.slot(slot).is_some_and(|b| VirtioNetHdr::new_unchecked(b).is_gso())
                {
                    self.stats.super_packets += 1;
                }
                self.stats.segments += 1;
                self.lens[slot] = n;
                if let Err(frame) = self.rx.push(crate::dataplane::ring::Slot { index: slot as u32, len: n as u32 }) {
                    // Cannot happen (the receive ring has a place for every slot); dropped, never lost.
                    self.stats.drops.add(DropReason::Malformed, 1);
                    return self.ring.recycle(frame.index as usize).map_err(|e| self.ring_error(e));
                }
                Ok(())
            }
            (Op::Read, Err(errno)) => {
                self.ring.recycle(slot).map_err(|e| self.ring_error(e))?;
                if matches!(errno, libc::EAGAIN | libc::EINTR) {
                    return Ok(());
                }
                Err(queue_io_error(&self.src_name, "read", std::io::Error::from_raw_os_error(errno)))
            }
            (Op::Write, Ok(_)) => {
                self.stats.writes += 1;
                self.stats.packets += 1;
                self.stats.bytes += self.lens[slot].saturating_sub(self.vnet_hdr_len) as u64;
                self.written(slot)
            }
            // Frames move as they came: a refusal of a super-packet is not one we built, so never re-split.
            (Op::Write, Err(errno)) => match on_write_error(Some(errno), false, self.when_full) {
                // Backpressure, not a drop: the same frame is written again.
                WriteFailure::WaitWritable | WriteFailure::Retry => {
                    self.ring.write_from(slot, self.lens[slot]).map_err(|e| self.ring_error(e))
                }
                WriteFailure::Drop(reason) => {
                    self.stats.drops.add(reason, 1);
                    self.written(slot)
                }
                WriteFailure::Resplit | WriteFailure::Fatal => {
                    let err = queue_io_error(&self.dst_name, "write", std::io::Error::from_raw_os_error(errno));
                    self.stats.drops.add(crate::dataplane::write_policy::lost_with(&err), 1);
                    self.written(slot)?;
                    Err(err)
                }
            },
        }
    }

    /// A write finished (or its frame was dropped): the slot leaves the transmit ring, in ring order once every
    /// earlier write has finished too, and goes back to the kernel for reading.
    fn written(&mut self, slot: usize) -> Result<()> {
        self.tx.complete(self.tx_pos[slot]);
        while let Some(done) = self.tx.release_completed() {
            self.ring.recycle(done.index as usize).map_err(|e| self.ring_error(e))?;
        }
        Ok(())
    }

    fn ring_error(&self, e: std::io::Error) -> Error {
        super::ring_error(&self.src_name, &self.dst_name, e)
    }
}
