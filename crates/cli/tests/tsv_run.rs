//! `ftrec train`, `ftrec run` and the job file on Criteo TSV data: `--epochs` without
//! `--steps` trains exactly that many passes, the data flags are the same for every command,
//! and bad combinations are one clear error line.

mod common;
use common::hang::BoundedOutput;

use std::path::{Path, PathBuf};

use common::{ftrec, one_error_line, read_json, succeed};

/// 1,200 lines of the tiny preset's synthetic stream, as Kaggle-layout TSV.
fn data(dir: &Path) -> PathBuf {
    common::synth_tsv(dir, 1200)
}

const DATA_FLAGS: [&str; 6] = [
    "--rows-per-table",
    "400",
    "--holdout-every",
    "6",
    "--batch",
    "64",
];

#[test]
fn epochs_without_steps_train_exactly_those_passes_in_train_and_in_run() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = data(&dir.path().join("d"));
    // 1,200 lines less every 6th: 1,000 training samples an epoch, 16 batches of 64 (the last
    // one of 40).
    let json = dir.path().join("train.json");
    succeed(
        ftrec()
            .args(["train", "--preset", "tiny", "--threads", "1", "--data"])
            .arg(&tsv)
            .args(DATA_FLAGS)
            .args(["--epochs", "1", "--json"])
            .arg(&json),
    );
    let train = read_json(&json);
    assert_eq!(train["steps"], 16);
    assert_eq!(train["samples"], 1000);
    assert_eq!(train["position"]["line"], 1200);
    assert_eq!(train["position"]["epoch"], 0);

    // The same data in a cluster run, one worker, synchronous: the same model. Two epochs
    // with --steps: whichever comes first.
    let json = dir.path().join("run.json");
    let out = succeed(
        ftrec()
            .args([
                "run",
                "--preset",
                "tiny",
                "--sync",
                "--workers",
                "1",
                "--data",
            ])
            .arg(&tsv)
            .args(DATA_FLAGS)
            .args(["--epochs", "1", "--eval-samples", "100", "--json"])
            .arg(&json),
    );
    let run = read_json(&json);
    assert_eq!(run["steps"], 16);
    assert_eq!(run["samples"], 1000);
    assert_eq!(run["data"]["ended"], true);
    assert_eq!(run["model_digest"], train["model_digest"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("the data ended"));

    // Three workers, two epochs: 32 batches in 11 steps, the last one of two batches.
    let json = dir.path().join("run3.json");
    succeed(
        ftrec()
            .args([
                "run",
                "--preset",
                "tiny",
                "--sync",
                "--workers",
                "3",
                "--data",
            ])
            .arg(&tsv)
            .args(DATA_FLAGS)
            .args(["--epochs", "2", "--eval-samples", "100", "--json"])
            .arg(&json),
    );
    let run3 = read_json(&json);
    assert_eq!(run3["steps"], 11);
    assert_eq!(run3["samples"], 2000);
    assert_eq!(run3["data"]["position"]["epoch"], 1);

    // --steps and --epochs: whichever first. 5 steps come first here...
    let json = dir.path().join("steps.json");
    succeed(
        ftrec()
            .args(["train", "--preset", "tiny", "--threads", "1", "--data"])
            .arg(&tsv)
            .args(DATA_FLAGS)
            .args(["--epochs", "1", "--steps", "5", "--json"])
            .arg(&json),
    );
    assert_eq!(read_json(&json)["steps"], 5);
    // ...and the data here.
    succeed(
        ftrec()
            .args(["train", "--preset", "tiny", "--threads", "1", "--data"])
            .arg(&tsv)
            .args(DATA_FLAGS)
            .args(["--epochs", "1", "--steps", "500", "--json"])
            .arg(&json),
    );
    assert_eq!(read_json(&json)["steps"], 16);
}

#[test]
fn the_job_file_takes_the_data_keys() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = data(&dir.path().join("d"));
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        format!(
            "preset = \"tiny\"\nsync = true\ndata = [{:?}]\nlayout = \"kaggle\"\n\
             rows_per_table = 400\nholdout_every = 6\nepochs = 1\nbatch = 64\neval_samples = 100\n",
            tsv.display().to_string()
        ),
    )
    .unwrap();
    let json = dir.path().join("run.json");
    succeed(
        ftrec()
            .arg("run")
            .arg("--config")
            .arg(&job)
            .arg("--json")
            .arg(&json),
    );
    let run = read_json(&json);
    assert_eq!(run["steps"], 16);
    assert_eq!(run["config"]["data"]["holdout_every"], 6);
    assert_eq!(run["config"]["preset"]["table_rows"][2], 400);
}

/// Runs `args` and returns its error line (it must fail, with exactly one error line on
/// stderr). `coordinator` gets a server address (never reached: the flags fail first).
fn error_of(args: &[&str]) -> String {
    let mut cmd = ftrec();
    cmd.args(args);
    if args[0] == "coordinator" {
        cmd.args(["--servers", "1", "--server-addr", "127.0.0.1:9"]);
    }
    one_error_line(&cmd.bounded_output().unwrap())
}

#[test]
fn bad_data_flags_give_one_clear_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = data(&dir.path().join("d"));
    let tsv = tsv.to_str().unwrap();
    for cmd in ["train", "run", "coordinator"] {
        let e = error_of(&[cmd, "--data", tsv, "--epochs", "0"]);
        assert!(e.contains("--epochs must be at least 1"), "{cmd}: {e}");
        let e = error_of(&[cmd, "--data", "/no/such/file.tsv"]);
        assert!(
            e.contains("/no/such/file.tsv") && e.contains("No such file"),
            "{cmd}: {e}"
        );
        for flag in [
            &["--epochs", "2"][..],
            &["--rows-per-table", "10"],
            &["--skip-malformed"],
            &["--holdout-every", "3"],
            &["--layout", "terabyte"],
        ] {
            let mut args = vec![cmd];
            args.extend_from_slice(flag);
            let e = error_of(&args);
            assert!(
                e.contains(flag[0]) && e.contains("--data only"),
                "{cmd}: {e}"
            );
        }
        let e = error_of(&[cmd, "--data", tsv, "--rows-per-table", "0"]);
        assert!(e.contains("--rows-per-table"), "{cmd}: {e}");
    }
    let e = error_of(&["run", "--data", tsv, "--holdout-every", "0", "--steps", "2"]);
    assert!(
        e.contains("--holdout-every 0") && e.contains("--eval-samples 0"),
        "{e}"
    );
    let e = error_of(&[
        "run",
        "--preset",
        "tiny",
        "--data",
        tsv,
        "--rows-per-table",
        "400",
        "--batch",
        "64",
        "--holdout-every",
        "6",
        "--epochs",
        "1",
        "--strategy",
        "full",
        "--kill",
        "server=0@step=16",
    ]);
    assert!(e.contains("server=0@step=16") && e.contains("1..16"), "{e}");
    // With more --steps than the data holds, the data's end is what the kill misses.
    let e = error_of(&[
        "run",
        "--preset",
        "tiny",
        "--data",
        tsv,
        "--rows-per-table",
        "400",
        "--batch",
        "64",
        "--holdout-every",
        "6",
        "--epochs",
        "1",
        "--steps",
        "100",
        "--strategy",
        "full",
        "--kill",
        "server=0@step=16",
    ]);
    assert!(
        e.contains("server=0@step=16") && e.contains("no step after"),
        "{e}"
    );
    let e = error_of(&["bench", "cluster", "--data", tsv]);
    assert!(e.contains("synthetic"), "{e}");
}
