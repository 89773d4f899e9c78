//! Measure the synthetic stream: click rate, the teacher's AUC on held-out samples, distinct
//! rows per batch, table coverage over time, and how much of the teacher a simple
//! factorization-machine student learns.
//!
//! `cargo run --release -p ftrec-data --example synth_stats -- [preset] [seed] [probe_steps]`
//! `[dense first pairs decay_rank zipf_exponent]` (defaults: kaggle 1 0 and the default teacher scales; set
//! probe_steps, e.g. 1500, to train the student probe on the preset).

use std::collections::HashSet;

use ftrec_core::{Batch, Preset, NUM_DENSE, NUM_SPARSE};
use ftrec_data::{BatchSource, Split, SyntheticSource};

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

fn distinct_rows(b: &Batch) -> usize {
    b.sparse
        .iter()
        .map(|f| f.ids.iter().collect::<HashSet<_>>().len())
        .sum()
}

/// A factorization machine over what a DLRM sees (bucketised dense features, hashed rows):
/// a rough stand-in for how much of the teacher is learnable from a given number of samples.
struct Probe {
    bins: Vec<f32>,
    first: Vec<Vec<f32>>,
    latent: Vec<Vec<f32>>,
    g_bins: Vec<f32>,
    g_first: Vec<Vec<f32>>,
    g_latent: Vec<Vec<f32>>,
    bias: f32,
    g_bias: f32,
}

const K: usize = 4;
const BINS: usize = 48;
const BIN_WIDTH: f32 = 0.4;

impl Probe {
    fn new(table_rows: &[u64]) -> Probe {
        let mut r = ftrec_core::rng::SplitMix::new(3);
        Probe {
            bins: vec![0.0; NUM_DENSE * BINS],
            first: table_rows.iter().map(|&n| vec![0.0; n as usize]).collect(),
            latent: table_rows
                .iter()
                .map(|&n| {
                    (0..n as usize * K)
                        .map(|_| (r.next_f32() - 0.5) * 0.02)
                        .collect()
                })
                .collect(),
            g_bins: vec![1e-6; NUM_DENSE * BINS],
            g_first: table_rows.iter().map(|&n| vec![1e-6; n as usize]).collect(),
            g_latent: table_rows
                .iter()
                .map(|&n| vec![1e-6; n as usize * K])
                .collect(),
            bias: 0.0,
            g_bias: 1e-6,
        }
    }

    fn bin(j: usize, x: f32) -> usize {
        j * BINS + ((x / BIN_WIDTH) as usize).min(BINS - 1)
    }

    fn logit(&self, b: &Batch, i: usize) -> (f32, [f32; K]) {
        let mut z = self.bias;
        for j in 0..NUM_DENSE {
            z += self.bins[Self::bin(j, b.dense[i * NUM_DENSE + j])];
        }
        let (mut sum, mut sq) = ([0f32; K], 0f32);
        for t in 0..NUM_SPARSE {
            for &row in b.sparse[t].bag(i) {
                let r = row as usize;
                z += self.first[t][r];
                let v = &self.latent[t][r * K..r * K + K];
                for k in 0..K {
                    sum[k] += v[k];
                    sq += v[k] * v[k];
                }
            }
        }
        let pair: f32 = 0.5 * (sum.iter().map(|s| s * s).sum::<f32>() - sq);
        (z + pair, sum)
    }

    fn train(&mut self, b: &Batch, lr: f32) {
        for i in 0..b.size {
            let (z, sum) = self.logit(b, i);
            let g = 1.0 / (1.0 + (-z).exp()) - b.labels[i];
            let step = |w: &mut f32, acc: &mut f32, grad: f32| {
                *acc += grad * grad;
                *w -= lr * grad / acc.sqrt();
            };
            step(&mut self.bias, &mut self.g_bias, g);
            for j in 0..NUM_DENSE {
                let k = Self::bin(j, b.dense[i * NUM_DENSE + j]);
                step(&mut self.bins[k], &mut self.g_bins[k], g);
            }
            for t in 0..NUM_SPARSE {
                for &row in b.sparse[t].bag(i) {
                    let r = row as usize;
                    step(&mut self.first[t][r], &mut self.g_first[t][r], g);
                    let vs = &mut self.latent[t][r * K..r * K + K];
                    let gs = &mut self.g_latent[t][r * K..r * K + K];
                    for ((v, acc), s) in vs.iter_mut().zip(gs).zip(&sum) {
                        let grad = g * (s - *v) + 1e-5 * *v;
                        step(v, acc, grad);
                    }
                }
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let preset = Preset::by_name(args.get(1).map_or("kaggle", |s| s.as_str())).expect("preset");
    let seed: u64 = args.get(2).map_or(1, |s| s.parse().expect("seed"));
    let probe_steps: usize = args.get(3).map_or(0, |s| s.parse().expect("probe steps"));
    let mut cfg = ftrec_data::SynthConfig::from_preset(&preset, seed);
    // Optional teacher scales: dense first pairs decay_rank.
    let scale = |i: usize, d: f64| args.get(i).map_or(d, |s| s.parse().expect("scale"));
    cfg.teacher.dense = scale(4, cfg.teacher.dense);
    cfg.teacher.first = scale(5, cfg.teacher.first);
    cfg.teacher.pairs = scale(6, cfg.teacher.pairs);
    cfg.teacher.decay_rank = scale(7, cfg.teacher.decay_rank);
    if let Some(e) = args.get(8) {
        let e: f64 = e.parse().expect("zipf exponent");
        cfg.zipf_exponents = vec![e; cfg.table_rows.len()];
    }
    println!("teacher scales {:?}", cfg.teacher);
    let mut src = SyntheticSource::new(cfg).expect("source");
    println!(
        "preset {} seed {seed}: zipf exponent {}, teacher bias {:.3}",
        preset.name,
        src.config().zipf_exponents[0],
        src.teacher().bias()
    );

    let eval = src.eval_set(65536, 2048).expect("eval");
    let probs = eval.teacher_probs.clone().expect("teacher probabilities");
    let labels: Vec<f32> = eval.batches.iter().flat_map(|b| b.labels.clone()).collect();
    let ctr = labels.iter().sum::<f32>() / labels.len() as f32;
    println!(
        "eval: {} samples, CTR {ctr:.4}, teacher AUC {:.4}",
        labels.len(),
        auc(&probs, &labels)
    );

    // Distinct rows per batch of 2048 (ECRec §2.2 reports ~8,900 over 13 tables of Criteo).
    let batches = 20;
    let mut total = 0usize;
    let mut per_table = vec![0usize; NUM_SPARSE];
    for k in 0..batches {
        let (b, _) = src.batch_at(Split::Train, k * 2048, 2048);
        total += distinct_rows(&b);
        for (t, f) in b.sparse.iter().enumerate() {
            per_table[t] += f.ids.iter().collect::<HashSet<_>>().len();
        }
    }
    println!(
        "distinct rows per batch of 2048: {:.0} of {} lookups (mean over {batches} batches)",
        total as f64 / batches as f64,
        2048 * NUM_SPARSE
    );
    let mut sorted = per_table.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    println!(
        "  13 most-touched tables: {:.0}",
        sorted[..13].iter().sum::<usize>() as f64 / batches as f64
    );
    println!(
        "  per table: {:?}",
        per_table
            .iter()
            .map(|&c| c / batches as usize)
            .collect::<Vec<_>>()
    );

    // Table coverage over a stream (DECK §2.2.1: < 5% of a user table, ~50% of an item table
    // touched in 30 minutes).
    let rows = preset.table_rows.clone();
    let mut touched: Vec<HashSet<u64>> = vec![HashSet::new(); NUM_SPARSE];
    let checkpoints = [100_000u64, 1_000_000, 3_000_000];
    let mut done = 0u64;
    for &upto in &checkpoints {
        while done < upto {
            let (b, _) = src.batch_at(Split::Train, done, 4096);
            for (t, f) in b.sparse.iter().enumerate() {
                touched[t].extend(f.ids.iter().copied());
            }
            done += 4096;
        }
        let big = (0..NUM_SPARSE).max_by_key(|&t| rows[t]).unwrap();
        let mid = (0..NUM_SPARSE)
            .filter(|&t| rows[t] >= 100_000 && rows[t] <= 300_000)
            .max_by_key(|&t| rows[t]);
        let all: usize = touched.iter().map(|s| s.len()).sum();
        print!(
            "after {done} samples: {:.2}% of all rows touched; C{} ({} rows) {:.2}%",
            100.0 * all as f64 / preset.total_rows() as f64,
            big + 1,
            rows[big],
            100.0 * touched[big].len() as f64 / rows[big] as f64
        );
        if let Some(m) = mid {
            print!(
                "; C{} ({} rows) {:.2}%",
                m + 1,
                rows[m],
                100.0 * touched[m].len() as f64 / rows[m] as f64
            );
        }
        println!();
    }

    if probe_steps > 0 {
        let mut probe = Probe::new(&preset.table_rows);
        src.seek(&ftrec_data::Position::Synthetic { sample: 0 })
            .expect("seek");
        for step in 0..probe_steps {
            let b = src.next_batch(2048).expect("batch").expect("endless");
            probe.train(&b, 0.05);
            if (step + 1) % 500 == 0 || step + 1 == probe_steps {
                let scores: Vec<f32> = eval
                    .batches
                    .iter()
                    .flat_map(|b| (0..b.size).map(|i| probe.logit(b, i).0).collect::<Vec<_>>())
                    .collect();
                println!(
                    "probe after {} steps of 2048: AUC {:.4}",
                    step + 1,
                    auc(&scores, &labels)
                );
            }
        }
    }
}
