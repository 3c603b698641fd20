//! The properties the fuzz targets check, shared with the regression tests in
//! `racp-proto/tests/fuzz_regressions.rs` (which include `checks.rs` by path).

pub mod checks;
