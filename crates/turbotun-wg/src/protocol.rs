//! WireGuard with no I/O of its own, for hosts that own their event loop (a mobile app, an async runtime, a
//! userspace network stack): give [`Protocol`] an inner packet or a datagram, get back what to send where; call
//! [`Protocol::update_timers`] by the deadline it returns. It is the same protocol code as the
//! [`Endpoint`](crate::Endpoint)'s (one configuration, one set of timers, the same kernel semantics), driven by
//! the host instead of by the tunnel engine's workers, as boringtun's `Tunn` is.
//!
//! Handshake messages (and the timers' own sends: retransmissions, keepalives, packets held for a handshake) go
//! out through the `send` function each call takes, on the calling thread; nothing here blocks or spawns.
//!
//! ```
//! use turbotun_wg::protocol::{Decapsulated, Encapsulated};
//! use turbotun_wg::{Event, PeerUpdate, Protocol, Update};
//!
//! // Two ends in one process, the datagrams passed by hand.
//! let (a, b) = (Protocol::new(), Protocol::new());
//! let (ka, kb) = ([1u8; 32], [2u8; 32]);
//! let (pa, pb) = (turbotun_wg::public_key(&ka), turbotun_wg::public_key(&kb));
//! let (addr_a, addr_b) = ("192.0.2.1:51820".parse()?, "192.0.2.2:51820".parse()?);
//! a.control().configure(Update::new().private_key(ka).peer(PeerUpdate::new(pb).endpoint(addr_b).allowed_ip("10.0.0.2/32".parse()?)))?;
//! b.control().configure(Update::new().private_key(kb).peer(PeerUpdate::new(pa).allowed_ip("10.0.0.1/32".parse()?)))?;
//!
//! let events = a.control().subscribe();
//! let mut packet = [0u8; 28];
//! packet[0] = 0x45; // IPv4 to 10.0.0.2
//! packet[2..4].copy_from_slice(&28u16.to_be_bytes());
//! packet[12..16].copy_from_slice(&[10, 0, 0, 1]);
//! packet[16..20].copy_from_slice(&[10, 0, 0, 2]);
//! let mut out = vec![0u8; 2048];
//! let mut to_b = Vec::new();
//! // No session yet: the packet is held and an initiation goes out.
//! let held = a.encapsulate(&mut packet, &mut out, &mut |d, to| to_b.push((d.to_vec(), to)));
//! assert_eq!(held, Encapsulated::Held);
//! a.update_timers(&mut |d, to| to_b.push((d.to_vec(), to)));
//! let (mut initiation, _) = to_b.remove(0);
//! let mut to_a = Vec::new();
//! let answered = b.decapsulate(&mut initiation, addr_a, &mut out, &mut |d, to| to_a.push((d.to_vec(), to)));
//! assert_eq!(answered, Decapsulated::Handled);
//! let (mut response, _) = to_a.remove(0);
//! // The response completes a's handshake, and the held packet leaves with it.
//! a.decapsulate(&mut response, addr_b, &mut out, &mut |d, to| to_b.push((d.to_vec(), to)));
//! assert_eq!(events.try_recv(), Some(Event::HandshakeCompleted { peer: pb }));
//! let (mut data, _) = to_b.remove(0);
//! let Decapsulated::Packet { start, len } = b.decapsulate(&mut data, addr_a, &mut out, &mut |_, _| {}) else {
//!     panic!("not a packet")
//! };
//! assert_eq!(&data[start..start + len], &packet[..]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

use turbotun::tunnel::{Opened, Room, SealBatch, Sealed, Transform};
use turbotun::DropReason;

use crate::control::{Configurator, Control};
use crate::wireguard::{WireGuard, TICK};

/// What became of an inner packet given to [`Protocol::encapsulate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encapsulated {
    /// Send `out[..len]` to `to`.
    Send {
        /// The datagram's length in `out`.
        len: usize,
        /// Where it goes.
        to: SocketAddr,
    },
    /// Kept until a handshake with its peer completes (at most [`HELD_PER_PEER`](crate::HELD_PER_PEER) a peer);
    /// it then leaves through a later call's `send`.
    Held,
    /// Not sent, for this reason (a packet that is not IP, too big, ...).
    Dropped(DropReason),
    /// Not sent, because no peer's AllowedIPs cover its destination or its peer has no endpoint: the kernel
    /// answers such a packet with an ICMP "destination unreachable" (the engine does too), which a host with
    /// its own stack may do likewise.
    Unreachable(DropReason),
}

/// What became of a datagram given to [`Protocol::decapsulate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decapsulated {
    /// An inner packet for the host: `datagram[start..start + len]` (opened where it arrived).
    Packet {
        /// Where it starts in the datagram.
        start: usize,
        /// Its length.
        len: usize,
    },
    /// One of the protocol's own messages (a handshake message, a cookie reply, a keepalive), handled; what it
    /// answered went out through `send`.
    Handled,
    /// Refused, for this reason (not authentic, replayed, from a source the peer may not use, ...).
    Dropped(DropReason),
}

/// WireGuard's protocol with no I/O: see the module documentation. Share it between threads as it is (`&self`
/// everywhere): encapsulating and decapsulating may run on several at once.
pub struct Protocol {
    wg: Arc<WireGuard>,
    control: Control,
}

impl std::fmt::Debug for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Protocol").field("wg", &self.wg).finish()
    }
}

impl Default for Protocol {
    fn default() -> Self {
        Self::new()
    }
}

impl Protocol {
    /// A device with no key and no peer: configure it through [`Self::control`]. Its listen port and firewall
    /// mark are recorded for the host to read, never bound.
    pub fn new() -> Self {
        let wg = Arc::new(WireGuard::new());
        let configurator = Configurator::new(wg.clone(), Box::new(|_, _| Ok(())));
        Protocol { control: Control::new(Arc::new(configurator)), wg }
    }

    /// Configures and watches it.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// The tunnel's MTU: padding never makes an inner packet longer (1420 if never set).
    pub fn set_mtu(&self, mtu: usize) {
        self.wg.set_mtu(mtu);
    }

    /// What a datagram adds to its inner packet, at most: the header, padding and the tag.
    pub fn overhead(&self) -> usize {
        self.wg.overhead()
    }

    /// Seals `packet` (an IP packet) for the peer whose AllowedIPs cover its destination, into `out` (which
    /// needs [`Self::overhead`] bytes more than the packet).
    pub fn encapsulate(
        &self,
        packet: &mut [u8],
        out: &mut [u8],
        send: &mut dyn FnMut(&[u8], SocketAddr),
    ) -> Encapsulated {
        let sealed = self.wg.seal(packet, out, send);
        self.kick_if_waiting(send);
        match sealed {
            Sealed::Out { len, to } => Encapsulated::Send { len, to },
            Sealed::Held => Encapsulated::Held,
            Sealed::Dropped(reason) => Encapsulated::Dropped(reason),
            Sealed::Unreachable(reason) => Encapsulated::Unreachable(reason),
            // WireGuard seals into `out` alone from `seal`.
            Sealed::InPlace { to } => {
                out[..packet.len()].copy_from_slice(packet);
                Encapsulated::Send { len: packet.len(), to }
            }
            // Only `seal_batch` grows a packet in its room.
            Sealed::Grown { .. } => Encapsulated::Dropped(DropReason::Malformed),
        }
    }

    /// The room each packet of [`Self::encapsulate_batch`] needs around it in its buffer to be sealed where it
    /// is.
    pub fn seal_room(&self) -> Room {
        self.wg.seal_room()
    }

    /// Seals a batch of packets, each in place where its buffer has [`Self::seal_room`] around it: the
    /// engine's batched sealing (one route look-up and one counter step per run of packets to one peer). The
    /// answer for each packet is in the batch ([`SealBatch::new`]'s `sealed`).
    pub fn encapsulate_batch(&self, batch: &mut SealBatch<'_, '_>, send: &mut dyn FnMut(&[u8], SocketAddr)) {
        self.wg.seal_batch(batch, send);
        self.kick_if_waiting(send);
    }

    /// Opens `datagram`, which came from `from`: an inner packet opened in place, or a handshake message handled
    /// at once (its answer sent through `send`, and with it the packets that waited for the handshake). `out`
    /// is scratch room of at least [`Self::overhead`] bytes more than the largest packet.
    pub fn decapsulate(
        &self,
        datagram: &mut [u8],
        from: SocketAddr,
        out: &mut [u8],
        send: &mut dyn FnMut(&[u8], SocketAddr),
    ) -> Decapsulated {
        let opened = self.wg.open(datagram, from, None, out, send);
        self.wg.opened_batch();
        let answer = match opened {
            Opened::InPlace { start, len } => Decapsulated::Packet { start, len },
            Opened::Packet { len } => {
                // Opened into `out`: moved where the caller looks, the datagram (which it always fits).
                datagram[..len].copy_from_slice(&out[..len]);
                Decapsulated::Packet { start: 0, len }
            }
            Opened::Control => Decapsulated::Handled,
            Opened::Queued => {
                let settled = self.wg.handshake_work(send);
                match DropReason::ALL.iter().find(|&&reason| settled.drops.get(reason) > 0) {
                    Some(&reason) => Decapsulated::Dropped(reason),
                    None => Decapsulated::Handled,
                }
            }
            Opened::Dropped(reason) => Decapsulated::Dropped(reason),
        };
        self.kick_if_waiting(send);
        answer
    }

    /// Runs the timers (handshake retransmissions, keepalives, rekeying, key expiry) and any work waiting,
    /// sending through `send`; returns how long until it should run again (`None`: not until a packet is
    /// given to it, since no peer has a timer that can fire).
    pub fn update_timers(&self, send: &mut dyn FnMut(&[u8], SocketAddr)) -> Option<Duration> {
        self.wg.handshake_work(send);
        self.wg.timer_work(send);
        self.next_timer()
    }

    /// How long until [`Self::update_timers`] should run: at once when work waits, the protocol's tick while a
    /// peer has a timer that can fire, `None` otherwise.
    pub fn next_timer(&self) -> Option<Duration> {
        if self.wg.work_waiting() {
            Some(Duration::ZERO)
        } else if self.wg.any_live() {
            Some(TICK)
        } else {
            None
        }
    }

    /// A file descriptor that becomes readable when [`Self::update_timers`] has work before its deadline (for
    /// a host that polls file descriptors rather than asking [`Self::next_timer`] after each call).
    pub fn work_fd(&self) -> BorrowedFd<'_> {
        self.wg.work_fd().expect("WireGuard has a work fd")
    }

    /// Work that a call made (packets held that can go now, a handshake to start) is done before it returns
    /// when it can be done at once, so that a host calling only `encapsulate`/`decapsulate` loses nothing.
    fn kick_if_waiting(&self, send: &mut dyn FnMut(&[u8], SocketAddr)) {
        if self.wg.work_waiting() {
            self.wg.handshake_work(send);
            self.wg.timer_work(send);
        }
    }
}
