//! The two studies of `ftrec bench cpr` beside Figure 7:
//! - `--sensitivity 0.02,0.1,0.2`: CPR §6.3 (Figure 9), CPR-vanilla and CPR-SSU at each target
//!   PLS, their checkpoint-related overhead (asynchronous) and paired AUC drop (synchronous),
//!   each target measured as Figure 7's experiment measures one;
//! - `--pls-sweep N`: CPR §6.5 (Figure 11), N synchronous CPR-vanilla runs with 1–32 failures,
//!   each clearing 1 to half of the servers, at an interval drawn so the expected PLS falls in
//!   0–1, each paired with the failure-free run: the Pearson correlation of PLS with the AUC
//!   drop (and its 95% interval, Fisher's z), the least-squares line, a table and a plot;
//!   `--sweep-ssu` runs CPR-SSU on the same failures and intervals too (Figure 12's slopes).
//!
//! Both are seeded by `--kill-seed`; every run's figures are its own (no selection).

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use ftrec_core::rng::SplitMix;
use serde::{Deserialize, Serialize};

use crate::bench_cpr::{
    auc_drop, base_of, bench, check_target_pls, configure, failure_free, opt, placement, run_one,
    CprBench, CprBenchArgs, Failure, Intervals,
};

/// The failures of one sweep run: at most this many (CPR §6.5: "1–32 random failures").
const SWEEP_MAX_FAILURES: u64 = 32;

#[derive(Serialize, Deserialize)]
struct SensitivityRow {
    target_pls: f64,
    variant: String,
    /// Saves every this many steps in the synchronous runs (Eq. 4 at this target).
    every_steps: u64,
    overhead_s: f64,
    overhead_ci95_s: f64,
    overhead_share: f64,
    pls: Option<f64>,
    pls_saved: Option<f64>,
    auc_drop_mean: Option<f64>,
    auc_drop_ci95: Option<f64>,
}

#[derive(Serialize)]
struct Sensitivity {
    sensitivity: Vec<SensitivityRow>,
    runs: Vec<CprBench>,
}

/// CPR §6.3: CPR-vanilla and CPR-SSU at each target PLS of `--sensitivity`.
pub(crate) fn sensitivity(args: &CprBenchArgs, json: Option<&Path>) -> Result<()> {
    for &t in &args.sensitivity {
        check_target_pls(t, "--sensitivity")?;
    }
    base_of(args)?;
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for &t in &args.sensitivity {
        eprintln!("target PLS {t}");
        let b = bench(args, t, &["cpr", "cpr-ssu"])?;
        for v in &b.variants {
            rows.push(SensitivityRow {
                target_pls: t,
                variant: v.name.clone(),
                every_steps: b.cpr_every_steps,
                overhead_s: v.overhead_s,
                overhead_ci95_s: v.overhead_ci95_s,
                overhead_share: v.overhead_share,
                pls: v.pls,
                pls_saved: v.pls_saved,
                auc_drop_mean: v.auc_drop_mean,
                auc_drop_ci95: v.auc_drop_ci95,
            });
        }
        runs.push(b);
    }
    println!(
        "{:>10} {:<9} {:>7} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "target PLS",
        "variant",
        "every",
        "overhead s",
        "share",
        "PLS",
        "PLS saved",
        "AUC drop",
        "±95%"
    );
    for r in &rows {
        println!(
            "{:>10} {:<9} {:>7} {:>10.3} {:>7.2}% {:>8} {:>9} {:>9} {:>9}",
            r.target_pls,
            r.variant,
            r.every_steps,
            r.overhead_s,
            r.overhead_share * 100.0,
            opt(r.pls, 4),
            opt(r.pls_saved, 4),
            opt(r.auc_drop_mean, 5),
            opt(r.auc_drop_ci95, 5)
        );
    }
    draw_sensitivity(&rows, &plot_dir(args)?)?;
    if let Some(path) = json {
        crate::write_json(
            path,
            &Sensitivity {
                sensitivity: rows,
                runs,
            },
        )?;
    }
    Ok(())
}

#[derive(Serialize)]
struct SweepRun {
    failures: Vec<Failure>,
    /// Servers each failure took, and their share of the tables.
    fail_servers: u32,
    failed_share: f64,
    /// The expected PLS the interval was drawn for, and the interval.
    expected_pls: f64,
    every_steps: u64,
    /// PLS as Eq. 3 counts it, and counting what was saved.
    pls: Option<f64>,
    pls_saved: Option<f64>,
    auc: Option<f64>,
    /// Failure-free AUC minus this run's.
    auc_drop: Option<f64>,
    /// CPR-SSU on the same failures and interval (`--sweep-ssu`).
    ssu: Option<SweepOutcome>,
}

#[derive(Serialize)]
struct SweepOutcome {
    pls: Option<f64>,
    pls_saved: Option<f64>,
    auc: Option<f64>,
    auc_drop: Option<f64>,
}

impl SweepOutcome {
    fn of(r: &ftrec_cluster::RunReport, failure_free_auc: Option<f64>) -> SweepOutcome {
        SweepOutcome {
            pls: r.cpr.as_ref().map(|c| c.pls.total),
            pls_saved: r.cpr.as_ref().and_then(|c| c.pls.saved_total),
            auc: r.auc,
            auc_drop: auc_drop(failure_free_auc, r.auc),
        }
    }
}

#[derive(Serialize, Clone, Copy)]
pub(crate) struct Correlation {
    pub(crate) n: usize,
    pub(crate) pearson: f64,
    /// 95% interval of the correlation (Fisher's z); absent below four points.
    pub(crate) ci95: Option<(f64, f64)>,
    /// Least squares: AUC drop = slope * PLS + intercept.
    pub(crate) slope: f64,
    pub(crate) intercept: f64,
}

#[derive(Serialize)]
struct Sweep {
    preset: String,
    servers: u32,
    workers: u32,
    steps: u64,
    failure_free_auc: Option<f64>,
    correlation: Option<Correlation>,
    /// CPR-SSU's, with `--sweep-ssu`.
    correlation_ssu: Option<Correlation>,
    runs: Vec<SweepRun>,
}

/// Pearson's r of `(x, y)`, its 95% interval and the least-squares line; `None` below three
/// points or when either variable is constant.
pub(crate) fn correlation(points: &[(f64, f64)]) -> Option<Correlation> {
    let n = points.len();
    if n < 3 {
        return None;
    }
    let nf = n as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / nf;
    let my = points.iter().map(|p| p.1).sum::<f64>() / nf;
    let (mut sxx, mut syy, mut sxy) = (0.0, 0.0, 0.0);
    for &(x, y) in points {
        sxx += (x - mx) * (x - mx);
        syy += (y - my) * (y - my);
        sxy += (x - mx) * (y - my);
    }
    if sxx <= 0.0 || syy <= 0.0 {
        return None;
    }
    let r = (sxy / (sxx * syy).sqrt()).clamp(-1.0, 1.0);
    let ci95 = (n > 3).then(|| {
        let z = r.clamp(-0.999_999, 0.999_999).atanh();
        let se = 1.0 / (nf - 3.0).sqrt();
        ((z - 1.96 * se).tanh(), (z + 1.96 * se).tanh())
    });
    let slope = sxy / sxx;
    Some(Correlation {
        n,
        pearson: r,
        ci95,
        slope,
        intercept: my - slope * mx,
    })
}

/// The interval, in steps, at which `failures` failures of `share` of the tables each give an
/// expected Eq. 3 PLS of `pls`: each loses on average half an interval of updates to that
/// share, so `pls = failures * share * (every / 2) / steps`. Clamped to the run.
fn interval_for(pls: f64, failures: u64, share: f64, steps: u64) -> u64 {
    let every = 2.0 * pls * steps as f64 / (failures as f64 * share).max(1e-9);
    (every.round() as u64).clamp(1, steps)
}

fn plot_dir(args: &CprBenchArgs) -> Result<PathBuf> {
    let dir = args.plot_dir.clone().unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&dir)
        .map_err(|e| anyhow::anyhow!("--plot-dir {}: {e}", dir.display()))?;
    Ok(dir)
}

/// CPR §6.5: `n` synchronous CPR-vanilla runs with random failures and intervals.
pub(crate) fn pls_sweep(args: &CprBenchArgs, n: usize, json: Option<&Path>) -> Result<()> {
    if n < 3 {
        bail!("--pls-sweep {n}: a correlation needs at least 3 runs");
    }
    let (base, cfg) = base_of(args)?;
    let (steps, servers) = (cfg.steps, cfg.servers);
    if servers < 2 {
        bail!(
            "--pls-sweep needs at least 2 servers (each failure takes 1 to half of them): \
             raise --servers"
        );
    }
    let dir = plot_dir(args)?;
    let mut sync = base.clone();
    sync.sync = true;
    let per_run = if args.sweep_ssu { 2 } else { 1 };
    let mut progress = crate::progress::Runs::new("bench cpr --pls-sweep", per_run * n + 1);
    let ff = failure_free(&sync, "sync-failure-free", &mut progress)?;
    let mut rng = SplitMix::keyed(args.kill_seed, 0x706c_7377, 0);
    let max_failures = SWEEP_MAX_FAILURES.min(steps - 1);
    let mut runs = Vec::with_capacity(n);
    for i in 0..n {
        let failures = 1 + rng.next_u64() % max_failures;
        let k = 1 + (rng.next_u64() % (servers / 2) as u64) as u32;
        let share = k as f64 / servers as f64;
        let expected_pls = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let every = interval_for(expected_pls, failures, share, steps);
        let kills = placement(
            args.kill_seed.wrapping_add(1000 + i as u64),
            failures as usize,
            k,
            servers,
            steps,
        );
        let iv = Intervals {
            cpr_time: None,
            cpr_steps: every,
            full_steps: 0,
        };
        let r = run_one(
            &sync,
            &format!("sweep-{i}"),
            |a| configure(a, "cpr", &iv, &kills),
            &mut progress,
        )?;
        let ssu = if args.sweep_ssu {
            let r = run_one(
                &sync,
                &format!("sweep-{i}-ssu"),
                |a| configure(a, "cpr-ssu", &iv, &kills),
                &mut progress,
            )?;
            Some(SweepOutcome::of(&r, ff.auc))
        } else {
            None
        };
        let v = SweepOutcome::of(&r, ff.auc);
        runs.push(SweepRun {
            failures: kills,
            fail_servers: k,
            failed_share: share,
            expected_pls,
            every_steps: every,
            pls: v.pls,
            pls_saved: v.pls_saved,
            auc: v.auc,
            auc_drop: v.auc_drop,
            ssu,
        });
    }
    let points: Vec<(f64, f64)> = runs
        .iter()
        .filter_map(|r| Some((r.pls?, r.auc_drop?)))
        .collect();
    let ssu_points: Vec<(f64, f64)> = runs
        .iter()
        .filter_map(|r| r.ssu.as_ref().and_then(|s| Some((s.pls?, s.auc_drop?))))
        .collect();
    let corr = correlation(&points);
    let corr_ssu = correlation(&ssu_points);
    println!(
        "{:>4} {:>8} {:>7} {:>9} {:>7} {:>8} {:>9} {:>8} {:>9}",
        "run", "failures", "share", "exp. PLS", "every", "PLS", "AUC drop", "SSU PLS", "SSU drop"
    );
    for (i, r) in runs.iter().enumerate() {
        println!(
            "{:>4} {:>8} {:>6.1}% {:>9.3} {:>7} {:>8} {:>9} {:>8} {:>9}",
            i,
            r.failures.len(),
            r.failed_share * 100.0,
            r.expected_pls,
            r.every_steps,
            opt(r.pls, 4),
            opt(r.auc_drop, 5),
            opt(r.ssu.as_ref().and_then(|s| s.pls), 4),
            opt(r.ssu.as_ref().and_then(|s| s.auc_drop), 5)
        );
    }
    for (name, c) in [("cpr", corr), ("cpr-ssu", corr_ssu)] {
        match c {
            Some(c) => println!(
                "{name}: PLS vs AUC drop over {} runs: Pearson r = {:.3}{}; AUC drop = {:.5} * \
                 PLS {:+.5}",
                c.n,
                c.pearson,
                c.ci95.map_or(String::new(), |(lo, hi)| format!(
                    " (95% [{lo:.2}, {hi:.2}])"
                )),
                c.slope,
                c.intercept
            ),
            None if name == "cpr" => {
                println!(
                    "{name}: PLS vs AUC drop: no correlation (fewer than 3 points or no spread)"
                )
            }
            None => {}
        }
    }
    draw_sweep(
        (&points, corr),
        args.sweep_ssu.then_some((&ssu_points[..], corr_ssu)),
        &dir,
    )?;
    if let Some(path) = json {
        crate::write_json(
            path,
            &Sweep {
                preset: cfg.preset.name.clone(),
                servers,
                workers: cfg.workers,
                steps,
                failure_free_auc: ff.auc,
                correlation: corr,
                correlation_ssu: corr_ssu,
                runs,
            },
        )?;
    }
    Ok(())
}

/// Figure 9's plot of the sensitivity rows, into `dir`.
fn draw_sensitivity(rows: &[SensitivityRow], dir: &Path) -> Result<()> {
    let points: Vec<crate::plot::SensitivityPoint> = rows
        .iter()
        .map(|r| crate::plot::SensitivityPoint {
            variant: r.variant.clone(),
            target_pls: r.target_pls,
            overhead_share: r.overhead_share,
            auc_drop: r.auc_drop_mean,
            auc_drop_ci95: r.auc_drop_ci95,
        })
        .collect();
    crate::plot::draw_cpr_sensitivity(&points, dir)?;
    println!("plot: {}", dir.join("cpr-sensitivity.png").display());
    Ok(())
}

/// One variant's `(PLS, AUC drop)` points and their [`correlation`].
type Scatter<'a> = (&'a [(f64, f64)], Option<Correlation>);

/// Figures 11 and 12's scatter with each variant's least-squares line, into `dir`; CPR-SSU's
/// series when given.
fn draw_sweep(vanilla: Scatter<'_>, ssu: Option<Scatter<'_>>, dir: &Path) -> Result<()> {
    let mut series = vec![crate::plot::SweepSeries {
        name: "CPR-vanilla",
        points: vanilla.0,
        fit: vanilla.1,
    }];
    if let Some((points, fit)) = ssu {
        series.push(crate::plot::SweepSeries {
            name: "CPR-SSU",
            points,
            fit,
        });
    }
    crate::plot::draw_pls_sweep(&series, dir)?;
    println!("plot: {}", dir.join("cpr-pls-auc.png").display());
    Ok(())
}

/// What `--replot` reads of a `--pls-sweep` JSON.
#[derive(Deserialize)]
struct SavedSweep {
    runs: Vec<SavedOutcome>,
}

#[derive(Deserialize)]
struct SavedOutcome {
    pls: Option<f64>,
    auc_drop: Option<f64>,
    #[serde(default)]
    ssu: Option<Box<SavedOutcome>>,
}

/// `--replot`: the plots of an earlier `--sensitivity` or `--pls-sweep` run, from its `--json`
/// file, into `--plot-dir`; nothing is run.
pub(crate) fn replot(args: &CprBenchArgs, path: &Path) -> Result<()> {
    replot_into(path, &plot_dir(args)?)
}

fn replot_into(path: &Path, dir: &Path) -> Result<()> {
    let what = || format!("--replot {}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", what()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: not JSON: {e}", what()))?;
    let unreadable = |e: serde_json::Error| {
        anyhow::anyhow!("{}: not the JSON of a bench cpr study: {e}", what())
    };
    if v.get("sensitivity").is_some() {
        #[derive(Deserialize)]
        struct Saved {
            sensitivity: Vec<SensitivityRow>,
        }
        let saved: Saved = serde_json::from_value(v).map_err(unreadable)?;
        return draw_sensitivity(&saved.sensitivity, dir);
    }
    if v.get("correlation").is_none() || v.get("runs").is_none() {
        bail!(
            "{}: neither the JSON of `bench cpr --sensitivity` nor of `--pls-sweep` (write one \
             with --json)",
            what()
        );
    }
    let saved: SavedSweep = serde_json::from_value(v).map_err(unreadable)?;
    let points: Vec<(f64, f64)> = saved
        .runs
        .iter()
        .filter_map(|r| Some((r.pls?, r.auc_drop?)))
        .collect();
    let ssu: Vec<(f64, f64)> = saved
        .runs
        .iter()
        .filter_map(|r| r.ssu.as_ref().and_then(|s| Some((s.pls?, s.auc_drop?))))
        .collect();
    draw_sweep(
        (&points, correlation(&points)),
        (!ssu.is_empty()).then(|| (&ssu[..], correlation(&ssu))),
        dir,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn correlation_of_a_line_is_one_and_its_fit_is_the_line() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 0.5 * i as f64 - 1.0)).collect();
        let c = correlation(&pts).unwrap();
        assert!((c.pearson - 1.0).abs() < 1e-12);
        assert!((c.slope - 0.5).abs() < 1e-12 && (c.intercept + 1.0).abs() < 1e-12);
        let neg: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, -p.1)).collect();
        assert!((correlation(&neg).unwrap().pearson + 1.0).abs() < 1e-12);
        // Hand value: x = 1..4, y = 1, 3, 2, 4: r = 0.8, interval from Fisher's z with n = 4.
        let c = correlation(&[(1.0, 1.0), (2.0, 3.0), (3.0, 2.0), (4.0, 4.0)]).unwrap();
        assert!((c.pearson - 0.8).abs() < 1e-12);
        let (lo, hi) = c.ci95.unwrap();
        let z = 0.8f64.atanh();
        assert!((lo - (z - 1.96).tanh()).abs() < 1e-12 && (hi - (z + 1.96).tanh()).abs() < 1e-12);
        assert!(lo < 0.8 && 0.8 < hi);
        assert!(correlation(&[(1.0, 1.0), (2.0, 1.0), (3.0, 1.0)]).is_none());
        assert!(correlation(&[(1.0, 1.0), (2.0, 2.0)]).is_none());
    }

    #[test]
    fn the_interval_gives_the_expected_pls_it_was_drawn_for() {
        // 2 failures of a quarter of the tables, PLS 0.1 over 1,000 steps: each loses half an
        // interval of a quarter, 2 * 0.25 * (every / 2) / 1000 = 0.1, every = 400.
        assert_eq!(interval_for(0.1, 2, 0.25, 1000), 400);
        // A PLS the run cannot reach is clamped to one interval of the whole run; 0 to 1 step.
        assert_eq!(interval_for(1.0, 1, 0.125, 1000), 1000);
        assert_eq!(interval_for(0.0, 4, 0.5, 1000), 1);
    }

    #[test]
    fn replot_redraws_either_study_from_its_json_and_names_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let runs: Vec<serde_json::Value> = (0..6)
            .map(|i| {
                let pls = 0.1 * i as f64;
                serde_json::json!({
                    "failures": [], "fail_servers": 1, "failed_share": 0.25,
                    "expected_pls": pls, "every_steps": 10, "pls": pls, "pls_saved": pls,
                    "auc": 0.7, "auc_drop": 0.02 * pls + 0.001 * (i % 2) as f64,
                    "ssu": {"pls": pls, "pls_saved": pls, "auc": 0.7, "auc_drop": 0.0005 * i as f64}
                })
            })
            .collect();
        let sweep = dir.path().join("sweep.json");
        let body = serde_json::json!({"preset": "tiny", "correlation": null, "runs": runs});
        std::fs::write(&sweep, body.to_string()).unwrap();
        let out = dir.path().join("plots");
        std::fs::create_dir_all(&out).unwrap();
        replot_into(&sweep, &out).unwrap();
        for f in ["cpr-pls-auc.png", "cpr-pls-auc.svg"] {
            assert!(std::fs::metadata(out.join(f)).unwrap().len() > 0, "{f}");
        }
        let rows: Vec<serde_json::Value> = [
            ("cpr", 0.02),
            ("cpr-ssu", 0.02),
            ("cpr", 0.2),
            ("cpr-ssu", 0.2),
        ]
        .iter()
        .map(|(v, t)| {
            serde_json::json!({
                "target_pls": t, "variant": v, "every_steps": 10, "overhead_s": 1.0,
                "overhead_ci95_s": 0.0, "overhead_share": 0.05 / t, "pls": t,
                "pls_saved": t, "auc_drop_mean": 0.001 * t, "auc_drop_ci95": 0.0001
            })
        })
        .collect();
        let sens = dir.path().join("sens.json");
        std::fs::write(
            &sens,
            serde_json::json!({"sensitivity": rows, "runs": []}).to_string(),
        )
        .unwrap();
        replot_into(&sens, &out).unwrap();
        for f in ["cpr-sensitivity.png", "cpr-sensitivity.svg"] {
            assert!(std::fs::metadata(out.join(f)).unwrap().len() > 0, "{f}");
        }

        let other = dir.path().join("other.json");
        std::fs::write(&other, r#"{"steps": 3}"#).unwrap();
        let e = replot_into(&other, &out).unwrap_err().to_string();
        assert!(e.contains("--replot") && e.contains("other.json"), "{e}");
        let e = replot_into(&dir.path().join("missing.json"), &out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.json"), "{e}");
        std::fs::write(&other, "not json").unwrap();
        let e = replot_into(&other, &out).unwrap_err().to_string();
        assert!(e.contains("not JSON"), "{e}");
    }
}
