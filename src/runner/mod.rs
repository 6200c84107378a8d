//! Runs a parsed workload on the engine, on the simulated device, and records what memory did.
//!
//! Variables hold tensor handles; a name reassigned or `del`eted drops its handle, and a value
//! nobody names is dropped at the end of its statement, as Python's refcounting would. Tags:
//! every allocation carries `iter:N` (or `setup`), the `phase` and `scope` blocks around it,
//! the op that made it, and its memory category (pushed by the engine).
//!
//! Per iteration the runner records allocated memory at the iteration's start, after the
//! forward pass (just before the first `backward()`, or at the end of a `phase "forward"`
//! block), after backward, and at the end, with the peaks since the iteration's start: it
//! resets the peak counters at each iteration start, as ../shared/tools/reference_models.py does.
//!
//! Beside it: the operators on values (`arith`), calls of the engine's ops (`bind`), the
//! runtime's own functions (`builtins`), DDP's buckets (`ddp`), the files a workload names
//! (`files`) and the remedies' re-runs (`remedies`).

mod names;
mod value;

use std::path::{Path, PathBuf};

use crate::alloc::{AllocConf, OutOfMemory, DEFAULT_CONTEXT_OVERHEAD};
use crate::backend::AnyDevice;
use crate::engine::op::{Binary, Unary};
use crate::engine::{DType, EngineError, TensorId, Tensors};
use crate::error::Error;
use crate::trace::StackId;
use crate::units::GIB;
use crate::workload::ast::{
    BinOp, BlockKind, Expr, ExprKind, Ident, Span, Stmt, StmtKind, Workload,
};

pub use crate::analysis::record::{
    IterationStats, Mark, NamedValues, PeakBreakdown, RunOom, RunOutcome,
};
pub use builtins::script_reference;
use builtins::Args;
pub use runtime::{RUNTIME_FUNCTIONS, RUNTIME_METHODS};
pub use value::Value;

/// The device capacity when neither the workload nor the command line gives one: an 80 GiB card.
pub const DEFAULT_CAPACITY: u64 = 80 * GIB;

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Overrides the workload's capacity.
    pub capacity: Option<u64>,
    /// Overrides the workload's iteration count.
    pub iterations: Option<u32>,
    /// Overrides the workload's device (`--device` of fit, check and bench; `run` gives it in
    /// its [`Target`], which wins). Out-of-memory remedies run on it too, else simulated.
    pub device: Option<String>,
    /// Stop simulating at this moment (checked every 1,024 statements): the outcome is then
    /// [`RunOutcome::cut_short`], its figures up to there.
    pub deadline: Option<std::time::Instant>,
    /// Fast-forward a generation's last steps where the script says they keep one shape
    /// (`token_done(until=N)`) and the device computes nothing: replayed on the allocator
    /// alone ([`crate::alloc::fastforward`]), so its blocks, segments, peaks and
    /// out-of-memory are exact but the skipped calls are missing from the event trace and
    /// the allocation counts ([`RunOutcome::fast_forwarded`]). For `fit --param
    /// new_tokens`, which reads only the tokens, the peaks and where memory ran out.
    pub fast_forward: bool,
}

/// Where a run goes and what it keeps beyond memory.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// Overrides the workload's device (`sim`, `cpu`); `None`: the workload's (a workload that
    /// asks for a device this build lacks runs simulated).
    pub device: Option<String>,
    /// Keep each named parameter's gradient (its `from="..."` name) as it is just before the
    /// first optimizer step, on a data device ([`RunOutcome::grads`]).
    pub capture_grads: bool,
}

impl Target {
    /// The simulated device, whatever the workload asks for (remedies, `fit`).
    pub fn sim() -> Target {
        Target {
            device: Some("sim".into()),
            capture_grads: false,
        }
    }
}

/// Why a statement failed: a mistake in the script (exit 2) or the device running out (a finding).
enum Stop {
    Script(Span, String),
    Oom(Span, Box<OutOfMemory>),
    /// Ctrl-C or SIGTERM (checked before each statement).
    Interrupted,
    /// [`RunOptions::deadline`] passed.
    Deadline,
}

type Flow<T> = Result<T, Stop>;

struct Runner {
    dev: Tensors<AnyDevice>,
    /// `[model] weights`, on a data device.
    weights: Option<files::TensorFile>,
    /// `[data] file`, on a data device.
    data: Option<files::TensorFile>,
    /// With `capture_grads`: the named parameters (handles held), and what was captured.
    named: Option<Vec<(String, TensorId)>>,
    grads: Option<Vec<NamedValues>>,
    /// Variables by slot ([`names`]): `None` where the name is unbound.
    vars: Vec<Option<Value>>,
    /// Each variable name's slot.
    slots: rustc_hash::FxHashMap<String, u32>,
    kept: Vec<TensorId>,
    marks: Vec<Mark>,
    iteration: Option<u32>,
    current: IterationStats,
    /// The highest allocated and reserved memory seen (the allocator's peaks are reset at
    /// each iteration start).
    run_peak: u64,
    run_peak_reserved: u64,
    optimizers: Vec<crate::engine::optim::Optimizer>,
    /// `ddp_init`'s DistributedDataParallel: its buckets and what rebuilds them.
    ddp: Option<ddp::Ddp>,
    /// The tag stack of the current iteration (or of setup), under which phases go.
    iter_stack: StackId,
    /// The runtime function being called (the optimizer constructors share one).
    calling: &'static str,
    /// Each scope name's tag by its slot ([`names`]), with the stack it last entered from
    /// and the stack that made: a module's ops run under the same parent stack every time
    /// (a layer in each decode step), so entering is a comparison, not two hash lookups.
    scope_tags: Vec<Option<(crate::trace::TagId, StackId, StackId)>>,
    /// Statements run so far, against `max_statements`.
    statements: u64,
    /// [`statement_bound`] of the workload.
    max_statements: u64,
    /// The current iteration's generation at its last finished token (`token_done()`),
    /// `None` where the script counts none: an out-of-memory then says which token it was
    /// generating ([`crate::analysis::record::Generated`]).
    generated: Option<crate::analysis::record::Generated>,
    /// [`RunOptions::deadline`].
    deadline: Option<std::time::Instant>,
    /// [`RunOptions::fast_forward`], and the logs of the last decode steps while it is on.
    fast_forward: bool,
    steps_seen: std::collections::VecDeque<Vec<crate::alloc::caching::StepEvent>>,
    /// What fast-forwards drove on the allocator (the engine's own figures stop before it).
    drove: Option<crate::analysis::record::FastForwarded>,
    /// A fast-forward drove this iteration's generation to its end.
    drove_to_end: bool,
    /// Set by a fast-forward: the innermost `for` loop running ends after this pass.
    break_loop: bool,
}

/// The most statements a script runs (setup, every iteration and every loop pass together,
/// each pass of a loop counting as one more): each count is bounded alone, but loops nest and
/// multiply with iterations, and a hand-written script of a hundred million statements (about
/// 15 s of simulation) is a typo, not a workload.
pub const MAX_STATEMENTS: u64 = 100_000_000;

/// The statement bound of a run of `w`: [`MAX_STATEMENTS`] for a script; none for a model
/// gpumem writes the script of (a `[model]` preset, a Hugging Face config, a torchvision
/// model), whose counts are bounded by name instead ([`crate::workload::limits`]) and whose
/// length is the work asked for. A Llama-3-8B-sized model generating at batch 8 runs about
/// 3.9 million statements per 1,024 tokens, so a bound of statements would refuse 32k tokens
/// that fit in memory, and `fit` on `new_tokens` would stop at it.
pub fn statement_bound(w: &Workload) -> u64 {
    if w.preset.is_some() {
        u64::MAX
    } else {
        MAX_STATEMENTS
    }
}

/// The most tensors and autograd nodes alive at once (about 1 GB of the host's memory; a
/// Llama-3-8B training step keeps under 10,000).
pub const MAX_LIVE_OBJECTS: usize = 2_000_000;

fn script<T>(span: Span, msg: impl Into<String>) -> Flow<T> {
    Err(Stop::Script(span, msg.into()))
}

fn engine_err(span: Span, e: EngineError) -> Stop {
    match e {
        EngineError::OutOfMemory(o) => Stop::Oom(span, o),
        other => Stop::Script(span, other.to_string()),
    }
}

/// Runs `workload` (from `path`, which only names it in errors).
pub fn run(workload: &Workload, path: &Path, opts: &RunOptions) -> Result<RunOutcome, Error> {
    run_with_progress(workload, path, opts, &mut |_, _| {})
}

/// [`run`], calling `progress(done, total)` after each iteration.
pub fn run_with_progress(
    workload: &Workload,
    path: &Path,
    opts: &RunOptions,
    progress: &mut dyn FnMut(u32, u32),
) -> Result<RunOutcome, Error> {
    run_on(workload, path, opts, &Target::default(), progress)
}

/// [`run_with_progress`] on the device `target` names.
pub fn run_on(
    workload: &Workload,
    path: &Path,
    opts: &RunOptions,
    target: &Target,
    progress: &mut dyn FnMut(u32, u32),
) -> Result<RunOutcome, Error> {
    let capacity = opts
        .capacity
        .or(workload.capacity)
        .unwrap_or(DEFAULT_CAPACITY);
    let conf: AllocConf = workload.alloc_conf.clone();
    tracing::debug!(
        workload = %workload.name,
        path = %path.display(),
        capacity,
        alloc_conf = %conf.raw,
        alloc_conf_from = %workload.alloc_conf_from,
        iterations = opts.iterations.unwrap_or(workload.iterations),
        "running"
    );
    // `capacity` is the card's total memory; the CUDA context takes its share of it, and on a
    // simulated device a process group's NCCL buffers too (memory the allocator cannot get,
    // on a real card as here: a run that needs it runs out as on the card)
    let device_name = target
        .device
        .as_deref()
        .or(opts.device.as_deref())
        .unwrap_or(workload.device.as_str());
    let nccl = if workload
        .preset
        .as_ref()
        .is_some_and(|p| p.distributed.is_some())
        && !device_name.starts_with("cuda")
    {
        NCCL_WORLD_SIZE_1
    } else {
        0
    };
    let overhead = DEFAULT_CONTEXT_OVERHEAD.min(capacity / 8) + nccl;
    let given = opts.capacity.or(workload.capacity);
    let device = match target.device.as_deref().or(opts.device.as_deref()) {
        Some(d) => crate::backend::open(d, capacity, overhead, given)
            .map_err(|m| Error::usage("--device", m))?,
        None => crate::backend::open(workload.device.as_str(), capacity, overhead, given)
            .map_err(|m| Error::input(path.to_path_buf(), "device", m))?,
    };
    let alloc = crate::alloc::CachingAllocator::new(conf, device);
    let dev = Tensors::new(alloc);
    // FSDP2 (its shards on the host or the meta device, storages resized to nothing) is
    // modelled for memory only
    let fsdp = workload
        .preset
        .as_ref()
        .and_then(|p| p.distributed.as_ref())
        .is_some_and(|d| d.strategy == "fsdp2");
    // what the simulated device alone models, refused on a computing one: on the flag or key
    // that chose the device
    let sim_only = |e: String| match target.device.as_deref().or(opts.device.as_deref()) {
        Some(_) => Error::usage("--device", e),
        None => Error::input(path.to_path_buf(), "device", e),
    };
    if fsdp && dev.computes() {
        return Err(sim_only(
            "FSDP2 is modelled on the simulated device only, for now: run it with --device sim (or --device cuda-memory for the GPU driver's segments)"
                .into(),
        ));
    }
    // the block-wise 8-bit and low-bit optimizers have no kernel: refused before the script
    // runs, naming what the user wrote rather than a line of the generated script
    if let Some(kind) = workload
        .preset
        .as_ref()
        .and_then(|p| crate::engine::op::OptimKind::parse(p.optimizer))
        .filter(|k| k.simulated_only() && dev.computes())
    {
        return Err(sim_only(format!(
            "optimizer \"{}\" is modelled on the simulated device only (its memory; there is no kernel for its update): run it with --device sim (or cuda-memory), or pick adamw to compute",
            kind.name()
        )));
    }
    // weights and batches matter only where values are computed
    let open = |p: &Option<PathBuf>, key: &str| -> Result<Option<files::TensorFile>, Error> {
        match p {
            Some(p) if dev.computes() => files::TensorFile::open(p)
                .map(Some)
                .map_err(|m| Error::input(path.to_path_buf(), key, m)),
            _ => Ok(None),
        }
    };
    let weights = open(&workload.weights, "[model] weights")?;
    let data = open(&workload.data, "[data] file")?;
    let capture = target.capture_grads && dev.computes();
    let names = names::resolve(workload);
    let mut r = Runner {
        dev,
        weights,
        data,
        named: capture.then(Vec::new),
        grads: None,
        vars: Vec::new(),
        slots: names.vars,
        kept: Vec::new(),
        marks: Vec::new(),
        iteration: None,
        current: IterationStats::default(),
        run_peak: 0,
        run_peak_reserved: 0,
        optimizers: Vec::new(),
        ddp: None,
        iter_stack: StackId::ROOT,
        calling: "",
        scope_tags: vec![None; names.scopes],
        statements: 0,
        max_statements: statement_bound(workload),
        generated: None,
        deadline: opts.deadline,
        fast_forward: opts.fast_forward,
        steps_seen: Default::default(),
        drove: None,
        drove_to_end: false,
        break_loop: false,
    };
    let mut iterations = Vec::new();
    let mut iteration_ends = Vec::new();
    let mut oom = None;
    let mut cut_short = false;
    let iters = opts.iterations.unwrap_or(workload.iterations);
    let to_error =
        |path: &PathBuf, span: Span, msg: String| Error::input(path.clone(), span.location(), msg);
    let path = path.to_path_buf();
    r.vars.resize_with(r.slots.len(), || None);
    for (k, v) in &workload.params {
        let slot = r.slots[k.as_str()] as usize;
        if let Some(old) = r.vars[slot].replace(Value::Int(*v)) {
            r.drop_value(old);
        }
    }
    r.iter_stack = r.dev.alloc.recorder_mut().push_tag("setup");
    let setup = r.block(&workload.setup);
    r.dev.alloc.recorder_mut().pop_tag();
    r.note_peak();
    if setup.is_ok() {
        if let Some(w) = &r.weights {
            let unused = w.unused(&["head.weight", "lm_head.weight"]);
            if !unused.is_empty() {
                return Err(Error::input(
                    path.to_path_buf(),
                    "[model] weights",
                    format!(
                        "{}: tensors the model has no parameter for: {} (names must be \
                         model.state_dict()'s)",
                        w.path().display(),
                        unused.join(", ")
                    ),
                ));
            }
        }
    }
    match setup {
        Err(Stop::Script(span, msg)) => return Err(to_error(&path, span, msg)),
        Err(Stop::Interrupted) => return Err(Error::Interrupted),
        Err(Stop::Deadline) => cut_short = true,
        Err(Stop::Oom(span, e)) => {
            oom = Some(RunOom {
                error: *e,
                line: span.line,
                column: span.col,
                iteration: None,
                tokens: r.generated.map(|g| g.tokens),
            })
        }
        Ok(()) => {}
    }
    if oom.is_none() && !cut_short {
        for it in 0..iters {
            r.iteration = Some(it);
            r.generated = None;
            // a generation's step logs start anew
            r.steps_seen.clear();
            r.drove_to_end = false;
            r.dev.alloc.stop_step_log();
            r.dev.alloc.reset_peak_stats();
            r.current = IterationStats {
                iteration: it,
                start: r.allocated(),
                ..Default::default()
            };
            r.dev.alloc.recorder_mut().set_current(StackId::ROOT);
            r.iter_stack = r.dev.alloc.recorder_mut().push_tag(&format!("iter:{it}"));
            r.dev.alloc.recorder_mut().push_tag("phase:forward");
            let res = r.block(&workload.body);
            r.dev.alloc.recorder_mut().set_current(StackId::ROOT);
            r.note_peak();
            let s = r.dev.alloc.stats();
            r.current.end = s.allocated_bytes.all().current as u64;
            r.current.peak_allocated = s.allocated_bytes.all().peak as u64;
            r.current.peak_reserved = s.reserved_bytes.all().peak as u64;
            r.current.reserved_end = s.reserved_bytes.all().current as u64;
            tracing::debug!(
                workload = %workload.name,
                iteration = it,
                start = r.current.start,
                end = r.current.end,
                peak_allocated = r.current.peak_allocated,
                peak_reserved = r.current.peak_reserved,
                events = r.dev.alloc.recorder().ring.len(),
                "iteration done"
            );
            iterations.push(std::mem::take(&mut r.current));
            let recorded = r.dev.alloc.recorder().ring.len() as u64;
            if res.is_ok() && recorded > 0 {
                iteration_ends.push((it, recorded - 1));
            }
            if let (Ok(()), Some(g)) = (&res, &mut r.generated) {
                let now = r.dev.alloc.stats().allocation.all().allocated as u64;
                g.tail_allocations = Some(now.saturating_sub(g.allocations));
                if r.drove_to_end && now > g.allocations {
                    if let Some(d) = &mut r.drove {
                        d.allocated_after = true;
                    }
                }
            }
            progress(it + 1, iters);
            match res {
                Err(Stop::Script(span, msg)) => return Err(to_error(&path, span, msg)),
                Err(Stop::Interrupted) => return Err(Error::Interrupted),
                Err(Stop::Deadline) => {
                    cut_short = true;
                    break;
                }
                Err(Stop::Oom(span, e)) => {
                    oom = Some(RunOom {
                        error: *e,
                        line: span.line,
                        column: span.col,
                        iteration: Some(it),
                        tokens: r.generated.map(|g| g.tokens),
                    });
                    break;
                }
                Ok(()) => {}
            }
        }
    }
    if let Some(why) = crate::backend::Device::failure(r.dev.alloc.source()) {
        return Err(Error::usage("--device", why));
    }
    let mut peak = peak::peak_breakdown(&r.dev.alloc);
    // categories from the engine, which knows each storage's role at that moment (a temporary
    // saved for backward counts as an activation)
    let (peak_allocated, by_category) = r.dev.peak_by_category();
    peak.peak_allocated = peak_allocated;
    if r.drove.is_some() {
        // a fast-forward drove the allocator without the engine, whose peak is then short
        r.note_peak();
        peak.peak_allocated = peak.peak_allocated.max(r.run_peak);
    }
    peak.peak_reserved = r.run_peak_reserved;
    peak.by_category = by_category.into_iter().filter(|(_, b)| *b > 0).collect();
    peak.by_category
        .sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let measured = crate::backend::Device::name(r.dev.alloc.source()).starts_with("cuda");
    let mut outside = Vec::new();
    // a script that starts a strategy itself (no [distributed] section) did not have the
    // NCCL buffers taken from the device: they are added to the process's figure only
    let late = nccl == 0
        && (r.ddp.is_some() || r.dev.fsdp_groups() > 0 || r.dev.zero_world().is_some())
        && !measured;
    if nccl > 0 || late {
        outside.push(crate::analysis::record::Outside {
            what: "NCCL (communicator and buffers, as measured at world size 1)",
            bytes: NCCL_WORLD_SIZE_1,
            source: NCCL_SOURCE,
        });
    }
    let driver = crate::alloc::SegmentSource::process_used(r.dev.alloc.source()).map(|used| {
        let reserved = r.dev.alloc.stats().reserved_bytes.all().current as u64;
        crate::analysis::record::DriverView {
            // (the simulated device's own figure holds the buffers taken from it)
            process_used: used + if late { NCCL_WORLD_SIZE_1 } else { 0 },
            reserved,
            measured,
        }
    });
    Ok(RunOutcome {
        driver,
        outside,
        ranks: match (&r.ddp, r.dev.fsdp_world_size(), r.dev.zero_world()) {
            (Some(d), _, _) => Some(("ddp", d.world_size)),
            (None, Some(w), _) => Some(("fsdp2", w)),
            (None, None, Some((1, w))) => Some(("zero1", w)),
            (None, None, Some((2, w))) => Some(("zero2", w)),
            (None, None, Some((_, w))) => Some(("zero3", w)),
            (None, None, None) => None,
        },
        host_memory_peak: r.dev.host_memory().1,
        unified_memory_peak: r.dev.unified_memory().1,
        name: workload.name.clone(),
        script_lines: workload.preset.is_none(),
        capacity,
        alloc_conf: (
            workload.alloc_conf.raw.clone(),
            workload.alloc_conf_from.clone(),
        ),
        iterations,
        iteration_ends,
        marks: r.marks,
        generated: r.generated,
        cut_short,
        fast_forwarded: r.drove,
        oom,
        peak,
        stats: r.dev.alloc.stats().clone(),
        grads: r.grads.take().unwrap_or_default(),
        device: crate::backend::Device::name(r.dev.alloc.source()),
        launches: r.dev.alloc.source().launches(),
        allocator: r.dev.alloc.map_source(AnyDevice::into_addresses),
    })
}

impl Runner {
    fn allocated(&self) -> u64 {
        self.dev.alloc.stats().allocated_bytes.all().current as u64
    }

    fn note_peak(&mut self) {
        let s = self.dev.alloc.stats();
        self.run_peak = self.run_peak.max(s.allocated_bytes.all().peak as u64);
        self.run_peak_reserved = self
            .run_peak_reserved
            .max(s.reserved_bytes.all().peak as u64);
    }

    fn block(&mut self, stmts: &[Stmt]) -> Flow<()> {
        for s in stmts {
            self.stmt(s)?;
        }
        Ok(())
    }

    /// Before each statement and each pass of a loop: a stop asked for (Ctrl-C), and the
    /// run's bound on statements ([`statement_bound`]; a loop pass counts as one).
    #[inline]
    fn tick(&mut self, span: Span) -> Flow<()> {
        if crate::interrupt::requested() {
            return Err(Stop::Interrupted);
        }
        self.statements += 1;
        if self.statements > self.max_statements {
            return script(
                span,
                format!(
                    "the run has executed {} statements, the most gpumem runs: lower \
                     `iterations`, a loop's range or `new_tokens` (loops within loops multiply)",
                    crate::units::group_digits(MAX_STATEMENTS)
                ),
            );
        }
        // the rest is checked now and then
        if !self.statements.is_multiple_of(1024) {
            return Ok(());
        }
        if self
            .deadline
            .is_some_and(|d| std::time::Instant::now() >= d)
        {
            return Err(Stop::Deadline);
        }
        // a graph or a set of tensors that grows without end (`x = x * 2` in a loop, with
        // grad) would take the host's memory before the device's
        if self.dev.live_objects() > MAX_LIVE_OBJECTS {
            return script(
                span,
                format!(
                    "the run holds {} tensors and autograd nodes at once, the most gpumem \
                     keeps: a graph that grows in a loop (free it with backward(), or run \
                     under no_grad) or fewer iterations",
                    crate::units::group_digits(self.dev.live_objects() as u64)
                ),
            );
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> Flow<()> {
        self.tick(s.span)?;
        tracing::trace!(
            line = s.span.line,
            allocated = self.dev.alloc.stats().allocated_bytes.all().current,
            "statement"
        );
        match &s.kind {
            StmtKind::Assign { targets, value } => {
                let v = self.eval(value)?;
                if targets.len() == 1 {
                    self.assign(&targets[0], v);
                } else {
                    let Value::List(items) = v else {
                        self.drop_value(v);
                        return script(
                            s.span,
                            format!("cannot unpack a non-list into {} names", targets.len()),
                        );
                    };
                    if items.len() != targets.len() {
                        let n = items.len();
                        self.drop_value(Value::List(items));
                        return script(
                            s.span,
                            format!("expected {} values to unpack, got {n}", targets.len()),
                        );
                    }
                    for (t, v) in targets.iter().zip(items) {
                        self.assign(t, v);
                    }
                }
            }
            StmtKind::SetItem { target, value } => {
                let view = match self.eval(target)? {
                    Value::Tensor(t) => t,
                    other => {
                        self.drop_value(other);
                        return script(target.span, "only a tensor's elements can be assigned");
                    }
                };
                let v = match self.eval(value) {
                    Ok(v) => v,
                    Err(e) => {
                        self.dev.release(view);
                        return Err(e);
                    }
                };
                let r = match &v {
                    Value::Tensor(src) => self.dev.inplace(
                        crate::engine::op::InPlace::Copy,
                        view,
                        Some(*src),
                    ),
                    other => match other.as_f64() {
                        Some(x) if !(self.dev.grad_enabled && self.dev.info(view).requires_grad) => {
                            self.dev
                                .inplace(crate::engine::op::InPlace::Fill(x), view, None)
                        }
                        Some(_) => Err(crate::engine::EngineError::Invalid(
                            "slice assignment of a tensor in the autograd graph is not modelled yet: run it under no_grad".into(),
                        )),
                        None => Err(crate::engine::EngineError::Invalid(
                            "the value of an element assignment must be a tensor or a number".into(),
                        )),
                    },
                };
                self.drop_value(v);
                self.dev.release(view);
                r.map_err(|e| engine_err(s.span, e))?;
            }
            StmtKind::Del(names) => {
                for n in names {
                    let slot = self.slot(n);
                    match self.vars[slot].take() {
                        Some(v) => self.drop_value(v),
                        None => return script(s.span, format!("name '{n}' is not defined")),
                    }
                }
            }
            StmtKind::Expr(e) => {
                let v = self.eval(e)?;
                self.drop_value(v);
            }
            StmtKind::Block { kind, body } => match kind {
                BlockKind::NoGrad => {
                    let was = self.dev.grad_enabled;
                    self.dev.grad_enabled = false;
                    let r = self.block(body);
                    self.dev.grad_enabled = was;
                    r?;
                }
                BlockKind::For { var, count } => {
                    let n = match self.eval(count)? {
                        Value::Int(n) if (0..=MAX_LOOP).contains(&n) => n,
                        Value::Int(n) => {
                            return script(
                                count.span,
                                format!("range({n}): the count must be 0 to {MAX_LOOP}"),
                            )
                        }
                        other => {
                            self.drop_value(other);
                            return script(count.span, "range(N) takes an integer count");
                        }
                    };
                    for i in 0..n {
                        self.tick(count.span)?;
                        self.assign(var, Value::Int(i));
                        self.block(body)?;
                        if std::mem::take(&mut self.break_loop) {
                            break;
                        }
                    }
                }
                BlockKind::Scope(name) => {
                    self.enter_scope(name);
                    let r = self.block(body);
                    self.dev.alloc.recorder_mut().pop_tag();
                    r?;
                }
                BlockKind::Phase(name) => {
                    let saved = self.enter_phase(&format!("phase:{name}"));
                    let r = self.block(body);
                    self.dev.alloc.recorder_mut().set_current(saved);
                    r?;
                    let now = self.allocated();
                    match name.as_str() {
                        "forward" => self.current.after_forward = Some(now),
                        "backward" => self.current.after_backward = Some(now),
                        "optimizer" | "step" => self.current.after_step = Some(now),
                        "generate" => self.current.after_generate = Some(now),
                        _ => {}
                    }
                }
                BlockKind::Autocast { dtype } => {
                    let d = match dtype.as_deref() {
                        // torch.autocast("cuda") defaults to float16
                        None => DType::F16,
                        Some(name) => match DType::parse(name) {
                            Some(d @ (DType::BF16 | DType::F16)) => d,
                            _ => {
                                return script(
                                    s.span,
                                    format!(
                                    "autocast dtype must be bf16 or f16 (float16), not '{name}'"
                                ),
                                )
                            }
                        },
                    };
                    let prev = self.dev.autocast_enter(d);
                    let r = self.block(body);
                    self.dev.autocast_exit(prev);
                    r?;
                }
                BlockKind::Checkpoint { hold } => {
                    let mut held = Vec::new();
                    for n in hold {
                        match &self.vars[self.slot(n)] {
                            Some(Value::Tensor(t)) => held.push(*t),
                            Some(_) => {
                                return script(
                                    s.span,
                                    format!("checkpoint({n}): '{n}' is not a tensor"),
                                )
                            }
                            None => {
                                return script(
                                    s.span,
                                    format!("checkpoint({n}): name '{n}' is not defined"),
                                )
                            }
                        }
                    }
                    let prev = self.dev.checkpoint_enter_holding(&held);
                    let r = self.block(body);
                    self.dev.checkpoint_exit(prev);
                    r?;
                }
            },
        }
        Ok(())
    }

    /// Replaces the current phase tag (forward, backward, optimizer) under the iteration's tag;
    /// returns the stack to restore.
    fn enter_phase(&mut self, phase: &str) -> StackId {
        let rec = self.dev.alloc.recorder_mut();
        let saved = rec.current();
        rec.set_current(self.iter_stack);
        rec.push_tag(phase);
        saved
    }

    /// Pushes the tag of a `scope` block.
    #[inline]
    fn enter_scope(&mut self, name: &Ident) {
        let rec = self.dev.alloc.recorder_mut();
        let parent = rec.current();
        let Some(memo) = name
            .resolved()
            .and_then(|s| self.scope_tags.get_mut(s as usize))
        else {
            // (every scope of the script has its slot; a name without one is interned)
            rec.push_tag(name);
            return;
        };
        match *memo {
            Some((_, from, to)) if from == parent => rec.set_current(to),
            Some((tag, ..)) => {
                let to = rec.push_tag_id(tag);
                *memo = Some((tag, parent, to));
            }
            None => {
                let tag = rec.tags.intern(name);
                let to = rec.push_tag_id(tag);
                *memo = Some((tag, parent, to));
            }
        }
    }

    /// The variable slot of a name ([`names::resolve`] gave every name of the script one).
    #[inline]
    fn slot(&self, name: &Ident) -> usize {
        match name.resolved() {
            Some(s) => s as usize,
            None => self.slots[name.as_str()] as usize,
        }
    }

    fn assign(&mut self, name: &Ident, v: Value) {
        let slot = self.slot(name);
        if let Some(old) = self.vars[slot].replace(v) {
            self.drop_value(old);
        }
    }

    fn drop_value(&mut self, v: Value) {
        match v {
            Value::Tensor(t) => self.dev.release(t),
            Value::List(items) => {
                for i in items {
                    self.drop_value(i);
                }
            }
            _ => {}
        }
    }

    /// A value that the caller will drop: for a name, another handle on its tensor.
    fn eval(&mut self, e: &Expr) -> Flow<Value> {
        match &e.kind {
            ExprKind::Name(n) => match &self.vars[self.slot(n)] {
                Some(v) => {
                    let v = v.clone();
                    Ok(self.share(v))
                }
                None => match DType::parse(n) {
                    Some(d) => Ok(Value::DType(d)),
                    // `float("inf")` and `float("nan")`, spelled as names (`-inf` for attention masks)
                    None if n == "inf" => Ok(Value::Float(f64::INFINITY)),
                    None if n == "nan" => Ok(Value::Float(f64::NAN)),
                    None => script(e.span, format!("name '{n}' is not defined")),
                },
            },
            ExprKind::Int(i) => Ok(Value::Int(*i)),
            ExprKind::Float(f) => Ok(Value::Float(*f)),
            ExprKind::Str(s) => Ok(Value::Str(s.clone())),
            ExprKind::Bool(b) => Ok(Value::Bool(*b)),
            ExprKind::None => Ok(Value::None),
            ExprKind::List(items) => {
                let mut out = Vec::new();
                for i in items {
                    match self.eval(i) {
                        Ok(v) => out.push(v),
                        Err(err) => {
                            self.drop_value(Value::List(out));
                            return Err(err);
                        }
                    }
                }
                Ok(Value::List(out))
            }
            ExprKind::Neg(x) => {
                let v = self.eval(x)?;
                match v {
                    Value::Int(i) => Ok(Value::Int(-i)),
                    Value::Float(f) => Ok(Value::Float(-f)),
                    Value::Tensor(t) => self.unary_op(e.span, Unary::Neg, t),
                    other => {
                        self.drop_value(other);
                        script(e.span, "cannot negate this value")
                    }
                }
            }
            ExprKind::Binary { op, lhs, rhs } => {
                // two variables' tensors are lent to the op (see `Runner::args`)
                if *op != BinOp::Pow {
                    if let (Some(x), Some(y)) = (self.lent(lhs), self.lent(rhs)) {
                        return self.binary_tensors(e.span, *op, x, y);
                    }
                }
                let a = self.eval(lhs)?;
                let b = match self.eval(rhs) {
                    Ok(b) => b,
                    Err(err) => {
                        self.drop_value(a);
                        return Err(err);
                    }
                };
                self.binary(e.span, *op, a, b)
            }
            ExprKind::Call { func, args, kwargs } => self.call(e.span, func, args, kwargs),
            ExprKind::Method {
                recv,
                name,
                args,
                kwargs,
            } => {
                // a variable's tensor is lent to an op's method, as its arguments are
                if let Some(t) = self.lent(recv).filter(|_| Self::reaches_entry(name, true)) {
                    return self.method(e.span, &Value::Tensor(t), name, args, kwargs);
                }
                let r = self.eval(recv)?;
                let res = self.method(e.span, &r, name, args, kwargs);
                self.drop_value(r);
                res
            }
            ExprKind::Attr { recv, name } => {
                // (they take their receiver by reference: a variable's tensor is lent)
                if let Some(t) = self.lent(recv) {
                    return self.attr(e.span, &Value::Tensor(t), name);
                }
                let r = self.eval(recv)?;
                let res = self.attr(e.span, &r, name);
                self.drop_value(r);
                res
            }
            ExprKind::Index { recv, items } => {
                if let Some(t) = self.lent(recv) {
                    return self.index(e.span, &Value::Tensor(t), items);
                }
                let r = self.eval(recv)?;
                let res = self.index(e.span, &r, items);
                self.drop_value(r);
                res
            }
        }
    }

    /// The tensor a variable holds when `e` is just that variable's name: for a callee that
    /// only reads it while the variable keeps it alive ([`Runner::args`]).
    #[inline]
    fn lent(&self, e: &Expr) -> Option<TensorId> {
        match &e.kind {
            ExprKind::Name(n) => match &self.vars[self.slot(n)] {
                Some(Value::Tensor(t)) => Some(*t),
                _ => None,
            },
            _ => None,
        }
    }

    fn share(&mut self, v: Value) -> Value {
        match v {
            Value::Tensor(t) => Value::Tensor(self.dev.retain(t)),
            Value::List(items) => Value::List(items.into_iter().map(|i| self.share(i)).collect()),
            other => other,
        }
    }

    /// Runs an op under its name as a tag.
    fn op<T>(
        &mut self,
        span: Span,
        tag: &'static str,
        f: impl FnOnce(&mut Tensors<AnyDevice>) -> Result<T, EngineError>,
    ) -> Flow<T> {
        self.dev.alloc.recorder_mut().push_static(tag);
        let r = f(&mut self.dev);
        self.dev.alloc.recorder_mut().pop_tag();
        r.map_err(|e| engine_err(span, e))
    }
}

/// What a process group with NCCL adds to the process's device memory at world size 1 on an
/// H200 (PyTorch 2.11, NCCL 2.28): 558 MiB, the same for DDP and for FSDP2 (560 MiB with CPU
/// offload).
const NCCL_WORLD_SIZE_1: u64 = 558 << 20;

/// Where [`NCCL_WORLD_SIZE_1`] comes from.
const NCCL_SOURCE: &str = "measured on an H200 (PyTorch 2.11): nvidia-smi's figure less reserved \
    at the end of ../shared/groundtruth/dist1's DDP and FSDP2 runs (1,308.8 and 1,324.8 MiB), \
    less the same for the same model without a process group (750.8 and 766.8 MiB)";

/// The most iterations a `for` loop runs (a decode loop of a million tokens is far beyond
/// any real one).
const MAX_LOOP: i64 = 1_000_000;

mod arith;
mod bind;
mod builtins;
mod ddp;
mod files;
mod fsdp;
mod peak;
pub mod remedies;
mod runtime;
pub mod search;

#[cfg(test)]
mod bound_tests;
