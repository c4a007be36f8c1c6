//! The vhost-user-net backend against a front end written here: the test plays the guest with
//! `vhost::vhost_user::Frontend` over memfd guest memory, laying out split virtqueues by hand, and the backend
//! serves a TAP in a private network namespace whose kernel is the other end of the traffic.

mod common;

use std::io::Read;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{VhostUserFrontend, VhostUserVirtioFeatures};
use vhost::VhostBackend;

use turbotun::vhost_user::frontend::{Guest, Layout, Received, DESC_F_NEXT, DESC_F_WRITE, HDR_LEN as HDR, RX_BUF};
use turbotun::vhost_user::{VhostUserCounters, VhostUserServer, VhostUserStats};
use turbotun::wire::virtio_net::{features as f, flags, gso};
use turbotun::{DeviceBuilder, Offloads, StopHandle};

use common::{inet_checksum, unique_name};

/// How long the guest waits for the backend at most: far above what a frame takes.
const PATIENCE: Duration = Duration::from_secs(10);

const TAP_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const GUEST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

const VERSION_1: u32 = 32;
const EVENT_IDX: u32 = 29;

fn bits(list: &[u32]) -> u64 {
    list.iter().fold(0, |w, &n| w | 1u64 << n)
}

/// What a Linux guest acknowledges: checksums and segmentation both ways, mergeable buffers, event index.
fn linux_guest_features() -> u64 {
    bits(&[
        VERSION_1,
        EVENT_IDX,
        f::CSUM,
        f::GUEST_CSUM,
        f::GUEST_TSO4,
        f::GUEST_TSO6,
        f::GUEST_USO4,
        f::GUEST_USO6,
        f::HOST_TSO4,
        f::HOST_TSO6,
        f::HOST_USO,
        f::MRG_RXBUF,
    ])
}

/// The transmit ring's size: small, so that the transmit tests wrap around it.
fn tx_size() -> u16 {
    Layout::default().tx_size
}

/// Makes transmit chain `head` (written already) available and checks that the backend gave that one back.
fn send_chain(guest: &mut Guest, head: u16) {
    assert_eq!(guest.send_chain(head).unwrap(), u32::from(head), "the chain given back is the one sent");
}

/// A TAP in a private namespace at 10.77.0.1/24, the guest's address known to it, and the backend serving it.
struct Setup {
    tap: String,
    socket: std::path::PathBuf,
    stats: Arc<VhostUserStats>,
    features: u64,
    stop: StopHandle,
    server: Option<std::thread::JoinHandle<turbotun::Result<()>>>,
}

impl Setup {
    fn new() -> Setup {
        let tap = unique_name("vu");
        let device = DeviceBuilder::tap().name(&tap).vnet_hdr(turbotun::vhost_user::VNET_HDR_LEN).open().unwrap();
        // No IPv6 on the TAP: its router solicitations would only be noise in the guest's buffers.
        std::fs::write(format!("/proc/sys/net/ipv6/conf/{tap}/disable_ipv6"), "1").unwrap();
        common::configure_v4(&tap, TAP_IP, 24);
        let mut nl = turbotun::netlink::Netlink::new().unwrap();
        nl.add_neighbour(&tap, GUEST_IP.into(), GUEST_MAC).unwrap();
        let socket = std::env::temp_dir().join(format!("turbotun-test-{tap}.sock"));
        let server = VhostUserServer::bind(&socket, device.into_queues().remove(0)).unwrap();
        let (stats, features) = (server.stats(), server.features());
        let stop = StopHandle::new();
        let serving = stop.clone();
        let server = std::thread::spawn(move || server.serve(&serving));
        Setup { tap, socket, stats, features, stop, server: Some(server) }
    }

    fn tap_mac(&self) -> [u8; 6] {
        turbotun::netlink::Netlink::new().unwrap().link(&self.tap).unwrap().mac.expect("a TAP has a MAC")
    }

    /// The counters once they reach `done` (the worker adds them as it handles events).
    fn counters_when(&self, what: &str, done: impl Fn(&VhostUserCounters) -> bool) -> VhostUserCounters {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let c = self.stats.snapshot();
            if done(&c) {
                return c;
            }
            assert!(Instant::now() < deadline, "{what}: counters never got there: {c:?}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(server) = self.server.take() {
            let result = common::join_within(server, Duration::from_secs(10), "the backend after a stop");
            if !std::thread::panicking() {
                result.expect("the backend serves until stopped");
                assert!(!self.socket.exists(), "the socket is removed at the end");
            }
        }
    }
}

fn run(test: &str, body: impl FnOnce(&Setup) + Send) {
    common::in_netns(test, || body(&Setup::new()));
}

/// An Ethernet + IPv4 header (no options) for a packet of `l4_len` bytes of protocol `proto`.
fn eth_ipv4(dst_mac: [u8; 6], src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4_len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(34 + l4_len);
    p.extend_from_slice(&dst_mac);
    p.extend_from_slice(&GUEST_MAC);
    p.extend_from_slice(&[0x08, 0x00]);
    let total = (20 + l4_len) as u16;
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = proto;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let check = inet_checksum(&[&ip]);
    ip[10..12].copy_from_slice(&check.to_be_bytes());
    p.extend_from_slice(&ip);
    p
}

/// The folded (not inverted) sum of the IPv4 pseudo-header: what a partial checksum field holds.
fn pseudo_sum(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, len: usize) -> u16 {
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, proto]);
    pseudo.extend_from_slice(&(len as u16).to_be_bytes());
    !inet_checksum(&[&pseudo])
}

fn virtio_hdr(flags: u8, gso_type: u8, hdr_len: u16, gso_size: u16, csum_start: u16, csum_offset: u16) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0] = flags;
    h[1] = gso_type;
    h[2..4].copy_from_slice(&hdr_len.to_le_bytes());
    h[4..6].copy_from_slice(&gso_size.to_le_bytes());
    h[6..8].copy_from_slice(&csum_start.to_le_bytes());
    h[8..10].copy_from_slice(&csum_offset.to_le_bytes());
    h
}

/// A UDP frame from the guest to `port` on the TAP's address; with `gso_size`, a USO super-packet with a
/// partial checksum, else a plain datagram with its checksum complete.
fn udp_frame(mac: [u8; 6], port: u16, payload: &[u8], gso_size: Option<u16>) -> ([u8; HDR], Vec<u8>) {
    let udp_len = 8 + payload.len();
    let mut frame = eth_ipv4(mac, GUEST_IP, TAP_IP, 17, udp_len);
    frame.extend_from_slice(&4000u16.to_be_bytes());
    frame.extend_from_slice(&port.to_be_bytes());
    frame.extend_from_slice(&(udp_len as u16).to_be_bytes());
    frame.extend_from_slice(&[0, 0]);
    frame.extend_from_slice(payload);
    match gso_size {
        Some(size) => {
            let partial = pseudo_sum(GUEST_IP, TAP_IP, 17, udp_len);
            frame[40..42].copy_from_slice(&partial.to_be_bytes());
            (virtio_hdr(flags::NEEDS_CSUM, gso::UDP_L4, 42, size, 34, 6), frame)
        }
        None => {
            let check = common::udp4_checksum(&frame[14..]);
            frame[40..42].copy_from_slice(&check.to_be_bytes());
            ([0u8; HDR], frame)
        }
    }
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn udp_socket(port: u16) -> UdpSocket {
    let socket = UdpSocket::bind((TAP_IP, port)).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    socket
}

/// The guest's acknowledged features become the TAP's offloads, as the kernel reports them; a reset takes them
/// away and the next negotiation sets them again, to what that guest took.
#[test]
fn negotiated_features_become_tap_offloads_and_a_reset_renegotiates() {
    run("negotiated_features_become_tap_offloads_and_a_reset_renegotiates", |s| {
        let offered = s.features;
        for bit in [f::GUEST_CSUM, f::GUEST_TSO4, f::GUEST_TSO6, f::HOST_TSO4, f::HOST_TSO6, f::MRG_RXBUF, VERSION_1] {
            assert!(offered & (1 << bit) != 0, "feature {bit} offered");
        }
        let device_offloads = || turbotun::inspect::device_offloads(&s.tap).unwrap();
        assert_eq!(device_offloads(), Offloads::NONE, "nothing before a guest negotiated");
        let mut guest = Guest::connect(&s.socket, linux_guest_features()).unwrap();
        assert_eq!(device_offloads(), Offloads::TCP | Offloads::USO4 | Offloads::USO6);

        guest.frontend().reset_device().unwrap();
        assert_eq!(device_offloads(), Offloads::NONE, "a reset takes the offloads away");
        guest.frontend().set_features(bits(&[VERSION_1, f::CSUM, f::GUEST_CSUM, f::MRG_RXBUF])).unwrap();
        assert_eq!(device_offloads(), Offloads::CSUM, "a guest without TSO gets no super-packets");
        guest.frontend().set_features(bits(&[VERSION_1, f::GUEST_CSUM, f::GUEST_TSO6, f::GUEST_ECN])).unwrap();
        assert_eq!(device_offloads(), Offloads::CSUM | Offloads::TSO6 | Offloads::TSO_ECN);
        drop(guest);
        // A front end that goes leaves none behind for the next.
        let deadline = Instant::now() + Duration::from_secs(10);
        while device_offloads() != Offloads::NONE {
            assert!(Instant::now() < deadline, "offloads still {} after the front end left", device_offloads());
            std::thread::sleep(Duration::from_millis(5));
        }
    });
}

/// A guest's UDP super-packet (USO) crosses the backend whole and the kernel delivers it as the datagrams it
/// stands for; plain datagrams follow through the small transmit ring, wrapping it several times.
#[test]
fn guest_super_packet_reaches_the_kernel_as_segments() {
    run("guest_super_packet_reaches_the_kernel_as_segments", |s| {
        let socket = udp_socket(7777);
        let mut guest = Guest::connect(&s.socket, linux_guest_features()).unwrap();
        let mac = s.tap_mac();
        let data = payload(5000, 1);
        let (hdr, frame) = udp_frame(mac, 7777, &data, Some(1000));
        guest.send(&hdr, &frame).unwrap();
        let mut buf = [0u8; 2048];
        for (i, want) in data.chunks(1000).enumerate() {
            let n = socket.recv(&mut buf).unwrap_or_else(|e| panic!("segment {i}: {e}"));
            assert_eq!(&buf[..n], want, "segment {i}");
        }
        for i in 0..3 * u32::from(tx_size()) {
            let data = payload(100 + i as usize, i as u8);
            let (hdr, frame) = udp_frame(mac, 7777, &data, None);
            guest.send(&hdr, &frame).unwrap();
            let n = socket.recv(&mut buf).unwrap_or_else(|e| panic!("datagram {i}: {e}"));
            assert_eq!(&buf[..n], &data[..], "datagram {i}");
        }
        let c = s.counters_when("transmit", |c| c.to_tap.packets == 1 + 3 * u64::from(tx_size()));
        assert_eq!(c.to_tap.super_packets, 1);
        assert_eq!(c.to_tap.drops.total(), 0, "{c:?}");
    });
}

const DESC_F_INDIRECT: u16 = 4;
const INDIRECT_DESC: u32 = 28;

/// Sends `hdr` and `frame` cut into pieces of the given lengths (which sum to both), each in its own descriptor
/// at its own address (in reverse order in memory), through an indirect descriptor table; waits until the chain
/// is used. The table and the pieces lie above the receive buffers, in memory the guest does not otherwise use.
fn send_in_pieces(guest: &mut Guest, hdr: &[u8; HDR], frame: &[u8], cuts: &[usize]) {
    use vm_memory::{Bytes, GuestAddress};
    let layout = guest.layout();
    let table = layout.rx_area() + u64::from(layout.rx_size) * RX_BUF;
    let pieces = table + 0x1000;
    assert!(pieces + 0x1000 * (cuts.len() as u64 + 1) <= layout.mem_size(), "room for {} pieces", cuts.len());
    let bytes = [&hdr[..], frame].concat();
    assert_eq!(cuts.iter().sum::<usize>(), bytes.len(), "the cuts cover the header and the frame");
    assert!(cuts.iter().all(|&len| len <= 0x1000), "a piece fits its place");
    let mem = guest.memory();
    let mut at = 0;
    for (i, &len) in cuts.iter().enumerate() {
        let addr = pieces + 0x1000 * (cuts.len() - i) as u64;
        mem.write_slice(&bytes[at..at + len], GuestAddress(addr)).unwrap();
        let entry = table + 16 * i as u64;
        let last = i + 1 == cuts.len();
        mem.write_obj(addr.to_le(), GuestAddress(entry)).unwrap();
        mem.write_obj((len as u32).to_le(), GuestAddress(entry + 8)).unwrap();
        mem.write_obj((if last { 0 } else { DESC_F_NEXT }).to_le(), GuestAddress(entry + 12)).unwrap();
        mem.write_obj((if last { 0 } else { i as u16 + 1 }).to_le(), GuestAddress(entry + 14)).unwrap();
        at += len;
    }
    guest.write_tx_desc(0, table, 16 * cuts.len() as u32, DESC_F_INDIRECT, 0).unwrap();
    send_chain(guest, 0);
}

/// Frames whose header and bytes come in pieces, as guests lay them out: a header split over two descriptors,
/// a frame in many small ones, more pieces than one gathered write takes, header and frame in one descriptor;
/// super-packets (written from guest memory where they lie) and a small frame (copied out). Each reaches the
/// socket whole.
#[test]
fn guest_frames_in_pieces_arrive_whole() {
    run("guest_frames_in_pieces_arrive_whole", |s| {
        let socket = udp_socket(7777);
        let mut guest = Guest::connect(&s.socket, linux_guest_features() | bits(&[INDIRECT_DESC])).unwrap();
        let mac = s.tap_mac();
        let mut buf = [0u8; 2048];
        let mut expect = |what: &str, data: &[u8], segment: usize| {
            for (i, chunk) in data.chunks(segment).enumerate() {
                let n = socket.recv(&mut buf).unwrap_or_else(|e| panic!("{what}, segment {i}: {e}"));
                assert_eq!(&buf[..n], chunk, "{what}, segment {i}");
            }
        };
        // Pieces: `head` for the header, then the frame cut into `n` (the last takes the rest).
        let cuts = |head: &[usize], frame_len: usize, n: usize| {
            let mut cuts = head.to_vec();
            cuts.extend(std::iter::repeat_n(frame_len / n, n - 1));
            cuts.push(frame_len - (n - 1) * (frame_len / n));
            cuts
        };

        let data = payload(4000, 1);
        let (hdr, frame) = udp_frame(mac, 7777, &data, Some(1000));
        send_in_pieces(&mut guest, &hdr, &frame, &cuts(&[5, 7], frame.len(), 9));
        expect("a super-packet: header in two pieces, frame in nine", &data, 1000);

        let data = payload(3000, 2);
        let (hdr, frame) = udp_frame(mac, 7777, &data, Some(1000));
        send_in_pieces(&mut guest, &hdr, &frame, &cuts(&[HDR], frame.len(), 80));
        expect("a super-packet in 81 pieces, more than one write gathers (64): copied", &data, 1000);

        let data = payload(3000, 3);
        let (hdr, frame) = udp_frame(mac, 7777, &data, Some(1000));
        send_in_pieces(&mut guest, &hdr, &frame, &[HDR + frame.len()]);
        expect("a super-packet whose header shares its descriptor with the frame", &data, 1000);

        let data = payload(1000, 4);
        let (hdr, frame) = udp_frame(mac, 7777, &data, None);
        send_in_pieces(&mut guest, &hdr, &frame, &cuts(&[5, 7], frame.len(), 9));
        expect("a small frame (copied): header in two pieces, frame in nine", &data, 1000);

        let c = s.counters_when("the four frames", |c| c.to_tap.packets == 4);
        assert_eq!((c.to_tap.super_packets, c.to_tap.drops.total()), (3, 0), "{c:?}");
    });
}

/// A TCP connection from the guest: the handshake's answer comes back through the receive side, and the data
/// goes out as one TSO super-packet that the kernel's socket reads intact.
#[test]
fn guest_tcp_with_tso_reaches_a_socket() {
    run("guest_tcp_with_tso_reaches_a_socket", |s| {
        let listener = TcpListener::bind((TAP_IP, 8080)).unwrap();
        let data = payload(10_000, 7);
        let reader = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut got = vec![0u8; 10_000];
            stream.read_exact(&mut got).map(|()| got)
        });
        let mut guest = Guest::connect(&s.socket, linux_guest_features()).unwrap();
        guest.post_rx(0, 64).unwrap();
        let mac = s.tap_mac();
        let tcp = |seq: u32, ack: u32, tcp_flags: u8, body: &[u8], tso: bool| {
            let len = 20 + body.len();
            let mut frame = eth_ipv4(mac, GUEST_IP, TAP_IP, 6, len);
            let mut th = [0u8; 20];
            th[0..2].copy_from_slice(&40000u16.to_be_bytes());
            th[2..4].copy_from_slice(&8080u16.to_be_bytes());
            th[4..8].copy_from_slice(&seq.to_be_bytes());
            th[8..12].copy_from_slice(&ack.to_be_bytes());
            th[12] = 5 << 4;
            th[13] = tcp_flags;
            th[14..16].copy_from_slice(&65535u16.to_be_bytes());
            frame.extend_from_slice(&th);
            frame.extend_from_slice(body);
            if tso {
                let partial = pseudo_sum(GUEST_IP, TAP_IP, 6, len);
                frame[50..52].copy_from_slice(&partial.to_be_bytes());
                (virtio_hdr(flags::NEEDS_CSUM, gso::TCPV4, 54, 1448, 34, 16), frame)
            } else {
                let mut pseudo = Vec::new();
                pseudo.extend_from_slice(&GUEST_IP.octets());
                pseudo.extend_from_slice(&TAP_IP.octets());
                pseudo.extend_from_slice(&[0, 6]);
                pseudo.extend_from_slice(&(len as u16).to_be_bytes());
                let check = inet_checksum(&[&pseudo, &frame[34..]]);
                frame[50..52].copy_from_slice(&check.to_be_bytes());
                ([0u8; HDR], frame)
            }
        };
        let (hdr, syn) = tcp(1000, 0, 0x02, &[], false);
        guest.send(&hdr, &syn).unwrap();
        let synack = guest
            .recv_matching(PATIENCE, |fr| {
                fr.len() >= 54 && fr[23] == 6 && fr[34..36] == 8080u16.to_be_bytes() && fr[47] & 0x12 == 0x12
            })
            .unwrap()
            .frame;
        // The guest asked (event index) to hear of the first used buffer: its call eventfd was written.
        assert!(guest.call(0).read().is_ok_and(|n| n > 0), "the guest is notified of received frames");
        let server_seq = u32::from_be_bytes(synack[38..42].try_into().unwrap());
        let (hdr, segment) = tcp(1001, server_seq.wrapping_add(1), 0x18, &data, true);
        guest.send(&hdr, &segment).unwrap();
        let got = common::join_within(reader, Duration::from_secs(15), "the socket's reader").expect("read");
        assert!(got == data, "the stream arrived altered");
        let c = s.counters_when("transmit", |c| c.to_tap.packets == 2);
        assert_eq!(c.to_tap.super_packets, 1);
    });
}

/// A super-packet the kernel hands the TAP (a UDP socket's segmented send) lands in the guest's mergeable
/// buffers, spread over several (`num_buffers` > 1), with its GSO header for the guest to take as it is.
#[test]
fn tap_super_packet_fills_mergeable_buffers() {
    run("tap_super_packet_fills_mergeable_buffers", |s| {
        if s.features & (1 << f::GUEST_USO4) == 0 {
            common::cannot_run("tap_super_packet_fills_mergeable_buffers", "the kernel has no USO on TAP devices");
            return;
        }
        let mut guest = Guest::connect(&s.socket, linux_guest_features()).unwrap();
        guest.post_rx(0, 64).unwrap();
        let sender = UdpSocket::bind((TAP_IP, 9000)).unwrap();
        turbotun::udp::set_udp_segment(&sender, 1400).unwrap();
        // 40 sends of 7 buffers each: both rings wrap.
        for round in 0..40u8 {
            let data = payload(14_000, round);
            sender.send_to(&data, (GUEST_IP, 9999)).unwrap();
            let Received { hdr, frame, num_buffers } = guest
                .recv_matching(PATIENCE, |fr| fr.len() > 42 && fr[23] == 17 && fr[36..38] == 9999u16.to_be_bytes())
                .unwrap();
            let expected_len = 14 + 20 + 8 + data.len();
            assert_eq!(frame.len(), expected_len, "round {round}: one super-packet for the whole send");
            assert_eq!(usize::from(num_buffers), (HDR + expected_len).div_ceil(RX_BUF as usize), "round {round}");
            assert!(num_buffers > 1);
            assert_eq!(hdr[1] & !gso::ECN, gso::UDP_L4, "round {round}: its GSO type");
            assert_eq!(u16::from_le_bytes([hdr[4], hdr[5]]), 1400, "round {round}: its segment size");
            assert!(frame[42..] == data[..], "round {round}: the payload, across the buffers");
        }
        let c = s.counters_when("receive", |c| c.to_guest.super_packets == 40);
        assert_eq!(c.to_guest.drops.total(), 0, "{c:?}");
    });
}

/// What a malicious guest may put in its transmit ring: a buffer outside its memory, a chain that loops, a
/// buffer the device would write, a header with gso_size 0 or with offsets beyond the frame. Each is counted
/// and given back; the ring goes on and the next good frame arrives.
#[test]
fn bad_descriptors_and_headers_are_counted_not_fatal() {
    run("bad_descriptors_and_headers_are_counted_not_fatal", |s| {
        let socket = udp_socket(7777);
        let mut guest = Guest::connect(&s.socket, linux_guest_features()).unwrap();
        let mac = s.tap_mac();
        let mut buf = [0u8; 2048];

        // A descriptor beyond guest memory.
        guest.write_tx_desc(0, guest.layout().mem_size() + 0x1000, 100, 0, 0).unwrap();
        send_chain(&mut guest, 0);
        // A descriptor that straddles its end.
        guest.write_tx_desc(0, guest.layout().mem_size() - 10, 100, 0, 0).unwrap();
        send_chain(&mut guest, 0);
        // A loop: 1 -> 2 -> 1.
        guest.write_tx_desc(1, guest.layout().tx_slot_addr(0), 64, DESC_F_NEXT, 2).unwrap();
        guest.write_tx_desc(2, guest.layout().tx_slot_addr(0), 64, DESC_F_NEXT, 1).unwrap();
        send_chain(&mut guest, 1);
        // A chain whose next descriptor is beyond the table.
        guest.write_tx_desc(3, guest.layout().tx_slot_addr(0), 64, DESC_F_NEXT, 999).unwrap();
        send_chain(&mut guest, 3);
        // A buffer the device may write, in a transmit chain.
        guest.write_tx_desc(4, guest.layout().tx_slot_addr(0), 64, DESC_F_WRITE, 0).unwrap();
        send_chain(&mut guest, 4);
        let c = s.counters_when("bad chains", |c| c.to_tap.drops.bad_descriptor == 5);
        assert_eq!(c.to_tap.drops.total(), 5, "{c:?}");

        let data = payload(3000, 9);
        let (good, frame) = udp_frame(mac, 7777, &data, Some(1000));
        let mut zero_gso = good;
        zero_gso[4..6].copy_from_slice(&0u16.to_le_bytes());
        let mut hdr_len_beyond = good;
        hdr_len_beyond[2..4].copy_from_slice(&(frame.len() as u16 + 1).to_le_bytes());
        let mut csum_beyond = good;
        csum_beyond[6..8].copy_from_slice(&(frame.len() as u16 - 4).to_le_bytes());
        let mut not_negotiated = good;
        not_negotiated[1] = gso::UDP;
        for hdr in [zero_gso, hdr_len_beyond, csum_beyond, not_negotiated] {
            guest.send(&hdr, &frame).unwrap();
        }
        // Shorter than its own header.
        guest.write_tx_desc(5, guest.layout().tx_slot_addr(0), 6, 0, 0).unwrap();
        send_chain(&mut guest, 5);
        let c = s.counters_when("bad headers", |c| c.to_tap.drops.malformed == 5);
        assert_eq!(c.to_tap.drops.total(), 10, "{c:?}");
        assert_eq!(c.to_tap.packets, 0, "none of them reached the TAP");

        guest.send(&good, &frame).unwrap();
        for (i, want) in data.chunks(1000).enumerate() {
            let n = socket.recv(&mut buf).unwrap_or_else(|e| panic!("segment {i} after the bad ones: {e}"));
            assert_eq!(&buf[..n], want, "segment {i}");
        }
        s.counters_when("the good frame", |c| c.to_tap.packets == 1);
    });
}

/// A front end that disconnects is followed by the next one on the same socket, which negotiates afresh.
#[test]
fn a_front_end_reconnects() {
    run("a_front_end_reconnects", |s| {
        let socket = udp_socket(7777);
        let mac = s.tap_mac();
        let mut buf = [0u8; 2048];
        for round in 0..2u8 {
            let mut guest = Guest::connect(&s.socket, linux_guest_features()).unwrap();
            let data = payload(200, round);
            let (hdr, frame) = udp_frame(mac, 7777, &data, None);
            guest.send(&hdr, &frame).unwrap();
            let n = socket.recv(&mut buf).unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(&buf[..n], &data[..], "round {round}");
        }
        s.counters_when("two connections", |c| c.connections == 2 && c.to_tap.packets == 2);
    });
}

/// A frame waiting for more receive buffers holds those it took; when the front end stops the ring
/// (`GET_VRING_BASE`, as QEMU does before a migration or a guest reset), they are handed back: the base it is
/// told does not count them as consumed, so the guest loses none. Started again at that base with more buffers
/// offered, the frame lands whole from the first of the two it had taken, nothing dropped.
#[test]
fn a_stopped_ring_gets_back_the_buffers_a_waiting_frame_took() {
    run("a_stopped_ring_gets_back_the_buffers_a_waiting_frame_took", |s| {
        if s.features & (1 << f::GUEST_USO4) == 0 {
            common::cannot_run(
                "a_stopped_ring_gets_back_the_buffers_a_waiting_frame_took",
                "the kernel has no USO on TAP devices",
            );
            return;
        }
        let mut guest = Guest::connect(&s.socket, linux_guest_features()).unwrap();
        guest.post_rx(0, 2).unwrap();
        let sender = UdpSocket::bind((TAP_IP, 9000)).unwrap();
        turbotun::udp::set_udp_segment(&sender, 1400).unwrap();
        sender.send_to(&payload(14_000, 5), (GUEST_IP, 9999)).unwrap();
        // Read from the TAP, too big for the two buffers: it waits with both.
        s.counters_when("the frame read", |c| c.to_guest.reads == 1);
        let used = guest.rx_used_index().unwrap();
        assert_eq!(used, 0, "nothing used: the frame does not fit yet");
        let base = guest.frontend().get_vring_base(0).unwrap();
        assert_eq!(base, 0, "the two buffers taken are not reported consumed");
        // The front end starts the ring again where it was told and offers eight more buffers: the waiting frame
        // now fits and lands in the guest's buffers from the first, the two given back among them, none lost.
        guest.restart_queue(0, u16::try_from(base).unwrap()).unwrap();
        guest.post_rx(2, 8).unwrap();
        let data = payload(14_000, 5);
        let got = guest.recv_matching(Duration::from_secs(5), |frame| frame.ends_with(&data)).unwrap();
        let first_two: Vec<u32> = (0..2).map(|i| guest.rx_used_entry(i).unwrap().0).collect();
        assert_eq!(first_two, [0, 1], "the buffers it had taken carry its first bytes: {got:?}");
        let c = s.counters_when("the frame delivered", |c| c.to_guest.packets == 1);
        assert_eq!(c.to_guest.drops.total(), 0, "nothing dropped across the stop: {c:?}");
    });
}

/// QEMU 7.2's virtio-net enables its rings (`SET_VRING_ENABLE`) as soon as `VHOST_USER_F_PROTOCOL_FEATURES` is
/// offered, before any `SET_FEATURES`: the message is acknowledged and held until the `SET_FEATURES` that acks
/// the feature, and the connection goes on (the vhost crate's handler alone drops it). QEMU's first messages are
/// sent here one by one on the raw socket; the front end then sets the guest up without enabling the receive ring
/// again, so a frame from the TAP reaches the guest only if the held enable took effect.
#[test]
fn a_vring_enable_before_set_features_is_held_and_takes_effect() {
    run("a_vring_enable_before_set_features_is_held_and_takes_effect", |s| {
        let mut socket = std::os::unix::net::UnixStream::connect(&s.socket).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (get_features, get_protocol, set_protocol, set_vring_enable) = (1, 15, 16, 18);
        let (version, need_reply) = (0x1, VhostUserHeaderFlag::NEED_REPLY.bits());

        raw_send(&mut socket, get_features, version, &[]);
        let offered = u64::from_le_bytes(raw_reply(&mut socket, get_features).try_into().unwrap());
        let protocol_features = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        assert_ne!(offered & protocol_features, 0, "VHOST_USER_F_PROTOCOL_FEATURES offered: {offered:#x}");
        raw_send(&mut socket, get_protocol, version, &[]);
        raw_reply(&mut socket, get_protocol);
        raw_send(&mut socket, set_protocol, version, &VhostUserProtocolFeatures::REPLY_ACK.bits().to_le_bytes());

        // The receive ring (0) enabled before any SET_FEATURES, a reply asked for: success.
        let enable = [0u32.to_le_bytes(), 1u32.to_le_bytes()].concat();
        raw_send(&mut socket, set_vring_enable, version | need_reply, &enable);
        assert_eq!(raw_reply(&mut socket, set_vring_enable), 0u64.to_le_bytes(), "the early enable acknowledged");

        // Then the features and the rings, the receive ring not enabled again.
        socket.set_read_timeout(None).unwrap();
        let mut guest = Guest::on_connection(socket, linux_guest_features(), Layout::default(), [false, true]).unwrap();
        guest.post_rx(0, 8).unwrap();
        let sender = UdpSocket::bind((TAP_IP, 0)).unwrap();
        let data = payload(300, 9);
        sender.send_to(&data, (GUEST_IP, 9999)).unwrap();
        let got = guest.recv_matching(PATIENCE, |frame| frame.ends_with(&data));
        assert!(got.is_ok(), "the receive ring enabled by the held message takes the frame: {got:?}");
        // And the transmit ring, enabled the usual way, carries the guest's frames.
        let listener = udp_socket(7778);
        let (hdr, frame) = udp_frame(s.tap_mac(), 7778, &data, None);
        guest.send(&hdr, &frame).unwrap();
        let mut buf = [0u8; 2048];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &data[..]);
        let c = s.counters_when("both ways", |c| c.to_guest.packets == 1 && c.to_tap.packets == 1);
        assert_eq!((c.connections, c.to_guest.drops.total()), (1, 0), "{c:?}");
    });
}

/// Writes one vhost-user message: request, flags, size, then the payload.
fn raw_send(socket: &mut std::os::unix::net::UnixStream, request: u32, flags: u32, payload: &[u8]) {
    use std::io::Write;
    let mut message = Vec::new();
    for word in [request, flags, payload.len() as u32] {
        message.extend_from_slice(&word.to_le_bytes());
    }
    message.extend_from_slice(payload);
    socket.write_all(&message).unwrap_or_else(|e| panic!("sending request {request}: {e}"));
}

/// Reads the reply to `request` and returns its payload.
fn raw_reply(socket: &mut std::os::unix::net::UnixStream, request: u32) -> Vec<u8> {
    let mut header = [0u8; 12];
    socket.read_exact(&mut header).unwrap_or_else(|e| panic!("the reply to request {request}: {e}"));
    let word = |n: usize| u32::from_le_bytes(header[n * 4..n * 4 + 4].try_into().unwrap());
    assert_eq!(word(0), request, "a reply to request {request}");
    assert_eq!(word(1), 0x1 | VhostUserHeaderFlag::REPLY.bits(), "version 1, a reply");
    let mut payload = vec![0u8; word(2) as usize];
    socket.read_exact(&mut payload).unwrap();
    payload
}
