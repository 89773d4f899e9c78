//! The checkpoint service over gRPC on loopback, served next to the parameter-server service on
//! one socket: full and delta saves through the wire, one manifest per save committed by the
//! coordinator, and a restore of the whole cluster to an earlier point, bit for bit.

mod ckpt_common;
mod common;

use std::net::SocketAddr;

use ckpt_common::{digest, start, step, TempDir};
use ftrec_ckpt::deck::checkpoint_id;
use ftrec_ckpt::incr::PieceSpec;
use ftrec_ckpt::{CheckpointKind, Checkpoints, DataPosition, LocalStore};
use ftrec_ps::ckpt::grpc::{ckpt_service, CkptGrpcClient};
use ftrec_ps::ckpt::{
    restore_cluster, save_cluster, save_piece_cluster, CkptApi, CkptServiceError, PiecePlan,
    SavePlan,
};
use ftrec_ps::grpc::{ps_service, serve_routes, GrpcConfig, Routes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_and_restore_over_grpc_next_to_the_ps_service() {
    let dir = TempDir::new();
    let location = dir.path().join("store").to_string_lossy().into_owned();
    let ckpts = Checkpoints::new(std::sync::Arc::new(LocalStore::new(&location).unwrap()));
    let (servers, nodes) = start(&dir.path().join("staging"));
    let mut handles = Vec::new();
    let mut clients = Vec::new();
    for (server, node) in servers.iter().zip(nodes) {
        let routes = Routes::new(ps_service(server.clone(), GrpcConfig::default()))
            .add_service(ckpt_service(node));
        let h = serve_routes(routes, "127.0.0.1:0".parse::<SocketAddr>().unwrap())
            .await
            .unwrap();
        clients.push(CkptGrpcClient::connect(h.local_addr()).await.unwrap());
        handles.push(h);
    }
    step(&servers, 1);
    let full = checkpoint_id(1, CheckpointKind::Full, 0);
    save_cluster(
        &clients,
        &location,
        &ckpts,
        SavePlan {
            kind: CheckpointKind::Full,
            id: full.clone(),
            step: 1,
            parent: None,
            data_position: DataPosition::None,
        },
    )
    .await
    .unwrap();
    step(&servers, 2);
    step(&servers, 3);
    let delta = checkpoint_id(3, CheckpointKind::Delta, 0);
    let (m, pauses) = save_cluster(
        &clients,
        &location,
        &ckpts,
        SavePlan {
            kind: CheckpointKind::Delta,
            id: delta.clone(),
            step: 3,
            parent: Some(full.clone()),
            data_position: DataPosition::Bytes(vec![3]),
        },
    )
    .await
    .unwrap();
    assert_eq!(m.parents, vec![full.clone()]);
    assert!(pauses.iter().all(|p| p.rows > 0));
    let at3 = digest(&servers);
    step(&servers, 4);
    assert_ne!(digest(&servers), at3);
    let done = restore_cluster(&clients, &location, &delta).await.unwrap();
    assert!(done.iter().all(|d| d.checkpoints == 2));
    assert_eq!(digest(&servers), at3);
    // An IncrCP piece over the wire: the spec travels, the extraction's bundles and the piece
    // index come back in the report. Not over a DECK delta (no incremental base): refused.
    let plan = |s: u64, parent: &ftrec_ckpt::CheckpointId| PiecePlan {
        id: checkpoint_id(s, CheckpointKind::Delta, 0),
        step: s,
        parent: parent.clone(),
        data_position: DataPosition::None,
        spec: PieceSpec::chunk_list(0.0),
    };
    step(&servers, 5);
    let e = save_piece_cluster(&clients, &location, &ckpts, plan(5, &delta))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("save a full first"), "{e}");
    let full6 = checkpoint_id(6, CheckpointKind::Full, 0);
    save_cluster(
        &clients,
        &location,
        &ckpts,
        SavePlan {
            kind: CheckpointKind::Full,
            id: full6.clone(),
            step: 6,
            parent: None,
            data_position: DataPosition::None,
        },
    )
    .await
    .unwrap();
    let mut prev = full6;
    let mut at = Vec::new();
    for s in 7..=9 {
        step(&servers, s);
        let (m, _) = save_piece_cluster(&clients, &location, &ckpts, plan(s, &prev))
            .await
            .unwrap();
        assert_eq!(m.pieces().count(), 2);
        at.push((m.id.clone(), digest(&servers)));
        prev = m.id;
    }
    for (id, want) in at.iter().rev() {
        restore_cluster(&clients, &location, id).await.unwrap();
        assert_eq!(&digest(&servers), want, "restore of {id}");
    }
    // Errors travel: an unknown save, and a restore of a checkpoint that does not exist.
    let e = clients[0]
        .wait(checkpoint_id(9, CheckpointKind::Delta, 0))
        .await
        .unwrap_err();
    assert!(matches!(e, CkptServiceError::UnknownSave { .. }), "{e}");
    let e = restore_cluster(
        &clients,
        &location,
        &checkpoint_id(99, CheckpointKind::Delta, 0),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&e, CkptServiceError::Remote { message, .. } if message.contains("00000000000000000099-delta-a0")),
        "{e}"
    );
    // A prioritized save (CPR §4.2) travels too; these servers track no priority and say so.
    let e = clients[1]
        .save_prioritized(
            location.clone(),
            checkpoint_id(4, CheckpointKind::Delta, 0),
            4,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&e, CkptServiceError::Remote { code, message } if code == "FailedPrecondition" && message.contains("priority")),
        "{e}"
    );
    for h in handles {
        h.shutdown().await.unwrap();
    }
}
