//! Workload files: the TOML keys, presets, Hugging Face configs and the script language,
//! parsed and checked (nothing is run: a valid script may loop for as long as it says).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = gpumem::workload::parse(text, Path::new("fuzz.toml"));
});
