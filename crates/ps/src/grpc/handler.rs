//! Server side of the gRPC transport: decode, call the [`SharedServer`], encode.
//!
//! Decoding errors (torn byte lengths, inconsistent chunk headers) and the server's own
//! refusals both come back as a status carrying the typed error; nothing here panics on input.

use std::pin::Pin;

use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::proto::{self, parameter_server_server::ParameterServer};
use super::wire::{self, to_status};
use super::GrpcConfig;
use crate::update::{RowRequest, Update};
use crate::{PsError, ServiceOp, SharedServer};
use ftrec_core::TableId;

type ChunkStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The parameter-server service implementation behind [`super::ps_service`].
pub struct Handler {
    server: SharedServer,
    config: GrpcConfig,
}

impl Handler {
    pub(crate) fn new(server: SharedServer, config: GrpcConfig) -> Self {
        Handler { server, config }
    }

    /// Run `f` on the server off the async worker threads: digests, exports and imports touch
    /// a whole shard or range.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&SharedServer) -> Result<T, PsError> + Send + 'static,
    ) -> Result<T, Status> {
        let server = self.server.clone();
        tokio::task::spawn_blocking(move || f(&server))
            .await
            .map_err(|e| to_status(&PsError::Internal(format!("worker thread failed: {e}"))))?
            .map_err(|e| to_status(&e))
    }

    /// The server's [`crate::ServiceGate`] verdict on `op`, as a status.
    fn check(&self, op: ServiceOp) -> Result<(), Status> {
        self.server.check(op).map_err(|e| to_status(&e))
    }

    fn max_update_bytes(&self) -> Result<u64, Status> {
        let s = self.server.read().map_err(|e| to_status(&e))?;
        Ok(s.config().limits.max_update_bytes)
    }
}

/// Read a stream of update chunks into one update, refusing it once it grows past `limit`.
async fn read_update<T>(
    stream: &mut Streaming<T>,
    limit: u64,
    mut split: impl FnMut(T) -> Result<proto::UpdateChunk, PsError>,
) -> Result<Update, Status> {
    let mut update = Update::new();
    let mut bytes = 0u64;
    while let Some(msg) = stream.message().await? {
        let chunk = split(msg).map_err(|e| to_status(&e))?;
        bytes += wire::chunk_bytes_of(&chunk);
        if bytes > limit {
            return Err(to_status(&PsError::TooLarge {
                what: "update stream".into(),
                bytes,
                limit,
            }));
        }
        wire::append_chunk(&mut update, chunk).map_err(|e| to_status(&e))?;
    }
    Ok(update)
}

fn stream_of<T: Send + 'static>(items: Vec<T>) -> ChunkStream<T> {
    Box::pin(tokio_stream::iter(items.into_iter().map(Ok)))
}

#[tonic::async_trait]
impl ParameterServer for Handler {
    async fn info(
        &self,
        _req: Request<proto::InfoRequest>,
    ) -> Result<Response<proto::InfoReply>, Status> {
        self.check(ServiceOp::Info)?;
        let s = self.server.read().map_err(|e| to_status(&e))?;
        Ok(Response::new(wire::info_to_proto(&s.info())))
    }

    async fn pull_rows(
        &self,
        req: Request<proto::PullRowsRequest>,
    ) -> Result<Response<proto::PullRowsReply>, Status> {
        self.check(ServiceOp::PullRows)?;
        let parts = req
            .into_inner()
            .parts
            .into_iter()
            .map(|p| {
                Ok(RowRequest {
                    table: TableId(p.table),
                    rows: wire::bytes_to_u64s(&format!("row ids of table {}", p.table), &p.rows)?,
                })
            })
            .collect::<Result<Vec<_>, PsError>>()
            .map_err(|e| to_status(&e))?;
        self.server
            .ensure_rows(&parts)
            .await
            .map_err(|e| to_status(&e))?;
        let s = self.server.read().map_err(|e| to_status(&e))?;
        let values = s.pull_rows(&parts).map_err(|e| to_status(&e))?;
        Ok(Response::new(proto::PullRowsReply {
            values: values.iter().map(|v| wire::f32s_to_bytes(v)).collect(),
        }))
    }

    async fn pull_dense(
        &self,
        req: Request<proto::PullDenseRequest>,
    ) -> Result<Response<proto::PullDenseReply>, Status> {
        self.check(ServiceOp::PullDense)?;
        let r = req.into_inner();
        let s = self.server.read().map_err(|e| to_status(&e))?;
        let values = s.pull_dense(r.lo..r.hi).map_err(|e| to_status(&e))?;
        Ok(Response::new(proto::PullDenseReply {
            values: wire::f32s_to_bytes(&values),
        }))
    }

    async fn push(
        &self,
        req: Request<Streaming<proto::UpdateChunk>>,
    ) -> Result<Response<proto::ApplyReply>, Status> {
        self.check(ServiceOp::Push)?;
        let limit = self.max_update_bytes()?;
        let mut stream = req.into_inner();
        let update = read_update(&mut stream, limit, Ok).await?;
        let report = self
            .server
            .write()
            .and_then(|mut s| s.push(&update))
            .map_err(|e| to_status(&e))?;
        Ok(Response::new(proto::ApplyReply {
            rows_updated: report.rows_updated,
            dense_blocks_updated: report.dense_blocks_updated,
        }))
    }

    async fn stage_step(
        &self,
        req: Request<Streaming<proto::StageChunk>>,
    ) -> Result<Response<proto::StageReply>, Status> {
        self.check(ServiceOp::StageStep)?;
        let limit = self.max_update_bytes()?;
        let mut stream = req.into_inner();
        let mut header: Option<(u64, u32)> = None;
        let update = read_update(&mut stream, limit, |c: proto::StageChunk| {
            match header {
                None => header = Some((c.step, c.worker)),
                Some((step, worker)) if (step, worker) != (c.step, c.worker) => {
                    return Err(PsError::MalformedRequest(format!(
                        "stage stream for step {step} worker {worker} carries a chunk for step {} worker {}",
                        c.step, c.worker
                    )))
                }
                Some(_) => {}
            }
            Ok(c.update.unwrap_or_default())
        })
        .await?;
        let (step, worker) = header.ok_or_else(|| {
            to_status(&PsError::MalformedRequest(
                "stage stream carried no chunk (no step or worker)".into(),
            ))
        })?;
        self.server
            .write()
            .and_then(|mut s| s.stage_step(step, worker, update))
            .map_err(|e| to_status(&e))?;
        Ok(Response::new(proto::StageReply {}))
    }

    async fn commit_step(
        &self,
        req: Request<proto::CommitStepRequest>,
    ) -> Result<Response<proto::ApplyReply>, Status> {
        self.check(ServiceOp::CommitStep)?;
        let r = req.into_inner();
        let report = self
            .server
            .write()
            .and_then(|mut s| s.commit_step(r.step, &r.workers))
            .map_err(|e| to_status(&e))?;
        Ok(Response::new(proto::ApplyReply {
            rows_updated: report.rows_updated,
            dense_blocks_updated: report.dense_blocks_updated,
        }))
    }

    async fn abort_step(
        &self,
        req: Request<proto::AbortStepRequest>,
    ) -> Result<Response<proto::AbortStepReply>, Status> {
        self.check(ServiceOp::AbortStep)?;
        let step = req.into_inner().step;
        let dropped = self
            .server
            .write()
            .map(|mut s| s.abort_step(step))
            .map_err(|e| to_status(&e))?;
        Ok(Response::new(proto::AbortStepReply {
            dropped: dropped as u32,
        }))
    }

    async fn digest(
        &self,
        _req: Request<proto::DigestRequest>,
    ) -> Result<Response<proto::DigestReply>, Status> {
        self.check(ServiceOp::Digest)?;
        let d = self.blocking(|s| Ok(s.read()?.digest())).await?;
        let (sum, items) = d.to_parts();
        Ok(Response::new(proto::DigestReply {
            sum_lo: sum as u64,
            sum_hi: (sum >> 64) as u64,
            items,
        }))
    }

    type ExportRowsStream = ChunkStream<proto::RowsChunk>;

    async fn export_rows(
        &self,
        req: Request<proto::ExportRowsRequest>,
    ) -> Result<Response<Self::ExportRowsStream>, Status> {
        self.check(ServiceOp::ExportRows)?;
        let r = req.into_inner();
        let chunk_bytes = self.config.chunk_bytes;
        let chunks = self
            .blocking(move |s| {
                let s = s.read()?;
                let block = s.export_rows(TableId(r.table), r.lo..r.hi)?;
                Ok(wire::rows_to_chunks(
                    &block,
                    s.layout().words(),
                    chunk_bytes,
                ))
            })
            .await?;
        Ok(Response::new(stream_of(chunks)))
    }

    async fn import_rows(
        &self,
        req: Request<Streaming<proto::RowsChunk>>,
    ) -> Result<Response<proto::ImportReply>, Status> {
        self.check(ServiceOp::ImportRows)?;
        let words = self
            .server
            .read()
            .map_err(|e| to_status(&e))?
            .layout()
            .words();
        let mut stream = req.into_inner();
        let mut block = None;
        while let Some(chunk) = stream.message().await? {
            wire::rows_from_chunk(chunk)
                .and_then(|b| wire::join_rows(&mut block, b, words))
                .map_err(|e| to_status(&e))?;
        }
        let block = block.ok_or_else(|| {
            to_status(&PsError::MalformedRequest(
                "row import stream carried no chunk".into(),
            ))
        })?;
        let items = self
            .blocking(move |s| s.write()?.import_rows(&block))
            .await?;
        Ok(Response::new(proto::ImportReply { items }))
    }

    type ExportDenseStream = ChunkStream<proto::DenseChunk>;

    async fn export_dense(
        &self,
        req: Request<proto::ExportDenseRequest>,
    ) -> Result<Response<Self::ExportDenseStream>, Status> {
        self.check(ServiceOp::ExportDense)?;
        let r = req.into_inner();
        let chunk_bytes = self.config.chunk_bytes;
        let chunks = self
            .blocking(move |s| {
                let s = s.read()?;
                let block = s.export_dense(r.lo_block..r.hi_block)?;
                let spb = s.info().dense_state_per_block;
                Ok(wire::dense_to_chunks(&block, spb, chunk_bytes))
            })
            .await?;
        Ok(Response::new(stream_of(chunks)))
    }

    async fn import_dense(
        &self,
        req: Request<Streaming<proto::DenseChunk>>,
    ) -> Result<Response<proto::ImportReply>, Status> {
        self.check(ServiceOp::ImportDense)?;
        let mut stream = req.into_inner();
        let mut block = None;
        while let Some(chunk) = stream.message().await? {
            wire::dense_from_chunk(chunk)
                .and_then(|b| wire::join_dense(&mut block, b))
                .map_err(|e| to_status(&e))?;
        }
        let block = block.ok_or_else(|| {
            to_status(&PsError::MalformedRequest(
                "dense import stream carried no chunk".into(),
            ))
        })?;
        let items = self
            .blocking(move |s| s.write()?.import_dense(&block))
            .await?;
        Ok(Response::new(proto::ImportReply { items }))
    }
}
