//! Shared by the decoders' property tests (`mod fuzz` in `grpc::wire`, `ec::grpc`,
//! `ckpt::grpc`): arbitrary and mutated protobuf messages go through each conversion from the
//! wire, which must return a value or an error, never panic, and never allocate by a length
//! the message does not back (`ftrec_core::fuzz`; the probe is this crate's test allocator).

use ftrec_core::fuzz::{alloc_bound, largest_allocation, mutated, Mutation, HUGE};
use proptest::prelude::*;

pub fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        // `PROPTEST_CASES=N` raises the count for a longer local run.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

pub fn huge() -> impl Strategy<Value = u64> {
    prop_oneof![prop::sample::select(HUGE.to_vec()), any::<u64>(), 0u64..64]
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        any::<usize>().prop_map(|at| Mutation::Delete { at }),
        any::<usize>().prop_map(|len| Mutation::Truncate { len }),
        (
            any::<usize>(),
            prop::sample::select(vec![1u8, 2, 4, 8]),
            huge()
        )
            .prop_map(|(at, width, value)| Mutation::Overwrite { at, width, value }),
    ]
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
