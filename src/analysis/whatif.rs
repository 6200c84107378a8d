//! "Would this setting have saved my run?": a snapshot's recorded allocations and frees
//! replayed through gpumem's allocator with other settings, against what was recorded.
//!
//! A trace starts when recording started, so blocks that were already allocated then (freed
//! in the trace before any allocation of theirs, or still allocated at the end and never
//! allocated in the trace) are allocated first, in address order. An out-of-memory the
//! recording has is asked for again: if the replay can give it, it is avoided (and freed at
//! once, since the program raised there); a request the replay cannot give is an OOM caused.

use rustc_hash::{FxHashMap, FxHashSet};

use super::fragmentation::{self, Fragmentation};
use crate::alloc::{AllocConf, BlockState, SegmentInfo, SimAllocator, SimSource};
use crate::trace::{Event, EventKind};

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Side {
    pub alloc_conf: String,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub allocated_end: u64,
    pub reserved_end: u64,
    pub ooms: u64,
    pub fragmentation_end: Fragmentation,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WhatIf {
    /// What the allocator could use in the replay.
    pub capacity: u64,
    /// Whether `capacity` is the device's (given or recorded), not [`UNLIMITED`].
    pub capacity_known: bool,
    pub original: Side,
    pub replayed: Side,
    /// Trace entries (indices) of recorded OOMs the replay could serve.
    pub ooms_avoided: Vec<u64>,
    /// Trace entries of allocations the recording served and the replay could not.
    pub ooms_caused: Vec<u64>,
    /// Blocks allocated before the trace started, allocated first.
    pub preexisting_blocks: u64,
    /// With a capacity other than the recording's (`--capacity`): the out-of-memory errors
    /// of the recorded settings replayed at it, the baseline a setting is judged against
    /// (the recording ran on its own device).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_settings_ooms: Option<u64>,
    /// Whether `capacity` is the user's (`--capacity`), not the recording's.
    #[serde(skip)]
    pub capacity_given: bool,
}

/// The capacity a PyTorch trace shows: at each recorded OOM, reserved memory plus what the
/// device had free; the smallest of them. `None` without OOMs.
pub fn capacity_from_ooms(segments: &[SegmentInfo], events: &[Event]) -> Option<u64> {
    let mut res: i64 = segments.iter().map(|s| s.total_size as i64).sum();
    for e in events {
        match e.kind() {
            EventKind::SegmentAlloc | EventKind::SegmentMap => res -= e.size() as i64,
            EventKind::SegmentFree | EventKind::SegmentUnmap => res += e.size() as i64,
            _ => {}
        }
    }
    let mut best: Option<u64> = None;
    for e in events {
        match e.kind() {
            EventKind::SegmentAlloc | EventKind::SegmentMap => res += e.size() as i64,
            EventKind::SegmentFree | EventKind::SegmentUnmap => res -= e.size() as i64,
            EventKind::Oom => {
                let c = res.max(0) as u64 + e.addr;
                best = Some(best.map_or(c, |b| b.min(c)));
            }
            _ => {}
        }
    }
    best
}

fn original(segments: &[SegmentInfo], events: &[Event], conf: &AllocConf) -> Side {
    let (peak_allocated, peak_reserved) = super::summary::trace_peaks(segments, events, conf);
    Side {
        alloc_conf: conf.raw.clone(),
        peak_allocated,
        peak_reserved,
        allocated_end: segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.size)
            .sum(),
        reserved_end: segments.iter().map(|s| s.total_size).sum(),
        ooms: events.iter().filter(|e| e.kind() == EventKind::Oom).count() as u64,
        fragmentation_end: fragmentation::analyze(segments),
    }
}

/// The capacity of a replay whose device's memory is not known: more than any GPU has, so
/// nothing runs out (and a replay that would is not judged).
pub const UNLIMITED: u64 = 1 << 44;

/// A recorded allocator trace (PyTorch's figures after each op) against its replay under
/// other settings.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TraceWhatIf {
    pub capacity: u64,
    pub original: TraceSide,
    pub replayed: TraceSide,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct TraceSide {
    pub alloc_conf: String,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub allocated_end: u64,
    pub reserved_end: u64,
    pub ooms: u64,
    pub alloc_retries: u64,
}

/// What the recording shows (the peaks of its per-op figures, its final `memory_stats()`
/// where it has one) against what the replay `r` under `conf` did.
pub fn trace_what_if(
    gt: &crate::analysis::groundtruth::GroundTruth,
    r: &crate::analysis::replay::ReplayOutcome,
    conf: &str,
) -> TraceWhatIf {
    let col = |name: &str| gt.after_columns.iter().position(|c| c == name);
    let series = |name: &str| -> Vec<u64> {
        match col(name) {
            Some(i) => gt.after.iter().map(|row| row[i].max(0) as u64).collect(),
            None => Vec::new(),
        }
    };
    let end = |k: &str| {
        gt.stats_end
            .as_ref()
            .and_then(|m| m.get(k))
            .map(|v| *v as u64)
    };
    let (alloc, res) = (series("allocated_bytes"), series("reserved_bytes"));
    let original = TraceSide {
        alloc_conf: gt.alloc_conf.clone(),
        peak_allocated: end("allocated_bytes.all.peak")
            .unwrap_or_else(|| alloc.iter().copied().max().unwrap_or(0)),
        peak_reserved: end("reserved_bytes.all.peak")
            .unwrap_or_else(|| res.iter().copied().max().unwrap_or(0)),
        allocated_end: end("allocated_bytes.all.current")
            .unwrap_or_else(|| alloc.last().copied().unwrap_or(0)),
        reserved_end: end("reserved_bytes.all.current")
            .unwrap_or_else(|| res.last().copied().unwrap_or(0)),
        ooms: gt.ooms.len() as u64,
        alloc_retries: end("num_alloc_retries").unwrap_or(0),
    };
    let s = &r.stats;
    let replayed = TraceSide {
        alloc_conf: conf.to_string(),
        peak_allocated: s.allocated_bytes.all().peak.max(0) as u64,
        peak_reserved: s.reserved_bytes.all().peak.max(0) as u64,
        allocated_end: s.allocated_bytes.all().current.max(0) as u64,
        reserved_end: s.reserved_bytes.all().current.max(0) as u64,
        ooms: (r.ooms_expected - r.ooms_missed.len() + r.ooms_unexpected.len()) as u64,
        alloc_retries: s.num_alloc_retries.max(0) as u64,
    };
    TraceWhatIf {
        capacity: gt.device_total_memory,
        original,
        replayed,
    }
}

/// Replays `events` (with `segments`, the state at their end) under `conf` on a device whose
/// allocator may use `capacity` bytes; `recorded` is the settings the trace was made with.
pub fn what_if(
    segments: &[SegmentInfo],
    events: &[Event],
    recorded: &AllocConf,
    conf: &AllocConf,
    capacity: u64,
) -> WhatIf {
    let orig = original(segments, events, recorded);
    let mut a = SimAllocator::new(conf.clone(), SimSource::new(capacity, 0));
    a.recorder_mut().enabled = false;
    // blocks from before the trace
    let mut seen: FxHashSet<u64> = FxHashSet::default();
    let mut pre: Vec<(u64, u64)> = Vec::new();
    for e in events {
        match e.kind() {
            EventKind::Alloc => {
                seen.insert(e.addr);
            }
            EventKind::FreeRequested if seen.insert(e.addr) => pre.push((e.addr, e.size())),
            _ => {}
        }
    }
    for s in segments {
        for b in s.blocks.iter().filter(|b| b.state != BlockState::Inactive) {
            if !seen.contains(&b.address) {
                pre.push((b.address, b.requested_size.max(1)));
            }
        }
    }
    pre.sort();
    let mut map: FxHashMap<u64, u64> = FxHashMap::default();
    let mut ooms_caused = Vec::new();
    for (addr, size) in &pre {
        if let Ok(p) = a.malloc(*size, 0) {
            map.insert(*addr, p);
        }
    }
    let mut ooms_avoided = Vec::new();
    let mut replay_ooms = 0;
    for (i, e) in events.iter().enumerate() {
        match e.kind() {
            EventKind::Alloc => match a.malloc(e.size(), e.stream) {
                Ok(p) => {
                    map.insert(e.addr, p);
                }
                Err(_) => {
                    replay_ooms += 1;
                    ooms_caused.push(i as u64);
                }
            },
            EventKind::FreeRequested => {
                if let Some(p) = map.remove(&e.addr) {
                    let _ = a.free(p);
                }
            }
            EventKind::Oom => match a.malloc(e.size(), e.stream) {
                Ok(p) => {
                    ooms_avoided.push(i as u64);
                    let _ = a.free(p);
                }
                Err(_) => replay_ooms += 1,
            },
            _ => {}
        }
    }
    let st = a.stats();
    let snap = a.snapshot();
    let replayed = Side {
        alloc_conf: conf.raw.clone(),
        peak_allocated: st.allocated_bytes.all().peak as u64,
        peak_reserved: st.reserved_bytes.all().peak as u64,
        allocated_end: st.allocated_bytes.all().current as u64,
        reserved_end: st.reserved_bytes.all().current as u64,
        ooms: replay_ooms,
        fragmentation_end: fragmentation::analyze(&snap),
    };
    WhatIf {
        capacity,
        capacity_known: true,
        original: orig,
        replayed,
        ooms_avoided,
        ooms_caused,
        preexisting_blocks: pre.len() as u64,
        recorded_settings_ooms: None,
        capacity_given: false,
    }
}
