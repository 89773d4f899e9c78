//! `ftrec eval --ckpt` and `ftrec ckpt export` on the stores real cluster runs write.
//!
//! - eval: a small synchronous run of a saving strategy, then `ftrec eval` of its store at the
//!   final step; the evaluation is the same computation as the run's own (same samples, same
//!   pooling order, same dense kernels over the same parameter words), so AUC and logloss must
//!   equal the run report's exactly, and the digest of the restored model the run's digest;
//! - export: the safetensors file read back with the `safetensors` crate, every tensor compared
//!   bit for bit with the servers' shards as `ftrec ckpt restore` writes them and read by the
//!   snapshot reader (a path that shares nothing with the export's in-memory assembly), and
//!   every shape checked against the tiny preset's literal widths.

use std::path::Path;

mod common;
use common::hang::BoundedOutput;
use common::{ftrec, one_error_line, read_json, succeed};

use ftrec_ckpt::snapshot::{self, DenseTarget, RowIds, ShardTarget, SnapshotOptions, TableTarget};
use ftrec_ckpt::{CheckpointKind, Checkpoints, LocalStore, Select};
use ftrec_core::{
    DenseParams, EmbeddingTable, Optimizer, OptimizerKind, ServerId, ShardMap, DENSE_BLOCK,
};

const SEED: &str = "3";
const BATCH: &str = "32";
const EVAL_SAMPLES: &str = "256";

/// A tiny synchronous run of `strategy` with 2 servers and 2 workers, 10 steps, its store in
/// `store`; returns the run's JSON report.
fn cluster_run(dir: &Path, store: &Path, strategy: &[&str]) -> serde_json::Value {
    cluster_run_evaluating(dir, store, strategy, EVAL_SAMPLES)
}

/// [`cluster_run`] with `eval_samples` held-out samples (`0`: the run evaluates nothing).
fn cluster_run_evaluating(
    dir: &Path,
    store: &Path,
    strategy: &[&str],
    eval_samples: &str,
) -> serde_json::Value {
    let json = dir.join("run.json");
    succeed(
        ftrec()
            .args([
                "run",
                "--preset",
                "tiny",
                "--servers",
                "2",
                "--workers",
                "2",
                "--sync",
            ])
            .args([
                "--steps",
                "10",
                "--batch",
                BATCH,
                "--eval-samples",
                eval_samples,
            ])
            .args(["--seed", SEED, "--work-dir"])
            .arg(dir.join("work"))
            .args(strategy)
            .arg("--store")
            .arg(store)
            .arg("--json")
            .arg(&json),
    );
    read_json(&json)
}

fn eval(store: &Path, at: Option<&str>, json: &Path) -> serde_json::Value {
    let mut cmd = ftrec();
    cmd.arg("eval").arg("--ckpt").arg(store);
    if let Some(at) = at {
        cmd.args(["--at", at]);
    }
    cmd.args([
        "--seed",
        SEED,
        "--batch",
        BATCH,
        "--eval-samples",
        EVAL_SAMPLES,
    ])
    .arg("--json")
    .arg(json);
    succeed(&mut cmd);
    read_json(json)
}

/// The run's report and `ftrec eval` of its final step agree exactly.
fn assert_eval_matches_run(strategy: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let run = cluster_run(dir.path(), &store, strategy);
    assert_eq!(run["steps"], 10);
    let ev = eval(&store, Some("10"), &dir.path().join("eval.json"));
    assert_eq!(ev["step"], 10, "{ev}");
    assert_eq!(ev["eval_samples"], run["eval_samples"], "{ev}");
    // JSON numbers are the shortest text that parses back to the same f64.
    let (auc, run_auc) = (ev["auc"].as_f64().unwrap(), run["auc"].as_f64().unwrap());
    let (ll, run_ll) = (
        ev["logloss"].as_f64().unwrap(),
        run["logloss"].as_f64().unwrap(),
    );
    assert_eq!(
        auc.to_bits(),
        run_auc.to_bits(),
        "{strategy:?}: {auc} vs {run_auc}"
    );
    assert_eq!(
        ll.to_bits(),
        run_ll.to_bits(),
        "{strategy:?}: {ll} vs {run_ll}"
    );
    assert_eq!(ev["model_digest"], run["model_digest"], "{strategy:?}");
    assert_eq!(ev["preset"], "tiny");
    // Without --at: CURRENT, the same final state.
    let cur = eval(&store, None, &dir.path().join("cur.json"));
    assert_eq!(cur["auc"], ev["auc"]);
    assert_eq!(cur["checkpoint"], ev["checkpoint"]);
    // With no flag at all: the run's seed, batch and held-out samples (none of them the
    // defaults) come from the store's job record.
    let bare = eval_bare(&store, &dir.path().join("bare.json"));
    assert_eq!(bare["seed"], 3, "{bare}");
    assert_eq!(bare["eval_samples"], run["eval_samples"], "{bare}");
    assert_eq!(bare["auc"], ev["auc"], "{strategy:?}");
    assert_eq!(bare["logloss"], ev["logloss"], "{strategy:?}");
}

/// `ftrec eval --ckpt STORE` and nothing else.
fn eval_bare(store: &Path, json: &Path) -> serde_json::Value {
    let mut cmd = ftrec();
    cmd.arg("eval")
        .arg("--ckpt")
        .arg(store)
        .arg("--json")
        .arg(json);
    succeed(&mut cmd);
    read_json(json)
}

#[test]
fn eval_of_a_full_store_gives_the_runs_auc_and_logloss() {
    assert_eval_matches_run(&["--strategy", "full", "--ckpt-every-steps", "4"]);
}

#[test]
fn eval_of_a_deck_store_gives_the_runs_auc_and_logloss() {
    assert_eval_matches_run(&[
        "--strategy",
        "deck",
        "--delta-every-steps",
        "3",
        "--merge-stride",
        "2",
    ]);
}

#[test]
fn eval_of_an_incrcp_store_gives_the_runs_auc_and_logloss() {
    assert_eval_matches_run(&[
        "--strategy",
        "incrcp",
        "--ckpt-every-steps",
        "3",
        "--base-reset",
        "never",
    ]);
}

#[test]
fn eval_of_cpr_incremental_and_cnr_stores_gives_the_runs_auc_and_logloss() {
    assert_eval_matches_run(&[
        "--strategy",
        "cpr",
        "--cpr-priority",
        "mfu",
        "--ckpt-every-steps",
        "4",
    ]);
    assert_eval_matches_run(&["--strategy", "incremental", "--ckpt-every-steps", "3"]);
    assert_eval_matches_run(&["--strategy", "cnr", "--ckpt-every-steps", "3"]);
}

/// `--at` an earlier state of a lineage: the model a run of that many steps ends with.
#[test]
fn eval_at_an_earlier_step_gives_the_auc_of_a_run_that_stopped_there() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    cluster_run(
        dir.path(),
        &store,
        &[
            "--strategy",
            "deck",
            "--delta-every-steps",
            "3",
            "--merge-stride",
            "0",
        ],
    );
    let ev = eval(&store, Some("6"), &dir.path().join("at6.json"));
    assert_eq!(ev["step"], 6);
    assert!(ev["chain"].as_array().unwrap().len() >= 2, "{ev}");
    let short = dir.path().join("short.json");
    succeed(
        ftrec()
            .args([
                "run",
                "--preset",
                "tiny",
                "--servers",
                "2",
                "--workers",
                "2",
                "--sync",
            ])
            .args([
                "--steps",
                "6",
                "--batch",
                BATCH,
                "--eval-samples",
                EVAL_SAMPLES,
            ])
            .args(["--seed", SEED, "--strategy", "none", "--work-dir"])
            .arg(dir.path().join("short"))
            .arg("--json")
            .arg(&short),
    );
    let short = read_json(&short);
    assert_eq!(ev["auc"].as_f64(), short["auc"].as_f64());
    assert_eq!(ev["logloss"].as_f64(), short["logloss"].as_f64());
    assert_eq!(ev["model_digest"], short["model_digest"]);
}

/// With --data the held-out lines of the TSV files are the evaluation set; the data's tables
/// must be the checkpoint's.
#[test]
fn eval_on_tsv_data_uses_its_holdout_lines() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    cluster_run(
        dir.path(),
        &store,
        &["--strategy", "full", "--ckpt-every-steps", "4"],
    );
    let tsv = synth_tsv(dir.path(), 400);
    let json = dir.path().join("tsv.json");
    succeed(
        ftrec()
            .arg("eval")
            .arg("--ckpt")
            .arg(&store)
            .arg("--data")
            .arg(&tsv)
            .args(["--rows-per-table", "400", "--holdout-every", "4", "--json"])
            .arg(&json),
    );
    let ev = read_json(&json);
    assert_eq!(ev["data"], "tsv");
    assert_eq!(ev["eval_samples"], 100, "every 4th of 400 lines");
    assert!(ev["teacher_auc"].is_null());
    let auc = ev["auc"].as_f64().unwrap();
    assert!(auc > 0.0 && auc < 1.0, "{auc}");
    // Without the cap the data's tables are Criteo's, not the checkpoint's.
    let out = ftrec()
        .arg("eval")
        .arg("--ckpt")
        .arg(&store)
        .arg("--data")
        .arg(&tsv)
        .bounded_output()
        .unwrap();
    assert!(one_error_line(&out).contains("--rows-per-table"));
}

/// A run on TSV data records its data in the job record: `ftrec eval --ckpt STORE` alone
/// evaluates on the run's held-out lines and gives the run's own AUC, bit for bit.
#[test]
fn eval_of_a_tsv_run_s_store_needs_no_flags() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = synth_tsv(dir.path(), 600);
    let store = dir.path().join("store");
    let json = dir.path().join("run.json");
    succeed(
        ftrec()
            .args(["run", "--preset", "tiny", "--sync", "--servers", "2"])
            .args(["--workers", "2", "--steps", "6", "--batch", "16", "--data"])
            .arg(&tsv)
            .args(["--rows-per-table", "300", "--holdout-every", "5"])
            .args([
                "--strategy",
                "full",
                "--ckpt-every-steps",
                "3",
                "--work-dir",
            ])
            .arg(dir.path().join("work"))
            .arg("--store")
            .arg(&store)
            .arg("--json")
            .arg(&json),
    );
    let run = read_json(&json);
    let ev = eval_bare(&store, &dir.path().join("eval.json"));
    assert_eq!(ev["data"], "tsv", "{ev}");
    assert_eq!(ev["eval_samples"], run["eval_samples"], "{ev}");
    assert_eq!(ev["eval_samples"], 120, "every 5th of 600 lines");
    assert_eq!(ev["auc"], run["auc"], "{ev}");
    assert_eq!(ev["logloss"], run["logloss"], "{ev}");
    assert_eq!(ev["model_digest"], run["model_digest"]);
    // A flag still overrides the record: another held-out share is another evaluation set.
    let json = dir.path().join("other.json");
    succeed(
        ftrec()
            .arg("eval")
            .arg("--ckpt")
            .arg(&store)
            .args(["--holdout-every", "3", "--json"])
            .arg(&json),
    );
    assert_eq!(
        read_json(&json)["eval_samples"],
        200,
        "every 3rd of 600 lines"
    );
    // The record's data has the run's tables: no cap to give without --data.
    let out = ftrec()
        .arg("eval")
        .arg("--ckpt")
        .arg(&store)
        .args(["--rows-per-table", "300"])
        .bounded_output()
        .unwrap();
    assert!(one_error_line(&out).contains("--rows-per-table applies to --data only"));
}

/// `samples` lines of the tiny preset's synthetic data as a TSV file under `dir/data`.
fn synth_tsv(dir: &Path, samples: u32) -> std::path::PathBuf {
    common::synth_tsv(&dir.join("data"), samples)
}

/// Every server's shard of the full checkpoint `ftrec ckpt restore` wrote into `dir`, read
/// by the snapshot reader: per server, its tables (local rows) and its dense range.
fn read_restored(dir: &Path) -> (ShardMap, Vec<(Vec<EmbeddingTable>, u64, DenseParams)>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ckpts = Checkpoints::new(std::sync::Arc::new(LocalStore::new(dir).unwrap()));
        let m = ckpts
            .select(&Select::Current, &[CheckpointKind::Full])
            .await
            .unwrap();
        let map = ShardMap::new(m.shards.len() as u32).unwrap();
        // The tiny preset's dense optimizer (Adagrad: 256 words per block).
        let opt = Optimizer::new(OptimizerKind::Adagrad, 0.02);
        let mut out = Vec::new();
        for info in &m.shards {
            let mut tables: Vec<EmbeddingTable> = info
                .tables
                .iter()
                .map(|t| EmbeddingTable::zeros(t.table, t.rows, t.layout))
                .collect();
            let d = info.dense.unwrap();
            let mut dense = DenseParams::new(vec![0.0; d.values as usize], &opt);
            let mut target = ShardTarget {
                server: info.server,
                tables: tables
                    .iter_mut()
                    .map(|t| TableTarget {
                        table: t,
                        ids: RowIds::Sharded {
                            map,
                            server: info.server,
                        },
                    })
                    .collect(),
                dense: Some(DenseTarget {
                    first_block: d.first_block,
                    params: &mut dense,
                }),
            };
            snapshot::restore_shard(&ckpts, &m, &mut target, &SnapshotOptions::default())
                .await
                .unwrap();
            out.push((tables, d.first_block, dense));
        }
        (map, out)
    })
}

fn f32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Click probabilities of samples (13 dense features, one row id per table) computed from the
/// exported tensors by their documented meaning alone: `y = relu(W x + b)` with `W` `[out, in]`
/// through the bottom MLP, the interaction (bottom output, then the dots of pairs `a < b` in
/// row-major upper-triangle order), the top MLP without a ReLU after its last layer, sigmoid.
fn documented_forward(
    st: &safetensors::SafeTensors<'_>,
    dense: &[[f32; 13]],
    ids: &[Vec<u64>],
) -> Vec<f64> {
    let get = |name: &str| {
        let t = st.tensor(name).unwrap();
        let v: Vec<f64> = f32s(t.data())
            .into_iter()
            .map(|b| f32::from_bits(b) as f64)
            .collect();
        (t.shape().to_vec(), v)
    };
    let linear = |x: &[f64], prefix: &str, relu: bool| -> Vec<f64> {
        let (shape, w) = get(&format!("{prefix}.weight"));
        let (_, b) = get(&format!("{prefix}.bias"));
        let (out, inp) = (shape[0], shape[1]);
        assert_eq!(x.len(), inp, "{prefix}");
        (0..out)
            .map(|o| {
                let y = b[o] + (0..inp).map(|i| w[o * inp + i] * x[i]).sum::<f64>();
                if relu {
                    y.max(0.0)
                } else {
                    y
                }
            })
            .collect()
    };
    let mut probs = Vec::new();
    for (x, rows) in dense.iter().zip(ids) {
        let mut z0: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        for i in 0..2 {
            z0 = linear(&z0, &format!("bottom_mlp.{i}"), true);
        }
        let mut z = vec![z0.clone()];
        for (t, &r) in rows.iter().enumerate() {
            let (shape, e) = get(&format!("embedding.{t}.weight"));
            let d = shape[1];
            z.push(e[r as usize * d..(r as usize + 1) * d].to_vec());
        }
        let mut inter = z0;
        for a in 0..z.len() {
            for b in a + 1..z.len() {
                inter.push(z[a].iter().zip(&z[b]).map(|(p, q)| p * q).sum());
            }
        }
        let h = linear(&inter, "top_mlp.0", true);
        let logit = linear(&h, "top_mlp.1", false)[0];
        probs.push(1.0 / (1.0 + (-logit).exp()));
    }
    probs
}

#[test]
fn export_writes_every_tensor_bit_for_bit_with_documented_names_and_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let run = cluster_run(
        dir.path(),
        &store,
        &["--strategy", "full", "--ckpt-every-steps", "4"],
    );
    let out = dir.path().join("model.safetensors");
    let said = succeed(
        ftrec()
            .args(["ckpt", "export"])
            .arg(&store)
            .args(["--at", "10", "--optimizer-state", "--out"])
            .arg(&out),
    );
    let said = String::from_utf8_lossy(&said.stdout);
    assert!(said.contains("exported step 10"), "{said}");

    // The servers' shards as `ckpt restore` writes them, read by the snapshot reader.
    let restored = dir.path().join("restored");
    succeed(
        ftrec()
            .args(["ckpt", "restore"])
            .arg(&store)
            .arg("--out")
            .arg(&restored),
    );
    let (map, shards) = read_restored(&restored);

    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    assert_eq!(meta["format"], "ftrec-dlrm");
    assert_eq!(meta["format_version"], "1");
    assert_eq!(meta["step"], "10");
    assert_eq!(meta["preset"], "tiny");
    assert_eq!(meta["sparse_optimizer"], "rowwise_adagrad");
    assert_eq!(meta["dense_optimizer"], "adagrad");
    assert_eq!(meta["servers"], "2");
    assert_eq!(meta["optimizer_state"], "true");

    // Dense layers: the tiny preset's bottom MLP 13-32-8 and top MLP (8 + 27*26/2)-32-1, in
    // the documented order, laid end to end, are the servers' dense ranges end to end.
    let layers = [
        ("bottom_mlp.0", 32, 13),
        ("bottom_mlp.1", 8, 32),
        ("top_mlp.0", 32, 8 + 27 * 26 / 2),
        ("top_mlp.1", 1, 32),
    ];
    let mut flat = Vec::new();
    for (name, out_w, in_w) in layers {
        let w = st.tensor(&format!("{name}.weight")).unwrap();
        assert_eq!(w.shape(), [out_w, in_w], "{name}");
        assert_eq!(w.dtype(), safetensors::Dtype::F32);
        flat.extend(f32s(w.data()));
        let b = st.tensor(&format!("{name}.bias")).unwrap();
        assert_eq!(b.shape(), [out_w], "{name}");
        flat.extend(f32s(b.data()));
    }
    let mut ranges: Vec<&(Vec<EmbeddingTable>, u64, DenseParams)> = shards.iter().collect();
    ranges.sort_by_key(|s| s.1);
    let saved: Vec<u32> = ranges
        .iter()
        .flat_map(|s| s.2.values.iter().map(|v| v.to_bits()))
        .collect();
    assert_eq!(flat.len(), saved.len());
    assert!(flat == saved, "dense values differ");
    let saved_state: Vec<u32> = ranges
        .iter()
        .flat_map(|s| s.2.state.iter().map(|v| v.to_bits()))
        .collect();
    let ds = st.tensor("dense.optimizer_state").unwrap();
    assert_eq!(
        ds.shape(),
        [flat.len().div_ceil(DENSE_BLOCK), DENSE_BLOCK],
        "Adagrad keeps one word per dense value"
    );
    assert!(
        f32s(ds.data()) == saved_state,
        "dense optimizer state differs"
    );

    // Embedding tables: every row of every server, at its global id.
    let rows = &ftrec_core::Preset::tiny().table_rows;
    let mut names = 4 * 2 + 1;
    for (t, &n) in rows.iter().enumerate() {
        let w = st.tensor(&format!("embedding.{t}.weight")).unwrap();
        let s = st
            .tensor(&format!("embedding.{t}.optimizer_state"))
            .unwrap();
        assert_eq!(w.shape(), [n as usize, 8], "table {t}");
        assert_eq!(s.shape(), [n as usize, 1], "table {t}: row-wise Adagrad");
        names += 2;
        let (w, s) = (f32s(w.data()), f32s(s.data()));
        let mut seen = 0;
        for (server, (tables, _, _)) in shards.iter().enumerate() {
            let table = &tables[t];
            assert_eq!(table.id.0 as usize, t);
            for local in 0..table.rows() {
                let g = map.global_row(table.id, ServerId(server as u32), local) as usize;
                let row: Vec<u32> = table.row(local).iter().map(|v| v.to_bits()).collect();
                assert_eq!(&w[g * 8..g * 8 + 8], &row[..8], "table {t} row {g}");
                assert_eq!(s[g], row[8], "table {t} row {g} state");
                seen += 1;
            }
        }
        assert_eq!(seen, n, "table {t}");
    }
    assert_eq!(st.len(), names, "{:?}", st.names());
    assert_eq!(run["steps"], 10);

    // The documented meaning of the tensors gives the model's own predictions (to float
    // rounding: the reference sums in f64, in another order).
    let flat_values: Vec<f32> = flat.iter().map(|&b| f32::from_bits(b)).collect();
    let preset = ftrec_core::Preset::tiny();
    let model = ftrec_model::Dlrm::from_params(
        ftrec_model::DlrmConfig::from_preset(&preset),
        DenseParams::new(flat_values, &Optimizer::new(OptimizerKind::Adagrad, 0.02)),
    )
    .unwrap();
    let samples = 5;
    let dense_in: Vec<[f32; 13]> = (0..samples)
        .map(|i| std::array::from_fn(|j| ((i * 13 + j) as f32 * 0.73).sin()))
        .collect();
    let ids: Vec<Vec<u64>> = (0..samples)
        .map(|i| {
            rows.iter()
                .enumerate()
                .map(|(t, &n)| (i as u64 * 7919 + t as u64 * 104_729) % n)
                .collect()
        })
        .collect();
    let emb = |t: usize, r: u64| -> Vec<f32> {
        let w = f32s(st.tensor(&format!("embedding.{t}.weight")).unwrap().data());
        w[r as usize * 8..r as usize * 8 + 8]
            .iter()
            .map(|&b| f32::from_bits(b))
            .collect()
    };
    let mut pooled = Vec::new();
    for sample in &ids {
        for (t, &r) in sample.iter().enumerate() {
            pooled.extend(emb(t, r));
        }
    }
    let flat_dense: Vec<f32> = dense_in.iter().flatten().copied().collect();
    let mut ws = model.workspace(samples, 1).unwrap();
    let mut ours = Vec::new();
    model
        .predict(&mut ws, &flat_dense, &pooled, &mut ours)
        .unwrap();
    let reference = documented_forward(&st, &dense_in, &ids);
    for (a, b) in ours.iter().zip(&reference) {
        assert!((*a as f64 - b).abs() < 1e-5, "{ours:?} vs {reference:?}");
    }
    assert!(
        reference.iter().any(|p| (p - reference[0]).abs() > 1e-4),
        "samples must differ for the check to mean something: {reference:?}"
    );

    // Without --optimizer-state: the same weights, no state tensors.
    let plain = dir.path().join("plain.safetensors");
    succeed(
        ftrec()
            .args(["ckpt", "export"])
            .arg(&store)
            .arg("--out")
            .arg(&plain),
    );
    let pb = std::fs::read(&plain).unwrap();
    let ps = safetensors::SafeTensors::deserialize(&pb).unwrap();
    assert_eq!(ps.len(), 4 * 2 + rows.len());
    assert!(ps.names().iter().all(|n| !n.contains("optimizer_state")));
    assert_eq!(
        ps.tensor("embedding.3.weight").unwrap().data(),
        st.tensor("embedding.3.weight").unwrap().data()
    );

    // An existing file is kept unless --force.
    let before = std::fs::read(&plain).unwrap();
    let refused = ftrec()
        .args(["ckpt", "export"])
        .arg(&store)
        .args(["--optimizer-state", "--out"])
        .arg(&plain)
        .bounded_output()
        .unwrap();
    assert!(one_error_line(&refused).contains("--force"));
    assert_eq!(std::fs::read(&plain).unwrap(), before);
    succeed(
        ftrec()
            .args(["ckpt", "export"])
            .arg(&store)
            .args(["--optimizer-state", "--force", "--out"])
            .arg(&plain),
    );
    // The same tensors and metadata (the header's key order follows a hash map's).
    let forced = std::fs::read(&plain).unwrap();
    let fs = safetensors::SafeTensors::deserialize(&forced).unwrap();
    assert_eq!(fs.len(), st.len());
    for name in st.names() {
        let (a, b) = (st.tensor(name).unwrap(), fs.tensor(name).unwrap());
        assert_eq!(a.shape(), b.shape(), "{name}");
        assert_eq!(a.data(), b.data(), "{name}");
    }
    let (_, fmeta) = safetensors::SafeTensors::read_metadata(&forced).unwrap();
    assert_eq!(fmeta.metadata().clone().unwrap(), meta);
}

#[test]
fn bad_stores_steps_and_shapes_give_one_clear_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    cluster_run(
        dir.path(),
        &store,
        &["--strategy", "full", "--ckpt-every-steps", "4"],
    );
    let missing = dir.path().join("no-such-store");
    let out_file = dir.path().join("x.safetensors");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "eval".into(),
                "--ckpt".into(),
                missing.display().to_string(),
            ],
            "does not exist",
        ),
        (
            vec![
                "ckpt".into(),
                "export".into(),
                missing.display().to_string(),
                "--out".into(),
                out_file.display().to_string(),
            ],
            "does not exist",
        ),
        (
            vec![
                "ckpt".into(),
                "export".into(),
                store.display().to_string(),
                "--at".into(),
                "7".into(),
                "--out".into(),
                out_file.display().to_string(),
            ],
            "step 7",
        ),
        (
            vec![
                "eval".into(),
                "--ckpt".into(),
                store.display().to_string(),
                "--at".into(),
                "3".into(),
            ],
            "step 3",
        ),
        (
            vec![
                "eval".into(),
                "--ckpt".into(),
                store.display().to_string(),
                "--preset".into(),
                "small".into(),
            ],
            "not preset small's shape",
        ),
        (
            vec![
                "eval".into(),
                "--ckpt".into(),
                store.display().to_string(),
                "--optimizer".into(),
                "adam".into(),
            ],
            "--optimizer",
        ),
        (
            vec![
                "eval".into(),
                "--ckpt".into(),
                store.display().to_string(),
                "--holdout-every".into(),
                "5".into(),
            ],
            "--holdout-every applies to --data only",
        ),
    ];
    for (args, needle) in cases {
        let out = ftrec().args(&args).bounded_output().unwrap();
        let line = one_error_line(&out);
        assert!(line.contains(needle), "{args:?}: {line}");
    }
    assert!(!out_file.exists());
    // An empty directory is not a store.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = ftrec()
        .arg("eval")
        .arg("--ckpt")
        .arg(&empty)
        .bounded_output()
        .unwrap();
    let line = one_error_line(&out);
    assert!(line.contains("is not a checkpoint store"), "{line}");
}

/// A job that ran with `--eval-samples 0` evaluated nothing, and its record says so. `ftrec
/// eval` alone takes the preset's default held-out size, says so in one line, and decides it
/// before restoring anything; a setting that cannot work is refused before any restore: the
/// refusals below come the same from a store whose checkpoint data is gone, which any restore
/// would fail on.
#[test]
fn eval_of_a_job_that_evaluated_nothing_uses_the_preset_default_and_checks_flags_before_restoring()
{
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    cluster_run_evaluating(
        dir.path(),
        &store,
        &["--strategy", "full", "--ckpt-every-steps", "3"],
        "0",
    );
    let json = dir.path().join("eval.json");
    let out = succeed(
        ftrec()
            .arg("eval")
            .arg("--ckpt")
            .arg(&store)
            .arg("--json")
            .arg(&json),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let said = stderr
        .find("eval_samples = 0")
        .unwrap_or_else(|| panic!("no line on the record's 0: {stderr}"));
    let restored = stderr.find("restored step").expect("restored");
    assert!(said < restored, "decided after the restore: {stderr}");
    // The tiny preset's default held-out size.
    assert_eq!(read_json(&json)["eval_samples"], 4096);

    // Every checkpoint's data gone, the records kept: a restore now fails.
    let mut removed = 0;
    for e in walk(&store) {
        let name = e.file_name().unwrap().to_string_lossy().to_string();
        if e.parent().unwrap() != store && name != "MANIFEST" {
            std::fs::remove_file(&e).unwrap();
            removed += 1;
        }
    }
    assert!(removed > 0);
    let restore_fails = ftrec()
        .arg("eval")
        .arg("--ckpt")
        .arg(&store)
        .bounded_output()
        .unwrap();
    let line = one_error_line(&restore_fails);
    assert!(line.contains("restoring"), "{line}");
    let store_s = store.display().to_string();
    let out_file = dir.path().join("m.safetensors").display().to_string();
    for (args, flag) in [
        (
            vec!["eval", "--ckpt", &store_s, "--eval-samples", "0"],
            "--eval-samples",
        ),
        (vec!["eval", "--ckpt", &store_s, "--batch", "0"], "--batch"),
        (
            vec!["eval", "--ckpt", &store_s, "--preset", "huge"],
            "--preset",
        ),
        (
            vec!["eval", "--ckpt", &store_s, "--optimizer", "adamw2"],
            "--optimizer",
        ),
        (
            vec![
                "ckpt", "export", &store_s, "--out", &out_file, "--preset", "huge",
            ],
            "--preset",
        ),
        (
            vec![
                "ckpt",
                "export",
                &store_s,
                "--out",
                &out_file,
                "--dense-optimizer",
                "x",
            ],
            "--dense-optimizer",
        ),
    ] {
        let out = ftrec().args(&args).bounded_output().unwrap();
        let line = one_error_line(&out);
        assert!(line.contains(flag), "{args:?}: {line}");
        assert!(!line.contains("restoring"), "{args:?}: {line}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("restored"), "{args:?}: {stderr}");
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}
