//! Conversions between the wire messages and the crate's values: packed little-endian
//! numbers, chunking, and errors carried in status details.

use prost::Message;
use tonic::{Code, Status};

use super::proto;
use crate::update::{DenseBlock, DenseGrads, RowBlock, ServerInfo, SparseGrads, Update};
use crate::PsError;
use ftrec_core::{ServerId, TableId, DENSE_BLOCK};

pub(crate) fn f32s_to_bytes(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 4);
    extend_f32s_le(&mut out, values);
    out
}

/// Append `values` to `out`, little-endian. Written into a sized buffer in fixed chunks, which
/// the compiler turns into a plain copy on little-endian targets (a push per float does not).
pub(crate) fn extend_f32s_le(out: &mut Vec<u8>, values: &[f32]) {
    if cfg!(target_endian = "little") {
        // The floats' bytes as they are in memory: one copy, no zeroing first.
        out.extend_from_slice(bytemuck::cast_slice(values));
        return;
    }
    let at = out.len();
    out.resize(at + values.len() * 4, 0);
    for (c, v) in out[at..].chunks_exact_mut(4).zip(values) {
        c.copy_from_slice(&v.to_le_bytes());
    }
}

/// `values` as the little-endian bytes of a message field, without a copy where the
/// machine is little-endian (the buffer is handed over as it is).
pub(crate) fn f32s_into_bytes(values: Vec<f32>) -> bytes::Bytes {
    if cfg!(target_endian = "little") {
        bytes::Bytes::from_owner(F32Bytes(values))
    } else {
        bytes::Bytes::from(f32s_to_bytes(&values))
    }
}

/// Floats seen as their bytes in memory ([`f32s_into_bytes`]).
struct F32Bytes(Vec<f32>);

impl AsRef<[u8]> for F32Bytes {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

pub(crate) fn u64s_to_bytes(values: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 8);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

pub(crate) fn check_multiple(what: &str, len: usize, unit: usize) -> Result<(), PsError> {
    if len.is_multiple_of(unit) {
        Ok(())
    } else {
        Err(PsError::PayloadLength {
            what: what.to_string(),
            len: len as u64,
            unit: unit as u64,
        })
    }
}

pub(crate) fn bytes_to_f32s(what: &str, bytes: &[u8]) -> Result<Vec<f32>, PsError> {
    check_multiple(what, bytes.len(), 4)?;
    if cfg!(target_endian = "little") {
        // Bytes that happen to be aligned for floats are copied once, without zeroing first.
        if let Ok(floats) = bytemuck::try_cast_slice::<u8, f32>(bytes) {
            return Ok(floats.to_vec());
        }
    }
    let mut out = vec![0.0f32; bytes.len() / 4];
    le_bytes_into_f32s(bytes, &mut out);
    Ok(out)
}

/// Decode little-endian floats into a sized buffer in one pass (`bytes` holds 4 bytes per
/// float of `out`), which the compiler turns into a plain copy on little-endian targets, as
/// [`extend_f32s_le`] does the other way; collecting an iterator of floats does not.
pub(crate) fn le_bytes_into_f32s(bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), out.len() * 4);
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

pub(crate) fn bytes_to_u64s(what: &str, bytes: &[u8]) -> Result<Vec<u64>, PsError> {
    check_multiple(what, bytes.len(), 8)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunk of 8")))
        .collect())
}

// ---- updates ----

/// Cut an update into chunks of about `chunk_bytes` wire bytes each (at least one row or one
/// dense block per chunk). Row order within a table and the order of parts are kept, so the
/// server's in-order sums see the same sequence as an unchunked update.
pub(crate) fn update_to_chunks(
    update: &Update,
    dim: usize,
    chunk_bytes: usize,
) -> Vec<proto::UpdateChunk> {
    let mut chunks = Vec::new();
    let mut cur = proto::UpdateChunk::default();
    let mut cur_bytes = 0usize;
    let row_bytes = 8 + dim * 4;
    for part in &update.sparse {
        let mut i = 0;
        // A part whose lengths disagree is sent unsplit: the server names the mismatch.
        if part.grads.len() != part.rows.len() * dim {
            cur.sparse.push(proto::SparsePart {
                table: part.table.0,
                rows: u64s_to_bytes(&part.rows),
                grads: f32s_to_bytes(&part.grads),
            });
            cur_bytes += part.rows.len() * 8 + part.grads.len() * 4;
            continue;
        }
        while i < part.rows.len() {
            if cur_bytes + row_bytes > chunk_bytes && cur_bytes > 0 {
                chunks.push(std::mem::take(&mut cur));
                cur_bytes = 0;
            }
            let room = (chunk_bytes.saturating_sub(cur_bytes) / row_bytes).max(1);
            let n = room.min(part.rows.len() - i);
            cur.sparse.push(proto::SparsePart {
                table: part.table.0,
                rows: u64s_to_bytes(&part.rows[i..i + n]),
                grads: f32s_to_bytes(&part.grads[i * dim..(i + n) * dim]),
            });
            cur_bytes += n * row_bytes;
            i += n;
        }
    }
    let block_bytes = DENSE_BLOCK * 4;
    for part in &update.dense {
        let misaligned = !part.offset.is_multiple_of(DENSE_BLOCK as u64);
        let mut i = 0;
        while i < part.grads.len() || (i == 0 && part.grads.is_empty()) {
            if cur_bytes + block_bytes > chunk_bytes && cur_bytes > 0 {
                chunks.push(std::mem::take(&mut cur));
                cur_bytes = 0;
            }
            // Whole blocks per chunk; a misaligned part is sent unsplit for the server to name.
            let n = if misaligned {
                part.grads.len()
            } else {
                let blocks = (chunk_bytes.saturating_sub(cur_bytes) / block_bytes).max(1);
                (blocks * DENSE_BLOCK).min(part.grads.len() - i)
            };
            cur.dense.push(proto::DensePart {
                offset: part.offset.saturating_add(i as u64),
                grads: f32s_to_bytes(&part.grads[i..i + n]),
            });
            cur_bytes += n * 4;
            i += n;
            if n == 0 {
                break;
            }
        }
    }
    if cur_bytes > 0 || !cur.sparse.is_empty() || !cur.dense.is_empty() || chunks.is_empty() {
        chunks.push(cur);
    }
    chunks
}

/// Append a received chunk to the update being rebuilt.
pub(crate) fn append_chunk(update: &mut Update, chunk: proto::UpdateChunk) -> Result<(), PsError> {
    for part in chunk.sparse {
        update.sparse.push(SparseGrads {
            table: TableId(part.table),
            rows: bytes_to_u64s(&format!("row ids of table {}", part.table), &part.rows)?,
            grads: bytes_to_f32s(&format!("gradients of table {}", part.table), &part.grads)?,
        });
    }
    for part in chunk.dense {
        update.dense.push(DenseGrads {
            offset: part.offset,
            grads: bytes_to_f32s(
                &format!("dense gradients at offset {}", part.offset),
                &part.grads,
            )?,
        });
    }
    Ok(())
}

pub(crate) fn chunk_bytes_of(chunk: &proto::UpdateChunk) -> u64 {
    let s: usize = chunk
        .sparse
        .iter()
        .map(|p| p.rows.len() + p.grads.len())
        .sum();
    let d: usize = chunk.dense.iter().map(|p| p.grads.len()).sum();
    (s + d) as u64
}

// ---- shapes and blocks ----

pub(crate) fn info_to_proto(info: &ServerInfo) -> proto::InfoReply {
    proto::InfoReply {
        server: info.server.0,
        servers: info.servers,
        dim: info.dim as u32,
        state_words: info.state_words as u32,
        table_rows: info.table_rows.clone(),
        local_rows: info.local_rows.clone(),
        dense_len: info.dense_len,
        dense_lo: info.dense_range.start,
        dense_hi: info.dense_range.end,
        dense_state_per_block: info.dense_state_per_block as u32,
        last_committed_step: info.last_committed_step,
    }
}

pub(crate) fn info_from_proto(p: proto::InfoReply) -> ServerInfo {
    ServerInfo {
        server: ServerId(p.server),
        servers: p.servers,
        dim: p.dim as usize,
        state_words: p.state_words as usize,
        table_rows: p.table_rows,
        local_rows: p.local_rows,
        dense_len: p.dense_len,
        dense_range: p.dense_lo..p.dense_hi,
        dense_state_per_block: p.dense_state_per_block as usize,
        last_committed_step: p.last_committed_step,
    }
}

/// Cut exported rows into chunks of whole rows.
pub(crate) fn rows_to_chunks(
    block: &RowBlock,
    words: usize,
    chunk_bytes: usize,
) -> Vec<proto::RowsChunk> {
    let rows_per = (chunk_bytes / (words * 4).max(1)).max(1);
    let mut out: Vec<proto::RowsChunk> = block
        .data
        .chunks(rows_per * words.max(1))
        .enumerate()
        .map(|(i, c)| proto::RowsChunk {
            table: block.table.0,
            first_local: block.first_local.saturating_add((i * rows_per) as u64),
            words: f32s_to_bytes(c),
        })
        .collect();
    if out.is_empty() {
        out.push(proto::RowsChunk {
            table: block.table.0,
            first_local: block.first_local,
            words: Vec::new(),
        });
    }
    out
}

pub(crate) fn rows_from_chunk(chunk: proto::RowsChunk) -> Result<RowBlock, PsError> {
    Ok(RowBlock {
        table: TableId(chunk.table),
        first_local: chunk.first_local,
        data: bytes_to_f32s(&format!("rows of table {}", chunk.table), &chunk.words)?,
    })
}

/// Append `next` to `acc` if it continues it; a gap or another table is a malformed stream.
pub(crate) fn join_rows(
    acc: &mut Option<RowBlock>,
    next: RowBlock,
    words: usize,
) -> Result<(), PsError> {
    match acc {
        None => *acc = Some(next),
        Some(a) => {
            let expected = a
                .first_local
                .saturating_add((a.data.len() / words.max(1)) as u64);
            if a.table != next.table || next.first_local != expected {
                return Err(PsError::MalformedRequest(format!(
                    "row chunk for table {} at local row {} does not continue table {} at local row {expected}",
                    next.table.0, next.first_local, a.table.0
                )));
            }
            a.data.extend_from_slice(&next.data);
        }
    }
    Ok(())
}

pub(crate) fn dense_to_chunks(
    block: &DenseBlock,
    state_per_block: usize,
    chunk_bytes: usize,
) -> Vec<proto::DenseChunk> {
    let n = block.values.len().div_ceil(DENSE_BLOCK);
    if block.state.len() != n * state_per_block {
        // Inconsistent shapes cannot be cut by block; send them whole for the server to name.
        return vec![proto::DenseChunk {
            first_block: block.first_block,
            values: f32s_to_bytes(&block.values),
            state: f32s_to_bytes(&block.state),
        }];
    }
    let per_block_bytes = (DENSE_BLOCK + state_per_block) * 4;
    let blocks_per = (chunk_bytes / per_block_bytes).max(1);
    let mut out = Vec::new();
    let mut b = 0;
    while b < n || out.is_empty() {
        let e = (b + blocks_per).min(n);
        let vhi = (e * DENSE_BLOCK).min(block.values.len());
        let vlo = (b * DENSE_BLOCK).min(vhi);
        let shi = (e * state_per_block).min(block.state.len());
        let slo = (b * state_per_block).min(shi);
        out.push(proto::DenseChunk {
            first_block: block.first_block.saturating_add(b as u64),
            values: f32s_to_bytes(&block.values[vlo..vhi]),
            state: f32s_to_bytes(&block.state[slo..shi]),
        });
        if e == b {
            break;
        }
        b = e;
    }
    out
}

pub(crate) fn dense_from_chunk(chunk: proto::DenseChunk) -> Result<DenseBlock, PsError> {
    Ok(DenseBlock {
        first_block: chunk.first_block,
        values: bytes_to_f32s(
            &format!("dense values from block {}", chunk.first_block),
            &chunk.values,
        )?,
        state: bytes_to_f32s(
            &format!("dense state from block {}", chunk.first_block),
            &chunk.state,
        )?,
    })
}

/// Append `next` to `acc` if it continues it block for block.
pub(crate) fn join_dense(acc: &mut Option<DenseBlock>, next: DenseBlock) -> Result<(), PsError> {
    match acc {
        None => *acc = Some(next),
        Some(a) => {
            let whole = a.values.len().is_multiple_of(DENSE_BLOCK);
            let expected = a
                .first_block
                .saturating_add((a.values.len() / DENSE_BLOCK) as u64);
            if !whole || next.first_block != expected {
                return Err(PsError::MalformedRequest(format!(
                    "dense chunk at block {} does not continue the chunks before it (expected block {expected} after whole blocks)",
                    next.first_block
                )));
            }
            a.values.extend_from_slice(&next.values);
            a.state.extend_from_slice(&next.state);
        }
    }
    Ok(())
}

// ---- errors ----

use proto::ErrorKind as K;

fn code_of(e: &PsError) -> Code {
    match e {
        PsError::UnknownTable { .. } => Code::NotFound,
        PsError::RowOutOfRange { .. } | PsError::LocalRange { .. } => Code::OutOfRange,
        PsError::StepAlreadyCommitted { .. }
        | PsError::AlreadyStaged { .. }
        | PsError::StepWorkersMismatch { .. }
        | PsError::NotPrepared { .. }
        | PsError::Coding(_) => Code::FailedPrecondition,
        PsError::TooLarge { .. } => Code::ResourceExhausted,
        PsError::Internal(_) => Code::Internal,
        PsError::Unavailable { .. } | PsError::NotReady { .. } => Code::Unavailable,
        PsError::Refused { .. } => Code::PermissionDenied,
        PsError::Fenced { .. } => Code::FailedPrecondition,
        _ => Code::InvalidArgument,
    }
}

/// The kind, numbers and text that rebuild `e` on the client.
fn detail_of(e: &PsError) -> proto::ErrorDetail {
    let (kind, args, text): (K, Vec<u64>, String) = match e {
        PsError::UnknownTable { table, tables } => {
            (K::UnknownTable, vec![*table as u64, *tables], String::new())
        }
        PsError::RowOutOfRange { table, row, rows } => (
            K::RowOutOfRange,
            vec![*table as u64, *row, *rows],
            String::new(),
        ),
        PsError::NotOwner {
            table,
            row,
            owner,
            server,
        } => (
            K::NotOwner,
            vec![*table as u64, *row, *owner as u64, *server as u64],
            String::new(),
        ),
        PsError::GradientLength {
            table,
            rows,
            expected,
            got,
        } => (
            K::GradientLength,
            vec![*table as u64, *rows, *expected, *got],
            String::new(),
        ),
        PsError::PayloadLength { what, len, unit } => {
            (K::PayloadLength, vec![*len, *unit], what.clone())
        }
        PsError::NonFiniteGradient { table, row } => (
            K::NonFiniteGradient,
            vec![*table as u64, *row],
            String::new(),
        ),
        PsError::NonFiniteDenseGradient { index } => {
            (K::NonFiniteDenseGradient, vec![*index], String::new())
        }
        PsError::DenseRange {
            lo,
            hi,
            owned_lo,
            owned_hi,
            reason,
        } => (
            K::DenseRange,
            vec![*lo, *hi, *owned_lo, *owned_hi],
            reason.clone(),
        ),
        PsError::LocalRange {
            table,
            lo,
            hi,
            rows,
        } => (
            K::LocalRange,
            vec![*table as u64, *lo, *hi, *rows],
            String::new(),
        ),
        PsError::ShapeMismatch {
            what,
            expected,
            got,
        } => (K::ShapeMismatch, vec![*expected, *got], what.clone()),
        PsError::StepAlreadyCommitted { step, last } => {
            (K::StepAlreadyCommitted, vec![*step, *last], String::new())
        }
        PsError::AlreadyStaged { step, worker } => {
            (K::AlreadyStaged, vec![*step, *worker as u64], String::new())
        }
        PsError::StepWorkersMismatch { step, detail } => {
            (K::StepWorkersMismatch, vec![*step], detail.clone())
        }
        PsError::TooLarge { what, bytes, limit } => {
            (K::TooLarge, vec![*bytes, *limit], what.clone())
        }
        PsError::InvalidConfig(m) => (K::InvalidConfig, vec![], m.clone()),
        PsError::MalformedRequest(m) => (K::MalformedRequest, vec![], m.clone()),
        PsError::Internal(m) => (K::Internal, vec![], m.clone()),
        PsError::Coding(m) => (K::Coding, vec![], m.clone()),
        PsError::NotPrepared { step } => (K::NotPrepared, vec![*step], String::new()),
        PsError::NotReady { server, reason } => (K::NotReady, vec![*server as u64], reason.clone()),
        // The two texts travel as one, split at the first newline (`what` has none).
        PsError::Refused { what, reason } => (K::Refused, vec![], format!("{what}\n{reason}")),
        PsError::Fenced { who, newer } => (K::Fenced, vec![*newer], who.clone()),
        // Client-side conditions never come from a server; carried as text if they ever do.
        other => (K::Internal, vec![], other.to_string()),
    };
    proto::ErrorDetail {
        kind: kind as i32,
        args,
        text,
    }
}

fn from_detail(d: proto::ErrorDetail) -> Option<PsError> {
    let a = &d.args;
    let arg = |i: usize| a.get(i).copied();
    let u32_at = |i: usize| arg(i).and_then(|v| u32::try_from(v).ok());
    let text = d.text;
    Some(match K::try_from(d.kind).ok()? {
        K::Unspecified => return None,
        K::UnknownTable => PsError::UnknownTable {
            table: u32_at(0)?,
            tables: arg(1)?,
        },
        K::RowOutOfRange => PsError::RowOutOfRange {
            table: u32_at(0)?,
            row: arg(1)?,
            rows: arg(2)?,
        },
        K::NotOwner => PsError::NotOwner {
            table: u32_at(0)?,
            row: arg(1)?,
            owner: u32_at(2)?,
            server: u32_at(3)?,
        },
        K::GradientLength => PsError::GradientLength {
            table: u32_at(0)?,
            rows: arg(1)?,
            expected: arg(2)?,
            got: arg(3)?,
        },
        K::PayloadLength => PsError::PayloadLength {
            what: text,
            len: arg(0)?,
            unit: arg(1)?,
        },
        K::NonFiniteGradient => PsError::NonFiniteGradient {
            table: u32_at(0)?,
            row: arg(1)?,
        },
        K::NonFiniteDenseGradient => PsError::NonFiniteDenseGradient { index: arg(0)? },
        K::DenseRange => PsError::DenseRange {
            lo: arg(0)?,
            hi: arg(1)?,
            owned_lo: arg(2)?,
            owned_hi: arg(3)?,
            reason: text,
        },
        K::LocalRange => PsError::LocalRange {
            table: u32_at(0)?,
            lo: arg(1)?,
            hi: arg(2)?,
            rows: arg(3)?,
        },
        K::ShapeMismatch => PsError::ShapeMismatch {
            what: text,
            expected: arg(0)?,
            got: arg(1)?,
        },
        K::StepAlreadyCommitted => PsError::StepAlreadyCommitted {
            step: arg(0)?,
            last: arg(1)?,
        },
        K::AlreadyStaged => PsError::AlreadyStaged {
            step: arg(0)?,
            worker: u32_at(1)?,
        },
        K::StepWorkersMismatch => PsError::StepWorkersMismatch {
            step: arg(0)?,
            detail: text,
        },
        K::TooLarge => PsError::TooLarge {
            what: text,
            bytes: arg(0)?,
            limit: arg(1)?,
        },
        K::InvalidConfig => PsError::InvalidConfig(text),
        K::MalformedRequest => PsError::MalformedRequest(text),
        K::Internal => PsError::Internal(text),
        K::Coding => PsError::Coding(text),
        K::NotPrepared => PsError::NotPrepared { step: arg(0)? },
        K::NotReady => PsError::NotReady {
            server: u32_at(0)?,
            reason: text,
        },
        K::Fenced => PsError::Fenced {
            who: text,
            newer: arg(0)?,
        },
        K::Refused => {
            let (what, reason) = text.split_once('\n')?;
            PsError::Refused {
                what: what.to_string(),
                reason: reason.to_string(),
            }
        }
    })
}

/// The status a handler replies with for `e`.
pub(crate) fn to_status(e: &PsError) -> Status {
    let detail = detail_of(e).encode_to_vec();
    Status::with_details(code_of(e), e.to_string(), detail.into())
}

/// The error a client reports for a status: the server's own error when the details carry
/// one, else the transport's view.
pub(crate) fn from_status(s: &Status, addr: &str) -> PsError {
    if !s.details().is_empty() {
        if let Some(e) = proto::ErrorDetail::decode(s.details())
            .ok()
            .and_then(from_detail)
        {
            return e;
        }
    }
    match s.code() {
        Code::Unavailable | Code::Cancelled => PsError::Unavailable {
            addr: addr.to_string(),
            reason: s.message().to_string(),
        },
        code => PsError::Rpc {
            code: format!("{code:?}"),
            message: s.message().to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_server_error_survives_the_status_round_trip() {
        let errors = vec![
            PsError::UnknownTable {
                table: 3,
                tables: 2,
            },
            PsError::RowOutOfRange {
                table: 1,
                row: 99,
                rows: 10,
            },
            PsError::NotOwner {
                table: 1,
                row: 4,
                owner: 2,
                server: 0,
            },
            PsError::GradientLength {
                table: 0,
                rows: 3,
                expected: 12,
                got: 11,
            },
            PsError::PayloadLength {
                what: "row ids".into(),
                len: 7,
                unit: 8,
            },
            PsError::NonFiniteGradient { table: 2, row: 5 },
            PsError::NonFiniteDenseGradient { index: 17 },
            PsError::DenseRange {
                lo: 1,
                hi: 2,
                owned_lo: 0,
                owned_hi: 256,
                reason: "r".into(),
            },
            PsError::LocalRange {
                table: 0,
                lo: 5,
                hi: 9,
                rows: 6,
            },
            PsError::ShapeMismatch {
                what: "w".into(),
                expected: 4,
                got: 5,
            },
            PsError::StepAlreadyCommitted { step: 3, last: 4 },
            PsError::AlreadyStaged { step: 3, worker: 1 },
            PsError::StepWorkersMismatch {
                step: 3,
                detail: "d".into(),
            },
            PsError::TooLarge {
                what: "update".into(),
                bytes: 10,
                limit: 5,
            },
            PsError::InvalidConfig("c".into()),
            PsError::MalformedRequest("m".into()),
            PsError::Internal("i".into()),
            PsError::Coding("c".into()),
            PsError::NotPrepared { step: 4 },
            PsError::NotReady {
                server: 2,
                reason: "rebuilding".into(),
            },
            PsError::Fenced {
                who: "s1.0".into(),
                newer: 1,
            },
            PsError::Refused {
                what: "push".into(),
                reason: "use the ECRec service\nof this node".into(),
            },
        ];
        for e in errors {
            let s = to_status(&e);
            assert_eq!(from_status(&s, "x"), e, "status {s:?}");
        }
    }

    #[test]
    fn a_status_without_details_is_a_transport_error() {
        let e = from_status(&Status::resource_exhausted("too big"), "x");
        assert!(matches!(e, PsError::Rpc { ref code, .. } if code == "ResourceExhausted"));
        let e = from_status(&Status::unavailable("gone"), "h:1");
        assert!(matches!(e, PsError::Unavailable { ref addr, .. } if addr == "h:1"));
    }

    #[test]
    fn packed_numbers_round_trip_and_reject_torn_lengths() {
        let v = [1.5f32, -0.0, f32::MIN_POSITIVE, 3e38];
        let back = bytes_to_f32s("v", &f32s_to_bytes(&v)).unwrap();
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&v));
        let ids = [0u64, 7, u64::MAX];
        assert_eq!(bytes_to_u64s("ids", &u64s_to_bytes(&ids)).unwrap(), ids);
        assert!(matches!(
            bytes_to_f32s("v", &[0u8; 7]),
            Err(PsError::PayloadLength {
                len: 7,
                unit: 4,
                ..
            })
        ));
        assert!(matches!(
            bytes_to_u64s("ids", &[0u8; 12]),
            Err(PsError::PayloadLength {
                len: 12,
                unit: 8,
                ..
            })
        ));
    }

    #[test]
    fn chunked_updates_rebuild_the_same_sequence() {
        let dim = 4;
        let rows: Vec<u64> = (0..100).map(|r| r * 3 % 17).collect();
        let grads: Vec<f32> = (0..rows.len() * dim).map(|i| i as f32 * 0.5).collect();
        let dense: Vec<f32> = (0..DENSE_BLOCK * 5 + 3).map(|i| i as f32).collect();
        let u = Update::new()
            .with_sparse(TableId(2), rows, grads)
            .with_dense(512, dense);
        for chunk_bytes in [1, 100, 1000, 5000, 1 << 20] {
            let chunks = update_to_chunks(&u, dim, chunk_bytes);
            if chunk_bytes >= 1 << 20 {
                assert_eq!(chunks.len(), 1);
            } else {
                assert!(chunks.len() > 1, "{chunk_bytes}: {} chunks", chunks.len());
            }
            let limit = chunk_bytes.max(DENSE_BLOCK * 4) as u64;
            let mut back = Update::new();
            for c in chunks {
                assert!(chunk_bytes_of(&c) <= limit, "chunk over budget");
                append_chunk(&mut back, c).unwrap();
            }
            let flat_rows: Vec<u64> = back.sparse.iter().flat_map(|p| p.rows.clone()).collect();
            let flat_grads: Vec<f32> = back.sparse.iter().flat_map(|p| p.grads.clone()).collect();
            assert_eq!(flat_rows, u.sparse[0].rows);
            assert_eq!(flat_grads, u.sparse[0].grads);
            let mut expect_offset = 512;
            let mut flat_dense = Vec::new();
            for d in &back.dense {
                assert_eq!(d.offset, expect_offset);
                assert_eq!(d.offset % DENSE_BLOCK as u64, 0);
                expect_offset += d.grads.len() as u64;
                flat_dense.extend_from_slice(&d.grads);
            }
            assert_eq!(flat_dense, u.dense[0].grads);
        }
    }
}

#[cfg(test)]
mod fuzz {
    //! Every conversion from the parameter-server wire, fed arbitrary and mutated messages.

    use super::*;
    use crate::fuzz_support::{bytes, check, config, huge, mutated_encoding, mutation};
    use proptest::prelude::*;

    fn valid_chunk() -> proto::UpdateChunk {
        let u = Update::new()
            .with_sparse(TableId(1), vec![3, 9], vec![0.5; 8])
            .with_dense(0, vec![0.25; DENSE_BLOCK + 3]);
        update_to_chunks(&u, 4, 1 << 20).remove(0)
    }

    /// Every reader of the wire, on one message of each kind decoded from `wire`.
    fn every_reader(wire: &[u8]) {
        check(wire, |c: proto::UpdateChunk| {
            let mut u = Update::new();
            let _ = chunk_bytes_of(&c);
            append_chunk(&mut u, c)
        });
        check(wire, |c: proto::RowsChunk| {
            let a = rows_from_chunk(c.clone())?;
            let mut acc = Some(a.clone());
            join_rows(&mut acc, rows_from_chunk(c)?, 3)?;
            join_rows(&mut acc, a, 0)
        });
        check(wire, |c: proto::DenseChunk| {
            let a = dense_from_chunk(c)?;
            let mut acc = Some(a.clone());
            join_dense(&mut acc, a)
        });
        check(wire, info_from_proto);
        check(wire, |d: proto::ErrorDetail| {
            let s = Status::with_details(Code::Internal, "x", d.encode_to_vec().into());
            from_status(&s, "server")
        });
        // Status details are bytes a peer chose: decoded as they come.
        let s = Status::with_details(Code::Internal, "x", wire.to_vec().into());
        let _ = from_status(&s, "server");
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn arbitrary_bytes_as_every_message(wire in bytes(600)) {
            every_reader(&wire);
        }

        #[test]
        fn mutated_update_chunks(ms in prop::collection::vec(mutation(), 0..6)) {
            every_reader(&mutated_encoding(&valid_chunk(), &ms));
        }

        #[test]
        fn arbitrary_update_chunks(
            parts in prop::collection::vec((any::<u32>(), bytes(80), bytes(80)), 0..4),
            dense in prop::collection::vec((huge(), bytes(80)), 0..3),
        ) {
            let c = proto::UpdateChunk {
                sparse: parts
                    .into_iter()
                    .map(|(table, rows, grads)| proto::SparsePart { table, rows, grads })
                    .collect(),
                dense: dense
                    .into_iter()
                    .map(|(offset, grads)| proto::DensePart { offset, grads })
                    .collect(),
            };
            every_reader(&c.encode_to_vec());
        }

        #[test]
        fn arbitrary_row_and_dense_chunks(
            table in any::<u32>(),
            first in huge(),
            words in bytes(120),
            values in bytes(120),
        ) {
            every_reader(&proto::RowsChunk { table, first_local: first, words }.encode_to_vec());
            let d = proto::DenseChunk { first_block: first, values, state: Vec::new() };
            every_reader(&d.encode_to_vec());
            // Two chunks that do not continue each other are refused, whatever their numbers.
            let a = rows_from_chunk(proto::RowsChunk { table, first_local: first, words: vec![0; 4] }).unwrap();
            let mut acc = Some(a.clone());
            let b = RowBlock { first_local: first.wrapping_add(7), ..a };
            prop_assert!(join_rows(&mut acc, b, 1).is_err());
        }

        #[test]
        fn arbitrary_error_details(
            kind in -2i32..40,
            args in prop::collection::vec(huge(), 0..6),
            text in ".{0,40}",
        ) {
            every_reader(&proto::ErrorDetail { kind, args, text }.encode_to_vec());
        }
    }
}
