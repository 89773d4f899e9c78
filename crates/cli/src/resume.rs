//! `ftrec run --resume LOCATION`: the job's configuration from its store's job record, with the
//! settings of this invocation. A flag that defines the job and contradicts the record is one
//! error line naming the flag and both values; the flags that may differ are applied.

use anyhow::{bail, Result};
use ftrec_cluster::{KillSpec, RunConfig, StrategyChoice};
use ftrec_core::{OptimizerKind, Preset};

use crate::flags::RunArgs;

/// The configuration of the job recorded in `location`, as this invocation runs it.
pub fn config(a: &RunArgs, location: &str) -> Result<RunConfig> {
    if let Some(s) = &a.store {
        if s != location {
            bail!(
                "--store {s} contradicts --resume {location}: a resumed job goes on writing the \
                 store it resumes from"
            );
        }
    }
    let job = ftrec_cluster::job::read(location)?;
    let (exe, work_dir) = crate::cluster_cmd::exe_and_work_dir(a)?;
    let invocation = RunConfig::new(Preset::tiny(), exe, work_dir);
    let mut cfg = job.config(&invocation)?;
    check(a, &cfg, location)?;
    // What may differ from the record.
    if let Some(n) = a.servers {
        cfg.servers = n;
    }
    if let Some(t) = a.threads {
        cfg.threads = t;
    }
    if let Some(n) = a.compute_nice {
        cfg.compute_nice = n;
    }
    // Where the processes run is the machine's business, not the job's: as given now.
    cfg.server_cpus = a.server_cpus.clone();
    cfg.worker_cpus = a.worker_cpus.clone();
    if let Some(e) = a.eval_samples {
        cfg.eval_samples = e;
    }
    if let Some(k) = a.ckpt_chunk_kib {
        cfg.ckpt_chunk_kib = k;
    }
    cfg.kills = a
        .kill
        .iter()
        .map(|k| KillSpec::parse_many(k))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    if let Some(ms) = a.heartbeat_ms {
        cfg.heartbeat = std::time::Duration::from_millis(ms);
    }
    if let Some(ms) = a.heartbeat_timeout_ms {
        cfg.heartbeat_timeout = std::time::Duration::from_millis(ms);
    }
    if let Some(i) = a.report_interval_s {
        cfg.report_interval_s = i;
    }
    crate::cluster_cmd::apply_start_timeout(a, &mut cfg)?;
    cfg.external_servers = a.server_addr.clone();
    if let Some(c) = a.control_listen {
        cfg.control_listen = c;
    }
    cfg.store = Some(location.to_string());
    cfg.validate()?;
    Ok(cfg)
}

/// Every job-defining flag given must say what the record says.
fn check(a: &RunArgs, rec: &RunConfig, location: &str) -> Result<()> {
    let clash = |flag: &str, given: String, recorded: String| -> Result<()> {
        if given == recorded {
            return Ok(());
        }
        if given == "true" && recorded == "false" {
            bail!("{flag} contradicts the job recorded in {location}, which runs without it");
        }
        bail!(
            "{flag} {given} contradicts the job recorded in {location}, whose {flag} is {recorded}"
        )
    };
    if let Some(p) = &a.preset {
        clash("--preset", p.clone(), rec.preset.name.clone())?;
    }
    if let Some(w) = a.workers {
        clash("--workers", w.to_string(), rec.workers.to_string())?;
    }
    if a.sync && !rec.sync {
        bail!(
            "--sync contradicts the job recorded in {location}, which trains asynchronously \
             (without --sync)"
        );
    }
    if let Some(s) = a.steps {
        clash("--steps", s.to_string(), rec.steps.to_string())?;
    }
    if let Some(b) = a.batch {
        clash("--batch", b.to_string(), rec.batch.to_string())?;
    }
    if let Some(s) = a.seed {
        clash("--seed", s.to_string(), rec.seed.to_string())?;
    }
    let kind = |flag: &str, v: &str| -> Result<String> {
        v.parse::<OptimizerKind>()
            .map(|k| k.to_string())
            .map_err(|e| anyhow::anyhow!("{flag} {v:?}: {e}"))
    };
    if let Some(o) = &a.opt.optimizer {
        clash(
            "--optimizer",
            kind("--optimizer", o)?,
            rec.sparse_optimizer.kind.to_string(),
        )?;
    }
    // The numeric settings of both optimizers, each against the record's.
    let (sparse, dense) = (&rec.sparse_optimizer, &rec.dense_optimizer);
    for (flag, given, recorded) in [
        ("--lr", a.opt.lr, sparse.lr),
        ("--dense-lr", a.opt.dense_lr, dense.lr),
        (
            "--initial-accumulator",
            a.opt.initial_accumulator,
            sparse.initial_accumulator,
        ),
        (
            "--dense-initial-accumulator",
            a.opt.dense_initial_accumulator,
            dense.initial_accumulator,
        ),
    ] {
        if let Some(v) = given {
            clash(flag, v.to_string(), recorded.to_string())?;
        }
    }
    if let Some(o) = &a.opt.dense_optimizer {
        clash(
            "--dense-optimizer",
            kind("--dense-optimizer", o)?,
            rec.dense_optimizer.kind.to_string(),
        )?;
    }
    check_data(a, rec, location)?;
    let name = rec.strategy.name();
    if let Some(s) = &a.strategy {
        clash("--strategy", s.clone(), name.to_string())?;
    }
    let recorded = strategy_flags(&rec.strategy);
    for (flag, given) in given_strategy_flags(a) {
        match recorded.iter().find(|(f, _)| *f == flag) {
            Some((_, r)) => clash(flag, given, r.clone())?,
            None => bail!(
                "{flag} does not apply to the job recorded in {location}, whose strategy is {name}"
            ),
        }
    }
    Ok(())
}

/// The data flags given against the recorded data: each one must say what the record says (a
/// job trained on synthetic data takes none of them).
fn check_data(a: &RunArgs, rec: &RunConfig, location: &str) -> Result<()> {
    let d = &a.data;
    let given = [
        ("--data", !d.data.is_empty()),
        ("--layout", d.layout.is_some()),
        ("--rows-per-table", d.rows_per_table.is_some()),
        ("--skip-malformed", d.skip_malformed),
        ("--holdout-every", d.holdout_every.is_some()),
        ("--epochs", d.epochs.is_some()),
    ];
    let Some(tsv) = &rec.data else {
        if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
            bail!(
                "{flag} contradicts the job recorded in {location}, which trains on synthetic data"
            );
        }
        return Ok(());
    };
    let differs = |flag: &str, given: String, recorded: String| -> Result<()> {
        if given != recorded {
            bail!("{flag} {given} contradicts the job recorded in {location}, whose {flag} is {recorded}");
        }
        Ok(())
    };
    if !d.data.is_empty() {
        let paths = d
            .data
            .iter()
            .map(|p| {
                std::fs::canonicalize(p).map_err(|e| anyhow::anyhow!("--data {}: {e}", p.display()))
            })
            .collect::<Result<Vec<_>>>()?;
        let path =
            ftrec_data::DataPath::from_paths(&paths).map_err(|e| anyhow::anyhow!("--data: {e}"))?;
        differs("--data", format!("{path:?}"), format!("{:?}", tsv.path))?;
    }
    if let Some(l) = d.layout {
        let layout = match l {
            crate::flags::LayoutArg::Kaggle => ftrec_data::Layout::Kaggle,
            crate::flags::LayoutArg::Terabyte => ftrec_data::Layout::Terabyte,
        };
        differs(
            "--layout",
            format!("{layout:?}"),
            format!("{:?}", tsv.layout),
        )?;
    }
    if let Some(cap) = d.rows_per_table {
        let capped: Vec<u64> = tsv
            .layout
            .default_table_rows()
            .iter()
            .map(|&r| r.min(cap))
            .collect();
        if capped != tsv.table_rows {
            bail!("--rows-per-table {cap} contradicts the job recorded in {location}, whose tables are not capped at {cap} rows");
        }
    }
    if d.skip_malformed && !tsv.skip_malformed {
        bail!("--skip-malformed contradicts the job recorded in {location}, which runs without it");
    }
    if let Some(h) = d.holdout_every {
        differs(
            "--holdout-every",
            h.to_string(),
            tsv.holdout_every.to_string(),
        )?;
    }
    if let Some(e) = d.epochs {
        differs(
            "--epochs",
            e.to_string(),
            tsv.epochs.map_or("unlimited".into(), |n| n.to_string()),
        )?;
    }
    Ok(())
}

/// The strategy flags given, each value written as [`strategy_flags`] writes it.
fn given_strategy_flags(a: &RunArgs) -> Vec<(&'static str, String)> {
    let mut v: Vec<(&'static str, String)> = Vec::new();
    let mut add = |flag: &'static str, value: Option<String>| {
        if let Some(x) = value {
            v.push((flag, x));
        }
    };
    let s = |x: &dyn ToString| x.to_string();
    add("--ckpt-every-steps", a.ckpt_every_steps.map(|x| s(&x)));
    add("--delta-every-steps", a.delta_every_steps.map(|x| s(&x)));
    add("--full-every", a.full_every.map(|x| s(&x)));
    add("--merge-stride", a.merge_stride.map(|x| s(&x)));
    add("--merge-mib-per-s", a.merge_mib_per_s.map(|x| s(&x)));
    add(
        "--base-reset",
        a.incr.base_reset.as_ref().map(|r| {
            r.parse::<u64>()
                .map_or_else(|_| r.clone(), |n| n.to_string())
        }),
    );
    add(
        "--extract-threshold",
        a.incr.extract_threshold.map(|x| s(&x)),
    );
    add("--range-rows", a.incr.range_rows.map(|x| s(&x)));
    add("--no-concat", a.incr.no_concat.then(|| "true".into()));
    add(
        "--cnr-reset-fraction",
        a.incr.cnr_reset_fraction.map(|x| s(&x)),
    );
    add("--quantize", a.incr.quantize.map(|x| s(&x)));
    add("--cpr-priority", a.cpr.cpr_priority.clone());
    add("--target-pls", a.cpr.target_pls.map(|x| s(&x)));
    add("--mtbf-s", a.cpr.mtbf_s.map(|x| s(&x)));
    add("--cpr-r", a.cpr.cpr_r.map(|x| s(&x)));
    add(
        "--cpr-saves-per-full",
        a.cpr.cpr_saves_per_full.map(|x| s(&x)),
    );
    add("--cpr-ssu-period", a.cpr.cpr_ssu_period.map(|x| s(&x)));
    add("--cpr-tables", a.cpr.cpr_tables.map(|x| s(&x)));
    add("--ec-k", a.ec.ec_k.map(|x| s(&x)));
    add("--ec-r", a.ec.ec_r.map(|x| s(&x)));
    add("--ec-code", a.ec.ec_code.clone());
    add(
        "--no-dense-replication",
        a.ec.no_dense_replication.then(|| "true".into()),
    );
    add("--no-2pc", a.ec.no_2pc.then(|| "true".into()));
    add("--recovery-locks", a.ec.recovery_locks.map(|x| s(&x)));
    add("--rebuild-share", a.ec.rebuild_share.map(|x| s(&x)));
    add(
        "--rebuild-min-throughput",
        a.ec.rebuild_min_throughput.map(|x| s(&x)),
    );
    v
}

/// The flags that set `choice`'s parameters, with the values that give them.
fn strategy_flags(choice: &StrategyChoice) -> Vec<(&'static str, String)> {
    let or = |v: Option<String>, none: &str| v.unwrap_or_else(|| none.to_string());
    match *choice {
        StrategyChoice::Full { every_steps } => {
            vec![("--ckpt-every-steps", every_steps.to_string())]
        }
        StrategyChoice::Deck {
            delta_every_steps,
            full_every_deltas,
            merge_stride,
            merge_mib_per_s,
        } => vec![
            ("--delta-every-steps", delta_every_steps.to_string()),
            (
                "--full-every",
                or(full_every_deltas.map(|n| n.to_string()), "never"),
            ),
            ("--merge-stride", merge_stride.unwrap_or(0).to_string()),
            (
                "--merge-mib-per-s",
                or(merge_mib_per_s.map(|r| r.to_string()), "none"),
            ),
        ],
        StrategyChoice::Incremental {
            every_steps,
            full_every_pieces,
        } => vec![
            ("--ckpt-every-steps", every_steps.to_string()),
            (
                "--base-reset",
                or(full_every_pieces.map(|n| n.to_string()), "never"),
            ),
        ],
        StrategyChoice::Cnr {
            every_steps,
            reset_fraction,
            quant_bits,
        } => vec![
            ("--ckpt-every-steps", every_steps.to_string()),
            (
                "--cnr-reset-fraction",
                or(reset_fraction.map(|f| f.to_string()), "0"),
            ),
            ("--quantize", or(quant_bits.map(|b| b.to_string()), "off")),
        ],
        StrategyChoice::IncrCp {
            every_steps,
            reset,
            threshold,
            range_rows,
            concat,
        } => vec![
            ("--ckpt-every-steps", every_steps.to_string()),
            (
                "--base-reset",
                match reset {
                    ftrec_strategy::BaseReset::Auto => "auto".to_string(),
                    ftrec_strategy::BaseReset::Never => "never".to_string(),
                    ftrec_strategy::BaseReset::EveryPieces(n) => n.to_string(),
                },
            ),
            ("--extract-threshold", threshold.to_string()),
            ("--range-rows", range_rows.to_string()),
            ("--no-concat", (!concat).to_string()),
        ],
        StrategyChoice::Cpr {
            interval,
            priority,
            r,
            saves_per_full,
            ssu_period,
            largest_tables,
        } => {
            let (every, pls, mtbf) = match interval {
                ftrec_strategy::CprInterval::Steps(n) => {
                    (n.to_string(), "none".to_string(), "none".to_string())
                }
                ftrec_strategy::CprInterval::TargetPls { pls, mtbf_s } => {
                    ("none".to_string(), pls.to_string(), mtbf_s.to_string())
                }
            };
            vec![
                ("--ckpt-every-steps", every),
                ("--target-pls", pls),
                ("--mtbf-s", mtbf),
                (
                    "--cpr-priority",
                    or(priority.map(|p| p.to_string()), "none"),
                ),
                ("--cpr-r", r.to_string()),
                ("--cpr-saves-per-full", saves_per_full.to_string()),
                ("--cpr-ssu-period", ssu_period.to_string()),
                ("--cpr-tables", largest_tables.to_string()),
            ]
        }
        // No checkpoints, no record: never resumed.
        StrategyChoice::None | StrategyChoice::EcRec { .. } => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> RunConfig {
        let mut c = RunConfig::new(Preset::tiny(), "x".into(), "/tmp".into());
        c.strategy = StrategyChoice::parse("deck", 3).unwrap();
        c.seed = 11;
        c
    }

    fn err(a: &RunArgs) -> String {
        check(a, &rec(), "/s").unwrap_err().to_string()
    }

    #[test]
    fn data_flags_must_agree_with_the_recorded_data() {
        let dir = tempfile::tempdir().unwrap();
        let (a_file, b_file) = (dir.path().join("a.tsv"), dir.path().join("b.tsv"));
        std::fs::write(&a_file, "").unwrap();
        std::fs::write(&b_file, "").unwrap();
        let mut a = RunArgs::default();
        a.data.data = vec![a_file.clone()];
        // Synthetic record: no data flag at all.
        assert!(err(&a).contains("synthetic"), "{}", err(&a));
        let mut r = rec();
        let path = ftrec_data::DataPath::File(std::fs::canonicalize(&a_file).unwrap());
        r.data = Some(
            ftrec_data::TsvConfig::new(path, ftrec_data::Layout::Kaggle).with_rows_per_table(1000),
        );
        check(&a, &r, "/s").unwrap();
        a.data.rows_per_table = Some(1000);
        a.data.holdout_every = Some(ftrec_data::DEFAULT_HOLDOUT_EVERY);
        check(&a, &r, "/s").unwrap();
        a.data.rows_per_table = Some(999);
        let e = check(&a, &r, "/s").unwrap_err().to_string();
        assert!(e.contains("--rows-per-table 999"), "{e}");
        a.data.rows_per_table = None;
        a.data.data = vec![b_file];
        let e = check(&a, &r, "/s").unwrap_err().to_string();
        assert!(
            e.contains("--data") && e.contains("b.tsv") && e.contains("a.tsv"),
            "{e}"
        );
        a.data.data = vec![a_file];
        a.data.epochs = Some(2);
        let e = check(&a, &r, "/s").unwrap_err().to_string();
        assert!(e.contains("--epochs 2") && e.contains("is 1"), "{e}");
    }

    #[test]
    fn agreeing_flags_pass_and_contradicting_ones_name_the_flag_and_both_values() {
        let mut a = RunArgs {
            seed: Some(11),
            strategy: Some("deck".into()),
            delta_every_steps: Some(3),
            merge_stride: Some(2),
            servers: Some(5),
            ..Default::default()
        };
        check(&a, &rec(), "/s").unwrap();
        a.seed = Some(12);
        let e = err(&a);
        assert!(
            e.contains("--seed 12") && e.contains("is 11") && e.contains("/s"),
            "{e}"
        );
        a.seed = None;
        a.delta_every_steps = Some(4);
        let e = err(&a);
        assert!(
            e.contains("--delta-every-steps 4") && e.contains("is 3"),
            "{e}"
        );
        a.delta_every_steps = None;
        a.strategy = Some("full".into());
        let e = err(&a);
        assert!(
            e.contains("--strategy full") && e.contains("is deck"),
            "{e}"
        );
        let a = RunArgs {
            ckpt_every_steps: Some(3),
            ..Default::default()
        };
        let e = err(&a);
        assert!(
            e.contains("--ckpt-every-steps") && e.contains("deck"),
            "{e}"
        );
        let a = RunArgs {
            sync: false,
            opt: crate::flags::OptimizerArgs {
                optimizer: Some("sgd".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let e = err(&a);
        assert!(e.contains("--optimizer sgd"), "{e}");
        // The record's dense optimizer starts its accumulators at 0.
        let a = RunArgs {
            opt: crate::flags::OptimizerArgs {
                dense_initial_accumulator: Some(0.1),
                ..Default::default()
            },
            ..Default::default()
        };
        let e = err(&a);
        assert!(
            e.contains("--dense-initial-accumulator 0.1") && e.contains("is 0"),
            "{e}"
        );
    }

    #[test]
    fn every_saving_strategy_lists_the_flags_its_parameters_come_from() {
        for &name in StrategyChoice::all_names() {
            let c = StrategyChoice::parse(name, 7).unwrap();
            let flags = strategy_flags(&c);
            assert_eq!(flags.is_empty(), !c.uses_store(), "{name}");
            if c.uses_store() && name != "deck" {
                assert!(
                    flags.contains(&("--ckpt-every-steps", "7".to_string())),
                    "{name}: {flags:?}"
                );
            }
        }
    }
}
