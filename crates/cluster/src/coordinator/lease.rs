//! The coordinator's side of the store's writer lease ([`ftrec_ckpt::lease`]): claimed before
//! the run writes anything, renewed in the background every third of its time to live,
//! released when the run ends. A run that loses it (another job took the store over while this
//! one was paused, or the store could not be reached for a whole time to live) stops with one
//! line and writes nothing more: its commits would fail anyway, `CURRENT` carrying the newer
//! generation. A run whose last renewal is a whole time to live old holds no lease either,
//! whether or not its renewer has noticed: a job woken from a pause (a frozen host) stops at
//! its first check, before its renewer's next try and before anything it does next writes. The lease's generation is also the coordinator's incarnation epoch on every
//! RPC ([`incarnate`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ftrec_ckpt::lease::{self, Lease};
use ftrec_ckpt::{Checkpoints, CkptError};
use ftrec_ps::auth::Auth;
use ftrec_ps::fence::{FenceRole, Fences, Incarnation};

use crate::{ClusterError, RunConfig};

/// The lease this run holds, and why it was lost, if it was.
/// Dropping it gives the lease up (whatever ends the run: its end, an error before training).
pub(super) struct LeaseKeeper {
    lease: Arc<tokio::sync::Mutex<Lease>>,
    lost: Arc<Mutex<Option<String>>>,
    /// When the lease was last taken or renewed (a monotonic clock, which runs on while the
    /// process is stopped).
    renewed: Arc<Mutex<Instant>>,
    ttl: Duration,
    renewer: tokio::task::JoinHandle<()>,
    rt: tokio::runtime::Handle,
}

fn store_err(location: &str, e: CkptError) -> ClusterError {
    ClusterError::Checkpoint(format!("store {location}: {e}"))
}

/// Claim `ckpts` for this run. A fresh run (`resume` false) is refused on a store that holds
/// another job's checkpoints or record; any run is refused while another live process holds
/// the lease. Returns the keeper and the generation commits carry.
pub(super) fn claim(
    rt: &tokio::runtime::Runtime,
    ckpts: &Checkpoints,
    location: &str,
    what: &str,
    ttl: Duration,
    resume: bool,
) -> Result<(LeaseKeeper, u64), ClusterError> {
    let lease = rt.block_on(async {
        if !resume {
            let held = lease::read_lease(ckpts)
                .await
                .map_err(|e| store_err(location, e))?;
            let live = held
                .as_ref()
                .filter(|r| !r.is_free(lease::now_ms()) && !lease::holder_is_gone(&r.holder));
            if live.is_none() {
                let job = ckpts.read_job().await.map_err(|e| store_err(location, e))?;
                let current = ckpts
                    .read_current()
                    .await
                    .map_err(|e| store_err(location, e))?;
                if job.is_some() || current.is_some() {
                    return Err(ClusterError::Config(format!(
                        "store {location} already holds a job's checkpoints: continue that job \
                         with `ftrec run --resume {location}`, or pass a new --store"
                    )));
                }
            }
        }
        let lease = Lease::acquire(ckpts, what, ttl)
            .await
            .map_err(|e| match e {
                CkptError::Held { .. } => ClusterError::Config(format!("store {location}: {e}")),
                e => store_err(location, e),
            })?;
        // The collections of the writers before this one are fenced: their announcements go.
        lease::clear_announcements(ckpts, lease.generation())
            .await
            .map_err(|e| store_err(location, e))?;
        Ok(lease)
    })?;
    let generation = lease.generation();
    let lease = Arc::new(tokio::sync::Mutex::new(lease));
    let lost = Arc::new(Mutex::new(None));
    let renewed = Arc::new(Mutex::new(Instant::now()));
    let renewer = {
        let (lease, lost, renewed) = (lease.clone(), lost.clone(), renewed.clone());
        rt.spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                let mut l = lease.lock().await;
                let asked = Instant::now();
                let why = match l.renew().await {
                    Ok(()) => {
                        *renewed.lock().unwrap_or_else(|p| p.into_inner()) = asked;
                        continue;
                    }
                    Err(e @ CkptError::Fenced { .. }) => e.to_string(),
                    Err(_) if l.is_fresh() => continue,
                    Err(e) => format!(
                        "the store's lease could not be renewed for {:.0}s ({e}): another job may take the store over",
                        ttl.as_secs_f64()
                    ),
                };
                *lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                return;
            }
        })
    };
    Ok((
        LeaseKeeper {
            lease,
            lost,
            renewed,
            ttl,
            renewer,
            rt: rt.handle().clone(),
        },
        generation,
    ))
}

impl LeaseKeeper {
    /// `Err` once the lease is lost, or its last renewal is a whole time to live old: the
    /// run must stop writing.
    pub(super) fn check(&self) -> Result<(), ClusterError> {
        let age = self
            .renewed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed();
        if age >= self.ttl {
            self.lost(format!(
                "fenced: the store's lease was last renewed {:.1}s ago, past its time to live of {:.1}s \
                 (this process was paused or could not reach the store): another job may hold \
                 the store now",
                age.as_secs_f64(),
                self.ttl.as_secs_f64()
            ));
        }
        match self.lost.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(why) => Err(ClusterError::Fenced(why.clone())),
            None => Ok(()),
        }
    }

    /// A store operation found this writer fenced (a commit refused by `CURRENT`'s
    /// generation): the lease is lost whatever the renewals say.
    pub(super) fn lost(&self, why: String) {
        let mut l = self.lost.lock().unwrap_or_else(|p| p.into_inner());
        l.get_or_insert(why);
    }
}

impl Drop for LeaseKeeper {
    /// Give the lease up. Nothing to give up once it is lost.
    fn drop(&mut self) {
        self.renewer.abort();
        if self.check().is_err() {
            return;
        }
        let (lease, rt) = (self.lease.clone(), self.rt.clone());
        // A thread of its own: a drop may happen inside the runtime, where blocking on it
        // is not allowed.
        let _ = std::thread::spawn(move || {
            rt.block_on(async move {
                let _ = lease.lock().await.release().await;
            })
        })
        .join();
    }
}

/// `cfg` with the coordinator's incarnation ([`ftrec_ps::fence`]): its epoch is the store
/// lease's generation (0 without a store), so a coordinator that took the job over outranks
/// the one before it on every server both reach. Clones of the returned configuration share
/// one table of the job's live incarnations.
pub(super) fn incarnate(cfg: &RunConfig, store: Option<&super::store::StoreState>) -> RunConfig {
    let epoch = store.and_then(|s| s.ckpts.generation()).unwrap_or(0);
    let me = Incarnation::new(FenceRole::Coordinator, 0, epoch);
    RunConfig {
        auth: Auth {
            fences: Fences::new(Some(me)),
            ..cfg.auth.clone()
        },
        ..cfg.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ftrec_ckpt::{Checkpoints, MemoryStore};

    use super::*;

    /// A keeper whose last renewal is a time to live old (as after a pause: the monotonic
    /// clock ran on while the process was stopped, and the renewer has not run yet) refuses
    /// at once, names the fence, and does not give up a lease it may no longer hold.
    #[test]
    fn a_keeper_not_renewed_for_its_time_to_live_stops_writing_before_its_renewer_notices() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let ckpts = Checkpoints::new(Arc::new(MemoryStore::new()));
        let ttl = Duration::from_secs(3600);
        let (keeper, generation) = claim(&rt, &ckpts, "mem", "a test job", ttl, false).unwrap();
        assert_eq!(generation, 1);
        keeper.check().unwrap();
        // The pause: the last renewal moved a time to live into the past (the renewer, asleep
        // for a third of an hour, has not noticed).
        *keeper.renewed.lock().unwrap() = Instant::now() - ttl;
        let err = keeper.check().unwrap_err().to_string();
        assert!(
            err.contains("fenced") && err.contains("time to live"),
            "{err}"
        );
        // Lost for good, and not released by the drop.
        *keeper.renewed.lock().unwrap() = Instant::now();
        assert!(keeper.check().is_err());
        drop(keeper);
        let record = rt.block_on(lease::read_lease(&ckpts)).unwrap().unwrap();
        assert!(!record.released, "{record:?}");
        assert_eq!(record.generation, 1);
    }
}
