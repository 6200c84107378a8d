//! Skipping the small pool inside a step: a model's layers make the same calls one after
//! another, and once the small pool repeats from layer to layer the rest of the layers need
//! only their large-pool calls.
//!
//! A decode step of a 7B model makes about 2,500 allocator calls, 43 per layer in its 28
//! layers, nearly all of them in the small pool. Where the steps themselves do not repeat (the
//! ids and masks of a few hundred KiB move among the small pool's segments for thousands of
//! steps) every step was played call by call. [`Blocks::find`] reads the run of identical
//! blocks of calls in the [`Template`] once: the same sizes, growth and streams, each free
//! freeing the malloc of the same place in its block (or in an earlier step). Playing a step,
//! [`Driver::full`] takes the small pool's fingerprint at each block boundary; when the pool
//! at a boundary is as it was `p` blocks before, and the last blocks' small mallocs got the
//! addresses of those `p` blocks before them (so the blocks still to be freed are the same
//! blocks), the next blocks run on the small pool exactly as those `p` did, and whole periods
//! of them are skipped as [`Driver::skip`] skips whole steps: their large-pool calls made,
//! the small pool's highs between them taken from the period's blocks, their small blocks'
//! addresses copied. A large request that would reach the out-of-memory path's release of
//! cached segments first brings the small pool to where it stands (its skipped calls
//! replayed), and the step goes on in full.

use super::{large_now, small_now, Call, DriveEnd, Driver, LargeStop, Template};
use crate::alloc::caching::CachingAllocator;
use crate::alloc::source::SegmentSource;
use crate::alloc::stats::PoolKind;

/// The longest period, in blocks, looked for (a layer's output freed by the next layer
/// alternates between two addresses).
const MAX_PERIOD: usize = 4;

/// Boundaries fingerprinted in a step without finding a period before the step stops
/// looking (the early steps, whose KV cache is still in the small pool, never repeat).
const TRIES: usize = 8;

/// A run of consecutive blocks of calls in a step that make the same calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Blocks {
    /// The first block's first call, calls per block, blocks.
    start: usize,
    len: usize,
    count: usize,
    /// The first block's first malloc, mallocs per block.
    first_malloc: usize,
    mallocs: usize,
    /// The most blocks back a free reaches within the step.
    reach: usize,
    /// The first block whose frees within the step (and every later block's) free mallocs
    /// of the run's blocks.
    from_block: usize,
}

impl Blocks {
    /// The longest run (most calls) of at least four identical blocks in `t`'s calls, if any.
    pub(super) fn find(t: &Template) -> Option<Blocks> {
        let calls = &t.calls;
        let n = calls.len();
        // mallocs before each call
        let mut before = Vec::with_capacity(n + 1);
        let mut m = 0usize;
        for c in calls {
            before.push(m);
            m += matches!(c, Call::Malloc(_)) as usize;
        }
        before.push(m);
        let same = |i: usize, l: usize| -> bool {
            let d = (before[i + l] - before[i]) as u32;
            match (calls[i], calls[i + l]) {
                (Call::Malloc(a), Call::Malloc(b)) => {
                    let (a, b) = (a as usize, b as usize);
                    t.size[a] == t.size[b]
                        && t.growth[a] == t.growth[b]
                        && t.stream[a] == t.stream[b]
                }
                (Call::Free { back: x, j: a }, Call::Free { back: y, j: b }) => {
                    x == y && b == a + d
                }
                _ => false,
            }
        };
        // (start, len, count)
        let mut best: Option<(usize, usize, usize)> = None;
        for l in 1..=n / 4 {
            let mut run = 0;
            for i in 0..n - l {
                if same(i, l) {
                    run += 1;
                    let count = run / l + 1;
                    if count >= 4 && best.is_none_or(|(_, bl, bc)| count * l > bc * bl) {
                        best = Some((i + 1 - run, l, count));
                    }
                } else {
                    run = 0;
                }
            }
        }
        let (start, len, count) = best?;
        let first_malloc = before[start];
        let mallocs = before[start + len] - first_malloc;
        if mallocs == 0 {
            return None;
        }
        let end_malloc = first_malloc + count * mallocs;
        let (mut reach, mut from_block) = (0, 0);
        for b in 0..count {
            for c in &calls[start + b * len..start + (b + 1) * len] {
                if let Call::Free { back: 0, j } = *c {
                    let j = j as usize;
                    if (first_malloc..end_malloc).contains(&j) {
                        reach = reach.max(b - (j - first_malloc) / mallocs);
                    } else {
                        from_block = from_block.max(b + 1);
                    }
                }
            }
        }
        Some(Blocks {
            start,
            len,
            count,
            first_malloc,
            mallocs,
            reach,
            from_block,
        })
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(super) fn count(&self) -> usize {
        self.count
    }

    #[cfg(test)]
    pub(super) fn mallocs_per_block(&self) -> usize {
        self.mallocs
    }

    fn call(&self, b: usize, off: usize) -> usize {
        self.start + b * self.len + off
    }

    fn malloc(&self, b: usize, k: usize) -> usize {
        self.first_malloc + b * self.mallocs + k
    }
}

/// A block played in full in this step: the offsets of its large-pool calls and the small
/// pool's highest allocated bytes before, between and after them.
#[derive(Debug, Clone, Default)]
struct Played {
    bigs: Vec<u32>,
    highs: Vec<i64>,
}

/// What one step's playing keeps of its blocks.
pub(super) struct Layers<'b> {
    blocks: &'b Blocks,
    /// The small pool's fingerprint at each block's start, where taken.
    print: Vec<Option<u64>>,
    played: Vec<Option<Played>>,
    /// The block being played in full and its record so far, and the running high.
    current: Option<(usize, Played)>,
    high: i64,
    tries: usize,
    /// The first call of the next block (or of the call after the run) not yet reached.
    pub next: usize,
}

/// How a skip of blocks ended early.
pub(super) enum BlocksEnd {
    /// The small pool was brought to call `at`, from which the step goes on in full.
    Materialized(usize),
    End(DriveEnd),
}

/// What [`Driver::full`] keeps of a step while it plays it: per malloc, whether it is in
/// the large pool, its rounded size (small ones), and the small pool's highs between
/// large-pool calls; `high` the one running.
pub(super) struct StepRecord {
    pub large: Vec<bool>,
    pub rounded: Vec<u64>,
    pub gap_high: Vec<i64>,
    pub high: i64,
}

impl<'b> Layers<'b> {
    /// A step's record from call `from` on.
    pub(super) fn new(blocks: &'b Blocks, from: usize) -> Layers<'b> {
        let b = from
            .saturating_sub(blocks.start)
            .div_ceil(blocks.len)
            .min(blocks.count);
        Layers {
            blocks,
            print: vec![None; blocks.count],
            played: vec![None; blocks.count],
            current: None,
            high: 0,
            tries: 0,
            next: blocks.call(b, 0),
        }
    }

    /// Notes a call of the step just made in full (`big` in the large pool), with the small
    /// pool's allocated bytes after it.
    #[inline]
    pub(super) fn note(&mut self, i: usize, big: bool, small: i64) {
        if let Some((b, rec)) = self.current.as_mut() {
            if big {
                rec.bigs.push((i - self.blocks.call(*b, 0)) as u32);
                rec.highs.push(self.high);
                self.high = small;
            } else {
                self.high = self.high.max(small);
            }
        }
    }

    /// At call `i`: closes the block that ended there and, where a block starts, fingerprints
    /// the pool. Returns the block starting at `i`, if one does.
    fn boundary<S: SegmentSource>(&mut self, a: &CachingAllocator<S>, i: usize) -> Option<usize> {
        let bl = self.blocks;
        if i != self.next {
            return None;
        }
        let b = (i - bl.start) / bl.len;
        self.next = bl.call(b + 1, 0);
        if let Some((done, mut rec)) = self.current.take() {
            if done + 1 == b {
                rec.highs.push(self.high);
                self.played[done] = Some(rec);
            }
        }
        if b == bl.count {
            self.next = usize::MAX;
            return None;
        }
        self.high = small_now(a);
        self.current = Some((b, Played::default()));
        // (a period's first block is `from_block + reach` at the earliest)
        if self.tries < TRIES && b >= bl.from_block + bl.reach {
            self.print[b] = Some(a.small_pool_fingerprint());
            self.tries += 1;
        }
        Some(b)
    }

    /// Whether the blocks from `b` on repeat the `p` before them: the pool at `b`'s start as
    /// at `b - p`'s, and the small mallocs of the last `reach` blocks (those the next blocks
    /// free) at the addresses of those `p` before them. Returns the period and how many
    /// blocks (whole periods) to skip.
    fn periodic(&mut self, b: usize, addr: &[u64], large: &[bool]) -> Option<(usize, usize)> {
        let bl = self.blocks;
        let now = self.print[b]?;
        for p in 1..=MAX_PERIOD {
            let w = bl.reach;
            if b < w + p || b - w - p < bl.from_block {
                break;
            }
            if self.print[b - p] != Some(now) || (b - w - p..b).any(|c| self.played[c].is_none()) {
                continue;
            }
            let same = (b - w..b).all(|c| {
                (0..bl.mallocs).all(|k| {
                    let j = bl.malloc(c, k);
                    large[j] || addr[j] == addr[bl.malloc(c - p, k)]
                })
            });
            if same {
                let q = (bl.count - b) / p * p;
                if q == 0 {
                    return None;
                }
                // (found: no more fingerprints needed in this step)
                self.tries = TRIES;
                return Some((p, q));
            }
        }
        None
    }
}

impl Driver<'_> {
    /// At call `i` of step `step`, played in full: where a block starts whose small-pool
    /// calls repeat the blocks before it, skips whole periods of blocks (their large-pool
    /// calls made). Returns the call to go on from: `i` where nothing was skipped.
    pub(super) fn skip_blocks<S: SegmentSource>(
        &mut self,
        a: &mut CachingAllocator<S>,
        layers: &mut Layers,
        step: u64,
        i: usize,
        rec: &mut StepRecord,
    ) -> Result<usize, BlocksEnd> {
        let Some(b) = layers.boundary(a, i) else {
            return Ok(i);
        };
        let slot = self.slot(step as i64);
        let Some((p, q)) = layers.periodic(b, &self.ring[slot], &rec.large) else {
            return Ok(i);
        };
        // the block `b` was about to be played: it is skipped instead
        layers.current = None;
        let bl = layers.blocks;
        let mut high = rec.high;
        for s in 0..q {
            let c = b + s;
            let ph = b - p + s % p;
            // (the large mallocs' addresses are overwritten as they are made)
            let (j, jp) = (bl.malloc(c, 0), bl.malloc(ph, 0));
            rec.large.copy_within(jp..jp + bl.mallocs, j);
            rec.rounded.copy_within(jp..jp + bl.mallocs, j);
            self.ring[slot].copy_within(jp..jp + bl.mallocs, j);
            let played = layers.played[ph]
                .as_ref()
                .expect("a period's blocks were played");
            high = high.max(played.highs[0]);
            for (g, &off) in played.bigs.iter().enumerate() {
                let i = bl.call(c, off as usize);
                self.peak = self.peak.max(large_now(a) + high);
                rec.gap_high.push(high);
                match self.play_large(a, i, step) {
                    Ok(()) => {}
                    Err(LargeStop::Guarded) => {
                        // (the high of the stretch before this call is taken again)
                        rec.gap_high.pop();
                        rec.high = high;
                        let start = b + s / p * p;
                        self.block_replays += 1;
                        return Err(self.replay_blocks(a, bl, step, start, c, i, &rec.large));
                    }
                    Err(LargeStop::Diverged(why)) => {
                        return Err(BlocksEnd::End(DriveEnd::Diverged(why)));
                    }
                }
                high = played.highs[g + 1];
            }
        }
        self.peak = self.peak.max(large_now(a) + high);
        rec.high = high;
        self.skipped_blocks += q as u64;
        tracing::trace!(
            step,
            block = b,
            period = p,
            skipped = q,
            "small pool skipped in blocks"
        );
        Ok(bl.call(b + q, 0))
    }

    /// The small pool's calls of the skipped blocks `start..=c`, up to call `at` of block
    /// `c`, made: the pool stood at block `start`'s start; it then stands where the calls
    /// made one by one would have left it at `at`.
    #[allow(clippy::too_many_arguments)]
    fn replay_blocks<S: SegmentSource>(
        &mut self,
        a: &mut CachingAllocator<S>,
        bl: &Blocks,
        step: u64,
        start: usize,
        c: usize,
        at: usize,
        large: &[bool],
    ) -> BlocksEnd {
        let t = self.t;
        let slot = self.slot(step as i64);
        for x in start..=c {
            let end = if x == c { at } else { bl.call(x + 1, 0) };
            for i in bl.call(x, 0)..end {
                match t.calls[i] {
                    Call::Malloc(j) if !large[j as usize] => {
                        let j = j as usize;
                        a.recorder_mut().set_current(t.stack[j]);
                        match a.malloc(t.size_at(j, step as i64), t.stream[j]) {
                            Ok(addr) if addr == self.ring[slot][j] => {}
                            Ok(addr) => {
                                return BlocksEnd::End(DriveEnd::Diverged(format!(
                                    "call {i} of step {step}: the small pool gave {addr:#x}, \
                                     not {:#x} as the block it repeats",
                                    self.ring[slot][j]
                                )))
                            }
                            Err(o) => return BlocksEnd::End(DriveEnd::Oom(Box::new(o))),
                        }
                    }
                    Call::Free { back, j } => {
                        let x = step as i64 - back as i64;
                        let n = t.size_at(j as usize, x);
                        if a.pool_for_rounded(a.round_size(n)) == PoolKind::Large {
                            continue;
                        }
                        if let Err(e) = a.free(self.addr(x, j as usize)) {
                            return BlocksEnd::End(DriveEnd::Diverged(format!(
                                "call {i} of step {step}: {e}"
                            )));
                        }
                    }
                    Call::Malloc(_) => {}
                }
            }
        }
        BlocksEnd::Materialized(at)
    }
}
