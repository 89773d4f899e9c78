//! A whole store checked: every file of every checkpoint read and its checksums verified, and,
//! for incremental stores, which states each damaged file takes down and the newest intact one.
//!
//! [`verify_store`] gathers the findings, [`StoreCheck::render`] says them one a line (what
//! `ftrec ckpt verify` prints). Damage is a finding, not an error: the result is an error only
//! when the store itself cannot be read (unreachable, a listing that fails). It never repairs,
//! deletes or rewrites anything.

use crate::checkpoint::Checkpoints;
use crate::deck::{Lineage, RestoreAt};
use crate::error::Result;
use crate::format::CheckpointId;
use crate::incr::{self, Damage};

/// One checkpoint's files, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedCheckpoint {
    pub id: CheckpointId,
    /// Files read.
    pub files: u64,
    pub bytes: u64,
    /// Chunk-list files no live chunk needs any more, removed by garbage collection (expected,
    /// not damage; incremental stores only).
    pub removed: u64,
    /// The first problem found, if any.
    pub problem: Option<String>,
}

/// What a check of a whole store found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoreCheck {
    /// The store holds incremental pieces (IncrCP, naive incremental, Check-N-Run).
    pub incremental: bool,
    /// Manifests that could not be read, with why.
    pub unreadable: Vec<(CheckpointId, String)>,
    /// Every readable checkpoint, in id order.
    pub checkpoints: Vec<CheckedCheckpoint>,
    /// Damaged files some state's restore reads, with the states they take down (incremental
    /// stores).
    pub damaged_files: Vec<Damage>,
    /// States whose list of files cannot even be read, with why (incremental stores).
    pub down: Vec<(CheckpointId, String)>,
    /// The head state and why its lineage cannot be rebuilt.
    pub broken: Option<(CheckpointId, String)>,
    /// After damage in an incremental store: the newest intact state, or why there is none.
    pub newest_intact: Option<std::result::Result<CheckpointId, String>>,
}

impl StoreCheck {
    /// How many problems were found (0: the store is intact).
    pub fn problems(&self) -> usize {
        self.unreadable.len()
            + self
                .checkpoints
                .iter()
                .filter(|c| c.problem.is_some())
                .count()
            + self.damaged_files.len()
            + self.down.len()
            + usize::from(self.broken.is_some())
    }

    pub fn is_ok(&self) -> bool {
        self.problems() == 0
    }

    /// One line a finding: `ok`, `DAMAGED`, `DAMAGED FILE`, `DOWN`, `BROKEN`, and for damaged
    /// incremental stores the newest intact state.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        for (id, why) in &self.unreadable {
            line(format!("DAMAGED {id}: {why}"));
        }
        for c in &self.checkpoints {
            match &c.problem {
                None => line(format!(
                    "ok      {} ({} files, {} bytes{})",
                    c.id,
                    c.files,
                    c.bytes,
                    if c.removed > 0 {
                        format!(", {} removed: no live chunk", c.removed)
                    } else {
                        String::new()
                    }
                )),
                Some(p) => line(format!("DAMAGED {}: {p}", c.id)),
            }
        }
        for d in &self.damaged_files {
            line(format!(
                "DAMAGED FILE {}: {}; takes down {}",
                d.file,
                d.problem,
                d.states
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for (id, why) in &self.down {
            line(format!("DOWN    {id}: {why}"));
        }
        if let Some((head, why)) = &self.broken {
            line(format!("BROKEN  lineage of {head}: {why}"));
        }
        match &self.newest_intact {
            Some(Ok(id)) => line(format!("newest intact state: {id}")),
            Some(Err(why)) => line(format!("no intact state: {why}")),
            None => {}
        }
        out
    }
}

/// Read and check every file of every checkpoint of `ckpts`.
pub async fn verify_store(ckpts: &Checkpoints) -> Result<StoreCheck> {
    if incr::is_incremental_store(ckpts).await? {
        return verify_incremental(ckpts).await;
    }
    let lineage = Lineage::load(ckpts).await?;
    let mut check = StoreCheck {
        unreadable: lineage.unreadable.clone(),
        ..Default::default()
    };
    let ids: Vec<CheckpointId> = lineage.nodes().map(|n| n.id.clone()).collect();
    for id in ids {
        let m = ckpts.read_manifest(&id, None).await?;
        check.checkpoints.push(CheckedCheckpoint {
            id,
            files: m.files.len() as u64,
            bytes: m.data_bytes(),
            removed: 0,
            problem: ckpts.verify_files(&m, 4).await.err().map(|e| e.to_string()),
        });
    }
    if let Some(head) = lineage.head() {
        if let Err(e) = lineage.resolve(&head) {
            check.broken = Some((head, e.to_string()));
        }
    }
    Ok(check)
}

async fn verify_incremental(ckpts: &Checkpoints) -> Result<StoreCheck> {
    let checkpoints = incr::verify(ckpts)
        .await?
        .into_iter()
        .map(|v| CheckedCheckpoint {
            id: v.id,
            files: v.files,
            bytes: v.bytes,
            removed: v.removed,
            problem: v.problem,
        })
        .collect();
    // What each damaged file takes down: the states whose restores read it.
    let (damaged_files, down) = incr::damage(ckpts).await?;
    let newest_intact = if damaged_files.is_empty() && down.is_empty() {
        None
    } else {
        Some(
            match incr::select_intact(ckpts, &RestoreAt::Current).await {
                Ok((chain, _)) => Ok(chain.target_manifest().id.clone()),
                Err(e) => Err(e.to_string()),
            },
        )
    };
    Ok(StoreCheck {
        incremental: true,
        checkpoints,
        damaged_files,
        down,
        newest_intact,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> CheckpointId {
        CheckpointId::new(s).unwrap()
    }

    #[test]
    fn every_finding_counts_and_is_said_in_one_line() {
        let mut c = StoreCheck {
            checkpoints: vec![CheckedCheckpoint {
                id: id("00000000000000000004-full"),
                files: 3,
                bytes: 100,
                removed: 0,
                problem: None,
            }],
            ..Default::default()
        };
        assert!(c.is_ok());
        assert_eq!(
            c.render(),
            "ok      00000000000000000004-full (3 files, 100 bytes)\n"
        );
        c.unreadable
            .push((id("00000000000000000008-delta"), "torn".into()));
        c.checkpoints[0].problem = Some("checksum".into());
        c.damaged_files.push(Damage {
            file: "f".into(),
            problem: "gone".into(),
            states: vec![id("00000000000000000004-full")],
        });
        c.down.push((id("00000000000000000012-delta"), "x".into()));
        c.broken = Some((id("00000000000000000012-delta"), "no parent".into()));
        c.newest_intact = Some(Err("none".into()));
        assert_eq!(c.problems(), 5);
        let text = c.render();
        assert_eq!(text.lines().count(), 6, "{text}");
        for needle in [
            "DAMAGED 0",
            "DAMAGED FILE f",
            "DOWN ",
            "BROKEN ",
            "no intact state",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }
}
