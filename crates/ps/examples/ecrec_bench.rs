//! ECRec in the parameter server, measured in one process (same run, same workload, ratios
//! against no coding):
//! - per-step cost of difference propagation, 2PC and dense replication (k = 2 and 4);
//! - memory held for redundancy against (k + r) / k;
//! - per-server update load max/min with and without coding;
//! - a loss: time until the replacement takes part in steps again, steps/s while it rebuilds
//!   in the background against normal, time to the full rebuild, next to an in-memory
//!   stand-in for `full` recovery (reload every shard, redo half an interval).
//!
//! Servers are in-process (`EcNode`s with in-process peers), so the figures are CPU and
//! memory costs without network time; the multi-process figures come from the cluster.
//!
//! ```sh
//! cargo run --release -p ftrec-ps --example ecrec_bench -- [--steps 30] [--servers 6] [--step-ms 214]
//! ```
//!
//! The per-step ratio compares the same servers doing the same steps with and without coding,
//! one configuration after the other in blocks, best block each. Its baseline is only the
//! servers' own update work (no network, no MLP), so it overstates what ECRec adds to training
//! time; the bench also divides the added time *per server* (servers run in parallel in a
//! cluster) by a whole training step of `--step-ms` milliseconds, measured apart with
//! `ftrec bench train --preset small` (same batch and model).
//!
//! `--profile N` runs only k = 2, all on, for N steps (for `perf record`).

use std::time::Instant;

use ftrec_core::rng::SplitMix;
use ftrec_core::{Preset, ServerId, ShardMap, TableId, DENSE_BLOCK};
use ftrec_ec::{update_load, CodeKind, StripeLayout, ZipfTrace};
use ftrec_ps::ec::{EcClient, EcConfig, EcNode, EcService};
use ftrec_ps::{dense_value_range, PsError, Server, ServerConfig, Update};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn dense_len(p: &Preset) -> usize {
    let layers = |dims: &[usize]| -> usize { dims.windows(2).map(|w| w[0] * w[1] + w[1]).sum() };
    let mut top = vec![p.interaction_width()];
    top.extend(&p.mlp.top);
    let mut bottom = vec![p.dense_features()];
    bottom.extend(&p.mlp.bottom);
    layers(&bottom) + layers(&top)
}

/// One table's rows and gradients for one server.
type RowGrads = Vec<(u64, Vec<f32>)>;

struct Workload {
    preset: Preset,
    n: u32,
    dense_len: usize,
    dense_init: Vec<f32>,
    trace: ZipfTrace,
}

impl Workload {
    fn config(&self, s: u32) -> ServerConfig {
        ServerConfig::from_preset(&self.preset, ShardMap::new(self.n).unwrap(), ServerId(s), 7)
    }

    /// The batch's gradients, cut per server.
    fn shares(&self, step: u64) -> Vec<Update> {
        let dim = self.preset.dim;
        let map = ShardMap::new(self.n).unwrap();
        let mut g = SplitMix::keyed(3, step, 0);
        let mut per: Vec<Vec<RowGrads>> =
            vec![vec![Vec::new(); self.preset.table_rows.len()]; self.n as usize];
        for (t, r) in self.trace.step(step) {
            let grad = (0..dim).map(|_| (g.next_f32() - 0.5) * 0.01).collect();
            per[map.owner(t, r).0 as usize][t.0 as usize].push((r, grad));
        }
        let dense: Vec<f32> = (0..self.dense_len)
            .map(|_| (g.next_f32() - 0.5) * 0.01)
            .collect();
        per.into_iter()
            .enumerate()
            .map(|(s, tables)| {
                let mut u = Update::new();
                for (t, rows) in tables.into_iter().enumerate() {
                    if rows.is_empty() {
                        continue;
                    }
                    let ids = rows.iter().map(|(r, _)| *r).collect();
                    let grads = rows.into_iter().flat_map(|(_, g)| g).collect();
                    u = u.with_sparse(TableId(t as u32), ids, grads);
                }
                let range = dense_value_range(self.dense_len as u64, self.n, ServerId(s as u32));
                if range.start < range.end {
                    u = u.with_dense(
                        range.start,
                        dense[range.start as usize..range.end as usize].to_vec(),
                    );
                }
                u
            })
            .collect()
    }
}

struct Cluster {
    ec: EcConfig,
    nodes: Vec<Option<EcNode>>,
}

impl Cluster {
    fn new(w: &Workload, ec: EcConfig) -> Result<Self, PsError> {
        let nodes = (0..w.n)
            .map(|s| EcNode::new(w.config(s), &w.dense_init, ec).map(Some))
            .collect::<Result<Vec<_>, _>>()?;
        let c = Cluster { ec, nodes };
        c.wire()?;
        Ok(c)
    }

    fn wire(&self) -> Result<(), PsError> {
        let peers: Vec<Option<EcClient>> = self
            .nodes
            .iter()
            .map(|n| n.as_ref().map(EcClient::in_process))
            .collect();
        for n in self.nodes.iter().flatten() {
            n.set_peer_clients(peers.clone())?;
        }
        Ok(())
    }

    async fn step(&self, step: u64, shares: Vec<Update>) -> Result<(), PsError> {
        for (n, u) in self.nodes.iter().zip(shares) {
            n.as_ref()
                .expect("live")
                .shared()
                .write()?
                .stage_step(step, 0, u)?;
        }
        let nodes: Vec<&EcNode> = self.nodes.iter().flatten().collect();
        if self.ec.two_phase {
            for n in &nodes {
                EcService::prepare(*n, step, vec![0]).await?;
            }
            for n in &nodes {
                EcService::commit(*n, step).await?;
            }
        } else {
            for n in &nodes {
                EcService::apply_step(*n, step, vec![0]).await?;
            }
        }
        Ok(())
    }
}

async fn time_steps(
    w: &Workload,
    steps: u64,
    first: u64,
    mut run: impl AsyncStep,
) -> Result<f64, PsError> {
    // Gradients are generated outside the timed region.
    let batches: Vec<Vec<Update>> = (first..first + steps).map(|s| w.shares(s)).collect();
    let t = Instant::now();
    for (i, b) in batches.into_iter().enumerate() {
        run.step(first + i as u64, b).await?;
    }
    Ok(t.elapsed().as_secs_f64() / steps as f64)
}

trait AsyncStep {
    fn step(
        &mut self,
        step: u64,
        shares: Vec<Update>,
    ) -> impl std::future::Future<Output = Result<(), PsError>>;
}

struct Plain(Vec<Server>);

impl AsyncStep for &mut Plain {
    async fn step(&mut self, step: u64, shares: Vec<Update>) -> Result<(), PsError> {
        for (s, u) in self.0.iter_mut().zip(shares) {
            s.stage_step(step, 0, u)?;
        }
        for s in &mut self.0 {
            s.commit_step(step, &[0])?;
        }
        Ok(())
    }
}

impl AsyncStep for &Cluster {
    async fn step(&mut self, step: u64, shares: Vec<Update>) -> Result<(), PsError> {
        Cluster::step(self, step, shares).await
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let steps = arg("--steps", 30);
    let n = arg("--servers", 6) as u32;
    let preset = Preset::small();
    let dense_len = dense_len(&preset);
    let mut g = SplitMix::new(5);
    let dense_init: Vec<f32> = (0..dense_len).map(|_| (g.next_f32() - 0.5) * 0.1).collect();
    let trace = ZipfTrace::new(&preset.table_rows, preset.zipf_exponent, preset.batch, 11)?;
    let w = Workload {
        n,
        dense_len,
        dense_init,
        trace,
        preset: preset.clone(),
    };
    let distinct: usize = {
        let mut v = w.trace.step(0);
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    println!(
        "# ecrec_bench: preset {} ({} rows, dim {}, {} optimizer), {} dense values \
         ({} blocks), batch {} (~{} distinct rows/step), {n} servers, {steps} timed steps",
        preset.name,
        preset.total_rows(),
        preset.dim,
        preset.sparse_optimizer.name(),
        dense_len,
        dense_len.div_ceil(DENSE_BLOCK),
        preset.batch,
        distinct
    );

    // ---- per-step cost ----
    // Every configuration lives at once and they take turns, `ROUNDS` blocks each; the best
    // block counts, so a burst of load from elsewhere on the machine hits one block, not one
    // configuration.
    const ROUNDS: u64 = 5;
    let block = steps.div_ceil(ROUNDS).max(1);
    let mut plain = Plain(
        (0..n)
            .map(|s| Server::new(w.config(s), &w.dense_init))
            .collect::<Result<Vec<_>, _>>()?,
    );
    let mut labels = Vec::new();
    let mut clusters = Vec::new();
    for k in [2usize, 4] {
        for (label, dense, two_phase) in [
            ("all on", true, true),
            ("no dense replication", false, true),
            ("no dense replication, no 2PC", false, false),
        ] {
            let mut ec = EcConfig::new(CodeKind::Gf256, k, 1);
            ec.dense_replicas = usize::from(dense);
            ec.two_phase = two_phase;
            labels.push((k, label, dense && two_phase));
            clusters.push(Cluster::new(&w, ec)?);
        }
    }
    if let Some(i) = std::env::args().position(|a| a == "--profile") {
        // Only the first configuration (k = 2, all on), for a profiler.
        let n: u64 = std::env::args()
            .nth(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(200);
        let t = time_steps(&w, n, 1, &clusters[0]).await?;
        println!("profile: {:.2} ms/step", t * 1e3);
        return Ok(());
    }
    let mut best = vec![f64::MAX; clusters.len() + 1];
    let mut next = vec![1u64; clusters.len() + 1];
    for round in 0..=ROUNDS {
        // Round 0 warms up.
        let len = if round == 0 { 2 } else { block };
        let t = time_steps(&w, len, next[0], &mut plain).await?;
        next[0] += len;
        if round > 0 {
            best[0] = best[0].min(t);
        }
        for (i, c) in clusters.iter().enumerate() {
            let t = time_steps(&w, len, next[i + 1], c).await?;
            next[i + 1] += len;
            if round > 0 {
                best[i + 1] = best[i + 1].min(t);
            }
        }
    }
    let base = best[0];
    let step_ms = std::env::args()
        .position(|a| a == "--step-ms")
        .and_then(|i| std::env::args().nth(i + 1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(214.0);
    println!(
        "\n| config | ms/step (best of {ROUNDS} blocks of {block}) | overhead vs none | added ms per server | share of a {step_ms:.0} ms training step |\n| --- | --- | --- | --- | --- |"
    );
    println!("| none | {:.2} | - | - | - |", base * 1e3);
    let mut mem_rows = Vec::new();
    for (i, ((k, label, all_on), c)) in labels.iter().zip(&clusters).enumerate() {
        let t = best[i + 1];
        let added = (t - base) * 1e3 / f64::from(n);
        println!(
            "| ecrec gf256 k={k} r=1, {label} | {:.2} | {:+.1}% | {added:.2} | {:.2}% |",
            t * 1e3,
            (t / base - 1.0) * 100.0,
            100.0 * added / step_ms
        );
        if *all_on {
            let (mut red, mut model) = (0u64, 0u64);
            for node in c.nodes.iter().flatten() {
                let (r, m) = node.memory()?;
                red += r;
                model += m;
            }
            mem_rows.push((*k, (red + model) as f64 / model as f64));
        }
    }
    drop(clusters);

    // ---- memory ----
    println!("\n| k, r | memory (model + redundancy) / model | (k+r)/k |\n| --- | --- | --- |");
    for (k, ratio) in mem_rows {
        println!("| {k}, 1 | {ratio:.3} | {:.3} |", (k + 1) as f64 / k as f64);
    }

    // ---- update load ----
    println!("\n| layout | update load max/min |\n| --- | --- |");
    for k in [2usize, 4] {
        let layout = StripeLayout::new(n, k, 1, &preset.table_rows)?;
        let load = update_load(&layout, w.trace.steps(steps.max(20)))?;
        if k == 2 {
            println!("| no coding | {:.3} |", load.uncoded_imbalance());
        }
        println!("| k={k} r=1 | {:.3} |", load.coded_imbalance());
    }

    // ---- a loss ----
    println!(
        "\n| recovery (k=2 r=1, all on) | lock ranges | resume (join) ms | full rebuild ms | \
         steps/s during / normal | on-demand decodes |\n| --- | --- | --- | --- | --- | --- |"
    );
    for lock_ranges in [1usize, 10] {
        let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
        ec.lock_ranges = lock_ranges;
        let mut c = Cluster::new(&w, ec)?;
        time_steps(&w, 3, 1, &c).await?;
        let normal = time_steps(&w, steps, 4, &c).await?;
        let victim = 2u32;
        if let Some(v) = c.nodes[victim as usize].take() {
            v.kill();
        }
        // The replacement's process start and its fresh state are the cluster's; timed apart.
        let t_new = Instant::now();
        let node =
            EcNode::new_replacement(w.config(victim), &w.dense_init, ec, &[ServerId(victim)])?;
        let new_s = t_new.elapsed().as_secs_f64();
        c.nodes[victim as usize] = Some(node.clone());
        c.wire()?;
        let t0 = Instant::now();
        node.begin_rebuild(&[ServerId(victim)]).await?;
        let resume = t0.elapsed().as_secs_f64();
        let bg = node.clone();
        let rebuild = tokio::spawn(async move {
            let r = bg.rebuild_ranges(usize::MAX).await;
            (r, Instant::now())
        });
        let mut first = 4 + steps;
        let t_steps = Instant::now();
        let mut during = 0u64;
        while !rebuild.is_finished() {
            let b = w.shares(first);
            c.step(first, b).await?;
            first += 1;
            during += 1;
        }
        let steps_s = t_steps.elapsed().as_secs_f64();
        let (r, end) = rebuild.await?;
        r?;
        let full_rebuild = (end - t0).as_secs_f64();
        let st = node.rebuild_status()?;
        // Steps during the rebuild include generating their gradients; measure that apart.
        let t_gen = Instant::now();
        for s in 0..during.max(1) {
            std::hint::black_box(w.shares(first + s));
        }
        let gen = t_gen.elapsed().as_secs_f64() / during.max(1) as f64;
        let per_step_during = (steps_s / during.max(1) as f64 - gen).max(1e-9);
        println!(
            "| replacement built in {:.0} ms | {lock_ranges} | {:.1} | {:.1} | {:.2} ({during} steps) | {} |",
            new_s * 1e3,
            resume * 1e3,
            full_rebuild * 1e3,
            normal / per_step_during,
            st.rows_decoded_on_demand
        );
    }

    // ---- `full` stand-in ----
    let mut plain = Plain(
        (0..n)
            .map(|s| Server::new(w.config(s), &w.dense_init))
            .collect::<Result<Vec<_>, _>>()?,
    );
    let snapshot: Vec<Vec<ftrec_ps::RowBlock>> = plain
        .0
        .iter()
        .map(|s| {
            (0..preset.table_rows.len())
                .map(|t| {
                    let rows = s.shard(TableId(t as u32)).map_or(0, |x| x.rows());
                    s.export_rows(TableId(t as u32), 0..rows)
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let t = Instant::now();
    for (s, blocks) in plain.0.iter_mut().zip(&snapshot) {
        for b in blocks {
            s.import_rows(b)?;
        }
    }
    let reload = t.elapsed().as_secs_f64();
    let redo = 25.0 * base;
    println!(
        "\n`full` stand-in (in memory, no storage): reload every shard {:.1} ms + redo half of a \
         50-step interval {:.1} ms = {:.1} ms with training paused throughout",
        reload * 1e3,
        redo * 1e3,
        (reload + redo) * 1e3
    );
    Ok(())
}
