//! WireGuard's protocol driven by a host's own event loop (tokio here): the host reads its TUN device and its
//! UDP socket, hands each packet or datagram to [`Protocol`], sends what comes back, and runs the timers by the
//! deadline the protocol gives. No thread of turbotun's, no socket of its own.
//!
//! `no_io_tokio DEV ADDR/PREFIX PRIVATE_KEY_FILE LISTEN_PORT PEER_PUBLIC PEER_ENDPOINT PREFIX[,PREFIX...]`:
//! prints `ready` once up and `event handshake PUBLIC` when a handshake completes; stops on SIGTERM/SIGINT and
//! prints what it carried.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::UdpSocket;
use turbotun::netlink::Netlink;
use turbotun::tokio::AsyncQueue;
use turbotun::DeviceBuilder;
use turbotun_wg::protocol::{Decapsulated, Encapsulated};
use turbotun_wg::{key_from_base64, key_to_base64, Event, PeerUpdate, Prefix, Protocol, Update};

const USAGE: &str =
    "usage: no_io_tokio DEV ADDR/PREFIX PRIVATE_KEY_FILE LISTEN_PORT PEER_PUBLIC PEER_ENDPOINT PREFIX[,PREFIX...]";

/// The tunnel's MTU.
const MTU: usize = 1420;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name, address, key_file, port, public, endpoint, prefixes] = &args[..] else { return Err(USAGE.into()) };
    let private = key_from_base64(&std::fs::read_to_string(key_file)?).ok_or("the private key is not base64")?;
    // A plain TUN device (no virtio header): one IP packet a read.
    let device = DeviceBuilder::tun().name(name).open()?;
    let (addr, len) = address.split_once('/').ok_or(USAGE)?;
    let mut netlink = Netlink::new()?;
    netlink.add_address(name, addr.parse()?, len.parse()?)?;
    netlink.set_mtu(name, MTU as u32)?;
    netlink.set_up(name, true)?;
    let tun = AsyncQueue::new(device.into_queues().remove(0))?;
    let udp = UdpSocket::bind(("0.0.0.0", port.parse::<u16>()?)).await?;

    let protocol = Protocol::new();
    protocol.set_mtu(MTU);
    let mut peer =
        PeerUpdate::new(key_from_base64(public).ok_or("PEER_PUBLIC is not a key")?).endpoint(endpoint.parse()?);
    for prefix in prefixes.split(',') {
        peer = peer.allowed_ip(prefix.parse::<Prefix>()?);
    }
    protocol.control().configure(Update::new().private_key(private).listen_port(port.parse()?).peer(peer))?;
    let events = protocol.control().subscribe();
    // Events arrive on a blocking receiver: a blocking thread of the runtime's waits on it.
    tokio::task::spawn_blocking(move || {
        for event in events {
            if let Event::HandshakeCompleted { peer } = event {
                println!("event handshake {}", key_to_base64(&peer));
            }
        }
    });

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let (mut packet, mut datagram) = (vec![0u8; 65536], vec![0u8; 65536]);
    let mut out = vec![0u8; 65536];
    // What the protocol asks to send, gathered by its `send` function (called synchronously) and sent after.
    let mut sends: Vec<(Vec<u8>, SocketAddr)> = Vec::new();
    let (mut sealed, mut opened) = (0u64, 0u64);
    println!("ready");
    loop {
        let timer = protocol.next_timer().unwrap_or(Duration::from_secs(3600));
        let mut gather = |bytes: &[u8], to: SocketAddr| sends.push((bytes.to_vec(), to));
        tokio::select! {
            read = tun.recv(&mut packet) => {
                let n = read?;
                if let Encapsulated::Send { len, to } = protocol.encapsulate(&mut packet[..n], &mut out, &mut gather) {
                    udp.send_to(&out[..len], to).await?;
                    sealed += 1;
                }
            }
            received = udp.recv_from(&mut datagram) => {
                let (n, from) = received?;
                if let Decapsulated::Packet { start, len } = protocol.decapsulate(&mut datagram[..n], from, &mut out, &mut gather) {
                    tun.send(&datagram[start..start + len]).await?;
                    opened += 1;
                }
            }
            _ = tokio::time::sleep(timer) => {
                protocol.update_timers(&mut gather);
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        }
        for (bytes, to) in sends.drain(..) {
            udp.send_to(&bytes, to).await?;
        }
    }
    println!("stopped: {sealed} packets sealed, {opened} opened");
    Ok(())
}
