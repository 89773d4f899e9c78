//! Versioned on-disk formats. Every checkpoint file has the same frame:
//!
//! ```text
//! offset      size  field
//! 0           4     magic "FTRC"
//! 4           4     kind tag: "ROWS" | "DENS" | "MANI" | "CURR"
//! 8           2     format version of this kind (u16 LE)
//! 10          2     reserved, 0
//! 12          4     H = header body length (u32 LE)
//! 16          H     header body; its first 8 bytes are P = payload length (u64 LE)
//! 16+H        4     crc32c of bytes [0, 16+H)            (the header's own checksum)
//! 20+H        P     payload
//! 20+H+P      4     crc32c of the payload
//! ```
//!
//! The header is checked apart from the payload, so a reader can trust the shape (kind,
//! version, sizes) before touching the payload, and a torn file is told apart from a flipped
//! bit: a file whose size is not `24 + H + P` is torn or truncated; a size that fits with a
//! checksum that does not is corruption. Both are errors naming the file.
//!
//! Manifests (and `CURRENT`, for the manifest) record each file's size and both of its
//! checksums ([`FileChecksums`]), so a file that is well formed but not the one that was
//! written (an older version, another chunk of the same size) is refused too. They record the
//! two part checksums rather than a crc32c of the whole file on purpose: a CRC over a message
//! followed by its own CRC is a constant, so a whole-file crc32c of this frame would depend
//! only on the lengths, not on the content.
//!
//! Payloads of row and dense files are raw little-endian words at 8-byte-aligned offsets, so a
//! reader can stream them or map them.
//!
//! Version 1 is the only version of every kind but the piece index (version 2, a binary
//! payload; version 1's JSON is still read); `tests/fixtures/v1` holds checked-in files of the
//! kinds a full checkpoint uses so a later change cannot silently stop reading them.
//!
//! Incremental checkpoints (`crate::incr`) add three kinds: bundles (`BNDL`, [`bundle`]),
//! quantized rows (`QROW`, [`qrows`]) and piece indexes (`PIDX`, [`piece`]). A store may also
//! hold one job record (`JOBR`, [`job`]): what the job writing it is, to start it again.

use crate::error::{CkptError, Result};

pub mod bundle;
pub mod current;
pub mod dense;
pub mod job;
pub mod manifest;
pub mod piece;
pub mod qrows;
pub mod rows;

pub use bundle::{Bundle, BundleSection, SectionIn};
pub use current::CurrentPointer;
pub use dense::{DenseChunk, DenseChunkHeader};
pub use job::JobRecord;
pub use manifest::{
    CheckpointId, CheckpointKind, DataPosition, DenseInfo, FileContent, FileInfo, Manifest,
    PieceScheme, ShardInfo, TableInfo,
};
pub use piece::{ChunkOp, ChunkRecord, ExtractStats, FileRef, Part, PieceIndex};
pub use qrows::{QRowChunk, QRowChunkHeader, QuantBits};
pub use rows::{RowChunk, RowChunkHeader};
use serde::{Deserialize, Serialize};

/// First four bytes of every file.
pub const MAGIC: [u8; 4] = *b"FTRC";
/// Bytes before the header body.
pub(crate) const PREFIX_LEN: usize = 16;
/// Header bodies are small; anything larger is corruption, not a future format.
pub(crate) const MAX_HEADER_LEN: usize = 4096;

/// Most words (values and optimizer state) a stored row may declare: 2^20 (4 MiB a row; DLRM
/// rows are tens to hundreds of words). A file with no rows backs no layout with bytes, so a
/// reader caps the declared one instead of letting a restore allocate by it.
pub const MAX_ROW_WORDS: usize = 1 << 20;

/// The layout a stored header declares, refused if `dim` is 0 or the row is wider than
/// [`MAX_ROW_WORDS`]; `what` names the header in the error.
pub(crate) fn stored_layout(
    file: &str,
    what: &str,
    dim: usize,
    state_words: usize,
) -> Result<ftrec_core::RowLayout> {
    let corrupt = |reason: String| CkptError::Corrupt {
        file: file.to_string(),
        reason,
    };
    if dim == 0 {
        return Err(corrupt(format!("{what} has dim 0")));
    }
    if dim.saturating_add(state_words) > MAX_ROW_WORDS {
        return Err(corrupt(format!(
            "{what} declares rows of {dim} + {state_words} words, more than {MAX_ROW_WORDS}"
        )));
    }
    Ok(ftrec_core::RowLayout::new(dim, state_words))
}

/// The kinds of file, each with its own tag and version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// Embedding rows with their ids.
    Rows,
    /// A range of dense blocks.
    Dense,
    /// A checkpoint's manifest.
    Manifest,
    /// The pointer to the current checkpoint.
    Current,
    /// Several chunks of rows of any tables in one file (IncrCP's concatenation).
    Bundle,
    /// Embedding rows quantized to 8 or 4 bits (Check-N-Run), optimizer state in f32.
    QuantRows,
    /// One server's record of an incremental piece: its scheme, column and chunk index.
    PieceIndex,
    /// The record of the job writing a store (its configuration, opaque to the store).
    Job,
}

impl FileKind {
    pub fn tag(self) -> [u8; 4] {
        match self {
            FileKind::Rows => *b"ROWS",
            FileKind::Dense => *b"DENS",
            FileKind::Manifest => *b"MANI",
            FileKind::Current => *b"CURR",
            FileKind::Bundle => *b"BNDL",
            FileKind::QuantRows => *b"QROW",
            FileKind::PieceIndex => *b"PIDX",
            FileKind::Job => *b"JOBR",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FileKind::Rows => "rows",
            FileKind::Dense => "dense",
            FileKind::Manifest => "manifest",
            FileKind::Current => "CURRENT",
            FileKind::Bundle => "bundle",
            FileKind::QuantRows => "quantized rows",
            FileKind::PieceIndex => "piece index",
            FileKind::Job => "job record",
        }
    }

    /// The version this build writes and the newest it reads (every older one is read too).
    pub fn version(self) -> u16 {
        match self {
            // Version 2: a binary payload instead of version 1's JSON ([`piece`]).
            FileKind::PieceIndex => 2,
            _ => 1,
        }
    }
}

/// A file's two checksums, as its frame stores them and a manifest records them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileChecksums {
    /// crc32c of the prefix and header body.
    pub header: u32,
    /// crc32c of the payload.
    pub payload: u32,
}

/// An encoded file and its checksums (what a manifest records).
#[derive(Debug, Clone)]
pub struct EncodedFile {
    pub bytes: bytes::Bytes,
    pub checksums: FileChecksums,
}

impl EncodedFile {
    pub fn size(&self) -> u64 {
        self.bytes.len() as u64
    }
}

/// Builds one framed file in a single buffer.
pub(crate) struct FrameBuilder {
    buf: Vec<u8>,
    head_len: usize,
    header_crc: u32,
    payload_len: u64,
}

impl FrameBuilder {
    /// Start a file of `kind` whose header body is `payload_len` followed by `header_rest`,
    /// reserving room for the whole file.
    pub(crate) fn new(kind: FileKind, header_rest: &[u8], payload_len: u64) -> Self {
        let h = 8 + header_rest.len();
        debug_assert!(h <= MAX_HEADER_LEN);
        let total = PREFIX_LEN + h + 4 + payload_len as usize + 4;
        let mut buf = Vec::with_capacity(total);
        buf.extend_from_slice(&MAGIC);
        buf.extend_from_slice(&kind.tag());
        buf.extend_from_slice(&kind.version().to_le_bytes());
        buf.extend_from_slice(&0u16.to_le_bytes());
        buf.extend_from_slice(&(h as u32).to_le_bytes());
        buf.extend_from_slice(&payload_len.to_le_bytes());
        buf.extend_from_slice(header_rest);
        let crc = crc32c::crc32c(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        let head_len = buf.len();
        FrameBuilder {
            buf,
            head_len,
            header_crc: crc,
            payload_len,
        }
    }

    /// Append payload bytes.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Append f32 words as little-endian bytes.
    pub(crate) fn push_f32s(&mut self, words: &[f32]) {
        push_f32s_le(&mut self.buf, words);
    }

    /// Close the payload with its checksum.
    pub(crate) fn finish(mut self) -> EncodedFile {
        let payload = &self.buf[self.head_len..];
        assert_eq!(
            payload.len() as u64,
            self.payload_len,
            "payload length declared in the header"
        );
        let payload_crc = crc32c::crc32c(payload);
        self.buf.extend_from_slice(&payload_crc.to_le_bytes());
        EncodedFile {
            bytes: bytes::Bytes::from(self.buf),
            checksums: FileChecksums {
                header: self.header_crc,
                payload: payload_crc,
            },
        }
    }
}

/// The prefix, header body and header checksum of a `kind` file whose payload is
/// `payload_len` bytes, and that checksum: for writers that stream the payload themselves.
pub(crate) fn frame_head(kind: FileKind, header_rest: &[u8], payload_len: u64) -> (Vec<u8>, u32) {
    let h = 8 + header_rest.len();
    debug_assert!(h <= MAX_HEADER_LEN);
    let mut buf = Vec::with_capacity(PREFIX_LEN + h + 4);
    buf.extend_from_slice(&MAGIC);
    buf.extend_from_slice(&kind.tag());
    buf.extend_from_slice(&kind.version().to_le_bytes());
    buf.extend_from_slice(&0u16.to_le_bytes());
    buf.extend_from_slice(&(h as u32).to_le_bytes());
    buf.extend_from_slice(&payload_len.to_le_bytes());
    buf.extend_from_slice(header_rest);
    let crc = crc32c::crc32c(&buf);
    buf.extend_from_slice(&crc.to_le_bytes());
    (buf, crc)
}

/// `words` as little-endian bytes, borrowed where the machine is little-endian.
pub(crate) fn f32s_le_bytes(words: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: f32 has no padding; u8 has alignment 1; the slice covers exactly `words`.
        std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), std::mem::size_of_val(words))
        })
    }
    #[cfg(not(target_endian = "little"))]
    {
        let mut v = Vec::with_capacity(words.len() * 4);
        push_f32s_le(&mut v, words);
        std::borrow::Cow::Owned(v)
    }
}

/// A parsed, checksum-verified frame.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame<'a> {
    /// The format version the file declares (between 1 and its kind's [`FileKind::version`]).
    pub version: u16,
    /// Header body after the payload length.
    pub header: &'a [u8],
    pub payload: &'a [u8],
    pub checksums: FileChecksums,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Parse and verify the frame of `data`, which should be a `kind` file named `file`.
pub(crate) fn parse_frame<'a>(file: &str, kind: FileKind, data: &'a [u8]) -> Result<Frame<'a>> {
    parse_frame_checked(file, kind, data, true)
}

/// [`parse_frame`], optionally skipping the payload checksum. Only for bytes that already
/// passed a full [`parse_frame`] (verification done off the copying thread).
pub(crate) fn parse_frame_checked<'a>(
    file: &str,
    kind: FileKind,
    data: &'a [u8],
    check_payload: bool,
) -> Result<Frame<'a>> {
    let corrupt = |reason: String| CkptError::Corrupt {
        file: file.to_string(),
        reason,
    };
    let found = data.len() as u64;
    let min = (PREFIX_LEN + 8 + 4 + 4) as u64;
    let magic_len = data.len().min(4);
    if data[..magic_len] != MAGIC[..magic_len] {
        return Err(corrupt("not an ftrec checkpoint file (bad magic)".into()));
    }
    if data.len() < PREFIX_LEN {
        return Err(CkptError::Truncated {
            file: file.to_string(),
            expected: min,
            found,
        });
    }
    if data[4..8] != kind.tag() {
        return Err(corrupt(format!(
            "expected a {} file (tag {:?}), found tag {:?}",
            kind.name(),
            String::from_utf8_lossy(&kind.tag()),
            String::from_utf8_lossy(&data[4..8])
        )));
    }
    let h = u32_at(data, 12) as usize;
    if !(8..=MAX_HEADER_LEN).contains(&h) {
        return Err(corrupt(format!("implausible header length {h}")));
    }
    let head_end = PREFIX_LEN + h;
    if data.len() < head_end + 4 {
        return Err(CkptError::Truncated {
            file: file.to_string(),
            expected: (head_end + 8) as u64,
            found,
        });
    }
    let stored = u32_at(data, head_end);
    let head_crc = crc32c::crc32c(&data[..head_end]);
    if stored != head_crc {
        return Err(CkptError::ChecksumMismatch {
            file: file.to_string(),
            what: "header",
            expected: stored,
            got: head_crc,
        });
    }
    let version = u16::from_le_bytes([data[8], data[9]]);
    if version == 0 || version > kind.version() {
        return Err(CkptError::UnsupportedVersion {
            file: file.to_string(),
            kind: kind.name(),
            found: version,
            supported: kind.version(),
        });
    }
    let p = u64_at(data, PREFIX_LEN);
    let expected = (head_end as u64 + 8)
        .checked_add(p)
        .ok_or_else(|| corrupt(format!("implausible payload length {p}")))?;
    if found < expected {
        return Err(CkptError::Truncated {
            file: file.to_string(),
            expected,
            found,
        });
    }
    if found > expected {
        return Err(corrupt(format!(
            "{} trailing bytes after the payload checksum",
            found - expected
        )));
    }
    let payload_start = head_end + 4;
    let payload_end = payload_start + p as usize;
    let payload = &data[payload_start..payload_end];
    let stored = u32_at(data, payload_end);
    let payload_crc = if check_payload {
        crc32c::crc32c(payload)
    } else {
        stored
    };
    if stored != payload_crc {
        return Err(CkptError::ChecksumMismatch {
            file: file.to_string(),
            what: "payload",
            expected: stored,
            got: payload_crc,
        });
    }
    Ok(Frame {
        version,
        header: &data[PREFIX_LEN + 8..head_end],
        payload,
        checksums: FileChecksums {
            header: head_crc,
            payload: payload_crc,
        },
    })
}

/// Check `data`, a file staged on local disk and read back before its upload, against the
/// size and checksums recorded when it was written: a disk that returns other bytes than it
/// was given is caught before the file reaches the store.
pub(crate) fn verify_staged(file: &str, data: &[u8], info: &FileInfo) -> Result<()> {
    let kind = match info.content {
        FileContent::Rows { .. } => FileKind::Rows,
        FileContent::QuantRows { .. } => FileKind::QuantRows,
        FileContent::Dense { .. } => FileKind::Dense,
        FileContent::Bundle { .. } => FileKind::Bundle,
        FileContent::PieceIndex { .. } => FileKind::PieceIndex,
    };
    let frame = parse_frame(file, kind, data)?;
    check_recorded(
        file,
        "staging",
        data.len() as u64,
        frame.checksums,
        info.size,
        info.crc32c,
    )
}

/// Check a parsed file against what its manifest (or CURRENT) recorded.
pub(crate) fn check_recorded(
    file: &str,
    by: &'static str,
    size: u64,
    sums: FileChecksums,
    recorded_size: u64,
    recorded: FileChecksums,
) -> Result<()> {
    if size != recorded_size {
        return Err(CkptError::Truncated {
            file: file.to_string(),
            expected: recorded_size,
            found: size,
        });
    }
    if sums.header != recorded.header {
        return Err(CkptError::ChecksumMismatch {
            file: file.to_string(),
            what: by_header(by),
            expected: recorded.header,
            got: sums.header,
        });
    }
    if sums.payload != recorded.payload {
        return Err(CkptError::ChecksumMismatch {
            file: file.to_string(),
            what: by_payload(by),
            expected: recorded.payload,
            got: sums.payload,
        });
    }
    Ok(())
}

fn by_header(by: &'static str) -> &'static str {
    match by {
        "CURRENT" => "header (as recorded in CURRENT)",
        "staging" => "header (as recorded when staged)",
        _ => "header (as recorded in the manifest)",
    }
}

fn by_payload(by: &'static str) -> &'static str {
    match by {
        "CURRENT" => "payload (as recorded in CURRENT)",
        "staging" => "payload (as recorded when staged)",
        _ => "payload (as recorded in the manifest)",
    }
}

/// Little-endian field reader over a header body; running off the end is corruption.
pub(crate) struct Fields<'a> {
    file: &'a str,
    b: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(file: &'a str, b: &'a [u8]) -> Self {
        Fields { file, b, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.at + n > self.b.len() {
            return Err(CkptError::Corrupt {
                file: self.file.to_string(),
                reason: format!("header body of {} bytes is too short", self.b.len()),
            });
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
}

/// Append `words` to `out` as little-endian bytes.
pub(crate) fn push_f32s_le(out: &mut Vec<u8>, words: &[f32]) {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: f32 has no padding and every bit pattern is a valid u8 sequence; u8 has
        // alignment 1; the slice covers exactly the memory of `words`.
        let bytes = unsafe {
            std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), std::mem::size_of_val(words))
        };
        out.extend_from_slice(bytes);
    }
    #[cfg(not(target_endian = "little"))]
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

/// Fill `dst` from little-endian bytes; `src.len()` must be `4 * dst.len()`.
pub(crate) fn copy_le_into_f32s(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len() * 4, "byte length of an f32 copy");
    #[cfg(target_endian = "little")]
    {
        // SAFETY: as above; any byte pattern is a valid f32, and the lengths match.
        let out = unsafe {
            std::slice::from_raw_parts_mut(
                dst.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(dst),
            )
        };
        out.copy_from_slice(src);
    }
    #[cfg(not(target_endian = "little"))]
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes(c.try_into().expect("4"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EncodedFile {
        let mut b = FrameBuilder::new(FileKind::Manifest, &[1, 2, 3, 4], 10);
        b.push(b"0123456789");
        b.finish()
    }

    #[test]
    fn frame_round_trip_and_checksums() {
        let f = sample();
        let h = PREFIX_LEN + 8 + 4;
        assert_eq!(f.checksums.header, crc32c::crc32c(&f.bytes[..h]));
        assert_eq!(f.checksums.payload, crc32c::crc32c(b"0123456789"));
        let frame = parse_frame("x", FileKind::Manifest, &f.bytes).unwrap();
        assert_eq!(frame.header, &[1, 2, 3, 4]);
        assert_eq!(frame.payload, b"0123456789");
        assert_eq!(frame.checksums, f.checksums);
    }

    #[test]
    fn recorded_checksums_see_content_that_a_whole_file_crc_would_not() {
        // Two frames of equal lengths: their whole-file crc32c is the same (the CRC residue of
        // a message followed by its CRC), their recorded checksums are not.
        let mut a = FrameBuilder::new(FileKind::Rows, &[1, 0, 0, 0], 4);
        a.push(b"abcd");
        let a = a.finish();
        let mut b = FrameBuilder::new(FileKind::Rows, &[2, 0, 0, 0], 4);
        b.push(b"wxyz");
        let b = b.finish();
        assert_eq!(crc32c::crc32c(&a.bytes), crc32c::crc32c(&b.bytes));
        assert_ne!(a.checksums.header, b.checksums.header);
        assert_ne!(a.checksums.payload, b.checksums.payload);
        assert!(matches!(
            check_recorded("f", "manifest", 36, b.checksums, 36, a.checksums),
            Err(CkptError::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn every_flipped_bit_and_every_truncation_is_an_error_naming_the_file() {
        let f = sample();
        for i in 0..f.bytes.len() {
            for bit in 0..8 {
                let mut d = f.bytes.to_vec();
                d[i] ^= 1 << bit;
                let err = parse_frame("some/file", FileKind::Manifest, &d).unwrap_err();
                assert_eq!(err.file(), Some("some/file"), "byte {i} bit {bit}: {err}");
            }
        }
        for len in 0..f.bytes.len() {
            let err = parse_frame("some/file", FileKind::Manifest, &f.bytes[..len]).unwrap_err();
            assert_eq!(err.file(), Some("some/file"), "length {len}: {err}");
        }
        let mut longer = f.bytes.to_vec();
        longer.push(0);
        assert!(matches!(
            parse_frame("f", FileKind::Manifest, &longer),
            Err(CkptError::Corrupt { .. })
        ));
    }

    #[test]
    fn wrong_kind_and_newer_versions_are_refused() {
        let f = sample();
        assert!(matches!(
            parse_frame("f", FileKind::Rows, &f.bytes),
            Err(CkptError::Corrupt { .. })
        ));
        // A well-formed file from a future version: re-frame with version 2 and a valid crc.
        let mut d = f.bytes.to_vec();
        d[8] = 2;
        let h = u32_at(&d, 12) as usize;
        let crc = crc32c::crc32c(&d[..PREFIX_LEN + h]);
        d[PREFIX_LEN + h..PREFIX_LEN + h + 4].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            parse_frame("f", FileKind::Manifest, &d),
            Err(CkptError::UnsupportedVersion { found: 2, .. })
        ));
    }

    #[test]
    fn f32_copies_round_trip_bit_exactly() {
        let words = [1.5f32, -0.0, f32::NAN, f32::MIN_POSITIVE, 3.25e-40];
        let mut bytes = Vec::new();
        push_f32s_le(&mut bytes, &words);
        assert_eq!(&bytes[..4], &1.5f32.to_le_bytes());
        let mut back = [0f32; 5];
        copy_le_into_f32s(&bytes, &mut back);
        for (a, b) in words.iter().zip(&back) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
    }
}
