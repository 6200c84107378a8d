//! Elementwise launches on the GPU (`kernels/elementwise.cu`): fills, unary ops forward and
//! backward, binary ops with broadcasting, a tensor with a number, copies of views. The twin of
//! `src/backend/cpu/elementwise.rs`; what a kernel here does not take runs on the host twin.

use cudarc::driver::PushKernelArg;

use super::{contiguous_f32, f32, output_f32, Gpu, Strided};
use crate::backend::{Launch, Pass};
use crate::engine::layout::Layout;
use crate::engine::op::{Fill, Op, Role, Save, Unary};

/// Unary codes whose derivative `unary_backward` takes from the input (sin, cos, gelu, silu),
/// and those it takes from the output (exp, relu, sigmoid, tanh, rsqrt, sqrt); neg needs
/// neither.
const FROM_INPUT: [usize; 4] = [1, 2, 5, 6];
const FROM_OUTPUT: [usize; 6] = [3, 4, 7, 8, 9, 10];

/// Runs `l` here if a kernel of this family takes it; `false` where none does.
pub(super) fn launch(g: &mut Gpu, l: &Launch) -> Result<bool, String> {
    let Some((out, o)) = output_f32(l) else {
        return Ok(false);
    };
    let n = out.layout.numel();
    if n == 0 {
        return Ok(matches!(
            l.op,
            Op::Fill { .. } | Op::Unary(_) | Op::Binary(_) | Op::Scalar { .. } | Op::Clone
        ));
    }
    let nn = n as i64;
    let cfg = Gpu::elems(n);
    match (l.op, l.pass) {
        (
            Op::Fill {
                fill: Fill::Empty, ..
            },
            Pass::Forward,
        ) => {
            // uninitialized memory: nothing to write, here as on the cpu device
        }
        (Op::Fill { fill, .. }, Pass::Forward) => {
            let v = match *fill {
                Fill::Zeros => 0.0f32,
                Fill::Ones => 1.0,
                Fill::Full(x) => x as f32,
                _ => return Ok(false),
            };
            let f = g.function("fill")?;
            // SAFETY: `o` is a contiguous float32 buffer of n elements
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&o)
                    .arg(&nn)
                    .arg(&v)
                    .launch(cfg)
            }
            .map_err(|e| format!("fill: {e:?}"))?;
        }
        (Op::Unary(u), Pass::Forward) => {
            let code = unary_code(*u);
            let x = &l.inputs[0];
            let (Some(code), true, Some(xs)) = (code, f32(x), Strided::of(x.layout)) else {
                return Ok(false);
            };
            let f = g.function("unary")?;
            let c = code as i32;
            // SAFETY: `x.addr` is the input's storage, read through its view; `o` n floats
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&c)
                    .arg(&x.addr)
                    .arg(&xs)
                    .arg(&o)
                    .arg(&nn)
                    .launch(cfg)
            }
            .map_err(|e| format!("unary: {e:?}"))?;
        }
        (Op::Unary(u), Pass::Grad { .. }) => {
            let Some(code) = unary_code(*u) else {
                return Ok(false);
            };
            let grad = contiguous_f32(&l.inputs[0]);
            // the saved tensor the kernel reads must be the one the op saved
            let saved_as = |r: Role| {
                l.saved
                    .iter()
                    .find(|(role, _)| *role == r)
                    .and_then(|(_, b)| contiguous_f32(b))
            };
            let (x, y) = match u.saves().first() {
                Some(Save::Input(_)) if FROM_INPUT.contains(&code) => {
                    let x = saved_as(Role::Input(0));
                    (x, x)
                }
                Some(Save::Output) if FROM_OUTPUT.contains(&code) => {
                    let y = saved_as(Role::Output);
                    (y, y)
                }
                None if code == 0 => (grad, grad),
                _ => return Ok(false),
            };
            let (Some(gr), Some(x), Some(y)) = (grad, x, y) else {
                return Ok(false);
            };
            let f = g.function("unary_backward")?;
            let c = code as i32;
            // SAFETY: every buffer is contiguous float32 of n elements
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&c)
                    .arg(&gr)
                    .arg(&x)
                    .arg(&y)
                    .arg(&o)
                    .arg(&nn)
                    .launch(cfg)
            }
            .map_err(|e| format!("unary_backward: {e:?}"))?;
        }
        (Op::Binary(b), Pass::Forward) => {
            let (x, y) = (&l.inputs[0], &l.inputs[1]);
            let code = *b as i32;
            let (true, true, Some(xs), Some(ys)) = (
                f32(x),
                f32(y),
                broadcast(x.layout, out.layout).and_then(|v| Strided::of(&v)),
                broadcast(y.layout, out.layout).and_then(|v| Strided::of(&v)),
            ) else {
                return Ok(false);
            };
            let f = g.function("binary")?;
            // SAFETY: both inputs are read through views of the output's shape; `o` n floats
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&code)
                    .arg(&x.addr)
                    .arg(&xs)
                    .arg(&y.addr)
                    .arg(&ys)
                    .arg(&o)
                    .arg(&nn)
                    .launch(cfg)
            }
            .map_err(|e| format!("binary: {e:?}"))?;
        }
        (
            Op::Scalar {
                op,
                value,
                reversed,
            },
            Pass::Forward,
        ) => {
            let x = &l.inputs[0];
            let (true, Some(xs)) = (f32(x), Strided::of(x.layout)) else {
                return Ok(false);
            };
            let (code, rev, v) = (*op as i32, *reversed as i32, *value as f32);
            let f = g.function("scalar")?;
            // SAFETY: the input read through its view; `o` n floats
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&code)
                    .arg(&rev)
                    .arg(&v)
                    .arg(&x.addr)
                    .arg(&xs)
                    .arg(&o)
                    .arg(&nn)
                    .launch(cfg)
            }
            .map_err(|e| format!("scalar: {e:?}"))?;
        }
        (Op::Clone | Op::Copy | Op::Cast, Pass::Forward) => {
            let x = &l.inputs[0];
            let (true, Some(xs)) = (f32(x), Strided::of(x.layout)) else {
                return Ok(false);
            };
            if x.layout.numel() != n {
                return Ok(false);
            }
            let f = g.function("copy")?;
            // SAFETY: the input read through its view; `o` n floats
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&x.addr)
                    .arg(&xs)
                    .arg(&o)
                    .arg(&nn)
                    .launch(cfg)
            }
            .map_err(|e| format!("copy: {e:?}"))?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The kernel's code of a pointwise unary op (its index in `Unary::ALL`); `None` for those it
/// does not compute (tril, bitwise not).
fn unary_code(u: Unary) -> Option<usize> {
    let code = Unary::ALL.iter().position(|&v| v == u)?;
    (code <= 10).then_some(code)
}

/// `l` seen with the output's shape (`expand`), as the cpu twin reads a binary op's operands;
/// `None` where it does not expand to it.
fn broadcast(l: &Layout, to: &Layout) -> Option<Layout> {
    if l.shape == to.shape {
        return Some(l.clone());
    }
    let sizes: Vec<i64> = to.shape.iter().map(|&s| s as i64).collect();
    l.expand(&sizes).ok()
}
