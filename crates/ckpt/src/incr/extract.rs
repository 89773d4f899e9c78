//! One extraction round of the 2-D chunk list (IncrCP §4.2–§4.4): the new column's chunks are
//! compared with the row-0 chunks of every older column of the same row range, and the rows the
//! new column saved again are extracted into a new row, so that restoring the newest state never
//! reads a superseded row.
//!
//! Selective extraction (§4.3) decides per old chunk, in three stages, each of which can be
//! switched off (for the paper's ablation, Fig. 14a):
//! 1. the index range check: the chunks' `[min, max]` row ranges must overlap;
//! 2. the Bloom filter: the share of the old chunk's rows the new column probably saved again
//!    (new ids hitting the old chunk's filter, over the old chunk's rows) must be above `R`;
//! 3. the actual count, once the old chunk is loaded: the share of its rows the new column
//!    really saved again must be above `R`; below it the chunk is left whole (a small
//!    extraction would only fragment the list).
//!
//! Concatenation (§4.4): the remainders a round writes go to one row-0 bundle and the extracted
//! parts to one bundle of the new row, instead of one file per chunk (`concat: false` writes
//! one file per chunk, the paper's "plain files"). A bundle is cut at `bundle_bytes`.
//!
//! Compaction (beyond the paper): a row-0 bundle lives as long as one of its chunks does, so
//! after rounds that split most of its chunks it is mostly dead bytes that cost storage (and, for
//! whole-file reads, restore time). Once the live share of a row-0 file falls below
//! `compact_below`, the round moves its remaining chunks, unchanged, into its own row-0 bundle
//! (records of [`ChunkOp::Moved`]) and the file's counter reaches 0.
//!
//! A round never changes the list itself: it reads, writes new files (create-only, under the
//! new column's checkpoint) and returns the records; the caller applies them
//! ([`ChunkList::apply`]), exactly as a restore folds them later. The new column's own row-0
//! chunks are not the round's: [`column_records`] gives them, when the piece is finished, and
//! the round runs afterwards, in the background (IncrCP §4.3; `crate::incr::chain`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::BoxFuture;

use ftrec_core::{RowId, RowLayout, ServerId, TableId};

use super::bloom::Bloom;
use super::list::{Chunk, ChunkList};
use super::read::{part_crc, read_parts, PartData, ReadStats};
use crate::checkpoint::{Checkpoints, VerifiedFile};
use crate::error::{CkptError, Result};
use crate::format::bundle::{encode_bundle, SectionIn};
use crate::format::{
    CheckpointId, ChunkOp, ChunkRecord, ExtractStats, FileContent, FileInfo, FileRef, Part,
};

/// Where a bundle's payload starts (its header body is 28 bytes).
const BUNDLE_PAYLOAD: u64 = 48;
/// Where a row file's payload starts (its header body is 44 bytes).
pub(super) const ROWS_PAYLOAD: u64 = 64;

/// Called by an extraction round after each file it writes, with the file's path, and awaited
/// before the round goes on: a test holds a round there (mid-way, some of its files written)
/// to check what a restore or a crash at that point sees. Nothing else installs one.
pub type RoundHook = Arc<dyn Fn(&str) -> BoxFuture<'static, ()> + Send + Sync>;

/// Which of the three filter stages run (IncrCP §4.3; all by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Filters {
    pub range: bool,
    pub bloom: bool,
    pub actual: bool,
}

impl Default for Filters {
    fn default() -> Self {
        Filters {
            range: true,
            bloom: true,
            actual: true,
        }
    }
}

/// How extraction runs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExtractConfig {
    /// `R`: the duplicate share of an old chunk above which it is extracted (0.02 in the paper).
    pub threshold: f64,
    /// Local rows per row range (0: a range is a whole table shard, one list per table as in
    /// the paper).
    pub range_rows: u64,
    /// Concatenate a round's outputs into bundles (§4.4).
    pub concat: bool,
    pub filters: Filters,
    /// Largest bundle file, in bytes.
    pub bundle_bytes: usize,
    pub bloom_bits_per_key: u32,
    /// Move the live chunks of a row-0 file whose live share fell below this (0: never).
    #[serde(default = "default_compact")]
    pub compact_below: f64,
}

fn default_compact() -> f64 {
    0.5
}

impl Default for ExtractConfig {
    fn default() -> Self {
        ExtractConfig {
            threshold: 0.02,
            range_rows: 0,
            concat: true,
            filters: Filters::default(),
            bundle_bytes: 16 << 20,
            bloom_bits_per_key: 10,
            compact_below: default_compact(),
        }
    }
}

impl ExtractConfig {
    pub fn validate(&self) -> Result<()> {
        if !(self.threshold.is_finite() && (0.0..=1.0).contains(&self.threshold)) {
            return Err(CkptError::InvalidArgument(format!(
                "extraction threshold R = {} is not in [0, 1]",
                self.threshold
            )));
        }
        if self.bundle_bytes < 1024 {
            return Err(CkptError::InvalidArgument(format!(
                "bundle size {} is below 1 KiB",
                self.bundle_bytes
            )));
        }
        if !(self.compact_below.is_finite() && (0.0..=1.0).contains(&self.compact_below)) {
            return Err(CkptError::InvalidArgument(format!(
                "compaction threshold {} is not in [0, 1]",
                self.compact_below
            )));
        }
        if self.bloom_bits_per_key == 0 || self.bloom_bits_per_key > 64 {
            return Err(CkptError::InvalidArgument(format!(
                "{} Bloom bits per key is not in 1..=64",
                self.bloom_bits_per_key
            )));
        }
        Ok(())
    }
}

/// A chunk of the new column: the rows one range saved, where the piece's files hold them.
#[derive(Debug, Clone)]
pub struct NewChunk {
    pub table: u32,
    pub range: u32,
    pub ids: Vec<RowId>,
    /// The parts in the piece's row files (`file` fields index `files` of [`column_chunks`]'s
    /// answer), in id order.
    pub parts: Vec<Part>,
}

/// Cut the new column (`tracked`: sorted ids per table, as the piece saved them) into chunks
/// per row range, locating each in the piece's row files `files` (this server's, as staging
/// wrote them: each table's ids in order, cut in files). The files are read back once (they
/// were just written) and verified against their entries, so every part gets its checksum.
/// Returns the chunks and the file table their parts index.
pub async fn column_chunks(
    ckpts: &Checkpoints,
    list: &ChunkList,
    ckpt: &CheckpointId,
    tracked: &[(TableId, Vec<RowId>)],
    files: &[FileInfo],
) -> Result<(Vec<NewChunk>, Vec<FileRef>)> {
    let mut out = Vec::new();
    let mut refs = Vec::new();
    for (table, ids) in tracked {
        let mut tf: Vec<&FileInfo> = files
            .iter()
            .filter(|f| matches!(f.content, FileContent::Rows { table: t, .. } if t == *table))
            .collect();
        tf.sort_by_key(|f| match f.content {
            FileContent::Rows { first_row, .. } => first_row,
            _ => 0,
        });
        // Each file: its position in `ids`, its index in `refs`, its bytes.
        let mut located = Vec::with_capacity(tf.len());
        let mut at = 0usize;
        for f in &tf {
            let key = ckpts.file_key(ckpt, &f.path)?;
            let data = ckpts.store().get(&key).await?;
            let chunk = match Checkpoints::verify_file(&key, f, &data)? {
                VerifiedFile::Rows(c) => c,
                _ => {
                    return Err(CkptError::Corrupt {
                        file: key.to_string(),
                        reason: "listed as rows, holds something else".into(),
                    })
                }
            };
            let n = chunk.len();
            if at + n > ids.len() || !chunk.ids().eq(ids[at..at + n].iter().copied()) {
                return Err(CkptError::InvalidArgument(format!(
                    "piece file {} of table {} does not hold the rows the piece saved",
                    f.path, table.0
                )));
            }
            refs.push(FileRef {
                ckpt: ckpt.clone(),
                path: f.path.clone(),
                size: f.size,
                crc32c: f.crc32c,
            });
            located.push((at, at + n, refs.len() as u32 - 1, chunk.header.layout, data));
            at += n;
        }
        if at != ids.len() {
            return Err(CkptError::InvalidArgument(format!(
                "the piece's files of table {} hold {at} rows, it saved {}",
                table.0,
                ids.len()
            )));
        }
        let mut i = 0usize;
        while i < ids.len() {
            let range = list.range_of(*table, ids[i]);
            let mut j = i + 1;
            while j < ids.len() && list.range_of(*table, ids[j]) == range {
                j += 1;
            }
            let mut parts = Vec::new();
            for (s, e, fi, layout, data) in &located {
                let lo = i.max(*s);
                let hi = j.min(*e);
                if lo >= hi {
                    continue;
                }
                let (lo, hi, n) = ((lo - s) as u64, (hi - s) as u64, (e - s) as u64);
                let rb = layout.bytes() as u64;
                let ids_at = ROWS_PAYLOAD + 8 * lo;
                let rows_at = ROWS_PAYLOAD + 8 * n + rb * lo;
                let crc = part_crc(
                    &data[ids_at as usize..(ids_at + 8 * (hi - lo)) as usize],
                    &data[rows_at as usize..(rows_at + rb * (hi - lo)) as usize],
                );
                parts.push(Part {
                    file: *fi,
                    section: 0,
                    lo,
                    hi,
                    ids_at,
                    rows_at,
                    row_bytes: rb as u32,
                    crc,
                });
            }
            out.push(NewChunk {
                table: table.0,
                range,
                ids: ids[i..j].to_vec(),
                parts,
            });
            i = j;
        }
    }
    Ok((out, refs))
}

/// What a round produced.
#[derive(Debug, Default)]
pub struct RoundOutput {
    /// The round's file table and records (splits and moves).
    pub files: Vec<FileRef>,
    pub records: Vec<ChunkRecord>,
    /// Bloom filters of the remainders it wrote: `(table, range, col)`.
    pub blooms: Vec<((u32, u32, u32), Bloom)>,
    /// The bundles written, for the checkpoint's manifest.
    pub written: Vec<FileInfo>,
    pub stats: ExtractStats,
    /// Store reads of the round (for the read rate).
    pub reads: ReadStats,
}

/// A section waiting for its bundle file.
struct OutSection {
    table: TableId,
    layout: RowLayout,
    column: u32,
    ids: Vec<RowId>,
    rows: Vec<u8>,
}

/// A closed bundle: its ref, its manifest entry, and each section's part (file field unset).
struct Closed {
    file: FileRef,
    info: FileInfo,
    parts: Vec<Part>,
}

/// Sections waiting for a bundle file.
struct BundleOut {
    server: ServerId,
    ckpt: CheckpointId,
    prefix: &'static str,
    concat: bool,
    cap: usize,
    open: Vec<OutSection>,
    open_bytes: usize,
    closed: Vec<Closed>,
    hook: Option<RoundHook>,
}

impl BundleOut {
    fn new(
        server: ServerId,
        ckpt: CheckpointId,
        prefix: &'static str,
        cfg: &ExtractConfig,
        hook: Option<RoundHook>,
    ) -> Self {
        BundleOut {
            server,
            ckpt,
            prefix,
            concat: cfg.concat,
            cap: cfg.bundle_bytes,
            open: Vec::new(),
            open_bytes: 0,
            closed: Vec::new(),
            hook,
        }
    }

    /// Queue a section; returns `(file number, section)`.
    async fn add(
        &mut self,
        ckpts: &Checkpoints,
        section: OutSection,
        stats: &mut ExtractStats,
    ) -> Result<(u32, u32)> {
        let n = section.ids.len() * 8 + section.rows.len();
        if !self.open.is_empty() && (!self.concat || self.open_bytes + n > self.cap) {
            self.flush(ckpts, stats).await?;
        }
        self.open.push(section);
        self.open_bytes += n;
        Ok((self.closed.len() as u32, (self.open.len() - 1) as u32))
    }

    async fn flush(&mut self, ckpts: &Checkpoints, stats: &mut ExtractStats) -> Result<()> {
        if self.open.is_empty() {
            return Ok(());
        }
        let id_bytes: Vec<Vec<u8>> = self
            .open
            .iter()
            .map(|o| o.ids.iter().flat_map(|i| i.to_le_bytes()).collect())
            .collect();
        let sections: Vec<SectionIn<'_>> = self
            .open
            .iter()
            .map(|o| SectionIn {
                table: o.table,
                layout: o.layout,
                column: o.column,
                ids: &o.ids,
                rows: &o.rows,
            })
            .collect();
        let file = encode_bundle(self.server, &sections)?;
        // The sections' places, as the bundle format lays them out.
        let mut at = BUNDLE_PAYLOAD + 48 * self.open.len() as u64;
        let mut parts = Vec::with_capacity(self.open.len());
        for (o, ids) in self.open.iter().zip(&id_bytes) {
            let n = o.ids.len() as u64;
            parts.push(Part {
                file: 0,
                section: parts.len() as u32,
                lo: 0,
                hi: n,
                ids_at: at,
                rows_at: at + 8 * n,
                row_bytes: o.layout.bytes() as u32,
                crc: part_crc(ids, &o.rows),
            });
            at += (ids.len() + o.rows.len()).div_ceil(8) as u64 * 8;
        }
        let rows: u64 = self.open.iter().map(|s| s.ids.len() as u64).sum();
        let path = format!(
            "s{:04}/{}-{:06}.bndl",
            self.server.0,
            self.prefix,
            self.closed.len()
        );
        ckpts.put_file(&self.ckpt, &path, &file).await?;
        stats.files_written += 1;
        stats.bytes_written += file.size();
        self.closed.push(Closed {
            file: FileRef {
                ckpt: self.ckpt.clone(),
                path: path.clone(),
                size: file.size(),
                crc32c: file.checksums,
            },
            info: FileInfo {
                path,
                size: file.size(),
                crc32c: file.checksums,
                content: FileContent::Bundle {
                    server: self.server,
                    sections: self.open.len() as u64,
                    rows,
                },
            },
            parts,
        });
        self.open.clear();
        self.open_bytes = 0;
        if let Some(h) = &self.hook {
            h(&self.closed[self.closed.len() - 1].info.path).await;
        }
        Ok(())
    }
}

/// Rows `ids` ascending; `new` ascending: the positions of `ids` that `new` holds.
fn duplicates(ids: &[RowId], new: &[RowId]) -> Vec<bool> {
    let mut out = vec![false; ids.len()];
    let (mut i, mut j) = (0, 0);
    while i < ids.len() && j < new.len() {
        match ids[i].cmp(&new[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                out[i] = true;
                i += 1;
                j += 1;
            }
        }
    }
    out
}

/// The rows of chunks, read part by part (each file once, coalesced), in the order given.
async fn read_chunks(
    ckpts: &Checkpoints,
    list: &ChunkList,
    chunks: &[&Chunk],
    stats: &mut ExtractStats,
    reads: &mut ReadStats,
) -> Result<Vec<(Vec<RowId>, Vec<u8>)>> {
    let mut by_file: BTreeMap<u32, Vec<(usize, usize)>> = BTreeMap::new();
    for (ci, c) in chunks.iter().enumerate() {
        for (pi, p) in c.parts.iter().enumerate() {
            by_file.entry(p.file).or_default().push((ci, pi));
        }
    }
    let mut got: HashMap<(usize, usize), PartData> = HashMap::new();
    for (f, which) in by_file {
        let parts: Vec<Part> = which.iter().map(|&(c, p)| chunks[c].parts[p]).collect();
        let before = reads.bytes;
        let data = read_parts(ckpts, &list.file(f).file, &parts, reads).await?;
        stats.files_read += 1;
        stats.bytes_read += reads.bytes - before;
        for (k, d) in which.into_iter().zip(data) {
            got.insert(k, d);
        }
    }
    let mut out = Vec::with_capacity(chunks.len());
    for (ci, c) in chunks.iter().enumerate() {
        let mut ids = Vec::with_capacity(c.rows as usize);
        let mut rows = Vec::new();
        let mut rb = None;
        for (pi, p) in c.parts.iter().enumerate() {
            let d = &got[&(ci, pi)];
            if rb.is_some_and(|b| b != p.row_bytes) {
                let f = &list.file(p.file).file;
                return Err(CkptError::Corrupt {
                    file: format!("{}/{}", f.ckpt, f.path),
                    reason: "parts of one chunk with different row sizes".into(),
                });
            }
            rb = Some(p.row_bytes);
            ids.extend(d.ids());
            rows.extend_from_slice(d.rows());
        }
        out.push((ids, rows));
    }
    Ok(out)
}

/// Where an output part will be: the row-0 or the new row's bundle `file`, `section`.
#[derive(Clone, Copy)]
struct Pending {
    row0: bool,
    file: u32,
    section: u32,
}

/// The layout of a table's rows in this list (from the writer of the chunk).
fn layout_of(layouts: &HashMap<u32, RowLayout>, table: u32) -> Result<RowLayout> {
    layouts
        .get(&table)
        .copied()
        .ok_or_else(|| CkptError::InvalidArgument(format!("no row layout known for table {table}")))
}

/// The new column's own row-0 chunks (checkpoint `ckpt`, column `col`; `new` from
/// [`column_chunks`], parts indexing `new_files`): their records, the file table they index,
/// and their Bloom filters `(table, range, col)`. No extraction: that is [`extract_round`]'s.
#[allow(clippy::type_complexity)]
pub fn column_records(
    col: u32,
    new: &[NewChunk],
    new_files: &[FileRef],
    cfg: &ExtractConfig,
) -> (
    Vec<FileRef>,
    Vec<ChunkRecord>,
    Vec<((u32, u32, u32), Bloom)>,
) {
    let mut files: Vec<FileRef> = Vec::new();
    let mut file_ix: HashMap<(CheckpointId, String), u32> = HashMap::new();
    let mut records = Vec::with_capacity(new.len());
    let mut blooms = Vec::with_capacity(new.len());
    for n in new {
        let parts = n
            .parts
            .iter()
            .map(|p| {
                let f = &new_files[p.file as usize];
                let ix = *file_ix
                    .entry((f.ckpt.clone(), f.path.clone()))
                    .or_insert_with(|| {
                        files.push(f.clone());
                        (files.len() - 1) as u32
                    });
                Part { file: ix, ..*p }
            })
            .collect();
        records.push(ChunkRecord {
            op: ChunkOp::Column,
            table: n.table,
            range: n.range,
            col,
            round: 0,
            rows: n.ids.len() as u64,
            min: n.ids.first().copied().unwrap_or(0),
            max: n.ids.last().copied().unwrap_or(0),
            parts,
        });
        blooms.push((
            (n.table, n.range, col),
            Bloom::of(n.ids.iter().copied(), cfg.bloom_bits_per_key),
        ));
    }
    (files, records, blooms)
}

/// Run the extraction round of column `col` (checkpoint `ckpt`, whose chunks are `new`)
/// against `list`, which holds that column in row 0 and every earlier round; outputs are
/// written under `ckpt`. Returns the splits and moves (no [`ChunkOp::Column`] record: the column
/// was recorded when its piece was finished) and the file table they index. `layouts` gives
/// each table's row layout; `hook`, if any, is awaited after each file written.
#[allow(clippy::too_many_arguments)]
pub async fn extract_round(
    ckpts: &Checkpoints,
    list: &ChunkList,
    col: u32,
    ckpt: &CheckpointId,
    new: &[NewChunk],
    layouts: &HashMap<u32, RowLayout>,
    cfg: &ExtractConfig,
    hook: Option<RoundHook>,
) -> Result<RoundOutput> {
    cfg.validate()?;
    let t0 = Instant::now();
    let mut out = RoundOutput::default();
    let server = list.server();
    let mut file_ix: HashMap<(CheckpointId, String), u32> = HashMap::new();
    let mut local = |files: &mut Vec<FileRef>, f: &FileRef| -> u32 {
        *file_ix
            .entry((f.ckpt.clone(), f.path.clone()))
            .or_insert_with(|| {
                files.push(f.clone());
                (files.len() - 1) as u32
            })
    };
    // Stages 1 and 2 on every old row-0 chunk of the ranges the new column touched.
    let mut candidates: Vec<(&Chunk, &NewChunk)> = Vec::new();
    for n in new {
        let (lo, hi) = (
            n.ids.first().copied().unwrap_or(0),
            n.ids.last().copied().unwrap_or(0),
        );
        for c in list.row0(n.table, n.range) {
            if c.col >= col || c.rows == 0 {
                continue;
            }
            out.stats.compared += 1;
            if cfg.filters.range && (hi < c.min || lo > c.max) {
                out.stats.range_skips += 1;
                continue;
            }
            if cfg.filters.bloom {
                if let Some(b) = &c.bloom {
                    let a = n.ids.partition_point(|&x| x < c.min);
                    let z = n.ids.partition_point(|&x| x <= c.max);
                    let hits = n.ids[a..z].iter().filter(|&&x| b.contains(x)).count();
                    if hits as f64 / c.rows as f64 <= cfg.threshold {
                        out.stats.bloom_skips += 1;
                        continue;
                    }
                }
            }
            candidates.push((c, n));
        }
    }
    // Stage 3 and the splits.
    let cands: Vec<&Chunk> = candidates.iter().map(|(c, _)| *c).collect();
    let loaded = read_chunks(ckpts, list, &cands, &mut out.stats, &mut out.reads).await?;
    let mut row0_out = BundleOut::new(server, ckpt.clone(), "row0", cfg, hook.clone());
    let mut xrow_out = BundleOut::new(server, ckpt.clone(), "xrow", cfg, hook);
    let mut pending: Vec<(ChunkRecord, Pending)> = Vec::new();
    let mut split: BTreeSet<(u32, u32, u32)> = BTreeSet::new();
    for ((c, n), (ids, rows)) in candidates.iter().zip(loaded) {
        let layout = layout_of(layouts, c.table)?;
        let dup = duplicates(&ids, &n.ids);
        let d = dup.iter().filter(|&&x| x).count();
        let ratio = d as f64 / ids.len().max(1) as f64;
        if d == 0 || (cfg.filters.actual && ratio <= cfg.threshold) {
            out.stats.actual_skips += 1;
            continue;
        }
        out.stats.extracted += 1;
        split.insert((c.table, c.range, c.col));
        let rb = layout.bytes();
        let (mut keep_ids, mut keep_rows, mut x_ids, mut x_rows) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, &is_dup) in dup.iter().enumerate() {
            let row = &rows[i * rb..(i + 1) * rb];
            if is_dup {
                x_ids.push(ids[i]);
                x_rows.extend_from_slice(row);
            } else {
                keep_ids.push(ids[i]);
                keep_rows.extend_from_slice(row);
            }
        }
        out.stats.rows_extracted += x_ids.len() as u64;
        out.stats.rows_rewritten += keep_ids.len() as u64;
        let table = TableId(c.table);
        let xr = record(c, ChunkOp::Extracted, col, &x_ids);
        let x_section = OutSection {
            table,
            layout,
            column: c.col,
            ids: x_ids,
            rows: x_rows,
        };
        let (xf, xs) = xrow_out.add(ckpts, x_section, &mut out.stats).await?;
        pending.push((
            xr,
            Pending {
                row0: false,
                file: xf,
                section: xs,
            },
        ));
        if !keep_ids.is_empty() {
            let rr = record(c, ChunkOp::Remainder, 0, &keep_ids);
            out.blooms.push((
                (c.table, c.range, c.col),
                Bloom::of(keep_ids.iter().copied(), cfg.bloom_bits_per_key),
            ));
            let r_section = OutSection {
                table,
                layout,
                column: c.col,
                ids: keep_ids,
                rows: keep_rows,
            };
            let (rf, rs) = row0_out.add(ckpts, r_section, &mut out.stats).await?;
            pending.push((
                rr,
                Pending {
                    row0: true,
                    file: rf,
                    section: rs,
                },
            ));
        }
    }
    // Compaction: row-0 files mostly dead once this round's splits are counted.
    if cfg.compact_below > 0.0 {
        let mut live: HashMap<u32, u64> = HashMap::new();
        for c in list.row0_chunks() {
            if split.contains(&(c.table, c.range, c.col)) {
                continue;
            }
            for p in &c.parts {
                *live.entry(p.file).or_default() += p.bytes();
            }
        }
        let sparse: BTreeSet<u32> = live
            .iter()
            .filter(|(f, b)| {
                let size = list.file(**f).file.size.max(1);
                (**b as f64) < cfg.compact_below * size as f64
            })
            .map(|(f, _)| *f)
            .collect();
        // The round's own column is never moved: its files are the piece's, just written.
        let movers: Vec<&Chunk> = list
            .row0_chunks()
            .filter(|c| c.col < col && !split.contains(&(c.table, c.range, c.col)))
            .filter(|c| c.parts.iter().any(|p| sparse.contains(&p.file)))
            .collect();
        let moved = read_chunks(ckpts, list, &movers, &mut out.stats, &mut out.reads).await?;
        for (c, (ids, rows)) in movers.into_iter().zip(moved) {
            let layout = layout_of(layouts, c.table)?;
            out.stats.moved += 1;
            out.stats.rows_moved += ids.len() as u64;
            let mr = record(c, ChunkOp::Moved, 0, &ids);
            let section = OutSection {
                table: TableId(c.table),
                layout,
                column: c.col,
                ids,
                rows,
            };
            let (f, s) = row0_out.add(ckpts, section, &mut out.stats).await?;
            pending.push((
                mr,
                Pending {
                    row0: true,
                    file: f,
                    section: s,
                },
            ));
        }
    }
    row0_out.flush(ckpts, &mut out.stats).await?;
    xrow_out.flush(ckpts, &mut out.stats).await?;
    for (mut r, p) in pending {
        let bundle = if p.row0 { &row0_out } else { &xrow_out };
        let closed = &bundle.closed[p.file as usize];
        let part = closed.parts[p.section as usize];
        r.parts.push(Part {
            file: local(&mut out.files, &closed.file),
            ..part
        });
        out.records.push(r);
    }
    out.written = row0_out
        .closed
        .into_iter()
        .chain(xrow_out.closed)
        .map(|c| c.info)
        .collect();
    out.stats.seconds = t0.elapsed().as_secs_f64();
    Ok(out)
}

/// A record of `c`'s range and column holding `ids` (parts added once written).
fn record(c: &Chunk, op: ChunkOp, round: u32, ids: &[RowId]) -> ChunkRecord {
    ChunkRecord {
        op,
        table: c.table,
        range: c.range,
        col: c.col,
        round,
        rows: ids.len() as u64,
        min: ids.first().copied().unwrap_or(0),
        max: ids.last().copied().unwrap_or(0),
        parts: Vec::new(),
    }
}
