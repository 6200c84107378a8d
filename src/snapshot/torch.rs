//! PyTorch's snapshot dict (`torch.cuda.memory._snapshot()`), read through [`Doc`] so that the
//! same code reads it from a pickle and from JSON; and the gpumem snapshot's JSON.
//!
//! The dict: `segments` (each with `device`, `address`, `total_size`, `stream`,
//! `segment_type`, `is_expandable`, and `blocks` with `address`, `size`, `requested_size`,
//! `state`, `frames`), `device_traces` (per device, entries with `action`, `addr`, `size`,
//! `stream`, `time_us`, `frames`; `oom` entries carry `device_free`), `allocator_settings`
//! and `external_annotations` (`stage`, `name`, `time_us`). Frames are dicts with `filename`,
//! `line` and `name`, innermost first, and PyTorch shares one frame list between the entries
//! of one allocation: it is resolved once per shared object.

use rustc_hash::FxHashMap;

pub use super::doc::{Doc, JsonDoc, PickleDoc, TRACE};
use super::frames::Frames;

use super::{Annotation, EntryMeta, Format, IterationSource, MetaStrings, Snapshot};
use crate::alloc::{AllocConf, BlockInfo, BlockState, PoolKind, SegmentInfo};
use crate::trace::pickle::Projected;
use crate::trace::{Event, EventKind, StackId};

/// Read access to a parsed document (a pickle or JSON), so that one converter serves both.
/// A block's stack: its `frames`, or in PyTorch 2.0's format (no block `frames`) those of the
/// last entry of its `history` (the allocation that made the block what it is).
fn block_frames<'a, D: Doc<'a>>(d: &D, b: D::V) -> Option<D::V> {
    d.get(b, "frames").or_else(|| {
        let h = d.get(b, "history").filter(|h| d.is_list(*h))?;
        d.list(h).last().and_then(|e| d.get(e, "frames"))
    })
}

fn conf_from_settings<'a, D: Doc<'a>>(d: &D, settings: Option<D::V>) -> Result<AllocConf, String> {
    let Some(s) = settings.filter(|s| d.is_dict(*s)) else {
        return Ok(AllocConf::default());
    };
    if let Some(raw) = d.get(s, "PYTORCH_CUDA_ALLOC_CONF").and_then(|v| d.text(v)) {
        return AllocConf::parse(raw).map_err(|e| {
            format!("allocator_settings.PYTORCH_CUDA_ALLOC_CONF ('{raw}') is not valid: {e}")
        });
    }
    // older snapshots: the individual settings
    let mut parts = Vec::new();
    if d.get(s, "expandable_segments").and_then(|v| d.boolean(v)) == Some(true) {
        parts.push("expandable_segments:True".to_string());
    }
    if let Some(m) = d.get(s, "max_split_size").and_then(|v| d.int(v)) {
        if m > 0 {
            parts.push(format!("max_split_size_mb:{}", m >> 20));
        }
    }
    if let Some(g) = d
        .get(s, "garbage_collection_threshold")
        .and_then(|v| d.float(v))
    {
        if g > 0.0 {
            parts.push(format!("garbage_collection_threshold:{g}"));
        }
    }
    AllocConf::parse(&parts.join(",")).map_err(|e| format!("allocator_settings: {e}"))
}

fn state(s: &str) -> Option<BlockState> {
    Some(match s {
        "active_allocated" => BlockState::ActiveAllocated,
        "active_pending_free" => BlockState::ActivePendingFree,
        "inactive" => BlockState::Inactive,
        _ => return None,
    })
}

/// Which devices of a file to convert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The device with the longest trace, else the first with segments.
    Primary,
    /// This one (none when the file has nothing on it).
    Device(u32),
    /// Every device with a trace or segments, in order.
    All,
}

/// Converts PyTorch's snapshot dict (or a bare list of segments): one [`Snapshot`] per device
/// asked for, in device order.
pub fn convert<'a, D: Doc<'a>>(
    d: &D,
    root: D::V,
    format: Format,
    name: &str,
    which: Which,
) -> Result<Vec<Snapshot>, String> {
    let (segs_v, traces_v, settings, annotations_v) = if d.is_list(root) {
        (Some(root), None, None, None)
    } else if d.is_dict(root) {
        (
            d.get(root, "segments"),
            d.get(root, "device_traces"),
            d.get(root, "allocator_settings"),
            d.get(root, "external_annotations"),
        )
    } else {
        return Err("the snapshot is neither a dict nor a list of segments".into());
    };
    let segs_v = segs_v
        .filter(|s| d.is_list(*s))
        .ok_or("no 'segments' list: not a PyTorch memory snapshot")?;
    if traces_v.is_some_and(|t| !d.is_list(t)) {
        return Err("'device_traces' is not a list (one list of trace entries per device)".into());
    }
    let traces: Vec<D::V> = traces_v.map(|t| d.list(t).collect()).unwrap_or_default();
    let trace_lens: Vec<usize> = traces
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if d.is_list(*t) {
                Ok(d.list(*t).count() + d.projected_rows(*t))
            } else if d.is_dict(*t) || d.text(*t).is_some() || d.int(*t).is_some() {
                Err(format!("device_traces[{i}] is not a list of trace entries"))
            } else {
                Ok(0)
            }
        })
        .collect::<Result<_, String>>()?;
    let mut devices: Vec<u32> = Vec::new();
    for (i, n) in trace_lens.iter().enumerate() {
        if *n > 0 {
            devices.push(i as u32);
        }
    }
    let seg_list: Vec<D::V> = d.list(segs_v).collect();
    for (i, s) in seg_list.iter().enumerate() {
        if let Some(dev) = d.get(*s, "device").and_then(|v| d.int(v)) {
            let dev = u32::try_from(dev)
                .map_err(|_| format!("segments[{i}].device {dev} is not a device index"))?;
            if !devices.contains(&dev) {
                devices.push(dev);
            }
        }
    }
    devices.sort();
    let primary = super::primary_index(trace_lens.iter().copied())
        .map(|i| i as u32)
        .or_else(|| devices.first().copied())
        .unwrap_or(0);
    let wanted: Vec<u32> = match which {
        Which::Primary => vec![primary],
        Which::Device(n) if devices.contains(&n) => vec![n],
        Which::Device(_) => Vec::new(),
        Which::All if devices.is_empty() => vec![primary],
        Which::All => devices.clone(),
    };
    let conf = conf_from_settings(d, settings)?;
    let file = File {
        format,
        name,
        devices: &devices,
        seg_list: &seg_list,
        traces: &traces,
        trace_lens: &trace_lens,
        annotations: annotations_v,
        conf: &conf,
    };
    wanted
        .into_iter()
        .map(|device| device_snapshot(d, &file, device))
        .collect()
}

/// What [`convert`] found in the file, shared by its devices.
struct File<'f, V> {
    format: Format,
    name: &'f str,
    devices: &'f [u32],
    seg_list: &'f [V],
    traces: &'f [V],
    trace_lens: &'f [usize],
    annotations: Option<V>,
    conf: &'f AllocConf,
}

/// One device's segments, trace and annotations.
fn device_snapshot<'a, D: Doc<'a>>(
    d: &D,
    f: &File<'_, D::V>,
    device: u32,
) -> Result<Snapshot, String> {
    let (seg_list, traces, trace_lens) = (f.seg_list, f.traces, f.trace_lens);
    let mut frames = Frames::default();
    let mut segments = Vec::new();
    let mut segment_pools: Vec<(u64, [i64; 2])> = Vec::new();
    // each segment's (end, index) by address
    let mut seen: std::collections::BTreeMap<u64, (u64, usize)> = Default::default();
    for (i, s) in seg_list.iter().enumerate() {
        let at = |k: &str| format!("segments[{i}].{k}");
        if d.get(*s, "device").and_then(|v| d.int(v)).unwrap_or(0) as u32 != device {
            continue;
        }
        let int = |k: &str| -> Result<u64, String> {
            d.get(*s, k)
                .and_then(|v| d.int(v))
                .filter(|v| *v >= 0)
                .map(|v| v as u64)
                .ok_or_else(|| format!("{} is missing or not a byte count", at(k)))
        };
        let address = int("address")?;
        let total_size = int("total_size")?;
        let seg_end = address
            .checked_add(total_size)
            .ok_or_else(|| format!("segments[{i}]: address + total_size overflows"))?;
        // segments of one device never overlap: a list that repeats one (a shared object in a
        // pickle, a hand-edited file) is refused here, before its blocks are copied again
        if let Some((&a, &(end, k))) = seen.range(..seg_end).next_back() {
            if end > address {
                return Err(format!(
                    "segments[{i}] (address {address:#x}, {total_size} bytes) overlaps segments[{k}] (address {a:#x})"
                ));
            }
        }
        seen.insert(address, (seg_end, i));
        let pool = match d.get(*s, "segment_type").and_then(|v| d.text(v)) {
            Some("small") => PoolKind::Small,
            _ => PoolKind::Large,
        };
        let mut blocks = Vec::new();
        let mut offset = address;
        let blocks_v = d.get(*s, "blocks");
        if blocks_v.is_some_and(|b| !d.is_list(b)) {
            return Err(format!("{} is not a list of blocks", at("blocks")));
        }
        if let Some(bl) = blocks_v {
            for (j, b) in d.list(bl).enumerate() {
                let size = d
                    .get(b, "size")
                    .and_then(|v| d.int(v))
                    .filter(|v| *v >= 0)
                    .ok_or_else(|| format!("segments[{i}].blocks[{j}].size is missing"))?
                    as u64;
                let st = d.get(b, "state").and_then(|v| d.text(v)).unwrap_or("");
                let state = state(st).ok_or_else(|| {
                    format!("segments[{i}].blocks[{j}].state '{st}' is not a block state")
                })?;
                let at = |k: &str| format!("segments[{i}].blocks[{j}].{k}");
                let baddr = match d.get(b, "address").and_then(|v| d.int(v)) {
                    Some(a) if a < 0 => return Err(format!("{} is negative", at("address"))),
                    Some(a) => a as u64,
                    None => offset,
                };
                let requested = match d.get(b, "requested_size").and_then(|v| d.int(v)) {
                    Some(r) if r < 0 => {
                        return Err(format!("{} is negative", at("requested_size")))
                    }
                    Some(r) => r as u64,
                    None => size,
                };
                // (an inactive block keeps the request of its last use, which PyTorch does
                // not clear when the block is split: only a block in use is held to it)
                if requested > size && state != BlockState::Inactive {
                    return Err(format!(
                        "segments[{i}].blocks[{j}]: requested_size {requested} is more than the \
                         block's size {size}"
                    ));
                }
                // blocks tile their segment in address order, with no gap
                match baddr.checked_add(size) {
                    Some(end) if baddr == offset && end <= seg_end => {}
                    Some(end) if baddr > offset && end <= seg_end => {
                        return Err(format!(
                            "segments[{i}].blocks[{j}] (address {baddr:#x}) leaves {} bytes \
                             after the block before it: blocks tile their segment",
                            baddr - offset
                        ))
                    }
                    _ => {
                        return Err(format!(
                            "segments[{i}].blocks[{j}] (address {baddr:#x}, {size} bytes) {} its segment (address {address:#x}, {total_size} bytes)",
                            if baddr < offset && j > 0 { "starts before the end of the block before it in" } else { "lies outside" }
                        ))
                    }
                }
                if let Some(fr) = d.get(b, "frames") {
                    if !d.is_list(fr) {
                        return Err(format!("{} is not a list of frames", at("frames")));
                    }
                }
                blocks.push(BlockInfo {
                    address: baddr,
                    size,
                    requested_size: requested,
                    state,
                    stack: frames.stack(d, block_frames(d, b)),
                });
                offset = baddr + size;
            }
        }
        if !blocks.is_empty() && offset != seg_end {
            return Err(format!(
                "segments[{i}]: its blocks end {} bytes before the segment does (blocks tile \
                 their segment)",
                seg_end - offset
            ));
        }
        let sum = |f: &dyn Fn(&BlockInfo) -> bool, v: &dyn Fn(&BlockInfo) -> u64| {
            blocks.iter().filter(|b| f(b)).map(v).sum::<u64>()
        };
        let allocated_size = sum(&|b| b.state != BlockState::Inactive, &|b| b.size);
        let requested_size = sum(&|b| b.state != BlockState::Inactive, &|b| b.requested_size);
        if let Some(p) = d.get(*s, "segment_pool_id").filter(|p| d.is_list(*p)) {
            let ids: Vec<i64> = d.list(p).filter_map(|v| d.int(v)).collect();
            if let [a, b] = ids[..] {
                if (a, b) != (0, 0) {
                    segment_pools.push((address, [a, b]));
                }
            }
        }
        segments.push(SegmentInfo {
            device,
            address,
            total_size,
            allocated_size,
            active_size: allocated_size,
            requested_size,
            stream: d.get(*s, "stream").and_then(|v| d.int(v)).unwrap_or(0) as u32,
            pool,
            is_expandable: d
                .get(*s, "is_expandable")
                .and_then(|v| d.boolean(v))
                .unwrap_or(false),
            stack: None,
            blocks,
        });
    }
    segments.sort_by_key(|s| s.address);
    segment_pools.sort_by_key(|p| p.0);

    let total = trace_lens.get(device as usize).copied().unwrap_or(0);
    let mut events = Vec::with_capacity(total);
    let mut times = Vec::with_capacity(total);
    let mut skips = Skips::default();
    let mut meta: Vec<EntryMeta> = Vec::new();
    let mut meta_strings = MetaStrings::default();
    if let Some(t) = traces.get(device as usize) {
        let runs = d.take_projected(*t);
        let n = trace_lens.get(device as usize).copied().unwrap_or(0)
            - runs.iter().map(|r| r.1.rows()).sum::<usize>();
        const KEYS: [&str; 9] = [
            "action",
            "addr",
            "size",
            "stream",
            "time_us",
            "device_free",
            "frames",
            "user_metadata",
            "compile_context",
        ];
        let cols: Vec<_> = KEYS.iter().map(|k| d.column(*t, k)).collect();
        // one entry's fields: from the list's columns when it is stored by columns (PyTorch's
        // traces are), else one pass over the entry's keys
        let mut items = (cols[0].is_none()).then(|| d.list(*t));
        let mut run = runs.into_iter().peekable();
        let (mut last_u, mut last_c) = (None, None);
        // entries so far (the index in messages)
        let mut at = 0usize;
        for i in 0..=n {
            // runs of projected rows come before item `i`
            // (each run is freed once converted)
            while let Some((_, rows)) = run.next_if(|r| r.0 == i) {
                projected_events(
                    d,
                    &rows,
                    &mut frames,
                    &mut skips,
                    &mut Metas {
                        list: &mut meta,
                        strings: &mut meta_strings,
                    },
                    &mut events,
                    &mut times,
                    device,
                    at,
                )?;
                at += rows.rows();
            }
            if i == n {
                break;
            }
            let (mut action, mut addr, mut size, mut stream, mut time, mut free) =
                ("", None, None, None, None, None);
            let mut frames_v = None;
            let (mut umeta_v, mut cctx_v) = (None, None);
            let n = |v: Option<D::V>| v.and_then(|v| d.int(v));
            match &mut items {
                None => {
                    let col = |k: usize| cols[k].as_ref().and_then(|c| c(i));
                    action = col(0).and_then(|v| d.text(v)).unwrap_or("");
                    addr = n(col(1));
                    size = n(col(2));
                    stream = n(col(3));
                    time = n(col(4));
                    free = n(col(5));
                    frames_v = col(6);
                    umeta_v = col(7);
                    cctx_v = col(8);
                }
                Some(it) => {
                    let Some(e) = it.next() else { break };
                    d.visit(e, &mut |k, v| match k {
                        "action" => action = d.text(v).unwrap_or(""),
                        "addr" => addr = n(Some(v)),
                        "size" => size = n(Some(v)),
                        "stream" => stream = n(Some(v)),
                        "time_us" => time = n(Some(v)),
                        "device_free" => free = n(Some(v)),
                        "frames" => frames_v = Some(v),
                        "user_metadata" => umeta_v = Some(v),
                        "compile_context" => cctx_v = Some(v),
                        _ => {}
                    });
                }
            }
            let entry = at;
            at += 1;
            let Some(kind) = EventKind::from_action(action).filter(|k| *k != EventKind::Retag)
            else {
                skips.skip(action, entry as u64);
                continue;
            };
            let (addr, size) = entry_fields(kind, addr, size, free)
                .map_err(|why| format!("device_traces[{device}][{entry}]{why}"))?;
            let stack = frames.stack(d, frames_v);
            let opt = |v: Option<i64>| v.unwrap_or(0).max(0) as u64;
            // the same value as the entry before (a pickle's memoized string): its id again
            let mut meta_id = |v: Option<D::V>, last: &mut Option<(D::V, u32)>| match (v, *last) {
                (None, _) => 0,
                (Some(v), Some((l, id))) if v == l => id,
                (Some(v), _) => {
                    let id = meta_strings.id(d.text(v).unwrap_or(""));
                    *last = Some((v, id));
                    id
                }
            };
            let (u_id, c_id) = (meta_id(umeta_v, &mut last_u), meta_id(cctx_v, &mut last_c));
            if u_id != 0 || c_id != 0 {
                meta.push(EntryMeta {
                    event: events.len() as u32,
                    user_metadata: u_id,
                    compile_context: c_id,
                });
            }
            events.push(Event::new(kind, addr, size, stack, opt(stream) as u32));
            times.push(opt(time));
        }
    }
    let mut annotations = Vec::new();
    if let Some(a) = f.annotations.filter(|a| d.is_list(*a)) {
        for x in d.list(a) {
            if d.get(x, "device")
                .and_then(|v| d.int(v))
                .unwrap_or(device as i64)
                != device as i64
            {
                continue;
            }
            annotations.push(Annotation {
                stage: d
                    .get(x, "stage")
                    .and_then(|v| d.text(v))
                    .unwrap_or("")
                    .to_string(),
                name: d
                    .get(x, "name")
                    .and_then(|v| d.text(v))
                    .unwrap_or("")
                    .to_string(),
                time_us: d.get(x, "time_us").and_then(|v| d.int(v)).unwrap_or(0) as u64,
            });
        }
    }
    // (before lone completions become frees: a completion is the block's free here). A trace
    // that contradicts itself is still read, as PyTorch's viewer reads it (snapshots grown by
    // repeating a trace do), but not without a word: its state figures come from the segments,
    // which are sound, and what it says of the history may be wrong
    if let Err(why) =
        super::history::check(&events, |i| super::entry_of(&skips.at, i as u64), device)
    {
        tracing::warn!(
            "{}: {why} (the trace contradicts itself: what it says of allocations over time may \
             be wrong)",
            f.name
        );
    }
    lone_completions_free(&mut events);
    let mut snap = Snapshot {
        format: f.format,
        name: f.name.to_string(),
        device,
        devices: f.devices.to_vec(),
        segments,
        events,
        times,
        tags: frames.tags,
        library_frames: frames.library,
        conf: f.conf.clone(),
        total_memory: None,
        context_overhead: None,
        annotations,
        iterations: IterationSource::None,
        iterations_why: None,
        dropped: 0,
        skipped: skips.counts,
        skipped_at: skips.at,
        skipped_kind: skips.kind,
        entry_meta: meta,
        meta_strings,
        segment_pools,
    };
    super::iterations::tag_iterations(&mut snap);
    Ok(snap)
}

/// A `free_completed` with no `free_requested` of its address pending (the request happened
/// before the trace began, or was lost) is the block's free as far as the trace can tell: it
/// becomes a `free_requested`, so the block's bytes leave the allocated total. Most traces have
/// none: a completion right after its request is checked first, on all cores, without hashing.
fn lone_completions_free(events: &mut [Event]) {
    use rayon::prelude::*;
    let maybe_lone = |i: usize| {
        let e = &events[i];
        e.kind() == EventKind::FreeCompleted
            && !(i > 0 && {
                let p = &events[i - 1];
                p.kind() == EventKind::FreeRequested && p.addr == e.addr
            })
    };
    if !(0..events.len()).into_par_iter().any(maybe_lone) {
        return;
    }
    let mut pending: rustc_hash::FxHashSet<u64> = rustc_hash::FxHashSet::default();
    for e in events.iter_mut() {
        match e.kind() {
            EventKind::FreeRequested => {
                pending.insert(e.addr);
            }
            EventKind::FreeCompleted if !pending.remove(&e.addr) => {
                *e = Event::new(
                    EventKind::FreeRequested,
                    e.addr,
                    e.size(),
                    e.stack,
                    e.stream,
                );
            }
            _ => {}
        }
    }
}

/// The entries of actions gpumem does not model: counted by action in the order they first
/// appear, and each one's place and action.
#[derive(Default)]
struct Skips {
    counts: Vec<(String, u64)>,
    at: Vec<u64>,
    kind: Vec<u32>,
}

impl Skips {
    fn skip(&mut self, action: &str, entry: u64) {
        let k = match self.counts.iter().position(|(a, _)| a == action) {
            Some(k) => k,
            None => {
                self.counts.push((action.to_string(), 0));
                self.counts.len() - 1
            }
        };
        self.counts[k].1 += 1;
        self.at.push(entry);
        self.kind.push(k as u32);
    }
}

/// Where the entries' `user_metadata` and `compile_context` go.
struct Metas<'m> {
    list: &'m mut Vec<EntryMeta>,
    strings: &'m mut MetaStrings,
}

/// Appends the events of a run of projected trace rows (read on several cores) to `events`
/// and `times`, as the loop of [`convert`] makes them from dicts, on several cores; `first` is
/// the run's first entry's index in the trace.
#[allow(clippy::too_many_arguments)]
fn projected_events<'a, D: Doc<'a>>(
    d: &D,
    rows: &Projected,
    frames: &mut Frames,
    skips: &mut Skips,
    metas: &mut Metas<'_>,
    events: &mut Vec<Event>,
    times: &mut Vec<u64>,
    device: u32,
    first: usize,
) -> Result<(), String> {
    use rayon::prelude::*;
    const ADDR: usize = 0;
    const SIZE: usize = 1;
    const STREAM: usize = 2;
    const TIME: usize = 3;
    const FREE: usize = 4;
    let n = rows.rows();
    // the distinct actions and stacks, marked in bit sets by id, then resolved once each into
    // tables indexed by id
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let (objs, strs) = d.id_bounds();
    let bits =
        |n: usize| -> Vec<AtomicU64> { (0..n / 64 + 1).map(|_| AtomicU64::new(0)).collect() };
    let (act_bits, frame_bits) = (bits(strs), bits(objs));
    // the distinct user_metadata and compile_context strings, marked in the same pass
    let (umeta_bits, cctx_bits) = (bits(strs), bits(strs));
    let mark = |b: &[AtomicU64], id: u32| {
        if id == u32::MAX {
            return;
        }
        let (w, m) = (id as usize / 64, 1u64 << (id % 64));
        if let Some(w) = b.get(w) {
            if w.load(Relaxed) & m == 0 {
                w.fetch_or(m, Relaxed);
            }
        }
    };
    (0..n).into_par_iter().for_each(|r| {
        mark(&act_bits, rows.str_id(r, 0));
        mark(&frame_bits, rows.obj_id(r, 0));
        mark(&umeta_bits, rows.str_id(r, 1));
        mark(&cctx_bits, rows.str_id(r, 2));
    });
    let set = |b: &[AtomicU64]| -> Vec<u32> {
        let mut out = Vec::new();
        for (k, w) in b.iter().enumerate() {
            let mut x = w.load(Relaxed);
            while x != 0 {
                out.push((k * 64) as u32 + x.trailing_zeros());
                x &= x - 1;
            }
        }
        out
    };
    let text = |id: u32| {
        Projected::str_value(id)
            .and_then(|v| d.pickle_value(v))
            .and_then(|v| d.text(v))
    };
    // 0: not modelled (skipped), else the kind's number + 1
    let mut kind_tab = vec![0u8; strs + 1];
    for a in set(&act_bits) {
        if let Some(k) =
            EventKind::from_action(text(a).unwrap_or("")).filter(|k| *k != EventKind::Retag)
        {
            kind_tab[a as usize] = k as u8 + 1;
        }
    }
    let mut stack_tab = vec![StackId::ROOT; objs + 1];
    for f in set(&frame_bits) {
        let v = Projected::obj_value(f).and_then(|f| d.pickle_value(f));
        stack_tab[f as usize] = frames.stack(d, v);
    }
    let kind = |r: usize| -> Option<EventKind> {
        let a = rows.str_id(r, 0);
        match kind_tab.get(a as usize).copied().unwrap_or(0) {
            0 => None,
            k => EventKind::from_index(k - 1),
        }
    };
    let stack_of = |r: usize| {
        stack_tab
            .get(rows.obj_id(r, 0) as usize)
            .copied()
            .unwrap_or(StackId::ROOT)
    };
    let u = |r: usize, k: usize| rows.int(r, k).unwrap_or(0).max(0) as u64;
    let fields_of =
        |k, r: usize| entry_fields(k, rows.int(r, ADDR), rows.int(r, SIZE), rows.int(r, FREE));
    let make =
        |k, (addr, size), r: usize| Event::new(k, addr, size, stack_of(r), u(r, STREAM) as u32);
    // user_metadata and compile_context: each distinct string resolved once; the rows
    // scanned only when one of them is set (PyTorch writes "" and "N/A" on every entry)
    let mut meta_tab: FxHashMap<(usize, u32), u32> = FxHashMap::default();
    for (col, b) in [(1usize, &umeta_bits), (2, &cctx_bits)] {
        for id in set(b) {
            let m = metas.strings.id(text(id).unwrap_or(""));
            if m != 0 {
                meta_tab.insert((col, id), m);
            }
        }
    }
    // the common case, in one pass: no metadata set, every entry of a modelled kind with
    // sound fields (else what was added is taken back, and the passes below say which entry
    // is what)
    if meta_tab.is_empty() {
        let (events_at, times_at) = (events.len(), times.len());
        let odd = std::sync::atomic::AtomicBool::new(false);
        // indexed: each core writes its part in place (no buffers to join)
        events.par_extend((0..n).into_par_iter().map(|r| {
            let k = kind(r).unwrap_or_else(|| {
                odd.store(true, Relaxed);
                EventKind::Alloc
            });
            let fields = fields_of(k, r).unwrap_or_else(|_| {
                odd.store(true, Relaxed);
                (0, 0)
            });
            make(k, fields, r)
        }));
        times.par_extend((0..n).into_par_iter().map(|r| u(r, TIME)));
        if !odd.into_inner() {
            return Ok(());
        }
        events.truncate(events_at);
        times.truncate(times_at);
    }
    let all_kept = (0..n).into_par_iter().all(|r| kind(r).is_some());
    // entries of actions gpumem does not model: counted, in the order they first appear
    if !all_kept {
        for r in 0..n {
            if kind(r).is_none() {
                skips.skip(text(rows.str_id(r, 0)).unwrap_or(""), (first + r) as u64);
            }
        }
    }
    let kept = |r: &usize| all_kept || kind(*r).is_some();
    let fields = |r: usize| fields_of(kind(r).unwrap_or(EventKind::Alloc), r);
    // checked on all cores; the first bad entry found again in order, for its message
    if (0..n)
        .into_par_iter()
        .filter(kept)
        .any(|r| fields(r).is_err())
    {
        if let Some((r, Err(why))) = (0..n)
            .filter(kept)
            .map(|r| (r, fields(r)))
            .find(|x| x.1.is_err())
        {
            return Err(format!("device_traces[{device}][{}]{why}", first + r));
        }
    }
    let event = |r: usize| {
        let k = kind(r).unwrap_or(EventKind::Alloc);
        make(k, fields(r).unwrap_or_default(), r)
    };
    if !meta_tab.is_empty() {
        let mut index = events.len();
        for r in 0..n {
            if !kept(&r) {
                continue;
            }
            let m = |col: usize| {
                meta_tab
                    .get(&(col, rows.str_id(r, col)))
                    .copied()
                    .unwrap_or(0)
            };
            let (u_id, c_id) = (m(1), m(2));
            if u_id != 0 || c_id != 0 {
                metas.list.push(EntryMeta {
                    event: index as u32,
                    user_metadata: u_id,
                    compile_context: c_id,
                });
            }
            index += 1;
        }
    }
    if all_kept {
        // straight into the vectors, each core writing its part
        events.par_extend((0..n).into_par_iter().map(event));
        times.par_extend((0..n).into_par_iter().map(|r| u(r, TIME)));
    } else {
        events.par_extend((0..n).into_par_iter().filter(kept).map(event));
        times.par_extend((0..n).into_par_iter().filter(kept).map(|r| u(r, TIME)));
    }
    Ok(())
}

/// The address and size of a trace entry of a kind gpumem models, from its `addr`, `size` and
/// `device_free` (`None`: absent or not an int), or what is wrong with them, as a suffix for
/// the entry's name (`.size -5 is negative`). PyTorch writes `addr` and `size` in every entry,
/// and an OOM's free device memory in `device_free` (its `addr`, here): older files may lack it.
fn entry_fields(
    kind: EventKind,
    addr: Option<i64>,
    size: Option<i64>,
    free: Option<i64>,
) -> Result<(u64, u64), String> {
    let need = |key: &str, v: Option<i64>| match v {
        None => Err(format!(
            ": `{key}` is missing or not an integer (PyTorch writes one in every entry)"
        )),
        Some(x) if x < 0 => Err(format!(".{key} {x} is negative")),
        Some(x) => Ok(x as u64),
    };
    let size = need("size", size)?;
    if size >= 1 << 60 {
        return Err(format!(".size {size} is out of range"));
    }
    let addr = if kind == EventKind::Oom {
        free.unwrap_or(0).max(0) as u64
    } else {
        need("addr", addr)?
    };
    Ok((addr, size))
}

/// A gpumem snapshot's JSON: its trace (through `analysis::snapshot_file`) and its segments.
pub fn convert_gpumem(v: &serde_json::Value) -> Result<Snapshot, String> {
    let text = serde_json::to_string(v).map_err(|e| e.to_string())?;
    let t = crate::analysis::snapshot_file::parse(&text)?;
    let stacks: Vec<Vec<String>> = v["stacks"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    s.as_array()
                        .map(|l| {
                            l.iter()
                                .filter_map(|x| x.as_str().map(String::from))
                                .collect()
                        })
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default();
    let mut tags = t.tags;
    // each stack interned once, however many blocks share it (40,000 blocks sharing one
    // 100,000-tag stack took minutes when it was rebuilt per reference)
    let ids: Vec<StackId> = stacks
        .iter()
        .map(|list| {
            list.iter().fold(StackId::ROOT, |s, tag| {
                let id = tags.intern(tag);
                tags.child(s, id)
            })
        })
        .collect();
    let stack_of = |i: Option<u64>, at: &dyn Fn() -> String| -> Result<StackId, String> {
        match i {
            None => Ok(StackId::ROOT),
            Some(i) => usize::try_from(i)
                .ok()
                .and_then(|i| ids.get(i))
                .copied()
                .ok_or_else(|| {
                    format!(
                        "{}.stack {i} is not in 'stacks' ({} stacks)",
                        at(),
                        ids.len()
                    )
                }),
        }
    };
    let mut segments = Vec::new();
    let seg_list = v["segments"]
        .as_array()
        .ok_or("'segments' is missing or not a list")?;
    for (i, s) in seg_list.iter().enumerate() {
        let n = |k: &str| {
            s[k].as_u64()
                .ok_or_else(|| format!("segments[{i}].{k} is missing or not a byte count"))
        };
        let mut blocks = Vec::new();
        for (j, b) in s["blocks"].as_array().into_iter().flatten().enumerate() {
            let st = b["state"].as_str().unwrap_or("");
            blocks.push(BlockInfo {
                address: b["address"]
                    .as_u64()
                    .ok_or_else(|| format!("segments[{i}].blocks[{j}].address is missing"))?,
                size: b["size"]
                    .as_u64()
                    .ok_or_else(|| format!("segments[{i}].blocks[{j}].size is missing"))?,
                requested_size: b["requested_size"].as_u64().unwrap_or(0),
                state: state(st).ok_or_else(|| {
                    format!("segments[{i}].blocks[{j}].state '{st}' is not a block state")
                })?,
                stack: stack_of(b["stack"].as_u64(), &|| {
                    format!("segments[{i}].blocks[{j}]")
                })?,
            });
        }
        segments.push(SegmentInfo {
            device: 0,
            address: n("address")?,
            total_size: n("total_size")?,
            allocated_size: n("allocated_size")?,
            active_size: n("active_size")?,
            requested_size: n("requested_size")?,
            stream: s["stream"].as_u64().unwrap_or(0) as u32,
            pool: if s["segment_type"] == "small" {
                PoolKind::Small
            } else {
                PoolKind::Large
            },
            is_expandable: s["is_expandable"].as_bool().unwrap_or(false),
            stack: match s["stack"].as_u64() {
                Some(x) => Some(stack_of(Some(x), &|| format!("segments[{i}]"))?),
                None => None,
            },
            blocks,
        });
    }
    let times = vec![0; t.events.len()];
    Ok(Snapshot {
        format: Format::Gpumem,
        name: t.name,
        device: 0,
        devices: vec![0],
        segments,
        times,
        events: t.events,
        tags,
        library_frames: Default::default(),
        conf: t.setup.conf,
        total_memory: Some(t.setup.total),
        context_overhead: Some(t.setup.overhead),
        annotations: Vec::new(),
        iterations: IterationSource::Tags,
        iterations_why: None,
        dropped: t.dropped,
        skipped: Vec::new(),
        skipped_at: Vec::new(),
        skipped_kind: Vec::new(),
        entry_meta: Vec::new(),
        meta_strings: MetaStrings::default(),
        segment_pools: Vec::new(),
    })
}
