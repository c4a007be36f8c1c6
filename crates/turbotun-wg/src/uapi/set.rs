//! The `set=1` half of WireGuard's userspace configuration protocol: each request is applied to a copy of the
//! configuration, which replaces the old one only if every line was understood, so that a bad request changes
//! nothing.
//!
//! Lines take effect in order, as in the kernel: an allowed prefix belongs to the peer that was given it last
//! (one table over all peers, so [`DeviceConfig`] never holds a prefix twice), a peer with the device's own
//! public key is never added, and a new private key removes the peer that has its public key.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};

pub(crate) use crate::config::MAX_PEERS;
use crate::config::{key_from_hex, DeviceConfig, Key, PeerConfig, SecretKey};
use crate::update::{Op, Prefix};
use crate::wireguard::{ConfigChange, ConfigView};

/// Why a configuration change (a `set=1` request or an [`Update`](crate::Update)) was refused, whole: the errno
/// the request is answered with, the line or operation refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The errno (positive; the reply carries it negated, as wireguard-go and the kernel do).
    pub errno: i32,
    /// The line (or operation, as its line) that was refused, as it may be shown: the value of a line that can
    /// carry a key is left out; empty when the whole change was refused by the endpoint for no one setting.
    pub line: String,
    /// Why, in words.
    pub reason: String,
}

impl ConfigError {
    /// Refuses `line` (kept only as [`printable_line`] shows it).
    pub(super) fn new(errno: i32, line: &str, reason: impl Into<String>) -> Self {
        ConfigError { errno, line: printable_line(line), reason: reason.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.line, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// The protocol's keys whose values are never secret: a refused line with one of them is shown whole.
const PLAIN_KEYS: &[&str] = &[
    "listen_port",
    "fwmark",
    "replace_peers",
    "public_key",
    "update_only",
    "remove",
    "endpoint",
    "persistent_keepalive_interval",
    "replace_allowed_ips",
    "allowed_ip",
    "protocol_version",
];

/// A request line as it may go into a log or an error: whole if its key is one whose value is never secret,
/// otherwise its key name alone (`private_key=`, `preshared_key=`, any key the protocol does not have, in either
/// section), and nothing of a line without `=` (a key pasted on a line of its own).
pub(crate) fn printable_line(line: &str) -> String {
    match line.split_once('=') {
        Some((key, _)) if PLAIN_KEYS.contains(&key) => line.to_string(),
        Some((key, value)) => {
            // A name of the protocol's shape is shown; anything else might be key material itself.
            let name_like =
                !key.is_empty() && key.len() <= 32 && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
            let key = if name_like { key } else { "(a key name not shown)" };
            format!("{key}=(value of {} bytes not shown)", value.len())
        }
        None => format!("(a line of {} bytes without '=', not shown)", line.len()),
    }
}

/// A prefix `ADDR/LEN` with its host bits cleared.
pub(crate) fn parse_prefix(text: &str) -> Option<(IpAddr, u8)> {
    let net = ip_network::IpNetwork::from_str_truncate(text).ok()?;
    Some((net.network_address(), net.netmask()))
}

/// An endpoint as `wg` sends it: `ADDR:PORT`, `[ADDR]:PORT`, or `[ADDR%SCOPE]:PORT` for an IPv6 address with a
/// scope (a link-local one), the scope an interface index or name (`wg` writes the name when it has one); a
/// name is looked up in this network namespace.
pub(crate) fn parse_endpoint(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr); // including a numeric scope
    }
    let bad = || format!("endpoint: {text:?} is not ADDR:PORT, [ADDR]:PORT or [ADDR%SCOPE]:PORT");
    let (host, port) = text.strip_prefix('[').and_then(|rest| rest.rsplit_once("]:")).ok_or_else(bad)?;
    let (addr, scope) = host.split_once('%').ok_or_else(bad)?;
    let addr: Ipv6Addr = addr.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let index = interface_index(scope).map_err(|why| format!("endpoint {text:?}: scope {scope:?}: {why}"))?;
    Ok(SocketAddrV6::new(addr, port, 0, index).into())
}

/// The index of the interface named `name` in this network namespace.
fn interface_index(name: &str) -> Result<u32, String> {
    use rustix::net::{netdevice::name_to_index, socket, AddressFamily, SocketType};
    if name.is_empty() || name.len() > 15 || name.contains(['\0', '/']) || name.contains(char::is_whitespace) {
        return Err("not an interface name or index".into());
    }
    let socket =
        socket(AddressFamily::UNIX, SocketType::DGRAM, None).map_err(|e| format!("cannot look interfaces up: {e}"))?;
    name_to_index(&socket, name).map_err(|e| match e {
        rustix::io::Errno::NODEV => "no interface of that name in this network namespace".to_string(),
        e => format!("cannot look the interface up: {e}"),
    })
}

/// Where a peer section's lines go.
enum Section {
    /// Device lines (before the first `public_key`).
    Device,
    /// The peer with this key, present in the draft.
    Peer(Key),
    /// A peer whose lines are read and dropped: our own key, or `update_only` for a peer that does not exist.
    Ignored,
    /// A peer that does not exist yet: created by its first line other than `update_only`.
    New(Key),
}

/// A configuration being changed by one request: what the request changed, over the configuration in force
/// (`base`), which stays as it is until the whole request was understood. Each line costs what it changes,
/// however many peers there are: peers are found by key and prefixes by value in maps.
struct Draft<'a> {
    base: &'a ConfigView<'a>,
    /// The device's settings.
    config: DeviceConfig,
    /// `replace_peers` came: no peer of `base` is left.
    replaced: bool,
    /// Each peer the request touched, as it leaves it (`None`: removed), and the order they were touched in.
    peers: HashMap<Key, Option<PeerConfig>>,
    touched: Vec<Key>,
    /// Each prefix whose holder the request changed (`None`: nobody holds it now).
    owners: HashMap<(IpAddr, u8), Option<Key>>,
    /// How many peers there are, and may be at most.
    count: usize,
    limit: usize,
}

impl<'a> Draft<'a> {
    fn new(base: &'a ConfigView<'a>, limit: usize) -> Draft<'a> {
        Draft {
            base,
            config: base.device.clone(),
            replaced: false,
            peers: HashMap::new(),
            touched: Vec::new(),
            owners: HashMap::new(),
            count: base.peers.len(),
            limit,
        }
    }

    fn finish(mut self) -> ConfigChange {
        let peers = self.touched.iter().map(|key| (*key, self.peers.remove(key).flatten())).collect();
        ConfigChange { device: self.config, replace_peers: self.replaced, peers }
    }

    fn exists(&self, key: &Key) -> bool {
        match self.peers.get(key) {
            Some(peer) => peer.is_some(),
            None => !self.replaced && self.base.peers.config(key).is_some(),
        }
    }

    fn set(&mut self, key: Key, peer: Option<PeerConfig>) {
        if self.peers.insert(key, peer).is_none() {
            self.touched.push(key);
        }
    }

    /// The peer with `key`, which exists: taken into the draft at its first change.
    fn peer(&mut self, key: &Key) -> &mut PeerConfig {
        if !self.peers.contains_key(key) {
            let base = if self.replaced { None } else { self.base.peers.config(key).cloned() };
            self.set(*key, base);
        }
        self.peers.get_mut(key).and_then(Option::as_mut).expect("a section's peer exists")
    }

    /// The key of the peer holding `prefix`.
    fn owner(&self, prefix: (IpAddr, u8)) -> Option<Key> {
        match self.owners.get(&prefix) {
            Some(owner) => *owner,
            None if self.replaced => None,
            None => self.base.owner(prefix),
        }
    }

    /// Adds a peer; `None` if the device holds as many as it may.
    fn add(&mut self, public: Key) -> Option<Key> {
        if self.count >= self.limit {
            return None;
        }
        self.count += 1;
        self.set(public, Some(PeerConfig::new(public)));
        Some(public)
    }

    /// Takes the peer with `key` out, with its prefixes.
    fn remove(&mut self, key: &Key) {
        for prefix in std::mem::take(&mut self.peer(key).allowed_ips) {
            self.owners.insert(prefix, None);
        }
        self.set(*key, None);
        self.count -= 1;
    }

    fn remove_all(&mut self) {
        self.replaced = true;
        self.peers.clear();
        self.touched.clear();
        self.owners.clear();
        self.count = 0;
    }

    /// Gives `prefix` to the peer with `key`, taking it from whichever peer held it.
    fn give_prefix(&mut self, key: &Key, prefix: (IpAddr, u8)) {
        match self.owner(prefix) {
            Some(holder) if holder == *key => return,
            Some(holder) => self.peer(&holder).allowed_ips.retain(|p| *p != prefix),
            None => {}
        }
        self.owners.insert(prefix, Some(*key));
        self.peer(key).allowed_ips.push(prefix);
    }

    /// Takes `prefix` from the peer with `key` if it holds it: a prefix another peer holds stays with it (the
    /// kernel removes a prefix only from the peer named).
    fn take_prefix(&mut self, key: &Key, prefix: (IpAddr, u8)) {
        if self.owner(prefix) == Some(*key) {
            self.owners.insert(prefix, None);
            self.peer(key).allowed_ips.retain(|p| *p != prefix);
        }
    }

    fn clear_prefixes(&mut self, key: &Key) {
        for prefix in std::mem::take(&mut self.peer(key).allowed_ips) {
            self.owners.insert(prefix, None);
        }
    }
}

/// One `set=1` request being applied, a line at a time as it arrives, to a draft over the configuration in
/// force, which it changes only once the whole request was understood ([`SetRequest::finish`] gives the
/// change, `WireGuard::apply_change` puts it in force).
///
/// As in the kernel: a peer section with the public key of the private key in force at that line is ignored
/// (a new private key first removes the peer with its public key), and an allowed prefix given to a peer is
/// taken from whichever peer had it. What the request holds is bounded by what it changes, not by its length:
/// a line changes the draft and is gone.
pub(crate) struct SetRequest<'a, F> {
    new: Draft<'a>,
    section: Section,
    /// The public key of a private key.
    own_public: F,
    /// The public key of the private key in force at this line (computed once a key, not once a line: it
    /// costs an X25519).
    own: Option<Key>,
}

impl<'a, F: Fn(&Key) -> Key> SetRequest<'a, F> {
    /// A request on the configuration `base`, for a device of at most `max_peers` peers.
    pub(crate) fn new(base: &'a ConfigView<'a>, max_peers: usize, own_public: F) -> Self {
        let own = base.device.private_key.as_ref().map(|k| own_public(k.as_bytes()));
        SetRequest { new: Draft::new(base, max_peers), section: Section::Device, own_public, own }
    }

    /// The request's next line; an error refuses the whole request.
    pub(crate) fn line(&mut self, line: &str) -> Result<(), ConfigError> {
        let op = parse_line(line).map_err(|(errno, reason)| ConfigError::new(errno, line, reason))?;
        self.op(op).map_err(|(errno, reason)| ConfigError::new(errno, line, reason))
    }

    /// Applies the operations of a typed update, in order.
    pub(crate) fn update(&mut self, update: crate::update::Update) -> Result<(), ConfigError> {
        for op in update.into_ops() {
            let shown = op.to_string();
            self.op(op).map_err(|(errno, reason)| ConfigError { errno, line: shown, reason })?;
        }
        Ok(())
    }

    /// The request's next operation; an error (its errno and why) refuses the whole request.
    fn op(&mut self, op: Op) -> Result<(), (i32, String)> {
        let limit = self.new.limit;
        let full = || (libc::ENOMEM, full_reason(limit));
        let new = &mut self.new;
        if let Op::Peer(public) = op {
            if let Section::New(previous) = self.section {
                // The section before was its public key alone (`wg set wg0 peer A peer B ...`): that creates it.
                new.add(previous).ok_or_else(full)?;
            }
            self.section = if self.own == Some(public) {
                Section::Ignored
            } else if new.exists(&public) {
                Section::Peer(public)
            } else {
                Section::New(public)
            };
            return Ok(());
        }
        // A new peer's first line other than update_only creates it.
        if let Section::New(public) = self.section {
            if op != Op::UpdateOnly {
                self.section = Section::Peer(new.add(public).ok_or_else(full)?);
            }
        }
        match self.section {
            Section::Device => match op {
                Op::PrivateKey(private) => {
                    new.config.private_key = match private.filter(|k| !k.is_zero()) {
                        None => {
                            self.own = None;
                            None
                        }
                        Some(private) => {
                            let private = private.clamped();
                            // The peer with our new public key goes.
                            let own = (self.own_public)(private.as_bytes());
                            if new.exists(&own) {
                                new.remove(&own);
                            }
                            self.own = Some(own);
                            Some(private)
                        }
                    };
                }
                Op::ListenPort(port) => new.config.listen_port = port,
                Op::Fwmark(mark) => new.config.fwmark = mark,
                Op::ReplacePeers => new.remove_all(),
                _ => return Err((libc::EINVAL, "not a device key".into())),
            },
            Section::Ignored => {}
            // update_only, the only line that leaves a new peer uncreated.
            Section::New(_) => self.section = Section::Ignored,
            Section::Peer(peer) => {
                let remove = op == Op::Remove;
                apply_peer_op(new, &peer, op).map_err(|reason| (libc::EINVAL, reason))?;
                if remove {
                    self.section = Section::Ignored;
                }
            }
        }
        Ok(())
    }

    /// The change the whole request makes.
    pub(crate) fn finish(mut self) -> Result<ConfigChange, ConfigError> {
        if let Section::New(public) = self.section {
            // A peer section of only its public key creates the peer.
            if self.new.add(public).is_none() {
                return Err(ConfigError::new(libc::ENOMEM, "(the end of the request)", full_reason(self.new.limit)));
            }
        }
        Ok(self.new.finish())
    }
}

/// Why a peer cannot be added to a device holding `limit`.
fn full_reason(limit: usize) -> String {
    format!("the device holds {limit} peers, the most it may (the kernel's limit is {MAX_PEERS})")
}

/// A request line as the operation it asks for; why not (its errno and the reason) if it asks for none.
fn parse_line(line: &str) -> Result<Op, (i32, String)> {
    let Some((key, value)) = line.split_once('=') else {
        return Err((libc::EPROTO, "not a key=value line".into()));
    };
    let bad = |reason: &str| (libc::EINVAL, reason.to_string());
    let only_true = |op: Op| if value == "true" { Ok(op) } else { Err(bad(&format!("{key} takes only true"))) };
    let secret = |what: &str| SecretKey::from_hex(value).ok_or_else(|| bad(&format!("{what}: not 64 hex digits")));
    Ok(match key {
        "public_key" => Op::Peer(key_from_hex(value).ok_or_else(|| bad("public_key: not 64 hex digits"))?),
        "private_key" => Op::PrivateKey(Some(secret("private_key")?)),
        "listen_port" => Op::ListenPort(value.parse().map_err(|_| bad("listen_port: not a port"))?),
        "fwmark" => Op::Fwmark(value.parse().map_err(|_| bad("fwmark: not a 32-bit number"))?),
        "replace_peers" => only_true(Op::ReplacePeers)?,
        "update_only" => only_true(Op::UpdateOnly)?,
        "remove" => only_true(Op::Remove)?,
        "preshared_key" => Op::PresharedKey(Some(secret("preshared_key")?).filter(|k| !k.is_zero())),
        "endpoint" => Op::Endpoint(parse_endpoint(value).map_err(|reason| bad(&reason))?),
        "persistent_keepalive_interval" => {
            Op::PersistentKeepalive(value.parse().map_err(|_| bad("persistent_keepalive_interval: not 0 to 65535"))?)
        }
        "replace_allowed_ips" => only_true(Op::ReplaceAllowedIps)?,
        "allowed_ip" => {
            let (remove, text) = match value.strip_prefix('-') {
                Some(rest) => (true, rest),
                None => (false, value),
            };
            let (addr, len) =
                parse_prefix(text).ok_or_else(|| bad(&format!("allowed_ip: {text:?} is not ADDR/PREFIX")))?;
            let prefix = Prefix::new(addr, len);
            if remove {
                Op::RemoveAllowedIp(prefix)
            } else {
                Op::AllowedIp(prefix)
            }
        }
        "protocol_version" if value == "1" => Op::ProtocolVersion,
        "protocol_version" => return Err(bad("protocol_version: only 1 exists")),
        _ => return Err(bad("not a device or peer key")),
    })
}

/// Applies the lines of one `set=1` request (without the `set=1` line and the empty line that ends it) to
/// `config`, through [`SetRequest`] and a device of at most `max_peers` peers put in that configuration first:
/// the configuration the request makes, or why it is refused.
#[cfg(test)]
pub(crate) fn apply_set(
    config: &DeviceConfig,
    lines: &[&str],
    max_peers: usize,
    own_public: impl Fn(&Key) -> Key,
) -> Result<DeviceConfig, ConfigError> {
    let wg = crate::wireguard::WireGuard::new();
    wg.apply(config.clone());
    let view = wg.config_view();
    let mut request = SetRequest::new(&view, max_peers, own_public);
    for line in lines {
        request.line(line)?;
    }
    let change = request.finish()?;
    drop(view);
    wg.apply_change(change);
    Ok(wg.config())
}

/// One peer operation on the peer with key `peer` in the draft (`remove` takes the peer out).
fn apply_peer_op(draft: &mut Draft<'_>, peer: &Key, op: Op) -> Result<(), String> {
    match op {
        Op::UpdateOnly | Op::ProtocolVersion => {}
        Op::Remove => draft.remove(peer),
        Op::PresharedKey(psk) => draft.peer(peer).preshared_key = psk.filter(|k| !k.is_zero()),
        Op::Endpoint(endpoint) => draft.peer(peer).endpoint = Some(endpoint),
        Op::PersistentKeepalive(seconds) => draft.peer(peer).persistent_keepalive = seconds,
        Op::ReplaceAllowedIps => draft.clear_prefixes(peer),
        Op::AllowedIp(prefix) => draft.give_prefix(peer, prefix_of(prefix)?),
        Op::RemoveAllowedIp(prefix) => draft.take_prefix(peer, prefix_of(prefix)?),
        _ => return Err("not a peer key".into()),
    }
    Ok(())
}

/// A typed prefix as the draft holds it: host bits cleared; refused if its length is past its address's.
fn prefix_of(prefix: Prefix) -> Result<(IpAddr, u8), String> {
    let net = ip_network::IpNetwork::new_truncate(prefix.addr, prefix.len)
        .map_err(|_| format!("allowed_ip: {prefix} is not ADDR/PREFIX"))?;
    Ok((net.network_address(), net.netmask()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::key_to_hex;

    fn k(b: u8) -> Key {
        [b; 32]
    }

    fn clamp(key: Key) -> Key {
        *SecretKey::new(key).clamped().as_bytes()
    }

    fn own(private: &Key) -> Key {
        // A stand-in for the Curve25519 base-point multiplication: any fixed function will do for these tests.
        let mut p = *private;
        p[0] ^= 0xff;
        p
    }

    fn set(config: &DeviceConfig, lines: &[&str]) -> Result<DeviceConfig, ConfigError> {
        apply_set(config, lines, MAX_PEERS, own)
    }

    /// [`set`] with owned lines.
    fn set_lines(config: &DeviceConfig, lines: &[String]) -> Result<DeviceConfig, ConfigError> {
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        set(config, &lines)
    }

    fn peer(key: Key) -> String {
        format!("public_key={}", key_to_hex(&key))
    }

    fn prefix(text: &str) -> (IpAddr, u8) {
        parse_prefix(text).unwrap()
    }

    /// The prefixes of the peer with `key` (none if it does not exist).
    fn prefixes_of(c: &DeviceConfig, key: Key) -> Vec<(IpAddr, u8)> {
        c.peers.iter().find(|p| p.public_key == key).map(|p| p.allowed_ips.clone()).unwrap_or_default()
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
        let c = set_lines(&DeviceConfig::default(), &lines).unwrap();
        assert_eq!(
            (c.private_key.as_ref().map(SecretKey::as_bytes), c.listen_port, c.fwmark),
            (Some(&clamp(k(9))), 51820, 0)
        );
        assert_eq!(c.peers.len(), 2);
        let p = &c.peers[0];
        assert_eq!((p.preshared_key.clone(), p.persistent_keepalive), (Some(SecretKey::new(k(7))), 25));
        assert_eq!(p.endpoint, Some("192.0.2.1:51820".parse().unwrap()));
        assert_eq!(p.allowed_ips, vec![prefix("10.0.0.0/24"), prefix("fd00::/64")]);
        assert_eq!(c.peers[1].endpoint, Some("[2001:db8::1]:1234".parse().unwrap()));
        // addconf-style: no replace, a new allowed IP added to an existing peer, one removed with `-`.
        let more = [format!("public_key={peer1}"), "allowed_ip=10.1.0.0/16".into(), "allowed_ip=-fd00::/64".into()];
        let c2 = set_lines(&c, &more).unwrap();
        assert_eq!(c2.peers[0].allowed_ips, vec![prefix("10.0.0.0/24"), prefix("10.1.0.0/16")]);
        // remove, and update_only for a peer that does not exist (nothing created).
        let rm = [
            format!("public_key={peer2}"),
            "remove=true".into(),
            format!("public_key={}", key_to_hex(&k(3))),
            "update_only=true".into(),
            "endpoint=192.0.2.9:1".into(),
        ];
        let c3 = set_lines(&c2, &rm).unwrap();
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
            assert_eq!((err.errno, err.line.as_str()), (errno, printable_line(bad).as_str()), "{err}");
        }
        let peer = peer(k(1));
        for bad in [
            "allowed_ip=10.0.0.0/33",
            "allowed_ip=nonsense",
            "endpoint=10.0.0.1",
            "protocol_version=2",
            "persistent_keepalive_interval=-1",
            "private_key=00",
        ] {
            let err = set(&start, &[peer.as_str(), bad]).unwrap_err();
            assert_eq!(err.line, printable_line(bad));
        }
        assert_eq!(set(&start, &["public_key=xyz"]).unwrap_err().errno, libc::EINVAL);
    }

    #[test]
    fn test_a_peer_section_of_its_public_key_alone_creates_the_peer() {
        // `wg set wg0 peer A peer B allowed-ips ...` sends A's section with no line but its key.
        let lines = [peer(k(1)), peer(k(2)), "allowed_ip=10.2.0.0/16".into(), peer(k(3))];
        let c = set_lines(&DeviceConfig::default(), &lines).unwrap();
        assert_eq!(c.peers.iter().map(|p| p.public_key).collect::<Vec<_>>(), vec![k(1), k(2), k(3)]);
        // The same key twice in a row is one peer.
        let c = set_lines(&DeviceConfig::default(), &[peer(k(1)), peer(k(1))]).unwrap();
        assert_eq!(c.peers.len(), 1);
    }

    #[test]
    fn test_a_peer_removed_and_added_again_is_a_new_peer() {
        let c = set_lines(&DeviceConfig::default(), &[peer(k(1)), "endpoint=192.0.2.1:1".into()]).unwrap();
        let first = c.peers[0].incarnation;
        let c = set_lines(&c, &[peer(k(1)), "persistent_keepalive_interval=5".into()]).unwrap();
        assert_eq!(c.peers[0].incarnation, first, "an update keeps the peer");
        let c = set_lines(&c, &["replace_peers=true".into(), peer(k(1))]).unwrap();
        assert_ne!(c.peers[0].incarnation, first, "replace_peers makes it anew");
        assert_eq!((c.peers[0].endpoint, c.peers[0].persistent_keepalive), (None, 0));
        let again = c.peers[0].incarnation;
        let c = set_lines(&c, &[peer(k(1)), "remove=true".into(), peer(k(1))]).unwrap();
        assert_ne!(c.peers[0].incarnation, again, "so does remove");
    }

    #[test]
    fn test_our_own_public_key_as_a_peer_is_ignored() {
        let c = set(&DeviceConfig::default(), &[&format!("private_key={}", key_to_hex(&k(5)))]).unwrap();
        let me = peer(own(&clamp(k(5))));
        let c = set(&c, &[me.as_str(), "allowed_ip=10.0.0.0/8"]).unwrap();
        assert!(c.peers.is_empty());
    }

    #[test]
    fn test_a_new_private_key_removes_the_peer_with_its_public_key() {
        // Peers 1 and 2 exist; the private key becomes one whose public key is peer 2's.
        let lines =
            [peer(k(1)), "allowed_ip=10.1.0.0/16".into(), peer(own(&clamp(k(7)))), "allowed_ip=10.2.0.0/16".into()];
        let c = set_lines(&DeviceConfig::default(), &lines).unwrap();
        assert_eq!(c.peers.len(), 2);
        let c = set_lines(&c, &[format!("private_key={}", key_to_hex(&k(7)))]).unwrap();
        assert_eq!(c.peers.iter().map(|p| p.public_key).collect::<Vec<_>>(), vec![k(1)], "peer 2 removed");
        // In one request, as `wg setconf` sends it: the key first, then the peer that is now ourselves.
        let lines = [
            format!("private_key={}", key_to_hex(&k(7))),
            "replace_peers=true".into(),
            peer(own(&clamp(k(7)))),
            "allowed_ip=10.3.0.0/16".into(),
            peer(k(1)),
        ];
        let c = set_lines(&DeviceConfig::default(), &lines).unwrap();
        assert_eq!(c.peers.iter().map(|p| p.public_key).collect::<Vec<_>>(), vec![k(1)]);
    }

    #[test]
    fn test_the_private_key_is_stored_clamped_and_zero_is_none() {
        let unclamped = k(0xff);
        let c = set_lines(&DeviceConfig::default(), &[format!("private_key={}", key_to_hex(&unclamped))]).unwrap();
        let stored = *c.private_key.as_ref().unwrap().as_bytes();
        assert_eq!((stored[0], stored[31]), (0xf8, 0x7f));
        assert_eq!(stored[1..31], unclamped[1..31]);
        let c = set_lines(&c, &[format!("private_key={}", key_to_hex(&[0; 32]))]).unwrap();
        assert_eq!(c.private_key, None);
    }

    #[test]
    fn test_the_last_assignment_of_a_prefix_wins() {
        let shared = "allowed_ip=10.9.0.0/24";
        // wg set wg0 peer A allowed-ips 10.9.0.0/24; ... peer B ...; ... peer A ... (each replaces the peer's list).
        let mut c = DeviceConfig::default();
        for who in [k(0xa), k(0xb), k(0xa)] {
            c = set_lines(&c, &[peer(who), "replace_allowed_ips=true".into(), shared.into()]).unwrap();
        }
        assert_eq!(prefixes_of(&c, k(0xa)), vec![prefix("10.9.0.0/24")], "A was given it last");
        assert_eq!(prefixes_of(&c, k(0xb)), vec![], "B lost it");
        // Within one request (setconf), the later line wins; a prefix with host bits is the same prefix.
        let lines = [
            "replace_peers=true".to_string(),
            peer(k(0xb)),
            "allowed_ip=10.9.0.0/24".into(),
            "allowed_ip=10.8.0.0/16".into(),
            peer(k(0xa)),
            "allowed_ip=10.9.0.77/24".into(),
            peer(k(0xb)),
            "allowed_ip=10.8.0.0/16".into(),
        ];
        let c = set_lines(&c, &lines).unwrap();
        assert_eq!(prefixes_of(&c, k(0xa)), vec![prefix("10.9.0.0/24")]);
        assert_eq!(prefixes_of(&c, k(0xb)), vec![prefix("10.8.0.0/16")]);
        // Removing a prefix from a peer that does not hold it leaves its holder alone; from its holder, removes it.
        let c = set_lines(&c, &[peer(k(0xb)), "allowed_ip=-10.9.0.0/24".into()]).unwrap();
        assert_eq!(prefixes_of(&c, k(0xa)), vec![prefix("10.9.0.0/24")]);
        let c = set_lines(&c, &[peer(k(0xa)), "allowed_ip=-10.9.0.0/24".into()]).unwrap();
        assert_eq!(prefixes_of(&c, k(0xa)), vec![]);
        // A removed peer's prefixes go with it: they do not return to an earlier holder.
        let c = set_lines(&c, &[peer(k(0xa)), "allowed_ip=10.8.0.0/16".into(), peer(k(0xa)), "remove=true".into()])
            .unwrap();
        assert!(c.peers.iter().all(|p| p.allowed_ips.is_empty()), "{c:?}");
    }

    /// The device's peer limit (the kernel's, `MAX_PEERS`, made 3 here): a request that would make one more peer
    /// is refused with `ENOMEM` and changes nothing, whichever line would add it; peers removed first make room.
    #[test]
    fn test_no_request_makes_more_peers_than_the_limit() {
        let limited = |config: &DeviceConfig, lines: &[String]| {
            let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
            apply_set(config, &lines, 3, own)
        };
        let three = limited(&DeviceConfig::default(), &[peer(k(1)), peer(k(2)), peer(k(3))]).unwrap();
        for fourth in [
            vec![peer(k(4)), "allowed_ip=10.0.0.0/8".into()],
            vec![peer(k(4))],
            vec![peer(k(4)), peer(k(1)), "endpoint=192.0.2.1:1".into()],
        ] {
            let err = limited(&three, &fourth).unwrap_err();
            assert_eq!(err.errno, libc::ENOMEM, "{fourth:?}: {err}");
            assert!(err.reason.contains("3 peers"), "{err}");
        }
        // update_only for a peer that does not exist adds nothing, and so is no fourth peer.
        assert!(limited(&three, &[peer(k(4)), "update_only=true".into()]).is_ok());
        let room = [peer(k(2)), "remove=true".into(), peer(k(4)), "allowed_ip=10.4.0.0/16".into()];
        let c = limited(&three, &room).unwrap();
        assert_eq!(c.peers.iter().map(|p| p.public_key).collect::<Vec<_>>(), [k(1), k(3), k(4)]);
        let replaced = ["replace_peers=true".into(), peer(k(7)), peer(k(8)), peer(k(9))];
        assert_eq!(limited(&c, &replaced).unwrap().peers.len(), 3);
    }

    #[test]
    fn test_debug_shows_no_secret_key() {
        let (private, psk) = ([0x42u8; 32], [0x17u8; 32]);
        let lines = [
            format!("private_key={}", key_to_hex(&private)),
            peer(k(1)),
            format!("preshared_key={}", key_to_hex(&psk)),
        ];
        let c = set_lines(&DeviceConfig::default(), &lines).unwrap();
        let shown = format!("{c:?} {c:#?} {:?}", c.peers[0]);
        for secret in [clamp(private), psk] {
            assert!(!shown.contains(&key_to_hex(&secret)), "{shown}");
            assert!(!shown.contains(&format!("{secret:?}")), "{shown}");
            assert!(!shown.contains(&format!("{:?}", &secret[..8]).trim_end_matches(']').to_string()), "{shown}");
        }
        assert!(shown.contains("SecretKey(redacted)"), "{shown}");
    }

    #[test]
    fn test_a_refused_line_never_shows_a_key() {
        let secret = key_to_hex(&[0x5a; 32]);
        for (lines, why) in [
            (vec![peer(k(1)), format!("private_key={secret}")], "a private key in a peer section"),
            (vec![format!("private_key={secret}0")], "a private key one digit too long"),
            (vec![peer(k(1)), format!("preshared_key={secret}x")], "a preshared key that does not parse"),
            (vec![secret.clone()], "a key on a line of its own"),
            (vec![format!("{secret}=1")], "a key as a line's key"),
            (vec![format!("presharedkey={secret}")], "a misspelt key"),
        ] {
            let err = set_lines(&DeviceConfig::default(), &lines).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains(&secret[..16]), "{why}: {shown}");
        }
        // Lines that carry no secret are shown whole.
        let err = set(&DeviceConfig::default(), &["listen_port=nope"]).unwrap_err();
        assert_eq!(err.line, "listen_port=nope");
    }

    #[test]
    fn test_an_endpoint_with_a_scope_by_name_or_number() {
        let lo: u32 = std::fs::read_to_string("/sys/class/net/lo/ifindex").unwrap().trim().parse().unwrap();
        for text in ["[fe80::1%lo]:51820".to_string(), format!("[fe80::1%{lo}]:51820")] {
            let SocketAddr::V6(addr) = parse_endpoint(&text).unwrap() else { panic!("{text}: not IPv6") };
            assert_eq!((addr.ip(), addr.port(), addr.scope_id()), (&"fe80::1".parse::<Ipv6Addr>().unwrap(), 51820, lo));
            // What `get` writes (the index) reads back the same.
            assert_eq!(parse_endpoint(&SocketAddr::V6(addr).to_string()), Ok(SocketAddr::V6(addr)));
        }
        let lines = [peer(k(1)), "endpoint=[fe80::1%nosuchif0]:51820".into()];
        let err = set_lines(&DeviceConfig::default(), &lines).unwrap_err();
        assert_eq!(err.errno, libc::EINVAL);
        assert!(err.reason.contains("no interface of that name"), "{err}");
        for bad in ["[fe80::1%]:1", "[fe80::1%a/b]:1", "10.0.0.1%lo:1", "[fe80::1%lo]", "[fe80::1%lo]:70000"] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }
}
