//! Snapshots as JSON: PyTorch's dict saved as JSON and gpumem's own snapshot format, read by
//! `summary` and written back by `export` (which must bound what it writes).
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (dir, path) = common::file("s.json", data);
    let p = path.to_str().unwrap();
    common::gpumem(&["summary", p]);
    let out = dir.path().join("out.pickle");
    common::gpumem(&["export", p, "--to", "memory-viz", "-o", out.to_str().unwrap()]);
});
