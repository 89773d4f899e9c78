//! A [`ChunkStore`] on an S3-compatible object store, through `object_store`'s AWS client.
//!
//! Keys live under an optional prefix inside one bucket, so several stores (or tests) can
//! share a bucket. Create-only puts are S3 conditional puts (`If-None-Match: *`); whether two
//! racing creators are then told apart is up to the server (AWS S3 does it; some emulators
//! check before writing and can let both through).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{
    GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutOptions, PutPayload, RetryConfig,
};

use super::{check_range, swap_conflict, ChunkStore, ObjectMeta, PutMode};
use crate::error::{CkptError, Result};
use crate::key::Key;

const BACKEND: &str = "s3";

/// Where and how to reach the bucket.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// e.g. `http://127.0.0.1:9000`.
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Allow plain `http://` endpoints (loopback emulators).
    pub allow_http: bool,
    /// Keys are stored under `prefix/` in the bucket.
    pub prefix: Option<Key>,
    /// The client's own retries of a failed request before it surfaces as
    /// [`CkptError::TemporarilyUnavailable`]. A store opened by [`crate::location::open`]
    /// sets 0: its [`crate::store::retry::RetryingStore`] is the only retry layer (two would
    /// multiply each other's tries and waits).
    pub max_retries: usize,
    /// Give up retrying one request after this long.
    pub retry_timeout: Duration,
}

impl S3Config {
    /// A configuration for a path-style endpoint with static credentials.
    pub fn new(
        endpoint: impl Into<String>,
        bucket: impl Into<String>,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        let endpoint = endpoint.into();
        S3Config {
            allow_http: endpoint.starts_with("http://"),
            endpoint,
            bucket: bucket.into(),
            region: "us-east-1".into(),
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            prefix: None,
            max_retries: 3,
            retry_timeout: Duration::from_secs(30),
        }
    }

    pub fn with_prefix(mut self, prefix: Key) -> Self {
        self.prefix = Some(prefix);
        self
    }
}

/// Objects in an S3 bucket.
#[derive(Debug, Clone)]
pub struct S3Store {
    client: Arc<dyn ObjectStore>,
    prefix: Option<Key>,
    describe: String,
}

/// Map the backend's error into the public one.
fn map_err(key: &str, e: object_store::Error) -> CkptError {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => CkptError::NotFound {
            key: key.to_string(),
        },
        E::AlreadyExists { .. } => CkptError::AlreadyExists {
            key: key.to_string(),
        },
        E::Precondition { source, .. } | E::NotModified { source, .. } => CkptError::Precondition {
            key: key.to_string(),
            reason: source.to_string(),
        },
        E::InvalidPath { source } => CkptError::InvalidKey {
            key: key.to_string(),
            reason: source.to_string(),
        },
        e @ (E::PermissionDenied { .. }
        | E::Unauthenticated { .. }
        | E::UnknownConfigurationKey { .. }
        | E::NotSupported { .. }
        | E::NotImplemented { .. }) => CkptError::Unavailable {
            backend: BACKEND,
            reason: format!("{key}: {e}"),
        },
        // Network failures and server errors that outlived the client's retries.
        e => CkptError::TemporarilyUnavailable {
            backend: BACKEND,
            reason: format!("{key}: {e}"),
        },
    }
}

impl S3Store {
    /// Build the client and check that the bucket answers ([`S3Store::check_bucket`], with
    /// the client's own retries only).
    pub async fn connect(config: S3Config) -> Result<Self> {
        let store = Self::new(config)?;
        store
            .check_bucket()
            .await
            .map_err(|e| store.unreachable(e))?;
        Ok(store)
    }

    /// Build the client without calling the server.
    pub fn new(config: S3Config) -> Result<Self> {
        let retry = RetryConfig {
            max_retries: config.max_retries,
            retry_timeout: config.retry_timeout,
            ..RetryConfig::default()
        };
        let client = AmazonS3Builder::new()
            .with_endpoint(&config.endpoint)
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_allow_http(config.allow_http)
            .with_virtual_hosted_style_request(false)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(retry)
            .build()
            .map_err(|e| CkptError::Unavailable {
                backend: BACKEND,
                reason: format!("invalid S3 configuration: {e}"),
            })?;
        let store = S3Store {
            client: Arc::new(client),
            describe: format!(
                "{}/{}{}",
                config.endpoint,
                config.bucket,
                config
                    .prefix
                    .as_ref()
                    .map(|p| format!("/{p}"))
                    .unwrap_or_default()
            ),
            prefix: config.prefix,
        };
        Ok(store)
    }

    /// One list of the top level under the prefix: the bucket exists and answers. A failure
    /// worth retrying is [`CkptError::TemporarilyUnavailable`].
    pub async fn check_bucket(&self) -> Result<()> {
        let probe = self.prefix.as_ref().map(|p| Path::from(p.as_str()));
        self.client
            .list_with_delimiter(probe.as_ref())
            .await
            .map(|_| ())
            .map_err(|e| map_err(&self.describe, e))
    }

    /// What a failed [`S3Store::check_bucket`] means to whoever opens the store: the store
    /// is unusable (a missing bucket, or a server that never answered).
    pub fn unreachable(&self, e: CkptError) -> CkptError {
        match e {
            CkptError::TemporarilyUnavailable { reason, .. }
            | CkptError::NotFound { key: reason } => CkptError::Unavailable {
                backend: BACKEND,
                reason: format!("cannot list {}: {reason}", self.describe),
            },
            other => other,
        }
    }

    /// `endpoint/bucket[/prefix]`, for messages.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    fn path(&self, key: &Key) -> Path {
        match &self.prefix {
            Some(p) => Path::from(format!("{p}/{key}")),
            None => Path::from(key.as_str()),
        }
    }

    fn key_of(&self, path: &Path) -> Option<Key> {
        let s = path.as_ref();
        let rest = match &self.prefix {
            Some(p) => s.strip_prefix(p.as_str())?.strip_prefix('/')?,
            None => s,
        };
        Key::new(rest).ok()
    }
}

#[async_trait]
impl ChunkStore for S3Store {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn put(&self, key: &Key, data: Bytes, mode: PutMode) -> Result<()> {
        let opts = PutOptions {
            mode: match mode {
                PutMode::Create => object_store::PutMode::Create,
                PutMode::Overwrite => object_store::PutMode::Overwrite,
            },
            ..PutOptions::default()
        };
        self.client
            .put_opts(&self.path(key), PutPayload::from_bytes(data), opts)
            .await
            .map_err(|e| map_err(key.as_str(), e))?;
        Ok(())
    }

    async fn get(&self, key: &Key) -> Result<Bytes> {
        let result = self
            .client
            .get_opts(&self.path(key), GetOptions::default())
            .await
            .map_err(|e| map_err(key.as_str(), e))?;
        result.bytes().await.map_err(|e| map_err(key.as_str(), e))
    }

    async fn get_range(&self, key: &Key, range: Range<u64>) -> Result<Bytes> {
        // HTTP ranges cannot express an empty range and servers clamp ranges that run past the
        // end, so check bounds against the object's size first.
        let meta = self.head(key).await?;
        check_range(key, &range, meta.size)?;
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let opts = GetOptions {
            range: Some(GetRange::Bounded(range.clone())),
            ..GetOptions::default()
        };
        let result = self
            .client
            .get_opts(&self.path(key), opts)
            .await
            .map_err(|e| map_err(key.as_str(), e))?;
        let bytes = result.bytes().await.map_err(|e| map_err(key.as_str(), e))?;
        if bytes.len() as u64 != range.end - range.start {
            return Err(CkptError::Precondition {
                key: key.to_string(),
                reason: format!(
                    "object changed during a ranged read: asked {}..{}, got {} bytes",
                    range.start,
                    range.end,
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }

    async fn head(&self, key: &Key) -> Result<ObjectMeta> {
        let meta = self
            .client
            .head(&self.path(key))
            .await
            .map_err(|e| map_err(key.as_str(), e))?;
        Ok(ObjectMeta {
            key: key.clone(),
            size: meta.size,
        })
    }

    async fn list(&self, prefix: Option<&Key>) -> Result<Vec<ObjectMeta>> {
        let full = match (&self.prefix, prefix) {
            (Some(root), Some(p)) => Some(Path::from(format!("{root}/{p}"))),
            (Some(root), None) => Some(Path::from(root.as_str())),
            (None, Some(p)) => Some(Path::from(p.as_str())),
            (None, None) => None,
        };
        let what = full.as_ref().map_or("", |p| p.as_ref()).to_string();
        let metas: Vec<object_store::ObjectMeta> = self
            .client
            .list(full.as_ref())
            .try_collect()
            .await
            .map_err(|e| map_err(&what, e))?;
        let mut out: Vec<ObjectMeta> = metas
            .iter()
            .filter_map(|m| {
                let key = self.key_of(&m.location)?;
                if prefix.is_some_and(|p| !key.is_under(p)) {
                    return None;
                }
                Some(ObjectMeta { key, size: m.size })
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    async fn swap(&self, key: &Key, expected: Option<Bytes>, data: Bytes) -> Result<()> {
        let mode = match expected {
            None => object_store::PutMode::Create,
            Some(want) => {
                let got = self
                    .client
                    .get_opts(&self.path(key), GetOptions::default())
                    .await
                    .map_err(|e| match e {
                        object_store::Error::NotFound { .. } => swap_conflict(key),
                        e => map_err(key.as_str(), e),
                    })?;
                let version = object_store::UpdateVersion {
                    e_tag: got.meta.e_tag.clone(),
                    version: got.meta.version.clone(),
                };
                let have = got.bytes().await.map_err(|e| map_err(key.as_str(), e))?;
                if have != want {
                    return Err(swap_conflict(key));
                }
                object_store::PutMode::Update(version)
            }
        };
        let opts = PutOptions {
            mode,
            ..PutOptions::default()
        };
        match self
            .client
            .put_opts(&self.path(key), PutPayload::from_bytes(data), opts)
            .await
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::Precondition { .. }) => Err(swap_conflict(key)),
            Err(e) => Err(map_err(key.as_str(), e)),
        }
    }

    async fn delete(&self, key: &Key) -> Result<()> {
        match self.client.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(map_err(key.as_str(), e)),
        }
    }
}
