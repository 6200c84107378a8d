//! What `gpumem replay SNAPSHOT --alloc-conf ...` prints: recorded against replayed.

use std::io::Write;

use comfy_table::Table;

use crate::analysis::whatif::WhatIf;
use crate::units::{format_bytes as b, format_bytes_signed};

pub fn write_text(out: &mut dyn Write, path: &str, w: &WhatIf) -> std::io::Result<()> {
    let conf = |c: &str| {
        if c.is_empty() {
            "defaults".to_string()
        } else {
            c.to_string()
        }
    };
    writeln!(
        out,
        "{path}: the recorded trace replayed with {} (recorded with {}), the allocator allowed {}; \
         {} blocks from before the trace allocated first",
        conf(&w.replayed.alloc_conf),
        conf(&w.original.alloc_conf),
        b(w.capacity),
        w.preexisting_blocks
    )?;
    let mut t = super::style::table();
    t.set_header(vec!["", "recorded", "replayed", "change"]);
    let bytes_row = |t: &mut Table, name: &str, o: u64, r: u64| {
        t.add_row(vec![
            name.to_string(),
            b(o),
            b(r),
            format_bytes_signed(r as i64 - o as i64),
        ]);
    };
    bytes_row(
        &mut t,
        "peak reserved",
        w.original.peak_reserved,
        w.replayed.peak_reserved,
    );
    bytes_row(
        &mut t,
        "peak allocated",
        w.original.peak_allocated,
        w.replayed.peak_allocated,
    );
    bytes_row(
        &mut t,
        "reserved at the end",
        w.original.reserved_end,
        w.replayed.reserved_end,
    );
    bytes_row(
        &mut t,
        "free in segments at the end",
        w.original.fragmentation_end.external,
        w.replayed.fragmentation_end.external,
    );
    t.add_row(vec![
        "fragmentation at the end".to_string(),
        format!("{:.1}%", w.original.fragmentation_end.ratio * 100.0),
        format!("{:.1}%", w.replayed.fragmentation_end.ratio * 100.0),
        String::new(),
    ]);
    t.add_row(vec![
        "out-of-memory errors".to_string(),
        w.original.ooms.to_string(),
        w.replayed.ooms.to_string(),
        format!(
            "{} avoided, {} caused",
            w.ooms_avoided.len(),
            w.ooms_caused.len()
        ),
    ]);
    super::align_right(&mut t, 1);
    writeln!(out, "{t}")?;
    let verdict = match (w.original.ooms, w.replayed.ooms) {
        (0, 0) => format!(
            "no out-of-memory either way; peak reserved {} by {}",
            if w.replayed.peak_reserved <= w.original.peak_reserved {
                "falls"
            } else {
                "rises"
            },
            b(w.replayed.peak_reserved.abs_diff(w.original.peak_reserved))
        ),
        (o, 0) => format!("yes: this setting would have avoided all {o} out-of-memory errors"),
        (o, r) if r < o => format!("partly: {r} of the {o} out-of-memory errors remain"),
        (0, r) => format!("no: this setting causes {r} out-of-memory errors"),
        (_, _) => "no: the out-of-memory errors remain".to_string(),
    };
    writeln!(out, "verdict: {verdict}")
}

pub fn to_json(path: &str, w: &WhatIf) -> serde_json::Value {
    let mut v = serde_json::to_value(w).unwrap_or(serde_json::Value::Null);
    v["file"] = path.into();
    v
}
