//! One queue (fd) of a device: one-packet and raw I/O, readiness, attach/detach, counters.
//!
//! A `Queue` is `Sync`: one thread may read while another writes (the kernel serialises per direction).
//! The batch API with GSO split and GRO coalesce is in [`crate::batch`].

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use turbotun_wire::virtio_net::VirtioNetHdrRepr;

use crate::devices::mode::Mode;
use crate::devices::offloads::Offloads;
use crate::error::{queue_io_error, ConfigError, Error, Malformed, Result};
use rustix::event::PollFlags;

use crate::sys::{self, iff};

/// Largest frame the tun driver hands over after the virtio header: a GSO super-packet of up to 65,535 bytes
/// of IP, and on a TAP device its Ethernet header with up to two VLAN tags in front. A buffer of this size never
/// truncates a frame; a larger one (a device with a raised `gso_max_size`) is counted as a
/// [`DropReason::TooBig`](crate::stats::DropReason) drop, never forwarded cut.
pub const MAX_PACKET: usize = 65_535 + turbotun_wire::ethernet::MAX_HEADER_LEN;
pub use crate::devices::vnet_hdr::MAX_VNET_HDR;

/// Slices (the virtio header's included) that a vectored call with a header of its own gathers on the stack; a
/// longer chain is gathered in a vector.
const STACK_IOV: usize = 16;

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

/// A snapshot of a queue's counters (what crossed the fd, as the kernel saw it: super-packets count once). Bytes
/// are always counted without the virtio header, whichever call read or wrote them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
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
    /// The device's offload mask (`TUNSETOFFLOAD` is per device): shared by the queues opened together, so that a
    /// change through any of them shows through all.
    offloads: Arc<AtomicU32>,
    /// Opened without `IFF_NO_PI`: every packet has the 4-byte packet information header in front.
    packet_info: bool,
    /// Whether the device's flow-hash steering program is attached ([`Queue::steer_by_flow`]): per device, shared
    /// like `offloads`.
    flow_steered: Arc<AtomicBool>,
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
            offloads: Arc::new(AtomicU32::new(offloads.bits())),
            packet_info: false,
            flow_steered: Arc::new(AtomicBool::new(false)),
            rx: DirectionCounters::default(),
            tx: DirectionCounters::default(),
        }
    }

    /// Makes the queue share `other`'s view of the device's offloads and steering (queues of one device).
    pub(crate) fn sharing_offloads_with(mut self, other: &Queue) -> Self {
        self.offloads = other.offloads.clone();
        self.flow_steered = other.flow_steered.clone();
        self
    }

    /// Steers the device's packets to its queues by a hash of their addresses and ports (the flow-hash eBPF
    /// program, `TUNSETSTEERINGEBPF`), so that one flow stays on one queue; once per device: a device already
    /// steered so through any of its queues is left as it is. Loading the program needs `CAP_BPF` (or
    /// `CAP_SYS_ADMIN`): a process that drops its privileges calls this before, and what it builds later (a
    /// tunnel on these queues) finds the device steered.
    pub fn steer_by_flow(&self) -> Result<()> {
        if self.flow_steered.load(Ordering::Acquire) {
            return Ok(());
        }
        crate::devices::steering::SteeringProgram::flow_hash()?.attach(self.fd.as_fd())?;
        self.flow_steered.store(true, Ordering::Release);
        Ok(())
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
    /// Offloads granted on the device: at open, or since by [`Self::set_offloads`] (through this queue or
    /// another of the device's).
    pub fn offloads(&self) -> Offloads {
        Offloads::from_bits_retain(self.offloads.load(Ordering::Relaxed))
    }
    /// Whether the kernel may hand this queue GSO super-packets.
    pub fn receives_super_packets(&self) -> bool {
        self.offloads().intersects(Offloads::TSO4 | Offloads::TSO6 | Offloads::USO4 | Offloads::USO6)
    }

    /// `TUNSETOFFLOAD` at run time, exactly `offloads` or an error: what the kernel may hand this device's
    /// queues from the next packet on, as a VM monitor sets it when its guest acknowledges virtio-net features
    /// (see [`Offloads::for_guest_features`]) and again after a reset. The queue's view ([`Self::offloads`], and
    /// the batch halves reading from it) follows, and so do the other queues of the device opened with it. A
    /// combination the kernel refuses is [`Error::OffloadsRefused`] and changes nothing; there is no fallback
    /// here (use [`crate::DeviceBuilder::offloads`] for the degrading negotiation at open).
    ///
    /// Super-packets already queued for reading keep the offloads they were made under: a reader must still
    /// expect them for a moment after offloads are turned off.
    pub fn set_offloads(&self, offloads: Offloads) -> Result<()> {
        if self.vnet_hdr_len == 0 && !offloads.is_empty() {
            return Err(Error::OffloadsRefused {
                name: self.name.to_string(),
                asked: offloads,
                reason: "the queue has no virtio header",
            });
        }
        sys::tun_set_offload(self.fd.as_fd(), offloads.bits()).map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => Error::OffloadsRefused {
                name: self.name.to_string(),
                asked: offloads,
                reason: "the kernel refused the combination (EINVAL)",
            },
            _ => Error::io(format!("TUNSETOFFLOAD on {}", self.name), e),
        })?;
        self.offloads.store(offloads.bits(), Ordering::Relaxed);
        Ok(())
    }

    /// Reads one packet (IP for TUN, Ethernet for TAP) without the virtio header. A partial checksum
    /// (`NEEDS_CSUM`) is completed. On a queue granted segmentation offloads use [`Self::recv_with_hdr`] or
    /// [`crate::batch::RecvBatch`] instead, since a read may return a super-packet.
    pub fn recv(&self, buf: &mut [u8]) -> Result<usize> {
        self.read_packet(buf, false)
    }

    /// Like [`Self::recv`], but never sleeps, even on a blocking queue (`RWF_NOWAIT`): nothing queued is a
    /// would-block error ([`Error::is_would_block`]).
    pub fn try_recv(&self, buf: &mut [u8]) -> Result<usize> {
        self.read_packet(buf, true)
    }

    fn read_packet(&self, buf: &mut [u8], nowait: bool) -> Result<usize> {
        if self.vnet_hdr_len == 0 {
            return self.read_raw(buf, nowait);
        }
        if self.receives_super_packets() {
            return Err(Error::Config(ConfigError::SuperPackets {
                name: self.name.to_string(),
                offloads: self.offloads(),
            }));
        }
        let (hdr, len) = self.read_with_hdr(buf, nowait)?;
        hdr.finish_whole(&mut buf[..len]).map_err(|e| Error::malformed(&self.name, Malformed::PartialChecksum(e)))?;
        Ok(len)
    }

    /// Reads one packet and its virtio header (the header is read into a separate array by `readv`).
    pub fn recv_with_hdr(&self, buf: &mut [u8]) -> Result<(VirtioNetHdrRepr, usize)> {
        self.read_with_hdr(buf, false)
    }

    fn read_with_hdr(&self, buf: &mut [u8], nowait: bool) -> Result<(VirtioNetHdrRepr, usize)> {
        let mut head = [0u8; MAX_VNET_HDR];
        let n =
            self.read_scattered(&mut [IoSliceMut::new(&mut head[..self.vnet_hdr_len]), IoSliceMut::new(buf)], nowait)?;
        self.header_of(&head, n)
    }

    /// The header and packet length of a read of `n` bytes whose first `vnet_hdr_len` went into `head`.
    fn header_of(&self, head: &[u8; MAX_VNET_HDR], n: usize) -> Result<(VirtioNetHdrRepr, usize)> {
        if self.vnet_hdr_len == 0 {
            return Ok((VirtioNetHdrRepr::default(), n));
        }
        // Counted as an error by `read_scattered` already.
        let len = n.checked_sub(self.vnet_hdr_len).ok_or_else(|| Error::malformed(&self.name, Malformed::ShortRead))?;
        let hdr = VirtioNetHdrRepr::parse(&head[..self.vnet_hdr_len])
            .map_err(|e| Error::malformed(&self.name, Malformed::VirtioHeader(e)))?;
        Ok((hdr, len))
    }

    /// Reads exactly what the kernel delivers: the virtio header (if any) followed by the packet.
    pub fn recv_raw(&self, buf: &mut [u8]) -> Result<usize> {
        self.read_raw(buf, false)
    }

    /// Like [`Self::recv_raw`], but never sleeps, even on a blocking queue (`RWF_NOWAIT`). Kernels without it
    /// give an error for which `Error::is_nowait_unsupported` is true.
    pub fn try_recv_raw(&self, buf: &mut [u8]) -> Result<usize> {
        self.read_raw(buf, true)
    }

    fn read_raw(&self, buf: &mut [u8], nowait: bool) -> Result<usize> {
        self.read_scattered(&mut [IoSliceMut::new(buf)], nowait)
    }

    /// Reads exactly what the kernel delivers into the caller's slices, one after the other: the virtio header
    /// (if the queue has one) lands at the front of the first, as a VM monitor's receive descriptor chain expects
    /// it, and the packet follows across the slices. Nothing is copied twice (the kernel writes into guest
    /// memory described by the slices). Returns the bytes written, header included; a frame longer than the
    /// slices is cut by the kernel, which still reports its full length (compare with their sum).
    pub fn recv_vectored(&self, bufs: &mut [IoSliceMut<'_>]) -> Result<usize> {
        self.read_scattered(bufs, false)
    }

    /// Like [`Self::recv_vectored`], but the virtio header is read into a separate array and returned: the
    /// slices hold the packet alone.
    pub fn recv_vectored_with_hdr(&self, bufs: &mut [IoSliceMut<'_>]) -> Result<(VirtioNetHdrRepr, usize)> {
        let mut head = [0u8; MAX_VNET_HDR];
        let head_slice = IoSliceMut::new(&mut head[..self.vnet_hdr_len]);
        let count = bufs.len();
        let n = if count < STACK_IOV {
            let mut iov: [IoSliceMut<'_>; STACK_IOV] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
            iov[0] = head_slice;
            for (slot, b) in iov[1..].iter_mut().zip(bufs.iter_mut()) {
                *slot = IoSliceMut::new(b);
            }
            self.read_scattered(&mut iov[..=count], false)?
        } else {
            let mut iov: Vec<IoSliceMut<'_>> = Vec::with_capacity(count + 1);
            iov.push(head_slice);
            iov.extend(bufs.iter_mut().map(|b| IoSliceMut::new(&mut b[..])));
            self.read_scattered(&mut iov, false)?
        };
        self.header_of(&head, n)
    }

    /// The one read every receive call makes: counted (bytes without the virtio header) and its error mapped.
    fn read_scattered(&self, bufs: &mut [IoSliceMut<'_>], nowait: bool) -> Result<usize> {
        let n = sys::readv(self.fd.as_fd(), bufs, nowait).map_err(|e| self.rx_error("read", e))?;
        if n < self.vnet_hdr_len {
            self.rx.errors.fetch_add(1, Ordering::Relaxed);
        } else {
            self.rx.add(1, (n - self.vnet_hdr_len) as u64);
        }
        Ok(n)
    }

    /// Writes one packet; on a virtio-header queue a zeroed header (no offload) goes in front of it.
    pub fn send(&self, packet: &[u8]) -> Result<usize> {
        if self.vnet_hdr_len == 0 {
            return self.send_raw(packet);
        }
        self.send_with_hdr(&VirtioNetHdrRepr::default(), packet)
    }

    /// Writes one packet behind the given virtio header (e.g. a coalesced packet with `NEEDS_CSUM`). Returns the
    /// packet's length written (without the header).
    pub fn send_with_hdr(&self, hdr: &VirtioNetHdrRepr, packet: &[u8]) -> Result<usize> {
        self.send_vectored_with_hdr(hdr, &[IoSlice::new(packet)])
    }

    /// Writes a buffer as is: the virtio header (if the queue has one) must already lead it.
    pub fn send_raw(&self, buf: &[u8]) -> Result<usize> {
        self.send_vectored(&[IoSlice::new(buf)])
    }

    /// Writes one frame gathered from the caller's slices as they are: the virtio header (if the queue has one)
    /// must lead the first, as in a VM monitor's transmit descriptor chain. Returns the bytes written, header
    /// included.
    pub fn send_vectored(&self, bufs: &[IoSlice<'_>]) -> Result<usize> {
        self.write_gathered(bufs)
    }

    /// Writes one packet gathered from the caller's slices behind the given virtio header. Returns the packet's
    /// length written (without the header).
    pub fn send_vectored_with_hdr(&self, hdr: &VirtioNetHdrRepr, bufs: &[IoSlice<'_>]) -> Result<usize> {
        if self.vnet_hdr_len == 0 {
            return Err(Error::VnetHdrMismatch {
                name: self.name.to_string(),
                has: 0,
                needs: "use send_vectored".into(),
            });
        }
        let mut head = [0u8; MAX_VNET_HDR];
        hdr.emit(&mut head[..self.vnet_hdr_len]);
        let head = IoSlice::new(&head[..self.vnet_hdr_len]);
        let n = if bufs.len() < STACK_IOV {
            let mut iov = [IoSlice::new(&[]); STACK_IOV];
            iov[0] = head;
            iov[1..=bufs.len()].copy_from_slice(bufs);
            self.write_gathered(&iov[..=bufs.len()])?
        } else {
            self.write_gathered(&[&[head][..], bufs].concat())?
        };
        Ok(n.saturating_sub(self.vnet_hdr_len))
    }

    /// The one write every send call makes: counted (bytes without the virtio header) and its error mapped.
    fn write_gathered(&self, bufs: &[IoSlice<'_>]) -> Result<usize> {
        let n = sys::writev(self.fd.as_fd(), bufs).map_err(|e| self.tx_error("write", e))?;
        self.tx.add(1, n.saturating_sub(self.vnet_hdr_len) as u64);
        Ok(n)
    }

    /// [`Self::send_vectored`] for pieces that lie in a virtual machine's memory (the vhost-user backend's
    /// transmit path): written as they are, counted and mapped the same way.
    #[cfg(feature = "vhost-user")]
    pub(crate) fn send_guest(&self, pieces: &[sys::guest::GuestIoSlice<'_>]) -> Result<usize> {
        let n = sys::guest::writev_guest(self.fd.as_fd(), pieces).map_err(|e| self.tx_error("write", e))?;
        self.tx.add(1, n.saturating_sub(self.vnet_hdr_len) as u64);
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
        self.wait_or_stop(PollFlags::IN, None, timeout)
    }

    /// Waits until a write would not block; false on timeout.
    pub fn wait_writable(&self, timeout: Option<Duration>) -> Result<bool> {
        self.wait_or_stop(PollFlags::OUT, None, timeout)
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

    /// A second queue on the same open file (`F_DUPFD_CLOEXEC`): same device, framing and offloads view, counters
    /// of its own. Both must be closed for the fd to go.
    pub fn try_clone(&self) -> Result<Queue> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|e| Error::io(format!("duplicating queue {} of {}", self.index, self.name), e))?;
        let mut clone = Queue::new(fd, self.name.clone(), self.index, self.mode, self.vnet_hdr_len, Offloads::NONE);
        clone.offloads = self.offloads.clone();
        clone.flow_steered = self.flow_steered.clone();
        clone.packet_info = self.packet_info;
        Ok(clone)
    }

    /// `TUNSETVNETLE`: read and write the virtio header little-endian whatever the host's order (a legacy,
    /// pre-1.0 guest on a big-endian host). On little-endian hosts it changes nothing.
    pub fn set_vnet_le(&self, on: bool) -> Result<()> {
        sys::tun_set_vnet_endian(self.fd.as_fd(), false, on).map_err(|e| Error::io("TUNSETVNETLE", e))
    }

    /// `TUNGETVNETLE`.
    pub fn vnet_le(&self) -> Result<bool> {
        sys::tun_get_vnet_endian(self.fd.as_fd(), false).map_err(|e| Error::io("TUNGETVNETLE", e))
    }

    /// `TUNSETVNETBE`: a big-endian virtio header on a little-endian host (a legacy big-endian guest). Only kernels
    /// built with `CONFIG_TUN_VNET_CROSS_LE` have it; others answer [`Error::Unsupported`].
    pub fn set_vnet_be(&self, on: bool) -> Result<()> {
        sys::tun_set_vnet_endian(self.fd.as_fd(), true, on).map_err(vnet_be_error)
    }

    /// `TUNGETVNETBE` ([`Error::Unsupported`] as for [`Self::set_vnet_be`]).
    pub fn vnet_be(&self) -> Result<bool> {
        sys::tun_get_vnet_endian(self.fd.as_fd(), true).map_err(vnet_be_error)
    }

    /// The device's MTU (`SIOCGIFMTU` on a socket of the calling thread's network namespace, where the device
    /// must be: no netlink, for a jailed process that may not use it).
    pub fn mtu(&self) -> Result<u32> {
        let sock = sys::ioctl_socket().map_err(|e| Error::io("opening a socket for interface ioctls", e))?;
        sys::ifreq_get_mtu(sock.as_fd(), &self.name).map_err(|e| self.link_error("SIOCGIFMTU", e))
    }

    /// Sets the device's MTU (`SIOCSIFMTU`; CAP_NET_ADMIN in the device's namespace; see [`Self::mtu`]).
    pub fn set_mtu(&self, mtu: u32) -> Result<()> {
        let sock = sys::ioctl_socket().map_err(|e| Error::io("opening a socket for interface ioctls", e))?;
        sys::ifreq_set_mtu(sock.as_fd(), &self.name, mtu).map_err(|e| self.link_error("SIOCSIFMTU", e))
    }

    /// Whether the device is administratively up (`SIOCGIFFLAGS`; see [`Self::mtu`]).
    pub fn is_up(&self) -> Result<bool> {
        let sock = sys::ioctl_socket().map_err(|e| Error::io("opening a socket for interface ioctls", e))?;
        let flags = sys::ifreq_get_flags(sock.as_fd(), &self.name).map_err(|e| self.link_error("SIOCGIFFLAGS", e))?;
        Ok(flags & libc::IFF_UP as u16 != 0)
    }

    /// Brings the device up or down (`SIOCGIFFLAGS`, then `SIOCSIFFLAGS` with only `IFF_UP` changed, so that the
    /// other flags stay as they are; CAP_NET_ADMIN; see [`Self::mtu`]).
    pub fn set_up(&self, up: bool) -> Result<()> {
        let sock = sys::ioctl_socket().map_err(|e| Error::io("opening a socket for interface ioctls", e))?;
        let flags = sys::ifreq_get_flags(sock.as_fd(), &self.name).map_err(|e| self.link_error("SIOCGIFFLAGS", e))?;
        let up_bit = libc::IFF_UP as u16;
        let flags = if up { flags | up_bit } else { flags & !up_bit };
        sys::ifreq_set_flags(sock.as_fd(), &self.name, flags).map_err(|e| self.link_error("SIOCSIFFLAGS", e))
    }

    /// A TAP device's MAC address (`SIOCGIFHWADDR` on the queue's own fd: any namespace, no socket).
    pub fn mac(&self) -> Result<[u8; 6]> {
        sys::tun_get_hwaddr(self.fd.as_fd()).map_err(|e| self.link_error("SIOCGIFHWADDR", e))
    }

    /// Sets a TAP device's MAC address (`SIOCSIFHWADDR` on the queue's own fd). A TUN device has none.
    pub fn set_mac(&self, mac: [u8; 6]) -> Result<()> {
        if self.mode != Mode::Tap {
            return Err(Error::NotTap { name: self.name.to_string(), what: "MAC addresses" });
        }
        sys::tun_set_hwaddr(self.fd.as_fd(), mac).map_err(|e| self.link_error("SIOCSIFHWADDR", e))
    }

    fn link_error(&self, request: &'static str, e: std::io::Error) -> Error {
        match e.raw_os_error() {
            Some(libc::ENODEV) => Error::NoSuchDevice { name: self.name.to_string() },
            Some(libc::EPERM) | Some(libc::EACCES) => {
                Error::PermissionDenied { action: format!("{request} on {}", self.name), source: e }
            }
            _ => Error::io(format!("{request} on {}", self.name), e),
        }
    }

    /// Waits until a read would not block, `timeout` passes (false) or `stop` fires (false): a wait that a stop
    /// ends at once, with no signal (see [`StopHandle::wake_fd`](crate::StopHandle::wake_fd)).
    pub fn wait_readable_or_stop(&self, stop: &crate::stop::StopHandle, timeout: Option<Duration>) -> Result<bool> {
        self.wait_or_stop(PollFlags::IN, Some(stop), timeout)
    }

    /// Like [`Self::wait_readable_or_stop`] for room to write.
    pub fn wait_writable_or_stop(&self, stop: &crate::stop::StopHandle, timeout: Option<Duration>) -> Result<bool> {
        self.wait_or_stop(PollFlags::OUT, Some(stop), timeout)
    }

    /// Waits for `events` on the queue and, with a stop handle, for its wake fd (see [`crate::stop::wait_or_stop`]).
    pub(crate) fn wait_or_stop(
        &self,
        events: PollFlags,
        stop: Option<&crate::stop::StopHandle>,
        timeout: Option<Duration>,
    ) -> Result<bool> {
        crate::stop::wait_or_stop(self.fd.as_fd(), events, stop, timeout)
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

impl From<Queue> for OwnedFd {
    /// The queue's fd, which the caller owns from now on (e.g. to hand it to another process or to
    /// [`Queue::from_fd`] later).
    fn from(queue: Queue) -> OwnedFd {
        queue.fd
    }
}

impl IntoRawFd for Queue {
    /// The queue's fd as a raw number, which the caller must close (or give back to [`Queue::from_fd`] through
    /// `OwnedFd::from_raw_fd`).
    fn into_raw_fd(self) -> RawFd {
        self.fd.into_raw_fd()
    }
}

fn vnet_be_error(e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::EINVAL) => Error::Unsupported { feature: "big-endian virtio headers (CONFIG_TUN_VNET_CROSS_LE)" },
        _ => Error::io("TUNSETVNETBE", e),
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
