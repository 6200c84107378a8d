//! `gpumem run WORKLOAD.toml`: run a workload on the simulated device and report its memory:
//! per iteration, at the peak, leaks, fragmentation, and for an out-of-memory its diagnosis
//! with the remedies tried.

use std::io::{IsTerminal, Write};

use crate::analysis::findings::{self, RunRecord};
use crate::analysis::record::RemedyTier;
use crate::analysis::verdict::{self, FitVerdict, Inputs};
use crate::cli::{FailOn, ReportKind, RunArgs};
use crate::commands::{load_workload, write_atomic, Outcome};
use crate::error::{Error, Result};
use crate::report;
use crate::runner::remedies;
use crate::runner::{run_on, RunOptions, Target};
use crate::units::parse_capacity;

/// Points of the timeline kept for the picture.
const PLOT_SAMPLES: usize = 300;

pub fn run(args: &RunArgs, out: &mut dyn Write) -> Result<Outcome> {
    let workload = &args.target.path();
    for (flag, file) in [
        ("--snapshot", &args.snapshot),
        ("--plot", &args.plot),
        ("--save-grads", &args.save_grads),
    ] {
        if let Some(f) = file {
            super::refuse_output_over_input(flag, f, &[workload])?;
        }
    }
    if let Some(p) = &args.plot {
        super::refuse_non_svg("--plot", p)?;
    }
    let capacity = match &args.capacity {
        Some(s) => Some(parse_capacity(s).map_err(|m| Error::usage("--capacity", m))?),
        None => None,
    };
    super::check_iterations(args.iterations)?;
    let overrides = super::model_overrides(
        workload,
        &args.model,
        &args.params,
        args.alloc_conf.as_deref(),
        &["batch", "seq"],
    )?;
    let w = load_workload(workload, &overrides)?;
    let device = match args.device.as_deref() {
        // an unknown name is refused before the workload runs (the device opens with the run)
        Some(d) if !crate::backend::DEVICES.iter().any(|(n, _)| *n == d) => {
            return Err(Error::usage(
                "--device",
                format!("unknown device '{d}': expected sim, cpu, cuda or cuda-memory"),
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
        deadline: None,
        fast_forward: false,
        capacity,
        iterations: args.iterations,
        device: None,
    };
    let target = Target {
        device,
        capture_grads: args.save_grads.is_some(),
    };
    let r = run_on(&w, workload, &opts, &target, &mut |done, _| {
        if let Some(b) = &bar {
            b.set_position(done as u64);
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let r = r?;
    let path = workload.display().to_string();
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
    let mut tried = None;
    let mut oom = found.oom.clone();
    if let Some(d) = &mut oom {
        let spinner = tty.then(|| {
            let s = indicatif::ProgressBar::new_spinner();
            s.enable_steady_tick(std::time::Duration::from_millis(120));
            s
        });
        let progress = |name: &str| {
            if let Some(s) = &spinner {
                s.set_message(format!("out of memory: trying {name}"));
            }
        };
        // (out of memory while the model was built, before any step)
        let building = remedies::building_ran_out(&w, &r);
        // the re-runs that settle the verdict, side by side: the allocator settings (all
        // remedies unless --no-remedies) and the run on an unbounded device
        let (t, needs) = rayon::join(
            || {
                if args.no_remedies {
                    progress("allocator settings");
                    remedies::try_allocator_settings(workload, &w, &overrides, &opts)
                } else {
                    remedies::try_all(workload, &w, &overrides, &opts, building, &progress)
                }
            },
            || remedies::needs(workload, &overrides, &opts),
        );
        if let Some(s) = spinner {
            s.finish_and_clear();
        }
        let settings_tried = remedies::allocator_setting_fits(&t).is_some();
        let fitting_setting = t
            .iter()
            .find(|x| x.fits && x.kind.tier() == RemedyTier::AllocatorSetting)
            .map(|x| x.name.clone());
        crate::analysis::oom::confirm(
            d,
            settings_tried,
            fitting_setting.as_deref(),
            needs.map(|n| n.peak_reserved),
            needs.map(|n| n.built).filter(|_| building),
        );
        tried = Some(t);
    }
    let mut verdict = run_verdict(&r, oom.as_ref(), tried.as_deref(), !args.no_remedies);
    // a failure asked for is said on the line that opens the report (-q prints it alone)
    if args.fail_on.contains(&FailOn::Leak) {
        verdict
            .line
            .push_str(&crate::report::findings::fail_on_leak_note(&found.leaks));
    }
    // a generation's context against the cache's growth and the model's trained length
    let kv = w.preset.as_ref().and_then(|p| p.kv_cache.clone());
    let context_tokens = kv.as_ref().map(|k| {
        let new = w
            .integer_params()
            .iter()
            .find(|(n, _)| n == "new_tokens")
            .map_or(0, |x| x.1.max(0) as u64);
        k.prompt + new
    });
    let mut warnings = Vec::new();
    if let (Some(k), Some(t)) = (&kv, context_tokens) {
        // (the model is fed the prompt and each generated token but the last)
        let fed = t.saturating_sub(1);
        if let Some(m) = k.max_positions.filter(|m| fed > *m) {
            warnings.push(format!(
                "the generation feeds the model {} positions, past its max_position_embeddings \
                 of {} (its quality there is not what it was trained for)",
                crate::units::group_digits(fed),
                crate::units::group_digits(m)
            ));
        }
    }
    // a training or inference sequence past the context the model was trained for (RoPE
    // runs it; the model was not trained there)
    if let Some(p) = w.preset.as_ref().filter(|p| p.kv_cache.is_none()) {
        let seq = p.ints.iter().find(|(k, _)| k == "seq").map(|x| x.1);
        if let (Some(seq), Some(m)) = (seq, p.max_positions) {
            if seq > m {
                warnings.push(format!(
                    "seq {} is past the model's max_position_embeddings of {} (RoPE runs it, \
                     but the model was not trained on contexts that long)",
                    crate::units::group_digits(seq),
                    crate::units::group_digits(m)
                ));
            }
        }
    }
    // a combination modelled from PyTorch's source but not yet checked against a recording
    warnings.extend(w.preset.as_ref().and_then(|p| p.unrecorded_line()));
    for wn in &warnings {
        eprintln!("gpumem: warning: {wn}");
    }
    // (a file asked for is written whatever is printed: -q and --by too)
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
    if args.quiet {
        writeln!(out, "{}", verdict.line)?;
        return Ok(fail(args, &r, &found));
    }
    let profile = profile_of(args, &r)?;
    if let (Some(p), false) = (&profile, args.json) {
        // the table asked for, after the verdict, instead of the report
        writeln!(out, "{}", report::verdict::line(&verdict))?;
        writeln!(out)?;
        report::profile::write_text(out, p, args.top)?;
        return Ok(fail(args, &r, &found));
    }
    // with --no-remedies only the allocator settings ran: they settle the verdict, no table
    let remedies_shown = if args.no_remedies {
        None
    } else {
        tried.as_deref()
    };
    if args.json {
        let mut v = report::run::to_json(&path, &r);
        v["schema"] = serde_json::json!(super::mcp::schema::RUN);
        v["leaks"] = report::findings::leaks_json(&found.leaks);
        v["leak_check"] = serde_json::json!({
            "iterations": found.leaks.iterations,
            "checked": found.leaks.checked,
            "note": found.leaks.note,
        });
        v["fragmentation"] = report::findings::fragmentation_json(&found);
        v["verdict"] = serde_json::to_value(&verdict).unwrap_or_default();
        v["warnings"] = serde_json::json!(warnings);
        if let Some(p) = &profile {
            v["profile"] = report::profile::to_json(p);
        }
        if let (Some(k), Some(t)) = (&kv, context_tokens) {
            let mut j = serde_json::to_value(k).unwrap_or_default();
            j["context_tokens"] = serde_json::json!(t);
            j["bytes_at_end"] = serde_json::json!(k.bytes_at(t));
            v["kv_cache"] = j;
        }
        if let (Some(o), Some(d)) = (&r.oom, &oom) {
            let mut j = report::findings::oom_json(d, remedies_shown);
            // (with --no-remedies the allocator settings still ran: the smallest that fit is
            // the verdict's, in the JSON as in the text)
            j["smallest_fitting_remedy"] = serde_json::json!(tried
                .as_deref()
                .and_then(|t| t.iter().find(|x| x.fits))
                .map(|x| &x.name));
            j["message"] = serde_json::json!(o.error.to_string());
            j["line"] = serde_json::json!(o.line);
            j["column"] = serde_json::json!(o.column);
            j["iteration"] = serde_json::json!(o.iteration);
            v["oom"] = j;
        }
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{}", report::verdict::line(&verdict))?;
        report::run::write_text(
            out,
            &path,
            &r,
            verdict.oom_at.as_deref(),
            w.preset.as_ref().and_then(|p| p.assumptions.as_deref()),
        )?;
        if let (Some(k), Some(t)) = (&kv, context_tokens) {
            writeln!(
                out,
                "{}",
                report::style::wrap(&report::run::kv_cache_line(k, t))
            )?;
        }
        if let Some(d) = &oom {
            writeln!(out)?;
            report::findings::write_oom(out, d, remedies_shown)?;
        }
        writeln!(out)?;
        report::findings::write_leaks(out, &found.leaks, wants(ReportKind::Leaks))?;
        if wants(ReportKind::Fragmentation) {
            writeln!(out)?;
            report::findings::write_fragmentation_report(out, &found)?;
        }
        writeln!(out)?;
        report::run::write_final_state(out, &r, args.torch_style)?;
    }
    Ok(fail(args, &r, &found))
}

/// The profiler's table of the run's trace, when `--by` asks for it.
fn profile_of(
    args: &RunArgs,
    r: &crate::runner::RunOutcome,
) -> Result<Option<crate::analysis::profile::Profile>> {
    use crate::analysis::profile::{profile, ProfileInput};
    let Some(by) = args.by else {
        return Ok(None);
    };
    if args.top == 0 {
        return Err(Error::usage("--top", "must be at least 1"));
    }
    let a = &r.allocator;
    let segments = a.snapshot();
    let events: Vec<crate::trace::Event> = a.recorder().ring.iter().copied().collect();
    let library = Default::default();
    let input = ProfileInput {
        segments: &segments,
        events: &events,
        times: &[],
        tags: &a.recorder().tags,
        conf: a.conf(),
        annotations: &[],
        frames: false,
        library: &library,
        entry_meta: &[],
        meta_strings: None,
    };
    profile(
        &input,
        by.analysis(),
        crate::cli::ProfileSort::analysis(args.sort),
    )
    .map(Some)
    .map_err(|m| Error::usage("--by", m))
}

/// Exit 1 for a finding named in `--fail-on`.
fn fail(args: &RunArgs, r: &crate::runner::RunOutcome, found: &findings::Findings) -> Outcome {
    let fail = (args.fail_on.contains(&FailOn::Oom) && r.oom.is_some())
        || (args.fail_on.contains(&FailOn::Leak) && !found.leaks.leaks.is_empty());
    if fail {
        Outcome::Finding
    } else {
        Outcome::Ok
    }
}

/// The verdict of a run, with its out-of-memory settled by re-runs.
fn run_verdict(
    r: &crate::runner::RunOutcome,
    oom: Option<&crate::analysis::oom::OomDiagnosis>,
    tried: Option<&[remedies::Tried]>,
    remedies_tried: bool,
) -> FitVerdict {
    let context = r.context();
    verdict::verdict(&Inputs {
        capacity: r.capacity,
        usable: oom
            .map(|d| d.usable)
            .unwrap_or(r.capacity.saturating_sub(context)),
        peak_reserved: r.peak.peak_reserved,
        context,
        oom: r.oom.is_some(),
        needs_reserved: oom.and_then(|d| d.needs_reserved),
        model_alone: oom.and_then(|d| d.model_alone),
        cause: oom.filter(|d| d.confirmed).map(|d| d.verdict),
        oom_at: match (&r.oom, oom) {
            (Some(o), Some(d)) => Some(crate::analysis::oom::oom_place(
                &d.site,
                o.iteration,
                o.tokens,
                o.line,
                r.script_lines,
            )),
            _ => None,
        },
        smallest_fix: tried.and_then(|t| t.iter().find(|x| x.fits).map(|x| x.name.clone())),
        world_above_one: r.ranks.map(|(_, n)| n).filter(|&n| n > 1),
        remedies_tried,
    })
}
