//! Mixture-of-experts routing and the grouped expert products, as transformers 5.17's
//! `grouped_mm` experts run them on PyTorch 2.11 (the H200 traces of fixtures/hf2: Mixtral
//! and Qwen3-MoE):
//!
//! - `topk` (values, then int64 indices; its backward one gradient of the input's shape, the
//!   zeros the indices scatter into) and `sort` (values, int64 indices, and a temporary of one
//!   int64 per element that the kernel takes and gives back);
//! - `index(x, idx)`, Python's `x[idx]` with a 1-D integer tensor (rows of `x`): its backward
//!   is `zeros(x.shape).index_put_(idx, grad, accumulate=True)`, whose sort-based kernel takes,
//!   after the zeros, `idx.remainder(rows)` and the linear index made from it (the first freed
//!   at once), the sorted indices, their original positions and an `arange`, and cub's radix
//!   sort storage over the bits of the row count ([`index_put_scratch`]);
//! - `x.index_put_(idx, values)` outside autograd (nothing allocated);
//! - `histc` (a `bins` vector of the input's dtype), `floor_divide` by a number;
//! - `grouped_mm(x [S, K], w [E, K, N], offs [E])`: one `[S, N]` output; backward makes the
//!   weight's gradient first (in the weight's own layout: a transposed view of a parameter
//!   gets a gradient its `.grad` takes as it is), then the input's. In bf16 every product
//!   (forward, and each gradient in backward) runs CUTLASS's grouped GEMM, which takes its
//!   per-group arguments and its tile scheduler's workspace after its output and gives them
//!   back before returning ([`grouped_mm_scratch`]); float32 runs a loop of plain products
//!   with nothing beside the output.

use super::script::{tensors, Bound, Entry, Form, Made, Param, X};
use super::{Extras, Meta, MetaRef, Op, Save};
use crate::engine::dtype::DType;
use crate::engine::layout::{wrap_dim, Dims, LayoutError};
use crate::engine::TensorId;

fn make(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let inputs = tensors(b);
    let op = match name {
        "topk" => {
            let k = b.int(1).ok_or("topk expects k")?;
            let k =
                usize::try_from(k).map_err(|_| format!("selected index k out of range ({k})"))?;
            return Ok(Made::Multi {
                op: Op::Topk {
                    k,
                    dim: b.int(2).unwrap_or(-1),
                },
                inputs,
            });
        }
        "sort" => {
            return Ok(Made::Multi {
                op: Op::Sort {
                    dim: b.int(1).unwrap_or(-1),
                },
                inputs,
            })
        }
        "index" => Op::Gather,
        "histc" => {
            let bins = b.int(1).unwrap_or(100);
            let bins = usize::try_from(bins)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("torch.histc: bins must be > 0, but got {bins}"))?;
            let (min, max) = (b.float(2).unwrap_or(0.0), b.float(3).unwrap_or(0.0));
            if min > max {
                return Err(format!(
                    "torch.histc: max must be larger than min (min {min}, max {max})"
                ));
            }
            Op::Histc { bins, min, max }
        }
        "floor_divide" => {
            let value = b.float(1).ok_or("floor_divide expects a number")?;
            if value == 0.0 {
                return Err("ZeroDivisionError: floor_divide by zero".into());
            }
            Op::FloorDiv { value }
        }
        "clamp" => {
            let min = b.float(1).ok_or("clamp expects min")?;
            let max = b.float(2).ok_or("clamp expects max")?;
            Op::Clamp { min, max }
        }
        "bincount" => {
            let bins = b.int(1).unwrap_or(0);
            let bins = usize::try_from(bins)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    format!("bincount: minlength must be at least 1 (the bins), got {bins}")
                })?;
            Op::Bincount { bins }
        }
        "grouped_mm" => Op::GroupedMm { w_t: false },
        "index_put_" => {
            return Ok(Made::IndexPut {
                x: inputs[0],
                indices: inputs[1],
                values: inputs[2],
            })
        }
        _ => return Err(format!("{name}: not a routing op")),
    };
    Ok(Made::Op { op, inputs })
}

/// The script functions and methods of the family.
pub(super) static ENTRIES: &[Entry] = &[
    Entry {
        name: "topk",
        form: Form::Both,
        params: &[X, Param::Int("k", None), Param::Int("dim", Some(-1))],
        doc: "the k largest along dim: (values, int64 indices); backward scatters into zeros of the input's shape",
        make,
    },
    Entry {
        name: "sort",
        form: Form::Both,
        params: &[X, Param::Int("dim", Some(-1))],
        doc: "sorted along dim: (values, int64 indices), an int64 temporary per element inside",
        make,
    },
    Entry {
        name: "index",
        form: Form::Function,
        params: &[X, Param::Tensor("indices")],
        doc: "x[indices] with a 1-D integer tensor: rows of x (keeps the indices; backward: zeros, then PyTorch's sort-based index_put_ with its temporaries)",
        make,
    },
    Entry {
        name: "index_put_",
        form: Form::Method,
        params: &[X, Param::Tensor("indices"), Param::Tensor("values")],
        doc: "in place: x[indices] = values (rows); outside autograd only",
        make,
    },
    Entry {
        name: "histc",
        form: Form::Both,
        params: &[
            X,
            Param::Int("bins", Some(100)),
            Param::Float("min", Some(0.0)),
            Param::Float("max", Some(0.0)),
        ],
        doc: "histogram of bins equal bins between min and max, in the input's dtype",
        make,
    },
    Entry {
        name: "floor_divide",
        form: Form::Both,
        params: &[X, Param::Float("other", None)],
        doc: "x // other, a number (also for integer tensors)",
        make,
    },
    Entry {
        name: "clamp",
        form: Form::Both,
        params: &[X, Param::Float("min", None), Param::Float("max", None)],
        doc: "each element limited to [min, max] (max wins where min > max); outside autograd (MoE's expert ids)",
        make,
    },
    Entry {
        name: "bincount",
        form: Form::Function,
        params: &[X, Param::Int("minlength", None)],
        doc: "counts of each value of a 1-D integer tensor, int64 [minlength] (its values must be below minlength); reads its minimum and maximum back first",
        make,
    },
    Entry {
        name: "grouped_mm",
        form: Form::Function,
        params: &[X, Param::Tensor("weight"), Param::Tensor("offs")],
        doc: "torch._grouped_mm: rows of x [S, K] in groups ending at offs (int32 [E]) times weight [E, K, N]: [S, N] (backward: the weight's gradient first)",
        make,
    },
];

/// cub's single-tile radix sort takes (key, value) pairs of 8 bytes up to 256 threads of 9
/// items (the sm90 policy's 19 items at 4 bytes, scaled); its temporary storage is then one
/// byte. (On the H200: 1 byte for 2,048 indices, the onesweep's 71,167 for 4,096.)
const SINGLE_TILE_PAIRS: usize = 256 * 9;

/// Bits cub sorts of a linear index below `n` (PyTorch's `get_num_bits`).
fn num_bits(n: usize) -> usize {
    (usize::BITS - n.leading_zeros()) as usize
}

/// The scratch of `index_put_(indices, values, accumulate=True)` (PyTorch's
/// `index_put_with_sort_kernel`) for `n` int64 indices into `rows` rows, after the zeros:
/// `remainder` then the linear index (the first freed at once), the sorted indices, the
/// original positions, an `arange`, cub's sort storage, all given back last made first.
pub fn index_put_scratch(n: usize, rows: usize) -> Vec<super::Step> {
    use super::Step;
    let ints = |len: usize| Step::Alloc {
        shape: vec![len],
        dtype: DType::I64,
        category: crate::trace::Category::Temporary,
    };
    let sort = if n <= SINGLE_TILE_PAIRS {
        1
    } else {
        super::nn::radix_sort_pairs_temp_bits(n, 8, num_bits(rows))
    };
    vec![
        ints(n),
        ints(n),
        Step::Free(0),
        ints(n),
        ints(n),
        ints(n),
        Step::Alloc {
            shape: vec![sort],
            dtype: DType::U8,
            category: crate::trace::Category::Temporary,
        },
        Step::Free(5),
        Step::Free(4),
        Step::Free(3),
        Step::Free(2),
        Step::Free(1),
    ]
}

/// Output and extras of the family's ops that run by the engine's one rule.
pub(super) fn outputs(op: &Op, ins: &[MetaRef]) -> Option<Result<(Meta, Extras), LayoutError>> {
    let first = ins.first()?;
    let r = match op {
        Op::Topk { k, dim } => wrap_dim(*dim, first.0.len().max(1)).and_then(|d| {
            let mut s = first.0.to_vec();
            let size = s.get(d).copied().unwrap_or(1);
            if *k > size {
                return Err(LayoutError(format!(
                    "selected index k out of range (k {k}, dimension of size {size})"
                )));
            }
            if let Some(x) = s.get_mut(d) {
                *x = *k;
            }
            Ok(((s.clone(), first.1), vec![(s, DType::I64)]))
        }),
        Op::Sort { dim } => wrap_dim(*dim, first.0.len().max(1)).map(|_| {
            (
                (first.0.to_vec(), first.1),
                vec![(first.0.to_vec(), DType::I64)],
            )
        }),
        Op::Gather => {
            let idx = ins.get(1)?;
            if idx.1.is_floating() || idx.1 == DType::Bool || idx.0.len() != 1 {
                return Some(Err(LayoutError(format!(
                    "index expects a 1-D integer tensor of indices, got {} of {}",
                    idx.1.name(),
                    Dims(idx.0)
                ))));
            }
            if first.0.is_empty() {
                return Some(Err(LayoutError(
                    "index: a 0-dim tensor has no rows to index".into(),
                )));
            }
            let mut s = vec![idx.0[0]];
            s.extend_from_slice(&first.0[1..]);
            Ok(((s, first.1), vec![]))
        }
        Op::Histc { bins, .. } => {
            if first.1 == DType::Bool {
                return Some(Err(LayoutError(
                    "\"histogram_cuda\" not implemented for 'Bool'".into(),
                )));
            }
            Ok(((vec![*bins], first.1), vec![]))
        }
        Op::FloorDiv { .. } | Op::Clamp { .. } => Ok(((first.0.to_vec(), first.1), vec![])),
        Op::Bincount { bins } => {
            if first.0.len() != 1 || first.1.is_floating() || first.1 == DType::Bool {
                return Some(Err(LayoutError(format!(
                    "bincount: only 1-d non-negative integral inputs are supported, got {} of {}",
                    Dims(first.0),
                    first.1.name()
                ))));
            }
            Ok(((vec![*bins], DType::I64), vec![]))
        }
        Op::GroupedMm { .. } => {
            let (w, offs) = (ins.get(1)?, ins.get(2)?);
            let (x, wd) = (first.0, w.0);
            if x.len() != 2 || wd.len() != 3 || offs.0 != [wd[0]] || x[1] != wd[1] {
                return Some(Err(LayoutError(format!(
                    "grouped_mm expects input [S, K], weight [E, K, N] and offs [E], got {}, {} and {}",
                    Dims(x),
                    Dims(wd),
                    Dims(offs.0)
                ))));
            }
            if offs.1 != DType::I32 {
                return Some(Err(LayoutError(format!(
                    "grouped_mm: offs must be int32, got {}",
                    offs.1.name()
                ))));
            }
            if first.1 != w.1 {
                return Some(Err(LayoutError(format!(
                    "grouped_mm: input ({}) and weight ({}) must have the same dtype",
                    first.1.name(),
                    w.1.name()
                ))));
            }
            Ok(((vec![x[0], wd[2]], first.1), vec![]))
        }
        _ => return None,
    };
    Some(r)
}

/// Past this many elements along its dim, CUDA's `sort` leaves its in-place bitonic sort for
/// cub's radix sort of (key, index) pairs (`sort_out_stable_cuda`).
const SORT_IN_PLACE_MAX: usize = 4096;

/// What the family's kernels take and give back inside: sort's int64 per element, and past
/// [`SORT_IN_PLACE_MAX`] cub's radix-sort storage meanwhile (150,015 bytes for 8,192 int64
/// keys on the H200); a bf16 grouped_mm's arguments and workspace.
pub(super) fn forward_scratch(op: &Op, ins: &[MetaRef]) -> Vec<super::Step> {
    match (op, ins.first()) {
        (Op::GroupedMm { .. }, Some(x)) => {
            let groups = ins.get(1).and_then(|w| w.0.first().copied());
            grouped_mm_scratch(x.1, groups.unwrap_or(0))
        }
        (Op::Sort { dim }, Some(x)) => {
            let n: usize = x.0.iter().product();
            let len = wrap_dim(*dim, x.0.len().max(1))
                .ok()
                .and_then(|d| x.0.get(d).copied())
                .unwrap_or(n);
            let mut steps = vec![super::Step::Alloc {
                shape: vec![n],
                dtype: DType::I64,
                category: crate::trace::Category::Temporary,
            }];
            if len > SORT_IN_PLACE_MAX {
                let temp = super::nn::radix_sort_pairs_temp(n, x.1.size().max(1) as usize);
                steps.push(super::Step::Alloc {
                    shape: vec![temp],
                    dtype: DType::U8,
                    category: crate::trace::Category::Temporary,
                });
                steps.push(super::Step::Free(1));
            }
            steps.push(super::Step::Free(0));
            steps
        }
        _ => Vec::new(),
    }
}

/// Bytes of arguments CUTLASS's grouped GEMM builds per group (problem shape, pointers and
/// strides of the three operands), in one device buffer: 480 for 8 experts and 960 for 16
/// on the H200.
const GROUPED_ARGS_PER_GROUP: usize = 60;

/// Bytes of the persistent tile scheduler's workspace per multiprocessor: 67,584 on the H200's
/// 132, whatever the problem's size.
const GROUPED_WORKSPACE_PER_SM: usize = 512;

/// A bf16 `grouped_mm`'s scratch after its output, as the H200 traces show it: the arguments
/// of `groups` products, the scheduler's workspace, the workspace given back, then the
/// arguments. Other dtypes run the fallback loop of products: nothing.
pub(super) fn grouped_mm_scratch(dtype: DType, groups: usize) -> Vec<super::Step> {
    if dtype != DType::BF16 {
        return Vec::new();
    }
    let bytes = |n: usize| super::Step::Alloc {
        shape: vec![n],
        dtype: DType::U8,
        category: crate::trace::Category::Workspace,
    };
    vec![
        bytes(GROUPED_ARGS_PER_GROUP * groups),
        bytes(GROUPED_WORKSPACE_PER_SM * crate::engine::SMS),
        super::Step::Free(1),
        super::Step::Free(0),
    ]
}

/// What the family's backward keeps, released in this order (PyTorch's codegen sorts the
/// saved variables by name: grouped_mm's `mat2`, `offs`, `self`).
pub(super) fn saves(op: &Op) -> &'static [Save] {
    match op {
        Op::Gather => &[Save::InputFor(1, 0)],
        Op::GroupedMm { .. } => &[Save::InputFor(1, 0), Save::Input(2), Save::InputFor(0, 1)],
        _ => &[],
    }
}

/// The plan of the family's backward.
pub(super) fn grad_plan(op: &Op, inputs: &[Meta]) -> super::GradPlan {
    match op {
        Op::Gather => {
            let n = inputs.get(1).map_or(0, |m| m.0.iter().product());
            let rows = inputs
                .first()
                .and_then(|m| m.0.first().copied())
                .unwrap_or(0);
            super::GradPlan {
                scratch: index_put_scratch(n, rows),
                ..super::GradPlan::default()
            }
        }
        Op::GroupedMm { w_t } => {
            let groups = inputs.get(1).and_then(|w| w.0.first().copied());
            let dtype = inputs.first().map_or(DType::F32, |x| x.1);
            super::GradPlan {
                reversed: true,
                swapped: w_t.then_some(1),
                each_scratch: grouped_mm_scratch(dtype, groups.unwrap_or(0)),
                ..super::GradPlan::default()
            }
        }
        _ => super::GradPlan::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::op::Step;

    #[test]
    fn index_put_scratch_is_the_h200s() {
        let allocs = |n, rows| -> Vec<usize> {
            index_put_scratch(n, rows)
                .iter()
                .filter_map(|s| match s {
                    Step::Alloc { shape, dtype, .. } => Some(shape[0] * dtype.size() as usize),
                    Step::Free(_) => None,
                })
                .collect()
        };
        // Mixtral's 1,024 tokens to 2 experts, Qwen3-MoE's to 4
        assert_eq!(
            allocs(2048, 1024),
            [16384; 5].iter().copied().chain([1]).collect::<Vec<_>>()
        );
        assert_eq!(allocs(4096, 1024).last(), Some(&71167));
        assert_eq!(allocs(2048, 2048).last(), Some(&1));
    }
}
