//! `turbotun`: inspect, create and benchmark Linux TUN/TAP devices.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

mod bench;
mod fwd;
mod inspect_cmd;
mod load_cmd;

#[derive(Debug, Parser)]
#[command(name = "turbotun", version, about = "Fast Linux TUN/TAP dataplane: inspect, create, forward, benchmark")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// What this kernel's tun driver supports (each feature probed, not assumed).
    Features(inspect_cmd::FeaturesArgs),
    /// Every TUN/TAP device in this network namespace, or one: flags, queues, offloads, addresses, counters.
    Info(inspect_cmd::InfoArgs),
    /// Create a persistent TUN/TAP device.
    Create(inspect_cmd::CreateArgs),
    /// Delete a persistent TUN/TAP device.
    Delete(inspect_cmd::DeleteArgs),
    /// Forward packets between two devices (created if missing) until SIGINT/SIGTERM.
    Fwd(fwd::FwdArgs),
    /// Paced UDP load: `load gen` sends, `load sink` counts loss, reordering and duplicates per flow.
    Load(load_cmd::LoadArgs),
    /// Benchmark forwarders between two network namespaces with iperf3.
    Bench(bench::BenchArgs),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Features(args) => inspect_cmd::features(&args),
        Command::Info(args) => inspect_cmd::info(&args),
        Command::Create(args) => inspect_cmd::create(&args),
        Command::Delete(args) => inspect_cmd::delete(&args),
        Command::Fwd(args) => fwd::run(&args),
        Command::Load(args) => load_cmd::run(&args),
        Command::Bench(args) => bench::run(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("turbotun: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
