//! `gpumem run WORKLOAD.toml`: run a workload on the simulated device and report its memory:
//! per iteration, at the peak, leaks, fragmentation, and for an out-of-memory its diagnosis
//! with the remedies tried.

use std::io::{IsTerminal, Write};

use crate::analysis::findings::{self, RunRecord};
use crate::cli::{FailOn, ReportKind, RunArgs};
use crate::commands::{load_workload, parse_overrides, write_atomic, Outcome};
use crate::error::{Error, Result};
use crate::report;
use crate::runner::remedies;
use crate::runner::{run_on, RunOptions, Target};
use crate::units::parse_capacity;

/// Points of the timeline kept for the picture.
const PLOT_SAMPLES: usize = 300;

pub fn run(args: &RunArgs, out: &mut dyn Write) -> Result<Outcome> {
    let capacity = match &args.capacity {
        Some(s) => Some(parse_capacity(s).map_err(|m| Error::usage("--capacity", m))?),
        None => None,
    };
    super::check_iterations(args.iterations)?;
    let mut params = args.params.clone();
    for (k, flag, v) in [
        ("batch", "--batch", args.batch),
        ("seq", "--seq", args.seq),
        ("new_tokens", "--new-tokens", args.new_tokens),
    ] {
        if let Some(v) = v {
            // checked here so that the message names the flag typed, not `--param`
            if v == 0 {
                return Err(Error::usage(flag, "must be at least 1"));
            }
            if let Some(why) = crate::workload::limits::exceeded(k, v) {
                return Err(Error::usage(flag, format!("must be at most {why}")));
            }
            if i64::try_from(v).is_err() {
                return Err(Error::usage(flag, format!("must be at most {}", i64::MAX)));
            }
            params.push(format!("{k}={v}"));
        }
    }
    if args.lora_r == Some(0) {
        return Err(Error::usage("--lora-r", "the LoRA rank must be at least 1"));
    }
    if let Some(p) = args.lora_dropout {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::usage(
                "--lora-dropout",
                format!("must be at least 0 and below 1, found {p}"),
            ));
        }
    }
    if crate::workload::is_config(&args.workload) {
        let given = |k: &str| params.iter().any(|p| p.split('=').next() == Some(k));
        for (k, flag) in [("batch", "--batch"), ("seq", "--seq")] {
            if !given(k) {
                return Err(Error::usage(
                    flag,
                    format!(
                        "{} is a Hugging Face config: give the batch size and the tokens per \
                         sample, e.g. gpumem run {} --batch 4 --seq 1024 (or write a workload \
                         with [model] hf_config = ... and [train])",
                        args.workload.display(),
                        args.workload.display()
                    ),
                ));
            }
        }
    }
    let mut overrides = parse_overrides(&params, args.alloc_conf.as_deref())?;
    config_flags(args, &mut overrides)?;
    let w = load_workload(&args.workload, &overrides)?;
    let device = match args.device.as_deref() {
        // an unknown name is refused before the workload runs (the device opens with the run)
        Some(d) if !crate::backend::DEVICES.iter().any(|(n, _)| *n == d) => {
            return Err(Error::usage(
                "--device",
                format!("unknown device '{d}': expected sim, cpu or cuda"),
            ));
        }
        Some(d) => Some(d.to_string()),
        None => None,
    };
    let tty = std::io::stderr().is_terminal();
    // a progress bar on stderr, only for a person watching
    let bar = tty.then(|| {
        let b = indicatif::ProgressBar::new(args.iterations.unwrap_or(w.iterations) as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} iterations")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b.set_message(w.name.clone());
        b
    });
    let opts = RunOptions {
        capacity,
        iterations: args.iterations,
        device: None,
    };
    let target = Target {
        device,
        capture_grads: args.save_grads.is_some(),
    };
    let r = run_on(&w, &args.workload, &opts, &target, &mut |done, _| {
        if let Some(b) = &bar {
            b.set_position(done as u64);
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let r = r?;
    let path = args.workload.display().to_string();
    if let Some(file) = &args.save_grads {
        if r.device == "sim" {
            return Err(Error::usage(
                "--save-grads",
                "the simulated device has no values: add --device cpu",
            ));
        }
        write_atomic(file, &report::tensors::safetensors(&r.grads)?)?;
    }
    if let Some(snap) = &args.snapshot {
        let v = report::snapshot::to_json(&r.allocator, &path, &r.name);
        let bytes = serde_json::to_vec(&v).map_err(std::io::Error::from)?;
        write_atomic(snap, &bytes)?;
    }
    let wants = |k: ReportKind| args.report.contains(&k) || args.report.contains(&ReportKind::All);
    let past_states = args.json || args.plot.is_some() || wants(ReportKind::Fragmentation);
    let found = findings::analyze(
        &RunRecord {
            allocator: &r.allocator,
            title: &r.name,
            iteration_ends: &r.iteration_ends,
            oom: r.oom.as_ref().map(|o| &o.error),
        },
        PLOT_SAMPLES,
        past_states,
    );
    let tried = match (&r.oom, args.no_remedies) {
        (Some(_), false) => {
            let spinner = tty.then(|| {
                let s = indicatif::ProgressBar::new_spinner();
                s.enable_steady_tick(std::time::Duration::from_millis(120));
                s
            });
            let t = remedies::try_all(&args.workload, &w, &overrides, &opts, &mut |name| {
                if let Some(s) = &spinner {
                    s.set_message(format!("out of memory: trying {name}"));
                }
            });
            if let Some(s) = spinner {
                s.finish_and_clear();
            }
            Some(t)
        }
        _ => None,
    };
    if let Some(svg_path) = &args.plot {
        let Some(t) = &found.timeline else {
            return Err(Error::usage(
                "--plot",
                format!(
                    "no timeline to draw: {}",
                    found.replay_note.as_deref().unwrap_or("the trace is empty")
                ),
            ));
        };
        write_atomic(svg_path, report::timeline_svg::render(t).as_bytes())?;
    }
    if args.json {
        let mut v = report::run::to_json(&path, &r);
        v["leaks"] = report::findings::leaks_json(&found.leaks);
        v["leak_check"] = serde_json::json!({
            "iterations": found.leaks.iterations,
            "checked": found.leaks.checked,
            "note": found.leaks.note,
        });
        v["fragmentation"] = report::findings::fragmentation_json(&found);
        if let (Some(o), Some(d)) = (&r.oom, &found.oom) {
            let mut j = report::findings::oom_json(d, tried.as_deref());
            j["message"] = serde_json::json!(o.error.to_string());
            j["line"] = serde_json::json!(o.line);
            j["column"] = serde_json::json!(o.column);
            j["iteration"] = serde_json::json!(o.iteration);
            v["oom"] = j;
        }
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        report::run::write_text(out, &path, &r, args.torch_style)?;
        writeln!(out)?;
        report::findings::write_leaks(out, &found.leaks, wants(ReportKind::Leaks))?;
        if wants(ReportKind::Fragmentation) {
            writeln!(out)?;
            report::findings::write_fragmentation_report(out, &found)?;
        }
        if let Some(d) = &found.oom {
            writeln!(out)?;
            report::findings::write_oom(out, d, tried.as_deref())?;
        }
    }
    let fail = (args.fail_on.contains(&FailOn::Oom) && r.oom.is_some())
        || (args.fail_on.contains(&FailOn::Leak) && !found.leaks.leaks.is_empty());
    Ok(if fail { Outcome::Finding } else { Outcome::Ok })
}

/// The flags that set a bare config's `[model]`, `[model.lora]` and `[train]` keys; with a
/// workload file they are a usage error (its tables hold them).
fn config_flags(args: &RunArgs, o: &mut crate::workload::Overrides) -> Result<()> {
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    let mut model = Vec::new();
    let mut train = Vec::new();
    let mut lora = Vec::new();
    let mut given: Vec<&str> = Vec::new();
    for (flag, key, v, to) in [
        ("--optimizer", "optimizer", &args.optimizer, 't'),
        ("--precision", "precision", &args.precision, 't'),
        ("--mode", "mode", &args.mode, 't'),
        ("--dtype", "dtype", &args.dtype, 'm'),
        ("--attention", "attention", &args.attention, 'm'),
    ] {
        if let Some(v) = v {
            given.push(flag);
            let line = (key.to_string(), q(v));
            if to == 't' {
                train.push(line);
            } else {
                model.push(line);
            }
        }
    }
    if args.gradient_checkpointing {
        given.push("--gradient-checkpointing");
        model.push(("gradient_checkpointing".into(), "true".into()));
    }
    if let Some(r) = args.lora_r {
        given.push("--lora-r");
        lora.push(("r".into(), r.to_string()));
        if let Some(a) = args.lora_alpha {
            lora.push(("alpha".into(), toml::Value::Float(a).to_string()));
        }
        if let Some(p) = args.lora_dropout {
            lora.push(("dropout".into(), toml::Value::Float(p).to_string()));
        }
        if let Some(t) = &args.lora_targets {
            let names: Vec<toml::Value> = t
                .split(',')
                .map(|n| toml::Value::String(n.trim().to_string()))
                .collect();
            lora.push((
                "target_modules".into(),
                toml::Value::Array(names).to_string(),
            ));
        }
    }
    if given.is_empty() {
        return Ok(());
    }
    if !crate::workload::is_config(&args.workload) {
        return Err(Error::usage(
            given[0],
            format!(
                "{} sets a bare Hugging Face config's key; {} is a workload file: set it in its [model] or [train] table",
                given[0],
                args.workload.display()
            ),
        ));
    }
    o.hf_model = model;
    o.hf_lora = lora;
    o.hf_train = train;
    Ok(())
}
