//! cargo-fuzz target: `weir::fuzzing::scram` (what it checks is documented there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::scram(data));
