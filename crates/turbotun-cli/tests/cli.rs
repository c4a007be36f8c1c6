//! `turbotun features`, `create`, `info`, `delete` run as a user would, inside a private network namespace.

use std::process::{Command, Output};

use turbotun::netns::with_private_netns;

fn turbotun(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turbotun")).args(args).output().expect("run turbotun")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[path = "../../turbotun/tests/common/skip.rs"]
mod skip;

/// Runs `f` in a private namespace (children spawned there inherit it); without the privileges, the suite's skip
/// rule.
fn in_netns(test: &str, f: impl FnOnce() + Send) {
    if let Err(e) = with_private_netns(f) {
        skip::cannot_run(test, &format!("needs root: {e}"));
    }
}

#[test]
fn features_json_reports_probed_support() {
    in_netns("features_json_reports_probed_support", || {
        let out = turbotun(&["features", "--json"]);
        assert!(out.status.success(), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["vnet_hdr"], true);
        assert_eq!(v["vnet_hdr_sizes"], serde_json::json!([10, 12, 20, 24]));
        assert_eq!(v["offloads_probed"], true);
        let offloads: Vec<&str> = v["offloads"].as_array().unwrap().iter().filter_map(|o| o.as_str()).collect();
        for o in ["csum", "tso4", "tso6"] {
            assert!(offloads.contains(&o), "{offloads:?}");
        }
        assert_eq!(v["multi_queue"], true);
        assert!(v["io_uring"].is_boolean() && v["steering_ebpf"].is_boolean());
        // This machine runs Linux 6.18: UDP-tunnel GSO (6.17+) is there, with the header size it needs.
        assert_eq!(v["udp_tunnel_gso"], true);
        assert_eq!(v["udp_tunnel_gso_csum"], true);
        assert_eq!(v["udp_tunnel_vnet_hdr_len"], 24);
        let human = turbotun(&["features"]);
        assert!(text(&human).contains("offload tso4      yes"), "{}", text(&human));
        assert!(
            text(&human).contains("udp tunnel gso    yes (with outer checksum; 24-byte header)"),
            "{}",
            text(&human)
        );
        let backpressure = v["backpressure"].as_bool().expect("backpressure is reported");
        let line = if backpressure { "backpressure      yes" } else { "backpressure      no" };
        assert!(text(&human).contains(line), "{}", text(&human));
    });
}

/// `--txqueuelen` sets the ring length the kernel reports; `--backpressure` is granted where the kernel offers
/// it and otherwise noted, never silently ignored.
#[test]
fn create_with_txqueuelen_and_backpressure() {
    in_netns("create_with_txqueuelen_and_backpressure", || {
        let features: serde_json::Value = serde_json::from_slice(&turbotun(&["features", "--json"]).stdout).unwrap();
        let offered = features["backpressure"].as_bool().unwrap();
        let out = turbotun(&["create", "ttq0", "--txqueuelen", "777", "--backpressure"]);
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(text(&out).contains("IFF_BACKPRESSURE is not in this kernel"), !offered, "{}", text(&out));
        let info: serde_json::Value = serde_json::from_slice(&turbotun(&["info", "ttq0", "--json"]).stdout).unwrap();
        assert_eq!(info[0]["txqueuelen"], 777);
        let flags = info[0]["flags"].as_array().unwrap();
        assert_eq!(flags.contains(&serde_json::json!("backpressure")), offered, "{flags:?}");
        assert!(turbotun(&["delete", "ttq0"]).status.success());
    });
}

#[test]
fn create_info_delete_persistent_device() {
    in_netns("create_info_delete_persistent_device", || {
        let out = turbotun(&["create", "ttcli0", "--tap", "--multi-queue", "--vnet-hdr", "--owner", "1234"]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("created persistent tap device ttcli0"));

        let out = turbotun(&["info", "ttcli0", "--json"]);
        assert!(out.status.success(), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let dev = &v[0];
        assert_eq!(dev["name"], "ttcli0");
        assert_eq!(dev["mode"], "tap");
        assert_eq!(dev["persist"], true);
        assert_eq!(dev["owner"], 1234);
        assert_eq!(dev["queues"], 0, "no fd holds it after create exits");
        let flags: Vec<&str> = dev["flags"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
        for f in ["tap", "no_pi", "vnet_hdr", "multi_queue", "persist"] {
            assert!(flags.contains(&f), "{flags:?}");
        }
        assert!(dev["mac"].as_str().is_some_and(|m| m.len() == 17), "a TAP device has a MAC: {dev}");

        let listing = turbotun(&["info"]);
        let listing = text(&listing);
        assert!(listing.contains("ttcli0: <tap,no_pi,vnet_hdr,multi_queue,persist> persist on"), "{listing}");
        assert!(listing.contains("owner 1234 group -"), "{listing}");

        let exists = turbotun(&["create", "ttcli0"]);
        assert!(!exists.status.success());
        assert!(text(&exists).contains("ttcli0"), "{}", text(&exists));

        let out = turbotun(&["delete", "ttcli0"]);
        assert!(out.status.success(), "{}", text(&out));
        let out = turbotun(&["info", "ttcli0"]);
        assert!(!out.status.success());
        assert!(text(&out).contains("no device named \"ttcli0\""), "{}", text(&out));
        assert!(text(&turbotun(&["info"])).contains("no TUN/TAP devices"));
    });
}

#[test]
fn bad_input_gets_a_clear_error() {
    in_netns("bad_input_gets_a_clear_error", || {
        for (args, expect) in [
            (&["create", "bad name"][..], "invalid interface name \"bad name\": contains whitespace"),
            (&["create", "waytoolongname123"][..], "longer than 15 bytes"),
            (&["delete", "ttmissing0"][..], "no device named \"ttmissing0\""),
            (&["info", "lo"][..], "lo is a loopback device, not a TUN/TAP device"),
            (&["fwd", "lo", "ttok0"][..], "lo is a loopback device, not a TUN/TAP device"),
            (&["fwd", "tta0", "ttb0", "--queues", "1000"], "invalid value '1000' for '--queues <N>': give 1 to 256"),
            (&["create", "ttown0", "--owner", "4294967295"], "TUNSETOWNER refused 4294967295: not a valid uid"),
            (&["wg", "-f", "ttwgq0", "--queues", "0"], "invalid value '0' for '--queues <N>': give 1 to 256"),
            (&["wg", "ttwgq0", "--queues", "257"], "invalid value '257' for '--queues <N>': give 1 to 256"),
        ] {
            let out = turbotun(args);
            assert!(!out.status.success(), "{args:?}");
            assert!(text(&out).contains(expect), "{args:?}: {}", text(&out));
        }
        // A refused setting leaves no persistent device behind, and nothing else was created on the way.
        let links = turbotun::netlink::Netlink::new().unwrap().links().unwrap();
        let names: Vec<&str> = links.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["lo"], "nothing left behind");
    });
}

/// A user without privileges is told what stops them: the mode of /dev/net/tun where it does not let them open
/// it (0600 on some systems, this VM's among them), otherwise the capability creating a device needs.
#[test]
fn unprivileged_user_is_told_why() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    in_netns("unprivileged_user_is_told_why", || {
        let out = Command::new(env!("CARGO_BIN_EXE_turbotun"))
            .args(["create", "ttnopriv0"])
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let others_rw = std::fs::metadata("/dev/net/tun").unwrap().mode() & 0o006 == 0o006;
        let expect = if others_rw {
            "creating ttnopriv0 needs CAP_NET_ADMIN"
        } else {
            "so this user cannot open it: run as root, or make the node 0666"
        };
        assert!(text(&out).contains(expect), "{}", text(&out));
        // The error is said once, not repeated by its cause (EACCES or EPERM, whichever the node's mode led to).
        assert_eq!(text(&out).matches("(os error").count(), 1, "{}", text(&out));
    });
}

/// A second forwarder that attaches to multiqueue devices another one holds, with other framing (no virtio
/// header where the devices have one), is refused with the difference named: the kernel would give its queues
/// the devices' framing and it would misread every frame.
#[test]
fn attaching_with_other_framing_is_refused() {
    in_netns("attaching_with_other_framing_is_refused", || {
        use std::io::BufRead;
        let mut first = Command::new(env!("CARGO_BIN_EXE_turbotun"))
            .args([
                "fwd",
                "ttmqa",
                "ttmqb",
                "--mode",
                "passthrough",
                "--tap",
                "--queues",
                "2",
                "--stats-socket",
                "none",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(first.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let out = turbotun(&["fwd", "ttmqa", "ttmqb", "--mode", "plain", "--tap", "--queues", "2"]);
        let _ = first.kill();
        let _ = first.wait();
        assert!(!out.status.success());
        assert!(
            text(&out).contains("device ttmqa exists with other framing: it has virtio header and 2 queue(s) attached, this open asks for none"),
            "{}",
            text(&out)
        );
    });
}

/// `create --master --mac --tx-filter --ebpf-filter`, `info` and `set` on a TAP device: the device is a port of
/// the bridge with that MAC; the TX filter set by `create` (a process that has exited) still keeps frames for
/// another MAC from a later reader, until `set --tx-filter off`; `set --carrier off` shows as NO-CARRIER while
/// a queue is held; bad values are refused before anything changes.
#[test]
fn create_and_set_layer2_controls() {
    in_netns("create_and_set_layer2_controls", || {
        use std::net::UdpSocket;
        use turbotun::netlink::Netlink;
        Netlink::new().unwrap().create_bridge("ttbr0").unwrap();
        let out = turbotun(&[
            "create",
            "ttl2",
            "--tap",
            "--multi-queue",
            "--master",
            "ttbr0",
            "--mac",
            "52:54:00:12:34:56",
            "--tx-filter",
            "52:54:00:12:34:56,broadcast",
            "--ebpf-filter",
            "protocols=ipv4,arp",
        ]);
        assert!(out.status.success(), "{}", text(&out));
        let info = |name: &str| {
            let out = turbotun(&["info", name, "--json"]);
            assert!(out.status.success(), "{}", text(&out));
            serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()[0].clone()
        };
        let dev = info("ttl2");
        assert_eq!(dev["master"], "ttbr0");
        assert_eq!(dev["mac"], "52:54:00:12:34:56");
        assert_eq!(dev["carrier"], false, "no queue attached");

        // A reader attaches later: the filters the exited `create` set are still on the device.
        let tap = turbotun::DeviceBuilder::tap().name("ttl2").multi_queue(true).open().unwrap();
        let mut nl = Netlink::new().unwrap();
        nl.set_master("ttl2", None).unwrap();
        std::fs::write("/proc/sys/net/ipv6/conf/ttl2/disable_ipv6", "1").unwrap();
        nl.add_address("ttl2", "10.70.0.1".parse().unwrap(), 24).unwrap();
        nl.set_up("ttl2", true).unwrap();
        assert_eq!(info("ttl2")["carrier"], true, "a queue is attached");
        nl.add_neighbour("ttl2", "10.70.0.2".parse().unwrap(), [0x52, 0x54, 0, 0x12, 0x34, 0x56]).unwrap();
        nl.add_neighbour("ttl2", "10.70.0.3".parse().unwrap(), [0x52, 0x54, 0, 0x99, 0x99, 0x99]).unwrap();
        let sock = UdpSocket::bind("10.70.0.1:0").unwrap();
        let q = &tap.queues()[0];
        let read_ports = || {
            for _ in 0..5 {
                sock.send_to(b"vm", "10.70.0.2:4301").unwrap();
                sock.send_to(b"other", "10.70.0.3:4302").unwrap();
            }
            let mut ports = Vec::new();
            let mut buf = [0u8; 2048];
            while q.wait_readable(Some(std::time::Duration::from_millis(300))).unwrap() {
                let n = q.recv_raw(&mut buf).unwrap();
                if n >= 38 && buf[12..14] == [8, 0] && buf[23] == 17 {
                    ports.push(u16::from_be_bytes([buf[36], buf[37]]));
                }
            }
            ports.sort();
            ports
        };
        assert_eq!(read_ports(), [4301; 5], "only the VM's frames pass the TX filter set by create");
        let out = turbotun(&["set", "ttl2", "--tx-filter", "off", "--carrier", "off"]);
        assert!(out.status.success(), "{}", text(&out));
        let mut ports = read_ports();
        ports.dedup();
        assert_eq!(ports, [4301, 4302], "with the filter off both arrive");
        assert_eq!(info("ttl2")["carrier"], false);

        for (args, why) in [
            (&["set", "ttl2", "--tx-filter", "52:54:00:12:34"][..], "is not a MAC address"),
            (&["set", "ttl2", "--ebpf-filter", "protocols=ipx"][..], "is not ipv4, ipv6, arp or 0xHHHH"),
            (&["set", "ttl2", "--master", "lo"][..], "lo is a loopback device, not a bridge"),
            (&["set", "ttl2", "--mac", "01:00:5e:00:00:01"][..], "must be unicast"),
            (&["set", "ttl2"][..], "nothing to set"),
            (&["create", "ttl3", "--tx-filter", "52:54:00:12:34:56"][..], "TAP devices only"),
        ] {
            let out = turbotun(args);
            assert!(!out.status.success() && text(&out).contains(why), "{args:?}: {}", text(&out));
        }
        assert!(nl.link("ttl3").is_err(), "a refused create leaves no device");
        drop(tap);
        let out = turbotun(&["set", "ttl2", "--carrier", "on"]);
        assert!(!out.status.success() && text(&out).contains("no queue is attached"), "{}", text(&out));
        assert!(turbotun(&["delete", "ttl2"]).status.success());
    });
}
