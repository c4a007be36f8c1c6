//! smoltcp's [`phy::Device`] over a queue, with the offloads underneath: a userspace
//! TCP/IP stack that sees MTU-sized packets while the kernel hands over and takes super-packets.
//!
//! - **Up**: reads go through a [`RecvBatch`], so a TSO/USO super-packet the kernel hands over is split into
//!   MTU-sized segments before smoltcp sees one; a batch of packets costs one read each, or fewer.
//! - **Down**: what smoltcp transmits is collected into a [`SendBatch`] and written when the batch is full or at
//!   [`QueueDevice::flush`] (which [`QueueDevice::poll`] calls after each [`Interface::poll`]): consecutive
//!   segments of one TCP flow are coalesced into one super-packet write.
//! - **Checksums**: smoltcp is told to verify no TCP or UDP checksum. The adapter verifies every packet its batch
//!   does not vouch for ([`crate::Checksums::Valid`] means the kernel or the split already did) and drops one that
//!   does not add up, counted as [`DropReason::BadChecksum`]. On a queue with a virtio header smoltcp computes no
//!   TCP or UDP checksum either: the adapter writes the pseudo-header sum and the kernel completes the rest
//!   (`NEEDS_CSUM`), so no payload byte is summed in userspace in either direction. IPv4 header and ICMP
//!   checksums stay with smoltcp.
//!
//! A packet whose checksum cannot be found from the packet alone (an IPv4 fragment, IPv6 extension headers, a
//! frame longer than its IP length) is handed up as it came, counted in [`QueueDevice::unverified`].
//!
//! The queue is put in non-blocking mode: `Device::receive` must never sleep. Wait for work between polls with
//! [`QueueDevice::wait`].

use std::borrow::Borrow;
use std::time::Duration;

use ::smoltcp::iface::{Interface, PollResult, SocketSet};
use ::smoltcp::phy::{self, Checksum, ChecksumCapabilities, DeviceCapabilities, Medium};
use ::smoltcp::time::Instant;
use turbotun_wire::{partial, Checksums, Framing};

use crate::dataplane::batch::{Batch, RecvBatch, SendBatch, Sent, BATCH_SIZE};
use crate::dataplane::stats::{Counters, DropReason};
use crate::devices::mode::Mode;
use crate::devices::queue::Queue;
use crate::error::{Error, Result};
use crate::stop::StopHandle;

/// smoltcp's device over one queue. `Q` holds the queue for both halves: `&Queue` or `Arc<Queue>`.
pub struct QueueDevice<Q: Borrow<Queue> + Clone> {
    rx: RxSide<Q>,
    tx: TxSide<Q>,
    caps: DeviceCapabilities,
    stop: Option<StopHandle>,
}

struct RxSide<Q: Borrow<Queue>> {
    batch: RecvBatch<Q>,
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    /// `bufs[next..ready]` hold packets read and not yet handed to smoltcp.
    next: usize,
    ready: usize,
    checksums: Checksums,
    offset: usize,
    framing: Framing,
    bad_checksum: u64,
    unverified: u64,
    /// A read failed for a reason other than "nothing to read": smoltcp cannot be told, so it waits here for
    /// [`QueueDevice::flush`].
    error: Option<Error>,
}

struct TxSide<Q: Borrow<Queue>> {
    batch: SendBatch<Q>,
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    queued: usize,
    offset: usize,
    framing: Framing,
    /// smoltcp leaves TCP and UDP checksums to us and the kernel completes them (`NEEDS_CSUM`).
    partial: bool,
    error: Option<Error>,
}

impl<Q: Borrow<Queue> + Clone> std::fmt::Debug for QueueDevice<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueDevice")
            .field("queue", &self.queue().name())
            .field("medium", &self.caps.medium)
            .field("mtu", &self.caps.max_transmission_unit)
            .field("waiting_rx", &(self.rx.ready - self.rx.next))
            .field("queued_tx", &self.tx.queued)
            .finish()
    }
}

impl<Q: Borrow<Queue> + Clone> QueueDevice<Q> {
    /// A device over `queue`: medium from its mode (TUN: `Medium::Ip`, TAP: `Medium::Ethernet`), MTU from the
    /// device (plus the Ethernet header on TAP), checksum capabilities from its virtio header. Puts the queue in
    /// non-blocking mode.
    pub fn new(queue: Q) -> Result<Self> {
        let q: &Queue = queue.borrow();
        if q.packet_info() {
            return Err(Error::PacketInfo { name: q.name().to_string(), user: "the smoltcp adapter" });
        }
        q.set_nonblocking(true)?;
        let ip_mtu = q.mtu()? as usize;
        let (medium, mtu) = match q.mode() {
            Mode::Tun => (Medium::Ip, ip_mtu),
            Mode::Tap => (Medium::Ethernet, ip_mtu + turbotun_wire::ethernet::HEADER_LEN),
        };
        let offset = q.vnet_hdr_len();
        let framing = q.mode().framing();
        let partial = offset > 0;
        let mut checksum = ChecksumCapabilities::default();
        let l4 = if partial { Checksum::None } else { Checksum::Tx };
        checksum.tcp = l4;
        checksum.udp = l4;
        let mut caps = DeviceCapabilities::default();
        caps.medium = medium;
        caps.max_transmission_unit = mtu;
        caps.checksum = checksum;
        // Link-layer bytes a TAP frame may carry in front of an MTU-sized packet: Ethernet with two VLAN tags.
        let size = offset + ip_mtu + turbotun_wire::ethernet::MAX_HEADER_LEN;
        let rx = RxSide {
            batch: RecvBatch::new(queue.clone()),
            bufs: vec![vec![0; size]; BATCH_SIZE],
            lens: vec![0; BATCH_SIZE],
            next: 0,
            ready: 0,
            checksums: Checksums::Unverified,
            offset,
            framing,
            bad_checksum: 0,
            unverified: 0,
            error: None,
        };
        let tx = TxSide {
            batch: SendBatch::new(queue),
            bufs: vec![vec![0; size]; BATCH_SIZE],
            lens: vec![0; BATCH_SIZE],
            queued: 0,
            offset,
            framing,
            partial,
            error: None,
        };
        Ok(QueueDevice { rx, tx, caps, stop: None })
    }

    /// [`Self::wait`] ends at once when `stop` fires.
    pub fn stop_on(mut self, stop: StopHandle) -> Self {
        self.stop = Some(stop);
        self
    }

    /// The queue underneath.
    pub fn queue(&self) -> &Queue {
        self.rx.batch.queue()
    }

    /// Runs `iface.poll` over this device, lets the sockets transmit until they have nothing more or a batch is
    /// full, and [`Self::flush`]es what they transmitted.
    ///
    /// smoltcp's own poll sends at most one packet per socket; the extra egress passes here put a socket's run of
    /// segments into one batch, which is what lets them be coalesced into one write.
    pub fn poll(&mut self, iface: &mut Interface, sockets: &mut SocketSet<'_>, now: Instant) -> Result<PollResult> {
        let mut result = iface.poll(now, self, sockets);
        for _ in 1..BATCH_SIZE {
            if iface.poll_egress(now, self, sockets) == PollResult::None {
                break;
            }
            result = PollResult::SocketStateChanged;
        }
        self.flush()?;
        Ok(result)
    }

    /// Writes the packets smoltcp has transmitted since the last flush (coalesced where they can be), and reports
    /// a read or write error met on the way (smoltcp's device interface has no room for one).
    pub fn flush(&mut self) -> Result<Sent> {
        if let Some(e) = self.rx.error.take() {
            return Err(e);
        }
        let sent = self.tx.flush();
        match self.tx.error.take() {
            Some(e) => Err(e),
            None => Ok(sent),
        }
    }

    /// Waits until the queue has packets to read or `timeout` passes (`None`: forever; give it
    /// `iface.poll_delay(..)` so that smoltcp's timers run), or the stop handle fires. Returns at once when packets
    /// read earlier are still waiting. Returns whether there is something to read.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        if self.rx.next < self.rx.ready || self.rx.batch.pending() > 0 {
            return Ok(true);
        }
        match &self.stop {
            Some(stop) => self.queue().wait_readable_or_stop(stop, timeout),
            None => self.queue().wait_readable(timeout),
        }
    }

    /// What the receive half read and dropped, this adapter's checksum drops included.
    pub fn rx_stats(&self) -> Counters {
        let mut c = self.rx.batch.stats();
        c.drops.add(DropReason::BadChecksum, self.rx.bad_checksum);
        c
    }

    /// What the send half wrote and dropped.
    pub fn tx_stats(&self) -> Counters {
        self.tx.batch.stats()
    }

    /// TCP or UDP packets handed to smoltcp whose checksum could not be found to verify (see the module
    /// documentation).
    pub fn unverified(&self) -> u64 {
        self.rx.unverified
    }
}

impl<Q: Borrow<Queue>> RxSide<Q> {
    /// The index of the next packet to hand up, reading a batch when none is left; `None` when there is nothing
    /// to read (or a read failed: the error waits in `self.error`).
    fn next_packet(&mut self) -> Option<usize> {
        loop {
            if self.next == self.ready {
                if self.error.is_some() {
                    return None;
                }
                match self.batch.try_recv_many(&mut Batch::new(&mut self.bufs, &mut self.lens, self.offset)) {
                    Ok(got) => {
                        (self.next, self.ready, self.checksums) = (0, got.packets, got.checksums);
                        if got.packets == 0 {
                            return None;
                        }
                    }
                    Err(e) if e.is_would_block() || e.is_interrupted() => return None,
                    Err(e) => {
                        self.error = Some(e);
                        return None;
                    }
                }
            }
            let i = self.next;
            self.next += 1;
            if self.checksums == Checksums::Valid {
                return Some(i);
            }
            // Unverified (a partial checksum never comes: partial_checksums is off).
            match partial::verify(&self.bufs[i][self.offset..self.offset + self.lens[i]], self.framing) {
                Some(true) => return Some(i),
                Some(false) => self.bad_checksum += 1,
                None => {
                    self.unverified += u64::from(is_tcp_or_udp(&self.bufs[i][self.offset..], self.framing));
                    return Some(i);
                }
            }
        }
    }
}

/// Whether a packet may carry TCP or UDP: by its IP protocol, or an IPv6 extension header that may lead to one.
fn is_tcp_or_udp(packet: &[u8], framing: Framing) -> bool {
    let Ok((l3, version)) = turbotun_wire::locate_ip(packet, framing) else {
        return false;
    };
    let proto = match version {
        4 => packet.get(l3 + 9),
        _ => packet.get(l3 + 6),
    };
    // TCP, UDP; IPv6 hop-by-hop, routing, fragment and destination options.
    matches!(proto.copied(), Some(6 | 17 | 0 | 43 | 44 | 60))
}

impl<Q: Borrow<Queue>> TxSide<Q> {
    /// Writes what is queued; a write error is kept for [`QueueDevice::flush`] (the packets it lost are counted
    /// by the send half).
    fn flush(&mut self) -> Sent {
        if self.queued == 0 {
            return Sent::default();
        }
        let n = std::mem::take(&mut self.queued);
        let checksums = if self.partial { Checksums::Partial } else { Checksums::Valid };
        match self.batch.send_many(&mut Batch::new(&mut self.bufs[..n], &mut self.lens[..n], self.offset), checksums) {
            Ok(sent) => sent,
            Err(e) => {
                self.error.get_or_insert(e);
                Sent::default()
            }
        }
    }
}

impl<Q: Borrow<Queue>> Drop for TxSide<Q> {
    /// Packets smoltcp transmitted are written, not lost with the device.
    fn drop(&mut self) {
        self.flush();
    }
}

/// One packet read, handed to smoltcp.
#[derive(Debug)]
pub struct QueueRxToken<'a> {
    packet: &'a [u8],
}

impl phy::RxToken for QueueRxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.packet)
    }
}

/// Room for one packet in the send batch.
pub struct QueueTxToken<'a, Q: Borrow<Queue>> {
    tx: &'a mut TxSide<Q>,
}

impl<Q: Borrow<Queue>> std::fmt::Debug for QueueTxToken<'_, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueTxToken").field("queued", &self.tx.queued).finish()
    }
}

impl<Q: Borrow<Queue>> phy::TxToken for QueueTxToken<'_, Q> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let tx = self.tx;
        let end = tx.offset + len;
        let buf = &mut tx.bufs[tx.queued];
        if buf.len() < end {
            // smoltcp keeps to the MTU it was given; a larger packet still goes out whole.
            buf.resize(end, 0);
        }
        let result = f(&mut buf[tx.offset..end]);
        if tx.partial {
            // smoltcp left a zero where the checksum goes; the pseudo-header sum there lets the kernel finish it.
            partial::make_partial(&mut buf[tx.offset..end], tx.framing);
        }
        tx.lens[tx.queued] = len;
        tx.queued += 1;
        if tx.queued == tx.bufs.len() {
            tx.flush();
        }
        result
    }
}

impl<Q: Borrow<Queue> + Clone> phy::Device for QueueDevice<Q> {
    type RxToken<'a>
        = QueueRxToken<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = QueueTxToken<'a, Q>
    where
        Self: 'a;

    fn receive(&mut self, _now: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let i = self.rx.next_packet()?;
        let packet = &self.rx.bufs[i][self.rx.offset..self.rx.offset + self.rx.lens[i]];
        Some((QueueRxToken { packet }, QueueTxToken { tx: &mut self.tx }))
    }

    fn transmit(&mut self, _now: Instant) -> Option<Self::TxToken<'_>> {
        Some(QueueTxToken { tx: &mut self.tx })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        self.caps.clone()
    }
}
