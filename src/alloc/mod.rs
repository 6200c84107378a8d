//! PyTorch's CUDA caching allocator, rule for rule, over a pluggable segment source.
//!
//! - [`config`]: `PYTORCH_CUDA_ALLOC_CONF` and the size constants.
//! - [`caching`]: the policy (round, best fit, split, merge, retry, release, expandable pages).
//! - [`source`]: where segments come from ([`SegmentSource`]; the simulated device).
//! - [`stats`]: `memory_stats()` with PyTorch's key names.
//! - [`snapshot`]: segments and blocks, as `torch.cuda.memory._snapshot()` lists them.
//! - [`oom`]: the out-of-memory error and its message.
//! - [`fastforward`]: a generation's decode steps replayed on the allocator alone.

pub mod addrmap;
pub mod caching;
pub mod config;
pub mod fastforward;
pub mod freeset;
pub mod oom;
pub mod snapshot;
pub mod source;
pub mod stats;

pub use caching::{CachingAllocator, PointerError, StreamId};
pub use config::{AllocConf, ConfError};
pub use oom::OutOfMemory;
pub use snapshot::{BlockInfo, BlockState, SegmentInfo};
pub use source::{SegmentSource, SimSource, DEFAULT_CONTEXT_OVERHEAD};
pub use stats::{DeviceStats, PoolKind, Stat, StatArray};

/// The allocator on the simulated device.
pub type SimAllocator = CachingAllocator<SimSource>;

#[cfg(test)]
mod tests;
