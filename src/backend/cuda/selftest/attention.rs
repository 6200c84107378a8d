//! The self-test's check of `kernels/attention.cu` against the engine's
//! `scaled_dot_product_attention` on the cpu device (causal, float32: the memory-efficient
//! kernel's), forward and the gradients of q, k and v.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{backprop, check_tol, cpu, random, read, tensor, Check, Gpu, F32_UNIT, TOL};

pub(super) fn checks(g: &Gpu, checks: &mut Vec<Check>) -> Result<(), String> {
    let (b, h, t, d) = (2usize, 3usize, 40usize, 24usize);
    let n = b * h * t * d;
    let shape = [b, h, t, d];
    let (qv, kv, vv) = (
        random(n, 1301, -1.5, 1.5),
        random(n, 1302, -1.5, 1.5),
        random(n, 1303, -1.5, 1.5),
    );
    let rv = random(n, 1304, -1.0, 1.0);
    let mut c = cpu();
    let q = tensor(&mut c, &shape, &qv, true)?;
    let k = tensor(&mut c, &shape, &kv, true)?;
    let v = tensor(&mut c, &shape, &vv, true)?;
    let y = c.sdpa(q, k, v).map_err(|e| e.to_string())?;
    let want = read(&c, y)?;
    let (qs, ks, vs, rs) = (g.up(&qv)?, g.up(&kv)?, g.up(&vv)?, g.up(&rv)?);
    let mut out = g.out(n)?;
    let mut lse = g.out(b * h * t)?;
    let cfg = LaunchConfig {
        grid_dim: (t as u32, (b * h) as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let (tt, ss, dd, width, causal) = (t as i64, t as i64, d as i64, t as i64, 1i32);
    let scale = 1.0 / (d as f32).sqrt();
    let f = g.function("attention")?;
    // SAFETY: q, k, v and out hold [b*h, t, d] floats, lse b*h*t; t keys fit the kernel's
    // shared row
    unsafe {
        g.stream
            .launch_builder(&f)
            .arg(&qs)
            .arg(&ks)
            .arg(&vs)
            .arg(&mut out)
            .arg(&mut lse)
            .arg(&tt)
            .arg(&ss)
            .arg(&dd)
            .arg(&dd)
            .arg(&width)
            .arg(&causal)
            .arg(&scale)
            .launch(cfg)
    }
    .map_err(|e| format!("{e:?}"))?;
    // a softmax over up to t keys of dot products of d terms, then a weighted sum over the
    // keys: about t + d float32 roundings, and as many again in backward's recomputation
    let tol = ((t + d) as f64 * F32_UNIT).max(TOL);
    let case = format!("causal, [{b}, {h}, {t}, {d}]");
    let got = g.down(&out)?;
    checks.push(check_tol("attention", case.clone(), &got, &want, tol));
    backprop(&mut c, y, &rv)?;
    let (mut gq, mut gk, mut gv) = (g.out(n)?, g.out(n)?, g.out(n)?);
    let f = g.function("attention_backward")?;
    // SAFETY: as the forward; gq, gk, gv hold [b*h, t, d] floats (gk and gv zeroed)
    unsafe {
        g.stream
            .launch_builder(&f)
            .arg(&rs)
            .arg(&qs)
            .arg(&ks)
            .arg(&vs)
            .arg(&out)
            .arg(&lse)
            .arg(&mut gq)
            .arg(&mut gk)
            .arg(&mut gv)
            .arg(&tt)
            .arg(&ss)
            .arg(&dd)
            .arg(&dd)
            .arg(&width)
            .arg(&causal)
            .arg(&scale)
            .launch(cfg)
    }
    .map_err(|e| format!("{e:?}"))?;
    for (name, gpu, leaf) in [("q", &gq, q), ("k", &gk, k), ("v", &gv, v)] {
        let gt = c.grad(leaf).ok_or("no gradient on the cpu device")?;
        let want = read(&c, gt)?;
        checks.push(check_tol(
            "attention_backward",
            format!("{case}, the gradient of {name}"),
            &g.down(gpu)?,
            &want,
            2.0 * tol,
        ));
    }
    Ok(())
}
