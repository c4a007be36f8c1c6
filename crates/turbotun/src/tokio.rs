//! The tokio front end: the same queues and the same batch core, awaited instead of blocked on, and nothing that
//! sleeps on a runtime thread.
//!
//! [`AsyncQueue`] registers one queue fd with tokio's reactor. [`AsyncRecvBatch`] and [`AsyncSendBatch`] are the
//! batch halves of [`crate::batch`] bound to it: reads wait for readability and then run the same receive code;
//! writes are issued at once, and only when the queue is full (a queue with a limited `TUNSETSNDBUF`) do they
//! wait, for writability, without blocking the thread.
//!
//! # Cancellation
//!
//! - [`AsyncQueue::recv`], [`AsyncQueue::recv_raw`] and [`AsyncRecvBatch::recv_many`] are cancellation safe: a
//!   read happens only inside the poll that completes the future, so a future dropped while it waits has read
//!   nothing, and segments of a super-packet left for later stay in the batch.
//! - [`AsyncSendBatch::send_many`] writes what the queue takes at once; if the queue is full it waits. A future
//!   dropped while it waits has written part of the batch: the packets it had not written are counted as dropped
//!   ([`DropReason::Stopped`](crate::DropReason)) in the batch's counters and the queue's `tx_dropped`, never lost
//!   silently, and the next call starts a new batch. [`AsyncQueue::send`] writes one packet or nothing.

use std::sync::Arc;

use ::tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use ::tokio::io::Interest;

use crate::batch::{Progress, Received, RecvHalf, SendHalf, Sent};
use crate::error::{Error, Result};
use crate::queue::Queue;
use crate::stats::{Counters, WhenFull};
use crate::stop::StopHandle;

/// A queue driven by tokio. Cheap to share (`Clone`): one task may read while another writes.
#[derive(Debug, Clone)]
pub struct AsyncQueue {
    inner: Arc<AsyncFd<Arc<Queue>>>,
}

/// Readiness of an [`AsyncQueue`] for reading or writing ([`AsyncQueue::readable`], [`AsyncQueue::writable`]),
/// kept until an operation finds the queue not ready after all.
#[derive(Debug)]
pub struct Ready<'a> {
    guard: AsyncFdReadyGuard<'a, Arc<Queue>>,
}

impl Ready<'_> {
    /// Forgets the readiness: the queue was found not ready after all (an operation done elsewhere would block).
    pub fn clear(&mut self) {
        self.guard.clear_ready_matching(self.guard.ready());
    }

    /// Runs `op` on the queue; if it would block, the readiness is cleared and `None` comes back (wait again).
    pub fn try_io<T>(&mut self, op: impl FnOnce(&Queue) -> Result<T>) -> Option<Result<T>> {
        match op(self.guard.get_inner()) {
            Err(e) if e.is_would_block() => {
                self.guard.clear_ready_matching(self.guard.ready());
                None
            }
            other => Some(other),
        }
    }
}

impl AsyncQueue {
    /// Switches the queue to non-blocking mode and registers it with the current tokio runtime.
    pub fn new(queue: Queue) -> Result<Self> {
        Self::from_shared(Arc::new(queue))
    }

    /// Like [`Self::new`] for a queue that other owners share (e.g. the forwarding engine's).
    pub fn from_shared(queue: Arc<Queue>) -> Result<Self> {
        queue.set_nonblocking(true)?;
        let fd =
            crate::sys::register_with_tokio(queue).map_err(|e| Error::io("registering the queue with tokio", e))?;
        Ok(AsyncQueue { inner: Arc::new(fd) })
    }

    /// The queue underneath, for the calls that never wait (stats, attach/detach, offloads).
    pub fn get_ref(&self) -> &Queue {
        self.inner.get_ref()
    }

    /// Waits until the queue is readable (error readiness counts: a deleted device shows only as an error, which
    /// the next read reports).
    pub async fn readable(&self) -> Result<Ready<'_>> {
        let guard = self
            .inner
            .ready(Interest::READABLE.add(Interest::ERROR))
            .await
            .map_err(|e| Error::io("waiting for the queue to be readable", e))?;
        Ok(Ready { guard })
    }

    /// Waits until the queue can take a write (a TUN/TAP queue is always writable unless its send buffer is
    /// limited with `TUNSETSNDBUF` and full).
    pub async fn writable(&self) -> Result<Ready<'_>> {
        let guard = self
            .inner
            .ready(Interest::WRITABLE.add(Interest::ERROR))
            .await
            .map_err(|e| Error::io("waiting for the queue to be writable", e))?;
        Ok(Ready { guard })
    }

    /// Reads one packet (see [`Queue::recv`]). Cancellation safe.
    pub async fn recv(&self, buf: &mut [u8]) -> Result<usize> {
        loop {
            if let Some(done) = self.readable().await?.try_io(|q| q.recv(buf)) {
                return done;
            }
        }
    }

    /// Reads exactly what the kernel delivers, virtio header included (see [`Queue::recv_raw`]). Cancellation
    /// safe.
    pub async fn recv_raw(&self, buf: &mut [u8]) -> Result<usize> {
        loop {
            if let Some(done) = self.readable().await?.try_io(|q| q.recv_raw(buf)) {
                return done;
            }
        }
    }

    /// Writes one packet (see [`Queue::send`]), waiting for room without blocking the thread when the queue is
    /// full. Cancellation safe: the packet is written whole or not at all.
    pub async fn send(&self, packet: &[u8]) -> Result<usize> {
        loop {
            if let Some(done) = self.writable().await?.try_io(|q| q.send(packet)) {
                return done;
            }
        }
    }

    /// The receive half of the batch API on this queue.
    pub fn recv_batch(&self) -> AsyncRecvBatch {
        AsyncRecvBatch { half: RecvHalf::new(self.get_ref()), queue: self.clone() }
    }

    /// The send half of the batch API on this queue.
    pub fn send_batch(&self) -> AsyncSendBatch {
        AsyncSendBatch { half: SendHalf::new(self.get_ref()), queue: self.clone() }
    }
}

/// [`crate::batch::RecvBatch`] on an [`AsyncQueue`]: the same split, reads awaited.
#[derive(Debug)]
pub struct AsyncRecvBatch {
    queue: AsyncQueue,
    half: RecvHalf,
}

impl AsyncRecvBatch {
    /// See [`crate::batch::RecvBatch::partial_checksums`].
    pub fn partial_checksums(mut self, on: bool) -> Self {
        self.half = self.half.partial_checksums(on);
        self
    }

    /// See [`crate::batch::RecvBatch::keep_udp_super_packets`].
    pub fn keep_udp_super_packets(mut self, on: bool) -> Self {
        self.half = self.half.keep_udp_super_packets(on);
        self
    }

    /// What this receive half has read.
    pub fn stats(&self) -> Counters {
        self.half.stats()
    }

    /// Segments read that the next call hands over without reading.
    pub fn pending(&self) -> usize {
        self.half.pending()
    }

    /// Fills `bufs` from as many reads as are ready once the queue is readable, splitting super-packets (see
    /// [`crate::batch::RecvBatch::try_recv_many`]). Cancellation safe.
    pub async fn recv_many<B: AsMut<[u8]>>(
        &mut self,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
    ) -> Result<Received> {
        loop {
            let half = &mut self.half;
            if let Some(done) = self.queue.readable().await?.try_io(|q| half.try_recv_many(q, bufs, lens, offset)) {
                return done;
            }
        }
    }
}

/// [`crate::batch::SendBatch`] on an [`AsyncQueue`]: the same coalescing, a full queue awaited.
#[derive(Debug)]
pub struct AsyncSendBatch {
    queue: AsyncQueue,
    half: SendHalf,
}

/// A batch being written by [`AsyncSendBatch::send_many`]: if the future is dropped before it is done, the
/// units not written are counted as stopped.
struct Writing<'a> {
    half: &'a mut SendHalf,
    queue: &'a AsyncQueue,
    lens: &'a [usize],
    offset: usize,
    next: usize,
    done: bool,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.half.abandon_units(self.queue.get_ref(), self.lens, self.offset, self.next);
        }
    }
}

impl AsyncSendBatch {
    /// What to do when the queue is full: wait for room (the default, awaited) or drop.
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.half = self.half.when_full(when_full);
        self
    }

    /// A re-split write waiting for room gives up once `stop` fires.
    pub fn stop_on(mut self, stop: StopHandle) -> Self {
        self.half = self.half.stop_on(stop);
        self
    }

    /// What this send half wrote.
    pub fn stats(&self) -> Counters {
        self.half.stats()
    }

    /// Which GRO kinds are on.
    pub fn gro_kinds(&self) -> (bool, bool) {
        self.half.gro_kinds()
    }

    /// Coalesces and writes a batch (see [`crate::batch::SendBatch::send_many`]); when the queue is full it
    /// waits for room without blocking the thread. See the module documentation for what a dropped future does.
    pub async fn send_many<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
        checksums: impl Into<turbotun_wire::Checksums>,
    ) -> Result<Sent> {
        let before = self.half.stats();
        let n = self.half.prepare(bufs, lens, offset, checksums.into())?;
        let (bufs, lens) = (&bufs[..n], &lens[..n]);
        let mut writing = Writing { half: &mut self.half, queue: &self.queue, lens, offset, next: 0, done: false };
        loop {
            let mut ready = writing.queue.writable().await?;
            let (queue, next) = (writing.queue.get_ref(), writing.next);
            match writing.half.write_units(queue, bufs, lens, offset, next, false) {
                Ok(Progress::Done) => break,
                Ok(Progress::Full(k)) => {
                    writing.next = k;
                    ready.clear();
                }
                Err(e) => {
                    // Counted by `write_units` already.
                    writing.done = true;
                    return Err(e);
                }
            }
        }
        writing.done = true;
        drop(writing);
        Ok(self.half.sent_since(&before))
    }
}
