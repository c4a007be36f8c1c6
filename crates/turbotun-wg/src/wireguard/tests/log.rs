//! The verbose log: the protocol's events as wireguard-go's verbose log names them, each with the interface and
//! the peer, and no line per data packet.

use std::io::Write;

use super::*;

/// Where the test's log lines go.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

#[test]
fn test_the_verbose_log_names_each_event_its_interface_and_peer_and_no_data_packet() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let (a, b) = (Node::new(1, A), Node::new(2, B));
        a.wg.set_name("wga");
        b.wg.set_name("wgb");
        first_handshake(&a, &b);
        let mut wire = Vec::new();
        let (at_a, at_b) = (peer_tag(&b.public()), peer_tag(&a.public()));
        let log = lines.text();
        for line in [
            format!("wga: {at_a} - Created (endpoint {B}, allowed IPs 10.9.0.2/32)"),
            format!("wgb: {at_b} - Created (endpoint none, allowed IPs 10.9.0.1/32)"),
            format!("wga: {at_a} - Sending handshake initiation"),
            format!("wgb: {at_b} - Received handshake initiation"),
            format!("wgb: {at_b} - Sending handshake response"),
            format!("wga: {at_a} - Received handshake response"),
        ] {
            assert!(log.contains(&line), "no {line:?} in:\n{log}");
        }
        assert!(log.contains(&format!("wga: {at_a} - Keypair ")) && log.contains(" created"), "{log}");
        // The tag is the ends of the base64 key, as `wg show` prints it.
        assert!(at_a.starts_with("peer(") && at_a.ends_with(')') && at_a.chars().count() == 15, "{at_a}");
        // Data both ways: not a line more.
        let before = lines.text().lines().count();
        for _ in 0..50 {
            a.send(&packet(A_INNER, B_INNER, 64), &mut wire);
            b.send(&packet(B_INNER, A_INNER, 64), &mut wire);
            deliver(&a, &b, &mut wire);
        }
        assert_eq!(lines.text().lines().count(), before, "a line per data packet:\n{}", lines.text());
        // A configuration change says what it changed.
        let mut config = a.wg.config();
        config.peers[0].allowed_ips.push((IpAddr::from([10, 9, 1, 0]), 24));
        a.wg.apply(config);
        let mut config = a.wg.config();
        config.peers.clear();
        a.wg.apply(config);
        let log = lines.text();
        assert!(log.contains(&format!("wga: {at_a} - Adding allowed IP 10.9.1.0/24")), "{log}");
        assert!(log.contains(&format!("wga: {at_a} - Removed")), "{log}");
    });
}
