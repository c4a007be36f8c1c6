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
//! - **Guest to TAP.** Each transmit chain is copied out of guest memory with vm-memory's checked reads and
//!   written to the TAP behind the guest's own virtio header (the TAP's header is `virtio_net_hdr_v1`, 12 bytes),
//!   so a guest's TSO super-packet reaches the kernel whole. The header is checked first as the kernel checks
//!   a write ([`turbotun_wire::VirtioNetHdrRepr::check_sent_frame`]) and against what was negotiated. Copying
//!   first means the header the kernel sees is the one that was checked: the guest cannot change it in between.
//! - **TAP to guest.** Frames (super-packets up to 64 KiB with their header) are read from the TAP and written
//!   into the guest's receive buffers, across as many as it takes with `MRG_RXBUF` (`num_buffers` set). When the
//!   guest has no buffers, the frame waits and the TAP is not read until the guest adds some.
//! - **Faults.** A chain outside guest memory, one that loops, one of the wrong direction
//!   ([`DropReason::BadDescriptor`](crate::DropReason)), a header the kernel would refuse or the guest did not
//!   negotiate (`Malformed`), a frame too long (`TooBig`): the frame is dropped and counted, the buffer given back,
//!   the ring goes on. Nothing a guest writes can panic the backend or make it read outside the guest's memory.
//! - **Sleeping.** One worker thread per queue pair sleeps in `epoll` on the guest's kick eventfds and on the
//!   TAP's fd (edge-triggered: it is read until empty, or until the guest has no buffers), never polling.
//!
//! One queue pair is served; a multiqueue TAP is not used yet.
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
#[cfg(feature = "vhost-user-frontend")]
pub mod frontend;

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
use crate::devices::stop::StopHandle;
use crate::error::{Error, Result};
use backend::{GuestMem, NetBackend, TAP_EVENT, TAP_VNET_HDR};

/// The virtio header size the TAP must be opened with: `virtio_net_hdr_v1` (12 bytes), which has the
/// `num_buffers` field the guest's mergeable receive buffers need.
pub const VNET_HDR_LEN: usize = TAP_VNET_HDR;

/// What a backend moved, for as long as it serves (all connections together).
#[derive(Debug, Default)]
pub struct VhostUserStats {
    to_tap: SharedCounters,
    to_guest: SharedCounters,
    connections: AtomicU64,
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
    /// Front ends served (connections accepted).
    pub connections: u64,
}

impl VhostUserStats {
    /// The counters as they are now (a connection's are added as its worker handles events, and at its end).
    pub fn snapshot(&self) -> VhostUserCounters {
        VhostUserCounters {
            to_tap: self.to_tap.snapshot(),
            to_guest: self.to_guest.snapshot(),
            connections: self.connections.load(Ordering::Relaxed),
        }
    }
}

/// A vhost-user-net backend listening on a Unix socket, for one TAP queue.
#[derive(Debug)]
pub struct VhostUserServer {
    listener: UnixListener,
    path: PathBuf,
    /// The socket file's inode: removed at the end only if it is still the one bound here.
    inode: u64,
    tap: Arc<Queue>,
    features: u64,
    stats: Arc<VhostUserStats>,
}

impl VhostUserServer {
    /// Binds the socket at `path` for `tap`, which must be a TAP queue with the 12-byte virtio header
    /// ([`VNET_HDR_LEN`]) and no packet information header; it is switched to non-blocking reads. A stale socket
    /// at `path` is replaced; one a running process answers on is refused ([`Error::SocketInUse`]).
    pub fn bind(path: impl AsRef<Path>, tap: Queue) -> Result<VhostUserServer> {
        let path = path.as_ref();
        let name = tap.name().to_string();
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
                needs: format!("a vhost-user-net backend needs the {VNET_HDR_LEN}-byte one (vnet_hdr({VNET_HDR_LEN}))"),
            });
        }
        tap.set_nonblocking(true)?;
        // USO is offered to the guest only where this TAP takes it (Linux 6.2+).
        let uso = tap.set_offloads(Offloads::CSUM | Offloads::USO4 | Offloads::USO6).is_ok();
        tap.set_offloads(Offloads::NONE)?;
        crate::configuration::local_socket::clear_stale_socket(path, "choose another socket path")?;
        let io_error = |what: &str, e: std::io::Error| Error::io(format!("{what} {}", path.display()), e);
        let listener = UnixListener::bind(path).map_err(|e| io_error("binding", e))?;
        let inode = std::fs::symlink_metadata(path).map_err(|e| io_error("reading", e))?.ino();
        Ok(VhostUserServer {
            listener,
            path: path.to_path_buf(),
            inode,
            tap: Arc::new(tap),
            features: backend::offered_features(uso),
            stats: Arc::default(),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The TAP device's name.
    pub fn tap_name(&self) -> &str {
        self.tap.name()
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
            if crate::devices::stop::wait_or_stop(
                self.listener.as_fd(),
                rustix::event::PollFlags::IN,
                Some(stop),
                None,
            )? {
                break;
            }
        }
        let mem = GuestMem::new(GuestMemoryMmap::new());
        let backend = Arc::new(NetBackend::new(self.tap.clone(), self.features, mem.clone(), self.stats.clone()));
        let mut daemon = VhostUserDaemon::new("vhost-user-net".into(), backend.clone(), mem)
            .map_err(|e| daemon_error("starting the backend", e))?;
        // The TAP's frames wake the queue pair's worker; edge-triggered, since a frame the guest has no buffer
        // for stays in the TAP until the guest kicks its receive queue.
        for handler in daemon.get_epoll_handlers() {
            handler
                .register_listener(backend.tap_fd(), EventSet::IN | EventSet::EDGE_TRIGGERED, u64::from(TAP_EVENT))
                .map_err(|e| Error::io("watching the TAP in the worker", e))?;
        }
        let mut listener = Listener::from(
            self.listener.try_clone().map_err(|e| Error::io(format!("sharing {}", self.path.display()), e))?,
        );
        // The listener is readable, so this accepts at once.
        daemon.start(&mut listener).map_err(|e| daemon_error("accepting a front end", e))?;
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        tracing::info!(socket = %self.path.display(), tap = self.tap.name(), "front end connected");

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
        // Dropping the daemon ends and joins the worker, so that the counters below are final.
        drop(daemon);
        backend.finish();
        match result {
            Ok(())
            | Err(DaemonError::HandleRequest(ProtocolError::Disconnected))
            | Err(DaemonError::HandleRequest(ProtocolError::PartialMessage)) => {
                tracing::info!(socket = %self.path.display(), "front end disconnected")
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
