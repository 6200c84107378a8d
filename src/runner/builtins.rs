//! The functions, methods, attributes and indexing a workload script can use.
//!
//! Tensor ops come from the engine's table ([`crate::engine::op::script`]) and are bound in
//! `bind`; what is here are the runtime's own: [`RUNTIME_FUNCTIONS`] and [`RUNTIME_METHODS`]
//! (keeping tensors, marks, the allocator's calls, optimizers, backward, `.item()`), tensor
//! attributes, and indexing.

use super::runtime::{runtime, Runtime, RUNTIME_FUNCTIONS, RUNTIME_METHODS};
use super::{script, Flow, Runner, Value};
use crate::engine::layout::Layout;
use crate::engine::op::script as script_table;
use crate::engine::op::script::Entry;
use crate::engine::op::{Hyper, ViewKind};
use crate::engine::optim::{OptimKind, Optimizer};
use crate::engine::TensorId;
use crate::workload::ast::{Expr, Ident, IndexItem, Span};

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

    pub(super) fn bool_kw(span: Span, a: &Args, name: &str, default: bool) -> Flow<bool> {
        match a.kw(name) {
            None | Some(Value::None) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => script(
                span,
                format!("{name} must be true or false, not {}", v.kind()),
            ),
        }
    }

    pub(super) fn float_kw(span: Span, a: &Args, name: &str, default: f64) -> Flow<f64> {
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

    pub(super) fn make_optimizer(&mut self, span: Span, func: &str, a: &Args) -> Flow<Value> {
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
    pub(super) fn capture_grads(&mut self) -> Result<(), crate::engine::EngineError> {
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
