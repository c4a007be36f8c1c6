//! A forwarder between two TUN devices, until SIGINT/SIGTERM: `forward [DEV_A] [DEV_B]`.
//!
//! The devices are created if missing; give them addresses and routes (or move them into namespaces) and
//! packets routed into one come out of the other, super-packets split and coalesced again on the way.

use turbotun::forward::{ForwardMode, ForwarderBuilder};
use turbotun::Mode;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (name_a, name_b) = (args.next().unwrap_or("tt-a".into()), args.next().unwrap_or("tt-b".into()));
    let builder = ForwarderBuilder::new(ForwardMode::Offload);
    let a = builder.device(Mode::Tun).name(name_a).open()?;
    let b = builder.device(Mode::Tun).name(name_b).open()?;
    let forwarder = builder.build(a, b)?;
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, forwarder.stop_handle().as_flag().clone())?;
    }
    let stats = forwarder.stats();
    println!("ready");
    forwarder.run()?;
    println!("{:?}", stats.snapshot().total());
    Ok(())
}
