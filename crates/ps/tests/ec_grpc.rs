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
use ftrec_ps::{InProcessClient, PsError, PsService, RowRequest};

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

/// Both transports of one node's parameter-server service.
async fn both_transports(node: &EcNode) -> (Live, InProcessClient, GrpcClient) {
    let live = serve(node.clone()).await;
    let grpc = GrpcClient::connect(
        live.addr.parse::<std::net::SocketAddr>().unwrap(),
        GrpcConfig::default(),
    )
    .await
    .unwrap();
    (live, InProcessClient::new(node.shared().clone()), grpc)
}

fn refused(r: Result<impl std::fmt::Debug, PsError>, what: &str) {
    assert!(
        matches!(&r, Err(PsError::Refused { what: w, reason }) if w.contains(what) && reason.contains("parit")),
        "{what}: {r:?}"
    );
}

#[tokio::test]
async fn writes_that_would_bypass_difference_propagation_are_refused() {
    // ECRec §3.2: a row changes only together with its parities. The plain service's push,
    // commit and imports would change rows (and dense blocks) without them.
    let c = EcCluster::new(3, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Adam);
    let mut reference = Reference::new(3, OptimizerKind::Adam);
    c.step(1).await.unwrap();
    reference.step(1);
    let node = c.node(0);
    let (_live, local, grpc) = both_transports(node).await;
    let mine = share(&worker_update(2, 0), 3, ServerId(0));
    let rows = node
        .shared()
        .read()
        .unwrap()
        .export_rows(TableId(0), 0..2)
        .unwrap();
    let mut bumped = rows.clone();
    bumped.data.iter_mut().for_each(|x| *x += 1.0);
    let blocks = node.shared().read().unwrap().dense_blocks();
    let dense = node.shared().read().unwrap().export_dense(blocks).unwrap();
    async fn all<S: PsService>(
        s: &S,
        mine: &ftrec_ps::Update,
        bumped: &ftrec_ps::RowBlock,
        dense: &ftrec_ps::DenseBlock,
    ) {
        refused(s.push(mine.clone()).await, "push");
        refused(s.import_rows(bumped.clone()).await, "import");
        refused(s.import_dense(dense.clone()).await, "import");
        // Staging is how synchronous workers hand in their gradients; the commit of a staged
        // step must go through the ECRec service's two phases.
        s.stage_step(2, 0, mine.clone()).await.unwrap();
        refused(s.commit_step(2, vec![0]).await, "commit");
        assert_eq!(s.abort_step(2).await.unwrap(), 1);
    }
    all(&local, &mine, &bumped, &dense).await;
    all(&grpc, &mine, &bumped, &dense).await;
    // Nothing changed: the model is the reference's and every parity is exact.
    assert_eq!(c.digest(), reference.digest());
    let audit = c.audit().await;
    assert_eq!((audit.parity_mismatches, audit.replica_mismatches), (0, 0));
}

#[tokio::test]
async fn a_replacement_refuses_service_until_it_is_ready() {
    // A replacement starts with seeded rows: none of them may be served as the model until
    // its rebuild has made them current (ECRec §3.4).
    let mut c = EcCluster::new(4, EcConfig::new(CodeKind::Gf256, 2, 1), OptimizerKind::Adam);
    let mut reference = Reference::new(4, OptimizerKind::Adam);
    for s in 1..=3 {
        c.step(s).await.unwrap();
        reference.step(s);
    }
    c.kill(1);
    let node = c.replace(1, &[1]);
    let (_live, local, grpc) = both_transports(&node).await;
    // Table 0: row r lives on server r mod 4.
    let pull = vec![RowRequest {
        table: TableId(0),
        rows: vec![1, 5, 9],
    }];
    let dense_range = grpc.info().await.unwrap().dense_range;
    async fn not_ready<S: PsService>(s: &S, pull: &[RowRequest], dense: std::ops::Range<u64>) {
        let r = s.pull_rows(pull.to_vec()).await;
        assert!(matches!(&r, Err(e) if e.is_retryable()), "pull: {r:?}");
        let r = s.pull_dense(dense).await;
        assert!(
            matches!(&r, Err(PsError::NotReady { server: 1, .. })),
            "{r:?}"
        );
        let r = s
            .stage_step(4, 0, share(&worker_update(4, 0), 4, ServerId(1)))
            .await;
        assert!(matches!(&r, Err(PsError::NotReady { .. })), "{r:?}");
        let r = s.digest().await;
        assert!(matches!(&r, Err(PsError::NotReady { .. })), "{r:?}");
        let r = s.export_rows(TableId(0), 0..1).await;
        assert!(matches!(&r, Err(PsError::NotReady { .. })), "{r:?}");
    }
    not_ready(&local, &pull, dense_range.clone()).await;
    not_ready(&grpc, &pull, dense_range.clone()).await;
    // Joined (dense part copied, rows decoded on demand): pulls serve current rows, but the
    // shard as a whole (digest, exports) waits for the end of the rebuild.
    node.begin_rebuild(&[ServerId(1)]).await.unwrap();
    let pulled = grpc.pull_rows(pull.clone()).await.unwrap();
    let dim = ec_common::DIM;
    for (i, &r) in pulled[0].rows.iter().enumerate() {
        let want = &reference.servers[1].shard(TableId(0)).unwrap().row(r / 4)[..dim];
        assert_eq!(&pulled[0].values[i * dim..(i + 1) * dim], want, "row {r}");
    }
    assert!(grpc.pull_dense(dense_range).await.is_ok());
    assert!(matches!(grpc.digest().await, Err(PsError::NotReady { .. })));
    assert!(node.rebuild_ranges(usize::MAX).await.unwrap());
    assert_eq!(grpc_digest_of(&[&local]).await, {
        let mut d = ModelDigest::new();
        d.merge(&reference.servers[1].digest());
        d
    });
    assert!(grpc.digest().await.is_ok());
}

async fn grpc_digest_of<S: PsService>(servers: &[&S]) -> ModelDigest {
    let mut d = ModelDigest::new();
    for s in servers {
        d.merge(&s.digest().await.unwrap());
    }
    d
}

#[tokio::test]
async fn a_peer_that_never_answers_fails_the_call_instead_of_hanging() {
    // A socket that accepts connections and never says a word: a hung peer process.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_addr = hung.local_addr().unwrap().to_string();
    let mut ec = EcConfig::new(CodeKind::Gf256, 2, 1);
    // Short, so the silent peer fails the calls soon; long against what a live in-process
    // peer takes on a loaded machine, since the same config serves the rebuild once the
    // peers answer.
    ec.peer_timeout = std::time::Duration::from_secs(1);
    let c = EcCluster::new(3, ec, OptimizerKind::Adam);
    c.step(1).await.unwrap();
    // Server 0's peers 1 and 2 hang: its deltas of step 2 cannot be delivered.
    c.node(0)
        .set_peer_addrs(&[String::new(), hung_addr.clone(), hung_addr.clone()])
        .unwrap();
    c.stage(2).unwrap();
    // The outer bound only keeps a broken build from hanging the test run.
    let guard = std::time::Duration::from_secs(60);
    let r = tokio::time::timeout(
        guard,
        EcService::prepare(c.node(0), 2, EcCluster::workers()),
    )
    .await
    .expect("phase 1 waited for ever on a silent peer");
    assert!(
        matches!(&r, Err(PsError::Unavailable { addr, reason }) if addr == &hung_addr && reason.contains("no answer")),
        "{r:?}"
    );
    // A replacement whose survivors hang: its rebuild fails with the same error and can be
    // started again (the strategy's retry) once the peers answer.
    let mut c = EcCluster::new(3, ec, OptimizerKind::Adam);
    c.step(1).await.unwrap();
    c.kill(2);
    let node = c.replace(2, &[2]);
    node.set_peer_addrs(&[hung_addr.clone(), hung_addr.clone(), String::new()])
        .unwrap();
    let r = tokio::time::timeout(guard, node.start_rebuild(&[ServerId(2)], false))
        .await
        .expect("the rebuild waited for ever on silent peers");
    assert!(matches!(&r, Err(PsError::Unavailable { .. })), "{r:?}");
    assert!(node.rebuild_status().unwrap().error.is_some());
    c.wire_peers();
    node.start_rebuild(&[ServerId(2)], false).await.unwrap();
    assert!(node.rebuild_status().unwrap().finished);
    drop(hung);
}
