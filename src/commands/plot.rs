//! `gpumem plot SNAPSHOT -o timeline.svg`: the memory timeline of a gpumem snapshot as SVG.

use std::io::Write;

use crate::analysis::{snapshot_file, state};
use crate::cli::PlotArgs;
use crate::commands::{write_atomic, Outcome};
use crate::error::{Error, Result};
use crate::report::timeline_svg;
use crate::units::format_bytes;

pub fn run(args: &PlotArgs, out: &mut dyn Write) -> Result<Outcome> {
    super::refuse_output_over_input("-o", &args.output, &[&args.snapshot])?;
    super::refuse_non_svg("-o", &args.output)?;
    if args.samples < 2 {
        return Err(Error::usage("--samples", "must be at least 2"));
    }
    let text = crate::input::read(&args.snapshot, crate::input::Kind::Data).map_err(|source| {
        Error::Read {
            path: args.snapshot.clone(),
            source,
        }
    })?;
    let gpumem_run = std::str::from_utf8(&text)
        .ok()
        .filter(|t| t.trim_start().starts_with('{') && t.contains("\"gpumem-snapshot\""));
    let mut note = None;
    // what a snapshot holds at its end (allocated, reserved), for one without a trace
    let mut state = None;
    let (t, events) = match gpumem_run {
        // a gpumem run's trace starts with the run: replay it exactly
        Some(_) if args.iteration_marker.is_some() => {
            return Err(Error::usage(
                "--iteration-marker",
                "is for PyTorch snapshots: a gpumem run knows its iterations",
            ))
        }
        Some(text) => {
            let snap = snapshot_file::parse(text)
                .map_err(|m| Error::input(&args.snapshot, "snapshot", m))?;
            if snap.dropped > 0 {
                return Err(Error::input(
                    &args.snapshot,
                    "trace",
                    format!(
                        "the recording lost its first {} events to its bound, so the timeline \
                         cannot be rebuilt from the start",
                        snap.dropped
                    ),
                ));
            }
            let t = state::timeline(
                &snap.events,
                &snap.tags,
                &snap.setup,
                &snap.name,
                args.samples,
            )
            .map_err(|d| Error::input(&args.snapshot, "trace", d.to_string()))?;
            (t, snap.events.len())
        }
        // a PyTorch snapshot: walked from its end state, stacked by the sites holding most
        None => {
            let mut s = crate::snapshot::load_one(&args.snapshot, args.device)?;
            if let Some(m) = &args.iteration_marker {
                crate::snapshot::iterations_from_marker(&mut s, m)
                    .map_err(|e| Error::usage("--iteration-marker", e))?;
            }
            note = s.device_note();
            let allocated: u64 = s
                .segments
                .iter()
                .flat_map(|g| &g.blocks)
                .filter(|b| b.state == crate::alloc::BlockState::ActiveAllocated)
                .map(|b| b.size)
                .sum();
            state = Some((
                allocated,
                s.segments.iter().map(|g| g.total_size).sum::<u64>(),
            ));
            let t = state::timeline_from_trace(
                &s.segments,
                &s.events,
                &s.tags,
                &s.conf,
                &s.name,
                6,
                args.samples,
            );
            (t, s.events.len())
        }
    };
    let snap_events = events;
    if let Some(n) = &note {
        writeln!(out, "{}: {n}", args.snapshot.display())?;
    }
    if let (true, Some((allocated, reserved))) = (t.samples.is_empty(), state) {
        // nothing to draw over time: say what the snapshot holds, in the picture too
        let what = format!(
            "no allocation in the trace: the snapshot holds {} allocated, {} reserved (record \
             a trace with torch.cuda.memory._record_memory_history())",
            format_bytes(allocated),
            format_bytes(reserved)
        );
        write_atomic(
            &args.output,
            timeline_svg::render_message(&t.title, &what).as_bytes(),
        )?;
        writeln!(out, "wrote {}: {what}", args.output.display())?;
        return Ok(Outcome::Ok);
    }
    write_atomic(&args.output, timeline_svg::render(&t).as_bytes())?;
    writeln!(
        out,
        "wrote {}: {} points over {}, {}, peak {}",
        args.output.display(),
        t.samples.len(),
        crate::units::count(snap_events as u64, "event", "events"),
        crate::units::count(t.iterations.len() as u64, "iteration", "iterations"),
        t.peak
            .as_ref()
            .map(|p| format_bytes(p.allocated))
            .unwrap_or_else(|| "0 B".into())
    )?;
    Ok(Outcome::Ok)
}
