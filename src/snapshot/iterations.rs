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
    // each allocation: its event, its size, and the bytes made and freed before it
    let mut allocs: Vec<(usize, u64)> = Vec::new();
    let (mut made, mut freed) = (0u64, 0u64);
    let (mut made_before, mut freed_before) = (Vec::new(), Vec::new());
    for (i, e) in events.iter().enumerate() {
        match e.kind() {
            EventKind::Alloc => {
                allocs.push((i, e.size()));
                made_before.push(made);
                freed_before.push(freed);
                made += e.size();
            }
            EventKind::FreeRequested => freed += e.size(),
            _ => {}
        }
    }
    let n = allocs.len();
    if n < 3 * MIN_PERIOD {
        return None;
    }
    let sizes: Vec<u64> = allocs.iter().map(|a| a.1).collect();
    // a candidate period must at least repeat the trace's last allocations
    let w = 32.min(n / 3);
    let tail = &sizes[n - w..];
    let mut period = None;
    // candidates cost a pass each: past WORK passes' worth the search gives up (iterations not
    // found, the report says how to give them), so no trace makes it quadratic
    const WORK: usize = 64;
    let mut work = 0usize;
    for p in MIN_PERIOD..=n / 3 {
        if &sizes[n - w - p..n - p] != tail {
            continue;
        }
        // the longest suffix that repeats with period p, 98% of it at least (past 2% of the
        // longest possible one, no earlier start can qualify)
        let mut mismatches = 0usize;
        let mut from = None;
        for f in (p..n).rev() {
            work += 1;
            if sizes[f] != sizes[f - p] {
                mismatches += 1;
                if mismatches * 100 > (n - p) * 2 {
                    break;
                }
            }
            if mismatches * 100 <= (n - f) * 2 {
                from = Some(f);
            }
        }
        if work > WORK * n {
            tracing::debug!(p, "repetition search stopped: too many candidate periods");
            return None;
        }
        let Some(from) = from else { continue };
        if n - from < (3 * p).max(n / 2) {
            continue;
        }
        // the balance of the repeating part, over whole periods counted back from the end
        let whole = n - (n - from) / p * p;
        let (m, f) = (made - made_before[whole], freed - freed_before[whole]);
        tracing::trace!(p, from, made = m, freed = f, "repetition candidate");
        if f > m + m / 20 {
            continue;
        }
        period = Some(p);
        break;
    }
    let p = period?;
    // the phase: a step starts where its period's allocated level is lowest (the previous
    // step's temporaries freed), found in the last whole period
    let level = |i: usize| made_before[i] as i64 - freed_before[i] as i64;
    let last = (n - p..n).min_by_key(|&i| (level(i), i)).unwrap_or(n - p);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: EventKind, addr: u64, size: u64) -> Event {
        Event::new(kind, addr, size, StackId::ROOT, 0)
    }

    /// Every period matches a trace of equal sizes, and every one fails the balance (each
    /// allocation is followed by a free of twice its size): the search stops after a bounded
    /// number of passes instead of trying all n/3 periods, one pass each.
    #[test]
    fn the_search_is_bounded_when_every_period_is_a_candidate() {
        let n = 100_000u64;
        let mut events = Vec::new();
        for i in 0..n {
            events.push(ev(EventKind::Alloc, i << 12, 512));
            events.push(ev(EventKind::FreeRequested, (n + i) << 12, 1024));
        }
        assert_eq!(iterations_from_repetition(&events), None);
    }

    /// A loop of 6 allocations per step, freed within it, after a setup: the step is found.
    #[test]
    fn a_repeating_step_is_found() {
        let mut events = vec![ev(EventKind::Alloc, 1 << 40, 1 << 20)];
        let mut addr = 0u64;
        for _ in 0..8 {
            let sizes = [512u64, 4096, 512, 65536, 512, 1024];
            let start = addr;
            for s in sizes {
                events.push(ev(EventKind::Alloc, addr, s));
                addr += 1 << 20;
            }
            for (k, s) in sizes.iter().enumerate() {
                events.push(ev(EventKind::FreeRequested, start + ((k as u64) << 20), *s));
            }
        }
        let starts = iterations_from_repetition(&events).expect("found");
        assert_eq!(starts.len(), 8, "{starts:?}");
    }
}
