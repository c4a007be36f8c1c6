//! The per-packet application of `per_packet.rs` on tokio: the same receive and send halves, awaited (a full
//! queue is waited for without blocking the runtime's thread).
//!
//! `per_packet_tokio DEV ADDR/PREFIX...`; needs turbotun's `tokio` feature.

use turbotun::batch::{Batch, BATCH_SIZE};
use turbotun::netlink::Netlink;
use turbotun::tokio::AsyncQueue;
use turbotun::wire::{ipv4, ipv6, udp, VIRTIO_NET_HDR_LEN};
use turbotun::{DeviceBuilder, Offloads};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().ok_or("usage: per_packet_tokio DEV ADDR/PREFIX...")?;
    let dev = DeviceBuilder::tun().name(&name).vnet_hdr(VIRTIO_NET_HDR_LEN).offloads(Offloads::ALL).open()?;
    let mut netlink = Netlink::new()?;
    for spec in args {
        let (addr, prefix) = spec.split_once('/').ok_or_else(|| format!("{spec}: expected ADDR/PREFIX"))?;
        netlink.add_address(&name, addr.parse()?, prefix.parse()?)?;
    }
    netlink.set_up(&name, true)?;
    let queue = AsyncQueue::new(dev.into_queues().remove(0))?;
    let (mut rx, mut tx) = (queue.recv_batch(), queue.send_batch());
    let offset = VIRTIO_NET_HDR_LEN;
    let mut bufs = vec![vec![0u8; offset + queue.get_ref().mtu()? as usize]; BATCH_SIZE];
    let mut lens = vec![0usize; BATCH_SIZE];
    let mut batch = Batch::new(&mut bufs, &mut lens, offset);
    println!("ready");
    loop {
        let got = rx.recv_many(&mut batch).await?;
        let mut answers = 0;
        for i in 0..got.packets {
            if answer_udp(&mut batch.bufs[i][offset..offset + batch.lens[i]]) {
                batch.bufs.swap(answers, i);
                batch.lens.swap(answers, i);
                answers += 1;
            }
        }
        tx.send_many(&mut batch.range(0..answers), got.checksums).await?;
    }
}

/// Swaps source and destination of a UDP datagram (addresses and ports): no checksum changes.
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
