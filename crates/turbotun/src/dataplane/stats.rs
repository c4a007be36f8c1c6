//! One set of counters for everything that moves packets: the batch layer, the io_uring backend and the
//! forwarding engine all count into [`Counters`], and every packet that is read but not written is counted in
//! [`Drops`] under a [`DropReason`].
//!
//! A worker keeps its own [`Counters`] (plain integers, no sharing) and adds what changed to a
//! [`SharedCounters`] now and then; a reader takes a [`SharedCounters::snapshot`] at any time, also while the
//! workers run.

use std::sync::atomic::{AtomicU64, Ordering};

/// Declares [`DropReason`], its names, and the [`Drops`] counters with a field per reason, once: a new reason is
/// one line here.
macro_rules! drop_reasons {
    ($($(#[$doc:meta])* $variant:ident => $field:ident, fault: $fault:literal, engines: [$($engine:ident),*];)*) => {
        /// Why a packet that was read was not written. Every drop has one; none is silent.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        #[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
        #[non_exhaustive]
        pub enum DropReason {
            $($(#[$doc])* $variant,)*
        }

        impl DropReason {
            /// Every reason, in the order [`Drops`] lists them.
            pub const ALL: &'static [DropReason] = &[$(DropReason::$variant,)*];

            /// The name used in counters output.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(DropReason::$variant => stringify!($field),)*
                }
            }

            /// Whether this drop points at a fault (a bad packet or a refusal) rather than at the device's state.
            pub fn is_fault(self) -> bool {
                match self {
                    $(DropReason::$variant => $fault,)*
                }
            }

            /// Whether an engine of this kind can drop a packet for this reason: a counters report lists these
            /// (and any other that is not zero), so a forwarder's shows no reason of a tunnel protocol.
            pub fn applies_to(self, engine: Engine) -> bool {
                match self {
                    $(DropReason::$variant => matches!(engine, $(Engine::$engine)|*),)*
                }
            }

            /// The reason of this name ([`Self::as_str`]).
            pub fn from_name(name: &str) -> Option<DropReason> {
                match name {
                    $(stringify!($field) => Some(DropReason::$variant),)*
                    _ => None,
                }
            }
        }

        /// Packets not written, by reason.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        #[non_exhaustive]
        pub struct Drops {
            $(#[doc = concat!("See [`DropReason::", stringify!($variant), "`].")] pub $field: u64,)*
        }

        impl Drops {
            fn slot(&mut self, reason: DropReason) -> &mut u64 {
                match reason {
                    $(DropReason::$variant => &mut self.$field,)*
                }
            }
        }
    };
}

drop_reasons! {
    /// A frame larger than the buffer it was read into (the kernel reports its full length).
    TooBig => too_big, fault: true, engines: [Forwarder, Tunnel, KeyedTunnel, Stack, VhostUser];
    /// A bad virtio header, offsets that do not fit the packet, or a super-packet that cannot be split.
    Malformed => malformed, fault: true, engines: [Forwarder, Tunnel, KeyedTunnel, Stack, VhostUser];
    /// The kernel refused the write (`EINVAL`): a packet the device cannot take.
    KernelRefused => kernel_refused, fault: true, engines: [Forwarder, Tunnel, KeyedTunnel, Stack, VhostUser];
    /// The destination was down (`EIO`).
    DeviceDown => device_down, fault: false, engines: [Forwarder, Tunnel, KeyedTunnel, VhostUser];
    /// The destination's queue was full (`EAGAIN`) and the engine was told not to wait ([`WhenFull::Drop`]).
    QueueFull => queue_full, fault: false, engines: [Forwarder, Tunnel, KeyedTunnel, VhostUser];
    /// Read but still held when the forwarder stopped or failed.
    Stopped => stopped, fault: false, engines: [Forwarder, Tunnel, KeyedTunnel, Stack, VhostUser];
    /// Segments of a super-packet beyond [`MAX_SEGMENTS`](crate::batch::MAX_SEGMENTS): a tiny `gso_size` would
    /// otherwise turn one read into tens of thousands of packets.
    TooManySegments => too_many_segments, fault: true, engines: [Forwarder, Tunnel, KeyedTunnel, Stack];
    /// A TCP or UDP checksum that does not add up, found where a packet is handed to a stack that trusts the
    /// checksums it is given (the smoltcp adapter).
    BadChecksum => bad_checksum, fault: true, engines: [Stack];
    /// A tunnel's datagram that could not reach its destination (no route, address gone, refused by a firewall).
    Unreachable => unreachable, fault: false, engines: [Tunnel, KeyedTunnel];
    /// A packet into a tunnel whose destination no peer covers (WireGuard: no AllowedIPs entry), or a peer
    /// without a known endpoint.
    NoPeer => no_peer, fault: false, engines: [KeyedTunnel];
    /// A datagram that failed authentication (wrong key, bad MAC or tag), or a handshake message no configured
    /// peer made.
    Unauthenticated => unauthenticated, fault: true, engines: [Tunnel, KeyedTunnel];
    /// A datagram whose counter was seen before or is too old (replay protection).
    Replayed => replayed, fault: true, engines: [KeyedTunnel];
    /// A packet out of a tunnel whose inner source address the sending peer may not use (WireGuard: not in its
    /// AllowedIPs).
    NotAllowed => not_allowed, fault: true, engines: [KeyedTunnel];
    /// A packet for a peer with no session that the protocol could not hold until its handshake (its queue full,
    /// or the handshake given up).
    NoSession => no_session, fault: false, engines: [KeyedTunnel];
    /// Congestion marked on the outer header of a packet whose transport is not ECN-capable (RFC 6040 says drop).
    CeOnNotEct => ce_on_not_ect, fault: false, engines: [Tunnel, KeyedTunnel];
    /// A datagram too short or otherwise not of the tunnel's protocol.
    MalformedDatagram => malformed_datagram, fault: true, engines: [Tunnel, KeyedTunnel];
    /// A handshake message refused under load before any key work was spent on it (WireGuard: without a valid
    /// cookie, answered with a cookie reply; its source over its rate; or the handshake queue full).
    RateLimited => rate_limited, fault: false, engines: [KeyedTunnel];
    /// A virtqueue descriptor chain a guest made that cannot be followed: a buffer outside the guest's memory, a
    /// chain that loops or ends in a descriptor that cannot be read, or a buffer of the wrong direction (one the
    /// device may write in a transmit chain, none it may write in a receive chain). The chain is returned to the
    /// guest unused and the ring goes on.
    BadDescriptor => bad_descriptor, fault: true, engines: [VhostUser];
}

/// The kinds of engine that count packets, each with the drop reasons it can give ([`DropReason::applies_to`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Engine {
    /// Packets between two devices ([`crate::forward`]).
    Forwarder,
    /// Packets between a device and UDP without a protocol of its own ([`crate::tunnel::Plain`]).
    Tunnel,
    /// A tunnel whose protocol has keys, peers and sessions (WireGuard).
    KeyedTunnel,
    /// A network stack over a queue (the smoltcp adapter).
    Stack,
    /// A vhost-user-net backend: a guest's virtqueues on one side, a TAP device on the other
    /// (`turbotun::vhost_user`).
    VhostUser,
}

impl Engine {
    /// Every kind of engine.
    pub const ALL: [Engine; 5] =
        [Engine::Forwarder, Engine::Tunnel, Engine::KeyedTunnel, Engine::Stack, Engine::VhostUser];

    /// Its name in counters output.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Forwarder => "forwarder",
            Engine::Tunnel => "tunnel",
            Engine::KeyedTunnel => "keyed_tunnel",
            Engine::Stack => "stack",
            Engine::VhostUser => "vhost_user",
        }
    }

    /// The engine of this name ([`Self::as_str`]).
    pub fn from_name(name: &str) -> Option<Engine> {
        Engine::ALL.into_iter().find(|e| e.as_str() == name)
    }

    /// The drop reasons an engine of this kind can give, in the order [`Drops`] lists them.
    pub fn drop_reasons(self) -> impl Iterator<Item = DropReason> {
        DropReason::ALL.iter().copied().filter(move |r| r.applies_to(self))
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do with a packet when the destination queue is full (`EAGAIN`; a tun queue is only ever full
/// with a limited `TUNSETSNDBUF`, its default send buffer is unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WhenFull {
    /// Wait until the queue takes it (backpressure: the reader slows down, the kernel's ring holds the rest).
    #[default]
    Wait,
    /// Count it as [`DropReason::QueueFull`] and go on.
    Drop,
}

impl Drops {
    /// Counts `n` packets dropped for `reason`.
    pub fn add(&mut self, reason: DropReason, n: u64) {
        *self.slot(reason) += n;
    }

    /// Adds every reason's count of `other`.
    pub fn add_all(&mut self, other: &Drops) {
        for &reason in DropReason::ALL {
            self.add(reason, other.get(reason));
        }
    }

    /// Packets dropped for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        let mut copy = *self;
        *copy.slot(reason)
    }

    /// All drops.
    pub fn total(&self) -> u64 {
        DropReason::ALL.iter().map(|&r| self.get(r)).sum()
    }

    /// Drops that point at a fault (see [`DropReason::is_fault`]).
    pub fn faults(&self) -> u64 {
        DropReason::ALL.iter().filter(|r| r.is_fault()).map(|&r| self.get(r)).sum()
    }
}

/// Declares [`Counters`] and the per-field operations over it once, so that adding a counter is one line.
macro_rules! counters {
    ($($(#[$doc:meta])* $field:ident),* $(,)?) => {
        /// What one direction (or one batch object, or the whole forwarder) moved. Cumulative.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        #[non_exhaustive]
        pub struct Counters {
            $($(#[$doc])* pub $field: u64,)*
            /// Packets read and not written, by reason.
            pub drops: Drops,
        }

        impl Counters {
            /// Adds every counter of `other` to this one.
            pub fn add(&mut self, other: &Counters) {
                $(self.$field += other.$field;)*
                self.drops.add_all(&other.drops);
            }

            /// The counters' names, in the order they are declared (the names counters output uses).
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($field),)*];

            /// Each counter with its name, in the order of [`Self::FIELDS`] (the drops apart).
            pub fn fields(&self) -> [(&'static str, u64); Self::FIELDS.len()] {
                [$((stringify!($field), self.$field),)*]
            }

            /// Sets the counter named `name` ([`Self::FIELDS`]); false if there is none of that name.
            pub fn set_field(&mut self, name: &str, value: u64) -> bool {
                match name {
                    $(stringify!($field) => self.$field = value,)*
                    _ => return false,
                }
                true
            }

            /// What changed since `earlier` (an older copy of the same cumulative counters).
            pub fn since(&self, earlier: &Counters) -> Counters {
                let mut delta = Counters { $($field: self.$field.saturating_sub(earlier.$field),)* ..Counters::default() };
                for &reason in DropReason::ALL {
                    delta.drops.add(reason, self.drops.get(reason).saturating_sub(earlier.drops.get(reason)));
                }
                delta
            }
        }

        /// [`Counters`] that several threads add to and anyone reads, on a cache line of its own.
        #[repr(align(64))]
        #[derive(Debug, Default)]
        pub struct SharedCounters {
            $($field: AtomicU64,)*
            drops: [AtomicU64; DropReason::ALL.len()],
        }

        impl SharedCounters {
            /// Adds `delta` (relaxed: counters need no ordering with the packets they count).
            pub fn add(&self, delta: &Counters) {
                $(if delta.$field > 0 { self.$field.fetch_add(delta.$field, Ordering::Relaxed); })*
                // Most additions carry no drop: one comparison then, not a look at every reason.
                if delta.drops == Drops::default() {
                    return;
                }
                for (i, &reason) in DropReason::ALL.iter().enumerate() {
                    let n = delta.drops.get(reason);
                    if n > 0 {
                        self.drops[i].fetch_add(n, Ordering::Relaxed);
                    }
                }
            }

            /// The counters as they are now.
            pub fn snapshot(&self) -> Counters {
                let mut c = Counters { $($field: self.$field.load(Ordering::Relaxed),)* ..Counters::default() };
                for (i, &reason) in DropReason::ALL.iter().enumerate() {
                    c.drops.add(reason, self.drops[i].load(Ordering::Relaxed));
                }
                c
            }
        }
    };
}

counters! {
    /// Reads that returned a frame.
    reads,
    /// Packets written (or, where packets are split, handed to the application): segments of a split
    /// super-packet count one each, a super-packet forwarded whole counts once.
    packets,
    /// Bytes of those packets, virtio header excluded.
    bytes,
    /// Reads that returned a GSO super-packet.
    super_packets,
    /// Super-packets split without copying a payload byte (the read scattered each segment's payload into its
    /// own buffer).
    zero_copy_splits,
    /// Packets produced by reads: one per plain packet, one per segment of a split super-packet.
    segments,
    /// Packets merged into another before writing (written as part of it).
    coalesced,
    /// Writes issued.
    writes,
    /// Coalesced writes the kernel refused, after which that GRO kind was turned off and the packet re-split.
    gro_fallbacks,
    /// Segmented UDP sends the kernel refused (the datagrams then sent one per message; on `EIO`/`EINVAL`
    /// segmentation goes off for that socket).
    gso_fallbacks,
    /// A tunnel protocol's own datagrams (handshakes, keepalives, cookie replies), sent or received.
    control,
    /// ICMP errors a tunnel wrote back to its device: "destination unreachable" to the senders of packets it had
    /// nowhere to send (those packets are counted as drops too).
    icmp_errors,
    /// Packets a tunnel protocol kept to send once its handshake is done (they leave later, counted then as
    /// control datagrams, or are counted as `no_session` drops).
    held,
}

/// What this process holds right now: resident memory and open file descriptors (from `/proc/self`). Sampled
/// over a long run, flat figures show that nothing leaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ProcessUsage {
    /// Resident set size in KiB (`VmRSS`).
    pub rss_kb: u64,
    /// Highest resident set size so far in KiB (`VmHWM`).
    pub peak_rss_kb: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// Threads.
    pub threads: u64,
}

impl ProcessUsage {
    /// Reads `/proc/self/status` and counts `/proc/self/fd`.
    pub fn now() -> std::io::Result<ProcessUsage> {
        let status = std::fs::read_to_string("/proc/self/status")?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        // The directory handle used to list the fds is one of them.
        let open_fds = std::fs::read_dir("/proc/self/fd")?.count().saturating_sub(1) as u64;
        Ok(ProcessUsage { rss_kb: field("VmRSS:"), peak_rss_kb: field("VmHWM:"), open_fds, threads: field("Threads:") })
    }
}

/// Packets between two additions to the shared counters while busy: the shared atomics sit on a cache line
/// that other threads read, so adding per packet would cost more than the packet.
pub(crate) const FLUSH_EVERY: u64 = 64;

/// Milliseconds after which a busy worker's counters reach the shared ones however few packets it moved: a
/// worker that reads one packet a second (a ping through a blocking read) shows it within this, not after 64.
pub(crate) const FLUSH_AFTER_MS: u64 = 100;

/// A coarse monotonic clock in milliseconds (the kernel's tick, a few ms; no system call through the vDSO):
/// cheap enough to read once a batch.
fn coarse_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    (t.tv_sec as u64).saturating_mul(1000) + (t.tv_nsec as u64) / 1_000_000
}

/// Adds a worker's cumulative counters to the shared ones, as differences since the last time.
#[derive(Debug)]
pub(crate) struct Flusher<'a> {
    shared: &'a SharedCounters,
    /// A second set the same differences go to (a tunnel queue's own counters beside the tunnel's).
    also: Option<&'a SharedCounters>,
    last: Counters,
    /// When it last flushed ([`coarse_ms`]).
    last_ms: u64,
}

impl<'a> Flusher<'a> {
    pub(crate) fn new(shared: &'a SharedCounters) -> Self {
        Flusher { shared, also: None, last: Counters::default(), last_ms: coarse_ms() }
    }

    /// Adds the same differences to `also` too.
    pub(crate) fn and(mut self, also: Option<&'a SharedCounters>) -> Self {
        self.also = also;
        self
    }

    /// Adds what changed since the last flush; returns it.
    pub(crate) fn flush(&mut self, now: Counters) -> Counters {
        let delta = now.since(&self.last);
        self.shared.add(&delta);
        if let Some(also) = self.also {
            also.add(&delta);
        }
        self.last = now;
        self.last_ms = coarse_ms();
        delta
    }

    /// Whether `now` holds counts the shared counters do not have yet: a frame was read since the last flush
    /// (every other count moves only with a read). One comparison, as it is asked once a packet.
    pub(crate) fn has_unshared(&self, now: &Counters) -> bool {
        now.reads != self.last.reads
    }

    /// Flushes once [`FLUSH_EVERY`] frames were read since the last flush, or [`FLUSH_AFTER_MS`] passed.
    pub(crate) fn maybe_flush(&mut self, now: Counters) {
        if now.reads.saturating_sub(self.last.reads) >= FLUSH_EVERY || coarse_ms() >= self.last_ms + FLUSH_AFTER_MS {
            self.flush(now);
        }
    }
}

/// The counters of one direction's batch halves together (their fields do not overlap).
pub(crate) fn batch_counts(rx: Counters, tx: Counters) -> Counters {
    let mut c = rx;
    c.add(&tx);
    c
}

/// [`batch_counts`] at the end of a worker: `pending` segments still in the receive half were read and will
/// not be written.
pub(crate) fn final_batch_counts(rx: Counters, tx: Counters, pending: usize) -> Counters {
    let mut c = batch_counts(rx, tx);
    c.drops.add(DropReason::Stopped, pending as u64);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_worker_that_reads_little_still_shows_it_within_the_flush_time() {
        let shared = SharedCounters::default();
        let mut flusher = Flusher::new(&shared);
        let one = Counters { reads: 1, packets: 1, ..Counters::default() };
        // Just flushed: one packet waits for more.
        flusher.last_ms = coarse_ms() + 60_000;
        flusher.maybe_flush(one);
        assert_eq!(shared.snapshot().packets, 0);
        // FLUSH_AFTER_MS later: it goes, although far fewer than FLUSH_EVERY were read.
        flusher.last_ms = coarse_ms().saturating_sub(FLUSH_AFTER_MS);
        flusher.maybe_flush(one);
        assert_eq!(shared.snapshot().packets, 1);
    }

    #[test]
    fn test_add_since_and_snapshot_agree() {
        let mut a = Counters { reads: 3, packets: 10, bytes: 1000, ..Counters::default() };
        a.drops.add(DropReason::Malformed, 2);
        a.drops.add(DropReason::DeviceDown, 1);
        let earlier = a;
        a.reads += 4;
        a.drops.add(DropReason::Malformed, 5);
        let delta = a.since(&earlier);
        assert_eq!(delta.reads, 4);
        assert_eq!(delta.packets, 0);
        assert_eq!(delta.drops.malformed, 5);
        assert_eq!(delta.drops.device_down, 0);

        let shared = SharedCounters::default();
        shared.add(&earlier);
        shared.add(&delta);
        assert_eq!(shared.snapshot(), a);
        assert_eq!(a.drops.total(), 8);
        assert_eq!(a.drops.faults(), 7);
    }

    #[test]
    fn test_process_usage_reads_proc() {
        let before = ProcessUsage::now().unwrap();
        assert!(before.rss_kb > 0 && before.peak_rss_kb >= before.rss_kb && before.threads >= 1, "{before:?}");
        // Other tests of this process open and close fds meanwhile: an fd opened between two readings is seen
        // as exactly one more in a quiet moment, which comes within a few tries.
        let counted = (0..200).any(|_| {
            let before = ProcessUsage::now().unwrap().open_fds;
            let file = std::fs::File::open("/proc/self/status").unwrap();
            let after = ProcessUsage::now().unwrap().open_fds;
            drop(file);
            after == before + 1
        });
        assert!(counted, "an fd opened is counted");
    }

    #[test]
    fn test_names_round_trip_and_reasons_apply_by_engine() {
        for &r in DropReason::ALL {
            assert_eq!(DropReason::from_name(r.as_str()), Some(r));
            assert!(Engine::ALL.iter().any(|&e| r.applies_to(e)), "{r} applies to some engine");
        }
        assert_eq!(DropReason::from_name("nonsense"), None);
        // A forwarder gives none of a tunnel's reasons; a plain tunnel none of a keyed protocol's.
        assert!(!Engine::Forwarder.drop_reasons().any(|r| r == DropReason::NoPeer || r == DropReason::Unreachable));
        assert!(Engine::Forwarder.drop_reasons().any(|r| r == DropReason::DeviceDown));
        assert!(!Engine::Tunnel.drop_reasons().any(|r| r == DropReason::Replayed));
        assert!(Engine::KeyedTunnel.drop_reasons().any(|r| r == DropReason::NoPeer));
        for e in Engine::ALL {
            assert_eq!(Engine::from_name(e.as_str()), Some(e));
        }
        let mut c = Counters::default();
        for (i, name) in Counters::FIELDS.iter().enumerate() {
            assert!(c.set_field(name, i as u64 + 1), "{name}");
        }
        assert!(!c.set_field("drops", 1));
        assert_eq!(
            c.fields().iter().map(|&(_, v)| v).collect::<Vec<_>>(),
            (1..=Counters::FIELDS.len() as u64).collect::<Vec<_>>()
        );
    }

    #[test]
    fn test_every_reason_has_its_own_slot() {
        let mut d = Drops::default();
        for (i, &r) in DropReason::ALL.iter().enumerate() {
            d.add(r, 1 << i);
        }
        for (i, &r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(d.get(r), 1 << i, "{r}");
        }
    }
}
