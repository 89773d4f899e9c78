//! `ftrec run --resume LOCATION` end to end: a synchronous job SIGKILLed as a whole (the
//! coordinator and every child, one process group) once its store holds a committed checkpoint
//! at or past a given step, then resumed from the store alone, ends with the uninterrupted
//! run's digest (also with the store on an S3 server, in-process: the job's processes and the
//! resume reach it through the environment); a finished job's store resumed onto another number
//! of servers restores the saved model bit for bit (rows re-sharded); flags that contradict the
//! job record, a store without a record and a store with nothing committed are one clear error
//! each.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::hang::BoundedOutput;
use common::{ftrec, read_json, succeed};
use ftrec_ckpt::deck::Lineage;
use ftrec_ckpt::location::{self, LocationOptions};
use ftrec_ckpt::Checkpoints;

/// The job of every test here: synchronous (the digest is the oracle), tiny, 2 workers.
fn job(servers: u32, steps: u64) -> Vec<String> {
    [
        "run",
        "--preset",
        "tiny",
        "--workers",
        "2",
        "--sync",
        "--batch",
        "32",
        "--eval-samples",
        "0",
        "--seed",
        "5",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "--servers".into(),
        servers.to_string(),
        "--steps".into(),
        steps.to_string(),
    ])
    .collect()
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// The step of the store's head, the state `ftrec run --resume` starts from (the checkpoint
/// `CURRENT` names, or the delta a merged checkpoint stands for), if any.
fn committed_step(store: &str) -> Option<u64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // A directory or `s3://` (the endpoint and credentials from the environment, as the
        // job's own processes take them).
        let store = location::open(store, &LocationOptions::default())
            .await
            .ok()?;
        let ckpts = Checkpoints::new(store);
        let lineage = Lineage::load(&ckpts).await.ok()?;
        // The state a resume starts from: the head (`CURRENT`). A kill between a save's
        // manifest and its `CURRENT` leaves a newer complete state that resume passes over.
        let head = lineage.head()?;
        lineage
            .nodes()
            .filter(|n| n.tip == head || n.id == head)
            .map(|n| n.step)
            .max()
    })
}

/// Start `args` in a process group of its own (its servers, workers and merger join it).
fn spawn_group(args: &[String], dir: &Path) -> Child {
    ftrec()
        .args(args)
        .arg("--work-dir")
        .arg(dir)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Poll until `done` holds (bounded: the test fails rather than hangs); the job must still be
/// running then.
fn wait_until(child: &mut Child, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !done() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the job ended ({status}) before {what}");
        }
        assert!(Instant::now() < deadline, "no {what} within 300 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the job ended before it could be killed at {what}"
    );
}

/// SIGKILL the whole process group of `child` and reap it.
fn kill_group(child: &mut Child) {
    // SAFETY: kill(2) on the group this test created; no memory is touched.
    let r = unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    assert_eq!(r, 0, "killing the job's process group");
    child.wait().unwrap();
}

/// A clean run of `strategy`, the same job SIGKILLed as a whole once its store holds a
/// committed checkpoint at step `at` or later, then `ftrec run --resume` onto `servers`
/// servers (re-sharded when not 3): the same digest.
fn killed_and_resumed(strategy: &[&str], at: u64, servers: u32) {
    killed_and_resumed_at(strategy, at, servers, None);
}

/// [`killed_and_resumed`] with the store at `location` (default: a directory of the test's).
fn killed_and_resumed_at(strategy: &[&str], at: u64, servers: u32, location: Option<String>) {
    let steps = 150;
    let dir = tempfile::tempdir().unwrap();
    let clean_json = dir.path().join("clean.json");
    let mut args = job(3, steps);
    args.extend(strings(strategy));
    succeed(
        ftrec()
            .args(&args)
            .arg("--work-dir")
            .arg(dir.path().join("clean"))
            .arg("--json")
            .arg(&clean_json),
    );
    let clean = read_json(&clean_json);

    let store = location.unwrap_or_else(|| dir.path().join("store").display().to_string());
    let saved = kill_after_checkpoint(&args, &store, dir.path(), at, steps);
    // The store alone: no preset, strategy or step flag.
    let rep = resume(&store, servers, dir.path());
    assert_eq!(rep["steps"], steps);
    assert_eq!(rep["strategy"], strategy[1]);
    let r = &rep["resumed"];
    assert_eq!(r["step"], saved, "{r}");
    assert_eq!(r["batches"], saved * 2, "{r}");
    assert_eq!(r["saved_servers"], 3, "{r}");
    assert_eq!(r["servers"], servers, "{r}");
    assert!(r["checkpoint"].as_str().unwrap().len() > 20, "{r}");
    assert!(clean["model_digest"].as_str().unwrap().len() >= 16);
    assert_eq!(rep["model_digest"], clean["model_digest"]);
    // It ends with the same final save: the store's head is the last step.
    assert_eq!(committed_step(&store), Some(steps));
}

/// Run `args` with its store at `store`, SIGKILL it as a whole once the store holds a
/// committed checkpoint at step `at` or later (before `steps`); the committed step.
fn kill_after_checkpoint(args: &[String], store: &str, dir: &Path, at: u64, steps: u64) -> u64 {
    let mut killed_args = args.to_vec();
    killed_args.push("--store".into());
    killed_args.push(store.to_string());
    let mut child = spawn_group(&killed_args, &dir.join("killed"));
    wait_until(&mut child, &format!("a checkpoint at step {at}"), || {
        committed_step(store).is_some_and(|s| s >= at)
    });
    kill_group(&mut child);
    let saved = committed_step(store).unwrap();
    assert!(saved >= at && saved < steps, "committed step {saved}");
    saved
}

/// `ftrec run --resume store` onto `servers` servers: its report, after checking that it
/// says it resumed.
fn resume(store: &str, servers: u32, dir: &Path) -> serde_json::Value {
    let json = dir.join("resumed.json");
    let out = succeed(
        ftrec()
            .arg("run")
            .arg("--resume")
            .arg(store)
            .args(["--servers", &servers.to_string()])
            .arg("--work-dir")
            .arg(dir.join("resumed"))
            .arg("--json")
            .arg(&json),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("resumed from checkpoint"), "{stdout}");
    read_json(&json)
}

#[test]
fn a_full_job_killed_as_a_whole_resumes_to_the_uninterrupted_digest() {
    killed_and_resumed(&["--strategy", "full", "--ckpt-every-steps", "5"], 10, 3);
}

/// ECRec with its backstop (ECRec §4's second layer): the store holds full checkpoints of the
/// rows, and a resume re-encodes the parities from them.
#[test]
fn an_ecrec_job_with_a_backstop_killed_as_a_whole_resumes_to_the_uninterrupted_digest() {
    killed_and_resumed(&["--strategy", "ecrec", "--ckpt-every-steps", "4"], 12, 3);
}

#[test]
fn a_deck_job_killed_as_a_whole_resumes_to_the_uninterrupted_digest() {
    killed_and_resumed(&["--strategy", "deck", "--delta-every-steps", "4"], 12, 3);
}

/// A finished job on 3 servers, resumed onto `servers`: nothing is left to train, so the
/// final digest is the restored model's, and it must be the saved one.
fn resumed_digest(store: &Path, servers: u32, dir: &Path) -> serde_json::Value {
    let json = dir.join(format!("onto-{servers}.json"));
    succeed(
        ftrec()
            .arg("run")
            .arg("--resume")
            .arg(store)
            .args(["--servers", &servers.to_string()])
            .arg("--work-dir")
            .arg(dir.join(format!("onto-{servers}")))
            .arg("--json")
            .arg(&json),
    );
    let rep = read_json(&json);
    assert_eq!(rep["resumed"]["saved_servers"], 3, "{}", rep["resumed"]);
    assert_eq!(rep["resumed"]["servers"], servers, "{}", rep["resumed"]);
    assert_eq!(rep["checkpoints"], 0, "a finished job saves nothing more");
    rep["model_digest"].clone()
}

fn elastic(strategy: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let json = dir.path().join("run.json");
    let mut args = job(3, 10);
    args.extend(strings(strategy));
    succeed(
        ftrec()
            .args(&args)
            .arg("--store")
            .arg(&store)
            .arg("--work-dir")
            .arg(dir.path().join("run"))
            .arg("--json")
            .arg(&json),
    );
    let saved = read_json(&json)["model_digest"].clone();
    for servers in [2, 5] {
        assert_eq!(
            resumed_digest(&store, servers, dir.path()),
            saved,
            "{strategy:?} onto {servers} servers"
        );
    }
}

#[test]
fn a_full_checkpoint_of_3_servers_resumes_onto_2_and_5_with_the_saved_digest() {
    elastic(&["--strategy", "full", "--ckpt-every-steps", "4"]);
}

#[test]
fn a_deck_lineage_of_3_servers_resumes_onto_2_and_5_with_the_saved_digest() {
    elastic(&[
        "--strategy",
        "deck",
        "--delta-every-steps",
        "3",
        "--merge-stride",
        "0",
    ]);
    // With the merger on, the head delta is merged and collected at the end of the run: the
    // merged checkpoint standing for it is what is restored.
    elastic(&["--strategy", "deck", "--delta-every-steps", "2"]);
}

#[test]
fn incremental_pieces_of_3_servers_resume_onto_2_and_5_with_the_saved_digest() {
    for strategy in [
        &[
            "--strategy",
            "incrcp",
            "--ckpt-every-steps",
            "3",
            "--base-reset",
            "never",
        ][..],
        &["--strategy", "incremental", "--ckpt-every-steps", "3"][..],
        &[
            "--strategy",
            "cnr",
            "--ckpt-every-steps",
            "3",
            "--cnr-reset-fraction",
            "0",
        ][..],
    ] {
        elastic(strategy);
    }
}

#[test]
fn an_incrcp_job_killed_as_a_whole_resumes_onto_2_servers_to_the_uninterrupted_digest() {
    killed_and_resumed(&["--strategy", "incrcp", "--ckpt-every-steps", "3"], 9, 2);
}

#[test]
fn an_incrcp_job_on_s3_killed_as_a_whole_resumes_from_s3_to_the_uninterrupted_digest() {
    use ftrec_ckpt::testing::{s3_server, BUCKET};
    // The job's processes (and this test's reads of the store) take the endpoint and the
    // credentials from the environment. No other test here uses an S3 store.
    s3_server().set_env();
    killed_and_resumed_at(
        &["--strategy", "incrcp", "--ckpt-every-steps", "3"],
        9,
        2,
        Some(format!("s3://{BUCKET}/resume-{}", std::process::id())),
    );
}

#[test]
fn an_asynchronous_job_killed_as_a_whole_resumes_from_its_last_checkpoint_and_finishes() {
    // Asynchronous training has no digest oracle (the workers' interleaving decides the
    // model); what a resume must give: the job record's asynchronous mode, the state of the
    // checkpoint the store's head names, and every remaining step trained and saved.
    let steps = 150;
    let at = 10;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store").display().to_string();
    let mut args: Vec<String> = job(3, steps)
        .into_iter()
        .filter(|a| a != "--sync")
        .collect();
    args.extend(strings(&["--strategy", "full", "--ckpt-every-steps", "5"]));
    let saved = kill_after_checkpoint(&args, &store, dir.path(), at, steps);
    let rep = resume(&store, 2, dir.path());
    assert_eq!(rep["config"]["sync"], false, "the job record's mode");
    assert_eq!(rep["steps"], steps);
    let r = &rep["resumed"];
    assert_eq!(r["step"], saved, "{r}");
    assert_eq!(r["saved_servers"], 3, "{r}");
    assert_eq!(r["servers"], 2, "{r}");
    assert_eq!(committed_step(&store), Some(steps));
}

fn fail_line(args: &[&str], store: &Path) -> String {
    let out = ftrec()
        .args(["run", "--resume"])
        .arg(store)
        .args(args)
        .bounded_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    // One error line (after the run's header lines, when the job got that far).
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("ftrec: error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert_eq!(
        stderr.trim_end().lines().last(),
        Some(errors[0]),
        "{stderr}"
    );
    errors[0].to_string()
}

#[test]
fn contradicting_flags_and_stores_without_a_job_are_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut args = job(2, 6);
    args.extend(strings(&["--strategy", "full", "--ckpt-every-steps", "3"]));
    succeed(
        ftrec()
            .args(&args)
            .arg("--store")
            .arg(&store)
            .arg("--work-dir")
            .arg(dir.path().join("run")),
    );
    for (flags, want) in [
        (&["--seed", "6"][..], &["--seed 6", "--seed is 5"][..]),
        (&["--preset", "small"], &["--preset small", "is tiny"]),
        (&["--strategy", "deck"], &["--strategy deck", "is full"]),
        (&["--batch", "64"], &["--batch 64", "is 32"]),
        (&["--workers", "3"], &["--workers 3", "is 2"]),
        (
            &["--ckpt-every-steps", "4"],
            &["--ckpt-every-steps 4", "is 3"],
        ),
        (
            &["--optimizer", "sgd"],
            &["--optimizer sgd", "is rowwise_adagrad"],
        ),
        (
            &["--delta-every-steps", "4"],
            &["--delta-every-steps", "full"],
        ),
        (&["--steps", "7"], &["--steps 7", "is 6"]),
    ] {
        let e = fail_line(flags, &store);
        for w in want {
            assert!(e.contains(w), "{flags:?}: {e}");
        }
        assert!(e.contains(&store.display().to_string()), "{e}");
    }
    // Flags that agree, and those that may differ, are accepted.
    succeed(
        ftrec()
            .args(["run", "--resume"])
            .arg(&store)
            .args([
                "--seed",
                "5",
                "--sync",
                "--strategy",
                "full",
                "--servers",
                "1",
            ])
            .args(["--threads", "2", "--work-dir"])
            .arg(dir.path().join("again")),
    );

    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = fail_line(&[], &empty);
    assert!(e.contains("no job record"), "{e}");

    // A job killed before its first checkpoint: a record, nothing committed.
    let early: PathBuf = dir.path().join("early");
    let mut long = job(2, 100_000);
    long.extend(strings(&[
        "--strategy",
        "full",
        "--ckpt-every-steps",
        "50000",
        "--store",
    ]));
    long.push(early.display().to_string());
    let mut child = spawn_group(&long, &dir.path().join("early-work"));
    wait_until(&mut child, "the job record", || early.join("JOB").exists());
    kill_group(&mut child);
    let e = fail_line(&[], &early);
    assert!(e.contains("no committed checkpoint"), "{e}");
    // A damaged record is named.
    let job_file = store.join("JOB");
    let mut b = std::fs::read(&job_file).unwrap();
    let i = b.len() / 2;
    b[i] ^= 1;
    std::fs::write(&job_file, b).unwrap();
    let e = fail_line(&[], &store);
    assert!(e.contains("JOB") && e.contains("checksum"), "{e}");
}

/// `--resume-or-start`: the same command line starts the job on an empty store and, after the
/// job was SIGKILLed as a whole, resumes it from the store (what a restarted coordinator's
/// container does), ending at the uninterrupted run's digest.
#[test]
fn the_same_command_starts_a_job_and_resumes_it_after_a_kill() {
    let steps = 60;
    let dir = tempfile::tempdir().unwrap();
    let mut args = job(2, steps);
    args.extend(strings(&["--strategy", "full", "--ckpt-every-steps", "5"]));
    let clean_json = dir.path().join("clean.json");
    succeed(
        ftrec()
            .args(&args)
            .arg("--work-dir")
            .arg(dir.path().join("clean"))
            .arg("--json")
            .arg(&clean_json),
    );
    let clean = read_json(&clean_json);
    let store = dir.path().join("store").display().to_string();
    let mut same = args.clone();
    same.push("--resume-or-start".into());
    let saved = kill_after_checkpoint(&same, &store, dir.path(), 10, steps);
    let json = dir.path().join("again.json");
    let out = succeed(
        ftrec()
            .args(&same)
            .args(["--store", &store])
            .arg("--work-dir")
            .arg(dir.path().join("again"))
            .arg("--json")
            .arg(&json),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("resuming it (--resume-or-start)"),
        "{stderr}"
    );
    let rep = read_json(&json);
    assert_eq!(rep["resumed"]["step"], saved);
    assert_eq!(rep["model_digest"], clean["model_digest"]);
    // Without --store there is nothing to resume from.
    let out = ftrec()
        .args(&args)
        .arg("--resume-or-start")
        .bounded_output()
        .unwrap();
    let line = common::one_error_line(&out);
    assert!(line.contains("--resume-or-start needs --store"), "{line}");
}
