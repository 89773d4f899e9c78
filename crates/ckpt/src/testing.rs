//! A real S3-compatible server for tests, in process on 127.0.0.1 (`s3s` over `s3s-fs`, one
//! per process, with a fresh directory and one bucket, [`BUCKET`]), so that every backend test
//! and every end-to-end run against S3 needs nothing installed. Behind the `s3-test-server`
//! feature; never part of a production build.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use crate::{Key, S3Config, S3Store};

pub const BUCKET: &str = "ftrec-test";
pub const ACCESS_KEY: &str = "ftrec-access";
pub const SECRET_KEY: &str = "ftrec-secret-key";

pub struct S3Server {
    pub endpoint: String,
    pub root: PathBuf,
}

impl S3Server {
    /// Point this process's AWS variables at this server with the test credentials: the
    /// processes a test starts (a job's servers, workers and merger) then reach an `s3://`
    /// store the way production ones do, and so does [`crate::location::open`] here. The
    /// variables are process-wide: only tests whose other stores are directories may call it.
    pub fn set_env(&self) {
        for (k, v) in [
            ("AWS_ENDPOINT_URL", self.endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ALLOW_HTTP", "true"),
        ] {
            std::env::set_var(k, v);
        }
    }
}

/// Remove server directories of test processes that have exited.
fn sweep_stale(base: &std::path::Path) {
    let Ok(rd) = std::fs::read_dir(base) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Ok(pid) = name.parse::<u32>() {
            if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// One server per test binary, on its own thread and runtime so that it outlives each
/// `#[tokio::test]` runtime.
pub fn s3_server() -> &'static S3Server {
    static SERVER: OnceLock<S3Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let base = std::env::temp_dir().join("ftrec-ckpt-s3s");
        sweep_stale(&base);
        let root = base.join(std::process::id().to_string());
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join(BUCKET)).expect("create the bucket directory");
        let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
        let server_root = root.clone();
        std::thread::Builder::new()
            .name("s3s".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("server runtime");
                rt.block_on(serve(server_root, tx));
            })
            .expect("spawn the server thread");
        let addr = rx.recv().expect("the server reports its address");
        S3Server {
            endpoint: format!("http://{addr}"),
            root,
        }
    })
}

async fn serve(root: PathBuf, tx: std::sync::mpsc::Sender<SocketAddr>) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto::Builder;
    use s3s::auth::SimpleAuth;
    use s3s::service::S3ServiceBuilder;

    let fs = s3s_fs::FileSystem::new(root).expect("s3s-fs root");
    let mut b = S3ServiceBuilder::new(fs);
    b.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
    let service = b.build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    tx.send(listener.local_addr().expect("local address"))
        .expect("report the address");
    let http = Builder::new(TokioExecutor::new());
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            continue;
        };
        let conn = http
            .serve_connection(TokioIo::new(socket), service.clone())
            .into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

pub fn s3_config(prefix: Option<&str>) -> S3Config {
    let server = s3_server();
    let mut c = S3Config::new(&server.endpoint, BUCKET, ACCESS_KEY, SECRET_KEY);
    c.prefix = prefix.map(|p| Key::new(p).expect("valid prefix"));
    c
}

pub async fn s3_store(prefix: Option<&str>) -> Arc<S3Store> {
    Arc::new(
        S3Store::connect(s3_config(prefix))
            .await
            .expect("connect to the in-process S3 server"),
    )
}
