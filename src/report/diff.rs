//! What `gpumem diff` prints: tables (terminal) or markdown (a pull-request comment).

use std::io::Write;

use crate::analysis::diff::{Diff, Row};
use crate::analysis::stacks::display_sites;
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

/// A section's rows as cells. Sites are shown as a person reads them, with more frames where
/// two rows would read alike ([`display_sites`]); rows that still read the same (their Python
/// stacks are equal, only C++ frames differ) are one row, their bytes added.
fn table_cells(rows: &[Row], bytes: bool, site: bool) -> Vec<Vec<String>> {
    let merged: Vec<Row> = if site {
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        let shown = display_sites(&names, false, 2);
        let mut out: Vec<Row> = Vec::new();
        for (r, name) in rows.iter().zip(shown) {
            match out.iter_mut().find(|o| o.name == name) {
                Some(o) => {
                    o.a += r.a;
                    o.b += r.b;
                }
                None => out.push(Row { name, ..r.clone() }),
            }
        }
        // merging can change a row's change: keep the largest first
        out.sort_by_key(|r| std::cmp::Reverse(r.change().unsigned_abs()));
        out
    } else {
        rows.to_vec()
    };
    merged.iter().map(|r| cells(r, bytes)).collect()
}

fn cells(r: &Row, bytes: bool) -> Vec<String> {
    // the segment count row of the totals is a count too
    let count = !bytes || r.name == "segments";
    let f = |v: u64| if count { v.to_string() } else { b(v) };
    let change = if count {
        format!("{:+}", r.change())
    } else {
        format_bytes_signed(r.change())
    };
    vec![r.name.clone(), f(r.a), f(r.b), change, pct(r)]
}

pub fn write_text(out: &mut dyn Write, a: &str, bname: &str, d: &Diff) -> std::io::Result<()> {
    writeln!(out, "A = {a}\nB = {bname}")?;
    for (title, rows, bytes, site) in sections(d) {
        if rows.is_empty() {
            continue;
        }
        let mut t = super::style::table();
        t.set_header(vec![title, "A", "B", "change", "%"]);
        for c in table_cells(rows, bytes, site) {
            t.add_row(c);
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
        for c in table_cells(rows, bytes, site) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, a: u64, b: u64) -> Row {
        Row {
            name: name.into(),
            a,
            b,
        }
    }

    #[test]
    fn site_rows_never_read_alike() {
        // alike in their two innermost frames, different further out
        let x = "m.py:1:main/t.py:9:step/l.py:134:forward/mod.py:1790:_call_impl";
        let y = "m.py:1:main/t.py:8:load/l.py:134:forward/mod.py:1790:_call_impl";
        // the same Python stack as `x`, a C++ frame apart
        let z = "m.py:1:main/t.py:9:step/l.py:134:forward/mod.py:1790:_call_impl/[C++] at::mm";
        let rows = [row(x, 0, 4 << 20), row(y, 0, 3 << 20), row(z, 0, 2 << 20)];
        let cells = table_cells(&rows, true, true);
        assert_eq!(cells.len(), 2, "{cells:?}");
        assert_ne!(cells[0][0], cells[1][0]);
        assert!(cells[0][0].contains("t.py:9:step"), "{cells:?}");
        assert_eq!(cells[0][2], "6.00 MiB");
        assert_eq!(cells[1][2], "3.00 MiB");
        // other sections are not merged
        let rows = [row("a", 1, 2), row("a", 1, 2)];
        assert_eq!(table_cells(&rows, true, false).len(), 2);
    }
}
