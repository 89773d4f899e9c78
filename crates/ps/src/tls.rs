//! Optional TLS on every gRPC connection (rustls through tonic).
//!
//! A process's [`Tls`] is three PEM files, given together: its own certificate chain and
//! private key (`--tls-cert`, `--tls-key`: what it presents, as a server and as a client) and
//! the certificate authority it trusts (`--tls-ca`: what it verifies peers against). TLS is
//! always mutual:
//! - A server serves TLS only (`https`) and demands a client certificate that chains to its
//!   CA, so a plain client fails its first call and a client without the run's certificate
//!   is refused in the handshake.
//! - A client dials `https://`, verifies the server's certificate against its CA (the
//!   certificate's names must include the address dialled: `127.0.0.1`, say) and presents
//!   its own. A process without TLS files dials `http://`.
//! - Every process of a run both verifies and is verified, so one set of three files (a CA
//!   and one certificate it signed for the run's addresses) serves the whole run.
//!
//! The files are read and checked (PEM sections of the right kind present) when the process
//! starts, so a missing, unreadable or wrong file is one error line naming the flag and the
//! path, not a failure at the first connection. Processes a launcher starts get the paths
//! through their environment ([`Tls::env_vars`]), like the auth token.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use crate::PsError;

/// Environment variable holding the path of the certificate chain.
pub const CERT_ENV: &str = "FTREC_TLS_CERT";
/// Environment variable holding the path of the private key.
pub const KEY_ENV: &str = "FTREC_TLS_KEY";
/// Environment variable holding the path of the CA certificate(s).
pub const CA_ENV: &str = "FTREC_TLS_CA";

/// The three files as flags name them, and as the environment does.
const FLAGS: [&str; 3] = ["--tls-cert", "--tls-key", "--tls-ca"];
const ENV_NAMES: [&str; 3] = ["$FTREC_TLS_CERT", "$FTREC_TLS_KEY", "$FTREC_TLS_CA"];

/// One PEM file as read at start-up. `Debug` shows the path only (a key file is a secret).
#[derive(Clone, PartialEq, Eq)]
struct PemFile {
    path: PathBuf,
    pem: Arc<[u8]>,
}

impl fmt::Debug for PemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())
    }
}

/// What kind of PEM section a file must hold.
#[derive(Clone, Copy)]
enum Kind {
    Certs,
    Key,
}

impl PemFile {
    fn read(flag: &str, path: &Path, kind: Kind) -> Result<PemFile, PsError> {
        let what = format!("{flag} {}", path.display());
        let bad = |reason: String| PsError::InvalidConfig(format!("{what}: {reason}"));
        let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        match kind {
            Kind::Certs => {
                let mut n = 0;
                for c in CertificateDer::pem_slice_iter(&bytes) {
                    c.map_err(|e| bad(format!("not a valid PEM certificate file: {e}")))?;
                    n += 1;
                }
                if n == 0 {
                    return Err(bad("holds no PEM certificate (BEGIN CERTIFICATE)".into()));
                }
            }
            Kind::Key => {
                PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
                    bad(format!(
                        "holds no valid PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"
                    ))
                })?;
            }
        }
        // Absolute, so a child process started elsewhere reads the same file.
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        Ok(PemFile {
            path,
            pem: bytes.into(),
        })
    }
}

/// A process's TLS files. See the module documentation for the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    cert: PemFile,
    key: PemFile,
    ca: PemFile,
}

impl Tls {
    /// The files at these paths, checked; `None` when none is given. Certificate and key
    /// come together, and either needs the CA.
    pub fn load(
        cert: Option<&Path>,
        key: Option<&Path>,
        ca: Option<&Path>,
    ) -> Result<Option<Tls>, PsError> {
        Tls::load_as(cert, key, ca, FLAGS)
    }

    /// [`Tls::load`], naming the three files `names` in errors (the flags, or the
    /// environment variables they came from).
    fn load_as(
        cert: Option<&Path>,
        key: Option<&Path>,
        ca: Option<&Path>,
        names: [&str; 3],
    ) -> Result<Option<Tls>, PsError> {
        let (cert, key, ca) = match (cert, key, ca) {
            (None, None, None) => return Ok(None),
            (Some(c), Some(k), Some(a)) => (c, k, a),
            (c, k, a) => {
                let missing: Vec<&str> = [c, k, a]
                    .iter()
                    .zip(names)
                    .filter(|(p, _)| p.is_none())
                    .map(|(_, f)| f)
                    .collect();
                return Err(PsError::InvalidConfig(format!(
                    "TLS needs {}, {} and {} together: {} missing",
                    names[0],
                    names[1],
                    names[2],
                    missing.join(" and ")
                )));
            }
        };
        Ok(Some(Tls {
            cert: PemFile::read(names[0], cert, Kind::Certs)?,
            key: PemFile::read(names[1], key, Kind::Key)?,
            ca: PemFile::read(names[2], ca, Kind::Certs)?,
        }))
    }

    /// The files named by `FTREC_TLS_CERT`, `FTREC_TLS_KEY` and `FTREC_TLS_CA` (errors name
    /// the variables).
    pub fn from_env() -> Result<Option<Tls>, PsError> {
        let var = |name: &str| std::env::var_os(name).map(PathBuf::from);
        let (c, k, a) = (var(CERT_ENV), var(KEY_ENV), var(CA_ENV));
        Tls::load_as(c.as_deref(), k.as_deref(), a.as_deref(), ENV_NAMES)
    }

    /// The environment a child process needs to use the same files.
    pub fn env_vars(&self) -> Vec<(&'static str, String)> {
        vec![
            (CERT_ENV, self.cert.path.display().to_string()),
            (KEY_ENV, self.key.path.display().to_string()),
            (CA_ENV, self.ca.path.display().to_string()),
        ]
    }

    fn identity(&self) -> Identity {
        Identity::from_pem(&*self.cert.pem, &*self.key.pem)
    }

    /// The server side: this certificate, and client certificates must chain to the CA.
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity())
            .client_ca_root(Certificate::from_pem(&*self.ca.pem))
    }

    /// The client side: verify servers against the CA, present this certificate.
    pub fn client_config(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&*self.ca.pem))
            .identity(self.identity())
    }
}

/// An error and its sources on one line (tonic's transport errors say little at the top).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// The endpoint of a server at `addr`: `https://` with `tls`, `http://` without.
pub fn endpoint(addr: &str, tls: Option<&Tls>) -> Result<Endpoint, PsError> {
    use crate::grpc::{H2_CONNECTION_WINDOW, H2_MAX_FRAME, H2_STREAM_WINDOW};
    Ok(endpoint_inner(addr, tls)?
        .max_frame_size(H2_MAX_FRAME)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW))
}

fn endpoint_inner(addr: &str, tls: Option<&Tls>) -> Result<Endpoint, PsError> {
    let bad = |e: &dyn std::error::Error| PsError::Unavailable {
        addr: addr.to_string(),
        reason: format!("bad endpoint: {}", chain(e)),
    };
    match tls {
        None => Endpoint::from_shared(format!("http://{addr}")).map_err(|e| bad(&e)),
        Some(t) => Endpoint::from_shared(format!("https://{addr}"))
            .map_err(|e| bad(&e))?
            .tls_config(t.client_config())
            .map_err(|e| PsError::InvalidConfig(format!("TLS client setup: {}", chain(&e)))),
    }
}

/// A hint to append to a failed connection's `reason`: the usual cause when the two ends
/// disagree about TLS. None when the connection was refused: nothing listens there, and TLS
/// has nothing to do with it.
pub fn mismatch_hint(tls: Option<&Tls>, reason: &str) -> &'static str {
    if reason.to_ascii_lowercase().contains("connection refused") {
        return "";
    }
    match tls {
        None => {
            " (this client dials without TLS: if the server runs with --tls-cert, give this \
             process --tls-cert, --tls-key and --tls-ca too)"
        }
        Some(_) => {
            " (this client dials with TLS: the server may run without it, or its certificate \
             may not chain to this --tls-ca, or it may not accept this --tls-cert)"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{mismatch_hint, Tls, ENV_NAMES, FLAGS};
    use std::path::Path;

    #[test]
    fn tls_errors_name_the_flags_or_the_variables_the_files_came_from() {
        let gone = Path::new("/nonexistent/ftrec-cert.pem");
        let e = Tls::load_as(Some(gone), Some(gone), Some(gone), ENV_NAMES)
            .unwrap_err()
            .to_string();
        assert!(e.contains("$FTREC_TLS_CERT /nonexistent"), "{e}");
        assert!(!e.contains("--tls-cert"), "{e}");
        let e = Tls::load_as(Some(gone), None, None, ENV_NAMES)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("$FTREC_TLS_KEY and $FTREC_TLS_CA missing"),
            "{e}"
        );
        let e = Tls::load_as(None, Some(gone), None, FLAGS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--tls-cert and --tls-ca missing"), "{e}");
    }

    #[test]
    fn a_refused_connection_gets_no_tls_hint() {
        assert_eq!(
            mismatch_hint(None, "tcp connect error: Connection refused (os error 111)"),
            ""
        );
        assert!(
            mismatch_hint(None, "error trying to connect: unexpected EOF").contains("--tls-cert")
        );
    }
}
