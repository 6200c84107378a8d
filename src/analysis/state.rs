//! The allocator's state at any moment of a trace, by replaying the trace's allocations and
//! frees through the same allocator policy with the same settings.
//!
//! A trace records requests and their addresses, not block sizes or the segments' block
//! lists; those follow from the policy. The replay asks a fresh allocator for the same
//! requests in the same order and checks that every recorded block is one it can name, so
//! the state it shows is the state the run had. Everything derived here (the category
//! timeline, the segments at the peak, at each iteration's end, at an OOM) is a pure
//! function of the trace and the settings.

use rustc_hash::FxHashMap;

use super::stacks::{Annotator, When};
use super::timeline::{IterationMark, OomMark, PeakMark, Sample, Timeline};
use crate::alloc::{AllocConf, SegmentSource, SimAllocator, SimSource};
use crate::trace::{Event, EventKind, Tags};

/// What a replay needs to rebuild the allocator the trace was recorded on.
#[derive(Debug, Clone)]
pub struct ReplaySetup {
    pub conf: AllocConf,
    /// The device's total memory.
    pub total: u64,
    /// What the CUDA context holds of it.
    pub overhead: u64,
}

impl ReplaySetup {
    /// The setup of an allocator on the simulated device.
    pub fn of(a: &SimAllocator) -> Self {
        let total = a.source().device_total();
        ReplaySetup {
            conf: a.conf().clone(),
            total,
            overhead: total - a.source().capacity(),
        }
    }

    fn allocator(&self) -> SimAllocator {
        let mut a = SimAllocator::new(self.conf.clone(), SimSource::new(self.total, self.overhead));
        a.recorder_mut().enabled = false;
        a
    }
}

/// The replay did not reproduce the trace: it was recorded with other settings, or lost
/// events (a bounded history), or is not an allocator trace at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diverged {
    pub event: usize,
    pub what: String,
}

impl std::fmt::Display for Diverged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the trace does not replay at event {}: {}",
            self.event, self.what
        )
    }
}

/// The fixed stacking order of categories, bottom first (persistent ones below transient); "other" takes allocations whose
/// stack names no category.
pub const CATEGORIES: [&str; 9] = [
    // what lives through the run below what comes and goes
    "parameter",
    "optimizer_state",
    "kv_cache",
    "gradient",
    "input",
    "activation",
    "temporary",
    "workspace",
    "other",
];

fn category_index(name: Option<&str>) -> usize {
    name.and_then(|n| CATEGORIES.iter().position(|c| *c == n))
        .unwrap_or(CATEGORIES.len() - 1)
}

/// A trace being replayed: the allocator and, per live block, its size and category.
struct Replay<'a> {
    a: SimAllocator,
    /// Recorded address → (replayed address, block bytes, category index).
    live: FxHashMap<u64, (u64, u64, usize)>,
    by_category: [u64; CATEGORIES.len()],
    ann: Option<Annotator<'a>>,
}

impl Replay<'_> {
    /// Applies event `i`; returns whether allocated or reserved memory may have changed.
    fn step(&mut self, i: usize, e: &Event) -> Result<bool, Diverged> {
        let diverged = |what: String| Diverged { event: i, what };
        match e.kind() {
            EventKind::Alloc => {
                let before = self.a.stats().allocated_bytes.all().current;
                let addr = self.a.malloc(e.size(), e.stream).map_err(|o| {
                    diverged(format!(
                        "the recorded allocation of {} bytes fails on replay ({o})",
                        e.size()
                    ))
                })?;
                let block = (self.a.stats().allocated_bytes.all().current - before) as u64;
                let cat = match &mut self.ann {
                    Some(ann) => category_index(ann.meta(e.stack).category.as_deref()),
                    None => CATEGORIES.len() - 1,
                };
                self.by_category[cat] += block;
                if self.live.insert(e.addr, (addr, block, cat)).is_some() {
                    return Err(diverged(format!(
                        "address {:#x} is allocated twice without a free",
                        e.addr
                    )));
                }
                Ok(true)
            }
            EventKind::FreeRequested => {
                let (addr, block, cat) = self.live.remove(&e.addr).ok_or_else(|| {
                    diverged(format!("a free of {:#x}, which is not allocated", e.addr))
                })?;
                self.by_category[cat] -= block;
                self.a
                    .free(addr)
                    .map_err(|p| diverged(format!("a free the allocator refuses: {p:?}")))?;
                Ok(true)
            }
            EventKind::EmptyCache => {
                self.a.empty_cache();
                Ok(true)
            }
            EventKind::Oom => {
                // the failed request (its rounded size); the allocator frees its cache first
                match self.a.malloc(e.size(), e.stream) {
                    Err(_) => Ok(true),
                    Ok(_) => Err(diverged(format!(
                        "a request of {} bytes that ran out of memory succeeds on replay",
                        e.size()
                    ))),
                }
            }
            EventKind::Retag => {
                if let (Some(ann), Some(entry)) = (&mut self.ann, self.live.get_mut(&e.addr)) {
                    let cat = category_index(ann.meta(e.stack).category.as_deref());
                    self.by_category[entry.2] -= entry.1;
                    self.by_category[cat] += entry.1;
                    entry.2 = cat;
                }
                Ok(true)
            }
            // the allocator makes its own segment and completion events
            EventKind::FreeCompleted
            | EventKind::SegmentAlloc
            | EventKind::SegmentFree
            | EventKind::SegmentMap
            | EventKind::SegmentUnmap => Ok(false),
        }
    }
}

/// Replays `events` and calls `at(i, allocator)` right after event `i`, for each `i` in
/// `points` (ascending; an index past the end is never reached). Returns the allocator after
/// the last event.
pub fn replay_states(
    events: &[Event],
    setup: &ReplaySetup,
    points: &[usize],
    at: &mut dyn FnMut(usize, &SimAllocator),
) -> Result<SimAllocator, Diverged> {
    let mut r = Replay {
        a: setup.allocator(),
        live: FxHashMap::default(),
        by_category: [0; CATEGORIES.len()],
        ann: None,
    };
    let mut next = points.iter().peekable();
    for (i, e) in events.iter().enumerate() {
        r.step(i, e)?;
        while next.peek().is_some_and(|p| **p <= i) {
            at(i, &r.a);
            next.next();
        }
    }
    Ok(r.a)
}

/// Allocated memory by category and reserved memory over the trace, with iteration starts,
/// the peak and OOMs. At most `max_samples` points are kept (at least 2).
pub fn timeline(
    events: &[Event],
    tags: &Tags,
    setup: &ReplaySetup,
    title: &str,
    max_samples: usize,
) -> Result<Timeline, Diverged> {
    let mut r = Replay {
        a: setup.allocator(),
        live: FxHashMap::default(),
        by_category: [0; CATEGORIES.len()],
        ann: Some(Annotator::new(tags)),
    };
    let mut samples: Vec<Sample> = Vec::new();
    let iterations = match &mut r.ann {
        Some(ann) => iteration_marks(events, ann),
        None => Vec::new(),
    };
    let ooms = oom_marks(events);
    let mut peak: Option<(usize, u64)> = None;
    for (i, e) in events.iter().enumerate() {
        if !r.step(i, e)? {
            continue;
        }
        let s = Sample {
            event: i as u64,
            by_category: r.by_category.to_vec(),
            reserved: r.a.reserved(),
        };
        let total = s.allocated();
        if peak.is_none_or(|(_, p)| total > p) {
            peak = Some((samples.len(), total));
        }
        samples.push(s);
    }
    let peak_mark = peak.map(|(i, b)| PeakMark {
        event: samples[i].event,
        allocated: b,
    });
    let samples = thin(samples, max_samples.max(2));
    Ok(Timeline {
        title: title.to_string(),
        categories: CATEGORIES.iter().map(|c| c.to_string()).collect(),
        samples,
        iterations,
        peak: peak_mark,
        ooms,
        capacity: Some(setup.total),
    })
}

/// Keeps at most `max` samples by cutting the event axis into `max - 1` equal buckets: a
/// bucket's point starts where its first sample is and carries its highest allocated sample
/// (and highest reserved), so a one-event spike such as the peak stays as tall as it was and
/// at least one bucket wide when drawn. The last sample is kept as it is.
fn thin(samples: Vec<Sample>, max: usize) -> Vec<Sample> {
    if samples.len() <= max {
        return samples;
    }
    let (first, last) = (samples[0].event, samples[samples.len() - 1].event);
    let buckets = (max - 1) as u64;
    let span = (last - first).max(1);
    let bucket_of = |e: u64| ((e - first) as u128 * buckets as u128 / span as u128) as u64;
    let mut out: Vec<Sample> = Vec::with_capacity(max);
    let mut current: Option<(u64, Sample)> = None;
    let n = samples.len();
    for (i, s) in samples.into_iter().enumerate() {
        if i == n - 1 {
            if let Some((_, c)) = current.take() {
                out.push(c);
            }
            out.push(s);
            break;
        }
        let b = bucket_of(s.event);
        match &mut current {
            Some((cb, c)) if *cb == b => {
                let reserved = c.reserved.max(s.reserved);
                if s.allocated() > c.allocated() {
                    c.by_category = s.by_category;
                }
                c.reserved = reserved;
            }
            _ => {
                if let Some((_, c)) = current.take() {
                    out.push(c);
                }
                current = Some((b, s));
            }
        }
    }
    out
}

/// A timeline from a trace that does not start at the process's start (a PyTorch snapshot):
/// allocated memory walked through the trace (block sizes as [`super::blocks::Sizer`] gives
/// them) and anchored at the state the segments hold at its end, stacked by the `top` sites
/// holding most at the peak (innermost Python frame, or the category where the stacks have
/// one), the rest as "other", and what was allocated before the trace as its own band.
pub fn timeline_from_trace(
    segments: &[crate::alloc::SegmentInfo],
    events: &[Event],
    tags: &Tags,
    conf: &AllocConf,
    title: &str,
    top: usize,
    max_samples: usize,
) -> Timeline {
    use crate::alloc::BlockState;
    let mut ann = Annotator::new(tags);
    // a band per stack: its category, or its innermost Python frame
    let mut band_of_stack: FxHashMap<crate::trace::StackId, String> = FxHashMap::default();
    let mut band = |s: crate::trace::StackId, ann: &mut Annotator<'_>| -> String {
        band_of_stack
            .entry(s)
            .or_insert_with(|| {
                let m = ann.meta(s);
                if let Some(c) = &m.category {
                    return c.clone();
                }
                m.site
                    .rsplit('/')
                    .find(|t| super::stacks::is_python_frame(t))
                    .map(String::from)
                    .unwrap_or_else(|| super::stacks::NO_PYTHON_FRAMES.into())
            })
            .clone()
    };
    // first pass: block sizes and each band's bytes, to find the bands worth drawing
    let mut sizer = super::blocks::Sizer::new(conf);
    let mut live: FxHashMap<u64, (u64, String)> = FxHashMap::default();
    let mut cur: FxHashMap<String, i64> = FxHashMap::default();
    // (event, bytes by band, reserved relative to the trace's start)
    type Row = (u64, Vec<(String, i64)>, i64);
    let mut rows: Vec<Row> = Vec::new();
    let (mut total, mut reserved) = (0i64, 0i64);
    let mut best: (i64, usize) = (i64::MIN, 0);
    for (i, e) in events.iter().enumerate() {
        let size = sizer.step(e);
        match (e.kind(), size) {
            (EventKind::Alloc, Some(b)) => {
                let name = band(e.stack, &mut ann);
                *cur.entry(name.clone()).or_default() += b as i64;
                total += b as i64;
                live.insert(e.addr, (b, name));
            }
            (EventKind::FreeRequested, Some(b)) => {
                let (b, name) = live
                    .remove(&e.addr)
                    .unwrap_or((b, super::profile::BEFORE_TRACE.into()));
                *cur.entry(name).or_default() -= b as i64;
                total -= b as i64;
            }
            (EventKind::SegmentAlloc | EventKind::SegmentMap, _) => reserved += e.size() as i64,
            (EventKind::SegmentFree | EventKind::SegmentUnmap, _) => reserved -= e.size() as i64,
            _ => continue,
        }
        if total > best.0 {
            best = (total, rows.len());
        }
        rows.push((
            i as u64,
            cur.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            reserved,
        ));
    }
    let end_alloc: i64 = segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| b.size as i64)
        .sum();
    let end_res: i64 = segments.iter().map(|s| s.total_size as i64).sum();
    let before = (end_alloc - total).max(0);
    let res0 = (end_res - reserved).max(0);
    // the bands: the biggest at the peak
    let mut at_peak: Vec<(String, i64)> = rows
        .get(best.1)
        .map(|r| r.1.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, v)| *v > 0 && k != super::profile::BEFORE_TRACE)
        .collect();
    at_peak.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut categories: Vec<String> = vec![super::profile::BEFORE_TRACE.into()];
    categories.extend(at_peak.iter().take(top).map(|(k, _)| k.clone()));
    categories.push("other".into());
    let n = categories.len();
    let index: FxHashMap<&str, usize> = categories
        .iter()
        .enumerate()
        .map(|(i, c)| (c.as_str(), i))
        .collect();
    let mut samples = Vec::with_capacity(rows.len());
    let mut peak: Option<(usize, u64)> = None;
    for (event, bands, r) in &rows {
        let mut by = vec![0u64; n];
        by[0] = before as u64;
        for (k, v) in bands {
            let i = index.get(k.as_str()).copied().unwrap_or(n - 1);
            if i == 0 {
                // what was allocated before the trace shrinks as the trace frees it
                by[0] = (before + *v).max(0) as u64;
            } else {
                by[i] += (*v).max(0) as u64;
            }
        }
        let s = Sample {
            event: *event,
            by_category: by,
            reserved: (res0 + r).max(0) as u64,
        };
        if peak.is_none_or(|(_, p)| s.allocated() > p) {
            peak = Some((samples.len(), s.allocated()));
        }
        samples.push(s);
    }
    let peak_mark = peak.map(|(i, b)| PeakMark {
        event: samples[i].event,
        allocated: b,
    });
    let iterations = iteration_marks(events, &mut ann);
    let ooms = oom_marks(events);
    Timeline {
        title: title.to_string(),
        categories,
        samples: thin(samples, max_samples.max(2)),
        iterations,
        peak: peak_mark,
        ooms,
        capacity: None,
    }
}

/// Where each iteration starts: its first allocation (iterations from the stacks' `iter:N`).
fn iteration_marks(events: &[Event], ann: &mut Annotator) -> Vec<IterationMark> {
    let mut marks = Vec::new();
    let mut seen: Option<u32> = None;
    for (i, e) in events.iter().enumerate() {
        if e.kind() != EventKind::Alloc {
            continue;
        }
        if let When::Iteration(n) = ann.meta(e.stack).when {
            if seen.is_none_or(|s| n > s) {
                seen = Some(n);
                marks.push(IterationMark {
                    label: format!("iter {n}"),
                    event: i as u64,
                });
            }
        }
    }
    marks
}

/// The out-of-memory entries of a trace.
fn oom_marks(events: &[Event]) -> Vec<OomMark> {
    events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind() == EventKind::Oom)
        .map(|(i, e)| OomMark {
            event: i as u64,
            requested: e.size(),
        })
        .collect()
}
