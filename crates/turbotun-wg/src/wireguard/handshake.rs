//! The handshake worker: the bounded queue the data workers fill with handshake messages after the cheap checks
//! (mac1, and under load the cookie and the source's rate), and the worker that takes them: every
//! Diffie-Hellman, initiations and responses sent and taken, cookie replies, and the rate-limited log of what it
//! refused.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use turbotun::tunnel::{Opened, Settled};
use turbotun::udp::LocalAddr;
use turbotun::DropReason;

use super::{
    Runtime, WireGuard, INITIATIONS_PER_SECOND, MAX_QUEUED_HANDSHAKES, REJECT_AFTER_TIME, REKEY_TIMEOUT, UNDER_LOAD_FOR,
};
use crate::cookie;
use crate::cookie::MacState;
use crate::events::Event;
use crate::message::{CookieReply, MessageKind, Response, COOKIE_REPLY_LEN, INITIATION_LEN, RESPONSE_LEN};
use crate::noise;
use crate::noise::{finish_initiation, open_initiation, Identity, PeerKeys};
use crate::peer::{HandshakeSide, Peer};
use crate::session::Keypair;

/// A handshake message waiting for the handshake worker.
pub(super) struct Job {
    message: [u8; INITIATION_LEN],
    len: usize,
    from: SocketAddr,
    /// The local address it reached: recorded for replies to `from` if it authenticates.
    to: Option<LocalAddr>,
    /// Under load without a valid cookie: answered with a cookie reply and nothing else.
    needs_cookie: bool,
}

/// The handshake worker's queue and the file descriptor that wakes it.
pub(super) struct HandshakeQueue {
    jobs: Mutex<VecDeque<Job>>,
    pub(super) len: AtomicUsize,
    pub(super) wake: OwnedFd,
    /// Whether `wake` was written since it was last drained (read without a system call).
    pub(super) kicked: AtomicBool,
}

impl HandshakeQueue {
    pub(super) fn new() -> Self {
        use rustix::event::{eventfd, EventfdFlags};
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).expect("eventfd: a Linux kernel has it");
        HandshakeQueue {
            jobs: Mutex::new(VecDeque::new()),
            len: AtomicUsize::new(0),
            wake,
            kicked: AtomicBool::new(false),
        }
    }

    pub(super) fn kick(&self) {
        self.kicked.store(true, Ordering::SeqCst);
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    pub(super) fn drain_wake(&self) {
        self.kicked.store(false, Ordering::SeqCst);
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.wake, &mut buf);
    }

    /// Queues `job` unless the queue is full.
    pub(super) fn push(&self, job: Job) -> bool {
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

    pub(super) fn pop(&self) -> Option<Job> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let job = jobs.pop_front();
        self.len.store(jobs.len(), Ordering::Relaxed);
        job
    }
}

/// Lines a [`LogLimit`] lets through in each interval, and the interval (ms): the kernel's `net_ratelimit`
/// (a burst of 10 every 5 seconds).
pub(super) const LOG_BURST: u32 = 10;

pub(super) const LOG_INTERVAL: u64 = 5_000;

/// Debug lines about what others send, at most [`LOG_BURST`] each [`LOG_INTERVAL`]; how many were held back is
/// said with the first line of the next interval.
#[derive(Debug, Default)]
pub(super) struct LogLimit {
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
}

impl WireGuard {
    /// A debug line about a handshake message refused or answered for whoever sent it (the device's own line,
    /// see `device_event`), if the limit on such lines lets it through at `now`.
    fn refused_event(&self, now: u64, what: std::fmt::Arguments<'_>) {
        if tracing::enabled!(tracing::Level::DEBUG) && self.refused_log.allow(now) {
            self.device_event(what);
        }
    }

    /// Whether handshake messages need a cookie now: the queue holds an eighth of what it may, or did within the
    /// last second (the kernel's rule).
    pub(super) fn under_load(&self, now: u64) -> bool {
        if self.handshakes.len.load(Ordering::Relaxed) >= MAX_QUEUED_HANDSHAKES / 8 {
            self.under_load_until.store(now + UNDER_LOAD_FOR, Ordering::Relaxed);
            return true;
        }
        now < self.under_load_until.load(Ordering::Relaxed)
    }

    /// The data worker's part of a handshake message: the checks that cost no key work, then the queue.
    pub(super) fn queue_handshake(
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

    /// Handles one queued handshake message: handled as the protocol's own, or refused for a reason.
    pub(super) fn handle_job(
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
            Some(MessageKind::Initiation) => self.take_initiation(identity, job, now, control),
            Some(MessageKind::Response) => self.take_response(identity, job, now, control),
            Some(MessageKind::CookieReply) => {
                let index = CookieReply::new_checked(message).ok_or(DropReason::MalformedDatagram)?.receiver();
                let peer = self.peer_of_index(index).ok_or(DropReason::Unauthenticated)?;
                let keys = peer.keys().ok_or(DropReason::Unauthenticated)?;
                if peer.state().cookies.consume(&keys.cookie_key, message, Instant::now()) {
                    Ok(())
                } else {
                    self.refused_event(now, format_args!("cookie reply from {} did not authenticate", job.from));
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
        // Whoever sends handshake messages under load chooses how many of these there are: limited.
        self.refused_event(self.now(), format_args!("Sending cookie reply for denied handshake message from {from}"));
    }

    fn take_initiation(
        &self,
        identity: &Identity,
        job: &Job,
        now: u64,
        control: &mut dyn FnMut(&[u8], SocketAddr),
    ) -> Result<(), DropReason> {
        let (message, from) = (&job.message[..job.len], job.from);
        let Some(opened) = open_initiation(identity, message) else {
            self.refused_event(now, format_args!("handshake initiation from {from} did not authenticate"));
            return Err(DropReason::Unauthenticated);
        };
        let Some(peer) = self.peer_by_key(&opened.peer) else {
            self.refused_event(now, format_args!("handshake initiation from {from} names no peer of ours"));
            return Err(DropReason::Unauthenticated);
        };
        let keys = peer.keys().ok_or(DropReason::Unauthenticated)?;
        let Some(consumed) = finish_initiation(opened, &keys, message) else {
            self.refused_event(now, format_args!("handshake initiation from {from} did not authenticate"));
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
            self.refused_event(
                now,
                format_args!("handshake initiation from {from}: a replay or too soon after the last"),
            );
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
        for index in &gone {
            self.peer_event(&peer.public_key, format_args!("Keypair {index} destroyed"));
        }
        self.retire(&gone);
        self.moved_to(&peer, from);
        self.authenticated(job);
        peer.rx_bytes.fetch_add(message.len() as u64, Ordering::Relaxed);
        peer.received_authenticated(now, false);
        self.peer_event(&peer.public_key, format_args!("Received handshake initiation"));
        self.peer_event(&peer.public_key, format_args!("Keypair {local_index} created (waiting to be confirmed)"));
        control(&response, from);
        self.peer_event(&peer.public_key, format_args!("Sending handshake response"));
        peer.tx_bytes.fetch_add(RESPONSE_LEN as u64, Ordering::Relaxed);
        peer.sent_authenticated(now);
        st.zero_keys_at = Some(now + 3 * REJECT_AFTER_TIME);
        drop(st);
        self.mark_live(&peer);
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
        let response = Response::new_checked(message).ok_or(DropReason::MalformedDatagram)?;
        let index = response.receiver();
        let peer = self.peer_of_index(index).ok_or(DropReason::Unauthenticated)?;
        let keys = peer.keys().ok_or(DropReason::Unauthenticated)?;
        let mut st = peer.state();
        let session = match &st.pending {
            Some(pending) if pending.local_index == index => noise::consume_response(identity, pending, &keys, message),
            _ => None,
        };
        let Some(session) = session else {
            self.refused_event(
                now,
                format_args!("handshake response from {from} answers nothing under way or did not authenticate"),
            );
            return Err(DropReason::Unauthenticated);
        };
        st.pending = None;
        self.peer_event(&peer.public_key, format_args!("Received handshake response"));
        self.peer_event(&peer.public_key, format_args!("Keypair {index} created"));
        let keypair = Arc::new(Keypair::new(&session, index, response.sender(), true, now));
        keypair.confirm();
        let gone = peer.change_keypairs(|k| {
            match k.next.take() {
                Some(next) => k.previous = Some(next),
                None => k.previous = k.current.take(),
            }
            k.current = Some(keypair);
        });
        for index in &gone {
            self.peer_event(&peer.public_key, format_args!("Keypair {index} destroyed"));
        }
        self.retire(&gone);
        self.moved_to(&peer, from);
        self.authenticated(job);
        peer.rx_bytes.fetch_add(message.len() as u64, Ordering::Relaxed);
        peer.received_authenticated(now, false);
        self.handshake_complete(&peer, &mut st, now);
        // What waited goes now; with nothing waiting, a keepalive confirms the session to the responder.
        self.send_keepalive(&peer, &keys, &mut st, now, control);
        drop(st);
        self.mark_live(&peer);
        Ok(())
    }

    /// Records, for replies to the sender of `job` (which authenticated), the local address it reached.
    fn authenticated(&self, job: &Job) {
        self.reply_sources.read().unwrap_or_else(|e| e.into_inner()).remember(job.from, job.to);
    }

    pub(super) fn handshake_complete(&self, peer: &Peer, st: &mut HandshakeSide, now: u64) {
        st.retransmit_at = None;
        st.attempts = 0;
        st.zero_keys_at = Some(now + 3 * REJECT_AFTER_TIME);
        peer.sent_lastminute_handshake.store(false, Ordering::Relaxed);
        *peer.last_handshake.lock().unwrap_or_else(|e| e.into_inner()) = Some(SystemTime::now());
        // The one place a handshake completes, both sides: the initiator's here at the response, the responder's
        // on the timer thread once the data path saw the initiator's first message (`wants_flush`).
        self.events.emit(Event::HandshakeCompleted { peer: peer.public_key });
    }

    /// Moves `peer`'s endpoint to `from`, where an authenticated handshake message came from.
    fn moved_to(&self, peer: &Peer, from: SocketAddr) {
        if peer.set_endpoint(Some(from)) {
            self.events.emit(Event::EndpointChanged { peer: peer.public_key, endpoint: from });
        }
    }

    /// Sends an initiation to `peer` unless one went within REKEY_TIMEOUT; `retry` keeps the attempt count.
    pub(super) fn send_initiation(
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
        self.peer_event(&peer.public_key, format_args!("Sending handshake initiation"));
        peer.tx_bytes.fetch_add(INITIATION_LEN as u64, Ordering::Relaxed);
        peer.sent_authenticated(now);
        st.last_initiation_sent = Some(now);
        st.retransmit_at = Some(now + REKEY_TIMEOUT + self.jitter());
    }

    pub(super) fn add_settled(&self, more: &Settled) {
        let mut settled = self.settled.lock().unwrap_or_else(|e| e.into_inner());
        settled.control += more.control;
        settled.drops.add_all(&more.drops);
    }

    /// Lowers the handshake worker's priority once, so that key work yields to the data workers.
    pub(super) fn nice_worker(&self) {
        if !self.worker_niced.swap(true, Ordering::Relaxed) {
            let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 10);
        }
    }
}
