//! Leaks across iterations: memory allocated in one iteration that is still held at the end
//! of the run, iteration after iteration.
//!
//! An allocation made in iteration `j` and still live when the trace ends has outlived every
//! later iteration. In a loop without a leak only warm-up leaves such memory (Adam's state
//! and the cuBLAS workspaces come in the first iteration), and the last iteration's locals are
//! still bound when the run ends. So the iterations checked are those after the warm-up and
//! before the last; a site (the allocation's tags without the iteration) leaks when it leaves
//! memory behind in every one of them. Sites that start leaking in the same iteration are
//! reported together, as one leak: they are usually held by one reference (a kept loss holds
//! its whole graph).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::stacks::When;
use crate::trace::{EventKind, StackId, Tags};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakOptions {
    /// Iterations at the start that may keep memory for good (optimizer state, workspaces).
    pub warmup: u32,
}

impl Default for LeakOptions {
    fn default() -> Self {
        LeakOptions { warmup: 1 }
    }
}

/// One site's share of a leak.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LeakSite {
    /// The allocation's tags without the iteration and category, joined with `/`.
    pub site: String,
    pub op: Option<String>,
    pub category: String,
    pub bytes_per_iteration: u64,
    pub blocks_per_iteration: f64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Leak {
    /// Bytes left behind per checked iteration (block sizes), summed over the sites.
    pub bytes_per_iteration: u64,
    /// The sites, largest first.
    pub tags: Vec<String>,
    /// The category holding most of the leaked bytes.
    pub category: String,
    /// The first iteration that left this memory behind (it may be a warm-up iteration).
    pub first_iteration: u32,
    /// Bytes left behind by each checked iteration.
    pub per_iteration: Vec<u64>,
    pub sites: Vec<LeakSite>,
    /// What usually causes it, in a user's words.
    pub cause: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LeakReport {
    /// Complete iterations in the trace.
    pub iterations: u32,
    /// The iterations checked (first, last), when there are enough.
    pub checked: Option<(u32, u32)>,
    pub leaks: Vec<Leak>,
    /// Why nothing could be checked, when so.
    pub note: Option<String>,
}

struct Live {
    stack: StackId,
    /// The category as of the last retag, if any.
    category: Option<StackId>,
    size: u64,
}

/// The allocations alive at the end of the trace (by address), the last iteration an
/// allocation was made in, and whether an out-of-memory came after that iteration began.
type LiveEnd = (Vec<FxHashMap<u64, Live>>, Option<u32>, bool);

fn live_sequential(
    events: &[crate::trace::Event],
    ann: &mut super::stacks::Annotator,
    block_size: &dyn Fn(u64) -> u64,
) -> LiveEnd {
    let mut live: FxHashMap<u64, Live> = FxHashMap::default();
    let mut last_iter: Option<u32> = None;
    let mut oom_in_last = false;
    for e in events {
        match e.kind() {
            EventKind::Alloc => {
                if let When::Iteration(n) = ann.meta(e.stack).when {
                    if last_iter.is_none_or(|l| n > l) {
                        last_iter = Some(n);
                        oom_in_last = false;
                    }
                }
                live.insert(
                    e.addr,
                    Live {
                        stack: e.stack,
                        category: None,
                        size: block_size(e.size()),
                    },
                );
            }
            EventKind::FreeRequested => {
                live.remove(&e.addr);
            }
            EventKind::Retag => {
                if let Some(l) = live.get_mut(&e.addr) {
                    l.category = Some(e.stack);
                }
            }
            EventKind::Oom => oom_in_last = true,
            _ => {}
        }
    }
    (vec![live], last_iter, oom_in_last)
}

/// [`live_sequential`] on all cores: the live map is per address, so each of 64 shards of
/// addresses keeps its own; the last iteration is the highest of any allocation's, and the
/// out-of-memory test looks after the first allocation of that iteration.
fn live_sharded(
    events: &[crate::trace::Event],
    ann: &mut super::stacks::Annotator,
    block_size: &dyn Fn(u64) -> u64,
) -> LiveEnd {
    use rayon::prelude::*;
    const SHARDS: usize = 64;
    let shard = |a: u64| (super::walk::addr_hash(a) >> 58) as usize % SHARDS;
    // the iteration of each distinct stack, once
    let stacks: rustc_hash::FxHashSet<StackId> = events
        .par_iter()
        .filter(|e| e.kind() == EventKind::Alloc)
        .fold(rustc_hash::FxHashSet::default, |mut s, e| {
            s.insert(e.stack);
            s
        })
        .reduce(rustc_hash::FxHashSet::default, |mut a, b| {
            a.extend(b);
            a
        });
    let iter_of: FxHashMap<StackId, Option<u32>> = stacks
        .into_iter()
        .map(|s| {
            let n = match ann.meta(s).when {
                When::Iteration(n) => Some(n),
                _ => None,
            };
            (s, n)
        })
        .collect();
    let it = |e: &crate::trace::Event| -> Option<u32> {
        (e.kind() == EventKind::Alloc)
            .then(|| iter_of[&e.stack])
            .flatten()
    };
    let last_iter = events.par_iter().filter_map(it).max();
    let oom_in_last = match last_iter {
        Some(last) => {
            let from = events.par_iter().position_first(|e| it(e) == Some(last));
            from.is_some_and(|f| events[f..].par_iter().any(|e| e.kind() == EventKind::Oom))
        }
        None => events.par_iter().any(|e| e.kind() == EventKind::Oom),
    };
    let piece = events
        .len()
        .div_ceil(rayon::current_num_threads() * 4)
        .max(1 << 14);
    let parts: Vec<Vec<Vec<u32>>> = events
        .par_chunks(piece)
        .enumerate()
        .map(|(c, evs)| {
            let mut l = vec![Vec::new(); SHARDS];
            for (k, e) in evs.iter().enumerate() {
                if matches!(
                    e.kind(),
                    EventKind::Alloc | EventKind::FreeRequested | EventKind::Retag
                ) {
                    l[shard(e.addr)].push((c * piece + k) as u32);
                }
            }
            l
        })
        .collect();
    // address → (stack, category of the last retag, requested size)
    type Alive = FxHashMap<u64, (StackId, Option<StackId>, u64)>;
    let mut live: Vec<Alive> = (0..SHARDS)
        .into_par_iter()
        .map(|s| {
            let mut live = Alive::default();
            for &i in parts.iter().flat_map(|p| p[s].iter()) {
                let e = &events[i as usize];
                match e.kind() {
                    EventKind::Alloc => {
                        live.insert(e.addr, (e.stack, None, e.size()));
                    }
                    EventKind::FreeRequested => {
                        live.remove(&e.addr);
                    }
                    _ => {
                        if let Some(l) = live.get_mut(&e.addr) {
                            l.1 = Some(e.stack);
                        }
                    }
                }
            }
            live
        })
        .collect();
    // block sizes of what is left (few), with the caller's rounding
    let live = live
        .iter_mut()
        .map(|m| {
            m.drain()
                .map(|(a, (stack, category, size))| {
                    let size = block_size(size);
                    (
                        a,
                        Live {
                            stack,
                            category,
                            size,
                        },
                    )
                })
                .collect()
        })
        .collect();
    (live, last_iter, oom_in_last)
}

/// Finds leaks in a trace whose allocations carry `iter:N` tags. `block_size` turns a request
/// into the bytes the allocator holds for it (its rounding).
pub fn find(
    events: &[crate::trace::Event],
    tags: &Tags,
    block_size: &dyn Fn(u64) -> u64,
    opts: LeakOptions,
) -> LeakReport {
    let mut ann = super::stacks::Annotator::new(tags);
    let (live, last_iter, oom_in_last) = if events.len() >= 1 << 16 {
        live_sharded(events, &mut ann, block_size)
    } else {
        live_sequential(events, &mut ann, block_size)
    };
    let mut meta = |s: StackId| ann.meta(s);
    let Some(last) = last_iter else {
        return LeakReport {
            iterations: 0,
            checked: None,
            leaks: Vec::new(),
            note: Some("no iterations were found in the trace".into()),
        };
    };
    // an iteration cut short by an out-of-memory is not complete
    let complete = if oom_in_last { last } else { last + 1 };
    let first = opts.warmup;
    if complete < first + 3 {
        return LeakReport {
            iterations: complete,
            checked: None,
            leaks: Vec::new(),
            note: Some(format!(
                "leaks need at least {} complete iterations ({} of warm-up, 2 to compare, the \
                 last one's locals still bound); this trace has {complete}",
                first + 3,
                first
            )),
        };
    }
    let checked_last = complete - 2;
    let n_checked = (checked_last - first + 1) as usize;
    // site → (first iteration seen, per checked iteration: bytes, blocks), category bytes
    struct SiteAcc {
        op: Option<String>,
        first: u32,
        bytes: Vec<u64>,
        blocks: Vec<u64>,
        categories: BTreeMap<String, u64>,
    }
    let mut sites: BTreeMap<String, SiteAcc> = BTreeMap::new();
    for l in live.iter().flat_map(|m| m.values()) {
        let m = meta(l.stack);
        let When::Iteration(j) = m.when else { continue };
        if j > checked_last {
            continue;
        }
        let category = l
            .category
            .and_then(|c| meta(c).category.clone())
            .or(m.category.clone())
            .unwrap_or_else(|| "other".into());
        let acc = sites.entry(m.site.clone()).or_insert_with(|| SiteAcc {
            op: m.op.clone(),
            first: j,
            bytes: vec![0; n_checked],
            blocks: vec![0; n_checked],
            categories: BTreeMap::new(),
        });
        acc.first = acc.first.min(j);
        if j >= first {
            let k = (j - first) as usize;
            acc.bytes[k] += l.size;
            acc.blocks[k] += 1;
            *acc.categories.entry(category).or_default() += l.size;
        }
    }
    // a site leaks when every checked iteration left some of it behind
    let mut groups: BTreeMap<u32, Vec<(String, SiteAcc)>> = BTreeMap::new();
    for (site, acc) in sites {
        if acc.bytes.iter().all(|b| *b > 0) {
            groups.entry(acc.first).or_default().push((site, acc));
        }
    }
    let mut leaks: Vec<Leak> = groups
        .into_iter()
        .map(|(first_iteration, members)| {
            let mut per_iteration = vec![0u64; n_checked];
            let mut categories: BTreeMap<String, u64> = BTreeMap::new();
            let mut out_sites: Vec<LeakSite> = members
                .into_iter()
                .map(|(site, acc)| {
                    for (k, b) in acc.bytes.iter().enumerate() {
                        per_iteration[k] += b;
                    }
                    for (c, b) in &acc.categories {
                        *categories.entry(c.clone()).or_default() += b;
                    }
                    let category = acc
                        .categories
                        .iter()
                        .max_by_key(|(_, b)| **b)
                        .map(|(c, _)| c.clone())
                        .unwrap_or_else(|| "other".into());
                    LeakSite {
                        site,
                        op: acc.op,
                        category,
                        bytes_per_iteration: mean(&acc.bytes),
                        blocks_per_iteration: acc.blocks.iter().sum::<u64>() as f64
                            / n_checked as f64,
                    }
                })
                .collect();
            out_sites.sort_by(|a, b| {
                b.bytes_per_iteration
                    .cmp(&a.bytes_per_iteration)
                    .then(a.site.cmp(&b.site))
            });
            let total: u64 = categories.values().sum();
            let category = categories
                .iter()
                .max_by_key(|(_, b)| **b)
                .map(|(c, _)| c.clone())
                .unwrap_or_else(|| "other".into());
            let activation = categories.get("activation").copied().unwrap_or(0);
            let blocks: f64 = out_sites.iter().map(|s| s.blocks_per_iteration).sum();
            let bytes_per_iteration = mean(&per_iteration);
            let cause = cause(activation * 2 >= total, bytes_per_iteration, blocks);
            Leak {
                bytes_per_iteration,
                tags: out_sites.iter().map(|s| s.site.clone()).collect(),
                category,
                first_iteration,
                per_iteration,
                sites: out_sites,
                cause,
            }
        })
        .collect();
    leaks.sort_by_key(|l| std::cmp::Reverse(l.bytes_per_iteration));
    LeakReport {
        iterations: complete,
        checked: Some((first, checked_last)),
        leaks,
        note: None,
    }
}

fn mean(v: &[u64]) -> u64 {
    if v.is_empty() {
        0
    } else {
        (v.iter().map(|x| *x as u128).sum::<u128>() / v.len() as u128) as u64
    }
}

fn cause(saved_for_backward: bool, bytes: u64, blocks: f64) -> String {
    if saved_for_backward {
        "tensors saved for backward outlive their iteration: something keeps an output \
         together with its autograd graph, e.g. `losses.append(loss)` in a training loop, or \
         keeping outputs of an evaluation loop that runs without `torch.no_grad()`. Keep \
         `loss.item()` or `out.detach()`, or evaluate under `torch.no_grad()`."
            .into()
    } else if blocks <= 2.0 && bytes <= 4096 {
        "a small tensor per iteration is kept: a list that grows, e.g. `losses.append(loss)` \
         after `backward()`. Append `loss.item()` (a Python number) instead."
            .into()
    } else {
        "memory made in every iteration is never freed: a container that grows or a \
         reference kept across iterations (a cache, a history list, a global)."
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Event, Recorder};

    /// A trace of `iters` iterations, each allocating `tmp` (freed) and, from iteration
    /// `leak_from` on, `leak` bytes never freed; iteration 0 also keeps `state` bytes.
    fn trace(iters: u32, leak_from: u32, leak: u64, state: u64) -> (Vec<Event>, Tags) {
        let mut r = Recorder::default();
        let mut addr = 0x1000;
        for i in 0..iters {
            r.set_current(crate::trace::StackId::ROOT);
            r.push_tag(&format!("iter:{i}"));
            r.push_tag("matmul");
            r.push_tag("category:temporary");
            r.record(EventKind::Alloc, addr, 4096, 0);
            r.record(EventKind::FreeRequested, addr, 4096, 0);
            addr += 0x10000;
            r.pop_tag();
            if i == 0 && state > 0 {
                r.push_tag("category:optimizer_state");
                r.record(EventKind::Alloc, addr, state, 0);
                addr += 0x10000;
                r.pop_tag();
            }
            if i >= leak_from && leak > 0 {
                r.pop_tag();
                r.push_tag("mean");
                r.push_tag("category:temporary");
                r.record(EventKind::Alloc, addr, leak, 0);
                addr += 0x10000;
            }
        }
        (r.ring.iter().copied().collect(), r.tags)
    }

    fn round512(n: u64) -> u64 {
        n.div_ceil(512).max(1) * 512
    }

    #[test]
    fn finds_a_steady_leak_and_its_site() {
        let (ev, tags) = trace(5, 0, 4, 1 << 20);
        let r = find(&ev, &tags, &round512, LeakOptions::default());
        assert_eq!(r.checked, Some((1, 3)));
        assert_eq!(r.leaks.len(), 1);
        let l = &r.leaks[0];
        assert_eq!(l.bytes_per_iteration, 512);
        assert_eq!(l.per_iteration, vec![512, 512, 512]);
        assert_eq!(l.first_iteration, 0);
        assert_eq!(l.tags, vec!["mean".to_string()]);
        assert_eq!(l.category, "temporary");
        assert!(l.cause.contains("loss.item()"), "{}", l.cause);
    }

    #[test]
    fn warmup_state_alone_is_no_leak() {
        let (ev, tags) = trace(5, u32::MAX, 0, 1 << 20);
        let r = find(&ev, &tags, &round512, LeakOptions::default());
        assert!(r.leaks.is_empty(), "{:?}", r.leaks);
        assert_eq!(r.checked, Some((1, 3)));
    }

    #[test]
    fn a_leak_that_skips_an_iteration_is_not_steady() {
        // leaks only from iteration 2: iteration 1 left nothing
        let (ev, tags) = trace(5, 2, 4, 0);
        let r = find(&ev, &tags, &round512, LeakOptions::default());
        assert!(r.leaks.is_empty());
    }

    #[test]
    fn too_few_iterations_say_so() {
        let (ev, tags) = trace(3, 0, 4, 0);
        let r = find(&ev, &tags, &round512, LeakOptions::default());
        assert!(r.leaks.is_empty());
        assert!(r.note.as_deref().unwrap().contains("at least 4"));
    }

    /// The sharded pass that finds what is alive at the end (for traces of 65,536 events
    /// and more) finds what the sequential one finds, on runs with and without a leak and on
    /// a trace repeated so that addresses are allocated again while held.
    #[test]
    fn the_sharded_live_pass_equals_the_sequential_one() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        for preset in ["mlp_leak.toml", "mlp_eval_leak.toml", "mlp_adam.toml"] {
            let path = root.join("fixtures/workloads/presets").join(preset);
            let w = crate::workload::load(&path).unwrap();
            let r = crate::runner::run(&w, &path, &Default::default()).unwrap();
            let tags = r.allocator.recorder().tags.clone();
            let events: Vec<_> = r.allocator.recorder().ring.iter().copied().collect();
            let mut rep = events.clone();
            rep.extend_from_slice(&events);
            for ev in [&events, &rep] {
                let round = |n: u64| n.div_ceil(512) * 512;
                let (mut a1, mut a2) = (
                    super::super::stacks::Annotator::new(&tags),
                    super::super::stacks::Annotator::new(&tags),
                );
                let (l1, i1, o1) = live_sequential(ev, &mut a1, &round);
                let (l2, i2, o2) = live_sharded(ev, &mut a2, &round);
                let flat = |l: &[FxHashMap<u64, Live>]| {
                    let mut v: Vec<(u64, StackId, Option<StackId>, u64)> = l
                        .iter()
                        .flat_map(|m| m.iter().map(|(a, x)| (*a, x.stack, x.category, x.size)))
                        .collect();
                    v.sort();
                    v
                };
                assert!(!flat(&l1).is_empty(), "{preset}");
                assert_eq!(flat(&l1), flat(&l2), "{preset}");
                assert_eq!((i1, o1), (i2, o2), "{preset}");
            }
        }
    }
}
