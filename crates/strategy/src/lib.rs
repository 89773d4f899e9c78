//! `ftrec-strategy`: every fault-tolerance strategy as a pure state machine.
//!
//! A strategy never touches a socket, a disk or a clock. The cluster feeds it [`Event`]s (a step
//! finished, time passed, a server was lost, a save finished) and carries out the [`Action`]s it
//! returns (pause, save, restore, resume, abort), acknowledging them with further events. That
//! keeps the decisions testable on hand-built event sequences (the shape of raft-rs's
//! `step`/`Ready`).
//!
//! It owns
//! - [`policy`]: the math the strategies decide with: Young's interval, the overhead terms of
//!   CPR Eq. 1 and Eq. 2, CPR's expected PLS (Eq. 4) and the interval for a target PLS;
//! - [`NoFaultTolerance`] (`none`): a server loss ends the run with a clear reason;
//! - [`FullCheckpoint`] (`full`): periodic full checkpoints (every N steps, every T seconds, or
//!   Young's interval from measured save cost and a configured MTBF) and full recovery: every
//!   server reloads the last committed checkpoint and the lost steps are redone (CPR §2.2);
//! - [`Cpr`] (`cpr`): partial recovery (only the lost server's shard is restored, no step is
//!   redone), full saves every `T_save` from a target PLS (CPR Eq. 4) or a step count,
//!   prioritized partial saves in between, the §4.2 benefit analysis that may fall back to full
//!   recovery, and PLS per failure (Eq. 3);
//! - incremental checkpoints over a full base ([`incremental`]): `incremental` (naive, every
//!   piece since the base replayed on restore), [`IncrCp`] (`incrcp`: IncrCP's 2-D chunk list
//!   and its baseline-reset rule, `T_incre` against `T_base`, incrcp.txt §4.5) and [`Cnr`]
//!   (`cnr`: Check-N-Run's differentials, a new base past a size fraction);
//! - [`Deck`] (`deck`) and [`EcRec`] (`ecrec`), with [`RebuildPacer`], the share of the time
//!   an ECRec rebuild works, set from the throughput training keeps.
//!
//! ```
//! use ftrec_strategy::{Action, Event, FullCheckpoint, Interval, Strategy};
//! let mut s = FullCheckpoint::new(Interval::Steps(10)).unwrap();
//! assert!(s.on(&Event::StepDone { step: 5, now_s: 1.0 }).is_empty());
//! let actions = s.on(&Event::StepDone { step: 10, now_s: 2.0 });
//! assert_eq!(actions, vec![Action::PauseTraining, Action::SaveFull { step: 10 }]);
//! ```

pub mod cnr;
pub mod cpr;
pub mod deck;
pub mod ecrec;
pub mod full;
pub mod incrcp;
pub mod incremental;
pub mod machine;
pub mod pacer;
pub mod policy;

pub use cnr::{Cnr, CnrConfig};
pub use cpr::{Cpr, CprConfig, CprInterval, CprReport};
pub use deck::{Deck, DeckConfig};
pub use ecrec::{EcRec, EcRecConfig};
pub use full::{FullCheckpoint, Interval};
pub use incrcp::{BaseReset, IncrCp, IncrCpConfig};
pub use incremental::{Incremental, Pieces, ResetPolicy};
pub use machine::{
    Action, CheckpointRef, Decision, Event, NoFaultTolerance, PieceLayout, ShardCoverage, Strategy,
    StrategyReport,
};
pub use pacer::RebuildPacer;

/// A strategy configuration that cannot work.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum StrategyError {
    #[error("invalid strategy configuration: {0}")]
    InvalidConfig(String),
    #[error("unknown strategy {0:?} (expected none, full, deck, ecrec or cpr)")]
    UnknownStrategy(String),
}
