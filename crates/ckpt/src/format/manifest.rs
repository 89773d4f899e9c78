//! Manifests (`MANI`, version 1): what one checkpoint holds.
//!
//! Header body (after the payload length): one reserved u32 (0). Payload: the [`Manifest`] as
//! JSON. JSON because manifests are small, read by people during incidents, and grow fields
//! over time; the frame's checksums protect it like any other file.
//!
//! A manifest lists every file of its checkpoint with its size and checksums, the step,
//! the kind (full, delta, merged), the training data position to resume from, the parent
//! checkpoints it depends on (its lineage, DECK §3.3 and §4.3: a delta depends on the full or
//! merged checkpoint below it), and per server the shape of what it saved.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use ftrec_core::{RowId, RowLayout, ServerId, TableId};
use serde::{Deserialize, Serialize};

use super::{parse_frame, EncodedFile, FileChecksums, FileKind, FrameBuilder};
use crate::error::{CkptError, Result};
use crate::key::{check_segment, Key};

/// Name of a checkpoint; a valid key segment (it names the checkpoint's directory).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CheckpointId(String);

impl CheckpointId {
    pub fn new(s: impl Into<String>) -> Result<Self> {
        let s = s.into();
        check_segment(&s, &s)?;
        Ok(CheckpointId(s))
    }

    /// The conventional id `<step, 20 digits>-<kind>`, which sorts by step.
    pub fn for_step(step: u64, kind: CheckpointKind) -> Self {
        CheckpointId(format!("{step:020}-{}", kind.name()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for CheckpointId {
    type Error = CkptError;
    fn try_from(s: String) -> Result<Self> {
        CheckpointId::new(s)
    }
}

impl From<CheckpointId> for String {
    fn from(id: CheckpointId) -> String {
        id.0
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// What a checkpoint holds relative to its parents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// Every row and every dense block: restorable alone.
    Full,
    /// The rows touched since the parent (DECK §3.1).
    Delta,
    /// Several consecutive deltas folded into one (DECK §3.3).
    Merged,
}

impl CheckpointKind {
    pub fn name(self) -> &'static str {
        match self {
            CheckpointKind::Full => "full",
            CheckpointKind::Delta => "delta",
            CheckpointKind::Merged => "merged",
        }
    }
}

/// How an incremental piece relates to its base (see `crate::incr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PieceScheme {
    /// Naive incremental: the rows touched since the previous checkpoint; a restore replays
    /// every piece since the base, oldest first.
    Incremental,
    /// Check-N-Run differential: every row touched since the base; a restore reads the base
    /// and the newest differential.
    Differential,
    /// IncrCP: the rows touched since the previous checkpoint, decomposed into chunks of a 2-D
    /// list (row ranges x time) that restores read without duplicates.
    ChunkList,
}

impl PieceScheme {
    pub fn name(self) -> &'static str {
        match self {
            PieceScheme::Incremental => "incremental",
            PieceScheme::Differential => "differential",
            PieceScheme::ChunkList => "chunk_list",
        }
    }
}

/// Where the training data stream stands at the checkpoint, as the data reader defines it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum DataPosition {
    #[default]
    None,
    /// Opaque bytes (stored as hex).
    Bytes(#[serde(with = "hex_bytes")] Vec<u8>),
    /// A JSON value.
    Json(serde_json::Value),
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        s.serialize_str(&hex)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        if s.len() % 2 != 0 || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(serde::de::Error::custom(
                "expected an even number of hex digits",
            ));
        }
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(serde::de::Error::custom))
            .collect()
    }
}

/// One table shard as saved by one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableInfo {
    pub table: TableId,
    /// Rows this server saved for the table.
    pub rows: u64,
    pub layout: RowLayout,
}

/// The dense block range saved by one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenseInfo {
    pub first_block: u64,
    pub blocks: u64,
    pub values: u64,
    pub state_per_block: u32,
}

/// What one server saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub server: ServerId,
    pub tables: Vec<TableInfo>,
    pub dense: Option<DenseInfo>,
}

/// What a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FileContent {
    Rows {
        server: ServerId,
        table: TableId,
        rows: u64,
        first_row: RowId,
        last_row: RowId,
    },
    Dense {
        server: ServerId,
        first_block: u64,
        blocks: u64,
    },
    /// Chunks of rows of several tables and columns in one file (`BNDL`).
    Bundle {
        server: ServerId,
        sections: u64,
        rows: u64,
    },
    /// Embedding rows of one table quantized to `bits` bits per value (`QROW`).
    QuantRows {
        server: ServerId,
        table: TableId,
        rows: u64,
        first_row: RowId,
        last_row: RowId,
        bits: u8,
    },
    /// One server's record of an incremental piece (`PIDX`).
    PieceIndex {
        server: ServerId,
        scheme: PieceScheme,
        column: u32,
    },
}

impl FileContent {
    /// The server that wrote the file.
    pub fn server(&self) -> ServerId {
        match *self {
            FileContent::Rows { server, .. }
            | FileContent::Dense { server, .. }
            | FileContent::Bundle { server, .. }
            | FileContent::QuantRows { server, .. }
            | FileContent::PieceIndex { server, .. } => server,
        }
    }
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Path relative to the checkpoint's directory.
    pub path: String,
    pub size: u64,
    /// The file's header and payload crc32c.
    pub crc32c: FileChecksums,
    pub content: FileContent,
}

/// Everything a reader needs to find, verify and load one checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub id: CheckpointId,
    pub kind: CheckpointKind,
    /// Training step the checkpoint reflects (every update of steps `< step` is in it).
    pub step: u64,
    /// Checkpoints this one depends on (empty for a full checkpoint).
    pub parents: Vec<CheckpointId>,
    pub data_position: DataPosition,
    /// One entry per server that contributed, sorted by server.
    pub shards: Vec<ShardInfo>,
    /// Every file, sorted by path.
    pub files: Vec<FileInfo>,
    /// Room for later writers (delta coverage, merge layers) without a format change.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Manifest {
    /// Check that the manifest agrees with itself; `file` names it in errors.
    pub fn validate(&self, file: &str) -> Result<()> {
        let bad = |reason: String| CkptError::Corrupt {
            file: file.to_string(),
            reason,
        };
        if self.kind == CheckpointKind::Full && !self.parents.is_empty() {
            return Err(bad("a full checkpoint cannot have parents".into()));
        }
        if self.kind != CheckpointKind::Full && self.parents.is_empty() {
            return Err(bad(format!(
                "a {} checkpoint needs a parent",
                self.kind.name()
            )));
        }
        // Per-server shapes.
        let mut tables: BTreeMap<(ServerId, TableId), TableInfo> = BTreeMap::new();
        let mut dense: BTreeMap<ServerId, DenseInfo> = BTreeMap::new();
        let mut servers = BTreeSet::new();
        for s in &self.shards {
            if !servers.insert(s.server) {
                return Err(bad(format!("server {} listed twice", s.server.0)));
            }
            for t in &s.tables {
                super::stored_layout(
                    file,
                    &format!("table {}", t.table.0),
                    t.layout.dim,
                    t.layout.state_words,
                )?;
                if tables.insert((s.server, t.table), *t).is_some() {
                    return Err(bad(format!(
                        "table {} listed twice for server {}",
                        t.table.0, s.server.0
                    )));
                }
            }
            if let Some(d) = s.dense {
                dense.insert(s.server, d);
            }
        }
        // Files: unique valid paths, and they add up to the shapes.
        let add_rows = |seen: &mut BTreeMap<(ServerId, TableId), u64>,
                        key: (ServerId, TableId),
                        rows: u64,
                        path: &str| {
            let n = seen.entry(key).or_default();
            *n = n.checked_add(rows).ok_or_else(|| {
                bad(format!(
                    "file {path}: table {} of server {} holds more than 2^64 rows",
                    key.1 .0, key.0 .0
                ))
            })?;
            Ok::<(), CkptError>(())
        };
        let mut paths = BTreeSet::new();
        let mut rows_seen: BTreeMap<(ServerId, TableId), u64> = BTreeMap::new();
        let mut blocks_seen: BTreeMap<ServerId, u64> = BTreeMap::new();
        for f in &self.files {
            Key::new(f.path.as_str()).map_err(|e| bad(format!("file path: {e}")))?;
            if !paths.insert(f.path.as_str()) {
                return Err(bad(format!("file {} listed twice", f.path)));
            }
            match f.content {
                FileContent::Rows {
                    server,
                    table,
                    rows,
                    ..
                } => {
                    if !tables.contains_key(&(server, table)) {
                        return Err(bad(format!(
                            "file {} holds table {} of server {}, which the shards do not list",
                            f.path, table.0, server.0
                        )));
                    }
                    add_rows(&mut rows_seen, (server, table), rows, &f.path)?;
                }
                FileContent::QuantRows {
                    server,
                    table,
                    rows,
                    bits,
                    ..
                } => {
                    if !tables.contains_key(&(server, table)) {
                        return Err(bad(format!(
                            "file {} holds table {} of server {}, which the shards do not list",
                            f.path, table.0, server.0
                        )));
                    }
                    if bits != 8 && bits != 4 {
                        return Err(bad(format!("file {} has {bits}-bit rows", f.path)));
                    }
                    add_rows(&mut rows_seen, (server, table), rows, &f.path)?;
                }
                FileContent::Bundle { server, .. } | FileContent::PieceIndex { server, .. } => {
                    if !servers.contains(&server) {
                        return Err(bad(format!(
                            "file {} belongs to server {}, which the shards do not list",
                            f.path, server.0
                        )));
                    }
                }
                FileContent::Dense {
                    server,
                    first_block,
                    blocks,
                } => {
                    let Some(d) = dense.get(&server) else {
                        return Err(bad(format!(
                            "file {} holds dense blocks of server {}, which has none",
                            f.path, server.0
                        )));
                    };
                    let seen = blocks_seen.entry(server).or_default();
                    // Declared counts are untrusted: a sum that overflows is corruption.
                    let expected = d.first_block.checked_add(*seen);
                    if Some(first_block) != expected {
                        return Err(bad(format!(
                            "dense file {} starts at block {first_block}, expected {}",
                            f.path,
                            expected.map_or("a block past 2^64".into(), |e| e.to_string())
                        )));
                    }
                    *seen = seen.checked_add(blocks).ok_or_else(|| {
                        bad(format!(
                            "dense file {} ends past block 2^64 ({blocks} blocks)",
                            f.path
                        ))
                    })?;
                }
            }
        }
        let mut piece: Option<(PieceScheme, u32)> = None;
        for f in &self.files {
            let incremental = match f.content {
                FileContent::PieceIndex { scheme, column, .. } => {
                    if piece.is_some_and(|p| p != (scheme, column)) {
                        return Err(bad(format!(
                            "piece index {} says {} column {column}, another one {:?}",
                            f.path,
                            scheme.name(),
                            piece
                        )));
                    }
                    piece = Some((scheme, column));
                    true
                }
                FileContent::Bundle { .. } | FileContent::QuantRows { .. } => true,
                FileContent::Rows { .. } | FileContent::Dense { .. } => false,
            };
            if incremental && self.kind != CheckpointKind::Delta {
                return Err(bad(format!(
                    "a {} checkpoint cannot hold incremental file {}",
                    self.kind.name(),
                    f.path
                )));
            }
        }
        if self.kind == CheckpointKind::Full {
            for ((server, table), t) in &tables {
                let seen = rows_seen.get(&(*server, *table)).copied().unwrap_or(0);
                if seen != t.rows {
                    return Err(bad(format!(
                        "table {} of server {}: files hold {seen} rows, shard lists {}",
                        table.0, server.0, t.rows
                    )));
                }
            }
            for (server, d) in &dense {
                let seen = blocks_seen.get(server).copied().unwrap_or(0);
                if seen != d.blocks {
                    return Err(bad(format!(
                        "dense of server {}: files hold {seen} blocks, shard lists {}",
                        server.0, d.blocks
                    )));
                }
            }
        }
        Ok(())
    }

    /// The shard info of `server`.
    pub fn shard(&self, server: ServerId) -> Option<&ShardInfo> {
        self.shards.iter().find(|s| s.server == server)
    }

    /// Files of `server`, in manifest order (by path).
    pub fn files_of(&self, server: ServerId) -> impl Iterator<Item = &FileInfo> {
        self.files
            .iter()
            .filter(move |f| f.content.server() == server)
    }

    /// The piece index files of an incremental checkpoint (none for full, delta and merged
    /// checkpoints), with their scheme and column.
    pub fn pieces(&self) -> impl Iterator<Item = (&FileInfo, PieceScheme, u32)> {
        self.files.iter().filter_map(|f| match f.content {
            FileContent::PieceIndex { scheme, column, .. } => Some((f, scheme, column)),
            _ => None,
        })
    }

    /// The scheme of an incremental checkpoint (`None` if it has no piece index).
    pub fn piece_scheme(&self) -> Option<PieceScheme> {
        self.pieces().next().map(|(_, s, _)| s)
    }

    /// Total bytes of the checkpoint's data files.
    pub fn data_bytes(&self) -> u64 {
        // Sizes are as declared (a stored manifest may be damaged): saturate, never overflow.
        self.files
            .iter()
            .fold(0u64, |a, f| a.saturating_add(f.size))
    }

    /// Encode as a `MANI` file.
    pub fn encode(&self) -> Result<EncodedFile> {
        let json = serde_json::to_vec(self)
            .map_err(|e| CkptError::InvalidArgument(format!("manifest does not serialize: {e}")))?;
        let mut b = FrameBuilder::new(FileKind::Manifest, &0u32.to_le_bytes(), json.len() as u64);
        b.push(&json);
        Ok(b.finish())
    }

    /// Decode and validate a `MANI` file named `file`; also returns its checksums.
    pub fn decode(file: &str, data: &[u8]) -> Result<(Manifest, FileChecksums)> {
        let frame = parse_frame(file, FileKind::Manifest, data)?;
        let m: Manifest =
            serde_json::from_slice(frame.payload).map_err(|e| CkptError::Corrupt {
                file: file.to_string(),
                reason: format!("manifest JSON: {e}"),
            })?;
        m.validate(file)?;
        Ok((m, frame.checksums))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        let layout = RowLayout::new(4, 1);
        Manifest {
            id: CheckpointId::for_step(12, CheckpointKind::Full),
            kind: CheckpointKind::Full,
            step: 12,
            parents: vec![],
            data_position: DataPosition::Bytes(vec![0, 1, 0xab]),
            shards: vec![ShardInfo {
                server: ServerId(0),
                tables: vec![TableInfo {
                    table: TableId(2),
                    rows: 5,
                    layout,
                }],
                dense: Some(DenseInfo {
                    first_block: 0,
                    blocks: 1,
                    values: 10,
                    state_per_block: 1,
                }),
            }],
            files: vec![
                FileInfo {
                    path: "s0000/dense-000000.dense".into(),
                    size: 100,
                    crc32c: FileChecksums {
                        header: 7,
                        payload: 8,
                    },
                    content: FileContent::Dense {
                        server: ServerId(0),
                        first_block: 0,
                        blocks: 1,
                    },
                },
                FileInfo {
                    path: "s0000/t0002-000000.rows".into(),
                    size: 200,
                    crc32c: FileChecksums {
                        header: 9,
                        payload: 10,
                    },
                    content: FileContent::Rows {
                        server: ServerId(0),
                        table: TableId(2),
                        rows: 5,
                        first_row: 0,
                        last_row: 4,
                    },
                },
            ],
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn round_trip() {
        let m = sample();
        let f = m.encode().unwrap();
        let (back, crc) = Manifest::decode("MANIFEST", &f.bytes).unwrap();
        assert_eq!(back, m);
        assert_eq!(crc, f.checksums);
        let mut j = m.clone();
        j.data_position = DataPosition::Json(serde_json::json!({"epoch": 1, "offset": 77}));
        j.extra.insert("note".into(), serde_json::json!("x"));
        let (back, _) = Manifest::decode("M", &j.encode().unwrap().bytes).unwrap();
        assert_eq!(back, j);
    }

    #[test]
    fn ids_are_validated_and_sort_by_step() {
        assert!(CheckpointId::new("../x").is_err());
        assert!(CheckpointId::new("a/b").is_err());
        let a = CheckpointId::for_step(9, CheckpointKind::Full);
        let b = CheckpointId::for_step(10, CheckpointKind::Delta);
        assert!(a < b);
        assert_eq!(a.as_str(), "00000000000000000009-full");
    }

    #[test]
    fn inconsistent_manifests_are_refused() {
        let mut m = sample();
        m.files.pop();
        assert!(matches!(m.validate("M"), Err(CkptError::Corrupt { .. })));
        let mut m = sample();
        m.files[1].path = "../escape".into();
        assert!(matches!(m.validate("M"), Err(CkptError::Corrupt { .. })));
        let mut m = sample();
        m.parents.push(CheckpointId::new("p").unwrap());
        assert!(matches!(m.validate("M"), Err(CkptError::Corrupt { .. })));
        let mut m = sample();
        m.files[0].content = FileContent::Dense {
            server: ServerId(0),
            first_block: 3,
            blocks: 1,
        };
        assert!(matches!(m.validate("M"), Err(CkptError::Corrupt { .. })));
        // An invalid manifest is refused on decode too, naming the file.
        let mut m = sample();
        m.files.pop();
        let json = serde_json::to_vec(&m).unwrap();
        let mut b = FrameBuilder::new(FileKind::Manifest, &0u32.to_le_bytes(), json.len() as u64);
        b.push(&json);
        let err = Manifest::decode("ckpt/x/MANIFEST", &b.finish().bytes).unwrap_err();
        assert_eq!(err.file(), Some("ckpt/x/MANIFEST"));
    }

    #[test]
    fn flip_any_byte_or_truncate_is_an_error_naming_the_file() {
        let f = sample().encode().unwrap();
        for i in 0..f.bytes.len() {
            let mut d = f.bytes.to_vec();
            d[i] ^= 0x04;
            let err = Manifest::decode("MANIFEST", &d).unwrap_err();
            assert_eq!(err.file(), Some("MANIFEST"), "byte {i}: {err}");
        }
        for len in 0..f.bytes.len() {
            let err = Manifest::decode("MANIFEST", &f.bytes[..len]).unwrap_err();
            assert_eq!(err.file(), Some("MANIFEST"), "len {len}: {err}");
        }
    }
}
