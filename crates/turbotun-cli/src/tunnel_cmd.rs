//! `turbotun tunnel`: the library's tunnel engine with the plain transform, between a TUN (or TAP) device and
//! UDP, until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use turbotun::privilege::{drop_to, UserSpec};
use turbotun::tunnel::{Plain, TunnelBuilder};
use turbotun::udp::SocketOptions;
use turbotun::{DeviceBuilder, Offloads, StopHandle};

#[derive(Debug, Args)]
pub struct TunnelArgs {
    /// The tunnel device (created if missing). Give it addresses, an MTU and routes with `ip`, as for `wg`.
    pub name: String,
    /// The local UDP address (ADDR:PORT; port 0 picks one).
    #[arg(long)]
    pub local: SocketAddr,
    /// The other end's UDP address (ADDR:PORT): packets go there, and are taken only from there.
    #[arg(long)]
    pub remote: SocketAddr,
    /// A TAP device (Ethernet frames in the datagrams) instead of TUN.
    #[arg(long)]
    pub tap: bool,
    /// Queues of the device (IFF_MULTI_QUEUE, flow-hash steering), one worker pair and one socket each.
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// Become this user (name or uid) once the device and sockets are open.
    #[arg(long)]
    pub user: Option<String>,
    /// Send one datagram per message (no UDP_SEGMENT).
    #[arg(long)]
    pub no_gso: bool,
    /// Receive one datagram per message (no UDP_GRO).
    #[arg(long)]
    pub no_gro: bool,
}

pub fn run(args: &TunnelArgs) -> Result<()> {
    let stop = StopHandle::new();
    stop.stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    // The user is looked up before anything is opened, so that a typo leaves nothing behind.
    let identity = args.user.as_deref().map(|user| UserSpec::new(user).resolve().context("--user")).transpose()?;
    if args.local.is_ipv6() != args.remote.is_ipv6() {
        anyhow::bail!("--local {} and --remote {} are of different address families", args.local, args.remote);
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
    if let Some(identity) = &identity {
        drop_to(identity).with_context(|| format!("--user {}", identity.name))?;
        eprintln!("turbotun tunnel: running as {identity}, no capabilities, no_new_privs");
    }
    let stats = tunnel.stats();
    eprintln!("turbotun tunnel: {} <-> udp {} -> {}", args.name, tunnel.local_addr()?, args.remote);
    println!("ready");
    let result = tunnel.run();
    println!("{}", crate::counters::tunnel_line("plain", &stats.snapshot()));
    result.map(drop).map_err(anyhow::Error::from)
}
