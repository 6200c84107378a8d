//! Ops: output shapes, allocations and what autograd keeps, op by op.
//!
//! Each op states its memory behaviour in one place: the output it allocates (or the view it
//! makes), and what its backward needs saved (PyTorch's `derivatives.yaml`). The simulated
//! device computes nothing, so an op is its shape function plus these facts; the data-carrying
//! backends will add kernels beside them without changing the engine.

use super::autograd::{Back, Save};
use super::dtype::DType;
use super::layout::{Dims, Layout, LayoutError};
use super::tensor::{Category, EngineError, TensorId, Tensors};
use crate::alloc::SegmentSource;

/// The cuBLAS workspace PyTorch takes from the caching allocator at the first matrix product
/// on a stream (`CUBLAS_WORKSPACE_CONFIG` default `:4096:8` on Hopper), kept for the process.
pub const CUBLAS_WORKSPACE: u64 = 8 * 4096 * 1024;

/// The cuBLASLt workspace taken right after the cuBLAS one (1 MiB; seen in PyTorch's traces).
pub const CUBLASLT_WORKSPACE: u64 = 1 << 20;

/// Elementwise unary ops and what their backward keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unary {
    Neg,
    Sin,
    Cos,
    Exp,
    Relu,
    Gelu,
    Sigmoid,
    Tanh,
    /// `tril()`: the lower triangle (of a mask, say); saves nothing.
    Tril,
    /// `~x` / `bitwise_not()`; saves nothing.
    BitwiseNot,
}

impl Unary {
    pub fn parse(name: &str) -> Option<Unary> {
        Some(match name {
            "neg" => Unary::Neg,
            "sin" => Unary::Sin,
            "cos" => Unary::Cos,
            "exp" => Unary::Exp,
            "relu" => Unary::Relu,
            "gelu" => Unary::Gelu,
            "sigmoid" => Unary::Sigmoid,
            "tanh" => Unary::Tanh,
            "tril" => Unary::Tril,
            "bitwise_not" | "logical_not" => Unary::BitwiseNot,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Unary::Neg => "neg",
            Unary::Sin => "sin",
            Unary::Cos => "cos",
            Unary::Exp => "exp",
            Unary::Relu => "relu",
            Unary::Gelu => "gelu",
            Unary::Sigmoid => "sigmoid",
            Unary::Tanh => "tanh",
            Unary::Tril => "tril",
            Unary::BitwiseNot => "bitwise_not",
        }
    }

    /// derivatives.yaml: sin/cos/gelu need the input; exp/relu/sigmoid/tanh the result.
    fn saves(self) -> &'static [Save] {
        match self {
            Unary::Neg | Unary::Tril | Unary::BitwiseNot => &[],
            Unary::Sin | Unary::Cos | Unary::Gelu => &[Save::Input(0)],
            Unary::Exp | Unary::Relu | Unary::Sigmoid | Unary::Tanh => &[Save::Output],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
}

impl Binary {
    fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
        }
    }

    /// `a * b` keeps `b` for `a`'s gradient and `a` for `b`'s; `a / b` keeps `b` (and `a` for
    /// `b`'s gradient); add and sub keep nothing.
    fn saves(self) -> &'static [Save] {
        match self {
            Binary::Add | Binary::Sub => &[],
            Binary::Mul => &[Save::InputFor(1, 0), Save::InputFor(0, 1)],
            Binary::Div => &[Save::Input(1), Save::InputFor(0, 1)],
        }
    }
}

/// NumPy/PyTorch broadcasting of two shapes.
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, LayoutError> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let x = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let y = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if x == y || y == 1 {
            x
        } else if x == 1 {
            y
        } else {
            return Err(LayoutError(format!(
                "The size of tensor a ({x}) must match the size of tensor b ({y}) at non-singleton dimension {i}"
            )));
        };
    }
    Ok(out)
}

/// Result dtype of two operands: the wider float wins, floats beat integers.
pub fn promote(a: DType, b: DType) -> DType {
    if a == b {
        return a;
    }
    match (a.is_floating(), b.is_floating()) {
        (true, false) => a,
        (false, true) => b,
        _ if a.size() >= b.size() => a,
        _ => b,
    }
}

impl<S: SegmentSource> Tensors<S> {
    /// A factory (`zeros`, `ones`, `randn`, `empty`, `full`, `arange`...): a fresh tensor.
    pub fn factory(
        &mut self,
        shape: &[usize],
        dtype: DType,
        requires_grad: bool,
        category: Category,
    ) -> Result<TensorId, EngineError> {
        if requires_grad && !dtype.is_floating() {
            return Err(EngineError::Invalid(
                "Only Tensors of floating point dtype can require gradients".into(),
            ));
        }
        let t = self.empty(shape, dtype, category)?;
        self.launch("fill", &[], &[t])?;
        self.set_requires_grad(t, requires_grad);
        Ok(t)
    }

    pub fn unary(&mut self, op: Unary, x: TensorId) -> Result<TensorId, EngineError> {
        let (shape, dtype) = (self.shape(x).to_vec(), self.dtype(x));
        let out = self.empty(&shape, dtype, Category::Temporary)?;
        self.launch(op.name(), &[x], &[out])?;
        self.record(op.name(), &[x], &[out], op.saves());
        Ok(out)
    }

    pub fn binary(
        &mut self,
        op: Binary,
        a: TensorId,
        b: TensorId,
    ) -> Result<TensorId, EngineError> {
        let shape = broadcast(self.shape(a), self.shape(b))?;
        let dtype = promote(self.dtype(a), self.dtype(b));
        let out = self.empty(&shape, dtype, Category::Temporary)?;
        self.launch(op.name(), &[a, b], &[out])?;
        self.record(op.name(), &[a, b], &[out], op.saves());
        if op.name() == "add" {
            if let Some(n) = self.info(out).grad_fn {
                self.node_mut(n).back = Back::Add;
            }
        }
        Ok(out)
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
        let batch = broadcast(ba, bb)?;
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
        let dtype = promote(self.dtype(a), self.dtype(b));
        let r = (|| {
            let out = self.empty(&shape, dtype, Category::Temporary)?;
            self.ensure_cublas_workspace(false)?;
            self.launch("matmul", &[a, b], &[out])?;
            self.record(
                "matmul",
                &[a, b],
                &[out],
                &[Save::InputFor(1, 0), Save::InputFor(0, 1)],
            );
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
        let e = self.view_op("expand", x, expanded);
        let copy = self.clone_op(e);
        self.release(e);
        copy.map(Some)
    }

    /// The first matrix product of the process takes the cuBLAS workspace and then the cuBLASLt
    /// one, right after allocating its output (as PyTorch 2.11 does on an H200). On the autograd
    /// thread (in backward, a checkpoint's recomputation included) the handles are that
    /// thread's: its first product takes a cuBLAS workspace, and its first product with a bias
    /// (`addmm`, which goes through cuBLASLt) a cuBLASLt one.
    pub(crate) fn ensure_cublas_workspace(&mut self, with_bias: bool) -> Result<(), EngineError> {
        if self.on_autograd_thread {
            if self.backward_workspace.is_none() {
                let w = self.empty(&[CUBLAS_WORKSPACE as usize], DType::U8, Category::Workspace)?;
                self.backward_workspace = Some(w);
            }
            if with_bias && self.backward_lt_workspace.is_none() {
                let lt = self.empty(
                    &[CUBLASLT_WORKSPACE as usize],
                    DType::U8,
                    Category::Workspace,
                )?;
                self.backward_lt_workspace = Some(lt);
            }
            return Ok(());
        }
        if let Some(r) = self.checkpoint.current {
            let ev = super::autograd::TapeEvent::Product { with_bias };
            self.checkpoint.regions[r as usize].tape.push(ev);
        }
        if self.workspace.is_none() {
            let w = self.empty(&[CUBLAS_WORKSPACE as usize], DType::U8, Category::Workspace)?;
            self.workspace = Some(w);
            let lt = self.empty(
                &[CUBLASLT_WORKSPACE as usize],
                DType::U8,
                Category::Workspace,
            )?;
            self.lt_workspace = Some(lt);
        }
        Ok(())
    }

    /// `sum()` / `mean()` over everything, or over `dim` (keepdim optional).
    pub fn reduce(
        &mut self,
        op: &'static str,
        x: TensorId,
        dim: Option<i64>,
        keepdim: bool,
    ) -> Result<TensorId, EngineError> {
        let mut shape = self.shape(x).to_vec();
        match dim {
            None => shape.clear(),
            Some(d) => {
                let d = super::layout::wrap_dim(d, shape.len())?;
                if keepdim {
                    shape[d] = 1;
                } else {
                    shape.remove(d);
                }
            }
        }
        let dtype = self.dtype(x);
        let out = self.empty(&shape, dtype, Category::Temporary)?;
        self.launch(op, &[x], &[out])?;
        self.record(op, &[x], &[out], &[]);
        Ok(out)
    }

    /// `softmax(dim)` / `log_softmax(dim)`: same shape; backward needs the result.
    pub fn softmax(
        &mut self,
        op: &'static str,
        x: TensorId,
        dim: i64,
    ) -> Result<TensorId, EngineError> {
        super::layout::wrap_dim(dim, self.shape(x).len())?;
        let (shape, dtype) = (self.shape(x).to_vec(), self.dtype(x));
        let out = self.empty(&shape, dtype, Category::Temporary)?;
        self.launch(op, &[x], &[out])?;
        self.record(op, &[x], &[out], &[Save::Output]);
        Ok(out)
    }

    /// A view op (`view`, `t`, `transpose`, `permute`, `expand`, `select`, slicing...): a new
    /// layout over the same storage. With grad, its node keeps nothing and its backward passes
    /// the gradient through (`view`, `t`...) or scatters it into a new input-sized buffer
    /// (`slice`, `select`, `expand`'s sum).
    pub fn view_op(&mut self, op: &'static str, x: TensorId, layout: Layout) -> TensorId {
        let same_shape = layout.shape == self.info(x).layout.shape;
        let back = match op {
            "view" | "reshape" | "unsqueeze" | "squeeze" | "flatten" => Back::Reshape,
            "t" if self.info(x).layout.ndim() == 2 => Back::Permute(vec![1, 0]),
            "t" => Back::Pass,
            "expand" if same_shape => Back::Pass,
            _ => Back::Alloc,
        };
        self.view_op_back(op, x, layout, back)
    }

    /// `transpose`/`permute`: output dimension i is input dimension `perm[i]`.
    pub fn permute_op(
        &mut self,
        op: &'static str,
        x: TensorId,
        layout: Layout,
        perm: Vec<usize>,
    ) -> TensorId {
        self.view_op_back(op, x, layout, Back::Permute(perm))
    }

    fn view_op_back(
        &mut self,
        op: &'static str,
        x: TensorId,
        layout: Layout,
        back: Back,
    ) -> TensorId {
        let out = self.view_with(x, layout);
        self.record(op, &[x], &[out], &[]);
        if let Some(n) = self.info(out).grad_fn {
            self.node_mut(n).back = back;
        }
        out
    }

    /// `split`/`chunk`: views of the parts, made by one node whose backward concatenates the
    /// parts' gradients.
    pub fn split_op(&mut self, op: &'static str, x: TensorId, parts: Vec<Layout>) -> Vec<TensorId> {
        let shapes: Vec<Vec<usize>> = parts.iter().map(|l| l.shape.clone()).collect();
        let outs: Vec<TensorId> = parts.into_iter().map(|l| self.view_with(x, l)).collect();
        self.record(op, &[x], &outs, &[]);
        if let Some(n) = outs.first().and_then(|&o| self.info(o).grad_fn) {
            let node = self.node_mut(n);
            node.back = Back::Split;
            node.out_shapes = shapes;
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
        let out = self.clone_tensor(x, Category::Temporary)?;
        self.launch("clone", &[x], &[out])?;
        self.record("clone", &[x], &[out], &[]);
        if let Some(n) = self.info(out).grad_fn {
            self.node_mut(n).back = Back::Pass;
        }
        Ok(out)
    }

    /// `reshape(shape)`: a view when strides allow, else a copy (as PyTorch).
    pub fn reshape_op(&mut self, x: TensorId, shape: &[i64]) -> Result<TensorId, EngineError> {
        let (new_shape, view) = self.info(x).layout.reshape(shape)?;
        match view {
            Some(l) => Ok(self.view_op("reshape", x, l)),
            None => {
                let c = self.clone_op(x)?;
                let l = Layout::contiguous(&new_shape);
                let v = self.view_op("reshape", c, l);
                self.release(c);
                Ok(v)
            }
        }
    }

    /// Describes a tensor as PyTorch's repr of its size does.
    pub fn describe(&self, t: TensorId) -> String {
        format!("tensor of size {} ({})", Dims(self.shape(t)), self.dtype(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::SimSource;
    use crate::engine::tensor::testing::*;

    #[test]
    fn broadcasting_and_promotion() {
        assert_eq!(broadcast(&[4, 1, 3], &[5, 1]).unwrap(), vec![4, 5, 3]);
        assert!(broadcast(&[3], &[4])
            .unwrap_err()
            .0
            .contains("must match the size of tensor b (4)"));
        assert_eq!(promote(DType::F16, DType::F32), DType::F32);
        assert_eq!(promote(DType::I64, DType::BF16), DType::BF16);
    }

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
        let loss = d.reduce("mean", s, None, false).unwrap();
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
        let l2 = d.reduce("mean", s, None, false).unwrap();
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
        let loss = d.reduce("sum", r, None, false).unwrap();
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
            CUBLAS_WORKSPACE + CUBLASLT_WORKSPACE
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

/// The transformer ops: their outputs, and exactly what their backward keeps (derivatives.yaml
/// and the CUDA kernels' saved buffers).
impl<S: SegmentSource> Tensors<S> {
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
        let dtype = promote(self.dtype(x), self.dtype(w));
        let out = self.empty(&shape, dtype, Category::Temporary)?;
        self.ensure_cublas_workspace(b.is_some())?;
        let mut inputs = vec![x, w];
        inputs.extend(b);
        self.launch("linear", &inputs, &[out])?;
        self.record(
            "linear",
            &inputs,
            &[out],
            &[Save::InputFor(1, 0), Save::InputFor(0, 1)],
        );
        Ok(out)
    }

    /// `F.layer_norm(x, [d], w, b)`: keeps `x`, `w`, `b` and the per-row `mean` and `rstd`
    /// (float32, one per normalized row).
    pub fn layer_norm(
        &mut self,
        x: TensorId,
        w: Option<TensorId>,
        b: Option<TensorId>,
    ) -> Result<TensorId, EngineError> {
        let (shape, dtype) = (self.shape(x).to_vec(), self.dtype(x));
        if shape.is_empty() {
            return Err(EngineError::Invalid(
                "layer_norm needs at least one dimension".into(),
            ));
        }
        let out = self.empty(&shape, dtype, Category::Temporary)?;
        let rows: usize = shape[..shape.len() - 1].iter().product();
        let need = self.grad_enabled
            && [Some(x), w, b]
                .iter()
                .flatten()
                .any(|&t| self.info(t).requires_grad);
        // the CUDA kernel always writes the per-row mean and rstd (float32); without a graph
        // they are freed as the op returns
        let mean = self.empty(&[rows], DType::F32, Category::Temporary)?;
        let rstd = self.empty(&[rows], DType::F32, Category::Temporary)?;
        if !need {
            self.launch("layer_norm", &[x], &[out])?;
            self.release(mean);
            self.release(rstd);
            return Ok(out);
        }
        let mut inputs = vec![x];
        inputs.extend(w);
        inputs.extend(b);
        let mut saves = vec![Save::Input(0)];
        saves.extend((1..inputs.len()).map(Save::Input));
        self.launch("layer_norm", &inputs, &[out])?;
        self.record("layer_norm", &inputs, &[out], &saves);
        // mean and rstd are extra outputs only the node holds
        let node = self.info(out).grad_fn.expect("recorded");
        for t in [mean, rstd] {
            self.recategorize(t, Category::Activation);
            self.save_extra(node, t);
        }
        Ok(out)
    }

    /// `F.embedding(idx, table)`: keeps the indices.
    pub fn embedding(&mut self, idx: TensorId, table: TensorId) -> Result<TensorId, EngineError> {
        let st = self.shape(table).to_vec();
        if st.len() != 2 {
            return Err(EngineError::Invalid("embedding weight must be 2-D".into()));
        }
        if self.dtype(idx).is_floating() {
            return Err(EngineError::Invalid(
                "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int".into(),
            ));
        }
        let mut shape = self.shape(idx).to_vec();
        shape.push(st[1]);
        let out = self.empty(&shape, self.dtype(table), Category::Temporary)?;
        self.launch("embedding", &[idx, table], &[out])?;
        self.record("embedding", &[idx, table], &[out], &[Save::InputFor(0, 1)]);
        Ok(out)
    }

    /// `F.dropout(x, p)` in training: the output and a bool mask (kept for backward).
    pub fn dropout(&mut self, x: TensorId, p: f64) -> Result<TensorId, EngineError> {
        if p <= 0.0 {
            return Ok(self.retain(x));
        }
        let (shape, dtype) = (self.shape(x).to_vec(), self.dtype(x));
        let out = self.empty(&shape, dtype, Category::Temporary)?;
        let mask = self.empty(&shape, DType::Bool, Category::Temporary)?;
        self.launch("dropout", &[x], &[out])?;
        self.record("dropout", &[x], &[out], &[]);
        match self.info(out).grad_fn {
            Some(node) => {
                self.recategorize(mask, Category::Activation);
                self.save_extra(node, mask);
            }
            None => self.release(mask),
        }
        Ok(out)
    }

    /// `x.masked_fill(mask, value)`: keeps the mask.
    pub fn masked_fill(&mut self, x: TensorId, mask: TensorId) -> Result<TensorId, EngineError> {
        let shape = broadcast(self.shape(x), self.shape(mask))?;
        let out = self.empty(&shape, self.dtype(x), Category::Temporary)?;
        self.launch("masked_fill", &[x, mask], &[out])?;
        self.record("masked_fill", &[x, mask], &[out], &[Save::Input(1)]);
        Ok(out)
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
        let lsm = self.softmax("log_softmax", logits, 1)?;
        let dtype = self.dtype(logits);
        let loss = self.empty(&[], dtype, Category::Temporary)?;
        let total_weight = self.empty(&[], dtype, Category::Temporary)?;
        self.launch("nll_loss", &[lsm, target], &[loss])?;
        self.record("nll_loss", &[lsm, target], &[loss], &[Save::Input(1)]);
        match self.info(loss).grad_fn {
            Some(node) => {
                self.recategorize(total_weight, Category::Activation);
                self.save_extra(node, total_weight);
            }
            None => self.release(total_weight),
        }
        self.release(lsm);
        Ok(loss)
    }

    /// `scaled_dot_product_attention(q, k, v, is_causal=True)` on [B, H, T, D] inputs, as
    /// PyTorch 2.11 runs it on an H200 (the traces in fixtures/models show which kernel):
    /// float32 inputs take the memory-efficient kernel (output, and a logsumexp of
    /// [B, H, T rounded up to 32] float32 kept for backward); bf16/f16 inputs take cuDNN's
    /// (an 8-byte philox seed and offset first, then the output, then a [B, H, T] float32
    /// statistic, and a 256-byte scratch freed at once). Both lay the output out as
    /// [B, T, H, D] in memory, so `out.transpose(1, 2).contiguous()` copies nothing.
    pub fn sdpa(&mut self, q: TensorId, k: TensorId, v: TensorId) -> Result<TensorId, EngineError> {
        let sq = self.shape(q).to_vec();
        if sq.len() != 4 || self.shape(k).len() != 4 || self.shape(v).len() != 4 {
            return Err(EngineError::Invalid(
                "scaled_dot_product_attention expects [B, H, L, D] tensors".into(),
            ));
        }
        let (b, h, t, dv) = (sq[0], sq[1], sq[2], self.shape(v)[3]);
        let dtype = self.dtype(q);
        let cudnn = dtype != DType::F32;
        let need = self.grad_enabled && [q, k, v].iter().any(|&t| self.info(t).requires_grad);
        let mut extra = Vec::new();
        if cudnn {
            for _ in 0..2 {
                extra.push(self.empty(&[], DType::I64, Category::Temporary)?);
            }
        }
        // allocated as [B, T, H, D], seen as its transpose [B, H, T, D]
        let out = self.empty(&[b, t, h, dv], dtype, Category::Temporary)?;
        let seen = self.info(out).layout.transpose(1, 2)?;
        self.info_mut(out).layout = seen;
        let lse_len = if cudnn { t } else { t.div_ceil(32) * 32 };
        extra.push(self.empty(&[b, h, lse_len], DType::F32, Category::Temporary)?);
        if cudnn {
            let scratch = self.empty(&[256], DType::U8, Category::Temporary)?;
            self.release(scratch);
        }
        let op = if cudnn {
            "sdpa_cudnn"
        } else {
            "sdpa_efficient"
        };
        self.launch(op, &[q, k, v], &[out])?;
        if !need {
            for e in extra {
                self.release(e);
            }
            return Ok(out);
        }
        self.record(
            op,
            &[q, k, v],
            &[out],
            &[Save::Input(0), Save::Input(1), Save::Input(2), Save::Output],
        );
        let node = self.info(out).grad_fn.expect("recorded");
        for e in extra {
            self.recategorize(e, Category::Activation);
            self.save_extra(node, e);
        }
        // the memory-efficient kernel's node frees its logsumexp before its output
        if !cudnn {
            let n = self.node_mut(node);
            if n.saved.len() == 5 {
                n.saved.swap(3, 4);
                n.saved_versions.swap(3, 4);
            }
        }
        Ok(out)
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
        let y = d.layer_norm(x, Some(w), None).unwrap();
        // x (an input) is saved as it is; mean and rstd are float32 per row (8192 rows)
        assert_eq!(activation(&d), 2 * 8192 * 4);
        assert_eq!(d.saved_tensors(), 4, "x, w, mean, rstd");
        d.release(y);
        assert_eq!(activation(&d), 0);
        d.grad_enabled = false;
        let y = d.layer_norm(x, Some(w), None).unwrap();
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
