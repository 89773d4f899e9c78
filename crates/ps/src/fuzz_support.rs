//! Shared by the decoders' property tests (`mod fuzz` in `grpc::wire`, `ec::grpc`,
//! `ckpt::grpc`): arbitrary and mutated protobuf messages go through each conversion from the
//! wire, which must return a value or an error, never panic, and never allocate by a length
//! the message does not back (`ftrec_core::fuzz`; the probe is this crate's test allocator).

use ftrec_core::fuzz::{alloc_bound, largest_allocation, mutated, Mutation};
use proptest::prelude::*;

pub use ftrec_core::fuzz::strategies::config;

/// A value to write over a length or count (small ones below 64: a message's fields are short).
pub fn huge() -> impl Strategy<Value = u64> {
    ftrec_core::fuzz::strategies::huge(64)
}

/// Any mutation, overwrites from [`huge`].
pub fn mutation() -> impl Strategy<Value = Mutation> {
    ftrec_core::fuzz::strategies::mutation(64)
}

/// Byte strings of any length up to `max`, mostly short.
pub fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

/// Decode `wire` as `M` and, if that works, run `decode` on it: it must not panic (a panic
/// fails the property) nor allocate past the bound for `wire`'s length.
pub fn check<M: prost::Message + Default, T>(wire: &[u8], decode: impl FnOnce(M) -> T) {
    let (_, largest) = largest_allocation(|| {
        if let Ok(m) = M::decode(wire) {
            let _ = decode(m);
        }
    });
    assert!(
        largest <= alloc_bound(wire.len()),
        "{largest} bytes allocated for a {}-byte message",
        wire.len()
    );
}

/// `msg` encoded, then mutated by `ms`.
pub fn mutated_encoding<M: prost::Message>(msg: &M, ms: &[Mutation]) -> Vec<u8> {
    mutated(&msg.encode_to_vec(), ms)
}
