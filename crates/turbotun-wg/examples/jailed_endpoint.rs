//! A WireGuard endpoint in a jail: a privileged opener creates the TUN device and hands its queue over a Unix
//! socket (`turbotun open --send-to SOCKET --to-user USER`, or `turbotun::handover::send_queues_and_wait`); this
//! program takes it, becomes USER (no capability left), and only then builds and runs the endpoint on the fd it
//! was given, as a VPN app runs on the TUN fd Android's VpnService or a privileged helper hands it.
//!
//! `jailed_endpoint SOCKET USER PRIVATE_KEY_FILE LISTEN_PORT PEER_PUBLIC PEER_ENDPOINT PREFIX[,PREFIX...]`:
//! prints `ready` once listening, `uid: N` once it dropped its privileges, `up PORT` once the endpoint runs,
//! and `event handshake PUBLIC` when a handshake completes; stops on SIGTERM/SIGINT.

use std::time::Duration;

use turbotun::handover::{Accepted, QueueListener};
use turbotun::privilege::{drop_to, UserSpec};
use turbotun::StopHandle;
use turbotun_wg::{key_from_base64, key_to_base64, Endpoint, Event, PeerUpdate, Prefix};

const USAGE: &str =
    "usage: jailed_endpoint SOCKET USER PRIVATE_KEY_FILE LISTEN_PORT PEER_PUBLIC PEER_ENDPOINT PREFIX[,PREFIX...]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [socket, user, key_file, port, public, endpoint, prefixes] = &args[..] else { return Err(USAGE.into()) };
    let user = UserSpec::new(user.clone()).resolve()?;
    // Read while privileged (the key file is root's), kept only as the key.
    let private = key_from_base64(&std::fs::read_to_string(key_file)?).ok_or("the private key is not base64")?;
    let listener = QueueListener::bind(socket.as_ref())?;
    println!("ready");
    let stop = StopHandle::new();
    stop.stop_on_signals(&[libc::SIGTERM, libc::SIGINT])?;
    let queues = loop {
        match listener.accept(&stop, Duration::from_secs(10), |_, _| Ok(()))? {
            Accepted::Device { queues, .. } => break queues,
            Accepted::Refused(e) => eprintln!("jailed_endpoint: {e}"),
            _ => return Err("stopped before a device came".into()),
        }
    };
    drop(listener);

    // The jail: from here on no privilege at all.
    drop_to(&user)?;
    println!("uid: {}", rustix::process::getuid().as_raw());

    let mut peer = PeerUpdate::new(key_from_base64(public).ok_or("PEER_PUBLIC is not a key")?)
        .endpoint(endpoint.parse()?)
        .persistent_keepalive(0);
    for prefix in prefixes.split(',') {
        peer = peer.allowed_ip(prefix.parse::<Prefix>()?);
    }
    let endpoint = Endpoint::builder()
        .queues(queues)
        .private_key(private)
        .listen_port(port.parse()?)
        .peer(peer)
        .stop_on(stop)
        .build()?;
    let events = endpoint.control().subscribe();
    std::thread::spawn(move || {
        for event in events {
            if let Event::HandshakeCompleted { peer } = event {
                println!("event handshake {}", key_to_base64(&peer));
            }
        }
    });
    println!("up {}", endpoint.control().listen_port());
    let ran = endpoint.run()?;
    println!("stopped ({:?})", ran.ended);
    Ok(())
}
