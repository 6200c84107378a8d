//! Attention on the GPU (`kernels/attention.cu`, memory-efficient: the output and one
//! logsumexp per query row, never the probabilities): the forward of
//! `scaled_dot_product_attention` on contiguous float32 [B, H, T, D] q, k, v with as many key
//! heads as query heads, causal or not, without a mask or dropout, and at most 4,096 keys. The
//! twin of `src/backend/cpu/attention.rs`. The backward needs the logsumexp, which the engine
//! keeps but does not hand to the gradient's launch, so it runs on the host twin, as do masks,
//! grouped heads and dropout.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{contiguous_f32, Gpu};
use crate::backend::{Launch, Pass};
use crate::engine::op::Op;

/// `kernels/attention.cu`'s shared row of scores.
const MAX_KEYS: usize = 4096;

/// Runs `l` here if the kernel takes it; `false` where it does not.
pub(super) fn launch(g: &mut Gpu, l: &Launch) -> Result<bool, String> {
    let (
        Op::Sdpa {
            dropout, causal, ..
        },
        Pass::Forward,
    ) = (l.op, l.pass)
    else {
        return Ok(false);
    };
    if *dropout > 0.0 || l.inputs.len() != 3 {
        return Ok(false);
    }
    let bufs: Option<Vec<u64>> = l.inputs.iter().map(contiguous_f32).collect();
    let (Some(bufs), Some(o)) = (bufs, l.outputs.first().and_then(contiguous_f32)) else {
        return Ok(false);
    };
    // the logsumexp: the last output, [B, H, width]
    let Some(lse_buf) = l.outputs[1..].last().filter(|b| b.layout.shape.len() == 3) else {
        return Ok(false);
    };
    let Some(lse) = contiguous_f32(lse_buf) else {
        return Ok(false);
    };
    let (qs, ks, vs) = (
        &l.inputs[0].layout.shape,
        &l.inputs[1].layout.shape,
        &l.inputs[2].layout.shape,
    );
    if qs.len() != 4 || ks.len() != 4 || vs.len() != 4 || qs[..2] != ks[..2] || ks[..3] != vs[..3] {
        return Ok(false);
    }
    let (bh, t, s, d, dv) = (qs[0] * qs[1], qs[2], ks[2], qs[3], vs[3]);
    let width = lse_buf.layout.shape[2];
    if ks[3] != d || s == 0 || s > MAX_KEYS || t == 0 || width < t || bh > 65_535 {
        return Ok(false);
    }
    if l.outputs[0].layout.numel() != bh * t * dv || lse_buf.layout.numel() != bh * width {
        return Ok(false);
    }
    let cfg = LaunchConfig {
        grid_dim: (t.min(1 << 30) as u32, bh as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let (tt, ss, dd, ddv, ww, c) = (
        t as i64,
        s as i64,
        d as i64,
        dv as i64,
        width as i64,
        *causal as i32,
    );
    let scale = 1.0 / (d as f32).sqrt();
    if width > t {
        // the padding past the rows: zeros, as the cpu twin writes
        // SAFETY: the logsumexp buffer holds bh x width floats
        unsafe {
            cudarc::driver::result::memset_d8_async(lse, 0, bh * width * 4, g.stream.cu_stream())
        }
        .map_err(|e| format!("attention: {e:?}"))?;
    }
    let f = g.function("attention")?;
    // SAFETY: q [bh, t, d], k [bh, s, d], v [bh, s, dv] and the output [bh, t, dv] are
    // contiguous floats, the logsumexp bh x width; s keys fit the kernel's shared row
    unsafe {
        g.stream
            .launch_builder(&f)
            .arg(&bufs[0])
            .arg(&bufs[1])
            .arg(&bufs[2])
            .arg(&o)
            .arg(&lse)
            .arg(&tt)
            .arg(&ss)
            .arg(&dd)
            .arg(&ddv)
            .arg(&ww)
            .arg(&c)
            .arg(&scale)
            .launch(cfg)
    }
    .map_err(|e| format!("attention: {e:?}"))?;
    Ok(true)
}
