//! Peers by name: a client that dials a name finds the server behind it, and finds it again at
//! a new address when the name moves (a server replaced at the same name, as a restarted
//! Kubernetes pod is). The name is served by a hosts file of the test's own ($FTREC_HOSTS),
//! rewritten between the two servers. One test in this binary: the variable is process-wide.

mod common;

use std::net::SocketAddr;

use common::{config, dense_init};
use ftrec_core::{OptimizerKind, ServerId};
use ftrec_ps::ec::EcGrpcClient;
use ftrec_ps::grpc::{serve, GrpcClient, GrpcConfig};
use ftrec_ps::net::{PeerAddr, HOSTS_ENV};
use ftrec_ps::{PsError, PsService, Server, SharedServer};

fn server(id: u32) -> SharedServer {
    SharedServer::new(Server::new(config(2, id, OptimizerKind::Adagrad), &dense_init()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_is_looked_up_again_when_its_server_comes_back_at_another_address() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(
        &hosts,
        "# the test's names\n127.0.0.1 ps-moving other-name\n",
    )
    .unwrap();
    std::env::set_var(HOSTS_ENV, &hosts);

    // Server 0 behind the name, at 127.0.0.1.
    let first = serve(
        server(0),
        "127.0.0.1:0".parse().unwrap(),
        GrpcConfig::default(),
    )
    .await
    .unwrap();
    let port = first.local_addr().port();
    let name: PeerAddr = format!("ps-moving:{port}").parse().unwrap();
    assert_eq!(
        name.resolve().unwrap(),
        vec![SocketAddr::from(([127, 0, 0, 1], port))]
    );
    let client = GrpcClient::connect(name.clone(), GrpcConfig::default())
        .await
        .unwrap();
    assert_eq!(client.info().await.unwrap().server, ServerId(0));
    assert_eq!(client.addr(), name.to_string());

    // The server goes; its replacement (server 1, so the two can be told apart) serves at
    // another address of the same name, on the same port.
    first.shutdown().await.unwrap();
    std::fs::write(&hosts, "127.0.0.2 ps-moving\n").unwrap();
    let second = serve(
        server(1),
        SocketAddr::from(([127, 0, 0, 2], port)),
        GrpcConfig::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        name.resolve().unwrap(),
        vec![SocketAddr::from(([127, 0, 0, 2], port))]
    );

    // The same client reconnects through the name: the calls that see the old connection
    // break fail as unavailable (what callers retry), never answer as server 0, and a bounded
    // number of tries reaches server 1.
    let mut answered = None;
    for _ in 0..100 {
        match client.info().await {
            Ok(info) => {
                answered = Some(info.server);
                break;
            }
            Err(e) => assert!(matches!(e, PsError::Unavailable { .. }), "{e}"),
        }
    }
    assert_eq!(answered, Some(ServerId(1)));
    // A new connection by name goes there at once.
    let fresh = GrpcClient::connect(name.clone(), GrpcConfig::default())
        .await
        .unwrap();
    assert_eq!(fresh.info().await.unwrap().server, ServerId(1));

    // A name the file does not hold and no resolver knows: the error names it.
    let unknown: PeerAddr = format!("no-such-host.invalid:{port}").parse().unwrap();
    let e = GrpcClient::connect(unknown, GrpcConfig::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, PsError::Unavailable { addr, reason }
            if addr.contains("no-such-host.invalid") && reason.contains("no-such-host.invalid")),
        "{e}"
    );
    // ECRec peers are named the same way; a value that is no address is refused up front.
    assert!(EcGrpcClient::connect_lazy(&name.to_string()).is_ok());
    let e = EcGrpcClient::connect_lazy("ps-moving").unwrap_err();
    assert!(e.to_string().contains("no port"), "{e}");

    second.shutdown().await.unwrap();
    std::env::remove_var(HOSTS_ENV);
}
