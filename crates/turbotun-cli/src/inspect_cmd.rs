//! `turbotun features`, `turbotun info`, `turbotun create`, `turbotun delete`.

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use turbotun::inspect::{self, DeviceReport};
use turbotun::netlink::{mac_to_string, Netlink};
use turbotun::{Capabilities, DeviceBuilder, Mode, Offloads};

#[derive(Debug, Args)]
pub struct FeaturesArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct FeaturesJson {
    tungetfeatures: String,
    iff_flags: Vec<&'static str>,
    vnet_hdr: bool,
    vnet_hdr_sizes: Vec<usize>,
    offloads_probed: bool,
    offloads: Vec<&'static str>,
    uso: bool,
    multi_queue: bool,
    napi: bool,
    napi_frags: bool,
    backpressure: bool,
    steering_ebpf: bool,
    steering_ebpf_error: Option<String>,
    io_uring: bool,
}

pub fn features(args: &FeaturesArgs) -> Result<()> {
    let caps = Capabilities::probe().context("probing the tun driver")?;
    let offloads = caps.offloads.unwrap_or_default();
    let report = FeaturesJson {
        tungetfeatures: format!("{:#06x}", caps.iff_features),
        iff_flags: inspect::flag_names(caps.iff_features),
        vnet_hdr: caps.vnet_hdr(),
        vnet_hdr_sizes: caps.vnet_hdr_sizes.clone(),
        offloads_probed: caps.offloads.is_some(),
        offloads: offloads.names(),
        uso: caps.uso(),
        multi_queue: caps.multi_queue(),
        napi: caps.napi(),
        napi_frags: caps.napi_frags(),
        backpressure: caps.backpressure(),
        steering_ebpf: caps.steering_ebpf.is_ok(),
        steering_ebpf_error: caps.steering_ebpf.clone().err(),
        io_uring: caps.io_uring,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let yes = |b: bool| if b { "yes" } else { "no" };
    println!("tun driver (TUNGETFEATURES {}): {}", report.tungetfeatures, report.iff_flags.join(" "));
    println!("  vnet header       {} (sizes {})", yes(report.vnet_hdr), join_sizes(&report.vnet_hdr_sizes));
    if caps.offloads.is_some() {
        for (bits, label) in [
            (Offloads::CSUM, "csum"),
            (Offloads::TSO4, "tso4"),
            (Offloads::TSO6, "tso6"),
            (Offloads::TSO_ECN, "tso_ecn"),
            (Offloads::USO4 | Offloads::USO6, "uso4+uso6"),
        ] {
            println!("  offload {label:<10}{}", yes(offloads.contains(bits)));
        }
    } else {
        println!("  offloads          not probed (needs CAP_NET_ADMIN to create a scratch device)");
    }
    println!("  multiqueue        {}", yes(report.multi_queue));
    println!("  napi              {}", yes(report.napi));
    println!("  napi_frags        {}", yes(report.napi_frags));
    if report.backpressure {
        println!("  backpressure      yes (IFF_BACKPRESSURE: a full transmit ring stops the queue, nothing dropped)");
    } else {
        println!("  backpressure      no (no IFF_BACKPRESSURE: a full transmit ring tail-drops; see txqueuelen)");
    }
    match &caps.steering_ebpf {
        Ok(()) => println!("  steering eBPF     yes"),
        Err(why) => println!("  steering eBPF     no ({why})"),
    }
    println!("  io_uring          {}", yes(report.io_uring));
    Ok(())
}

fn join_sizes(sizes: &[usize]) -> String {
    if sizes.is_empty() {
        return "not probed".into();
    }
    sizes.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Only this device (default: every TUN/TAP device in this network namespace).
    pub device: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct DeviceJson {
    name: String,
    index: u32,
    mode: String,
    tun_flags: String,
    flags: Vec<&'static str>,
    persist: bool,
    owner: Option<u32>,
    group: Option<u32>,
    queues: u32,
    disabled_queues: u32,
    queue_pids: Vec<u32>,
    mtu: u32,
    txqueuelen: u32,
    up: bool,
    oper_state: String,
    mac: Option<String>,
    addresses: Vec<String>,
    offloads: Option<Vec<&'static str>>,
    rx_packets: u64,
    rx_bytes: u64,
    rx_errors: u64,
    rx_dropped: u64,
    tx_packets: u64,
    tx_bytes: u64,
    tx_errors: u64,
    tx_dropped: u64,
}

impl From<&DeviceReport> for DeviceJson {
    fn from(r: &DeviceReport) -> Self {
        DeviceJson {
            name: r.name.clone(),
            index: r.index,
            mode: r.mode.to_string(),
            tun_flags: format!("{:#06x}", r.tun_flags),
            flags: r.flag_names.clone(),
            persist: r.persist,
            owner: r.owner,
            group: r.group,
            queues: r.queues,
            disabled_queues: r.disabled_queues,
            queue_pids: r.queue_holders.clone(),
            mtu: r.mtu,
            txqueuelen: r.txqueuelen,
            up: r.up,
            oper_state: r.oper_state.clone(),
            mac: r.mac.as_ref().map(mac_to_string),
            addresses: r.addresses.iter().map(|(a, p)| format!("{a}/{p}")).collect(),
            offloads: r.offloads.map(|o| o.names()),
            rx_packets: r.stats.rx_packets,
            rx_bytes: r.stats.rx_bytes,
            rx_errors: r.stats.rx_errors,
            rx_dropped: r.stats.rx_dropped,
            tx_packets: r.stats.tx_packets,
            tx_bytes: r.stats.tx_bytes,
            tx_errors: r.stats.tx_errors,
            tx_dropped: r.stats.tx_dropped,
        }
    }
}

pub fn info(args: &InfoArgs) -> Result<()> {
    let mut netlink = Netlink::new()?;
    let reports = match &args.device {
        Some(name) => vec![inspect::inspect(&mut netlink, name)?],
        None => inspect::inspect_all(&mut netlink)?,
    };
    if args.json {
        let json: Vec<DeviceJson> = reports.iter().map(DeviceJson::from).collect();
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    if reports.is_empty() {
        println!("no TUN/TAP devices in this network namespace");
    }
    for r in &reports {
        print!("{}", render_report(r));
    }
    Ok(())
}

/// The text form of one device, laid out like `ip -s link`.
pub fn render_report(r: &DeviceReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let id = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    let _ = writeln!(
        s,
        "{}: {}: <{}> persist {}",
        r.index,
        r.name,
        r.flag_names.join(","),
        if r.persist { "on" } else { "off" }
    );
    let pids = if r.queue_holders.is_empty() {
        String::new()
    } else {
        format!(" (pids {})", r.queue_holders.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
    };
    let _ = writeln!(
        s,
        "    mode {} queues {} (detached {}){} owner {} group {}",
        r.mode,
        r.queues,
        r.disabled_queues,
        pids,
        id(r.owner),
        id(r.group)
    );
    let _ = writeln!(
        s,
        "    mtu {} qlen {} state {} ({})",
        r.mtu,
        r.txqueuelen,
        if r.up { "UP" } else { "DOWN" },
        r.oper_state
    );
    if let Some(mac) = &r.mac {
        let _ = writeln!(s, "    link/ether {}", mac_to_string(mac));
    }
    let _ = writeln!(s, "    offloads {}", r.offloads.map_or("unknown".to_string(), |o| o.to_string()));
    for (addr, prefix) in &r.addresses {
        let family = if addr.is_ipv4() { "inet" } else { "inet6" };
        let _ = writeln!(s, "    {family} {addr}/{prefix}");
    }
    let st = &r.stats;
    let _ = writeln!(
        s,
        "    RX: packets {} bytes {} errors {} dropped {}",
        st.rx_packets, st.rx_bytes, st.rx_errors, st.rx_dropped
    );
    let _ = writeln!(
        s,
        "    TX: packets {} bytes {} errors {} dropped {}",
        st.tx_packets, st.tx_bytes, st.tx_errors, st.tx_dropped
    );
    s
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Interface name (at most 15 bytes).
    pub name: String,
    /// A TAP (Ethernet) device instead of TUN.
    #[arg(long)]
    pub tap: bool,
    /// Create it as a multiqueue device.
    #[arg(long)]
    pub multi_queue: bool,
    /// Create it with the virtio net header flag.
    #[arg(long)]
    pub vnet_hdr: bool,
    /// Owner uid allowed to attach without CAP_NET_ADMIN.
    #[arg(long)]
    pub owner: Option<u32>,
    /// Group gid allowed to attach without CAP_NET_ADMIN.
    #[arg(long)]
    pub group: Option<u32>,
    #[command(flatten)]
    pub queueing: QueueingArgs,
}

/// How the device queues packets for its reader; shared by `create`, `fwd` and `echo`.
#[derive(Debug, Clone, Args)]
pub struct QueueingArgs {
    /// The device's transmit queue length: how many packets each queue's ring holds for the reader before the
    /// kernel drops (interface `TX dropped`). Longer absorbs longer bursts, at the price of latency.
    #[arg(long, value_name = "PACKETS")]
    pub txqueuelen: Option<u32>,
    /// Ask for IFF_BACKPRESSURE (a full ring stops the queue instead of dropping). Where the kernel does not
    /// offer it (`turbotun features` says), the device opens without it and a note says so.
    #[arg(long)]
    pub backpressure: bool,
}

impl QueueingArgs {
    /// The builder with these settings.
    pub fn apply(&self, builder: DeviceBuilder) -> DeviceBuilder {
        let builder = builder.backpressure(self.backpressure);
        match self.txqueuelen {
            Some(len) => builder.txqueuelen(len),
            None => builder,
        }
    }
}

pub fn create(args: &CreateArgs) -> Result<()> {
    let mut builder = DeviceBuilder::new(if args.tap { Mode::Tap } else { Mode::Tun })
        .name(&args.name)
        .exclusive(true)
        .persist(true)
        .multi_queue(args.multi_queue);
    if args.vnet_hdr {
        builder = builder.vnet_hdr(turbotun::wire::virtio_net::VIRTIO_NET_HDR_LEN);
    }
    if let Some(uid) = args.owner {
        builder = builder.owner(uid);
    }
    if let Some(gid) = args.group {
        builder = builder.group(gid);
    }
    let device = args.queueing.apply(builder).open()?;
    for note in device.notes() {
        eprintln!("turbotun create: {note}");
    }
    println!("created persistent {} device {}", device.mode(), device.name());
    Ok(())
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The persistent TUN/TAP device to delete.
    pub name: String,
}

pub fn delete(args: &DeleteArgs) -> Result<()> {
    turbotun::validate_ifname(&args.name)?;
    let mut netlink = Netlink::new()?;
    let report = inspect::inspect(&mut netlink, &args.name)?;
    if !report.persist {
        anyhow::bail!(
            "{} is not persistent: it disappears when its holders close it (pids {:?})",
            args.name,
            report.queue_holders
        );
    }
    // Attach with the flags it has, so that attaching changes nothing, then clear persist: the device goes
    // away when this last fd closes.
    let has = |flag: &str| report.flag_names.contains(&flag);
    let mut builder = DeviceBuilder::new(report.mode)
        .name(&args.name)
        .packet_info(!has("no_pi"))
        .queues(if has("multi_queue") { 2 } else { 1 });
    if has("vnet_hdr") {
        builder = builder.vnet_hdr(turbotun::wire::virtio_net::VIRTIO_NET_HDR_LEN);
    }
    let device = builder.open()?;
    device.set_persist(false)?;
    drop(device);
    println!("deleted {}", args.name);
    Ok(())
}
