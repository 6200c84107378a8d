//! Ops: output shapes, allocations and what autograd keeps, op by op.
//!
//! Each op states its memory behaviour in one place: the output it allocates (or the view it
//! makes), and what its backward needs saved (PyTorch's `derivatives.yaml`). The simulated
//! device computes nothing, so an op is its shape function plus these facts; the data-carrying
//! backends will add kernels beside them without changing the engine.

use super::autograd::Save;
use super::dtype::DType;
use super::layout::{Dims, Layout, LayoutError};
use super::tensor::{Category, EngineError, TensorId, Tensors};
use crate::alloc::SegmentSource;

/// The cuBLAS workspace PyTorch takes from the caching allocator at the first matrix product
/// on a stream (`CUBLAS_WORKSPACE_CONFIG` default `:4096:8` on Hopper), kept for the process.
pub const CUBLAS_WORKSPACE: u64 = 8 * 4096 * 1024;

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
        }
    }

    /// derivatives.yaml: sin/cos/gelu need the input; exp/relu/sigmoid/tanh the result.
    fn saves(self) -> &'static [Save] {
        match self {
            Unary::Neg => &[],
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
        self.set_requires_grad(t, requires_grad);
        Ok(t)
    }

    pub fn unary(&mut self, op: Unary, x: TensorId) -> Result<TensorId, EngineError> {
        let (shape, dtype) = (self.shape(x).to_vec(), self.dtype(x));
        let out = self.empty(&shape, dtype, Category::Temporary)?;
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
        self.record(op.name(), &[a, b], &[out], op.saves());
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
        let mut shape = broadcast(ba, bb)?;
        shape.extend(n);
        shape.extend(m);
        self.ensure_cublas_workspace()?;
        let dtype = promote(self.dtype(a), self.dtype(b));
        let out = self.empty(&shape, dtype, Category::Temporary)?;
        self.record(
            "matmul",
            &[a, b],
            &[out],
            &[Save::InputFor(1, 0), Save::InputFor(0, 1)],
        );
        Ok(out)
    }

    fn ensure_cublas_workspace(&mut self) -> Result<(), EngineError> {
        if self.workspace.is_none() {
            let w = self.empty(&[CUBLAS_WORKSPACE as usize], DType::U8, Category::Workspace)?;
            self.workspace = Some(w);
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
        self.record(op, &[x], &[out], &[Save::Output]);
        Ok(out)
    }

    /// A view op (`view`, `t`, `transpose`, `permute`, `expand`, `select`, slicing...): a new
    /// layout over the same storage. With grad, its node keeps nothing and its backward passes
    /// the gradient through (`view`, `t`...) or scatters it into a new input-sized buffer
    /// (`slice`, `select`, `expand`'s sum).
    pub fn view_op(&mut self, op: &'static str, x: TensorId, layout: Layout) -> TensorId {
        let out = self.view_with(x, layout);
        self.record(op, &[x], &[out], &[]);
        if let Some(n) = self.info(out).grad_fn {
            self.node_mut(n).passthrough = matches!(
                op,
                "view" | "reshape" | "t" | "transpose" | "permute" | "unsqueeze"
            );
        }
        out
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
        self.record("clone", &[x], &[out], &[]);
        if let Some(n) = self.info(out).grad_fn {
            self.node_mut(n).passthrough = true;
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
    use crate::alloc::{AllocConf, SimAllocator, SimSource};
    use crate::units::GIB;

    fn dev() -> Tensors<SimSource> {
        Tensors::new(SimAllocator::new(
            AllocConf::default(),
            SimSource::new(24 * GIB, 0),
        ))
    }

    fn allocated(d: &Tensors<SimSource>) -> i64 {
        d.alloc.stats().allocated_bytes.all().current
    }

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
        let cat = |d: &Tensors<SimSource>, c: Category| d.by_category().into_iter().find(|(k, _)| *k == c).unwrap().1;
        assert_eq!(cat(&d, Category::Activation), 64 * 256 * 4, "the relu output, saved for backward, is an activation");
        assert_eq!(cat(&d, Category::Workspace), CUBLAS_WORKSPACE);
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
