//! Calls of the engine's tensor ops from a script: a call's arguments bound to the
//! parameters of its entry in [`crate::engine::op::script`], and what the entry makes run on
//! the engine under the op's tag (autocast applied by the op's own policy).

use super::{engine_err, script, Args, Flow, Runner, Value};
use crate::engine::layout::Layout;
use crate::engine::op::script::{Arg, Bound, Entry, Made, Param};
use crate::engine::op::{Binary, InPlace, Unary, ViewKind};
use crate::engine::{Category, DType, TensorId};
use crate::workload::ast::Span;

impl Runner {
    /// Binds `a` (and the receiver of a method) to `e`'s parameters, into `bound` (the
    /// caller's, fresh: it is not moved around).
    pub(super) fn bind(
        &mut self,
        bound: &mut Bound<TensorId>,
        span: Span,
        e: &Entry,
        recv: Option<TensorId>,
        a: &Args,
    ) -> Flow<()> {
        // the receiver of a method is its first positional argument
        let recv_value = recv.map(Value::Tensor);
        // positional arguments, the receiver first (no list made: this runs for every call)
        let npos = recv_value.is_some() as usize + a.pos.len();
        let pos_at = |i: usize| -> Option<&Value> {
            match (&recv_value, i) {
                (Some(r), 0) => Some(r),
                (Some(_), i) => a.pos.get(i - 1),
                (None, i) => a.pos.get(i),
            }
        };
        let mut next = 0usize;
        for (k, _) in &a.kw {
            if *k != "from" && *k != "device" && !e.params.iter().any(|p| p.name() == *k) {
                return script(
                    span,
                    format!(
                        "{} got an unexpected keyword argument '{k}' ({})",
                        e.name,
                        e.signature()
                    ),
                );
            }
        }
        let what = |p: &Param| format!("{}'s argument '{}' ({})", e.name, p.name(), e.signature());
        for p in e.params {
            let given = match p {
                Param::Sizes(_) | Param::Numbers(_) => None,
                _ => a.kw(p.name()).or_else(|| {
                    let v = pos_at(next);
                    if v.is_some() {
                        next += 1;
                    }
                    v
                }),
            };
            let arg = match (p, given) {
                (
                    Param::Tensor(_) | Param::OptTensor(_) | Param::Operand(_),
                    Some(Value::Tensor(t)),
                ) => Arg::Tensor(*t),
                (Param::Operand(_), Some(v)) if v.as_f64().is_some() => {
                    Arg::Float(v.as_f64().expect("checked"))
                }
                (Param::Operand(_), None | Some(Value::None)) => Arg::None,
                (Param::Operand(_), Some(v)) => {
                    return script(
                        span,
                        format!("{} expects a tensor or a number, got {}", what(p), v.kind()),
                    )
                }
                (Param::OptTensor(_), None | Some(Value::None)) => Arg::None,
                (Param::Tensor(_) | Param::OptTensor(_), Some(v)) => {
                    return script(
                        span,
                        format!("{} expects a tensor, got {}", what(p), v.kind()),
                    )
                }
                (Param::Tensor(_), None) => {
                    return script(
                        span,
                        format!("{} expects a tensor argument: {}", e.name, e.signature()),
                    )
                }
                (Param::Int(_, _) | Param::OptInt(_), Some(v)) if v.as_i64().is_some() => {
                    Arg::Int(v.as_i64().expect("checked"))
                }
                (Param::OptInt(_) | Param::Dims(_), None | Some(Value::None)) => Arg::None,
                (Param::Dims(_), Some(v)) if v.as_i64().is_some() => {
                    Arg::Int(v.as_i64().expect("checked"))
                }
                // a list of dims goes into the bound list
                (Param::Dims(n), Some(v)) => {
                    let dims: Option<Vec<i64>> = match v {
                        Value::List(items) if !items.is_empty() => items
                            .iter()
                            .map(|it| it.as_i64().filter(|_| !matches!(it, Value::Bool(_))))
                            .collect(),
                        _ => None,
                    };
                    let Some(dims) = dims else {
                        return script(
                            span,
                            format!(
                                "{n} must be an integer or a non-empty list of integers ({})",
                                e.signature()
                            ),
                        );
                    };
                    bound.list.extend(dims.iter().map(|&d| d as f64));
                    Arg::None
                }
                (Param::Int(_, Some(d)), None) => Arg::Int(*d),
                (Param::Int(n, _) | Param::OptInt(n), Some(_)) => {
                    return script(span, format!("{n} must be an integer ({})", e.signature()))
                }
                (Param::Int(n, None), None) => {
                    return script(span, format!("{} needs {n}: {}", e.name, e.signature()))
                }
                (Param::Float(_, _), Some(v))
                    if v.as_f64().is_some() && !matches!(v, Value::Bool(_)) =>
                {
                    Arg::Float(v.as_f64().expect("checked"))
                }
                (Param::Float(_, Some(d)), None) => Arg::Float(*d),
                (Param::Float(n, _), Some(v)) => {
                    return script(
                        span,
                        format!("{n} must be a number, not {} ({})", v.kind(), e.signature()),
                    )
                }
                (Param::Float(n, None), None) => {
                    return script(span, format!("{} needs {n}: {}", e.name, e.signature()))
                }
                (Param::Tensors(_), Some(Value::List(items))) => {
                    for v in items {
                        match v {
                            Value::Tensor(t) => bound.tensors.push(*t),
                            other => {
                                return script(
                                    span,
                                    format!(
                                        "{} expects a list of tensors, found {} in it",
                                        what(p),
                                        other.kind()
                                    ),
                                )
                            }
                        }
                    }
                    Arg::None
                }
                (Param::Tensors(_), Some(v)) => {
                    return script(
                        span,
                        format!("{} expects a list of tensors, got {}", what(p), v.kind()),
                    )
                }
                (Param::Tensors(_), None) => {
                    return script(
                        span,
                        format!("{} needs a list of tensors: {}", e.name, e.signature()),
                    )
                }
                (Param::Bool(_, _), Some(Value::Bool(b))) => Arg::Bool(*b),
                (Param::Bool(_, d), None) => Arg::Bool(*d),
                (Param::Bool(n, _), Some(v)) => {
                    return script(span, format!("{n} must be true or false, not {}", v.kind()))
                }
                (Param::DType(_), Some(Value::DType(d))) => Arg::DType(*d),
                (Param::DType(_), Some(Value::Str(s))) => match DType::parse(s) {
                    Some(d) => Arg::DType(d),
                    None => return script(span, format!("unknown dtype '{s}'")),
                },
                (Param::DType(_), None | Some(Value::None)) => Arg::None,
                (Param::DType(_), Some(v)) => {
                    return script(
                        span,
                        format!(
                            "dtype must be a dtype such as float32 or bf16, not {}",
                            v.kind()
                        ),
                    )
                }
                (Param::Sizes(_) | Param::Numbers(_), _) => {
                    let rest: Vec<&Value> = (next.min(npos)..npos).filter_map(pos_at).collect();
                    bound.list_given = !rest.is_empty();
                    let flat: Vec<&Value> = match rest[..] {
                        [Value::List(items)] if matches!(p, Param::Sizes(_)) => {
                            items.iter().collect()
                        }
                        _ => rest,
                    };
                    next = npos;
                    for v in flat {
                        match v {
                            Value::Int(i) => bound.list.push(*i as f64),
                            Value::Float(f) => {
                                bound.list.push(*f);
                                bound.list_ints = false;
                            }
                            _ => {
                                return script(
                                    span,
                                    format!(
                                        "{} expects numbers, not {} ({})",
                                        e.name,
                                        v.kind(),
                                        e.signature()
                                    ),
                                )
                            }
                        }
                    }
                    if matches!(p, Param::Numbers(_))
                        && (bound.list.is_empty() || bound.list.len() > 3)
                    {
                        return script(
                            span,
                            "arange expects (end), (start, end) or (start, end, step)",
                        );
                    }
                    Arg::None
                }
            };
            bound.args.push(arg);
        }
        if next < npos {
            return script(
                span,
                format!(
                    "{} takes at most {} arguments, got {}: {}",
                    e.name,
                    e.params.len() - recv.is_some() as usize,
                    npos - recv.is_some() as usize,
                    e.signature()
                ),
            );
        }
        Ok(())
    }

    /// Runs a call of entry `e`.
    pub(super) fn call_entry(
        &mut self,
        span: Span,
        e: &'static Entry,
        recv: Option<TensorId>,
        a: &Args,
    ) -> Flow<Value> {
        let mut b = Bound::default();
        self.bind(&mut b, span, e, recv, a)?;
        let made = (e.make)(e.name, &b).or_else(|m| script(span, m))?;
        if a.kw("device").is_some() && !matches!(made, Made::Factory { .. }) {
            return script(
                span,
                format!(
                    "{} got an unexpected keyword argument 'device' (only factories take one; {})",
                    e.name,
                    e.signature()
                ),
            );
        }
        match made {
            Made::Op { op, inputs } => self
                .op(span, e.name, |d| match op.autocast() {
                    Some(p) => {
                        d.autocast_op_in(p, &inputs, op.autocast_order(), |d, i| d.apply(&op, i))
                    }
                    None => d.apply(&op, &inputs),
                })
                .map(Value::Tensor),
            Made::Factory {
                fill,
                shape,
                dtype,
                requires_grad,
            } => {
                // a tensor loaded from a state_dict name is a parameter, trained or frozen
                // (a LoRA's base weights); `data:` names and the rest are inputs
                let from_state =
                    matches!(a.kw("from"), Some(Value::Str(n)) if !n.starts_with("data:"));
                let frozen = from_state && !requires_grad;
                // (an arange is data, whatever its requires_grad)
                let arange = matches!(fill, crate::engine::op::Fill::Arange { .. });
                let cat = if (requires_grad && !arange) || from_state {
                    Category::Parameter
                } else {
                    Category::Input
                };
                // `device="cpu"`: pinned host memory, no device allocation (FSDP2's offloaded
                // model is built there); `device="meta"`: no memory at all
                let host = match a.kw("device") {
                    None => None,
                    Some(Value::Str(d)) if d == "cuda" => None,
                    Some(Value::Str(d)) if d == "cpu" || d == "meta" => {
                        if self.dev.computes() {
                            return script(
                                span,
                                format!(
                                    "device=\"{d}\" tensors are modelled on the simulated device \
                                     only, for now: run with --device sim"
                                ),
                            );
                        }
                        Some(d.as_str())
                    }
                    Some(other) => {
                        return script(
                            span,
                            format!(
                                "{}'s device must be \"cuda\" (the default), \"cpu\" or \"meta\", not {}",
                                e.name,
                                match other {
                                    Value::Str(s) => format!("\"{s}\""),
                                    v => v.kind().to_string(),
                                }
                            ),
                        )
                    }
                };
                if frozen {
                    self.dev.alloc.recorder_mut().push_static("frozen");
                }
                let t = self.op(span, e.name, |d| {
                    let t = match host {
                        Some("cpu") => d.host_empty(&shape, dtype, cat)?,
                        Some(_) => d.meta_empty(&shape, dtype, cat)?,
                        None => return d.factory_fill(&shape, dtype, requires_grad, cat, fill),
                    };
                    d.set_requires_grad(t, requires_grad);
                    Ok(t)
                });
                if frozen {
                    self.dev.alloc.recorder_mut().pop_tag();
                }
                let t = t?;
                if let Some(from) = a.kw("from") {
                    if let Err(stop) = self.load_named(span, t, from) {
                        self.dev.release(t);
                        return Err(stop);
                    }
                    if let (Some(named), Value::Str(n)) = (&mut self.named, from) {
                        if requires_grad && !n.starts_with("data:") {
                            named.push((n.clone(), self.dev.retain(t)));
                        }
                    }
                }
                Ok(Value::Tensor(t))
            }
            Made::View { kind, x, args } => self.view_call(span, kind, x, &args),
            Made::Split {
                chunk,
                x,
                size,
                dim,
            } => {
                if size < 0 {
                    return script(
                        span,
                        if chunk {
                            format!("chunk expects `chunks` to be greater than 0, got: {size}")
                        } else {
                            format!(
                                "split expects split_size be non-negative, but got split_size={size}"
                            )
                        },
                    );
                }
                let layout = self.dev.info(x).layout.clone();
                let parts = if chunk {
                    layout.chunk(size as usize, dim)
                } else {
                    layout.split(size as usize, dim)
                };
                let parts = parts.map_err(|e| super::Stop::Script(span, e.0))?;
                let d = crate::engine::layout::wrap_dim(dim, layout.ndim()).unwrap_or(0);
                Ok(Value::List(
                    self.dev
                        .split_op(chunk, d, x, parts)
                        .into_iter()
                        .map(Value::Tensor)
                        .collect(),
                ))
            }
            Made::Contiguous(x) => self
                .op(span, "contiguous", |d| d.contiguous_op(x))
                .map(Value::Tensor),
            Made::CrossEntropy { logits, target } => {
                let ins = [logits, target];
                // (autocast applies inside: to nll_loss, not to log_softmax)
                self.op(span, e.name, |d| d.cross_entropy(ins[0], ins[1]))
                    .map(Value::Tensor)
            }
            Made::To { x, dtype } => {
                let dtype = dtype.unwrap_or(self.dev.dtype(x));
                if dtype == self.dev.dtype(x) {
                    return Ok(Value::Tensor(self.dev.retain(x)));
                }
                self.op(span, "to", |d| d.cast_op(x, dtype))
                    .map(Value::Tensor)
            }
            Made::InPlace { name, x, operand } => {
                let binary = |n: &str| match n {
                    "add_" => Binary::Add,
                    "sub_" => Binary::Sub,
                    "mul_" => Binary::Mul,
                    _ => Binary::Div,
                };
                let (op, other) = match (name, operand) {
                    ("copy_", Some(Arg::Tensor(o))) => (InPlace::Copy, Some(o)),
                    ("copy_", Some(Arg::Float(v))) => (InPlace::Fill(v), None),
                    ("zero_", _) => (InPlace::Fill(0.0), None),
                    ("fill_", Some(Arg::Float(v))) => (InPlace::Fill(v), None),
                    ("relu_" | "sin_" | "exp_" | "neg_", _) => {
                        let u = Unary::parse(name.trim_end_matches('_')).expect("a unary op");
                        (InPlace::Unary(u), None)
                    }
                    (n, Some(Arg::Tensor(o))) => (InPlace::Tensor(binary(n)), Some(o)),
                    (n, Some(Arg::Float(v))) => (InPlace::Scalar(binary(n), v), None),
                    (n, _) => return script(span, format!("{n} expects a tensor or a number")),
                };
                self.dev
                    .inplace(op, x, other)
                    .map_err(|e| engine_err(span, e))?;
                Ok(Value::Tensor(self.dev.retain(x)))
            }
            Made::Same(x) => Ok(Value::Tensor(self.dev.retain(x))),
            Made::Multi { op, inputs } => {
                let all = self.op(span, e.name, |d| d.multi(&op, &inputs))?;
                Ok(Value::List(all.into_iter().map(Value::Tensor).collect()))
            }
            Made::IndexPut { x, indices, values } => {
                self.op(span, e.name, |d| d.index_put(x, indices, values))?;
                Ok(Value::Tensor(self.dev.retain(x)))
            }
            Made::MaskedFillInPlace { x, mask, value } => {
                self.dev
                    .inplace(InPlace::MaskedFill(value), x, Some(mask))
                    .map_err(|e| engine_err(span, e))?;
                Ok(Value::Tensor(self.dev.retain(x)))
            }
            Made::Stack { xs, dim } => {
                let nd = self.dev.info(xs[0]).layout.ndim() + 1;
                let d = crate::engine::layout::wrap_dim(dim, nd)
                    .map_err(|e| super::Stop::Script(span, e.0))? as i64;
                let mut views = Vec::with_capacity(xs.len());
                for &x in &xs {
                    match self.view_call(span, ViewKind::Unsqueeze, x, &[d]) {
                        Ok(Value::Tensor(v)) => views.push(v),
                        Ok(other) => {
                            self.drop_value(other);
                        }
                        Err(e) => {
                            for v in views {
                                self.dev.release(v);
                            }
                            return Err(e);
                        }
                    }
                }
                let op = crate::engine::op::Op::Cat { dim: d };
                let r = self.op(span, "stack", |dv| dv.apply(&op, &views));
                for v in views {
                    self.dev.release(v);
                }
                r.map(Value::Tensor)
            }
            Made::RepeatInterleave { x, repeats, dim } => {
                let shape = self.dev.info(x).layout.shape.clone();
                let d = crate::engine::layout::wrap_dim(dim, shape.len())
                    .map_err(|e| super::Stop::Script(span, e.0))?;
                let mut sizes: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
                sizes.insert(d + 1, repeats);
                let u = match self.view_call(span, ViewKind::Unsqueeze, x, &[d as i64 + 1])? {
                    Value::Tensor(u) => u,
                    other => {
                        self.drop_value(other);
                        return script(span, "repeat_interleave: not a tensor");
                    }
                };
                let e = self.view_call(span, ViewKind::Expand, u, &sizes);
                self.dev.release(u);
                let e = match e? {
                    Value::Tensor(e) => e,
                    other => {
                        self.drop_value(other);
                        return script(span, "repeat_interleave: not a tensor");
                    }
                };
                let mut flat: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
                flat[d] *= repeats;
                let r = self.op(span, "repeat_interleave", |dv| dv.reshape_op(e, &flat));
                self.dev.release(e);
                r.map(Value::Tensor)
            }
        }
    }

    /// `view`, `reshape`, `t`, `transpose`, `permute`, `expand`, `unsqueeze`.
    fn view_call(&mut self, span: Span, kind: ViewKind, t: TensorId, s: &[i64]) -> Flow<Value> {
        let layout = self.dev.info(t).layout.clone();
        // only an expand's backward scatters through its view, and only a data device runs it
        let none = Layout::contiguous(&[]);
        let err = |e: crate::engine::LayoutError| super::Stop::Script(span, e.0);
        let wrap = |d: i64, nd: usize| crate::engine::layout::wrap_dim(d, nd).unwrap_or(0);
        let nd = layout.ndim();
        let (l, rel) = match kind {
            ViewKind::Reshape => {
                return self
                    .op(span, "reshape", |d| d.reshape_op(t, s))
                    .map(Value::Tensor)
            }
            ViewKind::Transpose | ViewKind::Permute => {
                let (l, perm) = if kind == ViewKind::Transpose {
                    let l = layout.transpose(s[0], s[1]).map_err(err)?;
                    let mut perm: Vec<usize> = (0..nd).collect();
                    perm.swap(wrap(s[0], nd), wrap(s[1], nd));
                    (l, perm)
                } else {
                    let l = layout.permute(s).map_err(err)?;
                    (l, s.iter().map(|&d| wrap(d, nd)).collect())
                };
                return Ok(Value::Tensor(self.dev.permute_op(kind, t, l, perm)));
            }
            ViewKind::View => (layout.view(s).map_err(err)?, none),
            ViewKind::T => (layout.t().map_err(err)?, none),
            ViewKind::Expand => {
                let rel = if self.dev.computes() {
                    Layout::contiguous(&layout.shape).expand(s).map_err(err)?
                } else {
                    none
                };
                (layout.expand(s).map_err(err)?, rel)
            }
            ViewKind::Unsqueeze => (layout.unsqueeze(s[0]).map_err(err)?, none),
            ViewKind::Flatten => {
                let checked = |d: i64| crate::engine::layout::wrap_dim(d, nd.max(1)).map_err(err);
                let (a, b) = (checked(s[0])?, checked(s[1])?);
                if nd == 0 || a > b {
                    return script(
                        span,
                        "flatten() has invalid args: start_dim cannot come after end_dim",
                    );
                }
                let mut shape: Vec<i64> = layout.shape[..a].iter().map(|&d| d as i64).collect();
                shape.push(layout.shape[a..=b].iter().product::<usize>() as i64);
                shape.extend(layout.shape[b + 1..].iter().map(|&d| d as i64));
                return self
                    .op(span, "flatten", |d| d.reshape_op(t, &shape))
                    .map(Value::Tensor);
            }
            ViewKind::Squeeze => {
                if let Some(&k) = s.first() {
                    crate::engine::layout::wrap_dim(k, nd.max(1)).map_err(err)?;
                }
                let keep: Vec<usize> = (0..nd)
                    .filter(|&d| {
                        layout.shape[d] != 1 || s.first().is_some_and(|&k| wrap(k, nd) != d)
                    })
                    .collect();
                let l = Layout {
                    shape: keep.iter().map(|&d| layout.shape[d]).collect(),
                    strides: keep.iter().map(|&d| layout.strides[d]).collect(),
                    offset: layout.offset,
                };
                (l, none)
            }
            ViewKind::Index | ViewKind::Alias => {
                return script(span, format!("{} is not a method here", kind.name()))
            }
        };
        Ok(Value::Tensor(self.dev.view_op(kind, t, l, rel)))
    }

    /// Fills a new tensor from the workload's weights or batch file, by name: `from="wte.weight"`
    /// (weights) or `from="data:input_ids"` (this micro-batch of the batch file).
    fn load_named(&mut self, span: Span, t: TensorId, from: &Value) -> Flow<()> {
        let Value::Str(name) = from else {
            return script(
                span,
                "from must be a tensor name string, as from=\"wte.weight\"",
            );
        };
        let shape = self.dev.shape(t).to_vec();
        let values = match name.strip_prefix("data:") {
            Some(key) => self.data.as_mut().map(|d| d.batch(key, &shape)),
            None => {
                let dtype = self.dev.dtype(t);
                self.weights.as_mut().map(|w| w.tensor(name, &shape, dtype))
            }
        };
        match values {
            None => Ok(()),
            Some(Err(m)) => script(span, m),
            Some(Ok(vals)) => self.dev.write(t, &vals).map_err(|e| engine_err(span, e)),
        }
    }
}
