//! `F.scaled_dot_product_attention(q, k, v, is_causal=True)`: cuDNN's kernel for bf16/f16, the
//! memory-efficient one for float32 (picked by dtype once autocast has run). It keeps q, k, v
//! and its output, plus the float32 logsumexp per query row; its backward writes the q, k and
//! v gradients as [B, T, H, D] (cuDNN with grouped heads: as [B, H, T, D]) and takes the
//! kernel's workspaces ([`grad_plan`]).

use super::grad::{GradPlan, Step};
use super::script::{tensors, Bound, Entry, Form, Made, Param};
use super::{MetaRef, Op};
use crate::engine::dtype::DType;
use crate::trace::Category;

fn make(_: &'static str, b: &Bound<u32>) -> Result<Made<u32>, String> {
    let inputs = tensors(b);
    if inputs.len() != 3 {
        return Err("scaled_dot_product_attention expects q, k and v".into());
    }
    let dropout = b.float(4).unwrap_or(0.0);
    if !(0.0..=1.0).contains(&dropout) {
        return Err(format!(
            "dropout_p has to be between 0 and 1, but got {dropout}"
        ));
    }
    Ok(Made::Op {
        op: Op::Sdpa {
            cudnn: false,
            gqa: b.flag(3),
            dropout,
            seed: 0,
            causal: b.flag(5),
        },
        inputs,
    })
}

/// The script functions of the family.
pub(super) static ENTRIES: &[Entry] = &[Entry {
    name: "scaled_dot_product_attention",
    form: Form::Function,
    params: &[
        Param::Tensor("query"),
        Param::Tensor("key"),
        Param::Tensor("value"),
        Param::Bool("enable_gqa", false),
        Param::Float("dropout_p", Some(0.0)),
        Param::Bool("is_causal", true),
    ],
    doc: "causal SDPA: cuDNN for bf16/f16, memory-efficient for float32; enable_gqa: fewer key/value heads, a group of query heads each; dropout_p: dropout on the probabilities, inside the kernel (no memory of its own); is_causal=false for an encoder (gpumem's default is causal)",
    make,
}];

fn alloc(shape: Vec<usize>, dtype: DType, category: Category) -> Step {
    Step::Alloc {
        shape,
        dtype,
        category,
    }
}

/// The backward's gradient layout and workspaces, as the H200 traces show them.
pub(super) fn grad_plan(cudnn: bool, inputs: &[super::Meta], grad: MetaRef) -> GradPlan {
    let g = grad.0;
    let elems: usize = g.iter().product();
    let rows = g[..g.len().saturating_sub(1)].to_vec();
    let nrows: usize = rows.iter().product();
    // grouped-query attention: fewer key/value heads than query heads
    let grouped = match (inputs.first(), inputs.get(1)) {
        (Some(q), Some(k)) => q.0.get(1) != k.0.get(1),
        _ => false,
    };
    let scratch = if cudnn {
        // cuDNN's workspace: a float32 accumulator for the query gradient, a float32 word per
        // query row, and 256 bytes (B*H*T*D*4 + B*H*T*4 + 256); with grouped heads, the key
        // and value gradients as wide as the query's too, in its dtype (Llama's bf16 autocast
        // on the H200: 33,816,832 bytes for B 4, 16 heads over 4, T 1024, D 64)
        let grouped_extra = if grouped {
            2 * elems * grad.1.size() as usize
        } else {
            0
        };
        vec![
            alloc(
                vec![elems * 4 + nrows * 4 + 256 + grouped_extra],
                DType::U8,
                Category::Workspace,
            ),
            Step::Free(0),
        ]
    } else {
        // the memory-efficient kernel computes delta = (grad_out * out).sum(-1): a product the
        // size of the output and a [B, H, T] float32 sum, copied; the sum and the product go at
        // once. Then its float32 workspace per batch and head: a query-gradient accumulator of
        // T rows by the head size rounded up to 64, and 4 words per block of 64 queries; it
        // goes before the kernel returns, after the copy.
        let nd = g.len();
        let bh: usize = g[..nd.saturating_sub(2)].iter().product();
        let (t, d) = (g[nd - 2], g[nd - 1]);
        let per_bh = t * d.div_ceil(64) * 64 + 4 * t.div_ceil(64);
        vec![
            alloc(g.to_vec(), DType::F32, Category::Temporary),
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
        // cuDNN with grouped heads writes its gradients in the inputs' own [B, H, T, D] order
        // (the H200 traces: their views back to the projections' rows copy them)
        bthd: !(cudnn && grouped),
        scratch,
        ..GradPlan::default()
    }
}
