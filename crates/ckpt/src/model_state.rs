//! One committed state of any store, rebuilt in memory as the whole model: every table with its
//! rows in global order, and the dense parameters of every server's block range laid end to end.
//!
//! It reuses the restores the servers run: a DECK or CPR lineage (full + merged + deltas, or
//! prioritized saves) is rebuilt per saved server by [`deck::restore_chain`], an incremental
//! store (IncrCP, naive incremental, Check-N-Run) by [`incr::restore_all`]. The per-server shards
//! are then laid out by the store's [`ShardMap`] into global tables, one table at a time, each
//! server's part dropped once copied: the peak is the model plus one table.
//!
//! The restore registers as a reader of the checkpoints it reads ([`crate::lease`]), so a
//! job's garbage collection running meanwhile keeps them; a state that a collection is already
//! deleting is selected again (the head moved on). A store this process cannot write to (read-only
//! credentials) is read without a registration.
//!
//! What a store says about the model's shape is what its manifests hold (tables, rows, row
//! layout, dense values and state width, servers); the preset, seed and optimizer kinds are not
//! in it and are the caller's to supply and check against this.

use ftrec_core::{EmbeddingTable, RowLayout, ServerId, ShardMap, TableId, DENSE_BLOCK};

use crate::checkpoint::Checkpoints;
use crate::deck::{self, RestoreAt};
use crate::error::{CkptError, Result};
use crate::format::{CheckpointId, Manifest};
use crate::incr::{self, MemShard};

/// The whole model of one committed state.
#[derive(Debug)]
pub struct ModelState {
    /// The manifest of the state restored (its step, id and data position).
    pub manifest: Manifest,
    /// The checkpoints read, oldest first (a full, then deltas, merged checkpoints or pieces).
    pub chain: Vec<CheckpointId>,
    /// Servers that saved the state.
    pub servers: u32,
    /// Table `t` at index `t`, rows in global order, each row values then optimizer state.
    pub tables: Vec<EmbeddingTable>,
    /// Every dense value, in the model's flat order.
    pub dense_values: Vec<f32>,
    /// The dense optimizer state, [`DENSE_BLOCK`] values to one slot of `dense_state_per_block`
    /// words.
    pub dense_state: Vec<f32>,
    pub dense_state_per_block: usize,
}

impl ModelState {
    /// Step of the state: every update of the steps before it is in it.
    pub fn step(&self) -> u64 {
        self.manifest.step
    }

    /// The row layout of the tables (the same for every table).
    pub fn layout(&self) -> Option<RowLayout> {
        self.tables.first().map(|t| t.layout())
    }

    /// Rows of every table, in table order.
    pub fn table_rows(&self) -> Vec<u64> {
        self.tables.iter().map(|t| t.rows()).collect()
    }
}

/// Which state `at` names, checked to be at exactly `step` when `at` is a step: the newest
/// state at or before it otherwise, which is refused with the step it has.
fn check_step(at: &RestoreAt, m: &Manifest) -> Result<()> {
    if let RestoreAt::Step(s) = at {
        if m.step != *s {
            return Err(CkptError::InvalidArgument(format!(
                "no checkpoint at step {s} (the newest before it is {} at step {})",
                m.id, m.step
            )));
        }
    }
    Ok(())
}

/// Rebuild the state `at` names (`CURRENT`, an id, or exactly a step) as the whole model, every
/// file read verified. Holds the whole model in memory.
pub async fn restore_model(ckpts: &Checkpoints, at: &RestoreAt) -> Result<ModelState> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match restore_once(ckpts, at).await {
            // Collected between the selection and the registration: select again.
            Err(CkptError::BeingCollected { .. } | CkptError::NotFound { .. }) if attempt < 3 => {
                continue
            }
            r => return r,
        }
    }
}

/// Register as a reader of `ids` and keep the registration alive while `read` runs.
async fn while_registered<T>(
    ckpts: &Checkpoints,
    ids: &[CheckpointId],
    read: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    use crate::lease::ReaderLease;
    let ttl = std::time::Duration::from_secs(120);
    let lease = match ReaderLease::register(ckpts, "restore", ids, ttl).await {
        Ok(l) => l,
        Err(e @ CkptError::BeingCollected { .. }) => return Err(e),
        // Read-only access: read unregistered.
        Err(_) => return read.await,
    };
    // The registration might have come after the sweep that deleted a manifest: check that
    // every checkpoint is still there now that any later sweep sees the registration.
    for id in ids {
        if let Err(e) = ckpts.read_manifest(id, None).await {
            lease.release().await;
            return Err(e);
        }
    }
    let lease = std::sync::Arc::new(tokio::sync::Mutex::new(lease));
    let renewer = {
        let lease = lease.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                let _ = lease.lock().await.renew().await;
            }
        })
    };
    let out = read.await;
    renewer.abort();
    let _ = renewer.await;
    if let Ok(l) = std::sync::Arc::try_unwrap(lease) {
        l.into_inner().release().await;
    }
    out
}

async fn restore_once(ckpts: &Checkpoints, at: &RestoreAt) -> Result<ModelState> {
    let (manifest, chain, shards) = if incr::is_incremental_store(ckpts).await? {
        let chain = incr::select(ckpts, at).await?;
        let target = chain.target_manifest().clone();
        check_step(at, &target)?;
        let mut ids = vec![chain.base.id.clone()];
        ids.extend(chain.pieces.iter().map(|m| m.id.clone()));
        let shards = while_registered(ckpts, &ids, incr::restore_all(ckpts, &chain)).await?;
        (target, ids, shards)
    } else {
        let chain = deck::select_chain(ckpts, at, false).await?;
        let (full, last) = match (chain.first(), chain.last()) {
            (Some(f), Some(l)) => (f, l),
            _ => {
                return Err(CkptError::NoCheckpoint {
                    root: format!("{} store", ckpts.store().backend()),
                })
            }
        };
        check_step(at, last)?;
        let map = shard_map(full)?;
        let ids: Vec<CheckpointId> = chain.iter().map(|m| m.id.clone()).collect();
        let read = async {
            let mut shards = Vec::with_capacity(full.shards.len());
            for info in &full.shards {
                let mut s = MemShard::of(info, map);
                deck::restore_chain(ckpts, &chain, &mut s).await?;
                shards.push(s);
            }
            Ok(shards)
        };
        let shards = while_registered(ckpts, &ids, read).await?;
        (last.clone(), ids, shards)
    };
    assemble(manifest, chain, shards)
}

fn shard_map(full: &Manifest) -> Result<ShardMap> {
    ShardMap::new(full.shards.len() as u32).map_err(|e| CkptError::InvalidCheckpoint {
        id: full.id.to_string(),
        reason: format!("shard map: {e}"),
    })
}

/// Lay the servers' shards out as global tables and one dense vector.
fn assemble(
    manifest: Manifest,
    chain: Vec<CheckpointId>,
    mut shards: Vec<MemShard>,
) -> Result<ModelState> {
    let invalid = |reason: String| CkptError::InvalidCheckpoint {
        id: manifest.id.to_string(),
        reason,
    };
    shards.sort_by_key(|s| s.server);
    let n = shards.len() as u32;
    if n == 0 {
        return Err(invalid("holds no server's shard".into()));
    }
    for (i, s) in shards.iter().enumerate() {
        if s.server != ServerId(i as u32) {
            return Err(invalid(format!(
                "servers {:?} saved it; a model needs servers 0..{n}",
                shards.iter().map(|s| s.server.0).collect::<Vec<_>>()
            )));
        }
    }
    let map = ShardMap::new(n).map_err(|e| invalid(format!("shard map: {e}")))?;
    // Tables 0..T, each held by every server with one layout.
    let tables_n = shards[0].tables.len();
    let mut tables = Vec::with_capacity(tables_n);
    for t in 0..tables_n as u32 {
        let tid = TableId(t);
        let mut parts = Vec::with_capacity(shards.len());
        for s in shards.iter_mut() {
            let i = s
                .tables
                .iter()
                .position(|x| x.id == tid)
                .ok_or_else(|| invalid(format!("server {} saved no table {t}", s.server.0)))?;
            let layout = s.tables[i].layout();
            // Take the part out, so it is freed once copied.
            let part = std::mem::replace(&mut s.tables[i], EmbeddingTable::zeros(tid, 0, layout));
            parts.push((s.server, part));
        }
        let layout = parts[0].1.layout();
        let rows: u64 = parts.iter().map(|(_, p)| p.rows()).sum();
        let mut table = EmbeddingTable::zeros(tid, rows, layout);
        for (server, part) in parts {
            if part.layout() != layout {
                return Err(invalid(format!(
                    "table {t} is saved with layouts {layout:?} and {:?}",
                    part.layout()
                )));
            }
            if part.rows() != map.rows_on(tid, rows, server) {
                return Err(invalid(format!(
                    "server {} saved {} rows of table {t}, its share of {rows} rows is {}",
                    server.0,
                    part.rows(),
                    map.rows_on(tid, rows, server)
                )));
            }
            for local in 0..part.rows() {
                table
                    .row_mut(map.global_row(tid, server, local))
                    .copy_from_slice(part.row(local));
            }
        }
        tables.push(table);
    }
    if let Some(s) = shards.iter().find(|s| s.tables.len() != tables_n) {
        return Err(invalid(format!(
            "server {} saved {} tables, server 0 saved {tables_n}",
            s.server.0,
            s.tables.len()
        )));
    }
    // Dense ranges, end to end by first block.
    let mut ranges: Vec<(u64, Vec<f32>, Vec<f32>, usize)> =
        shards.into_iter().filter_map(|s| s.dense).collect();
    ranges.sort_by_key(|r| r.0);
    let spb = ranges.first().map_or(0, |r| r.3);
    let (mut values, mut state) = (Vec::new(), Vec::new());
    let mut next_block = 0u64;
    for (first, v, st, s) in ranges {
        if first != next_block || s != spb {
            return Err(invalid(format!(
                "dense range at block {first} with {s} state words per block does not follow \
                 block {next_block} with {spb}"
            )));
        }
        if values.len() % DENSE_BLOCK != 0 {
            return Err(invalid(format!(
                "a dense range before block {first} ends inside a block"
            )));
        }
        next_block += v.len().div_ceil(DENSE_BLOCK) as u64;
        values.extend_from_slice(&v);
        state.extend_from_slice(&st);
    }
    Ok(ModelState {
        manifest,
        chain,
        servers: n,
        tables,
        dense_values: values,
        dense_state: state,
        dense_state_per_block: spb,
    })
}
