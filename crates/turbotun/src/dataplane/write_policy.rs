//! The one place that decides what happens to a packet the kernel did not take: wait, retry, re-split, drop
//! (counted, with its reason) or give up on the queue. The batch writer, the raw forwarding loop and the
//! io_uring backend all ask [`on_write_error`], so a given errno means the same thing on every path.

use std::io::{self, IoSlice};
use std::os::fd::AsFd;
use std::time::Duration;

use turbotun_wire::virtio_net::VirtioNetHdrRepr;

use crate::dataplane::stats::{Counters, DropReason, WhenFull};
use crate::devices::queue::Queue;
use crate::error::{queue_io_error, Result};
use crate::stop::StopHandle;
use crate::sys;

/// How long a write waiting for room sleeps before it looks at the stop handle again.
const ROOM_POLL: Duration = Duration::from_millis(100);

/// What to do after a write failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteFailure {
    /// The queue is full: wait until it is writable, then write the same packet again (backpressure).
    WaitWritable,
    /// Interrupted before anything was written: write the same packet again.
    Retry,
    /// The kernel refused a coalesced (GSO) packet: turn that GRO kind off and write its segments one by one.
    Resplit,
    /// Count the packet as dropped for this reason and go on.
    Drop(DropReason),
    /// Not a per-packet problem (the device is gone, an fd error): the caller returns the error.
    Fatal,
}

/// Classifies the errno of a failed write of one packet; `coalesced` says whether it was a GSO super-packet we
/// built (a refusal of those is a kernel without that GRO kind, not a bad packet).
pub(crate) fn on_write_error(errno: Option<i32>, coalesced: bool, when_full: WhenFull) -> WriteFailure {
    match errno {
        Some(libc::EAGAIN) => match when_full {
            WhenFull::Wait => WriteFailure::WaitWritable,
            WhenFull::Drop => WriteFailure::Drop(DropReason::QueueFull),
        },
        Some(libc::EINTR) => WriteFailure::Retry,
        Some(libc::EIO) => WriteFailure::Drop(DropReason::DeviceDown),
        Some(libc::EINVAL) if coalesced => WriteFailure::Resplit,
        Some(libc::EINVAL) | Some(libc::EMSGSIZE) => WriteFailure::Drop(DropReason::KernelRefused),
        _ => WriteFailure::Fatal,
    }
}

/// The reason packets are counted under when a queue fails with `e` before they were written: the device went
/// away, or the queue failed otherwise (the forwarder stops).
pub(crate) fn lost_with(e: &crate::error::Error) -> DropReason {
    use crate::error::Error;
    if e.is_device_gone() || matches!(e, Error::DeviceDown { .. }) {
        DropReason::DeviceDown
    } else {
        DropReason::Stopped
    }
}

/// The caller's packets one frame carries (a coalesced frame carries its merged members too) and their bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unit {
    pub packets: u64,
    pub bytes: u64,
}

/// How a write ended when it did not fail the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// The kernel took it (counted in `writes`, `packets`, `bytes`).
    Yes,
    /// Counted as a drop with its reason.
    Dropped,
    /// The kernel refused a coalesced packet: the caller re-splits it (see [`WriteFailure::Resplit`]).
    Refused(VirtioNetHdrRepr),
    /// The queue was full and the caller does not wait (it waits for writability itself, e.g. on tokio):
    /// nothing written, nothing counted.
    Full,
}

/// Writes frames to one queue under the write policy: what a write that fails becomes, counted in the caller's
/// [`Counters`] and the queue's `tx_dropped`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Writer {
    pub vnet_hdr_len: usize,
    pub when_full: WhenFull,
    pub stop: Option<StopHandle>,
}

impl Writer {
    /// Writes one frame (virtio header, if the queue has one, and packet, in pieces) until the kernel takes it
    /// or the policy says otherwise. `may_resplit`: whether a refused GSO frame is ours to split again. `wait`:
    /// whether a full queue is waited on here (else [`Written::Full`], for a caller that waits elsewhere).
    pub(crate) fn write(
        &self,
        queue: &Queue,
        iov: &[IoSlice<'_>],
        unit: Unit,
        may_resplit: bool,
        wait: bool,
        stats: &mut Counters,
    ) -> Result<Written> {
        loop {
            let e = match sys::writev(queue.as_fd(), iov) {
                Ok(n) => {
                    queue.count_tx(1, n.saturating_sub(self.vnet_hdr_len) as u64);
                    stats.writes += 1;
                    stats.packets += unit.packets;
                    stats.bytes += unit.bytes;
                    return Ok(Written::Yes);
                }
                Err(e) => e,
            };
            let hdr = self.header_of(iov);
            match on_write_error(e.raw_os_error(), may_resplit && hdr.is_gso(), self.when_full) {
                WriteFailure::WaitWritable if !wait => return Ok(Written::Full),
                WriteFailure::WaitWritable if self.wait_for_room(queue)? => {}
                WriteFailure::Retry if !self.stopping() => {}
                WriteFailure::WaitWritable | WriteFailure::Retry => {
                    return Ok(self.drop(queue, DropReason::Stopped, unit.packets, &e, stats));
                }
                WriteFailure::Resplit => return Ok(Written::Refused(hdr)),
                WriteFailure::Drop(reason) => return Ok(self.drop(queue, reason, unit.packets, &e, stats)),
                WriteFailure::Fatal => {
                    // The queue failed: the frame is lost with it, and counted, like every packet read.
                    let err = queue_io_error(queue.name(), "write", e);
                    self.drop(queue, lost_with(&err), unit.packets, &std::io::Error::other(err.to_string()), stats);
                    return Err(err);
                }
            }
        }
    }

    /// Counts `packets` as dropped for `reason`, in `stats` and in the queue's `tx_dropped`.
    pub(crate) fn drop(
        &self,
        queue: &Queue,
        reason: DropReason,
        packets: u64,
        e: &io::Error,
        stats: &mut Counters,
    ) -> Written {
        tracing::debug!("{}: dropped {packets} packet(s) ({reason}): {e}", queue.name());
        stats.drops.add(reason, packets);
        queue.count_tx_drop(packets);
        Written::Dropped
    }

    /// The virtio header at the front of a frame (zeroed when the queue has none or it does not parse).
    fn header_of(&self, iov: &[IoSlice<'_>]) -> VirtioNetHdrRepr {
        match iov.first() {
            Some(first) if self.vnet_hdr_len > 0 && first.len() >= self.vnet_hdr_len => {
                VirtioNetHdrRepr::parse(&first[..self.vnet_hdr_len]).unwrap_or_default()
            }
            _ => VirtioNetHdrRepr::default(),
        }
    }

    fn stopping(&self) -> bool {
        self.stop.as_ref().is_some_and(StopHandle::is_stopped)
    }

    /// Waits until the queue can take a write; false if the stop handle fired first (the wait ends at once:
    /// it is on the handle's wake fd too).
    fn wait_for_room(&self, queue: &Queue) -> Result<bool> {
        loop {
            if self.stopping() {
                return Ok(false);
            }
            if queue.wait_or_stop(rustix::event::PollFlags::OUT, self.stop.as_ref(), Some(ROOM_POLL))? {
                return Ok(true);
            }
        }
    }
}

/// Splits a coalesced packet the kernel refused (`packet`, after its virtio header `hdr`) and writes its
/// segments one by one, each with a zeroed virtio header, under the write policy. A packet that does not split
/// is counted as malformed: `packets` of the caller's packets are dropped.
pub(crate) fn write_split(
    writer: &Writer,
    queue: &Queue,
    framing: turbotun_wire::Framing,
    hdr: &VirtioNetHdrRepr,
    packet: &[u8],
    packets: u64,
    stats: &mut Counters,
) -> Result<()> {
    let splitter = match turbotun_wire::gso::Splitter::new(hdr, packet, framing) {
        Ok(s) => s,
        Err(e) => {
            writer.drop(queue, DropReason::Malformed, packets, &io::Error::other(e.to_string()), stats);
            return Ok(());
        }
    };
    let vlen = writer.vnet_hdr_len;
    let mut frame = vec![0u8; vlen + crate::devices::queue::MAX_PACKET];
    let count = splitter.segment_count();
    for index in 0..count {
        frame[..vlen].fill(0);
        match splitter.write_segment(index, &mut frame[vlen..]) {
            Ok(len) => {
                let unit = Unit { packets: 1, bytes: len as u64 };
                // Not coalesced, so never handed back for re-splitting: written, or dropped with its reason.
                if let Err(e) = writer.write(queue, &[IoSlice::new(&frame[..vlen + len])], unit, false, true, stats) {
                    // The queue failed: the segments after this one are lost with it.
                    let rest = (count - index - 1) as u64;
                    if rest > 0 {
                        writer.drop(queue, lost_with(&e), rest, &io::Error::other(e.to_string()), stats);
                    }
                    return Err(e);
                }
            }
            Err(e) => {
                writer.drop(queue, DropReason::Malformed, 1, &io::Error::other(e.to_string()), stats);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The EINVAL fallback of the io_uring offload path: a coalesced packet the kernel refused is split again
    /// and written segment by segment, each with a zeroed virtio header, checksums complete, nothing lost.
    #[test]
    fn test_a_refused_coalesced_packet_is_written_as_its_segments() {
        use crate::dataplane::batch::testing::{fake_queue, tcp4_super_packet};
        use turbotun_wire::virtio_net::VIRTIO_NET_HDR_LEN;
        use turbotun_wire::{ipv4, tcp};

        let (queue, peer) = fake_queue();
        let (ip_len, tcp_len, payload) = (ipv4::MIN_HEADER_LEN, tcp::MIN_HEADER_LEN, 2500);
        let data: Vec<u8> = (0..payload).map(|i| (i % 251) as u8).collect();
        let (hdr, packet) = tcp4_super_packet(&data, 1000, 7);
        let writer = Writer { vnet_hdr_len: VIRTIO_NET_HDR_LEN, ..Writer::default() };
        let mut stats = Counters::default();
        write_split(&writer, &queue, turbotun_wire::Framing::Ip, &hdr, &packet, 3, &mut stats).unwrap();
        assert_eq!((stats.writes, stats.packets, stats.drops.total()), (3, 3, 0), "{stats:?}");
        let mut got = Vec::new();
        let mut buf = vec![0u8; 4096];
        for k in 0..3u32 {
            let n = peer.recv(&mut buf).unwrap();
            assert!(buf[..VIRTIO_NET_HDR_LEN].iter().all(|&b| b == 0), "a plain packet's header is zero");
            let seg = &buf[VIRTIO_NET_HDR_LEN..n];
            let p = ipv4::Packet::new_checked(seg).unwrap();
            assert!(p.verify_checksum());
            assert_eq!(usize::from(p.total_len()), seg.len());
            let t = tcp::Packet::new_checked(&seg[ip_len..]).unwrap();
            assert_eq!(t.seq_number(), 7 + 1000 * k, "segment {k} starts where the last ended");
            got.extend_from_slice(&seg[ip_len + tcp_len..]);
        }
        assert_eq!(got, packet[ip_len + tcp_len..], "the payload, whole and in order");
    }

    #[test]
    fn test_every_errno_has_one_meaning() {
        use WriteFailure::*;
        let wait = WhenFull::Wait;
        assert_eq!(on_write_error(Some(libc::EAGAIN), false, wait), WaitWritable);
        assert_eq!(on_write_error(Some(libc::EAGAIN), true, WhenFull::Drop), Drop(DropReason::QueueFull));
        assert_eq!(on_write_error(Some(libc::EINTR), true, wait), Retry);
        assert_eq!(on_write_error(Some(libc::EIO), true, wait), Drop(DropReason::DeviceDown));
        assert_eq!(on_write_error(Some(libc::EINVAL), true, wait), Resplit);
        assert_eq!(on_write_error(Some(libc::EINVAL), false, wait), Drop(DropReason::KernelRefused));
        assert_eq!(on_write_error(Some(libc::EBADFD), false, wait), Fatal);
        assert_eq!(on_write_error(None, false, wait), Fatal);
    }
}
