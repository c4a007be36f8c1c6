//! The GRO write probe runs while an offload forwarder or echo is built, not at its first send: left to the first
//! send, its private namespace and scratch device stalled the worker for tens of milliseconds with traffic
//! already arriving, and the source device's ring overflowed (a few hundred datagrams lost in every short trial).
//! The probe is cached per process, so this file is its own test binary and holds one test (the echo's twin is
//! `probe_before_traffic_echo.rs`).

mod common;

use common::{in_netns, unique_name};
use turbotun::Capabilities;

fn gro_write_support_if_probed() -> Option<turbotun::GroWriteSupport> {
    Capabilities::if_probed().map(Capabilities::gro_writes)
}
use turbotun::forward::{ForwardMode, ForwarderBuilder};
use turbotun::Mode;

#[test]
fn offload_forwarder_probes_when_built() {
    in_netns("offload_forwarder_probes_when_built", || {
        // Plain forwarders never coalesce, so they never probe.
        let plain = ForwarderBuilder::new(ForwardMode::Plain);
        let open = |b: &ForwarderBuilder| b.device(Mode::Tun).name(unique_name("ttpr")).open().unwrap();
        let forwarder = plain.clone().build(open(&plain), open(&plain)).unwrap();
        drop(forwarder);
        assert_eq!(gro_write_support_if_probed(), None, "a plain forwarder does not probe");

        let offload = ForwarderBuilder::new(ForwardMode::Offload);
        let forwarder = offload.clone().build(open(&offload), open(&offload)).unwrap();
        let found = gro_write_support_if_probed().expect("probed before run() and before any packet");
        // This kernel (6.18) takes both kinds of coalesced writes.
        assert_eq!((found.tcp, found.udp), (Some(true), Some(true)));
        drop(forwarder);
    });
}
