//! A store whose writes pass a gate first: a process that learned it no longer belongs to its
//! job (it was replaced while paused or cut off) writes nothing more, whatever it was doing
//! when it learned. Every `put`, `delete` and `swap` asks the gate just before it is sent and
//! fails with [`CkptError::Fenced`] once the gate says no; reads pass through. The gate is a
//! function, so this crate knows nothing of who decides (a server's table of incarnations,
//! `ftrec_ps::fence`).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::{ChunkStore, ObjectMeta, PutMode};
use crate::error::{CkptError, Result};
use crate::key::Key;

/// `Err(why)` once writes must stop; `why` completes "fenced: ...".
pub type Gate = Arc<dyn Fn() -> std::result::Result<(), String> + Send + Sync>;

/// `inner` with every write asking `gate` first.
pub struct GatedStore {
    inner: Arc<dyn ChunkStore>,
    gate: Gate,
}

impl GatedStore {
    pub fn new(inner: Arc<dyn ChunkStore>, gate: Gate) -> Self {
        GatedStore { inner, gate }
    }

    fn pass(&self, key: &Key) -> Result<()> {
        (self.gate)().map_err(|why| CkptError::Fenced {
            what: format!("{why} (refused to write {key})"),
        })
    }
}

impl fmt::Debug for GatedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatedStore")
            .field("inner", &self.inner)
            .finish()
    }
}

#[async_trait]
impl ChunkStore for GatedStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn put(&self, key: &Key, data: Bytes, mode: PutMode) -> Result<()> {
        self.pass(key)?;
        self.inner.put(key, data, mode).await
    }

    async fn get(&self, key: &Key) -> Result<Bytes> {
        self.inner.get(key).await
    }

    async fn get_range(&self, key: &Key, range: Range<u64>) -> Result<Bytes> {
        self.inner.get_range(key, range).await
    }

    async fn head(&self, key: &Key) -> Result<ObjectMeta> {
        self.inner.head(key).await
    }

    async fn list(&self, prefix: Option<&Key>) -> Result<Vec<ObjectMeta>> {
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &Key) -> Result<()> {
        self.pass(key)?;
        self.inner.delete(key).await
    }

    async fn swap(&self, key: &Key, expected: Option<Bytes>, data: Bytes) -> Result<()> {
        self.pass(key)?;
        self.inner.swap(key, expected, data).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::store::memory::MemoryStore;

    #[test]
    fn writes_stop_at_the_gate_the_moment_it_closes_and_reads_go_on() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let inner: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
            let closed = Arc::new(AtomicBool::new(false));
            let c = closed.clone();
            let gate: Gate = Arc::new(move || {
                if c.load(Ordering::SeqCst) {
                    Err("server 1 (epoch 0) was replaced by epoch 1".into())
                } else {
                    Ok(())
                }
            });
            let store = GatedStore::new(inner.clone(), gate);
            let (a, b) = (Key::new("ckpt/a").unwrap(), Key::new("ckpt/b").unwrap());
            store
                .put(&a, Bytes::from_static(b"1"), PutMode::Create)
                .await
                .unwrap();
            closed.store(true, Ordering::SeqCst);
            for e in [
                store
                    .put(&b, Bytes::from_static(b"2"), PutMode::Create)
                    .await
                    .unwrap_err(),
                store.delete(&a).await.unwrap_err(),
                store
                    .swap(&b, None, Bytes::from_static(b"3"))
                    .await
                    .unwrap_err(),
            ] {
                assert!(matches!(&e, CkptError::Fenced { .. }), "{e}");
                assert!(e.to_string().contains("epoch 1"), "{e}");
            }
            // Nothing landed, nothing went; reads are unaffected.
            assert!(matches!(
                inner.get(&b).await,
                Err(CkptError::NotFound { .. })
            ));
            assert_eq!(store.get(&a).await.unwrap(), Bytes::from_static(b"1"));
            assert_eq!(store.list(None).await.unwrap().len(), 1);
        });
    }
}
