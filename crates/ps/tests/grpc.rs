//! What only the gRPC transport has: bytes on the wire, message limits, sockets.

mod common;

use std::net::SocketAddr;

use common::*;
use ftrec_core::{OptimizerKind, RowId, TableId};
use ftrec_ps::grpc::proto::parameter_server_client::ParameterServerClient;
use ftrec_ps::grpc::{proto, serve, GrpcClient, GrpcConfig};
use ftrec_ps::{
    InProcessClient, PsError, PsService, RowRequest, Server, ServerConfig, SharedServer, Update,
};

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn le_u64s(ids: &[u64]) -> Vec<u8> {
    ids.iter().flat_map(|i| i.to_le_bytes()).collect()
}

fn le_f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The raw stub, to send what a well-behaved client never would.
async fn raw(addr: SocketAddr) -> ParameterServerClient<tonic::transport::Channel> {
    ParameterServerClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// The typed error travels in the status details, where the typed client decodes it.
fn assert_typed(status: &tonic::Status) {
    let detail = <proto::ErrorDetail as prost::Message>::decode(status.details()).unwrap();
    assert_ne!(
        detail.kind,
        proto::ErrorKind::Unspecified as i32,
        "{status:?}"
    );
}

#[tokio::test]
async fn corrupted_payload_lengths_get_error_replies() {
    let c = Cluster::start(Transport::Grpc, 1, OptimizerKind::Sgd).await;
    let addr = c.handles[0].local_addr();
    let mut stub = raw(addr).await;
    let typed = &c.clients[0];

    // Row ids torn mid-id.
    let status = stub
        .pull_rows(proto::PullRowsRequest {
            parts: vec![proto::RowIds {
                table: 0,
                rows: vec![0u8; 7],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("not a multiple of 8"),
        "{status:?}"
    );
    assert_typed(&status);

    // Gradients torn mid-float, inside a streamed push.
    let chunk = proto::UpdateChunk {
        sparse: vec![proto::SparsePart {
            table: 0,
            rows: le_u64s(&[2]),
            grads: vec![0u8; DIM * 4 - 1],
        }],
        dense: vec![],
    };
    let status = stub
        .push(tokio_stream::iter(vec![chunk]))
        .await
        .unwrap_err();
    assert!(
        status.message().contains("not a multiple of 4"),
        "{status:?}"
    );
    assert_typed(&status);

    // Whole floats, but not `dim` of them per row.
    let chunk = proto::UpdateChunk {
        sparse: vec![proto::SparsePart {
            table: 0,
            rows: le_u64s(&[2, 3]),
            grads: le_f32s(&[0.5; DIM + 1]),
        }],
        dense: vec![],
    };
    let status = stub
        .push(tokio_stream::iter(vec![chunk]))
        .await
        .unwrap_err();
    assert!(status.message().contains("gradient values"), "{status:?}");

    // A stage stream whose chunks disagree on the step.
    let chunks = vec![
        proto::StageChunk {
            step: 1,
            worker: 0,
            update: None,
        },
        proto::StageChunk {
            step: 2,
            worker: 0,
            update: None,
        },
    ];
    let status = stub
        .stage_step(tokio_stream::iter(chunks))
        .await
        .unwrap_err();
    assert!(status.message().contains("malformed"), "{status:?}");

    // Dense export chunks that skip a block do not import.
    let chunks = vec![
        proto::DenseChunk {
            first_block: 0,
            values: le_f32s(&[0.0; 256]),
            state: vec![],
        },
        proto::DenseChunk {
            first_block: 2,
            values: le_f32s(&[0.0; 256]),
            state: vec![],
        },
    ];
    let status = stub
        .import_dense(tokio_stream::iter(chunks))
        .await
        .unwrap_err();
    assert!(status.message().contains("does not continue"), "{status:?}");

    // Nothing changed, and the server still answers typed requests.
    let mut reference = Reference::new(OptimizerKind::Sgd);
    assert_eq!(typed.digest().await.unwrap(), reference.digest());
    let u = Update::new().with_sparse(TableId(0), vec![2], vec![1.0; DIM]);
    typed.push(u.clone()).await.unwrap();
    reference.apply(&[&u]);
    assert_eq!(typed.digest().await.unwrap(), reference.digest());
    c.stop().await;
}

#[tokio::test]
async fn large_payloads_travel_in_chunks_under_the_message_limit() {
    // A 1,000-row table of dim 16 is 64 KiB of values; messages are held to 16 KiB.
    let small = GrpcConfig {
        max_message_bytes: 16 << 10,
        chunk_bytes: 4 << 10,
    };
    let config = |dim| ServerConfig {
        table_rows: vec![1000, 3],
        dim,
        ..config(1, 0, OptimizerKind::Adagrad)
    };
    let dense = vec![0.5f32; 9000];
    let remote = SharedServer::new(Server::new(config(16), &dense).unwrap());
    let twin = InProcessClient::new(SharedServer::new(Server::new(config(16), &dense).unwrap()));
    let handle = serve(remote.clone(), loopback(), small).await.unwrap();
    let client = GrpcClient::connect(handle.local_addr(), small)
        .await
        .unwrap();

    let all: Vec<RowId> = (0..1000).collect();
    let update = Update::new()
        .with_sparse(
            TableId(0),
            all.clone(),
            (0..16_000).map(|i| (i % 97) as f32 * 1e-3).collect(),
        )
        .with_dense(0, vec![0.01; 9000]);
    assert!(update.payload_bytes() > 4 * small.max_message_bytes as u64);
    let a = client.push(update.clone()).await.unwrap();
    let b = twin.push(update).await.unwrap();
    assert_eq!(a, b);
    let req = vec![RowRequest {
        table: TableId(0),
        rows: all,
    }];
    assert_eq!(
        client.pull_rows(req.clone()).await.unwrap(),
        twin.pull_rows(req).await.unwrap()
    );
    assert_eq!(
        bits(&client.pull_dense(0..9000).await.unwrap()),
        bits(&twin.pull_dense(0..9000).await.unwrap())
    );
    let exported = client.export_rows(TableId(0), 0..1000).await.unwrap();
    assert_eq!(
        exported,
        twin.export_rows(TableId(0), 0..1000).await.unwrap()
    );
    assert_eq!(client.import_rows(exported).await.unwrap(), 1000);
    let d = client.export_dense(0..36).await.unwrap();
    assert_eq!(d, twin.export_dense(0..36).await.unwrap());
    assert_eq!(client.import_dense(d).await.unwrap(), 36);
    assert_eq!(client.digest().await.unwrap(), twin.digest().await.unwrap());

    // The limit is real: one unchunked message over it is refused, and the server goes on.
    let mut stub = raw(handle.local_addr()).await;
    let big = proto::PullRowsRequest {
        parts: vec![proto::RowIds {
            table: 0,
            rows: le_u64s(&(0..3000).map(|i| i % 1000).collect::<Vec<_>>()),
        }],
    };
    let status = stub.pull_rows(big).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("too large"), "{status:?}");
    assert!(client.info().await.is_ok());
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn serve_binds_port_zero_and_shuts_down_gracefully() {
    let server =
        SharedServer::new(Server::new(config(1, 0, OptimizerKind::Sgd), &dense_init()).unwrap());
    let handle = serve(server, loopback(), GrpcConfig::default())
        .await
        .unwrap();
    let addr = handle.local_addr();
    assert_ne!(addr.port(), 0);
    let client = GrpcClient::connect(addr, GrpcConfig::default())
        .await
        .unwrap();
    assert_eq!(client.info().await.unwrap().dim, DIM);
    // A connected client does not hold the shutdown up.
    handle.shutdown().await.unwrap();
    assert!(client.info().await.is_err());
    assert!(matches!(
        GrpcClient::connect(addr, GrpcConfig::default()).await,
        Err(PsError::Unavailable { .. })
    ));
}

#[tokio::test]
async fn bad_transport_configs_are_refused() {
    let server =
        SharedServer::new(Server::new(config(1, 0, OptimizerKind::Sgd), &dense_init()).unwrap());
    for bad in [
        GrpcConfig {
            max_message_bytes: 1 << 20,
            chunk_bytes: 0,
        },
        GrpcConfig {
            max_message_bytes: 1 << 20,
            chunk_bytes: 1 << 20,
        },
    ] {
        assert!(matches!(
            serve(server.clone(), loopback(), bad).await,
            Err(PsError::InvalidConfig(_))
        ));
    }
}
