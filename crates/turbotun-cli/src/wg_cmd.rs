//! `turbotun wg`: a WireGuard endpoint following WireGuard's cross-platform userspace interface (what
//! `wg-quick` runs as `WG_QUICK_USERSPACE_IMPLEMENTATION`, and `wg` configures).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use turbotun::stats_socket::Report;
use turbotun::tunnel::TunnelStatsHandle;
use turbotun::Engine;
use turbotun_wg::daemon::{self, Ended, Options};

use crate::counters::{CountersArgs, Sampler, Sink};

#[derive(Debug, Args)]
pub struct WgArgs {
    /// Stay in the foreground (otherwise return once the device and the configuration socket are up).
    #[arg(short, long)]
    pub foreground: bool,
    /// Become this user (name or uid; USER:GROUP for another group than the user's own) once the device and
    /// sockets are open; the configuration can then not move to a privileged port or set a firewall mark.
    #[arg(long, value_name = "USER[:GROUP]")]
    pub user: Option<String>,
    /// Queues of the device, each with its own pair of workers (a core each way) and its own UDP socket on the
    /// one listen port: a flow-hash steering program keeps each flow on one queue, in order. Sending spreads
    /// over the queues by flow; what one peer sends arrives on one socket (the kernel picks a port's socket by
    /// the sender's address and port), so one peer's receiving stays on one queue.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = crate::args::queue_count)]
    pub queues: usize,
    /// The counters socket (`turbotun stats`) lists each peer's counters while the device holds at most N peers
    /// (0: never): above it the per-peer series are left out and the report says why, since with a million
    /// peers their Prometheus text is about a gigabyte.
    #[arg(long, default_value_t = turbotun_wg::daemon::DEFAULT_PEER_METRICS_LIMIT, value_name = "N")]
    pub peer_metrics_limit: usize,
    #[command(flatten)]
    pub counters: CountersArgs,
    /// The interface to create (a template such as wg%d takes the first free number); its configuration socket
    /// is /var/run/wireguard/NAME.sock, with the name the device was given.
    pub name: String,
}

/// The `turbotun-wg` program's command line (the same options as `turbotun wg`), with its help sections.
pub fn standalone_command() -> clap::Command {
    use clap::Args as _;
    let cmd = clap::Command::new("turbotun-wg")
        .version(env!("CARGO_PKG_VERSION"))
        .about("A WireGuard endpoint (the same as `turbotun wg`), for WG_QUICK_USERSPACE_IMPLEMENTATION");
    crate::help::decorate(WgArgs::augment_args(cmd))
}

/// The command line that starts this endpoint again in the foreground, for the background: this process's own
/// arguments (`given`), every option as the user gave it, with `--foreground` right after `again` (the
/// subcommand, or nothing for `turbotun-wg`), so that no option is lost however many there are.
fn foreground_args(mut given: Vec<String>, again: &[&str]) -> Vec<String> {
    let at = match again.first() {
        None => 0,
        Some(sub) => given.iter().position(|a| a == sub).map_or(0, |i| i + 1),
    };
    given.insert(at, "--foreground".to_string());
    given
}

/// Runs the endpoint; `again` is how this program is invoked for it (`["wg"]` for `turbotun`, nothing for
/// `turbotun-wg`), to start it again in the background.
pub fn run(args: &WgArgs, again: &[&str]) -> Result<()> {
    turbotun::validate_ifname(&args.name)?;
    // The user is looked up before anything is opened, so that a typo leaves nothing behind.
    let user = args.user.as_deref().map(|u| crate::args::user_spec(u, None).resolve().context("--user")).transpose()?;
    let background = std::env::var_os(daemon::READY_ENV).is_some();
    if !args.foreground && !background {
        let program = std::env::current_exe().context("finding this program to start it in the background")?;
        let again = foreground_args(std::env::args().skip(1).collect(), again);
        let (pid, name) = daemon::start_in_background(&program, &again, crate::logging::keep_in_background())?;
        eprintln!("turbotun wg: {name} up in the background (pid {pid})");
        return Ok(());
    }
    // In the background nobody reads standard output: interval lines and the summary go to the log.
    let sink = if background { Sink::Stderr } else { Sink::Stdout };
    let stats = TunnelStatsHandle::default();
    let start = Instant::now();
    let name = args.name.clone();
    let source = {
        let stats = stats.clone();
        move || {
            let seconds = start.elapsed().as_secs_f64();
            Report::of_tunnel("wireguard", Engine::KeyedTunnel, &name, "wireguard", &stats.snapshot(), seconds)
                .with_tunnel_queues(&stats.queue_snapshots())
        }
    };
    let up = Arc::new(AtomicBool::new(false));
    let sampler: Arc<Mutex<Option<Sampler>>> = Arc::default();
    let on_up = {
        let (up, sampler, source, counters) = (up.clone(), sampler.clone(), source.clone(), args.counters.clone());
        move || {
            up.store(true, Ordering::Relaxed);
            if let Some(every) = counters.stats_interval {
                match Sampler::start(every, counters.json, sink, source.clone()) {
                    Ok(started) => *sampler.lock().unwrap_or_else(|e| e.into_inner()) = Some(started),
                    Err(e) => tracing::warn!("--stats-interval: {e}"),
                }
            }
        }
    };
    let options = Options {
        name: args.name.clone(),
        queues: args.queues,
        user,
        stats,
        stats_socket: args.counters.socket_path(&args.name),
        peer_metrics_limit: args.peer_metrics_limit,
        on_up: Some(Box::new(on_up)),
    };
    let result = daemon::run(&options);
    if let Some(sampler) = sampler.lock().unwrap_or_else(|e| e.into_inner()).take() {
        sampler.finish();
    }
    let (name, ended) = match result {
        Ok(ran) => (ran.name, ran.ended),
        Err(e) if background => {
            let text = crate::process::error_text(&anyhow::Error::from(e));
            if up.load(Ordering::Relaxed) {
                tracing::error!("{}: {text}", args.name);
            } else {
                // The starting process prints it, once.
                crate::out!("{}{text}", daemon::START_ERROR_PREFIX);
            }
            return Err(crate::process::AlreadyReported.into());
        }
        Err(e) => return Err(e.into()),
    };
    let why = match ended {
        Ended::Signal => "stopped by a signal",
        Ended::DeviceDeleted => "the device was deleted",
        Ended::SocketRemoved => "the configuration socket was removed",
        _ => "stopped",
    };
    if background {
        // In the log at the default level too (as the closing summary is): why the endpoint is gone.
        sink.line(&format!("{name}: {why}"));
    } else {
        eprintln!("turbotun wg: {name}: {why}");
    }
    sink.line(&crate::counters::closing(&source(), args.counters.json));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option goes to the background as given (a list kept by hand here lost `--peer-metrics-limit` once).
    #[test]
    fn test_the_background_gets_every_option_as_given() {
        let given = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let turbotun = given(&["wg", "--peer-metrics-limit", "7", "--stats-socket", "none", "--", "wg0"]);
        assert_eq!(
            foreground_args(turbotun, &["wg"]),
            given(&["wg", "--foreground", "--peer-metrics-limit", "7", "--stats-socket", "none", "--", "wg0"])
        );
        assert_eq!(
            foreground_args(given(&["--queues", "2", "wg0"]), &[]),
            given(&["--foreground", "--queues", "2", "wg0"])
        );
        // Parsed back, the options are the user's.
        let line = foreground_args(given(&["--user", "nobody", "--json", "wg%d"]), &[]);
        let parsed = standalone_command().try_get_matches_from(std::iter::once("turbotun-wg".to_string()).chain(line));
        let parsed = parsed.unwrap();
        assert!(parsed.get_flag("foreground") && parsed.get_flag("json"));
        assert_eq!(parsed.get_one::<String>("user").map(String::as_str), Some("nobody"));
    }
}
