//! `turbotun`: inspect, create and benchmark Linux TUN/TAP devices.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

mod args;
mod bench;
mod counters;
mod echo_cmd;
mod fwd;
mod inspect_cmd;
mod load_cmd;
mod open;
mod process;
mod tunnel_cmd;
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
    Features(inspect_cmd::FeaturesArgs),
    /// Every TUN/TAP device in this network namespace, or one: flags, queues, offloads, addresses, counters.
    Info(inspect_cmd::InfoArgs),
    /// Create a persistent TUN/TAP device (optionally on a bridge, with a MAC, carrier off, filters).
    Create(inspect_cmd::CreateArgs),
    /// Change a device's layer-2 settings: bridge, MAC, carrier, TX filter, eBPF filter.
    Set(inspect_cmd::SetArgs),
    /// Delete a persistent TUN/TAP device.
    Delete(inspect_cmd::DeleteArgs),
    /// Forward packets between two devices (created if missing) until SIGINT/SIGTERM.
    Fwd(fwd::FwdArgs),
    /// Answer what the kernel sends into a device (ARP, ND, ping, UDP; never TCP) until SIGINT/SIGTERM.
    Echo(echo_cmd::EchoArgs),
    /// Open a device as root and hand its queues to `turbotun fwd --from-socket` over a Unix socket.
    Open(open::OpenArgs),
    /// Paced UDP load: `load gen` sends, `load sink` counts loss, reordering and duplicates per flow.
    Load(load_cmd::LoadArgs),
    /// Tunnel a device's packets over UDP to another `turbotun tunnel` (no encryption) until SIGINT/SIGTERM.
    Tunnel(tunnel_cmd::TunnelArgs),
    /// A WireGuard endpoint: creates NAME, serves /var/run/wireguard/NAME.sock for `wg`, runs in the
    /// background unless -f (what wg-quick runs as WG_QUICK_USERSPACE_IMPLEMENTATION).
    Wg(wg_cmd::WgArgs),
    /// Benchmark forwarders between two network namespaces with iperf3 (--loss: where UDP is lost and the
    /// no-drop rate; --echo: echo answers per second).
    Bench(Box<bench::BenchArgs>),
}

fn main() -> std::process::ExitCode {
    if let Some(done) = process::start("turbotun") {
        return done;
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Features(args) => inspect_cmd::features(&args),
        Command::Info(args) => inspect_cmd::info(&args),
        Command::Create(args) => inspect_cmd::create(&args),
        Command::Set(args) => inspect_cmd::set(&args),
        Command::Delete(args) => inspect_cmd::delete(&args),
        Command::Fwd(args) => fwd::run(&args),
        Command::Echo(args) => echo_cmd::run(&args),
        Command::Open(args) => open::run(&args),
        Command::Load(args) => load_cmd::run(&args),
        Command::Tunnel(args) => tunnel_cmd::run(&args),
        Command::Wg(args) => wg_cmd::run(&args, &["wg"]),
        Command::Bench(args) => bench::run(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("turbotun: {}", error_text(&err));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each separated by ": ", leaving out a cause whose text is already in
/// the line: the library's errors name their cause in their own message (`TUNSETOWNER: Invalid argument`), so
/// printing the chain as it is would say it twice.
fn error_text(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_text;

    #[test]
    fn test_error_text_says_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(libc::EINVAL);
        let err = anyhow::Error::from(turbotun::Error::Io { context: "TUNSETOWNER".into(), source: io })
            .context("creating tt0");
        assert_eq!(error_text(&err), "creating tt0: TUNSETOWNER: Invalid argument (os error 22)");
        let err = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_text(&err), "outer: inner");
    }
}
