//! Piece indexes (`PIDX`, version 1): what one server's part of an incremental checkpoint is.
//!
//! Every incremental piece (naive incremental, Check-N-Run differential, IncrCP chunk list; see
//! `crate::incr`) carries one per server. It names the scheme, the base full checkpoint the
//! piece's list grows from and the piece's column in that list (1 for the first piece after the
//! base), and, for the chunk list, the *records* of the 2-D list this checkpoint adds (IncrCP
//! §4.2): the new column's chunks (one per row range it touched) and the chunks the extraction
//! round against this column split (each old chunk's remainder and the part extracted to the new
//! row). Folding the records of a chain of pieces, oldest first, gives the whole 2-D list.
//!
//! Header body (after the payload length), 8 bytes: `server u32 | column u32`, repeated in the
//! payload and checked against it. Payload: the [`PieceIndex`] as JSON; chunk records are
//! arrays rather than objects to keep a long list small.

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
    /// restoring this newest state reads, without folding every earlier piece.
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
                ChunkOp::Extracted => c.round == self.column && c.col < self.column && c.col >= 1,
                ChunkOp::Moved => c.round == 0 && c.col < self.column && c.col >= 1,
            };
            if !ok {
                return Err(bad(format!(
                    "chunk record {i}: {:?} of column {} round {} in piece column {}",
                    c.op, c.col, c.round, self.column
                )));
            }
            self.check_parts(c, &format!("chunk record {i}"), file)?;
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
            self.check_parts(c, &format!("row-0 entry {i}"), file)?;
        }
        Ok(())
    }

    fn check_parts(&self, c: &ChunkRecord, what: &str, file: &str) -> Result<()> {
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

    pub fn encode(&self) -> Result<EncodedFile> {
        let json = serde_json::to_vec(self).map_err(|e| {
            CkptError::InvalidArgument(format!("piece index does not serialize: {e}"))
        })?;
        let mut head = Vec::with_capacity(8);
        head.extend_from_slice(&self.server.0.to_le_bytes());
        head.extend_from_slice(&self.column.to_le_bytes());
        let mut b = FrameBuilder::new(FileKind::PieceIndex, &head, json.len() as u64);
        b.push(&json);
        Ok(b.finish())
    }

    /// Decode and validate a `PIDX` file named `file`; also returns its checksums.
    pub fn decode(file: &str, data: &[u8]) -> Result<(PieceIndex, FileChecksums)> {
        let frame = parse_frame(file, FileKind::PieceIndex, data)?;
        let mut f = Fields::new(file, frame.header);
        let server = ServerId(f.u32()?);
        let column = f.u32()?;
        let p: PieceIndex =
            serde_json::from_slice(frame.payload).map_err(|e| CkptError::Corrupt {
                file: file.to_string(),
                reason: format!("piece index JSON: {e}"),
            })?;
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

    #[test]
    fn round_trip() {
        let p = sample();
        let f = p.encode().unwrap();
        let (back, crc) = PieceIndex::decode("PIDX", &f.bytes).unwrap();
        assert_eq!(back, p);
        assert_eq!(crc, f.checksums);
        let json = String::from_utf8_lossy(&f.bytes);
        assert!(
            json.contains("[0,0,2,3,0,5,3,40,[[0,0,10,15,144,344,12,7]]]"),
            "{json}"
        );
        let mut p = sample();
        p.row0 = vec![p.chunks[0].clone()];
        let (back, _) = PieceIndex::decode("PIDX", &p.encode().unwrap().bytes).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn inconsistent_records_are_refused() {
        let mut p = sample();
        p.chunks[0].rows = 6;
        assert!(matches!(p.validate("i"), Err(CkptError::Corrupt { .. })));
        let mut p = sample();
        p.chunks[1].round = 2;
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
        let f = p.encode().unwrap();
        p.column = 4;
        let mut d = f.bytes.to_vec();
        let json = serde_json::to_vec(&p).unwrap();
        assert_ne!(d.len(), 0);
        let mut b = FrameBuilder::new(
            FileKind::PieceIndex,
            &[1, 0, 0, 0, 3, 0, 0, 0],
            json.len() as u64,
        );
        b.push(&json);
        d = b.finish().bytes.to_vec();
        let e = PieceIndex::decode("s1/piece.pidx", &d).unwrap_err();
        assert_eq!(e.file(), Some("s1/piece.pidx"));
    }

    #[test]
    fn flip_any_byte_or_truncate_is_an_error_naming_the_file() {
        let f = sample().encode().unwrap();
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
