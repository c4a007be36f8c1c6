//! The device commands: `turbotun features`, `turbotun info`, `turbotun create`, `turbotun set`, `turbotun delete`.

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use turbotun::filter::{FilterProgram, TxFilter};
use turbotun::inspect::{self, DeviceReport};
use turbotun::netlink::{mac_to_string, Netlink};
use turbotun::privilege::{group_id, UserSpec};
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
    udp_tunnel_gso: bool,
    udp_tunnel_gso_csum: bool,
    udp_tunnel_vnet_hdr_len: usize,
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
    let offloads = caps.offloads().unwrap_or_default();
    let report = FeaturesJson {
        tungetfeatures: format!("{:#06x}", caps.iff_features()),
        iff_flags: inspect::flag_names(caps.iff_features()),
        vnet_hdr: caps.vnet_hdr(),
        vnet_hdr_sizes: caps.vnet_hdr_sizes().to_vec(),
        offloads_probed: caps.offloads().is_some(),
        offloads: offloads.names(),
        uso: caps.uso(),
        udp_tunnel_gso: caps.udp_tunnel_gso(),
        udp_tunnel_gso_csum: caps.udp_tunnel_gso_csum(),
        udp_tunnel_vnet_hdr_len: turbotun::device::UDP_TUNNEL_VNET_HDR_LEN,
        multi_queue: caps.multi_queue(),
        napi: caps.napi(),
        napi_frags: caps.napi_frags(),
        backpressure: caps.backpressure(),
        steering_ebpf: caps.steering_ebpf(),
        steering_ebpf_error: caps.steering_ebpf_missing().map(str::to_string),
        io_uring: caps.io_uring(),
    };
    if args.json {
        crate::out!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let yes = |b: bool| if b { "yes" } else { "no" };
    crate::out!("tun driver (TUNGETFEATURES {}): {}", report.tungetfeatures, report.iff_flags.join(" "));
    crate::out!("  vnet header       {} (sizes {})", yes(report.vnet_hdr), join_sizes(&report.vnet_hdr_sizes));
    if caps.offloads().is_some() {
        for (bits, label) in [
            (Offloads::CSUM, "csum"),
            (Offloads::TSO4, "tso4"),
            (Offloads::TSO6, "tso6"),
            (Offloads::TSO_ECN, "tso_ecn"),
            (Offloads::USO4 | Offloads::USO6, "uso4+uso6"),
            (Offloads::UFO, "ufo"),
        ] {
            crate::out!("  offload {label:<10}{}", yes(offloads.contains(bits)));
        }
        let tunnel = match (caps.udp_tunnel_gso(), caps.udp_tunnel_gso_csum()) {
            (true, true) => "yes (with outer checksum; 24-byte header)",
            (true, false) => "yes (without outer checksum; 24-byte header)",
            _ => "no (Linux 6.17+)",
        };
        crate::out!("  udp tunnel gso    {tunnel}");
    } else {
        crate::out!("  offloads          not probed (needs CAP_NET_ADMIN to create a scratch device)");
    }
    crate::out!("  multiqueue        {}", yes(report.multi_queue));
    crate::out!("  napi              {}", yes(report.napi));
    crate::out!("  napi_frags        {}", yes(report.napi_frags));
    if report.backpressure {
        crate::out!(
            "  backpressure      yes (IFF_BACKPRESSURE: a full transmit ring stops the queue, nothing dropped)"
        );
    } else {
        crate::out!("  backpressure      no (no IFF_BACKPRESSURE: a full transmit ring tail-drops; see txqueuelen)");
    }
    match caps.steering_ebpf_missing() {
        None => crate::out!("  steering eBPF     yes"),
        Some(why) => crate::out!("  steering eBPF     no ({why})"),
    }
    crate::out!("  io_uring          {}", yes(report.io_uring));
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
    master: Option<String>,
    carrier: Option<bool>,
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
            master: r.master.clone(),
            carrier: r.carrier,
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
        crate::out!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    if reports.is_empty() {
        crate::out!("no TUN/TAP devices in this network namespace");
    }
    for r in &reports {
        crate::out_raw!("{}", render_report(r));
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
    let carrier = match r.carrier {
        Some(true) => "on",
        Some(false) => "off (NO-CARRIER)",
        None => "unknown",
    };
    let _ = writeln!(s, "    mtu {} qlen {} {} carrier {}", r.mtu, r.txqueuelen, state(r), carrier);
    if let Some(mac) = &r.mac {
        let _ = writeln!(s, "    link/ether {}", mac_to_string(mac));
    }
    if let Some(master) = &r.master {
        let _ = writeln!(s, "    master {master}");
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

/// `state UP`, `state DOWN`, and the operational state where it says more (`state UP (operstate DOWN)`: up,
/// but no carrier).
fn state(r: &DeviceReport) -> String {
    let admin = if r.up { "UP" } else { "DOWN" };
    if r.oper_state == admin {
        format!("state {admin}")
    } else {
        format!("state {admin} (operstate {})", r.oper_state)
    }
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Interface name (at most 15 bytes).
    pub name: String,
    /// A TAP (Ethernet) device instead of TUN.
    #[arg(long)]
    pub tap: bool,
    /// Queues the device takes: 1 makes a single-queue device; more make it multiqueue (IFF_MULTI_QUEUE), so
    /// that up to 256 queues can be attached, each by whoever opens it (the kernel keeps no count until then).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = crate::args::queue_count)]
    pub queues: usize,
    /// Old spelling of --queues 2 (or more).
    #[arg(long, hide = true)]
    pub multi_queue: bool,
    /// Create it with the virtio net header flag.
    #[arg(long)]
    pub vnet_hdr: bool,
    /// Offloads the device accepts from the kernel (TUNSETOFFLOAD): `all`, `tcp`, `none`, or a list such as
    /// `csum,tso4,tso6,uso`. Implies --vnet-hdr (offloaded packets carry a virtio header).
    #[arg(long, value_name = "LIST")]
    pub offloads: Option<String>,
    /// The user (name or uid) allowed to attach without CAP_NET_ADMIN, as `ip tuntap add ... user` takes it.
    #[arg(long, visible_alias = "user", value_name = "USER")]
    pub owner: Option<String>,
    /// The group (name or gid) whose members may attach without CAP_NET_ADMIN, as `ip tuntap add ... group`.
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    #[command(flatten)]
    pub queueing: QueueingArgs,
    #[command(flatten)]
    pub l2: L2Args,
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

/// Layer-2 settings shared by `create` and `set`.
#[derive(Debug, Args)]
pub struct L2Args {
    /// Attach the device to this Linux bridge (`ip link set DEV master BR`).
    #[arg(long, value_name = "BR")]
    pub master: Option<String>,
    /// The MAC address (TAP): aa:bb:cc:dd:ee:ff.
    #[arg(long, value_name = "MAC")]
    pub mac: Option<String>,
    /// TAP TX filter (TUNSETTXFILTER): only frames to these destinations reach the reader. A comma-separated
    /// list of MAC addresses (at most 8 unicast) and the words `broadcast` and `allmulti`; `off` removes it.
    #[arg(long, value_name = "LIST")]
    pub tx_filter: Option<String>,
    /// eBPF filter run before the queue (TUNSETFILTEREBPF): `drop-all`, `protocols=ipv4,ipv6,arp,0x88cc`
    /// (frames of other EtherTypes are dropped), or `off`.
    #[arg(long, value_name = "SPEC")]
    pub ebpf_filter: Option<String>,
}

impl L2Args {
    fn has_filters(&self) -> bool {
        self.tx_filter.is_some() || self.ebpf_filter.is_some()
    }
}

/// A `--tx-filter` value: `None` for `off`.
fn parse_tx_filter(text: &str) -> Result<Option<TxFilter>> {
    if text.trim() == "off" {
        return Ok(None);
    }
    Ok(Some(TxFilter::parse(text).with_context(|| format!("--tx-filter {text}"))?))
}

/// An `--ebpf-filter` value, loaded: `None` for `off`.
fn load_ebpf_filter(spec: &str) -> Result<Option<FilterProgram>> {
    let spec = spec.trim();
    if spec == "off" {
        return Ok(None);
    }
    if spec == "drop-all" {
        return Ok(Some(FilterProgram::drop_all()?));
    }
    let Some(list) = spec.strip_prefix("protocols=") else {
        anyhow::bail!("--ebpf-filter {spec:?}: expected drop-all, protocols=LIST or off");
    };
    let mut protocols = Vec::new();
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        protocols.push(match word {
            "ipv4" => 0x0800,
            "ipv6" => 0x86dd,
            "arp" => 0x0806,
            _ => word
                .strip_prefix("0x")
                .and_then(|hex| u16::from_str_radix(hex, 16).ok())
                .ok_or_else(|| anyhow::anyhow!("--ebpf-filter: {word:?} is not ipv4, ipv6, arp or 0xHHHH"))?,
        });
    }
    Ok(Some(FilterProgram::allow_protocols(&protocols)?))
}

/// Applies the filters of `l2` through an open device.
fn apply_filters(device: &turbotun::Device, l2: &L2Args) -> Result<Vec<String>> {
    let mut done = Vec::new();
    if let Some(text) = &l2.tx_filter {
        let filter = parse_tx_filter(text)?;
        device.set_tx_filter(filter.as_ref())?;
        done.push(match filter {
            Some(f) => format!("tx filter {f}"),
            None => "tx filter off".into(),
        });
    }
    if let Some(spec) = &l2.ebpf_filter {
        let program = load_ebpf_filter(spec)?;
        device.set_filter_program(program.as_ref())?;
        done.push(match program {
            Some(p) => format!("ebpf filter: {}", p.description()),
            None => "ebpf filter off".into(),
        });
    }
    Ok(done)
}

/// A `--mac` value: a unicast address (the kernel refuses a multicast one with a bare EADDRNOTAVAIL).
fn device_mac(text: &str) -> Result<[u8; 6]> {
    let mac = turbotun::filter::parse_mac(text)?;
    if mac[0] & 1 != 0 {
        anyhow::bail!("--mac {text}: a multicast address; a device's MAC address must be unicast");
    }
    Ok(mac)
}

/// Applies the link settings of `l2` through rtnetlink.
fn apply_link(netlink: &mut Netlink, name: &str, l2: &L2Args) -> Result<Vec<String>> {
    let mut done = Vec::new();
    if let Some(text) = &l2.mac {
        let mac = device_mac(text)?;
        netlink.set_mac(name, mac)?;
        done.push(format!("mac {}", mac_to_string(&mac)));
    }
    if let Some(bridge) = &l2.master {
        netlink.set_master(name, Some(bridge))?;
        done.push(format!("master {bridge}"));
    }
    Ok(done)
}

/// Parses the layer-2 options (TX filter, MAC, eBPF filter) so that a bad one is refused before anything changes.
fn check_l2(l2: &L2Args) -> Result<()> {
    if let Some(text) = &l2.tx_filter {
        parse_tx_filter(text)?;
    }
    if let Some(text) = &l2.mac {
        device_mac(text)?;
    }
    if let Some(spec) = &l2.ebpf_filter {
        load_ebpf_filter(spec)?;
    }
    Ok(())
}

pub fn create(args: &CreateArgs) -> Result<()> {
    // Everything that can be refused without the kernel is checked before the device exists.
    turbotun::validate_ifname(&args.name)?;
    if args.l2.mac.is_some() && !args.tap {
        return Err(crate::process::usage(
            "--mac needs --tap: a TUN device carries IP packets without an Ethernet header, so it has no MAC address",
        ));
    }
    check_l2(&args.l2).map_err(crate::process::usage_of)?;
    let offloads = args
        .offloads
        .as_deref()
        .map(|list| {
            // As a turbotun::Error the unknown word reads "invalid configuration: unknown offload ...".
            Offloads::parse(list).map_err(|e| crate::process::usage(format!("--offloads {list}: {e}")))
        })
        .transpose()?;
    let owner = args.owner.as_deref().map(|user| UserSpec::new(user).uid().context("--owner")).transpose()?;
    let group = args.group.as_deref().map(|group| group_id(group).context("--group")).transpose()?;
    let mut builder = DeviceBuilder::new(if args.tap { Mode::Tap } else { Mode::Tun })
        .name(&args.name)
        .exclusive(true)
        .persist(true)
        .multi_queue(args.multi_queue || args.queues > 1);
    if args.vnet_hdr || offloads.is_some() {
        builder = builder.vnet_hdr(turbotun::wire::virtio_net::VIRTIO_NET_HDR_LEN);
    }
    if let Some(offloads) = offloads {
        builder = builder.offloads(offloads);
    }
    if let Some(uid) = owner {
        builder = builder.owner(uid);
    }
    if let Some(gid) = group {
        builder = builder.group(gid);
    }
    let device = args.queueing.apply(builder).open()?;
    for note in device.notes() {
        eprintln!("turbotun create: {note}");
    }
    let configured = (|| -> Result<Vec<String>> {
        let mut done = apply_filters(&device, &args.l2)?;
        let mut netlink = Netlink::new()?;
        done.extend(apply_link(&mut netlink, device.name(), &args.l2)?);
        Ok(done)
    })();
    let mut done = match configured {
        Ok(done) => done,
        Err(e) => {
            // Nothing left behind: the device goes when this fd closes.
            let _ = device.set_persist(false);
            return Err(e.context(format!("configuring {} (not created)", device.name())));
        }
    };
    if offloads.is_some() {
        done.push(format!("offloads {}", device.offloads()));
    }
    let extra = if done.is_empty() { String::new() } else { format!(": {}", done.join(", ")) };
    crate::out!("created persistent {} device {}{extra}", device.mode(), device.name());
    if owner.is_none() && group.is_none() {
        eprintln!("turbotun create: warning: {}", open_to_anyone(device.name()));
    }
    Ok(())
}

/// What a device without owner or group means: the kernel checks neither a capability nor a user when a
/// process attaches to it, so whoever can open /dev/net/tun may read and inject its traffic.
fn open_to_anyone(name: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata("/dev/net/tun").map(|m| m.permissions().mode() & 0o777).unwrap_or(0o666);
    let who = if mode & 0o006 == 0o006 {
        format!("any local user (/dev/net/tun is mode {mode:o})")
    } else {
        format!("any process that can open /dev/net/tun (mode {mode:o} here)")
    };
    format!(
        "{name} has no owner or group, so {who} may attach to it and read or inject its traffic: give --owner USER \
         or --group GROUP to allow only them (or delete it: turbotun delete {name})"
    )
}

#[derive(Debug, Args)]
pub struct SetArgs {
    /// The TUN/TAP device.
    pub name: String,
    /// Detach the device from its bridge.
    #[arg(long, conflicts_with = "master")]
    pub nomaster: bool,
    /// Turn the carrier on or off (off: the link shows NO-CARRIER). The carrier follows the queues: the kernel
    /// turns it off when the last one closes and on when one attaches, so this needs a process holding the device.
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    pub carrier: Option<String>,
    #[command(flatten)]
    pub l2: L2Args,
}

pub fn set(args: &SetArgs) -> Result<()> {
    let l2 = &args.l2;
    if l2.mac.is_none() && l2.master.is_none() && !args.nomaster && args.carrier.is_none() && !l2.has_filters() {
        return Err(crate::process::usage(
            "nothing to set: give --master, --nomaster, --mac, --carrier, --tx-filter or --ebpf-filter",
        ));
    }
    check_l2(l2).map_err(crate::process::usage_of)?;
    turbotun::validate_ifname(&args.name)?;
    let mut netlink = Netlink::new()?;
    let report = inspect::inspect(&mut netlink, &args.name)?;
    // Refuse what cannot work before anything is changed.
    if args.l2.mac.is_some() && report.mode == Mode::Tun {
        anyhow::bail!(
            "{} is a TUN device: --mac applies to TAP devices (a TUN device carries IP packets without an Ethernet \
             header, so it has no MAC address)",
            args.name
        );
    }
    if args.carrier.is_some() && report.queues == 0 {
        anyhow::bail!(
            "{}: no queue is attached, and the tun driver keeps the carrier off until one is (it turns it on when \
             a process opens the device, unless that open asks for IFF_NO_CARRIER)",
            args.name
        );
    }
    let mut done = Vec::new();
    if args.l2.has_filters() {
        // The filters are set through a queue fd: attach with the flags the device has, so that attaching
        // changes nothing. A device held by another process without multiqueue refuses (EBUSY).
        let has = |flag: &str| report.flag_names.contains(&flag);
        let mut builder =
            DeviceBuilder::new(report.mode).name(&args.name).packet_info(!has("no_pi")).multi_queue(has("multi_queue"));
        if has("vnet_hdr") {
            builder = builder.vnet_hdr(turbotun::wire::virtio_net::VIRTIO_NET_HDR_LEN);
        }
        let device = builder.open().with_context(|| format!("attaching to {} to set its filters", args.name))?;
        done.extend(apply_filters(&device, &args.l2)?);
    }
    done.extend(apply_link(&mut netlink, &args.name, &args.l2)?);
    if args.nomaster {
        netlink.set_master(&args.name, None)?;
        done.push("nomaster".into());
    }
    if let Some(carrier) = &args.carrier {
        netlink.set_carrier(&args.name, carrier == "on")?;
        done.push(format!("carrier {carrier}"));
    }
    crate::out!("{}: {}", args.name, done.join(", "));
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
    crate::out!("deleted {}", args.name);
    Ok(())
}
