//! `F.scaled_dot_product_attention(q, k, v, is_causal=True)`: cuDNN's kernel for bf16/f16, the
//! memory-efficient one for float32 (picked by dtype once autocast has run). It keeps q, k, v
//! and its output, plus the float32 logsumexp per query row; its backward writes the q, k and
//! v gradients as [B, T, H, D] (cuDNN with grouped heads: as [B, H, T, D]) and takes the
//! kernel's workspaces ([`grad_plan`]). Forward, cuDNN takes a workspace of its own
//! ([`cudnn_forward_workspace`]); without backward no logsumexp is kept.

use super::grad::{GradPlan, Step};
use super::script::{tensors, Bound, Entry, Form, Made, Param};
use super::{MetaRef, Op};
use crate::engine::dtype::DType;
use crate::engine::TensorId;
use crate::trace::Category;

fn make(_: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let inputs = tensors(b);
    if !(3..=4).contains(&inputs.len()) {
        return Err("scaled_dot_product_attention expects q, k and v (and an attn_mask)".into());
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
        Param::OptTensor("attn_mask"),
    ],
    doc: "causal SDPA: cuDNN for bf16/f16, memory-efficient for float32; enable_gqa: fewer key/value heads, a group of query heads each; dropout_p: dropout on the probabilities, inside the kernel (no memory of its own); is_causal=false for an encoder (gpumem's default is causal); attn_mask: an additive float mask in the query's dtype broadcast to [B, H, L, S] (without is_causal or enable_gqa; the memory-efficient kernel for float32, cuDNN's for bf16/f16), kept for backward",
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
        // once. Then its float32 workspace per batch and head: the query gradient's
        // accumulators, one per block of 64 queries and per column tile of the head (64 wide
        // for heads up to 64, else 128), each tile with 4 words of lock and counter (Gemma-3's
        // head of 256 on the H200: 2 tiles per block); it goes before the kernel returns,
        // after the copy.
        let nd = g.len();
        let bh: usize = g[..nd.saturating_sub(2)].iter().product();
        let (t, d) = (g[nd - 2], g[nd - 1]);
        let tile = if d <= 64 { 64 } else { 128 };
        let per_bh = t.div_ceil(64) * d.div_ceil(tile) * (64 * tile + 4);
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
        // the memory-efficient kernel writes its gradients as [B, T, H, D]; cuDNN's in the
        // order of each input's strides (a transposed projection's: [B, T, H, D]; a query made
        // by a `cat`: contiguous), grouped heads too: a training step's keys and values come
        // from the cache's `cat` (contiguous: their views back to the projections' rows copy
        // the gradients), but under checkpointing (no cache) the values are the projection's
        // transposed view, whose gradient needs no copy (FSDP2 bf16 with checkpointing, H200)
        bthd: !cudnn,
        like_inputs: cudnn,
        // both kernels write the gradients of q, k and v (never the mask's), needed or not (a
        // frozen key's, BERT's first layer under LoRA: the H200 traces)
        every_input: 3,
        scratch,
        ..GradPlan::default()
    }
}

// Note [cuDNN forward workspace]
/// The workspace cuDNN's SDPA forward takes from the caching allocator (bf16 on the H200,
/// PyTorch 2.11 with cuDNN 9.19, measured by scripts/sdpa_workspace.py over 944 shapes): 256
/// bytes with the causal mask, whatever the shape (and over several queries without it: with
/// a bias, Gemma-2's, Gemma-3's and Phi-3's sliding windows in training; with neither, BERT's
/// attention with dropout; a decode step's bias over 256 keys takes none). A single query without it (a decode step)
/// over more than 512 keys splits the keys: `s` splits, the largest power of two up to one per
/// 128 keys and up to 256 per batch and key/value head, when that is 4 or more, each keeping a
/// float32 partial output and two float32 statistics per batch and query head, each part
/// padded to 128 bytes, plus 128 bytes (800 of 800 decode shapes; and with an additive or
/// bool mask over the keys, transformers' sliding window past it, whose keys and values have
/// the query's heads: 1,440 of 1,440 shapes of scripts/sdpa_mask_workspace.py on an H100,
/// batch 1 to 8, 4 to 32 heads of 64 to 256 channels, 512 to 8,192 keys). Other non-causal
/// shapes (no measurement): none. The split count reads the keys rounded up to a multiple of
/// 8 (a recorded Mistral generation: 8 splits from 1,017 keys on).
pub fn cudnn_forward_workspace(
    b: usize,
    heads: usize,
    kv_heads: usize,
    t: usize,
    kv_len: usize,
    dv: usize,
    causal: bool,
) -> Option<usize> {
    if causal {
        return Some(256);
    }
    // the keys count as a multiple of 8 (a Mistral decode step over 1,017 to 1,023 keys
    // takes 8 splits, as over 1,024: the H100 trace)
    let kv_len = kv_len.div_ceil(8) * 8;
    if t != 1 || kv_len <= 512 || b * kv_heads == 0 || b * kv_heads > 256 {
        return None;
    }
    let pow2_below = |n: usize| {
        if n == 0 {
            0
        } else {
            1usize << (usize::BITS - 1 - n.leading_zeros())
        }
    };
    let splits = pow2_below(kv_len / 128).min(pow2_below(256 / (b * kv_heads)));
    if splits < 4 {
        return None;
    }
    let rows = b * heads * splits;
    // (each part starts 128 bytes after the one before: a batch of few heads pads them)
    let part = |bytes: usize| bytes.div_ceil(128) * 128;
    Some(part(rows * dv * 4) + 2 * part(rows * 4) + 128)
}

#[cfg(test)]
mod cudnn_workspace_tests {
    use super::cudnn_forward_workspace as w;

    /// Shapes measured on the H200 (scripts/sdpa_workspace.py): (B, H, KV, L, D) -> bytes.
    #[test]
    fn the_h200_decode_measurements() {
        type Shape = (usize, usize, usize, usize, usize);
        let cases: &[(Shape, Option<usize>)] = &[
            ((1, 8, 2, 512, 64), None),
            ((1, 8, 2, 513, 64), Some(8576)),
            ((1, 8, 2, 1024, 64), Some(17024)),
            ((1, 8, 2, 8192, 128), Some(266368)),
            ((1, 32, 8, 8192, 64), Some(270464)),
            ((2, 32, 32, 2048, 64), Some(67712)),
            ((4, 16, 4, 513, 64), Some(67712)),
            ((4, 32, 32, 4096, 64), None),
            ((16, 32, 8, 513, 64), None),
            // with a mask (the keys repeated to the query's heads), on an H100: few heads pad
            // the parts to 128 bytes
            ((1, 4, 4, 513, 64), Some(4480)),
            ((1, 4, 4, 1024, 64), Some(8576)),
            ((3, 4, 4, 600, 256), Some(49792)),
            ((8, 32, 32, 8192, 256), None),
        ];
        for &((b, h, kv, l, d), want) in cases {
            assert_eq!(w(b, h, kv, 1, l, d, false), want, "{b} {h} {kv} {l} {d}");
        }
        assert_eq!(w(4, 16, 4, 1024, 1024, 64, true), Some(256));
        // 1,017 keys split as 1,024 (Mistral's H100 trace), 1,016 as 896
        assert_eq!(w(1, 16, 8, 1, 1017, 64, false), Some(33920));
        assert_eq!(w(1, 16, 8, 1, 1016, 64, false), Some(17024));
    }
}
