//! The synthetic stream: determinism, resuming, the TSV round trip and the planted teacher.

use ftrec_core::{Batch, Preset, NUM_DENSE};
use ftrec_data::{
    synth_to_dir, write_tsv, BatchSource, DataError, DataPath, Layout, Position, Split,
    SynthConfig, SyntheticSource, TsvConfig, TsvReader,
};

fn tiny(seed: u64) -> SyntheticSource {
    SyntheticSource::from_preset(&Preset::tiny(), seed).unwrap()
}

fn take(src: &mut dyn BatchSource, n: usize, size: usize) -> Vec<Batch> {
    (0..n)
        .map(|_| src.next_batch(size).unwrap().unwrap())
        .collect()
}

/// Area under the ROC curve by the rank-sum formula, ties sharing their mean rank.
fn auc(scores: &[f32], labels: &[f32]) -> f64 {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum, mut pos) = (0.0f64, 0usize);
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && scores[idx[j + 1]] == scores[idx[i]] {
            j += 1;
        }
        let mean_rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            if labels[k] > 0.5 {
                rank_sum += mean_rank;
                pos += 1;
            }
        }
        i = j + 1;
    }
    let neg = scores.len() - pos;
    (rank_sum - (pos * (pos + 1)) as f64 / 2.0) / (pos as f64 * neg as f64)
}

#[test]
fn the_stream_is_a_function_of_the_seed() {
    let a = take(&mut tiny(11), 3, 100);
    let b = take(&mut tiny(11), 3, 100);
    assert_eq!(a, b);
    let c = take(&mut tiny(12), 3, 100);
    assert_ne!(a, c);
    // Batch boundaries do not matter: sample i is sample i.
    let d = take(&mut tiny(11), 1, 300);
    assert_eq!(
        d[0].labels,
        a.iter().flat_map(|b| b.labels.clone()).collect::<Vec<_>>()
    );
    assert_eq!(
        d[0].dense,
        a.iter().flat_map(|b| b.dense.clone()).collect::<Vec<_>>()
    );
    for b in &a {
        b.validate(NUM_DENSE, &Preset::tiny().table_rows).unwrap();
    }
}

#[test]
fn resuming_from_a_position_gives_the_same_batches() {
    let mut src = tiny(5);
    let full = take(&mut src, 8, 64);
    for stop in [0, 1, 5, 8] {
        let mut first = tiny(5);
        take(&mut first, stop, 64);
        let json = serde_json::to_string(&first.position()).unwrap();
        let pos: Position = serde_json::from_str(&json).unwrap();
        assert_eq!(
            pos,
            Position::Synthetic {
                sample: stop as u64 * 64
            }
        );
        let mut restored = tiny(5);
        restored.seek(&pos).unwrap();
        assert_eq!(take(&mut restored, 8 - stop, 64), full[stop..]);
    }
    let tsv_pos = Position::Tsv {
        file: 0,
        file_name: "train.tsv".into(),
        offset: 0,
        line: 0,
        epoch: 0,
    };
    assert!(matches!(src.seek(&tsv_pos), Err(DataError::BadPosition(_))));
}

#[test]
fn a_finite_stream_ends_with_a_short_batch() {
    let mut cfg = SynthConfig::from_preset(&Preset::tiny(), 3);
    cfg.samples = Some(150);
    let mut src = SyntheticSource::new(cfg).unwrap();
    let sizes: Vec<usize> = std::iter::from_fn(|| src.next_batch(64).unwrap())
        .map(|b| b.size)
        .collect();
    assert_eq!(sizes, vec![64, 64, 22]);
    assert!(matches!(
        src.seek(&Position::Synthetic { sample: 151 }),
        Err(DataError::BadPosition(_))
    ));
}

#[test]
fn train_and_eval_are_different_streams() {
    let src = tiny(9);
    let (train, _) = src.batch_at(Split::Train, 0, 256);
    let eval = src.eval_set(256, 256).unwrap();
    assert_eq!(eval.samples(), 256);
    assert_ne!(train.dense, eval.batches[0].dense);
    // The eval set is the eval stream, whatever the batch size.
    let again = src.eval_set(256, 100).unwrap();
    assert_eq!(again.batches.len(), 3);
    let flat: Vec<f32> = again.batches.iter().flat_map(|b| b.dense.clone()).collect();
    assert_eq!(flat, eval.batches[0].dense);
    assert_eq!(again.teacher_probs, eval.teacher_probs);
}

#[test]
fn generator_to_tsv_to_reader_is_bit_identical() {
    let preset = Preset::tiny();
    let dir = tempfile::tempdir().unwrap();
    let n = 1000u64;
    let path = synth_to_dir(&preset, 21, n, dir.path()).unwrap();
    assert_eq!(path.file_name().unwrap(), ftrec_data::SYNTH_FILE);
    assert!(!dir.path().join("train.tsv.tmp").exists());

    let mut direct = SyntheticSource::from_preset(&preset, 21).unwrap();
    let mut cfg = TsvConfig::new(DataPath::Dir(dir.path().to_path_buf()), Layout::Kaggle);
    cfg.table_rows = preset.table_rows.clone();
    cfg.holdout_every = 0;
    let mut reader = TsvReader::open(cfg).unwrap();
    let mut read = 0;
    while let Some(b) = reader.next_batch(128).unwrap() {
        let g = direct.next_batch(b.size).unwrap().unwrap();
        assert_eq!(b.labels, g.labels);
        // Compare bits, not values: -0.0 == 0.0 would hide a difference.
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&b.dense), bits(&g.dense));
        assert_eq!(b.sparse, g.sparse);
        read += b.size;
    }
    assert_eq!(read as u64, n);

    // The eval split written with write_tsv reads back identically too, and the teacher
    // evaluates the parsed lines to the same probabilities.
    let src = tiny(21);
    let mut buf = Vec::new();
    write_tsv(&src, Split::Eval, 0..50, &mut buf).unwrap();
    let eval = src.eval_set(50, 50).unwrap();
    let probs = eval.teacher_probs.unwrap();
    for (i, line) in buf.split(|&b| b == b'\n').take(50).enumerate() {
        let s = ftrec_data::parse_line(line).unwrap();
        assert_eq!(s, src.sample(Split::Eval, i as u64).0);
        assert_eq!(src.teacher().probability(&s) as f32, probs[i]);
    }
}

#[test]
fn the_teacher_is_calibrated_and_informative() {
    // ~25% clicks and a teacher AUC well inside (0.5, 1): the design point is ~0.83 (see the
    // crate docs); the bounds leave room for the sampling noise of 16k samples.
    for seed in [1, 2] {
        let src = tiny(seed);
        let eval = src.eval_set(16384, 4096).unwrap();
        let labels: Vec<f32> = eval.batches.iter().flat_map(|b| b.labels.clone()).collect();
        let probs = eval.teacher_probs.unwrap();
        let ctr = labels.iter().sum::<f32>() / labels.len() as f32;
        assert!((0.22..0.29).contains(&ctr), "seed {seed}: CTR {ctr}");
        let mean_p = probs.iter().sum::<f32>() / probs.len() as f32;
        assert!((mean_p - 0.25).abs() < 0.02, "seed {seed}: mean p {mean_p}");
        let a = auc(&probs, &labels);
        assert!((0.78..0.90).contains(&a), "seed {seed}: teacher AUC {a}");
    }
}

#[test]
fn ids_are_skewed_towards_the_head() {
    // Zipf ids: a batch touches far fewer distinct rows than it looks up, and the most popular
    // raw value of a big table is drawn about as often as Zipf's law says.
    let preset = Preset::small();
    let src = SyntheticSource::from_preset(&preset, 4).unwrap();
    let (b, _) = src.batch_at(Split::Train, 0, 2048);
    let t = 2; // C3, capped at 120,000 rows
    let distinct = b.sparse[t]
        .ids
        .iter()
        .collect::<std::collections::HashSet<_>>()
        .len();
    let lookups = b.sparse[t].ids.len();
    assert!(
        distinct * 10 < lookups * 6,
        "{distinct} distinct of {lookups}"
    );
    let mut top = 0;
    for i in 0..20_000 {
        if let Some(v) = src.sample(Split::Train, i).0.cats[t] {
            if src.rank_of(t, v) == 1 {
                top += 1;
            }
        }
    }
    let p1 = ftrec_data::Zipf::new(120_000, preset.zipf_exponent)
        .unwrap()
        .pmf(1)
        * (1.0 - ftrec_data::synth::CAT_MISSING[t]);
    let f1 = top as f64 / 20_000.0;
    assert!((f1 - p1).abs() < 0.01, "rank-1 frequency {f1} vs {p1}");
}

#[test]
fn bad_configurations_are_refused() {
    let good = SynthConfig::from_preset(&Preset::tiny(), 1);
    type Edit = Box<dyn Fn(&mut SynthConfig)>;
    let cases: Vec<Edit> = vec![
        Box::new(|c| c.table_rows.truncate(3)),
        Box::new(|c| c.table_rows[0] = 0),
        Box::new(|c| c.table_rows[0] = (1 << 32) + 1),
        Box::new(|c| {
            c.zipf_exponents.pop();
        }),
        Box::new(|c| c.zipf_exponents[3] = 0.0),
        Box::new(|c| c.zipf_exponents[3] = f64::NAN),
        Box::new(|c| c.base_ctr = 1.0),
        Box::new(|c| c.teacher.first = -1.0),
        Box::new(|c| c.teacher.decay_rank = 0.0),
    ];
    for (i, edit) in cases.iter().enumerate() {
        let mut c = good.clone();
        edit(&mut c);
        assert!(
            matches!(SyntheticSource::new(c), Err(DataError::InvalidConfig(_))),
            "case {i} accepted"
        );
    }
    assert!(matches!(
        tiny(1).next_batch(0),
        Err(DataError::InvalidConfig(_))
    ));
}

#[test]
fn configs_round_trip_through_json() {
    let synth = SynthConfig::from_preset(&Preset::tiny(), 8);
    let back: SynthConfig = serde_json::from_str(&serde_json::to_string(&synth).unwrap()).unwrap();
    assert_eq!(back, synth);
    let mut a = SyntheticSource::new(back).unwrap();
    assert_eq!(a.next_batch(32).unwrap(), tiny(8).next_batch(32).unwrap());

    let tsv = TsvConfig::new(
        DataPath::File("/nonexistent/train.txt".into()),
        Layout::Kaggle,
    );
    let back: TsvConfig = serde_json::from_str(&serde_json::to_string(&tsv).unwrap()).unwrap();
    assert_eq!(back, tsv);
    assert!(matches!(TsvReader::open(back), Err(DataError::Io { .. })));
}
