//! Attention on the GPU (`kernels/attention.cu`, memory-efficient: the output and one float32
//! logsumexp per query row, never the probabilities): `scaled_dot_product_attention` forward
//! and the gradient of each of q, k and v, on [B, H, T, D] views of float32, bf16 or float16,
//! grouped-query heads included, causal or not. Heads of at most 128 channels take the tiled
//! kernels (FlashAttention-style: a thread per row, the other side streamed through shared
//! memory), any length; wider heads a block per row, at most 4,096 keys (the forward's shared
//! row) and 4,096 queries (the key gradients' shared column). The backward reads the logsumexp the
//! forward kept (the last three-dimensional tensor the node saved). The twin of
//! `src/backend/cpu/attention.rs`; an additive mask and dropout run on the host twin.

use cudarc::driver::{LaunchArgs, LaunchConfig, PushKernelArg};

use super::{fview, Gpu};
use crate::backend::{Buffer, Launch, Pass};
use crate::engine::layout::Layout;
use crate::engine::op::{Op, Role};

/// `kernels/attention.cu`'s shared rows (the path a block per row).
const MAX_KEYS: usize = 4096;
/// `kernels/attention.cu`'s widest head on the tiled path, and the rows of its blocks.
const TILED_D: usize = 128;
const TILED_ROWS: usize = 64;

/// The logsumexp [B, H, width] as float32 contiguous: its address and width.
fn lse_of(b: &Buffer) -> Option<(u64, usize)> {
    (b.layout.shape.len() == 3 && b.dtype == crate::engine::DType::F32 && b.layout.is_contiguous())
        .then(|| (b.addr + 4 * b.layout.offset as u64, b.layout.shape[2]))
}

/// The kernels' last parameters, shared by the forward and backward: heads, rep, t, s, d, dv
/// and the logsumexp's width (`long long` each), causal (`int`) and scale (`float`).
fn push_shape<'a>(b: &mut LaunchArgs<'a>, dims: &'a [i64; 7], causal: &'a i32, scale: &'a f32) {
    for x in dims {
        b.arg(x);
    }
    b.arg(causal).arg(scale);
}

/// Runs `l` here if the kernels take it; `false` where they do not.
pub(super) fn launch(g: &mut Gpu, l: &Launch) -> Result<bool, String> {
    let Op::Sdpa {
        dropout, causal, ..
    } = l.op
    else {
        return Ok(false);
    };
    if *dropout > 0.0 {
        return Ok(false);
    }
    let saved = |r: Role| l.saved.iter().find(|(role, _)| *role == r).map(|(_, b)| b);
    let (q, k, v) = match l.pass {
        Pass::Forward if l.inputs.len() == 3 || l.inputs.len() == 4 => {
            (&l.inputs[0], &l.inputs[1], &l.inputs[2])
        }
        Pass::Grad { .. } if saved(Role::Input(3)).is_none() => {
            match (
                saved(Role::Input(0)),
                saved(Role::Input(1)),
                saved(Role::Input(2)),
            ) {
                (Some(q), Some(k), Some(v)) => (q, k, v),
                _ => return Ok(false),
            }
        }
        _ => return Ok(false),
    };
    let (qs, ks, vs) = (&q.layout.shape, &k.layout.shape, &v.layout.shape);
    if qs.len() != 4 || ks.len() != 4 || vs.len() != 4 || ks[..3] != vs[..3] || qs[0] != ks[0] {
        return Ok(false);
    }
    let (heads, kv_heads) = (qs[1], ks[1]);
    if kv_heads == 0 || heads % kv_heads != 0 {
        return Ok(false);
    }
    let rep = heads / kv_heads;
    let (bh, t, s, d, dv) = (qs[0] * heads, qs[2], ks[2], qs[3], vs[3]);
    if ks[3] != d || s == 0 || t == 0 || bh > 65_535 || d > 1024 || dv > 1024 {
        return Ok(false);
    }
    let out = &l.outputs[0];
    // heads of at most TILED_D channels take the tiled kernels (any number of rows), wider
    // ones a block per row (at most MAX_KEYS keys and queries)
    let tiled = d <= TILED_D && dv <= TILED_D && out.layout.shape.len() == 4;
    if !tiled && (s > MAX_KEYS || t > MAX_KEYS) {
        return Ok(false);
    }
    let (Some(qv), Some(kv), Some(vv)) = (fview(q), fview(k), fview(v)) else {
        return Ok(false);
    };
    let Some(ov) = fview(out) else {
        return Ok(false);
    };
    let (hh, rr, tt, ss, dd, ddv, c) = (
        heads as i64,
        rep as i64,
        t as i64,
        s as i64,
        d as i64,
        dv as i64,
        *causal as i32,
    );
    let scale = 1.0 / (d as f32).sqrt();
    // an additive mask (the forward of a tiled width only), seen as [B, H, T, S]
    let mask = match (l.pass, l.inputs.get(3)) {
        (Pass::Forward, Some(m)) => {
            let to = Layout::contiguous(&[qs[0], heads, t, s]);
            let view = super::elementwise::expand(m.layout, &to);
            match view.and_then(|v| super::fview_as(m, &v)) {
                Some(mv) if tiled => Some(mv),
                _ => return Ok(false),
            }
        }
        _ => None,
    };
    // kernels/attention.cu's kernel per path and width
    let (fwd, bwd) = match (tiled, d.max(dv) <= 64, mask.is_some()) {
        (false, _, _) => ("attention__rows", "attention_backward__rows"),
        (true, true, false) => ("attention__d64", "attention_backward__d64"),
        (true, false, false) => ("attention__d128", "attention_backward__d128"),
        (true, true, true) => ("attention__d64_mask", "attention_backward__d64"),
        (true, false, true) => ("attention__d128_mask", "attention_backward__d128"),
    };
    let rows = |n: usize, by: usize| {
        if tiled {
            LaunchConfig {
                grid_dim: (n.div_ceil(TILED_ROWS) as u32, by as u32, 1),
                block_dim: (TILED_ROWS as u32, 1, 1),
                shared_mem_bytes: 0,
            }
        } else {
            LaunchConfig {
                grid_dim: (n as u32, by as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            }
        }
    };
    match l.pass {
        Pass::Forward => {
            // the logsumexp: the last output, [B, H, width]
            let Some((lse, width)) = l.outputs[1..].last().and_then(lse_of) else {
                return Ok(false);
            };
            if out.layout.numel() != bh * t * dv || width < t {
                return Ok(false);
            }
            if width > t {
                // the padding past the rows: zeros, as the cpu twin writes
                // SAFETY: the logsumexp buffer holds bh x width floats
                unsafe {
                    cudarc::driver::result::memset_d8_async(
                        lse,
                        0,
                        bh * width * 4,
                        g.stream.cu_stream(),
                    )
                }
                .map_err(|e| format!("attention: {e:?}"))?;
            }
            let ww = width as i64;
            let f = g.function(fwd)?;
            // q, k, v and the output are read and written through their views of [B, H, T or S, D]; the logsumexp holds bh x width floats; s keys fit the kernel's shared row
            let shape = [hh, rr, tt, ss, dd, ddv, ww];
            g.run(&f, rows(t, bh), |b| {
                b.arg(&qv.0)
                    .arg(&qv.1)
                    .arg(&kv.0)
                    .arg(&kv.1)
                    .arg(&vv.0)
                    .arg(&vv.1)
                    .arg(&ov.0)
                    .arg(&ov.1)
                    .arg(&lse);
                push_shape(b, &shape, &c, &scale);
                if let Some(m) = &mask {
                    // (the mask's view of [B, H, T, S], checked by its expansion above)
                    b.arg(&m.0).arg(&m.1);
                }
            })?;
        }
        Pass::Grad { input } => {
            let lse = l
                .saved
                .iter()
                .filter(|(r, _)| matches!(r, Role::Extra(_)))
                .filter_map(|(_, b)| lse_of(b))
                .next_back();
            let (Some((lse, width)), Some(o), Some(gr)) = (
                lse,
                saved(Role::Output).and_then(fview),
                fview(&l.inputs[0]),
            ) else {
                return Ok(false);
            };
            if width < t || l.inputs[0].layout.numel() != bh * t * dv || input > 2 {
                return Ok(false);
            }
            // the tiled kernels read the incoming gradient and the output as [B, H, T, D]
            let four = |b: &Buffer| b.layout.shape.len() == 4;
            if tiled && (!four(&l.inputs[0]) || !saved(Role::Output).is_some_and(four)) {
                return Ok(false);
            }
            let want = [bh * t * d, bh / rep * s * d, bh / rep * s * dv][input];
            if out.layout.numel() != want {
                return Ok(false);
            }
            let (which, ww) = (input as i32, width as i64);
            let cfg = if input == 0 {
                rows(t, bh)
            } else {
                rows(s, bh / rep)
            };
            let f = g.function(bwd)?;
            // every tensor read and written through its view, as in the forward; the logsumexp the forward wrote, bh x width floats
            let shape = [hh, rr, tt, ss, dd, ddv, ww];
            g.run(&f, cfg, |b| {
                b.arg(&which)
                    .arg(&gr.0)
                    .arg(&gr.1)
                    .arg(&qv.0)
                    .arg(&qv.1)
                    .arg(&kv.0)
                    .arg(&kv.1)
                    .arg(&vv.0)
                    .arg(&vv.1)
                    .arg(&o.0)
                    .arg(&o.1)
                    .arg(&lse)
                    .arg(&ov.0)
                    .arg(&ov.1);
                push_shape(b, &shape, &c, &scale);
            })?;
        }
    }
    Ok(true)
}
