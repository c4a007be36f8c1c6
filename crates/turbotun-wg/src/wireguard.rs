//! WireGuard as a [`Transform`] of turbotun's tunnel engine: cryptokey routing over several peers and the
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
//! - The handshake worker (the engine's timer thread, woken through [`Transform::work_fd`]) does every
//!   Diffie-Hellman, answers with responses and cookie replies, and runs the timers (retransmission, keepalives,
//!   rekeying, key expiry, persistent keepalive).
//! - A peer's endpoint moves only to the source of a message that authenticated: transport data that opened, an
//!   initiation that proved its sender, a response that completed our handshake; never on a cookie reply or
//!   anything else.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use ip_network::IpNetwork;
use ip_network_table::IpNetworkTable;
use rand_core::{OsRng, RngCore};
use turbotun::tunnel::{Opened, Room, SealBatch, Sealed, Settled, Transform};
use turbotun::udp::{LocalAddr, ReplySources};
use turbotun::{DropReason, Drops};

use crate::config::{key_to_hex, DeviceConfig, Key};
use crate::cookie::{self, CookieChecker, MacState};
use crate::noise::{
    self, finish_initiation, open_initiation, Identity, MessageKind, PeerKeys, COOKIE_REPLY_LEN, DATA_HEADER_LEN,
    INITIATION_LEN, RESPONSE_LEN, TAG_LEN,
};
use crate::peer::{HandshakeSide, Keypairs, Peer, Timer};
use crate::session::{Keypair, OpenError, PADDING_MULTIPLE, REJECT_AFTER_MESSAGES, REKEY_AFTER_MESSAGES};

pub use crate::peer::HELD_PER_PEER;

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
const TICK: Duration = Duration::from_millis(250);

/// What a data message adds to its packet beyond the padding: header and tag.
const DATA_OVERHEAD: usize = DATA_HEADER_LEN + TAG_LEN;

/// Everything a packet's way through needs, replaced whole by a new configuration.
struct Runtime {
    config: DeviceConfig,
    identity: Option<Arc<Identity>>,
    peers: Vec<Arc<Peer>>,
    /// Positions in `peers`.
    by_key: HashMap<Key, usize>,
    routes: IpNetworkTable<usize>,
    /// The port the device's sockets are bound to (reported by `get=1`).
    bound_port: u16,
}

/// A handshake message waiting for the handshake worker.
struct Job {
    message: [u8; INITIATION_LEN],
    len: usize,
    from: SocketAddr,
    /// The local address it reached: recorded for replies to `from` if it authenticates.
    to: Option<LocalAddr>,
    /// Under load without a valid cookie: answered with a cookie reply and nothing else.
    needs_cookie: bool,
}

/// The handshake worker's queue and the file descriptor that wakes it.
struct HandshakeQueue {
    jobs: Mutex<VecDeque<Job>>,
    len: AtomicUsize,
    wake: OwnedFd,
}

impl HandshakeQueue {
    fn new() -> Self {
        use rustix::event::{eventfd, EventfdFlags};
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).expect("eventfd: a Linux kernel has it");
        HandshakeQueue { jobs: Mutex::new(VecDeque::new()), len: AtomicUsize::new(0), wake }
    }

    fn kick(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    fn drain_wake(&self) {
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.wake, &mut buf);
    }

    /// Queues `job` unless the queue is full.
    fn push(&self, job: Job) -> bool {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.len() >= MAX_QUEUED_HANDSHAKES {
            return false;
        }
        jobs.push_back(job);
        let len = jobs.len();
        self.len.store(len, Ordering::Relaxed);
        drop(jobs);
        // The worker empties the queue before it sleeps (and wakes itself while it is not empty): only the
        // first message into an empty queue needs to wake it, which keeps a flood from costing a write each.
        if len == 1 {
            self.kick();
        }
        true
    }

    fn pop(&self) -> Option<Job> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let job = jobs.pop_front();
        self.len.store(jobs.len(), Ordering::Relaxed);
        job
    }
}

/// A WireGuard device's protocol side, shared by the tunnel's workers and the configuration socket.
pub struct WireGuard {
    /// Tells this instance's entries in the workers' caches from another's.
    id: u64,
    runtime: RwLock<Arc<Runtime>>,
    /// Bumped whenever `runtime` is replaced.
    generation: AtomicU64,
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
    /// What the handshake worker made of the messages it took, not yet reported ([`Transform::settled`]).
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
    /// Moves the clock forward in tests of the timers.
    #[cfg(test)]
    skipped_ms: AtomicU64,
}

/// Lines a [`LogLimit`] lets through in each interval, and the interval (ms): the kernel's `net_ratelimit`
/// (a burst of 10 every 5 seconds).
const LOG_BURST: u32 = 10;
const LOG_INTERVAL: u64 = 5_000;

/// Debug lines about what others send, at most [`LOG_BURST`] each [`LOG_INTERVAL`]; how many were held back is
/// said with the first line of the next interval.
#[derive(Debug, Default)]
struct LogLimit {
    window: Mutex<LogWindow>,
}

#[derive(Debug, Default)]
struct LogWindow {
    /// When the interval began (device clock, ms; 0: none yet).
    start: u64,
    printed: u32,
    suppressed: u64,
}

impl LogLimit {
    /// Whether a line may go out at `now`, counting it either way.
    fn allow(&self, now: u64) -> bool {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.start == 0 || now >= w.start + LOG_INTERVAL {
            if w.suppressed > 0 {
                tracing::debug!("{} lines about refused handshake messages suppressed", w.suppressed);
            }
            *w = LogWindow { start: now, printed: 0, suppressed: 0 };
        }
        if w.printed < LOG_BURST {
            w.printed += 1;
            true
        } else {
            w.suppressed += 1;
            false
        }
    }

    /// `line` at debug level, if the limit lets it through at `now`.
    fn debug(&self, now: u64, line: std::fmt::Arguments<'_>) {
        if tracing::enabled!(tracing::Level::DEBUG) && self.allow(now) {
            tracing::debug!("{line}");
        }
    }
}

/// What a worker thread keeps between packets, so that the common case (the same runtime, destination, session
/// and source) touches no lock but the session's receive window.
struct Cache {
    owner: u64,
    generation: u64,
    rt: Arc<Runtime>,
    /// The last destination sealed for.
    route: Option<RouteCache>,
    /// The session last sealed with.
    sending: Option<SendCache>,
    /// The session last opened with.
    receiving: Option<ReceiveCache>,
    /// The last authenticated source.
    seen: Option<SeenSource>,
    /// The last inner source address found allowed.
    allowed: Option<AllowedSource>,
}

/// A destination and where it goes.
#[derive(Clone, Copy)]
struct RouteCache {
    destination: IpAddr,
    peer: usize,
    endpoint_gen: u64,
    endpoint: Option<SocketAddr>,
}

/// A peer and the session it sends with.
struct SendCache {
    /// The peer's position in the runtime.
    peer: usize,
    /// The peer's `keypairs_gen` when the session was looked up.
    keypairs_gen: u64,
    /// Its current session, if it has one.
    keypair: Option<Arc<Keypair>>,
}

/// A source a peer's message authenticated from, and the peer's endpoint generation then (its endpoint is
/// looked at again only when either changes).
#[derive(Clone, Copy, PartialEq, Eq)]
struct SeenSource {
    peer: usize,
    endpoint_gen: u64,
    from: SocketAddr,
}

/// An inner source address the peer at `peer` may use (cryptokey routing looked it up once).
#[derive(Clone, Copy, PartialEq, Eq)]
struct AllowedSource {
    source: IpAddr,
    peer: usize,
}

/// A receiver index and its session.
struct ReceiveCache {
    index: u32,
    keypairs_gen: u64,
    peer: Arc<Peer>,
    position: usize,
    keypair: Arc<Keypair>,
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
}

/// Whether `keypair` may still open at `now`.
fn usable(keypair: &Keypair, now: u64) -> bool {
    now < keypair.born_ms + REJECT_AFTER_TIME && keypair.sent() < REJECT_AFTER_MESSAGES
}

/// Whether `keypair` may still seal at `now`: usable, and not expired for sending by a change of our key.
fn sendable(keypair: &Keypair, now: u64) -> bool {
    usable(keypair, now) && !keypair.sending_expired()
}

/// The destination of an IP packet.
fn destination(packet: &[u8]) -> Option<IpAddr> {
    match packet.first()? >> 4 {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(packet.get(16..20)?).ok()?))),
        6 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(packet.get(24..40)?).ok()?))),
        _ => None,
    }
}

/// The IP packet at the start of a decrypted (and padded) payload, as [`inner_packet`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InnerPacket {
    /// Its length, as its header gives it (the padding after it is not the packet's).
    len: usize,
    /// Its source address, which cryptokey routing checks against the sending peer's allowed prefixes.
    source: IpAddr,
}

/// The length and source address of the IP packet at the start of a decrypted (and padded) payload; `None` when
/// it is not an IP packet or says it is longer than what arrived.
fn inner_packet(plain: &[u8]) -> Option<InnerPacket> {
    let (len, source) = match plain.first()? >> 4 {
        4 if plain.len() >= 20 => {
            let len = usize::from(u16::from_be_bytes([plain[2], plain[3]]));
            (len, IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&plain[12..16]).ok()?)))
        }
        6 if plain.len() >= 40 => {
            let len = 40 + usize::from(u16::from_be_bytes([plain[4], plain[5]]));
            (len, IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&plain[8..24]).ok()?)))
        }
        _ => return None,
    };
    let header = if matches!(source, IpAddr::V4(_)) { 20 } else { 40 };
    (header..=plain.len()).contains(&len).then_some(InnerPacket { len, source })
}

impl WireGuard {
    /// A device with no key and no peer (it sends nothing until configured).
    pub fn new() -> Self {
        let runtime = Runtime {
            config: DeviceConfig::default(),
            identity: None,
            peers: Vec::new(),
            by_key: HashMap::new(),
            routes: IpNetworkTable::new(),
            bound_port: 0,
        };
        WireGuard {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            runtime: RwLock::new(Arc::new(runtime)),
            generation: AtomicU64::new(0),
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
                    sending: None,
                    receiving: None,
                    seen: None,
                    allowed: None,
                });
            }
            f(cell.as_mut().expect("filled above"))
        })
    }

    /// The configuration in force (the private key taken from the identity: the runtime keeps no copy of it).
    pub fn config(&self) -> DeviceConfig {
        let rt = self.runtime();
        let mut config = rt.config.clone();
        config.private_key = rt.identity.as_ref().and_then(|identity| identity.private_key());
        config
    }

    /// The port the sockets are bound to.
    pub fn bound_port(&self) -> u16 {
        self.runtime().bound_port
    }

    /// Records the port the sockets were bound to.
    pub fn set_bound_port(&self, port: u16) {
        let mut guard = self.runtime.write().unwrap_or_else(|e| e.into_inner());
        let rt = Runtime { bound_port: port, ..Runtime::clone_shallow(&guard) };
        self.replace(&mut guard, rt);
    }

    /// Records the device's MTU: padding never makes a packet longer than it.
    pub fn set_mtu(&self, mtu: usize) {
        self.mtu.store(mtu, Ordering::Relaxed);
    }

    /// What each configured peer's session knows, in configuration order.
    pub fn peer_states(&self) -> Vec<PeerState> {
        self.runtime()
            .peers
            .iter()
            .map(|p| PeerState {
                endpoint: p.endpoint(),
                last_handshake: *p.last_handshake.lock().unwrap_or_else(|e| e.into_inner()),
                rx_bytes: p.rx_bytes.load(Ordering::Relaxed),
                tx_bytes: p.tx_bytes.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Puts `config` in force. Peers whose public key stays keep their sessions, counters and the greatest
    /// initiation timestamp taken from them; a new private key is taken as the kernel takes it: each peer's
    /// handshake keys are made anew, a handshake under way is dropped, and its sessions stop sealing (what the
    /// peer still sends with them is opened) until a handshake with the new key completes. A new preshared key
    /// is used from the next handshake; a persistent keepalive newly set sends a keepalive at once, as the kernel
    /// does.
    pub fn apply(&self, mut config: DeviceConfig) {
        let mut guard = self.runtime.write().unwrap_or_else(|e| e.into_inner());
        let old = guard.clone();
        // The private key lives in the identity alone (wiped in place when it changes): the runtime, which a
        // worker's cache may hold long after it is replaced, keeps none.
        let private_key = config.take_private_key();
        let identity_changed = private_key != old.identity.as_ref().and_then(|identity| identity.private_key());
        let identity = if identity_changed {
            private_key.as_ref().map(|k| Arc::new(Identity::new(k.as_bytes())))
        } else {
            old.identity.clone()
        };
        drop(private_key);
        let keys_for =
            |public: Key, psk: Option<Key>| identity.as_ref().map(|id| PeerKeys::new(id, public, psk.as_ref()));
        let mut peers = Vec::with_capacity(config.peers.len());
        let mut wake = false;
        let mut retired = Vec::new();
        let mut expiring = Vec::new();
        for pc in &config.peers {
            // The same peer only if it was not removed and added again since (replace_peers, remove).
            let old_config =
                old.config.peers.iter().find(|o| o.public_key == pc.public_key && o.incarnation == pc.incarnation);
            let kept = old_config.and(old.by_key.get(&pc.public_key)).map(|&i| old.peers[i].clone());
            let preshared_key = pc.preshared_key.as_ref().map(|k| *k.as_bytes());
            let peer = match kept {
                Some(p) => {
                    let mut psk = p.preshared_key.lock().unwrap_or_else(|e| e.into_inner());
                    if identity_changed || !crate::config::same_secret(psk.as_ref(), preshared_key.as_ref()) {
                        **psk = preshared_key;
                        p.set_keys(keys_for(pc.public_key, preshared_key));
                    }
                    drop(psk);
                    if identity_changed {
                        expiring.push(p.clone());
                    }
                    // A configured endpoint that changed is taken; one that did not leaves a roamed one be.
                    if pc.endpoint.is_some() && old_config.map(|o| o.endpoint) != Some(pc.endpoint) {
                        p.set_endpoint(pc.endpoint);
                    }
                    if p.persistent_keepalive.swap(pc.persistent_keepalive, Ordering::Relaxed) == 0
                        && pc.persistent_keepalive > 0
                    {
                        p.wants_keepalive.store(true, Ordering::Relaxed);
                        wake = true;
                    }
                    p
                }
                None => {
                    let keys = keys_for(pc.public_key, preshared_key);
                    let p = Peer::new(pc.public_key, keys, preshared_key, pc.persistent_keepalive);
                    p.set_endpoint(pc.endpoint);
                    if pc.persistent_keepalive > 0 {
                        p.wants_keepalive.store(true, Ordering::Relaxed);
                        wake = true;
                    }
                    Arc::new(p)
                }
            };
            peers.push(peer);
        }
        let gone: Vec<Arc<Peer>> =
            old.peers.iter().filter(|o| !peers.iter().any(|p| Arc::ptr_eq(p, o))).cloned().collect();
        let mut routes = IpNetworkTable::new();
        for (i, pc) in config.peers.iter().enumerate() {
            for &(addr, len) in &pc.allowed_ips {
                if let Ok(net) = IpNetwork::new_truncate(addr, len) {
                    routes.insert(net, i);
                }
            }
        }
        let by_key = peers.iter().enumerate().map(|(i, p)| (p.public_key, i)).collect();
        let rt = Runtime { config, identity, peers, by_key, routes, bound_port: old.bound_port };
        self.replace(&mut guard, rt);
        drop(guard);
        // What takes a peer's handshake state runs with the runtime's lock released: the handshake worker takes
        // that state first and the runtime after, so holding the runtime's write lock here would deadlock.
        for peer in &expiring {
            retired.extend(peer.expire_for_new_identity());
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
                peer.forget_secrets();
            }
            let mut indices = self.indices.write().unwrap_or_else(|e| e.into_inner());
            indices.retain(|_, p| !gone.iter().any(|g| Arc::ptr_eq(g, p)));
        }
        if wake {
            self.handshakes.kick();
        }
    }

    /// A new random index for `peer`, registered.
    fn new_index(&self, peer: &Arc<Peer>) -> u32 {
        let mut indices = self.indices.write().unwrap_or_else(|e| e.into_inner());
        loop {
            let candidate = OsRng.next_u32();
            if let std::collections::hash_map::Entry::Vacant(slot) = indices.entry(candidate) {
                slot.insert(peer.clone());
                return candidate;
            }
        }
    }

    /// Forgets indices no handshake or session holds any more.
    fn retire(&self, gone: &[u32]) {
        if gone.is_empty() {
            return;
        }
        let mut indices = self.indices.write().unwrap_or_else(|e| e.into_inner());
        for index in gone {
            indices.remove(index);
        }
    }

    fn peer_of_index(&self, index: u32) -> Option<Arc<Peer>> {
        self.indices.read().unwrap_or_else(|e| e.into_inner()).get(&index).cloned()
    }

    /// Whether handshake messages need a cookie now: the queue holds an eighth of what it may, or did within the
    /// last second (the kernel's rule).
    fn under_load(&self, now: u64) -> bool {
        if self.handshakes.len.load(Ordering::Relaxed) >= MAX_QUEUED_HANDSHAKES / 8 {
            self.under_load_until.store(now + UNDER_LOAD_FOR, Ordering::Relaxed);
            return true;
        }
        now < self.under_load_until.load(Ordering::Relaxed)
    }

    /// Whether a message just received finds the session `peer` sends with one we initiated that is within
    /// KEEPALIVE_TIMEOUT + REKEY_TIMEOUT of its end, with no last-minute handshake asked for yet (then it is).
    fn needs_lastminute_handshake(&self, peer: &Peer, now: u64) -> bool {
        if peer.sent_lastminute_handshake.load(Ordering::Acquire) {
            return false;
        }
        let due = peer
            .keypairs()
            .current
            .is_some_and(|k| k.initiator && sendable(&k, now) && now >= k.born_ms + LASTMINUTE_AGE);
        due && !peer.sent_lastminute_handshake.swap(true, Ordering::AcqRel)
    }

    /// Asks the handshake worker for a handshake with `peer`.
    fn request_handshake(&self, peer: &Peer) {
        if !peer.wants_handshake.swap(true, Ordering::AcqRel) {
            self.handshakes.kick();
        }
    }

    /// The data worker's part of a handshake message: the checks that cost no key work, then the queue.
    fn queue_handshake(
        &self,
        rt: &Runtime,
        kind: MessageKind,
        message: &[u8],
        from: SocketAddr,
        to: Option<LocalAddr>,
    ) -> Opened {
        let Some(identity) = rt.identity.as_ref() else {
            return Opened::Dropped(DropReason::Unauthenticated); // no key: nothing can be for us
        };
        // A full queue takes nothing: refused before even a MAC is computed, so that a flood costs the data
        // worker as little as it can.
        if self.handshakes.len.load(Ordering::Relaxed) >= MAX_QUEUED_HANDSHAKES {
            return Opened::Dropped(DropReason::RateLimited);
        }
        let mut needs_cookie = false;
        if kind != MessageKind::CookieReply {
            let now = self.now();
            let state = if self.under_load(now) {
                let mut checker = self.checker.lock().unwrap_or_else(|e| e.into_inner());
                checker.validate(&identity.mac1_key, message, from, true, Instant::now())
            } else if cookie::mac1_valid(&identity.mac1_key, message) {
                MacState::ValidMacWithCookie
            } else {
                MacState::Invalid
            };
            match state {
                MacState::Invalid => return Opened::Dropped(DropReason::Unauthenticated),
                MacState::ValidMacWithCookieButRateLimited => return Opened::Dropped(DropReason::RateLimited),
                MacState::ValidMacNoCookie => needs_cookie = true,
                MacState::ValidMacWithCookie => {}
            }
        }
        let mut job = Job { message: [0; INITIATION_LEN], len: message.len(), from, to, needs_cookie };
        job.message[..message.len()].copy_from_slice(message);
        if self.handshakes.push(job) {
            Opened::Queued
        } else {
            Opened::Dropped(DropReason::RateLimited)
        }
    }

    /// Opens a transport data message where it is.
    fn open_data(&self, cache: &mut Cache, datagram: &mut [u8], from: SocketAddr) -> Opened {
        let index = noise::receiver_index(MessageKind::Data, datagram);
        let fresh = matches!(&cache.receiving,
            Some(r) if r.index == index && r.peer.keypairs_gen.load(Ordering::Acquire) == r.keypairs_gen);
        if !fresh {
            cache.receiving = None;
            let Some(peer) = self.peer_of_index(index) else {
                return Opened::Dropped(DropReason::Unauthenticated);
            };
            let Some(&position) = cache.rt.by_key.get(&peer.public_key) else {
                return Opened::Dropped(DropReason::Unauthenticated);
            };
            if !Arc::ptr_eq(&cache.rt.peers[position], &peer) {
                return Opened::Dropped(DropReason::Unauthenticated);
            }
            let keypairs_gen = peer.keypairs_gen.load(Ordering::Acquire);
            let Some(keypair) = peer.keypairs().find(index).cloned() else {
                return Opened::Dropped(DropReason::Unauthenticated);
            };
            cache.receiving = Some(ReceiveCache { index, keypairs_gen, peer, position, keypair });
        }
        let r = cache.receiving.as_ref().expect("filled above");
        let now = self.now();
        if !usable(&r.keypair, now) {
            return Opened::Dropped(DropReason::NoSession);
        }
        let datagram_len = datagram.len() as u64;
        let (plain, counter) = match r.keypair.open(datagram) {
            Ok(opened) => opened,
            Err(OpenError::Unauthenticated) => return Opened::Dropped(DropReason::Unauthenticated),
            Err(OpenError::Replayed) => return Opened::Dropped(DropReason::Replayed),
        };
        let (peer, position, keypair) = (&r.peer, r.position, &r.keypair);
        peer.rx_bytes.fetch_add(datagram_len, Ordering::Relaxed);
        if !keypair.confirmed() {
            // The initiator's first message with the session we answered for: it becomes the one we send with.
            let next = keypair.clone();
            let gone = peer.change_keypairs(|k| {
                if k.next.as_ref().is_some_and(|n| Arc::ptr_eq(n, &next)) {
                    k.previous = k.current.take();
                    k.current = k.next.take();
                }
            });
            keypair.confirm();
            self.retire(&gone);
            *peer.last_handshake.lock().unwrap_or_else(|e| e.into_inner()) = Some(SystemTime::now());
            peer.wants_flush.store(true, Ordering::Release);
            self.handshakes.kick();
        }
        peer.received_authenticated(now, !plain.is_empty());
        // The kernel's keep_key_fresh on receiving: judged on the session we send with (`current`), which is never
        // older than the one a message came on; so only a message on a session that old needs the look.
        if now >= keypair.born_ms + LASTMINUTE_AGE && self.needs_lastminute_handshake(peer, now) {
            self.request_handshake(peer);
        }
        // Authenticated: the peer is now at `from` (roaming), unless a later message of the session came from
        // elsewhere (see `Peer::roam`). Looked at only when it may have moved.
        let endpoint_gen = peer.endpoint_gen.load(Ordering::Acquire);
        if cache.seen != Some(SeenSource { peer: position, endpoint_gen, from }) {
            // Left where a later message put it: looked at again with this source's next message.
            cache.seen = peer.roam(from, keypair.local_index, counter).then(|| SeenSource {
                peer: position,
                endpoint_gen: peer.endpoint_gen.load(Ordering::Acquire),
                from,
            });
        }
        if plain.is_empty() {
            return Opened::Control; // a keepalive
        }
        let Some(InnerPacket { len, source: src }) = inner_packet(plain) else {
            return Opened::Dropped(DropReason::Malformed);
        };
        // Cryptokey routing: the inner source must be one the sending peer may use (a flow's source is looked up
        // once).
        let allowed = cache.allowed == Some(AllowedSource { source: src, peer: position })
            || cache.rt.routes.longest_match(src).is_some_and(|(_, &i)| i == position);
        if !allowed {
            return Opened::Dropped(DropReason::NotAllowed);
        }
        cache.allowed = Some(AllowedSource { source: src, peer: position });
        // The packet stays where it was opened, behind the message header (the engine's room for its own).
        Opened::InPlace { start: DATA_HEADER_LEN, len }
    }
}

impl Runtime {
    fn clone_shallow(rt: &Runtime) -> Runtime {
        Runtime {
            config: rt.config.clone(),
            identity: rt.identity.clone(),
            peers: rt.peers.clone(),
            by_key: rt.by_key.clone(),
            routes: {
                let mut t = IpNetworkTable::new();
                for (net, &peer) in rt.routes.iter() {
                    t.insert(net, peer);
                }
                t
            },
            bound_port: rt.bound_port,
        }
    }
}

/// The handshake worker: handshake messages, requests from the data path, and timers.
impl WireGuard {
    /// Handles one queued handshake message: handled as the protocol's own, or refused for a reason.
    fn handle_job(
        &self,
        rt: &Runtime,
        job: &Job,
        control: &mut dyn FnMut(&[u8], SocketAddr),
    ) -> Result<(), DropReason> {
        let message = &job.message[..job.len];
        let identity = rt.identity.as_ref().ok_or(DropReason::Unauthenticated)?;
        let now = self.now();
        match MessageKind::of(message) {
            Some(MessageKind::Initiation | MessageKind::Response) if job.needs_cookie => {
                // Refused under load: its sender is told the cookie to come back with.
                self.send_cookie(identity, message, job.from, control);
                Err(DropReason::RateLimited)
            }
            Some(MessageKind::Initiation) => self.take_initiation(rt, identity, job, now, control),
            Some(MessageKind::Response) => self.take_response(identity, job, now, control),
            Some(MessageKind::CookieReply) => {
                let index = noise::receiver_index(MessageKind::CookieReply, message);
                let peer = self.peer_of_index(index).ok_or(DropReason::Unauthenticated)?;
                let keys = peer.keys().ok_or(DropReason::Unauthenticated)?;
                if peer.state().cookies.consume(&keys.cookie_key, message, Instant::now()) {
                    Ok(())
                } else {
                    self.refused_log.debug(now, format_args!("cookie reply from {} did not authenticate", job.from));
                    Err(DropReason::Unauthenticated)
                }
            }
            _ => Err(DropReason::MalformedDatagram),
        }
    }

    fn send_cookie(
        &self,
        identity: &Identity,
        message: &[u8],
        from: SocketAddr,
        control: &mut dyn FnMut(&[u8], SocketAddr),
    ) {
        let mut reply = [0u8; COOKIE_REPLY_LEN];
        let mut checker = self.checker.lock().unwrap_or_else(|e| e.into_inner());
        checker.reply(&identity.cookie_key, message, from, Instant::now(), &mut reply);
        drop(checker);
        control(&reply, from);
    }

    fn take_initiation(
        &self,
        rt: &Runtime,
        identity: &Identity,
        job: &Job,
        now: u64,
        control: &mut dyn FnMut(&[u8], SocketAddr),
    ) -> Result<(), DropReason> {
        let (message, from) = (&job.message[..job.len], job.from);
        let Some(opened) = open_initiation(identity, message) else {
            self.refused_log.debug(now, format_args!("handshake initiation from {from} did not authenticate"));
            return Err(DropReason::Unauthenticated);
        };
        let Some(peer) = rt.by_key.get(&opened.peer).map(|&i| rt.peers[i].clone()) else {
            self.refused_log.debug(now, format_args!("handshake initiation from {from} names no peer of ours"));
            return Err(DropReason::Unauthenticated);
        };
        let keys = peer.keys().ok_or(DropReason::Unauthenticated)?;
        let Some(consumed) = finish_initiation(opened, &keys, message) else {
            self.refused_log.debug(now, format_args!("handshake initiation from {from} did not authenticate"));
            return Err(DropReason::Unauthenticated);
        };
        let mut st = peer.state();
        // Opened with keys a configuration change has replaced since (a new private or preshared key): its session
        // would be of a retired key, as the kernel refuses it.
        if !peer.keys().is_some_and(|current| Arc::ptr_eq(&current, &keys)) {
            return Err(DropReason::Unauthenticated);
        }
        let flood = st.last_initiation_taken.is_some_and(|t| now < t + 1000 / INITIATIONS_PER_SECOND);
        if consumed.timestamp <= st.greatest_timestamp || flood {
            self.refused_log
                .debug(now, format_args!("handshake initiation from {from}: a replay or too soon after the last"));
            return Err(DropReason::Replayed);
        }
        st.greatest_timestamp = consumed.timestamp;
        st.last_initiation_taken = Some(now);
        let local_index = self.new_index(&peer);
        let mut response = [0u8; RESPONSE_LEN];
        let Some(session) = noise::create_response(&consumed, &keys, local_index, &mut response) else {
            self.retire(&[local_index]);
            return Err(DropReason::Unauthenticated);
        };
        st.cookies.stamp(&keys.mac1_key, &mut response, Instant::now());
        // Theirs supersedes any initiation of ours under way.
        if let Some(ours) = st.pending.take() {
            self.retire(&[ours.local_index]);
        }
        let keypair = Arc::new(Keypair::new(&session, local_index, consumed.remote_index, false, now));
        // The kernel's add_new_keypair for the responder: the new session waits as `next` (the old `next` goes),
        // and `previous` goes too; `current` stays until the initiator's first message confirms the new one.
        let gone = peer.change_keypairs(|k| {
            k.next = Some(keypair);
            k.previous = None;
        });
        self.retire(&gone);
        peer.set_endpoint(Some(from));
        self.authenticated(job);
        peer.rx_bytes.fetch_add(message.len() as u64, Ordering::Relaxed);
        peer.received_authenticated(now, false);
        control(&response, from);
        peer.tx_bytes.fetch_add(RESPONSE_LEN as u64, Ordering::Relaxed);
        peer.sent_authenticated(now);
        st.zero_keys_at = Some(now + 3 * REJECT_AFTER_TIME);
        Ok(())
    }

    fn take_response(
        &self,
        identity: &Identity,
        job: &Job,
        now: u64,
        control: &mut dyn FnMut(&[u8], SocketAddr),
    ) -> Result<(), DropReason> {
        let (message, from) = (&job.message[..job.len], job.from);
        let index = noise::receiver_index(MessageKind::Response, message);
        let peer = self.peer_of_index(index).ok_or(DropReason::Unauthenticated)?;
        let keys = peer.keys().ok_or(DropReason::Unauthenticated)?;
        let mut st = peer.state();
        let session = match &st.pending {
            Some(pending) if pending.local_index == index => noise::consume_response(identity, pending, &keys, message),
            _ => None,
        };
        let Some(session) = session else {
            self.refused_log.debug(
                now,
                format_args!("handshake response from {from} answers nothing under way or did not authenticate"),
            );
            return Err(DropReason::Unauthenticated);
        };
        st.pending = None;
        let keypair = Arc::new(Keypair::new(&session, index, noise::sender_index(message), true, now));
        keypair.confirm();
        let gone = peer.change_keypairs(|k| {
            match k.next.take() {
                Some(next) => k.previous = Some(next),
                None => k.previous = k.current.take(),
            }
            k.current = Some(keypair);
        });
        self.retire(&gone);
        peer.set_endpoint(Some(from));
        self.authenticated(job);
        peer.rx_bytes.fetch_add(message.len() as u64, Ordering::Relaxed);
        peer.received_authenticated(now, false);
        self.handshake_complete(&peer, &mut st, now);
        // What waited goes now; with nothing waiting, a keepalive confirms the session to the responder.
        self.send_keepalive(&peer, &keys, &mut st, now, control);
        Ok(())
    }

    /// Records, for replies to the sender of `job` (which authenticated), the local address it reached.
    fn authenticated(&self, job: &Job) {
        self.reply_sources.read().unwrap_or_else(|e| e.into_inner()).remember(job.from, job.to);
    }

    fn handshake_complete(&self, peer: &Peer, st: &mut HandshakeSide, now: u64) {
        st.retransmit_at = None;
        st.attempts = 0;
        st.zero_keys_at = Some(now + 3 * REJECT_AFTER_TIME);
        peer.sent_lastminute_handshake.store(false, Ordering::Relaxed);
        *peer.last_handshake.lock().unwrap_or_else(|e| e.into_inner()) = Some(SystemTime::now());
    }

    /// Sends an initiation to `peer` unless one went within REKEY_TIMEOUT; `retry` keeps the attempt count.
    fn send_initiation(
        &self,
        peer: &Arc<Peer>,
        keys: &PeerKeys,
        st: &mut HandshakeSide,
        retry: bool,
        now: u64,
        control: &mut dyn FnMut(&[u8], SocketAddr),
    ) {
        if !retry {
            st.attempts = 0;
        }
        if st.last_initiation_sent.is_some_and(|t| now < t + REKEY_TIMEOUT) || !keys.can_handshake() {
            return;
        }
        let Some(endpoint) = peer.endpoint() else { return };
        let Some(identity) = self.runtime().identity.clone() else { return };
        let local_index = self.new_index(peer);
        let mut message = [0u8; INITIATION_LEN];
        let Some(state) = noise::create_initiation(&identity, keys, local_index, SystemTime::now(), &mut message)
        else {
            self.retire(&[local_index]);
            return;
        };
        if let Some(old) = st.pending.replace(state) {
            if peer.keypairs().find(old.local_index).is_none() {
                self.retire(&[old.local_index]);
            }
        }
        st.cookies.stamp(&keys.mac1_key, &mut message, Instant::now());
        control(&message, endpoint);
        peer.tx_bytes.fetch_add(INITIATION_LEN as u64, Ordering::Relaxed);
        peer.sent_authenticated(now);
        st.last_initiation_sent = Some(now);
        st.retransmit_at = Some(now + REKEY_TIMEOUT + self.jitter());
    }

    /// Sends what is held for `peer` if a session can carry it (and a keepalive if nothing is), or starts a
    /// handshake.
    fn send_keepalive(
        &self,
        peer: &Arc<Peer>,
        keys: &PeerKeys,
        st: &mut HandshakeSide,
        now: u64,
        control: &mut dyn FnMut(&[u8], SocketAddr),
    ) {
        let current = peer.keypairs().current.filter(|k| sendable(k, now));
        let (Some(keypair), Some(endpoint)) = (current, peer.endpoint()) else {
            self.send_initiation(peer, keys, st, false, now, control);
            return;
        };
        let mtu = self.mtu.load(Ordering::Relaxed);
        let mut buf = Vec::new();
        let mut send = |packet: &[u8]| {
            buf.resize(packet.len() + DATA_OVERHEAD + PADDING_MULTIPLE, 0);
            match keypair.seal(packet, &mut buf, mtu) {
                Some((len, _)) => {
                    control(&buf[..len], endpoint);
                    peer.tx_bytes.fetch_add(len as u64, Ordering::Relaxed);
                    true
                }
                None => false,
            }
        };
        if st.held.is_empty() {
            if send(&[]) {
                peer.sent_authenticated(now);
            }
            return;
        }
        while let Some(packet) = st.held.pop_front() {
            if !send(&packet) {
                st.held.push_front(packet);
                break;
            }
            peer.sent_data(now);
        }
    }

    /// One peer's requests and timers.
    fn service_peer(&self, peer: &Arc<Peer>, now: u64, control: &mut dyn FnMut(&[u8], SocketAddr), lost: &mut Drops) {
        lost.add(DropReason::NoSession, peer.evicted.swap(0, Ordering::Relaxed));
        let Some(keys) = peer.keys() else { return };
        let mut st = peer.state();
        let flush = peer.wants_flush.swap(false, Ordering::AcqRel);
        if flush {
            self.handshake_complete(peer, &mut st, now);
        }
        // A session confirmed by the initiator's first message sends what waited for it, and nothing when nothing
        // did (the kernel's send_staged_packets with an empty queue): the confirming message already told the
        // initiator, and a keepalive here would stand in for the passive one that is due later.
        let keepalive = peer.wants_keepalive.swap(false, Ordering::AcqRel);
        if keepalive || (flush && !st.held.is_empty()) {
            self.send_keepalive(peer, &keys, &mut st, now, control);
        }
        if peer.wants_handshake.swap(false, Ordering::AcqRel) {
            let current = peer.keypairs().current.filter(|k| sendable(k, now));
            if current.is_some() && !st.held.is_empty() {
                self.send_keepalive(peer, &keys, &mut st, now, control);
            } else {
                self.send_initiation(peer, &keys, &mut st, false, now, control);
            }
        }
        if st.retransmit_at.is_some_and(|t| now >= t) {
            // The kernel's rule: retried while the count of retries is at most MAX_TIMER_HANDSHAKES, so the
            // initiation goes MAX_TIMER_HANDSHAKES + 2 times before this gives up.
            if st.attempts > MAX_TIMER_HANDSHAKES {
                tracing::debug!(
                    "handshake for peer {} did not complete after {} attempts, giving up",
                    key_to_hex(&peer.public_key),
                    st.attempts + 1
                );
                st.retransmit_at = None;
                st.keepalive_timer = None;
                lost.add(DropReason::NoSession, st.held.len() as u64);
                st.held.clear();
                st.zero_keys_at.get_or_insert(now + 3 * REJECT_AFTER_TIME);
            } else {
                st.attempts += 1;
                self.send_initiation(peer, &keys, &mut st, true, now, control);
            }
        }
        // Passive keepalive: data came after what we sent last, and nothing went back for KEEPALIVE_TIMEOUT.
        let sent = peer.sent_any_ms.load(Ordering::Relaxed);
        let got = peer.received_data_ms.load(Ordering::Relaxed);
        if got > sent {
            let timer = match st.keepalive_timer {
                Some(t) if t.after == sent => t,
                // First seen now: the data's time is within a tick of the first that came.
                _ => Timer { after: sent, start: got, fired_at: None },
            };
            st.keepalive_timer = Some(timer);
            if now >= timer.start + KEEPALIVE_TIMEOUT {
                st.keepalive_timer = None;
                self.send_keepalive(peer, &keys, &mut st, now, control);
            }
        } else {
            st.keepalive_timer = None;
        }
        // A new handshake after data went out and nothing was heard for KEEPALIVE_TIMEOUT + REKEY_TIMEOUT.
        let heard = peer.received_any_ms.load(Ordering::Relaxed);
        let sent_data = peer.sent_data_ms.load(Ordering::Relaxed);
        if sent_data > heard {
            let timer = match st.silence_timer {
                // Kept until what it waits for is heard; once fired, until more data goes out.
                Some(t) if t.after == heard && (t.fired_at.is_none() || t.fired_at == Some(sent_data)) => t,
                _ => Timer { after: heard, start: sent_data, fired_at: None },
            };
            st.silence_timer = Some(timer);
            if timer.fired_at.is_none() && now >= timer.start + KEEPALIVE_TIMEOUT + REKEY_TIMEOUT {
                st.silence_timer = Some(Timer { fired_at: Some(sent_data), ..timer });
                tracing::debug!(
                    "nothing heard from peer {} after sending, a new handshake",
                    key_to_hex(&peer.public_key)
                );
                self.send_initiation(peer, &keys, &mut st, false, now, control);
            }
        } else {
            st.silence_timer = None;
        }
        if st.zero_keys_at.is_some_and(|t| now >= t) {
            st.zero_keys_at = None;
            let mut gone = peer.change_keypairs(|k| *k = Keypairs::default());
            gone.extend(st.pending.take().map(|p| p.local_index));
            self.retire(&gone);
        }
        let interval = u64::from(peer.persistent_keepalive.load(Ordering::Relaxed)) * 1000;
        let last = peer.sent_any_ms.load(Ordering::Relaxed).max(peer.received_any_ms.load(Ordering::Relaxed));
        if interval > 0 && now >= last + interval {
            self.send_keepalive(peer, &keys, &mut st, now, control);
        }
    }

    fn add_settled(&self, more: &Settled) {
        let mut settled = self.settled.lock().unwrap_or_else(|e| e.into_inner());
        settled.control += more.control;
        settled.drops.add_all(&more.drops);
    }

    /// Lowers the handshake worker's priority once, so that key work yields to the data workers.
    fn nice_worker(&self) {
        if !self.worker_niced.swap(true, Ordering::Relaxed) {
            let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 10);
        }
    }
}

/// Where `packet` goes: the position of the peer whose AllowedIPs cover its destination, and that peer's
/// endpoint; or the answer for a packet that goes nowhere. Remembers the destination for the next packet.
fn route(cache: &mut Cache, packet: &[u8]) -> Result<(usize, SocketAddr), Sealed> {
    let Some(dst) = destination(packet) else {
        return Err(Sealed::Dropped(DropReason::Malformed));
    };
    let rt = &*cache.rt;
    let cached = cache
        .route
        .filter(|r| r.destination == dst && rt.peers[r.peer].endpoint_gen.load(Ordering::Acquire) == r.endpoint_gen);
    let route = match cached {
        Some(route) => route,
        None => {
            let Some((_, &i)) = rt.routes.longest_match(dst) else {
                return Err(Sealed::Unreachable(DropReason::NoPeer));
            };
            let endpoint_gen = rt.peers[i].endpoint_gen.load(Ordering::Acquire);
            let route = RouteCache { destination: dst, peer: i, endpoint_gen, endpoint: rt.peers[i].endpoint() };
            cache.route = Some(route);
            route
        }
    };
    route.endpoint.map(|endpoint| (route.peer, endpoint)).ok_or(Sealed::Unreachable(DropReason::NoPeer))
}

/// The session the peer at `position` of `rt` sends with, if it can still send at `now`; remembered in `sending`
/// (a worker's [`Cache::sending`]) until the peer's sessions change.
fn sending_keypair<'a>(
    rt: &Runtime,
    sending: &'a mut Option<SendCache>,
    position: usize,
    now: u64,
) -> Option<&'a Keypair> {
    let peer = &rt.peers[position];
    let keypairs_gen = peer.keypairs_gen.load(Ordering::Acquire);
    let fresh = sending.as_ref().is_some_and(|s| s.peer == position && s.keypairs_gen == keypairs_gen);
    if !fresh {
        *sending = Some(SendCache { peer: position, keypairs_gen, keypair: peer.keypairs().current });
    }
    sending.as_ref()?.keypair.as_deref().filter(|k| sendable(k, now))
}

impl WireGuard {
    /// Records that `bytes` of transport data up to message `last` left for `peer` with `keypair`, and asks for a
    /// new handshake when the session has sent enough (either side) or, for its initiator, is old: the kernel's
    /// `keep_key_fresh` on sending (only the age waits for the initiator, so that both sides do not rekey at once).
    fn sent(&self, peer: &Peer, keypair: &Keypair, bytes: u64, last: u64, now: u64) {
        peer.tx_bytes.fetch_add(bytes, Ordering::Relaxed);
        peer.sent_data(now);
        if last >= REKEY_AFTER_MESSAGES || (keypair.initiator && now >= keypair.born_ms + REKEY_AFTER_TIME) {
            self.request_handshake(peer);
        }
    }

    /// A packet no session can carry: held for the handshake the worker is asked for (the oldest held dropped
    /// beyond [`HELD_PER_PEER`]), or dropped when the peer cannot make one.
    fn hold(&self, peer: &Peer, packet: &[u8]) -> Sealed {
        if !peer.keys().is_some_and(|k| k.can_handshake()) {
            return Sealed::Dropped(DropReason::NoSession);
        }
        let mut st = peer.state();
        if st.held.len() >= HELD_PER_PEER {
            st.held.pop_front();
            peer.evicted.fetch_add(1, Ordering::Relaxed);
        }
        st.held.push_back(packet.to_vec());
        drop(st);
        self.request_handshake(peer);
        Sealed::Held
    }

    /// Seals packets `run` of `batch`, all for the peer at `position` at `endpoint`, where they are: one counter
    /// step for the run, one update of the peer's counters and timers. Packets past the session's last message,
    /// or all of them without a session, are held for a handshake.
    fn seal_run(
        &self,
        cache: &mut Cache,
        batch: &mut SealBatch<'_, '_>,
        run: Range<usize>,
        (position, endpoint): (usize, SocketAddr),
        mtu: usize,
    ) {
        let now = self.now();
        let mut sealed = run.start;
        let Cache { rt, sending, .. } = cache;
        let peer = &rt.peers[position];
        // The key is held for the run: a session erased meanwhile seals nothing, its packets are held instead.
        let sealing = sending_keypair(rt, sending, position, now).and_then(|k| Some((k, k.sealer()?)));
        if let Some((keypair, sealer)) = sealing {
            let counters = keypair.take_counters(run.len());
            let mut bytes = 0;
            let last = counters.end.saturating_sub(1);
            for counter in counters {
                let i = sealed;
                sealed += 1;
                let message =
                    batch.room(i).and_then(|room| sealer.seal_in_place(room.buf, room.start, room.len, counter, mtu));
                match message {
                    Some(message) => {
                        bytes += message.len() as u64;
                        batch.set(i, Sealed::Grown { start: message.start, len: message.len(), to: endpoint });
                    }
                    // The tunnel sizes its buffers by `seal_room`: only a caller that did not is short.
                    None => batch.set(i, Sealed::Dropped(DropReason::TooBig)),
                }
            }
            if bytes > 0 {
                self.sent(peer, keypair, bytes, last, now);
            }
        }
        for i in sealed..run.end {
            let answer = self.hold(peer, batch.packet(i));
            batch.set(i, answer);
        }
    }
}

impl Transform for WireGuard {
    fn overhead(&self) -> usize {
        DATA_OVERHEAD + PADDING_MULTIPLE - 1
    }

    fn seal(&self, packet: &mut [u8], out: &mut [u8], _control: &mut dyn FnMut(&[u8], SocketAddr)) -> Sealed {
        let mtu = self.mtu.load(Ordering::Relaxed);
        self.with_cache(|cache| {
            let (position, endpoint) = match route(cache, packet) {
                Ok(route) => route,
                Err(answer) => return answer,
            };
            let now = self.now();
            let Cache { rt, sending, .. } = cache;
            let peer = &rt.peers[position];
            if let Some(keypair) = sending_keypair(rt, sending, position, now) {
                if let Some((len, counter)) = keypair.seal(packet, out, mtu) {
                    self.sent(peer, keypair, len as u64, counter, now);
                    return Sealed::Out { len, to: endpoint };
                }
            }
            self.hold(peer, packet)
        })
    }

    fn seal_room(&self) -> Room {
        Room { front: DATA_HEADER_LEN, back: PADDING_MULTIPLE - 1 + TAG_LEN }
    }

    /// Runs of packets to one peer: one route look-up for a run of one destination, one counter step and one
    /// update of the peer's counters and timers per run, each packet sealed where it was read.
    fn seal_batch(&self, batch: &mut SealBatch<'_, '_>, _control: &mut dyn FnMut(&[u8], SocketAddr)) {
        let mtu = self.mtu.load(Ordering::Relaxed);
        let n = batch.len();
        self.with_cache(|cache| {
            let mut start = 0;
            let mut routed = (n > 0).then(|| route(cache, batch.packet(0)));
            while let Some(first) = routed.take() {
                let (position, endpoint) = match first {
                    Ok(route) => route,
                    Err(answer) => {
                        batch.set(start, answer);
                        start += 1;
                        routed = (start < n).then(|| route(cache, batch.packet(start)));
                        continue;
                    }
                };
                // The run: the packets after it that go to the same peer at the same endpoint.
                let mut end = start + 1;
                while end < n {
                    let next = route(cache, batch.packet(end));
                    if next != Ok((position, endpoint)) {
                        routed = Some(next);
                        break;
                    }
                    end += 1;
                }
                self.seal_run(cache, batch, start..end, (position, endpoint), mtu);
                start = end;
            }
        });
        crate::config::scrub_data_path_stack();
    }

    fn opened_batch(&self) {
        crate::config::scrub_data_path_stack();
    }

    fn open(
        &self,
        datagram: &mut [u8],
        from: SocketAddr,
        to: Option<LocalAddr>,
        _out: &mut [u8],
        _control: &mut dyn FnMut(&[u8], SocketAddr),
    ) -> Opened {
        let Some(kind) = MessageKind::of(datagram) else {
            return Opened::Dropped(DropReason::MalformedDatagram);
        };
        self.with_cache(|cache| match kind {
            MessageKind::Data => self.open_data(cache, datagram, from),
            _ => {
                let rt = cache.rt.clone();
                self.queue_handshake(&rt, kind, datagram, from, to)
            }
        })
    }

    fn tick_interval(&self) -> Option<Duration> {
        Some(TICK)
    }

    fn reply_sources(&self, sources: ReplySources) {
        *self.reply_sources.write().unwrap_or_else(|e| e.into_inner()) = sources;
    }

    fn work_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.handshakes.wake.as_fd())
    }

    fn tick(&self, control: &mut dyn FnMut(&[u8], SocketAddr)) -> Drops {
        self.nice_worker();
        self.handshakes.drain_wake();
        let rt = self.runtime();
        let mut settled = Settled::default();
        for _ in 0..HANDSHAKES_PER_CALL {
            let Some(job) = self.handshakes.pop() else { break };
            match self.handle_job(&rt, &job, control) {
                Ok(()) => settled.control += 1,
                Err(reason) => settled.drops.add(reason, 1),
            }
        }
        self.add_settled(&settled);
        if self.handshakes.len.load(Ordering::Relaxed) > 0 {
            self.handshakes.kick(); // more to do: back at once, after the timers
        }
        let now = self.now();
        self.checker.lock().unwrap_or_else(|e| e.into_inner()).expire(Instant::now());
        let mut lost = Drops::default();
        for peer in &rt.peers {
            self.service_peer(peer, now, control, &mut lost);
        }
        // Key work (handshake messages, initiations, keepalives) leaves copies of secrets in the frames it used:
        // overwritten before the worker sleeps.
        crate::config::scrub_stack();
        lost
    }

    fn settled(&self, stopping: bool) -> Settled {
        let mut settled = std::mem::take(&mut *self.settled.lock().unwrap_or_else(|e| e.into_inner()));
        if stopping {
            while self.handshakes.pop().is_some() {
                settled.drops.add(DropReason::Stopped, 1);
            }
        }
        settled
    }

    fn authenticates(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
