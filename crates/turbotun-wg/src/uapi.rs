//! WireGuard's configuration socket: `/var/run/wireguard/NAME.sock`, a Unix stream socket speaking the
//! cross-platform userspace protocol (`get=1`, `set=1`, each answered with an `errno=` line), as wireguard-go
//! serves it and `wg` speaks it.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use turbotun::StopHandle;

use crate::config::{apply_set, DeviceConfig, SetError};
use crate::wireguard::{public_key, render_get, WireGuard};

/// Where `wg` looks for the sockets of userspace implementations.
pub const SOCKET_DIR: &str = "/var/run/wireguard";

/// How long a connected client may take to send a line.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The socket path of interface `name`.
pub fn socket_path(name: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{name}.sock"))
}

/// Why the configuration socket could not be made.
#[derive(Debug, thiserror::Error)]
pub enum UapiError {
    /// Another process serves this interface's socket.
    #[error("{path} is in use: another WireGuard implementation serves this interface")]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// A file system or socket call failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// The listening configuration socket of one interface; removed when dropped (if it is still ours).
#[derive(Debug)]
pub struct UapiSocket {
    listener: UnixListener,
    path: PathBuf,
    inode: u64,
}

impl UapiSocket {
    /// Binds `/var/run/wireguard/NAME.sock` (the directory made 0755 if missing, the socket reachable by its
    /// owner only). A stale socket left by a process that died is replaced; a live one is an error.
    pub fn bind(name: &str) -> Result<Self, UapiError> {
        Self::bind_at(&socket_path(name))
    }

    /// [`Self::bind`] at `path`.
    fn bind_at(path: &Path) -> Result<Self, UapiError> {
        let io_error = |what, source| UapiError::Io { what, path: path.to_path_buf(), source };
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir).map_err(|e| io_error("creating", e))?;
        }
        if path.exists() {
            match UnixStream::connect(path) {
                Ok(_) => return Err(UapiError::InUse { path: path.to_path_buf() }),
                Err(_) => std::fs::remove_file(path).map_err(|e| io_error("removing the stale socket", e))?,
            }
        }
        // Only the owner may connect: the socket hands out the private key.
        let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
        let bound = UnixListener::bind(path);
        rustix::process::umask(old);
        let listener = bound.map_err(|e| io_error("binding", e))?;
        listener.set_nonblocking(true).map_err(|e| io_error("configuring", e))?;
        let inode = std::fs::metadata(path).map_err(|e| io_error("reading", e))?.ino();
        Ok(UapiSocket { listener, path: path.to_path_buf(), inode })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The socket file's inode (which tells it from a socket another process bound at the same path later).
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// Whether the socket file is still the one bound here (deleting it is a way to stop the endpoint).
    pub fn still_there(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode)
    }

    /// Serves requests until `stop` fires. `on_set(old, new)` runs before a valid `set=1` takes effect and may
    /// refuse it with an errno (a port that cannot be bound); the configuration then stays as it was.
    pub fn serve(
        &self,
        wg: &WireGuard,
        on_set: &mut dyn FnMut(&DeviceConfig, &DeviceConfig) -> Result<(), i32>,
        stop: &StopHandle,
    ) -> io::Result<()> {
        let wake = stop.wake_fd().map_err(io::Error::from)?;
        while !stop.is_stopped() {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = handle(stream, wg, on_set) {
                        tracing::debug!("configuration client: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    use rustix::event::{poll, PollFd, PollFlags, Timespec};
                    let mut fds = [PollFd::new(&self.listener, PollFlags::IN), PollFd::new(&wake, PollFlags::IN)];
                    let timeout = Timespec { tv_sec: 1, tv_nsec: 0 };
                    match poll(&mut fds, Some(&timeout)) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Drop for UapiSocket {
    fn drop(&mut self) {
        if self.still_there() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// One client: requests until it closes the connection (or sends what is not a request).
fn handle(
    stream: UnixStream,
    wg: &WireGuard,
    on_set: &mut dyn FnMut(&DeviceConfig, &DeviceConfig) -> Result<(), i32>,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        match line.trim_end_matches('\n') {
            "get=1" => {
                line.clear();
                reader.read_line(&mut line)?;
                if line != "\n" {
                    writer.write_all(b"errno=-22\n\n")?;
                    continue;
                }
                let reply = format!("{}errno=0\n\n", render_get(wg));
                writer.write_all(reply.as_bytes())?;
            }
            "set=1" => {
                let mut lines = Vec::new();
                loop {
                    line.clear();
                    if reader.read_line(&mut line)? == 0 {
                        return Ok(()); // the request never ended: nothing applied
                    }
                    let l = line.trim_end_matches('\n');
                    if l.is_empty() {
                        break;
                    }
                    lines.push(l.to_string());
                }
                let errno = match set(wg, &lines, on_set) {
                    Ok(()) => 0,
                    Err(e) => {
                        tracing::warn!("configuration refused, nothing changed: {e}");
                        e.errno
                    }
                };
                writer.write_all(format!("errno={}\n\n", -errno).as_bytes())?;
            }
            // Not a request of this protocol: the connection is closed without an answer, as wireguard-go does.
            _ => return Ok(()),
        }
    }
}

/// One `set=1` request: parsed and applied to a copy, checked by `on_set`, then put in force, or refused whole.
fn set(
    wg: &WireGuard,
    lines: &[String],
    on_set: &mut dyn FnMut(&DeviceConfig, &DeviceConfig) -> Result<(), i32>,
) -> Result<(), SetError> {
    let old = wg.config();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let new = apply_set(&old, &refs, public_key)?;
    on_set(&old, &new).map_err(|errno| SetError {
        errno,
        line: String::new(),
        reason: format!("the new configuration cannot be put in force: {}", io::Error::from_raw_os_error(errno)),
    })?;
    wg.apply(new);
    Ok(())
}
