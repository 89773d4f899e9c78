//! The global batch order on Criteo TSV data: where each global batch starts.
//!
//! On synthetic data global batch `g` (from 1) is samples `(g-1)*B .. g*B` of the generator,
//! which any worker computes from `g` alone. On TSV data it is the `B` training samples after
//! batch `g-1` — held-out lines excluded, malformed lines skipped with `--skip-malformed`,
//! epochs wrapping — exactly what `ftrec train`'s reader ([`TsvReader::next_batch`]) reads
//! as its `g`-th batch. Where that is depends on every line before it, so the coordinator keeps
//! the plan: a cursor of its own that walks the files once, lazily and one batch ahead of the
//! batches handed out, recording where each batch starts (file, byte offset, line, epoch) and
//! how many samples come before it. Each [`crate::control::ToWorker::Batch`] carries its
//! start, and the worker seeks its own reader there and reads one batch: a seek is one `open`
//! and one `seek`, and a worker on another host reads the same files by the paths the
//! coordinator gives it.
//!
//! The walk does not parse lines unless `--skip-malformed` asks to skip the malformed ones
//! ([`TsvReader::skip_samples`]): then it must parse to know which lines are skipped.
//! Without it every training line counts, and a malformed one is reported by the worker that
//! reads it, which stops the run.
//!
//! Global batch `g`'s start is a pure function of the data configuration (files, layout,
//! held-out rule, skip rule, epochs) and `B`, never of timing, worker count or failures: a
//! recovery that rewinds to a checkpoint taken after `n` batches hands out batch `n + 1` next,
//! from the same start, so in synchronous mode no sample is skipped or trained twice.

use std::path::PathBuf;

use ftrec_data::{BatchSource, Position, TsvConfig, TsvReader};

use crate::ClusterError;

/// Where the stream stands after some number of global batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    file: u32,
    offset: u64,
    line: u64,
    epoch: u64,
    /// Training samples in the batches before this mark.
    samples: u64,
}

/// The coordinator's plan of the global batches on TSV data (see the module doc).
pub struct BatchPlan {
    reader: TsvReader,
    batch: usize,
    /// `marks[n]`: where the stream stands after `n` batches (`marks[0]`: the start). A mark is
    /// pushed only for a batch that exists, so batch `g` exists iff `g < marks.len()`.
    marks: Vec<Mark>,
    /// Every batch of the data (all epochs), once the walk has reached its end.
    end: Option<u64>,
    /// The names positions record, by file number.
    names: Vec<String>,
}

impl std::fmt::Debug for BatchPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchPlan")
            .field("batch", &self.batch)
            .field("planned", &(self.marks.len() - 1))
            .field("end", &self.end)
            .finish()
    }
}

impl BatchPlan {
    /// A plan of batches of `batch` samples over `cfg`'s data; checks that every file exists.
    pub fn open(cfg: &TsvConfig, batch: usize) -> Result<BatchPlan, ClusterError> {
        if batch == 0 {
            return Err(ClusterError::Config("--batch must be at least 1".into()));
        }
        let reader = TsvReader::open(cfg.clone())?;
        let names = reader
            .files()
            .iter()
            .map(|p| ftrec_data::tsv::file_name(p))
            .collect();
        let mut plan = BatchPlan {
            reader,
            batch,
            marks: Vec::new(),
            end: None,
            names,
        };
        let start = plan.mark_here(0)?;
        plan.marks.push(start);
        Ok(plan)
    }

    /// The files read, in order.
    pub fn files(&self) -> &[PathBuf] {
        self.reader.files()
    }

    /// Every global batch the data holds, once the walk has found its end (finite epochs).
    pub fn end(&self) -> Option<u64> {
        self.end
    }

    /// Malformed lines the walk skipped so far (`--skip-malformed`).
    pub fn malformed_skipped(&self) -> u64 {
        self.reader.malformed_skipped()
    }

    fn mark_here(&self, samples: u64) -> Result<Mark, ClusterError> {
        match self.reader.position() {
            Position::Tsv {
                file,
                offset,
                line,
                epoch,
                ..
            } => Ok(Mark {
                file: file as u32,
                offset,
                line,
                epoch,
                samples,
            }),
            other => Err(ClusterError::Protocol(format!(
                "the TSV reader reported {other:?}"
            ))),
        }
    }

    /// Walk until `marks[k]` exists or the data ends.
    fn walk_to(&mut self, k: u64) -> Result<(), ClusterError> {
        while self.end.is_none() && (self.marks.len() as u64) <= k {
            let n = self.reader.skip_samples(self.batch)?;
            let before = self.marks.last().map_or(0, |m| m.samples);
            if n > 0 {
                let m = self.mark_here(before + n as u64)?;
                self.marks.push(m);
            }
            if n < self.batch {
                self.end = Some(self.marks.len() as u64 - 1);
            }
        }
        Ok(())
    }

    /// Whether global batch `g` (from 1) exists. The walk goes one batch further, so once the
    /// last batch has been asked about, [`BatchPlan::end`] is known.
    pub fn has(&mut self, g: u64) -> Result<bool, ClusterError> {
        self.walk_to(g.saturating_add(1))?;
        Ok(g >= 1 && g < self.marks.len() as u64)
    }

    /// Where global batch `g` (from 1) starts; `None` past the end of the data.
    pub fn start(&mut self, g: u64) -> Result<Option<Position>, ClusterError> {
        if g == 0 || !self.has(g)? {
            return Ok(None);
        }
        Ok(Some(self.position(self.marks[g as usize - 1])))
    }

    /// Where the stream stands after `n` global batches, and the training samples they hold.
    pub fn after(&mut self, n: u64) -> Result<(Position, u64), ClusterError> {
        self.walk_to(n)?;
        match self.marks.get(n as usize) {
            Some(&m) => Ok((self.position(m), m.samples)),
            None => Err(ClusterError::Config(format!(
                "the data holds only {} batches of {}, not {n}",
                self.marks.len() - 1,
                self.batch
            ))),
        }
    }

    fn position(&self, m: Mark) -> Position {
        Position::Tsv {
            file: m.file as usize,
            file_name: self.names[m.file as usize].clone(),
            offset: m.offset,
            line: m.line,
            epoch: m.epoch,
        }
    }
}

/// Names and sizes of `files`, which a worker compares with its own view of the data: a worker
/// on another host must read the same files the coordinator planned.
pub fn file_fingerprints(files: &[PathBuf]) -> Result<Vec<(String, u64)>, ClusterError> {
    files
        .iter()
        .map(|p| {
            let len = std::fs::metadata(p)
                .map_err(|e| ClusterError::Io {
                    what: format!("reading the size of {}", p.display()),
                    source: e,
                })?
                .len();
            Ok((ftrec_data::tsv::file_name(p), len))
        })
        .collect()
}

/// Check a checkpoint's recorded data position against the data of this run: `recorded` (the
/// manifest's `position`) must be where `plan` stands after `batches` batches (or, without a
/// plan, a synthetic position). A checkpoint taken on other data is an error naming both.
pub fn check_position(
    id: &str,
    recorded: Option<&serde_json::Value>,
    batches: u64,
    plan: Option<&mut BatchPlan>,
) -> Result<(), ClusterError> {
    let Some(recorded) = recorded else {
        return Err(ClusterError::Checkpoint(format!(
            "checkpoint {id} records no data position"
        )));
    };
    let recorded: Position = serde_json::from_value(recorded.clone()).map_err(|e| {
        ClusterError::Checkpoint(format!(
            "checkpoint {id} has a data position this version cannot read: {e}"
        ))
    })?;
    let describe = |p: &Position| match p {
        Position::Tsv {
            file_name,
            offset,
            line,
            epoch,
            ..
        } => format!("{file_name} at byte {offset} (line {line}, epoch {epoch})"),
        Position::Synthetic { sample } => format!("synthetic sample {sample}"),
        other => format!("{other:?}"),
    };
    match (plan, &recorded) {
        (None, Position::Synthetic { .. }) => Ok(()),
        (None, other) => Err(ClusterError::Checkpoint(format!(
            "checkpoint {id} was taken on TSV data ({}), but this run trains on synthetic data \
             (give the same --data)",
            describe(other)
        ))),
        (Some(plan), rec) => {
            let here = plan.after(batches).map_err(|e| {
                ClusterError::Checkpoint(format!(
                    "checkpoint {id} holds {batches} batches, but {e}: it was taken on other data"
                ))
            })?;
            if *rec == here.0 {
                return Ok(());
            }
            Err(ClusterError::Checkpoint(format!(
                "checkpoint {id} was taken on other data: after {batches} batches it stood at {}, \
                 the data given stands at {}",
                describe(rec),
                describe(&here.0)
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftrec_data::{DataPath, Layout};

    fn data(dir: &std::path::Path, lines: u64) -> TsvConfig {
        let preset = ftrec_core::Preset::tiny();
        let p = ftrec_data::synth_to_dir(&preset, 3, lines, dir).unwrap();
        let mut c = TsvConfig::new(DataPath::File(p), Layout::Kaggle).with_rows_per_table(400);
        c.holdout_every = 7;
        c
    }

    #[test]
    fn every_planned_start_is_where_the_reader_reads_that_batch() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = data(dir.path(), 100);
        cfg.epochs = Some(2);
        let mut reader = TsvReader::open(cfg.clone()).unwrap();
        let mut plan = BatchPlan::open(&cfg, 16).unwrap();
        let mut g = 1;
        let mut samples = 0;
        loop {
            let start = reader.position();
            let Some(b) = reader.next_batch(16).unwrap() else {
                break;
            };
            assert_eq!(plan.start(g).unwrap(), Some(start.clone()), "batch {g}");
            assert_eq!(plan.after(g - 1).unwrap(), (start, samples));
            samples += b.size as u64;
            g += 1;
        }
        // 2 epochs of 100 lines less every 7th: 2 * 86 = 172 samples, 11 batches of 16.
        assert_eq!(samples, 172);
        assert_eq!(plan.end(), Some(11));
        assert!(!plan.has(12).unwrap());
        assert_eq!(plan.start(12).unwrap(), None);
        assert_eq!(plan.after(11).unwrap().1, 172);
        assert!(plan.after(12).is_err());
    }

    #[test]
    fn a_recorded_position_must_match_the_data_given() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = data(dir.path(), 50);
        let mut plan = BatchPlan::open(&cfg, 8).unwrap();
        let (pos, _) = plan.after(3).unwrap();
        let json = serde_json::to_value(&pos).unwrap();
        check_position("c1", Some(&json), 3, Some(&mut plan)).unwrap();
        let e = check_position("c1", Some(&json), 2, Some(&mut plan)).unwrap_err();
        assert!(e.to_string().contains("other data"), "{e}");
        let mut other = json.clone();
        other["file_name"] = "day_3".into();
        let e = check_position("c1", Some(&other), 3, Some(&mut plan)).unwrap_err();
        assert!(e.to_string().contains("day_3"), "{e}");
        let synth = serde_json::to_value(Position::Synthetic { sample: 24 }).unwrap();
        let e = check_position("c1", Some(&synth), 3, Some(&mut plan)).unwrap_err();
        assert!(e.to_string().contains("synthetic"), "{e}");
        let e = check_position("c1", Some(&json), 3, None).unwrap_err();
        assert!(e.to_string().contains("synthetic data"), "{e}");
        check_position("c1", Some(&synth), 3, None).unwrap();
        assert!(check_position("c1", None, 3, None).is_err());
    }
}
