//! Bundle files (`BNDL`, version 1): several chunks of embedding rows, of any tables and any
//! checkpoint columns, concatenated in one file (IncrCP §4.4, the concatenation approach: the
//! chunks one extraction round writes to one row of the 2-D list go to one file, not one file
//! each, so a restore reads few large files instead of many small ones).
//!
//! Header body (after the payload length), 20 bytes:
//!
//! ```text
//! server u32 | sections u32 | rows u64 | 0 u32
//! ```
//!
//! The last word pads the payload to byte 48 of the file. Payload: a table of contents of
//! `sections` entries of 48 bytes,
//!
//! ```text
//! table u32 | column u32 | dim u32 | state_words u32 | rows u64 | first_row u64 | last_row u64 | offset u64
//! ```
//!
//! then each section's data at `offset` (bytes from the payload's start, 8-byte aligned, in
//! table-of-contents order with no gap): `rows` row ids (u64 LE, strictly ascending), then
//! `rows` rows of `dim + state_words` f32 LE words (values then optimizer state), zero-padded to
//! a multiple of 8 bytes. `column` is the checkpoint column the rows were saved in (IncrCP's
//! 2-D list: which version of a row this is).

use ftrec_core::{RowId, RowLayout, ServerId, TableId};

use super::{copy_le_into_f32s, parse_frame_checked, EncodedFile, Fields, FileKind, FrameBuilder};
use crate::error::{CkptError, Result};

/// Bytes of one table-of-contents entry.
const TOC_ENTRY: usize = 48;

/// One section to write: rows `ids` (strictly ascending) of `table`, as little-endian bytes
/// (`ids.len() * layout.bytes()` of them).
#[derive(Debug, Clone, Copy)]
pub struct SectionIn<'a> {
    pub table: TableId,
    pub layout: RowLayout,
    pub column: u32,
    pub ids: &'a [RowId],
    pub rows: &'a [u8],
}

/// What a section's table-of-contents entry says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleSection {
    pub table: TableId,
    pub column: u32,
    pub layout: RowLayout,
    pub rows: u64,
    /// Id of the first row (0 if the section is empty).
    pub first_row: RowId,
    /// Id of the last row (0 if the section is empty).
    pub last_row: RowId,
    offset: u64,
}

fn padded(n: usize) -> usize {
    n.div_ceil(8) * 8
}

fn section_bytes(rows: u64, layout: RowLayout) -> u128 {
    let data = rows as u128 * (8 + layout.bytes() as u128);
    data.div_ceil(8) * 8
}

/// Encode the sections as one bundle of `server`.
pub fn encode_bundle(server: ServerId, sections: &[SectionIn<'_>]) -> Result<EncodedFile> {
    let mut toc = Vec::with_capacity(sections.len() * TOC_ENTRY);
    let mut offset = (sections.len() * TOC_ENTRY) as u64;
    let mut total_rows = 0u64;
    for s in sections {
        if s.layout.dim == 0 {
            return Err(CkptError::InvalidArgument(format!(
                "bundle section of table {} has dim 0",
                s.table.0
            )));
        }
        if s.rows.len() != s.ids.len() * s.layout.bytes() {
            return Err(CkptError::InvalidArgument(format!(
                "bundle section of table {}: {} row bytes for {} rows of {} bytes",
                s.table.0,
                s.rows.len(),
                s.ids.len(),
                s.layout.bytes()
            )));
        }
        if let Some(w) = s.ids.windows(2).find(|w| w[0] >= w[1]) {
            return Err(CkptError::InvalidArgument(format!(
                "bundle section of table {}: row ids must be strictly ascending ({} after {})",
                s.table.0, w[1], w[0]
            )));
        }
        toc.extend_from_slice(&s.table.0.to_le_bytes());
        toc.extend_from_slice(&s.column.to_le_bytes());
        toc.extend_from_slice(&(s.layout.dim as u32).to_le_bytes());
        toc.extend_from_slice(&(s.layout.state_words as u32).to_le_bytes());
        toc.extend_from_slice(&(s.ids.len() as u64).to_le_bytes());
        toc.extend_from_slice(&s.ids.first().copied().unwrap_or(0).to_le_bytes());
        toc.extend_from_slice(&s.ids.last().copied().unwrap_or(0).to_le_bytes());
        toc.extend_from_slice(&offset.to_le_bytes());
        offset += padded(s.ids.len() * 8 + s.rows.len()) as u64;
        total_rows += s.ids.len() as u64;
    }
    let mut head = Vec::with_capacity(20);
    head.extend_from_slice(&server.0.to_le_bytes());
    head.extend_from_slice(&(sections.len() as u32).to_le_bytes());
    head.extend_from_slice(&total_rows.to_le_bytes());
    head.extend_from_slice(&0u32.to_le_bytes());
    let mut b = FrameBuilder::new(FileKind::Bundle, &head, offset);
    b.push(&toc);
    for s in sections {
        let mut ids = Vec::with_capacity(s.ids.len() * 8);
        for id in s.ids {
            ids.extend_from_slice(&id.to_le_bytes());
        }
        b.push(&ids);
        b.push(s.rows);
        let pad = padded(ids.len() + s.rows.len()) - (ids.len() + s.rows.len());
        b.push(&[0u8; 8][..pad]);
    }
    Ok(b.finish())
}

/// A decoded bundle borrowing the file's bytes.
#[derive(Debug, Clone)]
pub struct Bundle<'a> {
    pub server: ServerId,
    pub rows: u64,
    sections: Vec<BundleSection>,
    payload: &'a [u8],
    pub checksums: super::FileChecksums,
}

impl<'a> Bundle<'a> {
    /// Parse and verify a bundle named `file`: frame checksums, a table of contents consistent
    /// with the payload, and strictly ascending ids matching each section's first and last row.
    pub fn decode(file: &str, data: &'a [u8]) -> Result<Self> {
        Self::decode_checked(file, data, true)
    }

    /// Decode bytes that already passed [`Bundle::decode`].
    pub(crate) fn decode_verified(file: &str, data: &'a [u8]) -> Result<Self> {
        Self::decode_checked(file, data, false)
    }

    fn decode_checked(file: &str, data: &'a [u8], full: bool) -> Result<Self> {
        let corrupt = |reason: String| CkptError::Corrupt {
            file: file.to_string(),
            reason,
        };
        let frame = parse_frame_checked(file, FileKind::Bundle, data, full)?;
        let mut f = Fields::new(file, frame.header);
        let server = ServerId(f.u32()?);
        let n = f.u32()? as usize;
        let rows = f.u64()?;
        let payload = frame.payload;
        let toc_len = n as u128 * TOC_ENTRY as u128;
        if toc_len > payload.len() as u128 {
            return Err(corrupt(format!(
                "a table of contents of {n} sections does not fit a {}-byte payload",
                payload.len()
            )));
        }
        let mut sections = Vec::with_capacity(n);
        let mut expect = toc_len;
        let mut total = 0u128;
        for i in 0..n {
            let mut e = Fields::new(file, &payload[i * TOC_ENTRY..(i + 1) * TOC_ENTRY]);
            let table = TableId(e.u32()?);
            let column = e.u32()?;
            let dim = e.u32()? as usize;
            let state_words = e.u32()? as usize;
            let srows = e.u64()?;
            let first_row = e.u64()?;
            let last_row = e.u64()?;
            let offset = e.u64()?;
            let layout = super::stored_layout(file, &format!("section {i}"), dim, state_words)?;
            if offset as u128 != expect {
                return Err(corrupt(format!(
                    "section {i} starts at payload byte {offset}, expected {expect}"
                )));
            }
            expect += section_bytes(srows, layout);
            total += srows as u128;
            sections.push(BundleSection {
                table,
                column,
                layout,
                rows: srows,
                first_row,
                last_row,
                offset,
            });
        }
        if expect != payload.len() as u128 {
            return Err(corrupt(format!(
                "sections end at payload byte {expect}, the payload has {}",
                payload.len()
            )));
        }
        if total != rows as u128 {
            return Err(corrupt(format!(
                "sections hold {total} rows, the header says {rows}"
            )));
        }
        let b = Bundle {
            server,
            rows,
            sections,
            payload,
            checksums: frame.checksums,
        };
        if full {
            for (i, s) in b.sections.iter().enumerate() {
                let v = b.section(i);
                let mut prev: Option<RowId> = None;
                for id in v.ids() {
                    if prev.is_some_and(|p| id <= p) {
                        return Err(corrupt(format!(
                            "section {i}: row ids not strictly ascending ({id} after {})",
                            prev.unwrap_or_default()
                        )));
                    }
                    prev = Some(id);
                }
                if s.rows > 0 && (v.id(0) != s.first_row || prev != Some(s.last_row)) {
                    return Err(corrupt(format!(
                        "section {i}: the table of contents says rows {}..={}, ids say {}..={}",
                        s.first_row,
                        s.last_row,
                        v.id(0),
                        prev.unwrap_or_default()
                    )));
                }
            }
        }
        Ok(b)
    }

    /// The sections' table-of-contents entries, in file order.
    pub fn sections(&self) -> &[BundleSection] {
        &self.sections
    }

    /// Section `i`'s rows.
    pub fn section(&self, i: usize) -> SectionView<'a> {
        let s = self.sections[i];
        let start = s.offset as usize;
        let ids_end = start + s.rows as usize * 8;
        let rows_end = ids_end + s.rows as usize * s.layout.bytes();
        SectionView {
            header: s,
            ids: &self.payload[start..ids_end],
            rows: &self.payload[ids_end..rows_end],
        }
    }
}

/// The rows of one bundle section.
#[derive(Debug, Clone, Copy)]
pub struct SectionView<'a> {
    pub header: BundleSection,
    ids: &'a [u8],
    rows: &'a [u8],
}

impl<'a> SectionView<'a> {
    pub fn len(&self) -> usize {
        self.header.rows as usize
    }

    pub fn is_empty(&self) -> bool {
        self.header.rows == 0
    }

    /// Id of row `i` of the section.
    pub fn id(&self, i: usize) -> RowId {
        u64::from_le_bytes(self.ids[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }

    /// All ids, ascending.
    pub fn ids(&self) -> impl Iterator<Item = RowId> + 'a {
        self.ids
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
    }

    /// Raw little-endian bytes of rows `lo..hi`.
    pub fn rows_bytes(&self, lo: usize, hi: usize) -> &'a [u8] {
        let b = self.header.layout.bytes();
        &self.rows[lo * b..hi * b]
    }

    /// Copy row `i` into `dst` (`layout.words()` words).
    pub fn copy_row(&self, i: usize, dst: &mut [f32]) {
        copy_le_into_f32s(self.rows_bytes(i, i + 1), dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::f32s_le_bytes;

    fn sample() -> EncodedFile {
        let a: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..5).map(|i| -(i as f32)).collect();
        encode_bundle(
            ServerId(2),
            &[
                SectionIn {
                    table: TableId(3),
                    layout: RowLayout::new(3, 1),
                    column: 7,
                    ids: &[1, 4, 9],
                    rows: &f32s_le_bytes(&a),
                },
                SectionIn {
                    table: TableId(0),
                    layout: RowLayout::new(5, 0),
                    column: 2,
                    ids: &[40],
                    rows: &f32s_le_bytes(&b),
                },
                SectionIn {
                    table: TableId(1),
                    layout: RowLayout::new(2, 0),
                    column: 9,
                    ids: &[],
                    rows: &[],
                },
            ],
        )
        .unwrap()
    }

    #[test]
    fn round_trip_sections_in_order() {
        let f = sample();
        let b = Bundle::decode("b", &f.bytes).unwrap();
        assert_eq!((b.server, b.rows), (ServerId(2), 4));
        assert_eq!(b.sections().len(), 3);
        let s0 = b.section(0);
        assert_eq!(s0.header.table, TableId(3));
        assert_eq!(s0.header.column, 7);
        assert_eq!(s0.ids().collect::<Vec<_>>(), vec![1, 4, 9]);
        let mut row = [0f32; 4];
        s0.copy_row(2, &mut row);
        assert_eq!(row, [4.0, 4.5, 5.0, 5.5]);
        let s1 = b.section(1);
        assert_eq!((s1.header.first_row, s1.header.last_row), (40, 40));
        let mut row = [0f32; 5];
        s1.copy_row(0, &mut row);
        assert_eq!(row, [0.0, -1.0, -2.0, -3.0, -4.0]);
        assert!(b.section(2).is_empty());
        // Every section starts 8-byte aligned in the file (the payload starts at byte 48).
        assert_eq!(f.bytes.len() % 8, 4);
        for s in b.sections() {
            assert_eq!(s.offset % 8, 0);
        }
        assert!(Bundle::decode_verified("b", &f.bytes).is_ok());
    }

    #[test]
    fn bad_input_is_refused() {
        let rows = f32s_le_bytes(&[0.0; 4]).into_owned();
        let bad = |ids: &[RowId], rows: &[u8], dim: usize| {
            encode_bundle(
                ServerId(0),
                &[SectionIn {
                    table: TableId(0),
                    layout: RowLayout::new(dim, 0),
                    column: 1,
                    ids,
                    rows,
                }],
            )
        };
        assert!(matches!(
            bad(&[2, 1], &rows, 2),
            Err(CkptError::InvalidArgument(_))
        ));
        assert!(matches!(
            bad(&[1], &rows, 2),
            Err(CkptError::InvalidArgument(_))
        ));
        assert!(matches!(
            bad(&[], &[], 0),
            Err(CkptError::InvalidArgument(_))
        ));
    }

    #[test]
    fn flip_any_byte_or_truncate_is_an_error_naming_the_file() {
        let f = sample();
        for i in 0..f.bytes.len() {
            let mut d = f.bytes.to_vec();
            d[i] ^= 0x20;
            let err = Bundle::decode("s0/row0-000.bndl", &d).unwrap_err();
            assert_eq!(err.file(), Some("s0/row0-000.bndl"), "byte {i}: {err}");
        }
        for len in 0..f.bytes.len() {
            let err = Bundle::decode("s0/row0-000.bndl", &f.bytes[..len]).unwrap_err();
            assert_eq!(err.file(), Some("s0/row0-000.bndl"), "len {len}: {err}");
        }
    }
}
