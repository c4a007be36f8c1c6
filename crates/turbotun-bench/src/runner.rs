//! One run: the topology, the server in B, the client in A, and the samples taken around the measurement window.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::flame;
use super::gen;
use super::iperf::{self, IperfResult, Traffic};
use super::modes::Mode;
use super::perfstat;
use super::process::{collect_stdout, run_in_ns, send_sigterm, sleep_checked, wait_timeout, KillOnDrop, LinesFrom};
use super::procfs::{self, BoxCpu};
use super::report::{ProcSample, RunRecord};
use super::topo::{self, FloodTarget, RunSite, Topology};
use super::wgflood::FloodReport;

/// UDP port of the generator's sink (iperf3 uses 5201).
const SINK_PORT: u16 = 5202;
const IPERF_PORT: u16 = 5201;

/// Everything a run needs besides the mode and traffic.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub exe: PathBuf,
    /// Start of every namespace and device name of this bench process (`tt<pid>`).
    pub prefix: String,
    pub duration: u64,
    pub ipv6: bool,
    pub log_dir: PathBuf,
    pub stop: Arc<AtomicBool>,
    pub run_counter: u32,
    /// Clock ticks per second of the forwarder's CPU times.
    pub clk_tck: f64,
    /// The devices' queue length for the next runs (the loss bench's `--txqueuelen`); None: the kernel's.
    pub txqueuelen: Option<u32>,
    /// Count the system calls of a tunnel's endpoint processes over the window (`perf stat`, see perfstat.rs).
    pub count_syscalls: bool,
    /// Initiations a second of a `-flood` kind's flood (0: unpaced).
    pub flood_rate_pps: u64,
}

impl Ctx {
    pub(crate) fn interrupted(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Where the current run (`run_counter`) is built, `stop` interrupting its waits.
    pub(crate) fn site<'a>(&'a self, stop: &'a AtomicBool) -> RunSite<'a> {
        RunSite { prefix: &self.prefix, run: self.run_counter, ipv6: self.ipv6, log_dir: &self.log_dir, stop }
    }
}

/// The record of one (mode, traffic, repetition), before anything is measured.
pub(crate) fn run_record(mode: &Mode, t: &Traffic, rep: u32, ipv6: bool) -> RunRecord {
    RunRecord {
        mode: mode.label.clone(),
        family: mode.family.into(),
        traffic: t.label.into(),
        rep,
        ipv6,
        ..Default::default()
    }
}

/// One run: topology, forwarder, server and client, samples before and after the window. With `flamegraph`,
/// the forwarder is profiled during the window and the flamegraph written there.
pub(crate) fn run_one(
    ctx: &mut Ctx,
    mode: &Mode,
    t: &Traffic,
    rep: u32,
    flamegraph: Option<&Path>,
) -> Result<RunRecord> {
    ctx.run_counter += 1;
    let stop = Arc::clone(&ctx.stop);
    let mut topo = Topology::build(mode, ctx.site(&stop), ctx.txqueuelen)?;
    let mut rec = run_record(mode, t, rep, ctx.ipv6);
    let mut server = Server::start(ctx, &topo, t)?;

    let before = Before::take(&topo, t, ctx)?;
    // A `-flood` kind's flood covers the whole window: it starts before the traffic and stops after the samples.
    let flood = topo.flood.as_ref().map(|f| Flooder::start(ctx, &topo, f)).transpose()?;
    let perf = match (flamegraph, before.fwd.as_ref().map(|f| f.pid)) {
        (Some(svg), Some(pid)) => Some(flame::start(pid, ctx.duration, &svg.with_extension("perf.data"))?),
        _ => None,
    };
    // The window closes when the traffic ends (the client or generator exits); the drop counters are read once
    // the receiving side is done, so that what was still in flight is counted where it was lost.
    let result = if t.gso > 0 {
        let gen = run_generator(ctx, &topo, t)?;
        let drops = before.end_window(&mut rec, ctx)?;
        let load = gen::LoadResult { gen, sink: sink_report(&mut server)? };
        drops.record(&mut rec, &topo, t, ctx);
        let result = gen::to_result(&load.gen, &load.sink);
        rec.load = Some(load);
        result
    } else {
        let result = run_iperf_client(ctx, &topo, t)?;
        before.end_window(&mut rec, ctx)?.record(&mut rec, &topo, t, ctx);
        result
    };
    rec.iperf = Some(result);
    if let Some(flood) = flood {
        rec.flood = Some(flood.stop()?);
    }

    if wait_timeout(&mut server.child.0, Duration::from_secs(5)).is_none() {
        tracing::debug!("the server still runs after the client finished; killing it");
    }
    drop(server);
    stop_forwarder(&mut topo, &mut rec);
    if let (Some(recording), Some(svg)) = (perf, flamegraph) {
        let title = format!("turbotun bench {} — {} {} s", mode.label, t.label, ctx.duration);
        recording.finish(Duration::from_secs(ctx.duration + 15), svg, &title)?;
        // The recording stays beside the flamegraph (MODE.perf.data) for `perf report --sort dso,sym`.
        let _ = std::fs::remove_file(svg.with_extension("perf.log"));
    }
    Ok(rec)
}

/// Stops the forwarder and a tunnel's endpoints and keeps their counters and exit status; one that died during
/// the window fails the run.
fn stop_forwarder(topo: &mut Topology, rec: &mut RunRecord) {
    let alive = topo.forwarder.as_mut().map(|f| f.is_running());
    if let Some(fwd) = topo.forwarder.take() {
        let exit = fwd.stop();
        rec.fwd_counters = exit.counters;
        rec.fwd_exit = exit.status;
        if alive == Some(false) {
            rec.error = Some(format!("forwarder died during the run: {}", exit.stderr_tail));
        }
    }
    let mut endpoints: Vec<_> = topo.endpoints.drain(..).collect();
    let alive: Vec<bool> = endpoints.iter_mut().map(|e| e.is_running()).collect();
    // All told at once, so that one endpoint does not see its peer vanish for the seconds the other takes.
    for e in &endpoints {
        send_sigterm(e.pid);
    }
    for (e, alive) in endpoints.into_iter().zip(alive) {
        let (pid, label) = (e.pid, e.label.clone());
        let exit = e.stop();
        if let Some(s) = rec.endpoints.iter_mut().find(|s| s.pid == pid) {
            s.counters = exit.counters;
            s.exit = exit.status;
        }
        if !alive && rec.error.is_none() {
            rec.error = Some(format!("{label} died during the run: {}", exit.stderr_tail));
        }
    }
}

/// `turbotun bench --wg-flood` in A toward B's WireGuard endpoint, for a `-flood` kind's window.
#[derive(Debug)]
struct Flooder {
    child: KillOnDrop,
    stdout: JoinHandle<String>,
}

impl Flooder {
    fn start(ctx: &Ctx, topo: &Topology, f: &FloodTarget) -> Result<Flooder> {
        let log = ctx.log_dir.join(format!("flood-{}.log", ctx.run_counter));
        let log = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let from: Vec<String> = f.sources.iter().map(|a| a.to_string()).collect();
        let mut cmd = Command::new(&ctx.exe);
        cmd.args(["bench", "--wg-flood", &f.dest.to_string(), "--wg-flood-key", &f.server_key])
            .args(["--wg-flood-from", &from.join(","), "--wg-flood-rate", &ctx.flood_rate_pps.to_string()])
            // Ended by SIGTERM once the window is over; the duration only bounds a flooder left behind.
            .args(["--duration", &(ctx.duration + 30).to_string()]);
        let mut child =
            topo.ns_a.spawn(cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log)).context("start the flood")?;
        let stdout = collect_stdout(&mut child);
        Ok(Flooder { child: KillOnDrop(child), stdout })
    }

    /// SIGTERM; the report it prints then.
    fn stop(mut self) -> Result<FloodReport> {
        send_sigterm(self.child.0.id());
        if wait_timeout(&mut self.child.0, Duration::from_secs(5)).is_none() {
            bail!("the flood generator did not stop within 5 s of SIGTERM");
        }
        let text = self.stdout.join().unwrap_or_default();
        serde_json::from_str(text.trim()).with_context(|| format!("flood generator's report: {:?}", text.trim()))
    }
}

/// The server in B, bound to B's address: iperf3 for one test, or turbotun's UDP sink.
#[derive(Debug)]
struct Server {
    child: KillOnDrop,
    /// Taken when the sink's report is read.
    stdout: Option<JoinHandle<String>>,
}

impl Server {
    fn start(ctx: &Ctx, topo: &Topology, t: &Traffic) -> Result<Server> {
        let log = ctx.log_dir.join(format!("server-{}.log", ctx.run_counter));
        let log = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = if t.gso > 0 {
            let mut c = Command::new(&ctx.exe);
            c.args(["bench", "--udp-sink", &sink_addr(topo), "--udp-len", &t.payload.to_string()]);
            c.args(["--duration", &ctx.duration.to_string()]);
            c
        } else {
            let mut c = Command::new("iperf3");
            c.args(["-s", "-1", "-J", "-B", &topo.server_addr]);
            c
        };
        let mut child = topo
            .server()
            .spawn(cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log))
            .context("start the server")?;
        let stdout = collect_stdout(&mut child);
        let server = Server { child: KillOnDrop(child), stdout: Some(stdout) };
        let (port, udp) = if t.gso > 0 { (SINK_PORT, true) } else { (IPERF_PORT, false) };
        topo.wait_bound(port, udp, server_is_v6(topo), Duration::from_secs(5), &ctx.stop)?;
        Ok(server)
    }
}

fn server_is_v6(topo: &Topology) -> bool {
    topo.server_addr.contains(':')
}

/// The UDP sink's socket address.
fn sink_addr(topo: &Topology) -> String {
    sink_addr_port(&topo.server_addr, SINK_PORT)
}

fn sink_addr_port(addr: &str, port: u16) -> String {
    if addr.contains(':') {
        format!("[{addr}]:{port}")
    } else {
        format!("{addr}:{port}")
    }
}

/// The generator's arguments after `turbotun bench --udp-gen|--udp-roundtrip ADDR:PORT`.
fn generator_args(ctx: &Ctx, t: &Traffic) -> Vec<String> {
    let (len, gso, rate, secs) =
        (t.payload.to_string(), t.gso.to_string(), t.rate.to_string(), ctx.duration.to_string());
    ["--udp-len", &len, "--udp-gso", &gso, "--udp-rate", &rate, "--duration", &secs].map(String::from).to_vec()
}

/// turbotun's UDP generator in A toward the sink in B; its report, once it has sent its last datagram.
fn run_generator(ctx: &Ctx, topo: &Topology, t: &Traffic) -> Result<gen::GenReport> {
    let exe = ctx.exe.to_string_lossy();
    let sink = sink_addr(topo);
    let args = generator_args(ctx, t);
    let mut cmd = vec![&*exe, "bench", "--udp-gen", &sink];
    cmd.extend(args.iter().map(String::as_str));
    let (text, status) = run_in_ns(&topo.ns_a, &cmd, client_timeout(ctx), &ctx.stop)?;
    serde_json::from_str(text.trim()).with_context(|| format!("UDP generator ({status}): {:?}", text.trim()))
}

/// The sink's report: it stops shortly after the last datagram.
fn sink_report(server: &mut Server) -> Result<gen::SinkReport> {
    if wait_timeout(&mut server.child.0, Duration::from_secs(5)).is_none() {
        bail!("UDP sink did not finish");
    }
    let text = server.stdout.take().and_then(|h| h.join().ok()).unwrap_or_default();
    serde_json::from_str(text.trim()).with_context(|| format!("UDP sink: {:?}", text.trim()))
}

/// An echo responder the echo bench measures: `PROGRAM ARGV..` under the forwarder contract, `{dev}` standing
/// for the device.
#[derive(Debug, Clone)]
pub(crate) struct EchoProgram {
    pub label: String,
    pub argv: Vec<&'static str>,
}

/// One run of the echo bench: a namespace with the echo's device, the generator and sink in one process there
/// (`--udp-roundtrip`: the sink counts the answers), the echo's CPU and the device's TX drops over the window.
pub(crate) fn run_echo(ctx: &mut Ctx, echo: &EchoProgram, t: &Traffic, rep: u32) -> Result<RunRecord> {
    ctx.run_counter += 1;
    let stop = Arc::clone(&ctx.stop);
    let mut topo = Topology::build_echo(&echo.label, &ctx.exe, &echo.argv, ctx.site(&stop))?;
    let mut rec = RunRecord {
        mode: echo.label.clone(),
        family: "echo".into(),
        traffic: t.label.into(),
        rep,
        ipv6: ctx.ipv6,
        ..Default::default()
    };
    let dest = sink_addr_port(&topo.server_addr, SINK_PORT);
    let exe = ctx.exe.to_string_lossy();
    let args = generator_args(ctx, t);
    let mut cmd = vec![&*exe, "bench", "--udp-roundtrip", &dest];
    cmd.extend(args.iter().map(String::as_str));
    let before = Before::take(&topo, t, ctx)?;
    let roundtrip = LinesFrom::spawn(&topo.ns_a, &cmd)?;
    // The generator says `sent` after its last datagram: the window ends there, not after the sink's wait for
    // the last answers (which would count idle time as traffic).
    let sent = roundtrip.next_line(client_timeout(ctx), &ctx.stop)?;
    anyhow::ensure!(sent.trim() == gen::SENT_LINE, "UDP round trip: {sent:?} where {:?} was due", gen::SENT_LINE);
    let drops = before.end_window(&mut rec, ctx)?;
    let text = roundtrip.next_line(Duration::from_secs(10), &ctx.stop)?;
    let status = roundtrip.wait(Duration::from_secs(5))?;
    drops.record(&mut rec, &topo, t, ctx);
    let load: gen::LoadResult =
        serde_json::from_str(text.trim()).with_context(|| format!("UDP round trip ({status}): {:?}", text.trim()))?;
    rec.iperf = Some(gen::to_result(&load.gen, &load.sink));
    rec.load = Some(load);
    stop_forwarder(&mut topo, &mut rec);
    Ok(rec)
}

/// The iperf3 client in A; a refused connection (the server not quite ready) is tried again twice.
fn run_iperf_client(ctx: &Ctx, topo: &Topology, t: &Traffic) -> Result<IperfResult> {
    let client_args = t.client_args(&topo.server_addr, ctx.duration, server_is_v6(topo));
    let mut cmd: Vec<&str> = vec!["iperf3"];
    cmd.extend(client_args.iter().map(String::as_str));
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (text, status) = run_in_ns(&topo.ns_a, &cmd, client_timeout(ctx), &ctx.stop)?;
        match iperf::parse_client_json(&text) {
            Ok(r) => return Ok(r),
            Err(e) if attempt < 3 && format!("{e}").contains("connect") => {
                sleep_checked(Duration::from_millis(300), &ctx.stop)?;
            }
            Err(e) => return Err(e.context(format!("iperf3 client ({status})"))),
        }
    }
}

fn client_timeout(ctx: &Ctx) -> Duration {
    Duration::from_secs(ctx.duration + 10)
}

/// What is sampled of one process (the forwarder, or an endpoint of a tunnel) just before the window.
#[derive(Debug)]
struct ProcBefore {
    pid: u32,
    label: String,
    /// Whether its peak RSS was reset, so that it covers the window only.
    rss_reset: bool,
    ticks: (u64, u64),
    /// Its system calls being counted, or why they are not.
    syscalls: Option<Result<perfstat::Counting, String>>,
}

impl ProcBefore {
    /// Samples `pid`; with `count_syscalls`, perf is attached to count its system calls once
    /// [`ProcBefore::begin`] says so (tagged `tag` in the log directory).
    fn take(pid: u32, label: &str, count_syscalls: Option<(&Path, &str)>) -> Result<ProcBefore> {
        let syscalls = count_syscalls.map(|(dir, tag)| perfstat::start(pid, dir, tag).map_err(|e| format!("{e:#}")));
        Ok(ProcBefore {
            pid,
            label: label.to_string(),
            rss_reset: procfs::reset_peak_rss(pid),
            ticks: procfs::pid_user_sys_ticks(pid)?,
            syscalls,
        })
    }

    /// The window starts: the system calls are counted from now on.
    fn begin(&mut self) {
        if let Some(Ok(c)) = self.syscalls.as_mut() {
            if let Err(e) = c.enable() {
                self.syscalls = Some(Err(format!("{e:#}")));
            }
        }
    }

    /// The sample over a window of `window` seconds.
    fn after(self, window: f64, clk_tck: f64) -> ProcSample {
        let mut s = ProcSample { pid: self.pid, program: self.label, ..Default::default() };
        if let Ok((user1, sys1)) = procfs::pid_user_sys_ticks(self.pid) {
            let (user, sys) = (user1.saturating_sub(self.ticks.0), sys1.saturating_sub(self.ticks.1));
            s.cpu_percent = Some((user + sys) as f64 / clk_tck / window * 100.0);
            s.user_seconds = Some(user as f64 / clk_tck);
            s.sys_seconds = Some(sys as f64 / clk_tck);
        }
        s.peak_rss_kb = procfs::pid_peak_rss_kb(self.pid);
        s.rss_anon_kb = procfs::pid_rss_anon_kb(self.pid);
        if !self.rss_reset {
            tracing::debug!("could not reset VmHWM of {}: peak RSS covers its lifetime", self.pid);
        }
        match self.syscalls.map(|c| c.and_then(|c| c.finish().map_err(|e| format!("{e:#}")))) {
            Some(Ok((n, secs))) => {
                s.syscalls = Some(n);
                s.syscall_seconds = Some(secs);
            }
            Some(Err(e)) => s.syscall_error = Some(e),
            None => {}
        }
        s
    }
}

/// What is sampled just before the measurement window, to subtract from the same sampled after it.
#[derive(Debug)]
struct Before {
    fwd: Option<ProcBefore>,
    endpoints: Vec<ProcBefore>,
    dev_tx_dropped: Option<u64>,
    udp_rcvbuf_errors: Option<u64>,
    box_cpu: BoxCpu,
    start: Instant,
}

impl Before {
    fn take(topo: &Topology, t: &Traffic, ctx: &Ctx) -> Result<Before> {
        let fwd = topo.forwarder.as_ref().map(|f| ProcBefore::take(f.pid, &f.label, None)).transpose()?;
        let mut endpoints = Vec::new();
        for (i, e) in topo.endpoints.iter().enumerate() {
            let tag = format!("{}-{i}", ctx.run_counter);
            let count = ctx.count_syscalls.then_some((ctx.log_dir.as_path(), tag.as_str()));
            endpoints.push(ProcBefore::take(e.pid, &e.label, count)?);
        }
        let dev_tx_dropped = topo.tx_dropped();
        // B's socket buffer overflowing is part of what a flood costs.
        let udp_rcvbuf_errors = if t.udp || topo.flood.is_some() { topo.rcvbuf_errors(ctx.ipv6) } else { None };
        // Counting starts last, just before the window.
        for e in &mut endpoints {
            e.begin();
        }
        Ok(Before {
            fwd,
            endpoints,
            dev_tx_dropped,
            udp_rcvbuf_errors,
            box_cpu: procfs::box_cpu()?,
            start: Instant::now(),
        })
    }

    /// The traffic has ended: the window closes here. CPU (over the window, % of one core), peak RSS, system
    /// calls and whole-box CPU go into `rec`; the drop counters are read later ([`DropsBefore::record`]).
    fn end_window(mut self, rec: &mut RunRecord, ctx: &Ctx) -> Result<DropsBefore> {
        // The syscall counts end with the window, before anything else is read.
        for e in &mut self.endpoints {
            if let Some(Ok(c)) = e.syscalls.as_mut() {
                c.interrupt();
            }
        }
        let window = self.start.elapsed().as_secs_f64();
        let box_cpu = procfs::box_cpu()?;
        if let Some(fwd) = self.fwd {
            let s = fwd.after(window, ctx.clk_tck);
            rec.fwd_cpu_percent = s.cpu_percent;
            rec.fwd_user_seconds = s.user_seconds;
            rec.fwd_sys_seconds = s.sys_seconds;
            rec.fwd_peak_rss_kb = s.peak_rss_kb;
            rec.fwd_rss_anon_kb = s.rss_anon_kb;
        }
        for (i, e) in self.endpoints.into_iter().enumerate() {
            let side = if i == 0 { "A" } else { "B" };
            rec.endpoints.push(ProcSample { side: side.into(), ..e.after(window, ctx.clk_tck) });
        }
        rec.box_cpu_percent = box_cpu.percent_since(&self.box_cpu);
        rec.window_seconds = window;
        Ok(DropsBefore { dev_tx_dropped: self.dev_tx_dropped, udp_rcvbuf_errors: self.udp_rcvbuf_errors })
    }
}

/// The drop counters sampled before the window, read again once the receiving side is done.
#[derive(Debug)]
struct DropsBefore {
    dev_tx_dropped: Option<u64>,
    udp_rcvbuf_errors: Option<u64>,
}

impl DropsBefore {
    /// The drops since the window began into `rec`.
    fn record(self, rec: &mut RunRecord, topo: &Topology, t: &Traffic, ctx: &Ctx) {
        rec.dev_tx_dropped = difference(self.dev_tx_dropped, topo.tx_dropped());
        if t.udp || topo.flood.is_some() {
            rec.udp_rcvbuf_errors = difference(self.udp_rcvbuf_errors, topo.rcvbuf_errors(ctx.ipv6));
        }
    }
}

fn difference(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    Some(after?.saturating_sub(before?))
}

/// What an interrupted bench reports, whatever step the signal cut short.
pub(crate) fn interrupted(e: anyhow::Error) -> anyhow::Error {
    tracing::debug!("interrupted during: {e:#}");
    anyhow!("interrupted: namespaces and processes torn down")
}

/// A mode whose forwarder never said `ready` is broken, not the run: the bench skips its later runs.
pub(crate) fn is_not_ready(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<topo::NotReady>().is_some())
}
