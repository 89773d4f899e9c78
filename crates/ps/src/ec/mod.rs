//! ECRec in the parameter server (ecrec.txt §3): parity rows, difference propagation between
//! servers, replicated dense blocks, two-phase commit of deterministic steps, degraded reads
//! and the rebuild of a lost server from the survivors.
//!
//! # What lives where
//! An [`EcNode`] wraps one [`Server`](crate::Server) (its data rows and primary dense range, unchanged) and
//! adds
//! - the parity rows the [`StripeLayout`](ftrec_ec::StripeLayout) places on this server (values *and* optimizer
//!   state, ECRec §3.2), initialised by encoding the seeded initial rows, so no traffic is
//!   needed at start;
//! - replicas of the primary dense ranges of the `d` preceding servers (`d` =
//!   [`EcConfig::dense_replicas`], default `r`, so that `r` simultaneous losses never take
//!   every copy of a dense block; ECRec §3.3 uses one copy for `r = 1`);
//! - the staging areas of the two-phase commit.
//!
//! Parities and replicas are *not* part of [`Server::digest`](crate::Server::digest): the model digest covers model
//! parameters and optimizer state once each.
//!
//! # A step (ECRec §3.5)
//! Workers stage their gradients on the owners exactly as without ECRec
//! ([`crate::PsService::stage_step`]). The coordinator then calls, on every node,
//! [`EcService::prepare`]: the owner computes its new rows and dense blocks from the staged
//! gradients without exposing them ([`Server::prepare_step`](crate::Server::prepare_step)), sends each parity holder the
//! deltas of the rows of its stripes and each replica holder the summed dense gradients
//! ([`EcService::stage_deltas`], server to server), which stage them under the step, and
//! acknowledges once every peer acknowledged. Then [`EcService::commit`] on every node applies
//! the node's own rows and the staged deltas and gradients. A failure in phase 1:
//! [`EcService::abort`] on every survivor drops the step everywhere (the workers stage again,
//! and the step is retried once the lost server is replaced). A failure in phase 2: the
//! survivors commit anyway; the parity and replica holders then already hold the lost
//! owner's committed state, so its rebuild includes the step.
//!
//! Without 2PC ([`EcConfig::two_phase`] off, `--no-2pc`) [`EcService::apply_step`] applies
//! and forwards in one phase. That saves a round trip but a server dying between applying
//! its rows and its peers applying its deltas leaves parities that describe the step before:
//! the rebuilt rows then lack one step that the rest of the model has (an inconsistent model,
//! a digest different from the failure-free run), and a rebuild may read a cut that mixes
//! steps. The report and the docs say so; the exactness tests run with 2PC.
//!
//! # Loss, degraded reads and rebuild (ECRec §3.4)
//! A replacement for lost server `L` is a fresh node ([`EcNode::new_replacement`]) whose rows
//! and parities are all *missing*. [`EcService::start_rebuild`] first copies its dense part
//! from surviving copies (small; the only moment steps must wait, since the node cannot take
//! part in a step without its dense blocks), then the node takes part in steps while it
//! rebuilds, lock range by lock range, in the background:
//! - a pull or a step that touches a missing row decodes it at once from the surviving stripe
//!   members and a parity (the degraded read) and installs it. The decode runs on the
//!   replacement, the row's new owner: it is the only node that updates the row, so updating a
//!   decoded row there keeps its parities exact with no stand-in owner, the worker needs no
//!   knowledge of the layout, and the row is decoded once rather than on every read;
//! - the lock ranges ([`EcConfig::lock_ranges`], the plan's unit of progress and of the
//!   memory a rebuild holds) are decoded in batches of stripes, each from one consistent cut:
//!   every survivor returns the members it holds together with the step it has committed,
//!   under the same lock as its commits, and the batch is read again if the steps differ (a
//!   decode needs a consistent cut per stripe only, so small batches fit between two commits
//!   even at full training speed; one cut over a whole server would be retried for ever). The
//!   survivors' live tables serve every read and update meanwhile: instead of holding new
//!   values back in a buffer until the lock is released (ECRec §3.4), the values the decode
//!   needs are copied out at the lock, which is the same granular locking turned around, with
//!   no lock to release and no buffered update to replay. A lost parity row is zeroed at its
//!   batch's lock and collects the deltas committed after it; the decoded parity is merged in
//!   ([`ftrec_ec::Code::merge_parity`]).
//!
//! [`EcService::degraded_read`] answers reads of lost rows on any survivor before a
//! replacement exists.
//!
//! One rebuild driver runs at a time. A restart against a new lost set (a second loss with
//! `r >= 2`) opens a new *generation*: the driver of the old one is cancelled and awaited
//! before anything is reset, every install, merge and progress update checks its generation,
//! and a decoded parity is merged only into a slot that its own batch's lock zeroed (each
//! lock stamps the slots it zeroes). Otherwise an old driver could merge its decode into a
//! slot that a newer lock zeroed again, and the parity would silently miss the steps
//! committed in between. A restart of a rebuild that already finished does nothing.
//!
//! Rate control: a background rebuild rests between batches so that its busy time stays
//! within [`EcConfig::rebuild_share_ppm`] of the wall time (at 0, its lock ranges wait until
//! the share is raised, [`EcNode::set_rebuild_share`]); degraded reads of the rows training
//! touches are decoded on demand meanwhile, so training never waits for the ranges.
//!
//! # The plain service on an ECRec node
//! The parameter-server service shares the node's shard, so it is gated
//! ([`crate::ServiceGate`]): `push`, `commit_step`, `import_rows` and `import_dense` are
//! refused ([`PsError::Refused`](crate::PsError::Refused)), since they would change rows or
//! dense blocks without their parities and replicas; a replacement answers pulls and stages
//! with [`PsError::NotReady`](crate::PsError::NotReady) (retryable) until it has joined, and
//! digests and exports until its rebuild finished, rather than serve its seeded rows.
//!
//! Calls to peers over gRPC are bounded by [`EcConfig::peer_timeout`]: a hung peer fails the
//! step or the rebuild with an error naming it (and the call) instead of stalling it.
//!
//! # Exactness
//! With `gf256` every rebuilt word (values, optimizer state, parities, dense blocks) equals
//! the lost word bit for bit, so the model digest after a loss and rebuild equals the
//! failure-free run's. With the paper's `sum` code a parity is a float sum updated by float
//! differences: rounding makes it drift from the exact sum of its rows
//! ([`audit_parities`] reports the largest difference), so a rebuilt row may differ in its
//! last bits and the digest after a rebuild may differ from the failure-free run's.
//!
//! # Assumptions
//! Deterministic mode: a step's pulls, stages, prepares and commits follow each other (no pull
//! of step `s + 1` while `s` commits). Decodes check their cut and retry, so the background
//! rebuild is safe against concurrent commits.

mod grpc;
mod memory;
mod node;
mod rebuild;
mod reencode;
mod service;
mod txn;
mod types;

pub use grpc::{ec_service, EcGrpcClient, EcGrpcHandler};
pub use memory::NodeMemory;
pub use node::{
    audit_parities, EcConfig, EcNode, ParityAudit, DEFAULT_PEER_TIMEOUT, FULL_SHARE_PPM,
};
pub use reencode::ReencodeReport;
pub use service::{EcClient, EcService, WeakNode};
pub use txn::{
    resolve_txn, run_txn, Resolution, TxnCursor, TxnPhase, TxnReport, CONTENDED,
    QUEUED_AFTER_REFUSAL, TXN_LEASE,
};
pub use types::{
    Admission, BehindStatus, DeltaBatch, DenseDelta, DenseRead, MemberKey, MemberRead,
    PrepareReport, RebuildHook, RebuildPoint, RebuildStatus, RowDelta, TxnCounters, TxnId,
    TxnOutcome, TxnStatus,
};
