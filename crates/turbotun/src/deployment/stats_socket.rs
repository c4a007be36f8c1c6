//! Counters while an engine runs: a read-only Unix socket per running forwarder or tunnel
//! (`/run/turbotun/NAME.stats`), answered with a snapshot of the counters the engine keeps anyway, so that
//! serving them adds no work on the data path.
//!
//! A client connects and reads until the end: the server writes one [`Report`] as `key=value` lines (the way
//! WireGuard's configuration protocol reads), ending with an empty line, and closes. It never reads what a
//! client sends. [`read`] is the client; `socat - UNIX-CONNECT:/run/turbotun/NAME.stats` works as well.
//!
//! Access: the socket is made `0700` (its owner, root for a process started as root, may connect; nobody
//! else), in a directory that must be owned by root or by this user and writable by no one else. A stale
//! socket (its process died) is replaced; one that answers belongs to a running process and is left alone.
//! The socket is removed when the [`StatsSocket`] (or the [`StatsServer`] answering on it) is dropped, if it is
//! still the one bound here.
//!
//! ```text
//! kind=forwarder
//! engine=forwarder
//! name=tta
//! device=tta
//! device=ttb
//! setting=mode offload
//! pid=4242
//! seconds=3.004
//! direction=a_to_b
//! reads=120
//! packets=1000
//! ...
//! drop=device_down 1
//! direction=b_to_a
//! ...
//!
//! ```

use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

pub use crate::deployment::stats_report::{PeerCounters, Report};
use crate::error::{ConfigError, Error, Result};
use crate::stop::StopHandle;

/// Where the counters sockets are: one `NAME.stats` per running engine.
pub const STATS_DIR: &str = "/run/turbotun";

/// The suffix of a counters socket's file name.
pub const STATS_SUFFIX: &str = ".stats";

/// How long a client may take to take a report, and [`read`] to get one.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest report [`read`] accepts: about 1 KiB per direction, and up to some 250 bytes per WireGuard peer
/// (of at most 2^20) with a few prefixes each.
const MAX_REPORT: u64 = (1 << 20) + 512 * (1 << 20);

/// The counters socket of the engine named `name` (a device name) in [`STATS_DIR`], for an engine in the calling
/// thread's network namespace: `NAME.stats` in the initial namespace, `NAME@NETNS.stats` in any other
/// ([`crate::netns::current_name`]), so that engines of one device name in two namespaces both serve counters.
pub fn socket_path(name: &str) -> PathBuf {
    match crate::configuration::netns::current_name() {
        None => Path::new(STATS_DIR).join(format!("{name}{STATS_SUFFIX}")),
        Some(netns) => Path::new(STATS_DIR).join(format!("{name}@{netns}{STATS_SUFFIX}")),
    }
}

/// The counters socket a reader means by `name`: the engine of that name in the reader's own namespace
/// ([`socket_path`]); else the socket listed by exactly that name (`tta@blue`); else the one engine of that name
/// in another namespace. Two or more of that name elsewhere and none here: an error listing them. Nothing of that
/// name: [`socket_path`], whose read then says nothing serves there.
pub fn locate(name: &str) -> Result<PathBuf> {
    let own = socket_path(name);
    if own.exists() {
        return Ok(own);
    }
    let serving = list(Path::new(STATS_DIR));
    if let Some((_, path)) = serving.iter().find(|(listed, _)| listed == name) {
        return Ok(path.clone());
    }
    let prefix = format!("{name}@");
    let mut elsewhere: Vec<(String, PathBuf)> =
        serving.into_iter().filter(|(listed, _)| listed.starts_with(&prefix)).collect();
    match elsewhere.len() {
        0 => Ok(own),
        1 => Ok(elsewhere.remove(0).1),
        _ => Err(Error::Config(ConfigError::AmbiguousStatsName {
            name: name.to_string(),
            candidates: elsewhere.into_iter().map(|(listed, _)| listed).collect(),
        })),
    }
}

/// A bound counters socket, not answering yet: bind it while the process may still write to [`STATS_DIR`]
/// (before dropping privileges, which refuses to run beside other threads), then [`Self::serve`]. Removed when
/// dropped, if it is still the one bound here.
#[derive(Debug)]
pub struct StatsSocket {
    listener: UnixListener,
    path: PathBuf,
    inode: u64,
    // The binding thread's network namespace, which every report served here names.
    netns: Option<String>,
}

impl StatsSocket {
    /// Binds the counters socket at `path` (its directory made `0755` if missing). Refused when another process
    /// answers at `path` ([`Error::SocketInUse`]), or when the directory could let another user put a socket of
    /// their own there; a stale socket is replaced.
    pub fn bind(path: &Path) -> Result<StatsSocket> {
        let io_error = |what: &str, e: io::Error| Error::io(format!("{what} {}", path.display()), e);
        check_name(path)?;
        if let Some(dir) = path.parent() {
            check_dir(dir)?;
        }
        crate::configuration::local_socket::clear_stale_socket(path, "serve the counters elsewhere")?;
        // Only the owner may connect (root for a process started as root).
        let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
        let bound = UnixListener::bind(path);
        rustix::process::umask(old);
        let listener = bound.map_err(|e| io_error("binding", e))?;
        let inode = std::fs::symlink_metadata(path).map_err(|e| io_error("reading", e))?.ino();
        let netns = crate::configuration::netns::current_name();
        let socket = StatsSocket { listener, path: path.to_path_buf(), inode, netns };
        socket.listener.set_nonblocking(true).map_err(|e| io_error("configuring", e))?;
        Ok(socket)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The socket file's inode (which tells it from a socket another process bound at the same path later).
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// Starts answering: a thread gives each connection the report `source` makes, until the server is dropped.
    pub fn serve(self, source: impl Fn() -> Report + Send + 'static) -> Result<StatsServer> {
        let listener = self.listener.try_clone().map_err(|e| Error::io("sharing the counters socket", e))?;
        let stop = StopHandle::new();
        let serving = stop.clone();
        let netns = self.netns.clone();
        let source = move || Report { netns: netns.clone(), ..source() };
        let thread = std::thread::Builder::new()
            .name("stats-socket".into())
            .spawn(move || serve(&listener, &source, &serving))
            .map_err(|e| Error::io("spawning the counters socket's thread", e))?;
        Ok(StatsServer { stop, thread: Some(thread), socket: self })
    }
}

impl Drop for StatsSocket {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A counters socket being answered ([`StatsSocket::serve`]). Stops, and removes the socket, when dropped.
#[derive(Debug)]
pub struct StatsServer {
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
    // Dropped after the thread has ended: the file goes last.
    socket: StatsSocket,
}

impl StatsServer {
    /// [`StatsSocket::bind`] and [`StatsSocket::serve`] at once (for a process that drops no privileges).
    pub fn bind(path: &Path, source: impl Fn() -> Report + Send + 'static) -> Result<StatsServer> {
        StatsSocket::bind(path)?.serve(source)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        self.socket.path()
    }
}

impl Drop for StatsServer {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The directory of a counters socket: made `0755` if missing; refused if another user owns it or may write to
/// it (they could put a socket that answers with counters of their own making in place of one).
fn check_dir(dir: &Path) -> Result<()> {
    let io_error = |what: &str, e: io::Error| Error::io(format!("{what} {}", dir.display()), e);
    if !dir.exists() {
        std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir).map_err(|e| io_error("creating", e))?;
        // The umask may have taken bits away; the directory must be searchable by anyone allowed a socket in it.
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
    }
    let meta = std::fs::metadata(dir).map_err(|e| io_error("reading", e))?;
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        return Err(Error::Config(ConfigError::SocketPath {
            path: dir.to_path_buf(),
            why: format!(
                "belongs to uid {}, not to root or this user: counters sockets are not served from it",
                meta.uid()
            ),
        }));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Error::Config(ConfigError::SocketPath {
            path: dir.to_path_buf(),
            why: format!(
                "is writable by others (mode {:o}): counters sockets are not served from it (chmod 755 it)",
                meta.mode() & 0o7777
            ),
        }));
    }
    Ok(())
}

/// Answers connections until `stop` fires: each gets one report and is closed.
fn serve(listener: &UnixListener, source: &dyn Fn() -> Report, stop: &StopHandle) {
    let Ok(wake) = stop.wake_fd() else { return };
    while !stop.is_stopped() {
        match listener.accept() {
            Ok((mut stream, _)) => {
                let text = source().to_text();
                // A client that does not read cannot hold the thread for long.
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_write_timeout(Some(CLIENT_TIMEOUT));
                if let Err(e) = stream.write_all(text.as_bytes()) {
                    tracing::debug!("counters socket client: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                use rustix::event::{poll, PollFd, PollFlags, Timespec};
                let mut fds = [PollFd::new(listener, PollFlags::IN), PollFd::new(&wake, PollFlags::IN)];
                let timeout = Timespec { tv_sec: 1, tv_nsec: 0 };
                match poll(&mut fds, Some(&timeout)) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => {
                        tracing::warn!("counters socket: poll: {e}");
                        return;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!("counters socket: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Reads the report served at `path`; the error says what to do about a missing, stale or forbidden socket.
pub fn read(path: &Path) -> Result<Report> {
    let shown = path.display();
    // Never connect to a socket that is not one of these (a vhost-user socket would count a front end, and
    // hang or answer nonsense): their names say what they are.
    check_name(path)?;
    let mut stream = UnixStream::connect(path).map_err(|e| {
        let why = match e.kind() {
            io::ErrorKind::NotFound => {
                format!("no counters socket at {shown}: no turbotun {SERVERS} serves that name now")
            }
            io::ErrorKind::ConnectionRefused => {
                format!("{shown} is left from a process that ended: nothing serves it (the next start replaces it)")
            }
            io::ErrorKind::PermissionDenied => {
                format!("{shown} may only be read by its owner (root for a process started as root): run as root")
            }
            _ => format!("connecting to {shown}"),
        };
        Error::io(why, e)
    })?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT)).map_err(|e| Error::io(format!("configuring {shown}"), e))?;
    let mut text = String::new();
    (&mut stream).take(MAX_REPORT).read_to_string(&mut text).map_err(|e| Error::io(format!("reading {shown}"), e))?;
    Report::parse(&text).map_err(|reason| {
        Error::Config(ConfigError::StatsReport { socket: shown.to_string(), reason: reason.to_string() })
    })
}

/// The commands that serve counters, as messages name them.
pub const SERVERS: &str = "fwd, tunnel, wg or vhost-user";

/// Refuses a path whose file name does not end in [`STATS_SUFFIX`]: every counters socket's does (the default
/// ones and any `--stats-socket` path, checked when bound), so that nothing else is taken for one.
pub fn check_name(path: &Path) -> Result<()> {
    let named = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.len() > STATS_SUFFIX.len() && n.ends_with(STATS_SUFFIX));
    if named {
        return Ok(());
    }
    Err(Error::Config(ConfigError::NotAStatsSocket { path: path.display().to_string() }))
}

/// The counters sockets in `dir` (normally [`STATS_DIR`]), by name, sorted.
pub fn list(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().strip_suffix(STATS_SUFFIX)?.to_string();
            Some((name, e.path()))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deployment::stats_report::tests::sample;

    #[test]
    fn test_server_answers_replaces_a_stale_socket_and_removes_its_own() {
        let dir = std::env::temp_dir().join(format!("turbotun-stats-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o755).create(&dir).unwrap();
        let path = dir.join("tt0.stats");
        // A socket left by a process that died: bound, never removed.
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let server = StatsServer::bind(&path, sample).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o077, 0, "only its owner may connect");
        assert_eq!(read(&path).unwrap(), sample());
        assert_eq!(list(&dir), vec![("tt0".to_string(), path.clone())]);
        let again = StatsServer::bind(&path, sample).unwrap_err();
        assert!(matches!(again, Error::SocketInUse { .. }), "{again}");
        drop(server);
        assert!(!path.exists(), "removed at the end");
        let gone = read(&path).unwrap_err().to_string();
        assert!(gone.contains("no counters socket"), "{gone}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let open = StatsServer::bind(&path, sample).unwrap_err().to_string();
        assert!(open.contains("writable by others"), "{open}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[allow(unreachable_pub)]
    mod skip {
        include!("../../tests/common/skip.rs");
    }

    /// Outside the initial namespace a socket's name carries the namespace, `net-INODE` for one without an
    /// `ip netns` name, and its reports say it.
    #[test]
    fn test_a_socket_in_another_namespace_is_named_after_it() {
        use std::os::unix::fs::MetadataExt;
        let ran = crate::configuration::netns::with_private_netns(|| {
            let inode = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
            assert_eq!(crate::configuration::netns::current_name(), Some(format!("net-{inode}")));
            assert_eq!(socket_path("tta"), Path::new(STATS_DIR).join(format!("tta@net-{inode}.stats")));
            let dir = std::env::temp_dir().join(format!("turbotun-netns-test-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
            let server = StatsServer::bind(&dir.join("tta.stats"), sample).unwrap();
            let netns = read(&dir.join("tta.stats")).map(|report| report.netns);
            drop(server);
            std::fs::remove_dir_all(&dir).unwrap();
            assert_eq!(netns.unwrap(), Some(format!("net-{inode}")));
        });
        if let Err(e) = ran {
            skip::cannot_run("test_a_socket_in_another_namespace_is_named_after_it", &format!("needs root: {e}"));
        }
    }
}
