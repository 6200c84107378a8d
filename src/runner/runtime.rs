//! The runtime's own functions and methods, what a script calls that is not an op of the
//! engine's table: keeping tensors, the KV cache's category, marks and counted tokens, the
//! allocator's calls, the distributed wrappers (DDP, ZeRO, FSDP2), optimizers, `backward`,
//! `.item()` ([`RUNTIME_FUNCTIONS`], [`RUNTIME_METHODS`]). `builtins` dispatches to them.

use super::builtins::Args;
use super::{engine_err, script, Flow, Mark, Runner, Stop, Value};
use crate::engine::op::script as script_table;
use crate::engine::optim::{OptimKind, Optimizer};
use crate::engine::TensorId;
use crate::workload::ast::Span;

/// A runtime function or method: its signature (`f(...)`, `x.f(...)` on a tensor, `opt.f(...)`
/// on an optimizer), what it does, and what runs it (with the receiver, or `none`).
pub struct Runtime {
    pub sig: &'static str,
    pub doc: &'static str,
    pub(super) call: fn(&mut Runner, Span, &Value, &Args) -> Flow<Value>,
}

impl Runtime {
    /// The name as called: `keep`, `x.backward`, `opt.step`.
    pub fn name(&self) -> &'static str {
        self.sig.split('(').next().unwrap_or(self.sig)
    }
}

/// The entry called `receiver` + `name` (`receiver` is "", "x." or "opt."): one hash lookup,
/// as this runs for every call a script makes.
pub(super) fn runtime(
    table: &'static [Runtime],
    receiver: &str,
    name: &str,
) -> Option<&'static Runtime> {
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
        "token_done(until=none)",
        "counts a generated token (a generation step finished): an out-of-memory then says \
         which token it was generating, and `fit --param new_tokens` reads the longest \
         generation that fits from one run; until=N: every step from this one to token N makes \
         the same allocations, the growing ones by the same bytes each step, so `fit` may \
         replay them on the allocator alone",
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
        "zero_init(params, stage=2, world_size=1, reduce_bucket_size=500000000, overlap_comm=false, offload_optimizer=false)",
        "DeepSpeed ZeRO stage 1, 2 or 3 (0.19.6's DeepSpeedZeroOptimizer, from its source, checked on recorded runs) over the parameters, rank 0 of world_size: the flat parameters, the float32 master partition; in backward the reduction bucket of reduce_bucket_size elements and the partition's gradients; opt.step() then steps FusedAdam over the partition (one backward per step: gradient accumulation is not modelled); offload_optimizer: the master, its gradient and Adam's state on the host, DeepSpeedCPUAdam stepping there (pinned buffers counted as host memory); stage 3 (world size 1): DeepSpeedZeroOptimizer_Stage3's buffers (the parameters in one buffer, a float32 master copy, every gradient's partition and the bucket, kept; offloaded, the master and the partitions on the host) and its memory-efficient linear's backward order",
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
    if stage > 3 {
        return script(
            span,
            format!("zero_init: stage {stage} does not exist (DeepSpeed's stages are 1 to 3)"),
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
        offload: Runner::bool_kw(span, a, "offload_optimizer", false)?,
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
    let _ = recv;
    let until = match a.kw("until") {
        None | Some(Value::None) => None,
        Some(Value::Int(n)) if *n >= 1 => Some(*n as u64),
        Some(_) => return script(span, "token_done: until= takes a token count (1 or more)"),
    };
    let tokens = me.generated.map_or(0, |g| g.tokens) + 1;
    me.set_generated(tokens);
    match until {
        Some(n) if me.fast_forward && n > tokens => me.fast_forward_to(span, tokens, n),
        _ => Ok(Value::None),
    }
}

impl Runner {
    /// The generation at `tokens` tokens, with the run's peaks.
    fn set_generated(&mut self, tokens: u64) {
        self.note_peak();
        self.generated = Some(crate::analysis::record::Generated {
            tokens,
            peak_allocated: self.run_peak,
            peak_reserved: self.run_peak_reserved,
            tail_allocations: None,
            allocations: self.dev.alloc.stats().allocation.all().allocated as u64,
        });
    }

    /// [`super::RunOptions::fast_forward`], at the end of a step that the script says keeps
    /// its shape to token `until`: the step's allocator calls are logged, and once the last
    /// few steps agree on a [`Template`](crate::alloc::fastforward::Template), the rest are
    /// played on the allocator alone and the loop of those steps ends.
    fn fast_forward_to(&mut self, span: Span, tokens: u64, until: u64) -> Flow<Value> {
        use crate::alloc::fastforward::{self, DriveEnd, STEPS_TO_INFER};
        let computes = self.dev.computes();
        let alloc = &mut self.dev.alloc;
        match alloc.take_step_log() {
            None => {
                // the log starts here: the next step is the first logged
                alloc.start_step_log();
                return Ok(Value::None);
            }
            Some((_, true)) => self.steps_seen.clear(),
            Some((events, false)) => {
                if self.steps_seen.len() == STEPS_TO_INFER {
                    self.steps_seen.pop_front();
                }
                self.steps_seen.push_back(events);
            }
        }
        if self.steps_seen.len() < STEPS_TO_INFER || alloc.collects_garbage() || computes {
            return Ok(Value::None);
        }
        let Some(t) = fastforward::Template::infer(self.steps_seen.make_contiguous()) else {
            tracing::trace!(tokens, "decode steps differ: no fast-forward yet");
            return Ok(Value::None);
        };
        alloc.stop_step_log();
        tracing::trace!(growing = ?t.growing(), "decode step template");
        let d = fastforward::drive(alloc, &t, until - tokens, self.deadline);
        let drove = self.drove.get_or_insert_with(Default::default);
        drove.steps += d.steps;
        drove.full_steps += d.full_steps;
        drove.skipped_blocks += d.skipped_blocks;
        tracing::debug!(
            from = tokens,
            steps = d.steps,
            end = ?d.end,
            mallocs_per_step = t.mallocs(),
            full_steps = d.full_steps,
            skipped_blocks = d.skipped_blocks,
            "generation fast-forwarded"
        );
        self.set_generated(tokens + d.steps);
        match d.end {
            DriveEnd::Done => {
                // the engine's storages to the blocks the drive left them in, and the loop
                // of these steps ends here
                self.dev.relocate(&d.moved);
                self.break_loop = true;
                self.drove_to_end = true;
                Ok(Value::None)
            }
            DriveEnd::Oom(o) => Err(Stop::Oom(span, o)),
            DriveEnd::Deadline => Err(Stop::Deadline),
            DriveEnd::Diverged(why) => script(
                span,
                format!(
                    "internal error: the generation's fast-forward lost step with the allocator \
                     after token {} ({why}); please report it",
                    tokens + d.steps
                ),
            ),
        }
    }
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
