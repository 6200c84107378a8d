//! The profiler's table (`torch.profiler`'s `key_averages().table(sort_by=
//! "self_cuda_memory_usage")`, seed 004) from an allocator trace: per op, module, source line or
//! annotation, the allocations made and the frees done under it, the net, the largest single
//! allocation and the bytes of its allocations alive at the peak.
//!
//! An allocation counts for the key of its own stack and a free for the key of the stack it
//! was freed under (PyTorch's "self" memory: a tensor made in a forward op and freed in the
//! backward is allocated by the one and freed by the other); the bytes are block sizes, as
//! `memory_allocated()` counts them. The peak's bytes go to the key that allocated them; blocks
//! from before the trace began that were still alive then go to their segment's stack when the
//! trace never touched them, else to "(allocated before the trace started)". So the column
//! sums to the peak of allocated memory.
//!
//! What a key is depends on where the stacks came from:
//! - gpumem's own runs (`iter:N/phase:P/SCOPE/OP/category:C`): `op` is the innermost tag (the
//!   op, or `linear_backward`), `module` the innermost scope (`model.layers.0.mlp`; the phase
//!   in parentheses where there is none, as for the backward's ops), `annotation` the phase.
//! - PyTorch snapshots (frames): `op` is the innermost `at::_ops::NAME` C++ frame as
//!   `aten::NAME`, else the innermost Python frame's `file.py:function`; `module` the chain of
//!   `nn.Module` calls, each as the line that called it (`train.py:126 › modeling_llama.py:403
//!   › :308`: the decoder layers' self-attention, a file named once for the lines of it that
//!   follow; a snapshot names no modules);
//!   `line` the innermost Python frame outside PyTorch and Python's standard library (the
//!   model's or the training script's line that asked for the memory); `annotation` the
//!   innermost `record_function` range open when the event happened, with the entry's
//!   `user_metadata` beside it where set (`load · user_metadata=phase=load`).

use rustc_hash::{FxHashMap, FxHashSet};

use super::blocks::Sizer;
use super::stacks::is_python_frame;
use crate::alloc::{AllocConf, BlockState, SegmentInfo};
use crate::snapshot::Annotation;
use crate::trace::{Event, EventKind, StackId, TagId, Tags};

/// What the rows are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    Op,
    Module,
    Line,
    Annotation,
}

impl GroupBy {
    pub fn name(self) -> &'static str {
        match self {
            GroupBy::Op => "op",
            GroupBy::Module => "module",
            GroupBy::Line => "line",
            GroupBy::Annotation => "annotation",
        }
    }
}

/// The column the rows are sorted by, largest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SortBy {
    /// Bytes held at the peak.
    Peak,
    Allocated,
    Freed,
    /// Allocated minus freed (the profiler's "Self CUDA Mem").
    Net,
    Largest,
    /// How many allocations.
    Allocs,
}

impl SortBy {
    pub fn name(self) -> &'static str {
        match self {
            SortBy::Peak => "peak",
            SortBy::Allocated => "allocated",
            SortBy::Freed => "freed",
            SortBy::Net => "net",
            SortBy::Largest => "largest",
            SortBy::Allocs => "allocs",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProfileRow {
    pub key: String,
    /// Allocations made under the key.
    pub allocs: u64,
    /// Frees done under the key.
    pub frees: u64,
    pub allocated_bytes: u64,
    pub freed_bytes: u64,
    /// `allocated_bytes - freed_bytes`.
    pub net_bytes: i64,
    /// The largest single allocation.
    pub largest_bytes: u64,
    /// Bytes of the key's allocations alive at the peak of allocated memory.
    pub at_peak_bytes: u64,
}

impl ProfileRow {
    fn add(&mut self, o: &ProfileRow) {
        self.allocs += o.allocs;
        self.frees += o.frees;
        self.allocated_bytes += o.allocated_bytes;
        self.freed_bytes += o.freed_bytes;
        self.net_bytes += o.net_bytes;
        self.largest_bytes = self.largest_bytes.max(o.largest_bytes);
        self.at_peak_bytes += o.at_peak_bytes;
    }

    fn sort_value(&self, s: SortBy) -> i128 {
        match s {
            SortBy::Peak => self.at_peak_bytes.into(),
            SortBy::Allocated => self.allocated_bytes.into(),
            SortBy::Freed => self.freed_bytes.into(),
            SortBy::Net => self.net_bytes.into(),
            SortBy::Largest => self.largest_bytes.into(),
            SortBy::Allocs => self.allocs.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Profile {
    pub by: GroupBy,
    pub sort: SortBy,
    /// The peak of allocated memory the `at_peak_bytes` column adds up to, and its event.
    pub peak_allocated_bytes: u64,
    pub peak_event: u64,
    /// Every key, sorted.
    pub rows: Vec<ProfileRow>,
    /// The column sums (`largest_bytes`: the largest of all).
    pub total: ProfileRow,
}

/// A trace and what its stacks are.
pub struct ProfileInput<'a> {
    pub segments: &'a [SegmentInfo],
    pub events: &'a [Event],
    /// Each event's `time_us` (for annotations), if known.
    pub times: &'a [u64],
    pub tags: &'a Tags,
    pub conf: &'a AllocConf,
    pub annotations: &'a [Annotation],
    /// The stacks are call-stack frames (a PyTorch snapshot's), not gpumem's tags.
    pub frames: bool,
    /// Frames in PyTorch's own files or Python's standard library (skipped by `line`).
    pub library: &'a FxHashSet<TagId>,
    /// The entries' `user_metadata` (by event, ascending), shown beside their annotation.
    pub entry_meta: &'a [crate::snapshot::EntryMeta],
    pub meta_strings: Option<&'a crate::snapshot::MetaStrings>,
}

/// Key of a stack of C++ frames only (PyTorch's autograd engine runs the backward on a thread
/// without Python frames).
const NO_PYTHON: &str = "(no Python frames: the backward, or C++)";

/// Key of the blocks from before the trace that were alive at its peak.
pub const BEFORE_TRACE: &str = "(allocated before the trace started)";

/// The table, or why this trace cannot give it.
pub fn profile(inp: &ProfileInput<'_>, by: GroupBy, sort: SortBy) -> Result<Profile, String> {
    if inp.events.is_empty() {
        return Err("the trace is empty: the table needs the allocations of a trace".into());
    }
    if by == GroupBy::Line && !inp.frames {
        return Err(
            "gpumem's own runs record scopes and ops, not source lines: use --by op or \
             --by module (a PyTorch snapshot's frames give lines)"
                .into(),
        );
    }
    let timed = by == GroupBy::Annotation && inp.frames;
    if timed && inp.annotations.is_empty() && !inp.entry_meta.iter().any(|m| m.user_metadata != 0) {
        return Err("the snapshot has no annotations: PyTorch records them for \
             torch.profiler.record_function ranges (and the optimizer's step) while \
             _record_memory_history is on, and user_metadata for \
             torch.cuda.memory._set_memory_metadata"
            .into());
    }
    if timed && inp.times.len() != inp.events.len() {
        return Err("the trace has no event times to place its annotations".into());
    }
    let w = super::walk::walk(inp.segments, inp.events, inp.conf);
    let end = super::summary::pool_state(inp.segments, None);
    let start = (end.allocated_bytes as i64 - w.net).max(0);
    let (peak_i, peak) = super::summary::peak_of(&w.after, start);
    let sizer = Sizer::new(inp.conf);
    let mut keys = Keys::new(inp, by);
    let mut rows: Vec<ProfileRow> = Vec::new();
    fn row(rows: &mut Vec<ProfileRow>, k: u32) -> &mut ProfileRow {
        let k = k as usize;
        if rows.len() <= k {
            rows.resize(k + 1, ProfileRow::default());
        }
        &mut rows[k]
    }
    // blocks allocated in the trace and alive: address -> (block, key)
    let mut alive: FxHashMap<u64, (u64, u32)> = FxHashMap::default();
    let mut seen: FxHashSet<u64> = FxHashSet::default();
    let mut ranges = OpenRanges::new(inp.annotations);
    let mut meta = inp.entry_meta.iter().peekable();
    let mut before_at_peak = 0u64;
    for (i, e) in inp.events.iter().enumerate() {
        let kind = e.kind();
        if matches!(kind, EventKind::Alloc | EventKind::FreeRequested) {
            let k = if timed {
                let name = ranges.at(inp.times[i]);
                while meta.next_if(|m| (m.event as usize) < i).is_some() {}
                let user = meta
                    .peek()
                    .filter(|m| m.event as usize == i && m.user_metadata != 0)
                    .zip(inp.meta_strings)
                    .map(|(m, strings)| strings.text(m.user_metadata));
                match user {
                    Some(u) => keys.named(&format!("{name} · user_metadata={u}")),
                    None => keys.named(name),
                }
            } else {
                keys.of(e.stack)
            };
            let x = row(&mut rows, k);
            if kind == EventKind::Alloc {
                let b = match w.block[i] {
                    0 => sizer.round(e.size()),
                    b => b,
                };
                x.allocs += 1;
                x.allocated_bytes += b;
                x.largest_bytes = x.largest_bytes.max(b);
                alive.insert(e.addr, (b, k));
                seen.insert(e.addr);
            } else {
                let b = match alive.remove(&e.addr) {
                    Some((b, _)) => b,
                    None => {
                        let b = sizer.round(e.size());
                        if seen.insert(e.addr) && i > peak_i {
                            // from before the trace, alive at the peak
                            before_at_peak += b;
                        }
                        b
                    }
                };
                x.frees += 1;
                x.freed_bytes += b;
            }
        }
        if i == peak_i {
            for &(b, k) in alive.values() {
                row(&mut rows, k).at_peak_bytes += b;
            }
        }
    }
    if before_at_peak > 0 {
        let k = keys.named(BEFORE_TRACE);
        row(&mut rows, k).at_peak_bytes += before_at_peak;
    }
    // blocks alive at the end that the trace never touched were alive all along
    for s in inp.segments {
        for b in s.blocks.iter() {
            if b.state == BlockState::ActiveAllocated && !seen.contains(&b.address) {
                let k = if timed {
                    keys.named(BEFORE_TRACE)
                } else {
                    keys.of(b.stack)
                };
                row(&mut rows, k).at_peak_bytes += b.size;
            }
        }
    }
    let names = keys.names;
    let mut out: Vec<ProfileRow> = rows
        .into_iter()
        .zip(names)
        .map(|(mut r, key)| {
            r.key = key;
            r.net_bytes = r.allocated_bytes as i64 - r.freed_bytes as i64;
            r
        })
        .filter(|r| r.allocs + r.frees > 0 || r.at_peak_bytes > 0)
        .collect();
    out.sort_by(|a, b| {
        b.sort_value(sort)
            .cmp(&a.sort_value(sort))
            .then_with(|| natural(&a.key, &b.key))
    });
    let mut total = ProfileRow {
        key: "total".into(),
        ..ProfileRow::default()
    };
    for r in &out {
        total.add(r);
    }
    Ok(Profile {
        by,
        sort,
        peak_allocated_bytes: peak.max(end.allocated_bytes),
        peak_event: peak_i as u64,
        rows: out,
        total,
    })
}

/// Orders names with their numbers as numbers (`blocks.2` before `blocks.10`).
fn natural(a: &str, b: &str) -> std::cmp::Ordering {
    fn parts(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (pa, pb) = (parts(a), parts(b));
    for ((da, x), (db, y)) in pa.iter().zip(&pb) {
        let o = if *da && *db {
            let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
            x.len().cmp(&y.len()).then_with(|| x.cmp(y))
        } else {
            x.cmp(y)
        };
        if o.is_ne() {
            return o;
        }
    }
    pa.len().cmp(&pb.len()).then_with(|| a.cmp(b))
}

/// Keys by name, each stack's found once.
struct Keys<'a> {
    inp: &'a ProfileInput<'a>,
    by: GroupBy,
    names: Vec<String>,
    by_name: FxHashMap<String, u32>,
    by_stack: FxHashMap<StackId, u32>,
}

impl<'a> Keys<'a> {
    fn new(inp: &'a ProfileInput<'a>, by: GroupBy) -> Self {
        Keys {
            inp,
            by,
            names: Vec::new(),
            by_name: FxHashMap::default(),
            by_stack: FxHashMap::default(),
        }
    }

    fn named(&mut self, name: &str) -> u32 {
        if let Some(&k) = self.by_name.get(name) {
            return k;
        }
        let k = self.names.len() as u32;
        self.names.push(name.to_string());
        self.by_name.insert(name.to_string(), k);
        k
    }

    fn of(&mut self, s: StackId) -> u32 {
        if let Some(&k) = self.by_stack.get(&s) {
            return k;
        }
        let name = if self.inp.frames {
            frames_key(&self.inp.tags.resolve_ids(s), self.inp.library, self.by)
        } else {
            gpumem_key(&self.inp.tags.resolve(s), self.by)
        };
        let k = self.named(&name);
        self.by_stack.insert(s, k);
        k
    }
}

/// The key of one of gpumem's stacks (`setup` or `iter:N`, `phase:P`, scopes, the op,
/// `category:C`).
pub fn gpumem_key(tags: &[&str], by: GroupBy) -> String {
    let mut phase = None;
    let mut setup = false;
    let mut rest: Vec<&str> = Vec::new();
    for t in tags {
        if *t == "setup" {
            setup = true;
        } else if let Some(p) = t.strip_prefix("phase:") {
            phase = Some(p);
        } else if !t.starts_with("iter:") && !t.starts_with("category:") {
            rest.push(t);
        }
    }
    let when = match (phase, setup) {
        (Some(p), _) => p,
        (None, true) => "setup",
        (None, false) => "outside the iterations",
    };
    match by {
        GroupBy::Op => match rest.last() {
            Some(op) => op.to_string(),
            None => format!("({when})"),
        },
        GroupBy::Module => {
            // the op is the innermost tag; the scopes (full dotted paths) come before it
            if rest.len() >= 2 {
                rest[rest.len() - 2].to_string()
            } else {
                format!("({when})")
            }
        }
        GroupBy::Line | GroupBy::Annotation => when.to_string(),
    }
}

/// A frame tag's parts: `file.py:LINE:function`.
fn frame_parts(tag: &str) -> Option<(&str, &str, &str)> {
    if !is_python_frame(tag) {
        return None;
    }
    let mut p = tag.splitn(3, ':');
    Some((p.next()?, p.next()?, p.next()?))
}

/// The key of a PyTorch snapshot's stack (frames outermost first, `iter:N` in front).
fn frames_key(resolved: &[(TagId, &str)], library: &FxHashSet<TagId>, by: GroupBy) -> String {
    let kept: Vec<(TagId, &str)> = resolved
        .iter()
        .copied()
        .filter(|(_, t)| *t != "setup" && !t.starts_with("iter:") && !t.starts_with("category:"))
        .collect();
    let frames: Vec<&str> = kept.iter().map(|(_, t)| *t).collect();
    if frames.is_empty() {
        return super::stacks::NO_FRAMES.into();
    }
    match by {
        GroupBy::Op => {
            // the innermost aten op that is not a mere allocation inside another (the
            // `empty_strided` an `addmm` makes its output with)
            let ops: Vec<&str> = frames
                .iter()
                .rev()
                .filter_map(|f| {
                    let name = f.strip_prefix("[C++] ")?.split("at::_ops::").nth(1)?;
                    let name = name.split("::").next().unwrap_or(name);
                    (!name.is_empty()).then_some(name)
                })
                .collect();
            let helper = |n: &&str| {
                [
                    "empty",
                    "_empty",
                    "new_empty",
                    "resize_",
                    "zeros",
                    "new_zeros",
                ]
                .iter()
                .any(|h| n.starts_with(h))
            };
            if let Some(op) = ops.iter().find(|n| !helper(n)).or(ops.first()) {
                return format!("aten::{op}");
            }
            match frames.iter().rev().find_map(|f| frame_parts(f)) {
                Some((file, _, func)) => format!("{file}:{func}"),
                None => NO_PYTHON.into(),
            }
        }
        GroupBy::Line => {
            let python: Vec<(TagId, &str)> = kept
                .iter()
                .rev()
                .copied()
                .filter(|(_, f)| is_python_frame(f))
                .collect();
            match python
                .iter()
                .find(|(t, _)| !library.contains(t))
                .or(python.first())
            {
                Some((_, f)) => f.to_string(),
                None => NO_PYTHON.into(),
            }
        }
        GroupBy::Module => {
            let calls = |name: &str| {
                frames
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| frame_parts(f).is_some_and(|(_, _, func)| func == name))
                    .map(|(i, _)| i)
                    .collect::<Vec<_>>()
            };
            let mut entries = calls("_wrapped_call_impl");
            if entries.is_empty() {
                entries = calls("_call_impl");
            }
            let mut chain = String::new();
            let mut last_file = "";
            for i in entries {
                let caller = frames[..i].iter().rev().find_map(|f| {
                    let (file, line, func) = frame_parts(f)?;
                    (!matches!(func, "__call__" | "_call_impl" | "_wrapped_call_impl"))
                        .then_some((file, line))
                });
                if let Some((file, line)) = caller {
                    if !chain.is_empty() {
                        chain.push_str(" › ");
                    }
                    // a file named once for the lines of it that follow
                    if file != last_file {
                        chain.push_str(file);
                    }
                    chain.push(':');
                    chain.push_str(line);
                    last_file = file;
                }
            }
            if chain.is_empty() {
                "(outside any nn.Module)".into()
            } else {
                chain
            }
        }
        GroupBy::Annotation => unreachable!("annotations are found by time"),
    }
}

/// `record_function` ranges open at a moment, found by sweeping forward in time.
struct OpenRanges<'a> {
    annotations: Vec<&'a Annotation>,
    next: usize,
    open: Vec<&'a str>,
}

impl<'a> OpenRanges<'a> {
    fn new(a: &'a [Annotation]) -> Self {
        let mut annotations: Vec<&Annotation> = a.iter().collect();
        annotations.sort_by_key(|a| a.time_us);
        OpenRanges {
            annotations,
            next: 0,
            open: Vec::new(),
        }
    }

    /// The innermost range open at `t` (times ascend from call to call).
    fn at(&mut self, t: u64) -> &'a str {
        while let Some(a) = self.annotations.get(self.next).filter(|a| a.time_us <= t) {
            if a.stage.eq_ignore_ascii_case("START") {
                self.open.push(&a.name);
            } else if let Some(p) = self.open.iter().rposition(|n| *n == a.name) {
                self.open.remove(p);
            }
            self.next += 1;
        }
        self.open.last().copied().unwrap_or("(no annotation)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpumem_keys() {
        let s = [
            "iter:1",
            "phase:forward",
            "model.layers.0.mlp",
            "linear",
            "category:activation",
        ];
        assert_eq!(gpumem_key(&s, GroupBy::Op), "linear");
        assert_eq!(gpumem_key(&s, GroupBy::Module), "model.layers.0.mlp");
        assert_eq!(gpumem_key(&s, GroupBy::Annotation), "forward");
        let b = [
            "iter:1",
            "phase:backward",
            "linear_backward",
            "category:gradient",
        ];
        assert_eq!(gpumem_key(&b, GroupBy::Op), "linear_backward");
        assert_eq!(gpumem_key(&b, GroupBy::Module), "(backward)");
        assert_eq!(
            gpumem_key(&["iter:0", "phase:backward"], GroupBy::Op),
            "(backward)"
        );
        assert_eq!(
            gpumem_key(&["setup", "wte", "randn"], GroupBy::Module),
            "wte"
        );
    }

    fn stack(tags: &mut Tags, frames: &[&str]) -> StackId {
        let mut s = StackId::ROOT;
        for f in frames {
            let t = tags.intern(f);
            s = tags.child(s, t);
        }
        s
    }

    #[test]
    fn frame_keys() {
        let mut tags = Tags::default();
        let frames = [
            "iter:0",
            "train.py:126:step",
            "module.py:1779:_wrapped_call_impl",
            "module.py:1790:_call_impl",
            "modeling_llama.py:403:forward",
            "modeling_layers.py:109:__call__",
            "module.py:1779:_wrapped_call_impl",
            "module.py:1790:_call_impl",
            "modeling_llama.py:308:forward",
            "module.py:1779:_wrapped_call_impl",
            "module.py:1790:_call_impl",
            "linear.py:134:forward",
            "[C++] at::_ops::addmm::call(at::Tensor const&)",
            "[C++] at::_ops::empty_strided::call(c10::ArrayRef<c10::SymInt>)",
            "[C++] c10::cuda::CUDACachingAllocator::malloc",
        ];
        let s = stack(&mut tags, &frames);
        let mut library = FxHashSet::default();
        for f in [
            "module.py:1779:_wrapped_call_impl",
            "module.py:1790:_call_impl",
            "linear.py:134:forward",
        ] {
            library.insert(tags.intern(f));
        }
        let r = tags.resolve_ids(s);
        let key = |by| frames_key(&r, &library, by);
        assert_eq!(key(GroupBy::Op), "aten::addmm");
        assert_eq!(
            key(GroupBy::Module),
            "train.py:126 › modeling_llama.py:403 › :308"
        );
        // the innermost frame outside the library: the line that called the linear layer
        assert_eq!(key(GroupBy::Line), "modeling_llama.py:308:forward");
        // without C++ frames the op is the innermost Python function
        let p = stack(&mut tags, &frames[..12]);
        // an allocation helper alone is the op
        let e = stack(&mut tags, &["[C++] at::_ops::empty_strided::call()"]);
        assert_eq!(
            frames_key(&tags.resolve_ids(e), &library, GroupBy::Op),
            "aten::empty_strided"
        );
        let r = tags.resolve_ids(p);
        assert_eq!(frames_key(&r, &library, GroupBy::Op), "linear.py:forward");
        let none = stack(&mut tags, &["iter:2"]);
        assert_eq!(
            frames_key(&tags.resolve_ids(none), &library, GroupBy::Line),
            "(no frames recorded)"
        );
    }

    #[test]
    fn numbers_sort_as_numbers() {
        let mut v = vec!["blocks.10", "blocks.2", "blocks.1.fc", "blocks.1", "a"];
        v.sort_by(|a, b| natural(a, b));
        assert_eq!(v, ["a", "blocks.1", "blocks.1.fc", "blocks.2", "blocks.10"]);
    }

    #[test]
    fn ranges_nest_by_time() {
        let a = |stage: &str, name: &str, t| Annotation {
            stage: stage.into(),
            name: name.into(),
            time_us: t,
        };
        let anns = vec![
            a("START", "fwd", 10),
            a("START", "attn", 20),
            a("END", "attn", 30),
            a("END", "fwd", 40),
        ];
        let mut r = OpenRanges::new(&anns);
        assert_eq!(r.at(5), "(no annotation)");
        assert_eq!(r.at(10), "fwd");
        assert_eq!(r.at(25), "attn");
        assert_eq!(r.at(35), "fwd");
        assert_eq!(r.at(40), "(no annotation)");
    }
}
