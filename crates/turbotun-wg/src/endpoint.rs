//! A whole WireGuard endpoint built in code: a TUN device (queues the program opened, or received from a
//! privileged opener), UDP sockets (bound here, made by the host, or made by the host's function), the
//! configuration as typed values, then [`Endpoint::run`] until its stop handle fires or the device goes.
//! `turbotun wg` is this endpoint with WireGuard's configuration socket in front of it.
//!
//! ```no_run
//! use turbotun::{DeviceBuilder, Offloads, StopHandle};
//! use turbotun_wg::{Endpoint, PeerUpdate};
//!
//! let device = DeviceBuilder::tun().name("wg0").vnet_hdr(turbotun::wire::VIRTIO_NET_HDR_LEN).offloads(Offloads::ALL).open()?;
//! let stop = StopHandle::new();
//! let endpoint = Endpoint::builder()
//!     .device(device)
//!     .private_key([1; 32])
//!     .listen_port(51820)
//!     .peer(PeerUpdate::new([2; 32]).endpoint("192.0.2.2:51820".parse()?).allowed_ip("10.0.0.2/32".parse()?))
//!     .stop_on(stop.clone())
//!     .build()?;
//! let control = endpoint.control(); // configure and watch it from any thread
//! let ended = endpoint.run()?; // until `stop.stop()`, or the device is deleted
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use turbotun::tunnel::{bind_sockets_with, TunnelBuilder, TunnelStats, TunnelStatsHandle};
use turbotun::udp::{SocketOptions, SocketReserve, TunnelSocket};
use turbotun::{Device, Queue, StopHandle};

use crate::config::{DeviceConfig, Key};
use crate::control::{Configurator, Control};
use crate::uapi::set::ConfigError;
use crate::update::{Op, PeerUpdate, Update};
use crate::wireguard::WireGuard;

/// The MTU assumed for padding when the device's cannot be read (wireguard-go's default).
const FALLBACK_MTU: u32 = 1420;

/// Makes `count` UDP sockets on one `port` (0: any free one) with firewall mark `mark`, one per queue: what a
/// host gives an endpoint so that a configuration may move the port, and so that it binds them its own way
/// (to an interface, with a mark, "protected" from its own VPN).
pub type SocketFactory = dyn Fn(u16, usize, u32) -> turbotun::Result<Vec<TunnelSocket>> + Send + Sync;

/// Why an endpoint could not be built or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The device, a socket or the engine failed.
    #[error(transparent)]
    Turbotun(#[from] turbotun::Error),
    /// The configuration it was built with was refused (nothing of it is in force).
    #[error("configuration refused: {0}")]
    Config(#[from] ConfigError),
    /// What it was given does not make an endpoint.
    #[error("{0}")]
    Invalid(String),
}

/// How a run of the endpoint ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ended {
    /// Its stop handle fired.
    Stopped,
    /// The device was deleted (`ip link del`, `wg-quick down`).
    DeviceDeleted,
}

/// What [`Endpoint::run`] returns: how it ended and what the tunnel carried.
#[derive(Debug)]
pub struct Ran {
    /// How it ended.
    pub ended: Ended,
    /// The tunnel's counters at the end.
    pub stats: TunnelStats,
}

/// Builds an [`Endpoint`]: see [`Endpoint::builder`].
#[must_use]
pub struct EndpointBuilder {
    queues: Vec<Queue>,
    name: Option<String>,
    /// The sockets to start on (none: made by `factory`).
    sockets: Option<Vec<TunnelSocket>>,
    /// What makes sockets (none given: bound here on any address, IPv6 and IPv4, or IPv4 alone on a kernel
    /// without IPv6, unless sockets were given, which are then fixed).
    factory: Option<Arc<SocketFactory>>,
    update: Update,
    stats: TunnelStatsHandle,
    stop: StopHandle,
    log: Option<tracing::Dispatch>,
}

impl std::fmt::Debug for EndpointBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointBuilder").field("queues", &self.queues.len()).field("name", &self.name).finish()
    }
}

impl EndpointBuilder {
    /// The TUN device to run on, all its queues (one pair of workers and one socket each).
    pub fn device(mut self, device: Device) -> Self {
        self.name = Some(device.name().to_string());
        self.queues = device.into_queues();
        self
    }

    /// The queues to run on: those of one TUN device, opened here or received from another process
    /// (`turbotun::handover`, `Queue::from_fd`). Two or more are steered by flow when built (which needs
    /// CAP_NET_ADMIN or CAP_BPF until built).
    pub fn queues(mut self, queues: Vec<Queue>) -> Self {
        self.name = queues.first().map(|q| q.name().to_string());
        self.queues = queues;
        self
    }

    /// Starts on these UDP sockets, one per queue, bound by the host to one port. Without a
    /// [`Self::socket_factory`] a configuration that moves the port is then refused (EOPNOTSUPP), since no other
    /// sockets can be made.
    pub fn sockets(mut self, sockets: Vec<TunnelSocket>) -> Self {
        self.sockets = Some(sockets);
        self
    }

    /// Makes its sockets with `factory` (`port`, `count`, `mark`): at build unless [`Self::sockets`] were
    /// given, and whenever a configuration moves the port.
    pub fn socket_factory(
        mut self,
        factory: impl Fn(u16, usize, u32) -> turbotun::Result<Vec<TunnelSocket>> + Send + Sync + 'static,
    ) -> Self {
        self.factory = Some(Arc::new(factory));
        self
    }

    /// The device's private key.
    pub fn private_key(mut self, key: Key) -> Self {
        self.update = self.update.private_key(key);
        self
    }

    /// The UDP port to listen on (0, the default: any free one; [`Control::listen_port`] says which).
    pub fn listen_port(mut self, port: u16) -> Self {
        self.update = self.update.listen_port(port);
        self
    }

    /// A peer.
    pub fn peer(mut self, peer: PeerUpdate) -> Self {
        self.update = self.update.peer(peer);
        self
    }

    /// Any configuration, after what was given so far (the whole of it is applied at build, all or nothing).
    pub fn configure(mut self, update: Update) -> Self {
        self.update = self.update.and(update);
        self
    }

    /// Counts into `stats` (keep a clone to read them while it runs).
    pub fn stats(mut self, stats: TunnelStatsHandle) -> Self {
        self.stats = stats;
        self
    }

    /// Runs until `stop` fires.
    pub fn stop_on(mut self, stop: StopHandle) -> Self {
        self.stop = stop;
        self
    }

    /// Logs to `dispatch` (a `tracing` subscriber of the host's) rather than to the process's default: every
    /// thread of the endpoint logs there. Its lines about peers start with the device's name, as
    /// wireguard-go's do.
    pub fn log_to(mut self, dispatch: tracing::Dispatch) -> Self {
        self.log = Some(dispatch);
        self
    }

    /// Opens what is left to open (the sockets, the steering of several queues) and puts the configuration in
    /// force: an endpoint ready to [`Endpoint::run`].
    pub fn build(self) -> Result<Endpoint, EndpointError> {
        let EndpointBuilder { queues, name, sockets, factory, update, stats, stop, log } = self;
        if queues.is_empty() {
            return Err(EndpointError::Invalid("an endpoint needs a device or its queues".into()));
        }
        let name = name.unwrap_or_default();
        let wg = Arc::new(WireGuard::new());
        wg.set_name(&name);
        wg.set_mtu(queues[0].mtu().unwrap_or(FALLBACK_MTU) as usize);
        if queues.len() > 1 {
            // Needs a privilege a host may drop later: done here, so that each engine run on these queues (one
            // per port) finds the device steered.
            queues[0].steer_by_flow()?;
        }
        let queues: Vec<Arc<Queue>> = queues.into_iter().map(Arc::new).collect();
        // The sockets are made with the port and mark the configuration asks for, so that putting it in force
        // moves nothing.
        let port = update.ops().filter_map(|op| if let Op::ListenPort(port) = op { Some(*port) } else { None }).last();
        let mark = update.ops().filter_map(|op| if let Op::Fwmark(mark) = op { Some(*mark) } else { None }).last();
        let factory: Option<Arc<SocketFactory>> = match (&sockets, factory) {
            (_, Some(factory)) => Some(factory),
            (Some(_), None) => None,
            (None, None) => Some(Arc::new(|port, count, mark| bind_port(port, count, mark, None))),
        };
        let first = match sockets {
            Some(given) if given.len() != queues.len() => {
                let (n, q) = (given.len(), queues.len());
                return Err(EndpointError::Invalid(format!("{n} sockets for {q} queues: give one socket per queue")));
            }
            Some(given) => {
                for socket in given.iter().filter(|_| mark.is_some()) {
                    socket.set_mark(mark.unwrap_or(0))?;
                }
                given
            }
            None => {
                // Made above whenever no sockets were given.
                let make = factory.as_ref().ok_or_else(|| EndpointError::Invalid("no sockets".into()))?;
                make(port.unwrap_or(0), queues.len(), mark.unwrap_or(0))?
            }
        };
        let bound = first[0].local_addr()?.port();
        wg.set_bound_port(bound);
        let (rebind_tx, rebinds) = mpsc::channel();
        let in_use: Arc<Mutex<Vec<Arc<TunnelSocket>>>> = Arc::default();
        let on_set = port_keeper(wg.clone(), factory, queues.len(), rebind_tx, in_use.clone());
        let control = Control::new(Arc::new(Configurator::new(wg.clone(), on_set)));
        control.configure(update)?;
        Ok(Endpoint { control, wg, queues, sockets: first, stats, stop, log, rebinds, in_use })
    }
}

/// What checks a change's new settings: a port that moves binds new sockets (handed to the engine loop through
/// `rebinds`), a mark that changes is set on the sockets in use.
fn port_keeper(
    wg: Arc<WireGuard>,
    factory: Option<Arc<SocketFactory>>,
    count: usize,
    rebinds: mpsc::Sender<Vec<TunnelSocket>>,
    in_use: Arc<Mutex<Vec<Arc<TunnelSocket>>>>,
) -> Box<crate::control::OnSet> {
    Box::new(move |old: &DeviceConfig, new: &DeviceConfig| {
        // A port asked for is bound anew unless the sockets hold it already (a port picked at start and then
        // asked for by number, as `wg syncconf` does): they hold it alone, so binding it again would fail.
        if new.listen_port != old.listen_port && new.listen_port != wg.bound_port() {
            let Some(factory) = &factory else {
                return Err((
                    libc::EOPNOTSUPP,
                    "the host's sockets are fixed (the endpoint has no socket factory)".into(),
                ));
            };
            let sockets = factory(new.listen_port, count, new.fwmark).map_err(|e| refusal(&e, new.listen_port))?;
            let port = sockets[0].local_addr().map_err(|e| refusal(&e, new.listen_port))?.port();
            wg.set_bound_port(port);
            let _ = rebinds.send(sockets);
        } else if new.fwmark != old.fwmark {
            for socket in in_use.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                socket.set_mark(new.fwmark).map_err(|e| (errno_of(&e), e.to_string()))?;
            }
        }
        Ok(())
    })
}

/// Why binding `port` failed, in words that name the fix: a port below 1024 refused (EACCES) needs
/// CAP_NET_BIND_SERVICE, which an endpoint that dropped its privileges no longer has.
fn refusal(e: &turbotun::Error, port: u16) -> (i32, String) {
    let errno = errno_of(e);
    match errno == libc::EACCES && port < 1024 {
        true => (errno, format!("{e}: a port below 1024 needs CAP_NET_BIND_SERVICE, which this process does not have (it runs with --user, or unprivileged); give a port from 1024")),
        false => (errno, e.to_string()),
    }
}

/// A WireGuard endpoint ready to run: see the module documentation.
pub struct Endpoint {
    control: Control,
    wg: Arc<WireGuard>,
    queues: Vec<Arc<Queue>>,
    sockets: Vec<TunnelSocket>,
    stats: TunnelStatsHandle,
    stop: StopHandle,
    log: Option<tracing::Dispatch>,
    /// The sockets of a new port, bound by a change that moved it: the engine loop runs a new engine on them.
    rebinds: mpsc::Receiver<Vec<TunnelSocket>>,
    /// The sockets of the engine running now, whose mark a change of the firewall mark sets.
    in_use: Arc<Mutex<Vec<Arc<TunnelSocket>>>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("wg", &self.wg).field("queues", &self.queues.len()).finish()
    }
}

impl Endpoint {
    /// A builder: give it the device (or its queues), optionally sockets or a way to make them, and the
    /// configuration.
    pub fn builder() -> EndpointBuilder {
        EndpointBuilder {
            queues: Vec::new(),
            name: None,
            sockets: None,
            factory: None,
            update: Update::new(),
            stats: TunnelStatsHandle::default(),
            stop: StopHandle::new(),
            log: None,
        }
    }

    /// Configures and watches it, before and while it runs.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// What stops it.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// The device's name (empty for queues of a device whose name was not known).
    pub fn name(&self) -> String {
        self.queues[0].name().to_string()
    }

    /// Runs the tunnel engine on this thread until the stop handle fires or the device is deleted (an error
    /// otherwise). A change that moves the port runs a new engine on the new sockets; the device's MTU is
    /// followed once a second (padding stays within it).
    pub fn run(self) -> Result<Ran, EndpointError> {
        match self.log.clone() {
            Some(dispatch) => tracing::dispatcher::with_default(&dispatch, || self.run_engines()),
            None => self.run_engines(),
        }
    }

    fn run_engines(self) -> Result<Ran, EndpointError> {
        let Endpoint { wg, queues, mut sockets, stats, stop, rebinds, in_use, .. } = self;
        loop {
            let engine_stop = StopHandle::new();
            let tunnel = TunnelBuilder::new(wg.clone())
                .sockets(sockets)
                .stop_on(engine_stop.clone())
                .count_into(stats.clone())
                .build(queues.to_vec())?;
            *in_use.lock().unwrap_or_else(|e| e.into_inner()) = tunnel.sockets();
            let dispatch = tracing::dispatcher::get_default(|d| d.clone());
            let engine = std::thread::Builder::new()
                .name("wg-engine".into())
                .spawn(move || tracing::dispatcher::with_default(&dispatch, || tunnel.run()))
                .map_err(|e| turbotun::Error::Io { context: "spawning the engine".into(), source: e })?;
            let next = watch_engine(&engine, &wg, &queues[0], &rebinds, &stop);
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
                    let ended = match result {
                        Err(e) if e.is_device_gone() => Ended::DeviceDeleted,
                        Err(e) => return Err(e.into()),
                        Ok(_) => Ended::Stopped,
                    };
                    return Ok(Ran { ended, stats: stats.snapshot() });
                }
            }
        }
    }
}

/// Waits while `engine` runs: returns the sockets of a new port when a change bound some, or `None` when the
/// endpoint ends. Once a second it takes the device's MTU (`queue`'s) as the protocol's.
fn watch_engine(
    engine: &std::thread::JoinHandle<turbotun::Result<TunnelStats>>,
    wg: &WireGuard,
    queue: &Queue,
    rebinds: &mpsc::Receiver<Vec<TunnelSocket>>,
    stop: &StopHandle,
) -> Option<Vec<TunnelSocket>> {
    let mut last_look = Instant::now();
    loop {
        if stop.is_stopped() || engine.is_finished() {
            return None;
        }
        match rebinds.recv_timeout(Duration::from_millis(100)) {
            Ok(new) => return Some(new),
            Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {}
        }
        if last_look.elapsed() >= Duration::from_secs(1) {
            last_look = Instant::now();
            // Padding stays within the MTU, which wg-quick sets after the endpoint started.
            if let Ok(mtu) = queue.mtu() {
                wg.set_mtu(mtu as usize);
            }
        }
    }
}

/// `count` sockets on `port` (0: any) for IPv6 and IPv4 alike, with `mark`; a group's from `reserve` if given
/// (see `turbotun::udp::SocketReserve`).
pub(crate) fn bind_port(
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
