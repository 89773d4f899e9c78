//! CPR prioritized-save trackers (MFU, SSU, SCAR; cpr.txt §4.2) on one server's shard of the
//! `small` preset.
//!
//! ```text
//! cargo run --release -p ftrec-ckpt --example cpr_priority_bench -- [--steps 200] \
//!     [--save-every 25] [--servers 2] [--r 0.125] [--step-ms 214]
//! ```
//!
//! The shard: every Kaggle table capped at 120,000 rows (the `small` preset) divided over
//! `--servers` servers, dim 16, row-wise Adagrad state; the 7 largest tables are prioritized.
//! Every step applies the rows a 2048-sample batch touches on this server (skewed ids,
//! deduplicated per table, random gradients) and feeds them to each tracker; every `--save-every` steps each
//! tracker selects its rows and marks them saved. All measured in the same run:
//! - the update-path cost per step of each tracker (and of DECK's touched-row `track`, for
//!   reference), against the step's sparse optimizer work and against a whole training step of
//!   `--step-ms` milliseconds (this example runs no MLP; `ftrec bench train --preset small`
//!   measures the step);
//! - the save-side cost (select + mark saved) per save;
//! - memory against the prioritized tables' values;
//! - at the first save, the share of the shard's total squared change since the start that the
//!   selected rows hold (SCAR is the optimum by construction; the paper's claim is that access
//!   frequency is a good proxy for it, §4.2 Fig. 6).

use std::time::Instant;

use ftrec_ckpt::cpr::{Priority, PriorityConfig, PriorityTracker, RowsView, TableSpec};
use ftrec_ckpt::deck::{ConsumerId, Tracker};
use ftrec_core::preset::KAGGLE_TABLE_ROWS;
use ftrec_core::rng::SplitMix;
use ftrec_core::{EmbeddingTable, Optimizer, OptimizerKind, RowLayout, TableId};

const DIM: usize = 16;
const BATCH: usize = 2048;
const LARGEST: usize = 7;

fn arg<T: std::str::FromStr>(args: &[String], flag: &str, default: T) -> T {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{flag} {v:?} is not a valid value"))
        })
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let steps: usize = arg(&args, "--steps", 200);
    let save_every: usize = arg(&args, "--save-every", 25);
    let servers: u64 = arg(&args, "--servers", 2);
    let r: f64 = arg(&args, "--r", 0.125);
    let step_ms: f64 = arg(&args, "--step-ms", 214.0);

    let opt = Optimizer::new(OptimizerKind::RowWiseAdagrad, 0.05);
    let layout = RowLayout::new(DIM, opt.state_words(DIM));
    let rows: Vec<u64> = KAGGLE_TABLE_ROWS
        .iter()
        .map(|&r| (r.min(120_000) / servers).max(1))
        .collect();
    let mut tables: Vec<EmbeddingTable> = rows
        .iter()
        .enumerate()
        .map(|(t, &n)| EmbeddingTable::new_init(TableId(t as u32), n, layout, 1, 0.05))
        .collect();
    let initial: Vec<Vec<f32>> = tables.iter().map(|t| t.as_slice().to_vec()).collect();
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| rows[b].cmp(&rows[a]).then(a.cmp(&b)));
    let specs: Vec<TableSpec> = order[..LARGEST]
        .iter()
        .map(|&t| TableSpec {
            table: TableId(t as u32),
            rows: rows[t],
            dim: DIM,
        })
        .collect();
    let prioritized_values: u64 = specs.iter().map(|s| s.rows * DIM as u64 * 4).sum();
    fn view(t: &EmbeddingTable) -> RowsView<'_> {
        RowsView {
            data: t.as_slice(),
            words: t.layout().words(),
            dim: DIM,
        }
    }
    let kinds = [Priority::Mfu, Priority::Ssu, Priority::Scar];
    let mut trackers: Vec<PriorityTracker> = kinds
        .iter()
        .map(|&priority| {
            let cfg = PriorityConfig {
                priority,
                r,
                ssu_period: 2,
                seed: 1,
            };
            let mut t = PriorityTracker::new(cfg, &specs).unwrap();
            for s in &specs {
                t.reset(s.table, view(&tables[s.table.0 as usize]));
            }
            t
        })
        .collect();
    let mut deck = Tracker::new();
    deck.register(ConsumerId(0)).unwrap();

    let mut rng = SplitMix::new(7);
    let mut grad = vec![0.0f32; DIM];
    let mut work_s = 0.0;
    let mut record_s = [0.0f64; 3];
    let mut track_s = 0.0;
    let mut save_s = [0.0f64; 3];
    let mut saves = 0;
    let mut captured = [0.0f64; 3];
    for step in 1..=steps {
        let mut per_table: Vec<Vec<u64>> = vec![Vec::new(); rows.len()];
        for _ in 0..BATCH {
            for (t, ids) in per_table.iter_mut().enumerate() {
                // Skewed ids (cubing a uniform draw makes small ids hot); only this server's
                // share of the batch lands here.
                let u = rng.next_f64();
                let global = ((u * u * u) * (rows[t] * servers) as f64) as u64;
                if global.is_multiple_of(servers) {
                    ids.push((global / servers).min(rows[t] - 1));
                }
            }
        }
        for (t, mut ids) in per_table.into_iter().enumerate() {
            ids.sort_unstable();
            ids.dedup();
            // Gradients of varying size, so the size of a row's change is not a function of
            // its access count alone.
            let grads: Vec<f32> = (0..ids.len() * DIM)
                .map(|_| (rng.next_f32() - 0.5) * 0.01)
                .collect();
            let a = Instant::now();
            for (j, &i) in ids.iter().enumerate() {
                grad.copy_from_slice(&grads[j * DIM..(j + 1) * DIM]);
                opt.apply(tables[t].row_mut(i), DIM, &grad);
            }
            work_s += a.elapsed().as_secs_f64();
            for (k, tr) in trackers.iter_mut().enumerate() {
                let b = Instant::now();
                tr.record(TableId(t as u32), ids.iter().copied());
                record_s[k] += b.elapsed().as_secs_f64();
            }
            let b = Instant::now();
            deck.track(TableId(t as u32), &ids);
            track_s += b.elapsed().as_secs_f64();
        }
        if step.is_multiple_of(save_every) {
            saves += 1;
            // Total squared change of the prioritized tables since the start (first save only).
            let first = saves == 1;
            let mut total = 0.0f64;
            let mut change: Vec<Vec<f64>> = Vec::new();
            if first {
                for s in &specs {
                    let t = s.table.0 as usize;
                    let w = layout.words();
                    let c: Vec<f64> = (0..rows[t] as usize)
                        .map(|i| {
                            (0..DIM)
                                .map(|d| {
                                    let x = (tables[t].as_slice()[i * w + d]
                                        - initial[t][i * w + d])
                                        as f64;
                                    x * x
                                })
                                .sum()
                        })
                        .collect();
                    total += c.iter().sum::<f64>();
                    change.push(c);
                }
            }
            for (k, tr) in trackers.iter_mut().enumerate() {
                let b = Instant::now();
                let mut got = 0.0;
                for (si, s) in specs.iter().enumerate() {
                    let v = view(&tables[s.table.0 as usize]);
                    let sel = tr.select(s.table, v);
                    if first {
                        got += sel.iter().map(|&i| change[si][i as usize]).sum::<f64>();
                    }
                    tr.saved(s.table, &sel, v);
                }
                save_s[k] += b.elapsed().as_secs_f64();
                if first {
                    captured[k] = got / total.max(f64::MIN_POSITIVE);
                }
            }
        }
    }
    let per_step = |s: f64| s / steps as f64 * 1e3;
    println!(
        "shard: {} rows in {} tables ({} prioritized, {:.1} MiB of their values), r = {r}, \
         {steps} steps, a save every {save_every}",
        rows.iter().sum::<u64>(),
        rows.len(),
        LARGEST,
        prioritized_values as f64 / (1 << 20) as f64
    );
    println!(
        "sparse optimizer work: {:.3} ms/step; DECK track (reference): {:.4} ms/step",
        per_step(work_s),
        per_step(track_s)
    );
    println!(
        "{:<5} {:>12} {:>14} {:>16} {:>12} {:>14} {:>12} {:>16}",
        "rule",
        "record ms",
        "/ sparse work",
        "/ step (ms in)",
        "save ms",
        "memory MiB",
        "/ values",
        "change captured"
    );
    for (k, p) in kinds.iter().enumerate() {
        let rec = per_step(record_s[k]);
        let mem = trackers[k].memory_bytes() as f64;
        println!(
            "{:<5} {:>12.4} {:>13.2}% {:>15.3}% {:>12.3} {:>14.2} {:>11.1}% {:>15.1}%",
            p.name(),
            rec,
            100.0 * rec / per_step(work_s),
            100.0 * rec / step_ms,
            save_s[k] / saves.max(1) as f64 * 1e3,
            mem / (1 << 20) as f64,
            100.0 * mem / prioritized_values as f64,
            100.0 * captured[k],
        );
    }
}
