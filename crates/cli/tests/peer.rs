//! The PyTorch peer benchmark (`scripts/peer/`): its shape check against the `ftrec` under
//! test. PyTorch is a 5 GB download kept out of the default set-up, so the comparison runs only
//! where `scripts/peer/compare.py --install` has made its venv (`FTREC_PEER_VENV`, default
//! `target/peer-venv`); elsewhere the test says so in one line and checks only that the scripts
//! parse.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn venv() -> PathBuf {
    std::env::var_os("FTREC_PEER_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/peer-venv"))
}

fn has_torch(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import torch, numpy"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_peer_has_ftrecs_shapes_and_runs_in_pairs() {
    // Parsed, not compiled: nothing is written into the checkout.
    let Ok(out) = Command::new("python3")
        .arg("-c")
        .arg("import ast, sys\nfor p in sys.argv[1:]:\n    ast.parse(open(p).read(), p)")
        .arg(root().join("scripts/peer/compare.py"))
        .arg(root().join("scripts/peer/dlrm.py"))
        .arg(root().join("scripts/peer/scaling.py"))
        .output()
    else {
        println!("skipped: no python3 on this machine");
        return;
    };
    assert!(
        out.status.success(),
        "the peer scripts do not parse: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let python = venv().join("bin/python");
    if !has_torch(&python) {
        println!(
            "skipped: no PyTorch venv at {} (scripts/peer/compare.py --install makes one)",
            venv().display()
        );
        return;
    }
    let json = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new("python3")
        .arg(root().join("scripts/peer/compare.py"))
        .args(["--preset", "small", "--threads", "1", "--pairs", "1"])
        .args([
            "--steps",
            "2",
            "--ftrec",
            env!("CARGO_BIN_EXE_ftrec"),
            "--json",
        ])
        .arg(json.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "compare.py failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("shapes match: 40 tensors"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(json.path()).unwrap()).unwrap();
    let pair = &report["pairs"][0];
    let (ours, theirs) = (
        pair["ftrec"].as_f64().unwrap(),
        pair["pytorch"].as_f64().unwrap(),
    );
    assert!(ours > 0.0 && theirs > 0.0, "{report}");
    // One pair has no interval: the JSON says so with a null, not a NaN that JSON cannot hold.
    assert!(report["summary"]["ratio"]["ci95"].is_null(), "{report}");
    assert!(
        (pair["ratio"].as_f64().unwrap() - ours / theirs).abs() < 1e-9,
        "{report}"
    );
}

#[test]
fn the_scaling_script_takes_its_ratios_within_each_round() {
    let json = tempfile::NamedTempFile::new().unwrap();
    let exe = env!("CARGO_BIN_EXE_ftrec");
    let Ok(out) = Command::new("python3")
        .arg(root().join("scripts/peer/scaling.py"))
        .args(["--ftrec", exe, "--before", exe, "--preset", "tiny"])
        .args(["--steps", "3", "--rounds", "2", "--json"])
        .arg(json.path())
        .output()
    else {
        println!("skipped: no python3 on this machine");
        return;
    };
    assert!(
        out.status.success(),
        "scaling.py failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(json.path()).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{report}");
    for (i, run) in runs.iter().enumerate() {
        let get = |k: &str| run[k].as_f64().unwrap();
        let gain = get("ftrec_2") / get("ftrec_1");
        let over = get("ftrec_2") / get("before_2");
        assert!(
            (report["ftrec_scaling"]["rounds"][i].as_f64().unwrap() - gain).abs() < 1e-9,
            "{report}"
        );
        assert!(
            (report["over_before_2"]["rounds"][i].as_f64().unwrap() - over).abs() < 1e-9,
            "{report}"
        );
    }
    assert!(
        report["ftrec_scaling"]["ci95"].as_f64().is_some(),
        "{report}"
    );

    // Bad input is one line naming the flag, before any run.
    let out = Command::new("python3")
        .arg(root().join("scripts/peer/scaling.py"))
        .args(["--ftrec", exe, "--rounds", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rounds must be at least 2"), "{err}");
}
