//! `gpumem summary FILE...`: what a snapshot says, for gpumem's snapshots and PyTorch's, device
//! by device; several files (one per rank) as one table of ranks.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::analysis::summary::{self, DeviceRow, Summary};
use crate::cli::{FailOn, SummaryArgs};
use crate::commands::Outcome;
use crate::error::{Error, Result};
use crate::report;
use crate::snapshot::Snapshot;

pub fn run(args: &SummaryArgs, out: &mut dyn Write) -> Result<Outcome> {
    if args.top() == 0 {
        return Err(Error::usage("--top", "must be at least 1"));
    }
    if args.snapshots.len() > 1 {
        // what the table of ranks has no room for is refused rather than ignored
        let one = [
            ("--by", args.by.is_some(), "the table is of one snapshot"),
            (
                "--stacks",
                args.stacks,
                "the call stacks are of one snapshot's sites; the table of ranks has none",
            ),
            (
                "--top",
                args.top.is_some(),
                "the lists of sites are of one snapshot; the table of ranks has a row per rank",
            ),
        ];
        if let Some((flag, _, why)) = one.into_iter().find(|x| x.1) {
            return Err(Error::usage(
                flag,
                format!("{why}: give one file (or one rank's)"),
            ));
        }
    }
    if let [one] = args.snapshots.as_slice() {
        if args.capacity.is_some() {
            return Err(Error::usage(
                "--capacity",
                "--capacity checks the ranks of several snapshots (gpumem summary rank*.pickle \
                 --capacity 80GiB); one snapshot's own verdict is in its report",
            ));
        }
        return one_file(args, one, out);
    }
    ranks(args, out)
}

fn summarize(s: &Snapshot, args: &SummaryArgs) -> Summary {
    summary::summarize(
        &s.segments,
        &s.events,
        &s.tags,
        &s.conf,
        args.top(),
        args.stacks,
    )
}

fn fails(args: &SummaryArgs, ooms: usize, leaks: usize) -> bool {
    args.fail_on.contains(&FailOn::Oom) && ooms > 0
        || args.fail_on.contains(&FailOn::Leak) && leaks > 0
}

/// Iterations from `--iteration-marker` on each device that has a trace.
fn mark_iterations(args: &SummaryArgs, snaps: &mut [Snapshot]) -> Result<()> {
    let Some(m) = &args.iteration_marker else {
        return Ok(());
    };
    let mut found = 0;
    let mut last_err = None;
    for s in snaps.iter_mut().filter(|s| !s.events.is_empty()) {
        match crate::snapshot::iterations_from_marker(s, m) {
            Ok(_) => found += 1,
            Err(e) => last_err = Some(e),
        }
    }
    match (found, last_err) {
        (0, Some(e)) => Err(Error::usage("--iteration-marker", e)),
        _ => Ok(()),
    }
}

fn one_file(args: &SummaryArgs, file: &Path, out: &mut dyn Write) -> Result<Outcome> {
    let mut snaps = crate::snapshot::load_for_flag(file, args.device)?;
    mark_iterations(args, &mut snaps)?;
    let sums: Vec<Summary> = snaps.iter().map(|s| summarize(s, args)).collect();
    let path = file.display().to_string();
    let pairs: Vec<(&Snapshot, &Summary)> = snaps.iter().zip(&sums).collect();
    // a snapshot's out-of-memory settled the way a run's is: by a replay of its trace under
    // expandable segments (the allocator setting that fixes fragmentation)
    let settled: Vec<Option<bool>> = snaps
        .iter()
        .zip(&sums)
        .map(|(s, m)| {
            if m.ooms.is_empty() || s.conf.expandable_segments {
                return None;
            }
            let capacity = super::replay::recorded_capacity(s)?;
            // (only where the recorded settings, replayed at that capacity, run out as the
            // recording did: else the capacity is not the limit it ran into)
            let as_recorded = crate::analysis::whatif::what_if(
                &s.segments,
                &s.events,
                &s.conf,
                &s.conf,
                capacity,
            );
            if as_recorded.replayed.ooms == 0 {
                return None;
            }
            let mut conf = s.conf.clone();
            conf.expandable_segments = true;
            let w =
                crate::analysis::whatif::what_if(&s.segments, &s.events, &s.conf, &conf, capacity);
            Some(w.replayed.ooms == 0)
        })
        .collect();
    let mut verdict = report::summary::verdict_line(&pairs, &settled);
    // a failure asked for is said on the line that opens the report (-q prints it alone)
    if args.fail_on.contains(&FailOn::Leak) {
        for m in &sums {
            verdict.push_str(&report::findings::fail_on_leak_note(&m.leaks));
        }
    }
    let any_oom = sums.iter().any(|m| !m.ooms.is_empty());
    let profiles = match args.by {
        Some(by) if !args.quiet => snaps
            .iter()
            .filter(|s| !s.events.is_empty() || snaps.len() == 1)
            .map(|s| profile_of(s, by, args))
            .collect::<Result<Vec<_>>>()?,
        _ => Vec::new(),
    };
    if args.quiet {
        writeln!(out, "{verdict}")?;
    } else if let (false, false) = (profiles.is_empty(), args.json) {
        // the table asked for, after the verdict, instead of the report
        writeln!(out, "{}", report::style::wrap(&verdict))?;
        for (device, p) in &profiles {
            writeln!(out)?;
            if snaps.len() > 1 {
                writeln!(out, "{}", report::style::heading(&format!("cuda:{device}")))?;
            }
            report::profile::write_text(out, p, args.top())?;
        }
    } else if args.json {
        let mut v = report::summary::to_json_devices(&path, &pairs);
        v["schema"] = serde_json::json!(super::mcp::schema::SUMMARY);
        v["verdict"] = serde_json::json!({"line": verdict, "oom": any_oom});
        if !profiles.is_empty() {
            v["profiles"] = profiles
                .iter()
                .map(|(device, p)| {
                    let mut j = report::profile::to_json(p);
                    j["device"] = serde_json::json!(device);
                    j
                })
                .collect();
        }
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        let line = report::style::wrap(&verdict);
        writeln!(
            out,
            "{}",
            if any_oom {
                report::style::bad(&line)
            } else {
                report::style::good(&line)
            }
        )?;
        report::summary::write_devices(out, &path, &pairs, args.stacks)?;
    }
    let ooms = sums.iter().map(|m| m.ooms.len()).sum();
    let leaks = sums.iter().map(|m| m.leaks.leaks.len()).sum();
    Ok(if fails(args, ooms, leaks) {
        Outcome::Finding
    } else {
        Outcome::Ok
    })
}

/// The profiler's table of one device's trace (`--by`).
fn profile_of(
    s: &Snapshot,
    by: crate::cli::ProfileBy,
    args: &SummaryArgs,
) -> Result<(u32, crate::analysis::profile::Profile)> {
    use crate::analysis::profile::{profile, ProfileInput};
    let input = ProfileInput {
        segments: &s.segments,
        events: &s.events,
        times: &s.times,
        tags: &s.tags,
        conf: &s.conf,
        annotations: &s.annotations,
        frames: s.format != crate::snapshot::Format::Gpumem,
        library: &s.library_frames,
        entry_meta: &s.entry_meta,
        meta_strings: Some(&s.meta_strings),
    };
    let p = profile(
        &input,
        by.analysis(),
        crate::cli::ProfileSort::analysis(args.sort),
    )
    .map_err(|m| Error::usage("--by", m))?;
    Ok((s.device, p))
}

/// Several files: each read and summarized on its own worker, a bounded number at a time, and
/// only its rows kept.
fn ranks(args: &SummaryArgs, out: &mut dyn Write) -> Result<Outcome> {
    let files = &args.snapshots;
    let cores = crate::snapshot::threads();
    let workers = cores.min(files.len()).max(1);
    // the cores left over read inside each file
    let inner = (cores / workers).max(1);
    // rayon's pool (the parallel passes over each file's trace) gets every core: the first
    // call sets it, and a file read with `inner` cores would set it to those
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(cores)
        .build_global();
    let next = AtomicUsize::new(0);
    type Slot = Option<Result<Vec<DeviceRow>>>;
    let results: Mutex<Vec<Slot>> = Mutex::new((0..files.len()).map(|_| None).collect());
    let bar = progress(files.len());
    std::thread::scope(|sc| {
        for _ in 0..workers {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(f) = files.get(i) else { break };
                let r = rows_of(f, args, inner);
                if let Some(b) = &bar {
                    b.inc(1);
                }
                results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
            });
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut rows = Vec::new();
    for r in results.into_inner().unwrap_or_else(|p| p.into_inner()) {
        rows.extend(r.expect("every file was read")?);
    }
    if rows.is_empty() {
        if let Some(n) = args.device {
            return Err(Error::usage(
                "--device",
                format!(
                    "none of the {} files has anything on device {n}",
                    files.len()
                ),
            ));
        }
    }
    let spread = summary::spread(&rows);
    let capacity = match &args.capacity {
        None => None,
        Some(c) => {
            Some(crate::units::parse_capacity(c).map_err(|m| Error::usage("--capacity", m))?)
        }
    };
    let over = capacity.map(|c| report::summary::over_capacity(&rows, c));
    let verdict = report::summary::ranks_verdict(&rows, capacity);
    if args.json {
        let mut v = report::summary::ranks_json(&rows, &spread);
        v["schema"] = serde_json::json!(super::mcp::schema::RANKS);
        v["verdict"] = serde_json::json!({
            "line": verdict,
            "oom": rows.iter().any(|r| r.ooms > 0),
        });
        if let (Some(c), Some(o)) = (capacity, &over) {
            v["capacity"] = serde_json::json!(c);
            v["over_capacity"] = serde_json::json!(o);
            v["first_to_run_out"] = serde_json::json!(report::summary::first_to_run_out(&rows));
        }
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else if args.quiet {
        writeln!(out, "{verdict}")?;
    } else {
        writeln!(out, "{}", report::style::wrap(&verdict))?;
        report::summary::write_ranks(out, &rows, &spread)?;
    }
    let ooms = rows.iter().map(|r| r.ooms).sum();
    let leaks = rows.iter().filter_map(|r| r.leaks).sum();
    Ok(if fails(args, ooms, leaks) {
        Outcome::Finding
    } else {
        Outcome::Ok
    })
}

fn rows_of(file: &Path, args: &SummaryArgs, threads: usize) -> Result<Vec<DeviceRow>> {
    let which = args
        .device
        .map_or(crate::snapshot::Which::All, crate::snapshot::Which::Device);
    let mut snaps = crate::snapshot::load_devices_with(file, which, threads)?;
    mark_iterations(args, &mut snaps)?;
    Ok(snaps
        .iter()
        .map(|s| DeviceRow::of(&file.display().to_string(), s, &summarize(s, args)))
        .collect())
}

/// A progress bar on stderr for many files, only for a person watching.
fn progress(n: usize) -> Option<indicatif::ProgressBar> {
    (n >= 8 && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(|| {
        let b = indicatif::ProgressBar::new(n as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("reading snapshots [{bar:30}] {pos}/{len}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b
    })
}
