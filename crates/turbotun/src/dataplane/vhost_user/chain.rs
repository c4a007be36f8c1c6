//! A guest's descriptor chains, read and written only through vm-memory's checked accessors: every address and
//! length comes from the guest, so each access is bounds-checked against its memory map and a chain that cannot
//! be followed is reported, never trusted.

use std::ops::Deref;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryBackend};

use crate::dataplane::stats::DropReason;
use crate::sys::guest::{GuestIoSlice, MAX_PIECES};
use turbotun_wire::virtio_net::{VIRTIO_NET_HDR_LEN, VIRTIO_NET_HDR_V1_LEN};

/// Follows a chain to its end, handing each descriptor to `visit`. A chain is refused
/// ([`DropReason::BadDescriptor`]) when it holds no descriptor, or when it stops at a descriptor that still
/// points to a next one: virtio-queue ends the walk there for a loop (more descriptors than the ring has), a
/// descriptor table outside guest memory, a nested indirect table or a chain longer than 4 GiB.
fn walk<M>(
    chain: DescriptorChain<M>,
    mut visit: impl FnMut(&Descriptor) -> Result<(), DropReason>,
) -> Result<(), DropReason>
where
    M: Deref,
    M::Target: GuestMemory,
{
    let mut seen = false;
    let mut cut = false;
    for desc in chain {
        seen = true;
        cut = desc.has_next();
        visit(&desc)?;
    }
    if !seen || cut {
        return Err(DropReason::BadDescriptor);
    }
    Ok(())
}

/// Copies what a transmit chain holds into `out` and returns its length. Refused: a descriptor the device may
/// write (a transmit chain is read-only for the device) or one outside guest memory, or a chain that cannot be
/// followed ([`DropReason::BadDescriptor`]); more bytes than `out` holds ([`DropReason::TooBig`]).
pub(crate) fn read_chain<M>(chain: DescriptorChain<M>, mem: &M::Target, out: &mut [u8]) -> Result<usize, DropReason>
where
    M: Deref,
    M::Target: GuestMemory + GuestMemoryBackend + Sized,
{
    let mut len = 0usize;
    walk(chain, |desc| {
        if desc.is_write_only() {
            return Err(DropReason::BadDescriptor);
        }
        let n = desc.len() as usize;
        let dst = out.get_mut(len..len.saturating_add(n)).ok_or(DropReason::TooBig)?;
        mem.read_slice(dst, desc.addr()).map_err(|_| DropReason::BadDescriptor)?;
        len += n;
        Ok(())
    })?;
    Ok(len)
}

/// A transmit chain ready for one gathered write: the guest's virtio header copied out (into the caller's
/// buffer), then the frame as pieces of guest memory, uncopied.
pub(crate) struct Gathered<'m> {
    /// The header as the TAP takes it (`virtio_net_hdr_v1`, `num_buffers` zero).
    pub(crate) hdr: &'m [u8],
    /// The header's piece (first) and the frame's pieces.
    pieces: [GuestIoSlice<'m>; MAX_PIECES],
    count: usize,
    /// Bytes of the guest's header the chain held (less than asked for when the chain is shorter).
    pub(crate) hdr_read: usize,
    /// Bytes of the frame after the header.
    pub(crate) frame_len: usize,
}

impl<'m> Gathered<'m> {
    /// The pieces of the write, the header's first.
    pub(crate) fn pieces(&self) -> &[GuestIoSlice<'m>] {
        &self.pieces[..self.count]
    }
}

/// Why a chain was not gathered.
pub(crate) enum NotGathered {
    /// It is refused, for the reason given (as [`read_chain`] refuses).
    Refused(DropReason),
    /// It has more pieces than one write takes: copy it instead ([`read_chain`]).
    TooManyPieces,
}

/// Gathers a transmit chain for one write without copying its frame: its first `guest_hdr_len` bytes (the
/// guest's virtio header, 10 or 12 bytes) are copied into `hdr` (the TAP's 12-byte header: what a legacy header
/// lacks and `num_buffers`, which means nothing on transmit, are zero), which becomes the first piece; the rest
/// is taken as pieces of guest memory, each checked against the map by vm-memory. The header is copied because
/// it is checked before the write: the guest cannot change it in between. The frame it may change: that only
/// changes what it sends. Refused as [`read_chain`] refuses, and more than `max_frame` bytes after the header is
/// [`DropReason::TooBig`].
pub(crate) fn gather_chain<'m, M>(
    chain: DescriptorChain<&'m M>,
    mem: &'m M,
    hdr: &'m mut [u8; VIRTIO_NET_HDR_V1_LEN],
    guest_hdr_len: usize,
    max_frame: usize,
) -> Result<Gathered<'m>, NotGathered>
where
    M: GuestMemory + GuestMemoryBackend,
{
    let mut pieces = [GuestIoSlice::EMPTY; MAX_PIECES];
    let mut count = 1; // the header's, set once it is read
    let (mut hdr_read, mut frame_len) = (0usize, 0usize);
    let mut too_many = false;
    let guest_hdr_len = guest_hdr_len.min(hdr.len());
    *hdr = [0; VIRTIO_NET_HDR_V1_LEN];
    let walked = walk(chain, |desc| {
        if desc.is_write_only() {
            return Err(DropReason::BadDescriptor);
        }
        let (mut addr, mut len) = (desc.addr(), desc.len() as usize);
        if hdr_read < guest_hdr_len {
            let n = len.min(guest_hdr_len - hdr_read);
            mem.read_slice(&mut hdr[hdr_read..hdr_read + n], addr).map_err(|_| DropReason::BadDescriptor)?;
            hdr_read += n;
            len -= n;
            addr = addr.checked_add(n as u64).ok_or(DropReason::BadDescriptor)?;
        }
        if len == 0 {
            return Ok(());
        }
        frame_len += len;
        if frame_len > max_frame {
            return Err(DropReason::TooBig);
        }
        // A piece of the guest's address range may lie in more than one region of its map.
        for slice in GuestMemoryBackend::get_slices(mem, addr, len) {
            let slice = slice.map_err(|_| DropReason::BadDescriptor)?;
            let Some(slot) = pieces.get_mut(count) else {
                too_many = true;
                // Any error ends the walk; `too_many` tells it from a refusal.
                return Err(DropReason::TooBig);
            };
            *slot = GuestIoSlice::guest(&slice);
            count += 1;
        }
        Ok(())
    });
    match walked {
        Err(_) if too_many => Err(NotGathered::TooManyPieces),
        Err(reason) => Err(NotGathered::Refused(reason)),
        Ok(()) => {
            hdr[VIRTIO_NET_HDR_LEN..].fill(0);
            let hdr: &'m [u8] = hdr;
            pieces[0] = GuestIoSlice::bytes(hdr);
            Ok(Gathered { hdr, pieces, count, hdr_read, frame_len })
        }
    }
}

/// One piece of guest memory a receive chain lends the device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub(crate) addr: GuestAddress,
    pub(crate) len: u32,
}

/// Appends the writable pieces of a receive chain to `spans` and returns how many bytes they hold. Refused
/// ([`DropReason::BadDescriptor`]): a descriptor the device may only read, one outside guest memory, no byte to
/// write at all, or a chain that cannot be followed; `spans` is then as it was.
pub(crate) fn writable_spans<M>(
    chain: DescriptorChain<M>,
    mem: &M::Target,
    spans: &mut Vec<Span>,
) -> Result<usize, DropReason>
where
    M: Deref,
    M::Target: GuestMemory + GuestMemoryBackend,
{
    let start = spans.len();
    let mut capacity = 0usize;
    let walked = walk(chain, |desc| {
        if !desc.is_write_only() || !GuestMemoryBackend::check_range(mem, desc.addr(), desc.len() as usize) {
            return Err(DropReason::BadDescriptor);
        }
        capacity += desc.len() as usize;
        spans.push(Span { addr: desc.addr(), len: desc.len() });
        Ok(())
    });
    if walked.is_err() || capacity == 0 {
        spans.truncate(start);
        return Err(DropReason::BadDescriptor);
    }
    Ok(capacity)
}

/// Copies `data` into `spans` in order; returns the bytes written, or [`DropReason::BadDescriptor`] if guest
/// memory refused a write (its map changed since the spans were checked).
pub(crate) fn write_spans<M: GuestMemoryBackend + ?Sized>(
    mem: &M,
    spans: &[Span],
    data: &[u8],
) -> Result<usize, DropReason> {
    let mut done = 0usize;
    for span in spans {
        if done == data.len() {
            break;
        }
        let n = (span.len as usize).min(data.len() - done);
        mem.write_slice(&data[done..done + n], span.addr).map_err(|_| DropReason::BadDescriptor)?;
        done += n;
    }
    Ok(done)
}
