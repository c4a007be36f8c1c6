//! Gathered writes from a virtual machine's memory (feature `vhost-user`): the pieces of a guest's transmit
//! chain handed to the kernel as they lie in the guest's mapping, without a copy.

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd};

use vm_memory::bitmap::BitmapSlice;
use vm_memory::VolatileSlice;

/// A piece of memory for a gathered write, as the kernel takes it (`struct iovec`): a piece of guest memory,
/// borrowed from its map for `'m` so that it cannot outlive the mapping, or of the caller's own bytes.
///
/// No Rust reference to guest memory is ever made: the guest may change it at any time, which only the kernel's
/// copy (inside `writev`) sees.
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub(crate) struct GuestIoSlice<'m> {
    iov: libc::iovec,
    _borrow: PhantomData<&'m [u8]>,
}

impl<'m> GuestIoSlice<'m> {
    /// An empty piece, to fill a fixed array with.
    pub(crate) const EMPTY: GuestIoSlice<'static> =
        GuestIoSlice { iov: libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }, _borrow: PhantomData };

    /// A piece of guest memory, as vm-memory checked it against the map.
    pub(crate) fn guest<B: BitmapSlice>(slice: &VolatileSlice<'m, B>) -> GuestIoSlice<'m> {
        // The guard maps nothing without vm-memory's `xen` feature (not enabled here): the pointer stays valid
        // for as long as the map the slice borrows, not only while the guard lives.
        let guard = slice.ptr_guard();
        GuestIoSlice {
            iov: libc::iovec { iov_base: guard.as_ptr().cast_mut().cast(), iov_len: guard.len() },
            _borrow: PhantomData,
        }
    }

    /// A piece of the caller's bytes (a header built here).
    pub(crate) fn bytes(bytes: &'m [u8]) -> GuestIoSlice<'m> {
        GuestIoSlice {
            iov: libc::iovec { iov_base: bytes.as_ptr().cast_mut().cast(), iov_len: bytes.len() },
            _borrow: PhantomData,
        }
    }
}

/// One write gathered from the pieces (`writev`).
pub(crate) fn writev_guest(fd: BorrowedFd<'_>, pieces: &[GuestIoSlice<'_>]) -> io::Result<usize> {
    let count = pieces.len().min(libc::c_int::MAX as usize) as libc::c_int;
    // SAFETY: `GuestIoSlice` is `repr(transparent)` over `libc::iovec` (its other field is zero-sized), so the
    // slice is an array of iovecs. Each points to memory that stays mapped for the call: guest memory borrowed
    // from its map for the lifetime the pieces carry (the map is not dropped while a `VolatileSlice` of it
    // lives), or the caller's own bytes. The kernel only reads them; memory the guest changes meanwhile only
    // changes the bytes written, never what is valid to read.
    super::cvt_size(unsafe { libc::writev(fd.as_raw_fd(), pieces.as_ptr().cast::<libc::iovec>(), count) })
}
