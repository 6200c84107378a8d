//! Optimizer updates, one parameter per launch, as PyTorch's single-tensor and foreach
//! implementations compute them (the same arithmetic; foreach only batches the launches).
//!
//! - SGD: `p -= lr * g` (with weight decay, `g += wd * p` first).
//! - SGD with momentum: `buf = g` at the first step, then `buf = momentum * buf + g`;
//!   `p -= lr * buf`.
//! - Adam: `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`,
//!   `p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`; weight decay adds `wd * p`
//!   to `g`. AdamW instead decays the parameter first: `p *= 1 - lr * wd`.

use rayon::prelude::*;

use super::CpuDevice;
use crate::backend::Launch;
use crate::engine::op::{OptimKind, OptimStep};

pub(super) fn step(d: &mut CpuDevice, l: &Launch, s: &OptimStep) -> Result<(), String> {
    let h = s.hyper;
    let mut g = d.load(&l.inputs[0])?;
    let mut p = d.load(&l.outputs[0])?;
    match s.kind {
        OptimKind::Adam8bit
        | OptimKind::AdamW8bit
        | OptimKind::PagedAdamW8bit
        | OptimKind::TorchaoAdam8bit
        | OptimKind::TorchaoAdamW8bit
        | OptimKind::TorchaoAdam4bit
        | OptimKind::TorchaoAdamW4bit => {
            // (the engine refuses them on a computing device before launching)
            return Err(format!(
                "{}'s block-wise low-bit update has no CPU kernel",
                s.kind.name()
            ));
        }
        OptimKind::Sgd | OptimKind::SgdMomentum => {
            if h.weight_decay != 0.0 {
                g.par_iter_mut()
                    .zip(p.par_iter())
                    .for_each(|(g, p)| *g += h.weight_decay * p);
            }
            if s.kind == OptimKind::SgdMomentum {
                let mut buf = d.load(&l.outputs[1])?;
                buf.par_iter_mut().zip(g.par_iter()).for_each(|(b, &gi)| {
                    *b = if s.step == 1 {
                        gi
                    } else {
                        h.momentum * *b + gi
                    };
                });
                d.store(&l.outputs[1], &buf)?;
                g = buf;
            }
            p.par_iter_mut()
                .zip(g.par_iter())
                .for_each(|(p, g)| *p -= h.lr * g);
        }
        OptimKind::Adam | OptimKind::AdamW => {
            let (b1, b2) = h.betas;
            if s.kind == OptimKind::AdamW {
                p.par_iter_mut()
                    .for_each(|p| *p *= 1.0 - h.lr * h.weight_decay);
            } else if h.weight_decay != 0.0 {
                g.par_iter_mut()
                    .zip(p.par_iter())
                    .for_each(|(g, p)| *g += h.weight_decay * p);
            }
            let mut m = d.load(&l.outputs[1])?;
            let mut v = d.load(&l.outputs[2])?;
            let t = s.step as i32;
            let bc1 = 1.0 - b1.powi(t);
            let bc2 = 1.0 - b2.powi(t);
            p.par_iter_mut()
                .zip(m.par_iter_mut())
                .zip(v.par_iter_mut())
                .zip(g.par_iter())
                .for_each(|(((p, m), v), &g)| {
                    *m = b1 * *m + (1.0 - b1) * g;
                    *v = b2 * *v + (1.0 - b2) * g * g;
                    let denom = v.sqrt() / bc2.sqrt() + h.eps;
                    *p -= h.lr / bc1 * *m / denom;
                });
            d.store(&l.outputs[1], &m)?;
            d.store(&l.outputs[2], &v)?;
        }
    }
    d.store(&l.outputs[0], &p)
}
