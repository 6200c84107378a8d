//! The scratch of PyTorch's CUDA reduction kernel (`sum`, `mean`, a broadcast operand's
//! gradient summed back to its shape, a bias gradient): when a reduction is split across
//! thread blocks, the kernel takes a staging buffer of partial results and a semaphore per
//! block column from the caching allocator, right after its output, and gives both back
//! (semaphores first) when it returns.
//!
//! Whether it splits follows the kernel's launch configuration on the device (an H200: 132
//! SMs of 2,048 threads), from the reduction as TensorIterator presents it: the dimensions
//! ordered (reduced ones first, then by the input's strides) and merged where memory allows.
//! Checked on the H200 against 13 sums of 2-D to 5-D tensors (PyTorch 2.11), and against the
//! Hugging Face traces (an RMSNorm weight's gradient: a 4 MiB buffer and 16 bytes).

// the GPU the launch configuration is computed for
use super::{SMS, THREADS_PER_SM};
const WARP: usize = 32;
const MAX_THREADS: usize = 512;
const MIN_VALUES_PER_THREAD: usize = 16;
const MAX_VALUES_PER_THREAD: usize = 256;

/// The staging buffer's and the semaphores' bytes of a reduction of a tensor of `shape` and
/// element strides `strides` over the dimensions marked in `reduced`, with `elem` bytes per
/// element and `acc` bytes per accumulator (4 for float32, bfloat16 and float16 sums).
/// `None` when the kernel reduces within blocks and takes nothing.
pub fn reduce_scratch(
    shape: &[usize],
    strides: &[usize],
    reduced: &[bool],
    elem: usize,
    acc: usize,
) -> Option<(u64, u64)> {
    // a split needs at least MAX_VALUES_PER_THREAD values per output: the common short
    // reductions (a norm's row) stop here, before any arrangement is computed
    let per_output: usize = shape
        .iter()
        .zip(reduced)
        .filter(|(_, &r)| r)
        .map(|(&s, _)| s)
        .product();
    if per_output < MAX_VALUES_PER_THREAD {
        return None;
    }
    let (dims, ins, outs) = presented(shape, strides, reduced);
    let ndim = dims.len();
    let numel: usize = dims.iter().product();
    if numel == 0 {
        return None;
    }
    let nred = outs.iter().filter(|&&s| s == 0).count();
    let num_outputs: usize = dims
        .iter()
        .zip(&outs)
        .filter(|(_, &o)| o != 0)
        .map(|(&d, _)| d)
        .product();
    let inputs_per_output = numel / num_outputs.max(1);
    let fastest = ndim == 0 || nred == ndim || ins[0] < ins[nred];
    let (mut dim0, dim1, moving) = match (ndim, fastest) {
        (0, _) => (1, 1, 1),
        (_, true) => (inputs_per_output, num_outputs, ins[0]),
        (_, false) => (num_outputs, inputs_per_output, ins[nred]),
    };
    let input_vec = if elem == 2 { 8 } else { 4 };
    let mut output_vec = 1;
    if moving == 1 {
        if fastest && dim0 > 128 && nred == 1 && 4 >= input_vec {
            dim0 /= input_vec;
        } else if !fastest {
            // vectorized along the outputs as far as the (512-byte aligned) pointer, the
            // first kept size and the other strides allow
            let mut v = 4usize;
            let mut fit = |n: usize| {
                while !n.is_multiple_of(v) {
                    v /= 2;
                }
            };
            fit(dims[nred]);
            for (j, &st) in ins.iter().enumerate() {
                if j != nred {
                    fit(st);
                }
            }
            output_vec = v;
            dim0 /= v;
        }
    }
    let most = MAX_THREADS / output_vec;
    let pow2 = |n: usize| {
        if n < most {
            1usize << (usize::BITS - 1 - n.max(1).leading_zeros())
        } else {
            most
        }
    };
    let (p0, p1) = (pow2(dim0), pow2(dim1));
    let width = p0.min(WARP);
    let height = p1.min(most / width);
    let width = p0.min(most / height);
    // the splits, as the kernel's config multiplies its steps
    let (mut step_in, mut step_out) = (1usize, 1usize);
    let x_reduce = ndim == 0 || fastest;
    if x_reduce {
        step_in *= width;
    } else {
        step_out *= width;
    }
    let per_thread = |step_in: usize| inputs_per_output.div_ceil(step_in);
    let warps_split = per_thread(step_in) >= (height * 16).min(MAX_VALUES_PER_THREAD);
    if warps_split {
        step_in *= height;
    } else {
        step_out *= height;
    }
    let target = SMS * (THREADS_PER_SM / (width * height));
    let grid = (num_outputs / output_vec).div_ceil(step_out);
    let vpt = per_thread(step_in);
    if !warps_split || vpt < MAX_VALUES_PER_THREAD || grid > target {
        return None;
    }
    let ctas = target
        .div_ceil(grid)
        .min(vpt.div_ceil(MIN_VALUES_PER_THREAD))
        .max(vpt.div_ceil(MAX_VALUES_PER_THREAD));
    if ctas <= 1 {
        return None;
    }
    let mut buffer = acc * num_outputs * ctas;
    if !x_reduce {
        buffer *= width * output_vec;
    }
    Some((buffer as u64, 4 * grid as u64))
}

/// The reduction as the kernel sees it: dimensions fastest first, the reduced ones ahead of
/// the kept ones and otherwise by the input's strides, neighbours merged where both the
/// input's and the output's strides allow. Returns sizes, input strides and output strides
/// (0 on reduced dimensions), in elements.
fn presented(
    shape: &[usize],
    strides: &[usize],
    reduced: &[bool],
) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let n = shape.len();
    // the output: contiguous over the kept dimensions
    let mut out = vec![0usize; n];
    let mut acc = 1;
    for d in (0..n).rev() {
        if !reduced[d] {
            out[d] = acc;
            acc *= shape[d];
        }
    }
    let ops = [&out[..], strides];
    let should_swap = |d0: usize, d1: usize| -> i32 {
        for (k, st) in ops.iter().enumerate() {
            let (a, b) = (st[d0], st[d1]);
            if k == 0 && ((a == 0) != (b == 0)) {
                return if b == 0 { 1 } else { -1 };
            }
            if a == 0 || b == 0 {
                continue;
            }
            if a != b {
                return if a < b { -1 } else { 1 };
            }
            if shape[d0] > shape[d1] {
                return 1;
            }
        }
        0
    };
    let perm = crate::engine::layout::reorder_dims(n, should_swap);
    let mut dims: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let mut st: [Vec<usize>; 2] = [
        perm.iter().map(|&p| out[p]).collect(),
        perm.iter().map(|&p| strides[p]).collect(),
    ];
    if dims.len() > 1 {
        let mut prev = 0;
        for d in 1..dims.len() {
            let merge =
                dims[prev] == 1 || dims[d] == 1 || st.iter().all(|s| dims[prev] * s[prev] == s[d]);
            if merge {
                if dims[prev] == 1 {
                    for s in st.iter_mut() {
                        s[prev] = s[d];
                    }
                }
                dims[prev] *= dims[d];
            } else {
                prev += 1;
                if prev != d {
                    for s in st.iter_mut() {
                        s[prev] = s[d];
                    }
                    dims[prev] = dims[d];
                }
            }
        }
        dims.truncate(prev + 1);
        for s in st.iter_mut() {
            s.truncate(prev + 1);
        }
    }
    let [o, i] = st;
    (dims, i, o)
}

/// Contiguous strides of `shape`, in elements.
fn contiguous(shape: &[usize]) -> Vec<usize> {
    crate::engine::layout::contiguous_strides(shape).to_vec()
}

/// [`reduce_scratch`] of a contiguous tensor summed over `dims` (a float32 or 16-bit sum).
pub fn sum_scratch(shape: &[usize], dims: &[usize], elem: usize) -> Option<(u64, u64)> {
    let mut reduced = vec![false; shape.len()];
    for &d in dims {
        reduced[d] = true;
    }
    reduce_scratch(shape, &contiguous(shape), &reduced, elem, 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sums measured on the H200 (PyTorch 2.11): staging buffer and semaphore bytes.
    #[test]
    fn the_h200_measurements() {
        type Case<'a> = (&'a [usize], &'a [usize], Option<(u64, u64)>);
        let cases: &[Case] = &[
            (&[2, 512, 512], &[0, 1], Some((4194304, 16))),
            (&[4, 1024, 1024], &[0, 1], Some((33554432, 32))),
            (&[2, 512, 512], &[2], None),
            (&[2, 2, 4, 512, 64], &[2], None),
            (&[1048576], &[0], Some((512, 4))),
            (&[4, 1048576], &[1], Some((2048, 16))),
            (&[8192, 512], &[0], Some((33554432, 16))),
            (&[64, 4096], &[0], None),
            (&[1000, 1000], &[0], None),
            (&[1024, 1024], &[0], Some((8388608, 32))),
            (&[3, 777, 333], &[0, 2], None),
            (&[16, 128, 4096], &[0, 1], Some((67108864, 128))),
            (&[256, 256, 256], &[1], None),
        ];
        for (shape, dims, want) in cases {
            assert_eq!(
                sum_scratch(shape, dims, 4),
                *want,
                "{shape:?} over {dims:?}"
            );
        }
    }
}
