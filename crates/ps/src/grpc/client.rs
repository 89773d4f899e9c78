//! Client side of the gRPC transport.

use std::ops::Range;

use crate::auth::{Auth, AuthChannel, ChannelError};
use crate::net::PeerAddr;

use super::proto::{self, parameter_server_client::ParameterServerClient};
use super::wire::{self, from_status};
use super::GrpcConfig;
use crate::update::{
    dedup_requests, ApplyReport, DenseBlock, PulledRows, RowBlock, RowRequest, ServerInfo, Update,
};
use crate::{PsError, PsService};
use ftrec_core::{ModelDigest, TableId};

/// A connection to one parameter server. Cheap to clone (clones share the connection).
#[derive(Debug, Clone)]
pub struct GrpcClient {
    client: ParameterServerClient<AuthChannel>,
    addr: String,
    config: GrpcConfig,
    dim: usize,
    /// Words per row (values and optimizer state) and state words per dense block: fixed for
    /// a server's lifetime, read once at connect.
    row_words: usize,
    dense_state_per_block: usize,
    /// This process's view of the live incarnations: a refusal naming it fences it.
    fences: crate::fence::Fences,
}

impl GrpcClient {
    /// Connect to the server at `addr` and read its shape (the row width sizes the chunks).
    /// Proves nothing: for a server without a token or job id ([`GrpcClient::connect_with`]).
    /// `addr` may be a name: it is looked up now and at every reconnect ([`crate::net`]).
    pub async fn connect(addr: impl Into<PeerAddr>, config: GrpcConfig) -> Result<Self, PsError> {
        Self::connect_with(addr, config, &Auth::none()).await
    }

    /// [`GrpcClient::connect`] with every request carrying `auth`'s token and job id.
    pub async fn connect_with(
        addr: impl Into<PeerAddr>,
        config: GrpcConfig,
        auth: &Auth,
    ) -> Result<Self, PsError> {
        config.validate()?;
        let addr = addr.into();
        let name = addr.to_string();
        let channel = auth.channel(&addr).await.map_err(|e| match e {
            ChannelError::Endpoint(e) => e,
            ChannelError::Connect(e) => {
                let chain = crate::tls::chain(&e);
                let hint = auth.connect_hint(&chain);
                PsError::Unavailable {
                    addr: name.clone(),
                    reason: format!("cannot connect: {chain}{hint}"),
                }
            }
        })?;
        let client = ParameterServerClient::with_interceptor(channel, auth.client())
            .max_decoding_message_size(config.max_message_bytes)
            .max_encoding_message_size(config.max_message_bytes);
        let mut c = GrpcClient {
            client,
            addr: name,
            config,
            dim: 0,
            row_words: 0,
            dense_state_per_block: 0,
            fences: auth.fences.clone(),
        };
        // The first call is where a TLS mismatch shows (the handshake, or the first frame).
        let info = c.info().await.map_err(|e| match e {
            PsError::Unavailable { addr, reason } => PsError::Unavailable {
                addr,
                reason: format!("{reason}{}", auth.connect_hint(&reason)),
            },
            // What a transport-level failure of the first call surfaces as, depending on
            // where the TLS mismatch breaks it (the handshake, or the first HTTP/2 frame:
            // `Internal: h2 protocol error`).
            PsError::Rpc { code, message }
                if matches!(
                    code.as_str(),
                    "Unknown" | "Unavailable" | "Internal" | "Cancelled"
                ) =>
            {
                PsError::Unavailable {
                    addr: c.addr.clone(),
                    reason: format!(
                        "the first call failed ({code}: {message}){}",
                        auth.connect_hint(&message)
                    ),
                }
            }
            other => other,
        })?;
        c.dim = info.dim;
        c.row_words = info.dim + info.state_words;
        c.dense_state_per_block = info.dense_state_per_block;
        Ok(c)
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn err(&self, s: tonic::Status) -> PsError {
        let e = from_status(&s, &self.addr);
        self.fences.learn(&e);
        e
    }

    /// Requests of at most about `chunk_bytes` each, on the request and on the reply side.
    fn pull_requests(&self, parts: &[RowRequest]) -> Vec<(proto::PullRowsRequest, Vec<usize>)> {
        let per_row = (self.dim * 4).max(8);
        let max_rows = (self.config.chunk_bytes / per_row).max(1);
        let mut out = Vec::new();
        let mut cur = proto::PullRowsRequest::default();
        let mut cur_parts = Vec::new();
        let mut cur_rows = 0;
        for (i, p) in parts.iter().enumerate() {
            let mut start = 0;
            while start < p.rows.len() {
                if cur_rows == max_rows {
                    out.push((std::mem::take(&mut cur), std::mem::take(&mut cur_parts)));
                    cur_rows = 0;
                }
                let n = (max_rows - cur_rows).min(p.rows.len() - start);
                cur.parts.push(proto::RowIds {
                    table: p.table.0,
                    rows: wire::u64s_to_bytes(&p.rows[start..start + n]),
                });
                cur_parts.push(i);
                cur_rows += n;
                start += n;
            }
        }
        if !cur.parts.is_empty() {
            out.push((cur, cur_parts));
        }
        out
    }
}

impl PsService for GrpcClient {
    async fn info(&self) -> Result<ServerInfo, PsError> {
        let reply = self
            .client
            .clone()
            .info(proto::InfoRequest {})
            .await
            .map_err(|s| self.err(s))?;
        Ok(wire::info_from_proto(reply.into_inner()))
    }

    async fn pull_rows(&self, requests: Vec<RowRequest>) -> Result<Vec<PulledRows>, PsError> {
        let parts = dedup_requests(&requests);
        let mut values: Vec<Vec<f32>> = parts
            .iter()
            .map(|p| Vec::with_capacity(p.rows.len() * self.dim))
            .collect();
        for (req, owners) in self.pull_requests(&parts) {
            let reply = self
                .client
                .clone()
                .pull_rows(req)
                .await
                .map_err(|s| self.err(s))?
                .into_inner();
            if reply.values.len() != owners.len() {
                return Err(PsError::MalformedRequest(format!(
                    "pull reply from {} has {} parts for {} requested",
                    self.addr,
                    reply.values.len(),
                    owners.len()
                )));
            }
            for (bytes, owner) in reply.values.iter().zip(owners) {
                let v = wire::bytes_to_f32s("pulled row values", bytes)?;
                values[owner].extend_from_slice(&v);
            }
        }
        parts
            .into_iter()
            .zip(values)
            .map(|(p, values)| {
                if values.len() != p.rows.len() * self.dim {
                    return Err(PsError::ShapeMismatch {
                        what: format!("pulled values of table {}", p.table.0),
                        expected: (p.rows.len() * self.dim) as u64,
                        got: values.len() as u64,
                    });
                }
                Ok(PulledRows {
                    table: p.table,
                    rows: p.rows,
                    values,
                    dim: self.dim,
                })
            })
            .collect()
    }

    async fn pull_dense(&self, range: Range<u64>) -> Result<Vec<f32>, PsError> {
        let step = (self.config.chunk_bytes / 4).max(1) as u64;
        let mut out = Vec::with_capacity(range.end.saturating_sub(range.start) as usize);
        let mut lo = range.start;
        loop {
            // An empty or reversed range still goes to the server once, which judges it.
            let hi = if range.end > lo {
                lo.saturating_add(step).min(range.end)
            } else {
                range.end
            };
            let reply = self
                .client
                .clone()
                .pull_dense(proto::PullDenseRequest { lo, hi })
                .await
                .map_err(|s| self.err(s))?
                .into_inner();
            out.extend(wire::bytes_to_f32s("pulled dense values", &reply.values)?);
            if hi >= range.end {
                break;
            }
            lo = hi;
        }
        Ok(out)
    }

    async fn push(&self, update: Update) -> Result<ApplyReport, PsError> {
        let chunks = wire::update_to_chunks(&update, self.dim, self.config.chunk_bytes);
        let reply = self
            .client
            .clone()
            .push(tokio_stream::iter(chunks))
            .await
            .map_err(|s| self.err(s))?
            .into_inner();
        Ok(ApplyReport {
            rows_updated: reply.rows_updated,
            dense_blocks_updated: reply.dense_blocks_updated,
        })
    }

    async fn stage_step(&self, step: u64, worker: u32, update: Update) -> Result<(), PsError> {
        let chunks: Vec<proto::StageChunk> =
            wire::update_to_chunks(&update, self.dim, self.config.chunk_bytes)
                .into_iter()
                .map(|c| proto::StageChunk {
                    step,
                    worker,
                    update: Some(c),
                })
                .collect();
        self.client
            .clone()
            .stage_step(tokio_stream::iter(chunks))
            .await
            .map_err(|s| self.err(s))?;
        Ok(())
    }

    async fn commit_step(&self, step: u64, workers: Vec<u32>) -> Result<ApplyReport, PsError> {
        let reply = self
            .client
            .clone()
            .commit_step(proto::CommitStepRequest { step, workers })
            .await
            .map_err(|s| self.err(s))?
            .into_inner();
        Ok(ApplyReport {
            rows_updated: reply.rows_updated,
            dense_blocks_updated: reply.dense_blocks_updated,
        })
    }

    async fn abort_step(&self, step: u64) -> Result<usize, PsError> {
        let reply = self
            .client
            .clone()
            .abort_step(proto::AbortStepRequest { step })
            .await
            .map_err(|s| self.err(s))?
            .into_inner();
        Ok(reply.dropped as usize)
    }

    async fn digest(&self) -> Result<ModelDigest, PsError> {
        let r = self
            .client
            .clone()
            .digest(proto::DigestRequest {})
            .await
            .map_err(|s| self.err(s))?
            .into_inner();
        let sum = (r.sum_hi as u128) << 64 | r.sum_lo as u128;
        Ok(ModelDigest::from_parts(sum, r.items))
    }

    async fn export_rows(&self, table: TableId, local: Range<u64>) -> Result<RowBlock, PsError> {
        let mut stream = self
            .client
            .clone()
            .export_rows(proto::ExportRowsRequest {
                table: table.0,
                lo: local.start,
                hi: local.end,
            })
            .await
            .map_err(|s| self.err(s))?
            .into_inner();
        let words = self.row_words;
        let mut block = None;
        while let Some(chunk) = stream.message().await.map_err(|s| self.err(s))? {
            wire::join_rows(&mut block, wire::rows_from_chunk(chunk)?, words)?;
        }
        Ok(block.unwrap_or(RowBlock {
            table,
            first_local: local.start,
            data: Vec::new(),
        }))
    }

    async fn import_rows(&self, block: RowBlock) -> Result<u64, PsError> {
        let chunks = wire::rows_to_chunks(&block, self.row_words, self.config.chunk_bytes);
        let reply = self
            .client
            .clone()
            .import_rows(tokio_stream::iter(chunks))
            .await
            .map_err(|s| self.err(s))?
            .into_inner();
        Ok(reply.items)
    }

    async fn export_dense(&self, blocks: Range<u64>) -> Result<DenseBlock, PsError> {
        let mut stream = self
            .client
            .clone()
            .export_dense(proto::ExportDenseRequest {
                lo_block: blocks.start,
                hi_block: blocks.end,
            })
            .await
            .map_err(|s| self.err(s))?
            .into_inner();
        let mut block = None;
        while let Some(chunk) = stream.message().await.map_err(|s| self.err(s))? {
            wire::join_dense(&mut block, wire::dense_from_chunk(chunk)?)?;
        }
        Ok(block.unwrap_or(DenseBlock {
            first_block: blocks.start,
            values: Vec::new(),
            state: Vec::new(),
        }))
    }

    async fn import_dense(&self, block: DenseBlock) -> Result<u64, PsError> {
        let chunks =
            wire::dense_to_chunks(&block, self.dense_state_per_block, self.config.chunk_bytes);
        let reply = self
            .client
            .clone()
            .import_dense(tokio_stream::iter(chunks))
            .await
            .map_err(|s| self.err(s))?
            .into_inner();
        Ok(reply.items)
    }
}
