//! The protocol's timers for one peer, run by the handshake worker each tick and on a request from the data path:
//! retransmission, keepalives (passive and persistent), rekeying, the last-minute handshake and key expiry, as
//! the kernel's `timers.c` and `send.c` run them.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use turbotun::{DropReason, Drops};

use super::{
    sendable, WireGuard, DATA_OVERHEAD, KEEPALIVE_TIMEOUT, LASTMINUTE_AGE, MAX_TIMER_HANDSHAKES, REJECT_AFTER_TIME,
    REKEY_TIMEOUT,
};
use crate::events::Event;
use crate::noise::PeerKeys;
use crate::peer::{HandshakeSide, Keypairs, Peer, Timer};
use crate::session::PADDING_MULTIPLE;

impl WireGuard {
    /// Whether a message just received finds the session `peer` sends with one we initiated that is within
    /// KEEPALIVE_TIMEOUT + REKEY_TIMEOUT of its end, with no last-minute handshake asked for yet (then it is).
    pub(super) fn needs_lastminute_handshake(&self, peer: &Peer, now: u64) -> bool {
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
    pub(super) fn request_handshake(&self, peer: &Arc<Peer>) {
        if !peer.wants_handshake.swap(true, Ordering::SeqCst) {
            self.mark_live(peer);
            self.handshakes.kick();
        }
    }

    /// Whether `peer` has nothing for its timers: no request from the data path or the configuration, no
    /// persistent keepalive, no session, no handshake under way, nothing held, no timer armed. Such a peer is
    /// taken out of the live set; whatever gives it something puts it back ([`WireGuard::mark_live`]).
    pub(super) fn idle(&self, peer: &Peer) -> bool {
        let requests = [&peer.wants_handshake, &peer.wants_keepalive, &peer.wants_flush];
        if requests.iter().any(|r| r.load(Ordering::SeqCst))
            || peer.evicted.load(Ordering::SeqCst) > 0
            || peer.persistent_keepalive.load(Ordering::Relaxed) > 0
        {
            return false;
        }
        let keypairs = peer.keypairs();
        if keypairs.current.is_some() || keypairs.previous.is_some() || keypairs.next.is_some() {
            return false;
        }
        // A peer never given a handshake state has none to look at (and is not given one here).
        let Some(st) = peer.state_if_made() else { return true };
        st.pending.is_none()
            && st.retransmit_at.is_none()
            && st.zero_keys_at.is_none()
            && st.held.is_empty()
            && st.keepalive_timer.is_none()
            && st.silence_timer.is_none()
    }

    /// Sends what is held for `peer` if a session can carry it (and a keepalive if nothing is), or starts a
    /// handshake.
    pub(super) fn send_keepalive(
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
                self.peer_event(&peer.public_key, format_args!("Sending keepalive packet"));
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

    /// One live peer's requests and timers; returns whether it stays live (false: it may be idle, see
    /// [`WireGuard::idle`]).
    pub(super) fn service_peer(
        &self,
        peer: &Arc<Peer>,
        now: u64,
        control: &mut dyn FnMut(&[u8], SocketAddr),
        lost: &mut Drops,
    ) -> bool {
        // Nothing to time (it became idle since it was put in the set): nothing is made for it here either.
        if self.idle(peer) {
            return false;
        }
        self.run_timers(peer, now, control, lost);
        !self.idle(peer)
    }

    fn run_timers(&self, peer: &Arc<Peer>, now: u64, control: &mut dyn FnMut(&[u8], SocketAddr), lost: &mut Drops) {
        lost.add(DropReason::NoSession, peer.evicted.swap(0, Ordering::Relaxed));
        let Some(keys) = peer.keys() else {
            // No private key: nothing can be sent, and what was asked for waits for none.
            for request in [&peer.wants_handshake, &peer.wants_keepalive, &peer.wants_flush] {
                request.store(false, Ordering::SeqCst);
            }
            return;
        };
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
                let attempts = st.attempts + 1;
                self.peer_event(
                    &peer.public_key,
                    format_args!("Handshake did not complete after {attempts} attempts, giving up"),
                );
                st.retransmit_at = None;
                st.keepalive_timer = None;
                lost.add(DropReason::NoSession, st.held.len() as u64);
                peer.dropped(st.held.len() as u64);
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
                self.peer_event(
                    &peer.public_key,
                    format_args!(
                        "Retrying handshake: nothing heard back for {} s after sending",
                        (KEEPALIVE_TIMEOUT + REKEY_TIMEOUT) / 1000
                    ),
                );
                self.send_initiation(peer, &keys, &mut st, false, now, control);
            }
        } else {
            st.silence_timer = None;
        }
        if st.zero_keys_at.is_some_and(|t| now >= t) {
            st.zero_keys_at = None;
            self.peer_event(
                &peer.public_key,
                format_args!("Zeroing keys: no handshake for {} s", 3 * REJECT_AFTER_TIME / 1000),
            );
            let mut gone = peer.change_keypairs(|k| *k = Keypairs::default());
            for index in &gone {
                self.peer_event(&peer.public_key, format_args!("Keypair {index} destroyed"));
            }
            gone.extend(st.pending.take().map(|p| p.local_index));
            self.retire(&gone);
            self.events.emit(Event::KeysExpired { peer: peer.public_key });
        }
        let interval = u64::from(peer.persistent_keepalive.load(Ordering::Relaxed)) * 1000;
        let last = peer.sent_any_ms.load(Ordering::Relaxed).max(peer.received_any_ms.load(Ordering::Relaxed));
        if interval > 0 && now >= last + interval {
            self.send_keepalive(peer, &keys, &mut st, now, control);
        }
    }
}
