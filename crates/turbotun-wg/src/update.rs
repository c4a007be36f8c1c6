//! A configuration change as typed values: what a `set=1` request of WireGuard's userspace interface says,
//! line for line, built in code. Both go through one [`Op`] each and one applier (the `uapi::set` module's
//! `SetRequest`), so a typed [`Update`] has the request's meaning exactly: operations take effect in order, an
//! allowed prefix belongs to the peer given it last, a peer with the device's own public key is ignored, and an
//! update that cannot be applied whole changes nothing.
//!
//! ```
//! use turbotun_wg::{PeerUpdate, Update};
//! let (peer, prefix) = ([7u8; 32], "10.0.0.2/32".parse().unwrap());
//! let update = Update::new()
//!     .listen_port(51820)
//!     .peer(PeerUpdate::new(peer).endpoint("192.0.2.1:51820".parse().unwrap()).allowed_ip(prefix))
//!     .remove_peer([8u8; 32]);
//! assert_eq!(update.to_string(), "listen_port=51820\npublic_key=0707070707070707070707070707070707070707070707070707070707070707\n\
//!     endpoint=192.0.2.1:51820\nallowed_ip=10.0.0.2/32\npublic_key=0808080808080808080808080808080808080808080808080808080808080808\n\
//!     remove=true\n");
//! ```

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use crate::config::{key_to_hex, Key, SecretKey};

/// A prefix of AllowedIPs: an address and its length (host bits are cleared when it is applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix {
    /// The address.
    pub addr: IpAddr,
    /// The prefix length (0–32 for IPv4, 0–128 for IPv6).
    pub len: u8,
}

impl Prefix {
    /// `addr/len`.
    pub fn new(addr: IpAddr, len: u8) -> Self {
        Prefix { addr, len }
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Why a text is not a prefix.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0:?} is not ADDR/LEN")]
pub struct BadPrefix(String);

impl std::str::FromStr for Prefix {
    type Err = BadPrefix;

    /// `ADDR/LEN`, or an address alone (a host: /32 or /128).
    fn from_str(text: &str) -> Result<Self, BadPrefix> {
        let bad = || BadPrefix(text.to_string());
        if !text.contains('/') {
            let addr: IpAddr = text.parse().map_err(|_| bad())?;
            return Ok(Prefix { addr, len: if addr.is_ipv4() { 32 } else { 128 } });
        }
        let net = ip_network::IpNetwork::from_str_truncate(text).map_err(|_| bad())?;
        Ok(Prefix { addr: net.network_address(), len: net.netmask() })
    }
}

/// One operation: one line of a `set=1` request.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// `private_key=`: `None` removes it (all zeros on the wire).
    PrivateKey(Option<SecretKey>),
    ListenPort(u16),
    Fwmark(u32),
    ReplacePeers,
    /// `public_key=`: the peer the operations after it are about.
    Peer(Key),
    UpdateOnly,
    Remove,
    /// `preshared_key=`: `None` removes it.
    PresharedKey(Option<SecretKey>),
    Endpoint(SocketAddr),
    PersistentKeepalive(u16),
    ReplaceAllowedIps,
    AllowedIp(Prefix),
    RemoveAllowedIp(Prefix),
    ProtocolVersion,
}

impl fmt::Display for Op {
    /// The request line, secrets shown as zeros never: as `uapi::set::printable_line` shows a line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::PrivateKey(_) => f.write_str("private_key=(not shown)"),
            Op::ListenPort(port) => write!(f, "listen_port={port}"),
            Op::Fwmark(mark) => write!(f, "fwmark={mark}"),
            Op::ReplacePeers => f.write_str("replace_peers=true"),
            Op::Peer(key) => write!(f, "public_key={}", key_to_hex(key)),
            Op::UpdateOnly => f.write_str("update_only=true"),
            Op::Remove => f.write_str("remove=true"),
            Op::PresharedKey(_) => f.write_str("preshared_key=(not shown)"),
            Op::Endpoint(endpoint) => write!(f, "endpoint={endpoint}"),
            Op::PersistentKeepalive(seconds) => write!(f, "persistent_keepalive_interval={seconds}"),
            Op::ReplaceAllowedIps => f.write_str("replace_allowed_ips=true"),
            Op::AllowedIp(prefix) => write!(f, "allowed_ip={prefix}"),
            Op::RemoveAllowedIp(prefix) => write!(f, "allowed_ip=-{prefix}"),
            Op::ProtocolVersion => f.write_str("protocol_version=1"),
        }
    }
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A change to a device's configuration, applied whole or not at all (see the module documentation).
/// Its [`Display`](fmt::Display) is the `set=1` request it stands for, with secrets left out.
///
/// The device's own settings (key, port, mark, `replace_peers`) come before every peer in the request whatever
/// order they were given in, in the order given: a request allows them only there, so this is the one meaning
/// a valid request could have.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Update {
    /// The device's settings, in order.
    device: Vec<Op>,
    /// The peer sections, in order.
    peers: Vec<Op>,
}

impl Update {
    /// An update that changes nothing yet.
    pub fn new() -> Self {
        Update::default()
    }

    /// Sets the private key (clamped when applied); the peer with its public key, if any, is removed.
    pub fn private_key(mut self, key: Key) -> Self {
        self.device.push(Op::PrivateKey(Some(SecretKey::new(key))));
        self
    }

    /// Removes the private key: the device answers nobody until it has one.
    pub fn remove_private_key(mut self) -> Self {
        self.device.push(Op::PrivateKey(None));
        self
    }

    /// Moves the device to UDP `port` (0: any free one). An endpoint running on sockets its host made, with no
    /// way to make others, refuses a new port.
    pub fn listen_port(mut self, port: u16) -> Self {
        self.device.push(Op::ListenPort(port));
        self
    }

    /// Marks the tunnel's datagrams with `mark` (0: none).
    pub fn fwmark(mut self, mark: u32) -> Self {
        self.device.push(Op::Fwmark(mark));
        self
    }

    /// Removes every peer at this point of the update (the peers after it are the device's only ones).
    pub fn replace_peers(mut self) -> Self {
        self.device.push(Op::ReplacePeers);
        self
    }

    /// Adds the peer `peer` describes, or changes it if it exists.
    pub fn peer(mut self, peer: PeerUpdate) -> Self {
        self.peers.push(Op::Peer(peer.public_key));
        if peer.update_only {
            self.peers.push(Op::UpdateOnly);
        }
        self.peers.extend(peer.ops);
        self
    }

    /// Removes the peer with public key `key` (nothing if there is none).
    pub fn remove_peer(mut self, key: Key) -> Self {
        self.peers.push(Op::Peer(key));
        self.peers.push(Op::Remove);
        self
    }

    /// This update, then `other`'s settings and peers.
    pub fn and(mut self, other: Update) -> Self {
        self.device.extend(other.device);
        self.peers.extend(other.peers);
        self
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.device.is_empty() && self.peers.is_empty()
    }

    /// Its operations in the order they apply.
    pub(crate) fn ops(&self) -> impl Iterator<Item = &Op> {
        self.device.iter().chain(&self.peers)
    }

    /// Its operations, taken, in the order they apply.
    pub(crate) fn into_ops(self) -> impl Iterator<Item = Op> {
        self.device.into_iter().chain(self.peers)
    }
}

impl fmt::Display for Update {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ops().try_for_each(|op| writeln!(f, "{op}"))
    }
}

/// What an [`Update`] does to one peer: created with its public key, then each change in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerUpdate {
    public_key: Key,
    update_only: bool,
    ops: Vec<Op>,
}

impl PeerUpdate {
    /// The peer with public key `public_key`: added if it does not exist (unless [`Self::update_only`]).
    pub fn new(public_key: Key) -> Self {
        PeerUpdate { public_key, update_only: false, ops: Vec::new() }
    }

    /// Changes the peer only if it exists; otherwise the update leaves it out.
    pub fn update_only(mut self) -> Self {
        self.update_only = true;
        self
    }

    /// Mixes `key` into its handshakes from the next one (`None`: no preshared key).
    pub fn preshared_key(mut self, key: Option<Key>) -> Self {
        self.ops.push(Op::PresharedKey(key.map(SecretKey::new)));
        self
    }

    /// Sends to it at `endpoint` until an authenticated datagram comes from elsewhere.
    pub fn endpoint(mut self, endpoint: SocketAddr) -> Self {
        self.ops.push(Op::Endpoint(endpoint));
        self
    }

    /// Sends a keepalive after `seconds` without sending (0: never).
    pub fn persistent_keepalive(mut self, seconds: u16) -> Self {
        self.ops.push(Op::PersistentKeepalive(seconds));
        self
    }

    /// Removes every allowed prefix it has at this point (those after it are its only ones).
    pub fn replace_allowed_ips(mut self) -> Self {
        self.ops.push(Op::ReplaceAllowedIps);
        self
    }

    /// Routes `prefix` to it and lets it send from there (taken from the peer that had it).
    pub fn allowed_ip(mut self, prefix: Prefix) -> Self {
        self.ops.push(Op::AllowedIp(prefix));
        self
    }

    /// Takes `prefix` from it, if it holds it.
    pub fn remove_allowed_ip(mut self, prefix: Prefix) -> Self {
        self.ops.push(Op::RemoveAllowedIp(prefix));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_parsed_with_its_host_bits_cleared() {
        let prefix: Prefix = "10.1.2.3/24".parse().unwrap();
        assert_eq!(prefix, Prefix::new("10.1.2.0".parse().unwrap(), 24));
        assert_eq!("fd00::1".parse::<Prefix>().unwrap().len, 128);
        assert!("10.1.2.3/33".parse::<Prefix>().is_err());
    }

    #[test]
    fn an_update_shows_no_secret() {
        let update = Update::new().private_key([9; 32]).peer(PeerUpdate::new([1; 32]).preshared_key(Some([9; 32])));
        let text = update.to_string();
        assert!(!text.contains("0909"), "{text}");
        assert!(text.contains("private_key=(not shown)") && text.contains("preshared_key=(not shown)"), "{text}");
    }

    #[test]
    fn update_only_comes_right_after_the_public_key_whenever_it_was_asked_for() {
        let update = Update::new().peer(PeerUpdate::new([1; 32]).persistent_keepalive(25).update_only());
        assert_eq!(update.ops().nth(1), Some(&Op::UpdateOnly));
    }

    #[test]
    fn the_device_settings_come_before_every_peer_in_the_order_given() {
        let update = Update::new().peer(PeerUpdate::new([1; 32])).listen_port(1).replace_peers().fwmark(2);
        let ops: Vec<String> = update.ops().map(|op| op.to_string()).collect();
        assert_eq!(ops[..3], ["listen_port=1", "replace_peers=true", "fwmark=2"]);
        assert!(ops[3].starts_with("public_key=0101"));
    }
}
