//! The 2-D chunk list of one server (IncrCP §4.2, Figs. 5 and 6), in memory.
//!
//! One list per row range (a table shard, or `range_rows` local rows of it): columns are
//! checkpoints (1 for the first piece after the base), rows are extraction rounds. Row 0 holds,
//! per column, the rows saved in that column that no later column has saved again (as far as
//! extraction has found); a deeper row holds the rows an extraction round took out of row-0
//! chunks because the round's column saved them again. Row `d` at list length `L` is the round
//! `L - d + 1`: the paper pushes rows down on every insertion, here each extracted chunk keeps
//! the round that made it, which is the same thing without rewriting anything.
//!
//! Restoring column `i` reads the rectangle of row-0 chunks of columns `<= i` and extracted
//! chunks of columns `<= i` whose round is `> i` (superseded only after `i`); nothing else. A row
//! may still appear in several chunks of the rectangle when selective extraction skipped a
//! comparison (IncrCP §4.3); the copy of the newest column wins, which [`crate::incr`]'s restore
//! enforces by column, never by reading order (the public implementation merges chunks in no
//! fixed order and can restore a stale row).
//!
//! The list is only ever changed by folding a [`PieceIndex`]'s records ([`ChunkList::apply`]):
//! an extraction round computes its records and applies them, and a restore folds the records
//! of every piece of the chain, so both build exactly the same list. Files are counted: a file
//! whose chunks were all split or dropped has no live part left and can be deleted (IncrCP
//! §4.4's bundle counters).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ftrec_core::{RowId, ServerId, ShardMap, TableId};

use super::bloom::Bloom;
use crate::error::{CkptError, Result};
use crate::format::{CheckpointId, ChunkOp, ChunkRecord, FileRef, Part, PieceIndex};

/// A part of a chunk: a [`Part`] whose file is an index into the list's own file table.
pub type LivePart = Part;

/// Records index the piece's file table: refuse one that points past it before following it
/// (a decoded piece index was validated; this guards any other).
fn check_file_refs(piece: &PieceIndex, file: &str) -> Result<()> {
    let n = piece.files.len();
    for c in piece.chunks.iter().chain(&piece.row0) {
        if let Some(p) = c.parts.iter().find(|p| p.file as usize >= n) {
            return Err(CkptError::Corrupt {
                file: file.to_string(),
                reason: format!("a chunk part names file {} of {n}", p.file),
            });
        }
    }
    Ok(())
}

/// One chunk of the list.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub table: u32,
    pub range: u32,
    pub col: u32,
    /// 0 in row 0; the round that extracted it otherwise.
    pub round: u32,
    pub rows: u64,
    pub min: RowId,
    pub max: RowId,
    pub parts: Vec<LivePart>,
    /// Row-0 chunks only, once built (by the round that wrote the chunk, or by a restore that
    /// read it).
    pub bloom: Option<Bloom>,
}

/// A file the list points into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListFile {
    pub file: FileRef,
    /// Parts of live chunks in it (IncrCP §4.4's counter); 0: the file can go.
    pub live: u32,
    /// Bytes of those parts.
    pub live_bytes: u64,
}

#[derive(Debug, Clone, Default)]
struct RangeList {
    row0: BTreeMap<u32, Chunk>,
    deeper: Vec<Chunk>,
}

/// The 2-D chunk lists of every row range of one server, grown from one base.
#[derive(Debug, Clone)]
pub struct ChunkList {
    base: CheckpointId,
    server: ServerId,
    map: ShardMap,
    range_rows: u64,
    /// `columns[k - 1]` is the checkpoint of column `k`.
    columns: Vec<CheckpointId>,
    files: Vec<ListFile>,
    file_ix: HashMap<(CheckpointId, String), u32>,
    ranges: BTreeMap<(u32, u32), RangeList>,
}

impl ChunkList {
    /// An empty list over `base` for `server`'s shard under `map`.
    pub fn new(base: CheckpointId, server: ServerId, map: ShardMap, range_rows: u64) -> Self {
        ChunkList {
            base,
            server,
            map,
            range_rows,
            columns: Vec::new(),
            files: Vec::new(),
            file_ix: HashMap::new(),
            ranges: BTreeMap::new(),
        }
    }

    pub fn base(&self) -> &CheckpointId {
        &self.base
    }

    pub fn server(&self) -> ServerId {
        self.server
    }

    pub fn range_rows(&self) -> u64 {
        self.range_rows
    }

    /// Columns so far (the list's length `L`).
    pub fn len(&self) -> u32 {
        self.columns.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// The checkpoint of column `col` (1-based).
    pub fn column_id(&self, col: u32) -> Option<&CheckpointId> {
        self.columns.get(col.checked_sub(1)? as usize)
    }

    /// The row range of global row `row` of `table` on this server.
    pub fn range_of(&self, table: TableId, row: RowId) -> u32 {
        self.map
            .local_index(table, row)
            .checked_div(self.range_rows)
            .unwrap_or(0) as u32
    }

    pub fn files(&self) -> &[ListFile] {
        &self.files
    }

    pub fn file(&self, ix: u32) -> &ListFile {
        &self.files[ix as usize]
    }

    /// Files no live chunk points into any more.
    pub fn dead_files(&self) -> impl Iterator<Item = &FileRef> {
        self.files.iter().filter(|f| f.live == 0).map(|f| &f.file)
    }

    fn intern(&mut self, f: &FileRef) -> u32 {
        let key = (f.ckpt.clone(), f.path.clone());
        if let Some(&i) = self.file_ix.get(&key) {
            return i;
        }
        let i = self.files.len() as u32;
        self.files.push(ListFile {
            file: f.clone(),
            live: 0,
            live_bytes: 0,
        });
        self.file_ix.insert(key, i);
        i
    }

    /// Index of `f` if the list knows it.
    pub fn file_index(&self, ckpt: &CheckpointId, path: &str) -> Option<u32> {
        self.file_ix.get(&(ckpt.clone(), path.to_string())).copied()
    }

    /// The row-0 chunks of a range, by column.
    pub fn row0(&self, table: u32, range: u32) -> impl Iterator<Item = &Chunk> {
        self.ranges
            .get(&(table, range))
            .into_iter()
            .flat_map(|r| r.row0.values())
    }

    /// Every range with chunks.
    pub fn ranges(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.ranges.keys().copied()
    }

    /// Set the Bloom filter of the row-0 chunk of `col` in a range.
    pub fn set_bloom(&mut self, table: u32, range: u32, col: u32, bloom: Bloom) {
        if let Some(c) = self
            .ranges
            .get_mut(&(table, range))
            .and_then(|r| r.row0.get_mut(&col))
        {
            c.bloom = Some(bloom);
        }
    }

    /// Every chunk, row 0 and deeper.
    pub fn chunks(&self) -> impl Iterator<Item = &Chunk> {
        self.ranges
            .values()
            .flat_map(|r| r.row0.values().chain(r.deeper.iter()))
    }

    /// The chunks restoring column `col` reads (IncrCP §4.2: the rectangle of width `col` and
    /// depth `L - col + 1`), in no particular order.
    pub fn rectangle(&self, col: u32) -> Vec<&Chunk> {
        let mut out = Vec::new();
        for r in self.ranges.values() {
            out.extend(r.row0.values().filter(|c| c.col <= col));
            out.extend(r.deeper.iter().filter(|c| c.col <= col && c.round > col));
        }
        out
    }

    /// Bytes restoring column `col` reads (the parts of its rectangle).
    pub fn rectangle_bytes(&self, col: u32) -> u64 {
        self.rectangle(col)
            .iter()
            .flat_map(|c| c.parts.iter())
            .fold(0u64, |a, p| a.saturating_add(p.bytes()))
    }

    /// Every row-0 chunk.
    pub fn row0_chunks(&self) -> impl Iterator<Item = &Chunk> {
        self.ranges.values().flat_map(|r| r.row0.values())
    }

    /// Chunks in row 0, deeper rows, and files (live, all).
    pub fn shape(&self) -> (usize, usize, usize, usize) {
        let row0 = self.ranges.values().map(|r| r.row0.len()).sum();
        let deeper = self.ranges.values().map(|r| r.deeper.len()).sum();
        let live = self.files.iter().filter(|f| f.live > 0).count();
        (row0, deeper, live, self.files.len())
    }

    fn chunk_of(&mut self, r: &ChunkRecord, map: &[u32]) -> Chunk {
        let parts: Vec<LivePart> = r
            .parts
            .iter()
            .map(|p| Part {
                file: map[p.file as usize],
                ..*p
            })
            .collect();
        for p in &parts {
            let f = &mut self.files[p.file as usize];
            f.live = f.live.saturating_add(1);
            f.live_bytes = f.live_bytes.saturating_add(p.bytes());
        }
        Chunk {
            table: r.table,
            range: r.range,
            col: r.col,
            round: r.round,
            rows: r.rows,
            min: r.min,
            max: r.max,
            parts,
            bloom: None,
        }
    }

    fn release(&mut self, c: &Chunk) {
        for p in &c.parts {
            let f = &mut self.files[p.file as usize];
            f.live = f.live.saturating_sub(1);
            f.live_bytes = f.live_bytes.saturating_sub(p.bytes());
        }
    }

    /// A list holding row 0 only, as `piece`'s snapshot gives it (restoring and continuing the
    /// newest state needs nothing deeper): the piece of checkpoint `columns[len - 1]`.
    pub fn from_row0(
        base: CheckpointId,
        server: ServerId,
        map: ShardMap,
        columns: Vec<CheckpointId>,
        piece: &PieceIndex,
        file: &str,
    ) -> Result<ChunkList> {
        check_file_refs(piece, file)?;
        let mut l = ChunkList::new(base, server, map, piece.range_rows);
        if columns.len() as u32 != piece.column {
            return Err(CkptError::Corrupt {
                file: file.to_string(),
                reason: format!(
                    "piece of column {} at the end of a chain of {} pieces",
                    piece.column,
                    columns.len()
                ),
            });
        }
        let fmap: Vec<u32> = piece.files.iter().map(|f| l.intern(f)).collect();
        for r in &piece.row0 {
            let c = l.chunk_of(r, &fmap);
            if l.ranges
                .entry((r.table, r.range))
                .or_default()
                .row0
                .insert(r.col, c)
                .is_some()
            {
                return Err(CkptError::Corrupt {
                    file: file.to_string(),
                    reason: format!(
                        "two row-0 chunks of column {} in range {}/{}",
                        r.col, r.table, r.range
                    ),
                });
            }
        }
        l.columns = columns;
        Ok(l)
    }

    /// Fold the records of `piece` (the piece of checkpoint `ckpt`, this list's next column):
    /// register its column, then split the chunks its extraction round split. `file` names the
    /// piece index in errors.
    pub fn apply(&mut self, ckpt: &CheckpointId, piece: &PieceIndex, file: &str) -> Result<()> {
        let bad = |reason: String| CkptError::Corrupt {
            file: file.to_string(),
            reason,
        };
        check_file_refs(piece, file)?;
        let col = self.len() + 1;
        if piece.column != col {
            return Err(bad(format!(
                "piece of column {} applied to a list of {} columns",
                piece.column,
                self.len()
            )));
        }
        if piece.server != self.server || piece.base != self.base {
            return Err(bad(format!(
                "piece of server {} over base {} applied to server {}'s list over {}",
                piece.server.0, piece.base, self.server.0, self.base
            )));
        }
        if piece.range_rows != self.range_rows {
            return Err(bad(format!(
                "piece cut in ranges of {} rows, the list in ranges of {}",
                piece.range_rows, self.range_rows
            )));
        }
        let map: Vec<u32> = piece.files.iter().map(|f| self.intern(f)).collect();
        // Splits first: an extracted record replaces the column's row-0 chunk, and its
        // remainder (if any) becomes the new one.
        let mut split: BTreeSet<(u32, u32, u32)> = BTreeSet::new();
        for r in piece.chunks.iter().filter(|r| r.op == ChunkOp::Extracted) {
            let key = (r.table, r.range, r.col);
            if !split.insert(key) {
                return Err(bad(format!(
                    "column {} of range {}/{} extracted twice in one round",
                    r.col, r.table, r.range
                )));
            }
            let old = self.take_row0(r).ok_or_else(|| {
                bad(format!(
                    "extraction from column {} of range {}/{}, which has no row-0 chunk",
                    r.col, r.table, r.range
                ))
            })?;
            self.release(&old);
            let c = self.chunk_of(r, &map);
            self.ranges
                .entry((r.table, r.range))
                .or_default()
                .deeper
                .push(c);
        }
        // Compaction: the same rows, elsewhere.
        for r in piece.chunks.iter().filter(|r| r.op == ChunkOp::Moved) {
            if split.contains(&(r.table, r.range, r.col)) {
                return Err(bad(format!(
                    "column {} of range {}/{} both split and moved in one round",
                    r.col, r.table, r.range
                )));
            }
            let old = self.take_row0(r).ok_or_else(|| {
                bad(format!(
                    "move of column {} of range {}/{}, which has no row-0 chunk",
                    r.col, r.table, r.range
                ))
            })?;
            if old.rows != r.rows {
                return Err(bad(format!(
                    "move of column {} of range {}/{}: {} rows, the chunk has {}",
                    r.col, r.table, r.range, r.rows, old.rows
                )));
            }
            self.release(&old);
            let mut c = self.chunk_of(r, &map);
            c.bloom = old.bloom;
            self.ranges
                .entry((r.table, r.range))
                .or_default()
                .row0
                .insert(r.col, c);
        }
        for r in piece
            .chunks
            .iter()
            .filter(|r| matches!(r.op, ChunkOp::Column | ChunkOp::Remainder))
        {
            if r.op == ChunkOp::Remainder && !split.contains(&(r.table, r.range, r.col)) {
                return Err(bad(format!(
                    "remainder of column {} of range {}/{} without an extraction",
                    r.col, r.table, r.range
                )));
            }
            let c = self.chunk_of(r, &map);
            let prev = self
                .ranges
                .entry((r.table, r.range))
                .or_default()
                .row0
                .insert(r.col, c);
            if prev.is_some() {
                return Err(bad(format!(
                    "two row-0 chunks of column {} in range {}/{}",
                    r.col, r.table, r.range
                )));
            }
        }
        self.columns.push(ckpt.clone());
        Ok(())
    }

    /// Add an extracted chunk as a piece index records it (`files`: that index's file table;
    /// `fmap`: where each of its files is in this list, filled as needed), without the rest of
    /// its round: for a list built from a newest row 0 ([`ChunkList::from_row0`]) that an older
    /// state's restore completes with the extracted chunks its rectangle reads. `file` names
    /// the index in errors.
    pub fn add_extracted(
        &mut self,
        r: &ChunkRecord,
        files: &[FileRef],
        fmap: &mut [Option<u32>],
        file: &str,
    ) -> Result<()> {
        if r.op != ChunkOp::Extracted || r.round == 0 {
            return Err(CkptError::Corrupt {
                file: file.to_string(),
                reason: format!("{:?} record of column {} added as extracted", r.op, r.col),
            });
        }
        let mut parts = Vec::with_capacity(r.parts.len());
        for p in &r.parts {
            let f = p.file as usize;
            let (Some(slot), Some(fr)) = (fmap.get_mut(f), files.get(f)) else {
                return Err(CkptError::Corrupt {
                    file: file.to_string(),
                    reason: format!("a chunk part names file {f} of {}", files.len()),
                });
            };
            let ix = match *slot {
                Some(ix) => ix,
                None => {
                    let ix = self.intern(fr);
                    *slot = Some(ix);
                    ix
                }
            };
            parts.push(Part { file: ix, ..*p });
        }
        for p in &parts {
            let f = &mut self.files[p.file as usize];
            f.live = f.live.saturating_add(1);
            f.live_bytes = f.live_bytes.saturating_add(p.bytes());
        }
        self.ranges
            .entry((r.table, r.range))
            .or_default()
            .deeper
            .push(Chunk {
                table: r.table,
                range: r.range,
                col: r.col,
                round: r.round,
                rows: r.rows,
                min: r.min,
                max: r.max,
                parts,
                bloom: None,
            });
        Ok(())
    }

    fn take_row0(&mut self, r: &ChunkRecord) -> Option<Chunk> {
        self.ranges
            .get_mut(&(r.table, r.range))
            .and_then(|l| l.row0.remove(&r.col))
    }

    /// Records as a [`PieceIndex`] stores them: `parts` of list files become parts of the
    /// piece's own file table `files` (extended as needed).
    pub fn record(
        &self,
        op: ChunkOp,
        c: &Chunk,
        files: &mut Vec<FileRef>,
        local: &mut HashMap<u32, u32>,
    ) -> ChunkRecord {
        let parts = c
            .parts
            .iter()
            .map(|p| {
                let f = *local.entry(p.file).or_insert_with(|| {
                    files.push(self.files[p.file as usize].file.clone());
                    (files.len() - 1) as u32
                });
                Part { file: f, ..*p }
            })
            .collect();
        ChunkRecord {
            op,
            table: c.table,
            range: c.range,
            col: c.col,
            round: c.round,
            rows: c.rows,
            min: c.min,
            max: c.max,
            parts,
        }
    }

    /// Intern a file (for records built before the piece is applied).
    pub fn add_file(&mut self, f: &FileRef) -> u32 {
        self.intern(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::PieceScheme;

    fn id(s: &str) -> CheckpointId {
        CheckpointId::new(s).unwrap()
    }

    fn fref(ck: &str, path: &str) -> FileRef {
        FileRef {
            ckpt: id(ck),
            path: path.into(),
            size: 100,
            crc32c: crate::format::FileChecksums {
                header: 0,
                payload: 0,
            },
        }
    }

    fn rec(op: ChunkOp, col: u32, round: u32, rows: u64, file: u32) -> ChunkRecord {
        ChunkRecord {
            op,
            table: 0,
            range: 0,
            col,
            round,
            rows,
            min: 0,
            max: 10,
            parts: vec![Part {
                file,
                section: 0,
                lo: 0,
                hi: rows,
                ids_at: 0,
                rows_at: 8 * rows,
                row_bytes: 4,
                crc: 0,
            }],
        }
    }

    fn piece(col: u32, files: Vec<FileRef>, chunks: Vec<ChunkRecord>) -> PieceIndex {
        PieceIndex {
            server: ServerId(0),
            scheme: PieceScheme::ChunkList,
            column: col,
            base: id("base"),
            quant: None,
            quant_max_abs_error: 0.0,
            range_rows: 0,
            base_bytes: 0,
            restore_bytes: 0,
            read_bytes_per_s: 0.0,
            stats: Default::default(),
            files,
            chunks,
            row0: vec![],
        }
    }

    /// IncrCP Fig. 5: interval 1 duplicates part of interval 0's chunk, which is extracted
    /// into row 1; restoring the newest reads row 0 only, the older column reads the rectangle.
    #[test]
    fn fig5_rectangles_and_counters() {
        let mut l = ChunkList::new(id("base"), ServerId(0), ShardMap::new(1).unwrap(), 0);
        l.apply(
            &id("c1"),
            &piece(
                1,
                vec![fref("c1", "t")],
                vec![rec(ChunkOp::Column, 1, 0, 5, 0)],
            ),
            "p1",
        )
        .unwrap();
        assert_eq!(l.rectangle(1).len(), 1);
        // Column 2 saves 2 of column 1's rows again: split into remainder 3 + extracted 2.
        l.apply(
            &id("c2"),
            &piece(
                2,
                vec![fref("c2", "t"), fref("c2", "row0"), fref("c2", "xrow")],
                vec![
                    rec(ChunkOp::Column, 2, 0, 4, 0),
                    rec(ChunkOp::Remainder, 1, 0, 3, 1),
                    rec(ChunkOp::Extracted, 1, 2, 2, 2),
                ],
            ),
            "p2",
        )
        .unwrap();
        // Column 1's piece file has no live part any more.
        let dead: Vec<_> = l.dead_files().map(|f| f.path.clone()).collect();
        assert_eq!(dead, vec!["t".to_string()]);
        assert_eq!(l.file(l.file_index(&id("c1"), "t").unwrap()).live, 0);
        // Newest: row 0 only (remainder of 1 and column 2).
        let r2: Vec<(u32, u32)> = l.rectangle(2).iter().map(|c| (c.col, c.round)).collect();
        assert_eq!(r2.len(), 2);
        assert!(r2.contains(&(1, 0)) && r2.contains(&(2, 0)));
        // Column 1: its remainder and the extracted rows, not column 2.
        let r1: Vec<(u32, u32)> = l.rectangle(1).iter().map(|c| (c.col, c.round)).collect();
        assert_eq!(r1.len(), 2);
        assert!(r1.contains(&(1, 0)) && r1.contains(&(1, 2)));
        assert_eq!(l.shape(), (2, 1, 3, 4));
    }

    #[test]
    fn inconsistent_records_are_errors_naming_the_piece() {
        let mut l = ChunkList::new(id("base"), ServerId(0), ShardMap::new(1).unwrap(), 0);
        let e = l
            .apply(
                &id("c1"),
                &piece(2, vec![fref("c1", "t")], vec![]),
                "s0000/piece.pidx",
            )
            .unwrap_err();
        assert_eq!(e.file(), Some("s0000/piece.pidx"));
        // An extraction from a chunk that does not exist.
        let e = l
            .apply(
                &id("c1"),
                &piece(
                    1,
                    vec![fref("c1", "x")],
                    vec![rec(ChunkOp::Extracted, 1, 1, 1, 0)],
                ),
                "p",
            )
            .unwrap_err();
        assert!(e.to_string().contains("no row-0 chunk"), "{e}");
    }
}
