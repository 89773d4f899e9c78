//! `ftrec bench metrics`: what the process metrics cost training. Two measurements:
//! - the updates themselves, timed in this process: what the coordinator records per step
//!   (samples per batch, the step counter, gauges, the step-time histogram) and a worker per
//!   batch, against the step time of the runs below; and the encoding of one scrape;
//! - paired runs of the same job (`ftrec run`, interleaved, order alternating), one with its
//!   endpoint open and scraped every `--scrape-ms`, one without: the ratio of their training
//!   times, mean and 95% interval.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::timeline::mean_ci95;

#[derive(Args, Debug, Clone)]
pub struct MetricsBenchArgs {
    #[arg(long, default_value = "small")]
    pub preset: String,
    #[arg(long, default_value_t = 2)]
    pub servers: u32,
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    #[arg(long, default_value_t = 100)]
    pub steps: u64,
    /// Pairs of runs (with and without the endpoint), interleaved.
    #[arg(long, default_value_t = 3)]
    pub pairs: usize,
    /// How often the endpoint is scraped during a run with it, in milliseconds (Prometheus
    /// scrapes every 15 s by default; this is far more often).
    #[arg(long, default_value_t = 1000)]
    pub scrape_ms: u64,
    /// Timed iterations of the in-process update measurement.
    #[arg(long, default_value_t = 1_000_000)]
    pub iters: u64,
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct MetricsBench {
    preset: String,
    servers: u32,
    workers: u32,
    steps: u64,
    /// Coordinator's updates per step (one per batch and one per step), in microseconds.
    coordinator_update_us_per_step: f64,
    /// A worker's updates per batch, in microseconds.
    worker_update_us_per_batch: f64,
    /// Encoding one scrape of a coordinator's registry, in microseconds.
    scrape_encode_us: f64,
    /// Mean step time of the runs without the endpoint, in milliseconds.
    step_ms: f64,
    /// The coordinator's per-step updates as a share of the step time.
    update_share_of_step: f64,
    /// Training time with the endpoint scraped over without, per pair.
    ratios: Vec<f64>,
    ratio_mean: f64,
    ratio_ci95: Option<f64>,
    scrapes: u64,
}

pub fn run(a: MetricsBenchArgs) -> Result<()> {
    if a.pairs == 0 || a.steps == 0 || a.iters == 0 {
        bail!("--pairs, --steps and --iters must be at least 1");
    }
    if a.scrape_ms == 0 {
        bail!("--scrape-ms must be at least 1");
    }
    ftrec_core::Preset::by_name(&a.preset)?;
    let (coord_us, worker_us, encode_us) = time_updates(a.workers, a.iters);
    let exe = std::env::current_exe().context("finding the ftrec executable")?;
    let dir = std::env::temp_dir().join(format!("ftrec-bench-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let r = pairs(&a, &exe, &dir, (coord_us, worker_us, encode_us));
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// The paired runs, then the report.
fn pairs(a: &MetricsBenchArgs, exe: &Path, dir: &Path, updates: (f64, f64, f64)) -> Result<()> {
    let (coord_us, worker_us, encode_us) = updates;
    let mut ratios = Vec::new();
    let mut step_ms = Vec::new();
    let mut scrapes = 0;
    for pair in 0..a.pairs {
        let mut times = [0.0; 2];
        // Alternate which run goes first.
        let order = if pair % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with in order {
            let json = dir.join(format!("p{pair}-{with}.json"));
            let (train_s, n) = one_run(exe, a, with, &json)?;
            scrapes += n;
            times[usize::from(with)] = train_s;
            eprintln!(
                "pair {}: {} endpoint: {train_s:.2}s training",
                pair + 1,
                if with { "with" } else { "without" }
            );
        }
        ratios.push(times[1] / times[0]);
        step_ms.push(times[0] * 1e3 / a.steps as f64);
    }
    let (ratio_mean, ratio_ci95) = mean_ci95(&ratios).unwrap_or((f64::NAN, None));
    let step_ms = step_ms.iter().sum::<f64>() / step_ms.len() as f64;
    let b = MetricsBench {
        preset: a.preset.clone(),
        servers: a.servers,
        workers: a.workers,
        steps: a.steps,
        coordinator_update_us_per_step: coord_us,
        worker_update_us_per_batch: worker_us,
        scrape_encode_us: encode_us,
        step_ms,
        update_share_of_step: coord_us * 1e-3 / step_ms,
        ratios,
        ratio_mean,
        ratio_ci95,
        scrapes,
    };
    println!(
        "metric updates: coordinator {:.3} us/step, worker {:.3} us/batch ({:.5}% of a {:.1} ms \
         step); one scrape encoded in {:.0} us\n\
         training time with the endpoint scraped every {} ms over without: {:.3}{} ({} pairs, \
         {} scrapes)",
        b.coordinator_update_us_per_step,
        b.worker_update_us_per_batch,
        b.update_share_of_step * 100.0,
        b.step_ms,
        b.scrape_encode_us,
        a.scrape_ms,
        b.ratio_mean,
        b.ratio_ci95
            .map_or(String::new(), |c| format!(" +/- {c:.3}")),
        a.pairs,
        b.scrapes
    );
    if let Some(p) = &a.json {
        crate::write_json(p, &b)?;
    }
    Ok(())
}

/// Microseconds per step of the coordinator's updates (with `workers` batches a step), per
/// batch of a worker's, and per scrape encoding.
fn time_updates(workers: u32, iters: u64) -> (f64, f64, f64) {
    let m = ftrec_obs::metrics();
    let t = Instant::now();
    for i in 0..iters {
        for _ in 0..workers {
            m.samples.inc_by(128);
        }
        m.steps.inc();
        m.step.set(i as i64);
        m.step_seconds.observe(0.05);
        if i % 20 == 0 {
            m.samples_per_second.set(1e4);
        }
    }
    let coord = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let t = Instant::now();
    for _ in 0..iters {
        m.worker_batches.inc();
        m.worker_batch_seconds.observe(0.05);
        m.ecrec_txn_seconds.observe(0.002);
    }
    let worker = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let n = 1000;
    let t = Instant::now();
    let mut len = 0;
    for _ in 0..n {
        len += m.encode().len();
    }
    let encode = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    std::hint::black_box(len);
    (coord, worker, encode)
}

/// One `ftrec run` of the job, with its endpoint scraped or without one: its training
/// seconds and the scrapes that answered.
fn one_run(exe: &Path, a: &MetricsBenchArgs, with: bool, json: &Path) -> Result<(f64, u64)> {
    let mut cmd = Command::new(exe);
    cmd.args(["run", "--preset", &a.preset, "--eval-samples", "0"])
        .args(["--servers", &a.servers.to_string()])
        .args(["--workers", &a.workers.to_string()])
        .args(["--steps", &a.steps.to_string()])
        .arg("--json")
        .arg(json)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let port = if with {
        let p = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        cmd.args(["--metrics-listen", &p.to_string()]);
        Some(p)
    } else {
        None
    };
    let mut child = cmd.spawn().context("starting ftrec run")?;
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = port.map(|addr| {
        let stop = Arc::clone(&stop);
        let every = Duration::from_millis(a.scrape_ms);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                if scrape(addr) {
                    n += 1;
                }
                std::thread::sleep(every);
            }
            n
        })
    });
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err)?;
    }
    let status = child.wait()?;
    stop.store(true, Ordering::SeqCst);
    let scrapes = scraper.map_or(0, |h| h.join().unwrap_or(0));
    if !status.success() {
        bail!("ftrec run failed: {}", err.trim());
    }
    let rep: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(json)?)?;
    let train_s = rep["train_s"]
        .as_f64()
        .context("the run's report has no train_s")?;
    Ok((train_s, scrapes))
}

/// One GET of /metrics; whether it answered with a body.
fn scrape(addr: SocketAddr) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET /metrics HTTP/1.1\r\nhost: b\r\nconnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut out = Vec::new();
    s.read_to_end(&mut out).is_ok() && out.starts_with(b"HTTP/1.1 200")
}
