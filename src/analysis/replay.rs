//! Replays a recorded PyTorch allocator trace through gpumem's allocator on a simulated device
//! and compares, after every op, the recorded columns; which ops raised out-of-memory (and the
//! allocator's fields of each message); the final `memory_stats()`; and PyTorch's own event trace.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::groundtruth::{column_key, GroundTruth, Op};
use crate::alloc::{AllocConf, DeviceStats, SimAllocator, SimSource, DEFAULT_CONTEXT_OVERHEAD};
use crate::trace::{EventKind, Recorder};

#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Settings to use instead of the trace's `alloc_conf` (a what-if replay).
    pub alloc_conf: Option<AllocConf>,
    /// Do not take segment addresses from the trace (use the simulator's own).
    pub no_trace_addresses: bool,
    /// How many mismatching steps to describe in detail.
    pub max_details: usize,
}

/// One op whose columns differ.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StepMismatch {
    pub step: usize,
    pub op: String,
    /// (column, expected, replayed) for every column, differing or not.
    pub columns: Vec<(String, i64, i64)>,
    pub oom_expected: bool,
    pub oom_replayed: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct KeyMismatch {
    pub key: String,
    pub expected: i64,
    pub replayed: i64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TraceComparison {
    pub expected: usize,
    pub replayed: usize,
    /// Leading events identical in action, address and size (size only for `oom`).
    pub matched_prefix: usize,
    /// The first differing pair: (index, expected, replayed) as "action addr size".
    pub first_difference: Option<(usize, String, String)>,
}

#[derive(Debug, Clone)]
pub struct ReplayOutcome {
    pub ops: usize,
    pub compared_steps: usize,
    pub mismatched_steps: usize,
    pub details: Vec<StepMismatch>,
    pub ooms_expected: usize,
    pub ooms_matched: usize,
    /// Steps where gpumem raised OOM and PyTorch did not.
    pub ooms_unexpected: Vec<usize>,
    /// Steps where PyTorch raised OOM and gpumem did not.
    pub ooms_missed: Vec<usize>,
    /// OOM messages equal to PyTorch's once the driver's own figures (free memory, NVML's
    /// process usage) are set aside.
    pub oom_messages_matched: usize,
    pub oom_message_first_difference: Option<(usize, String, String)>,
    pub stats_end_compared: bool,
    pub stats_end_mismatches: Vec<KeyMismatch>,
    pub trace: Option<TraceComparison>,
    pub stats: DeviceStats,
    pub allocator: SimAllocator,
}

impl ReplayOutcome {
    /// Everything recorded was reproduced exactly: every step, every OOM and its message, the
    /// final stats and PyTorch's event trace.
    pub fn all_match(&self) -> bool {
        self.mismatched_steps == 0
            && self.ooms_matched == self.ooms_expected
            && self.ooms_unexpected.is_empty()
            && self.oom_message_first_difference.is_none()
            && self.stats_end_mismatches.is_empty()
            && self
                .trace
                .as_ref()
                .is_none_or(|t| t.first_difference.is_none())
    }
}

/// Sets aside the driver's figures in an OOM message ("of which X is free. Including
/// non-PyTorch memory, this process has Y memory in use."): they come from cudaMemGetInfo and
/// NVML, not from the allocator.
pub fn allocator_part_of_oom_message(msg: &str) -> String {
    match (msg.find(" of which "), msg.find(" memory in use. ")) {
        (Some(a), Some(b)) if b > a => format!(
            "{}<driver figures>{}",
            &msg[..a],
            &msg[b + " memory in use.".len()..]
        ),
        _ => match (msg.find(" of which "), msg.find(" is free. ")) {
            (Some(a), Some(b)) if b > a => format!(
                "{}<driver figures>{}",
                &msg[..a],
                &msg[b + " is free.".len()..]
            ),
            _ => msg.to_string(),
        },
    }
}

/// The smallest reservation PyTorch makes for an expandable segment (9/8 of the device, in
/// 2 MiB pages): a mapping inside [base, base + this) belongs to the reservation at base.
/// Reservations sit only a few MiB apart, so this must not be rounded generously.
fn reservation_span(total: u64) -> u64 {
    (total as u128 * 9 / 8).div_ceil(2 << 20) as u64 * (2 << 20)
}

/// Addresses the driver returned, in order: segments (`segment_alloc`) and the base of each
/// expandable reservation (a `segment_map` outside every live reservation). A reservation dies
/// when all its pages are unmapped (PyTorch then releases it), and the driver may hand the same
/// base out again.
fn address_hints(gt: &GroundTruth) -> (Vec<u64>, Vec<u64>) {
    let span = reservation_span(gt.device_total_memory);
    let mut mallocs = Vec::new();
    let mut bases = Vec::new();
    // live reservations: (base, mapped bytes)
    let mut live: Vec<(u64, u64)> = Vec::new();
    for e in &gt.trace {
        let owner = live
            .iter()
            .position(|&(b, _)| e.addr >= b && e.addr < b + span);
        match e.action.as_str() {
            "segment_alloc" => mallocs.push(e.addr),
            "segment_map" => match owner {
                Some(i) => live[i].1 += e.size,
                None => {
                    bases.push(e.addr);
                    live.push((e.addr, e.size));
                }
            },
            "segment_unmap" => {
                if let Some(i) = owner {
                    live[i].1 = live[i].1.saturating_sub(e.size);
                    if live[i].1 == 0 {
                        live.remove(i);
                    }
                }
            }
            _ => {}
        }
    }
    (mallocs, bases)
}

/// The allocator configured as the trace was recorded (or with `opts.alloc_conf`).
pub fn allocator_for(gt: &GroundTruth, conf: AllocConf, opts: &ReplayOptions) -> SimAllocator {
    let mut source = SimSource::new(gt.device_total_memory, DEFAULT_CONTEXT_OVERHEAD);
    if !opts.no_trace_addresses {
        let (m, r) = address_hints(gt);
        source = source.with_address_hints(m, r);
    }
    let mut a = SimAllocator::new(conf, source);
    // keep every event of the replay: the comparison with PyTorch's trace needs them all
    a.set_recorder(Recorder::new(gt.trace.len().max(gt.ops.len() * 4) + 1024));
    if gt.memory_fraction > 0.0 {
        a.set_memory_fraction(gt.memory_fraction);
    }
    a
}

pub fn replay(gt: &GroundTruth, conf: AllocConf, opts: &ReplayOptions) -> ReplayOutcome {
    let mut a = allocator_for(gt, conf, opts);
    let keys: Vec<&'static str> = gt
        .after_columns
        .iter()
        .map(|c| column_key(c).expect("validated column"))
        .collect();
    let expected_oom: FxHashMap<usize, &super::groundtruth::OomRecord> =
        gt.ooms.iter().map(|o| (o.step, o)).collect();
    let mut ptrs: FxHashMap<u64, u64> = FxHashMap::default();
    let mut out = ReplayOutcome {
        ops: gt.ops.len(),
        compared_steps: 0,
        mismatched_steps: 0,
        details: Vec::new(),
        ooms_expected: gt.ooms.len(),
        ooms_matched: 0,
        ooms_unexpected: Vec::new(),
        ooms_missed: Vec::new(),
        oom_messages_matched: 0,
        oom_message_first_difference: None,
        stats_end_compared: gt.stats_end.is_some(),
        stats_end_mismatches: Vec::new(),
        trace: None,
        stats: DeviceStats::default(),
        allocator: a.clone(),
    };
    for (step, op) in gt.ops.iter().enumerate() {
        let mut oom_here = false;
        match *op {
            Op::Alloc { id, size } => match a.malloc(size, 0) {
                Ok(p) => {
                    ptrs.insert(id, p);
                }
                Err(e) => {
                    oom_here = true;
                    if let Some(rec) = expected_oom.get(&step).filter(|r| !r.message.is_empty()) {
                        let mine = allocator_part_of_oom_message(&e.to_string());
                        let theirs = allocator_part_of_oom_message(&rec.message);
                        if mine == theirs {
                            out.oom_messages_matched += 1;
                        } else if out.oom_message_first_difference.is_none() {
                            out.oom_message_first_difference =
                                Some((step, rec.message.clone(), e.to_string()));
                        }
                    }
                }
            },
            Op::Free { id } => {
                // a free of an allocation that failed is a no-op, as in the recording
                if let Some(p) = ptrs.remove(&id) {
                    a.free(p).expect("validated trace frees only live ids");
                }
            }
            Op::EmptyCache => a.empty_cache(),
        }
        let oom_expected = expected_oom.contains_key(&step);
        match (oom_expected, oom_here) {
            (true, true) => out.ooms_matched += 1,
            (true, false) => out.ooms_missed.push(step),
            (false, true) => out.ooms_unexpected.push(step),
            _ => {}
        }
        if let Some(row) = gt.after.get(step) {
            out.compared_steps += 1;
            let flat_row: Vec<i64> = keys.iter().map(|k| stat_value(a.stats(), k)).collect();
            if flat_row != *row || oom_expected != oom_here {
                out.mismatched_steps += 1;
                if out.details.len() < opts.max_details {
                    out.details.push(StepMismatch {
                        step,
                        op: op.to_string(),
                        columns: gt
                            .after_columns
                            .iter()
                            .zip(row.iter().zip(&flat_row))
                            .map(|(c, (&e, &g))| (c.clone(), e, g))
                            .collect(),
                        oom_expected,
                        oom_replayed: oom_here,
                    });
                }
            }
        }
    }
    let flat = a.stats().to_flat();
    if let Some(expected) = &gt.stats_end {
        out.stats_end_mismatches = compare_flat(expected, &flat);
    }
    if !gt.trace.is_empty() {
        out.trace = Some(compare_trace(gt, &a, !opts.no_trace_addresses));
    }
    out.stats = a.stats().clone();
    out.allocator = a;
    out
}

fn stat_value(s: &DeviceStats, key: &str) -> i64 {
    match key {
        "allocated_bytes.all().current" => s.allocated_bytes.all().current,
        "reserved_bytes.all().current" => s.reserved_bytes.all().current,
        "segment.all().current" => s.segment.all().current,
        "inactive_split_bytes.all().current" => s.inactive_split_bytes.all().current,
        "num_alloc_retries" => s.num_alloc_retries,
        "requested_bytes.all().current" => s.requested_bytes.all().current,
        "active_bytes.all().current" => s.active_bytes.all().current,
        "num_ooms" => s.num_ooms,
        other => s.to_flat().get(other).copied().unwrap_or(0),
    }
}

/// Keys of either dict whose values differ (a key missing on one side reads as a difference).
pub fn compare_flat(
    expected: &BTreeMap<String, i64>,
    got: &BTreeMap<String, i64>,
) -> Vec<KeyMismatch> {
    let mut keys: Vec<&String> = expected.keys().chain(got.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| {
            let e = expected.get(k).copied();
            let g = got.get(k).copied();
            (e != g).then(|| KeyMismatch {
                key: k.clone(),
                expected: e.unwrap_or(i64::MIN),
                replayed: g.unwrap_or(i64::MIN),
            })
        })
        .collect()
}

/// Compares event by event; addresses only when the replay took them from the trace.
fn compare_trace(gt: &GroundTruth, a: &SimAllocator, addresses: bool) -> TraceComparison {
    let mine: Vec<_> = a
        .recorder()
        .ring
        .iter()
        .filter(|e| e.kind() != EventKind::EmptyCache)
        .collect();
    let mut matched = 0;
    let mut first = None;
    for (i, exp) in gt.trace.iter().enumerate() {
        let Some(got) = mine.get(i) else { break };
        let same = exp.action == got.kind().action()
            && exp.size == got.size()
            // PyTorch puts the driver's free memory in an oom entry's address field
            && (!addresses || got.kind() == EventKind::Oom || exp.addr == got.addr);
        if !same {
            first = Some((
                i,
                format!("{} {:#x} {}", exp.action, exp.addr, exp.size),
                format!("{} {:#x} {}", got.kind().action(), got.addr, got.size()),
            ));
            break;
        }
        matched += 1;
    }
    if first.is_none() && gt.trace.len() != mine.len() {
        let i = matched;
        first = Some((
            i,
            gt.trace
                .get(i)
                .map(|e| format!("{} {:#x} {}", e.action, e.addr, e.size))
                .unwrap_or_else(|| "<end>".into()),
            mine.get(i)
                .map(|e| format!("{} {:#x} {}", e.kind().action(), e.addr, e.size()))
                .unwrap_or_else(|| "<end>".into()),
        ));
    }
    TraceComparison {
        expected: gt.trace.len(),
        replayed: mine.len(),
        matched_prefix: matched,
        first_difference: first,
    }
}
