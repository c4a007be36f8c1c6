//! Forwarding frames between two queues through io_uring: many reads in flight, and one system call both
//! submits the writes of what arrived and waits for the next frames.
//!
//! A synchronous forwarder makes at least two system calls per frame (a read and a write); here one multishot
//! read waits in the kernel (armed on the tun fd's wait queue, no helper threads: the tun driver honours
//! `IOCB_NOWAIT`) and reads frame after frame into a ring of `depth` provided buffers, and each
//! `io_uring_enter` hands over every write that is ready while it collects the next completions. Frames move as they are (the virtio header too, if the queues have one): this is the
//! plain and passthrough forwarding path, and a slot is never copied: the buffer a frame was read into is the
//! one it is written from (netmap-style forwarding by buffer, no allocation per frame).
//!
//! Order: frames leave in the order they were read (one read request posts its completions in order, writes
//! are submitted in completion order, and a tun write does not wait); a write the kernel refuses for want of socket buffer (`EAGAIN`, only with a limited
//! `TUNSETSNDBUF`) is retried and may then be overtaken by later frames.

use std::os::fd::AsFd;
use std::time::Duration;

use turbotun_wire::virtio_net::VirtioNetHdr;

use crate::error::{queue_io_error, Error, Result};
use crate::queue::{Queue, MAX_PACKET};
use crate::stats::{Counters, DropReason, WhenFull};
use crate::sys::uring::{Completion, ForwardRing, Op};
use crate::write_policy::{on_write_error, WriteFailure};

/// Whether this kernel can run a [`UringForwarder`] (io_uring with multishot reads, Linux 6.7); probed once.
/// The error says what is missing, so that a caller can fall back to blocking reads and say why.
pub fn supported() -> Result<()> {
    static PROBED: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    PROBED
        .get_or_init(|| crate::sys::uring::probe_forward_ring().map_err(|e| e.to_string()))
        .clone()
        .map_err(|why| Error::io("io_uring forwarding", std::io::Error::new(std::io::ErrorKind::Unsupported, why)))
}

/// One direction, `src` to `dst`, over a ring of its own.
#[derive(Debug)]
pub struct UringForwarder {
    ring: ForwardRing,
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
            return Err(Error::InvalidConfig(format!(
                "{} has a {}-byte virtio header and {} a {}-byte one: frames cannot be forwarded as they are",
                src.name(),
                src.vnet_hdr_len(),
                dst.name(),
                dst.vnet_hdr_len()
            )));
        }
        let stride = src.vnet_hdr_len() + MAX_PACKET;
        let ring = ForwardRing::new(src.as_fd(), dst.as_fd(), depth, stride)
            .map_err(|e| Error::io(format!("setting up io_uring for {} -> {}", src.name(), dst.name()), e))?;
        Ok(UringForwarder {
            ring,
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
        match first_error {
            Some(e) => Err(e),
            None => Ok(ready && !self.completions.is_empty()),
        }
    }

    /// Waits up to `timeout` for the writes already submitted to complete (reads that complete meanwhile are
    /// written too), so that a forwarder that stops counts what it read as written or dropped. Returns how many
    /// writes are still in flight.
    pub fn drain(&mut self, timeout: Duration) -> Result<usize> {
        let deadline = std::time::Instant::now() + timeout;
        while self.ring.writes_in_flight() > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            self.poll(left)?;
        }
        Ok(self.ring.writes_in_flight())
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
                if n == 0 || n > self.ring.stride() {
                    // Nothing, or a frame the buffer could not hold (the kernel reports its full length): dropped.
                    if n > 0 {
                        self.stats.drops.add(DropReason::TooBig, 1);
                    }
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
                self.ring.write_from(slot, n).map_err(|e| self.ring_error(e))
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
                self.ring.recycle(slot).map_err(|e| self.ring_error(e))
            }
            // Frames move as they came: a refusal of a super-packet is not one we built, so never re-split.
            (Op::Write, Err(errno)) => match on_write_error(Some(errno), false, self.when_full) {
                // Backpressure, not a drop: the same frame is written again.
                WriteFailure::WaitWritable | WriteFailure::Retry => {
                    self.ring.write_from(slot, self.lens[slot]).map_err(|e| self.ring_error(e))
                }
                WriteFailure::Drop(reason) => {
                    self.stats.drops.add(reason, 1);
                    self.ring.recycle(slot).map_err(|e| self.ring_error(e))
                }
                WriteFailure::Resplit | WriteFailure::Fatal => {
                    self.ring.recycle(slot).map_err(|e| self.ring_error(e))?;
                    Err(queue_io_error(&self.dst_name, "write", std::io::Error::from_raw_os_error(errno)))
                }
            },
        }
    }

    fn ring_error(&self, e: std::io::Error) -> Error {
        Error::io(format!("io_uring {} -> {}", self.src_name, self.dst_name), e)
    }
}
