//! The endpoint as `turbotun wg NAME` runs it, following WireGuard's cross-platform userspace interface: create
//! the TUN device NAME, serve `/var/run/wireguard/NAME.sock`, run the tunnel engine through the WireGuard
//! transform, and stop on SIGINT/SIGTERM, when the device is deleted (`wg-quick down`) or when the socket file is
//! removed, removing the socket.
//!
//! Without `-f` the command starts itself again in the background and returns once the device and the socket
//! are up (what `wg-quick up` waits for): the background process reports "ready" (or its error) over a pipe.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use turbotun::privilege::{drop_to, Identity};
use turbotun::socket_keeper::start_socket_keeper;
use turbotun::stats_socket::{Report, StatsServer, StatsSocket};
use turbotun::tunnel::{TunnelStats, TunnelStatsHandle};
use turbotun::udp::SocketReserve;
use turbotun::{DeviceBuilder, Offloads, StopHandle};

use crate::endpoint::{self, bind_port, Endpoint, EndpointError};
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
    /// The endpoint could not be built.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
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
/// It is an [`Endpoint`] built on the device it creates, with the configuration socket served on a thread of its
/// own as one more user of the endpoint's [`Control`](crate::Control).
pub fn run(options: &Options) -> Result<Ran, DaemonError> {
    turbotun::validate_ifname(&options.name)?;
    // Keys will be in this process's memory: no core dump and no ptrace or /proc/PID/mem access by processes of
    // the same user (only by those with CAP_SYS_PTRACE), before the first key arrives.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable).map_err(|e| {
        turbotun::Error::Io { context: "making the process non-dumpable (PR_SET_DUMPABLE)".into(), source: e.into() }
    })?;
    let stop = StopHandle::new();
    stop.stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let device = DeviceBuilder::tun()
        .name(&options.name)
        .vnet_hdr(turbotun::wire::VIRTIO_NET_HDR_LEN)
        .offloads(Offloads::ALL)
        .queues(options.queues)
        .open()?;
    // The name the kernel gave it (a template such as wg%d is completed): the socket and messages use it.
    let name = device.name().to_string();
    device.queues()[0].set_mtu(DEFAULT_MTU)?;
    let uapi = UapiSocket::bind(&name)?;
    // Sockets for the ports `wg` may ask for after the drop, given the owner that keeps a port group closed
    // while this process may (see `turbotun::tunnel::bind_sockets_with`); one socket is bound alone and needs
    // none.
    let reserve = match (&options.user, options.queues > 1) {
        (Some(_), true) => Some(Arc::new(SocketReserve::new(RESERVED_PORT_CHANGES * options.queues)?)),
        _ => None,
    };
    // The first sockets are bound alone; the reserve is for the ports asked for later.
    let first = bind_port(0, options.queues, 0, None)?;
    let endpoint = Endpoint::builder()
        .device(device)
        .sockets(first)
        .socket_factory(move |port, count, mark| bind_port(port, count, mark, reserve.as_deref()))
        .stats(options.stats.clone())
        .stop_on(stop.clone())
        .build()?;
    let control = endpoint.control();
    let stats_socket = bind_stats_socket(options, &name);
    // Kept alive until this process ends, however it ends: see `turbotun::socket_keeper`.
    let _keeper = match &options.user {
        Some(identity) => Some(drop_privileges(identity, &uapi, stats_socket.as_ref())?),
        None => None,
    };
    let _stats_server = stats_socket.and_then(|socket| serve_stats(socket, options, control.wg(), &name));
    announce_up(options, &name, control.wg(), &uapi);

    let configuration = serve_configuration(uapi, &control, stop.clone())?;
    let socket_file = crate::uapi::socket_path(&name);
    let ran = endpoint.run();
    configuration.finish();
    let ran = ran?;
    let ended = match ran.ended {
        endpoint::Ended::DeviceDeleted => Ended::DeviceDeleted,
        _ if !socket_file.exists() => Ended::SocketRemoved,
        _ => Ended::Signal,
    };
    Ok(Ran { name, ended, stats: ran.stats })
}

/// The counters' socket, if one was asked for and could be bound (a warning otherwise). Bound while the process
/// may still write to its directory, answered once the privileges are dropped; named after the device's real
/// name, like the configuration socket (a template such as wg%d completed).
fn bind_stats_socket(options: &Options, name: &str) -> Option<StatsSocket> {
    let stats_path = options.stats_socket.as_ref().map(|path| match options.name == name {
        true => path.clone(),
        // The template's place in the file name taken by the real name (`wg%d@blue.stats` -> `wg0@blue.stats`).
        false => {
            let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            let rest = file.strip_prefix(options.name.as_str()).unwrap_or(".stats");
            path.with_file_name(format!("{name}{rest}"))
        }
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
) -> Result<turbotun::socket_keeper::SocketKeeper, DaemonError> {
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

/// The configuration socket served on a thread of its own.
struct ConfigurationServer {
    thread: std::thread::JoinHandle<()>,
    /// Stops the server (the endpoint's own stop is not it: the server also outlives an engine that ended).
    stop: StopHandle,
}

impl ConfigurationServer {
    /// Stops the server and waits for its thread.
    fn finish(self) {
        self.stop.stop();
        let _ = self.thread.join();
    }
}

/// Serves `uapi` on a thread of its own until [`ConfigurationServer::finish`], each `set=1` a change through
/// `control` (a port that moves binds new sockets, which the endpoint runs a new engine on). If the socket file
/// is removed, the server ends and fires `stop`.
fn serve_configuration(
    uapi: UapiSocket,
    control: &crate::Control,
    stop: StopHandle,
) -> Result<ConfigurationServer, DaemonError> {
    let server_stop = StopHandle::new();
    let (configurator, uapi_stop) = (control.configurator.clone(), server_stop.clone());
    let thread = std::thread::Builder::new()
        .name("wg-uapi".into())
        .spawn(move || {
            let served = uapi.serve(&configurator, &uapi_stop);
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
    Ok(ConfigurationServer { thread, stop: server_stop })
}

/// Port changes a multi-queue endpoint run with `--user` can make: the sockets for them are made before the drop.
const RESERVED_PORT_CHANGES: usize = 8;

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
