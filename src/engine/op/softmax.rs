//! The softmax family and the loss built on it: `softmax` and `log_softmax` along a dimension
//! (float32 under autocast; each keeps its result), and `cross_entropy` (mean reduction),
//! which runs as `log_softmax` then `nll_loss`, the latter keeping its target and a total
//! weight.

use super::grad::{GradPlan, Step};
use super::script::{Bound, Entry, Form, Made, Param, X};
use super::{MetaRef, Op};
use crate::engine::TensorId;
use crate::trace::Category;

fn make(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    if name == "cross_entropy" {
        return Ok(Made::CrossEntropy {
            logits: b.tensor(0).ok_or("expects logits")?,
            target: b.tensor(1).ok_or("expects a target")?,
        });
    }
    Ok(Made::Op {
        op: Op::Softmax {
            dim: b.int(1).ok_or_else(|| format!("{name} needs dim"))?,
            log: name == "log_softmax",
            safe: name == "safe_softmax",
        },
        inputs: smallvec::smallvec![b.tensor(0).ok_or("expects a tensor")?],
    })
}

const SOFTMAX: &[Param] = &[X, Param::Int("dim", None)];

/// The script functions of the family.
pub(super) static ENTRIES: &[Entry] = &[
    Entry {
        name: "softmax",
        form: Form::Both,
        params: SOFTMAX,
        doc: "softmax along dim (saves its result)",
        make,
    },
    Entry {
        name: "safe_softmax",
        form: Form::Both,
        params: SOFTMAX,
        doc: "torch._safe_softmax: softmax, 0 for a row of -inf (SDPA's math path; takes an isneginf mask, a row flag and a scalar)",
        make,
    },
    Entry {
        name: "log_softmax",
        form: Form::Both,
        params: SOFTMAX,
        doc: "log_softmax along dim (saves its result)",
        make,
    },
    Entry {
        name: "cross_entropy",
        form: Form::Function,
        params: &[Param::Tensor("logits"), Param::Tensor("target")],
        doc: "F.cross_entropy, mean: log_softmax then nll_loss",
        make,
    },
];

/// `_safe_softmax`'s temporaries after its output: which inputs are -inf, whether a whole row
/// is, and a 0 scalar (freed last first).
pub(super) fn safe_scratch(x: MetaRef, dim: i64) -> Vec<Step> {
    let mut row = x.0.to_vec();
    if let Ok(d) = crate::engine::layout::wrap_dim(dim, row.len()) {
        row.remove(d);
    }
    let temp = |shape: Vec<usize>, dtype| Step::Alloc {
        shape,
        dtype,
        category: Category::Temporary,
    };
    vec![
        temp(x.0.to_vec(), crate::engine::DType::Bool),
        temp(row, crate::engine::DType::Bool),
        temp(vec![], x.1),
        Step::Free(2),
        Step::Free(1),
        Step::Free(0),
    ]
}

/// softmax's backward computes grad * output into a temporary first (log_softmax's does not).
pub(super) fn grad_plan(grad: MetaRef) -> GradPlan {
    GradPlan {
        scratch: vec![
            Step::Alloc {
                shape: grad.0.to_vec(),
                dtype: grad.1,
                category: Category::Temporary,
            },
            Step::Free(0),
        ],
        ..GradPlan::default()
    }
}
