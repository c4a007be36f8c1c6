//! The smoltcp adapter on real TUN devices: what it hands smoltcp has a checksum that adds up (or one the kernel
//! vouched for), and a packet whose checksum does not is dropped with its reason, on queues with and without a
//! virtio header. (The example `smoltcp_echo` carries the kernel's TCP through it; see tests/examples.rs.)

mod common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, Protocol, SendFlags, SocketType};
use smoltcp::phy::{Device, RxToken};
use turbotun::smoltcp::QueueDevice;
use turbotun::DeviceBuilder;

const ME: Ipv4Addr = Ipv4Addr::new(10, 7, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 7, 0, 2);

/// Sends `packet` (a whole IPv4 packet) out through the routing table as it is: a raw socket with its own IP
/// header, whose checksums the kernel leaves alone.
fn send_raw(packet: &[u8]) {
    let raw = rustix::net::socket(
        AddressFamily::INET,
        SocketType::RAW,
        Some(Protocol::from_raw(rustix::net::RawProtocol::new(255).expect("IPPROTO_RAW"))),
    )
    .unwrap();
    rustix::net::sendto(&raw, packet, SendFlags::empty(), &SocketAddrV4::new(PEER, 0)).unwrap();
}

/// The UDP payloads of the packets smoltcp would be handed within `wait`, read through the `Device` trait.
fn handed_up(device: &mut QueueDevice<&turbotun::Queue>, want: usize, wait: Duration) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + wait;
    let mut payloads = Vec::new();
    while payloads.len() < want && Instant::now() < deadline {
        match device.receive(smoltcp::time::Instant::now()) {
            Some((rx, _tx)) => rx.consume(|p: &[u8]| {
                if let Some((_, dst, _, 9, payload)) = common::parse_ipv4_udp(p) {
                    assert_eq!(dst, PEER);
                    payloads.push(payload.to_vec());
                }
            }),
            None => {
                device.wait(Some(Duration::from_millis(50))).unwrap();
            }
        }
    }
    payloads
}

#[test]
fn a_checksum_that_does_not_add_up_is_dropped_and_counted() {
    common::in_netns("a_checksum_that_does_not_add_up_is_dropped_and_counted", || {
        for vnet_hdr in [0, 10] {
            let name = common::unique_name("ttsm");
            let builder = DeviceBuilder::tun().name(&name);
            let dev = if vnet_hdr > 0 { builder.vnet_hdr(vnet_hdr) } else { builder }.open().unwrap();
            common::configure_v4(&name, ME, 24);
            let mut device = QueueDevice::new(&dev.queues()[0]).unwrap();
            let good = common::ipv4_udp(ME, PEER, 4000, 9, b"good");
            let mut bad = common::ipv4_udp(ME, PEER, 4000, 9, b"bad!");
            bad[26] ^= 0x01; // the UDP checksum
            let zero = {
                // No checksum at all: allowed for UDP over IPv4.
                let mut p = common::ipv4_udp(ME, PEER, 4000, 9, b"none");
                p[26..28].fill(0);
                p
            };
            for p in [&good, &bad, &zero] {
                send_raw(p);
            }
            let got = handed_up(&mut device, 2, Duration::from_secs(3));
            assert_eq!(got, vec![b"good".to_vec(), b"none".to_vec()], "vnet_hdr {vnet_hdr}");
            // Nothing else comes: the bad one was not merely late.
            assert!(handed_up(&mut device, 1, Duration::from_millis(300)).is_empty());
            let stats = device.rx_stats();
            assert_eq!(stats.drops.bad_checksum, 1, "vnet_hdr {vnet_hdr}: {stats:?}");
            assert_eq!(stats.drops.total(), 1, "vnet_hdr {vnet_hdr}: {stats:?}");
            assert_eq!(device.unverified(), 0);
        }
    });
}

#[test]
fn smoltcp_capabilities_follow_the_queue() {
    use smoltcp::phy::Medium;
    common::in_netns("smoltcp_capabilities_follow_the_queue", || {
        for (tap, vnet_hdr) in [(false, 0), (false, 12), (true, 10)] {
            let name = common::unique_name("ttsc");
            let builder = if tap { DeviceBuilder::tap() } else { DeviceBuilder::tun() };
            let builder = builder.name(&name);
            let dev = if vnet_hdr > 0 { builder.vnet_hdr(vnet_hdr) } else { builder }.open().unwrap();
            dev.queues()[0].set_mtu(1400).unwrap();
            let device = QueueDevice::new(&dev.queues()[0]).unwrap();
            let caps = device.capabilities();
            let (medium, mtu) = if tap { (Medium::Ethernet, 1414) } else { (Medium::Ip, 1400) };
            assert_eq!((caps.medium, caps.max_transmission_unit), (medium, mtu), "tap {tap} vnet_hdr {vnet_hdr}");
            // smoltcp never verifies TCP/UDP (the adapter does); it computes them only when no virtio header
            // lets the kernel do it.
            for l4 in [&caps.checksum.tcp, &caps.checksum.udp] {
                assert!(!l4.rx(), "tap {tap} vnet_hdr {vnet_hdr}: {l4:?}");
                assert_eq!(l4.tx(), vnet_hdr == 0, "tap {tap} vnet_hdr {vnet_hdr}: {l4:?}");
            }
            assert!(caps.checksum.ipv4.rx() && caps.checksum.ipv4.tx());
            assert!(dev.queues()[0].wait_readable(Some(Duration::ZERO)).is_ok());
        }
        // A queue with a packet-information header cannot carry smoltcp's packets.
        let name = common::unique_name("ttsp");
        let dev = DeviceBuilder::tun().name(&name).packet_info(true).open().unwrap();
        let err = QueueDevice::new(&dev.queues()[0]).unwrap_err();
        assert!(matches!(err, turbotun::Error::PacketInfo { user: "the smoltcp adapter", .. }), "{err}");
    });
}
