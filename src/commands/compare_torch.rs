//! `gpumem compare-torch MODELS.json`: runs every case of a reference_models.py result file
//! (../shared/groundtruth/models/models.json, or one `case_NAME.json`) as a `[model]`/`[train]`
//! preset and compares gpumem's per-iteration figures with PyTorch's, case by case.

use std::io::Write;
use std::path::Path;

use serde_json::Value;

use crate::cli::CompareTorchArgs;
use crate::commands::Outcome;
use crate::error::{Error, Result};
use crate::report::compare_torch::{write_text, CaseRow, FieldDiff};
use crate::runner::{run, RunOptions};
use crate::units::{parse_size, MIB};
use crate::workload;

/// The fields reference_models.py records per iteration, in its order.
pub const FIELDS: [&str; 8] = [
    "start",
    "after_forward",
    "after_backward",
    "after_step",
    "end",
    "peak_allocated",
    "peak_reserved",
    "reserved_end",
];

/// Allocated-bytes fields must be within 0.1%; reserved ones within 1% or 2 MiB, whichever is
/// larger (issue 4's tolerances).
pub fn within_tolerance(field: &str, ours: u64, theirs: u64) -> bool {
    let diff = ours.abs_diff(theirs) as f64;
    if field.contains("reserved") {
        diff <= (theirs as f64 * 0.01).max(2.0 * MIB as f64)
    } else {
        diff <= theirs as f64 * 0.001
    }
}

/// The preset (TOML text) for one case's `config`, or why it has none.
pub fn preset_for(
    name: &str,
    config: &Value,
    iterations: usize,
) -> std::result::Result<String, String> {
    let get = |k: &str| config.get(k);
    let int = |k: &str| -> std::result::Result<u64, String> {
        get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("config has no integer '{k}'"))
    };
    let flag = |k: &str| get(k).and_then(Value::as_bool).unwrap_or(false);
    let mut t = format!("[workload]\nname = {}\n\n[model]\n", Value::from(name));
    match get("model").and_then(Value::as_str) {
        Some("mlp") => {
            t += &format!(
                "kind = \"mlp\"\nd_in = {}\nhidden = {}\nlayers = {}\nd_out = {}\n",
                int("d_in")?,
                int("hidden")?,
                int("layers")?,
                int("d_out")?
            );
        }
        Some("gpt") => {
            let attn = get("attn").and_then(Value::as_str).unwrap_or("math");
            t += &format!(
                "kind = \"gpt\"\nvocab = {}\nseq = {}\nd_model = {}\nheads = {}\nlayers = {}\n\
                 attention = {}\n",
                int("vocab")?,
                int("seq")?,
                int("d")?,
                int("h")?,
                int("L")?,
                Value::from(attn)
            );
        }
        other => return Err(format!("unknown model {other:?} in config")),
    }
    let opt = get("opt").and_then(Value::as_str).unwrap_or("none");
    t += &format!(
        "\n[train]\nbatch = {}\niterations = {}\noptimizer = {}\n",
        int("batch")?,
        iterations.max(1),
        Value::from(opt)
    );
    if get("amp").and_then(Value::as_str) == Some("bf16") {
        t += "precision = \"bf16-autocast\"\n";
    }
    if flag("ckpt") {
        t += "checkpointing = true\n";
    }
    if let Some(a) = get("accum").and_then(Value::as_u64) {
        t += &format!("grad_accum = {a}\n");
    }
    if flag("no_grad") {
        t += "mode = \"inference\"\n";
    } else if flag("eval_leak") {
        t += "mode = \"eval-with-graph\"\nkeep_loss = \"tensor\"\n";
    } else if flag("leak") {
        t += "keep_loss = \"tensor\"\n";
    }
    if flag("retain") {
        t += "retain_graph = true\n";
    }
    Ok(t)
}

fn compare_case(case: &Value, path: &Path, capacity: Option<u64>) -> CaseRow {
    let name = case
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string();
    let theirs = case
        .get("iterations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut row = CaseRow {
        name: name.clone(),
        ..CaseRow::default()
    };
    if let Some(e) = case.get("error").and_then(Value::as_str) {
        row.not_modelled = Some(format!("PyTorch's run failed: {e}"));
        return row;
    }
    let config = case.get("config").cloned().unwrap_or(Value::Null);
    let text = match preset_for(&name, &config, theirs.len()) {
        Ok(t) => t,
        Err(e) => {
            row.not_modelled = Some(e);
            return row;
        }
    };
    let w = match workload::parse(&text, Path::new(&format!("{name} (preset)"))) {
        Ok(w) => w,
        Err(e) => {
            row.not_modelled = Some(e.to_string());
            return row;
        }
    };
    let opts = RunOptions {
        capacity,
        iterations: None,
    };
    let outcome = match run(&w, path, &opts) {
        Ok(o) => o,
        Err(e) => {
            row.not_modelled = Some(e.to_string());
            return row;
        }
    };
    if let Some(oom) = &outcome.oom {
        row.not_modelled = Some(format!("gpumem ran out of memory: {}", oom.error));
        return row;
    }
    let ours = serde_json::to_value(&outcome.iterations).unwrap_or(Value::Null);
    let ours = ours.as_array().cloned().unwrap_or_default();
    for (i, t) in theirs.iter().enumerate() {
        for f in FIELDS {
            let Some(tv) = t.get(f).and_then(Value::as_u64) else {
                continue;
            };
            let ov = ours.get(i).and_then(|o| o.get(f)).and_then(Value::as_u64);
            row.fields.push(FieldDiff {
                iteration: i,
                field: f.to_string(),
                pytorch: tv,
                gpumem: ov,
                within_tolerance: ov.is_some_and(|o| within_tolerance(f, o, tv)),
            });
        }
    }
    row
}

pub fn run_cmd(args: &CompareTorchArgs, out: &mut dyn Write) -> Result<Outcome> {
    let capacity = match &args.capacity {
        Some(s) => Some(parse_size(s).map_err(|m| Error::usage("--capacity", m))?),
        None => None,
    };
    if capacity == Some(0) {
        return Err(Error::usage("--capacity", "must be more than 0 bytes"));
    }
    let mut cases: Vec<(Value, &Path)> = Vec::new();
    for path in &args.models {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.clone(),
            source,
        })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            Error::input(
                path,
                format!("line {} column {}", e.line(), e.column()),
                format!("not JSON: {e}"),
            )
        })?;
        let Some(list) = v.get("cases").and_then(Value::as_array) else {
            return Err(Error::input(
                path,
                "top level",
                "expected an object with a \"cases\" list (the file reference_models.py writes)",
            ));
        };
        cases.extend(list.iter().map(|c| (c.clone(), path.as_path())));
    }
    let name_of = |c: &Value| c.get("name").and_then(Value::as_str).map(str::to_string);
    for wanted in &args.case {
        if !cases
            .iter()
            .any(|(c, _)| name_of(c).as_deref() == Some(wanted))
        {
            return Err(Error::usage(
                "--case",
                format!(
                    "no case '{wanted}' in the files given (they have: {})",
                    cases
                        .iter()
                        .filter_map(|(c, _)| name_of(c))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    let selected: Vec<&(Value, &Path)> = cases
        .iter()
        .filter(|(c, _)| args.case.is_empty() || name_of(c).is_some_and(|n| args.case.contains(&n)))
        .collect();
    let rows: Vec<CaseRow> = selected
        .iter()
        .map(|(c, path)| compare_case(c, path, capacity))
        .collect();
    if args.json {
        let v = serde_json::json!({
            "models": args.models.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "cases": rows,
            "all_within_tolerance": rows.iter().all(CaseRow::passes),
        });
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        write_text(out, &rows)?;
    }
    Ok(if rows.iter().all(CaseRow::passes) {
        Outcome::Ok
    } else {
        Outcome::Finding
    })
}
