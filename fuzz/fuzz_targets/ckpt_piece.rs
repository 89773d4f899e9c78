#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((p, _)) = ftrec_ckpt::format::PieceIndex::decode("piece", data) {
        let map = ftrec_core::ShardMap::new(2).expect("two servers");
        let mut list =
            ftrec_ckpt::incr::ChunkList::new(p.base.clone(), p.server, map, p.range_rows);
        if p.column == 1 {
            let id = ftrec_ckpt::CheckpointId::new("c1").expect("id");
            let _ = list.apply(&id, &p, "piece");
            let _ = list.rectangle_bytes(1);
        }
    }
});
