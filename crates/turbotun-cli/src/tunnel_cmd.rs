//! `turbotun tunnel`: the library's tunnel engine with the plain transform, between a TUN (or TAP) device and
//! UDP, until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use turbotun::privilege::drop_to;
use turbotun::stats_socket::Report;
use turbotun::tunnel::{Plain, TunnelBuilder};
use turbotun::udp::SocketOptions;
use turbotun::{DeviceBuilder, Engine, Offloads, StopHandle};

use crate::counters::{CountersArgs, Sampler, Sink};

#[derive(Debug, Args)]
pub struct TunnelArgs {
    /// The tunnel device (created if missing). Give it addresses, an MTU and routes with `ip`, as for `wg`.
    pub name: String,
    /// The local UDP address (ADDR:PORT, or HOST:PORT; port 0 picks one).
    #[arg(long, value_name = "ADDR:PORT", value_parser = crate::args::socket_addr)]
    pub local: SocketAddr,
    /// The other end's UDP address (ADDR:PORT, or HOST:PORT): packets go there, and are taken only from there.
    #[arg(long, value_name = "ADDR:PORT", value_parser = crate::args::remote_addr)]
    pub remote: SocketAddr,
    /// A TAP device (Ethernet frames in the datagrams) instead of TUN.
    #[arg(long)]
    pub tap: bool,
    /// Queues of the device (IFF_MULTI_QUEUE, flow-hash steering), one worker pair and one socket each.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = crate::args::queue_count)]
    pub queues: usize,
    /// Become this user (name or uid; USER:GROUP for another group than the user's own) once the device and
    /// sockets are open.
    #[arg(long, value_name = "USER[:GROUP]")]
    pub user: Option<String>,
    /// Send one datagram per message (no UDP_SEGMENT).
    #[arg(long)]
    pub no_gso: bool,
    /// Receive one datagram per message (no UDP_GRO).
    #[arg(long)]
    pub no_gro: bool,
    #[command(flatten)]
    pub counters: CountersArgs,
}

pub fn run(args: &TunnelArgs) -> Result<()> {
    let stop = StopHandle::new();
    stop.stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    // The user is looked up before anything is opened, so that a typo leaves nothing behind.
    let identity =
        args.user.as_deref().map(|user| crate::args::user_spec(user, None).resolve().context("--user")).transpose()?;
    if args.local.is_ipv6() != args.remote.is_ipv6() {
        let (local, remote) = (args.local, args.remote);
        return Err(crate::process::usage(format!(
            "--local {local} and --remote {remote} are of different address families"
        )));
    }
    let builder = if args.tap { DeviceBuilder::tap() } else { DeviceBuilder::tun() };
    let device = builder
        .name(&args.name)
        .vnet_hdr(turbotun::wire::VIRTIO_NET_HDR_LEN)
        .offloads(Offloads::ALL)
        .queues(args.queues)
        .open()
        .with_context(|| format!("opening {}", args.name))?;
    let plain = if args.tap { Plain::ethernet(args.remote) } else { Plain::new(args.remote) };
    let options = SocketOptions { gso: !args.no_gso, gro: !args.no_gro, ..SocketOptions::default() };
    let tunnel = TunnelBuilder::new(Arc::new(plain))
        .bind(args.local)
        .socket_options(options)
        .stop_on(stop.clone())
        .build(device.into_queues())?;
    // Bound while the process may still write to /run/turbotun; answered once the privileges are dropped.
    let name = args.name.clone();
    let socket = args.counters.bind_socket("turbotun tunnel", &name);
    let _keeper = match (&identity, &socket) {
        (Some(_), Some(socket)) => {
            Some(turbotun::socket_keeper::start_socket_keeper(&[(socket.path().to_path_buf(), socket.inode())])?)
        }
        _ => None,
    };
    if let Some(identity) = &identity {
        drop_to(identity).with_context(|| format!("--user {}", identity.name))?;
        eprintln!("turbotun tunnel: running as {identity}, no capabilities, no_new_privs");
    }
    let stats = tunnel.stats();
    let start = Instant::now();
    let kernel = crate::kernel_drops::KernelDrops::start("turbotun tunnel", std::slice::from_ref(&name));
    let source = move || {
        let seconds = start.elapsed().as_secs_f64();
        let mut report = Report::of_tunnel("tunnel", Engine::Tunnel, &name, "plain", &stats.snapshot(), seconds)
            .with_tunnel_queues(&stats.queue_snapshots());
        report.kernel_tx_dropped = kernel.as_ref().map(|k| k.since_start()).unwrap_or_default();
        report
    };
    let _server = crate::counters::serve("turbotun tunnel", socket, source.clone());
    eprintln!("turbotun tunnel: {} <-> udp {} -> {}", args.name, tunnel.local_addr()?, args.remote);
    crate::out!("ready");
    let sampler = match args.counters.stats_interval {
        Some(every) => Some(Sampler::start(every, args.counters.json, Sink::Stdout, source.clone())?),
        None => None,
    };
    let result = tunnel.run();
    if let Some(sampler) = sampler {
        sampler.finish();
    }
    crate::out!("{}", crate::counters::closing(&source(), args.counters.json));
    result.map(drop).map_err(anyhow::Error::from)
}
