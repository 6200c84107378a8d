//! Row-wise and indexing kernels: layer_norm and rms_norm, softmax and log_softmax,
//! reductions, embedding, nll_loss, and backward's plumbing (sums to a broadcast operand's
//! shape, the scatter of a view's gradient, split's concatenation). Forward and backward of
//! each side by side.

use rayon::prelude::*;

use super::elementwise::sum_to;
use super::{for_each_offset, saved, CpuDevice, Scratch};
use crate::backend::{Buffer, Launch, Pass};
use crate::engine::layout::{wrap_dim, Layout};
use crate::engine::op::{Norm, Op, Role};

fn last(shape: &[usize]) -> usize {
    shape.last().copied().unwrap_or(1).max(1)
}

/// Values of `b` with dimension `dim` moved last (so rows along `dim` are contiguous), and the
/// moved layout, to write results back through.
fn dim_last(b: &Buffer, dim: usize) -> Layout {
    let nd = b.layout.ndim();
    let mut perm: Vec<i64> = (0..nd as i64).filter(|&d| d != dim as i64).collect();
    perm.push(dim as i64);
    b.layout.permute(&perm).expect("a permutation")
}

pub(super) fn load_moved(
    d: &CpuDevice,
    b: &Buffer,
    dim: usize,
) -> Result<(Scratch, Layout), String> {
    let l = dim_last(b, dim);
    let v = d.load(&Buffer {
        addr: b.addr,
        layout: &l,
        dtype: b.dtype,
    })?;
    Ok((v, l))
}

pub(super) fn store_moved(
    d: &mut CpuDevice,
    b: &Buffer,
    dim: usize,
    v: &[f64],
) -> Result<(), String> {
    let l = dim_last(b, dim);
    d.store(
        &Buffer {
            addr: b.addr,
            layout: &l,
            dtype: b.dtype,
        },
        v,
    )
}

pub(super) fn launch(d: &mut CpuDevice, l: &Launch) -> Result<(), String> {
    let out = &l.outputs[0];
    let oshape = out.layout.shape.clone();
    match (l.op, l.pass) {
        (Op::Norm(Norm::Layer { eps }), Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let c = last(&l.inputs[0].layout.shape);
            let w = l.inputs.get(1).map(|b| d.load(b)).transpose()?;
            let bias = l.inputs.get(2).map(|b| d.load(b)).transpose()?;
            let rows = x.len() / c;
            let (mut y, mut mean, mut rstd) = (
                Scratch::zeros(x.len()),
                Scratch::zeros(rows),
                Scratch::zeros(rows),
            );
            y.par_chunks_mut(c)
                .zip(mean.par_iter_mut().zip(rstd.par_iter_mut()))
                .enumerate()
                .for_each(|(r, (yr, (mean, rstd)))| {
                    let row = &x[r * c..(r + 1) * c];
                    let mu = row.iter().sum::<f64>() / c as f64;
                    let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / c as f64;
                    let rs = 1.0 / (var + eps).sqrt();
                    (*mean, *rstd) = (mu, rs);
                    for j in 0..c {
                        let mut v = (row[j] - mu) * rs;
                        if let Some(w) = &w {
                            v *= w[j];
                        }
                        if let Some(b) = &bias {
                            v += b[j];
                        }
                        yr[j] = v;
                    }
                });
            d.store(out, &y)?;
            if let (Some(m), Some(s)) = (l.outputs.get(1), l.outputs.get(2)) {
                d.store(m, &mean)?;
                d.store(s, &rstd)?;
            }
            Ok(())
        }
        (Op::Norm(Norm::Layer { .. }), Pass::Grad { input }) => {
            let g = d.load(&l.inputs[0])?;
            let x = d.load(saved(l, Role::Input(0))?)?;
            let mean = d.load(saved(l, Role::Extra(0))?)?;
            let rstd = d.load(saved(l, Role::Extra(1))?)?;
            let c = last(&saved(l, Role::Input(0))?.layout.shape);
            let rows = x.len() / c;
            let xhat = |r: usize, j: usize| (x[r * c + j] - mean[r]) * rstd[r];
            let v = match input {
                0 => {
                    let w = match saved(l, Role::Input(1)) {
                        Ok(b) => d.load(b)?,
                        Err(_) => Scratch::filled(c, 1.0),
                    };
                    let mut gx = Scratch::zeros(x.len());
                    gx.par_chunks_mut(c).enumerate().for_each(|(r, gxr)| {
                        let (mut s1, mut s2) = (0.0, 0.0);
                        for j in 0..c {
                            let gh = g[r * c + j] * w[j];
                            s1 += gh;
                            s2 += gh * xhat(r, j);
                        }
                        for j in 0..c {
                            let gh = g[r * c + j] * w[j];
                            gxr[j] = rstd[r] * (gh - s1 / c as f64 - xhat(r, j) * s2 / c as f64);
                        }
                    });
                    gx
                }
                1 => (0..c)
                    .into_par_iter()
                    .map(|j| (0..rows).map(|r| g[r * c + j] * xhat(r, j)).sum())
                    .collect(),
                _ => (0..c)
                    .into_par_iter()
                    .map(|j| (0..rows).map(|r| g[r * c + j]).sum())
                    .collect(),
            };
            d.store(out, &v)
        }
        (Op::Norm(Norm::Rms { eps }), Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let c = last(&l.inputs[0].layout.shape);
            let w = l.inputs.get(1).map(|b| d.load(b)).transpose()?;
            let rows = x.len() / c;
            let (mut y, mut rstd) = (Scratch::zeros(x.len()), Scratch::zeros(rows));
            y.par_chunks_mut(c)
                .zip(rstd.par_iter_mut())
                .enumerate()
                .for_each(|(r, (yr, rstd))| {
                    let row = &x[r * c..(r + 1) * c];
                    let ms = row.iter().map(|v| v * v).sum::<f64>() / c as f64;
                    let rs = 1.0 / (ms + eps).sqrt();
                    *rstd = rs;
                    for j in 0..c {
                        yr[j] = row[j] * rs * w.as_ref().map_or(1.0, |w| w[j]);
                    }
                });
            d.store(out, &y)?;
            if let Some(s) = l.outputs.get(1) {
                d.store(s, &rstd)?;
            }
            Ok(())
        }
        (Op::Norm(Norm::Rms { .. }), Pass::Grad { input }) => {
            let g = d.load(&l.inputs[0])?;
            let x = d.load(saved(l, Role::Input(0))?)?;
            let rstd = d.load(saved(l, Role::Extra(0))?)?;
            let c = last(&saved(l, Role::Input(0))?.layout.shape);
            let rows = x.len() / c;
            let v = if input == 0 {
                let w = match saved(l, Role::Input(1)) {
                    Ok(b) => d.load(b)?,
                    Err(_) => Scratch::filled(c, 1.0),
                };
                let mut gx = Scratch::zeros(x.len());
                gx.par_chunks_mut(c).enumerate().for_each(|(r, gxr)| {
                    let rs = rstd[r];
                    let dot: f64 = (0..c).map(|j| g[r * c + j] * w[j] * x[r * c + j]).sum();
                    for j in 0..c {
                        gxr[j] =
                            rs * g[r * c + j] * w[j] - rs * rs * rs * x[r * c + j] * dot / c as f64;
                    }
                });
                gx
            } else {
                (0..c)
                    .into_par_iter()
                    .map(|j| {
                        (0..rows)
                            .map(|r| g[r * c + j] * x[r * c + j] * rstd[r])
                            .sum()
                    })
                    .collect()
            };
            d.store(out, &v)
        }
        (Op::Softmax { dim, log, .. }, pass) => {
            let nd = oshape.len();
            let dim = wrap_dim(*dim, nd).map_err(|e| e.0)?;
            let src = match pass {
                Pass::Forward => &l.inputs[0],
                Pass::Grad { .. } => saved(l, Role::Output)?,
            };
            let (v, lay) = load_moved(d, src, dim)?;
            let c = lay.shape.last().copied().unwrap_or(1).max(1);

            let mut r = Scratch::zeros(v.len());
            match pass {
                Pass::Forward => {
                    r.par_chunks_mut(c).enumerate().for_each(|(i, ri)| {
                        let row = &v[i * c..(i + 1) * c];
                        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let s: f64 = row.iter().map(|x| (x - mx).exp()).sum();
                        for j in 0..c {
                            ri[j] = if *log {
                                row[j] - mx - s.ln()
                            } else {
                                (row[j] - mx).exp() / s
                            };
                        }
                    });
                }
                Pass::Grad { .. } => {
                    let (g, _) = load_moved(d, &l.inputs[0], dim)?;
                    r.par_chunks_mut(c).enumerate().for_each(|(i, ri)| {
                        let (gr, yr) = (&g[i * c..(i + 1) * c], &v[i * c..(i + 1) * c]);
                        if *log {
                            let s: f64 = gr.iter().sum();
                            for j in 0..c {
                                ri[j] = gr[j] - yr[j].exp() * s;
                            }
                        } else {
                            let s: f64 = gr.iter().zip(yr).map(|(a, b)| a * b).sum();
                            for j in 0..c {
                                ri[j] = yr[j] * (gr[j] - s);
                            }
                        }
                    });
                }
            }
            store_moved(d, out, dim, &r)
        }
        (
            Op::Reduce {
                mean,
                dims,
                keepdim,
            },
            pass,
        ) => {
            let x_shape = match pass {
                Pass::Forward => l.inputs[0].layout.shape.clone(),
                Pass::Grad { .. } => oshape.clone(),
            };
            let red = dims.reduced(x_shape.len()).map_err(|e| e.0)?;
            let count = x_shape
                .iter()
                .zip(&red)
                .filter(|(_, &r)| r)
                .map(|(&s, _)| s)
                .product::<usize>() as f64;
            let scale = if *mean { 1.0 / count.max(1.0) } else { 1.0 };
            // the reduced shape with the reduced dimensions kept as 1
            let kept: Vec<usize> = x_shape
                .iter()
                .zip(&red)
                .map(|(&s, &r)| if r { 1 } else { s })
                .collect();
            let _ = keepdim;
            match pass {
                Pass::Forward => {
                    let x = d.load(&l.inputs[0])?;
                    let s = sum_to(&x, &x_shape, &kept);
                    d.store(out, &s.iter().map(|v| v * scale).collect::<Vec<_>>())
                }
                Pass::Grad { .. } => {
                    let g = d.load(&l.inputs[0])?;
                    let sizes: Vec<i64> = x_shape.iter().map(|&s| s as i64).collect();
                    let gl = Layout::contiguous(&kept).expand(&sizes).map_err(|e| e.0)?;
                    let mut v = Vec::with_capacity(x_shape.iter().product());
                    for_each_offset(&gl, |o| v.push(g[o] * scale));
                    d.store(out, &v)
                }
            }
        }
        (Op::Argmax { dim, .. }, Pass::Forward) => {
            let x_shape = l.inputs[0].layout.shape.clone();
            let x = d.load(&l.inputs[0])?;
            // rows of `n` values `inner` apart (everything: one row); the first largest wins
            let (n, inner) = match dim {
                None => (x.len(), 1),
                Some(dm) => {
                    let k = wrap_dim(*dm, x_shape.len()).map_err(|e| e.0)?;
                    (x_shape[k], x_shape[k + 1..].iter().product())
                }
            };
            let outer = x.len() / (n * inner).max(1);
            let mut v = Vec::with_capacity(outer * inner);
            for o in 0..outer {
                for k in 0..inner {
                    let mut best = 0;
                    for i in 1..n {
                        let (a, b) = (x[(o * n + i) * inner + k], x[(o * n + best) * inner + k]);
                        if a > b || (a.is_nan() && !b.is_nan()) {
                            best = i;
                        }
                    }
                    v.push(best as f64);
                }
            }
            d.store(out, &v)
        }
        (Op::Max, Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let m = x.iter().copied().fold(f64::NEG_INFINITY, |a, b| {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.max(b)
                }
            });
            d.store(out, &[m])
        }
        (Op::Isin, Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let test = d.load(&l.inputs[1])?;
            let v: Vec<f64> = x
                .iter()
                .map(|a| test.iter().any(|t| t == a) as u8 as f64)
                .collect();
            d.store(out, &v)
        }
        (Op::Embedding { .. }, Pass::Forward) => {
            let idx = d.load(&l.inputs[0])?;
            let table = d.load(&l.inputs[1])?;
            let (rows, c) = (l.inputs[1].layout.shape[0], l.inputs[1].layout.shape[1]);
            let mut v = Vec::with_capacity(idx.len() * c);
            for &i in &idx {
                let i = i as i64;
                if i < 0 || i as usize >= rows {
                    return Err(format!(
                        "index {i} is out of range for an embedding of {rows} rows"
                    ));
                }
                v.extend_from_slice(&table[i as usize * c..(i as usize + 1) * c]);
            }
            d.store(out, &v)
        }
        (Op::Embedding { .. }, Pass::Grad { .. }) => {
            let g = d.load(&l.inputs[0])?;
            let idx = d.load(saved(l, Role::Input(0))?)?;
            let c = oshape[1];
            let mut v = Scratch::zeros(oshape[0] * c);
            for (k, &i) in idx.iter().enumerate() {
                let i = i as usize;
                for j in 0..c {
                    v[i * c + j] += g[k * c + j];
                }
            }
            d.store(out, &v)
        }
        (Op::NllLoss, Pass::Forward) => {
            let lp = d.load(&l.inputs[0])?;
            let t = d.load(&l.inputs[1])?;
            let c = l.inputs[0].layout.shape[1];
            let mut total = 0.0;
            let mut n = 0.0;
            for (i, &ti) in t.iter().enumerate() {
                let ti = ti as i64;
                if ti == -100 {
                    continue;
                }
                if ti < 0 || ti as usize >= c {
                    return Err(format!("Target {ti} is out of bounds."));
                }
                total -= lp[i * c + ti as usize];
                n += 1.0;
            }
            d.store(out, &[total / n])?;
            if let Some(w) = l.outputs.get(1) {
                d.store(w, &[n])?;
            }
            Ok(())
        }
        (Op::NllLoss, Pass::Grad { .. }) => {
            let g = d.load(&l.inputs[0])?[0];
            let t = d.load(saved(l, Role::Input(1))?)?;
            let n = d.load(saved(l, Role::Extra(0))?)?[0];
            let c = oshape[1];
            let mut v = Scratch::zeros(oshape[0] * c);
            for (i, &ti) in t.iter().enumerate() {
                if ti as i64 != -100 {
                    v[i * c + ti as usize] = -g / n;
                }
            }
            d.store(out, &v)
        }
        (Op::SumTo, _) => {
            let g = d.load(&l.inputs[0])?;
            let gshape = l.inputs[0].layout.shape.clone();
            d.store(out, &sum_to(&g, &gshape, &oshape))
        }
        (Op::View { rel, .. }, Pass::Grad { .. }) => {
            // zeros in the input's shape, the gradient added through the view's layout
            let g = d.load(&l.inputs[0])?;
            let mut v = Scratch::zeros(oshape.iter().product());
            let mut i = 0;
            for_each_offset(rel, |o| {
                v[o] += g[i];
                i += 1;
            });
            d.store(out, &v)
        }
        (Op::Split { dim, .. }, Pass::Grad { .. }) => {
            // the parts' gradients, in order along `dim`, into the input's shape
            let full = Layout::contiguous(&oshape);
            let mut v = Scratch::zeros(oshape.iter().product());
            let mut at = 0i64;
            for part in l.inputs {
                let n = part.layout.shape[*dim] as i64;
                let sl = full
                    .slice(*dim as i64, Some(at), Some(at + n), 1)
                    .map_err(|e| e.0)?;
                let g = d.load(part)?;
                let mut i = 0;
                for_each_offset(&sl, |o| {
                    v[o] = g[i];
                    i += 1;
                });
                at += n;
            }
            d.store(out, &v)
        }
        (op, pass) => Err(format!("no CPU kernel for {} ({pass:?})", op.name())),
    }
}
