//! An offload echo runs the GRO write probe when it is built, not at its first answer (see
//! `probe_before_traffic.rs`; the probe is cached per process, hence a test binary of its own).

mod common;

use common::{in_netns, unique_name};
use turbotun::Capabilities;

fn gro_write_support_if_probed() -> Option<turbotun::GroWriteSupport> {
    Capabilities::if_probed().map(Capabilities::gro_writes)
}
use turbotun::echo::{EchoBuilder, EchoMode};
use turbotun::Mode;

#[test]
fn offload_echo_probes_when_built() {
    in_netns("offload_echo_probes_when_built", || {
        let plain = EchoBuilder::new(EchoMode::Plain);
        let dev = plain.device(Mode::Tun).name(unique_name("ttpe")).open().unwrap();
        drop(plain.build(dev).unwrap());
        assert_eq!(gro_write_support_if_probed(), None, "a plain echo does not probe");

        let offload = EchoBuilder::new(EchoMode::Offload);
        let dev = offload.device(Mode::Tun).name(unique_name("ttpe")).open().unwrap();
        let echo = offload.build(dev).unwrap();
        let found = gro_write_support_if_probed().expect("probed before run() and before any packet");
        assert_eq!((found.tcp, found.udp), (Some(true), Some(true)));
        drop(echo);
    });
}
