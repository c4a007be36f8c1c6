//! Flamegraphs of a forwarder: `perf record -e cpu-clock -g -p PID` during a run, then `perf script` folded and
//! rendered with inferno (as a library).

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use inferno::collapse::Collapse;

use super::process::{terminate, wait_timeout};

/// A running `perf record`.
#[derive(Debug)]
pub(crate) struct Recording {
    child: Child,
    data: PathBuf,
    log: PathBuf,
}

/// Start sampling `pid` at 999 Hz for `seconds` (cpu-clock: this VM has no PMU for `cycles`).
pub(crate) fn start(pid: u32, seconds: u64, data: &Path) -> Result<Recording> {
    let log = data.with_extension("log");
    let logf = std::fs::File::create(&log).context("create perf log")?;
    let child = Command::new("perf")
        .args(["record", "-F", "999", "-e", "cpu-clock", "-g", "-o"])
        .arg(data)
        .args(["-p", &pid.to_string(), "--", "sleep", &seconds.to_string()])
        .stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf)
        .spawn()
        .context("start perf record")?;
    Ok(Recording { child, data: data.to_path_buf(), log })
}

impl Drop for Recording {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(2));
    }
}

impl Recording {
    /// Wait for perf to finish (it samples for the duration given to `start`), then render `svg`.
    pub(crate) fn finish(mut self, timeout: Duration, svg: &Path, title: &str) -> Result<()> {
        let status = match wait_timeout(&mut self.child, timeout) {
            Some(s) => s,
            None => terminate(&mut self.child, Duration::from_secs(2)).context("perf record hung")?,
        };
        if !status.success() && !self.data.exists() {
            bail!("perf record failed ({status}): {}", std::fs::read_to_string(&self.log).unwrap_or_default().trim());
        }
        render(&self.data, svg, title)
    }
}

/// `perf script -i DATA` | collapse-perf | flamegraph > SVG.
pub(crate) fn render(data: &Path, svg: &Path, title: &str) -> Result<()> {
    let mut script = Command::new("perf")
        .args(["script", "-i"])
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("run perf script")?;
    let out = script.stdout.take().expect("piped");
    let mut folded = Vec::new();
    let mut folder = inferno::collapse::perf::Folder::from(inferno::collapse::perf::Options::default());
    folder.collapse(BufReader::new(out), &mut folded).context("collapse perf script output")?;
    let st = script.wait()?;
    if !st.success() {
        bail!("perf script failed ({st})");
    }
    let text = String::from_utf8_lossy(&folded);
    if text.trim().is_empty() {
        bail!("no samples in {}", data.display());
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = "ns (cpu-clock)".into();
    let file = std::fs::File::create(svg).with_context(|| format!("create {}", svg.display()))?;
    inferno::flamegraph::from_lines(&mut opts, text.lines(), std::io::BufWriter::new(file))
        .with_context(|| format!("render {}", svg.display()))?;
    Ok(())
}
