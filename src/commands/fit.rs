//! `gpumem fit WORKLOAD --capacity 24GiB`: the largest batch size (or other integer
//! parameter) that fits, alone and under each remedy.

use std::io::{IsTerminal, Write};

use comfy_table::CellAlignment;
use serde_json::json;

use crate::analysis::verdict::{self, FitVerdict, Inputs};
use crate::cli::FitArgs;
use crate::commands::Outcome;
use crate::error::{Error, Result};
use crate::runner::remedies::{self, RemedyKind};
use crate::runner::search;
use crate::runner::RunOptions;
use crate::units::{format_bytes, parse_capacity};
use crate::workload::{self, Overrides};

/// One candidate's search, before it becomes a row.
struct Searched {
    longest: search::Longest,
    runs: u32,
    refused: Option<(i64, String)>,
    /// The answer's peaks (allocated, reserved), where known.
    peaks: Option<(u64, u64)>,
}

struct Row {
    kind: Option<RemedyKind>,
    found: search::Found,
    name: String,
    change: String,
    max_fitting: Option<i64>,
    peak_allocated: Option<u64>,
    peak_reserved: Option<u64>,
    runs: u32,
}

pub fn run(args: &FitArgs, out: &mut dyn Write) -> Result<Outcome> {
    let workload = &args.target.path();
    let capacity = match &args.capacity {
        Some(s) => Some(parse_capacity(s).map_err(|m| Error::usage("--capacity", m))?),
        None => None,
    };
    let max_given = args.max.is_some();
    let args_max = args.max.unwrap_or(1 << 16);
    if args_max < 1 {
        return Err(Error::usage("--max", "must be at least 1"));
    }
    super::check_iterations(args.iterations)?;
    let is_config = workload::is_config(workload);
    // a bare config needs its sequence length unless that is what is searched
    let searched = args.param.as_deref().unwrap_or("batch");
    let required: Vec<&str> = ["seq"].into_iter().filter(|k| *k != searched).collect();
    // a bare config's generation searched: `--param new_tokens` is the question, so the
    // generate mode and a first length are implied rather than asked for
    let mut model = args.model.clone();
    if is_config && searched == "new_tokens" {
        model.mode.get_or_insert_with(|| "generate".into());
        model.new_tokens.get_or_insert(1);
    }
    let mut base = super::model_overrides(workload, &model, &[], None, &required)?;
    if is_config && base.param("batch").is_none() {
        // the search starts from batch 1
        base.params.push(("batch".into(), 1));
    }
    let w = super::load_workload(workload, &base)?;
    let ints = w.integer_params();
    let (param, start) = match &args.param {
        Some(p) => match ints.iter().find(|(n, _)| n == p) {
            Some((n, v)) => (n.clone(), *v),
            None => {
                return Err(Error::usage(
                    "--param",
                    format!(
                        "{} has no integer parameter '{p}' ({})",
                        workload.display(),
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
                    workload.display(),
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
    // a bare config's value of the searched parameter comes from a flag, else the search
    // starts it at 1 (or the generation at 1 token): the workload does not "have" it
    let start_given = !is_config
        || match param.as_str() {
            "batch" => args.model.batch.is_some(),
            "seq" => args.model.seq.is_some(),
            "new_tokens" => args.model.new_tokens.is_some(),
            _ => true,
        };
    // --max below the workload's value: the search is of 1..=max, so it starts from --max
    let mut start_note = None;
    let start = if max_given && args_max < start {
        start_note = Some(format!(
            "the search starts from --max {args_max}, below the workload's {param} = {start}"
        ));
        args_max
    } else {
        start
    };
    let opts = RunOptions {
        deadline: None,
        fast_forward: false,
        capacity,
        iterations: args.iterations,
        device: args.device.clone(),
    };
    let mut candidates: Vec<(String, String, Overrides, Option<RemedyKind>)> = vec![(
        "as written".into(),
        "the workload unchanged".into(),
        base.clone(),
        None,
    )];
    if !args.no_remedies {
        let mut seen_split = false;
        for r in remedies::applicable(Some(workload), &w, &base) {
            // one max_split_size setting is enough for a search table
            if r.kind == RemedyKind::MaxSplitSize {
                if seen_split {
                    continue;
                }
                seen_split = true;
            }
            candidates.push((r.name, r.change, r.overrides, Some(r.kind)));
        }
    }
    // a generation is searched up to the model's trained context, unless --max says more
    let kv = w.preset.as_ref().and_then(|p| p.kv_cache.clone());
    let mut notes = Vec::new();
    let mut limit = args_max;
    let mut kv_note = None;
    notes.extend(start_note);
    notes.extend(w.preset.as_ref().and_then(|p| p.unrecorded_line()));
    if let (Some(k), "new_tokens") = (&kv, param.as_str()) {
        if let Some(m) = k.max_positions {
            let room = m.saturating_sub(k.prompt) as i64;
            if room >= 1 && !max_given {
                limit = room;
                notes.push(format!(
                    "searched up to {} new tokens: the prompt's {} and they reach the model's \
                     max_position_embeddings of {} (--max searches further)",
                    crate::units::group_digits(room as u64),
                    crate::units::group_digits(k.prompt),
                    crate::units::group_digits(m)
                ));
            } else if room < limit {
                notes.push(format!(
                    "values past {} new tokens pass the model's max_position_embeddings of {}",
                    crate::units::group_digits(room.max(0) as u64),
                    crate::units::group_digits(m)
                ));
            }
        }
        // (said of the answer once it is known, below)
        kv_note = Some(notes.len());
        notes.push(crate::report::run::kv_cache_line(
            k,
            k.prompt + start.max(0) as u64,
        ));
    }
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(candidates.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("fit: searching [{bar:30}] {pos}/{len} rows")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b
    });
    // each candidate's search, on its own core (they share nothing): its answer, the runs it
    // took, where gpumem refused a value, and the answer's peaks
    let search = |o: &Overrides| -> Result<Searched> {
        let mut runs = 0;
        let mut refused = None;
        let longest = match (&kv, param.as_str()) {
            (Some(kv), "new_tokens") => {
                search::max_new_tokens(workload, o, start, limit, kv, &opts, args.exact, &mut runs)?
            }
            _ => search::Longest {
                max: search::max_fitting_modelled(
                    workload,
                    o,
                    &param,
                    start,
                    limit,
                    &opts,
                    &mut runs,
                    &mut refused,
                )?,
                found: search::Found::Exact,
                peaks: None,
                estimate: None,
            },
        };
        let peaks = match longest.max {
            // an estimate is not run (that is what it saves)
            Some(_) if longest.found == search::Found::Estimated => None,
            Some(_) if longest.peaks.is_some() => longest.peaks,
            Some(v) => {
                let r = remedies::rerun(workload, &o.with_param(&param, v), &opts)?;
                Some((r.peak.peak_allocated, r.peak.peak_reserved))
            }
            None => None,
        };
        if let Some(b) = &bar {
            b.inc(1);
        }
        Ok(Searched {
            longest,
            runs,
            refused,
            peaks,
        })
    };
    let searched: Vec<Result<Searched>> = {
        use rayon::prelude::*;
        let mut done = Vec::new();
        let mut rest: &[(String, String, Overrides, Option<RemedyKind>)] = &candidates;
        // --quiet prints the verdict alone, which names a remedy only when the workload does
        // not fit as written: the remedies' searches wait for the answer as written
        if args.quiet {
            if let Some((first, others)) = rest.split_first() {
                let r = search(&first.2);
                let fits = r
                    .as_ref()
                    .is_ok_and(|x| x.longest.max.is_some_and(|m| m >= start));
                done.push(r);
                rest = if fits { &[] } else { others };
            }
        }
        done.extend(rest.par_iter().map(|c| search(&c.2)).collect::<Vec<_>>());
        done
    };
    let mut rows = Vec::new();
    for ((name, change, _, kind), got) in candidates.into_iter().zip(searched) {
        let Searched {
            longest:
                search::Longest {
                    max,
                    found,
                    estimate,
                    ..
                },
            runs,
            refused,
            peaks: answer_peaks,
        } = got?;
        if let (search::Found::AtLeast, Some(m), Some(e)) = (found, max, estimate) {
            notes.push(format!(
                "{name}: at least {} new tokens fit (simulated for a few seconds, then \
                 stopped before running out); about {} estimated from the KV cache's growth, \
                 which leaves out the allocator's slack (--exact simulates to the end)",
                crate::units::group_digits(m as u64),
                crate::units::group_digits(e as u64)
            ));
        }
        if let (search::Found::Estimated, Some(m), None) = (found, max, kind) {
            notes.push(format!(
                "about {} new tokens: estimated from the KV cache's growth, not simulated (too \
                 long for a few seconds over {} iterations); it leaves out the allocator's \
                 slack and may be a few percent off: --exact simulates to the boundary, \
                 --iterations 1 gives a proven lower bound in a few seconds",
                crate::units::group_digits(m as u64),
                opts.iterations.unwrap_or(w.iterations)
            ));
        }
        if let Some((v, why)) = refused {
            // past what gpumem models the search stops: the answer is the largest modelled
            // value that fits, and the note says where and why it stopped
            let why = why
                .split(" (gpumem refuses")
                .next()
                .unwrap_or(&why)
                .to_string();
            if max.is_none() && v <= start.max(1) {
                notes.push(format!("{name}: not searched: {why}"));
                continue;
            }
            // (only where the refusal is what ended the search)
            if max.is_some_and(|m| m + 1 == v) {
                notes.push(format!(
                    "{name}: {param} = {} and above not modelled: {why}",
                    crate::units::group_digits(v as u64)
                ));
            }
        }
        let (pa, pr) = (answer_peaks.map(|p| p.0), answer_peaks.map(|p| p.1));
        // every value up to the limit fits: the limit is a floor, not a boundary
        let found = match (found, max) {
            (search::Found::Exact, Some(m)) if m >= limit => search::Found::Limit,
            _ => found,
        };
        rows.push(Row {
            kind,
            found,
            name,
            change,
            max_fitting: max,
            peak_allocated: pa,
            peak_reserved: pr,
            runs,
        });
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    // estimates cannot tell allocator settings apart (they leave out the slack those change)
    if rows.iter().any(|r| {
        r.found == search::Found::Estimated
            && r.kind
                .is_some_and(|k| k.tier() == crate::analysis::record::RemedyTier::AllocatorSetting)
    }) {
        notes.push(
            "the allocator settings' rows are estimates too, which leave out the slack those \
             settings change, so they read alike: --exact runs each to its boundary"
                .to_string(),
        );
    }
    // the cache of the longest generation that fits as written, not of the first one tried
    if let (Some(i), Some(k), Some(m)) = (
        kv_note,
        &kv,
        rows.first()
            .filter(|r| r.kind.is_none())
            .and_then(|r| r.max_fitting),
    ) {
        let which = if rows[0].found == search::Found::Exact {
            "the longest generation that fits"
        } else {
            "the answer's generation"
        };
        notes[i] = crate::report::run::kv_cache_line_at(k, k.prompt + m as u64, which);
    }
    let cap = opts
        .capacity
        .or(w.capacity)
        .unwrap_or(crate::runner::DEFAULT_CAPACITY);
    let verdict = fit_verdict(args, &w, &base, &opts, &param, start, start_given, &rows)?;
    if args.quiet {
        writeln!(out, "{}", verdict.line)?;
        return Ok(Outcome::Ok);
    }
    if args.json {
        let v = json!({
            "schema": super::mcp::schema::FIT,
            "workload": workload.display().to_string(),
            "param": param,
            "value_in_workload": start,
            "capacity": cap,
            "max": limit,
            "notes": notes,
            "verdict": verdict,
            "results": rows.iter().map(|r| json!({
                "remedy": r.name,
                "change": r.change,
                "max_fitting": r.max_fitting,
                "peak_allocated": r.peak_allocated,
                "peak_reserved": r.peak_reserved,
                "runs": r.runs,
                "found": r.found,
            })).collect::<Vec<_>>(),
        });
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
        return Ok(Outcome::Ok);
    }
    writeln!(out, "{}", crate::report::verdict::line(&verdict))?;
    writeln!(
        out,
        "{}: the largest {param} that fits in {} ({}; searched 1 to {}):",
        workload.display(),
        format_bytes(cap),
        if start_given {
            format!("the workload has {param} = {start}")
        } else {
            format!("starting from {param} = {start}")
        },
        limit
    )?;
    for n in &notes {
        writeln!(out, "{}", crate::report::style::wrap(n))?;
    }
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
                    if r.found == search::Found::Estimated {
                        format!("~{v} (estimated)")
                    } else if r.found == search::Found::AtLeast {
                        format!(">= {v} (stopped)")
                    } else if r.found == search::Found::Limit {
                        format!("{v} (the limit)")
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

/// The verdict: whether the workload fits at its own value of the parameter (one run there,
/// and one on an unbounded device when it does not), and the largest value that fits, or the
/// smallest remedy (in rank order) under which the value fits.
#[allow(clippy::too_many_arguments)]
fn fit_verdict(
    args: &FitArgs,
    w: &crate::workload::Workload,
    base: &Overrides,
    opts: &RunOptions,
    param: &str,
    start: i64,
    start_given: bool,
    rows: &[Row],
) -> Result<FitVerdict> {
    let workload = &args.target.path();
    let at = base.with_param(param, start);
    let r = remedies::rerun(workload, &at, opts)?;
    let context = r.context();
    let usable = r
        .oom
        .as_ref()
        .and_then(|o| o.error.allowed)
        .unwrap_or(r.capacity.saturating_sub(context));
    let needs = match &r.oom {
        Some(_) => remedies::needs(workload, &at, opts),
        None => None,
    };
    let oom_at = r.oom_place();
    let mut ranked: Vec<&Row> = rows.iter().filter(|r| r.kind.is_some()).collect();
    ranked.sort_by_key(|r| r.kind);
    let fix = ranked
        .iter()
        .find(|x| x.max_fitting.is_some_and(|m| m >= start));
    // where it fits, the figures of the largest value that fits (the answer asked for), when
    // its run gave them
    let answer = rows.first().filter(|_| r.oom.is_none()).and_then(|row| {
        row.max_fitting
            .filter(|&m| m > start)
            .zip(row.peak_reserved)
    });
    let mut v = verdict::verdict(&Inputs {
        remedies_tried: !args.no_remedies,
        world_above_one: r.ranks.map(|(_, n)| n).filter(|&n| n > 1),
        capacity: r.capacity,
        usable,
        peak_reserved: answer.map_or(r.peak.peak_reserved, |(_, p)| p),
        context,
        oom: r.oom.is_some(),
        needs_reserved: needs.map(|n| n.peak_reserved),
        // (out of memory while the model was built, and the model alone is too big)
        model_alone: needs
            .map(|n| n.built)
            .filter(|m| *m > usable && remedies::building_ran_out(w, &r)),
        cause: None,
        oom_at,
        smallest_fix: fix.map(|f| {
            format!(
                "{} (up to {param} {})",
                f.name,
                f.max_fitting.unwrap_or(start)
            )
        }),
    });
    // the question asked: at which value, and up to which
    let largest = rows.first().and_then(|r| {
        r.max_fitting.map(|m| match r.found {
            search::Found::Exact => m.to_string(),
            search::Found::Limit => format!("{m} (the search's limit: --max searches further)"),
            search::Found::Estimated => format!("about {m} (estimated)"),
            search::Found::AtLeast => format!("at least {m} (simulated, then stopped)"),
        })
    });
    let (head, rest) = v
        .line
        .split_once(':')
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .unwrap_or_default();
    v.line = match (v.fits, largest) {
        (true, Some(m)) => {
            let at = match answer {
                Some((a, _)) => format!(" (at {param} {a})"),
                None => String::new(),
            };
            let peak = format!(
                "peak reserved {}",
                crate::units::format_bytes(v.peak_reserved)
            );
            match answer {
                Some(_) => {
                    let rest = rest.replacen(&peak, &format!("{peak}{at}"), 1);
                    // (a start the user did not give, 1, is not what they asked about)
                    if start_given {
                        format!("{head} at {param} {start}, up to {param} {m}:{rest}")
                    } else {
                        format!("{head} up to {param} {m}:{rest}")
                    }
                }
                // the answer was not run (an estimate): the figures are the start's, and
                // said so
                None => format!("{head} at {param} {start}:{rest}; up to {param} {m}"),
            }
        }
        // what does fit as written, when the value asked for does not
        (false, Some(m)) => format!(
            "{head} at {param} {start}:{rest}; as written, {param} {m} is the largest that fits"
        ),
        _ => format!("{head} at {param} {start}:{rest}"),
    };
    Ok(v)
}
