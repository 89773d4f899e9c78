//! The advisor: every calibrated strategy planned at the scenario ([`crate::model::plan`]),
//! simulated over days of failures, and ranked by expected overhead.

use serde::{Deserialize, Serialize};

use crate::model::{bytes, plan, plan_ec, secs, Calibration, Mechanism, Planned, Scenario};
use crate::sim::{simulate_many, Summary};
use crate::SimError;

/// One strategy at the scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ranked {
    pub strategy: String,
    pub plan: Planned,
    pub summary: Summary,
    /// Seconds lost per day, all causes.
    pub lost_per_day_s: f64,
}

/// The advice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    pub scenario: Scenario,
    /// Best first: feasible strategies by expected overhead, then the infeasible ones.
    pub ranking: Vec<Ranked>,
    pub best: Option<String>,
    pub why: String,
    /// What the reader must know before acting on the ranking (the best strategy costs more
    /// than the training itself, ...).
    #[serde(default)]
    pub warnings: Vec<String>,
}

fn simulate(p: &Planned, s: &Scenario) -> Result<Summary, SimError> {
    simulate_many(
        &p.job,
        s.dist,
        s.mtbf_server_s,
        s.days * 86_400.0,
        s.replicas,
        s.seed,
    )
}

/// Rank every strategy of `cal` at `s`.
pub fn advise(cal: &Calibration, s: &Scenario) -> Result<Advice, SimError> {
    s.validate()?;
    let mut ranking = Vec::new();
    for c in &cal.strategies {
        let (p, summary) = if c.mechanism == Mechanism::ErasureCoded {
            // ECRec §4: k trades memory for rebuild time, r the tolerated concurrent losses.
            // Every code that fits is simulated; the best is kept, the others named.
            // ECRec §4's second layer prices its saves and reloads as `full` measured them.
            let backstop = cal
                .get("full")
                .filter(|f| f.save_eff.is_some() && f.reload_eff.is_some());
            let mut best: Option<(Planned, Summary)> = None;
            let mut tried = Vec::new();
            let mut first_infeasible = None;
            for r in [1u32, 2] {
                for k in [2u32, 4, 8, 16] {
                    let p = plan_ec(c, s, k, r, backstop)?;
                    if !p.feasible {
                        first_infeasible.get_or_insert(p);
                        continue;
                    }
                    let sum = simulate(&p, s)?;
                    tried.push(format!("k={k} r={r}: {}", pct(sum.overhead)));
                    if best.as_ref().is_none_or(|b| sum.overhead < b.1.overhead) {
                        best = Some((p, sum));
                    }
                }
            }
            match best {
                Some((mut p, sum)) => {
                    p.notes
                        .push(format!("codes simulated: {}", tried.join(", ")));
                    (p, sum)
                }
                None => (
                    first_infeasible.expect("at least one code planned"),
                    Summary::default(),
                ),
            }
        } else {
            let p = plan(c, s)?;
            let sum = simulate(&p, s)?;
            (p, sum)
        };
        let lost = summary.per_day.total();
        ranking.push(Ranked {
            strategy: c.strategy.clone(),
            plan: p,
            summary,
            lost_per_day_s: lost,
        });
    }
    ranking.sort_by(|a, b| {
        b.plan
            .feasible
            .cmp(&a.plan.feasible)
            .then(a.summary.overhead.total_cmp(&b.summary.overhead))
    });
    let best = ranking
        .iter()
        .find(|r| r.plan.feasible && r.summary.overhead.is_finite())
        .map(|r| r.strategy.clone());
    let why = explain(&ranking, s);
    let mut warnings = Vec::new();
    if let Some(b) = ranking
        .iter()
        .find(|r| Some(&r.strategy) == best.as_ref())
        .filter(|b| b.summary.overhead > crate::trust::ABSURD_OVERHEAD)
    {
        warnings.push(format!(
            "the best strategy here, {}, is predicted to cost {} of the training time, more \
             than the training itself: no strategy suits this cluster as calibrated (check the \
             calibration, the MTBF and the bandwidths before acting on the ranking)",
            b.strategy,
            pct(b.summary.overhead)
        ));
    }
    Ok(Advice {
        scenario: s.clone(),
        ranking,
        best,
        why,
        warnings,
    })
}

fn pct(x: f64) -> String {
    if x.is_finite() && x < 10.0 {
        format!("{:.1}%", x * 100.0)
    } else {
        "over 1000% (it keeps starting over)".into()
    }
}

/// The largest term of a strategy's daily loss, in words.
fn main_cost(r: &Ranked) -> String {
    let d = &r.summary.per_day;
    let mut terms = [
        ("saves", d.save),
        ("reloads", d.load),
        ("lost work", d.lost),
        ("rescheduling", d.res),
        ("degraded throughput", d.degraded),
        ("slower steps", d.steady),
    ];
    terms.sort_by(|a, b| b.1.total_cmp(&a.1));
    format!("{} ({}/day)", terms[0].0, secs(terms[0].1))
}

fn explain(ranking: &[Ranked], s: &Scenario) -> String {
    let fails = s.servers as f64 * 86_400.0 / s.mtbf_server_s;
    let mut why = format!(
        "{} servers with a {} MTBF each: {fails:.1} failures a day, one every {} (job MTBF). ",
        s.servers,
        secs(s.mtbf_server_s),
        secs(s.t_fail())
    );
    let ok: Vec<&Ranked> = ranking
        .iter()
        .filter(|r| r.plan.feasible && r.summary.overhead.is_finite())
        .collect();
    match ok.first() {
        None => why += "No strategy finishes: failures come faster than any recovers.",
        Some(b) => {
            why += &format!(
                "{} is best at {} expected overhead; its largest cost is {}.",
                b.strategy,
                pct(b.summary.overhead),
                main_cost(b)
            );
            if !b.plan.exact {
                why += &format!(
                    " It is approximate: expected PLS {:.4} (CPR Eq. 4).",
                    b.summary.pls
                );
            }
            if b.summary.backstop_restores_per_day > 0.0 {
                why += &format!(
                    " It restores its backstop checkpoint {:.3} times a day (more servers lost \
                     at once than it tolerates).",
                    b.summary.backstop_restores_per_day
                );
            }
            if b.summary.unrecoverable_per_day > 0.0 {
                why += &format!(
                    " It loses everything {:.3} times a day (more servers lost at once than \
                     it tolerates).",
                    b.summary.unrecoverable_per_day
                );
            }
            if b.plan.extra_memory_bytes_per_server > 0.0 {
                why += &format!(
                    " It needs {} more memory per server.",
                    bytes(b.plan.extra_memory_bytes_per_server)
                );
            }
            for r in ok.iter().skip(1) {
                why += &format!(
                    " {}: {} (mostly {}).",
                    r.strategy,
                    pct(r.summary.overhead),
                    main_cost(r)
                );
            }
        }
    }
    for r in ranking.iter().filter(|r| !r.plan.feasible) {
        why += &format!(
            " {} does not fit: {}.",
            r.strategy,
            r.plan.why_not.as_deref().unwrap_or("infeasible")
        );
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Coefficients, Machine, Measured, MeasuredFailure};
    use crate::FailureDist;

    fn machine() -> Machine {
        Machine {
            disk_write_bps: 2e9,
            disk_read_bps: 1e9,
            net_bps: 3e9,
        }
    }

    fn measured(name: &str) -> Measured {
        let failure = MeasuredFailure {
            at_step: 25,
            detect_s: 0.03,
            replace_s: 0.1,
            reload_s: 0.4,
            window_s: 1.4,
            steps_redone: 5,
            window_share: 1.0,
            ..Default::default()
        };
        let mut m = Measured {
            strategy: name.into(),
            model_bytes: 70e6,
            servers: 3,
            workers: 2,
            steps: 60,
            train_s: 20.0,
            baseline_train_s: 20.0,
            save_every_steps: Some(10),
            save_pauses_s: vec![0.5; 6],
            full_saves: 6,
            bytes_written: 6.0 * 70e6,
            failures: vec![failure],
            extra_memory: None,
            stored_bytes: 70e6,
            code: None,
        };
        match name {
            "none" => {
                m.save_every_steps = None;
                m.save_pauses_s.clear();
                m.full_saves = 0;
                m.bytes_written = 0.0;
                m.failures.clear();
                m.stored_bytes = 0.0;
            }
            "deck" => {
                m.save_pauses_s = vec![0.2, 0.04, 0.04, 0.04, 0.04, 0.04];
                m.full_saves = 1;
                m.bytes_written = 70e6 + 5.0 * 10e6;
            }
            "ecrec" => {
                m.save_every_steps = None;
                m.save_pauses_s.clear();
                m.full_saves = 0;
                m.bytes_written = 0.0;
                m.failures[0].steps_redone = 0;
                m.failures[0].window_s = 3.5;
                m.failures[0].window_share = 0.7;
                m.failures[0].reload_s = 0.15;
                m.train_s = 21.0;
                m.code = Some((2, 1));
                m.extra_memory = Some(0.527);
                m.stored_bytes = 0.0;
            }
            _ => {}
        }
        m
    }

    fn scenario() -> Scenario {
        Scenario {
            model_bytes: 1e12,
            servers: 100,
            workers: 100,
            step_s: 0.2,
            mtbf_server_s: 24.0 * 3_600.0,
            dist: FailureDist::Exponential,
            disk_bps: 2e9,
            net_bps: 25e9 / 8.0,
            memory_headroom: 0.5,
            reschedule_s: None,
            touched_per_step: None,
            target_pls: 0.1,
            days: 2.0,
            replicas: 4,
            seed: 1,
        }
    }

    #[test]
    fn calibration_recovers_the_measured_throughputs() {
        let c = Coefficients::from_measured(&measured("full"), &machine()).unwrap();
        assert_eq!(c.mechanism, Mechanism::Full);
        // 70 MB in 0.5 s against a 2 GB/s disk.
        assert!((c.save_eff.unwrap() - 0.07).abs() < 1e-12);
        // 70 MB reloaded in 0.4 s against 1 GB/s.
        assert!((c.reload_eff.unwrap() - 0.175).abs() < 1e-12);
        let d = Coefficients::from_measured(&measured("deck"), &machine()).unwrap();
        assert_eq!(d.mechanism, Mechanism::Delta);
        // A 10 MB delta of a 70 MB model every 10 steps: 1 - (1 - u)^10 = 1/7.
        let u = d.touched_per_step.unwrap();
        assert!((1.0 - (1.0 - u).powi(10) - 1.0 / 7.0).abs() < 1e-12);
        let e = Coefficients::from_measured(&measured("ecrec"), &machine()).unwrap();
        assert_eq!(e.mechanism, Mechanism::ErasureCoded);
        // k * shard = 2 * 70/3 MB rebuilt in 3.5 s over a 3 GB/s network.
        assert!((e.rebuild_eff.unwrap() - 2.0 * 70e6 / 3.0 / 3.5 / 3e9).abs() < 1e-15);
        // 21 s - stall 0.28 s - 3.5 s * 0.3 degraded, over 20 s.
        assert!((e.steady_raw - (21.0 - 0.28 - 1.05) / 20.0 + 1.0).abs() < 1e-12);
    }

    /// The scenario: 1 TB on 100 servers, 24 h per-server MTBF. Every strategy gets a
    /// finite, ranked number except `none`, which cannot finish with 100 failures a day.
    #[test]
    fn a_terabyte_on_a_hundred_servers_is_ranked() {
        let runs: Vec<Measured> = ["none", "full", "deck", "ecrec"]
            .iter()
            .map(|n| measured(n))
            .collect();
        let cal = Calibration::from_runs(machine(), &runs).unwrap();
        let a = advise(&cal, &scenario()).unwrap();
        assert_eq!(a.ranking.len(), 4);
        let none = a.ranking.iter().find(|r| r.strategy == "none").unwrap();
        assert!(none.summary.overhead > 10.0, "{:?}", none.summary);
        assert_eq!(a.ranking.last().unwrap().strategy, "none");
        let best = a.best.as_deref().unwrap();
        assert_ne!(best, "none");
        for r in &a.ranking {
            assert!((r.summary.failures_per_day - 100.0).abs() < 15.0, "{r:?}");
        }
        for name in ["full", "deck"] {
            let r = a.ranking.iter().find(|r| r.strategy == name).unwrap();
            assert!(
                r.summary.overhead.is_finite() && r.summary.overhead < 10.0,
                "{r:?}"
            );
            assert_eq!(r.summary.unrecoverable_per_day, 0.0);
        }
        // This calibration rebuilds slowly (minutes for a 10 GB shard): more than r failures
        // within a window come several times a day. ECRec alone then loses everything; with
        // a backstop priced as `full` saves and reloads (ECRec §4's second layer) it restores
        // that instead and stays in the ranking with a finite overhead.
        let ec = a.ranking.iter().find(|r| r.strategy == "ecrec").unwrap();
        assert_eq!(ec.summary.unrecoverable_per_day, 0.0, "{ec:?}");
        assert!(ec.summary.backstop_restores_per_day > 0.0, "{ec:?}");
        assert!(
            ec.summary.overhead.is_finite() && ec.summary.overhead < 10.0,
            "{ec:?}"
        );
        assert!(
            ec.plan.config.contains("backstop") && ec.plan.config.contains("--ckpt-every-steps"),
            "{}",
            ec.plan.config
        );
        // Without `full` in the calibration there is nothing to price a backstop with.
        let alone: Vec<Measured> = ["none", "ecrec"].iter().map(|n| measured(n)).collect();
        let cal_alone = Calibration::from_runs(machine(), &alone).unwrap();
        let b = advise(&cal_alone, &scenario()).unwrap();
        let ec = b.ranking.iter().find(|r| r.strategy == "ecrec").unwrap();
        assert!(ec.summary.unrecoverable_per_day > 0.0, "{ec:?}");
        assert!(a.why.contains(best), "{}", a.why);
        // Full checkpoints save at Young's interval.
        let full = a.ranking.iter().find(|r| r.strategy == "full").unwrap();
        assert!(full.plan.config.contains("Young"), "{}", full.plan.config);
    }

    /// Without memory headroom ECRec does not fit, and says why.
    #[test]
    fn ecrec_without_headroom_is_infeasible_and_ranked_last_of_the_feasible() {
        let cal =
            Calibration::from_runs(machine(), &[measured("full"), measured("ecrec")]).unwrap();
        let mut s = scenario();
        s.memory_headroom = 0.05;
        let a = advise(&cal, &s).unwrap();
        let ec = a.ranking.last().unwrap();
        assert_eq!(ec.strategy, "ecrec");
        assert!(!ec.plan.feasible);
        assert!(ec.plan.why_not.as_deref().unwrap().contains("memory"));
        assert_eq!(a.best.as_deref(), Some("full"));
    }

    /// ECRec's rebuild yields to training: priced at its own working time when the run
    /// measured it (the rate a rebuild at full speed has), at its whole window otherwise, and
    /// the plan says which.
    #[test]
    fn ecrec_s_rebuild_is_priced_at_its_unthrottled_working_rate_and_says_so() {
        let mut m = measured("ecrec");
        let throttled = Coefficients::from_measured(&m, &machine()).unwrap();
        assert!(throttled
            .rebuild_rate
            .as_deref()
            .unwrap()
            .contains("throttled"));
        // 3.5 s of window, of which the rebuild worked 0.35 s with training at 40% meanwhile.
        m.failures[0].rebuild_busy_s = Some(0.35);
        m.failures[0].rebuild_busy_share = Some(0.4);
        let c = Coefficients::from_measured(&m, &machine()).unwrap();
        let rate = c.rebuild_rate.as_deref().unwrap();
        assert!(rate.contains("unthrottled"), "{rate}");
        let ratio = c.rebuild_eff.unwrap() / throttled.rebuild_eff.unwrap();
        assert!((ratio - 10.0).abs() < 1e-9, "{ratio}");
        assert!((c.degraded_share.unwrap() - 0.4).abs() < 1e-12);
        let p = plan_ec(&c, &scenario(), 2, 1, None).unwrap();
        assert!(
            p.config.contains("priced at the unthrottled rate"),
            "{}",
            p.config
        );
    }

    /// A cluster whose failures come almost as fast as a save: whatever ranks first costs more
    /// than the training, and the advice says so next to it.
    #[test]
    fn a_best_strategy_over_100_percent_comes_with_a_warning() {
        let runs: Vec<Measured> = ["none", "full"].iter().map(|n| measured(n)).collect();
        let cal = Calibration::from_runs(machine(), &runs).unwrap();
        let mut s = scenario();
        s.mtbf_server_s = 3_000.0;
        s.disk_bps = 2e7;
        s.net_bps = 2e7;
        let a = advise(&cal, &s).unwrap();
        let best = a
            .ranking
            .iter()
            .find(|r| Some(&r.strategy) == a.best.as_ref());
        match best {
            Some(b) if b.summary.overhead > 1.0 => {
                assert_eq!(a.warnings.len(), 1, "{a:?}");
                assert!(a.warnings[0].contains(&b.strategy), "{:?}", a.warnings);
            }
            other => panic!("the scenario should make the best cost over 100%: {other:?}"),
        }
        // The terabyte scenario's best is well under 100%: no warning.
        let cal = Calibration::from_runs(machine(), &runs).unwrap();
        assert!(advise(&cal, &scenario()).unwrap().warnings.is_empty());
    }

    #[test]
    fn a_calibration_without_a_failure_says_what_is_missing() {
        let mut m = measured("full");
        m.failures.clear();
        let cal = Calibration::from_runs(machine(), &[m]).unwrap();
        let e = advise(&cal, &scenario()).unwrap_err();
        assert!(
            matches!(e, SimError::Calibration(ref w) if w.contains("reload")),
            "{e}"
        );
    }
}
