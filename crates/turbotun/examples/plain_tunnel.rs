//! A plain (unencrypted) tunnel: a TUN device's packets to another host over UDP and back, with segmentation
//! offload on both sides (super-packets from the device, segmented UDP sends, coalesced UDP reads, coalesced
//! writes to the device).
//!
//! `plain_tunnel DEV ADDR/PREFIX LOCAL:PORT REMOTE:PORT`, e.g. on one host
//! `plain_tunnel tun0 10.9.9.1/24 192.0.2.1:5555 192.0.2.2:5555` and on the other the same with the addresses
//! swapped; then `ping 10.9.9.2`. Counters on SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;

use turbotun::netlink::Netlink;
use turbotun::tunnel::{Plain, TunnelBuilder};
use turbotun::{DeviceBuilder, Offloads, StopHandle};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name, inner, local, remote] = &args[..] else {
        return Err("usage: plain_tunnel DEV ADDR/PREFIX LOCAL:PORT REMOTE:PORT".into());
    };
    let (local, remote): (SocketAddr, SocketAddr) = (local.parse()?, remote.parse()?);
    let (addr, prefix) = inner.split_once('/').ok_or("ADDR/PREFIX")?;

    // The device, with a virtio header and every offload: the kernel hands over (and takes) super-packets.
    let dev = DeviceBuilder::tun().name(name).vnet_hdr(10).offloads(Offloads::ALL).open()?;
    let mut netlink = Netlink::new()?;
    netlink.add_address(name, addr.parse()?, prefix.parse()?)?;
    // Room for the outer IPv4 and UDP headers within a 1500-byte underlay.
    netlink.set_mtu(name, 1472)?;
    netlink.set_up(name, true)?;

    // The engine: one socket per queue on `local`, the plain transform (the packet is the datagram).
    let stop = StopHandle::new();
    stop.stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let tunnel = TunnelBuilder::new(Arc::new(Plain::new(remote))).bind(local).stop_on(stop).build(dev.into_queues())?;
    let stats = tunnel.stats();
    println!("ready");
    let result = tunnel.run();
    let s = stats.snapshot();
    println!(
        "to the network: {} packets in {} sends, {} dropped; from the network: {} datagrams, {} written in {} writes, {} dropped",
        s.to_network.packets,
        s.to_network.writes,
        s.to_network.drops.total(),
        s.from_network.segments,
        s.from_network.packets,
        s.from_network.writes,
        s.from_network.drops.total(),
    );
    Ok(result.map(drop)?)
}
