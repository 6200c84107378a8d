//! The script's side of FSDP2 (`fully_shard`, world size 1): `fsdp_init` shards the
//! parameter groups, `fsdp_sharded` names what the optimizer steps, and each group's forward is
//! opened by `fsdp_pre_forward` and closed by `fsdp_post_forward`. The engine
//! ([`crate::engine::fsdp`]) does the rest, in backward too.

use super::{script, Args, Flow, Runner, Value};
use crate::engine::fsdp::FsdpPolicy;
use crate::engine::{DType, TensorId};
use crate::workload::ast::Span;

fn tensor_list(span: Span, v: &Value, what: &str) -> Flow<Vec<TensorId>> {
    match v {
        Value::List(items) => items
            .iter()
            .map(|i| match i {
                Value::Tensor(t) => Ok(*t),
                other => script(
                    span,
                    format!("{what} must hold tensors, not {}", other.kind()),
                ),
            })
            .collect(),
        Value::Tensor(t) => Ok(vec![*t]),
        other => script(
            span,
            format!("{what} must be a list of tensors, not {}", other.kind()),
        ),
    }
}

fn dtype_arg(span: Span, a: &Args, key: &str) -> Flow<Option<DType>> {
    match a.kw(key) {
        None | Some(Value::None) => Ok(None),
        Some(Value::DType(d)) => Ok(Some(*d)),
        Some(Value::Str(s)) => match DType::parse(s) {
            Some(d) => Ok(Some(d)),
            None => script(span, format!("fsdp_init's {key}: unknown dtype \"{s}\"")),
        },
        Some(other) => script(
            span,
            format!("fsdp_init's {key} must be a dtype, not {}", other.kind()),
        ),
    }
}

/// The group's index (negative from the end, as Python indexes: -1 is the root).
fn group_arg(me: &Runner, span: Span, a: &Args, fun: &str) -> Flow<usize> {
    let n = me.dev.fsdp_groups() as i64;
    if n == 0 {
        return script(span, format!("{fun}: call fsdp_init first"));
    }
    match a.pos.first().or(a.kw("group")).and_then(Value::as_i64) {
        Some(g) if (0..n).contains(&g) => Ok(g as usize),
        Some(g) if g < 0 && g >= -n => Ok((n + g) as usize),
        _ => script(
            span,
            format!(
                "{fun}'s first argument is a group's index: 0 to {} (or -1, the root)",
                n - 1
            ),
        ),
    }
}

impl Runner {
    /// `fsdp_init(groups, root=-1, buffers=[], param_dtype=none, reduce_dtype=none,
    /// reshard_after_forward=true, offload=false, world_size=1)`.
    pub(super) fn fsdp_init(&mut self, span: Span, a: &Args) -> Flow<Value> {
        if self.dev.computes() {
            return script(
                span,
                "FSDP2 is modelled on the simulated device only, for now: run with --device sim",
            );
        }
        let Some(groups_v) = a.pos.first().or(a.kw("groups")) else {
            return script(
                span,
                "fsdp_init needs its parameter groups: a list of lists of tensors",
            );
        };
        let Value::List(gs) = groups_v else {
            return script(
                span,
                "fsdp_init's groups must be a list of lists of tensors",
            );
        };
        let mut groups = Vec::new();
        for g in gs {
            groups.push(tensor_list(span, g, "each FSDP group")?);
        }
        if groups.is_empty() || groups.iter().any(|g| g.is_empty()) {
            return script(span, "fsdp_init: every group needs at least one parameter");
        }
        let root = match a.kw("root").and_then(Value::as_i64).unwrap_or(-1) {
            r if r < 0 => groups.len() - 1,
            r if (r as usize) < groups.len() => r as usize,
            _ => return script(span, "fsdp_init's root must index one of the groups"),
        };
        let world_size = match a.kw("world_size").and_then(Value::as_i64).unwrap_or(1) {
            w @ 1..=65_536 => w as u64,
            w => {
                return script(
                    span,
                    format!("fsdp_init's world_size must be 1 to 65,536, not {w}"),
                )
            }
        };
        let reshard_after_forward = a
            .kw("reshard_after_forward")
            .is_none_or(|v| v.as_i64() != Some(0));
        let offload = a.kw("offload").is_some_and(|v| v.as_i64() == Some(1));
        let policy = FsdpPolicy {
            offload,
            world_size,
            param_dtype: dtype_arg(span, a, "param_dtype")?,
            reduce_dtype: dtype_arg(span, a, "reduce_dtype")?,
            reshard_after_forward,
        };
        let buffers = match a.kw("buffers") {
            None => Vec::new(),
            Some(v) => tensor_list(span, v, "fsdp_init's buffers")?,
        };
        self.op(span, "fully_shard", |d| {
            d.fsdp_init(groups, root, &buffers, policy)
        })?;
        Ok(Value::None)
    }

    /// `fsdp_sharded(params)`: the sharded parameters of these (what `model.parameters()`
    /// yields after `fully_shard`).
    pub(super) fn fsdp_sharded(&mut self, span: Span, a: &Args) -> Flow<Value> {
        let Some(v) = a.pos.first() else {
            return script(span, "fsdp_sharded needs a list of parameters");
        };
        let ps = tensor_list(span, v, "fsdp_sharded's argument")?;
        Ok(Value::List(
            ps.into_iter()
                .map(|p| {
                    let s = self.dev.fsdp_sharded(p);
                    Value::Tensor(self.dev.retain(s))
                })
                .collect(),
        ))
    }

    /// `fsdp_pre_forward(group, x=none)`: the group unsharded; returns what the module
    /// computes on (its input through the post-backward hook).
    pub(super) fn fsdp_pre_forward(&mut self, span: Span, a: &Args) -> Flow<Value> {
        let g = group_arg(self, span, a, "fsdp_pre_forward")?;
        let x = match a.pos.get(1) {
            None | Some(Value::None) => None,
            Some(Value::Tensor(t)) => Some(*t),
            Some(other) => {
                return script(
                    span,
                    format!(
                        "fsdp_pre_forward's input must be a tensor, not {}",
                        other.kind()
                    ),
                )
            }
        };
        let out = self.op(span, "fsdp", |d| d.fsdp_pre_forward(g, x))?;
        Ok(out.map_or(Value::None, Value::Tensor))
    }

    /// `fsdp_post_forward(group, out)`: the group resharded (a layer), its pre-backward hook
    /// on `out`.
    pub(super) fn fsdp_post_forward(&mut self, span: Span, a: &Args) -> Flow<Value> {
        let g = group_arg(self, span, a, "fsdp_post_forward")?;
        let Some(Value::Tensor(out)) = a.pos.get(1) else {
            return script(span, "fsdp_post_forward needs the group's output tensor");
        };
        let out = *out;
        self.op(span, "fsdp", |d| d.fsdp_post_forward(g, out))?;
        Ok(Value::None)
    }
}
