//! Queues opened elsewhere: adopting a tun fd ([`Queue::from_fd`], [`Queue::from_borrowed_fd`]) and handing
//! queue fds from one process to another over a Unix socket ([`send_queues`], [`recv_queues`]).
//!
//! The usual split: a small privileged process opens and configures the devices, then hands their fds to an
//! unprivileged forwarder, which never needs a capability (as with Android's `VpnService`, which gives an app
//! the fd of a TUN device it could not create).
//!
//! What an adopted fd tells about itself: its device's name and flags (`TUNGETIFF`: TUN or TAP, `IFF_VNET_HDR`)
//! and its virtio header size (`TUNGETVNETHDRSZ`). The kernel has no `TUNGETOFFLOAD`, so the offloads are
//! read from the device's active netdev features (`SIOCETHTOOL`, as `ethtool -k` shows them) where the device
//! is visible in the caller's network namespace; elsewhere [`Queue::from_fd`] fails and
//! [`Queue::from_fd_with_offloads`] takes them from the caller. The packet information header cannot be told
//! from `TUNGETIFF` (the kernel reports `IFF_NOFILTER` on the same bit): it is refused where rtnetlink shows the
//! device, and assumed off elsewhere.
//!
//! The message [`send_queues`] writes: one `sendmsg` with the fds as `SCM_RIGHTS` and a header, little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `TTQH` |
//! | 2 | version, [`VERSION`] |
//! | 2 | length of the whole header in bytes |
//! | 1 | mode: 0 TUN, 1 TAP |
//! | 1 | virtio header size (0, 10, 12 or 20) |
//! | 2 | queue count: the number of fds attached |
//! | 4 | offloads (`TUNSETOFFLOAD` bits) |
//! | 1 | name length (1 to 15) |
//! | n | the device's name |
//!
//! [`recv_queues`] trusts nothing in it: the length, version, every field's range and the fd count are checked,
//! every fd is asked what it is (and compared with the header), and on any failure every received fd is closed.

use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};

use crate::device::{Mode, Offloads};
use crate::error::{validate_ifname, Error, Result};
use crate::queue::Queue;
use crate::sys::{self, iff};

/// The header version this build writes and reads.
pub const VERSION: u16 = 1;
/// Most queues one message carries (the tun driver's limit, `MAX_TAP_QUEUES`).
pub const MAX_QUEUES: usize = 256;

const MAGIC: [u8; 4] = *b"TTQH";
/// Magic, version and length: read first, then the rest of the header.
const PREFIX_LEN: usize = 8;
/// The fixed fields before the name.
const FIXED_LEN: usize = PREFIX_LEN + 1 + 1 + 2 + 4 + 1;
const MAX_HEADER_LEN: usize = FIXED_LEN + sys::IFNAMSIZ - 1;

/// What a hand-over message says about the queues it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoverHeader {
    /// The device's interface name.
    pub name: String,
    /// TUN or TAP.
    pub mode: Mode,
    /// The virtio header size in front of every packet (0 without `IFF_VNET_HDR`).
    pub vnet_hdr_len: usize,
    /// The offloads granted on the device.
    pub offloads: Offloads,
    /// The number of queue fds that come with the header.
    pub queues: usize,
}

impl HandoverHeader {
    /// The header's bytes, as [`send_queues`] writes them.
    pub fn encode(&self) -> Result<Vec<u8>> {
        validate_ifname(&self.name)?;
        if self.name.contains('%') {
            return Err(Error::InvalidConfig(format!("{:?} is a name template, not a device's name", self.name)));
        }
        if !matches!(self.vnet_hdr_len, 0 | 10 | 12 | 20) {
            return Err(Error::InvalidConfig(format!(
                "virtio header size {} is not 0, 10, 12 or 20",
                self.vnet_hdr_len
            )));
        }
        if self.queues == 0 || self.queues > MAX_QUEUES {
            return Err(Error::InvalidConfig(format!("{} queues: a hand-over carries 1 to {MAX_QUEUES}", self.queues)));
        }
        let len = FIXED_LEN + self.name.len();
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(len as u16).to_le_bytes());
        out.push(match self.mode {
            Mode::Tun => 0,
            Mode::Tap => 1,
        });
        out.push(self.vnet_hdr_len as u8);
        out.extend_from_slice(&(self.queues as u16).to_le_bytes());
        out.extend_from_slice(&self.offloads.bits().to_le_bytes());
        out.push(self.name.len() as u8);
        out.extend_from_slice(self.name.as_bytes());
        Ok(out)
    }

    /// Parses a whole header, checking every field; the error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<HandoverHeader> {
        let bad = |why: String| Err(Error::InvalidConfig(format!("queue hand-over message refused: {why}")));
        if bytes.len() < PREFIX_LEN {
            return bad(format!("{} bytes, shorter than the {PREFIX_LEN}-byte prefix", bytes.len()));
        }
        if bytes[..4] != MAGIC {
            return bad(format!("magic {:02x?} is not {MAGIC:02x?} (\"TTQH\"): the peer is no turbotun", &bytes[..4]));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != VERSION {
            return bad(format!(
                "version {version}, this turbotun speaks {VERSION}: use the same turbotun on both ends"
            ));
        }
        let len = usize::from(u16::from_le_bytes([bytes[6], bytes[7]]));
        if len != bytes.len() || !(FIXED_LEN + 1..=MAX_HEADER_LEN).contains(&len) {
            return bad(format!("header length {len} (got {} bytes, at most {MAX_HEADER_LEN} allowed)", bytes.len()));
        }
        let mode = match bytes[8] {
            0 => Mode::Tun,
            1 => Mode::Tap,
            other => return bad(format!("mode {other} is neither 0 (tun) nor 1 (tap)")),
        };
        let vnet_hdr_len = usize::from(bytes[9]);
        if !matches!(vnet_hdr_len, 0 | 10 | 12 | 20) {
            return bad(format!("virtio header size {vnet_hdr_len} is not 0, 10, 12 or 20"));
        }
        let queues = usize::from(u16::from_le_bytes([bytes[10], bytes[11]]));
        if queues == 0 || queues > MAX_QUEUES {
            return bad(format!("{queues} queues, not 1 to {MAX_QUEUES}"));
        }
        let bits = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        let Some(offloads) = Offloads::from_bits(bits) else {
            return bad(format!("offload bits {bits:#x} include unknown ones"));
        };
        if vnet_hdr_len == 0 && !offloads.is_empty() {
            return bad(format!("offloads {offloads} without a virtio header"));
        }
        let name_len = usize::from(bytes[16]);
        if FIXED_LEN + name_len != len {
            return bad(format!("name length {name_len} does not fit header length {len}"));
        }
        let Ok(name) = std::str::from_utf8(&bytes[FIXED_LEN..]) else {
            return bad("device name is not UTF-8".into());
        };
        validate_ifname(name)?;
        if name.contains('%') {
            return bad(format!("{name:?} is a name template, not a device's name"));
        }
        Ok(HandoverHeader { name: name.to_string(), mode, vnet_hdr_len, offloads, queues })
    }
}

/// What `TUNGETIFF` and `TUNGETVNETHDRSZ` say about a tun fd.
struct FdFacts {
    name: String,
    mode: Mode,
    vnet_hdr_len: usize,
}

/// What an fd is, as `/proc/self/fd` names it (`pipe:[1234]`, `socket:[5678]`, `/dev/null`), for errors.
fn describe_fd(fd: BorrowedFd<'_>) -> String {
    let raw = fd.as_raw_fd();
    match std::fs::read_link(format!("/proc/self/fd/{raw}")) {
        Ok(target) => format!("fd {raw} ({})", target.display()),
        Err(_) => format!("fd {raw}"),
    }
}

fn fd_facts(fd: BorrowedFd<'_>) -> Result<FdFacts> {
    let (name, flags) = sys::tun_get_iff(fd).map_err(|e| {
        let what = describe_fd(fd);
        match e.raw_os_error() {
            Some(libc::EBADFD) => Error::InvalidConfig(format!(
                "{what} is /dev/net/tun but attached to no device: attach it with TUNSETIFF before handing it over"
            )),
            Some(libc::ENOTTY) | Some(libc::EINVAL) | Some(libc::ENOTSOCK) | Some(libc::EBADF) => {
                Error::InvalidConfig(format!("{what} is not a TUN/TAP queue: pass an fd of /dev/net/tun"))
            }
            _ => Error::io(format!("TUNGETIFF on {what}"), e),
        }
    })?;
    let mode = match (flags & iff::TUN != 0, flags & iff::TAP != 0) {
        (true, false) => Mode::Tun,
        (false, true) => Mode::Tap,
        _ => {
            return Err(Error::InvalidConfig(format!(
                "{} reports flags {flags:#x}: neither TUN nor TAP",
                describe_fd(fd)
            )))
        }
    };
    let vnet_hdr_len = if flags & iff::VNET_HDR != 0 {
        sys::tun_get_vnet_hdr_sz(fd).map_err(|e| Error::io(format!("TUNGETVNETHDRSZ on {name}"), e))? as usize
    } else {
        0
    };
    Ok(FdFacts { name, mode, vnet_hdr_len })
}

/// Refuses a device with the packet information header, where rtnetlink shows it (a `Queue` carries none).
fn check_no_packet_info(name: &str) -> Result<()> {
    let info = crate::netlink::Netlink::new().and_then(|mut nl| nl.link(name)).ok().and_then(|link| link.tun);
    match info {
        Some(tun) if !tun.no_pi => Err(Error::InvalidConfig(format!(
            "{name} was opened with the packet information header (no IFF_NO_PI): turbotun queues carry none"
        ))),
        _ => Ok(()),
    }
}

/// The active offloads of a device visible in this namespace; `None` if it is not visible here.
fn visible_offloads(name: &str, vnet_hdr_len: usize) -> Result<Option<Offloads>> {
    if vnet_hdr_len == 0 {
        // Without a virtio header the kernel can hand over no super-packet, whatever the features say.
        return Ok(Some(Offloads::NONE));
    }
    match sys::ethtool::features(name) {
        Ok(features) => Ok(Some(crate::inspect::offloads_from_features(&features))),
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(Error::io(format!("ethtool features of {name}"), e)),
    }
}

impl Queue {
    /// Adopts a tun fd opened elsewhere (another process, a privileged helper, a platform API). The fd must be
    /// attached to a device; its name, TUN/TAP and virtio header size are asked of the kernel, its offloads read
    /// through `SIOCETHTOOL` (there is no `TUNGETOFFLOAD`). When the device is not visible in this network
    /// namespace the offloads cannot be read: the error says to use [`Self::from_fd_with_offloads`]. A pipe, a
    /// socket, `/dev/null` or an unattached `/dev/net/tun` is refused with an error naming it. The queue owns
    /// the fd from now on and closes it when dropped; its index is 0 (adopted fds have no order).
    pub fn from_fd(fd: OwnedFd) -> Result<Queue> {
        adopt(fd, None, 0)
    }

    /// Like [`Self::from_fd`], but works on a duplicate (`F_DUPFD_CLOEXEC`): the caller keeps its fd, which
    /// turbotun never closes (Android's `VpnService` owns the fd it hands out). The duplicate shares the open
    /// file, so `O_NONBLOCK` set on the queue (as the forwarder does for some I/O kinds) is seen through both.
    pub fn from_borrowed_fd(fd: BorrowedFd<'_>) -> Result<Queue> {
        let own = fd.try_clone_to_owned().map_err(|e| Error::io(format!("duplicating {}", describe_fd(fd)), e))?;
        Queue::from_fd(own)
    }

    /// Adopts a tun fd whose offloads the caller knows (e.g. from a [`HandoverHeader`], or from the platform
    /// that opened it); name, mode and header size are still asked of the kernel. Where the device is visible
    /// in this namespace its active features win over `offloads`.
    pub fn from_fd_with_offloads(fd: OwnedFd, offloads: Offloads) -> Result<Queue> {
        adopt(fd, Some(offloads), 0)
    }
}

/// Asks the fd what it is and wraps it; `offloads` is the caller's word where the device is not visible here.
fn adopt(fd: OwnedFd, offloads: Option<Offloads>, index: usize) -> Result<Queue> {
    let facts = fd_facts(fd.as_fd())?;
    check_no_packet_info(&facts.name)?;
    let offloads = match (visible_offloads(&facts.name, facts.vnet_hdr_len)?, offloads) {
        (Some(seen), _) => seen,
        (None, Some(given)) => given,
        (None, None) => {
            return Err(Error::InvalidConfig(format!(
                "{} is not visible in this network namespace, so its offloads cannot be read: use \
                 Queue::from_fd_with_offloads with the offloads it was opened with",
                facts.name
            )))
        }
    };
    let offloads = if facts.vnet_hdr_len == 0 { Offloads::NONE } else { offloads };
    Ok(Queue::new(fd, Arc::from(facts.name), index, facts.mode, facts.vnet_hdr_len, offloads))
}

/// Sends the queues of one device over a connected Unix stream socket: one message with a [`HandoverHeader`]
/// and the fds as `SCM_RIGHTS`. The queues stay usable here; the receiver gets its own references to the same
/// open files, so the device lives on after this process closes its copies.
pub fn send_queues(socket: &UnixStream, queues: &[&Queue]) -> Result<()> {
    let Some(first) = queues.first() else {
        return Err(Error::InvalidConfig("no queue to hand over".into()));
    };
    if let Some(other) = queues.iter().find(|q| q.name() != first.name()) {
        return Err(Error::InvalidConfig(format!(
            "one hand-over carries one device's queues: {} and {} differ",
            first.name(),
            other.name()
        )));
    }
    let header = HandoverHeader {
        name: first.name().to_string(),
        mode: first.mode(),
        vnet_hdr_len: first.vnet_hdr_len(),
        offloads: first.offloads(),
        queues: queues.len(),
    }
    .encode()?;
    let fds: Vec<BorrowedFd<'_>> = queues.iter().map(|q| q.as_fd()).collect();
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(Error::InvalidConfig(format!("{} fds do not fit one control message", fds.len())));
    }
    let sent = rustix::net::sendmsg(socket, &[IoSlice::new(&header)], &mut control, SendFlags::NOSIGNAL)
        .map_err(|e| Error::io(format!("sending the queues of {} (sendmsg)", first.name()), e.into()))?;
    if sent != header.len() {
        // A stream socket takes a message this small whole, or fails: anything else would lose the fds' framing.
        return Err(Error::io(
            format!("sending the queues of {}", first.name()),
            std::io::Error::new(std::io::ErrorKind::WriteZero, format!("sent {sent} of {} bytes", header.len())),
        ));
    }
    Ok(())
}

/// Who is at the other end of a connected Unix socket, as the kernel recorded it at `connect` (`SO_PEERCRED`):
/// process id, user id, group id. Unforgeable by the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// The peer's process id when it connected.
    pub pid: i32,
    /// Its effective user id.
    pub uid: u32,
    /// Its effective group id.
    pub gid: u32,
}

/// [`PeerCredentials`] of `socket`'s peer.
pub fn peer_credentials(socket: &UnixStream) -> Result<PeerCredentials> {
    let cred = rustix::net::sockopt::socket_peercred(socket)
        .map_err(|e| Error::io("reading the peer's credentials (SO_PEERCRED)", e.into()))?;
    Ok(PeerCredentials { pid: cred.pid.as_raw_nonzero().get(), uid: cred.uid.as_raw(), gid: cred.gid.as_raw() })
}

/// Takes queues only from a peer running as root or as this process's own (effective) user: a socket whose
/// directory lets others connect must not let them hand in devices of their own choosing. Refuses anyone else
/// with an error naming them.
pub fn check_peer(socket: &UnixStream) -> Result<PeerCredentials> {
    let own_uid = nix::unistd::geteuid().as_raw();
    let peer = peer_credentials(socket)?;
    if peer.uid != 0 && peer.uid != own_uid {
        return Err(Error::InvalidConfig(format!(
            "refusing queues from pid {} (uid {}): only root or uid {own_uid} (this process's user) may hand \
             queues over; keep the socket in a directory only they can reach",
            peer.pid, peer.uid
        )));
    }
    Ok(peer)
}

/// Receives one device's queues sent by [`send_queues`]. Blocks until a message comes (set a read timeout on
/// the socket to bound the wait). Everything in the message is checked (see the module documentation); every
/// fd must be a queue of the device the header names, with its mode and header size. On any error every
/// received fd is closed. The queues are numbered 0, 1, ... in the order they were sent.
pub fn recv_queues(socket: &UnixStream) -> Result<Vec<Queue>> {
    Ok(recv_queues_with_header(socket)?.1)
}

/// Like [`recv_queues`], also returning the header the peer sent.
pub fn recv_queues_with_header(socket: &UnixStream) -> Result<(HandoverHeader, Vec<Queue>)> {
    let ctx = |what: &str| format!("receiving queues: {what}");
    // The prefix first, so that nothing past this message is consumed: a stream keeps no message boundaries.
    let mut prefix = [0u8; PREFIX_LEN];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_QUEUES))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(socket, &mut [IoSliceMut::new(&mut prefix)], &mut control, RecvFlags::CMSG_CLOEXEC)
        .map_err(|e| Error::io(ctx("recvmsg"), e.into()))?;
    // The fds are ours (OwnedFd) from here on, so an early return closes them.
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if got.flags.contains(ReturnFlags::CTRUNC) {
        return Err(Error::InvalidConfig(format!(
            "queue hand-over message refused: more than {MAX_QUEUES} fds (the excess was closed by the kernel)"
        )));
    }
    if got.bytes == 0 {
        return Err(Error::io(
            ctx("the peer closed the connection without sending"),
            std::io::ErrorKind::UnexpectedEof.into(),
        ));
    }
    let mut stream = socket;
    stream.read_exact(&mut prefix[got.bytes..]).map_err(|e| Error::io(ctx("reading the header"), e))?;
    let len = usize::from(u16::from_le_bytes([prefix[6], prefix[7]]));
    let mut header = prefix.to_vec();
    if prefix[..4] == MAGIC && (PREFIX_LEN..=MAX_HEADER_LEN).contains(&len) {
        header.resize(len, 0);
        stream.read_exact(&mut header[PREFIX_LEN..]).map_err(|e| Error::io(ctx("reading the header"), e))?;
    }
    let header = HandoverHeader::decode(&header)?;
    if fds.len() != header.queues {
        return Err(Error::InvalidConfig(format!(
            "queue hand-over message refused: the header announces {} queues of {}, {} fds came",
            header.queues,
            header.name,
            fds.len()
        )));
    }
    let mut queues = Vec::with_capacity(fds.len());
    for (index, fd) in fds.into_iter().enumerate() {
        let queue = adopt(fd, Some(header.offloads), index)?;
        if queue.name() != header.name || queue.mode() != header.mode || queue.vnet_hdr_len() != header.vnet_hdr_len {
            return Err(Error::InvalidConfig(format!(
                "queue hand-over message refused: fd {index} is a queue of {} ({}, {}-byte virtio header), the \
                 header says {} ({}, {}-byte)",
                queue.name(),
                queue.mode(),
                queue.vnet_hdr_len(),
                header.name,
                header.mode,
                header.vnet_hdr_len
            )));
        }
        queues.push(queue);
    }
    Ok((header, queues))
}
