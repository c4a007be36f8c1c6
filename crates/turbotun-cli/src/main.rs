//! `turbotun`: inspect, create and benchmark Linux TUN/TAP devices.
#![forbid(unsafe_code)]
// Lines go out through `out!`, which a closed pipe does not make panic.
#![deny(clippy::print_stdout)]

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

mod args;
mod bench_cmd;
mod completions;
mod counters;
mod device_cmd;
mod echo_cmd;
mod fwd;
mod help;
mod kernel_drops;
mod load_cmd;
mod logging;
mod open;
mod process;
mod stats_cmd;
mod tunnel_cmd;
mod vhost_user_cmd;
mod wg_cmd;

#[derive(Debug, Parser)]
#[command(name = "turbotun", version, about = "Fast Linux TUN/TAP dataplane: inspect, create, forward, benchmark")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// What this kernel's tun driver supports (each feature probed, not assumed).
    Features(device_cmd::FeaturesArgs),
    /// Every TUN/TAP device in this network namespace, or one: flags, queues, offloads, addresses, counters.
    Info(device_cmd::InfoArgs),
    /// Create a persistent TUN/TAP device (optionally on a bridge, with a MAC, carrier off, filters).
    Create(device_cmd::CreateArgs),
    /// Change a device's layer-2 settings: bridge, MAC, carrier, TX filter, eBPF filter.
    Set(device_cmd::SetArgs),
    /// Delete a persistent TUN/TAP device.
    Delete(device_cmd::DeleteArgs),
    /// Forward packets between two devices (created if missing) until SIGINT/SIGTERM.
    Fwd(fwd::FwdArgs),
    /// Answer what the kernel sends into a device (ARP, ND, ping, UDP; never TCP) until SIGINT/SIGTERM.
    Echo(echo_cmd::EchoArgs),
    /// Open a device as root and hand its queues to `turbotun fwd --from-socket` over a Unix socket.
    Open(open::OpenArgs),
    /// Paced UDP load: `load gen` sends, `load sink` counts loss, reordering and duplicates per flow.
    Load(load_cmd::LoadArgs),
    /// Serve a VM's network device over vhost-user (QEMU, cloud-hypervisor, DPDK virtio-user) onto a TAP, with
    /// the guest's offloads, until SIGINT/SIGTERM.
    VhostUser(vhost_user_cmd::VhostUserArgs),
    /// Tunnel a device's packets over UDP to another `turbotun tunnel` (no encryption) until SIGINT/SIGTERM.
    Tunnel(tunnel_cmd::TunnelArgs),
    /// A WireGuard endpoint: creates NAME, serves /var/run/wireguard/NAME.sock for `wg`, runs in the
    /// background unless -f (what wg-quick runs as WG_QUICK_USERSPACE_IMPLEMENTATION).
    Wg(wg_cmd::WgArgs),
    /// The counters of a running fwd, tunnel, wg or vhost-user (all of them without NAME), read from its counters socket:
    /// readable, --json or --prometheus.
    Stats(stats_cmd::StatsArgs),
    /// Benchmark forwarders between two network namespaces with iperf3 (--loss: where UDP is lost and the
    /// no-drop rate; --echo: echo answers per second).
    Bench(Box<bench_cmd::BenchArgs>),
    /// Shell completions for bash, zsh or fish, on standard output.
    Completions(CompletionsArgs),
    /// Write the manual pages (turbotun.1, turbotun-COMMAND.1, turbotun-wg.1) into DIR.
    #[command(hide = true)]
    Man(ManArgs),
}

#[derive(Debug, clap::Args)]
struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: Shell,
    /// The program to complete: turbotun, or turbotun-wg (the endpoint under its own name, for wg-quick).
    #[arg(long, default_value = "turbotun", value_parser = ["turbotun", "turbotun-wg"])]
    program: String,
}

/// `turbotun completions SHELL`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, clap::Args)]
struct ManArgs {
    /// Where to write them (created if missing).
    dir: std::path::PathBuf,
}

/// The command line as clap reads it, with the EXAMPLES, EXIT STATUS and ENVIRONMENT of each `--help`.
fn command() -> clap::Command {
    help::decorate(Cli::command())
}

fn main() -> std::process::ExitCode {
    if let Some(done) = process::start("turbotun") {
        return done;
    }
    // Every error names the command it came from: `turbotun fwd: ...`.
    let subcommand = std::env::args().nth(1).filter(|a| command().find_subcommand(a).is_some());
    let program = subcommand.map_or("turbotun".to_string(), |sub| format!("turbotun {sub}"));
    let matches = command().try_get_matches().unwrap_or_else(|e| process::parse_error(&program, e));
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| process::parse_error(&program, e));
    let result = match cli.command {
        Command::Features(args) => device_cmd::features(&args),
        Command::Info(args) => device_cmd::info(&args),
        Command::Create(args) => device_cmd::create(&args),
        Command::Set(args) => device_cmd::set(&args),
        Command::Delete(args) => device_cmd::delete(&args),
        Command::Fwd(args) => fwd::run(&args),
        Command::Echo(args) => echo_cmd::run(&args),
        Command::Open(args) => open::run(&args),
        Command::Load(args) => load_cmd::run(&args),
        Command::Tunnel(args) => tunnel_cmd::run(&args),
        Command::VhostUser(args) => vhost_user_cmd::run(&args),
        Command::Wg(args) => wg_cmd::run(&args, &["wg"]),
        Command::Stats(args) => stats_cmd::run(&args),
        Command::Bench(args) => bench_cmd::run(&args),
        Command::Completions(args) => {
            let shell = match args.shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
            };
            let mut program = match args.program.as_str() {
                "turbotun-wg" => wg_cmd::standalone_command(),
                _ => command(),
            };
            crate::out_raw!("{}", String::from_utf8_lossy(&completions::script(shell, &args.program, &mut program)));
            Ok(())
        }
        Command::Man(args) => help::write_man_pages(&args.dir, command(), wg_cmd::standalone_command())
            .map(|pages| {
                for page in pages {
                    crate::out!("{}", page.display());
                }
            })
            .map_err(|e| anyhow::anyhow!("writing the manual pages into {}: {e}", args.dir.display())),
    };
    process::finish(&program, result)
}
