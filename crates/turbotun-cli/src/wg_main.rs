//! `turbotun-wg [-f] NAME`: `turbotun wg` under a name of its own, for `WG_QUICK_USERSPACE_IMPLEMENTATION`,
//! which wg-quick runs with the interface name as its only argument.
#![forbid(unsafe_code)]
// Lines go out through `out!`, which a closed pipe does not make panic.
#![deny(clippy::print_stdout)]

use clap::FromArgMatches;

// Shared with `turbotun`, which uses all of them; this program uses a part.
#[allow(dead_code)]
mod args;
#[allow(dead_code)]
mod counters;
#[allow(dead_code)]
mod help;
#[allow(dead_code)]
mod kernel_drops;
mod logging;
#[allow(dead_code)]
mod process;
mod wg_cmd;

fn main() -> std::process::ExitCode {
    if let Some(done) = process::start("turbotun-wg") {
        return done;
    }
    let matches =
        wg_cmd::standalone_command().try_get_matches().unwrap_or_else(|e| process::parse_error("turbotun-wg", e));
    let args = wg_cmd::WgArgs::from_arg_matches(&matches).unwrap_or_else(|e| process::parse_error("turbotun-wg", e));
    process::finish("turbotun-wg", wg_cmd::run(&args, &[]))
}
