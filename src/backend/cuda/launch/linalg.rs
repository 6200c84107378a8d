//! Matrix products on the GPU through cuBLAS: `cublasGemmStridedBatchedEx` with float32
//! accumulation (`CUBLAS_COMPUTE_32F`, default math mode: no TF32, as PyTorch's
//! `allow_tf32 = False`; bf16 and float16 operands accumulate in float32 as PyTorch's do).
//! cuBLAS works in the workspace the engine took from the caching allocator for the launch's
//! thread (`Launch::workspace`, 32 MiB as PyTorch's), so its memory is the allocator's, as in
//! PyTorch, and not the handle's own.
//! `linear` and `addmm` forward with the bias and the gradients of the input, the weight and
//! the bias; `matmul` of contiguous operands with the same batch dimensions, forward and
//! backward, one strided-batched call, and a forward whose batch broadcasts one matrix (a
//! stride of 0). The twin of `src/backend/cpu/linalg.rs`; the rest (other broadcasts and
//! their gradients, strided operands, mixed dtypes) runs on the host twin.

use cudarc::cublas::{result as cublas, sys};

use super::{contiguous, Gpu, Strided};
use crate::backend::cuda::blas::Product;
use crate::backend::{Buffer, Launch, Pass};
use crate::engine::layout::Layout;
use crate::engine::op::{Op, Role};

/// cuBLAS's name of a dtype the products take.
fn cuda_type(code: i32) -> Option<sys::cudaDataType> {
    Some(match code {
        0 => sys::cudaDataType::CUDA_R_32F,
        1 => sys::cudaDataType::CUDA_R_16BF,
        2 => sys::cudaDataType::CUDA_R_16F,
        _ => return None,
    })
}

/// `batch` products `c_i = op(a_i) op(b_i) + beta c_i` (row-major, contiguous, all of dtype
/// `code`, the i-th matrix of each `stride` elements after the one before; `beta` 1 adds what
/// `c` holds before the single rounding, as cuBLASLt's bias epilogue does).
#[allow(clippy::too_many_arguments)]
fn gemm(
    g: &mut Gpu,
    p: Product,
    (a, b, c): (u64, u64, u64),
    code: i32,
    batch: usize,
    (sa, sb, sc): (usize, usize, usize),
    beta: f32,
) -> Result<(), String> {
    if p.m == 0 || p.n == 0 || batch == 0 {
        return Ok(());
    }
    let dt = cuda_type(code).ok_or("a product in a dtype cuBLAS is not given here")?;
    let cfg = p.config(1.0, 0.0)?;
    let (first, second) = Product::operands(&a, &b);
    let (s1, s2) = Product::operands(&sa, &sb);
    let nb = i32::try_from(batch).map_err(|_| format!("{batch} products in one call"))?;
    let h = g.blas()?;
    let alpha = 1.0f32;
    // SAFETY: each address holds `batch` contiguous row-major matrices of its operand's span
    // (the caller checked the buffers' shapes), the leading dimensions those of contiguous
    // storage; alpha and beta are float32, as CUBLAS_COMPUTE_32F takes them
    unsafe {
        cublas::gemm_strided_batched_ex(
            h,
            cfg.transa,
            cfg.transb,
            cfg.m,
            cfg.n,
            cfg.k,
            (&alpha as *const f32).cast(),
            *first as *const std::ffi::c_void,
            dt,
            cfg.lda,
            *s1 as i64,
            *second as *const std::ffi::c_void,
            dt,
            cfg.ldb,
            *s2 as i64,
            (&beta as *const f32).cast(),
            c as *mut std::ffi::c_void,
            dt,
            cfg.ldc,
            sc as i64,
            nb,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| format!("cuBLAS gemm: {e:?}"))
}

/// One product (`batch` 1).
fn gemm1(g: &mut Gpu, p: Product, abc: (u64, u64, u64), code: i32) -> Result<(), String> {
    gemm(g, p, abc, code, 1, (0, 0, 0), 0.0)
}

/// `y[r, j] = b[j]` for contiguous `y` [rows, n] (elementwise.cu's `copy` from a stride-0
/// view of the bias).
fn bias_rows(g: &mut Gpu, y: &Buffer, b: &Buffer, rows: usize, n: usize) -> Result<(), String> {
    use cudarc::driver::PushKernelArg;
    let mut ys = Layout::contiguous(&[rows, n]);
    ys.offset = y.layout.offset;
    let mut bs = Layout::contiguous(&[rows, n]);
    bs.strides = smallvec::smallvec![0, b.layout.strides.last().copied().unwrap_or(1)];
    bs.offset = b.layout.offset;
    let (Some(ys), Some(bs)) = (Strided::of(&ys, y.dtype), Strided::of(&bs, b.dtype)) else {
        return Err("a bias in a dtype the kernels do not take".into());
    };
    let total = (rows * n) as i64;
    let f = g.function("copy")?;
    // y holds rows x n elements, b n; each element written by one thread
    g.run(&f, Gpu::elems(rows * n), |lb| {
        lb.arg(&b.addr).arg(&bs).arg(&y.addr).arg(&ys).arg(&total);
    })
}

/// A saved contiguous operand of the product's dtype: its address and shape.
fn saved_operand(l: &Launch, r: Role, code: i32) -> Option<(u64, Vec<usize>)> {
    l.saved
        .iter()
        .find(|(role, _)| *role == r)
        .and_then(|(_, b)| {
            let (a, c) = contiguous(b)?;
            (c == code).then(|| (a, b.layout.shape.to_vec()))
        })
}

/// A contiguous operand of the product's dtype.
fn operand(b: &Buffer, code: i32) -> Option<u64> {
    contiguous(b).filter(|&(_, c)| c == code).map(|(a, _)| a)
}

/// A (batched) matrix operand of the product's dtype, contiguous or the transpose of a
/// contiguous one (`k.transpose(-2, -1)`: cuBLAS reads it transposed, as PyTorch passes it):
/// its first element's address and whether it is stored transposed.
fn matrix(b: &Buffer, code: i32) -> Option<(u64, bool)> {
    if let Some(a) = operand(b, code) {
        return Some((a, false));
    }
    let t = b.layout.transpose(-2, -1).ok()?;
    let stored = Buffer {
        addr: b.addr,
        layout: &t,
        dtype: b.dtype,
    };
    operand(&stored, code).map(|a| (a, true))
}

fn saved_matrix(l: &Launch, r: Role, code: i32) -> Option<(u64, bool, Vec<usize>)> {
    l.saved
        .iter()
        .find(|(role, _)| *role == r)
        .and_then(|(_, b)| matrix(b, code).map(|(a, t)| (a, t, b.layout.shape.to_vec())))
}

/// `y = x W' + b` with `x` [rows, k] and `W'` the weight [n, k] transposed (`wt`: linear) or
/// [k, n] as it is (addmm), the bias [n] (a full [rows, n] one runs on the host), forward and
/// the gradient of the input, the weight or the bias.
fn dense(g: &mut Gpu, l: &Launch, pass: Pass, wt: bool) -> Result<bool, String> {
    let out = &l.outputs[0];
    let Some((o, code)) = contiguous(out) else {
        return Ok(false);
    };
    match pass {
        Pass::Forward => {
            let (Some(x), Some(w)) = (operand(&l.inputs[0], code), operand(&l.inputs[1], code))
            else {
                return Ok(false);
            };
            let ws = &l.inputs[1].layout.shape;
            if ws.len() != 2 {
                return Ok(false);
            }
            let (n, k) = if wt { (ws[0], ws[1]) } else { (ws[1], ws[0]) };
            let bias = match l.inputs.get(2) {
                None => None,
                Some(b) if b.layout.numel() == n && b.dtype == out.dtype => Some(b),
                Some(_) => return Ok(false),
            };
            let rows = l.inputs[0].layout.numel() / k.max(1);
            if k == 0 || rows * k != l.inputs[0].layout.numel() || out.layout.numel() != rows * n {
                return Ok(false);
            }
            let p = Product {
                m: rows,
                k,
                n,
                ta: false,
                tb: wt,
            };
            match bias {
                // the bias in every row first, then the product added to it: one rounding
                Some(b) => {
                    bias_rows(g, out, b, rows, n)?;
                    gemm(g, p, (x, w, o), code, 1, (0, 0, 0), 1.0)?;
                }
                None => gemm1(g, p, (x, w, o), code)?,
            }
        }
        Pass::Grad { input } => {
            let Some(gr) = contiguous(&l.inputs[0]) else {
                return Ok(false);
            };
            let n = *l.inputs[0].layout.shape.last().unwrap_or(&0);
            let rows = l.inputs[0].layout.numel() / n.max(1);
            if n == 0 || rows == 0 {
                return Ok(false);
            }
            match input {
                0 => {
                    // [rows, n] @ W'^T
                    let Some((w, ws)) = saved_operand(l, Role::Input(1), code) else {
                        return Ok(false);
                    };
                    let k = ws.iter().product::<usize>() / n;
                    if out.layout.numel() != rows * k {
                        return Ok(false);
                    }
                    let p = Product {
                        m: rows,
                        k: n,
                        n: k,
                        ta: false,
                        tb: !wt,
                    };
                    if gr.1 != code {
                        return Ok(false);
                    }
                    gemm1(g, p, (gr.0, w, o), code)?;
                }
                1 => {
                    // linear's [n, k] = grad^T @ x; addmm's [k, n] = x^T @ grad
                    let Some((x, xs)) = saved_operand(l, Role::Input(0), code) else {
                        return Ok(false);
                    };
                    let k = xs.iter().product::<usize>() / rows;
                    if out.layout.numel() != n * k {
                        return Ok(false);
                    }
                    let (p, a, b) = if wt {
                        let p = Product {
                            m: n,
                            k: rows,
                            n: k,
                            ta: true,
                            tb: false,
                        };
                        (p, gr.0, x)
                    } else {
                        let p = Product {
                            m: k,
                            k: rows,
                            n,
                            ta: true,
                            tb: false,
                        };
                        (p, x, gr.0)
                    };
                    if gr.1 != code {
                        return Ok(false);
                    }
                    gemm1(g, p, (a, b, o), code)?;
                }
                _ => {
                    // a bias of [n]: its columns' sums (a full one's is the gradient itself)
                    if out.layout.numel() != n || !l.inputs[0].layout.is_contiguous() {
                        return Ok(false);
                    }
                    let mut g2 = Layout::contiguous(&[rows, n]);
                    g2.offset = l.inputs[0].layout.offset;
                    let whole = Buffer {
                        addr: l.inputs[0].addr,
                        layout: &g2,
                        dtype: l.inputs[0].dtype,
                    };
                    if !super::nn::reduce_view(g, &whole, &[true, false], false, out)? {
                        return Ok(false);
                    }
                }
            }
        }
    }
    Ok(true)
}

/// Runs `l` here if cuBLAS takes it; `false` where it does not.
pub(super) fn launch(g: &mut Gpu, l: &Launch) -> Result<bool, String> {
    if !matches!(l.op, Op::Linear | Op::Addmm | Op::Matmul) {
        return Ok(false);
    }
    let Some(out) = l.outputs.first() else {
        return Ok(false);
    };
    let Some((o, code)) = contiguous(out) else {
        return Ok(false);
    };
    g.workspace(l.workspace.as_ref())?;
    match (l.op, l.pass) {
        // `linear` keeps its weight as [out, in], `addmm` (GPT-2's Conv1D) as [in, out]
        (Op::Linear, pass) => return dense(g, l, pass, true),
        (Op::Addmm, pass) => return dense(g, l, pass, false),
        (Op::Matmul, pass) => {
            // [batch.., r, c] operands, each contiguous or a transposed contiguous one, with
            // equal batch dimensions only
            let ops = match pass {
                Pass::Forward => match (matrix(&l.inputs[0], code), matrix(&l.inputs[1], code)) {
                    (Some(a), Some(b)) => (
                        (a.0, a.1, l.inputs[0].layout.shape.to_vec()),
                        (b.0, b.1, l.inputs[1].layout.shape.to_vec()),
                    ),
                    // (an expanded operand: its batch one matrix repeated)
                    _ => return broadcast_forward(g, l, (o, code)),
                },
                Pass::Grad { .. } => match (
                    saved_matrix(l, Role::Input(0), code),
                    saved_matrix(l, Role::Input(1), code),
                ) {
                    (Some(a), Some(b)) => (a, b),
                    _ => return Ok(false),
                },
            };
            let ((a, a_t, sa), (b, b_t, sb)) = ops;
            if sa.len() < 2 || sa.len() != sb.len() || sa[..sa.len() - 2] != sb[..sb.len() - 2] {
                // a batch broadcast in the forward (rotary's inverse frequencies, expanded,
                // times the positions): one operand the same matrix for every product
                return match pass {
                    Pass::Forward => broadcast_forward(g, l, (o, code)),
                    Pass::Grad { .. } => Ok(false),
                };
            }
            let nd = sa.len();
            let (n, k, m) = (sa[nd - 2], sa[nd - 1], sb[nd - 1]);
            if sb[nd - 2] != k {
                return Ok(false);
            }
            let batch: usize = sa[..nd - 2].iter().product();
            let (pa, pb, p, sa_el, sb_el) = match pass {
                Pass::Forward => {
                    let p = Product {
                        m: n,
                        k,
                        n: m,
                        ta: a_t,
                        tb: b_t,
                    };
                    (a, b, p, n * k, k * m)
                }
                Pass::Grad { input } => {
                    let Some(gr) = operand(&l.inputs[0], code) else {
                        return Ok(false);
                    };
                    if input == 0 {
                        // [n, m] @ [k, m]^T (a transposed b is that transpose, stored)
                        let p = Product {
                            m: n,
                            k: m,
                            n: k,
                            ta: false,
                            tb: !b_t,
                        };
                        (gr, b, p, n * m, k * m)
                    } else {
                        // [n, k]^T @ [n, m]
                        let p = Product {
                            m: k,
                            k: n,
                            n: m,
                            ta: !a_t,
                            tb: false,
                        };
                        (a, gr, p, n * k, n * m)
                    }
                }
            };
            if out.layout.numel() != batch * p.m * p.n {
                return Ok(false);
            }
            gemm(
                g,
                p,
                (pa, pb, o),
                code,
                batch,
                (sa_el, sb_el, p.m * p.n),
                0.0,
            )?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// A batched matrix operand of the product's dtype whose matrices are one contiguous (or
/// transposed contiguous) matrix repeated: batch dimensions of one element or of stride 0
/// (an `expand`). Its first element's address, whether it is stored transposed, its matrix
/// shape.
fn repeated(b: &Buffer, code: i32) -> Option<(u64, bool, [usize; 2])> {
    let nd = b.layout.shape.len();
    if nd < 2 {
        return None;
    }
    let batch_free = (0..nd - 2).all(|i| b.layout.shape[i] == 1 || b.layout.strides[i] == 0);
    if !batch_free {
        return None;
    }
    let mut one = Layout::contiguous(&b.layout.shape[nd - 2..]);
    one.strides = b.layout.strides[nd - 2..].iter().copied().collect();
    one.offset = b.layout.offset;
    let stored = Buffer {
        addr: b.addr,
        layout: &one,
        dtype: b.dtype,
    };
    let (a, t) = matrix(&stored, code)?;
    Some((a, t, [b.layout.shape[nd - 2], b.layout.shape[nd - 1]]))
}

/// `matmul`'s forward where the batch dimensions differ (right-aligned): each operand either
/// has the output's batch of contiguous matrices or is one matrix repeated ([`repeated`]), so
/// one strided-batched call with a stride of 0 for a repeated operand computes it. `false`
/// for any other broadcast (the host twin's).
fn broadcast_forward(g: &mut Gpu, l: &Launch, (o, code): (u64, i32)) -> Result<bool, String> {
    let (x, y) = (&l.inputs[0], &l.inputs[1]);
    let (sx, sy) = (&x.layout.shape, &y.layout.shape);
    if sx.len() < 2 || sy.len() < 2 {
        return Ok(false);
    }
    let (bx, by) = (&sx[..sx.len() - 2], &sy[..sy.len() - 2]);
    let nb = bx.len().max(by.len());
    let dim = |s: &[usize], i: usize| {
        let pad = nb - s.len();
        if i < pad {
            1
        } else {
            s[i - pad]
        }
    };
    let mut batch_shape = Vec::with_capacity(nb);
    for i in 0..nb {
        let (p, q) = (dim(bx, i), dim(by, i));
        if p != q && p != 1 && q != 1 {
            return Ok(false);
        }
        batch_shape.push(p.max(q));
    }
    let batch: usize = batch_shape.iter().product();
    // each operand: a whole batch of matrices (stride one matrix) or one repeated (stride 0)
    let side = |b: &Buffer, bs: &[usize]| -> Option<(u64, bool, [usize; 2], usize)> {
        let nd = b.layout.shape.len();
        let mat = [b.layout.shape[nd - 2], b.layout.shape[nd - 1]];
        if let Some((a, t, m)) = repeated(b, code) {
            return Some((a, t, m, 0));
        }
        let full = bs.len() == nb && bs.iter().product::<usize>() == batch && bs == batch_shape;
        let (a, t) = matrix(b, code)?;
        full.then_some((a, t, mat, mat[0] * mat[1]))
    };
    let (Some((a, a_t, [n, k], s_a)), Some((b, b_t, [k2, m], s_b))) = (side(x, bx), side(y, by))
    else {
        return Ok(false);
    };
    let out = &l.outputs[0];
    if k != k2 || out.layout.numel() != batch * n * m {
        return Ok(false);
    }
    let p = Product {
        m: n,
        k,
        n: m,
        ta: a_t,
        tb: b_t,
    };
    gemm(g, p, (a, b, o), code, batch, (s_a, s_b, n * m), 0.0)?;
    Ok(true)
}
