//! Elementwise kernels: factories, unary functions, binary arithmetic with broadcasting, a
//! tensor with a scalar, masked_fill, casts and copies, dropout, in-place updates, and the
//! gradient sums of backward. Forward and backward of each live side by side.

use rayon::prelude::*;

use super::rng::Rng;
use super::{saved, CpuDevice, Scratch};
use crate::backend::{Buffer, Launch, Pass};
use crate::engine::layout::Layout;
use crate::engine::op::{Binary, Fill, InPlace, Op, Role, Unary};

/// `b`'s values broadcast to `shape` (row-major).
pub(super) fn load_as(d: &CpuDevice, b: &Buffer, shape: &[usize]) -> Result<Scratch, String> {
    if b.layout.shape.as_slice() == shape {
        return d.load(b);
    }
    let sizes: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
    let l = b.layout.expand(&sizes).map_err(|e| e.0)?;
    d.load(&Buffer {
        addr: b.addr,
        layout: &l,
        dtype: b.dtype,
    })
}

/// Sums `full` (of `shape`) over the dimensions along which `target` was broadcast.
pub(super) fn sum_to(full: &[f64], shape: &[usize], target: &[usize]) -> Scratch {
    if shape == target {
        return full.iter().copied().collect();
    }
    let n: usize = target.iter().product();
    let mut out = Scratch::zeros(n);
    let nd = shape.len();
    let lead = nd - target.len();
    // strides of the target, 0 where it was broadcast, over the full shape's dimensions
    let mut tstride = vec![0usize; nd];
    let mut s = 1;
    for d in (0..target.len()).rev() {
        if target[d] != 1 || shape[lead + d] == 1 {
            tstride[lead + d] = if target[d] == 1 { 0 } else { s };
        }
        s *= target[d];
    }
    let full_layout = Layout {
        shape: shape.into(),
        strides: tstride.into(),
        offset: 0,
    };
    let mut i = 0;
    super::for_each_offset(&full_layout, |o| {
        out[o] += full[i];
        i += 1;
    });
    out
}

fn unary(u: Unary, x: f64) -> f64 {
    match u {
        Unary::Neg => -x,
        Unary::Sin => x.sin(),
        Unary::Cos => x.cos(),
        Unary::Exp => x.exp(),
        Unary::Relu => x.max(0.0),
        Unary::Gelu => 0.5 * x * (1.0 + libm_erf(x / std::f64::consts::SQRT_2)),
        Unary::Silu => x / (1.0 + (-x).exp()),
        Unary::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Unary::Tanh => x.tanh(),
        Unary::Rsqrt => 1.0 / x.sqrt(),
        Unary::Sqrt => x.sqrt(),
        Unary::Tril | Unary::BitwiseNot => unreachable!("not pointwise in x alone"),
    }
}

/// d/dx of `u` at input `x` with output `y` (the op saved one of them).
fn unary_grad(u: Unary, x: f64, y: f64) -> f64 {
    match u {
        Unary::Neg => -1.0,
        Unary::Sin => x.cos(),
        Unary::Cos => -x.sin(),
        Unary::Exp => y,
        Unary::Relu => (y > 0.0) as u8 as f64,
        Unary::Gelu => {
            let cdf = 0.5 * (1.0 + libm_erf(x / std::f64::consts::SQRT_2));
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            cdf + x * pdf
        }
        Unary::Silu => {
            let s = 1.0 / (1.0 + (-x).exp());
            s * (1.0 + x * (1.0 - s))
        }
        Unary::Sigmoid => y * (1.0 - y),
        Unary::Tanh => 1.0 - y * y,
        Unary::Rsqrt => -0.5 * y * y * y,
        Unary::Sqrt => 0.5 / y,
        Unary::Tril | Unary::BitwiseNot => 0.0,
    }
}

/// The error function (Abramowitz-Stegun 7.1.26 is too coarse for a reference; this is the
/// series/continued-fraction pair, accurate to about 1e-15).
pub(super) fn libm_erf(x: f64) -> f64 {
    let t = x.abs();
    let r = if t < 2.5 {
        // Taylor series
        let mut sum = t;
        let mut term = t;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -t * t / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        2.0 / std::f64::consts::PI.sqrt() * sum
    } else {
        // continued fraction for erfc
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (t + f);
        }
        1.0 - (-t * t).exp() / std::f64::consts::PI.sqrt() / (t + f)
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// `tril` over the last two dimensions of row-major values of `shape`.
fn tril(v: &mut [f64], shape: &[usize]) {
    let nd = shape.len();
    if nd < 2 {
        return;
    }
    let (r, c) = (shape[nd - 2], shape[nd - 1]);
    for (i, x) in v.iter_mut().enumerate() {
        let (row, col) = ((i / c) % r, i % c);
        if col > row {
            *x = 0.0;
        }
    }
}

/// Elements per random stream of a factory.
const BLOCK: usize = 1 << 16;

fn fill(d: &mut CpuDevice, out: &Buffer, f: Fill, seed: u64) -> Result<(), String> {
    let n = out.layout.numel();
    // random draws in blocks of 2^16 elements, block k from stream (seed, k): the same
    // numbers on any number of threads
    let random = |normal: bool| -> Scratch {
        (0..n.div_ceil(BLOCK))
            .into_par_iter()
            .flat_map_iter(|k| {
                let mut rng = Rng::new(seed ^ ((k as u64) << 32));
                let len = BLOCK.min(n - k * BLOCK);
                (0..len).map(move |_| if normal { rng.normal() } else { rng.uniform() })
            })
            .collect()
    };
    let v: Scratch = match f {
        Fill::Empty => return Ok(()),
        Fill::Zeros => Scratch::zeros(n),
        Fill::Ones => Scratch::filled(n, 1.0),
        Fill::Full(x) => Scratch::filled(n, x),
        Fill::Randn => random(true),
        Fill::Rand => random(false),
        Fill::Arange { start, step } => (0..n).map(|i| start + step * i as f64).collect(),
    };
    d.store(out, &v)
}

pub(super) fn launch(d: &mut CpuDevice, l: &Launch) -> Result<(), String> {
    let out = l.outputs.first().ok_or("no output")?;
    let oshape = out.layout.shape.clone();
    match (l.op, l.pass) {
        (Op::Fill { fill: f, seed }, _) => fill(d, out, *f, *seed),
        (Op::Unary(u), Pass::Forward) => {
            let mut v = d.load(&l.inputs[0])?;
            match u {
                Unary::Tril => tril(&mut v, &oshape),
                Unary::BitwiseNot if l.inputs[0].dtype == crate::engine::DType::Bool => {
                    v.par_iter_mut().for_each(|x| *x = (*x == 0.0) as u8 as f64)
                }
                Unary::BitwiseNot => v.par_iter_mut().for_each(|x| *x = -*x - 1.0),
                _ => v.par_iter_mut().for_each(|x| *x = unary(*u, *x)),
            }
            d.store(out, &v)
        }
        (Op::Unary(u), Pass::Grad { .. }) => {
            let g = d.load(&l.inputs[0])?;
            let v: Scratch = match u {
                Unary::Neg => g.par_iter().map(|x| -x).collect(),
                Unary::Tril => {
                    let mut g = g;
                    tril(&mut g, &oshape);
                    g
                }
                Unary::BitwiseNot => Scratch::zeros(g.len()),
                _ => {
                    let (xs, ys) = match u.saves().first() {
                        Some(crate::engine::op::Save::Input(_)) => {
                            (d.load(saved(l, Role::Input(0))?)?, None)
                        }
                        _ => (Scratch::default(), Some(d.load(saved(l, Role::Output)?)?)),
                    };
                    (0..g.len())
                        .into_par_iter()
                        .map(|i| {
                            let x = xs.get(i).copied().unwrap_or(0.0);
                            let y = ys.as_ref().map_or(0.0, |y| y[i]);
                            g[i] * unary_grad(*u, x, y)
                        })
                        .collect()
                }
            };
            d.store(out, &v)
        }
        (Op::Pow { exponent }, Pass::Forward) => {
            let mut v = d.load(&l.inputs[0])?;
            v.par_iter_mut().for_each(|x| *x = x.powf(*exponent));
            d.store(out, &v)
        }
        (Op::Pow { exponent }, Pass::Grad { .. }) => {
            let g = d.load(&l.inputs[0])?;
            let x = d.load(saved(l, Role::Input(0))?)?;
            let e = *exponent;
            let v: Scratch = (0..g.len())
                .into_par_iter()
                .map(|i| {
                    if e == 0.0 {
                        0.0
                    } else {
                        g[i] * e * x[i].powf(e - 1.0)
                    }
                })
                .collect();
            d.store(out, &v)
        }
        (Op::Compare { cmp, scalar }, Pass::Forward) => {
            let x = load_as(d, &l.inputs[0], &oshape)?;
            let v: Scratch = match scalar {
                Some(s) => x
                    .par_iter()
                    .map(|a| cmp.holds(*a, *s) as u8 as f64)
                    .collect(),
                None => {
                    let y = load_as(d, &l.inputs[1], &oshape)?;
                    x.par_iter()
                        .zip(y.par_iter())
                        .map(|(a, b)| cmp.holds(*a, *b) as u8 as f64)
                        .collect()
                }
            };
            d.store(out, &v)
        }
        (Op::Bitwise { or }, Pass::Forward) => {
            let x = load_as(d, &l.inputs[0], &oshape)?;
            let y = load_as(d, &l.inputs[1], &oshape)?;
            let v: Scratch = x
                .par_iter()
                .zip(y.par_iter())
                .map(|(a, b)| {
                    let (a, b) = (*a as i64, *b as i64);
                    (if *or { a | b } else { a & b }) as f64
                })
                .collect();
            d.store(out, &v)
        }
        (Op::Cumsum { dim, .. }, Pass::Forward) => {
            let x = load_as(d, &l.inputs[0], &oshape)?;
            let dim = crate::engine::layout::wrap_dim(*dim, oshape.len()).map_err(|e| e.0)?;
            let n = oshape.get(dim).copied().unwrap_or(1).max(1);
            let inner: usize = oshape[dim + 1..].iter().product();
            let mut v = x.to_vec();
            for outer in 0..v.len() / (n * inner).max(1) {
                for k in 0..inner {
                    let mut acc = 0.0;
                    for i in 0..n {
                        let at = (outer * n + i) * inner + k;
                        acc += v[at];
                        v[at] = acc;
                    }
                }
            }
            d.store(out, &v)
        }
        (Op::Logical { any, dim }, Pass::Forward) => {
            let ishape = l.inputs[0].layout.shape.clone();
            let x = load_as(d, &l.inputs[0], &ishape)?;
            let v: Vec<f64> = match dim {
                None => {
                    let r = if *any {
                        x.iter().any(|a| *a != 0.0)
                    } else {
                        x.iter().all(|a| *a != 0.0)
                    };
                    vec![r as u8 as f64]
                }
                Some(dim) => {
                    let dim =
                        crate::engine::layout::wrap_dim(*dim, ishape.len()).map_err(|e| e.0)?;
                    let n = ishape[dim].max(1);
                    let inner: usize = ishape[dim + 1..].iter().product();
                    let outer = x.len() / (n * inner).max(1);
                    let mut v = Vec::with_capacity(outer * inner);
                    for o in 0..outer {
                        for k in 0..inner {
                            let mut it = (0..n).map(|i| x[(o * n + i) * inner + k] != 0.0);
                            let r = if *any { it.any(|b| b) } else { it.all(|b| b) };
                            v.push(r as u8 as f64);
                        }
                    }
                    v
                }
            };
            d.store(out, &v)
        }
        (Op::Where, Pass::Forward) => {
            let c = load_as(d, &l.inputs[0], &oshape)?;
            let x = load_as(d, &l.inputs[1], &oshape)?;
            let y = load_as(d, &l.inputs[2], &oshape)?;
            let v: Scratch = (0..c.len())
                .into_par_iter()
                .map(|i| if c[i] != 0.0 { x[i] } else { y[i] })
                .collect();
            d.store(out, &v)
        }
        (Op::Where, Pass::Grad { input }) => {
            let g = d.load(&l.inputs[0])?;
            let gshape = l.inputs[0].layout.shape.clone();
            let c = load_as(d, saved(l, Role::Input(0))?, &gshape)?;
            let pick = input == 1;
            let full: Scratch = (0..g.len())
                .into_par_iter()
                .map(|i| if (c[i] != 0.0) == pick { g[i] } else { 0.0 })
                .collect();
            d.store(out, &sum_to(&full, &gshape, &oshape))
        }
        (Op::Cat { dim }, Pass::Forward) => {
            let dim = crate::engine::layout::wrap_dim(*dim, oshape.len()).map_err(|e| e.0)?;
            let outer: usize = oshape[..dim].iter().product();
            let inner: usize = oshape[dim + 1..].iter().product();
            let parts = l
                .inputs
                .iter()
                .filter(|b| !crate::engine::op::cat_skips(&b.layout.shape))
                .map(|b| Ok((d.load(b)?, b.layout.shape[dim] * inner)))
                .collect::<Result<Vec<_>, String>>()?;
            let mut v = Vec::with_capacity(oshape.iter().product());
            for o in 0..outer {
                for (p, n) in &parts {
                    v.extend_from_slice(&p[o * n..(o + 1) * n]);
                }
            }
            d.store(out, &v)
        }
        (Op::Pad { pads, value }, pass) => {
            // forward: the input placed in a field of `value`; backward: the input's part of the
            // gradient
            let (src, big, small) = match pass {
                Pass::Forward => (
                    &l.inputs[0],
                    oshape.clone(),
                    l.inputs[0].layout.shape.clone(),
                ),
                Pass::Grad { .. } => (
                    &l.inputs[0],
                    l.inputs[0].layout.shape.clone(),
                    oshape.clone(),
                ),
            };
            let vals = d.load(src)?;
            let n = big.len();
            let before = |k: usize| -> i64 {
                let pair = n - 1 - k;
                pads.get(2 * pair).copied().unwrap_or(0)
            };
            let big_strides = crate::engine::layout::contiguous_strides(&big);
            let small_strides = crate::engine::layout::contiguous_strides(&small);
            let forward = matches!(pass, Pass::Forward);
            let total: usize = if forward {
                big.iter().product()
            } else {
                small.iter().product()
            };
            let v: Vec<f64> = (0..total)
                .map(|i| {
                    // the element's index in the padded tensor, and whether the input has it
                    let (shape, strides) = if forward {
                        (&big, &big_strides)
                    } else {
                        (&small, &small_strides)
                    };
                    let mut at_big = 0usize;
                    let mut at_small = 0i64;
                    let mut inside = true;
                    for k in 0..n {
                        let idx = (i / strides[k]) % shape[k].max(1);
                        let (bi, si) = if forward {
                            (idx as i64, idx as i64 - before(k))
                        } else {
                            (idx as i64 + before(k), idx as i64)
                        };
                        if si < 0 || si >= small[k] as i64 || bi < 0 || bi >= big[k] as i64 {
                            inside = false;
                        }
                        at_big += (bi.max(0) as usize) * big_strides[k];
                        at_small += si * small_strides[k] as i64;
                    }
                    match (forward, inside) {
                        (true, true) => vals[at_small as usize],
                        (true, false) => *value,
                        (false, true) => vals[at_big],
                        (false, false) => 0.0,
                    }
                })
                .collect();
            d.store(out, &v)
        }
        (Op::Binary(b), Pass::Forward) => {
            let x = load_as(d, &l.inputs[0], &oshape)?;
            let y = load_as(d, &l.inputs[1], &oshape)?;
            let v: Scratch = x
                .par_iter()
                .zip(y.par_iter())
                .map(|(a, c)| binary(*b, *a, *c))
                .collect();
            d.store(out, &v)
        }
        (Op::Binary(b), Pass::Grad { input }) => {
            let g = d.load(&l.inputs[0])?;
            let gshape = l.inputs[0].layout.shape.clone();
            let other = |d: &CpuDevice, k: usize| -> Result<Scratch, String> {
                load_as(d, saved(l, Role::Input(k))?, &gshape)
            };
            let full: Scratch = match (b, input) {
                (Binary::Add, _) | (Binary::Sub, 0) => g,
                (Binary::Sub, _) => g.par_iter().map(|x| -x).collect(),
                (Binary::Mul, k) => {
                    let o = other(d, 1 - k)?;
                    g.par_iter().zip(o.par_iter()).map(|(a, c)| a * c).collect()
                }
                (Binary::Div, 0) => {
                    let o = other(d, 1)?;
                    g.par_iter().zip(o.par_iter()).map(|(a, c)| a / c).collect()
                }
                (Binary::Div, _) => {
                    let (a, c) = (other(d, 0)?, other(d, 1)?);
                    (0..g.len()).map(|i| -g[i] * a[i] / (c[i] * c[i])).collect()
                }
            };
            d.store(out, &sum_to(&full, &gshape, &oshape))
        }
        (
            Op::Scalar {
                op,
                value,
                reversed,
            },
            pass,
        ) => {
            let x = d.load(&l.inputs[0])?;
            let v: Scratch =
                match pass {
                    Pass::Forward => x
                        .iter()
                        .map(|&a| {
                            if *reversed {
                                binary(*op, *value, a)
                            } else {
                                binary(*op, a, *value)
                            }
                        })
                        .collect(),
                    Pass::Grad { .. } => match (op, reversed) {
                        (Binary::Add, _) | (Binary::Sub, false) => x,
                        (Binary::Sub, true) => x.par_iter().map(|g| -g).collect(),
                        (Binary::Mul, _) => x.par_iter().map(|g| g * value).collect(),
                        (Binary::Div, false) => x.par_iter().map(|g| g / value).collect(),
                        (Binary::Div, true) => return Err(
                            "the gradient of a number divided by a tensor needs the tensor, which \
                             this op does not keep; write (x ** -1) * c as x.reciprocal() is not \
                             in gpumem's engine yet"
                                .into(),
                        ),
                    },
                };
            d.store(out, &v)
        }
        (Op::MaskedFill { value }, pass) => {
            let shape = match pass {
                Pass::Forward => oshape.clone(),
                Pass::Grad { .. } => l.inputs[0].layout.shape.clone(),
            };
            let (x, mask) = match pass {
                Pass::Forward => (
                    load_as(d, &l.inputs[0], &shape)?,
                    load_as(d, &l.inputs[1], &shape)?,
                ),
                Pass::Grad { .. } => (
                    d.load(&l.inputs[0])?,
                    load_as(d, saved(l, Role::Input(1))?, &shape)?,
                ),
            };
            let fillv = if matches!(pass, Pass::Forward) {
                *value
            } else {
                0.0
            };
            let v: Scratch = x
                .par_iter()
                .zip(mask.par_iter())
                .map(|(&a, &m)| if m != 0.0 { fillv } else { a })
                .collect();
            d.store(out, &sum_to(&v, &shape, &oshape))
        }
        (Op::Cast | Op::Clone | Op::Copy, _) => {
            let v = d.load(&l.inputs[0])?;
            d.store(out, &v)
        }
        (Op::Dropout { p, seed }, Pass::Forward) => {
            let x = d.load(&l.inputs[0])?;
            let mut rng = Rng::new(*seed);
            let keep: Scratch = (0..x.len())
                .map(|_| (rng.uniform() >= *p) as u8 as f64)
                .collect();
            let scale = if *p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
            let v: Scratch = x
                .par_iter()
                .zip(keep.par_iter())
                .map(|(a, k)| a * k * scale)
                .collect();
            d.store(out, &v)?;
            match l.outputs.get(1) {
                Some(mask) => d.store(mask, &keep),
                None => Ok(()),
            }
        }
        (Op::Dropout { p, .. }, Pass::Grad { .. }) => {
            let g = d.load(&l.inputs[0])?;
            let m = d.load(saved(l, Role::Extra(0))?)?;
            let scale = if *p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
            let v: Scratch = g
                .par_iter()
                .zip(m.par_iter())
                .map(|(a, k)| a * k * scale)
                .collect();
            d.store(out, &v)
        }
        (Op::InPlace(ip), _) => {
            let x = d.load(out)?;
            let v: Scratch = match ip {
                InPlace::Tensor(b) => {
                    let y = load_as(d, &l.inputs[1], &oshape)?;
                    x.par_iter()
                        .zip(y.par_iter())
                        .map(|(a, c)| binary(*b, *a, *c))
                        .collect()
                }
                InPlace::Scalar(b, s) => x.par_iter().map(|a| binary(*b, *a, *s)).collect(),
                InPlace::Unary(u) => x.par_iter().map(|a| unary(*u, *a)).collect(),
                InPlace::Fill(s) => Scratch::filled(x.len(), *s),
                InPlace::Copy => load_as(d, &l.inputs[1], &oshape)?,
                InPlace::MaskedFill(v) => {
                    let m = load_as(d, &l.inputs[1], &oshape)?;
                    x.par_iter()
                        .zip(m.par_iter())
                        .map(|(a, k)| if *k != 0.0 { *v } else { *a })
                        .collect()
                }
            };
            d.store(out, &v)
        }
        (Op::Accumulate, _) => {
            let a = d.load(out)?;
            let b = d.load(&l.inputs[0])?;
            let v: Scratch = a.par_iter().zip(b.par_iter()).map(|(x, y)| x + y).collect();
            d.store(out, &v)
        }
        (op, pass) => Err(format!("no CPU kernel for {} ({pass:?})", op.name())),
    }
}

/// Binary arithmetic in float64; the store rounds the result to the output's dtype, which for
/// float32 operands gives exactly float32's result (one rounding of the exact value).
fn binary(b: Binary, x: f64, y: f64) -> f64 {
    b.apply(x, y)
}
