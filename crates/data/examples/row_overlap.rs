//! How many embedding rows concurrent updates share on each parameter server: what any
//! per-row (or per-row-range) ordering of transactions could run in parallel.
//!
//! `cargo run --release -p ftrec-data --example row_overlap -- [preset] [servers] [in_flight]
//! [groups] [seed]` (defaults: small 5 15 20 1).
//!
//! The workers of an asynchronous job train consecutive global batches, so the updates in
//! flight at one moment are those of about `in_flight` consecutive batches. For `groups`
//! groups of that many consecutive batches of the preset's synthetic stream, rows sharded as
//! the servers shard them (row `R` of table `t` on server `(R + t) mod servers`), it prints
//! per server: the distinct rows one update touches there, the rows it shares with the update
//! just before it, how often two consecutive updates share no row there at all (the only
//! case in which a row-level lock lets them prepare at once), and the rows of an update that
//! some other update in flight also touches.

use std::collections::{HashMap, HashSet};
use std::process::ExitCode;

use ftrec_core::{Preset, ShardMap, TableId};
use ftrec_data::{Split, SyntheticSource};

struct Args {
    preset: Preset,
    servers: u32,
    in_flight: usize,
    groups: usize,
    seed: u64,
}

fn parse() -> Result<Args, String> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() > 5 {
        return Err(format!(
            "at most five arguments (preset servers in_flight groups seed), got {}",
            a.len()
        ));
    }
    let get = |i: usize, default: &str| a.get(i).cloned().unwrap_or_else(|| default.into());
    let number = |i: usize, what: &str, default: &str, min: u64| -> Result<u64, String> {
        let text = get(i, default);
        match text.parse::<u64>() {
            Ok(v) if v >= min => Ok(v),
            _ => Err(format!(
                "{what} must be a whole number of at least {min}, got {text:?}"
            )),
        }
    };
    let preset = Preset::by_name(&get(0, "small")).map_err(|e| e.to_string())?;
    let servers = number(1, "servers", "5", 1)?;
    let servers = u32::try_from(servers).map_err(|_| format!("servers {servers} is too many"))?;
    Ok(Args {
        preset,
        servers,
        in_flight: number(2, "in_flight", "15", 2)? as usize,
        groups: number(3, "groups", "20", 1)? as usize,
        seed: number(4, "seed", "1", 0)?,
    })
}

/// The distinct rows of one batch on each server, as (table, row).
fn rows_per_server(
    src: &SyntheticSource,
    map: &ShardMap,
    index: u64,
    batch: usize,
) -> Vec<HashSet<(u32, u64)>> {
    let (b, _) = src.batch_at(Split::Train, index * batch as u64, batch);
    let mut out = vec![HashSet::new(); map.servers() as usize];
    for (t, feature) in b.sparse.iter().enumerate() {
        for &row in &feature.ids {
            let s = map.owner(TableId(t as u32), row);
            out[s.0 as usize].insert((t as u32, row));
        }
    }
    out
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("row_overlap: {e}");
            return ExitCode::from(2);
        }
    };
    let src = match SyntheticSource::from_preset(&args.preset, args.seed) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("row_overlap: {e}");
            return ExitCode::from(2);
        }
    };
    let map = match ShardMap::new(args.servers) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("row_overlap: {e}");
            return ExitCode::from(2);
        }
    };
    let n = args.servers as usize;
    let batch = args.preset.batch;
    // Per server: sums over the updates measured.
    let mut distinct = vec![0u64; n];
    let mut with_previous = vec![0u64; n];
    let mut disjoint_pairs = vec![0u64; n];
    let mut with_any = vec![0u64; n];
    let (mut updates, mut pairs) = (0u64, 0u64);
    for g in 0..args.groups {
        let first = (g * args.in_flight) as u64;
        let group: Vec<Vec<HashSet<(u32, u64)>>> = (0..args.in_flight as u64)
            .map(|i| rows_per_server(&src, &map, first + i, batch))
            .collect();
        for s in 0..n {
            // How many updates of the group touch each row.
            let mut touched: HashMap<(u32, u64), u32> = HashMap::new();
            for u in &group {
                for r in &u[s] {
                    *touched.entry(*r).or_default() += 1;
                }
            }
            for (i, u) in group.iter().enumerate() {
                distinct[s] += u[s].len() as u64;
                with_any[s] += u[s].iter().filter(|r| touched[*r] > 1).count() as u64;
                if i > 0 {
                    let shared = u[s].intersection(&group[i - 1][s]).count() as u64;
                    with_previous[s] += shared;
                    disjoint_pairs[s] += u64::from(shared == 0);
                }
            }
        }
        updates += args.in_flight as u64;
        pairs += args.in_flight as u64 - 1;
    }
    println!(
        "{} (batch {batch}), {n} servers, {} groups of {} updates in flight, seed {}",
        args.preset.name, args.groups, args.in_flight, args.seed
    );
    println!(
        "server  distinct rows per update  shared with the update before  pairs sharing no row  \
         shared with another in flight"
    );
    for s in 0..n {
        let d = distinct[s] as f64 / updates as f64;
        let p = with_previous[s] as f64 / pairs as f64;
        let a = with_any[s] as f64 / updates as f64;
        println!(
            "{s:>6}  {d:>24.1}  {p:>18.1} ({:>5.1}%)  {:>11} of {pairs:<6}  {a:>19.1} ({:>5.1}%)",
            100.0 * p / d,
            disjoint_pairs[s],
            100.0 * a / d
        );
    }
    ExitCode::SUCCESS
}
