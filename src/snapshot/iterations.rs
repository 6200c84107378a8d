//! Iterations of a PyTorch snapshot, put in front of each event's stack as an `iter:N` tag:
//! from the `Optimizer.step`/`zero_grad` annotations, from the trace repeating itself as a whole
//! (not the layers within one step: the allocation sizes find a period, the balance of bytes and
//! the Python frames refute layers, and the frames place each pass at its loop's top), or from
//! the calls of a function the user names (`--iteration-marker`). Where repetition gives none,
//! [`NoRepetition`] says why.

use rustc_hash::FxHashMap;

use super::{Annotation, IterationSource, Snapshot};
use crate::trace::{Event, EventKind, StackId, Tags};

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
    if has_own_iterations(s) {
        s.iterations = IterationSource::Tags;
        return;
    }
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
        match iterations_from_repetition(&s.events, &s.tags) {
            Ok(starts) => {
                s.iterations = IterationSource::Repetition;
                (0..s.events.len())
                    .into_par_iter()
                    .map(|i| (starts.partition_point(|&x| x <= i) as u32).saturating_sub(1))
                    .collect()
            }
            Err(why) => {
                // (a snapshot without a trace has nothing to repeat: the report says so)
                s.iterations_why = (!s.events.is_empty()).then_some(why);
                return;
            }
        }
    };
    apply_iterations(s, &iter_of);
}

/// Whether the trace's stacks begin with gpumem's own `iter:N` tags: a gpumem snapshot
/// exported to PyTorch's format (`gpumem export --to memory-viz`) keeps them as its outermost
/// frames (of file `gpumem`), and they are its iterations as in the snapshot it came from.
/// PyTorch's own frames never read so.
fn has_own_iterations(s: &Snapshot) -> bool {
    // (the stacks' outermost tags, not every event's stack: a large trace has millions)
    !s.events.is_empty()
        && s.tags.outermost().any(|t| {
            t.strip_prefix("iter:")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
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
    s.iterations_why = None;
    Ok(n)
}

/// Why the trace's repetition gave no iterations (said in the report, with how to give them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoRepetition {
    /// Too few allocations, or no period repeats over most of the trace.
    NoRepeat,
    /// The search gave up: too many candidate periods to try.
    TooManyCandidates,
    /// A period repeats, but each repeat frees more than it allocates: the layers of a backward
    /// pass.
    Frees { period: usize },
    /// A period repeats, but every repeat is inside one call of a module (`within`: the
    /// innermost frame outside PyTorch's module machinery that the repeat's allocations share,
    /// the call's caller): the layers of one forward.
    Layers { period: usize, within: String },
    /// A period repeats, but each repeat moves a module onto the device (`Module._apply`, from
    /// `.to()`/`.cuda()`, called at `at`): a layer-by-layer loop, not steps of one model.
    Offload { period: usize, at: String },
}

impl NoRepetition {
    /// What the report says, after "iterations not found".
    pub fn explain(&self) -> String {
        let none = "no Optimizer.step/zero_grad annotations";
        let how = "name a function that runs once per iteration with --iteration-marker, e.g. \
                   --iteration-marker train_step";
        match self {
            NoRepetition::NoRepeat => format!(
                "{none}, and the trace does not repeat as a whole (repeats within a step, such \
                 as a model's layers, are not iterations); {how}"
            ),
            NoRepetition::TooManyCandidates => {
                format!("{none}, and too many candidate periods to try; {how}")
            }
            NoRepetition::Frees { period } => format!(
                "{none}; the trace repeats every {period} allocations, but each repeat frees \
                 more than it allocates, as a backward pass's layers do (repeats within a step \
                 are not iterations); {how}"
            ),
            NoRepetition::Layers { period, within } => format!(
                "{none}; the trace repeats every {period} allocations, but each repeat runs \
                 inside one call of a module, called from {within} (its layers or steps within \
                 one forward, not iterations); {how}"
            ),
            NoRepetition::Offload { period, at } => format!(
                "{none}; the trace repeats every {period} allocations, and each repeat moves a \
                 module onto the device (Module._apply, from .to()/.cuda() at {at}), as a \
                 layer-by-layer loop does (layers, not steps of one model); to count those \
                 passes anyway, --iteration-marker {}",
                at.rsplit_once(':').map_or(at.as_str(), |x| x.0)
            ),
        }
    }
}

/// A frame tag, compared by identity: tags are interned, so equal frames are one string (no
/// byte comparison in the searches below).
#[derive(Debug, Clone, Copy)]
struct Frame<'t>(&'t str);

impl PartialEq for Frame<'_> {
    fn eq(&self, o: &Self) -> bool {
        std::ptr::eq(self.0, o.0)
    }
}

/// Where an allocation's stack ends at the shared frames (see [`FrameEvidence::sig`]).
const HERE: Frame<'static> = Frame("(here)");

/// What the Python frames of a trace's allocations say of its repeats.
///
/// Backward passes allocate on autograd's own thread, without Python frames; those allocations
/// are left out. A frame is a `file.py:LINE:function` tag.
struct FrameEvidence<'t> {
    /// Per allocation, its Python frames (outermost first) as an index into `lists`; `None`
    /// without Python frames.
    of: Vec<Option<u32>>,
    lists: Vec<Vec<Frame<'t>>>,
    /// The frames of the last allocation that has any: the reference the common prefixes are
    /// taken of.
    last: Option<u32>,
    /// `common[f]`: how many outermost frames all framed allocations from `f` to the end share
    /// (`usize::MAX` where none from `f` on has frames).
    common: Vec<usize>,
    /// Per allocation: made inside `Module._apply` (`.to()`, `.cuda()` of a module).
    apply_at: Vec<bool>,
}

fn frame_parts(tag: &str) -> Option<(&str, u32, &str)> {
    let mut it = tag.splitn(3, ':');
    let (file, line, name) = (it.next()?, it.next()?, it.next()?);
    file.ends_with(".py").then_some(())?;
    Some((file, line.parse().ok()?, name))
}

/// A frame of `torch.nn.Module.__call__`'s machinery.
fn is_module_call(tag: &str) -> bool {
    matches!(
        frame_parts(tag),
        Some(("module.py", _, "_call_impl" | "_wrapped_call_impl"))
    )
}

fn is_module_apply(tag: &str) -> bool {
    matches!(frame_parts(tag), Some(("module.py", _, "_apply")))
}

impl<'t> FrameEvidence<'t> {
    fn new(events: &[Event], allocs: &[(usize, u64)], tags: &'t Tags) -> Self {
        let mut by_stack: FxHashMap<StackId, Option<u32>> = FxHashMap::default();
        let mut lists: Vec<Vec<Frame<'t>>> = Vec::new();
        let of: Vec<Option<u32>> = allocs
            .iter()
            .map(|&(i, _)| {
                *by_stack.entry(events[i].stack).or_insert_with(|| {
                    let py: Vec<Frame> = tags
                        .resolve(events[i].stack)
                        .into_iter()
                        .filter(|t| frame_parts(t).is_some())
                        .map(Frame)
                        .collect();
                    (!py.is_empty()).then(|| {
                        lists.push(py);
                        (lists.len() - 1) as u32
                    })
                })
            })
            .collect();
        let last = of.iter().rev().find_map(|x| *x);
        let mut common = vec![usize::MAX; of.len() + 1];
        if let Some(r) = last {
            let reference = &lists[r as usize];
            let mut k = usize::MAX;
            for f in (0..of.len()).rev() {
                if let Some(l) = of[f] {
                    let l = &lists[l as usize];
                    let bound = k.min(l.len()).min(reference.len());
                    k = (0..bound).find(|&j| l[j] != reference[j]).unwrap_or(bound);
                }
                common[f] = k;
            }
        }
        let apply: Vec<bool> = lists
            .iter()
            .map(|l| l.iter().any(|t| is_module_apply(t.0)))
            .collect();
        let apply_at = of
            .iter()
            .map(|x| x.is_some_and(|l| apply[l as usize]))
            .collect();
        FrameEvidence {
            of,
            lists,
            last,
            common,
            apply_at,
        }
    }

    fn reference(&self) -> &[Frame<'t>] {
        self.last.map_or(&[], |r| &self.lists[r as usize])
    }

    /// The frames shared by every framed allocation from `from` on (`None` without any).
    fn shared(&self, from: usize) -> Option<&[Frame<'t>]> {
        let k = self.common[from];
        (k != usize::MAX).then(|| &self.reference()[..k])
    }

    /// Why the repeats from `from` on (whole periods of `p` from `whole`) are not iterations,
    /// if the frames say: all inside one module call, or each moving a module to the device.
    fn refutes(&self, p: usize, from: usize, whole: usize) -> Option<NoRepetition> {
        self.shared(from)?;
        let n = self.of.len();
        let periods = || (whole..n).step_by(p).filter(move |s| s + p <= n);
        let not_module = |t: &&Frame| !matches!(frame_parts(t.0), Some(("module.py", _, _)));
        // each repeat inside one call of a module: the frames its allocations share (its own,
        // not the whole part's: the repeats may sit in several calls) hold a module's call. One
        // in ten may not (where one call ends and the next begins within a period)
        let (mut framed, mut inside, mut within) = (0usize, 0usize, None);
        for f in periods().filter_map(|s| self.shared_in(s, s + p)) {
            framed += 1;
            if f.iter().any(|t| is_module_call(t.0)) {
                inside += 1;
                within = f.iter().rev().find(not_module).or(f.last()).copied();
            }
        }
        if framed > 0 && inside * 10 >= framed * 9 {
            if let Some(w) = within {
                return Some(NoRepetition::Layers {
                    period: p,
                    within: w.0.to_string(),
                });
            }
        }
        // each repeat moves one module onto the device (one run of Module._apply's
        // allocations): a layer-by-layer loop. A step that loads many (an offloaded model's
        // layers, one after another) is a step.
        // (runs counted round the period: one may wrap from its end to its start)
        let runs = |s: usize| {
            let before = |a: usize| if a == s { s + p - 1 } else { a - 1 };
            let r = (s..s + p)
                .filter(|&a| self.apply_at[a] && !self.apply_at[before(a)])
                .count();
            if r == 0 && self.apply_at[s] {
                1
            } else {
                r
            }
        };
        if periods().next().is_some() && periods().all(|s| runs(s) == 1) {
            // the caller of the _apply of the last period
            let at = (whole..n)
                .rev()
                .filter(|&a| self.apply_at[a])
                .filter_map(|a| self.of[a])
                .map(|l| &self.lists[l as usize])
                .find_map(|l| {
                    let k = l.iter().position(|t| is_module_apply(t.0))?;
                    l[..k].iter().rev().find(not_module)
                })
                .map_or_else(String::new, |t| t.0.to_string());
            return Some(NoRepetition::Offload { period: p, at });
        }
        None
    }

    /// The frames all framed allocations in `s..e` share (`None` without any).
    fn shared_in(&self, s: usize, e: usize) -> Option<&[Frame<'t>]> {
        let mut lists = self.of[s..e].iter().filter_map(|x| *x);
        let first = &self.lists[lists.next()? as usize];
        let mut k = first.len();
        for l in lists {
            let l = &self.lists[l as usize];
            k = (0..k.min(l.len()))
                .find(|&j| l[j] != first[j])
                .unwrap_or(k.min(l.len()));
        }
        Some(&first[..k])
    }

    /// The loop frame of allocation `a`: its frame at depth `depth` (just below the frames the
    /// repeating part shares), as (file, function, line), when it has one.
    fn loop_frame(&self, a: usize, depth: usize) -> Option<(&'t str, &'t str, u32)> {
        let l = &self.lists[self.of[a]? as usize];
        let (file, line, name) = frame_parts(l.get(depth)?.0)?;
        (l[..depth] == self.reference()[..depth]).then_some((file, name, line))
    }

    /// Where allocation `a` is made, seen from depth `depth`: its frame there, or [`HERE`]
    /// where its stack ends at the shared frames (the shared frame's own line made it); `None`
    /// without Python frames or below other frames.
    fn sig(&self, a: usize, depth: usize) -> Option<Frame<'t>> {
        let l = &self.lists[self.of.get(a).copied().flatten()? as usize];
        let r = self.reference();
        (l.len() >= depth && r.len() >= depth && l[..depth] == r[..depth])
            .then(|| l.get(depth).copied().unwrap_or(HERE))
    }
}

/// Where a loop's pass begins, from the frames: the loop body's first line (the lowest line of
/// the loop frame in the last whole period) where it follows a later line of the same function
/// (the loop went back to its top). Returns that allocation's index.
fn loop_phase(fe: &FrameEvidence, n: usize, p: usize, depth: usize) -> Option<usize> {
    let func = fe.loop_frame(fe.of.iter().rposition(|x| x.is_some())?, depth)?;
    let in_loop = |a: usize| {
        fe.loop_frame(a, depth)
            .filter(|f| f.0 == func.0 && f.1 == func.1)
    };
    // (position, line, previous line)
    let mut best: Option<(usize, u32, u32)> = None;
    let mut prev: Option<u32> = (0..n - p).rev().find_map(&in_loop).map(|f| f.2);
    for a in n - p..n {
        let Some(f) = in_loop(a) else { continue };
        if let Some(before) = prev.filter(|&b| b > f.2) {
            if best.is_none_or(|(_, l, b)| f.2 < l || (f.2 == l && before > b)) {
                best = Some((a, f.2, before));
            }
        }
        prev = Some(f.2);
    }
    best.map(|(a, _, _)| a)
}

/// Iteration starts found from the trace repeating itself (no annotations). A period `p` (in
/// allocations, at least [`MIN_PERIOD`]; the smallest that passes) is taken when:
/// - the allocation sizes repeat with period `p` (98% of them at least) over a suffix of the
///   trace that ends at its end and holds at least three periods (two, when the Python frames
///   show a loop going back to its top at each) and half its allocations (what comes before is
///   setup and a warm-up iteration);
/// - whole periods do not free, on balance, more than they allocate (5% of slack for what a
///   trace's first period frees of the one before): a training or evaluation step keeps its
///   level (or grows, when it leaks), while the layers of a backward pass, which repeat too,
///   each free what their forward made;
/// - where allocations have Python frames: the repeats are not all inside one call of a module
///   (the layers of one forward), and they do not each move a module onto the device (a
///   layer-by-layer loop).
///
/// Starts are every `p` allocations, at the phase where the loop frame (the first frame below
/// those the repeats share) returns to its body's first line; without frames, where the last
/// period's allocated level is lowest (where a step begins). Going back from the end, a period
/// that does not repeat the next one is the warm-up: it and what came before make the first
/// iteration.
pub fn iterations_from_repetition(
    events: &[Event],
    tags: &Tags,
) -> Result<Vec<usize>, NoRepetition> {
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
        return Err(NoRepetition::NoRepeat);
    }
    let fe = FrameEvidence::new(events, &allocs, tags);
    let sizes: Vec<u64> = allocs.iter().map(|a| a.1).collect();
    let level = |i: usize| made_before[i] as i64 - freed_before[i] as i64;
    // a candidate period must at least repeat the trace's last allocations
    let w = 32.min(n / 3);
    let tail = &sizes[n - w..];
    let mut refused = None;
    let mut refuted: Vec<usize> = Vec::new();
    // candidates cost a pass each: past WORK passes' worth the search gives up (iterations not
    // found, the report says how to give them), so no trace makes it quadratic
    const WORK: usize = 64;
    let mut work = 0usize;
    for p in MIN_PERIOD..=n / 2 {
        if n < w + p || sizes[n - w - p..n - p] != *tail {
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
            return Err(refused.unwrap_or(NoRepetition::TooManyCandidates));
        }
        let Some(from) = from else { continue };
        // the repeating part must hold half the allocations and three periods past its first;
        // where there are frames, it may be two periods (`from` and the one before, whose sizes
        // it repeats), each then checked to begin at the loop's top
        let framed = fe.shared(from - p).is_some();
        let region = n - from + p;
        if region < n / 2 || region < if framed { 2 * p } else { 3 * p } {
            continue;
        }
        // the balance of the repeating part, over whole periods counted back from the end
        let whole = n - (n - from) / p * p;
        let (m, f) = (made - made_before[whole], freed - freed_before[whole]);
        tracing::trace!(p, from, made = m, freed = f, "repetition candidate");
        if f > m + m / 20 {
            refused.get_or_insert(NoRepetition::Frees { period: p });
            continue;
        }
        // a multiple of a period the frames refuted repeats the same layers, several at a time
        if refuted.iter().any(|q| p % q == 0) {
            continue;
        }
        if let Some(why) = fe.refutes(p, from - p, whole) {
            tracing::debug!(p, ?why, "repetition refuted by the frames");
            refused.get_or_insert(why);
            refuted.push(p);
            continue;
        }
        // the phase: from the loop frame, or the lowest level of the last whole period
        let depth = fe.shared(from - p).map(<[_]>::len);
        let phase = depth.and_then(|d| loop_phase(&fe, n, p, d));
        let last =
            phase.unwrap_or_else(|| (n - p..n).min_by_key(|&i| (level(i), i)).unwrap_or(n - p));
        let by_frames = depth.and_then(|d| starts_with_frames(&fe, &sizes, p, last, d));
        let starts = match by_frames.clone() {
            Some(v) => v,
            None if region >= 3 * p => {
                let mut v: Vec<usize> = (0..=last / p).rev().map(|m| last - m * p).collect();
                v[0] = 0;
                v
            }
            None => Vec::new(),
        };
        tracing::debug!(
            p,
            ?depth,
            ?phase,
            framed = by_frames.is_some(),
            ?starts,
            "repetition phase"
        );
        if starts.len() < 3 {
            continue;
        }
        return Ok(starts.into_iter().map(|a| allocs[a].0).collect());
    }
    Err(refused.unwrap_or(NoRepetition::NoRepeat))
}

/// Iteration starts (allocation indices, the first 0) at `last` and every `p` before it, as long
/// as a period repeats the next one (90% of sizes equal) and begins where the one at `last`
/// does: where the frames below those the repeats share change to the ones `last` is made
/// under (the loop went back to its top). What comes before the earliest is the first
/// iteration (setup, and the warm-up pass where the loop was entered before it). `None` where
/// `last` is not such a place: the frames do not show the loop.
fn starts_with_frames(
    fe: &FrameEvidence,
    sizes: &[u64],
    p: usize,
    last: usize,
    depth: usize,
) -> Option<Vec<usize>> {
    let sig = |b: usize| fe.sig(b, depth);
    // the allocation, or where it has no frames the next one that has
    let first = |a: usize| (a..(a + p).min(sizes.len())).find(|&b| sig(b).is_some());
    // a pass begins at b: the allocation with frames before it is made elsewhere
    let begins = |b: usize| (b.saturating_sub(p)..b).rev().find_map(sig) != sig(b);
    let b0 = first(last)?;
    let top = sig(b0)?;
    if !begins(b0) {
        return None;
    }
    let at_top = |a: usize| first(a).is_some_and(|b| sig(b) == Some(top) && begins(b));
    let mut starts = vec![last];
    let mut s = last;
    while s >= p {
        let t = s - p;
        let avail = p.min(sizes.len() - s);
        let same = (0..avail).filter(|&k| sizes[t + k] == sizes[s + k]).count();
        if same * 10 < avail * 9 || !at_top(t) {
            break;
        }
        starts.push(t);
        s = t;
    }
    starts.reverse();
    // was the loop entered before the earliest start (a warm-up pass)?
    // (one pass, carrying the last framed allocation's place)
    let mut before = None;
    let mut entered = false;
    for a in 0..starts[0] {
        let here = sig(a);
        if here.is_some() {
            entered |= here == Some(top) && before != here;
            before = here;
        }
    }
    if entered {
        starts.insert(0, 0);
    } else {
        starts[0] = 0;
    }
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
        assert!(iterations_from_repetition(&events, &Tags::default()).is_err());
    }

    /// A stack of Python frames (outermost first), as the snapshot reader makes them.
    fn stack(tags: &mut Tags, frames: &[&str]) -> StackId {
        frames.iter().fold(StackId::ROOT, |s, f| {
            let t = tags.intern(f);
            tags.child(s, t)
        })
    }

    fn evs(kind: EventKind, addr: u64, size: u64, s: StackId) -> Event {
        Event::new(kind, addr, size, s, 0)
    }

    const CALL: [&str; 2] = [
        "module.py:1779:_wrapped_call_impl",
        "module.py:1790:_call_impl",
    ];

    /// One forward of 12 blocks, each freeing what the one before made: the blocks repeat in
    /// balance, but all inside one call of the model, so they are not iterations. The same
    /// sizes from a loop of the script (its last allocation made by the loop itself) are.
    #[test]
    fn layers_inside_one_module_call_are_not_iterations() {
        for inside in [true, false] {
            let mut tags = Tags::default();
            let under = |tags: &mut Tags, line: u32, inner: &[&str]| {
                let mut f: Vec<String> = vec![format!("infer.py:{line}:<module>")];
                if inside {
                    f.extend(CALL.map(String::from));
                    f.push("container.py:250:forward".into());
                }
                f.extend(inner.iter().map(|x| x.to_string()));
                let f: Vec<&str> = f.iter().map(String::as_str).collect();
                stack(tags, &f)
            };
            let lin = under(&mut tags, 31, &[CALL[0], CALL[1], "linear.py:125:forward"]);
            let gelu = under(
                &mut tags,
                31,
                &[CALL[0], CALL[1], "activation.py:734:forward"],
            );
            let last = if inside {
                lin
            } else {
                under(&mut tags, 32, &[])
            };
            let stacks = [lin, gelu, last];
            let s = lin;
            let mut events = vec![evs(EventKind::Alloc, 1 << 40, 2 << 20, s)];
            let mut prev = 1u64 << 40;
            for b in 0..12u64 {
                let base = b << 30;
                events.push(evs(EventKind::Alloc, base, 8 << 20, stacks[0]));
                events.push(evs(EventKind::Alloc, base + (8 << 20), 8 << 20, stacks[1]));
                events.push(evs(EventKind::FreeRequested, base, 8 << 20, s));
                events.push(evs(EventKind::Alloc, base + (16 << 20), 2 << 20, stacks[2]));
                events.push(evs(EventKind::FreeRequested, base + (8 << 20), 8 << 20, s));
                events.push(evs(EventKind::FreeRequested, prev, 2 << 20, s));
                prev = base + (16 << 20);
            }
            let got = iterations_from_repetition(&events, &tags);
            if inside {
                let Err(NoRepetition::Layers { within, .. }) = &got else {
                    panic!("{got:?}")
                };
                assert_eq!(within, "container.py:250:forward");
                assert!(got
                    .unwrap_err()
                    .explain()
                    .contains("container.py:250:forward"));
            } else {
                assert!(got.is_ok(), "{got:?}");
            }
        }
    }

    /// A layer-by-layer loop: each pass moves a block onto the device (`.cuda()`), runs it and
    /// frees it all. The passes are layers, and the report names the line to mark to count
    /// them anyway.
    #[test]
    fn passes_that_move_a_module_onto_the_device_are_layers() {
        let mut tags = Tags::default();
        let load = stack(
            &mut tags,
            &[
                "calib.py:70:<module>",
                "calib.py:20:run",
                "module.py:1050:cuda",
                "module.py:900:_apply",
            ],
        );
        let run = stack(
            &mut tags,
            &["calib.py:70:<module>", "calib.py:21:run", CALL[0], CALL[1]],
        );
        let mut events = Vec::new();
        for pass in 0..10u64 {
            let base = pass << 32;
            let sizes = [
                (load, 16u64 << 20),
                (load, 16 << 10),
                (run, 8 << 20),
                (run, 2 << 20),
            ];
            for (k, (s, size)) in sizes.iter().enumerate() {
                events.push(evs(EventKind::Alloc, base + ((k as u64) << 24), *size, *s));
            }
            for (k, (s, size)) in sizes.iter().enumerate() {
                events.push(evs(
                    EventKind::FreeRequested,
                    base + ((k as u64) << 24),
                    *size,
                    *s,
                ));
            }
        }
        let got = iterations_from_repetition(&events, &tags);
        let Err(why @ NoRepetition::Offload { .. }) = &got else {
            panic!("{got:?}")
        };
        assert!(
            why.explain().contains("--iteration-marker calib.py:20"),
            "{}",
            why.explain()
        );
    }

    /// A model whose forward loops over steps (as a neural cellular automaton does), called
    /// twice from two lines of the script: the repeats sit in two calls, but each repeat is
    /// inside one, so they are not iterations.
    #[test]
    fn repeats_inside_two_calls_of_a_module_are_layers() {
        let mut tags = Tags::default();
        let mut events = Vec::new();
        let mut addr = 0u64;
        for (line, steps) in [(86, 40), (93, 20)] {
            let caller = format!("infer.py:{line}:<module>");
            let a = stack(
                &mut tags,
                &[&caller, CALL[0], CALL[1], "nca.py:104:forward"],
            );
            let b = stack(
                &mut tags,
                &[&caller, CALL[0], CALL[1], "nca.py:106:forward"],
            );
            for _ in 0..steps {
                let sizes = [(a, 4u64 << 20), (a, 1 << 20), (b, 4 << 20), (b, 512)];
                for (s, size) in sizes {
                    addr += 1 << 24;
                    events.push(evs(EventKind::Alloc, addr, size, s));
                }
                for (k, (s, size)) in sizes.iter().enumerate() {
                    let at = addr - ((3 - k as u64) << 24);
                    events.push(evs(EventKind::FreeRequested, at, *size, *s));
                }
            }
        }
        let got = iterations_from_repetition(&events, &tags);
        assert!(matches!(got, Err(NoRepetition::Layers { .. })), "{got:?}");
    }

    /// An offloaded model's step loads each of its 3 layers onto the device in turn (3 runs
    /// of `Module._apply` per repeat) and ends at the loop's own line: the repeats are steps,
    /// not one layer each.
    #[test]
    fn a_step_that_loads_several_layers_is_a_step() {
        let mut tags = Tags::default();
        let load = stack(
            &mut tags,
            &[
                "serve.py:40:<module>",
                CALL[0],
                CALL[1],
                "hooks.py:9:pre_forward",
                "module.py:1050:to",
                "module.py:900:_apply",
            ],
        );
        let run = stack(
            &mut tags,
            &[
                "serve.py:40:<module>",
                CALL[0],
                CALL[1],
                "linear.py:125:forward",
            ],
        );
        let out = stack(&mut tags, &["serve.py:41:<module>"]);
        let mut events = Vec::new();
        let mut addr = 0u64;
        let mut firsts = Vec::new();
        for _ in 0..5 {
            firsts.push(events.len());
            let mut made = Vec::new();
            for layer in 0..3u64 {
                for (s, size) in [
                    (load, 16u64 << 20),
                    (load, 16 << 10),
                    (run, (8 + layer) << 20),
                ] {
                    addr += 1 << 24;
                    events.push(evs(EventKind::Alloc, addr, size, s));
                    made.push((addr, size, s));
                }
            }
            addr += 1 << 24;
            events.push(evs(EventKind::Alloc, addr, 2048, out));
            made.push((addr, 2048, out));
            for (a, size, s) in made {
                events.push(evs(EventKind::FreeRequested, a, size, s));
            }
        }
        let starts = iterations_from_repetition(&events, &tags).expect("found");
        assert_eq!(starts, firsts);
    }

    /// An evaluation loop that keeps what it makes (a leak), after a setup, whose first pass
    /// makes two more allocations (a workspace): the passes begin at the loop's first line, the
    /// warm-up pass and the setup make the first iteration, and three passes are enough.
    #[test]
    fn a_growing_loop_is_cut_at_its_top() {
        let mut tags = Tags::default();
        let setup = stack(&mut tags, &["eval.py:50:<module>", "eval.py:10:build"]);
        let fwd = stack(&mut tags, &["eval.py:52:<module>", CALL[0], CALL[1]]);
        let loss = stack(&mut tags, &["eval.py:53:<module>"]);
        let mut events = Vec::new();
        let mut addr = 0u64;
        let mut alloc = |events: &mut Vec<Event>, size: u64, s: StackId| {
            addr += 1 << 24;
            events.push(evs(EventKind::Alloc, addr, size, s));
            addr
        };
        for _ in 0..5 {
            alloc(&mut events, 4 << 20, setup);
        }
        let mut firsts = Vec::new();
        for pass in 0..4 {
            firsts.push(events.len());
            let mut sizes = vec![8u64 << 20, 8 << 20, 2 << 20, 8 << 20, 8 << 20, 2 << 20];
            if pass == 0 {
                sizes.splice(1..1, [32 << 20, 1 << 20]);
            }
            for size in sizes {
                alloc(&mut events, size, fwd);
            }
            let t = alloc(&mut events, 2 << 20, loss);
            alloc(&mut events, 512, loss);
            events.push(evs(EventKind::FreeRequested, t, 2 << 20, loss));
        }
        let starts = iterations_from_repetition(&events, &tags).expect("found");
        assert_eq!(starts, vec![0, firsts[1], firsts[2], firsts[3]]);
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
        let starts = iterations_from_repetition(&events, &Tags::default()).expect("found");
        assert_eq!(starts.len(), 8, "{starts:?}");
    }
}
