//! The paths of the Unix sockets turbotun binds (the counters socket, a vhost-user backend's socket) and the bench
//! makes way for (a WireGuard endpoint's configuration socket): one rule for a path something is already at.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::error::{ConfigError, Error, Result};

/// Makes way for a socket to be bound at `path`: refused when a process answers there ([`Error::SocketInUse`])
/// or when a file of another kind is in the way (the error suggests `elsewhere`); a socket nobody answers on (its
/// process is gone, or was killed before it could remove it) is removed. The one rule every socket turbotun binds
/// follows.
pub fn clear_stale_socket(path: &Path, elsewhere: &str) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => Err(Error::SocketInUse { path: path.to_path_buf() }),
            Err(_) => std::fs::remove_file(path)
                .map_err(|e| Error::io(format!("removing the stale socket {}", path.display()), e)),
        },
        Ok(_) => Err(Error::Config(ConfigError::SocketPath {
            path: path.to_path_buf(),
            why: format!("exists and is not a socket: remove it, or {elsewhere}"),
        })),
        Err(_) => Ok(()),
    }
}
