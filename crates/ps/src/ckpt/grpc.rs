//! The checkpoint service over gRPC: [`ckpt_service`] serves a [`CkptNode`] (add it next to the
//! parameter-server service with [`crate::grpc::Routes::add_service`]); [`CkptGrpcClient`]
//! implements [`CkptApi`] against it.

use ftrec_ckpt::format::{DenseInfo, ShardInfo, TableInfo};
use ftrec_ckpt::format::{FileChecksums, FileContent, FileInfo, PieceScheme, QuantBits};
use ftrec_ckpt::incr::{ExtractConfig, Filters, PieceSpec};
use ftrec_ckpt::snapshot::ShardReport;
use ftrec_ckpt::{CheckpointId, CheckpointKind, CkptError};
use ftrec_core::{RowLayout, ServerId, TableId};
use tonic::{Request, Response, Status};

use crate::auth::{Auth, AuthChannel, ChannelError};
use crate::net::PeerAddr;

use super::{CkptApi, CkptNode, CkptServiceError, RestoreDone, SaveStarted};

/// Messages and stubs generated from `proto/ckpt.proto`.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("ftrec.ckpt.v1");
}

use proto::checkpointer_client::CheckpointerClient;
use proto::checkpointer_server::{Checkpointer, CheckpointerServer};

/// The gRPC face of a [`CkptNode`].
#[derive(Debug, Clone)]
pub struct CkptHandler {
    node: CkptNode,
}

/// The checkpoint service of `node`, ready for [`crate::grpc::Routes::add_service`].
pub fn ckpt_service(node: CkptNode) -> CheckpointerServer<CkptHandler> {
    CheckpointerServer::new(CkptHandler { node })
        .max_decoding_message_size(CKPT_MAX_MESSAGE_BYTES)
        .max_encoding_message_size(CKPT_MAX_MESSAGE_BYTES)
}

/// Largest checkpoint-service message either end accepts: the requests are commands (ids,
/// locations, piece specifications), the replies file lists.
pub const CKPT_MAX_MESSAGE_BYTES: usize = 16 << 20;

fn status(e: CkptServiceError) -> Status {
    match &e {
        CkptServiceError::UnknownSave { .. } => Status::not_found(e.to_string()),
        CkptServiceError::NoPriority => Status::failed_precondition(e.to_string()),
        CkptServiceError::Store(c) if c.is_corruption() => Status::data_loss(e.to_string()),
        CkptServiceError::Store(
            CkptError::InvalidArgument(_)
            | CkptError::InvalidCheckpoint { .. }
            | CkptError::InvalidKey { .. },
        ) => Status::invalid_argument(e.to_string()),
        CkptServiceError::Store(CkptError::NotFound { .. } | CkptError::NoCheckpoint { .. }) => {
            Status::failed_precondition(e.to_string())
        }
        // Only a store that gave up after its retries; any other store error (a full disk
        // that was not retried included) is the server's internal error: the server is up.
        CkptServiceError::Store(CkptError::TemporarilyUnavailable { .. }) => {
            Status::unavailable(e.to_string())
        }
        _ => Status::internal(e.to_string()),
    }
}

fn parse_id(s: &str) -> Result<CheckpointId, Status> {
    CheckpointId::new(s).map_err(|e| Status::invalid_argument(format!("checkpoint id: {e}")))
}

fn to_kind(k: i32) -> Result<CheckpointKind, Status> {
    match proto::Kind::try_from(k) {
        Ok(proto::Kind::Full) => Ok(CheckpointKind::Full),
        Ok(proto::Kind::Delta) => Ok(CheckpointKind::Delta),
        _ => Err(Status::invalid_argument(format!(
            "save kind {k} is not full (1) or delta (2)"
        ))),
    }
}

fn scheme_to_wire(s: PieceScheme) -> proto::PieceScheme {
    match s {
        PieceScheme::Incremental => proto::PieceScheme::Incremental,
        PieceScheme::Differential => proto::PieceScheme::Differential,
        PieceScheme::ChunkList => proto::PieceScheme::ChunkList,
    }
}

fn scheme_from_wire(s: i32) -> Option<PieceScheme> {
    match proto::PieceScheme::try_from(s) {
        Ok(proto::PieceScheme::Incremental) => Some(PieceScheme::Incremental),
        Ok(proto::PieceScheme::Differential) => Some(PieceScheme::Differential),
        Ok(proto::PieceScheme::ChunkList) => Some(PieceScheme::ChunkList),
        _ => None,
    }
}

fn piece_to_wire(p: &PieceSpec) -> proto::PieceSpec {
    proto::PieceSpec {
        scheme: scheme_to_wire(p.scheme) as i32,
        quant_bits: p.quant.map_or(0, |b| b.bits()),
        threshold: p.extract.threshold,
        range_rows: p.extract.range_rows,
        concat: p.extract.concat,
        range_filter: p.extract.filters.range,
        bloom_filter: p.extract.filters.bloom,
        actual_filter: p.extract.filters.actual,
        bundle_bytes: p.extract.bundle_bytes as u64,
        bloom_bits_per_key: p.extract.bloom_bits_per_key,
        compact_below: p.extract.compact_below,
    }
}

fn piece_from_wire(p: proto::PieceSpec) -> Result<PieceSpec, String> {
    let scheme = scheme_from_wire(p.scheme)
        .ok_or_else(|| format!("piece scheme {} is not 1, 2 or 3", p.scheme))?;
    let quant = match p.quant_bits {
        0 => None,
        b => {
            Some(QuantBits::from_bits(b).ok_or_else(|| format!("{b} quantization bits (8 or 4)"))?)
        }
    };
    let spec = PieceSpec {
        scheme,
        quant,
        extract: ExtractConfig {
            threshold: p.threshold,
            range_rows: p.range_rows,
            concat: p.concat,
            filters: Filters {
                range: p.range_filter,
                bloom: p.bloom_filter,
                actual: p.actual_filter,
            },
            bundle_bytes: usize::try_from(p.bundle_bytes).unwrap_or(usize::MAX),
            bloom_bits_per_key: p.bloom_bits_per_key,
            compact_below: p.compact_below,
        },
    };
    spec.validate().map_err(|e| e.to_string())?;
    Ok(spec)
}

fn report_to_wire(r: &ShardReport) -> proto::WaitReply {
    proto::WaitReply {
        server: r.shard.server.0,
        tables: r
            .shard
            .tables
            .iter()
            .map(|t| proto::TableInfo {
                table: t.table.0,
                rows: t.rows,
                dim: t.layout.dim as u32,
                state_words: t.layout.state_words as u32,
            })
            .collect(),
        dense: r.shard.dense.map(|d| proto::DenseInfo {
            first_block: d.first_block,
            blocks: d.blocks,
            values: d.values,
            state_per_block: d.state_per_block,
        }),
        files: r
            .files
            .iter()
            .map(|f| proto::FileInfo {
                path: f.path.clone(),
                size: f.size,
                header_crc32c: f.crc32c.header,
                payload_crc32c: f.crc32c.payload,
                content: Some(match f.content {
                    FileContent::Rows {
                        server,
                        table,
                        rows,
                        first_row,
                        last_row,
                    } => proto::file_info::Content::Rows(proto::RowsContent {
                        server: server.0,
                        table: table.0,
                        rows,
                        first_row,
                        last_row,
                    }),
                    FileContent::Dense {
                        server,
                        first_block,
                        blocks,
                    } => proto::file_info::Content::Dense(proto::DenseContent {
                        server: server.0,
                        first_block,
                        blocks,
                    }),
                    FileContent::Bundle {
                        server,
                        sections,
                        rows,
                    } => proto::file_info::Content::Bundle(proto::BundleContent {
                        server: server.0,
                        sections,
                        rows,
                    }),
                    FileContent::QuantRows {
                        server,
                        table,
                        rows,
                        first_row,
                        last_row,
                        bits,
                    } => proto::file_info::Content::QuantRows(proto::QuantRowsContent {
                        server: server.0,
                        table: table.0,
                        rows,
                        first_row,
                        last_row,
                        bits: bits as u32,
                    }),
                    FileContent::PieceIndex {
                        server,
                        scheme,
                        column,
                    } => proto::file_info::Content::PieceIndex(proto::PieceIndexContent {
                        server: server.0,
                        scheme: scheme_to_wire(scheme) as i32,
                        column,
                    }),
                }),
            })
            .collect(),
        bytes: r.bytes,
    }
}

fn report_from_wire(w: proto::WaitReply) -> Result<ShardReport, CkptServiceError> {
    let bad = |m: String| CkptServiceError::Remote {
        code: "invalid reply".into(),
        message: m,
    };
    let mut files = Vec::with_capacity(w.files.len());
    for f in w.files {
        let content = match f.content {
            Some(proto::file_info::Content::Rows(r)) => FileContent::Rows {
                server: ServerId(r.server),
                table: TableId(r.table),
                rows: r.rows,
                first_row: r.first_row,
                last_row: r.last_row,
            },
            Some(proto::file_info::Content::Dense(d)) => FileContent::Dense {
                server: ServerId(d.server),
                first_block: d.first_block,
                blocks: d.blocks,
            },
            Some(proto::file_info::Content::Bundle(b)) => FileContent::Bundle {
                server: ServerId(b.server),
                sections: b.sections,
                rows: b.rows,
            },
            Some(proto::file_info::Content::QuantRows(q)) => FileContent::QuantRows {
                server: ServerId(q.server),
                table: TableId(q.table),
                rows: q.rows,
                first_row: q.first_row,
                last_row: q.last_row,
                bits: u8::try_from(q.bits)
                    .ok()
                    .filter(|b| *b == 8 || *b == 4)
                    .ok_or_else(|| bad(format!("file {} has {}-bit rows", f.path, q.bits)))?,
            },
            Some(proto::file_info::Content::PieceIndex(p)) => FileContent::PieceIndex {
                server: ServerId(p.server),
                scheme: scheme_from_wire(p.scheme)
                    .ok_or_else(|| bad(format!("file {} has piece scheme {}", f.path, p.scheme)))?,
                column: p.column,
            },
            None => return Err(bad(format!("file {} has no content", f.path))),
        };
        files.push(FileInfo {
            path: f.path,
            size: f.size,
            crc32c: FileChecksums {
                header: f.header_crc32c,
                payload: f.payload_crc32c,
            },
            content,
        });
    }
    let mut tables = Vec::with_capacity(w.tables.len());
    for t in w.tables {
        if t.dim == 0 {
            return Err(bad(format!("table {} has dim 0", t.table)));
        }
        tables.push(TableInfo {
            table: TableId(t.table),
            rows: t.rows,
            layout: RowLayout::new(t.dim as usize, t.state_words as usize),
        });
    }
    Ok(ShardReport {
        shard: ShardInfo {
            server: ServerId(w.server),
            tables,
            dense: w.dense.map(|d| DenseInfo {
                first_block: d.first_block,
                blocks: d.blocks,
                values: d.values,
                state_per_block: d.state_per_block,
            }),
        },
        files,
        bytes: w.bytes,
    })
}

#[tonic::async_trait]
impl Checkpointer for CkptHandler {
    async fn save(
        &self,
        req: Request<proto::SaveRequest>,
    ) -> Result<Response<proto::SaveReply>, Status> {
        let r = req.into_inner();
        let id = parse_id(&r.checkpoint_id)?;
        let kind = to_kind(r.kind)?;
        let s = match r.piece {
            None => self.node.save(r.location, id, kind, r.step).await,
            Some(p) => {
                if kind != CheckpointKind::Delta {
                    return Err(Status::invalid_argument(
                        "an incremental piece is saved as kind delta (2)",
                    ));
                }
                let spec = piece_from_wire(p)
                    .map_err(|e| Status::invalid_argument(format!("piece: {e}")))?;
                self.node.save_piece(r.location, id, r.step, spec).await
            }
        }
        .map_err(status)?;
        Ok(Response::new(proto::SaveReply {
            rows: s.rows,
            bytes: s.bytes,
            pause_s: s.pause_s,
        }))
    }

    async fn save_prioritized(
        &self,
        req: Request<proto::SavePrioritizedRequest>,
    ) -> Result<Response<proto::SaveReply>, Status> {
        let r = req.into_inner();
        let id = parse_id(&r.checkpoint_id)?;
        let s = self
            .node
            .save_prioritized(r.location, id, r.step)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::SaveReply {
            rows: s.rows,
            bytes: s.bytes,
            pause_s: s.pause_s,
        }))
    }

    async fn wait(
        &self,
        req: Request<proto::WaitRequest>,
    ) -> Result<Response<proto::WaitReply>, Status> {
        let id = parse_id(&req.into_inner().checkpoint_id)?;
        let rep = self.node.wait(id).await.map_err(status)?;
        Ok(Response::new(report_to_wire(&rep)))
    }

    async fn restore(
        &self,
        req: Request<proto::RestoreRequest>,
    ) -> Result<Response<proto::RestoreReply>, Status> {
        let r = req.into_inner();
        let id = parse_id(&r.checkpoint_id)?;
        let d = self.node.restore(r.location, id).await.map_err(status)?;
        Ok(Response::new(proto::RestoreReply {
            checkpoints: d.checkpoints,
            files: d.files,
            bytes: d.bytes,
        }))
    }

    async fn reset(
        &self,
        _req: Request<proto::ResetRequest>,
    ) -> Result<Response<proto::ResetReply>, Status> {
        self.node.reset().await.map_err(status)?;
        Ok(Response::new(proto::ResetReply {}))
    }
}

/// A connection to one server's checkpoint service.
#[derive(Debug, Clone)]
pub struct CkptGrpcClient {
    client: CheckpointerClient<AuthChannel>,
}

fn remote(s: Status) -> CkptServiceError {
    if s.code() == tonic::Code::NotFound {
        return CkptServiceError::UnknownSave {
            id: s.message().to_string(),
        };
    }
    CkptServiceError::Remote {
        code: format!("{:?}", s.code()),
        message: s.message().to_string(),
    }
}

impl CkptGrpcClient {
    /// `addr` may be a name: it is looked up now and at every reconnect ([`crate::net`]).
    pub async fn connect(addr: impl Into<PeerAddr>) -> Result<Self, CkptServiceError> {
        Self::connect_with(addr, &Auth::none()).await
    }

    /// [`CkptGrpcClient::connect`] with every request carrying `auth`'s token and job id.
    pub async fn connect_with(
        addr: impl Into<PeerAddr>,
        auth: &Auth,
    ) -> Result<Self, CkptServiceError> {
        let addr = addr.into();
        let channel = auth.channel(&addr).await.map_err(|e| match e {
            ChannelError::Endpoint(e) => CkptServiceError::Internal(e.to_string()),
            ChannelError::Connect(e) => {
                let chain = crate::tls::chain(&e);
                CkptServiceError::Remote {
                    code: "Unavailable".into(),
                    message: format!(
                        "cannot connect to {addr}: {chain}{}",
                        auth.connect_hint(&chain)
                    ),
                }
            }
        })?;
        Ok(CkptGrpcClient {
            client: CheckpointerClient::with_interceptor(channel, auth.client())
                .max_decoding_message_size(CKPT_MAX_MESSAGE_BYTES)
                .max_encoding_message_size(CKPT_MAX_MESSAGE_BYTES),
        })
    }
}

impl CkptApi for CkptGrpcClient {
    async fn save(
        &self,
        location: String,
        id: CheckpointId,
        kind: CheckpointKind,
        step: u64,
    ) -> Result<SaveStarted, CkptServiceError> {
        let kind = match kind {
            CheckpointKind::Full => proto::Kind::Full,
            CheckpointKind::Delta => proto::Kind::Delta,
            CheckpointKind::Merged => proto::Kind::Unspecified,
        };
        let r = self
            .client
            .clone()
            .save(proto::SaveRequest {
                location,
                checkpoint_id: id.to_string(),
                step,
                kind: kind as i32,
                piece: None,
            })
            .await
            .map_err(remote)?
            .into_inner();
        Ok(SaveStarted {
            rows: r.rows,
            bytes: r.bytes,
            pause_s: r.pause_s,
        })
    }

    async fn save_piece(
        &self,
        location: String,
        id: CheckpointId,
        step: u64,
        spec: PieceSpec,
    ) -> Result<SaveStarted, CkptServiceError> {
        let r = self
            .client
            .clone()
            .save(proto::SaveRequest {
                location,
                checkpoint_id: id.to_string(),
                step,
                kind: proto::Kind::Delta as i32,
                piece: Some(piece_to_wire(&spec)),
            })
            .await
            .map_err(remote)?
            .into_inner();
        Ok(SaveStarted {
            rows: r.rows,
            bytes: r.bytes,
            pause_s: r.pause_s,
        })
    }

    async fn save_prioritized(
        &self,
        location: String,
        id: CheckpointId,
        step: u64,
    ) -> Result<SaveStarted, CkptServiceError> {
        let r = self
            .client
            .clone()
            .save_prioritized(proto::SavePrioritizedRequest {
                location,
                checkpoint_id: id.to_string(),
                step,
            })
            .await
            .map_err(remote)?
            .into_inner();
        Ok(SaveStarted {
            rows: r.rows,
            bytes: r.bytes,
            pause_s: r.pause_s,
        })
    }

    async fn wait(&self, id: CheckpointId) -> Result<ShardReport, CkptServiceError> {
        let r = self
            .client
            .clone()
            .wait(proto::WaitRequest {
                checkpoint_id: id.to_string(),
            })
            .await
            .map_err(remote)?
            .into_inner();
        report_from_wire(r)
    }

    async fn restore(
        &self,
        location: String,
        id: CheckpointId,
    ) -> Result<RestoreDone, CkptServiceError> {
        let r = self
            .client
            .clone()
            .restore(proto::RestoreRequest {
                location,
                checkpoint_id: id.to_string(),
            })
            .await
            .map_err(remote)?
            .into_inner();
        Ok(RestoreDone {
            checkpoints: r.checkpoints,
            files: r.files,
            bytes: r.bytes,
        })
    }

    async fn reset(&self) -> Result<(), CkptServiceError> {
        self.client
            .clone()
            .reset(proto::ResetRequest {})
            .await
            .map_err(remote)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_the_wire() {
        let r = ShardReport {
            shard: ShardInfo {
                server: ServerId(3),
                tables: vec![TableInfo {
                    table: TableId(1),
                    rows: 9,
                    layout: RowLayout::new(4, 1),
                }],
                dense: Some(DenseInfo {
                    first_block: 2,
                    blocks: 1,
                    values: 10,
                    state_per_block: 2,
                }),
            },
            files: vec![
                FileInfo {
                    path: "s0003/t0001-000000.rows".into(),
                    size: 99,
                    crc32c: FileChecksums {
                        header: 1,
                        payload: 2,
                    },
                    content: FileContent::Rows {
                        server: ServerId(3),
                        table: TableId(1),
                        rows: 9,
                        first_row: 3,
                        last_row: 40,
                    },
                },
                FileInfo {
                    path: "s0003/dense-000000.dense".into(),
                    size: 50,
                    crc32c: FileChecksums {
                        header: 3,
                        payload: 4,
                    },
                    content: FileContent::Dense {
                        server: ServerId(3),
                        first_block: 2,
                        blocks: 1,
                    },
                },
            ],
            bytes: 149,
        };
        assert_eq!(report_from_wire(report_to_wire(&r)).unwrap(), r);
        let mut r2 = r.clone();
        r2.files = vec![
            FileInfo {
                path: "s0003/row0-000000.bndl".into(),
                size: 10,
                crc32c: FileChecksums {
                    header: 5,
                    payload: 6,
                },
                content: FileContent::Bundle {
                    server: ServerId(3),
                    sections: 4,
                    rows: 17,
                },
            },
            FileInfo {
                path: "s0003/t0001-000000.qrows".into(),
                size: 11,
                crc32c: FileChecksums {
                    header: 7,
                    payload: 8,
                },
                content: FileContent::QuantRows {
                    server: ServerId(3),
                    table: TableId(1),
                    rows: 2,
                    first_row: 4,
                    last_row: 7,
                    bits: 4,
                },
            },
            FileInfo {
                path: "s0003/piece.pidx".into(),
                size: 12,
                crc32c: FileChecksums {
                    header: 9,
                    payload: 10,
                },
                content: FileContent::PieceIndex {
                    server: ServerId(3),
                    scheme: PieceScheme::ChunkList,
                    column: 6,
                },
            },
        ];
        assert_eq!(report_from_wire(report_to_wire(&r2)).unwrap(), r2);
        let mut spec = PieceSpec::chunk_list(0.05);
        spec.extract.range_rows = 1 << 14;
        spec.extract.filters.bloom = false;
        assert_eq!(piece_from_wire(piece_to_wire(&spec)).unwrap(), spec);
        let q = PieceSpec::differential(Some(QuantBits::Four));
        assert_eq!(piece_from_wire(piece_to_wire(&q)).unwrap(), q);
        let mut bad = piece_to_wire(&q);
        bad.quant_bits = 3;
        assert!(piece_from_wire(bad)
            .unwrap_err()
            .contains("3 quantization bits"));
        let mut w = report_to_wire(&r);
        w.files[0].content = None;
        assert!(matches!(
            report_from_wire(w),
            Err(CkptServiceError::Remote { .. })
        ));
        assert!(to_kind(7).is_err());
    }
}

#[cfg(test)]
mod fuzz {
    //! The checkpoint service's conversions from the wire (`report_from_wire`,
    //! `piece_from_wire`, kinds and ids), fed arbitrary and mutated messages.

    use super::*;
    use crate::fuzz_support::{bytes, check, config, huge, mutated_encoding, mutation};
    use proptest::prelude::*;
    use prost::Message;

    fn report() -> ShardReport {
        ShardReport {
            shard: ShardInfo {
                server: ServerId(1),
                tables: vec![TableInfo {
                    table: TableId(0),
                    rows: 9,
                    layout: RowLayout::new(4, 1),
                }],
                dense: Some(DenseInfo {
                    first_block: 0,
                    blocks: 1,
                    values: 10,
                    state_per_block: 2,
                }),
            },
            files: vec![
                FileInfo {
                    path: "s0001/t0000-000000.qrows".into(),
                    size: 11,
                    crc32c: FileChecksums {
                        header: 7,
                        payload: 8,
                    },
                    content: FileContent::QuantRows {
                        server: ServerId(1),
                        table: TableId(0),
                        rows: 2,
                        first_row: 4,
                        last_row: 7,
                        bits: 8,
                    },
                },
                FileInfo {
                    path: "s0001/piece.pidx".into(),
                    size: 12,
                    crc32c: FileChecksums {
                        header: 9,
                        payload: 10,
                    },
                    content: FileContent::PieceIndex {
                        server: ServerId(1),
                        scheme: PieceScheme::Differential,
                        column: 6,
                    },
                },
            ],
            bytes: 23,
        }
    }

    fn every_reader(wire: &[u8]) {
        check(wire, report_from_wire);
        check(wire, |p: proto::PieceSpec| {
            if let Ok(spec) = piece_from_wire(p) {
                // What is accepted is valid and survives the way back.
                assert!(spec.validate().is_ok());
                assert_eq!(piece_from_wire(piece_to_wire(&spec)).unwrap(), spec);
            }
        });
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn arbitrary_bytes_as_every_message(wire in bytes(600)) {
            every_reader(&wire);
        }

        #[test]
        fn mutated_messages(piece in any::<bool>(), ms in prop::collection::vec(mutation(), 0..6)) {
            let wire = if piece {
                mutated_encoding(&piece_to_wire(&PieceSpec::chunk_list(0.05)), &ms)
            } else {
                mutated_encoding(&report_to_wire(&report()), &ms)
            };
            every_reader(&wire);
        }

        #[test]
        fn arbitrary_piece_specs(
            scheme in -1i32..5,
            quant_bits in prop_oneof![0u32..10, any::<u32>()],
            threshold in any::<f64>(),
            range_rows in huge(),
            bundle_bytes in huge(),
            bloom_bits_per_key in any::<u32>(),
            compact_below in any::<f64>(),
            flags in any::<[bool; 4]>(),
        ) {
            let p = proto::PieceSpec {
                scheme, quant_bits, threshold, range_rows,
                concat: flags[0], range_filter: flags[1], bloom_filter: flags[2],
                actual_filter: flags[3], bundle_bytes, bloom_bits_per_key, compact_below,
            };
            every_reader(&p.encode_to_vec());
        }

        #[test]
        fn arbitrary_kinds_and_ids(kind in any::<i32>(), id in "\\PC{0,80}") {
            let _ = to_kind(kind);
            let _ = parse_id(&id);
        }
    }
}
