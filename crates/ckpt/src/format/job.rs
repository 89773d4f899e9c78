//! The job record (`JOBR`, version 1): what a job that writes this store is, so that it can be
//! started again from the store alone (`ftrec run --resume LOCATION`). The store does not
//! interpret it: a record is a kind (which program wrote it and how to read the body, for
//! example `ftrec-run-config/json`) and a body of bytes.
//!
//! Header body (after the payload length):
//!
//! ```text
//! kind_len u32 | kind (UTF-8, kind_len bytes, at most 256)
//! ```
//!
//! Payload: the body.

use super::{parse_frame, EncodedFile, Fields, FileKind, FrameBuilder};
use crate::error::{CkptError, Result};

/// Longest kind accepted.
pub const MAX_JOB_KIND_LEN: usize = 256;

/// The decoded job record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    /// What the body is, for its reader to check (never empty).
    pub kind: String,
    pub body: Vec<u8>,
}

impl JobRecord {
    /// Encode the record; a kind that is empty or longer than [`MAX_JOB_KIND_LEN`] is an
    /// invalid argument.
    pub fn encode(&self) -> Result<EncodedFile> {
        let kind = self.kind.as_bytes();
        if kind.is_empty() || kind.len() > MAX_JOB_KIND_LEN {
            return Err(CkptError::InvalidArgument(format!(
                "a job record's kind must be 1 to {MAX_JOB_KIND_LEN} bytes, not {}",
                kind.len()
            )));
        }
        let mut head = Vec::with_capacity(4 + kind.len());
        head.extend_from_slice(&(kind.len() as u32).to_le_bytes());
        head.extend_from_slice(kind);
        let mut b = FrameBuilder::new(FileKind::Job, &head, self.body.len() as u64);
        b.push(&self.body);
        Ok(b.finish())
    }

    /// Decode a job record named `file`.
    pub fn decode(file: &str, data: &[u8]) -> Result<Self> {
        let frame = parse_frame(file, FileKind::Job, data)?;
        let corrupt = |reason: String| CkptError::Corrupt {
            file: file.to_string(),
            reason,
        };
        let mut f = Fields::new(file, frame.header);
        let n = f.u32()? as usize;
        if n == 0 || n > MAX_JOB_KIND_LEN || 4 + n != frame.header.len() {
            return Err(corrupt(format!(
                "kind length {n} does not fit a header body of {} bytes",
                frame.header.len() + 8
            )));
        }
        let kind = std::str::from_utf8(&frame.header[4..])
            .map_err(|_| corrupt("the kind is not UTF-8".into()))?
            .to_string();
        Ok(JobRecord {
            kind,
            body: frame.payload.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> JobRecord {
        JobRecord {
            kind: "test-kind/json".into(),
            body: br#"{"preset":"tiny","seed":7}"#.to_vec(),
        }
    }

    #[test]
    fn round_trip() {
        let r = sample();
        let f = r.encode().unwrap();
        assert_eq!(JobRecord::decode("JOB", &f.bytes).unwrap(), r);
        let empty = JobRecord {
            kind: "k".into(),
            body: Vec::new(),
        };
        let f = empty.encode().unwrap();
        assert_eq!(JobRecord::decode("JOB", &f.bytes).unwrap(), empty);
    }

    #[test]
    fn every_flipped_byte_and_every_truncation_is_an_error_naming_the_file() {
        let f = sample().encode().unwrap();
        for i in 0..f.bytes.len() {
            let mut d = f.bytes.to_vec();
            d[i] ^= 0x01;
            let err = JobRecord::decode("store/JOB", &d).unwrap_err();
            assert_eq!(err.file(), Some("store/JOB"), "byte {i}: {err}");
            assert!(
                err.to_string().starts_with("store/JOB: "),
                "byte {i}: {err}"
            );
        }
        for len in 0..f.bytes.len() {
            let err = JobRecord::decode("store/JOB", &f.bytes[..len]).unwrap_err();
            assert_eq!(err.file(), Some("store/JOB"), "length {len}: {err}");
        }
    }

    #[test]
    fn kinds_out_of_bounds_are_refused() {
        for kind in [String::new(), "x".repeat(MAX_JOB_KIND_LEN + 1)] {
            let r = JobRecord {
                kind,
                body: vec![1],
            };
            assert!(matches!(r.encode(), Err(CkptError::InvalidArgument(_))));
        }
        // Another kind of file is not a job record.
        let cur = crate::format::CurrentPointer {
            id: crate::format::CheckpointId::new("x").unwrap(),
            manifest_size: 1,
            manifest_crc32c: crate::format::FileChecksums {
                header: 0,
                payload: 0,
            },
            generation: 0,
        }
        .encode();
        let err = JobRecord::decode("JOB", &cur.bytes).unwrap_err();
        assert!(matches!(err, CkptError::Corrupt { .. }), "{err}");
    }
}
