//! The vhost-user-net backend against a front end written here: the test plays the guest with
//! `vhost::vhost_user::Frontend` over memfd guest memory, laying out split virtqueues by hand, and the backend
//! serves a TAP in a private network namespace whose kernel is the other end of the traffic.

mod common;

use std::io::Read;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use turbotun::vhost_user::{VhostUserCounters, VhostUserServer, VhostUserStats};
use turbotun::wire::virtio_net::{features as f, flags, gso};
use turbotun::{DeviceBuilder, Offloads, StopHandle};

use common::{inet_checksum, unique_name};

const MEM_SIZE: usize = 8 << 20;
const RX_SIZE: u16 = 256;
/// Small, so that the transmit tests wrap around the ring.
const TX_SIZE: u16 = 16;
const RX_BUF: u64 = 2048;
const RX_AREA: u64 = 0x40_0000;
const TX_AREA: u64 = 0x10_0000;
const TX_SLOT: u64 = 0x1_1000;
const HDR: usize = 12;

const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;

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

/// One split virtqueue in guest memory, driven from the guest's side.
struct Ring {
    desc: u64,
    avail: u64,
    used: u64,
    size: u16,
    next_avail: u16,
    last_used: u16,
}

impl Ring {
    fn new(base: u64, size: u16) -> Ring {
        // Descriptor table, available ring and used ring each on their own 4 KiB pages.
        let pages = (u64::from(size) * 16).div_ceil(4096) * 4096;
        Ring { desc: base, avail: base + pages, used: base + pages + 4096, size, next_avail: 0, last_used: 0 }
    }
}

/// The guest: its memory, its two queues and the front end's connection.
struct Guest {
    mem: GuestMemoryMmap,
    fe: Frontend,
    rx: Ring,
    tx: Ring,
    rx_kick: EventFd,
    tx_kick: EventFd,
    calls: [EventFd; 2],
    _memfd: std::fs::File,
}

impl Guest {
    /// Connects, acknowledges `features` (of those offered) and sets both queues up as QEMU does.
    fn connect(socket: &std::path::Path, features: u64) -> Guest {
        let memfd: std::fs::File =
            rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd").into();
        memfd.set_len(MEM_SIZE as u64).unwrap();
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files(&[(
            GuestAddress(0),
            MEM_SIZE,
            Some(FileOffset::new(memfd.try_clone().unwrap(), 0)),
        )])
        .unwrap();
        let mut fe = Frontend::connect(socket, 2).expect("connect to the backend");
        fe.set_owner().unwrap();
        let offered = fe.get_features().unwrap();
        assert_eq!(features & !offered, 0, "acknowledging only offered features ({offered:#x})");
        fe.set_features(features | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()).unwrap();
        let protocol = fe.get_protocol_features().unwrap();
        let wanted = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::RESET_DEVICE
            | VhostUserProtocolFeatures::REPLY_ACK;
        fe.set_protocol_features(protocol & wanted).unwrap();
        // Every message waits for the backend's acknowledgement, so that what it did can be checked right after.
        assert!(protocol.contains(VhostUserProtocolFeatures::REPLY_ACK), "REPLY_ACK offered");
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        let host = GuestMemoryBackend::get_host_address(&mem, GuestAddress(0)).unwrap() as u64;
        let region = GuestMemoryBackend::find_region(&mem, GuestAddress(0)).unwrap();
        let region = VhostUserMemoryRegionInfo::from_guest_region(region).unwrap();
        fe.set_mem_table(&[region]).unwrap();
        let mut guest = Guest {
            mem,
            fe,
            rx: Ring::new(0, RX_SIZE),
            tx: Ring::new(0x1_0000, TX_SIZE),
            rx_kick: EventFd::new(0).unwrap(),
            tx_kick: EventFd::new(0).unwrap(),
            calls: [EventFd::new(EFD_NONBLOCK).unwrap(), EventFd::new(EFD_NONBLOCK).unwrap()],
            _memfd: memfd,
        };
        guest.start_queues(host);
        guest
    }

    fn start_queues(&mut self, host: u64) {
        for (index, ring) in [(0, &self.rx), (1, &self.tx)] {
            // The rings start empty: every index and flag zero.
            for addr in [ring.avail, ring.used] {
                self.mem.write_slice(&[0u8; 4096], GuestAddress(addr)).unwrap();
            }
            self.fe.set_vring_num(index, ring.size).unwrap();
            let config = VringConfigData {
                queue_max_size: ring.size,
                queue_size: ring.size,
                flags: 0,
                desc_table_addr: host + ring.desc,
                used_ring_addr: host + ring.used,
                avail_ring_addr: host + ring.avail,
                log_addr: None,
            };
            self.fe.set_vring_addr(index, &config).unwrap();
            self.fe.set_vring_base(index, 0).unwrap();
            self.fe.set_vring_call(index, &self.calls[index]).unwrap();
            let kick = if index == 0 { &self.rx_kick } else { &self.tx_kick };
            self.fe.set_vring_kick(index, kick).unwrap();
            self.fe.set_vring_enable(index, true).unwrap();
        }
    }

    fn write_desc(&self, ring: &Ring, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = ring.desc + 16 * u64::from(index);
        self.mem.write_obj(addr.to_le(), GuestAddress(at)).unwrap();
        self.mem.write_obj(len.to_le(), GuestAddress(at + 8)).unwrap();
        self.mem.write_obj(flags.to_le(), GuestAddress(at + 12)).unwrap();
        self.mem.write_obj(next.to_le(), GuestAddress(at + 14)).unwrap();
    }

    /// Makes chain `head` available and moves the ring's index on.
    fn publish(mem: &GuestMemoryMmap, ring: &mut Ring, head: u16) {
        let slot = ring.avail + 4 + 2 * u64::from(ring.next_avail % ring.size);
        mem.write_obj(head.to_le(), GuestAddress(slot)).unwrap();
        fence(Ordering::SeqCst);
        ring.next_avail = ring.next_avail.wrapping_add(1);
        mem.write_obj(ring.next_avail.to_le(), GuestAddress(ring.avail + 2)).unwrap();
        fence(Ordering::SeqCst);
    }

    /// Waits (generously) until the device has used `count` more chains; returns them as (head, length).
    fn wait_used(mem: &GuestMemoryMmap, ring: &mut Ring, count: u16, what: &str) -> Vec<(u32, u32)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let idx: u16 = u16::from_le(mem.read_obj(GuestAddress(ring.used + 2)).unwrap());
            if idx.wrapping_sub(ring.last_used) >= count {
                break;
            }
            assert!(Instant::now() < deadline, "{what}: {count} buffers not used within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        fence(Ordering::SeqCst);
        (0..count)
            .map(|_| {
                let at = ring.used + 4 + 8 * u64::from(ring.last_used % ring.size);
                ring.last_used = ring.last_used.wrapping_add(1);
                let id: u32 = u32::from_le(mem.read_obj(GuestAddress(at)).unwrap());
                let len: u32 = u32::from_le(mem.read_obj(GuestAddress(at + 4)).unwrap());
                (id, len)
            })
            .collect()
    }

    /// Sends one frame behind `hdr` as a chain of two descriptors (header, frame) and waits until it is used.
    fn send(&mut self, hdr: &[u8; HDR], frame: &[u8]) {
        let slot = self.tx.next_avail % (TX_SIZE / 2);
        let addr = TX_AREA + u64::from(slot) * TX_SLOT;
        self.mem.write_slice(hdr, GuestAddress(addr)).unwrap();
        self.mem.write_slice(frame, GuestAddress(addr + HDR as u64)).unwrap();
        let (head, tail) = (2 * slot, 2 * slot + 1);
        self.write_desc(&self.tx, head, addr, HDR as u32, DESC_F_NEXT, tail);
        self.write_desc(&self.tx, tail, addr + HDR as u64, frame.len() as u32, 0, 0);
        self.send_chain(head);
    }

    /// Makes transmit chain `head` (written already) available, kicks and waits until it is given back.
    fn send_chain(&mut self, head: u16) {
        Self::publish(&self.mem, &mut self.tx, head);
        self.tx_kick.write(1).unwrap();
        let used = Self::wait_used(&self.mem, &mut self.tx, 1, "transmit");
        assert_eq!(used[0].0, u32::from(head), "the chain given back is the one sent");
    }

    /// Offers `count` receive buffers of [`RX_BUF`] bytes, one descriptor each (descriptor i at its own address).
    fn post_rx(&mut self, first: u16, count: u16) {
        for i in first..first + count {
            let id = i % RX_SIZE;
            self.write_desc(&self.rx, id, RX_AREA + u64::from(id) * RX_BUF, RX_BUF as u32, DESC_F_WRITE, 0);
            Self::publish(&self.mem, &mut self.rx, id);
        }
        self.rx_kick.write(1).unwrap();
    }

    /// Takes the next frame the device put in the receive buffers: its header and bytes (gathered over
    /// `num_buffers` buffers) and the number of buffers. Each buffer used is offered again.
    fn recv(&mut self) -> ([u8; HDR], Vec<u8>, u16) {
        let first = Self::wait_used(&self.mem, &mut self.rx, 1, "receive")[0];
        let mut bytes = self.read_rx_buffer(first);
        assert!(bytes.len() >= HDR, "a used receive buffer holds at least the header: {first:?}");
        let num_buffers = u16::from_le_bytes([bytes[10], bytes[11]]);
        assert!(num_buffers >= 1, "num_buffers is set");
        let mut ids = vec![first.0 as u16];
        for more in Self::wait_used(&self.mem, &mut self.rx, num_buffers - 1, "receive (more buffers)") {
            bytes.extend(self.read_rx_buffer(more));
            ids.push(more.0 as u16);
        }
        for id in ids {
            self.write_desc(&self.rx, id, RX_AREA + u64::from(id) * RX_BUF, RX_BUF as u32, DESC_F_WRITE, 0);
            Self::publish(&self.mem, &mut self.rx, id);
        }
        self.rx_kick.write(1).unwrap();
        let mut hdr = [0u8; HDR];
        hdr.copy_from_slice(&bytes[..HDR]);
        (hdr, bytes.split_off(HDR), num_buffers)
    }

    fn read_rx_buffer(&self, (id, len): (u32, u32)) -> Vec<u8> {
        assert!(u64::from(len) <= RX_BUF, "used length {len} within the buffer");
        let mut out = vec![0u8; len as usize];
        self.mem.read_slice(&mut out, GuestAddress(RX_AREA + u64::from(id) * RX_BUF)).unwrap();
        out
    }

    /// Receives frames until one is accepted by `want` (a TAP also carries the kernel's own traffic).
    fn recv_matching(&mut self, mut want: impl FnMut(&[u8]) -> bool) -> ([u8; HDR], Vec<u8>, u16) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = self.recv();
            if want(&got.1) {
                return got;
            }
            assert!(Instant::now() < deadline, "no matching frame within 10 s");
        }
    }
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
        let mut guest = Guest::connect(&s.socket, linux_guest_features());
        assert_eq!(device_offloads(), Offloads::TCP | Offloads::USO4 | Offloads::USO6);

        guest.fe.reset_device().unwrap();
        assert_eq!(device_offloads(), Offloads::NONE, "a reset takes the offloads away");
        guest.fe.set_features(bits(&[VERSION_1, f::CSUM, f::GUEST_CSUM, f::MRG_RXBUF])).unwrap();
        assert_eq!(device_offloads(), Offloads::CSUM, "a guest without TSO gets no super-packets");
        guest.fe.set_features(bits(&[VERSION_1, f::GUEST_CSUM, f::GUEST_TSO6, f::GUEST_ECN])).unwrap();
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
        let mut guest = Guest::connect(&s.socket, linux_guest_features());
        let mac = s.tap_mac();
        let data = payload(5000, 1);
        let (hdr, frame) = udp_frame(mac, 7777, &data, Some(1000));
        guest.send(&hdr, &frame);
        let mut buf = [0u8; 2048];
        for (i, want) in data.chunks(1000).enumerate() {
            let n = socket.recv(&mut buf).unwrap_or_else(|e| panic!("segment {i}: {e}"));
            assert_eq!(&buf[..n], want, "segment {i}");
        }
        for i in 0..3 * u32::from(TX_SIZE) {
            let data = payload(100 + i as usize, i as u8);
            let (hdr, frame) = udp_frame(mac, 7777, &data, None);
            guest.send(&hdr, &frame);
            let n = socket.recv(&mut buf).unwrap_or_else(|e| panic!("datagram {i}: {e}"));
            assert_eq!(&buf[..n], &data[..], "datagram {i}");
        }
        let c = s.counters_when("transmit", |c| c.to_tap.packets == 1 + 3 * u64::from(TX_SIZE));
        assert_eq!(c.to_tap.super_packets, 1);
        assert_eq!(c.to_tap.drops.total(), 0, "{c:?}");
    });
}

/// Where the piecewise transmit test puts an indirect descriptor table and the pieces it points to (above the
/// receive buffers, below the end of guest memory).
const INDIRECT_TABLE: u64 = 0x60_0000;
const PIECES_AREA: u64 = 0x61_0000;
const DESC_F_INDIRECT: u16 = 4;
const INDIRECT_DESC: u32 = 28;

impl Guest {
    /// Sends `hdr` and `frame` cut into pieces of the given lengths (which sum to both), each in its own
    /// descriptor at its own address (in reverse order in memory), through an indirect descriptor table; waits
    /// until the chain is used.
    fn send_in_pieces(&mut self, hdr: &[u8; HDR], frame: &[u8], cuts: &[usize]) {
        let bytes = [&hdr[..], frame].concat();
        assert_eq!(cuts.iter().sum::<usize>(), bytes.len(), "the cuts cover the header and the frame");
        let mut at = 0;
        for (i, &len) in cuts.iter().enumerate() {
            let addr = PIECES_AREA + 0x1000 * (cuts.len() - i) as u64;
            self.mem.write_slice(&bytes[at..at + len], GuestAddress(addr)).unwrap();
            let entry = INDIRECT_TABLE + 16 * i as u64;
            let last = i + 1 == cuts.len();
            self.mem.write_obj(addr.to_le(), GuestAddress(entry)).unwrap();
            self.mem.write_obj((len as u32).to_le(), GuestAddress(entry + 8)).unwrap();
            self.mem.write_obj((if last { 0 } else { DESC_F_NEXT }).to_le(), GuestAddress(entry + 12)).unwrap();
            self.mem.write_obj((if last { 0 } else { i as u16 + 1 }).to_le(), GuestAddress(entry + 14)).unwrap();
            at += len;
        }
        self.write_desc(&self.tx, 0, INDIRECT_TABLE, 16 * cuts.len() as u32, DESC_F_INDIRECT, 0);
        self.send_chain(0);
    }
}

/// Frames whose header and bytes come in pieces, as guests lay them out: the header split over two
/// descriptors, a frame in many small ones, more pieces than one gathered write takes (copied instead), and
/// header and frame in one descriptor. Each reaches the socket whole.
#[test]
fn guest_frames_in_pieces_arrive_whole() {
    run("guest_frames_in_pieces_arrive_whole", |s| {
        let socket = udp_socket(7777);
        let mut guest = Guest::connect(&s.socket, linux_guest_features() | bits(&[INDIRECT_DESC]));
        let mac = s.tap_mac();
        let mut buf = [0u8; 2048];
        let mut expect = |what: &str, data: &[u8]| {
            let n = socket.recv(&mut buf).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(&buf[..n], data, "{what}");
        };

        let data = payload(1000, 1);
        let (hdr, frame) = udp_frame(mac, 7777, &data, None);
        // The header over two descriptors (5 + 7 bytes), the frame over nine.
        let mut cuts = vec![5, 7];
        cuts.extend(std::iter::repeat_n(frame.len() / 9, 8));
        cuts.push(frame.len() - 8 * (frame.len() / 9));
        guest.send_in_pieces(&hdr, &frame, &cuts);
        expect("header in two pieces, frame in nine", &data);

        // 1 + 80 pieces: more than one write gathers (64), so the frame is copied out first.
        let data = payload(1200, 2);
        let (hdr, frame) = udp_frame(mac, 7777, &data, None);
        let mut cuts = vec![HDR];
        cuts.extend(std::iter::repeat_n(frame.len() / 80, 79));
        cuts.push(frame.len() - 79 * (frame.len() / 80));
        guest.send_in_pieces(&hdr, &frame, &cuts);
        expect("81 pieces", &data);

        // A super-packet whose header shares its descriptor with the frame.
        let data = payload(3000, 3);
        let (hdr, frame) = udp_frame(mac, 7777, &data, Some(1000));
        guest.send_in_pieces(&hdr, &frame, &[HDR + frame.len()]);
        for (i, chunk) in data.chunks(1000).enumerate() {
            expect(&format!("segment {i} of a one-descriptor super-packet"), chunk);
        }

        let c = s.counters_when("the three frames", |c| c.to_tap.packets == 3);
        assert_eq!((c.to_tap.super_packets, c.to_tap.drops.total()), (1, 0), "{c:?}");
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
        let mut guest = Guest::connect(&s.socket, linux_guest_features());
        guest.post_rx(0, 64);
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
        guest.send(&hdr, &syn);
        let (_, synack, _) = guest.recv_matching(|fr| {
            fr.len() >= 54 && fr[23] == 6 && fr[34..36] == 8080u16.to_be_bytes() && fr[47] & 0x12 == 0x12
        });
        // The guest asked (event index) to hear of the first used buffer: its call eventfd was written.
        assert!(guest.calls[0].read().is_ok_and(|n| n > 0), "the guest is notified of received frames");
        let server_seq = u32::from_be_bytes(synack[38..42].try_into().unwrap());
        let (hdr, segment) = tcp(1001, server_seq.wrapping_add(1), 0x18, &data, true);
        guest.send(&hdr, &segment);
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
        let mut guest = Guest::connect(&s.socket, linux_guest_features());
        guest.post_rx(0, 64);
        let sender = UdpSocket::bind((TAP_IP, 9000)).unwrap();
        turbotun::udp::set_udp_segment(&sender, 1400).unwrap();
        // 40 sends of 7 buffers each: both rings wrap.
        for round in 0..40u8 {
            let data = payload(14_000, round);
            sender.send_to(&data, (GUEST_IP, 9999)).unwrap();
            let (hdr, frame, num_buffers) =
                guest.recv_matching(|fr| fr.len() > 42 && fr[23] == 17 && fr[36..38] == 9999u16.to_be_bytes());
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
        let mut guest = Guest::connect(&s.socket, linux_guest_features());
        let mac = s.tap_mac();
        let mut buf = [0u8; 2048];

        // A descriptor beyond guest memory.
        guest.write_desc(&guest.tx, 0, MEM_SIZE as u64 + 0x1000, 100, 0, 0);
        guest.send_chain(0);
        // A descriptor that straddles its end.
        guest.write_desc(&guest.tx, 0, MEM_SIZE as u64 - 10, 100, 0, 0);
        guest.send_chain(0);
        // A loop: 1 -> 2 -> 1.
        guest.write_desc(&guest.tx, 1, TX_AREA, 64, DESC_F_NEXT, 2);
        guest.write_desc(&guest.tx, 2, TX_AREA, 64, DESC_F_NEXT, 1);
        guest.send_chain(1);
        // A chain whose next descriptor is beyond the table.
        guest.write_desc(&guest.tx, 3, TX_AREA, 64, DESC_F_NEXT, 999);
        guest.send_chain(3);
        // A buffer the device may write, in a transmit chain.
        guest.write_desc(&guest.tx, 4, TX_AREA, 64, DESC_F_WRITE, 0);
        guest.send_chain(4);
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
            guest.send(&hdr, &frame);
        }
        // Shorter than its own header.
        guest.write_desc(&guest.tx, 5, TX_AREA, 6, 0, 0);
        guest.send_chain(5);
        let c = s.counters_when("bad headers", |c| c.to_tap.drops.malformed == 5);
        assert_eq!(c.to_tap.drops.total(), 10, "{c:?}");
        assert_eq!(c.to_tap.packets, 0, "none of them reached the TAP");

        guest.send(&good, &frame);
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
            let mut guest = Guest::connect(&s.socket, linux_guest_features());
            let data = payload(200, round);
            let (hdr, frame) = udp_frame(mac, 7777, &data, None);
            guest.send(&hdr, &frame);
            let n = socket.recv(&mut buf).unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(&buf[..n], &data[..], "round {round}");
        }
        s.counters_when("two connections", |c| c.connections == 2 && c.to_tap.packets == 2);
    });
}

/// A frame waiting for more receive buffers holds those it took; when the front end stops the ring
/// (`GET_VRING_BASE`, as QEMU does before a migration or a guest reset), they are handed back: the base it is
/// told does not count them as consumed, so the guest loses none.
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
        let mut guest = Guest::connect(&s.socket, linux_guest_features());
        guest.post_rx(0, 2);
        let sender = UdpSocket::bind((TAP_IP, 9000)).unwrap();
        turbotun::udp::set_udp_segment(&sender, 1400).unwrap();
        sender.send_to(&payload(14_000, 5), (GUEST_IP, 9999)).unwrap();
        // Read from the TAP, too big for the two buffers: it waits with both.
        s.counters_when("the frame read", |c| c.to_guest.reads == 1);
        let used: u16 = u16::from_le(guest.mem.read_obj(GuestAddress(guest.rx.used + 2)).unwrap());
        assert_eq!(used, 0, "nothing used: the frame does not fit yet");
        assert_eq!(guest.fe.get_vring_base(0).unwrap(), 0, "the two buffers taken are not reported consumed");
    });
}

/// QEMU 7.2's virtio-net enables its rings (`SET_VRING_ENABLE`) as soon as `VHOST_USER_F_PROTOCOL_FEATURES` is
/// offered, before any `SET_FEATURES`: the message is acknowledged and held until the `SET_FEATURES` that acks
/// the feature, and the connection goes on (the vhost crate's handler alone drops it). QEMU's order, message by
/// message, on the raw socket.
#[test]
fn a_vring_enable_before_set_features_is_held_not_fatal() {
    run("a_vring_enable_before_set_features_is_held_not_fatal", |s| {
        let mut socket = std::os::unix::net::UnixStream::connect(&s.socket).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (get_features, set_features, set_owner, get_protocol, set_protocol, set_vring_enable) =
            (1, 2, 3, 15, 16, 18);
        let (version, need_reply) = (0x1, VhostUserHeaderFlag::NEED_REPLY.bits());

        raw_send(&mut socket, get_features, version, &[]);
        let offered = u64::from_le_bytes(raw_reply(&mut socket, get_features).try_into().unwrap());
        let protocol_features = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        assert_ne!(offered & protocol_features, 0, "VHOST_USER_F_PROTOCOL_FEATURES offered: {offered:#x}");
        raw_send(&mut socket, get_protocol, version, &[]);
        raw_reply(&mut socket, get_protocol);
        raw_send(&mut socket, set_protocol, version, &VhostUserProtocolFeatures::REPLY_ACK.bits().to_le_bytes());
        raw_send(&mut socket, set_owner, version, &[]);

        // Ring 0 enabled before any SET_FEATURES, a reply asked for: success.
        let enable = [0u32.to_le_bytes(), 1u32.to_le_bytes()].concat();
        raw_send(&mut socket, set_vring_enable, version | need_reply, &enable);
        assert_eq!(raw_reply(&mut socket, set_vring_enable), 0u64.to_le_bytes(), "the early enable acknowledged");
        // Then the features, acknowledged by the backend, and the connection is still served.
        raw_send(&mut socket, set_features, version | need_reply, &offered.to_le_bytes());
        assert_eq!(raw_reply(&mut socket, set_features), 0u64.to_le_bytes(), "SET_FEATURES acknowledged");
        raw_send(&mut socket, get_features, version, &[]);
        assert_eq!(raw_reply(&mut socket, get_features), offered.to_le_bytes(), "still served");
        assert_eq!(s.stats.snapshot().connections, 1);
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
