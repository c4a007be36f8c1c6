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
    // Through the handle, not its flag alone: a signal then also ends the workers' waits at once.
    forwarder.stop_handle().stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let stats = forwarder.stats();
    println!("ready");
    forwarder.run()?;
    println!("{:?}", stats.snapshot().total());
    Ok(())
}
