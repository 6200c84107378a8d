//! `gpumem compare-torch MODELS.json`: runs every case of a reference_models.py result file
//! (../shared/groundtruth/models/models.json, or one `case_NAME.json`) as a `[model]`/`[train]`
//! preset, or of an hf_models.py one (`hf_NAME.json`) as a Hugging Face config, and compares
//! gpumem's per-iteration figures with PyTorch's, case by case; beside them the estimates
//! other tools made of the same cases (accelerate's, recorded in the case; MemTracker's, in an
//! `mt_NAME.json` beside it).

use std::io::Write;
use std::path::Path;

use serde_json::Value;

use crate::cli::CompareTorchArgs;
use crate::commands::Outcome;
use crate::error::{Error, Result};
use crate::report::compare_torch::{write_text, CaseRow, Estimate, FieldDiff};
use crate::runner::{run, RunOptions};
use crate::units::{parse_capacity, MIB};
use crate::workload;

/// The fields reference_models.py records per iteration, in its order.
pub const FIELDS: [&str; 9] = [
    "start",
    "after_forward",
    "after_backward",
    "after_step",
    "after_generate",
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

/// The families hf_models.py builds with transformers; any other is a torchvision model.
const HF_FAMILIES: &[&str] = &["llama", "qwen2", "mistral", "gpt2", "bert"];

/// The optimizer hf_models.py's `make_opt` builds for a case's `opt`: SGD with momentum or
/// AdamW (foreach); any other name, none.
fn hf_optimizer(config: &Value) -> &'static str {
    match config.get("opt").and_then(Value::as_str) {
        Some("sgd_momentum") => "sgd_momentum",
        Some("adamw") => "adamw",
        _ => "none",
    }
}

/// An hf_models.py case of a torchvision model (`randn(B, 3, 224, 224)` images, 1,000
/// classes). The case keys gpumem does not model for these are refused by name.
fn vision_workload(
    family: &str,
    config: &Value,
    iterations: usize,
) -> std::result::Result<String, String> {
    for key in ["weights", "ckpt", "lora", "no_grad", "generate"] {
        if config
            .get(key)
            .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
        {
            return Err(format!(
                "the case sets '{key}', which gpumem does not model for torchvision models yet"
            ));
        }
    }
    let batch = config
        .get("batch")
        .and_then(Value::as_u64)
        .ok_or("config has no integer 'batch'")?;
    let precision = match config.get("amp").and_then(Value::as_str) {
        None => "fp32",
        Some("bf16") => "bf16-autocast",
        Some(other) => {
            return Err(format!(
                "the case sets amp = \"{other}\": gpumem models bf16 autocast only"
            ))
        }
    };
    Ok(format!(
        "[model]\ntorchvision = {}\n[train]\nbatch = {batch}\niterations = {}\noptimizer = {}\nprecision = \"{precision}\"\n",
        Value::from(family),
        iterations.max(1),
        Value::from(hf_optimizer(config))
    ))
}

/// An hf_models.py case's workload: its config (transformers' class defaults for what the
/// case leaves out) written to `dir`, and the TOML naming it.
fn hf_workload(
    config: &Value,
    iterations: usize,
    dir: &Path,
) -> std::result::Result<String, String> {
    let family = config.get("family").and_then(Value::as_str).unwrap_or("?");
    if !HF_FAMILIES.contains(&family) {
        return vision_workload(family, config, iterations);
    }
    let mut cfg = config
        .get("cfg")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    cfg.insert("model_type".into(), Value::from(family));
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let path = dir.join("config.json");
    std::fs::write(&path, Value::Object(cfg).to_string())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let get = |k: &str| config.get(k);
    let flag = |k: &str| get(k).and_then(Value::as_bool).unwrap_or(false);
    let mut t = "[model]\nhf_config = \"config.json\"\n".to_string();
    if let Some(a) = get("attn").and_then(Value::as_str) {
        t += &format!("attention = {}\n", Value::from(a));
    }
    if get("weights").and_then(Value::as_str) == Some("bf16") {
        t += "dtype = \"bf16\"\n";
    }
    if flag("ckpt") {
        t += "gradient_checkpointing = true\n";
    }
    if flag("lora") {
        // hf_models.py's LoraConfig
        t += "[model.lora]\nr = 16\nalpha = 32\ndropout = 0.05\ntarget_modules = [\"q_proj\", \"v_proj\"]\n";
    }
    let int = |k: &str| {
        get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("config has no integer '{k}'"))
    };
    t += &format!(
        "[train]\nbatch = {}\nseq = {}\niterations = {}\noptimizer = {}\n",
        int("batch")?,
        int("seq")?,
        iterations.max(1),
        Value::from(hf_optimizer(config))
    );
    if get("amp").and_then(Value::as_str) == Some("bf16") {
        t += "precision = \"bf16-autocast\"\n";
    }
    if get("generate").is_some() {
        // hf_models.py's generate(max_new_tokens=N, min_new_tokens=N, pad_token_id=0)
        t += &format!(
            "mode = \"generate\"\n[generate]\nnew_tokens = {}\npad_token_id = 0\n",
            int("generate")?
        );
    } else if flag("no_grad") {
        t += "mode = \"inference\"\n";
    }
    Ok(t)
}

/// Other tools' estimates recorded for a case: accelerate's training estimate (the largest
/// of its figures, what `accelerate estimate-memory` prints as the peak) and MemTracker's peak
/// (`mt_NAME.json` beside the case file).
fn estimates(case: &Value, name: &str, path: &Path) -> Vec<Estimate> {
    let mut out = Vec::new();
    if let Some(t) = case
        .pointer("/accelerate_estimate/training")
        .and_then(Value::as_object)
    {
        if let Some(peak) = t.values().filter_map(Value::as_u64).max() {
            out.push(Estimate {
                tool: "accelerate".into(),
                peak,
            });
        }
    }
    let mt = path.with_file_name(format!("mt_{name}.json"));
    if let Some(peak) = std::fs::read_to_string(mt)
        .ok()
        .and_then(|s| serde_json::from_str::<Value>(&s).ok())
        .and_then(|v| v.get("peak_total").and_then(Value::as_u64))
    {
        out.push(Estimate {
            tool: "MemTracker".into(),
            peak,
        });
    }
    out
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
    let peak = |f: &str| {
        theirs
            .iter()
            .filter_map(|t| t.get(f).and_then(Value::as_u64))
            .max()
    };
    let mut row = CaseRow {
        name: name.clone(),
        estimates: estimates(case, &name, path),
        pytorch_peaks: (peak("peak_allocated"), peak("peak_reserved")),
        ..CaseRow::default()
    };
    if let Some(e) = case.get("error").and_then(Value::as_str) {
        row.not_modelled = Some(format!("PyTorch's run failed: {e}"));
        return row;
    }
    let config = case.get("config").cloned().unwrap_or(Value::Null);
    // a Hugging Face case's config goes in a folder of its own, removed after the run: made
    // with a random name and private, never from the case's name (a file's data)
    let scratch_dir = match tempfile::Builder::new().prefix("gpumem-compare-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            row.not_modelled = Some(format!("cannot make a temporary folder: {e}"));
            return row;
        }
    };
    let scratch = scratch_dir.path().to_path_buf();
    let hf = config.get("family").is_some();
    let made = if hf {
        hf_workload(&config, theirs.len(), &scratch)
    } else {
        preset_for(&name, &config, theirs.len())
    };
    // messages name the case's config, not the scratch copy
    let shown = scratch.join("config.json").display().to_string();
    let plain = |e: String| e.replace(&shown, "its config");
    let text = match made {
        Ok(t) => t,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&scratch);
            row.not_modelled = Some(plain(e));
            return row;
        }
    };
    let wpath = if hf {
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        scratch.join(format!("{safe}.toml"))
    } else {
        Path::new(&format!("{name} (preset)")).to_path_buf()
    };
    let parsed = workload::parse(&text, &wpath);
    let _ = std::fs::remove_dir_all(&scratch);
    let w = match parsed {
        Ok(w) => w,
        Err(e) => {
            row.not_modelled = Some(plain(e.to_string()));
            return row;
        }
    };
    let opts = RunOptions {
        deadline: None,
        fast_forward: false,
        capacity,
        iterations: None,
        device: None,
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
        Some(s) => Some(parse_capacity(s).map_err(|m| Error::usage("--capacity", m))?),
        None => None,
    };
    let mut cases: Vec<(Value, &Path)> = Vec::new();
    for path in &args.models {
        let text = crate::input::read_text(path, crate::input::Kind::Text).map_err(|source| {
            Error::Read {
                path: path.clone(),
                source,
            }
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
