//! Optimizer steps on the GPU (`kernels/optim.cu`): SGD, SGD with momentum, Adam and AdamW,
//! one launch per parameter, in place (SGD float32; Adam and AdamW any floating dtype, in
//! double as the cpu device computes). The twin of `src/backend/cpu/optim.rs`; the
//! low-bit optimizers are refused on data devices before they launch.

use cudarc::driver::PushKernelArg;

use super::{contiguous, contiguous_f32, Gpu};
use crate::backend::{Launch, Pass};
use crate::engine::op::{Op, OptimKind};

/// Runs `l` here if a kernel of this family takes it; `false` where none does.
pub(super) fn launch(g: &mut Gpu, l: &Launch) -> Result<bool, String> {
    let (Op::OptimStep(s), Pass::Forward) = (l.op, l.pass) else {
        return Ok(false);
    };
    let n = l.outputs[0].layout.numel();
    if l.outputs.iter().any(|b| b.layout.numel() != n) || l.inputs[0].layout.numel() != n {
        return Ok(false);
    }
    let h = s.hyper;
    let (nn, cfg) = (n as i64, Gpu::elems(n));
    match s.kind {
        OptimKind::Adam | OptimKind::AdamW if l.outputs.len() == 3 => {
            let bufs: Option<Vec<(u64, i32)>> = l.outputs.iter().map(contiguous).collect();
            let (Some(bufs), Some(grad)) = (bufs, contiguous(&l.inputs[0])) else {
                return Ok(false);
            };
            if n == 0 {
                return Ok(true);
            }
            let (b1, b2) = h.betas;
            let t = s.step as i32;
            let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
            let adamw = (s.kind == OptimKind::AdamW) as i32;
            let f = g.function("adam_step")?;
            // the parameter, gradient and both moments hold n contiguous elements each
            g.run(&f, cfg, |b| {
                b.arg(&bufs[0].0)
                    .arg(&bufs[0].1)
                    .arg(&grad.0)
                    .arg(&grad.1)
                    .arg(&bufs[1].0)
                    .arg(&bufs[1].1)
                    .arg(&bufs[2].0)
                    .arg(&bufs[2].1)
                    .arg(&nn)
                    .arg(&h.lr)
                    .arg(&h.betas.0)
                    .arg(&h.betas.1)
                    .arg(&h.eps)
                    .arg(&h.weight_decay)
                    .arg(&bc1)
                    .arg(&bc2)
                    .arg(&adamw);
            })?;
        }
        OptimKind::Sgd | OptimKind::SgdMomentum => {
            let bufs: Option<Vec<u64>> = l.outputs.iter().map(contiguous_f32).collect();
            let (Some(bufs), Some(grad)) = (bufs, l.inputs.first().and_then(contiguous_f32)) else {
                return Ok(false);
            };
            if n == 0 {
                return Ok(true);
            }
            let momentum = s.kind == OptimKind::SgdMomentum;
            if bufs.len() != 1 + momentum as usize {
                return Ok(false);
            }
            // (plain SGD keeps no buffer: the kernel never touches it with momentum 0)
            let buf = *bufs.last().expect("one at least");
            let (lr, mo, wd, first) = (
                h.lr as f32,
                if momentum { h.momentum as f32 } else { 0.0 },
                h.weight_decay as f32,
                (s.step == 1) as i32,
            );
            let f = g.function("sgd_step")?;
            // the parameter, gradient and buffer hold n contiguous floats
            g.run(&f, cfg, |b| {
                b.arg(&bufs[0])
                    .arg(&grad)
                    .arg(&buf)
                    .arg(&nn)
                    .arg(&lr)
                    .arg(&mo)
                    .arg(&wd)
                    .arg(&first);
            })?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}
