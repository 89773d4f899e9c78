//! The HTTP endpoint of `--metrics-listen`: `/metrics`, `/healthz`, `/readyz`. It runs on a
//! thread of its own with its own small runtime, so a role whose runtime is busy (a
//! coordinator blocked on a step, a server decoding a rebuild) still answers its probes and
//! scrapes, and it lives as long as the process.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};

use crate::{metrics, ObsError};

static READY: AtomicBool = AtomicBool::new(false);

/// Mark the process ready (`/readyz` answers 200) or not (503): a server once it serves its
/// shard, a worker once it is set up, a coordinator once training started.
pub fn set_ready(ready: bool) {
    READY.store(ready, Ordering::SeqCst);
}

/// A running endpoint (it serves until the process exits).
#[derive(Debug, Clone, Copy)]
pub struct Endpoint {
    addr: SocketAddr,
}

impl Endpoint {
    /// Listen on `addr` (bound before this returns, so a taken port is an error here) and
    /// serve on a thread of its own.
    pub fn start(addr: SocketAddr) -> Result<Endpoint, ObsError> {
        let err = |e: std::io::Error| ObsError::Listen {
            addr: addr.to_string(),
            reason: e.to_string(),
        };
        let listener = std::net::TcpListener::bind(addr).map_err(err)?;
        listener.set_nonblocking(true).map_err(err)?;
        let bound = listener.local_addr().map_err(err)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(err)?;
        std::thread::Builder::new()
            .name("ftrec-metrics".into())
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    serve(listener).await
                })
            })
            .map_err(err)?;
        Ok(Endpoint { addr: bound })
    }

    /// The address it listens on (the port the system chose for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

async fn serve(listener: tokio::net::TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors or the like: try again shortly rather than spin.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, hyper::service::service_fn(answer))
                .await;
        });
    }
}

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let text = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(text(
            StatusCode::METHOD_NOT_ALLOWED,
            "GET only\n".to_string(),
        ));
    }
    let response = match req.uri().path() {
        "/metrics" => {
            let mut r = text(StatusCode::OK, metrics().encode());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" if READY.load(Ordering::SeqCst) => text(StatusCode::OK, "ready\n".into()),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "starting\n".into()),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: /metrics, /healthz or /readyz\n".into(),
        ),
    };
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_health_and_readiness() {
        let e = Endpoint::start("127.0.0.1:0".parse().unwrap()).unwrap();
        metrics().steps.inc();
        let m = get(e.addr(), "/metrics");
        assert!(m.starts_with("HTTP/1.1 200"), "{m}");
        assert!(m.contains("ftrec_steps_total"), "{m}");
        assert!(m.contains("openmetrics-text"), "{m}");
        assert!(get(e.addr(), "/healthz").starts_with("HTTP/1.1 200"));
        set_ready(false);
        assert!(get(e.addr(), "/readyz").starts_with("HTTP/1.1 503"));
        set_ready(true);
        assert!(get(e.addr(), "/readyz").starts_with("HTTP/1.1 200"));
        assert!(get(e.addr(), "/nothing").starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn a_taken_port_is_an_error_naming_the_flag() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = Endpoint::start(held.local_addr().unwrap()).unwrap_err();
        assert!(
            e.to_string().starts_with("--metrics-listen 127.0.0.1:"),
            "{e}"
        );
    }
}
