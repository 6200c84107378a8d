//! A trace walked: the block each allocation got and allocated bytes after each event, on
//! several cores for long traces.
//!
//! Everything the walk keeps is per address or per segment: the allocation each address last
//! made (to size what is still held at the end from the segments), and the [`Sizer`]'s blocks,
//! which only interact inside one segment. So the events are sharded: those inside the address
//! range of a segment the trace creates go to that segment's shard, the others to one of 64
//! shards by address; each shard runs its own [`Sizer`] over its events in order, which is the
//! whole sequential walk restricted to those addresses. Byte sizes then become the running
//! total by a parallel prefix sum. When the segments' ranges overlap (an address range reused
//! by a segment of another size), or the trace is short, the walk is sequential. A test
//! compares the two on every fixture and on a large synthetic trace.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use rayon::prelude::*;
use rustc_hash::{FxHashMap, FxHashSet};

use super::blocks::Sizer;
use crate::alloc::{AllocConf, BlockState, SegmentInfo};
use crate::trace::{Event, EventKind};

/// Below this many events the walk is sequential.
const PARALLEL_FROM: usize = 1 << 16;
/// Shards for addresses outside the segments the trace creates.
const BUCKETS: usize = 64;

/// The trace walked: allocated bytes relative to its start after each event, each
/// allocation's block size (0 for other events), how many allocations reused an address the
/// trace still held, and the shards (when walked in parallel) for later per-address passes.
pub struct Walk {
    pub after: Vec<i64>,
    pub net: i64,
    pub block: Vec<u64>,
    pub inconsistent: u64,
    pub shards: Option<Shards>,
}

/// Events grouped so that each group holds every event of its addresses, in order, by their
/// indices in the trace (4 bytes an event: the walk of a long trace on many cores kept a
/// 24-byte copy of each event here, the largest part of its memory).
pub struct Shards {
    /// Address ranges of the segments the trace creates, sorted, disjoint.
    ranges: Vec<(u64, u64)>,
    /// The events of each shard, by piece of the trace: `parts[piece][shard]`, in order (a
    /// shard's events are its lists of all pieces, one after the other; not copied together).
    parts: Vec<Vec<Vec<u32>>>,
}

impl Shards {
    /// How many shards there are.
    pub fn count(&self) -> usize {
        self.ranges.len() + BUCKETS
    }

    /// The events of shard `s`, in order: their indices in the trace.
    pub fn shard(&self, s: usize) -> impl Iterator<Item = usize> + '_ {
        self.parts
            .iter()
            .flat_map(move |p| p[s].iter().map(|&i| i as usize))
    }

    /// The events in shard `s`.
    pub fn len(&self, s: usize) -> usize {
        self.parts.iter().map(|p| p[s].len()).sum()
    }

    /// The shard that holds the events at `addr`.
    pub fn of(&self, addr: u64) -> usize {
        let k = self.ranges.partition_point(|r| r.0 <= addr);
        if k > 0 && addr < self.ranges[k - 1].1 {
            return k - 1;
        }
        self.ranges.len() + (addr_hash(addr) >> 58) as usize % BUCKETS
    }
}

/// A hash of an address (blocks are 512-byte aligned) whose top bits pick shards by address,
/// here, for leaks and for the owners at the peak.
pub fn addr_hash(addr: u64) -> u64 {
    (addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Active blocks of the segments: address → block size.
fn held_blocks(segments: &[SegmentInfo]) -> FxHashMap<u64, u64> {
    let mut m = FxHashMap::default();
    for s in segments {
        for b in s.blocks.iter().filter(|b| b.state != BlockState::Inactive) {
            m.insert(b.address, b.size);
        }
    }
    m
}

pub fn walk(segments: &[SegmentInfo], events: &[Event], conf: &AllocConf) -> Walk {
    if events.len() >= PARALLEL_FROM && rayon::current_num_threads() > 1 {
        if let Some(w) = walk_parallel(segments, events, conf) {
            return w;
        }
    }
    walk_sequential(segments, events, conf)
}

pub(super) fn walk_sequential(
    segments: &[SegmentInfo],
    events: &[Event],
    conf: &AllocConf,
) -> Walk {
    // an allocation still held at the end has the size its block has in the segments
    let mut last_alloc: FxHashMap<u64, usize> = FxHashMap::default();
    let mut inconsistent = 0;
    for (i, e) in events.iter().enumerate() {
        match e.kind() {
            EventKind::Alloc if last_alloc.insert(e.addr, i).is_some() => inconsistent += 1,
            EventKind::FreeRequested => {
                last_alloc.remove(&e.addr);
            }
            _ => {}
        }
    }
    let mut block = vec![0u64; events.len()];
    for (addr, size) in held_blocks(segments) {
        if let Some(i) = last_alloc.get(&addr) {
            block[*i] = size;
        }
    }
    let mut sizer = Sizer::new(conf);
    let mut cur: i64 = 0;
    let mut after = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        match (e.kind(), sizer.step(e)) {
            (EventKind::Alloc, Some(b)) => {
                if block[i] == 0 {
                    block[i] = b;
                }
                cur += block[i] as i64;
            }
            (EventKind::FreeRequested, Some(b)) => cur -= b as i64,
            _ => {}
        }
        after.push(cur);
    }
    Walk {
        after,
        net: cur,
        block,
        inconsistent,
        shards: None,
    }
}

/// The shards of a trace, or `None` when segments' address ranges overlap.
fn shards(events: &[Event], conf: &AllocConf) -> Option<Shards> {
    let mut ranges: Vec<(u64, u64)> = if conf.expandable_segments {
        Vec::new() // the sizer tracks no segment then
    } else {
        events
            .par_iter()
            .filter(|e| e.kind() == EventKind::SegmentAlloc)
            .map(|e| (e.addr, e.addr.saturating_add(e.size())))
            .collect()
    };
    ranges.sort_unstable();
    ranges.dedup();
    if ranges.windows(2).any(|w| w[0].1 > w[1].0) {
        return None;
    }
    let mut sh = Shards {
        ranges,
        parts: Vec::new(),
    };
    let count = sh.ranges.len() + BUCKETS;
    let piece = events
        .len()
        .div_ceil(rayon::current_num_threads() * 4)
        .max(1 << 14);
    sh.parts = events
        .par_chunks(piece)
        .enumerate()
        .map(|(c, evs)| {
            let mut l = vec![Vec::new(); count];
            for (k, e) in evs.iter().enumerate() {
                l[sh.of(e.addr)].push((c * piece + k) as u32);
            }
            l
        })
        .collect();
    Some(sh)
}

fn walk_parallel(segments: &[SegmentInfo], events: &[Event], conf: &AllocConf) -> Option<Walk> {
    if events.len() >= u32::MAX as usize {
        return None;
    }
    let shards = shards(events, conf)?;
    let held = held_blocks(segments);
    let n = events.len();
    let block: Vec<AtomicU64> = (0..n).into_par_iter().map(|_| AtomicU64::new(0)).collect();
    let delta: Vec<AtomicI64> = (0..n).into_par_iter().map(|_| AtomicI64::new(0)).collect();
    // the largest shards first, so that no core is left with a big one at the end
    let mut order: Vec<usize> = (0..shards.count()).collect();
    order.sort_by_key(|&s| std::cmp::Reverse(shards.len(s)));
    // held addresses (allocations alive at the end) by shard, to size from the segments
    let mut held_in: Vec<Vec<u64>> = vec![Vec::new(); shards.count()];
    for &a in held.keys() {
        held_in[shards.of(a)].push(a);
    }
    let inconsistent: u64 = order
        .par_iter()
        .with_max_len(1)
        .map(|&s| {
            // an allocation still held at the end has the size its block has in the segments:
            // the last allocation at a held address, unless a free follows it (found from the
            // end, stopping once every held address of the shard is settled)
            let recs: Vec<&[u32]> = shards.parts.iter().map(|p| &p[s][..]).collect();
            let mut todo: FxHashSet<u64> = held_in[s].iter().copied().collect();
            let mut held_block: FxHashMap<u32, u64> = FxHashMap::default();
            let n = shards.len(s);
            let mut k = n;
            'back: for part in recs.iter().rev() {
                for &i in part.iter().rev() {
                    if todo.is_empty() {
                        break 'back;
                    }
                    k -= 1;
                    let r = &events[i as usize];
                    match r.kind() {
                        EventKind::Alloc if todo.remove(&r.addr) => {
                            held_block.insert(k as u32, held[&r.addr]);
                        }
                        EventKind::FreeRequested => {
                            todo.remove(&r.addr);
                        }
                        _ => {}
                    }
                }
            }
            let mut sizer = Sizer::new(conf);
            for (k, i) in shards.shard(s).enumerate() {
                let e = events[i];
                match (e.kind(), sizer.step(&e)) {
                    (EventKind::Alloc, Some(b)) => {
                        let got = held_block.get(&(k as u32)).copied().unwrap_or(b);
                        block[i].store(got, Ordering::Relaxed);
                        delta[i].store(got as i64, Ordering::Relaxed);
                    }
                    (EventKind::FreeRequested, Some(b)) => {
                        delta[i].store(-(b as i64), Ordering::Relaxed)
                    }
                    _ => {}
                }
            }
            sizer.reused
        })
        .sum();
    // the running total, in the deltas' place: sums of pieces, then each piece from its start
    let mut after: Vec<i64> = delta.into_iter().map(AtomicI64::into_inner).collect();
    let piece = n.div_ceil(rayon::current_num_threads() * 4).max(1 << 14);
    let sums: Vec<i64> = after.par_chunks(piece).map(|c| c.iter().sum()).collect();
    let starts: Vec<i64> = sums
        .iter()
        .scan(0i64, |acc, s| {
            let at = *acc;
            *acc += s;
            Some(at)
        })
        .collect();
    let net: i64 = sums.iter().sum();
    after
        .par_chunks_mut(piece)
        .zip(starts.par_iter())
        .for_each(|(out, &start)| {
            let mut cur = start;
            for o in out.iter_mut() {
                cur += *o;
                *o = cur;
            }
        });
    // (both in place: an atomic has its integer's layout)
    let block: Vec<u64> = block.into_iter().map(AtomicU64::into_inner).collect();
    Some(Walk {
        after,
        net,
        block,
        inconsistent,
        shards: Some(shards),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    /// A run's trace, from a preset workload.
    fn run_events(preset: &str) -> (Vec<SegmentInfo>, Vec<Event>, AllocConf) {
        let path = root().join("fixtures/workloads/presets").join(preset);
        let w = crate::workload::load(&path).unwrap();
        let r = crate::runner::run(&w, &path, &Default::default()).unwrap();
        let events: Vec<Event> = r.allocator.recorder().ring.iter().copied().collect();
        let segs = r.allocator.snapshot();
        (segs, events, AllocConf::default())
    }

    fn same(a: &Walk, b: &Walk, what: &str) {
        assert_eq!(a.after, b.after, "{what}: allocated after each event");
        assert_eq!(a.net, b.net, "{what}");
        assert_eq!(a.block, b.block, "{what}: block sizes");
        assert_eq!(a.inconsistent, b.inconsistent, "{what}");
    }

    /// The sharded walk is the sequential walk: on a real PyTorch trace grown to 7,279
    /// entries (addresses allocated again while held: not a consistent history), on gpumem
    /// runs, and on a run's trace repeated so that segments' blocks are carved again and again.
    #[test]
    fn the_sharded_walk_equals_the_sequential_walk() {
        let s = crate::snapshot::load_with(
            &root().join("fixtures/snapshots/grown_mlp_leak_x8.pickle"),
            1,
            None,
        )
        .unwrap();
        let w = walk_parallel(&s.segments, &s.events, &s.conf).expect("disjoint segments");
        let seq = walk_sequential(&s.segments, &s.events, &s.conf);
        assert!(w.inconsistent > 0, "the grown trace reuses addresses");
        same(&w, &seq, "grown snapshot");
        for preset in [
            "mlp_leak.toml",
            "gpt2_small_sdpa_adamw.toml",
            "x_mlp_adamw_bf16.toml",
        ] {
            let (segs, events, conf) = run_events(preset);
            let w = walk_parallel(&segs, &events, &conf).expect("disjoint segments");
            same(&w, &walk_sequential(&segs, &events, &conf), preset);
            // the trace three times over, its segment events kept only in the first copy
            let mut rep = events.clone();
            for _ in 0..2 {
                rep.extend(events.iter().filter(|e| {
                    !matches!(e.kind(), EventKind::SegmentAlloc | EventKind::SegmentFree)
                }));
            }
            let w = walk_parallel(&segs, &rep, &conf).expect("disjoint segments");
            same(&w, &walk_sequential(&segs, &rep, &conf), preset);
        }
    }

    /// Segments whose address ranges overlap (one range reused by a segment of another size)
    /// cannot be sharded: the walk is then sequential.
    #[test]
    fn overlapping_segments_are_walked_sequentially() {
        let st = crate::trace::StackId::ROOT;
        let ev = |k, a, s| Event::new(k, a, s, st, 0);
        let events = vec![
            ev(EventKind::SegmentAlloc, 1 << 30, 20 << 20),
            ev(EventKind::Alloc, 1 << 30, 4 << 20),
            ev(EventKind::FreeRequested, 1 << 30, 4 << 20),
            ev(EventKind::SegmentFree, 1 << 30, 20 << 20),
            ev(EventKind::SegmentAlloc, (1 << 30) + (2 << 20), 40 << 20),
        ];
        assert!(walk_parallel(&[], &events, &AllocConf::default()).is_none());
        let w = walk(&[], &events, &AllocConf::default());
        same(
            &w,
            &walk_sequential(&[], &events, &AllocConf::default()),
            "overlap",
        );
    }
}
