//! UDP sockets: batched sends and receives (`sendmmsg`, `recvmmsg` with their control messages: segmentation
//! offload, ECN, the local address a datagram reached and the one a send leaves from, the drop counter) and the
//! socket options that no crate wraps.
//!
//! A batch needs no allocation: the message headers, addresses and control buffers are arrays on the stack,
//! filled per call; the data stays in the caller's buffers.

use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};

use super::cvt;

/// Most messages one `sendmmsg` or `recvmmsg` call here handles (the kernel's limit, `UIO_MAXIOV`, is 1024; 64
/// keeps the stack arrays at a few KiB and is already past the point where the per-call cost stops mattering).
pub const MAX_MMSG: usize = 64;

/// `UDP_GRO`: the socket option and the control message that carries the segment size of a coalesced read.
const UDP_GRO: libc::c_int = 104;

/// `UDP_SEGMENT`: the control message (a u16) that splits one send into datagrams of that size.
const UDP_SEGMENT: libc::c_int = 103;

/// Room for the control messages one received datagram can carry here: `UDP_GRO` (an int), `SO_RXQ_OVFL` (a
/// u32) and `IP_TOS` (a byte) or `IPV6_TCLASS` (an int), each `CMSG_SPACE` 24 bytes on 64-bit, and one
/// `IP_PKTINFO` (32) or `IPV6_PKTINFO` (40): 112 bytes. Sends carry at most `UDP_SEGMENT`, a TOS (24 each) and a
/// `PKTINFO` (40): 88 bytes.
const CMSG_ROOM: usize = 128;

// The kernel's layouts of the two PKTINFO structures (Linux UAPI), which sends write byte by byte.
const _: () = assert!(std::mem::size_of::<libc::in_pktinfo>() == 12);
const _: () = assert!(std::mem::size_of::<libc::in6_pktinfo>() == 20);

/// The local end of a datagram: the address it was sent to (one of this host's), and the interface it came in
/// on; for a send, the address it leaves from and (when not 0) the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalAddr {
    /// The address.
    pub ip: IpAddr,
    /// The interface index (0: none named).
    pub ifindex: u32,
}

/// A control buffer aligned for `struct cmsghdr` (whose first member is a `size_t`).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CmsgBuf([u8; CMSG_ROOM]);

/// `sendmmsg` of `count` messages of `msg_len` bytes each, taken back to back from the start of `buf`, on a
/// connected socket. Returns how many the kernel took (fewer than asked when it stopped at an error, which it
/// then reports on the next call). `count` is capped at [`MAX_MMSG`] and at what `buf` holds.
pub(crate) fn send_mmsg(fd: BorrowedFd<'_>, buf: &[u8], msg_len: usize, count: usize) -> io::Result<usize> {
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

/// One message of [`send_msgs`]: the pieces of `iov` gathered into one payload for `dest`; with `segment` > 0
/// and a payload longer than it, the kernel splits it into datagrams of `segment` bytes (`UDP_SEGMENT`, the
/// last may be shorter); with `tos`, every datagram carries that TOS byte (IPv4) or traffic class (IPv6); with
/// `source`, they leave from that address (`IP_PKTINFO`, or `IPV6_PKTINFO` for an IPv6 destination, a
/// v4-mapped one included, whose source is then given v4-mapped).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendMsg<'a> {
    /// Where the datagrams go.
    pub dest: SocketAddr,
    /// The payload, in pieces.
    pub iov: &'a [IoSlice<'a>],
    /// The datagram size of a segmented send (0: one datagram).
    pub segment: u16,
    /// The TOS byte or traffic class (its low two bits are the ECN field).
    pub tos: Option<u8>,
    /// The local address (and interface) to send from; `None`: the routing's choice.
    pub source: Option<LocalAddr>,
}

/// One control message of a send: its level, type and data (at most an `in6_pktinfo`, 20 bytes).
#[derive(Clone, Copy)]
struct Control {
    level: libc::c_int,
    kind: libc::c_int,
    data: [u8; 20],
    len: usize,
}

impl Control {
    fn new(level: libc::c_int, kind: libc::c_int, bytes: &[u8]) -> Control {
        let mut data = [0u8; 20];
        let len = bytes.len().min(data.len());
        data[..len].copy_from_slice(&bytes[..len]);
        Control { level, kind, data, len }
    }

    /// The `PKTINFO` that makes a datagram to `dest` leave from `source`: `in_pktinfo` for an IPv4 destination
    /// (the address in `ipi_spec_dst`), `in6_pktinfo` for an IPv6 one (an IPv4 source v4-mapped). `None` for an
    /// IPv6 source and an IPv4 destination, which cannot go together.
    fn pktinfo(dest: &SocketAddr, source: LocalAddr) -> Option<Control> {
        match (dest, source.ip) {
            (SocketAddr::V4(_), IpAddr::V4(ip)) => {
                let mut info = [0u8; 12];
                info[..4].copy_from_slice(&(source.ifindex as libc::c_int).to_ne_bytes());
                info[4..8].copy_from_slice(&ip.octets());
                Some(Control::new(libc::IPPROTO_IP, libc::IP_PKTINFO, &info))
            }
            (SocketAddr::V4(_), IpAddr::V6(_)) => None,
            (SocketAddr::V6(_), ip) => {
                let ip = match ip {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                    IpAddr::V6(v6) => v6,
                };
                let mut info = [0u8; 20];
                info[..16].copy_from_slice(&ip.octets());
                info[16..].copy_from_slice(&source.ifindex.to_ne_bytes());
                Some(Control::new(libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, &info))
            }
        }
    }
}

/// `sendmmsg` of `msgs` (at most [`MAX_MMSG`]) on an unconnected socket, each with its own destination and
/// control messages. Returns how many the kernel took: fewer than given when message `n` failed, whose error
/// the next call starting at `n` returns.
pub(crate) fn send_msgs(fd: BorrowedFd<'_>, msgs: &[SendMsg<'_>]) -> io::Result<usize> {
    let count = msgs.len().min(MAX_MMSG);
    if count == 0 {
        return Ok(0);
    }
    // SAFETY: sockaddr_storage and mmsghdr are plain data; all-zero is a valid empty value of each.
    let mut addrs: [libc::sockaddr_storage; MAX_MMSG] = unsafe { std::mem::zeroed() };
    let mut cmsg = [CmsgBuf([0; CMSG_ROOM]); MAX_MMSG];
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; MAX_MMSG] = unsafe { std::mem::zeroed() };
    for (((m, h), a), c) in msgs.iter().zip(hdrs.iter_mut()).zip(addrs.iter_mut()).zip(cmsg.iter_mut()).take(count) {
        h.msg_hdr.msg_namelen = write_sockaddr(m.dest, a);
        h.msg_hdr.msg_name = (a as *mut libc::sockaddr_storage).cast();
        // IoSlice is guaranteed to have the layout of `struct iovec` on Unix; the kernel only reads through it.
        h.msg_hdr.msg_iov = m.iov.as_ptr().cast_mut().cast();
        h.msg_hdr.msg_iovlen = m.iov.len();
        // A v4-mapped destination leaves as IPv4: its TOS goes at the IPv4 level.
        let v6 = matches!(m.dest, SocketAddr::V6(a) if a.ip().to_ipv4_mapped().is_none());
        let mut controls = [Control::new(0, 0, &[]); 3];
        let mut n = 0;
        if m.segment > 0 && m.iov.iter().map(|p| p.len()).sum::<usize>() > usize::from(m.segment) {
            controls[n] = Control::new(libc::SOL_UDP, UDP_SEGMENT, &m.segment.to_ne_bytes());
            n += 1;
        }
        if let Some(tos) = m.tos {
            let tos = libc::c_int::from(tos).to_ne_bytes();
            controls[n] = if v6 {
                Control::new(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, &tos)
            } else {
                Control::new(libc::IPPROTO_IP, libc::IP_TOS, &tos)
            };
            n += 1;
        }
        if let Some(pktinfo) = m.source.and_then(|source| Control::pktinfo(&m.dest, source)) {
            controls[n] = pktinfo;
            n += 1;
        }
        if n > 0 {
            h.msg_hdr.msg_control = c.0.as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = CMSG_ROOM as _;
            let mut used = 0;
            // SAFETY: msg_control points to this message's CMSG_ROOM-byte buffer (aligned for cmsghdr) and
            // msg_controllen says so; FIRSTHDR/NXTHDR stay inside it, and the three headers of at most
            // CMSG_SPACE(20) bytes (88 bytes together, see CMSG_ROOM) fit. Each data write copies the control's
            // `len` (at most 20) bytes to CMSG_DATA of its header, inside the space CMSG_LEN(len) claims.
            unsafe {
                let mut hdr = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                for control in &controls[..n] {
                    (*hdr).cmsg_level = control.level;
                    (*hdr).cmsg_type = control.kind;
                    (*hdr).cmsg_len = libc::CMSG_LEN(control.len as u32) as _;
                    std::ptr::copy_nonoverlapping(control.data.as_ptr(), libc::CMSG_DATA(hdr), control.len);
                    used += libc::CMSG_SPACE(control.len as u32) as usize;
                    hdr = libc::CMSG_NXTHDR(&h.msg_hdr, hdr);
                }
            }
            h.msg_hdr.msg_controllen = used as _;
        }
    }
    // SAFETY: the first `count` headers each point to their own address, control buffer and the caller's
    // iovec array (borrowed for the call, only read by the kernel).
    let sent = cvt(unsafe { libc::sendmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr(), count as libc::c_uint, 0) })?;
    Ok(sent as usize)
}

/// Writes `addr` as a `sockaddr_in`/`sockaddr_in6` into `storage`; returns its length.
fn write_sockaddr(addr: SocketAddr, storage: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Reads the address the kernel wrote into `storage` (`len` bytes of it).
fn read_sockaddr(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    match storage.ss_family as libc::c_int {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, and it is long enough.
            let sin = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6, and it is long enough.
            let sin6 = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            Some(SocketAddr::V6(SocketAddrV6::new(ip, port, u32::from_be(sin6.sin6_flowinfo), sin6.sin6_scope_id)))
        }
        _ => None,
    }
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
    /// Who sent it.
    pub source: Option<SocketAddr>,
    /// Its TOS byte or traffic class, when the socket asked for it (`IP_RECVTOS`, `IPV6_RECVTCLASS`).
    pub tos: Option<u8>,
    /// The address it was sent to and the interface it came in on, when the socket asked for them
    /// (`IP_PKTINFO`, `IPV6_RECVPKTINFO`; an IPv4 datagram on a dual-stack socket reports a v4-mapped address).
    pub local: Option<LocalAddr>,
}

/// `recvmmsg` into back-to-back slots of `slot` bytes in `buf`, at most `meta.len()` (and [`MAX_MMSG`])
/// messages. With `wait` (`MSG_WAITFORONE`) it sleeps (up to the socket's `SO_RCVTIMEO`) until one datagram is
/// there, then takes whatever else is queued without waiting; without (`MSG_DONTWAIT`) it never sleeps. Fills
/// `meta[..n]` (sources included) and returns `n`.
pub(crate) fn recv_mmsg(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    slot: usize,
    meta: &mut [RecvMeta],
    wait: bool,
) -> io::Result<usize> {
    let count = meta.len().min(MAX_MMSG).min(buf.len().checked_div(slot).unwrap_or(0));
    if count == 0 {
        return Ok(0);
    }
    let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_MMSG];
    let mut cmsg = [CmsgBuf([0; CMSG_ROOM]); MAX_MMSG];
    // SAFETY: sockaddr_storage and mmsghdr are plain data; all-zero is a valid empty value of each.
    let mut addrs: [libc::sockaddr_storage; MAX_MMSG] = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; MAX_MMSG] = unsafe { std::mem::zeroed() };
    for (i, (((v, h), c), a)) in
        iov.iter_mut().zip(hdrs.iter_mut()).zip(cmsg.iter_mut()).zip(addrs.iter_mut()).take(count).enumerate()
    {
        *v = libc::iovec { iov_base: buf[i * slot..].as_mut_ptr().cast(), iov_len: slot };
        h.msg_hdr.msg_iov = v;
        h.msg_hdr.msg_iovlen = 1;
        h.msg_hdr.msg_control = c.0.as_mut_ptr().cast();
        h.msg_hdr.msg_controllen = CMSG_ROOM as _;
        h.msg_hdr.msg_name = (a as *mut libc::sockaddr_storage).cast();
        h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    }
    let flags = if wait { libc::MSG_WAITFORONE } else { libc::MSG_DONTWAIT };
    // SAFETY: the first `count` headers each point to one iovec over `slot` bytes of `buf` (exclusively borrowed,
    // the slots do not overlap), to their own `CMSG_ROOM`-byte control buffer and to their own address storage;
    // a null timeout leaves the wait to SO_RCVTIMEO.
    let got = unsafe {
        libc::recvmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr(), count as libc::c_uint, flags, std::ptr::null_mut())
    };
    let got = cvt(got)? as usize;
    for ((h, m), a) in hdrs.iter().zip(meta.iter_mut()).zip(addrs.iter()).take(got) {
        *m = RecvMeta {
            len: h.msg_len as usize,
            truncated: h.msg_hdr.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0,
            source: read_sockaddr(a, h.msg_hdr.msg_namelen),
            ..RecvMeta::default()
        };
        parse_cmsgs(&h.msg_hdr, m);
    }
    Ok(got)
}

/// Reads the `UDP_GRO`, `SO_RXQ_OVFL`, `IP_TOS`, `IPV6_TCLASS`, `IP_PKTINFO` and `IPV6_PKTINFO` control
/// messages the kernel wrote for one message.
fn parse_cmsgs(hdr: &libc::msghdr, meta: &mut RecvMeta) {
    // SAFETY: `hdr` was filled by recvmmsg: msg_control points to its control buffer (still alive on the
    // caller's stack) and msg_controllen says how much of it the kernel wrote; CMSG_FIRSTHDR checks that length.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(hdr) };
    while !c.is_null() {
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR only return headers that lie wholly inside the written control data.
        let (level, kind, len) = unsafe { ((*c).cmsg_level, (*c).cmsg_type, (*c).cmsg_len as usize) };
        // SAFETY: CMSG_LEN is arithmetic on its argument.
        let (one, four, info4, info6) = unsafe {
            (
                libc::CMSG_LEN(1) as usize,
                libc::CMSG_LEN(4) as usize,
                libc::CMSG_LEN(std::mem::size_of::<libc::in_pktinfo>() as u32) as usize,
                libc::CMSG_LEN(std::mem::size_of::<libc::in6_pktinfo>() as u32) as usize,
            )
        };
        if (level, kind) == (libc::IPPROTO_IP, libc::IP_TOS) && len >= one {
            // SAFETY: the header's length covers at least the one data byte read.
            meta.tos = Some(unsafe { *libc::CMSG_DATA(c) });
        } else if (level, kind) == (libc::IPPROTO_IP, libc::IP_PKTINFO) && len >= info4 {
            // SAFETY: the header's length covers a whole in_pktinfo (plain data); read unaligned.
            let info = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::in_pktinfo>()) };
            // `ipi_addr`: the header's destination, the address the sender reached.
            let ip = Ipv4Addr::from(info.ipi_addr.s_addr.to_ne_bytes());
            meta.local = Some(LocalAddr { ip: IpAddr::V4(ip), ifindex: info.ipi_ifindex as u32 });
        } else if (level, kind) == (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) && len >= info6 {
            // SAFETY: the header's length covers a whole in6_pktinfo (plain data); read unaligned.
            let info = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::in6_pktinfo>()) };
            let ip = Ipv6Addr::from(info.ipi6_addr.s6_addr);
            meta.local = Some(LocalAddr { ip: IpAddr::V6(ip), ifindex: info.ipi6_ifindex });
        } else if len >= four {
            // SAFETY: the header's length covers at least 4 data bytes after it; read unaligned because the
            // data's alignment is the kernel's business.
            let value = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<u32>()) };
            match (level, kind) {
                (libc::SOL_UDP, UDP_GRO) => meta.gso_size = u16::try_from(value).unwrap_or(u16::MAX),
                (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => meta.drops = Some(value),
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => meta.tos = Some(value as u8),
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

/// `IP_PKTINFO` (an IPv4 socket) or `IPV6_RECVPKTINFO` (an IPv6 one, which reports IPv4 datagrams of a
/// dual-stack socket v4-mapped): every received datagram carries the address it was sent to and its interface.
pub(crate) fn set_recv_pktinfo(fd: BorrowedFd<'_>, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)
    } else {
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)
    }
}

/// `SO_RXQ_OVFL`: every received datagram carries the socket's drop counter as a control message.
#[cfg(feature = "load")]
pub(crate) fn set_rxq_ovfl(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, on.into())
}

/// `UDP_SEGMENT` on the socket: each send of up to 64 KiB leaves as datagrams of `segment_size` bytes (0: off).
pub(crate) fn set_udp_segment(fd: BorrowedFd<'_>, segment_size: u16) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_UDP, UDP_SEGMENT, segment_size.into())
}

/// `SO_NO_CHECK`: IPv4 datagrams go without a UDP checksum.
pub(crate) fn set_no_check(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_NO_CHECK, on.into())
}

/// `SO_MARK`: the firewall mark every packet of the socket carries (0: none); needs CAP_NET_ADMIN.
pub(crate) fn set_mark(fd: BorrowedFd<'_>, mark: u32) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_MARK, mark as libc::c_int)
}

/// `UDP_GRO`: the kernel may coalesce datagrams of one flow into one read, with their size as a control message.
pub(crate) fn set_udp_gro(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_UDP, UDP_GRO, on.into())
}
