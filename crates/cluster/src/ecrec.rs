//! ECRec in the cluster (ecrec.txt §3): what a server process needs to run as an ECRec node
//! ([`EcServerSpec`]), the checks a run with `--strategy ecrec` must pass, and what the run
//! reports about it ([`EcReport`]). The coordinator's side (two-phase commit of every step,
//! replacement and background rebuild of lost servers) lives in `coordinator::ecrec`.
//!
//! Both training modes. Asynchronous (the default, as ECRec §2.1 trains): every worker's
//! update is a transaction the worker coordinates over every server
//! ([`ftrec_ps::ec::run_txn`], ECRec §3.5); the coordinator only injects faults into its
//! phases, resolves a lost worker's transactions and runs the rebuilds. Synchronous
//! (`--sync`, the oracle): the coordinator commits whole deterministic steps (pull, stage,
//! prepare, commit, never overlapping), which is what makes a rebuilt server equal the lost
//! one bit for bit. Servers started elsewhere are refused: a lost server's replacement must
//! start empty and rebuild, which only a launched process is told to do (`--ec-replacement`).

use ftrec_core::{Optimizer, Preset, ServerId, DENSE_BLOCK};
use ftrec_ec::{CodeKind, StripeLayout};
use ftrec_ps::ec::{ec_service, EcConfig, EcNode};
use ftrec_ps::grpc::{ps_service, GrpcConfig, Routes};
use serde::{Deserialize, Serialize};

use crate::spec::{KillAt, KillSpec, Phase, Role};
use crate::{ClusterError, RunConfig, ServerSpec, StrategyChoice};

/// Data rows per stripe when `--ec-k` is not given.
pub const DEFAULT_K: usize = 2;
/// Parities per stripe when `--ec-r` is not given.
pub const DEFAULT_R: usize = 1;
/// Lock ranges of a rebuild when `--recovery-locks` is not given.
pub const DEFAULT_LOCK_RANGES: usize = 1;
/// The share a rebuild keeps when the job record has neither a throughput target nor a share
/// (a record of a version without the pacer): a quarter of the time. A paced rebuild starts
/// at [`paced_start_share_ppm`]; `--rebuild-share` fixes the share.
pub const DEFAULT_REBUILD_SHARE_PPM: u32 = ftrec_ps::ec::FULL_SHARE_PPM / 4;
/// Training throughput the rebuild's pacer keeps when neither `--rebuild-share` nor
/// `--rebuild-min-throughput` is given: 90% of the throughput before the failure (ECRec §5.3
/// measures 87–93% during recovery).
pub const DEFAULT_REBUILD_MIN_THROUGHPUT: f64 = 0.9;

pub(crate) fn default_rebuild_share_ppm() -> u32 {
    DEFAULT_REBUILD_SHARE_PPM
}

/// The share a rebuild paced to keep `target_ppm` of training's throughput starts at: the
/// time training can spare at that target, `1 - target` (on cores that training keeps busy,
/// a rebuild takes about its share of the time from training, and more with the survivors'
/// reads), and at least the pacer's least share. The pacer raises it from there while
/// training keeps more than the target; a start above it would cost a short rebuild, over
/// before the pacer's first window, its target.
pub fn paced_start_share_ppm(target_ppm: u32) -> u32 {
    let full = ftrec_ps::ec::FULL_SHARE_PPM;
    let least = (ftrec_strategy::pacer::MIN_SHARE * f64::from(full)).round() as u32;
    full.saturating_sub(target_ppm).max(least)
}

/// `--rebuild-share F` (a fraction from 0 to 1) in millionths, or an error naming the flag.
pub fn rebuild_share_ppm(share: f64) -> Result<u32, ClusterError> {
    if !(0.0..=1.0).contains(&share) {
        return Err(ClusterError::Config(format!(
            "--rebuild-share {share} is out of range (a fraction of the time from 0 to 1)"
        )));
    }
    Ok((share * f64::from(ftrec_ps::ec::FULL_SHARE_PPM)).round() as u32)
}

/// `--rebuild-min-throughput F` (a fraction above 0, at most 1) in millionths, or an error
/// naming the flag.
pub fn rebuild_min_throughput_ppm(target: f64) -> Result<u32, ClusterError> {
    if !(target > 0.0 && target <= 1.0) {
        return Err(ClusterError::Config(format!(
            "--rebuild-min-throughput {target} is out of range (a fraction of the throughput \
             before the failure, above 0 and at most 1)"
        )));
    }
    Ok((target * f64::from(ftrec_ps::ec::FULL_SHARE_PPM)).round() as u32)
}

/// A rebuild share in millionths as the fraction `--rebuild-share` takes.
pub fn rebuild_share_fraction(ppm: u32) -> f64 {
    f64::from(ppm) / f64::from(ftrec_ps::ec::FULL_SHARE_PPM)
}

/// Serde of a [`CodeKind`] as its name (`sum`, `gf256`).
pub(crate) mod code_serde {
    use ftrec_ec::CodeKind;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(c: &CodeKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(c.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<CodeKind, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// The ECRec part of a server process's spec: the flags `--ec-code --ec-k --ec-r
/// [--no-dense-replication] [--no-2pc] --recovery-locks [--ec-replacement]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcServerSpec {
    #[serde(with = "code_serde")]
    pub code: CodeKind,
    pub k: usize,
    pub r: usize,
    pub dense_replication: bool,
    pub two_phase: bool,
    pub lock_ranges: usize,
    /// Share of the time the background rebuild may work, in millionths.
    #[serde(default = "default_rebuild_share_ppm")]
    pub rebuild_share_ppm: u32,
    /// Start as the replacement of a lost server: every row, parity and dense block is
    /// missing until the coordinator starts its rebuild.
    pub replacement: bool,
}

impl EcServerSpec {
    /// The servers' part of strategy `ecrec` (`None` for another strategy).
    pub fn of_strategy(strategy: &StrategyChoice) -> Option<EcServerSpec> {
        match *strategy {
            StrategyChoice::EcRec {
                k,
                r,
                code,
                dense_replication,
                two_phase,
                lock_ranges,
                rebuild_share_ppm,
                ..
            } => Some(EcServerSpec {
                code,
                k,
                r,
                dense_replication,
                two_phase,
                lock_ranges,
                rebuild_share_ppm,
                replacement: false,
            }),
            _ => None,
        }
    }

    /// The node configuration: `r` dense copies with dense replication on (so `r` losses at
    /// once never take every copy of a dense block), none without.
    pub fn ec_config(&self) -> EcConfig {
        let mut c = EcConfig::new(self.code, self.k, self.r);
        c.dense_replicas = if self.dense_replication { self.r } else { 0 };
        c.two_phase = self.two_phase;
        c.lock_ranges = self.lock_ranges;
        c.rebuild_share_ppm = self.rebuild_share_ppm;
        c
    }

    pub fn validate(&self, servers: u32) -> Result<(), ClusterError> {
        self.ec_config()
            .validate(servers)
            .map_err(|e| ClusterError::Config(format!("ecrec: {e}")))
    }

    pub(crate) fn to_args(self) -> Vec<String> {
        let mut a = vec![
            "--ec-code".to_string(),
            self.code.name().into(),
            "--ec-k".into(),
            self.k.to_string(),
            "--ec-r".into(),
            self.r.to_string(),
            "--recovery-locks".into(),
            self.lock_ranges.to_string(),
            "--rebuild-share".into(),
            rebuild_share_fraction(self.rebuild_share_ppm).to_string(),
        ];
        for (on, flag) in [
            (!self.dense_replication, "--no-dense-replication"),
            (!self.two_phase, "--no-2pc"),
            (self.replacement, "--ec-replacement"),
        ] {
            if on {
                a.push(flag.into());
            }
        }
        a
    }
}

/// The ECRec flags as given (`ftrec run`, `ftrec server`, job files), before validation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EcFlags {
    /// `--ec-code` (sum or gf256).
    pub code: Option<String>,
    /// `--ec-k`.
    pub k: Option<usize>,
    /// `--ec-r`.
    pub r: Option<usize>,
    pub no_dense_replication: bool,
    pub no_2pc: bool,
    /// `--recovery-locks`.
    pub recovery_locks: Option<usize>,
    /// `--rebuild-share` (a fraction from 0 to 1).
    pub rebuild_share: Option<f64>,
    /// `--rebuild-min-throughput` (a fraction of the throughput before the failure).
    pub rebuild_min_throughput: Option<f64>,
    /// `--ec-replacement` (server processes only).
    pub replacement: bool,
}

impl EcFlags {
    /// Whether any ECRec flag was given.
    pub fn any(&self) -> bool {
        *self != EcFlags::default()
    }

    /// The names of the flags given, for errors.
    pub fn given(&self) -> Vec<&'static str> {
        [
            (self.code.is_some(), "--ec-code"),
            (self.k.is_some(), "--ec-k"),
            (self.r.is_some(), "--ec-r"),
            (self.no_dense_replication, "--no-dense-replication"),
            (self.no_2pc, "--no-2pc"),
            (self.recovery_locks.is_some(), "--recovery-locks"),
            (self.rebuild_share.is_some(), "--rebuild-share"),
            (
                self.rebuild_min_throughput.is_some(),
                "--rebuild-min-throughput",
            ),
            (self.replacement, "--ec-replacement"),
        ]
        .into_iter()
        .filter_map(|(on, f)| on.then_some(f))
        .collect()
    }

    /// A server's ECRec part: `None` without ECRec flags; with some, `--ec-k` and `--ec-r`
    /// are required (a server must agree with its peers on the layout), the code defaults to
    /// gf256 and the lock ranges to 1.
    pub fn server_spec(&self) -> Result<Option<EcServerSpec>, ClusterError> {
        if !self.any() {
            return Ok(None);
        }
        let need = |v: Option<usize>, flag: &str| {
            v.ok_or_else(|| {
                ClusterError::Config(format!("ECRec server flags need {flag} (missing)"))
            })
        };
        Ok(Some(EcServerSpec {
            code: match &self.code {
                Some(c) => parse_code(c)?,
                None => CodeKind::Gf256,
            },
            k: need(self.k, "--ec-k")?,
            r: need(self.r, "--ec-r")?,
            dense_replication: !self.no_dense_replication,
            two_phase: !self.no_2pc,
            lock_ranges: self.recovery_locks.unwrap_or(1),
            rebuild_share_ppm: self.share_ppm()?,
            replacement: self.replacement,
        }))
    }

    fn share_ppm(&self) -> Result<u32, ClusterError> {
        match (self.rebuild_share, self.min_throughput_ppm()?) {
            (Some(share), _) => rebuild_share_ppm(share),
            (None, Some(target)) => Ok(paced_start_share_ppm(target)),
            (None, None) => Ok(DEFAULT_REBUILD_SHARE_PPM),
        }
    }

    /// The pacer's target in millionths: `None` with a fixed `--rebuild-share`.
    fn min_throughput_ppm(&self) -> Result<Option<u32>, ClusterError> {
        match (self.rebuild_share, self.rebuild_min_throughput) {
            (Some(_), Some(_)) => Err(ClusterError::Config(
                "give either --rebuild-share (a fixed share of the time) or \
                 --rebuild-min-throughput (a share paced to keep training's throughput), not \
                 both"
                    .into(),
            )),
            (Some(_), None) => Ok(None),
            (None, t) => {
                rebuild_min_throughput_ppm(t.unwrap_or(DEFAULT_REBUILD_MIN_THROUGHPUT)).map(Some)
            }
        }
    }

    /// Strategy `ecrec` with these flags (gf256 and [`DEFAULT_K`], [`DEFAULT_R`],
    /// [`DEFAULT_LOCK_RANGES`] where not given). Validated
    /// against the cluster by [`RunConfig::validate`].
    pub fn strategy(&self) -> Result<StrategyChoice, ClusterError> {
        if self.replacement {
            return Err(ClusterError::Config(
                "--ec-replacement is a server flag; the coordinator starts replacements itself"
                    .into(),
            ));
        }
        Ok(StrategyChoice::EcRec {
            k: self.k.unwrap_or(DEFAULT_K),
            r: self.r.unwrap_or(DEFAULT_R),
            code: match &self.code {
                Some(c) => parse_code(c)?,
                None => CodeKind::Gf256,
            },
            dense_replication: !self.no_dense_replication,
            two_phase: !self.no_2pc,
            lock_ranges: self.recovery_locks.unwrap_or(DEFAULT_LOCK_RANGES),
            rebuild_share_ppm: self.share_ppm()?,
            rebuild_min_throughput_ppm: self.min_throughput_ppm()?,
            backstop_every_steps: None,
        })
    }
}

/// `sum` or `gf256`, with an error naming the accepted codes.
pub fn parse_code(v: &str) -> Result<CodeKind, ClusterError> {
    v.parse().map_err(|_| {
        ClusterError::Config(format!(
            "--ec-code {v:?} is not a code (expected sum or gf256)"
        ))
    })
}

/// Checks of a run config that concern ECRec (called by [`RunConfig::validate`]).
pub(crate) fn validate_run(cfg: &RunConfig) -> Result<(), ClusterError> {
    let bad = |m: String| Err(ClusterError::Config(m));
    if let Some(ec) = EcServerSpec::of_strategy(&cfg.strategy) {
        if !cfg.external_servers.is_empty() {
            return bad(
                "--strategy ecrec needs servers this coordinator starts (a lost server's \
                 replacement must start empty and rebuild); drop --server-addr"
                    .into(),
            );
        }
        ec.validate(cfg.servers)?;
        let split = |k: &&KillSpec| {
            matches!(
                k.at,
                KillAt::Phase(Phase::PrepareSome | Phase::CommitSome)
                    | KillAt::PhaseNth(Phase::PrepareSome | Phase::CommitSome, _)
            )
        };
        if let Some(k) = cfg.kills.iter().find(split).filter(|_| !ec.two_phase) {
            return bad(format!(
                "--kill {k}: phases prepare-some and commit-some split the two phases of 2PC, \
                 which --no-2pc turns off; drop --no-2pc or use phase prepare"
            ));
        }
        if let Some(k) = cfg.kills.iter().find(|k| k.role == Role::Server) {
            if !ec.two_phase {
                return bad(format!(
                    "--kill {k} with --no-2pc: without 2PC a server applies a delta on arrival, \
                     before the row it belongs to is installed, so a rebuild cannot read a \
                     consistent cut and could corrupt rows (ECRec §3.5); drop --no-2pc or the \
                     server kill"
                ));
            }
        }
    } else {
        for k in &cfg.kills {
            if let KillAt::Phase(p) | KillAt::PhaseNth(p, _) = k.at {
                if matches!(
                    p,
                    Phase::Prepare
                        | Phase::PrepareSome
                        | Phase::Commit
                        | Phase::CommitSome
                        | Phase::Rebuild
                ) {
                    return bad(format!(
                        "--kill {k}: phase {p} exists with --strategy ecrec only"
                    ));
                }
                if p == Phase::PieceWrite && !cfg.strategy.saves_pieces() {
                    return bad(format!(
                        "--kill {k}: phase piece-write exists with --strategy incrcp, \
                         incremental or cnr only"
                    ));
                }
                if p == Phase::Merge && !matches!(cfg.strategy, StrategyChoice::Deck { .. }) {
                    return bad(format!(
                        "--kill {k}: phase merge exists with --strategy deck only"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The routes of an ECRec server process: the parameter-server service on the node's shard
/// and the ECRec service (parity traffic, 2PC, rebuild) on the same socket; and the node, for
/// its transaction leases and the process's memory report.
pub(crate) fn ec_routes(
    spec: &ServerSpec,
    ec: &EcServerSpec,
) -> Result<(Routes, EcNode), ClusterError> {
    let (config, dense) = crate::shard_server::server_config(spec)?;
    let node = if ec.replacement {
        EcNode::new_replacement(config, &dense, ec.ec_config(), &[ServerId(spec.id)])?
    } else {
        EcNode::new(config, &dense, ec.ec_config())?
    };
    // Calls to the peers (servers of the same job) carry this process's token and job id.
    node.set_peer_auth(spec.auth.clone())?;
    let routes = Routes::new(ps_service(node.shared().clone(), GrpcConfig::default()))
        .add_service(ec_service(node.clone()));
    Ok((routes, node))
}

/// Bytes held for the model and for redundancy over the whole cluster, computed from the
/// layout (the same numbers `EcNode::memory` gives per node, summed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct EcMemory {
    /// Rows (values and optimizer state) and dense values with their state.
    pub model_bytes: u64,
    pub parity_bytes: u64,
    pub dense_replica_bytes: u64,
    /// (model + parities + replicas) / model.
    pub overhead: f64,
    /// (k + r) / k: what the parities alone would cost with perfectly balanced stripes.
    pub code_overhead: f64,
}

/// [`EcMemory`] of `servers` servers of `preset` with `ec`.
pub fn memory(
    preset: &Preset,
    servers: u32,
    ec: &EcServerSpec,
    sparse: &Optimizer,
    dense: &Optimizer,
    dense_values: u64,
) -> Result<EcMemory, ClusterError> {
    let layout = StripeLayout::new(servers, ec.k, ec.r, &preset.table_rows)
        .map_err(|e| ClusterError::Config(format!("ecrec layout: {e}")))?;
    let words = (preset.dim + sparse.state_words(preset.dim)) as u64;
    let rows: u64 = preset.table_rows.iter().sum();
    let parity_slots: u64 = layout.parity_counts().iter().sum();
    let blocks = dense_values.div_ceil(DENSE_BLOCK as u64);
    let dense_bytes = (dense_values + blocks * dense.state_words(DENSE_BLOCK) as u64) * 4;
    let model_bytes = rows * words * 4 + dense_bytes;
    let parity_bytes = parity_slots * words * 4;
    let dense_replica_bytes = ec.ec_config().dense_replicas as u64 * dense_bytes;
    Ok(EcMemory {
        model_bytes,
        parity_bytes,
        dense_replica_bytes,
        overhead: (model_bytes + parity_bytes + dense_replica_bytes) as f64
            / model_bytes.max(1) as f64,
        code_overhead: (ec.k + ec.r) as f64 / ec.k as f64,
    })
}

/// One rebuild of one server (a new replacement, or a rebuild restarted against a new set
/// of lost servers), times in seconds after the run started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RebuildReport {
    pub server: u32,
    /// Every server lost at the moment (the rebuild reads from the others).
    pub lost: Vec<u32>,
    pub started_s: f64,
    /// The replacement held its dense part and took part in steps again.
    pub joined_s: Option<f64>,
    pub finished_s: Option<f64>,
    /// Why it stopped, if it did not finish.
    pub error: Option<String>,
    pub ranges: u64,
    pub rows_decoded_on_demand: u64,
    pub cut_retries: u64,
    /// The node's rebuild generation this entry ran as (1: first start; one more per restart).
    pub generation: u64,
    /// Stopped and started again on the same node against a new lost set (a later entry of
    /// the same server carries on).
    pub restarted: bool,
    /// Commits the node applied while a rebuild batch held its lock.
    pub commits_in_lock: u64,
    /// Each lock range's start and end (seconds after the run started, as the coordinator
    /// places them from the node's own clock).
    pub range_spans_s: Vec<(f64, f64)>,
    /// Training throughput during each lock range over the throughput in the 10 s before the
    /// kill (`None`: the range ran after training ended, or no batch finished before it).
    pub range_throughput_share: Vec<Option<f64>>,
    /// Training throughput between the node joining and the rebuild finishing, over the
    /// throughput before the kill (`None` when the rebuild outlasted training).
    pub throughput_share: Option<f64>,
    /// Bytes the rebuild's batches decoded into the node (rows installed, parities merged).
    #[serde(default)]
    pub bytes: u64,
    /// Batches run, and seconds they worked (the rebuild's active time), rested as the
    /// rebuild share asked, and spent switching locks (part of the working time).
    #[serde(default)]
    pub batches: u64,
    #[serde(default)]
    pub busy_s: f64,
    #[serde(default)]
    pub rest_s: f64,
    #[serde(default)]
    pub lock_s: f64,
    /// Active bandwidth: `bytes` over `busy_s`, in MB/s (10^6 bytes).
    #[serde(default)]
    pub mb_per_s: Option<f64>,
    /// CPU seconds of the replacement's process from its join to the rebuild's end (the
    /// rebuild's batches and the training steps it served meanwhile), per MB rebuilt.
    #[serde(default)]
    pub cpu_s_per_mb: Option<f64>,
    /// The rebuild share over time, as the pacer set it: (seconds after the run started,
    /// share). Empty under a fixed share.
    #[serde(default)]
    pub shares: Vec<(f64, f64)>,
    /// The replacement's process CPU seconds when it joined (for `cpu_s_per_mb`).
    #[serde(skip)]
    pub cpu_at_join: Option<f64>,
}

/// [`ftrec_ps::ec::ParityAudit`] at the end of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditReport {
    pub stripes: u64,
    pub parity_mismatches: u64,
    /// Largest |stored - re-encoded| parity word: the sum code's drift.
    pub max_abs_error: f64,
    pub replica_mismatches: u64,
}

/// Where the transactions' wait for one another went, each a share of their time (both
/// phases): the parts of [`EcReport::lock_wait_share`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LockWaitShares {
    /// Phase-1 attempts refused (wait-die, a busy node), with the back-off after each.
    pub refused: f64,
    /// Queued: the wait for the gate's reservation.
    pub gate: f64,
    /// The wait for the slowest node's slot, its part behind the transaction before apart.
    pub slot: f64,
    /// Behind the transaction before ([`ftrec_ps::ec::Admission::After`]): the vote held until
    /// that one was decided (what early release leaves of the wait).
    pub behind: f64,
}

impl LockWaitShares {
    /// The shares of `txn_s` from a run's summed worker timings.
    pub fn of(t: &crate::control::BatchTiming, txn_s: f64) -> LockWaitShares {
        if txn_s <= 0.0 {
            return LockWaitShares::default();
        }
        let slot =
            t.txn_lock_wait_s - t.txn_refused_wait_s - t.txn_gate_wait_s - t.txn_behind_wait_s;
        LockWaitShares {
            refused: t.txn_refused_wait_s / txn_s,
            gate: t.txn_gate_wait_s / txn_s,
            slot: slot.max(0.0) / txn_s,
            behind: t.txn_behind_wait_s / txn_s,
        }
    }
}

/// The ECRec part of a run's report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EcReport {
    pub code: String,
    pub k: usize,
    pub r: usize,
    pub two_phase: bool,
    pub dense_replication: bool,
    pub lock_ranges: usize,
    /// Asynchronous training: every worker's update is a transaction it coordinates.
    pub asynchronous: bool,
    /// Steps committed on the servers (retried steps count once); asynchronous: transactions.
    pub steps_committed: u64,
    /// Asynchronous: phase-1 attempts refused by wait-die and retried, and transactions whose
    /// phase 2 failed on a lost server (committed by the survivors).
    pub txn_retries: u64,
    pub txn_commit_failures: u64,
    /// Asynchronous: transactions prepared queued (the gate node first, never refused for
    /// their age: [`ftrec_ps::ec::Admission`]), after a refusal of theirs or their worker's.
    #[serde(default)]
    pub txns_queued: u64,
    /// Asynchronous: of those, the transactions prepared behind the gate's holder, on top of
    /// its prepared rows ([`ftrec_ps::ec::Admission::After`]).
    #[serde(default)]
    pub txns_behind: u64,
    /// Asynchronous: the share of the transactions' time (both phases) spent waiting for
    /// other transactions (refused attempts, waits for a node's slot).
    #[serde(default)]
    pub lock_wait_share: f64,
    /// Asynchronous: `lock_wait_share` in its parts.
    #[serde(default)]
    pub lock_wait: LockWaitShares,
    /// Asynchronous: transactions settled by their worker after a failed phase (blocked on
    /// every server, then committed where some server had committed them, else aborted).
    #[serde(default)]
    pub txns_resolved_by_workers: u64,
    /// Steps aborted in phase 1 (then retried).
    pub steps_aborted: u64,
    /// Wall time of phase 1 (or of the one-phase apply), all steps.
    pub prepare_s: f64,
    /// Wall time of phase 2, all steps.
    pub commit_s: f64,
    /// Mean commit cost of a step as the coordinator sees it (both phases).
    pub per_step_s: f64,
    /// Row deltas and dense gradients sent server to server in phase 1, and their bytes
    /// (asynchronous training: counted with 2PC only, from the workers' transactions).
    pub row_deltas_sent: u64,
    pub dense_deltas_sent: u64,
    pub delta_bytes_sent: u64,
    pub memory: EcMemory,
    pub rebuilds: Vec<RebuildReport>,
    /// Parities and dense replicas checked against a fresh encode at the end.
    pub audit: Option<AuditReport>,
    /// Why there is no audit.
    pub audit_skipped: Option<String>,
}

impl EcReport {
    pub(crate) fn new(ec: &EcServerSpec, memory: EcMemory, asynchronous: bool) -> EcReport {
        EcReport {
            code: ec.code.name().into(),
            k: ec.k,
            r: ec.r,
            two_phase: ec.two_phase,
            dense_replication: ec.dense_replication,
            lock_ranges: ec.lock_ranges,
            memory,
            asynchronous,
            ..EcReport::default()
        }
    }

    /// Lines for [`crate::RunReport::summary`].
    pub fn summary(&self) -> String {
        let deltas = if self.asynchronous && !self.two_phase {
            // A one-phase transaction's answer carries no prepare report.
            "row deltas sent not counted without 2PC".to_string()
        } else {
            format!(
                "{} row deltas ({} bytes) sent",
                self.row_deltas_sent, self.delta_bytes_sent
            )
        };
        let mut s = format!(
            "  ecrec {} k={} r={} ({}), 2PC {}, dense replication {}: {} {} committed ({} \
             aborted, {} retried, {} queued, {} behind the one before), {:.3} ms per commit, \
             {deltas}; memory x{:.3} (code (k+r)/k = {:.3})\n",
            self.code,
            self.k,
            self.r,
            if self.asynchronous {
                "asynchronous"
            } else {
                "synchronous"
            },
            if self.two_phase { "on" } else { "off" },
            if self.dense_replication { "on" } else { "off" },
            self.steps_committed,
            if self.asynchronous {
                "transactions"
            } else {
                "steps"
            },
            self.steps_aborted,
            self.txn_retries,
            self.txns_queued,
            self.txns_behind,
            1e3 * self.per_step_s,
            self.memory.overhead,
            self.memory.code_overhead,
        );
        if self.asynchronous && self.two_phase {
            let w = &self.lock_wait;
            s += &format!(
                "  waiting for other transactions: {:.1}% of their time (refused attempts \
                 {:.1}%, the gate {:.1}%, a node's slot {:.1}%, the vote behind the one before \
                 {:.1}%)\n",
                100.0 * self.lock_wait_share,
                100.0 * w.refused,
                100.0 * w.gate,
                100.0 * w.slot,
                100.0 * w.behind,
            );
        }
        for b in &self.rebuilds {
            let t = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.3}s"));
            s += &format!(
                "  rebuild of server {} (lost {:?}, generation {}) from {:.3}s: joined {}, \
                 finished {}, {} rows decoded on demand, throughput meanwhile {}{}{}\n",
                b.server,
                b.lost,
                b.generation,
                b.started_s,
                t(b.joined_s),
                t(b.finished_s),
                b.rows_decoded_on_demand,
                b.throughput_share
                    .map_or("-".into(), |x| format!("{:.0}% of before", x * 100.0)),
                if b.restarted { ", restarted" } else { "" },
                b.error
                    .as_ref()
                    .map_or(String::new(), |e| format!(", stopped: {e}"))
            );
            for (i, ((a, e), share)) in b
                .range_spans_s
                .iter()
                .zip(&b.range_throughput_share)
                .enumerate()
            {
                s += &format!(
                    "    lock range {i}: {a:.3}s to {e:.3}s ({:.3}s), throughput {}\n",
                    e - a,
                    share.map_or("-".into(), |x| format!("{:.0}% of before", x * 100.0))
                );
            }
        }
        match (&self.audit, &self.audit_skipped) {
            (Some(a), _) => {
                s += &format!(
                    "  parity audit: {} of {} stripes' parities differ from a fresh encode (max \
                     |error| {:.3e}), {} dense replica words differ\n",
                    a.parity_mismatches, a.stripes, a.max_abs_error, a.replica_mismatches
                )
            }
            (None, Some(why)) => s += &format!("  parity audit skipped: {why}\n"),
            (None, None) => {}
        }
        s
    }
}

/// Bytes of the largest table's rows on one server (rows are dealt round robin), for
/// callers that size one read of a whole table.
pub(crate) fn largest_shard_bytes(preset: &Preset, servers: u32, words: u64) -> u64 {
    preset
        .table_rows
        .iter()
        .map(|&rows| rows.div_ceil(u64::from(servers)) * words * 4)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> EcServerSpec {
        EcServerSpec {
            code: CodeKind::Sum,
            k: 2,
            r: 1,
            dense_replication: false,
            two_phase: false,
            lock_ranges: 4,
            rebuild_share_ppm: 250_000,
            replacement: true,
        }
    }

    #[test]
    fn the_lock_wait_s_parts_add_up_to_its_share() {
        let t = crate::control::BatchTiming {
            txn_lock_wait_s: 10.0,
            txn_refused_wait_s: 2.0,
            txn_gate_wait_s: 1.0,
            txn_behind_wait_s: 3.0,
            ..Default::default()
        };
        let w = LockWaitShares::of(&t, 20.0);
        assert_eq!(
            w,
            LockWaitShares {
                refused: 0.1,
                gate: 0.05,
                slot: 0.2,
                behind: 0.15
            }
        );
        assert!((w.refused + w.gate + w.slot + w.behind - 0.5).abs() < 1e-12);
        assert_eq!(LockWaitShares::of(&t, 0.0), LockWaitShares::default());
    }

    #[test]
    fn a_server_spec_with_ecrec_round_trips_through_its_arguments() {
        let mut s = ServerSpec::from_preset(&Preset::tiny(), 2, 3, 5).unwrap();
        s.ec = Some(spec());
        assert_eq!(ServerSpec::from_args(&s.to_args()).unwrap(), s);
        let mut g = spec();
        g.code = CodeKind::Gf256;
        g.r = 2;
        g.dense_replication = true;
        g.two_phase = true;
        g.replacement = false;
        s.servers = 4;
        s.ec = Some(g);
        assert_eq!(ServerSpec::from_args(&s.to_args()).unwrap(), s);
    }

    #[test]
    fn bad_ecrec_server_flags_are_named() {
        let s = ServerSpec::from_preset(&Preset::tiny(), 0, 3, 5).unwrap();
        let with = |extra: &[&str]| {
            let mut a = s.to_args();
            a.extend(extra.iter().map(|x| x.to_string()));
            ServerSpec::from_args(&a)
        };
        assert!(
            matches!(with(&["--ec-k", "2"]), Err(ClusterError::Config(m)) if m.contains("--ec-r"))
        );
        assert!(matches!(
            with(&["--ec-k", "2", "--ec-r", "1", "--ec-code", "xor"]),
            Err(ClusterError::Config(m)) if m.contains("xor") && m.contains("gf256")
        ));
        assert!(matches!(
            with(&["--ec-k", "3", "--ec-r", "1"]),
            Err(ClusterError::Config(m)) if m.contains("k + r = 4")
        ));
        assert!(matches!(
            with(&["--ec-k", "two", "--ec-r", "1"]),
            Err(ClusterError::Config(m)) if m.contains("--ec-k")
        ));
        assert!(matches!(
            with(&["--ec-k", "1", "--ec-r", "2", "--ec-code", "sum"]),
            Err(ClusterError::Config(m)) if m.contains("r = 1")
        ));
        assert!(
            with(&["--ec-k", "2", "--ec-r", "1", "--no-2pc"]).is_ok_and(|s| s
                .ec
                .is_some_and(|e| !e.two_phase && e.dense_replication && !e.replacement))
        );
    }

    #[test]
    fn the_rebuild_is_paced_unless_a_fixed_share_is_given_and_never_both() {
        let pace = |f: EcFlags| match f.strategy().unwrap() {
            StrategyChoice::EcRec {
                rebuild_share_ppm,
                rebuild_min_throughput_ppm,
                ..
            } => (rebuild_share_ppm, rebuild_min_throughput_ppm),
            other => panic!("{other:?}"),
        };
        // Nothing given: paced to the default target, from the time training can spare.
        assert_eq!(pace(EcFlags::default()), (100_000, Some(900_000)));
        let target = EcFlags {
            rebuild_min_throughput: Some(0.8),
            ..EcFlags::default()
        };
        assert_eq!(pace(target), (200_000, Some(800_000)));
        // A target of all the throughput starts at the pacer's least share, not at 0.
        let all = EcFlags {
            rebuild_min_throughput: Some(1.0),
            ..EcFlags::default()
        };
        assert_eq!(pace(all), (50_000, Some(1_000_000)));
        let fixed = EcFlags {
            rebuild_share: Some(0.5),
            ..EcFlags::default()
        };
        assert_eq!(pace(fixed), (500_000, None));
        let both = EcFlags {
            rebuild_share: Some(0.5),
            rebuild_min_throughput: Some(0.8),
            ..EcFlags::default()
        };
        let e = both.strategy().unwrap_err().to_string();
        assert!(
            e.contains("--rebuild-share") && e.contains("--rebuild-min-throughput"),
            "{e}"
        );
        for bad in [0.0, 1.5, -0.2, f64::NAN] {
            let f = EcFlags {
                rebuild_min_throughput: Some(bad),
                ..EcFlags::default()
            };
            let e = f.strategy().unwrap_err().to_string();
            assert!(e.contains("--rebuild-min-throughput"), "{e}");
        }
    }

    #[test]
    fn run_configs_that_ecrec_cannot_serve_are_refused() {
        let mut cfg = RunConfig::new(Preset::tiny(), "x".into(), "/tmp".into());
        cfg.servers = 3;
        cfg.steps = 10;
        cfg.strategy = StrategyChoice::parse("ecrec", 1).unwrap();
        assert!(cfg.validate().is_ok());
        assert_eq!(
            cfg.server_spec(1).ec,
            EcServerSpec::of_strategy(&cfg.strategy)
        );
        cfg.sync = false;
        assert!(
            cfg.validate().is_ok(),
            "asynchronous training is ECRec's own mode"
        );
        cfg.sync = true;
        cfg.servers = 2;
        assert!(matches!(cfg.validate(), Err(ClusterError::Config(m)) if m.contains("servers")));
        cfg.servers = 3;
        cfg.external_servers = vec!["127.0.0.1:1".parse().unwrap(); 3];
        assert!(
            matches!(cfg.validate(), Err(ClusterError::Config(m)) if m.contains("--server-addr"))
        );
        cfg.external_servers.clear();
        cfg.strategy = StrategyChoice::None;
        cfg.kills = vec!["server=1@phase=commit".parse().unwrap()];
        assert!(matches!(cfg.validate(), Err(ClusterError::Config(m)) if m.contains("ecrec")));
    }

    #[test]
    fn memory_overhead_is_near_the_codes_ratio_without_dense_replication() {
        let p = Preset::tiny();
        let opt = Optimizer::new(p.sparse_optimizer, p.sparse_lr);
        let dopt = Optimizer::new(p.dense_optimizer, p.dense_lr);
        let mut ec = spec();
        ec.code = CodeKind::Gf256;
        let m = memory(&p, 3, &ec, &opt, &dopt, 0).unwrap();
        // Parities only, one per stripe of two rows (ragged tails round up).
        assert!(m.overhead >= 1.5 && m.overhead < 1.52, "{m:?}");
        assert_eq!(m.dense_replica_bytes, 0);
        ec.dense_replication = true;
        let m2 = memory(&p, 3, &ec, &opt, &dopt, 1000).unwrap();
        assert!(m2.dense_replica_bytes > 0 && m2.overhead > 1.5, "{m2:?}");
    }
}
