//! A flood of valid-mac1 initiations against the server, and what it must still do under one.

use super::*;

pub(crate) fn snmp(ns: &OwnedFd, table: &str, field: &str) -> u64 {
    let text = with_netns(&ns_path(ns), || std::fs::read_to_string("/proc/thread-self/net/snmp")).unwrap().unwrap();
    let mut rows = text.lines().filter(|l| l.starts_with(&format!("{table}:")));
    let (names, values) = (rows.next().unwrap(), rows.next().unwrap());
    let at = names.split_whitespace().position(|n| n == field).unwrap();
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

/// Datagrams the kernels on the way may have dropped so far: every interface's drops in the test's namespaces
/// (but the tunnel devices'), the server's UDP input errors (a full socket buffer), and the machine's backlog
/// drops (`/proc/net/softnet_stat`, shared with everything else that runs: an overestimate).
pub(crate) fn kernel_losses(u: &Underlay) -> u64 {
    let mut lost = snmp(&u.nss[1], "Udp", "InErrors");
    for ns in &u.nss {
        let mut nl = Netlink::in_netns(&ns_path(ns)).unwrap();
        for link in nl.links().unwrap() {
            if link.kind.as_deref() != Some("tun") {
                lost += link.stats.rx_dropped + link.stats.tx_dropped;
            }
        }
    }
    let softnet = std::fs::read_to_string("/proc/net/softnet_stat").unwrap();
    lost + softnet.lines().map(|l| u64::from_str_radix(l.split_whitespace().nth(1).unwrap(), 16).unwrap()).sum::<u64>()
}

/// Initiations a second of the tests' floods: far more than any WireGuard endpoint finishes handshakes for, so
/// that the server's queue stays long enough to keep it under load (where the per-source limit applies), and
/// few enough that a debug build of the server still reads nearly every datagram (`turbotun bench` measures the
/// fastest flood one core sends, on release builds).
pub(crate) const FLOOD_RATE: u64 = 50_000;

/// A flood of valid-mac1 initiations with random content (`turbotun bench --wg-flood`), from `sources` in `ns`.
pub(crate) struct Flood(pub(crate) Option<Child>);

impl Flood {
    pub(crate) fn start(ns: &OwnedFd, server: SocketAddr, server_key: &str, sources: &[IpAddr]) -> Flood {
        let from: Vec<String> = sources.iter().map(|a| a.to_string()).collect();
        let rate = FLOOD_RATE.to_string();
        let mut c = Command::new(TURBOTUN);
        c.args(["bench", "--wg-flood", &server.to_string(), "--wg-flood-key", server_key])
            .args(["--wg-flood-from", &from.join(","), "--wg-flood-rate", &rate, "--duration", "300"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        Flood(Some(with_netns(&ns_path(ns), || c.spawn()).unwrap().expect("start the flood")))
    }

    /// Stops it; how many initiations it sent.
    pub(crate) fn stop(mut self) -> u64 {
        let child = self.0.take().unwrap();
        nix_kill(child.id(), "TERM");
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "flood: {out:?}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        report["sent"].as_u64().unwrap()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What one source that completes genuine handshakes got back during a flood.
#[derive(Debug, Default)]
pub(crate) struct OneSource {
    /// Initiations sent before it had the server's cookie.
    pub(crate) setup: u64,
    /// Initiations sent in the window, with the mac2 of the server's cookie, and the answers to them.
    pub(crate) sent: u64,
    pub(crate) responses: u64,
    pub(crate) cookie_replies: u64,
    /// Seconds of the window.
    pub(crate) window: f64,
}

/// A peer the server knows (its private key is the test's) sends genuine initiations from `socket` as fast as
/// it can for `secs`: first until the server, under load, hands it a cookie, then all with that cookie's mac2,
/// counting the server's answers. If the server's cookie changes (its secret is renewed every two minutes) the
/// count starts again, once.
pub(crate) fn genuine_initiations(
    socket: &UdpSocket,
    initiator: &mut Initiator,
    secs: f64,
) -> Result<OneSource, String> {
    socket.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut mac1s: Vec<[u8; 16]> = Vec::new();
    let mut out = OneSource::default();
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + Duration::from_secs(20);
    while initiator.cookie().is_none() {
        if Instant::now() > deadline {
            return Err(format!("the flooded server handed out no cookie in 20 s: {out:?}"));
        }
        let (m, mac1) = initiator.initiation(mac1s.len() as u32);
        mac1s.push(mac1);
        socket.send(&m).unwrap();
        out.setup += 1;
        while let Ok(n) = socket.recv(&mut buf) {
            if buf[0] == msg::COOKIE_REPLY && n == msg::COOKIE_REPLY_LEN {
                let to = u32::from_le_bytes(buf[4..8].try_into().unwrap()) as usize;
                if mac1s.get(to).is_some_and(|mac1| initiator.take_cookie(&buf[..n], mac1)) {
                    break;
                }
            }
        }
    }
    socket.set_nonblocking(true).unwrap();
    let mut restarted = false;
    let mut start = Instant::now();
    let (mut sent, mut responses, mut cookie_replies) = (0u64, 0u64, 0u64);
    let mut window_end = start + Duration::from_secs_f64(secs);
    // Replies still on their way when the window closes are counted too.
    while Instant::now() < window_end + Duration::from_secs(2) {
        if Instant::now() < window_end {
            let (m, mac1) = initiator.initiation(mac1s.len() as u32);
            mac1s.push(mac1);
            if socket.send(&m).is_ok() {
                sent += 1;
            }
        }
        while let Ok(n) = socket.recv(&mut buf) {
            match buf[0] {
                msg::RESPONSE => responses += 1,
                msg::COOKIE_REPLY => {
                    cookie_replies += 1;
                    let to = u32::from_le_bytes(buf[4..8].try_into().unwrap()) as usize;
                    let old = initiator.cookie();
                    let opened = mac1s.get(to).is_some_and(|mac1| initiator.take_cookie(&buf[..n], mac1));
                    if opened && initiator.cookie() != old && !restarted {
                        restarted = true;
                        (sent, responses, cookie_replies) = (0, 0, 0);
                        start = Instant::now();
                        window_end = start + Duration::from_secs_f64(secs);
                    }
                }
                _ => {}
            }
        }
        if Instant::now() >= window_end {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    out.sent = sent;
    out.responses = responses;
    out.cookie_replies = cookie_replies;
    out.window = secs;
    Ok(out)
}

#[test]
fn a_handshake_flood_is_counted_limited_per_source_and_cannot_stop_data() {
    if !privileged("a_handshake_flood_is_counted_limited_per_source_and_cannot_stop_data") {
        return;
    }
    // Server in nss[1], wireguard-go client in nss[2], the flooders in nss[3] at 10.201.0.13 and, for the flood
    // from several addresses, 10.201.0.100-107.
    let u = underlay(3);
    // No IPv6 in the server's namespace: its device sends no multicast of its own, so every drop is the flood's.
    with_netns(&ns_path(&u.nss[1]), || {
        for conf in ["all", "default"] {
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{conf}/disable_ipv6"), "1").unwrap();
        }
    })
    .unwrap();
    let many: Vec<IpAddr> = (100..108).map(|i| format!("10.201.0.{i}").parse().unwrap()).collect();
    let mut nl = Netlink::in_netns(&ns_path(&u.nss[3])).unwrap();
    for a in &many {
        nl.add_address(&u.names[3], *a, 24).unwrap();
    }
    let dir = private_dir();
    let (ks, kc, kf) = (keys(dir.path(), "s.key"), keys(dir.path(), "c.key"), keys(dir.path(), "f.key"));
    let (sn, cn) = (unique("wfs"), unique("wfc"));
    let server = Endpoint::start(&u.nss[1], server_impl(), &sn);
    let client = Endpoint::start(&u.nss[2], Impl::WireguardGo, &cn);
    let server_key = ks.private_file.to_str().unwrap();
    let port = SERVER_PORT.to_string();
    wg(&u.nss[1], &["set", &sn, "private-key", server_key, "listen-port", &port]);
    wg(&u.nss[1], &["set", &sn, "peer", &kc.public, "endpoint", "10.201.0.12:51821", "allowed-ips", "10.202.0.2/32"]);
    wg(&u.nss[1], &["set", &sn, "peer", &kf.public, "allowed-ips", "10.202.0.99/32"]);
    let client_key = kc.private_file.to_str().unwrap();
    let cport = CLIENT_PORT.to_string();
    let set = ["set", &cn, "private-key", client_key, "listen-port", &cport, "peer", &ks.public];
    wg(&u.nss[2], &[&set[..], &["endpoint", "10.201.0.11:51820", "allowed-ips", "10.202.0.1/32"]].concat());
    bring_up(&u.nss[1], &sn, "10.202.0.1");
    bring_up(&u.nss[2], &cn, "10.202.0.2");
    assert!(ping_within(&u.nss[2], "10.202.0.1", 5), "no tunnel");
    let target: SocketAddr = "10.201.0.11:51820".parse().unwrap();
    let lost_before = kernel_losses(&u);

    // Everything is measured before anything is judged, so that a failure shows every property at once.
    let mut failures: Vec<String> = Vec::new();

    // From one address: a bounded TCP transfer through the tunnel completes intact during the flood.
    let one: IpAddr = "10.201.0.13".parse().unwrap();
    let flood = Flood::start(&u.nss[3], target, &ks.public, &[one]);
    let data = common::try_tcp_between_while(&u.nss[2], &u.nss[1], "10.202.0.1", 7201, 8 << 20, || {});
    failures.extend(data.err().map(|e| format!("during a flood from one address: {e}")));
    let sent_from_one = flood.stop();

    // From eight addresses, and meanwhile one more source, a peer the server knows, sends genuine initiations
    // as fast as it can: WireGuard under load lets 20 a second and a burst of 5 through per source address.
    let flood = Flood::start(&u.nss[3], target, &ks.public, &many);
    let peer_socket = with_netns(&ns_path(&u.nss[3]), || UdpSocket::bind((one, 0))).unwrap().unwrap();
    peer_socket.connect(target).unwrap();
    let private = decode_key(&std::fs::read_to_string(&kf.private_file).unwrap());
    let mut initiator = Initiator::new(private, decode_key(&ks.public));
    let mut one_source = Err(String::new());
    let data = common::try_tcp_between_while(&u.nss[2], &u.nss[1], "10.202.0.1", 7202, 8 << 20, || {
        one_source = genuine_initiations(&peer_socket, &mut initiator, 3.0);
    });
    let one_source = one_source.unwrap_or_else(|e| {
        failures.push(e);
        OneSource::default()
    });
    failures.extend(data.err().map(|e| format!("during a flood from {} addresses: {e}", many.len())));
    let sent_from_many = flood.stop();
    if !ping_within(&u.nss[2], "10.202.0.1", 5) {
        failures.push("no ping through the tunnel after the flood".into());
    }
    let lost = kernel_losses(&u) - lost_before;
    // WireGuard's limit under load, per source address: 20 initiations a second and a burst of 5 (the kernel's
    // ratelimiter.c), over the window as the server saw it (a quarter of a second more for the way there), and
    // 10 more: a debug build's queue runs short for moments, when WireGuard applies no per-source limit (under
    // load means a queue of 512 or more, or one within the last second). A limit of twice the rate gives 130.
    let allowed = (20.0 * (one_source.window + 0.25) + 5.0).floor() as u64 + 10;
    eprintln!(
        "flood: {sent_from_one} initiations from one address, {sent_from_many} from {}; one source's genuine \
         initiations: {one_source:?} (its allowance {allowed}); up to {lost} datagrams lost in the kernels",
        many.len()
    );
    if one_source.responses > allowed {
        failures.push(format!(
            "one source sent {} genuine initiations in {} s with the server's cookie and got {} handshake responses: \
             more than the {allowed} that WireGuard's limit of 20 a second and a burst of 5 per address allows \
             (and 10)",
            one_source.sent, one_source.window, one_source.responses
        ));
    }
    // Cookie replies in the window answer only what was sent before the cookie came (still on its way).
    if one_source.cookie_replies > one_source.setup {
        failures.push(format!("cookie replies to initiations that carried the cookie: {one_source:?}"));
    }
    if one_source.window > 0.0 && one_source.responses == 0 {
        failures.push(format!("a peer under the limit completed no handshake: {one_source:?}"));
    }

    // Every handshake message the server's socket received and did not answer with a response is counted, by
    // a reason a refused handshake gives: `rate_limited` (under load, without the cookie or over the source's
    // rate: the flood's nearly all), `unauthenticated` (taken in a moment the queue was short, and its random
    // content opened nothing) or `replayed` (a genuine initiation within 20 ms of the last one taken from that
    // peer, or in the same tick of its timestamp). A flooder with a wrong mac1 would be all `unauthenticated`.
    if let Some(c) = stop_server(server) {
        let genuine = one_source.setup + one_source.sent;
        let junk = sent_from_one + sent_from_many;
        let unanswered = junk + genuine - one_source.responses;
        let reasons = &c["drops_by_reason"];
        let reason = |name: &str| reasons[name].as_u64().unwrap_or(0);
        let refused = reason("rate_limited") + reason("unauthenticated") + reason("replayed");
        if refused + lost < unanswered || refused > unanswered + 10 {
            failures.push(format!(
                "{unanswered} handshake messages went unanswered (of {junk} flooded and {genuine} genuine); \
                 {refused} were counted as refused handshakes, and up to {lost} may have been lost on the way: \
                 {reasons}"
            ));
        }
        if reason("rate_limited") < (junk / 2).saturating_sub(lost) {
            failures.push(format!("the flood's valid-mac1 initiations were not refused under load: {reasons}"));
        }
        // The server's namespace has no IPv6, so its device sends nothing of its own that no peer takes.
        let other = c["drops"].as_u64().unwrap() - refused;
        if other > 0 {
            failures.push(format!("{other} drops for reasons a handshake flood does not give: {reasons}"));
        }
    }
    drop(client);
    assert!(failures.is_empty(), "under a handshake flood:\n- {}", failures.join("\n- "));
}
