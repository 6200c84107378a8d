//! The functions, methods, attributes and indexing a workload script can use.
//!
//! Tensor ops come from the engine's table ([`crate::engine::op::script`]) and are bound in
//! `bind`; what is here are the runtime's own: [`RUNTIME_FUNCTIONS`] and [`RUNTIME_METHODS`]
//! (keeping tensors, marks, the allocator's calls, optimizers, backward, `.item()`), tensor
//! attributes, and indexing.

use super::{engine_err, script, Flow, Mark, Runner, Value};
use crate::engine::layout::Layout;
use crate::engine::op::script as script_table;
use crate::engine::op::script::Entry;
use crate::engine::op::{Hyper, ViewKind};
use crate::engine::optim::{OptimKind, Optimizer};
use crate::engine::TensorId;
use crate::workload::ast::{Expr, Ident, IndexItem, Span};

/// A runtime function or method: its signature (`f(...)`, `x.f(...)` on a tensor, `opt.f(...)`
/// on an optimizer), what it does, and what runs it (with the receiver, or `none`).
pub struct Runtime {
    pub sig: &'static str,
    pub doc: &'static str,
    call: fn(&mut Runner, Span, &Value, &Args) -> Flow<Value>,
}

impl Runtime {
    /// The name as called: `keep`, `x.backward`, `opt.step`.
    pub fn name(&self) -> &'static str {
        self.sig.split('(').next().unwrap_or(self.sig)
    }
}

/// The entry called `receiver` + `name` (`receiver` is "", "x." or "opt."): one hash lookup,
/// as this runs for every call a script makes.
fn runtime(table: &'static [Runtime], receiver: &str, name: &str) -> Option<&'static Runtime> {
    use std::sync::OnceLock;
    type Index = script_table::NameMap<Vec<(&'static str, &'static Runtime)>>;
    static FUNCTIONS: OnceLock<Index> = OnceLock::new();
    static METHODS: OnceLock<Index> = OnceLock::new();
    let build = |t: &'static [Runtime]| {
        let mut m = Index::default();
        for r in t {
            let full = r.name();
            let (recv, bare) = match full.split_once('.') {
                Some((x, b)) => (&full[..x.len() + 1], b),
                None => ("", full),
            };
            m.entry(bare).or_default().push((recv, r));
        }
        m
    };
    let index = if std::ptr::eq(table, RUNTIME_FUNCTIONS) {
        FUNCTIONS.get_or_init(|| build(RUNTIME_FUNCTIONS))
    } else {
        METHODS.get_or_init(|| build(RUNTIME_METHODS))
    };
    index
        .get(name)?
        .iter()
        .find(|(r, _)| *r == receiver)
        .map(|(_, e)| *e)
}

const fn rt(
    sig: &'static str,
    doc: &'static str,
    call: fn(&mut Runner, Span, &Value, &Args) -> Flow<Value>,
) -> Runtime {
    Runtime { sig, doc, call }
}

/// The runtime's functions.
pub static RUNTIME_FUNCTIONS: &[Runtime] = &[
    rt(
        "keep(*tensors)",
        "holds the tensors to the end of the run (a list that keeps them)",
        rt_keep,
    ),
    rt(
        "kv_cache(*tensors)",
        "counts the tensors' memory as the KV cache (category kv_cache), as a generation's \
         past_key_values holds it",
        rt_kv_cache,
    ),
    rt(
        "mark(label)",
        "notes allocated and reserved memory here under label",
        rt_mark,
    ),
    rt(
        "token_done()",
        "counts a generated token (a generation step finished): an out-of-memory then says \
         which token it was generating, and `fit --param new_tokens` reads the longest \
         generation that fits from one run",
        rt_token_done,
    ),
    rt(
        "empty_cache()",
        "torch.cuda.empty_cache(): frees the cached segments",
        rt_empty_cache,
    ),
    rt(
        "reset_peak_memory_stats()",
        "resets the peak counters",
        rt_reset_peak,
    ),
    rt("synchronize()", "torch.cuda.synchronize()", rt_synchronize),
    rt(
        "ddp_init(params, buffers=[], bucket_cap_mb=25, gradient_as_bucket_view=false, world_size=1)",
        "DistributedDataParallel around the parameters (every rank alike; world_size labels the run): one gradient bucket of them all; the first backward's order rebuilds the buckets",
        rt_ddp_init,
    ),
    rt(
        "zero_init(params, stage=2, world_size=1, reduce_bucket_size=500000000, overlap_comm=false)",
        "DeepSpeed ZeRO stage 1 or 2 (0.19.6's DeepSpeedZeroOptimizer, from its source) over the parameters, rank 0 of world_size: the flat parameters, the float32 master partition; in backward the reduction bucket of reduce_bucket_size elements and the partition's gradients; opt.step() then steps FusedAdam over the partition (one backward per step: gradient accumulation is not modelled)",
        rt_zero_init,
    ),
    rt(
        "ddp_forward()",
        "DDP's work before a forward: the buckets rebuilt once after the first backward, the buffers flattened for their broadcast",
        rt_ddp_forward,
    ),
    rt(
        "fsdp_init(groups, root=-1, buffers=[], param_dtype=none, reduce_dtype=none, reshard_after_forward=true, offload=false, world_size=1)",
        "FSDP2's fully_shard on each group of parameters (the root's last): each gets a shard, the module's parameter its unsharded form, without memory until a forward; what is on the host (device=\"cpu\"), the root's buffers too, moves to the device first; offload: CPUOffloadPolicy (shards, gradients and the step in pinned host memory)",
        rt_fsdp_init,
    ),
    rt(
        "fsdp_sharded(params)",
        "the sharded parameters of FSDP-managed ones (what model.parameters() yields after fully_shard: give them to the optimizer)",
        rt_fsdp_sharded,
    ),
    rt(
        "fsdp_pre_forward(group, x=none)",
        "FSDP2's forward pre-hook of a group: unshards it; returns x through the hook that reduces the group's gradients in backward",
        rt_fsdp_pre_forward,
    ),
    rt(
        "fsdp_post_forward(group, out)",
        "FSDP2's forward post-hook: reshards a layer's group; the group unshards again in backward before out's node",
        rt_fsdp_post_forward,
    ),
    rt(
        "sgd(params, lr=0.001, momentum=0, weight_decay=0, foreach=true)",
        "torch.optim.SGD",
        rt_optimizer,
    ),
    rt(
        "adam(params, lr=0.001, betas=[0.9, 0.999], eps=1e-8, weight_decay=0, foreach=true)",
        "torch.optim.Adam",
        rt_optimizer,
    ),
    rt(
        "adamw(params, lr=0.001, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01, foreach=true)",
        "torch.optim.AdamW",
        rt_optimizer,
    ),
    rt(
        "adam8bit(params, lr=0.001, betas=[0.9, 0.999], eps=1e-8, weight_decay=0, foreach=true)",
        "bitsandbytes.optim.Adam8bit (0.50, block-wise): uint8 states with float32 block maxima, 32-bit states below 4,096 elements; simulated device only",
        rt_optimizer,
    ),
    rt(
        "adamw8bit(params, lr=0.001, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01, foreach=true)",
        "bitsandbytes.optim.AdamW8bit (0.50, block-wise), as adam8bit with decoupled weight decay; simulated device only",
        rt_optimizer,
    ),
    rt(
        "paged_adamw8bit(params, lr=0.001, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01, foreach=true)",
        "bitsandbytes.optim.PagedAdamW8bit: as adamw8bit, the states of parameters of 100,000 elements or more in unified memory (cudaMallocManaged, reported apart from device memory); simulated device only",
        rt_optimizer,
    ),
    rt(
        "torchao_adam8bit(params, lr=0.001, betas=[0.9, 0.999], eps=1e-8, weight_decay=0, foreach=true)",
        "torchao.optim.Adam8bit (0.18): uint8 codes with a float32 scale per 256 elements (parameters of 4,096 elements or more, a whole number of blocks; others plain), its update under torch.compile (float32 states and scales per call, as inductor allocates them with a warm cache); simulated device only",
        rt_optimizer,
    ),
    rt(
        "torchao_adamw8bit(params, lr=0.001, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01, foreach=true)",
        "torchao.optim.AdamW8bit: as torchao_adam8bit with decoupled weight decay; simulated device only",
        rt_optimizer,
    ),
    rt(
        "torchao_adam4bit(params, lr=0.001, betas=[0.9, 0.999], eps=1e-8, weight_decay=0, foreach=true)",
        "torchao.optim.Adam4bit (0.18): 4-bit codes two to a byte with a float32 scale per 128 elements; its compiled update also holds int64 codes, 24 bytes per element for the call; simulated device only",
        rt_optimizer,
    ),
    rt(
        "torchao_adamw4bit(params, lr=0.001, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01, foreach=true)",
        "torchao.optim.AdamW4bit: as torchao_adam4bit with decoupled weight decay; simulated device only",
        rt_optimizer,
    ),
];

/// The runtime's methods.
pub static RUNTIME_METHODS: &[Runtime] = &[
    rt(
        "x.backward(retain_graph=false)",
        "backward from x (a scalar): gradients into the leaves' .grad",
        rt_backward,
    ),
    rt(
        "x.item()",
        "the value of a one-element tensor (its real value on a data device; 0.0 on sim)",
        rt_item,
    ),
    rt("x.numel()", "the number of elements (an integer)", rt_numel),
    rt("x.detach()", "a view outside the graph", rt_detach),
    rt(
        "x.requires_grad_(on=true)",
        "sets requires_grad",
        rt_requires_grad,
    ),
    rt(
        "opt.step()",
        "the optimizer's update (its state appears at the first step)",
        rt_step,
    ),
    rt(
        "opt.zero_grad(set_to_none=true)",
        "drops (or zeros) the gradients",
        rt_zero_grad,
    ),
];

fn tensor_of(v: &Value) -> TensorId {
    match v {
        Value::Tensor(t) => *t,
        _ => unreachable!("a tensor method's receiver is a tensor"),
    }
}

fn optimizer_of(v: &Value) -> usize {
    match v {
        Value::Optimizer(i) => *i,
        _ => unreachable!("an optimizer method's receiver is an optimizer"),
    }
}

fn rt_optimizer(me: &mut Runner, span: Span, _recv: &Value, a: &Args) -> Flow<Value> {
    let name = me.calling;
    me.make_optimizer(span, name, a)
}

fn rt_detach(me: &mut Runner, _span: Span, recv: &Value, _a: &Args) -> Flow<Value> {
    Ok(Value::Tensor(me.dev.detach(tensor_of(recv))))
}

fn rt_ddp_init(me: &mut Runner, span: Span, _recv: &Value, a: &Args) -> Flow<Value> {
    me.ddp_init(span, a)
}

fn rt_zero_init(me: &mut Runner, span: Span, _recv: &Value, a: &Args) -> Flow<Value> {
    let mut params = Vec::new();
    for v in &a.pos {
        match v {
            Value::Tensor(t) => params.push(*t),
            Value::List(items) => {
                for i in items {
                    match i {
                        Value::Tensor(t) => params.push(*t),
                        other => {
                            return script(
                                span,
                                format!("zero_init's params must be tensors, not {}", other.kind()),
                            )
                        }
                    }
                }
            }
            other => {
                return script(
                    span,
                    format!("zero_init takes a list of parameters, not {}", other.kind()),
                )
            }
        }
    }
    let int = |name: &str, default: f64| -> Flow<u64> {
        let v = Runner::float_kw(span, a, name, default)?;
        if v < 1.0 || v.fract() != 0.0 || v > 1e15 {
            return script(
                span,
                format!("zero_init: {name} must be a whole number from 1, not {v}"),
            );
        }
        Ok(v as u64)
    };
    let stage = int("stage", 2.0)?;
    if stage > 2 {
        return script(
            span,
            format!("zero_init: stage {stage} is not modelled yet (stages 1 and 2 are)"),
        );
    }
    if me.dev.computes() {
        return script(
            span,
            "zero_init runs on the simulated device only (--device sim, the default): its collectives and FusedAdam have no kernels on this device",
        );
    }
    let cfg = crate::engine::zero::ZeroConfig {
        stage: stage as u8,
        world: int("world_size", 1.0)?,
        bucket_elems: int("reduce_bucket_size", 5e8)?,
        overlap: Runner::bool_kw(span, a, "overlap_comm", false)?,
    };
    me.dev
        .zero_init(&params, cfg)
        .map_err(|e| engine_err(span, e))?;
    Ok(Value::None)
}

fn rt_ddp_forward(me: &mut Runner, span: Span, _recv: &Value, _a: &Args) -> Flow<Value> {
    me.ddp_forward(span)
}

fn rt_fsdp_init(me: &mut Runner, span: Span, _recv: &Value, a: &Args) -> Flow<Value> {
    me.fsdp_init(span, a)
}

fn rt_fsdp_sharded(me: &mut Runner, span: Span, _recv: &Value, a: &Args) -> Flow<Value> {
    me.fsdp_sharded(span, a)
}

fn rt_fsdp_pre_forward(me: &mut Runner, span: Span, _recv: &Value, a: &Args) -> Flow<Value> {
    me.fsdp_pre_forward(span, a)
}

fn rt_fsdp_post_forward(me: &mut Runner, span: Span, _recv: &Value, a: &Args) -> Flow<Value> {
    me.fsdp_post_forward(span, a)
}

fn rt_keep(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = (&span, recv, a);
    for v in &a.pos {
        if let Value::Tensor(t) = v {
            let h = me.dev.retain(*t);
            me.kept.push(h);
        }
    }
    Ok(Value::None)
}

fn rt_kv_cache(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = recv;
    for v in &a.pos {
        match v {
            Value::Tensor(t) => me.dev.recategorize(*t, crate::trace::Category::KvCache),
            _ => return script(span, "kv_cache expects tensors: kv_cache(k, v)"),
        }
    }
    Ok(Value::None)
}

fn rt_token_done(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = (&span, recv, a);
    let tokens = me.generated.map_or(0, |g| g.tokens) + 1;
    me.note_peak();
    me.generated = Some(crate::analysis::record::Generated {
        tokens,
        peak_allocated: me.run_peak,
        peak_reserved: me.run_peak_reserved,
        tail_allocations: None,
        allocations: me.dev.alloc.stats().allocation.all().allocated as u64,
    });
    Ok(Value::None)
}

fn rt_empty_cache(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = (&span, recv, a);
    me.dev.alloc.empty_cache();
    Ok(Value::None)
}

fn rt_reset_peak(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = (&span, recv, a);
    me.note_peak();
    me.dev.alloc.reset_peak_stats();
    Ok(Value::None)
}

fn rt_synchronize(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = (&span, recv, a);
    crate::backend::Device::synchronize(me.dev.alloc.source_mut());
    Ok(Value::None)
}

fn rt_mark(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = (&span, recv, a);
    let label = match a.pos.first() {
        Some(Value::Str(s)) => s.clone(),
        _ => return script(span, "mark expects a label string: mark(\"after forward\")"),
    };
    let s = me.dev.alloc.stats();
    me.marks.push(Mark {
        label,
        iteration: me.iteration,
        line: span.line,
        allocated: s.allocated_bytes.all().current as u64,
        reserved: s.reserved_bytes.all().current as u64,
    });
    Ok(Value::None)
}

fn rt_step(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = (&span, recv, a);
    let i = optimizer_of(recv);
    let mut opt = std::mem::replace(
        &mut me.optimizers[i],
        Optimizer::new(OptimKind::Sgd, Vec::new(), true),
    );
    me.capture_grads().map_err(|e| engine_err(span, e))?;
    let saved = me.enter_phase("phase:optimizer");
    me.dev.alloc.recorder_mut().push_tag("optimizer.step");
    // under ZeRO the wrapped optimizer steps the float32 partition alone
    let r = if me.dev.zero_world().is_some() {
        me.dev.zero_step()
    } else {
        opt.step(&mut me.dev)
    };
    me.dev.alloc.recorder_mut().set_current(saved);
    me.optimizers[i] = opt;
    r.map_err(|e| engine_err(span, e))?;
    if me.iteration.is_some() {
        me.current.after_step = Some(me.allocated());
    }
    Ok(Value::None)
}

fn rt_zero_grad(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = (&span, recv, a);
    let i = optimizer_of(recv);
    let set_to_none = match a.kw("set_to_none") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return script(
                span,
                format!("set_to_none must be true or false, not {}", v.kind()),
            )
        }
    };
    let opt = std::mem::replace(
        &mut me.optimizers[i],
        Optimizer::new(OptimKind::Sgd, Vec::new(), true),
    );
    let r = opt.zero_grad(&mut me.dev, set_to_none);
    me.optimizers[i] = opt;
    r.map_err(|e| engine_err(span, e))?;
    Ok(Value::None)
}

fn rt_backward(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = (&span, recv, a);
    let t = tensor_of(recv);
    let retain = Runner::bool_kw(span, a, "retain_graph", false)?;
    // PyTorch's `_make_grads`: only a one-element output gets its implicit gradient of 1
    if me.dev.info(t).requires_grad && me.dev.shape(t).iter().product::<usize>() != 1 {
        return script(
            span,
            format!(
                "grad can be implicitly created only for scalar outputs (this tensor has shape \
                 {:?}: reduce it first, e.g. loss.sum().backward() or loss.mean().backward())",
                me.dev.shape(t)
            ),
        );
    }
    if me.current.after_forward.is_none() && me.iteration.is_some() {
        me.current.after_forward = Some(me.allocated());
    }
    let saved = me.enter_phase("phase:backward");
    let r = me.dev.backward(t, retain).map_err(|e| engine_err(span, e));
    me.dev.alloc.recorder_mut().set_current(saved);
    r?;
    if me.iteration.is_some() {
        me.current.after_backward = Some(me.allocated());
    }
    Ok(Value::None)
}

fn rt_numel(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = (span, a);
    let t = tensor_of(recv);
    Ok(Value::Int(me.dev.info(t).layout.numel() as i64))
}

fn rt_item(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = (&span, recv, a);
    let t = tensor_of(recv);
    if me.dev.info(t).layout.numel() != 1 {
        return script(
            span,
            "a Tensor with more than one element cannot be converted to a Python scalar",
        );
    }
    let v = me.dev.read(t).map_err(|e| engine_err(span, e))?;
    match v {
        Some(v) => {
            let x = v[0];
            if me.iteration.is_some() {
                *me.current.loss.get_or_insert(0.0) += x;
            }
            Ok(Value::Float(x))
        }
        None => Ok(Value::Float(0.0)),
    }
}

fn rt_requires_grad(me: &mut Runner, span: Span, recv: &Value, a: &Args) -> Flow<Value> {
    let _ = (&span, recv, a);
    let t = tensor_of(recv);
    let on = match a.pos.first() {
        Some(Value::Bool(b)) => *b,
        None => true,
        Some(v) => {
            return script(
                span,
                format!("requires_grad_ expects true or false, not {}", v.kind()),
            )
        }
    };
    me.dev.set_requires_grad(t, on);
    Ok(Value::Tensor(me.dev.retain(t)))
}

/// What a called name reaches: a function of the runner or an op's entry.
#[derive(Clone, Copy)]
enum Callee {
    Runtime(&'static Runtime),
    Entry(&'static Entry),
}

/// Every callee in one table, so that a call's [`Ident`] keeps the one it reached as an index
/// (the same index for every run: the table is fixed).
struct Callees(std::sync::OnceLock<Vec<Callee>>);

static CALLEES: Callees = Callees(std::sync::OnceLock::new());

impl Callees {
    fn get(&self) -> &[Callee] {
        self.0.get_or_init(|| {
            RUNTIME_FUNCTIONS
                .iter()
                .chain(RUNTIME_METHODS)
                .map(Callee::Runtime)
                .chain(script_table::all_entries().map(Callee::Entry))
                .collect()
        })
    }

    /// What the function (or, with `method`, the tensor method) `name` calls: looked up by
    /// its text the first time, then by the index its [`Ident`] keeps.
    fn of(&self, name: &Ident, method: bool) -> Option<Callee> {
        if let Some(i) = name.resolved() {
            return Some(self.get()[i as usize]);
        }
        let (table, recv) = if method {
            (RUNTIME_METHODS, "x.")
        } else {
            (RUNTIME_FUNCTIONS, "")
        };
        let c = match runtime(table, recv, name) {
            Some(r) => Callee::Runtime(r),
            None => Callee::Entry(script_table::lookup(name, method)?),
        };
        name.set_resolved(self.index(c));
        Some(c)
    }

    fn index(&self, c: Callee) -> u32 {
        let same = |x: &Callee| match (x, c) {
            (Callee::Runtime(a), Callee::Runtime(b)) => std::ptr::eq(*a, b),
            (Callee::Entry(a), Callee::Entry(b)) => std::ptr::eq(*a, b),
            _ => false,
        };
        self.get()
            .iter()
            .position(same)
            .expect("every callee is in the table") as u32
    }
}

/// Evaluated arguments: positional values and keyword values.
#[derive(Default)]
pub(super) struct Args<'a> {
    /// (inline: a call's arguments are made and dropped for every call of a script)
    pub pos: smallvec::SmallVec<[Value; 4]>,
    /// Keyword arguments by their name in the script.
    pub kw: smallvec::SmallVec<[(&'a str, Value); 2]>,
    /// Which arguments are a variable's tensor lent without a handle of their own (bit `i`
    /// for `pos[i]`, bit `32 + j` for `kw[j]`; see [`Runner::lent`]): not released with the
    /// arguments.
    lent: u64,
}

impl Args<'_> {
    pub fn kw(&self, name: &str) -> Option<&Value> {
        self.kw.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    }
}

/// Every name a script can call as a function, for the unknown-function message.
pub fn function_names() -> Vec<&'static str> {
    let mut v = script_table::names(false);
    v.extend(RUNTIME_FUNCTIONS.iter().map(Runtime::name));
    v
}

/// Every name a script can call as a method of a tensor.
pub fn method_names() -> Vec<&'static str> {
    let mut v = script_table::names(true);
    v.extend(
        RUNTIME_METHODS
            .iter()
            .filter_map(|r| r.name().strip_prefix("x.")),
    );
    v
}

impl Runner {
    /// Evaluates a call's arguments. With `lend` (the callee is an op's entry, which reads
    /// its tensors and keeps its own handles on what it saves), a variable's tensor is lent
    /// rather than given another handle: no expression can unbind a variable while the call
    /// runs, and taking and dropping a handle per argument is a good part of a script's time.
    /// They are written into `out`, an empty [`Args`] of the caller's (no copy of it is
    /// moved around); on an error, what was evaluated is dropped.
    fn args<'a>(
        &mut self,
        out: &mut Args<'a>,
        args: &[Expr],
        kwargs: &'a [(String, Expr)],
        lend: bool,
    ) -> Flow<()> {
        for (i, a) in args.iter().enumerate() {
            if let Some(t) = self.lent(a).filter(|_| lend && i < 32) {
                out.pos.push(Value::Tensor(t));
                out.lent |= 1 << i;
                continue;
            }
            match self.eval(a) {
                Ok(v) => out.pos.push(v),
                Err(e) => {
                    self.drop_args(out);
                    return Err(e);
                }
            }
        }
        for (j, (k, a)) in kwargs.iter().enumerate() {
            if let Some(t) = self.lent(a).filter(|_| lend && j < 32) {
                out.kw.push((k.as_str(), Value::Tensor(t)));
                out.lent |= 1 << (32 + j);
                continue;
            }
            match self.eval(a) {
                Ok(v) => out.kw.push((k.as_str(), v)),
                Err(e) => {
                    self.drop_args(out);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Drops the arguments' handles (not lent ones), leaving `a` empty.
    fn drop_args(&mut self, a: &mut Args) {
        for (i, v) in a.pos.drain(..).enumerate() {
            if a.lent & (1 << i) == 0 {
                self.drop_value(v);
            }
        }
        for (j, (_, v)) in a.kw.drain(..).enumerate() {
            if a.lent & (1 << (32 + j)) == 0 {
                self.drop_value(v);
            }
        }
        a.lent = 0;
    }

    /// Whether calling `name` (a function, or with `method` a tensor's method) reaches an
    /// op's entry, whose arguments may be lent ([`Runner::args`]).
    pub(super) fn reaches_entry(name: &Ident, method: bool) -> bool {
        matches!(CALLEES.of(name, method), Some(Callee::Entry(_)))
    }

    fn bool_kw(span: Span, a: &Args, name: &str, default: bool) -> Flow<bool> {
        match a.kw(name) {
            None | Some(Value::None) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => script(
                span,
                format!("{name} must be true or false, not {}", v.kind()),
            ),
        }
    }

    fn float_kw(span: Span, a: &Args, name: &str, default: f64) -> Flow<f64> {
        match a.kw(name) {
            None => Ok(default),
            Some(v @ (Value::Int(_) | Value::Float(_))) => Ok(v.as_f64().expect("a number")),
            Some(v) => script(span, format!("{name} must be a number, not {}", v.kind())),
        }
    }

    pub(super) fn call(
        &mut self,
        span: Span,
        func: &Ident,
        args: &[Expr],
        kwargs: &[(String, Expr)],
    ) -> Flow<Value> {
        // resolved once: whether the arguments may be lent, and what is called
        let callee = CALLEES.of(func, false);
        let mut a = Args::default();
        self.args(
            &mut a,
            args,
            kwargs,
            matches!(callee, Some(Callee::Entry(_))),
        )?;
        let r = self.call_with(span, func, callee, &a);
        self.drop_args(&mut a);
        r
    }

    fn call_with(
        &mut self,
        span: Span,
        func: &Ident,
        callee: Option<Callee>,
        a: &Args,
    ) -> Flow<Value> {
        let Some(callee) = callee else {
            return script(
                span,
                format!(
                    "unknown function '{func}'; known: {}",
                    function_names().join(", ")
                ),
            );
        };
        match callee {
            Callee::Runtime(r) => {
                // (the optimizers are the runtime functions named by their kind)
                self.calling = OptimKind::parse(func.as_str()).map_or("adamw", OptimKind::name);
                (r.call)(self, span, &Value::None, a)
            }
            Callee::Entry(e) => self.call_entry(span, e, None, a),
        }
    }

    fn make_optimizer(&mut self, span: Span, func: &str, a: &Args) -> Flow<Value> {
        let mut params = Vec::new();
        for v in &a.pos {
            match v {
                Value::Tensor(t) => params.push(*t),
                Value::List(items) => params.extend(items.iter().filter_map(|i| match i {
                    Value::Tensor(t) => Some(*t),
                    _ => None,
                })),
                other => {
                    return script(
                        span,
                        format!("{func} takes tensors to optimize, not {}", other.kind()),
                    )
                }
            }
        }
        if params.is_empty() {
            return script(span, "optimizer got an empty parameter list");
        }
        for &p in &params {
            if !self.dev.info(p).requires_grad {
                return script(span, "can't optimize a tensor that does not require grad");
            }
            if self.dev.info(p).grad_fn.is_some() {
                return script(
                    span,
                    "can't optimize a non-leaf Tensor (it is the result of an op: optimize \
                     the tensors it was computed from, made with requires_grad=true)",
                );
            }
        }
        for (k, _) in &a.kw {
            if !["lr", "momentum", "weight_decay", "betas", "eps", "foreach"].contains(k) {
                return script(
                    span,
                    format!("{func} got an unexpected keyword argument '{k}'"),
                );
            }
        }
        let momentum = Self::float_kw(span, a, "momentum", 0.0)?;
        let kind = match OptimKind::parse(func) {
            Some(OptimKind::Sgd) if momentum != 0.0 => OptimKind::SgdMomentum,
            Some(k) => k,
            None => OptimKind::AdamW,
        };
        if kind.simulated_only() && self.dev.computes() {
            let whose = if kind.eight_bit() {
                "bitsandbytes' block-wise 8-bit update"
            } else {
                "torchao's low-bit update"
            };
            return script(
                span,
                format!(
                    "{func}: {whose} runs on the simulated device only (--device sim, the default), which gives the same memory: it has no kernel on this device yet"
                ),
            );
        }
        let d = Hyper::defaults(kind);
        let betas = match a.kw("betas") {
            None => d.betas,
            Some(Value::List(v)) if v.len() == 2 && v.iter().all(|x| x.as_f64().is_some()) => (
                v[0].as_f64().expect("a number"),
                v[1].as_f64().expect("a number"),
            ),
            Some(_) => {
                return script(
                    span,
                    "betas must be a list of two numbers, as betas=[0.9, 0.999]",
                )
            }
        };
        let hyper = Hyper {
            lr: Self::float_kw(span, a, "lr", d.lr)?,
            momentum,
            betas,
            eps: Self::float_kw(span, a, "eps", d.eps)?,
            weight_decay: Self::float_kw(span, a, "weight_decay", d.weight_decay)?,
        };
        let foreach = Self::bool_kw(span, a, "foreach", true)?;
        let handles = params.iter().map(|&p| self.dev.retain(p)).collect();
        self.optimizers
            .push(Optimizer::with_hyper(kind, handles, foreach, hyper));
        Ok(Value::Optimizer(self.optimizers.len() - 1))
    }

    pub(super) fn method(
        &mut self,
        span: Span,
        recv: &Value,
        name: &Ident,
        args: &[Expr],
        kwargs: &[(String, Expr)],
    ) -> Flow<Value> {
        if let Value::Optimizer(i) = recv {
            let mut a = Args::default();
            self.args(&mut a, args, kwargs, false)?;
            let r = self.optimizer_method(span, *i, name, &a);
            self.drop_args(&mut a);
            return r;
        }
        let Value::Tensor(t) = recv else {
            return script(span, format!("{} has no method '{name}'", recv.kind()));
        };
        let mut a = Args::default();
        self.args(&mut a, args, kwargs, Self::reaches_entry(name, true))?;
        let r = self.tensor_method(span, *t, name, &a);
        self.drop_args(&mut a);
        r
    }

    fn optimizer_method(&mut self, span: Span, i: usize, name: &str, a: &Args) -> Flow<Value> {
        match runtime(RUNTIME_METHODS, "opt.", name) {
            Some(rt) => (rt.call)(self, span, &Value::Optimizer(i), a),
            None => script(
                span,
                format!("optimizers have no method '{name}' (step, zero_grad)"),
            ),
        }
    }

    /// Before the first optimizer step, with `capture_grads`: every named parameter's gradient.
    fn capture_grads(&mut self) -> Result<(), crate::engine::EngineError> {
        if self.grads.is_some() {
            return Ok(());
        }
        let Some(named) = self.named.take() else {
            return Ok(());
        };
        let mut out = Vec::new();
        for (name, t) in &named {
            if let Some(g) = self.dev.grad(*t) {
                if let Some(v) = self.dev.read(g)? {
                    out.push((name.clone(), self.dev.shape(g).to_vec(), v));
                }
            }
        }
        for (_, t) in named {
            self.dev.release(t);
        }
        self.grads = Some(out);
        Ok(())
    }

    fn tensor_method(&mut self, span: Span, t: TensorId, name: &Ident, a: &Args) -> Flow<Value> {
        let Some(callee) = CALLEES.of(name, true) else {
            return script(
                span,
                format!(
                    "tensors have no method '{name}' in gpumem's engine; known: {}",
                    method_names().join(", ")
                ),
            );
        };
        match callee {
            Callee::Runtime(r) => (r.call)(self, span, &Value::Tensor(t), a),
            Callee::Entry(e) => self.call_entry(span, e, Some(t), a),
        }
    }

    pub(super) fn attr(&mut self, span: Span, recv: &Value, name: &str) -> Flow<Value> {
        let Value::Tensor(t) = recv else {
            return script(span, format!("{} has no attribute '{name}'", recv.kind()));
        };
        let t = *t;
        match name {
            "T" => self.call_entry(
                span,
                script_table::lookup("t", true).expect("t is an op"),
                Some(t),
                &Args::default(),
            ),
            "grad" => Ok(match self.dev.grad(t) {
                Some(g) => Value::Tensor(self.dev.retain(g)),
                None => Value::None,
            }),
            "shape" => Ok(Value::List(
                self.dev
                    .shape(t)
                    .iter()
                    .map(|&d| Value::Int(d as i64))
                    .collect(),
            )),
            "dtype" => Ok(Value::DType(self.dev.dtype(t))),
            "requires_grad" => Ok(Value::Bool(self.dev.info(t).requires_grad)),
            other => script(span, format!("tensors have no attribute '{other}'")),
        }
    }

    pub(super) fn index(&mut self, span: Span, recv: &Value, items: &[IndexItem]) -> Flow<Value> {
        if let Value::List(values) = recv {
            // a list (a tensor's shape, or split/chunk results) by one integer index
            let [IndexItem::Expr(e)] = items else {
                return script(span, "a list takes one integer index");
            };
            let v = self.eval(e)?;
            let Some(i) = v.as_i64() else {
                self.drop_value(v);
                return script(e.span, "list indices must be integers");
            };
            let n = values.len() as i64;
            let k = if i < 0 { i + n } else { i };
            if k < 0 || k >= n {
                return script(
                    e.span,
                    format!("list index {i} out of range for a list of {n}"),
                );
            }
            let item = values[k as usize].clone();
            return Ok(self.share(item));
        }
        let Value::Tensor(t) = recv else {
            return script(span, format!("{} cannot be indexed", recv.kind()));
        };
        let t = *t;
        let mut l = self.dev.info(t).layout.clone();
        // the same indexing of a contiguous tensor: where backward scatters the gradient
        let mut rel = Layout::contiguous(if self.dev.computes() { &l.shape } else { &[] });
        let computes = self.dev.computes();
        let real = items
            .iter()
            .filter(|i| matches!(i, IndexItem::Expr(_) | IndexItem::Slice { .. }))
            .count();
        let mut dim: i64 = 0;
        let int = |r: &mut Self, e: &Option<Expr>| -> Flow<Option<i64>> {
            match e {
                None => Ok(None),
                Some(e) => {
                    let v = r.eval(e)?;
                    match v.as_i64() {
                        Some(i) => Ok(Some(i)),
                        None => {
                            r.drop_value(v);
                            script(e.span, "indices must be integers")
                        }
                    }
                }
            }
        };
        for item in items {
            let res = match item {
                IndexItem::Expr(e) => {
                    let i = int(self, &Some(e.clone()))?.expect("given");
                    if computes {
                        rel = rel.select(dim, i).unwrap_or(rel);
                    }
                    l.select(dim, i)
                }
                IndexItem::Slice { start, stop, step } => {
                    let (s, e, st) = (
                        int(self, start)?,
                        int(self, stop)?,
                        int(self, step)?.unwrap_or(1),
                    );
                    let r = l.slice(dim, s, e, st);
                    if computes {
                        rel = rel.slice(dim, s, e, st).unwrap_or(rel);
                    }
                    dim += 1;
                    r
                }
                IndexItem::NewAxis => {
                    let r = l.unsqueeze(dim);
                    if computes {
                        rel = rel.unsqueeze(dim).unwrap_or(rel);
                    }
                    dim += 1;
                    r
                }
                IndexItem::Ellipsis => {
                    dim += l.ndim() as i64 - real as i64 - dim.min(l.ndim() as i64);
                    Ok(l.clone())
                }
            };
            l = res.map_err(|e| super::Stop::Script(span, e.0))?;
        }
        // PyTorch's indexing returns `alias(x)` when every index is a full slice or an
        // ellipsis: no slice node, its gradient passed through
        let plain = items
            .iter()
            .all(|i| matches!(i, IndexItem::Slice { .. } | IndexItem::Ellipsis));
        if plain && l == self.dev.info(t).layout {
            return Ok(Value::Tensor(self.dev.view_op(ViewKind::Alias, t, l, rel)));
        }
        Ok(Value::Tensor(self.dev.view_op(ViewKind::Index, t, l, rel)))
    }
}

/// The script language's functions and methods, one per line with what each does: the tensor
/// ops from the engine's table, then the runtime's own. `run --help`, the man page and the
/// README's list are this text.
pub fn script_reference() -> String {
    use crate::engine::op::script::{all_entries, Form};
    let mut rows: Vec<(String, &str)> = Vec::new();
    for e in all_entries() {
        let mut sig = e.signature();
        if e.form == Form::Both {
            sig.push_str(&format!("  (also x.{}(...))", e.name));
        }
        rows.push((sig, e.doc));
    }
    for r in RUNTIME_FUNCTIONS.iter().chain(RUNTIME_METHODS) {
        rows.push((r.sig.to_string(), r.doc));
    }
    let width = rows.iter().map(|(s, _)| s.len()).max().unwrap_or(0).min(60);
    let mut out = String::new();
    for (sig, doc) in rows {
        if sig.len() > width {
            out.push_str(&format!("  {sig}\n  {:width$}  {doc}\n", ""));
        } else {
            out.push_str(&format!("  {sig:width$}  {doc}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    /// The README's op list is the generated one (`GPUMEM_BLESS=1 cargo test readme_op_list`
    /// writes it).
    #[test]
    fn readme_op_list_is_the_generated_one() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        let text = std::fs::read_to_string(&path).unwrap();
        let (start, end) = ("<!-- ops:start -->\n```text\n", "```\n<!-- ops:end -->");
        let a = text.find(start).expect("README has the op list markers") + start.len();
        let b = text[a..].find(end).expect("the end marker") + a;
        let want = super::script_reference();
        if std::env::var("GPUMEM_BLESS").is_ok_and(|v| v == "1") {
            let new = format!("{}{}{}", &text[..a], want, &text[b..]);
            std::fs::write(&path, new).unwrap();
            return;
        }
        assert_eq!(
            &text[a..b],
            want,
            "README's op list is stale: GPUMEM_BLESS=1 cargo test readme_op_list"
        );
    }
}
