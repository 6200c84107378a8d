//! Pure analysis over traces and allocator state. Nothing here prints or runs a workload.
//!
//! - [`groundtruth`]: the recorded PyTorch allocator trace format (read and validated).
//! - [`replay`]: runs such a trace through gpumem's allocator and compares step by step.
//! - [`blocks`]: block sizes from a trace's requests (its segments' blocks tracked).
//! - [`stacks`]: what a tag stack says (iteration, category, site, op).
//! - [`state`]: the allocator's state at any moment of a trace, and the category timeline.
//! - [`timeline`]: the timeline's data.
//! - [`fragmentation`]: internal and external free space, per segment and pool.
//! - [`leaks`]: memory born in one iteration and never freed, growing steadily.
//! - [`oom`]: what an out-of-memory was: capacity or fragmentation, and what was live.
//! - [`findings`]: all of the above for one recorded run.
//! - [`record`]: a run's record as plain data (any device's), and what a remedy's re-run gave.
//! - [`snapshot_file`]: a gpumem snapshot read back as a trace.
//! - [`summary`]: what a snapshot says (state, sites, peak, leaks, OOMs).
//! - [`walk`]: a trace walked (block sizes, allocated after each event), sharded on all cores.
//! - [`whatif`]: a snapshot's trace replayed under other allocator settings.
//! - [`profile`]: the profiler's table: memory per op, module, source line or annotation.
//! - [`diff`]: two snapshots' summaries side by side.
//! - [`verdict`]: the one-line answer: fits (with its headroom) or not (by how much, where).
//! - [`check`]: a run's metrics against a baseline, tolerances and budgets (`gpumem check`).

pub mod blocks;
pub mod check;
pub mod diff;
pub mod findings;
pub mod fragmentation;
pub mod groundtruth;
pub mod leaks;
pub mod oom;
pub mod profile;
pub mod record;
pub mod replay;
pub mod snapshot_file;
pub mod stacks;
pub mod state;
pub mod summary;
pub mod timeline;
pub mod verdict;
pub mod walk;
pub mod whatif;
