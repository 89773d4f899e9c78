//! Who may join a run: the shared token and the job id of every process (the RPC side is
//! `ftrec_ps::auth`), and the control socket's handshake.
//!
//! A run's processes share one [`Auth`]: the token from `--auth-token-file` or
//! `$FTREC_AUTH_TOKEN`, and the job id from `--job-id` or `$FTREC_JOB_ID`, else made up by the
//! coordinator ([`new_job_id`]) and handed to every process it starts through its environment
//! ([`Auth::env_vars`]). On the control socket a worker's [`crate::control::FromWorker::Hello`]
//! carries both; the coordinator answers [`crate::control::ToWorker::Welcome`] with its job
//! id, or [`crate::control::ToWorker::Refused`] with the reason and closes the connection.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};

pub use ftrec_ps::auth::{Auth, JobId, Refusal, Token};

use crate::ClusterError;

/// Flags of every process of a run (`ftrec run`, `coordinator`, `server`, `worker`).
#[derive(Args, Debug, Clone, Default, PartialEq)]
pub struct AuthArgs {
    /// Require this shared secret (the file's content, surrounding white space dropped) on
    /// every RPC and control connection, and present it to peers. Default: $FTREC_AUTH_TOKEN.
    /// Processes `ftrec run` starts get it through their environment.
    #[arg(long, value_name = "PATH")]
    pub auth_token_file: Option<PathBuf>,
    /// The job this process belongs to: peers of another job are refused. Default:
    /// $FTREC_JOB_ID; `ftrec run` and `ftrec coordinator` make one up, and a server started
    /// without one serves any job.
    #[arg(long, value_name = "ID")]
    pub job_id: Option<String>,
    #[command(flatten)]
    pub tls: crate::args::TlsArgs,
    /// Serve on an address other than loopback without a token or mutual TLS: anyone who
    /// reaches the port can join the job or read its model. Refused without this flag.
    #[arg(long)]
    pub insecure: bool,
}

impl AuthArgs {
    /// The flags over the environment: a flag given wins over its variable.
    pub fn resolve(&self) -> Result<Auth, ClusterError> {
        let env = Auth::from_env()?;
        Ok(Auth {
            token: match &self.auth_token_file {
                Some(p) => Some(Token::read_file(p)?),
                None => env.token,
            },
            job: match &self.job_id {
                Some(j) => Some(JobId::new(j)?),
                None => env.job,
            },
            tls: match self.tls.load()? {
                Some(t) => Some(t),
                None if self.tls.is_empty() => env.tls,
                None => None,
            },
            fences: env.fences,
        })
    }
}

/// How to make a token: the end of the line that refuses an open socket.
pub const MAKE_A_TOKEN: &str = "make a token with `head -c 32 /dev/urandom | base64 > \
     ftrec.token` and give every process --auth-token-file ftrec.token (or $FTREC_AUTH_TOKEN), \
     or give --insecure to serve every peer that reaches the port";

/// A socket bound to `addr` (the flag `flag` set it) off loopback serves whoever reaches it:
/// refused without a token or mutual TLS in `auth`, unless `insecure`.
pub fn check_exposure(
    flag: &str,
    addr: SocketAddr,
    auth: &Auth,
    insecure: bool,
) -> Result<(), ClusterError> {
    if addr.ip().is_loopback() || insecure || auth.token.is_some() || auth.tls.is_some() {
        return Ok(());
    }
    Err(ClusterError::Config(format!(
        "{flag} {addr} is not a loopback address and no auth token is set; {MAKE_A_TOKEN}"
    )))
}

/// A fresh job id: `job-` and 16 hex digits of a hash of the run's seed, the clock and the
/// process id, so two runs with the same seed still get different ids.
pub fn new_job_id(seed: u64) -> JobId {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(&seed.to_le_bytes());
    bytes.extend_from_slice(&nanos.to_le_bytes());
    bytes.extend_from_slice(&std::process::id().to_le_bytes());
    let h = xxhash_rust::xxh3::xxh3_64(&bytes);
    JobId::new(&format!("job-{h:016x}")).expect("job-<hex> is a valid job id")
}

/// `auth` with a job id: its own, else a new one.
pub fn with_job(auth: &Auth, seed: u64) -> Auth {
    let mut a = auth.clone();
    a.job.get_or_insert_with(|| new_job_id(seed));
    a
}

/// A secret in a control message: serialized as the plain string, never shown by `Debug`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    pub fn of(auth: &Auth) -> Option<Secret> {
        auth.token.as_ref().map(|t| Secret(t.expose().to_string()))
    }
}

/// The coordinator's verdict on a worker's hello. A worker without a job id (started by
/// hand) is accepted and learns the job from the welcome; one of another job is refused.
pub fn check_hello(auth: &Auth, token: Option<&Secret>, job: Option<&str>) -> Result<(), Refusal> {
    let token = token.map(|s| s.0.as_bytes());
    match (&auth.job, job) {
        // The job check applies to workers that name one.
        (Some(_), None) => Auth {
            token: auth.token.clone(),
            job: None,
            tls: None,
            fences: Default::default(),
        }
        .check(token, None),
        _ => auth.check(token, job),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_differ_between_runs_of_one_seed() {
        let a = new_job_id(7);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_job_id(7);
        assert_ne!(a, b);
        assert!(
            a.as_str().starts_with("job-") && a.as_str().len() == 20,
            "{a}"
        );
        let given = Auth {
            token: None,
            job: Some(JobId::new("mine").unwrap()),
            tls: None,
            fences: Default::default(),
        };
        assert_eq!(with_job(&given, 1), given);
        assert!(with_job(&Auth::none(), 1).job.is_some());
    }

    #[test]
    fn hellos_are_checked_for_token_and_job() {
        let auth = Auth {
            token: Some(Token::new("tok", "test").unwrap()),
            job: Some(JobId::new("job-a").unwrap()),
            tls: None,
            fences: Default::default(),
        };
        let good = Secret("tok".into());
        assert_eq!(check_hello(&auth, Some(&good), Some("job-a")), Ok(()));
        assert_eq!(check_hello(&auth, Some(&good), None), Ok(()));
        assert_eq!(
            check_hello(&auth, None, Some("job-a")),
            Err(Refusal::MissingToken)
        );
        assert_eq!(
            check_hello(&auth, Some(&Secret("tok2".into())), None),
            Err(Refusal::WrongToken)
        );
        let e = check_hello(&auth, Some(&good), Some("job-b"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("job-a") && e.contains("job-b"), "{e}");
        assert!(!format!("{good:?}").contains("tok"));
    }

    #[test]
    fn an_open_socket_off_loopback_needs_a_token_or_insecure() {
        let open: SocketAddr = "0.0.0.0:7000".parse().unwrap();
        let e = check_exposure("--listen", open, &Auth::none(), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--listen 0.0.0.0:7000")
                && e.contains("head -c 32 /dev/urandom")
                && e.contains("--auth-token-file")
                && e.contains("--insecure")
                && !e.contains('\n'),
            "{e}"
        );
        let v6: SocketAddr = "[::]:7000".parse().unwrap();
        assert!(check_exposure("--listen", v6, &Auth::none(), false).is_err());
        assert!(check_exposure("--listen", open, &Auth::none(), true).is_ok());
        let token = Auth {
            token: Some(Token::new("tok", "test").unwrap()),
            job: None,
            tls: None,
            fences: Default::default(),
        };
        assert!(check_exposure("--listen", open, &token, false).is_ok());
        for lo in ["127.0.0.1:0", "[::1]:7000", "127.0.0.2:9"] {
            let lo: SocketAddr = lo.parse().unwrap();
            assert!(check_exposure("--listen", lo, &Auth::none(), false).is_ok());
        }
    }

    #[test]
    fn a_flag_wins_and_a_bad_file_is_one_error() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "").unwrap();
        let a = AuthArgs {
            auth_token_file: Some(empty.clone()),
            job_id: None,
            tls: Default::default(),
            insecure: false,
        };
        let e = a.resolve().unwrap_err().to_string();
        assert!(
            e.contains("empty") && e.contains(&empty.display().to_string()),
            "{e}"
        );
        let good = dir.path().join("good");
        std::fs::write(&good, "s3cret\n").unwrap();
        let a = AuthArgs {
            auth_token_file: Some(good),
            job_id: Some("job-x".into()),
            tls: Default::default(),
            insecure: false,
        };
        let auth = a.resolve().unwrap();
        assert!(auth.token.unwrap().matches(b"s3cret"));
        assert_eq!(auth.job.unwrap().as_str(), "job-x");
        let e = AuthArgs {
            auth_token_file: None,
            job_id: Some("bad id".into()),
            tls: Default::default(),
            insecure: false,
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(e.contains("job id"), "{e}");
    }
}
