//! Starting, watching and stopping server processes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{ClusterError, ServerSpec};

/// One running server process, started by [`ServerProcess::spawn`]. Dropping it kills the
/// process (SIGKILL) and reaps it, so no child outlives its handle.
#[derive(Debug)]
pub struct ServerProcess {
    pub id: u32,
    pub addr: SocketAddr,
    child: Child,
    /// Where it writes its address, and next to it its memory report at a normal stop.
    port_file: PathBuf,
}

/// Server `id`'s incarnation number `generation` ([`ftrec_ps::fence`]).
pub fn server_incarnation(id: u32, generation: u32) -> ftrec_ps::fence::Incarnation {
    ftrec_ps::fence::Incarnation::new(ftrec_ps::fence::FenceRole::Server, id, generation.into())
}

impl ServerProcess {
    /// Start `exe server ...` for `spec`, with its port file under `dir`, and wait (at most
    /// `timeout`) until it has written its bound address.
    pub fn spawn(
        exe: &Path,
        spec: &ServerSpec,
        dir: &Path,
        generation: u32,
        timeout: Duration,
    ) -> Result<ServerProcess, ClusterError> {
        let port_file: PathBuf = dir.join(format!("server-{}.{generation}.port", spec.id));
        let _ = std::fs::remove_file(&port_file);
        let mut spec = spec.clone();
        spec.port_file = Some(port_file.clone());
        spec.until = crate::spec::Lifetime::Stdin;
        let mut cmd = Command::new(exe);
        if let Some(cpus) = &spec.cpus {
            cpus.pin(&mut cmd);
        }
        let child = cmd
            .args(spec.to_args())
            // The token and job id go through the environment: a command line is public.
            .env_remove(ftrec_ps::auth::TOKEN_ENV)
            .env_remove(ftrec_ps::auth::JOB_ENV)
            .env_remove(ftrec_ps::tls::CERT_ENV)
            .env_remove(ftrec_ps::tls::KEY_ENV)
            .env_remove(ftrec_ps::tls::CA_ENV)
            .envs(spec.auth.env_vars())
            // Its incarnation: the coordinator's table fences the ones before it.
            .env(
                ftrec_ps::fence::INCARNATION_ENV,
                server_incarnation(spec.id, generation).to_string(),
            )
            // The server lives until this pipe closes (see `serve_shard`).
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| ClusterError::Spawn {
                what: format!("server {}", spec.id),
                reason: format!("cannot start {}: {e}", exe.display()),
            })?;
        let mut proc = ServerProcess {
            id: spec.id,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            child,
            port_file: port_file.clone(),
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(text) = std::fs::read_to_string(&port_file) {
                let text = text.trim();
                proc.addr = text.parse().map_err(|e| ClusterError::Spawn {
                    what: format!("server {}", spec.id),
                    reason: format!("port file {} holds {text:?}: {e}", port_file.display()),
                })?;
                return Ok(proc);
            }
            if let Ok(Some(status)) = proc.child.try_wait() {
                return Err(ClusterError::Spawn {
                    what: format!("server {}", spec.id),
                    reason: format!("the process exited with {status} before it was ready"),
                });
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::Spawn {
                    what: format!("server {}", spec.id),
                    reason: format!(
                        "no address in {} after {:.1}s",
                        port_file.display(),
                        timeout.as_secs_f64()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The memory report the process wrote when it stopped normally
    /// ([`crate::memory::ServerMemory`]); `None` while it runs, or if it was killed.
    pub fn memory(&self) -> Option<crate::memory::ServerMemory> {
        crate::memory::read_memory_file(&self.port_file)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited (and was reaped).
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Wait up to `timeout` for the process to exit by itself; its exit status if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => return None,
            }
        }
    }

    /// SIGKILL the process and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Ask the process to exit (close its stdin), wait up to `grace`, then SIGKILL it.
    pub fn stop(&mut self, grace: Duration) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.kill();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if !self.has_exited() {
            self.kill();
        }
    }
}
