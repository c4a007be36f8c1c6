//! Running code inside a network namespace without touching the caller's thread.
//!
//! Linux keeps the network namespace per thread, so each helper runs the closure on a scoped thread that switches
//! namespace first. A private namespace made by [`with_private_netns`] has no name in `/run/netns`: when the
//! thread ends and the last fd that refers to it (a socket, a tun queue) closes, the kernel destroys it with every
//! device inside, persistent ones included. That is what makes it a safe sandbox for tests: nothing is left
//! behind, even when the closure panics.
//!
//! This module only enters namespaces; configuring interfaces is [`crate::netlink`]'s job, which uses this one
//! (never the other way round).

use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::configuration::netlink::error::NetlinkError;
use crate::error::{ConfigError, Error, Result};
use crate::sys;

/// Runs `f` on a new thread inside a fresh, private network namespace whose loopback is up.
/// A panic in `f` is propagated to the caller.
pub fn with_private_netns<F, R>(f: F) -> Result<R>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    run_on_thread(
        || {
            sys::unshare_net().map_err(|e| match e.raw_os_error() {
                Some(libc::EPERM) => Error::PermissionDenied {
                    action: "creating a network namespace (also needs CAP_SYS_ADMIN)".into(),
                    source: e,
                },
                _ => Error::io("unshare(CLONE_NEWNET)", e),
            })?;
            loopback_up().map_err(|e| match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => {
                    Error::PermissionDenied { action: "setting lo up in a new network namespace".into(), source: e }
                }
                _ => NetlinkError { context: "setting lo up in a new network namespace".into(), source: e }.into(),
            })
        },
        f,
    )
}

/// Runs `f` on a new thread inside the namespace named by `netns_file` (`/run/netns/NAME`, `/proc/PID/ns/net`).
pub fn with_netns<F, R>(netns_file: &Path, f: F) -> Result<R>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    let ns = open_netns(netns_file)?;
    run_on_thread(
        || {
            sys::setns_net(ns.as_fd()).map_err(|e| {
                crate::error::permission_or_io(format!("entering network namespace {}", netns_file.display()), e)
            })
        },
        f,
    )
}

/// The initial network namespace's inode number, fixed by the kernel (`NET_NS_INIT_INO`).
const INITIAL_NETNS_INODE: u64 = 0xEFFF_FFF9;

/// The calling thread's network namespace in words, when it is not the initial one: its `ip netns` name (a file
/// in `/run/netns` that is this namespace), else `net-INODE` (`ip netns identify`'s fallback is nothing; the inode
/// is what `ls -l /proc/PID/ns/net` shows). `None` in the initial namespace, and when that cannot be told (an
/// older kernel, and no access to PID 1's namespace file: taken to be the initial one).
pub fn current_name() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let own = std::fs::metadata("/proc/thread-self/ns/net").ok()?;
    let same = |m: &std::fs::Metadata| m.dev() == own.dev() && m.ino() == own.ino();
    // Since Linux 6.18 the initial namespace has a fixed inode (uapi `nsfs.h`); before, it is PID 1's, whose
    // namespace file needs ptrace access (refused even to root in some sandboxes).
    let initial = own.ino() == INITIAL_NETNS_INODE
        || match std::fs::metadata("/proc/1/ns/net") {
            Ok(pid1) => same(&pid1),
            Err(_) => !kernel_at_least(6, 18),
        };
    if initial {
        return None;
    }
    let named = std::fs::read_dir("/run/netns").into_iter().flatten().flatten().find_map(|entry| {
        let meta = std::fs::metadata(entry.path()).ok()?;
        same(&meta).then(|| entry.file_name().to_string_lossy().into_owned())
    });
    Some(named.unwrap_or_else(|| format!("net-{}", own.ino())))
}

/// Whether the running kernel's release is `major.minor` or later.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut numbers = release.split(|c: char| !c.is_ascii_digit()).map(|n| n.parse::<u32>().unwrap_or(0));
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0)) >= (major, minor)
}

/// Opens a namespace file (`/run/netns/NAME`, `/proc/PID/ns/net`) for `setns` or `IFLA_NET_NS_FD`.
pub(crate) fn open_netns(path: &Path) -> Result<std::os::fd::OwnedFd> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::Config(ConfigError::NamespacePath { path: path.to_path_buf() }))?;
    sys::open_rdonly(&c).map_err(|e| Error::io(format!("opening network namespace {}", path.display()), e))
}

/// Sets `lo` up in the calling thread's namespace: one `RTM_SETLINK` and its acknowledgement. A fresh
/// namespace needs nothing else, so this is not worth a [`crate::netlink::Netlink`] (which builds on this module).
fn loopback_up() -> io::Result<()> {
    let mut link = LinkMessage::default();
    link.header.flags = LinkFlags::Up;
    link.header.change_mask = LinkFlags::Up;
    link.attributes.push(LinkAttribute::IfName("lo".into()));
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK;
    header.sequence_number = 1;
    let mut request = NetlinkMessage::new(header, NetlinkPayload::from(RouteNetlinkMessage::SetLink(link)));
    request.finalize();
    let mut buf = vec![0u8; request.buffer_len()];
    request.serialize(&mut buf);

    let socket = Socket::new(NETLINK_ROUTE)?;
    socket.send_to(&buf, &SocketAddr::new(0, 0), 0)?;
    // The socket is new and sent one request, so the first message back is its acknowledgement.
    let (reply, _) = socket.recv_from_full()?;
    let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    match reply.payload {
        NetlinkPayload::Error(err) => match err.code {
            None => Ok(()),
            Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
        },
        other => Err(io::Error::new(io::ErrorKind::InvalidData, format!("unexpected reply {other:?}"))),
    }
}

fn run_on_thread<S, F, R>(setup: S, f: F) -> Result<R>
where
    S: FnOnce() -> Result<()> + Send,
    F: FnOnce() -> R + Send,
    R: Send,
{
    std::thread::scope(|scope| {
        let handle = scope.spawn(move || {
            setup()?;
            Ok(f())
        });
        match handle.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}
