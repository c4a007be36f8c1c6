//! Sockets that share a port (one per queue): each made owned by a uid no other program runs as, so that only
//! this process's sockets can join the group, and a reserve of them made before the privileges are dropped.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The owner (uid) a port group's sockets are given: the kernel lets a socket join a `SO_REUSEPORT` group only
/// with the same owner as the group's sockets, so a uid that no account has keeps every other socket out, root's
/// included. Chosen once per process, at random among the uids from 2^31 on (no account system hands those out).
fn group_owner() -> u32 {
    use std::hash::BuildHasher;
    static OWNER: OnceLock<u32> = OnceLock::new();
    *OWNER.get_or_init(|| {
        let random = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        0x8000_0000 + (random % 0x7fff_ff00) as u32
    })
}

/// A new unbound UDP socket of `family`.
pub(super) fn new_socket(family: rustix::net::AddressFamily) -> Result<OwnedFd> {
    use rustix::net::{SocketFlags, SocketType};
    rustix::net::socket_with(family, SocketType::DGRAM, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None)
        .map_err(|e| Error::io("socket(UDP)", e.into()))
}

/// A new unbound UDP socket of `family` owned by [`group_owner`], for a port group; `None` when this process may
/// not give it that owner (no `CAP_CHOWN`).
pub(super) fn new_group_socket(family: rustix::net::AddressFamily) -> Result<Option<OwnedFd>> {
    let fd = new_socket(family)?;
    match rustix::fs::fchown(&fd, Some(rustix::fs::Uid::from_raw(group_owner())), None) {
        Ok(()) => Ok(Some(fd)),
        // No CAP_CHOWN, or a user namespace where that uid is not mapped: the process's own uid then.
        Err(rustix::io::Errno::PERM | rustix::io::Errno::INVAL) => Ok(None),
        Err(e) => Err(Error::io("fchown(UDP socket)", e.into())),
    }
}

/// Unbound UDP sockets owned by the group owner (see [`crate::tunnel::bind_sockets_with`]), made while the
/// process may still give them that owner, for the port groups it binds after it gave up its privileges (a
/// WireGuard endpoint run with `--user` whose port `wg` changes): such a group is as closed to other sockets
/// as one bound as root. Each group takes as many sockets as it has; a reserve that is empty refuses.
#[derive(Debug)]
pub struct SocketReserve {
    /// IPv6 sockets (`true`), or IPv4 where the kernel has no IPv6.
    ipv6: bool,
    sockets: std::sync::Mutex<Vec<OwnedFd>>,
}

impl SocketReserve {
    /// `count` sockets, IPv6 (IPv4 on a kernel without IPv6). Needs `CAP_CHOWN`.
    pub fn new(count: usize) -> Result<Self> {
        use rustix::net::AddressFamily;
        let ipv6 = match new_socket(AddressFamily::INET6) {
            Ok(_) => true,
            Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => false,
            Err(e) => return Err(e),
        };
        let family = if ipv6 { AddressFamily::INET6 } else { AddressFamily::INET };
        let mut sockets = Vec::with_capacity(count);
        for _ in 0..count {
            let fd = new_group_socket(family)?.ok_or_else(|| Error::PermissionDenied {
                action: "reserving sockets for a port group (fchown needs CAP_CHOWN)".into(),
                source: std::io::Error::from_raw_os_error(libc::EPERM),
            })?;
            sockets.push(fd);
        }
        Ok(SocketReserve { ipv6, sockets: std::sync::Mutex::new(sockets) })
    }

    /// How many sockets are left.
    pub fn left(&self) -> usize {
        self.sockets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// `count` sockets for `addr`'s family, all or none.
    pub(crate) fn take(&self, addr: &SocketAddr, count: usize) -> Result<Vec<OwnedFd>> {
        if addr.is_ipv6() != self.ipv6 {
            return Err(Error::io(
                format!("binding UDP {addr} from the reserved sockets"),
                std::io::Error::from_raw_os_error(libc::EAFNOSUPPORT),
            ));
        }
        let mut sockets = self.sockets.lock().unwrap_or_else(|e| e.into_inner());
        if sockets.len() < count {
            return Err(Error::io(
                format!(
                    "binding UDP {addr}: {} of the sockets reserved for a new port are left, {count} needed (they \
                     were made before the privileges were dropped; restart to change the port again)",
                    sockets.len()
                ),
                std::io::Error::from_raw_os_error(libc::EPERM),
            ));
        }
        let at = sockets.len() - count;
        Ok(sockets.split_off(at))
    }

    /// Puts back sockets [`Self::take`] gave that were not bound.
    pub(crate) fn give_back(&self, fds: Vec<OwnedFd>) {
        self.sockets.lock().unwrap_or_else(|e| e.into_inner()).extend(fds);
    }
}

/// How a socket holds its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PortSharing {
    /// Alone: bound without `SO_REUSEPORT`, so the bind fails with `EADDRINUSE` if anyone holds the port, and
    /// nobody can bind it afterwards.
    Alone,
    /// The first of a group: bound alone (which proves the port free: nobody else holds it, shared or not), then
    /// opened to `SO_REUSEPORT` for the rest of the group.
    FirstOfGroup,
    /// The rest of a group: bound with `SO_REUSEPORT`, joining the first.
    JoinGroup,
}
