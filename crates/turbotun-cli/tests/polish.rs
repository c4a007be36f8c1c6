//! The command as a new user meets it, each defect found by trying it run as the user ran it: a closed pipe
//! under a running forwarder, counters that move while a blocking forwarder carries a trickle, packets a
//! WireGuard endpoint held when it stopped, `stats` given a socket that is not a counters socket, a remote with
//! port 0, and one rule (exit 2, one wording, one prefix) for bad arguments across the commands.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{new_netns, ns_path, privileged, Topology};
use turbotun::netlink::Netlink;
use turbotun::netns::with_netns;

const TURBOTUN: &str = env!("CARGO_BIN_EXE_turbotun");

fn unique(prefix: &str) -> String {
    common::wg::unique(prefix)
}

use common::{eventually as wait_for, output_text as text, turbotun_in};

/// `turbotun fwd A B ARGS` in `ns` with its standard output a pipe whose reader goes away after `read_lines`
/// lines; SIGTERM once it ran on for a second after that: its exit status and standard error.
fn fwd_with_stdout_closed_after(ns: &OwnedFd, read_lines: usize, extra: &[&str]) -> (std::process::ExitStatus, String) {
    let (a, b) = (unique("tpa"), unique("tpb"));
    let mut args = vec!["fwd", &a, &b, "--stats-socket", "none"];
    args.extend_from_slice(extra);
    let mut child = with_netns(&ns_path(ns), || {
        Command::new(TURBOTUN).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()
    })
    .unwrap()
    .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    for _ in 0..read_lines {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
    }
    drop(stdout);
    let mut netlink = Netlink::in_netns(&ns_path(ns)).unwrap();
    wait_for("the forwarder's devices", || netlink.link_index(&b).is_ok());
    std::thread::sleep(Duration::from_secs(1));
    assert!(child.try_wait().unwrap().is_none(), "the forwarder goes on with nobody reading its output");
    common::wg::nix_kill(child.id(), "TERM");
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (child.wait().unwrap(), stderr)
}

#[test]
fn a_forwarder_whose_output_nobody_reads_goes_on_and_exits_0() {
    if !privileged("a_forwarder_whose_output_nobody_reads_goes_on_and_exits_0") {
        return;
    }
    let ns = new_netns();
    // `turbotun fwd a b | true`: the pipe closes before "ready".
    let (status, stderr) = fwd_with_stdout_closed_after(&ns, 0, &[]);
    assert!(status.success() && !stderr.contains("panicked"), "{status}: {stderr}");
    // `turbotun fwd a b --stats-interval 0.2 | head -3`: closed while interval lines go out.
    let (status, stderr) = fwd_with_stdout_closed_after(&ns, 3, &["--stats-interval", "0.2"]);
    assert!(status.success() && !stderr.contains("panicked"), "{status}: {stderr}");
}

/// The packets a running forwarder's counters socket reports, through `turbotun stats --json`.
fn packets_served(topo: &Topology) -> u64 {
    let out =
        with_netns(&ns_path(&topo.ns_fwd), || Command::new(TURBOTUN).args(["stats", &topo.dev_a, "--json"]).output())
            .unwrap()
            .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    report["packets"].as_u64().unwrap_or_else(|| panic!("no packets in {report}"))
}

#[test]
fn a_blocking_forwarder_counts_a_trickle_while_it_flows() {
    if !privileged("a_blocking_forwarder_counts_a_trickle_while_it_flows") {
        return;
    }
    for mode in ["offload", "plain", "passthrough"] {
        let topo = Topology::start(mode, false, &["--io", "block"]);
        // The few packets that showed the path up (a TCP connect) are shared at once: each forwarder worker
        // then sleeps in a blocking read with nothing more to come.
        let start = Instant::now();
        let mut served = packets_served(&topo);
        while served == 0 && start.elapsed() < Duration::from_millis(500) {
            std::thread::sleep(Duration::from_millis(20));
            served = packets_served(&topo);
        }
        assert!(served > 0, "{mode}: the counters still show no packet 0.5 s after the last one moved");
        // One ping more (two packets) shows within the same half second.
        let pinged = topo.in_a(|| Command::new("ping").args(["-c", "1", "-W", "2", common::B4]).status().unwrap());
        assert!(pinged.success());
        let before = served;
        let start = Instant::now();
        while served < before + 2 && start.elapsed() < Duration::from_millis(500) {
            std::thread::sleep(Duration::from_millis(20));
            served = packets_served(&topo);
        }
        assert!(served >= before + 2, "{mode}: a ping's two packets not counted within 0.5 s ({before} -> {served})");
        let closing = topo.stop();
        assert!(closing["packets"].as_u64().unwrap() >= served);
    }
}

#[test]
fn a_remote_of_port_0_or_no_address_is_a_usage_error() {
    for remote in ["192.168.77.2:0", "0.0.0.0:4789"] {
        let out = Command::new(TURBOTUN)
            .args(["tunnel", "tt0", "--local", "0.0.0.0:0", "--remote", remote])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{remote}: {}", text(&out));
        assert!(text(&out).starts_with("turbotun tunnel: error: invalid value"), "{}", text(&out));
    }
}

#[test]
fn stats_refuses_what_is_not_a_counters_socket_without_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vhost.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let out = Command::new(TURBOTUN).args(["stats", path.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("not a counters socket") && said.contains("fwd, tunnel, wg or vhost-user"), "{said}");
    assert!(listener.accept().is_err(), "stats connected to a socket that is not a counters socket");
    // Nor may an engine serve its counters on such a name.
    let out = Command::new(TURBOTUN).args(["fwd", "a", "b", "--stats-socket", "/tmp/x.sock"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// Bad arguments, each to one command: exit 2, `turbotun CMD: error: ...` naming the flag, and clap's hint.
#[test]
fn every_bad_argument_exits_2_with_the_commands_prefix() {
    if !privileged("every_bad_argument_exits_2_with_the_commands_prefix") {
        return;
    }
    let ns = new_netns();
    let cases: &[(&[&str], &str)] = &[
        (&["create", "tq0", "--queues", "0"], "--queues"),
        (&["fwd", "tqa", "tqb", "--queues", "0"], "--queues"),
        (&["vhost-user", "--socket", "/tmp/tq.sock", "--device", "tq1", "--queues", "0"], "--queues"),
        (&["fwd", "tqa", "tqb", "--batch", "100"], "batch"),
        (&["fwd", "tqa", "tqb", "--mode", "plain", "--io", "uring", "--depth", "3"], "depth"),
        (&["fwd", "tqa", "tqb", "--threads", "0"], "thread"),
        (&["fwd", "tqa", "tqb", "--udp-tunnel"], "udp"),
        (&["fwd", "tqa", "tqb", "--checksums", "partial", "--mode", "plain"], "checksums"),
        (&["fwd", "tqa", "tqb", "--gro-hold", "200", "--io", "uring"], "GRO hold"),
        (&["fwd", "tqa", "tqb", "--gro-hold", "20000"], "--gro-hold"),
        (&["fwd", "tqa", "tqa"], "differ"),
        (&["set", "lo"], "nothing to set"),
        (&["create", "tq2", "--tap", "--mac", "zz:00"], "zz:00"),
        (&["create", "tq3", "--mac", "02:00:00:00:00:01"], "--mac needs --tap"),
    ];
    for (args, names) in cases {
        let out = turbotun_in(&ns, args);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        let prefix = format!("turbotun {}: error: ", args[0]);
        assert!(said.starts_with(&prefix), "{args:?}: not {prefix:?}: {said}");
        assert!(said.contains(names), "{args:?} does not name {names}: {said}");
        assert!(said.contains("For more information, try '--help'."), "{args:?}: {said}");
    }
    let links = Netlink::in_netns(&ns_path(&ns)).unwrap().links().unwrap();
    assert_eq!(links.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["lo"], "nothing made");
}

#[test]
fn packets_held_for_a_handshake_that_never_comes_are_counted_when_it_stops() {
    if !privileged("packets_held_for_a_handshake_that_never_comes_are_counted_when_it_stops") {
        return;
    }
    use common::wg::*;
    let u = underlay(1);
    let dir = private_dir();
    let key = keys(dir.path(), "a.key");
    let name = unique("tph");
    let endpoint = Endpoint::start(&u.nss[1], Impl::Turbotun, &name);
    // A peer at an address nobody answers from.
    let silent = keys(dir.path(), "b.key").public;
    let line = format!(
        "set {name} private-key {} peer {silent} endpoint 10.201.0.99:51820 allowed-ips 10.202.0.2/32",
        key.private_file.display()
    );
    wg_line(&u.nss[1], &line);
    bring_up(&u.nss[1], &name, "10.202.0.1");
    let pinged = with_netns(&ns_path(&u.nss[1]), || {
        Command::new("ping").args(["-c", "5", "-i", "0.2", "-W", "1", "10.202.0.2"]).output()
    })
    .unwrap()
    .unwrap();
    assert!(!pinged.status.success(), "nobody answers");
    let c = counters(&endpoint.stop());
    let to_network = &c["to_network"];
    let held = to_network["held"].as_u64().unwrap_or_else(|| panic!("{c}"));
    assert_eq!(held, 5, "{c}");
    assert_eq!(to_network["drops"]["stopped"].as_u64(), Some(5), "the held ones given up at the stop: {c}");
}

#[test]
fn the_kernels_drops_at_the_devices_ring_show_beside_the_forwarders_own() {
    if !privileged("the_kernels_drops_at_the_devices_ring_show_beside_the_forwarders_own") {
        return;
    }
    let ns = new_netns();
    let (a, b) = (unique("tka"), unique("tkb"));
    // A ring of one packet: a burst overflows it before the forwarder reads.
    let args = ["fwd", &a, &b, "--json", "--stats-socket", "none", "--txqueuelen", "1"];
    let mut child = with_netns(&ns_path(&ns), || Command::new(TURBOTUN).args(args).stdout(Stdio::piped()).spawn())
        .unwrap()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let mut netlink = Netlink::in_netns(&ns_path(&ns)).unwrap();
    netlink.add_address(&a, "10.77.0.1".parse().unwrap(), 24).unwrap();
    netlink.set_up(&a, true).unwrap();
    netlink.set_up(&b, true).unwrap();
    with_netns(&ns_path(&ns), || {
        let socket = std::net::UdpSocket::bind("10.77.0.1:0").unwrap();
        for _ in 0..20_000 {
            let _ = socket.send_to(&[0u8; 1000], "10.77.0.2:9");
        }
    })
    .unwrap();
    let dropped = netlink.stats(&a).unwrap().tx_dropped;
    assert!(dropped > 0, "the burst overflowed no ring (the test needs one)");
    // Read every 0.1 s: the devices go with the forwarder, so its closing report gives the last reading.
    std::thread::sleep(Duration::from_millis(400));
    common::wg::nix_kill(child.id(), "TERM");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    let closing: serde_json::Value = serde_json::from_str(rest.trim().lines().last().unwrap()).unwrap();
    assert_eq!(closing["kernel_tx_dropped"][&a].as_u64(), Some(dropped), "{closing}");
}

#[test]
fn a_udp_port_in_use_names_its_holder() {
    if !privileged("a_udp_port_in_use_names_its_holder") {
        return;
    }
    let ns = new_netns();
    // This test holds the port, in the namespace where the tunnel is started.
    let held = with_netns(&ns_path(&ns), || {
        let mut netlink = Netlink::new().unwrap();
        netlink.set_up("lo", true).unwrap();
        std::net::UdpSocket::bind("127.0.0.1:5999").unwrap()
    })
    .unwrap();
    let out = turbotun_in(&ns, &["tunnel", &unique("tth"), "--local", "127.0.0.1:5999", "--remote", "127.0.0.1:6000"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains(&format!("held by pid {}", std::process::id())), "{said}");
    drop(held);
    let links = Netlink::in_netns(&ns_path(&ns)).unwrap().links().unwrap();
    assert_eq!(links.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["lo"], "nothing left behind");
}

#[test]
fn help_fits_the_terminal_and_says_what_each_command_reads() {
    let short = Command::new(TURBOTUN).args(["fwd", "-h"]).env("COLUMNS", "80").output().unwrap();
    let short = String::from_utf8(short.stdout).unwrap();
    assert!(short.lines().all(|l| l.chars().count() <= 80), "{short}");
    assert!(short.contains("--user <USER[:GROUP]>") && !short.contains("supplementary groups"), "-h is short: {short}");
    let long = Command::new(TURBOTUN).args(["fwd", "--help"]).env("COLUMNS", "80").output().unwrap();
    let long = String::from_utf8(long.stdout).unwrap();
    assert!(long.contains("supplementary groups") && long.contains("LOG_LEVEL") && long.contains("TURBOTUN_NO_URING"));
    let features = Command::new(TURBOTUN).args(["features", "--help"]).output().unwrap();
    let features = String::from_utf8(features.stdout).unwrap();
    assert!(features.contains("LOG_LEVEL") && !features.to_lowercase().contains("wireguard"), "{features}");
}

/// Each shell's script, run by that shell in a namespace holding one TUN device: `info`, `delete` (and the like)
/// are offered that device alone, not `lo`; other words come from clap's own completion.
#[test]
fn the_shells_complete_the_devices_by_name() {
    let tools = [("bash", "bash"), ("zsh", "zsh"), ("fish", "fish")];
    if !common::can_run("the_shells_complete_the_devices_by_name", &tools) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = |shell: &str| {
        let path = dir.path().join(format!("turbotun.{shell}"));
        let out = Command::new(TURBOTUN).args(["completions", shell]).output().unwrap();
        std::fs::write(&path, out.stdout).unwrap();
        path.display().to_string()
    };
    let (bash, zsh, fish) = (script("bash"), script("zsh"), script("fish"));
    let ns = new_netns();
    let name = unique("tcp");
    let _device = with_netns(&ns_path(&ns), || turbotun::DeviceBuilder::tun().name(&name).open()).unwrap().unwrap();
    let run = |shell: &str, line: &str| {
        let out = with_netns(&ns_path(&ns), || Command::new(shell).arg("-c").arg(line).output()).unwrap().unwrap();
        assert!(out.status.success(), "{shell} -c {line}: {}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let by_bash = |words: &str| {
        run(
            "bash",
            &format!(
                "source {bash}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
                 _turbotun_names turbotun \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
                 printf '%s\\n' \"${{COMPREPLY[@]}}\""
            ),
        )
    };
    // Zsh's completion builtins stand in for themselves: compadd prints what it is given, clap's function says
    // that it ran.
    let by_zsh = |words: &str| {
        run(
            "zsh",
            &format!(
                "compdef() {{ : }}; source {zsh}; compadd() {{ print -l -- ${{(P)2}} }}; \
                 _turbotun_clap() {{ print clap }}; words=({words}); CURRENT=${{#words}}; PREFIX=${{words[-1]}}; \
                 _turbotun"
            ),
        )
    };
    let by_fish = |line: &str| run("fish", &format!("source {fish}; complete -C '{line}'"));
    for (shell, offered) in [
        ("bash", by_bash("turbotun info ''")),
        ("zsh", by_zsh("turbotun info ''")),
        ("fish", by_fish("turbotun info ")),
    ] {
        let names: Vec<&str> = offered.lines().map(|l| l.split('\t').next().unwrap_or("")).collect();
        assert_eq!(names, [name.as_str()], "{shell}: this namespace's TUN/TAP device, not lo: {offered:?}");
    }
    assert!(by_bash("turbotun delete ''").contains(&name) && by_zsh("turbotun delete ''").contains(&name));
    assert!(by_fish("turbotun set ").contains(&name));
    assert!(by_bash("turbotun fw").contains("fwd"), "other words as clap completes them");
    assert_eq!(by_zsh("turbotun fw").trim(), "clap", "other words as clap completes them");
    assert!(by_fish("turbotun fw").contains("fwd"), "other words as clap completes them");
}

/// A namespace made with `ip netns add`, deleted on drop (even on a panic).
struct NamedNetns(String);

impl NamedNetns {
    fn add(name: &str) -> NamedNetns {
        let out = Command::new("ip").args(["netns", "add", name]).output().unwrap();
        assert!(out.status.success(), "ip netns add {name}: {}", text(&out));
        NamedNetns(name.to_string())
    }

    fn fd(&self) -> OwnedFd {
        std::fs::File::open(format!("/run/netns/{}", self.0)).unwrap().into()
    }
}

impl Drop for NamedNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "delete", &self.0]).output();
    }
}

/// Two engines of one device name in two namespaces both serve counters: each socket's name carries its
/// namespace (`ip netns` name, else `net-INODE`); `stats NAME` finds its own namespace's, from outside it names
/// both and asks for one; `NAME@NETNS` reads the one meant; Prometheus tells the two apart by `netns`.
#[test]
fn one_device_name_in_two_namespaces_serves_two_counters_sockets() {
    if !privileged("one_device_name_in_two_namespaces_serves_two_counters_sockets") {
        return;
    }
    let named = NamedNetns::add(&unique("ttns"));
    let (named_ns, private_ns) = (named.fd(), new_netns());
    let private_tag = format!("net-{}", {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(ns_path(&private_ns)).unwrap().ino()
    });
    let name = unique("tn");
    let args = ["tunnel", &name, "--local", "127.0.0.1:0", "--remote", "127.0.0.1:9"];
    let start = |ns: &OwnedFd| {
        Netlink::in_netns(&ns_path(ns)).unwrap().set_up("lo", true).unwrap();
        common::start_ready(ns, Command::new(TURBOTUN).args(args).stderr(Stdio::piped()))
    };
    let (in_named, in_private) = (start(&named_ns), start(&private_ns));
    let pid_of = |running: &common::Running| u64::from(running.0.as_ref().unwrap().id());
    let json = |out: std::process::Output| -> serde_json::Value {
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // Inside each namespace, its own engine.
    let report = json(turbotun_in(&named_ns, &["stats", &name, "--json"]));
    assert_eq!((report["pid"].as_u64(), report["netns"].as_str()), (Some(pid_of(&in_named)), Some(named.0.as_str())));
    let report = json(turbotun_in(&private_ns, &["stats", &name, "--json"]));
    assert_eq!((report["pid"].as_u64(), report["netns"].as_str()), (Some(pid_of(&in_private)), Some(&*private_tag)));
    // Outside both: the name alone is ambiguous, and the error lists both; the full name reads the one meant.
    let out = Command::new(TURBOTUN).args(["stats", &name]).output().unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains(&format!("{name}@{}", named.0)) && said.contains(&format!("{name}@{private_tag}")), "{said}");
    let report =
        json(Command::new(TURBOTUN).args(["stats", &format!("{name}@{}", named.0), "--json"]).output().unwrap());
    assert_eq!(report["pid"].as_u64(), Some(pid_of(&in_named)));
    let out = Command::new(TURBOTUN).args(["stats", "--prometheus"]).output().unwrap();
    let prometheus = text(&out);
    for tag in [named.0.as_str(), private_tag.as_str()] {
        let series = format!("turbotun_uptime_seconds{{name=\"{name}\",netns=\"{tag}\",kind=\"tunnel\"}}");
        assert!(prometheus.contains(&series), "{series} in {prometheus}");
    }
    // With one of them gone, the name alone finds the other.
    in_named.stop();
    let report = json(Command::new(TURBOTUN).args(["stats", &name, "--json"]).output().unwrap());
    assert_eq!(report["pid"].as_u64(), Some(pid_of(&in_private)));
    in_private.stop();
}
