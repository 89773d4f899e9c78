//! `model_state::restore_model`: a state saved by several servers comes back as the whole
//! model, every row at its global id and the dense ranges end to end, bit for bit; `--at` a
//! step means exactly that step; damage is an error naming the file.

use std::sync::Arc;

mod common;
use common::{dense_opt, memory_store, TestModel};

use ftrec_ckpt::deck::RestoreAt;
use ftrec_ckpt::model_state::restore_model;
use ftrec_ckpt::snapshot::{self, SnapshotOptions};
use ftrec_ckpt::{CheckpointId, CheckpointKind, Checkpoints, DataPosition};
use ftrec_core::{DenseParams, ModelDigest, ServerId, TableId};

async fn saved(servers: u32, step: u64) -> (TestModel, Checkpoints) {
    let model = TestModel::new(servers, 5, true);
    let ckpts = Checkpoints::new(memory_store().0);
    let id = CheckpointId::for_step(step, CheckpointKind::Full);
    let opts = SnapshotOptions {
        chunk_bytes: 4096,
        max_in_flight: 2,
    };
    snapshot::write_full(
        &ckpts,
        &id,
        step,
        DataPosition::None,
        &model.shards(),
        &opts,
    )
    .await
    .unwrap();
    (model, ckpts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_and_dense_word_comes_back_at_its_global_place() {
    for servers in [1, 3] {
        let (model, ckpts) = saved(servers, 12).await;
        let st = restore_model(&ckpts, &RestoreAt::Current).await.unwrap();
        assert_eq!(st.step(), 12);
        assert_eq!(st.servers, servers);
        assert_eq!(st.tables.len(), 26);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (s, server) in model.servers.iter().enumerate() {
            for part in &server.tables {
                let whole = &st.tables[part.id.0 as usize];
                assert_eq!(whole.id, part.id);
                assert_eq!(whole.layout(), part.layout());
                for local in 0..part.rows() {
                    let g = model.map.global_row(part.id, ServerId(s as u32), local);
                    assert_eq!(bits(whole.row(g)), bits(part.row(local)), "row {g}");
                }
            }
        }
        let values: Vec<f32> = model
            .servers
            .iter()
            .flat_map(|s| s.dense.values.clone())
            .collect();
        let state: Vec<f32> = model
            .servers
            .iter()
            .flat_map(|s| s.dense.state.clone())
            .collect();
        assert_eq!(bits(&st.dense_values), bits(&values));
        assert_eq!(bits(&st.dense_state), bits(&state));
        // The whole model's digest is the saved shards' merged digest.
        let mut d = ModelDigest::new();
        for t in &st.tables {
            for r in 0..t.rows() {
                d.add_row(t.id.0, r, t.row(r));
            }
        }
        let mut dense = DenseParams::new(st.dense_values.clone(), &dense_opt());
        dense.state = st.dense_state.clone();
        dense.digest_into(&mut d);
        assert_eq!(d, model.digest());
        assert_eq!(st.table_rows()[TableId(2).0 as usize], 400);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_means_exactly_that_step() {
    let (_, ckpts) = saved(2, 12).await;
    assert_eq!(
        restore_model(&ckpts, &RestoreAt::Step(12))
            .await
            .unwrap()
            .step(),
        12
    );
    let e = restore_model(&ckpts, &RestoreAt::Step(13))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no checkpoint at step 13") && e.contains("step 12"),
        "{e}"
    );
    let e = restore_model(&ckpts, &RestoreAt::Step(11))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("step 11"), "{e}");
    let empty = Checkpoints::new(memory_store().0);
    let e = restore_model(&empty, &RestoreAt::Current)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("no checkpoint"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_file_is_an_error_naming_it() {
    let (_, ckpts) = saved(2, 12).await;
    let store: Arc<dyn ftrec_ckpt::ChunkStore> = ckpts.store().clone();
    let files = store.list(None).await.unwrap();
    let victim = files
        .iter()
        .find(|f| f.key.as_str().ends_with(".rows"))
        .expect("a row file")
        .key
        .clone();
    let mut b = store.get(&victim).await.unwrap().to_vec();
    let i = b.len() - 3;
    b[i] ^= 0x10;
    store
        .put(&victim, b.into(), ftrec_ckpt::PutMode::Overwrite)
        .await
        .unwrap();
    let e = restore_model(&ckpts, &RestoreAt::Current)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains(victim.as_str()), "{e}");
}
