//! A per-packet application on one TUN device with offloads on: every UDP datagram routed into the device is
//! answered by swapping its addresses and ports, the way a VPN or userspace stack handles each packet.
//!
//! `per_packet DEV ADDR/PREFIX...`, e.g. `per_packet tt-echo 10.9.0.1/24 fd00:9::1/64`: a datagram sent to any
//! other address of those prefixes comes back from it. Reads are split into MTU-sized packets (a UDP GSO send
//! arrives as one super-packet), and the answers are coalesced again before they are written.

use turbotun::batch::{Batch, RecvBatch, SendBatch, BATCH_SIZE};
use turbotun::netlink::Netlink;
use turbotun::wire::{ipv4, ipv6, udp, VIRTIO_NET_HDR_LEN};
use turbotun::{DeviceBuilder, Offloads};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().ok_or("usage: per_packet DEV ADDR/PREFIX...")?;
    let dev = DeviceBuilder::tun().name(&name).vnet_hdr(VIRTIO_NET_HDR_LEN).offloads(Offloads::ALL).open()?;
    configure(&name, args)?;
    let queue = &dev.queues()[0];
    let (mut rx, mut tx) = (RecvBatch::new(queue), SendBatch::new(queue));
    // Room for the virtio header in front of every packet and for the largest packet the device hands over
    // whole (its MTU): super-packets are split into these, and coalesced answers are written as gathered pieces,
    // so no buffer needs room for 64 KiB.
    let offset = VIRTIO_NET_HDR_LEN;
    let mut bufs = vec![vec![0u8; offset + queue.mtu()? as usize]; BATCH_SIZE];
    let mut lens = vec![0usize; BATCH_SIZE];
    let mut batch = Batch::new(&mut bufs, &mut lens, offset);
    println!("ready");
    loop {
        let got = rx.recv_many(&mut batch, None)?;
        // Keep the answers at the front of the batch.
        let mut answers = 0;
        for i in 0..got.packets {
            if answer_udp(&mut batch.bufs[i][offset..offset + batch.lens[i]]) {
                batch.bufs.swap(answers, i);
                batch.lens.swap(answers, i);
                answers += 1;
            }
        }
        tx.send_many(&mut batch.range(0..answers), got.checksums)?;
    }
}

/// Gives the device its addresses and brings it up.
fn configure(name: &str, addrs: impl Iterator<Item = String>) -> Result<(), Box<dyn std::error::Error>> {
    let mut netlink = Netlink::new()?;
    for spec in addrs {
        let (addr, prefix) = spec.split_once('/').ok_or_else(|| format!("{spec}: expected ADDR/PREFIX"))?;
        netlink.add_address(name, addr.parse()?, prefix.parse()?)?;
    }
    netlink.set_up(name, true)?;
    Ok(())
}

/// Turns a UDP datagram into its answer in place. Swapping source and destination (addresses and ports)
/// changes no checksum: the sums are over the same 16-bit words.
fn answer_udp(packet: &mut [u8]) -> bool {
    let l4 = match packet.first().map(|b| b >> 4) {
        Some(4) => match ipv4::Packet::new_checked(&mut *packet) {
            Ok(mut ip) if ip.protocol() == turbotun::wire::IPPROTO_UDP && !ip.is_fragment() => {
                let (src, dst) = (ip.src_addr(), ip.dst_addr());
                ip.set_src_addr(dst);
                ip.set_dst_addr(src);
                ip.header_len()
            }
            _ => return false,
        },
        Some(6) => match ipv6::Packet::new_checked(&mut *packet) {
            Ok(mut ip) if ip.next_header() == turbotun::wire::IPPROTO_UDP => {
                let (src, dst) = (ip.src_addr(), ip.dst_addr());
                ip.set_src_addr(dst);
                ip.set_dst_addr(src);
                ipv6::HEADER_LEN
            }
            _ => return false,
        },
        _ => return false,
    };
    match udp::Packet::new_checked(&mut packet[l4..]) {
        Ok(mut datagram) => {
            let (src, dst) = (datagram.src_port(), datagram.dst_port());
            datagram.set_src_port(dst);
            datagram.set_dst_port(src);
            true
        }
        Err(_) => false,
    }
}
