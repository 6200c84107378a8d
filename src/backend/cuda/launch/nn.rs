//! Neural-network launches on the GPU: softmax and log_softmax over the last dimension
//! (`kernels/softmax.cu`), layer_norm and rms_norm (`kernels/norm.cu`), forward and every
//! input's gradient, on contiguous float32 rows; `embedding` forward and the table's
//! gradient (`kernels/nn.cu`); `sum` and `mean` over adjacent dimensions and their gradient
//! (`kernels/reduce.cu`, `scalar`). The twin of `src/backend/cpu/nn.rs`; what a
//! kernel here does not take runs on the host twin.

use cudarc::driver::PushKernelArg;

use super::{contiguous, floating, Gpu, Strided};
use crate::backend::{Launch, Pass};
use crate::engine::op::norm::Norm;
use crate::engine::op::{Op, Role};

/// Runs `l` here if a kernel of this family takes it; `false` where none does.
pub(super) fn launch(g: &mut Gpu, l: &Launch) -> Result<bool, String> {
    let Some(out) = l.outputs.first() else {
        return Ok(false);
    };
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
                    // SAFETY: x and the output hold rows x cols contiguous elements
                    unsafe {
                        g.stream
                            .launch_builder(&f)
                            .arg(&lg)
                            .arg(&x.0)
                            .arg(&x.1)
                            .arg(&o.0)
                            .arg(&o.1)
                            .arg(&rows)
                            .arg(&cc)
                            .launch(Gpu::rows(rows as usize))
                    }
                    .map_err(|e| format!("softmax: {e:?}"))?;
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
                    // SAFETY: every buffer holds rows x cols contiguous elements
                    unsafe {
                        g.stream
                            .launch_builder(&f)
                            .arg(&lg)
                            .arg(&gr.0)
                            .arg(&gr.1)
                            .arg(&y.0)
                            .arg(&y.1)
                            .arg(&o.0)
                            .arg(&o.1)
                            .arg(&rows)
                            .arg(&cc)
                            .launch(Gpu::rows(rows as usize))
                    }
                    .map_err(|e| format!("softmax_backward: {e:?}"))?;
                }
            }
            Ok(true)
        }
        (Op::Norm(norm), pass) => self::norm(g, l, *norm, pass, o),
        (Op::Embedding { .. }, pass) => embedding(g, l, pass, o),
        (Op::Reduce { mean, dims, .. }, pass) => reduce(g, l, *mean, dims, pass, o),
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
    o: (u64, i32),
) -> Result<bool, String> {
    use crate::engine::layout::Layout;
    let out = &l.outputs[0];
    let x_shape = match pass {
        Pass::Forward => l.inputs[0].layout.shape.to_vec(),
        Pass::Grad { .. } => out.layout.shape.to_vec(),
    };
    let Ok(red) = dims.reduced(x_shape.len()) else {
        return Ok(false);
    };
    // the reduced dimensions must be one run [a, b)
    let (Some(a), Some(b)) = (
        red.iter().position(|&r| r),
        red.iter().rposition(|&r| r).map(|i| i + 1),
    ) else {
        return Ok(false);
    };
    if red[a..b].iter().any(|&r| !r) {
        return Ok(false);
    }
    let prod = |s: &[usize]| s.iter().product::<usize>();
    let (outer, len, inner) = (
        prod(&x_shape[..a]),
        prod(&x_shape[a..b]),
        prod(&x_shape[b..]),
    );
    if outer * len * inner == 0 {
        return Ok(false);
    }
    match pass {
        Pass::Forward => {
            let Some(x) = contiguous(&l.inputs[0]) else {
                return Ok(false);
            };
            if out.layout.numel() != outer * inner {
                return Ok(false);
            }
            let (m, oo, ll, ii) = (mean as i32, outer as i64, len as i64, inner as i64);
            let f = g.function("reduce")?;
            // SAFETY: x holds outer x len x inner floats, the output outer x inner
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&m)
                    .arg(&x.0)
                    .arg(&x.1)
                    .arg(&oo)
                    .arg(&ll)
                    .arg(&ii)
                    .arg(&o.0)
                    .arg(&o.1)
                    .launch(Gpu::elems(outer * inner))
            }
            .map_err(|e| format!("reduce: {e:?}"))?;
        }
        Pass::Grad { .. } => {
            let gb = &l.inputs[0];
            if !floating(gb.dtype)
                || !gb.layout.is_contiguous()
                || gb.layout.numel() != outer * inner
            {
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
            let n = outer * len * inner;
            let scale = if mean { 1.0 / len as f64 } else { 1.0 } as f32;
            let (code, rev, nn) = (crate::engine::op::Binary::Mul as i32, 0i32, n as i64);
            let f = g.function("scalar")?;
            // SAFETY: the gradient read through a stride-0 view of the input's shape; the
            // output holds n contiguous floats
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&code)
                    .arg(&rev)
                    .arg(&scale)
                    .arg(&gb.addr)
                    .arg(&gs)
                    .arg(&out.addr)
                    .arg(&os)
                    .arg(&nn)
                    .launch(Gpu::elems(n))
            }
            .map_err(|e| format!("reduce's backward: {e:?}"))?;
        }
    }
    Ok(true)
}

/// A contiguous int64 buffer's first element, if it is one.
fn contiguous_i64(b: &crate::backend::Buffer) -> Option<u64> {
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
    let cfg = Gpu::elems(n * dim);
    match pass {
        Pass::Forward => {
            if out.layout.numel() != n * dim {
                return Ok(false);
            }
            let table = contiguous(&l.inputs[1]).expect("checked above");
            let f = g.function("embedding")?;
            // SAFETY: n checked indices into a [rows, dim] table; the output holds n x dim
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&idx)
                    .arg(&nn)
                    .arg(&table.0)
                    .arg(&table.1)
                    .arg(&dd)
                    .arg(&o.0)
                    .arg(&o.1)
                    .launch(cfg)
            }
            .map_err(|e| format!("embedding: {e:?}"))?;
        }
        Pass::Grad { .. } => {
            let Some(gr) = contiguous(&l.inputs[0]) else {
                return Ok(false);
            };
            // atomic adds into a float32 table's gradient only
            if l.inputs[0].layout.numel() != n * dim || o.1 != 0 {
                return Ok(false);
            }
            let o = o.0;
            // SAFETY: the output is rows x dim floats, zeroed on the stream before the adds
            unsafe {
                cudarc::driver::result::memset_d8_async(o, 0, rows * dim * 4, g.stream.cu_stream())
            }
            .map_err(|e| format!("embedding_backward: {e:?}"))?;
            let f = g.function("embedding_backward")?;
            // SAFETY: n checked indices; grad holds n x dim floats, the output rows x dim
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&idx)
                    .arg(&nn)
                    .arg(&gr.0)
                    .arg(&gr.1)
                    .arg(&dd)
                    .arg(&o)
                    .launch(cfg)
            }
            .map_err(|e| format!("embedding_backward: {e:?}"))?;
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
            // SAFETY: x and y hold rows x cols elements, w and b cols, the statistics rows
            unsafe {
                let mut lb = g.stream.launch_builder(&f);
                lb.arg(&xp.0).arg(&xp.1).arg(&w.0).arg(&w.1);
                if layer {
                    let (mean, rstd) = (stats[0].expect("checked"), stats[1].expect("checked"));
                    lb.arg(&b.0).arg(&b.1).arg(&hw).arg(&hb).arg(&o.0).arg(&o.1);
                    lb.arg(&mean.0).arg(&mean.1).arg(&rstd.0).arg(&rstd.1);
                    lb.arg(&rr).arg(&cc).arg(&eps).launch(Gpu::rows(rows))
                } else {
                    let rstd = stats[0].expect("checked");
                    lb.arg(&hw).arg(&o.0).arg(&o.1).arg(&rstd.0).arg(&rstd.1);
                    lb.arg(&rr).arg(&cc).arg(&eps).launch(Gpu::rows(rows))
                }
            }
            .map_err(|e| format!("{}: {e:?}", norm.name()))?;
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
                Gpu::elems(cols)
            };
            let f = g.function(if layer {
                "layer_norm_backward"
            } else {
                "rms_norm_backward"
            })?;
            // SAFETY: as in the forward; the output holds the input's (or column's) elements
            unsafe {
                let mut lb = g.stream.launch_builder(&f);
                lb.arg(&inp).arg(&gr.0).arg(&gr.1).arg(&xp.0).arg(&xp.1);
                lb.arg(&w.0).arg(&w.1).arg(&hw);
                if layer {
                    lb.arg(&mean.0).arg(&mean.1);
                }
                lb.arg(&rstd.0).arg(&rstd.1).arg(&o.0).arg(&o.1);
                lb.arg(&rr).arg(&cc).launch(cfg)
            }
            .map_err(|e| format!("{}: {e:?}", norm.name()))?;
        }
    }
    Ok(true)
}
