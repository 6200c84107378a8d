//! `PYTORCH_CUDA_ALLOC_CONF` strings and the size and capacity flags.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = gpumem::alloc::AllocConf::parse(text);
    let _ = gpumem::units::parse_size(text);
    let _ = gpumem::units::parse_capacity(text);
});
