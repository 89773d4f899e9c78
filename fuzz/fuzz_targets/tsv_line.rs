#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = ftrec_data::parse_line(data) {
        let mut out = Vec::new();
        s.write_tsv_line(&mut out);
        assert_eq!(ftrec_data::parse_line(&out[..out.len() - 1]), Ok(s));
    }
});
