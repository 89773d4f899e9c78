//! Dense files (`DENS`, version 1): a run of dense blocks (values, then per-block optimizer
//! state), as [`ftrec_core::DenseParams`] cuts them.
//!
//! Header body (after the payload length), 36 bytes:
//!
//! ```text
//! first_block u64 | blocks u64 | values u64 | state_per_block u32 | block_size u32 | 0 u32
//! ```
//!
//! `block_size` is [`DENSE_BLOCK`] when written; a reader refuses any other, so a change of
//! block size cannot be misread. The last word pads the payload to byte 64 of the file.
//! Payload: `values` f32 LE, then `blocks * state_per_block` f32 LE. Every block but the last
//! holds `block_size` values.

use ftrec_core::DENSE_BLOCK;

use super::{
    copy_le_into_f32s, parse_frame_checked, EncodedFile, Fields, FileChecksums, FileKind,
    FrameBuilder,
};
use crate::error::{CkptError, Result};

/// What a dense file's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenseChunkHeader {
    pub first_block: u64,
    pub blocks: u64,
    pub values: u64,
    pub state_per_block: u32,
}

/// Encode blocks `first_block..` given their `values` and `state` (`state_per_block` words per
/// block).
pub fn encode_dense(
    first_block: u64,
    values: &[f32],
    state: &[f32],
    state_per_block: usize,
) -> Result<EncodedFile> {
    let blocks = values.len().div_ceil(DENSE_BLOCK);
    if state.len() != blocks * state_per_block {
        return Err(CkptError::InvalidArgument(format!(
            "{} state words for {blocks} dense blocks of {state_per_block} state words",
            state.len()
        )));
    }
    let mut head = Vec::with_capacity(36);
    head.extend_from_slice(&first_block.to_le_bytes());
    head.extend_from_slice(&(blocks as u64).to_le_bytes());
    head.extend_from_slice(&(values.len() as u64).to_le_bytes());
    head.extend_from_slice(&(state_per_block as u32).to_le_bytes());
    head.extend_from_slice(&(DENSE_BLOCK as u32).to_le_bytes());
    head.extend_from_slice(&0u32.to_le_bytes());
    let payload_len = ((values.len() + state.len()) * 4) as u64;
    let mut b = FrameBuilder::new(FileKind::Dense, &head, payload_len);
    b.push_f32s(values);
    b.push_f32s(state);
    Ok(b.finish())
}

/// A decoded dense file borrowing the file's bytes.
#[derive(Debug, Clone, Copy)]
pub struct DenseChunk<'a> {
    pub header: DenseChunkHeader,
    values: &'a [u8],
    state: &'a [u8],
    pub checksums: FileChecksums,
}

impl<'a> DenseChunk<'a> {
    /// Parse and verify a dense file named `file`.
    pub fn decode(file: &str, data: &'a [u8]) -> Result<Self> {
        Self::decode_checked(file, data, true)
    }

    /// Decode bytes that already passed [`DenseChunk::decode`] without re-reading the payload.
    pub(crate) fn decode_verified(file: &str, data: &'a [u8]) -> Result<Self> {
        Self::decode_checked(file, data, false)
    }

    fn decode_checked(file: &str, data: &'a [u8], full: bool) -> Result<Self> {
        let corrupt = |reason: String| CkptError::Corrupt {
            file: file.to_string(),
            reason,
        };
        let frame = parse_frame_checked(file, FileKind::Dense, data, full)?;
        let mut f = Fields::new(file, frame.header);
        let first_block = f.u64()?;
        let blocks = f.u64()?;
        let values = f.u64()?;
        let state_per_block = f.u32()?;
        let block_size = f.u32()?;
        // The last word is padding; a later version may give it a meaning.
        if block_size as usize != DENSE_BLOCK {
            return Err(corrupt(format!(
                "dense block size {block_size}, this build uses {DENSE_BLOCK}"
            )));
        }
        if values.div_ceil(DENSE_BLOCK as u64) != blocks {
            return Err(corrupt(format!(
                "{values} values do not make {blocks} blocks of {DENSE_BLOCK}"
            )));
        }
        let state_words = blocks as u128 * state_per_block as u128;
        let expected = (values as u128 + state_words) * 4;
        if expected != frame.payload.len() as u128 {
            return Err(corrupt(format!(
                "header needs a {expected}-byte payload, found {}",
                frame.payload.len()
            )));
        }
        let (v, s) = frame.payload.split_at(values as usize * 4);
        Ok(DenseChunk {
            header: DenseChunkHeader {
                first_block,
                blocks,
                values,
                state_per_block,
            },
            values: v,
            state: s,
            checksums: frame.checksums,
        })
    }

    /// Copy the values into `dst` (`header.values` words).
    pub fn copy_values(&self, dst: &mut [f32]) {
        copy_le_into_f32s(self.values, dst);
    }

    /// Copy the optimizer state into `dst` (`blocks * state_per_block` words).
    pub fn copy_state(&self, dst: &mut [f32]) {
        copy_le_into_f32s(self.state, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_a_short_last_block() {
        let values: Vec<f32> = (0..DENSE_BLOCK + 10).map(|i| i as f32 / 7.0).collect();
        let state: Vec<f32> = (0..2 * 3).map(|i| -(i as f32)).collect();
        let f = encode_dense(4, &values, &state, 3).unwrap();
        let c = DenseChunk::decode("d", &f.bytes).unwrap();
        assert_eq!(f.bytes.len(), 64 + (values.len() + state.len()) * 4 + 4);
        assert_eq!(
            c.header,
            DenseChunkHeader {
                first_block: 4,
                blocks: 2,
                values: values.len() as u64,
                state_per_block: 3
            }
        );
        let mut v = vec![0.0; values.len()];
        let mut s = vec![0.0; state.len()];
        c.copy_values(&mut v);
        c.copy_state(&mut s);
        assert_eq!(v, values);
        assert_eq!(s, state);
        assert_eq!(c.checksums, f.checksums);
    }

    #[test]
    fn mismatched_state_is_refused() {
        assert!(matches!(
            encode_dense(0, &[0.0; 10], &[0.0; 3], 2),
            Err(CkptError::InvalidArgument(_))
        ));
    }

    #[test]
    fn flip_any_byte_or_truncate_is_an_error_naming_the_file() {
        let values: Vec<f32> = (0..300).map(|i| i as f32).collect();
        let f = encode_dense(0, &values, &[1.0, 2.0], 1).unwrap();
        for i in 0..f.bytes.len() {
            let mut d = f.bytes.to_vec();
            d[i] ^= 0x01;
            let err = DenseChunk::decode("dense", &d).unwrap_err();
            assert_eq!(err.file(), Some("dense"), "byte {i}: {err}");
        }
        for len in 0..f.bytes.len() {
            let err = DenseChunk::decode("dense", &f.bytes[..len]).unwrap_err();
            assert_eq!(err.file(), Some("dense"), "len {len}: {err}");
        }
    }
}
