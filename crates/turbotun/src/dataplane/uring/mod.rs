//! Forwarding frames between two queues through io_uring: many reads in flight, and one system call both
//! submits the writes of what arrived and waits for the next frames.
//!
//! A synchronous forwarder makes at least two system calls per frame (a read and a write); here one multishot
//! read waits in the kernel (armed on the tun fd's wait queue, no helper threads: the tun driver honours
//! `IOCB_NOWAIT`) and reads frame after frame into a ring of `depth` provided buffers, and each
//! `io_uring_enter` hands over every write that is ready while it collects the next completions. Frames move as they are (the virtio header too, if the queues have one): this is the
//! plain and passthrough forwarding path ([`UringForwarder`]), and a slot is never copied: the buffer a frame
//! was read into is the one it is written from; its index moves from a receive to a transmit
//! [`SlotRing`](crate::ring::SlotRing) (netmap-style forwarding by index, no allocation per frame).
//!
//! [`UringOffload`] is offload mode on the same arena: super-packets read with their virtio header, split,
//! handed to the application, coalesced, and the gathered writes of a round submitted together with the next
//! read (`offload.rs`, its scattered read in `scatter.rs`).
//!
//! Order: frames leave in the order they were read (one read request posts its completions in order, writes
//! are submitted in completion order, and a tun write does not wait); a write the kernel refuses for want of socket buffer (`EAGAIN`, only with a limited
//! `TUNSETSNDBUF`) is retried and may then be overtaken by later frames.

mod forwarder;
mod offload;
mod scatter;

pub use forwarder::UringForwarder;
pub use offload::UringOffload;

use crate::error::{Error, Result};

/// Offset of a packet in its slot: the virtio header in front of it.
const OFFSET: usize = turbotun_wire::VIRTIO_NET_HDR_LEN;

/// Environment variable that turns io_uring off for the process (any value but empty or `0`): every path
/// that would use it falls back to blocking I/O and says so, as on a kernel or container without io_uring.
pub const DISABLE_ENV: &str = "TURBOTUN_NO_URING";

/// Whether this kernel has what [`UringOffload::scattered_with`] needs to register its slots (`READV_FIXED`,
/// `WRITEV_FIXED`, Linux 6.15) besides what [`supported`] checks; probed once.
pub fn registered_vectors_supported() -> Result<()> {
    static PROBED: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    supported()?;
    PROBED.get_or_init(|| crate::sys::uring::probe_registered_vectors().map_err(|e| e.to_string())).clone().map_err(
        |why| Error::io("io_uring registered buffers", std::io::Error::new(std::io::ErrorKind::Unsupported, why)),
    )
}

/// Whether this kernel can run a [`UringForwarder`] and a [`UringOffload`] (io_uring with multishot reads,
/// `IORING_OP_READV`, `IORING_OP_WRITEV`, Linux 6.7); probed once. The error says what is missing, or that
/// [`DISABLE_ENV`] turned io_uring off, so that a caller can fall back to blocking reads and say why.
pub fn supported() -> Result<()> {
    static PROBED: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    PROBED
        .get_or_init(|| {
            if std::env::var_os(DISABLE_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
                return Err(format!("io_uring turned off by {DISABLE_ENV}"));
            }
            crate::sys::uring::probe_forward_ring().map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|why| Error::io("io_uring forwarding", std::io::Error::new(std::io::ErrorKind::Unsupported, why)))
}

/// The error of a ring set up between `src` and `dst`.
fn ring_error(src: &str, dst: &str, e: std::io::Error) -> Error {
    Error::io(format!("io_uring {src} -> {dst}"), e)
}

/// What the forwarding engine drives, for both kinds of ring: one round at a time, the frames in flight waited
/// for at the end, and what is left counted.
pub(crate) trait Rounds {
    /// One round; `hook` sees each packet (or frame) before it is written. False if nothing completed.
    fn round(&mut self, timeout: std::time::Duration, hook: &mut dyn FnMut(&mut [u8])) -> Result<bool>;
    /// What it moved so far.
    fn counters(&self) -> crate::dataplane::stats::Counters;
    /// Waits up to `timeout` for the writes in flight.
    fn wait_for_writes(&mut self, timeout: std::time::Duration) -> Result<usize>;
    /// Counts what it still holds as dropped for `reason`.
    fn give_up(&mut self, reason: crate::dataplane::stats::DropReason);
}

/// `Rounds` for a ring type, whose methods of the same meaning it forwards to.
macro_rules! rounds {
    ($ring:ty) => {
        impl Rounds for $ring {
            fn round(&mut self, timeout: std::time::Duration, hook: &mut dyn FnMut(&mut [u8])) -> Result<bool> {
                self.poll_with(timeout, hook)
            }
            fn counters(&self) -> crate::dataplane::stats::Counters {
                self.stats()
            }
            fn wait_for_writes(&mut self, timeout: std::time::Duration) -> Result<usize> {
                self.drain(timeout)
            }
            fn give_up(&mut self, reason: crate::dataplane::stats::DropReason) {
                self.abandon(reason)
            }
        }
    };
}

rounds!(UringForwarder);
rounds!(UringOffload);

/// Polls `ring` (with `poll`) until `in_flight` says no write is left or `timeout` passed.
fn until_written<R>(
    timeout: std::time::Duration,
    in_flight: impl Fn(&mut R) -> usize,
    mut poll: impl FnMut(&mut R, std::time::Duration) -> Result<bool>,
    ring: &mut R,
) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    while in_flight(ring) > 0 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        poll(ring, left)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::batch::testing::fake_queue;
    use turbotun_wire::scatter::ScatterShape;

    /// A scattered read whose completion reports more bytes than its pieces hold (the tun driver reports a
    /// frame's full length, cut to the buffers): counted as too big on every layout, never a panic, every slot
    /// back among the spares. Found by review: the overflow copy would slice past the slot.
    #[test]
    fn test_an_oversized_scattered_read_is_too_big() {
        let (src, _feed) = fake_queue();
        let (dst, _sink) = fake_queue();
        for predicted in [None, Some(ScatterShape { hdr_len: 40, gso_size: 1000, segments: 2 })] {
            let mut fwd = UringOffload::scattered(&src, &dst, 16).unwrap();
            let spares = fwd.spares.len();
            fwd.predict(predicted);
            fwd.plan_read().unwrap();
            let planned = fwd.planned();
            assert!(planned >= 1, "{predicted:?}");
            fwd.scattered_read(fwd.ring.stride() + 4096).unwrap();
            let stats = fwd.stats();
            assert_eq!(stats.drops.too_big, 1, "{predicted:?}: {stats:?}");
            assert_eq!(fwd.spares.len(), spares, "{predicted:?}: every slot of the read is a spare again");
            assert!(fwd.rx.is_empty() && fwd.ready_segments.is_empty(), "{predicted:?}: nothing delivered");
        }
    }
}
