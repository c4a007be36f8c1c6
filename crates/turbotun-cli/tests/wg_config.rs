//! `turbotun wg`'s configuration as `wg` drives it, held to WireGuard's semantics (the kernel's, with wireguard-go
//! as the oracle): AllowedIPs where the last assignment wins, our own key never a peer, the private key clamped,
//! link-local endpoints and interface name templates, keys kept out of logs and out of reach of `/proc`, the
//! configuration socket under slow and huge clients; and a differential test that applies one pseudo-random
//! sequence of `wg` commands to turbotun and to wireguard-go and compares `wg show dump` after each step.
//! Each test builds its own namespaces and removes what it made (processes and socket files) however it ends.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine;
use common::wg::{nix_kill, private_dir, socket_of, unique, wait_for, wg, wg_status, Endpoint, Impl, TURBOTUN};
use common::{new_netns, ns_path, pattern, privileged, run_within};
use turbotun::netlink::Netlink;
use turbotun::netns::with_netns;

fn base64_of(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A key as `wg` writes it (base64) in the hex of the configuration protocol.
fn hex_of(key: &str) -> String {
    let bytes = base64::engine::general_purpose::STANDARD.decode(key).expect("a base64 key");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key pair from given private key bytes (not clamped: that is the endpoint's job), the private key in a file.
struct KeyPair {
    private: String,
    public: String,
    file: PathBuf,
}

fn key_pair(dir: &Path, name: &str, private: &[u8]) -> KeyPair {
    let private = base64_of(private);
    let mut pubkey = Command::new("wg").arg("pubkey").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    pubkey.stdin.take().unwrap().write_all(private.as_bytes()).unwrap();
    let out = pubkey.wait_with_output().unwrap();
    assert!(out.status.success(), "wg pubkey");
    let public = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let file = dir.join(name);
    std::fs::write(&file, &private).unwrap();
    KeyPair { private, public, file }
}

/// One request on the configuration socket of `name`; the reply without the empty line that ends it.
fn uapi(name: &str, request: &str) -> String {
    let mut stream = UnixStream::connect(socket_of(name)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut reply = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line == "\n" {
            return reply;
        }
        reply.push_str(&line);
    }
}

/// `wg show NAME dump`, without what traffic changes (handshake times, byte counts).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dump {
    private_key: String,
    public_key: String,
    listen_port: String,
    fwmark: String,
    peers: BTreeMap<String, PeerDump>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PeerDump {
    preshared_key: String,
    endpoint: String,
    allowed_ips: BTreeSet<String>,
    persistent_keepalive: String,
}

fn dump(ns: &OwnedFd, name: &str) -> Dump {
    let text = wg(ns, &["show", name, "dump"]);
    let mut lines = text.lines();
    let device: Vec<&str> = lines.next().expect("the interface line").split('\t').collect();
    assert_eq!(device.len(), 4, "{text}");
    let peers = lines
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            assert_eq!(f.len(), 8, "{text}");
            let allowed_ips = match f[3] {
                "(none)" => BTreeSet::new(),
                list => list.split(',').map(str::to_string).collect(),
            };
            let peer = PeerDump {
                preshared_key: f[1].into(),
                endpoint: f[2].into(),
                allowed_ips,
                persistent_keepalive: f[7].into(),
            };
            (f[0].to_string(), peer)
        })
        .collect();
    Dump {
        private_key: device[0].into(),
        public_key: device[1].into(),
        listen_port: device[2].into(),
        fwmark: device[3].into(),
        peers,
    }
}

/// Starts `turbotun wg -f NAME` in `ns` with more environment (the endpoint is stopped and its socket removed
/// however the test ends).
fn turbotun_with_env(ns: &OwnedFd, name: &str, env: &[(&str, &str)]) -> Endpoint {
    let mut command = Command::new(TURBOTUN);
    command.args(["wg", "-f", name]).envs(env.iter().copied());
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = with_netns(&ns_path(ns), || command.spawn()).unwrap().expect("starting turbotun wg");
    let endpoint = Endpoint::of(ns, name, child);
    wait_for(|| UnixStream::connect(socket_of(name)).is_ok(), "the configuration socket");
    endpoint
}

#[test]
fn moving_a_prefix_back_gives_it_back() {
    if !privileged("moving_a_prefix_back_gives_it_back") {
        return;
    }
    let ns = new_netns();
    let name = unique("wgm");
    let endpoint = Endpoint::start(&ns, Impl::Turbotun, &name);
    let dir = private_dir();
    let (a, b) = (key_pair(dir.path(), "a", &pattern(32, 1)), key_pair(dir.path(), "b", &pattern(32, 2)));
    let prefixes = |who: &KeyPair| dump(&ns, &name).peers[&who.public].allowed_ips.clone();
    let one = |text: &str| BTreeSet::from([text.to_string()]);
    // The issue's sequence: A, then B, then A again is given 10.9.0.0/24. A has it; B's access is revoked.
    for who in [&a, &b, &a] {
        wg(&ns, &["set", &name, "peer", &who.public, "allowed-ips", "10.9.0.0/24"]);
    }
    assert_eq!((prefixes(&a), prefixes(&b)), (one("10.9.0.0/24"), BTreeSet::new()), "A was given it last");
    // setconf and syncconf: within one request too, the later assignment wins whatever the peers' order.
    for (verb, first, second) in [("setconf", &b, &a), ("syncconf", &a, &b), ("addconf", &b, &a)] {
        let conf = dir.path().join(format!("{verb}.conf"));
        let text = format!(
            "[Interface]\nListenPort = 51820\n\n[Peer]\nPublicKey = {}\nAllowedIPs = 10.9.0.0/24, 10.7.0.0/16\n\n\
             [Peer]\nPublicKey = {}\nAllowedIPs = 10.9.0.0/24\n",
            first.public, second.public
        );
        std::fs::write(&conf, text).unwrap();
        wg(&ns, &[verb, &name, conf.to_str().unwrap()]);
        assert_eq!((prefixes(first), prefixes(second)), (one("10.7.0.0/16"), one("10.9.0.0/24")), "{verb}");
    }
    // Removing the prefix from the peer that does not hold it changes nothing; from its holder, removes it.
    let remove =
        |who: &KeyPair| uapi(&name, &format!("set=1\npublic_key={}\nallowed_ip=-10.9.0.0/24\n\n", hex_of(&who.public)));
    assert_eq!(remove(&b), "errno=0\n");
    assert_eq!(prefixes(&a), one("10.9.0.0/24"));
    assert_eq!(remove(&a), "errno=0\n");
    assert_eq!((prefixes(&a), prefixes(&b)), (BTreeSet::new(), one("10.7.0.0/16")));
    endpoint.stop();
}

#[test]
fn the_private_key_is_shown_clamped_and_our_own_key_is_never_a_peer() {
    if !privileged("the_private_key_is_shown_clamped_and_our_own_key_is_never_a_peer") {
        return;
    }
    let ns = new_netns();
    let name = unique("wgk");
    let endpoint = Endpoint::start(&ns, Impl::Turbotun, &name);
    let dir = private_dir();
    // All bits set: clamping clears the low three bits of the first byte and the top bit of the last.
    let me = key_pair(dir.path(), "me", &[0xff; 32]);
    wg(&ns, &["set", &name, "private-key", me.file.to_str().unwrap()]);
    let mut clamped = [0xff; 32];
    clamped[0] = 0xf8;
    clamped[31] = 0x7f;
    assert_eq!(wg(&ns, &["show", &name, "private-key"]).trim(), base64_of(&clamped));
    assert_eq!(wg(&ns, &["show", &name, "public-key"]).trim(), me.public);
    // A peer with our own public key is not added.
    wg(&ns, &["set", &name, "peer", &me.public, "allowed-ips", "10.1.0.0/16"]);
    assert_eq!(wg(&ns, &["show", &name, "peers"]).trim(), "", "our own key became a peer");
    // A peer whose key becomes ours is removed; the others stay.
    let (other, stays) = (key_pair(dir.path(), "o", &pattern(32, 3)), key_pair(dir.path(), "s", &pattern(32, 4)));
    for peer in [&other, &stays] {
        wg(&ns, &["set", &name, "peer", &peer.public, "endpoint", "192.0.2.1:51820"]);
    }
    wg(&ns, &["set", &name, "private-key", other.file.to_str().unwrap()]);
    assert_eq!(wg(&ns, &["show", &name, "peers"]).trim(), stays.public, "the peer with our new key is gone");
    // Without a private key the interface has no key of its own, so no peer is refused, as in the kernel (which
    // has no identity then). wireguard-go differs here: it keeps refusing the public key of the all-zero key.
    wg(&ns, &["set", &name, "private-key", "/dev/null"]);
    let zero = key_pair(dir.path(), "zero", &[0; 32]);
    wg(&ns, &["set", &name, "peer", &zero.public]);
    assert!(wg(&ns, &["show", &name, "peers"]).contains(&zero.public), "a peer refused with no key of our own");
    endpoint.stop();
}

#[test]
fn a_link_local_endpoint_with_its_scope_is_taken_and_read_back() {
    if !privileged("a_link_local_endpoint_with_its_scope_is_taken_and_read_back") {
        return;
    }
    let ns = new_netns();
    let name = unique("wgl");
    let endpoint = Endpoint::start(&ns, Impl::Turbotun, &name);
    let (near, far) = (unique("ll"), unique("lf"));
    let mut nl = Netlink::in_netns(&ns_path(&ns)).unwrap();
    nl.create_veth(&near, &far).unwrap();
    let dir = private_dir();
    let (p, q) = (key_pair(dir.path(), "p", &pattern(32, 5)), key_pair(dir.path(), "q", &pattern(32, 6)));
    // What `wg` sends for a scope by name: `endpoint=[fe80::1%NAME]:51820`.
    let by_name = format!("[fe80::1%{near}]:51820");
    let set = wg_status(&ns, &["set", &name, "peer", &p.public, "endpoint", &by_name]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    // A scope by number, on the socket directly (1 is lo in every namespace).
    let reply = uapi(&name, &format!("set=1\npublic_key={}\nendpoint=[fe80::2%1]:7\n\n", hex_of(&q.public)));
    assert_eq!(reply, "errno=0\n");
    // `get` renders each so that `wg` reads it back to the same address and scope.
    let endpoints = wg(&ns, &["show", &name, "endpoints"]);
    assert!(endpoints.contains(&format!("{}\t{by_name}", p.public)), "{endpoints}");
    assert!(endpoints.contains(&format!("{}\t[fe80::2%lo]:7", q.public)), "{endpoints}");
    // An interface that does not exist: refused, nothing of the request applied.
    let before = dump(&ns, &name);
    let reply = uapi(
        &name,
        &format!("set=1\nlisten_port=51999\npublic_key={}\nendpoint=[fe80::1%nosuchif9]:1\n\n", hex_of(&p.public)),
    );
    assert_eq!(reply, "errno=-22\n");
    assert_eq!(dump(&ns, &name), before);
    endpoint.stop();
}

/// An endpoint `turbotun wg` started in the background: killed, and its socket files removed, on drop.
struct Background {
    pid: Option<u32>,
    sockets: Vec<PathBuf>,
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            nix_kill(pid, "KILL");
        }
        for socket in &self.sockets {
            let _ = std::fs::remove_file(socket);
        }
    }
}

#[test]
fn a_name_template_serves_the_socket_of_the_name_the_device_got() {
    if !privileged("a_name_template_serves_the_socket_of_the_name_the_device_got") {
        return;
    }
    let ns = new_netns();
    let prefix = unique("wt");
    let (template, given) = (format!("{prefix}%d"), format!("{prefix}0"));
    let mut background = Background { pid: None, sockets: vec![socket_of(&template), socket_of(&given)] };
    let started = with_netns(&ns_path(&ns), || {
        run_within(Command::new(TURBOTUN).args(["wg", &template]), Duration::from_secs(30))
    })
    .unwrap();
    // "turbotun wg: NAME up in the background (pid N)"
    background.pid = started.stderr.split("(pid ").nth(1).and_then(|rest| rest.split(')').next()?.parse().ok());
    assert!(started.status.success() && background.pid.is_some(), "{}", started.stderr);
    assert!(started.stderr.contains(&format!("turbotun wg: {given} up")), "the name it got: {}", started.stderr);
    assert!(socket_of(&given).exists(), "{} is served", given);
    assert!(!socket_of(&template).exists(), "no socket named after the template");
    assert!(wg(&ns, &["show", &given]).contains("listening port"));
    nix_kill(background.pid.unwrap(), "TERM");
    wait_for(|| !socket_of(&given).exists(), "the endpoint to remove its socket");
}

#[test]
fn refused_lines_are_logged_without_their_keys() {
    if !privileged("refused_lines_are_logged_without_their_keys") {
        return;
    }
    let ns = new_netns();
    let name = unique("wgs");
    let mut endpoint = turbotun_with_env(&ns, &name, &[("RUST_LOG", "debug")]);
    let mut stderr = endpoint.child.as_mut().unwrap().stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let secret = hex_of(&base64_of(&pattern(32, 7)));
    let peer = format!("public_key={}", hex_of(&base64_of(&pattern(32, 8))));
    for (request, errno) in [
        (format!("set=1\n{peer}\nprivate_key={secret}\n\n"), libc::EINVAL), // a device key in a peer section
        (format!("set=1\nprivate_key={secret}00\n\n"), libc::EINVAL),       // one byte too long
        (format!("set=1\n{peer}\npreshared_key={secret}zz\n\n"), libc::EINVAL),
        (format!("set=1\n{secret}\n\n"), libc::EPROTO), // a key on a line of its own
        (format!("set=1\nprivatekey={secret}\n\n"), libc::EINVAL), // misspelt
    ] {
        assert_eq!(uapi(&name, &request), format!("errno=-{errno}\n"), "{request:?}");
    }
    endpoint.stop();
    let log = log.join().unwrap();
    assert!(log.contains("configuration refused"), "the refusals are logged: {log}");
    assert!(!log.contains(&secret[..16]), "a key in the log: {log}");
}

/// `ip link del NAME` and at once a new endpoint of that name (as WireGuard's netns selftest does): the old
/// endpoint is still ending and still serves the socket for a moment; the new one waits for it and comes up,
/// where it once refused ("is in use").
#[test]
fn a_new_endpoint_starts_at_once_after_the_old_ones_device_is_deleted() {
    if !privileged("a_new_endpoint_starts_at_once_after_the_old_ones_device_is_deleted") {
        return;
    }
    let ns = new_netns();
    let name = unique("wgr");
    let start = || {
        with_netns(&ns_path(&ns), || Command::new(TURBOTUN).args(["wg", &name]).stdin(Stdio::null()).output())
            .unwrap()
            .expect("turbotun wg")
    };
    for round in 0..3 {
        let started = start();
        assert!(started.status.success(), "round {round}: {}", String::from_utf8_lossy(&started.stderr));
        Netlink::in_netns(&ns_path(&ns)).unwrap().delete_link(&name).unwrap();
    }
    wait_for(|| !socket_of(&name).exists(), "the last endpoint to end and remove its socket");
}

#[test]
fn the_endpoint_is_not_dumpable() {
    if !privileged("the_endpoint_is_not_dumpable") {
        return;
    }
    // A shell without CAP_SYS_PTRACE starts two children of the same user and capabilities, a control and the
    // endpoint, and then opens each one's memory itself (/proc/PID/mem needs what a ptrace attach needs). Being
    // their parent satisfies Yama's ptrace_scope=1 (Ubuntu's default), so only the target's dumpable flag
    // decides, whatever the distribution.
    const OPENER: &str = r#"
        sleep 60 & control=$!
        "$@" & target=$!
        echo "$target"
        read -r go
        for pid in $control $target; do
            if exec 3< "/proc/$pid/mem"; then echo open; exec 3<&-; else echo closed; fi
        done 2>/dev/null
        kill $control
        wait $target
    "#;
    let ns = new_netns();
    let name = unique("wgd");
    let mut command = Command::new("setpriv");
    command
        .args(["--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace", "bash", "-c", OPENER, "bash"])
        .args([TURBOTUN, "wg", "-f", &name])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut shell = with_netns(&ns_path(&ns), || command.spawn()).unwrap().expect("setpriv (util-linux) and bash");
    let mut lines = BufReader::new(shell.stdout.take().unwrap()).lines();
    let pid: u32 = lines.next().unwrap().unwrap().trim().parse().unwrap();
    let _shell = common::Running(Some(shell));
    wait_for(|| UnixStream::connect(socket_of(&name)).is_ok(), "the configuration socket");
    _shell.0.as_ref().unwrap().stdin.as_ref().unwrap().write_all(b"go\n").unwrap();
    let (control, endpoint) = (lines.next().unwrap().unwrap(), lines.next().unwrap().unwrap());
    // The check itself: an ordinary process started the same way can be read.
    assert_eq!(control, "open", "a dumpable process's memory does not open: the check proves nothing");
    assert_eq!(endpoint, "closed", "the endpoint's memory opens through /proc (PR_SET_DUMPABLE is not 0)");
    common::wg::nix_kill(pid, "TERM");
    wait_for(|| !socket_of(&name).exists(), "the endpoint to end and remove its socket");
}

/// Sets a sysctl of the whole machine (`fs.suid_dumpable` has no per-namespace copy) and puts it back when
/// dropped, however the test ends.
struct Sysctl {
    path: &'static str,
    was: String,
}

impl Sysctl {
    fn set(path: &'static str, value: &str) -> Sysctl {
        let was = std::fs::read_to_string(path).unwrap();
        std::fs::write(path, value).unwrap();
        Sysctl { path, was }
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, self.was.trim());
    }
}

/// The attack: with `fs.suid_dumpable` at 1, the kernel made a process dumpable again when it changed its uid, so
/// the endpoint run with `--user` had its memory (its keys) open to every process of that user, and at 2 a crash
/// wrote a core with them. Its `/proc/PID` files show it: a dumpable process's are its user's, a non-dumpable
/// one's root's.
#[test]
fn the_endpoint_stays_not_dumpable_after_dropping_to_its_user() {
    if !privileged("the_endpoint_stays_not_dumpable_after_dropping_to_its_user") {
        return;
    }
    let _sysctl = Sysctl::set("/proc/sys/fs/suid_dumpable", "1");
    let ns = new_netns();
    let name = unique("wgn");
    let endpoint = Endpoint::start_with(&ns, Impl::Turbotun, &name, &["--user", "nobody"]);
    let uid_line = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", endpoint.pid())).unwrap();
        status.lines().find(|l| l.starts_with("Uid:")).unwrap().to_string()
    };
    // The configuration socket is bound before the drop: the drop is seen in the kernel's view of the process.
    wait_for(|| !uid_line().split_whitespace().skip(1).any(|u| u == "0"), "the drop to nobody");
    let uid_line = uid_line();
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(format!("/proc/{}/environ", endpoint.pid())).unwrap().uid();
    assert_eq!(owner, 0, "the endpoint is dumpable after its drop to nobody ({uid_line}): its /proc files are theirs");
    endpoint.stop();
}

#[test]
fn a_slow_client_blocks_neither_wg_show_nor_the_stop_and_a_line_too_long_is_refused() {
    if !privileged("a_slow_client_blocks_neither_wg_show_nor_the_stop_and_a_line_too_long_is_refused") {
        return;
    }
    let ns = new_netns();
    let name = unique("wgt");
    let endpoint = Endpoint::start(&ns, Impl::Turbotun, &name);
    // A request of 9 MiB (more than the whole-request limit there was before requests were taken a line at a
    // time) whose last line is over the line limit (4 KiB): refused with EMSGSIZE, nothing of it applied.
    let mut huge = String::from("set=1\n");
    while huge.len() <= 9 << 20 {
        huge.push_str("fwmark=7\n");
    }
    let request = |text: String| {
        let stream = UnixStream::connect(socket_of(&name)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut writer = stream.try_clone().unwrap();
        let writing = std::thread::spawn(move || writer.write_all(text.as_bytes()));
        let mut reply = String::new();
        BufReader::new(stream).read_line(&mut reply).unwrap();
        let _ = writing.join();
        reply
    };
    let too_long = format!("{huge}fwmark=8{}\n\n", "0".repeat(5000));
    assert_eq!(request(too_long), format!("errno=-{}\n", libc::EMSGSIZE));
    assert_eq!(wg(&ns, &["show", &name, "fwmark"]).trim(), "off");
    // Without that line, the whole of it is taken.
    assert_eq!(request(format!("{huge}\n")), "errno=0\n");
    assert_eq!(wg(&ns, &["show", &name, "fwmark"]).trim(), "0x7");
    // A client that sends a byte every 200 ms and never finishes its request.
    let mut slow = UnixStream::connect(socket_of(&name)).unwrap();
    slow.write_all(b"set=1\nfwmark=").unwrap();
    let trickling = std::thread::spawn(move || {
        for _ in 0..300 {
            if slow.write_all(b"1").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    // `wg show` from another client is answered meanwhile (before, it waited for the slow client, whose every
    // byte renewed a per-read timeout).
    let show =
        with_netns(&ns_path(&ns), || run_within(Command::new("wg").args(["show", &name]), Duration::from_secs(15)))
            .unwrap();
    assert!(show.status.success() && show.stdout.contains("listening port"), "{}", show.stderr);
    // SIGTERM ends the endpoint while the slow client still trickles; the socket goes with it.
    let pid = endpoint.pid();
    let mut endpoint = endpoint;
    let mut child = endpoint.child.take().unwrap();
    nix_kill(pid, "TERM");
    let exited = (0..150).find_map(|_| {
        std::thread::sleep(Duration::from_millis(100));
        child.try_wait().unwrap()
    });
    if exited.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(exited.is_some_and(|s| s.success()), "the endpoint did not exit within 15 s of SIGTERM: {exited:?}");
    assert!(!socket_of(&name).exists(), "the socket is removed");
    trickling.join().unwrap();
}

// ---------------------------------------------------------------------------------------------------------------
// The differential test.

/// A deterministic pseudo-random sequence (xorshift), so that a failure reproduces.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    /// True one time in `n`.
    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// What the steps draw from: few of each, so that they collide (a prefix given twice, the device's key equal to a
/// peer's, a peer removed and added again).
struct Pool {
    keys: Vec<KeyPair>,
    /// Preshared key files, and /dev/null (none).
    psk_files: Vec<String>,
    psks: Vec<String>,
    prefixes: &'static [&'static str],
    endpoints: &'static [&'static str],
    keepalives: &'static [&'static str],
    ports: &'static [&'static str],
    fwmarks: &'static [&'static str],
}

/// One step: `wg` with these arguments (`NAME` stands for the interface), or a request on the socket itself.
enum Action {
    Wg(Vec<String>),
    Uapi(String),
}

const NAME: &str = "NAME";

fn allowed_ips(rng: &mut Rng, pool: &Pool) -> Vec<&'static str> {
    (0..rng.below(4)).map(|_| *rng.pick(pool.prefixes)).collect()
}

/// A configuration file for setconf, syncconf or addconf.
fn config_file(rng: &mut Rng, pool: &Pool) -> String {
    let mut text = String::from("[Interface]\n");
    if !rng.one_in(3) {
        text += &format!("PrivateKey = {}\n", rng.pick(&pool.keys).private);
    }
    if rng.one_in(2) {
        text += &format!("ListenPort = {}\n", rng.pick(pool.ports));
    }
    if rng.one_in(3) {
        text += &format!("FwMark = {}\n", rng.pick(pool.fwmarks));
    }
    for _ in 0..rng.below(4) {
        text += &format!("\n[Peer]\nPublicKey = {}\n", rng.pick(&pool.keys).public);
        if rng.one_in(3) {
            text += &format!("PresharedKey = {}\n", rng.pick(&pool.psks));
        }
        if rng.one_in(2) {
            text += &format!("Endpoint = {}\n", rng.pick(pool.endpoints));
        }
        if rng.one_in(3) {
            text += &format!("PersistentKeepalive = {}\n", rng.pick(pool.keepalives));
        }
        let ips = allowed_ips(rng, pool);
        if !ips.is_empty() {
            text += &format!("AllowedIPs = {}\n", ips.join(", "));
        }
    }
    text
}

/// The next step, described in words for a failure message.
fn next_step(rng: &mut Rng, pool: &Pool, dir: &Path, index: usize) -> (String, Action) {
    let args = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    match rng.below(9) {
        0 => {
            let mut a = args(&["set", NAME]);
            if rng.one_in(2) {
                a.extend(args(&["listen-port", *rng.pick(pool.ports)]));
            }
            if rng.one_in(2) {
                a.extend(args(&["fwmark", *rng.pick(pool.fwmarks)]));
            }
            if a.len() == 2 || rng.one_in(2) {
                let file = if rng.one_in(5) { "/dev/null" } else { rng.pick(&pool.keys).file.to_str().unwrap() };
                a.extend(args(&["private-key", file]));
            }
            (format!("wg {}", a.join(" ")), Action::Wg(a))
        }
        1..=4 => {
            let mut a = args(&["set", NAME]);
            for _ in 0..1 + rng.below(2) {
                a.extend(args(&["peer", rng.pick(&pool.keys).public.as_str()]));
                if rng.one_in(5) {
                    a.push("remove".into());
                    continue;
                }
                if rng.one_in(3) {
                    a.extend(args(&["preshared-key", rng.pick(&pool.psk_files).as_str()]));
                }
                if rng.one_in(2) {
                    a.extend(args(&["endpoint", *rng.pick(pool.endpoints)]));
                }
                if rng.one_in(3) {
                    a.extend(args(&["persistent-keepalive", *rng.pick(pool.keepalives)]));
                }
                if rng.one_in(2) {
                    a.extend(args(&["allowed-ips", &allowed_ips(rng, pool).join(",")]));
                }
            }
            (format!("wg {}", a.join(" ")), Action::Wg(a))
        }
        5..=7 => {
            let verb = *rng.pick(&["setconf", "syncconf", "addconf"]);
            let text = config_file(rng, pool);
            let file = dir.join(format!("step{index}.conf"));
            std::fs::write(&file, &text).unwrap();
            let a = args(&[verb, NAME, file.to_str().unwrap()]);
            (format!("wg {verb} NAME with\n{text}"), Action::Wg(a))
        }
        _ => {
            // `allowed_ip=-PREFIX` (which this `wg` does not send), for a peer that may not exist or not hold it.
            let peer = hex_of(&rng.pick(&pool.keys).public);
            let update_only = if rng.one_in(2) { "update_only=true\n" } else { "" };
            let request = format!("set=1\npublic_key={peer}\n{update_only}allowed_ip=-{}\n\n", rng.pick(pool.prefixes));
            (format!("the request {request:?}"), Action::Uapi(request))
        }
    }
}

/// Whether a listen port is one the system chose (`listen-port 0`, or a configuration without one): any free
/// port of the ephemeral range, different on each side.
fn chosen_by_the_system(port: &str) -> bool {
    port.parse::<u16>().is_ok_and(|p| p >= 32768)
}

/// The differences between two dumps, one a line.
fn differences(t: &Dump, g: &Dump) -> Vec<String> {
    let mut out = Vec::new();
    let same_port = t.listen_port == g.listen_port
        || (chosen_by_the_system(&t.listen_port) && chosen_by_the_system(&g.listen_port));
    if !same_port {
        out.push(format!("listen port: turbotun {}, wireguard-go {}", t.listen_port, g.listen_port));
    }
    for (what, a, b) in [
        ("private key", &t.private_key, &g.private_key),
        ("public key", &t.public_key, &g.public_key),
        ("fwmark", &t.fwmark, &g.fwmark),
    ] {
        if a != b {
            out.push(format!("{what}: turbotun {a}, wireguard-go {b}"));
        }
    }
    let keys: BTreeSet<&String> = t.peers.keys().chain(g.peers.keys()).collect();
    for key in keys {
        match (t.peers.get(key), g.peers.get(key)) {
            (Some(a), Some(b)) if a != b => out.push(format!("peer {key}: turbotun {a:?}, wireguard-go {b:?}")),
            (Some(_), None) => out.push(format!("peer {key}: only turbotun has it")),
            (None, Some(_)) => out.push(format!("peer {key}: only wireguard-go has it")),
            _ => {}
        }
    }
    out
}

/// One pseudo-random sequence of `wg set` (device and peers, `remove`), `setconf`, `syncconf`, `addconf` and
/// `allowed_ip=-PREFIX` requests, applied to turbotun and to wireguard-go alike; `wg show dump` must agree after
/// every step (keys, port, fwmark, and per peer its preshared key, endpoint, allowed IPs and keepalive).
///
/// For every command drawn here the kernel and wireguard-go mean the same, so wireguard-go stands for the kernel.
/// The one difference known is kept out of the pool: after `private-key /dev/null` (no key), wireguard-go still
/// treats the public key of the all-zero key, clamped, as the interface's own (it ignores and removes a peer
/// with it), while the kernel has no identity then and takes such a peer; turbotun does as the kernel.
#[test]
fn the_same_wg_commands_leave_turbotun_and_wireguard_go_alike() {
    if !privileged("the_same_wg_commands_leave_turbotun_and_wireguard_go_alike") {
        return;
    }
    // Another sequence: TURBOTUN_WG_DIFF_SEED=N (the failure message names the seed of the one that failed).
    let seed = std::env::var("TURBOTUN_WG_DIFF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x2026_0026_u64);
    const STEPS: usize = 48;
    // Each in a private namespace of its own: the same listen ports do not collide, and the endpoints of the
    // pool lead nowhere (no route), so nothing is sent anywhere.
    let (ns_t, ns_g) = (new_netns(), new_netns());
    let (name_t, name_g) = (unique("wdt"), unique("wdg"));
    let turbotun = Endpoint::start(&ns_t, Impl::Turbotun, &name_t);
    let wireguard_go = Endpoint::start(&ns_g, Impl::WireguardGo, &name_g);
    let dir = private_dir();
    // Private keys of random bytes, not clamped, so that the clamping shows.
    let keys: Vec<KeyPair> = (0..5).map(|i| key_pair(dir.path(), &format!("k{i}"), &pattern(32, 100 + i))).collect();
    let psks: Vec<String> = (0..2).map(|i| base64_of(&pattern(32, 200 + i))).collect();
    let mut psk_files: Vec<String> = psks
        .iter()
        .enumerate()
        .map(|(i, psk)| {
            let file = dir.path().join(format!("psk{i}"));
            std::fs::write(&file, psk).unwrap();
            file.to_str().unwrap().to_string()
        })
        .collect();
    psk_files.push("/dev/null".into());
    let pool = Pool {
        keys,
        psk_files,
        psks,
        // A prefix with host bits set is the same prefix as its network.
        prefixes: &[
            "10.9.0.0/24",
            "10.9.0.77/24",
            "10.9.0.0/16",
            "10.9.1.0/24",
            "0.0.0.0/0",
            "fd00::/64",
            "fd00::9/48",
        ],
        endpoints: &["192.0.2.1:51820", "192.0.2.2:1", "[2001:db8::1]:51820"],
        keepalives: &["off", "0", "1", "25"],
        // Below the ephemeral range (32768 and up), where a port the system chose cannot be one of these.
        ports: &["21820", "21821", "20000"],
        fwmarks: &["0", "1", "0x51", "off"],
    };
    // The first step sets a port: until then each shows its own (turbotun a port it chose, wireguard-go 0).
    let words = |line: &str| line.split(' ').map(str::to_string).collect::<Vec<_>>();
    let mut steps =
        vec![("wg set NAME listen-port 51820".to_string(), Action::Wg(words("set NAME listen-port 51820")))];
    let mut rng = Rng(seed | 1);
    steps.extend((1..STEPS).map(|index| next_step(&mut rng, &pool, dir.path(), index)));
    let mut history = Vec::new();
    for (index, (described, action)) in steps.iter().enumerate() {
        history.push(format!("{index}: {described}"));
        let outcome = |ns: &OwnedFd, name: &str| -> String {
            match action {
                Action::Wg(words) => {
                    let words: Vec<String> =
                        words.iter().map(|w| if w == NAME { name.to_string() } else { w.clone() }).collect();
                    let words: Vec<&str> = words.iter().map(String::as_str).collect();
                    let out = wg_status(ns, &words);
                    if out.status.success() {
                        "ok".into()
                    } else {
                        "refused".into()
                    }
                }
                Action::Uapi(request) => uapi(name, request),
            }
        };
        let (result_t, result_g) = (outcome(&ns_t, &name_t), outcome(&ns_g, &name_g));
        let (t, g) = (dump(&ns_t, &name_t), dump(&ns_g, &name_g));
        let mut diffs = differences(&t, &g);
        if result_t != result_g {
            diffs.insert(0, format!("the command: turbotun {result_t:?}, wireguard-go {result_g:?}"));
        }
        assert!(
            diffs.is_empty(),
            "step {index} ({described}) leaves them different:\n  {}\nturbotun: {t:#?}\nwireguard-go: {g:#?}\nthe steps \
             (TURBOTUN_WG_DIFF_SEED={seed}):\n{}",
            diffs.join("\n  "),
            history.join("\n")
        );
    }
    turbotun.stop();
    drop(wireguard_go);
}
