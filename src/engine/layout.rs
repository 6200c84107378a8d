//! A tensor's layout over its storage: shape, strides (in elements) and offset, with PyTorch's
//! rules for every view. A view only changes the layout, never allocates; whether `reshape`
//! can be a view, and why `view` refuses, follow ATen (`computeStride`, `infer_size`,
//! `expand`, `slice`, `select`) so the engine allocates exactly when PyTorch does.

use std::fmt;

/// Why a view could not be made, in PyTorch's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LayoutError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, LayoutError> {
    Err(LayoutError(msg.into()))
}

/// A shape's or strides' numbers: inline up to 6 dimensions (every tensor has both, and
/// simulating makes and drops several tensors per allocator event).
pub type DimVec = smallvec::SmallVec<[usize; 4]>;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    pub shape: DimVec,
    pub strides: DimVec,
    pub offset: usize,
}

/// Row-major strides for `shape`.
#[inline]
pub fn contiguous_strides(shape: &[usize]) -> DimVec {
    let mut strides = smallvec::smallvec![0; shape.len()];
    let mut acc = 1usize;
    for d in (0..shape.len()).rev() {
        strides[d] = acc;
        acc = acc.saturating_mul(shape[d].max(1));
    }
    strides
}

/// Bytes of a contiguous tensor of `shape` and elements of `elem` bytes, or PyTorch's refusal
/// when the count does not fit an `int64` (`computeStorageNbytes`).
pub fn storage_nbytes(shape: &[usize], elem: u64) -> Result<u64, LayoutError> {
    shape
        .iter()
        .try_fold(elem, |a, &d| a.checked_mul(d as u64))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| {
            LayoutError(format!(
                "Storage size calculation overflowed with sizes={}",
                Dims(shape)
            ))
        })
}

/// `[2, 3]` as PyTorch prints sizes.
pub struct Dims<'a>(pub &'a [usize]);

impl fmt::Display for Dims<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

/// Normalises a possibly negative dimension index (`-1` is the last).
pub fn wrap_dim(dim: i64, ndim: usize) -> Result<usize, LayoutError> {
    let n = ndim.max(1) as i64;
    let d = if dim < 0 { dim + n } else { dim };
    if d < 0 || d >= n {
        return err(format!(
            "Dimension out of range (expected to be in range of [{}, {}], but got {dim})",
            -n,
            n - 1
        ));
    }
    Ok(d as usize)
}

/// `infer_size`: resolves one `-1` and checks the element count.
pub fn infer_size(shape: &[i64], numel: usize) -> Result<DimVec, LayoutError> {
    let mut infer = None;
    let mut known: usize = 1;
    for (i, &s) in shape.iter().enumerate() {
        if s == -1 {
            if infer.is_some() {
                return err("only one dimension can be inferred");
            }
            infer = Some(i);
        } else if s < 0 {
            return err(format!("invalid shape dimension {s}"));
        } else {
            known = known.saturating_mul(s as usize);
        }
    }
    let shown = || {
        format!(
            "[{}]",
            shape
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let mut out: DimVec = shape.iter().map(|&s| s.max(0) as usize).collect();
    match infer {
        Some(i) => {
            if known == 0 || !numel.is_multiple_of(known) {
                return err(format!(
                    "shape '{}' is invalid for input of size {numel}",
                    shown()
                ));
            }
            out[i] = numel / known;
        }
        None => {
            if known != numel {
                return err(format!(
                    "shape '{}' is invalid for input of size {numel}",
                    shown()
                ));
            }
        }
    }
    Ok(out)
}

impl Layout {
    /// Makes this the contiguous layout of `shape`, in place.
    #[inline]
    pub fn set_contiguous(&mut self, shape: &[usize]) {
        let n = shape.len();
        self.shape.clear();
        self.shape.extend_from_slice(shape);
        self.strides.clear();
        self.strides.resize(n, 0);
        let mut acc = 1usize;
        for d in (0..n).rev() {
            self.strides[d] = acc;
            acc = acc.saturating_mul(shape[d].max(1));
        }
        self.offset = 0;
    }

    #[inline]
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            shape: DimVec::from_slice(shape),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The element count (saturating: a shape past `usize` is refused where storage is made,
    /// by [`storage_nbytes`]).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// PyTorch's `is_contiguous()`: row-major, ignoring dimensions of size 1.
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1;
        for d in (0..self.ndim()).rev() {
            if self.shape[d] != 1 {
                if self.strides[d] != expected {
                    return false;
                }
                expected *= self.shape[d];
            }
        }
        true
    }

    /// Elements of storage the view reaches: offset + the farthest element + 1.
    /// Non-overlapping and dense: some order of the dimensions is contiguous (PyTorch's
    /// `is_non_overlapping_and_dense`).
    pub fn is_dense(&self) -> bool {
        let mut dims: Vec<(usize, usize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(&n, _)| n != 1)
            .map(|(&n, &st)| (st, n))
            .collect();
        dims.sort_unstable();
        let mut expect = 1;
        for (st, n) in dims {
            if st != expect {
                return false;
            }
            expect *= n;
        }
        true
    }

    pub fn storage_extent(&self) -> usize {
        if self.numel() == 0 {
            return self.offset;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(s, st)| (s - 1) * st)
                .sum::<usize>()
            + 1
    }

    /// `view(shape)`: a new layout over the same elements, or PyTorch's refusal.
    pub fn view(&self, shape: &[i64]) -> Result<Layout, LayoutError> {
        let new_shape = infer_size(shape, self.numel())?;
        match compute_stride(&self.shape, &self.strides, &new_shape) {
            Some(strides) => Ok(Layout { shape: new_shape, strides, offset: self.offset }),
            None => err(
                "view size is not compatible with input tensor's size and stride (at least one dimension spans \
                 across two contiguous subspaces). Use .reshape(...) instead.",
            ),
        }
    }

    /// `reshape(shape)`: `Ok(Some(view))` when a view will do, `Ok(None)` when PyTorch copies
    /// (the caller then makes a contiguous copy of the new shape).
    pub fn reshape(&self, shape: &[i64]) -> Result<(DimVec, Option<Layout>), LayoutError> {
        let new_shape = infer_size(shape, self.numel())?;
        let view = compute_stride(&self.shape, &self.strides, &new_shape).map(|strides| Layout {
            shape: new_shape.clone(),
            strides,
            offset: self.offset,
        });
        Ok((new_shape, view))
    }

    /// `x[start:end:step]` along `dim` (PyTorch's `slice`: bounds clamp, negatives wrap).
    pub fn slice(
        &self,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
    ) -> Result<Layout, LayoutError> {
        if self.ndim() == 0 {
            return err("slice() cannot be applied to a 0-dim tensor.");
        }
        if step <= 0 {
            return err("slice step must be positive");
        }
        let d = wrap_dim(dim, self.ndim())?;
        let size = self.shape[d] as i64;
        let clamp = |v: i64| -> i64 {
            let v = if v < 0 { v + size } else { v };
            v.clamp(0, size)
        };
        let s = clamp(start.unwrap_or(0));
        let e = clamp(end.unwrap_or(size)).max(s);
        let len = ((e - s) + step - 1) / step;
        let mut l = self.clone();
        l.offset += s as usize * self.strides[d];
        l.shape[d] = len as usize;
        l.strides[d] *= step as usize;
        Ok(l)
    }

    /// `x.select(dim, index)` / `x[index]`: drops `dim`.
    pub fn select(&self, dim: i64, index: i64) -> Result<Layout, LayoutError> {
        if self.ndim() == 0 {
            return err("select() cannot be applied to a 0-dim tensor.");
        }
        let d = wrap_dim(dim, self.ndim())?;
        let size = self.shape[d] as i64;
        if index < -size || index >= size {
            return err(format!(
                "index {index} is out of bounds for dimension {d} with size {size}"
            ));
        }
        let i = if index < 0 { index + size } else { index } as usize;
        let mut l = self.clone();
        l.offset += i * self.strides[d];
        l.shape.remove(d);
        l.strides.remove(d);
        Ok(l)
    }

    pub fn transpose(&self, d0: i64, d1: i64) -> Result<Layout, LayoutError> {
        if self.ndim() == 0 {
            return Ok(self.clone());
        }
        let (a, b) = (wrap_dim(d0, self.ndim())?, wrap_dim(d1, self.ndim())?);
        let mut l = self.clone();
        l.shape.swap(a, b);
        l.strides.swap(a, b);
        Ok(l)
    }

    /// `t()`: transpose of a tensor with at most 2 dimensions.
    pub fn t(&self) -> Result<Layout, LayoutError> {
        if self.ndim() > 2 {
            return err(format!(
                "t() expects a tensor with <= 2 dimensions, but self is {}D",
                self.ndim()
            ));
        }
        if self.ndim() < 2 {
            return Ok(self.clone());
        }
        self.transpose(0, 1)
    }

    pub fn permute(&self, dims: &[i64]) -> Result<Layout, LayoutError> {
        if dims.len() != self.ndim() {
            return err(format!(
                "permute(sparse_coo): number of dimensions in the tensor input does not match the length of the \
                 desired ordering of dimensions i.e. input.dim() = {} is not equal to len(dims) = {}",
                self.ndim(),
                dims.len()
            ));
        }
        let mut seen = vec![false; self.ndim()];
        let mut l = Layout {
            shape: DimVec::new(),
            strides: DimVec::new(),
            offset: self.offset,
        };
        for &d in dims {
            let d = wrap_dim(d, self.ndim())?;
            if seen[d] {
                return err("permute(): duplicate dims are not allowed.");
            }
            seen[d] = true;
            l.shape.push(self.shape[d]);
            l.strides.push(self.strides[d]);
        }
        Ok(l)
    }

    /// `expand(sizes)`: size-1 dimensions (and new leading ones) broadcast with stride 0.
    pub fn expand(&self, sizes: &[i64]) -> Result<Layout, LayoutError> {
        if sizes.len() < self.ndim() {
            return err(format!(
                "expand: the number of sizes provided ({}) must be greater or equal to the number of dimensions in \
                 the tensor ({})",
                sizes.len(),
                self.ndim()
            ));
        }
        let lead = sizes.len() - self.ndim();
        let mut l = Layout {
            shape: smallvec::smallvec![0; sizes.len()],
            strides: smallvec::smallvec![0; sizes.len()],
            offset: self.offset,
        };
        for (i, &target) in sizes.iter().enumerate() {
            if i < lead {
                if target < 0 {
                    return err(format!(
                        "The expanded size of the tensor ({target}) isn't allowed in a leading, non-existing dimension {i}"
                    ));
                }
                l.shape[i] = target as usize;
                l.strides[i] = 0;
                continue;
            }
            let (size, stride) = (self.shape[i - lead], self.strides[i - lead]);
            if target == -1 || target as usize == size {
                l.shape[i] = size;
                l.strides[i] = stride;
            } else if size == 1 && target >= 0 {
                l.shape[i] = target as usize;
                l.strides[i] = 0;
            } else {
                return err(format!(
                    "The expanded size of the tensor ({target}) must match the existing size ({size}) at non-singleton \
                     dimension {i}.  Target sizes: [{}].  Tensor sizes: {}",
                    sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "),
                    Dims(&self.shape)
                ));
            }
        }
        Ok(l)
    }

    pub fn unsqueeze(&self, dim: i64) -> Result<Layout, LayoutError> {
        let d = wrap_dim(dim, self.ndim() + 1)?;
        let stride = if d < self.ndim() {
            self.shape[d] * self.strides[d]
        } else {
            1
        };
        let mut l = self.clone();
        l.shape.insert(d, 1);
        l.strides.insert(d, stride);
        Ok(l)
    }

    /// `split(split_size, dim)`: pieces of `split_size` (the last may be smaller), at most
    /// [`MAX_PIECES`].
    pub fn split(&self, split_size: usize, dim: i64) -> Result<Vec<Layout>, LayoutError> {
        if self.ndim() == 0 {
            return err("split expects at least a 1-dimensional tensor");
        }
        let d = wrap_dim(dim, self.ndim())?;
        let size = self.shape[d];
        if split_size == 0 && size != 0 {
            return err(format!(
                "split_size can only be 0 if dimension size is 0, but got dimension size of {size}"
            ));
        }
        // one tensor per piece: bounded, as the script's other counts are
        let pieces = if split_size == 0 {
            1
        } else {
            size.div_ceil(split_size)
        };
        if pieces > MAX_PIECES {
            return err(format!(
                "split into {pieces} pieces: gpumem makes at most {MAX_PIECES} (a larger \
                 split_size, or fewer chunks)"
            ));
        }
        let mut out = Vec::new();
        let mut start: usize = 0;
        loop {
            let end = start.saturating_add(split_size).min(size);
            out.push(self.slice(d as i64, Some(start as i64), Some(end as i64), 1)?);
            start = end;
            if start >= size {
                break;
            }
        }
        Ok(out)
    }

    /// `chunk(chunks, dim)`: `split` with `ceil(size / chunks)`.
    pub fn chunk(&self, chunks: usize, dim: i64) -> Result<Vec<Layout>, LayoutError> {
        if chunks == 0 {
            return err("chunk expects `chunks` to be greater than 0, got: 0");
        }
        let d = wrap_dim(dim, self.ndim())?;
        self.split(self.shape[d].div_ceil(chunks), d as i64)
    }
}

/// The order of `l`'s dimensions in memory, slowest first, as ATen fills strides "in the
/// order of" another tensor's (cuDNN's `alloc_with_matching_layout`: a stable sort of the
/// dimensions by stride, smallest first, then reversed here).
pub fn stride_order(l: &Layout) -> DimVec {
    let mut fill: DimVec = (0..l.ndim()).collect();
    fill.sort_by_key(|&d| l.strides[d]);
    fill.reverse();
    fill
}

/// A dense layout of `shape` whose dimensions lie in memory in `order` (slowest first).
pub fn dense_in_order(shape: &[usize], order: &[usize]) -> Layout {
    let mut strides: DimVec = smallvec::smallvec![0; shape.len()];
    let mut acc = 1usize;
    for &d in order.iter().rev() {
        strides[d] = acc;
        acc = acc.saturating_mul(shape[d].max(1));
    }
    Layout {
        shape: DimVec::from_slice(shape),
        strides,
        offset: 0,
    }
}

/// The most pieces a `split` or `chunk` makes (each is a tensor gpumem keeps).
pub const MAX_PIECES: usize = 100_000;

/// TensorIterator's dimension order: fastest first, starting from the last logical dimension
/// and insertion-sorted by `should_swap(d0, d1)` (positive: `d0` goes after `d1`; negative:
/// keep; 0: no operand tells). Elementwise outputs and reductions share it.
pub fn reorder_dims(n: usize, should_swap: impl Fn(usize, usize) -> i32) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..n).rev().collect();
    for i in 1..n {
        let mut d1 = i;
        for d0 in (0..i).rev() {
            match should_swap(perm[d0], perm[d1]) {
                c if c > 0 => {
                    perm.swap(d0, d1);
                    d1 = d0;
                }
                c if c < 0 => break,
                _ => {}
            }
        }
    }
    perm
}

/// The layout of an elementwise op's new output (PyTorch's TensorIterator): with every input
/// broadcast to `shape`, the dimensions are ordered by the inputs' strides (the first input
/// that tells two dimensions apart decides; a broadcast dimension tells nothing), and the
/// output is dense in that order. Inputs laid out alike give the output their layout: a
/// transposed input gives a transposed output, so a later `reshape` may have to copy.
pub fn elementwise_layout(shape: &[usize], inputs: &[&Layout]) -> Layout {
    let n = shape.len();
    // each input's strides on the output's dimensions (0 where broadcast or missing)
    let strides: Vec<DimVec> = inputs
        .iter()
        .map(|l| {
            (0..n)
                .map(|d| {
                    let k = d as isize - (n as isize - l.ndim() as isize);
                    if k < 0 {
                        return 0;
                    }
                    let k = k as usize;
                    if l.shape[k] == 1 && shape[d] != 1 {
                        0
                    } else {
                        l.strides[k]
                    }
                })
                .collect()
        })
        .collect();
    // 1: d0 goes after (is slower than) d1; -1: before; 0: no input tells
    let should_swap = |d0: usize, d1: usize| -> i32 {
        for st in &strides {
            let (a, b) = (st[d0], st[d1]);
            if a == 0 || b == 0 {
                continue;
            }
            if a < b {
                return -1;
            }
            if a > b {
                return 1;
            }
            if shape[d0] > shape[d1] {
                return 1;
            }
        }
        0
    };
    let perm = reorder_dims(n, should_swap);
    let mut out: DimVec = smallvec::smallvec![0; n];
    let mut acc = 1usize;
    for &d in &perm {
        out[d] = acc;
        acc = acc.saturating_mul(shape[d].max(1));
    }
    Layout {
        shape: DimVec::from_slice(shape),
        strides: out,
        offset: 0,
    }
}

/// ATen's `computeStride`: strides for `new_shape` over the same elements as
/// (`old_shape`, `old_strides`) without copying, or `None` when a view is impossible.
pub fn compute_stride(
    old_shape: &[usize],
    old_strides: &[usize],
    new_shape: &[usize],
) -> Option<DimVec> {
    if old_shape.is_empty() {
        return Some(smallvec::smallvec![1; new_shape.len()]);
    }
    let numel: usize = old_shape.iter().product();
    if numel == 0 && old_shape == new_shape {
        return Some(DimVec::from_slice(old_strides));
    }
    let mut new_strides: DimVec = smallvec::smallvec![0usize; new_shape.len()];
    if numel == 0 {
        for d in (0..new_shape.len()).rev() {
            new_strides[d] = if d + 1 == new_shape.len() {
                1
            } else {
                new_shape[d + 1].max(1) * new_strides[d + 1]
            };
        }
        return Some(new_strides);
    }
    let mut view_d = new_shape.len() as isize - 1;
    let mut chunk_base_stride = *old_strides.last()?;
    let mut tensor_numel = 1usize;
    let mut view_numel = 1usize;
    for tensor_d in (0..old_shape.len()).rev() {
        tensor_numel *= old_shape[tensor_d];
        let chunk_ends = tensor_d == 0
            || (old_shape[tensor_d - 1] != 1
                && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
        if chunk_ends {
            while view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d as usize] == 1) {
                new_strides[view_d as usize] = view_numel * chunk_base_stride;
                view_numel *= new_shape[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base_stride = old_strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    if view_d != -1 {
        return None;
    }
    Some(new_strides)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `DimVec` literal (typed: `smallvec!` leaves comparisons ambiguous).
    macro_rules! dims {
        ($($x:expr),* $(,)?) => {
            DimVec::from_slice(&[$($x),*])
        };
    }

    fn c(shape: &[usize]) -> Layout {
        Layout::contiguous(shape)
    }

    /// TensorIterator's output order, on what Llama's rotary embedding does: `q * cos` with q
    /// a [B, H, T, D] transpose of a [B, T, H, D] projection keeps q's order; a sum of that and
    /// a contiguous tensor takes the first operand's; a broadcast input decides nothing.
    #[test]
    fn elementwise_outputs_follow_the_first_input_that_decides() {
        let q = c(&[2, 4, 8, 3]).transpose(1, 2).unwrap(); // [2, 8, 4, 3] over [2, 4, 8, 3]
        let cos = c(&[1, 1, 4, 3]);
        let qc = elementwise_layout(&q.shape, &[&q, &cos]);
        assert_eq!(qc.strides, q.strides);
        let rh = c(&[2, 8, 4, 3]);
        assert_eq!(
            elementwise_layout(&rh.shape, &[&qc, &rh]).strides,
            q.strides
        );
        assert_eq!(
            elementwise_layout(&rh.shape, &[&rh, &qc]).strides,
            rh.strides
        );
        // a broadcast first input leaves it to the second
        let w = c(&[3]);
        assert_eq!(elementwise_layout(&q.shape, &[&w, &q]).strides, q.strides);
        // all contiguous: contiguous
        assert!(elementwise_layout(&rh.shape, &[&rh, &cos]).is_contiguous());
        // a transposed matrix alone stays transposed (empty_like keeps its strides)
        let t = c(&[5, 7]).t().unwrap();
        assert_eq!(elementwise_layout(&t.shape, &[&t]).strides, dims![1, 7]);
    }

    #[test]
    fn the_seeds_transpose_example() {
        // a = torch.arange(6).reshape(2, 3): stride (3, 1); b = a.t(): stride (1, 3), not contiguous
        let a = c(&[2, 3]);
        assert_eq!(a.strides, dims![3, 1]);
        assert!(a.is_contiguous());
        let b = a.t().unwrap();
        assert_eq!(
            (b.shape.clone(), b.strides.clone()),
            (dims![3, 2], dims![1, 3])
        );
        assert!(!b.is_contiguous());
        // b.view(6) fails with PyTorch's reason; reshape must copy
        let e = b.view(&[6]).unwrap_err();
        assert!(
            e.0.starts_with("view size is not compatible with input tensor's size and stride"),
            "{e}"
        );
        assert_eq!(b.reshape(&[6]).unwrap(), (dims![6], None));
        // a contiguous copy of b has stride (2, 1)
        assert_eq!(c(&b.shape).strides, dims![2, 1]);
    }

    #[test]
    fn views_that_pytorch_allows() {
        let a = c(&[4, 6, 8]);
        assert_eq!(a.view(&[24, 8]).unwrap().strides, dims![8, 1]);
        assert_eq!(a.view(&[-1]).unwrap().shape, dims![192]);
        assert_eq!(a.view(&[4, 2, 3, 8]).unwrap().strides, dims![48, 24, 8, 1]);
        // a transposed view can still merge the untouched trailing dims
        let t = a.transpose(0, 1).unwrap(); // [6, 4, 8] strides [8, 48, 1]
        assert!(t.view(&[6, 32]).unwrap_err().0.contains("view size"));
        assert_eq!(t.view(&[6, 4, 2, 4]).unwrap().strides, dims![8, 48, 4, 1]);
        // size-1 dims are free
        assert_eq!(
            c(&[1, 5])
                .transpose(0, 1)
                .unwrap()
                .view(&[5])
                .unwrap()
                .strides,
            dims![1]
        );
        // slicing a row keeps it contiguous
        let s = a.slice(0, Some(1), Some(3), 1).unwrap();
        assert!(s.is_contiguous());
        assert_eq!(s.offset, 48);
        assert_eq!(s.view(&[-1]).unwrap().shape, dims![96]);
        // slicing columns does not
        let s = a.slice(2, Some(0), Some(4), 1).unwrap();
        assert!(!s.is_contiguous());
        assert!(s.view(&[-1]).is_err());
        assert!(s.view(&[4, 6, 2, 2]).is_ok());
    }

    #[test]
    fn infer_size_errors() {
        assert_eq!(infer_size(&[-1, 3], 6).unwrap(), dims![2, 3]);
        assert_eq!(
            infer_size(&[-1, -1], 6).unwrap_err().0,
            "only one dimension can be inferred"
        );
        assert_eq!(
            infer_size(&[4, -1], 6).unwrap_err().0,
            "shape '[4, -1]' is invalid for input of size 6"
        );
        assert_eq!(
            infer_size(&[5], 6).unwrap_err().0,
            "shape '[5]' is invalid for input of size 6"
        );
    }

    #[test]
    fn slice_select_expand_split() {
        let a = c(&[10, 4]);
        let s = a.slice(0, Some(-3), None, 1).unwrap();
        assert_eq!((s.shape[0], s.offset), (3, 28));
        let s = a.slice(0, Some(1), Some(100), 3).unwrap();
        assert_eq!((s.shape[0], s.strides[0], s.offset), (3, 12, 4));
        assert_eq!(a.slice(0, Some(5), Some(2), 1).unwrap().shape[0], 0);
        let r = a.select(1, -1).unwrap();
        assert_eq!(
            (r.shape.clone(), r.strides.clone(), r.offset),
            (dims![10], dims![4], 3)
        );
        assert_eq!(
            a.select(0, 10).unwrap_err().0,
            "index 10 is out of bounds for dimension 0 with size 10"
        );
        let e = c(&[1, 4]).expand(&[3, 5, -1]).unwrap();
        assert_eq!(
            (e.shape.clone(), e.strides.clone()),
            (dims![3, 5, 4], dims![0, 0, 1])
        );
        assert!(c(&[2, 4])
            .expand(&[3, 4])
            .unwrap_err()
            .0
            .contains("must match the existing size (2)"));
        let parts = a.split(4, 0).unwrap();
        assert_eq!(
            parts.iter().map(|p| p.shape[0]).collect::<DimVec>(),
            dims![4, 4, 2]
        );
        assert_eq!(parts[2].offset, 32);
        let parts = a.chunk(3, 0).unwrap();
        assert_eq!(
            parts.iter().map(|p| p.shape[0]).collect::<DimVec>(),
            dims![4, 4, 2]
        );
        let p = c(&[2, 3, 4]).permute(&[2, 0, 1]).unwrap();
        assert_eq!(
            (p.shape.clone(), p.strides.clone()),
            (dims![4, 2, 3], dims![1, 12, 4])
        );
        assert!(c(&[2, 3]).permute(&[0, 0]).is_err());
        assert_eq!(c(&[2, 3]).unsqueeze(1).unwrap().strides, dims![3, 3, 1]);
        assert_eq!(c(&[2, 3]).storage_extent(), 6);
        assert_eq!(
            a.slice(0, Some(2), Some(4), 1).unwrap().storage_extent(),
            16
        );
        assert!(wrap_dim(2, 2).is_err());
    }

    #[test]
    fn compute_stride_handles_empty_and_scalars() {
        assert_eq!(compute_stride(&[], &[], &[1, 1]), Some(dims![1, 1]));
        assert_eq!(compute_stride(&[0, 3], &[3, 1], &[3, 0]), Some(dims![1, 1]));
    }
}
