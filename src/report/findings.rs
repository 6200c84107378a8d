//! Text and JSON for what analysis found in a run: leaks, fragmentation, and an
//! out-of-memory's diagnosis with the remedies that were tried.

use std::io::Write;

use comfy_table::{CellAlignment, Table};
use serde_json::{json, Value};

use crate::analysis::findings::Findings;
use crate::analysis::fragmentation::Fragmentation;
use crate::analysis::leaks::LeakReport;
use crate::analysis::oom::OomDiagnosis;
use crate::analysis::record::Tried;
use crate::analysis::stacks::is_python_frame;
use crate::units::format_bytes as b;

fn table(header: Vec<&str>, right_from: usize) -> Table {
    let mut t = super::style::table();
    t.set_header(header);
    super::align_right(&mut t, right_from);
    t
}

fn pct(r: f64) -> String {
    format!("{:.1}%", r * 100.0)
}

/// Leaks: a table per leak, or one line saying none (or why none could be looked for).
pub fn write_leaks(out: &mut dyn Write, l: &LeakReport, verbose: bool) -> std::io::Result<()> {
    match (&l.checked, l.leaks.is_empty()) {
        (None, _) => {
            // said whether asked or not: a silent "no leak" would be read as none found
            let _ = verbose;
            if let Some(n) = &l.note {
                writeln!(
                    out,
                    "{}",
                    super::style::wrap(&format!("leaks: not looked for: {n}"))
                )?;
            }
        }
        (Some((a, z)), true) => writeln!(
            out,
            "{}",
            super::style::wrap(&format!(
                "leaks: none (iterations {a} to {z} each freed everything they made, after \
                 warm-up)"
            ))
        )?,
        (Some((a, z)), false) => {
            for k in &l.leaks {
                let text = format!(
                    "{}: {} per iteration ({}) from iteration {} on, still held at the end \
                     (iterations {a} to {z} checked: {}):",
                    super::style::bad("LEAK"),
                    b(k.bytes_per_iteration),
                    k.category,
                    k.first_iteration,
                    k.per_iteration
                        .iter()
                        .map(|x| b(*x))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                writeln!(out, "{}", super::style::wrap(&text))?;
                let mut t = table(
                    vec!["site (tags)", "op", "category", "per iteration", "blocks"],
                    3,
                );
                let names: Vec<&str> = k.sites.iter().take(10).map(|s| s.site.as_str()).collect();
                let shown = crate::analysis::stacks::display_sites(&names, false, 3);
                for (s, name) in k.sites.iter().take(10).zip(shown) {
                    // a call stack (a PyTorch snapshot's) shows its innermost Python frames,
                    // and its op is the innermost Python function
                    let op = match s.site.rsplit('/').find(|t| is_python_frame(t)) {
                        Some(f) => f.splitn(3, ':').nth(2).unwrap_or(f).to_string(),
                        None => s.op.clone().unwrap_or_default(),
                    };
                    t.add_row(vec![
                        name,
                        op,
                        s.category.clone(),
                        b(s.bytes_per_iteration),
                        format!("{:.1}", s.blocks_per_iteration),
                    ]);
                }
                super::align_right(&mut t, 3);
                writeln!(out, "{t}")?;
                if k.sites.len() > 10 {
                    writeln!(out, "  ... and {} more sites", k.sites.len() - 10)?;
                }
                writeln!(out, "  likely cause: {}", k.cause)?;
            }
        }
    }
    Ok(())
}

/// Free space in segments below which fragmentation is not worth a percentage.
const SMALL_FREE: u64 = 64 << 20;

/// One state's fragmentation: totals, pools, and each segment's fill map.
pub fn write_fragmentation(
    out: &mut dyn Write,
    title: &str,
    f: &Fragmentation,
    max_segments: usize,
) -> std::io::Result<()> {
    // a ratio of little is no headline: below 64 MiB (or 1% of reserved) of free space the
    // bytes are said, not the percentage
    let small = f.external < (SMALL_FREE).max(f.reserved / 100);
    let verdict = if small {
        format!(
            "{} free in segments: too little for fragmentation to matter",
            b(f.external)
        )
    } else {
        format!(
            "fragmentation {} ({} of the {} free is outside the largest block)",
            pct(f.ratio),
            b(f.external.saturating_sub(f.largest_free)),
            b(f.external)
        )
    };
    let text = format!(
        "fragmentation {title}: reserved {}, allocated {} (requested {}, internal slack {}), \
         free in segments {} (external), largest free block {}; {verdict}",
        b(f.reserved),
        b(f.allocated),
        b(f.requested),
        b(f.internal),
        b(f.external),
        b(f.largest_free),
    );
    writeln!(out, "{}", super::style::wrap(&text))?;
    let mut t = table(
        vec![
            "pool",
            "stream",
            "segments",
            "reserved",
            "free",
            "free blocks",
            "largest free",
            "1 - largest/free",
        ],
        2,
    );
    for p in &f.pools {
        t.add_row(vec![
            p.pool.to_string(),
            p.stream.to_string(),
            p.segments.to_string(),
            b(p.reserved),
            b(p.free),
            p.free_blocks.to_string(),
            b(p.largest_free),
            pct(if p.free == 0 {
                0.0
            } else {
                1.0 - p.largest_free as f64 / p.free as f64
            }),
        ]);
    }
    super::align_right(&mut t, 1);
    writeln!(out, "{t}")?;
    if f.segments.is_empty() {
        return Ok(());
    }
    // a line is 60 characters besides its map: a narrow terminal gets a coarser map
    let chars = super::style::map_chars(60);
    writeln!(
        out,
        "{}",
        super::style::wrap(&format!(
            "segments (# requested, + slack of allocated blocks, . free; 1/{chars} of the \
             segment per character), most free first:"
        ))
    )?;
    let mut segs: Vec<_> = f.segments.iter().collect();
    segs.sort_by(|a, b| b.free.cmp(&a.free).then(a.address.cmp(&b.address)));
    for s in segs.iter().take(max_segments) {
        writeln!(
            out,
            "  {:#014x} {:>5} {:>10} free {:>10} in {:>3} |{}|",
            s.address,
            s.pool,
            b(s.size),
            b(s.free),
            s.free_blocks,
            coarser(&s.map, chars)
        )?;
    }
    if segs.len() > max_segments {
        writeln!(out, "  ... {} more segments", segs.len() - max_segments)?;
    }
    Ok(())
}

/// A fill map of `map.len()` characters shown in `chars`: each shown character stands for a run
/// of the map's and is the one most of them are (on a tie: `#` over `+` over `.`).
fn coarser(map: &str, chars: usize) -> String {
    let cells: Vec<char> = map.chars().collect();
    if chars == 0 || cells.len() <= chars {
        return map.to_string();
    }
    let per = cells.len().div_ceil(chars);
    cells
        .chunks(per)
        .map(|run| {
            let count = |c: char| run.iter().filter(|&&x| x == c).count();
            // max_by_key keeps the last of equal counts
            ['.', '+', '#']
                .into_iter()
                .max_by_key(|&c| count(c))
                .unwrap_or('.')
        })
        .collect()
}

/// The fragmentation report: at the peak, at the failure or end, and the series.
pub fn write_fragmentation_report(out: &mut dyn Write, f: &Findings) -> std::io::Result<()> {
    if let Some(p) = &f.fragmentation_at_peak {
        write_fragmentation(out, "at the peak", p, 12)?;
    }
    let end_title = if f.fragmentation_at_oom.is_some() {
        "at the out-of-memory"
    } else {
        "at the end"
    };
    write_fragmentation(out, end_title, &f.fragmentation_at_end, 12)?;
    if let Some(n) = &f.replay_note {
        writeln!(out, "(no states before the end: {n})")?;
    }
    if !f.fragmentation_series.is_empty() {
        let mut t = table(
            vec![
                "when",
                "event",
                "reserved",
                "allocated",
                "internal",
                "external",
                "largest free",
                "fragmentation",
            ],
            1,
        );
        for p in &f.fragmentation_series {
            t.add_row(vec![
                p.at.clone(),
                p.event.to_string(),
                b(p.reserved),
                b(p.allocated),
                b(p.internal),
                b(p.external),
                b(p.largest_free),
                pct(p.ratio),
            ]);
        }
        super::align_right(&mut t, 1);
        writeln!(out, "fragmentation over the run:\n{t}")?;
    }
    Ok(())
}

/// The diagnosis of an out-of-memory and the remedies' table.
pub fn write_oom(
    out: &mut dyn Write,
    d: &OomDiagnosis,
    remedies: Option<&[Tried]>,
) -> std::io::Result<()> {
    writeln!(out, "diagnosis: {}", d.explanation)?;
    writeln!(
        out,
        "  requested {} (rounded {}), device {} ({} usable), allocated {}, reserved {}, \
         largest free block {}, device free {}",
        b(d.requested),
        b(d.rounded),
        b(d.capacity),
        b(d.usable),
        b(d.allocated),
        b(d.reserved),
        b(d.largest_free_block),
        b(d.device_free)
    )?;
    let mut t = table(vec!["live at the failure, by category", "bytes"], 1);
    for (c, n) in &d.live_by_category {
        t.add_row(vec![c.clone(), b(*n)]);
    }
    super::align_right(&mut t, 1);
    writeln!(out, "{t}")?;
    let mut t = table(vec!["live at the failure, by site (tags)", "bytes"], 1);
    for (c, n) in &d.top_tags {
        t.add_row(vec![c.clone(), b(*n)]);
    }
    super::align_right(&mut t, 1);
    writeln!(out, "{t}")?;
    let Some(rs) = remedies else {
        return Ok(());
    };
    if rs.is_empty() {
        writeln!(out, "no remedy applies to this workload")?;
        return Ok(());
    }
    writeln!(
        out,
        "remedies, each run again on the simulated device (peaks up to the end, or up to the \
         out-of-memory), those that fit first, each ranked by how little it changes:"
    )?;
    let mut t = table(
        vec![
            "remedy",
            "what it changes",
            "peak allocated",
            "peak reserved",
            "fits",
            "change",
        ],
        2,
    );
    for r in rs {
        let (alloc, res, fits) = match &r.error {
            Some(_) => ("-".into(), "-".into(), "error".to_string()),
            None => (
                b(r.peak_allocated),
                b(r.peak_reserved),
                match (&r.oom_at, r.fits) {
                    (_, true) => "yes".to_string(),
                    (Some(at), false) => format!("no: OOM in {at}"),
                    (None, false) => "no".to_string(),
                },
            ),
        };
        let change = match &r.error {
            Some(e) => format!("{} (could not run: {e})", r.change),
            None => r.change.clone(),
        };
        t.add_row(vec![
            r.name.clone(),
            r.kind.tier().name().to_string(),
            alloc,
            res,
            fits,
            change,
        ]);
    }
    super::align_right(&mut t, 2);
    if let Some(c) = t.column_mut(4) {
        c.set_cell_alignment(CellAlignment::Left);
    }
    if let Some(c) = t.column_mut(5) {
        c.set_cell_alignment(CellAlignment::Left);
    }
    writeln!(out, "{t}")?;
    match rs.iter().find(|r| r.fits) {
        Some(r) => writeln!(out, "smallest change that fits: {}: {}", r.name, r.change)?,
        None => writeln!(out, "no single remedy makes it fit")?,
    }
    Ok(())
}

pub fn oom_json(d: &OomDiagnosis, remedies: Option<&[Tried]>) -> Value {
    let mut v = serde_json::to_value(d).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert(
            "live_by_category".into(),
            d.live_by_category
                .iter()
                .map(|(c, n)| (c.clone(), json!(n)))
                .collect::<serde_json::Map<_, _>>()
                .into(),
        );
        m.insert(
            "top_tags".into(),
            d.top_tags
                .iter()
                .map(|(t, n)| json!({"tags": t, "bytes": n}))
                .collect(),
        );
        m.insert(
            "remedies".into(),
            serde_json::to_value(remedies.unwrap_or(&[])).unwrap_or(Value::Null),
        );
        m.insert(
            "smallest_fitting_remedy".into(),
            json!(remedies
                .and_then(|r| r.iter().find(|t| t.fits))
                .map(|t| &t.name)),
        );
    }
    v
}

/// For a verdict line under `--fail-on leak`: "; leaking X per iteration (--fail-on leak)"
/// when leaks were found, else nothing.
pub fn fail_on_leak_note(l: &LeakReport) -> String {
    if l.checked.is_none() {
        // asked to fail on a leak that could not be looked for: said, not passed silently
        return format!(
            "; leaks not looked for, so --fail-on leak could not fail: {}",
            l.note.as_deref().unwrap_or("too few complete iterations")
        );
    }
    if l.leaks.is_empty() {
        return String::new();
    }
    let per: u64 = l.leaks.iter().map(|x| x.bytes_per_iteration).sum();
    format!(
        "; leaking {} per iteration at {} site{} (--fail-on leak)",
        b(per),
        l.leaks.len(),
        if l.leaks.len() == 1 { "" } else { "s" }
    )
}

pub fn leaks_json(l: &LeakReport) -> Value {
    serde_json::to_value(&l.leaks).unwrap_or(Value::Null)
}

pub fn fragmentation_json(f: &Findings) -> Value {
    json!({
        "at_peak": f.fragmentation_at_peak,
        "at_oom": f.fragmentation_at_oom,
        "at_end": f.fragmentation_at_end,
        "series": f.fragmentation_series,
        "note": f.replay_note,
    })
}
