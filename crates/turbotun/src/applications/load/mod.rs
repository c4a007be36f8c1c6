//! A paced UDP load generator and a sink that counts what arrived, per flow.
//!
//! [`Generator`] sends datagrams of a fixed size to one address at an offered rate (packets per second, paced
//! by a token bucket against the monotonic clock), from several flows (one socket, hence one source port, per
//! flow), in `sendmmsg` batches and optionally with UDP GSO (`UDP_SEGMENT`). Every datagram starts with a
//! [`Header`]: flow id, sequence number within the flow, send time.
//!
//! [`Sink`] receives them in `recvmmsg` batches (optionally with `UDP_GRO`, splitting each coalesced read by
//! its segment size), on a socket with a large receive buffer whose own drop counter (`SO_RXQ_OVFL`) it reads
//! back, and counts every flow with a [`FlowTracker`]: received, lost, reordered, duplicated.
//!
//! ```no_run
//! use std::time::Duration;
//! use turbotun::load::{Generator, SinkBuilder};
//!
//! # fn main() -> turbotun::Result<()> {
//! let sink = SinkBuilder::new("127.0.0.1:9000".parse().unwrap()).gro(true).idle_timeout(Duration::from_secs(1)).bind()?;
//! let dest = sink.local_addr()?;
//! let receiving = std::thread::spawn(move || sink.run());
//! let sent = Generator::new(dest).rate(100_000).size(64).flows(4).duration(Duration::from_secs(2)).run()?;
//! let received = receiving.join().expect("sink thread")?;
//! println!("sent {} received {} lost {}", sent.sent, received.datagrams, received.lost);
//! # Ok(())
//! # }
//! ```
//!
//! Nothing is allocated per packet: each side allocates its buffers once, and the sink a tracker per new flow.

use std::time::Duration;

pub use generator::{Generator, GeneratorReport, SendErrors};
pub use sink::{FlowReport, Sink, SinkBuilder, SinkReport, DEFAULT_RCVBUF};

mod generator;
mod sink;

/// Bytes of [`Header`] at the start of every datagram: the smallest datagram size.
pub const HEADER_LEN: usize = 16;

/// The largest sequence number a [`Header`] carries (48 bits: at 10 Mpps one flow takes 325 days to get there).
pub const MAX_SEQ: u64 = (1 << 48) - 1;

/// Most datagrams per GSO send: the kernel's `UDP_MAX_SEGMENTS` was 64 until Linux 6.10 and is 128 since, so 64
/// works everywhere.
pub const MAX_SEGMENTS: u16 = 64;

/// The most a paced [`Generator`] catches up after falling behind (a late wake-up, a descheduled thread): the
/// token bucket holds at most this long's worth of datagrams.
pub const BURST: Duration = Duration::from_millis(10);

/// Most flows of one generator (one socket each), and the sink's default limit on the flow ids it tracks.
pub const MAX_FLOWS: usize = 1024;

/// The largest UDP payload over IPv4 (65535 minus the IPv4 and UDP headers); with GSO, of all segments together.
pub const MAX_PAYLOAD: usize = 65507;

/// How many sequence numbers below the highest one seen a [`FlowTracker`] remembers exactly.
pub const WINDOW: u64 = 4096;

/// The header at the start of every generated datagram, big-endian:
/// bytes 0..2 the flow id, 2..8 the sequence number within the flow (48 bits, from 0), 8..16 the send time
/// (`CLOCK_MONOTONIC` in nanoseconds, comparable with the clock of any process on the same machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Which flow (the generator's socket index).
    pub flow: u16,
    /// Sequence number within the flow, from 0, at most [`MAX_SEQ`].
    pub seq: u64,
    /// When the batch holding the datagram was handed to the kernel, `CLOCK_MONOTONIC` nanoseconds.
    pub sent_ns: u64,
}

impl Header {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `buf`; false (nothing written) if `buf` is
    /// shorter. A sequence number above [`MAX_SEQ`] keeps its low 48 bits.
    pub fn write(&self, buf: &mut [u8]) -> bool {
        let Some(out) = buf.get_mut(..HEADER_LEN) else { return false };
        out[..2].copy_from_slice(&self.flow.to_be_bytes());
        out[2..8].copy_from_slice(&(self.seq & MAX_SEQ).to_be_bytes()[2..]);
        out[8..].copy_from_slice(&self.sent_ns.to_be_bytes());
        true
    }

    /// Reads the header at the start of `buf`; None if `buf` is shorter than [`HEADER_LEN`].
    pub fn parse(buf: &[u8]) -> Option<Header> {
        let b: &[u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
        let mut seq = [0u8; 8];
        seq[2..].copy_from_slice(&b[2..8]);
        let mut sent = [0u8; 8];
        sent.copy_from_slice(&b[8..]);
        Some(Header {
            flow: u16::from_be_bytes([b[0], b[1]]),
            seq: u64::from_be_bytes(seq),
            sent_ns: u64::from_be_bytes(sent),
        })
    }
}

/// The current `CLOCK_MONOTONIC` time in nanoseconds, the clock of [`Header::sent_ns`].
pub fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(now.tv_nsec as u64)
}

/// What happened to one arriving sequence number (see [`FlowTracker::record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The next one expected.
    InOrder,
    /// Above the next one expected: the `skipped` numbers in between are counted lost until they arrive.
    Ahead {
        /// Sequence numbers jumped over.
        skipped: u64,
    },
    /// Below the highest seen, not seen before and within the window: a hole filled, moved from lost to
    /// reordered.
    Reordered,
    /// Seen before, within the window.
    Duplicate,
    /// More than [`WINDOW`] below the highest seen: too old to tell a late arrival from a duplicate.
    Stale,
}

/// A flow's counts. `received = (expected - lost) + duplicated + stale`, where `expected - lost` is the number
/// of distinct sequence numbers received (the in-order ones and the reordered ones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct FlowCounts {
    /// Datagrams received, whatever they were.
    pub received: u64,
    /// Sequence numbers below the highest seen that have not arrived (yet).
    pub lost: u64,
    /// Arrivals below the highest seen that filled a hole (they were counted lost until then).
    pub reordered: u64,
    /// Arrivals of a sequence number already received (within the window).
    pub duplicated: u64,
    /// Arrivals more than [`WINDOW`] below the highest seen (neither lost nor duplicates can be told; `lost`
    /// keeps counting the number as missing).
    pub stale: u64,
    /// The highest sequence number seen plus one (0 before any): a sender that knows how many it sent learns
    /// the loss at the tail, after the last arrival, from the difference.
    pub expected: u64,
}

/// Counts one flow's arrivals from their sequence numbers (starting at 0), with no I/O.
///
/// The rule: a sequence number is *lost* while a higher one has arrived and it has not. When it does arrive
/// later, within [`WINDOW`] numbers of the highest seen, it stops being lost and is counted *reordered*; a
/// second arrival of a number within the window is *duplicated*. So at the end `lost` counts the holes still
/// open, and a late datagram is never counted both lost and received. Anything older than the window is
/// *stale* and leaves `lost` as it is. Numbers lost after the last arrival are invisible here (see
/// [`FlowCounts::expected`]).
///
/// The window is a ring of [`WINDOW`] bits indexed by sequence number modulo its size: bit `s % WINDOW` says
/// whether `s` arrived, for `s` in `expected - WINDOW .. expected`.
#[derive(Debug, Clone)]
pub struct FlowTracker {
    counts: FlowCounts,
    seen: [u64; (WINDOW / 64) as usize],
}

impl Default for FlowTracker {
    fn default() -> Self {
        FlowTracker::new()
    }
}

impl FlowTracker {
    /// A flow before its first arrival.
    pub fn new() -> Self {
        FlowTracker { counts: FlowCounts::default(), seen: [0; (WINDOW / 64) as usize] }
    }

    fn slot(seq: u64) -> (usize, u64) {
        let bit = seq % WINDOW;
        ((bit / 64) as usize, 1 << (bit % 64))
    }

    fn test_and_set(&mut self, seq: u64) -> bool {
        let (word, mask) = Self::slot(seq);
        let was = self.seen[word] & mask != 0;
        self.seen[word] |= mask;
        was
    }

    /// Counts the arrival of `seq` and says what it was.
    pub fn record(&mut self, seq: u64) -> Arrival {
        let c = &mut self.counts;
        c.received += 1;
        if seq >= c.expected {
            let skipped = seq - c.expected;
            c.lost = c.lost.saturating_add(skipped);
            // The bits of the numbers passed over held numbers WINDOW older, now out of the window: clear them.
            if skipped >= WINDOW {
                self.seen = [0; (WINDOW / 64) as usize];
            } else {
                for s in c.expected..seq {
                    let (word, mask) = Self::slot(s);
                    self.seen[word] &= !mask;
                }
            }
            c.expected = seq.saturating_add(1);
            let (word, mask) = Self::slot(seq);
            self.seen[word] |= mask;
            return if skipped == 0 { Arrival::InOrder } else { Arrival::Ahead { skipped } };
        }
        if c.expected - seq > WINDOW {
            c.stale += 1;
            return Arrival::Stale;
        }
        if self.test_and_set(seq) {
            self.counts.duplicated += 1;
            Arrival::Duplicate
        } else {
            self.counts.reordered += 1;
            // Every number in the window below `expected` that has not arrived was counted lost when it was
            // jumped over, so this cannot underflow; saturating all the same, a counter must never panic.
            self.counts.lost = self.counts.lost.saturating_sub(1);
            Arrival::Reordered
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> FlowCounts {
        self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn track(seqs: &[u64]) -> FlowCounts {
        let mut t = FlowTracker::new();
        for &s in seqs {
            t.record(s);
        }
        t.counts()
    }

    #[test]
    fn test_header_round_trip_and_short_buffers() {
        let h = Header { flow: 0xbeef, seq: MAX_SEQ, sent_ns: 0x0102_0304_0506_0708 };
        let mut buf = [0u8; 20];
        assert!(h.write(&mut buf));
        assert_eq!(Header::parse(&buf), Some(h));
        assert_eq!(&buf[..2], &[0xbe, 0xef]);
        assert!(!h.write(&mut [0u8; 15]));
        assert_eq!(Header::parse(&buf[..15]), None);
        // Above 48 bits only the low 48 travel.
        let mut big = h;
        big.seq = (1 << 48) | 5;
        big.write(&mut buf);
        assert_eq!(Header::parse(&buf).unwrap().seq, 5);
    }

    #[test]
    fn test_in_order_counts_nothing_missing() {
        let c = track(&(0..10_000).collect::<Vec<_>>());
        assert_eq!(c, FlowCounts { received: 10_000, expected: 10_000, ..FlowCounts::default() });
    }

    #[test]
    fn test_loss_is_the_holes_below_the_highest() {
        let mut t = FlowTracker::new();
        assert_eq!(t.record(2), Arrival::Ahead { skipped: 2 }); // 0 and 1 never came
        assert_eq!(t.record(3), Arrival::InOrder);
        assert_eq!(t.record(7), Arrival::Ahead { skipped: 3 });
        let c = t.counts();
        assert_eq!((c.received, c.lost, c.expected), (3, 5, 8));
    }

    #[test]
    fn test_late_arrival_after_being_counted_lost_becomes_reordered() {
        let mut t = FlowTracker::new();
        t.record(0);
        t.record(3);
        assert_eq!(t.counts().lost, 2);
        assert_eq!(t.record(1), Arrival::Reordered);
        let c = t.counts();
        assert_eq!((c.lost, c.reordered), (1, 1), "1 moved from lost to reordered, 2 is still missing");
        assert_eq!(t.record(2), Arrival::Reordered);
        assert_eq!((t.counts().lost, t.counts().reordered), (0, 2));
    }

    #[test]
    fn test_duplicates_in_order_and_late() {
        let mut t = FlowTracker::new();
        t.record(0);
        assert_eq!(t.record(0), Arrival::Duplicate);
        t.record(2);
        assert_eq!(t.record(1), Arrival::Reordered);
        assert_eq!(t.record(1), Arrival::Duplicate);
        assert_eq!(t.record(2), Arrival::Duplicate);
        let c = t.counts();
        assert_eq!((c.received, c.lost, c.reordered, c.duplicated), (6, 0, 1, 3));
    }

    #[test]
    fn test_window_wraps_and_forgets_old_numbers() {
        let mut t = FlowTracker::new();
        // Several turns of the ring in order: every bit is reused, none reads as a duplicate.
        for s in 0..3 * WINDOW + 17 {
            assert_eq!(t.record(s), Arrival::InOrder, "{s}");
        }
        let top = 3 * WINDOW + 16;
        // The oldest number still in the window is a duplicate; one below it is stale.
        assert_eq!(t.record(top + 1 - WINDOW), Arrival::Duplicate);
        assert_eq!(t.record(top - WINDOW), Arrival::Stale);
        // A gap that wraps the ring: the skipped numbers' bits (set one turn earlier) must read as missing.
        assert_eq!(t.record(top + 100), Arrival::Ahead { skipped: 99 });
        for s in top + 1..top + 100 {
            assert_eq!(t.record(s), Arrival::Reordered, "{s}");
        }
        // A jump past the whole window clears it.
        let far = top + 100 + 3 * WINDOW;
        assert_eq!(t.record(far), Arrival::Ahead { skipped: 3 * WINDOW - 1 });
        assert_eq!(t.record(far - 1), Arrival::Reordered);
        assert_eq!(t.record(far + 1 - WINDOW), Arrival::Reordered);
        assert_eq!(t.record(far - WINDOW), Arrival::Stale);
        let c = t.counts();
        assert_eq!(c.lost, 3 * WINDOW - 1 - 2, "stale arrivals do not reduce the loss");
        assert_eq!(c.stale, 2);
        assert_eq!(c.received, (c.expected - c.lost) + c.duplicated + c.stale);
    }

    #[test]
    fn test_sequence_numbers_near_the_top_do_not_overflow() {
        let mut t = FlowTracker::new();
        t.record(MAX_SEQ);
        assert_eq!(t.record(MAX_SEQ), Arrival::Duplicate);
        // Not a header's value, but a tracker fed by hand must not panic either.
        t.record(u64::MAX);
        t.record(u64::MAX);
        assert_eq!(t.counts().received, 4);
    }

    /// The same counts from a set of everything seen, with no window (valid as long as nothing arrives more
    /// than WINDOW below the highest seen, which the strategy below guarantees).
    fn oracle(arrivals: &[u64]) -> FlowCounts {
        let mut seen = std::collections::HashSet::new();
        let mut c = FlowCounts::default();
        for &s in arrivals {
            c.received += 1;
            if !seen.insert(s) {
                c.duplicated += 1;
            } else if s < c.expected {
                c.reordered += 1;
            }
            c.expected = c.expected.max(s + 1);
        }
        c.lost = c.expected - seen.len() as u64;
        c
    }

    proptest! {
        /// 0..n with some numbers dropped, some sent twice, and every arrival moved by less than half the
        /// window (sorted by index + a random delay), counted exactly.
        #[test]
        fn prop_drops_duplicates_and_reordering_are_counted_exactly(
            n in 0u64..3000,
            drop_pct in 0u32..40,
            dup_pct in 0u32..20,
            delay in 0u64..WINDOW / 2,
            seed in any::<u64>(),
        ) {
            let mut rng = seed | 1;
            let mut next = move || { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; rng };
            let mut keyed = Vec::new();
            for s in 0..n {
                if next() % 100 < u64::from(drop_pct) {
                    continue;
                }
                let copies = if next() % 100 < u64::from(dup_pct) { 2 } else { 1 };
                for _ in 0..copies {
                    keyed.push((s + next() % (delay + 1), s));
                }
            }
            keyed.sort_by_key(|&(key, _)| key);
            let arrivals: Vec<u64> = keyed.into_iter().map(|(_, s)| s).collect();
            let got = track(&arrivals);
            prop_assert_eq!(got, oracle(&arrivals));
            prop_assert_eq!(got.stale, 0);
            prop_assert_eq!(got.received, (got.expected - got.lost) + got.duplicated);
        }
    }
}
