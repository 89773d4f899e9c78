//! One Criteo sample as it appears in a TSV line, and the two functions that turn it into
//! model inputs: the dense transform and the categorical hash.
//!
//! Both the TSV reader and the synthetic generator go through [`RawSample::append_to`], so a
//! generated sample written to TSV and read back lands in the batch bit for bit as the
//! generator's own batch would.

use ftrec_core::rng::mix64;
use ftrec_core::{Batch, NUM_DENSE, NUM_SPARSE};

use crate::error::LineError;

/// Fields of a labelled Criteo line: label, I1..I13, C1..C26.
pub const FIELDS: usize = 1 + NUM_DENSE + NUM_SPARSE;

/// A Criteo sample before any transform: what one TSV line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawSample {
    /// Clicked.
    pub label: bool,
    /// I1..I13; `None` is an empty field (missing).
    pub dense: [Option<i64>; NUM_DENSE],
    /// C1..C26 as the 32-bit value of their 8 hex digits; `None` is an empty field.
    pub cats: [Option<u32>; NUM_SPARSE],
}

/// The dense transform: `ln(1 + max(x, 0))`, missing counted as 0 (so it becomes 0.0).
///
/// Computed in f64 and rounded once to f32 so the result does not depend on the caller. The
/// small counts most features have are looked up in a table of the same values.
#[inline]
pub fn transform_dense(x: Option<i64>) -> f32 {
    let c = x.unwrap_or(0).max(0);
    match small_transforms().get(c as usize) {
        Some(&t) => t,
        None => transform_count(c),
    }
}

/// `ln(1 + c)` rounded to f32, for `c >= 0`.
fn transform_count(c: i64) -> f32 {
    (c as f64).ln_1p() as f32
}

/// [`transform_count`] of the counts below 1024.
fn small_transforms() -> &'static [f32; 1024] {
    static TABLE: std::sync::OnceLock<[f32; 1024]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|c| transform_count(c as i64)))
}

/// The categorical hash: the row of table `table` (0-based, C1 is 0) that raw value `value`
/// maps to, `mix64((table << 32) | value) % rows`.
///
/// Putting the table index in the high word makes the key unique per (table, value), so the
/// same hex value in two columns lands on unrelated rows; `mix64` is the bijective SplitMix64
/// finaliser of `ftrec_core::rng`. This is a stable, documented format: changing it changes
/// every row of every trained model.
#[inline]
pub fn categorical_row(table: usize, value: u32, rows: u64) -> u64 {
    mix64(((table as u64) << 32) | value as u64) % rows
}

impl RawSample {
    /// Append this sample to `batch`: label, transformed dense features, one bag per table
    /// (one row, or empty when the value is missing). `table_rows` has one entry per table.
    pub fn append_to(&self, batch: &mut Batch, table_rows: &[u64]) {
        debug_assert_eq!(table_rows.len(), NUM_SPARSE);
        debug_assert_eq!(batch.sparse.len(), NUM_SPARSE);
        batch.labels.push(if self.label { 1.0 } else { 0.0 });
        batch
            .dense
            .extend(self.dense.iter().map(|&x| transform_dense(x)));
        for (t, (feature, &rows)) in batch.sparse.iter_mut().zip(table_rows).enumerate() {
            match self.cats[t] {
                Some(v) => feature.push_bag(&[categorical_row(t, v, rows)]),
                None => feature.push_bag(&[]),
            }
        }
        batch.size += 1;
    }

    /// Write the Kaggle TSV line (with its `\n`) for this sample into `out`. Categorical values
    /// are written as 8 lowercase hex digits, as in the Criteo files.
    pub fn write_tsv_line(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        out.push(if self.label { b'1' } else { b'0' });
        for x in &self.dense {
            out.push(b'\t');
            if let Some(x) = x {
                // Writing into a Vec cannot fail.
                let _ = write!(out, "{x}");
            }
        }
        for c in &self.cats {
            out.push(b'\t');
            if let Some(c) = c {
                let _ = write!(out, "{c:08x}");
            }
        }
        out.push(b'\n');
    }
}

/// Parse one line (without its line terminator; a trailing `\r` is tolerated) of the Kaggle or
/// Terabyte layout.
pub fn parse_line(line: &[u8]) -> Result<RawSample, LineError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if let Err(e) = std::str::from_utf8(line) {
        return Err(LineError::InvalidUtf8 {
            column: e.valid_up_to() + 1,
        });
    }
    let found = line.iter().filter(|&&b| b == b'\t').count() + 1;
    if found == FIELDS - 1 {
        return Err(LineError::UnlabelledTestLine);
    }
    if found != FIELDS {
        return Err(LineError::FieldCount { found });
    }
    let mut fields = line.split(|&b| b == b'\t');
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();

    let mut sample = RawSample::default();
    // The count above guarantees every `next()` below is `Some`.
    let label = fields.next().unwrap_or_default();
    sample.label = match label {
        b"0" => false,
        b"1" => true,
        _ => return Err(LineError::Label { value: text(label) }),
    };
    for (j, slot) in sample.dense.iter_mut().enumerate() {
        let f = fields.next().unwrap_or_default();
        if !f.is_empty() {
            *slot = Some(parse_int(f).ok_or_else(|| LineError::Dense {
                feature: j + 1,
                value: text(f),
            })?);
        }
    }
    for (t, slot) in sample.cats.iter_mut().enumerate() {
        let f = fields.next().unwrap_or_default();
        if !f.is_empty() {
            *slot = Some(parse_hex8(f).ok_or_else(|| LineError::Categorical {
                feature: t + 1,
                value: text(f),
            })?);
        }
    }
    Ok(sample)
}

/// A decimal integer with an optional leading `-`; `None` on anything else or on overflow.
fn parse_int(f: &[u8]) -> Option<i64> {
    let (neg, digits) = match f.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, f),
    };
    if digits.is_empty() {
        return None;
    }
    let mut v: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        let d = (b - b'0') as i64;
        v = v.checked_mul(10)?;
        v = if neg {
            v.checked_sub(d)?
        } else {
            v.checked_add(d)?
        };
    }
    Some(v)
}

/// Exactly 8 hex digits (either case) as a u32.
fn parse_hex8(f: &[u8]) -> Option<u32> {
    if f.len() != 8 {
        return None;
    }
    let mut v: u32 = 0;
    for &b in f {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | d as u32;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_with(label: &str, dense: &[&str; 13], cats: &[&str; 26]) -> Vec<u8> {
        let mut s = label.to_string();
        for d in dense {
            s.push('\t');
            s.push_str(d);
        }
        for c in cats {
            s.push('\t');
            s.push_str(c);
        }
        s.into_bytes()
    }

    #[test]
    fn integers_parse_with_sign_and_reject_junk_and_overflow() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-3"), Some(-3));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_int(b"9223372036854775808"), None);
        assert_eq!(parse_int(b"-"), None);
        assert_eq!(parse_int(b"1.5"), None);
        assert_eq!(parse_int(b"+1"), None);
        assert_eq!(parse_int(b" 1"), None);
    }

    #[test]
    fn hex_needs_exactly_eight_digits() {
        assert_eq!(parse_hex8(b"68fd1e64"), Some(0x68fd_1e64));
        assert_eq!(parse_hex8(b"FFFFFFFF"), Some(u32::MAX));
        assert_eq!(parse_hex8(b"68fd1e6"), None);
        assert_eq!(parse_hex8(b"68fd1e645"), None);
        assert_eq!(parse_hex8(b"68fd1e6g"), None);
    }

    #[test]
    fn dense_transform_clamps_negatives_and_missing_to_zero() {
        assert_eq!(transform_dense(None), 0.0);
        assert_eq!(transform_dense(Some(-2)), 0.0);
        assert_eq!(transform_dense(Some(0)), 0.0);
        assert_eq!(transform_dense(Some(1)), std::f64::consts::LN_2 as f32);
        assert_eq!(transform_dense(Some(99)), (100f64).ln() as f32);
    }

    #[test]
    fn the_dense_transform_is_ln_1p_rounded_once_in_and_beyond_its_table() {
        for c in (0..3000i64).chain([i64::MAX, 1 << 40]) {
            let want = (c as f64).ln_1p() as f32;
            assert_eq!(
                transform_dense(Some(c)).to_bits(),
                want.to_bits(),
                "count {c}"
            );
        }
        assert_eq!(transform_dense(None), 0.0);
        assert_eq!(transform_dense(Some(-3)), 0.0);
    }

    #[test]
    fn categorical_rows_are_in_range_and_differ_between_tables() {
        for t in 0..NUM_SPARSE {
            for v in [0u32, 1, 0xdead_beef, u32::MAX] {
                assert!(categorical_row(t, v, 3) < 3);
            }
        }
        let rows = 1u64 << 40;
        assert_ne!(
            categorical_row(0, 7, rows),
            categorical_row(1, 7, rows),
            "the table index must be part of the key"
        );
        // The documented formula, spelled out.
        assert_eq!(
            categorical_row(5, 0x1234_5678, 1000),
            mix64((5u64 << 32) | 0x1234_5678) % 1000
        );
    }

    #[test]
    fn format_then_parse_is_identity() {
        let mut s = RawSample {
            label: true,
            ..Default::default()
        };
        s.dense[0] = Some(-3);
        s.dense[4] = Some(1_234_567);
        s.cats[0] = Some(0);
        s.cats[25] = Some(u32::MAX);
        s.cats[7] = Some(0x0a0b_0c0d);
        let mut out = Vec::new();
        s.write_tsv_line(&mut out);
        assert_eq!(out.last(), Some(&b'\n'));
        assert_eq!(parse_line(&out[..out.len() - 1]), Ok(s));
    }

    proptest::proptest! {
        #[test]
        fn any_sample_survives_format_then_parse(
            label: bool,
            dense in proptest::array::uniform13(proptest::option::of(proptest::num::i64::ANY)),
            cats in proptest::collection::vec(proptest::option::of(proptest::num::u32::ANY), NUM_SPARSE),
        ) {
            let mut s = RawSample { label, dense, ..Default::default() };
            s.cats.copy_from_slice(&cats);
            let mut out = Vec::new();
            s.write_tsv_line(&mut out);
            proptest::prop_assert_eq!(parse_line(&out[..out.len() - 1]), Ok(s));
        }
    }

    #[test]
    fn each_kind_of_bad_field_is_named() {
        let dense = ["1"; 13];
        let cats = ["68fd1e64"; 26];
        assert!(parse_line(&line_with("0", &dense, &cats)).is_ok());
        assert!(parse_line(&line_with("1", &dense, &cats)).is_ok());
        assert_eq!(
            parse_line(&line_with("2", &dense, &cats)),
            Err(LineError::Label { value: "2".into() })
        );
        let mut bad = dense;
        bad[12] = "x7";
        assert_eq!(
            parse_line(&line_with("0", &bad, &cats)),
            Err(LineError::Dense {
                feature: 13,
                value: "x7".into()
            })
        );
        let mut bad = cats;
        bad[2] = "68fd1e6";
        assert_eq!(
            parse_line(&line_with("0", &dense, &bad)),
            Err(LineError::Categorical {
                feature: 3,
                value: "68fd1e6".into()
            })
        );
        // Drop the label: the test.txt layout.
        let test_line = line_with("0", &dense, &cats)[2..].to_vec();
        assert_eq!(parse_line(&test_line), Err(LineError::UnlabelledTestLine));
        assert_eq!(
            parse_line(b"1\t2\t3"),
            Err(LineError::FieldCount { found: 3 })
        );
        assert_eq!(
            parse_line(b"1\t\xff\x00"),
            Err(LineError::InvalidUtf8 { column: 3 })
        );
        let mut crlf = line_with("1", &dense, &cats);
        crlf.push(b'\r');
        assert!(parse_line(&crlf).is_ok());
    }
}
