#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ftrec_ckpt::format::CurrentPointer::decode("CURRENT", data);
});
