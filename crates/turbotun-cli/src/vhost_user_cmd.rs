//! `turbotun vhost-user`: the library's vhost-user-net backend (`turbotun::vhost_user`) for one TAP device (one
//! queue per queue pair), serving front ends on a Unix socket one after the other until SIGINT/SIGTERM.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use turbotun::privilege::drop_to;
use turbotun::stats_socket::Report;
use turbotun::vhost_user::{VhostUserServer, VNET_HDR_LEN};
use turbotun::{DeviceBuilder, StopHandle};

use crate::counters::{CountersArgs, Sampler, Sink};

#[derive(Debug, Args)]
pub struct VhostUserArgs {
    /// The Unix socket front ends connect to (QEMU: -chardev socket,path=PATH; cloud-hypervisor:
    /// --net vhost_user=true,socket=PATH). A stale socket there is replaced; it is removed on exit.
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// The TAP device to serve (created if missing, with the virtio header). Give it addresses or put it on a
    /// bridge with `ip`. (`--tap` is a switch in every other command: a TAP instead of a TUN device.)
    #[arg(long = "device", value_name = "NAME")]
    pub tap: String,
    /// Queue pairs offered to the guest (1 to 16), each served by its own thread on its own queue of a multiqueue
    /// TAP (QEMU: -netdev vhost-user,queues=N and -device virtio-net-pci,mq=on).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = crate::args::queue_pairs)]
    pub queues: u16,
    /// Become this user (name or uid; USER:GROUP for another group than the user's own) once the TAP and the
    /// socket are open; the socket is then owned by that user, so that a VM monitor running as them can
    /// connect.
    #[arg(long, value_name = "USER[:GROUP]")]
    pub user: Option<String>,
    #[command(flatten)]
    pub counters: CountersArgs,
}

pub fn run(args: &VhostUserArgs) -> Result<()> {
    let stop = StopHandle::new();
    stop.stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    // The user is looked up before anything is opened, so that a typo leaves nothing behind.
    let identity =
        args.user.as_deref().map(|user| crate::args::user_spec(user, None).resolve().context("--user")).transpose()?;
    let device = DeviceBuilder::tap()
        .name(&args.tap)
        .vnet_hdr(VNET_HDR_LEN)
        .queues(usize::from(args.queues))
        .open()
        .with_context(|| format!("opening {}", args.tap))?;
    let tap = device.name().to_string();
    let server = VhostUserServer::bind_queues(&args.socket, device.into_queues())
        .with_context(|| format!("--socket {}", args.socket.display()))?;
    let stats_socket = args.counters.bind_socket("turbotun vhost-user", &tap);
    let _keeper = match (&identity, &stats_socket) {
        (Some(_), Some(socket)) => {
            Some(turbotun::socket_keeper::start_socket_keeper(&[(socket.path().to_path_buf(), socket.inode())])?)
        }
        _ => None,
    };
    if let Some(identity) = &identity {
        std::os::unix::fs::chown(&args.socket, Some(identity.uid), Some(identity.gid))
            .with_context(|| format!("handing {} to {identity}", args.socket.display()))?;
        drop_to(identity).with_context(|| format!("--user {}", identity.name))?;
        eprintln!("turbotun vhost-user: running as {identity}, no capabilities, no_new_privs");
    }
    let stats = server.stats();
    let start = Instant::now();
    let socket_path = args.socket.clone();
    let name = tap.clone();
    let kernel = crate::kernel_drops::KernelDrops::start("turbotun vhost-user", std::slice::from_ref(&name));
    let source = move || {
        let mut report = Report::of_vhost_user(&name, &socket_path, &stats.snapshot(), start.elapsed().as_secs_f64())
            .with_vhost_user_pairs(&stats.pair_snapshots());
        report.kernel_tx_dropped = kernel.as_ref().map(|k| k.since_start()).unwrap_or_default();
        report
    };
    let _server = crate::counters::serve("turbotun vhost-user", stats_socket, source.clone());
    eprintln!("turbotun vhost-user: {tap} served on {}", args.socket.display());
    crate::out!("ready");
    let sampler = match args.counters.stats_interval {
        Some(every) => Some(Sampler::start(every, args.counters.json, Sink::Stdout, source.clone())?),
        None => None,
    };
    let result = server.serve(&stop);
    if let Some(sampler) = sampler {
        sampler.finish();
    }
    drop(server);
    if args.socket.exists() {
        eprintln!(
            "turbotun vhost-user: could not remove {} (its directory is not writable by this user?)",
            args.socket.display()
        );
    }
    crate::out!("{}", crate::counters::closing(&source(), args.counters.json));
    result.map_err(anyhow::Error::from)
}
