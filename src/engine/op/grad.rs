//! What a node's backward allocates beyond one fresh gradient per input: a [`GradPlan`], which
//! each family makes for its ops (the products' reshaped rows, order and views in
//! [`super::product`], attention's gradient layout and workspaces in [`super::attention`],
//! softmax's temporary in [`super::softmax`]). The engine's backward
//! ([`crate::engine::autograd`]) carries a plan out and knows no op by name.

use super::{Meta, MetaRef, Op};
use crate::engine::dtype::DType;
use crate::trace::Category;

/// One step of a backward kernel's scratch, in order: an allocation (numbered by its place
/// among the plan's allocations) or the free of one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Alloc {
        shape: Vec<usize>,
        dtype: DType,
        category: Category,
    },
    Free(usize),
}

/// One step of a derivative formula that runs several ops for one input's gradient: a
/// temporary (numbered by its place among the formula's temporaries), the gradient itself,
/// or the free of a temporary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FStep {
    Temp(Meta),
    Grad,
    Free(usize),
}

/// The derivative of one input, as the node computes it (`mul`: `grad * other`; `pow`:
/// `grad * (e * x.pow(e - 1))`, two temporaries around it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Formula {
    pub slot: usize,
    pub steps: Vec<FStep>,
    /// The gradient is made in this (broadcast) shape and dtype and fitted to the input's after
    /// the node returns (the engine's `validate_outputs`): summed to its shape (the sum's
    /// output, the reduction's scratch, then the full-size one freed), then cast to its dtype.
    pub full: Option<Meta>,
}

impl Formula {
    /// A formula that makes the gradient with nothing around it.
    pub fn plain(slot: usize) -> Formula {
        Formula {
            slot,
            steps: vec![FStep::Grad],
            full: None,
        }
    }

    /// The gradient after `temps` temporaries of `meta`, which go (last first) after it.
    pub fn around(slot: usize, meta: &Meta, temps: usize) -> Formula {
        let mut steps: Vec<FStep> = (0..temps).map(|_| FStep::Temp(meta.clone())).collect();
        steps.push(FStep::Grad);
        steps.extend((0..temps).rev().map(FStep::Free));
        Formula {
            slot,
            steps,
            full: None,
        }
    }
}

/// How a node's backward makes its gradients (the default: one fresh gradient per input,
/// in input order, nothing else).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GradPlan {
    /// The incoming gradient reshaped to these sizes first, as the product saw its rows: a
    /// copy (freed at once, its own node in PyTorch) when its strides do not allow a view.
    pub rows: Option<Vec<i64>>,
    /// The gradients made last input first (bmm's and mm's derivatives make the second
    /// operand's first; addmm makes the input's first).
    pub reversed: bool,
    /// The input whose gradient reaches it through `t()`: a view whose base lives as long
    /// as it does (a linear's weight). Its gradient is also the saved input's last use, so a
    /// checkpointed region hands the recomputed input back right after it.
    pub through_t: Option<usize>,
    /// The inputs whose gradient reaches them through a reshape of the product's output (a
    /// 3-D input folded to 2-D rows, a batched operand folded for `bmm`): a view that holds
    /// its base, so a second gradient for the same input is summed out of place.
    pub reshaped: Vec<usize>,
    /// The q, k and v gradients are written as [B, T, H, D] and handed back transposed to
    /// the inputs' [B, H, T, D] (the attention kernels).
    pub bthd: bool,
    /// Each 4-D gradient is laid out in its input's dimension order (cuDNN's attention
    /// backward, `alloc_with_matching_layout` from the saved q, k and v).
    pub like_inputs: bool,
    /// A matrix product: the autograd thread's first takes its own cuBLAS workspace, right
    /// after that product's first gradient (backward's products are plain mm: no cuBLASLt).
    pub cublas: bool,
    /// The input whose gradient sums the incoming one over its rows (a linear's bias): the
    /// reduction's scratch ([`crate::engine::workspace`]).
    pub column_sum: Option<usize>,
    /// The kernel's scratch after the gradients, in order; all of it is freed before the
    /// backward returns.
    pub scratch: Vec<Step>,
    /// The kernel writes a gradient for each of its first this many inputs, needed or not
    /// (cuDNN's attention backward: a frozen key's too, never the mask's); those no input
    /// takes go right after the scratch.
    pub every_input: usize,
    /// Scratch each gradient's own kernel takes and gives back right after making it (a bf16
    /// grouped_mm's CUTLASS arguments and workspace), for every gradient made.
    pub each_scratch: Vec<Step>,
    /// The input whose gradient is laid out as the input is, a view with its last two
    /// dimensions transposed (grouped_mm's weight, a parameter's `transpose(-2, -1)`): made
    /// contiguous with those two swapped, then viewed transposed.
    pub swapped: Option<usize>,
    /// Derivatives made of several ops, in the order the node computes them (empty: one
    /// fresh gradient per input, as above). Only the inputs that need a gradient run theirs.
    pub formulas: Vec<Formula>,
}

impl Op {
    /// The plan of its backward, given its inputs' shapes and dtypes and the incoming
    /// gradient's shape and dtype.
    pub fn grad_plan(&self, inputs: &[Meta], grad: MetaRef) -> GradPlan {
        match self {
            Op::Matmul | Op::Linear | Op::Addmm => super::product::grad_plan(self, inputs, grad),
            Op::Softmax { log: false, .. } => super::softmax::grad_plan(grad),
            Op::Sdpa { cudnn, .. } => super::attention::grad_plan(*cudnn, inputs, grad),
            Op::Binary(super::Binary::Mul) => mul_plan(inputs, grad),
            Op::Embedding { strided } => super::nn::grad_plan(inputs, grad, *strided),
            Op::Gather | Op::GroupedMm { .. } => super::routing::grad_plan(self, inputs),
            Op::Binary(super::Binary::Div) => div_plan(inputs, grad),
            Op::Conv2d(_) => super::vision::grad_plan(self, inputs),
            Op::Unary(super::Unary::Rsqrt) => GradPlan {
                formulas: vec![Formula::around(0, &inputs[0], 2)],
                ..GradPlan::default()
            },
            Op::Unary(super::Unary::Sqrt) => GradPlan {
                formulas: vec![Formula::around(0, &inputs[0], 1)],
                ..GradPlan::default()
            },
            Op::Pow { exponent } if *exponent != 0.0 => GradPlan {
                formulas: vec![Formula::around(0, &inputs[0], 2)],
                ..GradPlan::default()
            },
            _ => GradPlan::default(),
        }
    }
}

/// `a * b`: derivatives.yaml's `grad * b` and `grad * a`, the second operand's made first (as
/// the H200 traces show: a SwiGLU's `up` gradient comes before the gate's); a broadcast
/// operand's is made in the product's shape and summed back.
fn mul_plan(inputs: &[Meta], grad: MetaRef) -> GradPlan {
    let formula = |slot: usize| {
        let mut f = Formula::plain(slot);
        // `grad * other` in the wider dtype (a bf16 input times a float32 one gives a float32
        // gradient, cast back to bf16 after)
        let dtype = super::promote(grad.1, inputs[1 - slot].1);
        if inputs[slot].0 != grad.0 || inputs[slot].1 != dtype {
            f.full = Some((grad.0.to_vec(), dtype));
        }
        f
    };
    GradPlan {
        formulas: vec![formula(1), formula(0)],
        ..GradPlan::default()
    }
}

/// `a / b`: derivatives.yaml's `-grad * ((a / b) / b)` for `b` first (three temporaries of
/// the product's shape, the negated gradient last, given back last made first), then `grad /
/// b` for `a`; a broadcast operand's made in the product's shape and summed back after the
/// node returns (the H200 traces of Mixtral's router: `top /= top.sum(-1, keepdim=True)`).
fn div_plan(inputs: &[Meta], grad: MetaRef) -> GradPlan {
    let full = |slot: usize| {
        let dtype = super::promote(inputs[0].1, inputs[1].1);
        (inputs[slot].0 != grad.0 || inputs[slot].1 != dtype).then(|| (grad.0.to_vec(), dtype))
    };
    let meta = (grad.0.to_vec(), super::promote(inputs[0].1, inputs[1].1));
    let mut other = Formula::around(1, &meta, 3);
    other.full = full(1);
    let mut this = Formula::plain(0);
    this.full = full(0);
    GradPlan {
        formulas: vec![other, this],
        ..GradPlan::default()
    }
}

/// The dimensions along which a gradient of `full` shape is summed to `to`'s (leading ones,
/// and those `to` has as 1).
pub fn sum_to_dims(full: &[usize], to: &[usize]) -> Vec<usize> {
    let lead = full.len().saturating_sub(to.len());
    (0..full.len())
        .filter(|&d| d < lead || (to[d - lead] == 1 && full[d] != 1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every plan frees what it allocates, once, and only after allocating it.
    #[test]
    fn scratch_plans_free_everything_they_take() {
        let g = (vec![2, 12, 64, 32], DType::F32);
        let ins = vec![g.clone(), g.clone(), g.clone()];
        for op in [
            Op::Sdpa {
                cudnn: true,
                gqa: false,
                dropout: 0.0,
                seed: 0,
                causal: true,
            },
            Op::Sdpa {
                cudnn: false,
                gqa: false,
                dropout: 0.0,
                seed: 0,
                causal: true,
            },
            Op::Softmax {
                dim: -1,
                log: false,
                safe: false,
            },
        ] {
            let plan = op.grad_plan(&ins, (&g.0, g.1));
            let mut live = Vec::new();
            let mut n = 0;
            for s in &plan.scratch {
                match s {
                    Step::Alloc { .. } => {
                        live.push(n);
                        n += 1;
                    }
                    Step::Free(k) => {
                        let at = live.iter().position(|x| x == k).expect("freed once, after");
                        live.remove(at);
                    }
                }
            }
            assert!(live.is_empty(), "{}: {live:?} left", op.name());
        }
        let lin = Op::Linear.grad_plan(&[g.clone(), (vec![8, 32], DType::F32)], (&g.0, g.1));
        assert_eq!(lin.rows, Some(vec![-1, 32]));
        assert!(lin.reversed && lin.cublas);
    }
}
