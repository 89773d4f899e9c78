//! The one definition of the flags of the cluster's processes (`server`, `worker`, `ckpt
//! merge`) and of the flag groups `ftrec run` shares with them (optimizers, ECRec, CPR
//! priorities). The `ftrec` binary flattens these into its own commands, and the cluster
//! crate's test binary (`ftrec-cluster-server`) parses its command line with [`ProcessCli`], so
//! the command lines the launcher writes ([`ServerSpec::to_args`], [`MergerArgs::to_args`]) are
//! read back by exactly the parser a user's `ftrec server ...` goes through.

use std::net::SocketAddr;

use ftrec_ps::net::PeerAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use ftrec_ckpt::location::LocationOptions;
use ftrec_core::{Optimizer, OptimizerKind, Preset};

pub use crate::auth::AuthArgs;
use crate::cpr::{ServerPriority, DEFAULT_LARGEST_TABLES, DEFAULT_R, DEFAULT_SSU_PERIOD};
use crate::ecrec::EcFlags;
use crate::merger::MergerArgs;
use crate::spec::{CkptSpec, ServerSpec, DEFAULT_CHUNK_KIB};
use crate::worker::WorkerLifetime;
use crate::ClusterError;

/// Optimizer flags shared by every command that builds a model.
#[derive(Args, Debug, Clone, Default, PartialEq)]
pub struct OptimizerArgs {
    /// Optimizer of the embedding rows: sgd, momentum, adagrad, rowwise_adagrad, adam.
    #[arg(long)]
    pub optimizer: Option<String>,
    /// Learning rate of the embedding rows.
    #[arg(long)]
    pub lr: Option<f32>,
    /// Optimizer of the dense MLP.
    #[arg(long)]
    pub dense_optimizer: Option<String>,
    /// Learning rate of the dense MLP.
    #[arg(long)]
    pub dense_lr: Option<f32>,
    /// Adagrad or rowwise_adagrad of the embedding rows: the value every accumulator starts
    /// from (TensorFlow's initial_accumulator_value) [default: 0].
    #[arg(long, value_name = "A0")]
    pub initial_accumulator: Option<f32>,
    /// Adagrad or rowwise_adagrad of the dense MLP: the value every accumulator starts from.
    /// Asynchronous workers' first updates all come from the initial model; at 0 each takes
    /// an Adagrad step of about the learning rate per weight, and several workers' steps in one
    /// direction can blow the loss up in the first steps (0.1 removes that on `small`)
    /// [default: 0].
    #[arg(long, value_name = "A0")]
    pub dense_initial_accumulator: Option<f32>,
}

impl OptimizerArgs {
    /// Override the preset's optimizers with whatever the flags name.
    pub fn apply(
        &self,
        sparse: &mut Optimizer,
        dense: &mut Optimizer,
    ) -> Result<(), ftrec_core::CoreError> {
        let one = |name: &Option<String>,
                   default: Optimizer,
                   lr: Option<f32>,
                   a0: Option<f32>,
                   flag: &str| {
            let kind = match name {
                Some(n) => n.parse::<OptimizerKind>()?,
                None => default.kind,
            };
            let opt = Optimizer::new(kind, lr.unwrap_or(default.lr))
                .with_initial_accumulator(a0.unwrap_or(default.initial_accumulator));
            if a0.is_some() {
                opt.validate().map_err(|e| {
                    let why = match e {
                        ftrec_core::CoreError::InvalidConfig(m) => m,
                        other => other.to_string(),
                    };
                    ftrec_core::CoreError::InvalidConfig(format!("{flag}: {why}"))
                })?;
            }
            Ok::<_, ftrec_core::CoreError>(opt)
        };
        *sparse = one(
            &self.optimizer,
            *sparse,
            self.lr,
            self.initial_accumulator,
            "--initial-accumulator",
        )?;
        *dense = one(
            &self.dense_optimizer,
            *dense,
            self.dense_lr,
            self.dense_initial_accumulator,
            "--dense-initial-accumulator",
        )?;
        Ok(())
    }
}

/// CPR flags of `ftrec server`: the priority rule of its checkpoint service.
#[derive(Args, Debug, Default, Clone, PartialEq)]
pub struct CprServerArgs {
    /// CPR: track priorities for prioritized partial saves: mfu, ssu or scar (needs
    /// --ckpt-staging).
    #[arg(long = "cpr-priority", value_name = "RULE")]
    pub priority: Option<String>,
    /// CPR: share of each prioritized table's rows a prioritized save writes [default: 0.125].
    #[arg(long = "cpr-r", value_name = "R")]
    pub r: Option<f64>,
    /// CPR-SSU: look at every N-th update [default: 2].
    #[arg(long = "cpr-ssu-period", value_name = "N")]
    pub ssu_period: Option<u32>,
    /// CPR: prioritize the N largest tables [default: 7].
    #[arg(long = "cpr-tables", value_name = "N")]
    pub tables: Option<usize>,
}

impl CprServerArgs {
    /// The priority rule the flags name, validated; `None` without `--cpr-priority`.
    pub fn server_priority(&self) -> Result<Option<ServerPriority>, ClusterError> {
        let Some(p) = &self.priority else {
            if self.r.is_some() || self.ssu_period.is_some() || self.tables.is_some() {
                return Err(ClusterError::Config(
                    "--cpr-r, --cpr-ssu-period and --cpr-tables need --cpr-priority".into(),
                ));
            }
            return Ok(None);
        };
        let p = ServerPriority {
            priority: p
                .parse()
                .map_err(|e| ClusterError::Config(format!("--cpr-priority: {e}")))?,
            r: self.r.unwrap_or(DEFAULT_R),
            ssu_period: self.ssu_period.unwrap_or(DEFAULT_SSU_PERIOD),
            largest_tables: self.tables.unwrap_or(DEFAULT_LARGEST_TABLES),
        };
        p.validate()?;
        Ok(Some(p))
    }
}

/// ECRec flags of `ftrec run` (strategy ecrec only) and of `ftrec server` (an ECRec node).
#[derive(Args, Debug, Default, Clone, PartialEq)]
pub struct EcRunArgs {
    /// ECRec: data rows per stripe [default: 2].
    #[arg(long, value_name = "K")]
    pub ec_k: Option<usize>,
    /// ECRec: parity rows per stripe, servers that may be lost at once [default: 1].
    #[arg(long, value_name = "R")]
    pub ec_r: Option<usize>,
    /// ECRec: sum (the paper's float sum, r = 1, approximate) or gf256 (exact) [default:
    /// gf256].
    #[arg(long, value_name = "CODE")]
    pub ec_code: Option<String>,
    /// ECRec: no copies of the dense blocks (a lost server's dense range cannot be rebuilt).
    #[arg(long)]
    pub no_dense_replication: bool,
    /// ECRec: one-phase steps instead of two-phase commit (a loss mid-step can leave parities
    /// a step behind).
    #[arg(long = "no-2pc")]
    pub no_2pc: bool,
    /// ECRec: lock ranges of a rebuild [default: 1].
    #[arg(long, value_name = "L")]
    pub recovery_locks: Option<usize>,
    /// ECRec: a fixed share of the time a replacement's background rebuild may work, from 0
    /// to 1 (it rests between batches; 0 holds the rebuild until training ends, serving lost
    /// rows by degraded reads meanwhile) [default: paced, see --rebuild-min-throughput]
    #[arg(long, value_name = "F")]
    pub rebuild_share: Option<f64>,
    /// ECRec: the training throughput a rebuild leaves, as a fraction of the throughput
    /// before the failure: the coordinator paces the rebuild's share of the time to keep
    /// training there (starting at 1 - F) and raises it while training keeps more, so that
    /// the rebuild finishes as fast as that allows [default: 0.9]
    #[arg(long, value_name = "F")]
    pub rebuild_min_throughput: Option<f64>,
}

impl EcRunArgs {
    pub fn flags(&self) -> EcFlags {
        EcFlags {
            code: self.ec_code.clone(),
            k: self.ec_k,
            r: self.ec_r,
            no_dense_replication: self.no_dense_replication,
            no_2pc: self.no_2pc,
            recovery_locks: self.recovery_locks,
            rebuild_share: self.rebuild_share,
            rebuild_min_throughput: self.rebuild_min_throughput,
            replacement: false,
        }
    }
}

/// TLS on every gRPC connection of a process (`ftrec run`, `coordinator`, `server`,
/// `worker`; see `ftrec_ps::tls`). Part of [`AuthArgs`], passed down the same way: processes
/// `ftrec run` starts get the paths through their environment.
#[derive(Args, Debug, Clone, Default, PartialEq)]
pub struct TlsArgs {
    /// PEM certificate chain this process presents, as a server and as a client (mutual TLS).
    /// With --tls-key and --tls-ca; default: $FTREC_TLS_CERT.
    #[arg(long, value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert. Default: $FTREC_TLS_KEY.
    #[arg(long, value_name = "PATH")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificate authority: servers and clients whose certificate does not chain to it
    /// are refused. Default: $FTREC_TLS_CA.
    #[arg(long, value_name = "PATH")]
    pub tls_ca: Option<PathBuf>,
}

impl TlsArgs {
    pub fn is_empty(&self) -> bool {
        self.tls_cert.is_none() && self.tls_key.is_none() && self.tls_ca.is_none()
    }

    /// The files these flags name, read and checked (`None` without flags).
    pub fn load(&self) -> Result<Option<ftrec_ps::tls::Tls>, ClusterError> {
        Ok(ftrec_ps::tls::Tls::load(
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.tls_ca.as_deref(),
        )?)
    }
}

/// Observability flags of every process: its metrics endpoint and its log format.
#[derive(Args, Debug, Clone, Default, PartialEq)]
pub struct ObsArgs {
    /// Serve Prometheus metrics (/metrics), liveness (/healthz) and readiness (/readyz) over
    /// HTTP here: an address, or HOST:PORT with a name looked up once [default: none].
    #[arg(long, value_name = "ADDR", value_parser = ftrec_ps::net::listen_addr)]
    pub metrics_listen: Option<SocketAddr>,
    /// Log lines on stderr: text, or json (one JSON object a line, the run's timeline events
    /// among them) [default: text].
    #[arg(long, value_name = "FORMAT", value_parser = parse_log_format)]
    pub log_format: Option<ftrec_obs::LogFormat>,
    /// Keep serving --metrics-listen this many seconds after the job ended, so that a scrape
    /// after the end reads the final counts (ftrec run and ftrec coordinator) [default: 0].
    #[arg(long, value_name = "SECONDS", requires = "metrics_listen")]
    pub metrics_linger_s: Option<f64>,
}

/// The log format a process takes when it has no `--log-format` (set for the processes a
/// run starts by the run's own flag).
pub const LOG_FORMAT_ENV: &str = "FTREC_LOG_FORMAT";

fn parse_log_format(s: &str) -> Result<ftrec_obs::LogFormat, String> {
    s.parse().map_err(|e: ftrec_obs::ObsError| e.to_string())
}

impl ObsArgs {
    /// Set the log format and open the metrics endpoint (before any other work, so a taken
    /// port is the first thing the process reports). The endpoint's address, if any.
    pub fn start(&self) -> Result<Option<SocketAddr>, ClusterError> {
        // The processes a run starts inherit the format through the environment.
        let inherited = std::env::var(LOG_FORMAT_ENV)
            .ok()
            .and_then(|f| f.parse().ok());
        let format = self.log_format.or(inherited).unwrap_or_default();
        if self.log_format.is_some() {
            // Called first thing, while the process has one thread.
            std::env::set_var(LOG_FORMAT_ENV, format.name());
        }
        ftrec_obs::init_logs(format);
        match self.metrics_listen {
            None => Ok(None),
            Some(addr) => {
                let e = ftrec_obs::Endpoint::start(addr)
                    .map_err(|e| ClusterError::Config(e.to_string()))?;
                tracing::info!("metrics at http://{}/metrics", e.addr());
                Ok(Some(e.addr()))
            }
        }
    }

    /// `--metrics-linger-s` as a duration, checked (finite, not negative).
    pub fn linger(&self) -> Result<std::time::Duration, ClusterError> {
        let s = self.metrics_linger_s.unwrap_or(0.0);
        std::time::Duration::try_from_secs_f64(s).map_err(|_| {
            ClusterError::Config(format!(
                "--metrics-linger-s {s}: give a number of seconds, 0 or more"
            ))
        })
    }

    /// At the end of a job: keep the metrics endpoint up for `--metrics-linger-s`.
    pub fn linger_at_end(&self) {
        if let (Some(_), Ok(d)) = (self.metrics_listen, self.linger()) {
            if !d.is_zero() {
                ftrec_obs::set_ready(false);
                tracing::info!(
                    "the job ended: serving metrics {:.0}s more (--metrics-linger-s)",
                    d.as_secs_f64()
                );
                std::thread::sleep(d);
            }
        }
    }
}

/// `--id` of a server: a number, or the name of a StatefulSet's pod (`ftrec-server-2`), whose
/// trailing number is its ordinal.
pub fn server_id(s: &str) -> Result<u32, String> {
    let digits = s.rsplit('-').next().unwrap_or(s);
    digits.parse::<u32>().map_err(|_| {
        format!("{s:?} is neither a server id nor a name ending in -N (a StatefulSet pod's name)")
    })
}

/// Flags of one worker process (`ftrec worker`).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct WorkerArgs {
    /// The coordinator's control socket: HOST:PORT, with a DNS name (looked up at every
    /// connection attempt), an IPv4 or an `[IPv6]` address.
    #[arg(long, value_name = "HOST:PORT")]
    pub coordinator: PeerAddr,
    #[arg(long)]
    pub id: u32,
    /// What ends the worker besides its control connection: `control` (only the
    /// connection) or `stdin` (also end of file on standard input; what `ftrec run` asks of
    /// the workers it starts).
    #[arg(long, default_value = "control")]
    pub until: String,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub obs: ObsArgs,
}

impl WorkerArgs {
    pub fn lifetime(&self) -> Result<WorkerLifetime, ClusterError> {
        match self.until.as_str() {
            "control" => Ok(WorkerLifetime::Control),
            "stdin" => Ok(WorkerLifetime::Stdin),
            other => Err(ClusterError::Config(format!(
                "--until must be control or stdin, not {other:?}"
            ))),
        }
    }

    /// Run the worker process until its coordinator ends the session.
    pub fn run(&self) -> Result<(), ClusterError> {
        crate::worker_process(
            &self.coordinator,
            self.id,
            self.lifetime()?,
            &self.auth.resolve()?,
        )
    }
}

/// Flags of one parameter-server process (`ftrec server`).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct ServerArgs {
    /// This server's id: a number from 0, or a name ending in -N whose N is the id (a
    /// StatefulSet pod's name, `ftrec-server-2`).
    #[arg(long, value_parser = server_id)]
    pub id: u32,
    #[arg(long)]
    pub servers: u32,
    #[arg(long)]
    pub preset: String,
    /// Rows of each table, comma-separated, instead of the preset's (a job on TSV data: the
    /// coordinator's tables, which `ftrec run` passes to the servers it starts).
    #[arg(long, value_name = "R1,R2,...", value_delimiter = ',')]
    pub table_rows: Vec<u64>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub opt: OptimizerArgs,
    /// Where to serve: an address, or HOST:PORT with a name looked up once at start; port 0
    /// takes a free one (the bound address is printed, and written to --port-file).
    #[arg(long, default_value = "127.0.0.1:0", value_parser = ftrec_ps::net::listen_addr)]
    pub listen: SocketAddr,
    /// Write the bound address here (atomically) once serving.
    #[arg(long, value_name = "PATH")]
    pub port_file: Option<PathBuf>,
    /// What ends the server: `signal` (SIGINT/SIGTERM) or `stdin` (end of file on standard
    /// input, or a signal; what `ftrec run` asks of the servers it starts).
    #[arg(long, default_value = "signal")]
    pub until: String,
    /// Serve the checkpoint service too, staging chunks in this local directory (saving
    /// strategies: full, deck, ...; store settings from the AWS environment variables).
    #[arg(long, value_name = "DIR")]
    pub ckpt_staging: Option<PathBuf>,
    /// Staging chunk size in KiB (with --ckpt-staging) [default: 4096].
    #[arg(long, value_name = "KIB")]
    pub ckpt_chunk_kib: Option<usize>,
    #[command(flatten)]
    pub cpr: CprServerArgs,
    /// ECRec node (strategy ecrec): the same `--ec-*` flags as `ftrec run` (`--ec-k` and
    /// `--ec-r` required).
    #[command(flatten)]
    pub ec: EcRunArgs,
    /// ECRec: start as the empty replacement of a lost server, to be rebuilt.
    #[arg(long)]
    pub ec_replacement: bool,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub obs: ObsArgs,
}

impl ServerArgs {
    /// The validated spec these flags describe.
    pub fn spec(&self) -> Result<ServerSpec, ClusterError> {
        let preset =
            Preset::by_name(&self.preset).map_err(|e| ClusterError::Config(e.to_string()))?;
        let mut spec = ServerSpec::from_preset(&preset, self.id, self.servers, self.seed)?;
        if !self.table_rows.is_empty() {
            spec.table_rows = Some(self.table_rows.clone());
        }
        self.opt
            .apply(&mut spec.sparse_optimizer, &mut spec.dense_optimizer)
            .map_err(|e| ClusterError::Config(e.to_string()))?;
        spec.listen = self.listen;
        spec.port_file = self.port_file.clone();
        spec.until = self.until.parse()?;
        let priority = self.cpr.server_priority()?;
        match &self.ckpt_staging {
            Some(dir) => {
                spec.ckpt = Some(CkptSpec {
                    staging_dir: dir.clone(),
                    chunk_bytes: self
                        .ckpt_chunk_kib
                        .unwrap_or(DEFAULT_CHUNK_KIB)
                        .saturating_mul(1024),
                    priority,
                })
            }
            None if self.ckpt_chunk_kib.is_some() => {
                return Err(ClusterError::Config(
                    "--ckpt-chunk-kib needs --ckpt-staging".into(),
                ))
            }
            None if priority.is_some() => {
                return Err(ClusterError::Config(
                    "--cpr-priority needs --ckpt-staging".into(),
                ))
            }
            None => {}
        }
        let mut ec = self.ec.flags();
        ec.replacement = self.ec_replacement;
        spec.ec = ec.server_spec()?;
        spec.auth = self.auth.resolve()?;
        if spec.auth.fences.me().is_none() && spec.auth.job.is_some() {
            // A server of one job started without an incarnation (by an operator or an
            // orchestrator): the job's coordinator names its epoch, so that it can be fenced
            // once replaced.
            spec.auth.fences =
                ftrec_ps::fence::Fences::awaiting(ftrec_ps::fence::FenceRole::Server, spec.id);
        }
        crate::auth::check_exposure("--listen", spec.listen, &spec.auth, self.auth.insecure)?;
        spec.validate()?;
        Ok(spec)
    }
}

/// Where a checkpoint store is and how to reach it.
#[derive(Debug, Clone, Args, PartialEq)]
pub struct StoreArgs {
    /// A directory or s3://bucket/prefix.
    pub location: String,
    /// S3 endpoint URL (default: $AWS_ENDPOINT_URL).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// S3 region (default: $AWS_REGION, else us-east-1).
    #[arg(long)]
    pub region: Option<String>,
    /// S3 access key id (default: $AWS_ACCESS_KEY_ID).
    #[arg(long)]
    pub access_key_id: Option<String>,
    /// S3 secret access key (default: $AWS_SECRET_ACCESS_KEY).
    #[arg(long)]
    pub secret_access_key: Option<String>,
    /// Allow a plain http:// endpoint (default: when the endpoint starts with http://).
    #[arg(long)]
    pub allow_http: bool,
}

impl StoreArgs {
    pub fn options(&self) -> LocationOptions {
        LocationOptions {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
            allow_http: self.allow_http.then_some(true),
        }
    }
}

/// Flags of one merger pass (`ftrec ckpt merge LOCATION ...`), DECK §3.3.
#[derive(Debug, Clone, Args, PartialEq)]
pub struct MergeArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Merge every S consecutive checkpoints of one layer (DECK Inequality 1).
    #[arg(long, default_value_t = 2)]
    pub stride: usize,
    /// Write a full once the active chain covers N deltas (DECK Inequality 2).
    #[arg(long)]
    pub full_every_deltas: Option<u64>,
    /// Output chunk size in KiB.
    #[arg(long, default_value_t = 4096)]
    pub chunk_kib: usize,
    /// Cap the write rate (MiB/s), so a merge next to training leaves it the disk.
    #[arg(long)]
    pub max_mib_per_s: Option<f64>,
    /// Delete what no live lineage needs once the merge is done.
    #[arg(long)]
    pub gc: bool,
    /// Work for the job holding the store's lease at this generation only: the pass stops
    /// with one line (exit status 3), writing and deleting nothing more, once another job or
    /// a resume took the store over, or the job gave the lease up. `ftrec run` sets it for the
    /// merger it starts; without it the pass works for whoever holds the store.
    #[arg(long, value_name = "G")]
    pub writer_generation: Option<u64>,
    #[command(flatten)]
    pub obs: ObsArgs,
}

impl MergeArgs {
    /// The merger pass these flags describe.
    pub fn merger(&self) -> MergerArgs {
        MergerArgs {
            location: self.store.location.clone(),
            stride: self.stride,
            full_every_deltas: self.full_every_deltas,
            chunk_bytes: self.chunk_kib.max(1).saturating_mul(1024),
            max_mib_per_s: self.max_mib_per_s,
            gc: self.gc,
            writer_generation: self.writer_generation,
            store: self.store.options(),
        }
    }
}

/// The command line of the cluster crate's own process binary (`ftrec-cluster-server`), which
/// its tests launch instead of the whole `ftrec` binary: the same subcommands and flags.
#[derive(Parser, Debug)]
#[command(name = "ftrec-cluster-server")]
pub struct ProcessCli {
    #[command(subcommand)]
    pub cmd: ProcessCmd,
}

// Parsed once per process: the size of the server variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum ProcessCmd {
    /// One parameter-server process.
    Server(ServerArgs),
    /// One worker process.
    Worker(WorkerArgs),
    /// Checkpoint stores (only the merger pass).
    Ckpt {
        #[command(subcommand)]
        cmd: ProcessCkptCmd,
    },
}

#[derive(Subcommand, Debug)]
pub enum ProcessCkptCmd {
    /// One merger pass.
    Merge(MergeArgs),
}

/// A clap error as one line: its message without the usage block and the help hint.
pub fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let msg: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    msg.join(" ").trim_start_matches("error: ").to_string()
}

/// Parse a process command line (without the executable name).
pub fn parse_process(args: &[String]) -> Result<ProcessCmd, ClusterError> {
    ProcessCli::try_parse_from(
        std::iter::once("ftrec-cluster-server").chain(args.iter().map(String::as_str)),
    )
    .map(|c| c.cmd)
    .map_err(|e| ClusterError::Config(one_line(&e)))
}

impl ServerSpec {
    /// Parse what [`ServerSpec::to_args`] writes, with the flags of `ftrec server`
    /// ([`ServerArgs`]; the leading `server` word is optional).
    pub fn from_args(args: &[String]) -> Result<ServerSpec, ClusterError> {
        let mut full = Vec::with_capacity(args.len() + 1);
        if args.first().map(String::as_str) != Some("server") {
            full.push("server".to_string());
        }
        full.extend_from_slice(args);
        match parse_process(&full)? {
            ProcessCmd::Server(a) => a.spec(),
            other => Err(ClusterError::Config(format!(
                "not a server command: {other:?}"
            ))),
        }
    }
}

impl MergerArgs {
    /// Parse what [`MergerArgs::to_args`] writes, with the flags of `ftrec ckpt merge`
    /// ([`MergeArgs`]; the leading `ckpt merge` is optional).
    pub fn from_args(args: &[String]) -> Result<MergerArgs, ClusterError> {
        let mut rest = args;
        if rest.first().is_some_and(|a| a == "ckpt") {
            rest = &rest[1..];
        }
        if rest.first().is_some_and(|a| a == "merge") {
            rest = &rest[1..];
        }
        let mut full = vec!["ckpt".to_string(), "merge".to_string()];
        full.extend_from_slice(rest);
        match parse_process(&full)? {
            ProcessCmd::Ckpt {
                cmd: ProcessCkptCmd::Merge(m),
            } => Ok(m.merger()),
            other => Err(ClusterError::Config(format!(
                "not a merge command: {other:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_are_one_line_naming_the_flag() {
        let base: Vec<String> = ["--id", "0", "--servers", "2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let e = ServerSpec::from_args(&base).unwrap_err().to_string();
        assert!(e.contains("--preset") && !e.contains('\n'), "{e}");
        let mut bad = base.clone();
        bad.extend(["--preset", "tiny", "--seed", "x"].map(String::from));
        let e = ServerSpec::from_args(&bad).unwrap_err().to_string();
        assert!(e.contains("--seed") && !e.contains('\n'), "{e}");
        let mut bad = base.clone();
        bad.extend(["--preset", "tiny", "--ckpt-chunk-kib", "8"].map(String::from));
        let e = ServerSpec::from_args(&bad).unwrap_err().to_string();
        assert!(e.contains("--ckpt-staging"), "{e}");
        let mut bad = base;
        bad.extend(["--preset", "tiny", "--cpr-r", "0.5"].map(String::from));
        let e = ServerSpec::from_args(&bad).unwrap_err().to_string();
        assert!(e.contains("--cpr-priority"), "{e}");
    }

    #[test]
    fn an_initial_accumulator_is_set_where_adagrad_runs_and_refused_elsewhere() {
        let preset = ftrec_core::Preset::tiny();
        let (mut sparse, mut dense) = (
            Optimizer::new(preset.sparse_optimizer, preset.sparse_lr),
            Optimizer::new(preset.dense_optimizer, preset.dense_lr),
        );
        let a = OptimizerArgs {
            dense_initial_accumulator: Some(0.1),
            ..Default::default()
        };
        a.apply(&mut sparse, &mut dense).unwrap();
        assert_eq!(dense.initial_accumulator, 0.1);
        assert_eq!(sparse.initial_accumulator, 0.0);
        // A later change of the learning rate alone keeps it.
        let lr = OptimizerArgs {
            dense_lr: Some(0.01),
            ..Default::default()
        };
        lr.apply(&mut sparse, &mut dense).unwrap();
        assert_eq!((dense.lr, dense.initial_accumulator), (0.01, 0.1));
        let sgd = OptimizerArgs {
            optimizer: Some("sgd".into()),
            initial_accumulator: Some(0.1),
            ..Default::default()
        };
        let e = sgd.apply(&mut sparse, &mut dense).unwrap_err().to_string();
        assert!(
            e.contains("--initial-accumulator") && e.contains("sgd") && !e.contains('\n'),
            "{e}"
        );
    }

    #[test]
    fn worker_lifetimes_are_checked() {
        let a = |until: &str| WorkerArgs {
            coordinator: "127.0.0.1:1".parse().unwrap(),
            id: 0,
            until: until.into(),
            auth: AuthArgs::default(),
            obs: ObsArgs::default(),
        };
        assert_eq!(a("stdin").lifetime().unwrap(), WorkerLifetime::Stdin);
        assert_eq!(a("control").lifetime().unwrap(), WorkerLifetime::Control);
        assert!(a("never")
            .lifetime()
            .unwrap_err()
            .to_string()
            .contains("--until"));
        let cmd = parse_process(
            &[
                "worker",
                "--coordinator",
                "127.0.0.1:9",
                "--id",
                "3",
                "--until",
                "stdin",
            ]
            .map(String::from),
        )
        .unwrap();
        let ProcessCmd::Worker(w) = cmd else {
            panic!("not a worker command: {cmd:?}")
        };
        assert_eq!((w.id, w.lifetime().unwrap()), (3, WorkerLifetime::Stdin));
    }
}
