//! Matrix products: `matmul` (1-D, 2-D, batched and broadcast), `F.linear` and `torch.addmm`. All run in the
//! autocast dtype and keep each operand for the other's gradient; the first product takes the
//! cuBLAS (and, for a linear with bias, cuBLASLt) workspaces ([`crate::engine::workspace`]).
//! Their backward follows cuBLAS's mm/bmm/addmm derivatives ([`grad_plan`]).

use super::grad::GradPlan;
use super::script::{tensors, Bound, Entry, Form, Made, Param, X};
use super::{Meta, MetaRef, Op};
use crate::engine::TensorId;

fn make(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let inputs = tensors(b);
    if inputs.len() < 2 {
        return Err(format!("{name} expects two tensors"));
    }
    let op = match name {
        "linear" => Op::Linear,
        "addmm" => {
            // torch.addmm(input, mat1, mat2): held as [mat1, mat2, input]
            let [b, x, w] = inputs[..] else {
                return Err("addmm expects (input, mat1, mat2)".into());
            };
            return Ok(Made::Op {
                op: Op::Addmm,
                inputs: smallvec::smallvec![x, w, b],
            });
        }
        _ => Op::Matmul,
    };
    Ok(Made::Op { op, inputs })
}

/// The script functions of the family.
pub(super) static ENTRIES: &[Entry] = &[
    Entry {
        name: "matmul",
        form: Form::Both,
        params: &[X, Param::Tensor("other")],
        doc: "x @ other (1-D, 2-D, batched; the first takes the cuBLAS workspaces)",
        make,
    },
    Entry {
        name: "linear",
        form: Form::Function,
        params: &[X, Param::Tensor("weight"), Param::OptTensor("bias")],
        doc: "F.linear: x @ weight.T + bias",
        make,
    },
    Entry {
        name: "addmm",
        form: Form::Function,
        params: &[
            Param::Tensor("input"),
            Param::Tensor("mat1"),
            Param::Tensor("mat2"),
        ],
        doc: "torch.addmm: input + mat1 @ mat2 (2-D; GPT-2's Conv1D, its weight [in, out])",
        make,
    },
];

/// A product's backward: the incoming gradient as the rows the product saw (a batched
/// matmul's [batch, n, m], a linear's folded [rows, out]), the gradients of bmm and of a
/// linear made second operand first, a linear's weight gradient through `t()` and its bias
/// gradient a sum over rows.
pub(super) fn grad_plan(op: &Op, inputs: &[Meta], grad: MetaRef) -> GradPlan {
    let g = grad.0;
    let nd = g.len();
    match op {
        // addmm's derivatives: mat1's, mat2's (no `t()`: the weight is [in, out]), the bias's
        Op::Addmm => GradPlan {
            cublas: true,
            column_sum: Some(2),
            ..GradPlan::default()
        },
        Op::Linear => GradPlan {
            rows: (nd >= 3).then(|| vec![-1, g[nd - 1] as i64]),
            reversed: inputs.len() == 2,
            through_t: Some(1),
            reshaped: if inputs[0].0.len() >= 3 {
                vec![0]
            } else {
                vec![]
            },
            cublas: true,
            column_sum: Some(2),
            ..GradPlan::default()
        },
        _ => {
            let batched = inputs.len() == 2 && inputs.iter().all(|(s, _)| s.len() >= 3);
            GradPlan {
                rows: batched.then(|| {
                    let prod: usize = g[..nd - 2].iter().product();
                    vec![prod as i64, g[nd - 2] as i64, g[nd - 1] as i64]
                }),
                reversed: batched,
                reshaped: if batched { vec![0, 1] } else { vec![] },
                cublas: true,
                ..GradPlan::default()
            }
        }
    }
}
