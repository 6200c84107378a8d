//! What `gpumem summary` prints: a snapshot's state, sites, fragmentation, peak, leaks, OOMs.

use std::io::Write;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::{json, Value};

use crate::analysis::stacks::display_site;
use crate::analysis::summary::{PoolState, SiteBytes, Summary};
use crate::snapshot::{IterationSource, Snapshot};
use crate::units::format_bytes as b;

fn sites_table(title: &str, sites: &[SiteBytes], full: bool) -> Table {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED)
        .set_header(vec![title, "bytes", "blocks"]);
    for s in sites {
        t.add_row(vec![
            display_site(&s.site, full, 3),
            b(s.bytes),
            s.blocks.to_string(),
        ]);
    }
    super::align_right(&mut t, 1);
    t
}

fn iterations_text(s: &Snapshot, n: u32) -> String {
    match s.iterations {
        IterationSource::Tags => format!("{n} iterations"),
        IterationSource::Annotations => {
            format!("{n} iterations, from the Optimizer.step/zero_grad annotations")
        }
        IterationSource::Repetition => {
            format!("{n} iterations, from the trace repeating itself")
        }
        IterationSource::None => "iterations not found".into(),
    }
}

pub fn write_text(
    out: &mut dyn Write,
    path: &str,
    s: &Snapshot,
    m: &Summary,
    full_stacks: bool,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{path}: {} \"{}\", device {} (devices in the file: {})",
        s.format.describe(),
        s.name,
        s.device,
        s.devices
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    match &m.trace {
        Some(t) => writeln!(
            out,
            "trace: {} entries ({} allocations, {} frees, {} segments added, {} released), {}",
            t.entries,
            t.allocs,
            t.frees,
            t.segment_allocs,
            t.segment_frees,
            iterations_text(s, t.iterations)
        )?,
        None => writeln!(
            out,
            "no trace (record one with torch.cuda.memory._record_memory_history())"
        )?,
    }
    if !s.skipped.is_empty() {
        writeln!(
            out,
            "skipped trace entries: {}",
            s.skipped
                .iter()
                .map(|(a, n)| format!("{n} '{a}'"))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED).set_header(vec![
        "state in the snapshot",
        "all",
        "large pool",
        "small pool",
    ]);
    let row = |name: &str, f: &dyn Fn(&PoolState) -> String| {
        vec![name.to_string(), f(&m.all), f(&m.large), f(&m.small)]
    };
    t.add_row(row("reserved", &|p| b(p.reserved_bytes)));
    t.add_row(row("allocated", &|p| b(p.allocated_bytes)));
    t.add_row(row("active", &|p| b(p.active_bytes)));
    t.add_row(row("requested", &|p| b(p.requested_bytes)));
    t.add_row(row("inactive_split", &|p| b(p.inactive_split_bytes)));
    t.add_row(row("segments", &|p| p.segments.to_string()));
    t.add_row(row("allocations", &|p| p.allocations.to_string()));
    t.add_row(row("inactive_split blocks", &|p| {
        p.inactive_split_blocks.to_string()
    }));
    super::align_right(&mut t, 1);
    writeln!(out, "{t}")?;
    if let Some(tr) = &m.trace {
        if tr.inconsistent_allocs > 0 {
            writeln!(
                out,
                "warning: the trace is not a consistent history: {} allocations reuse an address \
                 it still had allocated (entries lost, or a file stitched together); the figures \
                 below are estimates",
                tr.inconsistent_allocs
            )?;
        }
        writeln!(
            out,
            "peak over the trace: {} allocated at entry {} ({} allocated when the trace starts)",
            b(tr.peak_allocated_bytes),
            tr.peak_event,
            b(tr.allocated_at_start)
        )?;
        writeln!(
            out,
            "{}",
            sites_table(
                "held at the peak, by site",
                &tr.top_sites_at_peak,
                full_stacks
            )
        )?;
    }
    writeln!(
        out,
        "{}",
        sites_table(
            "live in the snapshot, by site",
            &m.live_by_site,
            full_stacks
        )
    )?;
    super::findings::write_fragmentation(out, "in the snapshot", &m.fragmentation, 12)?;
    super::findings::write_leaks(out, &m.leaks, true)?;
    for o in &m.ooms {
        writeln!(
            out,
            "OOM at entry {}: {} requested, {}\n  at: {}",
            o.event,
            b(o.requested),
            o.explanation,
            display_site(&o.site, full_stacks, 3)
        )?;
    }
    Ok(())
}

pub fn to_json(path: &str, s: &Snapshot, m: &Summary) -> Value {
    json!({
        "file": path,
        "format": s.format,
        "name": s.name,
        "device": s.device,
        "devices": s.devices,
        "reserved_bytes": m.all.reserved_bytes,
        "allocated_bytes": m.all.allocated_bytes,
        "active_bytes": m.all.active_bytes,
        "requested_bytes": m.all.requested_bytes,
        "segments": m.all.segments,
        "pools": {"all": m.all, "large": m.large, "small": m.small},
        "peak_allocated_bytes": m.trace.as_ref().map(|t| t.peak_allocated_bytes),
        "trace": m.trace,
        "iterations_from": s.iterations,
        "live_by_site": m.live_by_site,
        "fragmentation": m.fragmentation,
        "leaks": m.leaks.leaks,
        "leak_check": {"iterations": m.leaks.iterations, "checked": m.leaks.checked, "note": m.leaks.note},
        "ooms": m.ooms,
        "skipped_entries": s.skipped,
    })
}
