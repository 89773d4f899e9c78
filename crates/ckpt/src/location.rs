//! Opening a checkpoint store from a location string: a directory path or an
//! `s3://bucket/prefix` URL.
//!
//! S3 settings come from [`LocationOptions`]; any field left `None` falls back to the usual AWS
//! environment variables ([`LocationOptions::from_env`] reads them: `AWS_ENDPOINT_URL`
//! (or `AWS_ENDPOINT`), `AWS_REGION` (or `AWS_DEFAULT_REGION`), `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP`). Anything that is neither a path nor an `s3://`
//! URL (`gs://...`, `http://...`) is refused with an error naming the location.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{CkptError, Result};
use crate::key::Key;
use crate::store::fault::{FaultPlan, FaultyStore, FAULTS_ENV};
use crate::store::local::LocalStore;
use crate::store::retry::{RetryPolicy, RetryingStore};
use crate::store::ChunkStore;

/// A parsed location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local directory (created if missing).
    Dir(PathBuf),
    /// A bucket and an optional key prefix inside it.
    S3 { bucket: String, prefix: Option<Key> },
}

/// S3 connection settings; `None` means "take it from the environment".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocationOptions {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Allow a plain `http://` endpoint (loopback emulators). Defaults to true exactly when the
    /// endpoint starts with `http://`.
    pub allow_http: Option<bool>,
}

fn env(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
}

impl LocationOptions {
    /// Options from the usual AWS environment variables.
    pub fn from_env() -> Self {
        LocationOptions {
            endpoint: env(&["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]),
            region: env(&["AWS_REGION", "AWS_DEFAULT_REGION"]),
            access_key_id: env(&["AWS_ACCESS_KEY_ID"]),
            secret_access_key: env(&["AWS_SECRET_ACCESS_KEY"]),
            allow_http: env(&["AWS_ALLOW_HTTP"]).map(|v| matches!(v.as_str(), "1" | "true")),
        }
    }

    /// `self`, with every unset field taken from `other`.
    pub fn or(self, other: LocationOptions) -> Self {
        LocationOptions {
            endpoint: self.endpoint.or(other.endpoint),
            region: self.region.or(other.region),
            access_key_id: self.access_key_id.or(other.access_key_id),
            secret_access_key: self.secret_access_key.or(other.secret_access_key),
            allow_http: self.allow_http.or(other.allow_http),
        }
    }
}

/// Parse `location` without touching any store.
pub fn parse(location: &str) -> Result<Location> {
    let bad = |reason: String| {
        CkptError::InvalidArgument(format!("checkpoint location {location:?}: {reason}"))
    };
    if location.is_empty() {
        return Err(bad("empty location".into()));
    }
    if let Some(rest) = location.strip_prefix("s3://") {
        let rest = rest.trim_end_matches('/');
        let (bucket, prefix) = match rest.split_once('/') {
            Some((b, p)) => (b, Some(p)),
            None => (rest, None),
        };
        if bucket.is_empty() {
            return Err(bad("no bucket name after s3://".into()));
        }
        if !bucket
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        {
            return Err(bad(format!(
                "bucket name {bucket:?} may only hold lowercase letters, digits, '-' and '.'"
            )));
        }
        let prefix = prefix
            .map(|p| Key::new(p).map_err(|e| bad(format!("prefix: {e}"))))
            .transpose()?;
        return Ok(Location::S3 {
            bucket: bucket.to_string(),
            prefix,
        });
    }
    if let Some(path) = location.strip_prefix("file://") {
        if path.is_empty() {
            return Err(bad("no path after file://".into()));
        }
        return Ok(Location::Dir(PathBuf::from(path)));
    }
    if let Some((scheme, _)) = location.split_once("://") {
        return Err(bad(format!(
            "unsupported scheme {scheme:?} (use a directory path or s3://bucket/prefix)"
        )));
    }
    Ok(Location::Dir(PathBuf::from(location)))
}

/// Open the store at `location`. A directory is created if missing; an S3 location needs an
/// endpoint, credentials and a region from `opts` or the environment, and must answer a list.
///
/// The store retries transient failures ([`crate::store::retry`]) with the policy of
/// [`retry_policy_from_env`]; with `FTREC_STORE_FAULTS` set, it first injects the faults that
/// variable names ([`FaultPlan::parse`]: tests of whole runs).
pub async fn open(location: &str, opts: &LocationOptions) -> Result<Arc<dyn ChunkStore>> {
    open_with(location, opts, retry_policy_from_env()?).await
}

/// [`open`] with the retry policy `policy` instead of the environment's.
pub async fn open_with(
    location: &str,
    opts: &LocationOptions,
    policy: RetryPolicy,
) -> Result<Arc<dyn ChunkStore>> {
    let (mut store, s3): (Arc<dyn ChunkStore>, Option<S3Probe>) = match parse(location)? {
        Location::Dir(path) => (Arc::new(LocalStore::new(path)?), None),
        Location::S3 { bucket, prefix } => {
            let s3 = open_s3(location, bucket, prefix, opts)?;
            (s3.clone() as Arc<dyn ChunkStore>, Some(s3))
        }
    };
    if let Ok(spec) = std::env::var(FAULTS_ENV) {
        store = Arc::new(FaultyStore::new(store, FaultPlan::parse(&spec)?));
    }
    let store = RetryingStore::new(store, policy)?;
    if let Some(s3) = s3 {
        check_s3(&store, &s3).await?;
    }
    Ok(Arc::new(store))
}

#[cfg(feature = "s3")]
type S3Probe = Arc<crate::store::s3::S3Store>;
#[cfg(not(feature = "s3"))]
type S3Probe = Arc<dyn ChunkStore>;

/// The bucket check of an S3 store, retried like every other call of `store`.
#[cfg(feature = "s3")]
async fn check_s3(store: &RetryingStore, s3: &S3Probe) -> Result<()> {
    store
        .run("list", s3.describe(), |_| s3.check_bucket())
        .await
        .map_err(|e| s3.unreachable(e))
}

#[cfg(not(feature = "s3"))]
async fn check_s3(_store: &RetryingStore, _s3: &S3Probe) -> Result<()> {
    Ok(())
}

/// Environment variable: tries per store operation ([`RetryPolicy::attempts`]).
pub const ATTEMPTS_ENV: &str = "FTREC_STORE_ATTEMPTS";
/// Environment variable: the longest wait between two tries, in milliseconds.
pub const MAX_BACKOFF_ENV: &str = "FTREC_STORE_MAX_BACKOFF_MS";

/// The default retry policy with `FTREC_STORE_ATTEMPTS` and `FTREC_STORE_MAX_BACKOFF_MS`
/// applied (a first backoff above the longest is lowered to it).
pub fn retry_policy_from_env() -> Result<RetryPolicy> {
    let mut p = RetryPolicy::default();
    let var = |name: &str| -> Result<Option<u64>> {
        match std::env::var(name) {
            Ok(v) => v.trim().parse::<u64>().map(Some).map_err(|e| {
                CkptError::InvalidArgument(format!("${name}={v:?} is not a number: {e}"))
            }),
            Err(_) => Ok(None),
        }
    };
    if let Some(n) = var(ATTEMPTS_ENV)? {
        p.attempts = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(ms) = var(MAX_BACKOFF_ENV)? {
        p.max_backoff = Duration::from_millis(ms);
        p.first_backoff = p.first_backoff.min(p.max_backoff);
    }
    p.validate().map_err(|e| match e {
        CkptError::InvalidArgument(why) => {
            CkptError::InvalidArgument(format!("${ATTEMPTS_ENV}/${MAX_BACKOFF_ENV}: {why}"))
        }
        e => e,
    })?;
    Ok(p)
}

#[cfg(feature = "s3")]
fn open_s3(
    location: &str,
    bucket: String,
    prefix: Option<Key>,
    opts: &LocationOptions,
) -> Result<S3Probe> {
    use crate::store::s3::{S3Config, S3Store};
    let opts = opts.clone().or(LocationOptions::from_env());
    let missing = |what: &str, var: &str| {
        CkptError::InvalidArgument(format!(
            "checkpoint location {location:?}: no S3 {what} (give it as an option or set {var})"
        ))
    };
    let endpoint = opts
        .endpoint
        .ok_or_else(|| missing("endpoint", "AWS_ENDPOINT_URL"))?;
    let key_id = opts
        .access_key_id
        .ok_or_else(|| missing("access key id", "AWS_ACCESS_KEY_ID"))?;
    let secret = opts
        .secret_access_key
        .ok_or_else(|| missing("secret access key", "AWS_SECRET_ACCESS_KEY"))?;
    let mut config = S3Config::new(endpoint, bucket, key_id, secret);
    if let Some(r) = opts.region {
        config.region = r;
    }
    if let Some(h) = opts.allow_http {
        config.allow_http = h;
    }
    config.prefix = prefix;
    // The store's retry layer retries every call, the bucket check included; the client's
    // own retries would multiply its tries and waits.
    config.max_retries = 0;
    Ok(Arc::new(S3Store::new(config)?))
}

#[cfg(not(feature = "s3"))]
fn open_s3(
    location: &str,
    _bucket: String,
    _prefix: Option<Key>,
    _opts: &LocationOptions,
) -> Result<S3Probe> {
    Err(CkptError::Unavailable {
        backend: "s3",
        reason: format!("{location}: this build has no S3 support (feature `s3`)"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers every HTTP request with 503 and counts them.
    #[cfg(feature = "s3")]
    fn always_unavailable() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = Arc::clone(&count);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                if !buf.is_empty() {
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                let _ = conn.write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\
                      connection: close\r\n\r\n",
                );
            }
        });
        (format!("http://{addr}"), count)
    }

    #[cfg(feature = "s3")]
    #[tokio::test]
    async fn an_s3_bucket_that_never_answers_is_tried_once_per_store_attempt() {
        // One retry layer: the store's policy. The client's own retries would multiply the
        // tries (and the waits) of every call, the bucket check at open included.
        let (endpoint, requests) = always_unavailable();
        let opts = LocationOptions {
            endpoint: Some(endpoint),
            region: None,
            access_key_id: Some("k".into()),
            secret_access_key: Some("s".into()),
            allow_http: Some(true),
        };
        let policy = RetryPolicy {
            attempts: 3,
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
            ..RetryPolicy::default()
        };
        let e = open_with("s3://bucket/p", &opts, policy).await.unwrap_err();
        assert!(
            matches!(&e, CkptError::Unavailable { reason, .. } if reason.contains("cannot list")),
            "{e}"
        );
        assert!(e.to_string().contains("gave up after 3 tries"), "{e}");
        assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[test]
    fn parses_paths_and_s3_urls() {
        assert_eq!(
            parse("/tmp/ck").unwrap(),
            Location::Dir(PathBuf::from("/tmp/ck"))
        );
        assert_eq!(
            parse("rel/dir").unwrap(),
            Location::Dir(PathBuf::from("rel/dir"))
        );
        assert_eq!(
            parse("file:///x/y").unwrap(),
            Location::Dir(PathBuf::from("/x/y"))
        );
        assert_eq!(
            parse("s3://bkt").unwrap(),
            Location::S3 {
                bucket: "bkt".into(),
                prefix: None
            }
        );
        assert_eq!(
            parse("s3://bkt/a/b/").unwrap(),
            Location::S3 {
                bucket: "bkt".into(),
                prefix: Some(Key::new("a/b").unwrap())
            }
        );
    }

    #[test]
    fn refuses_other_schemes_and_bad_urls_naming_the_location() {
        for bad in [
            "",
            "gs://b/p",
            "http://host/x",
            "s3://",
            "s3://Bad_Bucket/x",
            "s3://b/../x",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(
                matches!(&e, CkptError::InvalidArgument(m) if m.contains(&format!("{bad:?}"))),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn options_fall_back_field_by_field() {
        let a = LocationOptions {
            endpoint: Some("http://a".into()),
            ..Default::default()
        };
        let b = LocationOptions {
            endpoint: Some("http://b".into()),
            region: Some("r".into()),
            ..Default::default()
        };
        let c = a.or(b);
        assert_eq!(c.endpoint.as_deref(), Some("http://a"));
        assert_eq!(c.region.as_deref(), Some("r"));
    }

    #[tokio::test]
    async fn opens_a_directory_and_creates_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/ck");
        let store = open(path.to_str().unwrap(), &LocationOptions::default())
            .await
            .unwrap();
        assert_eq!(store.backend(), "local");
        assert!(path.is_dir());
    }
}
