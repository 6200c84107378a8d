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
/// 24 characters). A table of one label column whose figures cannot stay whole at the
/// output's width is turned on its side where that fits (each column a row: the iterations
/// of a run become columns), rather than split its numbers across lines.
pub(crate) fn align_right(t: &mut comfy_table::Table, from: usize) {
    use comfy_table::{ColumnConstraint, Width};
    let cells = cells(t);
    let bounds = column_bounds(&cells, from);
    // when even that is wider than the output, figures may wrap too (at their space)
    let figures_whole = style::width().is_none_or(|w| needed(&bounds) <= w as usize);
    if !figures_whole && from == 1 {
        let side = turned(&cells);
        if style::width().is_some_and(|w| needed(&column_bounds(&side, 1)) <= w as usize) {
            let mut n = style::table();
            let mut rows = side.into_iter();
            if let Some(h) = rows.next() {
                n.set_header(h);
            }
            for r in rows {
                n.add_row(r);
            }
            *t = n;
            align_right(t, 1);
            return;
        }
    }
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

/// The header (first) and the rows of a table, as text.
fn cells(t: &comfy_table::Table) -> Vec<Vec<String>> {
    let row = |r: &comfy_table::Row| r.cell_iter().map(|c| c.content()).collect::<Vec<_>>();
    t.header()
        .map(row)
        .into_iter()
        .chain(t.row_iter().map(row))
        .collect()
}

/// The narrowest each column may be: a label column its longest word (up to 24), a figure
/// column its longest line.
fn column_bounds(cells: &[Vec<String>], from: usize) -> Vec<u16> {
    let n = cells.iter().map(Vec::len).max().unwrap_or(0);
    (0..n)
        .map(|i| {
            let column = cells
                .iter()
                .enumerate()
                .filter_map(|(k, r)| Some((k, r.get(i)?)));
            let widest = column
                .filter_map(|(k, s)| {
                    if i < from {
                        s.split_whitespace().map(|w| w.chars().count()).max()
                    } else if k > 0 {
                        // (a figure column's header may wrap between words)
                        s.lines().map(|l| l.chars().count()).max()
                    } else {
                        None
                    }
                })
                .max()
                .unwrap_or(1) as u16;
            if i < from {
                widest.min(24)
            } else {
                widest
            }
        })
        .collect()
}

/// Characters a table of these column widths takes (a border and two spaces each, and one).
fn needed(bounds: &[u16]) -> usize {
    bounds.iter().map(|&w| w as usize + 3).sum::<usize>() + 1
}

/// The table on its side: row `j` is column `j` (its header first).
fn turned(cells: &[Vec<String>]) -> Vec<Vec<String>> {
    let n = cells.iter().map(Vec::len).max().unwrap_or(0);
    (0..n)
        .map(|j| {
            cells
                .iter()
                .map(|r| r.get(j).cloned().unwrap_or_default())
                .collect()
        })
        .collect()
}
