//! Process measurements.

/// Peak resident set size of this process in bytes (`VmHWM`), if the platform reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    status_kib("VmHWM:").map(|k| k * 1024)
}

/// Current resident set size of this process in bytes (`VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    status_kib("VmRSS:").map(|k| k * 1024)
}

fn status_kib(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn peak_is_at_least_current() {
        if let (Some(peak), Some(now)) = (super::peak_rss_bytes(), super::rss_bytes()) {
            assert!(peak >= now, "peak {peak} < current {now}");
            assert!(now > 0);
        }
    }
}
