//! What `gpumem diff` prints: tables (terminal) or markdown (a pull-request comment).

use std::io::Write;

use crate::analysis::diff::{Diff, Row};
use crate::analysis::stacks::display_site;
use crate::units::{format_bytes as b, format_bytes_signed};

fn pct(r: &Row) -> String {
    if r.a == 0 {
        if r.b == 0 {
            "0%".into()
        } else {
            "new".into()
        }
    } else {
        format!("{:+.1}%", r.change() as f64 * 100.0 / r.a as f64)
    }
}

/// (title, rows, whether the figures are bytes, whether names are sites)
fn sections(d: &Diff) -> Vec<(&'static str, &[Row], bool, bool)> {
    vec![
        ("totals", &d.totals[..], true, false),
        (
            "at the peak, by category",
            &d.categories_at_peak[..],
            true,
            false,
        ),
        ("at the peak, by site", &d.sites_at_peak[..], true, true),
        ("live at the end, by site", &d.sites_live[..], true, true),
        (
            "segments by size (count)",
            &d.segment_sizes[..],
            false,
            false,
        ),
    ]
}

fn cells(r: &Row, bytes: bool, site: bool) -> Vec<String> {
    let name = if site {
        display_site(&r.name, false, 2)
    } else {
        r.name.clone()
    };
    // the segment count row of the totals is a count too
    let count = !bytes || r.name == "segments";
    let f = |v: u64| if count { v.to_string() } else { b(v) };
    let change = if count {
        format!("{:+}", r.change())
    } else {
        format_bytes_signed(r.change())
    };
    vec![name, f(r.a), f(r.b), change, pct(r)]
}

pub fn write_text(out: &mut dyn Write, a: &str, bname: &str, d: &Diff) -> std::io::Result<()> {
    writeln!(out, "A = {a}\nB = {bname}")?;
    for (title, rows, bytes, site) in sections(d) {
        if rows.is_empty() {
            continue;
        }
        let mut t = super::style::table();
        t.set_header(vec![title, "A", "B", "change", "%"]);
        for r in rows {
            t.add_row(cells(r, bytes, site));
        }
        super::align_right(&mut t, 1);
        writeln!(out, "{t}")?;
    }
    Ok(())
}

pub fn write_markdown(out: &mut dyn Write, a: &str, bname: &str, d: &Diff) -> std::io::Result<()> {
    let peak = &d.totals[0];
    writeln!(
        out,
        "### GPU memory: peak allocated {} → {} ({}, {})\n",
        b(peak.a),
        b(peak.b),
        format_bytes_signed(peak.change()),
        pct(peak)
    )?;
    writeln!(
        out,
        "A: {} · B: {}\n",
        super::escape::markdown(a),
        super::escape::markdown(bname)
    )?;
    for (title, rows, bytes, site) in sections(d) {
        if rows.is_empty() {
            continue;
        }
        writeln!(
            out,
            "| {title} | A | B | change | % |\n|---|---:|---:|---:|---:|"
        )?;
        for r in rows {
            let c = cells(r, bytes, site);
            writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                super::escape::markdown(&c[0]),
                c[1],
                c[2],
                c[3],
                c[4]
            )?;
        }
        writeln!(out)?;
    }
    Ok(())
}
