//! The TSV readers fed arbitrary bytes and mutated valid lines, and the data sources resumed
//! from arbitrary positions (a position is stored in every checkpoint's manifest): each
//! returns a value or an error, never panics, never loops forever, and never allocates by a
//! length the input does not back (see `ftrec_core::fuzz`).

use std::io::Write;
use std::path::PathBuf;

use ftrec_core::fuzz::strategies::{config, huge, mutation_with};
use ftrec_core::fuzz::{alloc_bound, largest_allocation, mutated, AllocProbe, Mutation};
use ftrec_core::{Preset, NUM_SPARSE};
use ftrec_data::{
    parse_line, BatchSource, DataPath, Layout, Position, RawSample, SynthConfig, SyntheticSource,
    TsvConfig, TsvReader,
};
use proptest::prelude::*;

#[global_allocator]
static ALLOC: AllocProbe = AllocProbe;

/// Mutations that insert the bytes a TSV line is made of.
fn mutation() -> impl Strategy<Value = Mutation> {
    mutation_with(
        prop::sample::select(b"\t\n\r-09afAFxZ \x00\xff".to_vec()),
        huge(300),
    )
}

fn sample() -> impl Strategy<Value = RawSample> {
    (
        any::<bool>(),
        prop::array::uniform13(prop::option::of(any::<i64>())),
        prop::collection::vec(prop::option::of(any::<u32>()), NUM_SPARSE),
    )
        .prop_map(|(label, dense, cats)| {
            let mut s = RawSample {
                label,
                dense,
                ..Default::default()
            };
            s.cats.copy_from_slice(&cats);
            s
        })
}

fn line_of(s: &RawSample) -> Vec<u8> {
    let mut out = Vec::new();
    s.write_tsv_line(&mut out);
    out.pop();
    out
}

/// `parse_line` on `line`: a sample that formats back to a line parsing to itself, or an error.
fn check_line(line: &[u8]) -> Result<(), TestCaseError> {
    let (r, largest) = largest_allocation(|| parse_line(line));
    prop_assert!(largest <= alloc_bound(line.len()));
    if let Ok(s) = r {
        prop_assert_eq!(parse_line(&line_of(&s)), Ok(s));
    }
    Ok(())
}

/// Read every batch of `reader` (bounded: a reader of `bytes` bytes cannot yield more batches
/// than lines), then return.
fn drain(reader: &mut TsvReader, bytes: usize) -> Result<(), TestCaseError> {
    for _ in 0..bytes + 2 {
        match reader.next_batch(3) {
            Ok(Some(b)) => prop_assert!(b.size > 0 && b.size <= 3),
            Ok(None) | Err(_) => return Ok(()),
        }
    }
    prop_assert!(
        false,
        "the reader kept yielding batches past the end of its input"
    );
    Ok(())
}

fn tsv_reader(path: PathBuf, skip: bool, holdout: u64) -> TsvReader {
    let mut cfg = TsvConfig::new(DataPath::File(path), Layout::Kaggle).with_rows_per_table(1000);
    cfg.skip_malformed = skip;
    cfg.holdout_every = holdout;
    TsvReader::open(cfg).unwrap()
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_lines(line in prop::collection::vec(any::<u8>(), 0..400)) {
        check_line(&line)?;
    }

    #[test]
    fn mutated_valid_lines(s in sample(), ms in prop::collection::vec(mutation(), 1..5)) {
        check_line(&mutated(&line_of(&s), &ms))?;
    }
}

proptest! {
    #![proptest_config(config(48))]

    /// A file of valid lines with mutations anywhere (newlines included) and arbitrary bytes:
    /// strict readers stop at the first bad line with an error, skipping readers read to the end.
    #[test]
    fn tsv_files(
        samples in prop::collection::vec(sample(), 0..6),
        ms in prop::collection::vec(mutation(), 0..6),
        tail in prop::collection::vec(any::<u8>(), 0..64),
        skip in any::<bool>(),
        holdout in prop::sample::select(vec![0u64, 1, 2, 64]),
    ) {
        let mut text = Vec::new();
        for s in &samples {
            s.write_tsv_line(&mut text);
        }
        let mut bytes = mutated(&text, &ms);
        bytes.extend_from_slice(&tail);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.txt");
        std::fs::File::create(&path).unwrap().write_all(&bytes).unwrap();
        let mut r = tsv_reader(path, skip, holdout);
        let (res, largest) = largest_allocation(|| {
            let eval = r.eval_set(100, 4).map(|e| e.batches.len());
            drain(&mut r, bytes.len()).map(|()| eval)
        });
        // The held-out set is an error (a malformed held-out line) or batches: either is fine.
        let _eval = res?;
        // The reader's own buffers (64 KiB line cap and read buffer) plus batches.
        prop_assert!(largest <= alloc_bound(bytes.len()), "allocated {largest} at once");
    }

    /// A TSV reader resumed at any position (as a damaged manifest could store it): an error,
    /// or a reader that reads on and stops.
    #[test]
    fn tsv_positions(
        file in prop_oneof![3 => Just(0usize), 1 => 1usize..3, 1 => Just(usize::MAX)],
        right_name in prop::sample::select(vec![true, true, true, false]),
        at_line in prop::option::of(0usize..5),
        offset in huge(300),
        line in prop_oneof![huge(300), Just(u64::MAX), 0u64..6],
        epoch in prop_oneof![huge(300), Just(u64::MAX)],
        endless in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.txt");
        let mut text = Vec::new();
        for i in 0..4u32 {
            let mut s = RawSample::default();
            s.cats[0] = Some(i);
            s.write_tsv_line(&mut text);
        }
        std::fs::write(&path, &text).unwrap();
        // Mostly offsets where a line starts (the only ones a seek accepts), else any.
        let starts: Vec<u64> = std::iter::once(0)
            .chain(text.iter().enumerate().filter(|(_, &b)| b == b'\n').map(|(i, _)| i as u64 + 1))
            .collect();
        let offset = at_line.map_or(offset, |k| starts[k % starts.len()]);
        let mut cfg = TsvConfig::new(DataPath::File(path), Layout::Kaggle).with_rows_per_table(10);
        cfg.holdout_every = 0;
        cfg.epochs = if endless { None } else { Some(2) };
        let mut r = TsvReader::open(cfg).unwrap();
        let pos = Position::Tsv {
            file,
            file_name: if right_name { "train.txt".into() } else { "other.txt".into() },
            offset,
            line,
            epoch,
        };
        if r.seek(&pos).is_ok() {
            for _ in 0..12 {
                if !matches!(r.next_batch(3), Ok(Some(_))) {
                    break;
                }
                let _ = r.position();
            }
        }
    }

    /// The synthetic stream resumed at any sample.
    #[test]
    fn synthetic_positions(sample in huge(300), samples in prop::option::of(huge(300))) {
        let mut cfg = SynthConfig::from_preset(&Preset::tiny(), 7);
        cfg.samples = samples;
        let mut s = SyntheticSource::new(cfg).unwrap();
        if s.seek(&Position::Synthetic { sample }).is_ok() {
            for _ in 0..3 {
                if !matches!(s.next_batch(2), Ok(Some(_))) {
                    break;
                }
                let _ = s.position();
            }
        }
        let tsv = Position::Tsv {
            file: 0,
            file_name: String::new(),
            offset: 0,
            line: 0,
            epoch: 0,
        };
        prop_assert!(s.seek(&tsv).is_err());
    }
}

/// Regression inputs found by the properties above, kept by name.
mod found {
    use super::*;

    fn four_lines() -> (tempfile::TempDir, PathBuf, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.txt");
        let mut text = Vec::new();
        for _ in 0..4 {
            RawSample::default().write_tsv_line(&mut text);
        }
        std::fs::write(&path, &text).unwrap();
        (dir, path, text)
    }

    fn endless(path: PathBuf) -> TsvReader {
        let mut cfg = TsvConfig::new(DataPath::File(path), Layout::Kaggle).with_rows_per_table(10);
        cfg.holdout_every = 0;
        cfg.epochs = None;
        TsvReader::open(cfg).unwrap()
    }

    #[test]
    fn an_endless_tsv_stream_resumed_at_the_last_epoch_ends() {
        let (_dir, path, text) = four_lines();
        let mut r = endless(path);
        let pos = Position::Tsv {
            file: 0,
            file_name: "train.txt".into(),
            offset: text.len() as u64,
            line: 4,
            epoch: u64::MAX,
        };
        r.seek(&pos).unwrap();
        assert!(r.next_batch(2).unwrap().is_none());
    }

    #[test]
    fn a_tsv_position_with_more_lines_than_bytes_is_refused() {
        let (_dir, path, _) = four_lines();
        let mut r = endless(path);
        let pos = Position::Tsv {
            file: 0,
            file_name: "train.txt".into(),
            offset: 0,
            line: u64::MAX,
            epoch: 0,
        };
        let e = r.seek(&pos).unwrap_err();
        assert!(e.to_string().contains("cannot end before byte 0"), "{e}");
    }

    #[test]
    fn an_endless_synthetic_stream_resumed_at_the_last_sample_ends() {
        let mut s = SyntheticSource::new(SynthConfig::from_preset(&Preset::tiny(), 7)).unwrap();
        s.seek(&Position::Synthetic {
            sample: u64::MAX - 1,
        })
        .unwrap();
        assert_eq!(s.next_batch(4).unwrap().unwrap().size, 1);
        assert!(s.next_batch(4).unwrap().is_none());
    }
}
