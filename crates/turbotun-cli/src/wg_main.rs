//! `turbotun-wg [-f] NAME`: `turbotun wg` under a name of its own, for `WG_QUICK_USERSPACE_IMPLEMENTATION`,
//! which wg-quick runs with the interface name as its only argument.
#![forbid(unsafe_code)]

use clap::Parser;

mod counters;
mod process;
mod wg_cmd;

#[derive(Debug, Parser)]
#[command(name = "turbotun-wg", version, about = "A WireGuard endpoint (the same as `turbotun wg`)")]
struct Cli {
    #[command(flatten)]
    args: wg_cmd::WgArgs,
}

fn main() -> std::process::ExitCode {
    if let Some(done) = process::start("turbotun-wg") {
        return done;
    }
    let cli = Cli::parse();
    match wg_cmd::run(&cli.args, &[]) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("turbotun-wg: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
