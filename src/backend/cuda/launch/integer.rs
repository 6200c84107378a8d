//! Integer and bool ops on the GPU (`kernels/elementwise.cu`'s `bitwise`, `cumsum`, `isin`):
//! what generation does to its ids, positions and masks, exact as the cpu twins in
//! `src/backend/cpu/elementwise.rs` and `nn.rs` (values through double: integers up to 2^53).

use cudarc::driver::PushKernelArg;

use super::elementwise::any_view;
use super::{Gpu, Strided};
use crate::backend::{Launch, Pass};
use crate::engine::op::Op;

/// Runs `l` here if the kernels take it; `false` where they do not.
pub(super) fn launch(g: &mut Gpu, l: &Launch) -> Result<bool, String> {
    if l.pass != Pass::Forward {
        return Ok(false);
    }
    let Some(out) = l.outputs.first() else {
        return Ok(false);
    };
    let Some(os) = Strided::of(out.layout, out.dtype) else {
        return Ok(false);
    };
    let (o, n) = (out.addr, out.layout.numel());
    let nn = n as i64;
    match l.op {
        Op::Bitwise { or } => {
            let (Some(x), Some(y)) = (
                any_view(&l.inputs[0], out.layout),
                any_view(&l.inputs[1], out.layout),
            ) else {
                return Ok(false);
            };
            let or = *or as i32;
            let f = g.function("bitwise")?;
            // both inputs read through views broadcast to the output's n elements
            g.run(&f, Gpu::elems(n), |b| {
                b.arg(&or).arg(&x.0).arg(&x.1).arg(&y.0).arg(&y.1);
                b.arg(&o).arg(&os).arg(&nn);
            })?;
        }
        Op::Cumsum { dim, .. } => {
            let shape = &out.layout.shape;
            if l.inputs[0].layout.shape != *shape {
                return Ok(false);
            }
            let Some(x) = any_view(&l.inputs[0], out.layout) else {
                return Ok(false);
            };
            let Ok(d) = crate::engine::layout::wrap_dim(*dim, shape.len().max(1)) else {
                return Ok(false);
            };
            let len = shape.get(d).copied().unwrap_or(1).max(1);
            let inner: usize = shape.get(d + 1..).map_or(1, |s| s.iter().product());
            // every line: `outer` blocks of `inner` lines each
            let lines = n / len;
            if n == 0 {
                return Ok(true);
            }
            let (ll, ln, li) = (lines as i64, len as i64, inner.max(1) as i64);
            let f = g.function("cumsum")?;
            // input and output of the same shape, each line of `len` elements within it
            g.run(&f, Gpu::elems(lines), |b| {
                b.arg(&x.0)
                    .arg(&x.1)
                    .arg(&o)
                    .arg(&os)
                    .arg(&ll)
                    .arg(&ln)
                    .arg(&li);
            })?;
        }
        Op::Isin => {
            let (xb, tb) = (&l.inputs[0], &l.inputs[1]);
            if xb.layout.shape != out.layout.shape {
                return Ok(false);
            }
            let (Some(xs), Some(ts)) = (
                Strided::of(xb.layout, xb.dtype),
                Strided::of(tb.layout, tb.dtype),
            ) else {
                return Ok(false);
            };
            let m = tb.layout.numel() as i64;
            let f = g.function("isin")?;
            // the elements in the output's shape, the m test elements through their own view
            g.run(&f, Gpu::elems(n), |b| {
                b.arg(&xb.addr).arg(&xs).arg(&tb.addr).arg(&ts).arg(&m);
                b.arg(&o).arg(&os).arg(&nn);
            })?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}
