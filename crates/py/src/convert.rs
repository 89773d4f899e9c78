//! The binding's pure conversions: what the library crates return, as the JSON values the
//! Python side receives as dicts and lists, and which Python exception an error becomes. No
//! Python object is touched here, so everything is unit-tested without an interpreter.

use std::error::Error;

use ftrec_ckpt::deck::Listed;
use ftrec_ckpt::format::PieceScheme;
use ftrec_ckpt::verify::StoreCheck;
use ftrec_ckpt::CkptError;
use ftrec_cluster::restored::{ArgNames, RestoreError};
use serde_json::{json, Value};

/// The keyword arguments of `Store.state_dict`, as errors name them.
pub const ARGS: ArgNames = ArgNames {
    at: "at",
    preset: "preset",
    optimizer: "optimizer",
    dense_optimizer: "dense_optimizer",
};

/// The Python exception an error becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raise {
    /// `FileNotFoundError`: the store's directory does not exist.
    FileNotFound,
    /// `ValueError`: an argument names no store, no state, or a shape the model does not have.
    Value,
    /// `ftrec.FtrecError`: the store failed (damage, an unreachable service).
    Ftrec,
}

/// Which exception `e` raises: the caller's input is at fault ([`Raise::Value`],
/// [`Raise::FileNotFound`]), or the store ([`Raise::Ftrec`]).
pub fn raise_of(e: &RestoreError) -> Raise {
    match e {
        RestoreError::NoSuchStore { .. } => Raise::FileNotFound,
        RestoreError::NotADirectory { .. }
        | RestoreError::NotAStore { .. }
        | RestoreError::InvalidArgument { .. }
        | RestoreError::NoState { .. }
        | RestoreError::Empty { .. }
        | RestoreError::Shape(_) => Raise::Value,
        // A location that is no directory path or s3:// URL.
        RestoreError::Open {
            source: CkptError::InvalidArgument(_) | CkptError::InvalidKey { .. },
            ..
        } => Raise::Value,
        _ => Raise::Ftrec,
    }
}

/// `e` and its causes, outermost first, in one line (as the `ftrec` binary says an error).
pub fn message(e: &dyn Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        parts.push(c.to_string());
        cause = c.source();
    }
    parts.join(": ")
}

/// One checkpoint as `ftrec ckpt ls` shows it; `piece`: an incremental piece's scheme and
/// column.
pub fn listed_json(l: &Listed<'_>, piece: Option<(PieceScheme, u32)>) -> Value {
    let n = l.node;
    json!({
        "id": n.id.as_str(),
        "kind": n.kind.name(),
        "step": n.step,
        "layer": n.layer,
        "bytes": n.bytes,
        "parent": n.parent.as_ref().map(|p| p.as_str()),
        "stands_for": n.tip.as_str(),
        "merged_from": n.merged_from.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
        "current": l.current,
        "live": l.live,
        "scheme": piece.map(|(s, _)| s.name()),
        "column": piece.map(|(_, c)| c),
    })
}

/// What `ftrec ckpt verify` found, with its report's lines under `report`.
pub fn check_json(c: &StoreCheck) -> Value {
    let pairs = |v: &[(ftrec_ckpt::CheckpointId, String)]| {
        v.iter()
            .map(|(id, why)| json!({"id": id.as_str(), "problem": why}))
            .collect::<Vec<_>>()
    };
    json!({
        "ok": c.is_ok(),
        "problems": c.problems(),
        "incremental": c.incremental,
        "checkpoints": c.checkpoints.iter().map(|k| json!({
            "id": k.id.as_str(),
            "ok": k.problem.is_none(),
            "files": k.files,
            "bytes": k.bytes,
            "removed": k.removed,
            "problem": k.problem,
        })).collect::<Vec<_>>(),
        "unreadable": pairs(&c.unreadable),
        "damaged_files": c.damaged_files.iter().map(|d| json!({
            "file": d.file,
            "problem": d.problem,
            "states": d.states.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "down": pairs(&c.down),
        "broken": c.broken.as_ref().map(|(head, why)| json!({"head": head.as_str(), "problem": why})),
        "newest_intact": c.newest_intact.as_ref().and_then(|r| r.as_ref().ok()).map(|id| id.as_str()),
        "no_intact_state": c.newest_intact.as_ref().and_then(|r| r.as_ref().err()),
        "report": c.render(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftrec_ckpt::deck::Lineage;
    use ftrec_ckpt::verify::CheckedCheckpoint;
    use ftrec_ckpt::{CheckpointId, CheckpointKind, DataPosition, Manifest};

    fn id(s: &str) -> CheckpointId {
        CheckpointId::new(s).unwrap()
    }

    fn manifest(name: &str, kind: CheckpointKind, step: u64, parent: Option<&str>) -> Manifest {
        Manifest {
            id: id(name),
            kind,
            step,
            parents: parent.map(id).into_iter().collect(),
            data_position: DataPosition::None,
            shards: vec![],
            files: vec![],
            extra: Default::default(),
        }
    }

    #[test]
    fn a_listing_is_what_ls_shows() {
        let lineage = Lineage::from_manifests(
            &[
                manifest("00000000000000000004-full", CheckpointKind::Full, 4, None),
                manifest(
                    "00000000000000000008-delta",
                    CheckpointKind::Delta,
                    8,
                    Some("00000000000000000004-full"),
                ),
            ],
            Some(id("00000000000000000008-delta")),
        );
        let listing = lineage.listing();
        let v: Vec<Value> = listing
            .iter()
            .map(|l| listed_json(l, (l.node.step == 8).then_some((PieceScheme::ChunkList, 1))))
            .collect();
        assert_eq!(v[0]["id"], "00000000000000000004-full");
        assert_eq!(v[0]["kind"], "full");
        assert_eq!(v[0]["parent"], Value::Null);
        assert_eq!(
            (v[0]["current"].clone(), v[0]["live"].clone()),
            (json!(false), json!(true))
        );
        assert_eq!(v[1]["step"], 8);
        assert_eq!(v[1]["parent"], "00000000000000000004-full");
        assert_eq!(v[1]["current"], true);
        assert_eq!(v[1]["scheme"], PieceScheme::ChunkList.name());
        assert_eq!(v[1]["column"], 1);
        assert_eq!(v[0]["scheme"], Value::Null);
    }

    #[test]
    fn a_check_keeps_every_finding_and_the_report() {
        let mut c = StoreCheck {
            checkpoints: vec![CheckedCheckpoint {
                id: id("00000000000000000004-full"),
                files: 2,
                bytes: 64,
                removed: 0,
                problem: None,
            }],
            ..Default::default()
        };
        let v = check_json(&c);
        assert_eq!(
            (v["ok"].clone(), v["problems"].clone()),
            (json!(true), json!(0))
        );
        assert_eq!(v["checkpoints"][0]["files"], 2);
        assert_eq!(v["broken"], Value::Null);
        assert_eq!(v["report"], c.render());
        c.checkpoints[0].problem = Some("checksum mismatch".into());
        c.newest_intact = Some(Err("nothing left".into()));
        let v = check_json(&c);
        assert_eq!(v["ok"], false);
        assert_eq!(v["checkpoints"][0]["problem"], "checksum mismatch");
        assert_eq!(v["newest_intact"], Value::Null);
        assert_eq!(v["no_intact_state"], "nothing left");
    }

    #[test]
    fn bad_input_raises_value_or_file_not_found_and_damage_ftrec_error() {
        let loc = || "st".to_string();
        assert_eq!(
            raise_of(&RestoreError::NoSuchStore { location: loc() }),
            Raise::FileNotFound
        );
        for e in [
            RestoreError::NotAStore { location: loc() },
            RestoreError::NoState {
                location: loc(),
                arg: "at",
                what: "at step 3".into(),
                steps: vec![4],
            },
            RestoreError::Shape("no".into()),
            RestoreError::Open {
                location: loc(),
                source: CkptError::InvalidArgument("unsupported scheme".into()),
            },
        ] {
            assert_eq!(raise_of(&e), Raise::Value, "{e}");
        }
        let damaged = RestoreError::Restore {
            location: loc(),
            source: CkptError::Corrupt {
                file: "f".into(),
                reason: "bad magic".into(),
            },
        };
        assert_eq!(raise_of(&damaged), Raise::Ftrec);
        // The causes are part of the message, as the binary prints them.
        assert_eq!(
            message(&damaged),
            "restoring from st: f: corrupt: bad magic"
        );
    }
}
