//! What a snapshot says: the allocator's state (from its segments), where the memory is by
//! allocation site, fragmentation, and, from its trace, the peak and who held memory then,
//! leaks across iterations and each out-of-memory.
//!
//! A PyTorch trace starts when recording started, not at the process's start, and records
//! requested sizes: allocated memory over the trace is the state at the end, walked back
//! through the trace, with each request rounded as the allocator rounds it.

use rustc_hash::FxHashMap;

use super::fragmentation::{self, Fragmentation};
use super::leaks::{self, LeakOptions, LeakReport};
use super::stacks::describe;
use crate::alloc::{AllocConf, BlockState, PoolKind, SegmentInfo, SimAllocator, SimSource};
use crate::trace::{Event, EventKind, StackId, Tags};

/// Totals of one pool (or all) in the state the segments hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolState {
    pub segments: u64,
    pub reserved_bytes: u64,
    /// Block sizes of allocated blocks (PyTorch's `allocated_bytes`).
    pub allocated_bytes: u64,
    /// Allocated plus pending frees (`active_bytes`).
    pub active_bytes: u64,
    pub requested_bytes: u64,
    /// Free blocks that are pieces of split segments (`inactive_split_bytes`).
    pub inactive_split_bytes: u64,
    pub inactive_split_blocks: u64,
    pub allocations: u64,
    /// Every free block, split or not (`memory_viz`'s "total free").
    pub free_bytes: u64,
    pub largest_free_bytes: u64,
}

impl PoolState {
    /// The state of two devices (or pools) together: sums, and the larger largest block.
    pub fn add(&mut self, o: &PoolState) {
        self.segments += o.segments;
        self.reserved_bytes += o.reserved_bytes;
        self.allocated_bytes += o.allocated_bytes;
        self.active_bytes += o.active_bytes;
        self.requested_bytes += o.requested_bytes;
        self.inactive_split_bytes += o.inactive_split_bytes;
        self.inactive_split_blocks += o.inactive_split_blocks;
        self.allocations += o.allocations;
        self.free_bytes += o.free_bytes;
        self.largest_free_bytes = self.largest_free_bytes.max(o.largest_free_bytes);
    }
}

/// Segments of a pool other than the default one: a CUDA graph's private pool or a
/// `torch.cuda.MemPool` (memory the default pool cannot reuse).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PrivatePool {
    /// PyTorch's `segment_pool_id`.
    pub pool_id: [i64; 2],
    /// `cuda_graph` ((N, 0): made by a graph capture) or `mem_pool` ((0, N): made by
    /// `torch.cuda.MemPool()` or `graph_pool_handle()`).
    pub kind: &'static str,
    pub segments: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
}

/// The private pools of a snapshot's segments, by pool id.
pub fn private_pools(segments: &[SegmentInfo], pools: &[(u64, [i64; 2])]) -> Vec<PrivatePool> {
    let mut out: Vec<PrivatePool> = Vec::new();
    for s in segments {
        let Ok(i) = pools.binary_search_by_key(&s.address, |p| p.0) else {
            continue;
        };
        let id = pools[i].1;
        let at = match out.iter().position(|p| p.pool_id == id) {
            Some(k) => k,
            None => {
                out.push(PrivatePool {
                    pool_id: id,
                    kind: if id[0] != 0 { "cuda_graph" } else { "mem_pool" },
                    segments: 0,
                    reserved_bytes: 0,
                    allocated_bytes: 0,
                });
                out.len() - 1
            }
        };
        let p = &mut out[at];
        p.segments += 1;
        p.reserved_bytes += s.total_size;
        p.allocated_bytes += s.allocated_size;
    }
    out.sort_by_key(|p| p.pool_id);
    out
}

/// Bytes held by one allocation site.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SiteBytes {
    pub site: String,
    pub bytes: u64,
    pub blocks: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TraceSummary {
    pub entries: u64,
    pub allocs: u64,
    pub frees: u64,
    pub segment_allocs: u64,
    pub segment_frees: u64,
    /// Allocated bytes when the trace starts (the end state walked back).
    pub allocated_at_start: u64,
    /// The highest allocated bytes over the trace, and the event where it was reached.
    pub peak_allocated_bytes: u64,
    pub peak_event: u64,
    /// Who held memory at the peak, largest first.
    pub top_sites_at_peak: Vec<SiteBytes>,
    /// What held memory at the peak, by category (`other` where the stack names none).
    pub peak_by_category: Vec<(String, u64)>,
    /// The highest reserved bytes over the trace.
    pub peak_reserved_bytes: u64,
    pub iterations: u32,
    /// Allocations at an address the trace still had allocated: the history is not
    /// consistent (entries lost, or a file stitched together), so its figures are estimates.
    pub inconsistent_allocs: u64,
}

/// An `oom` entry of the trace.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OomEvent {
    pub event: u64,
    /// The request as the allocator rounded it.
    pub requested: u64,
    pub device_free: u64,
    /// Allocated and reserved bytes just before it (from the trace).
    pub allocated: u64,
    pub reserved: u64,
    /// Capacity or fragmentation, from the state at the failure; `None` (written
    /// "undetermined") where the device had room for a new segment of the request: a limit
    /// the snapshot does not record refused it, and the verdict depends on that limit.
    #[serde(serialize_with = "verdict_or_undetermined")]
    pub verdict: Option<super::oom::Verdict>,
    pub explanation: String,
    pub site: String,
}

fn verdict_or_undetermined<S: serde::Serializer>(
    v: &Option<super::oom::Verdict>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.map_or("undetermined", |v| v.name()))
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Summary {
    pub all: PoolState,
    pub large: PoolState,
    pub small: PoolState,
    pub fragmentation: Fragmentation,
    /// Allocated blocks by allocation site, largest first.
    pub live_by_site: Vec<SiteBytes>,
    pub trace: Option<TraceSummary>,
    pub leaks: LeakReport,
    pub ooms: Vec<OomEvent>,
}

/// One device of one file, as a row of the table of ranks.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceRow {
    pub file: String,
    pub device: u32,
    pub state: PoolState,
    /// Over the trace (none without one).
    pub peak_allocated_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    pub trace_entries: u64,
    pub ooms: usize,
    /// Leaking sites; `None` where leaks were not looked for (too few iterations).
    pub leaks: Option<usize>,
}

impl DeviceRow {
    /// What this rank reserved at least: its peak over the trace, and never less than what
    /// the snapshot holds reserved (the only figure of a snapshot without a trace).
    pub fn reserved_at_least(&self) -> u64 {
        self.peak_reserved_bytes
            .unwrap_or(0)
            .max(self.state.reserved_bytes)
    }

    pub fn of(file: &str, s: &crate::snapshot::Snapshot, m: &Summary) -> DeviceRow {
        DeviceRow {
            file: file.to_string(),
            device: s.device,
            state: m.all.clone(),
            peak_allocated_bytes: m.trace.as_ref().map(|t| t.peak_allocated_bytes),
            peak_reserved_bytes: m.trace.as_ref().map(|t| t.peak_reserved_bytes),
            trace_entries: m.trace.as_ref().map_or(0, |t| t.entries),
            ooms: m.ooms.len(),
            leaks: m.leaks.checked.map(|_| m.leaks.leaks.len()),
        }
    }
}

/// One column of the table of ranks across its rows: the largest and smallest value, the row
/// of each, and the spread between them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Spread {
    pub column: &'static str,
    pub max: u64,
    pub max_row: usize,
    pub min: u64,
    pub min_row: usize,
    pub spread: u64,
}

/// The byte columns of the table of ranks, as (name, value of a row).
pub type Column = (&'static str, fn(&DeviceRow) -> Option<u64>);

pub const RANK_COLUMNS: [Column; 6] = [
    ("reserved", |r| Some(r.state.reserved_bytes)),
    ("allocated", |r| Some(r.state.allocated_bytes)),
    ("inactive_split", |r| Some(r.state.inactive_split_bytes)),
    ("largest free", |r| Some(r.state.largest_free_bytes)),
    ("peak allocated", |r| r.peak_allocated_bytes),
    ("peak reserved", |r| r.peak_reserved_bytes),
];

/// The largest, smallest and spread of each byte column over the rows that have it.
pub fn spread(rows: &[DeviceRow]) -> Vec<Spread> {
    let mut out = Vec::new();
    for (column, f) in RANK_COLUMNS {
        let vals: Vec<(usize, u64)> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, r)| f(r).map(|v| (i, v)))
            .collect();
        // the first row wins ties, so the answer does not depend on the order of reading
        let Some(&(max_row, max)) = vals.iter().rev().max_by_key(|(_, v)| *v) else {
            continue;
        };
        let &(min_row, min) = vals.iter().min_by_key(|(_, v)| *v).expect("non-empty");
        out.push(Spread {
            column,
            max,
            max_row,
            min,
            min_row,
            spread: max - min,
        });
    }
    out
}

pub(super) fn pool_state(segs: &[SegmentInfo], pool: Option<PoolKind>) -> PoolState {
    let mut p = PoolState::default();
    for s in segs.iter().filter(|s| pool.is_none_or(|k| s.pool == k)) {
        p.segments += 1;
        p.reserved_bytes += s.total_size;
        let split = s.blocks.len() > 1;
        for b in &s.blocks {
            match b.state {
                BlockState::ActiveAllocated => {
                    p.allocated_bytes += b.size;
                    p.active_bytes += b.size;
                    p.requested_bytes += b.requested_size;
                    p.allocations += 1;
                }
                BlockState::ActivePendingFree => p.active_bytes += b.size,
                BlockState::Inactive => {
                    p.free_bytes += b.size;
                    p.largest_free_bytes = p.largest_free_bytes.max(b.size);
                    if split {
                        p.inactive_split_bytes += b.size;
                        p.inactive_split_blocks += 1;
                    }
                }
            }
        }
    }
    p
}

fn top(m: FxHashMap<String, (u64, u64)>, n: usize) -> Vec<SiteBytes> {
    let mut v: Vec<SiteBytes> = m
        .into_iter()
        .map(|(site, (bytes, blocks))| SiteBytes {
            site,
            bytes,
            blocks,
        })
        .collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
    v.truncate(n);
    v
}

/// A stack's site: its tags without iteration and category; C++ frames are folded away
/// unless full stacks were asked for, so allocations from one Python line are one site.
fn site_of(tags: &Tags, s: StackId, full: bool) -> String {
    let resolved = tags.resolve(s);
    let kept: Vec<&str> = if full {
        resolved
    } else {
        let had_frames = resolved.iter().any(|t| t.starts_with("[C++] "));
        let k: Vec<&str> = resolved
            .into_iter()
            .filter(|t| !t.starts_with("[C++] "))
            .collect();
        if had_frames && !k.iter().any(|t| super::stacks::is_python_frame(t)) {
            return super::stacks::NO_PYTHON_FRAMES.into();
        }
        k
    };
    let m = describe(&kept);
    if m.site.is_empty() {
        super::stacks::NO_FRAMES.into()
    } else {
        m.site
    }
}

/// Summarizes segments and a trace. `conf` rounds requests as the allocator did; sites keep
/// C++ frames when `full_stacks`.
pub fn summarize(
    segments: &[SegmentInfo],
    events: &[Event],
    tags: &Tags,
    conf: &AllocConf,
    top_n: usize,
    full: bool,
) -> Summary {
    // the trace's analyses are independent: run them side by side
    let rounder = SimAllocator::new(conf.clone(), SimSource::new(1 << 40, 0));
    let round = |n: u64| rounder.round_size(n);
    let all = pool_state(segments, None);
    let (leaks, trace, ooms) = std::thread::scope(|sc| {
        let leaks = sc.spawn(|| leaks::find(events, tags, &round, LeakOptions::default()));
        let ooms = sc.spawn(|| oom_events(segments, events, tags, conf, &all, full));
        let trace = (!events.is_empty())
            .then(|| trace_summary(segments, events, tags, conf, top_n, &all, full));
        (
            leaks
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p)),
            trace,
            ooms.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
        )
    });
    let frag = fragmentation::analyze(segments);
    // summed per stack first, then per site: a site is described (and hashed) once per
    // stack, however many blocks share it
    let mut per_stack: FxHashMap<StackId, (u64, u64)> = FxHashMap::default();
    for s in segments {
        for b in s
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
        {
            let e = per_stack.entry(b.stack).or_default();
            e.0 += b.size;
            e.1 += 1;
        }
    }
    let mut live: FxHashMap<String, (u64, u64)> = FxHashMap::default();
    for (stack, (bytes, n)) in per_stack {
        let e = live.entry(site_of(tags, stack, full)).or_default();
        e.0 += bytes;
        e.1 += n;
    }
    Summary {
        large: pool_state(segments, Some(PoolKind::Large)),
        small: pool_state(segments, Some(PoolKind::Small)),
        all,
        fragmentation: frag,
        live_by_site: top(live, top_n),
        trace,
        leaks,
        ooms,
    }
}

use super::walk::{walk, Walk};

/// The highest of `after` (allocated relative to the trace's start) plus `start`: the event and
/// the bytes.
pub(super) fn peak_of(after: &[i64], start: i64) -> (usize, u64) {
    let (i, rel) = after
        .iter()
        .enumerate()
        .max_by_key(|(i, v)| (**v, std::cmp::Reverse(*i)))
        .map(|(i, v)| (i, *v))
        .unwrap_or((0, 0));
    (i, (start + rel.max(0)) as u64)
}

/// The highest reserved bytes over the trace, anchored at the segments it ends with.
fn reserved_peak(segments: &[SegmentInfo], events: &[Event]) -> u64 {
    use rayon::prelude::*;
    let seg = |e: &&Event| {
        matches!(
            e.kind(),
            EventKind::SegmentAlloc
                | EventKind::SegmentMap
                | EventKind::SegmentFree
                | EventKind::SegmentUnmap
        )
    };
    // segment events are few: found on all cores, then walked in order
    let seg_events: Vec<&Event> = events.par_iter().filter(seg).collect();
    let (mut res, mut res_peak) = (0i64, 0i64);
    for e in seg_events {
        match e.kind() {
            EventKind::SegmentAlloc | EventKind::SegmentMap => res += e.size() as i64,
            _ => res -= e.size() as i64,
        }
        res_peak = res_peak.max(res);
    }
    let res_end: i64 = segments.iter().map(|s| s.total_size as i64).sum();
    (res_end - res + res_peak).max(res_end) as u64
}

/// The peaks a trace shows: allocated (block sizes as the trace's segments give them) and
/// reserved, anchored at the state the segments hold at its end.
pub fn trace_peaks(segments: &[SegmentInfo], events: &[Event], conf: &AllocConf) -> (u64, u64) {
    let end = pool_state(segments, None);
    let w = walk(segments, events, conf);
    let start = (end.allocated_bytes as i64 - w.net).max(0);
    let (_, peak) = peak_of(&w.after, start);
    (
        peak.max(end.allocated_bytes),
        reserved_peak(segments, events),
    )
}

/// Which of `k` parts of a shard an address is in.
fn sub(addr: u64, k: u64) -> u64 {
    if k <= 1 {
        return 0;
    }
    // other bits of the hash than the shard's own
    (super::walk::addr_hash(addr) >> 24) % k
}

/// Who held memory at the peak, from the events of some addresses.
struct AtPeak {
    by_stack: FxHashMap<(StackId, Option<StackId>), (u64, u64)>,
    freed_before_alloc_after_peak: Vec<(u64, u64)>,
    allocated_in_trace: rustc_hash::FxHashSet<u64>,
}

/// Addresses the trace allocated (or freed first), kept per shard when walked in shards.
enum InTrace<'a> {
    One(rustc_hash::FxHashSet<u64>),
    Sharded(
        &'a super::walk::Shards,
        Vec<Vec<rustc_hash::FxHashSet<u64>>>,
    ),
}

impl InTrace<'_> {
    fn contains(&self, addr: u64) -> bool {
        match self {
            InTrace::One(s) => s.contains(&addr),
            InTrace::Sharded(sh, sets) => {
                let s = &sets[sh.of(addr)];
                s[sub(addr, s.len() as u64) as usize].contains(&addr)
            }
        }
    }
}

/// The allocations alive at event `peak_i` among the events `idx` (every event of their
/// addresses, in order), summed by stack (and the stack of a retag, if any).
fn at_peak(
    events: impl Iterator<Item = (usize, Event)>,
    peak_i: usize,
    block_of: &[u64],
    round: &dyn Fn(u64) -> u64,
) -> AtPeak {
    let mut alive: FxHashMap<u64, (u64, StackId)> = FxHashMap::default();
    let mut retagged: FxHashMap<u64, StackId> = FxHashMap::default();
    let mut allocated_in_trace: rustc_hash::FxHashSet<u64> = Default::default();
    let mut freed_before_alloc_after_peak: Vec<(u64, u64)> = Vec::new();
    for (i, e) in events {
        match e.kind() {
            EventKind::Alloc => {
                allocated_in_trace.insert(e.addr);
                if i <= peak_i {
                    let b = match block_of[i] {
                        0 => round(e.size()),
                        b => b,
                    };
                    alive.insert(e.addr, (b, e.stack));
                    retagged.remove(&e.addr);
                }
            }
            EventKind::Retag if i <= peak_i && alive.contains_key(&e.addr) => {
                retagged.insert(e.addr, e.stack);
            }
            EventKind::FreeRequested => {
                if i <= peak_i {
                    if alive.remove(&e.addr).is_none() && !allocated_in_trace.contains(&e.addr) {
                        // from before the trace, gone before the peak
                        allocated_in_trace.insert(e.addr);
                    }
                } else if !allocated_in_trace.contains(&e.addr) {
                    freed_before_alloc_after_peak.push((e.addr, round(e.size())));
                    allocated_in_trace.insert(e.addr);
                }
            }
            _ => {}
        }
    }
    // sum by stack first (cheap), then name each stack once
    let mut by_stack: FxHashMap<(StackId, Option<StackId>), (u64, u64)> = FxHashMap::default();
    for (addr, (b, s)) in &alive {
        let e = by_stack
            .entry((*s, retagged.get(addr).copied()))
            .or_default();
        e.0 += b;
        e.1 += 1;
    }
    AtPeak {
        by_stack,
        freed_before_alloc_after_peak,
        allocated_in_trace,
    }
}

fn trace_summary(
    segments: &[SegmentInfo],
    events: &[Event],
    tags: &Tags,
    conf: &AllocConf,
    top_n: usize,
    end: &PoolState,
    full: bool,
) -> TraceSummary {
    let Walk {
        after,
        net,
        block: block_of,
        inconsistent,
        shards,
    } = walk(segments, events, conf);
    let rounder = super::blocks::Sizer::new(conf);
    let round = |n: u64| rounder.round(n);
    let start = (end.allocated_bytes as i64 - net).max(0);
    let (peak_i, peak) = peak_of(&after, start);
    // who held memory at the peak: allocations of the trace alive then, and blocks from
    // before the trace that were still alive (freed later, or never); per address, so per
    // shard of the walk when it has them
    let (by_stack, freed_before_alloc_after_peak, allocated_in_trace) = match &shards {
        Some(sh) => {
            use rayon::prelude::*;
            // a big shard is split further by address (what is kept here is per address)
            let big = events.len() / (rayon::current_num_threads() * 4).max(1);
            let tasks: Vec<(usize, u64, u64)> = (0..sh.count())
                .flat_map(|s| {
                    let k = (sh.len(s) / big.max(1)).clamp(1, 16) as u64;
                    (0..k).map(move |b| (s, b, k))
                })
                .collect();
            let parts: Vec<AtPeak> = tasks
                .par_iter()
                .with_max_len(1)
                .map(|&(s, b, k)| {
                    at_peak(
                        sh.shard(s)
                            .filter(|&i| k == 1 || sub(events[i].addr, k) == b)
                            .map(|i| (i, events[i])),
                        peak_i,
                        &block_of,
                        &round,
                    )
                })
                .collect();
            let mut by_stack: FxHashMap<(StackId, Option<StackId>), (u64, u64)> =
                FxHashMap::default();
            let mut freed = Vec::new();
            let mut sets: Vec<Vec<rustc_hash::FxHashSet<u64>>> = vec![Vec::new(); sh.count()];
            for (p, &(s, _, _)) in parts.into_iter().zip(&tasks) {
                for (k, v) in p.by_stack {
                    let e = by_stack.entry(k).or_default();
                    e.0 += v.0;
                    e.1 += v.1;
                }
                freed.extend(p.freed_before_alloc_after_peak);
                sets[s].push(p.allocated_in_trace);
            }
            (by_stack, freed, InTrace::Sharded(sh, sets))
        }
        None => {
            let p = at_peak(
                events.iter().copied().enumerate(),
                peak_i,
                &block_of,
                &round,
            );
            (
                p.by_stack,
                p.freed_before_alloc_after_peak,
                InTrace::One(p.allocated_in_trace),
            )
        }
    };
    let mut by_site: FxHashMap<String, (u64, u64)> = FxHashMap::default();
    let mut by_cat: FxHashMap<String, (u64, u64)> = FxHashMap::default();
    for ((s, retag), (b, n)) in by_stack {
        let e = by_site.entry(site_of(tags, s, full)).or_default();
        e.0 += b;
        e.1 += n;
        let cat = retag
            .and_then(|r| describe(&tags.resolve(r)).category)
            .or_else(|| describe(&tags.resolve(s)).category)
            .unwrap_or_else(|| "other".into());
        by_cat.entry(cat).or_default().0 += b;
    }
    let before = "(allocated before the trace started)".to_string();
    for (_, b) in &freed_before_alloc_after_peak {
        let e = by_site.entry(before.clone()).or_default();
        e.0 += b;
        e.1 += 1;
        by_cat.entry("other".into()).or_default().0 += b;
    }
    // summed per stack first, as for the live blocks
    let mut untraced: FxHashMap<StackId, (u64, u64)> = FxHashMap::default();
    for s in segments {
        for b in s
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
        {
            if !allocated_in_trace.contains(b.address) {
                let e = untraced.entry(b.stack).or_default();
                e.0 += b.size;
                e.1 += 1;
            }
        }
    }
    for (stack, (bytes, n)) in untraced {
        let e = by_site.entry(site_of(tags, stack, full)).or_default();
        e.0 += bytes;
        e.1 += n;
        let cat = describe(&tags.resolve(stack))
            .category
            .unwrap_or_else(|| "other".into());
        by_cat.entry(cat).or_default().0 += bytes;
    }
    let peak_reserved = reserved_peak(segments, events);
    use rayon::prelude::*;
    let counts = events
        .par_iter()
        .fold(
            || [0u64; 16],
            |mut c, e| {
                c[e.kind() as usize] += 1;
                c
            },
        )
        .reduce(
            || [0u64; 16],
            |mut a, b| {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                a
            },
        );
    let count = |k: EventKind| counts[k as usize];
    // the iteration of each distinct stack (few), not of each event; an iteration counts when
    // it allocates (a boundary followed only by frees starts none, as the timeline draws it)
    let stacks: rustc_hash::FxHashSet<StackId> = events
        .par_iter()
        .fold(rustc_hash::FxHashSet::default, |mut s, e| {
            if e.kind() == EventKind::Alloc {
                s.insert(e.stack);
            }
            s
        })
        .reduce(rustc_hash::FxHashSet::default, |mut a, b| {
            a.extend(b);
            a
        });
    let mut ann = super::stacks::Annotator::new(tags);
    // the iterations that allocated (a trace that starts after its first zero_grad has no
    // iteration 0: one iteration, as the plot marks it, not two)
    let iterations = stacks
        .into_iter()
        .filter_map(|s| match ann.meta(s).when {
            super::stacks::When::Iteration(n) => Some(n),
            _ => None,
        })
        .collect::<rustc_hash::FxHashSet<u32>>()
        .len() as u32;
    TraceSummary {
        entries: events.len() as u64,
        allocs: count(EventKind::Alloc),
        frees: count(EventKind::FreeRequested),
        segment_allocs: count(EventKind::SegmentAlloc) + count(EventKind::SegmentMap),
        segment_frees: count(EventKind::SegmentFree) + count(EventKind::SegmentUnmap),
        allocated_at_start: start as u64,
        peak_allocated_bytes: peak,
        peak_event: peak_i as u64,
        top_sites_at_peak: top(by_site, top_n),
        peak_by_category: top(by_cat, usize::MAX)
            .into_iter()
            .map(|s| (s.site, s.bytes))
            .collect(),
        peak_reserved_bytes: peak_reserved,
        iterations,
        inconsistent_allocs: inconsistent,
    }
}

fn oom_events(
    segments: &[SegmentInfo],
    events: &[Event],
    tags: &Tags,
    conf: &AllocConf,
    end: &PoolState,
    full: bool,
) -> Vec<OomEvent> {
    use crate::units::format_bytes as b;
    if !events.iter().any(|e| e.kind() == EventKind::Oom) {
        return Vec::new();
    }
    let Walk { after, net, .. } = walk(segments, events, conf);
    let start = end.allocated_bytes as i64 - net;
    // reserved over the trace, walked back from the segments the same way
    let mut res_rel: i64 = 0;
    let mut res_after = Vec::with_capacity(events.len());
    for e in events {
        match e.kind() {
            EventKind::SegmentAlloc | EventKind::SegmentMap => res_rel += e.size() as i64,
            EventKind::SegmentFree | EventKind::SegmentUnmap => res_rel -= e.size() as i64,
            _ => {}
        }
        res_after.push(res_rel);
    }
    let res_start = segments.iter().map(|s| s.total_size).sum::<u64>() as i64 - res_rel;
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if e.kind() != EventKind::Oom {
            continue;
        }
        let allocated = (start + if i > 0 { after[i - 1] } else { 0 }).max(0) as u64;
        let reserved = (res_start + res_after[i]).max(0) as u64;
        let requested = e.size();
        let device_free = e.addr;
        let fits = allocated + requested <= reserved + device_free;
        let verdict = if fits {
            super::oom::Verdict::Fragmentation
        } else {
            super::oom::Verdict::Capacity
        };
        // room on the device for a new segment of the request (20 MiB, the most a request
        // below 10 MiB takes; larger ones round up by 2 MiB at most): a limit below the
        // device's memory refused it
        let limited = device_free >= requested.saturating_add(20 << 20);
        let explanation = if limited {
            format!(
                "refused below the device's memory: {} allocated and {} reserved, and the \
                 device had {} free, room for a new segment of the {} asked for; a limit the \
                 snapshot does not record stopped it (a per-process memory fraction, or the \
                 process's share of a GPU), so whether it is fragmentation or capacity depends \
                 on that limit (gpumem replay --capacity LIMIT)",
                b(allocated),
                b(reserved),
                b(device_free),
                b(requested)
            )
        } else if fits {
            format!(
                "fragmentation: {} allocated plus the {} asked for would fit in the {} reserved \
                 and the {} the device had free, but no free block or new segment could hold it",
                b(allocated),
                b(requested),
                b(reserved),
                b(device_free)
            )
        } else {
            format!(
                "out of capacity: {} allocated plus the {} asked for is more than the {} \
                 reserved and the {} the device had free together",
                b(allocated),
                b(requested),
                b(reserved),
                b(device_free)
            )
        };
        out.push(OomEvent {
            event: i as u64,
            requested,
            device_free,
            allocated,
            reserved,
            verdict: (!limited).then_some(verdict),
            explanation,
            site: site_of(tags, e.stack, full),
        });
    }
    out
}
