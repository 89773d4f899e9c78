#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = ftrec_ckpt::format::RowChunk::decode("f", data) {
        let mut dst = vec![0f32; c.len() * c.header.layout.words()];
        c.copy_rows(0, c.len(), &mut dst);
    }
});
