//! What held memory at a run's peak: the event trace replayed to the moment the requested
//! bytes were highest, its live allocations summed by tag stack.

use std::collections::HashMap;

use crate::analysis::record::PeakBreakdown;
use crate::engine::Category;

/// Replays the event ring to the moment allocated memory was highest and sums the live
/// allocations there by category and by tag stack.
pub(super) fn peak_breakdown<S: crate::alloc::SegmentSource>(
    a: &crate::alloc::CachingAllocator<S>,
) -> PeakBreakdown {
    use crate::trace::EventKind;
    let rec = a.recorder();
    // the ring is walked twice rather than copied: to the peak of requested bytes, then
    // to the live set there. Every free's event carries the size its allocation asked for,
    // so the running sum of the events' sizes is the requested bytes less what was live
    // when the ring's oldest kept event was recorded: the same highest moment, without
    // knowing which allocations those were (where the oldest events are gone).
    let mut cur: i64 = 0;
    // (the highest moment after an allocation: where the ring's first kept events are frees
    // of older ones, its start may be higher, but nothing of its live set is known there)
    let mut best: (i64, usize) = (i64::MIN, 0);
    for (i, e) in rec.ring.iter().enumerate() {
        match e.kind() {
            EventKind::Alloc => {
                cur += e.size() as i64;
                if cur > best.0 {
                    best = (cur, i + 1);
                }
            }
            EventKind::FreeRequested => cur -= e.size() as i64,
            _ => {}
        }
    }
    // what was live before the ring's first event: what is live now less the ring's sum
    let before = (a.stats().requested_bytes.all().current - cur).max(0);
    let best = match best {
        (_, 0) => (before as u64, 0),
        (b, i) => ((before + b).max(0) as u64, i),
    };
    // the live set at the peak (sized for the most allocations live at once)
    let most = a.stats().allocation.all().peak.max(0) as usize;
    let mut at_peak: rustc_hash::FxHashMap<u64, (u64, crate::trace::StackId)> =
        rustc_hash::FxHashMap::with_capacity_and_hasher(most, Default::default());
    for e in rec.ring.iter().take(best.1) {
        match e.kind() {
            EventKind::Alloc => {
                at_peak.insert(e.addr, (e.size(), e.stack));
            }
            EventKind::FreeRequested => {
                at_peak.remove(&e.addr);
            }
            _ => {}
        }
    }
    let mut by_cat: HashMap<Category, u64> = HashMap::new();
    let mut by_stack: HashMap<String, u64> = HashMap::new();
    for (size, stack) in at_peak.values() {
        let tags = rec.tags.resolve(*stack);
        let cat = tags
            .iter()
            .rev()
            .find_map(|t| t.strip_prefix("category:"))
            .and_then(|c| Category::ALL.iter().copied().find(|k| k.name() == c))
            .unwrap_or(Category::Temporary);
        *by_cat.entry(cat).or_default() += size;
        let name = tags
            .iter()
            .filter(|t| !t.starts_with("category:"))
            .copied()
            .collect::<Vec<_>>()
            .join("/");
        *by_stack.entry(name).or_default() += size;
    }
    let mut by_category: Vec<(Category, u64)> = by_cat.into_iter().collect();
    by_category.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut top_tags: Vec<(String, u64)> = by_stack.into_iter().collect();
    top_tags.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top_tags.truncate(10);
    PeakBreakdown {
        peak_allocated: best.0,
        peak_reserved: 0,
        by_category,
        top_tags,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocConf, CachingAllocator, SimSource};
    use crate::trace::Recorder;

    fn allocator(ring: usize) -> CachingAllocator<SimSource> {
        let mut a = CachingAllocator::new(AllocConf::default(), SimSource::new(1 << 40, 0));
        a.set_recorder(Recorder::new(ring));
        a
    }

    /// The peak's moment and its live set where the ring kept every event, and where it lost
    /// the oldest: a free of an allocation older than the ring still lowers the running sum,
    /// so the moment found is the window's highest (the bytes counted from what is live now).
    #[test]
    fn the_peak_is_found_whether_or_not_the_ring_wrapped() {
        let mib = 1u64 << 20;
        for ring in [1024, 4] {
            let mut a = allocator(ring);
            let old = a.malloc(64 * mib, 0).unwrap();
            a.recorder_mut().push_tag("small");
            let s = a.malloc(4 * mib, 0).unwrap();
            a.recorder_mut().pop_tag();
            // the old allocation goes; then two that together stay below old + small
            a.free(old).unwrap();
            a.recorder_mut().push_tag("late");
            let x = a.malloc(8 * mib, 0).unwrap();
            let y = a.malloc(8 * mib, 0).unwrap();
            a.recorder_mut().pop_tag();
            let p = peak_breakdown(&a);
            if ring == 1024 {
                // every event kept: the peak is old + small, the moment small was allocated
                assert_eq!(p.peak_allocated, 68 * mib);
                assert!(p
                    .top_tags
                    .iter()
                    .any(|(t, b)| t == "small" && *b == 4 * mib));
            } else {
                // the first allocation's events are gone; the window's highest is the end
                assert!(a.recorder().ring.dropped() > 0);
                assert_eq!(p.peak_allocated, 20 * mib);
                let late: u64 = p
                    .top_tags
                    .iter()
                    .filter(|(t, _)| t == "late")
                    .map(|(_, b)| b)
                    .sum();
                assert_eq!(late, 16 * mib, "{:?}", p.top_tags);
            }
            let _ = (s, x, y);
        }
    }
}
