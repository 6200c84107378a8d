//! `gpumem selftest --device cuda`: the cuda device against the cpu device, op by op, through
//! the engine ([`crate::backend::parity`]): every op the workloads use, forward and backward,
//! in float32 and bf16, on the same random non-zero inputs, with the largest relative
//! difference of each and where its launches ran (the GPU's kernels or the host twin).

use serde::Serialize;

use crate::backend::parity::{self, Check};

/// What the self-test found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub gpu: String,
    pub checks: Vec<Check>,
}

/// Runs every case on device 0 and on the cpu device.
pub fn run() -> Result<Report, String> {
    let dev = super::open(None, true)?;
    let gpu = dev.device_name().to_string();
    let mut a = parity::engine(crate::backend::AnyDevice::Cuda(Box::new(dev)));
    let mut b = parity::engine(crate::backend::open("cpu", 8 << 30, 0, None)?);
    let checks = parity::compare(&mut a, &mut b, &parity::cases());
    Ok(Report { gpu, checks })
}
