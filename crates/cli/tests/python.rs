//! The Python package (`python/`, its extension module the `ftrec-py` crate), built and tested
//! by `scripts/python.sh --test` against the `ftrec` binary under test: stores of `full`,
//! `deck` and `incrcp` runs opened from Python, their listings, job records and verification
//! compared with `ftrec ckpt ls` and `ftrec ckpt verify`, and every tensor of `state_dict()`
//! compared bit for bit with `ftrec ckpt export`'s file (`python/tests/test_store.py`).
//!
//! It needs python3 (3.9 or newer) that can make a virtual environment, or root with apt-get
//! to install python3-venv; elsewhere it says so in one line. The venv (`target/py-venv`, or
//! `$FTREC_PY_VENV`) and the crate's dev build in `target/` are reused from one run to the
//! next.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv the script makes or reuses.
fn venv() -> PathBuf {
    std::env::var_os("FTREC_PY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/py-venv"))
}

/// Why the package cannot be built here, if it cannot.
fn missing_python() -> Option<String> {
    if venv().join("bin/python").exists() {
        return None;
    }
    let ok = |args: &[&str]| {
        Command::new("python3")
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !ok(&["--version"]) {
        return Some("no python3 on this machine".into());
    }
    if !ok(&["-c", "import sys; sys.exit(sys.version_info < (3, 9))"]) {
        return Some("python3 is older than 3.9".into());
    }
    let root_with_apt = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
        && Command::new("apt-get")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok(&["-c", "import venv, ensurepip"]) && !root_with_apt {
        return Some("python3 cannot make a virtual environment (install python3-venv)".into());
    }
    None
}

#[test]
fn the_python_package_reads_every_strategys_store_as_the_binary_does() {
    if let Some(why) = missing_python() {
        println!("skipped: {why}");
        return;
    }
    let out = Command::new("bash")
        .arg(root().join("scripts/python.sh"))
        .arg("--test")
        .env("FTREC_BIN", env!("CARGO_BIN_EXE_ftrec"))
        // The dev profile, which this test's own build inherits: the dependencies and crates
        // it compiled are reused where their features agree, and the rest is mostly
        // unoptimized, about a minute to build where a release build takes many.
        .env("FTREC_PY_PROFILE", "dev")
        .output()
        .expect("running scripts/python.sh");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "scripts/python.sh --test failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(" passed"), "{stdout}\n{stderr}");
    assert!(!stdout.contains(" failed"), "{stdout}\n{stderr}");
}
