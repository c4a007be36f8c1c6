//! One queue (fd) of a device: one-packet and raw I/O, readiness, attach/detach, counters.
//!
//! A `Queue` is `Sync`: one thread may read while another writes (the kernel serialises per direction).
//! The batch API with GSO split and GRO coalesce is in [`crate::batch`].

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use turbotun_wire::virtio_net::VirtioNetHdrRepr;

use crate::error::{queue_io_error, Error, Malformed, Result};
use crate::kind::{Mode, Offloads};
use crate::stats::DropReason;
use crate::sys::{self, iff, Interest};

/// Largest frame the tun driver hands over after the virtio header: a GSO super-packet of up to 65,535 bytes
/// of IP, and on a TAP device its Ethernet header with up to two VLAN tags in front. A buffer of this size never
/// truncates a frame; a larger one (a device with a raised `gso_max_size`) is counted as a
/// [`DropReason::TooBig`](crate::stats::DropReason) drop, never forwarded cut.
pub const MAX_PACKET: usize = 65_535 + turbotun_wire::ethernet::MAX_HEADER_LEN;
pub use crate::kind::MAX_VNET_HDR;

/// The length after the virtio header of a frame that one read of `n` bytes put into buffers of `capacity` bytes
/// in all (the header included), or why it cannot be used: the tun driver reports a frame's full length even
/// when the buffers were shorter, so a read longer than its buffers is a frame cut short
/// ([`DropReason::TooBig`]), and one shorter than the header holds nothing ([`DropReason::Malformed`]). The one
/// rule every read path applies (blocking, raw and io_uring).
pub(crate) fn frame_len(n: usize, vnet_hdr_len: usize, capacity: usize) -> std::result::Result<usize, DropReason> {
    if n > capacity {
        return Err(DropReason::TooBig);
    }
    n.checked_sub(vnet_hdr_len).ok_or(DropReason::Malformed)
}

/// Counters of one direction, on a cache line of its own so the reader and writer threads do not share one.
#[repr(align(64))]
#[derive(Debug, Default)]
struct DirectionCounters {
    packets: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    dropped: AtomicU64,
}

impl DirectionCounters {
    fn add(&self, packets: u64, bytes: u64) {
        self.packets.fetch_add(packets, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.packets.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
    }
}

/// A snapshot of a queue's counters (what crossed the fd, as the kernel saw it: super-packets count once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Packets read from the fd.
    pub rx_packets: u64,
    /// Bytes read from the fd, without the virtio headers.
    pub rx_bytes: u64,
    /// Reads that failed, or returned less than a virtio header (would-block and interrupted reads not counted).
    pub rx_errors: u64,
    /// Packets written to the fd.
    pub tx_packets: u64,
    /// Bytes written to the fd, without the virtio headers.
    pub tx_bytes: u64,
    /// Writes that failed (would-block and interrupted writes not counted).
    pub tx_errors: u64,
    /// Packets the caller asked to send that were not written (device down, malformed).
    pub tx_dropped: u64,
}

/// One fd attached to a TUN/TAP device.
#[derive(Debug)]
pub struct Queue {
    fd: OwnedFd,
    name: Arc<str>,
    index: usize,
    mode: Mode,
    vnet_hdr_len: usize,
    offloads: Offloads,
    /// Opened without `IFF_NO_PI`: every packet has the 4-byte packet information header in front.
    packet_info: bool,
    rx: DirectionCounters,
    tx: DirectionCounters,
}

impl Queue {
    pub(crate) fn new(
        fd: OwnedFd,
        name: Arc<str>,
        index: usize,
        mode: Mode,
        vnet_hdr_len: usize,
        offloads: Offloads,
    ) -> Self {
        Queue {
            fd,
            name,
            index,
            mode,
            vnet_hdr_len,
            offloads,
            packet_info: false,
            rx: DirectionCounters::default(),
            tx: DirectionCounters::default(),
        }
    }

    /// Marks a queue opened with the packet information header.
    pub(crate) fn with_packet_info(mut self, on: bool) -> Self {
        self.packet_info = on;
        self
    }

    /// Whether every packet on this fd starts with the 4-byte packet information header (a device opened with
    /// [`crate::DeviceBuilder::packet_info`]); turbotun's batch and forwarding paths expect none.
    pub fn packet_info(&self) -> bool {
        self.packet_info
    }

    /// The name of the device the queue belongs to.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The queue's position among the device's queues ([`crate::Device::queue`]).
    pub fn index(&self) -> usize {
        self.index
    }
    /// Whether the device is TUN or TAP.
    pub fn mode(&self) -> Mode {
        self.mode
    }
    /// Size of the virtio header in front of every packet on this fd (0 without `IFF_VNET_HDR`).
    pub fn vnet_hdr_len(&self) -> usize {
        self.vnet_hdr_len
    }
    /// Offloads granted on the device.
    pub fn offloads(&self) -> Offloads {
        self.offloads
    }
    /// Whether the kernel may hand this queue GSO super-packets.
    pub fn receives_super_packets(&self) -> bool {
        self.offloads.intersects(Offloads::TSO4 | Offloads::TSO6 | Offloads::USO4 | Offloads::USO6)
    }

    /// Reads one packet (IP for TUN, Ethernet for TAP) without the virtio header. A partial checksum
    /// (`NEEDS_CSUM`) is completed. On a queue granted segmentation offloads use [`Self::recv_with_hdr`] or
    /// [`crate::batch::RecvBatch`] instead, since a read may return a super-packet.
    pub fn recv(&self, buf: &mut [u8]) -> Result<usize> {
        if self.vnet_hdr_len == 0 {
            return self.recv_raw(buf);
        }
        if self.receives_super_packets() {
            return Err(Error::InvalidConfig(format!(
                "{} has segmentation offloads ({}): a read may be a super-packet, use recv_with_hdr or RecvBatch",
                self.name, self.offloads
            )));
        }
        let (hdr, len) = self.recv_with_hdr(buf)?;
        if hdr.flags & turbotun_wire::virtio_net::flags::NEEDS_CSUM != 0 {
            turbotun_wire::checksum::complete_partial(&mut buf[..len], hdr.csum_start.into(), hdr.csum_offset.into())
                .map_err(|e| Error::malformed(&self.name, Malformed::PartialChecksum(e)))?;
        }
        Ok(len)
    }

    /// Reads one packet and its virtio header (the header is read into a separate array by `readv`).
    pub fn recv_with_hdr(&self, buf: &mut [u8]) -> Result<(VirtioNetHdrRepr, usize)> {
        if self.vnet_hdr_len == 0 {
            return Ok((VirtioNetHdrRepr::default(), self.recv_raw(buf)?));
        }
        let mut head = [0u8; MAX_VNET_HDR];
        let head = &mut head[..self.vnet_hdr_len];
        let n = sys::read2(self.fd.as_fd(), head, buf, false).map_err(|e| self.rx_error("read", e))?;
        if n < head.len() {
            self.rx.errors.fetch_add(1, Ordering::Relaxed);
            return Err(Error::malformed(&self.name, Malformed::ShortRead));
        }
        let hdr =
            VirtioNetHdrRepr::parse(head).map_err(|e| Error::malformed(&self.name, Malformed::VirtioHeader(e)))?;
        let len = n - head.len();
        self.rx.add(1, len as u64);
        Ok((hdr, len))
    }

    /// Reads exactly what the kernel delivers: the virtio header (if any) followed by the packet.
    pub fn recv_raw(&self, buf: &mut [u8]) -> Result<usize> {
        let n = sys::read(self.fd.as_fd(), buf).map_err(|e| self.rx_error("read", e))?;
        self.rx.add(1, n as u64);
        Ok(n)
    }

    /// Like [`Self::recv_raw`], but returns a would-block error instead of sleeping even on a blocking queue
    /// (`RWF_NOWAIT`). Kernels without it give an error for which [`is_nowait_unsupported`] is true.
    pub fn try_recv_raw(&self, buf: &mut [u8]) -> Result<usize> {
        let n = sys::read2(self.fd.as_fd(), &mut [], buf, true).map_err(|e| self.rx_error("read", e))?;
        self.rx.add(1, n as u64);
        Ok(n)
    }

    /// Writes one packet; on a virtio-header queue a zeroed header (no offload) goes in front of it.
    pub fn send(&self, packet: &[u8]) -> Result<usize> {
        if self.vnet_hdr_len == 0 {
            return self.send_raw(packet);
        }
        self.send_with_hdr(&VirtioNetHdrRepr::default(), packet)
    }

    /// Writes one packet behind the given virtio header (e.g. a coalesced packet with `NEEDS_CSUM`).
    pub fn send_with_hdr(&self, hdr: &VirtioNetHdrRepr, packet: &[u8]) -> Result<usize> {
        if self.vnet_hdr_len == 0 {
            return Err(Error::InvalidConfig(format!("{} has no virtio header: use send", self.name)));
        }
        let mut head = [0u8; MAX_VNET_HDR];
        let head = &mut head[..self.vnet_hdr_len];
        hdr.emit(head);
        let n = sys::write2(self.fd.as_fd(), head, packet).map_err(|e| self.tx_error("write", e))?;
        self.tx.add(1, n.saturating_sub(head.len()) as u64);
        Ok(n.saturating_sub(head.len()))
    }

    /// Writes a buffer as is: the virtio header (if the queue has one) must already lead it.
    pub fn send_raw(&self, buf: &[u8]) -> Result<usize> {
        let n = sys::write(self.fd.as_fd(), buf).map_err(|e| self.tx_error("write", e))?;
        self.tx.add(1, n as u64);
        Ok(n)
    }

    /// The fd's send buffer (`TUNGETSNDBUF`; `i32::MAX` means unlimited, the default).
    pub fn sndbuf(&self) -> Result<i32> {
        sys::tun_get_sndbuf(self.fd.as_fd()).map_err(|e| Error::io("TUNGETSNDBUF", e))
    }

    /// Switches the fd between blocking and non-blocking reads and writes.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        sys::set_nonblocking(self.fd.as_fd(), nonblocking).map_err(|e| Error::io("fcntl(O_NONBLOCK)", e))
    }

    /// Waits until a read would not block; false on timeout (`None` waits forever).
    pub fn wait_readable(&self, timeout: Option<Duration>) -> Result<bool> {
        self.wait(Interest::Readable, timeout)
    }

    /// Waits until a write would not block; false on timeout.
    pub fn wait_writable(&self, timeout: Option<Duration>) -> Result<bool> {
        self.wait(Interest::Writable, timeout)
    }

    /// A signal (e.g. [`crate::wake`]) ends the wait early, like a timeout: the caller looks at its flags.
    fn wait(&self, interest: Interest, timeout: Option<Duration>) -> Result<bool> {
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        match sys::poll(self.fd.as_fd(), interest, ms) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(false),
            other => other.map_err(|e| Error::io("poll", e)),
        }
    }

    /// Detaches this queue from a multiqueue device (`TUNSETQUEUE`): the kernel stops steering packets to it.
    pub fn detach(&self) -> Result<()> {
        sys::tun_set_queue(self.fd.as_fd(), iff::DETACH_QUEUE)
            .map_err(|e| Error::io(format!("detaching queue {} of {}", self.index, self.name), e))
    }

    /// Re-attaches a detached queue.
    pub fn attach(&self) -> Result<()> {
        sys::tun_set_queue(self.fd.as_fd(), iff::ATTACH_QUEUE)
            .map_err(|e| Error::io(format!("attaching queue {} of {}", self.index, self.name), e))
    }

    /// Counts a packet the caller decided not to send (so that drops are never silent).
    pub fn count_tx_drop(&self, packets: u64) {
        self.tx.dropped.fetch_add(packets, Ordering::Relaxed);
    }

    pub(crate) fn count_rx(&self, packets: u64, bytes: u64) {
        self.rx.add(packets, bytes);
    }

    pub(crate) fn count_tx(&self, packets: u64, bytes: u64) {
        self.tx.add(packets, bytes);
    }

    /// A snapshot of the queue's counters since it was opened.
    pub fn stats(&self) -> QueueStats {
        let (rx_packets, rx_bytes, rx_errors, _) = self.rx.snapshot();
        let (tx_packets, tx_bytes, tx_errors, tx_dropped) = self.tx.snapshot();
        QueueStats { rx_packets, rx_bytes, rx_errors, tx_packets, tx_bytes, tx_errors, tx_dropped }
    }

    fn rx_error(&self, op: &'static str, e: std::io::Error) -> Error {
        if !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) {
            self.rx.errors.fetch_add(1, Ordering::Relaxed);
        }
        queue_io_error(&self.name, op, e)
    }

    fn tx_error(&self, op: &'static str, e: std::io::Error) -> Error {
        if !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) {
            self.tx.errors.fetch_add(1, Ordering::Relaxed);
        }
        queue_io_error(&self.name, op, e)
    }
}

// A queue owns its fd from creation to drop.
#[cfg(feature = "tokio")]
impl sys::StableFd for Queue {}

impl AsFd for Queue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Queue {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Whether a non-sleeping read was refused because the kernel (or the file) has no `RWF_NOWAIT`.
pub fn is_nowait_unsupported(err: &Error) -> bool {
    matches!(err, Error::Io { source, .. } if source.raw_os_error() == Some(libc::EOPNOTSUPP))
}

/// Whether a blocking call was interrupted by a signal (see [`crate::wake`]): nothing was read or written.
pub fn is_interrupted(err: &Error) -> bool {
    matches!(err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::Interrupted)
}

/// Whether an error is "try again later" (non-blocking queue with nothing to read, or a full one).
pub fn is_would_block(err: &Error) -> bool {
    matches!(err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::WouldBlock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_frame_len() {
        assert_eq!(frame_len(1510, 10, 1510), Ok(1500));
        assert_eq!(frame_len(1511, 10, 1510), Err(DropReason::TooBig), "longer than its buffers: cut short");
        assert_eq!(frame_len(9, 10, 1510), Err(DropReason::Malformed), "shorter than the virtio header");
        assert_eq!(frame_len(10, 10, 1510), Ok(0));
        assert_eq!(frame_len(0, 0, 0), Ok(0));
    }
}
