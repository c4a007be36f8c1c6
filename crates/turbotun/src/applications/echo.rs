//! An echo responder on one TUN or TAP device: it answers what the kernel sends into the device, as a peer on
//! the other end of the link would.
//!
//! ```no_run
//! use turbotun::echo::{EchoBuilder, EchoMode};
//! use turbotun::Mode;
//!
//! # fn main() -> turbotun::Result<()> {
//! let builder = EchoBuilder::new(EchoMode::Offload).own_address("10.9.0.1".parse().unwrap(), 24);
//! let dev = builder.device(Mode::Tun).name("tt-echo").open()?; // then give it 10.9.0.1/24 and bring it up
//! let echo = builder.build(dev)?;
//! let stop = echo.stop_handle(); // stop.stop() from a signal flag or another thread
//! let stats = echo.stats();      // readable while it runs
//! # stop.stop();
//! echo.run()?;                    // until stopped; `ping 10.9.0.2` is answered meanwhile
//! println!("{:?}", stats.snapshot().answered);
//! # Ok(())
//! # }
//! ```
//!
//! What is answered, rewritten in place where the answer fits where the question was:
//!
//! - ARP requests (TAP) for any IPv4 address but the device's own, with the responder's MAC address
//!   ([`DEFAULT_MAC`], a locally administered one, or [`EchoBuilder::mac`]);
//! - ICMP echo requests (echo replies: addresses swapped, type rewritten, checksum updated incrementally);
//! - IPv6 neighbour solicitations (TAP) for any address but the device's own (a neighbour advertisement, solicited
//!   and override, with the responder's MAC; checksum computed);
//! - ICMPv6 echo requests (echo replies, as for ICMP; the pseudo-header sum does not depend on the order of the
//!   addresses, so the swap leaves the checksum alone);
//! - UDP to any port (addresses and ports swapped; the checksum covers the same words and stays right).
//!
//! On TAP the answer goes from the responder's MAC address to the sender's. Not answered (counted in
//! [`EchoStats::ignored`]): **TCP** (an echo has no connection state; answering a SYN with a swapped SYN would
//! only confuse the sender), anything whose source is not a unicast address (DAD probes from `::`, ARP probes from
//! `0.0.0.0`), anything to a multicast or broadcast address (an answer needs a unicast source) or to one of the
//! device's own addresses (the kernel delivers those itself), IPv4 fragments and IPv6 extension headers, and
//! other ICMP and ICMPv6 messages (router solicitations, MLD reports). A frame whose headers do not parse is
//! counted as a [`DropReason::Malformed`] drop; no input panics the handler ([`Responder::answer`]).
//!
//! Modes ([`EchoMode`]):
//!
//! - `Plain`: no virtio header, one packet per read and per write.
//! - `Offload`: virtio header and every offload. Reads go through [`RecvBatch`], which splits super-packets into
//!   MTU-sized packets, and the answers are coalesced by [`SendBatch`] before writing (a burst of UDP answers
//!   of one flow leaves as one `GSO_UDP_L4` write). A **UDP GSO super-packet is answered whole, without
//!   splitting**: it is read with its virtio header as [`crate::Queue::recv_raw`] would
//!   ([`RecvBatch::keep_udp_super_packets`]), its outer headers are swapped, and it is written back with the
//!   same header: same `gso_type` and `gso_size`, `NEEDS_CSUM` with the same checksum offsets, whose pseudo-header
//!   seed in the UDP checksum field is unchanged by the swap. The kernel cuts it into the same datagrams on the
//!   way back. TCP super-packets are split (and their segments ignored, as TCP is).
//!
//! Counting: one [`Counters`] (reads, answers written as `packets`, bytes, super-packets, writes, drops by
//! reason) plus the answers by kind ([`Answers`]) and what was ignored by why ([`Ignored`]), readable while it
//! runs through [`StatsHandle`]. Every packet read is answered, ignored or dropped with a reason.
//!
//! Why ignored packets are not drops: [`Drops`](crate::stats::Drops) counts packets that should have gone
//! out and did not (bad frames, refusals, a device gone down); the fwd and bench outputs read them as losses
//! and faults. TCP and multicast chatter (router solicitations and MLD reports arrive as soon as a device comes
//! up) are well-formed packets that an echo leaves unanswered by design, so they get counters of their own.
//!
//! Stopping: the queue is made non-blocking and the loop polls with a timeout of [`POLL_INTERVAL`], so it sees
//! its [`StopHandle`] within that time without signals; a write waiting for room gives up on stop too.

use std::io::IoSlice;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use turbotun_wire::virtio_net::VirtioNetHdr;
use turbotun_wire::{arp, ethernet, icmp, icmpv6, ipv4, ipv6, udp, IPPROTO_TCP, IPPROTO_UDP};

use crate::dataplane::batch::{Batch, RecvBatch, SendBatch, BATCH_SIZE};
use crate::dataplane::stats::{Counters, DropReason, SharedCounters, WhenFull};
use crate::dataplane::write_policy::{Unit, Writer};
use crate::devices::device::{Device, DeviceBuilder};
use crate::devices::mode::Mode;
use crate::devices::offloads::Offloads;
use crate::devices::queue::{Queue, MAX_PACKET};
use crate::error::{ConfigError, Error, Result};
use crate::stop::StopHandle;

/// IP protocol number of ICMP.
const IPPROTO_ICMP: u8 = 1;
/// The virtio header size the offload mode uses.
const VNET_HDR: usize = turbotun_wire::VIRTIO_NET_HDR_LEN;
/// Reads between two additions to the shared counters while busy (as the forwarding engine does it).
const FLUSH_EVERY: u64 = 64;

/// The MAC address the responder answers with on TAP unless told otherwise: locally administered (the second
/// bit of the first byte), unicast, and spelling "ttech" so that it is recognisable in a capture.
pub const DEFAULT_MAC: [u8; 6] = [0x02, 0x74, 0x74, 0x65, 0x63, 0x68];

/// How long the loop waits for a packet before it looks at the stop handle again: it stops within this time.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// How the responder reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EchoMode {
    /// No virtio header: one packet per read and per write.
    Plain,
    /// Virtio header and offloads: super-packets split on read (UDP ones answered whole), answers coalesced.
    Offload,
}

impl EchoMode {
    /// The name used in counters output and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            EchoMode::Plain => "plain",
            EchoMode::Offload => "offload",
        }
    }
}

/// What kind of answer a packet got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnswerKind {
    /// An ARP reply.
    Arp,
    /// An ICMP echo reply.
    Icmp,
    /// An ICMPv6 echo reply.
    Icmp6,
    /// A neighbour advertisement.
    Nd,
    /// A UDP datagram (or a UDP super-packet) sent back.
    Udp,
}

/// Why a well-formed packet was not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IgnoreReason {
    /// TCP is never answered.
    Tcp,
    /// The source, the destination or an ARP/ND target is not a unicast address.
    NotUnicast,
    /// The packet is for (or asks about) one of the device's own addresses, or announces the sender's own.
    OwnAddress,
    /// Anything else: another protocol or message type, a fragment, an extension header, an ARP reply.
    Other,
}

/// What [`Responder::answer`] did with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The buffer now holds the answer, `len` bytes from its start.
    Answer {
        /// What kind of answer.
        kind: AnswerKind,
        /// Length of the answer.
        len: usize,
    },
    /// Not answered, for this reason (the buffer may have been left as it was or partly rewritten).
    Ignore(IgnoreReason),
    /// The headers do not parse (a truncated header, a length field larger than the packet).
    Malformed,
}

/// The packet rewriting, without any I/O: turns a question into its answer in the caller's buffer.
#[derive(Debug, Clone)]
pub struct Responder {
    mode: Mode,
    mac: [u8; 6],
    own: Vec<(IpAddr, u8)>,
}

impl Responder {
    /// A responder for packets of a device in `mode` (IP packets for TUN, Ethernet frames for TAP), answering
    /// with [`DEFAULT_MAC`] and knowing no own address yet.
    pub fn new(mode: Mode) -> Self {
        Responder { mode, mac: DEFAULT_MAC, own: Vec::new() }
    }

    /// The MAC address ARP replies and neighbour advertisements give, and answers come from, on TAP.
    pub fn with_mac(mut self, mac: [u8; 6]) -> Self {
        self.mac = mac;
        self
    }

    /// Adds one of the device's own addresses with its prefix length: never answered for, and the directed
    /// broadcast address of an IPv4 prefix is not a unicast destination.
    pub fn with_own_address(mut self, addr: IpAddr, prefix_len: u8) -> Self {
        self.own.push((addr, prefix_len));
        self
    }

    /// The MAC address answers come from (TAP).
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The device's own addresses as given.
    pub fn own_addresses(&self) -> &[(IpAddr, u8)] {
        &self.own
    }

    /// Answers the packet in `buf[..len]` in place. `buf` may be longer than the packet: an answer longer than
    /// its question (a neighbour advertisement for a solicitation without options) is written into that room,
    /// and if there is none the packet is ignored. Never panics, whatever the bytes.
    pub fn answer(&self, buf: &mut [u8], len: usize) -> Verdict {
        let len = len.min(buf.len());
        match self.mode {
            Mode::Tun => self.answer_ip(buf, 0, len),
            Mode::Tap => self.answer_frame(buf, len),
        }
    }

    fn answer_frame(&self, buf: &mut [u8], len: usize) -> Verdict {
        let (l2, ethertype, sender) = match ethernet::Frame::new_checked(&buf[..len]) {
            Ok(f) => (f.header_len(), f.inner_ethertype(), f.src_addr()),
            Err(_) => return Verdict::Malformed,
        };
        if sender[0] & 1 != 0 {
            return Verdict::Ignore(IgnoreReason::NotUnicast);
        }
        let verdict = match ethertype {
            ethernet::ETHERTYPE_ARP => self.answer_arp(&mut buf[..len], l2),
            ethernet::ETHERTYPE_IPV4 | ethernet::ETHERTYPE_IPV6 => self.answer_ip(buf, l2, len),
            _ => Verdict::Ignore(IgnoreReason::Other),
        };
        if let Verdict::Answer { .. } = verdict {
            let mut f = ethernet::Frame::new_unchecked(&mut buf[..l2]);
            f.set_dst_addr(sender);
            f.set_src_addr(self.mac);
        }
        verdict
    }

    /// The ARP packet at `frame[l2..]`; the answer's length counts from the start of `frame`.
    fn answer_arp(&self, frame: &mut [u8], l2: usize) -> Verdict {
        let Ok(mut p) = arp::Packet::new_checked(&mut frame[l2..]) else {
            return Verdict::Malformed;
        };
        if !p.is_ethernet_ipv4() || p.operation() != arp::OP_REQUEST {
            return Verdict::Ignore(IgnoreReason::Other);
        }
        let (spa, tpa) = (p.sender_ip(), p.target_ip());
        if !is_unicast4(spa) || !is_unicast4(tpa) || p.sender_hw()[0] & 1 != 0 {
            return Verdict::Ignore(IgnoreReason::NotUnicast);
        }
        // A gratuitous ARP announces the sender's own address; answering it would claim that address.
        if spa == tpa || self.is_own(tpa.into()) {
            return Verdict::Ignore(IgnoreReason::OwnAddress);
        }
        p.make_reply(self.mac);
        // Anything after the ARP packet was padding.
        Verdict::Answer { kind: AnswerKind::Arp, len: l2 + arp::PACKET_LEN }
    }

    /// The IP packet at `buf[l2..len]`; lengths returned count from the start of `buf`.
    fn answer_ip(&self, buf: &mut [u8], l2: usize, len: usize) -> Verdict {
        match buf.get(l2).map(|b| b >> 4) {
            Some(4) => self.answer_ipv4(buf, l2, len),
            Some(6) => self.answer_ipv6(buf, l2, len),
            Some(_) => Verdict::Ignore(IgnoreReason::Other),
            None => Verdict::Malformed,
        }
    }

    fn answer_ipv4(&self, buf: &mut [u8], l2: usize, len: usize) -> Verdict {
        let Ok(ip) = ipv4::Packet::new_checked(&buf[l2..len]) else {
            return Verdict::Malformed;
        };
        let (hl, total) = (ip.header_len(), usize::from(ip.total_len()));
        // Trailing bytes (Ethernet padding) are allowed and dropped from the answer; a short packet is not.
        if total < hl || l2 + total > len || !ip.verify_checksum() {
            return Verdict::Malformed;
        }
        let (src, dst, protocol) = (ip.src_addr(), ip.dst_addr(), ip.protocol());
        if !is_unicast4(src) {
            return Verdict::Ignore(IgnoreReason::NotUnicast);
        }
        if protocol == IPPROTO_TCP {
            return Verdict::Ignore(IgnoreReason::Tcp);
        }
        if !is_unicast4(dst) || self.is_directed_broadcast(dst) {
            return Verdict::Ignore(IgnoreReason::NotUnicast);
        }
        if self.is_own(dst.into()) {
            return Verdict::Ignore(IgnoreReason::OwnAddress);
        }
        // A fragment's transport header (if any) covers a message this packet holds only part of.
        if ip.is_fragment() {
            return Verdict::Ignore(IgnoreReason::Other);
        }
        let l4 = &mut buf[l2 + hl..l2 + total];
        let kind = match protocol {
            IPPROTO_ICMP => {
                let Ok(mut m) = icmp::Packet::new_checked(l4) else {
                    return Verdict::Malformed;
                };
                if m.msg_type() != icmp::ECHO_REQUEST || m.code() != 0 {
                    return Verdict::Ignore(IgnoreReason::Other);
                }
                m.set_type_code(icmp::ECHO_REPLY, 0);
                AnswerKind::Icmp
            }
            IPPROTO_UDP => match swap_ports(l4) {
                Some(kind) => kind,
                None => return Verdict::Malformed,
            },
            _ => return Verdict::Ignore(IgnoreReason::Other),
        };
        // The header checksum is a sum of the same words in another order: unchanged.
        let mut ip = ipv4::Packet::new_unchecked(&mut buf[l2..l2 + total]);
        ip.set_src_addr(dst);
        ip.set_dst_addr(src);
        Verdict::Answer { kind, len: l2 + total }
    }

    fn answer_ipv6(&self, buf: &mut [u8], l2: usize, len: usize) -> Verdict {
        let Ok(ip) = ipv6::Packet::new_checked(&buf[l2..len]) else {
            return Verdict::Malformed;
        };
        let end = l2 + ipv6::HEADER_LEN + usize::from(ip.payload_len());
        if end > len {
            return Verdict::Malformed;
        }
        let (src, dst, next, hop_limit) = (ip.src_addr(), ip.dst_addr(), ip.next_header(), ip.hop_limit());
        if !is_unicast6(src) {
            return Verdict::Ignore(IgnoreReason::NotUnicast);
        }
        if next == IPPROTO_TCP {
            return Verdict::Ignore(IgnoreReason::Tcp);
        }
        let l4_start = l2 + ipv6::HEADER_LEN;
        if next == icmpv6::IPPROTO_ICMPV6 && buf.get(l4_start) == Some(&icmpv6::NEIGHBOR_SOLICIT) {
            return self.answer_solicitation(buf, l2, end, src, hop_limit);
        }
        if !is_unicast6(dst) {
            return Verdict::Ignore(IgnoreReason::NotUnicast);
        }
        if self.is_own(dst.into()) {
            return Verdict::Ignore(IgnoreReason::OwnAddress);
        }
        let l4 = &mut buf[l4_start..end];
        let kind = match next {
            icmpv6::IPPROTO_ICMPV6 => {
                let Ok(mut m) = icmpv6::Packet::new_checked(l4) else {
                    return Verdict::Malformed;
                };
                if m.msg_type() != icmpv6::ECHO_REQUEST || m.code() != 0 {
                    return Verdict::Ignore(IgnoreReason::Other);
                }
                m.set_type_code(icmpv6::ECHO_REPLY, 0);
                AnswerKind::Icmp6
            }
            IPPROTO_UDP => match swap_ports(l4) {
                Some(kind) => kind,
                None => return Verdict::Malformed,
            },
            // Extension headers: a routing header would change which address the checksum covers.
            _ => return Verdict::Ignore(IgnoreReason::Other),
        };
        let mut ip = ipv6::Packet::new_unchecked(&mut buf[l2..end]);
        ip.set_src_addr(dst);
        ip.set_dst_addr(src);
        Verdict::Answer { kind, len: end }
    }

    /// A neighbour solicitation at `buf[l2..end]` from `src` becomes an advertisement from its target to `src`.
    fn answer_solicitation(&self, buf: &mut [u8], l2: usize, end: usize, src: [u8; 16], hop_limit: u8) -> Verdict {
        if self.mode != Mode::Tap {
            return Verdict::Ignore(IgnoreReason::Other);
        }
        let l4_start = l2 + ipv6::HEADER_LEN;
        let target = match icmpv6::Packet::new_checked(&buf[l4_start..end]) {
            Ok(m) => match m.nd_target() {
                // RFC 4861 §7.1.1: a solicitation that may have been forwarded is not one to answer.
                Some(_) if hop_limit != icmpv6::ND_HOP_LIMIT || m.code() != 0 => {
                    return Verdict::Ignore(IgnoreReason::Other)
                }
                Some(target) => target,
                None => return Verdict::Malformed,
            },
            Err(_) => return Verdict::Malformed,
        };
        if !is_unicast6(target) {
            return Verdict::Ignore(IgnoreReason::NotUnicast);
        }
        if self.is_own(target.into()) {
            return Verdict::Ignore(IgnoreReason::OwnAddress);
        }
        let answer_end = l4_start + icmpv6::NA_WITH_LL_ADDR_LEN;
        if buf.len() < answer_end {
            return Verdict::Ignore(IgnoreReason::Other);
        }
        let header = ipv6::Repr {
            src: target,
            dst: src,
            next_header: icmpv6::IPPROTO_ICMPV6,
            payload_len: icmpv6::NA_WITH_LL_ADDR_LEN as u16,
            hop_limit: icmpv6::ND_HOP_LIMIT,
            traffic_class: 0,
            flow_label: 0,
        };
        let na = icmpv6::NeighborAdvertRepr {
            flags: icmpv6::na_flags::SOLICITED | icmpv6::na_flags::OVERRIDE,
            target,
            ll_addr: self.mac,
        };
        // Both emitters only fail on a short buffer, which was checked above.
        if header.emit(&mut buf[l2..l4_start]).is_err() || na.emit(&mut buf[l4_start..answer_end], target, src).is_err()
        {
            return Verdict::Ignore(IgnoreReason::Other);
        }
        Verdict::Answer { kind: AnswerKind::Nd, len: answer_end }
    }

    fn is_own(&self, addr: IpAddr) -> bool {
        self.own.iter().any(|&(own, _)| own == addr)
    }

    /// Whether `dst` is the all-ones host address of one of the device's IPv4 prefixes.
    fn is_directed_broadcast(&self, dst: [u8; 4]) -> bool {
        let dst = u32::from_be_bytes(dst);
        self.own.iter().any(|&(own, prefix)| match own {
            IpAddr::V4(own) if prefix < 31 => {
                let host = u32::MAX >> prefix;
                dst & !host == u32::from(own) & !host && dst & host == host
            }
            _ => false,
        })
    }
}

/// Swaps the ports of the UDP header at the start of `l4`; `None` if it does not fit.
fn swap_ports(l4: &mut [u8]) -> Option<AnswerKind> {
    let mut d = udp::Packet::new_checked(l4).ok()?;
    let (sport, dport) = (d.src_port(), d.dst_port());
    d.set_src_port(dport);
    d.set_dst_port(sport);
    Some(AnswerKind::Udp)
}

/// An IPv4 address a packet can come from and an answer can go to: not `0.0.0.0/8`, loopback, multicast, the
/// reserved block or the limited broadcast.
fn is_unicast4(a: [u8; 4]) -> bool {
    a[0] != 0 && a[0] != 127 && a[0] < 224
}

/// An IPv6 address that is not unspecified, loopback or multicast.
fn is_unicast6(a: [u8; 16]) -> bool {
    let v = u128::from_be_bytes(a);
    v > 1 && a[0] != 0xff
}

/// Answers by kind. A UDP super-packet answered whole counts once in `udp` and once in `udp_super_packets`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Answers {
    /// ARP replies.
    pub arp: u64,
    /// ICMP echo replies.
    pub icmp: u64,
    /// ICMPv6 echo replies.
    pub icmp6: u64,
    /// Neighbour advertisements.
    pub nd: u64,
    /// UDP datagrams (and UDP super-packets) sent back.
    pub udp: u64,
    /// UDP super-packets answered whole, without splitting (offload mode).
    pub udp_super_packets: u64,
}

impl Answers {
    /// All answers (a super-packet counts once).
    pub fn total(&self) -> u64 {
        self.arp + self.icmp + self.icmp6 + self.nd + self.udp
    }

    fn count(&mut self, kind: AnswerKind) {
        *match kind {
            AnswerKind::Arp => &mut self.arp,
            AnswerKind::Icmp => &mut self.icmp,
            AnswerKind::Icmp6 => &mut self.icmp6,
            AnswerKind::Nd => &mut self.nd,
            AnswerKind::Udp => &mut self.udp,
        } += 1;
    }
}

/// Well-formed packets left unanswered, by why (see [`IgnoreReason`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Ignored {
    /// TCP segments.
    pub tcp: u64,
    /// Not unicast (source, destination or target).
    pub not_unicast: u64,
    /// For, or about, the device's own addresses.
    pub own_address: u64,
    /// Other protocols and messages.
    pub other: u64,
}

impl Ignored {
    /// All ignored packets.
    pub fn total(&self) -> u64 {
        self.tcp + self.not_unicast + self.own_address + self.other
    }

    fn count(&mut self, reason: IgnoreReason) {
        *match reason {
            IgnoreReason::Tcp => &mut self.tcp,
            IgnoreReason::NotUnicast => &mut self.not_unicast,
            IgnoreReason::OwnAddress => &mut self.own_address,
            IgnoreReason::Other => &mut self.other,
        } += 1;
    }
}

/// What an echo did: the I/O counters, answers by kind, ignored packets by why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct EchoStats {
    /// Reads, answers written (`packets`; a super-packet answered whole counts once), their bytes,
    /// super-packets read, writes, coalesced answers, drops by reason.
    pub counters: Counters,
    /// Answers by kind (counted when made; `counters.packets` counts those written).
    pub answered: Answers,
    /// Packets not answered by design.
    pub ignored: Ignored,
}

/// Slots of [`Answers`] and [`Ignored`] in the shared array, in field order.
const KIND_SLOTS: usize = 10;

impl EchoStats {
    fn kinds(&self) -> [u64; KIND_SLOTS] {
        let (a, i) = (&self.answered, &self.ignored);
        [a.arp, a.icmp, a.icmp6, a.nd, a.udp, a.udp_super_packets, i.tcp, i.not_unicast, i.own_address, i.other]
    }

    fn from_kinds(counters: Counters, k: [u64; KIND_SLOTS]) -> Self {
        EchoStats {
            counters,
            answered: Answers { arp: k[0], icmp: k[1], icmp6: k[2], nd: k[3], udp: k[4], udp_super_packets: k[5] },
            ignored: Ignored { tcp: k[6], not_unicast: k[7], own_address: k[8], other: k[9] },
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    counters: SharedCounters,
    kinds: [AtomicU64; KIND_SLOTS],
}

/// The live counters of an [`Echo`]: clone it before [`Echo::run`] and read it during or after the run.
#[derive(Debug, Clone, Default)]
pub struct StatsHandle {
    shared: Arc<Shared>,
}

impl StatsHandle {
    /// The counters as they are now (the loop adds its own every 64 reads and whenever it goes idle).
    pub fn snapshot(&self) -> EchoStats {
        let kinds = std::array::from_fn(|i| self.shared.kinds[i].load(Ordering::Relaxed));
        EchoStats::from_kinds(self.shared.counters.snapshot(), kinds)
    }

    /// Adds what changed between `last` and `now` (cumulative copies of the loop's own counters).
    fn add_delta(&self, now: &EchoStats, last: &EchoStats) {
        self.shared.counters.add(&now.counters.since(&last.counters));
        for (i, (n, l)) in now.kinds().into_iter().zip(last.kinds()).enumerate() {
            if n > l {
                self.shared.kinds[i].fetch_add(n - l, Ordering::Relaxed);
            }
        }
    }
}

/// Configuration of an [`Echo`]; also hands out [`DeviceBuilder`]s set up for its mode.
#[derive(Debug, Clone)]
pub struct EchoBuilder {
    mode: EchoMode,
    mac: [u8; 6],
    own: Vec<(IpAddr, u8)>,
}

impl EchoBuilder {
    /// An echo in `mode`, answering with [`DEFAULT_MAC`].
    pub fn new(mode: EchoMode) -> Self {
        EchoBuilder { mode, mac: DEFAULT_MAC, own: Vec::new() }
    }

    /// The MAC address to answer with on TAP (it should differ from the device's own).
    pub fn mac(mut self, mac: [u8; 6]) -> Self {
        self.mac = mac;
        self
    }

    /// One of the device's own addresses (see [`Responder::with_own_address`]).
    pub fn own_address(mut self, addr: IpAddr, prefix_len: u8) -> Self {
        self.own.push((addr, prefix_len));
        self
    }

    /// The mode.
    pub fn mode(&self) -> EchoMode {
        self.mode
    }

    /// A device builder with what the mode needs: a virtio header and every offload for offload, none for
    /// plain. Add the name and the rest, then `open()`.
    pub fn device(&self, mode: Mode) -> DeviceBuilder {
        let builder = DeviceBuilder::new(mode);
        match self.mode {
            EchoMode::Offload => builder.vnet_hdr(VNET_HDR).offloads(Offloads::ALL),
            EchoMode::Plain => builder,
        }
    }

    /// An echo on the device's single queue.
    pub fn build(self, dev: Device) -> Result<Echo> {
        let name = dev.name().to_string();
        let mut queues = dev.into_queues();
        if queues.len() != 1 {
            return Err(Error::Config(ConfigError::QueueCount {
                why: format!("{name} has {} queues: the echo answers on one (open it with queues(1))", queues.len()),
            }));
        }
        self.build_queue(queues.remove(0))
    }

    /// An echo on one queue opened elsewhere; it is made non-blocking (see [`POLL_INTERVAL`]).
    pub fn build_queue(self, queue: Queue) -> Result<Echo> {
        match (self.mode, queue.vnet_hdr_len()) {
            (EchoMode::Plain, 0) | (EchoMode::Offload, VNET_HDR) => {}
            (EchoMode::Plain, n) => {
                return Err(Error::Config(ConfigError::VnetHdrSize {
                    name: queue.name().to_string(),
                    len: n,
                    needs: "plain mode answers on a queue without one".into(),
                }))
            }
            (EchoMode::Offload, n) => {
                return Err(Error::Config(ConfigError::VnetHdrSize {
                    name: queue.name().to_string(),
                    len: n,
                    needs: format!("offload mode needs a {VNET_HDR}-byte one (vnet_hdr({VNET_HDR}))"),
                }))
            }
        }
        queue.set_nonblocking(true)?;
        if self.mode == EchoMode::Offload {
            // The kernel probes run now, before traffic (they take tens of milliseconds); without them a refused
            // coalesced write turns that kind off at run time.
            let _ = crate::devices::capabilities::Capabilities::get();
        }
        let mut responder = Responder::new(queue.mode()).with_mac(self.mac);
        for &(addr, prefix) in &self.own {
            responder = responder.with_own_address(addr, prefix);
        }
        Ok(Echo { mode: self.mode, queue, responder, stop: StopHandle::new(), stats: StatsHandle::default() })
    }
}

/// An echo ready to run (see [`EchoBuilder`]).
#[derive(Debug)]
pub struct Echo {
    mode: EchoMode,
    queue: Queue,
    responder: Responder,
    stop: StopHandle,
    stats: StatsHandle,
}

impl Echo {
    /// Fires to end [`Self::run`] (within [`POLL_INTERVAL`]).
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// The counters, readable while it runs.
    pub fn stats(&self) -> StatsHandle {
        self.stats.clone()
    }

    /// The mode.
    pub fn mode(&self) -> EchoMode {
        self.mode
    }

    /// The queue it answers on.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// The packet rewriting it applies.
    pub fn responder(&self) -> &Responder {
        &self.responder
    }

    /// Answers on the calling thread until the stop handle fires (`Ok` with the final counters) or the queue
    /// fails (the error; the counters stay readable through [`Self::stats`]).
    pub fn run(self) -> Result<EchoStats> {
        let q = &self.queue;
        let vlen = q.vnet_hdr_len();
        // The answers are written where they were read: room for the virtio header in front of each packet and
        // for a coalesced packet (or a super-packet answered whole) in every buffer.
        let offset = vlen;
        let mut bufs = vec![vec![0u8; offset + MAX_PACKET]; BATCH_SIZE];
        let mut lens = vec![0usize; BATCH_SIZE];
        let mut rx = RecvBatch::new(q).keep_udp_super_packets(self.mode == EchoMode::Offload);
        let mut tx = SendBatch::new(q).stop_on(self.stop.clone());
        let writer = Writer { vnet_hdr_len: vlen, when_full: WhenFull::Wait, stop: Some(self.stop.clone()) };
        // What this loop counts itself: whole super-packets written, malformed packets, answers and ignores.
        let mut own = EchoStats::default();
        let mut last = EchoStats::default();
        let total = |rx: &RecvBatch<&Queue>, tx: &SendBatch<&Queue>, own: &EchoStats| {
            let mut s = *own;
            s.counters.add(&rx.stats());
            s.counters.add(&tx.stats());
            s
        };
        let result = (|| {
            while !self.stop.is_stopped() {
                let got = rx.recv_many(&mut Batch::new(&mut bufs, &mut lens, offset), Some(POLL_INTERVAL))?;
                if got.packets == 0 {
                    let now = total(&rx, &tx, &own);
                    self.stats.add_delta(&now, &last);
                    last = now;
                    continue;
                }
                let mut answers = 0;
                let mut whole = None;
                for i in 0..got.packets {
                    let is_super = vlen > 0 && VirtioNetHdr::new_unchecked(&bufs[i][offset - vlen..offset]).is_gso();
                    match self.responder.answer(&mut bufs[i][offset..], lens[i]) {
                        Verdict::Answer { kind, len } => {
                            own.answered.count(kind);
                            lens[i] = len;
                            if is_super {
                                // Only ever the last packet of a batch (a whole super-packet ends it).
                                own.answered.udp_super_packets += 1;
                                whole = Some(i);
                            } else {
                                bufs.swap(answers, i);
                                lens.swap(answers, i);
                                answers += 1;
                            }
                        }
                        Verdict::Ignore(reason) => own.ignored.count(reason),
                        Verdict::Malformed => {
                            tracing::debug!("{}: dropping a packet whose headers do not parse", q.name());
                            own.counters.drops.add(DropReason::Malformed, 1);
                        }
                    }
                }
                tx.send_many(&mut Batch::new(&mut bufs[..answers], &mut lens[..answers], offset), got.checksums)?;
                if let Some(i) = whole {
                    // Written back with the header it was read with: the kernel cuts it into the same datagrams.
                    let frame = &bufs[i][offset - vlen..offset + lens[i]];
                    let unit = Unit { packets: 1, bytes: lens[i] as u64 };
                    writer.write(q, &[IoSlice::new(frame)], unit, false, true, &mut own.counters)?;
                }
                let now = total(&rx, &tx, &own);
                if now.counters.reads.saturating_sub(last.counters.reads) >= FLUSH_EVERY {
                    self.stats.add_delta(&now, &last);
                    last = now;
                }
            }
            Ok(())
        })();
        let mut now = total(&rx, &tx, &own);
        now.counters.drops.add(DropReason::Stopped, rx.pending() as u64);
        self.stats.add_delta(&now, &last);
        result.map(|()| self.stats.snapshot())
    }
}

#[cfg(test)]
mod tests;
