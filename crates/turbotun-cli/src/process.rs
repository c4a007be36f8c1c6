//! What both binaries do first and last: the socket keeper's role when started as one, the log, signals that a
//! parent may have left blocked; the error line and the exit status.

use std::process::ExitCode;

/// Sets the process up; `Some(status)` when it was started as a socket keeper and has done that job (see
/// `turbotun::socket_keeper::keep_socket`).
pub fn start(program: &str) -> Option<ExitCode> {
    if let Some(spec) = std::env::var_os(turbotun::socket_keeper::KEEPER_ENV) {
        return Some(match turbotun::socket_keeper::keep_socket(&spec) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        });
    }
    crate::logging::init(program);
    // A signal mask inherited from the parent could block the signals that stop the long-running commands.
    let stop_signals = [nix::sys::signal::Signal::SIGINT, nix::sys::signal::Signal::SIGTERM];
    if let Err(e) = stop_signals.into_iter().collect::<nix::sys::signal::SigSet>().thread_unblock() {
        eprintln!("{program}: cannot unblock SIGINT/SIGTERM: {e}");
    }
    None
}

/// An error the background process has reported already (to the process that started it, or in its log):
/// the program exits with a failure without printing it again.
#[derive(Debug)]
pub struct AlreadyReported;

impl std::fmt::Display for AlreadyReported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reported")
    }
}

impl std::error::Error for AlreadyReported {}

/// The exit status of a command's result: 0, or 1 with the error on one line of standard error (`PROGRAM:
/// error: cause`), once. Usage errors exit with 2 before this (clap).
pub fn finish(program: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.downcast_ref::<AlreadyReported>().is_some() => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("{program}: {}", error_text(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each separated by ": ", leaving out a cause whose text is already in
/// the line: the library's errors name their cause in their own message (`TUNSETOWNER: Invalid argument`), so
/// printing the chain as it is would say it twice.
pub fn error_text(err: &anyhow::Error) -> String {
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
    text.replace('\n', " ")
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
