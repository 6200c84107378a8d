//! Fast-forwarding a generation: its decode steps replayed on the allocator alone, exactly.
//!
//! A greedy generation's decode steps make the same calls in the same order, step after step;
//! only the sizes that hold the context grow, by the same bytes each step (the KV cache's
//! `torch.cat`, the ids, the attention mask). [`Template::infer`] reads that shape from the
//! logs of a few consecutive steps ([`CachingAllocator::take_step_log`]): each malloc's size
//! at the last step and its growth per step, and for each free which malloc it frees, of the
//! same step or one of the few before (the model inputs of a step hold the attention mask of
//! the step before until the next step drops them). [`drive`] then plays the steps on the allocator without the
//! engine: the same mallocs and frees, so the same blocks, segments, peaks and out-of-memory,
//! to the byte.
//!
//! That is still every allocator call of every step: a 7B model's step makes about 1,900
//! mallocs, nearly all of them in the small pool and of sizes that do not grow. So the small
//! pool is skipped where it provably repeats itself. Once the pool's state at each of the
//! last steps' ends equals its state `P` steps earlier (P up to 24: a block freed and taken
//! back alternates between two addresses, others among three; over as many steps as a free reaches back, so the
//! blocks it frees are the period's too), and no small request has changed its rounded size
//! since, the next steps run on the pool exactly as those `P` did: the same blocks at the same addresses, no
//! new segment, and the pool back in the same state after each `P` steps. The pools share
//! nothing else (a miss in the large pool that finds a new segment does not touch the small
//! one), so in those steps only the large pool's calls are made, and the peak of allocated
//! memory is taken from the small pool's recorded highs between them. The one call that does
//! touch both pools is the out-of-memory path's release of every cached segment: a large
//! request that would get there ([`CachingAllocator::malloc_guarded`]) first brings the small
//! pool to where it stands at that point of the step (its calls replayed), and the step goes
//! on in full. A small request that changes its rounded size (the ids grow by 512 bytes every
//! 64 tokens at batch 1) also ends the skipping until the pool repeats again.
//!
//! Steps played in full skip the small pool's calls of most of their layers the same way,
//! one level down ([`blocks`]): the layers make the same calls, and once the pool repeats
//! from layer to layer the later layers need only their large-pool calls.
//!
//! Nothing here knows what a step computes: the runner tells, from the generated script,
//! where steps of one shape run to the end of the generation (`token_done(until=N)`), and
//! `fit --param new_tokens` asks for it ([`crate::runner::RunOptions::fast_forward`]). After
//! a drive the engine's storages that outlive the last step are moved to their blocks
//! ([`Drive::moved`]) and the script goes on after the loop; what it does next may only free
//! them (their shapes are the last observed step's), which `fit` checks first.

mod blocks;

use std::collections::VecDeque;
use std::time::Instant;

use rustc_hash::FxHashMap;

use super::caching::{CachingAllocator, StepEvent, StreamId};
use super::source::SegmentSource;
use super::stats::PoolKind;
use super::OutOfMemory;
use crate::trace::StackId;

/// How many consecutive steps' logs [`Template::infer`] wants: the first [`MAX_BACK`] only
/// say which malloc a later free frees; the other four must agree.
pub const STEPS_TO_INFER: usize = MAX_BACK + 4;

/// The most steps a free may reach back: a malloc of step `k` freed in step `k + MAX_BACK`.
pub const MAX_BACK: usize = 4;

/// Steps between two looks at the clock.
const CLOCK_EVERY: u64 = 256;

/// The longest period of the small pool's state looked for (a 7B model's decode steps
/// repeat every 6 early on: blocks alternating in twos and in threes; longer periods later,
/// or none while its ids and masks of a few hundred KiB shuffle among three segments).
const MAX_PERIOD: usize = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// The step's `j`-th malloc.
    Malloc(u32),
    /// Frees the `j`-th malloc of the step `back` steps before (0: this one).
    Free { back: u8, j: u32 },
}

/// One decode step's calls, with each malloc's size as an affine function of the step.
#[derive(Debug, Clone)]
pub struct Template {
    calls: Vec<Call>,
    /// Per malloc: its size at the last observed step, its growth per step, its stream.
    size: Vec<u64>,
    growth: Vec<u64>,
    stream: Vec<StreamId>,
    /// Per malloc: the tags it was asked for under at the last observed step (the driven
    /// steps' blocks and an out-of-memory carry them, as the engine's calls would).
    stack: Vec<StackId>,
    /// How far back the frees reach.
    reach: usize,
    /// The malloc addresses of the last `reach + 1` observed steps, oldest first (the first
    /// driven steps free some of them).
    history: Vec<Vec<u64>>,
    /// The run of identical blocks of calls (a model's layers) in each step, if there is one.
    blocks: Option<blocks::Blocks>,
}

impl Template {
    /// The shape of the steps whose logs `steps` are (oldest first, consecutive), if the
    /// last four all have it: the same calls in the same order, each free freeing the malloc
    /// of the same place in its step or one at most [`MAX_BACK`] before, each malloc freed
    /// once, and sizes that grow by the same bytes each step (never shrink). `None` otherwise.
    pub fn infer(steps: &[Vec<StepEvent>]) -> Option<Template> {
        if steps.len() < MAX_BACK + 3 {
            return None;
        }
        let first = steps.len() - 4.min(steps.len() - MAX_BACK);
        let mut calls: Option<(Vec<Call>, Vec<StreamId>)> = None;
        let mut stack = Vec::new();
        let mut sizes: Vec<Vec<u64>> = Vec::new();
        let mut addrs: Vec<Vec<u64>> = Vec::new();
        // live allocations: address -> (step, malloc)
        let mut live: FxHashMap<u64, (usize, u32)> = FxHashMap::default();
        for (i, log) in steps.iter().enumerate() {
            let mut c = Vec::with_capacity(log.len());
            let mut streams = Vec::new();
            let mut stacks = Vec::new();
            let mut n = Vec::new();
            let mut at = Vec::new();
            let mut j = 0u32;
            for e in log {
                match *e {
                    StepEvent::Malloc {
                        n: size,
                        stream,
                        addr,
                        stack: tags,
                    } => {
                        live.insert(addr, (i, j));
                        c.push(Call::Malloc(j));
                        streams.push(stream);
                        stacks.push(tags);
                        n.push(size);
                        at.push(addr);
                        j += 1;
                    }
                    StepEvent::Free { addr } => match live.remove(&addr) {
                        Some((i0, j)) if i - i0 <= MAX_BACK => c.push(Call::Free {
                            back: (i - i0) as u8,
                            j,
                        }),
                        // before the logs (fine in the first steps) or too far back
                        _ if i < first => {}
                        _ => return None,
                    },
                }
            }
            addrs.push(at);
            if i < first {
                continue;
            }
            match &calls {
                None => calls = Some((c, streams)),
                Some((c0, s0)) => {
                    if *c0 != c || *s0 != streams {
                        return None;
                    }
                }
            }
            sizes.push(n);
            stack = stacks;
        }
        let (calls, stream) = calls?;
        let m = stream.len();
        // each malloc freed exactly once, and the earlier steps the same shape too (their
        // mallocs are freed by the first driven steps)
        let mut freed = vec![0u8; m];
        let mut reach = 0;
        for c in &calls {
            if let Call::Free { back, j } = *c {
                freed[j as usize] += 1;
                reach = reach.max(back as usize);
            }
        }
        if freed.iter().any(|&f| f != 1) {
            return None;
        }
        let history: Vec<Vec<u64>> = addrs[steps.len() - 1 - reach..].to_vec();
        if history.iter().any(|h| h.len() != m) {
            return None;
        }
        let mut growth = vec![0u64; m];
        for (j, g) in growth.iter_mut().enumerate() {
            let d = sizes[1][j].checked_sub(sizes[0][j])?;
            if sizes
                .windows(2)
                .any(|w| w[1][j].checked_sub(w[0][j]) != Some(d))
            {
                return None;
            }
            *g = d;
        }
        let mut t = Template {
            calls,
            size: sizes.pop()?,
            growth,
            stream,
            stack,
            reach,
            history,
            blocks: None,
        };
        t.blocks = blocks::Blocks::find(&t);
        Some(t)
    }

    /// The mallocs whose size grows: (index, size at the last observed step, growth).
    pub fn growing(&self) -> Vec<(usize, u64, u64)> {
        (0..self.size.len())
            .filter(|&j| self.growth[j] > 0)
            .map(|j| (j, self.size[j], self.growth[j]))
            .collect()
    }

    /// Mallocs per step.
    pub fn mallocs(&self) -> usize {
        self.size.len()
    }

    /// Malloc `j`'s size at step `k` (the last observed step is 0, the one before -1).
    #[inline]
    fn size_at(&self, j: usize, k: i64) -> u64 {
        (self.size[j] as i64).saturating_add((self.growth[j] as i64).saturating_mul(k)) as u64
    }
}

/// Why [`drive`] stopped.
#[derive(Debug)]
pub enum DriveEnd {
    /// Every step asked for ran.
    Done,
    /// A malloc of the next step ran out of memory (the allocator's state and the out-of-memory
    /// error are the real ones, as in a run by the engine).
    Oom(Box<OutOfMemory>),
    /// The deadline passed.
    Deadline,
    /// The allocator answered differently than the template says it must (a free of no
    /// allocation, or a skipped small block found elsewhere): a fault of the fast-forward's
    /// premises, reported rather than papered over.
    Diverged(String),
}

/// What [`drive`] did: the steps that finished, why it stopped, and the highest allocated
/// memory while it drove. The allocator's own aggregate peak is not to be read during a
/// drive: in skipped steps it adds the large pool's memory to the small pool's at the
/// period's start; [`drive`] sets it to the true peak before it returns.
#[derive(Debug)]
pub struct Drive {
    pub steps: u64,
    pub end: DriveEnd,
    pub peak_allocated: u64,
    /// Where a done drive leaves what the observed steps allocated and the driven ones would
    /// free after the last (the KV cache, the ids, ...): (its address then, its address now,
    /// its size now). The engine's storages are moved to match
    /// ([`crate::engine::Tensors::relocate`]).
    pub moved: Vec<(u64, u64, u64)>,
    /// Of the steps, those that played the small pool's calls (all or, where skipping
    /// stopped inside a step, the rest of them); the others skipped them.
    pub full_steps: u64,
    /// Blocks of calls (layers) within the full steps whose small-pool calls were skipped
    /// ([`blocks`]).
    pub skipped_blocks: u64,
    /// Of those skips, the ones a large request stopped (the small pool brought to it).
    pub block_replays: u64,
}

/// A step played in full: what the skipping needs of it.
struct Seen {
    /// The small pool's fingerprint at the step's end.
    fingerprint: u64,
    /// Per malloc: in the large pool, else its rounded size (0 for the large pool's; and
    /// `addr` its address).
    large: Vec<bool>,
    rounded: Vec<u64>,
    addr: Vec<u64>,
    /// The small pool's highest allocated bytes between consecutive large-pool calls (the
    /// first before the first call, the last after the last).
    gap_high: Vec<i64>,
}

/// Plays `steps` more steps of `t` on `a` (the steps after the last observed one), or fewer
/// if memory runs out or `deadline` passes. The allocator must be as the last observed step
/// left it.
pub fn drive<S: SegmentSource>(
    a: &mut CachingAllocator<S>,
    t: &Template,
    steps: u64,
    deadline: Option<Instant>,
) -> Drive {
    let before = a.stats().allocated_bytes.all().peak;
    let caller = a.recorder().current();
    let r = t.reach + 1;
    // ring[x % r]: the addresses of step x's mallocs (the last observed step is 0)
    let mut ring = vec![Vec::new(); r];
    for (i, h) in t.history.iter().enumerate() {
        let x = i as i64 - t.reach as i64;
        ring[x.rem_euclid(r as i64) as usize] = h.clone();
    }
    let mut d = Driver {
        t,
        ring,
        seen: VecDeque::new(),
        peak: a.stats().allocated_bytes.all().current,
        full_steps: 0,
        skipped_blocks: 0,
        block_replays: 0,
    };
    let mut k = 0u64;
    let end = loop {
        if k == steps {
            break DriveEnd::Done;
        }
        if k.is_multiple_of(CLOCK_EVERY) && deadline.is_some_and(|dl| Instant::now() >= dl) {
            break DriveEnd::Deadline;
        }
        if let Some((period, run)) = d.periodic(a, k, steps) {
            tracing::trace!(step = k, period, run, "small pool skipped");
            match d.skip(a, k, period, run, deadline) {
                Ok(()) => {
                    k += run;
                    continue;
                }
                Err(Skipped::Full(done)) => {
                    // the run stopped inside step k + done + 1, which then went on in full
                    k += done + 1;
                    d.seen.clear();
                    continue;
                }
                Err(Skipped::End(e, done)) => {
                    k += done;
                    break e;
                }
            }
        }
        match d.full(a, k + 1, 0) {
            Ok(seen) => {
                if d.seen.len() == MAX_PERIOD + MAX_BACK + 1 {
                    d.seen.pop_front();
                }
                d.seen.push_back(seen);
                k += 1;
            }
            Err(e) => break e,
        }
    };
    let peak = d.peak.max(before);
    a.set_allocated_peak(peak);
    // (an out-of-memory's own tags are the failed malloc's: its event is recorded already)
    a.recorder_mut().set_current(caller);
    let mut moved = Vec::new();
    if matches!(end, DriveEnd::Done) && k > 0 {
        // a malloc freed `back` steps later outlives the last `back` steps: the engine holds
        // the observed steps' (step -m), which stand for the driven steps' (step k - m)
        for c in &t.calls {
            if let Call::Free { back, j } = *c {
                let j = j as usize;
                for m in 0..(back as i64).min(k as i64) {
                    let then = &t.history[t.reach - m as usize];
                    let now = k as i64 - m;
                    moved.push((then[j], d.addr(now, j), t.size_at(j, now)));
                }
            }
        }
    }
    Drive {
        steps: k,
        end,
        peak_allocated: peak as u64,
        moved,
        full_steps: d.full_steps,
        skipped_blocks: d.skipped_blocks,
        block_replays: d.block_replays,
    }
}

enum Skipped {
    /// Skipping stopped after this many whole steps; the next one finished in full.
    Full(u64),
    /// The driving ends after this many whole steps.
    End(DriveEnd, u64),
}

struct Driver<'t> {
    t: &'t Template,
    /// The malloc addresses of the last `reach + 1` steps, by step modulo `reach + 1` (large
    /// ones always; small ones of skipped steps are filled in from the period where needed).
    ring: Vec<Vec<u64>>,
    /// The last steps played in full, oldest first, consecutive.
    seen: VecDeque<Seen>,
    /// The highest allocated memory since the driving began.
    peak: i64,
    full_steps: u64,
    skipped_blocks: u64,
    block_replays: u64,
}

fn small_now<S: SegmentSource>(a: &CachingAllocator<S>) -> i64 {
    a.stats().allocated_bytes.pool(PoolKind::Small).current
}

fn large_now<S: SegmentSource>(a: &CachingAllocator<S>) -> i64 {
    a.stats().allocated_bytes.pool(PoolKind::Large).current
}

/// Why a large-pool call played without the small pool's stopped.
enum LargeStop {
    /// The malloc would reach the out-of-memory path, which releases both pools' cached
    /// segments: nothing was done, the small pool must be brought to this call first.
    Guarded,
    /// The allocator answered otherwise than the template says (a free of no allocation).
    Diverged(String),
}

impl Driver<'_> {
    /// The ring's slot of step `x` (0 the last observed, negative before it).
    fn slot(&self, x: i64) -> usize {
        x.rem_euclid(self.ring.len() as i64) as usize
    }

    fn addr(&self, x: i64, j: usize) -> u64 {
        self.ring[self.slot(x)][j]
    }

    /// Plays call `i` of step `step`, one of the large pool's, with the small pool left
    /// where it stands: a malloc (guarded: see [`LargeStop::Guarded`]) keeps its address in
    /// the ring, a free frees the malloc it names.
    fn play_large<S: SegmentSource>(
        &mut self,
        a: &mut CachingAllocator<S>,
        i: usize,
        step: u64,
    ) -> Result<(), LargeStop> {
        let t = self.t;
        match t.calls[i] {
            Call::Malloc(j) => {
                let j = j as usize;
                a.recorder_mut().set_current(t.stack[j]);
                let addr = a
                    .malloc_guarded(t.size_at(j, step as i64), t.stream[j])
                    .map_err(|_| LargeStop::Guarded)?;
                let slot = self.slot(step as i64);
                self.ring[slot][j] = addr;
                Ok(())
            }
            Call::Free { back, j } => {
                let addr = self.addr(step as i64 - back as i64, j as usize);
                a.free(addr)
                    .map_err(|e| LargeStop::Diverged(format!("call {i} of step {step}: {e}")))
            }
        }
    }

    /// Plays step `step` (1 = the first after the last observed) in full from call `from`
    /// on (its earlier calls were made already).
    fn full<S: SegmentSource>(
        &mut self,
        a: &mut CachingAllocator<S>,
        step: u64,
        from: usize,
    ) -> Result<Seen, DriveEnd> {
        let t = self.t;
        let m = t.mallocs();
        let slot = self.slot(step as i64);
        let mut rec = blocks::StepRecord {
            large: vec![false; m],
            rounded: vec![0u64; m],
            gap_high: Vec::new(),
            high: small_now(a),
        };
        let mut layers = (t.blocks.as_ref()).map(|b| blocks::Layers::new(b, from));
        let mut i = from;
        while i < t.calls.len() {
            if let Some(l) = layers.as_mut().filter(|l| l.next == i) {
                match self.skip_blocks(a, l, step, i, &mut rec) {
                    Ok(next) if next != i => {
                        i = next;
                        continue;
                    }
                    Ok(_) => {}
                    Err(blocks::BlocksEnd::Materialized(at)) => {
                        // (the rest of the step in full, call by call)
                        layers = None;
                        i = at;
                    }
                    Err(blocks::BlocksEnd::End(e)) => return Err(e),
                }
            }
            let big = match t.calls[i] {
                Call::Malloc(j) => {
                    let j = j as usize;
                    let n = t.size_at(j, step as i64);
                    let r = a.round_size(n);
                    let big = a.pool_for_rounded(r) == PoolKind::Large;
                    rec.large[j] = big;
                    // (only the small pool's sizes must hold; the large pool's are played)
                    rec.rounded[j] = if big { 0 } else { r };
                    a.recorder_mut().set_current(t.stack[j]);
                    self.ring[slot][j] = a
                        .malloc(n, t.stream[j])
                        .map_err(|o| DriveEnd::Oom(Box::new(o)))?;
                    big
                }
                Call::Free { back, j } => {
                    let j = j as usize;
                    let at = step as i64 - back as i64;
                    a.free(self.addr(at, j))
                        .map_err(|e| DriveEnd::Diverged(format!("call {i} of step {step}: {e}")))?;
                    let n = t.size_at(j, at);
                    a.pool_for_rounded(a.round_size(n)) == PoolKind::Large
                }
            };
            let small = small_now(a);
            if big {
                rec.gap_high.push(rec.high);
                rec.high = small;
            } else {
                rec.high = rec.high.max(small);
            }
            if let Some(l) = layers.as_mut() {
                l.note(i, big, small);
            }
            self.peak = self.peak.max(a.stats().allocated_bytes.all().current);
            i += 1;
        }
        rec.gap_high.push(rec.high);
        self.full_steps += 1;
        Ok(Seen {
            fingerprint: a.small_pool_fingerprint(),
            large: rec.large,
            rounded: rec.rounded,
            addr: self.ring[slot].clone(),
            gap_high: rec.gap_high,
        })
    }

    /// Whether the small pool repeats from the step after `k` on: its period and for how
    /// many steps (whole periods) the repetition holds. It repeats with period `p` where the
    /// last `p + reach` steps played in full each left the pool as the step `p` before did,
    /// and all of them made the same small requests of the same rounded sizes.
    fn periodic<S: SegmentSource>(
        &self,
        a: &CachingAllocator<S>,
        k: u64,
        steps: u64,
    ) -> Option<(usize, u64)> {
        let n = self.seen.len();
        let last = self.seen.back()?;
        let t = self.t;
        // the small requests' rounded sizes hold until the first grows out of its size
        let left = steps - k;
        let mut hold = left;
        for j in 0..t.mallocs() {
            if last.large[j] || t.growth[j] == 0 {
                continue;
            }
            // the last step (after k) at which malloc j still rounds as it did at k
            let (mut lo, mut hi) = (0u64, left);
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if a.round_size(t.size_at(j, (k + mid) as i64)) == last.rounded[j] {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            hold = hold.min(lo);
        }
        for p in 1..=MAX_PERIOD {
            // the pool at each step's end from `w` steps back as `p` steps later, so the
            // period's steps and those the first frees reach made the same blocks
            let w = p.max(t.reach);
            if n < w + 1 || (hold as usize) < p {
                break;
            }
            let repeats = (n - 1 - w..n - p)
                .all(|z| self.seen[z].fingerprint == self.seen[z + p].fingerprint)
                && (n - w..n).all(|x| {
                    let s = &self.seen[x];
                    s.large == last.large && s.rounded == last.rounded
                });
            if repeats {
                return Some((p, hold / p as u64 * p as u64));
            }
        }
        None
    }

    /// Plays `run` steps after `k` with only the large pool's calls, the small pool repeating
    /// the last `period` steps played in full.
    fn skip<S: SegmentSource>(
        &mut self,
        a: &mut CachingAllocator<S>,
        k: u64,
        period: usize,
        run: u64,
        deadline: Option<Instant>,
    ) -> Result<(), Skipped> {
        let t = self.t;
        // (the steps seen are spent: after the run the pool is seen anew)
        let seen = std::mem::take(&mut self.seen);
        let n = seen.len();
        let phases: Vec<&Seen> = seen.range(n - period..).collect();
        let large = phases[0].large.clone();
        let is_large = |c: &Call| match *c {
            Call::Malloc(j) | Call::Free { j, .. } => large[j as usize],
        };
        let big: Vec<usize> = (0..t.calls.len())
            .filter(|&i| is_large(&t.calls[i]))
            .collect();
        let mut peak = self.peak;
        for s in 0..run {
            let step = k + s + 1;
            let phase = (s % period as u64) as usize;
            // (at a period's start, where the small pool is where the skipping left it)
            if s > 0
                && s % (CLOCK_EVERY * period as u64) == 0
                && deadline.is_some_and(|dl| Instant::now() >= dl)
            {
                self.peak = peak;
                return Err(Skipped::End(DriveEnd::Deadline, s));
            }
            let ph = phases[phase];
            for (g, &i) in big.iter().enumerate() {
                peak = peak.max(large_now(a) + ph.gap_high[g]);
                match self.play_large(a, i, step) {
                    Ok(()) => {}
                    Err(LargeStop::Guarded) => {
                        self.peak = peak;
                        return Err(self.materialize(a, step, phase, &phases, i, s));
                    }
                    Err(LargeStop::Diverged(why)) => {
                        self.peak = peak;
                        return Err(Skipped::End(DriveEnd::Diverged(why), s));
                    }
                }
            }
            peak = peak.max(large_now(a) + ph.gap_high[big.len()]);
        }
        self.peak = peak;
        // the small pool's addresses of the run's last steps, for the frees of the next
        self.fill_small(k + run, period, &phases, k + 1);
        Ok(())
    }

    /// Fills in the small mallocs' addresses of the `reach + 1` steps up to `upto` from the
    /// period (`phases[0]` is step `start`'s).
    fn fill_small(&mut self, upto: u64, period: usize, phases: &[&Seen], start: u64) {
        let t = self.t;
        for back in 0..=t.reach as i64 {
            let x = upto as i64 - back;
            let ph = phases[((x - start as i64).rem_euclid(period as i64)) as usize];
            let slot = self.slot(x);
            for j in 0..t.mallocs() {
                if !ph.large[j] {
                    self.ring[slot][j] = ph.addr[j];
                }
            }
        }
    }

    /// A large request of step `step` (phase `phase` of the period, `s` steps into the run)
    /// at call `at` would release every cached segment: the small pool is brought to where
    /// it stands at that call (its calls of the period's earlier steps and of this step up to
    /// there, replayed), and the step goes on in full.
    fn materialize<S: SegmentSource>(
        &mut self,
        a: &mut CachingAllocator<S>,
        step: u64,
        phase: usize,
        phases: &[&Seen],
        at: usize,
        s: u64,
    ) -> Skipped {
        let t = self.t;
        let period = phases.len();
        let first = step - phase as u64;
        let of = |x: i64| phases[(x - first as i64).rem_euclid(period as i64) as usize];
        for (q, &ph) in phases.iter().enumerate().take(phase + 1) {
            let st = first + q as u64;
            let upto = if q == phase { at } else { t.calls.len() };
            for (i, c) in t.calls[..upto].iter().enumerate() {
                match *c {
                    Call::Malloc(j) if !ph.large[j as usize] => {
                        let j = j as usize;
                        a.recorder_mut().set_current(t.stack[j]);
                        match a.malloc(t.size_at(j, st as i64), t.stream[j]) {
                            Ok(addr) if addr == ph.addr[j] => {}
                            Ok(addr) => {
                                return Skipped::End(
                                    DriveEnd::Diverged(format!(
                                        "call {i} of step {st}: the small pool gave {addr:#x}, \
                                         not {:#x} as the step it repeats",
                                        ph.addr[j]
                                    )),
                                    s,
                                )
                            }
                            Err(o) => return Skipped::End(DriveEnd::Oom(Box::new(o)), s),
                        }
                    }
                    Call::Free { back, j } if !ph.large[j as usize] => {
                        let j = j as usize;
                        let addr = of(st as i64 - back as i64).addr[j];
                        if let Err(e) = a.free(addr) {
                            return Skipped::End(
                                DriveEnd::Diverged(format!("call {i} of step {st}: {e}")),
                                s,
                            );
                        }
                    }
                    _ => {}
                }
            }
        }
        // the small addresses of this step and those its frees reach, then the rest in full
        self.fill_small(step, period, phases, first);
        match self.full(a, step, at) {
            Ok(_) => Skipped::Full(s),
            Err(e) => Skipped::End(e, s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocConf, SimAllocator, SimSource};
    use crate::units::MIB;

    /// A decode step of a made-up model: small constant temporaries, ids that grow 8 bytes
    /// a step (freed the next step), a cache that grows 64 KiB a step (freed the next), and
    /// in the middle a large transient with a small bump inside it (the step's peak).
    fn step(a: &mut SimAllocator, k: u64, held: &mut Vec<u64>) -> Result<(), OutOfMemory> {
        let x = a.malloc(600, 0)?;
        let y = a.malloc(5_000, 0)?;
        a.free(x).unwrap();
        let ids = a.malloc(100 + 8 * k, 0)?;
        let cache = a.malloc(2 * MIB + 65_536 * k, 0)?;
        let t = a.malloc(3 * MIB, 0)?;
        let bump = a.malloc(200_000, 0)?;
        a.free(bump).unwrap();
        a.free(t).unwrap();
        a.free(y).unwrap();
        for old in held.drain(..) {
            a.free(old).unwrap();
        }
        held.extend([ids, cache]);
        Ok(())
    }

    fn state(a: &SimAllocator) -> (i64, i64, i64, i64) {
        let s = a.stats();
        (
            s.allocated_bytes.all().current,
            s.allocated_bytes.all().peak,
            s.reserved_bytes.all().current,
            s.segment.all().current,
        )
    }

    /// A decode step of a made-up model with layers: growing ids; then per layer small
    /// temporaries, a hidden state handed to the next layer, a cache that grows 64 KiB a
    /// step (the layer's cache of the step before freed) and a large transient; the last
    /// hidden state freed after the layers.
    fn layered_step(a: &mut SimAllocator, k: u64, held: &mut Vec<u64>) -> Result<(), OutOfMemory> {
        const LAYERS: usize = 17;
        let ids = a.malloc(100 + 8 * k, 0)?;
        let mut h = a.malloc(4_096, 0)?;
        let mut caches = Vec::new();
        for l in 0..LAYERS {
            let x = a.malloc(600, 0)?;
            let y = a.malloc(5_000 + 512 * (l as u64 % 2), 0)?;
            a.free(x).unwrap();
            caches.push(a.malloc(2 * MIB + 65_536 * k, 0)?);
            if let Some(&old) = held.get(1 + l) {
                a.free(old).unwrap();
            }
            let big = a.malloc(3 * MIB, 0)?;
            a.free(big).unwrap();
            let next = a.malloc(4_096, 0)?;
            a.free(h).unwrap();
            a.free(y).unwrap();
            h = next;
        }
        a.free(h).unwrap();
        if let Some(&old) = held.first() {
            a.free(old).unwrap();
        }
        held.clear();
        held.push(ids);
        held.extend(caches);
        Ok(())
    }

    /// Steps made one by one and driven, from the same start, under each allocator setting
    /// on cards that run out early, late and not at all, end alike: the step that runs out,
    /// the allocator's memory and its peak. Returns the steps that skipped the small pool
    /// and the blocks skipped inside full steps.
    fn driven_as_made(
        step: fn(&mut SimAllocator, u64, &mut Vec<u64>) -> Result<(), OutOfMemory>,
        n: u64,
        capacities: &[u64],
    ) -> (u64, u64, u64) {
        let (mut skipped, mut blocks, mut replays) = (0, 0, 0);
        for conf in ["", "expandable_segments:True", "max_split_size_mb:24"] {
            for &capacity in capacities {
                let new = || {
                    SimAllocator::new(AllocConf::parse(conf).unwrap(), SimSource::new(capacity, 0))
                };
                let mut by_hand = new();
                let mut held = Vec::new();
                let mut done = 0;
                while done < n && step(&mut by_hand, done, &mut held).is_ok() {
                    done += 1;
                }
                let mut driven = new();
                let mut held = Vec::new();
                driven.start_step_log();
                let mut logs = Vec::new();
                let mut k = 0;
                while k < STEPS_TO_INFER as u64 && step(&mut driven, k, &mut held).is_ok() {
                    logs.push(driven.take_step_log().unwrap().0);
                    k += 1;
                }
                driven.stop_step_log();
                let what = format!("{conf:?} on {} MiB", capacity / MIB);
                if k < STEPS_TO_INFER as u64 {
                    assert_eq!(done, k, "{what}");
                    continue;
                }
                let t = Template::infer(&logs).expect("the steps have one shape");
                let d = drive(&mut driven, &t, n - k, None);
                assert!(
                    !matches!(d.end, DriveEnd::Diverged(_)),
                    "{what}: {:?}",
                    d.end
                );
                assert_eq!(k + d.steps, done, "{what}: steps");
                assert_eq!(matches!(d.end, DriveEnd::Oom(_)), done < n, "{what}");
                assert_eq!(state(&driven), state(&by_hand), "{what}");
                skipped += d.steps - d.full_steps;
                blocks += d.skipped_blocks;
                replays += d.block_replays;
            }
        }
        (skipped, blocks, replays)
    }

    /// Driven steps end as the same steps made one by one, and some steps skipped the small
    /// pool.
    #[test]
    fn driven_steps_end_as_the_steps_made() {
        let capacities = [60, 300, 600, 1_000, 2_000, 4_000].map(|m| m * MIB);
        let (skipped, _, _) = driven_as_made(step, 600, &capacities);
        assert!(skipped > 1_000, "{skipped} steps skipped");
    }

    /// Steps with layers end as made one by one too, where the layers of full steps skipped
    /// the small pool (and some of them ran out inside skipped layers).
    #[test]
    fn driven_layers_end_as_the_steps_made() {
        let capacities: Vec<u64> = (80..1_600)
            .step_by(37)
            .chain([6_000])
            .map(|m| m * MIB)
            .collect();
        let (_, blocks, replays) = driven_as_made(layered_step, 300, &capacities);
        assert!(blocks > 500, "{blocks} blocks skipped");
        assert!(
            replays >= 3,
            "{replays} skips of layers ran into the release of segments"
        );
    }

    /// The layers are found: the run of identical blocks after the first layer (whose
    /// hidden state comes from before the layers).
    #[test]
    fn the_layers_of_a_step_are_found() {
        let mut a = SimAllocator::new(AllocConf::default(), SimSource::new(1 << 36, 0));
        let mut held = Vec::new();
        a.start_step_log();
        let mut logs = Vec::new();
        for k in 0..STEPS_TO_INFER as u64 {
            layered_step(&mut a, k, &mut held).unwrap();
            logs.push(a.take_step_log().unwrap().0);
        }
        let t = Template::infer(&logs).unwrap();
        let b = t.blocks.as_ref().expect("blocks found");
        // two layers a block (the temporaries alternate in size), 7 calls + 4 + 4 frees... a
        // layer: 6 mallocs and 6 frees
        assert_eq!(
            (b.len(), b.count(), b.mallocs_per_block()),
            (20, 8, 10),
            "{b:?}"
        );
    }

    #[test]
    fn steps_of_another_shape_or_shrinking_give_no_template() {
        let mut a = SimAllocator::new(AllocConf::default(), SimSource::new(1 << 34, 0));
        a.start_step_log();
        let mut logs = Vec::new();
        for k in 0..STEPS_TO_INFER as u64 {
            // a size that shrinks
            let p = a.malloc(10_000 - k, 0).unwrap();
            a.free(p).unwrap();
            logs.push(a.take_step_log().unwrap().0);
        }
        assert!(Template::infer(&logs).is_none());
        logs.clear();
        for k in 0..STEPS_TO_INFER as u64 {
            // one more call in the last step
            let p = a.malloc(1_000, 0).unwrap();
            if k == STEPS_TO_INFER as u64 - 1 {
                let q = a.malloc(1_000, 0).unwrap();
                a.free(q).unwrap();
            }
            a.free(p).unwrap();
            logs.push(a.take_step_log().unwrap().0);
        }
        assert!(Template::infer(&logs).is_none());
    }
}
