//! A mixture of experts' kernels ([`crate::engine::op::routing`]): topk and sort with their
//! indices (and the scatter of their gradient), row gathers by an index tensor and their
//! accumulating backward, `index_put_`, `histc`, `floor_divide` and the grouped product with
//! both gradients.

use super::nn::{load_moved, store_moved};
use super::{saved, CpuDevice, Scratch};
use crate::backend::{Launch, Pass};
use crate::engine::layout::wrap_dim;
use crate::engine::op::{Op, Role};

/// Rows of `b` after the first dimension: elements per index.
fn row_len(shape: &[usize]) -> usize {
    shape.iter().skip(1).product::<usize>().max(1)
}

/// An index read as a row number below `rows`.
fn row(i: f64, rows: usize, what: &str) -> Result<usize, String> {
    let i = i as i64;
    let r = if i < 0 { i + rows as i64 } else { i };
    if r < 0 || r as usize >= rows {
        return Err(format!(
            "{what}: index {i} is out of bounds for a dimension of size {rows}"
        ));
    }
    Ok(r as usize)
}

/// The group (expert) of each of `s` rows from grouped_mm's cumulative ends; rows past the
/// last end belong to none.
fn groups(offs: &[f64], s: usize) -> Result<Vec<Option<usize>>, String> {
    let mut out = vec![None; s];
    let mut start = 0usize;
    for (e, &end) in offs.iter().enumerate() {
        let end = end as i64;
        if end < start as i64 || end as usize > s {
            return Err(format!(
                "grouped_mm: offs must be non-decreasing and at most {s}, got {end} after {start}"
            ));
        }
        for g in out.iter_mut().take(end as usize).skip(start) {
            *g = Some(e);
        }
        start = end as usize;
    }
    Ok(out)
}

pub(super) fn launch(d: &mut CpuDevice, l: &Launch) -> Result<(), String> {
    let out = &l.outputs[0];
    match (l.op, l.pass) {
        (Op::Topk { k, dim }, Pass::Forward) => select(d, l, *dim, Some(*k)),
        (Op::Sort { dim }, Pass::Forward) => select(d, l, *dim, None),
        (Op::Topk { .. } | Op::Sort { .. }, Pass::Grad { .. }) => {
            let g = &l.inputs[0];
            let idx = saved(l, Role::Extra(0))?;
            let dim = match l.op {
                Op::Topk { dim, .. } | Op::Sort { dim } => *dim,
                _ => unreachable!(),
            };
            let dm = wrap_dim(dim, out.layout.ndim().max(1)).map_err(|e| e.0)?;
            let (gv, gl) = load_moved(d, g, dm)?;
            let (iv, _) = load_moved(d, idx, dm)?;
            let n = out.layout.shape.get(dm).copied().unwrap_or(1).max(1);
            let k = gl.shape.last().copied().unwrap_or(1).max(1);
            let mut v = Scratch::zeros(out.layout.numel());
            for r in 0..gv.len() / k {
                for j in 0..k {
                    let at = row(iv[r * k + j], n, l.op.name())?;
                    v[r * n + at] += gv[r * k + j];
                }
            }
            store_moved(d, out, dm, &v)
        }
        (Op::Gather, Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let idx = d.load(&l.inputs[1])?;
            let shape = &l.inputs[0].layout.shape;
            let (rows, c) = (shape[0], row_len(shape));
            let mut v = Vec::with_capacity(idx.len() * c);
            for &i in idx.iter() {
                let r = row(i, rows, "index")?;
                v.extend_from_slice(&x[r * c..(r + 1) * c]);
            }
            d.store(out, &v)
        }
        (Op::Gather, Pass::Grad { .. }) => {
            let g = d.load(&l.inputs[0])?;
            let idx = d.load(saved(l, Role::Input(1))?)?;
            let shape = &out.layout.shape;
            let (rows, c) = (shape[0], row_len(shape));
            let mut v = Scratch::zeros(out.layout.numel());
            for (k, &i) in idx.iter().enumerate() {
                let r = row(i, rows, "index")?;
                for j in 0..c {
                    v[r * c + j] += g[k * c + j];
                }
            }
            d.store(out, &v)
        }
        (Op::IndexPut, _) => {
            let mut x = d.load(out)?;
            let idx = d.load(&l.inputs[1])?;
            let vals = d.load(&l.inputs[2])?;
            let shape = &out.layout.shape;
            let (rows, c) = (shape[0], row_len(shape));
            for (k, &i) in idx.iter().enumerate() {
                let r = row(i, rows, "index_put_")?;
                x[r * c..(r + 1) * c].copy_from_slice(&vals[k * c..(k + 1) * c]);
            }
            d.store(out, &x)
        }
        (Op::Histc { bins, min, max }, Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            // PyTorch: min == max takes the data's range (widened by one when that is a point)
            let (mut lo, mut hi) = (*min, *max);
            if lo == hi && !x.is_empty() {
                lo = x.iter().copied().fold(f64::INFINITY, f64::min);
                hi = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            }
            if lo == hi {
                (lo, hi) = (lo - 1.0, hi + 1.0);
            }
            let mut v = Scratch::zeros(*bins);
            for &e in x.iter() {
                if e < lo || e > hi || e.is_nan() {
                    continue;
                }
                let b = (((e - lo) / (hi - lo)) * *bins as f64) as usize;
                v[b.min(bins - 1)] += 1.0;
            }
            d.store(out, &v)
        }
        (Op::FloorDiv { value }, Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let v: Scratch = x.iter().map(|a| (a / value).floor()).collect();
            d.store(out, &v)
        }
        (Op::Clamp { min, max }, Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            // (torch.clamp: the max wins where min > max; NaN stays NaN)
            let v: Scratch = x
                .iter()
                .map(|&a| if a.is_nan() { a } else { a.max(*min).min(*max) })
                .collect();
            d.store(out, &v)
        }
        (Op::Bincount { bins }, Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let mut v = Scratch::zeros(*bins);
            for &e in x.iter() {
                if e < 0.0 || e >= *bins as f64 {
                    return Err(format!(
                        "bincount: value {e} outside the {bins} bins minlength gives (gpumem sizes the output by minlength)"
                    ));
                }
                v[e as usize] += 1.0;
            }
            d.store(out, &v)
        }
        (Op::GroupedMm { .. }, Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let w = d.load(&l.inputs[1])?;
            let offs = d.load(&l.inputs[2])?;
            let ws = &l.inputs[1].layout.shape;
            let (kk, n) = (ws[1], ws[2]);
            let s = l.inputs[0].layout.shape[0];
            let gr = groups(&offs, s)?;
            let mut v = Scratch::zeros(s * n);
            for (r, g) in gr.iter().enumerate() {
                let Some(e) = g else { continue };
                for q in 0..kk {
                    let a = x[r * kk + q];
                    let wrow = &w[(e * kk + q) * n..(e * kk + q + 1) * n];
                    for (o, b) in v[r * n..(r + 1) * n].iter_mut().zip(wrow) {
                        *o += a * b;
                    }
                }
            }
            d.store(out, &v)
        }
        (Op::GroupedMm { .. }, Pass::Grad { input }) => {
            let g = d.load(&l.inputs[0])?;
            let offs = d.load(saved(l, Role::Input(2))?)?;
            let s = l.inputs[0].layout.shape[0];
            let n = l.inputs[0].layout.shape[1];
            let gr = groups(&offs, s)?;
            if input == 0 {
                let wb = saved(l, Role::Input(1))?;
                let (ws, w) = (wb.layout.shape.to_vec(), d.load(wb)?);
                let kk = ws[1];
                let mut v = Scratch::zeros(s * kk);
                for (r, gp) in gr.iter().enumerate() {
                    let Some(e) = gp else { continue };
                    for q in 0..kk {
                        let wrow = &w[(e * kk + q) * n..(e * kk + q + 1) * n];
                        v[r * kk + q] = g[r * n..(r + 1) * n]
                            .iter()
                            .zip(wrow)
                            .map(|(a, b)| a * b)
                            .sum();
                    }
                }
                d.store(out, &v)
            } else {
                let xb = saved(l, Role::Input(0))?;
                let (xs, x) = (xb.layout.shape.to_vec(), d.load(xb)?);
                let kk = xs[1];
                let experts = out.layout.shape[0];
                let mut v = Scratch::zeros(experts * kk * n);
                for (r, gp) in gr.iter().enumerate() {
                    let Some(e) = gp else { continue };
                    for q in 0..kk {
                        let a = x[r * kk + q];
                        let dst = &mut v[(e * kk + q) * n..(e * kk + q + 1) * n];
                        for (o, b) in dst.iter_mut().zip(&g[r * n..(r + 1) * n]) {
                            *o += a * b;
                        }
                    }
                }
                d.store(out, &v)
            }
        }
        (op, pass) => Err(format!("no CPU kernel for {} ({pass:?})", op.name())),
    }
}

/// topk (`k`: the largest first, ties in index order) or sort (ascending, stable) along `dim`:
/// the values into the output, the int64 indices into the extra.
fn select(d: &mut CpuDevice, l: &Launch, dim: i64, k: Option<usize>) -> Result<(), String> {
    let x = &l.inputs[0];
    let dm = wrap_dim(dim, x.layout.ndim().max(1)).map_err(|e| e.0)?;
    let (xv, xl) = load_moved(d, x, dm)?;
    let n = xl.shape.last().copied().unwrap_or(1).max(1);
    let take = k.unwrap_or(n);
    let rows = xv.len() / n;
    let (mut vals, mut idx) = (Scratch::zeros(rows * take), Scratch::zeros(rows * take));
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for r in 0..rows {
        let row = &xv[r * n..(r + 1) * n];
        order.clear();
        order.extend(0..n);
        if k.is_some() {
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        } else {
            order.sort_by(|&a, &b| row[a].total_cmp(&row[b]));
        }
        for (j, &o) in order.iter().take(take).enumerate() {
            vals[r * take + j] = row[o];
            idx[r * take + j] = o as f64;
        }
    }
    store_moved(d, &l.outputs[0], dm, &vals)?;
    store_moved(d, &l.outputs[1], dm, &idx)
}
