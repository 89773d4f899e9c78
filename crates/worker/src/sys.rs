//! Process measurements.

/// Peak resident set size of this process in bytes (`VmHWM`), if the platform reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    memory().map(|m| m.peak_rss)
}

/// Current resident set size of this process in bytes (`VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    memory().map(|m| m.rss)
}

/// Current and peak resident memory, read together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub rss: u64,
    pub peak_rss: u64,
}

/// Both figures from one read of `/proc/self/status` (Linux); `None` elsewhere.
pub fn memory() -> Option<Memory> {
    let [rss, hwm] = status(["VmRSS:", "VmHWM:"])?;
    let rss = rss * 1024;
    // The kernel folds the current RSS into the high-water mark lazily; take the max so the
    // peak is never reported below the present.
    let peak_rss = (hwm * 1024).max(rss);
    Some(Memory { rss, peak_rss })
}

/// The numbers of `keys` (e.g. `"VmRSS:"`, in the unit the kernel writes: kB for sizes) from
/// one read of `/proc/self/status` (Linux); `None` elsewhere or when one is missing.
pub fn status<const N: usize>(keys: [&str; N]) -> Option<[u64; N]> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let mut out = [0u64; N];
    for (o, key) in out.iter_mut().zip(keys) {
        let line = s.lines().find(|l| l.starts_with(key))?;
        *o = line[key.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
    }
    Some(out)
}

/// Logical cores this process may run on (1 when unknown).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Put the calling thread in the kernel's lowest scheduling class (`SCHED_IDLE` on Linux;
/// nothing elsewhere): it runs when a core would otherwise idle, and keeps a small share of
/// the CPU under load, so it is slowed, never starved. Returns whether it took effect.
pub fn lowest_priority() -> bool {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: a plain system call on the calling thread (pid 0) with a valid parameter.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Raise the calling thread's nice value to `nice` (Linux keeps one per thread; 1 to 19, higher
/// is lower priority; nothing elsewhere): under load it gets a smaller share of a core than the
/// threads at the default 0, and a thread at 0 that wakes takes the core from it. Any process
/// may lower its own priority, never raise it back. Returns whether it took effect.
pub fn nice_this_thread(nice: i32) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a plain system call; `who` 0 is the calling thread on Linux.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = nice;
        false
    }
}

/// CPU time the calling thread has used, in seconds (`None` where there is no per-thread
/// clock).
pub fn thread_cpu_s() -> Option<f64> {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec.
        let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0;
        ok.then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn peak_covers_a_large_allocation() {
        let Some(before) = super::memory() else {
            return;
        };
        // black_box: an allocation nothing reads may be optimized away entirely.
        let big = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = super::memory().unwrap();
        assert!(after.peak_rss >= after.rss);
        assert!(
            after.peak_rss >= before.rss + (60 << 20),
            "{before:?} -> {after:?}"
        );
        drop(big);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_lowest_priority_is_the_idle_class_of_the_calling_thread_only() {
        let policy = || unsafe { libc::sched_getscheduler(0) };
        let before = policy();
        let inside = std::thread::spawn(move || (super::lowest_priority(), policy()))
            .join()
            .unwrap();
        assert_eq!(inside, (true, libc::SCHED_IDLE));
        assert_eq!(policy(), before);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_nice_value_is_the_calling_threads_only() {
        // SAFETY: plain system calls on the calling thread.
        let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let before = nice();
        if before >= 19 {
            eprintln!("skipped: this test process already runs at the lowest priority");
            return;
        }
        let target = (before + 7).min(19);
        let inside = std::thread::spawn(move || (super::nice_this_thread(target), nice()))
            .join()
            .unwrap();
        assert_eq!(inside, (true, target));
        assert_eq!(nice(), before);
    }

    #[cfg(unix)]
    #[test]
    fn the_thread_clock_counts_this_threads_work_only() {
        let busy = std::thread::spawn(|| {
            let start = super::thread_cpu_s().unwrap();
            let mut x = 0u64;
            for i in 0..50_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            super::thread_cpu_s().unwrap() - start
        });
        let idle = std::thread::spawn(|| {
            let start = super::thread_cpu_s().unwrap();
            std::thread::park_timeout(std::time::Duration::from_millis(50));
            super::thread_cpu_s().unwrap() - start
        });
        let (busy, idle) = (busy.join().unwrap(), idle.join().unwrap());
        assert!(busy > idle, "busy {busy} s, parked {idle} s");
    }
}
