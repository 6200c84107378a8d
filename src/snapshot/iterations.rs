//! Iterations of a PyTorch snapshot, put in front of each event's stack as an `iter:N` tag:
//! from the `Optimizer.step`/`zero_grad` annotations, from the trace repeating itself as a whole
//! (not the layers within one step), or from the calls of a function the user names
//! (`--iteration-marker`).

use rustc_hash::FxHashMap;

use super::{Annotation, IterationSource, Snapshot};
use crate::trace::{Event, EventKind, StackId};

/// The end of each iteration as a time: after each `Optimizer.zero_grad` (or, without those,
/// each `Optimizer.step`) annotation ends.
fn annotation_boundaries(a: &[Annotation]) -> Vec<u64> {
    let ends = |prefix: &str| -> Vec<u64> {
        a.iter()
            .filter(|x| x.stage == "END" && x.name.starts_with(prefix))
            .map(|x| x.time_us)
            .collect()
    };
    let z = ends("Optimizer.zero_grad");
    if !z.is_empty() {
        return z;
    }
    ends("Optimizer.step")
}

/// Finds iterations and puts an `iter:N` tag in front of each event's stack.
pub(super) fn tag_iterations(s: &mut Snapshot) {
    use rayon::prelude::*;
    let mut bounds = annotation_boundaries(&s.annotations);
    bounds.sort();
    let by_time = !bounds.is_empty() && s.times.par_iter().any(|t| *t > 0);
    let iter_of: Vec<u32> = if by_time {
        s.iterations = IterationSource::Annotations;
        s.times
            .par_iter()
            .map(|t| bounds.partition_point(|b| b < t) as u32)
            .collect()
    } else {
        match iterations_from_repetition(&s.events) {
            Some(starts) => {
                s.iterations = IterationSource::Repetition;
                (0..s.events.len())
                    .into_par_iter()
                    .map(|i| (starts.partition_point(|&x| x <= i) as u32).saturating_sub(1))
                    .collect()
            }
            None => return,
        }
    };
    apply_iterations(s, &iter_of);
}

/// Puts `iter:N` (N = `iter_of[i]`) in front of each event's stack, in place of an `iter:` tag
/// already there.
fn apply_iterations(s: &mut Snapshot, iter_of: &[u32]) {
    use rayon::prelude::*;
    // the distinct (iteration, stack) pairs, each made a stack once, in the order they first
    // occur (so tags are numbered as a sequential pass would number them)
    type Firsts = FxHashMap<(u32, StackId), usize>;
    let firsts: Firsts = s
        .events
        .par_iter()
        .zip(iter_of.par_iter())
        .enumerate()
        .fold(Firsts::default, |mut m, (i, (e, it))| {
            m.entry((*it, e.stack)).or_insert(i);
            m
        })
        .reduce(Firsts::default, |mut a, b| {
            for (k, i) in b {
                let x = a.entry(k).or_insert(i);
                *x = (*x).min(i);
            }
            a
        });
    let mut pairs: Vec<((u32, StackId), usize)> = firsts.into_iter().collect();
    pairs.sort_by_key(|p| p.1);
    let mut cache: FxHashMap<(u32, StackId), StackId> = FxHashMap::default();
    for ((it, stack), _) in pairs {
        let mut tags: Vec<String> = s
            .tags
            .resolve(stack)
            .into_iter()
            .map(String::from)
            .collect();
        if tags.first().is_some_and(|t| t.starts_with("iter:")) {
            tags.remove(0);
        }
        let t = s.tags.intern(&format!("iter:{it}"));
        let mut id = s.tags.child(StackId::ROOT, t);
        for tag in tags {
            let t = s.tags.intern(&tag);
            id = s.tags.child(id, t);
        }
        cache.insert((it, stack), id);
    }
    s.events
        .par_iter_mut()
        .zip(iter_of.par_iter())
        .for_each(|(e, it)| {
            let stack = cache[&(*it, e.stack)];
            *e = Event::new(e.kind(), e.addr, e.size(), stack, e.stream);
        });
}

/// Iterations from a frame the user names (`--iteration-marker`): one starts at each
/// allocation made inside a call of `marker` (a function name such as `train_step`, or
/// `file.py:LINE`) right after one made outside it; what comes before the first call belongs
/// to the first iteration. Returns how many were found.
pub fn iterations_from_marker(s: &mut Snapshot, marker: &str) -> Result<u32, String> {
    let marker = marker.trim();
    if marker.is_empty() {
        return Err("is empty: give a function name, e.g. --iteration-marker train_step".into());
    }
    let frame_matches = |tag: &str| {
        let base = tag.rsplit(['/', '\\']).next().unwrap_or(tag);
        base == marker
            || base.rsplit(':').next() == Some(marker)
            || base.starts_with(&format!("{marker}:"))
    };
    let mut inside: FxHashMap<StackId, bool> = FxHashMap::default();
    let mut iter_of = Vec::with_capacity(s.events.len());
    let (mut n, mut prev) = (0u32, false);
    for e in &s.events {
        if e.kind() == EventKind::Alloc {
            let has = *inside
                .entry(e.stack)
                .or_insert_with(|| s.tags.resolve(e.stack).into_iter().any(&frame_matches));
            if has && !prev {
                n += 1;
            }
            prev = has;
        }
        iter_of.push(n.saturating_sub(1));
    }
    if n == 0 {
        let example = s
            .events
            .iter()
            .find(|e| e.kind() == EventKind::Alloc)
            .and_then(|e| {
                s.tags
                    .resolve(e.stack)
                    .into_iter()
                    .find(|t| t.contains(".py:"))
            })
            .map(|t| format!(" (frames look like {t})"))
            .unwrap_or_default();
        return Err(format!(
            "no allocation of the trace is made inside '{marker}'{example}"
        ));
    }
    apply_iterations(s, &iter_of);
    s.iterations = IterationSource::Marker;
    Ok(n)
}

/// Iteration starts found from the trace repeating itself (no annotations). A period `p` (in
/// allocations, at least [`MIN_PERIOD`]; the smallest that passes) is taken when:
/// - the allocation sizes repeat with period `p` (98% of them at least) over a suffix of the
///   trace that ends at its end and holds at least three periods and half its allocations (what
///   comes before is setup and a warm-up iteration);
/// - whole periods do not free, on balance, more than they allocate (5% of slack for what a
///   trace's first period frees of the one before): a training or evaluation step keeps its
///   level (or grows, when it leaks), while the layers of a backward pass, which repeat too,
///   each free what their forward made.
///
/// Starts are every `p` allocations, at the phase where the last period's allocated level is
/// lowest (where a step begins); the first iteration takes whatever came before.
pub fn iterations_from_repetition(events: &[Event]) -> Option<Vec<usize>> {
    let allocs: Vec<(usize, u64)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind() == EventKind::Alloc)
        .map(|(i, e)| (i, e.size()))
        .collect();
    let n = allocs.len();
    if n < 3 * MIN_PERIOD {
        return None;
    }
    let sizes: Vec<u64> = allocs.iter().map(|a| a.1).collect();
    // a candidate period must at least repeat the trace's last allocations
    let w = 32.min(n / 3);
    let tail = &sizes[n - w..];
    let mut period = None;
    'candidates: for p in MIN_PERIOD..=n / 3 {
        if &sizes[n - w - p..n - p] != tail {
            continue;
        }
        // the longest suffix that repeats with period p, 98% of it at least
        let mut mismatches = 0usize;
        let mut from = None;
        for f in (p..n).rev() {
            if sizes[f] != sizes[f - p] {
                mismatches += 1;
            }
            if mismatches * 100 <= (n - f) * 2 {
                from = Some(f);
            }
        }
        let Some(from) = from else { continue };
        if n - from < (3 * p).max(n / 2) {
            continue;
        }
        // the balance of the repeating part, over whole periods counted back from the end
        let whole = n - (n - from) / p * p;
        let (mut made, mut freed) = (0u64, 0u64);
        for e in &events[allocs[whole].0..] {
            match e.kind() {
                EventKind::Alloc => made += e.size(),
                EventKind::FreeRequested => freed += e.size(),
                _ => {}
            }
        }
        tracing::trace!(p, from, made, freed, "repetition candidate");
        if freed > made + made / 20 {
            continue 'candidates;
        }
        period = Some(p);
        break;
    }
    let p = period?;
    // the phase: a step starts where its period's allocated level is lowest (the previous
    // step's temporaries freed), found in the last whole period
    let mut level = 0i64;
    let mut before = Vec::with_capacity(n);
    for e in events {
        match e.kind() {
            EventKind::Alloc => {
                before.push(level);
                level += e.size() as i64;
            }
            EventKind::FreeRequested => level -= e.size() as i64,
            _ => {}
        }
    }
    let last = (n - p..n).min_by_key(|&i| (before[i], i)).unwrap_or(n - p);
    let mut starts: Vec<usize> = (0..=last / p).map(|m| allocs[last - m * p].0).collect();
    starts.reverse();
    if starts.len() < 3 {
        return None;
    }
    starts[0] = 0;
    Some(starts)
}

/// The fewest allocations an iteration found from repetition may have (fewer repeat by
/// chance: a run of equal sizes).
const MIN_PERIOD: usize = 4;
