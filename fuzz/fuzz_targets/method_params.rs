//! Every method's params: the first byte picks the method, the rest is its params text.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    racp_fuzz::checks::method_params(data);
});
