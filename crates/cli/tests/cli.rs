//! The `ftrec` binary end to end: training on Criteo TSV written by hand (not by our
//! generator), clear errors on bad input, and the synth -> TSV -> train path.

use std::path::Path;
use std::process::Command;

fn ftrec() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ftrec"))
}

/// Criteo Kaggle-layout lines from a throwaway LCG: empty and negative integers, empty
/// categoricals, hex of varying case, clicks that depend on one integer column so there is
/// something to learn.
fn handwritten_tsv(path: &Path, lines: usize) {
    let mut x: u64 = 0x1234_5678;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as u32
    };
    let mut text = String::new();
    for _ in 0..lines {
        let i1 = next() % 20;
        let label = u32::from(i1 + next() % 6 > 14);
        let mut fields = vec![label.to_string(), i1.to_string()];
        for j in 1..13 {
            let v = next();
            fields.push(match v % 7 {
                0 => String::new(),
                1 => format!("-{}", v % 3),
                _ => (v % (10 * j as u32 + 5)).to_string(),
            });
        }
        for c in 0..26 {
            let v = next();
            fields.push(match v % 11 {
                0 => String::new(),
                1 if c % 2 == 0 => format!("{:08X}", next() % 50),
                _ => format!("{:08x}", next() % (20 + c as u32 * 3)),
            });
        }
        text.push_str(&fields.join("\t"));
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

#[test]
fn trains_on_a_handwritten_kaggle_tsv_and_reports_auc() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("day.tsv");
    handwritten_tsv(&data, 3000);
    let json = dir.path().join("report.json");
    let out = ftrec()
        .args(["train", "--preset", "tiny", "--data"])
        .arg(&data)
        .args([
            "--rows-per-table",
            "500",
            "--steps",
            "60",
            "--batch",
            "64",
            "--holdout-every",
            "5",
        ])
        .args(["--deterministic", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let auc = report["auc"].as_f64().unwrap();
    assert!(auc > 0.5 && auc <= 1.0, "auc {auc}");
    assert!(report["teacher_auc"].is_null(), "real data has no teacher");
    assert_eq!(report["steps"], 60);
    assert_eq!(report["samples"], 60 * 64);
    assert!(report["eval_samples"].as_u64().unwrap() >= 500);
    assert_eq!(report["model_digest"].as_str().unwrap().len(), 32);
    for key in ["wall_s", "samples_per_s", "train_loss", "logloss", "config"] {
        assert!(!report[key].is_null(), "report lacks {key}");
    }
}

#[test]
fn a_malformed_line_is_an_error_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("bad.tsv");
    handwritten_tsv(&data, 200);
    let mut text = std::fs::read_to_string(&data).unwrap();
    text.push_str("1\t2\tthree\n");
    std::fs::write(&data, &text).unwrap();
    let out = ftrec()
        .args(["train", "--preset", "tiny", "--data"])
        .arg(&data)
        .args([
            "--rows-per-table",
            "100",
            "--steps",
            "3",
            "--batch",
            "100",
            "--epochs",
            "1",
        ])
        .args(["--holdout-every", "4"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.tsv"), "stderr: {err}");
    assert!(err.contains("201"), "stderr names no line number: {err}");

    // The explicit flag skips and counts it instead.
    let json = dir.path().join("r.json");
    let out = ftrec()
        .args(["train", "--preset", "tiny", "--data"])
        .arg(&data)
        .args([
            "--rows-per-table",
            "100",
            "--steps",
            "4",
            "--batch",
            "50",
            "--skip-malformed",
        ])
        .args(["--holdout-every", "4"])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["malformed_skipped"], 1);

    // A held-out set of one class cannot give an AUC: refused before training starts.
    let out = ftrec()
        .args(["train", "--preset", "tiny", "--data"])
        .arg(&data)
        .args([
            "--rows-per-table",
            "100",
            "--steps",
            "3",
            "--batch",
            "50",
            "--skip-malformed",
        ])
        .args(["--holdout-every", "1000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("held-out"), "stderr: {err}");
}

#[test]
fn synthetic_tsv_round_trips_through_train() {
    let dir = tempfile::tempdir().unwrap();
    let out = ftrec()
        .args([
            "data",
            "synth",
            "--preset",
            "tiny",
            "--samples",
            "2000",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ftrec()
        .args(["train", "--preset", "tiny", "--data"])
        .arg(dir.path().join("train.tsv"))
        .args(["--rows-per-table", "400", "--steps", "10", "--batch", "100"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("model_digest"));
}

#[test]
fn bad_flags_give_one_clear_line_and_a_nonzero_exit() {
    for (args, needle) in [
        (vec!["train", "--preset", "huge"], "huge"),
        (
            vec!["train", "--preset", "tiny", "--optimizer", "rmsprop"],
            "rmsprop",
        ),
        (
            vec!["train", "--preset", "tiny", "--data", "/nonexistent/x.tsv"],
            "/nonexistent/x.tsv",
        ),
        (vec!["train", "--preset", "tiny", "--steps", "0"], "steps"),
        (
            vec!["train", "--preset", "tiny", "--rows-per-table", "5"],
            "--data",
        ),
    ] {
        let out = ftrec().args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: stderr {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}
