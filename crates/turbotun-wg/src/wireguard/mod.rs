//! WireGuard as a [`Transform`](turbotun::tunnel::Transform) of turbotun's tunnel engine: cryptokey routing over several peers and the
//! protocol itself, with the kernel implementation's semantics.
//!
//! - Sealing (a data worker): the packet's destination picks the peer (longest-prefix match over every peer's
//!   AllowedIPs); no peer, or a peer without a known endpoint, is a `no_peer` drop. With a session the packet is
//!   padded to a multiple of 16 bytes (within the MTU) and sealed in the worker's buffer; without one it is held
//!   (at most [`HELD_PER_PEER`] a peer, the oldest dropped beyond) and the handshake worker is asked for a
//!   handshake.
//! - Opening (a data worker): transport data by the index our side gave the session, in place; a packet whose
//!   source the sending peer may not use is a `not_allowed` drop. Handshake messages get only cheap checks here
//!   (mac1; under load the cookie and the source's rate), then go to the handshake worker's bounded queue, so
//!   that no flood of them spends a data worker's time on key work.
//! - The handshake worker (the engine's timer thread, woken through [`Transform::work_fd`](turbotun::tunnel::Transform::work_fd)) does every
//!   Diffie-Hellman, answers with responses and cookie replies, and runs the timers (retransmission, keepalives,
//!   rekeying, key expiry, persistent keepalive).
//! - A peer's endpoint moves only to the source of a message that authenticated: transport data that opened, an
//!   initiation that proved its sender, a response that completed our handshake; never on a cookie reply or
//!   anything else.
//!
//! The type is split by protocol phase: the configuration and the state it replaces here, `index` the indices
//! our side gives out, `handshake` the handshake queue and worker, `timers` each peer's timers, `data`
//! routing, sealing and opening, `transform` the engine's calls mapped onto them.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use ip_network::IpNetwork;
use ip_network_table::IpNetworkTable;
use rand_core::{OsRng, RngCore};
use turbotun::stats_socket::PeerCounters;
use turbotun::tunnel::Settled;
use turbotun::udp::ReplySources;

use crate::config::{DeviceConfig, Key, PeerConfig};
use crate::cookie::CookieChecker;
use crate::events::EventBus;
use crate::message::{DATA_HEADER_LEN, TAG_LEN};
use crate::noise::Identity;
use crate::peer::Peer;
use crate::session::{Keypair, REJECT_AFTER_MESSAGES};

/// The protocol's timers, in milliseconds (the kernel's `messages.h`).
const REKEY_AFTER_TIME: u64 = 120_000;
const REJECT_AFTER_TIME: u64 = 180_000;
const REKEY_TIMEOUT: u64 = 5_000;
/// Up to this much is added to each handshake retransmission, so that peers do not retry in step.
const REKEY_TIMEOUT_JITTER: u64 = 333;
const KEEPALIVE_TIMEOUT: u64 = 10_000;
/// The age of a session we initiated past which a message received asks for a new handshake.
const LASTMINUTE_AGE: u64 = REJECT_AFTER_TIME - KEEPALIVE_TIMEOUT - REKEY_TIMEOUT;
/// Retransmissions of one handshake before it is given up (REKEY_ATTEMPT_TIME, 90 s, over REKEY_TIMEOUT).
const MAX_TIMER_HANDSHAKES: u32 = 18;
/// Initiations a second taken from one peer (more are a flood, even with fresh timestamps).
const INITIATIONS_PER_SECOND: u64 = 50;
/// Handshake messages waiting for the handshake worker, at most; under load from an eighth of it.
const MAX_QUEUED_HANDSHAKES: usize = 4096;
/// How long the device stays under load after its queue was last that long.
const UNDER_LOAD_FOR: u64 = 1_000;
/// Queued handshake messages handled per wake-up, so that the timers run however long the queue stays full.
const HANDSHAKES_PER_CALL: usize = 256;

/// How often the protocol's timers run.
pub(crate) const TICK: Duration = Duration::from_millis(250);

/// What a data message adds to its packet beyond the padding: header and tag.
const DATA_OVERHEAD: usize = DATA_HEADER_LEN + TAG_LEN;

/// What a packet's way through needs of the device itself, replaced whole when its key, port or mark changes.
struct Runtime {
    /// The device's settings (its `peers` always empty: they are the [`PeerTable`]'s).
    config: DeviceConfig,
    identity: Option<Arc<Identity>>,
    /// The port the device's sockets are bound to (reported by `get=1`).
    bound_port: u16,
}

/// The configured peers, found by public key: each one's configuration (what `set=1` changes and `get=1`
/// reports) and its state at run time. Changed in place, by what a request changes.
#[derive(Default)]
pub(crate) struct PeerTable {
    by_key: HashMap<Key, PeerEntry>,
    /// The order the next peer added gets (`get=1` lists peers in the order they were added).
    next_order: u64,
}

struct PeerEntry {
    config: PeerConfig,
    order: u64,
    peer: Arc<Peer>,
}

impl PeerTable {
    /// How many peers there are.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// The configuration of the peer with `key`.
    pub(crate) fn config(&self, key: &Key) -> Option<&PeerConfig> {
        self.by_key.get(key).map(|e| &e.config)
    }

    /// The peers in the order they were added.
    fn ordered(&self) -> Vec<&PeerEntry> {
        let mut entries: Vec<&PeerEntry> = self.by_key.values().collect();
        entries.sort_unstable_by_key(|e| e.order);
        entries
    }
}

/// What one configuration request changes: the device's settings (whole), whether every peer goes first, and
/// each peer it touched, as it leaves it (`None`: removed), in the order first touched. A peer whose
/// `incarnation` differs from the one configured is a new peer of the same key (removed and added again).
#[derive(Debug, Default)]
pub(crate) struct ConfigChange {
    pub(crate) device: DeviceConfig,
    pub(crate) replace_peers: bool,
    pub(crate) peers: Vec<(Key, Option<PeerConfig>)>,
}

/// A WireGuard device's protocol side, shared by the tunnel's workers and the configuration socket.
pub(crate) struct WireGuard {
    /// Tells this instance's entries in the workers' caches from another's.
    id: u64,
    runtime: RwLock<Arc<Runtime>>,
    /// The peers. Taken for writing only by a configuration change; the data path reads it only when its cache
    /// misses.
    peers: RwLock<PeerTable>,
    /// Cryptokey routing: every peer's allowed prefixes, to the peer (one table over all peers).
    routes: RwLock<IpNetworkTable<Arc<Peer>>>,
    /// Bumped whenever `runtime`, `peers` or `routes` change: the workers' caches are then rebuilt.
    generation: AtomicU64,
    /// The peers whose timers run (see `timers`): those with a session, a handshake, held packets, a request
    /// of the data path or a persistent keepalive. An idle peer costs the timers nothing.
    live: Mutex<Vec<Arc<Peer>>>,
    /// Every index our side gave out (handshakes under way and sessions), to its peer.
    indices: RwLock<HashMap<u32, Arc<Peer>>>,
    /// The device clock's start: timers count milliseconds from here (1 is the first).
    start: Instant,
    /// The device's MTU, which padding never goes past (0: unknown).
    mtu: AtomicUsize,
    handshakes: HandshakeQueue,
    checker: Mutex<CookieChecker>,
    /// Until when (device clock) handshake messages need a cookie.
    under_load_until: AtomicU64,
    /// What the handshake worker made of the messages it took, not yet reported ([`Transform::settled`](turbotun::tunnel::Transform::settled)).
    settled: Mutex<Settled>,
    /// Whether the handshake worker's thread has been given its lower priority.
    worker_niced: AtomicBool,
    /// Where replies to each remote leave from (the tunnel's table): a handshake message that authenticated
    /// records its sender's local address there before anything answers it.
    reply_sources: RwLock<ReplySources>,
    jitter: AtomicU64,
    /// The debug lines about handshake messages refused, limited as the kernel limits its own: whoever sends
    /// them chooses how many there are.
    refused_log: LogLimit,
    /// The interface's name, which every log line about a peer starts with (empty until the daemon names it).
    name: RwLock<String>,
    /// Where handshakes completed, endpoints moved and keys expired are reported.
    pub(crate) events: EventBus,
    /// Moves the clock forward in tests of the timers.
    #[cfg(test)]
    skipped_ms: AtomicU64,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for WireGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peers = self.peers.read().unwrap_or_else(|e| e.into_inner()).len();
        f.debug_struct("WireGuard").field("peers", &peers).field("port", &self.runtime().bound_port).finish()
    }
}

impl Default for WireGuard {
    fn default() -> Self {
        Self::new()
    }
}

/// The public key of a private key.
pub fn public_key(private: &Key) -> Key {
    Identity::new(private).public
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
    /// Packets to or from it that were dropped (for any reason counted against a peer).
    pub drops: u64,
}

/// A peer as wireguard-go's log names it: `peer(ABCD…WXYZ)`, the ends of its public key in the base64 `wg show`
/// prints.
pub(crate) fn peer_tag(key: &Key) -> String {
    use base64::Engine as _;
    let text = base64::engine::general_purpose::STANDARD.encode(key);
    format!("peer({}…{})", &text[..4], &text[text.len() - 5..text.len() - 1])
}

/// What `get=1` reports of `peer` now.
fn state_of(peer: &Peer) -> PeerState {
    PeerState {
        endpoint: peer.endpoint(),
        last_handshake: *peer.last_handshake.lock().unwrap_or_else(|e| e.into_inner()),
        rx_bytes: peer.rx_bytes.load(Ordering::Relaxed),
        tx_bytes: peer.tx_bytes.load(Ordering::Relaxed),
        drops: peer.drops.load(Ordering::Relaxed),
    }
}

/// Whether `keypair` may still open at `now`.
fn usable(keypair: &Keypair, now: u64) -> bool {
    now < keypair.born_ms + REJECT_AFTER_TIME && keypair.sent() < REJECT_AFTER_MESSAGES
}

/// Whether `keypair` may still seal at `now`: usable, and not expired for sending by a change of our key.
fn sendable(keypair: &Keypair, now: u64) -> bool {
    usable(keypair, now) && !keypair.sending_expired()
}

impl WireGuard {
    /// A device with no key and no peer (it sends nothing until configured).
    pub(crate) fn new() -> Self {
        let runtime = Runtime { config: DeviceConfig::default(), identity: None, bound_port: 0 };
        WireGuard {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            runtime: RwLock::new(Arc::new(runtime)),
            peers: RwLock::default(),
            routes: RwLock::new(IpNetworkTable::new()),
            generation: AtomicU64::new(0),
            live: Mutex::default(),
            indices: RwLock::new(HashMap::new()),
            start: Instant::now(),
            mtu: AtomicUsize::new(0),
            handshakes: HandshakeQueue::new(),
            checker: Mutex::new(CookieChecker::new()),
            under_load_until: AtomicU64::new(0),
            settled: Mutex::new(Settled::default()),
            worker_niced: AtomicBool::new(false),
            reply_sources: RwLock::default(),
            jitter: AtomicU64::new(OsRng.next_u64() | 1),
            refused_log: LogLimit::default(),
            name: RwLock::default(),
            events: EventBus::default(),
            #[cfg(test)]
            skipped_ms: AtomicU64::new(0),
        }
    }

    /// Milliseconds on the device clock (never 0).
    fn now(&self) -> u64 {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX) + 1;
        #[cfg(test)]
        let now = now + self.skipped_ms.load(Ordering::Relaxed);
        now
    }

    /// A pseudo-random delay in `0..REKEY_TIMEOUT_JITTER` (xorshift: the jitter needs no secrecy).
    fn jitter(&self) -> u64 {
        let mut x = self.jitter.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter.store(x, Ordering::Relaxed);
        x % REKEY_TIMEOUT_JITTER
    }

    fn runtime(&self) -> Arc<Runtime> {
        self.runtime.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the runtime (workers see it from their next packet).
    fn replace(&self, guard: &mut Arc<Runtime>, rt: Runtime) {
        *guard = Arc::new(rt);
        self.generation.fetch_add(1, Ordering::Release);
    }

    fn peer_table(&self) -> std::sync::RwLockReadGuard<'_, PeerTable> {
        self.peers.read().unwrap_or_else(|e| e.into_inner())
    }

    fn route_table(&self) -> std::sync::RwLockReadGuard<'_, IpNetworkTable<Arc<Peer>>> {
        self.routes.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The peer with public key `key`, if one is configured.
    pub(super) fn peer_by_key(&self, key: &Key) -> Option<Arc<Peer>> {
        self.peer_table().by_key.get(key).map(|e| e.peer.clone())
    }

    /// The device's settings in force, without its peers (the private key taken from the identity: the runtime
    /// keeps no copy of it).
    pub(crate) fn device_config(&self) -> DeviceConfig {
        let rt = self.runtime();
        let mut config = rt.config.clone();
        config.private_key = rt.identity.as_ref().and_then(|identity| identity.private_key());
        config
    }

    /// The configuration in force.
    pub(crate) fn config(&self) -> DeviceConfig {
        let table = self.peer_table();
        let mut config = self.device_config();
        config.peers = table.ordered().into_iter().map(|e| e.config.clone()).collect();
        config
    }

    /// What a configuration request reads while it is applied line by line: the device's settings, the peers
    /// and the owner of each prefix, as they stand (nothing changes them meanwhile but a configuration change,
    /// which waits for the view to go).
    pub(crate) fn config_view(&self) -> ConfigView<'_> {
        ConfigView { device: self.device_config(), peers: self.peer_table(), routes: self.route_table() }
    }

    /// Each peer's configuration and what its session knows, in the order they were added, read at one
    /// instant.
    pub(crate) fn peers_with_state(&self) -> Vec<(PeerConfig, PeerState)> {
        self.peer_table().ordered().into_iter().map(|e| (e.config.clone(), state_of(&e.peer))).collect()
    }

    /// The configuration and state of the peer with public key `key`.
    pub(crate) fn peer_with_state(&self, key: &Key) -> Option<(PeerConfig, PeerState)> {
        self.peer_table().by_key.get(key).map(|e| (e.config.clone(), state_of(&e.peer)))
    }

    /// The port the sockets are bound to.
    pub(crate) fn bound_port(&self) -> u16 {
        self.runtime().bound_port
    }

    /// Records the port the sockets were bound to.
    pub(crate) fn set_bound_port(&self, port: u16) {
        let mut guard = self.runtime.write().unwrap_or_else(|e| e.into_inner());
        let rt = Runtime { config: guard.config.clone(), identity: guard.identity.clone(), bound_port: port };
        self.replace(&mut guard, rt);
    }

    /// Names the interface in the log lines about its peers (as wireguard-go's log names it).
    pub(crate) fn set_name(&self, name: &str) {
        *self.name.write().unwrap_or_else(|e| e.into_inner()) = name.to_string();
    }

    /// A debug line about `peer`, as wireguard-go's verbose log writes it: `NAME: peer(ABCD…WXYZ) - what`.
    pub(super) fn peer_event(&self, peer: &Key, what: std::fmt::Arguments<'_>) {
        if tracing::enabled!(tracing::Level::DEBUG) {
            self.device_event(format_args!("{} - {what}", peer_tag(peer)));
        }
    }

    /// A debug line about the device itself: `NAME: what`.
    pub(super) fn device_event(&self, what: std::fmt::Arguments<'_>) {
        if tracing::enabled!(tracing::Level::DEBUG) {
            let name = self.name.read().unwrap_or_else(|e| e.into_inner());
            tracing::debug!("{name}: {what}");
        }
    }

    /// Records the device's MTU: padding never makes a packet longer than it.
    pub(crate) fn set_mtu(&self, mtu: usize) {
        self.mtu.store(mtu, Ordering::Relaxed);
    }

    /// Each peer's counters as the counters socket serves them (public keys in base64, as `wg` prints them), in
    /// the order the peers were added.
    pub(crate) fn peer_counters(&self) -> Vec<PeerCounters> {
        use base64::Engine as _;
        let base64 = base64::engine::general_purpose::STANDARD;
        let table = self.peer_table();
        let entries = table.ordered();
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let state = state_of(&entry.peer);
            let mut counters = PeerCounters::new(base64.encode(entry.config.public_key));
            counters.endpoint = state.endpoint.map(|e| e.to_string());
            counters.allowed_ips = entry.config.allowed_ips.iter().map(|(addr, len)| format!("{addr}/{len}")).collect();
            counters.latest_handshake =
                state.last_handshake.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map(|d| d.as_secs());
            (counters.rx_bytes, counters.tx_bytes, counters.drops) = (state.rx_bytes, state.tx_bytes, state.drops);
            out.push(counters);
        }
        out
    }

    /// How many peers are configured.
    pub(crate) fn peer_count(&self) -> usize {
        self.peer_table().len()
    }

    /// What each configured peer's session knows, in configuration order.
    #[cfg(test)]
    pub(crate) fn peer_states(&self) -> Vec<PeerState> {
        self.peer_table().ordered().into_iter().map(|e| state_of(&e.peer)).collect()
    }

    /// Puts `config` in force. Peers whose public key stays keep their sessions, counters and the greatest
    /// initiation timestamp taken from them; a new private key is taken as the kernel takes it: each peer's
    /// handshake keys are made anew, a handshake under way is dropped, and its sessions stop sealing (what the
    /// peer still sends with them is opened) until a handshake with the new key completes. A new preshared key
    /// is used from the next handshake; a persistent keepalive newly set sends a keepalive at once, as the kernel
    /// does.
    #[cfg(test)]
    pub(crate) fn apply(&self, mut config: DeviceConfig) {
        let peers = std::mem::take(&mut config.peers);
        let mut change = ConfigChange { device: config, replace_peers: false, peers: Vec::new() };
        {
            let table = self.peer_table();
            let staying: HashSet<Key> = peers.iter().map(|p| p.public_key).collect();
            change.peers.extend(table.by_key.keys().filter(|k| !staying.contains(*k)).map(|k| (*k, None)));
        }
        change.peers.extend(peers.into_iter().map(|p| (p.public_key, Some(p))));
        self.apply_change(change);
    }

    /// Puts a configuration change in force, at a cost in proportion to what it changes (all peers when it
    /// replaces them or the private key changes), with [`WireGuard::apply`]'s meaning.
    pub(crate) fn apply_change(&self, mut change: ConfigChange) {
        let mut guard = self.runtime.write().unwrap_or_else(|e| e.into_inner());
        let old = guard.clone();
        // The private key lives in the identity alone (wiped in place when it changes): the runtime, which a
        // worker's cache may hold long after it is replaced, keeps none.
        let private_key = change.device.take_private_key();
        let identity_changed = private_key != old.identity.as_ref().and_then(|identity| identity.private_key());
        let identity = if identity_changed {
            private_key.as_ref().map(|k| Arc::new(Identity::new(k.as_bytes())))
        } else {
            old.identity.clone()
        };
        drop(private_key);
        let mut table = self.peers.write().unwrap_or_else(|e| e.into_inner());
        let mut routes = self.routes.write().unwrap_or_else(|e| e.into_inner());
        let mut gone: Vec<Arc<Peer>> = Vec::new();
        let mut woken: Vec<Arc<Peer>> = Vec::new();
        if change.replace_peers {
            if !table.by_key.is_empty() {
                self.device_event(format_args!("Removing all {} peers", table.by_key.len()));
            }
            gone.extend(table.by_key.drain().map(|(_, e)| e.peer));
            *routes = IpNetworkTable::new();
        }
        // First every touched peer's prefixes that it does not keep leave the routes (a prefix moved between
        // two touched peers is then given to its new holder below), and peers removed or made anew go.
        for (key, new) in &change.peers {
            let Some(entry) = table.by_key.get(key) else { continue };
            let same = new.as_ref().filter(|n| n.incarnation == entry.config.incarnation);
            let kept: HashSet<&(IpAddr, u8)> = same.map(|n| n.allowed_ips.iter().collect()).unwrap_or_default();
            for prefix in entry.config.allowed_ips.iter().filter(|p| !kept.contains(p)) {
                if same.is_some() {
                    self.peer_event(key, format_args!("Removing allowed IP {}/{}", prefix.0, prefix.1));
                }
                if let Ok(net) = IpNetwork::new_truncate(prefix.0, prefix.1) {
                    if routes.exact_match(net).is_some_and(|p| Arc::ptr_eq(p, &entry.peer)) {
                        routes.remove(net);
                    }
                }
            }
            if same.is_none() {
                if let Some(entry) = table.by_key.remove(key) {
                    self.peer_event(key, format_args!("Removed"));
                    gone.push(entry.peer);
                }
            }
        }
        for (key, new) in std::mem::take(&mut change.peers) {
            let Some(pc) = new else { continue };
            let preshared_key = pc.preshared_key.as_ref().map(|k| *k.as_bytes());
            let peer = match table.by_key.get_mut(&key) {
                Some(entry) => {
                    let p = entry.peer.clone();
                    let mut psk = p.preshared_key.lock().unwrap_or_else(|e| e.into_inner());
                    let psk_changed = !crate::config::same_secret(psk.as_ref(), preshared_key.as_ref());
                    if psk_changed {
                        **psk = preshared_key;
                    }
                    // Released first: making the keys takes the preshared key's lock after the keys' own.
                    drop(psk);
                    // (With a new private key every peer's keys are made anew below.)
                    if psk_changed && !identity_changed {
                        p.set_identity(identity.as_ref());
                    }
                    // A configured endpoint that changed is taken; one that did not leaves a roamed one be.
                    if let Some(endpoint) = pc.endpoint.filter(|_| entry.config.endpoint != pc.endpoint) {
                        self.peer_event(&key, format_args!("Updating endpoint to {endpoint}"));
                        p.set_endpoint(pc.endpoint);
                    }
                    if psk_changed {
                        self.peer_event(&key, format_args!("Updating preshared key"));
                    }
                    if entry.config.persistent_keepalive != pc.persistent_keepalive {
                        let interval = pc.persistent_keepalive;
                        self.peer_event(&key, format_args!("Updating persistent keepalive interval to {interval} s"));
                    }
                    if tracing::enabled!(tracing::Level::DEBUG) {
                        let had: HashSet<&(IpAddr, u8)> = entry.config.allowed_ips.iter().collect();
                        for prefix in pc.allowed_ips.iter().filter(|p| !had.contains(p)) {
                            self.peer_event(&key, format_args!("Adding allowed IP {}/{}", prefix.0, prefix.1));
                        }
                    }
                    if p.persistent_keepalive.swap(pc.persistent_keepalive, Ordering::Relaxed) == 0
                        && pc.persistent_keepalive > 0
                    {
                        p.wants_keepalive.store(true, Ordering::SeqCst);
                        woken.push(p.clone());
                    }
                    entry.config = pc;
                    p
                }
                None => {
                    let p = Arc::new(Peer::new(key, identity.as_ref(), preshared_key, pc.persistent_keepalive));
                    p.set_endpoint(pc.endpoint);
                    if tracing::enabled!(tracing::Level::DEBUG) {
                        let endpoint = pc.endpoint.map_or("none".to_string(), |e| e.to_string());
                        let prefixes: Vec<String> = pc.allowed_ips.iter().map(|(a, l)| format!("{a}/{l}")).collect();
                        self.peer_event(
                            &key,
                            format_args!("Created (endpoint {endpoint}, allowed IPs {})", prefixes.join(", ")),
                        );
                    }
                    if pc.persistent_keepalive > 0 {
                        p.wants_keepalive.store(true, Ordering::SeqCst);
                        woken.push(p.clone());
                    }
                    let order = table.next_order;
                    table.next_order += 1;
                    table.by_key.insert(key, PeerEntry { config: pc, order, peer: p.clone() });
                    p
                }
            };
            let entry = &table.by_key[&key];
            for &(addr, len) in &entry.config.allowed_ips {
                if let Ok(net) = IpNetwork::new_truncate(addr, len) {
                    routes.insert(net, peer.clone());
                }
            }
        }
        // A new private key: every peer's handshake keys are made anew, and those it had expire.
        let mut expiring = Vec::new();
        if identity_changed {
            self.device_event(format_args!("Private key changed: every peer's handshake keys made anew"));
            for entry in table.by_key.values() {
                entry.peer.set_identity(identity.as_ref());
                expiring.push(entry.peer.clone());
            }
        }
        let rt = Runtime { config: change.device, identity, bound_port: old.bound_port };
        self.replace(&mut guard, rt);
        drop(routes);
        drop(table);
        drop(guard);
        // What takes a peer's handshake state runs with the locks above released: the handshake worker takes
        // that state first and the runtime after, so holding the runtime's write lock here would deadlock.
        let mut retired = Vec::new();
        for peer in &expiring {
            retired.extend(peer.expire_for_new_identity());
            if !self.idle(peer) {
                self.mark_live(peer);
            }
        }
        self.retire(&retired);
        if identity_changed {
            if let Some(old_identity) = &old.identity {
                old_identity.erase();
            }
        }
        // Peers gone (or made anew) take their indices with them, and their secrets are erased at once (a worker's
        // cache may hold the peer until its next packet).
        if !gone.is_empty() {
            for peer in &gone {
                peer.remove();
            }
            let gone: HashSet<*const Peer> = gone.iter().map(Arc::as_ptr).collect();
            let mut indices = self.indices.write().unwrap_or_else(|e| e.into_inner());
            indices.retain(|_, p| !gone.contains(&Arc::as_ptr(p)));
        }
        for peer in &woken {
            self.mark_live(peer);
        }
        if !woken.is_empty() {
            self.handshakes.kick();
        }
    }

    /// Puts `peer` among those whose timers run (once: a peer there already is not added again).
    pub(super) fn mark_live(&self, peer: &Arc<Peer>) {
        if !peer.live.swap(true, Ordering::SeqCst) {
            self.live.lock().unwrap_or_else(|e| e.into_inner()).push(peer.clone());
        }
    }
}

/// A configuration as a request being applied reads it (see [`WireGuard::config_view`]).
pub(crate) struct ConfigView<'a> {
    pub(crate) device: DeviceConfig,
    pub(crate) peers: std::sync::RwLockReadGuard<'a, PeerTable>,
    routes: std::sync::RwLockReadGuard<'a, IpNetworkTable<Arc<Peer>>>,
}

impl ConfigView<'_> {
    /// The public key of the peer holding `prefix`.
    pub(crate) fn owner(&self, prefix: (IpAddr, u8)) -> Option<Key> {
        let net = IpNetwork::new_truncate(prefix.0, prefix.1).ok()?;
        self.routes.exact_match(net).map(|p| p.public_key)
    }
}

use handshake::{HandshakeQueue, LogLimit};

mod data;
mod handshake;
mod index;
#[cfg(test)]
mod tests;
mod timers;
mod transform;
