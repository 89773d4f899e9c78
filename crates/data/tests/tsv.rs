//! The Criteo TSV reader: parsing, errors with file and line, skip mode, held-out split,
//! multi-file and directory layouts, epochs and resuming.

use std::io::Write;
use std::path::{Path, PathBuf};

use ftrec_core::rng::mix64;
use ftrec_core::{Batch, NUM_DENSE, NUM_SPARSE};
use ftrec_data::{
    BatchSource, DataError, DataPath, Layout, LineError, Position, TsvConfig, TsvReader,
};

/// Small tables so that ids are easy to check.
fn rows() -> Vec<u64> {
    (0..NUM_SPARSE as u64).map(|t| 10 + t * 7).collect()
}

/// A labelled line with `dense` and `cats` fields given as text.
fn line(label: &str, dense: [&str; NUM_DENSE], cats: [&str; NUM_SPARSE]) -> String {
    let mut s = label.to_string();
    for d in dense.iter().chain(cats.iter()) {
        s.push('\t');
        s.push_str(d);
    }
    s.push('\n');
    s
}

/// A valid line whose first dense feature is `i` (so lines can be told apart).
fn numbered(i: usize) -> String {
    let mut dense = [""; NUM_DENSE];
    let n = i.to_string();
    dense[0] = &n;
    let label = if i % 3 == 0 { "1" } else { "0" };
    let hex = format!("{:08x}", (i as u32).wrapping_mul(0x9E37_79B1));
    let mut cats = [""; NUM_SPARSE];
    for c in cats.iter_mut().step_by(2) {
        *c = &hex;
    }
    line(label, dense, cats)
}

fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap();
    p
}

fn config(path: DataPath) -> TsvConfig {
    let mut c = TsvConfig::new(path, Layout::Kaggle);
    c.table_rows = rows();
    c.holdout_every = 0;
    c
}

fn open(c: TsvConfig) -> TsvReader {
    TsvReader::open(c).unwrap()
}

/// Every batch until the end.
fn drain(r: &mut dyn BatchSource, size: usize) -> Vec<Batch> {
    let mut out = Vec::new();
    while let Some(b) = r.next_batch(size).unwrap() {
        out.push(b);
    }
    out
}

/// The first dense feature of every sample, back from `ln(1 + x)`: the line numbers made by
/// `numbered`.
fn first_dense(batches: &[Batch]) -> Vec<usize> {
    batches
        .iter()
        .flat_map(|b| (0..b.size).map(move |i| b.dense[i * NUM_DENSE]))
        .map(|v| ((v as f64).exp() - 1.0).round() as usize)
        .collect()
}

#[test]
fn a_hand_written_file_with_empty_fields_and_negative_ints_parses_as_expected() {
    let dir = tempfile::tempdir().unwrap();
    let mut cats1 = [""; NUM_SPARSE];
    cats1[0] = "deadbeef";
    cats1[1] = "00000000";
    cats1[3] = "0A0B0C0D";
    cats1[25] = "ffffffff";
    let text = line(
        "1",
        [
            "", "-2", "7", "", "0", "123456", "", "3", "", "", "1", "", "42",
        ],
        cats1,
    ) + &line("0", ["5"; NUM_DENSE], ["12345678"; NUM_SPARSE]);
    let p = write_file(dir.path(), "hand.txt", &text);
    let mut r = open(config(DataPath::File(p)));
    let b = r.next_batch(10).unwrap().unwrap();
    assert_eq!(b.size, 2);
    assert_eq!(b.labels, vec![1.0, 0.0]);
    b.validate(NUM_DENSE, &rows()).unwrap();

    let ln1p = |x: f64| x.ln_1p() as f32;
    let expect_dense = [
        0.0,
        0.0, // -2 clamps to 0
        ln1p(7.0),
        0.0,
        0.0,
        ln1p(123456.0),
        0.0,
        ln1p(3.0),
        0.0,
        0.0,
        ln1p(1.0),
        0.0,
        ln1p(42.0),
    ];
    assert_eq!(&b.dense[..NUM_DENSE], &expect_dense);
    assert_eq!(&b.dense[NUM_DENSE..], &[ln1p(5.0); NUM_DENSE]);

    // The documented hash: mix64((table << 32) | value) % rows.
    let row = |t: usize, v: u64| mix64(((t as u64) << 32) | v) % rows()[t];
    assert_eq!(b.sparse[0].bag(0), &[row(0, 0xdead_beef)]);
    assert_eq!(b.sparse[1].bag(0), &[row(1, 0)]);
    assert_eq!(b.sparse[2].bag(0), &[] as &[u64]);
    assert_eq!(b.sparse[3].bag(0), &[row(3, 0x0a0b_0c0d)]);
    assert_eq!(b.sparse[25].bag(0), &[row(25, 0xffff_ffff)]);
    for t in 0..NUM_SPARSE {
        assert_eq!(b.sparse[t].bag(1), &[row(t, 0x1234_5678)]);
        if ![0, 1, 3, 25].contains(&t) {
            assert!(b.sparse[t].bag(0).is_empty(), "C{} should be empty", t + 1);
        }
    }
    assert!(r.next_batch(10).unwrap().is_none());
}

/// The error of reading a file with `good` valid lines then `bad`.
fn error_for(bad: &str) -> DataError {
    let dir = tempfile::tempdir().unwrap();
    let text = numbered(1) + &numbered(2) + bad + &numbered(4);
    let p = write_file(dir.path(), "bad.txt", &text);
    let mut r = open(config(DataPath::File(p)));
    r.next_batch(100).unwrap_err()
}

fn assert_fault(err: DataError, want: LineError) {
    let fault = err.line_fault().expect("a malformed-line error");
    assert_eq!(fault.line, 3, "{err}");
    assert_eq!(fault.file.file_name().unwrap(), "bad.txt");
    assert_eq!(fault.kind, want, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("bad.txt:3:"),
        "message names file and line: {msg}"
    );
}

#[test]
fn each_malformed_line_is_an_error_naming_file_line_and_problem() {
    let good = numbered(3);
    let fields: Vec<&str> = good.strip_suffix('\n').unwrap().split('\t').collect();
    let with = |i: usize, v: &str| {
        let mut f = fields.clone();
        f[i] = v;
        f.join("\t") + "\n"
    };

    assert_fault(error_for("1\t2\t3\n"), LineError::FieldCount { found: 3 });
    assert_fault(error_for("\n"), LineError::FieldCount { found: 1 });
    let extra = good.strip_suffix('\n').unwrap().to_string() + "\tabc\n";
    assert_fault(error_for(&extra), LineError::FieldCount { found: 41 });
    assert_fault(
        error_for(&with(0, "yes")),
        LineError::Label {
            value: "yes".into(),
        },
    );
    assert_fault(
        error_for(&with(5, "3.5")),
        LineError::Dense {
            feature: 5,
            value: "3.5".into(),
        },
    );
    assert_fault(
        error_for(&with(1 + NUM_DENSE + 4, "12345")),
        LineError::Categorical {
            feature: 5,
            value: "12345".into(),
        },
    );
    assert_fault(
        error_for(&with(1 + NUM_DENSE, "zzzzzzzz")),
        LineError::Categorical {
            feature: 1,
            value: "zzzzzzzz".into(),
        },
    );
    let long = "1".repeat(ftrec_data::MAX_LINE_BYTES + 10) + "\n";
    assert_fault(
        error_for(&long),
        LineError::TooLong {
            limit: ftrec_data::MAX_LINE_BYTES,
        },
    );
}

#[test]
fn a_kaggle_test_line_without_label_gets_its_own_message() {
    let unlabelled = numbered(3)[2..].to_string();
    let err = error_for(&unlabelled);
    let msg = err.to_string();
    assert_fault(err, LineError::UnlabelledTestLine);
    assert!(msg.contains("test.txt"), "{msg}");
}

#[test]
fn invalid_utf8_is_an_error_with_its_column() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.txt");
    let mut bytes = (numbered(1) + &numbered(2)).into_bytes();
    bytes.extend_from_slice(b"1\t\xc3\x28\n");
    std::fs::write(&p, &bytes).unwrap();
    let err = open(config(DataPath::File(p))).next_batch(10).unwrap_err();
    assert_fault(err, LineError::InvalidUtf8 { column: 3 });
}

#[test]
fn skip_mode_skips_and_counts_every_malformed_line() {
    let dir = tempfile::tempdir().unwrap();
    let text =
        numbered(1) + "garbage\n" + &numbered(2) + &numbered(3)[2..] + &numbered(4) + "2\tbad\n";
    let p = write_file(dir.path(), "mixed.txt", &text);
    let mut c = config(DataPath::File(p));
    c.skip_malformed = true;
    let mut r = open(c);
    let batches = drain(&mut r, 2);
    assert_eq!(first_dense(&batches), vec![1, 2, 4]);
    assert_eq!(r.malformed_skipped(), 3);
    let lines: Vec<u64> = r.skipped_examples().iter().map(|f| f.line).collect();
    assert_eq!(lines, vec![2, 4, 6]);
    assert_eq!(r.skipped_examples()[1].kind, LineError::UnlabelledTestLine);
}

#[test]
fn a_failed_batch_leaves_the_reader_where_the_batch_started() {
    let dir = tempfile::tempdir().unwrap();
    let text = numbered(1) + &numbered(2) + "junk\n" + &numbered(4);
    let p = write_file(dir.path(), "f.txt", &text);
    let mut r = open(config(DataPath::File(p)));
    let first = r.next_batch(1).unwrap().unwrap();
    assert_eq!(first_dense(&[first]), vec![1]);
    let before = r.position();
    assert!(r.next_batch(5).is_err());
    assert_eq!(r.position(), before);
    // The same error again: nothing was silently consumed.
    let again = r.next_batch(5).unwrap_err();
    assert_eq!(again.line_fault().unwrap().line, 3);
}

#[test]
fn crlf_lines_and_a_missing_final_newline_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let text = numbered(1).replace('\n', "\r\n") + numbered(2).strip_suffix('\n').unwrap();
    let p = write_file(dir.path(), "f.txt", &text);
    let batches = drain(&mut open(config(DataPath::File(p))), 10);
    assert_eq!(first_dense(&batches), vec![1, 2]);
}

#[test]
fn several_files_are_read_in_order_and_resume_gives_identical_batches() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for f in 0..3 {
        let text: String = (0..25).map(|i| numbered(f * 100 + i)).collect();
        files.push(write_file(dir.path(), &format!("part{f}.txt"), &text));
    }
    let mut c = config(DataPath::Files(files));
    c.epochs = Some(2);
    let full = drain(&mut open(c.clone()), 7);
    let expect: Vec<usize> = (0..2)
        .flat_map(|_| (0..3).flat_map(|f| (0..25).map(move |i| f * 100 + i)))
        .collect();
    assert_eq!(first_dense(&full), expect);
    assert_eq!(full.iter().map(|b| b.size).sum::<usize>(), 150);

    // Stop after every possible number of batches, save the position through JSON (as a
    // checkpoint would), restore into a fresh reader and compare the rest.
    for stop in 0..full.len() {
        let mut r = open(c.clone());
        for b in &full[..stop] {
            assert_eq!(&r.next_batch(7).unwrap().unwrap(), b);
        }
        let json = serde_json::to_string(&r.position()).unwrap();
        let pos: Position = serde_json::from_str(&json).unwrap();
        let mut restored = open(c.clone());
        restored.seek(&pos).unwrap();
        assert_eq!(
            drain(&mut restored, 7),
            full[stop..],
            "resumed after {stop}"
        );
    }
}

#[test]
fn endless_epochs_wrap_around_and_an_empty_epoch_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_file(dir.path(), "f.txt", &(numbered(1) + &numbered(2)));
    let mut c = config(DataPath::File(p));
    c.epochs = None;
    let mut r = open(c.clone());
    let b = r.next_batch(5).unwrap().unwrap();
    assert_eq!(first_dense(&[b]), vec![1, 2, 1, 2, 1]);
    assert!(matches!(
        r.position(),
        Position::Tsv {
            epoch: 2,
            line: 1,
            ..
        }
    ));

    let empty = write_file(dir.path(), "empty.txt", "");
    let mut c = config(DataPath::File(empty));
    c.epochs = None;
    assert!(matches!(
        open(c.clone()).next_batch(4),
        Err(DataError::NoSamples { .. })
    ));
    // Finite epochs: also refused as soon as a second empty pass would start...
    c.epochs = Some(3);
    assert!(matches!(
        open(c.clone()).next_batch(4),
        Err(DataError::NoSamples { .. })
    ));
    // ...while a single pass over nothing is simply the end of the data.
    c.epochs = Some(1);
    assert!(open(c).next_batch(4).unwrap().is_none());
}

#[test]
fn every_kth_line_is_held_out_of_training_and_read_by_eval() {
    let dir = tempfile::tempdir().unwrap();
    let a: String = (1..=10).map(numbered).collect();
    let b: String = (101..=105).map(numbered).collect();
    let files = vec![
        write_file(dir.path(), "a.txt", &a),
        write_file(dir.path(), "b.txt", &b),
    ];
    let mut c = config(DataPath::Files(files));
    c.holdout_every = 4;
    let mut r = open(c.clone());
    let train = first_dense(&drain(&mut r, 3));
    // Lines 4 and 8 of a.txt and line 4 of b.txt are held out.
    assert_eq!(train, vec![1, 2, 3, 5, 6, 7, 9, 10, 101, 102, 103, 105]);
    let eval = r.eval_set(100, 2).unwrap();
    assert_eq!(first_dense(&eval.batches), vec![4, 8, 104]);
    assert_eq!(
        eval.batches.iter().map(|b| b.size).collect::<Vec<_>>(),
        vec![2, 1]
    );
    assert!(eval.teacher_probs.is_none());
    assert_eq!(first_dense(&r.eval_set(2, 8).unwrap().batches), vec![4, 8]);

    c.holdout_every = 0;
    assert!(matches!(open(c).eval_set(10, 2), Err(DataError::NoHoldout)));
}

#[test]
fn eval_does_not_move_the_training_position() {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (1..=20).map(numbered).collect();
    let mut c = config(DataPath::File(write_file(dir.path(), "f.txt", &text)));
    c.holdout_every = 5;
    let mut r = open(c);
    r.next_batch(3).unwrap();
    let pos = r.position();
    r.eval_set(10, 4).unwrap();
    assert_eq!(r.position(), pos);
    assert_eq!(
        first_dense(&[r.next_batch(2).unwrap().unwrap()]),
        vec![4, 6]
    );
}

#[test]
fn directories_follow_the_layout() {
    // Kaggle: train.txt, not test.txt.
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "train.txt", &numbered(7));
    write_file(dir.path(), "test.txt", &numbered(8)[2..]);
    let path = DataPath::from_paths(&[dir.path().to_path_buf()]).unwrap();
    assert_eq!(path, DataPath::Dir(dir.path().to_path_buf()));
    let batches = drain(&mut open(config(path)), 4);
    assert_eq!(first_dense(&batches), vec![7]);

    // Terabyte: day_N in numeric order (day_10 after day_2), nothing else.
    let tb = tempfile::tempdir().unwrap();
    for d in [10, 2, 0, 1] {
        write_file(tb.path(), &format!("day_{d}"), &numbered(d));
    }
    write_file(tb.path(), "day_3.gz", "not read");
    write_file(tb.path(), "notes", "not read");
    let mut c = TsvConfig::new(DataPath::Dir(tb.path().to_path_buf()), Layout::Terabyte);
    assert_eq!(c.table_rows, ftrec_data::TERABYTE_TABLE_ROWS.to_vec());
    c.holdout_every = 0;
    let r = open(c.clone());
    let names: Vec<_> = r
        .files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["day_0", "day_1", "day_2", "day_10"]);
    assert_eq!(first_dense(&drain(&mut open(c), 3)), vec![0, 1, 2, 10]);

    // An empty directory names what it looked for.
    let none = tempfile::tempdir().unwrap();
    write_file(none.path(), "day_0.gz", "");
    let err = TsvReader::open(TsvConfig::new(
        DataPath::Dir(none.path().to_path_buf()),
        Layout::Terabyte,
    ))
    .unwrap_err();
    assert!(matches!(err, DataError::NoFiles { .. }));
    assert!(err.to_string().contains("decompress"), "{err}");
    assert!(matches!(
        TsvReader::open(TsvConfig::new(
            DataPath::Dir(none.path().to_path_buf()),
            Layout::Kaggle
        )),
        Err(DataError::NoFiles { .. })
    ));
}

#[test]
fn rows_per_table_caps_every_table_and_ids_stay_below_it() {
    let c = TsvConfig::new(DataPath::File("x".into()), Layout::Terabyte).with_rows_per_table(1000);
    assert_eq!(c.table_rows.iter().max(), Some(&1000));
    assert_eq!(c.table_rows[5], 3, "small tables keep their size");

    let dir = tempfile::tempdir().unwrap();
    let text: String = (0..200).map(numbered).collect();
    let mut c = TsvConfig::new(
        DataPath::File(write_file(dir.path(), "f", &text)),
        Layout::Kaggle,
    )
    .with_rows_per_table(50);
    c.holdout_every = 0;
    for b in drain(&mut open(c.clone()), 64) {
        b.validate(NUM_DENSE, &c.table_rows).unwrap();
    }
}

#[test]
fn bad_configurations_and_positions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_file(dir.path(), "f.txt", &(numbered(1) + &numbered(2)));
    let missing = dir.path().join("missing.txt");
    assert!(matches!(
        TsvReader::open(config(DataPath::File(missing))),
        Err(DataError::Io { .. })
    ));
    let mut c = config(DataPath::File(p.clone()));
    c.table_rows.pop();
    assert!(matches!(
        TsvReader::open(c),
        Err(DataError::InvalidConfig(_))
    ));
    let mut c = config(DataPath::File(p.clone()));
    c.table_rows[4] = 0;
    assert!(matches!(
        TsvReader::open(c),
        Err(DataError::InvalidConfig(_))
    ));
    let mut c = config(DataPath::File(p.clone()));
    c.epochs = Some(0);
    assert!(matches!(
        TsvReader::open(c),
        Err(DataError::InvalidConfig(_))
    ));

    let mut r = open(config(DataPath::File(p)));
    assert!(matches!(r.next_batch(0), Err(DataError::InvalidConfig(_))));
    let good = r.position();
    let Position::Tsv {
        file_name, line, ..
    } = good.clone()
    else {
        panic!("a TSV reader reports a TSV position");
    };
    let bad = [
        Position::Synthetic { sample: 3 },
        Position::Tsv {
            file: 1,
            file_name: file_name.clone(),
            offset: 0,
            line,
            epoch: 0,
        },
        Position::Tsv {
            file: 0,
            file_name: "other.txt".into(),
            offset: 0,
            line,
            epoch: 0,
        },
        Position::Tsv {
            file: 0,
            file_name: file_name.clone(),
            offset: 5, // inside line 1
            line,
            epoch: 0,
        },
        Position::Tsv {
            file: 0,
            file_name: file_name.clone(),
            offset: 1 << 20,
            line,
            epoch: 0,
        },
        Position::Tsv {
            file: 0,
            file_name,
            offset: 0,
            line,
            epoch: 1, // one epoch configured
        },
    ];
    for pos in bad {
        assert!(
            matches!(r.seek(&pos), Err(DataError::BadPosition(_))),
            "{pos:?} accepted"
        );
        assert_eq!(r.position(), good, "a refused seek leaves the reader alone");
    }
}

/// Where every batch starts and how big it is, as `next_batch` reads them.
fn batch_starts(c: &TsvConfig, size: usize) -> Vec<(Position, usize)> {
    let mut r = open(c.clone());
    let mut out = Vec::new();
    loop {
        let start = r.position();
        match r.next_batch(size).unwrap() {
            Some(b) => out.push((start, b.size)),
            None => return out,
        }
    }
}

#[test]
fn skipping_samples_stops_where_reading_them_stops_and_counts_the_batches() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for f in 0..2 {
        let text: String = (0..23).map(|i| numbered(f * 100 + i)).collect();
        files.push(write_file(dir.path(), &format!("part{f}.txt"), &text));
    }
    // Malformed lines, found only by parsing (skip mode) or by reading them into a batch.
    let bad: String =
        numbered(300) + "garbage\n" + &numbered(301) + "1\tx\n" + &numbered(302) + &numbered(303);
    files.push(write_file(dir.path(), "part2.txt", &bad));
    for (holdout, skip, epochs) in [(0, true, 1), (5, true, 2), (4, true, 3), (7, true, 1)] {
        let mut c = config(DataPath::Files(files.clone()));
        c.holdout_every = holdout;
        c.skip_malformed = skip;
        c.epochs = Some(epochs);
        for size in [1, 4, 9] {
            let want = batch_starts(&c, size);
            let mut r = open(c.clone());
            let mut got = Vec::new();
            loop {
                let start = r.position();
                let n = r.skip_samples(size).unwrap();
                if n == 0 {
                    break;
                }
                got.push((start, n));
            }
            assert_eq!(got, want, "holdout {holdout}, epochs {epochs}, size {size}");
            let samples = want.iter().map(|w| w.1 as u64).sum::<u64>();
            assert_eq!(
                ftrec_data::count_batches(&c, size).unwrap(),
                (want.len() as u64, samples)
            );
        }
    }
    // Without skip mode nothing is parsed: every training line counts, and reading the batch
    // that holds a malformed one reports it.
    let mut c = config(DataPath::Files(files.clone()));
    c.epochs = Some(1);
    assert_eq!(ftrec_data::count_batches(&c, 10).unwrap(), (6, 52));
    let mut r = open(c.clone());
    assert_eq!(r.skip_samples(46).unwrap(), 46);
    assert!(matches!(r.next_batch(2), Err(DataError::Malformed { .. })));
    // Endless epochs have no count.
    c.epochs = None;
    assert!(matches!(
        ftrec_data::count_batches(&c, 10),
        Err(DataError::InvalidConfig(_))
    ));
}
