//! `gpumem compare-torch`'s table: per case, PyTorch's peak and gpumem's, the error, and how
//! many of the recorded fields are exact.

use std::io::Write;

use comfy_table::CellAlignment;

use crate::units::format_bytes;

/// One recorded field of one iteration, PyTorch's and gpumem's.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FieldDiff {
    pub iteration: usize,
    pub field: String,
    pub pytorch: u64,
    /// `None` when gpumem's run has no such point (e.g. no backward ran).
    pub gpumem: Option<u64>,
    pub within_tolerance: bool,
}

impl FieldDiff {
    /// Relative error in percent (gpumem − PyTorch) / PyTorch.
    pub fn error_pct(&self) -> Option<f64> {
        let g = self.gpumem? as f64;
        let p = self.pytorch as f64;
        Some(if p == 0.0 {
            if g == 0.0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (g - p) / p * 100.0
        })
    }
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CaseRow {
    pub name: String,
    /// Why gpumem could not run this case (no preset for it yet, PyTorch's run failed...).
    pub not_modelled: Option<String>,
    pub fields: Vec<FieldDiff>,
    /// Other tools' estimates of the peak recorded with the case (accelerate's training
    /// estimate, PyTorch's MemTracker).
    pub estimates: Vec<Estimate>,
    /// PyTorch's largest peak allocated and reserved over the iterations, as recorded (also
    /// for a case gpumem cannot run).
    pub pytorch_peaks: (Option<u64>, Option<u64>),
}

/// Another estimator's peak for a case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Estimate {
    pub tool: String,
    pub peak: u64,
}

impl CaseRow {
    pub fn exact(&self) -> usize {
        self.fields
            .iter()
            .filter(|f| f.gpumem == Some(f.pytorch))
            .count()
    }

    pub fn passes(&self) -> bool {
        self.not_modelled.is_none()
            && !self.fields.is_empty()
            && self.fields.iter().all(|f| f.within_tolerance)
    }

    /// The largest `peak_allocated` over iterations: PyTorch's and gpumem's.
    fn peak(&self, field: &str) -> (Option<u64>, Option<u64>) {
        let p = self.fields.iter().filter(|f| f.field == field);
        (
            p.clone().map(|f| f.pytorch).max(),
            p.filter_map(|f| f.gpumem).max(),
        )
    }

    /// The field with the largest relative error.
    pub fn worst(&self) -> Option<&FieldDiff> {
        self.fields.iter().max_by(|a, b| {
            let e = |f: &FieldDiff| f.error_pct().map_or(f64::INFINITY, f64::abs);
            e(a).total_cmp(&e(b))
        })
    }
}

fn pct(e: Option<f64>) -> String {
    match e {
        Some(0.0) => "0".into(),
        Some(e) => format!("{e:+.4}%"),
        None => "missing".into(),
    }
}

pub fn write_text(out: &mut dyn Write, rows: &[CaseRow]) -> std::io::Result<()> {
    let mut t = super::style::table();

    t.set_header([
        "case",
        "PyTorch peak allocated",
        "gpumem",
        "error",
        "PyTorch peak reserved",
        "gpumem",
        "error",
        "fields exact",
        "worst field",
        "verdict",
    ]);
    for r in rows {
        if let Some(why) = &r.not_modelled {
            let mut cells = vec![r.name.clone()];
            cells.extend(std::iter::repeat_n(String::new(), 7));
            cells.push(String::new());
            cells.push(format!("not modelled: {}", first_line(why)));
            t.add_row(cells);
            continue;
        }
        let (pa, ga) = r.peak("peak_allocated");
        let (pr, gr) = r.peak("peak_reserved");
        let err = |p: Option<u64>, g: Option<u64>| match (p, g) {
            (Some(p), Some(g)) if p > 0 => pct(Some((g as f64 - p as f64) / p as f64 * 100.0)),
            (Some(_), Some(_)) => "0".into(),
            _ => "missing".into(),
        };
        let b = |v: Option<u64>| v.map_or("-".into(), format_bytes);
        let worst = r.worst().map_or("-".into(), |w| {
            if w.gpumem == Some(w.pytorch) {
                "-".into()
            } else {
                format!("iter {} {} {}", w.iteration, w.field, pct(w.error_pct()))
            }
        });
        let verdict = if r.exact() == r.fields.len() {
            "exact"
        } else if r.passes() {
            "within tolerance"
        } else {
            "OFF"
        };
        t.add_row(vec![
            r.name.clone(),
            b(pa),
            b(ga),
            err(pa, ga),
            b(pr),
            b(gr),
            err(pr, gr),
            format!("{}/{}", r.exact(), r.fields.len()),
            worst,
            verdict.into(),
        ]);
    }
    for i in [1, 2, 3, 4, 5, 6, 7] {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    writeln!(out, "{t}")?;
    write_estimates(out, rows)?;
    let modelled: Vec<&CaseRow> = rows.iter().filter(|r| r.not_modelled.is_none()).collect();
    let exact = modelled
        .iter()
        .filter(|r| r.exact() == r.fields.len())
        .count();
    let fields: usize = modelled.iter().map(|r| r.fields.len()).sum();
    let fields_exact: usize = modelled.iter().map(|r| r.exact()).sum();
    writeln!(
        out,
        "{} of {} cases modelled; {exact} exact to the byte ({fields_exact} of {fields} fields); \
         {} within tolerance (allocated 0.1%, reserved 1% or 2 MiB)",
        modelled.len(),
        rows.len(),
        rows.iter().filter(|r| r.passes()).count()
    )
}

/// Beside PyTorch's peaks, gpumem's and the other estimators' recorded with the cases (only
/// when some case has one), each with its error.
fn write_estimates(out: &mut dyn Write, rows: &[CaseRow]) -> std::io::Result<()> {
    let mut tools: Vec<&str> = Vec::new();
    for r in rows {
        for e in &r.estimates {
            if !tools.contains(&e.tool.as_str()) {
                tools.push(&e.tool);
            }
        }
    }
    if tools.is_empty() {
        return Ok(());
    }
    let mut t = super::style::table();

    let mut header = vec![
        "case".to_string(),
        "PyTorch peak allocated".into(),
        "gpumem".into(),
        "PyTorch peak reserved".into(),
        "gpumem".into(),
    ];
    header.extend(tools.iter().map(|k| format!("{k} (vs allocated)")));
    t.set_header(header);
    let cell = |v: Option<u64>, p: Option<u64>| match (v, p) {
        (Some(v), Some(p)) if p > 0 => format!(
            "{} ({})",
            format_bytes(v),
            pct(Some((v as f64 - p as f64) / p as f64 * 100.0))
        ),
        (Some(v), _) => format_bytes(v),
        _ => "-".into(),
    };
    for r in rows {
        let (_, ga) = r.peak("peak_allocated");
        let (_, gr) = r.peak("peak_reserved");
        let (pa, pr) = r.pytorch_peaks;
        let mut cells = vec![
            r.name.clone(),
            pa.map_or("-".into(), format_bytes),
            if r.not_modelled.is_some() {
                "not modelled".into()
            } else {
                cell(ga, pa)
            },
            pr.map_or("-".into(), format_bytes),
            cell(gr, pr),
        ];
        for k in &tools {
            let e = r.estimates.iter().find(|e| e.tool == *k).map(|e| e.peak);
            cells.push(cell(e, pa));
        }
        t.add_row(cells);
    }
    writeln!(
        out,
        "Estimators beside PyTorch (errors against its measured peaks):"
    )?;
    writeln!(out, "{t}")
}

/// The reason's gist for a table cell: after any "FILE: line L column C: " prefix, up to the
/// first parenthesis or semicolon (the JSON output has all of it).
fn first_line(s: &str) -> &str {
    let s = s.lines().next().unwrap_or("");
    let s = match s.find(" column ") {
        Some(c) => s
            .get(c..)
            .and_then(|rest| rest.find(": ").map(|i| c + i + 2))
            .and_then(|i| s.get(i..))
            .unwrap_or(s),
        None => s,
    };
    let end = s.find([';', '(']).unwrap_or(s.len());
    s.get(..end).unwrap_or(s).trim_end()
}
