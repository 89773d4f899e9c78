#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = ftrec_ckpt::format::Bundle::decode("f", data) {
        for k in 0..b.sections().len() {
            let s = b.section(k);
            let mut row = vec![0f32; s.header.layout.words()];
            for r in 0..s.len() {
                s.copy_row(r, &mut row);
            }
        }
    }
});
