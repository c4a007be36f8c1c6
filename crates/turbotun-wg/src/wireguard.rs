//! WireGuard as a [`Transform`] of turbotun's tunnel engine: cryptokey routing over several peers, the
//! protocol itself (handshake, sessions, timers, cookies, replay window) from boringtun's `noise` module.
//!
//! - Sealing: the packet's destination picks the peer (longest-prefix match over every peer's AllowedIPs); no
//!   peer, or a peer without a known endpoint, is a `no_peer` drop.
//! - Opening: handshake initiations find their peer by the static key they carry (after their MAC was checked,
//!   and under load only with a valid cookie); every other message by the index our side gave the session. A
//!   decrypted packet whose source the sending peer may not use is a `not_allowed` drop. An authenticated
//!   datagram from a new address moves the peer's endpoint there (roaming).
//! - Packets sent before a session exists are held by the protocol (up to [`HELD_PER_PEER`] a peer) and go out
//!   when the handshake completes; those beyond, or still held when the handshake is given up, are counted as
//!   `no_session` drops.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use ip_network::IpNetwork;
use ip_network_table::IpNetworkTable;
use rand_core::RngCore;
use turbotun::tunnel::{Opened, Sealed, Transform};
use turbotun::{DropReason, Drops};

use crate::config::{key_to_hex, make_prefixes_exclusive, DeviceConfig, Key};

/// Packets held for one peer while its handshake is under way: boringtun's own queue holds as many and drops
/// the rest without a word, so they are counted here instead.
pub const HELD_PER_PEER: u64 = 256;

/// Handshake messages per second (all peers) past which initiations must carry a cookie.
const HANDSHAKES_PER_SECOND: u64 = 100;

/// How often the protocol's timers run.
const TICK: Duration = Duration::from_millis(250);

/// Bytes a data message adds to its packet: type, receiver index, counter (16) and the tag (16).
const DATA_OVERHEAD: usize = 32;

/// The largest message the protocol writes other than data: a handshake initiation.
const HANDSHAKE_INIT_LEN: usize = 148;

/// One peer at run time.
struct Peer {
    public_key: Key,
    /// The index our side's sessions with it carry (24 bits; boringtun adds 8 of its own).
    index: u32,
    /// The protocol state; `None` while the device has no private key.
    tunn: Mutex<Option<Tunn>>,
    /// Where its datagrams go: configured, then wherever authenticated datagrams come from.
    endpoint: Mutex<Option<SocketAddr>>,
    /// Bumped with every change of `endpoint`, so that workers keep a copy and look at the lock only then.
    endpoint_gen: AtomicU64,
    /// What its `Tunn` was made with, to tell whether a new configuration needs a new one.
    made_with: (Option<Key>, u16),
    rx_bytes: AtomicU64,
    tx_bytes: AtomicU64,
    /// Packets handed to the protocol to send once the handshake completes.
    held: AtomicU64,
}

impl Peer {
    fn endpoint(&self) -> Option<SocketAddr> {
        *self.endpoint.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_endpoint(&self, to: Option<SocketAddr>) {
        let mut endpoint = self.endpoint.lock().unwrap_or_else(|e| e.into_inner());
        if *endpoint != to {
            *endpoint = to;
            self.endpoint_gen.fetch_add(1, Ordering::Release);
        }
    }
}

/// Everything a packet's way through needs, replaced whole by a new configuration.
struct Runtime {
    config: DeviceConfig,
    keys: Option<(StaticSecret, PublicKey)>,
    peers: Vec<Arc<Peer>>,
    /// Positions in `peers`.
    by_key: HashMap<Key, usize>,
    by_index: HashMap<u32, usize>,
    routes: IpNetworkTable<usize>,
    /// Checks the MAC of every handshake message before any key work, and answers with cookies under load.
    limiter: Option<Arc<RateLimiter>>,
    /// The port the device's sockets are bound to (reported by `get=1`).
    bound_port: u16,
}

/// A WireGuard device's protocol side, shared by the tunnel's workers and the configuration socket.
pub struct WireGuard {
    /// Tells this instance's entries in the workers' caches from another's.
    id: u64,
    runtime: RwLock<Arc<Runtime>>,
    /// Bumped whenever `runtime` is replaced.
    generation: AtomicU64,
    ticks: AtomicU64,
}

/// What a worker thread keeps between packets, so that the common case (the same runtime, the same
/// destination, the same source) touches no lock and no shared counter but the peer's session.
struct Cache {
    owner: u64,
    generation: u64,
    rt: Arc<Runtime>,
    /// The last destination sealed for: (destination, peer position, the peer's `endpoint_gen`, endpoint).
    route: Option<(IpAddr, usize, u64, Option<SocketAddr>)>,
    /// The last authenticated source: (peer position, the peer's `endpoint_gen`, address).
    seen: Option<(usize, u64, SocketAddr)>,
    /// The last inner source address found allowed, and for which peer.
    allowed: Option<(IpAddr, usize)>,
}

thread_local! {
    static CACHE: RefCell<Option<Cache>> = const { RefCell::new(None) };
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for WireGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rt = self.runtime();
        f.debug_struct("WireGuard").field("peers", &rt.peers.len()).field("port", &rt.bound_port).finish()
    }
}

impl Default for WireGuard {
    fn default() -> Self {
        Self::new()
    }
}

/// The public key of a private key.
pub fn public_key(private: &Key) -> Key {
    PublicKey::from(&StaticSecret::from(*private)).to_bytes()
}

/// What `get=1` reports of one peer beyond its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerState {
    /// Where its datagrams go now.
    pub endpoint: Option<SocketAddr>,
    /// When the last handshake completed.
    pub last_handshake: Option<SystemTime>,
    /// Bytes of datagrams received from it.
    pub rx_bytes: u64,
    /// Bytes of datagrams sent to it.
    pub tx_bytes: u64,
}

impl WireGuard {
    /// A device with no key and no peer (it sends nothing until configured).
    pub fn new() -> Self {
        let runtime = Runtime {
            config: DeviceConfig::default(),
            keys: None,
            peers: Vec::new(),
            by_key: HashMap::new(),
            by_index: HashMap::new(),
            routes: IpNetworkTable::new(),
            limiter: None,
            bound_port: 0,
        };
        WireGuard {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            runtime: RwLock::new(Arc::new(runtime)),
            generation: AtomicU64::new(0),
            ticks: AtomicU64::new(0),
        }
    }

    fn runtime(&self) -> Arc<Runtime> {
        self.runtime.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the runtime (workers see it from their next packet).
    fn replace(&self, guard: &mut Arc<Runtime>, rt: Runtime) {
        *guard = Arc::new(rt);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Runs `f` with this thread's cache, refreshed if the runtime changed since.
    fn with_cache<R>(&self, f: impl FnOnce(&mut Cache) -> R) -> R {
        let generation = self.generation.load(Ordering::Acquire);
        CACHE.with(|cell| {
            let mut cell = cell.borrow_mut();
            let fresh = matches!(&*cell, Some(c) if c.owner == self.id && c.generation == generation);
            if !fresh {
                *cell = Some(Cache {
                    owner: self.id,
                    generation,
                    rt: self.runtime(),
                    route: None,
                    seen: None,
                    allowed: None,
                });
            }
            f(cell.as_mut().expect("filled above"))
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> DeviceConfig {
        self.runtime().config.clone()
    }

    /// The port the sockets are bound to.
    pub fn bound_port(&self) -> u16 {
        self.runtime().bound_port
    }

    /// Records the port the sockets were bound to.
    pub fn set_bound_port(&self, port: u16) {
        let mut guard = self.runtime.write().unwrap_or_else(|e| e.into_inner());
        let mut rt = Runtime::clone_shallow(&guard);
        rt.bound_port = port;
        self.replace(&mut guard, rt);
    }

    /// What each configured peer's session knows, in configuration order.
    pub fn peer_states(&self) -> Vec<PeerState> {
        let rt = self.runtime();
        let now = SystemTime::now();
        rt.peers
            .iter()
            .map(|p| {
                let since = p
                    .tunn
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                    .and_then(|t| t.time_since_last_handshake());
                PeerState {
                    endpoint: p.endpoint(),
                    last_handshake: since.and_then(|d| now.checked_sub(d)),
                    rx_bytes: p.rx_bytes.load(Ordering::Relaxed),
                    tx_bytes: p.tx_bytes.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Puts `config` in force: peers whose keys and settings are unchanged keep their sessions and counters; a
    /// new private key, preshared key or keepalive starts a peer's protocol afresh (boringtun has no way to
    /// change them in a session).
    pub fn apply(&self, mut config: DeviceConfig) {
        make_prefixes_exclusive(&mut config);
        let mut guard = self.runtime.write().unwrap_or_else(|e| e.into_inner());
        let old = guard.clone();
        let key_changed = config.private_key != old.config.private_key;
        let keys = config.private_key.map(|k| {
            let secret = StaticSecret::from(k);
            let public = PublicKey::from(&secret);
            (secret, public)
        });
        let limiter = keys.as_ref().map(|(_, public)| Arc::new(RateLimiter::new(public, HANDSHAKES_PER_SECOND)));
        let mut by_index: HashMap<u32, usize> = HashMap::new();
        let mut peers = Vec::with_capacity(config.peers.len());
        for pc in &config.peers {
            let made_with = (pc.preshared_key, pc.persistent_keepalive);
            let kept = old.by_key.get(&pc.public_key).map(|&i| &old.peers[i]);
            let old_peer = kept.filter(|p| !key_changed && p.made_with == made_with);
            let old_config = old.config.peers.iter().find(|o| o.public_key == pc.public_key);
            let peer = match old_peer {
                Some(p) => {
                    // A configured endpoint that changed is taken; one that did not leaves a roamed one be.
                    if pc.endpoint.is_some() && old_config.map(|o| o.endpoint) != Some(pc.endpoint) {
                        p.set_endpoint(pc.endpoint);
                    }
                    p.clone()
                }
                None => {
                    let index = loop {
                        let candidate = rand_core::OsRng.next_u32() & 0x00ff_ffff;
                        if !peers.iter().any(|p: &Arc<Peer>| p.index == candidate)
                            && !old.by_index.contains_key(&candidate)
                        {
                            break candidate;
                        }
                    };
                    let tunn = keys.as_ref().map(|(secret, _)| {
                        let keepalive = (pc.persistent_keepalive > 0).then_some(pc.persistent_keepalive);
                        Tunn::new(
                            secret.clone(),
                            PublicKey::from(pc.public_key),
                            pc.preshared_key,
                            keepalive,
                            index,
                            None,
                        )
                    });
                    let endpoint = pc.endpoint.or_else(|| kept.and_then(|p| p.endpoint()));
                    Arc::new(Peer {
                        public_key: pc.public_key,
                        index,
                        tunn: Mutex::new(tunn),
                        endpoint: Mutex::new(endpoint),
                        endpoint_gen: AtomicU64::new(0),
                        made_with,
                        rx_bytes: AtomicU64::new(kept.map_or(0, |p| p.rx_bytes.load(Ordering::Relaxed))),
                        tx_bytes: AtomicU64::new(kept.map_or(0, |p| p.tx_bytes.load(Ordering::Relaxed))),
                        held: AtomicU64::new(0),
                    })
                }
            };
            by_index.insert(peer.index, peers.len());
            peers.push(peer);
        }
        let mut routes = IpNetworkTable::new();
        for (i, pc) in config.peers.iter().enumerate() {
            for &(addr, len) in &pc.allowed_ips {
                if let Ok(net) = IpNetwork::new_truncate(addr, len) {
                    routes.insert(net, i);
                }
            }
        }
        let by_key = peers.iter().enumerate().map(|(i, p)| (p.public_key, i)).collect();
        let rt = Runtime { config, keys, peers, by_key, by_index, routes, limiter, bound_port: old.bound_port };
        self.replace(&mut guard, rt);
    }

    /// The peer a handshake initiation comes from, by the static key inside it.
    fn initiator(rt: &Runtime, init: &boringtun::noise::HandshakeInit<'_>) -> Option<usize> {
        let (secret, public) = rt.keys.as_ref()?;
        let half = parse_handshake_anon(secret, public, init).ok()?;
        rt.by_key.get(&half.peer_static_public).copied()
    }
}

impl Runtime {
    fn clone_shallow(rt: &Runtime) -> Runtime {
        Runtime {
            config: rt.config.clone(),
            keys: rt.keys.clone(),
            peers: rt.peers.clone(),
            by_key: rt.by_key.clone(),
            by_index: rt.by_index.clone(),
            routes: {
                let mut t = IpNetworkTable::new();
                for (net, &peer) in rt.routes.iter() {
                    t.insert(net, peer);
                }
                t
            },
            limiter: rt.limiter.clone(),
            bound_port: rt.bound_port,
        }
    }
}

/// The drop reason of a protocol error.
fn reason(e: &WireGuardError) -> DropReason {
    match e {
        WireGuardError::DuplicateCounter | WireGuardError::InvalidCounter => DropReason::Replayed,
        WireGuardError::NoCurrentSession | WireGuardError::ConnectionExpired => DropReason::NoSession,
        WireGuardError::IncorrectPacketLength
        | WireGuardError::WrongPacketType
        | WireGuardError::InvalidPacket
        | WireGuardError::UnexpectedPacket
        | WireGuardError::DestinationBufferTooSmall => DropReason::MalformedDatagram,
        _ => DropReason::Unauthenticated,
    }
}

/// Whether a message is a data message (type 4).
fn is_data(message: &[u8]) -> bool {
    message.first() == Some(&4)
}

impl Transform for WireGuard {
    fn overhead(&self) -> usize {
        DATA_OVERHEAD + HANDSHAKE_INIT_LEN
    }

    fn seal(&self, packet: &mut [u8], out: &mut [u8], control: &mut dyn FnMut(&[u8], SocketAddr)) -> Sealed {
        let Some(dst) = Tunn::dst_address(packet) else {
            return Sealed::Dropped(DropReason::Malformed);
        };
        self.with_cache(|cache| {
            let rt = &*cache.rt;
            let cached = cache
                .route
                .filter(|&(d, i, gen, _)| d == dst && rt.peers[i].endpoint_gen.load(Ordering::Acquire) == gen);
            let (position, endpoint) = match cached {
                Some((_, i, _, endpoint)) => (i, endpoint),
                None => {
                    let Some((_, &i)) = rt.routes.longest_match(dst) else {
                        return Sealed::Dropped(DropReason::NoPeer);
                    };
                    let gen = rt.peers[i].endpoint_gen.load(Ordering::Acquire);
                    let endpoint = rt.peers[i].endpoint();
                    cache.route = Some((dst, i, gen, endpoint));
                    (i, endpoint)
                }
            };
            let Some(endpoint) = endpoint else {
                return Sealed::Dropped(DropReason::NoPeer);
            };
            seal_for(&rt.peers[position], endpoint, packet, out, control)
        })
    }

    fn open(
        &self,
        datagram: &mut [u8],
        from: SocketAddr,
        out: &mut [u8],
        control: &mut dyn FnMut(&[u8], SocketAddr),
    ) -> Opened {
        self.with_cache(|cache| {
            let rt = &*cache.rt;
            let Some(limiter) = rt.limiter.as_ref() else {
                return Opened::Dropped(DropReason::Unauthenticated); // no key: nothing can be for us
            };
            let by_index = |receiver_idx: u32| rt.by_index.get(&(receiver_idx >> 8)).copied();
            let position = match Tunn::parse_incoming_packet(datagram) {
                Err(_) => return Opened::Dropped(DropReason::MalformedDatagram),
                Ok(Packet::HandshakeInit(_)) => {
                    // The MAC (and, under load, the cookie) before the key work a peer lookup costs.
                    let mut cookie = [0u8; 64];
                    match limiter.verify_packet(Some(from.ip()), datagram, &mut cookie) {
                        Ok(Packet::HandshakeInit(init)) => WireGuard::initiator(rt, &init),
                        Ok(_) => return Opened::Dropped(DropReason::MalformedDatagram),
                        Err(TunnResult::WriteToNetwork(reply)) => {
                            control(reply, from);
                            return Opened::Control;
                        }
                        Err(_) => return Opened::Dropped(DropReason::Unauthenticated),
                    }
                }
                Ok(Packet::HandshakeResponse(p)) => by_index(p.receiver_idx),
                Ok(Packet::PacketCookieReply(p)) => by_index(p.receiver_idx),
                Ok(Packet::PacketData(p)) => by_index(p.receiver_idx),
            };
            let Some(position) = position else {
                return Opened::Dropped(DropReason::Unauthenticated);
            };
            let peer = &rt.peers[position];
            let opened = open_from(peer, datagram, from, out, control);
            if opened.1 {
                // Authenticated: the peer is now at `from` (roaming). Looked at only when it may have moved.
                let gen = peer.endpoint_gen.load(Ordering::Acquire);
                if cache.seen != Some((position, gen, from)) {
                    peer.set_endpoint(Some(from));
                    cache.seen = Some((position, peer.endpoint_gen.load(Ordering::Acquire), from));
                }
            }
            match opened.0 {
                Opened::Packet { len } => {
                    // Cryptokey routing: the inner source must be one the sending peer may use (a flow's source
                    // is looked up once).
                    let allowed = match opened.2 {
                        Some(src) if cache.allowed == Some((src, position)) => true,
                        Some(src) => {
                            let ok = rt.routes.longest_match(src).is_some_and(|(_, &i)| i == position);
                            if ok {
                                cache.allowed = Some((src, position));
                            }
                            ok
                        }
                        None => false,
                    };
                    if allowed {
                        Opened::Packet { len }
                    } else {
                        Opened::Dropped(DropReason::NotAllowed)
                    }
                }
                other => other,
            }
        })
    }

    fn tick_interval(&self) -> Option<Duration> {
        Some(TICK)
    }

    fn tick(&self, control: &mut dyn FnMut(&[u8], SocketAddr)) -> Drops {
        let rt = self.runtime();
        let mut lost = Drops::default();
        if self.ticks.fetch_add(1, Ordering::Relaxed) % 4 == 0 {
            if let Some(limiter) = &rt.limiter {
                limiter.reset_count();
            }
        }
        let mut buf = [0u8; 256];
        for peer in &rt.peers {
            let mut guard = peer.tunn.lock().unwrap_or_else(|e| e.into_inner());
            let Some(tunn) = guard.as_mut() else { continue };
            match tunn.update_timers(&mut buf) {
                TunnResult::WriteToNetwork(message) => {
                    if let Some(endpoint) = peer.endpoint() {
                        peer.tx_bytes.fetch_add(message.len() as u64, Ordering::Relaxed);
                        control(message, endpoint);
                    }
                }
                TunnResult::Err(WireGuardError::ConnectionExpired) => {
                    // The protocol gave up on the handshake and dropped what it held.
                    lost.add(DropReason::NoSession, peer.held.swap(0, Ordering::Relaxed));
                }
                _ => {}
            }
        }
        lost
    }

    fn authenticates(&self) -> bool {
        true
    }
}

/// Seals `packet` for `peer` at `endpoint`.
fn seal_for(
    peer: &Peer,
    endpoint: SocketAddr,
    packet: &[u8],
    out: &mut [u8],
    control: &mut dyn FnMut(&[u8], SocketAddr),
) -> Sealed {
    let mut guard = peer.tunn.lock().unwrap_or_else(|e| e.into_inner());
    let Some(tunn) = guard.as_mut() else {
        return Sealed::Dropped(DropReason::NoSession);
    };
    let hold = |peer: &Peer| {
        if peer.held.fetch_add(1, Ordering::Relaxed) >= HELD_PER_PEER {
            peer.held.fetch_sub(1, Ordering::Relaxed);
            Sealed::Dropped(DropReason::NoSession)
        } else {
            Sealed::Held
        }
    };
    match tunn.encapsulate(packet, out) {
        TunnResult::WriteToNetwork(message) if is_data(message) => {
            let len = message.len();
            peer.tx_bytes.fetch_add(len as u64, Ordering::Relaxed);
            Sealed::Out { len, to: endpoint }
        }
        TunnResult::WriteToNetwork(handshake) => {
            // No session: the packet waits in the protocol, and a handshake starts.
            peer.tx_bytes.fetch_add(handshake.len() as u64, Ordering::Relaxed);
            control(handshake, endpoint);
            hold(peer)
        }
        TunnResult::Done => hold(peer),
        TunnResult::Err(e) => Sealed::Dropped(reason(&e)),
        TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => Sealed::Dropped(DropReason::Malformed),
    }
}

/// Opens a datagram from `peer`; also says whether it authenticated the peer at `from`, and the source address
/// of the packet inside.
fn open_from(
    peer: &Peer,
    datagram: &[u8],
    from: SocketAddr,
    out: &mut [u8],
    control: &mut dyn FnMut(&[u8], SocketAddr),
) -> (Opened, bool, Option<IpAddr>) {
    let datagram_len = datagram.len() as u64;
    let mut guard = peer.tunn.lock().unwrap_or_else(|e| e.into_inner());
    let Some(tunn) = guard.as_mut() else {
        return (Opened::Dropped(DropReason::Unauthenticated), false, None);
    };
    match tunn.decapsulate(Some(from.ip()), datagram, out) {
        TunnResult::WriteToTunnelV4(packet, src) => {
            peer.rx_bytes.fetch_add(datagram_len, Ordering::Relaxed);
            (Opened::Packet { len: packet.len() }, true, Some(src.into()))
        }
        TunnResult::WriteToTunnelV6(packet, src) => {
            peer.rx_bytes.fetch_add(datagram_len, Ordering::Relaxed);
            (Opened::Packet { len: packet.len() }, true, Some(src.into()))
        }
        TunnResult::WriteToNetwork(reply) => {
            // A handshake message, authenticated: answer it, then send what waited for the session.
            peer.rx_bytes.fetch_add(datagram_len, Ordering::Relaxed);
            peer.tx_bytes.fetch_add(reply.len() as u64, Ordering::Relaxed);
            control(reply, from);
            while let TunnResult::WriteToNetwork(message) = tunn.decapsulate(None, &[], out) {
                if is_data(message) {
                    let _ = peer.held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| h.checked_sub(1));
                }
                peer.tx_bytes.fetch_add(message.len() as u64, Ordering::Relaxed);
                control(message, from);
            }
            (Opened::Control, true, None)
        }
        TunnResult::Done => {
            // A keepalive (authenticated) or a cookie reply (not).
            peer.rx_bytes.fetch_add(datagram_len, Ordering::Relaxed);
            (Opened::Control, is_data(datagram), None)
        }
        TunnResult::Err(e) => (Opened::Dropped(reason(&e)), false, None),
    }
}

/// The text of a `get=1` reply (without the `errno=0` line and the empty line that end it).
pub fn render_get(wg: &WireGuard) -> String {
    use std::fmt::Write;
    let config = wg.config();
    let states = wg.peer_states();
    let mut out = String::new();
    if let Some(key) = &config.private_key {
        let _ = writeln!(out, "private_key={}", key_to_hex(key));
    }
    let port = wg.bound_port();
    if port != 0 {
        let _ = writeln!(out, "listen_port={port}");
    }
    if config.fwmark != 0 {
        let _ = writeln!(out, "fwmark={}", config.fwmark);
    }
    for (peer, state) in config.peers.iter().zip(states) {
        let _ = writeln!(out, "public_key={}", key_to_hex(&peer.public_key));
        let _ = writeln!(out, "preshared_key={}", key_to_hex(&peer.preshared_key.unwrap_or([0; 32])));
        let _ = writeln!(out, "protocol_version=1");
        if let Some(endpoint) = state.endpoint {
            let _ = writeln!(out, "endpoint={endpoint}");
        }
        let since_epoch = state.last_handshake.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
        let (sec, nsec) = since_epoch.map_or((0, 0), |d| (d.as_secs(), d.subsec_nanos()));
        let _ = writeln!(out, "last_handshake_time_sec={sec}");
        let _ = writeln!(out, "last_handshake_time_nsec={nsec}");
        let _ = writeln!(out, "tx_bytes={}", state.tx_bytes);
        let _ = writeln!(out, "rx_bytes={}", state.rx_bytes);
        let _ = writeln!(out, "persistent_keepalive_interval={}", peer.persistent_keepalive);
        for (addr, len) in &peer.allowed_ips {
            let _ = writeln!(out, "allowed_ip={addr}/{len}");
        }
    }
    out
}
