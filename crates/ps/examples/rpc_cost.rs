//! The CPU one gRPC round trip costs on this machine: `n` `Info` calls one after another from
//! a task of a two-thread runtime to a running `ftrec server`, with the CPU time this process
//! and the server's process spent, per call.
//!
//! ```sh
//! target/release/ftrec server --id 0 --servers 1 --preset small --port-file p.port & pid=$!
//! while [ ! -s p.port ]; do sleep 0.1; done
//! cargo run --release -p ftrec-ps --example rpc_cost -- "$(cat p.port)" "$pid" 20000
//! kill "$pid"
//! ```

use ftrec_ps::grpc::{GrpcClient, GrpcConfig};
use ftrec_ps::service::PsService;

/// User and system CPU seconds of process `pid` so far (`/proc/PID/stat`).
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("no process {pid}: {e}"));
    // The fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: rpc_cost ADDR SERVER_PID CALLS";
    let addr: std::net::SocketAddr = args.get(1).expect(usage).trim().parse().expect(usage);
    let server: u32 = args.get(2).expect(usage).parse().expect(usage);
    let n: usize = args.get(3).expect(usage).parse().expect(usage);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(rt.spawn(async move {
        let c = GrpcClient::connect(addr, GrpcConfig::default())
            .await
            .unwrap();
        let me = std::process::id();
        let (c0, s0, t0) = (cpu_s(me), cpu_s(server), std::time::Instant::now());
        for _ in 0..n {
            c.info().await.unwrap();
        }
        let (c1, s1) = (cpu_s(me), cpu_s(server));
        let per = |x: f64| x * 1e6 / n as f64;
        println!(
            "{n} calls: {:.1} us wall, client {:.1} us CPU, server {:.1} us CPU per call",
            per(t0.elapsed().as_secs_f64()),
            per(c1 - c0),
            per(s1 - s0)
        );
    }))
    .unwrap();
}
