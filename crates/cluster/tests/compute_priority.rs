//! A worker's math runs on the math pool at the compute nice value while the calling thread,
//! which runs its RPCs, keeps its priority (`set_compute_threads`). Its own test binary: the
//! math pool is one per process.

use ftrec_cluster::worker::{set_compute_threads, Compute};
use ftrec_core::Preset;

#[cfg(target_os = "linux")]
fn nice_here() -> i32 {
    // SAFETY: a plain system call on the calling thread.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
}

#[cfg(target_os = "linux")]
fn thread_id() -> i64 {
    // SAFETY: a plain system call.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

#[cfg(target_os = "linux")]
#[test]
fn the_math_runs_on_pool_threads_at_the_compute_nice_value_and_the_caller_keeps_its_own() {
    let caller = nice_here();
    if caller >= 12 {
        eprintln!("skipped: this test process already runs at nice {caller}");
        return;
    }
    let nice = caller + 7;
    set_compute_threads(2, nice).unwrap();
    let me = thread_id();
    let (there, tid) = ftrec_model::on_pool(|| (nice_here(), thread_id()));
    assert_eq!(there, nice, "the math pool's thread");
    assert_ne!(tid, me, "the math ran on the calling thread");
    assert_eq!(nice_here(), caller, "the calling thread lost its priority");
    // A second setup of the same worker asks for the same threads: accepted, nothing changes.
    set_compute_threads(2, nice).unwrap();
    // The model computes on the pool as everywhere (what it computes is covered by the digest
    // tests of every cluster run, which run their workers this way).
    assert!(Compute::new(&Preset::tiny(), 1, 64, 2).is_ok());
}
