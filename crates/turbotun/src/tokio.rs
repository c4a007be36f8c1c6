//! The tokio front end: the same queues and the same batch core, awaited instead of blocked on.
//!
//! [`AsyncQueue`] registers one queue fd with tokio's reactor. Reads wait for readiness and then run the same
//! [`RecvBatch`] code as the blocking API. Writes are issued directly: a TUN/TAP write does not block (the
//! device's send buffer is unlimited by default) and tokio reports a TUN fd writable only while its link is
//! up, so waiting for writability would hold packets back while the device is down instead of counting them as
//! dropped like the blocking API does.

use std::sync::Arc;

use ::tokio::io::unix::AsyncFd;

use crate::batch::{Received, RecvBatch, SendBatch, Sent};
use crate::error::{Error, Result};
use crate::queue::{is_would_block, Queue};

/// A queue driven by tokio. Cheap to share (`Clone`): one task may read while another writes.
#[derive(Debug, Clone)]
pub struct AsyncQueue {
    inner: Arc<AsyncFd<Arc<Queue>>>,
}

impl AsyncQueue {
    /// Switches the queue to non-blocking mode and registers it with the current tokio runtime.
    pub fn new(queue: Queue) -> Result<Self> {
        Self::from_shared(Arc::new(queue))
    }

    /// Like [`Self::new`] for a queue that other owners share (e.g. the forwarding engine's).
    pub fn from_shared(queue: Arc<Queue>) -> Result<Self> {
        queue.set_nonblocking(true)?;
        let fd = crate::sys::register_readable(queue).map_err(|e| Error::io("registering the queue with tokio", e))?;
        Ok(AsyncQueue { inner: Arc::new(fd) })
    }

    /// The queue underneath, for the blocking calls that never wait (send, stats, attach/detach).
    pub fn get_ref(&self) -> &Queue {
        self.inner.get_ref()
    }

    /// Reads one packet (see [`Queue::recv`]).
    pub async fn recv(&self, buf: &mut [u8]) -> Result<usize> {
        self.read_with(|q| q.recv(buf)).await
    }

    /// Reads exactly what the kernel delivers, virtio header included (see [`Queue::recv_raw`]).
    pub async fn recv_raw(&self, buf: &mut [u8]) -> Result<usize> {
        self.read_with(|q| q.recv_raw(buf)).await
    }

    /// Writes one packet (see [`Queue::send`]).
    pub fn send(&self, packet: &[u8]) -> Result<usize> {
        self.get_ref().send(packet)
    }

    /// Fills `bufs` from as many reads as are ready, splitting super-packets (see [`RecvBatch::recv_many`]).
    pub async fn recv_batch<B: AsMut<[u8]>>(
        &self,
        rx: &mut RecvBatch,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
    ) -> Result<Received> {
        self.read_with(|q| rx.try_recv_many(q, bufs, lens, offset)).await
    }

    /// Coalesces and writes a batch (see [`SendBatch::send`]).
    pub fn send_batch<B: AsMut<[u8]> + AsRef<[u8]>>(
        &self,
        tx: &mut SendBatch,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
        checksums: impl Into<turbotun_wire::Checksums>,
    ) -> Result<Sent> {
        tx.send(self.get_ref(), bufs, lens, offset, checksums)
    }

    /// Runs `op` when the fd is readable; a would-block result clears the readiness and waits again.
    async fn read_with<T>(&self, mut op: impl FnMut(&Queue) -> Result<T>) -> Result<T> {
        loop {
            // Error readiness wakes the read too: it is how a deleted device shows (the read then says so).
            let interest = ::tokio::io::Interest::READABLE.add(::tokio::io::Interest::ERROR);
            let mut guard = self.inner.ready(interest).await.map_err(|e| Error::io("waiting for readiness", e))?;
            match op(guard.get_inner().as_ref()) {
                Err(e) if is_would_block(&e) => guard.clear_ready_matching(guard.ready()),
                other => return other,
            }
        }
    }
}
