//! Matrix products on the GPU through cuBLAS (loaded at run time, as the driver is), for
//! row-major float32 matrices: what `Op::Matmul`, `Op::Linear` and `Op::Addmm` run, forward
//! and backward (`kernel()` and `backward_kernel()` name it `gemm`).
//!
//! cuBLAS is column-major. A row-major matrix is the column-major transpose of itself with the
//! same leading dimension, so row-major `C = op(A) op(B)` is computed as column-major
//! `C^T = op(B)^T op(A)^T`: the operands swap places and each keeps its own transpose flag.
//! The default math mode is kept (no TF32), as PyTorch's `allow_tf32 = False` default does.

use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, CudaStream};

/// A cuBLAS handle on a stream, or why there is none.
pub fn handle(stream: Arc<CudaStream>) -> Result<CudaBlas, String> {
    // SAFETY: only tries to open the library by its usual names
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(
            "cuBLAS (libcublas.so.13) was not found on the library path: install the CUDA 13 \
             toolkit's libraries or add their folder to LD_LIBRARY_PATH"
                .into(),
        );
    }
    CudaBlas::new(stream).map_err(|e| format!("creating a cuBLAS handle: {e:?}"))
}

/// The shape of a row-major product `C[m, n] = op(A)[m, k] op(B)[k, n]`, where `op` transposes
/// an operand stored the other way round (`A` stored `[k, m]` with `ta`, `B` stored `[n, k]`
/// with `tb`).
#[derive(Debug, Clone, Copy)]
pub struct Product {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub ta: bool,
    pub tb: bool,
}

impl Product {
    /// The row-major operands `(a, b)` in the order the column-major call takes them.
    pub fn operands<'x, T: ?Sized>(a: &'x T, b: &'x T) -> (&'x T, &'x T) {
        (b, a)
    }

    /// The column-major call that computes it (with `C = alpha * product + beta * C`).
    pub fn config(&self, alpha: f32, beta: f32) -> Result<GemmConfig<f32>, String> {
        let int = |v: usize| {
            i32::try_from(v)
                .map_err(|_| format!("a matrix side of {v} is beyond cuBLAS's 32-bit sizes"))
        };
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        // (the column-major A' is row-major B, and B' is row-major A)
        Ok(GemmConfig {
            transa: op(self.tb),
            transb: op(self.ta),
            m: int(self.n)?,
            n: int(self.m)?,
            k: int(self.k)?,
            alpha,
            lda: int(if self.tb { self.k } else { self.n })?,
            ldb: int(if self.ta { self.m } else { self.k })?,
            beta,
            ldc: int(self.n)?,
        })
    }
}

/// `c = op(a) op(b)` (row-major, contiguous).
pub fn gemm(
    blas: &CudaBlas,
    p: Product,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
) -> Result<(), String> {
    let need = [
        (a.len(), p.m * p.k, "A"),
        (b.len(), p.k * p.n, "B"),
        (c.len(), p.m * p.n, "C"),
    ];
    for (have, want, which) in need {
        if have < want {
            return Err(format!(
                "gemm: {which} holds {have} floats, the product needs {want}"
            ));
        }
    }
    let cfg = p.config(1.0, 0.0)?;
    let (first, second) = Product::operands(a, b);
    // SAFETY: each buffer holds at least the elements its matrix spans (checked above), and
    // the leading dimensions are those of contiguous row-major storage
    unsafe { blas.gemm(cfg, first, second, c) }.map_err(|e| format!("cuBLAS sgemm: {e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BLAS's column-major gemm, by its definition, on host vectors.
    fn colmajor(cfg: &GemmConfig<f32>, a: &[f32], b: &[f32]) -> Vec<f32> {
        let (m, n, k) = (cfg.m as usize, cfg.n as usize, cfg.k as usize);
        let (lda, ldb) = (cfg.lda as usize, cfg.ldb as usize);
        let at = |i: usize, l: usize| match cfg.transa {
            cublasOperation_t::CUBLAS_OP_N => a[i + l * lda],
            _ => a[l + i * lda],
        };
        let bt = |l: usize, j: usize| match cfg.transb {
            cublasOperation_t::CUBLAS_OP_N => b[l + j * ldb],
            _ => b[j + l * ldb],
        };
        let mut c = vec![0.0; m * n];
        for j in 0..n {
            for i in 0..m {
                c[i + j * cfg.ldc as usize] = (0..k).map(|l| at(i, l) * bt(l, j)).sum();
            }
        }
        c
    }

    /// The column-major call computes the row-major product, for each transpose of each
    /// operand (the forward and both gradients of a matmul).
    #[test]
    fn row_major_products_through_column_major_calls() {
        let (m, k, n) = (3usize, 4usize, 5usize);
        let a_rm: Vec<f32> = (0..m * k).map(|v| v as f32 * 0.5 - 2.0).collect(); // [m, k]
        let b_rm: Vec<f32> = (0..k * n).map(|v| 1.0 - v as f32 * 0.25).collect(); // [k, n]
        let want: Vec<f32> = (0..m * n)
            .map(|i| {
                (0..k)
                    .map(|l| a_rm[i / n * k + l] * b_rm[l * n + i % n])
                    .sum()
            })
            .collect();
        let transpose = |x: &[f32], r: usize, c: usize| -> Vec<f32> {
            (0..r * c).map(|i| x[(i % r) * c + i / r]).collect()
        };
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            // stored the other way round where transposed
            let a = if ta {
                transpose(&a_rm, m, k)
            } else {
                a_rm.clone()
            };
            let b = if tb {
                transpose(&b_rm, k, n)
            } else {
                b_rm.clone()
            };
            let p = Product { m, k, n, ta, tb };
            let cfg = p.config(1.0, 0.0).unwrap();
            // the operands in the order `gemm` passes them
            let (first, second) = Product::operands(&a[..], &b[..]);
            assert_eq!(colmajor(&cfg, first, second), want, "ta {ta} tb {tb}");
        }
    }
}
