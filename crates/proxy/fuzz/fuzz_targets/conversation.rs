//! cargo-fuzz target: `weir::fuzzing::conversation` (what it checks is documented there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::conversation(data));
