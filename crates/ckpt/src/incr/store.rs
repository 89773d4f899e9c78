//! Store-wide operations on incremental checkpoints: verification, garbage collection, a
//! restore written out as one full checkpoint, and the piece summaries a coordinator reads
//! after a commit.
//!
//! A chunk-list store differs from every other in one way: extraction moves rows out of older
//! files, and a file no live chunk points into any more (IncrCP §4.4: its counter reached 0) is
//! deleted by [`gc`] although the manifest that committed it still lists it. [`verify`] knows:
//! such a file may be missing; any other missing or damaged file is reported.

use std::collections::{BTreeMap, BTreeSet};

use ftrec_core::prefetch::AHEAD;
use ftrec_core::{EmbeddingTable, RowId, RowLayout, ServerId, ShardMap, TableId, DENSE_BLOCK};

use super::restore::{fold_list, read_piece_indexes, restore_server, IncrChain};
use crate::checkpoint::Checkpoints;
use crate::deck::{self, GcOptions, Lineage, RestoreAt, ShardWriter};
use crate::error::{CkptError, Result};
use crate::format::dense::encode_dense;
use crate::format::rows::encode_rows;
use crate::format::{
    Bundle, CheckpointId, FileContent, FileInfo, FileRef, Manifest, PieceIndex, PieceScheme,
    ShardInfo,
};
use crate::key::Key;
use crate::snapshot::{full_manifest, ShardReport};

/// Keys of the files no live chunk points into any more, in every chunk list of the store
/// (one per base and server): IncrCP §4.4's bundles whose counter reached 0.
pub async fn dead_files(ckpts: &Checkpoints) -> Result<BTreeSet<Key>> {
    let lineage = Lineage::load(ckpts).await?;
    // The newest piece of every list: a chunk-list piece no other chunk-list piece grows from.
    let mut lists = Vec::new();
    let mut parents = BTreeSet::new();
    for n in lineage.nodes() {
        let m = ckpts.read_manifest(&n.id, None).await?;
        if m.piece_scheme() == Some(PieceScheme::ChunkList) {
            parents.extend(m.parents.iter().cloned());
            lists.push(m.id.clone());
        }
    }
    let heads: Vec<CheckpointId> = lists
        .into_iter()
        .filter(|id| !parents.contains(id))
        .collect();
    dead_files_of(ckpts, &heads).await
}

/// Keys of the files no live chunk points into any more, in the chunk lists whose newest
/// pieces are `heads`: [`dead_files`] for a caller that knows its heads (a coordinator knows
/// the piece it just committed), without reading every manifest of the store.
pub async fn dead_files_of(ckpts: &Checkpoints, heads: &[CheckpointId]) -> Result<BTreeSet<Key>> {
    let mut out = BTreeSet::new();
    for head in heads {
        let chain = super::restore::select(ckpts, &RestoreAt::Id(head.clone())).await?;
        for s in &chain.base.shards {
            let list = fold_list(ckpts, &chain, s.server).await?;
            for f in list.dead_files() {
                out.insert(ckpts.file_key(&f.ckpt, &f.path)?);
            }
        }
    }
    Ok(out)
}

/// What [`gc`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IncrGcReport {
    pub lineage: deck::GcReport,
    /// Chunk-list files with no live chunk, deleted.
    pub dead_files: Vec<String>,
    pub dead_bytes: u64,
}

/// Delete every checkpoint no live lineage needs (older lists, and differentials older than the
/// newest of their base), then every chunk-list file with no live chunk.
pub async fn gc(ckpts: &Checkpoints, opts: &GcOptions) -> Result<IncrGcReport> {
    let lineage = deck::gc(ckpts, opts).await?;
    let mut rep = remove_dead_files(ckpts).await?;
    rep.lineage = lineage;
    Ok(rep)
}

/// Delete the chunk-list files no live chunk points into, and only those (every checkpoint
/// stays restorable).
pub async fn remove_dead_files(ckpts: &Checkpoints) -> Result<IncrGcReport> {
    let dead = dead_files(ckpts).await?;
    remove_files(ckpts, dead).await
}

/// [`remove_dead_files`] of the chunk lists whose newest pieces are `heads` only.
pub async fn remove_dead_files_of(
    ckpts: &Checkpoints,
    heads: &[CheckpointId],
) -> Result<IncrGcReport> {
    let dead = dead_files_of(ckpts, heads).await?;
    remove_files(ckpts, dead).await
}

async fn remove_files(ckpts: &Checkpoints, dead: BTreeSet<Key>) -> Result<IncrGcReport> {
    let mut rep = IncrGcReport::default();
    for key in dead {
        match ckpts.store().head(&key).await {
            Ok(meta) => {
                ckpts.store().delete(&key).await?;
                rep.dead_bytes += meta.size;
                rep.dead_files.push(key.to_string());
            }
            Err(CkptError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(rep)
}

/// One checkpoint's verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub id: CheckpointId,
    pub files: u64,
    pub bytes: u64,
    /// Files removed because no live chunk needs them (expected, not damage).
    pub removed: u64,
    /// The first problem, if any.
    pub problem: Option<String>,
}

/// Read and check every file of every checkpoint; files no chunk list needs any more may be
/// missing. Also folds the head's lists (their records must be consistent).
pub async fn verify(ckpts: &Checkpoints) -> Result<Vec<Verified>> {
    let lineage = Lineage::load(ckpts).await?;
    let dead = dead_files(ckpts).await.unwrap_or_default();
    let mut out = Vec::new();
    let mut listed: BTreeSet<Key> = BTreeSet::new();
    for n in lineage.nodes() {
        let m = ckpts.read_manifest(&n.id, None).await?;
        for f in &m.files {
            listed.insert(ckpts.file_key(&m.id, &f.path)?);
        }
        let mut v = Verified {
            id: m.id.clone(),
            files: 0,
            bytes: 0,
            removed: 0,
            problem: None,
        };
        for f in &m.files {
            let key = ckpts.file_key(&m.id, &f.path)?;
            match ckpts.store().get(&key).await {
                Ok(data) => {
                    v.files += 1;
                    v.bytes += data.len() as u64;
                    if let Err(e) = Checkpoints::verify_file(&key, f, &data) {
                        v.problem.get_or_insert(e.to_string());
                    }
                }
                Err(CkptError::NotFound { .. }) if dead.contains(&key) => v.removed += 1,
                Err(e) => {
                    v.problem.get_or_insert(e.to_string());
                }
            }
        }
        out.push(v);
    }
    if let Ok(chain) = super::restore::select(ckpts, &RestoreAt::Current).await {
        if chain.scheme == Some(PieceScheme::ChunkList) {
            let head = chain
                .pieces
                .last()
                .map_or(chain.base.id.clone(), |m| m.id.clone());
            for s in &chain.base.shards {
                match fold_list(ckpts, &chain, s.server).await {
                    Err(e) => out.push(Verified {
                        id: head.clone(),
                        files: 0,
                        bytes: 0,
                        removed: 0,
                        problem: Some(format!("chunk list of server {}: {e}", s.server.0)),
                    }),
                    // The live bundles of background extraction rounds: committed by a piece
                    // index, listed by no manifest.
                    Ok(list) => {
                        for lf in list.files().iter().filter(|f| f.live > 0) {
                            let key = ckpts.file_key(&lf.file.ckpt, &lf.file.path)?;
                            if listed.contains(&key) {
                                continue;
                            }
                            let checked = match ckpts.store().get(&key).await {
                                Ok(data) => Expected::Ref(lf.file.clone()).check(&key, &data),
                                Err(e) => Err(e),
                            };
                            // Counted with the checkpoint whose directory holds it.
                            let at = match out.iter().position(|v| v.id == lf.file.ckpt) {
                                Some(i) => i,
                                None => {
                                    out.push(Verified {
                                        id: lf.file.ckpt.clone(),
                                        files: 0,
                                        bytes: 0,
                                        removed: 0,
                                        problem: None,
                                    });
                                    out.len() - 1
                                }
                            };
                            let v = &mut out[at];
                            v.files += 1;
                            v.bytes += lf.file.size;
                            if let Err(e) = checked {
                                v.problem.get_or_insert(e.to_string());
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The piece indexes of a committed piece, one per server.
pub async fn piece_summaries(ckpts: &Checkpoints, m: &Manifest) -> Result<Vec<PieceIndex>> {
    let mut out = Vec::new();
    for s in &m.shards {
        if m.pieces().any(|(f, _, _)| f.content.server() == s.server) {
            for (_, _, p) in read_piece_indexes(ckpts, std::slice::from_ref(m), s.server).await? {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// Files a restore of the newest state of a chunk list reads over the base, on the server of
/// piece index `p` (IncrCP §4.5's `R_i` prices them): the files of its row 0, which the index
/// lists whole, the index itself and the piece's dense range. 0 for the other schemes.
pub fn newest_restore_files(p: &PieceIndex) -> u64 {
    if p.scheme != PieceScheme::ChunkList {
        return 0;
    }
    let files: BTreeSet<u32> = p
        .row0
        .iter()
        .flat_map(|c| c.parts.iter().map(|x| x.file))
        .collect();
    files.len() as u64 + 2
}

/// A server's shard in memory, as a restore target.
#[derive(Debug)]
pub struct MemShard {
    pub server: ServerId,
    pub map: ShardMap,
    pub tables: Vec<EmbeddingTable>,
    /// First block, values, state, state words per block.
    pub dense: Option<(u64, Vec<f32>, Vec<f32>, usize)>,
}

impl MemShard {
    /// Zeroed tables and dense range of the shapes `info` lists.
    pub fn of(info: &ShardInfo, map: ShardMap) -> MemShard {
        MemShard {
            server: info.server,
            map,
            tables: info
                .tables
                .iter()
                .map(|t| EmbeddingTable::zeros(t.table, t.rows, t.layout))
                .collect(),
            dense: info.dense.map(|d| {
                (
                    d.first_block,
                    vec![0.0; d.values as usize],
                    vec![0.0; (d.blocks * d.state_per_block as u64) as usize],
                    d.state_per_block as usize,
                )
            }),
        }
    }

    fn table_mut(&mut self, t: TableId) -> Result<&mut EmbeddingTable> {
        self.tables
            .iter_mut()
            .find(|x| x.id == t)
            .ok_or_else(|| CkptError::InvalidArgument(format!("no table {}", t.0)))
    }
}

impl ShardWriter for MemShard {
    fn server(&self) -> ServerId {
        self.server
    }

    fn table_shape(&self, table: TableId) -> Option<(u64, RowLayout)> {
        self.tables
            .iter()
            .find(|t| t.id == table)
            .map(|t| (t.rows(), t.layout()))
    }

    fn write_rows(&mut self, table: TableId, ids: &[RowId], words: &[f32]) -> Result<()> {
        let (map, server) = (self.map, self.server);
        let t = self.table_mut(table)?;
        let w = t.layout().words();
        for (i, &id) in ids.iter().enumerate() {
            // The rows of a piece are scattered over the table: ask for the row AHEAD on
            // while copying this one, so that the misses overlap.
            if let Some(&ahead) = ids.get(i + AHEAD) {
                t.prefetch_row(map.local_index(table, ahead));
            }
            if map.owner(table, id) != server || map.local_index(table, id) >= t.rows() {
                return Err(CkptError::InvalidArgument(format!(
                    "row {id} of table {} is not held by server {}",
                    table.0, server.0
                )));
            }
            t.row_mut(map.local_index(table, id))
                .copy_from_slice(&words[i * w..(i + 1) * w]);
        }
        Ok(())
    }

    fn dense_shape(&self) -> Option<(u64, u64, u32)> {
        self.dense
            .as_ref()
            .map(|(f, v, _, spb)| (*f, v.len() as u64, *spb as u32))
    }

    fn write_dense(&mut self, first_block: u64, values: &[f32], state: &[f32]) -> Result<()> {
        let (first, v, s, spb) = self
            .dense
            .as_mut()
            .ok_or_else(|| CkptError::InvalidArgument("no dense target".into()))?;
        let b0 = first_block
            .checked_sub(*first)
            .ok_or_else(|| CkptError::InvalidArgument(format!("dense block {first_block}")))?
            as usize;
        let v0 = b0 * DENSE_BLOCK;
        if v0 + values.len() > v.len() || b0 * *spb + state.len() > s.len() {
            return Err(CkptError::InvalidArgument(format!(
                "dense blocks from {first_block} do not fit the target"
            )));
        }
        v[v0..v0 + values.len()].copy_from_slice(values);
        s[b0 * *spb..b0 * *spb + state.len()].copy_from_slice(state);
        Ok(())
    }
}

/// Write `shards` as the files of full checkpoint `id` (rows in chunks of about
/// `chunk_bytes`) and return each server's report.
pub(crate) async fn write_mem_shards(
    dst: &Checkpoints,
    id: &CheckpointId,
    shards: &[MemShard],
    chunk_bytes: usize,
) -> Result<Vec<ShardReport>> {
    let mut reports = Vec::new();
    for s in shards {
        let mut files = Vec::new();
        let mut tables = Vec::new();
        for t in &s.tables {
            let layout = t.layout();
            let per = (chunk_bytes / (8 + layout.bytes())).max(1) as u64;
            let mut lo = 0u64;
            let mut n = 0;
            while lo < t.rows() || (lo == 0 && t.rows() == 0) {
                let hi = (lo + per).min(t.rows());
                let ids = (lo..hi).map(|l| s.map.global_row(t.id, s.server, l));
                let w = layout.words();
                let rows = &t.as_slice()[lo as usize * w..hi as usize * w];
                let file = encode_rows(t.id, layout, ids, rows)?;
                let path = format!("s{:04}/t{:04}-{n:06}.rows", s.server.0, t.id.0);
                dst.put_file(id, &path, &file).await?;
                files.push(FileInfo {
                    path,
                    size: file.size(),
                    crc32c: file.checksums,
                    content: FileContent::Rows {
                        server: s.server,
                        table: t.id,
                        rows: hi - lo,
                        first_row: s.map.global_row(t.id, s.server, lo),
                        last_row: if hi > lo {
                            s.map.global_row(t.id, s.server, hi - 1)
                        } else {
                            0
                        },
                    },
                });
                n += 1;
                if hi >= t.rows() {
                    break;
                }
                lo = hi;
            }
            tables.push(crate::format::TableInfo {
                table: t.id,
                rows: t.rows(),
                layout,
            });
        }
        let mut dense = None;
        if let Some((first, values, state, spb)) = &s.dense {
            let file = encode_dense(*first, values, state, *spb)?;
            let path = format!("s{:04}/dense-000000.dense", s.server.0);
            dst.put_file(id, &path, &file).await?;
            let blocks = values.len().div_ceil(DENSE_BLOCK) as u64;
            files.push(FileInfo {
                path,
                size: file.size(),
                crc32c: file.checksums,
                content: FileContent::Dense {
                    server: s.server,
                    first_block: *first,
                    blocks,
                },
            });
            dense = Some(crate::format::DenseInfo {
                first_block: *first,
                blocks,
                values: values.len() as u64,
                state_per_block: *spb as u32,
            });
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        reports.push(ShardReport {
            shard: ShardInfo {
                server: s.server,
                tables,
                dense,
            },
            bytes: files.iter().map(|f| f.size).sum(),
            files,
        });
    }
    Ok(reports)
}

/// Refuse a base whose declared shapes for `info`'s server need more memory than the bytes its
/// files hold in the store, before [`MemShard::of`] allocates them: a manifest's row and value
/// counts are declared, so a damaged one could otherwise ask for any amount of memory. Every
/// saved value takes at least 4 bytes of some file, so a real base always passes.
async fn check_shapes_stored(src: &Checkpoints, base: &Manifest, info: &ShardInfo) -> Result<()> {
    let mut need: u128 = 0;
    for t in &info.tables {
        need += t.rows as u128 * t.layout.bytes() as u128;
    }
    if let Some(d) = info.dense {
        need += (d.values as u128 + d.blocks as u128 * d.state_per_block as u128) * 4;
    }
    let mut stored: u128 = 0;
    for f in base.files_of(info.server) {
        if stored >= need {
            break;
        }
        let key = src.file_key(&base.id, &f.path)?;
        stored += src.store().head(&key).await?.size as u128;
    }
    if need > stored {
        return Err(CkptError::InvalidCheckpoint {
            id: base.id.to_string(),
            reason: format!(
                "server {} declares {need} bytes of rows and dense values, its files hold {stored}",
                info.server.0
            ),
        });
    }
    Ok(())
}

/// Rebuild the state `chain` names for every server, in memory (every file read is verified).
pub async fn restore_all(src: &Checkpoints, chain: &IncrChain) -> Result<Vec<MemShard>> {
    let map = ShardMap::new(chain.base.shards.len().max(1) as u32).map_err(|e| {
        CkptError::InvalidCheckpoint {
            id: chain.base.id.to_string(),
            reason: format!("shard map: {e}"),
        }
    })?;
    let mut shards = Vec::new();
    for info in &chain.base.shards {
        check_shapes_stored(src, &chain.base, info).await?;
        let mut s = MemShard::of(info, map);
        restore_server(src, chain, &mut s).await?;
        shards.push(s);
    }
    Ok(shards)
}

/// Commit `shards` (the state `chain` names) into `dst` as one full checkpoint
/// `<state>-full` (`CURRENT` moves).
pub async fn write_full(
    dst: &Checkpoints,
    chain: &IncrChain,
    shards: &[MemShard],
    chunk_bytes: usize,
) -> Result<Manifest> {
    let target = chain.target_manifest();
    let id = CheckpointId::new(format!("{}-full", target.id))?;
    let reports = write_mem_shards(dst, &id, shards, chunk_bytes).await?;
    let mut m = full_manifest(id, target.step, target.data_position.clone(), reports);
    m.extra.insert(
        "restored_from".into(),
        serde_json::json!({
            "base": chain.base.id,
            "target": target.id,
            "scheme": chain.scheme.map(|s| s.name()),
        }),
    );
    dst.commit(&m).await?;
    Ok(m)
}

/// Rebuild the state `chain` names for every server, in memory, and commit it into `dst` as
/// one full checkpoint `<state>-full` (`CURRENT` moves). Holds the whole model in memory.
pub async fn materialize_full(
    src: &Checkpoints,
    chain: &IncrChain,
    dst: &Checkpoints,
    chunk_bytes: usize,
) -> Result<Manifest> {
    let shards = restore_all(src, chain).await?;
    write_full(dst, chain, &shards, chunk_bytes).await
}

/// Sizes of every object in the store, by checkpoint directory (`""` for `CURRENT` and
/// anything outside `ckpt/`).
pub async fn stored_bytes(ckpts: &Checkpoints) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for meta in ckpts.store().list(None).await? {
        let s = meta.key.as_str();
        let dir = s
            .split_once("ckpt/")
            .and_then(|(_, rest)| rest.split_once('/'))
            .map_or(String::new(), |(d, _)| d.to_string());
        *out.entry(dir).or_default() += meta.size;
    }
    Ok(out)
}

/// What a file a restore reads must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// The entry its manifest records.
    Entry(FileInfo),
    /// A bundle of an extraction round run after its column's piece was committed (IncrCP
    /// §4.3, in the background): no manifest lists it; the next piece's index, which committed
    /// it, records its size and checksums.
    Ref(FileRef),
}

impl Expected {
    /// Check `data`, the bytes of `key`, against what is expected of it.
    pub fn check(&self, key: &Key, data: &[u8]) -> Result<()> {
        match self {
            Expected::Entry(f) => Checkpoints::verify_file(key, f, data).map(|_| ()),
            Expected::Ref(r) => {
                if data.len() as u64 != r.size {
                    return Err(CkptError::Truncated {
                        file: key.to_string(),
                        expected: r.size,
                        found: data.len() as u64,
                    });
                }
                let b = Bundle::decode(key.as_str(), data)?;
                if b.checksums != r.crc32c {
                    return Err(CkptError::Corrupt {
                        file: key.to_string(),
                        reason: "bundle does not match the checksums its piece index records"
                            .into(),
                    });
                }
                Ok(())
            }
        }
    }
}

/// Every file restoring the state `chain` names reads, on every server, with what it must be
/// (the entry its manifest records, or for a bundle of a background extraction round what the
/// piece index committing it records): the base's files, then what the scheme reads over it
/// (naive incremental: the row files of every piece up to the target; Check-N-Run: the target's
/// row files; IncrCP: the piece indexes of the pieces after the target, or the newest's, and the
/// files of the target's rectangle), and the target's dense range. A piece index that cannot be read or folded is an error naming it.
pub async fn files_read(ckpts: &Checkpoints, chain: &IncrChain) -> Result<BTreeMap<Key, Expected>> {
    let mut out = BTreeMap::new();
    let mut add = |id: &CheckpointId, path: &str, e: Expected| -> Result<()> {
        out.insert(ckpts.file_key(id, path)?, e);
        Ok(())
    };
    for f in &chain.base.files {
        add(&chain.base.id, &f.path, Expected::Entry(f.clone()))?;
    }
    if chain.target == 0 {
        return Ok(out);
    }
    let target = chain.target_manifest();
    let rows = |f: &FileInfo| {
        matches!(
            f.content,
            FileContent::Rows { .. } | FileContent::QuantRows { .. }
        )
    };
    for f in target
        .files
        .iter()
        .filter(|f| matches!(f.content, FileContent::Dense { .. }))
    {
        add(&target.id, &f.path, Expected::Entry(f.clone()))?;
    }
    match chain.scheme {
        Some(PieceScheme::ChunkList) => {
            // The indexes of the pieces after the target (the newest's alone for the newest
            // state): what `restore::rectangle_list` reads.
            let from = (chain.target as usize).min(chain.pieces.len().saturating_sub(1));
            let indexed: &[Manifest] = &chain.pieces[from..];
            for m in indexed {
                for (f, _, _) in m.pieces() {
                    add(&m.id, &f.path, Expected::Entry(f.clone()))?;
                }
            }
            let by_name: BTreeMap<(String, String), (&Manifest, &FileInfo)> = chain
                .pieces
                .iter()
                .flat_map(|m| {
                    m.files
                        .iter()
                        .map(move |f| ((m.id.to_string(), f.path.clone()), (m, f)))
                })
                .collect();
            let in_list: BTreeSet<String> = chain.pieces.iter().map(|m| m.id.to_string()).collect();
            for s in &chain.base.shards {
                let list = super::restore::rectangle_list(ckpts, chain, s.server).await?;
                for c in list.rectangle(chain.target) {
                    for p in &c.parts {
                        let r = &list.file(p.file).file;
                        match by_name.get(&(r.ckpt.to_string(), r.path.clone())) {
                            Some((m, f)) => add(&m.id, &f.path, Expected::Entry((*f).clone()))?,
                            // A background round's bundle, under a piece of this list.
                            None if in_list.contains(r.ckpt.as_str()) => {
                                add(&r.ckpt, &r.path, Expected::Ref(r.clone()))?
                            }
                            None => {
                                return Err(CkptError::InvalidCheckpoint {
                                    id: r.ckpt.to_string(),
                                    reason: format!(
                                        "the chunk list reads {}, which is no file of a piece of \
                                         the list",
                                        r.path
                                    ),
                                })
                            }
                        }
                    }
                }
            }
        }
        Some(PieceScheme::Differential) => {
            for f in target.files.iter().filter(|f| rows(f)) {
                add(&target.id, &f.path, Expected::Entry(f.clone()))?;
            }
        }
        _ => {
            for m in chain.pieces.iter().take(chain.target as usize) {
                for f in m.files.iter().filter(|f| rows(f)) {
                    add(&m.id, &f.path, Expected::Entry(f.clone()))?;
                }
            }
        }
    }
    Ok(out)
}

/// Read and check every file of `files`: the first problem, naming the file.
async fn check_files(
    ckpts: &Checkpoints,
    files: &BTreeMap<Key, Expected>,
    known: &mut BTreeMap<Key, Option<String>>,
) -> Option<String> {
    for (key, f) in files {
        let problem = match known.get(key) {
            Some(p) => p.clone(),
            None => {
                let p = match ckpts.store().get(key).await {
                    Ok(data) => f.check(key, &data).err().map(|e| e.to_string()),
                    Err(e) => Some(e.to_string()),
                };
                known.insert(key.clone(), p.clone());
                p
            }
        };
        if problem.is_some() {
            return problem;
        }
    }
    None
}

/// The manifests that rebuild the newest state at or before the one `at` names whose every
/// file a restore reads is intact (DECK's fallback, `deck::select_chain`, for incremental
/// stores), and each newer state skipped with why. A damaged bundle takes down exactly the
/// states whose rectangles read it; the restore falls back past those only.
pub async fn select_intact(
    ckpts: &Checkpoints,
    at: &RestoreAt,
) -> Result<(IncrChain, Vec<(CheckpointId, String)>)> {
    let lineage = Lineage::load(ckpts).await?;
    let first = super::restore::select(ckpts, at).await;
    let target_step = match &first {
        Ok(c) => c.target_manifest().step,
        Err(_) => match at {
            RestoreAt::Step(s) => *s,
            _ => u64::MAX,
        },
    };
    let mut skipped = Vec::new();
    let mut known = BTreeMap::new();
    for (step, id) in lineage.states_newest_first() {
        if step > target_step {
            continue;
        }
        let attempt = async {
            let chain = super::restore::select(ckpts, &RestoreAt::Id(id.clone())).await?;
            let files = files_read(ckpts, &chain).await?;
            Ok::<_, CkptError>((chain, files))
        }
        .await;
        let problem = match attempt {
            Ok((chain, files)) => match check_files(ckpts, &files, &mut known).await {
                None => return Ok((chain, skipped)),
                Some(p) => p,
            },
            Err(e) => e.to_string(),
        };
        skipped.push((id, problem));
    }
    Err(CkptError::NoIntactCheckpoint {
        root: format!("{} store", ckpts.store().backend()),
        failures: skipped
            .into_iter()
            .map(|(id, p)| (id.to_string(), p))
            .collect(),
    })
}

/// A damaged or missing file of an incremental store, and the states it takes down (their
/// restores read it), newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub file: String,
    pub problem: String,
    pub states: Vec<CheckpointId>,
}

/// Every damaged file some state's restore reads, with the states it takes down; and the
/// states whose list cannot even be read (a damaged piece index or manifest), with why.
pub async fn damage(ckpts: &Checkpoints) -> Result<(Vec<Damage>, Vec<(CheckpointId, String)>)> {
    let lineage = Lineage::load(ckpts).await?;
    let mut known: BTreeMap<Key, Option<String>> = BTreeMap::new();
    let mut by_file: BTreeMap<Key, Damage> = BTreeMap::new();
    let mut unreadable = Vec::new();
    for (_, id) in lineage.states_newest_first() {
        let attempt = async {
            let chain = super::restore::select(ckpts, &RestoreAt::Id(id.clone())).await?;
            files_read(ckpts, &chain).await
        }
        .await;
        let files = match attempt {
            Ok(f) => f,
            Err(e) => {
                unreadable.push((id, e.to_string()));
                continue;
            }
        };
        for (key, f) in &files {
            let one = BTreeMap::from([(key.clone(), f.clone())]);
            if let Some(problem) = check_files(ckpts, &one, &mut known).await {
                by_file
                    .entry(key.clone())
                    .or_insert_with(|| Damage {
                        file: key.to_string(),
                        problem,
                        states: Vec::new(),
                    })
                    .states
                    .push(id.clone());
            }
        }
    }
    Ok((by_file.into_values().collect(), unreadable))
}
