//! A WireGuard endpoint embedded in a host program that makes its own UDP socket (bound to one address, with a
//! firewall mark, as a VPN app binds to its uplink and keeps its own traffic out of its tunnel) and configures
//! and watches the endpoint through typed calls while it runs.
//!
//! `host_socket DEV ADDR/PREFIX PRIVATE_KEY_FILE LOCAL_ADDR:PORT MARK`: creates the TUN device DEV with
//! ADDR/PREFIX, binds its socket at LOCAL_ADDR:PORT with firewall mark MARK, prints `ready`, then takes commands
//! on standard input, one a line, and answers each with one line (`ok`, `error: ...`, or what was asked):
//!
//! - `add PUBLIC ENDPOINT|- PREFIX[,PREFIX...]`: adds the peer (or changes it), endpoint `-` for none;
//! - `remove PUBLIC`: removes it;
//! - `peer PUBLIC`: `endpoint=... handshake=yes|no rx=N tx=N drops=N`;
//! - `port N`: asks for another listen port (refused: the host's socket is fixed).
//!
//! Events are printed as they happen: `event handshake PUBLIC`, `event endpoint PUBLIC ADDR`, `event expired
//! PUBLIC`. It stops at the end of standard input or on SIGTERM/SIGINT and prints `stopped`.

use std::io::BufRead;
use std::net::SocketAddr;

use turbotun::netlink::Netlink;
use turbotun::udp::{SocketOptions, TunnelSocket};
use turbotun::wire::VIRTIO_NET_HDR_LEN;
use turbotun::{DeviceBuilder, Offloads};
use turbotun_wg::{key_from_base64, key_to_base64, Control, Endpoint, Event, PeerUpdate, Prefix, Update};

const USAGE: &str = "usage: host_socket DEV ADDR/PREFIX PRIVATE_KEY_FILE LOCAL_ADDR:PORT MARK";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name, address, key_file, local, mark] = &args[..] else { return Err(USAGE.into()) };
    let private = key_from_base64(&std::fs::read_to_string(key_file)?).ok_or("the private key is not base64")?;
    let device = DeviceBuilder::tun().name(name).vnet_hdr(VIRTIO_NET_HDR_LEN).offloads(Offloads::ALL).open()?;
    let (addr, prefix) = address.split_once('/').ok_or(USAGE)?;
    let mut netlink = Netlink::new()?;
    netlink.add_address(name, addr.parse()?, prefix.parse()?)?;
    netlink.set_mtu(name, 1420)?;
    netlink.set_up(name, true)?;

    // The host's socket, made its own way.
    let options = SocketOptions { mark: mark.parse()?, ..SocketOptions::default() };
    let socket = TunnelSocket::bind(local.parse()?, &options)?;
    let endpoint = Endpoint::builder().device(device).sockets(vec![socket]).private_key(private).build()?;
    let (control, stop) = (endpoint.control(), endpoint.stop_handle());
    stop.stop_on_signals(&[libc::SIGTERM, libc::SIGINT])?;

    let events = control.subscribe();
    std::thread::spawn(move || {
        for event in events {
            match event {
                Event::HandshakeCompleted { peer } => println!("event handshake {}", key_to_base64(&peer)),
                Event::EndpointChanged { peer, endpoint } => {
                    println!("event endpoint {} {endpoint}", key_to_base64(&peer))
                }
                Event::KeysExpired { peer } => println!("event expired {}", key_to_base64(&peer)),
                _ => println!("event {event:?}"),
            }
        }
    });
    let commands = {
        let (control, stop) = (control.clone(), stop.clone());
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                println!("{}", answer(&control, &line).unwrap_or_else(|e| format!("error: {e}")));
            }
            stop.stop();
        })
    };
    println!("ready");
    let ran = endpoint.run()?;
    println!("stopped ({:?}; {} packets into the tunnel)", ran.ended, ran.stats.to_network.packets);
    drop(commands);
    Ok(())
}

/// The answer to one command.
fn answer(control: &Control, line: &str) -> Result<String, Box<dyn std::error::Error>> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let key = |text: &str| key_from_base64(text).ok_or_else(|| format!("{text:?} is not a key"));
    match words[..] {
        ["add", public, endpoint, prefixes] => {
            let mut peer = PeerUpdate::new(key(public)?).replace_allowed_ips();
            if endpoint != "-" {
                peer = peer.endpoint(endpoint.parse::<SocketAddr>()?);
            }
            for prefix in prefixes.split(',') {
                peer = peer.allowed_ip(prefix.parse::<Prefix>()?);
            }
            control.configure(Update::new().peer(peer))?;
        }
        ["remove", public] => control.configure(Update::new().remove_peer(key(public)?))?,
        ["port", port] => control.configure(Update::new().listen_port(port.parse()?))?,
        ["peer", public] => {
            let peer = control.peer(&key(public)?).ok_or("no such peer")?;
            let endpoint = peer.state.endpoint.map_or("-".to_string(), |e| e.to_string());
            let handshake = if peer.state.last_handshake.is_some() { "yes" } else { "no" };
            let (rx, tx, drops) = (peer.state.rx_bytes, peer.state.tx_bytes, peer.state.drops);
            return Ok(format!("endpoint={endpoint} handshake={handshake} rx={rx} tx={tx} drops={drops}"));
        }
        _ => return Err(format!("{line:?}: not add, remove, peer or port").into()),
    }
    Ok("ok".into())
}
