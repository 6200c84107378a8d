//! The functions, methods, attributes and indexing a workload script can use.

use super::{engine_err, script, Flow, Mark, Runner, Value};
use crate::engine::autocast::CastPolicy;
use crate::engine::layout::Layout;
use crate::engine::ops::Unary;
use crate::engine::optim::{OptimKind, Optimizer};
use crate::engine::{Category, DType, TensorId};
use crate::workload::ast::{Expr, IndexItem, Span};

/// Functions a script may call, for the error message when a name is unknown.
const FUNCTIONS: &[&str] = &[
    "linear",
    "layer_norm",
    "embedding",
    "dropout",
    "cross_entropy",
    "scaled_dot_product_attention",
    "sgd",
    "adam",
    "adamw",
    "randn",
    "rand",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "keep",
    "empty_cache",
    "reset_peak_memory_stats",
    "mark",
    "synchronize",
    "matmul",
    "sum",
    "mean",
    "softmax",
    "log_softmax",
];

/// Evaluated arguments: positional values and keyword values.
struct Args {
    pos: Vec<Value>,
    kw: Vec<(String, Value)>,
}

impl Args {
    fn kw(&self, name: &str) -> Option<&Value> {
        self.kw.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }
}

impl Runner {
    fn args(&mut self, args: &[Expr], kwargs: &[(String, Expr)]) -> Flow<Args> {
        let mut out = Args {
            pos: Vec::new(),
            kw: Vec::new(),
        };
        for a in args {
            match self.eval(a) {
                Ok(v) => out.pos.push(v),
                Err(e) => {
                    self.drop_args(out);
                    return Err(e);
                }
            }
        }
        for (k, a) in kwargs {
            match self.eval(a) {
                Ok(v) => out.kw.push((k.clone(), v)),
                Err(e) => {
                    self.drop_args(out);
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    fn drop_args(&mut self, a: Args) {
        for v in a.pos {
            self.drop_value(v);
        }
        for (_, v) in a.kw {
            self.drop_value(v);
        }
    }

    /// Sizes given as `f(2, 3)` or `f([2, 3])`.
    fn shape_of(span: Span, vals: &[Value]) -> Flow<Vec<i64>> {
        let flat: Vec<&Value> = match vals {
            [Value::List(items)] => items.iter().collect(),
            _ => vals.iter().collect(),
        };
        flat.iter()
            .map(|v| v.as_i64().ok_or(()))
            .collect::<Result<Vec<_>, _>>()
            .or_else(|_| script(span, "sizes must be integers, as f(2, 3) or f([2, 3])"))
    }

    fn dims(span: Span, vals: &[Value]) -> Flow<Vec<usize>> {
        Self::shape_of(span, vals)?
            .into_iter()
            .map(|d| {
                usize::try_from(d).or_else(|_| script(span, format!("negative dimension {d}")))
            })
            .collect()
    }

    fn dtype_kw(span: Span, a: &Args, default: DType) -> Flow<DType> {
        match a.kw("dtype") {
            None => Ok(default),
            Some(Value::DType(d)) => Ok(*d),
            Some(Value::Str(s)) => {
                DType::parse(s).map_or_else(|| script(span, format!("unknown dtype '{s}'")), Ok)
            }
            Some(v) => script(
                span,
                format!(
                    "dtype must be a dtype such as float32 or bf16, not {}",
                    v.kind()
                ),
            ),
        }
    }

    fn bool_kw(span: Span, a: &Args, name: &str) -> Flow<bool> {
        match a.kw(name) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => script(
                span,
                format!("{name} must be true or false, not {}", v.kind()),
            ),
        }
    }

    fn int_kw(span: Span, a: &Args, name: &str) -> Flow<Option<i64>> {
        match a.kw(name) {
            None | Some(Value::None) => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .map_or_else(|| script(span, format!("{name} must be an integer")), Ok),
        }
    }

    fn tensor_arg(span: Span, a: &Args, i: usize, what: &str) -> Flow<TensorId> {
        match a.pos.get(i) {
            Some(Value::Tensor(t)) => Ok(*t),
            Some(v) => script(span, format!("{what} expects a tensor, got {}", v.kind())),
            None => script(span, format!("{what} expects a tensor argument")),
        }
    }

    pub(super) fn call(
        &mut self,
        span: Span,
        func: &str,
        args: &[Expr],
        kwargs: &[(String, Expr)],
    ) -> Flow<Value> {
        let a = self.args(args, kwargs)?;
        let r = self.call_with(span, func, &a);
        self.drop_args(a);
        r
    }

    fn call_with(&mut self, span: Span, func: &str, a: &Args) -> Flow<Value> {
        match func {
            "randn" | "rand" | "zeros" | "ones" | "empty" | "full" => {
                let sizes = if func == "full" {
                    if a.pos.len() != 2 {
                        return script(span, "full expects (size, fill_value)");
                    }
                    Self::dims(span, &a.pos[..1])?
                } else {
                    Self::dims(span, &a.pos)?
                };
                let dtype = Self::dtype_kw(span, a, DType::F32)?;
                let rg = Self::bool_kw(span, a, "requires_grad")?;
                let cat = if rg {
                    Category::Parameter
                } else {
                    Category::Input
                };
                self.op(span, func, |d| d.factory(&sizes, dtype, rg, cat))
                    .map(Value::Tensor)
            }
            "arange" => {
                let nums: Vec<f64> = a.pos.iter().filter_map(|v| v.as_f64()).collect();
                if nums.is_empty() || nums.len() != a.pos.len() || nums.len() > 3 {
                    return script(
                        span,
                        "arange expects (end), (start, end) or (start, end, step)",
                    );
                }
                let (start, end, step) = match nums[..] {
                    [e] => (0.0, e, 1.0),
                    [s, e] => (s, e, 1.0),
                    [s, e, st] => (s, e, st),
                    _ => unreachable!(),
                };
                if step == 0.0 {
                    return script(span, "arange step must be nonzero");
                }
                let n = ((end - start) / step).ceil().max(0.0) as usize;
                let ints = a.pos.iter().all(|v| matches!(v, Value::Int(_)));
                let dtype = Self::dtype_kw(span, a, if ints { DType::I64 } else { DType::F32 })?;
                let rg = Self::bool_kw(span, a, "requires_grad")?;
                self.op(span, "arange", |d| {
                    d.factory(&[n], dtype, rg, Category::Input)
                })
                .map(Value::Tensor)
            }
            "linear" => {
                let (x, w) = (
                    Self::tensor_arg(span, a, 0, "linear")?,
                    Self::tensor_arg(span, a, 1, "linear")?,
                );
                let b = match a.pos.get(2) {
                    Some(Value::Tensor(t)) => Some(*t),
                    _ => None,
                };
                self.op(span, "linear", |d| {
                    let mut ins = vec![x, w];
                    ins.extend(b);
                    d.autocast_op(CastPolicy::Lower, &ins, |d, i| {
                        d.linear(i[0], i[1], i.get(2).copied())
                    })
                })
                .map(Value::Tensor)
            }
            "layer_norm" => {
                let x = Self::tensor_arg(span, a, 0, "layer_norm")?;
                let opt = |i: usize| match a.pos.get(i) {
                    Some(Value::Tensor(t)) => Some(*t),
                    _ => None,
                };
                let (w, b) = (opt(1), opt(2));
                self.op(span, "layer_norm", |d| {
                    let mut ins = vec![x];
                    ins.extend(w);
                    ins.extend(b);
                    let (nw, nb) = (w.is_some(), b.is_some());
                    d.autocast_op(CastPolicy::Float32, &ins, |d, i| {
                        let w = nw.then(|| i[1]);
                        let b = nb.then(|| i[if nw { 2 } else { 1 }]);
                        d.layer_norm(i[0], w, b)
                    })
                })
                .map(Value::Tensor)
            }
            "embedding" => {
                let (i, t) = (
                    Self::tensor_arg(span, a, 0, "embedding")?,
                    Self::tensor_arg(span, a, 1, "embedding")?,
                );
                self.op(span, "embedding", |d| d.embedding(i, t))
                    .map(Value::Tensor)
            }
            "dropout" => {
                let x = Self::tensor_arg(span, a, 0, "dropout")?;
                let p = a
                    .pos
                    .get(1)
                    .or(a.kw("p"))
                    .and_then(|v| v.as_f64())
                    .unwrap_or(0.5);
                if !(0.0..=1.0).contains(&p) {
                    return script(
                        span,
                        format!("dropout probability has to be between 0 and 1, but got {p}"),
                    );
                }
                let training = !matches!(a.kw("training"), Some(Value::Bool(false)));
                if !training {
                    return Ok(Value::Tensor(self.dev.retain(x)));
                }
                self.op(span, "dropout", |d| d.dropout(x, p))
                    .map(Value::Tensor)
            }
            "cross_entropy" => {
                let (x, t) = (
                    Self::tensor_arg(span, a, 0, "cross_entropy")?,
                    Self::tensor_arg(span, a, 1, "cross_entropy")?,
                );
                self.op(span, "cross_entropy", |d| {
                    d.autocast_op(CastPolicy::Float32, &[x, t], |d, i| {
                        d.cross_entropy(i[0], i[1])
                    })
                })
                .map(Value::Tensor)
            }
            "scaled_dot_product_attention" => {
                let q = Self::tensor_arg(span, a, 0, "scaled_dot_product_attention")?;
                let k = Self::tensor_arg(span, a, 1, "scaled_dot_product_attention")?;
                let v = Self::tensor_arg(span, a, 2, "scaled_dot_product_attention")?;
                self.op(span, "scaled_dot_product_attention", |d| {
                    d.autocast_op(CastPolicy::Lower, &[q, k, v], |d, i| {
                        d.sdpa(i[0], i[1], i[2])
                    })
                })
                .map(Value::Tensor)
            }
            "sgd" | "adam" | "adamw" => {
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
                }
                let momentum = a.kw("momentum").and_then(|v| v.as_f64()).unwrap_or(0.0);
                let kind = match func {
                    "sgd" if momentum != 0.0 => OptimKind::SgdMomentum,
                    "sgd" => OptimKind::Sgd,
                    "adam" => OptimKind::Adam,
                    _ => OptimKind::AdamW,
                };
                let foreach = match a.kw("foreach") {
                    None | Some(Value::None) => true,
                    Some(Value::Bool(b)) => *b,
                    Some(v) => {
                        return script(
                            span,
                            format!("foreach must be true or false, not {}", v.kind()),
                        )
                    }
                };
                let handles = params.iter().map(|&p| self.dev.retain(p)).collect();
                self.optimizers.push(Optimizer::new(kind, handles, foreach));
                Ok(Value::Optimizer(self.optimizers.len() - 1))
            }
            "keep" => {
                for v in &a.pos {
                    if let Value::Tensor(t) = v {
                        let h = self.dev.retain(*t);
                        self.kept.push(h);
                    }
                }
                Ok(Value::None)
            }
            "empty_cache" => {
                self.dev.alloc.empty_cache();
                Ok(Value::None)
            }
            "reset_peak_memory_stats" => {
                self.note_peak();
                self.dev.alloc.reset_peak_stats();
                Ok(Value::None)
            }
            "synchronize" => Ok(Value::None),
            "mark" => {
                let label = match a.pos.first() {
                    Some(Value::Str(s)) => s.clone(),
                    _ => {
                        return script(span, "mark expects a label string: mark(\"after forward\")")
                    }
                };
                let s = self.dev.alloc.stats();
                self.marks.push(Mark {
                    label,
                    iteration: self.iteration,
                    line: span.line,
                    allocated: s.allocated_bytes.all().current as u64,
                    reserved: s.reserved_bytes.all().current as u64,
                });
                Ok(Value::None)
            }
            "matmul" => {
                let (x, y) = (
                    Self::tensor_arg(span, a, 0, "matmul")?,
                    Self::tensor_arg(span, a, 1, "matmul")?,
                );
                self.op(span, "matmul", |d| {
                    d.autocast_op(CastPolicy::Lower, &[x, y], |d, i| d.matmul(i[0], i[1]))
                })
                .map(Value::Tensor)
            }
            "sum" | "mean" | "softmax" | "log_softmax" => {
                let x = Self::tensor_arg(span, a, 0, func)?;
                let rest = Args {
                    pos: a.pos[1..].to_vec(),
                    kw: a.kw.clone(),
                };
                self.tensor_method(span, x, func, &rest)
            }
            other => match Unary::parse(other) {
                Some(_) => {
                    let x = Self::tensor_arg(span, a, 0, other)?;
                    self.tensor_method(
                        span,
                        x,
                        other,
                        &Args {
                            pos: Vec::new(),
                            kw: Vec::new(),
                        },
                    )
                }
                None => script(
                    span,
                    format!(
                        "unknown function '{other}'; known: {}",
                        FUNCTIONS.join(", ")
                    ),
                ),
            },
        }
    }

    pub(super) fn method(
        &mut self,
        span: Span,
        recv: &Value,
        name: &str,
        args: &[Expr],
        kwargs: &[(String, Expr)],
    ) -> Flow<Value> {
        if let Value::Optimizer(i) = recv {
            let a = self.args(args, kwargs)?;
            let r = self.optimizer_method(span, *i, name, &a);
            self.drop_args(a);
            return r;
        }
        let Value::Tensor(t) = recv else {
            return script(span, format!("{} has no method '{name}'", recv.kind()));
        };
        let a = self.args(args, kwargs)?;
        let r = self.tensor_method(span, *t, name, &a);
        self.drop_args(a);
        r
    }

    fn optimizer_method(&mut self, span: Span, i: usize, name: &str, a: &Args) -> Flow<Value> {
        match name {
            "step" => {
                let mut opt = std::mem::replace(
                    &mut self.optimizers[i],
                    Optimizer::new(OptimKind::Sgd, Vec::new(), true),
                );
                let saved = self.enter_phase("phase:optimizer");
                self.dev.alloc.recorder_mut().push_tag("optimizer.step");
                let r = opt.step(&mut self.dev);
                self.dev.alloc.recorder_mut().set_current(saved);
                self.optimizers[i] = opt;
                r.map_err(|e| engine_err(span, e))?;
                if self.iteration.is_some() {
                    self.current.after_step = Some(self.allocated());
                }
                Ok(Value::None)
            }
            "zero_grad" => {
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
                self.optimizers[i].zero_grad(&mut self.dev, set_to_none);
                Ok(Value::None)
            }
            other => script(
                span,
                format!("optimizers have no method '{other}' (step, zero_grad)"),
            ),
        }
    }

    fn view(
        &mut self,
        span: Span,
        t: TensorId,
        op: &'static str,
        l: Result<Layout, crate::engine::LayoutError>,
    ) -> Flow<Value> {
        let l = l.map_err(|e| super::Stop::Script(span, e.0))?;
        Ok(Value::Tensor(self.dev.view_op(op, t, l)))
    }

    fn tensor_method(&mut self, span: Span, t: TensorId, name: &str, a: &Args) -> Flow<Value> {
        // a dimension already checked by the layout, as an index
        let wrap = |d: i64, nd: usize| crate::engine::layout::wrap_dim(d, nd).unwrap_or(0);
        let layout = self.dev.info(t).layout.clone();
        let ints = |v: &[Value]| Self::shape_of(span, v);
        match name {
            n if Unary::parse(n).is_some() => {
                let op = Unary::parse(n).expect("checked");
                self.op(span, n, |d| d.unary(op, t)).map(Value::Tensor)
            }
            "sum" | "mean" => {
                let dim = match a.pos.first() {
                    Some(v) => Some(
                        v.as_i64()
                            .map_or_else(|| script(span, "dim must be an integer"), Ok)?,
                    ),
                    None => Self::int_kw(span, a, "dim")?,
                };
                let keep = Self::bool_kw(span, a, "keepdim")?;
                let op: &'static str = if name == "sum" { "sum" } else { "mean" };
                self.op(span, op, |d| d.reduce(op, t, dim, keep))
                    .map(Value::Tensor)
            }
            "softmax" | "log_softmax" => {
                let dim = match a.pos.first() {
                    Some(v) => v.as_i64(),
                    None => Self::int_kw(span, a, "dim")?,
                };
                let Some(dim) = dim else {
                    return script(span, format!("{name} needs dim"));
                };
                let op: &'static str = if name == "softmax" {
                    "softmax"
                } else {
                    "log_softmax"
                };
                self.op(span, op, |d| {
                    d.autocast_op(CastPolicy::Float32, &[t], |d, i| d.softmax(op, i[0], dim))
                })
                .map(Value::Tensor)
            }
            "view" => {
                let s = ints(&a.pos)?;
                self.view(span, t, "view", layout.view(&s))
            }
            "reshape" => {
                let s = ints(&a.pos)?;
                self.op(span, "reshape", |d| d.reshape_op(t, &s))
                    .map(Value::Tensor)
            }
            "t" => self.view(span, t, "t", layout.t()),
            "transpose" => {
                let s = ints(&a.pos)?;
                if s.len() != 2 {
                    return script(span, "transpose expects two dimensions");
                }
                let l = layout
                    .transpose(s[0], s[1])
                    .map_err(|e| super::Stop::Script(span, e.0))?;
                let nd = layout.ndim();
                let (d0, d1) = (wrap(s[0], nd), wrap(s[1], nd));
                let mut perm: Vec<usize> = (0..nd).collect();
                perm.swap(d0, d1);
                Ok(Value::Tensor(self.dev.permute_op("transpose", t, l, perm)))
            }
            "permute" => {
                let s = ints(&a.pos)?;
                let l = layout
                    .permute(&s)
                    .map_err(|e| super::Stop::Script(span, e.0))?;
                let nd = layout.ndim();
                let perm = s.iter().map(|&d| wrap(d, nd)).collect();
                Ok(Value::Tensor(self.dev.permute_op("permute", t, l, perm)))
            }
            "expand" => {
                let s = ints(&a.pos)?;
                self.view(span, t, "expand", layout.expand(&s))
            }
            "unsqueeze" => {
                let s = ints(&a.pos)?;
                let [d] = s[..] else {
                    return script(span, "unsqueeze expects one dimension");
                };
                self.view(span, t, "unsqueeze", layout.unsqueeze(d))
            }
            "contiguous" => self
                .op(span, "contiguous", |d| d.contiguous_op(t))
                .map(Value::Tensor),
            "clone" => self.op(span, "clone", |d| d.clone_op(t)).map(Value::Tensor),
            "detach" => Ok(Value::Tensor(self.dev.detach(t))),
            "split" | "chunk" => {
                let n = a.pos.first().and_then(|v| v.as_i64()).filter(|n| *n > 0);
                let Some(n) = n else {
                    return script(span, format!("{name} expects a positive size"));
                };
                let dim = match a.pos.get(1) {
                    Some(v) => v.as_i64().unwrap_or(0),
                    None => Self::int_kw(span, a, "dim")?.unwrap_or(0),
                };
                let parts = if name == "split" {
                    layout.split(n as usize, dim)
                } else {
                    layout.chunk(n as usize, dim)
                };
                let parts = parts.map_err(|e| super::Stop::Script(span, e.0))?;
                let op: &'static str = if name == "split" { "split" } else { "chunk" };
                Ok(Value::List(
                    self.dev
                        .split_op(op, t, parts)
                        .into_iter()
                        .map(Value::Tensor)
                        .collect(),
                ))
            }
            "backward" => {
                let retain = Self::bool_kw(span, a, "retain_graph")?;
                if self.current.after_forward.is_none() && self.iteration.is_some() {
                    self.current.after_forward = Some(self.allocated());
                }
                let saved = self.enter_phase("phase:backward");
                let r = self
                    .dev
                    .backward(t, retain)
                    .map_err(|e| engine_err(span, e));
                self.dev.alloc.recorder_mut().set_current(saved);
                r?;
                if self.iteration.is_some() {
                    self.current.after_backward = Some(self.allocated());
                }
                Ok(Value::None)
            }
            "item" => {
                if self.dev.info(t).layout.numel() != 1 {
                    return script(span, "a Tensor with more than one element cannot be converted to a Python scalar");
                }
                Ok(Value::Float(0.0))
            }
            "requires_grad_" => {
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
                self.dev.set_requires_grad(t, on);
                Ok(Value::Tensor(self.dev.retain(t)))
            }
            "float" | "half" | "bfloat16" | "double" | "to" => {
                let dtype = match name {
                    "float" => DType::F32,
                    "half" => DType::F16,
                    "bfloat16" => DType::BF16,
                    "double" => DType::F64,
                    _ => match a.pos.first() {
                        Some(Value::DType(d)) => *d,
                        _ => Self::dtype_kw(span, a, self.dev.dtype(t))?,
                    },
                };
                if dtype == self.dev.dtype(t) {
                    return Ok(Value::Tensor(self.dev.retain(t)));
                }
                let shape = layout.shape.clone();
                self.op(span, "to", |d| {
                    let out = d.empty(&shape, dtype, Category::Temporary)?;
                    d.launch("to", &[t], &[out])?;
                    d.record("to", &[t], &[out], &[]);
                    Ok(out)
                })
                .map(Value::Tensor)
            }
            "matmul" => {
                let y = Self::tensor_arg(span, a, 0, "matmul")?;
                self.op(span, "matmul", |d| {
                    d.autocast_op(CastPolicy::Lower, &[t, y], |d, i| d.matmul(i[0], i[1]))
                })
                .map(Value::Tensor)
            }
            "masked_fill" => {
                let m = Self::tensor_arg(span, a, 0, "masked_fill")?;
                self.op(span, "masked_fill", |d| d.masked_fill(t, m))
                    .map(Value::Tensor)
            }
            // in-place ops write into the tensor's own storage: nothing is allocated
            "add_" | "sub_" | "mul_" | "div_" | "relu_" | "zero_" | "fill_" | "sin_" | "exp_"
            | "neg_" => {
                if self.dev.grad_enabled && self.dev.is_leaf(t) && self.dev.info(t).requires_grad {
                    return script(span, "a leaf Variable that requires grad is being used in an in-place operation.");
                }
                self.dev.bump_version(t);
                Ok(Value::Tensor(self.dev.retain(t)))
            }
            other => script(
                span,
                format!("tensors have no method '{other}' in gpumem's engine yet"),
            ),
        }
    }

    pub(super) fn attr(&mut self, span: Span, recv: &Value, name: &str) -> Flow<Value> {
        let Value::Tensor(t) = recv else {
            return script(span, format!("{} has no attribute '{name}'", recv.kind()));
        };
        let t = *t;
        match name {
            "T" => {
                let l = self.dev.info(t).layout.t();
                self.view(span, t, "t", l)
            }
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
                    l.select(dim, i)
                }
                IndexItem::Slice { start, stop, step } => {
                    let (s, e, st) = (
                        int(self, start)?,
                        int(self, stop)?,
                        int(self, step)?.unwrap_or(1),
                    );
                    let r = l.slice(dim, s, e, st);
                    dim += 1;
                    r
                }
                IndexItem::NewAxis => {
                    let r = l.unsqueeze(dim);
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
        Ok(Value::Tensor(self.dev.view_op("index", t, l)))
    }
}
