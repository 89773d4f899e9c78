//! The job record: what a saving run is, written into its store when it starts, so that the
//! job can be started again from the store alone (`ftrec run --resume LOCATION`, [`resume`]).
//!
//! The record is the run's [`RunConfig`] serialized as a whole (so a field added to the
//! configuration is recorded with no change here) minus what belongs to one invocation and not
//! to the job ([`PER_INVOCATION`]: the executable, the work directory, the store's own
//! location, kills, addresses and ports, heartbeat and start timeouts, the report interval).
//! It is JSON in the store's framed job-record format (`ftrec-ckpt`'s `JOBR`: magic, version,
//! checksums; kind [`JOB_KIND`]), next to `CURRENT`, where garbage collection never looks.
//!
//! [`resume`]: crate::resume

use ftrec_ckpt::location::{self, LocationOptions};
use ftrec_ckpt::{Checkpoints, JobRecord};
use serde_json::{Map, Value};

use crate::{ClusterError, RunConfig};

/// The kind of a job record written by this crate.
pub const JOB_KIND: &str = "ftrec-cluster/run-config+json";

/// Fields of [`RunConfig`] that one invocation sets and the job does not record.
pub const PER_INVOCATION: &[&str] = &[
    "exe",
    "work_dir",
    "store",
    "kills",
    "control_listen",
    "external_servers",
    "external_workers",
    "heartbeat",
    "heartbeat_timeout",
    "start_timeout",
    "lease_ttl",
    "save_timeout_s",
    "report_interval_s",
];

/// A job as its store records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The recorded fields of the job's [`RunConfig`], as JSON.
    pub fields: Map<String, Value>,
}

impl Job {
    /// The job `cfg` runs (its per-invocation fields left out).
    pub fn of(cfg: &RunConfig) -> Result<Job, ClusterError> {
        let mut fields = match serde_json::to_value(cfg) {
            Ok(Value::Object(m)) => m,
            Ok(_) => {
                return Err(ClusterError::Protocol(
                    "a run configuration is no map".into(),
                ))
            }
            Err(e) => {
                return Err(ClusterError::Protocol(format!(
                    "serializing the run configuration: {e}"
                )))
            }
        };
        for k in PER_INVOCATION {
            fields.remove(*k);
        }
        Ok(Job { fields })
    }

    /// The record to store.
    pub fn record(&self) -> Result<JobRecord, ClusterError> {
        let body = serde_json::to_vec_pretty(&Value::Object(self.fields.clone()))
            .map_err(|e| ClusterError::Protocol(format!("serializing the job record: {e}")))?;
        Ok(JobRecord {
            kind: JOB_KIND.into(),
            body,
        })
    }

    /// Read a stored record (`file`: its name, for errors).
    pub fn from_record(file: &str, rec: &JobRecord) -> Result<Job, ClusterError> {
        if rec.kind != JOB_KIND {
            return Err(ClusterError::Checkpoint(format!(
                "{file}: a job record of kind {:?}, not {JOB_KIND:?} (not written by ftrec run)",
                rec.kind
            )));
        }
        match serde_json::from_slice(&rec.body) {
            Ok(Value::Object(fields)) => Ok(Job { fields }),
            Ok(_) => Err(ClusterError::Checkpoint(format!(
                "{file}: the job record is not a JSON object"
            ))),
            Err(e) => Err(ClusterError::Checkpoint(format!(
                "{file}: the job record is not valid JSON: {e}"
            ))),
        }
    }

    /// The job's configuration for one invocation: every recorded field, the per-invocation
    /// ones from `invocation` (whose other fields are ignored). Not validated.
    pub fn config(&self, invocation: &RunConfig) -> Result<RunConfig, ClusterError> {
        let mut v = match serde_json::to_value(invocation) {
            Ok(Value::Object(m)) => m,
            _ => {
                return Err(ClusterError::Protocol(
                    "a run configuration is no map".into(),
                ))
            }
        };
        for (k, val) in &self.fields {
            if !PER_INVOCATION.contains(&k.as_str()) {
                v.insert(k.clone(), val.clone());
            }
        }
        serde_json::from_value(Value::Object(v)).map_err(|e| {
            ClusterError::Checkpoint(format!(
                "the job record does not describe a run of this build: {e}"
            ))
        })
    }
}

/// Write `cfg`'s job into `ckpts` (replacing any record there).
pub(crate) async fn write(ckpts: &Checkpoints, cfg: &RunConfig) -> Result<(), ClusterError> {
    let rec = Job::of(cfg)?.record()?;
    ckpts.write_job(&rec).await.map_err(|e| {
        ClusterError::Checkpoint(format!(
            "writing the job record {}: {e}",
            ckpts.job_key().as_str()
        ))
    })
}

/// The job recorded in the store at `location` (S3 settings from the AWS environment
/// variables). A store without a record, or a damaged record, is an error naming it.
pub fn read(location: &str) -> Result<Job, ClusterError> {
    let (file, job) = read_at(location, &LocationOptions::from_env())?;
    job.ok_or_else(|| {
        ClusterError::Checkpoint(format!(
            "{location} has no job record ({file}): it was not written by a saving \
             `ftrec run` (strategies full, deck, cpr, incrcp, incremental, cnr)"
        ))
    })
}

/// The job recorded in the store at `location`, or `None` when it has no record (a store
/// written by a benchmark or by a build from before job records). A damaged record is an
/// error naming it. `opts`: the store's settings (S3 endpoint, credentials).
pub fn read_if_any(location: &str, opts: &LocationOptions) -> Result<Option<Job>, ClusterError> {
    Ok(read_at(location, opts)?.1)
}

/// The record's file name and the record, if any.
fn read_at(location: &str, opts: &LocationOptions) -> Result<(String, Option<Job>), ClusterError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClusterError::Io {
            what: "starting a runtime to read the job record".into(),
            source: e,
        })?;
    rt.block_on(async {
        let store = location::open(location, opts)
            .await
            .map_err(|e| ClusterError::Checkpoint(format!("store {location}: {e}")))?;
        let ckpts = Checkpoints::new(store);
        let file = format!("{location}/{}", ckpts.job_key().as_str());
        match ckpts.read_job().await {
            Ok(Some(rec)) => {
                let job = Job::from_record(&file, &rec)?;
                Ok((file, Some(job)))
            }
            Ok(None) => Ok((file, None)),
            Err(e) => Err(ClusterError::Checkpoint(format!("job record: {e}"))),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StrategyChoice;
    use ftrec_core::Preset;

    fn cfg() -> RunConfig {
        let mut c = RunConfig::new(Preset::tiny(), "/bin/x".into(), "/tmp/w".into());
        c.strategy = StrategyChoice::parse("deck", 4).unwrap();
        c.seed = 9;
        c.servers = 3;
        c.kills = vec!["server=1@step=3".parse().unwrap()];
        c.store = Some("/tmp/s".into());
        c
    }

    #[test]
    fn a_job_round_trips_without_its_invocation() {
        let c = cfg();
        let job = Job::of(&c).unwrap();
        for k in PER_INVOCATION {
            assert!(!job.fields.contains_key(*k), "{k} recorded");
        }
        let rec = job.record().unwrap();
        let back = Job::from_record("JOB", &rec).unwrap();
        assert_eq!(back, job);
        let other = RunConfig::new(Preset::small(), "/bin/y".into(), "/tmp/v".into());
        let rebuilt = back.config(&other).unwrap();
        // The job's fields from the record, the invocation's from the other configuration.
        assert_eq!(rebuilt.preset, c.preset);
        assert_eq!(
            (rebuilt.seed, rebuilt.servers, rebuilt.strategy),
            (9, 3, c.strategy)
        );
        assert_eq!(rebuilt.exe, other.exe);
        assert_eq!(rebuilt.work_dir, other.work_dir);
        assert!(rebuilt.kills.is_empty() && rebuilt.store.is_none());
        let mut expect = c.clone();
        expect.exe = other.exe.clone();
        expect.work_dir = other.work_dir.clone();
        expect.kills.clear();
        expect.store = None;
        assert_eq!(rebuilt, expect);
    }

    #[test]
    fn foreign_or_damaged_bodies_are_refused_by_name() {
        let rec = JobRecord {
            kind: "something-else".into(),
            body: b"{}".to_vec(),
        };
        let e = Job::from_record("st/JOB", &rec).unwrap_err().to_string();
        assert!(e.contains("st/JOB") && e.contains("something-else"), "{e}");
        let rec = JobRecord {
            kind: JOB_KIND.into(),
            body: b"{not json".to_vec(),
        };
        let e = Job::from_record("st/JOB", &rec).unwrap_err().to_string();
        assert!(e.contains("st/JOB") && e.contains("JSON"), "{e}");
    }
}
