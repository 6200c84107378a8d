//! What `gpumem summary` prints: a snapshot's state, sites, fragmentation, peak, leaks, OOMs.

use std::io::Write;

use comfy_table::Table;
use serde_json::{json, Value};

use crate::analysis::stacks::display_site;
use crate::analysis::summary::{DeviceRow, PoolState, SiteBytes, Spread, Summary, RANK_COLUMNS};
use crate::snapshot::{IterationSource, Snapshot};
use crate::units::{count, format_bytes as b};

fn sites_table(title: &str, sites: &[SiteBytes], full: bool) -> Table {
    let mut t = super::style::table();
    t.set_header(vec![title, "bytes", "blocks"]);
    let names: Vec<&str> = sites.iter().map(|s| s.site.as_str()).collect();
    let shown = crate::analysis::stacks::display_sites(&names, full, 3);
    for (s, name) in sites.iter().zip(shown) {
        t.add_row(vec![name, b(s.bytes), s.blocks.to_string()]);
    }
    super::align_right(&mut t, 1);
    t
}

fn iterations_text(s: &Snapshot, n: u32) -> String {
    match s.iterations {
        IterationSource::Tags => count(n.into(), "iteration", "iterations"),
        IterationSource::Annotations => format!(
            "{}, from the Optimizer.step/zero_grad annotations",
            count(n.into(), "iteration", "iterations")
        ),
        IterationSource::Repetition => format!(
            "{}, from the trace repeating itself",
            count(n.into(), "iteration", "iterations")
        ),
        IterationSource::Marker => format!(
            "{}, from --iteration-marker",
            count(n.into(), "iteration", "iterations")
        ),
        IterationSource::None => format!(
            "iterations not found: {}",
            s.iterations_why
                .as_ref()
                .unwrap_or(&crate::snapshot::NoRepetition::NoRepeat)
                .explain()
        ),
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
        "{}",
        super::style::wrap(&format!(
            "{path}: {} \"{}\", device {} (devices in the file: {})",
            s.format.describe(),
            s.name,
            s.device,
            if s.devices.is_empty() {
                "none: no segments and no trace".to_string()
            } else {
                s.devices
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ))
    )?;
    match &m.trace {
        Some(t) => writeln!(
            out,
            "{}",
            super::style::wrap(&format!(
                "trace: {} ({}, {}, {} added, {} released), {}",
                count(t.entries, "entry", "entries"),
                count(t.allocs, "allocation", "allocations"),
                count(t.frees, "free", "frees"),
                count(t.segment_allocs, "segment", "segments"),
                t.segment_frees,
                iterations_text(s, t.iterations)
            ))
        )?,
        None => writeln!(
            out,
            "no trace (record one with torch.cuda.memory._record_memory_history())"
        )?,
    }
    let pools = crate::analysis::summary::private_pools(&s.segments, &s.segment_pools);
    if !pools.is_empty() {
        writeln!(
            out,
            "{}",
            super::style::wrap(&format!(
                "private pools (memory the default pool cannot reuse): {}",
                pools
                    .iter()
                    .map(|p| format!(
                        "({}, {}) {}: {}, {} reserved, {} allocated",
                        p.pool_id[0],
                        p.pool_id[1],
                        if p.kind == "cuda_graph" {
                            "a CUDA graph's"
                        } else {
                            "a MemPool's"
                        },
                        count(p.segments, "segment", "segments"),
                        b(p.reserved_bytes),
                        b(p.allocated_bytes)
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        )?;
    }
    if !s.skipped.is_empty() {
        writeln!(
            out,
            "{}",
            super::style::wrap(&format!(
                "skipped trace entries: {}",
                s.skipped
                    .iter()
                    .map(|(a, n)| format!("{n} '{a}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        )?;
    }
    let mut t = super::style::table();
    t.set_header(vec![
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
    t.add_row(row("free (inactive blocks)", &|p| b(p.free_bytes)));
    t.add_row(row("largest free block", &|p| b(p.largest_free_bytes)));
    super::align_right(&mut t, 1);
    writeln!(out, "{t}")?;
    if let Some(tr) = &m.trace {
        if tr.inconsistent_allocs > 0 {
            writeln!(
                out,
                "{}",
                super::style::wrap(&format!(
                "warning: the trace is not a consistent history: {} allocations reuse an address \
                 it still had allocated (entries lost, or a file stitched together); the figures \
                 below are estimates",
                tr.inconsistent_allocs))
            )?;
        }
        writeln!(
            out,
            "{}",
            super::style::wrap(&format!(
            "peak over the trace: {} allocated at entry {} ({} allocated when the trace starts)",
            b(tr.peak_allocated_bytes),
            s.entry(tr.peak_event),
            b(tr.allocated_at_start)))
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
            "{}",
            super::style::wrap(&format!(
                "OOM at entry {}: {} requested, {}\n  at: {}",
                s.entry(o.event),
                b(o.requested),
                o.explanation,
                display_site(&o.site, full_stacks, 3)
            ))
        )?;
    }
    Ok(())
}

pub fn to_json(path: &str, s: &Snapshot, m: &Summary) -> Value {
    let mut v = to_json_events(path, s, m);
    // events leave out entries gpumem does not model: give each its index in the file's trace
    if let (Some(t), Some(tv)) = (&m.trace, v.get_mut("trace")) {
        tv["peak_entry"] = json!(s.entry(t.peak_event));
    }
    if let Some(Value::Array(os)) = v.get_mut("ooms") {
        for (o, ov) in m.ooms.iter().zip(os.iter_mut()) {
            ov["entry"] = json!(s.entry(o.event));
        }
    }
    v
}

fn to_json_events(path: &str, s: &Snapshot, m: &Summary) -> Value {
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
        "free_bytes": m.all.free_bytes,
        "largest_free_bytes": m.all.largest_free_bytes,
        "pools": {"all": m.all, "large": m.large, "small": m.small},
        "peak_allocated_bytes": m.trace.as_ref().map(|t| t.peak_allocated_bytes),
        "trace": m.trace,
        "iterations_from": s.iterations,
        "iterations_not_found": s.iterations_why.as_ref().map(|w| w.explain()),
        "live_by_site": m.live_by_site,
        "fragmentation": m.fragmentation,
        "leaks": m.leaks.leaks,
        "leak_check": {"iterations": m.leaks.iterations, "checked": m.leaks.checked, "note": m.leaks.note},
        "ooms": m.ooms,
        "skipped_entries": s.skipped,
        "private_pools": crate::analysis::summary::private_pools(&s.segments, &s.segment_pools),
    })
}

/// The state figures of a pool (or a device, or all devices) as JSON.
fn state_json(p: &PoolState) -> Value {
    json!({
        "segments": p.segments,
        "reserved_bytes": p.reserved_bytes,
        "allocated_bytes": p.allocated_bytes,
        "active_bytes": p.active_bytes,
        "requested_bytes": p.requested_bytes,
        "inactive_split_bytes": p.inactive_split_bytes,
        "inactive_split_blocks": p.inactive_split_blocks,
        "free_bytes": p.free_bytes,
        "largest_free_bytes": p.largest_free_bytes,
        "allocations": p.allocations,
    })
}

/// One file's devices as JSON: the first device's fields at the top (the file's primary
/// device when it holds one), `per_device` with each, `all_devices` with their totals, and
/// the out-of-memory errors and leaks of every device, each naming its device.
pub fn to_json_devices(path: &str, devs: &[(&Snapshot, &Summary)]) -> Value {
    let per: Vec<Value> = devs.iter().map(|(s, m)| to_json(path, s, m)).collect();
    let mut total = PoolState::default();
    for (_, m) in devs {
        total.add(&m.all);
    }
    let with_device = |key: &str| -> Vec<Value> {
        per.iter()
            .flat_map(|d| {
                let dev = d["device"].clone();
                d[key]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |mut x| {
                        x["device"] = dev.clone();
                        x
                    })
            })
            .collect()
    };
    let (ooms, leaks) = (with_device("ooms"), with_device("leaks"));
    // the primary device: the one with the longest trace
    let primary =
        crate::snapshot::primary_index(devs.iter().map(|(s, _)| s.events.len())).unwrap_or(0);
    let mut v = per.get(primary).cloned().unwrap_or_else(|| json!({}));
    v["devices_shown"] = json!(devs.iter().map(|(s, _)| s.device).collect::<Vec<_>>());
    v["all_devices"] = state_json(&total);
    v["ooms"] = json!(ooms);
    v["leaks"] = json!(leaks);
    v["per_device"] = json!(per);
    v
}

/// One file's devices as text: with several, a table of them, then each device's report.
pub fn write_devices(
    out: &mut dyn Write,
    path: &str,
    devs: &[(&Snapshot, &Summary)],
    full_stacks: bool,
) -> std::io::Result<()> {
    if let [(s, m)] = devs {
        return write_text(out, path, s, m, full_stacks);
    }
    let Some((first, _)) = devs.first() else {
        return Ok(());
    };
    writeln!(
        out,
        "{path}: {} \"{}\", {} devices",
        first.format.describe(),
        first.name,
        devs.len()
    )?;
    let mut t = super::style::table();
    t.set_header(vec![
        "device",
        "segments",
        "reserved",
        "allocated",
        "inactive_split",
        "largest free",
        "trace entries",
        "OOMs",
    ]);
    let mut total = PoolState::default();
    let row = |name: String, p: &PoolState, entries: String, ooms: String| {
        vec![
            name,
            p.segments.to_string(),
            b(p.reserved_bytes),
            b(p.allocated_bytes),
            b(p.inactive_split_bytes),
            b(p.largest_free_bytes),
            entries,
            ooms,
        ]
    };
    let (mut entries, mut ooms) = (0u64, 0usize);
    for (s, m) in devs {
        total.add(&m.all);
        let n = m.trace.as_ref().map_or(0, |t| t.entries);
        entries += n;
        ooms += m.ooms.len();
        t.add_row(row(
            format!("cuda:{}", s.device),
            &m.all,
            n.to_string(),
            m.ooms.len().to_string(),
        ));
    }
    t.add_row(row(
        "all devices".into(),
        &total,
        entries.to_string(),
        ooms.to_string(),
    ));
    super::align_right(&mut t, 1);
    writeln!(out, "{t}")?;
    for (s, m) in devs {
        writeln!(out)?;
        writeln!(
            out,
            "{}",
            super::style::heading(&format!("== cuda:{} ==", s.device))
        )?;
        write_text(out, path, s, m, full_stacks)?;
    }
    Ok(())
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), b)
}

/// The table of ranks: a row per file and device, then the largest, smallest and spread of
/// each column, naming the row.
pub fn write_ranks(
    out: &mut dyn Write,
    rows: &[DeviceRow],
    spread: &[Spread],
) -> std::io::Result<()> {
    let files: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.file.as_str()).collect();
    writeln!(
        out,
        "{} files, {} devices (a row per file and device; `gpumem summary FILE` for one in full)",
        files.len(),
        rows.len()
    )?;
    let mut t = super::style::table();
    let mut header = vec!["#", "file", "device"];
    header.extend(RANK_COLUMNS.iter().map(|c| c.0));
    header.extend(["OOMs", "leaks"]);
    t.set_header(header);
    for (i, r) in rows.iter().enumerate() {
        let mut cells = vec![i.to_string(), r.file.clone(), format!("cuda:{}", r.device)];
        cells.extend(RANK_COLUMNS.iter().map(|c| opt((c.1)(r))));
        // (leaks not looked for: too few iterations in that file)
        let leaks = r.leaks.map_or("n/a".to_string(), |n| n.to_string());
        cells.extend([r.ooms.to_string(), leaks]);
        t.add_row(cells);
    }
    super::align_right(&mut t, 3);
    writeln!(out, "{t}")?;
    if rows.len() < 2 {
        return Ok(());
    }
    let mut s = super::style::table();
    s.set_header(vec!["across ranks", "largest", "smallest", "spread"]);
    for x in spread {
        s.add_row(vec![
            x.column.to_string(),
            format!("{} (#{})", b(x.max), x.max_row),
            format!("{} (#{})", b(x.min), x.min_row),
            b(x.spread),
        ]);
    }
    super::align_right(&mut s, 1);
    writeln!(out, "{s}")?;
    let ooms: Vec<String> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.ooms > 0)
        .map(|(i, r)| format!("#{i} {} cuda:{} ({})", r.file, r.device, r.ooms))
        .collect();
    if !ooms.is_empty() {
        writeln!(out, "out-of-memory errors in: {}", ooms.join(", "))?;
    }
    Ok(())
}

/// The rows whose reserved memory exceeds `capacity` (the peak over the trace, or what the
/// snapshot holds where that is more or there is no trace), highest first.
pub fn over_capacity(rows: &[DeviceRow], capacity: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].reserved_at_least() > capacity)
        .collect();
    v.sort_by_key(|&i| std::cmp::Reverse(rows[i].reserved_at_least()));
    v
}

/// The row that runs out first as the capacity shrinks: the highest reserved (peak, or the
/// snapshot's where there is no trace).
pub fn first_to_run_out(rows: &[DeviceRow]) -> Option<usize> {
    (0..rows.len())
        .filter(|&i| rows[i].reserved_at_least() > 0)
        .max_by_key(|&i| (rows[i].reserved_at_least(), std::cmp::Reverse(i)))
}

/// A row's reserved figure for the verdict: its peak, or the snapshot's with a note.
fn reserved_shown(r: &DeviceRow) -> String {
    match r.peak_reserved_bytes {
        Some(p) if p >= r.state.reserved_bytes => b(p),
        _ => format!(
            "{} held in the snapshot; no trace",
            b(r.reserved_at_least())
        ),
    }
}

/// The answer for several files (ranks) in one line, printed first: with a capacity, which
/// ranks go over it and which runs out first as memory shrinks; without one, the highest
/// peak reserved and the out-of-memory errors.
pub fn ranks_verdict(rows: &[DeviceRow], capacity: Option<u64>) -> String {
    let name = |i: usize| format!("#{i} {} cuda:{}", rows[i].file, rows[i].device);
    let mut s = String::new();
    match capacity {
        Some(c) => {
            let over = over_capacity(rows, c);
            if over.is_empty() {
                s.push_str(&format!(
                    "every rank's reserved memory fits in {} ({} of {})",
                    b(c),
                    rows.len(),
                    rows.len()
                ));
            } else {
                let list: Vec<String> = over
                    .iter()
                    .map(|&i| format!("{} ({})", name(i), reserved_shown(&rows[i])))
                    .collect();
                s.push_str(&format!(
                    "{} of {} over {} in reserved memory: {}",
                    over.len(),
                    rows.len(),
                    b(c),
                    list.join(", ")
                ));
            }
            if let Some(i) = first_to_run_out(rows) {
                s.push_str(&format!(
                    "; the first to run out as memory shrinks: {} (the highest reserved, {})",
                    name(i),
                    reserved_shown(&rows[i])
                ));
            }
        }
        None => match first_to_run_out(rows) {
            Some(i) => s.push_str(&format!(
                "{} devices: the most reserved is at {} ({})",
                rows.len(),
                name(i),
                reserved_shown(&rows[i])
            )),
            None => s.push_str(&format!(
                "{} devices: no trace, so no peaks (their state at the snapshot is below)",
                rows.len()
            )),
        },
    }
    let ooms: usize = rows.iter().map(|r| r.ooms).sum();
    let with: usize = rows.iter().filter(|r| r.ooms > 0).count();
    if ooms > 0 {
        s.push_str(&format!(
            "; {} in {}",
            crate::units::count(ooms as u64, "out-of-memory error", "out-of-memory errors"),
            crate::units::count(with as u64, "rank", "ranks")
        ));
    } else {
        s.push_str("; no out-of-memory error");
    }
    if capacity.is_some() {
        s.push_str(". (Reserved memory only: NCCL's buffers and the CUDA context come on top.)");
    }
    s
}

pub fn ranks_json(rows: &[DeviceRow], spread: &[Spread]) -> Value {
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "file": r.file,
                "device": r.device,
                "state": state_json(&r.state),
                "peak_allocated_bytes": r.peak_allocated_bytes,
                "peak_reserved_bytes": r.peak_reserved_bytes,
                "trace_entries": r.trace_entries,
                "ooms": r.ooms,
                "leaks": r.leaks,
            })
        })
        .collect();
    json!({ "rows": rows, "across_rows": spread })
}

/// The answer first: did this snapshot run out of memory, on which device, and why (the
/// verdict from the state at the failure: a snapshot cannot be re-run); else its peak.
/// `settled[i]`: whether a replay of device `i`'s trace with expandable segments avoided its
/// out-of-memory errors (`None`: not replayed).
pub fn verdict_line(devs: &[(&Snapshot, &Summary)], settled: &[Option<bool>]) -> String {
    let ooms: Vec<(usize, u32, &crate::analysis::summary::OomEvent)> = devs
        .iter()
        .enumerate()
        .flat_map(|(i, (s, m))| m.ooms.iter().map(move |o| (i, s.device, o)))
        .collect();
    if let Some((i, dev, o)) = ooms.first() {
        let why = match settled.get(*i).copied().flatten() {
            Some(true) => {
                "fragmentation: a replay of the trace with expandable_segments:True avoids it"
                    .to_string()
            }
            Some(false) => {
                "capacity: a replay of the trace with expandable_segments:True runs out too"
                    .to_string()
            }
            None => match o.verdict {
                Some(v) => format!("{}, from the state at the failure", v.name()),
                None => "refused below the device's memory by a limit the snapshot does not \
                     record: fragmentation or capacity depends on it"
                    .to_string(),
            },
        };
        return format!(
            "out of memory on device {dev}{}: {} asked for with {} allocated and {} reserved{} \
             ({why})",
            if ooms.len() > 1 {
                format!(" ({} OOMs, the first)", ooms.len())
            } else {
                String::new()
            },
            b(o.requested),
            b(o.allocated),
            b(o.reserved),
            if o.site.is_empty() {
                String::new()
            } else {
                // innermost Python frames first, as the site tables show them
                format!(", at {}", display_site(&o.site, false, 3))
            },
        );
    }
    let peak = devs
        .iter()
        .map(|(s, m)| {
            (
                m.trace
                    .as_ref()
                    .map_or(m.all.reserved_bytes, |t| t.peak_reserved_bytes),
                s.device,
            )
        })
        .max();
    match peak {
        Some((p, dev)) => format!(
            "no out-of-memory recorded: peak reserved {} (device {dev}{})",
            b(p),
            if devs.len() > 1 {
                format!(", the highest of {}", devs.len())
            } else {
                String::new()
            }
        ),
        None => "no out-of-memory recorded".to_string(),
    }
}
