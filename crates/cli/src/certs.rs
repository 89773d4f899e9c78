//! `ftrec certs`: the three PEM files of mutual TLS (`--tls-cert`, `--tls-key`, `--tls-ca`) for
//! a test or a first try, without `openssl`: a fresh self-signed CA and one certificate it
//! signed, good as server and as client, for the host names and addresses given. The CA's
//! key is not kept, so nothing else can be signed with it; production certificates come from
//! the site's own CA.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

#[derive(Args, Debug, Clone)]
pub struct CertsArgs {
    /// Directory to write ca.pem, NAME-cert.pem and NAME-key.pem into (created if missing).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// File name prefix of the certificate and its key.
    #[arg(long, default_value = "ftrec")]
    pub name: String,
    /// Host names and IP addresses the certificate covers: every address a process dials
    /// (repeat the flag or separate with commas).
    #[arg(long = "host", value_delimiter = ',', default_values_t = ["127.0.0.1".to_string(), "localhost".to_string()])]
    pub hosts: Vec<String>,
    /// Overwrite files that exist.
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: CertsArgs) -> Result<()> {
    if a.name.is_empty() || a.name.contains('/') {
        bail!("--name {:?} must be a plain file name prefix", a.name);
    }
    if a.hosts.iter().any(|h| h.trim().is_empty()) {
        bail!("--host must name a host or an address");
    }
    let ca_path = a.dir.join("ca.pem");
    let cert_path = a.dir.join(format!("{}-cert.pem", a.name));
    let key_path = a.dir.join(format!("{}-key.pem", a.name));
    if !a.force {
        if let Some(p) = [&ca_path, &cert_path, &key_path]
            .into_iter()
            .find(|p| p.exists())
        {
            bail!("{} exists (give --force to overwrite it)", p.display());
        }
    }
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ftrec test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(a.hosts.clone())
        .with_context(|| format!("--host {}", a.hosts.join(",")))?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("ftrec {}", a.name));
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &ca)?;
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    for (path, pem) in [
        (&ca_path, ca.pem()),
        (&cert_path, cert.pem()),
        (&key_path, key.serialize_pem()),
    ] {
        std::fs::write(path, pem).with_context(|| format!("writing {}", path.display()))?;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("making {} private", key_path.display()))?;
    }
    println!(
        "wrote {} (CA), {} and {} (certificate for {}): give every process --tls-cert {} \
         --tls-key {} --tls-ca {}",
        ca_path.display(),
        cert_path.display(),
        key_path.display(),
        a.hosts.join(", "),
        cert_path.display(),
        key_path.display(),
        ca_path.display()
    );
    Ok(())
}
