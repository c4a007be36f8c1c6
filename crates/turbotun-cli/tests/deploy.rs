//! Deploying without privileges: `turbotun fwd --user` (devices opened as root, then every privilege dropped)
//! and `turbotun open --send-to` + `turbotun fwd --from-socket` (queues handed to a forwarder that never had a
//! privilege). Each carries TCP and UDP between two namespaces, compared byte for byte, while the test reads the
//! forwarder's identity from `/proc`.
//!
//! Every namespace here is private (never named in /run/netns) and vanishes with its devices when the test ends;
//! the socket lives in a private temporary directory removed at the end.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::{new_netns, ns_path, privileged, A4, A6, B4, B6};
use turbotun::netlink::Netlink;
use turbotun::netns::with_netns;
use turbotun::privilege::ThreadStatus;

const NOBODY: u32 = 65534;

fn turbotun() -> Command {
    Command::new(env!("CARGO_BIN_EXE_turbotun"))
}

/// `turbotun fwd [--mode MODE] --from-socket SOCKET`, run as nobody.
fn fwd_from_socket(mode: Option<&str>, socket: &Path) -> Command {
    let mut cmd = turbotun();
    cmd.args(["fwd", "--json"]);
    if let Some(mode) = mode {
        cmd.args(["--mode", mode]);
    }
    cmd.arg("--from-socket").arg(socket).uid(NOBODY).gid(NOBODY);
    cmd
}

/// Starts `cmd`, a forwarder that listens on `socket` (in namespace `ns` if given), stdout discarded, and waits
/// until it listens.
fn start_listening(ns: Option<&OwnedFd>, mut cmd: Command, socket: &Path, stderr: Stdio) -> Child {
    cmd.stdout(Stdio::null()).stderr(stderr);
    let child = match ns {
        Some(ns) => with_netns(&ns_path(ns), || cmd.spawn()).unwrap(),
        None => cmd.spawn(),
    }
    .unwrap();
    wait_for(socket);
    child
}

/// A forwarder process between devices `dev_a` and `dev_b`, which it holds in `ns_fwd`; killed and reaped on drop.
struct Topology {
    ns_a: OwnedFd,
    ns_b: OwnedFd,
    ns_fwd: OwnedFd,
    child: Option<Child>,
    stdout: Option<BufReader<ChildStdout>>,
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Topology {
    fn new() -> Topology {
        Topology { ns_a: new_netns(), ns_b: new_netns(), ns_fwd: new_netns(), child: None, stdout: None }
    }

    /// Starts `cmd` (a `turbotun fwd`) inside the forwarder's namespace.
    fn spawn(&mut self, mut cmd: Command) {
        let child = with_netns(&ns_path(&self.ns_fwd), || {
            cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn turbotun fwd")
        })
        .unwrap();
        self.child = Some(child);
    }

    /// Waits for `ready`, then moves the devices into A and B and configures them.
    fn connect(&mut self, dev_a: &str, dev_b: &str) {
        let mut stdout = BufReader::new(self.child.as_mut().unwrap().stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "forwarder announces readiness");
        self.stdout = Some(stdout);
        let mut nl = Netlink::in_netns(&ns_path(&self.ns_fwd)).unwrap();
        nl.move_to_netns(dev_a, &ns_path(&self.ns_a)).unwrap();
        nl.move_to_netns(dev_b, &ns_path(&self.ns_b)).unwrap();
        for (ns, dev, me4, peer4, me6, peer6) in
            [(&self.ns_a, dev_a, A4, "10.0.2.0", A6, "fd00:2::"), (&self.ns_b, dev_b, B4, "10.0.1.0", B6, "fd00:1::")]
        {
            let mut nl = Netlink::in_netns(&ns_path(ns)).unwrap();
            nl.add_address(dev, me4.parse().unwrap(), 24).unwrap();
            nl.add_address(dev, me6.parse().unwrap(), 64).unwrap();
            nl.set_up(dev, true).unwrap();
            nl.add_route(peer4.parse().unwrap(), 24, dev).unwrap();
            nl.add_route(peer6.parse().unwrap(), 64, dev).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = self.in_b(|| TcpListener::bind((B4, 4999)).unwrap());
        loop {
            let target: SocketAddr = (B4.parse::<IpAddr>().unwrap(), 4999).into();
            if self.in_a(|| TcpStream::connect_timeout(&target, Duration::from_millis(500)).is_ok()) {
                let _ = listener.accept();
                return;
            }
            assert!(Instant::now() < deadline, "B never became reachable through the forwarder");
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn in_a<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        with_netns(&ns_path(&self.ns_a), f).unwrap()
    }
    fn in_b<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        with_netns(&ns_path(&self.ns_b), f).unwrap()
    }

    /// The status of the process and of each of its threads, as `/proc` shows them.
    fn statuses(&self) -> Vec<(String, ThreadStatus)> {
        let pid = self.pid();
        let mut out = vec![(format!("/proc/{pid}/status"), ThreadStatus::read(format!("/proc/{pid}/status")).unwrap())];
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let path = task.unwrap().path().join("status");
            // A thread may end between the listing and the read.
            if let Ok(status) = ThreadStatus::read(&path) {
                out.push((path.display().to_string(), status));
            }
        }
        out
    }

    /// SIGTERM, then the counters line; the forwarder must exit 0.
    fn stop(self) -> serde_json::Value {
        let status = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status().unwrap();
        assert!(status.success());
        self.stop_without_signal()
    }

    /// The counters line once the forwarder ends (someone else signalled it); it must exit 0.
    fn stop_without_signal(mut self) -> serde_json::Value {
        let mut child = self.child.take().unwrap();
        let mut rest = String::new();
        self.stdout.take().unwrap().read_to_string(&mut rest).unwrap();
        let exit = child.wait().unwrap();
        assert!(exit.success(), "forwarder exits 0 after SIGTERM: {exit:?}");
        serde_json::from_str(rest.trim()).unwrap_or_else(|e| panic!("counters JSON {rest:?}: {e}"))
    }
}

/// Sends `len` bytes from A to `dst` in B over TCP; while they flow, `during` runs (on the test's thread).
fn tcp_stream_intact(topo: &Topology, dst: &str, len: usize, during: impl FnOnce()) {
    common::tcp_between_while(&topo.ns_a, &topo.ns_b, dst, 5001, len, during);
}

/// Bursts of datagrams of many sizes (or, with `uso`, UDP GSO sends of 40 segments that cross as
/// super-packets); each burst is received before the next is sent, so every datagram must arrive, in order.
fn udp_datagrams_intact(topo: &Topology, src: &str, dst: &str, uso: bool) {
    let bursts = if uso { 10 } else { 30 };
    common::udp_datagrams_between(&topo.ns_a, &topo.ns_b, src, dst, uso, true, bursts);
}

/// The checks every deployment must pass, with the forwarder's identity read while TCP flows.
fn carry_traffic_and_check_identity(topo: &Topology, check: impl Fn(&str, &ThreadStatus)) {
    let mut seen_threads = 0;
    tcp_stream_intact(topo, B4, 16 << 20, || {
        // The workers run by now (B was reachable through them): the process and every thread.
        let statuses = topo.statuses();
        seen_threads = statuses.len() - 1;
        for (path, status) in &statuses {
            check(path, status);
        }
        eprintln!("while forwarding: {:?}", statuses[0].1);
    });
    assert!(seen_threads >= 3, "the main thread and a worker per direction were checked ({seen_threads})");
    tcp_stream_intact(topo, B6, 8 << 20, || {});
    udp_datagrams_intact(topo, A4, B4, false);
    udp_datagrams_intact(topo, A6, B6, false);
    udp_datagrams_intact(topo, A4, B4, true);
}

fn check_counters(counters: &serde_json::Value, mode: &str) {
    assert_eq!(counters["mode"], mode, "{counters}");
    assert!(counters["bytes"].as_u64().unwrap() >= 24 << 20, "{counters}");
    assert_eq!(counters["errors"], 0, "{counters}");
    assert_eq!(counters["malformed"].as_u64().unwrap_or(0), 0, "{counters}");
}

/// `fwd --user nobody`: the devices are opened as root, then the process is nobody with no capability in any
/// set and no_new_privs, in every thread, while it forwards TCP and UDP (offload mode: split and coalesce; and
/// plain mode over io_uring, whose rings are set up after the drop).
#[test]
fn fwd_user_nobody_drops_every_privilege() {
    if !privileged("fwd_user_nobody_drops_every_privilege") {
        return;
    }
    for (mode, extra, devs) in
        [("offload", &[][..], ("ttua0", "ttub0")), ("plain", &["--io", "uring"][..], ("ttua1", "ttub1"))]
    {
        let mut topo = Topology::new();
        let mut cmd = turbotun();
        cmd.args(["fwd", "--json", devs.0, devs.1, "--mode", mode, "--user", "nobody"]).args(extra);
        topo.spawn(cmd);
        topo.connect(devs.0, devs.1);
        carry_traffic_and_check_identity(&topo, |path, status| {
            assert!(status.is_dropped_to(NOBODY, NOBODY), "{mode}: {path}: {status:?}");
            assert_eq!(status.groups, [NOBODY], "{mode}: {path}: only nobody's group is left");
        });
        check_counters(&topo.stop(), mode);
    }
}

/// A user or group that does not exist is named in the error, and no device is left (none is created).
#[test]
fn fwd_unknown_user_fails_before_opening_anything() {
    if !privileged("fwd_unknown_user_fails_before_opening_anything") {
        return;
    }
    let ns = new_netns();
    for (args, why) in [
        (&["--user", "no-such-user-tt"][..], "no user named \"no-such-user-tt\""),
        (&["--user", "nobody", "--group", "no-such-group-tt"], "no group named \"no-such-group-tt\""),
        (&["--user", "root"], "keeps root's"),
    ] {
        let out = with_netns(&ns_path(&ns), || turbotun().args(["fwd", "ttbad0", "ttbad1"]).args(args).output())
            .unwrap()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{args:?}: {err}");
        let links = Netlink::in_netns(&ns_path(&ns)).unwrap().links().unwrap();
        assert!(links.iter().all(|l| !l.name.starts_with("ttbad")), "no device left behind: {links:?}");
    }
}

/// A private directory the unprivileged forwarder may create its socket in; removed with everything in it.
fn socket_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("turbotun-handover-").tempdir().unwrap();
    std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    dir
}

/// `turbotun open NAME --send-to PATH --to-user 65534` in the forwarder's namespace, as root; must succeed.
fn open_and_send(topo: &Topology, name: &str, mode: &str, socket: &Path) {
    let out = with_netns(&ns_path(&topo.ns_fwd), || {
        turbotun().args(["open", name, "--mode", mode, "--to-user", "65534", "--send-to"]).arg(socket).output().unwrap()
    })
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "open {name}: {out:?}");
    assert!(stdout.contains(&format!("handed {name}")), "{stdout}");
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while path.symlink_metadata().is_err() {
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Two `turbotun open` (root) hand their queues to `turbotun fwd --from-socket` running as uid 65534 from the
/// start, with no capability: it forwards TCP and UDP between two namespaces.
#[test]
fn handover_to_an_unprivileged_forwarder() {
    if !privileged("handover_to_an_unprivileged_forwarder") {
        return;
    }
    for (mode, devs) in [("offload", ("ttha0", "tthb0")), ("passthrough", ("ttha1", "tthb1"))] {
        let dir = socket_dir();
        let socket = dir.path().join("queues.sock");
        let mut topo = Topology::new();
        topo.spawn(fwd_from_socket(Some(mode), &socket));
        wait_for(&socket);
        open_and_send(&topo, devs.0, mode, &socket);
        open_and_send(&topo, devs.1, mode, &socket);
        topo.connect(devs.0, devs.1);
        assert!(socket.symlink_metadata().is_err(), "the forwarder removed its socket once it had both devices");
        carry_traffic_and_check_identity(&topo, |path, status| {
            assert_eq!(status.uids, [NOBODY; 4], "{path}: {status:?}");
            assert_eq!(status.gids, [NOBODY; 4], "{path}: {status:?}");
            assert!(status.groups.is_empty(), "{path}: {status:?}");
            assert_eq!((status.cap_eff, status.cap_prm, status.cap_amb), (0, 0, 0), "{path}: {status:?}");
        });
        check_counters(&topo.stop(), mode);
    }
}

/// What the hand-over refuses, each with an error that says what to do.
#[test]
fn handover_refusals() {
    if !privileged("handover_refusals") {
        return;
    }
    let dir = socket_dir();
    let ns = new_netns();
    // `open` with nobody listening: a clear error, and no device is created.
    let missing = dir.path().join("nobody-listens.sock");
    let out = with_netns(&ns_path(&ns), || turbotun().args(["open", "ttref0", "--send-to"]).arg(&missing).output())
        .unwrap()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing listens on"), "{out:?}");
    assert!(Netlink::in_netns(&ns_path(&ns)).unwrap().links().unwrap().iter().all(|l| l.name != "ttref0"));

    // `fwd --from-socket` on an existing path: refused, the file untouched.
    let existing = dir.path().join("existing");
    std::fs::write(&existing, b"keep me").unwrap();
    let out = turbotun().args(["fwd", "--from-socket"]).arg(&existing).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists: give a path that does not"));
    assert_eq!(std::fs::read(&existing).unwrap(), b"keep me");

    // A device opened for plain mode handed to an offload forwarder: refused, and `open` says why.
    let socket = dir.path().join("mismatch.sock");
    let mut fwd = start_listening(Some(&ns), fwd_from_socket(Some("offload"), &socket), &socket, Stdio::piped());
    let run_open = |name: &str, mode: &str| {
        with_netns(&ns_path(&ns), || {
            turbotun()
                .args(["open", name, "--mode", mode, "--to-user", "65534", "--send-to"])
                .arg(&socket)
                .output()
                .unwrap()
        })
        .unwrap()
    };
    // A user other than root and the forwarder's own, let in by loose permissions, is refused (SO_PEERCRED); the
    // forwarder goes on waiting for the rightful sender.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let intruder = with_netns(&ns_path(&ns), || {
        turbotun()
            .args(["open", "ttintr0", "--to-user", "65534", "--send-to"])
            .arg(&socket)
            .uid(12345)
            .gid(12345)
            .output()
            .unwrap()
    })
    .unwrap();
    assert!(!intruder.status.success(), "{intruder:?}");
    // A device that does not fit the forwarder's mode is refused as it comes, and `open` exits with the
    // forwarder's reason (it used to report success and leave the refusal to the forwarder's log, which then
    // failed); the forwarder goes on waiting and takes the rightful devices.
    let out = run_open("ttref1", "plain");
    assert!(!out.status.success(), "{out:?}");
    let open_err = String::from_utf8_lossy(&out.stderr);
    assert!(open_err.contains("the receiver refused the queues"), "{open_err}");
    assert!(open_err.contains("ttref1 has no virtio header: offload mode needs one"), "{open_err}");
    assert!(run_open("ttref2", "offload").status.success());
    assert!(run_open("ttref3", "offload").status.success());
    let status = Command::new("kill").args(["-TERM", &fwd.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = fwd.wait().unwrap();
    let mut err = String::new();
    fwd.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(exit.success(), "{exit:?}: {err}");
    assert!(err.contains("refused a hand-over: ttref1 has no virtio header"), "{err}");
    assert!(err.contains("(uid 12345) may not hand queues over: only root or uid 65534 may"), "{err}");
    assert!(err.contains("received 1 queue(s) of ttref2") && err.contains("received 1 queue(s) of ttref3"), "{err}");
    assert!(socket.symlink_metadata().is_err(), "the socket was removed");
    // Every device went with the fds that held it.
    let links = Netlink::in_netns(&ns_path(&ns)).unwrap().links().unwrap();
    assert!(links.iter().all(|l| !l.name.starts_with("ttref")), "{links:?}");
}

/// `turbotun open` checks who listens before it creates or sends anything: a listener of another user (here
/// one that bound the path first in a shared sticky directory) gets nothing unless it is the `--to-user` one,
/// and the error names it. Found by review: a listener running as `nobody` received a root-opened queue.
#[test]
fn open_refuses_a_listener_of_another_user() {
    if !privileged("open_refuses_a_listener_of_another_user") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let shared = tempfile::Builder::new().prefix("turbotun-shared-").tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let socket = shared.path().join("queues.sock");
    let ns = new_netns();
    let mut listener = start_listening(Some(&ns), fwd_from_socket(Some("offload"), &socket), &socket, Stdio::null());
    let open = |extra: &[&str]| {
        with_netns(&ns_path(&ns), || {
            turbotun().args(["open", "ttstray0"]).args(extra).arg("--send-to").arg(&socket).output().unwrap()
        })
        .unwrap()
    };
    let out = open(&[]);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to hand ttstray0 to the listener"), "{err}");
    assert!(err.contains("(uid 65534) may not receive queues: only root may"), "{err}");
    let links = Netlink::in_netns(&ns_path(&ns)).unwrap().links().unwrap();
    assert!(links.iter().all(|l| l.name != "ttstray0"), "no device was created: {links:?}");
    // Another user named with --to-user is no better.
    let out = open(&["--to-user", "12345"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("only root or uid 12345 may"), "{out:?}");
    // The listener's own user, named, gets the queues.
    let out = open(&["--to-user", "nobody"]);
    assert!(out.status.success(), "{out:?}");
    let _ = listener.kill();
    let _ = listener.wait();
}

/// The pid of the only child of `parent` (the forwarder that `unshare --fork` runs in its own PID namespace).
fn child_of(parent: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next() {
            return pid.parse().unwrap();
        }
        assert!(Instant::now() < deadline, "unshare started no child");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The intended container deployment: `turbotun open` on the host hands the queues to a forwarder in its own PID
/// namespace, where the kernel reports the sender's pid as 0. Found by review: the credentials were read into a
/// type that cannot hold a pid of 0 (undefined behaviour), and every queue was refused.
#[test]
fn handover_to_a_forwarder_in_its_own_pid_namespace() {
    if !privileged("handover_to_a_forwarder_in_its_own_pid_namespace") {
        return;
    }
    let dir = socket_dir();
    let socket = dir.path().join("queues.sock");
    let mut topo = Topology::new();
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_turbotun"))
        .args(["fwd", "--json", "--mode", "offload", "--from-socket"])
        .arg(&socket);
    topo.spawn(cmd);
    wait_for(&socket);
    open_and_send(&topo, "ttpid0", "offload", &socket);
    open_and_send(&topo, "ttpid1", "offload", &socket);
    topo.connect("ttpid0", "ttpid1");
    tcp_stream_intact(&topo, B4, 1 << 20, || {});
    // Stop the forwarder itself (pid 1 of its namespace); unshare passes its exit status on.
    let fwd = child_of(topo.pid());
    let status = Command::new("kill").args(["-TERM", &fwd.to_string()]).status().unwrap();
    assert!(status.success());
    let counters = topo.stop_without_signal();
    assert!(counters["bytes"].as_u64().unwrap() >= 1 << 20, "{counters}");
}

/// A signal while `fwd --from-socket` waits for its devices ends it at once and removes its socket, so that the
/// next start can use the path. Found by review: the handlers were installed only after both devices came, so
/// SIGTERM killed the process with the path still bound.
#[test]
fn a_signal_while_waiting_for_queues_removes_the_socket() {
    if !privileged("a_signal_while_waiting_for_queues_removes_the_socket") {
        return;
    }
    for signal in ["-TERM", "-INT"] {
        let dir = socket_dir();
        let socket = dir.path().join("queues.sock");
        let mut fwd = start_listening(None, fwd_from_socket(None, &socket), &socket, Stdio::piped());
        let status = Command::new("kill").args([signal, &fwd.id().to_string()]).status().unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(5);
        let exit = loop {
            if let Some(exit) = fwd.try_wait().unwrap() {
                break exit;
            }
            assert!(Instant::now() < deadline, "{signal}: the forwarder did not stop");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        fwd.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(exit.success(), "{signal}: {exit:?} {err}");
        assert!(err.contains("stopped before both devices came"), "{signal}: {err}");
        assert!(socket.symlink_metadata().is_err(), "{signal}: the socket was removed");
    }
}

/// `turbotun open NAME --send-to PATH --to-user 65534` run inside `ns` (where the device is now), as root; must
/// succeed.
fn open_in_and_send(ns: &OwnedFd, name: &str, mode: &str, socket: &Path) {
    let out = with_netns(&ns_path(ns), || {
        turbotun()
            .args(["open", name, "--mode", mode, "--to-user", "nobody", "--send-to"])
            .arg(socket)
            .output()
            .unwrap()
    })
    .unwrap();
    assert!(out.status.success(), "open {name}: {out:?}");
}

/// A forwarder killed with SIGKILL (no clean-up of its own) on persistent devices, then a new one: the devices
/// outlive the first, keep their addresses and routes, and the second forwards again with data compared. The
/// devices are opened where they live (after the move, in A and B) and handed over, the way a supervisor
/// restarts an unprivileged forwarder; at the end they are deleted and nothing is left.
#[test]
fn sigkill_and_restart_on_persistent_devices() {
    if !privileged("sigkill_and_restart_on_persistent_devices") {
        return;
    }
    let (dev_a, dev_b, mode) = ("ttka0", "ttkb0", "offload");
    let dir = socket_dir();
    let mut topo = Topology::new();
    for dev in [dev_a, dev_b] {
        let out = with_netns(&ns_path(&topo.ns_fwd), || turbotun().args(["create", dev, "--vnet-hdr"]).output())
            .unwrap()
            .unwrap();
        assert!(out.status.success(), "create {dev}: {out:?}");
    }
    let first = dir.path().join("first.sock");
    topo.spawn(fwd_from_socket(Some(mode), &first));
    wait_for(&first);
    open_and_send(&topo, dev_a, mode, &first);
    open_and_send(&topo, dev_b, mode, &first);
    topo.connect(dev_a, dev_b);
    tcp_stream_intact(&topo, B4, 4 << 20, || {});

    // SIGKILL: the process gets no chance to clean up.
    let mut killed = topo.child.take().unwrap();
    killed.kill().unwrap();
    killed.wait().unwrap();
    topo.stdout = None;
    for (ns, dev, addr) in [(&topo.ns_a, dev_a, A4), (&topo.ns_b, dev_b, B4)] {
        let mut nl = Netlink::in_netns(&ns_path(ns)).unwrap();
        let link = nl.link(dev).unwrap_or_else(|e| panic!("{dev} outlives its forwarder: {e}"));
        assert!(link.tun.as_ref().is_some_and(|t| t.persist), "{dev} is persistent");
        assert!(nl.addresses(dev).unwrap().contains(&(addr.parse().unwrap(), 24)), "{dev} keeps its address");
    }

    // The restart: each device opened where it lives and handed to a new unprivileged forwarder.
    let second = dir.path().join("second.sock");
    topo.spawn(fwd_from_socket(Some(mode), &second));
    wait_for(&second);
    open_in_and_send(&topo.ns_a, dev_a, mode, &second);
    open_in_and_send(&topo.ns_b, dev_b, mode, &second);
    let mut stdout = BufReader::new(topo.child.as_mut().unwrap().stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "the new forwarder announces readiness");
    topo.stdout = Some(stdout);
    // The link was down for the kernel while no queue was attached; TCP retries until the path is back.
    tcp_stream_intact(&topo, B4, 4 << 20, || {});
    udp_datagrams_intact(&topo, A4, B4, true);
    let (ns_a, ns_b) = (topo.ns_a.try_clone().unwrap(), topo.ns_b.try_clone().unwrap());
    let counters = topo.stop();
    assert_eq!(counters["errors"], 0, "{counters}");
    assert!(counters["bytes"].as_u64().unwrap() >= 4 << 20, "{counters}");

    // A single-queue device can be deleted only once its forwarder let go of it.
    for (ns, dev) in [(&ns_a, dev_a), (&ns_b, dev_b)] {
        let out = with_netns(&ns_path(ns), || turbotun().args(["delete", dev]).output()).unwrap().unwrap();
        assert!(out.status.success(), "delete {dev}: {out:?}");
        let links = Netlink::in_netns(&ns_path(ns)).unwrap().links().unwrap();
        assert!(links.iter().all(|l| l.name != dev), "{dev} deleted");
    }
}
