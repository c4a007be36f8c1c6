//! Configuring and watching a running device through typed calls: [`Control`], which an
//! [`Endpoint`](crate::Endpoint) and a [`Protocol`](crate::Protocol) both hand out.
//!
//! Every change, whoever asks for it (a typed [`Update`], a `set=1` request on the configuration socket), goes
//! through one [`Configurator`]: one change at a time, built on a draft of the configuration in force, checked
//! by the endpoint (a new port must bind) and put in force whole, or refused whole.

use std::sync::{Arc, Mutex};

use crate::config::{DeviceConfig, Key, PeerConfig};
use crate::events::Events;
use crate::uapi::set::{ConfigError, SetRequest, MAX_PEERS};
use crate::update::Update;
use crate::wireguard::{PeerState, WireGuard};

/// What checks the device's new settings (`old`, `new`: its port, mark and key, without its peers) before a
/// change takes effect, and may refuse them with an errno and why (a port that cannot be bound). It runs for one
/// change at a time.
pub(crate) type OnSet = dyn FnMut(&DeviceConfig, &DeviceConfig) -> Result<(), (i32, String)> + Send;

/// A change request as it is filled: by the operations of an [`Update`], or by the lines of a `set=1` request.
pub(crate) type Request<'a> = SetRequest<'a, fn(&Key) -> Key>;

/// How filling a request ended.
pub(crate) enum Filled {
    /// Every operation was taken: put it in force if the endpoint agrees.
    Apply,
    /// This operation was refused: nothing changes.
    Refuse(ConfigError),
    /// The request went away unfinished (a client that hung up): nothing changes, nothing is answered.
    Abandon,
}

/// The one way a device's configuration changes.
pub(crate) struct Configurator {
    pub(crate) wg: Arc<WireGuard>,
    /// Held for the whole of one change.
    on_set: Mutex<Box<OnSet>>,
}

impl Configurator {
    pub(crate) fn new(wg: Arc<WireGuard>, on_set: Box<OnSet>) -> Self {
        Configurator { wg, on_set: Mutex::new(on_set) }
    }

    /// Fills a request with `fill` over the configuration in force, then puts it in force if `on_set` agrees:
    /// `None` if `fill` abandoned it, otherwise whether it was put in force.
    pub(crate) fn change(&self, fill: impl FnOnce(&mut Request<'_>) -> Filled) -> Option<Result<(), ConfigError>> {
        let mut on_set = self.on_set.lock().unwrap_or_else(|e| e.into_inner());
        // Read by the request as it goes; nothing else changes the configuration while the lock is held.
        let view = self.wg.config_view();
        let old = view.device.clone();
        let own_public: fn(&Key) -> Key = crate::wireguard::public_key;
        let mut request = SetRequest::new(&view, MAX_PEERS, own_public);
        let change = match fill(&mut request) {
            Filled::Abandon => return None,
            Filled::Refuse(refusal) => Err(refusal),
            Filled::Apply => request.finish(),
        };
        drop(view);
        let result = change.and_then(|change| match on_set(&old, &change.device) {
            Ok(()) => Ok(change),
            Err((errno, why)) => {
                let new = &change.device;
                // The setting refused: what the endpoint checks is the port and the mark.
                let line = match (new.listen_port != old.listen_port, new.fwmark != old.fwmark) {
                    (true, _) => format!("listen_port={}", new.listen_port),
                    (false, true) => format!("fwmark={}", new.fwmark),
                    (false, false) => String::new(),
                };
                Err(ConfigError { errno, line, reason: format!("the new settings cannot be put in force: {why}") })
            }
        });
        Some(match result {
            Ok(change) => {
                self.wg.apply_change(change);
                Ok(())
            }
            Err(e) => {
                tracing::warn!("configuration refused, nothing changed: {e}");
                Err(e)
            }
        })
    }
}

/// One peer as [`Control::peers`] reports it: its configuration and what its sessions know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    /// What was configured (its endpoint the configured one; [`PeerState::endpoint`] is where it is now).
    pub config: PeerConfig,
    /// Its state now.
    pub state: PeerState,
}

/// Configures and watches one device while it runs; cheap to clone, usable from any thread.
///
/// ```
/// use turbotun_wg::{PeerUpdate, Protocol, Update};
/// let protocol = Protocol::new();
/// let control = protocol.control();
/// let peer = [7u8; 32];
/// control
///     .configure(Update::new().private_key([1; 32]).peer(PeerUpdate::new(peer).allowed_ip("10.0.0.2/32".parse()?)))
///     .unwrap();
/// assert_eq!(control.peers()[0].config.allowed_ips, vec![("10.0.0.2".parse()?, 32)]);
/// control.configure(Update::new().remove_peer(peer)).unwrap();
/// assert!(control.peers().is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Control {
    pub(crate) configurator: Arc<Configurator>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").field("device", &self.configurator.wg).finish()
    }
}

impl Control {
    pub(crate) fn new(configurator: Arc<Configurator>) -> Self {
        Control { configurator }
    }

    pub(crate) fn wg(&self) -> &Arc<WireGuard> {
        &self.configurator.wg
    }

    /// Puts `update` in force, whole, or refuses it whole with the operation that could not be applied (the
    /// meaning of a `set=1` request of WireGuard's userspace interface; see [`Update`]).
    pub fn configure(&self, update: Update) -> Result<(), ConfigError> {
        self.configurator
            .change(|request| match request.update(update) {
                Ok(()) => Filled::Apply,
                Err(refusal) => Filled::Refuse(refusal),
            })
            .unwrap_or(Ok(()))
    }

    /// The configuration in force, the peers in the order they were added (the private key included: handle it
    /// as the secret it is).
    pub fn config(&self) -> DeviceConfig {
        self.wg().config()
    }

    /// The device's public key, once it has a private key.
    pub fn public_key(&self) -> Option<Key> {
        self.wg().device_config().private_key.map(|k| crate::wireguard::public_key(k.as_bytes()))
    }

    /// The UDP port the device's sockets are bound to (0 for a [`Protocol`](crate::Protocol): its host binds).
    pub fn listen_port(&self) -> u16 {
        self.wg().bound_port()
    }

    /// Each peer's configuration and state, in the order they were added, read at one instant.
    pub fn peers(&self) -> Vec<PeerStatus> {
        self.wg().peers_with_state().into_iter().map(|(config, state)| PeerStatus { config, state }).collect()
    }

    /// The peer with public key `key`, if there is one.
    pub fn peer(&self, key: &Key) -> Option<PeerStatus> {
        self.wg().peer_with_state(key).map(|(config, state)| PeerStatus { config, state })
    }

    /// A subscription to what happens to the peers from now on (see [`Event`](crate::Event)).
    pub fn subscribe(&self) -> Events {
        self.wg().events.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::key_to_hex;
    use crate::update::{Op, PeerUpdate, Prefix};

    fn control() -> Control {
        Control::new(Arc::new(Configurator::new(Arc::new(WireGuard::new()), Box::new(|_, _| Ok(())))))
    }

    fn prefix(text: &str) -> Prefix {
        text.parse().unwrap()
    }

    /// A `set=1` request's lines through the same configurator, as the configuration socket sends them.
    fn set_lines(control: &Control, lines: &[String]) -> Result<(), ConfigError> {
        control
            .configurator
            .change(|request| match lines.iter().try_for_each(|line| request.line(line)) {
                Ok(()) => Filled::Apply,
                Err(e) => Filled::Refuse(e),
            })
            .unwrap()
    }

    #[test]
    fn a_typed_update_and_the_request_it_stands_for_make_the_same_configuration() {
        let (a, b, c) = ([10; 32], [11; 32], [12; 32]);
        let endpoint = "192.0.2.7:51820".parse().unwrap();
        let first = Update::new()
            .private_key([1; 32])
            .listen_port(51820)
            .peer(PeerUpdate::new(a).endpoint(endpoint).allowed_ip(prefix("10.0.0.0/24")).persistent_keepalive(25))
            .peer(PeerUpdate::new(b).allowed_ip(prefix("10.0.0.0/24")).allowed_ip(prefix("fd00::/64")))
            .peer(PeerUpdate::new(c).update_only().allowed_ip(prefix("10.9.0.0/16")));
        let second = Update::new()
            .peer(PeerUpdate::new(b).replace_allowed_ips().allowed_ip(prefix("10.1.0.0/16")))
            .peer(PeerUpdate::new(a).remove_allowed_ip(prefix("10.0.0.0/24")).preshared_key(Some([5; 32])))
            .remove_peer(b);
        let (typed, text) = (control(), control());
        for update in [first, second] {
            // The request's text, secrets written out (an update's own text leaves them out).
            let lines: Vec<String> = update
                .ops()
                .map(|op| match op {
                    Op::PrivateKey(Some(k)) => format!("private_key={}", key_to_hex(k.as_bytes())),
                    Op::PresharedKey(Some(k)) => format!("preshared_key={}", key_to_hex(k.as_bytes())),
                    op => op.to_string(),
                })
                .collect();
            typed.configure(update).unwrap();
            set_lines(&text, &lines).unwrap();
        }
        let strip = |mut config: DeviceConfig| {
            config.peers.iter_mut().for_each(|p| p.incarnation = 0);
            config
        };
        let config = strip(typed.config());
        assert_eq!(config, strip(text.config()));
        // What the kernel's rules make of it: b took 10.0.0.0/24 from a, c never existed, b was removed.
        assert_eq!(config.peers.len(), 1);
        assert_eq!(config.peers[0].public_key, a);
        assert!(config.peers[0].allowed_ips.is_empty() && config.peers[0].preshared_key.is_some());
    }

    #[test]
    fn an_update_refused_anywhere_changes_nothing() {
        let control = control();
        control.configure(Update::new().private_key([1; 32]).peer(PeerUpdate::new([2; 32]))).unwrap();
        let before = control.config();
        let bad = Update::new()
            .remove_peer([2; 32])
            .peer(PeerUpdate::new([3; 32]).allowed_ip(Prefix::new("10.0.0.0".parse().unwrap(), 33)));
        let refused = control.configure(bad).unwrap_err();
        assert_eq!(refused.errno, libc::EINVAL);
        assert_eq!(refused.line, "allowed_ip=10.0.0.0/33");
        assert_eq!(control.config(), before);
    }

    #[test]
    fn a_refusal_of_the_endpoint_names_the_setting_and_changes_nothing() {
        let wg = Arc::new(WireGuard::new());
        let refuse_ports =
            Box::new(|old: &DeviceConfig, new: &DeviceConfig| match new.listen_port != old.listen_port {
                true => Err((libc::EADDRINUSE, "in use".to_string())),
                false => Ok(()),
            });
        let control = Control::new(Arc::new(Configurator::new(wg, refuse_ports)));
        let refused = control.configure(Update::new().peer(PeerUpdate::new([2; 32])).listen_port(80)).unwrap_err();
        assert_eq!((refused.errno, refused.line.as_str()), (libc::EADDRINUSE, "listen_port=80"));
        assert!(control.peers().is_empty() && control.config().listen_port == 0);
    }

    #[test]
    fn the_own_public_key_is_never_a_peer() {
        let control = control();
        let own = crate::wireguard::public_key(&[1; 32]);
        control.configure(Update::new().private_key([1; 32]).peer(PeerUpdate::new(own))).unwrap();
        assert!(control.peers().is_empty());
        assert_eq!(control.public_key(), Some(own));
    }
}
