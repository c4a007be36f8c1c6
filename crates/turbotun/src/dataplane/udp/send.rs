//! The send path: runs of datagrams grouped into segmented messages, sent many per `sendmmsg`, and what each
//! failed message becomes (sent again, sent one datagram at a time, or counted as a drop with its reason).

use std::io;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rustix::event::PollFlags;

use super::{max_send_payload, Datagram, TunnelSocket, MAX_SEGMENTS};
use crate::dataplane::stats::{Counters, DropReason};
use crate::error::{Error, Result};
use crate::stop::StopHandle;
use crate::sys;
use crate::sys::udp::{LocalAddr, MAX_MMSG};

/// Datagrams one [`TunnelSocket::send_datagrams`] chunk handles (its iovecs live on the stack).
const IOV_MAX: usize = 256;

/// One message's send: its datagrams, gathered from `iov` (one slice each), segmented at `segment` bytes (0: one
/// datagram, unsegmented), from `source` (the routing's choice when `None`). What [`TunnelSocket::failed`] decides
/// about when the kernel refused it.
#[derive(Clone, Copy)]
struct SendAttempt<'d, 'a> {
    datagrams: &'d [Datagram<'a>],
    iov: &'d [IoSlice<'d>],
    segment: u16,
    source: Option<LocalAddr>,
}

/// What to do after a failed message.
enum Retry {
    /// Send the same message again.
    Again,
    /// It was dealt with (sent another way, or counted): go on with the next.
    Next,
}

fn count_sent(datagrams: &[Datagram<'_>], counters: &mut Counters) {
    counters.packets += datagrams.len() as u64;
    counters.bytes += datagrams.iter().map(|d| d.data.len() as u64).sum::<u64>();
}

/// Splits `datagrams` into messages: `(first, end, segment)` index ranges, each a run that one segmented send
/// can carry (one destination, one ECN value, all of the first one's size but the last, which may be shorter;
/// at most [`MAX_SEGMENTS`] and [`max_send_payload`] bytes), or single datagrams without `gso`.
pub(super) fn group<'g>(
    datagrams: &[Datagram<'_>],
    gso: bool,
    out: &'g mut [(usize, usize, u16)],
) -> &'g [(usize, usize, u16)] {
    let mut n = 0;
    let mut i = 0;
    while i < datagrams.len() && n < out.len() {
        let head = &datagrams[i];
        let size = head.data.len();
        let mut end = i + 1;
        let mut total = size;
        if gso && size > 0 && size <= usize::from(u16::MAX) {
            let limit = max_send_payload(&head.dest);
            while end < datagrams.len() && end - i < MAX_SEGMENTS {
                let d = &datagrams[end];
                let len = d.data.len();
                if d.dest != head.dest
                    || (d.ecn & 0b11) != (head.ecn & 0b11)
                    || len > size
                    || len == 0
                    || total + len > limit
                {
                    break;
                }
                total += len;
                end += 1;
                if len < size {
                    break; // only the last may be shorter
                }
            }
        }
        let segment = if end - i > 1 { size as u16 } else { 0 };
        out[n] = (i, end, segment);
        n += 1;
        i = end;
    }
    &out[..n]
}

impl TunnelSocket {
    /// Sends one datagram on its own (a handshake, a keepalive, a reply): no batching, no segmentation.
    pub fn send_one(&self, data: &[u8], dest: SocketAddr, counters: &mut Counters) -> Result<()> {
        self.send_datagrams(&[Datagram { data, dest, ecn: 0 }], None, counters)
    }

    /// Sends `datagrams` in order, grouped into segmented messages where they can be (see the module
    /// documentation), with as few `sendmmsg` calls as the kernel allows. Every datagram is sent or counted in
    /// `counters` as a drop with its reason; `packets`, `bytes` and `writes` (system calls) count what went.
    /// A full socket buffer is waited on (until `stop` fires: the rest is then counted as stopped). Errors only
    /// for a socket that cannot send at all, after counting what it did not send.
    pub fn send_datagrams(
        &self,
        datagrams: &[Datagram<'_>],
        stop: Option<&StopHandle>,
        counters: &mut Counters,
    ) -> Result<()> {
        let mut start = 0;
        while start < datagrams.len() {
            let end = (start + IOV_MAX).min(datagrams.len());
            self.send_chunk(&datagrams[start..end], stop, counters)?;
            start = end;
        }
        Ok(())
    }

    /// [`Self::send_datagrams`] for at most [`IOV_MAX`] datagrams (the iovec array on the stack).
    fn send_chunk(&self, datagrams: &[Datagram<'_>], stop: Option<&StopHandle>, counters: &mut Counters) -> Result<()> {
        let mut iov = [IoSlice::new(&[]); IOV_MAX];
        for (slot, d) in iov.iter_mut().zip(datagrams) {
            *slot = IoSlice::new(d.data);
        }
        let mut group_room = [(0, 0, 0); IOV_MAX];
        let groups = group(datagrams, self.gso(), &mut group_room);
        let mut messages =
            [sys::udp::SendMsg { dest: datagrams[0].dest, iov: &[], segment: 0, tos: None, source: None }; MAX_MMSG];
        let mut g = 0;
        while g < groups.len() {
            let batch = &groups[g..groups.len().min(g + MAX_MMSG)];
            {
                // The reply sources of the batch's destinations, looked up under one read lock (none while the
                // table is empty), released before the send.
                let sources = self.sources.as_ref().and_then(|s| s.read());
                for (m, &(first, end, segment)) in messages.iter_mut().zip(batch) {
                    let d = &datagrams[first];
                    let dest = self.wire_dest(d.dest);
                    let source = self.source_for(sources.as_deref(), &d.dest);
                    *m = sys::udp::SendMsg { dest, iov: &iov[first..end], segment, tos: Some(d.ecn & 0b11), source };
                }
            }
            counters.writes += 1;
            match sys::udp::send_msgs(self.socket.as_fd(), &messages[..batch.len()]) {
                Ok(n) => {
                    for &(first, end, _) in &batch[..n] {
                        count_sent(&datagrams[first..end], counters);
                    }
                    g += n;
                }
                Err(e) => {
                    // The first message of the batch failed: decide for it, then go on after it.
                    let (first, end, segment) = batch[0];
                    let attempt = SendAttempt {
                        datagrams: &datagrams[first..end],
                        iov: &iov[first..end],
                        segment,
                        source: messages[0].source,
                    };
                    match self.failed(e, &attempt, stop, counters) {
                        Ok(Retry::Again) => {}
                        Ok(Retry::Next) => g += 1,
                        Err(fatal) => {
                            let rest: usize = groups[g..].iter().map(|&(a, b, _)| b - a).sum();
                            counters.drops.add(DropReason::Stopped, rest as u64);
                            return Err(fatal);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// What a failed send of one message (`attempt`) becomes.
    fn failed(
        &self,
        e: io::Error,
        attempt: &SendAttempt<'_, '_>,
        stop: Option<&StopHandle>,
        counters: &mut Counters,
    ) -> Result<Retry> {
        let SendAttempt { datagrams, iov, segment, source } = *attempt;
        let segmented = segment > 0 && datagrams.len() > 1;
        if source.is_some() && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EADDRNOTAVAIL | libc::ENETUNREACH))
        {
            // The address the remote reached us at is gone (the kernel refuses a source that is not the host's,
            // EINVAL for IPv6, ENETUNREACH for IPv4) or cannot reach it: forgotten, and the same message again
            // from the routing's choice (where a refusal that had another cause is decided).
            if let Some(sources) = &self.sources {
                sources.forget(datagrams[0].dest);
            }
            return Ok(Retry::Again);
        }
        match e.raw_os_error() {
            Some(errno @ (libc::EINTR | libc::EAGAIN)) => {
                // Interrupted (the wake-up signal at the stop ends a blocking send) or the socket buffer full:
                // give up on a stop; else send again, after waiting for room (backpressure) if it was full.
                if stop.is_some_and(StopHandle::is_stopped) {
                    counters.drops.add(DropReason::Stopped, datagrams.len() as u64);
                    return Ok(Retry::Next);
                }
                if errno == libc::EAGAIN {
                    let room = Some(Duration::from_millis(100));
                    crate::stop::wait_or_stop(self.socket.as_fd(), PollFlags::OUT, stop, room)?;
                }
                Ok(Retry::Again)
            }
            Some(libc::ENOBUFS) => {
                // The device queue is full for a moment: the kernel gives no readiness for that.
                std::thread::sleep(Duration::from_micros(50));
                Ok(Retry::Again)
            }
            Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE) if segmented => {
                if e.raw_os_error() != Some(libc::EMSGSIZE) && self.gso.swap(false, Ordering::Relaxed) {
                    tracing::warn!("the kernel refused a segmented UDP send ({e}); segmentation off for this socket");
                }
                counters.gso_fallbacks += 1;
                self.send_singly(datagrams, iov, stop, counters)?;
                Ok(Retry::Next)
            }
            Some(libc::EMSGSIZE) => {
                counters.drops.add(DropReason::TooBig, datagrams.len() as u64);
                Ok(Retry::Next)
            }
            Some(
                libc::ENETUNREACH
                | libc::EHOSTUNREACH
                | libc::ENETDOWN
                | libc::EHOSTDOWN
                | libc::EADDRNOTAVAIL
                | libc::ECONNREFUSED
                | libc::EPERM
                | libc::EACCES
                | libc::EAFNOSUPPORT,
            ) => {
                counters.drops.add(DropReason::Unreachable, datagrams.len() as u64);
                Ok(Retry::Next)
            }
            Some(libc::EINVAL) => {
                counters.drops.add(DropReason::KernelRefused, datagrams.len() as u64);
                Ok(Retry::Next)
            }
            _ => Err(Error::io("sendmmsg on the tunnel socket", e)),
        }
    }

    /// Sends each of `datagrams` as its own message (after a refused segmented send).
    fn send_singly(
        &self,
        datagrams: &[Datagram<'_>],
        iov: &[IoSlice<'_>],
        stop: Option<&StopHandle>,
        counters: &mut Counters,
    ) -> Result<()> {
        let mut i = 0;
        while i < datagrams.len() {
            let d = &datagrams[i];
            let dest = self.wire_dest(d.dest);
            let source = self.source_for(self.sources.as_ref().and_then(|s| s.read()).as_deref(), &d.dest);
            let msg = [sys::udp::SendMsg { dest, iov: &iov[i..i + 1], segment: 0, tos: Some(d.ecn & 0b11), source }];
            counters.writes += 1;
            match sys::udp::send_msgs(self.socket.as_fd(), &msg) {
                Ok(_) => {
                    count_sent(&datagrams[i..i + 1], counters);
                    i += 1;
                }
                Err(e) => {
                    let attempt =
                        SendAttempt { datagrams: &datagrams[i..i + 1], iov: &iov[i..i + 1], segment: 0, source };
                    match self.failed(e, &attempt, stop, counters)? {
                        Retry::Again => {}
                        Retry::Next => i += 1,
                    }
                }
            }
        }
        Ok(())
    }
}
