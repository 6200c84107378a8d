//! The CPU twins of the vision kernels: `conv2d` (direct, grouped, strided, dilated, padded)
//! and its input, weight and bias gradients; batch norm in training (batch statistics, the
//! running statistics updated in place with the unbiased variance) and its gradients;
//! `max_pool2d` with its indices (the flat position in the input plane, as PyTorch stores
//! them) and its scatter back; `adaptive_avg_pool2d` and its spread back.

use rayon::prelude::*;

use super::{saved, CpuDevice, Scratch};
use crate::backend::{Launch, Pass};
use crate::engine::op::vision::{Conv, Pool};
use crate::engine::op::{Op, Role};

/// `[N, C, H, W]`.
fn nchw(s: &[usize]) -> (usize, usize, usize, usize) {
    (s[0], s[1], s[2], s[3])
}

/// For each output position along one axis and each kernel tap, the input position (None in
/// the padding).
fn tap(o: usize, k: usize, c: &Conv, n: usize) -> Option<usize> {
    let i = (o * c.stride + k * c.dilation) as i64 - c.padding as i64;
    (i >= 0 && (i as usize) < n).then_some(i as usize)
}

pub(super) fn launch(d: &mut CpuDevice, l: &Launch) -> Result<(), String> {
    match (l.op, l.pass) {
        (Op::Conv2d(c), Pass::Forward) => {
            let (x, w) = (d.load(&l.inputs[0])?, d.load(&l.inputs[1])?);
            let b = l.inputs.get(2).map(|b| d.load(b)).transpose()?;
            let xs = &l.inputs[0].layout.shape;
            let ws = &l.inputs[1].layout.shape;
            let ys = l.outputs[0].layout.shape.clone();
            let y = conv_forward(c, &x, xs, &w, ws, b.as_ref().map(|v| v.as_slice()), &ys);
            d.store(&l.outputs[0], &y)
        }
        (Op::Conv2d(c), Pass::Grad { input }) => {
            let g = d.load(&l.inputs[0])?;
            let gs = l.inputs[0].layout.shape.clone();
            let xb = saved(l, Role::Input(0))?;
            let wb = saved(l, Role::Input(1))?;
            let (xs, ws) = (xb.layout.shape.clone(), wb.layout.shape.clone());
            let v = match input {
                0 => {
                    let w = d.load(wb)?;
                    conv_grad_input(c, &g, &gs, &w, &ws, &xs)
                }
                1 => {
                    let x = d.load(xb)?;
                    conv_grad_weight(c, &g, &gs, &x, &xs, &ws)
                }
                _ => {
                    let (n, k, h, w) = nchw(&gs);
                    (0..k)
                        .map(|kk| {
                            (0..n)
                                .map(|nn| {
                                    g[(nn * k + kk) * h * w..(nn * k + kk + 1) * h * w]
                                        .iter()
                                        .sum::<f64>()
                                })
                                .sum()
                        })
                        .collect()
                }
            };
            d.store(&l.outputs[0], &v)
        }
        (Op::BatchNorm(bn), Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let (gamma, beta) = (d.load(&l.inputs[1])?, d.load(&l.inputs[2])?);
            let shape = l.inputs[0].layout.shape.clone();
            let (n, c) = (shape[0], shape[1]);
            let inner: usize = shape[2..].iter().product();
            let count = n * inner;
            let at = |nn: usize, cc: usize, i: usize| (nn * c + cc) * inner + i;
            let (mut mean, mut invstd) = (vec![0.0; c], vec![0.0; c]);
            let mut var_unbiased = vec![0.0; c];
            if bn.training {
                for cc in 0..c {
                    let mut s = 0.0;
                    for nn in 0..n {
                        for i in 0..inner {
                            s += x[at(nn, cc, i)];
                        }
                    }
                    let mu = s / count as f64;
                    let mut q = 0.0;
                    for nn in 0..n {
                        for i in 0..inner {
                            let dv = x[at(nn, cc, i)] - mu;
                            q += dv * dv;
                        }
                    }
                    mean[cc] = mu;
                    invstd[cc] = 1.0 / (q / count as f64 + bn.eps).sqrt();
                    var_unbiased[cc] = if count > 1 {
                        q / (count - 1) as f64
                    } else {
                        0.0
                    };
                }
            } else {
                let (rm, rv) = (d.load(&l.inputs[3])?, d.load(&l.inputs[4])?);
                for cc in 0..c {
                    mean[cc] = rm[cc];
                    invstd[cc] = 1.0 / (rv[cc] + bn.eps).sqrt();
                }
            }
            let mut y = Scratch::zeros(x.len());
            for nn in 0..n {
                for cc in 0..c {
                    for i in 0..inner {
                        let k = at(nn, cc, i);
                        y[k] = (x[k] - mean[cc]) * invstd[cc] * gamma[cc] + beta[cc];
                    }
                }
            }
            d.store(&l.outputs[0], &y)?;
            if bn.training {
                let m = bn.momentum;
                let (mut rm, mut rv) = (d.load(&l.inputs[3])?, d.load(&l.inputs[4])?);
                for cc in 0..c {
                    rm[cc] = (1.0 - m) * rm[cc] + m * mean[cc];
                    rv[cc] = (1.0 - m) * rv[cc] + m * var_unbiased[cc];
                }
                d.store(&l.inputs[3], &rm)?;
                d.store(&l.inputs[4], &rv)?;
                if let (Some(sm), Some(si)) = (l.outputs.get(1), l.outputs.get(2)) {
                    d.store(sm, &mean)?;
                    d.store(si, &invstd)?;
                }
            }
            Ok(())
        }
        (Op::BatchNorm(_), Pass::Grad { input }) => {
            let g = d.load(&l.inputs[0])?;
            let xb = saved(l, Role::Input(0))?;
            let shape = xb.layout.shape.clone();
            let x = d.load(xb)?;
            let mean = d.load(saved(l, Role::Extra(0))?)?;
            let invstd = d.load(saved(l, Role::Extra(1))?)?;
            let (n, c) = (shape[0], shape[1]);
            let inner: usize = shape[2..].iter().product();
            let count = (n * inner) as f64;
            let at = |nn: usize, cc: usize, i: usize| (nn * c + cc) * inner + i;
            // per channel: sum of g, sum of g * xhat
            let mut sg = vec![0.0; c];
            let mut sgx = vec![0.0; c];
            for nn in 0..n {
                for cc in 0..c {
                    for i in 0..inner {
                        let k = at(nn, cc, i);
                        sg[cc] += g[k];
                        sgx[cc] += g[k] * (x[k] - mean[cc]) * invstd[cc];
                    }
                }
            }
            let v: Scratch = match input {
                0 => {
                    let gamma = d.load(saved(l, Role::Input(1))?)?;
                    let mut gx = Scratch::zeros(x.len());
                    for nn in 0..n {
                        for cc in 0..c {
                            for i in 0..inner {
                                let k = at(nn, cc, i);
                                let xhat = (x[k] - mean[cc]) * invstd[cc];
                                gx[k] = gamma[cc] * invstd[cc] / count
                                    * (count * g[k] - sg[cc] - xhat * sgx[cc]);
                            }
                        }
                    }
                    gx
                }
                1 => Scratch::from(sgx),
                _ => Scratch::from(sg),
            };
            d.store(&l.outputs[0], &v)
        }
        (Op::MaxPool2d(p), Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let xs = l.inputs[0].layout.shape.clone();
            let ys = l.outputs[0].layout.shape.clone();
            let (y, idx) = max_pool(p, &x, &xs, &ys);
            d.store(&l.outputs[0], &y)?;
            if let Some(ib) = l.outputs.get(1) {
                d.store(ib, &idx)?;
            }
            Ok(())
        }
        (Op::MaxPool2d(p), Pass::Grad { .. }) => {
            let g = d.load(&l.inputs[0])?;
            let xb = saved(l, Role::Input(0))?;
            let xs = xb.layout.shape.clone();
            let idx = match saved(l, Role::Extra(0)) {
                Ok(b) => d.load(b)?,
                Err(_) => {
                    let x = d.load(xb)?;
                    max_pool(p, &x, &xs, &l.inputs[0].layout.shape).1
                }
            };
            let (n, c, h, w) = nchw(&xs);
            let plane_out = g.len() / (n * c).max(1);
            let mut gx = Scratch::zeros(n * c * h * w);
            for plane in 0..n * c {
                for o in 0..plane_out {
                    let i = idx[plane * plane_out + o] as usize;
                    gx[plane * h * w + i] += g[plane * plane_out + o];
                }
            }
            d.store(&l.outputs[0], &gx)
        }
        (Op::AdaptiveAvgPool2d { out }, Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let (n, c, h, w) = nchw(&l.inputs[0].layout.shape);
            let mut y = Scratch::zeros(n * c * out[0] * out[1]);
            adaptive_windows(n * c, (h, w), *out, |o, at, count| {
                y[o] = at.map(|k| x[k]).sum::<f64>() / count as f64;
            });
            d.store(&l.outputs[0], &y)
        }
        (Op::AdaptiveAvgPool2d { out }, Pass::Grad { .. }) => {
            let g = d.load(&l.inputs[0])?;
            // the gradient is in the input's shape (the input itself is not kept for 1 x 1)
            let (n, c, h, w) = nchw(&l.outputs[0].layout.shape);
            let mut gx = Scratch::zeros(n * c * h * w);
            adaptive_windows(n * c, (h, w), *out, |o, at, count| {
                let share = g[o] / count as f64;
                for k in at {
                    gx[k] += share;
                }
            });
            d.store(&l.outputs[0], &gx)
        }
        _ => Err(format!(
            "the cpu device has no {:?} kernel for {}",
            l.pass,
            l.op.name()
        )),
    }
}

/// `y[n, k, oy, ox] = b[k] + sum over the group's channels and taps of x * w`.
fn conv_forward(
    c: &Conv,
    x: &[f64],
    xs: &[usize],
    w: &[f64],
    ws: &[usize],
    bias: Option<&[f64]>,
    ys: &[usize],
) -> Scratch {
    let (_, ci, h, wd) = nchw(xs);
    let (k, cg, r, s) = nchw(ws);
    let (_, _, oh, ow) = nchw(ys);
    let kg = k / c.groups;
    let mut y = Scratch::zeros(ys.iter().product());
    y.par_chunks_mut(oh * ow)
        .enumerate()
        .for_each(|(plane, yp)| {
            let (nn, kk) = (plane / k, plane % k);
            let g0 = (kk / kg) * cg;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = bias.map_or(0.0, |b| b[kk]);
                    for cc in 0..cg {
                        let xbase = (nn * ci + g0 + cc) * h * wd;
                        let wbase = (kk * cg + cc) * r * s;
                        for a in 0..r {
                            let Some(iy) = tap(oy, a, c, h) else { continue };
                            for b in 0..s {
                                if let Some(ix) = tap(ox, b, c, wd) {
                                    acc += x[xbase + iy * wd + ix] * w[wbase + a * s + b];
                                }
                            }
                        }
                    }
                    yp[oy * ow + ox] = acc;
                }
            }
        });
    y
}

/// The input's gradient: each output's gradient spread back through the taps that made it.
fn conv_grad_input(
    c: &Conv,
    g: &[f64],
    gs: &[usize],
    w: &[f64],
    ws: &[usize],
    xs: &[usize],
) -> Scratch {
    let (n, ci, h, wd) = nchw(xs);
    let (k, cg, r, s) = nchw(ws);
    let (_, _, oh, ow) = nchw(gs);
    let kg = k / c.groups;
    let mut gx = Scratch::zeros(n * ci * h * wd);
    gx.par_chunks_mut(h * wd)
        .enumerate()
        .for_each(|(plane, gxp)| {
            let (nn, ch) = (plane / ci, plane % ci);
            let grp = ch / cg;
            let cc = ch % cg;
            for kk in grp * kg..(grp + 1) * kg {
                let gbase = (nn * k + kk) * oh * ow;
                let wbase = (kk * cg + cc) * r * s;
                for oy in 0..oh {
                    for a in 0..r {
                        let Some(iy) = tap(oy, a, c, h) else { continue };
                        for ox in 0..ow {
                            let gv = g[gbase + oy * ow + ox];
                            for b in 0..s {
                                if let Some(ix) = tap(ox, b, c, wd) {
                                    gxp[iy * wd + ix] += gv * w[wbase + a * s + b];
                                }
                            }
                        }
                    }
                }
            }
        });
    let _ = gs[0];
    gx
}

/// The weight's gradient: each tap's products of output gradient and input, summed.
fn conv_grad_weight(
    c: &Conv,
    g: &[f64],
    gs: &[usize],
    x: &[f64],
    xs: &[usize],
    ws: &[usize],
) -> Scratch {
    let (n, ci, h, wd) = nchw(xs);
    let (k, cg, r, s) = nchw(ws);
    let (_, _, oh, ow) = nchw(gs);
    let kg = k / c.groups;
    let mut gw = Scratch::zeros(k * cg * r * s);
    gw.par_chunks_mut(r * s).enumerate().for_each(|(f, gwf)| {
        let (kk, cc) = (f / cg, f % cg);
        let ch = (kk / kg) * cg + cc;
        for nn in 0..n {
            let gbase = (nn * k + kk) * oh * ow;
            let xbase = (nn * ci + ch) * h * wd;
            for a in 0..r {
                for b in 0..s {
                    let mut acc = 0.0;
                    for oy in 0..oh {
                        let Some(iy) = tap(oy, a, c, h) else { continue };
                        for ox in 0..ow {
                            if let Some(ix) = tap(ox, b, c, wd) {
                                acc += g[gbase + oy * ow + ox] * x[xbase + iy * wd + ix];
                            }
                        }
                    }
                    gwf[a * s + b] += acc;
                }
            }
        }
    });
    gw
}

/// The window maxima and their flat positions in the input plane (the first of equal maxima).
fn max_pool(p: &Pool, x: &[f64], xs: &[usize], ys: &[usize]) -> (Scratch, Scratch) {
    let (n, c, h, w) = nchw(xs);
    let (_, _, oh, ow) = nchw(ys);
    let conv = Conv {
        stride: p.stride,
        padding: p.padding,
        dilation: 1,
        groups: 1,
    };
    let mut y = Scratch::zeros(n * c * oh * ow);
    let mut idx = Scratch::zeros(n * c * oh * ow);
    for plane in 0..n * c {
        for oy in 0..oh {
            for ox in 0..ow {
                let (mut best, mut at) = (f64::NEG_INFINITY, 0usize);
                for a in 0..p.kernel {
                    let Some(iy) = tap(oy, a, &conv, h) else {
                        continue;
                    };
                    for b in 0..p.kernel {
                        if let Some(ix) = tap(ox, b, &conv, w) {
                            let v = x[plane * h * w + iy * w + ix];
                            if v > best || v.is_nan() {
                                (best, at) = (v, iy * w + ix);
                            }
                        }
                    }
                }
                y[plane * oh * ow + oy * ow + ox] = best;
                idx[plane * oh * ow + oy * ow + ox] = at as f64;
            }
        }
    }
    (y, idx)
}

/// Each output of an adaptive average pool of `planes` planes of `(h, w)` to `[oh, ow]`: its
/// flat index, the flat indices of its window (rows `floor(i h / oh)` to `ceil((i + 1) h / oh)`,
/// columns likewise) and the window's size.
fn adaptive_windows(
    planes: usize,
    (h, w): (usize, usize),
    [oh, ow]: [usize; 2],
    mut f: impl FnMut(usize, &mut dyn Iterator<Item = usize>, usize),
) {
    for plane in 0..planes {
        for i in 0..oh {
            let (h0, h1) = (i * h / oh, ((i + 1) * h).div_ceil(oh));
            for j in 0..ow {
                let (w0, w1) = (j * w / ow, ((j + 1) * w).div_ceil(ow));
                let mut at =
                    (h0..h1).flat_map(|a| (w0..w1).map(move |b| plane * h * w + a * w + b));
                f(plane * oh * ow + i * ow + j, &mut at, (h1 - h0) * (w1 - w0));
            }
        }
    }
}
