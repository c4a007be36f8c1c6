//! The sink: batched receives (split where the kernel coalesced them), the socket's own drops, and every
//! flow's counts.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::net::sockopt;

use super::{FlowCounts, FlowTracker, Header, MAX_FLOWS};
use crate::dataplane::udp::{RecvSlots, MAX_MMSG};
use crate::error::{Error, Result};
use crate::stop::StopHandle;
use crate::sys;

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

    /// A second handle on the sink's socket (`dup`), e.g. for [`Generator::socket`](super::Generator::socket): what the generator sends
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
