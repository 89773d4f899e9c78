//! Piece indexes (`PIDX`, version 2): what one server's part of an incremental checkpoint is.
//!
//! Every incremental piece (naive incremental, Check-N-Run differential, IncrCP chunk list; see
//! `crate::incr`) carries one per server. It names the scheme, the base full checkpoint the
//! piece's list grows from and the piece's column in that list (1 for the first piece after the
//! base), and, for the chunk list, the *records* of the 2-D list this checkpoint adds (IncrCP
//! §4.2): the new column's chunks (one per row range it touched) and the chunks the extraction
//! round against this column split (each old chunk's remainder and the part extracted to the new
//! row). Folding the records of a chain of pieces, oldest first, gives the whole 2-D list.
//!
//! A chunk-list piece also lists the list's whole row 0 after it ([`PieceIndex::row0`]): the
//! rectangle of the newest column is row 0 and nothing else (§4.2), so a restore of the newest
//! state (the common case: a failure restores the newest checkpoint) reads this one index
//! instead of folding the records of every piece since the base. On disk, row-0 entries that a
//! record of the same piece already gives (the new column's chunks, remainders, moved chunks)
//! are not repeated: the decoder puts them back.
//!
//! Header body (after the payload length), 8 bytes: `server u32 | column u32`, repeated in the
//! payload and checked against it.
//!
//! Version 2 payload (binary; `v` is an unsigned LEB128 varint of at most 10 bytes, `s` a
//! varint length and that many UTF-8 bytes; `Δ` a wrapping difference, so any values round-trip):
//!
//! ```text
//! v server | v column | u8 scheme (0 incremental, 1 differential, 2 chunk list)
//! u8 quant bits (0, 8 or 4) | f32 quant_max_abs_error | s base
//! v range_rows | v base_bytes | v restore_bytes | f64 read_bytes_per_s
//! stats: v compared, range_skips, bloom_skips, actual_skips, extracted, rows_extracted,
//!        rows_rewritten, moved, rows_moved, files_read, bytes_read, files_written,
//!        bytes_written | f64 seconds
//! v n, n x s checkpoint id                          (the ids files name, each once)
//! v n, n x (v id index | s path | v size | u32 header crc | u32 payload crc)
//! v n, n x (u8 op | v table | v range | v col | v round | record)          chunk records
//! u8 row0 present (0 or 1), then if 1: v n, n x (v table | v range | v col | record)
//! record: v min | v Δ(max - min) | v parts, each:
//!         v file | v section | v lo | v Δ(hi - lo) | v ids_at | v Δ(rows_at - ids_at)
//!         | v row_bytes | u32 crc
//! ```
//!
//! A record's row count is the sum of its parts' rows (version 1 stored it apart). The stored
//! row-0 entries are those whose `(table, range, col)` no column, remainder or moved record of
//! the piece has, in ascending `(table, range, col)` order.
//!
//! Version 1 (still read): the same header; the payload is the [`PieceIndex`] as JSON, every
//! row-0 entry in full.

use ftrec_core::ServerId;
use serde::{Deserialize, Serialize};

use super::manifest::{CheckpointId, PieceScheme};
use super::qrows::QuantBits;
use super::{parse_frame, EncodedFile, Fields, FileChecksums, FileKind, FrameBuilder};
use crate::error::{CkptError, Result};

/// A file a checkpoint of the same list holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    pub ckpt: CheckpointId,
    /// Path relative to that checkpoint's directory.
    pub path: String,
    pub size: u64,
    /// The file's checksums: a read is checked against them, not only against itself.
    pub crc32c: FileChecksums,
}

/// What a chunk record does to the 2-D list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkOp {
    /// The row-0 chunk of the new column (the rows this piece saved in one range).
    Column,
    /// The new row-0 chunk of an older column after extraction: what is left once the rows the
    /// new column saved again were extracted (replaces the column's row-0 chunk).
    Remainder,
    /// The rows extracted from an older column's row-0 chunk into the new row (superseded by the
    /// new column).
    Extracted,
    /// An older column's row-0 chunk, unchanged, moved to a new file: compaction of a file
    /// most of whose chunks were split away (replaces the column's row-0 chunk).
    Moved,
}

/// Rows `lo..hi` of section `section` of file `file` (an index into [`PieceIndex::files`]).
/// A row file has one section (0); a bundle has many. The part's bytes are the ids at
/// `ids_at` and the rows at `rows_at` (absolute file offsets, `row_bytes` per row), and `crc`
/// is the crc32c of those id bytes followed by those row bytes: a restore reads exactly the
/// part's bytes and checks them, without reading (or trusting) the rest of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "PartWire", into = "PartWire")]
pub struct Part {
    pub file: u32,
    pub section: u32,
    pub lo: u64,
    pub hi: u64,
    pub ids_at: u64,
    pub rows_at: u64,
    pub row_bytes: u32,
    pub crc: u32,
}

type PartWire = (u32, u32, u64, u64, u64, u64, u32, u32);

impl From<PartWire> for Part {
    fn from(w: PartWire) -> Part {
        Part {
            file: w.0,
            section: w.1,
            lo: w.2,
            hi: w.3,
            ids_at: w.4,
            rows_at: w.5,
            row_bytes: w.6,
            crc: w.7,
        }
    }
}

impl From<Part> for PartWire {
    fn from(p: Part) -> Self {
        (
            p.file,
            p.section,
            p.lo,
            p.hi,
            p.ids_at,
            p.rows_at,
            p.row_bytes,
            p.crc,
        )
    }
}

impl Part {
    pub fn rows(&self) -> u64 {
        self.hi.saturating_sub(self.lo)
    }

    /// Bytes a read of the part fetches (saturating: a validated part fits its file, so only a
    /// part nobody validated can reach the bound).
    pub fn bytes(&self) -> u64 {
        self.rows().saturating_mul(8 + self.row_bytes as u64)
    }
}

type RecordWire = (u8, u32, u32, u32, u32, u64, u64, u64, Vec<Part>);

/// One chunk of the 2-D list: rows of one row range of one table, saved in column `col`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RecordWire", into = "RecordWire")]
pub struct ChunkRecord {
    pub op: ChunkOp,
    pub table: u32,
    /// The row range (local rows `range * range_rows ..`; 0 when a range is a whole table shard).
    pub range: u32,
    /// The column (checkpoint) the rows were saved in.
    pub col: u32,
    /// 0 for row-0 chunks; the extraction round (column) that extracted an extracted chunk.
    pub round: u32,
    pub rows: u64,
    /// Smallest and largest row id (IncrCP §4.3's index range check).
    pub min: u64,
    pub max: u64,
    pub parts: Vec<Part>,
}

impl TryFrom<RecordWire> for ChunkRecord {
    type Error = String;
    fn try_from(w: RecordWire) -> std::result::Result<Self, String> {
        let op = match w.0 {
            0 => ChunkOp::Column,
            1 => ChunkOp::Remainder,
            2 => ChunkOp::Extracted,
            3 => ChunkOp::Moved,
            x => return Err(format!("unknown chunk op {x}")),
        };
        Ok(ChunkRecord {
            op,
            table: w.1,
            range: w.2,
            col: w.3,
            round: w.4,
            rows: w.5,
            min: w.6,
            max: w.7,
            parts: w.8,
        })
    }
}

impl From<ChunkRecord> for RecordWire {
    fn from(r: ChunkRecord) -> Self {
        let op = match r.op {
            ChunkOp::Column => 0,
            ChunkOp::Remainder => 1,
            ChunkOp::Extracted => 2,
            ChunkOp::Moved => 3,
        };
        (
            op, r.table, r.range, r.col, r.round, r.rows, r.min, r.max, r.parts,
        )
    }
}

/// What an extraction round did (IncrCP §4.3: which filter stopped each comparison).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtractStats {
    /// Row-0 chunks of older columns compared with the new column.
    pub compared: u64,
    /// Skipped by the index range check (key ranges do not overlap).
    pub range_skips: u64,
    /// Skipped by the Bloom filter (estimated duplicate ratio at or below the threshold).
    pub bloom_skips: u64,
    /// Loaded, then skipped by the actual duplicate count (ratio below the threshold).
    pub actual_skips: u64,
    /// Split into a remainder and an extracted chunk.
    pub extracted: u64,
    /// Rows moved to the new row.
    pub rows_extracted: u64,
    /// Rows rewritten as remainders.
    pub rows_rewritten: u64,
    /// Row-0 chunks moved out of mostly dead files (compaction), and their rows.
    #[serde(default)]
    pub moved: u64,
    #[serde(default)]
    pub rows_moved: u64,
    pub files_read: u64,
    pub bytes_read: u64,
    pub files_written: u64,
    pub bytes_written: u64,
    /// Seconds the round took (reads, splits and writes).
    pub seconds: f64,
}

impl ExtractStats {
    pub fn add(&mut self, o: &ExtractStats) {
        self.compared += o.compared;
        self.range_skips += o.range_skips;
        self.bloom_skips += o.bloom_skips;
        self.actual_skips += o.actual_skips;
        self.extracted += o.extracted;
        self.rows_extracted += o.rows_extracted;
        self.rows_rewritten += o.rows_rewritten;
        self.moved += o.moved;
        self.rows_moved += o.rows_moved;
        self.files_read += o.files_read;
        self.bytes_read += o.bytes_read;
        self.files_written += o.files_written;
        self.bytes_written += o.bytes_written;
        self.seconds += o.seconds;
    }
}

/// One server's part of an incremental checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PieceIndex {
    pub server: ServerId,
    pub scheme: PieceScheme,
    /// Position in the list: 1 for the first piece after the base.
    pub column: u32,
    /// The full checkpoint the list grows from.
    pub base: CheckpointId,
    /// Rows are quantized (Check-N-Run); restores from this piece are approximate.
    #[serde(default)]
    pub quant: Option<QuantBits>,
    /// Largest absolute error of a quantized value in this piece (0 if not quantized).
    #[serde(default)]
    pub quant_max_abs_error: f32,
    /// Local rows per row range of the chunk list (0: a range is a whole table shard).
    #[serde(default)]
    pub range_rows: u64,
    /// Bytes of this server's part of the base.
    pub base_bytes: u64,
    /// Bytes a restore of this state reads beyond the base (this server).
    pub restore_bytes: u64,
    /// Read throughput of the store as this server measured it (0: not measured yet).
    #[serde(default)]
    pub read_bytes_per_s: f64,
    #[serde(default)]
    pub stats: ExtractStats,
    /// Files the chunk records point into.
    #[serde(default)]
    pub files: Vec<FileRef>,
    #[serde(default)]
    pub chunks: Vec<ChunkRecord>,
    /// The list's whole row 0 after this piece (one chunk per range and column): what
    /// restoring this newest state reads, without folding every earlier piece. A decoded
    /// version-2 index lists it in ascending `(table, range, col)` order.
    #[serde(default)]
    pub row0: Vec<ChunkRecord>,
}

impl PieceIndex {
    /// Check that the index agrees with itself; `file` names it in errors.
    pub fn validate(&self, file: &str) -> Result<()> {
        let bad = |reason: String| CkptError::Corrupt {
            file: file.to_string(),
            reason,
        };
        if self.column == 0 {
            return Err(bad("piece column 0 (the base is column 0)".into()));
        }
        if self.scheme != PieceScheme::ChunkList && !self.chunks.is_empty() {
            return Err(bad(format!(
                "a {} piece has chunk records",
                self.scheme.name()
            )));
        }
        if self.quant.is_some() && self.scheme != PieceScheme::Differential {
            return Err(bad("only differential pieces are quantized".into()));
        }
        for (i, c) in self.chunks.iter().enumerate() {
            let ok = match c.op {
                ChunkOp::Column => c.round == 0 && c.col == self.column,
                ChunkOp::Remainder => c.round == 0 && c.col < self.column && c.col >= 1,
                // The extraction round of a column runs after its piece is committed and is
                // committed by the next piece: its records carry the previous column's round.
                ChunkOp::Extracted => {
                    (c.round == self.column || c.round.checked_add(1) == Some(self.column))
                        && c.col < c.round
                        && c.col >= 1
                }
                ChunkOp::Moved => c.round == 0 && c.col < self.column && c.col >= 1,
            };
            if !ok {
                return Err(bad(format!(
                    "chunk record {i}: {:?} of column {} round {} in piece column {}",
                    c.op, c.col, c.round, self.column
                )));
            }
            self.check_parts(c, ("chunk record", i), file)?;
        }
        if self.scheme != PieceScheme::ChunkList && !self.row0.is_empty() {
            return Err(bad(format!(
                "a {} piece has a row-0 list",
                self.scheme.name()
            )));
        }
        for (i, c) in self.row0.iter().enumerate() {
            if c.round != 0 || c.col > self.column || c.col == 0 {
                return Err(bad(format!(
                    "row-0 entry {i}: column {} round {} in piece column {}",
                    c.col, c.round, self.column
                )));
            }
            self.check_parts(c, ("row-0 entry", i), file)?;
        }
        Ok(())
    }

    /// `what`: the record's kind and position, formatted only into an error (an index has
    /// thousands of records, and the happy path formats nothing).
    fn check_parts(&self, c: &ChunkRecord, what: (&str, usize), file: &str) -> Result<()> {
        let what = format_args!("{} {}", what.0, what.1);
        let bad = |reason: String| CkptError::Corrupt {
            file: file.to_string(),
            reason,
        };
        if c.rows > 0 && c.min > c.max {
            return Err(bad(format!("{what}: min {} above max {}", c.min, c.max)));
        }
        let mut n = 0u64;
        for p in &c.parts {
            let f = self.files.get(p.file as usize);
            // Declared offsets and counts are untrusted: every product and sum is checked.
            let end =
                |at: u64, unit: u64| p.rows().checked_mul(unit).and_then(|b| at.checked_add(b));
            let fits = f.is_some_and(|f| {
                p.lo <= p.hi
                    && p.row_bytes > 0
                    && end(p.ids_at, 8).is_some_and(|e| e <= f.size)
                    && end(p.rows_at, p.row_bytes as u64).is_some_and(|e| e <= f.size)
            });
            if !fits {
                return Err(bad(format!("{what}: part {p:?} does not fit its file")));
            }
            n = n
                .checked_add(p.rows())
                .ok_or_else(|| bad(format!("{what}: parts hold more than 2^64 rows")))?;
        }
        if n != c.rows {
            return Err(bad(format!(
                "{what}: parts hold {n} rows, the record says {}",
                c.rows
            )));
        }
        Ok(())
    }

    /// Encode as a version-2 `PIDX` file.
    pub fn encode(&self) -> Result<EncodedFile> {
        let payload = self.encode_payload()?;
        let mut head = Vec::with_capacity(8);
        head.extend_from_slice(&self.server.0.to_le_bytes());
        head.extend_from_slice(&self.column.to_le_bytes());
        let mut b = FrameBuilder::new(FileKind::PieceIndex, &head, payload.len() as u64);
        b.push(&payload);
        Ok(b.finish())
    }

    fn encode_payload(&self) -> Result<Vec<u8>> {
        let mut w = Vec::with_capacity(256 + 48 * (self.chunks.len() + self.row0.len()));
        put_v(&mut w, self.server.0 as u64);
        put_v(&mut w, self.column as u64);
        w.push(scheme_code(self.scheme));
        w.push(self.quant.map_or(0, |q| q.bits() as u8));
        w.extend_from_slice(&self.quant_max_abs_error.to_le_bytes());
        put_s(&mut w, self.base.as_str());
        put_v(&mut w, self.range_rows);
        put_v(&mut w, self.base_bytes);
        put_v(&mut w, self.restore_bytes);
        w.extend_from_slice(&self.read_bytes_per_s.to_le_bytes());
        for x in stats_counters(&self.stats) {
            put_v(&mut w, x);
        }
        w.extend_from_slice(&self.stats.seconds.to_le_bytes());
        let mut ids: Vec<&CheckpointId> = Vec::new();
        let mut id_ix: std::collections::HashMap<&CheckpointId, u64> = Default::default();
        for f in &self.files {
            id_ix.entry(&f.ckpt).or_insert_with(|| {
                ids.push(&f.ckpt);
                (ids.len() - 1) as u64
            });
        }
        put_v(&mut w, ids.len() as u64);
        for id in &ids {
            put_s(&mut w, id.as_str());
        }
        put_v(&mut w, self.files.len() as u64);
        for f in &self.files {
            put_v(&mut w, id_ix[&f.ckpt]);
            put_s(&mut w, &f.path);
            put_v(&mut w, f.size);
            w.extend_from_slice(&f.crc32c.header.to_le_bytes());
            w.extend_from_slice(&f.crc32c.payload.to_le_bytes());
        }
        put_v(&mut w, self.chunks.len() as u64);
        for c in &self.chunks {
            w.push(op_code(c.op));
            for x in [c.table, c.range, c.col, c.round] {
                put_v(&mut w, x as u64);
            }
            put_record(&mut w, c);
        }
        if self.row0.is_empty() {
            w.push(0);
        } else {
            w.push(1);
            let stored = self.row0_to_store()?;
            put_v(&mut w, stored.len() as u64);
            for c in stored {
                for x in [c.table, c.range, c.col] {
                    put_v(&mut w, x as u64);
                }
                put_record(&mut w, c);
            }
        }
        Ok(w)
    }

    /// The row-0 entries no record of this piece gives (what version 2 stores), in ascending
    /// `(table, range, col)` order; refuses a row 0 with two entries of one key or one that
    /// disagrees with those records.
    fn row0_to_store(&self) -> Result<Vec<&ChunkRecord>> {
        let bad = |m: String| CkptError::InvalidArgument(format!("piece index row 0: {m}"));
        let key = |c: &ChunkRecord| (c.table, c.range, c.col);
        let mut sorted: Vec<&ChunkRecord> = self.row0.iter().collect();
        sorted.sort_by_key(|c| key(c));
        if let Some(w) = sorted.windows(2).find(|w| key(w[0]) == key(w[1])) {
            return Err(bad(format!("two entries of {:?}", key(w[1]))));
        }
        if let Some(c) = self
            .row0
            .iter()
            .find(|c| c.op != ChunkOp::Column || c.round != 0)
        {
            return Err(bad(format!("entry {:?} is not a row-0 chunk", key(c))));
        }
        let mut given: std::collections::HashMap<(u32, u32, u32), &ChunkRecord> =
            Default::default();
        for c in self.chunks.iter().filter(|c| gives_row0(c.op)) {
            // The decoder refuses two row-0 chunks of one place: never write such a file.
            if given.insert(key(c), c).is_some() {
                return Err(bad(format!(
                    "two records give the row-0 chunk {:?}",
                    key(c)
                )));
            }
        }
        let mut out = Vec::with_capacity(self.row0.len());
        for c in sorted {
            match given.remove(&key(c)) {
                Some(r) => {
                    if (r.rows, r.min, r.max, &r.parts) != (c.rows, c.min, c.max, &c.parts) {
                        return Err(bad(format!(
                            "entry {:?} differs from this piece's record of it",
                            key(c)
                        )));
                    }
                }
                None => out.push(c),
            }
        }
        if let Some(k) = given.keys().next() {
            return Err(bad(format!("holds no entry {k:?} for this piece's record")));
        }
        Ok(out)
    }

    /// Decode and validate a `PIDX` file named `file` (version 1 or 2); also returns its
    /// checksums.
    pub fn decode(file: &str, data: &[u8]) -> Result<(PieceIndex, FileChecksums)> {
        let frame = parse_frame(file, FileKind::PieceIndex, data)?;
        let mut f = Fields::new(file, frame.header);
        let server = ServerId(f.u32()?);
        let column = f.u32()?;
        let p: PieceIndex = if frame.version == 1 {
            serde_json::from_slice(frame.payload).map_err(|e| CkptError::Corrupt {
                file: file.to_string(),
                reason: format!("piece index JSON: {e}"),
            })?
        } else {
            decode_payload(file, frame.payload)?
        };
        if p.server != server || p.column != column {
            return Err(CkptError::Corrupt {
                file: file.to_string(),
                reason: format!(
                    "header says server {} column {column}, payload server {} column {}",
                    server.0, p.server.0, p.column
                ),
            });
        }
        p.validate(file)?;
        Ok((p, frame.checksums))
    }
}

/// Records of these kinds give their column's row-0 chunk after the piece.
fn gives_row0(op: ChunkOp) -> bool {
    matches!(op, ChunkOp::Column | ChunkOp::Remainder | ChunkOp::Moved)
}

fn scheme_code(s: PieceScheme) -> u8 {
    match s {
        PieceScheme::Incremental => 0,
        PieceScheme::Differential => 1,
        PieceScheme::ChunkList => 2,
    }
}

fn op_code(op: ChunkOp) -> u8 {
    match op {
        ChunkOp::Column => 0,
        ChunkOp::Remainder => 1,
        ChunkOp::Extracted => 2,
        ChunkOp::Moved => 3,
    }
}

fn stats_counters(s: &ExtractStats) -> [u64; 13] {
    [
        s.compared,
        s.range_skips,
        s.bloom_skips,
        s.actual_skips,
        s.extracted,
        s.rows_extracted,
        s.rows_rewritten,
        s.moved,
        s.rows_moved,
        s.files_read,
        s.bytes_read,
        s.files_written,
        s.bytes_written,
    ]
}

fn put_v(w: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        w.push((x as u8) | 0x80);
        x >>= 7;
    }
    w.push(x as u8);
}

fn put_s(w: &mut Vec<u8>, s: &str) {
    put_v(w, s.len() as u64);
    w.extend_from_slice(s.as_bytes());
}

fn put_record(w: &mut Vec<u8>, c: &ChunkRecord) {
    put_v(w, c.min);
    put_v(w, c.max.wrapping_sub(c.min));
    put_v(w, c.parts.len() as u64);
    for p in &c.parts {
        put_v(w, p.file as u64);
        put_v(w, p.section as u64);
        put_v(w, p.lo);
        put_v(w, p.hi.wrapping_sub(p.lo));
        put_v(w, p.ids_at);
        put_v(w, p.rows_at.wrapping_sub(p.ids_at));
        put_v(w, p.row_bytes as u64);
        w.extend_from_slice(&p.crc.to_le_bytes());
    }
}

/// Fewest bytes an encoded part takes (7 one-byte varints and the crc): bounds how many a
/// declared count can be before the bytes run out.
const MIN_PART: usize = 11;
/// Fewest bytes an encoded record takes (op, 4 varints, min, Δ, part count).
const MIN_RECORD: usize = 8;

/// A reader of a version-2 payload; every error is `Corrupt` naming the file.
struct Reader<'a> {
    file: &'a str,
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bad(&self, reason: String) -> CkptError {
        CkptError::Corrupt {
            file: self.file.to_string(),
            reason: format!("piece index at payload byte {}: {reason}", self.at),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.b.len() - self.at < n {
            return Err(self.bad(format!("the payload ends inside {what}")));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4"),
        ))
    }

    fn f32(&mut self, what: &str) -> Result<f32> {
        Ok(f32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4"),
        ))
    }

    fn f64(&mut self, what: &str) -> Result<f64> {
        Ok(f64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8"),
        ))
    }

    fn v(&mut self, what: &str) -> Result<u64> {
        let mut x = 0u64;
        for i in 0..10 {
            let byte = self.u8(what)?;
            let bits = (byte & 0x7f) as u64;
            if i == 9 && bits > 1 {
                return Err(self.bad(format!("{what} overflows 64 bits")));
            }
            x |= bits << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(x);
            }
        }
        Err(self.bad(format!("{what} is a varint longer than 10 bytes")))
    }

    fn v32(&mut self, what: &str) -> Result<u32> {
        let x = self.v(what)?;
        u32::try_from(x).map_err(|_| self.bad(format!("{what} {x} is above 2^32")))
    }

    /// A count of items of at least `min` bytes each, refused if the rest cannot hold them.
    fn count(&mut self, what: &str, min: usize) -> Result<usize> {
        let n = self.v(what)?;
        let left = (self.b.len() - self.at) as u64;
        if n > left / min as u64 {
            return Err(self.bad(format!("{n} {what} in {left} bytes")));
        }
        Ok(n as usize)
    }

    fn s(&mut self, what: &str) -> Result<&'a str> {
        let n = self.count(what, 1)?;
        let b = self.take(n, what)?;
        std::str::from_utf8(b).map_err(|_| self.bad(format!("{what} is not UTF-8")))
    }

    fn id(&mut self, what: &str) -> Result<CheckpointId> {
        let s = self.s(what)?;
        CheckpointId::new(s).map_err(|e| self.bad(format!("{what}: {e}")))
    }

    fn record(&mut self, op: ChunkOp, key: [u32; 4]) -> Result<ChunkRecord> {
        let min = self.v("a record's min")?;
        let max = min.wrapping_add(self.v("a record's max")?);
        let n = self.count("parts", MIN_PART)?;
        let mut parts = Vec::with_capacity(n);
        let mut rows = 0u64;
        for _ in 0..n {
            let file = self.v32("a part's file")?;
            let section = self.v32("a part's section")?;
            let lo = self.v("a part's lo")?;
            let hi = lo.wrapping_add(self.v("a part's rows")?);
            let ids_at = self.v("a part's ids offset")?;
            let rows_at = ids_at.wrapping_add(self.v("a part's rows offset")?);
            let row_bytes = self.v32("a part's row bytes")?;
            let crc = self.u32("a part's crc")?;
            let p = Part {
                file,
                section,
                lo,
                hi,
                ids_at,
                rows_at,
                row_bytes,
                crc,
            };
            rows = rows
                .checked_add(p.rows())
                .ok_or_else(|| self.bad("a record's parts hold more than 2^64 rows".into()))?;
            parts.push(p);
        }
        let [table, range, col, round] = key;
        Ok(ChunkRecord {
            op,
            table,
            range,
            col,
            round,
            rows,
            min,
            max,
            parts,
        })
    }
}

fn decode_payload(file: &str, b: &[u8]) -> Result<PieceIndex> {
    let mut r = Reader { file, b, at: 0 };
    let server = ServerId(r.v32("the server")?);
    let column = r.v32("the column")?;
    let scheme = match r.u8("the scheme")? {
        0 => PieceScheme::Incremental,
        1 => PieceScheme::Differential,
        2 => PieceScheme::ChunkList,
        x => return Err(r.bad(format!("unknown scheme {x}"))),
    };
    let quant = match r.u8("the quantization")? {
        0 => None,
        x => Some(
            QuantBits::from_bits(x as u32)
                .ok_or_else(|| r.bad(format!("quantization to {x} bits")))?,
        ),
    };
    let quant_max_abs_error = r.f32("the quantization error")?;
    let base = r.id("the base")?;
    let range_rows = r.v("range rows")?;
    let base_bytes = r.v("base bytes")?;
    let restore_bytes = r.v("restore bytes")?;
    let read_bytes_per_s = r.f64("the read rate")?;
    let mut c = [0u64; 13];
    for x in &mut c {
        *x = r.v("an extraction counter")?;
    }
    let stats = ExtractStats {
        compared: c[0],
        range_skips: c[1],
        bloom_skips: c[2],
        actual_skips: c[3],
        extracted: c[4],
        rows_extracted: c[5],
        rows_rewritten: c[6],
        moved: c[7],
        rows_moved: c[8],
        files_read: c[9],
        bytes_read: c[10],
        files_written: c[11],
        bytes_written: c[12],
        seconds: r.f64("the extraction time")?,
    };
    let n = r.count("checkpoint ids", 1)?;
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(r.id("a file's checkpoint")?);
    }
    let n = r.count("files", 11)?;
    let mut files = Vec::with_capacity(n);
    for _ in 0..n {
        let i = r.v("a file's checkpoint")?;
        let ckpt = ids
            .get(i as usize)
            .cloned()
            .ok_or_else(|| r.bad(format!("a file names checkpoint {i} of {}", ids.len())))?;
        let path = r.s("a file's path")?.to_string();
        let size = r.v("a file's size")?;
        let header = r.u32("a file's header crc")?;
        let payload = r.u32("a file's payload crc")?;
        files.push(FileRef {
            ckpt,
            path,
            size,
            crc32c: FileChecksums { header, payload },
        });
    }
    let n = r.count("chunk records", MIN_RECORD)?;
    let mut chunks = Vec::with_capacity(n);
    for _ in 0..n {
        let op = match r.u8("a record's op")? {
            0 => ChunkOp::Column,
            1 => ChunkOp::Remainder,
            2 => ChunkOp::Extracted,
            3 => ChunkOp::Moved,
            x => return Err(r.bad(format!("unknown chunk op {x}"))),
        };
        let key = [
            r.v32("a record's table")?,
            r.v32("a record's range")?,
            r.v32("a record's column")?,
            r.v32("a record's round")?,
        ];
        chunks.push(r.record(op, key)?);
    }
    let mut row0 = Vec::new();
    match r.u8("the row-0 flag")? {
        0 => {}
        1 => {
            let n = r.count("row-0 entries", MIN_RECORD - 2)?;
            let given = chunks.iter().filter(|c| gives_row0(c.op)).count();
            row0.reserve(n.saturating_add(given).min(b.len()));
            for _ in 0..n {
                let key = [
                    r.v32("a row-0 entry's table")?,
                    r.v32("a row-0 entry's range")?,
                    r.v32("a row-0 entry's column")?,
                    0,
                ];
                row0.push(r.record(ChunkOp::Column, key)?);
            }
            let key = |c: &ChunkRecord| (c.table, c.range, c.col);
            if let Some(w) = row0.windows(2).find(|w| key(&w[0]) >= key(&w[1])) {
                return Err(r.bad(format!("row-0 entries out of order at {:?}", key(&w[1]))));
            }
            for c in chunks.iter().filter(|c| gives_row0(c.op)) {
                row0.push(ChunkRecord {
                    op: ChunkOp::Column,
                    round: 0,
                    ..c.clone()
                });
            }
            row0.sort_by_key(key);
            if let Some(w) = row0.windows(2).find(|w| key(&w[0]) == key(&w[1])) {
                return Err(r.bad(format!(
                    "two row-0 chunks of (table, range, column) {:?}",
                    key(&w[1])
                )));
            }
        }
        x => return Err(r.bad(format!("row-0 flag {x}"))),
    }
    if r.at != b.len() {
        return Err(r.bad(format!("{} bytes after the last field", b.len() - r.at)));
    }
    Ok(PieceIndex {
        server,
        scheme,
        column,
        base,
        quant,
        quant_max_abs_error,
        range_rows,
        base_bytes,
        restore_bytes,
        read_bytes_per_s,
        stats,
        files,
        chunks,
        row0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> PieceIndex {
        PieceIndex {
            server: ServerId(1),
            scheme: PieceScheme::ChunkList,
            column: 3,
            base: CheckpointId::new("00000000000000000010-full-a0").unwrap(),
            quant: None,
            quant_max_abs_error: 0.0,
            range_rows: 4096,
            base_bytes: 1000,
            restore_bytes: 300,
            read_bytes_per_s: 1.5e9,
            stats: ExtractStats {
                compared: 2,
                extracted: 1,
                ..Default::default()
            },
            files: vec![
                FileRef {
                    ckpt: CheckpointId::new("c3").unwrap(),
                    path: "s0001/t0000-000000.rows".into(),
                    size: 1000,
                    crc32c: FileChecksums {
                        header: 1,
                        payload: 2,
                    },
                },
                FileRef {
                    ckpt: CheckpointId::new("c3").unwrap(),
                    path: "s0001/xrow-000000.bndl".into(),
                    size: 200,
                    crc32c: FileChecksums {
                        header: 3,
                        payload: 4,
                    },
                },
            ],
            row0: vec![],
            chunks: vec![
                ChunkRecord {
                    op: ChunkOp::Column,
                    table: 0,
                    range: 2,
                    col: 3,
                    round: 0,
                    rows: 5,
                    min: 3,
                    max: 40,
                    parts: vec![Part {
                        file: 0,
                        section: 0,
                        lo: 10,
                        hi: 15,
                        ids_at: 64 + 80,
                        rows_at: 64 + 8 * 20 + 10 * 12,
                        row_bytes: 12,
                        crc: 7,
                    }],
                },
                ChunkRecord {
                    op: ChunkOp::Extracted,
                    table: 0,
                    range: 2,
                    col: 1,
                    round: 3,
                    rows: 2,
                    min: 9,
                    max: 11,
                    parts: vec![Part {
                        file: 1,
                        section: 4,
                        lo: 0,
                        hi: 2,
                        ids_at: 100,
                        rows_at: 116,
                        row_bytes: 12,
                        crc: 9,
                    }],
                },
            ],
        }
    }

    /// `p` as a version-1 file (JSON payload), as earlier builds wrote it.
    fn encode_v1(p: &PieceIndex) -> Vec<u8> {
        let json = serde_json::to_vec(p).unwrap();
        let mut head = Vec::new();
        head.extend_from_slice(&p.server.0.to_le_bytes());
        head.extend_from_slice(&p.column.to_le_bytes());
        let mut b = FrameBuilder::new(FileKind::PieceIndex, &head, json.len() as u64);
        b.push(&json);
        let mut d = b.finish().bytes.to_vec();
        // Version 1 in the prefix, the header checksum recomputed.
        d[8..10].copy_from_slice(&1u16.to_le_bytes());
        let h = u32::from_le_bytes(d[12..16].try_into().unwrap()) as usize;
        let crc = crc32c::crc32c(&d[..16 + h]);
        d[16 + h..20 + h].copy_from_slice(&crc.to_le_bytes());
        d
    }

    /// A piece whose row 0 is what folding it gives: its column and remainder, and an older
    /// column's chunk no record touches.
    fn with_row0() -> PieceIndex {
        let mut p = sample();
        let mut rem = p.chunks[0].clone();
        rem.op = ChunkOp::Remainder;
        rem.col = 2;
        rem.min = 41;
        rem.max = 50;
        p.chunks.push(rem.clone());
        let mut old = p.chunks[0].clone();
        old.col = 1;
        old.range = 0;
        old.parts[0].crc = 99;
        let row0 = |c: &ChunkRecord| ChunkRecord {
            op: ChunkOp::Column,
            ..c.clone()
        };
        p.row0 = vec![row0(&old), row0(&rem), row0(&p.chunks[0])];
        p
    }

    /// An extracted record whose round is the largest `u32` (a damaged or edited index) is
    /// refused as corrupt, not an overflow.
    #[test]
    fn an_extracted_record_of_the_last_round_is_refused_not_overflowed() {
        let mut p = sample();
        p.chunks[0].op = ChunkOp::Extracted;
        p.chunks[0].round = u32::MAX;
        p.chunks[0].col = 1;
        let e = p.validate("s1/piece.pidx").unwrap_err();
        assert!(matches!(e, CkptError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("chunk record 0"), "{e}");
    }

    #[test]
    fn round_trip() {
        for p in [sample(), with_row0()] {
            let f = p.encode().unwrap();
            assert_eq!(&f.bytes[8..10], &2u16.to_le_bytes());
            let (back, crc) = PieceIndex::decode("PIDX", &f.bytes).unwrap();
            assert_eq!(back, p);
            assert_eq!(crc, f.checksums);
        }
        // Extreme values round-trip too (varints of 10 bytes, wrapping differences).
        let mut p = sample();
        p.chunks[0].min = u64::MAX;
        p.chunks[0].max = 0;
        p.chunks[0].rows = 0;
        p.chunks[0].parts.clear();
        p.base_bytes = u64::MAX;
        p.stats.bytes_read = u64::MAX - 1;
        p.quant_max_abs_error = 0.25;
        let (back, _) = PieceIndex::decode("PIDX", &p.encode().unwrap().bytes).unwrap();
        assert_eq!(back, p);
    }

    /// Row-0 entries a record of the same piece gives are not stored twice.
    #[test]
    fn row0_entries_given_by_records_are_stored_once() {
        let p = with_row0();
        let full = p.encode().unwrap().size();
        let bare = {
            let mut r = p.clone();
            r.row0.clear();
            r.encode().unwrap().size()
        };
        // Only the older column's entry (and the flag and count) costs bytes.
        assert!(full - bare < 40, "row 0 added {} bytes", full - bare);
        // A row 0 that disagrees with the piece's records, or is out of order, is refused.
        let mut bad = p.clone();
        bad.row0[2].parts[0].crc ^= 1;
        let e = bad.encode().unwrap_err();
        assert!(e.to_string().contains("differs"), "{e}");
        let mut bad = p.clone();
        bad.row0.push(bad.row0[0].clone());
        assert!(bad.encode().is_err());
        // Any order in memory; ascending on disk.
        let mut q = p.clone();
        q.row0.swap(0, 2);
        let (back, _) = PieceIndex::decode("PIDX", &q.encode().unwrap().bytes).unwrap();
        assert_eq!(back, p);
        let mut bad = p;
        bad.row0.remove(1);
        assert!(bad.encode().is_err());
    }

    /// Version-1 files (JSON) are still read, with the same meaning.
    #[test]
    fn version_1_is_read() {
        for p in [sample(), with_row0()] {
            let v1 = encode_v1(&p);
            let (back, _) = PieceIndex::decode("s1/piece.pidx", &v1).unwrap();
            assert_eq!(back, p);
            assert!(
                p.encode().unwrap().size() < v1.len() as u64 / 2,
                "version 2 is less than half of version 1"
            );
        }
        // A version this build does not know is refused, naming the file.
        let mut d = sample().encode().unwrap().bytes.to_vec();
        d[8..10].copy_from_slice(&3u16.to_le_bytes());
        let h = u32::from_le_bytes(d[12..16].try_into().unwrap()) as usize;
        let crc = crc32c::crc32c(&d[..16 + h]);
        d[16 + h..20 + h].copy_from_slice(&crc.to_le_bytes());
        let e = PieceIndex::decode("s1/piece.pidx", &d).unwrap_err();
        assert!(
            matches!(e, CkptError::UnsupportedVersion { found: 3, .. }),
            "{e}"
        );
        assert_eq!(e.file(), Some("s1/piece.pidx"));
    }

    /// A payload re-sealed with correct checksums but damaged inside is refused by the
    /// decoder itself, naming the file: every truncation and every one-byte change.
    #[test]
    fn damaged_payloads_behind_good_checksums_are_errors_naming_the_file() {
        let p = with_row0();
        let payload = p.encode_payload().unwrap();
        let seal = |pl: &[u8]| {
            let mut head = Vec::new();
            head.extend_from_slice(&p.server.0.to_le_bytes());
            head.extend_from_slice(&p.column.to_le_bytes());
            let mut b = FrameBuilder::new(FileKind::PieceIndex, &head, pl.len() as u64);
            b.push(pl);
            b.finish().bytes.to_vec()
        };
        for len in 0..payload.len() {
            let e = PieceIndex::decode("s1/piece.pidx", &seal(&payload[..len])).unwrap_err();
            assert_eq!(e.file(), Some("s1/piece.pidx"), "len {len}: {e}");
        }
        let mut extra = payload.clone();
        extra.push(0);
        assert!(PieceIndex::decode("s1/piece.pidx", &seal(&extra)).is_err());
        for i in 0..payload.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut d = payload.clone();
                d[i] ^= x;
                // Either another valid index or an error naming the file, never a panic.
                if let Err(e) = PieceIndex::decode("s1/piece.pidx", &seal(&d)) {
                    assert_eq!(e.file(), Some("s1/piece.pidx"), "byte {i}: {e}");
                }
            }
        }
    }

    #[test]
    fn inconsistent_records_are_refused() {
        let mut p = sample();
        p.chunks[0].rows = 6;
        assert!(matches!(p.validate("i"), Err(CkptError::Corrupt { .. })));
        // An extracted record carries this piece's round or the previous column's (a round
        // run in the background is committed by the next piece), and comes from an older
        // column than its round.
        for round in [1, 4, 0] {
            let mut p = sample();
            p.chunks[1].round = round;
            assert!(
                matches!(p.validate("i"), Err(CkptError::Corrupt { .. })),
                "round {round}"
            );
        }
        let mut p = sample();
        p.chunks[1].round = 2;
        p.validate("i").unwrap();
        p.chunks[1].col = 2;
        assert!(matches!(p.validate("i"), Err(CkptError::Corrupt { .. })));
        let mut p = sample();
        p.chunks[1].parts[0].file = 9;
        assert!(matches!(p.validate("i"), Err(CkptError::Corrupt { .. })));
        // A part beyond its file's end.
        let mut p = sample();
        p.chunks[1].parts[0].rows_at = 190;
        assert!(matches!(p.validate("i"), Err(CkptError::Corrupt { .. })));
        let mut p = sample();
        p.row0 = vec![p.chunks[1].clone()];
        assert!(matches!(p.validate("i"), Err(CkptError::Corrupt { .. })));
        let mut p = sample();
        p.scheme = PieceScheme::Incremental;
        assert!(matches!(p.validate("i"), Err(CkptError::Corrupt { .. })));
        // A decoded file must agree with its header.
        let mut p = sample();
        p.column = 4;
        let payload = p.encode_payload().unwrap();
        let mut b = FrameBuilder::new(
            FileKind::PieceIndex,
            &[1, 0, 0, 0, 3, 0, 0, 0],
            payload.len() as u64,
        );
        b.push(&payload);
        let d = b.finish().bytes.to_vec();
        let e = PieceIndex::decode("s1/piece.pidx", &d).unwrap_err();
        assert_eq!(e.file(), Some("s1/piece.pidx"));
        assert!(e.to_string().contains("header says"), "{e}");
    }

    #[test]
    fn flip_any_byte_or_truncate_is_an_error_naming_the_file() {
        let f = with_row0().encode().unwrap();
        for i in 0..f.bytes.len() {
            let mut d = f.bytes.to_vec();
            d[i] ^= 0x08;
            let err = PieceIndex::decode("s1/piece.pidx", &d).unwrap_err();
            assert_eq!(err.file(), Some("s1/piece.pidx"), "byte {i}: {err}");
        }
        for len in 0..f.bytes.len() {
            let err = PieceIndex::decode("s1/piece.pidx", &f.bytes[..len]).unwrap_err();
            assert_eq!(err.file(), Some("s1/piece.pidx"), "len {len}: {err}");
        }
    }
}
