//! What an out-of-memory was, from the allocator's state at the failure and the trace.
//!
//! Two verdicts. **Capacity**: the tensors alive at the failure plus the request are more
//! than the device can give (its memory less the CUDA context, or the memory-fraction
//! limit); no allocator setting helps, the workload must need less. **Fragmentation**: they
//! would fit, but the memory not in use is in pieces: reserved-but-unallocated blocks too
//! small for the request, or free device memory too little to add a segment beside them.
//! Allocator settings (expandable segments, `max_split_size_mb`) can fix that.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::fragmentation::Fragmentation;
use super::stacks::describe;
use crate::alloc::OutOfMemory;
use crate::trace::{Event, EventKind, StackId, Tags};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Capacity,
    Fragmentation,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Capacity => "capacity",
            Verdict::Fragmentation => "fragmentation",
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OomDiagnosis {
    /// Bytes asked for, and as the allocator rounds them.
    pub requested: u64,
    pub rounded: u64,
    /// The device's memory.
    pub capacity: u64,
    /// What the allocator may hold: the device less the CUDA context, or the fraction limit.
    pub usable: u64,
    pub allocated: u64,
    pub reserved: u64,
    pub device_free: u64,
    /// The largest free block in the pool the request comes from.
    pub largest_free_block: u64,
    pub verdict: Verdict,
    /// The verdict in a sentence or two, with the figures.
    pub explanation: String,
    /// Live bytes (requested) by category, largest first.
    pub live_by_category: Vec<(String, u64)>,
    /// Live bytes by site (tags without iteration and category), largest first, at most 10.
    pub top_tags: Vec<(String, u64)>,
}

/// The allocations live after the last event: (requested bytes, stack, category stack of the
/// last retag).
pub fn live_at_end(events: &[Event]) -> Vec<(u64, StackId, Option<StackId>)> {
    let mut live: FxHashMap<u64, (u64, StackId, Option<StackId>)> = FxHashMap::default();
    for e in events {
        match e.kind() {
            EventKind::Alloc => {
                live.insert(e.addr, (e.size(), e.stack, None));
            }
            EventKind::FreeRequested => {
                live.remove(&e.addr);
            }
            EventKind::Retag => {
                if let Some(l) = live.get_mut(&e.addr) {
                    l.2 = Some(e.stack);
                }
            }
            _ => {}
        }
    }
    live.into_values().collect()
}

/// Bytes by name, largest first.
pub type ByName = Vec<(String, u64)>;

/// Live bytes by category and by site, each largest first.
pub fn live_breakdown(events: &[Event], tags: &Tags) -> (ByName, ByName) {
    let mut by_cat: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_site: BTreeMap<String, u64> = BTreeMap::new();
    for (size, stack, retag) in live_at_end(events) {
        let m = describe(&tags.resolve(stack));
        let cat = retag
            .and_then(|r| describe(&tags.resolve(r)).category)
            .or(m.category)
            .unwrap_or_else(|| "other".into());
        *by_cat.entry(cat).or_default() += size;
        let site = if m.site.is_empty() {
            "(untagged)".to_string()
        } else {
            m.site
        };
        *by_site.entry(site).or_default() += size;
    }
    let sorted = |m: BTreeMap<String, u64>| {
        let mut v: Vec<_> = m.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    };
    let mut sites = sorted(by_site);
    sites.truncate(10);
    (sorted(by_cat), sites)
}

/// Diagnoses `oom` given the segments at the failure and the trace up to it.
pub fn diagnose(
    oom: &OutOfMemory,
    usable: u64,
    frag: &Fragmentation,
    events: &[Event],
    tags: &Tags,
) -> OomDiagnosis {
    use crate::units::format_bytes as b;
    // a request of 1 MiB or less comes from the small pool
    let pool = if oom.rounded <= 1 << 20 {
        "small"
    } else {
        "large"
    };
    let largest = frag
        .pools
        .iter()
        .filter(|p| p.pool == pool)
        .map(|p| p.largest_free)
        .max()
        .unwrap_or(0);
    let unallocated = oom.reserved.saturating_sub(oom.allocated);
    let fits = oom.allocated.saturating_add(oom.rounded) <= usable;
    let verdict = if fits && !oom.over_one_exabyte {
        Verdict::Fragmentation
    } else {
        Verdict::Capacity
    };
    let explanation = match verdict {
        Verdict::Capacity => format!(
            "out of capacity: tensors alive at the failure hold {}, and with the {} asked for \
             that is {}, more than the {} the allocator may use. No allocator setting helps: \
             the workload has to need less memory.",
            b(oom.allocated),
            b(oom.rounded),
            b(oom.allocated.saturating_add(oom.rounded)),
            b(usable)
        ),
        Verdict::Fragmentation => format!(
            "fragmentation: tensors alive hold {} and the {} asked for would fit in the {} the \
             allocator may use, but {} is reserved and unallocated in {} free blocks, the \
             largest {}, and only {} of the device is free to add a segment. Allocator \
             settings can fix this without changing the model.",
            b(oom.allocated),
            b(oom.rounded),
            b(usable),
            b(unallocated),
            frag.pools.iter().map(|p| p.free_blocks).sum::<usize>(),
            b(largest),
            b(oom.device_free)
        ),
    };
    let (live_by_category, top_tags) = live_breakdown(events, tags);
    OomDiagnosis {
        requested: oom.requested,
        rounded: oom.rounded,
        capacity: oom.device_total,
        usable,
        allocated: oom.allocated,
        reserved: oom.reserved,
        device_free: oom.device_free,
        largest_free_block: largest,
        verdict,
        explanation,
        live_by_category,
        top_tags,
    }
}
