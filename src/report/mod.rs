//! Output formats. Reports format what analysis computed; they compute nothing themselves and
//! write to the `&mut dyn Write` they are given.
//!
//! - [`torch_summary`]: PyTorch's `memory_summary()` text, byte for byte.
//! - [`stats_table`]: the same figures as a readable table.
//! - [`replay`]: the verdict and mismatches of a trace replay, as text or JSON.
//! - [`bench`]: allocator benchmark results.
//! - [`run`]: what `gpumem run` prints.
//! - [`findings`]: leaks, fragmentation and an out-of-memory's diagnosis with its remedies.
//! - [`snapshot`]: the versioned gpumem snapshot (JSON).
//! - [`summary`]: what `gpumem summary` prints.
//! - [`export`]: PyTorch's snapshot dict (memory_viz) and a Perfetto trace.
//! - [`timeline_svg`]: the memory timeline as an SVG chart.
//! - [`check`]: `gpumem check`'s verdicts: table, markdown, JUnit XML, GitHub annotations.

pub mod bench;
pub mod check;
pub mod compare_torch;
pub mod diff;
pub mod export;
pub mod findings;
pub mod replay;
pub mod run;
pub mod snapshot;
pub mod stats_table;
pub mod summary;
pub mod tensors;
pub mod timeline_svg;
pub mod torch_summary;
pub mod whatif;

/// Right-aligns the columns of `t` from `from` on (the figures of gpumem's tables).
pub(crate) fn align_right(t: &mut comfy_table::Table, from: usize) {
    for i in from..t.column_count() {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
}
