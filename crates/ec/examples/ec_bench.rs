//! Throughput of the codes and the load-balance figures of ECRec §5.2.
//!
//! `cargo run --release -p ftrec-ec --example ec_bench [-- --quick]`
//!
//! Prints, per code: difference-propagation throughput (parity bytes updated per second) for
//! several row sizes, encode and decode throughput (data bytes per second), the sum code's
//! drift after a long momentum run, and the per-server update load with and without coding
//! on a Zipf trace over the `small` preset's tables (the paper: 2.28x without coding, 1.64x
//! with k = 2, 1.58x with k = 4 on Criteo).

use std::hint::black_box;
use std::time::{Duration, Instant};

use ftrec_core::{Optimizer, OptimizerKind, Preset};
use ftrec_ec::{measure_drift, update_load, Code, CodeKind, DriftConfig, StripeLayout, ZipfTrace};

/// Run `f` (which processes `bytes` bytes) until `budget` has passed; GB/s.
fn rate(budget: Duration, bytes: usize, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut rounds = 0u64;
    while start.elapsed() < budget {
        f();
        rounds += 1;
    }
    (rounds as f64 * bytes as f64) / start.elapsed().as_secs_f64() / 1e9
}

fn pattern(words: usize, salt: u32) -> Vec<f32> {
    (0..words)
        .map(|i| (i % 97) as f32 * 0.01 + (salt % 1000) as f32)
        .collect()
}

fn main() -> Result<(), ftrec_ec::EcError> {
    let quick = std::env::args().any(|a| a == "--quick");
    let budget = Duration::from_millis(if quick { 100 } else { 600 });
    // A working set well past the last-level cache, as a server's parity table is.
    let total_bytes: usize = if quick { 8 << 20 } else { 64 << 20 };

    println!("== difference propagation: parity ^= c * delta (gf256), parity += delta (sum)");
    for (label, working_set) in [
        ("cache-resident", 256usize << 10),
        ("in memory", total_bytes),
    ] {
        println!("-- parity rows: {label}, {} KiB", working_set >> 10);
        println!(
            "{:>10} {:>14} {:>14} {:>14}",
            "row bytes", "gf256 c=1", "gf256 c!=1", "sum"
        );
        for row_bytes in [64usize, 128, 1024, 4096, 64 << 10, 1 << 20] {
            if row_bytes > working_set {
                continue;
            }
            let words = row_bytes / 4;
            let rows = (working_set / row_bytes).max(1);
            let delta = pattern(words, 7);
            let mut parity = vec![0.0f32; rows * words];
            let gf = Code::new(CodeKind::Gf256, 4, 2)?;
            let sum = Code::new(CodeKind::Sum, 4, 1)?;
            let mut run = |code: &Code, position: usize, j: usize| {
                rate(budget, rows * row_bytes, || {
                    for p in parity.chunks_exact_mut(words) {
                        code.apply_delta(position, j, &delta, p).unwrap();
                    }
                    black_box(&parity);
                })
            };
            // Position 0 / parity 0 have coefficient 1 (XOR); position 1, parity 1 does not.
            let xor = run(&gf, 0, 0);
            let mul = run(&gf, 1, 1);
            let add = run(&sum, 0, 0);
            println!("{row_bytes:>10} {xor:>9.2} GB/s {mul:>9.2} GB/s {add:>9.2} GB/s");
        }
    }

    println!("\n== encode / decode (data bytes per second), rows of 4 KiB");
    let words = 1024;
    for (kind, k, r) in [
        (CodeKind::Sum, 4, 1),
        (CodeKind::Gf256, 4, 1),
        (CodeKind::Gf256, 4, 2),
        (CodeKind::Gf256, 8, 3),
    ] {
        let code = Code::new(kind, k, r)?;
        let stripes = (total_bytes / (k * words * 4)).max(1);
        let data: Vec<Vec<f32>> = (0..stripes * k).map(|i| pattern(words, i as u32)).collect();
        let mut parity: Vec<Vec<f32>> = vec![vec![0.0; words]; stripes * r];
        let enc = rate(budget, stripes * k * words * 4, || {
            for (s, out) in parity.chunks_mut(r).enumerate() {
                let ins: Vec<&[f32]> = data[s * k..(s + 1) * k]
                    .iter()
                    .map(|v| v.as_slice())
                    .collect();
                let mut outs: Vec<&mut [f32]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
                code.encode(&ins, &mut outs).unwrap();
            }
            black_box(&parity);
        });
        // Lose the first r data rows of every stripe; rebuild them from the others.
        let wanted: Vec<usize> = (0..r).collect();
        let available: Vec<usize> = (r..k + r).collect();
        let dec = code.decoder(&available, &wanted)?;
        let mut outs: Vec<Vec<f32>> = vec![vec![0.0; words]; r];
        let decode = rate(budget, stripes * k * words * 4, || {
            for s in 0..stripes {
                let ins: Vec<&[f32]> = dec
                    .reads()
                    .iter()
                    .map(|&p| {
                        if p < k {
                            data[s * k + p].as_slice()
                        } else {
                            parity[s * r + p - k].as_slice()
                        }
                    })
                    .collect();
                let mut o: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                dec.decode(&ins, &mut o).unwrap();
            }
            black_box(&outs);
        });
        println!("{kind:>6} k={k} r={r}: encode {enc:6.2} GB/s, decode {r} lost {decode:6.2} GB/s");
    }

    println!("\n== sum-code drift (momentum, k = 4, dim 16)");
    let updates = if quick { 100_000 } else { 1_000_000 };
    let optimizer = Optimizer::new(OptimizerKind::Momentum, 0.05);
    let rep = measure_drift(&DriftConfig {
        k: 4,
        dim: 16,
        optimizer,
        updates,
        seed: 1,
        init_scale: 0.05,
        grad_scale: 0.1,
        check_every: updates / 10,
    })?;
    println!(
        "{updates} updates: rows up to |{:.3}|; max |recovered - true| = {:.3e} (worst-case bound {:.3e}); \
         fresh-parity decode error {:.3e}; vs row decoded from a fresh parity {:.3e}; |propagated - fresh parity| = {:.3e}; {} of {} parity words differ in bits",
        rep.last.row_magnitude,
        rep.max_recovered_vs_true,
        rep.last.bound,
        rep.last.fresh_recovered_vs_true,
        rep.last.recovered_vs_fresh_recovered,
        rep.max_parity_vs_fresh,
        rep.last.parity_words_differing,
        16 + optimizer.state_words(16)
    );

    println!("\n== per-server update load (ECRec §5.2), preset small, Zipf, 5 servers");
    let preset = Preset::small();
    let steps = if quick { 5 } else { 30 };
    let trace = ZipfTrace::new(&preset.table_rows, preset.zipf_exponent, preset.batch, 7)?;
    for k in [2usize, 4] {
        let layout = StripeLayout::new(5, k, 1, &preset.table_rows)?;
        let load = update_load(&layout, trace.steps(steps))?;
        println!(
            "k = {k}: parity rows per server {:?} (prefix bound {})",
            layout.parity_counts(),
            layout.prefix_imbalance()
        );
        println!(
            "k = {k}: max/min without coding {:.2}x, with coding {:.2}x (data {:?}, parity {:?})",
            load.uncoded_imbalance(),
            load.coded_imbalance(),
            load.data_updates,
            load.parity_updates
        );
    }
    Ok(())
}
