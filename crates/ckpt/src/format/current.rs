//! The `CURRENT` pointer (`CURR`, version 1): which checkpoint is current, and the size and
//! checksums of its manifest so a reader can tell a stale or damaged manifest from the one that
//! was committed.
//!
//! Header body (after the payload length), 16 or 24 bytes:
//!
//! ```text
//! manifest_size u64 | manifest header crc32c u32 | manifest payload crc32c u32 [| generation u64]
//! ```
//!
//! The generation is the writer lease's ([`crate::lease`]) at the commit; a pointer without it
//! (written before leases existed) has generation 0. Readers of the 16-byte form ignore the
//! trailing field, so the version stays 1.
//!
//! Payload: the checkpoint id (UTF-8).

use super::{parse_frame, EncodedFile, Fields, FileChecksums, FileKind, FrameBuilder};
use crate::error::{CkptError, Result};
use crate::format::CheckpointId;

/// The decoded `CURRENT` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentPointer {
    pub id: CheckpointId,
    pub manifest_size: u64,
    pub manifest_crc32c: FileChecksums,
    /// The writer lease's generation at the commit (0: none).
    pub generation: u64,
}

impl CurrentPointer {
    pub fn encode(&self) -> EncodedFile {
        let mut head = Vec::with_capacity(24);
        head.extend_from_slice(&self.manifest_size.to_le_bytes());
        head.extend_from_slice(&self.manifest_crc32c.header.to_le_bytes());
        head.extend_from_slice(&self.manifest_crc32c.payload.to_le_bytes());
        if self.generation > 0 {
            head.extend_from_slice(&self.generation.to_le_bytes());
        }
        let id = self.id.as_str().as_bytes();
        let mut b = FrameBuilder::new(FileKind::Current, &head, id.len() as u64);
        b.push(id);
        b.finish()
    }

    /// Decode a `CURRENT` file named `file`.
    pub fn decode(file: &str, data: &[u8]) -> Result<Self> {
        let frame = parse_frame(file, FileKind::Current, data)?;
        let mut f = Fields::new(file, frame.header);
        let manifest_size = f.u64()?;
        let manifest_crc32c = FileChecksums {
            header: f.u32()?,
            payload: f.u32()?,
        };
        let generation = if frame.header.len() >= 24 {
            f.u64()?
        } else {
            0
        };
        let id = std::str::from_utf8(frame.payload)
            .ok()
            .and_then(|s| CheckpointId::new(s).ok())
            .ok_or_else(|| CkptError::Corrupt {
                file: file.to_string(),
                reason: "checkpoint id is not a valid name".into(),
            })?;
        Ok(CurrentPointer {
            id,
            manifest_size,
            manifest_crc32c,
            generation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::CheckpointKind;

    #[test]
    fn round_trip_and_damage() {
        let p = CurrentPointer {
            id: CheckpointId::for_step(3, CheckpointKind::Full),
            manifest_size: 1234,
            manifest_crc32c: FileChecksums {
                header: 0xdead_beef,
                payload: 0x1234_5678,
            },
            generation: 7,
        };
        // Without a generation the pointer keeps the 16-byte header of the first writers.
        let old = CurrentPointer {
            generation: 0,
            ..p.clone()
        };
        let f0 = old.encode();
        assert_eq!(f0.bytes.len() + 8, p.encode().bytes.len());
        assert_eq!(CurrentPointer::decode("CURRENT", &f0.bytes).unwrap(), old);
        let f = p.encode();
        assert_eq!(CurrentPointer::decode("CURRENT", &f.bytes).unwrap(), p);
        for i in 0..f.bytes.len() {
            let mut d = f.bytes.to_vec();
            d[i] ^= 0x80;
            let err = CurrentPointer::decode("CURRENT", &d).unwrap_err();
            assert_eq!(err.file(), Some("CURRENT"), "byte {i}: {err}");
        }
        for len in 0..f.bytes.len() {
            let err = CurrentPointer::decode("CURRENT", &f.bytes[..len]).unwrap_err();
            assert_eq!(err.file(), Some("CURRENT"), "len {len}: {err}");
        }
    }
}
