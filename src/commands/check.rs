//! `gpumem check INPUT... --baseline FILE`: run workloads (or read snapshots), compare their
//! memory with a baseline, and fail on a regression or an exceeded budget. This file loads,
//! runs, resolves where each tolerance and budget comes from, and writes files; the judging
//! is [`crate::analysis::check`], the formatting [`crate::report::check`].

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::analysis::check::{self as judge, Baseline, Entry, Limits, Measurement, Source};
use crate::analysis::findings::{self, RunRecord};
use crate::analysis::summary;
use crate::cli::CheckArgs;
use crate::commands::{load_workload, parse_overrides, write_atomic, Outcome};
use crate::error::{Error, Result};
use crate::workload::check::{is_metric, metric_names, CheckTable, SettingValue};

/// One input, measured.
struct Input {
    name: String,
    path: PathBuf,
    measurement: Measurement,
    /// The workload's `[check]` table (empty for a snapshot).
    check: CheckTable,
}

/// `--tolerance` and `--budget` as a [`CheckTable`].
fn command_line_table(tolerances: &[String], budgets: &[String]) -> Result<CheckTable> {
    let mut t = CheckTable::default();
    let unknown = |flag: &str, m: &str| {
        Error::usage(
            flag,
            format!(
                "unknown metric '{m}' (metrics: {})",
                metric_names().join(", ")
            ),
        )
    };
    for s in tolerances {
        match s.split_once('=') {
            None => t
                .set("tolerance", SettingValue::Str(s))
                .map_err(|m| Error::usage("--tolerance", m.replace("'tolerance': ", "")))?,
            Some((m, v)) => {
                let m = m.trim();
                if !is_metric(m) {
                    return Err(unknown("--tolerance", m));
                }
                t.set(&format!("{m}_tolerance"), SettingValue::Str(v))
                    .map_err(|e| Error::usage("--tolerance", e))?;
            }
        }
    }
    for s in budgets {
        let Some((m, v)) = s.split_once('=') else {
            return Err(Error::usage(
                "--budget",
                format!("'{s}' is not METRIC=SIZE (e.g. --budget peak_reserved=20GiB)"),
            ));
        };
        let m = m.trim();
        if !is_metric(m) {
            return Err(unknown("--budget", m));
        }
        // a bare number is bytes (a budget to the byte: `peak_allocated=13038973952`), but
        // one below 1 MiB is refused: `peak_reserved=20` meant 20 GiB, not 20 bytes
        let unit = v.trim();
        if unit
            .replace('_', "")
            .parse::<u64>()
            .is_ok_and(|n| n > 0 && n < 1 << 20)
        {
            return Err(Error::usage(
                "--budget",
                format!(
                    "'{s}' has no unit: write {m}={unit}GiB for {unit} GiB (or {m}={unit}B for \
                     bytes)"
                ),
            ));
        }
        t.set(&format!("max_{m}"), SettingValue::Str(v))
            .map_err(|e| Error::usage("--budget", e))?;
    }
    Ok(t)
}

/// Reads the baseline; a missing file is an empty baseline only for `--update`.
fn load_baseline(path: &Path, update: bool) -> Result<Baseline> {
    let text = match crate::input::read_text(path, crate::input::Kind::Text) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && update => {
            return Ok(Baseline::default())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::input(
                path,
                "baseline",
                "no such file; record one first with `gpumem check INPUT... --baseline FILE \
                 --update` and commit it",
            ))
        }
        Err(source) => {
            return Err(Error::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        Error::input(
            path,
            format!("line {} column {}", e.line(), e.column()),
            format!("not valid JSON: {e}"),
        )
    })?;
    match v.get("gpumem_baseline").and_then(|v| v.as_u64()) {
        Some(judge::BASELINE_VERSION) => {}
        Some(n) => {
            return Err(Error::input(
                path,
                "gpumem_baseline",
                format!(
                    "schema version {n}, but this gpumem reads version {} (record the baseline \
                     again with --update, or use the gpumem that wrote it)",
                    judge::BASELINE_VERSION
                ),
            ))
        }
        None => {
            return Err(Error::input(
                path,
                "gpumem_baseline",
                format!(
                    "not a gpumem baseline: the top-level object needs \"gpumem_baseline\": {} \
                     and \"entries\"",
                    judge::BASELINE_VERSION
                ),
            ))
        }
    }
    serde_json::from_str(&text).map_err(|e| {
        Error::input(
            path,
            format!("line {} column {}", e.line(), e.column()),
            e.to_string()
                .split(" at line ")
                .next()
                .unwrap_or_default()
                .to_string(),
        )
    })
}

/// An entry's "check" object as a [`CheckTable`].
fn entry_table(path: &Path, name: &str, e: &Entry) -> Result<CheckTable> {
    let mut t = CheckTable::default();
    for (k, v) in &e.check {
        let value = match v {
            serde_json::Value::String(s) => SettingValue::Str(s),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => SettingValue::Int(i),
                None => SettingValue::Other("a fractional or huge number"),
            },
            serde_json::Value::Bool(_) => SettingValue::Other("a boolean"),
            serde_json::Value::Null => SettingValue::Other("null"),
            serde_json::Value::Array(_) => SettingValue::Other("an array"),
            serde_json::Value::Object(_) => SettingValue::Other("an object"),
        };
        t.set(k, value)
            .map_err(|m| Error::input(path, format!("entries.\"{name}\".check.{k}"), m))?;
    }
    Ok(t)
}

/// Runs a workload, or reads a snapshot, and measures it.
fn measure(path: &Path, args: &CheckArgs, device: Option<&str>) -> Result<Input> {
    let is_config = crate::workload::is_config_not_snapshot(path);
    let builtin = matches!(crate::workload::builtin::lookup(path), Ok(Some(_)));
    if path.extension().is_some_and(|e| e == "toml") || is_config || builtin {
        // a config takes the model's flags (and needs its batch and sequence); a workload
        // file takes --param and refuses a config's flags
        let required: &[&str] = if is_config { &["batch", "seq"] } else { &[] };
        let overrides = super::model_overrides(path, &args.model, &args.params, None, required)?;
        let w = load_workload(path, &overrides)?;
        let opts = crate::runner::RunOptions {
            deadline: None,
            device: device.map(str::to_string),
            ..Default::default()
        };
        let r = crate::runner::run(&w, path, &opts)?;
        let found = findings::analyze(
            &RunRecord {
                allocator: &r.allocator,
                title: &r.name,
                iteration_ends: &r.iteration_ends,
                oom: r.oom.as_ref().map(|o| &o.error),
            },
            0,
            false,
        );
        let (leak_per_iteration, leak_sites) = leak_figures(&found.leaks);
        return Ok(Input {
            name: w.name.clone(),
            path: path.to_path_buf(),
            measurement: Measurement {
                peak_allocated: r.peak.peak_allocated,
                peak_reserved: r.peak.peak_reserved,
                leak_per_iteration,
                oom: r.oom.is_some(),
                categories_at_peak: r
                    .peak
                    .by_category
                    .iter()
                    .map(|(c, b)| (c.name().to_string(), *b))
                    .collect(),
                top_tags_at_peak: r.peak.top_tags.iter().cloned().collect(),
                leak_sites,
            },
            check: w.check,
        });
    }
    let s = crate::snapshot::load(path)?;
    let sum = summary::summarize(&s.segments, &s.events, &s.tags, &s.conf, 10, false);
    let (peak_allocated, peak_reserved, cats, sites) = match &sum.trace {
        Some(t) => (
            t.peak_allocated_bytes,
            t.peak_reserved_bytes,
            t.peak_by_category.clone(),
            &t.top_sites_at_peak,
        ),
        // no trace: the state the snapshot holds is all there is
        None => (
            sum.all.allocated_bytes,
            sum.all.reserved_bytes,
            Vec::new(),
            &sum.live_by_site,
        ),
    };
    let (leak_per_iteration, leak_sites) = leak_figures(&sum.leaks);
    Ok(Input {
        name: path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| s.name.clone()),
        path: path.to_path_buf(),
        measurement: Measurement {
            peak_allocated,
            peak_reserved,
            leak_per_iteration,
            oom: !sum.ooms.is_empty(),
            categories_at_peak: cats.into_iter().collect(),
            top_tags_at_peak: sites.iter().map(|x| (x.site.clone(), x.bytes)).collect(),
            leak_sites,
        },
        check: CheckTable::default(),
    })
}

/// A leak report as `check` measures it: bytes left behind per iteration (`None` where leaks
/// were not looked for) and by leaking site.
fn leak_figures(l: &crate::analysis::leaks::LeakReport) -> (Option<u64>, BTreeMap<String, u64>) {
    let mut sites = BTreeMap::new();
    for leak in &l.leaks {
        for x in &leak.sites {
            *sites.entry(x.site.clone()).or_default() += x.bytes_per_iteration;
        }
    }
    let total = l
        .checked
        .map(|_| l.leaks.iter().map(|x| x.bytes_per_iteration).sum());
    (total, sites)
}

/// The tolerance and budget of `metric`: the command line, then the workload's `[check]`, then
/// the baseline entry's settings, then the default (0 for the totals; 1%, at least 1 MiB, for a
/// category) and no budget.
fn limits(metric: &str, sources: &[(&CheckTable, Source)]) -> Limits {
    let mut l = judge::default_limits(metric);
    if let Some((ppm, from)) = sources
        .iter()
        .find_map(|(t, s)| t.tolerance_for(metric).map(|p| (p, *s)))
    {
        l.tolerance_ppm = ppm;
        l.tolerance_from = from;
        l.slack = 0;
    }
    l.budget = sources
        .iter()
        .find_map(|(t, s)| t.budgets.get(metric).map(|b| (*b, *s)));
    l
}

pub fn run(args: &CheckArgs, out: &mut dyn Write) -> Result<Outcome> {
    if let Some(j) = &args.junit {
        let mut inputs: Vec<&std::path::Path> = args.inputs.iter().map(|p| p.as_path()).collect();
        inputs.extend(args.baseline.as_deref());
        super::refuse_output_over_input("--junit", j, &inputs)?;
    }
    if args.top == 0 {
        return Err(Error::usage("--top", "must be at least 1"));
    }
    let cli = command_line_table(&args.tolerance, &args.budget)?;
    // (checked once, before any input runs)
    parse_overrides(&args.params, None)?;
    // without --baseline only budgets are checked; a missing file with --allow-new is empty
    let mut baseline = match &args.baseline {
        Some(path) => load_baseline(path, args.update || args.allow_new)?,
        None if args.update => {
            return Err(Error::usage(
                "--update",
                "needs --baseline FILE: the file to write the measurements to",
            ))
        }
        None => Baseline::default(),
    };
    let mut entry_tables = BTreeMap::new();
    if let Some(path) = &args.baseline {
        for (name, e) in &baseline.entries {
            entry_tables.insert(name.clone(), entry_table(path, name, e)?);
        }
    }
    // a progress bar on a terminal (indicatif hides it otherwise)
    let bar = indicatif::ProgressBar::new(args.inputs.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("gpumem check [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut inputs: Vec<Input> = Vec::new();
    for p in &args.inputs {
        bar.set_message(p.display().to_string());
        let input = measure(p, args, args.device.as_deref());
        bar.inc(1);
        if input.is_err() {
            bar.finish_and_clear();
        }
        let input = input?;
        if let Some(other) = inputs.iter().find(|x| x.name == input.name) {
            return Err(Error::input(
                p,
                "name",
                format!(
                    "'{}' is also the name of {}: the baseline keys entries by name, so give \
                     each workload its own [workload] name (snapshots and Hugging Face configs \
                     are named by their file, a config.json by its folder too)",
                    input.name,
                    other.path.display()
                ),
            ));
        }
        inputs.push(input);
    }
    bar.finish_and_clear();
    let files: BTreeMap<String, String> = inputs
        .iter()
        .map(|i| (i.name.clone(), i.path.display().to_string()))
        .collect();

    if let (true, Some(baseline_path)) = (args.update, &args.baseline) {
        let version = env!("CARGO_PKG_VERSION");
        for i in &inputs {
            let keep = baseline
                .entries
                .get(&i.name)
                .map(|e| e.check.clone())
                .unwrap_or_default();
            let new = Entry::record(&i.measurement, &i.path.display().to_string(), version, keep);
            let old = baseline.entries.insert(i.name.clone(), new.clone());
            writeln!(
                out,
                "{} {}: peak allocated {}, peak reserved {}{}",
                match &old {
                    Some(o) if *o == new => "unchanged",
                    Some(o) if o.is_recorded() => "updated",
                    _ => "recorded",
                },
                i.name,
                crate::units::format_bytes(i.measurement.peak_allocated),
                crate::units::format_bytes(i.measurement.peak_reserved),
                if i.measurement.oom {
                    ", out of memory"
                } else {
                    ""
                }
            )?;
        }
        let mut text = serde_json::to_string_pretty(&baseline).map_err(std::io::Error::from)?;
        text.push('\n');
        let entries = crate::units::count(baseline.entries.len() as u64, "entry", "entries");
        // (a file that already says exactly this is left alone: nothing to commit)
        if std::fs::read(baseline_path).is_ok_and(|b| b == text.as_bytes()) {
            let p = baseline_path.display();
            writeln!(out, "{p} unchanged ({entries}): nothing to commit")?;
        } else {
            write_atomic(baseline_path, text.as_bytes())?;
            writeln!(
                out,
                "wrote {} ({entries}); commit it",
                baseline_path.display()
            )?;
        }
        return Ok(Outcome::Ok);
    }

    let empty = CheckTable::default();
    // budget-only: each input is judged as an entry that holds only budgets
    let budgets_only = Entry::default();
    if args.baseline.is_none()
        && cli.budgets.is_empty()
        && inputs.iter().all(|i| i.check.budgets.is_empty())
    {
        return Err(Error::usage(
            "--baseline",
            "nothing to check: give --baseline FILE to compare with a recorded baseline, or a \
             budget (--budget peak_reserved=20GiB, or max_peak_reserved in the workload's \
             [check] table)",
        ));
    }
    let judged: Vec<judge::Judged> = inputs
        .iter()
        .map(|i| {
            let sources = [
                (&cli, Source::CommandLine),
                (&i.check, Source::Workload),
                (
                    entry_tables.get(&i.name).unwrap_or(&empty),
                    Source::Baseline,
                ),
            ];
            let entry = match &args.baseline {
                Some(_) => baseline.entries.get(&i.name),
                None => Some(&budgets_only),
            };
            judge::judge(
                &i.name,
                &i.measurement,
                entry,
                &|m| limits(m, &sources),
                args.allow_new,
                args.top,
            )
        })
        .collect();
    let failed = judged
        .iter()
        .any(|j| j.rows.iter().any(|r| r.verdict.fails()));
    if let Some(path) = &args.junit {
        write_atomic(
            path,
            crate::report::check::junit(&judged, &files).as_bytes(),
        )?;
    }
    let baseline_name = match &args.baseline {
        Some(p) => p.display().to_string(),
        None => "none (budgets only)".into(),
    };
    let verdict = crate::report::check::verdict_line(&judged);
    if args.quiet {
        writeln!(out, "{verdict}")?;
    } else if args.json {
        let v = serde_json::json!({
            "schema": super::mcp::schema::CHECK,
            "baseline": baseline_name,
            "passed": !failed,
            "verdict": {"passed": !failed, "line": verdict},
            "inputs": judged.iter().map(|j| serde_json::json!({
                "name": j.name,
                "file": files.get(&j.name),
                "in_baseline": j.in_baseline,
                "rows": j.rows,
            })).collect::<Vec<_>>(),
        });
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        if args.markdown {
            crate::report::check::write_markdown(out, &judged)?;
        } else {
            crate::report::check::write_text(out, &baseline_name, &judged)?;
        }
        if std::env::var("GITHUB_ACTIONS").is_ok_and(|v| v == "true") {
            crate::report::check::write_github(out, &judged, &files)?;
        }
    }
    Ok(if failed {
        Outcome::Finding
    } else {
        Outcome::Ok
    })
}
