//! The chunk-store conformance suite on every backend: memory, a local directory, a real
//! S3-compatible server on loopback, and the fault-injecting wrapper (with a plan that only
//! delays) around memory and local.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use ftrec_ckpt::conformance::Capabilities;
use ftrec_ckpt::store::fault::Op;
use ftrec_ckpt::{ChunkStore, FaultPlan, FaultyStore};

ftrec_ckpt::chunk_store_conformance!(memory, memory_store(), Capabilities::FULL);

ftrec_ckpt::chunk_store_conformance!(local, local_store(), Capabilities::FULL);

// s3s-fs checks `If-None-Match: *` and `If-Match` before it writes, without a lock, so two
// racing creators (or swaps) can both succeed there; AWS S3 serializes them. Every other
// property holds.
#[cfg(feature = "s3")]
ftrec_ckpt::chunk_store_conformance!(
    s3,
    (s3_store(None).await as Arc<dyn ChunkStore>, ()),
    Capabilities {
        atomic_create: false,
        atomic_swap: false,
    }
);

fn delaying(inner: Arc<dyn ChunkStore>) -> Arc<dyn ChunkStore> {
    let plan = FaultPlan::new(7)
        .delay(Op::Put, Duration::from_micros(200))
        .delay(Op::Get, Duration::from_micros(100));
    Arc::new(FaultyStore::new(inner, plan))
}

ftrec_ckpt::chunk_store_conformance!(
    faulty_memory,
    (delaying(memory_store().0), ()),
    Capabilities::FULL
);

ftrec_ckpt::chunk_store_conformance!(
    faulty_local,
    {
        let (s, dir) = local_store();
        (delaying(s), dir)
    },
    Capabilities::FULL
);
