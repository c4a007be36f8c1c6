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
use turbotun_wire::Batch;

use crate::dataplane::batch::{Progress, Received, RecvHalf, SendHalf, Sent};
use crate::dataplane::stats::{Counters, WhenFull};
use crate::devices::queue::Queue;
use crate::error::{Error, Result};
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
        self.write_when_room(|q| match q.send(packet) {
            Err(e) if e.is_would_block() => Ok(None),
            other => other.map(Some),
        })
        .await
    }

    /// Runs `write` at once, and again each time the queue becomes writable for as long as it finds the queue
    /// full (`Ok(None)`). Never waits before the first try: a TUN fd is reported writable only while its device
    /// is up, and a write to a device that is down must fail (and be counted), not wait.
    pub(crate) async fn write_when_room<T>(&self, mut write: impl FnMut(&Queue) -> Result<Option<T>>) -> Result<T> {
        let mut ready: Option<Ready<'_>> = None;
        loop {
            if let Some(done) = write(self.get_ref())? {
                return Ok(done);
            }
            if let Some(mut stale) = ready.take() {
                stale.clear();
            }
            ready = Some(self.writable().await?);
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

    /// Fills `batch` from as many reads as are ready once the queue is readable, splitting super-packets (see
    /// [`crate::batch::RecvBatch::try_recv_many`]). Cancellation safe.
    pub async fn recv_many<B: AsMut<[u8]>>(&mut self, batch: &mut Batch<'_, B>) -> Result<Received> {
        loop {
            let half = &mut self.half;
            if let Some(done) = self.queue.readable().await?.try_io(|q| half.try_recv_many(q, batch)) {
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
        batch: &mut Batch<'_, B>,
        checksums: impl Into<turbotun_wire::Checksums>,
    ) -> Result<Sent> {
        let before = self.half.stats();
        let n = self.half.prepare(batch, checksums.into())?;
        let batch = batch.range(0..n);
        let (lens, offset) = (&*batch.lens, batch.offset);
        let mut writing = Writing { half: &mut self.half, queue: &self.queue, lens, offset, next: 0, done: false };
        let queue = writing.queue;
        queue
            .write_when_room(|q| match writing.half.write_units(q, &batch, writing.next, false) {
                Ok(Progress::Done) => Ok(Some(())),
                Ok(Progress::Full(k)) => {
                    writing.next = k;
                    Ok(None)
                }
                Err(e) => {
                    // Counted by `write_units` already.
                    writing.done = true;
                    Err(e)
                }
            })
            .await?;
        writing.done = true;
        drop(writing);
        Ok(self.half.sent_since(&before))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;
    use std::time::Duration;

    use turbotun_wire::{ipv4, udp, IPPROTO_UDP, VIRTIO_NET_HDR_LEN};

    use super::*;
    use crate::dataplane::batch::testing::fake_queue;

    /// An IPv4 UDP datagram of its own flow (source port `port`), its checksum "none", behind room for the header.
    fn frame(port: u16) -> Vec<u8> {
        let mut f = vec![0u8; VIRTIO_NET_HDR_LEN + 20 + 8 + 32];
        let ip = ipv4::Repr {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            protocol: IPPROTO_UDP,
            payload_len: 40,
            ttl: 64,
            ..ipv4::Repr::default()
        };
        ip.emit(&mut f[VIRTIO_NET_HDR_LEN..]).unwrap();
        udp::Repr { src_port: port, dst_port: 9, payload_len: 32 }.emit(&mut f[VIRTIO_NET_HDR_LEN + 20..]).unwrap();
        f
    }

    fn batch(n: u16) -> (Vec<Vec<u8>>, Vec<usize>) {
        let bufs: Vec<Vec<u8>> = (0..n).map(|i| frame(1000 + i)).collect();
        let lens = bufs.iter().map(|b| b.len() - VIRTIO_NET_HDR_LEN).collect();
        (bufs, lens)
    }

    /// The fake queue with the smallest send buffer the kernel allows, so that a few datagrams fill it.
    fn small_queue() -> (Queue, UnixDatagram) {
        let (queue, peer) = fake_queue();
        rustix::net::sockopt::set_socket_send_buffer_size(&queue, 1).unwrap();
        (queue, peer)
    }

    fn runtime() -> ::tokio::runtime::Runtime {
        ::tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build().unwrap()
    }

    /// Reads everything the peer end holds (until it would block).
    fn drain(peer: &UnixDatagram) -> usize {
        peer.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 2048];
        let mut n = 0;
        while peer.recv(&mut buf).is_ok() {
            n += 1;
        }
        n
    }

    /// A full queue is awaited, not waited on: the runtime's only thread goes on running other tasks while the
    /// batch waits for room, and every packet arrives once the reader makes room.
    #[test]
    fn test_a_full_queue_is_awaited_without_blocking_the_runtime() {
        let (queue, peer) = small_queue();
        runtime().block_on(async move {
            let q = AsyncQueue::new(queue).unwrap();
            let mut tx = q.send_batch();
            let ticks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let ticker = {
                let ticks = ticks.clone();
                ::tokio::spawn(async move {
                    loop {
                        ::tokio::time::sleep(Duration::from_millis(1)).await;
                        ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                })
            };
            let (mut bufs, mut lens) = batch(60);
            let mut packets = Batch::new(&mut bufs, &mut lens, VIRTIO_NET_HDR_LEN);
            let sending = tx.send_many(&mut packets, true);
            let reader = ::tokio::task::spawn_blocking(move || {
                // The peer reads nothing for a while: the socket fills, the send must wait.
                std::thread::sleep(Duration::from_millis(100));
                let mut got = 0;
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                while got < 60 && std::time::Instant::now() < deadline {
                    got += drain(&peer);
                    std::thread::sleep(Duration::from_millis(5));
                }
                got
            });
            let before = ticks.load(std::sync::atomic::Ordering::Relaxed);
            let sent = sending.await.unwrap();
            let during = ticks.load(std::sync::atomic::Ordering::Relaxed) - before;
            assert_eq!((sent.packets, sent.dropped), (60, 0), "{sent:?}");
            assert!(during >= 20, "the runtime ran other tasks while the batch waited ({during} ticks)");
            assert_eq!(reader.await.unwrap(), 60, "every packet arrived");
            ticker.abort();
        });
    }

    /// A send dropped while it waits for room counts what it had not written (`stopped`), so that written plus
    /// dropped is the batch; the next send starts afresh.
    #[test]
    fn test_a_dropped_send_counts_what_it_did_not_write() {
        let (queue, peer) = small_queue();
        runtime().block_on(async move {
            let q = AsyncQueue::new(queue).unwrap();
            let mut tx = q.send_batch();
            let (mut bufs, mut lens) = batch(60);
            let timed_out = ::tokio::time::timeout(
                Duration::from_millis(100),
                tx.send_many(&mut Batch::new(&mut bufs, &mut lens, VIRTIO_NET_HDR_LEN), true),
            )
            .await;
            assert!(timed_out.is_err(), "the socket filled and the send waited");
            let stats = tx.stats();
            assert!(stats.packets > 0 && stats.drops.stopped > 0, "{stats:?}");
            assert_eq!(stats.packets + stats.drops.stopped, 60, "{stats:?}");
            assert_eq!(drain(&peer) as u64, stats.packets, "what was written arrived");
            let (mut bufs, mut lens) = batch(5);
            let sent = tx.send_many(&mut Batch::new(&mut bufs, &mut lens, VIRTIO_NET_HDR_LEN), true).await.unwrap();
            assert_eq!(sent.packets, 5);
            assert_eq!(drain(&peer), 5);
        });
    }

    /// A receive dropped while it waits has read nothing: the frame that comes afterwards is the next one read.
    #[test]
    fn test_a_dropped_receive_loses_nothing() {
        let (queue, peer) = fake_queue();
        runtime().block_on(async move {
            let q = AsyncQueue::new(queue).unwrap();
            let mut rx = q.recv_batch();
            let mut bufs = vec![vec![0u8; 2048]; 4];
            let mut lens = [0usize; 4];
            let mut waiting = Batch::new(&mut bufs, &mut lens, VIRTIO_NET_HDR_LEN);
            let early = ::tokio::time::timeout(Duration::from_millis(50), rx.recv_many(&mut waiting));
            assert!(early.await.is_err(), "nothing to read: the receive waited and was dropped");
            peer.send(&frame(7)).unwrap();
            let got = rx.recv_many(&mut Batch::new(&mut bufs, &mut lens, VIRTIO_NET_HDR_LEN)).await.unwrap();
            assert_eq!((got.packets, lens[0]), (1, 60));
            assert_eq!(rx.stats().drops.total(), 0);
        });
    }
}
