//! One peer at run time: its handshake keys, its sessions (current, previous and next, as the kernel keeps
//! them), the handshake under way, the packets held for it, and the timestamps its timers are judged by.
//!
//! The data path touches only atomics and the read side of the session lock; everything else (the handshake,
//! the timers, the held packets) belongs to the device's handshake worker, under `state`.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::SystemTime;

use zeroize::Zeroizing;

use crate::config::Key;
use crate::cookie::CookieJar;
use crate::noise::{Identity, InitiationState, PeerKeys};
use crate::session::Keypair;

/// Packets held for a peer while its handshake is under way (the kernel's MAX_STAGED_PACKETS); when more come,
/// the oldest is dropped and counted.
pub const HELD_PER_PEER: usize = 128;

/// A peer's sessions.
#[derive(Debug, Default, Clone)]
pub(crate) struct Keypairs {
    /// What packets are sealed with.
    pub current: Option<Arc<Keypair>>,
    /// The session before it, still opened for packets in flight.
    pub previous: Option<Arc<Keypair>>,
    /// A session this side answered a handshake for, used once the initiator's first message arrives with it.
    pub next: Option<Arc<Keypair>>,
}

impl Keypairs {
    /// The session whose index is `local_index`.
    pub(crate) fn find(&self, local_index: u32) -> Option<&Arc<Keypair>> {
        [&self.current, &self.previous, &self.next].into_iter().flatten().find(|k| k.local_index == local_index)
    }
}

/// A timer judged from timestamps: the event it belongs to, when it started, and whether it fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timer {
    /// The timestamp of the event that cancels it when it changes (our last send, or the last we heard).
    pub after: u64,
    /// When it started.
    pub start: u64,
    /// The timestamp of our last data when it fired (it is armed again only by later data); `None`: not fired.
    pub fired_at: Option<u64>,
}

/// What the handshake worker keeps of a peer.
#[derive(Debug, Default)]
pub(crate) struct HandshakeSide {
    /// Our initiation waiting for its response.
    pub pending: Option<InitiationState>,
    /// When the last initiation was sent (device clock, ms): none is sent within REKEY_TIMEOUT of it.
    pub last_initiation_sent: Option<u64>,
    /// Retransmissions of the current initiation so far.
    pub attempts: u32,
    /// When the initiation is sent again unless a response came.
    pub retransmit_at: Option<u64>,
    /// When every session is forgotten unless a new handshake completes.
    pub zero_keys_at: Option<u64>,
    /// The greatest initiation timestamp taken from the peer: an initiation not later than it is a replay.
    pub greatest_timestamp: [u8; 12],
    /// When the peer's last initiation was taken (device clock, ms): at most INITIATIONS_PER_SECOND.
    pub last_initiation_taken: Option<u64>,
    /// The cookie state of what we send the peer.
    pub cookies: CookieJar,
    /// The passive keepalive's timer: armed (at `start`) by the first data received after what we sent last
    /// (`sent`, the `sent_any_ms` it belongs to), fired KEEPALIVE_TIMEOUT later unless we send something.
    pub keepalive_timer: Option<Timer>,
    /// The new-handshake timer: armed by the first data sent after what we heard last (`heard`), fired
    /// KEEPALIVE_TIMEOUT + REKEY_TIMEOUT later unless we hear something; after firing, armed again only by data
    /// sent after it fired.
    pub silence_timer: Option<Timer>,
    /// Packets waiting for a session.
    pub held: VecDeque<Vec<u8>>,
}

/// Where a peer's datagrams go, and which transport data message put it there.
#[derive(Debug, Default)]
struct EndpointState {
    addr: Option<SocketAddr>,
    /// Our index of the session and the counter of the data message that moved it last (`None`: configured, or
    /// moved by a handshake message).
    moved_by: Option<(u32, u64)>,
}

/// A peer's handshake keys: none while the device has no private key; made from the device's identity (and
/// the peer's preshared key) at their first use, since a device of a million peers would otherwise hold a
/// million sets of keys that are never used.
enum KeySlot {
    NoIdentity,
    Of(Arc<Identity>),
    Made(Arc<PeerKeys>),
}

/// The handshake worker's state of a peer, made when first taken ([`Peer::state`]).
pub(crate) struct StateGuard<'a>(MutexGuard<'a, Option<Box<HandshakeSide>>>);

impl Deref for StateGuard<'_> {
    type Target = HandshakeSide;

    fn deref(&self) -> &HandshakeSide {
        self.0.as_deref().expect("made when taken")
    }
}

impl DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut HandshakeSide {
        self.0.as_deref_mut().expect("made when taken")
    }
}

/// One peer at run time.
///
/// Laid out in this order (`repr(C)`) for the two data workers that share it, the one sealing for the peer and
/// the one opening what it sends: what they read with every packet (`id`, the generations), what the sealing
/// one writes (`sent_*`, `tx_bytes`) and what the opening one writes (`received_*`, `rx_bytes`) each lie more
/// than a cache line (64 bytes) of fields the data path leaves alone from the others and from the reference
/// count before the peer, so that no worker's write takes a line another reads with every packet.
#[repr(C)]
pub(crate) struct Peer {
    // Cold: 112 bytes after the reference count.
    /// Its public key.
    pub public_key: Key,
    /// Its keys for handshakes, made at their first use.
    keys: RwLock<KeySlot>,
    /// The preshared key its keys were made with (to tell whether a new configuration changes it).
    pub preshared_key: Mutex<Zeroizing<Option<Key>>>,
    // Read with every packet.
    /// Tells it from every other peer of the process (a peer removed and added again is another).
    pub id: u64,
    /// Bumped with every change of the endpoint, so that workers keep a copy and look at the lock only then.
    pub endpoint_gen: AtomicU64,
    /// Bumped with every change of the sessions, for the workers' copies.
    pub keypairs_gen: AtomicU64,
    // Cold: 64 bytes.
    endpoint: Mutex<EndpointState>,
    // Written by the worker sealing for it.
    /// Bytes of datagrams sent to it.
    pub tx_bytes: AtomicU64,
    /// When an authenticated message (data, keepalive, handshake) / data was last sent to it, and received
    /// from it (device clock, ms; 0: never). Each is written at most once a millisecond, so that the sending
    /// and the receiving worker do not take a shared line from each other with every packet; the timers are
    /// judged from them by the handshake worker.
    pub sent_any_ms: AtomicU64,
    pub sent_data_ms: AtomicU64,
    // Cold: 88 bytes.
    keypairs: RwLock<Keypairs>,
    /// Made at its first use: a server's peers mostly never handshake, and it is the larger part of a peer.
    state: Mutex<Option<Box<HandshakeSide>>>,
    /// When the last handshake completed.
    pub last_handshake: Mutex<Option<SystemTime>>,
    // Written by the worker opening what it sends.
    /// Bytes of datagrams received from it.
    pub rx_bytes: AtomicU64,
    pub received_any_ms: AtomicU64,
    pub received_data_ms: AtomicU64,
    // Written rarely.
    /// Held packets dropped to make room, not yet reported.
    pub evicted: AtomicU64,
    /// Packets to it or from it dropped, whatever the reason (its own counter in the counters report).
    pub drops: AtomicU64,
    /// Seconds between keepalives when no other packet went either way (0: none).
    pub persistent_keepalive: AtomicU16,
    /// Whether a handshake was asked for because the session we initiated nears its end while we receive.
    pub sent_lastminute_handshake: AtomicBool,
    /// A handshake asked for by the data path (no session, or the session is old).
    pub wants_handshake: AtomicBool,
    /// A keepalive asked for (a persistent keepalive just configured).
    pub wants_keepalive: AtomicBool,
    /// Held packets to send now that a session can carry them.
    pub wants_flush: AtomicBool,
    /// Whether it is among the peers whose timers run (the device's live set).
    pub live: AtomicBool,
    /// Set once it is removed from the configuration: a worker's cache that still holds it lets go.
    pub removed: AtomicBool,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer").field("public_key", &crate::config::key_to_hex(&self.public_key)).finish()
    }
}

impl Peer {
    /// A peer with no session and no endpoint, whose handshake keys are made from `identity` at their first use.
    pub(crate) fn new(
        public_key: Key,
        identity: Option<&Arc<Identity>>,
        preshared_key: Option<Key>,
        keepalive: u16,
    ) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Peer {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            public_key,
            keys: RwLock::new(identity.map_or(KeySlot::NoIdentity, |identity| KeySlot::Of(identity.clone()))),
            preshared_key: Mutex::new(Zeroizing::new(preshared_key)),
            persistent_keepalive: AtomicU16::new(keepalive),
            endpoint: Mutex::new(EndpointState::default()),
            endpoint_gen: AtomicU64::new(0),
            keypairs: RwLock::new(Keypairs::default()),
            keypairs_gen: AtomicU64::new(0),
            state: Mutex::new(None),
            sent_any_ms: AtomicU64::new(0),
            sent_data_ms: AtomicU64::new(0),
            received_any_ms: AtomicU64::new(0),
            received_data_ms: AtomicU64::new(0),
            sent_lastminute_handshake: AtomicBool::new(false),
            wants_handshake: AtomicBool::new(false),
            wants_keepalive: AtomicBool::new(false),
            wants_flush: AtomicBool::new(false),
            evicted: AtomicU64::new(0),
            drops: AtomicU64::new(0),
            last_handshake: Mutex::new(None),
            rx_bytes: AtomicU64::new(0),
            tx_bytes: AtomicU64::new(0),
            live: AtomicBool::new(false),
            removed: AtomicBool::new(false),
        }
    }

    /// Its handshake keys (made now if they were not yet).
    pub(crate) fn keys(&self) -> Option<Arc<PeerKeys>> {
        match &*self.keys.read().unwrap_or_else(|e| e.into_inner()) {
            KeySlot::NoIdentity => return None,
            KeySlot::Made(keys) => return Some(keys.clone()),
            KeySlot::Of(_) => {}
        }
        let mut slot = self.keys.write().unwrap_or_else(|e| e.into_inner());
        if let KeySlot::Of(identity) = &*slot {
            let psk = self.preshared_key.lock().unwrap_or_else(|e| e.into_inner());
            *slot = KeySlot::Made(Arc::new(PeerKeys::new(identity, self.public_key, psk.as_ref())));
        }
        match &*slot {
            KeySlot::Made(keys) => Some(keys.clone()),
            _ => None,
        }
    }

    /// Whether its handshake keys have been made (for the tests of when they are).
    #[cfg(test)]
    pub(crate) fn keys_made(&self) -> bool {
        matches!(&*self.keys.read().unwrap_or_else(|e| e.into_inner()), KeySlot::Made(_))
    }

    /// Its handshake keys are to be made anew, from `identity` and the preshared key in force (a new private or
    /// preshared key); `None`: it has none (no private key, or the peer is removed). A handshake opened with the
    /// keys before is refused, as their `Arc` is not the new one.
    pub(crate) fn set_identity(&self, identity: Option<&Arc<Identity>>) {
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) =
            identity.map_or(KeySlot::NoIdentity, |identity| KeySlot::Of(identity.clone()));
    }

    /// Where its datagrams go.
    pub(crate) fn endpoint(&self) -> Option<SocketAddr> {
        self.endpoint.lock().unwrap_or_else(|e| e.into_inner()).addr
    }

    /// Moves it to `to` (configured, or where an authenticated handshake message came from).
    /// Returns whether it moved.
    pub(crate) fn set_endpoint(&self, to: Option<SocketAddr>) -> bool {
        let mut endpoint = self.endpoint.lock().unwrap_or_else(|e| e.into_inner());
        endpoint.moved_by = None;
        let moved = endpoint.addr != to;
        if moved {
            endpoint.addr = to;
            self.endpoint_gen.fetch_add(1, Ordering::Release);
        }
        moved
    }

    /// Moves it to `from`, the source of transport data message `counter` of the session we gave `local_index`,
    /// which just authenticated; unless a later message of the same session moved it already. The endpoint
    /// follows the newest message the peer sent, not the last one read: with several sockets (one per queue)
    /// two workers may take a peer's datagrams from its old and its new address at once, and the one that
    /// finishes last must not move it back. Returns whether the endpoint is `from` now.
    pub(crate) fn roam(&self, from: SocketAddr, local_index: u32, counter: u64) -> bool {
        let mut endpoint = self.endpoint.lock().unwrap_or_else(|e| e.into_inner());
        if endpoint.moved_by.is_some_and(|(index, newest)| index == local_index && counter < newest) {
            return endpoint.addr == Some(from);
        }
        endpoint.moved_by = Some((local_index, counter));
        if endpoint.addr != Some(from) {
            endpoint.addr = Some(from);
            self.endpoint_gen.fetch_add(1, Ordering::Release);
        }
        true
    }

    /// Its sessions, to read.
    pub(crate) fn keypairs(&self) -> Keypairs {
        self.keypairs.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Changes its sessions with `f`, returning the indices that no session holds any more. A session `f` takes
    /// out of the slots is erased at once ([`Keypair::erase`]), whoever still holds it.
    pub(crate) fn change_keypairs(&self, f: impl FnOnce(&mut Keypairs)) -> Vec<u32> {
        let mut keypairs = self.keypairs.write().unwrap_or_else(|e| e.into_inner());
        let before = keypairs.clone();
        f(&mut keypairs);
        self.keypairs_gen.fetch_add(1, Ordering::Release);
        let mut gone = Vec::new();
        for old in [before.current, before.previous, before.next].into_iter().flatten() {
            let kept = [&keypairs.current, &keypairs.previous, &keypairs.next]
                .into_iter()
                .flatten()
                .any(|k| Arc::ptr_eq(k, &old));
            if !kept {
                old.erase();
                gone.push(old.local_index);
            }
        }
        gone
    }

    /// It is removed from the configuration: marked so, and everything secret it holds erased
    /// ([`Peer::forget_secrets`]).
    pub(crate) fn remove(&self) {
        self.removed.store(true, Ordering::Release);
        self.forget_secrets();
    }

    /// Erases everything secret it holds, now that it is removed: its sessions, the handshake under way, its
    /// handshake keys. Returns the indices that no session or handshake holds any more.
    pub(crate) fn forget_secrets(&self) -> Vec<u32> {
        let mut gone = self.change_keypairs(|k| *k = Keypairs::default());
        if let Some(mut st) = self.state_if_made() {
            gone.extend(st.pending.take().map(|p| p.local_index));
        }
        self.set_identity(None);
        gone
    }

    /// What a new private key of the device does to this peer (the kernel's
    /// `wg_noise_expire_current_peer_keypairs`): the handshake under way is dropped and the next initiation may
    /// go at once; `current` and `next` stop sealing. The greatest timestamp taken from the peer stays, so that
    /// an initiation seen before is still a replay. Returns the index no handshake holds any more.
    pub(crate) fn expire_for_new_identity(&self) -> Option<u32> {
        let pending = self.state_if_made().and_then(|mut st| {
            st.last_initiation_sent = None;
            st.pending.take().map(|p| p.local_index)
        });
        self.change_keypairs(|k| {
            for keypair in [&k.current, &k.next].into_iter().flatten() {
                keypair.expire_sending();
            }
        });
        pending.filter(|&i| self.keypairs().find(i).is_none())
    }

    /// The handshake worker's state (made now if it was not yet).
    pub(crate) fn state(&self) -> StateGuard<'_> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.get_or_insert_with(Box::default);
        StateGuard(state)
    }

    /// The handshake worker's state, if it was ever made (a peer that never had any has nothing to look at).
    pub(crate) fn state_if_made(&self) -> Option<StateGuard<'_>> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.is_some().then_some(StateGuard(state))
    }

    /// Records `n` packets to it or from it dropped.
    pub(crate) fn dropped(&self, n: u64) {
        if n > 0 {
            self.drops.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Records that an authenticated message went to it at `now`.
    pub(crate) fn sent_authenticated(&self, now: u64) {
        store_if_changed(&self.sent_any_ms, now);
    }

    /// Records that data (not a keepalive) went to it at `now`.
    pub(crate) fn sent_data(&self, now: u64) {
        store_if_changed(&self.sent_any_ms, now);
        store_if_changed(&self.sent_data_ms, now);
    }

    /// Records that an authenticated message came from it at `now`, and whether it carried data.
    pub(crate) fn received_authenticated(&self, now: u64, data: bool) {
        store_if_changed(&self.received_any_ms, now);
        if data {
            store_if_changed(&self.received_data_ms, now);
        }
    }
}

/// Stores `value` unless it is there already: the common case then only reads a line other threads share.
fn store_if_changed(at: &AtomicU64, value: u64) {
    if at.load(Ordering::Relaxed) != value {
        at.store(value, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The layout the data path counts on (see [`Peer`]): more than a cache line between the reference count
    /// and each group of hot fields, and between the groups.
    #[test]
    fn test_the_hot_fields_of_each_worker_lie_a_cache_line_apart() {
        const LINE: usize = 64;
        let read = offset_of!(Peer, id)..offset_of!(Peer, keypairs_gen) + 8;
        let sealing = offset_of!(Peer, tx_bytes)..offset_of!(Peer, sent_data_ms) + 8;
        let opening = offset_of!(Peer, rx_bytes)..offset_of!(Peer, received_data_ms) + 8;
        // The reference count is written just before the peer (ArcInner: strong, weak, then the peer).
        assert!(read.start >= LINE, "{read:?}");
        assert!(sealing.start >= read.end + LINE, "{read:?} {sealing:?}");
        assert!(opening.start >= sealing.end + LINE, "{sealing:?} {opening:?}");
    }
}
