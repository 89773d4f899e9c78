//! What every end-to-end test of the `ftrec` binary needs: the binary, a run that must
//! succeed, and its JSON report.

#![allow(dead_code)]

pub mod hang;
pub mod netns;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

pub fn ftrec() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ftrec"))
}

/// Run `cmd` and require success (its stderr is the failure message); a hang fails the test
/// with what its processes were doing ([`hang`]).
pub fn succeed(cmd: &mut Command) -> Output {
    let out = hang::output(cmd);
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

/// The control port a coordinator bound (asked for port 0), read from the line of its stderr
/// that tells workers started by hand where to connect; the lines before it are consumed.
pub fn control_port(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> u16 {
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(rest) = line.split("--coordinator HOST:").nth(1) {
            let port = rest.split_whitespace().next().unwrap_or("");
            return port
                .parse()
                .unwrap_or_else(|_| panic!("no control port in {line:?}"));
        }
        seen.push(line);
    }
    panic!("the coordinator ended without a control port: {seen:#?}");
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

/// `GET PATH` over HTTP/1.1: the status and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, text.clone());
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body).ok_or_else(bad)?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// The body of a `Transfer-Encoding: chunked` response.
pub fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// The value of metric `name` in a Prometheus text exposition, summed over its label sets;
/// `None` if it has no sample.
pub fn metric(body: &str, name: &str) -> Option<f64> {
    let mut sum = None;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value = match rest.chars().next() {
            Some('{') => rest.rsplit_once('}').map(|(_, v)| v),
            Some(' ') => Some(rest),
            _ => None,
        };
        if let Some(v) = value.and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok()) {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}
