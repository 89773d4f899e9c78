//! Raw command-line flags (no IO). Each command turns them into a validated configuration.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The flags of the cluster's processes and the groups `run` shares with them have one
/// definition, in the cluster crate (its own process binary parses them too).
pub use ftrec_cluster::args::{EcRunArgs, OptimizerArgs, ServerArgs, WorkerArgs};

#[derive(Parser, Debug)]
#[command(
    name = "ftrec",
    version,
    about = "Fault-tolerant training of deep-learning recommendation models"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Train a DLRM in one process (the reference every distributed run is compared with).
    Train(TrainArgs),
    /// Data tools.
    Data {
        #[command(subcommand)]
        cmd: DataCmd,
    },
    /// Benchmarks that report ratios measured in the same run.
    Bench {
        #[command(subcommand)]
        cmd: BenchCmd,
    },
    /// Train with parameter-server processes, a coordinator, a fault-tolerance strategy and
    /// injected faults (synthetic data, or Criteo TSV with --data).
    Run(RunArgs),
    /// One parameter-server process (`ftrec run` starts them; start them by hand on other hosts).
    Server(ServerArgs),
    /// AUC and logloss of a checkpoint's model on the held-out set (synthetic or TSV).
    Eval(crate::eval::EvalArgs),
    /// Checkpoint stores: list the lineage, verify, restore, collect garbage, merge, export.
    Ckpt {
        #[command(subcommand)]
        cmd: crate::ckpt_cmd::CkptCmd,
    },
    /// One worker process: connects to a coordinator and trains the batches it hands out
    /// (`ftrec run` starts them; start them by hand on other hosts).
    Worker(WorkerArgs),
    /// The coordinator alone: servers started elsewhere (`--server-addr`, one per server) and
    /// workers that connect to `--control-listen` (`ftrec worker --coordinator ADDR --id W`).
    Coordinator(RunArgs),
    /// Every strategy on one workload with one failure schedule: report.json, report.md,
    /// report.html and plots (PNG and SVG) in --out.
    Compare(crate::compare::CompareArgs),
    /// A short comparison on the tiny preset with two server kills; prints the summary and
    /// where the report is.
    Demo(crate::demo::DemoArgs),
    /// Which strategy to run at production scale: costs simulated from coefficients calibrated
    /// on a compare report.
    Advise(crate::advise::AdviseArgs),
    /// Test certificates for mutual TLS: a fresh CA and one certificate it signed for the
    /// hosts given (ca.pem, NAME-cert.pem, NAME-key.pem).
    Certs(crate::certs::CertsArgs),
}

/// Flags of `ftrec run` and `ftrec coordinator`. Every value may also come from the job file
/// (`--config`, keys named as the flags with `_` for `-`); a flag given on the command line
/// wins over the file.
#[derive(Args, Debug, Default, Clone)]
pub struct RunArgs {
    /// Job file (TOML) with any of these settings.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Start a job again from its checkpoint store (a directory or s3://bucket/prefix) after
    /// its processes died: the job's settings come from the store's job record; fresh servers
    /// and workers restore the newest committed checkpoint and train to the job's last step.
    /// Flags that define the job (preset, workers, sync, strategy and its settings, steps,
    /// batch, seed, optimizers) must agree with the record; --servers (the rows are
    /// re-sharded), --work-dir, --kill, --threads, --eval-samples, heartbeats, the report
    /// interval and --json may differ.
    #[arg(long, value_name = "LOCATION")]
    pub resume: Option<String>,
    /// Resume the job from --store when the store holds its job record, start it fresh
    /// otherwise: one command for a first start and for a restart (a coordinator's container
    /// restarted by its orchestrator).
    #[arg(long, conflicts_with = "resume")]
    pub resume_or_start: bool,
    /// Workload preset: tiny, small, kaggle32 or kaggle [default: tiny]; with --data it gives the model
    /// shape and the data gives the table sizes.
    #[arg(long)]
    pub preset: Option<String>,
    /// Parameter-server processes [default: 2].
    #[arg(long)]
    pub servers: Option<u32>,
    /// Worker processes [default: 1].
    #[arg(long)]
    pub workers: Option<u32>,
    /// Start no worker processes: the workers connect to the control socket
    /// (--control-listen; its address is printed at start) as `ftrec worker --coordinator ADDR
    /// --id W`, or from Python as `ftrec.EmbeddingClient(ADDR, W)` to train their own model on
    /// this job's embedding tables. The servers are still started here.
    #[arg(long)]
    pub workers_elsewhere: bool,
    /// Synchronous deterministic mode: every step's contributions summed in worker order
    /// before the next step (default: asynchronous).
    #[arg(long)]
    pub sync: bool,
    /// Fault tolerance: none, full, deck, ecrec, cpr, incrcp, incremental or cnr [default: none].
    #[arg(long)]
    pub strategy: Option<String>,
    /// Delta checkpoint interval, in steps (strategy deck) [default: 10].
    #[arg(long, value_name = "N")]
    pub delta_every_steps: Option<u64>,
    /// The merger writes a full once the active chain covers N deltas (strategy deck)
    /// [default: never; merged checkpoints only].
    #[arg(long, value_name = "N")]
    pub full_every: Option<u64>,
    /// Merge every S consecutive checkpoints of one layer, 0 turns merging off (strategy deck)
    /// [default: 2].
    #[arg(long, value_name = "S")]
    pub merge_stride: Option<u64>,
    /// Cap on the merger's write rate in MiB/s (strategy deck) [default: none].
    #[arg(long, value_name = "R")]
    pub merge_mib_per_s: Option<f64>,
    /// Checkpoint store of a saving strategy (full, deck, ...): a directory or
    /// s3://bucket/prefix (S3 settings from the AWS environment variables) [default:
    /// WORK_DIR/ckpt]. `--ckpt-dir DIR` is the same.
    #[arg(long, value_name = "LOCATION", alias = "ckpt-dir")]
    pub store: Option<String>,
    /// Staging chunk size of the servers' checkpoint writes, in KiB (saving strategies)
    /// [default: 4096].
    #[arg(long, value_name = "KIB")]
    pub ckpt_chunk_kib: Option<usize>,
    #[command(flatten)]
    pub ec: EcRunArgs,
    #[command(flatten)]
    pub cpr: CprRunArgs,
    #[command(flatten)]
    pub incr: IncrRunArgs,
    /// Checkpoint interval, in steps (strategies full, cpr, incrcp, incremental, cnr)
    /// [default: 100]; with ecrec, a backstop full checkpoint every N steps, restored when more
    /// than r servers are lost at once (ECRec §4; without it such a loss ends the run).
    #[arg(long, value_name = "N")]
    pub ckpt_every_steps: Option<u64>,
    /// Port files and default checkpoints (default: a new directory under the temp dir).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// SIGKILL a process: ROLE=I@step=S, ROLE=I@time=T (seconds) or
    /// ROLE=I@phase=checkpoint-write|piece-write|recovery|merge|prepare|prepare-some|commit|
    /// commit-some|rebuild[#N] (piece-write with incrcp, incremental, cnr: while a piece
    /// uploads and is extracted; merge with deck; prepare, commit, rebuild with ecrec: phase 1
    /// or 2 of a step's commit, during a rebuild; prepare-some, commit-some: a phase answered
    /// by the first half of the servers only; #N: the N-th time, a worker's counting its own
    /// transactions), ROLE server, worker or merger; several servers failing together:
    /// server=0,2@step=S; the whole job after a step: job@step=S. Gray failures: stop:server=I@...
    /// pauses a server (SIGSTOP; it is fenced, replaced and woken), stop:job@step=S freezes the
    /// whole job for whoever wakes it (SIGCONT to its processes) (repeatable).
    #[arg(long, value_name = "ROLE=I@POINT")]
    pub kill: Vec<String>,
    #[command(flatten)]
    pub data: DataArgs,
    /// Training steps (each of `workers` batches) [default: the preset's, or with --epochs
    /// as many as the data holds].
    #[arg(long)]
    pub steps: Option<u64>,
    /// Samples per worker per step [default: the preset's].
    #[arg(long)]
    pub batch: Option<usize>,
    /// Seed of the model and the data [default: 1].
    #[arg(long)]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub opt: OptimizerArgs,
    /// Matrix-kernel threads per worker [default: 1].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Nice value of each worker's compute threads, 0 to 19: they yield the CPU to the
    /// worker's RPCs and to the servers on a shared host; 0 runs the math on the worker's one
    /// thread at its own priority [default: 19].
    #[arg(long, value_name = "N")]
    pub compute_nice: Option<i32>,
    /// Start the servers on these CPUs only, e.g. `1` or `2-3` (servers this job starts; the
    /// workers' are `--worker-cpus`): disjoint sets place servers and workers as separate
    /// machines would [default: any CPU].
    #[arg(long, value_name = "LIST")]
    pub server_cpus: Option<ftrec_cluster::cpus::CpuSet>,
    /// Start the workers on these CPUs only, e.g. `0` or `0-1` [default: any CPU].
    #[arg(long, value_name = "LIST")]
    pub worker_cpus: Option<ftrec_cluster::cpus::CpuSet>,
    /// Held-out samples for AUC and logloss (0 skips the evaluation) [default: the preset's].
    #[arg(long)]
    pub eval_samples: Option<usize>,
    /// Heartbeat interval in milliseconds [default: 100].
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Heartbeat timeout in milliseconds [default: 1000].
    #[arg(long)]
    pub heartbeat_timeout_ms: Option<u64>,
    /// Width of the report's throughput intervals, in seconds [default: 1].
    #[arg(long)]
    pub report_interval_s: Option<f64>,
    /// How long a process may take to start, and how long servers started elsewhere
    /// (--server-addr) are waited for at start and after a loss, in seconds [default: 30].
    #[arg(long, value_name = "SECONDS")]
    pub start_timeout_s: Option<f64>,
    /// How long the store's writer lease lives without renewal, in seconds [default: 30]. A
    /// second job on the store is refused while it lives; a job that cannot renew it stops.
    #[arg(long, value_name = "SECONDS")]
    pub lease_ttl_s: Option<f64>,
    /// Longest wait for a save's uploads, in seconds [default: 60 plus 1 per 16 MiB saved].
    /// A save that takes longer is dropped once its uploads end (never deleted under them).
    #[arg(long, value_name = "SECONDS")]
    pub save_timeout_s: Option<f64>,
    /// Address of a server started elsewhere, in server order (repeatable; then no server is
    /// started here): HOST:PORT with a DNS name, an IPv4 or an [IPv6] address. A name is
    /// looked up at every connection, so a server restarted at a new address behind the same
    /// name is found.
    #[arg(long, value_name = "HOST:PORT")]
    pub server_addr: Vec<ftrec_cluster::net::PeerAddr>,
    /// The control socket workers connect to: an address, or HOST:PORT with a name looked up
    /// once [default: 127.0.0.1:0; port 0 takes a free port, printed at start].
    #[arg(long, value_name = "ADDR", value_parser = ftrec_cluster::net::listen_addr)]
    pub control_listen: Option<std::net::SocketAddr>,
    /// Write the report as JSON here.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub auth: ftrec_cluster::args::AuthArgs,
    #[command(flatten)]
    pub obs: ftrec_cluster::args::ObsArgs,
}

/// CPR flags of `ftrec run` (strategy cpr only; cpr.txt §4).
#[derive(Args, Debug, Default, Clone)]
pub struct CprRunArgs {
    /// CPR: prioritized saves instead of full saves after the first (CPR §5.1): at most r of
    /// the largest tables' rows, chosen by mfu (most frequently used), ssu (sub-sampled used)
    /// or scar (largest change), the other tables whole; none: a full every interval
    /// (CPR-vanilla) [default: none].
    #[arg(long, value_name = "RULE")]
    pub cpr_priority: Option<String>,
    /// CPR: target portion of lost samples; with --mtbf-s the full-save interval is
    /// 2 * PLS * servers * MTBF seconds (CPR Eq. 4) [default: --ckpt-every-steps].
    #[arg(long, value_name = "PLS")]
    pub target_pls: Option<f64>,
    /// CPR: mean time between failures in seconds, for --target-pls and the benefit
    /// analysis that falls back to full recovery when partial recovery does not pay.
    #[arg(long, value_name = "SECONDS")]
    pub mtbf_s: Option<f64>,
    /// CPR: share of each prioritized table's rows a prioritized save writes [default: 0.125].
    #[arg(long, value_name = "R")]
    pub cpr_r: Option<f64>,
    /// CPR: save points per save interval with --cpr-priority, the first a full and every
    /// later one a prioritized save [default: 1/r, 8].
    #[arg(long, value_name = "K")]
    pub cpr_saves_per_full: Option<u64>,
    /// CPR-SSU: look at every N-th update [default: 2].
    #[arg(long, value_name = "N")]
    pub cpr_ssu_period: Option<u32>,
    /// CPR: prioritize the N largest tables, save the others whole [default: 7].
    #[arg(long, value_name = "N")]
    pub cpr_tables: Option<usize>,
}

impl CprRunArgs {
    pub fn flags(&self, every_steps: Option<u64>) -> ftrec_cluster::CprFlags {
        ftrec_cluster::CprFlags {
            priority: self.cpr_priority.clone(),
            target_pls: self.target_pls,
            mtbf_s: self.mtbf_s,
            every_steps,
            r: self.cpr_r,
            saves_per_full: self.cpr_saves_per_full,
            ssu_period: self.cpr_ssu_period,
            largest_tables: self.cpr_tables,
        }
    }
}

/// Flags of the incremental strategies of `ftrec run` (incrcp, incremental, cnr).
#[derive(Args, Debug, Default, Clone)]
pub struct IncrRunArgs {
    /// incrcp: when to write a new full instead of a piece: auto (IncrCP §4.5: when T_base
    /// < T_incre), never, or N (every N pieces); incremental: never or N [default: auto for
    /// incrcp, never for incremental].
    #[arg(long, value_name = "auto|never|N")]
    pub base_reset: Option<String>,
    /// incrcp: extraction threshold R, the share of an old chunk's rows a new piece must
    /// save again for them to be extracted (IncrCP §4.3) [default: 0.02].
    #[arg(long, value_name = "R")]
    pub extract_threshold: Option<f64>,
    /// incrcp: local rows per row range, each with its own chunk list (0: one list per table
    /// shard) [default: 0].
    #[arg(long, value_name = "N")]
    pub range_rows: Option<u64>,
    /// incrcp: one file per chunk instead of concatenation bundles (IncrCP §4.4).
    #[arg(long)]
    pub no_concat: bool,
    /// cnr: a new full once a differential passes this share of the full's bytes, 0 never
    /// [default: 0.5].
    #[arg(long, value_name = "F")]
    pub cnr_reset_fraction: Option<f64>,
    /// cnr: store the differentials' values quantized to 8 or 4 bits (Check-N-Run); restores
    /// are then approximate [default: off].
    #[arg(long, value_name = "BITS")]
    pub quantize: Option<u8>,
}

impl IncrRunArgs {
    /// The flags given, by name.
    pub fn given(&self) -> Vec<(&'static str, bool)> {
        vec![
            ("--base-reset", self.base_reset.is_some()),
            ("--extract-threshold", self.extract_threshold.is_some()),
            ("--range-rows", self.range_rows.is_some()),
            ("--no-concat", self.no_concat),
            ("--cnr-reset-fraction", self.cnr_reset_fraction.is_some()),
            ("--quantize", self.quantize.is_some()),
        ]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayoutArg {
    Kaggle,
    Terabyte,
}

/// Criteo TSV data flags, shared by `ftrec train`, `ftrec run` and `ftrec coordinator` (and
/// the job file's keys of the same names).
#[derive(Args, Debug, Default, Clone)]
pub struct DataArgs {
    /// Criteo TSV data: a file, several files, or a directory (default: synthetic data).
    #[arg(long, num_args = 1.., value_name = "PATH")]
    pub data: Vec<PathBuf>,
    /// Layout of --data: kaggle or terabyte [default: kaggle].
    #[arg(long, value_enum)]
    pub layout: Option<LayoutArg>,
    /// Cap every table at N rows (categoricals are hashed into the table size).
    #[arg(long, value_name = "N")]
    pub rows_per_table: Option<u64>,
    /// Skip and count malformed lines instead of stopping at the first one.
    #[arg(long)]
    pub skip_malformed: bool,
    /// Hold out every N-th line of each file for evaluation (0: none) [default: 64].
    #[arg(long, value_name = "N")]
    pub holdout_every: Option<u64>,
    /// Passes over the TSV data: without --steps the run trains exactly E passes, with
    /// --steps it stops at whichever comes first [default: as many as the steps need].
    #[arg(long, value_name = "E")]
    pub epochs: Option<u64>,
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Workload preset: tiny, small, kaggle32 or kaggle. Without --data it also selects the synthetic
    /// data; with --data it selects the model shape (default kaggle).
    #[arg(long)]
    pub preset: Option<String>,
    #[command(flatten)]
    pub data: DataArgs,
    #[arg(long)]
    pub steps: Option<u64>,
    #[arg(long)]
    pub batch: Option<usize>,
    #[command(flatten)]
    pub opt: OptimizerArgs,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Fixed reduction order everywhere: the run is a pure function of config and seed.
    #[arg(long)]
    pub deterministic: bool,
    /// Threads for the matrix kernels and per-sample work (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Held-out samples for AUC and logloss.
    #[arg(long)]
    pub eval_samples: Option<usize>,
    /// Write the report as JSON here.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum DataCmd {
    /// Write synthetic Criteo-like samples as Criteo Kaggle-layout TSV (DIR/train.tsv).
    Synth {
        #[arg(long, default_value = "small")]
        preset: String,
        #[arg(long)]
        samples: u64,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

#[derive(Subcommand, Debug)]
// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum BenchCmd {
    /// Trainer throughput, and the MLP's GFLOP/s next to raw sgemm GFLOP/s of the same run.
    Train {
        #[arg(long, default_value = "kaggle")]
        preset: String,
        #[arg(long)]
        batch: Option<usize>,
        #[arg(long)]
        threads: Option<usize>,
        /// Timed MLP iterations.
        #[arg(long, default_value_t = 20)]
        iters: usize,
        /// Timed end-to-end training steps.
        #[arg(long, default_value_t = 30)]
        steps: u64,
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
    /// Fault-tolerance costs on one cluster configuration: the single-process trainer, then
    /// `none` and `full` without a failure (checkpointing's training-time overhead), then
    /// `full` with a server killed (recovery split into detect, replace, reload and redo).
    Cluster {
        #[command(flatten)]
        run: RunArgs,
        /// Server killed in the recovery run.
        #[arg(long, default_value_t = 0)]
        kill_server: u32,
        /// Step after which it is killed (default: three quarters of a checkpoint interval
        /// past the middle checkpoint).
        #[arg(long)]
        kill_step: Option<u64>,
        /// Matrix-kernel threads of the single-process trainer (all cores by default).
        #[arg(long, default_value_t = 2)]
        single_threads: usize,
    },
    /// CPR's emulation experiment (cpr.txt §5.1, §6.1, Figure 7) on one workload and one
    /// failure schedule: full (full recovery at Young's interval), part (partial recovery at
    /// the same interval), cpr (CPR-vanilla at the Eq. 4 interval for --target-pls, default
    /// 0.1), cpr-mfu, cpr-ssu, cpr-scar (prioritized saves instead of full saves). Overhead
    /// (save pauses, lost computation, restore) from asynchronous runs; PLS (Eq. 3 and
    /// counting what was saved) and the paired AUC drop against full recovery from synchronous
    /// runs over --seeds failure placements, mean and 95% interval. --failures failures per
    /// run (default 2, as the paper's emulated 56-hour job) of --fail-servers servers each.
    /// --sensitivity runs CPR §6.3's target-PLS study instead, --pls-sweep §6.5's PLS–AUC
    /// correlation; both draw a plot. Preset kaggle32 keeps Kaggle's row distribution (the 7
    /// largest tables 99.6% of the rows) at a million rows.
    Cpr(crate::bench_cpr::CprBenchArgs),
    /// IncrCP against naive incremental and Check-N-Run (and DECK) on one workload, as IncrCP
    /// §5 measures: every checkpoint written first, then each one's recovery timed warm and
    /// cold (the mean over the checkpoints), bytes stored, pauses.
    Incremental(crate::bench_incr::IncrBenchArgs),
    /// What the process metrics cost training: the coordinator's and a worker's updates timed
    /// against the step time, one scrape's encoding, and paired runs with the endpoint
    /// scraped and without (ratio of training times, mean and 95% interval).
    Metrics(crate::bench_metrics::MetricsBenchArgs),
    /// ECRec's costs on one cluster configuration, asynchronous unless `--sync`: `none`, then
    /// ECRec all on (k = 2 and 4), without dense replication, and without dense replication
    /// and 2PC (training-time, CPU-time while training and of whole processes, and memory
    /// overhead, each against a `none` run of the same repeat, with the spread of the `none`
    /// runs), then ECRec and `full` each with a server killed (time to resume and to full
    /// recovery, the rebuild's duration and throughput meanwhile, per lock range). 150 steps
    /// unless `--steps`; the recovery runs 8 times as many unless `--recovery-steps`. With a
    /// comma list of worker counts (`--workers 2,4,8,15`), a sweep instead: `none` and ECRec
    /// all on (k = 2) at each count, the recovery runs at the largest. Every invocation
    /// reports each server's memory (peak anonymous RSS over `none`'s, and its parts).
    Ecrec {
        #[command(flatten)]
        run: EcrecRunArgs,
        /// Server killed in the recovery runs.
        #[arg(long, default_value_t = 0)]
        kill_server: u32,
        /// Step after which it is killed [default: a quarter of the recovery runs' steps].
        #[arg(long)]
        kill_step: Option<u64>,
        /// Steps of the recovery runs [default: 8 x the steps, so that a rebuild at the
        /// default share finishes while training goes on, and the kill falls after warm-up].
        #[arg(long)]
        recovery_steps: Option<u64>,
        /// Times the `none` run and every variant are run (0: the recovery runs only).
        #[arg(long, default_value_t = 2)]
        repeat: u32,
        /// Rebuild shares of the ECRec recovery runs, one run each (comma-separated fractions
        /// from 0 to 1, e.g. 1,0.5,0.25) [default: --rebuild-share, or the pacer].
        #[arg(long, value_delimiter = ',')]
        rebuild_shares: Vec<f64>,
        /// Times the recovery runs are made, interleaved (ECRec's, then `full`'s, then again):
        /// the figures of a recovery vary from run to run, so they are given as means with a
        /// 95% interval, and each ECRec run is compared with the `full` run of its own round.
        #[arg(long, default_value_t = 1)]
        recovery_repeats: u32,
        /// Leave out the `full` recovery run.
        #[arg(long)]
        no_full: bool,
        /// Leave out every recovery run (ECRec's and `full`'s).
        #[arg(long)]
        no_recovery: bool,
    },
}

/// The run flags of `ftrec bench ecrec`: [`RunArgs`], with `--workers` taking a comma list of
/// worker counts (a sweep: `none` and ECRec all on at each count). Kept as text by clap and
/// checked by [`crate::bench_ecrec::parse_worker_counts`], so that a bad count is one error
/// line like every other bad setting of the bench.
#[derive(Debug, Clone, Default)]
pub struct EcrecRunArgs {
    pub run: RunArgs,
    /// `--workers` as given (`None`: not given).
    pub workers: Option<String>,
}

impl clap::FromArgMatches for EcrecRunArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Self::from_arg_matches_mut(&mut m.clone())
    }

    fn from_arg_matches_mut(m: &mut clap::ArgMatches) -> Result<Self, clap::Error> {
        // Taken out first: `RunArgs` then finds no `--workers` (its own type is a number).
        let workers = m.remove_one::<String>("workers");
        Ok(EcrecRunArgs {
            run: RunArgs::from_arg_matches_mut(m)?,
            workers,
        })
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for EcrecRunArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        RunArgs::augment_args(cmd).mut_arg("workers", |a| {
            a.value_parser(clap::builder::NonEmptyStringValueParser::new())
                .value_name("N[,N...]")
                .help(
                    "Worker processes; a comma list (e.g. 2,4,8,15) runs `none` and ECRec all \
                     on at each count [default: 1]",
                )
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}
