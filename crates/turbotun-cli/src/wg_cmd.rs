//! `turbotun wg`: a WireGuard endpoint following WireGuard's cross-platform userspace interface (what
//! `wg-quick` runs as `WG_QUICK_USERSPACE_IMPLEMENTATION`, and `wg` configures).

use anyhow::{Context, Result};
use clap::Args;
use turbotun::privilege::UserSpec;
use turbotun_wg::daemon::{self, Ended, Options};

#[derive(Debug, Args)]
pub struct WgArgs {
    /// Stay in the foreground (otherwise return once the device and the configuration socket are up).
    #[arg(short, long)]
    pub foreground: bool,
    /// Become this user (name or uid) once the device and sockets are open; the configuration can then not
    /// move to a privileged port or set a firewall mark.
    #[arg(long)]
    pub user: Option<String>,
    /// The interface to create (a template such as wg%d takes the first free number); its configuration socket
    /// is /var/run/wireguard/NAME.sock, with the name the device was given.
    pub name: String,
}

/// Runs the endpoint; `again` is how this program is invoked for it (`["wg"]` for `turbotun`, nothing for
/// `turbotun-wg`), to start it again in the background.
pub fn run(args: &WgArgs, again: &[&str]) -> Result<()> {
    turbotun::validate_ifname(&args.name)?;
    // The user is looked up before anything is opened, so that a typo leaves nothing behind.
    let user = args.user.as_deref().map(|u| UserSpec::new(u).resolve().context("--user")).transpose()?;
    if !args.foreground && std::env::var_os(daemon::READY_ENV).is_none() {
        let program = std::env::current_exe().context("finding this program to start it in the background")?;
        let mut again: Vec<String> = again.iter().map(|s| s.to_string()).collect();
        again.push("--foreground".to_string());
        if let Some(user) = &args.user {
            again.extend(["--user".to_string(), user.clone()]);
        }
        again.push(args.name.clone());
        let (pid, name) = daemon::start_in_background(&program, &again)?;
        eprintln!("turbotun wg: {name} up in the background (pid {pid})");
        return Ok(());
    }
    let daemon::Ran { name, ended, stats } = daemon::run(&Options { name: args.name.clone(), user })?;
    let why = match ended {
        Ended::Signal => "stopped by a signal",
        Ended::DeviceDeleted => "the device was deleted",
        Ended::SocketRemoved => "the configuration socket was removed",
        _ => "stopped",
    };
    eprintln!("turbotun wg: {name}: {why}");
    // The counters, as `turbotun fwd` and `turbotun tunnel` print them (nobody reads them in the background).
    println!("{}", crate::counters::tunnel_line("wireguard", &stats));
    Ok(())
}
