//! Allocator benchmark results, beside PyTorch's when given.

use std::io::Write;

/// One measured pattern: ns per alloc+free pair over repetitions.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchRow {
    pub pattern: String,
    pub recording: bool,
    pub ns_per_pair: Vec<f64>,
    /// PyTorch's C++ allocator on the same pattern, when its results were given.
    pub pytorch_ns_per_pair: Option<Vec<f64>>,
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        f64::NAN
    } else {
        s[s.len() / 2]
    }
}

pub fn write_text(out: &mut dyn Write, rows: &[BenchRow]) -> std::io::Result<()> {
    let mut t = super::style::table();

    let with_torch = rows.iter().any(|r| r.pytorch_ns_per_pair.is_some());
    let mut header = vec![
        "pattern",
        "recording",
        "gpumem ns/pair (median)",
        "min..max",
    ];
    if with_torch {
        header.extend(["PyTorch ns/pair (median)", "PyTorch / gpumem"]);
    }
    t.set_header(header);
    for r in rows {
        let m = median(&r.ns_per_pair);
        let lo = r.ns_per_pair.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.ns_per_pair.iter().copied().fold(0.0, f64::max);
        let mut cells = vec![
            r.pattern.clone(),
            if r.recording {
                "on".into()
            } else {
                "off".into()
            },
            format!("{m:.1}"),
            format!("{lo:.1}..{hi:.1}"),
        ];
        if with_torch {
            match &r.pytorch_ns_per_pair {
                Some(p) => {
                    let pm = median(p);
                    cells.push(format!("{pm:.1}"));
                    cells.push(format!("{:.1}x", pm / m));
                }
                None => cells.extend([String::new(), String::new()]),
            }
        }
        t.add_row(cells);
    }
    super::align_right(&mut t, 2);
    writeln!(out, "{t}")
}
