//! Opening `/dev/net/tun` and what a refused open or `TUNSETIFF` becomes: the node's state, a busy device with its
//! holders, a missing capability with the device's owner; and the offloads the kernel takes.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use crate::configuration::netlink::{LinkInfo, Netlink};
use crate::devices::offloads::Offloads;
use crate::error::{permission_or_io, Error, Result};
use crate::sys;

pub(crate) fn open_tun(nonblocking: bool) -> Result<OwnedFd> {
    sys::open_rdwr(c"/dev/net/tun", nonblocking).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENXIO) | Some(libc::ENODEV) => Error::NoTunDevice,
        Some(libc::EACCES) => Error::TunNodeDenied { node: describe_node("/dev/net/tun"), source: e },
        _ => permission_or_io("opening /dev/net/tun", e),
    })
}

/// A device node's mode and owner as `ls -l` shows them: `crw------- uid 0 gid 0`.
fn describe_node(path: &str) -> String {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(meta) = std::fs::metadata(path) else { return "not readable".into() };
    let kind = if meta.file_type().is_char_device() { 'c' } else { '?' };
    let mode = meta.mode();
    let bits: String = (0..9)
        .map(|i| {
            let on = mode & (0o400 >> i) != 0;
            match (on, i % 3) {
                (false, _) => '-',
                (true, 0) => 'r',
                (true, 1) => 'w',
                (true, _) => 'x',
            }
        })
        .collect();
    format!("{kind}{bits} uid {} gid {}", meta.uid(), meta.gid())
}

/// [`Error::Busy`] for `name`, with the processes holding its queues.
pub(crate) fn busy(name: &str, exclusive: bool) -> Error {
    let holders = crate::devices::inspect::queue_holder_processes(name);
    Error::Busy { name: name.to_string(), exclusive, holders }
}

/// The link of that name in this namespace, if there is one (`None` too when netlink cannot tell: the open
/// then goes ahead and the kernel's answer decides).
pub(crate) fn existing_link(name: &str) -> Option<LinkInfo> {
    if name.is_empty() || name.contains('%') {
        return None;
    }
    match Netlink::new().and_then(|mut netlink| netlink.link(name)) {
        Ok(link) => Some(link),
        Err(Error::NoSuchDevice { .. }) => None,
        Err(e) => {
            tracing::debug!("looking up {name} before opening it: {e}");
            None
        }
    }
}

/// EPERM from `TUNSETIFF`: a device that belongs to someone else says whom; otherwise creating or attaching
/// needs CAP_NET_ADMIN.
pub(crate) fn permission_error(name: &str, existing: Option<&LinkInfo>, source: io::Error) -> Error {
    let tun = existing.and_then(|link| link.tun.as_ref());
    let owner = match tun.map(|t| (t.owner, t.group)) {
        Some((Some(uid), Some(gid))) => Some(format!("uid {uid} and gid {gid}")),
        Some((Some(uid), None)) => Some(format!("uid {uid}")),
        Some((None, Some(gid))) => Some(format!("gid {gid}")),
        _ => None,
    };
    match (owner, existing) {
        (Some(owner), _) => Error::NotOwner { name: name.to_string(), owner, source },
        (None, Some(_)) => Error::PermissionDenied { action: format!("attaching to {name}"), source },
        (None, None) => Error::PermissionDenied { action: format!("creating {name}"), source },
    }
}

/// Asks for `wanted` (plus CSUM), falling back the way older kernels require: without USO (before 6.2), without
/// TSO_ECN, then checksum only, then nothing. Returns what was granted.
pub(crate) fn negotiate_offloads(fd: BorrowedFd<'_>, name: &str, wanted: Offloads) -> Result<Offloads> {
    if wanted.is_empty() {
        sys::tun_set_offload(fd, 0).map_err(|e| Error::io(format!("TUNSETOFFLOAD(0) on {name}"), e))?;
        return Ok(Offloads::NONE);
    }
    let wanted = wanted | Offloads::CSUM;
    let candidates = [
        wanted,
        wanted.difference(Offloads::UDP_TUNNEL_GSO_CSUM),
        wanted.difference(Offloads::UDP_TUNNEL),
        wanted.difference(Offloads::UDP_TUNNEL | Offloads::USO4 | Offloads::USO6),
        wanted.difference(Offloads::UDP_TUNNEL | Offloads::USO4 | Offloads::USO6 | Offloads::TSO_ECN),
        Offloads::CSUM,
        Offloads::NONE,
    ];
    let mut last_err = None;
    for (i, candidate) in candidates.iter().enumerate() {
        if i > 0 && *candidate == candidates[i - 1] {
            continue;
        }
        match sys::tun_set_offload(fd, candidate.bits()) {
            Ok(()) => return Ok(*candidate),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last_err = Some(e),
            Err(e) => return Err(Error::io(format!("TUNSETOFFLOAD on {name}"), e)),
        }
    }
    Err(Error::io(format!("TUNSETOFFLOAD on {name}"), last_err.unwrap_or_else(|| io::Error::other("refused"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_describe_node() {
        // /dev/null is crw-rw-rw- root's everywhere.
        assert_eq!(describe_node("/dev/null"), "crw-rw-rw- uid 0 gid 0");
        assert_eq!(describe_node("/nonexistent/node"), "not readable");
    }
}
