#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = ftrec_ckpt::format::QRowChunk::decode("f", data) {
        let mut dst = vec![0f32; c.header.layout.words()];
        for r in 0..c.len() {
            c.dequantize_row(r, &mut dst);
        }
    }
});
