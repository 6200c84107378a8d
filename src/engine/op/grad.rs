//! What a node's backward allocates beyond one fresh gradient per input, per op family: the
//! products' reshaped rows, order and views (cuBLAS's mm/bmm/addmm derivatives), attention's
//! gradient layout and its kernels' workspaces, softmax's temporary. The engine's backward
//! ([`crate::engine::autograd`]) carries out a [`GradPlan`] and knows no op by name.

use super::{Meta, Op};
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
    /// The q, k and v gradients are written as [B, T, H, D] and handed back transposed to
    /// the inputs' [B, H, T, D] (the attention kernels).
    pub bthd: bool,
    /// A matrix product: the autograd thread's first takes its own cuBLAS workspace, right
    /// after that product's first gradient (backward's products are plain mm: no cuBLASLt).
    pub cublas: bool,
    /// The input whose gradient sums the incoming one over its rows (a linear's bias): the
    /// reduction's scratch ([`crate::engine::workspace`]).
    pub column_sum: Option<usize>,
    /// The kernel's scratch after the gradients, in order; all of it is freed before the
    /// backward returns.
    pub scratch: Vec<Step>,
}

fn alloc(shape: Vec<usize>, dtype: DType, category: Category) -> Step {
    Step::Alloc {
        shape,
        dtype,
        category,
    }
}

impl Op {
    /// The plan of its backward, given its inputs' shapes and dtypes and the incoming
    /// gradient's shape and dtype.
    pub fn grad_plan(&self, inputs: &[Meta], grad: &Meta) -> GradPlan {
        let (gshape, gdtype) = (&grad.0, grad.1);
        match self {
            Op::Matmul => {
                let batched = inputs.len() == 2 && inputs.iter().all(|(s, _)| s.len() >= 3);
                let nd = gshape.len();
                GradPlan {
                    rows: batched.then(|| {
                        let prod: usize = gshape[..nd - 2].iter().product();
                        vec![prod as i64, gshape[nd - 2] as i64, gshape[nd - 1] as i64]
                    }),
                    reversed: batched,
                    cublas: true,
                    ..GradPlan::default()
                }
            }
            Op::Linear => GradPlan {
                // a linear over [..., k] folds its leading dimensions into rows
                rows: (gshape.len() >= 3).then(|| vec![-1, gshape[gshape.len() - 1] as i64]),
                reversed: inputs.len() == 2,
                through_t: Some(1),
                cublas: true,
                column_sum: Some(2),
                ..GradPlan::default()
            },
            Op::Softmax { log: false, .. } => GradPlan {
                // grad * output, into a temporary first
                scratch: vec![
                    alloc(gshape.clone(), gdtype, Category::Temporary),
                    Step::Free(0),
                ],
                ..GradPlan::default()
            },
            Op::Sdpa { cudnn } => {
                let elems: usize = gshape.iter().product();
                let rows = gshape[..gshape.len().saturating_sub(1)].to_vec();
                let nrows: usize = rows.iter().product();
                let scratch = if *cudnn {
                    // cuDNN's workspace: a float32 accumulator for the query gradient, a
                    // float32 word per query row, and 256 bytes (B*H*T*D*4 + B*H*T*4 + 256 in
                    // the H200 traces)
                    vec![
                        alloc(
                            vec![elems * 4 + nrows * 4 + 256],
                            DType::U8,
                            Category::Workspace,
                        ),
                        Step::Free(0),
                    ]
                } else {
                    // the memory-efficient kernel computes delta = (grad_out * out).sum(-1): a
                    // product the size of the output and a [B, H, T] float32 sum, copied; the
                    // sum and the product go at once. Then its float32 workspace per batch
                    // and head: a query-gradient accumulator of T rows by the head size
                    // rounded up to 64, and 4 words per block of 64 queries; it goes before
                    // the kernel returns, after the copy.
                    let nd = gshape.len();
                    let bh: usize = gshape[..nd.saturating_sub(2)].iter().product();
                    let (t, d) = (gshape[nd - 2], gshape[nd - 1]);
                    let per_bh = t * d.div_ceil(64) * 64 + 4 * t.div_ceil(64);
                    vec![
                        alloc(gshape.clone(), DType::F32, Category::Temporary),
                        alloc(rows.clone(), DType::F32, Category::Temporary),
                        alloc(rows, DType::F32, Category::Temporary),
                        Step::Free(1),
                        Step::Free(0),
                        alloc(vec![bh * per_bh], DType::F32, Category::Workspace),
                        Step::Free(2),
                        Step::Free(3),
                    ]
                };
                GradPlan {
                    bthd: true,
                    scratch,
                    ..GradPlan::default()
                }
            }
            _ => GradPlan::default(),
        }
    }
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
            Op::Sdpa { cudnn: true },
            Op::Sdpa { cudnn: false },
            Op::Softmax {
                dim: -1,
                log: false,
            },
        ] {
            let plan = op.grad_plan(&ins, &g);
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
        let lin = Op::Linear.grad_plan(&[g.clone(), (vec![8, 32], DType::F32)], &g);
        assert_eq!(lin.rows, Some(vec![-1, 32]));
        assert!(lin.reversed && lin.cublas);
    }
}
