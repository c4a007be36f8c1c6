//! The generator: paced sends of fixed-size datagrams from several flows, batched, optionally segmented.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{monotonic_ns, Header, BURST, HEADER_LEN, MAX_FLOWS, MAX_PAYLOAD, MAX_SEGMENTS};
use crate::dataplane::udp::MAX_MMSG;
use crate::error::{ConfigError, Error, Result};
use crate::stop::StopHandle;
use crate::sys;

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
    /// Sequence numbers used per flow (index = flow id): what a sink's [`FlowCounts::expected`](super::FlowCounts::expected) of that flow
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
    /// destination. With a second handle on a [`Sink`](super::Sink)'s socket ([`Sink::try_clone_socket`](super::Sink::try_clone_socket)) the answers of
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
