//! `ftrec run --strategy ecrec` end to end: real processes of this binary, a SIGKILLed server
//! rebuilt while training goes on (ecrec.txt §3.4), the job-file keys, and one clear error
//! line for every bad ECRec setting.

use std::path::Path;

mod common;
use common::hang::BoundedOutput;
use common::{ftrec, one_error_line, read_json, succeed};

/// A three-server synchronous tiny run in `dir`.
fn run_args(dir: &Path) -> Vec<String> {
    [
        "run",
        "--preset",
        "tiny",
        "--servers",
        "3",
        "--workers",
        "2",
        "--sync",
        "--steps",
        "8",
        "--batch",
        "32",
        "--eval-samples",
        "0",
        "--seed",
        "5",
        "--work-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([dir.display().to_string()])
    .collect()
}

/// `ftrec bench ecrec` on three tiny servers (batch 32, no evaluation) with `extra`, which
/// must succeed: its output and its JSON.
fn bench_ecrec(extra: &[&str]) -> (std::process::Output, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = succeed(
        ftrec()
            .args([
                "bench",
                "ecrec",
                "--preset",
                "tiny",
                "--servers",
                "3",
                "--batch",
                "32",
                "--eval-samples",
                "0",
            ])
            .args(extra)
            .arg("--json")
            .arg(&json),
    );
    (out, read_json(&json))
}

#[test]
fn an_ecrec_run_with_a_kill_rebuilds_the_server_and_matches_the_clean_run() {
    let dir = tempfile::tempdir().unwrap();
    let clean = dir.path().join("clean.json");
    succeed(
        ftrec()
            .args(run_args(&dir.path().join("clean")))
            .args(["--strategy", "none", "--json"])
            .arg(&clean),
    );
    // The ECRec settings from a job file, the rest from flags.
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        "strategy = \"ecrec\"\nec_k = 2\nec_r = 1\nec_code = \"gf256\"\nrecovery_locks = 3\n",
    )
    .unwrap();
    let json = dir.path().join("ecrec.json");
    let out = succeed(
        ftrec()
            .args(run_args(&dir.path().join("killed")))
            .arg("--config")
            .arg(&job)
            .args(["--kill", "server=1@step=3", "--json"])
            .arg(&json),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ecrec gf256 k=2 r=1"), "{stdout}");
    assert!(stdout.contains("rebuild of server 1"), "{stdout}");
    let (clean, killed) = (read_json(&clean), read_json(&json));
    assert_eq!(killed["strategy"], "ecrec");
    assert_eq!(killed["failures"].as_array().unwrap().len(), 1);
    assert_eq!(killed["failures"][0]["steps_redone"], 0);
    assert!(killed["failures"][0]["recovered_s"].as_f64().is_some());
    assert_eq!(killed["ec"]["lock_ranges"], 3);
    assert_eq!(killed["ec"]["rebuilds"][0]["ranges"], 3);
    assert!(killed["ec"]["rebuilds"][0]["finished_s"].as_f64().is_some());
    assert_eq!(killed["model_digest"], clean["model_digest"]);
}

#[test]
fn bad_ecrec_settings_give_one_clear_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let ecrec = |extra: &[&str]| -> Vec<String> {
        ["--strategy", "ecrec"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    for (extra, needles) in [
        (ecrec(&["--ec-k", "3"]), vec!["k + r = 4", "there are 3"]),
        (ecrec(&["--ec-code", "xor"]), vec!["xor", "sum or gf256"]),
        (
            ecrec(&["--ec-code", "sum", "--ec-r", "2", "--ec-k", "1"]),
            vec!["r = 1"],
        ),
        (ecrec(&["--recovery-locks", "0"]), vec!["lock range"]),
        (
            ecrec(&["--rebuild-share", "1.5"]),
            vec!["--rebuild-share 1.5", "out of range"],
        ),
        (
            vec![
                "--strategy".into(),
                "full".into(),
                "--ec-k".into(),
                "2".into(),
            ],
            vec!["--ec-k", "ecrec only"],
        ),
        (
            vec!["--no-2pc".into(), "--no-dense-replication".into()],
            vec!["--no-dense-replication", "--no-2pc", "ecrec only"],
        ),
        (
            vec!["--kill".into(), "server=0@phase=commit".into()],
            vec!["phase commit", "ecrec only"],
        ),
    ] {
        let line = one_error_line(
            &ftrec()
                .args(run_args(dir.path()))
                .args(&extra)
                .bounded_output()
                .unwrap(),
        );
        for n in needles {
            assert!(line.contains(n), "{extra:?}: no {n:?} in {line}");
        }
    }
}

#[test]
fn bench_ecrec_runs_one_recovery_per_rebuild_share() {
    // `--repeat 0`: the recovery runs only; one ECRec recovery per share of
    // `--rebuild-shares`, each rebuild finished and its share reported.
    let (out, b) = bench_ecrec(&[
        "--workers",
        "1",
        "--steps",
        "12",
        "--repeat",
        "0",
        "--rebuild-shares",
        "1,0.5",
        "--no-full",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("rebuild share 0.5"), "{stdout}");
    assert_eq!(b["none"].as_array().unwrap().len(), 0);
    // No variant without a run to compare: none listed, none printed.
    assert_eq!(b["variants"].as_array().unwrap().len(), 0);
    assert!(!stdout.contains("ecrec_k2:"), "{stdout}");
    let rec = b["recoveries"].as_array().unwrap();
    assert_eq!(rec.len(), 2, "{rec:?}");
    for (r, share) in rec.iter().zip([1.0, 0.5]) {
        assert_eq!(r["strategy"], "ecrec");
        assert_eq!(r["rebuild_share"].as_f64(), Some(share));
        let rebuild = &r["report"]["ec"]["rebuilds"][0];
        assert!(rebuild["finished_s"].as_f64().is_some(), "{rebuild}");
        assert_eq!(r["report"]["ec"]["audit"]["parity_mismatches"], 0);
    }
}

#[test]
fn bad_bench_ecrec_shares_give_one_clear_error_line() {
    for (extra, needle) in [
        (vec!["--rebuild-shares", "1,1.5"], "--rebuild-shares 1.5"),
        (
            vec!["--rebuild-shares", "0.5", "--rebuild-share", "0.5"],
            "not both",
        ),
        (vec!["--workers", "2,x,8"], "--workers 2,x,8: \"x\""),
        (vec!["--workers", "2,0"], "is not a worker count"),
        (vec!["--workers", "2,4,2"], "2 is listed twice"),
    ] {
        let line = one_error_line(
            &ftrec()
                .args(["bench", "ecrec", "--preset", "tiny", "--servers", "3"])
                .args(&extra)
                .bounded_output()
                .unwrap(),
        );
        assert!(line.contains(needle), "{extra:?}: no {needle:?} in {line}");
    }
}

#[test]
fn bench_ecrec_starts_every_run_on_the_cpus_it_is_given() {
    // The CPUs this test may use (the bench's processes inherit them): as a set, every one.
    let allowed = ftrec_cluster::cpus::allowed_cpus().unwrap().to_string();
    let (out, b) = bench_ecrec(&[
        "--workers",
        "1",
        "--steps",
        "2",
        "--repeat",
        "1",
        "--no-recovery",
        "--server-cpus",
        &allowed,
        "--worker-cpus",
        &allowed,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "servers on CPUs {allowed}, workers on CPUs {allowed}"
        )),
        "{stdout}"
    );
    assert_eq!(b["server_cpus"], allowed);
    assert_eq!(b["worker_cpus"], allowed);
    let mut runs: Vec<&serde_json::Value> = b["none"].as_array().unwrap().iter().collect();
    for v in b["variants"].as_array().unwrap() {
        runs.extend(v["runs"].as_array().unwrap());
    }
    assert_eq!(runs.len(), 4);
    for r in runs {
        assert_eq!(r["report"]["config"]["server_cpus"], allowed, "{r}");
        assert_eq!(r["report"]["config"]["worker_cpus"], allowed, "{r}");
    }
}

#[test]
fn bench_ecrec_rotates_its_runs_between_repeats() {
    // Two repeats of `none` and the three k = 2 variants (k = 4 needs 5 servers): the second
    // repeat starts one run later in the turn, and every figure still pairs a variant's run
    // with the `none` run of its own repeat.
    let (out, b) = bench_ecrec(&[
        "--workers",
        "1",
        "--steps",
        "4",
        "--repeat",
        "2",
        "--no-recovery",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let order: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("bench ecrec ["))
        .filter_map(|l| l.split_once("] ")?.1.split_once(':'))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        order,
        [
            "none_0",
            "ecrec_k2_0",
            "ecrec_k2_norep_0",
            "ecrec_k2_norep_no2pc_0",
            "ecrec_k2_1",
            "ecrec_k2_norep_1",
            "ecrec_k2_norep_no2pc_1",
            "none_1",
        ],
        "{stderr}"
    );
    let repeats = |runs: &serde_json::Value| -> Vec<u64> {
        runs.as_array()
            .unwrap()
            .iter()
            .map(|r| r["repeat"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(repeats(&b["none"]), [0, 1]);
    let variants = b["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 3, "{variants:?}");
    for v in variants {
        assert_eq!(repeats(&v["runs"]), [0, 1], "{v}");
        assert_eq!(v["extra_cpu_ms_per_txn"]["runs"], 2, "{v}");
    }
}

#[test]
fn bench_ecrec_sweeps_worker_counts() {
    // `--workers 1,2`: `none` and ECRec all on at each count, one recovery run at the largest
    // count, and the memory of every server at that count.
    let (out, b) = bench_ecrec(&[
        "--workers",
        "1,2",
        "--steps",
        "6",
        "--repeat",
        "1",
        "--recovery-steps",
        "16",
        "--rebuild-shares",
        "1",
        "--no-full",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("workers | none samples/s"), "{stdout}");
    assert!(stdout.contains("memory at 2 workers"), "{stdout}");
    // The fields of a single count are still there.
    assert_eq!(b["none"].as_array().unwrap().len(), 2);
    let variants = b["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 2, "{variants:?}");
    assert_eq!(variants[1]["name"], "ecrec_k2_w2");
    assert_eq!(
        variants[1]["extra_cpu_ms_per_txn"]["runs"], 1,
        "{}",
        variants[1]
    );
    let sweep = b["sweep"].as_array().unwrap();
    assert_eq!(sweep.len(), 2);
    for (p, w) in sweep.iter().zip([1, 2]) {
        assert_eq!(p["workers"], w);
        for key in [
            "none_samples_per_s",
            "ecrec_samples_per_s",
            "overhead",
            "none_train_cpu_s",
            "ecrec_train_cpu_s",
            "lock_wait_share",
        ] {
            assert!(p[key].as_f64().is_some(), "{key}: {p}");
        }
        // One repeat: no interval.
        assert!(p["overhead_ci95"].is_null(), "{p}");
        // The CPU an update costs over `none`'s: the pair's difference over its commits.
        let per_txn = p["extra_cpu_ms_per_txn"].as_f64().unwrap();
        let txns = p["txns"].as_f64().unwrap();
        assert!(txns > 0.0, "{p}");
        let want = (p["ecrec_train_cpu_s"].as_f64().unwrap()
            - p["none_train_cpu_s"].as_f64().unwrap())
            * 1e3
            / txns;
        assert!((per_txn - want).abs() <= 1e-9 * want.abs().max(1.0), "{p}");
        assert!(p["extra_cpu_ms_per_txn_ci95"].is_null(), "{p}");
        assert_eq!(p["extra_rss_bytes"].as_array().unwrap().len(), 3);
    }
    // The recovery run was made at the largest count only.
    assert!(sweep[0]["resume_s"].is_null());
    assert!(sweep[1]["resume_s"].as_f64().is_some(), "{}", sweep[1]);
    assert!(sweep[1].get("recovery_throughput_share").is_some());
    assert_eq!(b["recoveries"][0]["report"]["config"]["workers"], 2);
    let m = &b["memory"];
    assert_eq!(m["workers"], 2);
    assert_eq!(m["extra_rss_bytes"].as_array().unwrap().len(), 3);
    for (i, server) in m["servers"].as_array().unwrap().iter().enumerate() {
        assert!(m["bound_bytes"][i].as_u64().unwrap() > 0, "{m}");
        assert!(m["extra_rss_bytes"][i].as_i64().is_some(), "{m}");
        let parts = &server["breakdown"]["parts_max"];
        assert!(parts["rows_bytes"].as_u64().unwrap() > 0, "{server}");
        assert!(parts["parity_bytes"].as_u64().unwrap() > 0, "{server}");
        assert!(server["breakdown"]["peak_anon_bytes"].as_u64().unwrap() > 0);
        assert_eq!(server["none_breakdown"]["parts_max"]["parity_bytes"], 0);
    }
}
