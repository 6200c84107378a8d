//! Snapshots in other tools' formats: PyTorch's snapshot dict (for memory_viz, pickled) and a
//! Chrome/Perfetto trace with memory counters.

use std::collections::BTreeMap;
use std::rc::Rc;

use rustc_hash::FxHashMap;
use serde_json::{json, Value};

use crate::alloc::BlockState;
use crate::analysis::stacks::is_python_frame;
use crate::snapshot::Snapshot;
use crate::trace::pickle::W;
use crate::trace::{EventKind, StackId, Tags};

/// One tag as a PyTorch frame: `file.py:LINE:function` tags go back to their parts; gpumem's
/// tags (iteration, phase, scope, op, category) become frames of file `gpumem`.
fn frame(tag: &str) -> (String, i64, String) {
    if is_python_frame(tag) {
        let mut p = tag.splitn(3, ':');
        let (f, l, n) = (
            p.next().unwrap_or(""),
            p.next().unwrap_or("0"),
            p.next().unwrap_or(""),
        );
        return (f.to_string(), l.parse().unwrap_or(0), n.to_string());
    }
    match tag.strip_prefix("[C++] ") {
        Some(name) => ("??".into(), 0, name.to_string()),
        None => ("gpumem".into(), 0, tag.to_string()),
    }
}

/// The frames of a stack, innermost first, as PyTorch lists them. `iter:N` tags that gpumem
/// added to a PyTorch snapshot's stacks (from its annotations or repetition) are left out.
fn frames_of(tags: &Tags, s: StackId, keep_iter: bool) -> Vec<(String, i64, String)> {
    tags.resolve(s)
        .into_iter()
        .rev()
        .filter(|t| keep_iter || !t.starts_with("iter:"))
        .map(frame)
        .collect()
}

struct FrameCache<'a> {
    tags: &'a Tags,
    keep_iter: bool,
    cache: FxHashMap<StackId, Rc<W>>,
}

impl FrameCache<'_> {
    fn get(&mut self, s: StackId) -> W {
        let (tags, keep_iter) = (self.tags, self.keep_iter);
        W::Shared(
            self.cache
                .entry(s)
                .or_insert_with(|| {
                    Rc::new(W::List(
                        frames_of(tags, s, keep_iter)
                            .into_iter()
                            .map(|(f, l, n)| {
                                W::Dict(vec![
                                    (W::Str("filename".into()), W::Str(f)),
                                    (W::Str("line".into()), W::Int(l)),
                                    (W::Str("name".into()), W::Str(n)),
                                ])
                            })
                            .collect(),
                    ))
                })
                .clone(),
        )
    }
}

fn s(k: &str) -> W {
    W::Str(k.to_string())
}

/// PyTorch's snapshot dict for `s`: what `torch.cuda.memory._snapshot()` returns, so that
/// memory_viz and `torch.cuda._memory_viz` read it. Times are the event index where the
/// source has none.
pub fn torch_snapshot(snap: &Snapshot) -> W {
    let mut fc = FrameCache {
        tags: &snap.tags,
        keep_iter: snap.iterations == crate::snapshot::IterationSource::Tags,
        cache: FxHashMap::default(),
    };
    let segments = snap
        .segments
        .iter()
        .map(|g| {
            let blocks = g
                .blocks
                .iter()
                .map(|b| {
                    let state = match b.state {
                        BlockState::ActiveAllocated => "active_allocated",
                        BlockState::ActivePendingFree => "active_pending_free",
                        BlockState::Inactive => "inactive",
                    };
                    // (a free block's frames are those of its last allocation, when kept)
                    let frames = fc.get(b.stack);
                    W::Dict(vec![
                        (s("address"), W::Int(b.address as i64)),
                        (s("size"), W::Int(b.size as i64)),
                        (s("requested_size"), W::Int(b.requested_size as i64)),
                        (s("state"), s(state)),
                        (s("frames"), frames),
                    ])
                })
                .collect();
            W::Dict(vec![
                (s("device"), W::Int(g.device as i64)),
                (s("address"), W::Int(g.address as i64)),
                (s("total_size"), W::Int(g.total_size as i64)),
                (s("allocated_size"), W::Int(g.allocated_size as i64)),
                (s("active_size"), W::Int(g.active_size as i64)),
                (s("requested_size"), W::Int(g.requested_size as i64)),
                (s("stream"), W::Int(g.stream as i64)),
                (s("segment_type"), s(g.pool.name())),
                (s("segment_pool_id"), {
                    let p = snap
                        .segment_pools
                        .binary_search_by_key(&g.address, |p| p.0)
                        .map_or([0, 0], |i| snap.segment_pools[i].1);
                    W::Tuple(vec![W::Int(p[0]), W::Int(p[1])])
                }),
                (s("is_expandable"), W::Bool(g.is_expandable)),
                (s("frames"), W::List(vec![])),
                (s("blocks"), W::List(blocks)),
            ])
        })
        .collect();
    let mut trace = Vec::with_capacity(snap.events.len() + snap.skipped_at.len());
    let mut meta = snap.entry_meta.iter().peekable();
    // entries of actions gpumem does not model go back where they were (their fields were not
    // kept)
    let mut skipped = snap.skipped_at.iter().zip(&snap.skipped_kind).peekable();
    let mut skip_to = |trace: &mut Vec<W>, upto: u64| {
        while let Some((_, k)) = skipped.next_if(|(at, _)| **at <= upto) {
            let action = snap.skipped.get(*k as usize).map_or("", |x| x.0.as_str());
            trace.push(W::Dict(vec![
                (s("action"), s(action)),
                (s("addr"), W::Int(0)),
                (s("size"), W::Int(0)),
                (s("stream"), W::Int(0)),
                (s("time_us"), W::Int(0)),
                (s("frames"), W::List(vec![])),
            ]));
        }
    };
    for (i, e) in snap.events.iter().enumerate() {
        let at = trace.len() as u64;
        skip_to(&mut trace, at);
        if e.kind() == EventKind::Retag || e.kind() == EventKind::EmptyCache {
            continue; // gpumem's own; PyTorch has no such entries
        }
        // gpumem's own traces have no times: the event's index stands in; PyTorch's are kept
        let time = if snap.format == crate::snapshot::Format::Gpumem {
            time_of(snap, i)
        } else {
            snap.times.get(i).copied().unwrap_or(0)
        };
        let mut d = vec![(s("action"), s(e.kind().action()))];
        if e.kind() == EventKind::Oom {
            d.push((s("addr"), W::Int(0)));
            d.push((s("device_free"), W::Int(e.addr as i64)));
        } else {
            d.push((s("addr"), W::Int(e.addr as i64)));
        }
        d.push((s("size"), W::Int(e.size() as i64)));
        d.push((s("stream"), W::Int(e.stream as i64)));
        d.push((s("time_us"), W::Int(time as i64)));
        let (mut umeta, mut cctx) = ("", "N/A");
        if let Some(m) = meta.next_if(|m| m.event as usize == i) {
            umeta = snap.meta_strings.text(m.user_metadata);
            if m.compile_context != 0 {
                cctx = snap.meta_strings.text(m.compile_context);
            }
        }
        d.push((s("compile_context"), s(cctx)));
        d.push((s("user_metadata"), s(umeta)));
        d.push((s("frames"), fc.get(e.stack)));
        trace.push(W::Dict(d));
    }
    skip_to(&mut trace, u64::MAX);
    let annotations = snap
        .annotations
        .iter()
        .map(|a| {
            W::Dict(vec![
                (s("stage"), s(&a.stage)),
                (s("name"), s(&a.name)),
                (s("device"), W::Int(snap.device as i64)),
                (s("time_us"), W::Int(a.time_us as i64)),
            ])
        })
        .collect();
    let mut traces: Vec<W> = (0..snap.device).map(|_| W::List(vec![])).collect();
    traces.push(W::List(trace));
    let c = &snap.conf;
    W::Dict(vec![
        (s("segments"), W::List(segments)),
        (s("device_traces"), W::List(traces)),
        (
            s("allocator_settings"),
            W::Dict(vec![
                (s("PYTORCH_CUDA_ALLOC_CONF"), s(&c.raw)),
                (s("max_split_size"), W::Int(c.max_split_size_stat())),
                (
                    s("garbage_collection_threshold"),
                    W::Float(c.garbage_collection_threshold),
                ),
                (s("expandable_segments"), W::Bool(c.expandable_segments)),
            ]),
        ),
        (s("external_annotations"), W::List(annotations)),
    ])
}

/// How many values `w` holds with every shared object counted at each use (as JSON writes
/// it), each shared object's count computed once; saturating.
pub fn expanded_len(w: &W, memo: &mut FxHashMap<*const W, u64>) -> u64 {
    match w {
        W::List(v) | W::Tuple(v) => v
            .iter()
            .fold(1u64, |n, x| n.saturating_add(expanded_len(x, memo))),
        W::Dict(kv) => kv.iter().fold(1u64, |n, (k, x)| {
            n.saturating_add(expanded_len(k, memo))
                .saturating_add(expanded_len(x, memo))
        }),
        W::Shared(r) => {
            let key = Rc::as_ptr(r);
            if let Some(&n) = memo.get(&key) {
                return n;
            }
            let n = expanded_len(r, memo);
            memo.insert(key, n);
            n
        }
        _ => 1,
    }
}

/// The same dict as JSON (PyTorch's snapshot saved as JSON).
pub fn w_to_json(w: &W) -> Value {
    match w {
        W::None => Value::Null,
        W::Bool(b) => json!(b),
        W::Int(i) => json!(i),
        W::Float(f) => json!(f),
        W::Str(s) => json!(s),
        W::List(v) | W::Tuple(v) => Value::Array(v.iter().map(w_to_json).collect()),
        W::Dict(kv) => Value::Object(
            kv.iter()
                .map(|(k, v)| {
                    let key = match k {
                        W::Str(s) => s.clone(),
                        other => w_to_json(other).to_string(),
                    };
                    (key, w_to_json(v))
                })
                .collect(),
        ),
        W::Shared(r) => w_to_json(r),
    }
}

/// A Chrome trace (Perfetto and chrome://tracing open it): a process per device, each with a
/// counter track per memory category (allocated, in block sizes as `analysis::blocks` finds
/// them) and one for reserved memory, over the trace's time (or event index), and iteration
/// starts as instant events.
pub fn perfetto(snaps: &[Snapshot]) -> Value {
    let mut events = Vec::new();
    for snap in snaps {
        events.extend(perfetto_device(snap));
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": format!("gpumem {}", env!("CARGO_PKG_VERSION"))},
    })
}

fn perfetto_device(snap: &Snapshot) -> Vec<Value> {
    let pid = snap.device as u64 + 1;
    let mut sizer = crate::analysis::blocks::Sizer::new(&snap.conf);
    let mut ann = crate::analysis::stacks::Annotator::new(&snap.tags);
    // walk the trace relative to its start, then anchor at the end state
    let mut cats: BTreeMap<String, i64> = BTreeMap::new();
    let mut live: FxHashMap<u64, (u64, String)> = FxHashMap::default();
    let mut reserved: i64 = 0;
    let mut rows: Vec<(u64, BTreeMap<String, i64>, i64)> = Vec::new();
    let mut marks: Vec<(u64, String)> = Vec::new();
    let mut last_iter: Option<u32> = None;
    for (i, e) in snap.events.iter().enumerate() {
        let t = time_of(snap, i);
        let block = sizer.step(e);
        match e.kind() {
            EventKind::Alloc => {
                let b = block.unwrap_or(0);
                let m = ann.meta(e.stack);
                let c = m.category.clone().unwrap_or_else(|| "other".into());
                *cats.entry(c.clone()).or_default() += b as i64;
                live.insert(e.addr, (b, c));
                if let crate::analysis::stacks::When::Iteration(n) = m.when {
                    if last_iter.is_none_or(|l| n > l) {
                        last_iter = Some(n);
                        marks.push((t, format!("iter {n}")));
                    }
                }
            }
            EventKind::FreeRequested => {
                let (b, c) = live
                    .remove(&e.addr)
                    .unwrap_or_else(|| (block.unwrap_or(0), "other".into()));
                *cats.entry(c).or_default() -= b as i64;
            }
            EventKind::Retag => {
                if let Some((b, c)) = live.get_mut(&e.addr) {
                    let to = ann
                        .meta(e.stack)
                        .category
                        .clone()
                        .unwrap_or_else(|| "other".into());
                    *cats.entry(c.clone()).or_default() -= *b as i64;
                    *cats.entry(to.clone()).or_default() += *b as i64;
                    *c = to;
                }
            }
            EventKind::SegmentAlloc | EventKind::SegmentMap => reserved += e.size() as i64,
            EventKind::SegmentFree | EventKind::SegmentUnmap => reserved -= e.size() as i64,
            _ => continue,
        }
        rows.push((t, cats.clone(), reserved));
    }
    // memory held from before the trace: what the end state has beyond the trace's net
    let end_alloc: i64 = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| b.size as i64)
        .sum();
    let end_res: i64 = snap.segments.iter().map(|s| s.total_size as i64).sum();
    let net: i64 = cats.values().sum();
    let before = (end_alloc - net).max(0);
    let res0 = (end_res - reserved).max(0);
    let mut events = vec![json!({
        "name": "process_name", "ph": "M", "pid": pid, "tid": 0,
        "args": {"name": format!("{} cuda:{}", snap.name, snap.device)},
    })];
    for (t, c, r) in &rows {
        let mut args = serde_json::Map::new();
        if before > 0 {
            args.insert(crate::analysis::profile::BEFORE_TRACE.into(), json!(before));
        }
        for (k, v) in c {
            args.insert(k.clone(), json!((*v).max(0)));
        }
        events.push(json!({"name": "allocated by category", "ph": "C", "ts": t, "pid": pid, "tid": 0, "args": args}));
        events.push(json!({"name": "reserved", "ph": "C", "ts": t, "pid": pid, "tid": 0, "args": {"reserved": res0 + r}}));
    }
    for (t, label) in marks {
        events.push(json!({"name": label, "ph": "i", "s": "p", "ts": t, "pid": pid, "tid": 0}));
    }
    events
}

/// Event `i`'s time: its recorded `time_us`, or its index where the snapshot has none.
fn time_of(snap: &Snapshot, i: usize) -> u64 {
    snap.times
        .get(i)
        .copied()
        .filter(|t| *t > 0)
        .unwrap_or(i as u64)
}
