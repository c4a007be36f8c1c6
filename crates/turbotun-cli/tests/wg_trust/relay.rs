//! The relay between the client and the server, and the servers and underlays the attacks run over.

use super::*;

pub(crate) const SERVER_PORT: u16 = 51820;

/// The server under test: `turbotun wg`, or with `WG_TRUST_SERVER=wireguard-go` the oracle in its place, to
/// check the tests themselves (what only turbotun has, its counters, is then not looked at).
pub(crate) fn server_impl() -> Impl {
    match std::env::var("WG_TRUST_SERVER").as_deref() {
        Ok("wireguard-go") => Impl::WireguardGo,
        _ => Impl::Turbotun,
    }
}

/// The counters `turbotun wg` printed when stopped; `None` for the oracle.
pub(crate) fn stop_server(server: Endpoint) -> Option<serde_json::Value> {
    let out = server.stop();
    (server_impl() == Impl::Turbotun).then(|| counters(&out))
}
pub(crate) const CLIENT_PORT: u16 = 51821;

/// The underlay address of side `i` (10.201.0.(10 + i), or fd01::(10 + i) on an IPv6 underlay).
pub(crate) fn underlay_ip(i: usize, v6: bool) -> IpAddr {
    if v6 { format!("fd01::{}", 10 + i) } else { format!("10.201.0.{}", 10 + i) }.parse().unwrap()
}

pub(crate) fn decode_key(base64: &str) -> [u8; 32] {
    base64::engine::general_purpose::STANDARD.decode(base64).unwrap().try_into().unwrap()
}

pub(crate) fn encode_key(key: &[u8; 32]) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

/// What passed the relay, and what it is to do with what comes next.
#[derive(Default)]
pub(crate) struct RelayState {
    /// Where the client is: told at the start, or the source of its last datagram.
    pub(crate) client: Option<SocketAddr>,
    /// Every datagram in the order it came: from the client (`true`) or the server, when, its bytes.
    pub(crate) seen: Vec<(bool, Instant, Vec<u8>)>,
    /// Drop everything, both ways.
    pub(crate) blocked: bool,
    /// Hold back the client's next transport message that carries data...
    pub(crate) hold_next: bool,
    pub(crate) held: Option<Vec<u8>>,
    /// ...and pass it on once this many later ones went on.
    pub(crate) release_after: u64,
    pub(crate) passed_since_hold: u64,
    /// The held message, once passed on.
    pub(crate) released: Option<Vec<u8>>,
    /// The source of each datagram from the server, in the order they came (the server answers from one of its
    /// addresses, on its port).
    pub(crate) server_sources: Vec<SocketAddr>,
}

/// A UDP relay in the client's namespace: the client's endpoint for the server is [`Relay::inner`]; the relay
/// passes each datagram on to the server from [`Relay::outer`] (where the server sees the client) and the
/// server's answers back to the client. Its threads end when it is dropped.
pub(crate) struct Relay {
    pub(crate) inner: SocketAddr,
    pub(crate) outer: SocketAddr,
    pub(crate) server: SocketAddr,
    pub(crate) outer_socket: Arc<UdpSocket>,
    pub(crate) state: Arc<Mutex<RelayState>>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) threads: Vec<JoinHandle<()>>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Relay {
    pub(crate) fn start(
        ns: &OwnedFd,
        inner_ip: IpAddr,
        outer_ip: IpAddr,
        server: SocketAddr,
        client: SocketAddr,
    ) -> Relay {
        let (inner, outer) = with_netns(&ns_path(ns), || {
            (UdpSocket::bind((inner_ip, 0)).unwrap(), UdpSocket::bind((outer_ip, 0)).unwrap())
        })
        .unwrap();
        for s in [&inner, &outer] {
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        }
        let (inner, outer) = (Arc::new(inner), Arc::new(outer));
        let state = Arc::new(Mutex::new(RelayState { client: Some(client), ..Default::default() }));
        let stop = Arc::new(AtomicBool::new(false));
        let to_server = {
            let (inner, outer, state, stop) = (inner.clone(), outer.clone(), state.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = inner.recv_from(&mut buf) else { continue };
                    let data = buf[..n].to_vec();
                    let mut s = state.lock().unwrap();
                    s.client = Some(from);
                    s.seen.push((true, Instant::now(), data.clone()));
                    if s.blocked {
                        continue;
                    }
                    // A keepalive (an empty transport message, 32 bytes) is never the one held back.
                    if s.hold_next && msg::transport_receiver(&data).is_some() && data.len() > 32 {
                        s.hold_next = false;
                        s.held = Some(data);
                        continue;
                    }
                    let _ = outer.send_to(&data, server);
                    if s.held.is_some() {
                        s.passed_since_hold += 1;
                        if s.passed_since_hold >= s.release_after {
                            let held = s.held.take().unwrap();
                            let _ = outer.send_to(&held, server);
                            s.released = Some(held);
                        }
                    }
                }
            })
        };
        let to_client = {
            let (inner, outer, state, stop) = (inner.clone(), outer.clone(), state.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = outer.recv_from(&mut buf) else { continue };
                    // From any of the server's addresses: which one it answers from is what some tests look at.
                    if from.port() != server.port() {
                        continue;
                    }
                    let mut s = state.lock().unwrap();
                    s.seen.push((false, Instant::now(), buf[..n].to_vec()));
                    s.server_sources.push(from);
                    if let (false, Some(client)) = (s.blocked, s.client) {
                        let _ = inner.send_to(&buf[..n], client);
                    }
                }
            })
        };
        Relay {
            inner: inner.local_addr().unwrap(),
            outer: outer.local_addr().unwrap(),
            server,
            outer_socket: outer,
            state,
            stop,
            threads: vec![to_server, to_client],
        }
    }

    /// How many datagrams it has seen: a mark for [`Self::datagrams`].
    pub(crate) fn mark(&self) -> usize {
        self.state.lock().unwrap().seen.len()
    }

    /// The datagrams from the client (`from_client`) or from the server since `mark`, with when they came.
    pub(crate) fn datagrams(&self, from_client: bool, mark: usize) -> Vec<(Instant, Vec<u8>)> {
        let s = self.state.lock().unwrap();
        s.seen[mark..].iter().filter(|(c, _, _)| *c == from_client).map(|(_, t, d)| (*t, d.clone())).collect()
    }

    pub(crate) fn block(&self, blocked: bool) {
        self.state.lock().unwrap().blocked = blocked;
    }

    /// Holds back the client's next transport message with data, and passes it on after `later` more.
    pub(crate) fn hold_next(&self, later: u64) {
        let mut s = self.state.lock().unwrap();
        (s.hold_next, s.release_after, s.passed_since_hold) = (true, later, 0);
    }

    pub(crate) fn released(&self) -> Option<Vec<u8>> {
        self.state.lock().unwrap().released.clone()
    }

    /// Sends `data` to the server as if it came from the client.
    pub(crate) fn send_to_server(&self, data: &[u8]) {
        self.outer_socket.send_to(data, self.server).unwrap();
    }

    /// Sends `data` from where the server sees the client to another address of the server's, `to`.
    pub(crate) fn send_from_client_to(&self, data: &[u8], to: SocketAddr) {
        self.outer_socket.send_to(data, to).unwrap();
    }

    /// How many datagrams came from the server so far: a mark for [`Self::server_sources`].
    pub(crate) fn server_mark(&self) -> usize {
        self.state.lock().unwrap().server_sources.len()
    }

    /// The sources of the server's datagrams since `mark`.
    pub(crate) fn server_sources(&self, mark: usize) -> Vec<SocketAddr> {
        self.state.lock().unwrap().server_sources[mark..].to_vec()
    }
}

/// A server (`turbotun wg`, or wireguard-go as the oracle) in `u.nss[1]` at 10.202.0.1 and a wireguard-go client
/// in `u.nss[2]` at 10.202.0.2, the client's datagrams through a [`Relay`] in its namespace.
pub(crate) struct ViaRelay {
    pub(crate) u: Underlay,
    pub(crate) server: Endpoint,
    pub(crate) client: Endpoint,
    pub(crate) relay: Relay,
    pub(crate) server_keys: Keys,
    pub(crate) _dir: tempfile::TempDir,
}

impl ViaRelay {
    pub(crate) fn server_ns(&self) -> &OwnedFd {
        &self.u.nss[1]
    }
    pub(crate) fn client_ns(&self) -> &OwnedFd {
        &self.u.nss[2]
    }
}

/// Adds the IPv6 underlay (fd01::(10 + i)/64 on side `i`) to `u`.
pub(crate) fn add_v6_underlay(u: &Underlay) {
    for (i, ns) in u.nss.iter().enumerate().skip(1) {
        Netlink::in_netns(&ns_path(ns)).unwrap().add_address(&u.names[i], underlay_ip(i, true), 64).unwrap();
    }
}

/// Sets up [`ViaRelay`] over an underlay of `sides` namespaces (the third, if any, is free for an attacker).
/// `server_knows_client`: the server's peer has the relay as its endpoint (else it learns it from the client);
/// `keepalive`: the server's persistent keepalive for it; `blocked`: the relay drops everything from the start.
pub(crate) fn via_relay(
    sides: usize,
    v6: bool,
    server: Impl,
    server_knows_client: bool,
    keepalive: u16,
    blocked: bool,
) -> ViaRelay {
    via_relay_to(sides, v6, server, server_knows_client, keepalive, blocked, underlay_ip(1, v6))
}

/// [`via_relay`] with the client talking to the server at `server_ip`: its underlay address, or a second one
/// given to it here.
pub(crate) fn via_relay_to(
    sides: usize,
    v6: bool,
    server: Impl,
    server_knows_client: bool,
    keepalive: u16,
    blocked: bool,
    server_ip: IpAddr,
) -> ViaRelay {
    let u = underlay(sides);
    if v6 {
        add_v6_underlay(&u);
    }
    if server_ip != underlay_ip(1, v6) {
        Netlink::in_netns(&ns_path(&u.nss[1])).unwrap().add_address(&u.names[1], server_ip, 24).unwrap();
    }
    let dir = private_dir();
    let (server_keys, client_keys) = (keys(dir.path(), "server.key"), keys(dir.path(), "client.key"));
    let (sn, cn) = (unique("wts"), unique("wtc"));
    let server = Endpoint::start(&u.nss[1], server, &sn);
    let client = Endpoint::start(&u.nss[2], Impl::WireguardGo, &cn);
    let loopback: IpAddr = if v6 { "::1" } else { "127.0.0.1" }.parse().unwrap();
    let relay = Relay::start(
        &u.nss[2],
        loopback,
        underlay_ip(2, v6),
        SocketAddr::new(server_ip, SERVER_PORT),
        SocketAddr::new(loopback, CLIENT_PORT),
    );
    relay.block(blocked);
    let (server_port, client_port) = (SERVER_PORT.to_string(), CLIENT_PORT.to_string());
    let (outer, inner, keepalive) = (relay.outer.to_string(), relay.inner.to_string(), keepalive.to_string());
    let mut set = vec!["set", &sn, "private-key", server_keys.private_file.to_str().unwrap(), "listen-port"];
    set.extend([server_port.as_str(), "peer", &client_keys.public, "allowed-ips", "10.202.0.2/32"]);
    if server_knows_client {
        set.extend(["endpoint", &outer]);
    }
    if keepalive != "0" {
        set.extend(["persistent-keepalive", &keepalive]);
    }
    wg(&u.nss[1], &set);
    let client_key = client_keys.private_file.to_str().unwrap();
    let set = ["set", &cn, "private-key", client_key, "listen-port", &client_port, "peer", &server_keys.public];
    wg(&u.nss[2], &[&set[..], &["endpoint", &inner, "allowed-ips", "10.202.0.1/32"]].concat());
    bring_up(&u.nss[1], &sn, "10.202.0.1");
    bring_up(&u.nss[2], &cn, "10.202.0.2");
    ViaRelay { u, server, client, relay, server_keys, _dir: dir }
}

/// `wg show NAME endpoints` in `ns`: the one peer's endpoint.
pub(crate) fn endpoint_of(ns: &OwnedFd, name: &str) -> String {
    wg(ns, &["show", name, "endpoints"]).split('\t').nth(1).unwrap_or_default().trim().to_string()
}
