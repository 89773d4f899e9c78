//! The gemm backend fixes its thread count once per process, so comparing thread counts needs
//! one process per count: this test re-runs itself as a child with `MATMUL_NUM_THREADS` set to
//! 1, 2 and 4, for each backend (`FTREC_GEMM`; `avx512` only on a CPU with AVX-512F, `avx2`
//! only on one with AVX2 and FMA), and checks that a full model step produces the same bits
//! at every count of one backend, and the same bits with the two packed kernels. Also in a
//! child: a backend `FTREC_GEMM` names that is unknown, or that this CPU cannot run, is refused
//! before the first product.

use std::process::Command;

use ftrec_core::rng::{mix64, SplitMix};
use ftrec_core::{Optimizer, OptimizerKind};
use ftrec_model::{
    gemm_backend, gemm_threads, set_gemm_threads, Dlrm, DlrmConfig, GemmBackend, ModelError,
    Workspace,
};

const CHILD_ENV: &str = "FTREC_MODEL_GEMM_CHILD";
const TEST_NAME: &str = "model_step_is_bit_identical_for_every_gemm_thread_count";

fn fold(h: u64, v: &[f32]) -> u64 {
    v.iter().fold(h, |h, x| mix64(h ^ x.to_bits() as u64))
}

/// One model step on shapes big enough for the backend to split every large product.
fn step_fingerprint() -> u64 {
    let cfg = DlrmConfig {
        dense_in: 13,
        bottom: vec![512, 128, 16],
        top: vec![512, 128, 1],
        tables: 8,
        dim: 16,
    };
    let model = Dlrm::new(cfg.clone(), 77, &Optimizer::new(OptimizerKind::Sgd, 0.1)).unwrap();
    let b = 1024;
    let mut g = SplitMix::new(5);
    let mut fill = |n: usize| -> Vec<f32> { (0..n).map(|_| g.next_f32() - 0.3).collect() };
    let dense = fill(b * cfg.dense_in);
    let pooled = fill(b * cfg.tables * cfg.dim);
    let labels: Vec<f32> = fill(b).iter().map(|u| (*u > 0.0) as u8 as f32).collect();
    let mut ws = Workspace::new(1).unwrap();
    let loss = model
        .forward_backward(&mut ws, &dense, &pooled, &labels)
        .unwrap();
    let h = fold(mix64(loss.to_bits()), ws.grad_params());
    fold(h, ws.grad_pooled())
}

#[test]
fn model_step_is_bit_identical_for_every_gemm_thread_count() {
    if let Ok(want) = std::env::var(CHILD_ENV) {
        let (backend, threads) = want.split_once(' ').unwrap();
        assert_eq!(
            gemm_backend().name(),
            backend,
            "the child runs the wrong backend"
        );
        assert_eq!(
            gemm_threads().to_string(),
            threads,
            "the child runs with the wrong count"
        );
        println!("FINGERPRINT {:016x}", step_fingerprint());
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut backends = Vec::new();
    for b in GemmBackend::ALL {
        if b.runs_here() {
            backends.push(b.name());
        } else {
            println!(
                "{} backend skipped: this CPU lacks its instructions",
                b.name()
            );
        }
    }
    let mut packed = Vec::new();
    for backend in backends {
        let mut prints = Vec::new();
        for threads in ["1", "2", "4"] {
            let out = Command::new(&exe)
                .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, format!("{backend} {threads}"))
                .env("FTREC_GEMM", backend)
                .env("MATMUL_NUM_THREADS", threads)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "child with {threads} gemm threads failed: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let print = stdout
                .lines()
                .find_map(|l| l.split("FINGERPRINT ").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or_else(|| {
                    panic!("child with {threads} threads printed no fingerprint: {stdout}")
                })
                .to_string();
            prints.push((threads, print));
        }
        assert!(
            prints.iter().all(|(_, p)| *p == prints[0].1),
            "{backend}: fingerprints differ across gemm thread counts: {prints:?}"
        );
        if backend.starts_with("avx") {
            packed.push((backend, prints[0].1.clone()));
        }
    }
    // The two packed kernels compute the same chains of fused multiply-adds.
    assert!(
        packed.iter().all(|(_, p)| *p == packed[0].1),
        "the packed kernels give different steps: {packed:?}"
    );
}

const BAD_BACKEND_CHILD: &str = "FTREC_MODEL_BAD_BACKEND_CHILD";

/// In a child run ([`setting_in_a_child`]): the first product's setting under the parent's `FTREC_GEMM`,
/// printed (`REFUSED <error>` or `ACCEPTED`); returns whether this is that child.
fn child_prints_the_setting() -> bool {
    if std::env::var(BAD_BACKEND_CHILD).is_err() {
        return false;
    }
    match set_gemm_threads(1) {
        Err(e) => println!("REFUSED {e:?}: {e}"),
        Ok(_) => println!("ACCEPTED"),
    }
    true
}

/// Runs `test` again in a child process with `FTREC_GEMM=backend`; its stdout.
fn setting_in_a_child(test: &str, backend: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(BAD_BACKEND_CHILD, "1")
        .env("FTREC_GEMM", backend)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An unknown `FTREC_GEMM` is refused by name before any product runs.
#[test]
fn an_unknown_gemm_backend_is_refused_before_the_first_product() {
    if child_prints_the_setting() {
        return;
    }
    let stdout = setting_in_a_child(
        "an_unknown_gemm_backend_is_refused_before_the_first_product",
        "mkl",
    );
    assert!(
        stdout.contains(&format!(
            "REFUSED {:?}",
            ModelError::UnknownGemmBackend("mkl".into())
        )),
        "{stdout}"
    );
}

/// A packed backend this CPU cannot run is refused before any product runs, and the message
/// names the instructions its kernel needs.
#[test]
fn a_backend_this_cpu_cannot_run_is_refused_naming_what_it_needs() {
    if child_prints_the_setting() {
        return;
    }
    let missing: Vec<GemmBackend> = GemmBackend::ALL
        .into_iter()
        .filter(|b| !b.runs_here())
        .collect();
    if missing.is_empty() {
        println!("skipped: this CPU runs every gemm backend");
        return;
    }
    for backend in missing {
        let needs = match backend {
            GemmBackend::Avx512 => "AVX-512F",
            GemmBackend::Avx2 => "AVX2 and FMA",
            other => panic!("{other:?} runs everywhere, yet this CPU is said not to run it"),
        };
        let stdout = setting_in_a_child(
            "a_backend_this_cpu_cannot_run_is_refused_naming_what_it_needs",
            backend.name(),
        );
        let expected = format!("FTREC_GEMM={} needs a CPU with {needs},", backend.name());
        assert!(
            stdout.contains("REFUSED GemmBackendUnsupported") && stdout.contains(&expected),
            "FTREC_GEMM={}: {stdout}",
            backend.name()
        );
    }
}
