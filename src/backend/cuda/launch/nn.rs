//! Neural-network launches on the GPU: softmax and log_softmax over the last dimension
//! (`kernels/softmax.cu`), layer_norm and rms_norm (`kernels/norm.cu`), forward and every
//! input's gradient, on contiguous float32 rows; `embedding` forward and the table's
//! gradient (`kernels/nn.cu`); `sum` and `mean` over adjacent dimensions and their gradient
//! (`kernels/reduce.cu`, `scalar`). The twin of `src/backend/cpu/nn.rs`; what a
//! kernel here does not take runs on the host twin.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{contiguous, floating, Gpu, Strided};
use crate::backend::{Launch, Pass};
use crate::engine::op::norm::Norm;
use crate::engine::op::{Op, Role};

/// Runs `l` here if a kernel of this family takes it; `false` where none does.
pub(super) fn launch(g: &mut Gpu, l: &Launch) -> Result<bool, String> {
    let Some(out) = l.outputs.first() else {
        return Ok(false);
    };
    match (l.op, l.pass) {
        (Op::Reduce { mean, .. }, Pass::Forward) => {
            let x = &l.inputs[0];
            let red = match l.op {
                Op::Reduce { dims, .. } => match dims.reduced(x.layout.shape.len()) {
                    Ok(r) => r,
                    Err(_) => return Ok(false),
                },
                _ => unreachable!(),
            };
            return reduce_view(g, x, &red, *mean, out);
        }
        (Op::Argmax { dim, .. } | Op::Logical { dim, .. }, Pass::Forward) => {
            let x = &l.inputs[0];
            let nd = x.layout.shape.len();
            let red: Vec<bool> = match dim {
                None => vec![true; nd],
                Some(d) => match crate::engine::layout::wrap_dim(*d, nd) {
                    Ok(k) => (0..nd).map(|i| i == k).collect(),
                    Err(_) => return Ok(false),
                },
            };
            let mode = match l.op {
                Op::Argmax { .. } => 0,
                Op::Logical { any: true, .. } => 1,
                _ => 2,
            };
            return select(g, x, &red, mode, out);
        }
        (Op::Max, Pass::Forward) => {
            let x = &l.inputs[0];
            return select(g, x, &vec![true; x.layout.shape.len()], 3, out);
        }
        (Op::SumTo, _) => {
            // the leading dimensions the output lacks, and those it keeps as 1
            let (x, xs, os) = (&l.inputs[0], &l.inputs[0].layout.shape, &out.layout.shape);
            if os.len() > xs.len() {
                return Ok(false);
            }
            let lead = xs.len() - os.len();
            let red: Vec<bool> = (0..xs.len())
                .map(|i| i < lead || (os[i - lead] == 1 && xs[i] != 1))
                .collect();
            return reduce_view(g, x, &red, false, out);
        }
        (Op::Reduce { mean, dims, .. }, pass) => {
            return reduce(g, l, *mean, dims, pass);
        }
        _ => {}
    }
    let Some(o) = contiguous(out) else {
        return Ok(false);
    };
    match (l.op, l.pass) {
        (Op::Softmax { dim, log, .. }, pass) => {
            let nd = out.layout.shape.len() as i64;
            // over the last dimension of contiguous rows only
            if nd == 0 || (*dim != -1 && *dim != nd - 1) {
                return Ok(false);
            }
            let cols = out.layout.shape[nd as usize - 1];
            let n = out.layout.numel();
            if cols == 0 || n == 0 {
                return Ok(false);
            }
            let (rows, cc, lg) = ((n / cols) as i64, cols as i64, *log as i32);
            match pass {
                Pass::Forward => {
                    let Some(x) = contiguous(&l.inputs[0]) else {
                        return Ok(false);
                    };
                    let f = g.function("softmax")?;
                    // x and the output hold rows x cols contiguous elements
                    g.run(&f, Gpu::rows(rows as usize), |b| {
                        b.arg(&lg)
                            .arg(&x.0)
                            .arg(&x.1)
                            .arg(&o.0)
                            .arg(&o.1)
                            .arg(&rows)
                            .arg(&cc);
                    })?;
                }
                Pass::Grad { .. } => {
                    let y = l
                        .saved
                        .iter()
                        .find(|(r, _)| *r == Role::Output)
                        .and_then(|(_, b)| contiguous(b));
                    let (Some(gr), Some(y)) = (contiguous(&l.inputs[0]), y) else {
                        return Ok(false);
                    };
                    let f = g.function("softmax_backward")?;
                    // every buffer holds rows x cols contiguous elements
                    g.run(&f, Gpu::rows(rows as usize), |b| {
                        b.arg(&lg)
                            .arg(&gr.0)
                            .arg(&gr.1)
                            .arg(&y.0)
                            .arg(&y.1)
                            .arg(&o.0)
                            .arg(&o.1)
                            .arg(&rows)
                            .arg(&cc);
                    })?;
                }
            }
            Ok(true)
        }
        (Op::Norm(norm), pass) => self::norm(g, l, *norm, pass, o),
        (Op::NllLoss, pass) => nll_loss(g, l, pass, o),
        (Op::Dropout { p, seed }, pass) => dropout(g, l, *p, *seed, pass, o),
        (Op::Embedding { .. }, pass) => embedding(g, l, pass, o),
        _ => Ok(false),
    }
}

/// `sum`/`mean` over a run of adjacent dimensions of a contiguous tensor (reduce.cu's
/// `reduce` over [outer, len, inner]), and its gradient: the incoming gradient expanded back
/// over the reduced dimensions and scaled (elementwise.cu's `scalar` through a stride-0 view).
fn reduce(
    g: &mut Gpu,
    l: &Launch,
    mean: bool,
    dims: &crate::engine::op::reduce::DimList,
    pass: Pass,
) -> Result<bool, String> {
    use crate::engine::layout::Layout;
    let Pass::Grad { .. } = pass else {
        return Ok(false);
    };
    // the incoming gradient expanded back over the reduced dimensions, scaled
    let out = &l.outputs[0];
    let x_shape = out.layout.shape.to_vec();
    let Ok(red) = dims.reduced(x_shape.len()) else {
        return Ok(false);
    };
    let n = out.layout.numel();
    let kept_n: usize = x_shape
        .iter()
        .zip(&red)
        .filter(|(_, &r)| !r)
        .map(|(&s, _)| s)
        .product();
    let len = n / kept_n.max(1);
    let gb = &l.inputs[0];
    if n == 0 || !floating(gb.dtype) || !gb.layout.is_contiguous() || gb.layout.numel() != kept_n {
        return Ok(false);
    }
    let kept: Vec<usize> = x_shape
        .iter()
        .zip(&red)
        .map(|(&s, &r)| if r { 1 } else { s })
        .collect();
    let sizes: Vec<i64> = x_shape.iter().map(|&s| s as i64).collect();
    let Ok(mut gl) = Layout::contiguous(&kept).expand(&sizes) else {
        return Ok(false);
    };
    gl.offset = gb.layout.offset;
    let (Some(gs), Some(os)) = (
        Strided::of(&gl, gb.dtype),
        Strided::of(out.layout, out.dtype),
    ) else {
        return Ok(false);
    };
    let scale = if mean { 1.0 / len.max(1) as f64 } else { 1.0 };
    let (code, rev, nn) = (crate::engine::op::Binary::Mul as i32, 0i32, n as i64);
    let f = g.function("scalar")?;
    // the gradient read through a stride-0 view of the input's shape; the output is written through its own view
    g.run(&f, Gpu::elems(n), |b| {
        b.arg(&code)
            .arg(&rev)
            .arg(&scale)
            .arg(&gb.addr)
            .arg(&gs)
            .arg(&out.addr)
            .arg(&os)
            .arg(&nn);
    })?;
    Ok(true)
}

/// `sum`/`mean` of `x` over the dimensions `red` marks (reduce.cu's `reduce`): the input
/// seen with its kept dimensions first and the reduced ones after, so each output element
/// sums one run of that view; the output through its own view (keepdim's ones included).
pub(super) fn reduce_view(
    g: &mut Gpu,
    x: &crate::backend::Buffer,
    red: &[bool],
    mean: bool,
    out: &crate::backend::Buffer,
) -> Result<bool, String> {
    // floating, or an integer sum (the engine sums an int or bool tensor from its int64 copy)
    let int = |d: crate::engine::DType| {
        matches!(
            d,
            crate::engine::DType::I64 | crate::engine::DType::I32 | crate::engine::DType::Bool
        )
    };
    let ok =
        (floating(x.dtype) && floating(out.dtype)) || (!mean && int(x.dtype) && int(out.dtype));
    if !ok {
        return Ok(false);
    }
    let Some((xs, os, total, len)) = permuted(x, red, out) else {
        return Ok(false);
    };
    if total == 0 {
        return Ok(true);
    }
    let (pb, _) = per_output(total, len);
    reduction(
        g,
        "reduce",
        [pb, mean as i32],
        (x.addr, xs),
        (out.addr, os),
        total,
        len,
    )
}

/// Launches reduce.cu's `kernel` over `total` outputs of `len` elements each, its two leading
/// integer arguments first (`reduce`: per block, mean; `reduce__select`: mode, per block).
fn reduction(
    g: &mut Gpu,
    kernel: &'static str,
    lead: [i32; 2],
    (x, xs): (u64, Strided),
    (o, os): (u64, Strided),
    total: usize,
    len: usize,
) -> Result<bool, String> {
    let (tt, ll) = (total as i64, len as i64);
    let (_, cfg) = per_output(total, len);
    let f = g.function(kernel)?;
    // the input read through a permutation of its own view, the output written through its
    // view, `total` elements
    g.run(&f, cfg, |b| {
        b.arg(&lead[0])
            .arg(&lead[1])
            .arg(&x)
            .arg(&xs)
            .arg(&tt)
            .arg(&ll)
            .arg(&o)
            .arg(&os);
    })?;
    Ok(true)
}

/// `x`'s view with the kept dimensions first and the `red`uced ones last, the output's view,
/// the outputs and the elements each reduces; `None` where the output does not hold one
/// element per kept position, or a view the kernels do not read.
fn permuted(
    x: &crate::backend::Buffer,
    red: &[bool],
    out: &crate::backend::Buffer,
) -> Option<(Strided, Strided, usize, usize)> {
    let shape = &x.layout.shape;
    if red.len() != shape.len() {
        return None;
    }
    let order: Vec<i64> = (0..shape.len())
        .filter(|&i| !red[i])
        .chain((0..shape.len()).filter(|&i| red[i]))
        .map(|i| i as i64)
        .collect();
    let perm = x.layout.permute(&order).ok()?;
    let total: usize = (0..shape.len())
        .filter(|&i| !red[i])
        .map(|i| shape[i])
        .product();
    let len: usize = (0..shape.len())
        .filter(|&i| red[i])
        .map(|i| shape[i])
        .product();
    if out.layout.numel() != total {
        return None;
    }
    Some((
        Strided::of(&perm, x.dtype)?,
        Strided::of(out.layout, out.dtype)?,
        total,
        len,
    ))
}

/// Few outputs with long reductions take a block each (reduce.cu's `per_block`), so the GPU
/// is not left to a few hundred threads; else a thread each.
fn per_output(total: usize, len: usize) -> (i32, LaunchConfig) {
    let per_block = total < 65_536 && len >= 1024;
    let cfg = if per_block {
        LaunchConfig {
            grid_dim: (total.min(1 << 20) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    } else {
        Gpu::elems(total)
    };
    (per_block as i32, cfg)
}

/// `argmax` (mode 0: int64 positions), `any` (1) and `all` (2: bools) over the dimensions
/// `red`, and `max` (3) over everything: reduce.cu's `reduce__select`, on any view of any dtype
/// (read as double: exact for every dtype here).
fn select(
    g: &mut Gpu,
    x: &crate::backend::Buffer,
    red: &[bool],
    mode: i32,
    out: &crate::backend::Buffer,
) -> Result<bool, String> {
    let Some((xs, os, total, len)) = permuted(x, red, out) else {
        return Ok(false);
    };
    // (an empty argmax or max is the cpu twin's to answer)
    if len == 0 || total == 0 {
        return Ok(total == 0 && mode != 0 && mode != 3);
    }
    let (pb, _) = per_output(total, len);
    reduction(
        g,
        "reduce__select",
        [mode, pb],
        (x.addr, xs),
        (out.addr, os),
        total,
        len,
    )
}

/// A contiguous int64 buffer's first element, if it is one.
pub(super) fn contiguous_i64(b: &crate::backend::Buffer) -> Option<u64> {
    (b.dtype == crate::engine::DType::I64 && b.layout.is_contiguous())
        .then(|| b.addr + 8 * b.layout.offset as u64)
}

/// `F.embedding` (rows of a contiguous [V, dim] table, indices checked first as the cpu twin
/// does) and the table's gradient (zeroed, then each use's row added).
fn embedding(g: &mut Gpu, l: &Launch, pass: Pass, o: (u64, i32)) -> Result<bool, String> {
    let idx_buf = match pass {
        Pass::Forward => &l.inputs[0],
        Pass::Grad { .. } => match l.saved.iter().find(|(r, _)| *r == Role::Input(0)) {
            Some((_, b)) => b,
            None => return Ok(false),
        },
    };
    let Some(idx) = contiguous_i64(idx_buf) else {
        return Ok(false);
    };
    let n = idx_buf.layout.numel();
    let out = &l.outputs[0];
    let (rows, dim) = match pass {
        Pass::Forward => {
            let t = &l.inputs[1].layout.shape;
            if t.len() != 2 || contiguous(&l.inputs[1]).is_none() {
                return Ok(false);
            }
            (t[0], t[1])
        }
        Pass::Grad { .. } => {
            if out.layout.shape.len() != 2 {
                return Ok(false);
            }
            (out.layout.shape[0], out.layout.shape[1])
        }
    };
    if n == 0 || dim == 0 {
        return Ok(false);
    }
    // an index out of the table is the cpu twin's error, not a read past the table
    let mut host = vec![0i64; n];
    super::mem::get(idx, bytemuck_i64(&mut host))?;
    if let Some(&i) = host.iter().find(|&&i| i < 0 || i as usize >= rows) {
        return Err(format!(
            "index {i} is out of range for an embedding of {rows} rows"
        ));
    }
    let (nn, dd) = (n as i64, dim as i64);
    match pass {
        Pass::Forward => {
            if out.layout.numel() != n * dim {
                return Ok(false);
            }
            let cfg = Gpu::elems(n * dim);
            let table = contiguous(&l.inputs[1]).expect("checked above");
            let f = g.function("embedding")?;
            // n checked indices into a [rows, dim] table; the output holds n x dim
            g.run(&f, cfg, |b| {
                b.arg(&idx)
                    .arg(&nn)
                    .arg(&table.0)
                    .arg(&table.1)
                    .arg(&dd)
                    .arg(&o.0)
                    .arg(&o.1);
            })?;
        }
        Pass::Grad { .. } => {
            let Some(gr) = contiguous(&l.inputs[0]) else {
                return Ok(false);
            };
            if l.inputs[0].layout.numel() != n * dim || !out.layout.is_contiguous() {
                return Ok(false);
            }
            let bytes = rows * dim * out.dtype.size() as usize;
            // SAFETY: the output is rows x dim contiguous elements, zeroed on the stream before
            // the used rows are written (zero bits are zero in every floating dtype)
            unsafe { cudarc::driver::result::memset_d8_async(o.0, 0, bytes, g.stream.cu_stream()) }
                .map_err(|e| format!("embedding_backward: {e:?}"))?;
            let f = g.function("embedding_backward")?;
            let cfg = LaunchConfig {
                grid_dim: (n.clamp(1, 65_535) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // n checked indices; grad holds n x dim elements, the output rows x dim
            g.run(&f, cfg, |b| {
                b.arg(&idx)
                    .arg(&nn)
                    .arg(&gr.0)
                    .arg(&gr.1)
                    .arg(&dd)
                    .arg(&o.0)
                    .arg(&o.1);
            })?;
        }
    }
    Ok(true)
}

/// `F.nll_loss(logp [rows, cols], target [rows])`, float32, mean over the targets that are
/// not -100 (the loss, then the count the backward keeps), with the targets checked on the
/// host first as the cpu twin checks them; and the log-probabilities' gradient.
fn nll_loss(g: &mut Gpu, l: &Launch, pass: Pass, o: (u64, i32)) -> Result<bool, String> {
    let f32_of =
        |b: &crate::backend::Buffer| contiguous(b).filter(|&(_, c)| c == 0).map(|(a, _)| a);
    let saved_buf = |r: Role| l.saved.iter().find(|(role, _)| *role == r).map(|(_, b)| b);
    let (target, shape) = match pass {
        Pass::Forward => (l.inputs.get(1), l.inputs[0].layout.shape.to_vec()),
        Pass::Grad { .. } => (
            saved_buf(Role::Input(1)),
            l.outputs[0].layout.shape.to_vec(),
        ),
    };
    let Some(t) = target.and_then(contiguous_i64) else {
        return Ok(false);
    };
    if shape.len() != 2 || o.1 != 0 {
        return Ok(false);
    }
    let (rows, cols) = (shape[0], shape[1]);
    if rows == 0 || cols == 0 || target.map(|b| b.layout.numel()) != Some(rows) {
        return Ok(false);
    }
    let (rr, cc) = (rows as i64, cols as i64);
    match pass {
        Pass::Forward => {
            let (Some(lp), Some(w)) = (f32_of(&l.inputs[0]), l.outputs.get(1).and_then(f32_of))
            else {
                return Ok(false);
            };
            let mut host = vec![0i64; rows];
            super::mem::get(t, bytemuck_i64(&mut host))?;
            if let Some(&ti) = host
                .iter()
                .find(|&&v| v != -100 && (v < 0 || v as usize >= cols))
            {
                return Err(format!("Target {ti} is out of bounds."));
            }
            let f = g.function("nll_loss")?;
            // rows checked targets into [rows, cols] float32 log-probabilities; the loss and
            // the count are one float32 each; one block of 256 threads
            let one_block = cudarc::driver::LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            g.run(&f, one_block, |b| {
                b.arg(&lp).arg(&t).arg(&rr).arg(&cc).arg(&o.0).arg(&w);
            })?;
        }
        Pass::Grad { .. } => {
            let (Some(gr), Some(w)) = (
                f32_of(&l.inputs[0]),
                saved_buf(Role::Extra(0)).and_then(f32_of),
            ) else {
                return Ok(false);
            };
            let f = g.function("nll_loss_backward")?;
            // one float32 gradient and count; rows targets (checked in the forward); the output rows x cols float32
            g.run(&f, Gpu::elems(rows * cols), |b| {
                b.arg(&gr).arg(&t).arg(&w).arg(&rr).arg(&cc).arg(&o.0);
            })?;
        }
    }
    Ok(true)
}

/// A contiguous bool mask's first element.
fn contiguous_mask(b: &crate::backend::Buffer) -> Option<u64> {
    (matches!(
        b.dtype,
        crate::engine::DType::Bool | crate::engine::DType::U8
    ) && b.layout.is_contiguous())
    .then(|| b.addr + b.layout.offset as u64)
}

/// `F.dropout` in training with the cpu device's generator (the same elements kept) and its
/// mask, and its gradient through the kept mask.
fn dropout(
    g: &mut Gpu,
    l: &Launch,
    p: f64,
    seed: u64,
    pass: Pass,
    o: (u64, i32),
) -> Result<bool, String> {
    let n = l.outputs[0].layout.numel();
    let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
    let nn = n as i64;
    match pass {
        Pass::Forward => {
            let (Some(x), Some(m)) = (
                contiguous(&l.inputs[0]),
                l.outputs.get(1).and_then(contiguous_mask),
            ) else {
                return Ok(false);
            };
            if l.inputs[0].layout.numel() != n || l.outputs[1].layout.numel() != n {
                return Ok(false);
            }
            // kept when the draw's top 24 bits over 2^24 are at least p
            let keep_from = (p * (1u64 << 24) as f64)
                .ceil()
                .clamp(0.0, (1u64 << 24) as f64) as u64;
            let f = g.function("dropout")?;
            // x, the output and the mask hold n contiguous elements
            g.run(&f, Gpu::elems(n), |b| {
                b.arg(&x.0)
                    .arg(&x.1)
                    .arg(&o.0)
                    .arg(&o.1)
                    .arg(&m)
                    .arg(&nn)
                    .arg(&seed)
                    .arg(&keep_from)
                    .arg(&scale);
            })?;
        }
        Pass::Grad { .. } => {
            let mask = l
                .saved
                .iter()
                .find(|(r, _)| *r == Role::Extra(0))
                .and_then(|(_, b)| contiguous_mask(b));
            let (Some(gr), Some(m)) = (contiguous(&l.inputs[0]), mask) else {
                return Ok(false);
            };
            if l.inputs[0].layout.numel() != n {
                return Ok(false);
            }
            let f = g.function("dropout_backward")?;
            // the gradient, the mask and the output hold n contiguous elements
            g.run(&f, Gpu::elems(n), |b| {
                b.arg(&gr.0)
                    .arg(&gr.1)
                    .arg(&m)
                    .arg(&o.0)
                    .arg(&o.1)
                    .arg(&nn)
                    .arg(&scale);
            })?;
        }
    }
    Ok(true)
}

/// An int64 slice as its bytes, for a copy from the device.
fn bytemuck_i64(v: &mut [i64]) -> &mut [u8] {
    // SAFETY: i64 has no padding and every byte pattern is a valid i64
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn saved(l: &Launch, r: Role) -> Option<(u64, i32)> {
    l.saved
        .iter()
        .find(|(role, _)| *role == r)
        .and_then(|(_, b)| contiguous(b))
}

/// layer_norm (`Layer`) or rms_norm over the last dimension: forward (the output, then the
/// mean and rstd the backward keeps) and the gradient of the input, weight or bias.
fn norm(g: &mut Gpu, l: &Launch, norm: Norm, pass: Pass, o: (u64, i32)) -> Result<bool, String> {
    let layer = matches!(norm, Norm::Layer { .. });
    let x = match pass {
        Pass::Forward => &l.inputs[0],
        Pass::Grad { .. } => match l.saved.iter().find(|(r, _)| *r == Role::Input(0)) {
            Some((_, b)) => b,
            None => return Ok(false),
        },
    };
    let Some(xp) = contiguous(x) else {
        return Ok(false);
    };
    let cols = *x.layout.shape.last().unwrap_or(&0);
    let n = x.layout.numel();
    if cols == 0 || n == 0 {
        return Ok(false);
    }
    let rows = n / cols;
    let (rr, cc) = (rows as i64, cols as i64);
    // a missing weight or bias: any valid address, flagged absent
    match pass {
        Pass::Forward => {
            let eps = match norm {
                Norm::Layer { eps } | Norm::Rms { eps } => eps as f32,
            };
            let w = l.inputs.get(1).map(contiguous);
            let b = l.inputs.get(2).map(contiguous);
            if w == Some(None) || b == Some(None) {
                return Ok(false);
            }
            let (w, b) = (w.flatten(), b.flatten());
            let (hw, hb) = (w.is_some() as i32, b.is_some() as i32);
            let (w, b) = (w.unwrap_or(xp), b.unwrap_or(xp));
            let stats: Vec<Option<(u64, i32)>> = l.outputs[1..].iter().map(contiguous).collect();
            let need = if layer { 2 } else { 1 };
            if stats.len() != need || stats.iter().any(|s| s.is_none()) {
                return Ok(false);
            }
            let f = g.function(if layer { "layer_norm" } else { "rms_norm" })?;
            // x and y hold rows x cols elements, w and b cols, the statistics rows
            // layer_norm's statistics are its mean and rstd, rms_norm's its rstd
            let (first, last) = (
                stats[0].expect("checked"),
                stats[need - 1].expect("checked"),
            );
            g.run(&f, Gpu::rows(rows), |lb| {
                lb.arg(&xp.0).arg(&xp.1).arg(&w.0).arg(&w.1);
                if layer {
                    lb.arg(&b.0).arg(&b.1).arg(&hw).arg(&hb).arg(&o.0).arg(&o.1);
                    lb.arg(&first.0).arg(&first.1).arg(&last.0).arg(&last.1);
                } else {
                    lb.arg(&hw).arg(&o.0).arg(&o.1).arg(&last.0).arg(&last.1);
                }
                lb.arg(&rr).arg(&cc).arg(&eps);
            })?;
        }
        Pass::Grad { input } => {
            let Some(gr) = contiguous(&l.inputs[0]) else {
                return Ok(false);
            };
            let w = saved(l, Role::Input(1));
            let hw = w.is_some() as i32;
            let w = w.unwrap_or(xp);
            let (mean, rstd) = if layer {
                (saved(l, Role::Extra(0)), saved(l, Role::Extra(1)))
            } else {
                (Some(xp), saved(l, Role::Extra(0)))
            };
            let (Some(mean), Some(rstd)) = (mean, rstd) else {
                return Ok(false);
            };
            let want = if input == 0 { n } else { cols };
            if l.outputs[0].layout.numel() != want || input > if layer { 2 } else { 1 } {
                return Ok(false);
            }
            let inp = input as i32;
            let cfg = if input == 0 {
                Gpu::rows(rows)
            } else {
                // norm.cu's column sums: a block of 32 x 32 threads per 32 columns
                cudarc::driver::LaunchConfig {
                    grid_dim: (cols.div_ceil(32).clamp(1, 1 << 30) as u32, 1, 1),
                    block_dim: (32, 32, 1),
                    shared_mem_bytes: 0,
                }
            };
            let f = g.function(if layer {
                "layer_norm_backward"
            } else {
                "rms_norm_backward"
            })?;
            // as in the forward; the output holds the input's (or column's) elements
            g.run(&f, cfg, |lb| {
                lb.arg(&inp).arg(&gr.0).arg(&gr.1).arg(&xp.0).arg(&xp.1);
                lb.arg(&w.0).arg(&w.1).arg(&hw);
                if layer {
                    lb.arg(&mean.0).arg(&mean.1);
                }
                lb.arg(&rstd.0).arg(&rstd.1).arg(&o.0).arg(&o.1);
                lb.arg(&rr).arg(&cc);
            })?;
        }
    }
    Ok(true)
}
