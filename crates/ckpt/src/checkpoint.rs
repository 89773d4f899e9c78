//! Checkpoint layout, commit and selection on top of a [`ChunkStore`].
//!
//! Layout under an optional root key:
//!
//! ```text
//! CURRENT                              pointer: id + manifest size and checksums
//! JOB                                  the job record (optional; what job writes the store)
//! ckpt/<id>/MANIFEST                   the manifest (written create-only)
//! ckpt/<id>/s<server>/t<table>-<n>.rows
//! ckpt/<id>/s<server>/dense-<n>.dense
//! ```
//!
//! Commit protocol: every data file is written create-only (a second writer of the same file
//! is a bug or a zombie, never something to overwrite); then the manifest, create-only, which
//! makes the checkpoint exist; then `CURRENT` is overwritten atomically to point at it. A
//! crash before the manifest leaves unreferenced files (remove them with
//! [`Checkpoints::delete_checkpoint`]); a crash between manifest and `CURRENT` leaves a
//! complete checkpoint that [`Select::NewestIntact`] still finds.
//!
//! Readers verify `CURRENT`'s own checksums, the manifest's checksums and its size and
//! checksums as `CURRENT` recorded them, and every data file's checksums and size, both as the
//! file stores them and as the manifest recorded them. Any mismatch is an error naming the
//! file.

use std::sync::Arc;

use futures_util::{StreamExt, TryStreamExt};

use crate::error::{CkptError, Result};
use crate::format::bundle::Bundle;
use crate::format::dense::DenseChunk;
use crate::format::piece::PieceIndex;
use crate::format::qrows::QRowChunk;
use crate::format::rows::RowChunk;
use crate::format::{
    check_recorded, CheckpointId, CheckpointKind, CurrentPointer, EncodedFile, FileChecksums,
    FileContent, FileInfo, JobRecord, Manifest,
};
use crate::key::Key;
use crate::store::{ChunkStore, PutMode};

/// Which checkpoint to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Select {
    /// The one `CURRENT` points at; any damage is an error.
    Current,
    /// A named checkpoint; any damage is an error.
    Id(CheckpointId),
    /// The newest (by step, then id) checkpoint whose manifest and every file verify,
    /// skipping damaged ones. Reads every file of each candidate it tries.
    NewestIntact,
}

/// A data file, verified against its manifest entry and decoded.
#[derive(Debug)]
pub enum VerifiedFile<'a> {
    Rows(RowChunk<'a>),
    Dense(DenseChunk<'a>),
    Bundle(Bundle<'a>),
    QuantRows(QRowChunk<'a>),
    PieceIndex(Box<PieceIndex>),
}

/// Checkpoints stored in one [`ChunkStore`], under an optional root key.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    store: Arc<dyn ChunkStore>,
    root: Option<Key>,
    /// The writer lease's generation ([`crate::lease`]) commits stamp into `CURRENT`; a
    /// commit fails when `CURRENT` carries a newer one.
    generation: Option<u64>,
}

impl Checkpoints {
    pub fn new(store: Arc<dyn ChunkStore>) -> Self {
        Checkpoints {
            store,
            root: None,
            generation: None,
        }
    }

    /// The same store, committing as writer generation `generation` (the lease's).
    pub fn with_generation(mut self, generation: u64) -> Self {
        self.generation = Some(generation);
        self
    }

    /// The writer generation commits carry, if set.
    pub fn generation(&self) -> Option<u64> {
        self.generation
    }

    /// Checkpoints under `root/` in `store`.
    pub fn with_root(store: Arc<dyn ChunkStore>, root: Key) -> Self {
        Checkpoints {
            store,
            root: Some(root),
            generation: None,
        }
    }

    pub fn store(&self) -> &Arc<dyn ChunkStore> {
        &self.store
    }

    /// The key of `rel` (a relative path) under the root; an error for a path that is not a
    /// valid key.
    pub fn key_of(&self, rel: &str) -> Result<Key> {
        self.key(rel)
    }

    /// The key of `rel` (a fixed, valid name such as `LEASE` or `readers`) under the root.
    pub fn rel_key(&self, rel: &str) -> Key {
        self.key(rel).expect("a fixed name is a valid key")
    }

    fn key(&self, rel: &str) -> Result<Key> {
        match &self.root {
            Some(r) => r.join(rel),
            None => Key::new(rel),
        }
    }

    fn describe(&self) -> String {
        match &self.root {
            Some(r) => format!("{} store at {r}", self.store.backend()),
            None => format!("{} store", self.store.backend()),
        }
    }

    pub fn current_key(&self) -> Key {
        self.key("CURRENT").expect("CURRENT is a valid key")
    }

    /// The key of the store's job record.
    pub fn job_key(&self) -> Key {
        self.key("JOB").expect("JOB is a valid key")
    }

    /// Write (or replace, atomically) the store's job record. It lives outside `ckpt/`, so
    /// garbage collection never touches it.
    pub async fn write_job(&self, record: &JobRecord) -> Result<()> {
        let file = record.encode()?;
        self.store
            .put(&self.job_key(), file.bytes, PutMode::Overwrite)
            .await
    }

    /// The store's job record, or `None` if it has none; a damaged one is an error naming it.
    pub async fn read_job(&self) -> Result<Option<JobRecord>> {
        let key = self.job_key();
        match self.store.get(&key).await {
            Ok(data) => JobRecord::decode(key.as_str(), &data).map(Some),
            Err(CkptError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The directory of checkpoint `id`.
    pub fn checkpoint_dir(&self, id: &CheckpointId) -> Key {
        self.key(&format!("ckpt/{id}"))
            .expect("checkpoint ids are valid segments")
    }

    pub fn manifest_key(&self, id: &CheckpointId) -> Key {
        self.checkpoint_dir(id)
            .join("MANIFEST")
            .expect("MANIFEST is a valid segment")
    }

    /// The key of file `path` (relative, as a manifest lists it) of checkpoint `id`.
    pub fn file_key(&self, id: &CheckpointId, path: &str) -> Result<Key> {
        self.checkpoint_dir(id).join(path)
    }

    /// Write data file `path` of checkpoint `id`, create-only.
    pub async fn put_file(&self, id: &CheckpointId, path: &str, file: &EncodedFile) -> Result<()> {
        let key = self.file_key(id, path)?;
        self.store
            .put(&key, file.bytes.clone(), PutMode::Create)
            .await
    }

    /// Commit `manifest`: check that its files are present with the recorded sizes, write the
    /// manifest create-only, then point `CURRENT` at it with a compare-and-swap from what it
    /// names now. [`CkptError::Fenced`] if `CURRENT` carries a newer writer generation than
    /// this one's. A failed swap whose acknowledgement may be lost is checked by reading
    /// `CURRENT` again: naming this checkpoint, the commit landed; unreadable,
    /// [`CkptError::CommitUncertain`] (the caller must not delete the checkpoint).
    pub async fn commit(&self, manifest: &Manifest) -> Result<CurrentPointer> {
        let mfile = self.write_manifest(manifest).await?;
        let key = self.current_key();
        for _ in 0..8 {
            let raw = match self.store.get(&key).await {
                Ok(d) => Some(d),
                Err(CkptError::NotFound { .. }) => None,
                Err(e) => return Err(e),
            };
            // A damaged pointer is replaced (from its exact bytes); it fences nothing.
            let have = raw
                .as_ref()
                .and_then(|d| CurrentPointer::decode(key.as_str(), d).ok());
            let have_gen = have.as_ref().map_or(0, |p| p.generation);
            if let Some(g) = self.generation.filter(|&g| have_gen > g) {
                return Err(CkptError::Fenced {
                    what: format!(
                        "{key} carries writer generation {have_gen}, newer than this writer's {g}: another job took the store over"
                    ),
                });
            }
            let pointer = CurrentPointer {
                id: manifest.id.clone(),
                manifest_size: mfile.size(),
                manifest_crc32c: mfile.checksums,
                generation: self.generation.unwrap_or(have_gen),
            };
            match self.store.swap(&key, raw, pointer.encode().bytes).await {
                Ok(()) => return Ok(pointer),
                // Someone moved it between the read and the swap: look again.
                Err(CkptError::Precondition { .. } | CkptError::AlreadyExists { .. }) => continue,
                Err(e) => {
                    return match self.read_current().await {
                        Ok(Some(p)) if p == pointer => Ok(pointer),
                        Ok(_) => Err(e),
                        Err(again) => Err(CkptError::CommitUncertain {
                            id: manifest.id.to_string(),
                            reason: format!("{e}; reading {key} again: {again}"),
                        }),
                    };
                }
            }
        }
        Err(CkptError::Precondition {
            key: key.to_string(),
            reason: "it kept changing under the commit: another writer is moving it".into(),
        })
    }

    /// The first two steps of [`Checkpoints::commit`] without moving `CURRENT` (for
    /// checkpoints that should exist but not become current, such as merged deltas).
    pub async fn write_manifest(&self, manifest: &Manifest) -> Result<EncodedFile> {
        let mkey = self.manifest_key(&manifest.id);
        manifest.validate(mkey.as_str())?;
        futures_util::stream::iter(manifest.files.iter())
            .map(|f| async move {
                let key = self.file_key(&manifest.id, &f.path)?;
                let meta = self.store.head(&key).await?;
                if meta.size != f.size {
                    return Err(CkptError::Truncated {
                        file: key.to_string(),
                        expected: f.size,
                        found: meta.size,
                    });
                }
                Ok(())
            })
            .buffer_unordered(16)
            .try_collect::<()>()
            .await?;
        let mfile = manifest.encode()?;
        self.store
            .put(&mkey, mfile.bytes.clone(), PutMode::Create)
            .await?;
        Ok(mfile)
    }

    /// The `CURRENT` pointer, or `None` if no checkpoint was ever committed.
    pub async fn read_current(&self) -> Result<Option<CurrentPointer>> {
        let key = self.current_key();
        match self.store.get(&key).await {
            Ok(data) => CurrentPointer::decode(key.as_str(), &data).map(Some),
            Err(CkptError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Read and verify the manifest of `id`. With `recorded = Some((size, checksums))` (from
    /// `CURRENT`), the manifest must also match those.
    pub async fn read_manifest(
        &self,
        id: &CheckpointId,
        recorded: Option<(u64, FileChecksums)>,
    ) -> Result<Manifest> {
        let key = self.manifest_key(id);
        let data = self.store.get(&key).await?;
        let (m, crc) = Manifest::decode(key.as_str(), &data)?;
        if let Some((size, rcrc)) = recorded {
            check_recorded(key.as_str(), "CURRENT", data.len() as u64, crc, size, rcrc)?;
        }
        if &m.id != id {
            return Err(CkptError::Corrupt {
                file: key.to_string(),
                reason: format!("manifest names checkpoint {}, expected {id}", m.id),
            });
        }
        Ok(m)
    }

    /// Ids of every checkpoint that has a manifest, sorted.
    pub async fn list_checkpoints(&self) -> Result<Vec<CheckpointId>> {
        let dir = self.key("ckpt")?;
        let mut ids = Vec::new();
        for meta in self.store.list(Some(&dir)).await? {
            let Some(rest) = meta.key.strip_prefix(&dir) else {
                continue;
            };
            if let Some((id, "MANIFEST")) = rest.split_once('/') {
                if let Ok(id) = CheckpointId::new(id) {
                    ids.push(id);
                }
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// Check `data`, the bytes of `info` read from `key`, against the manifest entry, and
    /// decode it.
    pub fn verify_file<'a>(key: &Key, info: &FileInfo, data: &'a [u8]) -> Result<VerifiedFile<'a>> {
        let name = key.as_str();
        if data.len() as u64 != info.size {
            return Err(CkptError::Truncated {
                file: name.to_string(),
                expected: info.size,
                found: data.len() as u64,
            });
        }
        let mismatch = |what: String| CkptError::Corrupt {
            file: name.to_string(),
            reason: format!("file does not match its manifest entry: {what}"),
        };
        let (decoded, crc) = match info.content {
            FileContent::Rows {
                table,
                rows,
                first_row,
                last_row,
                ..
            } => {
                let c = RowChunk::decode(name, data)?;
                let h = c.header;
                if h.table != table || h.rows != rows {
                    return Err(mismatch(format!(
                        "holds {} rows of table {}, manifest says {rows} of table {}",
                        h.rows, h.table.0, table.0
                    )));
                }
                if rows > 0 && (h.first_row != first_row || h.last_row != last_row) {
                    return Err(mismatch(format!(
                        "holds rows {}..={}, manifest says {first_row}..={last_row}",
                        h.first_row, h.last_row
                    )));
                }
                (VerifiedFile::Rows(c), c.checksums)
            }
            FileContent::Dense {
                first_block,
                blocks,
                ..
            } => {
                let c = DenseChunk::decode(name, data)?;
                if c.header.first_block != first_block || c.header.blocks != blocks {
                    return Err(mismatch(format!(
                        "holds blocks {}+{}, manifest says {first_block}+{blocks}",
                        c.header.first_block, c.header.blocks
                    )));
                }
                (VerifiedFile::Dense(c), c.checksums)
            }
            FileContent::Bundle {
                server,
                sections,
                rows,
            } => {
                let b = Bundle::decode(name, data)?;
                if b.server != server || b.sections().len() as u64 != sections || b.rows != rows {
                    return Err(mismatch(format!(
                        "holds {} sections of {} rows of server {}, manifest says {sections} of {rows} of server {}",
                        b.sections().len(),
                        b.rows,
                        b.server.0,
                        server.0
                    )));
                }
                let crc = b.checksums;
                (VerifiedFile::Bundle(b), crc)
            }
            FileContent::QuantRows {
                table,
                rows,
                first_row,
                last_row,
                bits,
                ..
            } => {
                let c = QRowChunk::decode(name, data)?;
                let h = c.header;
                if h.table != table
                    || h.rows != rows
                    || h.bits.bits() != bits as u32
                    || (rows > 0 && (h.first_row != first_row || h.last_row != last_row))
                {
                    return Err(mismatch(format!(
                        "holds {} {}-bit rows {}..={} of table {}, manifest says {rows} {bits}-bit rows {first_row}..={last_row} of table {}",
                        h.rows,
                        h.bits.bits(),
                        h.first_row,
                        h.last_row,
                        h.table.0,
                        table.0
                    )));
                }
                (VerifiedFile::QuantRows(c), c.checksums)
            }
            FileContent::PieceIndex {
                server,
                scheme,
                column,
            } => {
                let (p, crc) = PieceIndex::decode(name, data)?;
                if p.server != server || p.scheme != scheme || p.column != column {
                    return Err(mismatch(format!(
                        "is server {}'s {} piece of column {}, manifest says server {}'s {} piece of column {column}",
                        p.server.0,
                        p.scheme.name(),
                        p.column,
                        server.0,
                        scheme.name()
                    )));
                }
                (VerifiedFile::PieceIndex(Box::new(p)), crc)
            }
        };
        check_recorded(
            name,
            "manifest",
            data.len() as u64,
            crc,
            info.size,
            info.crc32c,
        )?;
        Ok(decoded)
    }

    /// Decode a file whose bytes already passed [`Checkpoints::verify_file`] against `info`.
    pub(crate) fn decode_verified<'a>(
        key: &Key,
        info: &FileInfo,
        data: &'a [u8],
    ) -> Result<VerifiedFile<'a>> {
        Ok(match info.content {
            FileContent::Rows { .. } => {
                VerifiedFile::Rows(RowChunk::decode_verified(key.as_str(), data)?)
            }
            FileContent::Dense { .. } => {
                VerifiedFile::Dense(DenseChunk::decode_verified(key.as_str(), data)?)
            }
            FileContent::Bundle { .. } => {
                VerifiedFile::Bundle(Bundle::decode_verified(key.as_str(), data)?)
            }
            FileContent::QuantRows { .. } => {
                VerifiedFile::QuantRows(QRowChunk::decode_verified(key.as_str(), data)?)
            }
            FileContent::PieceIndex { .. } => {
                VerifiedFile::PieceIndex(Box::new(PieceIndex::decode(key.as_str(), data)?.0))
            }
        })
    }

    /// Read every file of `manifest` and verify it; `parallel` files are read at once.
    pub async fn verify_files(&self, manifest: &Manifest, parallel: usize) -> Result<()> {
        futures_util::stream::iter(manifest.files.iter())
            .map(|f| async move {
                let key = self.file_key(&manifest.id, &f.path)?;
                let data = self.store.get(&key).await?;
                Self::verify_file(&key, f, &data)?;
                Ok(())
            })
            .buffer_unordered(parallel.max(1))
            .try_collect::<()>()
            .await
    }

    /// Open a checkpoint of one of `kinds` by `policy` and return its verified manifest.
    /// [`Select::Current`] and [`Select::Id`] verify the manifest (data files are verified
    /// as they are read); [`Select::NewestIntact`] verifies every file of the one it returns.
    pub async fn select(&self, policy: &Select, kinds: &[CheckpointKind]) -> Result<Manifest> {
        let check_kind = |m: Manifest| {
            if kinds.contains(&m.kind) {
                Ok(m)
            } else {
                Err(CkptError::InvalidCheckpoint {
                    id: m.id.to_string(),
                    reason: format!(
                        "is a {} checkpoint; expected one of {:?}",
                        m.kind.name(),
                        kinds.iter().map(|k| k.name()).collect::<Vec<_>>()
                    ),
                })
            }
        };
        match policy {
            Select::Current => {
                let p = self
                    .read_current()
                    .await?
                    .ok_or_else(|| CkptError::NoCheckpoint {
                        root: self.describe(),
                    })?;
                let m = self
                    .read_manifest(&p.id, Some((p.manifest_size, p.manifest_crc32c)))
                    .await?;
                check_kind(m)
            }
            Select::Id(id) => check_kind(self.read_manifest(id, None).await?),
            Select::NewestIntact => self.newest_intact(kinds).await,
        }
    }

    async fn newest_intact(&self, kinds: &[CheckpointKind]) -> Result<Manifest> {
        // A damaged CURRENT only costs the cross-check of its manifest.
        let current = self.read_current().await.ok().flatten();
        let mut failures = Vec::new();
        let mut candidates = Vec::new();
        for id in self.list_checkpoints().await? {
            let recorded = current
                .as_ref()
                .filter(|p| p.id == id)
                .map(|p| (p.manifest_size, p.manifest_crc32c));
            match self.read_manifest(&id, recorded).await {
                Ok(m) if kinds.contains(&m.kind) => candidates.push(m),
                Ok(_) => {}
                Err(e) => failures.push((id.to_string(), e.to_string())),
            }
        }
        if candidates.is_empty() && failures.is_empty() {
            return Err(CkptError::NoCheckpoint {
                root: self.describe(),
            });
        }
        candidates.sort_by(|a, b| (b.step, &b.id).cmp(&(a.step, &a.id)));
        for m in candidates {
            match self.verify_files(&m, 2).await {
                Ok(()) => return Ok(m),
                Err(e) if e.is_corruption() || matches!(e, CkptError::NotFound { .. }) => {
                    failures.push((m.id.to_string(), e.to_string()))
                }
                Err(e) => return Err(e),
            }
        }
        Err(CkptError::NoIntactCheckpoint {
            root: self.describe(),
            failures,
        })
    }

    /// Remove every object of checkpoint `id`, manifest first so that a partly deleted
    /// checkpoint is never a candidate. Does not touch `CURRENT`.
    pub async fn delete_checkpoint(&self, id: &CheckpointId) -> Result<()> {
        self.store.delete(&self.manifest_key(id)).await?;
        let dir = self.checkpoint_dir(id);
        for meta in self.store.list(Some(&dir)).await? {
            self.store.delete(&meta.key).await?;
        }
        Ok(())
    }
}
