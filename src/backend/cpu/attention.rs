//! Causal scaled-dot-product attention on [B, H, T, D] tensors, forward (output and the
//! per-row logsumexp the kernels keep) and the gradients of q, k and v (from the saved
//! inputs and output, recomputing the probabilities as flash-style kernels do). One head at a
//! time, heads in parallel; scale 1/sqrt(D), the mask `j <= i` (PyTorch's `is_causal`; none
//! for an encoder's attention).
//! With `dropout_p`, each probability is kept or dropped by a mask drawn per head from the
//! op's seed (the same mask forward and backward, as the kernels regenerate theirs), and the
//! kept ones scaled by 1/(1 - p); the logsumexp is the undropped softmax's.

use rayon::prelude::*;

use super::linalg::gemm;
use super::rng::Rng;
use super::{saved, CpuDevice, Scratch};
use crate::backend::{Launch, Pass};
use crate::engine::op::{Op, Role};

/// The dropout factor of each probability of head `h` ([t, s]: 0 or 1/(1 - p)); None without
/// dropout.
fn keep(seed: u64, p: f64, h: usize, len: usize) -> Option<Scratch> {
    if p <= 0.0 {
        return None;
    }
    let mut rng = Rng::new(seed ^ ((h as u64) << 32));
    let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
    Some(
        (0..len)
            .map(|_| if rng.uniform() >= p { scale } else { 0.0 })
            .collect(),
    )
}

fn apply(p: &[f64], keep: &Option<Scratch>) -> Scratch {
    match keep {
        Some(k) => p.iter().zip(k.iter()).map(|(a, b)| a * b).collect(),
        None => p.to_vec().into(),
    }
}

struct Dims {
    causal: bool,
    heads: usize,
    t: usize,
    s: usize,
    d: usize,
    dv: usize,
}

/// Per head: the masked, scaled scores' softmax P [t, s] and the logsumexp of each row;
/// `bias` (the head's [t, s] of an additive mask) is added to the scaled scores.
fn probs(q: &[f64], k: &[f64], bias: Option<&[f64]>, n: &Dims) -> (Scratch, Scratch) {
    let scale = 1.0 / (n.d as f64).sqrt();
    let mut p = gemm(n.t, n.d, n.s, q, false, k, true);
    let mut lse = Scratch::zeros(n.t);
    for i in 0..n.t {
        let row = &mut p[i * n.s..(i + 1) * n.s];
        let mut mx = f64::NEG_INFINITY;
        for (j, x) in row.iter_mut().enumerate() {
            if n.causal && j > i {
                *x = f64::NEG_INFINITY;
            } else {
                *x *= scale;
                if let Some(b) = bias {
                    *x += b[i * n.s + j];
                }
                mx = mx.max(*x);
            }
        }
        if mx == f64::NEG_INFINITY {
            // a fully masked row: no weights (the kernels write zeros)
            row.iter_mut().for_each(|x| *x = 0.0);
            lse[i] = f64::NEG_INFINITY;
            continue;
        }
        let sum: f64 = row.iter().map(|x| (x - mx).exp()).sum();
        for x in row.iter_mut() {
            *x = (*x - mx).exp() / sum;
        }
        lse[i] = mx + sum.ln();
    }
    (p, lse)
}

pub(super) fn launch(d: &mut CpuDevice, l: &Launch) -> Result<(), String> {
    let (qb, kb, vb) = match l.pass {
        Pass::Forward => (&l.inputs[0], &l.inputs[1], &l.inputs[2]),
        Pass::Grad { .. } => (
            saved(l, Role::Input(0))?,
            saved(l, Role::Input(1))?,
            saved(l, Role::Input(2))?,
        ),
    };
    let (qs, ks, vs) = (&qb.layout.shape, &kb.layout.shape, &vb.layout.shape);
    let n = Dims {
        causal: !matches!(l.op, Op::Sdpa { causal: false, .. }),
        heads: qs[0] * qs[1],
        t: qs[2],
        s: ks[2],
        d: qs[3],
        dv: vs[3],
    };
    let (q, k, v) = (d.load(qb)?, d.load(kb)?, d.load(vb)?);
    // an additive mask, broadcast to [B, H, T, S]
    let bias_buf = match l.pass {
        Pass::Forward => l.inputs.get(3),
        Pass::Grad { .. } => l
            .saved
            .iter()
            .find(|(r, _)| *r == Role::Input(3))
            .map(|(_, b)| b),
    };
    let bias = match bias_buf {
        Some(b) => Some(super::elementwise::load_as(
            d,
            b,
            &[qs[0], qs[1], qs[2], ks[2]],
        )?),
        None => None,
    };
    let bias_of = |h: usize| {
        bias.as_ref()
            .map(|b| &b[h * n.t * n.s..(h + 1) * n.t * n.s])
    };
    // grouped-query attention: query head `h` (of B x H) reads key/value head `kv(h)`
    let (hq, hk) = (qs[1].max(1), ks[1].max(1));
    if hq % hk != 0 {
        return Err(format!("attention: {hq} query heads over {hk} key heads"));
    }
    let rep = hq / hk;
    let kv = |h: usize| (h / hq) * hk + (h % hq) / rep;
    let (dropout, seed) = match l.op {
        Op::Sdpa { dropout, seed, .. } => (*dropout, *seed),
        _ => (0.0, 0),
    };
    let head = |x: &[f64], h: usize, rows: usize, cols: usize| {
        x[h * rows * cols..(h + 1) * rows * cols].to_vec()
    };
    match l.pass {
        Pass::Forward => {
            let per: Vec<(Scratch, Scratch)> = (0..n.heads)
                .into_par_iter()
                .map(|h| {
                    let (p, lse) = probs(
                        &head(&q, h, n.t, n.d),
                        &head(&k, kv(h), n.s, n.d),
                        bias_of(h),
                        &n,
                    );
                    let pd = apply(&p, &keep(seed, dropout, h, n.t * n.s));
                    (
                        gemm(
                            n.t,
                            n.s,
                            n.dv,
                            &pd,
                            false,
                            &head(&v, kv(h), n.s, n.dv),
                            false,
                        ),
                        lse,
                    )
                })
                .collect();
            let out: Scratch = per.iter().flat_map(|(o, _)| o.iter().copied()).collect();
            d.store(&l.outputs[0], &out)?;
            // the logsumexp, when kept for backward: the last output, [B, H, rows]
            if let Some(lb) = l.outputs[1..].last().filter(|b| b.layout.shape.len() == 3) {
                let width = *lb.layout.shape.last().unwrap_or(&0);
                let mut all = Scratch::zeros(lb.layout.numel());
                for (h, (_, lse)) in per.iter().enumerate() {
                    for i in 0..n.t.min(width) {
                        all[h * width + i] = lse[i];
                    }
                }
                d.store(lb, &all)?;
            }
            Ok(())
        }
        Pass::Grad { input } => {
            let o = d.load(saved(l, Role::Output)?)?;
            let g = d.load(&l.inputs[0])?;
            let scale = 1.0 / (n.d as f64).sqrt();
            let grads: Vec<Scratch> = (0..n.heads)
                .into_par_iter()
                .map(|h| {
                    let (qh, kh, vh) = (
                        head(&q, h, n.t, n.d),
                        head(&k, kv(h), n.s, n.d),
                        head(&v, kv(h), n.s, n.dv),
                    );
                    let (gh, oh) = (head(&g, h, n.t, n.dv), head(&o, h, n.t, n.dv));
                    let (p, _) = probs(&qh, &kh, bias_of(h), &n);
                    let mask = keep(seed, dropout, h, n.t * n.s);
                    if input == 2 {
                        // dV = P_dropped^T dO
                        return gemm(n.s, n.t, n.dv, &apply(&p, &mask), true, &gh, false);
                    }
                    // dP = (dO V^T) * mask; dS = P * (dP - rowsum(dO * O)) * scale
                    let ds = gemm(n.t, n.dv, n.s, &gh, false, &vh, true);
                    let mut ds = apply(&ds, &mask);
                    for i in 0..n.t {
                        let delta: f64 =
                            (0..n.dv).map(|c| gh[i * n.dv + c] * oh[i * n.dv + c]).sum();
                        for j in 0..n.s {
                            let x = &mut ds[i * n.s + j];
                            *x = p[i * n.s + j] * (*x - delta) * scale;
                        }
                    }
                    if input == 0 {
                        gemm(n.t, n.s, n.d, &ds, false, &kh, false)
                    } else {
                        gemm(n.s, n.t, n.d, &ds, true, &qh, false)
                    }
                })
                .collect();
            if input == 0 || rep == 1 {
                let all: Scratch = grads.iter().flat_map(|g| g.iter().copied()).collect();
                return d.store(&l.outputs[0], &all);
            }
            // a key/value head's gradient sums its group's
            let per = grads.first().map_or(0, |g| g.len());
            let mut all = Scratch::zeros(per * n.heads / rep);
            for (h, g) in grads.iter().enumerate() {
                let at = kv(h) * per;
                for (o, x) in all[at..at + per].iter_mut().zip(g.iter()) {
                    *o += x;
                }
            }
            d.store(&l.outputs[0], &all)
        }
    }
}
