//! DPDK's `dpdk-testpmd` as the bench drives it (`--vhost-user`), and the CLI's DPDK tests with it: started
//! inside a namespace in interactive mode and given one command at a time on its standard input, each answer
//! read up to the next prompt. It plays the guest (a virtio-user port on a vhost-user socket) and DPDK's
//! reference backend (a vhost-user port forwarding into a TAP).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::modes::which;
use super::netcfg::Netns;
use super::process::{terminate, wait_timeout};

/// The program (Debian's `dpdk-dev`).
pub const TESTPMD: &str = "dpdk-testpmd";
const PROMPT: &str = "testpmd> ";
/// What one answer may take at most: testpmd starts in about a second (its 32k-mbuf pool), a command answers
/// in milliseconds; only a stuck testpmd reaches this.
const PATIENCE: Duration = Duration::from_secs(30);

/// Why testpmd cannot run here (the tools it is started with), or `None`.
pub fn missing() -> Option<String> {
    let missing: Vec<String> = [(TESTPMD, "dpdk-dev"), ("stdbuf", "coreutils"), ("taskset", "util-linux")]
        .iter()
        .filter(|(tool, _)| which(tool).is_none())
        .map(|(tool, package)| format!("{tool} (apt-get install {package})"))
        .collect();
    (!missing.is_empty()).then(|| format!("missing {}", missing.join(", ")))
}

/// The EAL arguments every testpmd of the bench shares: lcores 0 and 1, the command line on `main_lcore` (so
/// that the forwarding lcore is the other one), no hugepages (its memory a memfd a vhost-user peer maps), no PCI
/// scan, no telemetry socket, runtime files under its own `--file-prefix`.
pub fn eal_args(main_lcore: u32, file_prefix: &str) -> Vec<String> {
    ["-l", "0,1", "--main-lcore", &main_lcore.to_string(), "--no-huge", "-m", "512", "--no-pci", "--no-telemetry"]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("--file-prefix={file_prefix}")])
        .collect()
}

/// A port's counters (`show port stats all`, counted since the port started).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames received.
    pub rx_packets: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Frames the port missed (no room in its ring).
    pub rx_missed: u64,
    /// Frames received with errors.
    pub rx_errors: u64,
    /// Frames dropped for want of an mbuf.
    pub rx_nombuf: u64,
    /// Frames sent.
    pub tx_packets: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// Frames that could not be sent.
    pub tx_errors: u64,
}

impl PortStats {
    /// What was counted since `earlier` (a reading of the same port).
    pub fn since(&self, earlier: &PortStats) -> PortStats {
        PortStats {
            rx_packets: self.rx_packets - earlier.rx_packets,
            rx_bytes: self.rx_bytes - earlier.rx_bytes,
            rx_missed: self.rx_missed - earlier.rx_missed,
            rx_errors: self.rx_errors - earlier.rx_errors,
            rx_nombuf: self.rx_nombuf - earlier.rx_nombuf,
            tx_packets: self.tx_packets - earlier.tx_packets,
            tx_bytes: self.tx_bytes - earlier.tx_bytes,
            tx_errors: self.tx_errors - earlier.tx_errors,
        }
    }
}

/// Every port's counters in a `show port stats all` answer, port 0 first.
pub fn parse_port_stats(answer: &str) -> Result<Vec<PortStats>> {
    let blocks: Vec<&str> = answer.split("NIC statistics for port").skip(1).collect();
    if blocks.is_empty() {
        bail!("no port statistics in testpmd's answer: {answer:?}");
    }
    blocks
        .iter()
        .map(|b| {
            Ok(PortStats {
                rx_packets: number_after(b, "RX-packets:")?,
                rx_bytes: number_after(b, "RX-bytes:")?,
                rx_missed: number_after(b, "RX-missed:")?,
                rx_errors: number_after(b, "RX-errors:")?,
                rx_nombuf: number_after(b, "RX-nombuf:")?,
                tx_packets: number_after(b, "TX-packets:")?,
                tx_bytes: number_after(b, "TX-bytes:")?,
                tx_errors: number_after(b, "TX-errors:")?,
            })
        })
        .collect()
}

/// The frames testpmd's forwarding dropped (`RX-dropped` and `TX-dropped` of the accumulated forward statistics
/// that `stop` prints): what a forwarding mode received but could not send on.
pub fn parse_forward_drops(answer: &str) -> Result<u64> {
    let block = answer
        .split("Accumulated forward statistics")
        .nth(1)
        .or_else(|| answer.split("Forward statistics for port").nth(1))
        .ok_or_else(|| anyhow!("no forward statistics in testpmd's answer to stop: {answer:?}"))?;
    Ok(number_after(block, "RX-dropped:")? + number_after(block, "TX-dropped:")?)
}

fn number_after(text: &str, label: &str) -> Result<u64> {
    let after = text.split(label).nth(1).ok_or_else(|| anyhow!("no {label} in testpmd's answer: {text:?}"))?;
    after
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow!("{label} is not followed by a number in testpmd's answer: {text:?}"))
}

/// What testpmd printed so far (standard output and error, as they came), and a signal for each new piece.
type Transcript = Arc<(Mutex<String>, Condvar)>;

/// A running `dpdk-testpmd -i`. Killed on drop if it has not quit, and its runtime files (`/var/run/dpdk/PREFIX`,
/// which DPDK leaves even after `quit`) removed.
#[derive(Debug)]
pub struct Testpmd {
    child: Child,
    stdin: Option<ChildStdin>,
    /// What testpmd printed on its standard output: its prompts and answers.
    transcript: Transcript,
    /// What it printed on its standard error, kept apart: a message written there while the prompt is printed
    /// would otherwise cut the prompt in two.
    errors: Transcript,
    /// Prompts seen so far: a command is done when the next prompt is printed.
    prompts: usize,
    file_prefix: String,
    label: String,
    /// Where the transcript is written when testpmd is dropped (the run's log).
    log: PathBuf,
    stop: Arc<AtomicBool>,
}

impl Testpmd {
    /// Starts `stdbuf -oL dpdk-testpmd EAL.. -- -i APP..` inside `ns` and waits for its first prompt, which it
    /// prints once its ports have started (a virtio-user port: connected to its backend, features agreed).
    /// `label` names it in errors, `file_prefix` is its EAL `--file-prefix` (its runtime files, removed before
    /// and after), `log` receives what it printed when it is dropped, and `stop` set interrupts a wait.
    pub fn start(
        label: &str,
        ns: &Netns,
        eal: &[String],
        app: &[&str],
        file_prefix: &str,
        log: PathBuf,
        stop: &Arc<AtomicBool>,
    ) -> Result<Testpmd> {
        remove_runtime_files(file_prefix);
        let mut command = Command::new("stdbuf");
        // Line-buffered, so that each answer arrives whole before its prompt.
        command
            .args(["-oL", TESTPMD])
            .args(eal)
            .args(["--", "-i"])
            .args(app)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = ns.spawn(&mut command)?;
        let (transcript, errors): (Transcript, Transcript) = (Arc::default(), Arc::default());
        for (output, into) in [
            (child.stdout.take().map(|o| Box::new(o) as Box<dyn Read + Send>), &transcript),
            (child.stderr.take().map(|e| Box::new(e) as Box<dyn Read + Send>), &errors),
        ] {
            if let Some(output) = output {
                let into = into.clone();
                std::thread::spawn(move || copy_into(output, &into));
            }
        }
        let stdin = child.stdin.take();
        let mut testpmd = Testpmd {
            child,
            stdin,
            transcript,
            errors,
            prompts: 0,
            file_prefix: file_prefix.to_string(),
            label: label.to_string(),
            log,
            stop: Arc::clone(stop),
        };
        testpmd.wait_prompt("its first prompt")?;
        Ok(testpmd)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `command` and waits for the next prompt; what testpmd answered.
    pub fn run(&mut self, command: &str) -> Result<String> {
        let before = self.output().len();
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow!("{}: standard input closed", self.label))?;
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .with_context(|| format!("{}: send `{command}`", self.label))?;
        self.wait_prompt(command)?;
        Ok(self.output()[before..].to_string())
    }

    /// `show port stats all`.
    pub fn port_stats(&mut self) -> Result<Vec<PortStats>> {
        parse_port_stats(&self.run("show port stats all")?)
    }

    fn wait_prompt(&mut self, what: &str) -> Result<()> {
        let want = self.prompts + 1;
        let (text, changed) = &*self.transcript;
        let deadline = Instant::now() + PATIENCE;
        let mut guard = text.lock().unwrap_or_else(|e| e.into_inner());
        while guard.matches(PROMPT).count() < want {
            if self.stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let errors = self.errors();
                bail!("{} exited ({status}) before answering `{what}`: {} {}", self.label, tail(&guard), tail(&errors));
            }
            if Instant::now() >= deadline {
                let errors = self.errors();
                bail!(
                    "{} gave no prompt after `{what}` within {} s: {} {}",
                    self.label,
                    PATIENCE.as_secs(),
                    tail(&guard),
                    tail(&errors)
                );
            }
            guard = changed.wait_timeout(guard, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
        }
        self.prompts = want;
        Ok(())
    }

    /// Its standard output so far.
    pub fn output(&self) -> String {
        self.transcript.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Its standard error so far.
    pub fn errors(&self) -> String {
        self.errors.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Frames each receive and transmit queue of port 0 carried (`show port xstats 0`: `rx_qN_good_packets`,
    /// `tx_qN_good_packets`), for its first `pairs` queues, queue by queue.
    pub fn queue_packets(&mut self, pairs: usize) -> Result<(Vec<u64>, Vec<u64>)> {
        let answer = self.run("show port xstats 0")?;
        let count = |name: String| -> Result<u64> {
            answer
                .lines()
                .find_map(|line| line.trim().strip_prefix(&format!("{name}:")))
                .and_then(|n| n.trim().parse().ok())
                .ok_or_else(|| anyhow!("no {name} in testpmd's answer: {answer:?}"))
        };
        Ok((
            (0..pairs).map(|q| count(format!("rx_q{q}_good_packets"))).collect::<Result<_>>()?,
            (0..pairs).map(|q| count(format!("tx_q{q}_good_packets"))).collect::<Result<_>>()?,
        ))
    }

    /// `quit`: testpmd closes its ports (a vhost-user peer sees its front end leave) and exits; killed if it
    /// has not within a few seconds.
    pub fn quit(mut self) -> Result<()> {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"quit\n");
        }
        match wait_timeout(&mut self.child, Duration::from_secs(10)) {
            Some(status) if status.success() => Ok(()),
            Some(status) => bail!("{} exited {status} after quit: {}", self.label, tail(&self.output())),
            None => bail!("{} did not exit within 10 s of quit", self.label),
        }
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(2));
        let _ = std::fs::write(&self.log, format!("{}\n--- standard error ---\n{}", self.output(), self.errors()));
        remove_runtime_files(&self.file_prefix);
    }
}

/// What DPDK leaves under a file prefix: its runtime directory (even after a clean exit) and, had it used them,
/// hugepage files and shared-memory files.
fn remove_runtime_files(prefix: &str) {
    let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(prefix));
    for dir in ["/dev/hugepages", "/dev/shm"] {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The last lines testpmd printed, for an error message.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(4)..].join(" | ")
}

fn copy_into(mut output: Box<dyn Read + Send>, transcript: &Transcript) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = output.read(&mut buf) {
        if n == 0 {
            break;
        }
        let (text, changed) = &**transcript;
        text.lock().unwrap_or_else(|e| e.into_inner()).push_str(&String::from_utf8_lossy(&buf[..n]));
        changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORT_STATS: &str = "show port stats all\n\n  ######################## NIC statistics for port 0  \
        ########################\n  RX-packets: 3179936    RX-missed: 7          RX-bytes:  203515904\n  \
        RX-errors: 1\n  RX-nombuf:  2         \n  TX-packets: 0          TX-errors: 0          TX-bytes:  0\n\n  \
        ######################## NIC statistics for port 1  ########################\n  RX-packets: 0          \
        RX-missed: 0          RX-bytes:  0\n  RX-errors: 0\n  RX-nombuf:  0         \n  TX-packets: 3179936    \
        TX-errors: 5          TX-bytes:  203515904\n";

    #[test]
    fn port_stats_of_every_port() {
        let ports = parse_port_stats(PORT_STATS).unwrap();
        assert_eq!(
            ports,
            [
                PortStats {
                    rx_packets: 3179936,
                    rx_bytes: 203515904,
                    rx_missed: 7,
                    rx_errors: 1,
                    rx_nombuf: 2,
                    tx_packets: 0,
                    tx_bytes: 0,
                    tx_errors: 0
                },
                PortStats { tx_packets: 3179936, tx_bytes: 203515904, tx_errors: 5, ..PortStats::default() },
            ]
        );
        assert!(parse_port_stats("testpmd> ").is_err());
        assert!(parse_port_stats("NIC statistics for port 0 RX-packets: lots").is_err());
        let later = PortStats { rx_packets: 3179940, rx_bytes: 203516160, ..ports[0] };
        assert_eq!(later.since(&ports[0]), PortStats { rx_packets: 4, rx_bytes: 256, ..PortStats::default() });
    }

    #[test]
    fn forward_drops_of_stop() {
        let stop = "  +++++++++++++++ Accumulated forward statistics for all ports+++++++++++++++\n  \
                    RX-packets: 10             RX-dropped: 3             RX-total: 13\n  \
                    TX-packets: 256            TX-dropped: 10368         TX-total: 10624\n";
        assert_eq!(parse_forward_drops(stop).unwrap(), 10371);
        assert!(parse_forward_drops("Telling cores to stop...").is_err());
    }

    #[test]
    fn eal_arguments() {
        let eal = eal_args(1, "tt1r1fe");
        assert_eq!(eal[..4], ["-l", "0,1", "--main-lcore", "1"]);
        assert_eq!(eal.last().map(String::as_str), Some("--file-prefix=tt1r1fe"));
    }
}
