//! Queues opened elsewhere: adopting a tun fd ([`Queue::from_fd`], [`Queue::from_borrowed_fd`]) and handing
//! queue fds from one process to another over a Unix socket ([`send_queues`], [`recv_queues`],
//! [`QueueListener`]).
//!
//! The usual split: a small privileged process opens and configures the devices, then hands their fds to an
//! unprivileged forwarder, which never needs a capability (as with Android's `VpnService`, which gives an app
//! the fd of a TUN device it could not create, or a VM monitor's jailer).
//!
//! What an adopted fd is comes from the fd itself and from whoever hands it over, never from a lookup by name
//! (the receiver may live in another network namespace, have a different device of that name, or be denied
//! netlink): its device's name and flags from `TUNGETIFF` (TUN or TAP, `IFF_VNET_HDR`), its virtio header size
//! from `TUNGETVNETHDRSZ`, and its offloads from the caller ([`Queue::from_fd`]) or the sender (the hand-over
//! header), since the kernel has no `TUNGETOFFLOAD`. The packet information header cannot be told from
//! `TUNGETIFF` (the kernel reports `IFF_NOFILTER` on the same bit), so [`send_queues`] refuses a queue opened
//! with it and [`Queue::from_fd`] documents that it takes none.
//!
//! Both ends check who is at the other end before anything crosses (`SO_PEERCRED`): the receiver takes queues
//! only from root or its own user ([`check_sender`]), the sender hands them only to root or the user it was
//! told ([`check_receiver`]), so that neither a stranger's device nor the device's traffic ends up with someone
//! who bound the path first.
//!
//! The message [`send_queues`] writes: one `sendmsg` with the fds as `SCM_RIGHTS` and a header, little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `TTQH` |
//! | 2 | version, [`VERSION`] |
//! | 2 | length of the whole header in bytes |
//! | 1 | mode: 0 TUN, 1 TAP |
//! | 1 | virtio header size (0, 10, 12, 20 or 24) |
//! | 2 | queue count: the number of fds attached |
//! | 4 | offloads (`TUNSETOFFLOAD` bits) the sender set |
//! | 1 | name length (1 to 15) |
//! | n | the device's name |
//!
//! [`recv_queues`] trusts nothing in it: the length, version, every field's range and the fd count are checked,
//! every fd is asked what it is (and compared with the header), and on any failure every received fd is closed.

use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};

use crate::devices::mode::Mode;
use crate::devices::offloads::Offloads;
use crate::devices::queue::Queue;
use crate::error::{validate_ifname, ConfigError, Error, Result};
use crate::stop::StopHandle;
use crate::sys::{self, iff};

pub(crate) mod error;
pub use error::{HandoverError, PeerCredentials};

/// The header version this build writes and reads.
pub const VERSION: u16 = 1;
/// Most queues one message carries: all a device can have.
pub use crate::devices::device::MAX_QUEUES;

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
            return Err(Error::Config(ConfigError::Handover {
                why: format!("{:?} is a name template, not a device's name", self.name),
            }));
        }
        crate::devices::vnet_hdr::check_vnet_hdr_len(&self.name, self.vnet_hdr_len)?;
        if self.queues == 0 || self.queues > MAX_QUEUES {
            return Err(Error::Config(ConfigError::QueueCount {
                why: format!("{} queues: a hand-over carries 1 to {MAX_QUEUES}", self.queues),
            }));
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
        let bad = |why: String| Err(Error::Config(ConfigError::HandoverMessage { why }));
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
        if crate::devices::vnet_hdr::check_vnet_hdr_len("", vnet_hdr_len).is_err() {
            return bad(format!("virtio header size {vnet_hdr_len} is not 0, 10, 12, 20 or 24"));
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
            Some(libc::EBADFD) => Error::NotATunQueue { what, unattached: true },
            Some(libc::ENOTTY) | Some(libc::EINVAL) | Some(libc::ENOTSOCK) | Some(libc::EBADF) => {
                Error::NotATunQueue { what, unattached: false }
            }
            _ => Error::io(format!("TUNGETIFF on {what}"), e),
        }
    })?;
    let mode = match (flags & iff::TUN != 0, flags & iff::TAP != 0) {
        (true, false) => Mode::Tun,
        (false, true) => Mode::Tap,
        _ => {
            return Err(Error::Config(ConfigError::Handover {
                why: format!("{} reports flags {flags:#x}: neither TUN nor TAP", describe_fd(fd)),
            }))
        }
    };
    let vnet_hdr_len = if flags & iff::VNET_HDR != 0 {
        sys::tun_get_vnet_hdr_sz(fd).map_err(|e| Error::io(format!("TUNGETVNETHDRSZ on {name}"), e))? as usize
    } else {
        0
    };
    Ok(FdFacts { name, mode, vnet_hdr_len })
}

impl Queue {
    /// Adopts a tun fd opened elsewhere (another process, a privileged parent, a platform API), with the fd alone:
    /// its device's name, TUN or TAP and virtio header size are asked of the fd (`TUNGETIFF`,
    /// `TUNGETVNETHDRSZ`); `offloads` are the ones the caller knows were set (there is no `TUNGETOFFLOAD`; a
    /// caller that does not know them sets them with [`Queue::set_offloads`] after adopting). No netlink, no
    /// ethtool and no lookup by name: it works in a jail or another network namespace. The fd must carry no
    /// packet information header (`IFF_NO_PI`), which the kernel cannot be asked about.
    ///
    /// A pipe, a socket, `/dev/null` or an unattached `/dev/net/tun` is refused with an error naming it, as is a
    /// virtio header size outside [`crate::device::VNET_HDR_SIZES`], or offloads on an fd without a virtio
    /// header. The queue owns the fd from now on and closes it when dropped; its index is 0.
    pub fn from_fd(fd: OwnedFd, offloads: Offloads) -> Result<Queue> {
        adopt(fd, offloads, 0)
    }

    /// Like [`Self::from_fd`], but works on a duplicate (`F_DUPFD_CLOEXEC`): the caller keeps its fd, which
    /// turbotun never closes (Android's `VpnService` owns the fd it hands out). The duplicate shares the open
    /// file, so `O_NONBLOCK` set on the queue (as the forwarder does for some I/O kinds) is seen through both.
    pub fn from_borrowed_fd(fd: BorrowedFd<'_>, offloads: Offloads) -> Result<Queue> {
        let own = fd.try_clone_to_owned().map_err(|e| Error::io(format!("duplicating {}", describe_fd(fd)), e))?;
        Queue::from_fd(own, offloads)
    }
}

/// Asks the fd what it is and wraps it with the offloads the caller or sender stated.
fn adopt(fd: OwnedFd, offloads: Offloads, index: usize) -> Result<Queue> {
    let facts = fd_facts(fd.as_fd())?;
    crate::devices::vnet_hdr::check_vnet_hdr_len(&facts.name, facts.vnet_hdr_len)?;
    if facts.vnet_hdr_len == 0 && !offloads.is_empty() {
        return Err(Error::Config(ConfigError::OffloadsWithoutVnetHdr { name: facts.name, offloads }));
    }
    Ok(Queue::new(fd, Arc::from(facts.name), index, facts.mode, facts.vnet_hdr_len, offloads))
}

/// Sends the queues of one device over a connected Unix stream socket: one message with a [`HandoverHeader`]
/// and the fds as `SCM_RIGHTS`. The queues stay usable here; the receiver gets its own references to the same
/// open files, so the device lives on after this process closes its copies.
pub fn send_queues(socket: &UnixStream, queues: &[&Queue]) -> Result<()> {
    let Some(first) = queues.first() else {
        return Err(Error::Config(ConfigError::NoQueue { needs: "no queue to hand over" }));
    };
    if let Some(pi) = queues.iter().find(|q| q.packet_info()) {
        // A receiver could not tell from the fd that frames carry it.
        return Err(Error::PacketInfo { name: pi.name().to_string(), user: "a hand-over" });
    }
    if let Some(other) = queues.iter().find(|q| q.name() != first.name()) {
        return Err(Error::Config(ConfigError::Devices {
            why: format!("one hand-over carries one device's queues: {} and {} differ", first.name(), other.name()),
        }));
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
        return Err(Error::Config(ConfigError::Handover {
            why: format!("{} fds do not fit one control message", fds.len()),
        }));
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

/// [`PeerCredentials`] of `socket`'s peer.
pub fn peer_credentials(socket: &UnixStream) -> Result<PeerCredentials> {
    let (pid, uid, gid) = sys::peer_credentials(socket.as_fd())
        .map_err(|e| Error::io("reading the peer's credentials (SO_PEERCRED)", e))?;
    Ok(PeerCredentials { pid: u32::try_from(pid).ok().filter(|&p| p > 0), uid, gid })
}

/// The peer of `socket` if it runs as root or as one of `allowed`; otherwise [`HandoverError::UntrustedPeer`].
fn require_peer(socket: &UnixStream, role: &'static str, allowed: &[u32]) -> Result<PeerCredentials> {
    let peer = peer_credentials(socket)?;
    if peer.uid == 0 || allowed.contains(&peer.uid) {
        return Ok(peer);
    }
    let allowed = std::iter::once("root".to_string()).chain(allowed.iter().map(|u| format!("uid {u}"))).collect();
    Err(HandoverError::UntrustedPeer { peer, role, allowed }.into())
}

/// The receiving side's check: queues are taken only from a peer running as root or as this process's own
/// (effective) user, so that a socket whose directory lets others connect does not let them hand in devices of
/// their own choosing.
pub fn check_sender(socket: &UnixStream) -> Result<PeerCredentials> {
    require_peer(socket, "hand queues over", &[nix::unistd::geteuid().as_raw()])
}

/// The sending side's check, before anything is sent: the listener must run as root or as `to_user`. Whoever
/// holds a queue reads and injects the device's traffic, and a path in a shared directory (or one whose
/// rightful listener has exited) may have been bound by anybody.
pub fn check_receiver(socket: &UnixStream, to_user: Option<u32>) -> Result<PeerCredentials> {
    require_peer(socket, "receive queues", to_user.as_slice())
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
        return Err(Error::Config(ConfigError::HandoverMessage {
            why: format!("more than {MAX_QUEUES} fds (the excess was closed by the kernel)"),
        }));
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
        return Err(Error::Config(ConfigError::HandoverMessage {
            why: format!("the header announces {} queues of {}, {} fds came", header.queues, header.name, fds.len()),
        }));
    }
    let mut queues = Vec::with_capacity(fds.len());
    for (index, fd) in fds.into_iter().enumerate() {
        let queue = adopt(fd, header.offloads, index)?;
        if queue.name() != header.name || queue.mode() != header.mode || queue.vnet_hdr_len() != header.vnet_hdr_len {
            return Err(Error::Config(ConfigError::HandoverMessage {
                why: format!(
                    "fd {index} is a queue of {} ({}, {}-byte virtio header), the \
                 header says {} ({}, {}-byte)",
                    queue.name(),
                    queue.mode(),
                    queue.vnet_hdr_len(),
                    header.name,
                    header.mode,
                    header.vnet_hdr_len
                ),
            }));
        }
        // Queues of one device share one view of its offloads, as `Device::open` gives them.
        let queue = match queues.first() {
            Some(first) => queue.sharing_offloads_with(first),
            None => queue,
        };
        queues.push(queue);
    }
    Ok((header, queues))
}

/// The line a receiver answers a hand-over with: `ok`, or `error: ` and its reason, so that the sender can exit
/// with the receiver's verdict.
fn reply(mut socket: &UnixStream, outcome: std::result::Result<(), &Error>) {
    use std::io::Write;
    let line = match outcome {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("error: {}", e.to_string().replace('\n', " ")),
    };
    // The sender may have given up already; its side reports that.
    let _ = writeln!(socket, "{line}");
}

/// [`send_queues`], then waits (up to `timeout`) for the receiver's verdict: `Ok` once it took the queues,
/// [`HandoverError::Refused`] with its reason otherwise.
pub fn send_queues_and_wait(socket: &UnixStream, queues: &[&Queue], timeout: Duration) -> Result<()> {
    use std::io::BufRead;
    send_queues(socket, queues)?;
    socket.set_read_timeout(Some(timeout)).map_err(|e| Error::io("setting a reply timeout", e))?;
    let mut line = String::new();
    std::io::BufReader::new(socket)
        .read_line(&mut line)
        .map_err(|e| Error::io("waiting for the receiver to confirm the hand-over", e))?;
    match line.trim() {
        "ok" => Ok(()),
        "" => Err(HandoverError::Refused { reason: "it closed the connection without a word".into() }.into()),
        other => Err(HandoverError::Refused { reason: other.trim_start_matches("error: ").to_string() }.into()),
    }
}

/// What [`QueueListener::accept`] got.
#[derive(Debug)]
#[non_exhaustive]
pub enum Accepted {
    /// A device's queues, taken (the sender was told `ok`).
    Device {
        /// Who sent them.
        peer: PeerCredentials,
        /// What the sender said of them.
        header: HandoverHeader,
        /// The queues, numbered in the order they were sent.
        queues: Vec<Queue>,
    },
    /// A hand-over refused (a user who may not hand queues over, a message that does not parse or carries fds
    /// that are not what it says, queues `check` refused, a sender that went away): the sender was told why when
    /// it could be, its fds are closed, and the listener goes on.
    Refused(Error),
    /// The stop handle fired while waiting.
    Stopped,
}

/// A Unix socket path that takes the queues [`send_queues`] hands over (e.g. from `turbotun open`), one device
/// per connection. The path is removed when the listener is dropped.
#[derive(Debug)]
pub struct QueueListener {
    listener: UnixListener,
    path: PathBuf,
}

impl QueueListener {
    /// Listens on `path`, which must not exist: a listener never replaces a file it did not create. Put it in a
    /// directory only the senders and this user can reach.
    pub fn bind(path: &Path) -> Result<QueueListener> {
        if path.symlink_metadata().is_ok() {
            return Err(Error::Config(ConfigError::SocketPath {
                path: path.to_path_buf(),
                why: "exists: give a path that does not, in a directory only you can write to (turbotun never \
                      replaces a file it did not create)"
                    .into(),
            }));
        }
        let listener =
            UnixListener::bind(path).map_err(|e| Error::io(format!("listening on {}", path.display()), e))?;
        listener.set_nonblocking(true).map_err(|e| Error::io("making the listener non-blocking", e))?;
        Ok(QueueListener { listener, path: path.to_path_buf() })
    }

    /// The path it listens on.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for the next sender until `stop` fires, checks that it runs as root or as this user
    /// ([`check_sender`]), receives its queues (waiting at most `timeout` for the message), and hands them to
    /// `check` (e.g. [`crate::forward::ForwarderBuilder::check_queues`]). The sender is answered only then, with
    /// `ok` or the reason for a refusal, so that it exits with the verdict. Whatever goes wrong with one sender
    /// is [`Accepted::Refused`] (no sender can stop the listener); an error is the listener's own failure.
    pub fn accept(
        &self,
        stop: &StopHandle,
        timeout: Duration,
        check: impl FnOnce(&HandoverHeader, &[Queue]) -> Result<()>,
    ) -> Result<Accepted> {
        let Some(stream) = self.next_connection(stop)? else { return Ok(Accepted::Stopped) };
        let setup = stream.set_nonblocking(false).and_then(|()| stream.set_read_timeout(Some(timeout)));
        setup.map_err(|e| Error::io("setting up a hand-over connection", e))?;
        let peer = match check_sender(&stream) {
            Ok(peer) => peer,
            Err(e) => {
                reply(&stream, Err(&e));
                return Ok(Accepted::Refused(e));
            }
        };
        let taken = recv_queues_with_header(&stream).and_then(|(header, queues)| {
            check(&header, &queues)?;
            Ok((header, queues))
        });
        reply(&stream, taken.as_ref().map(drop));
        Ok(match taken {
            Ok((header, queues)) => Accepted::Device { peer, header, queues },
            Err(e) => Accepted::Refused(e),
        })
    }

    /// The next connection, or `None` once `stop` fires.
    fn next_connection(&self, stop: &StopHandle) -> Result<Option<UnixStream>> {
        use rustix::event::PollFlags;
        loop {
            if stop.is_stopped() {
                return Ok(None);
            }
            match self.listener.accept() {
                Ok((stream, _)) => return Ok(Some(stream)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io(format!("accepting on {}", self.path.display()), e)),
            }
            crate::stop::wait_or_stop(self.listener.as_fd(), PollFlags::IN, Some(stop), None)?;
        }
    }
}

impl Drop for QueueListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
