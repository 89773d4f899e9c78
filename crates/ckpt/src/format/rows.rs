//! Row files (`ROWS`, version 1): a run of embedding rows of one table with their global ids.
//!
//! Header body (after the payload length), 36 bytes:
//!
//! ```text
//! table u32 | dim u32 | state_words u32 | rows u64 | first_row u64 | last_row u64
//! ```
//!
//! Payload: `rows` row ids (u64 LE, strictly ascending), then `rows` rows of
//! `dim + state_words` f32 LE words (values then optimizer state, the [`RowLayout`] order).
//! The payload starts at byte 64 of the file, so both arrays are 8-byte aligned.

use ftrec_core::{RowId, RowLayout, TableId};

use super::{
    copy_le_into_f32s, parse_frame_checked, EncodedFile, Fields, FileChecksums, FileKind,
    FrameBuilder,
};
use crate::error::{CkptError, Result};

/// What a row file's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowChunkHeader {
    pub table: TableId,
    pub layout: RowLayout,
    pub rows: u64,
    /// Id of the first row (0 if the file is empty).
    pub first_row: RowId,
    /// Id of the last row (0 if the file is empty).
    pub last_row: RowId,
}

/// Encode `layout.words()`-word rows `rows` with ids `ids` (strictly ascending, one per row).
pub fn encode_rows(
    table: TableId,
    layout: RowLayout,
    ids: impl IntoIterator<Item = RowId>,
    rows: &[f32],
) -> Result<EncodedFile> {
    let words = layout.words();
    if layout.dim == 0 {
        return Err(CkptError::InvalidArgument(
            "row layout has dim 0".to_string(),
        ));
    }
    if !rows.len().is_multiple_of(words) {
        return Err(CkptError::InvalidArgument(format!(
            "{} words is not a whole number of {words}-word rows",
            rows.len()
        )));
    }
    let n = rows.len() / words;
    let mut id_bytes = Vec::with_capacity(n * 8);
    let mut first = 0;
    let mut last = 0;
    let mut count = 0usize;
    for id in ids {
        if count > 0 && id <= last {
            return Err(CkptError::InvalidArgument(format!(
                "row ids must be strictly ascending: {id} follows {last} in table {}",
                table.0
            )));
        }
        if count == 0 {
            first = id;
        }
        last = id;
        count += 1;
        id_bytes.extend_from_slice(&id.to_le_bytes());
    }
    if count != n {
        return Err(CkptError::InvalidArgument(format!(
            "{count} row ids for {n} rows in table {}",
            table.0
        )));
    }
    let mut head = Vec::with_capacity(36);
    head.extend_from_slice(&table.0.to_le_bytes());
    head.extend_from_slice(&(layout.dim as u32).to_le_bytes());
    head.extend_from_slice(&(layout.state_words as u32).to_le_bytes());
    head.extend_from_slice(&(n as u64).to_le_bytes());
    head.extend_from_slice(&first.to_le_bytes());
    head.extend_from_slice(&last.to_le_bytes());
    let payload_len = (n * 8 + rows.len() * 4) as u64;
    let mut b = FrameBuilder::new(FileKind::Rows, &head, payload_len);
    b.push(&id_bytes);
    b.push_f32s(rows);
    Ok(b.finish())
}

/// The header body of a row file for `ids` (strictly ascending) of `layout` rows.
fn rows_head(table: TableId, layout: RowLayout, ids: &[RowId]) -> Result<Vec<u8>> {
    if let Some(w) = ids.windows(2).find(|w| w[0] >= w[1]) {
        return Err(CkptError::InvalidArgument(format!(
            "row ids must be strictly ascending: {} follows {} in table {}",
            w[1], w[0], table.0
        )));
    }
    let mut head = Vec::with_capacity(36);
    head.extend_from_slice(&table.0.to_le_bytes());
    head.extend_from_slice(&(layout.dim as u32).to_le_bytes());
    head.extend_from_slice(&(layout.state_words as u32).to_le_bytes());
    head.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    head.extend_from_slice(&ids.first().copied().unwrap_or(0).to_le_bytes());
    head.extend_from_slice(&ids.last().copied().unwrap_or(0).to_le_bytes());
    Ok(head)
}

fn ids_le_bytes(ids: &[RowId]) -> Vec<u8> {
    let mut b = Vec::with_capacity(ids.len() * 8);
    for id in ids {
        b.extend_from_slice(&id.to_le_bytes());
    }
    b
}

/// [`encode_rows`] from rows already in little-endian bytes (`ids.len()` rows of
/// `layout.bytes()` bytes).
pub(crate) fn encode_rows_raw(
    table: TableId,
    layout: RowLayout,
    ids: &[RowId],
    row_bytes: &[u8],
) -> Result<EncodedFile> {
    if row_bytes.len() != ids.len() * layout.bytes() {
        return Err(CkptError::InvalidArgument(format!(
            "{} row bytes for {} rows of {} bytes in table {}",
            row_bytes.len(),
            ids.len(),
            layout.bytes(),
            table.0
        )));
    }
    let head = rows_head(table, layout, ids)?;
    let mut b = FrameBuilder::new(
        FileKind::Rows,
        &head,
        (ids.len() * 8 + row_bytes.len()) as u64,
    );
    b.push(&ids_le_bytes(ids));
    b.push(row_bytes);
    Ok(b.finish())
}

/// Write a row file for `ids` and `rows` (`layout.words()` words per row) straight to `out`,
/// without building it in memory first; returns its size and checksums. The bytes are exactly
/// those of [`encode_rows`].
pub(crate) fn write_rows_to(
    out: &mut impl std::io::Write,
    table: TableId,
    layout: RowLayout,
    ids: &[RowId],
    rows: &[f32],
) -> Result<(u64, FileChecksums)> {
    if rows.len() != ids.len() * layout.words() {
        return Err(CkptError::InvalidArgument(format!(
            "{} words for {} rows of {} words in table {}",
            rows.len(),
            ids.len(),
            layout.words(),
            table.0
        )));
    }
    let head = rows_head(table, layout, ids)?;
    let id_bytes = ids_le_bytes(ids);
    let row_bytes = super::f32s_le_bytes(rows);
    let payload_len = (id_bytes.len() + row_bytes.len()) as u64;
    let (prefix, header_crc) = super::frame_head(FileKind::Rows, &head, payload_len);
    let payload_crc = crc32c::crc32c_append(crc32c::crc32c(&id_bytes), &row_bytes);
    let io = |e: std::io::Error| CkptError::io(format!("row file of table {}", table.0), e);
    out.write_all(&prefix).map_err(io)?;
    out.write_all(&id_bytes).map_err(io)?;
    out.write_all(&row_bytes).map_err(io)?;
    out.write_all(&payload_crc.to_le_bytes()).map_err(io)?;
    Ok((
        prefix.len() as u64 + payload_len + 4,
        FileChecksums {
            header: header_crc,
            payload: payload_crc,
        },
    ))
}

/// A decoded row file borrowing the file's bytes.
#[derive(Debug, Clone, Copy)]
pub struct RowChunk<'a> {
    pub header: RowChunkHeader,
    ids: &'a [u8],
    rows: &'a [u8],
    pub checksums: FileChecksums,
}

impl<'a> RowChunk<'a> {
    /// Parse and verify a row file named `file`: frame checksums, header consistency, and
    /// strictly ascending ids that match the header's first and last row.
    pub fn decode(file: &str, data: &'a [u8]) -> Result<Self> {
        Self::decode_checked(file, data, true)
    }

    /// Decode bytes that already passed [`RowChunk::decode`], without repeating the checks
    /// that read the whole payload.
    pub(crate) fn decode_verified(file: &str, data: &'a [u8]) -> Result<Self> {
        Self::decode_checked(file, data, false)
    }

    fn decode_checked(file: &str, data: &'a [u8], full: bool) -> Result<Self> {
        let corrupt = |reason: String| CkptError::Corrupt {
            file: file.to_string(),
            reason,
        };
        let frame = parse_frame_checked(file, FileKind::Rows, data, full)?;
        let mut f = Fields::new(file, frame.header);
        let table = TableId(f.u32()?);
        let dim = f.u32()? as usize;
        let state_words = f.u32()? as usize;
        let rows = f.u64()?;
        let first_row = f.u64()?;
        let last_row = f.u64()?;
        let layout = super::stored_layout(file, "the row header", dim, state_words)?;
        let expected = (rows as u128) * (8 + layout.bytes() as u128);
        if expected != frame.payload.len() as u128 {
            return Err(corrupt(format!(
                "{rows} rows of {} bytes need a {expected}-byte payload, found {}",
                layout.bytes(),
                frame.payload.len()
            )));
        }
        let (ids, rows_bytes) = frame.payload.split_at(rows as usize * 8);
        let chunk = RowChunk {
            header: RowChunkHeader {
                table,
                layout,
                rows,
                first_row,
                last_row,
            },
            ids,
            rows: rows_bytes,
            checksums: frame.checksums,
        };
        if !full {
            return Ok(chunk);
        }
        let mut prev: Option<RowId> = None;
        for id in chunk.ids() {
            if prev.is_some_and(|p| id <= p) {
                return Err(corrupt(format!(
                    "row ids not strictly ascending ({id} after {})",
                    prev.unwrap_or_default()
                )));
            }
            prev = Some(id);
        }
        if rows > 0 && (chunk.id(0) != first_row || prev != Some(last_row)) {
            return Err(corrupt(format!(
                "header says rows {first_row}..={last_row}, ids say {}..={}",
                chunk.id(0),
                prev.unwrap_or_default()
            )));
        }
        Ok(chunk)
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.header.rows as usize
    }

    pub fn is_empty(&self) -> bool {
        self.header.rows == 0
    }

    /// Id of row `i` of the file.
    pub fn id(&self, i: usize) -> RowId {
        u64::from_le_bytes(self.ids[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }

    /// All ids, in file order (ascending).
    pub fn ids(&self) -> impl Iterator<Item = RowId> + 'a {
        self.ids
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
    }

    /// Raw little-endian bytes of row `i`.
    pub fn row_bytes(&self, i: usize) -> &'a [u8] {
        let b = self.header.layout.bytes();
        &self.rows[i * b..(i + 1) * b]
    }

    /// Raw little-endian bytes of rows `lo..hi`.
    pub fn rows_bytes(&self, lo: usize, hi: usize) -> &'a [u8] {
        let b = self.header.layout.bytes();
        &self.rows[lo * b..hi * b]
    }

    /// Copy row `i` into `dst` (`layout.words()` words).
    pub fn copy_row(&self, i: usize, dst: &mut [f32]) {
        copy_le_into_f32s(self.row_bytes(i), dst);
    }

    /// Copy rows `lo..hi` into `dst` (`(hi - lo) * layout.words()` words).
    pub fn copy_rows(&self, lo: usize, hi: usize, dst: &mut [f32]) {
        copy_le_into_f32s(self.rows_bytes(lo, hi), dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (RowLayout, Vec<RowId>, Vec<f32>, EncodedFile) {
        let layout = RowLayout::new(3, 1);
        let ids = vec![2, 5, 6, 40];
        let rows: Vec<f32> = (0..16).map(|i| i as f32 * 0.5 - 3.0).collect();
        let f = encode_rows(TableId(7), layout, ids.iter().copied(), &rows).unwrap();
        (layout, ids, rows, f)
    }

    #[test]
    fn round_trip() {
        let (layout, ids, rows, f) = sample();
        assert_eq!(f.bytes.len(), 24 + 44 + 4 * 8 + 16 * 4);
        let c = RowChunk::decode("t", &f.bytes).unwrap();
        assert_eq!(c.header.table, TableId(7));
        assert_eq!(c.header.layout, layout);
        assert_eq!((c.header.first_row, c.header.last_row), (2, 40));
        assert_eq!(c.ids().collect::<Vec<_>>(), ids);
        assert_eq!(c.checksums, f.checksums);
        let mut back = vec![0f32; 16];
        c.copy_rows(0, 4, &mut back);
        assert_eq!(back, rows);
        let mut one = vec![0f32; 4];
        c.copy_row(2, &mut one);
        assert_eq!(one, rows[8..12]);
        // The payload starts 8-byte aligned.
        assert_eq!((f.bytes.len() - 4 - 4 * 8 - 16 * 4) % 8, 0);
    }

    #[test]
    fn streamed_and_raw_encodings_equal_encode_rows() {
        let (layout, ids, rows, f) = sample();
        let mut out = Vec::new();
        let (size, sums) = write_rows_to(&mut out, TableId(7), layout, &ids, &rows).unwrap();
        assert_eq!(out, f.bytes.to_vec());
        assert_eq!((size, sums), (f.size(), f.checksums));
        let raw = encode_rows_raw(
            TableId(7),
            layout,
            &ids,
            &super::super::f32s_le_bytes(&rows),
        )
        .unwrap();
        assert_eq!(raw.bytes, f.bytes);
        assert!(write_rows_to(&mut Vec::new(), TableId(7), layout, &[3, 2], &rows[..8]).is_err());
    }

    #[test]
    fn empty_file_round_trips() {
        let f = encode_rows(TableId(1), RowLayout::new(2, 0), [], &[]).unwrap();
        let c = RowChunk::decode("e", &f.bytes).unwrap();
        assert!(c.is_empty());
    }

    #[test]
    fn bad_input_is_refused() {
        let layout = RowLayout::new(2, 0);
        assert!(matches!(
            encode_rows(TableId(0), layout, [3, 1], &[0.0; 4]),
            Err(CkptError::InvalidArgument(_))
        ));
        assert!(matches!(
            encode_rows(TableId(0), layout, [1], &[0.0; 4]),
            Err(CkptError::InvalidArgument(_))
        ));
        assert!(matches!(
            encode_rows(TableId(0), layout, [1, 2], &[0.0; 3]),
            Err(CkptError::InvalidArgument(_))
        ));
    }

    #[test]
    fn flip_any_byte_or_truncate_is_an_error_naming_the_file() {
        let (_, _, _, f) = sample();
        for i in 0..f.bytes.len() {
            let mut d = f.bytes.to_vec();
            d[i] ^= 0x10;
            let err = RowChunk::decode("s0/t7.rows", &d).unwrap_err();
            assert_eq!(err.file(), Some("s0/t7.rows"), "byte {i}: {err}");
        }
        for len in 0..f.bytes.len() {
            let err = RowChunk::decode("s0/t7.rows", &f.bytes[..len]).unwrap_err();
            assert_eq!(err.file(), Some("s0/t7.rows"), "len {len}: {err}");
        }
    }
}
