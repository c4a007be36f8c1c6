//! The data path: a worker's state between packets, cryptokey routing (a packet's destination to its peer, an
//! opened packet's source checked against the peer's AllowedIPs), sealing runs of packets and opening transport
//! data in place.

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use turbotun::tunnel::{Opened, SealBatch, Sealed};
use turbotun::wire::{ipv4, ipv6};
use turbotun::DropReason;

use super::{sendable, usable, Runtime, WireGuard, LASTMINUTE_AGE, REKEY_AFTER_TIME};
use crate::events::Event;
use crate::message::{DataHeader, DATA_HEADER_LEN};
use crate::peer::{Peer, HELD_PER_PEER};
use crate::session::{Keypair, OpenError, REKEY_AFTER_MESSAGES};

/// What a worker thread keeps between packets, so that the common case (the same runtime, destination, session
/// and source) touches no lock but the session's receive window.
pub(super) struct WorkerState {
    pub(super) owner: u64,
    pub(super) generation: u64,
    pub(super) rt: Arc<Runtime>,
    /// The last destination sealed for.
    pub(super) route: Option<RouteCache>,
    /// The session last sealed with.
    pub(super) sending: Option<SendCache>,
    /// The session last opened with.
    pub(super) receiving: Option<ReceiveCache>,
    /// The last authenticated source.
    pub(super) seen: Option<SeenSource>,
    /// The last inner source address found allowed.
    pub(super) allowed: Option<AllowedSource>,
}

/// A destination and where it goes.
#[derive(Clone)]
pub(super) struct RouteCache {
    destination: IpAddr,
    pub(super) peer: Arc<Peer>,
    endpoint_gen: u64,
    endpoint: Option<SocketAddr>,
}

/// A peer and the session it sends with.
pub(super) struct SendCache {
    /// The peer's [`Peer::id`].
    peer: u64,
    /// The peer's `keypairs_gen` when the session was looked up.
    keypairs_gen: u64,
    /// Its current session, if it has one.
    keypair: Option<Arc<Keypair>>,
}

/// A source a peer's message authenticated from, and the peer's endpoint generation then (its endpoint is
/// looked at again only when either changes).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct SeenSource {
    peer: u64,
    endpoint_gen: u64,
    from: SocketAddr,
}

/// An inner source address the peer `peer` ([`Peer::id`]) may use (cryptokey routing looked it up once).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct AllowedSource {
    source: IpAddr,
    peer: u64,
}

/// A receiver index and its session.
pub(super) struct ReceiveCache {
    index: u32,
    keypairs_gen: u64,
    peer: Arc<Peer>,
    keypair: Arc<Keypair>,
}

thread_local! {
    static WORKER_STATE: RefCell<Option<WorkerState>> = const { RefCell::new(None) };
}

/// The destination of an IP packet. Read through the header views unchecked past the fixed header's length: the
/// kernel routes by the destination field without looking at the header length, and so does this.
fn destination(packet: &[u8]) -> Option<IpAddr> {
    match packet.first()? >> 4 {
        4 if packet.len() >= ipv4::MIN_HEADER_LEN => Some(IpAddr::from(ipv4::Packet::new_unchecked(packet).dst_addr())),
        6 if packet.len() >= ipv6::HEADER_LEN => Some(IpAddr::from(ipv6::Packet::new_unchecked(packet).dst_addr())),
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
    let (len, source, header) = match plain.first()? >> 4 {
        4 if plain.len() >= ipv4::MIN_HEADER_LEN => {
            let ip = ipv4::Packet::new_unchecked(plain);
            (usize::from(ip.total_len()), IpAddr::from(ip.src_addr()), ipv4::MIN_HEADER_LEN)
        }
        6 if plain.len() >= ipv6::HEADER_LEN => {
            let ip = ipv6::Packet::new_unchecked(plain);
            (ipv6::HEADER_LEN + usize::from(ip.payload_len()), IpAddr::from(ip.src_addr()), ipv6::HEADER_LEN)
        }
        _ => return None,
    };
    (header..=plain.len()).contains(&len).then_some(InnerPacket { len, source })
}

/// The session `peer` sends with, if it can still send at `now`; remembered in `sending` (a worker's
/// [`WorkerState::sending`]) until the peer's sessions change.
pub(super) fn sending_keypair<'a>(peer: &Peer, sending: &'a mut Option<SendCache>, now: u64) -> Option<&'a Keypair> {
    let keypairs_gen = peer.keypairs_gen.load(Ordering::Acquire);
    let fresh = sending.as_ref().is_some_and(|s| s.peer == peer.id && s.keypairs_gen == keypairs_gen);
    if !fresh {
        *sending = Some(SendCache { peer: peer.id, keypairs_gen, keypair: peer.keypairs().current });
    }
    sending.as_ref()?.keypair.as_deref().filter(|k| sendable(k, now))
}

impl WireGuard {
    /// Where `packet` goes: the peer whose AllowedIPs cover its destination (its [`Peer::id`], the peer itself
    /// left in the cache's `route`), and that peer's endpoint; or the answer for a packet that goes nowhere.
    /// Remembers the destination for the next packet.
    pub(super) fn route(&self, cache: &mut WorkerState, packet: &[u8]) -> Result<(u64, SocketAddr), Sealed> {
        let Some(dst) = destination(packet) else {
            return Err(Sealed::Dropped(DropReason::Malformed));
        };
        let cached = cache
            .route
            .as_ref()
            .is_some_and(|r| r.destination == dst && r.peer.endpoint_gen.load(Ordering::Acquire) == r.endpoint_gen);
        if !cached {
            cache.route = None;
            let Some(peer) = self.route_table().longest_match(dst).map(|(_, peer)| peer.clone()) else {
                return Err(Sealed::Unreachable(DropReason::NoPeer));
            };
            let endpoint_gen = peer.endpoint_gen.load(Ordering::Acquire);
            cache.route = Some(RouteCache { destination: dst, endpoint_gen, endpoint: peer.endpoint(), peer });
        }
        let route = cache.route.as_ref().expect("filled above");
        route.endpoint.map(|endpoint| (route.peer.id, endpoint)).ok_or(Sealed::Unreachable(DropReason::NoPeer))
    }

    /// Runs `f` with this thread's cache, refreshed if the runtime changed since.
    pub(super) fn with_worker_state<R>(&self, f: impl FnOnce(&mut WorkerState) -> R) -> R {
        let generation = self.generation.load(Ordering::Acquire);
        WORKER_STATE.with(|cell| {
            let mut cell = cell.borrow_mut();
            let fresh = matches!(&*cell, Some(c) if c.owner == self.id && c.generation == generation);
            if !fresh {
                *cell = Some(WorkerState {
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

    /// Opens a transport data message where it is.
    pub(super) fn open_data(&self, cache: &mut WorkerState, datagram: &mut [u8], from: SocketAddr) -> Opened {
        let Some(index) = DataHeader::new_checked(&*datagram).map(|header| header.receiver()) else {
            return Opened::Dropped(DropReason::MalformedDatagram);
        };
        let fresh = matches!(&cache.receiving,
            Some(r) if r.index == index && r.peer.keypairs_gen.load(Ordering::Acquire) == r.keypairs_gen);
        if !fresh {
            cache.receiving = None;
            let Some(peer) = self.peer_of_index(index).filter(|p| !p.removed.load(Ordering::Acquire)) else {
                return Opened::Dropped(DropReason::Unauthenticated);
            };
            let keypairs_gen = peer.keypairs_gen.load(Ordering::Acquire);
            let Some(keypair) = peer.keypairs().find(index).cloned() else {
                return Opened::Dropped(DropReason::Unauthenticated);
            };
            cache.receiving = Some(ReceiveCache { index, keypairs_gen, peer, keypair });
        }
        let r = cache.receiving.as_ref().expect("filled above");
        let now = self.now();
        if !usable(&r.keypair, now) {
            r.peer.dropped(1);
            return Opened::Dropped(DropReason::NoSession);
        }
        let datagram_len = datagram.len() as u64;
        let (plain, counter) = match r.keypair.open(datagram) {
            Ok(opened) => opened,
            Err(failed) => {
                r.peer.dropped(1);
                return Opened::Dropped(match failed {
                    OpenError::Unauthenticated => DropReason::Unauthenticated,
                    OpenError::Replayed => DropReason::Replayed,
                });
            }
        };
        let (peer, keypair) = (&r.peer, &r.keypair);
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
            peer.wants_flush.store(true, Ordering::SeqCst);
            self.mark_live(peer);
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
        if cache.seen != Some(SeenSource { peer: peer.id, endpoint_gen, from }) {
            // Left where a later message put it: looked at again with this source's next message.
            let at_from = peer.roam(from, keypair.local_index, counter);
            let now_gen = peer.endpoint_gen.load(Ordering::Acquire);
            if at_from && now_gen != endpoint_gen {
                self.events.emit(Event::EndpointChanged { peer: peer.public_key, endpoint: from });
            }
            cache.seen = at_from.then_some(SeenSource { peer: peer.id, endpoint_gen: now_gen, from });
        }
        if plain.is_empty() {
            return Opened::Control; // a keepalive
        }
        let Some(InnerPacket { len, source: src }) = inner_packet(plain) else {
            return Opened::Dropped(DropReason::Malformed);
        };
        // Cryptokey routing: the inner source must be one the sending peer may use (a flow's source is looked up
        // once).
        let allowed = cache.allowed == Some(AllowedSource { source: src, peer: peer.id })
            || self.route_table().longest_match(src).is_some_and(|(_, holder)| Arc::ptr_eq(holder, peer));
        if !allowed {
            peer.dropped(1);
            return Opened::Dropped(DropReason::NotAllowed);
        }
        cache.allowed = Some(AllowedSource { source: src, peer: peer.id });
        // The packet stays where it was opened, behind the message header (the engine's room for its own).
        Opened::InPlace { start: DATA_HEADER_LEN, len }
    }

    /// Records that `bytes` of transport data up to message `last` left for `peer` with `keypair`, and asks for a
    /// new handshake when the session has sent enough (either side) or, for its initiator, is old: the kernel's
    /// `keep_key_fresh` on sending (only the age waits for the initiator, so that both sides do not rekey at once).
    pub(super) fn sent(&self, peer: &Arc<Peer>, keypair: &Keypair, bytes: u64, last: u64, now: u64) {
        peer.tx_bytes.fetch_add(bytes, Ordering::Relaxed);
        peer.sent_data(now);
        if last >= REKEY_AFTER_MESSAGES || (keypair.initiator && now >= keypair.born_ms + REKEY_AFTER_TIME) {
            self.request_handshake(peer);
        }
    }

    /// A packet no session can carry: held for the handshake the worker is asked for (the oldest held dropped
    /// beyond [`HELD_PER_PEER`]), or dropped when the peer cannot make one.
    pub(super) fn hold(&self, peer: &Arc<Peer>, packet: &[u8]) -> Sealed {
        if !peer.keys().is_some_and(|k| k.can_handshake()) {
            peer.dropped(1);
            return Sealed::Dropped(DropReason::NoSession);
        }
        let mut st = peer.state();
        if st.held.len() >= HELD_PER_PEER {
            st.held.pop_front();
            peer.evicted.fetch_add(1, Ordering::Relaxed);
            peer.dropped(1);
        }
        st.held.push_back(packet.to_vec());
        drop(st);
        self.request_handshake(peer);
        Sealed::Held
    }

    /// Seals packets `run` of `batch`, all for `peer` at `endpoint`, where they are: one counter
    /// step for the run, one update of the peer's counters and timers. Packets past the session's last message,
    /// or all of them without a session, are held for a handshake.
    pub(super) fn seal_run(
        &self,
        cache: &mut WorkerState,
        batch: &mut SealBatch<'_, '_>,
        run: Range<usize>,
        (peer, endpoint): (&Arc<Peer>, SocketAddr),
        mtu: usize,
    ) {
        let now = self.now();
        let mut sealed = run.start;
        // The key is held for the run: a session erased meanwhile seals nothing, its packets are held instead.
        let sealing = sending_keypair(peer, &mut cache.sending, now).and_then(|k| Some((k, k.sealer()?)));
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
