//! UDP with segmentation offload both ways, for the tunnel engine and the load generator and sink: the one UDP
//! layer of the crate.
//!
//! - **Send**: [`TunnelSocket::send_datagrams`] groups runs of datagrams to one destination with one ECN value,
//!   all of one size but the last (which may be shorter), into one message with `UDP_SEGMENT`, and sends every
//!   message of a batch with one `sendmmsg`. The datagrams stay where they are: a message's payload is the list
//!   of their slices.
//! - **Receive**: [`RecvSlots`] reads many messages per `recvmmsg`, each of which may hold several datagrams of
//!   one flow coalesced by the kernel (`UDP_GRO`), split here by their segment size.
//! - **Degrading, counted**: a segmented send the kernel refuses for its segmentation (`EIO`, `EINVAL`) turns
//!   segmentation off for the socket and is sent again one datagram per message; one too large for the path
//!   (`EMSGSIZE`: a segment is never fragmented) is sent again one datagram per message, which the kernel may
//!   fragment. Each is counted in `gso_fallbacks`; a datagram that still cannot go is a drop with its reason.
//!
//! - **Replies leave from the address the remote contacted** (the kernel's WireGuard calls it source-address
//!   stickiness): a socket bound to a wildcard address reads the local address of every datagram
//!   (`IP_PKTINFO`, `IPV6_RECVPKTINFO`); it is recorded per remote only once what the remote sent
//!   authenticated: by the engine for a datagram the transform opened ([`TunnelSocket::remember_source`]), by the
//!   transform for a message its own worker authenticated ([`ReplySources`]); every send to that remote,
//!   segmented or not, names it as its source. A datagram that did not authenticate never changes it.
//!   A send the kernel refuses for that source (`EINVAL`, `EADDRNOTAVAIL`, `ENETUNREACH`: the address went away)
//!   forgets it and goes again from the routing's choice.
//!
//! Outer datagrams may be fragmented (`IP_PMTUDISC_DONT`), as the kernel's own tunnels allow: a tunnel whose
//! underlay has a smaller MTU than its packets still carries them.

use std::io::{self};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustix::event::PollFlags;
use rustix::net::sockopt;

use crate::error::{Error, Result};
use crate::stop::StopHandle;
use crate::sys;

pub use crate::sys::udp::{LocalAddr, RecvMeta, MAX_MMSG};
pub use port_group::SocketReserve;
pub use recv::{datagrams, RecvSlots};
pub use sources::{ReplySources, SourceMemo};

pub(crate) use port_group::PortSharing;
use port_group::{new_group_socket, new_socket};
use sources::Sources;

mod port_group;
mod recv;
mod send;
mod sources;

/// Most datagrams one segmented send carries: the kernel's limit on every release (newer ones take 128).
pub const MAX_SEGMENTS: usize = 64;

/// The largest payload of one send (all its segments together): the IP length field's limit less the headers.
pub fn max_send_payload(dest: &SocketAddr) -> usize {
    if dest.is_ipv6() {
        65_535 - 8
    } else {
        65_535 - 20 - 8
    }
}

/// Turns on UDP GSO (`UDP_SEGMENT`) for a UDP socket: each `send` of up to 64 KiB leaves as datagrams of
/// `segment_size` bytes, which reach a TUN/TAP device with USO as one super-packet.
pub fn set_udp_segment(socket: &impl AsFd, segment_size: u16) -> Result<()> {
    sys::udp::set_udp_segment(socket.as_fd(), segment_size).map_err(|e| Error::io("setsockopt(UDP_SEGMENT)", e))
}

/// `sendmmsg` of `count` equal messages of `msg_len` bytes taken back to back from `buf`, on a connected socket
/// (the load generator's send): fewer than `count` when the kernel stopped at an error it reports next time.
pub fn send_equal(socket: &impl AsFd, buf: &[u8], msg_len: usize, count: usize) -> io::Result<usize> {
    sys::udp::send_mmsg(socket.as_fd(), buf, msg_len, count)
}

/// One datagram to send: its bytes, where it goes, the ECN field its outer header carries.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// The UDP payload.
    pub data: &'a [u8],
    /// The destination.
    pub dest: SocketAddr,
    /// The ECN field (low two bits of the TOS byte or traffic class).
    pub ecn: u8,
}

/// Options of a [`TunnelSocket`]. Whether a port is shared is not one of them: a socket of its own holds its
/// port alone, and only the sockets of one [`crate::tunnel::bind_sockets`] group share theirs.
#[derive(Debug, Clone, Copy)]
pub struct SocketOptions {
    /// Segmented sends (`UDP_SEGMENT`), where the kernel has them.
    pub gso: bool,
    /// Coalesced reads (`UDP_GRO`), where the kernel has them.
    pub gro: bool,
    /// `SO_MARK` (0: none; anything else needs CAP_NET_ADMIN).
    pub mark: u32,
    /// On an IPv6 address: IPv4 too (`IPV6_V6ONLY` off), IPv4 peers seen and addressed as plain IPv4 addresses.
    pub dual_stack: bool,
    /// IPv4 datagrams without a UDP checksum (`SO_NO_CHECK`), as the kernel's VXLAN sends by default: the
    /// tunnel's packets carry their own. The kernel refuses segmented sends on such a socket, so each is sent
    /// again one datagram per message and segmentation goes off (counted in `gso_fallbacks`).
    pub zero_checksum: bool,
    /// Send and receive buffer sizes asked for (capped by `net.core.wmem_max`/`rmem_max`, or forced past them
    /// with CAP_NET_ADMIN).
    pub buffer: usize,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions { gso: true, gro: true, mark: 0, dual_stack: false, zero_checksum: false, buffer: 4 << 20 }
    }
}

/// A non-blocking UDP socket with segmentation offload both ways, ECN on every datagram, and sources read with
/// every message. Shared by reference between the workers that send on it.
#[derive(Debug)]
pub struct TunnelSocket {
    socket: UdpSocket,
    gso: AtomicBool,
    gro: bool,
    /// An IPv6 socket.
    ipv6: bool,
    /// An IPv6 socket that also carries IPv4: IPv4 destinations are sent to as v4-mapped addresses.
    dual: bool,
    /// Where replies to each remote leave from; `None` on a socket bound to one address, which has no choice.
    sources: Option<Arc<Sources>>,
}

impl TunnelSocket {
    /// Binds `addr` with `options`, holding the port alone: `EADDRINUSE` if any socket holds it (shared or not),
    /// and no other socket can bind it while this one lives. Port 0 picks one ([`Self::local_addr`] says which).
    pub fn bind(addr: SocketAddr, options: &SocketOptions) -> Result<Self> {
        Self::bind_sharing(addr, options, PortSharing::Alone)
    }

    /// [`Self::bind`] with the way the port is held (see [`crate::tunnel::bind_sockets`], the one place that
    /// makes groups).
    pub(crate) fn bind_sharing(addr: SocketAddr, options: &SocketOptions, sharing: PortSharing) -> Result<Self> {
        use rustix::net::AddressFamily;
        let family = if addr.is_ipv6() { AddressFamily::INET6 } else { AddressFamily::INET };
        let fd = match sharing {
            PortSharing::Alone => new_socket(family)?,
            // Owned by the group owner where this process may give it one; its own otherwise (then a socket of
            // the same owner could join the group: see `crate::tunnel::bind_sockets_with`).
            PortSharing::FirstOfGroup | PortSharing::JoinGroup => match new_group_socket(family)? {
                Some(fd) => fd,
                None => new_socket(family)?,
            },
        };
        Self::bind_fd(fd, addr, options, sharing)
    }

    /// Sets `fd` (a new, unbound UDP socket of `addr`'s family: made here, or taken from a [`SocketReserve`]) up
    /// and binds it.
    pub(crate) fn bind_fd(
        fd: OwnedFd,
        addr: SocketAddr,
        options: &SocketOptions,
        sharing: PortSharing,
    ) -> Result<Self> {
        let opt = |what: &'static str, r: rustix::io::Result<()>| r.map_err(|e| Error::io(what, e.into()));
        if sharing == PortSharing::JoinGroup {
            opt("setsockopt(SO_REUSEPORT)", sockopt::set_socket_reuseport(&fd, true))?;
        }
        let dual = addr.is_ipv6() && options.dual_stack;
        if addr.is_ipv6() {
            opt("setsockopt(IPV6_V6ONLY)", sockopt::set_ipv6_v6only(&fd, !dual))?;
            opt("setsockopt(IPV6_RECVTCLASS)", sockopt::set_ipv6_recvtclass(&fd, true))?;
            // Outer fragmentation allowed: a packet larger than the path is fragmented rather than lost.
            let _ = sockopt::set_ipv6_mtu_discover(&fd, sockopt::Ipv6PathMtuDiscovery::DONT);
        }
        if !addr.is_ipv6() || dual {
            opt("setsockopt(IP_RECVTOS)", sockopt::set_ip_recvtos(&fd, true))?;
            let _ = sockopt::set_ip_mtu_discover(&fd, sockopt::Ipv4PathMtuDiscovery::DONT);
        }
        if options.buffer > 0 {
            // Forced past the system's limit where we may, asked within it otherwise.
            if sockopt::set_socket_send_buffer_size_force(&fd, options.buffer).is_err() {
                let _ = sockopt::set_socket_send_buffer_size(&fd, options.buffer);
            }
            if sockopt::set_socket_recv_buffer_size_force(&fd, options.buffer).is_err() {
                let _ = sockopt::set_socket_recv_buffer_size(&fd, options.buffer);
            }
        }
        if options.mark != 0 {
            sys::udp::set_mark(fd.as_fd(), options.mark)
                .map_err(|e| crate::error::permission_or_io("setting SO_MARK on the tunnel socket", e))?;
        }
        if options.zero_checksum && !addr.is_ipv6() {
            sys::udp::set_no_check(fd.as_fd(), true).map_err(|e| Error::io("setsockopt(SO_NO_CHECK)", e))?;
        }
        rustix::net::bind(&fd, &addr).map_err(|e| {
            // A port in use names who holds it, as a busy device does.
            let holders = match e {
                rustix::io::Errno::ADDRINUSE => crate::devices::inspect::udp_port_holders(addr.port()),
                _ => Vec::new(),
            };
            match holders.is_empty() {
                true => Error::io(format!("binding UDP {addr}"), e.into()),
                false => Error::io(format!("binding UDP {addr} (held by {})", holders.join(", ")), e.into()),
            }
        })?;
        if sharing == PortSharing::FirstOfGroup {
            // Bound alone, so the port was free; from now on the rest of the group (and only sockets of the same
            // owning user, the kernel's rule for a group) may join.
            opt("setsockopt(SO_REUSEPORT)", sockopt::set_socket_reuseport(&fd, true))?;
        }
        let gso = options.gso && sys::udp::set_udp_segment(fd.as_fd(), 0).is_ok();
        let gro = options.gro && sys::udp::set_udp_gro(fd.as_fd(), true).is_ok();
        // On a wildcard address a reply could leave from any of the host's addresses: the datagrams say which one
        // their sender reached, so that replies leave from it.
        let sources = if addr.ip().is_unspecified() {
            sys::udp::set_recv_pktinfo(fd.as_fd(), addr.is_ipv6())
                .map_err(|e| Error::io("setsockopt(IP_PKTINFO/IPV6_RECVPKTINFO)", e))?;
            Some(Arc::new(Sources::default()))
        } else {
            None
        };
        let ipv6 = addr.is_ipv6();
        Ok(TunnelSocket { socket: UdpSocket::from(fd), gso: AtomicBool::new(gso), gro, ipv6, dual, sources })
    }

    /// Makes this socket use `first`'s table of reply sources: the sockets of one group share one.
    pub(crate) fn share_sources_with(&mut self, first: &TunnelSocket) {
        if self.sources.is_some() {
            self.sources.clone_from(&first.sources);
        }
    }

    /// The address it is bound to.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.socket.local_addr().map_err(|e| Error::io("getsockname", e))
    }

    /// Whether sends are segmented (off after the kernel refused a segmented send).
    pub fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// Whether reads may be coalesced.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Sets `SO_MARK` (0: none).
    pub fn set_mark(&self, mark: u32) -> Result<()> {
        sys::udp::set_mark(self.socket.as_fd(), mark)
            .map_err(|e| crate::error::permission_or_io("setting SO_MARK on the tunnel socket", e))
    }

    /// Waits until a datagram can be read, `timeout` passes or `stop` fires (false for the last two).
    pub fn wait_readable(&self, stop: Option<&StopHandle>, timeout: Option<Duration>) -> Result<bool> {
        crate::stop::wait_or_stop(self.socket.as_fd(), PollFlags::IN, stop, timeout)
    }

    /// Blocking or non-blocking mode (a new socket is non-blocking). On a blocking socket a full send buffer is
    /// waited for in the kernel, and [`Self::recv_wait`] sleeps until a datagram comes.
    pub fn set_blocking(&self, blocking: bool) -> Result<()> {
        self.socket.set_nonblocking(!blocking).map_err(|e| Error::io("fcntl(O_NONBLOCK) on the tunnel socket", e))
    }

    /// Like [`Self::recv`], but on a blocking socket the first message is waited for (`MSG_WAITFORONE`); 0 when
    /// a signal ended the wait.
    pub fn recv_wait(&self, slots: &mut RecvSlots) -> Result<usize> {
        self.read(slots, true)
    }

    /// Reads what is queued into `slots` without waiting: the number of messages read, 0 when none is there.
    pub fn recv(&self, slots: &mut RecvSlots) -> Result<usize> {
        self.read(slots, false)
    }

    /// One `recvmmsg`, sources as plain IPv4 addresses on a dual-stack socket.
    fn read(&self, slots: &mut RecvSlots, wait: bool) -> Result<usize> {
        let n = slots.recv(&self.socket, wait)?;
        if self.dual {
            for m in &mut slots.meta[..n] {
                m.source = m.source.map(unmapped);
                if let Some(local) = &mut m.local {
                    local.ip = unmapped_ip(local.ip);
                }
            }
        }
        Ok(n)
    }

    /// The address to send to: a v4-mapped one for an IPv4 peer on a dual-stack socket.
    fn wire_dest(&self, dest: SocketAddr) -> SocketAddr {
        match dest {
            SocketAddr::V4(v4) if self.dual => {
                SocketAddr::new(std::net::IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
            }
            other => other,
        }
    }
}

impl AsFd for TunnelSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// A v4-mapped IP address as the IPv4 address it stands for; any other unchanged.
fn unmapped_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// A v4-mapped address (`::ffff:a.b.c.d`) as the IPv4 address it stands for; any other unchanged.
fn unmapped(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => addr,
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::send::group;
    use super::*;
    use crate::dataplane::stats::Counters;

    fn d(data: &[u8], port: u16, ecn: u8) -> Datagram<'_> {
        Datagram { data, dest: SocketAddr::from(([127, 0, 0, 1], port)), ecn }
    }

    #[test]
    fn test_runs_of_one_size_to_one_place_make_one_message() {
        let (a, b) = (vec![0u8; 1000], vec![0u8; 400]);
        let mut out = [(0, 0, 0); 64];
        // Five of 1000 then a shorter one: one message; the shorter ends it.
        let ds = [d(&a, 1, 0), d(&a, 1, 0), d(&a, 1, 0), d(&a, 1, 0), d(&a, 1, 0), d(&b, 1, 0), d(&a, 1, 0)];
        assert_eq!(group(&ds, true, &mut out), &[(0, 6, 1000), (6, 7, 0)]);
        // Another destination or ECN value starts a new message; a longer one too.
        let ds = [d(&b, 1, 0), d(&b, 2, 0), d(&b, 2, 2), d(&b, 2, 2), d(&a, 2, 2)];
        assert_eq!(group(&ds, true, &mut out), &[(0, 1, 0), (1, 2, 0), (2, 4, 400), (4, 5, 0)]);
        // Without GSO every datagram is its own message.
        assert_eq!(group(&ds[..2], false, &mut out), &[(0, 1, 0), (1, 2, 0)]);
    }

    #[test]
    fn test_a_message_keeps_to_the_kernels_limits() {
        let big = vec![0u8; 1400];
        let ds = vec![d(&big, 1, 0); 100];
        let mut out = [(0, 0, 0); 64];
        let groups = group(&ds, true, &mut out);
        // 46 x 1400 = 64,400 fits 65,507; a 47th would not.
        assert_eq!(groups[0], (0, 46, 1400));
        let small = vec![0u8; 100];
        let ds = vec![d(&small, 1, 0); 100];
        assert_eq!(group(&ds, true, &mut out)[0], (0, MAX_SEGMENTS, 100));
    }

    /// Over loopback: a dual-stack socket and an IPv4 one exchange a run of datagrams sent as one segmented
    /// message (received as one coalesced read), their ECN field kept, the dual-stack side seeing a plain IPv4
    /// source.
    #[test]
    fn test_segmented_sends_coalesced_reads_ecn_and_dual_stack_over_loopback() {
        let options = SocketOptions { dual_stack: true, ..SocketOptions::default() };
        let dual = TunnelSocket::bind("[::]:0".parse().unwrap(), &options).unwrap();
        let v4 = TunnelSocket::bind("127.0.0.1:0".parse().unwrap(), &SocketOptions::default()).unwrap();
        let to_v4 = v4.local_addr().unwrap();
        let to_dual = SocketAddr::from(([127, 0, 0, 1], dual.local_addr().unwrap().port()));
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; if i == 9 { 300 } else { 1000 }]).collect();
        let datagrams: Vec<Datagram<'_>> =
            payloads.iter().map(|p| Datagram { data: p, dest: to_v4, ecn: turbotun_wire::ecn::ECT0 }).collect();
        let mut counters = Counters::default();
        dual.send_datagrams(&datagrams, None, &mut counters).unwrap();
        assert_eq!((counters.packets, counters.writes, counters.drops.total()), (10, 1, 0), "{counters:?}");
        let mut slots = RecvSlots::new(4, 65536);
        assert!(v4.wait_readable(None, Some(Duration::from_secs(2))).unwrap());
        let mut got = Vec::new();
        while got.len() < 10 && v4.recv(&mut slots).unwrap() > 0 {
            for (meta, data) in slots.messages_mut() {
                assert_eq!(meta.tos.map(|t| t & 3), Some(turbotun_wire::ecn::ECT0), "{meta:?}");
                assert_eq!(meta.source.map(|s| s.port()), Some(to_dual.port()));
                got.extend(datagrams_of(meta, data));
            }
        }
        assert_eq!(got, payloads);
        // And back: the dual-stack side sees 127.0.0.1, not ::ffff:127.0.0.1.
        v4.send_one(b"back", to_dual, &mut counters).unwrap();
        assert!(dual.wait_readable(None, Some(Duration::from_secs(2))).unwrap());
        assert_eq!(dual.recv(&mut slots).unwrap(), 1);
        let (meta, data) = slots.messages_mut().next().unwrap();
        assert_eq!((meta.source, &*data), (Some(to_v4), &b"back"[..]));
    }

    /// What a send to `dest` would name as its source.
    fn source_of(socket: &TunnelSocket, dest: &str) -> Option<LocalAddr> {
        let sources = socket.sources.as_ref().and_then(|s| s.read());
        socket.source_for(sources.as_deref(), &dest.parse().unwrap())
    }

    #[test]
    fn test_the_table_of_reply_sources() {
        let local = |ip: &str, ifindex| Some(LocalAddr { ip: ip.parse().unwrap(), ifindex });
        let options = SocketOptions { dual_stack: true, ..SocketOptions::default() };
        let socket = TunnelSocket::bind("[::]:0".parse().unwrap(), &options).unwrap();
        let remote: SocketAddr = "10.0.0.9:5000".parse().unwrap();
        let (mut a, mut b) = (SourceMemo::default(), SourceMemo::default());
        assert_eq!(source_of(&socket, "10.0.0.9:5000"), None, "nothing recorded: the routing's choice");
        // Recorded by one worker, then at another address by another, then by the first at its first address
        // again: the latest holds, although the first worker's memo had it already.
        socket.remember_source(remote, local("10.0.0.1", 3), &mut a);
        socket.remember_source(remote, local("10.0.0.2", 3), &mut b);
        assert_eq!(source_of(&socket, "10.0.0.9:5000"), local("10.0.0.2", 0), "no interface named for IPv4");
        socket.remember_source(remote, local("10.0.0.1", 3), &mut a);
        assert_eq!(source_of(&socket, "10.0.0.9:5000"), local("10.0.0.1", 0));
        // A v4-mapped local address is kept as IPv4; a group address is never a source; an IPv6 link-local one
        // keeps its interface.
        let other: SocketAddr = "10.0.0.8:5000".parse().unwrap();
        socket.remember_source(other, local("::ffff:10.0.0.3", 2), &mut a);
        assert_eq!(source_of(&socket, "10.0.0.8:5000"), local("10.0.0.3", 0));
        let group: SocketAddr = "10.0.0.7:5000".parse().unwrap();
        socket.remember_source(group, local("224.0.0.1", 2), &mut a);
        socket.remember_source(group, local("255.255.255.255", 2), &mut a);
        assert_eq!(source_of(&socket, "10.0.0.7:5000"), None);
        let v6: SocketAddr = "[fe80::9]:5000".parse().unwrap();
        socket.remember_source(v6, local("fe80::1", 4), &mut a);
        assert_eq!(source_of(&socket, "[fe80::9]:5000"), local("fe80::1", 4));
        // The same remote at the same address again changes nothing, and costs no lock (the worker's memo).
        let changes = socket.sources.as_ref().unwrap().changes.load(Ordering::Relaxed);
        socket.remember_source(remote, local("10.0.0.1", 3), &mut a);
        assert_eq!(socket.sources.as_ref().unwrap().changes.load(Ordering::Relaxed), changes);
        // What a transform records through the group's handle is the same table.
        socket.reply_sources().remember(remote, local("10.0.0.4", 3));
        assert_eq!(source_of(&socket, "10.0.0.9:5000"), local("10.0.0.4", 0));
        socket.reply_sources().remember(group, local("224.0.0.1", 2));
        assert_eq!(source_of(&socket, "10.0.0.7:5000"), None);
        // Forgotten: the routing's choice again.
        socket.sources.as_ref().unwrap().forget(remote);
        assert_eq!(source_of(&socket, "10.0.0.9:5000"), None);
        // An IPv6-only socket cannot send from an IPv4 address; a socket on one address records nothing.
        let v6_only = TunnelSocket::bind("[::]:0".parse().unwrap(), &SocketOptions::default()).unwrap();
        v6_only.remember_source(remote, local("10.0.0.1", 0), &mut SourceMemo::default());
        assert_eq!(source_of(&v6_only, "10.0.0.9:5000"), None);
        let bound = TunnelSocket::bind("127.0.0.1:0".parse().unwrap(), &SocketOptions::default()).unwrap();
        bound.remember_source(remote, local("10.0.0.1", 0), &mut SourceMemo::default());
        assert!(bound.sources.is_none());
    }

    /// A full table takes a new remote in place of one other entry: the others stay.
    #[test]
    fn test_the_table_of_reply_sources_is_bounded_and_a_new_remote_evicts_one() {
        let sources = Sources::with_capacity(64);
        let local = LocalAddr { ip: "10.0.0.1".parse().unwrap(), ifindex: 0 };
        let remote = |i: u32| SocketAddr::from((std::net::Ipv4Addr::from(0x0b00_0000 + i), 9));
        for i in 0..64 {
            sources.remember(remote(i), local);
        }
        sources.remember(remote(64), local);
        let map = sources.map.read().unwrap();
        assert_eq!(map.len(), 64, "grew past its bound");
        assert!(map.contains_key(&remote(64)));
        assert_eq!((0..64).filter(|&i| map.contains_key(&remote(i))).count(), 63, "one entry evicted, not all");
    }

    fn datagrams_of(meta: &RecvMeta, data: &mut [u8]) -> Vec<Vec<u8>> {
        datagrams(meta, data).map(|d| d.to_vec()).collect()
    }
}
