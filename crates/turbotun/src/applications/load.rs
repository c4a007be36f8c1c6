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

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::dataplane::udp::{RecvSlots, MAX_MMSG};
use crate::error::{ConfigError, Error, Result};
use crate::stop::StopHandle;
use crate::sys;
use rustix::net::sockopt;

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

/// Send failures by kind, in datagrams not sent. None is silent: each is counted and the generator goes on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct SendErrors {
    /// `ENOBUFS`: no room in a queue on the way out (a qdisc or a device).
    pub nobufs: u64,
    /// `EAGAIN`: the socket's send buffer was full.
    pub again: u64,
    /// `ECONNREFUSED`: an ICMP port unreachable came back (no sink was listening yet).
    pub refused: u64,
}

impl SendErrors {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.nobufs + self.again + self.refused
    }
}

/// What a [`Generator`] did.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct GeneratorReport {
    /// The rate asked for, datagrams per second (0: unlimited).
    pub rate_pps: u64,
    /// The rate the pacer released datagrams at: `attempted / seconds` (the asked rate unless the sender could
    /// not keep up).
    pub offered_pps: f64,
    /// `sent / seconds`.
    pub achieved_pps: f64,
    /// UDP payload bytes per datagram.
    pub size: usize,
    /// Flows (sockets).
    pub flows: usize,
    /// Datagrams per send (1: no GSO).
    pub segments: u16,
    /// Datagrams released by the pacer: `sent + send_errors`; each used one sequence number of its flow.
    pub attempted: u64,
    /// Datagrams the kernel took.
    pub sent: u64,
    /// Datagrams not sent, all kinds (see `errors`).
    pub send_errors: u64,
    /// Datagrams not sent, by kind.
    pub errors: SendErrors,
    /// `sendmmsg` calls.
    pub calls: u64,
    /// From the first send to the end of the last.
    pub seconds: f64,
    /// Sequence numbers used per flow (index = flow id): what a sink's [`FlowCounts::expected`] of that flow
    /// is when nothing was lost at the tail.
    pub per_flow: Vec<u64>,
}

/// Sends datagrams with a [`Header`] to one address at a paced rate. Built with the setters, started with
/// [`Generator::run`], which returns when the duration is over or the stop handle fires.
///
/// Pacing: a token bucket filled at the rate from the monotonic clock, holding at most [`BURST`] worth of
/// datagrams (and at least two batches). When it holds
/// less than one send, the generator sleeps until about a millisecond's worth (at most a batch) has
/// accumulated, so it never spins; a send takes what the bucket holds, up to a batch. Batches go to the flows
/// in turn.
#[derive(Debug, Clone)]
pub struct Generator {
    dest: SocketAddr,
    rate: u64,
    size: usize,
    flows: usize,
    duration: Duration,
    segments: u16,
    batch: usize,
    stop: Option<StopHandle>,
    /// Given by [`Generator::socket`]; shared so that the generator stays `Clone` and each run sends from a
    /// handle of the same socket.
    socket: Option<Arc<UdpSocket>>,
}

impl Generator {
    /// Most sends per `sendmmsg` batch.
    pub const MAX_BATCH: usize = MAX_MMSG;

    /// A generator toward `dest`: unlimited rate, 64-byte datagrams, one flow, one second, no GSO, batches of
    /// [`Self::MAX_BATCH`] sends.
    pub fn new(dest: SocketAddr) -> Self {
        Generator {
            dest,
            rate: 0,
            size: 64,
            flows: 1,
            duration: Duration::from_secs(1),
            segments: 1,
            batch: MAX_MMSG,
            stop: None,
            socket: None,
        }
    }

    /// Offered rate in datagrams per second; 0 sends as fast as the kernel takes them.
    pub fn rate(mut self, pps: u64) -> Self {
        self.rate = pps;
        self
    }

    /// UDP payload bytes per datagram, from [`HEADER_LEN`] up to [`MAX_PAYLOAD`].
    pub fn size(mut self, bytes: usize) -> Self {
        self.size = bytes;
        self
    }

    /// Flows, each its own socket and source port, 1 to [`MAX_FLOWS`].
    pub fn flows(mut self, n: usize) -> Self {
        self.flows = n;
        self
    }

    /// How long to send.
    pub fn duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// Datagrams per send with UDP GSO (`UDP_SEGMENT`), 1 (no GSO) to [`MAX_SEGMENTS`].
    pub fn gso(mut self, segments: u16) -> Self {
        self.segments = segments;
        self
    }

    /// Sends per `sendmmsg`, 1 to [`Self::MAX_BATCH`].
    pub fn batch(mut self, sends: usize) -> Self {
        self.batch = sends;
        self
    }

    /// Stops early when `stop` fires (e.g. from a signal).
    pub fn stop_handle(mut self, stop: StopHandle) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Sends from this socket (one flow) instead of opening one of its own; [`Self::run`] connects it to the
    /// destination. With a second handle on a [`Sink`]'s socket ([`Sink::try_clone_socket`]) the answers of
    /// an echo, which swaps addresses and ports, come back to that sink, and only they do: a connected
    /// socket receives from its peer alone.
    pub fn socket(mut self, socket: UdpSocket) -> Self {
        self.socket = Some(Arc::new(socket));
        self
    }

    /// Checks the settings; [`Self::run`] does too, before opening anything.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Config(ConfigError::Size { why: what }));
        if self.size < HEADER_LEN || self.size > MAX_PAYLOAD {
            return bad(format!(
                "datagram size {} out of range: {HEADER_LEN} (the load header) to {MAX_PAYLOAD}",
                self.size
            ));
        }
        if self.flows == 0 || self.flows > MAX_FLOWS {
            return bad(format!("{} flows out of range: 1 to {MAX_FLOWS}", self.flows));
        }
        if self.socket.is_some() && self.flows != 1 {
            return Err(Error::Config(ConfigError::Conflict {
                why: format!("{} flows from one given socket: a flow is a socket, so one flow only", self.flows),
            }));
        }
        if self.segments == 0 || self.segments > MAX_SEGMENTS {
            return bad(format!("{} GSO segments out of range: 1 (no GSO) to {MAX_SEGMENTS}", self.segments));
        }
        if self.segments > 1 && self.size * usize::from(self.segments) > MAX_PAYLOAD {
            return bad(format!(
                "{} GSO segments of {} bytes make a send of {} bytes, more than UDP's {MAX_PAYLOAD}",
                self.segments,
                self.size,
                self.size * usize::from(self.segments)
            ));
        }
        if self.batch == 0 || self.batch > MAX_MMSG {
            return bad(format!("batch of {} sends out of range: 1 to {MAX_MMSG}", self.batch));
        }
        if self.duration.is_zero() {
            return bad("duration must be more than zero".into());
        }
        Ok(())
    }

    fn open_socket(&self) -> Result<UdpSocket> {
        let sock = match &self.socket {
            Some(given) => given.try_clone().map_err(|e| Error::io("duplicating the generator's socket", e))?,
            None => {
                let any: SocketAddr =
                    if self.dest.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }.parse().expect("literal");
                UdpSocket::bind(any).map_err(|e| Error::io(format!("binding a generator socket to {any}"), e))?
            }
        };
        sock.connect(self.dest).map_err(|e| Error::io(format!("connecting a generator socket to {}", self.dest), e))?;
        if self.segments > 1 {
            let gso = u16::try_from(self.size).expect("validated: size * segments <= 65507");
            sys::udp::set_udp_segment(sock.as_fd(), gso).map_err(|e| {
                Error::io(format!("UDP GSO (setsockopt UDP_SEGMENT {gso}) on a socket toward {}", self.dest), e)
            })?;
        }
        // A deeper send buffer lets a batch of GSO sends queue at once; the default is enough otherwise, and
        // a refusal (over wmem_max is silently capped) costs nothing but depth.
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&sock, 4 << 20);
        Ok(sock)
    }

    /// Sends until the duration is over (or the stop handle fires) and reports what happened. Fails only on
    /// a set-up error or a send error other than those [`SendErrors`] counts.
    pub fn run(&self) -> Result<GeneratorReport> {
        self.validate()?;
        let sockets = (0..self.flows).map(|_| self.open_socket()).collect::<Result<Vec<_>>>()?;
        let seg = usize::from(self.segments);
        let msg_len = self.size * seg;
        let mut buf = vec![0u8; msg_len * self.batch];
        let mut per_flow = vec![0u64; self.flows];
        let mut r = GeneratorReport {
            rate_pps: self.rate,
            size: self.size,
            flows: self.flows,
            segments: self.segments,
            ..GeneratorReport::default()
        };
        let rate = self.rate as f64;
        let batch_dgrams = (self.batch * seg) as f64;
        // Credit kept across a late wake-up: 10 ms of datagrams (at least two batches), so that a sleep that
        // overruns on a busy machine is made up for instead of lowering the average rate, while a long stall
        // is not followed by an unbounded burst.
        let cap = (rate * BURST.as_secs_f64()).max(2.0 * batch_dgrams);
        // What to wait for when the bucket runs dry: about 1 ms of datagrams (at least one send, at most a
        // batch), so that low rates go out smoothly and high rates in full batches.
        let quantum = (rate * 1e-3).clamp(seg as f64, batch_dgrams);
        let mut tokens = quantum;
        let start = Instant::now();
        let end = start + self.duration;
        let mut last = start;
        let mut flow = 0usize;
        loop {
            let now = Instant::now();
            if now >= end || self.stop.as_ref().is_some_and(StopHandle::is_stopped) {
                break;
            }
            let sends = if self.rate == 0 {
                self.batch
            } else {
                tokens = (tokens + (now - last).as_secs_f64() * rate).min(cap);
                last = now;
                let sends = (tokens / seg as f64) as usize;
                if sends == 0 {
                    let wait = Duration::from_secs_f64((quantum - tokens).max(0.0) / rate);
                    std::thread::sleep(wait.min(end - now));
                    continue;
                }
                tokens -= (sends.min(self.batch) * seg) as f64;
                sends.min(self.batch)
            };
            let first_seq = per_flow[flow];
            let sent_ns = monotonic_ns();
            for (i, dgram) in buf.chunks_exact_mut(self.size).take(sends * seg).enumerate() {
                let h = Header { flow: flow as u16, seq: first_seq + i as u64, sent_ns };
                h.write(dgram);
            }
            self.send_batch(&sockets[flow], &buf, msg_len, sends, &mut r)?;
            per_flow[flow] += (sends * seg) as u64;
            r.attempted += (sends * seg) as u64;
            flow = (flow + 1) % self.flows;
        }
        r.seconds = start.elapsed().as_secs_f64();
        r.send_errors = r.errors.total();
        r.offered_pps = r.attempted as f64 / r.seconds.max(1e-9);
        r.achieved_pps = r.sent as f64 / r.seconds.max(1e-9);
        r.per_flow = per_flow;
        Ok(r)
    }

    /// One batch: every send is either taken by the kernel or counted as an error, never retried (its
    /// sequence numbers are used, so a sink sees the gap, and `send_errors` says why).
    fn send_batch(
        &self,
        sock: &UdpSocket,
        buf: &[u8],
        msg_len: usize,
        sends: usize,
        r: &mut GeneratorReport,
    ) -> Result<()> {
        let seg = u64::from(self.segments);
        let mut done = 0;
        while done < sends {
            r.calls += 1;
            match crate::dataplane::udp::send_equal(sock, &buf[done * msg_len..], msg_len, sends - done) {
                Ok(n) => {
                    done += n;
                    r.sent += n as u64 * seg;
                }
                Err(e) => {
                    let slot = match e.raw_os_error() {
                        Some(libc::ENOBUFS) => &mut r.errors.nobufs,
                        Some(libc::EAGAIN) => &mut r.errors.again,
                        Some(libc::ECONNREFUSED) => &mut r.errors.refused,
                        Some(libc::EINTR) => continue,
                        _ => {
                            return Err(Error::io(
                                format!(
                                    "sendmmsg toward {} ({} bytes x {} segments)",
                                    self.dest, self.size, self.segments
                                ),
                                e,
                            ))
                        }
                    };
                    *slot += seg;
                    done += 1;
                }
            }
        }
        Ok(())
    }
}

/// Receive buffer asked for by default: 64 MiB holds about 90 ms of 64-byte datagrams at 1 Mpps (each costs
/// about 700 bytes of buffer with its socket buffer overhead).
pub const DEFAULT_RCVBUF: usize = 64 << 20;

/// Bytes per receive slot: room for the largest coalesced (`UDP_GRO`) read.
const SLOT: usize = 65536;

/// Sets up a [`Sink`]: the address, `UDP_GRO`, the receive buffer, when to stop.
#[derive(Debug, Clone)]
pub struct SinkBuilder {
    addr: SocketAddr,
    gro: bool,
    rcvbuf: usize,
    max_flows: usize,
    duration: Option<Duration>,
    idle: Option<Duration>,
    stop: Option<StopHandle>,
}

impl SinkBuilder {
    /// A sink on `addr` (port 0: the kernel chooses, see [`Sink::local_addr`]): no GRO, a
    /// [`DEFAULT_RCVBUF`] receive buffer, flow ids below [`MAX_FLOWS`], running until stopped.
    pub fn new(addr: SocketAddr) -> Self {
        SinkBuilder {
            addr,
            gro: false,
            rcvbuf: DEFAULT_RCVBUF,
            max_flows: MAX_FLOWS,
            duration: None,
            idle: None,
            stop: None,
        }
    }

    /// Asks for `UDP_GRO` (a kernel without it leaves it off; [`Sink::gro`] says).
    pub fn gro(mut self, on: bool) -> Self {
        self.gro = on;
        self
    }

    /// Receive buffer to ask for, in bytes (`SO_RCVBUFFORCE`, or `SO_RCVBUF` up to `net.core.rmem_max` without
    /// CAP_NET_ADMIN).
    pub fn rcvbuf(mut self, bytes: usize) -> Self {
        self.rcvbuf = bytes;
        self
    }

    /// Flow ids tracked: `0..n` (a datagram of another flow is counted in [`SinkReport::unknown_flow`]).
    pub fn max_flows(mut self, n: usize) -> Self {
        self.max_flows = n;
        self
    }

    /// Stops this long after [`Sink::run`] starts.
    pub fn duration(mut self, duration: Duration) -> Self {
        self.duration = Some(duration);
        self
    }

    /// Stops when nothing has arrived for this long, once something has.
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.idle = Some(idle);
        self
    }

    /// Stops when `stop` fires (e.g. from SIGINT).
    pub fn stop_handle(mut self, stop: StopHandle) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Binds the socket and sets its options.
    pub fn bind(self) -> Result<Sink> {
        if self.max_flows == 0 || self.max_flows > usize::from(u16::MAX) + 1 {
            return Err(Error::OutOfRange {
                what: "max_flows",
                value: self.max_flows as u64,
                allowed: "1 to 65536".into(),
            });
        }
        let sock =
            UdpSocket::bind(self.addr).map_err(|e| Error::io(format!("binding the sink to {}", self.addr), e))?;
        let fd = sock.as_fd();
        let want = i32::try_from(self.rcvbuf / 2).unwrap_or(i32::MAX / 2);
        // The kernel doubles the value asked for (half is bookkeeping), so ask for half of what is wanted.
        let want = want.max(0) as usize;
        let forced = sockopt::set_socket_recv_buffer_size_force(fd, want).is_ok();
        if !forced {
            sockopt::set_socket_recv_buffer_size(fd, want)
                .map_err(|e| Error::io("setsockopt(SO_RCVBUF) on the sink", e.into()))?;
        }
        let rcvbuf = sockopt::socket_recv_buffer_size(fd)
            .map_err(|e| Error::io("getsockopt(SO_RCVBUF) on the sink", e.into()))?;
        sys::udp::set_rxq_ovfl(fd, true).map_err(|e| Error::io("setsockopt(SO_RXQ_OVFL) on the sink", e))?;
        let gro = self.gro && sys::udp::set_udp_gro(fd, true).is_ok();
        // Wake up now and then to look at the clock and the stop handle (recvmmsg's own timeout is only
        // checked after a datagram arrives).
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(|e| Error::io("setsockopt(SO_RCVTIMEO) on the sink", e))?;
        Ok(Sink { sock, gro, rcvbuf: rcvbuf as u64, rcvbuf_forced: forced, opts: self })
    }
}

/// A bound UDP sink; [`Sink::run`] receives and counts until told to stop.
#[derive(Debug)]
pub struct Sink {
    sock: UdpSocket,
    gro: bool,
    rcvbuf: u64,
    rcvbuf_forced: bool,
    opts: SinkBuilder,
}

/// What a [`Sink`] received.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct SinkReport {
    /// Datagrams received (after splitting GRO reads), with a header or not.
    pub datagrams: u64,
    /// Their UDP payload bytes.
    pub bytes: u64,
    /// Messages `recvmmsg` returned (fewer than datagrams when UDP GRO coalesced them).
    pub messages: u64,
    /// `recvmmsg` calls that returned data.
    pub reads: u64,
    /// Over all flows, see [`FlowCounts`].
    pub lost: u64,
    /// Over all flows.
    pub reordered: u64,
    /// Over all flows.
    pub duplicated: u64,
    /// Over all flows.
    pub stale: u64,
    /// Datagrams shorter than the header.
    pub malformed: u64,
    /// Datagrams of a flow id at or above the sink's `max_flows`.
    pub unknown_flow: u64,
    /// Messages cut short (`MSG_TRUNC`/`MSG_CTRUNC`).
    pub truncated: u64,
    /// The socket's own drop counter (`SO_RXQ_OVFL`, mostly a full receive buffer) as of the last datagram:
    /// drops after the last datagram received do not show.
    pub socket_drops: u64,
    /// The receive buffer the socket got, bytes (as `SO_RCVBUF` reports it).
    pub rcvbuf: u64,
    /// Whether it was set with `SO_RCVBUFFORCE` (past `rmem_max`).
    pub rcvbuf_forced: bool,
    /// Whether `UDP_GRO` was on.
    pub gro: bool,
    /// From the first datagram to the last.
    pub seconds: f64,
    /// `datagrams / seconds` (0 with fewer than two reads).
    pub pps: f64,
    /// Every flow that sent something, by flow id.
    pub flows: Vec<FlowReport>,
}

/// One flow's line of a [`SinkReport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct FlowReport {
    /// The flow id.
    pub flow: u16,
    /// Its counts.
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub counts: FlowCounts,
}

impl Sink {
    /// The address the socket is bound to (the port the kernel chose for port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.sock.local_addr().map_err(|e| Error::io("getsockname on the sink", e))
    }

    /// Whether `UDP_GRO` is on.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// A second handle on the sink's socket (`dup`), e.g. for [`Generator::socket`]: what the generator sends
    /// from it and an echo answers comes back here. Connecting it (as the generator does) restricts what the
    /// sink receives to that peer.
    pub fn try_clone_socket(&self) -> Result<UdpSocket> {
        self.sock.try_clone().map_err(|e| Error::io("duplicating the sink's socket", e))
    }

    /// The receive buffer the socket got, in bytes, and whether `SO_RCVBUFFORCE` set it.
    pub fn rcvbuf(&self) -> (u64, bool) {
        (self.rcvbuf, self.rcvbuf_forced)
    }

    /// Receives until the duration is over, the idle timeout passes or the stop handle fires (without any of
    /// them: forever), then reports.
    pub fn run(self) -> Result<SinkReport> {
        let mut slots = RecvSlots::new(MAX_MMSG, SLOT);
        let mut flows: Vec<FlowTracker> = Vec::new();
        let mut r =
            SinkReport { rcvbuf: self.rcvbuf, rcvbuf_forced: self.rcvbuf_forced, gro: self.gro, ..Default::default() };
        let start = Instant::now();
        let (mut first, mut last) = (None::<Instant>, start);
        let o = &self.opts;
        loop {
            if o.stop.as_ref().is_some_and(StopHandle::is_stopped) {
                break;
            }
            let now = Instant::now();
            if o.duration.is_some_and(|d| now - start >= d)
                || (first.is_some() && o.idle.is_some_and(|i| now - last >= i))
            {
                break;
            }
            let n =
                slots.recv(&self.sock, true).map_err(|e| Error::io(format!("on the sink at {}", o.addr), e.into()))?;
            if n == 0 {
                continue;
            }
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            r.reads += 1;
            r.messages += n as u64;
            for (m, data) in slots.messages_mut() {
                if m.truncated {
                    r.truncated += 1;
                }
                if let Some(d) = m.drops {
                    r.socket_drops = u64::from(d);
                }
                for dgram in crate::dataplane::udp::datagrams(m, data) {
                    let dgram: &[u8] = dgram;
                    r.datagrams += 1;
                    r.bytes += dgram.len() as u64;
                    match Header::parse(dgram) {
                        None => r.malformed += 1,
                        Some(h) if usize::from(h.flow) >= o.max_flows => r.unknown_flow += 1,
                        Some(h) => {
                            let i = usize::from(h.flow);
                            if i >= flows.len() {
                                // A new flow: the only allocation on this path, once per flow.
                                flows.resize_with(i + 1, FlowTracker::new);
                            }
                            flows[i].record(h.seq);
                        }
                    }
                }
            }
        }
        r.seconds = first.map(|f| (last - f).as_secs_f64()).unwrap_or(0.0);
        r.pps = if r.seconds > 0.0 { r.datagrams as f64 / r.seconds } else { 0.0 };
        for (i, t) in flows.iter().enumerate() {
            let c = t.counts();
            if c.received == 0 {
                continue;
            }
            r.lost += c.lost;
            r.reordered += c.reordered;
            r.duplicated += c.duplicated;
            r.stale += c.stale;
            r.flows.push(FlowReport { flow: i as u16, counts: c });
        }
        Ok(r)
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
