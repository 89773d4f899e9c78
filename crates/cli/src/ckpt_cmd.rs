//! `ftrec ckpt ...`: inspect and maintain a checkpoint store (a directory or `s3://bucket/prefix`).
//!
//! - `ls LOCATION`: the lineage graph: kind, merge layer, step, size, parent, what a merged
//!   checkpoint stands for; `*` marks `CURRENT`, `+` what the active lineage needs;
//! - `verify LOCATION`: reads every file of every checkpoint and checks every checksum; exit 1 if
//!   anything is damaged, each problem named;
//! - `restore LOCATION --at STEP|ID --out DIR`: rebuilds the state (full + merged + deltas) and
//!   writes it to DIR as one full checkpoint;
//! - `gc LOCATION`: deletes what no live lineage needs (DECK §4.3);
//! - `merge LOCATION`: one hierarchical merge pass (DECK §3.3).
//!
//! S3 endpoint, region and credentials come from the flags or the usual AWS variables.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use ftrec_ckpt::deck::{self, GcOptions, Lineage, RestoreAt, Retention};
use ftrec_ckpt::location::{self, LocationOptions};
use ftrec_ckpt::{CheckpointId, Checkpoints, LocalStore};

/// Where the store is and how to reach it.
#[derive(Debug, Clone, Args)]
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
    fn options(&self) -> LocationOptions {
        LocationOptions {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
            allow_http: self.allow_http.then_some(true),
        }
    }

    async fn open(&self) -> Result<Checkpoints> {
        let store = location::open(&self.location, &self.options())
            .await
            .with_context(|| format!("opening checkpoint store {}", self.location))?;
        Ok(Checkpoints::new(store))
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
    Merge {
        #[command(flatten)]
        store: StoreArgs,
        /// Merge every S consecutive checkpoints of one layer (DECK Inequality 1).
        #[arg(long, default_value_t = 2)]
        stride: usize,
        /// Write a full once the active chain covers N deltas (DECK Inequality 2).
        #[arg(long)]
        full_every_deltas: Option<u64>,
        /// Output chunk size in KiB.
        #[arg(long, default_value_t = 4096)]
        chunk_kib: usize,
        /// Cap the write rate (MiB/s), so a merge next to training leaves it the disk.
        #[arg(long)]
        max_mib_per_s: Option<f64>,
        /// Delete what no live lineage needs once the merge is done.
        #[arg(long)]
        gc: bool,
    },
}

fn parse_at(at: &Option<String>) -> Result<RestoreAt> {
    Ok(match at {
        None => RestoreAt::Current,
        Some(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            RestoreAt::Step(s.parse().with_context(|| format!("step {s:?}"))?)
        }
        Some(s) => RestoreAt::Id(
            CheckpointId::new(s.clone()).with_context(|| format!("checkpoint id {s:?}"))?,
        ),
    })
}

/// Run one `ftrec ckpt` subcommand; returns the process exit code.
pub fn run(cmd: CkptCmd) -> Result<i32> {
    if matches!(cmd, CkptCmd::Merge { .. }) {
        // The merger runs its own runtime.
        return merge(cmd);
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
            let lineage = Lineage::load(&ckpts).await?;
            let mut bad = lineage.unreadable.len();
            for (id, why) in &lineage.unreadable {
                println!("DAMAGED {id}: {why}");
            }
            let ids: Vec<CheckpointId> = lineage.nodes().map(|n| n.id.clone()).collect();
            for id in ids {
                let m = ckpts.read_manifest(&id, None).await?;
                match ckpts.verify_files(&m, 4).await {
                    Ok(()) => println!(
                        "ok      {id} ({} files, {} bytes)",
                        m.files.len(),
                        m.data_bytes()
                    ),
                    Err(e) => {
                        bad += 1;
                        println!("DAMAGED {id}: {e}");
                    }
                }
            }
            if let Some(head) = lineage.head() {
                if let Err(e) = lineage.resolve(&head) {
                    bad += 1;
                    println!("BROKEN  lineage of {head}: {e}");
                }
            }
            Ok(if bad == 0 { 0 } else { 1 })
        }
        CkptCmd::Restore {
            store,
            at,
            out,
            fallback,
        } => {
            let ckpts = store.open().await?;
            let at = parse_at(&at)?;
            let chain = deck::select_chain(&ckpts, &at, fallback).await?;
            if out.exists() && std::fs::read_dir(&out)?.next().is_some() {
                bail!("--out {} is not empty", out.display());
            }
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
            let rep = deck::gc(
                &ckpts,
                &GcOptions {
                    retention: Retention {
                        full_every_steps: keep_full_every_steps,
                        max_old_fulls: keep_old_fulls,
                    },
                    remove_orphans: orphans,
                },
            )
            .await?;
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
        CkptCmd::Merge { .. } => bail!("merge runs outside the async runtime"),
    }
}

fn merge(cmd: CkptCmd) -> Result<i32> {
    let CkptCmd::Merge {
        store,
        stride,
        full_every_deltas,
        chunk_kib,
        max_mib_per_s,
        gc,
    } = cmd
    else {
        bail!("not a merge");
    };
    {
        let args = ftrec_cluster::merger::MergerArgs {
            location: store.location.clone(),
            stride,
            full_every_deltas,
            chunk_bytes: chunk_kib.max(1).saturating_mul(1024),
            max_mib_per_s,
            gc,
            store: store.options(),
        };
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
    fn empty_store_lists_and_verifies_clean() {
        let dir = tempfile::tempdir().unwrap();
        let store = StoreArgs {
            location: dir.path().to_string_lossy().into_owned(),
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            allow_http: false,
        };
        assert_eq!(
            run(CkptCmd::Ls {
                store: store.clone()
            })
            .unwrap(),
            0
        );
        assert_eq!(run(CkptCmd::Verify { store }).unwrap(), 0);
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
