//! An io_uring that moves frames between two fds through buffers it owns: the unsafe half of
//! [`crate::uring`].
//!
//! Reads are one multishot read (`IORING_OP_READ_MULTISHOT`, Linux 6.7) over a ring of provided buffers: one
//! request that reads frame after frame, each into a buffer the kernel picks from the ring, and posts the
//! completions in the order the frames were read. (Many single reads in flight on one tun fd are woken
//! together and complete in no particular order: frames get reordered.)
//!
//! Writes are `IORING_OP_WRITE` of one slot, or `IORING_OP_WRITEV` gathering pieces of several slots (a
//! coalesced packet: virtio header and head packet, then each merged member's payload, each in its own slot).
//! Slots past the first `depth` are spares: never provided for reads, lent to the caller for packets it
//! builds (the segments of a split super-packet).
//!
//! io_uring's safety rule is that a buffer handed to the kernel must stay valid, and must not be touched by us,
//! until its completion has been reaped. Here the ring owns every buffer (one arena, a slot per buffer) and
//! tracks each slot's state (in the provided ring, filled and ours, or being written), so the safe API can
//! only lend out a slot the kernel is not using, and the memory is only freed once every operation has
//! completed and the buffer ring is unregistered (or it is leaked if the kernel will not let go).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use io_uring::{opcode, types, IoUring};

/// What a slot is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// In the provided-buffer ring: the kernel may read a frame into it at any time.
    Provided,
    /// Ours: a read completed into it.
    Filled,
    /// The kernel is writing from it (alone, or as one piece of a gathered write).
    Writing,
    /// The kernel may read a frame into it (one piece of a scattered read).
    Reading,
}

/// Which operation a completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// The multishot read (its slot is the provided buffer it filled), or a scattered read (its slot is the
    /// first piece's).
    Read,
    Write,
}

/// One completion: the slot (for a failed read: none), the operation, and its result: bytes moved, or the errno.
#[derive(Debug)]
pub(crate) struct Completion {
    pub slot: Option<usize>,
    pub op: Op,
    pub result: Result<usize, i32>,
}

/// What a request is, carried in its `user_data` and read back from its completion: encoded and decoded here
/// only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    /// The multishot read over provided slots.
    MultishotRead,
    /// A scattered read, named by its first piece's slot.
    ScatteredRead(u32),
    /// A write, named by its first piece's slot.
    Write(u32),
    /// The cancellation made on drop.
    Cancel,
}

impl Tag {
    const KIND_SHIFT: u32 = 32;

    fn encode(self) -> u64 {
        match self {
            Tag::MultishotRead => 1 << Self::KIND_SHIFT,
            Tag::Write(slot) => (2 << Self::KIND_SHIFT) | u64::from(slot),
            Tag::ScatteredRead(slot) => (3 << Self::KIND_SHIFT) | u64::from(slot),
            Tag::Cancel => u64::MAX,
        }
    }

    fn decode(data: u64) -> Option<Tag> {
        let slot = data as u32;
        match data >> Self::KIND_SHIFT {
            _ if data == u64::MAX => Some(Tag::Cancel),
            1 if slot == 0 => Some(Tag::MultishotRead),
            2 => Some(Tag::Write(slot)),
            3 => Some(Tag::ScatteredRead(slot)),
            _ => None,
        }
    }
}
const BUFFER_GROUP: u16 = 0;
const PAGE: usize = 4096;

/// The provided-buffer ring's memory: `entries` descriptors, page aligned, shared with the kernel.
struct BufRing {
    base: std::ptr::NonNull<types::BufRingEntry>,
    entries: u16,
    /// Our copy of the tail (the kernel only reads it).
    tail: u16,
}

// `provide` writes descriptors by the kernel's layout of `struct io_uring_buf`.
const _: () = assert!(std::mem::size_of::<types::BufRingEntry>() == 16);

impl BufRing {
    fn layout(entries: u16) -> std::alloc::Layout {
        let bytes = (usize::from(entries) * std::mem::size_of::<types::BufRingEntry>()).max(PAGE);
        std::alloc::Layout::from_size_align(bytes, PAGE).expect("page-aligned layout of at most 512 KiB")
    }

    fn new(entries: u16) -> io::Result<Self> {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::layout(entries)) };
        let base = std::ptr::NonNull::new(ptr.cast()).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(BufRing { base, entries, tail: 0 })
    }

    /// Hands buffer `bid` (at `addr`, `len` bytes) to the kernel.
    ///
    /// The descriptor is written field by field through raw pointers, never through a reference: the memory is
    /// shared with the kernel, and the first descriptor's last field is the ring's tail, which the kernel reads
    /// at any time. The layout is `struct io_uring_buf { u64 addr; u32 len; u16 bid; u16 resv; }`.
    fn provide(&mut self, addr: *mut u8, len: u32, bid: u16) {
        let index = usize::from(self.tail & (self.entries - 1));
        // SAFETY: `index < entries`, so the descriptor is inside the allocation, which is page aligned, so each
        // field is naturally aligned; the kernel does not read a descriptor past the published tail, so writing
        // one before publishing it races with nothing; `resv` (the tail, for index 0) is not written here.
        unsafe {
            let entry = self.base.as_ptr().add(index).cast::<u8>();
            entry.cast::<u64>().write(addr as u64);
            entry.add(8).cast::<u32>().write(len);
            entry.add(12).cast::<u16>().write(bid);
        }
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail lives in the first descriptor's reserved field, inside the allocation, naturally
        // aligned for u16; the kernel reads it concurrently, hence the atomic release store that also
        // publishes the descriptor written above.
        let tail = unsafe { &*types::BufRingEntry::tail(self.base.as_ptr()).cast::<std::sync::atomic::AtomicU16>() };
        tail.store(self.tail, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with the same layout; only dropped once unregistered (see ForwardRing's
        // Drop, which leaks it otherwise).
        unsafe { std::alloc::dealloc(self.base.as_ptr().cast(), Self::layout(self.entries)) };
    }
}

/// Whether this kernel has what [`ForwardRing`] needs: io_uring with `IORING_FEAT_EXT_ARG`, the multishot
/// read (Linux 6.7; provided-buffer rings came in 5.19), `READV`, `WRITE` and `WRITEV`.
pub(crate) fn probe_forward_ring() -> io::Result<()> {
    let ring = IoUring::new(8)?;
    if !ring.params().is_feature_ext_arg() {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "io_uring without IORING_FEAT_EXT_ARG (Linux < 5.11)"));
    }
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    if !probe.is_supported(opcode::ReadMulti::CODE) {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "io_uring without multishot read (Linux < 6.7)"));
    }
    let needed = [
        (opcode::Write::CODE, "IORING_OP_WRITE"),
        (opcode::Writev::CODE, "IORING_OP_WRITEV"),
        (opcode::Readv::CODE, "IORING_OP_READV"),
    ];
    for (code, name) in needed {
        if !probe.is_supported(code) {
            return Err(io::Error::new(io::ErrorKind::Unsupported, format!("io_uring without {name}")));
        }
    }
    Ok(())
}

/// Whether this kernel has the vectored reads and writes from registered buffers (`READV_FIXED`,
/// `WRITEV_FIXED`: Linux 6.15) that [`ForwardRing::with_spares`] uses when asked to register its arena.
pub(crate) fn probe_registered_vectors() -> io::Result<()> {
    let ring = IoUring::new(8)?;
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for (code, name) in
        [(opcode::ReadvFixed::CODE, "IORING_OP_READV_FIXED"), (opcode::WritevFixed::CODE, "IORING_OP_WRITEV_FIXED")]
    {
        if !probe.is_supported(code) {
            return Err(io::Error::new(io::ErrorKind::Unsupported, format!("io_uring without {name} (Linux < 6.15)")));
        }
    }
    Ok(())
}

/// A ring of `depth` buffers of `stride` bytes reading frames from `src` and writing them to `dst`, plus
/// `spare` buffers of the same size that are never read into.
pub(crate) struct ForwardRing {
    ring: IoUring,
    src: OwnedFd,
    dst: OwnedFd,
    /// The buffers, `depth * stride` bytes from `Box::into_raw`. Kept as a raw pointer: the kernel writes into
    /// provided slots at any time, so no Rust reference may cover the whole arena, only a slot that is ours.
    arena: std::ptr::NonNull<u8>,
    bufs: std::mem::ManuallyDrop<BufRing>,
    stride: usize,
    /// Slots `0..depth` are provided for reads; the rest are spares.
    depth: usize,
    states: Vec<SlotState>,
    /// Per slot that heads a write in flight: every slot the write reads from (itself included).
    members: Vec<Vec<u32>>,
    /// Per slot that heads a gathered write: its iovecs, kept here (at a stable heap address) until the write
    /// completes, since the kernel may read them after submission when the write has to wait.
    iovecs: Vec<Vec<libc::iovec>>,
    /// Per slot: the pass in which [`Self::slots_mut`] last lent it (to refuse a slot named twice).
    lent: Vec<u32>,
    pass: u32,
    /// Whether the multishot read is armed (it ends on an error or when the ring ran out of buffers).
    read_armed: bool,
    /// Whether the multishot read may be armed (false: the caller reads with [`ForwardRing::readv_into`]).
    multishot: bool,
    writes_in_flight: usize,
    readv_in_flight: usize,
    /// The arena is registered with the ring: reads and writes go through `READV_FIXED`/`WRITEV_FIXED`.
    registered: bool,
}

impl std::fmt::Debug for ForwardRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardRing")
            .field("depth", &self.states.len())
            .field("stride", &self.stride)
            .field("read_armed", &self.read_armed)
            .field("writes_in_flight", &self.writes_in_flight)
            .finish()
    }
}

impl ForwardRing {
    /// Sets up the ring (`depth` a power of two up to 32768) and provides every buffer; the fds are duplicated,
    /// so the ring does not depend on the caller keeping them open. Completions are run only when we wait for
    /// them (`DEFER_TASKRUN`, 6.1+) where the kernel allows it.
    pub(crate) fn new(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, depth: usize, stride: usize) -> io::Result<Self> {
        Self::with_spares(src, dst, depth, 0, stride, true, false)
    }

    /// [`Self::new`] with `spare` more slots, lent to the caller and never read into by the multishot read.
    /// Without `multishot`, no slot is provided and the read is never armed: every slot is the caller's, and
    /// frames are read with [`Self::readv_into`]. With `registered` (and without `multishot`) the whole arena is
    /// registered with the ring (`IORING_REGISTER_BUFFERS`: its pages are pinned, so all of it becomes resident)
    /// and [`Self::readv_into`] and [`Self::writev_from`] use `READV_FIXED` and `WRITEV_FIXED` (Linux 6.15).
    pub(crate) fn with_spares(
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        depth: usize,
        spare: usize,
        stride: usize,
        multishot: bool,
        registered: bool,
    ) -> io::Result<Self> {
        if !depth.is_power_of_two() || depth > 32768 || spare > 32768 || stride == 0 || stride > u32::MAX as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ring depth must be a power of two up to 32768, with a positive stride",
            ));
        }
        let slots = depth + spare;
        // Room for the read, every write that can be in flight, and a cancellation.
        let entries = ((slots + 2) as u32).next_power_of_two().max(8);
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(entries)
            .or_else(|_| IoUring::builder().setup_coop_taskrun().build(entries))
            .or_else(|_| IoUring::new(entries))?;
        if !ring.params().is_feature_ext_arg() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring without IORING_FEAT_EXT_ARG (Linux < 5.11)",
            ));
        }
        let (src, dst) = (src.try_clone_to_owned()?, dst.try_clone_to_owned()?);
        let mut bufs = BufRing::new(depth as u16)?;
        // SAFETY: `bufs` is page aligned, `depth` descriptors long and lives until it is unregistered (Drop;
        // nothing fails between here and the construction of `Self`, which owns it).
        unsafe {
            ring.submitter().register_buf_ring_with_flags(bufs.base.as_ptr() as u64, depth as u16, BUFFER_GROUP, 0)
        }
        .map_err(|e| io::Error::new(e.kind(), format!("registering a provided-buffer ring (Linux 5.19+): {e}")))?;
        let bytes = slots.checked_mul(stride).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{slots} buffers of {stride} bytes overflow the address space"),
            )
        })?;
        let arena = Box::into_raw(vec![0u8; bytes].into_boxed_slice()).cast::<u8>();
        let Some(arena) = std::ptr::NonNull::new(arena) else {
            unreachable!("Box::into_raw never returns null");
        };
        for slot in 0..if multishot { depth } else { 0 } {
            // SAFETY: slot * stride < depth * stride: inside the allocation.
            bufs.provide(unsafe { arena.as_ptr().add(slot * stride) }, stride as u32, slot as u16);
        }
        let registered = registered && !multishot;
        if registered {
            let iov = [libc::iovec { iov_base: arena.as_ptr().cast(), iov_len: bytes }];
            // SAFETY: the arena stays allocated until `Drop`, which tears the ring down first (so the kernel
            // drops its pins before the memory is freed); the iovec describes exactly that allocation.
            if let Err(e) = unsafe { ring.submitter().register_buffers(&iov) } {
                // Nothing was submitted, so the kernel holds no reference into the provided-buffer ring either.
                let _ = ring.submitter().unregister_buf_ring(BUFFER_GROUP);
                // SAFETY: nothing refers to the arena yet; it came from `Box::into_raw` of `bytes` bytes.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(arena.as_ptr(), bytes)) });
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "registering {} MiB of buffers with io_uring (RLIMIT_MEMLOCK without CAP_IPC_LOCK?): {e}",
                        bytes >> 20
                    ),
                ));
            }
        }
        let provided = if multishot { SlotState::Provided } else { SlotState::Filled };
        let mut states = vec![provided; depth];
        states.resize(slots, SlotState::Filled);
        Ok(ForwardRing {
            ring,
            src,
            dst,
            arena,
            bufs: std::mem::ManuallyDrop::new(bufs),
            stride,
            depth,
            states,
            members: vec![Vec::new(); slots],
            iovecs: vec![Vec::new(); slots],
            lent: vec![0; slots],
            pass: 0,
            read_armed: false,
            multishot,
            writes_in_flight: 0,
            readv_in_flight: 0,
            registered,
        })
    }

    pub(crate) fn stride(&self) -> usize {
        self.stride
    }

    /// Slots provided for reads (`0..depth`); the spares follow.
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    /// The bytes of a filled slot, writable: a slot that is ours (a read completed into it, or a spare not
    /// being written) is touched by nobody else until it is written or recycled, both of which take
    /// `&mut self` and so end this borrow.
    pub(crate) fn slot_mut(&mut self, slot: usize) -> Option<&mut [u8]> {
        self.check_filled(slot).ok()?;
        // SAFETY: a Filled slot is ours (see `slot`); the range lies inside the allocation and no other
        // reference to it exists while `&mut self` is borrowed.
        Some(unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(slot), self.stride) })
    }

    /// A new stamp for the "named twice" check.
    fn next_pass(&mut self) {
        self.pass = self.pass.wrapping_add(1);
        if self.pass == 0 {
            self.lent.fill(0);
            self.pass = 1;
        }
    }

    /// Several filled slots at once, writable, in the order given, each at most once (an error names a slot
    /// that is not ours or is named twice).
    pub(crate) fn slots_mut(&mut self, slots: &[u32]) -> io::Result<Vec<&mut [u8]>> {
        self.next_pass();
        for &s in slots {
            let s = s as usize;
            self.check_filled(s)?;
            if self.lent[s] == self.pass {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("slot {s} named twice")));
            }
            self.lent[s] = self.pass;
        }
        let (base, stride) = (self.arena.as_ptr(), self.stride);
        Ok(slots
            .iter()
            // SAFETY: every slot was checked above to be Filled (ours, untouched by the kernel) and distinct,
            // so the slices are disjoint ranges inside the allocation; they borrow `self` mutably, so no write
            // or recycle can hand them to the kernel while they live.
            .map(|&s| unsafe { std::slice::from_raw_parts_mut(base.add(s as usize * stride), stride) })
            .collect())
    }

    /// Start of a slot's buffer (`slot < depth`, checked by the callers).
    fn slot_ptr(&self, slot: usize) -> *mut u8 {
        debug_assert!(slot < self.states.len());
        // SAFETY: callers pass slot < depth, so the offset stays inside the `depth * stride` allocation.
        unsafe { self.arena.as_ptr().add(slot * self.stride) }
    }

    /// The bytes of a filled slot (what its read brought), or `None` while the kernel may use it.
    pub(crate) fn slot(&self, slot: usize) -> Option<&[u8]> {
        self.check_filled(slot).ok()?;
        // SAFETY: a Filled slot is ours: the kernel neither reads nor writes it until we queue a write (which
        // takes `&mut self`, ending this borrow) or recycle it; the range lies inside the allocation.
        Some(unsafe { std::slice::from_raw_parts(self.slot_ptr(slot), self.stride) })
    }

    /// Gives a filled slot back to the kernel for a later read (spares are not read into: refused).
    pub(crate) fn recycle(&mut self, slot: usize) -> io::Result<()> {
        self.check_filled(slot)?;
        if slot >= self.depth {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("slot {slot} is a spare")));
        }
        let addr = self.slot_ptr(slot);
        self.bufs.provide(addr, self.stride as u32, slot as u16);
        self.states[slot] = SlotState::Provided;
        Ok(())
    }

    /// Queues a write of the first `len` bytes of a filled slot; its completion names the slot, which is then
    /// filled (ours) again, to recycle or to write again.
    pub(crate) fn write_from(&mut self, slot: usize, len: usize) -> io::Result<()> {
        self.check_filled(slot)?;
        if len > self.stride {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "write longer than the slot"));
        }
        let ptr = self.slot_ptr(slot).cast_const();
        let entry = opcode::Write::new(types::Fd(self.dst.as_raw_fd()), ptr, len as u32)
            .offset(u64::MAX)
            .build()
            .user_data(Tag::Write(slot as u32).encode());
        // The entry points into the arena at a slot now marked Writing, so safe code does not touch it (nor
        // free it, see Drop) until the completion is reaped; the fd is owned by `self`.
        self.push(&entry)?;
        self.states[slot] = SlotState::Writing;
        self.members[slot].clear();
        self.members[slot].push(slot as u32);
        self.writes_in_flight += 1;
        Ok(())
    }

    /// Queues one read scattered over `pieces` (slot, byte range), in order: the next frame fills them one after
    /// the other. Its completion names the first piece's slot, and every slot of the read is then filled
    /// (ours) again. Each slot must be filled and appear once; only one such read should be in flight on a tun
    /// fd at a time (several complete in no particular order).
    pub(crate) fn readv_into(&mut self, pieces: &[(u32, std::ops::Range<usize>)]) -> io::Result<()> {
        let head = self.check_pieces(pieces)?;
        let entry = self.vectored_entry(true, head);
        // The iovecs live in `self.iovecs[head]` (not touched again until this read completes, since its head
        // slot is marked Reading) and point into slots marked Reading, which safe code does not touch or free
        // until the completion is reaped; the fd is owned by `self`.
        self.push(&entry)?;
        self.mark(pieces, SlotState::Reading);
        self.readv_in_flight += 1;
        Ok(())
    }

    /// The vectored read (from `src`) or write (to `dst`) of the iovecs stored under slot `head`, through the
    /// registered arena (buffer 0 holds every piece) when there is one; its completion is tagged with `head`.
    fn vectored_entry(&self, read: bool, head: usize) -> io_uring::squeue::Entry {
        let (iov, n) = (self.iovecs[head].as_ptr(), self.iovecs[head].len() as u32);
        let (fd, tag) =
            if read { (&self.src, Tag::ScatteredRead(head as u32)) } else { (&self.dst, Tag::Write(head as u32)) };
        let fd = types::Fd(fd.as_raw_fd());
        let entry = match (read, self.registered) {
            (true, true) => opcode::ReadvFixed::new(fd, iov, n, 0).offset(u64::MAX).build(),
            (true, false) => opcode::Readv::new(fd, iov, n).offset(u64::MAX).build(),
            (false, true) => opcode::WritevFixed::new(fd, iov, n, 0).offset(u64::MAX).build(),
            (false, false) => opcode::Writev::new(fd, iov, n).offset(u64::MAX).build(),
        };
        entry.user_data(tag.encode())
    }

    /// Checks that every piece lies in a distinct slot of ours and stores their iovecs under the first piece's
    /// slot; returns that slot.
    fn check_pieces(&mut self, pieces: &[(u32, std::ops::Range<usize>)]) -> io::Result<usize> {
        let Some(&(head, _)) = pieces.first() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "an I/O of nothing"));
        };
        self.next_pass();
        for (s, range) in pieces {
            let s = *s as usize;
            self.check_filled(s)?;
            if self.lent[s] == self.pass {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("slot {s} named twice")));
            }
            self.lent[s] = self.pass;
            if range.start > range.end || range.end > self.stride {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "piece outside its slot"));
            }
        }
        let head = head as usize;
        let mut iov = std::mem::take(&mut self.iovecs[head]);
        iov.clear();
        iov.extend(pieces.iter().map(|(s, range)| libc::iovec {
            iov_base: self.slot_ptr(*s as usize).wrapping_add(range.start).cast(),
            iov_len: range.len(),
        }));
        self.iovecs[head] = iov;
        Ok(head)
    }

    /// Marks every slot of an operation headed by the first piece's slot.
    fn mark(&mut self, pieces: &[(u32, std::ops::Range<usize>)], state: SlotState) {
        let head = pieces[0].0 as usize;
        let mut members = std::mem::take(&mut self.members[head]);
        members.clear();
        for (s, _) in pieces {
            self.states[*s as usize] = state;
            members.push(*s);
        }
        self.members[head] = members;
    }

    /// Queues one gathered write of `pieces` (slot, byte range), in order; its completion names the first
    /// piece's slot, and every slot of the write is then filled (ours) again. Each slot must be filled and
    /// appear once.
    pub(crate) fn writev_from(&mut self, pieces: &[(u32, std::ops::Range<usize>)]) -> io::Result<()> {
        let head = self.check_pieces(pieces)?;
        let entry = self.vectored_entry(false, head);
        // The iovecs live in `self.iovecs[head]` (not touched again until this write completes, since its head
        // slot is marked Writing) and point into slots marked Writing, which safe code does not touch or free
        // until the completion is reaped; the fd is owned by `self`.
        self.push(&entry)?;
        self.mark(pieces, SlotState::Writing);
        self.writes_in_flight += 1;
        Ok(())
    }

    /// Scattered reads submitted and not yet completed.
    pub(crate) fn readv_in_flight(&self) -> usize {
        self.readv_in_flight
    }

    fn check_filled(&self, slot: usize) -> io::Result<()> {
        match self.states.get(slot) {
            Some(SlotState::Filled) => Ok(()),
            Some(_) => Err(io::Error::new(io::ErrorKind::InvalidInput, format!("slot {slot} is in use"))),
            None => Err(io::Error::new(io::ErrorKind::InvalidInput, format!("no slot {slot}"))),
        }
    }

    /// Pushes an entry, submitting first if the queue is full. Entries refer only to memory owned by `self`
    /// and kept alive and untouched until their completions are reaped.
    fn push(&mut self, entry: &io_uring::squeue::Entry) -> io::Result<()> {
        if self.ring.submission().is_full() {
            self.ring.submit()?;
        }
        // SAFETY: see the callers: every buffer an entry names is owned by `self` and marked in use.
        unsafe { self.ring.submission().push(entry) }.map_err(|_| io::Error::other("io_uring submission queue full"))
    }

    fn arm_read(&mut self) -> io::Result<()> {
        // Length 0: each read takes the whole provided buffer.
        let entry = opcode::ReadMulti::new(types::Fd(self.src.as_raw_fd()), 0, BUFFER_GROUP)
            .offset(u64::MAX)
            .build()
            .user_data(Tag::MultishotRead.encode());
        // The read writes only into buffers of the registered provided ring, all inside the arena and marked
        // Provided until a completion hands one back.
        self.push(&entry)?;
        self.read_armed = true;
        Ok(())
    }

    /// Submits what is queued (arming the read if it is not, and buffers are provided) and waits up to
    /// `timeout` for at least one completion. Returns false on timeout or when a signal interrupted the wait.
    /// Writes submitted and not yet completed.
    pub(crate) fn writes_in_flight(&self) -> usize {
        self.writes_in_flight
    }

    pub(crate) fn submit_and_wait(&mut self, timeout: Duration) -> io::Result<bool> {
        if self.multishot && !self.read_armed && self.states.contains(&SlotState::Provided) {
            self.arm_read()?;
        }
        if !self.ring.completion().is_empty() {
            self.ring.submit()?;
            return Ok(true);
        }
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Moves every completion that is ready into `out`. A read's slot is filled (ours); a written slot is
    /// filled again (recycle it, or write it again). `ENOBUFS` from the read (every buffer in use) is not
    /// reported: the read is armed again once a buffer is recycled.
    pub(crate) fn reap(&mut self, out: &mut Vec<Completion>) {
        for cqe in self.ring.completion() {
            let (data, res, flags) = (cqe.user_data(), cqe.result(), cqe.flags());
            let result = if res < 0 { Err(-res) } else { Ok(res as usize) };
            match Tag::decode(data) {
                Some(Tag::MultishotRead) => {
                    if !io_uring::cqueue::more(flags) {
                        self.read_armed = false;
                    }
                    let slot = io_uring::cqueue::buffer_select(flags).map(usize::from);
                    if let Some(s) = slot.filter(|&s| s < self.states.len()) {
                        self.states[s] = SlotState::Filled;
                    }
                    if res == -libc::ENOBUFS {
                        continue;
                    }
                    out.push(Completion { slot, op: Op::Read, result });
                }
                Some(Tag::ScatteredRead(slot)) => {
                    let slot = slot as usize;
                    if slot < self.states.len() {
                        for &m in &self.members[slot] {
                            self.states[m as usize] = SlotState::Filled;
                        }
                        self.readv_in_flight -= 1;
                    }
                    out.push(Completion { slot: Some(slot), op: Op::Read, result });
                }
                Some(Tag::Write(slot)) => {
                    let slot = slot as usize;
                    if slot < self.states.len() {
                        for &m in &self.members[slot] {
                            self.states[m as usize] = SlotState::Filled;
                        }
                        self.writes_in_flight -= 1;
                    }
                    out.push(Completion { slot: Some(slot), op: Op::Write, result });
                }
                _ => {}
            }
        }
    }
}

impl Drop for ForwardRing {
    fn drop(&mut self) {
        // Cancel everything and wait for the kernel to let go of every buffer before the memory is freed.
        if self.read_armed || self.writes_in_flight > 0 || self.readv_in_flight > 0 {
            let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any()).build().user_data(Tag::Cancel.encode());
            // SAFETY: a cancellation request refers to no memory of ours.
            let mut queued = unsafe { self.ring.submission().push(&cancel) }.is_ok();
            if !queued {
                // A full submission queue: hand what is queued to the kernel and try once more.
                let _ = self.ring.submit();
                // SAFETY: as above.
                queued = unsafe { self.ring.submission().push(&cancel) }.is_ok();
            }
            if !queued {
                tracing::warn!("io_uring: the cancellation could not be queued; the buffers are leaked, not freed");
            }
            let mut scratch = Vec::new();
            for _ in 0..100 {
                if !self.read_armed && self.writes_in_flight == 0 && self.readv_in_flight == 0 {
                    break;
                }
                let ts = types::Timespec::from(Duration::from_millis(10));
                let args = types::SubmitArgs::new().timespec(&ts);
                let _ = self.ring.submitter().submit_with_args(1, &args);
                scratch.clear();
                self.reap(&mut scratch);
            }
        }
        let unregistered = self.ring.submitter().unregister_buf_ring(BUFFER_GROUP).is_ok()
            && (!self.registered || self.ring.submitter().unregister_buffers().is_ok());
        if self.read_armed || self.writes_in_flight > 0 || self.readv_in_flight > 0 || !unregistered {
            // The kernel may still use a buffer: leaking the memory is the only way to stay memory-safe.
            return;
        }
        // SAFETY: unregistered above and never used again.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.bufs) };
        let len = self.states.len() * self.stride;
        // SAFETY: `arena` came from `Box::into_raw` of a `len`-byte boxed slice in `new`, and no operation is in
        // flight any more (checked above), so nothing else refers to it.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.arena.as_ptr(), len)) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_every_tag_round_trips_and_nothing_else_decodes() {
        for tag in [Tag::MultishotRead, Tag::Write(0), Tag::Write(7), Tag::ScatteredRead(u32::MAX), Tag::Cancel] {
            assert_eq!(Tag::decode(tag.encode()), Some(tag), "{tag:?}");
        }
        for data in [0, 4 << 32, (1 << 32) | 5, 12345] {
            assert_eq!(Tag::decode(data), None, "{data:#x}");
        }
    }
}
