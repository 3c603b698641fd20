//! What /proc says about a process: CPU time and resident memory.

use anyhow::{Context, Result};

/// Linux reports utime/stime in USER_HZ ticks, which is 100 on every architecture it supports
/// for this ABI (`sysconf(_SC_CLK_TCK)`).
const TICKS_PER_SECOND: u64 = 100;

/// User plus system CPU time of every thread of `pid`, in microseconds (10 ms resolution).
pub fn cpu_us(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces; fields after it start past the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let field = |n: usize| -> Result<u64> {
        fields
            .get(n - 3)
            .context("short /proc/PID/stat")?
            .parse::<u64>()
            .context("bad number in /proc/PID/stat")
    };
    Ok((field(14)? + field(15)?) * 1_000_000 / TICKS_PER_SECOND)
}

/// Resident set size of `pid` in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/PID/status")
}

/// CPU time of a process over an interval.
pub struct CpuMeter {
    pid: u32,
    start: u64,
}

impl CpuMeter {
    pub fn start(pid: u32) -> Result<CpuMeter> {
        Ok(CpuMeter {
            pid,
            start: cpu_us(pid)?,
        })
    }

    pub fn elapsed_us(&self) -> Result<u64> {
        Ok(cpu_us(self.pid)?.saturating_sub(self.start))
    }
}

/// Load average over the last minute.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}
