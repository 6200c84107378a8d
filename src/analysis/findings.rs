//! Everything gpumem finds in one recorded run: the category timeline, fragmentation at the
//! peak, at each iteration's end, at an out-of-memory and at the end, leaks across iterations,
//! and the out-of-memory's diagnosis. A pure function of the allocator's final state and its
//! trace (the intermediate states come from replaying the trace, [`super::state`]).

use super::fragmentation::{self, Fragmentation};
use super::leaks::{self, LeakOptions, LeakReport};
use super::oom::{self, OomDiagnosis};
use super::state::{self, ReplaySetup};
use super::timeline::Timeline;
use crate::alloc::{OutOfMemory, SimAllocator};

/// Fragmentation summed up at one moment (the series' points).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FragPoint {
    /// "peak", "iter 3 end", "oom", "end".
    pub at: String,
    /// Index of the event after which it was taken.
    pub event: u64,
    pub reserved: u64,
    pub allocated: u64,
    pub internal: u64,
    pub external: u64,
    pub largest_free: u64,
    pub ratio: f64,
}

impl FragPoint {
    fn of(at: String, event: u64, f: &Fragmentation) -> Self {
        FragPoint {
            at,
            event,
            reserved: f.reserved,
            allocated: f.allocated,
            internal: f.internal,
            external: f.external,
            largest_free: f.largest_free,
            ratio: f.ratio,
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Findings {
    /// Allocated by category and reserved over the run.
    #[serde(skip)]
    pub timeline: Option<Timeline>,
    /// At the moment allocated memory was highest.
    pub fragmentation_at_peak: Option<Fragmentation>,
    /// At the failure, when the run ran out of memory.
    pub fragmentation_at_oom: Option<Fragmentation>,
    /// When the run ended (at the failure, for an out-of-memory).
    pub fragmentation_at_end: Fragmentation,
    /// At the peak, at each iteration's end and at the end, in event order.
    pub fragmentation_series: Vec<FragPoint>,
    pub leaks: LeakReport,
    pub oom: Option<OomDiagnosis>,
    /// Why the timeline and the states before the end are missing, when they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_note: Option<String>,
}

/// What was recorded of a run.
pub struct RunRecord<'a> {
    pub allocator: &'a SimAllocator,
    pub title: &'a str,
    /// (iteration, index of its last event) for each finished iteration.
    pub iteration_ends: &'a [(u32, u64)],
    pub oom: Option<&'a OutOfMemory>,
}

/// Analyses a run. The timeline keeps at most `max_samples` points. The timeline and the
/// states before the end (the peak's, each iteration end's) need a replay of the whole trace:
/// only when `past_states`, since leaks and an OOM's diagnosis do without.
pub fn analyze(rec: &RunRecord<'_>, max_samples: usize, past_states: bool) -> Findings {
    let a = rec.allocator;
    let r = a.recorder();
    let events: Vec<_> = r.ring.iter().copied().collect();
    let end = analyze_now(a);
    let last_event = events.len().saturating_sub(1) as u64;
    let leaks = leaks::find(
        &events,
        &r.tags,
        &|n| a.round_size(n),
        LeakOptions::default(),
    );
    let oom = rec.oom.map(|o| {
        let usable = o
            .allowed
            .unwrap_or_else(|| a.source().capacity())
            .min(a.source().capacity());
        let mut d = oom::diagnose(o, usable, &events, &r.tags);
        let leaked: u64 = leaks.leaks.iter().map(|l| l.bytes_per_iteration).sum();
        if leaked > 0 {
            d.explanation.push_str(&format!(
                " But first: memory grows by {} every iteration (see the leak report), so the run \
                 would run out on any device sooner or later; fix the leak.",
                crate::units::format_bytes(leaked)
            ));
        }
        d
    });
    let mut f = Findings {
        timeline: None,
        fragmentation_at_peak: None,
        fragmentation_at_oom: rec.oom.map(|_| end.clone()),
        fragmentation_series: Vec::new(),
        fragmentation_at_end: end,
        leaks,
        oom,
        replay_note: None,
    };
    if !past_states {
        return f;
    }
    if r.ring.dropped() > 0 {
        f.replay_note = Some(format!(
            "the trace lost its first {} events to the history's bound, so states before the \
             end cannot be rebuilt",
            r.ring.dropped()
        ));
        return f;
    }
    let setup = ReplaySetup::of(a);
    let timeline = match state::timeline(&events, &r.tags, &setup, rec.title, max_samples) {
        Ok(t) => t,
        Err(d) => {
            f.replay_note = Some(d.to_string());
            return f;
        }
    };
    // states to rebuild: the peak and each iteration's end
    let mut points: Vec<(u64, String)> = rec
        .iteration_ends
        .iter()
        .map(|(i, e)| (*e, format!("iter {i} end")))
        .collect();
    if let Some(p) = &timeline.peak {
        points.push((p.event, "peak".into()));
    }
    points.sort();
    let idx: Vec<usize> = points.iter().map(|(e, _)| *e as usize).collect();
    let mut states: Vec<Fragmentation> = Vec::new();
    let replayed = state::replay_states(&events, &setup, &idx, &mut |_, alloc| {
        states.push(analyze_now(alloc));
    });
    if let Err(d) = replayed {
        f.replay_note = Some(d.to_string());
        return f;
    }
    for ((event, at), frag) in points.into_iter().zip(states) {
        if at == "peak" {
            f.fragmentation_at_peak = Some(frag.clone());
        }
        f.fragmentation_series.push(FragPoint::of(at, event, &frag));
    }
    if rec.oom.is_some()
        || f.fragmentation_series
            .last()
            .is_none_or(|p| p.event != last_event)
    {
        let at = if rec.oom.is_some() { "oom" } else { "end" };
        f.fragmentation_series.push(FragPoint::of(
            at.into(),
            last_event,
            &f.fragmentation_at_end,
        ));
    }
    f.timeline = Some(timeline);
    f
}

fn analyze_now(a: &SimAllocator) -> Fragmentation {
    fragmentation::analyze(&a.snapshot())
}
