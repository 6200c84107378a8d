//! Elementwise launches on the GPU (`kernels/elementwise.cu`): fills, unary ops forward and
//! backward, binary ops with broadcasting and their gradients, a tensor with a number, copies
//! and casts of views, masked_fill, where, comparisons and cat, in float32, bf16 and float16
//! (computed in float32, rounded on store). The twin of `src/backend/cpu/elementwise.rs`; what
//! a kernel here does not take runs on the host twin.

use cudarc::driver::PushKernelArg;

use super::{floating, fview, fview_as, mask_as, Gpu, Strided};
use crate::backend::{Buffer, Launch, Pass};
use crate::engine::layout::Layout;
use crate::engine::op::{Binary, Cmp, Fill, InPlace, Op, Role, Save, Unary};
use crate::engine::DType;

/// Unary codes whose derivative `unary_backward` takes from the input (sin, cos, gelu, silu),
/// and those it takes from the output (exp, relu, sigmoid, tanh, rsqrt, sqrt); neg needs
/// neither.
const FROM_INPUT: [usize; 4] = [1, 2, 5, 6];
const FROM_OUTPUT: [usize; 6] = [3, 4, 7, 8, 9, 10];

/// Runs `l` here if a kernel of this family takes it; `false` where none does.
pub(super) fn launch(g: &mut Gpu, l: &Launch) -> Result<bool, String> {
    let Some(out) = l.outputs.first() else {
        return Ok(false);
    };
    let n = out.layout.numel();
    let Some(os) = Strided::of(out.layout, out.dtype) else {
        return Ok(false);
    };
    let o = out.addr;
    let nn = n as i64;
    let takes = matches!(
        (l.op, l.pass),
        (Op::Fill { .. }, Pass::Forward)
            | (Op::Unary(_) | Op::Binary(_), _)
            | (Op::Scalar { .. }, _)
            | (Op::Clone | Op::Cast, _)
            | (Op::Copy, Pass::Forward)
            | (Op::MaskedFill { .. } | Op::Where, _)
            | (Op::Cat { .. }, Pass::Forward)
            | (Op::Compare { .. }, Pass::Forward)
            | (Op::Pow { .. } | Op::Accumulate, _)
            | (Op::InPlace(_), Pass::Forward)
            | (Op::Split { .. } | Op::View { .. }, Pass::Grad { .. })
            | (Op::Pad { .. }, _)
    );
    if !takes {
        return Ok(false);
    }
    if n == 0 {
        return Ok(true);
    }
    // everything here writes a floating output, but a comparison's bool
    let any_dtype = matches!(
        l.op,
        Op::Compare { .. } | Op::Clone | Op::Copy | Op::Cast | Op::InPlace(InPlace::Copy)
    );
    // an integer factory whose values float32 holds exactly (ids, positions, counts)
    let exact_ints = match l.op {
        Op::Fill { fill, .. } => {
            let limit = (1u64 << 24) as f64;
            match *fill {
                Fill::Zeros | Fill::Ones | Fill::Empty => true,
                Fill::Full(x) => x.fract() == 0.0 && x.abs() < limit,
                Fill::Arange { start, step } => {
                    start.fract() == 0.0
                        && step.fract() == 0.0
                        && start.abs() + step.abs() * (n as f64) < limit
                }
                _ => false,
            }
        }
        _ => false,
    };
    // integer arithmetic by a whole number below 2^53 (scalar.cu's exact integer path)
    let int = |d: DType| matches!(d, DType::I64 | DType::I32);
    let int_scalar = match (l.op, l.pass) {
        (Op::Scalar { op, value, .. }, Pass::Forward)
        | (Op::InPlace(InPlace::Scalar(op, value)), Pass::Forward) => {
            *op != Binary::Div
                && value.fract() == 0.0
                && value.abs() < 2f64.powi(53)
                && int(out.dtype)
                && int(l.inputs[0].dtype)
        }
        _ => false,
    };
    if int_scalar {
        let (Some(xs), Some(os)) = (
            Strided::of(l.inputs[0].layout, l.inputs[0].dtype),
            Strided::of(out.layout, out.dtype),
        ) else {
            return Ok(false);
        };
        let (op, reversed, value) = match l.op {
            Op::Scalar {
                op,
                value,
                reversed,
            } => (*op, *reversed, *value),
            Op::InPlace(InPlace::Scalar(op, value)) => (*op, false, *value),
            _ => unreachable!("matched above"),
        };
        scalar(g, op, reversed, value, (l.inputs[0].addr, xs), (o, os), n)?;
        return Ok(true);
    }
    // integer and bool arithmetic (masks multiplied, ids added): exact, in double
    let int_binary = matches!((l.op, l.pass), (Op::Binary(op), Pass::Forward) if *op != Binary::Div)
        && !floating(out.dtype);
    // masks and ids filled or concatenated: exact (masked_fill through double, cat's parts
    // of the output's dtype copied bit for bit)
    let int_fill_cat = match (l.op, l.pass) {
        (Op::MaskedFill { .. }, Pass::Forward) => true,
        (Op::Cat { .. }, Pass::Forward) => l.inputs.iter().all(|p| p.dtype == out.dtype),
        _ => false,
    };
    // exact in any dtype: tril, a bool's or integer's bitwise not, a pad (its field filled
    // through double, the input copied bit for bit: the labels' ignore_index)
    let exact_any = matches!(l.op, Op::Unary(Unary::Tril | Unary::BitwiseNot))
        || (matches!(l.op, Op::Pad { .. }) && l.inputs.iter().all(|p| p.dtype == out.dtype));
    let any_dtype = any_dtype
        || exact_any
        || int_binary
        || int_fill_cat
        || (exact_ints && matches!(out.dtype, DType::I64 | DType::I32 | DType::Bool | DType::U8));
    if !floating(out.dtype) && !any_dtype {
        return Ok(false);
    }
    match (l.op, l.pass) {
        (
            Op::Fill {
                fill: Fill::Empty, ..
            },
            _,
        ) => {
            // uninitialized memory: nothing to write, here as on the cpu device
        }
        (Op::Fill { fill: what, seed }, _) => {
            let (mode, v, start, step) = match *what {
                Fill::Zeros => (0i32, 0.0f64, 0.0, 0.0),
                Fill::Ones => (0, 1.0, 0.0, 0.0),
                Fill::Full(x) => (0, x, 0.0, 0.0),
                Fill::Randn => (1, 0.0, 0.0, 0.0),
                Fill::Rand => (2, 0.0, 0.0, 0.0),
                Fill::Arange { start, step } => (3, 0.0, start, step),
                Fill::Empty => unreachable!("matched above"),
            };
            fill(g, mode, v, (start, step), *seed, (o, os), n)?;
        }
        (Op::Unary(u @ (Unary::Tril | Unary::BitwiseNot)), _) => {
            // exact in any dtype: tril (and its gradient, the incoming one's lower triangle)
            // and a bool's or an integer's bitwise not (whose gradient is zeros: the twin's)
            let code = if *u == Unary::Tril { TRIL } else { BITWISE_NOT };
            let x = &l.inputs[0];
            if (code == BITWISE_NOT && (l.pass != Pass::Forward || floating(x.dtype)))
                || x.layout.shape != out.layout.shape
            {
                return Ok(false);
            }
            let Some(x) = Strided::of(x.layout, x.dtype).map(|s| (x.addr, s)) else {
                return Ok(false);
            };
            unary(g, code, 0.0, x, (o, os), n)?;
        }
        (Op::Unary(u), Pass::Forward) => {
            let (Some(code), Some((x, xs))) = (unary_code(*u), fview(&l.inputs[0])) else {
                return Ok(false);
            };
            unary(g, code as i32, 0.0, (x, xs), (o, os), n)?;
        }
        (Op::Pow { exponent }, Pass::Forward) => {
            let Some(x) = fview(&l.inputs[0]) else {
                return Ok(false);
            };
            unary(g, POW, *exponent, x, (o, os), n)?;
        }
        (Op::Pow { exponent }, Pass::Grad { .. }) => {
            let (Some(gr), Some(x)) = (
                fview(&l.inputs[0]),
                saved(l, Role::Input(0)).and_then(fview),
            ) else {
                return Ok(false);
            };
            if !same_shape(&l.inputs[0], out) {
                return Ok(false);
            }
            unary_backward(g, POW, *exponent, gr, x, (o, os), n)?;
        }
        (Op::InPlace(ip), Pass::Forward) => {
            // the output is the tensor changed in place: each element read, then written by
            // the same thread
            let me = (o, os);
            match ip {
                InPlace::Tensor(op) => {
                    let Some(y) = l.inputs.get(1).and_then(|y| broadcast_view(y, out.layout))
                    else {
                        return Ok(false);
                    };
                    binary(g, *op, me, y, me, n)?;
                }
                InPlace::Scalar(op, v) => scalar(g, *op, false, *v, me, me, n)?,
                InPlace::Unary(u) => {
                    let Some(code) = unary_code(*u) else {
                        return Ok(false);
                    };
                    unary(g, code as i32, 0.0, me, me, n)?;
                }
                InPlace::Fill(v) => fill(g, 0, *v, (0.0, 0.0), 0, me, n)?,
                InPlace::Copy => {
                    let Some(y) = l.inputs.get(1).and_then(|y| {
                        Strided::of(&expand(y.layout, out.layout)?, y.dtype).map(|s| (y.addr, s))
                    }) else {
                        return Ok(false);
                    };
                    copy_view(g, y, me, n)?;
                }
                InPlace::MaskedFill(v) => {
                    let Some(m) = l
                        .inputs
                        .get(1)
                        .and_then(|m| expand(m.layout, out.layout).and_then(|e| mask_as(m, &e)))
                    else {
                        return Ok(false);
                    };
                    let (v, f) = (*v, g.function("masked_fill")?);
                    g.run(&f, Gpu::elems(n), |b| {
                        b.arg(&o)
                            .arg(&os)
                            .arg(&m.0)
                            .arg(&m.1)
                            .arg(&v)
                            .arg(&o)
                            .arg(&os)
                            .arg(&nn);
                    })?;
                }
            }
        }
        (Op::Accumulate, _) => {
            // a gradient added into the one accumulated so far
            let Some(y) = l.inputs.first().and_then(|y| broadcast_view(y, out.layout)) else {
                return Ok(false);
            };
            binary(g, Binary::Add, (o, os), y, (o, os), n)?;
        }
        (Op::Unary(u), Pass::Grad { .. }) => {
            let Some(code) = unary_code(*u) else {
                return Ok(false);
            };
            let Some((gr, gs)) = fview(&l.inputs[0]) else {
                return Ok(false);
            };
            // the saved tensor the kernel reads must be the one the op saved (read through its
            // own view: it has the gradient's shape)
            let saved_as = |r: Role| {
                saved(l, r)
                    .filter(|b| b.layout.shape == l.inputs[0].layout.shape)
                    .and_then(fview)
            };
            let v = match u.saves().first() {
                Some(Save::Input(_)) if FROM_INPUT.contains(&code) => saved_as(Role::Input(0)),
                Some(Save::Output) if FROM_OUTPUT.contains(&code) => saved_as(Role::Output),
                None if code == 0 => Some((gr, gs)),
                _ => None,
            };
            let Some(v) = v else {
                return Ok(false);
            };
            if !same_shape(&l.inputs[0], out) {
                return Ok(false);
            }
            unary_backward(g, code as i32, 0.0, (gr, gs), v, (o, os), n)?;
        }
        (Op::Binary(op), Pass::Forward) => {
            let (Some((x, xs)), Some((y, ys))) = (
                any_view(&l.inputs[0], out.layout),
                any_view(&l.inputs[1], out.layout),
            ) else {
                return Ok(false);
            };
            let code = *op as i32;
            let f = g.function("binary")?;
            g.run(&f, Gpu::elems(n), |b| {
                b.arg(&code)
                    .arg(&x)
                    .arg(&xs)
                    .arg(&y)
                    .arg(&ys)
                    .arg(&o)
                    .arg(&os)
                    .arg(&nn);
            })?;
        }
        (Op::Binary(op), Pass::Grad { input }) => {
            // f(g, x, y) in the incoming gradient's shape, summed over the dimensions this
            // input was broadcast along (the engine's sum_to), in one pass
            let gb = &l.inputs[0];
            let Some((order, total, len)) = summed(&gb.layout.shape, &out.layout.shape) else {
                return Ok(false);
            };
            let view = |b: &Buffer| -> Option<(u64, Strided)> {
                let e = expand(b.layout, gb.layout)?;
                fview_as(b, &e.permute(&order).ok()?)
            };
            let code = match (op, input) {
                (Binary::Add, _) | (Binary::Sub, 0) => 0,
                (Binary::Sub, _) => 1,
                (Binary::Mul, _) | (Binary::Div, 0) => {
                    if *op == Binary::Mul {
                        2
                    } else {
                        3
                    }
                }
                _ => 4,
            };
            let Some(gv) = view(gb) else {
                return Ok(false);
            };
            let (x, y) = match code {
                2 => (gv, saved(l, Role::Input(1 - input)).and_then(view)),
                3 => (gv, saved(l, Role::Input(1)).and_then(view)),
                4 => (
                    match saved(l, Role::Input(0)).and_then(view) {
                        Some(x) => x,
                        None => return Ok(false),
                    },
                    saved(l, Role::Input(1)).and_then(view),
                ),
                _ => (gv, Some(gv)),
            };
            let Some(y) = y else {
                return Ok(false);
            };
            if out.layout.numel() != total {
                return Ok(false);
            }
            let (tt, ll) = (total as i64, len as i64);
            let f = g.function("binary_backward")?;
            // every operand read through a permuted view of the gradient's shape, the output
            // written through its own view, `total` elements
            g.run(&f, Gpu::elems(total), |b| {
                b.arg(&code)
                    .arg(&gv.0)
                    .arg(&gv.1)
                    .arg(&x.0)
                    .arg(&x.1)
                    .arg(&y.0)
                    .arg(&y.1)
                    .arg(&o)
                    .arg(&os)
                    .arg(&tt)
                    .arg(&ll);
            })?;
        }
        (
            Op::Scalar {
                op,
                value,
                reversed,
            },
            pass,
        ) => {
            // (forward, an integer or bool input too, read exactly: a mask or ids by a number
            // into a floating output)
            let x = match pass {
                Pass::Forward => Strided::of(l.inputs[0].layout, l.inputs[0].dtype)
                    .map(|s| (l.inputs[0].addr, s)),
                Pass::Grad { .. } => fview(&l.inputs[0]),
            };
            let Some((x, xs)) = x else {
                return Ok(false);
            };
            match pass {
                Pass::Forward => scalar(g, *op, *reversed, *value, (x, xs), (o, os), n)?,
                Pass::Grad { .. } => match (op, reversed) {
                    (Binary::Add, _) | (Binary::Sub, false) => copy_view(g, (x, xs), (o, os), n)?,
                    (Binary::Sub, true) => {
                        scalar(g, Binary::Mul, false, -1.0, (x, xs), (o, os), n)?
                    }
                    (Binary::Mul, _) => scalar(g, Binary::Mul, false, *value, (x, xs), (o, os), n)?,
                    (Binary::Div, false) => {
                        scalar(g, Binary::Div, false, *value, (x, xs), (o, os), n)?
                    }
                    (Binary::Div, true) => return Ok(false),
                },
            }
        }
        (Op::Clone | Op::Copy | Op::Cast, _) => {
            // any dtype the kernels read: bit for bit within one, through float32 across two
            let x = &l.inputs[0];
            if x.layout.numel() != n {
                return Ok(false);
            }
            let Some(xs) = Strided::of(x.layout, x.dtype) else {
                return Ok(false);
            };
            copy_view(g, (x.addr, xs), (o, os), n)?;
        }
        (Op::MaskedFill { value }, pass) => {
            let (x, mask, v) = match pass {
                Pass::Forward => (&l.inputs[0], Some(&l.inputs[1]), *value),
                Pass::Grad { .. } => (&l.inputs[0], saved(l, Role::Input(1)), 0.0),
            };
            let (Some((xa, xs)), Some((m, ms))) = (
                any_view(x, out.layout),
                mask.and_then(|m| expand(m.layout, out.layout).and_then(|v| mask_as(m, &v))),
            ) else {
                return Ok(false);
            };
            if matches!(pass, Pass::Grad { .. }) && !same_shape(x, out) {
                return Ok(false);
            }
            let f = g.function("masked_fill")?;
            g.run(&f, Gpu::elems(n), |b| {
                b.arg(&xa)
                    .arg(&xs)
                    .arg(&m)
                    .arg(&ms)
                    .arg(&v)
                    .arg(&o)
                    .arg(&os)
                    .arg(&nn);
            })?;
        }
        (Op::Where, Pass::Forward) => {
            let c = &l.inputs[0];
            let (Some((ca, cs)), Some((a, as_)), Some((b_, bs))) = (
                expand(c.layout, out.layout).and_then(|v| mask_as(c, &v)),
                broadcast_view(&l.inputs[1], out.layout),
                broadcast_view(&l.inputs[2], out.layout),
            ) else {
                return Ok(false);
            };
            let f = g.function("where")?;
            g.run(&f, Gpu::elems(n), |b| {
                b.arg(&ca)
                    .arg(&cs)
                    .arg(&a)
                    .arg(&as_)
                    .arg(&b_)
                    .arg(&bs)
                    .arg(&o)
                    .arg(&os)
                    .arg(&nn);
            })?;
        }
        (Op::Where, Pass::Grad { input }) => {
            let gb = &l.inputs[0];
            if !same_shape(gb, out) || input == 0 {
                return Ok(false);
            }
            let (Some((gr, gs)), Some((ca, cs))) = (
                fview(gb),
                saved(l, Role::Input(0))
                    .and_then(|c| expand(c.layout, gb.layout).and_then(|v| mask_as(c, &v))),
            ) else {
                return Ok(false);
            };
            let which = input as i32;
            let f = g.function("where_backward")?;
            g.run(&f, Gpu::elems(n), |b| {
                b.arg(&which)
                    .arg(&ca)
                    .arg(&cs)
                    .arg(&gr)
                    .arg(&gs)
                    .arg(&o)
                    .arg(&os)
                    .arg(&nn);
            })?;
        }
        (Op::Compare { cmp, scalar }, Pass::Forward) => {
            let x = &l.inputs[0];
            let Some((xa, xs)) = any_view(x, out.layout) else {
                return Ok(false);
            };
            let code = cmp_code(*cmp);
            let (has, value) = (scalar.is_some() as i32, scalar.unwrap_or(0.0));
            let (ya, ys) = match scalar {
                Some(_) => (xa, xs),
                None => match any_view(&l.inputs[1], out.layout) {
                    Some(v) => v,
                    None => return Ok(false),
                },
            };
            let f = g.function("compare")?;
            g.run(&f, Gpu::elems(n), |b| {
                b.arg(&code)
                    .arg(&has)
                    .arg(&value)
                    .arg(&xa)
                    .arg(&xs)
                    .arg(&ya)
                    .arg(&ys)
                    .arg(&o)
                    .arg(&os)
                    .arg(&nn);
            })?;
        }
        (Op::Cat { dim }, Pass::Forward) => {
            // each part into its slice of the output: a view of the output's storage
            let nd = out.layout.shape.len();
            let Ok(dim) = crate::engine::layout::wrap_dim(*dim, nd) else {
                return Ok(false);
            };
            let mut at = 0usize;
            let mut parts = Vec::new();
            for p in l.inputs {
                if crate::engine::op::cat_skips(&p.layout.shape) {
                    continue;
                }
                let Some(ps) = Strided::of(p.layout, p.dtype) else {
                    return Ok(false);
                };
                let pa = p.addr;
                let mut slice = out.layout.clone();
                slice.shape[dim] = p.layout.shape[dim];
                slice.offset += at * out.layout.strides[dim];
                at += p.layout.shape[dim];
                let Some(ss) = Strided::of(&slice, out.dtype) else {
                    return Ok(false);
                };
                parts.push((pa, ps, ss, p.layout.numel()));
            }
            if at != out.layout.shape[dim] {
                return Ok(false);
            }
            for (pa, ps, ss, m) in parts {
                if m > 0 {
                    copy_view(g, (pa, ps), (o, ss), m)?;
                }
            }
        }
        (Op::Split { dim, .. }, Pass::Grad { .. }) => {
            // the parts' gradients, in order along `dim`, each into its slice of the output
            let mut at = 0usize;
            let mut parts = Vec::new();
            for p in l.inputs {
                let Some(&len) = p.layout.shape.get(*dim) else {
                    return Ok(false);
                };
                let Some(pv) = fview(p) else {
                    return Ok(false);
                };
                let mut slice = out.layout.clone();
                slice.shape[*dim] = len;
                slice.offset += at * out.layout.strides[*dim];
                at += len;
                let Some(ss) = Strided::of(&slice, out.dtype) else {
                    return Ok(false);
                };
                parts.push((pv, ss, p.layout.numel()));
            }
            if at != out.layout.shape[*dim] {
                return Ok(false);
            }
            for (pv, ss, m) in parts {
                if m > 0 {
                    copy_view(g, pv, (o, ss), m)?;
                }
            }
        }
        (Op::View { rel, .. }, Pass::Grad { .. }) => {
            // zeros in the input's shape, the gradient written through the view's layout (a
            // view whose elements do not overlap), or, for an `expand` (stride 0 over more than
            // one element), summed over the expanded dimensions into the rest of the view
            let gb = &l.inputs[0];
            if !out.layout.is_contiguous() || rel.shape != gb.layout.shape {
                return Ok(false);
            }
            let red: Vec<bool> = rel
                .shape
                .iter()
                .zip(&rel.strides)
                .map(|(&d, &st)| d > 1 && st == 0)
                .collect();
            if red.iter().any(|&r| r) {
                if !floating(gb.dtype) {
                    return Ok(false);
                }
                let keep = |v: &[usize]| -> crate::engine::layout::DimVec {
                    v.iter()
                        .zip(&red)
                        .filter(|(_, &r)| !r)
                        .map(|(&x, _)| x)
                        .collect()
                };
                let into = Layout {
                    shape: keep(&rel.shape),
                    strides: keep(&rel.strides),
                    offset: rel.offset + out.layout.offset,
                };
                fill(g, 0, 0.0, (0.0, 0.0), 0, (o, os), n)?;
                let dst = Buffer {
                    addr: o,
                    layout: &into,
                    dtype: out.dtype,
                };
                return super::nn::reduce_view(g, gb, &red, false, &dst);
            }
            let mut into = rel.clone();
            into.offset += out.layout.offset;
            let (Some(gv), Some(is)) = (fview(gb), Strided::of(&into, out.dtype)) else {
                return Ok(false);
            };
            fill(g, 0, 0.0, (0.0, 0.0), 0, (o, os), n)?;
            copy_view(g, gv, (o, is), gb.layout.numel())?;
        }
        (Op::Pad { pads, value }, pass) => {
            // the input in a field of `value` (forward), or its part of the gradient; the
            // pads (pairs from the last dimension) must not crop
            let (big, small) = match pass {
                Pass::Forward => (out, &l.inputs[0]),
                Pass::Grad { .. } => (&l.inputs[0], out),
            };
            let nd = big.layout.shape.len();
            if pads.iter().any(|&p| p < 0) || pads.len() > 2 * nd || small.layout.shape.len() != nd
            {
                return Ok(false);
            }
            let before = |k: usize| -> usize {
                let pair = nd - 1 - k;
                pads.get(2 * pair).copied().unwrap_or(0) as usize
            };
            // the interior: a view of the big tensor with the small one's shape
            let mut inner = big.layout.clone();
            for k in 0..nd {
                inner.offset += before(k) * big.layout.strides[k];
            }
            inner.shape = small.layout.shape.clone();
            let (Some(bs), Some(ss), Some(is)) = (
                Strided::of(big.layout, big.dtype),
                Strided::of(small.layout, small.dtype),
                Strided::of(&inner, big.dtype),
            ) else {
                return Ok(false);
            };
            let m = small.layout.numel();
            match pass {
                Pass::Forward => {
                    fill(g, 0, *value, (0.0, 0.0), 0, (o, bs), n)?;
                    if m > 0 {
                        copy_view(g, (small.addr, ss), (o, is), m)?;
                    }
                }
                Pass::Grad { .. } => {
                    if m > 0 {
                        copy_view(g, (big.addr, is), (o, ss), m)?;
                    }
                }
            }
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The saved buffer of role `r`.
fn saved<'a>(l: &'a Launch, r: Role) -> Option<&'a Buffer<'a>> {
    l.saved.iter().find(|(role, _)| *role == r).map(|(_, b)| b)
}

fn same_shape(a: &Buffer, b: &Buffer) -> bool {
    a.layout.shape == b.layout.shape
}

/// `fill`: a constant (`mode` 0), the cpu device's normals (1) or uniforms (2) of `seed`, or
/// an arange (3).
fn fill(
    g: &mut Gpu,
    mode: i32,
    value: f64,
    (start, step): (f64, f64),
    seed: u64,
    o: (u64, Strided),
    n: usize,
) -> Result<(), String> {
    let nn = n as i64;
    let f = g.function("fill")?;
    g.run(&f, Gpu::elems(n), |b| {
        b.arg(&mode)
            .arg(&value)
            .arg(&start)
            .arg(&step)
            .arg(&seed)
            .arg(&o.0)
            .arg(&o.1)
            .arg(&nn);
    })
}

/// `unary`'s code for `x ** e`.
const POW: i32 = 11;
/// `unary`'s codes for `tril` and `bitwise_not`.
const TRIL: i32 = 12;
const BITWISE_NOT: i32 = 13;

fn unary(
    g: &mut Gpu,
    code: i32,
    e: f64,
    x: (u64, Strided),
    o: (u64, Strided),
    n: usize,
) -> Result<(), String> {
    let nn = n as i64;
    let f = g.function("unary")?;
    g.run(&f, Gpu::elems(n), |b| {
        b.arg(&code)
            .arg(&e)
            .arg(&x.0)
            .arg(&x.1)
            .arg(&o.0)
            .arg(&o.1)
            .arg(&nn);
    })
}

fn unary_backward(
    g: &mut Gpu,
    code: i32,
    e: f64,
    gr: (u64, Strided),
    x: (u64, Strided),
    o: (u64, Strided),
    n: usize,
) -> Result<(), String> {
    let nn = n as i64;
    let f = g.function("unary_backward")?;
    g.run(&f, Gpu::elems(n), |b| {
        b.arg(&code)
            .arg(&e)
            .arg(&gr.0)
            .arg(&gr.1)
            .arg(&x.0)
            .arg(&x.1)
            .arg(&o.0)
            .arg(&o.1)
            .arg(&nn);
    })
}

fn copy_view(g: &mut Gpu, x: (u64, Strided), o: (u64, Strided), n: usize) -> Result<(), String> {
    let nn = n as i64;
    let f = g.function("copy")?;
    g.run(&f, Gpu::elems(n), |b| {
        b.arg(&x.0).arg(&x.1).arg(&o.0).arg(&o.1).arg(&nn);
    })
}

fn scalar(
    g: &mut Gpu,
    op: Binary,
    reversed: bool,
    value: f64,
    x: (u64, Strided),
    o: (u64, Strided),
    n: usize,
) -> Result<(), String> {
    let (code, rev, nn) = (op as i32, reversed as i32, n as i64);
    let f = g.function("scalar")?;
    g.run(&f, Gpu::elems(n), |b| {
        b.arg(&code)
            .arg(&rev)
            .arg(&value)
            .arg(&x.0)
            .arg(&x.1)
            .arg(&o.0)
            .arg(&o.1)
            .arg(&nn);
    })
}

fn binary(
    g: &mut Gpu,
    op: Binary,
    x: (u64, Strided),
    y: (u64, Strided),
    o: (u64, Strided),
    n: usize,
) -> Result<(), String> {
    let (code, nn) = (op as i32, n as i64);
    let f = g.function("binary")?;
    g.run(&f, Gpu::elems(n), |b| {
        b.arg(&code)
            .arg(&x.0)
            .arg(&x.1)
            .arg(&y.0)
            .arg(&y.1)
            .arg(&o.0)
            .arg(&o.1)
            .arg(&nn);
    })
}

/// The kernel's code of a comparison (its index among `Cmp`'s variants).
fn cmp_code(c: Cmp) -> i32 {
    match c {
        Cmp::Le => 0,
        Cmp::Lt => 1,
        Cmp::Ge => 2,
        Cmp::Gt => 3,
        Cmp::Eq => 4,
        Cmp::Ne => 5,
    }
}

/// The kernel's code of a pointwise unary op (its index in `Unary::ALL`); `None` for those it
/// does not compute (tril, bitwise not).
fn unary_code(u: Unary) -> Option<usize> {
    let code = Unary::ALL.iter().position(|&v| v == u)?;
    (code <= 10).then_some(code)
}

/// How a gradient of shape `g` sums to an input of shape `s` (broadcast to it): the
/// permutation of `g`'s dimensions that puts the kept ones first and the summed ones last
/// (leading dimensions `s` lacks, and those it has as 1), the kept elements and the summed
/// run's length.
fn summed(g: &[usize], s: &[usize]) -> Option<(Vec<i64>, usize, usize)> {
    if s.len() > g.len() {
        return None;
    }
    let lead = g.len() - s.len();
    let red: Vec<bool> = (0..g.len())
        .map(|i| i < lead || (s[i - lead] == 1 && g[i] != 1))
        .collect();
    for i in lead..g.len() {
        if !red[i] && s[i - lead] != g[i] {
            return None;
        }
    }
    let order: Vec<i64> = (0..g.len())
        .filter(|&i| !red[i])
        .chain((0..g.len()).filter(|&i| red[i]))
        .map(|i| i as i64)
        .collect();
    let total = (0..g.len()).filter(|&i| !red[i]).map(|i| g[i]).product();
    let len = (0..g.len()).filter(|&i| red[i]).map(|i| g[i]).product();
    Some((order, total, len))
}

/// `l` seen with the output's shape (`expand`), as the cpu twin reads a binary op's operands;
/// `None` where it does not expand to it.
pub(super) fn expand(l: &Layout, to: &Layout) -> Option<Layout> {
    if l.shape == to.shape {
        return Some(l.clone());
    }
    let sizes: Vec<i64> = to.shape.iter().map(|&s| s as i64).collect();
    l.expand(&sizes).ok()
}

/// A floating operand broadcast to the output's layout.
fn broadcast_view(b: &Buffer, to: &Layout) -> Option<(u64, Strided)> {
    fview_as(b, &expand(b.layout, to)?)
}

/// A buffer of any dtype the kernels read (floating, integer, bool) broadcast to `to` (the
/// kernels that load through `gm_get_d`: exact for integers).
pub(super) fn any_view(b: &Buffer, to: &Layout) -> Option<(u64, Strided)> {
    Strided::of(&expand(b.layout, to)?, b.dtype).map(|s| (b.addr, s))
}
