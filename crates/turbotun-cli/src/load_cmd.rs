//! `turbotun load gen` and `turbotun load sink`: the library's paced UDP generator and counting sink
//! (`turbotun::load`), with a pktgen-style summary or one JSON line.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Subcommand};
use turbotun::load::{Generator, GeneratorReport, SinkBuilder, SinkReport, DEFAULT_RCVBUF};
use turbotun::StopHandle;

/// Arguments of `turbotun load`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    #[command(subcommand)]
    pub command: LoadCommand,
}

/// `turbotun load gen|sink`.
#[derive(Debug, Subcommand)]
pub enum LoadCommand {
    /// Send paced UDP datagrams (flow id, sequence number, send time in each) to --remote ADDR:PORT.
    Gen(GenArgs),
    /// Receive datagrams from `load gen` and count them per flow: lost, reordered, duplicated.
    Sink(SinkArgs),
}

/// Arguments of `turbotun load gen`.
#[derive(Debug, Args)]
pub struct GenArgs {
    /// Where to send (ADDR:PORT or HOST:PORT), as `tunnel --remote`.
    #[arg(long = "remote", alias = "dest", value_name = "ADDR:PORT", value_parser = crate::args::remote_addr)]
    pub dest: SocketAddr,
    /// Offered rate in datagrams per second (0: as fast as the kernel takes them).
    #[arg(long, value_name = "PPS", default_value_t = 0)]
    pub rate: u64,
    /// UDP payload bytes per datagram (at least 16, the load header).
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    pub size: usize,
    /// Flows, each from its own socket (source port).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub flows: usize,
    /// Seconds to send (SIGINT stops earlier).
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = crate::args::seconds)]
    pub duration: Duration,
    /// Datagrams per send with UDP GSO (UDP_SEGMENT); off by default.
    #[arg(long, value_name = "SEGMENTS")]
    pub gso: Option<u16>,
    /// Print one JSON line instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `turbotun load sink`.
#[derive(Debug, Args)]
pub struct SinkArgs {
    /// The address to receive on (ADDR:PORT), as `tunnel --local`.
    #[arg(long = "local", alias = "bind", value_name = "ADDR:PORT", value_parser = crate::args::socket_addr)]
    pub bind: SocketAddr,
    /// Ask for UDP_GRO (coalesced reads, split again by their segment size).
    #[arg(long)]
    pub gro: bool,
    /// Seconds to receive; without it, until SIGINT/SIGTERM.
    #[arg(long, value_name = "SECS", value_parser = crate::args::seconds)]
    pub duration: Option<Duration>,
    /// Receive buffer to ask for, bytes (SO_RCVBUFFORCE as root, else SO_RCVBUF up to rmem_max).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_RCVBUF)]
    pub rcvbuf: usize,
    /// Print one JSON line instead of the summary.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &LoadArgs) -> Result<()> {
    match &args.command {
        LoadCommand::Gen(a) => gen(a),
        LoadCommand::Sink(a) => sink(a),
    }
}

fn stop_on_signals() -> Result<StopHandle> {
    let stop = StopHandle::new();
    stop.stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    Ok(stop)
}

fn gen(a: &GenArgs) -> Result<()> {
    let generator =
        Generator::new(a.dest).rate(a.rate).size(a.size).flows(a.flows).gso(a.gso.unwrap_or(1)).duration(a.duration);
    generator.validate()?;
    let report = generator.stop_handle(stop_on_signals()?).run()?;
    if a.json {
        crate::out!("{}", serde_json::to_string(&report)?);
    } else {
        crate::out_raw!("{}", gen_summary(a.dest, &report));
    }
    Ok(())
}

fn sink(a: &SinkArgs) -> Result<()> {
    let mut builder = SinkBuilder::new(a.bind).gro(a.gro).rcvbuf(a.rcvbuf).stop_handle(stop_on_signals()?);
    if let Some(duration) = a.duration {
        builder = builder.duration(duration);
    }
    let sink = builder.bind()?;
    if !a.json {
        let (rcvbuf, forced) = sink.rcvbuf();
        eprintln!(
            "turbotun load sink: listening on {}, gro {}, rcvbuf {rcvbuf} bytes ({})",
            sink.local_addr()?,
            on_off(sink.gro()),
            if forced { "SO_RCVBUFFORCE" } else { "SO_RCVBUF, capped by net.core.rmem_max" }
        );
    }
    let report = sink.run()?;
    if a.json {
        crate::out!("{}", serde_json::to_string(&report)?);
    } else {
        crate::out_raw!("{}", sink_summary(&report));
    }
    Ok(())
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

fn gen_summary(dest: SocketAddr, r: &GeneratorReport) -> String {
    let rate = if r.rate_pps == 0 { "unlimited".to_string() } else { format!("{} pps", r.rate_pps) };
    let e = &r.errors;
    format!(
        "gen -> {dest}: size {} flows {} gso {} rate {rate}\n\
         \x20 offered      {:>12} pkts  {:>12.0} pps\n\
         \x20 transmitted  {:>12} pkts  {:>12.0} pps  {:.1} Mbit/s payload\n\
         \x20 send errors  {:>12} pkts  (ENOBUFS {}, EAGAIN {}, ECONNREFUSED {})\n\
         \x20 seconds      {:>12.3}        sendmmsg calls {}\n",
        r.size,
        r.flows,
        if r.segments > 1 { r.segments.to_string() } else { "off".into() },
        r.attempted,
        r.offered_pps,
        r.sent,
        r.achieved_pps,
        r.achieved_pps * r.size as f64 * 8.0 / 1e6,
        r.send_errors,
        e.nobufs,
        e.again,
        e.refused,
        r.seconds,
        r.calls,
    )
}

fn sink_summary(r: &SinkReport) -> String {
    let mut s = format!(
        "sink: gro {} rcvbuf {} bytes{}\n\
         \x20 received     {:>12} pkts  {:>12.0} pps  {:.1} Mbit/s payload  ({} messages, {} reads)\n\
         \x20 lost         {:>12}\n\
         \x20 reordered    {:>12}\n\
         \x20 duplicated   {:>12}\n\
         \x20 socket drops {:>12}  (SO_RXQ_OVFL, as of the last datagram)\n\
         \x20 seconds      {:>12.3}  (first to last datagram)\n",
        on_off(r.gro),
        r.rcvbuf,
        if r.rcvbuf_forced { " (forced)" } else { "" },
        r.datagrams,
        r.pps,
        r.pps * (r.bytes as f64 / r.datagrams.max(1) as f64) * 8.0 / 1e6,
        r.messages,
        r.reads,
        r.lost,
        r.reordered,
        r.duplicated,
        r.socket_drops,
        r.seconds,
    );
    for (what, n) in [("stale", r.stale), ("malformed", r.malformed), ("unknown flow", r.unknown_flow)] {
        if n > 0 {
            s += &format!("  {what:<12} {n:>12}\n");
        }
    }
    if r.truncated > 0 {
        s += &format!("  truncated    {:>12} messages\n", r.truncated);
    }
    if r.flows.len() > 1 {
        for f in &r.flows {
            let c = &f.counts;
            s += &format!(
                "  flow {:<5} received {} lost {} reordered {} duplicated {}{}\n",
                f.flow,
                c.received,
                c.lost,
                c.reordered,
                c.duplicated,
                if c.stale > 0 { format!(" stale {}", c.stale) } else { String::new() }
            );
        }
    }
    s
}
