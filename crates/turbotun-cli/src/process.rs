//! What both binaries do first: the socket keeper's role when started as one, logging to stderr, and signals
//! that a parent may have left blocked.

use std::process::ExitCode;

/// Sets the process up; `Some(status)` when it was started as a WireGuard endpoint's socket keeper and has done
/// that job (see `turbotun_wg::daemon::keep_socket`).
pub fn start(program: &str) -> Option<ExitCode> {
    if let Some(spec) = std::env::var_os(turbotun_wg::daemon::KEEPER_ENV) {
        return Some(match turbotun_wg::daemon::keep_socket(&spec) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        });
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    // A signal mask inherited from the parent could block the signals that stop the long-running commands.
    let stop_signals = [nix::sys::signal::Signal::SIGINT, nix::sys::signal::Signal::SIGTERM];
    if let Err(e) = stop_signals.into_iter().collect::<nix::sys::signal::SigSet>().thread_unblock() {
        eprintln!("{program}: cannot unblock SIGINT/SIGTERM: {e}");
    }
    None
}
