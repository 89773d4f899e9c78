//! Throughput of the synthetic generator, the TSV writer and the TSV reader.
//!
//! `cargo run --release -p ftrec-data --example throughput -- [preset] [samples]`
//! (defaults: small 500000).

use std::time::Instant;

use ftrec_core::Preset;
use ftrec_data::{
    synth_to_dir, BatchSource, DataPath, Layout, SyntheticSource, TsvConfig, TsvReader,
};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let preset = Preset::by_name(args.get(1).map_or("small", |s| s.as_str())).expect("preset");
    let samples: u64 = args.get(2).map_or(500_000, |s| s.parse().expect("samples"));
    let batch = 2048;

    let mut src = SyntheticSource::from_preset(&preset, 1).expect("source");
    let t = Instant::now();
    let mut n = 0u64;
    while n < samples {
        n += src.next_batch(batch).expect("batch").expect("endless").size as u64;
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "generate: {n} samples in {secs:.2}s = {:.0} samples/s ({:.1} ms per batch of {batch})",
        n as f64 / secs,
        1e3 * secs * batch as f64 / n as f64
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let t = Instant::now();
    let path = synth_to_dir(&preset, 1, samples, dir.path()).expect("write");
    let secs = t.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(&path).expect("metadata").len();
    println!(
        "write TSV: {samples} lines, {:.1} MB in {secs:.2}s = {:.0} lines/s",
        bytes as f64 / 1e6,
        samples as f64 / secs
    );

    let mut cfg = TsvConfig::new(DataPath::File(path), Layout::Kaggle);
    cfg.table_rows = preset.table_rows.clone();
    let mut reader = TsvReader::open(cfg).expect("reader");
    let t = Instant::now();
    let mut n = 0u64;
    while let Some(b) = reader.next_batch(batch).expect("batch") {
        n += b.size as u64;
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "read TSV: {n} training lines in {secs:.2}s = {:.0} lines/s, {:.0} MB/s",
        n as f64 / secs,
        bytes as f64 / 1e6 / secs
    );
}
