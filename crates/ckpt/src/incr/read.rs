//! Reading chunk parts: exactly the bytes of the live parts, with ranged reads (nearby parts of
//! one file coalesced into one read), each part checked against the crc32c its record carries.
//!
//! A bundle keeps the sections of chunks that later rounds split until its last live part dies;
//! reading whole files would read those dead sections too (on the benchmark's workload, nine
//! bytes in ten). Parts carry their absolute offsets and their own checksum, so a read fetches
//! and trusts nothing else.

use std::time::Instant;

use bytes::Bytes;
use ftrec_core::RowId;

use crate::checkpoint::Checkpoints;
use crate::error::{CkptError, Result};
use crate::format::{FileRef, Part};

/// Parts of one file closer than this are read in one request.
const COALESCE_GAP: u64 = 64 << 10;
/// A single span covering at least this share of its file reads the whole file instead (one
/// sequential read into a buffer that needs no zero-filling first; a bundle with dead sections
/// below the share keeps its ranged read).
const WHOLE_FILE_SHARE: f64 = 0.9;

/// The bytes of one part, verified.
#[derive(Debug, Clone)]
pub struct PartData {
    ids: Bytes,
    rows: Bytes,
    row_bytes: usize,
}

impl PartData {
    pub fn len(&self) -> usize {
        self.ids.len() / 8
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn id(&self, i: usize) -> RowId {
        u64::from_le_bytes(self.ids[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }

    pub fn ids(&self) -> impl Iterator<Item = RowId> + '_ {
        self.ids
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
    }

    pub fn row(&self, i: usize) -> &[u8] {
        &self.rows[i * self.row_bytes..(i + 1) * self.row_bytes]
    }

    pub fn rows(&self) -> &[u8] {
        &self.rows
    }

    /// The id bytes (8 little-endian bytes an id, ascending: [`read_parts`] checked).
    pub fn id_bytes(&self) -> &[u8] {
        &self.ids
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }
}

/// crc32c of a part's id bytes followed by its row bytes.
pub fn part_crc(ids: &[u8], rows: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(ids), rows)
}

/// What reads cost.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadStats {
    pub requests: u64,
    pub bytes: u64,
    pub seconds: f64,
}

/// Read `parts` of file `f` (their `file` fields are ignored), in the order given.
pub async fn read_parts(
    ckpts: &Checkpoints,
    f: &FileRef,
    parts: &[Part],
    stats: &mut ReadStats,
) -> Result<Vec<PartData>> {
    let key = ckpts.file_key(&f.ckpt, &f.path)?;
    // Every byte range wanted, then spans of nearby ranges.
    let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(parts.len() * 2);
    for p in parts {
        let n = p.hi - p.lo;
        ranges.push((p.ids_at, p.ids_at + 8 * n));
        ranges.push((p.rows_at, p.rows_at + n * p.row_bytes as u64));
    }
    ranges.sort_unstable();
    let wanted: u64 = ranges.iter().map(|(a, b)| b - a).sum();
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for (a, b) in ranges {
        match spans.last_mut() {
            Some(s) if a <= s.1 + COALESCE_GAP => s.1 = s.1.max(b),
            _ => spans.push((a, b)),
        }
    }
    // One request when the file is mostly wanted anyway (compaction keeps row-0 files at least
    // half live): fewer requests beat fewer bytes, on a disk as on S3.
    if let (Some(first), Some(last)) = (spans.first().copied(), spans.last().copied()) {
        if spans.len() > 1 && (last.1 - first.0) <= 2 * wanted {
            spans = vec![(first.0, last.1)];
        }
    }
    let t0 = Instant::now();
    let mut data = Vec::with_capacity(spans.len());
    if let Some(&(_, b)) = spans.iter().find(|s| s.1 > f.size) {
        return Err(CkptError::Corrupt {
            file: key.to_string(),
            reason: format!("a chunk part ends at byte {b}, the file has {}", f.size),
        });
    }
    match spans[..] {
        [(a, b)] if (b - a) as f64 >= WHOLE_FILE_SHARE * f.size as f64 => {
            // Most of the file: read it whole, in one sequential read.
            let all = ckpts.store().get(&key).await?;
            if all.len() as u64 != f.size {
                return Err(CkptError::Corrupt {
                    file: key.to_string(),
                    reason: format!("{} bytes, the piece index says {}", all.len(), f.size),
                });
            }
            data.push(all.slice(a as usize..b as usize));
            stats.requests += 1;
            stats.bytes += f.size;
        }
        _ => {
            for &(a, b) in &spans {
                data.push(ckpts.store().get_range(&key, a..b).await?);
                stats.requests += 1;
                stats.bytes += b - a;
            }
        }
    }
    stats.seconds += t0.elapsed().as_secs_f64();
    let slice = |a: u64, b: u64| -> Bytes {
        let i = spans.partition_point(|s| s.1 < b);
        let (s0, _) = spans[i];
        data[i].slice((a - s0) as usize..(b - s0) as usize)
    };
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        let n = p.hi - p.lo;
        let ids = slice(p.ids_at, p.ids_at + 8 * n);
        let rows = slice(p.rows_at, p.rows_at + n * p.row_bytes as u64);
        let got = part_crc(&ids, &rows);
        if got != p.crc {
            return Err(CkptError::ChecksumMismatch {
                file: key.to_string(),
                what: "chunk part",
                expected: p.crc,
                got,
            });
        }
        let d = PartData {
            ids,
            rows,
            row_bytes: p.row_bytes as usize,
        };
        if let Some(w) = first_not_ascending(&d.ids) {
            return Err(CkptError::Corrupt {
                file: key.to_string(),
                reason: format!("chunk part ids not ascending at row {w}"),
            });
        }
        out.push(d);
    }
    Ok(out)
}

/// The first row whose id (8 little-endian bytes each in `ids`) is not above the one before.
fn first_not_ascending(ids: &[u8]) -> Option<usize> {
    let mut prev: Option<u64> = None;
    for (i, c) in ids.chunks_exact(8).enumerate() {
        let id = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        if prev.is_some_and(|p| id <= p) {
            return Some(i);
        }
        prev = Some(id);
    }
    None
}
