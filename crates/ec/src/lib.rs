//! `ftrec-ec`: the coding layer of the ECRec strategy (ecrec.txt §3): erasure codes over
//! embedding rows, the stripe layout that says which rows share a parity and where parities
//! live, and recovery plans.
//!
//! It owns
//! - two codes behind one [`Code`] enum: the paper's float-sum code ([`SumCode`], `r = 1`,
//!   approximate once rows change, with a drift measurement: [`measure_drift`]) and a
//!   bit-exact systematic Reed–Solomon code over GF(2^8) on row bytes ([`Gf256Code`], any
//!   `r`); both update parities by difference propagation ([`Code::delta`],
//!   [`Code::apply_delta`]) and decode through a [`Decoder`] planned per erasure pattern;
//! - the [`StripeLayout`]: stripes of `k` consecutive rows of a table (so `k` different servers
//!   under [`ftrec_core::ShardMap`]) with `r` parities placed by a rotation that gives every
//!   server the same number of parity rows over each period, plus the lookups a server needs
//!   (row -> stripe, position and parity holders; server -> parity slots; lost servers ->
//!   affected stripes);
//! - per-server update load with and without coding from an access trace ([`update_load`],
//!   [`ZipfTrace`]);
//! - [`RecoveryPlan`]s: per lost row or parity, which survivors to read and how to decode,
//!   grouped into lock ranges (ECRec §3.4), and single-row [`degraded_read`]s.
//!
//! It never does IO, networking or threading, and never decides *when* to recover: servers
//! and the coordinator call it.
//!
//! ```
//! use ftrec_core::{ServerId, TableId};
//! use ftrec_ec::{Code, CodeKind, RecoveryOptions, RecoveryPlan, StripeLayout};
//!
//! // 5 servers, stripes of 3 rows with 2 parities, two tables.
//! let layout = StripeLayout::new(5, 3, 2, &[100, 7])?;
//! let code = Code::new(CodeKind::Gf256, 3, 2)?;
//!
//! // Server-side bookkeeping for row 42 of table 0.
//! let p = layout.row_parities(TableId(0), 42)?;
//! assert_eq!(p.parities.len(), 2);
//!
//! // Encode one stripe, lose two of its rows, rebuild them bit for bit.
//! let rows: Vec<Vec<f32>> = (0..3).map(|i| vec![i as f32 + 0.5; 4]).collect();
//! let mut stripe = rows.clone();
//! stripe.extend([vec![0.0; 4], vec![0.0; 4]]);
//! let (data, parity) = stripe.split_at_mut(3);
//! let (p0, p1) = parity.split_at_mut(1);
//! code.encode(&[&data[0], &data[1], &data[2]], &mut [&mut p0[0][..], &mut p1[0][..]])?;
//! code.reconstruct(&mut stripe, &[false, true, false, true, true])?;
//! assert_eq!(&stripe[..3], &rows[..]);
//!
//! // Plan the rebuild of server 2 in 4 lock ranges.
//! let plan = RecoveryPlan::new(&layout, &code, &[ServerId(2)], RecoveryOptions { lock_ranges: 4 })?;
//! assert_eq!(plan.ranges().len(), 4);
//! # Ok::<(), ftrec_ec::EcError>(())
//! ```

pub mod code;
pub mod error;
mod gf;
pub mod gf256;
pub mod layout;
pub mod load;
pub mod recovery;
pub mod sum;

pub use code::{Code, CodeKind, Decoder};
pub use error::EcError;
pub use gf256::Gf256Code;
pub use layout::{
    AffectedStripes, Location, ParitySlot, RowParities, StripeId, StripeLayout, StripeMember,
};
pub use load::{update_load, LoadReport, ZipfTrace};
pub use recovery::{
    degraded_read, DecodeMethod, LockRange, RangeCursor, RecoveryOptions, RecoveryPlan,
    RecoveryTask, TaskBatch,
};
pub use sum::{measure_drift, DriftConfig, DriftReport, DriftSnapshot, SumCode, SumParityTracker};
