//! A process's CPU time (utime + stime from /proc/PID/stat, all threads,
//! including ones that exited) and memory (VmRSS, VmHWM from /proc/PID/status).

use std::sync::OnceLock;

/// Seconds of CPU the process has used so far: (user, system).
pub fn cpu_split(pid: u32) -> Option<(f64, f64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime as f64 / clock_ticks(), stime as f64 / clock_ticks()))
}

/// Seconds of CPU (user + system) the process has used so far.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    cpu_split(pid).map(|(u, s)| u + s)
}

/// VmRSS in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// VmHWM (peak RSS) in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// Resets VmHWM to the current RSS (`echo 5 > /proc/PID/clear_refs`), so the
/// next peak belongs to the next workload. Needs to own the process or root.
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| super::env::first_line("getconf", &["CLK_TCK"]).trim().parse().unwrap_or(100.0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_process() {
        let pid = std::process::id();
        assert!(super::cpu_secs(pid).is_some());
        assert!(super::rss_kib(pid).unwrap() > 0);
        assert!(super::peak_rss_kib(pid).unwrap() >= super::rss_kib(pid).unwrap() / 2);
    }
}
