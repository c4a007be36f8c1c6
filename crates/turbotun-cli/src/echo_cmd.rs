//! `turbotun echo`: the library's echo responder on one device, until SIGINT/SIGTERM.

use std::net::IpAddr;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use turbotun::echo::{EchoBuilder, EchoMode, EchoStats};
use turbotun::netlink::Netlink;
use turbotun::Mode;

use crate::device_cmd::QueueingArgs;

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EchoModeArg {
    /// No virtio header: one packet per read and per write.
    Plain,
    /// Virtio header and offloads: super-packets split on read (UDP ones answered whole, as one super-packet),
    /// answers coalesced before writing.
    Offload,
}

/// Answers what the kernel sends into the device: ARP requests and IPv6 neighbour solicitations (TAP) with
/// its own MAC, ICMP and ICMPv6 echo requests, and UDP to any port (sent back with addresses and ports
/// swapped), for every address routed into the device but its own. TCP is never answered (counted as
/// ignored), nor is anything from a non-unicast source.
#[derive(Debug, Args)]
pub struct EchoArgs {
    /// The device (created if missing).
    pub dev: String,
    /// A TAP (Ethernet) device instead of TUN.
    #[arg(long)]
    pub tap: bool,
    #[arg(long, value_enum, default_value_t = EchoModeArg::Offload)]
    pub mode: EchoModeArg,
    /// An address to give the device, ADDR/PREFIX (repeatable); every other address of the prefix answers.
    #[arg(long = "addr", value_name = "ADDR/PREFIX")]
    pub addrs: Vec<String>,
    /// Print the closing counters as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub queueing: QueueingArgs,
}

pub fn run(args: &EchoArgs) -> Result<()> {
    let addrs = args.addrs.iter().map(|a| parse_addr(a)).collect::<Result<Vec<_>>>()?;
    let mode = match args.mode {
        EchoModeArg::Plain => EchoMode::Plain,
        EchoModeArg::Offload => EchoMode::Offload,
    };
    let mut builder = EchoBuilder::new(mode);
    let device_mode = if args.tap { Mode::Tap } else { Mode::Tun };
    let device = args.queueing.apply(builder.device(device_mode)).name(&args.dev);
    let dev = device.open().with_context(|| format!("opening {}", args.dev))?;
    for note in dev.notes() {
        eprintln!("turbotun echo: {note}");
    }
    let mut netlink = Netlink::new()?;
    for &(addr, prefix) in &addrs {
        netlink
            .add_address(&args.dev, addr, prefix)
            .with_context(|| format!("adding {addr}/{prefix} to {}", args.dev))?;
    }
    netlink.set_up(&args.dev, true).with_context(|| format!("bringing {} up", args.dev))?;
    // The device's own addresses (also those it had before) are never answered for.
    for (addr, prefix) in netlink.addresses(&args.dev)?.into_iter().chain(addrs) {
        builder = builder.own_address(addr, prefix);
    }
    let echo = builder.build(dev)?;
    echo.stop_handle().stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let stats = echo.stats();
    crate::out!("ready");
    let start = Instant::now();
    let result = echo.run();
    let seconds = start.elapsed().as_secs_f64();
    let last = stats.snapshot();
    match args.json {
        true => crate::out!("{}", counters_line(mode, device_mode, &last, seconds)),
        false => crate::out!("{}", counters_text(&last, seconds)),
    }
    let answers = last.answered.total();
    eprintln!(
        "turbotun echo: {answers} answers in {seconds:.1} s: {:.0} answers/s ({:.0} packets/s written)",
        answers as f64 / seconds.max(1e-9),
        last.counters.packets as f64 / seconds.max(1e-9)
    );
    result.map(drop).map_err(anyhow::Error::from)
}

fn parse_addr(spec: &str) -> Result<(IpAddr, u8)> {
    let Some((addr, prefix)) = spec.split_once('/') else {
        return Err(crate::process::usage(format!("--addr {spec}: expected ADDR/PREFIX, e.g. 10.9.0.1/24")));
    };
    let addr: IpAddr = addr.parse().with_context(|| format!("--addr {spec}: {addr} is not an IP address"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    match prefix.parse::<u8>() {
        Ok(p) if p <= max => Ok((addr, p)),
        _ => Err(crate::process::usage(format!("--addr {spec}: the prefix length must be a number from 0 to {max}"))),
    }
}

/// The counters as text: `1,204 answers in 10.0 s (120 a second): 3 arp, 1,200 icmp, 0 icmp6, 1 nd, 0 udp;
/// 2 ignored (2 tcp); 1,204 packets written, no drops`.
fn counters_text(stats: &EchoStats, seconds: f64) -> String {
    let (a, i, c) = (&stats.answered, &stats.ignored, &stats.counters);
    let drops = match c.drops.total() {
        0 => "no drops".to_string(),
        n => format!("{n} dropped"),
    };
    format!(
        "{} answers in {seconds:.1} s ({:.0} a second): {} arp, {} icmp, {} icmp6, {} nd, {} udp; {} ignored ({} tcp, {} \
         not unicast, {} to its own address, {} other); {} packets written, {drops}",
        a.total(),
        a.total() as f64 / seconds.max(1e-9),
        a.arp,
        a.icmp,
        a.icmp6,
        a.nd,
        a.udp,
        i.total(),
        i.tcp,
        i.not_unicast,
        i.own_address,
        i.other,
        c.packets
    )
}

/// The counters as one JSON line: the I/O counters at the top level (as `turbotun fwd` prints them), then the
/// answers by kind, what was ignored, and the run's length.
fn counters_line(mode: EchoMode, device: Mode, stats: &EchoStats, seconds: f64) -> serde_json::Value {
    let c = &stats.counters;
    let device = if device == Mode::Tap { "tap" } else { "tun" };
    let mut line = serde_json::json!({ "mode": mode.as_str(), "device": device });
    if let (Some(line), Ok(serde_json::Value::Object(counters))) = (line.as_object_mut(), serde_json::to_value(c)) {
        line.extend(counters);
        line.insert("drops".into(), c.drops.total().into());
        line.insert("drops_by_reason".into(), serde_json::to_value(c.drops).unwrap_or_default());
        line.insert("answered".into(), serde_json::to_value(stats.answered).unwrap_or_default());
        line.insert("ignored".into(), serde_json::to_value(stats.ignored).unwrap_or_default());
        line.insert("seconds".into(), serde_json::json!((seconds * 1000.0).round() / 1000.0));
        line.insert(
            "answers_per_second".into(),
            serde_json::json!((stats.answered.total() as f64 / seconds.max(1e-9)).round()),
        );
    }
    line
}
