//! WireGuard as the tunnel engine's [`Transform`]: what each of the engine's calls (seal, open, tick, settle)
//! does, in terms of the data path, the handshake worker and the timers.

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use turbotun::tunnel::{Opened, Room, SealBatch, Sealed, Settled, Transform};
use turbotun::udp::{LocalAddr, ReplySources};
use turbotun::{DropReason, Drops};

use super::{WireGuard, DATA_OVERHEAD, HANDSHAKES_PER_CALL, TICK};
use crate::message::{MessageKind, DATA_HEADER_LEN, TAG_LEN};
use crate::session::PADDING_MULTIPLE;

use super::data::{sending_keypair, WorkerState};

impl Transform for WireGuard {
    fn overhead(&self) -> usize {
        DATA_OVERHEAD + PADDING_MULTIPLE - 1
    }

    fn seal(&self, packet: &mut [u8], out: &mut [u8], _control: &mut dyn FnMut(&[u8], SocketAddr)) -> Sealed {
        let mtu = self.mtu.load(Ordering::Relaxed);
        self.with_worker_state(|cache| {
            let endpoint = match self.route(cache, packet) {
                Ok((_, endpoint)) => endpoint,
                Err(answer) => return answer,
            };
            let now = self.now();
            let WorkerState { route, sending, .. } = cache;
            let peer = &route.as_ref().expect("routed").peer;
            if let Some(keypair) = sending_keypair(peer, sending, now) {
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
        self.with_worker_state(|cache| {
            let mut start = 0;
            let mut routed = (n > 0).then(|| self.route(cache, batch.packet(0)));
            while let Some(first) = routed.take() {
                let (peer_id, endpoint) = match first {
                    Ok(route) => route,
                    Err(answer) => {
                        batch.set(start, answer);
                        start += 1;
                        routed = (start < n).then(|| self.route(cache, batch.packet(start)));
                        continue;
                    }
                };
                // The run's peer, held for the run: the route cache moves on with the packet after it.
                let peer = cache.route.as_ref().expect("routed").peer.clone();
                // The run: the packets after it that go to the same peer at the same endpoint.
                let mut end = start + 1;
                while end < n {
                    let next = self.route(cache, batch.packet(end));
                    if next != Ok((peer_id, endpoint)) {
                        routed = Some(next);
                        break;
                    }
                    end += 1;
                }
                self.seal_run(cache, batch, start..end, (&peer, endpoint), mtu);
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
        self.with_worker_state(|cache| match kind {
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
        let settled = self.handshake_work(control);
        self.add_settled(&settled);
        self.timer_work(control)
    }

    /// Every peer's held packets, and those evicted since the last tick, given up: the stop's `stopped`, the
    /// evicted ones `no_session` as the timers count them. Only live peers hold packets (see `timers`).
    fn give_up(&self) -> Drops {
        let mut lost = Drops::default();
        for peer in self.live.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let held = peer.state_if_made().map_or(0, |mut st| std::mem::take(&mut st.held).len() as u64);
            let evicted = peer.evicted.swap(0, Ordering::Relaxed);
            lost.add(DropReason::Stopped, held);
            lost.add(DropReason::NoSession, evicted);
            peer.dropped(held);
        }
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

impl WireGuard {
    /// The handshake worker's part of a tick: the queued handshake messages (at most [`HANDSHAKES_PER_CALL`]),
    /// answered through `control`; what became of them.
    pub(crate) fn handshake_work(&self, control: &mut dyn FnMut(&[u8], SocketAddr)) -> Settled {
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
        if self.handshakes.len.load(Ordering::Relaxed) > 0 {
            self.handshakes.kick(); // more to do: back at once, after the timers
        }
        settled
    }

    /// The timers' part of a tick: each live peer's timers; the packets they gave up on.
    pub(crate) fn timer_work(&self, control: &mut dyn FnMut(&[u8], SocketAddr)) -> Drops {
        let now = self.now();
        self.checker.lock().unwrap_or_else(|e| e.into_inner()).expire(Instant::now());
        let mut lost = Drops::default();
        // Only the live peers: the others have no timer that can fire (see `timers`).
        let live = std::mem::take(&mut *self.live.lock().unwrap_or_else(|e| e.into_inner()));
        let mut still = Vec::with_capacity(live.len());
        for peer in live {
            if self.service_peer(&peer, now, control, &mut lost) {
                still.push(peer);
                continue;
            }
            // Idle: out of the set, unless something made it live again meanwhile (the data path sets its
            // request and then looks at `live`; this clears `live` and then looks at the requests).
            peer.live.store(false, Ordering::SeqCst);
            if !self.idle(&peer) && !peer.live.swap(true, Ordering::SeqCst) {
                still.push(peer);
            }
        }
        self.live.lock().unwrap_or_else(|e| e.into_inner()).extend(still);
        // Key work (handshake messages, initiations, keepalives) leaves copies of secrets in the frames it used:
        // overwritten before the worker sleeps.
        crate::config::scrub_stack();
        lost
    }

    /// Whether work waits that the next tick should do at once (handshake messages queued, held packets to
    /// send): what [`Transform::work_fd`] says by being readable.
    pub(crate) fn work_waiting(&self) -> bool {
        self.handshakes.kicked.load(Ordering::SeqCst)
    }

    /// Whether any peer has a timer that may fire.
    pub(crate) fn any_live(&self) -> bool {
        !self.live.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }
}
