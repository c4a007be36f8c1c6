//! One error type for the library. Each variant names the cause and, where there is one, the fix.
//!
//! This module sits below every folder of the crate: besides `sys` it names only the types its variants carry
//! that live with the code that raises them, each in a file that itself names nothing of the crate but `sys`
//! (`Offloads`, and the error types of the hand-over and of netlink, which `Error` wraps).
//! `scripts/check-imports.py` checks it.

use std::io;

use crate::configuration::netlink::error::NetlinkError;
use crate::deployment::handover::error::HandoverError;
use crate::devices::offloads::{Offloads, UnknownOffload};

pub use config::ConfigError;

mod config;

/// Errors from opening, configuring and using TUN/TAP devices.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The kernel refused an operation that needs CAP_NET_ADMIN (EPERM or EACCES).
    #[error("{action} needs CAP_NET_ADMIN: run as root or grant the capability (e.g. setcap cap_net_admin+ep)")]
    PermissionDenied {
        /// What was attempted (e.g. `creating tun0`, `TUNSETPERSIST`).
        action: String,
        /// The error the kernel returned.
        source: io::Error,
    },

    /// `/dev/net/tun` cannot be opened because it does not exist (ENOENT, ENXIO or ENODEV).
    #[error(
        "/dev/net/tun is missing: load the tun module (modprobe tun) or create the node (mknod /dev/net/tun c 10 200)"
    )]
    NoTunDevice,

    /// `/dev/net/tun` exists but its mode does not let this user open it (EACCES on `open`): no capability
    /// helps here, the file's permissions do.
    #[error(
        "/dev/net/tun is {node}, so this user cannot open it: run as root, or make the node 0666 as most \
         distributions do (creating or attaching to a device is still checked: CAP_NET_ADMIN or the device's \
         owner/group)"
    )]
    TunNodeDenied {
        /// The node's mode and owner, as `ls -l` shows them (`crw------- root:root` as uid 0:0).
        node: String,
        /// The error the kernel returned.
        source: io::Error,
    },

    /// The interface name breaks one of the kernel's rules ([`validate_ifname`]).
    #[error("invalid interface name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// The rule it breaks.
        reason: &'static str,
    },

    /// A device of that name exists and is not a TUN/TAP device.
    #[error("{name} is a {kind} device, not a TUN/TAP device: turbotun manages TUN/TAP devices only (`ip link` manages this one; to create a TUN/TAP device, choose another name)")]
    NotTunTap {
        /// The device's name.
        name: String,
        /// Its link kind (`veth`, `bridge`, ... or `loopback`).
        kind: String,
    },

    /// The device exists with other framing than this open asks for: the kernel would hand the new queue
    /// frames in the device's framing, which the caller would misread.
    #[error("device {name} exists with other framing: {difference}; open it with the same flags, or delete it first")]
    FramingMismatch {
        /// The device's name.
        name: String,
        /// What differs, in words.
        difference: String,
    },

    /// Attaching to a device that belongs to another user or group.
    #[error("device {name} belongs to {owner}: open it as that user or group, or with CAP_NET_ADMIN")]
    NotOwner {
        /// The device's name.
        name: String,
        /// Its owner and group as the kernel keeps them (`uid 1000`, `gid 100`, `uid 1000 and gid 100`).
        owner: String,
        /// The kernel's refusal.
        source: io::Error,
    },

    /// More queues than the kernel allows on one device.
    #[error("device {name}: {queues} queues asked for, the kernel allows at most {max} (MAX_TAP_QUEUES)")]
    TooManyQueues {
        /// The device's name.
        name: String,
        /// Queues asked for.
        queues: usize,
        /// The kernel's limit.
        max: usize,
    },

    /// `TUNSETIFF` returned EBUSY: this open asked to create the device exclusively (`IFF_TUN_EXCL`) and it exists,
    /// or its queues are attached already (a device without multi_queue takes one).
    #[error("{}", busy_message(name, *exclusive, holders))]
    Busy {
        /// The device's name.
        name: String,
        /// Whether the open asked for exclusive creation (then the device exists already).
        exclusive: bool,
        /// The processes holding its queues, as far as `/proc` shows them: `pid (command line)`.
        holders: Vec<String>,
    },

    /// A socket path another running process answers on.
    #[error("{path} is in use: another running process serves it (stop it first, or choose another name)")]
    SocketInUse {
        /// The socket's path.
        path: std::path::PathBuf,
    },

    /// The device exists, and its `IFF_MULTI_QUEUE` flag does not fit the number of queues asked for.
    #[error("device {name} exists {existing}: open it with queues({hint})")]
    MultiQueueMismatch {
        /// The device's name.
        name: String,
        /// How the existing device was created (e.g. `without multi_queue`).
        existing: &'static str,
        /// The number of queues to ask for instead.
        hint: &'static str,
    },

    /// The device exists, and `TUNSETIFF` refused the flags it was opened with.
    #[error("device {name} exists with different flags (TUN vs TAP, or packet info/vnet header): {source}")]
    FlagsMismatch {
        /// The device's name.
        name: String,
        /// The error the kernel returned.
        source: io::Error,
    },

    /// A virtio header size turbotun does not read or write (see [`crate::device::VNET_HDR_SIZES`]).
    #[error(
        "{name}: a {len}-byte virtio header is not one turbotun handles: the size must be 10, 12, 20 or 24 (set it \
         with TUNSETVNETHDRSZ before handing the fd over)"
    )]
    UnsupportedVnetHdr {
        /// The device's name (or what the builder was asked to name it).
        name: String,
        /// The size found or asked for.
        len: usize,
    },

    /// `TUNSETOFFLOAD` refused the offloads asked for, exactly (at run time, or at open in strict mode).
    #[error("{name}: offloads {asked} refused: {reason}")]
    OffloadsRefused {
        /// The device's name.
        name: String,
        /// What was asked for.
        asked: Offloads,
        /// Why, in words.
        reason: &'static str,
    },

    /// A hand-over refused: the peer is not one this side may deal with, or the receiver refused the queues.
    #[error(transparent)]
    Handover(#[from] HandoverError),

    /// The running kernel lacks something the configuration needs.
    #[error("this kernel does not support {feature}")]
    Unsupported {
        /// What is missing (a flag, an ioctl, a system call).
        feature: &'static str,
    },

    /// A queue's device no longer exists: a read or write failed with EBADFD, ENODEV or ENXIO, or a blocking read
    /// was woken with EFAULT.
    #[error("device {name} is gone (deleted, or its namespace was destroyed)")]
    DeviceGone {
        /// The device's name.
        name: String,
        /// The error the kernel returned.
        source: io::Error,
    },

    /// A write failed with EIO because the device is administratively down.
    #[error("device {name} is down (EIO): bring it up before sending")]
    DeviceDown {
        /// The device's name.
        name: String,
        /// The error the kernel returned.
        source: io::Error,
    },

    /// No interface of that name exists in the current network namespace.
    #[error("no device named {name:?} in this network namespace")]
    NoSuchDevice {
        /// The name looked up.
        name: String,
    },

    /// A queue with the packet information header (opened without `IFF_NO_PI`) given to something that reads and
    /// writes frames without one.
    #[error("{name} has the packet information header (no IFF_NO_PI): {user} reads frames without one")]
    PacketInfo {
        /// The device's name.
        name: String,
        /// What refused it (`the forwarder`, `a hand-over`, `the smoltcp adapter`).
        user: &'static str,
    },

    /// A queue whose virtio header (or lack of one) does not fit the use it was given to.
    #[error("{name} has {}: {needs}", if *has == 0 { "no virtio header".to_string() } else { format!("a {has}-byte virtio header") })]
    VnetHdrMismatch {
        /// The device's name.
        name: String,
        /// Its virtio header size (0: none).
        has: usize,
        /// What the use needs, in words.
        needs: String,
    },

    /// Something only a TAP device has (a MAC address, a TX filter) asked of a TUN device.
    #[error("{name} is a TUN device: {what} exist(s) on TAP devices only")]
    NotTap {
        /// The device's name.
        name: String,
        /// What was asked for.
        what: &'static str,
    },

    /// An fd handed over or adopted that is not a TUN/TAP queue (or is one attached to no device).
    #[error("{what} is not a TUN/TAP queue{}", if *unattached { ": it is /dev/net/tun but attached to no device (TUNSETIFF it before handing it over)" } else { ": pass an fd of /dev/net/tun" })]
    NotATunQueue {
        /// The fd, described (`fd 7 (socket:[1234])`).
        what: String,
        /// Whether it is an open /dev/net/tun that was never attached.
        unattached: bool,
    },

    /// A user name that names no user on this system.
    #[error("no user named {user:?} on this system (see `getent passwd`): give an existing user or a numeric uid")]
    NoSuchUser {
        /// The name given.
        user: String,
    },

    /// A number outside the range it must lie in.
    #[error("{what} {value} is out of range: {allowed}")]
    OutOfRange {
        /// What the number is (`batch`, `depth`, `prefix length`).
        what: &'static str,
        /// The value given.
        value: u64,
        /// The values allowed, in words (`1 to 64`).
        allowed: String,
    },

    /// A request that cannot be carried out as given (options that contradict each other or the device); the
    /// variant names what is wrong and the message says what to change.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),

    /// A frame read from a device cannot be parsed or split.
    #[error("malformed packet from {device} (at byte {offset}): {reason}")]
    MalformedPacket {
        /// The device it was read from.
        device: String,
        /// What is wrong with it.
        reason: Malformed,
        /// Where in the frame (after the virtio header) the problem lies, as far as the reason tells.
        offset: usize,
    },

    /// A caller's buffer cannot hold what has to go into it.
    #[error("buffer of {have} bytes is too small: {need} bytes needed")]
    BufferTooSmall {
        /// The buffer's size.
        have: usize,
        /// The size needed.
        need: usize,
    },

    /// A forwarding worker stopped with an error. A device deleted under it is said as that alone: which worker
    /// saw it first says nothing to the user.
    #[error("{}", if error.is_device_gone() { error.to_string() } else { format!("{worker}: {error}") })]
    Worker {
        /// Which worker (its queues and direction).
        worker: String,
        /// What ended it.
        error: Box<Error>,
    },

    /// A forwarding worker panicked.
    #[error("{worker} panicked: {message}")]
    WorkerPanicked {
        /// Which worker (its queues and direction).
        worker: String,
        /// The panic's message.
        message: String,
    },

    /// An rtnetlink request failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),

    /// Any other failed system call.
    #[error("{context}: {source}")]
    Io {
        /// The call and what it was on. Borrowed for the would-block and interrupted errors a non-blocking or
        /// woken queue returns all the time, so that they allocate nothing.
        context: std::borrow::Cow<'static, str>,
        /// The error the kernel returned.
        source: io::Error,
    },
}

/// Why a frame read from a device cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Malformed {
    /// The read returned fewer bytes than the virtio header.
    ShortRead,
    /// The virtio header does not parse.
    VirtioHeader(turbotun_wire::WireError),
    /// A partial checksum (`NEEDS_CSUM`) whose offsets lie outside the packet.
    PartialChecksum(turbotun_wire::WireError),
    /// A super-packet that cannot be split.
    Gso(turbotun_wire::GsoError),
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Malformed::ShortRead => f.write_str("read shorter than the virtio header"),
            Malformed::VirtioHeader(e) => write!(f, "bad virtio header: {e}"),
            Malformed::PartialChecksum(e) => write!(f, "partial checksum cannot be completed: {e}"),
            Malformed::Gso(e) => write!(f, "{e}"),
        }
    }
}

impl Malformed {
    /// The byte offset in the packet that the reason points at (0 when it names none).
    pub fn offset(&self) -> usize {
        use turbotun_wire::{GsoError, WireError};
        let wire = |e: &WireError| match *e {
            WireError::Truncated { have, .. } => have,
            WireError::BadLength { actual, .. } => actual,
            WireError::ChecksumOutOfRange { start, offset, .. } => start + offset,
            _ => 0,
        };
        match self {
            Malformed::ShortRead => 0,
            Malformed::VirtioHeader(e) | Malformed::PartialChecksum(e) => wire(e),
            Malformed::Gso(e) => match *e {
                GsoError::Wire(ref w) => wire(w),
                GsoError::CsumStartBeyond { csum_start, .. } | GsoError::CsumStartMismatch { csum_start, .. } => {
                    csum_start
                }
                GsoError::BadCsumOffset { csum_start, csum_offset, .. } => csum_start + csum_offset,
                _ => 0,
            },
        }
    }
}

impl From<UnknownOffload> for Error {
    /// An offload list that does not parse is a configuration to change: [`ConfigError::UnknownOffload`].
    fn from(e: UnknownOffload) -> Error {
        Error::Config(ConfigError::UnknownOffload(e))
    }
}

/// Shorthand for `Result<T, turbotun::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(context: impl Into<std::borrow::Cow<'static, str>>, source: io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    /// A tun ioctl that installs an eBPF program (`TUNSETSTEERINGEBPF`, `TUNSETFILTEREBPF`) failed: a kernel
    /// that does not know the request answers EINVAL or ENOTTY, which is "unsupported", anything else an I/O
    /// error naming the request.
    pub(crate) fn tun_ebpf_ioctl(request: &'static str, source: io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::ENOTTY) => Error::Unsupported { feature: request },
            _ => Error::io(request, source),
        }
    }

    /// The OS error number behind this error, if there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::PermissionDenied { source, .. }
            | Error::TunNodeDenied { source, .. }
            | Error::NotOwner { source, .. }
            | Error::FlagsMismatch { source, .. }
            | Error::DeviceGone { source, .. }
            | Error::DeviceDown { source, .. }
            | Error::Io { source, .. } => source.raw_os_error(),
            Error::Netlink(e) => e.source.raw_os_error(),
            Error::Worker { error, .. } => error.raw_os_error(),
            _ => None,
        }
    }

    pub(crate) fn malformed(device: &str, reason: Malformed) -> Self {
        Error::MalformedPacket { device: device.to_string(), offset: reason.offset(), reason }
    }

    /// Whether this is "try again later": a non-blocking queue with nothing to read, or a full one.
    pub fn is_would_block(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == io::ErrorKind::WouldBlock)
    }

    /// Whether a blocking call was interrupted by a signal (see [`crate::wake`]): nothing was read or written.
    pub fn is_interrupted(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == io::ErrorKind::Interrupted)
    }

    /// Whether a non-sleeping read was refused because the kernel (or the file) has no `RWF_NOWAIT`.
    pub(crate) fn is_nowait_unsupported(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.raw_os_error() == Some(libc::EOPNOTSUPP))
    }

    /// Whether the device this error came from no longer exists.
    pub fn is_device_gone(&self) -> bool {
        match self {
            Error::DeviceGone { .. } => true,
            Error::Worker { error, .. } => error.is_device_gone(),
            _ => false,
        }
    }
}

impl From<Error> for io::Error {
    /// The error as an `io::Error`: its kind from the errno where there is one (would-block stays would-block,
    /// a gone device is `NotConnected`-like through its errno), the whole message kept.
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::Io { source, .. } => source.kind(),
            Error::Netlink(e) => e.source.kind(),
            Error::PermissionDenied { .. } | Error::TunNodeDenied { .. } | Error::NotOwner { .. } => {
                io::ErrorKind::PermissionDenied
            }
            Error::NoTunDevice | Error::NoSuchDevice { .. } => io::ErrorKind::NotFound,
            Error::Unsupported { .. } => io::ErrorKind::Unsupported,
            Error::InvalidName { .. }
            | Error::Config(_)
            | Error::UnsupportedVnetHdr { .. }
            | Error::PacketInfo { .. }
            | Error::VnetHdrMismatch { .. }
            | Error::NotTap { .. }
            | Error::NotATunQueue { .. }
            | Error::NoSuchUser { .. }
            | Error::OutOfRange { .. } => io::ErrorKind::InvalidInput,
            Error::MalformedPacket { .. } => io::ErrorKind::InvalidData,
            _ => match e.raw_os_error() {
                Some(errno) => io::Error::from_raw_os_error(errno).kind(),
                None => io::ErrorKind::Other,
            },
        };
        io::Error::new(kind, e)
    }
}

/// The text of [`Error::Busy`]: what the EBUSY means here, who holds the device, and the fix.
fn busy_message(name: &str, exclusive: bool, holders: &[String]) -> String {
    let held = if holders.is_empty() { String::new() } else { format!(", held by {}", holders.join(", ")) };
    if exclusive {
        format!(
            "device {name} exists already (EBUSY: asked to create it exclusively){held}: delete it first \
             (ip link delete {name}), or choose another name"
        )
    } else if holders.is_empty() {
        format!(
            "device {name} is busy (EBUSY): its queues are attached already (a device without multi_queue takes \
             one), by a process this user cannot see in /proc: stop that process first"
        )
    } else {
        format!(
            "device {name} is busy (EBUSY){held}: its queues are attached already (a device without multi_queue \
             takes one): stop that process first"
        )
    }
}

/// Maps an errno from a read or write on a queue fd to the error a caller can act on.
pub(crate) fn queue_io_error(name: &str, op: &'static str, err: io::Error) -> Error {
    match err.raw_os_error() {
        Some(libc::EBADFD) | Some(libc::ENODEV) | Some(libc::ENXIO) => {
            Error::DeviceGone { name: name.to_string(), source: err }
        }
        // A reader asleep on a blocking queue is woken with EFAULT when the device is deleted under it.
        Some(libc::EFAULT) if op == "read" => Error::DeviceGone { name: name.to_string(), source: err },
        Some(libc::EIO) if op == "write" => Error::DeviceDown { name: name.to_string(), source: err },
        // "Try again" is not a failure: the caller checks it and moves on, so the context names only the call.
        _ if matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Error::io(op, err),
        _ => Error::io(format!("{op} on {name}"), err),
    }
}

/// EPERM/EACCES as [`Error::PermissionDenied`] (the action needs CAP_NET_ADMIN or the device's owner), anything
/// else as an I/O error with the same context.
pub(crate) fn permission_or_io(action: impl Into<String>, e: io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => Error::PermissionDenied { action: action.into(), source: e },
        _ => Error::io(action.into(), e),
    }
}

/// Checks an interface name the way the kernel's `dev_valid_name` does, so the error names the rule broken.
pub fn validate_ifname(name: &str) -> Result<()> {
    let bad = |reason| Err(Error::InvalidName { name: name.to_string(), reason });
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > crate::sys::IFNAMSIZ - 1 {
        return bad("longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return bad("'.' and '..' are reserved");
    }
    if name.contains('/') {
        return bad("contains '/'");
    }
    if name.contains(':') {
        return bad("contains ':' (reserved for alias labels)");
    }
    if name.chars().any(|c| c.is_whitespace()) {
        return bad("contains whitespace");
    }
    if name.bytes().any(|b| b == 0) {
        return bad("contains a NUL byte");
    }
    if name.matches('%').count() > 1 || (name.contains('%') && !name.contains("%d")) {
        return bad("'%' is only allowed once, as the '%d' template the kernel fills in");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_validate_ifname() {
        for ok in ["tun0", "a", "x-y_z.1", "tt%d", "fifteen_bytes_x"] {
            validate_ifname(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, reason) in [
            ("", "empty"),
            ("sixteen_bytes_xx", "longer than 15 bytes"),
            ("a/b", "contains '/'"),
            ("a b", "contains whitespace"),
            ("a\tb", "contains whitespace"),
            ("eth0:1", "contains ':'"),
            (".", "reserved"),
            ("..", "reserved"),
            ("a%s", "'%'"),
            ("a%d%d", "'%'"),
        ] {
            let err = validate_ifname(bad).expect_err(bad).to_string();
            assert!(err.contains(reason), "{bad:?}: {err}");
            assert!(err.contains(&format!("{bad:?}")), "error names the input: {err}");
        }
    }

    /// The errors that moved beside the code raising them (netlink's, the hand-over's, an unknown offload word)
    /// read as they did when they were variants of `Error`, and keep their errno and `io::ErrorKind`.
    #[test]
    fn test_wrapped_errors_keep_their_messages() {
        use crate::deployment::handover::error::PeerCredentials;

        let enodev = || io::Error::from_raw_os_error(libc::ENODEV);
        let netlink = Error::from(NetlinkError { context: "setting the MTU of tun9".into(), source: enodev() });
        assert_eq!(netlink.to_string(), format!("netlink setting the MTU of tun9: {}", enodev()));
        assert_eq!(netlink.raw_os_error(), Some(libc::ENODEV));
        assert_eq!(io::Error::from(netlink).kind(), enodev().kind());

        let peer = PeerCredentials { pid: Some(42), uid: 1000, gid: 1000 };
        let allowed = vec!["root".to_string(), "uid 65534".to_string()];
        let untrusted = Error::from(HandoverError::UntrustedPeer { peer, role: "hand queues over", allowed });
        assert_eq!(
            untrusted.to_string(),
            "pid 42 (uid 1000) may not hand queues over: only root or uid 65534 may; keep the socket in a directory \
             only they can reach"
        );
        let refused = Error::from(HandoverError::Refused { reason: "no such device".into() });
        assert_eq!(refused.to_string(), "the receiver refused the queues: no such device");
        assert_eq!((refused.raw_os_error(), io::Error::from(refused).kind()), (None, io::ErrorKind::Other));

        // The line `turbotun create --offloads turbo` prints after its option (docs/RELIABILITY.md).
        let unknown = Error::from(Offloads::parse("csum,turbo").unwrap_err());
        assert_eq!(
            unknown.to_string(),
            "invalid configuration: unknown offload \"turbo\" (known: csum, tso4, tso6, tso_ecn, ufo, uso4, uso6, \
             udp_tunnel_gso, udp_tunnel_gso_csum, tcp, uso, udp_tunnel, all, none)"
        );
        assert_eq!(io::Error::from(unknown).kind(), io::ErrorKind::InvalidInput);
    }

    /// `ConfigError`'s variants read as the `invalid configuration: ...` lines they replaced (docs/RELIABILITY.md
    /// quotes some), and are `InvalidInput` as an `io::Error`.
    #[test]
    fn test_config_errors_keep_their_messages() {
        let cases = [
            (
                ConfigError::NotMultiQueue { name: "tt0".into(), existing: true },
                "device tt0 exists without multi_queue: open it with multi_queue(false), or delete it and create it \
                 again with multi_queue(true)",
            ),
            (
                ConfigError::NotMultiQueue { name: "tt0".into(), existing: false },
                "tt0 was opened without IFF_MULTI_QUEUE: open it with multi_queue(true) to add queues later",
            ),
            (
                ConfigError::IdRefused { request: "TUNSETOWNER", id: 4294967295, kind: "uid" },
                "TUNSETOWNER refused 4294967295: not a valid uid in this user namespace",
            ),
            (
                ConfigError::SocketPath {
                    path: "/tmp/nots".into(),
                    why: "exists and is not a socket: remove it".into(),
                },
                "/tmp/nots exists and is not a socket: remove it",
            ),
            (
                ConfigError::HandoverMessage { why: "mode 7 is neither 0 (tun) nor 1 (tap)".into() },
                "queue hand-over message refused: mode 7 is neither 0 (tun) nor 1 (tap)",
            ),
            (
                ConfigError::VnetHdrSizesDiffer {
                    a: "a".into(),
                    a_len: 10,
                    b: "b".into(),
                    b_len: 12,
                    needs: "passthrough forwards headers as they are",
                },
                "a has a 10-byte virtio header and b a 12-byte one: passthrough forwards headers as they are",
            ),
            (
                ConfigError::KeeperSpec { var: "TURBOTUN_KEEP", line: "x".into() },
                "TURBOTUN_KEEP=x: expected INODE:PATH",
            ),
        ];
        for (config, text) in cases {
            let e = Error::from(config);
            assert_eq!(e.to_string(), format!("invalid configuration: {text}"));
            assert_eq!(io::Error::from(e).kind(), io::ErrorKind::InvalidInput);
        }
    }

    #[test]
    fn test_queue_io_error_mapping() {
        let gone = queue_io_error("tun9", "read", io::Error::from_raw_os_error(libc::EBADFD));
        assert!(gone.is_device_gone());
        let down = queue_io_error("tun9", "write", io::Error::from_raw_os_error(libc::EIO));
        assert!(matches!(down, Error::DeviceDown { .. }));
        // A blocking reader is woken with EFAULT when its device is deleted; on a write EFAULT is a bad buffer.
        let woken = queue_io_error("tun9", "read", io::Error::from_raw_os_error(libc::EFAULT));
        assert!(woken.is_device_gone());
        let other = queue_io_error("tun9", "write", io::Error::from_raw_os_error(libc::EFAULT));
        assert_eq!(other.raw_os_error(), Some(libc::EFAULT));
        assert!(other.to_string().contains("write on tun9"));
    }
}
