//! The kill matrix: every strategy x every phase it has x every role a SIGKILL can hit, each
//! cell one synchronous (deterministic) run of real processes with that kill, checked against
//! the failure-free run of the same configuration.
//!
//! - [`matrix`] is the one list of strategies, phases and roles: which cells apply, the kills
//!   that express each, and why a cell does not apply.
//! - [`run_cell`] runs one cell and checks it: every kill fired (and a `replacement` kill hit a
//!   server that had already been replaced), exact strategies end with the failure-free
//!   digest, approximate ones (`cpr`'s partial recovery, `cnr` with 8-bit pieces) finish with
//!   their error in the report, `none` ends with one error line naming the lost server, every
//!   started process is reaped (servers, workers and the merger: no child of this process is
//!   left) and every server port can be bound again.
//! - `kill_matrix_subset` (in every test run) runs a few cells covering each strategy once;
//!   `kill_matrix_full` (ignored; `scripts/kill-matrix.sh`) runs them all and, with
//!   `KILL_MATRIX_OUT=FILE`, writes the table (markdown).

mod common;

use std::collections::HashMap;
use std::sync::Mutex;

use ftrec_cluster::{run, EventKind, Role, RunConfig, RunReport, StrategyChoice};
use ftrec_ec::CodeKind;

/// Steps of every run; saves every [`EVERY`] steps.
const STEPS: u64 = 16;
const EVERY: u64 = 3;

/// The phases, in table column order. `step` is a kill right after a step completes.
const PHASES: &[&str] = &[
    "step",
    "checkpoint-write",
    "piece-write",
    "recovery",
    "merge",
    "prepare",
    "prepare-some",
    "commit",
    "commit-some",
    "rebuild",
    "pause",
    "second-run",
    "gc-read",
];
/// The roles, in table row order. `replacement`: a server that is itself a replacement (the
/// second kill of the same server id, after its first loss was replaced). `coordinator` and
/// `reader`: the gray-failure columns' other processes (a second coordinator on the store, a
/// restore reading while the job collects garbage).
const ROLES: &[&str] = &[
    "server",
    "worker",
    "merger",
    "replacement",
    "coordinator",
    "reader",
];

/// One row group of the table: a strategy configuration.
#[derive(Clone, Copy)]
struct Strat {
    /// Row label.
    label: &'static str,
    /// How its runs end after a server loss.
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    /// The failure-free digest, bit for bit.
    Exact,
    /// Finishes; the report gives the error of the restored state (CPR's PLS, the
    /// quantization error).
    Approximate,
    /// A server loss ends the run with one error line.
    Fails,
}

const STRATEGIES: &[Strat] = &[
    Strat {
        label: "none",
        kind: Kind::Fails,
    },
    Strat {
        label: "full",
        kind: Kind::Exact,
    },
    Strat {
        label: "deck",
        kind: Kind::Exact,
    },
    Strat {
        label: "ecrec",
        kind: Kind::Exact,
    },
    Strat {
        label: "cpr",
        kind: Kind::Approximate,
    },
    Strat {
        label: "incrcp",
        kind: Kind::Exact,
    },
    Strat {
        label: "incremental",
        kind: Kind::Exact,
    },
    Strat {
        label: "cnr",
        kind: Kind::Exact,
    },
    Strat {
        label: "cnr-q8",
        kind: Kind::Approximate,
    },
];

impl Strat {
    fn by_label(label: &str) -> Strat {
        *STRATEGIES.iter().find(|s| s.label == label).unwrap()
    }

    /// Servers of its runs: `ecrec` stripes 2 data rows and 2 parities over 4 servers, so a
    /// second server may die while the first one rebuilds (ECRec §3.4 tolerates r losses).
    fn servers(&self) -> u32 {
        if self.label == "ecrec" {
            4
        } else {
            2
        }
    }

    fn strategy(&self) -> StrategyChoice {
        match self.label {
            "ecrec" => StrategyChoice::EcRec {
                k: 2,
                r: 2,
                code: CodeKind::Gf256,
                dense_replication: true,
                two_phase: true,
                lock_ranges: 4,
                // The default pace: the coordinator's pacer sets the share.
                rebuild_share_ppm: ftrec_cluster::ecrec::paced_start_share_ppm(900_000),
                rebuild_min_throughput_ppm: Some(900_000),
                backstop_every_steps: None,
            },
            "cnr-q8" => StrategyChoice::Cnr {
                every_steps: EVERY,
                reset_fraction: Some(ftrec_cluster::spec::DEFAULT_CNR_RESET_FRACTION),
                quant_bits: Some(8),
            },
            // IncrCP's §4.5 reset rule decides from measured times; off, a kill's restore point
            // does not depend on the machine's speed.
            "incrcp" => match StrategyChoice::parse("incrcp", EVERY).unwrap() {
                StrategyChoice::IncrCp {
                    every_steps,
                    threshold,
                    range_rows,
                    concat,
                    ..
                } => StrategyChoice::IncrCp {
                    every_steps,
                    reset: ftrec_strategy::BaseReset::Never,
                    threshold,
                    range_rows,
                    concat,
                },
                other => panic!("not incrcp: {other:?}"),
            },
            name => StrategyChoice::parse(name, EVERY).unwrap(),
        }
    }

    fn saves(&self) -> bool {
        !matches!(self.label, "none" | "ecrec")
    }
    fn pieces(&self) -> bool {
        matches!(self.label, "incrcp" | "incremental" | "cnr" | "cnr-q8")
    }
}

/// A cell of the matrix: the kills that express it, or why it does not apply.
enum Cell {
    Kills(Vec<String>),
    /// A second job on the store of a finished one, while a live process holds its lease.
    SecondRun,
    /// Restores of the store in a loop while the job runs and collects garbage.
    GcRead,
    /// The whole job frozen and taken over: its outcome comes from `crates/cli/tests/frozen.rs`
    /// (the coordinator cannot be frozen inside this process), which `scripts/kill-matrix.sh`
    /// runs first and whose results it names in `KILL_MATRIX_FROZEN`.
    Frozen,
    NotApplicable(&'static str),
}

/// The one definition of the matrix: what `strategy` x `phase` x `role` means.
///
/// Saves are at steps 3, 6, 9, ... A first loss is at step 4 (after the first save); a
/// recovery from it restores step 3 and redoes step 4, so the save at step 6 is the second
/// `checkpoint-write` (and, for the piece strategies, the first `piece-write` after the
/// recovery). `ecrec` commits every step in two phases, so `prepare#6`/`commit#6` fall after a
/// loss at step 3.
fn matrix(s: Strat, phase: &str, role: &str) -> Cell {
    use Cell::NotApplicable as Na;
    let k = |v: &[&str]| Cell::Kills(v.iter().map(|s| s.to_string()).collect());
    let ec = s.label == "ecrec";
    // The gray-failure columns and rows.
    match (phase, role) {
        // A paused server (SIGSTOP): found lost by its heartbeats and fenced, then woken
        // (SIGCONT): it learns it was replaced and exits by itself.
        ("pause", "server") => return k(&["stop:server=1@step=4"]),
        ("pause", "coordinator") if !s.saves() => {
            return Na("no store: none and ecrec write no checkpoints")
        }
        ("pause", "coordinator" | "merger") if s.saves() && (role == "coordinator" || s.label == "deck") => {
            return Cell::Frozen
        }
        ("pause", _) => {
            return Na("a pause (SIGSTOP) is injected into a server only: a silent worker is found by the step timeout (60 s) and SIGKILLed, and a merger is never replaced while it runs (the coordinator kills it before any other pass)")
        }
        ("second-run", "coordinator") if s.saves() => return Cell::SecondRun,
        ("gc-read", "reader") if s.saves() => return Cell::GcRead,
        ("second-run" | "gc-read", _) if !s.saves() => {
            return Na("no store: none and ecrec write no checkpoints")
        }
        ("second-run", _) => return Na("a second coordinator on the store (the coordinator row)"),
        ("gc-read", _) => return Na("a reader during garbage collection (the reader row)"),
        (_, "coordinator" | "reader") => {
            return Na("the coordinator and reader rows hold the gray-failure columns only")
        }
        _ => {}
    }
    if role == "merger" && s.label != "deck" {
        return Na("no merger: only deck merges (DECK §3.3)");
    }
    if s.label == "none" {
        return match (phase, role) {
            ("step", "server") => k(&["server=1@step=4"]),
            ("step", "worker") => k(&["worker=0@step=4"]),
            (_, "replacement") => Na("none replaces no server: the first server loss ends the run"),
            _ => Na("none saves, recovers, merges and commits nothing: the phase never occurs"),
        };
    }
    match phase {
        "checkpoint-write" if !s.saves() => {
            return Na("ecrec keeps its redundancy in memory: no checkpoint is written")
        }
        "piece-write" if !s.pieces() => {
            return Na("only incrcp, incremental and cnr write incremental pieces")
        }
        "recovery" if ec => {
            return Na(
                "ecrec has no stop-and-restore recovery: a replacement joins at once and \
                 rebuilds while training goes on (the rebuild column)",
            )
        }
        "merge" if s.label != "deck" => return Na("only deck runs a merger"),
        "prepare" | "prepare-some" | "commit" | "commit-some" | "rebuild" if !ec => {
            return Na("a phase of ecrec's two-phase commit and rebuild only")
        }
        _ => {}
    }
    // Which server a first loss hits: the one the cell's second kill names, if a replacement.
    match (phase, role) {
        ("step", "server") => k(&["server=1@step=4"]),
        ("step", "worker") => k(&["worker=0@step=4"]),
        ("step", "merger") => k(&["merger=0@step=10"]),
        ("step", "replacement") => k(&["server=1@step=4", "server=1@step=10"]),

        // For the piece strategies the first save is the base full; a piece's upload is the
        // piece-write column.
        ("checkpoint-write", "server") if s.pieces() => k(&["server=1@phase=checkpoint-write"]),
        ("checkpoint-write", "worker") if s.pieces() => k(&["worker=0@phase=checkpoint-write"]),
        ("checkpoint-write", "server") => k(&["server=1@phase=checkpoint-write#2"]),
        ("checkpoint-write", "worker") => k(&["worker=0@phase=checkpoint-write#2"]),
        ("checkpoint-write", "merger") => k(&["merger=0@phase=checkpoint-write#4"]),
        ("checkpoint-write", "replacement") => {
            k(&["server=1@step=4", "server=1@phase=checkpoint-write#2"])
        }

        ("piece-write", "server") => k(&["server=1@phase=piece-write#2"]),
        ("piece-write", "worker") => k(&["worker=0@phase=piece-write#2"]),
        ("piece-write", "replacement") => k(&["server=1@step=4", "server=1@phase=piece-write#1"]),

        ("recovery", "server") => k(&["server=0@step=4", "server=1@phase=recovery"]),
        ("recovery", "worker") => k(&["server=1@step=4", "worker=0@phase=recovery"]),
        ("recovery", "merger") => Na(
            "a recovery stops the merger first (the save in flight and the merge pass are \
             dropped): no merger runs during a recovery",
        ),
        ("recovery", "replacement") => k(&["server=1@step=4", "server=1@phase=recovery"]),

        ("merge", "server") => k(&["server=1@phase=merge"]),
        ("merge", "worker") => k(&["worker=0@phase=merge"]),
        ("merge", "merger") => k(&["merger=0@phase=merge"]),
        ("merge", "replacement") => k(&["server=1@step=4", "server=1@phase=merge"]),

        ("prepare", "server") => k(&["server=1@phase=prepare#4"]),
        ("prepare", "worker") => k(&["worker=0@phase=prepare#4"]),
        ("prepare", "replacement") => k(&["server=1@step=3", "server=1@phase=prepare#6"]),
        ("commit", "server") => k(&["server=1@phase=commit#4"]),
        ("commit", "worker") => k(&["worker=0@phase=commit#4"]),
        ("commit", "replacement") => k(&["server=1@step=3", "server=1@phase=commit#6"]),
        // A phase answered by servers 0 and 1 only: a server of the half not reached yet dies
        // in phase 1, one of the half that answered in phase 2.
        ("prepare-some", "server") => k(&["server=3@phase=prepare-some#4"]),
        ("prepare-some", "worker") => k(&["worker=0@phase=prepare-some#4"]),
        ("prepare-some", "replacement") => k(&["server=3@step=3", "server=3@phase=prepare-some#6"]),
        ("commit-some", "server") => k(&["server=1@phase=commit-some#4"]),
        ("commit-some", "worker") => k(&["worker=0@phase=commit-some#4"]),
        ("commit-some", "replacement") => k(&["server=1@step=3", "server=1@phase=commit-some#6"]),
        // With r = 2 a second server may die while the first rebuilds.
        ("rebuild", "server") => k(&["server=1@step=3", "server=3@phase=rebuild"]),
        ("rebuild", "worker") => k(&["server=1@step=3", "worker=0@phase=rebuild"]),
        ("rebuild", "replacement") => k(&["server=1@step=3", "server=1@phase=rebuild"]),
        (p, r) => panic!("no cell for {p} x {r}"),
    }
}

fn config(dir: &std::path::Path, s: Strat) -> RunConfig {
    let mut cfg = common::tiny_run(dir, s.servers(), 2, STEPS, 13);
    cfg.batch = 32;
    cfg.sync = true;
    cfg.strategy = s.strategy();
    cfg
}

/// The failure-free digest of a configuration: the run without fault tolerance and without
/// kills (saving or erasure coding changes nothing of the model), computed once per number
/// of servers.
fn clean_digest(s: Strat) -> String {
    static CACHE: Mutex<Option<HashMap<u32, String>>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    cache
        .entry(s.servers())
        .or_insert_with(|| {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = config(dir.path(), s);
            cfg.strategy = StrategyChoice::None;
            let report = run(&cfg).expect("the failure-free run");
            assert!(report.failures.is_empty() && report.aborted.is_none());
            report.model_digest
        })
        .clone()
}

/// Live children of this process (a reaped process has no `/proc` entry; a zombie is one not
/// reaped yet and counts).
fn children() -> Vec<u32> {
    let me = std::process::id();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if ppid == Some(me) {
            out.push(pid);
        }
    }
    out
}

/// Every process the run started is gone and every port its servers used can be bound.
fn check_nothing_left(report: &RunReport) -> Result<(), String> {
    for &pid in report.server_pids.iter().chain(&report.worker_pids) {
        // SAFETY: signal 0 only checks for existence; it sends nothing.
        if unsafe { libc::kill(pid as libc::pid_t, 0) } == 0 {
            return Err(format!("process {pid} is still alive"));
        }
    }
    let left = children();
    if !left.is_empty() {
        return Err(format!("child processes left: {left:?}"));
    }
    for addr in &report.server_addrs {
        if let Err(e) = std::net::TcpListener::bind(addr.as_str()) {
            return Err(format!("port {addr} is still taken: {e}"));
        }
    }
    Ok(())
}

/// Run one cell and check it; `Err` says what went wrong, in one line.
fn run_cell(s: Strat, kills: &[String]) -> Result<(), String> {
    let clean = clean_digest(s);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), s);
    cfg.kills = kills.iter().map(|k| k.parse().unwrap()).collect();
    let report = run(&cfg).map_err(|e| format!("run error: {e}"))?;
    check_nothing_left(&report)?;

    // Every kill fired, and a second kill of a server hit its replacement.
    for (i, k) in kills.iter().enumerate() {
        let at = report
            .events
            .iter()
            .position(|e| {
                e.kind == EventKind::FailureInjected && e.detail.ends_with(&format!("({k})"))
            })
            .ok_or_else(|| format!("{k} never fired"))?;
        let spec: ftrec_cluster::KillSpec = k.parse().unwrap();
        let earlier_same = kills[..i]
            .iter()
            .any(|o| o.split('@').next() == k.split('@').next());
        if spec.role == Role::Server && earlier_same {
            let replaced = report.events[..at]
                .iter()
                .any(|e| e.kind == EventKind::ServerReplaced && e.server == Some(spec.id));
            if !replaced {
                return Err(format!("{k} fired before server {} was replaced", spec.id));
            }
        }
    }
    // A paused server is fenced and woken: it must learn it was replaced and exit by itself
    // (`ftrec_ps::fence`), so nothing it sends after its pause lands.
    for k in kills.iter().filter(|k| k.starts_with("stop:")) {
        let spec: ftrec_cluster::KillSpec = k.parse().unwrap();
        let fenced: Vec<&str> = report
            .events
            .iter()
            .filter(|e| e.kind == EventKind::ServerFenced && e.server == Some(spec.id))
            .map(|e| e.detail.as_str())
            .collect();
        if !fenced.iter().any(|d| d.contains("exited by itself")) {
            return Err(format!(
                "{k}: the paused server did not leave by itself once fenced: {fenced:?}"
            ));
        }
    }
    let server_lost = report.failures.iter().any(|f| f.role == Role::Server);

    if s.kind == Kind::Fails && server_lost {
        let reason = report
            .aborted
            .as_ref()
            .ok_or("a server was lost and the run did not fail")?;
        let id = report
            .failures
            .iter()
            .find(|f| f.role == Role::Server)
            .unwrap()
            .id;
        if reason.lines().count() != 1 || !reason.contains(&format!("server {id}")) {
            return Err(format!("not one line naming server {id}: {reason:?}"));
        }
        return Ok(());
    }
    if let Some(a) = &report.aborted {
        return Err(format!("aborted: {a}"));
    }
    if report.steps != STEPS {
        return Err(format!("ended after {} of {STEPS} steps", report.steps));
    }
    if let Some(f) = report.failures.iter().find(|f| f.recovered_s.is_none()) {
        return Err(format!(
            "{} {} lost after step {} never recovered",
            f.role, f.id, f.step
        ));
    }
    // A worker holds no model state: a run that lost no server is exact for every strategy.
    if s.kind == Kind::Approximate && server_lost {
        match s.label {
            "cpr" => {
                let c = report.cpr.as_ref().ok_or("no cpr report")?;
                if c.pls.per_failure.is_empty() || !c.pls.total.is_finite() {
                    return Err(format!("no PLS reported: {:?}", c.pls));
                }
            }
            _ => {
                let st = report.store.as_ref().ok_or("no store report")?;
                match st.quant_max_abs_error {
                    Some(e) if e.is_finite() && e > 0.0 => {}
                    other => return Err(format!("no quantization error reported: {other:?}")),
                }
            }
        }
    } else if report.model_digest != clean {
        return Err(format!(
            "digest {} is not the failure-free {clean}",
            report.model_digest
        ));
    }
    Ok(())
}

/// A store belongs to one job at a time. The job runs to its end; then a live process holds
/// the store's lease (as a second coordinator would): a `--resume` and a fresh run of the job
/// are refused, naming the holder. Once the holder is paused past its lease, the resume takes
/// the store over (the next generation, stamped into `CURRENT`) and ends with the failure-free
/// model; the paused holder is fenced: its renewal and its commits fail.
fn second_run_cell(s: Strat) -> Result<(), String> {
    use ftrec_ckpt::lease::{self, Lease};
    let clean = clean_digest(s);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), s);
    let first = run(&cfg).map_err(|e| format!("first run: {e}"))?;
    if first.model_digest != clean {
        return Err(format!("first run digest {}", first.model_digest));
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt
        .block_on(ftrec_ckpt::location::open(
            &cfg.store_location(),
            &Default::default(),
        ))
        .map_err(|e| e.to_string())?;
    let ckpts = ftrec_ckpt::Checkpoints::new(store);
    let ttl = std::time::Duration::from_secs(600);
    let mut other = rt
        .block_on(Lease::acquire(&ckpts, "another coordinator", ttl))
        .map_err(|e| format!("taking the released lease: {e}"))?;
    let mut again = cfg.clone();
    again.work_dir = dir.path().join("again");
    again.store = Some(cfg.store_location());
    for (what, r) in [
        ("resume", ftrec_cluster::resume(&again)),
        ("fresh run", run(&again)),
    ] {
        match r {
            Err(e) if e.to_string().contains("is held by") => {}
            Err(e) => return Err(format!("{what} refused for another reason: {e}")),
            Ok(_) => return Err(format!("{what} ran while another process held the store")),
        }
    }
    // The holder pauses past its lease.
    let mut rec = rt
        .block_on(lease::read_lease(&ckpts))
        .map_err(|e| e.to_string())?
        .ok_or("no lease")?;
    rec.expires_unix_ms = 1;
    rt.block_on(ckpts.store().put(
        &lease::lease_key(&ckpts),
        serde_json::to_vec(&rec).unwrap().into(),
        ftrec_ckpt::PutMode::Overwrite,
    ))
    .map_err(|e| e.to_string())?;
    let resumed = ftrec_cluster::resume(&again).map_err(|e| format!("resume after expiry: {e}"))?;
    // An approximate store (8-bit pieces) restores an approximate model: exact ones the model.
    if s.kind != Kind::Approximate && resumed.model_digest != clean {
        return Err(format!("resumed digest {}", resumed.model_digest));
    }
    check_nothing_left(&resumed)?;
    let l = rt
        .block_on(lease::read_lease(&ckpts))
        .map_err(|e| e.to_string())?
        .ok_or("no lease")?;
    if l.generation != other.generation() + 1 || !l.released {
        return Err(format!("lease after the resume: {l:?}"));
    }
    match rt.block_on(other.renew()) {
        Err(ftrec_ckpt::CkptError::Fenced { .. }) => Ok(()),
        r => Err(format!("the paused holder was not fenced: {r:?}")),
    }
}

/// Restores of the job's newest state in a loop while the job runs (and collects garbage):
/// each one succeeds, or finds nothing committed yet; none meets a half-deleted checkpoint.
/// The job ends with the failure-free model and a last restore succeeds.
fn gc_read_cell(s: Strat) -> Result<(), String> {
    use ftrec_ckpt::deck::RestoreAt;
    use ftrec_ckpt::model_state::restore_model;
    let clean = clean_digest(s);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), s);
    let location = cfg.store_location();
    let job = {
        let cfg = cfg.clone();
        std::thread::spawn(move || run(&cfg))
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let read = || -> Result<bool, String> {
        let store = match rt.block_on(ftrec_ckpt::location::open(&location, &Default::default())) {
            Ok(s) => s,
            Err(_) => return Ok(false),
        };
        let ckpts = ftrec_ckpt::Checkpoints::new(store);
        match rt.block_on(restore_model(&ckpts, &RestoreAt::Current)) {
            Ok(_) => Ok(true),
            Err(ftrec_ckpt::CkptError::NoCheckpoint { .. }) => Ok(false),
            Err(e) => Err(format!("a restore during the job failed: {e}")),
        }
    };
    let mut reads = 0;
    while !job.is_finished() {
        if read()? {
            reads += 1;
        }
    }
    let report = job
        .join()
        .map_err(|_| "the job panicked".to_string())?
        .map_err(|e| format!("run error: {e}"))?;
    if report.model_digest != clean {
        return Err(format!("digest {}", report.model_digest));
    }
    if !read()? {
        return Err("no state to restore after the job".into());
    }
    eprintln!("  {reads} restores during the job");
    check_nothing_left(&report)
}

/// The frozen-job test's result for `strategy`, from the file `KILL_MATRIX_FROZEN` names
/// (`{"strategy": "pass" | "why it failed"}`, written by `crates/cli/tests/frozen.rs`).
/// `None` when it is not set; a file without this strategy's result is a failure (the test
/// did not run, or stopped early).
fn frozen_outcome(strategy: &str) -> Option<Result<(), String>> {
    let path = std::env::var_os("KILL_MATRIX_FROZEN")?;
    let result = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|all| all.get(strategy)?.as_str().map(str::to_string));
    Some(match result.as_deref() {
        Some("pass") => Ok(()),
        Some(why) => Err(format!(
            "the frozen job (crates/cli/tests/frozen.rs): {why}"
        )),
        None => Err("no result from the frozen-job test (crates/cli/tests/frozen.rs)".into()),
    })
}

/// What a cell came to, for the table.
enum Outcome {
    Pass,
    Fail(String),
    NotApplicable(&'static str),
}

fn run_one(s: Strat, phase: &str, role: &str) -> Outcome {
    let timed = |what: &str, f: &dyn Fn() -> Result<(), String>| {
        let t = std::time::Instant::now();
        let r = f();
        eprintln!(
            "{} x {role} x {phase} [{what}]: {} ({:.1} s)",
            s.label,
            match &r {
                Ok(()) => "pass".to_string(),
                Err(e) => format!("FAIL: {e}"),
            },
            t.elapsed().as_secs_f64()
        );
        match r {
            Ok(()) => Outcome::Pass,
            Err(e) => Outcome::Fail(e),
        }
    };
    match matrix(s, phase, role) {
        Cell::NotApplicable(why) => Outcome::NotApplicable(why),
        Cell::SecondRun => timed("second coordinator", &|| second_run_cell(s)),
        Cell::GcRead => timed("restores during GC", &|| gc_read_cell(s)),
        Cell::Frozen => match frozen_outcome(s.label) {
            Some(Ok(())) => Outcome::Pass,
            Some(Err(e)) => Outcome::Fail(e),
            None => Outcome::NotApplicable(
                "the whole job frozen: crates/cli/tests/frozen.rs, whose results scripts/kill-matrix.sh passes in KILL_MATRIX_FROZEN (not set, or no result for this strategy)",
            ),
        },
        Cell::Kills(kills) => timed(&kills.join(" "), &|| run_cell(s, &kills)),
    }
}

/// A few cells that cover every strategy once, and different phases and roles.
#[test]
fn kill_matrix_subset() {
    let cells = [
        ("none", "step", "server"),
        ("full", "recovery", "worker"),
        ("deck", "merge", "merger"),
        ("ecrec", "commit", "server"),
        ("cpr", "recovery", "server"),
        ("incrcp", "piece-write", "server"),
        ("incremental", "checkpoint-write", "worker"),
        ("cnr", "recovery", "replacement"),
        ("cnr-q8", "step", "server"),
        ("full", "pause", "server"),
        ("deck", "second-run", "coordinator"),
        ("deck", "gc-read", "reader"),
    ];
    let mut failed = Vec::new();
    for (strategy, phase, role) in cells {
        match run_one(Strat::by_label(strategy), phase, role) {
            Outcome::Pass => {}
            Outcome::Fail(e) => failed.push(format!("{strategy} x {role} x {phase}: {e}")),
            Outcome::NotApplicable(why) => panic!("{strategy} x {role} x {phase} is n/a: {why}"),
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Every cell. `KILL_MATRIX_OUT=FILE` writes the table; `KILL_MATRIX_ONLY=a,b` runs only the
/// strategies named, `KILL_MATRIX_PHASES=p,q` only the phases (columns) named.
#[test]
#[ignore = "the whole matrix takes minutes: scripts/kill-matrix.sh"]
fn kill_matrix_full() {
    let only: Option<Vec<String>> = std::env::var("KILL_MATRIX_ONLY")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    let phases: Option<Vec<String>> = std::env::var("KILL_MATRIX_PHASES")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    let mut rows = Vec::new();
    let (mut pass, mut fail, mut na) = (0, 0, 0);
    // Reasons a cell does not apply, numbered in order of first use.
    let mut reasons: Vec<&'static str> = Vec::new();
    for &s in STRATEGIES {
        if only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|x| x == s.label))
        {
            continue;
        }
        for &role in ROLES {
            let mut row = format!("| {} | {role} |", s.label);
            for &phase in PHASES {
                if phases
                    .as_ref()
                    .is_some_and(|p| !p.iter().any(|x| x == phase))
                {
                    continue;
                }
                let text = match run_one(s, phase, role) {
                    Outcome::Pass => {
                        pass += 1;
                        "pass".to_string()
                    }
                    Outcome::Fail(e) => {
                        fail += 1;
                        format!("**FAIL** ({})", e.replace('|', "/"))
                    }
                    Outcome::NotApplicable(why) => {
                        na += 1;
                        let n = match reasons.iter().position(|r| *r == why) {
                            Some(i) => i + 1,
                            None => {
                                reasons.push(why);
                                reasons.len()
                            }
                        };
                        format!("n/a [{n}]")
                    }
                };
                row.push_str(&format!(" {text} |"));
            }
            rows.push(row);
        }
    }
    let mut md = String::new();
    md.push_str("# Kill matrix\n\n");
    md.push_str(&format!(
        "Written by `scripts/kill-matrix.sh` (`cargo test -p ftrec-cluster --test kill_matrix \
         kill_matrix_full -- --ignored`; the test profile). Every cell is one synchronous run of \
         the `tiny` preset ({STEPS} steps, 2 workers, 2 servers, 4 for ecrec with k = 2, r = 2; \
         saves every {EVERY} steps) with the cell's SIGKILLs; the kills of each cell are in \
         `crates/cluster/tests/kill_matrix.rs` (`matrix`). A cell passes when every kill fired \
         (a `replacement` kill after the server's first loss was replaced), exact strategies \
         end with the failure-free digest, `cpr` and `cnr-q8` (8-bit quantized pieces) finish \
         with their PLS or quantization error reported (exact when no server was lost), `none` \
         ends with one error line naming the lost server, and no process or port is left \
         behind. The gray-failure columns: `pause` SIGSTOPs a server (`stop:server=1@step=4`) \
         instead of killing it: it is found lost by its heartbeats and fenced (its epoch \
         raised on every other server), then woken (SIGCONT): it must learn it was replaced \
         and exit by itself, and the run end as above; `second-run` (the coordinator \
         row) holds the store's lease from another live process after the job: a resume and a \
         fresh run are refused naming the holder, and once the holder is paused past its \
         lease the resume takes the store over, ends with the failure-free model, and the \
         paused holder's renewal is fenced; `gc-read` (the reader row) restores the newest \
         state in a loop while the job runs and collects garbage: every restore succeeds or \
         finds nothing committed yet, never a half-deleted checkpoint.\n\n\
         A partition is not a column: it needs a network namespace per role, servers started \
         outside the coordinator and reached by name, which the matrix's cells (processes the \
         coordinator starts on loopback) do not have. It is the cargo test \
         `crates/cli/tests/partition.rs` (`cargo test -p ftrec-cli --test partition`, root and \
         iproute2; otherwise it prints one `skipped:` line): server 1 loses its link to the \
         coordinator (a blackhole route each way) while the workers still reach it, is found \
         lost, fenced and replaced on another host under its name, learns from the workers \
         that it was replaced and exits with status 3 and one `fenced` line, and the job \
         (`full`, synchronous) ends with the failure-free digest.\n\n\
         The `pause` column of the coordinator row, and of deck's merger row, is a frozen \
         job, whose coordinator cannot run in this test's process: \
         `crates/cli/tests/frozen.rs`, which `scripts/kill-matrix.sh` runs before the matrix \
         (its results reach the table through `KILL_MATRIX_FROZEN`). The whole job \
         (coordinator, servers, workers, merger) is frozen after step 7 (`--kill \
         stop:job@step=7`, SIGSTOP to every process, as a paused host) until its lease (2 s) \
         runs out; `ftrec run --resume` takes the store over and ends with the failure-free \
         digest (cnr-q8: its quantized model); then the frozen job is woken (SIGCONT to its \
         process group): its coordinator stops at its first check with status 3, every error \
         line of the job names the fence, none of its processes is left, and the store is byte \
         for byte as the resume left it (no file written, none deleted) and verifies.\n\n\
         {pass} passed, \
         {fail} failed, {na} not applicable.\n\n"
    ));
    md.push_str("| strategy | role |");
    for p in PHASES {
        md.push_str(&format!(" {p} |"));
    }
    md.push_str("\n| --- | --- |");
    for _ in PHASES {
        md.push_str(" --- |");
    }
    md.push('\n');
    for r in rows {
        md.push_str(&r);
        md.push('\n');
    }
    md.push_str("\nWhy a cell does not apply:\n\n");
    for (i, why) in reasons.iter().enumerate() {
        md.push_str(&format!("{}. {why}\n", i + 1));
    }
    if let Ok(out) = std::env::var("KILL_MATRIX_OUT") {
        std::fs::write(&out, &md).unwrap();
    }
    println!("{md}");
    assert_eq!(fail, 0, "{fail} cells failed:\n{md}");
}
