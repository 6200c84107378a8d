//! `gpumem replay TRACE.json`: replay a recorded PyTorch allocator trace and compare; or
//! `gpumem replay SNAPSHOT --alloc-conf ...`: what a snapshot's run would have done with other
//! allocator settings.

use std::io::Write;

use crate::alloc::AllocConf;
use crate::analysis::groundtruth::GroundTruth;
use crate::analysis::replay::{replay, ReplayOptions};
use crate::cli::ReplayArgs;
use crate::commands::Outcome;
use crate::error::{Error, Result};
use crate::report::replay::{to_json, write_text, ReplayHeader};
use crate::report::{stats_table, torch_summary};

/// Whether the file is an allocator trace of ../shared/tools/alloc_traces.py (JSON with
/// `ops`), rather than a snapshot.
fn is_allocator_trace(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 64];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let head = String::from_utf8_lossy(&head[..n]);
    let head = head.trim_start();
    // a list of lists is a trace's `ops` without the object holding them (a list of segments,
    // `torch.cuda.memory_snapshot()`, holds objects): the trace reader says what is missing
    if let Some(rest) = head.strip_prefix('[') {
        return rest.trim_start().starts_with('[');
    }
    if !head.starts_with('{') {
        return false; // a pickle, or not JSON: the snapshot reader says what it is
    }
    // JSON: an allocator trace has a top-level "ops"; anything unreadable goes to the trace
    // reader, whose errors name the file and key
    #[derive(serde::Deserialize)]
    struct Probe {
        ops: Option<serde::de::IgnoredAny>,
        format: Option<String>,
        segments: Option<serde::de::IgnoredAny>,
    }
    match crate::input::read(path, crate::input::Kind::Data)
        .ok()
        .and_then(|b| serde_json::from_slice::<Probe>(&b).ok())
    {
        Some(p) => p.ops.is_some() || (p.format.is_none() && p.segments.is_none()),
        None => true,
    }
}

/// What the allocator could use where a snapshot was recorded: the device's memory less the
/// context, where the snapshot says; else what its out-of-memory errors show.
pub fn recorded_capacity(s: &crate::snapshot::Snapshot) -> Option<u64> {
    match (s.total_memory, s.context_overhead) {
        (Some(t), o) => Some(t.saturating_sub(o.unwrap_or(0))),
        (None, _) => crate::analysis::whatif::capacity_from_ooms(&s.segments, &s.events),
    }
}

fn what_if(args: &ReplayArgs, out: &mut dyn Write) -> Result<Outcome> {
    let s = match args.device {
        Some(_) => crate::snapshot::load_one(&args.trace, args.device)?,
        // a file of several devices: the one that ran out (the question asked of a replay),
        // else the one with the longest trace
        None => {
            let mut all = crate::snapshot::load_devices(&args.trace, crate::snapshot::Which::All)?;
            let oom = |s: &crate::snapshot::Snapshot| {
                s.events
                    .iter()
                    .any(|e| e.kind() == crate::trace::EventKind::Oom)
            };
            let pick = all
                .iter()
                .position(oom)
                .or_else(|| crate::snapshot::primary_index(all.iter().map(|s| s.events.len())))
                .unwrap_or(0);
            if all.is_empty() {
                crate::snapshot::load(&args.trace)?
            } else {
                all.swap_remove(pick)
            }
        }
    };
    if s.segments.is_empty() && s.events.is_empty() {
        return Err(Error::input(
            &args.trace,
            "snapshot",
            "holds no segments and no trace: nothing to replay (record the trace with \
             torch.cuda.memory._record_memory_history() before _dump_snapshot)",
        ));
    }
    if let (Some(n), false) = (s.device_note(), args.json) {
        writeln!(out, "{}: {n}", args.trace.display())?;
    }
    let conf = match &args.alloc_conf {
        Some(c) => AllocConf::parse(c).map_err(|e| Error::usage("--alloc-conf", e.to_string()))?,
        None => s.conf.clone(),
    };
    // the device's memory: --capacity, else what the snapshot records (at an out-of-memory);
    // else no limit, and the report says out-of-memory errors are not judged
    let capacity = match &args.capacity {
        Some(c) => {
            Some(crate::units::parse_capacity(c).map_err(|m| Error::usage("--capacity", m))?)
        }
        None => recorded_capacity(&s),
    };
    let mut w = crate::analysis::whatif::what_if(
        &s.segments,
        &s.events,
        &s.conf,
        &conf,
        capacity.unwrap_or(crate::analysis::whatif::UNLIMITED),
    );
    w.capacity_known = capacity.is_some();
    // the recorded settings replayed at the same capacity are the baseline a setting is
    // judged against: at a capacity of the user's (the recording ran on its own device), and
    // at the recording's own, where they must run out as the recording did for that capacity
    // to be the limit it ran into
    if let Some(c) = capacity {
        let base = crate::analysis::whatif::what_if(&s.segments, &s.events, &s.conf, &s.conf, c);
        w.recorded_settings_ooms = Some(base.replayed.ooms);
        w.capacity_given = args.capacity.is_some();
    }
    let path = args.trace.display().to_string();
    if args.json {
        let mut v = crate::report::whatif::to_json(&path, &w);
        v["device"] = serde_json::json!(s.device);
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        crate::report::whatif::write_text(out, &path, &w)?;
    }
    Ok(if w.replayed.ooms > 0 {
        Outcome::Finding
    } else {
        Outcome::Ok
    })
}

pub fn run(args: &ReplayArgs, out: &mut dyn Write) -> Result<Outcome> {
    if !is_allocator_trace(&args.trace) {
        return what_if(args, out);
    }
    if args.capacity.is_some() {
        return Err(Error::usage(
            "--capacity",
            "an allocator trace carries its device's memory; --capacity is for snapshots",
        ));
    }
    let gt = GroundTruth::load(&args.trace)?;
    let (conf, overridden) = match &args.alloc_conf {
        Some(s) => (
            AllocConf::parse(s).map_err(|e| Error::usage("--alloc-conf", e.to_string()))?,
            true,
        ),
        None => (
            AllocConf::parse(&gt.alloc_conf)
                .map_err(|e| Error::input(&args.trace, "alloc_conf", e.to_string()))?,
            false,
        ),
    };
    let opts = ReplayOptions {
        alloc_conf: None,
        no_trace_addresses: args.no_trace_addresses,
        max_details: args.max_mismatches,
    };
    let conf_text = conf.raw.clone();
    // other settings than the recording's: a what-if, recorded against replayed
    let differs = overridden
        && AllocConf::parse(&gt.alloc_conf)
            .map(|c| c != conf)
            .unwrap_or(true);
    let r = replay(&gt, conf, &opts);
    let path = args.trace.display().to_string();
    if differs {
        let w = crate::analysis::whatif::trace_what_if(&gt, &r, &conf_text);
        if args.json {
            serde_json::to_writer_pretty(
                &mut *out,
                &crate::report::whatif::trace_to_json(&path, &w),
            )
            .map_err(std::io::Error::from)?;
            writeln!(out)?;
        } else {
            crate::report::whatif::write_trace_text(out, &path, &w)?;
        }
        return Ok(if w.replayed.ooms > 0 {
            Outcome::Finding
        } else {
            Outcome::Ok
        });
    }
    let header = ReplayHeader {
        path: &path,
        alloc_conf: &conf_text,
        conf_overridden: overridden,
        memory_fraction: gt.memory_fraction,
        torch_version: &gt.torch_version,
        device_name: &gt.device_name,
    };
    if args.json {
        let mut v = to_json(&header, &r);
        if args.summary {
            v["memory_summary"] =
                torch_summary::render(&r.stats, r.allocator.device(), false).into();
        }
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        write_text(out, &header, &r)?;
        if args.summary {
            writeln!(out)?;
            if args.torch_style {
                torch_summary::write(out, &r.stats, r.allocator.device())?;
            } else {
                stats_table::write(out, &r.stats)?;
            }
        }
    }
    Ok(if r.all_match() {
        Outcome::Ok
    } else {
        Outcome::Finding
    })
}
