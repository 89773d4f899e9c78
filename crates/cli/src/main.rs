//! `ftrec`: the command-line front of the ftrec crates.
//!
//! The binary only parses flags into validated configurations, calls the library crates and maps
//! errors to one clear line and a non-zero exit code.

mod advise;
mod bench;
mod bench_cpr;
mod bench_cpr_sweep;
mod bench_ecrec;
mod bench_incr;
mod bench_metrics;
mod certs;
mod ckpt_cmd;
mod cluster_cmd;
mod compare;
mod data;
mod demo;
mod eval;
mod export;
mod flags;
#[cfg(test)]
mod manifest_check;
mod plot;
mod progress;
mod restored;
mod resume;
mod timeline;
mod train;

use std::process::ExitCode;

use clap::Parser;

/// The processes of a cluster job live for hours, and glibc gives every thread that allocates
/// under contention an arena of its own (up to 8 per core), which keeps its freed pages: a
/// server that read a long lineage on a burst of blocking-pool threads kept several MiB per
/// restore that `malloc_trim` could not return (measured in `docs/BENCHMARKS.md`, "Soak").
/// Two arenas keep resident memory flat. `MALLOC_ARENA_MAX`, when set, still decides.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: `mallopt` takes two integers and only sets an allocator parameter; it is
        // called before this process starts any thread.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

fn main() -> ExitCode {
    let cli = flags::Cli::parse();
    if matches!(
        cli.cmd,
        flags::Cmd::Run(_)
            | flags::Cmd::Server(_)
            | flags::Cmd::Worker(_)
            | flags::Cmd::Coordinator(_)
    ) {
        limit_malloc_arenas();
    }
    // A job's metrics endpoint outlives it by --metrics-linger-s, its last line included.
    let linger = match &cli.cmd {
        flags::Cmd::Run(a) | flags::Cmd::Coordinator(a) => Some(a.obs.clone()),
        _ => None,
    };
    let result = match cli.cmd {
        flags::Cmd::Train(args) => train::run(args),
        flags::Cmd::Data { cmd } => data::run(cmd),
        flags::Cmd::Bench { cmd } => bench::run(cmd),
        flags::Cmd::Run(args) => cluster_cmd::run(args),
        flags::Cmd::Server(args) => cluster_cmd::server(args),
        flags::Cmd::Worker(args) => cluster_cmd::worker(args),
        flags::Cmd::Ckpt { cmd } => match ckpt_cmd::run(cmd) {
            // A non-zero code without an error: `verify` found damage and said where.
            Ok(0) => Ok(()),
            Ok(code) => return ExitCode::from(code.clamp(1, 255) as u8),
            Err(e) => Err(e),
        },
        flags::Cmd::Eval(args) => eval::run(args),
        flags::Cmd::Coordinator(args) => cluster_cmd::coordinator(args),
        flags::Cmd::Compare(args) => compare::run(args),
        flags::Cmd::Demo(args) => demo::run(args),
        flags::Cmd::Advise(args) => advise::run(args),
        flags::Cmd::Certs(args) => certs::run(args),
    };
    let code = exit(result);
    if let Some(obs) = linger {
        obs.linger_at_end();
    }
    code
}

/// The exit code of a command's result, its error said in one line.
fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the chain of causes, outermost first.
            let msg: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            let line = format!("ftrec: error: {}", msg.join(": "));
            // A role's logs (--log-format json among them) carry its last line too.
            if tracing::dispatcher::has_been_set() {
                tracing::error!("{line}");
            } else {
                eprintln!("{line}");
            }
            // A process that lost its place in the job to a newer one says so in its status.
            let fenced = e.chain().any(|c| {
                matches!(
                    c.downcast_ref(),
                    Some(ftrec_cluster::ClusterError::Fenced(_))
                )
            });
            ExitCode::from(if fenced {
                ftrec_cluster::fence::FENCED_EXIT
            } else {
                2
            })
        }
    }
}

/// Write `value` as pretty JSON to `path` atomically (temp file, rename).
pub(crate) fn write_json<T: serde::Serialize>(
    path: &std::path::Path,
    value: &T,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(&tmp, text + "\n").with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Set the gemm thread count first thing, while the process has one thread.
pub(crate) fn set_threads(threads: usize) -> anyhow::Result<()> {
    ftrec_model::set_gemm_threads(threads)?;
    Ok(())
}
