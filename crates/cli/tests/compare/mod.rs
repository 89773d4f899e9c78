//! End-to-end tests of `ftrec compare` and `ftrec advise` (cheap: the tiny preset, few steps).

use std::path::Path;

use super::common::hang::BoundedOutput;
use super::common::{ftrec, read_json, succeed, synth_tsv};

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
        // A tiny calibration: the ranking's mechanics, not a figure to act on.
        .arg("--extrapolate")
        .arg("--json")
        .arg(&json);
    let stdout = String::from_utf8(succeed(&mut cmd).stdout).unwrap();
    assert!(stdout.starts_with("EXTRAPOLATED"), "{stdout}");
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
            "--extrapolate",
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
            .bounded_output()
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
        .bounded_output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ftrec compare") && err.contains("missing"),
        "{err}"
    );
}

/// `ftrec demo` in a short configuration (60 steps, two rounds, `full` and `deck`): its JSON
/// holds every strategy's throughput smoothed over one named window with both kills and both
/// recoveries marked; the overhead column is exactly the definition `report.md` states,
/// recomputed here from every round's training time; the memory ratio of a model this small is
/// not shown, and the summary says which preset and size it ran. `ftrec advise` then refuses to
/// extrapolate from it to a terabyte, names the preset and command to calibrate on instead,
/// and prints no figure unless asked to extrapolate; a strategy whose run aborted is named as
/// left out of the calibration.
#[test]
fn demo_json_has_smoothed_throughput_and_failure_marks_and_advise_will_not_extrapolate_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    let mut cmd = ftrec();
    cmd.args([
        "demo",
        "--steps",
        "60",
        "--rounds",
        "2",
        "--strategies",
        "full,deck",
    ])
    .args(["--eval-samples", "256", "--out"])
    .arg(&out);
    let stdout = String::from_utf8(succeed(&mut cmd).stdout).unwrap();
    assert!(
        stdout.contains("ran preset tiny (") && stdout.contains("do not carry over"),
        "{stdout}"
    );
    let rep = read_json(&out.join("report.json"));
    let summary = rep["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 3);
    let window = summary[0]["throughput"]["window_s"].as_f64().unwrap();
    assert!(window > 0.0);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains(&format!("sliding window of {:.0} ms", window * 1e3)),
        "the plot's caption does not name the window: {md}"
    );
    for s in summary {
        let t = &s["throughput"];
        assert_eq!(t["window_s"].as_f64().unwrap(), window, "{s}");
        let points = t["points"].as_array().unwrap();
        assert!(points.len() >= 8, "{s}");
        assert!(points.iter().all(|p| p[1].as_f64().unwrap() >= 0.0));
        assert!(points.iter().any(|p| p[1].as_f64().unwrap() > 0.0));
        let marks = t["marks"].as_array().unwrap();
        if s["strategy"] == "none" {
            assert!(marks.is_empty(), "{s}");
            continue;
        }
        // Both kills, each followed by its recovery.
        for server in [1, 2] {
            let at = |kind: &str| {
                marks
                    .iter()
                    .find(|m| m["kind"] == kind && m["server"] == server)
                    .unwrap_or_else(|| panic!("no {kind} mark of server {server}: {s}"))["t_s"]
                    .as_f64()
                    .unwrap()
            };
            assert!(at("kill") < at("recovered"), "{s}");
        }
        // The overhead is the mean over rounds of each round's training time over the
        // reference's of the same round, minus one: the definition report.md states.
        let runs = rep["runs"].as_array().unwrap();
        let train = |name: &str, round: u64| {
            runs.iter()
                .find(|r| r["strategy"] == name && r["round"] == round)
                .unwrap()["report"]["train_s"]
                .as_f64()
                .unwrap()
        };
        let name = s["strategy"].as_str().unwrap();
        let ratios: Vec<f64> = (0..2)
            .map(|i| train(name, i) / train("none", i) - 1.0)
            .collect();
        let mean = ratios.iter().sum::<f64>() / 2.0;
        let overhead = s["overhead"].as_f64().unwrap();
        assert!(
            (overhead - mean).abs() < 1e-12,
            "{name}: {overhead} vs {mean} from {ratios:?}: {}",
            rep["runs"]
        );
        let shown = format!("{:+.1}%", overhead * 100.0);
        assert!(
            md.lines()
                .any(|l| l.starts_with(&format!("| {name} |")) && l.contains(&shown)),
            "{shown} not in {name}'s row: {md}"
        );
        assert!(s["steady_overhead"].as_f64().is_some(), "{s}");
        assert!(s["startup_s"].as_f64().unwrap() >= 0.0, "{s}");
    }
    assert!(md.contains("over `none`'s training time in the same round, minus one"));
    assert!(md.contains("no multiple of the model is shown"), "{md}");
    assert!(!md.contains(" model) |"), "{md}");

    // The advisor will not extrapolate a one-second tiny run to a terabyte.
    let json = dir.path().join("advice.json");
    let advise = |extra: &[&str], cal: &Path| {
        let mut cmd = ftrec();
        cmd.args(["advise", "--calibrate"])
            .arg(cal)
            .args(["--model-gb", "1000", "--servers", "100", "--workers", "100"])
            .args(["--step-ms", "200", "--mtbf-hours", "24", "--days", "1"])
            .args(["--replicas", "2", "--json"])
            .arg(&json)
            .args(extra);
        String::from_utf8(succeed(&mut cmd).stdout).unwrap()
    };
    let refused = advise(&[], &out);
    assert!(
        refused.contains("cannot speak for this cluster"),
        "{refused}"
    );
    assert!(refused.contains("too short"), "{refused}");
    assert!(
        refused.contains("ftrec compare --preset kaggle"),
        "{refused}"
    );
    assert!(
        !refused.contains("best:") && !refused.contains('%'),
        "{refused}"
    );
    let advice = read_json(&json);
    assert!(advice["advice"].is_null(), "{advice}");
    assert_eq!(advice["trust"]["reasons"].as_array().unwrap().len(), 2);
    // Asked to, it ranks them, marked, and warns when even the best costs more than training.
    let forced = advise(&["--extrapolate"], &out);
    assert!(forced.starts_with("EXTRAPOLATED"), "{forced}");
    let advice = read_json(&json);
    let best = advice["advice"]["best"].as_str().unwrap_or("");
    let best_overhead = advice["advice"]["ranking"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["strategy"] == best)
        .map_or(0.0, |r| r["summary"]["overhead"].as_f64().unwrap());
    assert_eq!(
        forced.contains("warning: the best strategy here"),
        best_overhead > 1.0,
        "{forced}"
    );

    // A run that aborted is named, with its reason, as left out of the calibration.
    let mut edited = rep.clone();
    for r in edited["runs"].as_array_mut().unwrap() {
        if r["strategy"] == "deck" {
            r["report"]["aborted"] = "recovery failed: a delta is missing".into();
        }
    }
    let cal = dir.path().join("edited");
    std::fs::create_dir(&cal).unwrap();
    std::fs::write(cal.join("report.json"), edited.to_string()).unwrap();
    succeed(ftrec().args(["compare", "--replot", "--out"]).arg(&cal));
    let named = advise(&[], &cal);
    assert!(
        named.contains("calibration: deck left out: aborted: recovery failed"),
        "{named}"
    );
}

/// `ftrec compare --data` runs every strategy on a Criteo TSV file with `ftrec run`'s data
/// flags and held-out split: the reference of the comparison is the same run, digest and AUC,
/// as `ftrec run` with the same flags, and the strategy recovers to it.
#[test]
fn compare_on_a_tsv_file_uses_run_s_data_flags_and_held_out_split() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = synth_tsv(&dir.path().join("data"), 4000);
    let shared = |cmd: &mut std::process::Command| {
        cmd.args(["--preset", "tiny", "--data"])
            .arg(&tsv)
            .args(["--rows-per-table", "300", "--holdout-every", "8"])
            .args([
                "--servers",
                "3",
                "--workers",
                "2",
                "--sync",
                "--steps",
                "12",
            ]);
    };
    let out = dir.path().join("cmp");
    let mut cmd = ftrec();
    cmd.arg("compare");
    shared(&mut cmd);
    cmd.args(["--strategies", "full", "--kills", "server=1@step=7"])
        .args(["--ckpt-every-steps", "4", "--out"])
        .arg(&out);
    succeed(&mut cmd);
    let rep = read_json(&out.join("report.json"));
    let described = rep["data"].as_str().unwrap();
    assert!(
        described.contains("train.tsv") && described.contains("every 8-th line held out"),
        "{described}"
    );
    let json = dir.path().join("run.json");
    let mut cmd = ftrec();
    cmd.arg("run");
    shared(&mut cmd);
    cmd.arg("--work-dir")
        .arg(dir.path().join("work"))
        .arg("--json")
        .arg(&json);
    succeed(&mut cmd);
    let run = read_json(&json);
    let summary = rep["summary"].as_array().unwrap();
    let none = &summary[0];
    assert_eq!(none["strategy"], "none");
    assert_eq!(none["model_digest"], run["model_digest"]);
    assert_eq!(none["auc"], run["auc"]);
    assert_eq!(none["logloss"], run["logloss"]);
    let full = &summary[1];
    assert_eq!(full["failures"].as_array().unwrap().len(), 1, "{full}");
    assert_eq!(full["digest_matches"], true, "{full}");
    for r in rep["runs"].as_array().unwrap() {
        let cfg = &r["report"]["config"];
        assert_eq!(cfg["data"]["holdout_every"], 8, "{cfg}");
        assert_eq!(r["report"]["eval_samples"], run["eval_samples"]);
    }
}

/// Predicted overheads of a `small` calibration are within this factor of the overheads
/// `compare` measures on the same workload (either way).
const SMALL_VALIDATION_FACTOR: f64 = 4.0;

/// The advisor calibrated on a recorded `small` comparison trusts it for a 50 GB model (within
/// 1,000x of its 70 MB, a reference of 30 s), names the strategy whose runs aborted as left out,
/// and predicts every other strategy's overhead in a second recorded `small` comparison of the
/// same workload with other kills within [`SMALL_VALIDATION_FACTOR`] of what that comparison
/// measured. The two fixtures are real runs, written back as compact JSON, recorded with a
/// release build on a 2-core machine while two other builds ran (load average 9-11):
///
/// ```sh
/// ftrec compare --preset small --servers 3 --workers 2 --sync --steps 60 --ckpt-every-steps 10 \
///     --kills server=1@step=25,server=2@step=47 --rounds 2 --out compare-small-a
/// ftrec compare --preset small --servers 3 --workers 2 --sync --steps 60 --ckpt-every-steps 10 \
///     --kills server=0@step=22,server=1@step=44 --rounds 2 --out compare-small-b
/// ```
#[test]
fn a_small_calibration_predicts_a_held_out_small_comparison_within_the_stated_factor() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("advice.json");
    let mut cmd = ftrec();
    cmd.args(["advise", "--calibrate"])
        .arg(fixtures.join("compare-small-a"))
        .arg("--validate")
        .arg(fixtures.join("compare-small-b"))
        .args(["--model-gb", "50", "--servers", "16", "--workers", "16"])
        .args(["--step-ms", "200", "--mtbf-hours", "24", "--days", "2"])
        .args(["--replicas", "4", "--json"])
        .arg(&json);
    let stdout = String::from_utf8(succeed(&mut cmd).stdout).unwrap();
    assert!(!stdout.contains("cannot speak"), "{stdout}");
    // Both kills of the calibration run fell within one rebuild: ECRec with r = 1 aborted.
    assert!(
        stdout.contains("calibration: ecrec left out: aborted"),
        "{stdout}"
    );
    let advice = read_json(&json);
    assert!(advice["trust"]["reasons"].as_array().unwrap().is_empty());
    assert!(advice["advice"]["warnings"].as_array().unwrap().is_empty());
    let best = advice["advice"]["best"].as_str().unwrap();
    assert_ne!(best, "none");
    let v = advice["validation"].as_array().unwrap();
    assert!(v.len() >= 5, "{v:?}");
    for x in v {
        let (m, p) = (
            x["measured"].as_f64().unwrap(),
            x["predicted"].as_f64().unwrap(),
        );
        assert!(m > 0.0 && p > 0.0, "{x}");
        let factor = (p / m).max(m / p);
        assert!(factor <= SMALL_VALIDATION_FACTOR, "{x}: {factor:.2}x");
    }
}

/// A comparison without kills prices no recovery: `ftrec advise` refuses it up front, in one
/// line that names the comparison to run instead (with kills inside its steps; that `compare`
/// accepts it is a unit test of `advise::candidates`).
#[test]
fn advise_refuses_a_calibration_without_failures_and_names_one_with_kills() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = tempfile::tempdir().unwrap();
    let mut rep = read_json(&fixtures.join("compare-small-a/report.json"));
    for r in rep["runs"].as_array_mut().unwrap() {
        r["kills"] = serde_json::json!([]);
        r["report"]["failures"] = serde_json::json!([]);
    }
    let cal = dir.path().join("no-kills");
    std::fs::create_dir(&cal).unwrap();
    std::fs::write(cal.join("report.json"), rep.to_string()).unwrap();
    let out = ftrec()
        .args(["advise", "--calibrate"])
        .arg(&cal)
        .args(["--model-gb", "50", "--servers", "16", "--workers", "16"])
        .args(["--step-ms", "200", "--mtbf-hours", "24", "--extrapolate"])
        .bounded_output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.trim_end();
    assert_eq!(line.lines().count(), 1, "{err}");
    assert!(
        line.starts_with("ftrec: error:") && line.contains("measured no failure"),
        "{err}"
    );
    let cmd = line
        .split("kills: ")
        .nth(1)
        .and_then(|s| s.split(" then ").next())
        .unwrap_or_else(|| panic!("no command in {err}"));
    let args: Vec<&str> = cmd.split_whitespace().collect();
    assert_eq!(
        &args[..4],
        ["ftrec", "compare", "--preset", "small"],
        "{cmd}"
    );
    let kills = args.iter().position(|a| *a == "--kills").expect("--kills");
    let steps: u64 = args[args.iter().position(|a| *a == "--steps").unwrap() + 1]
        .parse()
        .unwrap();
    for k in args[kills + 1].split(',') {
        let at: u64 = k.split("@step=").nth(1).unwrap().parse().unwrap();
        assert!(at > 0 && at < steps, "{cmd}");
    }
}
