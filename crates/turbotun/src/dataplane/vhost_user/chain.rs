//! A guest's descriptor chains, read and written only through vm-memory's checked accessors: every address and
//! length comes from the guest, so each access is bounds-checked against its memory map and a chain that cannot
//! be followed is reported, never trusted.

use std::ops::Deref;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryBackend};

use crate::dataplane::stats::DropReason;

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
