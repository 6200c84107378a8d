//! Reductions: `sum()` and `mean()`, over everything or one dimension (with `keepdim`), which
//! keep nothing for backward (the gradient is the incoming one expanded back); `argmax(dim)`
//! and `max()`; and `isin(elements, test_elements)`, a comparison reduced over the test
//! elements. A sum of an integer or bool tensor is int64, summed from an int64 copy of its
//! input. When PyTorch's reduction kernel splits a reduction across thread blocks it takes a
//! staging buffer and semaphores ([`crate::engine::reduction`]), after the output.

use super::grad::Step;
use super::script::{entries, Bound, Entry, Form, Made, Param as P, UNARY, X};
use super::{Extras, Meta, MetaRef, Op};
use crate::engine::dtype::DType;
use crate::engine::layout::{contiguous_strides, wrap_dim, LayoutError};
use crate::engine::TensorId;
use crate::trace::Category;

/// The dimensions a `sum`/`mean` reduces: one (`dim=1`), several (`dim=[0, 2]`), or every one
/// (none given). Small and `Copy`: ops are built on every script call.
/// A dimension past what `i16` holds is kept as the nearest it holds: out of range either way,
/// and the error says so when the op meets its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DimList {
    len: u8,
    dims: [i16; 8],
}

fn saturate(d: i64) -> i16 {
    d.clamp(i64::from(i16::MIN), i64::from(i16::MAX)) as i16
}

impl DimList {
    /// Every dimension.
    pub const ALL: DimList = DimList {
        len: 0,
        dims: [0; 8],
    };

    /// One dimension, or every one for `None`.
    pub fn from_dim(dim: Option<i64>) -> DimList {
        match dim {
            Some(d) => DimList {
                len: 1,
                dims: [saturate(d), 0, 0, 0, 0, 0, 0, 0],
            },
            None => DimList::ALL,
        }
    }

    /// Up to 8 dimensions (as PyTorch's tensors have few); an empty list is every one.
    pub fn from_slice(dims: &[i64]) -> Result<DimList, String> {
        if dims.len() > 8 {
            return Err(format!("at most 8 dims to reduce, got {}", dims.len()));
        }
        let mut out = DimList::ALL;
        for (k, &d) in dims.iter().enumerate() {
            out.dims[k] = saturate(d);
        }
        out.len = dims.len() as u8;
        Ok(out)
    }

    /// Whether it names every dimension (an empty list).
    pub fn is_all(&self) -> bool {
        self.len == 0
    }

    /// Which of `ndim` dimensions are reduced (PyTorch's errors for a bad or repeated one).
    pub fn reduced(&self, ndim: usize) -> Result<Vec<bool>, LayoutError> {
        if self.len == 0 {
            return Ok(vec![true; ndim]);
        }
        let mut red = vec![false; ndim];
        for &d in &self.dims[..self.len as usize] {
            let w = wrap_dim(d as i64, ndim)?;
            if red[w] {
                return Err(LayoutError(format!(
                    "dim {w} appears multiple times in the list of dims"
                )));
            }
            red[w] = true;
        }
        Ok(red)
    }
}

fn reduce(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let x = b.tensor(0).ok_or("expects a tensor")?;
    let op = match name {
        "argmax" => Op::Argmax {
            dim: b.int(1),
            keepdim: b.flag(2),
        },
        "max" => Op::Max,
        "isin" => {
            return Ok(Made::Op {
                op: Op::Isin,
                inputs: smallvec::smallvec![
                    x,
                    b.tensor(1)
                        .ok_or("isin expects (elements, test_elements)")?,
                ],
            })
        }
        _ => Op::Reduce {
            mean: name == "mean",
            // `dim=1`, or a list `dim=[0, 2]` (bound into the list), or everything
            dims: match b.int(1) {
                Some(d) => DimList::from_dim(Some(d)),
                None => {
                    let ds: Vec<i64> = b.list.iter().map(|&v| v as i64).collect();
                    DimList::from_slice(&ds)?
                }
            },
            keepdim: b.flag(2),
        },
    };
    Ok(Made::Op {
        op,
        inputs: smallvec::smallvec![x],
    })
}

const REDUCE: &[P] = &[X, P::Dims("dim"), P::Bool("keepdim", false)];
const ARGMAX: &[P] = &[X, P::OptInt("dim"), P::Bool("keepdim", false)];

entries! {
    "sum", Both, REDUCE, reduce, "sum, over everything, dim, or a list of dims (int64 for an integer or bool input, summed from its int64 copy)";
    "mean", Both, REDUCE, reduce, "mean, over everything, dim or a list of dims (a floating input)";
    "argmax", Both, ARGMAX, reduce, "int64 index of the largest element, over everything or along dim";
    "max", Both, UNARY, reduce, "the largest element, a 0-dim tensor";
    "isin", Function, &[P::Tensor("elements"), P::Tensor("test_elements")], reduce, "whether each element is among test_elements (a few of them: PyTorch compares every pair, then any(-1), both temporaries): a bool tensor";
}

/// The reduced shape: the reduced dimensions removed (kept as 1 with `keepdim`). A sum of an
/// integer or bool input is int64; a mean needs a floating input.
pub(super) fn outputs(
    x: MetaRef,
    dims: DimList,
    keepdim: bool,
    mean: bool,
) -> Result<(Meta, Extras), LayoutError> {
    let red = dims.reduced(x.0.len())?;
    let shape: Vec<usize> =
        x.0.iter()
            .zip(&red)
            .filter_map(|(&s, &r)| match (r, keepdim) {
                (false, _) => Some(s),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect();
    let dtype = match (x.1.is_floating(), mean) {
        (true, _) => x.1,
        (false, false) => DType::I64,
        (false, true) => {
            return Err(LayoutError(format!(
                "mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: {}",
                x.1.name()
            )))
        }
    };
    Ok(((shape, dtype), vec![]))
}

/// The reduction kernel's accumulator bytes for a sum of `dtype` (float32 for 16-bit floats).
pub(super) fn acc_bytes(dtype: DType) -> usize {
    match dtype {
        DType::F64 | DType::I64 => 8,
        d if d.is_floating() => 4,
        // (integer sums run in int64)
        _ => 8,
    }
}

/// The staging buffer and semaphores of a split reduction of a contiguous `x` (nothing when
/// the kernel reduces within its blocks), as scratch steps numbered from `first`.
fn split_scratch(x: MetaRef, dims: DimList, elem: usize, acc: usize, first: usize) -> Vec<Step> {
    let Ok(red) = dims.reduced(x.0.len()) else {
        return Vec::new();
    };
    let strides = contiguous_strides(x.0);
    let Some((buffer, sem)) =
        crate::engine::reduction::reduce_scratch(x.0, &strides, &red, elem, acc)
    else {
        return Vec::new();
    };
    let bytes = |n: u64| Step::Alloc {
        shape: vec![n as usize],
        dtype: DType::U8,
        category: Category::Temporary,
    };
    vec![
        bytes(buffer),
        bytes(sem),
        Step::Free(first + 1),
        Step::Free(first),
    ]
}

/// A sum's scratch: an integer or bool input's int64 copy (taken after the output, freed when
/// the kernel returns), and the split reduction's buffers.
pub(super) fn sum_scratch(x: MetaRef, dims: DimList) -> Vec<Step> {
    if x.1.is_floating() || x.1 == DType::I64 {
        return split_scratch(x, dims, x.1.size() as usize, acc_bytes(x.1), 0);
    }
    let mut steps = vec![Step::Alloc {
        shape: x.0.to_vec(),
        dtype: DType::I64,
        category: Category::Temporary,
    }];
    steps.extend(split_scratch((x.0, DType::I64), dims, 8, 8, 1));
    steps.push(Step::Free(0));
    steps
}

/// `argmax`'s and `max`'s split-reduction buffers (`acc` bytes per accumulator: argmax keeps
/// a value and an int64 index, 16 bytes).
pub(super) fn arg_scratch(x: MetaRef, dim: Option<i64>, acc: usize) -> Vec<Step> {
    split_scratch(x, DimList::from_dim(dim), x.1.size() as usize, acc, 0)
}

/// PyTorch compares every pair only for few test elements (fewer than 10 * n^0.145 for n
/// elements); with more it sorts, which gpumem does not model.
pub(super) fn isin_check(elements: &[usize], test: &[usize]) -> Result<(), LayoutError> {
    let n: usize = elements.iter().product();
    let k: usize = test.iter().product();
    if n == 0 || (k as f64) < 10.0 * (n as f64).powf(0.145) {
        return Ok(());
    }
    Err(LayoutError(format!(
        "isin with {k} test elements for {n} elements takes PyTorch's sorting path, which gpumem does not model (fewer than 10 * n^0.145 test elements are compared pair by pair)"
    )))
}
