//! TLS on every gRPC connection, with certificates made in the test (`rcgen`): a whole run
//! over mutual TLS (with a server kill and a restore through the checkpoint service) gives
//! the plain run's digest; a plain client, a client of another CA and a server whose key does
//! not match its certificate each fail with one clear line; bad TLS files and incomplete
//! flags are refused at start-up, naming the flag and the file.

mod common;

use std::path::{Path, PathBuf};

use ftrec_cluster::args::{parse_process, ProcessCmd};
use ftrec_cluster::auth::Auth;
use ftrec_cluster::{build_server, run, RunConfig, StrategyChoice};
use ftrec_ps::auth::ServeOptions;
use ftrec_ps::grpc::{ps_service, serve_routes_with, GrpcClient, GrpcConfig, Routes};
use ftrec_ps::tls::Tls;
use ftrec_ps::{PsService, SharedServer};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};

/// The three files of one run: a self-signed CA and a certificate it signed for loopback
/// (`127.0.0.1` and `localhost`), good as server and as client.
struct Files {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

fn make_files(dir: &Path, name: &str) -> Files {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &ca).unwrap();
    let f = Files {
        cert: dir.join(format!("{name}-cert.pem")),
        key: dir.join(format!("{name}-key.pem")),
        ca: dir.join(format!("{name}-ca.pem")),
    };
    std::fs::write(&f.cert, cert.pem()).unwrap();
    std::fs::write(&f.key, key.serialize_pem()).unwrap();
    std::fs::write(&f.ca, ca.pem()).unwrap();
    f
}

fn tls(f: &Files) -> Tls {
    Tls::load(Some(&f.cert), Some(&f.key), Some(&f.ca))
        .unwrap()
        .unwrap()
}

fn with_tls(t: Option<Tls>) -> Auth {
    Auth {
        token: None,
        job: None,
        tls: t,
        fences: Default::default(),
    }
}

fn config(dir: &Path) -> RunConfig {
    let mut cfg = common::tiny_run(dir, 3, 1, 12, 9);
    cfg.sync = true;
    cfg.eval_samples = 256;
    cfg.strategy = StrategyChoice::Full { every_steps: 4 };
    cfg.kills = vec!["server=2@step=7".parse().unwrap()];
    cfg
}

#[test]
fn a_run_over_mutual_tls_with_a_server_kill_equals_the_plain_run() {
    let dir = tempfile::tempdir().unwrap();
    let plain = run(&config(&dir.path().join("plain"))).unwrap();
    let files = make_files(dir.path(), "run");
    let mut cfg = config(&dir.path().join("tls"));
    cfg.auth = with_tls(Some(tls(&files)));
    let secured = run(&cfg).unwrap();
    assert_eq!(plain.failures.len(), 1);
    assert_eq!(secured.failures.len(), 1);
    assert!(secured.failures[0].recovered_s.is_some());
    assert_eq!(secured.model_digest, plain.model_digest);
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn clients_without_tls_or_of_another_ca_are_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let files = make_files(dir.path(), "run");
    let other = make_files(dir.path(), "other");
    let mut spec = config(dir.path()).server_spec(0);
    spec.servers = 1;
    spec.auth = with_tls(Some(tls(&files)));
    let mut server = common::start_server(&spec, dir.path());
    let addr = server.addr;
    let rt = rt();
    let connect = |auth: Auth| {
        rt.block_on(async move {
            let c = GrpcClient::connect_with(addr, GrpcConfig::default(), &auth).await?;
            c.info().await
        })
    };
    // The run's certificate: served.
    let info = connect(with_tls(Some(tls(&files)))).unwrap();
    assert!(info.dim > 0);
    // A plain client: refused, and told why it may be.
    let e = connect(with_tls(None)).unwrap_err().to_string();
    assert!(
        e.contains(&addr.to_string()) && e.contains("without TLS") && !e.contains('\n'),
        "{e}"
    );
    // A client of another CA: it does not trust the server's certificate.
    let e = connect(with_tls(Some(tls(&other))))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("certificate") && e.contains("with TLS") && !e.contains('\n'),
        "{e}"
    );
    // A client that trusts the run's CA but presents another CA's certificate: the server
    // refuses it in the handshake (mutual TLS).
    let mixed = Tls::load(Some(&other.cert), Some(&other.key), Some(&files.ca))
        .unwrap()
        .unwrap();
    let e = connect(with_tls(Some(mixed))).unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e}");
    server.kill();
}

#[test]
fn bad_tls_files_and_incomplete_flags_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let f = make_files(dir.path(), "run");
    let other = make_files(dir.path(), "other");
    let missing = dir.path().join("missing.pem");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let torn = dir.path().join("torn.pem");
    let pem = std::fs::read_to_string(&f.cert).unwrap();
    std::fs::write(&torn, &pem[..pem.len() / 2]).unwrap();
    let load = |c: &Path, k: &Path, a: &Path| {
        Tls::load(Some(c), Some(k), Some(a))
            .unwrap_err()
            .to_string()
    };
    let cases = [
        (load(&missing, &f.key, &f.ca), "--tls-cert", &missing),
        (load(&f.cert, &missing, &f.ca), "--tls-key", &missing),
        (load(&f.cert, &f.key, &missing), "--tls-ca", &missing),
        (load(&garbage, &f.key, &f.ca), "--tls-cert", &garbage),
        (load(&torn, &f.key, &f.ca), "--tls-cert", &torn),
        // A certificate where the key should be, and the reverse.
        (load(&f.cert, &f.cert, &f.ca), "--tls-key", &f.cert),
        (load(&f.cert, &f.key, &f.key), "--tls-ca", &f.key),
    ];
    for (e, flag, path) in cases {
        assert!(
            e.contains(flag) && e.contains(&path.display().to_string()) && !e.contains('\n'),
            "{e}"
        );
    }
    let e = Tls::load(Some(&f.cert), None, Some(&f.ca))
        .unwrap_err()
        .to_string();
    assert!(e.contains("--tls-key") && e.contains("together"), "{e}");
    assert!(Tls::load(None, None, None).unwrap().is_none());

    // Through the command line of `ftrec server`: the same error, before anything binds.
    let args = |extra: &[&Path]| {
        let mut v: Vec<String> = ["server", "--id", "0", "--servers", "1", "--preset", "tiny"]
            .map(String::from)
            .to_vec();
        for (flag, p) in ["--tls-cert", "--tls-key", "--tls-ca"].iter().zip(extra) {
            v.push(flag.to_string());
            v.push(p.display().to_string());
        }
        v
    };
    let spec_err = |v: Vec<String>| match parse_process(&v).unwrap() {
        ProcessCmd::Server(a) => a.spec().unwrap_err().to_string(),
        other => panic!("not a server: {other:?}"),
    };
    let e = spec_err(args(&[&f.cert, &garbage, &f.ca]));
    assert!(e.contains("--tls-key") && e.contains("garbage.pem"), "{e}");
    let e = spec_err(args(&[&f.cert]));
    assert!(e.contains("--tls-key and --tls-ca missing"), "{e}");

    // A key that is not the certificate's: refused when the server starts, in one line.
    let mismatched = Tls::load(Some(&f.cert), Some(&other.key), Some(&f.ca))
        .unwrap()
        .unwrap();
    let spec = config(dir.path()).server_spec(0);
    let server = SharedServer::new(build_server(&spec).unwrap());
    let routes = Routes::new(ps_service(server, GrpcConfig::default()));
    let options = ServeOptions::with_auth(with_tls(Some(mismatched)));
    let e = rt()
        .block_on(serve_routes_with(routes, spec.listen, &options))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("TLS server setup") && !e.contains('\n'), "{e}");
}
