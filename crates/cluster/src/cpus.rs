//! Where the processes a job starts may run: a set of CPUs for its servers and one for its
//! workers (`ftrec run --server-cpus LIST --worker-cpus LIST`).
//!
//! On one machine every process of a job shares the cores, so a strategy's extra server work
//! comes straight out of the workers' time. Giving servers and workers disjoint CPUs places
//! them as a cluster does (ECRec §5, "Cluster setup": servers and workers on separate
//! machines), and separates what a strategy costs in CPU from what it costs in latency. The
//! set is applied to the child between `fork` and `exec`, so the process and every thread it
//! starts keep it.

use std::fmt;
use std::process::Command;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ClusterError;

/// The largest CPU number a set may name (`CPU_SETSIZE` - 1 on Linux).
const MAX_CPU: usize = 1023;

/// A non-empty set of CPU numbers, written as a list such as `1`, `0-3` or `0,2-3`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CpuSet(Vec<usize>);

impl CpuSet {
    /// The CPUs, in increasing order.
    pub fn cpus(&self) -> &[usize] {
        &self.0
    }

    /// Refuse a CPU this process may not run on (it could not hand it to a child), naming
    /// `flag` and the CPUs it may use.
    pub fn check_allowed(&self, flag: &str) -> Result<(), ClusterError> {
        let allowed = allowed_cpus()?;
        match self.0.iter().find(|c| !allowed.0.contains(c)) {
            None => Ok(()),
            Some(c) => Err(ClusterError::Config(format!(
                "{flag} {self}: CPU {c} is not one this process may run on (it may use \
                 {allowed})"
            ))),
        }
    }

    /// Start the child of `cmd` on these CPUs only.
    pub fn pin(&self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        // Built here, in the parent: between fork and exec the child may only make
        // async-signal-safe calls, and `sched_setaffinity` is a plain system call.
        // SAFETY: a zeroed `cpu_set_t` is the empty set, and `CPU_SET` writes inside it for
        // CPUs below `CPU_SETSIZE` (checked when the set was parsed).
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &c in &self.0 {
            // SAFETY: as above.
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        // SAFETY: the closure only calls `sched_setaffinity` on the child itself (pid 0)
        // with a set it owns; it allocates nothing and takes no lock.
        unsafe {
            cmd.pre_exec(move || {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Result<CpuSet, ClusterError> {
    // SAFETY: a zeroed `cpu_set_t` is a valid empty set for the kernel to fill.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a `cpu_set_t` of the size passed; pid 0 is this thread.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(ClusterError::Config(format!(
            "cannot read the CPUs this process may run on: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `CPU_ISSET` reads inside the set for CPUs below `CPU_SETSIZE`.
    let cpus: Vec<usize> = (0..=MAX_CPU)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    if cpus.is_empty() {
        return Err(ClusterError::Config(
            "the kernel says this process may run on no CPU".into(),
        ));
    }
    Ok(CpuSet(cpus))
}

impl FromStr for CpuSet {
    type Err = String;

    fn from_str(s: &str) -> Result<CpuSet, String> {
        let bad = |why: &str| {
            Err(format!(
                "CPU list {s:?} {why}: write CPU numbers and ranges separated by commas, e.g. \
                 1 or 0-3 or 0,2-3"
            ))
        };
        let num = |t: &str| -> Result<usize, String> {
            match t.trim().parse::<usize>() {
                Ok(c) if c <= MAX_CPU => Ok(c),
                Ok(c) => Err(format!(
                    "CPU list {s:?} names CPU {c}: the largest is {MAX_CPU}"
                )),
                Err(_) => Err(format!(
                    "CPU list {s:?} has {t:?}, not a CPU number: write CPU numbers and ranges \
                     separated by commas, e.g. 1 or 0-3 or 0,2-3"
                )),
            }
        };
        if s.trim().is_empty() {
            return bad("is empty");
        }
        let mut cpus = Vec::new();
        for part in s.split(',') {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return bad(&format!("has the range {a}-{b}, which runs backwards"));
                    }
                    cpus.extend(a..=b);
                }
                None => cpus.push(num(part)?),
            }
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(CpuSet(cpus))
    }
}

impl TryFrom<String> for CpuSet {
    type Error = String;

    fn try_from(s: String) -> Result<CpuSet, String> {
        s.parse()
    }
}

impl From<CpuSet> for String {
    fn from(c: CpuSet) -> String {
        c.to_string()
    }
}

/// The shortest list: runs of consecutive CPUs as ranges (`0-3,6`).
impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        let mut sep = "";
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end += 1;
            }
            if start == end {
                write!(f, "{sep}{start}")?;
            } else {
                write!(f, "{sep}{start}-{end}")?;
            }
            sep = ",";
            i += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_to_sorted_sets_and_print_back_as_ranges() {
        for (text, cpus, shown) in [
            ("1", vec![1], "1"),
            ("0-3", vec![0, 1, 2, 3], "0-3"),
            ("3,0-1,1", vec![0, 1, 3], "0-1,3"),
            (" 2 , 4-5", vec![2, 4, 5], "2,4-5"),
            ("1023", vec![1023], "1023"),
        ] {
            let set: CpuSet = text.parse().unwrap();
            assert_eq!(set.cpus(), &cpus[..], "{text}");
            assert_eq!(set.to_string(), shown, "{text}");
            assert_eq!(shown.parse::<CpuSet>().unwrap(), set);
        }
    }

    #[test]
    fn bad_cpu_lists_are_refused_with_the_form_to_write() {
        for (text, says) in [
            ("", "is empty"),
            ("a", "not a CPU number"),
            ("1,", "not a CPU number"),
            ("3-1", "runs backwards"),
            ("0-", "not a CPU number"),
            ("-1", "not a CPU number"),
            ("1024", "the largest is 1023"),
        ] {
            let e = text.parse::<CpuSet>().unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
            assert!(!e.contains('\n'), "{text}: {e}");
        }
    }

    #[test]
    fn a_set_is_a_string_in_json() {
        let set: CpuSet = "0,2-3".parse().unwrap();
        assert_eq!(serde_json::to_string(&set).unwrap(), "\"0,2-3\"");
        assert_eq!(serde_json::from_str::<CpuSet>("\"0,2-3\"").unwrap(), set);
        assert!(serde_json::from_str::<CpuSet>("\"x\"").is_err());
    }

    #[test]
    fn the_allowed_cpus_pass_the_check_and_one_beyond_them_does_not() {
        let allowed = allowed_cpus().unwrap();
        allowed.check_allowed("--server-cpus").unwrap();
        let last = *allowed.cpus().last().unwrap();
        if last < MAX_CPU {
            let beyond = CpuSet(vec![last + 1]);
            let e = beyond
                .check_allowed("--server-cpus")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("--server-cpus") && e.contains(&(last + 1).to_string()),
                "{e}"
            );
            assert!(e.contains(&allowed.to_string()), "{e}");
        }
    }
}
