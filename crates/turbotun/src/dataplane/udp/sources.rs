//! Where replies leave from: the local address each authenticated remote reached us at, in a table the
//! engine's workers and the transform's own worker share, and a small per-worker memo in front of it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use super::{unmapped_ip, TunnelSocket};
use crate::sys::udp::LocalAddr;

/// Most remote addresses a [`Sources`] table remembers (the kernel's limit of peers on one device): past them a
/// new one takes the place of another, which its next authenticated datagram records again. Only senders whose
/// datagrams authenticated are recorded, so only they can fill it.
const MAX_SOURCES: usize = 1 << 20;

/// The local address each remote address last reached us at, shared by the sockets of one group (a remote is
/// received on one socket and may be sent to from any).
#[derive(Debug)]
pub(super) struct Sources {
    pub(super) map: RwLock<HashMap<SocketAddr, LocalAddr>>,
    /// Most entries it holds.
    pub(super) capacity: usize,
    /// How many entries `map` holds: a send looks at the lock only when there is one.
    pub(super) len: AtomicUsize,
    /// Bumped whenever an entry is forgotten or replaced by another address, so that every receiving worker's
    /// memo records again (another worker may have recorded the remote at another address meanwhile).
    pub(super) changes: AtomicU64,
}

impl Default for Sources {
    fn default() -> Self {
        Sources::with_capacity(MAX_SOURCES)
    }
}

impl Sources {
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Sources { map: RwLock::default(), capacity, len: AtomicUsize::new(0), changes: AtomicU64::new(0) }
    }

    /// Records `remote` at `local`: in place of another remote when the table is full.
    pub(super) fn remember(&self, remote: SocketAddr, local: LocalAddr) {
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

    pub(super) fn forget(&self, remote: SocketAddr) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        if map.remove(&remote).is_some() {
            self.changes.fetch_add(1, Ordering::Release);
        }
        self.len.store(map.len(), Ordering::Release);
    }

    /// The table for a batch of sends, or `None` while it is empty (no lock taken then).
    pub(super) fn read(&self) -> Option<RwLockReadGuard<'_, HashMap<SocketAddr, LocalAddr>>> {
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

/// Where a remote's entry goes in a [`SourceMemo`].
fn memo_slot(remote: &SocketAddr) -> usize {
    let last = match remote.ip() {
        IpAddr::V4(ip) => ip.octets()[3],
        IpAddr::V6(ip) => ip.octets()[15],
    };
    (usize::from(last) ^ usize::from(remote.port())) % MEMO_ENTRIES
}

impl TunnelSocket {
    /// Records that `remote` reached us at `local` (the [`RecvMeta::local`](super::RecvMeta::local) of a datagram from it), once what it
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
    pub(super) fn source_for(
        &self,
        map: Option<&HashMap<SocketAddr, LocalAddr>>,
        dest: &SocketAddr,
    ) -> Option<LocalAddr> {
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
}
