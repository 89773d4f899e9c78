//! `ftrec ckpt ...`: inspect and maintain a checkpoint store (a directory or `s3://bucket/prefix`).
//!
//! - `ls LOCATION`: the lineage graph: kind, merge layer, step, size, parent, what a merged
//!   checkpoint stands for; `*` marks `CURRENT`, `+` what the active lineage needs; for
//!   incremental stores also each piece's scheme and column and, for IncrCP's chunk list, what
//!   its extraction round did and the shape of the head's 2-D list;
//! - `verify LOCATION`: reads every file of every checkpoint and checks every checksum; exit 1 if
//!   anything is damaged, each problem named (a chunk-list file no live chunk needs may be
//!   gone: garbage collection removed it);
//! - `restore LOCATION --at STEP|ID --out DIR`: rebuilds the state (full + merged + deltas, or
//!   base + pieces) and writes it to DIR as one full checkpoint;
//! - `gc LOCATION`: deletes what no live lineage needs (DECK §4.3), and chunk-list files no
//!   live chunk points into (IncrCP §4.4);
//! - `merge LOCATION`: one hierarchical merge pass (DECK §3.3; refused on incremental stores);
//! - `export LOCATION --out FILE`: the model of a state as safetensors ([`crate::export`]).
//!
//! S3 endpoint, region and credentials come from the flags or the usual AWS variables.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use ftrec_ckpt::deck::{self, GcOptions, Lineage, RestoreAt, Retention};
use ftrec_ckpt::incr;
use ftrec_ckpt::{Checkpoints, LocalStore};

pub use ftrec_cluster::args::StoreArgs;

/// Opening the store that [`StoreArgs`] names: an existing store only
/// ([`crate::restored::open_store`]).
pub trait OpenStore {
    async fn open(&self) -> Result<Checkpoints>;
}

impl OpenStore for StoreArgs {
    async fn open(&self) -> Result<Checkpoints> {
        crate::restored::open_store(&self.location, &self.options()).await
    }
}

#[derive(Debug, Subcommand)]
pub enum CkptCmd {
    /// Show the lineage graph.
    Ls {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Read and check every file of every checkpoint.
    Verify {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Rebuild a state and write it to a directory as one full checkpoint.
    Restore {
        #[command(flatten)]
        store: StoreArgs,
        /// A step (the newest state at or before it) or a checkpoint id; default: CURRENT.
        #[arg(long)]
        at: Option<String>,
        /// Output directory (a new local checkpoint store).
        #[arg(long)]
        out: std::path::PathBuf,
        /// If the chosen state is damaged, use the newest intact one before it.
        #[arg(long)]
        fallback: bool,
    },
    /// Delete checkpoints no live lineage needs.
    Gc {
        #[command(flatten)]
        store: StoreArgs,
        /// Keep older full checkpoints at least this many steps apart (0: none).
        #[arg(long, default_value_t = 0)]
        keep_full_every_steps: u64,
        /// At most this many older fulls.
        #[arg(long, default_value_t = 4)]
        keep_old_fulls: usize,
        /// Also remove directories without a manifest (only when nothing is writing).
        #[arg(long)]
        orphans: bool,
    },
    /// Run one hierarchical merge pass (and, with --gc, collect garbage after it).
    Merge(ftrec_cluster::args::MergeArgs),
    /// Write a state's model (dense layers, embedding tables, optionally optimizer state) as
    /// one safetensors file.
    Export(crate::export::ExportArgs),
}

/// `--at`: a step or a checkpoint id ([`crate::restored::parse_at`]); none: `CURRENT`.
fn parse_at(at: &Option<String>) -> Result<RestoreAt> {
    crate::restored::parse_at(at.as_deref())
}

/// Run one `ftrec ckpt` subcommand; returns the process exit code.
pub fn run(cmd: CkptCmd) -> Result<i32> {
    if matches!(cmd, CkptCmd::Merge(_)) {
        // The merger runs its own runtime.
        return merge(cmd);
    }
    if let CkptCmd::Export(a) = cmd {
        // The export runs its own runtime for the restore.
        return crate::export::run(a).map(|()| 0);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(run_async(cmd))
}

async fn run_async(cmd: CkptCmd) -> Result<i32> {
    match cmd {
        CkptCmd::Ls { store } => {
            let ckpts = store.open().await?;
            let lineage = Lineage::load(&ckpts).await?;
            if lineage.nodes().next().is_none() && lineage.unreadable.is_empty() {
                println!("no checkpoints in {}", store.location);
                return Ok(0);
            }
            print!("{}", lineage.render());
            if incr::is_incremental_store(&ckpts).await? {
                print_pieces(&ckpts, &lineage).await?;
            }
            if let Some(head) = lineage.head() {
                match lineage.resolve(&head) {
                    Ok(chain) => println!(
                        "head {head}: {}",
                        chain
                            .iter()
                            .map(|c| c.to_string())
                            .collect::<Vec<_>>()
                            .join(" -> ")
                    ),
                    Err(e) => println!("head {head}: cannot be rebuilt: {e}"),
                }
            }
            Ok(0)
        }
        CkptCmd::Verify { store } => {
            let ckpts = store.open().await?;
            let check = ftrec_ckpt::verify::verify_store(&ckpts).await?;
            print!("{}", check.render());
            Ok(if check.is_ok() { 0 } else { 1 })
        }
        CkptCmd::Restore {
            store,
            at,
            out,
            fallback,
        } => {
            let ckpts = store.open().await?;
            let at = parse_at(&at)?;
            if out.exists() && std::fs::read_dir(&out)?.next().is_some() {
                bail!("--out {} is not empty", out.display());
            }
            if incr::is_incremental_store(&ckpts).await? {
                return restore_incremental(&ckpts, &at, &out, fallback).await;
            }
            let chain = deck::select_chain(&ckpts, &at, fallback).await?;
            let dst = Checkpoints::new(std::sync::Arc::new(LocalStore::new(&out)?));
            let m = deck::materialize_full(&ckpts, &chain, &dst, 4 << 20).await?;
            println!(
                "restored step {} from {} into {} as full checkpoint {} ({} bytes)",
                m.step,
                chain
                    .iter()
                    .map(|c| c.id.to_string())
                    .collect::<Vec<_>>()
                    .join(" -> "),
                out.display(),
                m.id,
                m.data_bytes()
            );
            Ok(0)
        }
        CkptCmd::Gc {
            store,
            keep_full_every_steps,
            keep_old_fulls,
            orphans,
        } => {
            let ckpts = store.open().await?;
            let opts = GcOptions {
                retention: Retention {
                    full_every_steps: keep_full_every_steps,
                    max_old_fulls: keep_old_fulls,
                },
                remove_orphans: orphans,
            };
            let rep = if incr::is_incremental_store(&ckpts).await? {
                let r = incr::gc(&ckpts, &opts).await?;
                for f in &r.dead_files {
                    println!("removed {f} (no live chunk)");
                }
                println!(
                    "removed {} chunk-list files ({} bytes) no live chunk needs",
                    r.dead_files.len(),
                    r.dead_bytes
                );
                r.lineage
            } else {
                deck::gc(&ckpts, &opts).await?
            };
            for id in &rep.deleted {
                println!("deleted {id}");
            }
            for o in &rep.orphans_removed {
                println!("removed orphan {o}");
            }
            println!(
                "kept {} checkpoints, deleted {}, removed {} orphans",
                rep.kept.len(),
                rep.deleted.len(),
                rep.orphans_removed.len()
            );
            Ok(0)
        }
        CkptCmd::Merge(_) => bail!("merge runs outside the async runtime"),
        CkptCmd::Export(_) => bail!("export runs outside the async runtime"),
    }
}

/// Scheme, column and base of every piece; for a chunk list, each round's extraction and the
/// shape of the head's list.
async fn print_pieces(ckpts: &Checkpoints, lineage: &Lineage) -> Result<()> {
    println!("incremental pieces:");
    for n in lineage.nodes() {
        let m = ckpts.read_manifest(&n.id, None).await?;
        let Some((_, scheme, column)) = m.pieces().next() else {
            continue;
        };
        let sums = incr::piece_summaries(ckpts, &m).await?;
        let mut line = format!(
            "  {:<40} {:<12} column {:>4} over {}",
            n.id.as_str(),
            scheme.name(),
            column,
            sums.first().map_or("?".to_string(), |p| p.base.to_string())
        );
        if let Some(b) = sums.iter().filter_map(|p| p.quant).next() {
            let err = sums
                .iter()
                .map(|p| p.quant_max_abs_error)
                .fold(0f32, f32::max);
            line.push_str(&format!(
                ", {}-bit values (max abs error {err:.3e})",
                b.bits()
            ));
        }
        if scheme == incr::PieceScheme::ChunkList {
            let mut st = ftrec_ckpt::format::ExtractStats::default();
            for p in &sums {
                st.add(&p.stats);
            }
            line.push_str(&format!(
                ", extraction: {} compared, skipped {} by range / {} by Bloom / {} by count, {} \
                 extracted ({} rows moved)",
                st.compared,
                st.range_skips,
                st.bloom_skips,
                st.actual_skips,
                st.extracted,
                st.rows_extracted
            ));
        }
        println!("{line}");
    }
    if let Ok(chain) = incr::select(ckpts, &RestoreAt::Current).await {
        if chain.scheme == Some(incr::PieceScheme::ChunkList) {
            for s in &chain.base.shards {
                let list = incr::restore::fold_list(ckpts, &chain, s.server).await?;
                let (row0, deeper, live, files) = list.shape();
                println!(
                    "  chunk list of server {}: {} columns, {row0} row-0 chunks, {deeper} \
                     deeper, {live} of {files} files live, newest state reads {} bytes",
                    s.server.0,
                    list.len(),
                    list.rectangle_bytes(list.len())
                );
            }
        }
    }
    Ok(())
}

async fn restore_incremental(
    ckpts: &Checkpoints,
    at: &RestoreAt,
    out: &std::path::Path,
    fallback: bool,
) -> Result<i32> {
    let chain = if fallback {
        // The newest state at or before `at` whose every file a restore reads is intact.
        let (chain, skipped) = incr::select_intact(ckpts, at).await?;
        for (id, why) in &skipped {
            println!("skipping {id}: {why}");
        }
        chain
    } else {
        incr::select(ckpts, at).await?
    };
    let shards = incr::restore_all(ckpts, &chain).await?;
    let dst = Checkpoints::new(std::sync::Arc::new(LocalStore::new(out)?));
    let m = incr::write_full(&dst, &chain, &shards, 4 << 20).await?;
    println!(
        "restored step {} ({} column {} over {}) into {} as full checkpoint {} ({} bytes)",
        m.step,
        chain.scheme.map_or("full", |s| s.name()),
        chain.target,
        chain.base.id,
        out.display(),
        m.id,
        m.data_bytes()
    );
    Ok(0)
}

fn merge(cmd: CkptCmd) -> Result<i32> {
    let CkptCmd::Merge(m) = cmd else {
        bail!("not a merge");
    };
    m.obs.start()?;
    {
        // The store must exist before the merger opens it (opening creates a directory).
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?
            .block_on(m.store.open())?;
        let args = m.merger();
        // Progress lines (`writing ID`, `wrote ID`) come from the merger as it goes.
        let (rep, gc) = ftrec_cluster::merger::merge_once(&args)?;
        println!(
            "{} checkpoints written, {} bytes read, {} bytes written",
            rep.written.len(),
            rep.stats.bytes_read,
            rep.bytes_written
        );
        if let Some(g) = gc {
            println!(
                "gc: kept {} checkpoints, deleted {}",
                g.kept.len(),
                g.deleted.len()
            );
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_is_a_step_or_an_id() {
        assert_eq!(parse_at(&None).unwrap(), RestoreAt::Current);
        assert_eq!(parse_at(&Some("42".into())).unwrap(), RestoreAt::Step(42));
        assert!(matches!(
            parse_at(&Some("00000000000000000042-delta-a0".into())).unwrap(),
            RestoreAt::Id(_)
        ));
        assert!(parse_at(&Some("../x".into())).is_err());
    }

    #[test]
    fn an_empty_directory_is_not_a_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = StoreArgs {
            location: dir.path().to_string_lossy().into_owned(),
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            allow_http: false,
        };
        for cmd in [
            CkptCmd::Ls {
                store: store.clone(),
            },
            CkptCmd::Verify { store },
        ] {
            let e = format!("{:#}", run(cmd).unwrap_err());
            assert!(e.contains("is not a checkpoint store"), "{e}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_bad_location_is_an_error_naming_it() {
        let e = run(CkptCmd::Ls {
            store: StoreArgs {
                location: "gs://bucket/x".into(),
                endpoint: None,
                region: None,
                access_key_id: None,
                secret_access_key: None,
                allow_http: false,
            },
        })
        .unwrap_err();
        assert!(format!("{e:#}").contains("gs://bucket/x"), "{e:#}");
    }
}
