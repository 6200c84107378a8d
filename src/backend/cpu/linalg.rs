//! Matrix products: `matmul` (1-D, 2-D, batched with broadcast batch dimensions) and `linear`,
//! forward and the gradient of each operand. Products go through `matrixmultiply`'s dgemm, cut
//! into blocks that rayon runs in parallel.

use super::elementwise::{load_as, sum_to};
use super::{saved, CpuDevice, Scratch};
use crate::backend::{Launch, Pass};
use crate::engine::op::{broadcast, Op, Role};

/// `c = op(a) @ op(b)` for row-major `a` ([m, k], or [k, m] when `ta`) and `b` ([k, n], or
/// [n, k] when `tb`); returns row-major [m, n]. The product is cut into blocks of rows of `c`
/// (or of columns, when `c` has few rows), one single-threaded dgemm per block on rayon's
/// threads: `matrixmultiply`'s own threading stops at 4 threads.
pub(super) fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f64],
    ta: bool,
    b: &[f64],
    tb: bool,
) -> Scratch {
    use rayon::prelude::*;
    let mut c = Scratch::zeros(m * n);
    if m == 0 || n == 0 {
        return c;
    }
    assert!(
        a.len() >= m * k && b.len() >= k * n,
        "gemm operands too short"
    );
    let (rsa, csa) = if ta { (1, m as isize) } else { (k as isize, 1) };
    let (rsb, csb) = if tb { (1, k as isize) } else { (n as isize, 1) };
    /// Addresses shared by the blocks, each of which writes its own part of `c`.
    #[derive(Clone, Copy)]
    struct Ptrs(*const f64, *const f64, *mut f64);
    // SAFETY: the blocks read `a` and `b` and write disjoint rows or columns of `c`.
    unsafe impl Send for Ptrs {}
    unsafe impl Sync for Ptrs {}
    impl Ptrs {
        /// (A method, so closures capture the whole struct, not its raw-pointer fields.)
        fn get(self) -> (*const f64, *const f64, *mut f64) {
            (self.0, self.1, self.2)
        }
    }
    let p = Ptrs(a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    // one block per thread and then some, each at least a few dgemm panels wide
    let threads = rayon::current_num_threads().max(1);
    let flops = m * n * k;
    let blocks = if flops < 1 << 18 { 1 } else { threads * 2 };
    let by_rows = m >= 8 * blocks || m >= n;
    let len = if by_rows { m } else { n };
    let step = len.div_ceil(blocks).max(8);
    (0..len.div_ceil(step)).into_par_iter().for_each(|i| {
        let (pa, pb, pc) = p.get();
        let lo = i * step;
        let hi = (lo + step).min(len);
        // SAFETY: block i covers rows (or columns) lo..hi of `c`, inside the m*n elements,
        // and reads the matching rows of op(a) (or columns of op(b)) at the strides above.
        unsafe {
            if by_rows {
                matrixmultiply::dgemm(
                    hi - lo,
                    k,
                    n,
                    1.0,
                    pa.offset(lo as isize * rsa),
                    rsa,
                    csa,
                    pb,
                    rsb,
                    csb,
                    0.0,
                    pc.add(lo * n),
                    n as isize,
                    1,
                );
            } else {
                matrixmultiply::dgemm(
                    m,
                    k,
                    hi - lo,
                    1.0,
                    pa,
                    rsa,
                    csa,
                    pb.offset(lo as isize * csb),
                    rsb,
                    csb,
                    0.0,
                    pc.add(lo),
                    n as isize,
                    1,
                );
            }
        }
    });
    c
}

/// A matmul's operands as batched matrices: a's shape as [..., n, k], b's as [..., k, m], and
/// the broadcast batch.
type MmShapes = (Vec<usize>, Vec<usize>, Vec<usize>);

fn mm_shapes(sa: &[usize], sb: &[usize]) -> Result<MmShapes, String> {
    let a2 = if sa.len() == 1 {
        vec![1, sa[0]]
    } else {
        sa.to_vec()
    };
    let b2 = if sb.len() == 1 {
        vec![sb[0], 1]
    } else {
        sb.to_vec()
    };
    let batch = broadcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2]).map_err(|e| e.0)?;
    Ok((a2, b2, batch))
}

fn with_batch(batch: &[usize], r: usize, c: usize) -> Vec<usize> {
    let mut s = batch.to_vec();
    s.extend([r, c]);
    s
}

/// Row-major batched product of `a` [batch, n, k] and `b` [batch, k, m] (transposed as asked).
#[allow(clippy::too_many_arguments)]
fn bmm(
    batch: usize,
    n: usize,
    k: usize,
    m: usize,
    a: &[f64],
    ta: bool,
    b: &[f64],
    tb: bool,
) -> Scratch {
    let mut out = Scratch::with_capacity(batch * n * m);
    for i in 0..batch {
        let aa = &a[i * n * k..(i + 1) * n * k];
        let bb = &b[i * k * m..(i + 1) * k * m];
        out.extend_from_slice(&gemm(n, k, m, aa, ta, bb, tb));
    }
    out
}

pub(super) fn launch(d: &mut CpuDevice, l: &Launch) -> Result<(), String> {
    let out = &l.outputs[0];
    match (l.op, l.pass) {
        (Op::Matmul, Pass::Forward) => {
            let (sa, sb) = (&l.inputs[0].layout.shape, &l.inputs[1].layout.shape);
            let (a2, b2, batch) = mm_shapes(sa, sb)?;
            let (n, k, m) = (a2[a2.len() - 2], a2[a2.len() - 1], b2[b2.len() - 1]);
            let a = load_as(d, &l.inputs[0], &with_batch(&batch, n, k))?;
            let b = load_as(d, &l.inputs[1], &with_batch(&batch, k, m))?;
            let nb: usize = batch.iter().product();
            d.store(out, &bmm(nb, n, k, m, &a, false, &b, false))
        }
        (Op::Matmul, Pass::Grad { input }) => {
            let sa = saved_shape(l, 0)?;
            let sb = saved_shape(l, 1)?;
            let (a2, b2, batch) = mm_shapes(&sa, &sb)?;
            let (n, k, m) = (a2[a2.len() - 2], a2[a2.len() - 1], b2[b2.len() - 1]);
            let nb: usize = batch.iter().product();
            let g = d.load(&l.inputs[0])?;
            let full = if input == 0 {
                let b = load_as(d, saved(l, Role::Input(1))?, &with_batch(&batch, k, m))?;
                // [n, m] @ [k, m]^T
                let ga = bmm(nb, n, m, k, &g, false, &b, true);
                sum_to(&ga, &with_batch(&batch, n, k), &a2)
            } else {
                let a = load_as(d, saved(l, Role::Input(0))?, &with_batch(&batch, n, k))?;
                // [n, k]^T @ [n, m]
                let gb = bmm(nb, k, n, m, &a, true, &g, false);
                sum_to(&gb, &with_batch(&batch, k, m), &b2)
            };
            d.store(out, &full)
        }
        (Op::Linear, Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let w = d.load(&l.inputs[1])?;
            let ws = &l.inputs[1].layout.shape;
            let (n, k) = (ws[0], ws[1]);
            let rows = x.len() / k.max(1);
            let mut y = gemm(rows, k, n, &x, false, &w, true);
            if let Some(b) = l.inputs.get(2) {
                let b = d.load(b)?;
                for r in 0..rows {
                    for j in 0..n {
                        y[r * n + j] += b[j];
                    }
                }
            }
            d.store(out, &y)
        }
        (Op::Linear, Pass::Grad { input }) => {
            let g = d.load(&l.inputs[0])?;
            let gs = &l.inputs[0].layout.shape;
            let n = *gs.last().ok_or("a scalar gradient for linear")?;
            let rows = g.len() / n.max(1);
            let v = match input {
                0 => {
                    let w = d.load(saved(l, Role::Input(1))?)?;
                    let k = w.len() / n.max(1);
                    gemm(rows, n, k, &g, false, &w, false)
                }
                1 => {
                    let x = d.load(saved(l, Role::Input(0))?)?;
                    let k = x.len() / rows.max(1);
                    gemm(n, rows, k, &g, true, &x, false)
                }
                _ => {
                    let mut s = Scratch::zeros(n);
                    for r in 0..rows {
                        for j in 0..n {
                            s[j] += g[r * n + j];
                        }
                    }
                    s
                }
            };
            d.store(out, &v)
        }
        (Op::Addmm, Pass::Forward) => {
            // [rows, k] @ [k, m] + bias (broadcast from [m] or [rows, m])
            let x = d.load(&l.inputs[0])?;
            let w = d.load(&l.inputs[1])?;
            let ws = &l.inputs[1].layout.shape;
            let (k, m) = (ws[0], ws[1]);
            let rows = x.len() / k.max(1);
            let mut y = gemm(rows, k, m, &x, false, &w, false);
            let b = d.load(&l.inputs[2])?;
            let full = b.len() == y.len();
            for r in 0..rows {
                for j in 0..m {
                    y[r * m + j] += b[if full { r * m + j } else { j % b.len().max(1) }];
                }
            }
            d.store(out, &y)
        }
        (Op::Addmm, Pass::Grad { input }) => {
            let g = d.load(&l.inputs[0])?;
            let m = *l.inputs[0]
                .layout
                .shape
                .last()
                .ok_or("a scalar gradient for addmm")?;
            let rows = g.len() / m.max(1);
            let v = match input {
                0 => {
                    // grad @ w.T
                    let w = d.load(saved(l, Role::Input(1))?)?;
                    let k = w.len() / m.max(1);
                    gemm(rows, m, k, &g, false, &w, true)
                }
                1 => {
                    // x.T @ grad
                    let x = d.load(saved(l, Role::Input(0))?)?;
                    let k = x.len() / rows.max(1);
                    gemm(k, rows, m, &x, true, &g, false)
                }
                _ => {
                    let n = out.layout.numel();
                    if n == g.len() {
                        g.to_vec().into()
                    } else {
                        let mut s = Scratch::zeros(n);
                        for r in 0..rows {
                            for j in 0..m {
                                s[j % n.max(1)] += g[r * m + j];
                            }
                        }
                        s
                    }
                }
            };
            d.store(out, &v)
        }
        (op, pass) => Err(format!("no CPU kernel for {} ({pass:?})", op.name())),
    }
}

/// The shape of the op's input `i` as saved (or, when it was not saved, as the gradient being
/// written says: the output buffer of the gradient of input `i`).
fn saved_shape(l: &Launch, i: usize) -> Result<Vec<usize>, String> {
    if let Ok(b) = saved(l, Role::Input(i)) {
        return Ok(b.layout.shape.to_vec());
    }
    match l.pass {
        Pass::Grad { input } if input == i => Ok(l.outputs[0].layout.shape.to_vec()),
        _ => Err(format!("matmul's backward: input {i} was not saved")),
    }
}

#[cfg(test)]
mod tests {
    use super::gemm;

    fn naive(m: usize, k: usize, n: usize, a: &[f64], ta: bool, b: &[f64], tb: bool) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    let x = if ta { a[p * m + i] } else { a[i * k + p] };
                    let y = if tb { b[j * k + p] } else { b[p * n + j] };
                    c[i * n + j] += x * y;
                }
            }
        }
        c
    }

    /// Blocked by rows (many rows), by columns (few rows, many columns) and whole (small),
    /// with each operand transposed or not: the same numbers as the textbook loop.
    #[test]
    fn blocked_gemm_is_the_product() {
        for &(m, k, n) in &[(300, 70, 90), (3, 200, 700), (5, 4, 3), (1, 513, 1000)] {
            let a: Vec<f64> = (0..m * k)
                .map(|i| ((i * 7919) % 97) as f64 / 31.0 - 1.5)
                .collect();
            let b: Vec<f64> = (0..k * n)
                .map(|i| ((i * 104729) % 89) as f64 / 29.0 - 1.5)
                .collect();
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let got = gemm(m, k, n, &a, ta, &b, tb);
                let want = naive(m, k, n, &a, ta, &b, tb);
                let err = got
                    .iter()
                    .zip(&want)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f64::max);
                assert!(err < 1e-9, "{m}x{k}x{n} ta={ta} tb={tb}: max error {err}");
            }
        }
    }
}
