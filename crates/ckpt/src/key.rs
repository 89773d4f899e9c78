//! Object keys: `/`-separated relative paths, validated once at construction.
//!
//! The same key must name the same object on every backend, including a local directory where
//! a key becomes a file path. So the rules are strict: ASCII letters, digits and `-_.=+` only,
//! no empty segment, no `.` or `..`, no segment starting with `.` (the local backend keeps its
//! temporary files under such names, and it keeps keys away from hidden files), no leading or
//! trailing `/`. A key that passes cannot escape the store's root.

use std::fmt;

use crate::error::{CkptError, Result};

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;
/// Longest segment accepted, in bytes (leaves room under the usual 255-byte file-name limit for
/// the local backend's temporary-file decoration).
pub const MAX_SEGMENT_LEN: usize = 200;

/// A validated object key such as `ckpt/00000000000000000100-full/s0000/t0003-000000.rows`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(String);

fn invalid(key: &str, reason: impl Into<String>) -> CkptError {
    CkptError::InvalidKey {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// Check one path segment; `key` is only used in the error.
pub(crate) fn check_segment(key: &str, seg: &str) -> Result<()> {
    if seg.is_empty() {
        return Err(invalid(
            key,
            "empty segment (leading, trailing or doubled '/')",
        ));
    }
    if seg == "." || seg == ".." {
        return Err(invalid(key, format!("segment {seg:?} is not allowed")));
    }
    if seg.starts_with('.') {
        return Err(invalid(
            key,
            format!("segment {seg:?} starts with '.', which is reserved"),
        ));
    }
    if seg.len() > MAX_SEGMENT_LEN {
        return Err(invalid(
            key,
            format!(
                "segment of {} bytes is longer than {MAX_SEGMENT_LEN}",
                seg.len()
            ),
        ));
    }
    if let Some(c) = seg
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '=' | '+')))
    {
        return Err(invalid(
            key,
            format!("character {c:?} is not allowed (use ASCII letters, digits and -_.=+)"),
        ));
    }
    Ok(())
}

impl Key {
    /// Validate `s` as a key.
    pub fn new(s: impl Into<String>) -> Result<Key> {
        let s = s.into();
        if s.is_empty() {
            return Err(invalid(&s, "empty key"));
        }
        if s.len() > MAX_KEY_LEN {
            return Err(invalid(
                &s,
                format!("{} bytes is longer than {MAX_KEY_LEN}", s.len()),
            ));
        }
        if s.starts_with('/') {
            return Err(invalid(&s, "absolute paths are not allowed"));
        }
        for seg in s.split('/') {
            check_segment(&s, seg)?;
        }
        Ok(Key(s))
    }

    /// `self/segment`; `segment` may itself contain `/`.
    pub fn join(&self, rest: &str) -> Result<Key> {
        Key::new(format!("{}/{}", self.0, rest))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path segments, first to last.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// The last segment.
    pub fn name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// True if `self` lies strictly under `prefix` (segment-wise: `a/b` is under `a` but
    /// `ab/c` is not).
    pub fn is_under(&self, prefix: &Key) -> bool {
        self.0.len() > prefix.0.len()
            && self.0.starts_with(&prefix.0)
            && self.0.as_bytes()[prefix.0.len()] == b'/'
    }

    /// The part of `self` after `prefix/`, if `self` lies under `prefix`.
    pub fn strip_prefix(&self, prefix: &Key) -> Option<&str> {
        if self.is_under(prefix) {
            Some(&self.0[prefix.0.len() + 1..])
        } else {
            None
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Key {
    type Err = CkptError;
    fn from_str(s: &str) -> Result<Key> {
        Key::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_keys_pass() {
        for k in [
            "a",
            "a/b/c",
            "ckpt/0001-full/MANIFEST",
            "s0/t3-000001.rows",
            "x=1+2_y-z.v",
        ] {
            let key = Key::new(k).unwrap();
            assert_eq!(key.as_str(), k);
        }
    }

    #[test]
    fn invalid_keys_are_rejected_with_a_reason() {
        let cases = [
            ("", "empty"),
            ("/etc/passwd", "absolute"),
            ("a/../b", "\"..\""),
            ("..", "\"..\""),
            ("a/./b", "\".\""),
            ("a//b", "empty segment"),
            ("a/", "empty segment"),
            ("a/.hidden", "reserved"),
            ("a\\b", "character"),
            ("a b", "character"),
            ("caf\u{e9}", "character"),
            ("a\0b", "character"),
        ];
        for (k, why) in cases {
            match Key::new(k) {
                Err(CkptError::InvalidKey { key, reason }) => {
                    assert_eq!(key, k);
                    assert!(
                        reason.contains(why),
                        "{k:?}: reason {reason:?} lacks {why:?}"
                    );
                }
                other => panic!("{k:?} should be invalid, got {other:?}"),
            }
        }
        let long_seg = "x".repeat(MAX_SEGMENT_LEN + 1);
        assert!(matches!(
            Key::new(long_seg),
            Err(CkptError::InvalidKey { .. })
        ));
        let long_key = vec!["abcdefgh"; 200].join("/");
        assert!(matches!(
            Key::new(long_key),
            Err(CkptError::InvalidKey { .. })
        ));
    }

    #[test]
    fn prefixes_are_segment_wise() {
        let a = Key::new("a").unwrap();
        let ab = Key::new("a/b").unwrap();
        let abc = Key::new("ab/c").unwrap();
        assert!(ab.is_under(&a));
        assert!(!abc.is_under(&a));
        assert!(!a.is_under(&a));
        assert_eq!(ab.strip_prefix(&a), Some("b"));
        assert_eq!(abc.strip_prefix(&a), None);
        assert_eq!(ab.name(), "b");
        assert_eq!(a.join("x/y").unwrap().as_str(), "a/x/y");
        assert!(a.join("../y").is_err());
    }
}
