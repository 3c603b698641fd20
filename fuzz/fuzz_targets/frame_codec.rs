//! A client frame as the host reads it: size bound, envelope, method, then the method's params.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    racp_fuzz::checks::client_frame(data);
});
