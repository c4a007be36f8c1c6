//! The endpoint as `turbotun wg NAME` runs it, following WireGuard's cross-platform userspace interface: create
//! the TUN device NAME, serve `/var/run/wireguard/NAME.sock`, run the tunnel engine through the WireGuard
//! transform, and stop on SIGINT/SIGTERM, when the device is deleted (`wg-quick down`) or when the socket file is
//! removed, removing the socket.
//!
//! Without `-f` the command starts itself again in the background and returns once the device and the socket
//! are up (what `wg-quick up` waits for): the background process reports "ready" (or its error) over a pipe.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use turbotun::privilege::{drop_to, Identity};
use turbotun::socket_keeper::start_socket_keeper;
use turbotun::stats_socket::{Report, StatsServer, StatsSocket};
use turbotun::tunnel::{bind_sockets_with, TunnelBuilder, TunnelStats, TunnelStatsHandle};
use turbotun::udp::{SocketOptions, SocketReserve, TunnelSocket};
use turbotun::{DeviceBuilder, Offloads, Queue, StopHandle};

use crate::config::DeviceConfig;
use crate::uapi::{UapiError, UapiSocket};
use crate::wireguard::WireGuard;

/// The tunnel device's MTU at start (wireguard-go's: 1500 less the outer IPv6 and UDP headers and WireGuard's
/// 32 bytes); `wg-quick` sets its own.
pub const DEFAULT_MTU: u32 = 1420;

/// The environment variable that tells a background process to report readiness on its standard output.
pub const READY_ENV: &str = "TURBOTUN_WG_REPORT_READY";

/// Why the endpoint could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The device, a socket or the engine failed.
    #[error(transparent)]
    Turbotun(#[from] turbotun::Error),
    /// The configuration socket could not be made.
    #[error(transparent)]
    Uapi(#[from] UapiError),
    /// Starting the background process failed, or it reported an error.
    #[error("{0}")]
    Background(String),
}

/// How the endpoint ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ended {
    /// SIGINT or SIGTERM.
    Signal,
    /// The device was deleted (`wg-quick down`, `ip link del`).
    DeviceDeleted,
    /// The configuration socket file was removed.
    SocketRemoved,
}

/// How many peers a device may hold for the counters report to list each one's counters, unless told otherwise.
pub const DEFAULT_PEER_METRICS_LIMIT: usize = 100_000;

/// What [`run`] is given.
pub struct Options {
    /// The interface name, or a template such as `wg%d` that the kernel completes.
    pub name: String,
    /// Queues of the device (1: one; more: a multiqueue device with flow-hash steering), each with its own pair
    /// of workers and its own UDP socket on the one listen port.
    pub queues: usize,
    /// Become this user once the device and sockets are open.
    pub user: Option<Identity>,
    /// The counters, one set for every engine the endpoint runs (a port change starts another): keep a clone
    /// to read them while it runs.
    pub stats: TunnelStatsHandle,
    /// Where to serve the counters while it runs (`turbotun::stats_socket`); `None`: nowhere. A socket that
    /// cannot be made is a warning, not a failure.
    pub stats_socket: Option<PathBuf>,
    /// The counters report lists each peer's counters while the device holds at most this many peers
    /// ([`DEFAULT_PEER_METRICS_LIMIT`]; 0: never): a report of every peer of a million is some 150 MB, and its
    /// Prometheus text about a gigabyte.
    pub peer_metrics_limit: usize,
    /// Called once the endpoint is up, its privileges dropped (a thread started before would stop that).
    pub on_up: Option<Box<dyn Fn() + Send + Sync>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            name: String::new(),
            queues: 1,
            user: None,
            stats: TunnelStatsHandle::default(),
            stats_socket: None,
            peer_metrics_limit: DEFAULT_PEER_METRICS_LIMIT,
            on_up: None,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("name", &self.name)
            .field("queues", &self.queues)
            .field("user", &self.user)
            .field("stats_socket", &self.stats_socket)
            .finish_non_exhaustive()
    }
}

/// How a run of the endpoint went.
#[derive(Debug)]
pub struct Ran {
    /// The device's name (the kernel's completion of a template such as `wg%d`).
    pub name: String,
    /// Why it ended.
    pub ended: Ended,
    /// What the tunnel carried.
    pub stats: TunnelStats,
}

/// Runs the endpoint in this process until it ends (see the module documentation). With [`READY_ENV`] set,
/// prints `ready NAME` on standard output once up and then points standard output at `/dev/null`, for the
/// process that started it in the background; standard error, the log, stays where that process put it.
///
/// Two halves run side by side once the endpoint is up: the configuration server (`serve_configuration`, on a
/// thread of its own) and the engine loop (`run_engine`, on this thread), which the server hands new sockets
/// when a `set` moves the port.
pub fn run(options: &Options) -> Result<Ran, DaemonError> {
    turbotun::validate_ifname(&options.name)?;
    // Keys will be in this process's memory: no core dump and no ptrace or /proc/PID/mem access by processes of
    // the same user (only by those with CAP_SYS_PTRACE), before the first key arrives.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable).map_err(|e| {
        turbotun::Error::Io { context: "making the process non-dumpable (PR_SET_DUMPABLE)".into(), source: e.into() }
    })?;
    let stop = StopHandle::new();
    stop.stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let Endpoint { name, queues, uapi, wg, sockets } = open_endpoint(options)?;
    wg.set_name(&name);
    let stats_socket = bind_stats_socket(options, &name);
    // Sockets for the ports `wg` may ask for after the drop, given the owner that keeps a port group closed
    // while this process may (see `bind_sockets_with`); one socket is bound alone and needs none.
    let reserve = match (&options.user, queues.len() > 1) {
        (Some(_), true) => Some(Arc::new(SocketReserve::new(RESERVED_PORT_CHANGES * queues.len())?)),
        _ => None,
    };
    // Kept alive until this process ends, however it ends: see `turbotun::socket_keeper`.
    let _keeper = match &options.user {
        Some(identity) => Some(drop_privileges(identity, &uapi, stats_socket.as_ref())?),
        None => None,
    };
    let _stats_server = stats_socket.and_then(|socket| serve_stats(socket, options, &wg, &name));
    announce_up(options, &name, &wg, &uapi);

    let configuration = serve_configuration(uapi, wg.clone(), queues.len(), reserve, stop.clone())?;
    let socket_file = crate::uapi::socket_path(&name);
    let ended = run_engine(&wg, &queues, sockets, &configuration, &options.stats, &stop, &socket_file);
    configuration.finish();
    ended.map(|ended| Ran { name, ended, stats: options.stats.snapshot() })
}

/// What [`open_endpoint`] opens.
struct Endpoint {
    /// The device's name (the kernel's completion of a template such as `wg%d`).
    name: String,
    /// The device's queues.
    queues: Vec<Arc<Queue>>,
    /// The configuration socket, bound.
    uapi: UapiSocket,
    /// The protocol, with no configuration yet.
    wg: Arc<WireGuard>,
    /// The UDP sockets, one per queue, on a port picked by the kernel.
    sockets: Vec<TunnelSocket>,
}

/// Creates the TUN device, binds the configuration socket and the UDP sockets.
fn open_endpoint(options: &Options) -> Result<Endpoint, DaemonError> {
    let device = DeviceBuilder::tun()
        .name(&options.name)
        .vnet_hdr(turbotun::wire::VIRTIO_NET_HDR_LEN)
        .offloads(Offloads::ALL)
        .queues(options.queues)
        .open()?;
    // The name the kernel gave it (a template such as wg%d is completed): the socket and messages use it.
    let name = device.name().to_string();
    device.queues()[0].set_mtu(DEFAULT_MTU)?;
    let wg_mtu = DEFAULT_MTU as usize;
    let queues: Vec<Arc<Queue>> = device.into_queues().into_iter().map(Arc::new).collect();
    if queues.len() > 1 {
        // Loading the steering program needs a privilege that `--user` gives up: done here, before the drop, so
        // that each tunnel built later on these queues (a new port) finds the device steered.
        queues[0].steer_by_flow()?;
    }
    let uapi = UapiSocket::bind(&name)?;
    let wg = Arc::new(WireGuard::new());
    wg.set_mtu(wg_mtu);
    let sockets = bind_port(0, queues.len(), 0, None)?;
    wg.set_bound_port(sockets[0].local_addr()?.port());
    Ok(Endpoint { name, queues, uapi, wg, sockets })
}

/// The counters' socket, if one was asked for and could be bound (a warning otherwise). Bound while the process
/// may still write to its directory, answered once the privileges are dropped; named after the device's real
/// name, like the configuration socket (a template such as wg%d completed).
fn bind_stats_socket(options: &Options, name: &str) -> Option<StatsSocket> {
    let stats_path = options.stats_socket.as_ref().map(|path| match options.name == name {
        true => path.clone(),
        false => path.with_file_name(format!("{name}.stats")),
    });
    stats_path.as_deref().and_then(|path| match StatsSocket::bind(path) {
        Ok(socket) => Some(socket),
        Err(e) => {
            tracing::warn!("{}: counters not served: {e}", options.name);
            None
        }
    })
}

/// Starts the socket keeper for the sockets bound so far, then becomes `identity`; returns the keeper.
fn drop_privileges(
    identity: &Identity,
    uapi: &UapiSocket,
    stats_socket: Option<&StatsSocket>,
) -> Result<std::process::Child, DaemonError> {
    let mut owned = vec![(uapi.path().to_path_buf(), uapi.inode())];
    owned.extend(stats_socket.map(|s| (s.path().to_path_buf(), s.inode())));
    let keeper = start_socket_keeper(&owned)?;
    drop_to(identity)?;
    tracing::info!("running as {identity}, no capabilities, no_new_privs");
    Ok(keeper)
}

/// Serves the counters on `socket` (a warning if it cannot).
fn serve_stats(socket: StatsSocket, options: &Options, wg: &Arc<WireGuard>, name: &str) -> Option<StatsServer> {
    let (stats, wg, device, start) = (options.stats.clone(), wg.clone(), name.to_string(), Instant::now());
    let limit = options.peer_metrics_limit;
    let report = move || {
        let seconds = start.elapsed().as_secs_f64();
        let snapshot = stats.snapshot();
        let mut report =
            Report::of_tunnel("wireguard", turbotun::Engine::KeyedTunnel, &device, "wireguard", &snapshot, seconds)
                .with_tunnel_queues(&stats.queue_snapshots());
        let peers = wg.peer_count();
        if peers <= limit {
            report.peers = wg.peer_counters();
        } else {
            let why = format!("off ({peers} peers, more than --peer-metrics-limit {limit})");
            report.settings.push(("peer_metrics".into(), why));
        }
        report
    };
    match socket.serve(report) {
        Ok(server) => Some(server),
        Err(e) => {
            tracing::warn!("{name}: counters not served: {e}");
            None
        }
    }
}

/// Says that the endpoint is up: `ready NAME` to the process that started it in the background (see
/// [`READY_ENV`]), or a line on standard error; then calls `options.on_up`.
fn announce_up(options: &Options, name: &str, wg: &WireGuard, uapi: &UapiSocket) {
    let up = format!("{name} up, UDP port {}, configuration socket {}", wg.bound_port(), uapi.path().display());
    if std::env::var_os(READY_ENV).is_some() {
        println!("ready {name}");
        detach_stdout();
        tracing::info!("{up}");
    } else {
        eprintln!("turbotun wg: {up}");
    }
    if let Some(on_up) = &options.on_up {
        on_up();
    }
}

/// The configuration socket served on a thread of its own, and what it hands the engine loop.
struct ConfigurationServer {
    thread: std::thread::JoinHandle<()>,
    /// Stops the server (the endpoint's own stop is not it: the server also outlives an engine that ended).
    stop: StopHandle,
    /// The sockets of a new port, bound by a `set` that moved it: the engine loop runs a new engine on them.
    rebinds: mpsc::Receiver<Vec<TunnelSocket>>,
    /// The sockets of the engine running now, whose mark a `set` of a new firewall mark changes.
    in_use: Arc<Mutex<Vec<Arc<TunnelSocket>>>>,
}

impl ConfigurationServer {
    /// The sockets of the engine that runs from now on.
    fn use_sockets(&self, sockets: Vec<Arc<TunnelSocket>>) {
        *self.in_use.lock().unwrap_or_else(|e| e.into_inner()) = sockets;
    }

    /// Stops the server and waits for its thread.
    fn finish(self) {
        self.stop.stop();
        let _ = self.thread.join();
    }
}

/// Serves `uapi` on a thread of its own until [`ConfigurationServer::finish`]: a set that moves the port binds
/// `queue_count` new sockets, which [`run_engine`] hands to a new engine; one that changes the mark sets it on
/// the sockets in use. If the socket file is removed, the server ends and fires `stop`.
fn serve_configuration(
    uapi: UapiSocket,
    wg: Arc<WireGuard>,
    queue_count: usize,
    reserve: Option<Arc<SocketReserve>>,
    stop: StopHandle,
) -> Result<ConfigurationServer, DaemonError> {
    let in_use: Arc<Mutex<Vec<Arc<TunnelSocket>>>> = Arc::new(Mutex::new(Vec::new()));
    let (rebind_tx, rebinds) = mpsc::channel::<Vec<TunnelSocket>>();
    let server_stop = StopHandle::new();
    let (current, uapi_stop) = (in_use.clone(), server_stop.clone());
    let thread = std::thread::Builder::new()
        .name("wg-uapi".into())
        .spawn(move || {
            let mut on_set = |old: &DeviceConfig, new: &DeviceConfig| {
                // A port asked for is bound anew unless the sockets hold it already (a port picked at start and
                // then asked for by number, as `wg syncconf` does): they hold it alone, so binding it again would
                // fail with EADDRINUSE.
                if new.listen_port != old.listen_port && new.listen_port != wg.bound_port() {
                    let sockets =
                        bind_port(new.listen_port, queue_count, new.fwmark, reserve.as_deref()).map_err(|e| {
                            tracing::warn!("listen-port {}: {e}", new.listen_port);
                            errno_of(&e)
                        })?;
                    let port = sockets[0].local_addr().map_err(|e| errno_of(&e))?.port();
                    wg.set_bound_port(port);
                    let _ = rebind_tx.send(sockets);
                } else if new.fwmark != old.fwmark {
                    for socket in current.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                        socket.set_mark(new.fwmark).map_err(|e| errno_of(&e))?;
                    }
                }
                Ok(())
            };
            let served = uapi.serve(&wg, &mut on_set, &uapi_stop);
            let gone = !uapi.still_there();
            drop(uapi);
            if let Err(e) = served {
                tracing::warn!("configuration socket: {e}");
            }
            if gone {
                stop.stop();
            }
        })
        .map_err(|e| turbotun::Error::Io { context: "spawning the configuration thread".into(), source: e })?;
    Ok(ConfigurationServer { thread, stop: server_stop, rebinds, in_use })
}

/// Runs the tunnel engine until the endpoint ends: on `sockets`, then on each set of sockets the configuration
/// server binds for a new port. Between packets it follows the device's MTU (which wg-quick sets after the
/// endpoint started) and watches for the end: `stop` (a signal, or the server finding its socket file gone), the
/// engine ending (the device deleted, or an error), or `socket_file` removed.
fn run_engine(
    wg: &Arc<WireGuard>,
    queues: &[Arc<Queue>],
    mut sockets: Vec<TunnelSocket>,
    configuration: &ConfigurationServer,
    stats: &TunnelStatsHandle,
    stop: &StopHandle,
    socket_file: &Path,
) -> Result<Ended, DaemonError> {
    loop {
        let engine_stop = StopHandle::new();
        let tunnel = TunnelBuilder::new(wg.clone())
            .sockets(sockets)
            .stop_on(engine_stop.clone())
            .count_into(stats.clone())
            .build(queues.to_vec())?;
        configuration.use_sockets(tunnel.sockets());
        let engine = std::thread::Builder::new()
            .name("wg-engine".into())
            .spawn(move || tunnel.run())
            .map_err(|e| turbotun::Error::Io { context: "spawning the engine".into(), source: e })?;
        let next = watch_engine(&engine, wg, &queues[0], configuration, stop, socket_file);
        engine_stop.stop();
        let result = engine.join().unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            Err(turbotun::Error::WorkerPanicked { worker: "the engine".into(), message })
        });
        match next {
            Some(new) => sockets = new,
            None => {
                return match result {
                    Err(e) if e.is_device_gone() => Ok(Ended::DeviceDeleted),
                    Err(e) => Err(DaemonError::from(e)),
                    Ok(_) if !socket_file.exists() => Ok(Ended::SocketRemoved),
                    Ok(_) => Ok(Ended::Signal),
                };
            }
        }
    }
}

/// Waits while `engine` runs: returns the sockets of a new port when the configuration server bound some, or
/// `None` when the endpoint ends (see [`run_engine`]). Once a second it sets the device's MTU (`queue`'s) as the
/// protocol's, so that padding stays within it.
fn watch_engine(
    engine: &std::thread::JoinHandle<turbotun::Result<TunnelStats>>,
    wg: &WireGuard,
    queue: &Queue,
    configuration: &ConfigurationServer,
    stop: &StopHandle,
    socket_file: &Path,
) -> Option<Vec<TunnelSocket>> {
    let mut last_look = Instant::now();
    loop {
        if stop.is_stopped() {
            return None;
        }
        if engine.is_finished() {
            return None;
        }
        match configuration.rebinds.recv_timeout(Duration::from_millis(100)) {
            Ok(new) => return Some(new),
            Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {}
        }
        if last_look.elapsed() >= Duration::from_secs(1) {
            last_look = Instant::now();
            // Padding stays within the MTU, which wg-quick sets after the endpoint started.
            if let Ok(mtu) = queue.mtu() {
                wg.set_mtu(mtu as usize);
            }
            if !socket_file.exists() {
                return None;
            }
        }
    }
}

/// Port changes a multi-queue endpoint run with `--user` can make: the sockets for them are made before the drop.
const RESERVED_PORT_CHANGES: usize = 8;

/// `count` sockets on `port` (0: any) for IPv6 and IPv4 alike, with `mark`; a group's from `reserve` if given.
fn bind_port(
    port: u16,
    count: usize,
    mark: u32,
    reserve: Option<&SocketReserve>,
) -> turbotun::Result<Vec<TunnelSocket>> {
    let options = SocketOptions { dual_stack: true, mark, ..SocketOptions::default() };
    match bind_sockets_with(SocketAddr::from(([0u16; 8], port)), count, &options, reserve) {
        Ok(sockets) => Ok(sockets),
        // A kernel without IPv6: IPv4 alone.
        Err(turbotun::Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            bind_sockets_with(SocketAddr::from(([0, 0, 0, 0], port)), count, &options, reserve)
        }
        Err(e) => Err(e),
    }
}

/// The errno a refused configuration is answered with.
fn errno_of(e: &turbotun::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// Standard output to `/dev/null`: the pipe to the starting process, which has read `ready` and returned.
fn detach_stdout() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(&null);
    }
}

/// What a background process that could not start writes on its standard output in place of `ready`: this
/// prefix, then its error on one line.
pub const START_ERROR_PREFIX: &str = "error: ";

/// Starts `program args` (this program in the foreground mode of the endpoint) in the background, in a process
/// group of its own, and returns once it reports that it is up: its process id and the device's name; the error
/// it reported otherwise (see [`START_ERROR_PREFIX`]). With `keep_log`, its standard error, the log, is this
/// process's; otherwise `/dev/null`.
pub fn start_in_background(program: &PathBuf, args: &[String], keep_log: bool) -> Result<(u32, String), DaemonError> {
    let mut child = Command::new(program)
        .args(args)
        .env(READY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(if keep_log { Stdio::inherit() } else { Stdio::null() })
        .process_group(0)
        .spawn()
        .map_err(|e| DaemonError::Background(format!("starting {}: {e}", program.display())))?;
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
    }
    if let Some(name) = line.trim().strip_prefix("ready ") {
        return Ok((child.id(), name.to_string()));
    }
    let status =
        child.wait().map_err(|e| DaemonError::Background(format!("waiting for the background process: {e}")))?;
    Err(DaemonError::Background(match line.trim().strip_prefix(START_ERROR_PREFIX) {
        Some(error) => error.to_string(),
        None => format!("the background process ended ({status})"),
    }))
}
