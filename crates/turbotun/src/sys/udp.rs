//! UDP sockets: batched sends and receives (`sendmmsg`, `recvmmsg` with their control messages), the socket
//! options the load generator and sink set, and the monotonic clock their datagrams are stamped with.
//!
//! Messages live back to back in one caller-owned buffer, one fixed-size slot each, so that a batch needs no
//! allocation: the message headers, iovecs and control buffers are arrays on the stack, filled per call.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::cvt;

/// Most messages one [`send_mmsg`] or [`recv_mmsg`] call handles (the kernel's limit, `UIO_MAXIOV`, is 1024; 64
/// keeps the stack arrays at a few KiB and is already past the point where the per-call cost stops mattering).
pub const MAX_MMSG: usize = 64;

/// `UDP_GRO`: the socket option and the control message that carries the segment size of a coalesced read.
const UDP_GRO: libc::c_int = 104;

/// Room for the control messages one received datagram can carry here: `UDP_GRO` (an int) and `SO_RXQ_OVFL`
/// (a u32), each `CMSG_SPACE(4)` = 24 bytes on 64-bit; 64 leaves room for one more without truncation.
const CMSG_ROOM: usize = 64;

/// A control buffer aligned for `struct cmsghdr` (whose first member is a `size_t`).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CmsgBuf([u8; CMSG_ROOM]);

/// `sendmmsg` of `count` messages of `msg_len` bytes each, taken back to back from the start of `buf`, on a
/// connected socket. Returns how many the kernel took (fewer than asked when it stopped at an error, which it
/// then reports on the next call). `count` is capped at [`MAX_MMSG`] and at what `buf` holds.
pub fn send_mmsg(fd: BorrowedFd<'_>, buf: &[u8], msg_len: usize, count: usize) -> io::Result<usize> {
    let count = count.min(MAX_MMSG).min(buf.len().checked_div(msg_len).unwrap_or(0));
    if count == 0 {
        return Ok(0);
    }
    let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_MMSG];
    // SAFETY: mmsghdr is plain data (pointers, lengths, flags); all-zero is a valid empty header.
    let mut hdrs: [libc::mmsghdr; MAX_MMSG] = unsafe { std::mem::zeroed() };
    for (i, (v, h)) in iov.iter_mut().zip(hdrs.iter_mut()).take(count).enumerate() {
        // The kernel only reads through this pointer (sendmmsg never writes message data).
        *v = libc::iovec { iov_base: buf[i * msg_len..].as_ptr().cast_mut().cast(), iov_len: msg_len };
        h.msg_hdr.msg_iov = v;
        h.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: the first `count` headers each point to one iovec describing `msg_len` bytes inside `buf`, which is
    // borrowed for the call and only read; no address or control data is passed (the socket is connected).
    let sent = cvt(unsafe { libc::sendmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr(), count as libc::c_uint, 0) })?;
    Ok(sent as usize)
}

/// What one received message was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecvMeta {
    /// Bytes received into the message's slot.
    pub len: usize,
    /// The segment size of a `UDP_GRO` read (several datagrams coalesced into the slot), 0 for one datagram.
    pub gso_size: u16,
    /// The socket's drop counter (`SO_RXQ_OVFL`) as of this datagram; the kernel attaches it only once it is
    /// non-zero.
    pub drops: Option<u32>,
    /// `MSG_TRUNC` or `MSG_CTRUNC`: the datagram or its control data did not fit.
    pub truncated: bool,
}

/// `recvmmsg` with `MSG_WAITFORONE` into back-to-back slots of `slot` bytes in `buf`, at most `meta.len()` (and
/// [`MAX_MMSG`]) messages: sleeps (up to the socket's `SO_RCVTIMEO`) until one datagram is there, then takes
/// whatever else is queued without waiting. Fills `meta[..n]` and returns `n`.
pub fn recv_mmsg(fd: BorrowedFd<'_>, buf: &mut [u8], slot: usize, meta: &mut [RecvMeta]) -> io::Result<usize> {
    let count = meta.len().min(MAX_MMSG).min(buf.len().checked_div(slot).unwrap_or(0));
    if count == 0 {
        return Ok(0);
    }
    let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_MMSG];
    let mut cmsg = [CmsgBuf([0; CMSG_ROOM]); MAX_MMSG];
    // SAFETY: mmsghdr is plain data (pointers, lengths, flags); all-zero is a valid empty header.
    let mut hdrs: [libc::mmsghdr; MAX_MMSG] = unsafe { std::mem::zeroed() };
    for (i, ((v, h), c)) in iov.iter_mut().zip(hdrs.iter_mut()).zip(cmsg.iter_mut()).take(count).enumerate() {
        *v = libc::iovec { iov_base: buf[i * slot..].as_mut_ptr().cast(), iov_len: slot };
        h.msg_hdr.msg_iov = v;
        h.msg_hdr.msg_iovlen = 1;
        h.msg_hdr.msg_control = c.0.as_mut_ptr().cast();
        h.msg_hdr.msg_controllen = CMSG_ROOM as _;
    }
    // SAFETY: the first `count` headers each point to one iovec over `slot` bytes of `buf` (exclusively borrowed,
    // the slots do not overlap) and to their own `CMSG_ROOM`-byte control buffer; no source address is asked for;
    // a null timeout leaves the wait to SO_RCVTIMEO.
    let got = unsafe {
        libc::recvmmsg(
            fd.as_raw_fd(),
            hdrs.as_mut_ptr(),
            count as libc::c_uint,
            libc::MSG_WAITFORONE,
            std::ptr::null_mut(),
        )
    };
    let got = cvt(got)? as usize;
    for (h, m) in hdrs.iter().zip(meta.iter_mut()).take(got) {
        *m = RecvMeta {
            len: h.msg_len as usize,
            truncated: h.msg_hdr.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0,
            ..RecvMeta::default()
        };
        parse_cmsgs(&h.msg_hdr, m);
    }
    Ok(got)
}

/// Reads the `UDP_GRO` and `SO_RXQ_OVFL` control messages the kernel wrote for one message.
fn parse_cmsgs(hdr: &libc::msghdr, meta: &mut RecvMeta) {
    // SAFETY: `hdr` was filled by recvmmsg: msg_control points to its control buffer (still alive on the
    // caller's stack) and msg_controllen says how much of it the kernel wrote; CMSG_FIRSTHDR checks that length.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(hdr) };
    while !c.is_null() {
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR only return headers that lie wholly inside the written control data.
        let (level, kind, len) = unsafe { ((*c).cmsg_level, (*c).cmsg_type, (*c).cmsg_len as usize) };
        // SAFETY: CMSG_LEN is arithmetic on its argument.
        let four = unsafe { libc::CMSG_LEN(4) } as usize;
        if len >= four {
            // SAFETY: the header's length covers at least 4 data bytes after it; read unaligned because the
            // data's alignment is the kernel's business.
            let value = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<u32>()) };
            match (level, kind) {
                (libc::SOL_UDP, UDP_GRO) => meta.gso_size = u16::try_from(value).unwrap_or(u16::MAX),
                (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => meta.drops = Some(value),
                _ => {}
            }
        }
        // SAFETY: `c` is a header inside `hdr`'s control data (see above); NXTHDR returns null past its end.
        c = unsafe { libc::CMSG_NXTHDR(hdr, c) };
    }
}

fn setsockopt_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live local.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

fn getsockopt_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into a live local of that size and updates `len`.
    cvt(unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, (&mut value as *mut libc::c_int).cast(), &mut len) })?;
    Ok(value)
}

/// `SO_RCVBUFFORCE`: a receive buffer past `net.core.rmem_max` (needs CAP_NET_ADMIN; EPERM otherwise).
pub fn set_rcvbuf_force(fd: BorrowedFd<'_>, bytes: i32) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, bytes)
}

/// `SO_RCVBUF`: a receive buffer up to `net.core.rmem_max`.
pub fn set_rcvbuf(fd: BorrowedFd<'_>, bytes: i32) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes)
}

/// The receive buffer the socket has (the kernel doubles what was asked, for its bookkeeping).
pub fn rcvbuf(fd: BorrowedFd<'_>) -> io::Result<i32> {
    getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)
}

/// `SO_SNDBUF`: a send buffer up to `net.core.wmem_max`.
pub fn set_sndbuf(fd: BorrowedFd<'_>, bytes: i32) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, bytes)
}

/// `SO_RXQ_OVFL`: every received datagram carries the socket's drop counter as a control message.
pub fn set_rxq_ovfl(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, on.into())
}

/// `UDP_GRO`: the kernel may coalesce datagrams of one flow into one read, with their size as a control message.
pub fn set_udp_gro(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_UDP, UDP_GRO, on.into())
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `std::time::Instant` reads, as a number that another process on
/// the same machine can compare with its own reading (what a one-way latency needs).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into a live local; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}
