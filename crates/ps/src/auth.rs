//! Who may talk to a server: the shared auth token, the job id, and the limits on what one
//! server handles at once.
//!
//! - The **token** is a shared secret. A server given one ([`Auth::token`]) refuses every
//!   request that does not carry it in the `authorization` metadata (`Bearer TOKEN`) with
//!   `Unauthenticated`, naming what is missing or wrong; the comparison runs over every byte
//!   of the expected token whatever the offered one holds ([`Token::matches`]), so its timing
//!   does not tell how much of a guess was right. Clients built with an [`Auth`] attach it
//!   to every request ([`ClientAuth`]).
//! - The **job id** binds a process to one run. Every request of a client that has one
//!   carries it (`x-ftrec-job`); a server that has one refuses a request from another job, or
//!   one without a job id, with `PermissionDenied` naming both ids, so a process left over
//!   from an earlier run that reaches the same port is turned away instead of mixing two
//!   models. A server started without a job id (by hand) serves any job.
//! - [`ServeOptions`] also bound the requests one server handles at once (all connections
//!   together: over the limit a request is refused at once with `ResourceExhausted`) and per
//!   connection (over that limit requests wait).
//!
//! The token comes from a file (`--auth-token-file`) or the `FTREC_AUTH_TOKEN` environment
//! variable, the job id from `--job-id` or `FTREC_JOB_ID`; processes a launcher starts get
//! both through their environment ([`Auth::env_vars`]), never on their command line.

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::Semaphore;

use crate::net::PeerAddr;
use tonic::codegen::http;
use tonic::metadata::{Ascii, MetadataMap, MetadataValue};
use tonic::service::Interceptor;
use tonic::Status;

use crate::fence::{Fences, Incarnation};
use crate::tls::Tls;
use crate::PsError;

/// Metadata key of the token (value `Bearer TOKEN`).
pub const TOKEN_HEADER: &str = "authorization";
/// Metadata key of the job id.
pub const JOB_HEADER: &str = "x-ftrec-job";
/// Environment variable holding the token itself.
pub const TOKEN_ENV: &str = "FTREC_AUTH_TOKEN";
/// Environment variable holding the job id.
pub const JOB_ENV: &str = "FTREC_JOB_ID";
/// Longest token accepted.
pub const MAX_TOKEN_BYTES: usize = 4096;
/// Longest job id accepted.
pub const MAX_JOB_ID_BYTES: usize = 64;

/// A shared secret. Its `Debug` form never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Arc<str>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token(<{} bytes>)", self.0.len())
    }
}

impl Token {
    /// A token from its text (`what` names where it came from, for the error). Surrounding
    /// white space (a file's trailing newline) is dropped; what remains must be 1 to
    /// [`MAX_TOKEN_BYTES`] printable ASCII characters without spaces.
    pub fn new(text: &str, what: &str) -> Result<Token, PsError> {
        let t = text.trim();
        if t.is_empty() {
            return Err(PsError::InvalidConfig(format!(
                "the auth token in {what} is empty"
            )));
        }
        if t.len() > MAX_TOKEN_BYTES {
            return Err(PsError::InvalidConfig(format!(
                "the auth token in {what} is {} bytes long, the limit is {MAX_TOKEN_BYTES}",
                t.len()
            )));
        }
        if let Some(c) = t.bytes().find(|b| !b.is_ascii_graphic()) {
            return Err(PsError::InvalidConfig(format!(
                "the auth token in {what} holds the byte 0x{c:02x}: only printable ASCII \
                 without spaces is allowed"
            )));
        }
        Ok(Token(t.into()))
    }

    /// The token in the file at `path`.
    pub fn read_file(path: &Path) -> Result<Token, PsError> {
        let what = format!("--auth-token-file {}", path.display());
        let bytes = std::fs::read(path)
            .map_err(|e| PsError::InvalidConfig(format!("cannot read {what}: {e}")))?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| PsError::InvalidConfig(format!("the auth token in {what} is not text")))?;
        Token::new(text, &what)
    }

    /// The secret itself (to hand it to a child process).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `offered` is this token. Every byte of the token is compared, whatever
    /// `offered` holds and wherever they first differ: no early exit.
    pub fn matches(&self, offered: &[u8]) -> bool {
        constant_time_eq(self.0.as_bytes(), offered)
    }
}

/// `expected == offered`, in time that depends on `expected.len()` only.
fn constant_time_eq(expected: &[u8], offered: &[u8]) -> bool {
    let mut diff = u8::from(expected.len() != offered.len());
    for (i, &e) in expected.iter().enumerate() {
        let o = offered.get(i).copied().unwrap_or(!e);
        diff |= std::hint::black_box(e ^ o);
    }
    diff == 0
}

/// A run's id: 1 to [`MAX_JOB_ID_BYTES`] characters of `[A-Za-z0-9._-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobId(Arc<str>);

impl JobId {
    pub fn new(text: &str) -> Result<JobId, PsError> {
        let ok = !text.is_empty()
            && text.len() <= MAX_JOB_ID_BYTES
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !ok {
            return Err(PsError::InvalidConfig(format!(
                "job id {text:?}: 1 to {MAX_JOB_ID_BYTES} characters of A-Z, a-z, 0-9, '.', \
                 '_' and '-'"
            )));
        }
        Ok(JobId(text.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a process proves (as a client) and demands (as a server): the token, the job id and
/// TLS ([`crate::tls`]), each optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Auth {
    pub token: Option<Token>,
    pub job: Option<JobId>,
    pub tls: Option<Tls>,
    /// This process's incarnation and its view of the job's live incarnations
    /// ([`crate::fence`]): clients send them, the server's check applies them. Clones share
    /// one table.
    pub fences: Fences,
}

impl Auth {
    /// No token, no job: a server that accepts everyone, a client that proves nothing.
    pub fn none() -> Auth {
        Auth::default()
    }

    /// `FTREC_AUTH_TOKEN` and `FTREC_JOB_ID`, each if set.
    pub fn from_env() -> Result<Auth, PsError> {
        let var = |name: &str| match std::env::var(name) {
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(PsError::InvalidConfig(format!("${name} is not valid text")))
            }
        };
        Ok(Auth {
            token: var(TOKEN_ENV)?
                .map(|t| Token::new(&t, &format!("${TOKEN_ENV}")))
                .transpose()?,
            job: var(JOB_ENV)?.map(|j| JobId::new(&j)).transpose()?,
            tls: Tls::from_env()?,
            fences: Fences::new(Incarnation::from_env()?),
        })
    }

    /// The environment a child process needs to prove the same (see [`Auth::from_env`]).
    /// Processes get the token this way, never on their command line, which `ps` shows. The
    /// incarnation is each process's own: whoever starts one sets
    /// [`crate::fence::INCARNATION_ENV`].
    pub fn env_vars(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        if let Some(t) = &self.token {
            v.push((TOKEN_ENV, t.expose().to_string()));
        }
        if let Some(j) = &self.job {
            v.push((JOB_ENV, j.to_string()));
        }
        if let Some(t) = &self.tls {
            v.extend(t.env_vars());
        }
        v
    }

    /// This process's job id, or "none".
    pub fn job_name(&self) -> String {
        self.job
            .as_ref()
            .map_or_else(|| "none".to_string(), |j| j.to_string())
    }

    /// A server's verdict on what a peer offers: `Err` with the reason it is refused.
    pub fn check(&self, token: Option<&[u8]>, job: Option<&str>) -> Result<(), Refusal> {
        if let Some(expected) = &self.token {
            match token {
                None => return Err(Refusal::MissingToken),
                Some(t) if !expected.matches(t) => return Err(Refusal::WrongToken),
                Some(_) => {}
            }
        }
        if let Some(mine) = &self.job {
            match job {
                Some(j) if j == mine.as_str() => {}
                other => {
                    return Err(Refusal::OtherJob {
                        mine: mine.to_string(),
                        theirs: other.map(str::to_string),
                    })
                }
            }
        }
        Ok(())
    }

    /// The endpoint of a server at `addr`: `https://` with this process's TLS, else `http://`.
    pub fn endpoint(&self, addr: impl fmt::Display) -> Result<tonic::transport::Endpoint, PsError> {
        crate::tls::endpoint(&addr.to_string(), self.tls.as_ref())
    }

    /// A channel to the server at `addr`, connected now. It dials through
    /// [`crate::net::connector`]: a name is looked up at this connect and again at every
    /// reconnect. The error is the transport's, for the caller to word.
    pub async fn channel(
        &self,
        addr: &PeerAddr,
    ) -> Result<tonic::transport::Channel, ChannelError> {
        Ok(self
            .endpoint(addr)?
            .connect_with_connector(crate::net::connector())
            .await?)
    }

    /// [`Auth::channel`] that connects on first use (so peers can be named before they listen).
    pub fn channel_lazy(&self, addr: &PeerAddr) -> Result<tonic::transport::Channel, PsError> {
        Ok(self
            .endpoint(addr)?
            .connect_with_connector_lazy(crate::net::connector()))
    }

    /// What to append to a failed connection's `reason` ([`crate::tls::mismatch_hint`]).
    pub fn connect_hint(&self, reason: &str) -> &'static str {
        crate::tls::mismatch_hint(self.tls.as_ref(), reason)
    }

    /// The client side: attaches the token and the job id to every request.
    pub fn client(&self) -> ClientAuth {
        let value = |s: String| MetadataValue::try_from(s).ok();
        ClientAuth(Arc::new(ClientValues {
            token: self
                .token
                .as_ref()
                .and_then(|t| value(format!("Bearer {}", t.expose()))),
            job: self.job.as_ref().and_then(|j| value(j.to_string())),
            fences: self.fences.clone(),
        }))
    }
}

/// Why a peer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "missing auth token: this server requires one (the `{TOKEN_HEADER}` metadata; start \
         the client with --auth-token-file or ${TOKEN_ENV})"
    )]
    MissingToken,
    #[error("wrong auth token")]
    WrongToken,
    #[error(
        "job mismatch: this process belongs to job {mine}, the peer to {}",
        theirs.as_deref().map_or("no job (it carries no job id)".to_string(), |t| format!("job {t}"))
    )]
    OtherJob {
        mine: String,
        theirs: Option<String>,
    },
}

impl Refusal {
    pub fn to_status(&self) -> Status {
        match self {
            Refusal::MissingToken | Refusal::WrongToken => {
                Status::unauthenticated(self.to_string())
            }
            Refusal::OtherJob { .. } => Status::permission_denied(self.to_string()),
        }
    }
}

/// Client interceptor: the token and the job id on every request (shared by the clones of a
/// client).
#[derive(Clone, Default)]
pub struct ClientAuth(Arc<ClientValues>);

#[derive(Default)]
struct ClientValues {
    token: Option<MetadataValue<Ascii>>,
    job: Option<MetadataValue<Ascii>>,
    fences: Fences,
}

impl fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientAuth")
            .field("token", &self.0.token.is_some())
            .field("job", &self.0.job)
            .finish()
    }
}

impl Interceptor for ClientAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(t) = &self.0.token {
            req.metadata_mut().insert(TOKEN_HEADER, t.clone());
        }
        if let Some(j) = &self.0.job {
            req.metadata_mut().insert(JOB_HEADER, j.clone());
        }
        for (k, v) in self.0.fences.headers() {
            req.metadata_mut().insert(k, v);
        }
        Ok(req)
    }
}

/// Why [`Auth::channel`] failed: the endpoint could not be built, or the connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error(transparent)]
    Endpoint(#[from] PsError),
    #[error(transparent)]
    Connect(#[from] tonic::transport::Error),
}

/// A channel whose requests carry a [`ClientAuth`].
pub type AuthChannel =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, ClientAuth>;

/// Server interceptor: refuses what [`Auth::check`] refuses.
#[derive(Debug, Clone, Default)]
pub struct ServerAuth {
    auth: Auth,
}

impl ServerAuth {
    pub fn new(auth: Auth) -> Self {
        ServerAuth { auth }
    }

    /// The verdict on one request's metadata.
    pub fn check_metadata(&self, md: &MetadataMap) -> Result<(), Status> {
        let token = md.get(TOKEN_HEADER).map(|v| {
            let b = v.as_bytes();
            b.strip_prefix(b"Bearer ").unwrap_or(b)
        });
        let job = md
            .get(JOB_HEADER)
            .map(|v| v.to_str().unwrap_or("<not text>"));
        self.auth.check(token, job).map_err(|r| r.to_status())?;
        self.auth
            .fences
            .admit(md, job)
            .map_err(|e| crate::grpc::wire::to_status(&e))
    }
}

impl Interceptor for ServerAuth {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        self.check_metadata(req.metadata())?;
        Ok(req)
    }
}

/// How a server is put on its socket: who may call it and how much it takes at once.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub auth: Auth,
    /// Requests handled at once over all connections; one more is refused with
    /// `ResourceExhausted` naming the limit.
    pub max_in_flight: usize,
    /// Requests handled at once on one connection; more wait for a slot.
    pub max_in_flight_per_connection: usize,
}

/// Default [`ServeOptions::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;
/// Default [`ServeOptions::max_in_flight_per_connection`].
pub const DEFAULT_MAX_IN_FLIGHT_PER_CONNECTION: usize = 64;

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            auth: Auth::none(),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_in_flight_per_connection: DEFAULT_MAX_IN_FLIGHT_PER_CONNECTION,
        }
    }
}

impl ServeOptions {
    pub fn with_auth(auth: Auth) -> Self {
        ServeOptions {
            auth,
            ..ServeOptions::default()
        }
    }

    pub fn validate(&self) -> Result<(), PsError> {
        if self.max_in_flight == 0 || self.max_in_flight_per_connection == 0 {
            return Err(PsError::InvalidConfig(
                "the in-flight request limits must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// Tower layer refusing requests beyond a server-wide in-flight limit.
#[derive(Debug, Clone)]
pub struct InFlightLayer {
    permits: Arc<Semaphore>,
    limit: usize,
}

impl InFlightLayer {
    pub fn new(limit: usize) -> Self {
        InFlightLayer {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }
}

impl<S> tower_layer::Layer<S> for InFlightLayer {
    type Service = InFlight<S>;
    fn layer(&self, inner: S) -> InFlight<S> {
        InFlight {
            inner,
            permits: self.permits.clone(),
            limit: self.limit,
        }
    }
}

/// See [`InFlightLayer`].
#[derive(Debug, Clone)]
pub struct InFlight<S> {
    inner: S,
    permits: Arc<Semaphore>,
    limit: usize,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tonic::codegen::Service<http::Request<ReqBody>> for InFlight<S>
where
    S: tonic::codegen::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let fut = self.inner.call(req);
                Box::pin(async move {
                    let r = fut.await;
                    drop(permit);
                    r
                })
            }
            Err(_) => {
                let status = Status::resource_exhausted(format!(
                    "server busy: {} requests in flight, the limit is {}",
                    self.limit, self.limit
                ));
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_by_every_byte() {
        let t = Token::new("s3cret\n", "test").unwrap();
        assert!(t.matches(b"s3cret"));
        for bad in [
            &b""[..],
            b"s3cre",
            b"s3cret!",
            b"S3cret",
            b"x3cret",
            b"s3creu",
        ] {
            assert!(!t.matches(bad), "{bad:?}");
        }
        assert!(!format!("{t:?}").contains("s3cret"));
    }

    #[test]
    fn bad_tokens_and_job_ids_are_one_clear_error() {
        for (text, want) in [
            ("", "empty"),
            ("  \n", "empty"),
            ("a b", "0x20"),
            ("caf\u{e9}", "0xc3"),
        ] {
            let e = Token::new(text, "X").unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("in X"), "{e}");
        }
        let e = Token::new(&"a".repeat(MAX_TOKEN_BYTES + 1), "X")
            .unwrap_err()
            .to_string();
        assert!(e.contains("limit"), "{e}");
        for bad in ["", "a b", "x/y", &"j".repeat(65)] {
            assert!(JobId::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(JobId::new("job-1a.b_C").unwrap().as_str(), "job-1a.b_C");
    }

    #[test]
    fn unreadable_and_empty_token_files_are_errors() {
        let dir = std::env::temp_dir().join(format!("ftrec-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let e = Token::read_file(&empty).unwrap_err().to_string();
        assert!(
            e.contains("empty") && e.contains("--auth-token-file"),
            "{e}"
        );
        let e = Token::read_file(&dir.join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read --auth-token-file"), "{e}");
        let good = dir.join("good");
        std::fs::write(&good, "tok\n").unwrap();
        assert!(Token::read_file(&good).unwrap().matches(b"tok"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn checks_name_what_is_wrong() {
        let auth = Auth {
            token: Some(Token::new("t", "test").unwrap()),
            job: Some(JobId::new("job-a").unwrap()),
            tls: None,
            fences: Default::default(),
        };
        assert_eq!(auth.check(None, Some("job-a")), Err(Refusal::MissingToken));
        assert_eq!(
            auth.check(Some(b"u"), Some("job-a")),
            Err(Refusal::WrongToken)
        );
        let e = auth
            .check(Some(b"t"), Some("job-b"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("job-a") && e.contains("job-b"), "{e}");
        let e = auth.check(Some(b"t"), None).unwrap_err().to_string();
        assert!(e.contains("job-a") && e.contains("no job"), "{e}");
        assert_eq!(auth.check(Some(b"t"), Some("job-a")), Ok(()));
        // A server without token or job accepts anyone.
        assert_eq!(Auth::none().check(Some(b"x"), Some("job-z")), Ok(()));
        assert_eq!(Auth::none().check(None, None), Ok(()));
    }

    #[test]
    fn the_client_interceptor_satisfies_the_server_interceptor() {
        let auth = Auth {
            token: Some(Token::new("t0k", "test").unwrap()),
            job: Some(JobId::new("job-x").unwrap()),
            tls: None,
            fences: Default::default(),
        };
        let req = auth.client().call(tonic::Request::new(())).unwrap();
        assert!(ServerAuth::new(auth.clone())
            .check_metadata(req.metadata())
            .is_ok());
        let bare = tonic::Request::new(());
        let s = ServerAuth::new(auth)
            .check_metadata(bare.metadata())
            .unwrap_err();
        assert_eq!(s.code(), tonic::Code::Unauthenticated);
        assert!(
            s.message().contains("missing auth token"),
            "{}",
            s.message()
        );
    }
}
