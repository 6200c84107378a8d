//! `gpumem fit WORKLOAD --capacity 24GiB`: the largest batch size (or other integer
//! parameter) that fits, alone and under each remedy.

use std::io::{IsTerminal, Write};

use comfy_table::CellAlignment;
use serde_json::json;

use crate::cli::FitArgs;
use crate::commands::Outcome;
use crate::error::{Error, Result};
use crate::runner::remedies::{self, RemedyKind};
use crate::runner::RunOptions;
use crate::units::{format_bytes, parse_capacity};
use crate::workload::{self, Overrides};

struct Row {
    name: String,
    change: String,
    max_fitting: Option<i64>,
    peak_allocated: Option<u64>,
    peak_reserved: Option<u64>,
    runs: u32,
}

pub fn run(args: &FitArgs, out: &mut dyn Write) -> Result<Outcome> {
    let capacity = match &args.capacity {
        Some(s) => Some(parse_capacity(s).map_err(|m| Error::usage("--capacity", m))?),
        None => None,
    };
    if args.max < 1 {
        return Err(Error::usage("--max", "must be at least 1"));
    }
    super::check_iterations(args.iterations)?;
    let base = Overrides {
        env_alloc_conf: super::env_alloc_conf(&|k| std::env::var(k).ok())?,
        ..Overrides::default()
    };
    let w = workload::load_with(&args.workload, &base)?;
    let ints = w.integer_params();
    let (param, start) = match &args.param {
        Some(p) => match ints.iter().find(|(n, _)| n == p) {
            Some((n, v)) => (n.clone(), *v),
            None => {
                return Err(Error::usage(
                    "--param",
                    format!(
                        "{} has no integer parameter '{p}' ({})",
                        args.workload.display(),
                        ints.iter()
                            .map(|(n, _)| n.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ))
            }
        },
        None => w.batch_param().ok_or_else(|| {
            Error::usage(
                "--param",
                format!(
                    "{} has no batch parameter: name one with --param ({}), or declare \
                     [params] batch = N in the workload and use `batch` in its script",
                    args.workload.display(),
                    if ints.is_empty() {
                        "it has none".to_string()
                    } else {
                        ints.iter()
                            .map(|(n, _)| n.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
            )
        })?,
    };
    let opts = RunOptions {
        capacity,
        iterations: args.iterations,
        device: args.device.clone(),
    };
    let mut candidates: Vec<(String, String, Overrides)> = vec![(
        "as written".into(),
        "the workload unchanged".into(),
        base.clone(),
    )];
    if !args.no_remedies {
        let mut seen_split = false;
        for r in remedies::applicable(&w, &base) {
            // one max_split_size setting is enough for a search table
            if r.kind == RemedyKind::MaxSplitSize {
                if seen_split {
                    continue;
                }
                seen_split = true;
            }
            candidates.push((r.name, r.change, r.overrides));
        }
    }
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(candidates.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("fit {msg} [{bar:30}] {pos}/{len}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b
    });
    let mut rows = Vec::new();
    for (name, change, o) in candidates {
        if let Some(b) = &bar {
            b.set_message(name.clone());
        }
        let mut runs = 0;
        let max = remedies::max_fitting(
            &args.workload,
            &o,
            &param,
            start,
            args.max,
            &opts,
            &mut runs,
        )?;
        let (pa, pr) = match max {
            Some(v) => {
                let r = remedies::run_with(&args.workload, &o.with_param(&param, v), &opts)?;
                (Some(r.peak.peak_allocated), Some(r.peak.peak_reserved))
            }
            None => (None, None),
        };
        rows.push(Row {
            name,
            change,
            max_fitting: max,
            peak_allocated: pa,
            peak_reserved: pr,
            runs,
        });
        if let Some(b) = &bar {
            b.inc(1);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let cap = opts
        .capacity
        .or(w.capacity)
        .unwrap_or(crate::runner::DEFAULT_CAPACITY);
    if args.json {
        let v = json!({
            "workload": args.workload.display().to_string(),
            "param": param,
            "value_in_workload": start,
            "capacity": cap,
            "max": args.max,
            "results": rows.iter().map(|r| json!({
                "remedy": r.name,
                "change": r.change,
                "max_fitting": r.max_fitting,
                "peak_allocated": r.peak_allocated,
                "peak_reserved": r.peak_reserved,
                "runs": r.runs,
            })).collect::<Vec<_>>(),
        });
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
        return Ok(Outcome::Ok);
    }
    writeln!(
        out,
        "{}: the largest {param} that fits in {} (the workload has {param} = {start}; searched 1 \
         to {}):",
        args.workload.display(),
        format_bytes(cap),
        args.max
    )?;
    let mut t = crate::report::style::table();
    t.set_header(vec![
        "remedy".to_string(),
        format!("max {param}"),
        "peak allocated".into(),
        "peak reserved".into(),
        "runs".into(),
        "change".into(),
    ]);
    for r in &rows {
        t.add_row(vec![
            r.name.clone(),
            r.max_fitting
                .map(|v| {
                    if v >= args.max {
                        format!("{v} (the --max)")
                    } else {
                        v.to_string()
                    }
                })
                .unwrap_or_else(|| "none fits".into()),
            r.peak_allocated.map(format_bytes).unwrap_or("-".into()),
            r.peak_reserved.map(format_bytes).unwrap_or("-".into()),
            r.runs.to_string(),
            r.change.clone(),
        ]);
    }
    for i in 1..5 {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    writeln!(out, "{t}")?;
    Ok(Outcome::Ok)
}
