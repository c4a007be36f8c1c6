//! WireGuard's cross-platform userspace configuration protocol, as `wg` speaks it and wireguard-go serves it:
//! `get=1` and `set=1` requests over `/var/run/wireguard/NAME.sock`, each answered with an `errno=` line.
//!
//! - this module: the socket and its clients;
//! - `get`: the text of a `get=1` reply;
//! - `set`: a `set=1` request's lines parsed and applied to a copy of the configuration (a bad request
//!   changes nothing), then put in force.
//!
//! Clients are served at once, each on a thread of its own (up to `MAX_CLIENTS`; more wait to be accepted):
//! one that is slow, silent or never finishes its request delays no `get=1` and no stop. A request is taken a
//! line at a time as it arrives: a `set=1` changes a copy of the configuration line by line (so what it holds is
//! bounded by the configuration it makes, not by its length), and the copy replaces the configuration only if
//! every line was understood. No length limits a request: a line may be at most `MAX_LINE_BYTES` long, the
//! device holds at most `set::MAX_PEERS` peers (`ENOMEM` beyond, as in the kernel), and a request must arrive
//! within `REQUEST_DEADLINE` plus a second per `BYTES_PER_SECOND_GRANTED` it carries, so that a client that
//! trickles bytes is cut off while a large configuration from `wg` is taken whole. Requests that change the
//! configuration are applied one at a time; a `get=1` reads the configuration in force, which no request
//! changes half-way, and its reply is written as it is made.

pub(crate) mod get;
pub(crate) mod set;

use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use turbotun::StopHandle;
use zeroize::Zeroizing;

use crate::control::{Configurator, Filled};
use crate::wireguard::WireGuard;

/// Where `wg` looks for the sockets of userspace implementations.
pub const SOCKET_DIR: &str = "/var/run/wireguard";

/// Clients served at once; further connections wait in the socket's backlog until one of them ends.
pub(crate) const MAX_CLIENTS: usize = 8;

/// How long a request may take to arrive whole (from the connection, or from the reply to the one before)
/// beyond the time its length grants (see [`BYTES_PER_SECOND_GRANTED`]), and each part of its reply to be
/// taken: a client that trickles bytes is cut off then.
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// A request's deadline grows by a second for every this many bytes it carried, so that a configuration of a
/// million peers (some 200 MB from `wg`) is not cut off while a trickle gains nothing.
pub(crate) const BYTES_PER_SECOND_GRANTED: u64 = 4 << 20;

/// The longest request line taken: `wg` writes none longer than some 200 bytes. A longer one refuses the request
/// with `EMSGSIZE` (the rest of the request is read and dropped), so that no line makes the endpoint's memory
/// grow.
pub(crate) const MAX_LINE_BYTES: usize = 4096;

/// How long a new endpoint waits, at most, for the endpoint that serves its socket to end (`IN_USE_TRIES` looks,
/// `IN_USE_WAIT` apart) before it refuses to start.
const IN_USE_TRIES: u32 = 50;
const IN_USE_WAIT: Duration = Duration::from_millis(20);

/// How much is read from a client at once.
const READ_CHUNK: usize = 16 << 10;

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
pub(crate) struct UapiSocket {
    listener: UnixListener,
    path: PathBuf,
    inode: u64,
}

impl UapiSocket {
    /// Binds `/var/run/wireguard/NAME.sock` (the directory made 0755 if missing, the socket reachable by its
    /// owner only). A stale socket left by a process that died is replaced; a live one is an error.
    pub(crate) fn bind(name: &str) -> Result<Self, UapiError> {
        Self::bind_at(&socket_path(name))
    }

    /// [`Self::bind`] at `path`.
    fn bind_at(path: &Path) -> Result<Self, UapiError> {
        let io_error = |what, source| UapiError::Io { what, path: path.to_path_buf(), source };
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir).map_err(|e| io_error("creating", e))?;
        }
        // A served socket may belong to an endpoint that is ending (its device was just deleted, as `ip link del`
        // then a new endpoint of the same name in quick succession does): it is given a moment to go.
        let mut tries = 0;
        while path.exists() {
            match UnixStream::connect(path) {
                Ok(_) if tries < IN_USE_TRIES => {
                    tries += 1;
                    std::thread::sleep(IN_USE_WAIT);
                }
                Ok(_) => return Err(UapiError::InUse { path: path.to_path_buf() }),
                Err(_) => {
                    match std::fs::remove_file(path) {
                        // Gone meanwhile (its endpoint removed it as it ended).
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        removed => removed.map_err(|e| io_error("removing the stale socket", e))?,
                    }
                    break;
                }
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
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The socket file's inode (which tells it from a socket another process bound at the same path later).
    pub(crate) fn inode(&self) -> u64 {
        self.inode
    }

    /// Whether the socket file is still the one bound here (deleting it is a way to stop the endpoint).
    pub(crate) fn still_there(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode)
    }

    /// Serves clients until `stop` fires or the socket file is removed, then waits for the clients' threads (which end at once). A `set=1`
    /// goes through `configurator`, as every change does: applied whole or refused whole.
    pub(crate) fn serve(&self, configurator: &Configurator, stop: &StopHandle) -> io::Result<()> {
        let wake = stop.wake_fd().map_err(io::Error::from)?;
        std::thread::scope(|scope| {
            let mut clients: Vec<std::thread::ScopedJoinHandle<'_, ()>> = Vec::new();
            while !stop.is_stopped() {
                clients.retain(|client| !client.is_finished());
                let room = clients.len() < MAX_CLIENTS;
                let accepted = if room { self.listener.accept() } else { Err(io::ErrorKind::WouldBlock.into()) };
                match accepted {
                    Ok((stream, _)) => {
                        let spawned =
                            std::thread::Builder::new().name("wg-uapi-client".into()).spawn_scoped(scope, move || {
                                if let Err(e) = serve_client(stream, configurator, stop) {
                                    tracing::debug!("configuration client: {e}");
                                }
                                // Requests carry keys, and the thread's stack may be kept for the next thread.
                                crate::config::scrub_stack();
                            });
                        match spawned {
                            Ok(client) => clients.push(client),
                            Err(e) => tracing::warn!("configuration socket: no thread for a client: {e}"),
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        // A new client (when there is room), a stop, or a look at the clients that ended.
                        let wait = if room { Duration::from_secs(1) } else { Duration::from_millis(50) };
                        let mut fds = [PollFd::new(&self.listener, PollFlags::IN), PollFd::new(&wake, PollFlags::IN)];
                        let fds = if room { &mut fds[..] } else { &mut fds[1..] };
                        match poll(fds, Some(&timespec(wait))) {
                            Ok(_) | Err(rustix::io::Errno::INTR) => {}
                            Err(e) => return Err(e.into()),
                        }
                        // Removing the socket file stops the endpoint (its caller looks at `still_there`).
                        if !self.still_there() {
                            return Ok(());
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // Out of file descriptors or memory for a moment, or a client gone before it was accepted:
                    // serving goes on.
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::ECONNABORTED)
                        ) =>
                    {
                        tracing::warn!("configuration socket: accepting a client: {e}");
                        let mut fds = [PollFd::new(&wake, PollFlags::IN)];
                        let _ = poll(&mut fds, Some(&timespec(Duration::from_millis(100))));
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })
    }
}

impl Drop for UapiSocket {
    fn drop(&mut self) {
        if self.still_there() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A poll timeout.
fn timespec(d: Duration) -> Timespec {
    Timespec { tv_sec: d.as_secs().try_into().unwrap_or(i64::MAX), tv_nsec: d.subsec_nanos().into() }
}

/// How a wait for a client ended.
enum Waited {
    Ready,
    TimedOut,
    Stopped,
}

/// What came next from a client.
enum Next {
    /// A line: these bytes of the buffer, without their newline.
    Line(std::ops::Range<usize>),
    /// A line longer than [`MAX_LINE_BYTES`] (what came of it is dropped, and the rest of it when it comes).
    TooLong,
    /// The client closed the connection, its time ran out, or the endpoint stops: an unfinished request is
    /// dropped unapplied.
    Gone,
}

/// One connected client.
struct Client<'a> {
    stream: UnixStream,
    stop: &'a StopHandle,
    /// What was received: bytes before `start` are handled. Requests carry keys: the buffer never grows past
    /// [`MAX_LINE_BYTES`] and a read (so it is never reallocated with a copy left behind) and is wiped when
    /// dropped.
    pending: Zeroizing<Vec<u8>>,
    start: usize,
    /// Bytes of a line too long still to drop, up to and with its newline.
    skipping: bool,
    /// Bytes taken since the request began.
    received: u64,
}

impl Client<'_> {
    fn new(stream: UnixStream, stop: &StopHandle) -> Client<'_> {
        Client {
            stream,
            stop,
            pending: Zeroizing::new(Vec::with_capacity(MAX_LINE_BYTES + READ_CHUNK)),
            start: 0,
            skipping: false,
            received: 0,
        }
    }

    /// Waits until the stream is ready for `flags`, `deadline` passes or the endpoint stops.
    fn wait(&self, flags: PollFlags, deadline: Instant) -> io::Result<Waited> {
        loop {
            if self.stop.is_stopped() {
                return Ok(Waited::Stopped);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Waited::TimedOut);
            }
            let wake = self.stop.wake_fd().map_err(io::Error::from)?;
            let mut fds = [PollFd::new(&self.stream, flags), PollFd::new(&wake, PollFlags::IN)];
            match poll(&mut fds, Some(&timespec(left))) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
            if !fds[0].revents().is_empty() && !self.stop.is_stopped() {
                return Ok(Waited::Ready);
            }
        }
    }

    /// Reads what the client sent next after the unhandled bytes (moved to the front first, within the buffer's
    /// room); false when nothing more will come (closed, time up, stopped).
    fn fill(&mut self, deadline: Instant) -> io::Result<bool> {
        self.pending.copy_within(self.start.., 0);
        let len = self.pending.len() - self.start;
        self.pending.truncate(len);
        self.start = 0;
        self.pending.resize(len + READ_CHUNK, 0);
        loop {
            match self.stream.read(&mut self.pending[len..]) {
                Ok(n) => {
                    self.pending.truncate(len + n);
                    self.received += n as u64;
                    return Ok(n > 0);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => match self.wait(PollFlags::IN, deadline) {
                    Ok(Waited::Ready) => {}
                    Ok(Waited::TimedOut | Waited::Stopped) => {
                        self.pending.truncate(len);
                        return Ok(false);
                    }
                    Err(e) => {
                        self.pending.truncate(len);
                        return Err(e);
                    }
                },
                Err(e) => {
                    self.pending.truncate(len);
                    return Err(e);
                }
            }
        }
    }

    /// When the request begun at `began` must have arrived by, given what it carried so far.
    fn deadline(&self, began: Instant) -> Instant {
        began + REQUEST_DEADLINE + Duration::from_secs(self.received / BYTES_PER_SECOND_GRANTED)
    }

    /// The next line of the request begun at `began`. `first`: the request's first line, which must be one of
    /// the two commands; anything else ends the connection as soon as it shows.
    fn next_line(&mut self, began: Instant, first: bool) -> io::Result<Next> {
        // Bytes after `start` known to hold no newline, so that each byte is looked at once.
        let mut scanned = 0;
        loop {
            let unhandled = &self.pending[self.start..];
            let head = &unhandled[..unhandled.len().min(6)];
            if first && !b"get=1\n".starts_with(head) && !b"set=1\n".starts_with(head) {
                return Ok(Next::Gone);
            }
            if let Some(at) = unhandled[scanned..].iter().position(|&b| b == b'\n') {
                let line = self.start..self.start + scanned + at;
                self.start = line.end + 1;
                if std::mem::take(&mut self.skipping) {
                    // The end of a line too long, already answered for.
                    scanned = 0;
                    continue;
                }
                if line.len() > MAX_LINE_BYTES {
                    return Ok(Next::TooLong);
                }
                return Ok(Next::Line(line));
            }
            if unhandled.len() > MAX_LINE_BYTES || (self.skipping && !unhandled.is_empty()) {
                self.start = self.pending.len();
                scanned = 0;
                if !std::mem::replace(&mut self.skipping, true) {
                    return Ok(Next::TooLong);
                }
            } else {
                scanned = unhandled.len();
            }
            if !self.fill(self.deadline(began))? {
                return Ok(Next::Gone);
            }
        }
    }

    /// Writes `bytes` by `deadline`; false if the client did not take them in time or the endpoint stops.
    fn write_all(&mut self, mut bytes: &[u8], deadline: Instant) -> io::Result<bool> {
        while !bytes.is_empty() {
            match self.stream.write(bytes) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => match self.wait(PollFlags::OUT, deadline)? {
                    Waited::Ready => {}
                    Waited::TimedOut | Waited::Stopped => return Ok(false),
                },
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// What became of a request: the errno to answer with, or the client is gone.
enum Handled {
    Answer(i32),
    Gone,
}

/// One client: requests until it closes the connection, sends what is not a request, runs out of time, or the
/// endpoint stops.
fn serve_client(stream: UnixStream, configurator: &Configurator, stop: &StopHandle) -> io::Result<()> {
    stream.set_nonblocking(true)?;
    let mut client = Client::new(stream, stop);
    loop {
        let began = Instant::now();
        client.received = 0;
        let command = match client.next_line(began, true)? {
            Next::Line(line) => line,
            // Not a request of this protocol: the connection is closed without an answer, as wireguard-go does.
            Next::TooLong | Next::Gone => return Ok(()),
        };
        let handled = if &client.pending[command] == b"get=1" {
            handle_get(&mut client, &configurator.wg, began)?
        } else {
            handle_set(&mut client, configurator, began)?
        };
        let Handled::Answer(errno) = handled else { return Ok(()) };
        if !client.write_all(format!("errno={}\n\n", -errno).as_bytes(), Instant::now() + REQUEST_DEADLINE)? {
            return Ok(());
        }
        crate::config::scrub_stack();
    }
}

/// A `get=1` request (its first line read): the reply written as it is made, each part taken within
/// [`REQUEST_DEADLINE`]. A `get=1` with lines is answered `EINVAL`.
fn handle_get(client: &mut Client<'_>, wg: &WireGuard, began: Instant) -> io::Result<Handled> {
    let mut lines = 0;
    loop {
        match client.next_line(began, false)? {
            Next::Line(line) if line.is_empty() => break,
            Next::Line(_) | Next::TooLong => lines += 1,
            Next::Gone => return Ok(Handled::Gone),
        }
    }
    if lines > 0 {
        return Ok(Handled::Answer(libc::EINVAL));
    }
    let written = get::render_get(wg, &mut |part| client.write_all(part, Instant::now() + REQUEST_DEADLINE))?;
    Ok(if written { Handled::Answer(0) } else { Handled::Gone })
}

/// A `set=1` request (its first line read): each line applied to a draft of the configuration as it arrives,
/// through the device's [`Configurator`] (one change at a time), put in force once the empty line came, or the
/// request refused whole.
fn handle_set(client: &mut Client<'_>, configurator: &Configurator, began: Instant) -> io::Result<Handled> {
    let mut failed: Option<io::Error> = None;
    let changed = configurator.change(|request| {
        // The first refusal: the rest of the request is read and dropped.
        let mut refused: Option<set::ConfigError> = None;
        loop {
            let line = match client.next_line(began, false) {
                Ok(Next::Line(line)) if line.is_empty() => break,
                Ok(Next::Line(line)) => line,
                Ok(Next::TooLong) => {
                    let reason = format!("a line longer than {MAX_LINE_BYTES} bytes");
                    let line = "(not shown)".into();
                    refused.get_or_insert(set::ConfigError { errno: libc::EMSGSIZE, line, reason });
                    continue;
                }
                Ok(Next::Gone) => return Filled::Abandon,
                Err(e) => {
                    failed = Some(e);
                    return Filled::Abandon;
                }
            };
            if refused.is_some() {
                continue;
            }
            let applied = match std::str::from_utf8(&client.pending[line]) {
                Ok(text) => request.line(text),
                Err(_) => Err(set::ConfigError {
                    errno: libc::EINVAL,
                    line: "(not shown)".into(),
                    reason: "the line is not UTF-8 text".into(),
                }),
            };
            refused = applied.err();
        }
        match refused {
            Some(refusal) => Filled::Refuse(refusal),
            None => Filled::Apply,
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(match changed {
        None => Handled::Gone,
        Some(Ok(())) => Handled::Answer(0),
        Some(Err(e)) => Handled::Answer(e.errno),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write as _;
    use std::io::{BufRead, BufReader};
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
    use std::sync::{mpsc, Arc};

    use crate::config::{key_to_hex, DeviceConfig};

    /// A socket served on a thread of its own at a path of its own; stopped, and the path removed, on drop.
    struct Served {
        path: PathBuf,
        stop: StopHandle,
        wg: Arc<WireGuard>,
        /// Reports once `serve` has returned and the socket is dropped.
        ended: mpsc::Receiver<io::Result<()>>,
    }

    impl Served {
        fn start(
            on_set: impl FnMut(&DeviceConfig, &DeviceConfig) -> Result<(), (i32, String)> + Send + 'static,
        ) -> Served {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "turbotun-uapi-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let path = dir.join("wgtest.sock");
            let socket = UapiSocket::bind_at(&path).unwrap();
            let (stop, wg) = (StopHandle::new(), Arc::new(WireGuard::new()));
            let (tx, ended) = mpsc::channel();
            let (stop2, configurator) = (stop.clone(), Configurator::new(wg.clone(), Box::new(on_set)));
            std::thread::spawn(move || {
                let served = socket.serve(&configurator, &stop2);
                drop(socket);
                let _ = tx.send(served);
            });
            Served { path, stop, wg, ended }
        }

        fn connect(&self) -> UnixStream {
            connect(&self.path)
        }

        fn request(&self, text: &str) -> String {
            request(&self.path, text)
        }
    }

    fn connect(path: &Path) -> UnixStream {
        let stream = UnixStream::connect(path).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        stream
    }

    /// One request and its reply (up to the empty line that ends it).
    fn request(path: &Path, text: &str) -> String {
        let mut stream = connect(path);
        stream.write_all(text.as_bytes()).unwrap();
        read_reply(&mut BufReader::new(stream))
    }

    impl Drop for Served {
        fn drop(&mut self) {
            self.stop.stop();
            let _ = self.ended.recv_timeout(Duration::from_secs(20));
            let _ = std::fs::remove_file(&self.path);
            let _ = std::fs::remove_dir(self.path.parent().unwrap());
        }
    }

    fn read_reply(reader: &mut impl BufRead) -> String {
        let mut reply = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\n" {
                return reply;
            }
            reply.push_str(&line);
        }
    }

    /// A client on a thread of its own, sending `first` then `each` every 100 ms.
    struct Trickle {
        /// Tells it to stop.
        done: Arc<AtomicBool>,
        /// How many times it sent `each`.
        sent: Arc<AtomicUsize>,
        /// Set once a write failed: the server closed the connection.
        closed: Arc<AtomicBool>,
    }

    impl Drop for Trickle {
        fn drop(&mut self) {
            self.done.store(true, Ordering::Relaxed);
        }
    }

    fn trickle(served: &Served, first: &'static str, each: &'static str) -> Trickle {
        let t = Trickle {
            done: Arc::new(AtomicBool::new(false)),
            sent: Arc::new(AtomicUsize::new(0)),
            closed: Arc::new(AtomicBool::new(false)),
        };
        let mut stream = served.connect();
        let (done, sent, closed) = (t.done.clone(), t.sent.clone(), t.closed.clone());
        std::thread::spawn(move || {
            let _ = stream.write_all(first.as_bytes());
            // At most a minute, whatever happens.
            for _ in 0..600 {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                if stream.write_all(each.as_bytes()).is_err() {
                    closed.store(true, Ordering::Relaxed);
                    break;
                }
                sent.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        t
    }

    fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
        let start = Instant::now();
        while !ready() {
            assert!(start.elapsed() < Duration::from_secs(20), "waited 20 s for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn test_a_trickling_client_delays_neither_another_client_nor_the_stop() {
        let served = Served::start(|_, _| Ok(()));
        // A byte every 100 ms: each read succeeds, the request never ends.
        let trickling = trickle(&served, "set=1\nfwmark=", "1");
        wait_until("the trickle to start", || trickling.sent.load(Ordering::Relaxed) >= 3);
        // Another client is answered meanwhile (the read timeout of 20 s would fail the test otherwise).
        let reply = served.request("get=1\n\n");
        assert!(reply.ends_with("errno=0\n"), "{reply:?}");
        assert!(!trickling.closed.load(Ordering::Relaxed), "the trickling client is still connected");
        // A stop ends the server while the trickle goes on, and the socket goes.
        served.stop.stop();
        let ended = served.ended.recv_timeout(Duration::from_secs(20));
        assert!(matches!(ended, Ok(Ok(()))), "the server did not end on the stop: {ended:?}");
        assert!(!served.path.exists(), "the socket file is removed");
        assert_eq!(served.wg.config().fwmark, 0, "nothing of the unfinished request applied");
    }

    #[test]
    fn test_a_request_that_takes_longer_than_its_deadline_is_cut_off_unapplied() {
        let served = Served::start(|_, _| Ok(()));
        // Whole lines, one every 100 ms, and never the empty line that would end the request.
        let start = Instant::now();
        let trickling = trickle(&served, "set=1\n", "fwmark=7\n");
        // The server closes the connection: the trickle's next write fails.
        wait_until("the trickling client to be cut off", || trickling.closed.load(Ordering::Relaxed));
        assert!(start.elapsed() >= REQUEST_DEADLINE, "cut off before its deadline");
        assert_eq!(served.wg.config().fwmark, 0);
        assert!(served.request("get=1\n\n").ends_with("errno=0\n"), "the socket still serves");
    }

    #[test]
    fn test_a_line_too_long_refuses_the_request_and_nothing_of_it_applied() {
        let served = Served::start(|_, _| Ok(()));
        let stream = served.connect();
        let mut writer = stream.try_clone().unwrap();
        let mut reader = BufReader::new(stream);
        let long = format!("fwmark=1{}\n", "0".repeat(3 * READ_CHUNK));
        writer.write_all(format!("set=1\nfwmark=7\n{long}listen_port=0\n\n").as_bytes()).unwrap();
        assert_eq!(read_reply(&mut reader), format!("errno=-{}\n", libc::EMSGSIZE));
        assert_eq!(served.wg.config().fwmark, 0);
        // The rest of the long line was dropped with it, and the connection serves the next request.
        writer.write_all(b"set=1\nfwmark=7\n\n").unwrap();
        assert_eq!(read_reply(&mut reader), "errno=0\n");
        assert_eq!(served.wg.config().fwmark, 7);
        // A line too long that arrives whole, with its newline, in one read.
        let long = format!("fwmark=1{}\n", "0".repeat(MAX_LINE_BYTES));
        writer.write_all(format!("set=1\nfwmark=8\n{long}\n").as_bytes()).unwrap();
        assert_eq!(read_reply(&mut reader), format!("errno=-{}\n", libc::EMSGSIZE));
        assert_eq!(served.wg.config().fwmark, 7);
        // A line of exactly the longest length is taken.
        let padded = format!("fwmark={:0>width$}", 9, width = MAX_LINE_BYTES - "fwmark=".len());
        assert_eq!(served.request(&format!("set=1\n{padded}\n\n")), "errno=0\n");
        assert_eq!(served.wg.config().fwmark, 9);
    }

    /// What the 8 MiB limit refused before requests were taken a line at a time: 100,000 peers in one request
    /// (some 14 MB). With a bad line at its very end nothing of it is applied; without, all of it.
    #[test]
    fn test_a_request_of_100000_peers_is_taken_whole_or_not_at_all() {
        let served = Served::start(|_, _| Ok(()));
        let mut request = String::from("set=1\nreplace_peers=true\n");
        for i in 0..100_000u32 {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&i.to_be_bytes());
            key[31] = 1;
            let [_, a, b, c] = i.to_be_bytes();
            let _ = write!(
                request,
                "public_key={}\nendpoint=192.0.2.{}:{}\nreplace_allowed_ips=true\nallowed_ip=10.{a}.{b}.{c}/32\n",
                key_to_hex(&key),
                c,
                1000 + (i % 50_000)
            );
        }
        assert!(request.len() > 8 << 20, "{} bytes", request.len());
        let bad = format!("{request}allowed_ip=10.0.0.0/33\n\n");
        assert_eq!(served.request(&bad), format!("errno=-{}\n", libc::EINVAL));
        assert!(served.wg.config().peers.is_empty(), "nothing of the refused request applied");
        assert_eq!(served.request(&format!("{request}\n")), "errno=0\n");
        let config = served.wg.config();
        assert_eq!(config.peers.len(), 100_000);
        assert_eq!(config.peers[99_999].allowed_ips, [("10.1.134.159".parse().unwrap(), 32)]);
        // The reply to get=1 holds every peer (written in parts as it is made).
        let reply = served.request("get=1\n\n");
        assert_eq!(reply.matches("public_key=").count(), 100_000);
        assert!(reply.ends_with("allowed_ip=10.1.134.159/32\nerrno=0\n"), "{}", &reply[reply.len() - 100..]);
    }

    #[test]
    fn test_sets_from_many_clients_are_applied_one_at_a_time() {
        let inside = Arc::new(AtomicBool::new(false));
        let inside2 = inside.clone();
        let served = Served::start(move |_, _| {
            assert!(!inside2.swap(true, Ordering::SeqCst), "two sets at once");
            std::thread::sleep(Duration::from_millis(5));
            inside2.store(false, Ordering::SeqCst);
            Ok(())
        });
        std::thread::scope(|scope| {
            let clients: Vec<_> = (1..=24u8)
                .map(|i| {
                    let path = &served.path;
                    scope.spawn(move || {
                        let key = key_to_hex(&[i; 32]);
                        request(path, &format!("set=1\npublic_key={key}\nallowed_ip=10.{i}.0.0/16\n\n"))
                    })
                })
                .collect();
            for client in clients {
                assert_eq!(client.join().unwrap(), "errno=0\n");
            }
        });
        // Every request's peer is there: none was applied to a configuration another had replaced.
        let config = served.wg.config();
        assert_eq!(config.peers.len(), 24, "{config:?}");
    }
}
