//! Running ops forward: allocation order, kernel launch, and the node each op records, as
//! PyTorch 2.11 does them on an H200 (the traces in fixtures/models are the reference).
//!
//! Most ops follow one rule ([`Tensors::simple`], sized by [`Op::simple_outputs`]): allocate the
//! output, then the extras; run the kernel; record the node with what [`Op::saves`] names; the
//! node keeps the extras (as activations), or they go at once when no graph is recorded. The
//! ops with their own order are here too: factories, matrix products (the cuBLAS workspaces,
//! bmm's operand copies), the composite cross_entropy, views and casts; attention's own order
//! (cuDNN's seed and statistics, the transposed output) is in [`super::sdpa`], in-place ops
//! in [`super::inplace`].

use super::autocast::CastPolicy;
use super::dtype::DType;
use super::layout::{elementwise_layout, Dims, Layout};
use super::op::{Binary, Fill, MetaRef, Norm, Op, Role, Unary, ViewKind};
use super::tensor::{Category, EngineError, TensorId, Tensors};
use crate::backend::Device;

pub use super::workspace::{CUBLASLT_WORKSPACE, CUBLAS_WORKSPACE};

impl<S: Device> Tensors<S> {
    /// A factory (`zeros`, `ones`, `randn`, `empty`, `full`, `arange`...): a fresh tensor.
    pub fn factory_fill(
        &mut self,
        shape: &[usize],
        dtype: DType,
        requires_grad: bool,
        category: Category,
        fill: Fill,
    ) -> Result<TensorId, EngineError> {
        if requires_grad && !dtype.is_floating() {
            return Err(EngineError::Invalid(
                "Only Tensors of floating point dtype can require gradients".into(),
            ));
        }
        let t = self.empty(shape, dtype, category)?;
        let seed = self.next_seed();
        self.launch(&Op::Fill { fill, seed }, &[], &[t])?;
        self.set_requires_grad(t, requires_grad);
        Ok(t)
    }

    /// Runs `op` on `inputs` (already cast by autocast where its policy says), by its rule.
    pub fn apply(&mut self, op: &Op, inputs: &[TensorId]) -> Result<TensorId, EngineError> {
        let arg = |i: usize| {
            inputs
                .get(i)
                .copied()
                .ok_or_else(|| EngineError::Invalid(format!("{} expects more tensors", op.name())))
        };
        match op {
            Op::Matmul => self.matmul(arg(0)?, arg(1)?),
            Op::Linear => self.linear(arg(0)?, arg(1)?, inputs.get(2).copied()),
            Op::Addmm => self.addmm(arg(0)?, arg(1)?, arg(2)?),
            Op::Sdpa {
                gqa,
                dropout,
                causal,
                ..
            } => self.sdpa_full(
                [arg(0)?, arg(1)?, arg(2)?],
                inputs.get(3).copied(),
                *gqa,
                *dropout,
                *causal,
            ),
            Op::Dropout { p, .. } => self.dropout(arg(0)?, *p),
            Op::Embedding { .. } => self.embedding(arg(0)?, arg(1)?),
            Op::BatchNorm(bn)
                if !bn.training
                    && self.grad_enabled
                    && inputs.iter().any(|&t| self.info(t).requires_grad) =>
            {
                Err(EngineError::Invalid(
                    "batch_norm in eval mode (training=false) inside autograd is not modelled yet: run it under no_grad, or in training mode".into(),
                ))
            }
            Op::Cumsum { .. } if self.grad_enabled && self.info(arg(0)?).requires_grad => {
                Err(EngineError::Invalid(
                    "cumsum's backward is not modelled yet: take it under no_grad, or of an integer or bool tensor".into(),
                ))
            }
            Op::Cast => Err(EngineError::Invalid(
                "a cast needs its dtype: use cast_op".into(),
            )),
            Op::GroupedMm { .. } => self.grouped_mm(arg(0)?, arg(1)?, arg(2)?),
            Op::IndexPut => Err(EngineError::Invalid(
                "index_put_ is in place: use index_put".into(),
            )),
            _ => self.simple(op.clone(), inputs),
        }
    }

    /// A `randn` factory.
    pub fn factory(
        &mut self,
        shape: &[usize],
        dtype: DType,
        requires_grad: bool,
        category: Category,
    ) -> Result<TensorId, EngineError> {
        self.factory_fill(shape, dtype, requires_grad, category, Fill::Randn)
    }

    /// Fills an existing tensor (a new optimizer state's zeros, a gradient's zeros).
    pub(crate) fn fill(&mut self, t: TensorId, fill: Fill) -> Result<(), EngineError> {
        self.launch(&Op::Fill { fill, seed: 0 }, &[], &[t])
    }

    /// An op by the one rule (see the module doc).
    pub fn simple(&mut self, op: Op, inputs: &[TensorId]) -> Result<TensorId, EngineError> {
        self.simple_with(op, inputs, false).map(|(out, _)| out)
    }

    /// [`Self::simple`], also handing the caller the op's extras when `keep` (topk's and
    /// sort's indices: the node keeps its own handle).
    pub(crate) fn simple_with(
        &mut self,
        op: Op,
        inputs: &[TensorId],
        keep: bool,
    ) -> Result<(TensorId, smallvec::SmallVec<[TensorId; 2]>), EngineError> {
        // the inputs' shapes, borrowed (on the stack for up to four inputs)
        let mut few: [MetaRef; 4] = [(&[], DType::F32); 4];
        let many: Vec<MetaRef>;
        let metas: &[MetaRef] = if inputs.len() <= few.len() {
            for (m, &t) in few.iter_mut().zip(inputs) {
                *m = (self.shape(t), self.dtype(t));
            }
            &few[..inputs.len()]
        } else {
            many = inputs
                .iter()
                .map(|&t| (self.shape(t), self.dtype(t)))
                .collect();
            &many
        };
        let (out_meta, extras) = op
            .simple_outputs(metas)
            .ok_or_else(|| EngineError::Invalid(format!("{} has its own rule", op.name())))??;
        if matches!(op, Op::Clamp { .. })
            && self.grad_enabled
            && inputs.iter().any(|&t| self.info(t).requires_grad)
        {
            return Err(EngineError::Invalid(
                "clamp of a tensor in the autograd graph is not modelled: run it under no_grad"
                    .into(),
            ));
        }
        let scratch = op.forward_scratch(metas);
        self.run_scratch(&op.pre_scratch())?;
        // dropout's kernel takes its mask before its output
        let first = match (&op, extras.first()) {
            (Op::Dropout { .. }, Some((shape, dtype))) => {
                Some(self.empty(shape, *dtype, Category::Temporary)?)
            }
            _ => None,
        };
        let out = match self.empty(&out_meta.0, out_meta.1, Category::Temporary) {
            Ok(t) => t,
            Err(e) => {
                if let Some(m) = first {
                    self.release(m);
                }
                return Err(e);
            }
        };
        if op.elementwise() && inputs.iter().any(|&t| !self.info(t).layout.is_contiguous()) {
            // TensorIterator orders the output's dimensions by its inputs' strides
            let ins: Vec<&Layout> = inputs.iter().map(|&t| &self.info(t).layout).collect();
            let l = elementwise_layout(&out_meta.0, &ins);
            if !l.is_contiguous() {
                self.info_mut(out).layout = l;
            }
        }
        // (a comparison's bool result never requires grad)
        let need = self.grad_enabled
            && out_meta.1.is_floating()
            && inputs.iter().any(|&t| self.info(t).requires_grad);
        // the output, then at most two extras (no heap for the list)
        let mut all = [out; 3];
        let n = 1 + extras.len();
        for (k, (shape, dtype)) in extras.into_iter().enumerate() {
            all[1 + k] = match (k, first) {
                (0, Some(m)) => m,
                _ => self.empty(&shape, dtype, Category::Temporary)?,
            };
        }
        self.launch(&op, inputs, &all[..n])?;
        if !scratch.is_empty() {
            self.run_scratch(&scratch)?;
        }
        let mut kept = smallvec::SmallVec::new();
        if !need {
            for &e in &all[1..n] {
                if keep {
                    kept.push(e);
                } else {
                    self.release(e);
                }
            }
            return Ok((out, kept));
        }
        let saves = op.saves(inputs.len());
        self.record(&op, inputs, &[out], saves);
        let node = self.info(out).grad_fn.expect("recorded");
        for (k, &e) in all[1..n].iter().enumerate() {
            self.recategorize(e, Category::Activation);
            if keep {
                kept.push(self.retain(e));
            }
            self.save_extra(node, e, Role::Extra(k));
        }
        Ok((out, kept))
    }

    pub fn unary(&mut self, op: Unary, x: TensorId) -> Result<TensorId, EngineError> {
        self.simple(Op::Unary(op), &[x])
    }

    pub fn binary(
        &mut self,
        op: Binary,
        a: TensorId,
        b: TensorId,
    ) -> Result<TensorId, EngineError> {
        self.simple(Op::Binary(op), &[a, b])
    }

    /// A tensor and a Python scalar (a 0-dim operand that keeps nothing alive).
    pub fn scalar(
        &mut self,
        op: Binary,
        x: TensorId,
        value: f64,
        reversed: bool,
    ) -> Result<TensorId, EngineError> {
        self.simple(
            Op::Scalar {
                op,
                value,
                reversed,
            },
            &[x],
        )
    }

    /// `sum()` / `mean()` over everything, or over `dim` (keepdim optional).
    pub fn reduce(
        &mut self,
        mean: bool,
        x: TensorId,
        dim: Option<i64>,
        keepdim: bool,
    ) -> Result<TensorId, EngineError> {
        self.simple(
            Op::Reduce {
                mean,
                dims: super::op::reduce::DimList::from_dim(dim),
                keepdim,
            },
            &[x],
        )
    }

    /// `softmax(dim)` / `log_softmax(dim)`: same shape; backward needs the result.
    pub fn softmax(&mut self, log: bool, x: TensorId, dim: i64) -> Result<TensorId, EngineError> {
        self.simple(
            Op::Softmax {
                dim,
                log,
                safe: false,
            },
            &[x],
        )
    }

    /// `a @ b` (`torch.matmul`): 1-D, 2-D and batched with broadcast batch dimensions. The first
    /// product takes the cuBLAS workspace.
    pub fn matmul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, EngineError> {
        let (sa, sb) = (self.shape(a).to_vec(), self.shape(b).to_vec());
        if sa.is_empty() || sb.is_empty() {
            return Err(EngineError::Invalid(
                "both arguments to matmul need to be at least 1D".into(),
            ));
        }
        let (n, ka) = if sa.len() == 1 {
            (None, sa[0])
        } else {
            (Some(sa[sa.len() - 2]), sa[sa.len() - 1])
        };
        let (kb, m) = if sb.len() == 1 {
            (sb[0], None)
        } else {
            (sb[sb.len() - 2], Some(sb[sb.len() - 1]))
        };
        if ka != kb {
            let rows = n.unwrap_or(1);
            return Err(EngineError::Invalid(format!(
                "mat1 and mat2 shapes cannot be multiplied ({rows}x{ka} and {kb}x{})",
                m.unwrap_or(1)
            )));
        }
        let ba = if sa.len() > 2 {
            &sa[..sa.len() - 2]
        } else {
            &[][..]
        };
        let bb = if sb.len() > 2 {
            &sb[..sb.len() - 2]
        } else {
            &[][..]
        };
        let batch = super::op::broadcast(ba, bb)?;
        let mut shape = batch.clone();
        shape.extend(n);
        shape.extend(m);
        // Both batched: PyTorch expands both to the common batch and reshapes them to
        // [batch, rows, cols] for bmm; an operand that is no view of that shape (a transposed
        // head split, say) is copied first, and the copies are what bmm keeps for backward.
        let (a, b, copies) = if sa.len() >= 3 && sb.len() >= 3 {
            let ca = self.bmm_operand(a, &batch)?;
            let cb = match self.bmm_operand(b, &batch) {
                Ok(c) => c,
                Err(e) => {
                    if let Some(c) = ca {
                        self.release(c);
                    }
                    return Err(e);
                }
            };
            (ca.unwrap_or(a), cb.unwrap_or(b), [cb, ca])
        } else {
            (a, b, [None, None])
        };
        let dtype = super::op::promote(self.dtype(a), self.dtype(b));
        let r = (|| {
            let out = self.empty(&shape, dtype, Category::Temporary)?;
            self.ensure_cublas_workspace(false)?;
            self.launch(&Op::Matmul, &[a, b], &[out])?;
            let saves = Op::Matmul.saves(2);
            self.record(&Op::Matmul, &[a, b], &[out], saves);
            Ok(out)
        })();
        // the copies go when the product returns (the second first), unless bmm kept them
        for c in copies.into_iter().flatten() {
            self.release(c);
        }
        r
    }

    /// The copy `matmul` makes of a batched operand expanded to `batch` that cannot be viewed as
    /// `[prod(batch), rows, cols]`, or `None` when a view does.
    fn bmm_operand(
        &mut self,
        x: TensorId,
        batch: &[usize],
    ) -> Result<Option<TensorId>, EngineError> {
        let layout = self.info(x).layout.clone();
        let nd = layout.ndim();
        let (r, c) = (layout.shape[nd - 2], layout.shape[nd - 1]);
        let mut sizes: Vec<i64> = batch.iter().map(|&d| d as i64).collect();
        sizes.extend([r as i64, c as i64]);
        let expanded = layout.expand(&sizes)?;
        let prod: usize = batch.iter().product();
        let (_, view) = expanded.reshape(&[prod as i64, r as i64, c as i64])?;
        if view.is_some() {
            return Ok(None);
        }
        if expanded.shape == layout.shape {
            return self.clone_op(x).map(Some);
        }
        let rel = if self.computes() {
            Layout::contiguous(&layout.shape).expand(&sizes)?
        } else {
            Layout::contiguous(&[])
        };
        let e = self.view_op(ViewKind::Expand, x, expanded, rel);
        let copy = self.clone_op(e);
        self.release(e);
        copy.map(Some)
    }

    /// A view op (`view`, `t`, `transpose`, `permute`, `expand`, `select`, slicing...): a new
    /// layout over the same storage. `rel` is the same view taken of a contiguous tensor of the
    /// input's shape (what the backward of an index or expand scatters through). With grad, its
    /// node keeps nothing and its backward passes the gradient through (`view`, `t`...) or
    /// scatters it into a new input-sized buffer (`slice`, `select`, `expand`'s sum).
    pub fn view_op(
        &mut self,
        kind: ViewKind,
        x: TensorId,
        layout: Layout,
        rel: Layout,
    ) -> TensorId {
        let out = self.view_with(x, layout);
        self.record(&Op::View { kind, rel }, &[x], &[out], &[]);
        out
    }

    /// `transpose`/`permute`: output dimension i is input dimension `perm[i]`.
    pub fn permute_op(
        &mut self,
        kind: ViewKind,
        x: TensorId,
        layout: Layout,
        perm: Vec<usize>,
    ) -> TensorId {
        let rel = Layout::contiguous(&[]);
        let out = self.view_with(x, layout);
        self.record(&Op::View { kind, rel }, &[x], &[out], &[]);
        if let Some(n) = self.info(out).grad_fn {
            self.node_mut(n).back = super::op::Back::Permute(perm);
        }
        out
    }

    /// `split`/`chunk`: views of the parts, made by one node whose backward concatenates the
    /// parts' gradients.
    pub fn split_op(
        &mut self,
        chunk: bool,
        dim: usize,
        x: TensorId,
        parts: Vec<Layout>,
    ) -> Vec<TensorId> {
        let shapes: Vec<Vec<usize>> = parts.iter().map(|l| l.shape.to_vec()).collect();
        let outs: Vec<TensorId> = parts.into_iter().map(|l| self.view_with(x, l)).collect();
        self.record(&Op::Split { chunk, dim }, &[x], &outs, &[]);
        if let Some(n) = outs.first().and_then(|&o| self.info(o).grad_fn) {
            self.node_mut(n).out_shapes = shapes;
        }
        outs
    }

    /// `contiguous()`: itself when contiguous, else a recorded copy.
    pub fn contiguous_op(&mut self, x: TensorId) -> Result<TensorId, EngineError> {
        if self.info(x).layout.is_contiguous() {
            return Ok(self.retain(x));
        }
        self.clone_op(x)
    }

    /// `clone()`: a fresh contiguous copy; its backward passes the gradient through.
    pub fn clone_op(&mut self, x: TensorId) -> Result<TensorId, EngineError> {
        self.simple(Op::Clone, &[x])
    }

    /// `reshape(shape)`: a view when strides allow, else a copy (as PyTorch).
    pub fn reshape_op(&mut self, x: TensorId, shape: &[i64]) -> Result<TensorId, EngineError> {
        let (new_shape, view) = self.info(x).layout.reshape(shape)?;
        // a reshape's backward reshapes the gradient back: no scatter
        let rel = Layout::contiguous(&[]);
        match view {
            Some(l) => Ok(self.view_op(ViewKind::Reshape, x, l, rel)),
            None => {
                let c = self.clone_op(x)?;
                let l = Layout::contiguous(&new_shape);
                let v = self.view_op(ViewKind::Reshape, c, l, rel);
                self.release(c);
                Ok(v)
            }
        }
    }

    /// `x.to(dtype)`: a recorded cast (a new tensor, laid out as `x` is).
    pub fn cast_op(&mut self, x: TensorId, dtype: DType) -> Result<TensorId, EngineError> {
        let out = self.empty_preserving(x, dtype)?;
        self.launch(&Op::Cast, &[x], &[out])?;
        self.record(&Op::Cast, &[x], &[out], &[]);
        Ok(out)
    }

    /// A new tensor shaped as `like`, in `dtype`, laid out as `like` is where that is dense
    /// (PyTorch's `empty_like` with `preserve_format`, as `.to()` and autocast's casts make
    /// theirs: a cast of a transposed tensor is transposed too), else contiguous.
    pub(super) fn empty_preserving(
        &mut self,
        like: TensorId,
        dtype: DType,
    ) -> Result<TensorId, EngineError> {
        let l = &self.info(like).layout;
        // (the common case, a contiguous input, copies no layout)
        let kept = (!l.is_contiguous() && l.is_dense()).then(|| Layout {
            offset: 0,
            ..l.clone()
        });
        let shape = l.shape.clone();
        let out = self.empty(&shape, dtype, Category::Temporary)?;
        if let Some(k) = kept {
            self.info_mut(out).layout = k;
        }
        Ok(out)
    }

    /// Describes a tensor as PyTorch's repr of its size does.
    pub fn describe(&self, t: TensorId) -> String {
        format!("tensor of size {} ({})", Dims(self.shape(t)), self.dtype(t))
    }
}

/// The transformer ops: their outputs, and exactly what their backward keeps (derivatives.yaml
/// and the CUDA kernels' saved buffers).
impl<S: Device> Tensors<S> {
    /// `F.linear(x, w, b)`: `x @ w.T + b` as one addmm/matmul; keeps `x` (for `w`'s gradient)
    /// and `w` (for `x`'s). The bias needs nothing.
    pub fn linear(
        &mut self,
        x: TensorId,
        w: TensorId,
        b: Option<TensorId>,
    ) -> Result<TensorId, EngineError> {
        let (sx, sw) = (self.shape(x).to_vec(), self.shape(w).to_vec());
        if sw.len() != 2 || sx.is_empty() || sx[sx.len() - 1] != sw[1] {
            let rows: usize = sx[..sx.len().saturating_sub(1)].iter().product();
            return Err(EngineError::Invalid(format!(
                "mat1 and mat2 shapes cannot be multiplied ({rows}x{} and {}x{})",
                sx.last().copied().unwrap_or(0),
                sw.get(1).copied().unwrap_or(0),
                sw.first().copied().unwrap_or(0)
            )));
        }
        let mut shape = sx.clone();
        *shape.last_mut().expect("non-empty") = sw[0];
        let dtype = super::op::promote(self.dtype(x), self.dtype(w));
        let out = self.empty(&shape, dtype, Category::Temporary)?;
        self.ensure_cublas_workspace(b.is_some())?;
        let mut inputs = vec![x, w];
        inputs.extend(b);
        self.launch(&Op::Linear, &inputs, &[out])?;
        let saves = Op::Linear.saves(inputs.len());
        self.record(&Op::Linear, &inputs, &[out], saves);
        Ok(out)
    }

    /// `torch.addmm(b, x, w)`: `x @ w + b` for a 2-D `x` and `w` as [in, out] (GPT-2's
    /// `Conv1D`), through cuBLASLt as a linear with bias; keeps `x` and `w` as a linear does.
    pub fn addmm(
        &mut self,
        x: TensorId,
        w: TensorId,
        b: TensorId,
    ) -> Result<TensorId, EngineError> {
        let (sx, sw, sb) = (self.shape(x), self.shape(w), self.shape(b));
        if sx.len() != 2 || sw.len() != 2 || sx[1] != sw[0] {
            let x2 = |s: &[usize]| s.iter().map(usize::to_string).collect::<Vec<_>>().join("x");
            return Err(EngineError::Invalid(format!(
                "addmm: mat1 and mat2 must be 2-D and multipliable, got {} and {}",
                x2(sx),
                x2(sw)
            )));
        }
        let shape = vec![sx[0], sw[1]];
        if super::op::broadcast(sb, &shape).as_deref() != Ok(&shape[..]) {
            return Err(EngineError::Invalid(format!(
                "addmm: the input of size {} cannot be broadcast to the product's {}",
                Dims(sb),
                Dims(&shape)
            )));
        }
        let dtype = super::op::promote(self.dtype(x), self.dtype(w));
        let out = self.empty(&shape, dtype, Category::Temporary)?;
        self.ensure_cublas_workspace(true)?;
        let inputs = [x, w, b];
        self.launch(&Op::Addmm, &inputs, &[out])?;
        let saves = Op::Addmm.saves(3);
        self.record(&Op::Addmm, &inputs, &[out], saves);
        Ok(out)
    }

    /// `F.layer_norm(x, [d], w, b, eps)`: keeps `x`, `w`, `b` and the per-row `mean` and `rstd`
    /// (float32, one per normalized row). The CUDA kernel always writes them; without a graph
    /// they are freed as the op returns.
    pub fn layer_norm(
        &mut self,
        x: TensorId,
        w: Option<TensorId>,
        b: Option<TensorId>,
        eps: f64,
    ) -> Result<TensorId, EngineError> {
        if w.is_none() && b.is_some() {
            return Err(EngineError::Invalid(
                "layer_norm with a bias and no weight is not in gpumem's engine; pass both".into(),
            ));
        }
        let mut inputs = vec![x];
        inputs.extend(w);
        inputs.extend(b);
        self.simple(Op::Norm(Norm::Layer { eps }), &inputs)
    }

    /// `F.embedding(idx, table)`: keeps the indices. Indices that no view flattens (an
    /// expanded `token_type_ids`) are copied by `indices.reshape(-1)` first; the copy goes once
    /// the lookup has its output.
    pub fn embedding(&mut self, idx: TensorId, table: TensorId) -> Result<TensorId, EngineError> {
        let l = &self.info(idx).layout;
        let strided = !l.is_contiguous();
        let copy = if strided && l.reshape(&[-1])?.1.is_none() {
            let c = self.empty(&[l.numel()], self.dtype(idx), Category::Temporary)?;
            if let Err(e) = self.launch(&Op::Copy, &[idx], &[c]) {
                self.release(c);
                return Err(e);
            }
            Some(c)
        } else {
            None
        };
        let r = self.simple(Op::Embedding { strided }, &[idx, table]);
        if let Some(c) = copy {
            self.release(c);
        }
        r
    }

    /// `F.dropout(x, p)` in training: the output and a bool mask (kept for backward).
    pub fn dropout(&mut self, x: TensorId, p: f64) -> Result<TensorId, EngineError> {
        if p <= 0.0 {
            return Ok(self.retain(x));
        }
        let seed = self.next_seed();
        self.simple(Op::Dropout { p, seed }, &[x])
    }

    /// `x.masked_fill(mask, value)`: keeps the mask.
    pub fn masked_fill(
        &mut self,
        x: TensorId,
        mask: TensorId,
        value: f64,
    ) -> Result<TensorId, EngineError> {
        self.simple(Op::MaskedFill { value }, &[x, mask])
    }

    /// `F.cross_entropy(logits [N, C], target [N])`: log_softmax (keeps its result) then
    /// nll_loss (keeps the target and a total_weight scalar); returns the scalar loss.
    pub fn cross_entropy(
        &mut self,
        logits: TensorId,
        target: TensorId,
    ) -> Result<TensorId, EngineError> {
        let s = self.shape(logits).to_vec();
        if s.len() != 2 || self.shape(target) != [s[0]] {
            return Err(EngineError::Invalid(format!(
                "cross_entropy expects logits [N, C] and target [N], got {} and {}",
                Dims(&s),
                Dims(self.shape(target))
            )));
        }
        // F.cross_entropy passes log_softmax its input's dtype, so autocast leaves it in the
        // region's dtype; nll_loss (autocast's float32 list) takes a float32 copy of the
        // log-probabilities, which its node keeps (the H200 traces of bf16 ResNets)
        let lsm = self.softmax(true, logits, 1)?;
        let loss = self.autocast_op(CastPolicy::Float32, &[lsm, target], |d, i| {
            d.simple(Op::NllLoss, i)
        });
        self.release(lsm);
        loss
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::SimSource;
    use crate::engine::tensor::testing::*;

    /// The seed's example: `c = a * b; d = c.sin(); loss = d.mean()` keeps a, b (for mul) and c
    /// (for sin) until backward; under no_grad nothing is kept.
    #[test]
    fn grad_keeps_activations_and_no_grad_does_not() {
        let mut d = dev();
        let a = d
            .factory(&[100, 100], DType::F32, true, Category::Input)
            .unwrap();
        let b = d
            .factory(&[100, 100], DType::F32, true, Category::Input)
            .unwrap();
        let base = allocated(&d);
        let c = d.binary(Binary::Mul, a, b).unwrap();
        let s = d.unary(Unary::Sin, c).unwrap();
        let loss = d.reduce(true, s, None, false).unwrap();
        d.release(c);
        d.release(s);
        assert_eq!(d.saved_tensors(), 3, "mul keeps a and b, sin keeps c");
        assert_eq!(
            allocated(&d),
            base + 40448 + 512,
            "c stays alive for backward; s is freed"
        );
        d.backward(loss, false).unwrap();
        assert_eq!(d.saved_tensors(), 0, "backward frees what it saved");
        assert!(d.grad(a).is_some() && d.grad(b).is_some());
        assert_eq!(
            allocated(&d),
            base + 512 + 2 * 40448,
            "loss + a.grad + b.grad"
        );
        assert!(d
            .backward(loss, false)
            .unwrap_err()
            .to_string()
            .contains("backward through the graph a second time"));
        d.release(loss);

        d.grad_enabled = false;
        let before = allocated(&d);
        let c = d.binary(Binary::Mul, a, b).unwrap();
        let s = d.unary(Unary::Sin, c).unwrap();
        d.release(c);
        let l2 = d.reduce(true, s, None, false).unwrap();
        d.release(s);
        assert_eq!(d.saved_tensors(), 0);
        assert_eq!(allocated(&d), before + 512, "only the result remains");
        assert!(d.backward(l2, false).is_err());
    }

    #[test]
    fn a_kept_loss_keeps_its_graph() {
        let mut d = dev();
        let w = d
            .factory(&[256, 256], DType::F32, true, Category::Parameter)
            .unwrap();
        let x = d
            .factory(&[64, 256], DType::F32, false, Category::Input)
            .unwrap();
        let h = d.matmul(x, w).unwrap();
        let r = d.unary(Unary::Relu, h).unwrap();
        d.release(h);
        let loss = d.reduce(false, r, None, false).unwrap();
        d.release(r);
        let with_graph = allocated(&d);
        // detaching (or .item()) lets the graph go
        let cat = |d: &Tensors<SimSource>, c: Category| {
            d.by_category()
                .into_iter()
                .find(|(k, _)| *k == c)
                .unwrap()
                .1
        };
        assert_eq!(
            cat(&d, Category::Activation),
            64 * 256 * 4,
            "the relu output, saved for backward, is an activation"
        );
        assert_eq!(
            cat(&d, Category::Workspace),
            CUBLAS_WORKSPACE,
            "a bias-free product takes the cuBLAS workspace only"
        );
        assert_eq!(cat(&d, Category::Parameter), 256 * 256 * 4);
        let kept = d.detach(loss);
        d.release(loss);
        assert_eq!(cat(&d, Category::Activation), 0);
        assert!(
            allocated(&d) < with_graph,
            "the relu output saved for backward is freed"
        );
        assert_eq!(d.saved_tensors(), 0);
        d.release(kept);
        assert!(
            d.workspace.is_some(),
            "the first matmul took the cuBLAS workspace"
        );
    }

    #[test]
    fn shape_errors_are_pytorchs() {
        let mut d = dev();
        let a = d
            .factory(&[2, 3], DType::F32, false, Category::Input)
            .unwrap();
        let b = d
            .factory(&[4, 5], DType::F32, false, Category::Input)
            .unwrap();
        let e = d.matmul(a, b).unwrap_err().to_string();
        assert_eq!(e, "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)");
        assert!(d.factory(&[2], DType::I64, true, Category::Input).is_err());
    }
}

#[cfg(test)]
mod transformer_tests {
    use super::*;
    use crate::alloc::SimSource;
    use crate::engine::tensor::testing::*;

    fn activation(d: &Tensors<SimSource>) -> u64 {
        d.by_category()
            .into_iter()
            .find(|(c, _)| *c == Category::Activation)
            .unwrap()
            .1
    }

    #[test]
    fn layer_norm_keeps_input_mean_and_rstd() {
        let mut d = dev();
        let x = d
            .factory(&[8, 1024, 768], DType::F32, false, Category::Input)
            .unwrap();
        let w = d
            .factory(&[768], DType::F32, true, Category::Parameter)
            .unwrap();
        let y = d.layer_norm(x, Some(w), None, 1e-5).unwrap();
        // x (an input) is saved as it is; mean and rstd are float32 per row (8192 rows)
        assert_eq!(activation(&d), 2 * 8192 * 4);
        assert_eq!(d.saved_tensors(), 4, "x, w, mean, rstd");
        d.release(y);
        assert_eq!(activation(&d), 0);
        d.grad_enabled = false;
        let y = d.layer_norm(x, Some(w), None, 1e-5).unwrap();
        assert_eq!(d.saved_tensors(), 0, "no grad: no statistics kept");
        d.release(y);
    }

    #[test]
    fn flash_attention_keeps_qkv_out_and_logsumexp() {
        let mut d = dev();
        let q = d
            .factory(&[2, 12, 256, 64], DType::BF16, true, Category::Parameter)
            .unwrap();
        let k = d
            .factory(&[2, 12, 256, 64], DType::BF16, true, Category::Parameter)
            .unwrap();
        let v = d
            .factory(&[2, 12, 256, 64], DType::BF16, true, Category::Parameter)
            .unwrap();
        let o = d.sdpa(q, k, v).unwrap();
        assert_eq!(d.shape(o), &[2, 12, 256, 64]);
        // the output (saved) and the float32 logsumexp [2, 12, 256] and the rng seed/offset
        assert_eq!(
            activation(&d),
            2 * 12 * 256 * 64 * 2 + 2 * 12 * 256 * 4 + 2 * 512
        );
        assert_eq!(d.saved_tensors(), 7);
    }

    #[test]
    fn cross_entropy_keeps_log_probs_and_target() {
        let mut d = dev();
        let logits = d
            .factory(&[16, 1000], DType::F32, true, Category::Parameter)
            .unwrap();
        let target = d
            .factory(&[16], DType::I64, false, Category::Input)
            .unwrap();
        let loss = d.cross_entropy(logits, target).unwrap();
        assert!(d.shape(loss).is_empty());
        // log_softmax's result (16 x 1000 float32) and nll_loss's total_weight
        assert_eq!(activation(&d), 64000 + 512);
        d.backward(loss, false).unwrap();
        assert_eq!(activation(&d), 0);
        assert!(d.grad(logits).is_some());
        let e = d.cross_entropy(logits, logits).unwrap_err().to_string();
        assert!(e.contains("expects logits [N, C] and target [N]"), "{e}");
    }

    #[test]
    fn embedding_keeps_indices_and_dropout_a_bool_mask() {
        let mut d = dev();
        let table = d
            .factory(&[50257, 768], DType::F32, true, Category::Parameter)
            .unwrap();
        let idx = d
            .factory(&[4, 128], DType::I64, false, Category::Input)
            .unwrap();
        let e = d.embedding(idx, table).unwrap();
        assert_eq!(d.shape(e), &[4, 128, 768]);
        assert_eq!(d.saved_tensors(), 1, "the indices");
        let y = d.dropout(e, 0.1).unwrap();
        assert_eq!(
            activation(&d),
            4 * 128 * 768,
            "the bool mask, 1 byte per element"
        );
        d.release(y);
        d.release(e);
        assert!(d.embedding(table, table).is_err());
    }
}
