//! The virtio-net device behind one vhost-user connection: `vhost-user-backend` runs the protocol and one worker
//! thread per queue pair, which sleeps in `epoll` on its pair's kick eventfds and its own TAP queue's fd and calls
//! [`NetBackend::handle_event`] when one of them fires. Queue pair `i` (virtqueues `2i`, `2i+1`) is served by
//! worker thread `i` on TAP queue `i`; nothing is shared between pairs but the negotiated features.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringState, VringT};
use virtio_queue::{DescriptorChain, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier};

use turbotun_wire::virtio_net::{features as f, gso, VirtioNetHdrRepr, VIRTIO_NET_HDR_LEN, VIRTIO_NET_HDR_V1_LEN};

use super::chain::{copy_spans, guest_pieces, take_header, writable_spans, write_spans, Span};
use super::features::{bit, feature_names, VERSION_1};
use super::VhostUserStats;
use crate::dataplane::stats::{Counters, DropReason, WhenFull};
use crate::dataplane::write_policy::{lost_with, on_write_error, WriteFailure};
use crate::devices::offloads::Offloads;
use crate::devices::queue::{Queue, MAX_PACKET};
use crate::sys::guest::GuestIoSlice;

/// The guest's memory as vhost-user-backend hands it over (replaced whole on every memory table update).
pub(crate) type GuestMem = GuestMemoryAtomic<GuestMemoryMmap<()>>;

/// The TAP's virtio header: `virtio_net_hdr_v1`, whose `num_buffers` the guest's receive side needs.
pub(crate) const TAP_VNET_HDR: usize = VIRTIO_NET_HDR_V1_LEN;

/// A queue pair's virtqueues, as the pair's worker numbers them (and virtqueue `2i + RX`, `2i + TX` overall):
/// receive (even) and transmit (odd).
const RX: usize = 0;
const TX: usize = 1;

/// Most queue pairs a backend serves: one worker thread and one TAP queue each.
pub const MAX_QUEUE_PAIRS: usize = 16;

/// Largest ring the backend accepts (QEMU's and DPDK's default is 256, QEMU's maximum 1024).
pub(crate) const MAX_QUEUE_SIZE: usize = 1024;

/// Bytes a frame and its header may take in the bounce buffers: a 64 KiB super-packet with its Ethernet header.
const FRAME_BUF: usize = TAP_VNET_HDR + MAX_PACKET;

/// Guest frames up to this long are copied out and written from the copy; longer ones (super-packets) are
/// written from guest memory with one gathered write. A copy of a frame of a 1500-byte MTU costs less than
/// looking its pieces up in the memory map and handing the kernel more iovecs.
const COPY_UP_TO: usize = 2048;

/// Pieces one gathered write of a guest frame takes at most: its header and 63 pieces of guest memory (a Linux
/// guest's super-packet is a linear part and at most 17 page fragments); a frame in more is copied.
const MAX_PIECES: usize = 64;

/// What the guest acknowledged, as the data path needs it.
#[derive(Debug, Clone, Copy, Default)]
struct Negotiated {
    features: u64,
    /// The header in front of every frame in guest memory: 12 bytes with `VERSION_1` or `MRG_RXBUF`, else the
    /// legacy 10.
    hdr_len: usize,
    mergeable: bool,
}

impl Negotiated {
    fn new(features: u64) -> Negotiated {
        let has = |n: u32| features & bit(n) != 0;
        let hdr_len = if has(VERSION_1) || has(f::MRG_RXBUF) { VIRTIO_NET_HDR_V1_LEN } else { VIRTIO_NET_HDR_LEN };
        Negotiated { features, hdr_len, mergeable: has(f::MRG_RXBUF) }
    }

    fn has(&self, n: u32) -> bool {
        self.features & bit(n) != 0
    }

    /// Whether the guest may send a frame with this header: a GSO type only with the feature that allows it,
    /// a partial checksum only with `CSUM` (virtio 5.1.6.2: the driver must not set them otherwise).
    fn allows(&self, hdr: &VirtioNetHdrRepr) -> bool {
        let gso_ok = match hdr.gso_kind() {
            gso::NONE => true,
            gso::TCPV4 => self.has(f::HOST_TSO4),
            gso::TCPV6 => self.has(f::HOST_TSO6),
            gso::UDP => self.has(f::HOST_UFO),
            gso::UDP_L4 => self.has(f::HOST_USO),
            _ => false,
        };
        let ecn_ok = hdr.gso_type & gso::ECN == 0 || self.has(f::HOST_ECN);
        gso_ok && ecn_ok && (!hdr.needs_csum() || self.has(f::CSUM))
    }
}

/// Guest to TAP, one queue pair's: the buffers a frame is checked and written from, and its counters.
#[derive(Debug)]
struct TxPath {
    /// The guest's header of the frame being sent, copied out to be checked and written.
    hdr: [u8; TAP_VNET_HDR],
    /// Where the frame being sent lies in guest memory.
    spans: Vec<Span>,
    /// A frame copied out of guest memory, behind its header.
    buf: Vec<u8>,
    to_tap: Counters,
}

/// TAP to guest, one queue pair's: a frame read from the TAP that waits for the guest's receive buffers, the
/// buffers gathered for it so far, and the counters.
#[derive(Debug)]
struct RxPath {
    /// The frame read from the TAP (behind room for the guest's header).
    buf: Vec<u8>,
    /// Bytes of `buf` (from `start`) to hand the guest: its header, then the frame.
    pending: Option<(usize, usize)>,
    /// Receive chains taken from the ring and not yet given back: head index, capacity, and their spans.
    chains: VecDeque<(u16, usize, Vec<Span>)>,
    /// Whether `chains` are the last ones taken from the ring, in order (no chain after them was given back
    /// early), so that a stopped ring can be rewound over them.
    contiguous: bool,
    /// Spans of a chain being checked, reused.
    spare_spans: Vec<Span>,
    to_guest: Counters,
}

/// The data path's state, used by one worker thread at a time.
struct Worker {
    negotiated: Negotiated,
    tx: TxPath,
    rx: RxPath,
    /// The receive vring, kept from the first event so that [`NetBackend::stop_vring`] can hand unused
    /// buffers back.
    rx_vring: Option<VringRwLock>,
}

/// A TAP queue that serves one queue pair, and whether the kernel steers frames to it. A pair the guest has
/// not enabled has its TAP queue detached, so that no frame waits where no worker will take it to a guest; the
/// state outlives a connection, as the queue does.
#[derive(Debug)]
pub(crate) struct TapQueue {
    pub(crate) queue: Queue,
    attached: AtomicBool,
}

impl TapQueue {
    /// A queue as it comes from opening the device: attached.
    pub(crate) fn new(queue: Queue) -> TapQueue {
        TapQueue { queue, attached: AtomicBool::new(true) }
    }

    /// Attaches or detaches the queue (`TUNSETQUEUE`) when that changes; queue 0 stays attached, since a
    /// multiqueue device needs one.
    fn steer_here(&self, index: usize, attach: bool) {
        if index == 0 || self.attached.swap(attach, Ordering::Relaxed) == attach {
            return;
        }
        let result = if attach { self.queue.attach() } else { self.queue.detach() };
        match result {
            Ok(()) => tracing::debug!(tap = self.queue.name(), queue = index, attach, "TAP queue steering"),
            Err(e) => tracing::warn!("{e}"),
        }
    }
}

/// One queue pair: its TAP queue and the state of the worker thread that serves it.
struct Pair {
    tap: Arc<TapQueue>,
    worker: Mutex<Worker>,
}

impl Pair {
    fn worker(&self) -> MutexGuard<'_, Worker> {
        // A worker that panicked left counters and buffers that are still usable.
        self.worker.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Worker {
    fn new() -> Worker {
        Worker {
            negotiated: Negotiated::new(0),
            tx: TxPath {
                hdr: [0; TAP_VNET_HDR],
                spans: Vec::with_capacity(MAX_PIECES),
                buf: vec![0; FRAME_BUF],
                to_tap: Counters::default(),
            },
            rx: RxPath {
                buf: vec![0; FRAME_BUF],
                pending: None,
                chains: VecDeque::new(),
                contiguous: true,
                spare_spans: Vec::new(),
                to_guest: Counters::default(),
            },
            rx_vring: None,
        }
    }
}

impl TxPath {
    /// Writes the frame a transmit chain holds to the TAP, or counts why not: its header copied out and checked,
    /// then a frame of up to [`COPY_UP_TO`] bytes copied behind it into the path's buffer and written (a copy that
    /// small costs less than gathering it), a longer one (a super-packet) written from guest memory where it
    /// lies, behind the checked header, with one gathered write; one of more pieces than that write takes is
    /// copied too.
    fn transmit(
        &mut self,
        tap: &Queue,
        negotiated: Negotiated,
        chain: DescriptorChain<&GuestMemoryMmap<()>>,
        mem: &GuestMemoryMmap<()>,
    ) {
        let TxPath { hdr: hdr_buf, spans, buf: copy_buf, to_tap: c } = self;
        c.reads += 1;
        let frame = match take_header(chain, mem, hdr_buf, negotiated.hdr_len, MAX_PACKET, spans) {
            Ok(frame) => frame,
            Err(reason) => return c.drops.add(reason, 1),
        };
        if frame.hdr_read < negotiated.hdr_len {
            return c.drops.add(DropReason::Malformed, 1);
        }
        let Some(hdr) = checked_header(negotiated, hdr_buf, frame.frame_len) else {
            return c.drops.add(DropReason::Malformed, 1);
        };
        if frame.frame_len > COPY_UP_TO {
            let mut pieces = [GuestIoSlice::EMPTY; MAX_PIECES];
            match guest_pieces(mem, &hdr_buf[..], spans, &mut pieces) {
                Ok(Some(count)) => {
                    return write_frame(tap, &hdr, frame.frame_len, c, || tap.send_guest(&pieces[..count]));
                }
                Ok(None) => {}
                Err(reason) => return c.drops.add(reason, 1),
            }
        }
        let len = TAP_VNET_HDR + frame.frame_len;
        copy_buf[..TAP_VNET_HDR].copy_from_slice(&hdr_buf[..]);
        if let Err(reason) = copy_spans(mem, spans, &mut copy_buf[TAP_VNET_HDR..len]) {
            return c.drops.add(reason, 1);
        }
        let frame_bytes = &copy_buf[..len];
        write_frame(tap, &hdr, frame.frame_len, c, || tap.send_raw(frame_bytes));
    }
}

impl RxPath {
    /// Hands frames from the TAP to the guest while it has buffers for them.
    fn receive(
        &mut self,
        tap: &Queue,
        negotiated: Negotiated,
        state: &mut VringState<GuestMem>,
        mem: &GuestMemoryMmap<()>,
        used: &mut bool,
    ) -> Receive {
        loop {
            if self.pending.is_none() {
                match self.read_tap(tap, negotiated) {
                    Some(frame) => self.pending = Some(frame),
                    None => return Receive::TapEmpty,
                }
            }
            let Some((start, len)) = self.pending else { continue };
            let rx = &mut *self;
            let fits = match rx.gather(negotiated, len, state, mem, used) {
                Ok(fits) => fits,
                Err(out_of_buffers) => return out_of_buffers,
            };
            if rx.pending.is_none() {
                continue;
            }
            let Some(count) = fits else {
                rx.to_guest.drops.add(DropReason::TooBig, 1);
                rx.pending = None;
                continue;
            };
            let frame = &mut rx.buf[start..start + len];
            if negotiated.hdr_len == VIRTIO_NET_HDR_V1_LEN {
                frame[VIRTIO_NET_HDR_LEN..VIRTIO_NET_HDR_V1_LEN].copy_from_slice(&(count as u16).to_le_bytes());
            }
            let super_packet = VirtioNetHdrRepr::parse(frame).is_ok_and(|h| h.is_gso());
            let mut written = 0;
            let mut fault = None;
            for _ in 0..count {
                let Some((head, _, spans)) = rx.chains.pop_front() else { break };
                let n = match write_spans(mem, &spans, &frame[written..]) {
                    Ok(n) => n,
                    Err(reason) => {
                        fault = Some(reason);
                        0
                    }
                };
                written += n;
                if let Err(e) = state.add_used(head, n as u32) {
                    tracing::debug!("receive queue: using chain {head}: {e}");
                }
                *used = true;
            }
            if rx.chains.is_empty() {
                rx.contiguous = true;
            }
            rx.pending = None;
            match fault {
                Some(reason) => rx.to_guest.drops.add(reason, 1),
                None => {
                    rx.to_guest.packets += 1;
                    rx.to_guest.writes += 1;
                    rx.to_guest.bytes += (len - negotiated.hdr_len) as u64;
                    if super_packet {
                        rx.to_guest.super_packets += 1;
                    }
                }
            }
        }
    }

    /// Gathers receive chains until the pending frame of `len` bytes fits: one chain without mergeable buffers, as
    /// many as it takes with. How many chains it takes; `None` when they cannot hold it (one chain too short, kept
    /// for the next frame) or a bad buffer dropped the frame (then nothing is pending); `Err` when the ring ran out.
    fn gather(
        &mut self,
        negotiated: Negotiated,
        len: usize,
        state: &mut VringState<GuestMem>,
        mem: &GuestMemoryMmap<()>,
        used: &mut bool,
    ) -> Result<Option<usize>, Receive> {
        loop {
            let mut capacity = 0;
            let mut chains = 0;
            for (_, cap, _) in self.chains.iter() {
                capacity += cap;
                chains += 1;
                if capacity >= len || !negotiated.mergeable {
                    break;
                }
            }
            if chains > 0 && capacity >= len {
                return Ok(Some(chains));
            }
            if chains > 0 && !negotiated.mergeable {
                // The one chain is too short for this frame: it is kept for the next one.
                return Ok(None);
            }
            let Some(chain) = state.get_queue_mut().pop_descriptor_chain(mem) else {
                return Err(Receive::NoBuffers);
            };
            let head = chain.head_index();
            self.spare_spans.clear();
            match writable_spans(chain, mem, &mut self.spare_spans) {
                Ok(cap) => self.chains.push_back((head, cap, std::mem::take(&mut self.spare_spans))),
                Err(reason) => {
                    // The bad buffer goes back empty at once; the frame it was meant for is dropped.
                    if let Err(e) = state.add_used(head, 0) {
                        tracing::debug!("receive queue: returning chain {head}: {e}");
                    }
                    *used = true;
                    self.contiguous = false;
                    self.to_guest.drops.add(reason, 1);
                    self.pending = None;
                    return Ok(None);
                }
            }
        }
    }

    /// Reads the next frame from the TAP queue into the receive buffer: where the guest's header and frame start in
    /// it and how long they are, or None when the TAP has nothing (or failed).
    fn read_tap(&mut self, tap: &Queue, negotiated: Negotiated) -> Option<(usize, usize)> {
        loop {
            let n = match tap.recv_raw(&mut self.buf) {
                Ok(n) => n,
                Err(e) if e.is_interrupted() => continue,
                Err(e) if e.is_would_block() => return None,
                Err(e) => {
                    tracing::warn!("reading {}: {e}", tap.name());
                    return None;
                }
            };
            self.to_guest.reads += 1;
            if n > self.buf.len() {
                self.to_guest.drops.add(DropReason::TooBig, 1);
                continue;
            }
            if n < TAP_VNET_HDR {
                self.to_guest.drops.add(DropReason::Malformed, 1);
                continue;
            }
            // A legacy guest's header is the first 10 bytes: moved up to sit right before the frame.
            let start = TAP_VNET_HDR - negotiated.hdr_len;
            if start > 0 {
                self.buf.copy_within(..negotiated.hdr_len, start);
            }
            return Some((start, n - start));
        }
    }
}

/// One connection's virtio-net device over a TAP's queues, one per queue pair.
pub(crate) struct NetBackend {
    pairs: Vec<Pair>,
    features: u64,
    mem: GuestMem,
    stats: Arc<VhostUserStats>,
}

impl std::fmt::Debug for NetBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetBackend")
            .field("tap", &self.pairs[0].tap.queue.name())
            .field("queue_pairs", &self.pairs.len())
            .field("features", &self.features)
            .finish()
    }
}

impl NetBackend {
    /// A device over `taps` (one queue each, at least one) for one connection. Every TAP queue but the first is
    /// detached until the guest enables its pair.
    pub(crate) fn new(taps: &[Arc<TapQueue>], features: u64, mem: GuestMem, stats: Arc<VhostUserStats>) -> NetBackend {
        let pairs = taps
            .iter()
            .enumerate()
            .map(|(index, tap)| {
                tap.steer_here(index, false);
                Pair { tap: tap.clone(), worker: Mutex::new(Worker::new()) }
            })
            .collect();
        NetBackend { pairs, features, mem, stats }
    }

    /// The event a pair's TAP queue is registered under in its worker's epoll: above the virtqueues and the exit
    /// event, which vhost-user-backend numbers `0..=num_queues`.
    pub(crate) fn tap_event(&self) -> u16 {
        (self.num_queues() + 1) as u16
    }

    /// The TAP queues' fds, one per worker thread in order, for their epolls.
    pub(crate) fn tap_fds(&self) -> impl Iterator<Item = std::os::fd::RawFd> + '_ {
        self.pairs.iter().map(|pair| pair.tap.queue.as_raw_fd())
    }

    /// Sets the TAP's offloads (one setting for the device, whichever queue sets it) to what the guest takes; a
    /// combination the kernel refuses leaves none, which the guest takes too (whole frames with complete
    /// checksums).
    fn apply_offloads(&self, features: u64) {
        let tap = &self.pairs[0].tap.queue;
        let offloads = Offloads::for_guest_features(u128::from(features));
        match tap.set_offloads(offloads) {
            // Said at the default level when a guest negotiates, as DPDK's backend says its features.
            Ok(()) if features != 0 => tracing::info!(
                "{}: the guest took virtio features {} (0x{features:x}); TAP offloads {offloads}",
                tap.name(),
                feature_names(features)
            ),
            Ok(()) => tracing::debug!(tap = tap.name(), "offloads reset"),
            Err(e) => {
                tracing::warn!(tap = tap.name(), "{e}; the guest gets whole frames");
                let _ = tap.set_offloads(Offloads::NONE);
            }
        }
    }

    /// Ends the connection's data path: a frame still waiting for guest buffers is counted as stopped, the
    /// counters are added to the shared ones, and the TAP hands out no more super-packets for a guest that is
    /// gone.
    pub(crate) fn finish(&self) {
        for (index, pair) in self.pairs.iter().enumerate() {
            let mut w = pair.worker();
            if w.rx.pending.take().is_some() {
                w.rx.to_guest.drops.add(DropReason::Stopped, 1);
            }
            flush(&mut w, &self.stats, index);
            w.rx_vring = None;
            drop(w);
            // No guest, no pair in use: frames go to queue 0 until the next guest enables more.
            pair.tap.steer_here(index, false);
        }
        let _ = self.pairs[0].tap.queue.set_offloads(Offloads::NONE);
    }

    /// Guest to TAP: every chain the guest made available is read, checked and written to the TAP, and given
    /// back; notifications stay off while there is work and are turned on again before the last look.
    fn process_tx(&self, tap: &Queue, w: &mut Worker, vring: &VringRwLock) {
        let mut state = vring.get_mut();
        if !(state.get_queue().ready() && state.is_enabled()) {
            return;
        }
        let mem = self.mem.memory();
        let mut used = false;
        loop {
            let _ = state.disable_notification();
            while let Some(chain) = state.get_queue_mut().pop_descriptor_chain(&*mem) {
                let head = chain.head_index();
                let Worker { negotiated, tx, .. } = &mut *w;
                tx.transmit(tap, *negotiated, chain, &mem);
                if let Err(e) = state.add_used(head, 0) {
                    tracing::debug!("transmit queue: returning chain {head}: {e}");
                }
                used = true;
            }
            match state.enable_notification() {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    tracing::debug!("transmit queue: {e}");
                    break;
                }
            }
        }
        notify(&mut state, used);
    }

    /// TAP to guest: frames are read from the TAP while the guest has buffers for them; when it runs out, the
    /// frame in hand waits and notifications are turned on, so that the guest's next kick resumes here.
    /// Frames are steered to pair `index`'s TAP queue while the guest uses its receive ring.
    fn process_rx(&self, tap: &TapQueue, index: usize, w: &mut Worker, vring: &VringRwLock) {
        let mut state = vring.get_mut();
        let live = state.get_queue().ready() && state.is_enabled();
        tap.steer_here(index, live);
        if !live {
            return;
        }
        let tap = &tap.queue;
        let mem = self.mem.memory();
        let mut used = false;
        loop {
            let _ = state.disable_notification();
            let negotiated = w.negotiated;
            match w.rx.receive(tap, negotiated, &mut state, &mem, &mut used) {
                Receive::TapEmpty => break,
                Receive::NoBuffers => match state.enable_notification() {
                    Ok(true) => continue,
                    _ => break,
                },
            }
        }
        notify(&mut state, used);
    }
}

/// The guest's header for a frame of `frame_len` bytes, if the guest may send it: parsed, negotiated, and
/// fitting the frame as the kernel requires of a write (`check_sent_frame`), in front of an Ethernet header.
fn checked_header(negotiated: Negotiated, hdr: &[u8], frame_len: usize) -> Option<VirtioNetHdrRepr> {
    let hdr = VirtioNetHdrRepr::parse(&hdr[..VIRTIO_NET_HDR_LEN]).ok()?;
    if !negotiated.allows(&hdr) {
        tracing::debug!("guest frame with {hdr} it did not negotiate");
        return None;
    }
    if let Err(e) = hdr.check_sent_frame(frame_len) {
        tracing::debug!("guest frame of {frame_len} bytes: {e}");
        return None;
    }
    (frame_len >= turbotun_wire::ethernet::HEADER_LEN).then_some(hdr)
}

/// Makes the one write of a guest frame (`send`), retried when interrupted, and counts it: written, or dropped
/// by the reason the forwarder's write policy gives its errno.
fn write_frame(
    tap: &Queue,
    hdr: &VirtioNetHdrRepr,
    frame_len: usize,
    c: &mut Counters,
    mut send: impl FnMut() -> crate::error::Result<usize>,
) {
    loop {
        match send() {
            Ok(_) => {
                c.writes += 1;
                c.packets += 1;
                c.bytes += frame_len as u64;
                if hdr.is_gso() {
                    c.super_packets += 1;
                }
                return;
            }
            Err(e) => match on_write_error(e.raw_os_error(), false, WhenFull::Drop) {
                WriteFailure::Retry => continue,
                WriteFailure::Drop(reason) => return c.drops.add(reason, 1),
                _ => {
                    tracing::debug!("writing a guest frame to {}: {e}", tap.name());
                    return c.drops.add(lost_with(&e), 1);
                }
            },
        }
    }
}

/// How a receive pass ended.
enum Receive {
    TapEmpty,
    NoBuffers,
}

/// Tells the guest about used buffers, if it asked to be told (event index or the ring's flags).
fn notify(state: &mut VringState<GuestMem>, used: bool) {
    if used && state.needs_notification().unwrap_or(true) {
        if let Err(e) = state.signal_used_queue() {
            tracing::debug!("signalling the guest: {e}");
        }
    }
}

/// Adds the worker's counters to the shared ones: the backend's and its queue pair's (`pair`).
fn flush(w: &mut Worker, stats: &VhostUserStats, pair: usize) {
    stats.add(pair, &std::mem::take(&mut w.tx.to_tap), &std::mem::take(&mut w.rx.to_guest));
}

impl VhostUserBackend for NetBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        2 * self.pairs.len()
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn acked_features(&self, features: u64) {
        for pair in &self.pairs {
            pair.worker().negotiated = Negotiated::new(features);
        }
        self.apply_offloads(features);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::RESET_DEVICE
    }

    fn reset_device(&self) {
        for (index, pair) in self.pairs.iter().enumerate() {
            let mut w = pair.worker();
            w.negotiated = Negotiated::new(0);
            if w.rx.pending.take().is_some() {
                w.rx.to_guest.drops.add(DropReason::Stopped, 1);
            }
            // The rings start over: the buffers taken from them are the guest's again.
            w.rx.chains.clear();
            w.rx.contiguous = true;
            flush(&mut w, &self.stats, index);
        }
        self.apply_offloads(0);
    }

    fn set_event_idx(&self, _enabled: bool) {
        // virtio-queue reads the event index from the ring itself once the feature is set on the queue.
    }

    fn update_memory(&self, _mem: GuestMem) -> io::Result<()> {
        // The same atomic handle as `self.mem`, which sees the new map.
        Ok(())
    }

    /// Worker thread `i` serves queue pair `i`: virtqueues `2i` (receive) and `2i + 1` (transmit).
    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.pairs.len()).map(|i| 0b11 << (2 * i)).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        match new_event_consumer_and_notifier(EventFlag::CLOEXEC) {
            Ok(pair) => Some(pair),
            Err(e) => {
                tracing::warn!("creating a worker's exit event: {e}");
                None
            }
        }
    }

    /// `GET_VRING_BASE`: the front end stops the ring and asks where it stands. Receive buffers taken and not
    /// used are handed back: by moving the ring's position back over them when they were the last ones taken,
    /// else as used and empty.
    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        let (pair, queue) = (queue_index as usize / 2, queue_index as usize % 2);
        let Some(pair) = self.pairs.get(pair).filter(|_| queue == RX) else { return Ok(()) };
        let mut w = pair.worker();
        let Some(vring) = w.rx_vring.clone() else { return Ok(()) };
        let taken: Vec<u16> = w.rx.chains.drain(..).map(|(head, _, _)| head).collect();
        let mut state = vring.get_mut();
        if w.rx.contiguous {
            let queue = state.get_queue_mut();
            queue.set_next_avail(queue.next_avail().wrapping_sub(taken.len() as u16));
        } else {
            for head in taken {
                let _ = state.add_used(head, 0);
            }
        }
        w.rx.contiguous = true;
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        thread: usize,
    ) -> io::Result<()> {
        // The thread's vrings are its pair's, numbered RX and TX (see `queues_per_thread`).
        let Some(pair) = self.pairs.get(thread) else { return Ok(()) };
        if device_event == self.tap_event() && !evset.contains(EventSet::IN) {
            // An error or hang-up on the TAP (its device deleted). The fd is watched edge-triggered, so this
            // comes once; an error returned here would end the worker, and with it the guest's transmit side.
            tracing::warn!("{}: {evset:?} on the TAP; its frames no longer reach the guest", pair.tap.queue.name());
            return Ok(());
        }
        let mut w = pair.worker();
        if w.rx_vring.is_none() {
            w.rx_vring = vrings.get(RX).cloned();
        }
        match device_event as usize {
            TX => {
                if let Some(vring) = vrings.get(TX) {
                    self.process_tx(&pair.tap.queue, &mut w, vring);
                }
            }
            // A receive kick (new buffers) and the TAP (new frames) both mean: move frames to the guest.
            _ => {
                if let Some(vring) = vrings.get(RX) {
                    self.process_rx(&pair.tap, thread, &mut w, vring);
                }
            }
        }
        flush(&mut w, &self.stats, thread);
        Ok(())
    }
}
