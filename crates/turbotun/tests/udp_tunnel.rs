//! The tunnel engine with the plain transform on real devices: two private namespaces joined by a veth pair
//! (the underlay), a TUN device in each, and the engine between each device and a UDP socket on the underlay.
//! TCP over IPv4 and IPv6 and UDP with GSO cross byte for byte; underlays smaller and larger than the tunnel's
//! packets; segmented sends the kernel refuses; a socket without UDP GRO. Every packet is written or counted.

mod common;

use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{new_netns, ns_path, tcp_stream_intact, unique_name, Sides};
use turbotun::netlink::Netlink;
use turbotun::netns::with_netns;
use turbotun::tunnel::{Opened, Plain, Sealed, Transform, TunnelBuilder, TunnelStats, TunnelStatsHandle};
use turbotun::udp::SocketOptions;
use turbotun::{Counters, DropReason};
use turbotun::{DeviceBuilder, Offloads, StopHandle};

const PORT: u16 = 5555;

/// Two namespaces with a tunnel between them, stopped and joined when dropped (also on a failed assertion).
struct Ends {
    sides: Sides,
    stop: StopHandle,
    runs: Vec<JoinHandle<turbotun::Result<TunnelStats>>>,
    gso: Vec<Arc<turbotun::udp::TunnelSocket>>,
    /// Each end's live counters (a, b).
    live: Vec<TunnelStatsHandle>,
    /// Each end's tunnel device (a, b).
    devices: Vec<String>,
}

impl Ends {
    fn in_a<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.sides.in_a(f)
    }

    fn in_b<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.sides.in_b(f)
    }

    /// End to end, in packets, both ways: every packet one end's engine read from its device (one per segment of
    /// a super-packet) was written into the other end's device, every datagram one end sent was received by the
    /// other, and neither device's ring dropped a packet before its engine read it. A packet lost anywhere on the
    /// way (a ring, either engine, a socket buffer, the underlay) keeps the counts apart for good, however the
    /// TCP stream above it recovered; packets still in flight are waited for (a generous bound, not a speed).
    fn nothing_lost(&self) {
        let arrived = |from: &Counters, to: &Counters| from.segments == to.packets && from.packets == to.segments;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (a, b) = (self.live[0].snapshot(), self.live[1].snapshot());
            if arrived(&a.to_network, &b.from_network) && arrived(&b.to_network, &a.from_network) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "packets lost between the ends: a read {} and sent {}, b received {} and wrote {}; b read {} and \
                 sent {}, a received {} and wrote {}\na: {a:?}\nb: {b:?}",
                a.to_network.segments,
                a.to_network.packets,
                b.from_network.segments,
                b.from_network.packets,
                b.to_network.segments,
                b.to_network.packets,
                a.from_network.segments,
                a.from_network.packets,
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let ring_drops = [self.in_a(|| tx_dropped(&self.devices[0])), self.in_b(|| tx_dropped(&self.devices[1]))];
        assert_eq!(ring_drops, [0, 0], "packets dropped at a tunnel device's ring (a, b)");
    }

    /// Stops both ends and returns their final counters (a, b), after checking that neither stack dropped a
    /// segment for a bad checksum (checksums cross the plain tunnel partial and are completed by the kernel).
    fn finish(mut self) -> Vec<TunnelStats> {
        assert_eq!(self.sides.checksum_errors(), 0, "segments dropped for a bad checksum");
        self.stop.stop();
        self.runs.drain(..).map(|h| h.join().unwrap().unwrap()).collect()
    }
}

impl Drop for Ends {
    fn drop(&mut self) {
        self.stop.stop();
        for h in self.runs.drain(..) {
            let _ = h.join();
        }
    }
}

/// Underlay 10.201.0.1 <-> .2 at `underlay_mtu`; tunnel devices with 10.202.0.1/24, fd02::1/64 (and .2, ::2) at
/// `tunnel_mtu`, virtio header and every offload on; a plain tunnel at each end with `options`.
fn tunnel_pair(underlay_mtu: u32, tunnel_mtu: u32, options: SocketOptions) -> Ends {
    tunnel_pair_with(underlay_mtu, tunnel_mtu, options, Plain::new)
}

/// [`tunnel_pair`] with the transform `transform` makes for the other end's address.
fn tunnel_pair_with<T: Transform>(
    underlay_mtu: u32,
    tunnel_mtu: u32,
    options: SocketOptions,
    transform: impl Fn(SocketAddr) -> T + Sync,
) -> Ends {
    let (a, b) = (new_netns(), new_netns());
    let (ul_a, ul_b) = (unique_name("ula"), unique_name("ulb"));
    let mut nl = Netlink::in_netns(&ns_path(&a)).unwrap();
    nl.create_veth(&ul_a, &ul_b).unwrap();
    nl.move_to_netns(&ul_b, &ns_path(&b)).unwrap();
    let stop = StopHandle::new();
    let mut ends = Ends {
        sides: Sides { a, b },
        stop: stop.clone(),
        runs: Vec::new(),
        gso: Vec::new(),
        live: Vec::new(),
        devices: Vec::new(),
    };
    let mut tunnels = Vec::new();
    for (ns, ul, me, peer, inner4, inner6) in [
        (&ends.sides.a, &ul_a, "10.201.0.1", "10.201.0.2", "10.202.0.1", "fd02::1"),
        (&ends.sides.b, &ul_b, "10.201.0.2", "10.201.0.1", "10.202.0.2", "fd02::2"),
    ] {
        let path = ns_path(ns);
        let mut nl = Netlink::in_netns(&path).unwrap();
        nl.set_mtu(ul, underlay_mtu).unwrap();
        nl.add_address(ul, me.parse().unwrap(), 24).unwrap();
        nl.set_up(ul, true).unwrap();
        nl.set_up("lo", true).unwrap();
        let name = unique_name("ttu");
        let remote = SocketAddr::new(peer.parse().unwrap(), PORT);
        let local = SocketAddr::new(me.parse().unwrap(), PORT);
        let tunnel = with_netns(&path, || {
            let dev = DeviceBuilder::tun().name(&name).vnet_hdr(10).offloads(Offloads::ALL).open().unwrap();
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/accept_dad"), "0").unwrap();
            TunnelBuilder::new(Arc::new(transform(remote)))
                .bind(local)
                .socket_options(options)
                .stop_on(stop.clone())
                .build(dev.into_queues())
                .unwrap()
        })
        .unwrap();
        nl.set_mtu(&name, tunnel_mtu).unwrap();
        nl.add_address(&name, inner4.parse().unwrap(), 24).unwrap();
        nl.add_address(&name, inner6.parse().unwrap(), 64).unwrap();
        nl.set_up(&name, true).unwrap();
        ends.gso.extend(tunnel.sockets());
        ends.live.push(tunnel.stats());
        ends.devices.push(name);
        tunnels.push(tunnel);
    }
    // The engines start once both sockets are bound: a packet one end's kernel sends early (a router
    // solicitation) would otherwise go to a port nobody listens on yet, and be lost.
    for tunnel in tunnels {
        ends.runs.push(std::thread::spawn(move || tunnel.run()));
    }
    ends
}

/// `len` bytes that differ from one offset to the next.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed as u8).collect()
}

/// A TCP stream of `len` bytes from the namespace `from` to a listener at `to` in `ends`'s other namespace,
/// compared byte for byte.
fn tcp_crosses(ends: &Ends, a_to_b: bool, to: IpAddr, len: usize) {
    let (listen, from) = if a_to_b { (&ends.sides.b, &ends.sides.a) } else { (&ends.sides.a, &ends.sides.b) };
    let connect =
        |t: &SocketAddr| with_netns(&ns_path(from), || TcpStream::connect_timeout(t, Duration::from_secs(5))).unwrap();
    tcp_stream_intact(listen, SocketAddr::new(to, 7000), pattern(len, len as u32), connect);
}

/// 20 datagrams of 1000 bytes in one UDP GSO send from A to B (one super-packet into the tunnel device, split,
/// sealed, sent and coalesced again on the far side); each arrives whole.
fn udp_gso_crosses(ends: &Ends) {
    let rx = ends.in_b(|| UdpSocket::bind(("10.202.0.2", 7001))).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let tx = ends.in_a(|| UdpSocket::bind(("10.202.0.1", 0))).unwrap();
    turbotun::udp::set_udp_segment(&tx, 1000).unwrap();
    let burst = pattern(20_000, 7);
    tx.send_to(&burst, ("10.202.0.2", 7001)).unwrap();
    let mut buf = [0u8; 2048];
    for k in 0..20 {
        let n = rx.recv(&mut buf).unwrap_or_else(|e| panic!("datagram {k}: {e}"));
        assert_eq!(&buf[..n], &burst[k * 1000..(k + 1) * 1000], "datagram {k}");
    }
}

/// TX dropped of device `name` in the calling thread's namespace (`/proc/thread-self/net/dev`): packets the
/// kernel had for the tunnel and its ring had no room for.
fn tx_dropped(name: &str) -> u64 {
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
    let line = dev.lines().find(|l| l.trim_start().starts_with(&format!("{name}:"))).expect("the device's line");
    // After the name: 8 receive fields, then transmit bytes, packets, errs, drop.
    let fields: Vec<u64> = line.split(':').nth(1).unwrap().split_whitespace().map(|f| f.parse().unwrap()).collect();
    fields[11]
}

#[test]
fn plain_tunnel_carries_tcp_and_udp_byte_for_byte() {
    if common::in_netns("plain_tunnel_carries_tcp_and_udp_byte_for_byte", || ()).is_none() {
        return;
    }
    {
        let ends = tunnel_pair(1500, 1420, SocketOptions::default());
        assert!(ends.gso.iter().all(|s| s.gso() && s.gro()), "segmentation on both ways on this kernel");
        tcp_crosses(&ends, true, "10.202.0.2".parse().unwrap(), 16 << 20);
        tcp_crosses(&ends, false, "fd02::1".parse().unwrap(), 16 << 20);
        udp_gso_crosses(&ends);
        ends.nothing_lost();
        let stats = ends.finish();
        let (a, b) = (&stats[0], &stats[1]);
        // Segmentation both ways: the sender's datagrams left in far fewer system calls than datagrams, and the
        // receiver's writes to its device were coalesced.
        assert!(a.to_network.writes * 8 < a.to_network.packets, "a's sends: {:?}", a.to_network);
        assert!(
            b.from_network.coalesced > 0 && b.from_network.writes < b.from_network.packets / 4,
            "{:?}",
            b.from_network
        );
        assert!(a.to_network.super_packets > 0, "the device handed over super-packets: {:?}", a.to_network);
        assert_eq!(a.to_network.gso_fallbacks + b.to_network.gso_fallbacks, 0);
    }
}

#[test]
fn plain_tunnel_over_a_small_and_a_jumbo_underlay() {
    if common::in_netns("plain_tunnel_over_a_small_and_a_jumbo_underlay", || ()).is_none() {
        return;
    }
    {
        // 1420-byte packets in 1448-byte datagrams over a 1280-byte underlay: segmented sends are refused for
        // their size (a segment is never fragmented) and go again one datagram each, fragmented.
        let ends = tunnel_pair(1280, 1420, SocketOptions::default());
        tcp_crosses(&ends, true, "10.202.0.2".parse().unwrap(), 4 << 20);
        tcp_crosses(&ends, false, "fd02::1".parse().unwrap(), 2 << 20);
        ends.nothing_lost();
        let stats = ends.finish();
        assert!(stats[0].to_network.gso_fallbacks > 0, "{:?}", stats[0].to_network);
        // A jumbo underlay and tunnel.
        let ends = tunnel_pair(9000, 8900, SocketOptions::default());
        tcp_crosses(&ends, true, "10.202.0.2".parse().unwrap(), 16 << 20);
        tcp_crosses(&ends, false, "fd02::1".parse().unwrap(), 4 << 20);
        udp_gso_crosses(&ends);
        ends.nothing_lost();
        let stats = ends.finish();
        assert_eq!(stats[0].to_network.gso_fallbacks, 0, "{:?}", stats[0].to_network);
    }
}

#[test]
fn refused_segmentation_falls_back_and_is_counted() {
    if common::in_netns("refused_segmentation_falls_back_and_is_counted", || ()).is_none() {
        return;
    }
    {
        // Outer datagrams without a UDP checksum: the kernel refuses every segmented send (EINVAL).
        let options = SocketOptions { zero_checksum: true, ..SocketOptions::default() };
        let ends = tunnel_pair(1500, 1420, options);
        tcp_crosses(&ends, true, "10.202.0.2".parse().unwrap(), 8 << 20);
        udp_gso_crosses(&ends);
        assert!(!ends.gso[0].gso(), "segmentation went off after the refusal");
        ends.nothing_lost();
        let stats = ends.finish();
        assert!(stats[0].to_network.gso_fallbacks >= 1, "{:?}", stats[0].to_network);
    }
}

#[test]
fn plain_tunnel_without_udp_gro() {
    if common::in_netns("plain_tunnel_without_udp_gro", || ()).is_none() {
        return;
    }
    {
        let options = SocketOptions { gro: false, ..SocketOptions::default() };
        let ends = tunnel_pair(1500, 1420, options);
        assert!(ends.gso.iter().all(|s| !s.gro()));
        tcp_crosses(&ends, true, "10.202.0.2".parse().unwrap(), 8 << 20);
        tcp_crosses(&ends, false, "fd02::1".parse().unwrap(), 4 << 20);
        udp_gso_crosses(&ends);
        ends.nothing_lost();
        let stats = ends.finish();
        // Without coalesced reads each message is one datagram: as many datagrams as the peer sent arrived.
        assert!(stats[1].from_network.segments >= stats[0].to_network.packets / 2, "{stats:?}");
    }
}

/// A user's transform that works packet by packet: each packet framed by `front` marker bytes in front and its
/// length behind, sealed into a buffer of its own by the per-packet hook (the engine's default batch form), and
/// opened where it arrived.
struct Framed {
    remote: SocketAddr,
    front: usize,
}

const MARK: u8 = 0xa5;
/// The length behind each packet.
const BACK: usize = 4;

impl Transform for Framed {
    fn overhead(&self) -> usize {
        self.front + BACK
    }

    fn seal(&self, packet: &mut [u8], out: &mut [u8], _control: &mut dyn FnMut(&[u8], SocketAddr)) -> Sealed {
        let len = packet.len();
        let Some(out) = out.get_mut(..self.front + len + BACK) else {
            return Sealed::Dropped(DropReason::TooBig);
        };
        out[..self.front].fill(MARK);
        out[self.front..self.front + len].copy_from_slice(packet);
        out[self.front + len..].copy_from_slice(&(len as u32).to_be_bytes());
        Sealed::Out { len: out.len(), to: self.remote }
    }

    fn open(
        &self,
        datagram: &mut [u8],
        from: SocketAddr,
        _to: Option<turbotun::udp::LocalAddr>,
        _out: &mut [u8],
        _control: &mut dyn FnMut(&[u8], SocketAddr),
    ) -> Opened {
        let Some(len) = datagram.len().checked_sub(self.front + BACK) else {
            return Opened::Dropped(DropReason::MalformedDatagram);
        };
        let marked = datagram[..self.front].iter().all(|&b| b == MARK);
        if from != self.remote || !marked || datagram[self.front + len..] != (len as u32).to_be_bytes() {
            return Opened::Dropped(DropReason::MalformedDatagram);
        }
        Opened::InPlace { start: self.front, len }
    }
}

/// A transform of the user's own, with only the per-packet hooks: sealed packet by packet into buffers of their
/// own, opened in place, the packet kept in its datagram where the virtio header fits in front of it (16 bytes)
/// and copied where it does not (4 bytes, against the 10-byte header).
#[test]
fn a_per_packet_transform_opening_in_place_carries_tcp_and_udp() {
    if common::in_netns("a_per_packet_transform_opening_in_place_carries_tcp_and_udp", || ()).is_none() {
        return;
    }
    for front in [4, 16] {
        let ends = tunnel_pair_with(1500, 1420, SocketOptions::default(), |remote| Framed { remote, front });
        tcp_crosses(&ends, true, "10.202.0.2".parse().unwrap(), 4 << 20);
        tcp_crosses(&ends, false, "fd02::1".parse().unwrap(), 4 << 20);
        udp_gso_crosses(&ends);
        ends.nothing_lost();
        let stats = ends.finish();
        let drops = |s: &TunnelStats| s.to_network.drops.malformed + s.from_network.drops.malformed_datagram;
        assert_eq!(stats.iter().map(drops).sum::<u64>(), 0, "front {front}: every datagram opened");
        assert!(stats[1].from_network.coalesced > 0, "front {front}: {:?}", stats[1].from_network);
    }
}
