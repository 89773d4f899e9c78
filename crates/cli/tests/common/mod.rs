//! What every end-to-end test of the `ftrec` binary needs: the binary, a run that must
//! succeed, and its JSON report.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

pub fn ftrec() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ftrec"))
}

/// Run `cmd` and require success (its stderr is the failure message).
pub fn succeed(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A JSON report written by `--json`.
pub fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Require a failed command whose stderr has exactly one `ftrec: error:` line; returns it.
pub fn one_error_line(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the command succeeded: {stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("ftrec: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    errors[0].to_string()
}

/// `samples` lines of the tiny preset's synthetic stream as Kaggle-layout TSV, written by
/// `ftrec data synth` into `dir`; returns the file.
pub fn synth_tsv(dir: &Path, samples: u32) -> std::path::PathBuf {
    succeed(
        ftrec()
            .args(["data", "synth", "--preset", "tiny", "--samples"])
            .arg(samples.to_string())
            .arg("--out")
            .arg(dir),
    );
    dir.join("train.tsv")
}
