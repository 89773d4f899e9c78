//! ECRec over gRPC on loopback: the parameter-server and ECRec services share one socket per
//! server, difference propagation and recovery reads go server to server, a killed server is
//! rebuilt bit for bit; and degraded reads (ECRec §3.4) of lost rows on both transports.

mod ec_common;

use std::net::SocketAddr;

use ec_common::{config, dense_init, share, worker_update, EcCluster, Reference, WORKERS};
use ftrec_core::{ModelDigest, OptimizerKind, ServerId, TableId};
use ftrec_ec::CodeKind;
use ftrec_ps::ec::{audit_parities, ec_service, EcConfig, EcGrpcClient, EcNode, EcService};
use ftrec_ps::grpc::{ps_service, serve_routes, GrpcClient, GrpcConfig, Routes, ServeHandle};
use ftrec_ps::{InProcessClient, PsService, RowRequest};

struct Live {
    node: EcNode,
    handle: ServeHandle,
    addr: String,
}

async fn serve(node: EcNode) -> Live {
    let routes = Routes::new(ps_service(node.shared().clone(), GrpcConfig::default()))
        .add_service(ec_service(node.clone()));
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let handle = serve_routes(routes, any).await.unwrap();
    let addr = handle.local_addr().to_string();
    Live { node, handle, addr }
}

async fn set_all_peers(live: &[Option<Live>]) {
    let addrs: Vec<String> = live
        .iter()
        .map(|l| l.as_ref().map_or(String::new(), |l| l.addr.clone()))
        .collect();
    for l in live.iter().flatten() {
        EcGrpcClient::connect_lazy(&l.addr)
            .unwrap()
            .set_peers(addrs.clone())
            .await
            .unwrap();
    }
}

async fn grpc_step(live: &[Option<Live>], step: u64) {
    let n = live.len() as u32;
    let mut ps = Vec::new();
    let mut ec = Vec::new();
    for l in live.iter().flatten() {
        let addr: SocketAddr = l.addr.parse().unwrap();
        ps.push(
            GrpcClient::connect(addr, GrpcConfig::default())
                .await
                .unwrap(),
        );
        ec.push(EcGrpcClient::connect_lazy(&l.addr).unwrap());
    }
    for w in 0..WORKERS {
        let u = worker_update(step, w);
        for (s, c) in ps.iter().enumerate() {
            c.stage_step(step, w, share(&u, n, ServerId(s as u32)))
                .await
                .unwrap();
        }
    }
    let workers: Vec<u32> = (0..WORKERS).collect();
    for c in &ec {
        c.prepare(step, workers.clone()).await.unwrap();
    }
    for c in &ec {
        c.commit(step).await.unwrap();
    }
}

async fn grpc_digest(live: &[Option<Live>]) -> ModelDigest {
    let mut d = ModelDigest::new();
    for l in live.iter().flatten() {
        let addr: SocketAddr = l.addr.parse().unwrap();
        let c = GrpcClient::connect(addr, GrpcConfig::default())
            .await
            .unwrap();
        d.merge(&c.digest().await.unwrap());
    }
    d
}

#[tokio::test]
async fn a_killed_server_is_rebuilt_over_grpc() {
    let n = 4u32;
    let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
    ec.lock_ranges = 10;
    let opt = OptimizerKind::Adam;
    let mut live: Vec<Option<Live>> = Vec::new();
    for s in 0..n {
        live.push(Some(
            serve(EcNode::new(config(n, s, opt), &dense_init(), ec).unwrap()).await,
        ));
    }
    set_all_peers(&live).await;
    let mut reference = Reference::new(n, opt);
    for step in 1..=5 {
        grpc_step(&live, step).await;
        reference.step(step);
    }
    assert_eq!(grpc_digest(&live).await, reference.digest());

    // Kill server 1: its socket closes and its state is gone.
    let victim = live[1].take().unwrap();
    victim.node.kill();
    victim.handle.shutdown().await.unwrap();
    drop(victim.node);

    // Degraded read of a lost row on a survivor, over gRPC.
    let survivor = EcGrpcClient::connect_lazy(&live[0].as_ref().unwrap().addr).unwrap();
    // Table 0: row r lives on server r mod 4.
    let lost_rows: Vec<u64> = (0..23).filter(|r| r % 4 == 1).collect();
    let got = survivor
        .degraded_read(TableId(0), lost_rows.clone(), vec![ServerId(1)])
        .await
        .unwrap();
    let dim = ec_common::DIM;
    for (i, &r) in got.rows.iter().enumerate() {
        let want = &reference.servers[1].shard(TableId(0)).unwrap().row(r / 4)[..dim];
        assert_eq!(&got.values[i * dim..(i + 1) * dim], want, "row {r}");
    }

    // A replacement on a new port; every node learns its address; it rebuilds.
    let replacement =
        EcNode::new_replacement(config(n, 1, opt), &dense_init(), ec, &[ServerId(1)]).unwrap();
    live[1] = Some(serve(replacement).await);
    set_all_peers(&live).await;
    let rc = EcGrpcClient::connect_lazy(&live[1].as_ref().unwrap().addr).unwrap();
    rc.start_rebuild(vec![ServerId(1)], false).await.unwrap();
    let st = rc.rebuild_status().await.unwrap();
    assert!(st.finished, "{st:?}");
    assert_eq!(st.ranges_done, 10);
    assert_eq!(grpc_digest(&live).await, reference.digest());

    for step in 6..=8 {
        grpc_step(&live, step).await;
        reference.step(step);
    }
    assert_eq!(grpc_digest(&live).await, reference.digest());
    let clients: Vec<EcGrpcClient> = live
        .iter()
        .map(|l| EcGrpcClient::connect_lazy(&l.as_ref().unwrap().addr).unwrap())
        .collect();
    let node0 = &live[0].as_ref().unwrap().node;
    let audit = audit_parities(&clients, node0.layout(), node0.code())
        .await
        .unwrap();
    assert_eq!(audit.parity_mismatches, 0, "{audit:?}");
    assert_eq!(audit.replica_mismatches, 0, "{audit:?}");
}

#[tokio::test]
async fn pulls_from_a_replacement_decode_lost_rows_on_demand() {
    let mut c = EcCluster::new(
        5,
        EcConfig::new(CodeKind::Gf256, 3, 2),
        OptimizerKind::Momentum,
    );
    let mut reference = Reference::new(5, OptimizerKind::Momentum);
    for s in 1..=4 {
        c.step(s).await.unwrap();
        reference.step(s);
    }
    // Before any replacement: a survivor answers reads of the lost rows.
    c.kill(2);
    let table = TableId(3);
    let rows: Vec<u64> = (0..61).filter(|r| (r + 3) % 5 == 2).collect();
    let got = c
        .node(0)
        .degraded_read(table, &rows, &[ServerId(2)])
        .await
        .unwrap();
    let dim = ec_common::DIM;
    let want = |r: u64| reference.servers[2].shard(table).unwrap().row(r / 5)[..dim].to_vec();
    for (i, &r) in got.rows.iter().enumerate() {
        assert_eq!(
            got.values[i * dim..(i + 1) * dim].to_vec(),
            want(r),
            "row {r}"
        );
    }
    // A row that is not lost is refused, naming the problem.
    assert!(c
        .node(0)
        .degraded_read(table, &[0], &[ServerId(2)])
        .await
        .is_err());
    // The replacement answers pulls through the parameter-server service before its ranges
    // ran, decoding the rows on first access.
    let node = c.replace(2, &[2]);
    node.begin_rebuild(&[ServerId(2)]).await.unwrap();
    let ps = InProcessClient::new(node.shared().clone());
    let pulled = ps
        .pull_rows(vec![RowRequest {
            table,
            rows: rows.clone(),
        }])
        .await
        .unwrap();
    for (i, &r) in pulled[0].rows.iter().enumerate() {
        assert_eq!(pulled[0].values[i * dim..(i + 1) * dim].to_vec(), want(r));
    }
    let st = node.rebuild_status().unwrap();
    assert_eq!(st.rows_decoded_on_demand, rows.len() as u64, "{st:?}");
}
