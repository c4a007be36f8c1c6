//! A WireGuard endpoint on turbotun's tunnel engine: a TUN device and UDP with segmentation offload on both
//! sides, the protocol written here with the kernel implementation's semantics (on crates for every
//! primitive). Run it as a program (`turbotun wg`, driven by `wg` and `wg-quick` through WireGuard's
//! configuration socket) or embed it:
//!
//! - [`Endpoint`]: a whole endpoint built in code on a TUN device or queues the program was handed (another
//!   process may have opened them), with UDP sockets bound here, made by the host, or made by the host's
//!   function; run until its stop handle fires.
//! - [`Protocol`]: the protocol alone, no I/O, for a host with its own event loop: give it a packet or a
//!   datagram, get back what to send where and when to call it again.
//! - [`Control`]: both hand one out, to configure them while they run with typed [`Update`]s (the meaning of a
//!   `set=1` request: all or nothing), read each peer's state ([`PeerStatus`]) and [`subscribe`](Control::subscribe)
//!   to [`Event`]s.
//! - [`daemon`]: `turbotun wg` itself, an [`Endpoint`] with the configuration socket ([`uapi`]) in front.
//! - [`message`]: the four messages as typed views over their bytes.
//!
//! ```no_run
//! use turbotun_wg::{Endpoint, PeerUpdate};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let queue: turbotun::Queue = unimplemented!();
//! // A TUN queue received from a privileged process (`turbotun::handover`), a socket of the host's.
//! let socket = turbotun::udp::TunnelSocket::bind("0.0.0.0:51820".parse()?, &Default::default())?;
//! let endpoint = Endpoint::builder()
//!     .queues(vec![queue])
//!     .sockets(vec![socket])
//!     .private_key([1; 32])
//!     .peer(PeerUpdate::new([2; 32]).endpoint("192.0.2.2:51820".parse()?).allowed_ip("0.0.0.0/0".parse()?))
//!     .build()?;
//! let events = endpoint.control().subscribe();
//! std::thread::spawn(move || events.for_each(|event| println!("{event:?}")));
//! endpoint.run()?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

mod blake2s;
mod config;
mod control;
mod cookie;
pub mod daemon;
pub mod endpoint;
pub mod events;
pub mod message;
mod noise;
mod peer;
pub mod protocol;
mod session;
pub mod uapi;
mod update;
mod wireguard;

pub use config::{key_from_base64, key_to_base64, DeviceConfig, Key, PeerConfig, SecretKey, MAX_PEERS};
pub use control::{Control, PeerStatus};
pub use endpoint::{Endpoint, EndpointBuilder, EndpointError, SocketFactory};
pub use events::{Event, Events};
pub use peer::HELD_PER_PEER;
pub use protocol::Protocol;
pub use uapi::set::ConfigError;
pub use update::{BadPrefix, PeerUpdate, Prefix, Update};
pub use wireguard::{public_key, PeerState};
