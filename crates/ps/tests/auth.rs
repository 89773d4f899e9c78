//! Who may call a server, over gRPC on loopback: a server started with a token refuses a client
//! without it and one with a wrong token on every service (parameter server, ECRec,
//! checkpoint) and serves the right one; a job-id mismatch is refused naming both ids; the
//! server-wide in-flight limit and the message size limit refuse with a clear status; a
//! replaced process (an older incarnation) is refused by every service and learns it is fenced.

mod ec_common;

use std::net::SocketAddr;

use ec_common::{config, dense_init};
use ftrec_ckpt::deck::StagingOptions;
use ftrec_ckpt::location::LocationOptions;
use ftrec_ckpt::CheckpointId;
use ftrec_core::OptimizerKind;
use ftrec_ec::CodeKind;
use ftrec_ps::auth::{Auth, JobId, ServeOptions, Token};
use ftrec_ps::ckpt::grpc::{ckpt_service, CkptGrpcClient};
use ftrec_ps::ckpt::{CkptApi, CkptNode, CkptServiceError};
use ftrec_ps::ec::{ec_service, EcConfig, EcGrpcClient, EcNode, EcService};
use ftrec_ps::fence::{FenceRole, Fences, Incarnation};
use ftrec_ps::grpc::proto::parameter_server_client::ParameterServerClient;
use ftrec_ps::grpc::proto::{self, InfoRequest};
use ftrec_ps::grpc::{ps_service, serve_routes_with, GrpcClient, GrpcConfig, Routes, ServeHandle};
use ftrec_ps::{PsError, PsService, Server, SharedServer};

fn auth(token: Option<&str>, job: Option<&str>) -> Auth {
    Auth {
        token: token.map(|t| Token::new(t, "test").unwrap()),
        job: job.map(|j| JobId::new(j).unwrap()),
        tls: None,
        fences: Default::default(),
    }
}

/// One server with all three services on one socket, demanding `options.auth`.
async fn serve_all(options: ServeOptions, staging: &std::path::Path) -> ServeHandle {
    let node = EcNode::new(
        config(3, 0, OptimizerKind::Adagrad),
        &dense_init(),
        EcConfig::new(CodeKind::Gf256, 2, 1),
    )
    .unwrap();
    let ckpt = CkptNode::new(
        node.shared().clone(),
        StagingOptions::new(staging.to_path_buf()),
        LocationOptions::default(),
    )
    .unwrap();
    let routes = Routes::new(ps_service(node.shared().clone(), GrpcConfig::default()))
        .add_service(ec_service(node))
        .add_service(ckpt_service(ckpt));
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    serve_routes_with(routes, any, &options).await.unwrap()
}

/// What each service says to a client proving `client`: `Ok(())` or the refusal's
/// (code, message), once per service.
async fn verdicts(addr: SocketAddr, client: &Auth) -> Vec<Result<(), (String, String)>> {
    let ps = match GrpcClient::connect_with(addr, GrpcConfig::default(), client).await {
        // `connect` reads the server's shape: a refusal comes back from it.
        Ok(c) => c.info().await.map(|_| ()),
        Err(e) => Err(e),
    };
    let ps = ps.map_err(|e| match e {
        PsError::Rpc { code, message } => (code, message),
        other => ("other".to_string(), other.to_string()),
    });
    let ec = EcGrpcClient::connect_lazy_with(&addr.to_string(), client)
        .unwrap()
        .rebuild_status()
        .await
        .map(|_| ())
        .map_err(|e| match e {
            PsError::Rpc { code, message } => (code, message),
            other => ("other".to_string(), other.to_string()),
        });
    let c = CkptGrpcClient::connect_with(addr, client).await.unwrap();
    let ck = match c.wait(CheckpointId::new("probe").unwrap()).await {
        // The service answered (there is no such save): the request was let through.
        Ok(_) | Err(CkptServiceError::UnknownSave { .. }) => Ok(()),
        Err(CkptServiceError::Remote { code, message }) => Err((code, message)),
        Err(other) => Err(("other".to_string(), other.to_string())),
    };
    vec![ps, ec, ck]
}

fn temp(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("ftrec-ps-auth-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_refuses_a_missing_or_wrong_token_and_serves_the_right_one() {
    let dir = temp("token");
    let server_auth = auth(Some("right-token"), Some("job-a"));
    let h = serve_all(ServeOptions::with_auth(server_auth.clone()), &dir).await;
    let addr = h.local_addr();

    for v in verdicts(addr, &auth(None, Some("job-a"))).await {
        let (code, msg) = v.unwrap_err();
        assert_eq!(code, "Unauthenticated", "{msg}");
        assert!(msg.contains("missing auth token"), "{msg}");
    }
    for v in verdicts(addr, &auth(Some("wrong-token"), Some("job-a"))).await {
        let (code, msg) = v.unwrap_err();
        assert_eq!(code, "Unauthenticated", "{msg}");
        assert!(msg.contains("wrong auth token"), "{msg}");
    }
    // A prefix of the right token is wrong too.
    for v in verdicts(addr, &auth(Some("right-toke"), Some("job-a"))).await {
        assert!(v.unwrap_err().1.contains("wrong auth token"));
    }
    for v in verdicts(addr, &server_auth).await {
        assert_eq!(v, Ok(()));
    }
    h.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_of_another_job_is_refused_naming_both_ids() {
    let dir = temp("job");
    let h = serve_all(
        ServeOptions::with_auth(auth(Some("t"), Some("job-new"))),
        &dir,
    )
    .await;
    let addr = h.local_addr();
    for v in verdicts(addr, &auth(Some("t"), Some("job-stale"))).await {
        let (code, msg) = v.unwrap_err();
        assert_eq!(code, "PermissionDenied", "{msg}");
        assert!(
            msg.contains("job-new") && msg.contains("job-stale"),
            "{msg}"
        );
    }
    for v in verdicts(addr, &auth(Some("t"), None)).await {
        let (code, msg) = v.unwrap_err();
        assert_eq!(code, "PermissionDenied", "{msg}");
        assert!(msg.contains("job-new") && msg.contains("no job"), "{msg}");
    }
    h.shutdown().await.unwrap();

    // A server without a job id (started by hand) serves any job; without a token, anyone.
    let h = serve_all(ServeOptions::default(), &dir).await;
    for client in [auth(None, None), auth(Some("x"), Some("job-any"))] {
        for v in verdicts(h.local_addr(), &client).await {
            assert_eq!(v, Ok(()));
        }
    }
    h.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_in_flight_limit_are_refused_while_one_is_held() {
    let options = ServeOptions {
        max_in_flight: 1,
        ..ServeOptions::default()
    };
    // A plain shard (an ECRec node refuses plain pushes at once).
    let server = SharedServer::new(
        Server::new(config(3, 0, OptimizerKind::Adagrad), &dense_init()).unwrap(),
    );
    let routes = Routes::new(ps_service(server, GrpcConfig::default()));
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let h = serve_routes_with(routes, any, &options).await.unwrap();
    let addr = h.local_addr();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    // A push whose stream never ends holds the only slot.
    let hold = |channel: tonic::transport::Channel| {
        tokio::spawn(async move {
            ParameterServerClient::new(channel)
                .push(tokio_stream::pending::<proto::UpdateChunk>())
                .await
        })
    };
    let mut held = hold(channel.clone());
    let other = GrpcClient::connect(addr, GrpcConfig::default()).await;
    // Until the held push reaches the server, requests still go through; then they are
    // refused. Poll (no timing assumption) until the refusal shows.
    let mut refused = None;
    for _ in 0..2000 {
        if held.is_finished() {
            // The push arrived while one of the requests below held the only slot, and was
            // refused itself: hold it again.
            held = hold(channel.clone());
        }
        let mut c = ParameterServerClient::new(channel.clone());
        match c.info(InfoRequest {}).await {
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            Err(s) => {
                refused = Some(s);
                break;
            }
        }
    }
    let s = refused.expect("a request past the limit is refused");
    assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
    assert!(s.message().contains("the limit is 1"), "{}", s.message());
    held.abort();
    let _ = held.await;
    // With the slot free again, requests are served.
    let mut served = false;
    for _ in 0..2000 {
        let mut c = ParameterServerClient::new(channel.clone());
        if c.info(InfoRequest {}).await.is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(served, "requests are served once the held one ends");
    drop(other);
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_past_the_size_limit_is_refused_with_a_clear_status() {
    let dir = temp("size");
    let h = serve_all(ServeOptions::default(), &dir).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", h.local_addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let limit = GrpcConfig::default().max_message_bytes;
    let mut c = ParameterServerClient::new(channel).max_encoding_message_size(usize::MAX);
    let big = proto::PullRowsRequest {
        parts: vec![proto::RowIds {
            table: 0,
            rows: vec![0u8; limit + 8],
        }],
    };
    let s = c.pull_rows(big).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::OutOfRange, "{s:?}");
    assert!(s.message().contains("too large"), "{}", s.message());
    h.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `base` as process `me` ([`ftrec_ps::fence`]), with a table of its own.
fn as_process(base: &Auth, me: &str) -> Auth {
    Auth {
        fences: Fences::new(Some(Incarnation::parse(me).unwrap())),
        ..base.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_worker_is_refused_by_every_service_and_learns_it_is_fenced() {
    let dir = temp("fence-worker");
    let base = auth(Some("t"), Some("job-a"));
    let server = as_process(&base, "s0.0");
    let h = serve_all(ServeOptions::with_auth(server.clone()), &dir).await;
    let addr = h.local_addr();
    let old = as_process(&base, "w1.0");
    for v in verdicts(addr, &old).await {
        assert_eq!(v, Ok(()));
    }
    // The coordinator replaces worker 1 and tells the server.
    let coordinator = as_process(&base, "c.1");
    coordinator
        .fences
        .supersede(Incarnation::parse("w1.0").unwrap());
    for v in verdicts(addr, &coordinator).await {
        assert_eq!(v, Ok(()));
    }
    assert_eq!(server.fences.newest(FenceRole::Worker, 1), Some(1));
    // The old worker comes back: every service refuses it, naming it and the newer epoch.
    let c = GrpcClient::connect_with(addr, GrpcConfig::default(), &old).await;
    let e = c.map(|_| ()).unwrap_err();
    assert_eq!(
        e,
        PsError::Fenced {
            who: "w1.0".into(),
            newer: 1
        }
    );
    assert!(e.to_string().contains("worker 1 (epoch 0)"), "{e}");
    // ... and it learned that it is the one fenced: its main loop exits.
    assert_eq!(old.fences.replaced_by(), Some(1));
    for v in verdicts(addr, &old).await {
        let (_, msg) = v.unwrap_err();
        assert!(
            msg.contains("fenced") && msg.contains("worker 1 (epoch 0)"),
            "{msg}"
        );
    }
    // The replacement, and the other workers, are served.
    for who in ["w1.1", "w0.0"] {
        for v in verdicts(addr, &as_process(&base, who)).await {
            assert_eq!(v, Ok(()), "{who}");
        }
    }
    h.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_told_of_its_replacement_refuses_everyone_and_its_peers_refuse_it() {
    let dir = temp("fence-server");
    let base = auth(Some("t"), Some("job-a"));
    // Two servers: 0 (the zombie to be) and 1 (a live peer).
    let zombie = as_process(&base, "s0.0");
    let peer = as_process(&base, "s1.0");
    let hz = serve_all(ServeOptions::with_auth(zombie.clone()), &dir.join("z")).await;
    let hp = serve_all(ServeOptions::with_auth(peer.clone()), &dir.join("p")).await;
    // The coordinator fences server 0 and tells the live peer.
    let coordinator = as_process(&base, "c.1");
    coordinator
        .fences
        .supersede(Incarnation::parse("s0.0").unwrap());
    for v in verdicts(hp.local_addr(), &coordinator).await {
        assert_eq!(v, Ok(()));
    }
    // The zombie's ECRec traffic to its peer is refused, and it learns it is fenced.
    let to_peer = EcGrpcClient::connect_lazy_with(&hp.local_addr().to_string(), &zombie).unwrap();
    let e = to_peer.rebuild_status().await.unwrap_err();
    assert!(
        matches!(&e, PsError::Fenced { who, newer: 1 } if who == "s0.0"),
        "{e}"
    );
    assert_eq!(zombie.fences.replaced_by(), Some(1));
    let line = zombie.fences.fenced().await;
    assert!(line.contains("server 0 (epoch 0)"), "{line}");
    // From then on the zombie serves no one, not even a process it never heard of.
    for v in verdicts(hz.local_addr(), &as_process(&base, "w0.0")).await {
        let (_, msg) = v.unwrap_err();
        assert!(
            msg.contains("fenced") && msg.contains("server 0 (epoch 0)"),
            "{msg}"
        );
    }
    hz.shutdown().await.unwrap();
    hp.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_cut_off_from_the_coordinator_learns_of_its_replacement_from_a_worker() {
    let dir = temp("fence-partition");
    let base = auth(Some("t"), Some("job-a"));
    let cut_off = as_process(&base, "s0.0");
    let h = serve_all(ServeOptions::with_auth(cut_off.clone()), &dir).await;
    // The coordinator replaces server 0, which it cannot reach: it tells no server, but hands
    // its table to a worker with the next batch.
    let coordinator = as_process(&base, "c.1");
    coordinator
        .fences
        .supersede(Incarnation::parse("s0.0").unwrap());
    let worker = as_process(&base, "w0.0");
    worker
        .fences
        .merge(&coordinator.fences.table_text())
        .unwrap();
    // The worker's next request tells the cut-off server, which refuses it and every later one.
    for v in verdicts(h.local_addr(), &worker).await {
        let (_, msg) = v.unwrap_err();
        assert!(msg.contains("server 0 (epoch 0)"), "{msg}");
    }
    assert_eq!(cut_off.fences.replaced_by(), Some(1));
    // The refusal names the server, not the worker: the worker is not fenced.
    assert_eq!(worker.fences.replaced_by(), None);
    assert!(worker.fences.merge("s0.x").is_err());
    h.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
