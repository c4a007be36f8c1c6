//! UDP with segmentation offload both ways, for the tunnel engine and the load generator and sink: the one UDP
//! layer of the crate.
//!
//! - **Send**: [`TunnelSocket::send_datagrams`] groups runs of datagrams to one destination with one ECN value,
//!   all of one size but the last (which may be shorter), into one message with `UDP_SEGMENT`, and sends every
//!   message of a batch with one `sendmmsg`. The datagrams stay where they are: a message's payload is the list
//!   of their slices.
//! - **Receive**: [`RecvSlots`] reads many messages per `recvmmsg`, each of which may hold several datagrams of
//!   one flow coalesced by the kernel (`UDP_GRO`), split here by their segment size.
//! - **Degrading, counted**: a segmented send the kernel refuses for its segmentation (`EIO`, `EINVAL`) turns
//!   segmentation off for the socket and is sent again one datagram per message; one too large for the path
//!   (`EMSGSIZE`: a segment is never fragmented) is sent again one datagram per message, which the kernel may
//!   fragment. Each is counted in `gso_fallbacks`; a datagram that still cannot go is a drop with its reason.
//!
//! - **Replies leave from the address the remote contacted** (the kernel's WireGuard calls it source-address
//!   stickiness): a socket bound to a wildcard address reads the local address of every datagram
//!   (`IP_PKTINFO`, `IPV6_RECVPKTINFO`); it is recorded per remote only once what the remote sent
//!   authenticated: by the engine for a datagram the transform opened ([`TunnelSocket::remember_source`]), by the
//!   transform for a message its own worker authenticated ([`ReplySources`]); every send to that remote,
//!   segmented or not, names it as its source. A datagram that did not authenticate never changes it.
//!   A send the kernel refuses for that source (`EINVAL`, `EADDRNOTAVAIL`, `ENETUNREACH`: the address went away)
//!   forgets it and goes again from the routing's choice.
//!
//! Outer datagrams may be fragmented (`IP_PMTUDISC_DONT`), as the kernel's own tunnels allow: a tunnel whose
//! underlay has a smaller MTU than its packets still carries them.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard};
use std::time::Duration;

use rustix::event::PollFlags;
use rustix::net::sockopt;

use crate::dataplane::stats::{Counters, DropReason};
use crate::error::{Error, Result};
use crate::stop::StopHandle;
use crate::sys;

pub use crate::sys::udp::{LocalAddr, RecvMeta, MAX_MMSG};

/// Most datagrams one segmented send carries: the kernel's limit on every release (newer ones take 128).
pub const MAX_SEGMENTS: usize = 64;

/// The largest payload of one send (all its segments together): the IP length field's limit less the headers.
pub fn max_send_payload(dest: &SocketAddr) -> usize {
    if dest.is_ipv6() {
        65_535 - 8
    } else {
        65_535 - 20 - 8
    }
}

/// Turns on UDP GSO (`UDP_SEGMENT`) for a UDP socket: each `send` of up to 64 KiB leaves as datagrams of
/// `segment_size` bytes, which reach a TUN/TAP device with USO as one super-packet.
pub fn set_udp_segment(socket: &impl AsFd, segment_size: u16) -> Result<()> {
    sys::udp::set_udp_segment(socket.as_fd(), segment_size).map_err(|e| Error::io("setsockopt(UDP_SEGMENT)", e))
}

/// `sendmmsg` of `count` equal messages of `msg_len` bytes taken back to back from `buf`, on a connected socket
/// (the load generator's send): fewer than `count` when the kernel stopped at an error it reports next time.
pub fn send_equal(socket: &impl AsFd, buf: &[u8], msg_len: usize, count: usize) -> io::Result<usize> {
    sys::udp::send_mmsg(socket.as_fd(), buf, msg_len, count)
}

/// One datagram to send: its bytes, where it goes, the ECN field its outer header carries.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// The UDP payload.
    pub data: &'a [u8],
    /// The destination.
    pub dest: SocketAddr,
    /// The ECN field (low two bits of the TOS byte or traffic class).
    pub ecn: u8,
}

/// Options of a [`TunnelSocket`]. Whether a port is shared is not one of them: a socket of its own holds its
/// port alone, and only the sockets of one [`crate::tunnel::bind_sockets`] group share theirs.
#[derive(Debug, Clone, Copy)]
pub struct SocketOptions {
    /// Segmented sends (`UDP_SEGMENT`), where the kernel has them.
    pub gso: bool,
    /// Coalesced reads (`UDP_GRO`), where the kernel has them.
    pub gro: bool,
    /// `SO_MARK` (0: none; anything else needs CAP_NET_ADMIN).
    pub mark: u32,
    /// On an IPv6 address: IPv4 too (`IPV6_V6ONLY` off), IPv4 peers seen and addressed as plain IPv4 addresses.
    pub dual_stack: bool,
    /// IPv4 datagrams without a UDP checksum (`SO_NO_CHECK`), as the kernel's VXLAN sends by default: the
    /// tunnel's packets carry their own. The kernel refuses segmented sends on such a socket, so each is sent
    /// again one datagram per message and segmentation goes off (counted in `gso_fallbacks`).
    pub zero_checksum: bool,
    /// Send and receive buffer sizes asked for (capped by `net.core.wmem_max`/`rmem_max`, or forced past them
    /// with CAP_NET_ADMIN).
    pub buffer: usize,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions { gso: true, gro: true, mark: 0, dual_stack: false, zero_checksum: false, buffer: 4 << 20 }
    }
}

/// A non-blocking UDP socket with segmentation offload both ways, ECN on every datagram, and sources read with
/// every message. Shared by reference between the workers that send on it.
#[derive(Debug)]
pub struct TunnelSocket {
    socket: UdpSocket,
    gso: AtomicBool,
    gro: bool,
    /// An IPv6 socket.
    ipv6: bool,
    /// An IPv6 socket that also carries IPv4: IPv4 destinations are sent to as v4-mapped addresses.
    dual: bool,
    /// Where replies to each remote leave from; `None` on a socket bound to one address, which has no choice.
    sources: Option<Arc<Sources>>,
}

/// Most remote addresses a [`Sources`] table remembers (the kernel's limit of peers on one device): past them a
/// new one takes the place of another, which its next authenticated datagram records again. Only senders whose
/// datagrams authenticated are recorded, so only they can fill it.
const MAX_SOURCES: usize = 1 << 20;

/// The local address each remote address last reached us at, shared by the sockets of one group (a remote is
/// received on one socket and may be sent to from any).
#[derive(Debug)]
struct Sources {
    map: RwLock<HashMap<SocketAddr, LocalAddr>>,
    /// Most entries it holds.
    capacity: usize,
    /// How many entries `map` holds: a send looks at the lock only when there is one.
    len: AtomicUsize,
    /// Bumped whenever an entry is forgotten or replaced by another address, so that every receiving worker's
    /// memo records again (another worker may have recorded the remote at another address meanwhile).
    changes: AtomicU64,
}

impl Default for Sources {
    fn default() -> Self {
        Sources::with_capacity(MAX_SOURCES)
    }
}

impl Sources {
    fn with_capacity(capacity: usize) -> Self {
        Sources { map: RwLock::default(), capacity, len: AtomicUsize::new(0), changes: AtomicU64::new(0) }
    }

    /// Records `remote` at `local`: in place of another remote when the table is full.
    fn remember(&self, remote: SocketAddr, local: LocalAddr) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        if map.len() >= self.capacity && !map.contains_key(&remote) {
            if let Some(other) = map.keys().next().copied() {
                map.remove(&other);
                self.changes.fetch_add(1, Ordering::Release);
            }
        }
        let was = map.insert(remote, local);
        if was.is_some_and(|was| was != local) {
            self.changes.fetch_add(1, Ordering::Release);
        }
        self.len.store(map.len(), Ordering::Release);
    }

    fn forget(&self, remote: SocketAddr) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        if map.remove(&remote).is_some() {
            self.changes.fetch_add(1, Ordering::Release);
        }
        self.len.store(map.len(), Ordering::Release);
    }

    /// The table for a batch of sends, or `None` while it is empty (no lock taken then).
    fn read(&self) -> Option<RwLockReadGuard<'_, HashMap<SocketAddr, LocalAddr>>> {
        (self.len.load(Ordering::Acquire) > 0).then(|| self.map.read().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Entries of a [`SourceMemo`].
const MEMO_ENTRIES: usize = 8;

/// What one receiving worker last recorded through [`TunnelSocket::remember_source`], so that a remote seen again
/// at the same local address costs no lock: a few entries, by remote address.
#[derive(Debug, Default)]
pub struct SourceMemo {
    entries: [Option<(SocketAddr, LocalAddr)>; MEMO_ENTRIES],
    /// The table's `changes` count these entries go with.
    changes: u64,
}

/// The local address a reply to a datagram that reached `local` leaves from: unicast only, IPv4 as itself.
fn reply_source(local: LocalAddr) -> Option<LocalAddr> {
    let local = LocalAddr { ip: unmapped_ip(local.ip), ..local };
    let unicast = match local.ip {
        IpAddr::V4(ip) => !(ip.is_multicast() || ip.is_broadcast() || ip.is_unspecified()),
        IpAddr::V6(ip) => !(ip.is_multicast() || ip.is_unspecified()),
    };
    unicast.then_some(local)
}

/// Where replies to each remote leave from, as a transform records it: the table of a tunnel's sockets
/// ([`TunnelSocket::reply_sources`]), given to a transform that authenticates datagrams on its own worker
/// ([`crate::tunnel::Transform::reply_sources`]). Records nothing for sockets bound to one address.
#[derive(Debug, Clone, Default)]
pub struct ReplySources(Option<Arc<Sources>>);

impl ReplySources {
    /// Records that `remote` reached us at `local`, now that a message from it authenticated: replies to it
    /// leave from that address from now on (see [`TunnelSocket::remember_source`]).
    pub fn remember(&self, remote: SocketAddr, local: Option<LocalAddr>) {
        if let (Some(sources), Some(local)) = (&self.0, local.and_then(reply_source)) {
            sources.remember(remote, local);
        }
    }
}

/// The owner (uid) a port group's sockets are given: the kernel lets a socket join a `SO_REUSEPORT` group only
/// with the same owner as the group's sockets, so a uid that no account has keeps every other socket out, root's
/// included. Chosen once per process, at random among the uids from 2^31 on (no account system hands those out).
fn group_owner() -> u32 {
    use std::hash::BuildHasher;
    static OWNER: OnceLock<u32> = OnceLock::new();
    *OWNER.get_or_init(|| {
        let random = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        0x8000_0000 + (random % 0x7fff_ff00) as u32
    })
}

/// A new unbound UDP socket of `family`.
fn new_socket(family: rustix::net::AddressFamily) -> Result<OwnedFd> {
    use rustix::net::{SocketFlags, SocketType};
    rustix::net::socket_with(family, SocketType::DGRAM, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None)
        .map_err(|e| Error::io("socket(UDP)", e.into()))
}

/// A new unbound UDP socket of `family` owned by [`group_owner`], for a port group; `None` when this process may
/// not give it that owner (no `CAP_CHOWN`).
fn new_group_socket(family: rustix::net::AddressFamily) -> Result<Option<OwnedFd>> {
    let fd = new_socket(family)?;
    match rustix::fs::fchown(&fd, Some(rustix::fs::Uid::from_raw(group_owner())), None) {
        Ok(()) => Ok(Some(fd)),
        // No CAP_CHOWN, or a user namespace where that uid is not mapped: the process's own uid then.
        Err(rustix::io::Errno::PERM | rustix::io::Errno::INVAL) => Ok(None),
        Err(e) => Err(Error::io("fchown(UDP socket)", e.into())),
    }
}

/// Unbound UDP sockets owned by the group owner (see [`crate::tunnel::bind_sockets_with`]), made while the
/// process may still give them that owner, for the port groups it binds after it gave up its privileges (a
/// WireGuard endpoint run with `--user` whose port `wg` changes): such a group is as closed to other sockets
/// as one bound as root. Each group takes as many sockets as it has; a reserve that is empty refuses.
#[derive(Debug)]
pub struct SocketReserve {
    /// IPv6 sockets (`true`), or IPv4 where the kernel has no IPv6.
    ipv6: bool,
    sockets: std::sync::Mutex<Vec<OwnedFd>>,
}

impl SocketReserve {
    /// `count` sockets, IPv6 (IPv4 on a kernel without IPv6). Needs `CAP_CHOWN`.
    pub fn new(count: usize) -> Result<Self> {
        use rustix::net::AddressFamily;
        let ipv6 = match new_socket(AddressFamily::INET6) {
            Ok(_) => true,
            Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => false,
            Err(e) => return Err(e),
        };
        let family = if ipv6 { AddressFamily::INET6 } else { AddressFamily::INET };
        let mut sockets = Vec::with_capacity(count);
        for _ in 0..count {
            let fd = new_group_socket(family)?.ok_or_else(|| Error::PermissionDenied {
                action: "reserving sockets for a port group (fchown needs CAP_CHOWN)".into(),
                source: std::io::Error::from_raw_os_error(libc::EPERM),
            })?;
            sockets.push(fd);
        }
        Ok(SocketReserve { ipv6, sockets: std::sync::Mutex::new(sockets) })
    }

    /// How many sockets are left.
    pub fn left(&self) -> usize {
        self.sockets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// `count` sockets for `addr`'s family, all or none.
    pub(crate) fn take(&self, addr: &SocketAddr, count: usize) -> Result<Vec<OwnedFd>> {
        if addr.is_ipv6() != self.ipv6 {
            return Err(Error::io(
                format!("binding UDP {addr} from the reserved sockets"),
                std::io::Error::from_raw_os_error(libc::EAFNOSUPPORT),
            ));
        }
        let mut sockets = self.sockets.lock().unwrap_or_else(|e| e.into_inner());
        if sockets.len() < count {
            return Err(Error::io(
                format!(
                    "binding UDP {addr}: {} of the sockets reserved for a new port are left, {count} needed (they \
                     were made before the privileges were dropped; restart to change the port again)",
                    sockets.len()
                ),
                std::io::Error::from_raw_os_error(libc::EPERM),
            ));
        }
        let at = sockets.len() - count;
        Ok(sockets.split_off(at))
    }

    /// Puts back sockets [`Self::take`] gave that were not bound.
    pub(crate) fn give_back(&self, fds: Vec<OwnedFd>) {
        self.sockets.lock().unwrap_or_else(|e| e.into_inner()).extend(fds);
    }
}

/// How a socket holds its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PortSharing {
    /// Alone: bound without `SO_REUSEPORT`, so the bind fails with `EADDRINUSE` if anyone holds the port, and
    /// nobody can bind it afterwards.
    Alone,
    /// The first of a group: bound alone (which proves the port free: nobody else holds it, shared or not), then
    /// opened to `SO_REUSEPORT` for the rest of the group.
    FirstOfGroup,
    /// The rest of a group: bound with `SO_REUSEPORT`, joining the first.
    JoinGroup,
}

impl TunnelSocket {
    /// Binds `addr` with `options`, holding the port alone: `EADDRINUSE` if any socket holds it (shared or not),
    /// and no other socket can bind it while this one lives. Port 0 picks one ([`Self::local_addr`] says which).
    pub fn bind(addr: SocketAddr, options: &SocketOptions) -> Result<Self> {
        Self::bind_sharing(addr, options, PortSharing::Alone)
    }

    /// [`Self::bind`] with the way the port is held (see [`crate::tunnel::bind_sockets`], the one place that
    /// makes groups).
    pub(crate) fn bind_sharing(addr: SocketAddr, options: &SocketOptions, sharing: PortSharing) -> Result<Self> {
        use rustix::net::AddressFamily;
        let family = if addr.is_ipv6() { AddressFamily::INET6 } else { AddressFamily::INET };
        let fd = match sharing {
            PortSharing::Alone => new_socket(family)?,
            // Owned by the group owner where this process may give it one; its own otherwise (then a socket of
            // the same owner could join the group: see `crate::tunnel::bind_sockets_with`).
            PortSharing::FirstOfGroup | PortSharing::JoinGroup => match new_group_socket(family)? {
                Some(fd) => fd,
                None => new_socket(family)?,
            },
        };
        Self::bind_fd(fd, addr, options, sharing)
    }

    /// Sets `fd` (a new, unbound UDP socket of `addr`'s family: made here, or taken from a [`SocketReserve`]) up
    /// and binds it.
    pub(crate) fn bind_fd(
        fd: OwnedFd,
        addr: SocketAddr,
        options: &SocketOptions,
        sharing: PortSharing,
    ) -> Result<Self> {
        let opt = |what: &'static str, r: rustix::io::Result<()>| r.map_err(|e| Error::io(what, e.into()));
        if sharing == PortSharing::JoinGroup {
            opt("setsockopt(SO_REUSEPORT)", sockopt::set_socket_reuseport(&fd, true))?;
        }
        let dual = addr.is_ipv6() && options.dual_stack;
        if addr.is_ipv6() {
            opt("setsockopt(IPV6_V6ONLY)", sockopt::set_ipv6_v6only(&fd, !dual))?;
            opt("setsockopt(IPV6_RECVTCLASS)", sockopt::set_ipv6_recvtclass(&fd, true))?;
            // Outer fragmentation allowed: a packet larger than the path is fragmented rather than lost.
            let _ = sockopt::set_ipv6_mtu_discover(&fd, sockopt::Ipv6PathMtuDiscovery::DONT);
        }
        if !addr.is_ipv6() || dual {
            opt("setsockopt(IP_RECVTOS)", sockopt::set_ip_recvtos(&fd, true))?;
            let _ = sockopt::set_ip_mtu_discover(&fd, sockopt::Ipv4PathMtuDiscovery::DONT);
        }
        if options.buffer > 0 {
            // Forced past the system's limit where we may, asked within it otherwise.
            if sockopt::set_socket_send_buffer_size_force(&fd, options.buffer).is_err() {
                let _ = sockopt::set_socket_send_buffer_size(&fd, options.buffer);
            }
            if sockopt::set_socket_recv_buffer_size_force(&fd, options.buffer).is_err() {
                let _ = sockopt::set_socket_recv_buffer_size(&fd, options.buffer);
            }
        }
        if options.mark != 0 {
            sys::udp::set_mark(fd.as_fd(), options.mark)
                .map_err(|e| crate::error::permission_or_io("setting SO_MARK on the tunnel socket", e))?;
        }
        if options.zero_checksum && !addr.is_ipv6() {
            sys::udp::set_no_check(fd.as_fd(), true).map_err(|e| Error::io("setsockopt(SO_NO_CHECK)", e))?;
        }
        rustix::net::bind(&fd, &addr).map_err(|e| Error::io(format!("binding UDP {addr}"), e.into()))?;
        if sharing == PortSharing::FirstOfGroup {
            // Bound alone, so the port was free; from now on the rest of the group (and only sockets of the same
            // owning user, the kernel's rule for a group) may join.
            opt("setsockopt(SO_REUSEPORT)", sockopt::set_socket_reuseport(&fd, true))?;
        }
        let gso = options.gso && sys::udp::set_udp_segment(fd.as_fd(), 0).is_ok();
        let gro = options.gro && sys::udp::set_udp_gro(fd.as_fd(), true).is_ok();
        // On a wildcard address a reply could leave from any of the host's addresses: the datagrams say which one
        // their sender reached, so that replies leave from it.
        let sources = if addr.ip().is_unspecified() {
            sys::udp::set_recv_pktinfo(fd.as_fd(), addr.is_ipv6())
                .map_err(|e| Error::io("setsockopt(IP_PKTINFO/IPV6_RECVPKTINFO)", e))?;
            Some(Arc::new(Sources::default()))
        } else {
            None
        };
        let ipv6 = addr.is_ipv6();
        Ok(TunnelSocket { socket: UdpSocket::from(fd), gso: AtomicBool::new(gso), gro, ipv6, dual, sources })
    }

    /// Makes this socket use `first`'s table of reply sources: the sockets of one group share one.
    pub(crate) fn share_sources_with(&mut self, first: &TunnelSocket) {
        if self.sources.is_some() {
            self.sources.clone_from(&first.sources);
        }
    }

    /// Records that `remote` reached us at `local` (the [`RecvMeta::local`] of a datagram from it), once what it
    /// sent authenticated (the engine: a datagram the transform opened; a transform: a message its own worker
    /// authenticated, through [`ReplySources`]): replies to `remote` then leave from that address. `memo` is the
    /// calling worker's own, so that the same remote at the same address again costs no lock. Nothing is
    /// recorded on a socket bound to one address, or for a datagram sent to a multicast or broadcast address.
    pub fn remember_source(&self, remote: SocketAddr, local: Option<LocalAddr>, memo: &mut SourceMemo) {
        let (Some(sources), Some(local)) = (&self.sources, local.and_then(reply_source)) else { return };
        let changes = sources.changes.load(Ordering::Acquire);
        if memo.changes != changes {
            *memo = SourceMemo { changes, ..SourceMemo::default() };
        }
        let slot = &mut memo.entries[memo_slot(&remote)];
        if *slot == Some((remote, local)) {
            return;
        }
        sources.remember(remote, local);
        *slot = Some((remote, local));
    }

    /// The group's table of reply sources, for a transform that authenticates datagrams on a worker of its own.
    pub fn reply_sources(&self) -> ReplySources {
        ReplySources(self.sources.clone())
    }

    /// The local address replies to `dest` leave from, as a send names it: v4-mapped on a dual-stack socket's
    /// IPv4 traffic, with the interface only for an IPv6 link-local address (whose scope needs it); otherwise
    /// the routing picks the interface, as it does for the kernel's WireGuard, so that a route back through
    /// another interface than the datagram came in on is followed.
    fn source_for(&self, map: Option<&HashMap<SocketAddr, LocalAddr>>, dest: &SocketAddr) -> Option<LocalAddr> {
        let local = *map?.get(dest)?;
        let ifindex = match local.ip {
            IpAddr::V6(ip) if (ip.segments()[0] & 0xffc0) == 0xfe80 => local.ifindex,
            _ => 0,
        };
        let fits = match (local.ip, self.ipv6) {
            (IpAddr::V4(_), false) | (IpAddr::V6(_), true) => true,
            (IpAddr::V4(_), true) => self.dual,
            (IpAddr::V6(_), false) => false,
        };
        fits.then_some(LocalAddr { ip: local.ip, ifindex })
    }

    /// The address it is bound to.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.socket.local_addr().map_err(|e| Error::io("getsockname", e))
    }

    /// Whether sends are segmented (off after the kernel refused a segmented send).
    pub fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// Whether reads may be coalesced.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Sets `SO_MARK` (0: none).
    pub fn set_mark(&self, mark: u32) -> Result<()> {
        sys::udp::set_mark(self.socket.as_fd(), mark)
            .map_err(|e| crate::error::permission_or_io("setting SO_MARK on the tunnel socket", e))
    }

    /// Waits until a datagram can be read, `timeout` passes or `stop` fires (false for the last two).
    pub fn wait_readable(&self, stop: Option<&StopHandle>, timeout: Option<Duration>) -> Result<bool> {
        crate::stop::wait_or_stop(self.socket.as_fd(), PollFlags::IN, stop, timeout)
    }

    /// Blocking or non-blocking mode (a new socket is non-blocking). On a blocking socket a full send buffer is
    /// waited for in the kernel, and [`Self::recv_wait`] sleeps until a datagram comes.
    pub fn set_blocking(&self, blocking: bool) -> Result<()> {
        self.socket.set_nonblocking(!blocking).map_err(|e| Error::io("fcntl(O_NONBLOCK) on the tunnel socket", e))
    }

    /// Like [`Self::recv`], but on a blocking socket the first message is waited for (`MSG_WAITFORONE`); 0 when
    /// a signal ended the wait.
    pub fn recv_wait(&self, slots: &mut RecvSlots) -> Result<usize> {
        self.read(slots, true)
    }

    /// Reads what is queued into `slots` without waiting: the number of messages read, 0 when none is there.
    pub fn recv(&self, slots: &mut RecvSlots) -> Result<usize> {
        self.read(slots, false)
    }

    /// One `recvmmsg`, sources as plain IPv4 addresses on a dual-stack socket.
    fn read(&self, slots: &mut RecvSlots, wait: bool) -> Result<usize> {
        let n = slots.recv(&self.socket, wait)?;
        if self.dual {
            for m in &mut slots.meta[..n] {
                m.source = m.source.map(unmapped);
                if let Some(local) = &mut m.local {
                    local.ip = unmapped_ip(local.ip);
                }
            }
        }
        Ok(n)
    }

    /// The address to send to: a v4-mapped one for an IPv4 peer on a dual-stack socket.
    fn wire_dest(&self, dest: SocketAddr) -> SocketAddr {
        match dest {
            SocketAddr::V4(v4) if self.dual => {
                SocketAddr::new(std::net::IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
            }
            other => other,
        }
    }

    /// Sends one datagram on its own (a handshake, a keepalive, a reply): no batching, no segmentation.
    pub fn send_one(&self, data: &[u8], dest: SocketAddr, counters: &mut Counters) -> Result<()> {
        self.send_datagrams(&[Datagram { data, dest, ecn: 0 }], None, counters)
    }

    /// Sends `datagrams` in order, grouped into segmented messages where they can be (see the module
    /// documentation), with as few `sendmmsg` calls as the kernel allows. Every datagram is sent or counted in
    /// `counters` as a drop with its reason; `packets`, `bytes` and `writes` (system calls) count what went.
    /// A full socket buffer is waited on (until `stop` fires: the rest is then counted as stopped). Errors only
    /// for a socket that cannot send at all, after counting what it did not send.
    pub fn send_datagrams(
        &self,
        datagrams: &[Datagram<'_>],
        stop: Option<&StopHandle>,
        counters: &mut Counters,
    ) -> Result<()> {
        let mut start = 0;
        while start < datagrams.len() {
            let end = (start + IOV_MAX).min(datagrams.len());
            self.send_chunk(&datagrams[start..end], stop, counters)?;
            start = end;
        }
        Ok(())
    }

    /// [`Self::send_datagrams`] for at most [`IOV_MAX`] datagrams (the iovec array on the stack).
    fn send_chunk(&self, datagrams: &[Datagram<'_>], stop: Option<&StopHandle>, counters: &mut Counters) -> Result<()> {
        let mut iov = [IoSlice::new(&[]); IOV_MAX];
        for (slot, d) in iov.iter_mut().zip(datagrams) {
            *slot = IoSlice::new(d.data);
        }
        let mut group_room = [(0, 0, 0); IOV_MAX];
        let groups = group(datagrams, self.gso(), &mut group_room);
        let mut messages =
            [sys::udp::SendMsg { dest: datagrams[0].dest, iov: &[], segment: 0, tos: None, source: None }; MAX_MMSG];
        let mut g = 0;
        while g < groups.len() {
            let batch = &groups[g..groups.len().min(g + MAX_MMSG)];
            {
                // The reply sources of the batch's destinations, looked up under one read lock (none while the
                // table is empty), released before the send.
                let sources = self.sources.as_ref().and_then(|s| s.read());
                for (m, &(first, end, segment)) in messages.iter_mut().zip(batch) {
                    let d = &datagrams[first];
                    let dest = self.wire_dest(d.dest);
                    let source = self.source_for(sources.as_deref(), &d.dest);
                    *m = sys::udp::SendMsg { dest, iov: &iov[first..end], segment, tos: Some(d.ecn & 0b11), source };
                }
            }
            counters.writes += 1;
            match sys::udp::send_msgs(self.socket.as_fd(), &messages[..batch.len()]) {
                Ok(n) => {
                    for &(first, end, _) in &batch[..n] {
                        count_sent(&datagrams[first..end], counters);
                    }
                    g += n;
                }
                Err(e) => {
                    // The first message of the batch failed: decide for it, then go on after it.
                    let (first, end, segment) = batch[0];
                    let source = messages[0].source;
                    match self.failed(e, &datagrams[first..end], &iov[first..end], segment, source, stop, counters) {
                        Ok(Retry::Again) => {}
                        Ok(Retry::Next) => g += 1,
                        Err(fatal) => {
                            let rest: usize = groups[g..].iter().map(|&(a, b, _)| b - a).sum();
                            counters.drops.add(DropReason::Stopped, rest as u64);
                            return Err(fatal);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// What a failed send of one message (`datagrams`, gathered from `iov`, sent from `source`) becomes.
    #[allow(clippy::too_many_arguments)]
    fn failed(
        &self,
        e: io::Error,
        datagrams: &[Datagram<'_>],
        iov: &[IoSlice<'_>],
        segment: u16,
        source: Option<LocalAddr>,
        stop: Option<&StopHandle>,
        counters: &mut Counters,
    ) -> Result<Retry> {
        let segmented = segment > 0 && datagrams.len() > 1;
        if source.is_some() && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EADDRNOTAVAIL | libc::ENETUNREACH))
        {
            // The address the remote reached us at is gone (the kernel refuses a source that is not the host's,
            // EINVAL for IPv6, ENETUNREACH for IPv4) or cannot reach it: forgotten, and the same message again
            // from the routing's choice (where a refusal that had another cause is decided).
            if let Some(sources) = &self.sources {
                sources.forget(datagrams[0].dest);
            }
            return Ok(Retry::Again);
        }
        match e.raw_os_error() {
            Some(errno @ (libc::EINTR | libc::EAGAIN)) => {
                // Interrupted (the wake-up signal at the stop ends a blocking send) or the socket buffer full:
                // give up on a stop; else send again, after waiting for room (backpressure) if it was full.
                if stop.is_some_and(StopHandle::is_stopped) {
                    counters.drops.add(DropReason::Stopped, datagrams.len() as u64);
                    return Ok(Retry::Next);
                }
                if errno == libc::EAGAIN {
                    let room = Some(Duration::from_millis(100));
                    crate::stop::wait_or_stop(self.socket.as_fd(), PollFlags::OUT, stop, room)?;
                }
                Ok(Retry::Again)
            }
            Some(libc::ENOBUFS) => {
                // The device queue is full for a moment: the kernel gives no readiness for that.
                std::thread::sleep(Duration::from_micros(50));
                Ok(Retry::Again)
            }
            Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE) if segmented => {
                if e.raw_os_error() != Some(libc::EMSGSIZE) && self.gso.swap(false, Ordering::Relaxed) {
                    tracing::warn!("the kernel refused a segmented UDP send ({e}); segmentation off for this socket");
                }
                counters.gso_fallbacks += 1;
                self.send_singly(datagrams, iov, stop, counters)?;
                Ok(Retry::Next)
            }
            Some(libc::EMSGSIZE) => {
                counters.drops.add(DropReason::TooBig, datagrams.len() as u64);
                Ok(Retry::Next)
            }
            Some(
                libc::ENETUNREACH
                | libc::EHOSTUNREACH
                | libc::ENETDOWN
                | libc::EHOSTDOWN
                | libc::EADDRNOTAVAIL
                | libc::ECONNREFUSED
                | libc::EPERM
                | libc::EACCES
                | libc::EAFNOSUPPORT,
            ) => {
                counters.drops.add(DropReason::Unreachable, datagrams.len() as u64);
                Ok(Retry::Next)
            }
            Some(libc::EINVAL) => {
                counters.drops.add(DropReason::KernelRefused, datagrams.len() as u64);
                Ok(Retry::Next)
            }
            _ => Err(Error::io("sendmmsg on the tunnel socket", e)),
        }
    }

    /// Sends each of `datagrams` as its own message (after a refused segmented send).
    fn send_singly(
        &self,
        datagrams: &[Datagram<'_>],
        iov: &[IoSlice<'_>],
        stop: Option<&StopHandle>,
        counters: &mut Counters,
    ) -> Result<()> {
        let mut i = 0;
        while i < datagrams.len() {
            let d = &datagrams[i];
            let dest = self.wire_dest(d.dest);
            let source = self.source_for(self.sources.as_ref().and_then(|s| s.read()).as_deref(), &d.dest);
            let msg = [sys::udp::SendMsg { dest, iov: &iov[i..i + 1], segment: 0, tos: Some(d.ecn & 0b11), source }];
            counters.writes += 1;
            match sys::udp::send_msgs(self.socket.as_fd(), &msg) {
                Ok(_) => {
                    count_sent(&datagrams[i..i + 1], counters);
                    i += 1;
                }
                Err(e) => match self.failed(e, &datagrams[i..i + 1], &iov[i..i + 1], 0, source, stop, counters)? {
                    Retry::Again => {}
                    Retry::Next => i += 1,
                },
            }
        }
        Ok(())
    }
}

impl AsFd for TunnelSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// Datagrams one [`TunnelSocket::send_datagrams`] chunk handles (its iovecs live on the stack).
const IOV_MAX: usize = 256;

/// What to do after a failed message.
enum Retry {
    /// Send the same message again.
    Again,
    /// It was dealt with (sent another way, or counted): go on with the next.
    Next,
}

/// A v4-mapped IP address as the IPv4 address it stands for; any other unchanged.
fn unmapped_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Where a remote's entry goes in a [`SourceMemo`].
fn memo_slot(remote: &SocketAddr) -> usize {
    let last = match remote.ip() {
        IpAddr::V4(ip) => ip.octets()[3],
        IpAddr::V6(ip) => ip.octets()[15],
    };
    (usize::from(last) ^ usize::from(remote.port())) % MEMO_ENTRIES
}

/// A v4-mapped address (`::ffff:a.b.c.d`) as the IPv4 address it stands for; any other unchanged.
fn unmapped(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => addr,
        },
        v4 => v4,
    }
}

fn count_sent(datagrams: &[Datagram<'_>], counters: &mut Counters) {
    counters.packets += datagrams.len() as u64;
    counters.bytes += datagrams.iter().map(|d| d.data.len() as u64).sum::<u64>();
}

/// Splits `datagrams` into messages: `(first, end, segment)` index ranges, each a run that one segmented send
/// can carry (one destination, one ECN value, all of the first one's size but the last, which may be shorter;
/// at most [`MAX_SEGMENTS`] and [`max_send_payload`] bytes), or single datagrams without `gso`.
fn group<'g>(datagrams: &[Datagram<'_>], gso: bool, out: &'g mut [(usize, usize, u16)]) -> &'g [(usize, usize, u16)] {
    let mut n = 0;
    let mut i = 0;
    while i < datagrams.len() && n < out.len() {
        let head = &datagrams[i];
        let size = head.data.len();
        let mut end = i + 1;
        let mut total = size;
        if gso && size > 0 && size <= usize::from(u16::MAX) {
            let limit = max_send_payload(&head.dest);
            while end < datagrams.len() && end - i < MAX_SEGMENTS {
                let d = &datagrams[end];
                let len = d.data.len();
                if d.dest != head.dest
                    || (d.ecn & 0b11) != (head.ecn & 0b11)
                    || len > size
                    || len == 0
                    || total + len > limit
                {
                    break;
                }
                total += len;
                end += 1;
                if len < size {
                    break; // only the last may be shorter
                }
            }
        }
        let segment = if end - i > 1 { size as u16 } else { 0 };
        out[n] = (i, end, segment);
        n += 1;
        i = end;
    }
    &out[..n]
}

/// Buffers for batched receives: `slots` messages of `slot_size` bytes each, read by one `recvmmsg`.
#[derive(Debug)]
pub struct RecvSlots {
    buf: Vec<u8>,
    slot: usize,
    meta: Vec<RecvMeta>,
    filled: usize,
}

impl RecvSlots {
    /// Room for `slots` messages of `slot_size` bytes (64 KiB holds any coalesced read).
    pub fn new(slots: usize, slot_size: usize) -> Self {
        let slots = slots.clamp(1, MAX_MMSG);
        RecvSlots {
            buf: vec![0; slots * slot_size],
            slot: slot_size,
            meta: vec![RecvMeta::default(); slots],
            filled: 0,
        }
    }

    /// Reads into the slots: with `wait`, sleeps (up to the socket's receive timeout) for the first message;
    /// without, returns 0 at once when nothing is queued. The number of messages read.
    pub fn recv(&mut self, socket: &impl AsFd, wait: bool) -> Result<usize> {
        self.filled = 0;
        match sys::udp::recv_mmsg(socket.as_fd(), &mut self.buf, self.slot, &mut self.meta, wait) {
            Ok(n) => {
                self.filled = n;
                Ok(n)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(0)
            }
            Err(e) => Err(Error::io("recvmmsg", e)),
        }
    }

    /// The messages of the last read: what the kernel said of each, and its bytes (several datagrams when
    /// `gso_size` is set: see [`datagrams`]).
    pub fn messages_mut(&mut self) -> impl Iterator<Item = (&RecvMeta, &mut [u8])> {
        let slot = self.slot;
        self.meta[..self.filled].iter().zip(self.buf.chunks_mut(slot)).map(|(m, s)| {
            let len = m.len.min(s.len());
            (m, &mut s[..len])
        })
    }

    /// Like [`Self::messages_mut`], read-only.
    pub fn messages(&self) -> impl Iterator<Item = (&RecvMeta, &[u8])> {
        self.meta[..self.filled].iter().zip(self.buf.chunks(self.slot)).map(|(m, s)| (m, &s[..m.len.min(s.len())]))
    }
}

/// The datagrams of one received message: split by its `UDP_GRO` segment size, or the whole message.
pub fn datagrams<'a>(meta: &RecvMeta, data: &'a mut [u8]) -> std::slice::ChunksMut<'a, u8> {
    let step = if meta.gso_size > 0 { usize::from(meta.gso_size) } else { data.len().max(1) };
    data.chunks_mut(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(data: &[u8], port: u16, ecn: u8) -> Datagram<'_> {
        Datagram { data, dest: SocketAddr::from(([127, 0, 0, 1], port)), ecn }
    }

    #[test]
    fn test_runs_of_one_size_to_one_place_make_one_message() {
        let (a, b) = (vec![0u8; 1000], vec![0u8; 400]);
        let mut out = [(0, 0, 0); 64];
        // Five of 1000 then a shorter one: one message; the shorter ends it.
        let ds = [d(&a, 1, 0), d(&a, 1, 0), d(&a, 1, 0), d(&a, 1, 0), d(&a, 1, 0), d(&b, 1, 0), d(&a, 1, 0)];
        assert_eq!(group(&ds, true, &mut out), &[(0, 6, 1000), (6, 7, 0)]);
        // Another destination or ECN value starts a new message; a longer one too.
        let ds = [d(&b, 1, 0), d(&b, 2, 0), d(&b, 2, 2), d(&b, 2, 2), d(&a, 2, 2)];
        assert_eq!(group(&ds, true, &mut out), &[(0, 1, 0), (1, 2, 0), (2, 4, 400), (4, 5, 0)]);
        // Without GSO every datagram is its own message.
        assert_eq!(group(&ds[..2], false, &mut out), &[(0, 1, 0), (1, 2, 0)]);
    }

    #[test]
    fn test_a_message_keeps_to_the_kernels_limits() {
        let big = vec![0u8; 1400];
        let ds = vec![d(&big, 1, 0); 100];
        let mut out = [(0, 0, 0); 64];
        let groups = group(&ds, true, &mut out);
        // 46 x 1400 = 64,400 fits 65,507; a 47th would not.
        assert_eq!(groups[0], (0, 46, 1400));
        let small = vec![0u8; 100];
        let ds = vec![d(&small, 1, 0); 100];
        assert_eq!(group(&ds, true, &mut out)[0], (0, MAX_SEGMENTS, 100));
    }

    /// Over loopback: a dual-stack socket and an IPv4 one exchange a run of datagrams sent as one segmented
    /// message (received as one coalesced read), their ECN field kept, the dual-stack side seeing a plain IPv4
    /// source.
    #[test]
    fn test_segmented_sends_coalesced_reads_ecn_and_dual_stack_over_loopback() {
        let options = SocketOptions { dual_stack: true, ..SocketOptions::default() };
        let dual = TunnelSocket::bind("[::]:0".parse().unwrap(), &options).unwrap();
        let v4 = TunnelSocket::bind("127.0.0.1:0".parse().unwrap(), &SocketOptions::default()).unwrap();
        let to_v4 = v4.local_addr().unwrap();
        let to_dual = SocketAddr::from(([127, 0, 0, 1], dual.local_addr().unwrap().port()));
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; if i == 9 { 300 } else { 1000 }]).collect();
        let datagrams: Vec<Datagram<'_>> =
            payloads.iter().map(|p| Datagram { data: p, dest: to_v4, ecn: turbotun_wire::ecn::ECT0 }).collect();
        let mut counters = Counters::default();
        dual.send_datagrams(&datagrams, None, &mut counters).unwrap();
        assert_eq!((counters.packets, counters.writes, counters.drops.total()), (10, 1, 0), "{counters:?}");
        let mut slots = RecvSlots::new(4, 65536);
        assert!(v4.wait_readable(None, Some(Duration::from_secs(2))).unwrap());
        let mut got = Vec::new();
        while got.len() < 10 && v4.recv(&mut slots).unwrap() > 0 {
            for (meta, data) in slots.messages_mut() {
                assert_eq!(meta.tos.map(|t| t & 3), Some(turbotun_wire::ecn::ECT0), "{meta:?}");
                assert_eq!(meta.source.map(|s| s.port()), Some(to_dual.port()));
                got.extend(datagrams_of(meta, data));
            }
        }
        assert_eq!(got, payloads);
        // And back: the dual-stack side sees 127.0.0.1, not ::ffff:127.0.0.1.
        v4.send_one(b"back", to_dual, &mut counters).unwrap();
        assert!(dual.wait_readable(None, Some(Duration::from_secs(2))).unwrap());
        assert_eq!(dual.recv(&mut slots).unwrap(), 1);
        let (meta, data) = slots.messages_mut().next().unwrap();
        assert_eq!((meta.source, &*data), (Some(to_v4), &b"back"[..]));
    }

    /// What a send to `dest` would name as its source.
    fn source_of(socket: &TunnelSocket, dest: &str) -> Option<LocalAddr> {
        let sources = socket.sources.as_ref().and_then(|s| s.read());
        socket.source_for(sources.as_deref(), &dest.parse().unwrap())
    }

    #[test]
    fn test_the_table_of_reply_sources() {
        let local = |ip: &str, ifindex| Some(LocalAddr { ip: ip.parse().unwrap(), ifindex });
        let options = SocketOptions { dual_stack: true, ..SocketOptions::default() };
        let socket = TunnelSocket::bind("[::]:0".parse().unwrap(), &options).unwrap();
        let remote: SocketAddr = "10.0.0.9:5000".parse().unwrap();
        let (mut a, mut b) = (SourceMemo::default(), SourceMemo::default());
        assert_eq!(source_of(&socket, "10.0.0.9:5000"), None, "nothing recorded: the routing's choice");
        // Recorded by one worker, then at another address by another, then by the first at its first address
        // again: the latest holds, although the first worker's memo had it already.
        socket.remember_source(remote, local("10.0.0.1", 3), &mut a);
        socket.remember_source(remote, local("10.0.0.2", 3), &mut b);
        assert_eq!(source_of(&socket, "10.0.0.9:5000"), local("10.0.0.2", 0), "no interface named for IPv4");
        socket.remember_source(remote, local("10.0.0.1", 3), &mut a);
        assert_eq!(source_of(&socket, "10.0.0.9:5000"), local("10.0.0.1", 0));
        // A v4-mapped local address is kept as IPv4; a group address is never a source; an IPv6 link-local one
        // keeps its interface.
        let other: SocketAddr = "10.0.0.8:5000".parse().unwrap();
        socket.remember_source(other, local("::ffff:10.0.0.3", 2), &mut a);
        assert_eq!(source_of(&socket, "10.0.0.8:5000"), local("10.0.0.3", 0));
        let group: SocketAddr = "10.0.0.7:5000".parse().unwrap();
        socket.remember_source(group, local("224.0.0.1", 2), &mut a);
        socket.remember_source(group, local("255.255.255.255", 2), &mut a);
        assert_eq!(source_of(&socket, "10.0.0.7:5000"), None);
        let v6: SocketAddr = "[fe80::9]:5000".parse().unwrap();
        socket.remember_source(v6, local("fe80::1", 4), &mut a);
        assert_eq!(source_of(&socket, "[fe80::9]:5000"), local("fe80::1", 4));
        // The same remote at the same address again changes nothing, and costs no lock (the worker's memo).
        let changes = socket.sources.as_ref().unwrap().changes.load(Ordering::Relaxed);
        socket.remember_source(remote, local("10.0.0.1", 3), &mut a);
        assert_eq!(socket.sources.as_ref().unwrap().changes.load(Ordering::Relaxed), changes);
        // What a transform records through the group's handle is the same table.
        socket.reply_sources().remember(remote, local("10.0.0.4", 3));
        assert_eq!(source_of(&socket, "10.0.0.9:5000"), local("10.0.0.4", 0));
        socket.reply_sources().remember(group, local("224.0.0.1", 2));
        assert_eq!(source_of(&socket, "10.0.0.7:5000"), None);
        // Forgotten: the routing's choice again.
        socket.sources.as_ref().unwrap().forget(remote);
        assert_eq!(source_of(&socket, "10.0.0.9:5000"), None);
        // An IPv6-only socket cannot send from an IPv4 address; a socket on one address records nothing.
        let v6_only = TunnelSocket::bind("[::]:0".parse().unwrap(), &SocketOptions::default()).unwrap();
        v6_only.remember_source(remote, local("10.0.0.1", 0), &mut SourceMemo::default());
        assert_eq!(source_of(&v6_only, "10.0.0.9:5000"), None);
        let bound = TunnelSocket::bind("127.0.0.1:0".parse().unwrap(), &SocketOptions::default()).unwrap();
        bound.remember_source(remote, local("10.0.0.1", 0), &mut SourceMemo::default());
        assert!(bound.sources.is_none());
    }

    /// A full table takes a new remote in place of one other entry: the others stay.
    #[test]
    fn test_the_table_of_reply_sources_is_bounded_and_a_new_remote_evicts_one() {
        let sources = Sources::with_capacity(64);
        let local = LocalAddr { ip: "10.0.0.1".parse().unwrap(), ifindex: 0 };
        let remote = |i: u32| SocketAddr::from((std::net::Ipv4Addr::from(0x0b00_0000 + i), 9));
        for i in 0..64 {
            sources.remember(remote(i), local);
        }
        sources.remember(remote(64), local);
        let map = sources.map.read().unwrap();
        assert_eq!(map.len(), 64, "grew past its bound");
        assert!(map.contains_key(&remote(64)));
        assert_eq!((0..64).filter(|&i| map.contains_key(&remote(i))).count(), 63, "one entry evicted, not all");
    }

    fn datagrams_of(meta: &RecvMeta, data: &mut [u8]) -> Vec<Vec<u8>> {
        datagrams(meta, data).map(|d| d.to_vec()).collect()
    }
}
