//! An in-memory [`ChunkStore`]: a sorted map behind a mutex. For tests and for staging.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;

use super::{check_range, swap_conflict, ChunkStore, ObjectMeta, PutMode};
use crate::error::{CkptError, Result};
use crate::key::Key;

/// Objects in a `BTreeMap`; every operation holds the lock for its whole duration, so a
/// create-only put is trivially race-free.
#[derive(Debug, Default)]
pub struct MemoryStore {
    objects: Mutex<BTreeMap<Key, Bytes>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Total bytes held.
    pub fn bytes(&self) -> u64 {
        self.lock().values().map(|b| b.len() as u64).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, Bytes>> {
        // A panic while holding the lock cannot leave the map half-updated (every update is a
        // single insert or remove), so a poisoned lock is still consistent.
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn not_found(key: &Key) -> CkptError {
    CkptError::NotFound {
        key: key.to_string(),
    }
}

#[async_trait]
impl ChunkStore for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn put(&self, key: &Key, data: Bytes, mode: PutMode) -> Result<()> {
        let mut map = self.lock();
        if mode == PutMode::Create && map.contains_key(key) {
            return Err(CkptError::AlreadyExists {
                key: key.to_string(),
            });
        }
        map.insert(key.clone(), data);
        Ok(())
    }

    async fn get(&self, key: &Key) -> Result<Bytes> {
        self.lock().get(key).cloned().ok_or_else(|| not_found(key))
    }

    async fn get_range(&self, key: &Key, range: Range<u64>) -> Result<Bytes> {
        let data = self.get(key).await?;
        check_range(key, &range, data.len() as u64)?;
        Ok(data.slice(range.start as usize..range.end as usize))
    }

    async fn head(&self, key: &Key) -> Result<ObjectMeta> {
        let map = self.lock();
        let data = map.get(key).ok_or_else(|| not_found(key))?;
        Ok(ObjectMeta {
            key: key.clone(),
            size: data.len() as u64,
        })
    }

    async fn list(&self, prefix: Option<&Key>) -> Result<Vec<ObjectMeta>> {
        let map = self.lock();
        Ok(map
            .iter()
            .filter(|(k, _)| prefix.is_none_or(|p| k.is_under(p)))
            .map(|(k, v)| ObjectMeta {
                key: k.clone(),
                size: v.len() as u64,
            })
            .collect())
    }

    async fn delete(&self, key: &Key) -> Result<()> {
        self.lock().remove(key);
        Ok(())
    }

    async fn swap(&self, key: &Key, expected: Option<Bytes>, data: Bytes) -> Result<()> {
        let mut map = self.lock();
        match (map.get(key), expected) {
            (None, None) => {}
            (Some(_), None) => {
                return Err(CkptError::AlreadyExists {
                    key: key.to_string(),
                })
            }
            (Some(have), Some(want)) if *have == want => {}
            _ => return Err(swap_conflict(key)),
        }
        map.insert(key.clone(), data);
        Ok(())
    }
}
