//! The live set (see `timers`): the timers run for the peers with something to time and for no other, so that an
//! idle server of many peers costs nothing between packets.

use super::*;

/// The peers the timers run for, by public key.
fn live(node: &Node) -> Vec<Key> {
    let mut keys: Vec<Key> = node.wg.live.lock().unwrap().iter().map(|p| p.public_key).collect();
    keys.sort_unstable();
    keys
}

/// A thousand configured peers with no traffic: none is live, so a tick looks at none of them and nothing is made
/// for them; a peer with a persistent keepalive is, and stays.
#[test]
fn test_idle_peers_are_not_looked_at_and_a_persistent_keepalive_is() {
    let a = Node::new(1, A);
    let mut config = DeviceConfig { private_key: Some(crate::config::SecretKey::new(a.private)), ..Default::default() };
    for i in 0..1000u32 {
        let mut key = [7u8; 32];
        key[..4].copy_from_slice(&i.to_be_bytes());
        let mut peer = PeerConfig::new(key);
        peer.endpoint = Some(B.parse().unwrap());
        peer.allowed_ips = vec![(IpAddr::from([10, 8, (i >> 8) as u8, i as u8]), 32)];
        peer.persistent_keepalive = u16::from(i == 500) * 25;
        config.peers.push(peer);
    }
    a.wg.apply(config);
    let keepalive_peer = a.wg.config().peers[500].public_key;
    // Only the peer with a persistent keepalive is live, before a tick and after.
    assert_eq!(live(&a), [keepalive_peer]);
    let mut wire = Vec::new();
    a.tick(&mut wire);
    assert_eq!(live(&a), [keepalive_peer]);
    // Nothing was made for the idle ones: no handshake state, no handshake keys (a server's memory per peer).
    let made: Vec<Key> =
        a.wg.peer_table()
            .ordered()
            .into_iter()
            .filter(|e| e.peer.state_if_made().is_some() || e.peer.keys_made())
            .map(|e| e.peer.public_key)
            .collect();
    assert_eq!(made, [keepalive_peer]);
    // Its keepalive goes as an initiation (no session yet), every tick after looks at it alone.
    assert_eq!(wire.iter().filter(|w| w.data[0] == 1).count(), 1, "one initiation, for the keepalive peer");
    for _ in 0..40 {
        wire.clear();
        a.skip(250);
        a.tick(&mut wire);
        assert_eq!(live(&a), [keepalive_peer]);
    }
}

/// A peer is live from the packet that asks for its handshake until its sessions are zeroed, then idle until its
/// next packet.
#[test]
fn test_a_peer_is_live_while_it_has_a_session_and_idle_after() {
    let (a, b) = pair();
    assert_eq!(live(&a), [b.public()], "a session: live");
    assert_eq!(live(&b), [a.public()]);
    let mut wire = Vec::new();
    // The network goes silent. Their timers run on (a keepalive, A's handshakes until it gives up), then
    // 3 × REJECT_AFTER_TIME after the handshake every key is zeroed, and the next tick finds the peer idle.
    for _ in 0..(3 * REJECT_AFTER_TIME + 10_000) / 1000 {
        for node in [&a, &b] {
            node.skip(1000);
            node.tick(&mut wire);
        }
        wire.clear();
    }
    assert!(live(&a).is_empty() && live(&b).is_empty(), "a: {:?}, b: {:?}", live(&a), live(&b));
    // A packet for the peer makes it live again, and the handshake it asks for is sent.
    fresh_timestamp();
    assert_eq!(a.send(&packet(A_INNER, B_INNER, 8), &mut wire), Sealed::Held);
    assert_eq!(live(&a), [b.public()]);
    let (_, at_b) = deliver(&a, &b, &mut wire);
    assert_eq!(at_b.len(), 1, "the held packet arrives");
    assert_eq!(live(&b), [a.public()], "the responder's peer is live again too");
}
