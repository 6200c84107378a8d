//! Output formats. Reports format what analysis computed; they compute nothing themselves and
//! write to the `&mut dyn Write` they are given.
//!
//! - [`torch_summary`]: PyTorch's `memory_summary()` text, byte for byte.
//! - [`stats_table`]: the same figures as a readable table.
//! - [`replay`]: the verdict and mismatches of a trace replay, as text or JSON.
//! - [`bench`]: allocator benchmark results.
//! - [`run`]: what `gpumem run` prints.
//! - [`findings`]: leaks, fragmentation and an out-of-memory's diagnosis with its remedies.
//! - [`profile`]: the profiler's table (`--by`).
//! - [`snapshot`]: the versioned gpumem snapshot (JSON).
//! - [`summary`]: what `gpumem summary` prints.
//! - [`export`]: PyTorch's snapshot dict (memory_viz) and a Perfetto trace.
//! - [`timeline_svg`]: the memory timeline as an SVG chart.
//! - [`check`]: `gpumem check`'s verdicts: table, markdown, JUnit XML, GitHub annotations.
//! - [`escape`]: markdown and XML escaping for what is written by hand.
//! - [`verdict`]: the verdict line that opens a command's output.
//! - [`style`]: colour and table width for where the output goes (set once by `main.rs`).

pub mod bench;
pub mod check;
pub mod compare_torch;
pub mod devices;
pub mod diff;
pub mod escape;
pub mod export;
pub mod findings;
pub mod profile;
pub mod replay;
pub mod run;
pub mod selftest;
pub mod snapshot;
pub mod stats_table;
pub mod style;
pub mod summary;
pub mod tensors;
pub mod timeline_svg;
pub mod torch_summary;
pub mod verdict;
pub mod whatif;

/// Right-aligns the columns of `t` from `from` on (the figures of gpumem's tables). When the
/// table must fit a narrow terminal, figures stay whole (their headers may wrap) and the text
/// columns before `from` wrap between words, never narrower than their longest word (up to
/// 24 characters).
pub(crate) fn align_right(t: &mut comfy_table::Table, from: usize) {
    use comfy_table::{ColumnConstraint, Width};
    let widest = |t: &comfy_table::Table, i: usize, words: bool| -> u16 {
        let header = t
            .header()
            .and_then(|h| h.cell_iter().nth(i))
            .map(|c| c.content())
            .filter(|_| words);
        t.column_cells_iter(i)
            .flatten()
            .map(|c| c.content())
            .chain(header)
            .flat_map(|s| {
                if words {
                    s.split_whitespace().map(|w| w.chars().count()).max()
                } else {
                    s.lines().map(|l| l.chars().count()).max()
                }
            })
            .max()
            .unwrap_or(1) as u16
    };
    let bounds: Vec<u16> = (0..t.column_count())
        .map(|i| {
            if i < from {
                widest(t, i, true).min(24)
            } else {
                widest(t, i, false)
            }
        })
        .collect();
    // when even that is wider than the output, figures may wrap too (at their space)
    let needed: usize = bounds.iter().map(|&w| w as usize + 3).sum::<usize>() + 1;
    let figures_whole = style::width().is_none_or(|w| needed <= w as usize);
    for (i, w) in bounds.into_iter().enumerate() {
        if let Some(c) = t.column_mut(i) {
            if i < from || figures_whole {
                c.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(w)));
            }
            if i >= from {
                c.set_cell_alignment(comfy_table::CellAlignment::Right);
            }
        }
    }
}
