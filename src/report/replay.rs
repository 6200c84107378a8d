//! The result of `gpumem replay`: one verdict line, then the first mismatches with context;
//! or one JSON object.

use std::io::Write;

use serde_json::json;

use crate::analysis::replay::ReplayOutcome;
use crate::units::format_bytes;

/// What the report says about the input, beside the outcome.
pub struct ReplayHeader<'a> {
    pub path: &'a str,
    pub alloc_conf: &'a str,
    pub conf_overridden: bool,
    pub memory_fraction: f64,
    pub torch_version: &'a str,
    pub device_name: &'a str,
}

pub fn write_text(out: &mut dyn Write, h: &ReplayHeader, r: &ReplayOutcome) -> std::io::Result<()> {
    let verdict = if r.all_match() { "MATCH" } else { "MISMATCH" };
    let stats = if r.stats_end_compared {
        format!(
            "{}/122 stats_end keys",
            122usize.saturating_sub(r.stats_end_mismatches.len())
        )
    } else {
        "no stats_end recorded".into()
    };
    let trace = match &r.trace {
        Some(t) if t.first_difference.is_none() => format!(
            ", {}/{} trace events identical",
            t.matched_prefix, t.expected
        ),
        Some(t) => format!(
            ", trace identical for {}/{} events",
            t.matched_prefix, t.expected
        ),
        None => String::new(),
    };
    writeln!(
        out,
        "{verdict} {}: {}/{} steps, {}/{} OOMs, {}{}",
        h.path,
        r.compared_steps - r.mismatched_steps,
        r.compared_steps,
        r.ooms_matched,
        r.ooms_expected,
        stats,
        trace
    )?;
    let conf = if h.alloc_conf.is_empty() {
        "(default)"
    } else {
        h.alloc_conf
    };
    write!(
        out,
        "  alloc_conf {conf}{}",
        if h.conf_overridden {
            " (--alloc-conf, not the trace's)"
        } else {
            ""
        }
    )?;
    if h.memory_fraction > 0.0 {
        write!(out, ", memory fraction {}", h.memory_fraction)?;
    }
    if !h.torch_version.is_empty() {
        write!(
            out,
            "; recorded with PyTorch {} on {}",
            h.torch_version, h.device_name
        )?;
    }
    writeln!(out)?;
    if r.ooms_expected > 0 || !r.ooms_unexpected.is_empty() {
        writeln!(
            out,
            "  OOM messages: {}/{} identical to PyTorch's apart from the driver's free/in-use figures",
            r.oom_messages_matched, r.ooms_expected
        )?;
    }
    if let Some((step, theirs, mine)) = &r.oom_message_first_difference {
        writeln!(out, "  first differing OOM message, step {step}:\n    PyTorch: {theirs}\n    gpumem:  {mine}")?;
    }
    for d in &r.details {
        writeln!(out, "  step {} ({}):", d.step, d.op)?;
        if d.oom_expected != d.oom_replayed {
            writeln!(
                out,
                "    out of memory: PyTorch {}, gpumem {}",
                if d.oom_expected { "raised" } else { "did not" },
                if d.oom_replayed { "raised" } else { "did not" }
            )?;
        }
        for (c, e, g) in &d.columns {
            let mark = if e != g { "  <-- differs" } else { "" };
            writeln!(out, "    {c:<22} PyTorch {e:>14}  gpumem {g:>14}{mark}")?;
        }
    }
    if r.mismatched_steps > r.details.len() {
        writeln!(
            out,
            "  ... {} more mismatched steps",
            r.mismatched_steps - r.details.len()
        )?;
    }
    for s in &r.ooms_unexpected {
        if !r.details.iter().any(|d| d.step == *s) {
            writeln!(
                out,
                "  step {s}: gpumem raised out of memory, PyTorch did not"
            )?;
        }
    }
    const KEYS_SHOWN: usize = 12;
    for m in r.stats_end_mismatches.iter().take(KEYS_SHOWN) {
        writeln!(
            out,
            "  stats_end {}: PyTorch {} gpumem {}",
            m.key, m.expected, m.replayed
        )?;
    }
    if r.stats_end_mismatches.len() > KEYS_SHOWN {
        writeln!(
            out,
            "  ... {} more stats_end keys differ (--json lists them all)",
            r.stats_end_mismatches.len() - KEYS_SHOWN
        )?;
    }
    if let Some(t) = &r.trace {
        if let Some((i, e, g)) = &t.first_difference {
            writeln!(out, "  trace event {i}: PyTorch `{e}`, gpumem `{g}`")?;
        }
    }
    let s = &r.stats;
    writeln!(
        out,
        "  end: allocated {}, reserved {}, peak allocated {}, peak reserved {}",
        format_bytes(s.allocated_bytes.all().current as u64),
        format_bytes(s.reserved_bytes.all().current as u64),
        format_bytes(s.allocated_bytes.all().peak as u64),
        format_bytes(s.reserved_bytes.all().peak as u64)
    )?;
    Ok(())
}

pub fn to_json(h: &ReplayHeader, r: &ReplayOutcome) -> serde_json::Value {
    json!({
        "trace": h.path,
        "alloc_conf": h.alloc_conf,
        "alloc_conf_overridden": h.conf_overridden,
        "memory_fraction": h.memory_fraction,
        "verdict": if r.all_match() { "match" } else { "mismatch" },
        "ops": r.ops,
        "compared_steps": r.compared_steps,
        "mismatched_steps": r.mismatched_steps,
        "first_mismatches": r.details,
        "ooms_expected": r.ooms_expected,
        "ooms_matched": r.ooms_matched,
        "ooms_unexpected": r.ooms_unexpected,
        "ooms_missed": r.ooms_missed,
        "oom_messages_matched": r.oom_messages_matched,
        "stats_end_compared": r.stats_end_compared,
        "stats_end_mismatched_keys": r.stats_end_mismatches.iter().map(|m| m.key.clone()).collect::<Vec<_>>(),
        "stats_end_mismatches": r.stats_end_mismatches,
        "trace_events": r.trace,
        "memory_stats": r.stats.to_flat(),
    })
}
