//! Running `scaled_dot_product_attention` forward, as PyTorch 2.11 runs it on an H200: which
//! kernel takes the inputs (cuDNN's for bf16/f16, the memory-efficient one for float32, with a
//! bias), the order of its outputs and statistics, the transposed output, and the order in
//! which its node releases what it saved.

use super::dtype::DType;
use super::op::{Op, Role};
use super::tensor::{Category, EngineError, TensorId, Tensors};
use crate::backend::Device;

impl<S: Device> Tensors<S> {
    /// `scaled_dot_product_attention(q, k, v, is_causal=True)` on [B, H, T, D] inputs, as
    /// PyTorch 2.11 runs it on an H200 (the traces in fixtures/models show which kernel):
    /// float32 inputs take the memory-efficient kernel (output, and a logsumexp of
    /// [B, H, T rounded up to 32] float32 kept for backward); bf16/f16 inputs take cuDNN's
    /// (an 8-byte philox seed and offset first, then the output, then a [B, H, T] float32
    /// statistic, and a 256-byte scratch freed at once). Both lay the output out as
    /// [B, T, H, D] in memory, so `out.transpose(1, 2).contiguous()` copies nothing.
    pub fn sdpa(&mut self, q: TensorId, k: TensorId, v: TensorId) -> Result<TensorId, EngineError> {
        self.sdpa_with(q, k, v, false, 0.0, true)
    }

    /// [`Self::sdpa`] with `enable_gqa` (key and value may have fewer heads than the query, a
    /// divisor of its count), `dropout_p`, and causal or not.
    pub fn sdpa_with(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        gqa: bool,
        dropout: f64,
        causal: bool,
    ) -> Result<TensorId, EngineError> {
        self.sdpa_full([q, k, v], None, gqa, dropout, causal)
    }

    /// [`Self::sdpa_with`] with an optional additive float mask (`attn_mask`, in the query's
    /// dtype, broadcast to [B, H, L, S]): the memory-efficient kernel (float32) or cuDNN's
    /// (bf16/f16, taking its 256-byte scratch as with the causal mask for several queries)
    /// takes it as its bias and keeps it for backward, which needs no gradient of it.
    pub fn sdpa_full(
        &mut self,
        [q, k, v]: [TensorId; 3],
        mask: Option<TensorId>,
        gqa: bool,
        dropout: f64,
        causal: bool,
    ) -> Result<TensorId, EngineError> {
        let sq = self.shape(q).to_vec();
        if sq.len() != 4 || self.shape(k).len() != 4 || self.shape(v).len() != 4 {
            return Err(EngineError::Invalid(
                "scaled_dot_product_attention expects [B, H, L, D] tensors".into(),
            ));
        }
        let (sk, sv) = (self.shape(k).to_vec(), self.shape(v).to_vec());
        let (dq, dk, dv) = (self.dtype(q), self.dtype(k), self.dtype(v));
        if dq != dk || dq != dv {
            return Err(EngineError::Invalid(format!(
                "Expected query, key, and value to have the same dtype, but got query.dtype: \
                 {dq} key.dtype: {dk} and value.dtype: {dv} instead."
            )));
        }
        if sq[0] != sk[0] || sq[0] != sv[0] {
            return Err(EngineError::Invalid(format!(
                "scaled_dot_product_attention: query, key and value must have the same batch \
                 size, got {}, {} and {}",
                sq[0], sk[0], sv[0]
            )));
        }
        if sk[2] != sv[2] {
            return Err(EngineError::Invalid(format!(
                "scaled_dot_product_attention: key and value must have the same sequence \
                 length, got {} and {}",
                sk[2], sv[2]
            )));
        }
        if sq[3] != sk[3] {
            return Err(EngineError::Invalid(format!(
                "scaled_dot_product_attention: query and key must have the same head size (last \
                 dimension), got {} and {}",
                sq[3], sk[3]
            )));
        }
        let (hq, hk, hv) = (sq[1], sk[1], sv[1]);
        if hk != hv {
            return Err(EngineError::Invalid(format!(
                "scaled_dot_product_attention: key and value must have the same number of heads, got {hk} and {hv}"
            )));
        }
        if hq != hk && !gqa {
            return Err(EngineError::Invalid(format!(
                "scaled_dot_product_attention: the query has {hq} heads and the key {hk}: pass enable_gqa=true for grouped-query attention"
            )));
        }
        if hq.checked_rem(hk) != Some(0) {
            return Err(EngineError::Invalid(format!(
                "scaled_dot_product_attention with enable_gqa: the query's {hq} heads must be a multiple of the key's {hk}"
            )));
        }
        let (b, h, t, dv) = (sq[0], sq[1], sq[2], self.shape(v)[3]);
        let dtype = self.dtype(q);
        let cudnn = dtype != DType::F32;
        if let Some(m) = mask {
            let s = self.shape(k)[2];
            let ms = self.shape(m).to_vec();
            let fits = crate::engine::op::broadcast(&ms, &[b, h, t, s])
                .is_ok_and(|full| full == [b, h, t, s]);
            if !fits || !self.dtype(m).is_floating() {
                return Err(EngineError::Invalid(format!(
                    "scaled_dot_product_attention: attn_mask must be a float mask broadcastable to [{b}, {h}, {t}, {s}], got {:?} {}",
                    ms,
                    self.dtype(m)
                )));
            }
            if causal || gqa {
                return Err(EngineError::Invalid(
                    "scaled_dot_product_attention with attn_mask is modelled without is_causal or enable_gqa (transformers repeats the keys and values itself when it passes a mask)".into(),
                ));
            }
            if self.dtype(m) != dtype {
                return Err(EngineError::Invalid(format!(
                    "scaled_dot_product_attention: attn_mask is {} and the query {dtype}: PyTorch expects the mask in the query's dtype",
                    self.dtype(m)
                )));
            }
            // the memory-efficient kernel wants every stride but the last a multiple of 8
            // elements; PyTorch pads another mask to the next multiple of 8 keys and slices
            // it back, a copy the script makes itself (`pad_bias` in transformers' models:
            // the padded copy, the unpadded mask dropped before the kernel runs)
            let strides = &self.info(m).layout.strides;
            let aligned = strides[..strides.len().saturating_sub(1)]
                .iter()
                .all(|&st| st % 8 == 0);
            if !cudnn && !aligned {
                return Err(EngineError::Invalid(format!(
                    "scaled_dot_product_attention with attn_mask over {s} keys: the memory-efficient kernel needs the mask's strides a multiple of 8 (PyTorch pads it to the next multiple of 8 keys first); pad it: `p = empty(..., {}, dtype=float32)`, `mask = p[..., :{s}]`",
                    s.div_ceil(8) * 8
                )));
            }
            if self.grad_enabled && self.info(m).requires_grad {
                return Err(EngineError::Invalid(
                    "scaled_dot_product_attention: a gradient of attn_mask is not modelled".into(),
                ));
            }
        }
        // (the seed is drawn only with dropout, so other runs keep their numbering)
        let seed = if dropout > 0.0 { self.next_seed() } else { 0 };
        let op = Op::Sdpa {
            cudnn,
            gqa,
            dropout,
            seed,
            causal,
        };
        let need = self.grad_enabled && [q, k, v].iter().any(|&t| self.info(t).requires_grad);
        let mut extra = Vec::new();
        if cudnn {
            for _ in 0..2 {
                extra.push(self.empty(&[], DType::I64, Category::Temporary)?);
            }
        }
        // the memory-efficient kernel allocates [B, T, H, D], seen as its transpose [B, H, T,
        // D]; cuDNN's takes the query's dimension order (`alloc_with_matching_layout`: a
        // transposed projection gives [B, T, H, D] too, but a query made by a `cat` is
        // contiguous, and so is the output, which `transpose(1, 2).contiguous()` then copies:
        // Phi-3's partial rotary)
        let full = [b, h, t, dv];
        let layout = if cudnn {
            super::layout::dense_in_order(&full, &super::layout::stride_order(&self.info(q).layout))
        } else {
            super::layout::dense_in_order(&full, &[0, 2, 1, 3])
        };
        let out = self.empty(&full, dtype, Category::Temporary)?;
        self.info_mut(out).layout = layout;
        // the float32 logsumexp per query row, only for backward (without it the kernels
        // size it 0: no allocation)
        if need {
            let lse_len = if cudnn { t } else { t.div_ceil(32) * 32 };
            extra.push(self.empty(&[b, h, lse_len], DType::F32, Category::Temporary)?);
        }
        if cudnn {
            let kv_heads = self.shape(k)[1];
            let kv_len = self.shape(k)[2];
            if let Some(bytes) = super::op::attention::cudnn_forward_workspace(
                b,
                h,
                kv_heads,
                t,
                kv_len,
                dv,
                // (several queries take the causal mask's 256 bytes, with a bias or with
                // neither; a decode step's one query none up to 512 keys)
                causal || t > 1,
            ) {
                let scratch = self.empty(&[bytes], DType::U8, Category::Temporary)?;
                self.release(scratch);
            }
        }
        let mut outs = vec![out];
        outs.extend(&extra);
        let ins: Vec<TensorId> = [q, k, v].into_iter().chain(mask).collect();
        self.launch(&op, &ins, &outs)?;
        if !need {
            for e in extra {
                self.release(e);
            }
            return Ok(out);
        }
        let saves = op.saves(ins.len());
        self.record(&op, &ins, &[out], saves);
        let node = self.info(out).grad_fn.expect("recorded");
        // saved in the op's output order: the logsumexp, made last, before cuDNN's philox
        // seed and offset. Inside a checkpoint region each goes as it is saved, where PyTorch
        // drops the outputs it does not return in that order (FSDP2 bf16 with checkpointing,
        // H200); elsewhere the node's own order below decides
        let n = extra.len();
        for k in 0..n {
            let i = if cudnn { (k + n - 1) % n } else { k };
            let e = extra[i];
            self.recategorize(e, Category::Activation);
            self.save_extra(node, e, Role::Extra(i));
        }
        // PyTorch's generated nodes free what they saved by name: attn_bias, key, query,
        // value, then (log)sumexp, output, philox_offset, philox_seed
        let rank = |r: Role| match r {
            Role::Input(3) => 0,
            Role::Input(1) => 1,
            Role::Input(0) => 2,
            Role::Input(_) => 3,
            Role::Extra(2) if cudnn => 4,
            Role::Extra(0) if !cudnn => 4,
            Role::Output => 5,
            Role::Extra(1) => 6,
            _ => 7,
        };
        self.node_mut(node).saved.sort_by_key(|sv| rank(sv.role));
        // (and inside a checkpoint region, what the recompute hands back, in the same order)
        self.node_mut(node).deferred.sort_by_key(|d| rank(d.1));
        Ok(out)
    }
}
