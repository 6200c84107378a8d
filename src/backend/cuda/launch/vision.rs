//! The vision ops on the GPU (`kernels/vision.cu`): `conv2d` with its input, weight and bias
//! gradients, `batch_norm` (training and eval) with its gradients, `max_pool2d` with its int64
//! indices and its gradient, `adaptive_avg_pool2d` and its gradient, on contiguous
//! [N, C, H, W] buffers of float32, bf16 or float16. The twin of `src/backend/cpu/vision.rs`;
//! strided views run on the host twin.

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::nn::contiguous_i64;
use super::{contiguous, Gpu};
use crate::backend::{Buffer, Launch, Pass};
use crate::engine::op::vision::Conv;
use crate::engine::op::{Op, Role};

/// `kernels/vision.cu`'s `GmConv`: [n, ci, h, w] input, [k, cg, r, s] weight, [n, k, oh, ow]
/// output and the window's stride, padding, dilation and groups.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GmConv {
    n: i64,
    ci: i64,
    h: i64,
    w: i64,
    k: i64,
    cg: i64,
    r: i64,
    s: i64,
    oh: i64,
    ow: i64,
    stride: i64,
    pad: i64,
    dil: i64,
    groups: i64,
}

// SAFETY: a plain C struct of integers, laid out as the kernel's
unsafe impl DeviceRepr for GmConv {}

/// `kernels/vision.cu`'s `GmPool`: `planes` planes of [h, w] to [oh, ow], the window's size,
/// stride and padding (the last three unused by the adaptive pool).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GmPool {
    planes: i64,
    h: i64,
    w: i64,
    oh: i64,
    ow: i64,
    kernel: i64,
    stride: i64,
    pad: i64,
}

// SAFETY: a plain C struct of integers, laid out as the kernel's
unsafe impl DeviceRepr for GmPool {}

/// A block of 256 threads per sum, for `count` sums.
fn per_block(count: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (count.clamp(1, 1 << 20) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn four(s: &[usize]) -> Option<[i64; 4]> {
    (s.len() == 4).then(|| [s[0] as i64, s[1] as i64, s[2] as i64, s[3] as i64])
}

/// The geometry of a convolution of input shape `xs`, weight `ws` and output `ys`.
fn geometry(c: &Conv, xs: &[usize], ws: &[usize], ys: &[usize]) -> Option<GmConv> {
    let ([n, ci, h, w], [k, cg, r, s], [_, _, oh, ow]) = (four(xs)?, four(ws)?, four(ys)?);
    (c.groups > 0 && k % c.groups as i64 == 0 && cg * c.groups as i64 == ci).then_some(GmConv {
        n,
        ci,
        h,
        w,
        k,
        cg,
        r,
        s,
        oh,
        ow,
        stride: c.stride as i64,
        pad: c.padding as i64,
        dil: c.dilation as i64,
        groups: c.groups as i64,
    })
}

fn saved<'a>(l: &'a Launch, r: Role) -> Option<&'a Buffer<'a>> {
    l.saved.iter().find(|(role, _)| *role == r).map(|(_, b)| b)
}

/// Runs `l` here if the kernels take it; `false` where they do not.
pub(super) fn launch(g: &mut Gpu, l: &Launch) -> Result<bool, String> {
    let Some(out) = l.outputs.first() else {
        return Ok(false);
    };
    let Some(o) = contiguous(out) else {
        return Ok(false);
    };
    let os = &out.layout.shape;
    match (l.op, l.pass) {
        (Op::Conv2d(c), Pass::Forward) => {
            let (Some(x), Some(w)) = (contiguous(&l.inputs[0]), contiguous(&l.inputs[1])) else {
                return Ok(false);
            };
            let b = match l.inputs.get(2) {
                Some(b) => match contiguous(b) {
                    Some(b) => Some(b),
                    None => return Ok(false),
                },
                None => None,
            };
            let Some(geo) = geometry(c, &l.inputs[0].layout.shape, &l.inputs[1].layout.shape, os)
            else {
                return Ok(false);
            };
            let (b, hb) = (b.unwrap_or(x), b.is_some() as i32);
            let n = out.layout.numel();
            let f = g.function("conv2d")?;
            // every buffer contiguous in the shapes the geometry was read from; a thread per output element
            g.run(&f, Gpu::elems(n), |lb| {
                lb.arg(&x.0)
                    .arg(&x.1)
                    .arg(&w.0)
                    .arg(&w.1)
                    .arg(&b.0)
                    .arg(&b.1);
                lb.arg(&hb).arg(&o.0).arg(&o.1).arg(&geo);
            })?;
        }
        (Op::Conv2d(c), Pass::Grad { input }) => {
            let (Some(xb), Some(wb)) = (saved(l, Role::Input(0)), saved(l, Role::Input(1))) else {
                return Ok(false);
            };
            let (Some(gr), Some(x), Some(w)) =
                (contiguous(&l.inputs[0]), contiguous(xb), contiguous(wb))
            else {
                return Ok(false);
            };
            let Some(geo) = geometry(
                c,
                &xb.layout.shape,
                &wb.layout.shape,
                &l.inputs[0].layout.shape,
            ) else {
                return Ok(false);
            };
            let (want, cfg) = match input {
                0 => (xb.layout.numel(), Gpu::elems(xb.layout.numel())),
                1 => (wb.layout.numel(), per_block(wb.layout.numel())),
                2 => (geo.k as usize, per_block(geo.k as usize)),
                _ => return Ok(false),
            };
            if out.layout.numel() != want {
                return Ok(false);
            }
            let which = input as i32;
            let f = g.function("conv2d_backward")?;
            // the output holds the gradient of input `which` (checked above), the rest as in the forward
            g.run(&f, cfg, |lb| {
                lb.arg(&which).arg(&gr.0).arg(&gr.1).arg(&x.0).arg(&x.1);
                lb.arg(&w.0).arg(&w.1).arg(&o.0).arg(&o.1).arg(&geo);
            })?;
        }
        (Op::BatchNorm(bn), Pass::Forward) => {
            if l.inputs.len() != 5 {
                return Ok(false);
            }
            let v: Option<Vec<(u64, i32)>> = l.inputs.iter().map(contiguous).collect();
            let Some(v) = v else {
                return Ok(false);
            };
            let shape = &l.inputs[0].layout.shape;
            if shape.len() < 2 || os != shape {
                return Ok(false);
            }
            let (n, c) = (shape[0], shape[1]);
            let inner: usize = shape[2..].iter().product();
            if l.inputs[1..].iter().any(|b| b.layout.numel() != c) {
                return Ok(false);
            }
            let stats = match (l.outputs.get(1), l.outputs.get(2)) {
                (Some(m), Some(i)) => match (contiguous(m), contiguous(i)) {
                    (Some(m), Some(i)) => Some((m, i)),
                    _ => return Ok(false),
                },
                _ => None,
            };
            let hs = stats.is_some() as i32;
            let (m, i) = stats.unwrap_or((o, o));
            let (tr, nn, cc, ii) = (bn.training as i32, n as i64, c as i64, inner as i64);
            let (mom, eps) = (bn.momentum, bn.eps);
            let f = g.function("batch_norm")?;
            // x and y [n, c, inner], the weight, bias and running statistics [c] (written in place in training), the kept statistics [c]; a block per channel
            g.run(&f, per_block(c), |lb| {
                for b in &v {
                    lb.arg(&b.0).arg(&b.1);
                }
                lb.arg(&o.0)
                    .arg(&o.1)
                    .arg(&m.0)
                    .arg(&m.1)
                    .arg(&i.0)
                    .arg(&i.1);
                lb.arg(&hs)
                    .arg(&tr)
                    .arg(&nn)
                    .arg(&cc)
                    .arg(&ii)
                    .arg(&mom)
                    .arg(&eps);
            })?;
        }
        (Op::BatchNorm(_), Pass::Grad { input }) => {
            let (Some(xb), Some(mb), Some(ib)) = (
                saved(l, Role::Input(0)),
                saved(l, Role::Extra(0)),
                saved(l, Role::Extra(1)),
            ) else {
                return Ok(false);
            };
            let shape = &xb.layout.shape;
            if shape.len() < 2 || l.inputs[0].layout.shape != *shape {
                return Ok(false);
            }
            let (n, c) = (shape[0], shape[1]);
            let inner: usize = shape[2..].iter().product();
            let (Some(gr), Some(x), Some(m), Some(i)) = (
                contiguous(&l.inputs[0]),
                contiguous(xb),
                contiguous(mb),
                contiguous(ib),
            ) else {
                return Ok(false);
            };
            if mb.layout.numel() != c || ib.layout.numel() != c {
                return Ok(false);
            }
            let gamma = match input {
                0 => match saved(l, Role::Input(1)) {
                    Some(b) if b.layout.numel() == c => match contiguous(b) {
                        Some(b) => b,
                        None => return Ok(false),
                    },
                    _ => return Ok(false),
                },
                1 | 2 => x,
                _ => return Ok(false),
            };
            let want = if input == 0 { n * c * inner } else { c };
            if out.layout.numel() != want {
                return Ok(false);
            }
            let (which, nn, cc, ii) = (input as i32, n as i64, c as i64, inner as i64);
            let f = g.function("batch_norm_backward")?;
            // as in the forward; the output holds x's elements or [c] (checked above)
            g.run(&f, per_block(c), |lb| {
                lb.arg(&which).arg(&gr.0).arg(&gr.1).arg(&x.0).arg(&x.1);
                lb.arg(&m.0)
                    .arg(&m.1)
                    .arg(&i.0)
                    .arg(&i.1)
                    .arg(&gamma.0)
                    .arg(&gamma.1);
                lb.arg(&o.0).arg(&o.1).arg(&nn).arg(&cc).arg(&ii);
            })?;
        }
        (Op::MaxPool2d(p), pass) => {
            let (xb, ob) = match pass {
                Pass::Forward => (&l.inputs[0], out),
                Pass::Grad { .. } => match saved(l, Role::Input(0)) {
                    Some(x) => (x, &l.inputs[0]),
                    None => return Ok(false),
                },
            };
            let (Some([n, c, h, w]), Some([_, _, oh, ow])) =
                (four(&xb.layout.shape), four(&ob.layout.shape))
            else {
                return Ok(false);
            };
            let Some(x) = contiguous(xb) else {
                return Ok(false);
            };
            let geo = GmPool {
                planes: n * c,
                h,
                w,
                oh,
                ow,
                kernel: p.kernel as i64,
                stride: p.stride as i64,
                pad: p.padding as i64,
            };
            let idx_buf = match pass {
                Pass::Forward => l.outputs.get(1),
                Pass::Grad { .. } => saved(l, Role::Extra(0)),
            };
            let idx = match idx_buf {
                Some(b) if b.layout.numel() == ob.layout.numel() => match contiguous_i64(b) {
                    Some(a) => Some(a),
                    None => return Ok(false),
                },
                Some(_) => return Ok(false),
                None => None,
            };
            let hi = idx.is_some() as i32;
            let idx = idx.unwrap_or(0);
            match pass {
                Pass::Forward => {
                    let f = g.function("max_pool2d")?;
                    // x [n, c, h, w] and y [n, c, oh, ow] contiguous, the indices (when kept) as y; a thread per output
                    g.run(&f, Gpu::elems(out.layout.numel()), |lb| {
                        lb.arg(&x.0)
                            .arg(&x.1)
                            .arg(&o.0)
                            .arg(&o.1)
                            .arg(&idx)
                            .arg(&hi);
                        lb.arg(&geo);
                    })?;
                }
                Pass::Grad { .. } => {
                    let Some(gr) = contiguous(&l.inputs[0]) else {
                        return Ok(false);
                    };
                    if out.layout.numel() != xb.layout.numel() {
                        return Ok(false);
                    }
                    let f = g.function("max_pool2d_backward")?;
                    // the gradient in y's shape, the output in x's (checked above); a thread per input element
                    g.run(&f, Gpu::elems(out.layout.numel()), |lb| {
                        lb.arg(&gr.0)
                            .arg(&gr.1)
                            .arg(&x.0)
                            .arg(&x.1)
                            .arg(&idx)
                            .arg(&hi);
                        lb.arg(&o.0).arg(&o.1).arg(&geo);
                    })?;
                }
            }
        }
        (Op::AdaptiveAvgPool2d { .. }, pass) => {
            // the input's shape: the forward's input, the gradient's output
            let (xs, ys) = match pass {
                Pass::Forward => (&l.inputs[0].layout.shape, os),
                Pass::Grad { .. } => (os, &l.inputs[0].layout.shape),
            };
            let (Some([n, c, h, w]), Some([_, _, oh, ow])) = (four(xs), four(ys)) else {
                return Ok(false);
            };
            let Some(x) = contiguous(&l.inputs[0]) else {
                return Ok(false);
            };
            let geo = GmPool {
                planes: n * c,
                h,
                w,
                oh,
                ow,
                kernel: 0,
                stride: 0,
                pad: 0,
            };
            let (name, n) = match pass {
                Pass::Forward => ("adaptive_avg_pool2d", out.layout.numel()),
                Pass::Grad { .. } => ("adaptive_avg_pool2d_backward", out.layout.numel()),
            };
            let f = g.function(name)?;
            // the input [n, c, h, w] and output [n, c, oh, ow] contiguous (the other way round for the gradient); a thread per output element
            g.run(&f, Gpu::elems(n), |lb| {
                lb.arg(&x.0).arg(&x.1).arg(&o.0).arg(&o.1).arg(&geo);
            })?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}
