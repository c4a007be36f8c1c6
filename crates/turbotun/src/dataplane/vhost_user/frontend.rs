//! A vhost-user front end that plays the guest (feature `vhost-user-frontend`): the guest's memory in a memfd,
//! its two split virtqueues (receive 0, transmit 1) laid out and driven from the guest's side, connected to a
//! backend with `vhost::vhost_user::Frontend` the way QEMU sets a device up.
//!
//! It is the other end of [`VhostUserServer`](super::VhostUserServer) in turbotun's tests and in
//! `turbotun bench --vhost-user`, not a driver for a real VM: it has no interrupts (it polls the used rings), one
//! queue pair, and descriptors written by the caller where a test needs a chain a driver would never make.
//!
//! Layout of the guest's memory ([`Layout`]): the receive ring's descriptor table, available and used rings from
//! 0, the transmit ring's from 64 KiB, the transmit slots from 1 MiB (one per two descriptors, each room for a
//! 64 KiB frame behind its 12-byte header: a header descriptor and a frame descriptor), then one
//! [`RX_BUF`]-byte receive buffer per receive descriptor.

use std::fs::File;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::volatile_memory::Error as VolatileMemoryError;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, WriteVolatile};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// The virtio header in front of every frame: `virtio_net_hdr_v1` (with `num_buffers`).
pub const HDR_LEN: usize = 12;
/// Each receive buffer the guest offers, bytes.
pub const RX_BUF: u64 = 2048;
/// Room for one transmit chain: a 64 KiB frame behind its header, page-rounded.
pub const TX_SLOT: u64 = 0x1_1000;
/// Descriptor flag (virtio 1.x, split ring): the chain goes on at `next`.
pub const DESC_F_NEXT: u16 = 1;
/// Descriptor flag: a buffer the device writes (receive).
pub const DESC_F_WRITE: u16 = 2;

const TX_RING: u64 = 0x1_0000;
const TX_AREA: u64 = 0x10_0000;
/// The receive buffers start at 4 MiB at least (where the tests have always had them).
const MIN_RX_AREA: u64 = 0x40_0000;
const MIB: u64 = 1 << 20;
/// `VIRTIO_RING_F_EVENT_IDX`.
const EVENT_IDX: u32 = 29;
/// Each ring's descriptor table, available ring and used ring fit one 4 KiB page each up to this size.
const MAX_RING: u16 = 256;

/// What goes wrong talking to a backend.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    /// A vhost-user message failed or was refused.
    #[error("vhost-user: {0}")]
    Protocol(#[from] vhost::Error),
    /// Guest memory could not be made, read or written.
    #[error("guest memory: {0}")]
    Memory(String),
    /// A system call on an eventfd, the memfd or a file.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Features to acknowledge that the backend does not offer.
    #[error("features {wanted:#x} not offered by the backend (it offers {offered:#x})")]
    NotOffered {
        /// What was to be acknowledged.
        wanted: u64,
        /// What the backend offers.
        offered: u64,
    },
    /// The backend did not do what a device does (in time, or at all).
    #[error("the backend {0}")]
    Device(String),
}

/// What the front end's calls return.
pub type Result<T> = std::result::Result<T, FrontendError>;

fn memory_error(e: impl std::fmt::Display) -> FrontendError {
    FrontendError::Memory(e.to_string())
}

/// The sizes of the two rings, from which the memory's layout follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Receive descriptors, each one [`RX_BUF`] buffer (at most 256).
    pub rx_size: u16,
    /// Transmit descriptors, two per frame (at most 256, even).
    pub tx_size: u16,
}

impl Default for Layout {
    /// 256 receive buffers and a small transmit ring of 16 (8 frames in flight), which a test wraps quickly.
    fn default() -> Layout {
        Layout { rx_size: 256, tx_size: 16 }
    }
}

impl Layout {
    /// Transmit frames that may be in flight at once.
    pub fn tx_slots(&self) -> u16 {
        self.tx_size / 2
    }

    /// Where transmit slot `slot` starts in guest memory.
    pub fn tx_slot_addr(&self, slot: u16) -> u64 {
        TX_AREA + u64::from(slot) * TX_SLOT
    }

    /// Where the receive buffers start.
    pub fn rx_area(&self) -> u64 {
        (TX_AREA + u64::from(self.tx_slots()) * TX_SLOT).div_ceil(MIB).max(MIN_RX_AREA / MIB) * MIB
    }

    /// The guest memory's size, bytes.
    pub fn mem_size(&self) -> u64 {
        (self.rx_area() + u64::from(self.rx_size) * RX_BUF).div_ceil(MIB) * MIB
    }

    fn check(&self) -> Result<()> {
        let ok = |n: u16| n.is_power_of_two() && n <= MAX_RING;
        if !ok(self.rx_size) || !ok(self.tx_size) || self.tx_size < 2 {
            return Err(FrontendError::Memory(format!(
                "ring sizes {} and {}: each a power of two up to {MAX_RING}, the transmit ring at least 2",
                self.rx_size, self.tx_size
            )));
        }
        Ok(())
    }
}

/// Guest memory of `size` bytes from address 0, in a memfd a backend can map.
pub fn guest_memory(size: u64) -> Result<(GuestMemoryMmap, File)> {
    let memfd: File =
        rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).map_err(std::io::Error::from)?.into();
    memfd.set_len(size)?;
    let len = usize::try_from(size).map_err(memory_error)?;
    let mem = GuestMemoryMmap::<()>::from_ranges_with_files(&[(
        GuestAddress(0),
        len,
        Some(FileOffset::new(memfd.try_clone()?, 0)),
    )])
    .map_err(memory_error)?;
    Ok((mem, memfd))
}

/// One split virtqueue in guest memory, driven from the guest's side.
#[derive(Debug, Clone, Copy)]
pub struct Ring {
    /// Guest address of the descriptor table.
    pub desc: u64,
    /// Guest address of the available ring.
    pub avail: u64,
    /// Guest address of the used ring.
    pub used: u64,
    /// Descriptors.
    pub size: u16,
    next_avail: u16,
    last_used: u16,
}

impl Ring {
    fn new(base: u64, size: u16) -> Ring {
        // Descriptor table, available ring and used ring each on their own 4 KiB pages.
        let pages = (u64::from(size) * 16).div_ceil(4096) * 4096;
        Ring { desc: base, avail: base + pages, used: base + pages + 4096, size, next_avail: 0, last_used: 0 }
    }
}

/// A frame the backend put in the receive buffers: its virtio header, its bytes (gathered over every buffer it
/// took) and how many buffers that was (`num_buffers`).
#[derive(Debug, Clone)]
pub struct Received {
    /// The virtio header the backend wrote.
    pub hdr: [u8; HDR_LEN],
    /// The frame behind it.
    pub frame: Vec<u8>,
    /// Receive buffers it took.
    pub num_buffers: u16,
}

/// The guest: its memory, its two queues and the front end's connection.
pub struct Guest {
    mem: GuestMemoryMmap,
    fe: Frontend,
    layout: Layout,
    rx: Ring,
    tx: Ring,
    rx_kick: EventFd,
    tx_kick: EventFd,
    calls: [EventFd; 2],
    /// Transmit slots not in flight.
    free_tx: Vec<u16>,
    /// The payload each transmit slot holds from its last frame sent with [`Guest::try_send_parts`]: the
    /// caller's key for it, where it starts and how long it is.
    tx_payload: Vec<Option<(u64, usize, usize)>>,
    /// `VIRTIO_RING_F_EVENT_IDX` acknowledged: the guest kicks only when the backend asked to hear of the index
    /// it moves past (`avail_event`), as a Linux guest does.
    event_idx: bool,
    _memfd: File,
}

impl std::fmt::Debug for Guest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guest").field("layout", &self.layout).field("rx", &self.rx).field("tx", &self.tx).finish()
    }
}

impl Guest {
    /// Connects with the [default layout](Layout::default), acknowledges `features` (of those offered) and
    /// sets both queues up as QEMU does.
    pub fn connect(socket: &Path, features: u64) -> Result<Guest> {
        Guest::connect_with(socket, features, Layout::default())
    }

    /// [`Guest::connect`] with rings of the given sizes.
    pub fn connect_with(socket: &Path, features: u64, layout: Layout) -> Result<Guest> {
        Guest::set_up(Frontend::connect(socket, 2)?, features, layout, [true, true])
    }

    /// [`Guest::connect_with`] on a connection whose first messages the caller sent itself (anything before
    /// `SET_OWNER`, such as QEMU's `SET_VRING_ENABLE` ahead of `SET_FEATURES`). Only the rings `enable` names are
    /// enabled here: a ring left out stays as those earlier messages left it.
    pub fn on_connection(stream: UnixStream, features: u64, layout: Layout, enable: [bool; 2]) -> Result<Guest> {
        Guest::set_up(Frontend::from_stream(stream, 2), features, layout, enable)
    }

    fn set_up(mut fe: Frontend, features: u64, layout: Layout, enable: [bool; 2]) -> Result<Guest> {
        layout.check()?;
        let (mem, memfd) = guest_memory(layout.mem_size())?;
        fe.set_owner()?;
        let offered = fe.get_features()?;
        if features & !offered != 0 {
            return Err(FrontendError::NotOffered { wanted: features, offered });
        }
        fe.set_features(features | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits())?;
        let protocol = fe.get_protocol_features()?;
        let wanted = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::RESET_DEVICE
            | VhostUserProtocolFeatures::REPLY_ACK;
        fe.set_protocol_features(protocol & wanted)?;
        // Every message waits for the backend's acknowledgement, so that what it did can be checked right after.
        if protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        let host = GuestMemoryBackend::get_host_address(&mem, GuestAddress(0)).map_err(memory_error)? as u64;
        let region = GuestMemoryBackend::find_region(&mem, GuestAddress(0))
            .ok_or_else(|| FrontendError::Memory("no region at address 0".into()))?;
        let region = VhostUserMemoryRegionInfo::from_guest_region(region)?;
        fe.set_mem_table(&[region])?;
        let mut guest = Guest {
            mem,
            fe,
            layout,
            rx: Ring::new(0, layout.rx_size),
            tx: Ring::new(TX_RING, layout.tx_size),
            rx_kick: EventFd::new(0)?,
            tx_kick: EventFd::new(0)?,
            calls: [EventFd::new(EFD_NONBLOCK)?, EventFd::new(EFD_NONBLOCK)?],
            free_tx: (0..layout.tx_slots()).rev().collect(),
            tx_payload: vec![None; usize::from(layout.tx_slots())],
            event_idx: features & (1 << EVENT_IDX) != 0,
            _memfd: memfd,
        };
        guest.start_queues(host, enable)?;
        Ok(guest)
    }

    fn start_queues(&mut self, host: u64, enable: [bool; 2]) -> Result<()> {
        for (index, ring) in [(0, self.rx), (1, self.tx)] {
            // The rings start empty: every index and flag zero.
            for addr in [ring.avail, ring.used] {
                self.mem.write_slice(&[0u8; 4096], GuestAddress(addr)).map_err(memory_error)?;
            }
            self.start_queue(index, ring, host, 0, enable[index])?;
        }
        Ok(())
    }

    /// Starts queue `index` (0: receive, 1: transmit) again at `base` after the front end stopped it
    /// (`GET_VRING_BASE`, which told it the base), as QEMU does after a migration: the rings keep what is in
    /// them.
    pub fn restart_queue(&mut self, index: usize, base: u16) -> Result<()> {
        let host = GuestMemoryBackend::get_host_address(&self.mem, GuestAddress(0)).map_err(memory_error)? as u64;
        let ring = if index == 0 { self.rx } else { self.tx };
        self.start_queue(index, ring, host, base, true)
    }

    fn start_queue(&mut self, index: usize, ring: Ring, host: u64, base: u16, enable: bool) -> Result<()> {
        {
            self.fe.set_vring_num(index, ring.size)?;
            let config = VringConfigData {
                queue_max_size: ring.size,
                queue_size: ring.size,
                flags: 0,
                desc_table_addr: host + ring.desc,
                used_ring_addr: host + ring.used,
                avail_ring_addr: host + ring.avail,
                log_addr: None,
            };
            self.fe.set_vring_addr(index, &config)?;
            self.fe.set_vring_base(index, base)?;
            self.fe.set_vring_call(index, &self.calls[index])?;
            let kick = if index == 0 { &self.rx_kick } else { &self.tx_kick };
            self.fe.set_vring_kick(index, kick)?;
            if enable {
                self.fe.set_vring_enable(index, true)?;
            }
        }
        Ok(())
    }

    /// The connection, for messages of the caller's own (a reset, new features, a ring's base).
    pub fn frontend(&mut self) -> &mut Frontend {
        &mut self.fe
    }

    /// The guest's memory (the rings and buffers are at the [`Layout`]'s addresses).
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// The rings' sizes and where things are.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The call eventfd of queue `index` (0 receive, 1 transmit): written when the backend notifies the guest.
    pub fn call(&self, index: usize) -> &EventFd {
        &self.calls[index]
    }

    /// The receive ring's used index as the backend last wrote it.
    pub fn rx_used_index(&self) -> Result<u16> {
        self.mem.read_obj::<u16>(GuestAddress(self.rx.used + 2)).map(u16::from_le).map_err(memory_error)
    }

    /// Entry `i` of the receive ring's used ring, as the backend wrote it: (descriptor id, bytes written).
    pub fn rx_used_entry(&self, i: u16) -> Result<(u32, u32)> {
        let at = self.rx.used + 4 + 8 * u64::from(i % self.rx.size);
        let read = |at: u64| self.mem.read_obj::<u32>(GuestAddress(at)).map(u32::from_le).map_err(memory_error);
        Ok((read(at)?, read(at + 4)?))
    }

    fn write_desc(&self, ring: Ring, index: u16, addr: u64, len: u32, flags: u16, next: u16) -> Result<()> {
        let at = ring.desc + 16 * u64::from(index % ring.size);
        let m = &self.mem;
        m.write_obj(addr.to_le(), GuestAddress(at))
            .and_then(|()| m.write_obj(len.to_le(), GuestAddress(at + 8)))
            .and_then(|()| m.write_obj(flags.to_le(), GuestAddress(at + 12)))
            .and_then(|()| m.write_obj(next.to_le(), GuestAddress(at + 14)))
            .map_err(memory_error)
    }

    /// Writes transmit descriptor `index` as given, whatever it says (a test's bad chain).
    pub fn write_tx_desc(&self, index: u16, addr: u64, len: u32, flags: u16, next: u16) -> Result<()> {
        self.write_desc(self.tx, index, addr, len, flags, next)
    }

    /// Makes chain `head` available and moves the ring's index on.
    fn publish(mem: &GuestMemoryMmap, ring: &mut Ring, head: u16) -> Result<()> {
        let slot = ring.avail + 4 + 2 * u64::from(ring.next_avail % ring.size);
        mem.write_obj(head.to_le(), GuestAddress(slot)).map_err(memory_error)?;
        fence(Ordering::SeqCst);
        ring.next_avail = ring.next_avail.wrapping_add(1);
        mem.write_obj(ring.next_avail.to_le(), GuestAddress(ring.avail + 2)).map_err(memory_error)?;
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// The used entries (id, length) the backend added since the last call, at most `max`.
    fn take_used(mem: &GuestMemoryMmap, ring: &mut Ring, max: u16) -> Result<Vec<(u32, u32)>> {
        let idx = mem.read_obj::<u16>(GuestAddress(ring.used + 2)).map(u16::from_le).map_err(memory_error)?;
        let ready = idx.wrapping_sub(ring.last_used).min(max);
        fence(Ordering::SeqCst);
        (0..ready)
            .map(|_| {
                let at = ring.used + 4 + 8 * u64::from(ring.last_used % ring.size);
                ring.last_used = ring.last_used.wrapping_add(1);
                let id = mem.read_obj::<u32>(GuestAddress(at)).map(u32::from_le).map_err(memory_error)?;
                let len = mem.read_obj::<u32>(GuestAddress(at + 4)).map(u32::from_le).map_err(memory_error)?;
                Ok((id, len))
            })
            .collect()
    }

    /// Waits (polling, at most `patience`) until the backend has used `count` more chains of `ring`.
    fn wait_used(
        mem: &GuestMemoryMmap,
        ring: &mut Ring,
        count: u16,
        patience: Duration,
        what: &str,
    ) -> Result<Vec<(u32, u32)>> {
        let deadline = Instant::now() + patience;
        let mut got = Vec::new();
        while got.len() < usize::from(count) {
            let more = Self::take_used(mem, ring, count - got.len() as u16)?;
            if more.is_empty() {
                if Instant::now() >= deadline {
                    return Err(FrontendError::Device(format!(
                        "used {} of {count} {what} buffers within {} s",
                        got.len(),
                        patience.as_secs()
                    )));
                }
                std::thread::yield_now();
            }
            got.extend(more);
        }
        Ok(got)
    }

    /// Transmit slots given back since the last call go back to the free list; how many there are now.
    pub fn reclaim_tx(&mut self) -> Result<usize> {
        let size = self.tx.size;
        for (id, _) in Self::take_used(&self.mem, &mut self.tx, size)? {
            // Only chains this guest made are given back by a working backend: heads are even.
            let slot = (id / 2) as u16;
            if id % 2 == 0 && slot < self.layout.tx_slots() && !self.free_tx.contains(&slot) {
                self.free_tx.push(slot);
            }
        }
        Ok(self.free_tx.len())
    }

    /// Frames in flight: made available and not given back yet.
    pub fn tx_in_flight(&self) -> usize {
        usize::from(self.layout.tx_slots()) - self.free_tx.len()
    }

    /// Puts one frame behind `hdr` in a free transmit slot as a chain of two descriptors (header, frame) and
    /// kicks; `false` (nothing sent) when every slot is in flight. Does not wait for the backend.
    pub fn try_send(&mut self, hdr: &[u8; HDR_LEN], frame: &[u8]) -> Result<bool> {
        self.try_send_parts(hdr, frame, &[], None)
    }

    /// [`Guest::try_send`] of a frame made of `head` (its headers) and `payload`, where `payload_key` names the
    /// payload: a slot that last sent the same key behind a head of the same length still holds it, and only
    /// the header and `head` are written (a sender of one payload over and over, as a benchmark's, does not
    /// copy it each time). `None`: always written.
    pub fn try_send_parts(
        &mut self,
        hdr: &[u8; HDR_LEN],
        head: &[u8],
        payload: &[u8],
        payload_key: Option<u64>,
    ) -> Result<bool> {
        if self.free_tx.is_empty() {
            self.reclaim_tx()?;
        }
        let Some(slot) = self.free_tx.pop() else { return Ok(false) };
        let len = head.len() + payload.len();
        if len as u64 > TX_SLOT - HDR_LEN as u64 {
            self.free_tx.push(slot);
            return Err(FrontendError::Memory(format!("a {len}-byte frame does not fit a transmit slot")));
        }
        let addr = self.layout.tx_slot_addr(slot);
        let frame_addr = addr + HDR_LEN as u64;
        self.mem.write_slice(hdr, GuestAddress(addr)).map_err(memory_error)?;
        self.mem.write_slice(head, GuestAddress(frame_addr)).map_err(memory_error)?;
        let cached = payload_key.map(|key| (key, head.len(), payload.len()));
        let held = &mut self.tx_payload[usize::from(slot)];
        if cached.is_none() || *held != cached {
            self.mem.write_slice(payload, GuestAddress(frame_addr + head.len() as u64)).map_err(memory_error)?;
            *held = cached;
        }
        let (head, tail) = (2 * slot, 2 * slot + 1);
        self.write_desc(self.tx, head, addr, HDR_LEN as u32, DESC_F_NEXT, tail)?;
        self.write_desc(self.tx, tail, frame_addr, len as u32, 0, 0)?;
        let old = self.tx.next_avail;
        Self::publish(&self.mem, &mut self.tx, head)?;
        self.kick(self.tx, old, &self.tx_kick)?;
        Ok(true)
    }

    /// Sends one frame behind `hdr` and waits until the backend has given back every chain in flight.
    pub fn send(&mut self, hdr: &[u8; HDR_LEN], frame: &[u8]) -> Result<()> {
        if !self.try_send(hdr, frame)? {
            return Err(FrontendError::Device("gave back no transmit slot".into()));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.reclaim_tx()? < usize::from(self.layout.tx_slots()) {
            if Instant::now() >= deadline {
                return Err(FrontendError::Device("did not use the transmit chain within 10 s".into()));
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Makes transmit chain `head` (written already with [`Guest::write_tx_desc`]) available, kicks and waits
    /// until it is given back; the id the backend gave back.
    pub fn send_chain(&mut self, head: u16) -> Result<u32> {
        Self::publish(&self.mem, &mut self.tx, head)?;
        self.tx_kick.write(1)?;
        let used = Self::wait_used(&self.mem, &mut self.tx, 1, Duration::from_secs(10), "transmit")?;
        Ok(used[0].0)
    }

    /// Offers `count` receive buffers of [`RX_BUF`] bytes, one descriptor each (descriptor i at its own address).
    pub fn post_rx(&mut self, first: u16, count: u16) -> Result<()> {
        let old = self.rx.next_avail;
        for i in first..first + count {
            self.post_rx_buffer(i % self.rx.size)?;
        }
        self.kick(self.rx, old, &self.rx_kick)
    }

    /// Kicks `ring` after its available index moved on from `old`: always, or with the event index only when
    /// the backend's `avail_event` lies in between (`vring_need_event`).
    fn kick(&self, ring: Ring, old: u16, kick: &EventFd) -> Result<()> {
        if self.event_idx {
            fence(Ordering::SeqCst);
            let at = ring.used + 4 + 8 * u64::from(ring.size);
            let event = self.mem.read_obj::<u16>(GuestAddress(at)).map(u16::from_le).map_err(memory_error)?;
            let new = ring.next_avail;
            if new.wrapping_sub(event).wrapping_sub(1) >= new.wrapping_sub(old) {
                return Ok(());
            }
        }
        kick.write(1)?;
        Ok(())
    }

    fn post_rx_buffer(&mut self, id: u16) -> Result<()> {
        let addr = self.layout.rx_area() + u64::from(id) * RX_BUF;
        self.write_desc(self.rx, id, addr, RX_BUF as u32, DESC_F_WRITE, 0)?;
        Self::publish(&self.mem, &mut self.rx, id)
    }

    /// The next frame the backend put in the receive buffers, if there is one; each buffer it used is offered
    /// again.
    pub fn try_recv(&mut self) -> Result<Option<Received>> {
        let Some(&first) = Self::take_used(&self.mem, &mut self.rx, 1)?.first() else { return Ok(None) };
        let mut bytes = self.read_rx_buffer(first)?;
        if bytes.len() < HDR_LEN {
            return Err(FrontendError::Device(format!(
                "used a receive buffer for {} bytes, less than a header",
                first.1
            )));
        }
        let num_buffers = u16::from_le_bytes([bytes[10], bytes[11]]);
        if num_buffers == 0 {
            return Err(FrontendError::Device("set num_buffers to 0".into()));
        }
        let mut ids = vec![first.0 as u16];
        let old = self.rx.next_avail;
        let more =
            Self::wait_used(&self.mem, &mut self.rx, num_buffers - 1, Duration::from_secs(10), "receive (more)")?;
        for used in more {
            bytes.extend(self.read_rx_buffer(used)?);
            ids.push(used.0 as u16);
        }
        for id in ids {
            self.post_rx_buffer(id % self.rx.size)?;
        }
        self.kick(self.rx, old, &self.rx_kick)?;
        let mut hdr = [0u8; HDR_LEN];
        hdr.copy_from_slice(&bytes[..HDR_LEN]);
        Ok(Some(Received { hdr, frame: bytes.split_off(HDR_LEN), num_buffers }))
    }

    /// The next frame, waiting at most `patience`.
    pub fn recv(&mut self, patience: Duration) -> Result<Received> {
        let deadline = Instant::now() + patience;
        loop {
            if let Some(got) = self.try_recv()? {
                return Ok(got);
            }
            if Instant::now() >= deadline {
                return Err(FrontendError::Device(format!("put no frame in the receive ring within {patience:?}")));
            }
            std::thread::yield_now();
        }
    }

    /// Receives frames until one is accepted by `want` (a TAP also carries the kernel's own traffic), for at
    /// most `patience`.
    pub fn recv_matching(&mut self, patience: Duration, mut want: impl FnMut(&[u8]) -> bool) -> Result<Received> {
        let deadline = Instant::now() + patience;
        loop {
            let got = self.recv(deadline.saturating_duration_since(Instant::now()))?;
            if want(&got.frame) {
                return Ok(got);
            }
        }
    }

    fn read_rx_buffer(&self, (id, len): (u32, u32)) -> Result<Vec<u8>> {
        if u64::from(len) > RX_BUF || id >= u32::from(self.rx.size) {
            return Err(FrontendError::Device(format!("used receive buffer {id} for {len} bytes")));
        }
        let mut out = vec![0u8; len as usize];
        let addr = self.layout.rx_area() + u64::from(id) * RX_BUF;
        self.mem.read_slice(&mut out, GuestAddress(addr)).map_err(memory_error)?;
        Ok(out)
    }
}

/// Guest memory without a queue or a backend: frames written into it are written out to a file straight from it
/// (one `write(2)` each, no copy in user space), as a device that had no virtio processing would. The
/// `ceiling` row of `turbotun bench --vhost-user`.
#[derive(Debug)]
pub struct GuestMemory {
    mem: GuestMemoryMmap,
    _memfd: File,
}

impl GuestMemory {
    /// `size` bytes of guest memory in a memfd.
    pub fn new(size: u64) -> Result<GuestMemory> {
        let (mem, memfd) = guest_memory(size)?;
        Ok(GuestMemory { mem, _memfd: memfd })
    }

    /// Copies `bytes` into guest memory at `addr`.
    pub fn write(&self, addr: u64, bytes: &[u8]) -> Result<()> {
        self.mem.write_slice(bytes, GuestAddress(addr)).map_err(memory_error)
    }

    /// Writes `len` bytes from `addr` to `file` with one `write(2)` from guest memory itself; the bytes written.
    pub fn write_to(&self, file: &mut File, addr: u64, len: usize) -> Result<usize> {
        let slice = self.mem.get_slice(GuestAddress(addr), len).map_err(memory_error)?;
        file.write_volatile(&slice).map_err(|e| match e {
            VolatileMemoryError::IOError(io) => FrontendError::Io(io),
            other => memory_error(other),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let small = Layout::default();
        assert_eq!((small.rx_area(), small.mem_size()), (0x40_0000, 5 * MIB));
        let big = Layout { rx_size: 256, tx_size: 256 };
        assert_eq!(big.tx_slot_addr(127) + TX_SLOT, TX_AREA + 128 * TX_SLOT);
        assert!(big.rx_area() >= big.tx_slot_addr(128), "the receive buffers after the transmit slots");
        assert!(big.mem_size() >= big.rx_area() + 256 * RX_BUF);
        for bad in [
            Layout { rx_size: 0, tx_size: 16 },
            Layout { rx_size: 512, tx_size: 16 },
            Layout { rx_size: 256, tx_size: 3 },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        assert!(big.check().is_ok());
    }
}
