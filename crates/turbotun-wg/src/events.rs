//! What happens to peers, for a program that wants to know without polling: [`Event`]s, delivered to each
//! [`Events`] subscription (`Handle::subscribe`, `Protocol::subscribe`).
//!
//! Delivery never slows the protocol down: with no subscription an event costs one atomic load, and a
//! subscription whose reader falls [`EVENT_QUEUE`] events behind loses the newest ones (counted in
//! [`Events::missed`]) rather than making a worker wait.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use crate::config::Key;

/// How many events a subscription holds unread before it loses new ones.
pub const EVENT_QUEUE: usize = 4096;

/// Something that happened to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A handshake with the peer completed: a new session sends from now on (the initiator's side once the
    /// response authenticated; the responder's once the initiator's first message on it arrived).
    HandshakeCompleted {
        /// The peer's public key.
        peer: Key,
    },
    /// The peer's endpoint moved to where an authenticated message came from (roaming, or the first message of
    /// a peer configured without an endpoint). A change made by configuration is not reported: its caller
    /// knows.
    EndpointChanged {
        /// The peer's public key.
        peer: Key,
        /// Where its datagrams go from now on.
        endpoint: SocketAddr,
    },
    /// No handshake completed for three times REJECT_AFTER_TIME (9 minutes): every session of the peer was
    /// erased (the kernel's "zeroing out keys"); the next packet to it starts a handshake.
    KeysExpired {
        /// The peer's public key.
        peer: Key,
    },
}

impl Event {
    /// The public key of the peer it happened to.
    pub fn peer(&self) -> &Key {
        match self {
            Event::HandshakeCompleted { peer } | Event::EndpointChanged { peer, .. } | Event::KeysExpired { peer } => {
                peer
            }
        }
    }
}

/// One subscription to a device's [`Event`]s, in the order they happened; it ends when dropped.
#[derive(Debug)]
pub struct Events {
    receiver: mpsc::Receiver<Event>,
    missed: Arc<AtomicU64>,
}

impl Events {
    /// The next event, waiting for one; `None` once the device is gone.
    pub fn recv(&self) -> Option<Event> {
        self.receiver.recv().ok()
    }

    /// The next event, waiting at most `timeout` for one.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Event> {
        self.receiver.recv_timeout(timeout).ok()
    }

    /// The next event if one is waiting.
    pub fn try_recv(&self) -> Option<Event> {
        self.receiver.try_recv().ok()
    }

    /// The events waiting now, without waiting for more.
    pub fn try_iter(&self) -> impl Iterator<Item = Event> + '_ {
        self.receiver.try_iter()
    }

    /// Events lost because [`EVENT_QUEUE`] were waiting unread.
    pub fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }
}

impl Iterator for Events {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        self.recv()
    }
}

struct Subscriber {
    sender: mpsc::SyncSender<Event>,
    missed: Arc<AtomicU64>,
}

/// The subscriptions of one device.
#[derive(Default)]
pub(crate) struct EventBus {
    /// Whether anyone subscribed: the only thing an event looks at when nobody did.
    any: AtomicBool,
    subscribers: Mutex<Vec<Subscriber>>,
}

impl EventBus {
    /// A new subscription.
    pub(crate) fn subscribe(&self) -> Events {
        let (sender, receiver) = mpsc::sync_channel(EVENT_QUEUE);
        let missed = Arc::new(AtomicU64::new(0));
        let mut subscribers = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subscribers.push(Subscriber { sender, missed: missed.clone() });
        self.any.store(true, Ordering::Release);
        Events { receiver, missed }
    }

    /// Delivers `event` to every subscription; one that was dropped goes.
    pub(crate) fn emit(&self, event: Event) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut subscribers = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subscribers.retain(|s| match s.sender.try_send(event) {
            Ok(()) => true,
            Err(mpsc::TrySendError::Full(_)) => {
                s.missed.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(mpsc::TrySendError::Disconnected(_)) => false,
        });
        self.any.store(!subscribers.is_empty(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subscription_gets_each_event_and_a_full_one_counts_what_it_lost() {
        let bus = EventBus::default();
        let (a, b) = (bus.subscribe(), bus.subscribe());
        for i in 0..EVENT_QUEUE + 3 {
            bus.emit(Event::KeysExpired { peer: [i as u8; 32] });
        }
        assert_eq!(a.recv(), Some(Event::KeysExpired { peer: [0; 32] }));
        assert_eq!(a.missed(), 3);
        assert_eq!(b.missed(), 3);
        drop(b);
        drop(a);
        bus.emit(Event::HandshakeCompleted { peer: [1; 32] });
        assert!(!bus.any.load(Ordering::Relaxed), "dropped subscriptions are gone");
    }
}
