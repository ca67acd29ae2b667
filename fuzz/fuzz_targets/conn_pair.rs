#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| transport_core_fuzz::conn_pair(data));
