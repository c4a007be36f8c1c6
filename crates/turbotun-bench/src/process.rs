//! The bench's child processes: waited for with a deadline, stopped (SIGTERM, then SIGKILL), and tools run to
//! completion inside a namespace with their output collected.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::netcfg::Netns;

/// Interruptible sleep: returns an error as soon as `stop` is set.
pub(crate) fn sleep_checked(d: Duration, stop: &AtomicBool) -> Result<()> {
    let end = Instant::now() + d;
    loop {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

/// SIGTERM a process by pid.
pub(crate) fn send_sigterm(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // It may have exited already: nothing to stop then.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
    }
}

/// Wait for a child with a deadline; `None` if it is still running at the deadline.
pub(crate) fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            _ => return None,
        }
    }
}

/// Stop a child: SIGTERM, then SIGKILL after `grace`.
pub(crate) fn terminate(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    if let Ok(Some(st)) = child.try_wait() {
        return Some(st);
    }
    send_sigterm(child.id());
    if let Some(st) = wait_timeout(child, grace) {
        return Some(st);
    }
    let _ = child.kill();
    child.wait().ok()
}

/// Kills (SIGTERM, then SIGKILL) a child process when dropped.
#[derive(Debug)]
pub(crate) struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        terminate(&mut self.0, Duration::from_secs(1));
    }
}

/// Read a child's stdout to a string on a thread (so a chatty child never blocks on a full pipe).
pub(crate) fn collect_stdout(child: &mut Child) -> JoinHandle<String> {
    collect(child.stdout.take())
}

/// The same for its stderr, if piped.
fn collect_stderr(child: &mut Child) -> JoinHandle<String> {
    collect(child.stderr.take())
}

fn collect<R: Read + Send + 'static>(pipe: Option<R>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = pipe {
            let _ = BufReader::new(o).read_to_string(&mut s);
        }
        s
    })
}

/// Run `CMD..` inside `ns` to completion within `timeout`, returning its stdout.
pub(crate) fn run_in_ns(
    ns: &Netns,
    cmd: &[&str],
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<(String, ExitStatus)> {
    let (out, _, status) = run_in_ns_with(ns, cmd, Stdio::null(), timeout, stop)?;
    Ok((out, status))
}

/// Run a tool (`wg set ...`) inside `ns` within `timeout`: its stdout, or an error with what it said on stderr
/// when it failed.
pub(crate) fn run_tool(ns: &Netns, cmd: &[&str], timeout: Duration, stop: &AtomicBool) -> Result<String> {
    let (out, err, status) = run_in_ns_with(ns, cmd, Stdio::piped(), timeout, stop)?;
    if !status.success() {
        bail!("`{}` failed ({status}): {}", cmd.join(" "), err.trim());
    }
    Ok(out)
}

/// [`run_in_ns`] with stderr as given (piped: collected and returned too).
fn run_in_ns_with(
    ns: &Netns,
    cmd: &[&str],
    stderr: Stdio,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<(String, String, ExitStatus)> {
    let mut child =
        ns.spawn(Command::new(cmd[0]).args(&cmd[1..]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(stderr))?;
    let out = collect_stdout(&mut child);
    let err = collect_stderr(&mut child);
    let mut child = KillOnDrop(child);
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = wait_timeout(&mut child.0, Duration::from_millis(100)) {
            break st;
        }
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        if Instant::now() >= deadline {
            bail!("{} did not finish within {} s", cmd[0], timeout.as_secs());
        }
    };
    Ok((out.join().unwrap_or_default(), err.join().unwrap_or_default(), status))
}

/// A tool started inside a namespace whose standard output is read line by line as it comes, so that the caller
/// can act on a line (the generator's `sent`) before the tool ends. Killed when dropped.
#[derive(Debug)]
pub(crate) struct LinesFrom {
    pub child: KillOnDrop,
    lines: Receiver<String>,
    program: String,
}

impl LinesFrom {
    /// Starts `CMD..` inside `ns`, stderr discarded.
    pub(crate) fn spawn(ns: &Netns, cmd: &[&str]) -> Result<LinesFrom> {
        let mut child = ns.spawn(
            Command::new(cmd[0]).args(&cmd[1..]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()),
        )?;
        let stdout = child.stdout.take();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let Some(out) = stdout else { return };
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(LinesFrom { child: KillOnDrop(child), lines, program: cmd[0].to_string() })
    }

    /// The next line, within `timeout`; an error when interrupted, at the deadline, or when the output ended.
    pub(crate) fn next_line(&self, timeout: Duration, stop: &AtomicBool) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("{} printed no line within {} s", self.program, timeout.as_secs());
            }
            match self.lines.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(line) => return Ok(line),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => bail!("{} ended its output", self.program),
            }
        }
    }

    /// Waits for the tool to exit (within `timeout`).
    pub(crate) fn wait(mut self, timeout: Duration) -> Result<ExitStatus> {
        match wait_timeout(&mut self.child.0, timeout) {
            Some(status) => Ok(status),
            None => bail!("{} did not exit within {} s", self.program, timeout.as_secs()),
        }
    }
}
