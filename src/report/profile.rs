//! The profiler's table (`--by op|module|line|annotation`): what analysis::profile computed, as
//! text or JSON.

use std::io::Write;

use serde_json::{json, Value};

use crate::analysis::profile::{Profile, ProfileRow, SortBy};
use crate::units::{format_bytes as b, format_bytes_signed, group_digits};

fn cells(key: String, r: &ProfileRow) -> Vec<String> {
    vec![
        key,
        group_digits(r.allocs),
        b(r.allocated_bytes),
        b(r.freed_bytes),
        format_bytes_signed(r.net_bytes),
        b(r.largest_bytes),
        b(r.at_peak_bytes),
    ]
}

/// The table's title, the top `top` rows and the total; a line says how many rows were left
/// out.
pub fn write_text(out: &mut dyn Write, p: &Profile, top: usize) -> std::io::Result<()> {
    writeln!(
        out,
        "{}",
        super::style::heading(&format!(
            "Memory by {} (largest {} first; peak allocated {} at event {})",
            p.by.name(),
            match p.sort {
                SortBy::Peak => "bytes held at the peak",
                SortBy::Allocs => "allocation count",
                other => other.name(),
            },
            b(p.peak_allocated_bytes),
            group_digits(p.peak_event)
        ))
    )?;
    let mut t = super::style::table();
    t.set_header(vec![
        p.by.name(),
        "allocs",
        "allocated",
        "freed",
        "net",
        "largest",
        "at peak",
    ]);
    for r in p.rows.iter().take(top) {
        t.add_row(cells(r.key.clone(), r));
    }
    t.add_row(cells(
        format!(
            "total ({} {})",
            group_digits(p.rows.len() as u64),
            if p.rows.len() == 1 { "row" } else { "rows" }
        ),
        &p.total,
    ));
    super::align_right(&mut t, 1);
    writeln!(out, "{t}")?;
    if p.rows.len() > top {
        writeln!(
            out,
            "{} more rows (--top N shows more; --json gives every row)",
            group_digits((p.rows.len() - top) as u64)
        )?;
    }
    Ok(())
}

pub fn to_json(p: &Profile) -> Value {
    json!({
        "by": p.by,
        "sort": p.sort,
        "peak_allocated_bytes": p.peak_allocated_bytes,
        "peak_event": p.peak_event,
        "rows": p.rows,
        "total": p.total,
    })
}
