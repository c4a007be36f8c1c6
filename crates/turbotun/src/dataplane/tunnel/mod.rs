//! The tunnel engine: packets between a TUN (or TAP) device and UDP, with segmentation offload on both sides.
//!
//! - **Into the network**: a receive half reads super-packets from each queue and splits them into MTU-sized
//!   packets (zero copy where it can), each behind and before the room the [`Transform`] asked for
//!   ([`Transform::seal_room`]); the batch is given to the transform ([`Transform::seal_batch`]), which seals each
//!   packet where it is, grown into that room, or into a buffer of its own ([`Transform::seal`]); runs of equal-size datagrams to one destination leave as one segmented send, and a batch's sends
//!   as one `sendmmsg` ([`crate::udp`]).
//! - **Out of the network**: `recvmmsg` with `UDP_GRO` reads many datagrams per call, split by their segment
//!   size; each is opened by the transform, its ECN field updated from the outer header (RFC 6040), and the
//!   packets are coalesced (GRO) and written to the queue with the virtio header by a send half.
//! - One worker per direction and queue, each queue with its own socket on one port (the group of
//!   [`bind_sockets`]), so that one flow stays on one worker and in order. A transform with timers gets a thread
//!   that ticks them.
//! - Every packet read and every datagram received is written or counted: [`TunnelStats`] holds one
//!   [`Counters`] per direction with drops by [`DropReason`], the tunnel's own reasons included. A packet the
//!   transform has nowhere to send ([`Sealed::Unreachable`]) is answered with an ICMP error on the device.
//! - Replies leave from the local address each remote contacted (see [`crate::udp`]), recorded only once a
//!   datagram from it authenticated: one the transform opened, or a message the transform's own worker
//!   authenticated ([`Transform::reply_sources`]). Nothing unauthenticated chooses where replies leave from.
//!
//! [`Plain`] is the transform of an unencrypted tunnel: the packet is the datagram. A protocol with keys and a
//! handshake (WireGuard, in the `turbotun-wg` crate) implements [`Transform`] the same way.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::dataplane::stats::{Counters, DropReason, Drops, SharedCounters};
use crate::dataplane::threads::{run_workers, Worker};
use crate::dataplane::udp::{LocalAddr, ReplySources, SocketOptions, SocketReserve, TunnelSocket};
use crate::devices::queue::Queue;
use crate::error::{ConfigError, Error, Result};
use crate::stop::StopHandle;

mod seal;
mod unreachable;
mod workers;

pub use seal::{PacketRoom, Room, SealBatch, SealOut};

use unreachable::Unreachables;

/// What happens to each packet on its way into and out of a tunnel. Shared by every worker (`&self`): a
/// transform with state per peer keeps its own locks.
pub trait Transform: Send + Sync + 'static {
    /// How many bytes a sealed datagram may be longer than its packet (header, tag, padding): the engine
    /// sizes the buffers given to [`Self::seal`] with it. A transform that seals in place says 0.
    fn overhead(&self) -> usize;

    /// Seals one packet read from the device. `packet` may be changed in place; `out` has room for the packet
    /// plus [`Self::overhead`]. `control` sends the protocol's own datagrams at once (e.g. a handshake this
    /// packet started).
    fn seal(&self, packet: &mut [u8], out: &mut [u8], control: &mut dyn FnMut(&[u8], SocketAddr)) -> Sealed;

    /// The room [`Self::seal_batch`] wants around each packet in the tunnel's own buffers, to seal it there
    /// ([`Sealed::Grown`]). The default asks for none.
    fn seal_room(&self) -> Room {
        Room::default()
    }

    /// Seals a batch of packets read from the device, answering each with [`SealBatch::set`] (a packet left
    /// unanswered is counted as a `malformed` drop). The engine calls this, once per batch; the default seals
    /// each packet with [`Self::seal`], so a transform that works packet by packet implements only that. A
    /// transform that gains from a whole batch (WireGuard: one route look-up and one counter step per run of
    /// packets to one peer) overrides it, and may seal each packet where it is, grown into the room
    /// [`Self::seal_room`] asked for.
    fn seal_batch(&self, batch: &mut SealBatch<'_, '_>, control: &mut dyn FnMut(&[u8], SocketAddr)) {
        for i in 0..batch.len() {
            let (packet, out) = batch.packet_and_out(i);
            let sealed = self.seal(packet, out, control);
            batch.set(i, sealed);
        }
    }

    /// Opens one datagram from `from`, which reached local address `to` (`None` on a socket bound to one
    /// address): the packet inside stays in the datagram ([`Opened::InPlace`], no copy) or goes to the start of
    /// `out` ([`Opened::Packet`]; `out` holds any packet a datagram can carry). `control` sends the protocol's
    /// own datagrams at once (a handshake response, packets that waited for the handshake).
    ///
    /// A datagram answered [`Opened::Packet`], [`Opened::InPlace`] or [`Opened::Control`] has authenticated:
    /// replies to `from` leave from `to` from then on. One handed to the transform's own worker
    /// ([`Opened::Queued`]) changes nothing until that worker records it ([`Self::reply_sources`]).
    fn open(
        &self,
        datagram: &mut [u8],
        from: SocketAddr,
        to: Option<LocalAddr>,
        out: &mut [u8],
        control: &mut dyn FnMut(&[u8], SocketAddr),
    ) -> Opened;

    /// Given, before the workers start, the table of where replies to each remote leave from, for a transform
    /// that authenticates datagrams on a worker of its own ([`Opened::Queued`]): it records a sender there (the
    /// `from` and `to` [`Self::open`] was given) once that sender's message authenticated, before it answers.
    /// The default keeps nothing.
    fn reply_sources(&self, _sources: ReplySources) {}

    /// Called by a receiving worker once it opened a batch of datagrams, from the frame it called [`Self::open`]
    /// from: a transform whose primitives leave secrets in the stack frames they used (an AEAD's key in its
    /// state) overwrites them here, once a batch rather than once a datagram. The default does nothing.
    fn opened_batch(&self) {}

    /// How often [`Self::tick`] wants to run (`None`: never).
    fn tick_interval(&self) -> Option<Duration> {
        None
    }

    /// A file descriptor that becomes readable when the transform has work for [`Self::tick`] before its next
    /// interval (WireGuard: handshake messages [`Self::open`] handed over, so that key work runs on the timer
    /// thread and never on a data worker). [`Self::tick`] clears it.
    fn work_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// Runs the protocol's timers (retransmitted handshakes, keepalives) and the work [`Self::work_fd`] announced,
    /// sending through `control`; returns the packets it gave up on (held for a handshake that never completed),
    /// by reason.
    fn tick(&self, _control: &mut dyn FnMut(&[u8], SocketAddr)) -> Drops {
        Drops::default()
    }

    /// Called once when the tunnel stops, after the last [`Self::tick`]: the packets the transform still keeps
    /// (held for a handshake that did not complete in time) are given up and returned by reason (`stopped`), so
    /// that every packet read from the device is counted once, in the device's direction.
    fn give_up(&self) -> Drops {
        Drops::default()
    }

    /// What became of the datagrams [`Self::open`] answered [`Opened::Queued`] for, since the last call: how many
    /// the transform's own worker handled as its own (counted as `control`) and refused, by reason. With
    /// `stopping`, those still waiting are counted too (as `stopped`), so that every datagram read is counted
    /// once. Called by the tunnel's timer thread after each [`Self::tick`] and once when it stops.
    fn settled(&self, _stopping: bool) -> Settled {
        Settled::default()
    }

    /// Whether what [`Self::open`] hands out was authenticated end to end (its checksums then need no second
    /// look before packets are coalesced, as the kernel's own WireGuard marks them).
    fn authenticates(&self) -> bool {
        false
    }

    /// Whether packets cross with their TCP/UDP checksums partial (the pseudo-header sum, see
    /// `turbotun_wire::partial`): the sending end leaves the segments it splits partial, the receiving end has
    /// its kernel complete every packet it writes (`NEEDS_CSUM`), so that neither sums a payload byte, as the
    /// kernel's own UDP tunnels offload the inner checksum. Only for a protocol whose both ends are this engine,
    /// and whose datagrams carry a UDP checksum of their own (it covers the packet on the way).
    fn partial_checksums(&self) -> bool {
        false
    }
}

/// What [`Transform::seal`] did with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sealed {
    /// The packet itself (as it is now) is the datagram, for `to`.
    InPlace {
        /// Where it goes.
        to: SocketAddr,
    },
    /// The datagram is `out[..len]`, for `to`.
    Out {
        /// Its length.
        len: usize,
        /// Where it goes.
        to: SocketAddr,
    },
    /// The packet was sealed where it is, grown into its room: the datagram is `buf[start..start + len]` of the
    /// packet's [`PacketRoom`] ([`SealBatch::room`]), for `to`. Only from [`Transform::seal_batch`].
    Grown {
        /// Where it starts in the packet's room.
        start: usize,
        /// Its length.
        len: usize,
        /// Where it goes.
        to: SocketAddr,
    },
    /// The transform keeps the packet until it can be sent (a handshake under way); counted as `held`.
    Held,
    /// Not sent, for this reason.
    Dropped(DropReason),
    /// Not sent for this reason, and its sender is told: counted as a drop, and answered with an ICMP
    /// "destination unreachable" written back to the device (rate-limited; see `tunnel/unreachable.rs` for what
    /// is never answered and where the error comes from). For a packet no route of the protocol takes, as the
    /// kernel's WireGuard answers a packet no peer's AllowedIPs cover. The transform leaves the packet as it was.
    Unreachable(DropReason),
}

/// What [`Transform::open`] made of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// A packet for the device: `out[..len]`.
    Packet {
        /// Its length.
        len: usize,
    },
    /// A packet for the device, opened where it arrived: `datagram[start..start + len]`. The engine may use the
    /// `start` bytes in front of it (the virtio header goes there, when it fits; otherwise the packet is copied).
    InPlace {
        /// Where it starts in the datagram.
        start: usize,
        /// Its length.
        len: usize,
    },
    /// One of the protocol's own datagrams (handshake, keepalive, cookie), handled; counted as `control`.
    Control,
    /// Handed to the transform's own worker (WireGuard: a handshake message, whose key work never runs on a
    /// data worker); counted when the transform reports it through [`Transform::settled`].
    Queued,
    /// Not a packet for the device, for this reason.
    Dropped(DropReason),
}

/// What became of datagrams a transform took to its own worker ([`Transform::settled`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Handled as the protocol's own (a handshake taken, a cookie reply sent): counted as `control`.
    pub control: u64,
    /// Refused, by reason.
    pub drops: Drops,
}

/// The transform of a tunnel without encryption: the packet (or frame, on TAP) is the UDP payload, sent to one
/// remote address and taken only from that address.
#[derive(Debug, Clone, Copy)]
pub struct Plain {
    remote: SocketAddr,
    ethernet: bool,
}

impl Plain {
    /// IP packets (a TUN device) to and from `remote`.
    pub fn new(remote: SocketAddr) -> Self {
        Plain { remote, ethernet: false }
    }

    /// Ethernet frames (a TAP device) to and from `remote`.
    pub fn ethernet(remote: SocketAddr) -> Self {
        Plain { remote, ethernet: true }
    }
}

impl Transform for Plain {
    fn overhead(&self) -> usize {
        0
    }

    fn partial_checksums(&self) -> bool {
        true
    }

    fn seal(&self, _packet: &mut [u8], _out: &mut [u8], _control: &mut dyn FnMut(&[u8], SocketAddr)) -> Sealed {
        Sealed::InPlace { to: self.remote }
    }

    fn open(
        &self,
        datagram: &mut [u8],
        from: SocketAddr,
        _to: Option<LocalAddr>,
        out: &mut [u8],
        _control: &mut dyn FnMut(&[u8], SocketAddr),
    ) -> Opened {
        if from != self.remote {
            return Opened::Dropped(DropReason::Unauthenticated);
        }
        let looks_right = if self.ethernet {
            datagram.len() >= turbotun_wire::ethernet::HEADER_LEN
        } else {
            matches!(datagram.first().map(|b| b >> 4), Some(4 | 6))
        };
        if !looks_right {
            return Opened::Dropped(DropReason::MalformedDatagram);
        }
        match out.get_mut(..datagram.len()) {
            Some(room) => {
                room.copy_from_slice(datagram);
                Opened::Packet { len: datagram.len() }
            }
            None => Opened::Dropped(DropReason::TooBig),
        }
    }
}

/// A snapshot of a tunnel's counters, one [`Counters`] per direction.
///
/// Into the network: `reads`, `super_packets`, `segments` count what was read from the device; `packets`,
/// `bytes` the datagrams sent; `writes` the system calls that sent them; `held` what the transform kept for
/// later. Out of the network: `reads` counts receive calls, `segments` the datagrams received; `packets`,
/// `bytes`, `writes`, `coalesced` what was written to the device. `control` counts the protocol's own datagrams
/// both ways.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct TunnelStats {
    /// From the device into the network.
    pub to_network: Counters,
    /// From the network to the device.
    pub from_network: Counters,
}

/// The live counters of a tunnel: clone it before [`Tunnel::run`] and read it during or after the run.
///
/// Besides the tunnel's counters it keeps each queue's own ([`Self::queue_snapshots`]): what that queue's two
/// workers counted. The timer thread belongs to no queue, so the queues' counters add up to the tunnel's less
/// what it counted (the protocol's datagrams it sent, the handshake messages it settled).
#[derive(Debug, Clone, Default)]
pub struct TunnelStatsHandle {
    directions: Arc<[SharedCounters; 2]>,
    /// By queue number; a tunnel that replaces another on the same handle counts on into the same queues.
    queues: Arc<Mutex<Vec<Arc<[SharedCounters; 2]>>>>,
}

impl TunnelStatsHandle {
    /// The counters as they are now (workers add theirs after every batch).
    pub fn snapshot(&self) -> TunnelStats {
        TunnelStats { to_network: self.directions[0].snapshot(), from_network: self.directions[1].snapshot() }
    }

    /// Each queue's counters as they are now, by queue number (empty before a tunnel ran on this handle).
    pub fn queue_snapshots(&self) -> Vec<TunnelStats> {
        let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues.iter().map(|q| TunnelStats { to_network: q[0].snapshot(), from_network: q[1].snapshot() }).collect()
    }

    /// The counters of queue `i` (made on first use).
    fn queue(&self, i: usize) -> Arc<[SharedCounters; 2]> {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        while queues.len() <= i {
            queues.push(Arc::default());
        }
        queues[i].clone()
    }

    fn device_to_network(&self) -> &SharedCounters {
        &self.directions[0]
    }

    fn network_to_device(&self) -> &SharedCounters {
        &self.directions[1]
    }
}

/// Sets a tunnel up: its transform, its sockets (bound here, or given), its stop handle.
#[derive(Debug)]
pub struct TunnelBuilder<T: Transform> {
    transform: Arc<T>,
    local: Option<SocketAddr>,
    sockets: Vec<TunnelSocket>,
    options: SocketOptions,
    stop: StopHandle,
    stats: TunnelStatsHandle,
}

impl<T: Transform> TunnelBuilder<T> {
    /// A tunnel through `transform`.
    pub fn new(transform: Arc<T>) -> Self {
        TunnelBuilder {
            transform,
            local: None,
            sockets: Vec::new(),
            options: SocketOptions::default(),
            stop: StopHandle::new(),
            stats: TunnelStatsHandle::default(),
        }
    }

    /// Counts into `stats` (default: counters of its own): a program that replaces a tunnel with another (new
    /// sockets after a port change) keeps one set of counters across them, served while it runs.
    pub fn count_into(mut self, stats: TunnelStatsHandle) -> Self {
        self.stats = stats;
        self
    }

    /// The local UDP address: one socket per queue is bound to it (port 0: one port picked for all).
    pub fn bind(mut self, local: SocketAddr) -> Self {
        self.local = Some(local);
        self
    }

    /// Socket options for the sockets [`Self::bind`] makes (segmentation both ways by default).
    pub fn socket_options(mut self, options: SocketOptions) -> Self {
        self.options = options;
        self
    }

    /// Sockets bound elsewhere (e.g. before privileges were dropped), one per queue, instead of [`Self::bind`].
    pub fn sockets(mut self, sockets: Vec<TunnelSocket>) -> Self {
        self.sockets = sockets;
        self
    }

    /// The tunnel stops when `stop` fires (default: a handle of its own, [`Tunnel::stop_handle`]).
    pub fn stop_on(mut self, stop: StopHandle) -> Self {
        self.stop = stop;
        self
    }

    /// The tunnel over `queues` (one worker pair each), ready to run. Puts the queues and sockets in blocking
    /// mode: a worker sleeps in its read (one system call per batch, none to wait), and is woken at the end
    /// with the wake-up signal (see [`crate::wake`]), whose handler is installed here.
    pub fn build<Q: Into<Arc<Queue>>>(self, queues: Vec<Q>) -> Result<Tunnel<T>> {
        let queues: Vec<Arc<Queue>> = queues.into_iter().map(Into::into).collect();
        if queues.is_empty() {
            return Err(Error::Config(ConfigError::NoQueue { needs: "a tunnel needs at least one queue" }));
        }
        for q in &queues {
            if q.packet_info() {
                return Err(Error::PacketInfo { name: q.name().to_string(), user: "the tunnel" });
            }
            q.set_nonblocking(false)?;
        }
        crate::dataplane::wake::prepare()?;
        if queues.len() > 1 {
            // One flow to one queue (and so one worker and one socket): its packets stay in order.
            queues[0].steer_by_flow()?;
        }
        let sockets = if !self.sockets.is_empty() {
            if self.sockets.len() != queues.len() {
                return Err(Error::Config(ConfigError::QueueCount {
                    why: format!(
                        "{} sockets for {} queues: the tunnel needs one per queue",
                        self.sockets.len(),
                        queues.len()
                    ),
                }));
            }
            self.sockets
        } else {
            let local = self.local.ok_or_else(|| {
                Error::Config(ConfigError::Conflict {
                    why: "a tunnel needs a local address (bind) or sockets of its own".into(),
                })
            })?;
            bind_sockets(local, queues.len(), &self.options)?
        };
        let mut sockets = sockets;
        if let Some((first, rest)) = sockets.split_first_mut() {
            // One table of reply sources for all the queues' sockets, however they were bound.
            for socket in rest {
                socket.share_sources_with(first);
            }
        }
        for socket in &sockets {
            socket.set_blocking(true)?;
        }
        // Errors for packets the transform has nowhere to send go back into an IP device; its route socket is
        // opened here, in the namespace the device was opened in.
        let unreachables = (queues[0].mode() == crate::devices::mode::Mode::Tun)
            .then(|| Arc::new(Unreachables::new(queues[0].name())));
        Ok(Tunnel {
            queues,
            sockets: sockets.into_iter().map(Arc::new).collect(),
            transform: self.transform,
            stop: self.stop,
            stats: self.stats,
            unreachables,
        })
    }
}

/// `count` sockets on `local` (one per queue of a tunnel), the one rule for a tunnel's port: a UDP port is one
/// endpoint's alone, as the kernel's WireGuard and wireguard-go hold theirs.
///
/// - One socket: bound without `SO_REUSEPORT`; anyone else's bind of the port fails with `EADDRINUSE`.
/// - Several: the first is bound alone, which proves the port free (`EADDRINUSE` if any socket holds it, one
///   that shares it included), picking it when `local` has port 0; only then does it take `SO_REUSEPORT`, and
///   the others join it. The kernel spreads remote addresses over the group, each remote on one socket.
/// - While a group lives the kernel lets a socket join it only with `SO_REUSEPORT` and the same owner (uid) as
///   the group's sockets: they are given an owner no account has (`fchown`, which needs `CAP_CHOWN`), so that
///   no other socket can join, root's included. A process without `CAP_CHOWN` binds a group of its own uid
///   (a socket of that uid could join it): one that gives up its privileges and binds groups afterwards keeps
///   sockets made before, a [`SocketReserve`] given to [`bind_sockets_with`].
pub fn bind_sockets(local: SocketAddr, count: usize, options: &SocketOptions) -> Result<Vec<TunnelSocket>> {
    bind_sockets_with(local, count, options, None)
}

/// [`bind_sockets`], a group's sockets taken from `reserve` when one is given (made while the process could
/// still give them their owner); an empty reserve refuses. One socket is bound alone, as ever.
pub fn bind_sockets_with(
    local: SocketAddr,
    count: usize,
    options: &SocketOptions,
    reserve: Option<&SocketReserve>,
) -> Result<Vec<TunnelSocket>> {
    use crate::dataplane::udp::PortSharing;
    if count <= 1 {
        return Ok(vec![TunnelSocket::bind_sharing(local, options, PortSharing::Alone)?]);
    }
    let mut fds = match reserve {
        Some(reserve) => Some(reserve.take(&local, count)?),
        None => None,
    };
    let mut bind = |addr, sharing| match fds.as_mut().and_then(Vec::pop) {
        Some(fd) => TunnelSocket::bind_fd(fd, addr, options, sharing),
        None => TunnelSocket::bind_sharing(addr, options, sharing),
    };
    let bound: Result<Vec<TunnelSocket>> = (|| {
        let first = bind(local, PortSharing::FirstOfGroup)?;
        let at = first.local_addr()?;
        let mut sockets = vec![first];
        for _ in 1..count {
            let mut socket = bind(at, PortSharing::JoinGroup)?;
            // One table of reply sources for the group: a remote is received on one socket, sent to from any.
            socket.share_sources_with(&sockets[0]);
            sockets.push(socket);
        }
        Ok(sockets)
    })();
    if bound.is_err() {
        // What a failed bind did not reach stays in the reserve (a socket whose bind failed is gone with it).
        if let (Some(reserve), Some(fds)) = (reserve, fds) {
            reserve.give_back(fds);
        }
    }
    bound
}

/// A tunnel ready to run (see [`TunnelBuilder`]).
#[derive(Debug)]
pub struct Tunnel<T: Transform> {
    queues: Vec<Arc<Queue>>,
    sockets: Vec<Arc<TunnelSocket>>,
    transform: Arc<T>,
    stop: StopHandle,
    stats: TunnelStatsHandle,
    /// Answers packets the transform has nowhere to send (`None` on a TAP device).
    unreachables: Option<Arc<Unreachables>>,
}

impl<T: Transform> Tunnel<T> {
    /// The local UDP address the sockets are bound to.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.sockets[0].local_addr()
    }

    /// The sockets, one per queue (to set a firewall mark on while the tunnel runs, for instance).
    pub fn sockets(&self) -> Vec<Arc<TunnelSocket>> {
        self.sockets.clone()
    }

    /// The transform.
    pub fn transform(&self) -> &Arc<T> {
        &self.transform
    }

    /// Fires to end [`Self::run`].
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// The live counters.
    pub fn stats(&self) -> TunnelStatsHandle {
        self.stats.clone()
    }

    /// Runs until the stop handle fires or a worker fails (a device deleted, a socket that cannot send); the
    /// failure is returned after every worker stopped, with their counts in [`Self::stats`]. Returns the
    /// counters of the handle it counted into (see [`TunnelBuilder::count_into`]).
    pub fn run(self) -> Result<TunnelStats> {
        self.transform.reply_sources(self.sockets[0].reply_sources());
        let mut workers = Vec::new();
        for (i, (queue, socket)) in self.queues.iter().zip(&self.sockets).enumerate() {
            let ctx = workers::Ctx {
                queue: queue.clone(),
                socket: socket.clone(),
                transform: self.transform.clone(),
                stop: self.stop.clone(),
                stats: self.stats.clone(),
                queue_stats: Some(self.stats.queue(i)),
                unreachables: self.unreachables.clone(),
            };
            let to = ctx.clone();
            workers.push(Worker {
                label: format!("tunnel {}->udp queue {i}", queue.name()),
                work: Box::new(move || workers::to_network(&to)),
            });
            workers.push(Worker {
                label: format!("tunnel udp->{} queue {i}", queue.name()),
                work: Box::new(move || workers::from_network(&ctx)),
            });
        }
        if let Some(interval) = self.transform.tick_interval() {
            let ctx = workers::Ctx {
                queue: self.queues[0].clone(),
                socket: self.sockets[0].clone(),
                transform: self.transform.clone(),
                stop: self.stop.clone(),
                stats: self.stats.clone(),
                queue_stats: None,
                unreachables: self.unreachables.clone(),
            };
            workers.push(Worker {
                label: "tunnel timers".to_string(),
                work: Box::new(move || workers::timers(&ctx, interval)),
            });
        }
        run_workers(workers, &self.stop, true)?;
        Ok(self.stats.snapshot())
    }
}
