//! A vhost-user-net backend (feature `vhost-user`): a virtual machine's network device served from this
//! process onto a TAP device, with the guest's checksum and segmentation offloads carried end to end.
//!
//! A VM monitor (QEMU, cloud-hypervisor, crosvm) or DPDK's virtio-user connects to a Unix socket and hands over
//! the guest's memory and virtqueues (the vhost-user protocol); [`VhostUserServer`] serves one front end at a
//! time and the next after a disconnect. The rust-vmm crates do the protocol (`vhost`, `vhost-user-backend`),
//! the memory map (`vm-memory`) and the split rings (`virtio-queue`); this module is the virtio-net device:
//!
//! - **Features.** Offered: `VERSION_1`, `CSUM`/`GUEST_CSUM`, TSO4/6 and ECN both ways, UFO both ways, USO both
//!   ways where the kernel takes `TUN_F_USO` (6.2+), `MRG_RXBUF`, `EVENT_IDX`, `INDIRECT_DESC`. Whatever the guest
//!   acknowledges becomes the TAP's offloads ([`crate::Offloads::for_guest_features`]), again on every
//!   `SET_FEATURES` and back to none on a reset or a disconnect.
//! - **Guest to TAP.** Each transmit chain is written to the TAP with one gathered write, behind the guest's own
//!   virtio header (the TAP's header is `virtio_net_hdr_v1`, 12 bytes), so a guest's TSO super-packet reaches the
//!   kernel whole. The header is copied out of guest memory and checked as the kernel checks a write
//!   ([`turbotun_wire::VirtioNetHdrRepr::check_sent_frame`]) and against what was negotiated; the write takes
//!   that copy, so the header the kernel sees is the one that was checked. A frame of up to 2 KiB is copied out
//!   behind it (cheaper than gathering it); a longer one, a super-packet, is written from guest memory where it
//!   lies (pieces vm-memory checked against the map), without a copy: a guest that changes its bytes meanwhile
//!   only changes what it sends. A super-packet in more than 63 pieces is copied too.
//! - **TAP to guest.** Frames (super-packets up to 64 KiB with their header) are read from the TAP and written
//!   into the guest's receive buffers, across as many as it takes with `MRG_RXBUF` (`num_buffers` set). When the
//!   guest has no buffers, the frame waits and the TAP is not read until the guest adds some.
//! - **Faults.** A chain outside guest memory, one that loops, one of the wrong direction
//!   ([`DropReason::BadDescriptor`](crate::DropReason)), a header the kernel would refuse or the guest did not
//!   negotiate (`Malformed`), a frame too long (`TooBig`): the frame is dropped and counted, the buffer given back,
//!   the ring goes on. Nothing a guest writes can panic the backend or make it read outside the guest's memory.
//! - **Sleeping.** One worker thread per queue pair sleeps in `epoll` on the guest's kick eventfds and on its
//!   TAP queue's fd (edge-triggered: it is read until empty, or until the guest has no buffers), never polling.
//! - **Queue pairs.** [`VhostUserServer::bind_queues`] takes a multiqueue TAP's queues, one per pair, and offers
//!   `VIRTIO_NET_F_MQ`; the front end's control queue picks how many pairs the guest uses. Pair `i` is served by
//!   its own worker on TAP queue `i`, which the kernel steers frames to (by flow) only while the guest has that
//!   pair's receive ring enabled: the other TAP queues are detached, so no frame waits where no guest reads.
//!
//! `vhost_user::frontend` (feature `vhost-user-frontend`) is the other end: a front end that plays the guest
//! over memfd memory, for tests and benchmarks (`turbotun bench --vhost-user`).
//!
//! ```no_run
//! use turbotun::vhost_user::VhostUserServer;
//! use turbotun::{DeviceBuilder, StopHandle};
//!
//! # fn main() -> turbotun::Result<()> {
//! let tap = DeviceBuilder::tap().name("vm0").vnet_hdr(12).open()?.into_queues().remove(0);
//! let server = VhostUserServer::bind("/run/vm0.sock", tap)?;
//! let stop = StopHandle::new();
//! stop.stop_on_signals(&[libc::SIGINT, libc::SIGTERM])?;
//! server.serve(&stop)?;
//! println!("{:?}", server.stats().snapshot());
//! # Ok(())
//! # }
//! ```

mod backend;
mod chain;
mod features;
#[cfg(feature = "vhost-user-frontend")]
pub mod frontend;
mod relay;

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vhost::vhost_user::{Error as ProtocolError, Listener};
use vhost_user_backend::{Error as DaemonError, VhostUserDaemon};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EventSet;

use crate::dataplane::stats::{Counters, SharedCounters};
use crate::devices::mode::Mode;
use crate::devices::offloads::Offloads;
use crate::devices::queue::Queue;
use crate::error::{ConfigError, Error, Result};
use crate::stop::StopHandle;
/// The queue pairs a backend offers a guest, at most.
pub use backend::MAX_QUEUE_PAIRS;
use backend::{GuestMem, NetBackend, TapQueue, TAP_VNET_HDR};

/// The virtio header size the TAP must be opened with: `virtio_net_hdr_v1` (12 bytes), which has the
/// `num_buffers` field the guest's mergeable receive buffers need.
pub const VNET_HDR_LEN: usize = TAP_VNET_HDR;

/// What a backend moved, for as long as it serves (all connections together), by queue pair; the totals are
/// their sum.
#[derive(Debug, Default)]
pub struct VhostUserStats {
    connections: AtomicU64,
    /// Each queue pair's own `to_tap` and `to_guest`.
    pairs: Vec<(SharedCounters, SharedCounters)>,
}

/// A snapshot of [`VhostUserStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct VhostUserCounters {
    /// Guest to TAP: `reads` are transmit chains taken from the guest, `packets` frames written to the TAP
    /// (a super-packet once), and the drops by reason.
    pub to_tap: Counters,
    /// TAP to guest: `reads` are frames read from the TAP, `packets` frames placed in the guest's buffers.
    pub to_guest: Counters,
    /// Front ends served (connections accepted); 0 in a queue pair's snapshot.
    pub connections: u64,
}

impl VhostUserStats {
    fn with_queue_pairs(pairs: usize) -> VhostUserStats {
        VhostUserStats { pairs: (0..pairs).map(|_| Default::default()).collect(), ..VhostUserStats::default() }
    }

    /// The counters as they are now (a connection's are added as its worker handles events, and at its end).
    pub fn snapshot(&self) -> VhostUserCounters {
        let mut total =
            VhostUserCounters { connections: self.connections.load(Ordering::Relaxed), ..Default::default() };
        for pair in self.pair_snapshots() {
            total.to_tap.add(&pair.to_tap);
            total.to_guest.add(&pair.to_guest);
        }
        total
    }

    /// Each queue pair's counters, in order: which pairs the guest uses, and how evenly the kernel's steering
    /// and the guest's spread its flows over them.
    pub fn pair_snapshots(&self) -> Vec<VhostUserCounters> {
        self.pairs
            .iter()
            .map(|(to_tap, to_guest)| VhostUserCounters {
                to_tap: to_tap.snapshot(),
                to_guest: to_guest.snapshot(),
                connections: 0,
            })
            .collect()
    }

    /// Adds what queue pair `pair` moved since its last report.
    pub(crate) fn add(&self, pair: usize, to_tap: &Counters, to_guest: &Counters) {
        if let Some((pair_to_tap, pair_to_guest)) = self.pairs.get(pair) {
            pair_to_tap.add(to_tap);
            pair_to_guest.add(to_guest);
        }
    }
}

/// A vhost-user-net backend listening on a Unix socket, for a TAP's queues (one per queue pair).
#[derive(Debug)]
pub struct VhostUserServer {
    listener: UnixListener,
    path: PathBuf,
    /// The socket file's inode: removed at the end only if it is still the one bound here.
    inode: u64,
    taps: Vec<Arc<TapQueue>>,
    features: u64,
    stats: Arc<VhostUserStats>,
}

impl VhostUserServer {
    /// Binds the socket at `path` for `tap`, which must be a TAP queue with the 12-byte virtio header
    /// ([`VNET_HDR_LEN`]) and no packet information header; it is switched to non-blocking reads. A stale socket
    /// at `path` is replaced; one a running process answers on is refused ([`Error::SocketInUse`]).
    pub fn bind(path: impl AsRef<Path>, tap: Queue) -> Result<VhostUserServer> {
        Self::bind_queues(path, vec![tap])
    }

    /// Binds the socket at `path` for the queues of one multiqueue TAP, one per queue pair offered to the guest
    /// (at most 16), each as [`VhostUserServer::bind`] requires. Queue pair `i` is served by its own worker
    /// thread on `queues[i]`.
    pub fn bind_queues(path: impl AsRef<Path>, queues: Vec<Queue>) -> Result<VhostUserServer> {
        let path = path.as_ref();
        let Some(first) = queues.first() else {
            return Err(Error::Config(ConfigError::NoQueue {
                needs: "a vhost-user-net backend needs at least one TAP queue",
            }));
        };
        if queues.len() > MAX_QUEUE_PAIRS {
            return Err(Error::Config(ConfigError::QueueCount {
                why: format!(
                    "{} TAP queues: a vhost-user-net backend serves at most {MAX_QUEUE_PAIRS} queue pairs",
                    queues.len()
                ),
            }));
        }
        let first_name = first.name().to_string();
        for tap in &queues {
            let name = tap.name().to_string();
            if name != first_name {
                return Err(Error::Config(ConfigError::Devices {
                    why: format!(
                        "queues of {first_name} and {name}: a backend's queue pairs are the queues of one TAP"
                    ),
                }));
            }
            if tap.mode() != Mode::Tap {
                return Err(Error::NotTap { name, what: "vhost-user-net backends" });
            }
            if tap.packet_info() {
                return Err(Error::PacketInfo { name, user: "a vhost-user-net backend" });
            }
            if tap.vnet_hdr_len() != VNET_HDR_LEN {
                return Err(Error::VnetHdrMismatch {
                    name,
                    has: tap.vnet_hdr_len(),
                    needs: format!(
                        "a vhost-user-net backend needs the {VNET_HDR_LEN}-byte one (vnet_hdr({VNET_HDR_LEN}))"
                    ),
                });
            }
            tap.set_nonblocking(true)?;
        }
        // USO is offered to the guest only where this TAP takes it (Linux 6.2+).
        let uso = first.set_offloads(Offloads::CSUM | Offloads::USO4 | Offloads::USO6).is_ok();
        first.set_offloads(Offloads::NONE)?;
        crate::configuration::local_socket::clear_stale_socket(path, "choose another socket path")?;
        let io_error = |what: &str, e: std::io::Error| Error::io(format!("{what} {}", path.display()), e);
        let listener = UnixListener::bind(path).map_err(|e| io_error("binding", e))?;
        let inode = std::fs::symlink_metadata(path).map_err(|e| io_error("reading", e))?.ino();
        Ok(VhostUserServer {
            listener,
            path: path.to_path_buf(),
            inode,
            features: features::offered_features(uso, queues.len()),
            stats: Arc::new(VhostUserStats::with_queue_pairs(queues.len())),
            taps: queues.into_iter().map(|queue| Arc::new(TapQueue::new(queue))).collect(),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The TAP device's name.
    pub fn tap_name(&self) -> &str {
        self.taps[0].queue.name()
    }

    /// Queue pairs offered to front ends (one per TAP queue).
    pub fn queue_pairs(&self) -> usize {
        self.taps.len()
    }

    /// The virtio feature bits offered to front ends.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// The counters, shared: read them at any time, also while serving.
    pub fn stats(&self) -> Arc<VhostUserStats> {
        self.stats.clone()
    }

    /// Serves front ends one after the other until `stop` fires (a disconnect is followed by the next
    /// connection: a VM monitor that restarts reconnects).
    pub fn serve(&self, stop: &StopHandle) -> Result<()> {
        while self.serve_one(stop)? {}
        Ok(())
    }

    /// Waits for one front end and serves it until it disconnects or `stop` fires; false once stopped. A front
    /// end that breaks the protocol ends its own connection (logged), not the server.
    pub fn serve_one(&self, stop: &StopHandle) -> Result<bool> {
        loop {
            if stop.is_stopped() {
                return Ok(false);
            }
            // False also when a signal ended the wait: the flag above tells a stop from another signal.
            if crate::stop::wait_or_stop(self.listener.as_fd(), rustix::event::PollFlags::IN, Some(stop), None)? {
                break;
            }
        }
        let mem = GuestMem::new(GuestMemoryMmap::new());
        let backend = Arc::new(NetBackend::new(&self.taps, self.features, mem.clone(), self.stats.clone()));
        let mut daemon = VhostUserDaemon::new("vhost-user-net".into(), backend.clone(), mem)
            .map_err(|e| daemon_error("starting the backend", e))?;
        // The TAP's frames wake the queue pair's worker; edge-triggered, since a frame the guest has no buffer
        // for stays in the TAP until the guest kicks its receive queue.
        // Worker thread `i` (handler `i`) serves pair `i` and sleeps on TAP queue `i`.
        for (handler, tap_fd) in daemon.get_epoll_handlers().iter().zip(backend.tap_fds()) {
            handler
                .register_listener(tap_fd, EventSet::IN | EventSet::EDGE_TRIGGERED, u64::from(backend.tap_event()))
                .map_err(|e| Error::io("watching the TAP in the worker", e))?;
        }
        // The listener is readable, so this accepts at once; the handler is given the connection through the
        // relay (see relay.rs: an order of messages QEMU uses that the handler would refuse).
        let (front, _) =
            self.listener.accept().map_err(|e| Error::io(format!("accepting on {}", self.path.display()), e))?;
        // Said at the default level, as DPDK's backend says it: who connected, and (below) what it moved.
        let front_end = match crate::sys::peer_credentials(std::os::fd::AsFd::as_fd(&front)) {
            Ok((pid, uid, _)) if pid > 0 => {
                let pid = pid.unsigned_abs();
                format!("front end pid {pid} (uid {uid}, {})", crate::devices::inspect::process_command(pid))
            }
            Ok((_, uid, _)) => format!("a front end (uid {uid})"),
            Err(_) => "a front end".to_string(),
        };
        let (relay_end, handler_listener) =
            relay::handler_listener().map_err(|e| Error::io("making the vhost-user relay", e))?;
        daemon.start(&mut Listener::from(handler_listener)).map_err(|e| daemon_error("accepting a front end", e))?;
        let relay = relay::Relay::start(front, relay_end).map_err(|e| Error::io("starting the vhost-user relay", e))?;
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        let pairs = self.taps.len();
        let before = self.stats.snapshot();
        tracing::info!(
            "{}: {front_end} connected on {}, {pairs} queue pair(s) offered",
            self.tap_name(),
            self.path.display()
        );

        // A stop ends the connection from outside: the protocol thread is blocked reading the socket.
        let ended = StopHandle::new();
        let watcher = {
            let (stop, ended, shutdown) = (stop.clone(), ended.clone(), daemon.shutdown_handle());
            std::thread::Builder::new()
                .name("vhost-user-stop".into())
                .spawn(move || {
                    wait_either(&stop, &ended);
                    if stop.is_stopped() {
                        if let Some(shutdown) = shutdown {
                            shutdown.shutdown();
                        }
                    }
                })
                .map_err(|e| Error::io("spawning the stop watcher", e))?
        };
        let result = daemon.wait();
        ended.stop();
        let _ = watcher.join();
        // The handler's end is shut: the relay shuts the front end's and ends.
        relay.join();
        // Dropping the daemon ends and joins the worker, so that the counters below are final.
        drop(daemon);
        backend.finish();
        match result {
            Ok(())
            | Err(DaemonError::HandleRequest(ProtocolError::Disconnected))
            | Err(DaemonError::HandleRequest(ProtocolError::PartialMessage)) => {
                let after = self.stats.snapshot();
                let (to_tap, to_guest) =
                    (after.to_tap.packets - before.to_tap.packets, after.to_guest.packets - before.to_guest.packets);
                let drops = after.to_tap.drops.total() + after.to_guest.drops.total()
                    - before.to_tap.drops.total()
                    - before.to_guest.drops.total();
                tracing::info!(
                    "{}: {front_end} disconnected: {to_tap} frames to the TAP, {to_guest} to the guest, {drops} dropped",
                    self.tap_name()
                )
            }
            Err(_) if stop.is_stopped() => {}
            Err(e) => tracing::warn!(socket = %self.path.display(), "front end dropped: {e}"),
        }
        Ok(!stop.is_stopped())
    }
}

impl Drop for VhostUserServer {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn daemon_error(what: &str, e: DaemonError) -> Error {
    Error::io(format!("vhost-user: {what}"), std::io::Error::other(e.to_string()))
}

/// Sleeps until either handle fires.
fn wait_either(a: &StopHandle, b: &StopHandle) {
    use rustix::event::{poll, PollFd, PollFlags};
    let (Ok(fa), Ok(fb)) = (a.wake_fd(), b.wake_fd()) else {
        tracing::warn!("no wake fd: a stop does not end the connection until the front end leaves");
        return;
    };
    while !(a.is_stopped() || b.is_stopped()) {
        let mut fds = [PollFd::new(&fa, PollFlags::IN), PollFd::new(&fb, PollFlags::IN)];
        let _ = poll(&mut fds, None);
    }
}
