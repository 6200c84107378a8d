//! Allocator traces (PyTorch's recorded allocator ground truth): parsed and replayed by
//! `replay`, which compares every step with the simulated allocator.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (_dir, path) = common::file("trace.json", data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = gpumem::analysis::groundtruth::GroundTruth::parse(text, &path);
    }
    common::gpumem(&["replay", path.to_str().unwrap()]);
});
