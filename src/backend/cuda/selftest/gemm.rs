//! The self-test's check of cuBLAS matrix products ([`crate::backend::cuda::blas`]) against
//! the engine's matmul on the cpu device: the forward and both operands' gradients, which are
//! products with one operand transposed.

use super::{backprop, check_tol, cpu, random, read, tensor, Check, Gpu, F32_UNIT, TOL};
use crate::backend::cuda::blas::{self, Product};

pub(super) fn checks(g: &Gpu, checks: &mut Vec<Check>) -> Result<(), String> {
    let blas = blas::handle(g.stream.clone())?;
    // sizes that are no multiple of a tile
    let (m, k, n) = (96usize, 257usize, 80usize);
    let av = random(m * k, 1201, -1.0, 1.0);
    let bv = random(k * n, 1202, -1.0, 1.0);
    let rv = random(m * n, 1203, -1.0, 1.0);
    let mut d = cpu();
    let a = tensor(&mut d, &[m, k], &av, true)?;
    let b = tensor(&mut d, &[k, n], &bv, true)?;
    let y = d.matmul(a, b).map_err(|e| e.to_string())?;
    let want = read(&d, y)?;
    let (asl, bsl, rsl) = (g.up(&av)?, g.up(&bv)?, g.up(&rv)?);
    let mut c = g.out(m * n)?;
    let p = Product {
        m,
        k,
        n,
        ta: false,
        tb: false,
    };
    blas::gemm(&blas, p, &asl, &bsl, &mut c)?;
    // a dot product of k terms: up to k float32 roundings
    let tol = |terms: usize| (terms as f64 * F32_UNIT).max(TOL);
    let case = format!("[{m}, {k}] x [{k}, {n}]");
    checks.push(check_tol("gemm", case.clone(), &g.down(&c)?, &want, tol(k)));
    backprop(&mut d, y, &rv)?;
    // dA = G B^T: [m, n] x [n, k], B stored [k, n]
    let ga = d.grad(a).ok_or("no gradient on the cpu device")?;
    let want = read(&d, ga)?;
    let mut o = g.out(m * k)?;
    let p = Product {
        m,
        k: n,
        n: k,
        ta: false,
        tb: true,
    };
    blas::gemm(&blas, p, &rsl, &bsl, &mut o)?;
    checks.push(check_tol(
        "gemm",
        format!("{case}, the left operand's gradient (G B^T)"),
        &g.down(&o)?,
        &want,
        tol(n),
    ));
    // dB = A^T G: [k, m] x [m, n], A stored [m, k]
    let gb = d.grad(b).ok_or("no gradient on the cpu device")?;
    let want = read(&d, gb)?;
    let mut o = g.out(k * n)?;
    let p = Product {
        m: k,
        k: m,
        n,
        ta: true,
        tb: false,
    };
    blas::gemm(&blas, p, &asl, &rsl, &mut o)?;
    checks.push(check_tol(
        "gemm",
        format!("{case}, the right operand's gradient (A^T G)"),
        &g.down(&o)?,
        &want,
        tol(m),
    ));
    Ok(())
}
