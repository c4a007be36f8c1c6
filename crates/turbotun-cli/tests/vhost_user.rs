//! `turbotun vhost-user` as a process: it serves one front end at a time on its socket (a second waits for the
//! first to go), runs as another user with no capability, and on SIGTERM prints its counters and leaves nothing behind (socket, TAP). The data path itself is
//! tested by the library's `vhost_user` tests, which play the guest.

mod common;

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{new_netns, ns_path, privileged};
use turbotun::netlink::Netlink;

const TURBOTUN: &str = env!("CARGO_BIN_EXE_turbotun");

#[test]
fn vhost_user_serves_front_ends_in_turn_and_leaves_nothing() {
    if !privileged("vhost_user_serves_front_ends_in_turn_and_leaves_nothing") {
        return;
    }
    let ns = new_netns();
    let tag = std::process::id() % 100_000;
    let tap = format!("vuc{tag}");
    let socket = std::env::temp_dir().join(format!("turbotun-cli-test-{tag}.sock"));
    let running = common::start_ready(
        &ns,
        Command::new(TURBOTUN)
            .args(["vhost-user", "--json", "--stats-socket", "none", "--user", "nobody", "--device", &tap])
            .arg("--socket")
            .arg(&socket)
            .stderr(Stdio::inherit()),
    );
    let nobody = nix_uid("nobody");
    assert_eq!(std::fs::metadata(&socket).unwrap().uid(), nobody, "the socket is handed to --user");
    // The process itself runs as that user, every uid of it, with no capability left.
    let pid = running.0.as_ref().unwrap().id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in {status}"));
        line[name.len()..].split_whitespace().map(str::to_string).collect::<Vec<_>>()
    };
    assert_eq!(field("Uid:"), vec![nobody.to_string(); 4], "real, effective, saved and filesystem uid");
    assert_eq!(field("CapEff:"), ["0000000000000000"], "no capability left");
    let mut nl = Netlink::in_netns(&ns_path(&ns)).unwrap();
    assert!(nl.link(&tap).is_ok(), "the TAP is made");

    // Two front ends at once: the second is connected (the listen backlog) but not answered while the first is
    // served; once the first hangs up, the second gets its answer.
    let first = UnixStream::connect(&socket).unwrap();
    assert_offered(get_features(&first), "the first front end");
    let second = UnixStream::connect(&socket).unwrap();
    second.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    send_get_features(&second);
    let mut byte = [0u8; 1];
    let early = std::io::Read::read(&mut &second, &mut byte);
    assert!(early.is_err(), "the second front end was answered while the first was served: {early:?}");
    drop(first);
    assert_offered(read_features(&second), "the second front end, once the first is gone");
    drop(second);
    let counters: serde_json::Value = serde_json::from_str(running.stop().lines().last().unwrap()).unwrap();
    assert_eq!(counters["kind"], "vhost-user", "{counters}");
    assert_eq!(counters["devices"][0], tap.as_str());
    assert_eq!(counters["connections"], "2", "front ends served: {counters}");
    assert!(counters["to_tap"]["drops"]["bad_descriptor"].is_u64(), "its drop reasons are listed: {counters}");
    assert!(!socket.exists(), "the socket is removed on exit");
    assert!(nl.link(&tap).is_err(), "the TAP goes with the process");
}

#[test]
fn vhost_user_refuses_what_cannot_work() {
    let out = Command::new(TURBOTUN)
        .args(["vhost-user", "--socket", "/tmp/turbotun-never.sock", "--device", "vubad0", "--queues", "17"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--queues") && err.contains("17") && err.contains("give 1 to 16"), "{err}");
    assert!(!std::path::Path::new("/tmp/turbotun-never.sock").exists());
    if !privileged("vhost_user_refuses_what_cannot_work") {
        return;
    }
    // A file of another kind where the socket would go is left alone.
    let ns = new_netns();
    let file = std::env::temp_dir().join(format!("turbotun-cli-test-{}.notasocket", std::process::id()));
    std::fs::write(&file, "keep").unwrap();
    let out = turbotun::netns::with_netns(&ns_path(&ns), || {
        Command::new(TURBOTUN).args(["vhost-user", "--device", "vubad1", "--socket"]).arg(&file).output()
    })
    .unwrap()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    std::fs::remove_file(&file).unwrap();
    let mut nl = Netlink::in_netns(&ns_path(&ns)).unwrap();
    assert!(nl.link("vubad1").is_err(), "nothing left behind");
}

/// Sends `VHOST_USER_GET_FEATURES`: request 1, flags 1 (protocol version 1), no payload.
fn send_get_features(mut front_end: &UnixStream) {
    use std::io::Write;
    let request: Vec<u8> = [1u32, 1, 0].iter().flat_map(|w| w.to_le_bytes()).collect();
    front_end.write_all(&request).unwrap();
}

/// Reads the reply to `GET_FEATURES`: the virtio feature bits the backend offers.
fn read_features(mut front_end: &UnixStream) -> u64 {
    use std::io::Read;
    front_end.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reply = [0u8; 20];
    front_end.read_exact(&mut reply).unwrap();
    let word = |i: usize| u32::from_le_bytes(reply[i..i + 4].try_into().unwrap());
    assert_eq!((word(0), word(4) & 0x4, word(8)), (1, 0x4, 8), "a reply to GET_FEATURES with 8 bytes");
    u64::from_le_bytes(reply[12..20].try_into().unwrap())
}

/// `GET_FEATURES` asked and answered on `front_end`.
fn get_features(front_end: &UnixStream) -> u64 {
    send_get_features(front_end);
    read_features(front_end)
}

fn assert_offered(features: u64, who: &str) {
    for bit in [15, 32] {
        assert!(features & (1 << bit) != 0, "{who}: MRG_RXBUF and VERSION_1 offered: {features:#x}");
    }
}

fn nix_uid(user: &str) -> u32 {
    turbotun::privilege::UserSpec::new(user).uid().unwrap()
}
