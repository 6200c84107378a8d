//! Embedding lookup, dropout and masked_fill: `F.embedding` (keeps its indices for the
//! table's gradient), `F.dropout` in training (keeps a bool mask; the input itself when not
//! training) and `masked_fill` (keeps its mask).

use super::script::{tensors, Bound, Entry, Form, Made, Param, X};
use super::Op;
use crate::engine::TensorId;

fn make(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let inputs = tensors(b);
    let op = match name {
        "embedding" => Op::Embedding { strided: false },
        "masked_fill_" => {
            return Ok(Made::MaskedFillInPlace {
                x: inputs[0],
                mask: inputs[1],
                value: b.float(2).ok_or("masked_fill_ expects (mask, value)")?,
            })
        }
        "masked_fill" => Op::MaskedFill {
            value: b.float(2).ok_or("masked_fill expects (mask, value)")?,
        },
        _ => {
            let p = b.float(1).unwrap_or(0.5);
            if !(0.0..=1.0).contains(&p) {
                return Err(format!(
                    "dropout probability has to be between 0 and 1, but got {p}"
                ));
            }
            if !b.flag(2) || p == 0.0 {
                // training=false, or p = 0 (no fused kernel: ATen returns its input): the input
                return Ok(Made::Same(inputs[0]));
            }
            // (the seed is numbered when the engine runs it)
            Op::Dropout { p, seed: 0 }
        }
    };
    Ok(Made::Op { op, inputs })
}

/// The script functions of the family.
pub(super) static ENTRIES: &[Entry] = &[
    Entry {
        name: "embedding",
        form: Form::Function,
        params: &[Param::Tensor("indices"), Param::Tensor("weight")],
        doc: "F.embedding (keeps the indices)",
        make,
    },
    Entry {
        name: "dropout",
        form: Form::Function,
        params: &[
            X,
            Param::Float("p", Some(0.5)),
            Param::Bool("training", true),
        ],
        doc: "F.dropout (keeps a bool mask)",
        make,
    },
    Entry {
        name: "masked_fill",
        form: Form::Method,
        params: &[X, Param::Tensor("mask"), Param::Float("value", None)],
        doc: "x where mask is false, value where true (use -inf for attention masks)",
        make,
    },
    Entry {
        name: "masked_fill_",
        form: Form::Method,
        params: &[X, Param::Tensor("mask"), Param::Float("value", None)],
        doc: "in place: value where mask is true; in the autograd graph too (keeps the mask; its backward masks a new gradient)",
        make,
    },
];

// Note [embedding backward]
/// PyTorch's `embedding_dense_backward_cuda` writes each row of the table's gradient directly
/// for at most this many indices; above it, it sorts the indices first.
const DIRECT_MAX_INDICES: usize = 3072;

/// Rows one partial sum covers in `embedding_backward_cuda_kernel` (`NROWS_PER_THREAD`).
const ROWS_PER_PARTIAL: usize = 10;

use crate::engine::SMS;
/// The blocks per SM (of [`SMS`]) under which the kernel accumulates the partial sums with
/// atomics (`MAX_ATOMIC_ACCUM_BLOCKS_PER_SM`) instead of a second pass.
const ATOMIC_BLOCKS_PER_SM: usize = 4;
const MAX_BLOCK: usize = 1024;

/// The temporary storage of cub's decoupled look-back scans as PyTorch 2.11 calls them over
/// `n` 8-byte items in tiles of `tile` items: 16 bytes of tile state per tile plus 32 padding
/// tiles, and a 256-byte block, each aligned to 256 bytes, plus 255 for the base's alignment.
/// Items of 4 bytes take 8 bytes of tile state ([`cub_scan_temp_width`]: 1,023 bytes for the
/// int32 cumsum of a few experts' counts on the H200).
/// The tile sizes are inferred from the H200 traces, not read from cub: `unique_by_key` took
/// 1,279 bytes for 4,096 to 16,384 items (tiles of at least 1,024), `exclusive_sum` 1,279
/// bytes for 2 to 8,192 items and 1,535 for 16,384 (tiles of 512 to 1,023; 896 is the sm90
/// tuning's 128 threads of 7 items at 8 bytes).
pub(super) fn cub_scan_temp(n: usize, tile: usize) -> usize {
    cub_scan_temp_width(n, tile, 8)
}

/// [`cub_scan_temp`] for items of `width` bytes (tile state: a value and a status word, each
/// as wide as the item).
pub(super) fn cub_scan_temp_width(n: usize, tile: usize, width: usize) -> usize {
    let align = |b: usize| b.div_ceil(256) * 256;
    255 + 256 + align((n.div_ceil(tile).max(1) + 32) * 2 * width.clamp(4, 8))
}
const UNIQUE_TILE: usize = 1024;
pub(super) const SCAN_TILE: usize = 896;

/// The temporary storage of cub's onesweep radix sort of `n` (key, value) pairs of `width`
/// bytes each over all the key's bits: per pass (8 bits) a 256-bin histogram of 8-byte
/// offsets, a 4-byte look-back counter per bin and tile, the alternate key and value buffers
/// and a counter per pass, each aligned to 256 bytes, plus 255 for the base's alignment.
/// The tile is the sm90 tuning's 384 threads of 23 items at 4 bytes, scaled to the width.
/// (On the H200: 83,455 bytes for 4,096 int64 pairs, 150,015 for 8,192, 283,135 for 16,384.)
pub fn radix_sort_pairs_temp(n: usize, width: usize) -> usize {
    radix_sort_pairs_temp_bits(n, width, width * 8)
}

/// [`radix_sort_pairs_temp`] over the key's low `bits` only (a pass per 8 bits): PyTorch's
/// `index_put_` sorts its linear indices over the bits of the largest one.
pub fn radix_sort_pairs_temp_bits(n: usize, width: usize, bits: usize) -> usize {
    let align = |b: usize| b.div_ceil(256) * 256;
    let passes = bits.div_ceil(8).max(1);
    let items = (23 * 4 / width.max(1)).clamp(1, 46);
    let tile = 384 * items;
    let tiles = n.div_ceil(tile).max(1);
    align(passes * 256 * 8)
        + align(tiles * 256 * 4)
        + 2 * align(n * width)
        + align(passes * 4)
        + 255
}

/// The plan of `embedding`'s backward for the table (input 1) from `indices` (input 0): the
/// gradient alone for a few indices, or the sort and segment scratch of PyTorch's
/// `embedding_dense_backward_cuda` and `embedding_backward_cuda_kernel` around it.
pub(super) fn grad_plan(
    inputs: &[super::Meta],
    grad: super::MetaRef,
    strided: bool,
) -> super::grad::GradPlan {
    use super::grad::{FStep, Formula, GradPlan};
    use crate::engine::dtype::DType;
    let (Some(idx), Some(table)) = (inputs.first(), inputs.get(1)) else {
        return GradPlan::default();
    };
    let n: usize = idx.0.iter().product();
    if table.0.len() != 2 || (n <= DIRECT_MAX_INDICES && !strided) {
        return GradPlan::default();
    }
    let (rows, width) = (table.0[0], table.0[1]);
    let it = idx.1;
    let w = it.size() as usize;
    let bytes = |b: usize| (vec![b], DType::U8);
    let ints = |k: usize| (vec![k], it);
    let long = (Vec::new(), DType::I64);
    let mut s = Vec::new();
    let mut temps = 0usize;
    let mut temp = |s: &mut Vec<FStep>, m: super::Meta| {
        s.push(FStep::Temp(m));
        temps += 1;
        temps - 1
    };
    // `indices.contiguous()`, held to the end
    let contiguous = strided.then(|| temp(&mut s, ints(n)));
    if n <= DIRECT_MAX_INDICES {
        s.push(FStep::Grad);
        s.extend(contiguous.map(FStep::Free));
        return GradPlan {
            formulas: vec![Formula {
                slot: 1,
                steps: s,
                full: None,
            }],
            ..GradPlan::default()
        };
    }
    // embedding_dense_backward_cuda: sorted and original positions, the range sorted with
    // them, cub's storage
    let sorted = temp(&mut s, ints(n));
    let orig = temp(&mut s, ints(n));
    let range = temp(&mut s, ints(n));
    let sort = temp(&mut s, bytes(radix_sort_pairs_temp(n, w)));
    s.extend([FStep::Free(sort), FStep::Free(range)]);
    // embedding_backward_cuda_kernel: the zeroed gradient, then the segments of equal indices
    s.push(FStep::Grad);
    let offsets = temp(&mut s, ints(n));
    let count = temp(&mut s, long.clone());
    let keys = temp(&mut s, ints(n));
    let unique = temp(&mut s, bytes(cub_scan_temp(n, UNIQUE_TILE)));
    s.extend([FStep::Free(unique), FStep::Free(keys)]);
    let segments = n.min(rows);
    let per = temp(&mut s, ints(segments));
    let per_offset = temp(&mut s, ints(segments));
    let scan = temp(&mut s, bytes(cub_scan_temp(segments, SCAN_TILE)));
    s.push(FStep::Free(scan));
    let partial_count = temp(&mut s, long);
    let partials = n / ROWS_PER_PARTIAL + segments;
    let partial_offset = temp(&mut s, ints(partials));
    // the partial sums: atomically into the gradient when a pass over the segments would
    // leave the device idle, else into a buffer summed in a second pass
    let warped = width.div_ceil(32) * 32;
    let block = warped.clamp(1, MAX_BLOCK);
    let scatter_grid = (segments * warped).div_ceil(block);
    let opmath = match grad.1 {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    };
    let mut tail = Vec::new();
    if scatter_grid < SMS * ATOMIC_BLOCKS_PER_SM && partials > scatter_grid * 4 {
        tail.push(temp(&mut s, ints(partials)));
        if opmath != grad.1 {
            let acc = temp(&mut s, (vec![rows, width], opmath));
            s.push(FStep::Free(acc));
        }
    } else {
        tail.push(temp(&mut s, (vec![partials, width], opmath)));
    }
    for k in tail.into_iter().rev() {
        s.push(FStep::Free(k));
    }
    for k in [
        partial_offset,
        partial_count,
        per_offset,
        per,
        count,
        offsets,
        orig,
        sorted,
    ] {
        s.push(FStep::Free(k));
    }
    s.extend(contiguous.map(FStep::Free));
    GradPlan {
        formulas: vec![Formula {
            slot: 1,
            steps: s,
            full: None,
        }],
        ..GradPlan::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The radix sort's storage as the H200 traces show it.
    #[test]
    fn radix_sort_storage_is_cubs() {
        assert_eq!(radix_sort_pairs_temp(4096, 8), 83455);
        assert_eq!(radix_sort_pairs_temp(8192, 8), 150015);
        assert_eq!(radix_sort_pairs_temp(16384, 8), 283135);
    }

    /// The scans' storage as the H200 traces show it.
    #[test]
    fn scan_storage_is_cubs() {
        for n in [4096, 8192, 16384] {
            assert_eq!(cub_scan_temp(n, UNIQUE_TILE), 1279, "unique_by_key of {n}");
        }
        for n in [2, 4096, 8192] {
            assert_eq!(cub_scan_temp(n, SCAN_TILE), 1279, "exclusive_sum of {n}");
        }
        assert_eq!(cub_scan_temp(16384, SCAN_TILE), 1535);
    }
}
