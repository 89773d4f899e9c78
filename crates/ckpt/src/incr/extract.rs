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
//! A round never changes the list itself: it reads, writes new files (create-only, under the
//! new column's checkpoint) and returns the records; the caller applies them
//! ([`ChunkList::apply`]), exactly as a restore folds them later.

use std::collections::HashMap;
use std::time::Instant;

use bytes::Bytes;
use ftrec_core::{RowId, RowLayout, ServerId, TableId};

use super::bloom::Bloom;
use super::list::{Chunk, ChunkList};
use crate::checkpoint::Checkpoints;
use crate::error::{CkptError, Result};
use crate::format::bundle::{encode_bundle, Bundle, SectionIn};
use crate::format::rows::RowChunk;
use crate::format::{
    check_recorded, CheckpointId, ChunkOp, ChunkRecord, ExtractStats, FileContent, FileInfo,
    FileRef, Part,
};

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
        if self.bloom_bits_per_key == 0 || self.bloom_bits_per_key > 64 {
            return Err(CkptError::InvalidArgument(format!(
                "{} Bloom bits per key is not in 1..=64",
                self.bloom_bits_per_key
            )));
        }
        Ok(())
    }
}

/// A row file or a bundle, read and checked against what the list recorded about it.
pub(crate) enum ChunkFile<'a> {
    Rows(RowChunk<'a>),
    Bundle(Bundle<'a>),
}

/// One section's rows.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    pub table: TableId,
    pub layout: RowLayout,
    ids: &'a [u8],
    rows: &'a [u8],
}

impl<'a> Rows<'a> {
    pub fn len(&self) -> usize {
        self.ids.len() / 8
    }
    pub fn id(&self, i: usize) -> RowId {
        u64::from_le_bytes(self.ids[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }
    pub fn row(&self, i: usize) -> &'a [u8] {
        let b = self.layout.bytes();
        &self.rows[i * b..(i + 1) * b]
    }
    pub fn rows(&self, lo: usize, hi: usize) -> &'a [u8] {
        let b = self.layout.bytes();
        &self.rows[lo * b..hi * b]
    }
}

impl<'a> ChunkFile<'a> {
    /// Decode `data` read from `name`, checking it against `recorded`.
    pub fn open(name: &str, data: &'a [u8], recorded: &FileRef) -> Result<ChunkFile<'a>> {
        let tag = data.get(4..8).unwrap_or(&[]);
        let (f, sums) = if tag == b"BNDL" {
            let b = Bundle::decode(name, data)?;
            let s = b.checksums;
            (ChunkFile::Bundle(b), s)
        } else {
            let r = RowChunk::decode(name, data)?;
            let s = r.checksums;
            (ChunkFile::Rows(r), s)
        };
        check_recorded(
            name,
            "manifest",
            data.len() as u64,
            sums,
            recorded.size,
            recorded.crc32c,
        )?;
        Ok(f)
    }

    /// Section `section`'s rows; `name` names the file in errors.
    pub fn section(&self, name: &str, section: u32) -> Result<Rows<'a>> {
        let missing = || CkptError::Corrupt {
            file: name.to_string(),
            reason: format!("has no section {section}"),
        };
        match self {
            ChunkFile::Rows(r) if section == 0 => {
                let n = r.len();
                Ok(Rows {
                    table: r.header.table,
                    layout: r.header.layout,
                    ids: r.ids_bytes(),
                    rows: r.rows_bytes(0, n),
                })
            }
            ChunkFile::Rows(_) => Err(missing()),
            ChunkFile::Bundle(b) => {
                if section as usize >= b.sections().len() {
                    return Err(missing());
                }
                let v = b.section(section as usize);
                Ok(Rows {
                    table: v.header.table,
                    layout: v.header.layout,
                    ids: v.ids_bytes(),
                    rows: v.rows_bytes(0, v.len()),
                })
            }
        }
    }
}

/// A chunk of the new column: the rows one range saved, where the piece's files hold them.
#[derive(Debug, Clone)]
pub struct NewChunk {
    pub table: u32,
    pub range: u32,
    pub ids: Vec<RowId>,
    /// `(file, rows lo..hi)` of the piece's row files, in id order.
    pub parts: Vec<(FileRef, u64, u64)>,
}

/// Cut the new column (`tracked`: sorted ids per table, as the piece saved them) into chunks
/// per row range, locating each in the piece's row files `files` (this server's, as staging
/// wrote them: each table's ids in order, cut in files).
pub fn column_chunks(
    list: &ChunkList,
    ckpt: &CheckpointId,
    tracked: &[(TableId, Vec<RowId>)],
    files: &[FileInfo],
) -> Result<Vec<NewChunk>> {
    let mut out = Vec::new();
    for (table, ids) in tracked {
        let mut tf: Vec<&FileInfo> = files
            .iter()
            .filter(|f| matches!(f.content, FileContent::Rows { table: t, .. } if t == *table))
            .collect();
        tf.sort_by_key(|f| match f.content {
            FileContent::Rows { first_row, .. } => first_row,
            _ => 0,
        });
        // Position of each file's first id in `ids`.
        let mut starts = Vec::with_capacity(tf.len());
        let mut at = 0u64;
        for f in &tf {
            let FileContent::Rows {
                rows,
                first_row,
                last_row,
                ..
            } = f.content
            else {
                continue;
            };
            let end = at + rows;
            let ok = end as usize <= ids.len()
                && (rows == 0
                    || (ids[at as usize] == first_row && ids[end as usize - 1] == last_row));
            if !ok {
                return Err(CkptError::InvalidArgument(format!(
                    "piece file {} of table {} does not hold the rows the piece saved",
                    f.path, table.0
                )));
            }
            starts.push((at, end));
            at = end;
        }
        if at as usize != ids.len() {
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
            for (k, &(s, e)) in starts.iter().enumerate() {
                let lo = (i as u64).max(s);
                let hi = (j as u64).min(e);
                if lo < hi {
                    let f = tf[k];
                    parts.push((
                        FileRef {
                            ckpt: ckpt.clone(),
                            path: f.path.clone(),
                            size: f.size,
                            crc32c: f.crc32c,
                        },
                        lo - s,
                        hi - s,
                    ));
                }
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
    Ok(out)
}

/// What a round produced.
#[derive(Debug, Default)]
pub struct RoundOutput {
    /// The piece's file table and records (the new column's chunks, then the splits).
    pub files: Vec<FileRef>,
    pub records: Vec<ChunkRecord>,
    /// Bloom filters of the new row-0 chunks: `(table, range, col)`.
    pub blooms: Vec<((u32, u32, u32), Bloom)>,
    /// The bundles written, for the checkpoint's manifest.
    pub written: Vec<FileInfo>,
    pub stats: ExtractStats,
    /// Seconds spent in store reads (for the read rate).
    pub read_s: f64,
}

/// A section waiting for its bundle file.
struct OutSection {
    table: TableId,
    layout: RowLayout,
    column: u32,
    ids: Vec<RowId>,
    rows: Vec<u8>,
}

/// Sections waiting for a bundle file.
struct BundleOut {
    server: ServerId,
    ckpt: CheckpointId,
    prefix: &'static str,
    concat: bool,
    cap: usize,
    /// Sections of the open file.
    open: Vec<OutSection>,
    open_bytes: usize,
    /// Files closed so far, by number: their refs (and manifest entries).
    closed: Vec<(FileRef, FileInfo)>,
}

impl BundleOut {
    fn new(
        server: ServerId,
        ckpt: CheckpointId,
        prefix: &'static str,
        cfg: &ExtractConfig,
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
        }
    }

    /// Queue a section; returns `(file number, section)` once known.
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
        self.closed.push((
            FileRef {
                ckpt: self.ckpt.clone(),
                path: path.clone(),
                size: file.size(),
                crc32c: file.checksums,
            },
            FileInfo {
                path,
                size: file.size(),
                crc32c: file.checksums,
                content: FileContent::Bundle {
                    server: self.server,
                    sections: self.open.len() as u64,
                    rows,
                },
            },
        ));
        self.open.clear();
        self.open_bytes = 0;
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

/// Where an output part will be: the row-0 or the new row's bundle `file`, `section`.
#[derive(Clone, Copy)]
struct Pending {
    row0: bool,
    file: u32,
    section: u32,
}

/// Run the extraction round of the new column `col` (checkpoint `ckpt`, whose chunks are
/// `new`) against `list`, writing outputs under `ckpt` in `ckpts`.
pub async fn extract_round(
    ckpts: &Checkpoints,
    list: &ChunkList,
    col: u32,
    ckpt: &CheckpointId,
    new: &[NewChunk],
    cfg: &ExtractConfig,
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
    // The new column's own row-0 chunks.
    for n in new {
        let parts = n
            .parts
            .iter()
            .map(|(f, lo, hi)| Part {
                file: local(&mut out.files, f),
                section: 0,
                lo: *lo,
                hi: *hi,
            })
            .collect();
        out.records.push(ChunkRecord {
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
        out.blooms.push((
            (n.table, n.range, col),
            Bloom::of(n.ids.iter().copied(), cfg.bloom_bits_per_key),
        ));
    }
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
    // Stage 3 and the splits: load each candidate's files (each file once, released when no
    // later candidate needs it).
    candidates.sort_by_key(|(c, _)| (c.parts.first().map_or(0, |p| p.file), c.table, c.range));
    let mut need: HashMap<u32, usize> = HashMap::new();
    for (c, _) in &candidates {
        for p in &c.parts {
            *need.entry(p.file).or_default() += 1;
        }
    }
    let mut loaded: HashMap<u32, Bytes> = HashMap::new();
    let mut row0_out = BundleOut::new(server, ckpt.clone(), "row0", cfg);
    let mut xrow_out = BundleOut::new(server, ckpt.clone(), "xrow", cfg);
    // (record without parts, pending parts)
    let mut splits: Vec<(ChunkRecord, Pending)> = Vec::new();
    for (c, n) in candidates {
        for p in &c.parts {
            if let std::collections::hash_map::Entry::Vacant(e) = loaded.entry(p.file) {
                let f = &list.file(p.file).file;
                let key = ckpts.file_key(&f.ckpt, &f.path)?;
                let r0 = Instant::now();
                let data = ckpts.store().get(&key).await?;
                out.read_s += r0.elapsed().as_secs_f64();
                out.stats.files_read += 1;
                out.stats.bytes_read += data.len() as u64;
                // Verified once here; later decodes of the same bytes only re-read headers.
                ChunkFile::open(key.as_str(), &data, f)?;
                e.insert(data);
            }
        }
        // Gather the chunk's rows.
        let mut ids: Vec<RowId> = Vec::with_capacity(c.rows as usize);
        let mut rows: Vec<u8> = Vec::new();
        let mut layout = None;
        for p in &c.parts {
            let f = &list.file(p.file).file;
            let name = format!("{}/{}", f.ckpt, f.path);
            let data = &loaded[&p.file];
            let cf = ChunkFile::open_verified(&name, data)?;
            let s = cf.section(&name, p.section)?;
            if p.hi as usize > s.len() || s.table.0 != c.table {
                return Err(CkptError::Corrupt {
                    file: name,
                    reason: format!(
                        "section {} does not hold rows {}..{} of table {}",
                        p.section, p.lo, p.hi, c.table
                    ),
                });
            }
            if layout.is_some_and(|l| l != s.layout) {
                return Err(CkptError::Corrupt {
                    file: name,
                    reason: "parts of one chunk with different row layouts".into(),
                });
            }
            layout = Some(s.layout);
            for i in p.lo as usize..p.hi as usize {
                ids.push(s.id(i));
            }
            rows.extend_from_slice(s.rows(p.lo as usize, p.hi as usize));
        }
        for p in &c.parts {
            let left = need.get_mut(&p.file).expect("counted above");
            *left -= 1;
            if *left == 0 {
                loaded.remove(&p.file);
            }
        }
        let Some(layout) = layout else { continue };
        let dup = duplicates(&ids, &n.ids);
        let d = dup.iter().filter(|&&x| x).count();
        let ratio = d as f64 / ids.len().max(1) as f64;
        if d == 0 || (cfg.filters.actual && ratio <= cfg.threshold) {
            out.stats.actual_skips += 1;
            continue;
        }
        out.stats.extracted += 1;
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
        let record = |op, round, ids: &[RowId]| ChunkRecord {
            op,
            table: c.table,
            range: c.range,
            col: c.col,
            round,
            rows: ids.len() as u64,
            min: ids.first().copied().unwrap_or(0),
            max: ids.last().copied().unwrap_or(0),
            parts: Vec::new(),
        };
        let xr = record(ChunkOp::Extracted, col, &x_ids);
        let x_section = OutSection {
            table,
            layout,
            column: c.col,
            ids: x_ids,
            rows: x_rows,
        };
        let (xf, xs) = xrow_out.add(ckpts, x_section, &mut out.stats).await?;
        splits.push((
            xr,
            Pending {
                row0: false,
                file: xf,
                section: xs,
            },
        ));
        if !keep_ids.is_empty() {
            let rr = record(ChunkOp::Remainder, 0, &keep_ids);
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
            splits.push((
                rr,
                Pending {
                    row0: true,
                    file: rf,
                    section: rs,
                },
            ));
        }
    }
    row0_out.flush(ckpts, &mut out.stats).await?;
    xrow_out.flush(ckpts, &mut out.stats).await?;
    for (mut r, p) in splits {
        let bundle = if p.row0 { &row0_out } else { &xrow_out };
        let f = &bundle.closed[p.file as usize].0;
        r.parts.push(Part {
            file: local(&mut out.files, f),
            section: p.section,
            lo: 0,
            hi: r.rows,
        });
        out.records.push(r);
    }
    out.written = row0_out
        .closed
        .into_iter()
        .chain(xrow_out.closed)
        .map(|(_, info)| info)
        .collect();
    out.stats.seconds = t0.elapsed().as_secs_f64();
    Ok(out)
}

impl<'a> ChunkFile<'a> {
    /// Decode bytes [`ChunkFile::open`] already checked.
    pub(crate) fn open_verified(name: &str, data: &'a [u8]) -> Result<ChunkFile<'a>> {
        if data.get(4..8) == Some(b"BNDL") {
            Ok(ChunkFile::Bundle(Bundle::decode_verified(name, data)?))
        } else {
            Ok(ChunkFile::Rows(RowChunk::decode_verified(name, data)?))
        }
    }
}
