//! Streaming reader of Criteo TSV files (Kaggle and Terabyte layouts).
//!
//! The reader holds one open file, a `BufReader` and one reused line buffer; it never loads a
//! file whole, so the 1 TB Terabyte set streams like the 11 GB Kaggle one. Its [`Position`]
//! is a (file, byte offset, line, epoch) quadruple, and [`BatchSource::seek`] reopens the file
//! and seeks to the offset, so resuming costs one `open` and one `seek`.
//!
//! # Held-out split
//! With `holdout_every = k > 0`, line `k`, `2k`, `3k`, ... (1-based) of **every file** is held
//! out: the training stream skips it and [`BatchSource::eval_set`] reads only those lines, from
//! the first file on. The rule depends only on the line number, never on the content, so it is
//! the same in every epoch, after every resume and for every reader of the same files.
//!
//! # Malformed lines
//! A malformed line is an error naming file, 1-based line number and what is wrong. With
//! `skip_malformed` it is skipped instead, counted ([`BatchSource::malformed_skipped`]) and the
//! first [`KEPT_FAULTS`] are kept for a report ([`BatchSource::skipped_examples`]). Held-out
//! lines are not parsed by the training stream (only by `eval_set`).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use ftrec_core::preset::KAGGLE_TABLE_ROWS;
use ftrec_core::{Batch, NUM_DENSE, NUM_SPARSE};
use serde::{Deserialize, Serialize};

use crate::error::{DataError, LineError, LineFault};
use crate::sample::parse_line;
use crate::source::{check_batch_size, BatchSource, EvalSet, Position};

/// Longest line accepted (Criteo lines are 100 to 400 bytes); a longer one is malformed, which
/// also bounds the memory a file without newlines can take.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Skipped malformed lines kept for a report.
pub const KEPT_FAULTS: usize = 16;

/// Default held-out rule: every 64th line of every file (about 1.6%, ~700k lines of Kaggle's
/// 45.8M).
pub const DEFAULT_HOLDOUT_EVERY: u64 = 64;

/// Row cap of the Terabyte tables: 40M rows per table, the cap of the MLPerf DLRM reference
/// preprocessing. `TsvConfig::with_rows_per_table` (`--rows-per-table N`) lowers it.
pub const TERABYTE_ROW_CAP: u64 = 40_000_000;

/// Rows of the 26 Criteo Terabyte tables under the 40M cap ([`TERABYTE_ROW_CAP`]): ~188M rows
/// in all, the "roughly 200 million entries" of ECRec §2.2.
pub const TERABYTE_TABLE_ROWS: [u64; NUM_SPARSE] = [
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208,
    11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
];

/// Which Criteo release the files come from. Lines are the same in both; the layouts differ in
/// how a directory is read and in the default table sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// Display Advertising Challenge: a directory means its `train.txt` (or `train.tsv`, as
    /// `ftrec data synth` writes it); tables default to the Kaggle cardinalities.
    Kaggle,
    /// Terabyte click logs: a directory means its `day_0` .. `day_23` files, read in day order
    /// (numerically, whichever days are present); tables default to [`TERABYTE_TABLE_ROWS`].
    Terabyte,
}

impl Layout {
    /// Default rows per table for this layout.
    pub fn default_table_rows(self) -> Vec<u64> {
        match self {
            Layout::Kaggle => KAGGLE_TABLE_ROWS.to_vec(),
            Layout::Terabyte => TERABYTE_TABLE_ROWS.to_vec(),
        }
    }
}

/// What to read: one file, several files (read in the given order), or a directory (read as the
/// [`Layout`] says).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataPath {
    File(PathBuf),
    Files(Vec<PathBuf>),
    Dir(PathBuf),
}

impl DataPath {
    /// From command-line paths: one directory, one file, or several files.
    pub fn from_paths(paths: &[PathBuf]) -> Result<DataPath, DataError> {
        match paths {
            [] => Err(DataError::InvalidConfig("no data path given".into())),
            [one] => {
                let meta = std::fs::metadata(one).map_err(|e| DataError::io(one, e))?;
                Ok(if meta.is_dir() {
                    DataPath::Dir(one.clone())
                } else {
                    DataPath::File(one.clone())
                })
            }
            many => {
                for p in many {
                    let meta = std::fs::metadata(p).map_err(|e| DataError::io(p, e))?;
                    if meta.is_dir() {
                        return Err(DataError::InvalidConfig(format!(
                            "{} is a directory; give one directory or a list of files",
                            p.display()
                        )));
                    }
                }
                Ok(DataPath::Files(many.to_vec()))
            }
        }
    }

    /// The files to read, in reading order. Every one must exist.
    pub fn resolve(&self, layout: Layout) -> Result<Vec<PathBuf>, DataError> {
        let files = match self {
            DataPath::File(p) => vec![p.clone()],
            DataPath::Files(ps) if ps.is_empty() => {
                return Err(DataError::InvalidConfig("empty list of data files".into()))
            }
            DataPath::Files(ps) => ps.clone(),
            DataPath::Dir(dir) => list_dir(dir, layout)?,
        };
        for f in &files {
            let meta = std::fs::metadata(f).map_err(|e| DataError::io(f, e))?;
            if !meta.is_file() {
                return Err(DataError::InvalidConfig(format!(
                    "{} is not a regular file",
                    f.display()
                )));
            }
        }
        Ok(files)
    }
}

fn list_dir(dir: &Path, layout: Layout) -> Result<Vec<PathBuf>, DataError> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| DataError::io(dir, e))? {
        let entry = entry.map_err(|e| DataError::io(dir, e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    match layout {
        Layout::Kaggle => {
            for name in ["train.txt", "train.tsv"] {
                if names.iter().any(|n| n == name) {
                    return Ok(vec![dir.join(name)]);
                }
            }
            Err(DataError::NoFiles {
                dir: dir.to_path_buf(),
                expected: "the Kaggle layout reads train.txt (or train.tsv)".into(),
            })
        }
        Layout::Terabyte => {
            let mut days: Vec<(u32, &String)> = names
                .iter()
                .filter_map(|n| {
                    let d = n.strip_prefix("day_")?;
                    if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
                        return None;
                    }
                    Some((d.parse().ok()?, n))
                })
                .collect();
            if days.is_empty() {
                let compressed = names
                    .iter()
                    .any(|n| n.starts_with("day_") && n.contains('.'));
                return Err(DataError::NoFiles {
                    dir: dir.to_path_buf(),
                    expected: if compressed {
                        "the Terabyte layout reads uncompressed day_0 .. day_23 files; \
                         decompress the day_N.gz files first"
                            .into()
                    } else {
                        "the Terabyte layout reads day_0 .. day_23".into()
                    },
                });
            }
            days.sort();
            Ok(days.into_iter().map(|(_, n)| dir.join(n)).collect())
        }
    }
}

/// Configuration of a [`TsvReader`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TsvConfig {
    pub path: DataPath,
    pub layout: Layout,
    /// Rows of each of the 26 tables: categorical values are hashed into this many rows.
    pub table_rows: Vec<u64>,
    /// Hold out every `holdout_every`-th line of each file for evaluation (0 = none).
    pub holdout_every: u64,
    /// Skip and count malformed lines instead of failing.
    pub skip_malformed: bool,
    /// Passes over the data; `None` wraps around forever.
    pub epochs: Option<u64>,
}

impl TsvConfig {
    /// Defaults: the layout's table sizes, [`DEFAULT_HOLDOUT_EVERY`], strict parsing, one epoch.
    pub fn new(path: DataPath, layout: Layout) -> TsvConfig {
        TsvConfig {
            path,
            layout,
            table_rows: layout.default_table_rows(),
            holdout_every: DEFAULT_HOLDOUT_EVERY,
            skip_malformed: false,
            epochs: Some(1),
        }
    }

    /// Cap every table at `cap` rows (`--rows-per-table N`).
    pub fn with_rows_per_table(mut self, cap: u64) -> TsvConfig {
        for r in &mut self.table_rows {
            *r = (*r).min(cap);
        }
        self
    }

    pub fn validate(&self) -> Result<(), DataError> {
        validate_table_rows(&self.table_rows)?;
        if self.epochs == Some(0) {
            return Err(DataError::InvalidConfig(
                "epochs must be at least 1 (or unlimited)".into(),
            ));
        }
        Ok(())
    }
}

pub(crate) fn validate_table_rows(rows: &[u64]) -> Result<(), DataError> {
    if rows.len() != NUM_SPARSE {
        return Err(DataError::InvalidConfig(format!(
            "Criteo data has {NUM_SPARSE} categorical features but {} table sizes were given",
            rows.len()
        )));
    }
    if let Some(t) = rows.iter().position(|&r| r == 0) {
        return Err(DataError::InvalidConfig(format!(
            "table {t} (C{}) has 0 rows",
            t + 1
        )));
    }
    Ok(())
}

/// Read one line into `buf` (without its `\n`), consuming at most through the next newline.
/// Returns the bytes consumed (0 at end of file) and whether the line exceeded `cap` (then
/// `buf` is empty and the rest of the line has been consumed).
fn read_line_capped<R: BufRead>(
    r: &mut R,
    buf: &mut Vec<u8>,
    cap: usize,
) -> io::Result<(u64, bool)> {
    buf.clear();
    let mut consumed = 0u64;
    let mut too_long = false;
    loop {
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            break;
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        if !too_long {
            let content = if done { take - 1 } else { take };
            if buf.len() + content > cap {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&avail[..content]);
            }
        }
        r.consume(take);
        consumed += take as u64;
        if done {
            break;
        }
    }
    Ok((consumed, too_long))
}

/// A cursor over the lines of one pass through the files.
///
/// At the end of the last file it stays there (rather than moving past it), so the position it
/// reports is always a real (file, offset) that `open_at` accepts.
struct Lines {
    files: Vec<PathBuf>,
    file: usize,
    offset: u64,
    /// Lines of `file` consumed so far.
    line: u64,
    reader: Option<BufReader<File>>,
    buf: Vec<u8>,
}

/// One line read by [`Lines::next`]: its 1-based number in its file and whether it was too long.
struct LineRef {
    line: u64,
    too_long: bool,
}

impl Lines {
    fn new(files: Vec<PathBuf>) -> Lines {
        Lines {
            files,
            file: 0,
            offset: 0,
            line: 0,
            reader: None,
            buf: Vec::with_capacity(512),
        }
    }

    fn set(&mut self, file: usize, offset: u64, line: u64) {
        self.file = file;
        self.offset = offset;
        self.line = line;
        self.reader = None;
    }

    fn path(&self) -> &Path {
        &self.files[self.file]
    }

    fn open_reader(&self) -> Result<BufReader<File>, DataError> {
        let path = self.path();
        let mut f = File::open(path).map_err(|e| DataError::io(path, e))?;
        if self.offset > 0 {
            f.seek(SeekFrom::Start(self.offset))
                .map_err(|e| DataError::io(path, e))?;
        }
        Ok(BufReader::with_capacity(1 << 16, f))
    }

    /// The next line of this pass into `self.buf`, or `None` at the end of the last file.
    fn next(&mut self) -> Result<Option<LineRef>, DataError> {
        loop {
            let mut reader = match self.reader.take() {
                Some(r) => r,
                None => self.open_reader()?,
            };
            let read = read_line_capped(&mut reader, &mut self.buf, MAX_LINE_BYTES);
            // After a read error the buffered state is unknown: drop the reader so the next
            // call reopens at the last good offset.
            let (consumed, too_long) = read.map_err(|e| DataError::io(self.path(), e))?;
            self.reader = Some(reader);
            if consumed == 0 {
                if self.file + 1 < self.files.len() {
                    self.set(self.file + 1, 0, 0);
                    continue;
                }
                return Ok(None);
            }
            self.offset += consumed;
            self.line += 1;
            return Ok(Some(LineRef {
                line: self.line,
                too_long,
            }));
        }
    }
}

fn is_held_out(holdout_every: u64, line: u64) -> bool {
    holdout_every > 0 && line % holdout_every == 0
}

/// The name a [`Position::Tsv`] records for file `p`: its last component.
pub fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// Where [`TsvReader::walk`] puts the training samples it passes.
enum Sink<'a> {
    /// Parsed into this batch.
    Batch(&'a mut Batch),
    /// Only counted; parsed first if `parse` (to skip malformed lines).
    Count { parse: bool },
}

/// Batches of up to `batch` samples, and samples, in one whole run over `cfg`'s data: what
/// [`BatchSource::next_batch`] yields until the end of the last epoch (the last batch may be
/// short). `cfg.epochs` must be finite. Without `skip_malformed` this is a scan for newlines
/// ([`TsvReader::skip_samples`]).
pub fn count_batches(cfg: &TsvConfig, batch: usize) -> Result<(u64, u64), DataError> {
    check_batch_size(batch)?;
    if cfg.epochs.is_none() {
        return Err(DataError::InvalidConfig(
            "an unlimited number of epochs has no end to count batches to".into(),
        ));
    }
    let mut reader = TsvReader::open(cfg.clone())?;
    let (mut batches, mut samples) = (0u64, 0u64);
    loop {
        let n = reader.skip_samples(batch)?;
        if n > 0 {
            batches += 1;
            samples += n as u64;
        }
        if n < batch {
            return Ok((batches, samples));
        }
    }
}

/// Streaming reader of Criteo TSV files; a [`BatchSource`].
pub struct TsvReader {
    cfg: TsvConfig,
    lines: Lines,
    epoch: u64,
    skipped: u64,
    faults: Vec<LineFault>,
}

impl std::fmt::Debug for TsvReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TsvReader")
            .field("cfg", &self.cfg)
            .field("position", &self.position())
            .field("skipped", &self.skipped)
            .finish()
    }
}

impl TsvReader {
    /// Check the configuration and that every file exists; positioned at the start.
    pub fn open(cfg: TsvConfig) -> Result<TsvReader, DataError> {
        cfg.validate()?;
        let files = cfg.path.resolve(cfg.layout)?;
        Ok(TsvReader {
            cfg,
            lines: Lines::new(files),
            epoch: 0,
            skipped: 0,
            faults: Vec::new(),
        })
    }

    pub fn config(&self) -> &TsvConfig {
        &self.cfg
    }

    /// The files read, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.lines.files
    }

    fn more_epochs(&self) -> bool {
        // A resumed position may carry any epoch: the last countable one is the last.
        self.epoch < u64::MAX && self.cfg.epochs.is_none_or(|n| self.epoch + 1 < n)
    }

    fn parse_current(&self, line: &LineRef) -> Result<crate::RawSample, LineFault> {
        let parsed = if line.too_long {
            Err(LineError::TooLong {
                limit: MAX_LINE_BYTES,
            })
        } else {
            parse_line(&self.lines.buf)
        };
        parsed.map_err(|kind| LineFault {
            file: self.lines.path().to_path_buf(),
            line: line.line,
            kind,
        })
    }

    fn note_skip(&mut self, fault: LineFault) {
        self.skipped += 1;
        if self.faults.len() < KEPT_FAULTS {
            self.faults.push(fault);
        }
    }

    /// Pass the next `size` training samples into `sink`, wrapping epochs as configured;
    /// returns how many there were (fewer only at the end of the last epoch).
    fn walk(&mut self, sink: &mut Sink<'_>, size: usize) -> Result<usize, DataError> {
        let mut taken = 0usize;
        // Samples taken when the last wrap happened in this call: a second wrap with no sample
        // in between means a whole epoch yields nothing, and wrapping again would spin forever.
        let mut last_wrap: Option<usize> = None;
        while taken < size {
            let Some(line) = self.lines.next()? else {
                if !self.more_epochs() {
                    break;
                }
                if last_wrap == Some(taken) {
                    return Err(DataError::NoSamples {
                        what: self.describe_files(),
                    });
                }
                last_wrap = Some(taken);
                self.epoch += 1;
                self.lines.set(0, 0, 0);
                continue;
            };
            if is_held_out(self.cfg.holdout_every, line.line) {
                continue;
            }
            if let Sink::Count { parse: false } = sink {
                taken += 1;
                continue;
            }
            match self.parse_current(&line) {
                Ok(s) => {
                    if let Sink::Batch(batch) = sink {
                        s.append_to(batch, &self.cfg.table_rows);
                    }
                    taken += 1;
                }
                Err(fault) if self.cfg.skip_malformed => self.note_skip(fault),
                Err(fault) => return Err(DataError::Malformed { fault }),
            }
        }
        Ok(taken)
    }

    /// [`Self::walk`], leaving the reader where it started on error.
    fn walk_or_rewind(&mut self, sink: &mut Sink<'_>, size: usize) -> Result<usize, DataError> {
        let start = self.position();
        let (skipped, kept) = (self.skipped, self.faults.len());
        match self.walk(sink, size) {
            Ok(n) => Ok(n),
            Err(e) => {
                // Leave the reader where the walk started, as the trait promises; the seek
                // only reopens a file that was readable a moment ago, and if even that fails
                // the original error is the one worth reporting.
                let _ = self.seek(&start);
                self.skipped = skipped;
                self.faults.truncate(kept);
                Err(e)
            }
        }
    }

    /// Move past the next `n` training samples exactly as `next_batch(n)` would, without
    /// building them; returns how many there were (fewer than `n` only at the end of the last
    /// epoch). With `skip_malformed` every line is parsed, to know which ones are skipped;
    /// without it no line is parsed and every training line counts as a sample (a malformed
    /// one is reported by whoever reads it into a batch), so the walk is a scan for newlines.
    /// On error the reader stays where it was.
    pub fn skip_samples(&mut self, n: usize) -> Result<usize, DataError> {
        let mut sink = Sink::Count {
            parse: self.cfg.skip_malformed,
        };
        self.walk_or_rewind(&mut sink, n)
    }

    fn describe_files(&self) -> String {
        match self.lines.files.as_slice() {
            [one] => one.display().to_string(),
            many => format!("{} files from {}", many.len(), many[0].display()),
        }
    }
}

impl BatchSource for TsvReader {
    fn table_rows(&self) -> &[u64] {
        &self.cfg.table_rows
    }

    fn next_batch(&mut self, size: usize) -> Result<Option<Batch>, DataError> {
        check_batch_size(size)?;
        let mut batch = Batch::with_capacity(size, NUM_DENSE, NUM_SPARSE);
        self.walk_or_rewind(&mut Sink::Batch(&mut batch), size)?;
        Ok((batch.size > 0).then_some(batch))
    }

    fn position(&self) -> Position {
        Position::Tsv {
            file: self.lines.file,
            file_name: file_name(self.lines.path()),
            offset: self.lines.offset,
            line: self.lines.line,
            epoch: self.epoch,
        }
    }

    fn seek(&mut self, pos: &Position) -> Result<(), DataError> {
        let Position::Tsv {
            file,
            file_name: name,
            offset,
            line,
            epoch,
        } = pos
        else {
            return Err(DataError::BadPosition(format!(
                "{pos:?} is not a TSV position"
            )));
        };
        let (file, offset, line, epoch) = (*file, *offset, *line, *epoch);
        let Some(path) = self.lines.files.get(file) else {
            return Err(DataError::BadPosition(format!(
                "file number {file} but only {} files are read",
                self.lines.files.len()
            )));
        };
        if file_name(path) != *name {
            return Err(DataError::BadPosition(format!(
                "file number {file} was {name:?} when the position was taken but is now {}",
                path.display()
            )));
        }
        if let Some(n) = self.cfg.epochs {
            if epoch >= n {
                return Err(DataError::BadPosition(format!(
                    "epoch {epoch} but the reader is configured for {n} epochs"
                )));
            }
        }
        if line > offset {
            // Every line consumed takes at least its newline.
            return Err(DataError::BadPosition(format!(
                "{line} lines of {} cannot end before byte {offset}",
                path.display()
            )));
        }
        let mut f = File::open(path).map_err(|e| DataError::io(path, e))?;
        let len = f.metadata().map_err(|e| DataError::io(path, e))?.len();
        if offset > len {
            return Err(DataError::BadPosition(format!(
                "offset {offset} is past the end of {} ({len} bytes)",
                path.display()
            )));
        }
        if offset > 0 && offset < len {
            let mut prev = [0u8; 1];
            f.seek(SeekFrom::Start(offset - 1))
                .and_then(|_| f.read_exact(&mut prev))
                .map_err(|e| DataError::io(path, e))?;
            if prev[0] != b'\n' {
                return Err(DataError::BadPosition(format!(
                    "offset {offset} of {} is not at the start of a line",
                    path.display()
                )));
            }
        }
        self.lines.set(file, offset, line);
        self.epoch = epoch;
        Ok(())
    }

    fn eval_set(&self, max_samples: usize, batch: usize) -> Result<EvalSet, DataError> {
        check_batch_size(batch)?;
        if self.cfg.holdout_every == 0 {
            return Err(DataError::NoHoldout);
        }
        let mut lines = Lines::new(self.lines.files.clone());
        let mut set = EvalSet::default();
        let mut cur = Batch::with_capacity(batch, NUM_DENSE, NUM_SPARSE);
        let mut total = 0usize;
        while total < max_samples {
            let Some(line) = lines.next()? else { break };
            if !is_held_out(self.cfg.holdout_every, line.line) {
                continue;
            }
            let parsed = if line.too_long {
                Err(LineError::TooLong {
                    limit: MAX_LINE_BYTES,
                })
            } else {
                parse_line(&lines.buf)
            };
            match parsed {
                Ok(s) => {
                    s.append_to(&mut cur, &self.cfg.table_rows);
                    total += 1;
                    if cur.size == batch {
                        set.batches.push(std::mem::replace(
                            &mut cur,
                            Batch::with_capacity(batch, NUM_DENSE, NUM_SPARSE),
                        ));
                    }
                }
                Err(_) if self.cfg.skip_malformed => set.malformed_skipped += 1,
                Err(kind) => {
                    return Err(DataError::Malformed {
                        fault: LineFault {
                            file: lines.path().to_path_buf(),
                            line: line.line,
                            kind,
                        },
                    })
                }
            }
        }
        if cur.size > 0 {
            set.batches.push(cur);
        }
        Ok(set)
    }

    fn malformed_skipped(&self) -> u64 {
        self.skipped
    }

    fn skipped_examples(&self) -> &[LineFault] {
        &self.faults
    }
}
