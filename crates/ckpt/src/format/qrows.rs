//! Quantized row files (`QROW`, version 1): embedding rows whose values are quantized to 8 or 4
//! bits, as Check-N-Run stores its differential checkpoints (uniform asymmetric quantization per
//! row: each row keeps its minimum and step in f32 and one code per value). Optimizer state is
//! kept in f32 (one word per row for row-wise Adagrad; quantizing it would bias every later
//! update of the row). A restore from these files is approximate; [`quantize_row`] returns the
//! largest absolute error it made, and the writer reports the largest over a file.
//!
//! Header body (after the payload length), 44 bytes:
//!
//! ```text
//! table u32 | dim u32 | state_words u32 | bits u32 | rows u64 | first_row u64 | last_row u64 | 0 u32
//! ```
//!
//! The last word pads the payload to byte 72. Payload: `rows` row ids (u64 LE, strictly
//! ascending), then `rows` records of `8 + ceil(dim * bits / 8) + 4 * state_words` bytes:
//! `min` f32 LE, `step` f32 LE, the codes (4-bit codes two to a byte, low nibble first), the
//! optimizer state f32 LE. A value is `min + code * step`.

use std::io::Write;

use ftrec_core::{RowId, RowLayout, TableId};
use serde::{Deserialize, Serialize};

use super::{parse_frame_checked, EncodedFile, Fields, FileChecksums, FileKind};
use crate::error::{CkptError, Result};

/// Bits per quantized value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QuantBits {
    #[serde(rename = "8")]
    Eight,
    #[serde(rename = "4")]
    Four,
}

impl QuantBits {
    pub fn bits(self) -> u32 {
        match self {
            QuantBits::Eight => 8,
            QuantBits::Four => 4,
        }
    }

    pub fn from_bits(bits: u32) -> Option<QuantBits> {
        match bits {
            8 => Some(QuantBits::Eight),
            4 => Some(QuantBits::Four),
            _ => None,
        }
    }

    fn levels(self) -> u32 {
        (1 << self.bits()) - 1
    }

    /// Bytes of the codes of a `dim`-value row.
    pub fn code_bytes(self, dim: usize) -> usize {
        (dim * self.bits() as usize).div_ceil(8)
    }
}

/// Bytes of one record (min, step, codes, state).
pub fn record_bytes(layout: RowLayout, bits: QuantBits) -> usize {
    8 + bits.code_bytes(layout.dim) + 4 * layout.state_words
}

/// Quantize the values of `row` (`layout.words()` words) into `out` (one record); returns the
/// largest absolute error of a dequantized value. A non-finite value cannot be quantized.
pub fn quantize_row(
    row: &[f32],
    layout: RowLayout,
    bits: QuantBits,
    out: &mut Vec<u8>,
) -> std::result::Result<f32, String> {
    let values = &row[..layout.dim];
    let mut lo = f32::INFINITY;
    let mut hi = f32::NEG_INFINITY;
    for &v in values {
        if !v.is_finite() {
            return Err(format!("value {v} cannot be quantized"));
        }
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let levels = bits.levels();
    let mut step = (hi - lo) / levels as f32;
    if !(step.is_finite() && step > 0.0) {
        step = 0.0;
    }
    out.extend_from_slice(&lo.to_le_bytes());
    out.extend_from_slice(&step.to_le_bytes());
    let mut err = 0f32;
    let mut packed = 0u8;
    for (i, &v) in values.iter().enumerate() {
        let code = if step > 0.0 {
            (((v - lo) / step).round() as i64).clamp(0, levels as i64) as u32
        } else {
            0
        };
        err = err.max((lo + code as f32 * step - v).abs());
        match bits {
            QuantBits::Eight => out.push(code as u8),
            QuantBits::Four => {
                if i % 2 == 0 {
                    packed = code as u8;
                } else {
                    out.push(packed | ((code as u8) << 4));
                }
            }
        }
    }
    if bits == QuantBits::Four && values.len() % 2 == 1 {
        out.push(packed);
    }
    for w in &row[layout.dim..] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    Ok(err)
}

/// Decode one record into `dst` (`layout.words()` words).
pub fn dequantize_record(rec: &[u8], layout: RowLayout, bits: QuantBits, dst: &mut [f32]) {
    let lo = f32::from_le_bytes(rec[0..4].try_into().expect("4"));
    let step = f32::from_le_bytes(rec[4..8].try_into().expect("4"));
    let codes = &rec[8..8 + bits.code_bytes(layout.dim)];
    for (i, d) in dst[..layout.dim].iter_mut().enumerate() {
        let code = match bits {
            QuantBits::Eight => codes[i] as u32,
            QuantBits::Four => ((codes[i / 2] >> ((i % 2) * 4)) & 0x0f) as u32,
        };
        *d = lo + code as f32 * step;
    }
    let state = &rec[8 + codes.len()..];
    for (d, c) in dst[layout.dim..].iter_mut().zip(state.chunks_exact(4)) {
        *d = f32::from_le_bytes(c.try_into().expect("4"));
    }
}

/// A writer that checksums what passes through.
struct Crc<W> {
    inner: W,
    crc: u32,
}

impl<W: Write> Write for Crc<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Quantize rows `ids` (strictly ascending; `rows` holds `layout.words()` f32 words each) of
/// `table` and write the file to `out`; returns its size, checksums and the largest absolute
/// error of any quantized value.
pub fn write_qrows_to(
    out: &mut impl Write,
    table: TableId,
    layout: RowLayout,
    bits: QuantBits,
    ids: &[RowId],
    rows: &[f32],
) -> Result<(u64, FileChecksums, f32)> {
    let words = layout.words();
    if layout.dim == 0 || rows.len() != ids.len() * words {
        return Err(CkptError::InvalidArgument(format!(
            "table {}: {} words for {} rows of layout {layout:?}",
            table.0,
            rows.len(),
            ids.len()
        )));
    }
    if let Some(w) = ids.windows(2).find(|w| w[0] >= w[1]) {
        return Err(CkptError::InvalidArgument(format!(
            "row ids must be strictly ascending: {} follows {} in table {}",
            w[1], w[0], table.0
        )));
    }
    let rec = record_bytes(layout, bits);
    let payload_len = (ids.len() * (8 + rec)) as u64;
    let mut head = Vec::with_capacity(44);
    head.extend_from_slice(&table.0.to_le_bytes());
    head.extend_from_slice(&(layout.dim as u32).to_le_bytes());
    head.extend_from_slice(&(layout.state_words as u32).to_le_bytes());
    head.extend_from_slice(&bits.bits().to_le_bytes());
    head.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    head.extend_from_slice(&ids.first().copied().unwrap_or(0).to_le_bytes());
    head.extend_from_slice(&ids.last().copied().unwrap_or(0).to_le_bytes());
    head.extend_from_slice(&0u32.to_le_bytes());
    let (prefix, header_crc) = super::frame_head(FileKind::QuantRows, &head, payload_len);
    let io = |e: std::io::Error| CkptError::io(format!("quantized rows of table {}", table.0), e);
    out.write_all(&prefix).map_err(io)?;
    let mut w = Crc {
        inner: &mut *out,
        crc: 0,
    };
    let mut buf = Vec::with_capacity(64 << 10);
    for id in ids {
        buf.extend_from_slice(&id.to_le_bytes());
        if buf.len() >= 60 << 10 {
            w.write_all(&buf).map_err(io)?;
            buf.clear();
        }
    }
    let mut max_err = 0f32;
    for (i, row) in rows.chunks_exact(words).enumerate() {
        let e = quantize_row(row, layout, bits, &mut buf).map_err(|why| {
            CkptError::InvalidArgument(format!("row {} of table {}: {why}", ids[i], table.0))
        })?;
        max_err = max_err.max(e);
        if buf.len() >= 60 << 10 {
            w.write_all(&buf).map_err(io)?;
            buf.clear();
        }
    }
    w.write_all(&buf).map_err(io)?;
    let payload_crc = w.crc;
    out.write_all(&payload_crc.to_le_bytes()).map_err(io)?;
    Ok((
        prefix.len() as u64 + payload_len + 4,
        FileChecksums {
            header: header_crc,
            payload: payload_crc,
        },
        max_err,
    ))
}

/// [`write_qrows_to`] into memory.
pub fn encode_qrows(
    table: TableId,
    layout: RowLayout,
    bits: QuantBits,
    ids: &[RowId],
    rows: &[f32],
) -> Result<(EncodedFile, f32)> {
    let mut out = Vec::new();
    let (_, checksums, err) = write_qrows_to(&mut out, table, layout, bits, ids, rows)?;
    Ok((
        EncodedFile {
            bytes: bytes::Bytes::from(out),
            checksums,
        },
        err,
    ))
}

/// What a quantized row file's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QRowChunkHeader {
    pub table: TableId,
    pub layout: RowLayout,
    pub bits: QuantBits,
    pub rows: u64,
    pub first_row: RowId,
    pub last_row: RowId,
}

/// A decoded quantized row file borrowing the file's bytes.
#[derive(Debug, Clone, Copy)]
pub struct QRowChunk<'a> {
    pub header: QRowChunkHeader,
    ids: &'a [u8],
    records: &'a [u8],
    pub checksums: FileChecksums,
}

impl<'a> QRowChunk<'a> {
    /// Parse and verify a quantized row file named `file`.
    pub fn decode(file: &str, data: &'a [u8]) -> Result<Self> {
        Self::decode_checked(file, data, true)
    }

    pub(crate) fn decode_verified(file: &str, data: &'a [u8]) -> Result<Self> {
        Self::decode_checked(file, data, false)
    }

    fn decode_checked(file: &str, data: &'a [u8], full: bool) -> Result<Self> {
        let corrupt = |reason: String| CkptError::Corrupt {
            file: file.to_string(),
            reason,
        };
        let frame = parse_frame_checked(file, FileKind::QuantRows, data, full)?;
        let mut f = Fields::new(file, frame.header);
        let table = TableId(f.u32()?);
        let dim = f.u32()? as usize;
        let state_words = f.u32()? as usize;
        let bits = f.u32()?;
        let rows = f.u64()?;
        let first_row = f.u64()?;
        let last_row = f.u64()?;
        let layout = super::stored_layout(file, "the row header", dim, state_words)?;
        let bits = QuantBits::from_bits(bits)
            .ok_or_else(|| corrupt(format!("{bits} bits per value is not 8 or 4")))?;
        let rec = record_bytes(layout, bits);
        let expected = rows as u128 * (8 + rec as u128);
        if expected != frame.payload.len() as u128 {
            return Err(corrupt(format!(
                "{rows} rows of {rec}-byte records need a {expected}-byte payload, found {}",
                frame.payload.len()
            )));
        }
        let (ids, records) = frame.payload.split_at(rows as usize * 8);
        let c = QRowChunk {
            header: QRowChunkHeader {
                table,
                layout,
                bits,
                rows,
                first_row,
                last_row,
            },
            ids,
            records,
            checksums: frame.checksums,
        };
        if full {
            let mut prev: Option<RowId> = None;
            for id in c.ids() {
                if prev.is_some_and(|p| id <= p) {
                    return Err(corrupt(format!(
                        "row ids not strictly ascending ({id} after {})",
                        prev.unwrap_or_default()
                    )));
                }
                prev = Some(id);
            }
            if rows > 0 && (c.id(0) != first_row || prev != Some(last_row)) {
                return Err(corrupt(format!(
                    "header says rows {first_row}..={last_row}, ids say {}..={}",
                    c.id(0),
                    prev.unwrap_or_default()
                )));
            }
        }
        Ok(c)
    }

    pub fn len(&self) -> usize {
        self.header.rows as usize
    }

    pub fn is_empty(&self) -> bool {
        self.header.rows == 0
    }

    pub fn id(&self, i: usize) -> RowId {
        u64::from_le_bytes(self.ids[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }

    pub fn ids(&self) -> impl Iterator<Item = RowId> + 'a {
        self.ids
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
    }

    /// Dequantize row `i` into `dst` (`layout.words()` words).
    pub fn dequantize_row(&self, i: usize, dst: &mut [f32]) {
        let rec = record_bytes(self.header.layout, self.header.bits);
        dequantize_record(
            &self.records[i * rec..(i + 1) * rec],
            self.header.layout,
            self.header.bits,
            dst,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize, layout: RowLayout) -> Vec<f32> {
        (0..n * layout.words())
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect()
    }

    #[test]
    fn round_trip_within_half_a_step_and_state_exact() {
        for bits in [QuantBits::Eight, QuantBits::Four] {
            for dim in [1usize, 3, 8] {
                let layout = RowLayout::new(dim, 2);
                let data = rows(5, layout);
                let ids = [3u64, 4, 10, 11, 90];
                let (f, err) = encode_qrows(TableId(4), layout, bits, &ids, &data).unwrap();
                let c = QRowChunk::decode("q", &f.bytes).unwrap();
                assert_eq!(c.header.bits, bits);
                assert_eq!(c.ids().collect::<Vec<_>>(), ids);
                let mut got_err = 0f32;
                let mut back = vec![0f32; layout.words()];
                for (i, orig) in data.chunks_exact(layout.words()).enumerate() {
                    c.dequantize_row(i, &mut back);
                    let lo = orig[..dim].iter().cloned().fold(f32::INFINITY, f32::min);
                    let hi = orig[..dim]
                        .iter()
                        .cloned()
                        .fold(f32::NEG_INFINITY, f32::max);
                    let step = (hi - lo) / ((1 << bits.bits()) - 1) as f32;
                    for k in 0..dim {
                        let e = (back[k] - orig[k]).abs();
                        assert!(
                            e <= step / 2.0 + 1e-6,
                            "bits {bits:?} dim {dim}: {e} > {step}/2"
                        );
                        got_err = got_err.max(e);
                    }
                    // Optimizer state is kept bit for bit.
                    for k in dim..layout.words() {
                        assert_eq!(back[k].to_bits(), orig[k].to_bits());
                    }
                }
                assert_eq!(err, got_err, "the reported error is the largest one");
                let mut streamed = Vec::new();
                write_qrows_to(&mut streamed, TableId(4), layout, bits, &ids, &data).unwrap();
                assert_eq!(streamed, f.bytes.to_vec());
            }
        }
    }

    #[test]
    fn a_constant_row_is_exact_and_bad_rows_are_refused() {
        let layout = RowLayout::new(4, 0);
        let (f, err) = encode_qrows(TableId(0), layout, QuantBits::Four, &[7], &[0.5; 4]).unwrap();
        assert_eq!(err, 0.0);
        let mut back = [0f32; 4];
        QRowChunk::decode("q", &f.bytes)
            .unwrap()
            .dequantize_row(0, &mut back);
        assert_eq!(back, [0.5; 4]);
        let nan = [0.0, f32::NAN, 1.0, 2.0];
        assert!(matches!(
            encode_qrows(TableId(0), layout, QuantBits::Eight, &[1], &nan),
            Err(CkptError::InvalidArgument(m)) if m.contains("row 1")
        ));
        assert!(encode_qrows(TableId(0), layout, QuantBits::Eight, &[2, 1], &[0.0; 8]).is_err());
    }

    #[test]
    fn flip_any_byte_or_truncate_is_an_error_naming_the_file() {
        let layout = RowLayout::new(5, 1);
        let (f, _) = encode_qrows(
            TableId(1),
            layout,
            QuantBits::Four,
            &[1, 2, 8],
            &rows(3, layout),
        )
        .unwrap();
        for i in 0..f.bytes.len() {
            let mut d = f.bytes.to_vec();
            d[i] ^= 0x01;
            let err = QRowChunk::decode("s0/t1.qrows", &d).unwrap_err();
            assert_eq!(err.file(), Some("s0/t1.qrows"), "byte {i}: {err}");
        }
        for len in 0..f.bytes.len() {
            let err = QRowChunk::decode("s0/t1.qrows", &f.bytes[..len]).unwrap_err();
            assert_eq!(err.file(), Some("s0/t1.qrows"), "len {len}: {err}");
        }
    }
}
