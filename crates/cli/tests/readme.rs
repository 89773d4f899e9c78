//! The README is a contract: its fenced `sh` blocks run as written, in order, in one fresh
//! directory, with the freshly built `ftrec` first on `PATH` and only the inputs the README
//! itself creates. Each block runs under `bash -euo pipefail`, so a renamed flag, a missing
//! input or a failing command fails the block, and the test names the block's line.
//!
//! A block is marked by an HTML comment on the line before its fence (the README's last
//! section, "The README is tested", says so to its readers):
//! - `<!-- readme-test: long -->`: too long for the default suite; run with the others by
//!   `scripts/readme-long.sh` (this file's ignored test, on the release build);
//! - `<!-- readme-test: skip (why) -->`: never run here (the test suite itself, scripts of the
//!   checkout, several hosts).
//!
//! `cargo run --release --bin ftrec -- ARGS` lines run the binary under test. Every line of a
//! `ftrec run` that says a kill did not fire fails the test: a README kill fires.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// How a block is marked.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mark {
    Run,
    Long,
    Skip,
}

#[derive(Debug)]
struct Block {
    /// Line of the opening fence (from 1).
    line: usize,
    mark: Mark,
    text: String,
}

fn readme_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")
}

/// The fenced `sh` blocks of `readme`, each with its mark.
fn blocks(readme: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut mark = Mark::Run;
    let mut open: Option<Block> = None;
    for (i, line) in readme.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(b) = open.as_mut() {
            if trimmed == "```" {
                out.push(open.take().unwrap());
            } else {
                b.text.push_str(line);
                b.text.push('\n');
            }
            continue;
        }
        if let Some(m) = trimmed
            .strip_prefix("<!-- readme-test:")
            .and_then(|r| r.strip_suffix("-->"))
        {
            mark = match m.split_whitespace().next() {
                Some("long") => Mark::Long,
                Some("skip") => Mark::Skip,
                other => panic!("README line {}: unknown readme-test mark {other:?}", i + 1),
            };
            continue;
        }
        if trimmed.starts_with("```") {
            if trimmed == "```sh" {
                open = Some(Block {
                    line: i + 1,
                    mark,
                    text: String::new(),
                });
            }
            mark = Mark::Run;
        } else if !trimmed.is_empty() {
            // A mark belongs to the block right after it.
            mark = Mark::Run;
        }
    }
    assert!(open.is_none(), "the README ends inside a code block");
    out
}

/// What every block runs after: `cargo run --release --bin ftrec --` is the binary under test.
const PRELUDE: &str = r#"
cargo() {
    if [ "$#" -ge 5 ] && [ "$1 $2 $3 $4 $5" = "run --release --bin ftrec --" ]; then
        shift 5
        ftrec "$@"
    else
        echo "readme test: only 'cargo run --release --bin ftrec -- ...' runs here, not 'cargo $*'" >&2
        return 1
    fi
}
"#;

/// Run `blocks` whose mark is in `marks`, in order, in one fresh directory.
fn run_blocks(marks: &[Mark]) {
    let readme = std::fs::read_to_string(readme_path()).unwrap();
    let all = blocks(&readme);
    assert!(
        all.iter().filter(|b| b.mark == Mark::Run).count() >= 3,
        "the README's runnable examples were not found"
    );
    let dir = tempfile::tempdir().unwrap();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ftrec"));
    let path = format!(
        "{}:{}",
        exe.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let started = Instant::now();
    for b in all.iter().filter(|b| marks.contains(&b.mark)) {
        let t = Instant::now();
        let mut cmd = Command::new("bash");
        cmd.arg("-euo")
            .arg("pipefail")
            .arg("-c")
            .arg(format!("{PRELUDE}\n{}", b.text))
            .current_dir(dir.path())
            .env("PATH", &path);
        // Only what the README sets: no store, token or TLS settings of the caller's shell.
        for (k, _) in std::env::vars() {
            if k.starts_with("FTREC_") || k.starts_with("AWS_") {
                cmd.env_remove(k);
            }
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail = |s: &str| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        assert!(
            out.status.success(),
            "README block at line {} failed ({}):\n{}\n--- stdout (end) ---\n{}\n--- stderr (end) \
             ---\n{}",
            b.line,
            out.status,
            b.text,
            tail(&stdout),
            tail(&stderr)
        );
        let unfired: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("ftrec run: kill ") && l.contains("NOT FIRED"))
            .collect();
        assert!(
            unfired.is_empty(),
            "README block at line {}: a kill did not fire:\n{}\n{}",
            b.line,
            unfired.join("\n"),
            b.text
        );
        if b.text.contains("job@step=") {
            let trained = first_resume_trained(&stdout);
            assert!(
                trained.is_some_and(|n| n > 0),
                "README block at line {}: the job killed as a whole resumed with nothing left to \
                 train ({trained:?} samples):\n{}",
                b.line,
                tail(&stdout)
            );
        }
        eprintln!(
            "README block at line {} ({:?}): {:.1} s",
            b.line,
            b.mark,
            t.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "README blocks {marks:?}: {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
}

/// The samples the first resumed run of `stdout` trained: its summary's `trained N samples`,
/// the line before `  resumed from checkpoint ...`.
fn first_resume_trained(stdout: &str) -> Option<u64> {
    let lines: Vec<&str> = stdout.lines().collect();
    lines.windows(2).find_map(|w| {
        if !w[1].starts_with("  resumed from checkpoint") {
            return None;
        }
        let rest = &w[0][w[0].find("; trained ")? + "; trained ".len()..];
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The sample job file the README points at runs as it is.
#[test]
fn the_sample_job_file_runs() {
    let dir = tempfile::tempdir().unwrap();
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/job.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_ftrec"))
        .arg("run")
        .arg("--config")
        .arg(&job)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("job-report.json")).unwrap())
            .unwrap();
    assert_eq!(report["strategy"], "deck");
    assert_eq!(report["kills"][0]["fired"], true, "{}", report["kills"]);
    assert!(dir.path().join("job-store").is_dir());
}

#[test]
fn the_readme_s_examples_run_as_written() {
    run_blocks(&[Mark::Run]);
}

/// Every example but the skipped ones, the long ones included: `scripts/readme-long.sh`.
#[test]
#[ignore = "minutes on two cores: scripts/readme-long.sh runs it on the release build"]
fn the_readme_s_long_examples_run_as_written() {
    run_blocks(&[Mark::Run, Mark::Long]);
}

#[test]
fn blocks_and_their_marks_are_read_from_the_markdown() {
    let md =
        "text\n```sh\nftrec a\n```\n<!-- readme-test: long -->\n```sh\nftrec b \\\n  --x\n```\n\
              <!-- readme-test: skip (hosts) -->\n```sh\nftrec c\n```\n```python\nx\n```\n\
              <!-- readme-test: long -->\nprose\n```sh\nftrec d\n```\n";
    let b = blocks(md);
    let got: Vec<(Mark, &str)> = b.iter().map(|b| (b.mark, b.text.as_str())).collect();
    assert_eq!(
        got,
        vec![
            (Mark::Run, "ftrec a\n"),
            (Mark::Long, "ftrec b \\\n  --x\n"),
            (Mark::Skip, "ftrec c\n"),
            // A mark is for the block right after it, not one after prose.
            (Mark::Run, "ftrec d\n"),
        ]
    );
    assert_eq!(b[1].line, 6);
}

#[test]
fn the_first_resumed_run_s_trained_samples_are_read_from_its_summary() {
    let out = "job a: strategy deck: 30 steps (100 samples in the model); trained 0 samples in \
               0.00s of training (0 samples/s), 1.00s in all; 0 checkpoints\n\
               job b: strategy deck: 30 steps (100 samples in the model); trained 40 samples in \
               1.00s of training (40 samples/s), 2.00s in all; 0 checkpoints\n  resumed from \
               checkpoint c at step 20 of s\n";
    assert_eq!(first_resume_trained(out), Some(40));
    assert_eq!(first_resume_trained("trained 5 samples\n"), None);
}
