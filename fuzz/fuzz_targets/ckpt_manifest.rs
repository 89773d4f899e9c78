#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((m, _)) = ftrec_ckpt::format::Manifest::decode("MANIFEST", data) {
        let _ = m.data_bytes();
        let l = ftrec_ckpt::deck::Lineage::from_manifests([&m], Some(m.id.clone()));
        let _ = l.resolve(&m.id);
        let _ = l.render();
    }
});
