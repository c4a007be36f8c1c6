//! `turbotun wg` against the real programs: wireguard-go, boringtun or GotaTun at the other end (both ways, either side
//! starting the handshake), `wg` through the configuration socket, `wg-quick up`/`down` with `turbotun-wg` as the
//! userspace implementation, several peers with AllowedIPs, roaming, a restarted peer, bad input at the UDP port and on
//! the configuration socket, and a soak with flat memory. Each test builds its own namespaces (an underlay veth pair or
//! three) and removes everything it made, processes and socket files included, however it ends.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::UdpSocket;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::wg::*;
use common::{ns_path, pattern, privileged, processes_with};
use turbotun::netlink::Netlink;
use turbotun::netns::with_netns;

#[test]
fn turbotun_wg_and_wireguard_go_interoperate_both_ways() {
    if !privileged("turbotun_wg_and_wireguard_go_interoperate_both_ways") {
        return;
    }
    interoperate_both_ways(Impl::WireguardGo);
}

#[test]
fn turbotun_wg_and_boringtun_interoperate_both_ways() {
    if !privileged("turbotun_wg_and_boringtun_interoperate_both_ways") {
        return;
    }
    interoperate_both_ways(Impl::Boringtun);
}

#[test]
fn turbotun_wg_and_gotatun_interoperate_both_ways() {
    if !privileged("turbotun_wg_and_gotatun_interoperate_both_ways") {
        return;
    }
    interoperate_both_ways(Impl::Gotatun);
}

/// `turbotun wg` and `other` as each other's peer, once with each side starting the handshake: pings, TCP and
/// UDP both ways, and `wg show` at both ends.
fn interoperate_both_ways(other: Impl) {
    for (first, second) in [(Impl::Turbotun, other), (other, Impl::Turbotun)] {
        // The first side pings first, so each program starts the handshake once.
        let p = pair(first, second);
        assert!(ping_within(&p.nss[1], "10.202.0.2", 5), "{first:?} -> {second:?}: no ping answer");
        assert!(ping(&p.nss[2], "10.202.0.1"));
        tcp_intact(&p.nss[1], &p.nss[2], "10.202.0.2", 64 << 20);
        tcp_intact(&p.nss[2], &p.nss[1], "10.202.0.1", 16 << 20);
        // Nothing lost end to end, in packets (a TCP stream's retransmissions would hide a loss): 400 datagrams
        // each way, every one sent at one end received whole at the other.
        common::udp_datagrams_between(&p.nss[1], &p.nss[2], "10.202.0.1", "10.202.0.2", false, false, 50);
        common::udp_datagrams_between(&p.nss[2], &p.nss[1], "10.202.0.2", "10.202.0.1", false, false, 50);
        // `wg show` through each configuration socket: the peer, its endpoint, a handshake, the bytes.
        for (ns, name, peer_port) in [(&p.nss[1], &p.a.name, "51821"), (&p.nss[2], &p.b.name, "51820")] {
            let dump = wg(ns, &["show", name, "dump"]);
            let peer: Vec<&str> = dump.lines().nth(1).expect("one peer line").split('\t').collect();
            assert!(peer[2].ends_with(peer_port), "{name} endpoint: {dump}");
            assert_ne!(peer[4], "0", "{name}: a handshake: {dump}");
            let (rx, tx): (u64, u64) = (peer[5].parse().unwrap(), peer[6].parse().unwrap());
            assert!(rx > 16 << 20 && tx > 16 << 20, "{name}: transfer rx {rx} tx {tx}");
            assert!(wg(ns, &["show", "interfaces"]).split_whitespace().any(|n| n == name.as_str()));
        }
        let Pair { a, b, .. } = p;
        let turbotun = if first == Impl::Turbotun { a } else { b };
        let c = counters(&turbotun.stop());
        nothing_lost_but_unroutable(&c);
    }
}

#[test]
fn wg_quick_up_and_down_with_turbotun_wg() {
    if !privileged("wg_quick_up_and_down_with_turbotun_wg") {
        return;
    }
    let nss = underlay(2).nss;
    let dir = private_dir();
    let (ka, kb) = (keys(dir.path(), "a.key"), keys(dir.path(), "b.key"));
    let name = unique("wgq");
    let conf = dir.path().join(format!("{name}.conf"));
    std::fs::write(
        &conf,
        format!(
            "[Interface]\nPrivateKey = {}\nListenPort = 51830\nAddress = 10.203.0.1/24\nMTU = 1400\n\n[Peer]\nPublicKey = {}\nEndpoint = 10.201.0.12:51831\nAllowedIPs = 10.203.0.2/32\n",
            ka.private, kb.public
        ),
    )
    .unwrap();
    std::fs::set_permissions(&conf, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // The other end: wireguard-go, configured with wg.
    let peer_name = unique("wgp");
    let peer = Endpoint::start(&nss[2], Impl::WireguardGo, &peer_name);
    let kb_file = kb.private_file.to_str().unwrap().to_string();
    let line = format!(
        "set {peer_name} private-key {kb_file} listen-port 51831 \
            peer {} endpoint 10.201.0.11:51830 allowed-ips 10.203.0.1/32",
        ka.public
    );
    wg_line(&nss[2], &line);
    bring_up(&nss[2], &peer_name, "10.203.0.2");

    let wg_quick = |verb: &str| {
        with_netns(&ns_path(&nss[1]), || {
            Command::new("wg-quick")
                .args([verb, conf.to_str().unwrap()])
                .env("WG_QUICK_USERSPACE_IMPLEMENTATION", TURBOTUN_WG)
                .output()
        })
        .unwrap()
        .expect("wg-quick (apt: wireguard-tools)")
    };
    let up = wg_quick("up");
    assert!(up.status.success(), "wg-quick up: {}", String::from_utf8_lossy(&up.stderr));
    // It returned: the endpoint runs in the background, configured by wg-quick through the socket.
    let show = wg(&nss[1], &["show", &name]);
    assert!(show.contains("listening port: 51830") && show.contains(&kb.public), "{show}");
    let link = Netlink::in_netns(&ns_path(&nss[1])).unwrap().link(&name).unwrap();
    assert_eq!(link.mtu, 1400);
    assert!(ping_within(&nss[1], "10.203.0.2", 5));
    let down = wg_quick("down");
    assert!(down.status.success(), "wg-quick down: {}", String::from_utf8_lossy(&down.stderr));
    // wg-quick down only deletes the link: the endpoint notices, exits and removes its socket.
    wait_for(|| !socket_of(&name).exists(), "the socket to go after wg-quick down");
    wait_for(|| processes_with(&format!("turbotun-wg --foreground {name}")).is_empty(), "the endpoint to exit");
    drop(peer);
}

#[test]
fn several_peers_roaming_and_a_restarted_peer() {
    if !privileged("several_peers_roaming_and_a_restarted_peer") {
        return;
    }
    // The hub runs turbotun wg with two peers: wireguard-go in nss[1] (10.202.0.2, and a network behind it,
    // 10.210.0.0/24) and turbotun in nss[2] (10.202.0.3).
    let Underlay { nss, names } = underlay(2);
    let dir = private_dir();
    let (kh, k1, k2) = (keys(dir.path(), "h"), keys(dir.path(), "1"), keys(dir.path(), "2"));
    let (nh, n1, n2) = (unique("wgh"), unique("wg1"), unique("wg2"));
    let hub = Endpoint::start(&nss[0], Impl::Turbotun, &nh);
    let one = Endpoint::start(&nss[1], Impl::WireguardGo, &n1);
    let mut two = Endpoint::start(&nss[2], Impl::Turbotun, &n2);
    let file = |k: &Keys| k.private_file.to_str().unwrap().to_string();
    let line = format!(
        "set {nh} private-key {} listen-port 51840 \
            peer {} endpoint 10.201.0.11:51841 allowed-ips 10.202.0.2/32,10.210.0.0/24 \
            peer {} endpoint 10.201.0.12:51842 allowed-ips 10.202.0.3/32",
        &file(&kh),
        k1.public,
        k2.public
    );
    wg_line(&nss[0], &line);
    wg_line(
        &nss[1],
        &format!(
            "set {n1} private-key {} listen-port 51841 peer {} endpoint 10.201.0.1:51840 allowed-ips 10.202.0.0/24",
            &file(&k1),
            kh.public
        ),
    );
    let set_two = |ns: &OwnedFd| {
        let line = format!(
            "set {n2} private-key {} listen-port 51842 \
                peer {} endpoint 10.201.0.1:51840 allowed-ips 10.202.0.0/24 persistent-keepalive 1",
            &file(&k2),
            kh.public
        );
        wg_line(ns, &line);
    };
    set_two(&nss[2]);
    bring_up(&nss[0], &nh, "10.202.0.1");
    bring_up(&nss[1], &n1, "10.202.0.2");
    Netlink::in_netns(&ns_path(&nss[1])).unwrap().add_address(&n1, "10.210.0.5".parse().unwrap(), 24).unwrap();
    bring_up(&nss[2], &n2, "10.202.0.3");
    Netlink::in_netns(&ns_path(&nss[0])).unwrap().add_route("10.210.0.0".parse().unwrap(), 24, &nh).unwrap();
    // Each destination goes to its own peer (and 10.210.0.5 to the peer whose AllowedIPs hold its network). The
    // first ping to peer 2 may start the hub's own handshake while peer 2's keepalive starts one: each side then
    // answers the other's and drops its own (the kernel's rule too), and the retransmission after REKEY_TIMEOUT
    // (5 s and up to a third of a second) completes it, so the first contact may take that long.
    for dst in ["10.202.0.2", "10.202.0.3", "10.210.0.5"] {
        assert!(ping_within(&nss[0], dst, 10), "hub -> {dst}");
    }
    let transfer = |ns: &OwnedFd, name: &str| -> Vec<(String, u64)> {
        wg(ns, &["show", name, "transfer"])
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                (f[0].to_string(), f[1].parse::<u64>().unwrap() + f[2].parse::<u64>().unwrap())
            })
            .collect()
    };
    // Bytes both ways per peer.
    let before = transfer(&nss[0], &nh);
    tcp_intact(&nss[0], &nss[1], "10.210.0.5", 4 << 20);
    let after = transfer(&nss[0], &nh);
    let grew = |key: &str| {
        let get = |v: &Vec<(String, u64)>| v.iter().find(|(k, _)| k == key).map(|(_, n)| *n).unwrap();
        get(&after) - get(&before)
    };
    assert!(grew(&k1.public) > 1 << 20 && grew(&k2.public) < 1 << 20, "only peer 1 carried it");

    // Roaming: peer 2's underlay address changes; its next datagram (a keepalive each second) comes from the
    // new address, and the hub's replies follow it.
    let far = &names[2];
    let mut nl2 = Netlink::in_netns(&ns_path(&nss[2])).unwrap();
    // (Removed first: removing a primary address removes its secondaries with it.)
    nl2.del_address(far, "10.201.0.12".parse().unwrap(), 24).unwrap();
    nl2.add_address(far, "10.201.0.22".parse().unwrap(), 24).unwrap();
    wait_for(|| wg(&nss[0], &["show", &nh, "endpoints"]).contains("10.201.0.22:51842"), "the hub to see peer 2 roam");
    assert!(ping_within(&nss[0], "10.202.0.3", 5), "hub -> roamed peer 2");

    // A restarted peer resumes: same key, same configuration, a new process.
    drop(two);
    two = Endpoint::start(&nss[2], Impl::Turbotun, &n2);
    set_two(&nss[2]);
    bring_up(&nss[2], &n2, "10.202.0.3");
    assert!(ping_within(&nss[2], "10.202.0.1", 10), "restarted peer 2 -> hub");
    assert!(ping_within(&nss[0], "10.202.0.3", 5), "hub -> restarted peer 2");
    let c = counters(&hub.stop());
    assert_eq!(c["drops_by_reason"]["not_allowed"], 0, "{c}");
    drop((one, two));
}

#[test]
fn bad_input_at_the_udp_port_is_counted_and_traffic_goes_on() {
    if !privileged("bad_input_at_the_udp_port_is_counted_and_traffic_goes_on") {
        return;
    }
    let p = pair(Impl::Turbotun, Impl::WireguardGo);
    assert!(ping_within(&p.nss[1], "10.202.0.2", 5));
    // Real data messages from B to A, seen on the underlay's bridge, to replay and truncate.
    let captured = capture_to_port(&p.nss[0], 51820, || {
        assert!(ping(&p.nss[2], "10.202.0.1"));
        assert!(ping(&p.nss[2], "10.202.0.1"));
    });
    let data: Vec<Vec<u8>> = captured.into_iter().filter(|d| d.first() == Some(&4)).collect();
    assert!(data.len() >= 2, "captured {} data messages", data.len());
    // Junk from B's namespace (another port) to A's.
    let junk = with_netns(&ns_path(&p.nss[2]), || UdpSocket::bind("10.201.0.12:0")).unwrap().unwrap();
    let a_port = "10.201.0.11:51820";
    // Each call a different deterministic pattern, so that a failure reproduces.
    let mut seed = 0x9e37_79b9_u64;
    let mut random = |n: usize| -> Vec<u8> {
        seed += 1;
        pattern(n, seed)
    };
    // Random bytes of every small length and some large ones; datagrams shaped like each message type but
    // truncated or with random contents (a data message: type 4, a random index and counter).
    for len in (0..64).chain([148, 92, 64, 200, 1400, 1500]) {
        junk.send_to(&random(len), a_port).unwrap();
    }
    for (kind, len) in [(1u8, 148usize), (2, 92), (3, 64), (4, 32), (4, 1200), (1, 100), (4, 20)] {
        let mut d = random(len);
        d[..4].copy_from_slice(&[kind, 0, 0, 0]);
        junk.send_to(&d, a_port).unwrap();
    }
    // Replays of genuine messages (each sent three times) and truncated copies.
    for d in &data {
        for _ in 0..3 {
            junk.send_to(d, a_port).unwrap();
        }
        junk.send_to(&d[..d.len() - 1], a_port).unwrap();
        junk.send_to(&d[..d.len() - 17], a_port).unwrap();
    }
    // The wrong key: B's endpoint with another private key tries a handshake A cannot place; with its own key
    // back, the tunnel works again.
    let other = keys(p.dir.path(), "other.key");
    let b_key = p.dir.path().join("b.key");
    wg(&p.nss[2], &["set", &p.b.name, "private-key", other.private_file.to_str().unwrap()]);
    assert!(!ping(&p.nss[2], "10.202.0.1"), "a peer with the wrong key gets through");
    wg(&p.nss[2], &["set", &p.b.name, "private-key", b_key.to_str().unwrap()]);
    assert!(ping_within(&p.nss[2], "10.202.0.1", 8), "the right key again");
    // A flood while a stream runs: the stream is intact.
    let flood = std::thread::spawn(move || {
        let mut sent = 0u64;
        let start = Instant::now();
        let mut d = vec![4u8, 0, 0, 0];
        d.extend_from_slice(&[0x5a; 1000]);
        while start.elapsed() < Duration::from_secs(2) {
            if junk.send_to(&d, a_port).is_ok() {
                sent += 1;
            }
        }
        sent
    });
    tcp_intact(&p.nss[2], &p.nss[1], "10.202.0.1", 16 << 20);
    let flooded = flood.join().unwrap();
    assert!(ping(&p.nss[1], "10.202.0.2"), "the tunnel still works after the flood");
    let Pair { a, .. } = p;
    let c = counters(&a.stop());
    let by_reason = &c["drops_by_reason"];
    let counted: u64 = ["malformed_datagram", "unauthenticated", "replayed", "no_session"]
        .iter()
        .map(|r| by_reason[r].as_u64().unwrap())
        .sum();
    assert!(by_reason["malformed_datagram"].as_u64().unwrap() >= 60, "{c}");
    assert!(by_reason["replayed"].as_u64().unwrap() >= 3 * data.len() as u64, "{c}");
    // Truncated data, random handshake messages, the wrong key's initiations.
    assert!(by_reason["unauthenticated"].as_u64().unwrap() >= 2 * data.len() as u64 + 2, "{c}");
    // Every flood datagram that reached the socket was counted (the kernel may have dropped some of them
    // for a full socket buffer, which it counts itself).
    let sent_bad = 70 + 5 * data.len() as u64;
    assert!(counted >= sent_bad && counted <= sent_bad + flooded + 20, "{counted} counted for {flooded} flooded: {c}");
}

/// The UDP payloads to `port` seen in `ns` (on every interface) while `during` runs.
fn capture_to_port(ns: &OwnedFd, port: u16, during: impl FnOnce()) -> Vec<Vec<u8>> {
    use rustix::net::{AddressFamily, Protocol, RawProtocol, RecvFlags, SocketType};
    // A packet socket for every protocol (ETH_P_ALL, in network order: frames a bridge forwards reach only
    // these), handing over packets from the network header on.
    let proto = Protocol::from_raw(RawProtocol::new(u32::from(0x0003u16.to_be())).unwrap());
    let sniffer =
        with_netns(&ns_path(ns), || rustix::net::socket(AddressFamily::PACKET, SocketType::DGRAM, Some(proto)))
            .unwrap()
            .expect("a packet socket");
    rustix::net::sockopt::set_socket_timeout(
        &sniffer,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_millis(200)),
    )
    .unwrap();
    let sniffing = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 65536];
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(4) {
            let Ok((n, _)) = rustix::net::recv(&sniffer, &mut buf, RecvFlags::empty()) else { continue };
            let p = &buf[..n];
            if n < 28 || p[0] >> 4 != 4 || p[9] != 17 {
                continue;
            }
            let l4 = usize::from(p[0] & 0x0f) * 4;
            if p.len() >= l4 + 8 && u16::from_be_bytes([p[l4 + 2], p[l4 + 3]]) == port {
                let payload = p[l4 + 8..].to_vec();
                if !seen.contains(&payload) {
                    seen.push(payload);
                }
            }
        }
        seen
    });
    during();
    sniffing.join().unwrap()
}

#[test]
fn a_bad_configuration_changes_nothing() {
    if !privileged("a_bad_configuration_changes_nothing") {
        return;
    }
    let nss = underlay(1).nss;
    let name = unique("wgc");
    let endpoint = Endpoint::start(&nss[1], Impl::Turbotun, &name);
    let dir = private_dir();
    let k = keys(dir.path(), "k");
    let peer = keys(dir.path(), "p");
    wg_line(
        &nss[1],
        &format!(
            "set {name} private-key {} listen-port 51850 peer {} allowed-ips 10.0.0.0/8",
            k.private_file.to_str().unwrap(),
            peer.public
        ),
    );
    let get = |socket: &Path| -> String {
        let mut s = UnixStream::connect(socket).unwrap();
        s.write_all(b"get=1\n\n").unwrap();
        let mut reply = String::new();
        let mut r = BufReader::new(s);
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap() == 0 || line == "\n" {
                break;
            }
            reply.push_str(&line);
        }
        reply
    };
    let socket = socket_of(&name);
    let before = get(&socket);
    assert!(before.contains("listen_port=51850") && before.ends_with("errno=0\n"), "{before}");
    let request = |body: &str| -> String {
        let mut s = UnixStream::connect(&socket).unwrap();
        s.write_all(format!("set=1\n{body}\n").as_bytes()).unwrap();
        let mut reply = String::new();
        BufReader::new(s).read_line(&mut reply).unwrap();
        reply
    };
    // Each bad request: errno, and nothing of it applied (not even its good lines before the bad one).
    for (body, errno) in [
        ("listen_port=51851\nlisten_port=nope\n", "-22"),
        ("fwmark=5\nno-equals-sign\n", "-71"),
        ("listen_port=51852\nbogus_key=1\n", "-22"),
        ("replace_peers=true\npublic_key=0123\n", "-22"),
    ] {
        assert_eq!(request(body).trim(), format!("errno={errno}"), "{body:?}");
        assert_eq!(get(&socket), before, "{body:?} changed something");
    }
    // A port another socket holds: refused with EADDRINUSE, the old port kept.
    let holder = with_netns(&ns_path(&nss[1]), || UdpSocket::bind("0.0.0.0:51853")).unwrap().unwrap();
    let held = wg_status(&nss[1], &["set", &name, "listen-port", "51853"]);
    assert!(
        !held.status.success() && String::from_utf8_lossy(&held.stderr).contains("Address already in use"),
        "{held:?}"
    );
    assert_eq!(get(&socket), before);
    drop(holder);
    // wg's own check of a configuration file names the line (it never reaches the socket).
    let conf = dir.path().join("bad.conf");
    std::fs::write(&conf, "[Interface]\nListenPort = 51854\nFooBar = 1\n").unwrap();
    let bad = wg_status(&nss[1], &["setconf", &name, conf.to_str().unwrap()]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("FooBar"), "{bad:?}");
    assert_eq!(get(&socket), before);
    endpoint.stop();
}

#[test]
fn soak_keeps_memory_flat() {
    if !privileged("soak_keeps_memory_flat") {
        return;
    }
    let p = pair(Impl::Turbotun, Impl::Turbotun);
    assert!(ping_within(&p.nss[1], "10.202.0.2", 5));
    let rss = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    // 30 s of traffic both ways, in rounds; memory looked at after the first round (buffers warmed up) and at
    // the end.
    let (pa, pb) = (p.a.pid(), p.b.pid());
    let start = Instant::now();
    let mut warmed = None;
    while start.elapsed() < Duration::from_secs(30) {
        tcp_intact(&p.nss[1], &p.nss[2], "10.202.0.2", 16 << 20);
        tcp_intact(&p.nss[2], &p.nss[1], "10.202.0.1", 4 << 20);
        warmed.get_or_insert((rss(pa), rss(pb)));
    }
    let (wa, wb) = warmed.unwrap();
    let (ea, eb) = (rss(pa), rss(pb));
    // Nothing lost end to end, in packets: every datagram sent at one end received whole at the other.
    common::udp_datagrams_between(&p.nss[1], &p.nss[2], "10.202.0.1", "10.202.0.2", false, false, 50);
    common::udp_datagrams_between(&p.nss[2], &p.nss[1], "10.202.0.2", "10.202.0.1", false, false, 50);
    // Flat: what the buffers needed was there after the first round (the peak itself is measured on release
    // builds by `turbotun bench --tunnel`).
    assert!(ea <= wa + 1024 && eb <= wb + 1024, "RSS grew: a {wa} -> {ea} kB, b {wb} -> {eb} kB");
    let Pair { a, b, .. } = p;
    for out in [a.stop(), b.stop()] {
        nothing_lost_but_unroutable(&counters(&out));
    }
}

#[test]
fn turbotun_wg_runs_unprivileged_and_still_removes_its_socket() {
    if !privileged("turbotun_wg_runs_unprivileged_and_still_removes_its_socket") {
        return;
    }
    let nss = underlay(2).nss;
    let dir = private_dir();
    let (ka, kb) = (keys(dir.path(), "a.key"), keys(dir.path(), "b.key"));
    let (na, nb) = (unique("wgu"), unique("wgv"));
    // Two queues: the steering program that needs a privilege is attached before the drop.
    let a = Endpoint::start_with(&nss[1], Impl::Turbotun, &na, &["--user", "nobody", "--queues", "2"]);
    let b = Endpoint::start(&nss[2], Impl::WireguardGo, &nb);
    // The endpoint itself: nobody, no capability, no_new_privs.
    let status = std::fs::read_to_string(format!("/proc/{}/status", a.pid())).unwrap();
    let field = |name: &str| {
        status.lines().find(|l| l.starts_with(name)).unwrap().split_whitespace().nth(1).unwrap().to_string()
    };
    assert_eq!(
        (field("Uid:"), field("CapEff:"), field("NoNewPrivs:")),
        ("65534".into(), "0000000000000000".into(), "1".into())
    );
    let file = |k: &Keys| k.private_file.to_str().unwrap().to_string();
    wg_line(
        &nss[1],
        &format!(
            "set {na} private-key {} listen-port 51860 peer {} endpoint 10.201.0.12:51861 allowed-ips 10.202.0.2/32",
            &file(&ka),
            kb.public
        ),
    );
    wg_line(
        &nss[2],
        &format!(
            "set {nb} private-key {} listen-port 51861 peer {} endpoint 10.201.0.11:51860 allowed-ips 10.202.0.1/32",
            &file(&kb),
            ka.public
        ),
    );
    bring_up(&nss[1], &na, "10.202.0.1");
    bring_up(&nss[2], &nb, "10.202.0.2");
    assert!(ping_within(&nss[1], "10.202.0.2", 5));
    tcp_intact(&nss[2], &nss[1], "10.202.0.1", 8 << 20);
    // A privileged port is out of its reach now: refused, nothing changed.
    let refused = wg_status(&nss[1], &["set", &na, "listen-port", "80"]);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(wg(&nss[1], &["show", &na, "listen-port"]).trim() == "51860");
    // Stopped: the socket goes (its keeper removes it from the root-owned directory).
    let name = a.name.clone();
    let mut a = a;
    let mut child = a.child.take().unwrap();
    nix_kill(child.id(), "TERM");
    assert!(child.wait().unwrap().success());
    // The refusal named the line and the capability it lacks.
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    let refusal = log.lines().find(|l| l.contains("listen_port=80")).unwrap_or_else(|| panic!("no refusal: {log}"));
    assert!(refusal.contains("CAP_NET_BIND_SERVICE") && refusal.contains("--user"), "{refusal}");
    wait_for(|| !socket_of(&name).exists(), "the keeper to remove the socket");
    drop(b);
}

/// WireGuard's netns selftest as wireguard-go ships it for userspace implementations (`tests/netns.sh` of the
/// wireguard-go module that `make peers` builds, run as it is, not copied here): three namespaces, the devices'
/// sockets in one and the devices moved to the others, pings and iperf3 both ways over IPv4 and IPv6, roaming
/// between addresses and families, a NAT in the middle with a persistent keepalive, port and endpoint changes,
/// and tables of 130,000 allowed prefixes. It passes whole against `turbotun-wg`.
#[test]
fn wireguard_gos_netns_selftest_passes_against_turbotun_wg() {
    let test = "wireguard_gos_netns_selftest_passes_against_turbotun_wg";
    if !common::can_run(test, &[("ncat", "ncat"), ("iptables", "iptables"), ("iperf3", "iperf3"), ("ss", "iproute2")]) {
        return;
    }
    let version_file = wireguard_go().with_extension("version");
    let version = std::fs::read_to_string(&version_file).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../bench/peers/gopath/pkg/mod/golang.zx2c4.com")
        .join(format!("wireguard@{}", version.trim()))
        .join("tests/netns.sh");
    assert!(script.is_file(), "{} (the wireguard-go module, `make peers`)", script.display());
    let dir = private_dir();
    let out = Command::new("bash").arg(&script).arg(TURBOTUN_WG).current_dir(dir.path()).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let tail: Vec<&str> = text.lines().filter(|l| !l.contains("DEBUG")).rev().take(30).collect();
    assert!(
        out.status.success(),
        "netns.sh failed ({}); its last lines, newest first:\n{}",
        out.status,
        tail.join("\n")
    );
}
