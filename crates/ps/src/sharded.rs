//! A worker's view of all the servers at once: routes rows by the shard map and dense values
//! by the servers' dense ranges, and merges the replies.
//!
//! Calls to different servers run concurrently. A push or stage that several servers take is
//! not atomic across them: each server applies its share or refuses it on its own, and the
//! first refusal is returned.

use std::ops::Range;

use ftrec_core::{ModelDigest, RowId, ServerId, ShardMap, TableId};
use tokio::task::JoinSet;

use crate::update::{
    dedup_requests, ApplyReport, DenseGrads, PulledRows, RowRequest, ServerInfo, SparseGrads,
    Update,
};
use crate::{PsError, PsService};

/// Clients of servers `0..n`, in server order.
#[derive(Debug, Clone)]
pub struct ShardedClient<S> {
    servers: Vec<S>,
    infos: Vec<ServerInfo>,
    map: ShardMap,
}

impl<S: PsService + Clone + 'static> ShardedClient<S> {
    /// Check that `servers[i]` is server `i` of one consistent layout.
    pub async fn new(servers: Vec<S>) -> Result<Self, PsError> {
        let n = servers.len() as u32;
        let map = ShardMap::new(n)?;
        let mut infos = Vec::with_capacity(servers.len());
        for (i, s) in servers.iter().enumerate() {
            let info = s.info().await?;
            let bad = |what: String| {
                Err(PsError::InvalidConfig(format!(
                    "server at position {i} does not fit the layout: {what}"
                )))
            };
            if info.server != ServerId(i as u32) || info.servers != n {
                return bad(format!(
                    "it is server {} of {}, expected server {i} of {n}",
                    info.server.0, info.servers
                ));
            }
            if let Some(first) = infos.first() {
                let first: &ServerInfo = first;
                if info.dim != first.dim
                    || info.table_rows != first.table_rows
                    || info.dense_len != first.dense_len
                {
                    return bad("its tables, dim or dense length differ from server 0's".into());
                }
            }
            infos.push(info);
        }
        Ok(ShardedClient {
            servers,
            infos,
            map,
        })
    }

    pub fn servers(&self) -> &[S] {
        &self.servers
    }

    pub fn infos(&self) -> &[ServerInfo] {
        &self.infos
    }

    pub fn shard_map(&self) -> ShardMap {
        self.map
    }

    pub fn dim(&self) -> usize {
        self.infos.first().map_or(0, |i| i.dim)
    }

    /// Run `f` on every server whose share is `Some`, concurrently; results by server index.
    async fn on_each<T, Fut>(
        &self,
        shares: Vec<Option<T>>,
        f: impl Fn(S, T) -> Fut,
    ) -> Result<Vec<(usize, Fut::Output)>, PsError>
    where
        T: Send + 'static,
        Fut: std::future::Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        let mut set = JoinSet::new();
        for (i, share) in shares.into_iter().enumerate() {
            if let Some(share) = share {
                let fut = f(self.servers[i].clone(), share);
                set.spawn(async move { (i, fut.await) });
            }
        }
        let mut out = Vec::with_capacity(set.len());
        while let Some(r) = set.join_next().await {
            out.push(r.map_err(|e| PsError::Internal(format!("server call task failed: {e}")))?);
        }
        out.sort_by_key(|(i, _)| *i);
        Ok(out)
    }

    /// Values of the requested rows from their owners, one [`PulledRows`] per table (tables in
    /// order, rows sorted and distinct).
    pub async fn pull_rows(&self, requests: &[RowRequest]) -> Result<Vec<PulledRows>, PsError> {
        let parts = dedup_requests(requests);
        let n = self.servers.len();
        let mut shares: Vec<Vec<RowRequest>> = vec![Vec::new(); n];
        for p in &parts {
            let mut per: Vec<Vec<RowId>> = vec![Vec::new(); n];
            for &r in &p.rows {
                per[self.map.owner(p.table, r).0 as usize].push(r);
            }
            for (s, rows) in per.into_iter().enumerate() {
                if !rows.is_empty() {
                    shares[s].push(RowRequest {
                        table: p.table,
                        rows,
                    });
                }
            }
        }
        let shares = shares
            .into_iter()
            .map(|s| (!s.is_empty()).then_some(s))
            .collect();
        let replies = self
            .on_each(shares, |s, req| async move { s.pull_rows(req).await })
            .await?;
        let dim = self.dim();
        let mut merged: std::collections::BTreeMap<TableId, Vec<(RowId, Vec<f32>)>> =
            Default::default();
        for (_, reply) in replies {
            for pulled in reply? {
                let entry = merged.entry(pulled.table).or_default();
                for (i, &r) in pulled.rows.iter().enumerate() {
                    entry.push((r, pulled.values[i * dim..(i + 1) * dim].to_vec()));
                }
            }
        }
        Ok(merged
            .into_iter()
            .map(|(table, mut rows)| {
                rows.sort_unstable_by_key(|(r, _)| *r);
                let mut out = PulledRows {
                    table,
                    rows: Vec::with_capacity(rows.len()),
                    values: Vec::with_capacity(rows.len() * dim),
                    dim,
                };
                for (r, v) in rows {
                    out.rows.push(r);
                    out.values.extend_from_slice(&v);
                }
                out
            })
            .collect())
    }

    /// The whole dense vector, assembled from every server's range.
    pub async fn pull_dense(&self) -> Result<Vec<f32>, PsError> {
        let shares = self
            .infos
            .iter()
            .map(|i| Some(i.dense_range.clone()))
            .collect();
        let replies = self
            .on_each(
                shares,
                |s, r: Range<u64>| async move { s.pull_dense(r).await },
            )
            .await?;
        let mut out = Vec::new();
        for (_, r) in replies {
            out.extend(r?);
        }
        Ok(out)
    }

    /// Cut an update into one share per server: rows by owner, dense parts at the servers'
    /// range boundaries (which are block boundaries).
    pub fn split_update(&self, update: &Update) -> Vec<Update> {
        let n = self.servers.len();
        let dim = self.dim();
        let mut out = vec![Update::new(); n];
        for part in &update.sparse {
            if part.grads.len() != part.rows.len() * dim {
                // Lengths that disagree cannot be routed row by row; let server 0 name it.
                out[0].sparse.push(part.clone());
                continue;
            }
            let mut per: Vec<SparseGrads> = (0..n)
                .map(|_| SparseGrads {
                    table: part.table,
                    rows: Vec::new(),
                    grads: Vec::new(),
                })
                .collect();
            for (i, &r) in part.rows.iter().enumerate() {
                let s = &mut per[self.map.owner(part.table, r).0 as usize];
                s.rows.push(r);
                s.grads
                    .extend_from_slice(&part.grads[i * dim..(i + 1) * dim]);
            }
            for (s, p) in per.into_iter().enumerate() {
                if !p.rows.is_empty() {
                    out[s].sparse.push(p);
                }
            }
        }
        for part in &update.dense {
            let lo = part.offset;
            let hi = lo.saturating_add(part.grads.len() as u64);
            let mut placed = false;
            for (s, info) in self.infos.iter().enumerate() {
                let r = &info.dense_range;
                let (a, b) = (lo.max(r.start), hi.min(r.end));
                if a < b {
                    out[s].dense.push(DenseGrads {
                        offset: a,
                        grads: part.grads[(a - lo) as usize..(b - lo) as usize].to_vec(),
                    });
                    placed = true;
                }
            }
            if !placed {
                // Outside every range (or empty): server 0 names the problem.
                out[0].dense.push(part.clone());
            }
        }
        out
    }

    /// Push each server its share of `update` (servers with an empty share are skipped).
    pub async fn push(&self, update: &Update) -> Result<ApplyReport, PsError> {
        self.push_shares(self.split_update(update)).await
    }

    /// [`ShardedClient::push`] of an update already split ([`ShardedClient::split_update`]):
    /// share `i` to server `i`, empty ones not sent.
    pub async fn push_shares(&self, shares: Vec<Update>) -> Result<ApplyReport, PsError> {
        let shares = shares
            .into_iter()
            .map(|u| (!u.is_empty()).then_some(u))
            .collect();
        let replies = self
            .on_each(shares, |s, u| async move { s.push(u).await })
            .await?;
        let mut total = ApplyReport::default();
        for (_, r) in replies {
            let r = r?;
            total.rows_updated += r.rows_updated;
            total.dense_blocks_updated += r.dense_blocks_updated;
        }
        Ok(total)
    }

    /// Stage `worker`'s contribution to `step` on every server (an empty share where the
    /// worker touched nothing), so that every server commits the same worker list.
    pub async fn stage_step(&self, step: u64, worker: u32, update: &Update) -> Result<(), PsError> {
        self.stage_shares(step, worker, self.split_update(update))
            .await
    }

    /// [`ShardedClient::stage_step`] of an update already split
    /// ([`ShardedClient::split_update`]): share `i` to server `i`, every one sent.
    pub async fn stage_shares(
        &self,
        step: u64,
        worker: u32,
        shares: Vec<Update>,
    ) -> Result<(), PsError> {
        let shares = shares.into_iter().map(Some).collect();
        let replies = self
            .on_each(shares, move |s, u| async move {
                s.stage_step(step, worker, u).await
            })
            .await?;
        for (_, r) in replies {
            r?;
        }
        Ok(())
    }

    /// Commit `step` on every server with the same worker order.
    pub async fn commit_step(&self, step: u64, workers: &[u32]) -> Result<ApplyReport, PsError> {
        let shares = vec![Some(workers.to_vec()); self.servers.len()];
        let replies = self
            .on_each(
                shares,
                move |s, w| async move { s.commit_step(step, w).await },
            )
            .await?;
        let mut total = ApplyReport::default();
        for (_, r) in replies {
            let r = r?;
            total.rows_updated += r.rows_updated;
            total.dense_blocks_updated += r.dense_blocks_updated;
        }
        Ok(total)
    }

    /// Abort `step` on every server; returns the contributions dropped in all.
    pub async fn abort_step(&self, step: u64) -> Result<usize, PsError> {
        let shares = vec![Some(()); self.servers.len()];
        let replies = self
            .on_each(shares, move |s, ()| async move { s.abort_step(step).await })
            .await?;
        let mut total = 0;
        for (_, r) in replies {
            total += r?;
        }
        Ok(total)
    }

    /// The model digest: every server's part, merged.
    pub async fn digest(&self) -> Result<ModelDigest, PsError> {
        let shares = vec![Some(()); self.servers.len()];
        let replies = self
            .on_each(shares, |s, ()| async move { s.digest().await })
            .await?;
        let mut d = ModelDigest::new();
        for (_, r) in replies {
            d.merge(&r?);
        }
        Ok(d)
    }
}
