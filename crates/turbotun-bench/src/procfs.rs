//! Parsing of the /proc files the bench samples: `/proc/PID/stat`, `/proc/PID/status`, `/proc/stat`,
//! `/proc/net/snmp` and `/proc/net/snmp6`.

use anyhow::{anyhow, Context, Result};

/// Clock ticks per second, the unit of the times in `/proc/PID/stat` (`sysconf(_SC_CLK_TCK)`).
pub(crate) fn clk_tck() -> Result<f64> {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(ticks)) if ticks > 0 => Ok(ticks as f64),
        Ok(other) => Err(anyhow!("sysconf(_SC_CLK_TCK) returned {other:?}, not a tick rate")),
        Err(e) => Err(anyhow!("sysconf(_SC_CLK_TCK): {e}")),
    }
}

/// utime and stime of a process (all its threads: the thread-group leader's `/proc/PID/stat` aggregates them),
/// user space and kernel apart, in clock ticks.
pub(crate) fn parse_pid_stat_user_sys_ticks(stat: &str) -> Result<(u64, u64)> {
    // The command name (field 2) is in parentheses and may contain spaces or ')': split after the last ')'.
    let close = stat.rfind(')').ok_or_else(|| anyhow!("no ')' in /proc/PID/stat"))?;
    let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    let field = |n: usize| -> Result<u64> {
        rest.get(n - 3)
            .ok_or_else(|| anyhow!("/proc/PID/stat has no field {n}"))?
            .parse::<u64>()
            .with_context(|| format!("/proc/PID/stat field {n}"))
    };
    Ok((field(14)?, field(15)?))
}

/// The CPU's nominal clock in MHz: the first `cpu MHz` of `/proc/cpuinfo` (on a VM, the clock the hypervisor
/// reports for the virtual CPU), or the `@ N GHz` of its model name where that is given.
pub(crate) fn parse_cpuinfo_mhz(cpuinfo: &str) -> Option<f64> {
    let field = |key: &str| {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let from_model = field("model name").and_then(|m| {
        let ghz = m.rsplit_once('@')?.1.trim().strip_suffix("GHz")?.trim().parse::<f64>().ok()?;
        Some(ghz * 1000.0)
    });
    from_model.or_else(|| field("cpu MHz")?.parse::<f64>().ok()).filter(|mhz| *mhz > 0.0)
}

/// A `kB` value (e.g. `VmHWM`, `VmRSS`) from `/proc/PID/status`.
pub(crate) fn parse_status_kb(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        if k.trim() != key {
            return None;
        }
        v.split_whitespace().next()?.parse().ok()
    })
}

/// Effective uid from `/proc/self/status`.
pub(crate) fn parse_status_euid(status: &str) -> Option<u32> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix("Uid:")?;
        rest.split_whitespace().nth(1)?.parse().ok()
    })
}

/// Aggregate CPU times from the first line of `/proc/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BoxCpu {
    pub busy: u64,
    pub total: u64,
}

pub(crate) fn parse_proc_stat(stat: &str) -> Result<BoxCpu> {
    let line = stat.lines().find(|l| l.starts_with("cpu ")).ok_or_else(|| anyhow!("no 'cpu ' line in /proc/stat"))?;
    let vals: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<u64>())
        .collect::<Result<_, _>>()
        .context("/proc/stat cpu line")?;
    // user nice system idle iowait irq softirq steal guest guest_nice; guest* are already counted in user/nice.
    let total: u64 = vals.iter().take(8).sum();
    let idle = vals.get(3).copied().unwrap_or(0) + vals.get(4).copied().unwrap_or(0);
    Ok(BoxCpu { busy: total.saturating_sub(idle), total })
}

impl BoxCpu {
    /// Whole-box busy percentage between two samples (100 = every core busy).
    pub(crate) fn percent_since(&self, before: &BoxCpu) -> Option<f64> {
        let total = self.total.checked_sub(before.total)?;
        let busy = self.busy.checked_sub(before.busy)?;
        (total > 0).then(|| busy as f64 * 100.0 / total as f64)
    }
}

/// One counter from `/proc/net/snmp` (`proto` like "Udp", `name` like "RcvbufErrors"): header line and value
/// line pairs.
pub(crate) fn parse_snmp(snmp: &str, proto: &str, name: &str) -> Option<u64> {
    let prefix = format!("{proto}:");
    let mut lines = snmp.lines().filter(|l| l.starts_with(&prefix));
    while let (Some(header), Some(values)) = (lines.next(), lines.next()) {
        let idx = header.split_whitespace().skip(1).position(|h| h == name);
        if let Some(idx) = idx {
            return values.split_whitespace().nth(idx + 1)?.parse().ok();
        }
    }
    None
}

/// One counter from `/proc/net/snmp6` (`Udp6RcvbufErrors   12`).
pub(crate) fn parse_snmp6(snmp6: &str, name: &str) -> Option<u64> {
    snmp6.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == name).then(|| it.next()?.parse().ok())?
    })
}

/// Current CPU ticks of a live process.
/// utime and stime of a live process, in clock ticks.
pub(crate) fn pid_user_sys_ticks(pid: u32) -> Result<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("read /proc/{pid}/stat"))?;
    parse_pid_stat_user_sys_ticks(&s)
}

/// Anonymous resident memory (RssAnon) of a live process, in kB.
pub(crate) fn pid_rss_anon_kb(pid: u32) -> Option<u64> {
    pid_status_kb(pid, "RssAnon")
}

/// Peak RSS (VmHWM) of a live process, in kB.
pub(crate) fn pid_peak_rss_kb(pid: u32) -> Option<u64> {
    pid_status_kb(pid, "VmHWM")
}

/// Current RSS (VmRSS) of a live process, in kB.
pub(crate) fn pid_rss_kb(pid: u32) -> Option<u64> {
    pid_status_kb(pid, "VmRSS")
}

fn pid_status_kb(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_kb(&s, key)
}

/// Reset the peak RSS counter of a process (`echo 5 > /proc/PID/clear_refs`), so that VmHWM covers one window.
pub(crate) fn reset_peak_rss(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

pub(crate) fn box_cpu() -> Result<BoxCpu> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").context("read /proc/stat")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_clock_from_cpuinfo() {
        let vm = "processor\t: 0\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2445.412\n";
        assert_eq!(parse_cpuinfo_mhz(vm), Some(2445.412));
        let named = "model name\t: Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz\ncpu MHz\t\t: 1200.000\n";
        assert_eq!(parse_cpuinfo_mhz(named), Some(2400.0), "the nominal clock of the name, not the current one");
        assert_eq!(parse_cpuinfo_mhz("processor\t: 0\n"), None);
    }

    const STAT: &str = "6353 (cat) R 6346 6346 3647 0 -1 4194304 98 0 0 0 17 4 0 0 20 0 1 0 31032 3133440 389 \
                        18446744073709551615 94673442852864 94673442872745 140730528364928 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";

    #[test]
    fn clock_ticks() {
        // USER_HZ: 100 on the common architectures, never 0.
        assert!(clk_tck().unwrap() >= 1.0);
    }

    #[test]
    fn pid_stat_utime_stime() {
        assert_eq!(parse_pid_stat_user_sys_ticks(STAT).unwrap(), (17, 4));
    }

    #[test]
    fn pid_stat_comm_with_spaces_and_parens() {
        let s = "42 (evil) name)) S 1 1 1 0 -1 0 0 0 0 0 100 50 0 0 20 0 3 0 1 1 1";
        assert_eq!(parse_pid_stat_user_sys_ticks(s).map(|(u, k)| u + k).unwrap(), 150);
        assert!(parse_pid_stat_user_sys_ticks("42 (x) S 1").is_err());
    }

    #[test]
    fn status_fields() {
        let s = "Name:\tturbotun\nUid:\t1000\t0\t0\t0\nVmPeak:\t   10000 kB\nVmHWM:\t    2076 kB\nVmRSS:\t 2000 kB\n";
        assert_eq!(parse_status_kb(s, "VmHWM"), Some(2076));
        assert_eq!(parse_status_kb(s, "VmRSS"), Some(2000));
        assert_eq!(parse_status_kb(s, "VmSwap"), None);
        assert_eq!(parse_status_euid(s), Some(0));
    }

    #[test]
    fn proc_stat_box_cpu() {
        let a = parse_proc_stat("cpu  3193 14566 2572 40840 370 0 132 286 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n").unwrap();
        assert_eq!(a.total, 3193 + 14566 + 2572 + 40840 + 370 + 132 + 286);
        assert_eq!(a.busy, a.total - 40840 - 370);
        let b = BoxCpu { busy: a.busy + 150, total: a.total + 200 };
        assert_eq!(b.percent_since(&a), Some(75.0));
        assert_eq!(a.percent_since(&a), None);
    }

    #[test]
    fn snmp_counters() {
        let snmp = include_str!("../tests/fixtures/proc_net_snmp.txt");
        assert_eq!(parse_snmp(snmp, "Udp", "RcvbufErrors"), Some(123295));
        assert_eq!(parse_snmp(snmp, "Udp", "InDatagrams"), Some(104675));
        assert_eq!(parse_snmp(snmp, "Tcp", "RetransSegs"), Some(0));
        assert_eq!(parse_snmp(snmp, "UdpLite", "RcvbufErrors"), Some(0));
        assert_eq!(parse_snmp(snmp, "Udp", "NoSuchCounter"), None);
        let snmp6 = "Udp6InDatagrams                 \t5\nUdp6RcvbufErrors                \t17\n";
        assert_eq!(parse_snmp6(snmp6, "Udp6RcvbufErrors"), Some(17));
        assert_eq!(parse_snmp6(snmp6, "Udp6SndbufErrors"), None);
    }
}
