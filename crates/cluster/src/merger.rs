//! The merger process of `deck` (DECK §3.3): one hierarchical merge pass over a store, then
//! (optionally) garbage collection of what no live lineage needs (DECK §4.3). The coordinator
//! starts it as `EXE ckpt merge LOCATION --stride S [--full-every-deltas N]
//! [--max-mib-per-s R] --gc` after a commit; it prints `writing ID` before a checkpoint's first
//! file and `wrote ID` after its manifest, one line each, which is how the coordinator knows a
//! merge is under way.

use std::io::Write;

use ftrec_ckpt::deck::{self, GcOptions, GcReport, MergePolicy, MergeReport, Merger, Retention};
use ftrec_ckpt::location::{self, LocationOptions};
use ftrec_ckpt::{CheckpointId, Checkpoints};

use crate::ClusterError;

/// One merger pass.
#[derive(Debug, Clone, PartialEq)]
pub struct MergerArgs {
    pub location: String,
    pub stride: usize,
    pub full_every_deltas: Option<u64>,
    pub chunk_bytes: usize,
    /// Cap on the write rate (MiB/s).
    pub max_mib_per_s: Option<f64>,
    /// Collect garbage after the merge.
    pub gc: bool,
    /// The lease generation of the job this pass works for ([`check_writer`]).
    pub writer_generation: Option<u64>,
    /// S3 settings (unset fields come from the environment).
    pub store: LocationOptions,
}

fn announce(what: &str, id: &CheckpointId) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{what} {id}");
    let _ = out.flush();
}

/// Run one pass (merge, then GC if asked) on a runtime of its own.
pub fn merge_once(args: &MergerArgs) -> Result<(MergeReport, Option<GcReport>), ClusterError> {
    if args
        .max_mib_per_s
        .is_some_and(|r| !(r.is_finite() && r > 0.0))
    {
        return Err(ClusterError::Config(
            "--max-mib-per-s must be a positive number".into(),
        ));
    }
    let ck = |e: ftrec_ckpt::CkptError| ClusterError::Checkpoint(e.to_string());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClusterError::Io {
            what: "starting the merger runtime".into(),
            source: e,
        })?;
    rt.block_on(async {
        let opts = args.store.clone().or(LocationOptions::from_env());
        let store = location::open(&args.location, &opts).await.map_err(ck)?;
        let mut ckpts = Checkpoints::new(store);
        if let Some(g) = args.writer_generation {
            check_writer(&ckpts, g).await?;
            ckpts = ckpts.with_generation(g);
        }
        let merger = Merger::new(
            ckpts.clone(),
            MergePolicy {
                stride: args.stride,
                full_every_deltas: args.full_every_deltas,
                full_when_chain_ratio: None,
                chunk_bytes: args.chunk_bytes.max(1024),
            },
        )
        .map_err(ck)?
        .with_rate_limit(args.max_mib_per_s.map(|r| r * (1 << 20) as f64))
        .with_progress(announce);
        // A pass that fails may have been paused while another job took the store over and
        // collected what it read: then the fence is the cause to report, not the missing file.
        let merged = match merger.run_once().await {
            Ok(m) => m,
            Err(e) => return Err(fenced_or(&ckpts, args.writer_generation, ck(e)).await),
        };
        // Nothing is deleted for a job that no longer holds the store.
        if let Some(g) = args.writer_generation {
            check_writer(&ckpts, g).await?;
        }
        let gc = if args.gc {
            let collected = deck::gc(
                &ckpts,
                &GcOptions {
                    retention: Retention {
                        full_every_steps: 0,
                        max_old_fulls: 0,
                    },
                    remove_orphans: false,
                },
            )
            .await;
            match collected {
                Ok(r) => Some(r),
                Err(e) => return Err(fenced_or(&ckpts, args.writer_generation, ck(e)).await),
            }
        } else {
            None
        };
        Ok((merged, gc))
    })
}

/// The fence of a writer of `generation` that no longer holds the store, else `e`.
async fn fenced_or(ckpts: &Checkpoints, generation: Option<u64>, e: ClusterError) -> ClusterError {
    match generation {
        Some(g) => check_writer(ckpts, g).await.err().unwrap_or(e),
        None => e,
    }
}

/// `Err` ([`ClusterError::Fenced`]) unless the store's lease is held, not given up, at
/// generation `generation`: a merger left running by a coordinator that was paused and taken
/// over (its parent still lives, so no parent-death signal ends it) must not merge or delete
/// next to the new job's own merger.
pub async fn check_writer(ckpts: &Checkpoints, generation: u64) -> Result<(), ClusterError> {
    let held = ftrec_ckpt::lease::read_lease(ckpts)
        .await
        .map_err(|e| ClusterError::Checkpoint(e.to_string()))?;
    match held {
        Some(r) if r.generation == generation && !r.released => Ok(()),
        Some(r) => Err(ClusterError::Fenced(format!(
            "fenced: the merger works for the store's writer of generation {generation}, and the lease \
             is now {} by {} at generation {}",
            if r.released { "given up" } else { "held" },
            r.holder,
            r.generation
        ))),
        None => Err(ClusterError::Fenced(format!(
            "fenced: the merger works for the store's writer of generation {generation}, and the \
             store holds no lease"
        ))),
    }
}

impl MergerArgs {
    /// The pass the coordinator runs after a commit: merge, then collect garbage.
    pub fn for_run(
        location: String,
        stride: usize,
        full_every_deltas: Option<u64>,
        max_mib_per_s: Option<f64>,
    ) -> MergerArgs {
        MergerArgs {
            location,
            stride,
            full_every_deltas,
            chunk_bytes: 4 << 20,
            max_mib_per_s,
            gc: true,
            writer_generation: None,
            store: LocationOptions::default(),
        }
    }

    /// The arguments of `ftrec ckpt merge` (after the executable name) for this pass. S3
    /// settings are not on the command line (secrets would show in `ps`): the process inherits
    /// them from the environment.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "ckpt".to_string(),
            "merge".into(),
            self.location.clone(),
            "--stride".into(),
            self.stride.to_string(),
            "--chunk-kib".into(),
            (self.chunk_bytes / 1024).to_string(),
        ];
        if let Some(n) = self.full_every_deltas {
            a.extend(["--full-every-deltas".into(), n.to_string()]);
        }
        if let Some(r) = self.max_mib_per_s {
            a.extend(["--max-mib-per-s".into(), r.to_string()]);
        }
        if self.gc {
            a.push("--gc".into());
        }
        if let Some(g) = self.writer_generation {
            a.extend(["--writer-generation".into(), g.to_string()]);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merger_args_round_trip_and_bad_flags_are_named() {
        let mut m = MergerArgs::for_run("/tmp/store".into(), 3, Some(8), Some(1.5));
        m.chunk_bytes = 64 << 10;
        m.writer_generation = Some(4);
        assert_eq!(MergerArgs::from_args(&m.to_args()).unwrap(), m);
        let e = MergerArgs::from_args(&["merge".into(), "/x".into(), "--bogus".into()]);
        assert!(matches!(e, Err(ClusterError::Config(s)) if s.contains("--bogus")));
        let e = MergerArgs::from_args(&["/x".into(), "--stride".into(), "two".into()]);
        assert!(matches!(e, Err(ClusterError::Config(s)) if s.contains("--stride")));
    }
}
