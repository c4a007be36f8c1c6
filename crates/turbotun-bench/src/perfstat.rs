//! System calls of a process over the measurement window: `perf stat -e raw_syscalls:sys_enter -p PID`.
//!
//! The `raw_syscalls:sys_enter` tracepoint needs no PMU (this VM has none), only tracefs and the privilege to
//! attach to the process. perf starts with its counters disabled (`-D -1`) and a control FIFO (`--control
//! fifo:CTL,ACK`); the bench writes `enable` to it when the window starts and `disable` when it ends, each time
//! waiting for perf's `ack`, which perf sends once it has done it. Then perf gets SIGINT, writes the count (`-x,`
//! CSV into a file) and exits. The counted interval is the time from the first ack to the second.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::process::{terminate, wait_timeout};

/// The tracepoint counted.
pub(crate) const EVENT: &str = "raw_syscalls:sys_enter";
/// How long perf may take to attach, or to answer a command.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether perf can count the tracepoint here, the way the runs count it: perf attached to this process
/// (`-p`, the control FIFO in `dir`) must count the system calls it makes meanwhile. (A forked workload, as in
/// `perf stat true`, is avoided: perf sometimes exits before reaping it.)
pub(crate) fn probe(dir: &Path) -> Result<()> {
    if let Err(e) = Command::new("perf").arg("--version").stdin(Stdio::null()).output() {
        bail!("perf is not installed ({e}): apt-get install linux-perf");
    }
    let mut counting = start(std::process::id(), dir, "probe")?;
    counting.enable()?;
    for _ in 0..100 {
        let _ = std::fs::metadata(dir);
    }
    match counting.finish()? {
        (n, _) if n > 0 => Ok(()),
        _ => bail!("`perf stat -e {EVENT} -p PID` counted no system calls"),
    }
}

/// The count of [`EVENT`] in perf stat's `-x,` output (`12345,,raw_syscalls:sys_enter,...`); None when it was
/// not counted.
pub(crate) fn parse_csv(text: &str) -> Option<u64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let fields: Vec<&str> = l.split(',').collect();
        if fields.len() < 3 || fields[2].trim() != EVENT {
            return None;
        }
        fields[0].trim().parse().ok()
    })
}

/// A `perf stat` attached to one process, counting its system calls between [`Counting::enable`] and
/// [`Counting::interrupt`].
#[derive(Debug)]
pub(crate) struct Counting {
    child: Child,
    ctl: File,
    ack: File,
    out: PathBuf,
    log: PathBuf,
    fifos: [PathBuf; 2],
    /// When counting was on (perf's ack of `enable`) and off again (its ack of `disable`).
    started: Option<Instant>,
    stopped: Option<Instant>,
}

impl Drop for Counting {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(1));
        for f in self.fifos.iter().chain([&self.out, &self.log]) {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn mkfifo(path: &Path) -> Result<()> {
    let _ = std::fs::remove_file(path);
    let st = Command::new("mkfifo")
        .args(["-m", "0600"])
        .arg(path)
        .status()
        .with_context(|| format!("run mkfifo {}", path.display()))?;
    if !st.success() {
        bail!("mkfifo {} failed ({st})", path.display());
    }
    Ok(())
}

/// A FIFO opened for reading and writing without blocking, whoever else has it open.
fn open_fifo(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("open {}", path.display()))
}

/// Attach perf to `pid`, its counters disabled; returns once perf answers. `dir` is private to the bench (the
/// FIFOs, the output and perf's stderr go there, named after `tag`).
pub(crate) fn start(pid: u32, dir: &Path, tag: &str) -> Result<Counting> {
    let ctl = dir.join(format!("perf-{tag}.ctl"));
    let ack = dir.join(format!("perf-{tag}.ack"));
    let out = dir.join(format!("perf-{tag}.csv"));
    let log = dir.join(format!("perf-{tag}.log"));
    mkfifo(&ctl)?;
    mkfifo(&ack)?;
    let (ctl_f, ack_f) = (open_fifo(&ctl)?, open_fifo(&ack)?);
    let logf = File::create(&log).context("create perf log")?;
    let child = Command::new("perf")
        .args(["stat", "-x,", "-e", EVENT, "-D", "-1", "-o"])
        .arg(&out)
        .arg("--control")
        .arg(format!("fifo:{},{}", ctl.display(), ack.display()))
        .args(["-p", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(logf)
        .spawn()
        .context("start perf stat")?;
    let mut c = Counting { child, ctl: ctl_f, ack: ack_f, out, log, fifos: [ctl, ack], started: None, stopped: None };
    c.command("ping").with_context(|| format!("perf stat -p {pid}"))?;
    Ok(c)
}

impl Counting {
    /// Write `cmd` to perf's control FIFO and wait for its ack.
    fn command(&mut self, cmd: &str) -> Result<()> {
        self.ctl.write_all(format!("{cmd}\n").as_bytes()).context("write to perf's control FIFO")?;
        let end = Instant::now() + ACK_TIMEOUT;
        let mut got = Vec::new();
        loop {
            let mut buf = [0u8; 64];
            match self.ack.read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e).context("read perf's ack FIFO"),
            }
            if got.windows(3).any(|w| w == b"ack") {
                return Ok(());
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                bail!("perf exited ({st}): {}", self.log_tail());
            }
            if Instant::now() >= end {
                bail!("perf did not answer `{cmd}` within {} s", ACK_TIMEOUT.as_secs());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("(nothing on stderr)").trim().to_string()
    }

    /// Start counting.
    pub(crate) fn enable(&mut self) -> Result<()> {
        self.command("enable")?;
        self.started = Some(Instant::now());
        Ok(())
    }

    /// Stop counting and tell perf to write the count and exit (SIGINT).
    pub(crate) fn interrupt(&mut self) {
        if self.stopped.is_some() {
            return;
        }
        if self.started.is_some() {
            if let Err(e) = self.command("disable") {
                tracing::debug!("perf: {e:#}");
            }
        }
        self.stopped = Some(Instant::now());
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGINT);
        }
    }

    /// The count and the seconds counted (stopping perf first if that was not done yet).
    pub(crate) fn finish(mut self) -> Result<(u64, f64)> {
        self.interrupt();
        let Some(started) = self.started else { bail!("counting was never enabled") };
        let seconds = self.stopped.map(|s| s.duration_since(started).as_secs_f64()).unwrap_or(0.0);
        if wait_timeout(&mut self.child, Duration::from_secs(5)).is_none() {
            bail!("perf stat did not exit after SIGINT");
        }
        let text = std::fs::read_to_string(&self.out).with_context(|| format!("read {}", self.out.display()))?;
        let n = parse_csv(&text).ok_or_else(|| anyhow!("perf stat counted nothing: {:?}", text.trim()))?;
        Ok((n, seconds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_counts() {
        let text = "# started on Tue Nov 24 23:04:20 2026\n\n757757,,raw_syscalls:sys_enter,167136450,100.00,,\n";
        assert_eq!(parse_csv(text), Some(757_757));
        // Started disabled (-D -1), perf appends its enable/disable notes to the line.
        let toggled = "771771,,raw_syscalls:sys_enter,176753556,100.00,,Events disabled\nEvents enabled\n";
        assert_eq!(parse_csv(toggled), Some(771_771));
        assert_eq!(parse_csv("<not counted>,,raw_syscalls:sys_enter,0,100.00,,\n"), None);
        assert_eq!(parse_csv("<not supported>,,cycles,0,100.00,,\n"), None);
        assert_eq!(parse_csv(""), None);
    }
}
