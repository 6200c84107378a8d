//! `DistributedDataParallel` at world size 1, as PyTorch 2.11 runs it (the H200 trace of
//! ../shared/groundtruth/dist1's DDP case): the reducer's buckets of the gradients, each a flat
//! tensor per dtype.
//!
//! - At construction (`ddp_init`): the parameters and buffers broadcast from rank 0, flattened
//!   in groups of 250 MiB (each flat copy freed before the next is made); one bucket of every
//!   parameter (the first iteration's); and
//!   the order in which the parameters' gradients become final in the first backward starts to
//!   be recorded (the reducer's autograd hooks).
//! - At each forward (`ddp_forward`, DDP's `_pre_forward`): after the first backward, the
//!   buckets are rebuilt once: the indices of the parameters in that order and the bucket sizes
//!   are made as int32 tensors (to broadcast them) and freed, the old bucket goes, and the new
//!   ones are made in that order, a bucket closing once it holds at least its cap (the first
//!   1 MiB, the others `bucket_cap_mb`: `_compute_bucket_assignment_by_size`); then the
//!   module's buffers are flattened to be broadcast, and the flat copy freed.
//! - Backward copies each gradient into its bucket and all-reduces the bucket in place, and
//!   the results go back into the gradients: no allocation.

use super::{script, Args, Flow, Runner, Value};
use crate::engine::{Category, DType, TensorId};
use crate::workload::ast::Span;

/// PyTorch's `dist._DEFAULT_FIRST_BUCKET_BYTES`.
const FIRST_BUCKET_BYTES: u64 = 1 << 20;
/// DDP's `broadcast_bucket_size` for the initial sync of the module's states (250 MiB).
const BROADCAST_BYTES: u64 = 250 << 20;

#[derive(Debug)]
pub(super) struct Ddp {
    params: Vec<TensorId>,
    buffers: Vec<TensorId>,
    buckets: Vec<TensorId>,
    cap_bytes: u64,
    rebuilt: bool,
    /// `gradient_as_bucket_view`: the gradients are views of the buckets.
    bucket_view: bool,
    /// Ranks (each a replica alike).
    pub(super) world_size: u64,
}

/// Parameters in `order` (each once, those never ready after the rest) grouped into buckets:
/// per dtype a bucket fills until it holds at least its limit (the first limit, then `cap`),
/// in the order they close; what is left of each dtype closes last.
pub(super) fn assign(order: &[(u64, DType)], first: u64, cap: u64) -> Vec<(u64, DType)> {
    let mut open: Vec<(DType, u64, usize)> = Vec::new();
    let mut out = Vec::new();
    for &(bytes, dtype) in order {
        let k = match open.iter().position(|(d, ..)| *d == dtype) {
            Some(k) => k,
            None => {
                open.push((dtype, 0, 0));
                open.len() - 1
            }
        };
        let (_, size, closed) = &mut open[k];
        *size += bytes;
        let limit = if *closed == 0 { first } else { cap };
        if *size >= limit {
            out.push((*size, dtype));
            *size = 0;
            *closed += 1;
        }
    }
    out.extend(
        open.into_iter()
            .filter(|(_, size, _)| *size > 0)
            .map(|(d, size, _)| (size, d)),
    );
    out
}

fn tensors(span: Span, v: Option<&Value>, what: &str) -> Flow<Vec<TensorId>> {
    match v {
        None => Ok(Vec::new()),
        Some(Value::List(items)) => items
            .iter()
            .map(|i| match i {
                Value::Tensor(t) => Ok(*t),
                other => script(
                    span,
                    format!("ddp_init's {what} must be tensors, not {}", other.kind()),
                ),
            })
            .collect(),
        Some(Value::Tensor(t)) => Ok(vec![*t]),
        Some(other) => script(
            span,
            format!(
                "ddp_init's {what} must be a list of tensors, not {}",
                other.kind()
            ),
        ),
    }
}

impl Runner {
    /// The parameters' views of the buckets (`gradient_as_bucket_view`): in `order`, each
    /// bucket of a dtype filled in turn; the previous views go (a gradient that is one keeps
    /// its bucket).
    fn ddp_bucket_views(&mut self, order: &[TensorId], buckets: &[TensorId]) {
        if let Some(old) = self.dev.grad_views.take() {
            for (_, v) in old {
                self.dev.release(v);
            }
        }
        let mut map = std::collections::HashMap::new();
        let mut fill: Vec<(TensorId, usize)> = buckets.iter().map(|&b| (b, 0)).collect();
        for &p in order {
            let (dtype, numel) = (self.dev.dtype(p), self.dev.info(p).layout.numel());
            let slot = fill.iter_mut().find(|(b, used)| {
                self.dev.dtype(*b) == dtype && used + numel <= self.dev.info(*b).layout.numel()
            });
            let Some((b, used)) = slot else { continue };
            let mut l = crate::engine::Layout::contiguous(self.dev.shape(p));
            l.offset = *used;
            *used += numel;
            let v = self.dev.view_with(*b, l);
            map.insert(p, v);
        }
        self.dev.grad_views = Some(map);
    }

    /// Each tensor's bytes and dtype, in order.
    fn ddp_sizes<'a>(&self, ts: impl IntoIterator<Item = &'a TensorId>) -> Vec<(u64, DType)> {
        ts.into_iter()
            .map(|&t| (self.dev.nbytes(t), self.dev.dtype(t)))
            .collect()
    }

    /// A flat tensor of `bytes` of `dtype` (tagged `ddp`).
    fn ddp_flat(&mut self, span: Span, bytes: u64, dtype: DType, cat: Category) -> Flow<TensorId> {
        let n = (bytes / dtype.size().max(1)) as usize;
        self.op(span, "ddp", |d| {
            d.factory_fill(&[n], dtype, false, cat, crate::engine::op::Fill::Empty)
        })
    }

    /// `ddp_init(params, buffers=[], bucket_cap_mb=25, gradient_as_bucket_view=false,
    /// world_size=1)`.
    pub(super) fn ddp_init(&mut self, span: Span, a: &Args) -> Flow<Value> {
        if self.ddp.is_some() {
            return script(span, "ddp_init: the model is wrapped already");
        }
        let params = tensors(span, a.pos.first().or(a.kw("params")), "params")?;
        let buffers = tensors(span, a.pos.get(1).or(a.kw("buffers")), "buffers")?;
        let cap_mb = match a.kw("bucket_cap_mb").or(a.pos.get(2)).map(Value::as_f64) {
            None => 25.0,
            Some(Some(v)) if v > 0.0 => v,
            Some(_) => return script(span, "ddp_init's bucket_cap_mb must be a positive number"),
        };
        if params.is_empty() {
            return script(span, "ddp_init got no parameters");
        }
        // `_sync_module_states`: the parameters, then the buffers, broadcast from rank 0 in
        // groups of at least 250 MiB (`take_tensors`: a group closes once it holds its
        // limit), each flattened into one tensor that goes before the next is made
        let states = self.ddp_sizes(params.iter().chain(&buffers));
        for (bytes, dtype) in assign(&states, BROADCAST_BYTES, BROADCAST_BYTES) {
            let flat = self.ddp_flat(span, bytes, dtype, Category::Temporary)?;
            self.dev.release(flat);
        }
        // the first iteration's bucket: every parameter, per dtype
        let mut buckets = Vec::new();
        for (bytes, dtype) in assign(&self.ddp_sizes(&params), u64::MAX, u64::MAX) {
            buckets.push(self.ddp_flat(span, bytes, dtype, Category::Gradient)?);
        }
        self.dev.grad_ready = Some(Vec::new());
        let bucket_view = a
            .kw("gradient_as_bucket_view")
            .is_some_and(|v| v.as_i64() == Some(1));
        if bucket_view {
            self.ddp_bucket_views(&params, &buckets);
        }
        let params = params.into_iter().map(|p| self.dev.retain(p)).collect();
        let buffers = buffers.into_iter().map(|b| self.dev.retain(b)).collect();
        self.ddp = Some(Ddp {
            params,
            buffers,
            buckets,
            cap_bytes: (cap_mb * (1u64 << 20) as f64) as u64,
            rebuilt: false,
            bucket_view,
            world_size: a
                .kw("world_size")
                .and_then(Value::as_i64)
                .unwrap_or(1)
                .max(1) as u64,
        });
        Ok(Value::None)
    }

    /// `ddp_forward()`: DDP's work before each forward.
    pub(super) fn ddp_forward(&mut self, span: Span) -> Flow<Value> {
        let Some(mut ddp) = self.ddp.take() else {
            return script(span, "ddp_forward: call ddp_init first");
        };
        let r = self.ddp_pre_forward(span, &mut ddp);
        self.ddp = Some(ddp);
        r.map(|()| Value::None)
    }

    fn ddp_pre_forward(&mut self, span: Span, ddp: &mut Ddp) -> Flow<()> {
        let ready = self.dev.grad_ready.as_ref().is_some_and(|l| !l.is_empty());
        if !ddp.rebuilt && ready {
            let log = self.dev.grad_ready.take().unwrap_or_default();
            let mut order: Vec<TensorId> = Vec::new();
            for t in log.into_iter().chain(ddp.params.iter().copied()) {
                if ddp.params.contains(&t) && !order.contains(&t) {
                    order.push(t);
                }
            }
            let plan = assign(&self.ddp_sizes(&order), FIRST_BUCKET_BYTES, ddp.cap_bytes);
            // `_sync_bucket_indices`: the indices (and their count) and the bucket sizes as
            // int32 tensors, broadcast from rank 0
            let idx = self.ddp_flat(
                span,
                4 * (order.len() as u64 + 1),
                DType::I32,
                Category::Temporary,
            )?;
            let counts =
                self.ddp_flat(span, 4 * plan.len() as u64, DType::I32, Category::Temporary)?;
            self.dev.release(counts);
            self.dev.release(idx);
            // the old buckets go with their views (`buckets_.clear()`), before the new ones
            if let Some(old) = self.dev.grad_views.take() {
                for (_, v) in old {
                    self.dev.release(v);
                }
            }
            for b in std::mem::take(&mut ddp.buckets) {
                self.dev.release(b);
            }
            for (bytes, dtype) in plan {
                let b = self.ddp_flat(span, bytes, dtype, Category::Gradient)?;
                ddp.buckets.push(b);
            }
            ddp.rebuilt = true;
            if ddp.bucket_view {
                let buckets = ddp.buckets.clone();
                self.ddp_bucket_views(&order, &buckets);
            }
        }
        // `_sync_module_buffers`: the buffers flattened per dtype to be broadcast
        for (bytes, dtype) in assign(&self.ddp_sizes(&ddp.buffers), u64::MAX, u64::MAX) {
            let flat = self.ddp_flat(span, bytes, dtype, Category::Temporary)?;
            self.dev.release(flat);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buckets PyTorch 2.11 rebuilt for the Llama of ../shared/groundtruth/dist1 (8 layers,
    /// hidden 1024): lm_head alone (past the first bucket's 1 MiB), then 25 MiB buckets.
    #[test]
    fn buckets_close_at_their_cap_in_ready_order() {
        let f = DType::F32;
        let (norm, q, kv, mlp) = (4096, 4_194_304, 1_048_576, 11_534_336);
        let mut order = vec![(131_072_000, f), (norm, f)];
        for _ in 0..2 {
            order.extend([
                (mlp, f),
                (mlp, f),
                (mlp, f),
                (norm, f),
                (q, f),
                (kv, f),
                (kv, f),
                (q, f),
                (norm, f),
            ]);
        }
        let b = assign(&order, 1 << 20, 25 << 20);
        let sizes: Vec<u64> = b.iter().map(|x| x.0).collect();
        assert_eq!(sizes[..3], [131_072_000, 34_607_104, 33_562_624]);
        assert_eq!(
            sizes.iter().sum::<u64>(),
            order.iter().map(|x| x.0).sum::<u64>()
        );
    }
}
