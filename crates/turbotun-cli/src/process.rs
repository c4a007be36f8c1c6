//! What both binaries do first and last: the socket keeper's role when started as one, the log, signals that a
//! parent may have left blocked; the error line and the exit status.

use std::process::ExitCode;

/// `println!` for the commands: a line on standard output. A reader that went away (`| head -3`, `| true`) is no
/// error of the command: the line is dropped and the command goes on, with its own exit status (`println!`
/// would panic). Every line the commands print goes through here (`clippy::print_stdout` holds them to it).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::process::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for the commands, as [`out!`] is `println!`.
#[macro_export]
macro_rules! out_raw {
    ($($arg:tt)*) => {
        $crate::process::write_stdout(format_args!($($arg)*))
    };
}

/// Writes `text` on standard output, dropping it if nobody reads there any more (see [`out!`]).
pub fn write_stdout(text: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    if stdout.write_fmt(text).and_then(|()| stdout.flush()).is_err() {
        // A closed pipe (EPIPE: SIGPIPE is ignored, as Rust programs start) or a full disk: nothing to tell.
    }
}

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

/// Bad arguments found after clap parsed them (a range or a combination only the command can judge, found
/// before anything was opened): exit status 2 and the usage error's wording, as clap's own.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// `message` as a usage error (see [`Usage`]).
pub fn usage(message: impl std::fmt::Display) -> anyhow::Error {
    Usage(message.to_string()).into()
}

/// An error of checking the arguments, with its causes, as a usage error (see [`Usage`]).
pub fn usage_of(error: impl Into<anyhow::Error>) -> anyhow::Error {
    Usage(error_text(&error.into())).into()
}

/// What the usage errors end with, as clap's do.
const USAGE_HINT: &str = "For more information, try '--help'.";

/// The exit status of a command's result, its error said once on standard error with one prefix, `PROGRAM`
/// (`turbotun fwd`): 0; 1 with `PROGRAM: what failed: why`; 2 for bad arguments (a [`Usage`] error) with
/// `PROGRAM: error: what` and the hint clap gives, as clap's own usage errors (see [`parse_error`]).
pub fn finish(program: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.downcast_ref::<AlreadyReported>().is_some() => ExitCode::FAILURE,
        Err(err) if err.downcast_ref::<Usage>().is_some() => {
            eprintln!("{program}: error: {}\n\n{USAGE_HINT}", error_text(&err));
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("{program}: {}", error_text(&err));
            ExitCode::FAILURE
        }
    }
}

/// Ends the process on a command line clap refused, with `PROGRAM: ` before clap's text (its `error: ...`, the
/// usage and the hint) and clap's status (2); `--help` and `--version` print as clap prints them.
pub fn parse_error(program: &str, error: clap::Error) -> ! {
    if !error.use_stderr() {
        error.exit();
    }
    eprint!("{program}: {}", error.render());
    std::process::exit(error.exit_code());
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
