//! The device's configuration and the `set=1` half of WireGuard's userspace configuration protocol: each
//! request is applied to a copy of the configuration, which replaces the old one only if every line was
//! understood, so that a bad request changes nothing.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// A Curve25519 key (private, public or preshared), 32 bytes.
pub type Key = [u8; 32];

/// What `set=1` configures, and `get=1` reports (beside what the tunnel learned at run time).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The device's private key (none until one is set).
    pub private_key: Option<Key>,
    /// The UDP port (0: any free one).
    pub listen_port: u16,
    /// The firewall mark of the tunnel's datagrams (0: none).
    pub fwmark: u32,
    /// The peers, in the order they were added.
    pub peers: Vec<PeerConfig>,
}

/// One peer's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// Its public key (what identifies it).
    pub public_key: Key,
    /// A preshared key mixed into its handshakes.
    pub preshared_key: Option<Key>,
    /// Where to send to it first (it moves to wherever authenticated datagrams come from).
    pub endpoint: Option<SocketAddr>,
    /// Seconds between keepalives when idle (0: none).
    pub persistent_keepalive: u16,
    /// The prefixes it may send from and that are routed to it (host bits cleared).
    pub allowed_ips: Vec<(IpAddr, u8)>,
}

impl PeerConfig {
    pub fn new(public_key: Key) -> Self {
        PeerConfig { public_key, preshared_key: None, endpoint: None, persistent_keepalive: 0, allowed_ips: Vec::new() }
    }
}

/// Why a `set=1` request was refused: the errno it is answered with, the line, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetError {
    /// The errno (positive; the reply carries it negated, as wireguard-go and the kernel do).
    pub errno: i32,
    /// The line that was refused.
    pub line: String,
    /// Why, in words.
    pub reason: String,
}

impl fmt::Display for SetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.line, self.reason)
    }
}

impl std::error::Error for SetError {}

/// A key in lowercase hex, as the protocol writes it.
pub fn key_to_hex(key: &Key) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key from 64 hex digits.
pub fn key_from_hex(text: &str) -> Option<Key> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(key)
}

/// A prefix `ADDR/LEN` with its host bits cleared.
pub fn parse_prefix(text: &str) -> Option<(IpAddr, u8)> {
    let net = ip_network::IpNetwork::from_str_truncate(text).ok()?;
    Some((net.network_address(), net.netmask()))
}

/// Where a peer section's lines go.
enum Section {
    /// Device lines (before the first `public_key`).
    Device,
    /// The peer at this index of the new configuration.
    Peer(usize),
    /// A peer whose lines are read and dropped: our own key, or `update_only` for a peer that does not exist.
    Ignored,
    /// A peer that does not exist yet: created by its first line other than `update_only`.
    New(Key),
}

/// Applies the lines of one `set=1` request (without the `set=1` line and the empty line that ends it) to a copy
/// of `config`; `own_public` is the public key of the private key in force after the request's device lines
/// (a peer with it is ignored, as wireguard-go does). Returns the new configuration, or why the request is
/// refused (the old one then stands).
pub fn apply_set(
    config: &DeviceConfig,
    lines: &[&str],
    own_public: impl Fn(&Key) -> Key,
) -> Result<DeviceConfig, SetError> {
    let mut new = config.clone();
    let mut section = Section::Device;
    for &line in lines {
        let refuse = |errno: i32, reason: &str| SetError { errno, line: line.to_string(), reason: reason.to_string() };
        let Some((key, value)) = line.split_once('=') else {
            return Err(refuse(libc::EPROTO, "not a key=value line"));
        };
        let key_value =
            |what: &str| key_from_hex(value).ok_or_else(|| refuse(libc::EINVAL, &format!("{what}: not 64 hex digits")));
        if key == "public_key" {
            let public = key_value("public_key")?;
            let own = new.private_key.as_ref().map(&own_public);
            section = if own == Some(public) {
                Section::Ignored
            } else {
                match new.peers.iter().position(|p| p.public_key == public) {
                    Some(i) => Section::Peer(i),
                    None => Section::New(public),
                }
            };
            continue;
        }
        // A new peer's first line other than update_only creates it.
        if let Section::New(public) = section {
            if key != "update_only" {
                new.peers.push(PeerConfig::new(public));
                section = Section::Peer(new.peers.len() - 1);
            }
        }
        match section {
            Section::Device => match key {
                "private_key" => {
                    let private = key_value("private_key")?;
                    new.private_key = (private != [0; 32]).then_some(private);
                }
                "listen_port" => {
                    new.listen_port = value.parse().map_err(|_| refuse(libc::EINVAL, "listen_port: not a port"))?;
                }
                "fwmark" => {
                    new.fwmark = value.parse().map_err(|_| refuse(libc::EINVAL, "fwmark: not a 32-bit number"))?;
                }
                "replace_peers" => {
                    if value != "true" {
                        return Err(refuse(libc::EINVAL, "replace_peers takes only true"));
                    }
                    new.peers.clear();
                }
                _ => return Err(refuse(libc::EINVAL, "not a device key")),
            },
            Section::Ignored => {}
            Section::New(_) => {
                // update_only, the only line that leaves a new peer uncreated.
                if value != "true" {
                    return Err(refuse(libc::EINVAL, "update_only takes only true"));
                }
                section = Section::Ignored;
            }
            Section::Peer(i) => {
                apply_peer_line(&mut new, i, key, value).map_err(|reason| refuse(libc::EINVAL, &reason))?;
                if key == "remove" {
                    section = Section::Ignored;
                }
            }
        }
    }
    if let Section::New(public) = section {
        // A peer section of only its public key creates the peer.
        new.peers.push(PeerConfig::new(public));
    }
    Ok(new)
}

/// One peer line on peer `i` of `config` (`remove` takes the peer out).
fn apply_peer_line(config: &mut DeviceConfig, i: usize, key: &str, value: &str) -> Result<(), String> {
    let peer = &mut config.peers[i];
    match key {
        "update_only" => {
            if value != "true" {
                return Err("update_only takes only true".into());
            }
        }
        "remove" => {
            if value != "true" {
                return Err("remove takes only true".into());
            }
            config.peers.remove(i);
        }
        "preshared_key" => {
            let psk = key_from_hex(value).ok_or("preshared_key: not 64 hex digits")?;
            peer.preshared_key = (psk != [0; 32]).then_some(psk);
        }
        "endpoint" => {
            peer.endpoint =
                Some(value.parse().map_err(|_| format!("endpoint: {value:?} is not ADDR:PORT or [ADDR]:PORT"))?);
        }
        "persistent_keepalive_interval" => {
            peer.persistent_keepalive = value.parse().map_err(|_| "persistent_keepalive_interval: not 0 to 65535")?;
        }
        "replace_allowed_ips" => {
            if value != "true" {
                return Err("replace_allowed_ips takes only true".into());
            }
            peer.allowed_ips.clear();
        }
        "allowed_ip" => {
            let (remove, text) = match value.strip_prefix('-') {
                Some(rest) => (true, rest),
                None => (false, value),
            };
            let prefix = parse_prefix(text).ok_or_else(|| format!("allowed_ip: {text:?} is not ADDR/PREFIX"))?;
            peer.allowed_ips.retain(|p| *p != prefix);
            if !remove {
                peer.allowed_ips.push(prefix);
            }
        }
        "protocol_version" => {
            if value != "1" {
                return Err("protocol_version: only 1 exists".into());
            }
        }
        _ => return Err("not a peer key".into()),
    }
    Ok(())
}

/// Peers that lose an allowed prefix to a later peer: WireGuard's AllowedIPs are exclusive, so a prefix given
/// to a second peer moves to it (as the kernel and wireguard-go do).
pub fn make_prefixes_exclusive(config: &mut DeviceConfig) {
    let mut seen: Vec<(IpAddr, u8)> = Vec::new();
    for peer in config.peers.iter_mut().rev() {
        peer.allowed_ips.retain(|p| !seen.contains(p));
        seen.extend(peer.allowed_ips.iter().copied());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(b: u8) -> Key {
        [b; 32]
    }

    fn own(private: &Key) -> Key {
        // A stand-in for the Curve25519 base-point multiplication: any fixed function will do for these tests.
        let mut p = *private;
        p[0] ^= 0xff;
        p
    }

    fn set(config: &DeviceConfig, lines: &[&str]) -> Result<DeviceConfig, SetError> {
        apply_set(config, lines, own)
    }

    #[test]
    fn test_hex_keys_round_trip_and_bad_ones_are_refused() {
        let key = k(0xab);
        assert_eq!(key_from_hex(&key_to_hex(&key)), Some(key));
        assert_eq!(key_from_hex("ab"), None);
        assert_eq!(key_from_hex(&"zz".repeat(32)), None);
        assert_eq!(key_from_hex(&"é".repeat(32)), None, "non-ASCII never slices through a character");
    }

    #[test]
    fn test_what_wg_setconf_sends_is_applied() {
        let (peer1, peer2) = (key_to_hex(&k(1)), key_to_hex(&k(2)));
        let lines = [
            format!("private_key={}", key_to_hex(&k(9))),
            "listen_port=51820".into(),
            "fwmark=0".into(),
            "replace_peers=true".into(),
            format!("public_key={peer1}"),
            format!("preshared_key={}", key_to_hex(&k(7))),
            "endpoint=192.0.2.1:51820".into(),
            "persistent_keepalive_interval=25".into(),
            "replace_allowed_ips=true".into(),
            "allowed_ip=10.0.0.5/24".into(),
            "allowed_ip=fd00::1/64".into(),
            format!("public_key={peer2}"),
            "endpoint=[2001:db8::1]:1234".into(),
            "replace_allowed_ips=true".into(),
            "allowed_ip=0.0.0.0/0".into(),
        ];
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let c = set(&DeviceConfig::default(), &lines).unwrap();
        assert_eq!((c.private_key, c.listen_port, c.fwmark), (Some(k(9)), 51820, 0));
        assert_eq!(c.peers.len(), 2);
        let p = &c.peers[0];
        assert_eq!((p.preshared_key, p.persistent_keepalive), (Some(k(7)), 25));
        assert_eq!(p.endpoint, Some("192.0.2.1:51820".parse().unwrap()));
        assert_eq!(p.allowed_ips, vec![("10.0.0.0".parse().unwrap(), 24), ("fd00::".parse().unwrap(), 64)]);
        assert_eq!(c.peers[1].endpoint, Some("[2001:db8::1]:1234".parse().unwrap()));
        // addconf-style: no replace, a new allowed IP added to an existing peer, one removed with `-`.
        let more = [format!("public_key={peer1}"), "allowed_ip=10.1.0.0/16".into(), "allowed_ip=-fd00::/64".into()];
        let more: Vec<&str> = more.iter().map(String::as_str).collect();
        let c2 = set(&c, &more).unwrap();
        assert_eq!(c2.peers[0].allowed_ips, vec![("10.0.0.0".parse().unwrap(), 24), ("10.1.0.0".parse().unwrap(), 16)]);
        // remove, and update_only for a peer that does not exist (nothing created).
        let rm = [
            format!("public_key={peer2}"),
            "remove=true".into(),
            format!("public_key={}", key_to_hex(&k(3))),
            "update_only=true".into(),
            "endpoint=192.0.2.9:1".into(),
        ];
        let rm: Vec<&str> = rm.iter().map(String::as_str).collect();
        let c3 = set(&c2, &rm).unwrap();
        assert_eq!(c3.peers.len(), 1);
        assert_eq!(c3.peers[0].public_key, k(1));
    }

    #[test]
    fn test_a_bad_line_changes_nothing_and_says_which() {
        let start = set(&DeviceConfig::default(), &["listen_port=1000"]).unwrap();
        for (bad, errno) in [
            ("listen_port=abc", libc::EINVAL),
            ("listen_port=70000", libc::EINVAL),
            ("no equals sign", libc::EPROTO),
            ("frobnicate=1", libc::EINVAL),
            ("replace_peers=false", libc::EINVAL),
        ] {
            let err = set(&start, &["fwmark=7", bad]).unwrap_err();
            assert_eq!((err.errno, err.line.as_str()), (errno, bad), "{err}");
        }
        let peer = format!("public_key={}", key_to_hex(&k(1)));
        for bad in [
            "allowed_ip=10.0.0.0/33",
            "allowed_ip=nonsense",
            "endpoint=10.0.0.1",
            "protocol_version=2",
            "persistent_keepalive_interval=-1",
            "private_key=00",
        ] {
            let err = set(&start, &[peer.as_str(), bad]).unwrap_err();
            assert_eq!(err.line, bad);
        }
        assert_eq!(set(&start, &["public_key=xyz"]).unwrap_err().errno, libc::EINVAL);
    }

    #[test]
    fn test_our_own_public_key_as_a_peer_is_ignored() {
        let c = set(&DeviceConfig::default(), &[&format!("private_key={}", key_to_hex(&k(5)))]).unwrap();
        let me = format!("public_key={}", key_to_hex(&own(&k(5))));
        let c = set(&c, &[me.as_str(), "allowed_ip=10.0.0.0/8"]).unwrap();
        assert!(c.peers.is_empty());
    }

    #[test]
    fn test_a_prefix_moves_to_the_last_peer_given_it() {
        let mut c = DeviceConfig::default();
        for i in 1..=2 {
            let mut p = PeerConfig::new(k(i));
            p.allowed_ips = vec![("10.0.0.0".parse().unwrap(), 24), (format!("10.0.{i}.0").parse().unwrap(), 24)];
            c.peers.push(p);
        }
        make_prefixes_exclusive(&mut c);
        assert_eq!(c.peers[0].allowed_ips, vec![("10.0.1.0".parse().unwrap(), 24)]);
        assert_eq!(c.peers[1].allowed_ips.len(), 2);
    }
}
