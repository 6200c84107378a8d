//! gpumem: a GPU-memory profiler and out-of-memory diagnoser whose allocator makes the same
//! decisions as PyTorch's CUDA caching allocator, byte for byte.
//!
//! Modules, in dependency order (each uses only those before it):
//! - [`units`], [`error`], [`input`], [`trace`]: leaf types (sizes, errors, bounded reading of the
//!   user's files, events and interned tags).
//! - [`alloc`]: the caching allocator policy over a segment source (simulated device here).
//! - [`workload`]: workload files (TOML and the line language of `setup`/`body`), parsed and checked.
//! - [`backend`]: devices (segment source and kernels together): `sim` computes nothing,
//!   `cpu` computes real numbers in host memory at the allocator's addresses, `cuda` on the
//!   GPU at the driver's (its own kernels where they take an op, the cpu kernels on host copies
//!   elsewhere).
//! - [`engine`]: ops defined once, tensors, storages, layouts, autograd and optimizers over the
//!   allocator and a device.
//! - [`runner`]: runs a workload on the engine; remedies and `fit` re-run it with changes.
//! - [`analysis`]: pure functions over traces and allocator state: replay of PyTorch traces,
//!   fragmentation, leaks, out-of-memory verdicts, the category timeline.
//! - [`snapshot`]: snapshots from gpumem or PyTorch (pickle or JSON), read into one model.
//! - [`report`]: formatting only (PyTorch's `memory_summary`, tables, JSON).
//! - [`cli`], [`commands`]: the command line, one file per subcommand.

pub mod alloc;
pub mod analysis;
pub mod backend;
pub mod cli;
pub mod commands;
pub mod engine;
pub mod error;
pub mod hostalloc;
pub mod input;
pub mod interrupt;
pub mod report;
pub mod runner;
pub mod snapshot;
pub mod trace;
pub mod units;
pub mod workload;
