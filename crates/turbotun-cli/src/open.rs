//! `turbotun open`: the privileged half of a split deployment. Opens one device (as `fwd` would for the mode),
//! hands its queue fds to the process listening on a Unix socket (`turbotun fwd --from-socket`), and exits.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use turbotun::forward::ForwarderBuilder;
use turbotun::privilege::UserSpec;
use turbotun::steering::SteeringProgram;
use turbotun::{Mode, Queue};

use crate::fwd::FwdMode;

#[derive(Debug, Args)]
pub struct OpenArgs {
    /// The device (created if missing; it lives as long as a queue fd is open, here or in the receiver).
    pub name: String,
    /// TAP (Ethernet) instead of TUN.
    #[arg(long)]
    pub tap: bool,
    /// The forwarding mode the receiver will run: decides the virtio header and offloads, as for `fwd`.
    #[arg(long, value_enum, default_value_t = FwdMode::Offload)]
    pub mode: FwdMode,
    /// Queues to open (IFF_MULTI_QUEUE); with more than one, the flow-hash steering program is attached here,
    /// since the receiver may lack the privilege to load it.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = crate::args::queue_count)]
    pub queues: usize,
    /// The Unix socket `turbotun fwd --from-socket PATH` listens on.
    #[arg(long, value_name = "PATH")]
    pub send_to: PathBuf,
    /// The user (name or uid) the forwarder runs as. The queues go only to a listener running as root or as
    /// this user: whoever holds them reads and injects the device's traffic.
    #[arg(long, value_name = "USER")]
    pub to_user: Option<String>,
}

/// How long to wait for the receiver to say whether it took the queues.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

pub fn run(args: &OpenArgs) -> Result<()> {
    turbotun::validate_ifname(&args.name)?;
    let to_user = match &args.to_user {
        Some(user) => Some(UserSpec::new(user.as_str()).uid().context("--to-user")?),
        None => None,
    };
    // Connect and check the listener first: with no receiver, or the wrong one, there is no point in creating
    // the device (and nothing is left behind).
    let stream = UnixStream::connect(&args.send_to).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => anyhow!(
            "nothing listens on {}: start `turbotun fwd --from-socket {}` first ({e})",
            args.send_to.display(),
            args.send_to.display()
        ),
        _ => anyhow!("connecting to {}: {e}", args.send_to.display()),
    })?;
    let listener = turbotun::handover::check_receiver(&stream, to_user).with_context(|| {
        format!(
            "refusing to hand {} to the listener on {} (give --to-user with the forwarder's user)",
            args.name,
            args.send_to.display()
        )
    })?;
    let builder = ForwarderBuilder::new(args.mode.forward_mode());
    let mode = if args.tap { Mode::Tap } else { Mode::Tun };
    let dev = builder
        .device(mode)
        .name(args.name.as_str())
        .queues(args.queues)
        .open()
        .with_context(|| format!("opening {}", args.name))?;
    for note in dev.notes() {
        eprintln!("turbotun open: {note}");
    }
    if args.queues > 1 {
        let attached = SteeringProgram::flow_hash().and_then(|p| p.attach(std::os::fd::AsFd::as_fd(&dev.queues()[0])));
        if let Err(e) = attached {
            eprintln!("turbotun open: {}: no steering eBPF ({e}); the kernel's own flow steering is used", dev.name());
        }
    }
    let queues: Vec<&Queue> = dev.queues().iter().collect();
    turbotun::handover::send_queues_and_wait(&stream, &queues, REPLY_TIMEOUT)
        .with_context(|| format!("handing {} to {}, listened on by {listener}", dev.name(), args.send_to.display()))?;
    crate::out!(
        "handed {} ({} queue(s), {}, offloads {}) to {}, listened on by {listener}",
        dev.name(),
        dev.queues().len(),
        dev.mode(),
        dev.offloads(),
        args.send_to.display()
    );
    Ok(())
}
