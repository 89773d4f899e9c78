//! Incremental checkpoints of embedding rows: IncrCP's 2-D chunk list (incrcp.txt §4) and the
//! two baselines it is measured against, naive incremental and Check-N-Run's differential
//! checkpoints (incrcp.txt §2.2, §5.1.5).
//!
//! Every scheme saves *pieces* over a *base* (a full checkpoint): a piece is a checkpoint of
//! kind delta whose rows (values and optimizer state, plus the dense range) each server writes
//! through the staging pipeline like a DECK delta, and whose per-server piece index (`PIDX`,
//! [`crate::format::piece`]) names the scheme, the base and the piece's column in its list.
//!
//! | scheme | a piece holds | parent | a restore reads |
//! | --- | --- | --- | --- |
//! | [`PieceScheme::Incremental`] | rows touched since the previous checkpoint | previous | base + every piece, oldest first |
//! | [`PieceScheme::Differential`] | rows touched since the base (optionally 8/4-bit) | base | base + the newest differential |
//! | [`PieceScheme::ChunkList`] | rows touched since the previous checkpoint, in a 2-D list | previous | base + the target's rectangle |
//!
//! - [`list`]: the 2-D chunk list in memory, folded from piece indexes;
//! - [`extract`]: one extraction round (selective extraction, §4.3; concatenation, §4.4);
//! - [`bloom`]: the Bloom filters of the second filter stage;
//! - [`chain`]: one server's state ([`ServerChain`]): finishing a durable piece (its piece
//!   index), the extraction round run after it, off the commit path, and restoring;
//! - [`restore`]: choosing the manifests of a state and restoring a server from them, newest
//!   column winning;
//! - [`store`]: verification, garbage collection (files with no live chunk), a restore written
//!   out as a full checkpoint, piece summaries.
//!
//! Nothing here decides when to save or when to reset the base: that is policy
//! (`ftrec-strategy`: IncrCP §4.5's `T_incre` against `T_base`, Check-N-Run's size fraction).
//!
//! ```
//! use ftrec_ckpt::incr::{PieceSpec, PieceScheme};
//! let spec = PieceSpec::chunk_list(0.02);
//! assert_eq!(spec.scheme, PieceScheme::ChunkList);
//! assert!(spec.validate().is_ok());
//! ```

pub mod bloom;
pub mod chain;
pub mod extract;
pub mod list;
pub mod read;
pub mod restore;
pub mod store;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::error::{CkptError, Result};
pub use crate::format::{PieceIndex, PieceScheme, QuantBits};
pub use chain::{PieceDone, ServerChain};
pub use extract::{ExtractConfig, Filters, RoundHook};
pub use list::ChunkList;
pub use restore::{
    is_incremental_store, rectangle_list, restore_server, restore_server_with, select, IncrChain,
    RestoreOptions, RestoreOutcome, IN_MEMORY_RECTANGLE_BYTES, READ_SPAN_BYTES, STREAM_MAP_BYTES,
};
pub use store::{
    damage, files_read, gc, materialize_full, newest_restore_files, piece_summaries,
    remove_dead_files, remove_dead_files_of, restore_all, select_intact, verify, write_full,
    Damage, Expected, MemShard,
};

/// What a server saves for one piece.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PieceSpec {
    pub scheme: PieceScheme,
    /// Check-N-Run quantization of a differential's rows (approximate restores).
    #[serde(default)]
    pub quant: Option<QuantBits>,
    /// How a chunk list extracts (ignored by the other schemes).
    #[serde(default)]
    pub extract: ExtractConfig,
}

impl PieceSpec {
    /// A naive incremental piece.
    pub fn incremental() -> Self {
        PieceSpec {
            scheme: PieceScheme::Incremental,
            quant: None,
            extract: ExtractConfig::default(),
        }
    }

    /// A Check-N-Run differential, optionally quantized.
    pub fn differential(quant: Option<QuantBits>) -> Self {
        PieceSpec {
            scheme: PieceScheme::Differential,
            quant,
            extract: ExtractConfig::default(),
        }
    }

    /// An IncrCP chunk-list piece with extraction threshold `r`.
    pub fn chunk_list(r: f64) -> Self {
        PieceSpec {
            scheme: PieceScheme::ChunkList,
            quant: None,
            extract: ExtractConfig {
                threshold: r,
                ..ExtractConfig::default()
            },
        }
    }

    /// Whether a piece saves the rows touched since the base (else since the previous save).
    pub fn since_base(&self) -> bool {
        self.scheme == PieceScheme::Differential
    }

    pub fn validate(&self) -> Result<()> {
        if self.quant.is_some() && self.scheme != PieceScheme::Differential {
            return Err(CkptError::InvalidArgument(format!(
                "only differential pieces are quantized, not {}",
                self.scheme.name()
            )));
        }
        if self.scheme == PieceScheme::ChunkList {
            self.extract.validate()?;
        }
        Ok(())
    }
}
