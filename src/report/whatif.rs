//! What `gpumem replay SNAPSHOT --alloc-conf ...` prints: recorded against replayed.

use std::io::Write;

use comfy_table::Table;

use crate::analysis::whatif::WhatIf;
use crate::units::{format_bytes as b, format_bytes_signed};

/// Allocator settings as written, or "defaults" for none.
fn conf(c: &str) -> &str {
    if c.is_empty() {
        "defaults"
    } else {
        c
    }
}

pub fn write_text(out: &mut dyn Write, path: &str, w: &WhatIf) -> std::io::Result<()> {
    let allowed = if w.capacity_known {
        format!("the allocator allowed {}", b(w.capacity))
    } else {
        "no memory limit (the snapshot does not record its device's memory: give --capacity, \
         e.g. 79GiB, to judge out-of-memory errors)"
            .to_string()
    };
    writeln!(
        out,
        "{}",
        super::style::wrap(&format!(
            "{path}: the recorded trace replayed with {} (recorded with {}), {allowed}; {} \
             blocks from before the trace allocated first",
            conf(&w.replayed.alloc_conf),
            conf(&w.original.alloc_conf),
            w.preexisting_blocks
        ))
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
    let verdict = match (w.recorded_settings_ooms, w.replayed.ooms) {
        // at the recording's own capacity its settings do not run out as it did: that
        // capacity is not the limit it ran into, and no setting can be judged against it
        (Some(base), _) if !w.capacity_given && base < w.original.ooms => format!(
            "not known: replayed with its own settings on {}, the recording {} (it ran out {} \
             in the recording), so something below the device's memory \
             stopped it (a per-process memory fraction, or other processes on the GPU, which \
             the snapshot does not record); give --capacity with that limit to judge a setting",
            b(w.capacity),
            match base {
                0 => "does not run out".to_string(),
                n => format!("runs out {}", times(n)),
            },
            times(w.original.ooms)
        ),
        // the recorded settings are the baseline at the same capacity
        (Some(base), r) if base > 0 => {
            let at = b(w.capacity);
            match r {
                0 => format!(
                    "yes: at {at} the recorded settings run out ({}) and this setting does not",
                    errors(base)
                ),
                r if r < base => format!(
                    "partly: at {at} the recorded settings run out {base} times, this setting \
                     {r}"
                ),
                r => format!(
                    "no: at {at} the recorded settings run out too ({}, {r} with this \
                     setting): the run needs more memory than that, whatever the setting",
                    errors(base)
                ),
            }
        }
        _ => verdict_against_recording(w),
    };
    writeln!(out, "verdict: {verdict}")
}

fn errors(n: u64) -> String {
    crate::units::count(n, "out-of-memory error", "out-of-memory errors")
}

fn times(n: u64) -> String {
    match n {
        0 => "never".into(),
        1 => "once".into(),
        n => format!("{n} times"),
    }
}

/// The verdict against the recording itself (on its own device).
fn verdict_against_recording(w: &WhatIf) -> String {
    match (w.original.ooms, w.replayed.ooms) {
        (0, 0) => format!(
            "no out-of-memory either way; peak reserved {} by {}",
            if w.replayed.peak_reserved <= w.original.peak_reserved {
                "falls"
            } else {
                "rises"
            },
            b(w.replayed.peak_reserved.abs_diff(w.original.peak_reserved))
        ),
        (1, 0) => "yes: this setting would have avoided the out-of-memory error".to_string(),
        (o, 0) => format!("yes: this setting would have avoided all {o} out-of-memory errors"),
        (o, r) if r < o => format!("partly: {r} of the {o} out-of-memory errors remain"),
        (0, r) => format!("no: this setting causes {r} out-of-memory errors"),
        (_, _) => "no: the out-of-memory errors remain".to_string(),
    }
}

/// What `gpumem replay TRACE.json --alloc-conf OTHER` prints: PyTorch's recording against the
/// replay under other settings.
pub fn write_trace_text(
    out: &mut dyn Write,
    path: &str,
    w: &crate::analysis::whatif::TraceWhatIf,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{}",
        super::style::wrap(&format!(
            "{path}: what-if: PyTorch's recorded ops replayed with {} (recorded with {}) on the \
             recording's {} device",
            conf(&w.replayed.alloc_conf),
            conf(&w.original.alloc_conf),
            b(w.capacity)
        ))
    )?;
    let mut t = super::style::table();
    t.set_header(vec!["", "recorded (PyTorch)", "replayed", "change"]);
    let (o, r) = (&w.original, &w.replayed);
    for (name, a, z) in [
        ("peak reserved", o.peak_reserved, r.peak_reserved),
        ("peak allocated", o.peak_allocated, r.peak_allocated),
        ("reserved at the end", o.reserved_end, r.reserved_end),
        ("allocated at the end", o.allocated_end, r.allocated_end),
    ] {
        t.add_row(vec![
            name.to_string(),
            b(a),
            b(z),
            format_bytes_signed(z as i64 - a as i64),
        ]);
    }
    for (name, a, z) in [
        ("out-of-memory errors", o.ooms, r.ooms),
        ("cudaMalloc retries", o.alloc_retries, r.alloc_retries),
    ] {
        t.add_row(vec![
            name.to_string(),
            a.to_string(),
            z.to_string(),
            format!("{:+}", z as i64 - a as i64),
        ]);
    }
    super::align_right(&mut t, 1);
    writeln!(out, "{t}")?;
    writeln!(
        out,
        "(to compare step by step with the recording, replay without --alloc-conf)"
    )
}

pub fn trace_to_json(path: &str, w: &crate::analysis::whatif::TraceWhatIf) -> serde_json::Value {
    let mut v = serde_json::to_value(w).unwrap_or(serde_json::Value::Null);
    v["file"] = path.into();
    v["what_if"] = true.into();
    v
}

pub fn to_json(path: &str, w: &WhatIf) -> serde_json::Value {
    let mut v = serde_json::to_value(w).unwrap_or(serde_json::Value::Null);
    v["file"] = path.into();
    v
}
