//! A guest's descriptor chains, read and written only through vm-memory's checked accessors: every address and
//! length comes from the guest, so each access is bounds-checked against its memory map and a chain that cannot
//! be followed is reported, never trusted.

use std::ops::Deref;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryBackend};

use crate::dataplane::stats::DropReason;
use crate::sys::guest::GuestIoSlice;
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

/// What [`take_header`] found in a transmit chain.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxFrame {
    /// Bytes of the guest's header the chain held (less than asked for when the chain is shorter).
    pub(crate) hdr_read: usize,
    /// Bytes of the frame after the header.
    pub(crate) frame_len: usize,
}

/// Walks a transmit chain once: its first `guest_hdr_len` bytes (the guest's virtio header, 10 or 12 bytes) are
/// copied into `hdr` (the TAP's 12-byte header: what a legacy header lacks and `num_buffers`, which means nothing
/// on transmit, are zero), and where the frame's bytes lie in guest memory is appended to `spans`, unread.
/// The header is copied because it is checked before the write: the guest cannot change it in between. The
/// frame's bytes are then copied ([`copy_spans`]) or written from where they lie ([`guest_pieces`]). Refused
/// ([`DropReason::BadDescriptor`]): a descriptor the device may write (a transmit chain is read-only for the
/// device), a header outside guest memory, or a chain that cannot be followed; more than `max_frame` bytes
/// after the header is [`DropReason::TooBig`].
pub(crate) fn take_header<M>(
    chain: DescriptorChain<&M>,
    mem: &M,
    hdr: &mut [u8; VIRTIO_NET_HDR_V1_LEN],
    guest_hdr_len: usize,
    max_frame: usize,
    spans: &mut Vec<Span>,
) -> Result<TxFrame, DropReason>
where
    M: GuestMemory + GuestMemoryBackend,
{
    spans.clear();
    let guest_hdr_len = guest_hdr_len.min(hdr.len());
    *hdr = [0; VIRTIO_NET_HDR_V1_LEN];
    let (mut hdr_read, mut frame_len) = (0usize, 0usize);
    walk(chain, |desc| {
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
        spans.push(Span { addr, len: len as u32 });
        Ok(())
    })?;
    hdr[VIRTIO_NET_HDR_LEN..].fill(0);
    Ok(TxFrame { hdr_read, frame_len })
}

/// Copies the bytes of `spans` into `out` (which holds them: their lengths were summed by [`take_header`]);
/// [`DropReason::BadDescriptor`] if a span is not guest memory.
pub(crate) fn copy_spans<M: GuestMemoryBackend + ?Sized>(
    mem: &M,
    spans: &[Span],
    out: &mut [u8],
) -> Result<(), DropReason> {
    let mut at = 0usize;
    for span in spans {
        let len = span.len as usize;
        let dst = out.get_mut(at..at + len).ok_or(DropReason::TooBig)?;
        mem.read_slice(dst, span.addr).map_err(|_| DropReason::BadDescriptor)?;
        at += len;
    }
    Ok(())
}

/// The pieces of one gathered write: `hdr` first, then the frame's bytes where they lie in guest memory (each
/// span checked against the map by vm-memory, a span across two regions in two pieces), into `pieces`. The
/// number of pieces; `None` when they do not fit `pieces` (copy instead). [`DropReason::BadDescriptor`] if a
/// span is not guest memory.
pub(crate) fn guest_pieces<'m, M>(
    mem: &'m M,
    hdr: &'m [u8],
    spans: &[Span],
    pieces: &mut [GuestIoSlice<'m>],
) -> Result<Option<usize>, DropReason>
where
    M: GuestMemory + GuestMemoryBackend,
{
    let Some(first) = pieces.first_mut() else { return Ok(None) };
    *first = GuestIoSlice::bytes(hdr);
    let mut count = 1;
    for span in spans {
        // A piece of the guest's address range may lie in more than one region of its map.
        for slice in GuestMemoryBackend::get_slices(mem, span.addr, span.len as usize) {
            let slice = slice.map_err(|_| DropReason::BadDescriptor)?;
            let Some(slot) = pieces.get_mut(count) else { return Ok(None) };
            *slot = GuestIoSlice::guest(&slice);
            count += 1;
        }
    }
    Ok(Some(count))
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
