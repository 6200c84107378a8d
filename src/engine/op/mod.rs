//! Every op the engine runs, defined once: its name (the tag its allocations carry and the
//! `<name>_backward` tag of its gradient), its typed attributes, its kernel names (shared by
//! every backend: the CPU kernels in `backend::cpu` and the `.cu` kernels in `kernels/`), its
//! autocast policy, what its backward keeps, how its outputs and extra buffers are sized, and
//! what its backward makes of the incoming gradient.
//!
//! This module is plain data: it knows no tensors and no device. The engine reads it to
//! allocate, record and free ([`crate::engine::exec`]), backends read it to compute, and the
//! script language reads [`script`] to know which functions and methods exist.
//!
//! Families, each in its module with its script functions: [`elementwise`] (unary, binary,
//! scalar, in-place, factories), [`product`] (matmul, linear), [`norm`], [`softmax`] (and the
//! cross-entropy loss), [`attention`], [`nn`] (embedding, dropout, masked_fill), [`view`]
//! (views, split, contiguous, clone, cat, pad), [`reduce`] (sum, mean), [`cast`], [`routing`]
//! (a mixture of experts' topk, sort, row gathers, histc and grouped_mm), the optimizer updates
//! ([`optim`]), [`vision`] (conv2d with cuDNN's measured workspaces in [`cudnn_conv`], batch
//! norm, the pools); the gradient plumbing backward needs (copies, sums, concatenation) is here. What a
//! backward allocates beyond its gradients is each family's [`grad::GradPlan`].

pub mod attention;
pub mod cast;
pub mod cudnn_conv;
pub mod elementwise;
pub mod grad;
pub mod nn;
pub mod norm;
pub mod optim;
pub mod product;
pub mod reduce;
pub mod routing;
pub mod script;
pub mod softmax;
pub mod view;
pub mod vision;

pub use elementwise::{Binary, Fill, InPlace, Unary};
pub use grad::{FStep, Formula, GradPlan, Step};
pub use norm::Norm;
pub use optim::{Hyper, LowBit, OptimKind, OptimStep};
pub use view::ViewKind;

use super::dtype::DType;
use super::layout::{Dims, Layout, LayoutError};

/// What an op's backward needs kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Save {
    /// Input `i`.
    Input(usize),
    /// Input `i`, only if input `j` requires grad (`a * b` keeps `b` for `a`'s gradient).
    InputFor(usize, usize),
    /// The op's output (saved without its grad_fn).
    Output,
}

/// Which of an op's tensors a saved tensor is, for its backward kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Input(usize),
    Output,
    /// The op's `k`-th extra output (layer_norm's mean then rstd, dropout's mask, a loss's
    /// total weight, attention's statistics).
    Extra(usize),
    /// Held for a checkpoint region (an argument of its function), used by no kernel.
    Held,
}

/// What a node's backward does with the incoming gradient, as PyTorch's derivative formulas do
/// for memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Back {
    /// A fresh gradient per differentiable input, contiguous in the input's shape.
    Alloc,
    /// The gradient itself, as it is (`clone`, `contiguous`, `expand` to the same shape).
    Pass,
    /// `grad.reshape(input shape)` (`view`, `reshape`, `unsqueeze`): a view when the
    /// gradient's strides allow, else a copy.
    Reshape,
    /// The gradient permuted back (`t`, `transpose`, `permute`: output dim i was input dim
    /// `perm[i]`): always a view.
    Permute(Vec<usize>),
    /// `a + b`: the gradient itself for an input of the same shape and dtype, a cast copy for
    /// one of another dtype, a sum for a broadcast one.
    Add,
    /// `split`/`chunk`: once every part's gradient is in (zeros for those with none), one
    /// `cat` into the input's shape.
    Split,
    /// `cat` along the dimension: each input's gradient is a slice of the incoming one (a
    /// view).
    Cat(i64),
    /// `sum(dims, keepdim)` over some dimensions: the gradient expanded back to the input's
    /// shape, a view (stride 0 along the summed dimensions), as `sum_backward` returns it; a
    /// second gradient for the same tensor adds into the first in place (the engine's
    /// input buffer), a consumer that needs it dense copies it.
    Expand {
        dims: reduce::DimList,
        keepdim: bool,
    },
}

/// What autocast does to an op's floating inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CastPolicy {
    /// Run in the region's dtype (bf16/f16): matmul, linear, attention.
    Lower,
    /// Run in float32: softmax, log_softmax, the norms, losses.
    Float32,
}

/// How a view was made from its input, for the backward of views that are not plain reshapes
/// (`index`, `select`, slicing, `expand`): the view's layout over a contiguous tensor of the
/// input's shape, through which the gradient is scattered (and summed, where strides are 0).
pub type RelLayout = Layout;

/// Every op, with its attributes.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// A factory: `randn`, `zeros`, `full`, `arange`... `seed` numbers the factory call, so a
    /// data device draws the same numbers for the same workload.
    Fill {
        fill: Fill,
        seed: u64,
    },
    Unary(Unary),
    Binary(Binary),
    /// `x.pow(exponent)` / `x ** exponent` with a Python number.
    Pow {
        exponent: f64,
    },
    /// A tensor and a Python scalar: `x * 0.5`, `loss / 4`; `reversed` for `2 - x`.
    Scalar {
        op: Binary,
        value: f64,
        reversed: bool,
    },
    /// `x.masked_fill(mask, value)`.
    MaskedFill {
        value: f64,
    },
    /// `x.to(dtype)` (and autocast's casts): the output's dtype is the target.
    Cast,
    /// `F.dropout(x, p)` in training; the mask is drawn from `seed`, so a recomputation (a
    /// checkpoint) draws the same one, as PyTorch's saved RNG state does.
    Dropout {
        p: f64,
        seed: u64,
    },
    /// `a @ b` (`torch.matmul`), batched and broadcast.
    Matmul,
    /// `F.linear(x, w, b)`.
    Linear,
    /// `torch.addmm(b, x, w)`: `x @ w + b` with `w` as [in, out] (GPT-2's `Conv1D`); its
    /// inputs are held as `[x, w, b]`, the order of its gradients.
    Addmm,
    /// The normalizations ([`norm`]).
    Norm(Norm),
    /// `softmax(dim)` / `log_softmax(dim)`; `safe`: `_safe_softmax` (SDPA's math path: 0 for
    /// a fully masked row, found with temporaries).
    Softmax {
        dim: i64,
        log: bool,
        safe: bool,
    },
    /// `torch.cat(tensors, dim)`.
    Cat {
        dim: i64,
    },
    /// `torch.where(cond, x, y)`, broadcast.
    Where,
    /// A comparison (`le`, `lt`, `ge`, `gt`, `eq`, `ne`) with a tensor (broadcast) or a number:
    /// a bool result (no gradient).
    Compare {
        cmp: Cmp,
        scalar: Option<f64>,
    },
    /// `cumsum(dim, dtype=None)`: an integer or bool input sums in int64 (its int64 copy
    /// taken and freed inside, after the output), unless `dtype` names the result's type
    /// (the input taken as it is when it has that type).
    Cumsum {
        dim: i64,
        dtype: Option<DType>,
    },
    /// `all()` / `any()` (over everything, or one dimension): a bool result.
    Logical {
        any: bool,
        dim: Option<i64>,
    },
    /// `F.pad(x, pads, value=...)` (constant): `pads` from the last dimension inwards.
    Pad {
        pads: Vec<i64>,
        value: f64,
    },
    /// `bitwise_and` / `bitwise_or` of integer or bool tensors, broadcast (the wider integer
    /// type; no gradient).
    Bitwise {
        or: bool,
    },
    /// `torch.isin(elements, test_elements)`: a bool of the elements' shape. PyTorch's CUDA
    /// kernel for a few test elements compares every pair (`elements.unsqueeze(-1) ==
    /// test_elements`) and reduces with `any(-1)`, both temporaries freed inside.
    Isin,
    /// `argmax(dim, keepdim)`: int64 indices of the largest element (over everything, or
    /// along `dim`).
    Argmax {
        dim: Option<i64>,
        keepdim: bool,
    },
    /// `max()`: the largest element, a 0-dim tensor of the input's dtype.
    Max,
    /// `sum()` / `mean()`, over everything, one dimension or several.
    Reduce {
        mean: bool,
        dims: reduce::DimList,
        keepdim: bool,
    },
    /// `F.embedding(idx, table)`; `strided`: the indices are not contiguous (an expanded
    /// `token_type_ids`), so the backward's `indices.contiguous()` copies them first.
    Embedding {
        strided: bool,
    },
    /// `nll_loss(log_probs [N, C], target [N])`, mean reduction (cross_entropy's second half).
    NllLoss,
    /// `scaled_dot_product_attention(q, k, v, is_causal=True)`: cuDNN's kernel for bf16/f16,
    /// the memory-efficient one for float32.
    Sdpa {
        cudnn: bool,
        /// `enable_gqa=True`: fewer key/value heads than query heads, each serving a group.
        gqa: bool,
        /// `dropout_p` (applied to the probabilities in the kernel, from `seed`: no
        /// allocation of its own).
        dropout: f64,
        seed: u64,
        /// `is_causal` (an encoder's attention is not: BERT).
        causal: bool,
    },
    /// A view: a new layout over the same storage. `kind` is PyTorch's op name; `rel` is the
    /// view over a contiguous tensor of the input's shape, through which the backward of an
    /// `index`, slice or `expand` scatters (and sums) the gradient.
    View {
        kind: ViewKind,
        rel: RelLayout,
    },
    /// `split(size, dim)` / `chunk(n, dim)`: views of the parts.
    Split {
        chunk: bool,
        dim: usize,
    },
    /// `clone()` (and `contiguous()` of a non-contiguous tensor): a contiguous copy.
    Clone,
    /// In-place ops; the second input, where there is one, is the operand.
    InPlace(InPlace),
    /// Backward's copy of a gradient into a new layout or dtype.
    Copy,
    /// `outs[0] += ins[0]`: a gradient summed into another (same shape).
    Accumulate,
    /// The sum of `ins[0]` over the dimensions it was broadcast along, into `outs[0]`'s shape
    /// (and dtype): an operand's gradient after broadcasting.
    SumTo,
    /// One parameter's optimizer update.
    OptimStep(OptimStep),
    /// `F.conv2d` ([`vision`]); inputs `[x, weight]` or `[x, weight, bias]`.
    Conv2d(vision::Conv),
    /// `F.batch_norm` ([`vision`]); inputs `[x, weight, bias, running_mean, running_var]`.
    BatchNorm(vision::BatchNorm),
    /// `F.max_pool2d` ([`vision`]): the output, then its int64 indices (an extra).
    MaxPool2d(vision::Pool),
    /// `F.adaptive_avg_pool2d` to `[h, w]`.
    AdaptiveAvgPool2d {
        out: [usize; 2],
    },
    /// `torch.topk(x, k, dim)` ([`routing`]): the values, then the int64 indices (an extra
    /// the caller gets too).
    Topk {
        k: usize,
        dim: i64,
    },
    /// `torch.sort(x, dim)`: the values, then the int64 indices (an extra the caller gets).
    Sort {
        dim: i64,
    },
    /// `x[idx]` with a 1-D integer tensor: rows of `x`.
    Gather,
    /// `x[idx] = values` (rows) outside autograd: nothing allocated.
    IndexPut,
    /// `torch.histc(x, bins, min, max)`.
    Histc {
        bins: usize,
        min: f64,
        max: f64,
    },
    /// `x // value` with a Python number.
    FloorDiv {
        value: f64,
    },
    /// `x.clamp(min, max)` with Python numbers (outside autograd).
    Clamp {
        min: f64,
        max: f64,
    },
    /// `torch.bincount(x, minlength=bins)` of a 1-D integer tensor whose values are below
    /// `bins` (the output's length).
    Bincount {
        bins: usize,
    },
    /// `torch._grouped_mm(x, w, offs)`; `w_t`: the weight is a view with its last two
    /// dimensions transposed (its gradient is made in that layout).
    GroupedMm {
        w_t: bool,
    },
}

/// A comparison's operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Le,
    Lt,
    Ge,
    Gt,
    Eq,
    Ne,
}

impl Cmp {
    pub fn name(self) -> &'static str {
        match self {
            Cmp::Le => "le",
            Cmp::Lt => "lt",
            Cmp::Ge => "ge",
            Cmp::Gt => "gt",
            Cmp::Eq => "eq",
            Cmp::Ne => "ne",
        }
    }

    pub fn parse(name: &str) -> Option<Cmp> {
        [Cmp::Le, Cmp::Lt, Cmp::Ge, Cmp::Gt, Cmp::Eq, Cmp::Ne]
            .into_iter()
            .find(|c| c.name() == name)
    }

    pub fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Cmp::Le => a <= b,
            Cmp::Lt => a < b,
            Cmp::Ge => a >= b,
            Cmp::Gt => a > b,
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
        }
    }
}

/// An input's shape and dtype: what shape functions see.
pub type Meta = (Vec<usize>, DType);

/// An input's shape and dtype, borrowed (the forward's shape functions run on every op: no
/// copies).
pub type MetaRef<'a> = (&'a [usize], DType);

/// An op's extra outputs: allocated after its output, kept by its node (or freed at once when
/// no graph is recorded).
pub type Extras = Vec<Meta>;

impl Op {
    /// PyTorch's name for it: the tag of its allocations, and `<name>_backward` in backward.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Fill { .. } => "fill",
            Op::Unary(u) => u.name(),
            Op::Pow { .. } => "pow",
            Op::Binary(b) | Op::Scalar { op: b, .. } => b.name(),
            Op::MaskedFill { .. } => "masked_fill",
            Op::Cast => "to",
            Op::Dropout { .. } => "dropout",
            Op::Matmul => "matmul",
            Op::Linear => "linear",
            Op::Addmm => "addmm",
            Op::Norm(n) => n.name(),
            Op::Softmax { log: false, .. } => "softmax",
            Op::Softmax { log: true, .. } => "log_softmax",
            Op::Cat { .. } => "cat",
            Op::Where => "where",
            Op::Compare { cmp, .. } => cmp.name(),
            Op::Cumsum { .. } => "cumsum",
            Op::Logical { any: false, .. } => "all",
            Op::Logical { any: true, .. } => "any",
            Op::Pad { .. } => "pad",
            Op::Bitwise { or: false } => "bitwise_and",
            Op::Bitwise { or: true } => "bitwise_or",
            Op::Isin => "isin",
            Op::Argmax { .. } => "argmax",
            Op::Max => "max",
            Op::Reduce { mean: false, .. } => "sum",
            Op::Reduce { mean: true, .. } => "mean",
            Op::Embedding { .. } => "embedding",
            Op::NllLoss => "nll_loss",
            Op::Sdpa { cudnn: true, .. } => "sdpa_cudnn",
            Op::Sdpa { cudnn: false, .. } => "sdpa_efficient",
            Op::View { kind, .. } => kind.name(),
            Op::Split { chunk: false, .. } => "split",
            Op::Split { chunk: true, .. } => "chunk",
            Op::Clone => "clone",
            Op::InPlace(_) => "inplace",
            Op::Copy => "copy",
            Op::Accumulate => "accumulate",
            Op::SumTo => "sum_to",
            Op::OptimStep(s) => s.kind.name(),
            Op::Conv2d(_) => "conv2d",
            Op::BatchNorm(_) => "batch_norm",
            Op::MaxPool2d(_) => "max_pool2d",
            Op::AdaptiveAvgPool2d { .. } => "adaptive_avg_pool2d",
            Op::Topk { .. } => "topk",
            Op::Sort { .. } => "sort",
            Op::Gather => "index",
            Op::IndexPut => "index_put_",
            Op::Histc { .. } => "histc",
            Op::FloorDiv { .. } => "floor_divide",
            Op::Clamp { .. } => "clamp",
            Op::Bincount { .. } => "bincount",
            Op::GroupedMm { .. } => "grouped_mm",
        }
    }

    /// The kernel that runs it forward, by the name the CPU and CUDA kernels share (None for
    /// views, which run nothing).
    pub fn kernel(&self) -> Option<&'static str> {
        Some(match self {
            Op::View { .. } | Op::Split { .. } => return None,
            Op::Fill { .. } => "fill",
            Op::Unary(_) => "unary",
            Op::Pow { .. } => "pow",
            Op::Binary(_) => "binary",
            Op::Scalar { .. } => "scalar",
            Op::MaskedFill { .. } => "masked_fill",
            Op::Cast | Op::Clone | Op::Copy => "copy",
            Op::Dropout { .. } => "dropout",
            Op::Matmul | Op::Linear | Op::Addmm => "gemm",
            Op::Norm(n) => n.kernels().0,
            Op::Softmax { .. } => "softmax",
            Op::Cat { .. } => "cat",
            Op::Where => "where",
            Op::Compare { .. } => "compare",
            Op::Cumsum { .. } => "cumsum",
            Op::Logical { .. } => "reduce",
            Op::Pad { .. } => "pad",
            Op::Reduce { .. } | Op::SumTo | Op::Argmax { .. } | Op::Max => "reduce",
            Op::Bitwise { .. } => "bitwise",
            Op::Isin => "isin",
            Op::Embedding { .. } => "embedding",
            Op::NllLoss => "nll_loss",
            Op::Sdpa { .. } => "attention",
            Op::InPlace(_) => "inplace",
            Op::Accumulate => "accumulate",
            Op::OptimStep(s) => s.kind.kernel(),
            Op::Conv2d(_) => "conv2d",
            Op::BatchNorm(_) => "batch_norm",
            Op::MaxPool2d(_) => "max_pool2d",
            Op::AdaptiveAvgPool2d { .. } => "adaptive_avg_pool2d",
            Op::Topk { .. } => "topk",
            Op::Sort { .. } => "sort",
            Op::Gather => "gather_rows",
            Op::IndexPut => "index_put",
            Op::Histc { .. } => "histc",
            Op::FloorDiv { .. } => "floor_divide",
            Op::Clamp { .. } => "clamp",
            Op::Bincount { .. } => "bincount",
            Op::GroupedMm { .. } => "grouped_mm",
        })
    }

    /// The inputs its forward kernel also writes, in place, besides its outputs: batch norm in
    /// training updates its running mean and variance (inputs 3 and 4).
    pub fn written_inputs(&self) -> std::ops::Range<usize> {
        match self {
            Op::BatchNorm(bn) if bn.training => 3..5,
            _ => 0..0,
        }
    }

    /// The kernel of its backward (None where backward only moves views or runs other ops).
    pub fn backward_kernel(&self) -> Option<&'static str> {
        Some(match self {
            Op::Unary(_) => "unary_backward",
            Op::Pow { .. } => "pow_backward",
            Op::Binary(_) | Op::Scalar { .. } => "binary_backward",
            Op::MaskedFill { .. } => "masked_fill",
            Op::Cast | Op::Clone => "copy",
            Op::Dropout { .. } => "dropout_backward",
            Op::Matmul | Op::Linear | Op::Addmm => "gemm",
            Op::Norm(n) => n.kernels().1,
            Op::Softmax { .. } => "softmax_backward",
            Op::Cat { .. } => "split",
            Op::Where => "where_backward",
            Op::Pad { .. } => "pad_backward",
            Op::Reduce { .. } => "expand",
            Op::Embedding { .. } => "embedding_backward",
            Op::NllLoss => "nll_loss_backward",
            Op::Sdpa { .. } => "attention_backward",
            Op::View { .. } => "scatter_add",
            Op::Split { .. } => "cat",
            Op::Conv2d(_) => "conv2d_backward",
            Op::BatchNorm(_) => "batch_norm_backward",
            Op::MaxPool2d(_) => "max_pool2d_backward",
            Op::AdaptiveAvgPool2d { .. } => "adaptive_avg_pool2d_backward",
            Op::Topk { .. } | Op::Sort { .. } => "scatter_indices",
            Op::Gather => "index_put_accumulate",
            Op::GroupedMm { .. } => "grouped_mm_backward",
            _ => return None,
        })
    }

    /// Autocast's policy for its floating inputs (None: it runs in its inputs' dtype).
    pub fn autocast(&self) -> Option<CastPolicy> {
        match self {
            Op::Matmul | Op::Linear | Op::Addmm | Op::Sdpa { .. } | Op::Conv2d(_) => {
                Some(CastPolicy::Lower)
            }
            Op::Norm(n) => Some(n.autocast()),
            // (`pow` is on autocast's float32 list: GPT-2's `gelu_new` cubes a float32 copy)
            Op::Softmax { .. } | Op::NllLoss | Op::Pow { .. } => Some(CastPolicy::Float32),
            _ => None,
        }
    }

    /// The order autocast casts its held inputs in, where that is not the reverse of how they
    /// are held (PyTorch's wrappers cast a call's arguments right to left): `torch.addmm(input,
    /// mat1, mat2)`, held as [mat1, mat2, input], casts mat2, then mat1, then input.
    pub fn autocast_order(&self) -> Option<&'static [usize]> {
        match self {
            Op::Addmm => Some(&[1, 0, 2]),
            _ => None,
        }
    }

    /// What its backward keeps, beyond its extras.
    pub fn saves(&self, inputs: usize) -> &'static [Save] {
        match self {
            Op::Unary(u) => u.saves(),
            Op::Pow { .. } => &[Save::Input(0)],
            Op::Binary(b) => b.saves(),
            Op::MaskedFill { .. } => &[Save::Input(1)],
            Op::Where => &[Save::Input(0)],
            // released in the order of the node's saved variables, which PyTorch's codegen
            // sorts by name: `mat2` before `self` (mm, bmm: the weight first), `mat1` before
            // `mat2` (addmm, a linear with a bias: the input first)
            Op::Linear if inputs == 3 => &[Save::InputFor(0, 1), Save::InputFor(1, 0)],
            Op::Addmm => &[Save::InputFor(0, 1), Save::InputFor(1, 0)],
            Op::Matmul | Op::Linear => &[Save::InputFor(1, 0), Save::InputFor(0, 1)],
            Op::Norm(n) => n.saves(inputs),
            Op::Softmax { .. } => &[Save::Output],
            Op::Embedding { .. } => &[Save::InputFor(0, 1)],
            // NllLossBackward0 keeps its input (a float32 copy under autocast) and the target
            Op::NllLoss => &[Save::Input(0), Save::Input(1)],
            Op::Sdpa { .. } if inputs == 4 => &[
                Save::Input(0),
                Save::Input(1),
                Save::Input(2),
                Save::Input(3),
                Save::Output,
            ],
            Op::Sdpa { .. } => &[Save::Input(0), Save::Input(1), Save::Input(2), Save::Output],
            Op::Conv2d(_) | Op::BatchNorm(_) | Op::MaxPool2d(_) | Op::AdaptiveAvgPool2d { .. } => {
                vision::saves(self)
            }
            Op::Gather | Op::GroupedMm { .. } => routing::saves(self),
            _ => &[],
        }
    }

    /// What its backward makes of the incoming gradient.
    pub fn back(&self, in_ndim: usize, same_shape: bool) -> Back {
        match self {
            Op::Binary(Binary::Add) => Back::Add,
            // `x + 2.0`: the gradient itself
            Op::Scalar {
                op: Binary::Add | Binary::Sub,
                reversed: false,
                ..
            } => Back::Pass,
            Op::Clone => Back::Pass,
            Op::Split { .. } => Back::Split,
            Op::Cat { dim } => Back::Cat(*dim),
            Op::View { kind, .. } => kind.back(in_ndim, same_shape),
            // (a sum over everything too: its scalar gradient expanded, as `sum_backward`
            // returns it; Mixtral's load-balancing loss on the H200)
            Op::Reduce {
                mean: false,
                dims,
                keepdim,
            } => Back::Expand {
                dims: *dims,
                keepdim: *keepdim,
            },
            _ => Back::Alloc,
        }
    }

    /// An elementwise op: its output is laid out like its inputs (TensorIterator's order,
    /// [`crate::engine::layout::elementwise_layout`]), not necessarily contiguous.
    pub fn elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_)
                | Op::Pow { .. }
                | Op::Binary(_)
                | Op::Scalar { .. }
                | Op::MaskedFill { .. }
                | Op::Where
                | Op::Compare { .. }
                | Op::Bitwise { .. }
        )
    }

    /// What the op takes and gives back before it allocates its output (bincount's minimum
    /// and maximum, read back to size it).
    pub fn pre_scratch(&self) -> Vec<Step> {
        match self {
            Op::Bincount { .. } => {
                let scalar = || Step::Alloc {
                    shape: vec![],
                    dtype: DType::I64,
                    category: crate::trace::Category::Temporary,
                };
                vec![scalar(), Step::Free(0), scalar(), Step::Free(1)]
            }
            _ => Vec::new(),
        }
    }

    /// What the op's kernel takes and gives back before it returns, after its outputs (none
    /// for most).
    pub fn forward_scratch(&self, ins: &[MetaRef]) -> Vec<Step> {
        match (self, ins.first()) {
            // cumsum of an integer or bool input: its int64 copy; a scan of a single row
            // (every other dimension 1) runs cub's device scan, whose temporary storage comes
            // from the caching allocator (the H200 traces: 1,279 bytes for 200 int64 items)
            (Op::Cumsum { dim, dtype: to }, Some((shape, dtype))) => {
                let mut steps = Vec::new();
                let copies = cumsum_copies(*dtype, *to);
                if copies {
                    steps.push(Step::Alloc {
                        shape: shape.to_vec(),
                        dtype: DType::I64,
                        category: crate::trace::Category::Temporary,
                    });
                }
                let n = super::layout::wrap_dim(*dim, shape.len())
                    .map_or(0, |d| shape.get(d).copied().unwrap_or(1));
                let numel: usize = shape.iter().product();
                if numel > 1 && numel == n {
                    let at = steps.len();
                    let width = to.unwrap_or(DType::I64).size() as usize;
                    steps.push(Step::Alloc {
                        shape: vec![nn::cub_scan_temp_width(n, nn::SCAN_TILE, width)],
                        dtype: DType::U8,
                        category: crate::trace::Category::Temporary,
                    });
                    steps.push(Step::Free(at));
                }
                if copies {
                    steps.push(Step::Free(0));
                }
                steps
            }
            (Op::Sort { .. } | Op::GroupedMm { .. }, _) => routing::forward_scratch(self, ins),
            (
                Op::Softmax {
                    safe: true, dim, ..
                },
                Some(x),
            ) => softmax::safe_scratch(*x, *dim),
            (Op::Isin, Some(x)) => {
                let n: usize = x.0.iter().product();
                let k: usize = ins.get(1).map_or(1, |t| t.0.iter().product());
                let bools = |len: usize| Step::Alloc {
                    shape: vec![len],
                    dtype: DType::Bool,
                    category: crate::trace::Category::Temporary,
                };
                vec![bools(n * k), bools(n), Step::Free(1), Step::Free(0)]
            }
            (Op::Reduce { dims, .. }, Some(x)) => reduce::sum_scratch(*x, *dims),
            (Op::Argmax { dim, .. }, Some(x)) => reduce::arg_scratch(*x, *dim, 16),
            (Op::Max, Some(x)) => reduce::arg_scratch(*x, None, reduce::acc_bytes(x.1)),
            (Op::Conv2d(_), _) => vision::forward_scratch(self, ins),
            _ => Vec::new(),
        }
    }

    /// Output shape and dtype, and the extra outputs, of the ops the engine runs by one rule
    /// (allocate the output, then the extras; run the kernel; record the node; the node keeps
    /// the extras, or they go at once). `None` for the ops with their own allocation order.
    pub fn simple_outputs(&self, ins: &[MetaRef]) -> Option<Result<(Meta, Extras), LayoutError>> {
        let first = ins.first()?;
        let same = || (first.0.to_vec(), first.1);
        let r = match self {
            Op::Unary(_) | Op::Pow { .. } | Op::Scalar { .. } | Op::Clone => Ok((same(), vec![])),
            Op::Binary(_) => {
                let b = ins.get(1)?;
                broadcast(first.0, b.0).map(|s| ((s, promote(first.1, b.1)), vec![]))
            }
            Op::MaskedFill { .. } => {
                let m = ins.get(1)?;
                broadcast(first.0, m.0).map(|s| ((s, first.1), vec![]))
            }
            Op::Dropout { .. } => Ok((same(), vec![(first.0.to_vec(), DType::Bool)])),
            Op::Norm(n) => {
                // the weight and bias cover the last dimension (PyTorch's normalized_shape)
                let d = first.0.last().copied().unwrap_or(0);
                for (m, what) in ins[1..].iter().zip(["weight", "bias"]) {
                    if m.0 != [d] {
                        return Some(Err(LayoutError(format!(
                            "Expected {what} to be of same shape as normalized_shape, but got \
                             {what} of shape {:?} and normalized_shape = [{d}]",
                            m.0
                        ))));
                    }
                }
                n.outputs(*first)
            }
            Op::Cat { dim } => {
                // the widest dtype (a cache's empty float32 buffer makes bf16 values float32)
                let dtype = ins.iter().fold(first.1, |d, m| promote(d, m.1));
                cat_shape(ins, *dim).map(|s| ((s, dtype), vec![]))
            }
            Op::Where => {
                let (x, y) = (ins.get(1)?, ins.get(2)?);
                broadcast(first.0, x.0)
                    .and_then(|s| broadcast(&s, y.0))
                    .map(|s| ((s, promote(x.1, y.1)), vec![]))
            }
            Op::Pad { pads, .. } => pad_shape(first.0, pads).map(|s| ((s, first.1), vec![])),
            Op::Compare {
                scalar: Some(_), ..
            } => Ok(((first.0.to_vec(), DType::Bool), vec![])),
            Op::Compare { scalar: None, .. } => {
                let b = ins.get(1)?;
                broadcast(first.0, b.0).map(|s| ((s, DType::Bool), vec![]))
            }
            Op::Cumsum { dim, dtype: to } => {
                super::layout::wrap_dim(*dim, first.0.len()).map(|_| {
                    let dtype = match to {
                        Some(d) => *d,
                        None if first.1.is_floating() => first.1,
                        None => DType::I64,
                    };
                    ((first.0.to_vec(), dtype), vec![])
                })
            }
            Op::Logical { dim, .. } => match dim {
                None => Ok(((Vec::new(), DType::Bool), vec![])),
                Some(d) => super::layout::wrap_dim(*d, first.0.len()).map(|d| {
                    let mut s = first.0.to_vec();
                    s.remove(d);
                    ((s, DType::Bool), vec![])
                }),
            },
            Op::Softmax { dim, .. } => {
                super::layout::wrap_dim(*dim, first.0.len()).map(|_| (same(), vec![]))
            }
            Op::Reduce {
                dims,
                keepdim,
                mean,
                ..
            } => reduce::outputs(*first, *dims, *keepdim, *mean),
            Op::Bitwise { .. } => {
                let b = ins.get(1)?;
                if first.1.is_floating() || b.1.is_floating() {
                    return Some(Err(LayoutError(format!(
                        "\"{}_cuda\" not implemented for '{}'",
                        self.name(),
                        if first.1.is_floating() { first.1 } else { b.1 }.name()
                    ))));
                }
                broadcast(first.0, b.0).map(|s| ((s, promote(first.1, b.1)), vec![]))
            }
            Op::Isin => {
                let test = ins.get(1)?;
                reduce::isin_check(first.0, test.0)
                    .map(|()| ((first.0.to_vec(), DType::Bool), vec![]))
            }
            Op::Argmax { dim, keepdim } => {
                { reduce::outputs(*first, reduce::DimList::from_dim(*dim), *keepdim, false) }
                    .map(|((s, _), e)| ((s, DType::I64), e))
            }
            Op::Max => {
                if first.0.iter().product::<usize>() == 0 {
                    return Some(Err(LayoutError(
                        "max(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.".into(),
                    )));
                }
                Ok(((Vec::new(), first.1), vec![]))
            }
            Op::Embedding { .. } => {
                let table = ins.get(1)?;
                if table.0.len() != 2 {
                    return Some(Err(LayoutError("embedding weight must be 2-D".into())));
                }
                if first.1.is_floating() {
                    return Some(Err(LayoutError(
                        "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int".into(),
                    )));
                }
                let mut shape = first.0.to_vec();
                shape.push(table.0[1]);
                Ok(((shape, table.1), vec![]))
            }
            Op::NllLoss => {
                let t = ins.get(1)?;
                let s = first.0;
                if s.len() != 2 || t.0 != [s[0]] {
                    return Some(Err(LayoutError(format!(
                        "cross_entropy expects logits [N, C] and target [N], got {} and {}",
                        Dims(s),
                        Dims(t.0)
                    ))));
                }
                let scalar = (Vec::new(), first.1);
                Ok((scalar.clone(), vec![scalar]))
            }
            Op::Conv2d(_) | Op::BatchNorm(_) | Op::MaxPool2d(_) | Op::AdaptiveAvgPool2d { .. } => {
                return vision::outputs(self, ins)
            }
            Op::Topk { .. }
            | Op::Sort { .. }
            | Op::Gather
            | Op::Histc { .. }
            | Op::FloorDiv { .. }
            | Op::Clamp { .. }
            | Op::Bincount { .. }
            | Op::GroupedMm { .. } => return routing::outputs(self, ins),
            _ => return None,
        };
        Some(r)
    }
}

/// Whether cumsum takes a copy of its input in the type it sums in: an integer or bool input
/// sums in int64 unless `to` names the type; a copy when that differs from the input's.
fn cumsum_copies(input: DType, to: Option<DType>) -> bool {
    match to {
        Some(t) => t != input,
        None => !input.is_floating() && input != DType::I64,
    }
}

/// An input `cat` skips (PyTorch's legacy rule): a 1-D tensor with no elements.
pub fn cat_skips(shape: &[usize]) -> bool {
    shape == [0]
}

/// The shape of `cat` along `dim`: the inputs agree on every other dimension (empty 1-D
/// inputs are skipped).
fn cat_shape(ins: &[MetaRef], dim: i64) -> Result<Vec<usize>, LayoutError> {
    let kept: Vec<MetaRef> = ins.iter().copied().filter(|m| !cat_skips(m.0)).collect();
    let ins = &kept[..];
    let first = ins
        .first()
        .ok_or_else(|| LayoutError("torch.cat(): expected a non-empty list of Tensors".into()))?;
    let d = super::layout::wrap_dim(dim, first.0.len())?;
    let mut out = first.0.to_vec();
    out[d] = 0;
    for (i, m) in ins.iter().enumerate() {
        let same = m.0.len() == out.len()
            && m.0
                .iter()
                .zip(&out)
                .enumerate()
                .all(|(k, (a, b))| k == d || a == b);
        if !same {
            return Err(LayoutError(format!(
                "Sizes of tensors must match except in dimension {d}. Expected {} but got {} for tensor number {i} in the list",
                Dims(first.0),
                Dims(m.0)
            )));
        }
        out[d] += m.0[d];
    }
    Ok(out)
}

/// The shape of a constant pad: `pads` pairs (before, after) from the last dimension in.
fn pad_shape(shape: &[usize], pads: &[i64]) -> Result<Vec<usize>, LayoutError> {
    if !pads.len().is_multiple_of(2) || pads.len() / 2 > shape.len() {
        return Err(LayoutError(format!(
            "Padding length must be divisible by 2 and at most twice the dimensions ({}), got {}",
            shape.len(),
            pads.len()
        )));
    }
    let mut out = shape.to_vec();
    for (k, pair) in pads.chunks(2).enumerate() {
        let d = shape.len() - 1 - k;
        let n = out[d] as i64 + pair[0] + pair[1];
        if n < 0 {
            return Err(LayoutError(format!(
                "The input size {}, plus negative padding {} and {} resulted in a negative output size",
                out[d], pair[0], pair[1]
            )));
        }
        out[d] = n as usize;
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn every_op_that_computes_names_a_kernel() {
        for u in Unary::ALL {
            assert_eq!(Op::Unary(u).kernel(), Some("unary"));
            assert!(Op::Unary(u).backward_kernel().is_some());
        }
        assert_eq!(
            Op::Sdpa {
                cudnn: false,
                gqa: false,
                dropout: 0.0,
                seed: 0,
                causal: true,
            }
            .name(),
            "sdpa_efficient"
        );
    }
}
