//! `ftrec run --strategy deck` and `ftrec ckpt` on the lineage it leaves: real processes of
//! this binary (servers, workers, the merger), a real SIGKILL, and every `ckpt` subcommand on
//! a real store; and `ftrec bench incremental`'s report on a tiny model.

use std::path::Path;
use std::process::Output;

mod common;
use common::hang::BoundedOutput;
use common::{ftrec, one_error_line, read_json, succeed};

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let json = dir.join("report.json");
    succeed(
        ftrec()
            .args([
                "run",
                "--preset",
                "tiny",
                "--servers",
                "2",
                "--workers",
                "2",
            ])
            .args(["--sync", "--steps", "16", "--batch", "32", "--seed", "9"])
            .args(["--eval-samples", "0", "--work-dir"])
            .arg(dir)
            .args(extra)
            .arg("--json")
            .arg(&json),
    );
    read_json(&json)
}

#[test]
fn a_deck_run_with_a_kill_matches_the_clean_run_and_ckpt_works_on_its_lineage() {
    let dir = tempfile::tempdir().unwrap();
    let clean = run(&dir.path().join("clean"), &[]);
    let store = dir.path().join("store");
    let killed = run(
        &dir.path().join("killed"),
        &[
            "--strategy",
            "deck",
            "--delta-every-steps",
            "2",
            "--merge-stride",
            "2",
            "--store",
            store.to_str().unwrap(),
            "--kill",
            "server=1@step=9",
        ],
    );
    assert_eq!(killed["strategy"], "deck");
    assert_eq!(killed["failures"].as_array().unwrap().len(), 1);
    assert_eq!(killed["model_digest"], clean["model_digest"]);
    assert!(killed["checkpoints"].as_u64().unwrap() >= 3);

    // ls: the lineage tree with the head at the last step.
    let ls = stdout(&succeed(ftrec().args(["ckpt", "ls"]).arg(&store)));
    assert!(ls.contains("full"), "{ls}");
    assert!(ls.contains("delta"), "{ls}");
    // The head is the final save (step 16), possibly reached through a merged checkpoint
    // that stands for it.
    let head = ls.lines().find(|l| l.starts_with("head ")).unwrap();
    assert!(head.starts_with("head 00000000000000000016-delta"), "{ls}");
    // verify: every file of every checkpoint checks out.
    succeed(ftrec().args(["ckpt", "verify"]).arg(&store));
    // restore at a step: one full checkpoint in a new store, itself verifiable.
    let out = dir.path().join("restored");
    let r = stdout(&succeed(
        ftrec()
            .args(["ckpt", "restore"])
            .arg(&store)
            .args(["--at", "16", "--out"])
            .arg(&out),
    ));
    assert!(r.contains("restored step 16"), "{r}");
    let ls2 = stdout(&succeed(ftrec().args(["ckpt", "ls"]).arg(&out)));
    // One full checkpoint: a single line besides the head line.
    assert_eq!(
        ls2.lines().filter(|l| l.contains(" full ")).count(),
        1,
        "{ls2}"
    );
    assert!(!ls2.contains(" delta "), "{ls2}");
    // merge with gc, then gc: the head still restores.
    let m = stdout(&succeed(
        ftrec().args(["ckpt", "merge"]).arg(&store).args([
            "--stride",
            "2",
            "--full-every-deltas",
            "1",
            "--gc",
        ]),
    ));
    assert!(m.contains("gc: kept"), "{m}");
    succeed(ftrec().args(["ckpt", "gc"]).arg(&store));
    succeed(ftrec().args(["ckpt", "verify"]).arg(&store));
    let again = dir.path().join("restored-again");
    succeed(
        ftrec()
            .args(["ckpt", "restore"])
            .arg(&store)
            .arg("--out")
            .arg(&again),
    );
}

#[test]
fn deck_flags_with_another_strategy_or_bad_values_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (vec!["--delta-every-steps", "2"], "--delta-every-steps"),
        (vec!["--store", "/tmp/s"], "--store"),
        (
            vec!["--strategy", "deck", "--merge-stride", "1"],
            "--merge-stride",
        ),
        (
            vec!["--strategy", "deck", "--kill", "merger=1@phase=merge"],
            "merger",
        ),
    ] {
        let out = ftrec()
            .args(["run", "--preset", "tiny", "--steps", "4", "--work-dir"])
            .arg(dir.path())
            .args(&args)
            .bounded_output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn deck_with_servers_started_without_a_checkpoint_service_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let port = dir.path().join("s0.port");
    let mut server = ftrec()
        .args(["server", "--id", "0", "--servers", "1", "--preset", "tiny"])
        .args(["--until", "stdin", "--port-file"])
        .arg(&port)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let dog = common::hang::watchdog("the server without a checkpoint service");
    dog.watch(&server);
    while !port.exists() {
        assert!(
            server.try_wait().unwrap().is_none(),
            "the server exited early"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let addr = std::fs::read_to_string(&port).unwrap().trim().to_string();
    let out = ftrec()
        .args([
            "coordinator",
            "--preset",
            "tiny",
            "--servers",
            "1",
            "--workers",
            "1",
        ])
        .args(["--steps", "4", "--strategy", "deck", "--server-addr", &addr])
        .args(["--control-listen", "127.0.0.1:0", "--work-dir"])
        .arg(dir.path())
        .bounded_output()
        .unwrap();
    drop(server.stdin.take());
    assert!(server.wait().unwrap().success());
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("server 0") && err.contains("--ckpt-staging"),
        "{err}"
    );
}

/// `ftrec run --strategy cpr` (cpr.txt §2.3, §4): asynchronous training, a real SIGKILL, only
/// the lost server restored, PLS in the report; its flags in `--help`; one clear error line for
/// every bad combination.
mod cpr {
    use super::*;

    #[test]
    fn an_async_cpr_run_with_a_kill_restores_only_the_lost_server() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let json = dir.path().join("report.json");
        succeed(
            ftrec()
                .args([
                    "run",
                    "--preset",
                    "tiny",
                    "--servers",
                    "2",
                    "--workers",
                    "2",
                ])
                .args(["--steps", "24", "--batch", "32", "--seed", "9"])
                .args(["--eval-samples", "0", "--strategy", "cpr"])
                .args(["--cpr-priority", "mfu", "--ckpt-every-steps", "16"])
                // Save points every 4 steps: the kill falls 3 steps after one.
                .args(["--cpr-saves-per-full", "4"])
                .args(["--kill", "server=1@step=11", "--store"])
                .arg(&store)
                .arg("--work-dir")
                .arg(dir.path().join("work"))
                .arg("--json")
                .arg(&json),
        );
        let r = read_json(&json);
        assert_eq!(r["strategy"], "cpr");
        assert_eq!(r["steps"], 24);
        assert_eq!(r["samples_redone"], 0);
        let f = r["failures"].as_array().unwrap();
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0]["servers_restored"], serde_json::json!([1]));
        assert_eq!(f[0]["steps_redone"], 0);
        let c = &r["cpr"];
        assert_eq!(c["recovery"], "partial");
        assert_eq!(c["interval"]["full_every_steps"], 16);
        assert_eq!(c["interval"]["saves_per_full"], 4);
        assert!(c["pls"]["total"].as_f64().unwrap() > 0.0, "{c}");
        assert_eq!(c["pls"]["per_failure"][0]["server"], 1);
        // The store's lineage lists and verifies (which saves committed depends on how fast
        // uploads ran: a save point reached while one uploads is skipped).
        let ls = stdout(&succeed(ftrec().args(["ckpt", "ls"]).arg(&store)));
        assert!(ls.contains("full"), "{ls}");
        succeed(ftrec().args(["ckpt", "verify"]).arg(&store));
    }

    #[test]
    fn help_documents_the_strategy_and_its_flags() {
        let help = stdout(&succeed(ftrec().args(["run", "--help"])));
        for flag in [
            "cpr",
            "--cpr-priority",
            "--target-pls",
            "--mtbf-s",
            "--ckpt-every-steps",
            "--cpr-r",
            "--cpr-saves-per-full",
            "--cpr-ssu-period",
            "--cpr-tables",
        ] {
            assert!(help.contains(flag), "{flag} missing from ftrec run --help");
        }
        let bench = stdout(&succeed(ftrec().args(["bench", "cpr", "--help"])));
        for flag in [
            "--failures",
            "--fail-servers",
            "--kill-seed",
            "--seeds",
            "--rounds",
            "cpr-mfu",
            "part",
        ] {
            assert!(bench.contains(flag), "{flag} missing from {bench}");
        }
        let server = stdout(&succeed(ftrec().args(["server", "--help"])));
        assert!(server.contains("--cpr-priority"), "{server}");
    }

    #[test]
    fn bad_cpr_combinations_give_one_clear_error_line() {
        let dir = tempfile::tempdir().unwrap();
        for (args, needle) in [
            (
                vec!["--strategy", "cpr", "--target-pls", "0.1"],
                "--target-pls needs --mtbf-s",
            ),
            (
                vec![
                    "--strategy",
                    "cpr",
                    "--target-pls",
                    "0.1",
                    "--mtbf-s",
                    "60",
                    "--ckpt-every-steps",
                    "5",
                ],
                "give one",
            ),
            (
                vec!["--strategy", "cpr", "--cpr-priority", "lru"],
                "--cpr-priority \"lru\"",
            ),
            (
                vec!["--strategy", "cpr", "--cpr-r", "0.25"],
                "add --cpr-priority",
            ),
            (
                vec![
                    "--strategy",
                    "cpr",
                    "--cpr-priority",
                    "mfu",
                    "--cpr-ssu-period",
                    "3",
                ],
                "ssu only",
            ),
            (
                vec!["--strategy", "full", "--cpr-priority", "mfu"],
                "--strategy cpr only",
            ),
            (
                vec!["--strategy", "cpr", "--merge-stride", "2"],
                "--strategy deck only",
            ),
        ] {
            let out = ftrec()
                .args(["run", "--preset", "tiny", "--steps", "4", "--work-dir"])
                .arg(dir.path())
                .args(&args)
                .bounded_output()
                .unwrap();
            assert_eq!(out.status.code(), Some(2), "{args:?}");
            let line = one_error_line(&out);
            assert!(line.contains(needle), "{args:?}: {line}");
        }
    }
}

/// `ftrec bench incremental` on a tiny model, with the paper's protocol shortened: every
/// timed recovery is exact (the bench checks each against the model's digest at that
/// checkpoint and fails otherwise), the JSON carries the headline keys, the sample is said to
/// be one, and every scheme's recovery of every checkpoint timed is in the per-checkpoint table.
#[test]
fn bench_incremental_reports_the_mean_over_the_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("incr.json");
    succeed(
        ftrec()
            .args(["bench", "incremental", "--preset", "tiny", "--batch", "256"])
            .args([
                "--checkpoints",
                "8",
                "--steps-per-ckpt",
                "2",
                "--sample",
                "4",
                "--passes",
                "2",
            ])
            .args(["--no-deck", "--dir"])
            .arg(dir.path().join("stores"))
            .arg("--json")
            .arg(&json),
    );
    let r = read_json(&json);
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert!(f("mean_recovery_speedup_vs_naive") > 0.0, "{r}");
    assert!(f("newest_recovery_speedup_vs_naive") > 0.0, "{r}");
    assert!(f("storage_vs_cnr") > 0.0, "{r}");
    let share = f("rows_updated_per_step_share");
    assert!(share > 0.0 && share <= 1.0, "{r}");
    assert_eq!(r["checkpoints_restored"], 4, "{r}");
    assert_eq!(r["checkpoints_written"], 8, "{r}");
    assert_eq!(r["sampled"], true, "{r}");
    assert!(r.get("naive_over_incrcp_rows").is_none(), "{r}");
    let points = r["points"].as_array().unwrap();
    let at: Vec<u64> = points
        .iter()
        .map(|p| p["checkpoint"].as_u64().unwrap())
        .collect();
    // Evenly spaced, the first and the newest included.
    assert_eq!(at, [1, 3, 6, 8], "{r}");
    for p in points {
        let names: Vec<&str> = p["schemes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s[0].as_str().unwrap())
            .collect();
        assert_eq!(names, ["incrcp", "incremental", "cnr"], "{p}");
    }
}
