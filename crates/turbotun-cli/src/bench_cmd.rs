//! `turbotun bench`: the arguments, read by clap and handed to the `turbotun-bench` crate as its plain
//! [`turbotun_bench::Options`] (or, for the hidden flags the bench starts this binary with, as a
//! [`turbotun_bench::Helper`]). See docs/BENCH.md.

use std::path::PathBuf;

use clap::Args;

/// Arguments of `turbotun bench`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("wg_either").args(["wg_scale", "wg_storm"]).multiple(false)))]
pub struct BenchArgs {
    /// Short run (the main job): 3 s, 1 repetition, modes veth, turbotun-offload, turbotun-plain, tunrs-offload,
    /// traffic tcp and udp64. --duration, --reps, --modes and --traffic still override. Never includes the
    /// tunnel bench; with --tunnel: every tunnel kind, tcp and udp1372, 1 repetition of 3 s.
    #[arg(long)]
    pub quick: bool,
    /// Comma-separated modes: labels from --list, a turbotun mode without its prefix (`offload`), or a family
    /// (`turbotun`, `tunrs`, `wggo`, `peers`, `baselines`). Default: every available mode.
    #[arg(long, value_delimiter = ',')]
    pub modes: Option<Vec<String>>,
    /// Comma-separated traffic kinds (tcp, tcp4, udp64, udp1400, gso64; see --list). Default: all.
    #[arg(long, value_delimiter = ',')]
    pub traffic: Option<Vec<String>>,
    /// Seconds per run (default 10, 3 with --quick; --loss and --echo: 5, 2 with --quick).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<u64>,
    /// Repetitions of every (mode, traffic) pair, interleaved round-robin (default 3, 1 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: Option<u32>,
    /// Run the IPv6 variant (fd00:1::1/64, fd00:2::1/64, no DAD) instead of IPv4.
    #[arg(long)]
    pub ipv6: bool,
    /// Write every run and the summary as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write a grouped bar chart (.svg or .png).
    #[arg(long, value_name = "FILE")]
    pub chart: Option<PathBuf>,
    /// Profile each forwarder mode in one extra run of the first traffic kind (perf record -e cpu-clock -g)
    /// and write DIR/MODE.svg (turbotun modes) or DIR/PEER-MODE.svg (peers), with perf's recording beside each
    /// (MODE.perf.data, for `perf report -i FILE --sort dso,sym`).
    #[arg(long, value_name = "DIR")]
    pub flamegraph: Option<PathBuf>,
    /// List the modes (and whether they are available) and the traffic kinds, then exit.
    #[arg(long)]
    pub list: bool,
    /// Loss instead of iperf3: paced 64-byte UDP through each forwarder at offered rates in steps, a
    /// pktgen-style table of where datagrams were lost, then each forwarder's no-drop rate (RFC 2544 binary
    /// search). Honours --quick, --modes, --duration (seconds per trial), --ipv6, --json, --chart.
    #[arg(long, conflicts_with_all = ["echo", "traffic", "flamegraph", "reps"])]
    pub loss: bool,
    /// Echo instead of forwarding: UDP load routed into an echo device, answers per second of a naive echo
    /// and of `turbotun echo --mode plain|offload`. Honours --quick, --modes (naive, plain, offload),
    /// --duration, --reps, --ipv6, --json, --chart.
    #[arg(long, conflicts_with_all = ["traffic", "flamegraph"])]
    pub echo: bool,
    /// Tunnels instead of forwarders: VPN-style tunnels between two namespaces over a veth underlay (veth,
    /// the kernel's VXLAN, turbotun tunnel, turbotun wg, wireguard-go, boringtun, GotaTun), iperf3 TCP and UDP
    /// through each, with every endpoint's CPU, peak RSS and system calls per GB. Honours --quick, --duration,
    /// --reps, --traffic (tcp, tcp4, udp1372), --json, --chart, --list.
    #[arg(long, conflicts_with_all = ["loss", "echo", "modes", "flamegraph", "ipv6"])]
    pub tunnel: bool,
    /// With --tunnel: comma-separated tunnel kinds (veth, vxlan, turbotun-plain, turbotun-wg, wireguard-go,
    /// boringtun, gotatun, turbotun-wg-vs-wireguard-go; and, only when named, the two-queue endpoints
    /// turbotun-plain-q2 and turbotun-wg-q2, and the handshake-flood kinds turbotun-wg-flood1,
    /// turbotun-wg-flood64, wireguard-go-flood1, each compared with its kind without the flood). Default: all but
    /// those named-only kinds; those that cannot run here are listed as skipped.
    #[arg(long, value_delimiter = ',', value_name = "KIND", requires = "tunnel")]
    pub tunnel_kinds: Option<Vec<String>>,
    /// vhost-user-net backends instead of forwarders: a DPDK virtio-user front end (testpmd, txonly, 64-byte
    /// frames) into `turbotun vhost-user` and into DPDK's own vhost backend, each writing into a TAP in a
    /// private namespace; frames per second reaching the TAP, the backend's CPU, and packets per backend
    /// CPU-second. Honours --quick (1 repetition of 1 s), --duration, --reps, --json, --list, --baseline
    /// (`turbotun@baseline`, `tso@baseline`, `no-offload@baseline`).
    #[arg(long, conflicts_with_all = ["loss", "echo", "tunnel", "modes", "traffic", "flamegraph", "ipv6", "chart"])]
    pub vhost_user: bool,
    /// A WireGuard endpoint as a server of many peers instead of forwarders: `turbotun wg`, wireguard-go (up to its
    /// 65,536 peers) and the --baseline build, each configured with the real `wg` in a private namespace: `wg
    /// setconf` of N peers, `wg addconf` of 10,000 more to it and to an empty endpoint, `wg show dump`, memory per
    /// peer, and CPU while idle for --duration seconds (default 5). Honours --quick (10,000 peers, 1
    /// repetition), --reps, --json, --baseline.
    #[arg(long, conflicts_with_all = ["loss", "echo", "tunnel", "vhost_user", "modes", "traffic", "flamegraph", "ipv6", "chart", "list"])]
    pub wg_scale: bool,
    /// A WireGuard endpoint answering a handshake storm instead of forwarders: N peers (their keys known to the
    /// bench) all initiate within one second with `turbotun wg` and with wireguard-go, each in the --tunnel
    /// bench's pair, first alone and then while a TCP stream runs through the tunnel. Reports handshakes per
    /// CPU-second of the endpoint against this CPU's X25519 rate, cookie replies, retransmissions, and the
    /// stream's slowest half second during the storm. Honours --quick (1,000 peers, 1 repetition), --wg-peers
    /// (default 10000), --reps, --json, --baseline.
    #[arg(long, conflicts_with_all = ["loss", "echo", "tunnel", "vhost_user", "wg_scale", "modes", "traffic", "flamegraph", "ipv6", "chart", "list"])]
    pub wg_storm: bool,
    /// With --wg-scale or --wg-storm: comma-separated numbers of peers (--wg-scale: default 10000,100000;
    /// --wg-storm: default 10000; up to 1048576, the most a device holds).
    #[arg(long, value_delimiter = ',', value_name = "N", requires = "wg_either", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub wg_peers: Option<Vec<u64>>,
    /// With --tunnel: do not count the endpoints' system calls. Counting enables a syscall tracepoint, which
    /// slows every system call on the machine a little, and endpoints that make millions per GB visibly.
    #[arg(long, requires = "tunnel")]
    pub no_syscalls: bool,
    /// With --tunnel: the rate of every handshake flood (the -flood kinds), thousands of initiations per second,
    /// the same for every endpoint flooded so that their rows compare like with like; 0 sends as fast as one
    /// core can (the load then differs with what the endpoint leaves of the machine).
    #[arg(long, value_name = "KPPS", default_value_t = 100, requires = "tunnel")]
    pub flood_rate: u64,
    /// The A/B of a change: also run turbotun's modes with this other build of turbotun (e.g. the commit before
    /// the change, built with `cargo build --release`), interleaved with this build's in the same rounds: each
    /// selected forwarder mode as `MODE@baseline`, with --tunnel `turbotun-plain@baseline` and
    /// `turbotun-wg@baseline`, with --vhost-user `turbotun@baseline`, `tso@baseline` and `no-offload@baseline`.
    #[arg(long, value_name = "TURBOTUN", conflicts_with_all = ["echo"])]
    pub baseline: Option<PathBuf>,
    /// With --loss: the loss table at each of these queue lengths of the devices (for a TUN device, its ring),
    /// e.g. 500,1000,10000. Default: the kernel's (500 for TUN).
    #[arg(long, value_delimiter = ',', value_name = "N", requires = "loss")]
    pub txqueuelen: Option<Vec<u32>>,
    /// With --loss: the offered rates of the table, thousands of datagrams per second (default
    /// 25,50,100,150,200,300; 50,150,300 with --quick). The no-drop search runs up to the highest.
    #[arg(long, value_delimiter = ',', value_name = "KPPS", requires = "loss")]
    pub rates: Option<Vec<u64>>,
    /// Internal: run the UDP generator toward ADDR:PORT for --duration seconds, print a JSON line.
    #[arg(long, hide = true, value_name = "ADDR:PORT")]
    pub udp_gen: Option<std::net::SocketAddr>,
    /// Internal: run the UDP sink on ADDR:PORT, print a JSON line.
    #[arg(long, hide = true, value_name = "ADDR:PORT")]
    pub udp_sink: Option<std::net::SocketAddr>,
    /// Internal: datagram payload length for --udp-gen (at least 16; --udp-sink reads each datagram's own).
    #[arg(long, hide = true, default_value_t = 64)]
    pub udp_len: usize,
    /// Internal: datagrams per GSO send for --udp-gen.
    #[arg(long, hide = true, default_value_t = 64)]
    pub udp_gso: u16,
    /// Internal: datagrams per second for --udp-gen and --udp-roundtrip (0: unlimited).
    #[arg(long, hide = true, default_value_t = 0)]
    pub udp_rate: u64,
    /// Internal: the generator toward an echo at ADDR:PORT and a sink counting its answers, in one process;
    /// prints both reports as one JSON line.
    #[arg(long, hide = true, value_name = "ADDR:PORT")]
    pub udp_roundtrip: Option<std::net::SocketAddr>,
    /// Internal: the naive echo on TUN device DEV (created): one packet per read and per write, no virtio
    /// header; prints `ready`, and its counters as one JSON line when stopped.
    #[arg(long, hide = true, value_name = "DEV")]
    pub naive_echo: Option<String>,
    /// Internal: the ceiling forwarder between TUN devices DEV_A and DEV_B (created): virtio header and every
    /// offload, one blocking read and one write per frame, header untouched (the `turbotun-ceiling` row).
    #[arg(long, hide = true, num_args = 2, value_names = ["DEV_A", "DEV_B"])]
    pub ceiling_fwd: Option<Vec<String>>,
    /// Internal: flood ADDR:PORT with WireGuard handshake initiations (random content, valid mac1) for
    /// --duration seconds or until SIGTERM, print a JSON line.
    #[arg(long, hide = true, value_name = "ADDR:PORT")]
    pub wg_flood: Option<std::net::SocketAddr>,
    /// Internal: play --wg-storm's handshake storm at this WireGuard endpoint (inside the storm's namespace).
    #[arg(long, hide = true, value_name = "ADDR:PORT", requires = "wg_storm_key")]
    pub wg_storm_play: Option<std::net::SocketAddr>,
    /// Internal: the stormed server's public key (base64), for --wg-storm-play.
    #[arg(long, hide = true, value_name = "KEY", requires = "wg_storm_play")]
    pub wg_storm_key: Option<String>,
    /// Internal: how many peers --wg-storm-play plays.
    #[arg(long, hide = true, default_value_t = 1000, requires = "wg_storm_play")]
    pub wg_storm_peers: usize,
    /// Internal: the flooded server's public key (base64), for --wg-flood.
    #[arg(long, hide = true, value_name = "KEY", requires = "wg_flood")]
    pub wg_flood_key: Option<String>,
    /// Internal: comma-separated source addresses of --wg-flood, taken in turn (default: the wildcard).
    #[arg(long, hide = true, value_delimiter = ',', value_name = "ADDR", requires = "wg_flood")]
    pub wg_flood_from: Vec<std::net::IpAddr>,
    /// Internal: initiations per second of --wg-flood (0: as fast as the kernel takes them).
    #[arg(long, hide = true, default_value_t = 0, requires = "wg_flood")]
    pub wg_flood_rate: u64,
}

impl BenchArgs {
    /// The bench's options, without the hidden flags.
    fn options(&self) -> turbotun_bench::Options {
        turbotun_bench::Options {
            quick: self.quick,
            modes: self.modes.clone(),
            traffic: self.traffic.clone(),
            duration: self.duration,
            reps: self.reps,
            ipv6: self.ipv6,
            json: self.json.clone(),
            chart: self.chart.clone(),
            flamegraph: self.flamegraph.clone(),
            list: self.list,
            loss: self.loss,
            echo: self.echo,
            tunnel: self.tunnel,
            tunnel_kinds: self.tunnel_kinds.clone(),
            vhost_user: self.vhost_user,
            wg_scale: self.wg_scale,
            wg_storm: self.wg_storm,
            wg_peers: self.wg_peers.as_ref().map(|p| p.iter().map(|&n| n as usize).collect()),
            no_syscalls: self.no_syscalls,
            flood_rate_kpps: self.flood_rate,
            baseline: self.baseline.clone(),
            txqueuelen: self.txqueuelen.clone(),
            rates: self.rates.clone(),
        }
    }

    /// The helper a hidden flag asks for, if one does (the first of them, in this order).
    fn helper(&self) -> Option<turbotun_bench::Helper> {
        use turbotun_bench::Helper;
        if let Some(dev) = &self.naive_echo {
            return Some(Helper::NaiveEcho { dev: dev.clone() });
        }
        if let Some([a, b]) = self.ceiling_fwd.as_deref() {
            return Some(Helper::CeilingFwd { dev_a: a.clone(), dev_b: b.clone() });
        }
        if let Some(dest) = self.wg_storm_play {
            return Some(Helper::WgStorm {
                dest,
                key: self.wg_storm_key.clone().unwrap_or_default(),
                peers: self.wg_storm_peers,
                deadline: self.duration,
            });
        }
        if let Some(dest) = self.wg_flood {
            return Some(Helper::WgFlood {
                dest,
                key: self.wg_flood_key.clone(),
                from: self.wg_flood_from.clone(),
                rate: self.wg_flood_rate,
                duration: self.duration,
            });
        }
        let udp = |target| turbotun_bench::Udp {
            target,
            len: self.udp_len,
            gso: self.udp_gso,
            rate: self.udp_rate,
            duration: self.duration,
        };
        if let Some(dest) = self.udp_gen {
            return Some(Helper::UdpGen(udp(dest)));
        }
        if let Some(addr) = self.udp_sink {
            return Some(Helper::UdpSink(udp(addr)));
        }
        self.udp_roundtrip.map(|dest| Helper::UdpRoundtrip(udp(dest)))
    }
}

/// `turbotun bench`.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    match args.helper() {
        Some(helper) => turbotun_bench::run_helper(&helper),
        None => turbotun_bench::run(&args.options()),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::{Cli, Command};

    #[test]
    fn every_command_line_the_bench_starts_parses() {
        for (label, argv) in turbotun_bench::turbotun_command_lines() {
            if let Err(e) = Cli::try_parse_from(std::iter::once("turbotun".to_string()).chain(argv.iter().cloned())) {
                panic!("{label}: `turbotun` refuses {argv:?}: {e}");
            }
        }
    }

    #[test]
    fn tunnel_command_line() {
        let parse = |argv: &[&str]| Cli::try_parse_from(["turbotun", "bench"].iter().chain(argv));
        let Command::Bench(c) =
            parse(&["--tunnel", "--tunnel-kinds", "veth,vxlan", "--traffic", "tcp", "--no-syscalls"]).unwrap().command
        else {
            panic!("not bench");
        };
        assert!(c.tunnel && c.no_syscalls);
        assert_eq!(c.tunnel_kinds.as_deref(), Some(&["veth".to_string(), "vxlan".to_string()][..]));
        for bad in [
            &["--tunnel", "--loss"][..],
            &["--tunnel", "--echo"],
            &["--tunnel", "--modes", "veth"],
            &["--tunnel", "--ipv6"],
            &["--tunnel-kinds", "veth"],
            &["--no-syscalls"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
