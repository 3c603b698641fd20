//! A host frame as a client reads it (replies, pushes, connection errors, cursors).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    racp_fuzz::checks::host_frame(data);
});
