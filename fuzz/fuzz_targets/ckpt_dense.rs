#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = ftrec_ckpt::format::DenseChunk::decode("f", data) {
        let mut v = vec![0f32; c.header.values as usize];
        c.copy_values(&mut v);
    }
});
