//! A TCP echo server in smoltcp, a userspace TCP/IP stack, reached through a TUN device with offloads on.
//!
//! `smoltcp_echo DEV PORT`: the device gets 10.8.0.1/24 and fd00:8::1/64 on the kernel's side, smoltcp answers
//! as 10.8.0.2 and fd00:8::2, and echoes what every connection to PORT sends. The kernel's TCP hands over
//! super-packets (TSO), which the device adapter splits into the MTU-sized segments smoltcp reads; smoltcp's
//! segments are coalesced again before they are written, and neither side sums a payload byte in userspace.

use std::time::{SystemTime, UNIX_EPOCH};

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr};
use turbotun::netlink::Netlink;
use turbotun::smoltcp::QueueDevice;
use turbotun::wire::VIRTIO_NET_HDR_LEN;
use turbotun::{DeviceBuilder, Offloads};

/// Connections served at once: smoltcp's TCP socket is one connection, so each needs a listening socket.
const CONNECTIONS: usize = 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: smoltcp_echo DEV PORT";
    let name = args.next().ok_or(usage)?;
    let port: u16 = args.next().ok_or(usage)?.parse()?;
    let dev = DeviceBuilder::tun().name(&name).vnet_hdr(VIRTIO_NET_HDR_LEN).offloads(Offloads::ALL).open()?;
    let mut netlink = Netlink::new()?;
    netlink.add_address(&name, "10.8.0.1".parse()?, 24)?;
    netlink.add_address(&name, "fd00:8::1".parse()?, 64)?;
    netlink.set_up(&name, true)?;

    let mut device = QueueDevice::new(&dev.queues()[0])?;
    let mut config = Config::new(HardwareAddress::Ip);
    config.random_seed = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64;
    let mut iface = Interface::new(config, &mut device, Instant::now());
    iface.update_ip_addrs(|addrs| {
        addrs.push(IpCidr::new(IpAddress::v4(10, 8, 0, 2), 24)).expect("room for two addresses");
        addrs.push(IpCidr::new(IpAddress::v6(0xfd00, 8, 0, 0, 0, 0, 0, 2), 64)).expect("room for two addresses");
    });
    let mut sockets = SocketSet::new(vec![]);
    let handles: Vec<SocketHandle> = (0..CONNECTIONS)
        .map(|_| {
            let buffer = || tcp::SocketBuffer::new(vec![0; 256 * 1024]);
            sockets.add(tcp::Socket::new(buffer(), buffer()))
        })
        .collect();
    let mut scratch = vec![0u8; 64 * 1024];
    println!("ready");
    loop {
        let now = Instant::now();
        device.poll(&mut iface, &mut sockets, now)?;
        let mut moved = false;
        for &handle in &handles {
            let socket = sockets.get_mut::<tcp::Socket>(handle);
            if !socket.is_open() {
                socket.listen(port)?;
            }
            // Echo what fits in the send buffer; the rest waits in the receive buffer (TCP's own backpressure).
            let room = socket.send_capacity() - socket.send_queue();
            if socket.can_recv() && room > 0 {
                let take = room.min(scratch.len());
                let n = socket.recv_slice(&mut scratch[..take])?;
                socket.send_slice(&scratch[..n])?;
                moved |= n > 0;
            }
            // The client is done sending and everything was echoed: close our half too.
            if socket.state() == tcp::State::CloseWait && socket.send_queue() == 0 {
                socket.close();
            }
        }
        if !moved {
            device.wait(iface.poll_delay(now, &sockets).map(Into::into))?;
        }
    }
}
