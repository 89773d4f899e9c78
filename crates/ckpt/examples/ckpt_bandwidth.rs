//! Full-checkpoint write and read bandwidth of the local backend against the raw disk.
//!
//! ```text
//! cargo run --release -p ftrec-ckpt --example ckpt_bandwidth -- \
//!     [--dir PATH] [--mib 1024] [--chunk-mib 4] [--servers 2] [--in-flight 4]
//! ```
//!
//! `--dir` must be on the disk to measure (default: a directory under the system temp dir).

use ftrec_ckpt::bench::{measure_local_bandwidth, BenchConfig};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let mut dir = std::env::temp_dir().join("ftrec-ckpt-bandwidth");
    let mut mib: u64 = 1024;
    let mut cfg_chunk_mib: usize = 4;
    let mut servers: u32 = 2;
    let mut in_flight: usize = 4;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => dir = value()?.into(),
            "--mib" => mib = parse(&flag, &value()?)?,
            "--chunk-mib" => cfg_chunk_mib = parse(&flag, &value()?)?,
            "--servers" => servers = parse(&flag, &value()?)?,
            "--in-flight" => in_flight = parse(&flag, &value()?)?,
            "-h" | "--help" => {
                println!(
                    "ckpt_bandwidth [--dir PATH] [--mib N] [--chunk-mib N] [--servers N] [--in-flight N]"
                );
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    let mut cfg = BenchConfig::new(&dir, mib << 20);
    cfg.servers = servers;
    cfg.snapshot.chunk_bytes = cfg_chunk_mib << 20;
    cfg.snapshot.max_in_flight = in_flight;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let report = rt
        .block_on(measure_local_bandwidth(&cfg))
        .map_err(|e| e.to_string())?;
    println!(
        "model {mib} MiB, {servers} servers, {cfg_chunk_mib} MiB chunks, {in_flight} in flight, dir {}",
        dir.display()
    );
    println!("{report}");
    Ok(())
}

fn parse<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
}
