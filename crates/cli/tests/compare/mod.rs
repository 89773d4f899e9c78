//! End-to-end tests of `ftrec compare` and `ftrec advise` (cheap: the tiny preset, few steps).

use std::path::Path;

use super::common::{ftrec, read_json, succeed};

/// `ftrec compare` on the tiny preset into `out`, synchronous, 3 servers and 2 workers.
fn compare(out: &Path, steps: u32, extra: &[&str]) -> serde_json::Value {
    let mut cmd = ftrec();
    cmd.args([
        "compare",
        "--preset",
        "tiny",
        "--servers",
        "3",
        "--workers",
        "2",
        "--sync",
    ])
    .args(["--steps", &steps.to_string(), "--eval-samples", "512"])
    .arg("--out")
    .arg(out)
    .args(extra);
    succeed(&mut cmd);
    read_json(&out.join("report.json"))
}

/// Width and height from a PNG's IHDR chunk, after checking the signature.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert!(
        b.len() > 8 * 1024,
        "{}: only {} bytes",
        path.display(),
        b.len()
    );
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    assert_eq!(&b[12..16], b"IHDR", "{}", path.display());
    let be = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    (be(16), be(20))
}

const PLOTS: [&str; 5] = [
    "throughput",
    "lost_per_failure",
    "overhead",
    "memory_storage",
    "quality",
];

/// One invocation runs every strategy ftrec has (the cluster's one list) on the same kills and
/// leaves the report, the plots as real PNG images and SVG, and an HTML page that shows them;
/// the advisor calibrates from it and ranks the strategies for a 1 TB model.
#[test]
fn compare_writes_every_strategy_s_report_and_plots_and_advise_ranks_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cmp");
    let rep = compare(
        &out,
        24,
        &["--kills", "server=1@step=10", "--ckpt-every-steps", "4"],
    );
    let names: Vec<&str> = rep["summary"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ftrec_cluster::StrategyChoice::all_names());
    let summary = rep["summary"].as_array().unwrap();
    let reference = summary[0]["model_digest"].as_str().unwrap();
    assert_eq!(reference.len(), 32);
    for s in summary {
        assert_eq!(s["status"], "ok", "{s}");
        // Every strategy but the reference met the kill.
        let kills = if s["strategy"] == "none" { 0 } else { 1 };
        assert_eq!(s["failures"].as_array().unwrap().len(), kills, "{s}");
        // ... and the table says the kill fired.
        let fired = if kills == 0 {
            serde_json::Value::Null
        } else {
            serde_json::json!([1, 1])
        };
        assert_eq!(s["kills_fired"], fired, "{s}");
        if s["strategy"] == "cpr" {
            // Partial recovery is approximate: server 1 lost the two steps since its save at
            // step 8, and the report gives the error against the failure-free run.
            assert_ne!(s["model_digest"], reference, "{s}");
            assert_eq!(s["digest_matches"], false, "{s}");
            assert!(s["auc_delta"].as_f64().is_some(), "{s}");
        } else {
            // Every other strategy recovers exactly.
            assert_eq!(s["model_digest"], reference, "{s}");
            assert_eq!(s["digest_matches"], true, "{s}");
        }
    }
    let cpr = rep["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["strategy"] == "cpr")
        .unwrap();
    assert_eq!(
        cpr["report"]["failures"][0]["servers_restored"],
        serde_json::json!([1])
    );
    assert_eq!(cpr["report"]["failures"][0]["steps_redone"], 0);
    let pls = cpr["report"]["cpr"]["pls"]["total"].as_f64().unwrap();
    // Eq. 3: 2 of 24 steps lost on 1 of 3 servers.
    assert!((pls - 2.0 / 24.0 / 3.0).abs() < 1e-12, "{pls}");
    // Each run's full report, its own parts included.
    let ecrec = rep["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["strategy"] == "ecrec")
        .unwrap();
    assert!(
        ecrec["report"]["ec"]["memory"]["overhead"]
            .as_f64()
            .unwrap()
            > 1.0
    );
    assert!(rep["machine"]["disk_write_bps"].as_f64().unwrap() > 0.0);

    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    for p in PLOTS {
        let (w, h) = png_size(&out.join(format!("{p}.png")));
        assert!(w >= 1000 && h >= 400, "{p}: {w}x{h}");
        let svg = std::fs::read_to_string(out.join(format!("{p}.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains("</svg>"), "{p}.svg");
        assert!(
            html.contains(&format!("href=\"{p}.png\"")),
            "{p}.png not in the HTML"
        );
        assert!(
            md.contains(&format!("({p}.png)")),
            "{p}.png not in the markdown"
        );
    }
    assert_eq!(
        html.matches("src=\"data:image/png;base64,").count(),
        PLOTS.len()
    );
    for name in ftrec_cluster::StrategyChoice::all_names() {
        assert!(
            html.contains(&format!("<td>{name}</td>")),
            "{name} not in the table"
        );
    }

    let json = dir.path().join("advice.json");
    let mut cmd = ftrec();
    cmd.args(["advise", "--calibrate"])
        .arg(&out)
        .args(["--model-gb", "1000", "--servers", "100", "--workers", "100"])
        .args([
            "--step-ms",
            "200",
            "--mtbf-hours",
            "24",
            "--days",
            "1",
            "--replicas",
            "2",
        ])
        .arg("--json")
        .arg(&json);
    let stdout = String::from_utf8(succeed(&mut cmd).stdout).unwrap();
    assert!(stdout.contains("best: "), "{stdout}");
    let advice = read_json(&json);
    let ranking = advice["advice"]["ranking"].as_array().unwrap();
    assert_eq!(ranking.len(), names.len());
    // The best is the first of the ranking, when any strategy finishes at all.
    if let Some(best) = advice["advice"]["best"].as_str() {
        assert_eq!(ranking[0]["strategy"], best);
    }
    // Which strategy wins depends on the throughputs this tiny run measured (timings on a
    // shared machine), so the ranking's order is not asserted here: the unit tests of
    // `ftrec_sim::advise` check it on fixed measurements.
    for r in ranking {
        let f = r["summary"]["failures_per_day"].as_f64().unwrap();
        assert!((50.0..150.0).contains(&f), "{r}");
    }
}

/// The failure schedule drawn from `--mtbf-s` and a seed is the same every time, and in
/// synchronous mode so are the final models: every strategy ends with the failure-free digest.
/// Another seed draws another schedule.
#[test]
fn a_seeded_mtbf_schedule_reproduces_its_kills_and_digests() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--mtbf-s", "0.08", "--max-kills", "1", "--seed", "5"];
    let a = compare(&dir.path().join("a"), 60, &args);
    let b = compare(&dir.path().join("b"), 60, &args);
    assert_eq!(a["schedule"], b["schedule"]);
    let kills = a["schedule"]["kills"].as_array().unwrap();
    assert_eq!(kills.len(), 1);
    let digests = |r: &serde_json::Value| -> Vec<(String, String)> {
        r["summary"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                assert_eq!(s["status"], "ok", "{s}");
                (
                    s["strategy"].as_str().unwrap().to_string(),
                    s["model_digest"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let (da, db) = (digests(&a), digests(&b));
    // The schedule's kills are times: the step at which a kill lands depends on the machine's
    // speed. Every exact strategy ends with the failure-free model wherever it lands; partial
    // recovery (cpr) gives the same model when its kill landed at the same step.
    let kill_step = |r: &serde_json::Value, name: &str| -> u64 {
        let run = r["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["strategy"] == name)
            .unwrap();
        run["report"]["failures"][0]["step"].as_u64().unwrap()
    };
    for (x, y) in da.iter().zip(&db) {
        assert_eq!(x.0, y.0);
        if x.0 != "cpr" || kill_step(&a, "cpr") == kill_step(&b, "cpr") {
            assert_eq!(x, y, "{da:?} {db:?}");
        }
    }
    let pls = |r: &serde_json::Value, name: &str| -> f64 {
        let run = r["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["strategy"] == name)
            .unwrap();
        run["report"]["cpr"]["pls"]["total"].as_f64().unwrap()
    };
    for d in &da {
        if d.0 == "cpr" {
            // Approximate: the failure-free model exactly when the lost shard lost nothing.
            assert_eq!(d.1 == da[0].1, pls(&a, "cpr") == 0.0, "{da:?}");
        } else {
            assert_eq!(d.1, da[0].1, "{da:?}");
        }
    }
    // The kill fell inside training: every strategy but the reference met it.
    for s in a["summary"].as_array().unwrap().iter().skip(1) {
        assert_eq!(s["failures"].as_array().unwrap().len(), 1, "{s}");
    }
    let c = compare(
        &dir.path().join("c"),
        12,
        &[
            "--mtbf-s",
            "0.08",
            "--max-kills",
            "1",
            "--seed",
            "6",
            "--strategies",
            "none",
        ],
    );
    assert_ne!(c["schedule"]["kills"], a["schedule"]["kills"]);

    // The advisor predicts the held-out run's overheads from the first run's calibration.
    let mut cmd = ftrec();
    cmd.args(["advise", "--calibrate"])
        .arg(dir.path().join("a"))
        .arg("--validate")
        .arg(dir.path().join("b"))
        .args(["--model-gb", "10", "--servers", "8", "--workers", "8"])
        .args([
            "--step-ms",
            "100",
            "--mtbf-hours",
            "12",
            "--days",
            "1",
            "--replicas",
            "2",
        ]);
    let stdout = String::from_utf8(succeed(&mut cmd).stdout).unwrap();
    assert!(stdout.contains("validation on"), "{stdout}");
    for s in ["full", "deck", "ecrec"] {
        assert!(
            stdout.lines().any(|l| l.starts_with(s) && l.contains('%')),
            "{s} missing from {stdout}"
        );
    }
}

#[test]
fn bad_compare_and_advise_input_gives_one_clear_error_line() {
    let dir = tempfile::tempdir().unwrap();
    for (args, want) in [
        (vec!["compare", "--strategies", "full,fulll"], "fulll"),
        (
            vec!["compare", "--kills", "server=0@step=3", "--mtbf-s", "1"],
            "not both",
        ),
        (vec!["compare", "--mtbf-s", "0"], "--mtbf-s"),
        (
            vec!["compare", "--mtbf-s", "1", "--failure-dist", "lognormal"],
            "weibull",
        ),
        (
            vec![
                "compare",
                "--strategies",
                "ecrec",
                "--servers",
                "2",
                "--steps",
                "5",
            ],
            "ecrec",
        ),
    ] {
        let out = ftrec()
            .args(&args)
            .arg("--out")
            .arg(dir.path().join("x"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("");
        assert!(
            last.starts_with("ftrec: error:") && last.contains(want),
            "{args:?}: {err}"
        );
    }
    let out = ftrec()
        .args(["advise", "--calibrate"])
        .arg(dir.path().join("missing"))
        .args(["--model-gb", "1", "--servers", "2", "--workers", "2"])
        .args(["--step-ms", "100", "--mtbf-hours", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ftrec compare") && err.contains("missing"),
        "{err}"
    );
}
