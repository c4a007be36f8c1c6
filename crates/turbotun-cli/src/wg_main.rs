//! `turbotun-wg [-f] NAME`: `turbotun wg` under a name of its own, for `WG_QUICK_USERSPACE_IMPLEMENTATION`,
//! which wg-quick runs with the interface name as its only argument.
#![forbid(unsafe_code)]

use clap::Parser;

mod counters;
mod wg_cmd;

#[derive(Debug, Parser)]
#[command(name = "turbotun-wg", version, about = "A WireGuard endpoint (the same as `turbotun wg`)")]
struct Cli {
    #[command(flatten)]
    args: wg_cmd::WgArgs,
}

fn main() -> std::process::ExitCode {
    // Started by a WireGuard endpoint that drops its privileges, to remove its socket once it ends.
    if let Some(spec) = std::env::var_os(turbotun_wg::daemon::KEEPER_ENV) {
        return match turbotun_wg::daemon::keep_socket(&spec) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(_) => std::process::ExitCode::FAILURE,
        };
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match wg_cmd::run(&cli.args, &[]) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("turbotun-wg: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
