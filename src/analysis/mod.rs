//! Pure analysis over traces and allocator state. Nothing here prints.
//!
//! - [`groundtruth`]: the recorded PyTorch allocator trace format (read and validated).
//! - [`replay`]: runs such a trace through gpumem's allocator and compares step by step.

pub mod groundtruth;
pub mod replay;
