//! Validated configurations: one server process ([`ServerSpec`]), one run ([`RunConfig`]) and
//! the faults to inject ([`KillSpec`]).

use std::net::SocketAddr;

use ftrec_ps::net::PeerAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use ftrec_core::{Optimizer, Preset};
use ftrec_data::TsvConfig;
use serde::{Deserialize, Serialize};

pub use crate::cpr::ServerPriority;
pub use crate::ecrec::EcServerSpec;
use crate::ClusterError;

/// Default staging chunk size, in KiB (DECK §3.2 sizes chunks like an SSD erase block).
pub const DEFAULT_CHUNK_KIB: usize = 4096;

/// Everything a server process needs to build and serve its shard. The launcher turns it into
/// the command line of `ftrec server` ([`ServerSpec::to_args`]); the server binary parses it
/// back with the one flag definition of `ftrec server` ([`crate::args::ServerArgs`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerSpec {
    pub id: u32,
    pub servers: u32,
    pub preset: String,
    /// Rows of every table instead of the preset's (a job on TSV data: the data layout's
    /// table sizes, capped by `--rows-per-table`; the preset gives the model shape).
    #[serde(default)]
    pub table_rows: Option<Vec<u64>>,
    pub seed: u64,
    pub sparse_optimizer: Optimizer,
    pub dense_optimizer: Optimizer,
    pub listen: SocketAddr,
    /// Where the bound address is written (atomically) once the server accepts requests.
    pub port_file: Option<PathBuf>,
    /// What ends the process.
    pub until: Lifetime,
    /// ECRec on this server (strategy `ecrec`): parities, dense replicas, 2PC, rebuilds.
    #[serde(default)]
    pub ec: Option<EcServerSpec>,
    /// Serve the checkpoint service too (DECK's server side: tracking, staging, save, restore).
    #[serde(default)]
    pub ckpt: Option<CkptSpec>,
    /// The token and job id the server demands and its own calls carry; given to a started
    /// process through its environment, never its command line (nor serialized).
    #[serde(skip)]
    pub auth: crate::auth::Auth,
    /// The CPUs its launcher starts it on (`None`: wherever the launcher may run); not an
    /// argument of the process, so not serialized.
    #[serde(skip)]
    pub cpus: Option<crate::cpus::CpuSet>,
}

/// A server's checkpoint service: where it stages chunks on local disk (DECK §3.2's SSD layer)
/// and how big a chunk is. Store credentials come from the usual AWS environment variables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CkptSpec {
    pub staging_dir: PathBuf,
    pub chunk_bytes: usize,
    /// CPR's priority rule for prioritized partial saves (strategy `cpr` with a priority).
    #[serde(default)]
    pub priority: Option<ServerPriority>,
}

/// What ends a server process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Lifetime {
    /// SIGINT or SIGTERM: a server started by hand or by a host's service manager.
    Signal,
    /// End of file on standard input (or a signal): the launcher holds the other end of the
    /// pipe, so a launcher that exits or dies takes its servers with it.
    Stdin,
}

impl FromStr for Lifetime {
    type Err = ClusterError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "signal" => Ok(Lifetime::Signal),
            "stdin" => Ok(Lifetime::Stdin),
            _ => Err(ClusterError::Config(format!(
                "--until must be signal or stdin, not {s:?}"
            ))),
        }
    }
}

impl std::fmt::Display for Lifetime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Lifetime::Signal => "signal",
            Lifetime::Stdin => "stdin",
        })
    }
}

impl ServerSpec {
    /// Server `id` of `servers` with the preset's optimizers.
    pub fn from_preset(
        preset: &Preset,
        id: u32,
        servers: u32,
        seed: u64,
    ) -> Result<ServerSpec, ClusterError> {
        let spec = ServerSpec {
            id,
            servers,
            preset: preset.name.clone(),
            table_rows: None,
            seed,
            sparse_optimizer: Optimizer::new(preset.sparse_optimizer, preset.sparse_lr),
            dense_optimizer: Optimizer::new(preset.dense_optimizer, preset.dense_lr),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            port_file: None,
            until: Lifetime::Signal,
            ckpt: None,
            ec: None,
            auth: crate::auth::Auth::none(),
            cpus: None,
        };
        spec.validate()?;
        Ok(spec)
    }

    pub fn validate(&self) -> Result<(), ClusterError> {
        if self.servers == 0 {
            return Err(ClusterError::Config("--servers must be at least 1".into()));
        }
        if self.id >= self.servers {
            return Err(ClusterError::Config(format!(
                "--id {} is not a server of {} (ids are 0..{})",
                self.id, self.servers, self.servers
            )));
        }
        let preset = self.preset()?;
        preset
            .validate()
            .map_err(|e| ClusterError::Config(format!("--table-rows: {e}")))?;
        for (flag, o) in [
            ("--optimizer", &self.sparse_optimizer),
            ("--dense-optimizer", &self.dense_optimizer),
        ] {
            o.validate()
                .map_err(|e| ClusterError::Config(format!("{flag}: {e}")))?;
        }
        if let Some(ec) = &self.ec {
            ec.validate(self.servers)?;
        }
        if let Some(c) = &self.ckpt {
            if c.chunk_bytes < 1024 {
                return Err(ClusterError::Config(format!(
                    "--ckpt-chunk-kib: a chunk of {} bytes is below 1 KiB",
                    c.chunk_bytes
                )));
            }
            if let Some(p) = &c.priority {
                p.validate()?;
            }
        }
        Ok(())
    }

    /// The preset the shard is built from: the named one, with [`ServerSpec::table_rows`] if
    /// given.
    pub fn preset(&self) -> Result<Preset, ClusterError> {
        let mut preset =
            Preset::by_name(&self.preset).map_err(|e| ClusterError::Config(e.to_string()))?;
        if let Some(rows) = &self.table_rows {
            if rows.len() != preset.table_rows.len() {
                return Err(ClusterError::Config(format!(
                    "--table-rows gives {} tables, the model has {}",
                    rows.len(),
                    preset.table_rows.len()
                )));
            }
            preset.table_rows = rows.clone();
        }
        Ok(preset)
    }

    /// The arguments of `ftrec server` (after the executable name) that rebuild this spec.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "server".to_string(),
            "--id".into(),
            self.id.to_string(),
            "--servers".into(),
            self.servers.to_string(),
            "--preset".into(),
            self.preset.clone(),
            "--seed".into(),
            self.seed.to_string(),
            "--optimizer".into(),
            self.sparse_optimizer.kind.to_string(),
            "--lr".into(),
            self.sparse_optimizer.lr.to_string(),
            "--dense-optimizer".into(),
            self.dense_optimizer.kind.to_string(),
            "--dense-lr".into(),
            self.dense_optimizer.lr.to_string(),
            "--listen".into(),
            self.listen.to_string(),
        ];
        for (flag, o) in [
            ("--initial-accumulator", &self.sparse_optimizer),
            ("--dense-initial-accumulator", &self.dense_optimizer),
        ] {
            if o.initial_accumulator != 0.0 {
                a.push(flag.into());
                a.push(o.initial_accumulator.to_string());
            }
        }
        a.push("--until".into());
        a.push(self.until.to_string());
        if let Some(rows) = &self.table_rows {
            a.push("--table-rows".into());
            a.push(
                rows.iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        if let Some(p) = &self.port_file {
            a.push("--port-file".into());
            a.push(p.display().to_string());
        }
        if let Some(ec) = &self.ec {
            a.extend(ec.to_args());
        }
        if let Some(c) = &self.ckpt {
            a.push("--ckpt-staging".into());
            a.push(c.staging_dir.display().to_string());
            a.push("--ckpt-chunk-kib".into());
            a.push((c.chunk_bytes / 1024).to_string());
            if let Some(p) = &c.priority {
                a.extend(p.to_args());
            }
        }
        a
    }
}

/// Which process a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Server,
    Worker,
    /// The merger process of `deck` (DECK §3.3); id 0.
    Merger,
    /// The whole job at once: every server, worker and merger, then the process that runs the
    /// coordinator itself (`job@step=S`, after a step only). What a crash of the machine does,
    /// at a point a script can rely on; the store keeps what was committed, and
    /// `ftrec run --resume` trains the rest. Only for a coordinator in a process of its own.
    Job,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Server => "server",
            Role::Worker => "worker",
            Role::Merger => "merger",
            Role::Job => "job",
        })
    }
}

/// A named phase of the run in which a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// While a checkpoint is being written (after it started, before it is committed).
    CheckpointWrite,
    /// While a recovery runs (after the replacements started, before the state is restored).
    Recovery,
    /// While the merger writes a merged or full checkpoint (`deck`), before its manifest.
    Merge,
    /// ECRec: just before phase 1 of a step's two-phase commit is sent (the server dies in
    /// phase 1; with `--no-2pc`, just before the one-phase apply).
    Prepare,
    /// ECRec: phase 1 answered by the first half of the servers (ids below `servers / 2`, at
    /// least one) and not yet sent to the others: a server dies while phase 1 reached some
    /// servers only (2PC only).
    PrepareSome,
    /// ECRec: after phase 1 of a step succeeded everywhere, before phase 2 is sent.
    Commit,
    /// ECRec: phase 2 answered by the first half of the servers, not yet sent to the others.
    CommitSome,
    /// ECRec: right after a replacement joined, while its background rebuild runs.
    Rebuild,
    /// `incrcp`, `incremental`, `cnr`: after an incremental piece's rows are copied out, while
    /// the servers upload it and (IncrCP) run its extraction round, before its commit.
    PieceWrite,
}

impl FromStr for Phase {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "checkpoint-write" => Ok(Phase::CheckpointWrite),
            "recovery" => Ok(Phase::Recovery),
            "merge" => Ok(Phase::Merge),
            "prepare" => Ok(Phase::Prepare),
            "commit" => Ok(Phase::Commit),
            "prepare-some" => Ok(Phase::PrepareSome),
            "commit-some" => Ok(Phase::CommitSome),
            "rebuild" => Ok(Phase::Rebuild),
            "piece-write" => Ok(Phase::PieceWrite),
            _ => Err(()),
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::CheckpointWrite => "checkpoint-write",
            Phase::Recovery => "recovery",
            Phase::Merge => "merge",
            Phase::Prepare => "prepare",
            Phase::Commit => "commit",
            Phase::PrepareSome => "prepare-some",
            Phase::CommitSome => "commit-some",
            Phase::Rebuild => "rebuild",
            Phase::PieceWrite => "piece-write",
        })
    }
}

/// When a fault fires.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KillAt {
    /// Right after step `S` completes (in asynchronous mode: once `S * workers` batches have).
    Step(u64),
    /// At the first scheduling point `T` seconds or more after training started.
    Time(f64),
    /// The first time the run enters the phase.
    Phase(Phase),
    /// The `N`-th time (from 1) the run enters the phase: `phase=NAME#N`.
    PhaseNth(Phase, u32),
}

/// A fault to inject: SIGKILL one process at a scheduled point. Written
/// `ROLE=I@step=S`, `ROLE=I@time=T` or
/// `ROLE=I@phase=checkpoint-write|recovery|merge|prepare|prepare-some|commit|commit-some|
/// rebuild|piece-write[#N]` (the `N`-th time the phase is entered, default the first; a
/// worker's phase kill counts that worker's transactions only), with ROLE
/// `server` or `worker` (for example `server=1@step=12`, `worker=0@time=2.5`), or the whole
/// job at once after a step: `job@step=S` ([`Role::Job`]). With the prefix `stop:` a server
/// is paused (SIGSTOP) instead: a gray failure, a process that is there and answers nothing
/// (`stop:server=1@step=4`); the coordinator finds it lost by its heartbeats, fences it (its
/// epoch raised on every other server, `ftrec_ps::fence`) and wakes it (SIGCONT): it learns
/// it was replaced and exits by itself, and a replacement takes its place. `stop:job@step=S`
/// freezes the whole job after step `S` (its merger, workers, servers and coordinator
/// SIGSTOPped, as a paused host) for whoever wakes it: meanwhile another coordinator may have
/// taken the store over (`--resume` once the lease expired), and the woken job must find out
/// and stop without writing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct KillSpec {
    pub role: Role,
    pub id: u32,
    pub at: KillAt,
    /// SIGSTOP instead of SIGKILL.
    pub pause: bool,
}

impl KillSpec {
    /// Parse one `--kill`: a [`KillSpec`], or several servers failing together,
    /// `server=0,2@step=S` (any point and the `stop:` prefix as for one server): one spec per
    /// server, all at the same point, so one failure takes them all at once (CPR §5.1 clears
    /// 12.5-50% of the tables at a time).
    pub fn parse_many(s: &str) -> Result<Vec<KillSpec>, ClusterError> {
        let (prefix, rest) = match s.strip_prefix("stop:") {
            Some(r) => ("stop:", r),
            None => ("", s),
        };
        let Some((ids, when)) = rest
            .strip_prefix("server=")
            .and_then(|r| r.split_once('@'))
            .filter(|(ids, _)| ids.contains(','))
        else {
            return Ok(vec![s.parse()?]);
        };
        let mut out: Vec<KillSpec> = Vec::new();
        for id in ids.split(',') {
            if id.parse::<u32>().is_err() {
                return Err(ClusterError::Config(format!(
                    "--kill {s:?}: {id:?} is not a server id; expected server=I,J,..@POINT \
                     with distinct numbers (for example server=0,2@step=12)"
                )));
            }
            let k: KillSpec = format!("{prefix}server={id}@{when}").parse()?;
            if out.iter().any(|o| o.id == k.id) {
                return Err(ClusterError::Config(format!(
                    "--kill {s:?}: server {} is named twice",
                    k.id
                )));
            }
            out.push(k);
        }
        Ok(out)
    }

    /// Kill server `id` after step `step`.
    pub fn server_at_step(id: u32, step: u64) -> KillSpec {
        KillSpec {
            role: Role::Server,
            id,
            at: KillAt::Step(step),
            pause: false,
        }
    }
}

impl std::fmt::Display for KillSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pause {
            write!(f, "stop:")?;
        }
        match self.role {
            Role::Job => write!(f, "job@")?,
            _ => write!(f, "{}={}@", self.role, self.id)?,
        }
        match self.at {
            KillAt::Step(s) => write!(f, "step={s}"),
            KillAt::Time(t) => write!(f, "time={t}"),
            KillAt::Phase(p) => write!(f, "phase={p}"),
            KillAt::PhaseNth(p, n) => write!(f, "phase={p}#{n}"),
        }
    }
}

impl From<KillSpec> for String {
    fn from(k: KillSpec) -> String {
        k.to_string()
    }
}

impl TryFrom<String> for KillSpec {
    type Error = ClusterError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl FromStr for KillSpec {
    type Err = ClusterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            ClusterError::Config(format!(
                "--kill {s:?}: {why}; expected ROLE=I@step=S, ROLE=I@time=T or \
                 ROLE=I@phase=checkpoint-write|recovery|merge|prepare|commit|rebuild[#N] with \
                 ROLE server, worker or merger (for example server=1@step=12), or job@step=S; \
                 stop:server=I@... pauses a server instead, stop:job@step=S the whole job"
            ))
        };
        let (pause, rest) = match s.strip_prefix("stop:") {
            Some(r) => (true, r),
            None => (false, s),
        };
        let (who, when) = rest.split_once('@').ok_or_else(|| bad("no '@'"))?;
        let (role, id) = match who {
            "job" => (Role::Job, 0),
            _ => {
                let (role, id) = who.split_once('=').ok_or_else(|| bad("no ROLE=I"))?;
                let role = match role {
                    "server" => Role::Server,
                    "worker" => Role::Worker,
                    "merger" => Role::Merger,
                    _ => return Err(bad("unknown role")),
                };
                (role, id.parse().map_err(|_| bad("the id is not a number"))?)
            }
        };
        let (kind, value) = when.split_once('=').ok_or_else(|| bad("no point"))?;
        let at = match kind {
            "step" => KillAt::Step(value.parse().map_err(|_| bad("bad step"))?),
            "time" => {
                let t: f64 = value.parse().map_err(|_| bad("bad time"))?;
                if !(t.is_finite() && t >= 0.0) {
                    return Err(bad("the time must be a non-negative number of seconds"));
                }
                KillAt::Time(t)
            }
            "phase" => match value.split_once('#') {
                None => KillAt::Phase(value.parse().map_err(|_| bad("unknown phase"))?),
                Some((name, n)) => {
                    let n: u32 = n
                        .parse()
                        .ok()
                        .filter(|&n| n >= 1)
                        .ok_or_else(|| bad("the occurrence after '#' must be 1 or more"))?;
                    KillAt::PhaseNth(name.parse().map_err(|_| bad("unknown phase"))?, n)
                }
            },
            _ => return Err(bad("unknown point")),
        };
        if role == Role::Job && !matches!(at, KillAt::Step(_)) {
            return Err(bad(
                "the whole job is killed after a step only (job@step=S)",
            ));
        }
        if pause && !matches!(role, Role::Server | Role::Job) {
            return Err(bad(
                "only a server (stop:server=I@...) or the whole job (stop:job@step=S) is paused",
            ));
        }
        Ok(KillSpec {
            role,
            id,
            at,
            pause,
        })
    }
}

/// Check-N-Run's default base reset: a new full once a differential passes half the full.
pub const DEFAULT_CNR_RESET_FRACTION: f64 = 0.5;
/// IncrCP's extraction threshold `R` (incrcp.txt §4.3, 0.02 in the paper's runs).
pub const DEFAULT_EXTRACT_THRESHOLD: f64 = 0.02;

/// Which fault-tolerance strategy the coordinator runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum StrategyChoice {
    /// A server loss ends the run.
    None,
    /// Full checkpoints every `every_steps` steps and full recovery (CPR §2.2).
    Full { every_steps: u64 },
    /// ECRec (ecrec.txt §3): rows erasure-coded in stripes of `k` data and `r` parity rows
    /// across the servers, dense blocks replicated, a lost server rebuilt from the survivors
    /// while training goes on. Synchronous mode only (see [`crate::ecrec`]).
    EcRec {
        k: usize,
        r: usize,
        #[serde(with = "crate::ecrec::code_serde")]
        code: ftrec_ec::CodeKind,
        /// Copies of every dense range on the next `r` servers (ECRec §3.3).
        dense_replication: bool,
        /// Two-phase commit of every step (ECRec §3.5).
        two_phase: bool,
        /// Lock ranges of a rebuild (ECRec §3.4).
        lock_ranges: usize,
        /// Share of the time a background rebuild may work, in millionths (rate control:
        /// the rebuild yields to training; 0 holds the lock ranges until training ends).
        #[serde(default = "crate::ecrec::default_rebuild_share_ppm")]
        rebuild_share_ppm: u32,
        /// Training throughput the coordinator's pacer keeps during a rebuild, in millionths
        /// of the throughput before the failure: the share starts at `rebuild_share_ppm` and
        /// follows it (`None`: the share stays `rebuild_share_ppm`).
        #[serde(default)]
        rebuild_min_throughput_ppm: Option<u32>,
        /// ECRec §4's second layer: a full checkpoint every this many steps (while no rebuild
        /// runs), restored on every server when more than `r` are lost at once (`None`: such a
        /// loss ends the run).
        #[serde(default)]
        backstop_every_steps: Option<u64>,
    },
    /// DECK: a full base, then delta checkpoints of the touched rows every
    /// `delta_every_steps` steps, written by the servers through local staging while training
    /// goes on; a merger process merges every `merge_stride` deltas of one layer (none: no
    /// merger) and writes a full once the chain covers `full_every_deltas`; recovery restores
    /// every server to the newest committed delta (deck.txt §3–§4).
    Deck {
        delta_every_steps: u64,
        full_every_deltas: Option<u64>,
        merge_stride: Option<u64>,
        /// Cap on the merger's write rate, in MiB/s (none: unthrottled), so merging does not
        /// compete with training for the disk.
        merge_mib_per_s: Option<f64>,
    },
    /// CPR (cpr.txt §2.3, §4): full saves of every shard every `interval` (a step count, or
    /// `2 * PLS * servers * MTBF` seconds for a target PLS, Eq. 4), written by the servers'
    /// checkpoint service; with a `priority` rule, `saves_per_full - 1` prioritized saves of
    /// `r` of each of the `largest_tables` largest tables' rows in between (MFU, SSU with
    /// sampling period `ssu_period`, or SCAR, §4.2); a lost server is replaced and only its
    /// shard restored, from the newest save of each row, while training goes on (partial
    /// recovery: no rollback, no redo).
    Cpr {
        interval: ftrec_strategy::CprInterval,
        priority: Option<ftrec_ckpt::cpr::Priority>,
        r: f64,
        saves_per_full: u64,
        ssu_period: u32,
        largest_tables: usize,
    },
    /// Naive incremental checkpoints (incrcp.txt §2.2): a full, then every `every_steps` steps
    /// a piece of the rows touched since the previous save, written by the servers while
    /// training goes on; a restore replays every piece since the full, oldest first. A new
    /// full every `full_every_pieces` pieces (none: never).
    Incremental {
        every_steps: u64,
        full_every_pieces: Option<u64>,
    },
    /// Check-N-Run's differential checkpoints: every piece holds every row touched since the
    /// last full, so a restore reads the full and the newest piece; a new full once a piece
    /// passes `reset_fraction` of the full's bytes (none: never). `quant_bits` 8 or 4 stores
    /// the pieces' values quantized (restores are then approximate).
    Cnr {
        every_steps: u64,
        reset_fraction: Option<f64>,
        quant_bits: Option<u8>,
    },
    /// IncrCP (incrcp.txt §4): pieces of the rows touched since the previous save in a 2-D
    /// chunk list per row range (`range_rows` local rows, 0: a table shard), selective
    /// extraction with threshold `threshold` on the servers in the background, bundles if
    /// `concat`; a new full when the §4.5 rule says so (`reset`).
    IncrCp {
        every_steps: u64,
        reset: ftrec_strategy::BaseReset,
        threshold: f64,
        range_rows: u64,
        concat: bool,
    },
}

impl StrategyChoice {
    /// The name `--strategy` takes.
    pub fn name(&self) -> &'static str {
        match self {
            StrategyChoice::None => "none",
            StrategyChoice::Full { .. } => "full",
            StrategyChoice::Deck { .. } => "deck",
            StrategyChoice::EcRec { .. } => "ecrec",
            StrategyChoice::Cpr { .. } => "cpr",
            StrategyChoice::Incremental { .. } => "incremental",
            StrategyChoice::Cnr { .. } => "cnr",
            StrategyChoice::IncrCp { .. } => "incrcp",
        }
    }

    /// `ecrec` with the exact code over stripes of 2 data rows and 1 parity, dense
    /// replication and 2PC on, one lock range.
    pub fn ecrec_default() -> StrategyChoice {
        let target = (crate::ecrec::DEFAULT_REBUILD_MIN_THROUGHPUT
            * f64::from(ftrec_ps::ec::FULL_SHARE_PPM))
        .round() as u32;
        StrategyChoice::EcRec {
            k: crate::ecrec::DEFAULT_K,
            r: crate::ecrec::DEFAULT_R,
            code: ftrec_ec::CodeKind::Gf256,
            dense_replication: true,
            two_phase: true,
            lock_ranges: crate::ecrec::DEFAULT_LOCK_RANGES,
            rebuild_share_ppm: crate::ecrec::paced_start_share_ppm(target),
            rebuild_min_throughput_ppm: Some(target),
            backstop_every_steps: None,
        }
    }

    /// Every name [`StrategyChoice::parse`] accepts, in the order reports list them: the one
    /// list of strategies (`ftrec compare` runs them all by default, so a strategy added here
    /// is compared with no other change).
    pub fn all_names() -> &'static [&'static str] {
        &[
            "none",
            "full",
            "deck",
            "ecrec",
            "cpr",
            "incrcp",
            "incremental",
            "cnr",
        ]
    }
    /// `none`, `full` (with the checkpoint interval `every_steps`), `deck` (a delta every
    /// `every_steps`, a merger with stride 2, no full from the trainer after the first),
    /// `ecrec` (with [`StrategyChoice::ecrec_default`]'s code, to be adjusted by its flags),
    /// `cpr` (CPR-vanilla, a full save every `every_steps`; [`crate::cpr::CprFlags`] for the
    /// rest), or `incrcp`, `incremental`, `cnr` (a piece every `every_steps`, the papers'
    /// defaults).
    pub fn parse(name: &str, every_steps: u64) -> Result<StrategyChoice, ClusterError> {
        match name {
            "none" => Ok(StrategyChoice::None),
            "full" => Ok(StrategyChoice::Full { every_steps }),
            "deck" => Ok(StrategyChoice::Deck {
                delta_every_steps: every_steps,
                full_every_deltas: None,
                merge_stride: Some(2),
                merge_mib_per_s: None,
            }),
            "ecrec" => Ok(StrategyChoice::ecrec_default()),
            "cpr" => crate::cpr::CprFlags {
                every_steps: Some(every_steps),
                ..Default::default()
            }
            .strategy(),
            "incremental" => Ok(StrategyChoice::Incremental {
                every_steps,
                full_every_pieces: None,
            }),
            "cnr" => Ok(StrategyChoice::Cnr {
                every_steps,
                reset_fraction: Some(DEFAULT_CNR_RESET_FRACTION),
                quant_bits: None,
            }),
            "incrcp" => Ok(StrategyChoice::IncrCp {
                every_steps,
                reset: ftrec_strategy::BaseReset::Auto,
                threshold: DEFAULT_EXTRACT_THRESHOLD,
                range_rows: 0,
                concat: true,
            }),
            other => Err(ClusterError::Config(format!(
                "unknown strategy {other:?} (expected one of {})",
                StrategyChoice::all_names().join(", ")
            ))),
        }
    }

    /// Whether the strategy saves checkpoints: then the servers run the checkpoint service and
    /// the run has a store. Every strategy but `none` and `ecrec` (which keeps its redundancy
    /// in memory) saves; `ecrec` does with a backstop.
    pub fn uses_store(&self) -> bool {
        match self {
            StrategyChoice::None => false,
            StrategyChoice::EcRec {
                backstop_every_steps,
                ..
            } => backstop_every_steps.is_some(),
            _ => true,
        }
    }

    /// Whether the strategy saves incremental pieces over a full (`incrcp`, `incremental`,
    /// `cnr`).
    pub fn saves_pieces(&self) -> bool {
        matches!(
            self,
            StrategyChoice::Incremental { .. }
                | StrategyChoice::Cnr { .. }
                | StrategyChoice::IncrCp { .. }
        )
    }

    /// The merger the strategy runs after commits (DECK §3.3), if any.
    pub fn merger(&self) -> Option<MergeSettings> {
        match *self {
            StrategyChoice::Deck {
                full_every_deltas,
                merge_stride: Some(stride),
                merge_mib_per_s,
                ..
            } => Some(MergeSettings {
                stride,
                full_every_deltas,
                mib_per_s: merge_mib_per_s,
            }),
            _ => None,
        }
    }
}

/// How a strategy's merger process merges (DECK §3.3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MergeSettings {
    /// Merge every `stride` consecutive checkpoints of one layer.
    pub stride: u64,
    /// Write a full once the active chain covers this many deltas.
    pub full_every_deltas: Option<u64>,
    /// Cap on the merger's write rate, in MiB/s.
    pub mib_per_s: Option<f64>,
}

/// One multi-process run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub preset: Preset,
    pub servers: u32,
    pub workers: u32,
    /// Synchronous deterministic mode: every step's contributions are staged and committed in
    /// worker order before the next step starts, so the run is bit-reproducible. Without it
    /// (asynchronous, as XDL and ECRec train) each worker pulls, computes and pushes its next
    /// batch as soon as it is free, against whatever the servers hold at that moment.
    pub sync: bool,
    pub strategy: StrategyChoice,
    pub kills: Vec<KillSpec>,
    pub steps: u64,
    /// Samples per worker per step.
    pub batch: usize,
    pub seed: u64,
    pub sparse_optimizer: Optimizer,
    pub dense_optimizer: Optimizer,
    /// Held-out samples for AUC and logloss (0 skips the evaluation).
    pub eval_samples: usize,
    /// Executable started as `EXE server ...` for every server process and `EXE worker ...`
    /// for every worker process.
    pub exe: PathBuf,
    /// Port files, the servers' staging directories and the default store live here.
    pub work_dir: PathBuf,
    /// The checkpoint store of a saving strategy: a directory, `file://` or
    /// `s3://bucket/prefix` URL (default: `work_dir/ckpt`). S3 endpoint and credentials come
    /// from the usual AWS environment variables, which the servers and the merger inherit.
    #[serde(default)]
    pub store: Option<String>,
    /// Staging chunk size of the servers' checkpoint service, in KiB.
    #[serde(default = "default_chunk_kib")]
    pub ckpt_chunk_kib: usize,
    /// Interval of the heartbeat probes.
    #[serde(with = "millis")]
    pub heartbeat: Duration,
    /// A probe unanswered this long declares the server lost.
    #[serde(with = "millis")]
    pub heartbeat_timeout: Duration,
    /// Longest wait for a started server to write its port file.
    #[serde(with = "millis")]
    pub start_timeout: Duration,
    /// The store's writer lease lives this long without renewal; the coordinator renews it
    /// every third of it and stops writing when it cannot.
    #[serde(with = "millis", default = "default_lease_ttl")]
    pub lease_ttl: Duration,
    /// Longest wait for a save's uploads, in seconds (`None`: sized to the save, 60 s plus a
    /// second per 16 MiB copied out).
    #[serde(default)]
    pub save_timeout_s: Option<f64>,
    /// Threads of the matrix kernels in each worker.
    pub threads: usize,
    /// Nice value of each worker's compute threads (0: none of its own; see
    /// [`DEFAULT_COMPUTE_NICE`]).
    #[serde(default = "default_compute_nice")]
    pub compute_nice: i32,
    /// The CPUs the servers it starts run on (`--server-cpus`; `None`: any).
    #[serde(default)]
    pub server_cpus: Option<crate::cpus::CpuSet>,
    /// The CPUs the workers it starts run on (`--worker-cpus`; `None`: any).
    #[serde(default)]
    pub worker_cpus: Option<crate::cpus::CpuSet>,
    /// Servers started elsewhere (`ftrec server` on other hosts), in server order; empty: the
    /// coordinator starts its own. A lost external server is waited for at its address.
    #[serde(default)]
    pub external_servers: Vec<PeerAddr>,
    /// Workers are started elsewhere (`ftrec worker --coordinator ADDR --id W`) and connect
    /// to `control_listen`; a lost one is waited for until it reconnects.
    #[serde(default)]
    pub external_workers: bool,
    /// The coordinator's control socket, which workers connect to.
    #[serde(default = "default_control")]
    pub control_listen: SocketAddr,
    /// Width of the throughput timeline's intervals, in seconds.
    #[serde(default = "default_interval")]
    pub report_interval_s: f64,
    /// The run's token and job id (a job id is made up at start when none is given); every
    /// process gets them through its environment. Never serialized.
    #[serde(skip)]
    pub auth: crate::auth::Auth,
    /// Criteo TSV training data (`--data`; none: the synthetic generator of the preset). The
    /// preset's table sizes must be the reader's ([`RunConfig::with_data`]); the held-out
    /// lines are the evaluation set. Every worker reads these paths on its own host.
    #[serde(default)]
    pub data: Option<TsvConfig>,
}

fn default_control() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// The nice value a worker's compute threads take by default: they yield the CPU to its
/// messages (the thread that runs its RPCs stays at the default priority) and to the servers
/// on a shared host, so a transaction's round trips are not queued behind the batches being
/// computed (`docs/DESIGN.md`, "Compute below messages").
pub const DEFAULT_COMPUTE_NICE: i32 = 19;

/// The highest nice value (the lowest priority).
pub const MAX_COMPUTE_NICE: i32 = 19;

fn default_compute_nice() -> i32 {
    DEFAULT_COMPUTE_NICE
}

fn default_interval() -> f64 {
    1.0
}

fn default_lease_ttl() -> Duration {
    ftrec_ckpt::lease::DEFAULT_TTL
}

fn default_chunk_kib() -> usize {
    DEFAULT_CHUNK_KIB
}

pub(crate) mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

impl RunConfig {
    /// Defaults for `preset`: the preset's batch, steps, optimizers and held-out samples, 2
    /// servers, 1 worker, synchronous, no fault tolerance, no kills.
    pub fn new(preset: Preset, exe: PathBuf, work_dir: PathBuf) -> RunConfig {
        RunConfig {
            servers: 2,
            workers: 1,
            sync: true,
            strategy: StrategyChoice::None,
            kills: Vec::new(),
            steps: preset.steps,
            batch: preset.batch,
            seed: 1,
            sparse_optimizer: Optimizer::new(preset.sparse_optimizer, preset.sparse_lr),
            dense_optimizer: Optimizer::new(preset.dense_optimizer, preset.dense_lr),
            eval_samples: preset.eval_samples,
            preset,
            exe,
            work_dir,
            store: None,
            ckpt_chunk_kib: DEFAULT_CHUNK_KIB,
            heartbeat: Duration::from_millis(100),
            heartbeat_timeout: Duration::from_millis(1000),
            start_timeout: Duration::from_secs(30),
            lease_ttl: default_lease_ttl(),
            save_timeout_s: None,
            threads: 1,
            compute_nice: DEFAULT_COMPUTE_NICE,
            server_cpus: None,
            worker_cpus: None,
            external_servers: Vec::new(),
            external_workers: false,
            control_listen: default_control(),
            report_interval_s: default_interval(),
            auth: crate::auth::Auth::none(),
            data: None,
        }
    }

    /// Train on `tsv`: the model's tables take the reader's sizes (the preset keeps giving the
    /// model shape).
    pub fn with_data(mut self, tsv: TsvConfig) -> RunConfig {
        self.preset.table_rows = tsv.table_rows.clone();
        self.data = Some(tsv);
        self
    }

    /// Check every field; the error names the offending one.
    pub fn validate(&self) -> Result<(), ClusterError> {
        let bad = |m: String| Err(ClusterError::Config(m));
        self.preset
            .validate()
            .map_err(|e| ClusterError::Config(e.to_string()))?;
        if self.servers == 0 || self.servers > 64 {
            return bad(format!(
                "--servers {} must be between 1 and 64",
                self.servers
            ));
        }
        if self.workers == 0 || self.workers > 64 {
            return bad(format!(
                "--workers {} must be between 1 and 64",
                self.workers
            ));
        }
        if self.steps == 0 {
            return bad("--steps must be at least 1".into());
        }
        if let Some(tsv) = &self.data {
            tsv.validate()
                .map_err(|e| ClusterError::Config(format!("--data: {e}")))?;
            if tsv.table_rows != self.preset.table_rows {
                return bad(
                    "the model's table sizes differ from the TSV data's (RunConfig::with_data \
                     sets them)"
                        .into(),
                );
            }
            if tsv.holdout_every == 0 && self.eval_samples > 0 {
                return bad(
                    "--holdout-every 0 holds no line out for evaluation; give --eval-samples 0 \
                     to train without one"
                        .into(),
                );
            }
        }
        if self.batch == 0 || self.batch > crate::worker::MAX_BATCH {
            return bad(format!(
                "--batch must be between 1 and {}",
                crate::worker::MAX_BATCH
            ));
        }
        if self.threads == 0 || self.threads > 256 {
            return bad("--threads must be between 1 and 256".into());
        }
        if !(0..=MAX_COMPUTE_NICE).contains(&self.compute_nice) {
            return bad(format!(
                "--compute-nice must be between 0 (compute at the workers' own priority) and \
                 {MAX_COMPUTE_NICE} (the lowest), got {}",
                self.compute_nice
            ));
        }
        for (cpus, flag, elsewhere) in [
            (
                &self.server_cpus,
                "--server-cpus",
                !self.external_servers.is_empty(),
            ),
            (&self.worker_cpus, "--worker-cpus", self.external_workers),
        ] {
            let Some(cpus) = cpus else { continue };
            if elsewhere {
                return bad(format!(
                    "{flag} places the processes this job starts, and these are started \
                     elsewhere: drop {flag}"
                ));
            }
            cpus.check_allowed(flag)?;
        }
        match self.strategy {
            StrategyChoice::Full { every_steps: 0 }
            | StrategyChoice::Incremental { every_steps: 0, .. }
            | StrategyChoice::Cnr { every_steps: 0, .. }
            | StrategyChoice::IncrCp { every_steps: 0, .. } => {
                return bad("--ckpt-every-steps must be at least 1".into());
            }
            StrategyChoice::Incremental {
                full_every_pieces: Some(0),
                ..
            }
            | StrategyChoice::IncrCp {
                reset: ftrec_strategy::BaseReset::EveryPieces(0),
                ..
            } => return bad("--base-reset must be at least 1 piece".into()),
            StrategyChoice::Cnr {
                reset_fraction,
                quant_bits,
                ..
            } => {
                if reset_fraction.is_some_and(|f| !(f.is_finite() && f > 0.0)) {
                    return bad(
                        "--cnr-reset-fraction must be a positive share of the full (0 turns \
                         resets off)"
                            .into(),
                    );
                }
                if quant_bits.is_some_and(|b| b != 8 && b != 4) {
                    return bad("--quantize must be 8 or 4".into());
                }
            }
            StrategyChoice::IncrCp { threshold, .. }
                if !(threshold.is_finite() && (0.0..=1.0).contains(&threshold)) =>
            {
                return bad(format!(
                    "--extract-threshold {threshold} must be between 0 and 1"
                ));
            }
            StrategyChoice::Deck {
                delta_every_steps,
                full_every_deltas,
                merge_stride,
                merge_mib_per_s,
            } => {
                if delta_every_steps == 0 {
                    return bad("--delta-every-steps must be at least 1".into());
                }
                if full_every_deltas == Some(0) {
                    return bad("--full-every must be at least 1".into());
                }
                if merge_stride.is_some_and(|s| s < 2) {
                    return bad("--merge-stride must be at least 2 (0 turns merging off)".into());
                }
                if merge_mib_per_s.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
                    return bad("--merge-mib-per-s must be a positive number".into());
                }
            }
            _ => {}
        }
        if self.store.is_some() && !self.strategy.uses_store() {
            return bad(format!(
                "--store applies to strategies that save checkpoints, not {}",
                self.strategy.name()
            ));
        }
        if self.strategy.uses_store() && self.ckpt_chunk_kib == 0 {
            return bad("--ckpt-chunk-kib must be at least 1".into());
        }
        crate::ecrec::validate_run(self)?;
        crate::cpr::validate_run(self)?;
        for k in &self.kills {
            let count = match k.role {
                Role::Server => self.servers,
                Role::Worker => self.workers,
                Role::Merger => {
                    if self.strategy.merger().is_none() {
                        return bad(format!(
                            "--kill {k}: only a strategy that merges (deck with merging) runs \
                             a merger"
                        ));
                    }
                    1
                }
                Role::Job => {
                    if !self.external_servers.is_empty() || self.external_workers {
                        return bad(format!(
                            "--kill {k}: only a job whose servers and workers this coordinator \
                             started can be killed or frozen as a whole"
                        ));
                    }
                    1
                }
            };
            if k.id >= count {
                return bad(format!("--kill {k}: there are only {}s 0..{count}", k.role));
            }
            if let KillAt::Step(step) = k.at {
                if step == 0 || step >= self.steps {
                    return bad(format!(
                        "--kill {k}: the step must be in 1..{} (a kill after the last step \
                         would not be noticed)",
                        self.steps
                    ));
                }
            }
            if !self.external_servers.is_empty()
                && k.role == Role::Server
                && !matches!(k.at, KillAt::Step(_))
            {
                return bad(format!(
                    "--kill {k}: servers this coordinator did not start cannot be killed by it \
                     (a step kill, server=I@step=S, makes the job wait there for their loss)"
                ));
            }
            if self.external_workers && k.role == Role::Worker {
                return bad(format!(
                    "--kill {k}: workers this coordinator did not start cannot be killed by it"
                ));
            }
        }
        if !self.external_servers.is_empty() && self.external_servers.len() != self.servers as usize
        {
            return bad(format!(
                "{} server addresses given for --servers {}",
                self.external_servers.len(),
                self.servers
            ));
        }
        if !(self.report_interval_s.is_finite() && self.report_interval_s > 0.0) {
            return bad(format!(
                "the report interval {} must be a positive number of seconds",
                self.report_interval_s
            ));
        }
        if self.heartbeat.is_zero() || self.heartbeat_timeout.is_zero() {
            return bad("heartbeat interval and timeout must be positive".into());
        }
        for (flag, o) in [
            ("--optimizer", &self.sparse_optimizer),
            ("--dense-optimizer", &self.dense_optimizer),
        ] {
            o.validate()
                .map_err(|e| ClusterError::Config(format!("{flag}: {e}")))?;
        }
        Ok(())
    }

    /// The checkpoint store's location.
    /// How long a blocking wait for the uploads of a save of `bytes` copied-out bytes may
    /// take: the configured timeout, or 60 s plus a second per 16 MiB.
    pub fn save_wait(&self, bytes: u64) -> Duration {
        match self.save_timeout_s {
            Some(s) => Duration::from_secs_f64(s),
            None => Duration::from_secs(60) + Duration::from_secs(bytes >> 24),
        }
    }

    pub fn store_location(&self) -> String {
        self.store
            .clone()
            .unwrap_or_else(|| self.work_dir.join("ckpt").display().to_string())
    }

    /// The spec of server `id` (listening on a free port of 127.0.0.1).
    pub fn server_spec(&self, id: u32) -> ServerSpec {
        ServerSpec {
            id,
            servers: self.servers,
            preset: self.preset.name.clone(),
            table_rows: self.data.as_ref().map(|_| self.preset.table_rows.clone()),
            seed: self.seed,
            sparse_optimizer: self.sparse_optimizer,
            dense_optimizer: self.dense_optimizer,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            port_file: None,
            until: Lifetime::Stdin,
            ckpt: self.strategy.uses_store().then(|| CkptSpec {
                staging_dir: self.work_dir.join(format!("staging-{id}")),
                chunk_bytes: self.ckpt_chunk_kib.saturating_mul(1024),
                priority: ServerPriority::of_strategy(&self.strategy),
            }),
            ec: EcServerSpec::of_strategy(&self.strategy),
            auth: self.auth.clone(),
            cpus: self.server_cpus.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_specs_parse_and_bad_ones_name_the_format() {
        assert_eq!(
            "server=1@step=12".parse::<KillSpec>().unwrap(),
            KillSpec::server_at_step(1, 12)
        );
        for text in [
            "server=1@step=12",
            "worker=0@time=2.5",
            "server=2@phase=checkpoint-write",
            "worker=3@phase=recovery",
            "server=1@phase=checkpoint-write#3",
            "merger=0@phase=merge",
            "job@step=40",
        ] {
            let k: KillSpec = text.parse().unwrap();
            assert_eq!(k.to_string(), text);
        }
        assert_eq!(
            "worker=0@time=2.5".parse::<KillSpec>().unwrap().at,
            KillAt::Time(2.5)
        );
        for bad in [
            "server=1",
            "coordinator=1@step=2",
            "server=x@step=2",
            "server=1@step=",
            "server=1@time=-1",
            "server=1@phase=lunch",
            "server=1@phase=merge#0",
            "server=1@phase=merge#x",
            "job@time=2",
            "job@phase=merge",
            "job=0@step=3",
        ] {
            let e = bad.parse::<KillSpec>().unwrap_err();
            assert!(e.to_string().contains("ROLE=I@step=S"), "{e}");
        }
    }

    #[test]
    fn several_servers_fail_at_one_point() {
        assert_eq!(
            KillSpec::parse_many("server=0,2@step=12").unwrap(),
            vec![
                KillSpec::server_at_step(0, 12),
                KillSpec::server_at_step(2, 12)
            ]
        );
        let stopped = KillSpec::parse_many("stop:server=1,3@phase=checkpoint-write#2").unwrap();
        assert_eq!(
            stopped.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
            [
                "stop:server=1@phase=checkpoint-write#2",
                "stop:server=3@phase=checkpoint-write#2"
            ]
        );
        // One server, or any other role: what `KillSpec` parses.
        assert_eq!(
            KillSpec::parse_many("worker=1@step=3").unwrap(),
            vec!["worker=1@step=3".parse::<KillSpec>().unwrap()]
        );
        for (bad, what) in [
            ("server=0,x@step=2", "\"x\" is not a server id"),
            ("server=0,@step=2", "\"\" is not a server id"),
            ("server=1,1@step=2", "server 1 is named twice"),
            ("worker=0,1@step=2", "ROLE=I@step=S"),
            ("server=0,1@lunch=2", "unknown point"),
        ] {
            let e = KillSpec::parse_many(bad).unwrap_err().to_string();
            assert!(e.contains(what), "{bad}: {e}");
        }
    }

    #[test]
    fn server_spec_round_trips_through_its_arguments() {
        let mut spec = ServerSpec::from_preset(&Preset::tiny(), 1, 3, 42).unwrap();
        spec.port_file = Some(PathBuf::from("/tmp/x.port"));
        spec.sparse_optimizer.lr = 0.125;
        assert_eq!(ServerSpec::from_args(&spec.to_args()).unwrap(), spec);
        // Both accumulators reach the server (the preset's optimizers are Adagrad's).
        spec.dense_optimizer.initial_accumulator = 0.1;
        spec.sparse_optimizer.initial_accumulator = 0.25;
        assert_eq!(ServerSpec::from_args(&spec.to_args()).unwrap(), spec);
        spec.table_rows = Some((1..=26).collect());
        assert_eq!(ServerSpec::from_args(&spec.to_args()).unwrap(), spec);
        spec.table_rows = Some(vec![5; 3]);
        assert!(matches!(spec.validate(), Err(ClusterError::Config(m)) if m.contains("3 tables")));
        spec.table_rows = Some((1..=26).collect());
        spec.ckpt = Some(CkptSpec {
            staging_dir: PathBuf::from("/tmp/staging"),
            chunk_bytes: 64 << 10,
            priority: Some(ServerPriority {
                priority: ftrec_ckpt::cpr::Priority::Ssu,
                r: 0.2,
                ssu_period: 3,
                largest_tables: 5,
            }),
        });
        assert_eq!(ServerSpec::from_args(&spec.to_args()).unwrap(), spec);
    }

    #[test]
    fn server_spec_refuses_an_id_outside_the_cluster_and_unknown_flags() {
        let spec = ServerSpec::from_preset(&Preset::tiny(), 0, 2, 1).unwrap();
        let mut args = spec.to_args();
        let i = args.iter().position(|a| a == "--id").unwrap();
        args[i + 1] = "2".into();
        assert!(ServerSpec::from_args(&args)
            .unwrap_err()
            .to_string()
            .contains("--id 2"));
        let mut args = spec.to_args();
        args.push("--bogus".into());
        args.push("1".into());
        assert!(matches!(
            ServerSpec::from_args(&args),
            Err(ClusterError::Config(m)) if m.contains("--bogus")
        ));
    }

    #[test]
    fn every_listed_name_parses_to_itself_and_nothing_else_does() {
        for &name in StrategyChoice::all_names() {
            assert_eq!(StrategyChoice::parse(name, 5).unwrap().name(), name);
        }
        let names = StrategyChoice::all_names();
        let mut sorted = names.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "duplicate names in {names:?}");
        let e = StrategyChoice::parse("fulll", 5).unwrap_err().to_string();
        for &name in names {
            assert!(e.contains(name), "{e}");
        }
    }

    #[test]
    fn run_config_refuses_kills_outside_the_run() {
        let mut cfg = RunConfig::new(Preset::tiny(), "x".into(), "/tmp".into());
        cfg.steps = 10;
        cfg.kills = vec![KillSpec::server_at_step(2, 3)];
        assert!(matches!(cfg.validate(), Err(ClusterError::Config(m)) if m.contains("server=2")));
        cfg.kills = vec!["worker=1@step=3".parse().unwrap()];
        assert!(matches!(cfg.validate(), Err(ClusterError::Config(m)) if m.contains("worker=1")));
        cfg.kills = vec![KillSpec::server_at_step(1, 10)];
        assert!(matches!(cfg.validate(), Err(ClusterError::Config(m)) if m.contains("step=10")));
        assert!(matches!(
            StrategyChoice::parse("ecrek", 5),
            Err(ClusterError::Config(m)) if m.contains("ecrek") && m.contains("ecrec")
        ));
    }

    #[test]
    fn run_config_refuses_a_compute_nice_value_outside_0_to_19() {
        let mut cfg = RunConfig::new(Preset::tiny(), "x".into(), "/tmp".into());
        assert_eq!(cfg.compute_nice, DEFAULT_COMPUTE_NICE);
        for ok in [0, 19] {
            cfg.compute_nice = ok;
            assert!(cfg.validate().is_ok(), "{ok}");
        }
        for bad in [-1, 20] {
            cfg.compute_nice = bad;
            assert!(
                matches!(cfg.validate(), Err(ClusterError::Config(m))
                    if m.contains("--compute-nice") && m.contains(&bad.to_string())),
                "{bad}"
            );
        }
    }
}
