//! Matrix products on the GPU through cuBLAS (float32, default math mode: no TF32, as
//! PyTorch's `allow_tf32 = False`): `linear` forward and its input's and weight's gradients,
//! and `matmul` of contiguous operands with the same batch dimensions (no broadcasting),
//! forward and backward. The twin of `src/backend/cpu/linalg.rs`; the rest (a bias's
//! gradient, broadcast batches, `addmm`, other dtypes) runs on the host twin.

use cudarc::cublas::result as cublas;

use super::{contiguous_f32, output_f32, Gpu, Strided};
use crate::backend::cuda::blas::Product;
use crate::backend::{Launch, Pass};
use crate::engine::layout::Layout;
use crate::engine::op::{Op, Role};

/// `c = op(a) op(b)` (row-major, contiguous float32 at device addresses).
fn gemm(g: &mut Gpu, p: Product, a: u64, b: u64, c: u64) -> Result<(), String> {
    if p.m == 0 || p.n == 0 {
        return Ok(());
    }
    let cfg = p.config(1.0, 0.0)?;
    let (first, second) = Product::operands(&a, &b);
    let h = g.blas()?;
    // SAFETY: each address holds the contiguous row-major matrix its operand spans (the
    // caller checked the buffers' shapes), and the leading dimensions are those of contiguous
    // storage
    unsafe {
        cublas::sgemm(
            h,
            cfg.transa,
            cfg.transb,
            cfg.m,
            cfg.n,
            cfg.k,
            &cfg.alpha,
            *first as *const f32,
            cfg.lda,
            *second as *const f32,
            cfg.ldb,
            &cfg.beta,
            c as *mut f32,
            cfg.ldc,
        )
    }
    .map_err(|e| format!("cuBLAS sgemm: {e:?}"))
}

/// `out[j] = sum over r of g[r, j]` for contiguous `g` [rows, n] (reduce.cu's `reduce`): a
/// bias's gradient.
fn column_sums(g: &mut Gpu, gr: u64, o: u64, rows: usize, n: usize) -> Result<(), String> {
    use cudarc::driver::PushKernelArg;
    let (mean, outer, len, inner) = (0i32, 1i64, rows as i64, n as i64);
    let f = g.function("reduce")?;
    // SAFETY: g holds rows x n floats, the output n
    unsafe {
        g.stream
            .launch_builder(&f)
            .arg(&mean)
            .arg(&gr)
            .arg(&outer)
            .arg(&len)
            .arg(&inner)
            .arg(&o)
            .launch(Gpu::elems(n))
    }
    .map(|_| ())
    .map_err(|e| format!("a bias's gradient: {e:?}"))
}

/// `y[r, j] += b[j]` for contiguous `y` [rows, n] (elementwise.cu's `binary`, in place).
fn add_rows(g: &mut Gpu, y: u64, b: u64, rows: usize, n: usize) -> Result<(), String> {
    use cudarc::driver::PushKernelArg;
    let ys = Layout::contiguous(&[rows, n]);
    let mut bs = ys.clone();
    bs.strides = smallvec::smallvec![0, 1];
    let (Some(ys), Some(bs)) = (Strided::of(&ys), Strided::of(&bs)) else {
        return Err("a bias over more than 8 dimensions".into());
    };
    let (code, total) = (0i32, (rows * n) as i64);
    let f = g.function("binary")?;
    // SAFETY: y holds rows x n floats, b n; each element is read and written by one thread
    unsafe {
        g.stream
            .launch_builder(&f)
            .arg(&code)
            .arg(&y)
            .arg(&ys)
            .arg(&b)
            .arg(&bs)
            .arg(&y)
            .arg(&total)
            .launch(Gpu::elems(rows * n))
    }
    .map(|_| ())
    .map_err(|e| format!("linear's bias: {e:?}"))
}

fn saved_f32(l: &Launch, r: Role) -> Option<(u64, Vec<usize>)> {
    l.saved
        .iter()
        .find(|(role, _)| *role == r)
        .and_then(|(_, b)| Some((contiguous_f32(b)?, b.layout.shape.to_vec())))
}

/// `y = x W' + b` with `x` [rows, k] and `W'` the weight [n, k] transposed (`wt`: linear) or
/// [k, n] as it is (addmm), the bias [n] (a full [rows, n] one runs on the host), forward and
/// the gradient of the input, the weight or the bias.
fn dense(g: &mut Gpu, l: &Launch, pass: Pass, o: u64, wt: bool) -> Result<bool, String> {
    let out = &l.outputs[0];
    match pass {
        Pass::Forward => {
            let (Some(x), Some(w)) = (contiguous_f32(&l.inputs[0]), contiguous_f32(&l.inputs[1]))
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
                Some(b) if b.layout.numel() == n => match contiguous_f32(b) {
                    Some(b) => Some(b),
                    None => return Ok(false),
                },
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
            gemm(g, p, x, w, o)?;
            if let Some(b) = bias {
                add_rows(g, o, b, rows, n)?;
            }
        }
        Pass::Grad { input } => {
            let Some(gr) = contiguous_f32(&l.inputs[0]) else {
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
                    let Some((w, ws)) = saved_f32(l, Role::Input(1)) else {
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
                    gemm(g, p, gr, w, o)?;
                }
                1 => {
                    // linear's [n, k] = grad^T @ x; addmm's [k, n] = x^T @ grad
                    let Some((x, xs)) = saved_f32(l, Role::Input(0)) else {
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
                        (p, gr, x)
                    } else {
                        let p = Product {
                            m: k,
                            k: rows,
                            n,
                            ta: true,
                            tb: false,
                        };
                        (p, x, gr)
                    };
                    gemm(g, p, a, b, o)?;
                }
                _ => {
                    // a bias of [n]: its columns' sums (a full one's is the gradient itself)
                    if out.layout.numel() != n {
                        return Ok(false);
                    }
                    column_sums(g, gr, o, rows, n)?;
                }
            }
        }
    }
    Ok(true)
}

/// Runs `l` here if cuBLAS takes it; `false` where it does not.
pub(super) fn launch(g: &mut Gpu, l: &Launch) -> Result<bool, String> {
    let Some((out, o)) = output_f32(l) else {
        return Ok(false);
    };
    match (l.op, l.pass) {
        // `linear` keeps its weight as [out, in], `addmm` (GPT-2's Conv1D) as [in, out]
        (Op::Linear, pass) => return dense(g, l, pass, o, true),
        (Op::Addmm, pass) => return dense(g, l, pass, o, false),
        (Op::Matmul, pass) => {
            // contiguous [batch.., r, c] operands with equal batch dimensions only
            let shapes = match pass {
                Pass::Forward => (
                    l.inputs[0].layout.shape.to_vec(),
                    l.inputs[1].layout.shape.to_vec(),
                ),
                Pass::Grad { .. } => {
                    let (Some((_, a)), Some((_, b))) =
                        (saved_f32(l, Role::Input(0)), saved_f32(l, Role::Input(1)))
                    else {
                        return Ok(false);
                    };
                    (a, b)
                }
            };
            let (sa, sb) = shapes;
            if sa.len() < 2 || sa.len() != sb.len() || sa[..sa.len() - 2] != sb[..sb.len() - 2] {
                return Ok(false);
            }
            let nd = sa.len();
            let (n, k, m) = (sa[nd - 2], sa[nd - 1], sb[nd - 1]);
            if sb[nd - 2] != k {
                return Ok(false);
            }
            let batch: usize = sa[..nd - 2].iter().product();
            let (pa, pb, p, sa_el, sb_el) = match pass {
                Pass::Forward => {
                    let (Some(a), Some(b)) =
                        (contiguous_f32(&l.inputs[0]), contiguous_f32(&l.inputs[1]))
                    else {
                        return Ok(false);
                    };
                    let p = Product {
                        m: n,
                        k,
                        n: m,
                        ta: false,
                        tb: false,
                    };
                    (a, b, p, n * k, k * m)
                }
                Pass::Grad { input } => {
                    let Some(gr) = contiguous_f32(&l.inputs[0]) else {
                        return Ok(false);
                    };
                    if input == 0 {
                        let (b, _) = saved_f32(l, Role::Input(1)).expect("checked above");
                        // [n, m] @ [k, m]^T
                        let p = Product {
                            m: n,
                            k: m,
                            n: k,
                            ta: false,
                            tb: true,
                        };
                        (gr, b, p, n * m, k * m)
                    } else {
                        let (a, _) = saved_f32(l, Role::Input(0)).expect("checked above");
                        // [n, k]^T @ [n, m]
                        let p = Product {
                            m: k,
                            k: n,
                            n: m,
                            ta: true,
                            tb: false,
                        };
                        (a, gr, p, n * k, n * m)
                    }
                }
            };
            if out.layout.numel() != batch * p.m * p.n {
                return Ok(false);
            }
            for i in 0..batch as u64 {
                gemm(
                    g,
                    p,
                    pa + 4 * i * sa_el as u64,
                    pb + 4 * i * sb_el as u64,
                    o + 4 * i * (p.m * p.n) as u64,
                )?;
            }
        }
        _ => return Ok(false),
    }
    Ok(true)
}
