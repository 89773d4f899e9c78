//! A server's whole shard as bytes, and full checkpoints made of them.
//!
//! Saving goes through the parameter server's own export RPCs (`export_rows`,
//! `export_dense`), loading through its import RPCs, so the server needs no file-system access
//! and no extra service: the coordinator pulls every server's shard **concurrently** and writes
//! one file per server, then commits the checkpoint by renaming its manifest into place last.
//! A checkpoint without a manifest was never committed and is never loaded.
//!
//! File layout of one shard (little endian): magic `FTRCSHD1`, server `u32`, servers `u32`,
//! step `u64`, tables `u32`; per table: id `u32`, first local row `u64`, words `u64`, the
//! words as `f32`; then the dense part: first block `u64`, values `u64` + `f32`s, state words
//! `u64` + `f32`s; last an xxh3-64 of every byte before it.

use std::path::{Path, PathBuf};

use ftrec_core::{ServerId, TableId};
use ftrec_data::Position;
use ftrec_ps::{dense_block_range, DenseBlock, PsService, RowBlock, ServerInfo};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::shard_server::write_atomic;
use crate::ClusterError;

const MAGIC: &[u8; 8] = b"FTRCSHD1";
/// Rows per export or import call, so that no single RPC carries a whole large table.
const ROWS_PER_CALL: u64 = 1 << 15;

/// Every row (values and optimizer state) and every dense block of one server.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardImage {
    pub server: u32,
    pub servers: u32,
    /// Steps applied to the model this image was taken from.
    pub step: u64,
    pub tables: Vec<RowBlock>,
    pub dense: DenseBlock,
}

fn dense_blocks_of(info: &ServerInfo) -> std::ops::Range<u64> {
    dense_block_range(info.dense_len, info.servers, info.server)
}

impl ShardImage {
    /// Take the whole shard of the server behind `client`.
    pub async fn export<S: PsService>(client: &S, step: u64) -> Result<ShardImage, ClusterError> {
        let info = client.info().await?;
        let mut tables = Vec::with_capacity(info.local_rows.len());
        for (t, &rows) in info.local_rows.iter().enumerate() {
            let mut block = RowBlock {
                table: TableId(t as u32),
                first_local: 0,
                data: Vec::new(),
            };
            let mut lo = 0;
            while lo < rows {
                let hi = (lo + ROWS_PER_CALL).min(rows);
                block
                    .data
                    .extend(client.export_rows(TableId(t as u32), lo..hi).await?.data);
                lo = hi;
            }
            tables.push(block);
        }
        let dense = client.export_dense(dense_blocks_of(&info)).await?;
        Ok(ShardImage {
            server: info.server.0,
            servers: info.servers,
            step,
            tables,
            dense,
        })
    }

    /// The initial shard of a server, as `build` makes it (reinitialisation from the seed).
    pub fn of_server(server: &ftrec_ps::Server) -> Result<ShardImage, ClusterError> {
        let info = server.info();
        let mut tables = Vec::new();
        for (t, &rows) in info.local_rows.iter().enumerate() {
            tables.push(server.export_rows(TableId(t as u32), 0..rows)?);
        }
        Ok(ShardImage {
            server: info.server.0,
            servers: info.servers,
            step: 0,
            tables,
            dense: server.export_dense(dense_blocks_of(&info))?,
        })
    }

    /// Overwrite the shard of the server behind `client` with this image; the server must be
    /// the same server of a cluster of the same size.
    pub async fn import<S: PsService>(&self, client: &S) -> Result<(), ClusterError> {
        let info = client.info().await?;
        if info.server != ServerId(self.server) || info.servers != self.servers {
            return Err(ClusterError::Checkpoint(format!(
                "the image of server {} of {} cannot be loaded into server {} of {}",
                self.server, self.servers, info.server.0, info.servers
            )));
        }
        let words = info.dim + info.state_words;
        for block in &self.tables {
            for (i, chunk) in block
                .data
                .chunks(ROWS_PER_CALL as usize * words.max(1))
                .enumerate()
            {
                client
                    .import_rows(RowBlock {
                        table: block.table,
                        first_local: block.first_local + (i as u64) * ROWS_PER_CALL,
                        data: chunk.to_vec(),
                    })
                    .await?;
            }
        }
        if !self.dense.state.is_empty() || !self.dense.values.is_empty() {
            client.import_dense(self.dense.clone()).await?;
        }
        Ok(())
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.server.to_le_bytes());
        out.extend_from_slice(&self.servers.to_le_bytes());
        out.extend_from_slice(&self.step.to_le_bytes());
        out.extend_from_slice(&(self.tables.len() as u32).to_le_bytes());
        let put = |out: &mut Vec<u8>, v: &[f32]| {
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for x in v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
        for t in &self.tables {
            out.extend_from_slice(&t.table.0.to_le_bytes());
            out.extend_from_slice(&t.first_local.to_le_bytes());
            put(&mut out, &t.data);
        }
        out.extend_from_slice(&self.dense.first_block.to_le_bytes());
        put(&mut out, &self.dense.values);
        put(&mut out, &self.dense.state);
        let sum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Parse [`ShardImage::encode`]'s bytes; `what` names the source in errors.
    pub fn decode(bytes: &[u8], what: &str) -> Result<ShardImage, ClusterError> {
        let bad = |m: &str| ClusterError::Checkpoint(format!("{what}: {m}"));
        if bytes.len() < MAGIC.len() + 8 || &bytes[..8] != MAGIC {
            return Err(bad("not a shard image (bad magic)"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        let sum = u64::from_le_bytes(sum.try_into().map_err(|_| bad("truncated"))?);
        if xxhash_rust::xxh3::xxh3_64(body) != sum {
            return Err(bad("checksum mismatch (the file is corrupt or truncated)"));
        }
        let mut r = Reader {
            b: body,
            at: 8,
            what,
        };
        let server = r.u32()?;
        let servers = r.u32()?;
        let step = r.u64()?;
        let ntables = r.u32()?;
        let mut tables = Vec::new();
        for _ in 0..ntables {
            let table = TableId(r.u32()?);
            let first_local = r.u64()?;
            let data = r.floats()?;
            tables.push(RowBlock {
                table,
                first_local,
                data,
            });
        }
        let first_block = r.u64()?;
        let values = r.floats()?;
        let state = r.floats()?;
        if r.at != body.len() {
            return Err(bad("trailing bytes after the dense part"));
        }
        Ok(ShardImage {
            server,
            servers,
            step,
            tables,
            dense: DenseBlock {
                first_block,
                values,
                state,
            },
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    what: &'a str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ClusterError> {
        let s = self
            .at
            .checked_add(n)
            .and_then(|end| self.b.get(self.at..end))
            .ok_or_else(|| ClusterError::Checkpoint(format!("{}: truncated", self.what)))?;
        self.at += n;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32, ClusterError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, ClusterError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn floats(&mut self) -> Result<Vec<f32>, ClusterError> {
        let n = self.u64()?;
        let bytes = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| ClusterError::Checkpoint(format!("{}: bad length {n}", self.what)))?;
        Ok(self
            .take(bytes)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// The commit record of a full checkpoint, written last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// Steps in the saved model (`batches / workers`, rounded down in asynchronous mode).
    pub step: u64,
    /// Global batches applied to the saved model.
    pub batches: u64,
    pub servers: u32,
    pub preset: String,
    pub seed: u64,
    /// Where the training stream stands: the next global batch starts here.
    pub position: Position,
    pub files: Vec<ManifestFile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestFile {
    pub server: u32,
    pub file: String,
    pub bytes: u64,
}

/// What a save wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveOutcome {
    /// The checkpoint's id: its directory name under the checkpoint root.
    pub id: String,
    pub bytes: u64,
}

/// The directory of checkpoint `id`.
pub fn checkpoint_path(root: &Path, id: &str) -> PathBuf {
    root.join(id)
}

const MANIFEST: &str = "MANIFEST.json";

/// Save every server's shard at `step` concurrently (one task per server: export, encode,
/// write, fsync), then commit by writing the manifest atomically.
pub async fn save_full<S: PsService + Clone + 'static>(
    servers: &[S],
    root: &Path,
    manifest: Manifest,
) -> Result<SaveOutcome, ClusterError> {
    let id = format!("ckpt-{:010}", manifest.batches);
    let dir = checkpoint_path(root, &id);
    let io = |what: String| move |e: std::io::Error| ClusterError::Io { what, source: e };
    // A leftover of an uncommitted save at the same step is replaced.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let step = manifest.step;
    let mut set = JoinSet::new();
    for (i, s) in servers.iter().enumerate() {
        let s = s.clone();
        let path = dir.join(format!("server-{i}.shard"));
        set.spawn(async move {
            let image = ShardImage::export(&s, step).await?;
            let bytes = image.encode();
            let n = bytes.len() as u64;
            tokio::task::spawn_blocking(move || {
                use std::io::Write;
                let mut f = std::fs::File::create(&path)
                    .map_err(io(format!("creating {}", path.display())))?;
                f.write_all(&bytes)
                    .and_then(|_| f.sync_all())
                    .map_err(io(format!("writing {}", path.display())))?;
                Ok::<_, ClusterError>(ManifestFile {
                    server: i as u32,
                    file: path
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    bytes: n,
                })
            })
            .await
            .map_err(|e| ClusterError::Checkpoint(format!("save task failed: {e}")))?
        });
    }
    let mut files = Vec::new();
    let mut first_err = None;
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(f)) => files.push(f),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(ClusterError::Checkpoint(format!("save task failed: {e}")));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    files.sort_by_key(|f| f.server);
    let bytes = files.iter().map(|f| f.bytes).sum();
    let manifest = Manifest { files, ..manifest };
    let text = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| ClusterError::Checkpoint(format!("encoding the manifest: {e}")))?;
    write_atomic(&dir.join(MANIFEST), &text)?;
    Ok(SaveOutcome { id, bytes })
}

/// The committed manifest of checkpoint `id`.
pub fn read_manifest(root: &Path, id: &str) -> Result<Manifest, ClusterError> {
    let path = checkpoint_path(root, id).join(MANIFEST);
    let text = std::fs::read(&path).map_err(|e| ClusterError::Io {
        what: format!(
            "reading {} (checkpoint {id} is not committed?)",
            path.display()
        ),
        source: e,
    })?;
    serde_json::from_slice(&text)
        .map_err(|e| ClusterError::Checkpoint(format!("{}: {e}", path.display())))
}

/// Load committed checkpoint `id` into every server, concurrently.
pub async fn load_full<S: PsService + Clone + 'static>(
    servers: &[S],
    root: &Path,
    id: &str,
) -> Result<Manifest, ClusterError> {
    let manifest = read_manifest(root, id)?;
    if manifest.servers as usize != servers.len() || manifest.files.len() != servers.len() {
        return Err(ClusterError::Checkpoint(format!(
            "checkpoint {id} holds {} shards of {} servers; the cluster has {} servers",
            manifest.files.len(),
            manifest.servers,
            servers.len()
        )));
    }
    let dir = checkpoint_path(root, id);
    let mut set = JoinSet::new();
    for f in &manifest.files {
        let s = servers[f.server as usize].clone();
        let path = dir.join(&f.file);
        let expect = f.server;
        set.spawn(async move {
            let bytes = std::fs::read(&path).map_err(|e| ClusterError::Io {
                what: format!("reading {}", path.display()),
                source: e,
            })?;
            let image = ShardImage::decode(&bytes, &path.display().to_string())?;
            if image.server != expect {
                return Err(ClusterError::Checkpoint(format!(
                    "{} holds server {}, the manifest says {expect}",
                    path.display(),
                    image.server
                )));
            }
            image.import(&s).await
        });
    }
    while let Some(r) = set.join_next().await {
        r.map_err(|e| ClusterError::Checkpoint(format!("load task failed: {e}")))??;
    }
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build_server, ServerSpec};
    use ftrec_core::Preset;
    use ftrec_ps::{InProcessClient, SharedServer, Update};

    fn server(id: u32, servers: u32) -> InProcessClient {
        let spec = ServerSpec::from_preset(&Preset::tiny(), id, servers, 5).unwrap();
        InProcessClient::new(SharedServer::new(build_server(&spec).unwrap()))
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_trained_shard_survives_export_encode_decode_import() {
        block_on(async {
            let a = server(1, 2);
            // Train it a little so the image differs from the initial state.
            let info = a.info().await.unwrap();
            let row = ftrec_core::ShardMap::new(2)
                .unwrap()
                .global_row(TableId(3), ServerId(1), 0);
            let dense_lo = info.dense_range.start;
            let n = (info.dense_range.end - dense_lo) as usize;
            a.push(
                Update::new()
                    .with_sparse(TableId(3), vec![row], vec![0.25; info.dim])
                    .with_dense(dense_lo, vec![0.5; n]),
            )
            .await
            .unwrap();
            let image = ShardImage::export(&a, 7).await.unwrap();
            let bytes = image.encode();
            let back = ShardImage::decode(&bytes, "test").unwrap();
            assert_eq!(back, image);

            let b = server(1, 2);
            assert_ne!(b.digest().await.unwrap(), a.digest().await.unwrap());
            back.import(&b).await.unwrap();
            assert_eq!(b.digest().await.unwrap(), a.digest().await.unwrap());

            // The image of server 1 does not fit server 0.
            let other = server(0, 2);
            assert!(matches!(
                back.import(&other).await,
                Err(ClusterError::Checkpoint(m)) if m.contains("server 1 of 2")
            ));
        });
    }

    #[test]
    fn corrupt_and_truncated_images_are_refused() {
        let s = build_server(&ServerSpec::from_preset(&Preset::tiny(), 0, 1, 5).unwrap()).unwrap();
        let bytes = ShardImage::of_server(&s).unwrap().encode();
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert!(matches!(
            ShardImage::decode(&flipped, "f"),
            Err(ClusterError::Checkpoint(m)) if m.contains("checksum")
        ));
        assert!(ShardImage::decode(&bytes[..bytes.len() / 2], "f").is_err());
        assert!(matches!(
            ShardImage::decode(b"not an image at all", "f"),
            Err(ClusterError::Checkpoint(m)) if m.contains("magic")
        ));
    }

    #[test]
    fn an_uncommitted_checkpoint_is_not_loadable() {
        let dir = tempfile::tempdir().unwrap();
        let id = "ckpt-00000003";
        std::fs::create_dir_all(dir.path().join(id)).unwrap();
        let e = read_manifest(dir.path(), id).unwrap_err();
        assert!(e.to_string().contains("not committed"), "{e}");
    }
}
