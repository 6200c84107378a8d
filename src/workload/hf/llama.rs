//! `LlamaForCausalLM` (transformers 5.17; `Qwen2ForCausalLM`, `MistralForCausalLM`,
//! `Qwen3ForCausalLM`, `GemmaForCausalLM`, `Gemma2ForCausalLM`, `Gemma3ForCausalLM`,
//! `Phi3ForCausalLM`, `MixtralForCausalLM` and `Qwen3MoeForCausalLM` with their differences,
//! below) as line-language statements: the setup ([`super::llama_setup`]: the parameters,
//! buffers, adapters, wrappers and optimizer), and the training loop of hf_models.py, op for
//! op as the H200 traces show transformers running it (under FSDP2, each decoder layer
//! between its `fsdp_pre_forward` and `fsdp_post_forward`):
//!
//! - `LlamaModel`: the embedding; `cache_position` (an `arange` plus the cache's length) and
//!   `position_ids` from it; no causal mask (sdpa without padding takes `is_causal`); the
//!   rotary cos and sin (no grad, float32: the frequencies' product, `cat((f, f))`, `cos()`
//!   and `sin()` times the attention scaling); a `DynamicCache`, which in training too keeps
//!   every layer's keys and values (`torch.cat` into the cache) until the output is dropped.
//! - Each decoder layer: RMSNorm as transformers writes it (`pow(2).mean(-1, keepdim)`,
//!   `x * rsqrt(v + eps)`, `weight * x`), the projections, `apply_rotary_pos_emb` with
//!   `rotate_half`'s `cat((-x2, x1))`, the cache update, attention, `o_proj`, the residual,
//!   the SwiGLU MLP.
//! - Attention: with fewer key/value heads than query heads in float32, PyTorch's SDPA runs
//!   its math path (`enable_gqa`: no fused kernel takes it): q and k each scaled by the square
//!   root of the scale, the causal mask built (`ones(T, T).tril()`, then `where` of two
//!   0-dim scalars), k and v repeated per group, the product, the mask added in place,
//!   `_safe_softmax`, the product with v. Under bf16 autocast, cuDNN's kernel with
//!   `enable_gqa`; with as many key/value heads as query heads, the memory-efficient kernel.
//! - bf16 autocast: the embedding and the decoder in autocast, the rotary embedding outside it;
//!   `logits.float()` in the loss.
//! - The loss: `ForCausalLMLoss`: the logits as float32, the labels padded by one and shifted
//!   (`pad`, a slice made contiguous), then `cross_entropy` over the flattened logits.
//! - `mode = "inference"`: the forward under `no_grad`, without labels or loss.
//! - Mistral's sliding window, from as many tokens as the window: the bool mask of
//!   `create_sliding_window_causal_mask`, `repeat_kv` of k and v, and SDPA's float bias
//!   (`where(mask, 0.0, -inf)`) per layer, which the memory-efficient kernel keeps; each cache
//!   layer's int64 length.
//!
//! - Qwen3: `q_norm`/`k_norm` over each head of the viewed queries and keys, then transposed.
//! - Gemma: the embedding times its `embed_scale` buffer; `GemmaRMSNorm` as one expression
//!   (`x * rsqrt(x.pow(2).mean(-1) + eps)`, then `* (1 + weight)`), its temporaries freed at
//!   once; the GeGLU MLP. Gemma-2 and Gemma-3 add norms after the attention and around the MLP,
//!   per-layer sliding windows (both masks made: the full one and the sliding one), Gemma-2's
//!   soft-capped scores (eager) and logits, Gemma-3's norms of the transposed heads and a
//!   rotary pair per layer type.
//! - Phi-3: one `qkv_proj` sliced (the three slices, then their views), the rotated part
//!   (`x[..., :rotary_dim]`, the whole head: PyTorch's `alias`) concatenated with the empty
//!   rest, and `gate_up_proj` chunked in two.
//! - LongRoPE: each rotary forward first compares the largest position with the original
//!   context (`dynamic_rope_update`).
//! - Mixtral and Qwen3-MoE (`MixtralForCausalLM`, `Qwen3MoeForCausalLM`): Mistral's and
//!   Qwen3's attention, and on their sparse layers the router and the `grouped_mm` experts
//!   ([`super::moe`]).
//!
//! Locals die where Python's do: a function's at its return, in the order it named them.

use std::fmt::Write as _;

use super::masks::{
    eager_mask, full_mask, packed_sequences, sliding_mask, sliding_mask_window, window,
};
use super::norms::rms_norm;
use super::{LlamaConfig, Run};
use crate::workload::preset::at;

/// One call of the model: `t` query tokens per row, and what each layer's cache does.
#[derive(Debug, Clone, Copy)]
pub(super) struct Call {
    pub t: u64,
    pub cache: Cache,
    /// A decode step past the sliding window: the sliding layers attend through the 4-D
    /// `sliding_mask` the forward made (transformers then repeats the keys and values itself).
    pub window: bool,
}

/// A layer's `DynamicCache` entry in one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cache {
    /// No cache (gradient checkpointing turns it off in training).
    Off,
    /// A new cache: `torch.cat` of the keys and values onto empty buffers.
    Fill,
    /// A decode step: `torch.cat` of the cache and the new keys and values; the old cache goes.
    Append,
}

impl Call {
    /// SDPA's `is_causal`: transformers passes it for more than one query and no mask.
    fn causal(self) -> bool {
        self.t > 1
    }
}

/// The setup and body scripts.
pub(super) fn expand(c: &LlamaConfig, r: &Run) -> (String, String) {
    let s = super::llama_setup::setup(c, r);
    let fwd = |s: &mut String, ind: &str| forward(s, c, r, ind);
    // `output_router_logits`: the output holds each sparse layer's router logits
    let router_logits: Vec<String> = match c.moe.as_ref().filter(|m| m.aux_loss) {
        Some(m) if r.mode == "train" => (0..m.sparse.len())
            .filter(|&l| m.sparse[l])
            .map(|l| format!("rlog{l}"))
            .collect(),
        _ => Vec::new(),
    };
    (
        s,
        super::train::body(
            if r.checkpointing { 0 } else { c.layers },
            &c.sliding_layers,
            r,
            super::train::CLONED_LABELS,
            &fwd,
            &router_logits,
        ),
    )
}

/// `LlamaModel.forward` then `lm_head` (and the loss, in training), leaving `logits` (and each
/// layer's cache `kc`, `vc`). Under bf16 autocast the rotary embedding runs outside it (its own
/// `autocast(enabled=False)`), the rest inside.
fn forward(s: &mut String, c: &LlamaConfig, r: &Run, ind: &str) {
    let open = |s: &mut String| {
        if r.bf16_autocast {
            let _ = writeln!(s, "{ind}autocast(dtype=bf16) {{");
        }
    };
    let close = |s: &mut String| {
        if r.bf16_autocast {
            let _ = writeln!(s, "{ind}}}");
        }
    };
    let inner = if r.bf16_autocast {
        format!("{ind}  ")
    } else {
        ind.to_string()
    };
    open(s);
    prelude(s, c, r, &inner);
    close(s);
    for suffix in rope_kinds(c) {
        rotary_named(s, c, r.bf16_weights, 1, ind, suffix);
    }
    open(s);
    let call = Call {
        t: r.seq,
        cache: if r.checkpointing {
            Cache::Off
        } else {
            Cache::Fill
        },
        window: false,
    };
    decoder(s, c, r, call, &inner);
    // LlamaModel.forward's locals as the H200 traces free them; last the rotary pair, a tuple
    // whose items CPython drops from the end
    let mut masks = Vec::new();
    if full_mask(c, r) {
        masks.push("causal_mask");
    }
    if sliding_mask_window(c, r.seq, r.eager).is_some() {
        masks.push("sliding_mask");
    }
    let pairs: Vec<String> = rope_kinds(c)
        .iter()
        .map(|k| format!("sin{k}, cos{k}"))
        .collect();
    if c.sandwich {
        // Gemma-2's and Gemma-3's forward: the mask mapping, then `mask_kwargs` (which holds
        // the embeddings and the positions), then the rotary pairs
        masks.extend(["inputs_embeds", "cache_position", "position_ids"]);
        let _ = writeln!(s, "{inner}del {}, {}", masks.join(", "), pairs.join(", "));
    } else {
        let mut all = vec!["position_ids", "cache_position", "inputs_embeds"];
        all.extend(masks);
        let _ = writeln!(s, "{inner}del {}, {}", all.join(", "), pairs.join(", "));
    }
    at(s, &inner, "lm_head", "logits = linear(h, lm_head)");
    final_softcap(s, c, &inner);
    if r.mode == "train" {
        super::train::causal_lm_loss(s, c.vocab, r, &inner);
        if let Some(moe) = c.moe.as_ref().filter(|m| m.aux_loss) {
            super::moe::aux_loss(s, moe, r.batch * r.seq, moe.aux_coef, &inner);
        }
    }
    // LlamaForCausalLM.forward's `outputs` (the final hidden states) goes at its return
    let _ = writeln!(s, "{inner}del h");
    close(s);
}

/// The embedding and the positions.
fn prelude(s: &mut String, c: &LlamaConfig, r: &Run, ind: &str) {
    let t = r.seq;
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    embed(s, c, "input_ids", ind);
    line(s, "h = inputs_embeds");
    line(s, &format!("cp0 = arange({t})"));
    line(s, "cache_position = cp0 + 0");
    line(s, "del cp0");
    line(s, "position_ids = cache_position.unsqueeze(0)");
    if r.checkpointing {
        packed_sequences(s, r, ind);
    }
    if full_mask(c, r) {
        eager_mask(s, r, "model.create_causal_mask", ind);
    }
    if let Some(w) = sliding_mask_window(c, r.seq, r.eager) {
        sliding_mask(s, r, w, ind);
    }
}

/// `inputs_embeds` from the token ids `ids`: the embedding, which Gemma scales by its
/// `embed_scale` buffer (`super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)`).
pub(super) fn embed(s: &mut String, c: &LlamaConfig, ids: &str, ind: &str) {
    if c.gemma {
        for st in [
            format!("e_raw = embedding({ids}, embed)"),
            "inputs_embeds = e_raw * embed_scale".to_string(),
            "del e_raw".to_string(),
        ] {
            at(s, ind, "model.embed_tokens", &st);
        }
    } else {
        at(
            s,
            ind,
            "model.embed_tokens",
            &format!("inputs_embeds = embedding({ids}, embed)"),
        );
    }
}

/// Gemma-2's and Gemma-3's `final_logit_softcapping`: `logits = tanh(logits / cap) * cap`.
pub(super) fn final_softcap(s: &mut String, c: &LlamaConfig, ind: &str) {
    if let Some(cap) = c.final_softcap {
        for st in [
            format!("fl0 = logits / {cap:?}"),
            "del logits".to_string(),
            "fl1 = fl0.tanh()".to_string(),
            "del fl0".to_string(),
            format!("logits = fl1 * {cap:?}"),
            "del fl1".to_string(),
        ] {
            let _ = writeln!(s, "{ind}{st}");
        }
    }
}

/// The rotary pairs the forward computes, by variable suffix: one (`cos`, `sin`), or with
/// Gemma-3's per-type embedding one per layer type present, in the order of the layers
/// (`_l` the local, sliding one).
pub(super) fn rope_kinds(c: &LlamaConfig) -> Vec<&'static str> {
    if !c.per_type_rope {
        return vec![""];
    }
    let mut v = Vec::new();
    for &sl in &c.sliding_layers {
        let k = if sl { "_l" } else { "" };
        if !v.contains(&k) {
            v.push(k);
        }
    }
    v
}

/// The rotary pair layer `l` takes.
fn rope_of(c: &LlamaConfig, l: u64) -> &'static str {
    if c.per_type_rope && c.sliding_layers.get(l as usize).copied().unwrap_or(false) {
        "_l"
    } else {
        ""
    }
}

/// The rotary embedding's cos and sin for `position_ids` of `rows` rows: no grad, autocast
/// off, computed in float32 (from a float32 copy of bf16 frequencies) and returned in the
/// hidden states' dtype, as `cos{k}` and `sin{k}`.
pub(super) fn rotary_named(
    s: &mut String,
    c: &LlamaConfig,
    bf16: bool,
    rows: u64,
    ind: &str,
    k: &str,
) {
    let _ = writeln!(s, "{ind}scope \"model.rotary_emb\" {{");
    let _ = writeln!(s, "{ind}  no_grad {{");
    if let Some(orig) = c.longrope {
        // dynamic_rope_update's longrope_frequency_update: `seq_len = torch.max(position_ids)
        // + 1`, compared with the original context (the short factors: no new frequencies)
        for st in [
            "rl0 = position_ids.max()".to_string(),
            "rl1 = rl0 + 1".to_string(),
            "del rl0".to_string(),
            format!("rl2 = rl1.gt({orig})"),
            "del rl2".to_string(),
            "del rl1".to_string(),
        ] {
            let _ = writeln!(s, "{ind}    {st}");
        }
    }
    let i2 = format!("{ind}    ");
    // (a bf16 buffer's float32 copy: expanded to the rows first in llama, after in qwen2)
    let expanded = if c.qwen2 {
        format!("inv_freq_expanded = inv_freq[none, :, none].float().expand({rows}, -1, 1)")
    } else {
        format!("inv_freq_expanded = inv_freq[none, :, none].expand({rows}, -1, 1).float()")
    };
    let mut stmts = vec![
        expanded.as_str(),
        "position_ids_expanded = position_ids[:, none, :].float()",
        "freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)",
        "emb = cat([freqs, freqs], -1)",
        "c0 = emb.cos()",
        "c1 = c0 * 1.0",
        "del c0",
        "s0 = emb.sin()",
        "s1 = s0 * 1.0",
        "del s0",
    ];
    let (cos, sin) = (format!("cos{k} = c1"), format!("sin{k} = s1"));
    let (cos16, sin16) = (
        format!("cos{k} = c1.bfloat16()"),
        format!("sin{k} = s1.bfloat16()"),
    );
    if bf16 {
        // `cos.to(dtype=x.dtype)`: the float32 pair goes at the function's return
        stmts.extend([
            cos16.as_str(),
            sin16.as_str(),
            "del inv_freq_expanded, position_ids_expanded, freqs, emb, c1, s1",
        ]);
    } else {
        stmts.extend([
            cos.as_str(),
            sin.as_str(),
            "del c1, s1, inv_freq_expanded, position_ids_expanded, freqs, emb",
        ]);
    }
    for stmt in stmts {
        let _ = writeln!(s, "{i2}{stmt}");
    }
    let _ = writeln!(s, "{ind}  }}");
    let _ = writeln!(s, "{ind}}}");
}

/// The decoder layers and the final norm, leaving `h`.
pub(super) fn decoder(s: &mut String, c: &LlamaConfig, r: &Run, call: Call, ind: &str) {
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    for l in 0..c.layers {
        if call.cache == Cache::Off {
            // GradientCheckpointingLayer: torch.utils.checkpoint(use_reentrant=False), holding
            // the layer's arguments (the rotary pair, the positions, its input, freed in that
            // order) until its backward. The input matters where no op of the layer saves it:
            // an RMSNorm over bf16 (weights, or FSDP2's bf16 parameters) casts it to float32
            // first
            let k = rope_of(c, l);
            let _ = writeln!(s, "{ind}checkpoint(sin{k}, cos{k}, cache_position, h) {{");
            if r.fsdp.is_some() && r.mode == "train" {
                // FSDP2's hooks are inside: the checkpoint wraps the module's `__call__`
                let i2 = format!("{ind}  ");
                let _ = writeln!(s, "{i2}h_caller = h");
                let _ = writeln!(s, "{i2}h = fsdp_pre_forward({l}, h)");
                layer(s, c, r, call, l, &i2);
                let _ = writeln!(s, "{i2}fsdp_post_forward({l}, h)");
                let _ = writeln!(s, "{i2}del h_caller");
            } else {
                layer(s, c, r, call, l, &format!("{ind}  "));
            }
            let _ = writeln!(s, "{ind}}}");
        } else if r.fsdp.is_some() && r.mode == "train" {
            // FSDP2's hooks around the layer: unshard (the input through the post-backward
            // hook), then reshard
            // (the decoder loop's own name for the input holds it until the layer's call,
            // hooks included, returns)
            line(s, "h_caller = h");
            line(s, &format!("h = fsdp_pre_forward({l}, h)"));
            layer(s, c, r, call, l, ind);
            line(s, &format!("fsdp_post_forward({l}, h)"));
            line(s, "del h_caller");
        } else {
            layer(s, c, r, call, l, ind);
        }
    }
    // `hidden_states = self.norm(hidden_states)`: the input goes once the norm has returned
    rms_norm(s, c, r, "model.norm", "norm", "h", "hf", ind);
    line(s, "h = hf");
    line(s, "del hf");
}

/// One `LlamaDecoderLayer`: `h` to `h`; keeps the layer's cache in `kc{l}`, `vc{l}`.
fn layer(s: &mut String, c: &LlamaConfig, r: &Run, call: Call, l: u64, ind: &str) {
    let (b, t) = (r.batch, call.t);
    let (nh, nkv, hd) = (c.heads, c.kv_heads, c.head_dim);
    let m = |x: &str| format!("model.layers.{l}.{x}");
    let p = |x: &str| format!("l{l}_{x}");
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    let lin = |s: &mut String, name: &str, path: &str, input: &str, out: &str| {
        let has = match name {
            "gate" | "up" | "down" => c.mlp_bias,
            "o" => c.o_bias,
            _ => c.qkv_bias,
        };
        let bias = if has {
            format!(", {}", p(&format!("{name}_b")))
        } else {
            String::new()
        };
        let Some(l) = super::train::lora_for(r, path) else {
            at(
                s,
                ind,
                &m(path),
                &format!("{out} = linear({input}, {}{bias})", p(&format!("{name}_w"))),
            );
            return;
        };
        // peft's Linear.forward: the base layer, then
        // `result + lora_B(lora_A(dropout(x))) * scaling`
        let rhs = format!("linear({input}, {}{bias})", p(&format!("{name}_w")));
        let (la, lb) = (p(&format!("{name}_la")), p(&format!("{name}_lb")));
        super::train::lora_linear(s, ind, &m(path), &rhs, input, (&la, &lb), (l, r), out);
    };
    // the model's loop holds the layer's input until the layer returns
    line(s, "h_in = h");
    line(s, "residual = h");
    rms_norm(s, c, r, &m("input_layernorm"), &p("ln1"), "h", "x", ind);
    // self_attn
    let attn = m("self_attn");
    if c.phi3 {
        // Phi3Attention: one product, sliced into the queries, keys and values
        lin(s, "qkv", "self_attn.qkv_proj", "x", "qkv");
        // (the three slices first, then each one's view and transpose)
        let (qn, kn) = (nh * hd, nkv * hd);
        let parts = [
            ("q0", format!(":{qn}"), nh),
            ("k0", format!("{qn}:{}", qn + kn), nkv),
            ("v0", format!("{}:", qn + kn), nkv),
        ];
        for (v, range, _) in &parts {
            at(s, ind, &attn, &format!("{v} = qkv[..., {range}]"));
        }
        for (v, _, heads) in &parts {
            at(
                s,
                ind,
                &attn,
                &format!("{v} = {v}.view({b}, {t}, {heads}, {hd}).transpose(1, 2)"),
            );
        }
    }
    for (name, v, heads) in [("q", "q0", nh), ("k", "k0", nkv), ("v", "v0", nkv)] {
        if c.phi3 {
            break;
        }
        lin(s, name, &format!("self_attn.{name}_proj"), "x", v);
        if c.qk_norm && !c.gemma && name != "v" {
            // Qwen3: `q_norm(q_proj(x).view(hidden_shape)).transpose(1, 2)`
            at(
                s,
                ind,
                &attn,
                &format!("{v} = {v}.view({b}, {t}, {heads}, {hd})"),
            );
            let norm = format!("{attn}.{name}_norm");
            rms_norm(s, c, r, &norm, &p(&format!("{name}n")), v, "qkn", ind);
            line(s, &format!("del {v}"));
            at(s, ind, &attn, &format!("{v} = qkn.transpose(1, 2)"));
            line(s, "del qkn");
            continue;
        }
        at(
            s,
            ind,
            &attn,
            &format!("{v} = {v}.view({b}, {t}, {heads}, {hd}).transpose(1, 2)"),
        );
    }
    let half = hd / 2;
    let rk = rope_of(c, l);
    if c.qk_norm && c.gemma {
        // Gemma-3: `q_norm` and `k_norm` of the transposed queries and keys, after all three
        // products
        for name in ["q", "k"] {
            let v = format!("{name}0");
            let norm = format!("{attn}.{name}_norm");
            rms_norm(s, c, r, &norm, &p(&format!("{name}n")), &v, "qkn", ind);
            line(s, &format!("{v} = qkn"));
            line(s, "del qkn");
        }
    }
    if c.phi3 {
        // Phi-3 rotates `x[..., :rotary_dim]` and concatenates the rest (none) after it; the
        // four slices are taken first
        for x in ["q", "k"] {
            at(s, ind, &attn, &format!("{x}r = {x}0[..., :{hd}]"));
            at(s, ind, &attn, &format!("{x}p = {x}0[..., {hd}:]"));
        }
    }
    for (x0, out0) in [("q0", "q1"), ("k0", "k1")] {
        let (x, out) = if c.phi3 {
            (if x0 == "q0" { "qr" } else { "kr" }, "xe")
        } else {
            (x0, out0)
        };
        for st in [
            format!("e0 = {x} * cos{rk}.unsqueeze(1)"),
            format!("x1 = {x}[..., :{half}]"),
            format!("x2 = {x}[..., {half}:]"),
            "e1 = x2.neg()".to_string(),
            "e2 = cat([e1, x1], -1)".to_string(),
            "del e1, x1, x2".to_string(),
            format!("e3 = e2 * sin{rk}.unsqueeze(1)"),
            "del e2".to_string(),
            format!("{out} = e0 + e3"),
            "del e0, e3".to_string(),
        ] {
            at(s, ind, &attn, &st);
        }
        if c.phi3 {
            let p = &x0[..1];
            at(s, ind, &attn, &format!("{out0} = cat([xe, {p}p], -1)"));
            line(s, &format!("del xe, {p}r, {p}p"));
        }
    }
    line(s, "del q0, k0");
    // past_key_values.update: `torch.cat` onto the layer's empty buffers, which take the keys'
    // dtype (float32 under autocast, where the rotary product promoted them)
    // (float32 in float32 and under bf16 autocast; bf16 with bf16 weights)
    let kd = if r.bf16_weights { "bf16" } else { "float32" };
    // the keys and values attention takes (the rotated ones, or the cache's), and whether
    // they are a sliding layer's full states, which go once it has attended
    // DynamicSlidingWindowLayer.update onto the cache's keys and values `(pk, pv)` (or the
    // empty buffer):
    // both full states for attention, then the cache keeps their last `sliding_window - 1`
    // positions (views)
    let keep = c.sliding_window.unwrap_or(1).saturating_sub(1);
    let sliding_update = |s: &mut String, (pk, pv): (&str, &str), ind: &str| {
        for st in [
            format!("kf{l} = cat([{pk}, k1], -2)"),
            format!("vf{l} = cat([{pv}, v0], -2)"),
            format!("kv_cache(kf{l}, vf{l})"),
            format!("kc{l} = kf{l}[:, :, -{keep}:, :]"),
            format!("vc{l} = vf{l}[:, :, -{keep}:, :]"),
        ] {
            at(s, ind, &attn, &st);
        }
    };
    let (keys, values, full_states) = match call.cache {
        // no cache: the rotated keys and the values go to attention as they are
        Cache::Off => ("k1".to_string(), "v0".to_string(), false),
        Cache::Fill if sliding_layer(c, l) => {
            // DynamicSlidingWindowLayer: its lazy initialization (its length, an int64
            // scalar, and the empty buffers), then `update` as in a decode step (all the
            // prompt's positions kept below the window)
            at(
                s,
                ind,
                &attn,
                &format!("cl{l} = full([], fill_value=0, dtype=int64)"),
            );
            at(s, ind, &attn, &format!("ce = empty(0, dtype={kd})"));
            sliding_update(s, ("ce", "ce"), ind);
            line(s, "del ce");
            line(s, "del k1, v0");
            (format!("kf{l}"), format!("vf{l}"), true)
        }
        Cache::Fill => {
            at(s, ind, &attn, &format!("ce = empty(0, dtype={kd})"));
            at(s, ind, &attn, &format!("kc{l} = cat([ce, k1], -2)"));
            at(s, ind, &attn, &format!("vc{l} = cat([ce, v0], -2)"));
            at(s, ind, &attn, &format!("kv_cache(kc{l}, vc{l})"));
            line(s, "del ce");
            line(s, "del k1, v0");
            (format!("kc{l}"), format!("vc{l}"), false)
        }
        Cache::Append if sliding_layer(c, l) => {
            // DynamicSlidingWindowLayer.update, the old views going
            sliding_update(s, (&format!("kc{l}"), &format!("vc{l}")), ind);
            line(s, "del k1, v0");
            (format!("kf{l}"), format!("vf{l}"), true)
        }
        Cache::Append => {
            // DynamicLayer.update: the grown cache replaces the old one, which goes at once
            at(s, ind, &attn, &format!("kc{l} = cat([kc{l}, k1], -2)"));
            at(s, ind, &attn, &format!("vc{l} = cat([vc{l}, v0], -2)"));
            at(s, ind, &attn, &format!("kv_cache(kc{l}, vc{l})"));
            line(s, "del k1, v0");
            (format!("kc{l}"), format!("vc{l}"), false)
        }
    };
    attention(s, c, r, call, l, &attn, &keys, &values, ind);
    if full_states {
        // (the cache's views hold their storage)
        line(s, &format!("del {keys}, {values}"));
    }
    line(s, &format!("y = y.view({b}, {t}, {})", nh * hd));
    lin(s, "o", "self_attn.o_proj", "y", "a");
    // `attn_output = o_proj(attn_output)`, self_attn's locals, then the layer's `hidden_states`
    line(s, "del y");
    if c.phi3 {
        // the attention's fused product goes first when the attention returns (its first local)
        line(s, "del qkv");
    }
    line(
        s,
        if call.cache == Cache::Off {
            "del q1, k1, v0, x"
        } else {
            "del q1, x"
        },
    );
    let block = format!("model.layers.{l}");
    if c.sandwich {
        // Gemma-2 and Gemma-3 normalize the attention's output before the residual sum, and
        // the MLP's input with its own norm
        rms_norm(
            s,
            c,
            r,
            &m("post_attention_layernorm"),
            &p("ln2"),
            "a",
            "an",
            ind,
        );
        line(s, "del a");
        at(s, ind, &block, "h = residual + an");
        line(s, "del an");
        line(s, "residual = h");
        rms_norm(
            s,
            c,
            r,
            &m("pre_feedforward_layernorm"),
            &p("ln3"),
            "h",
            "x",
            ind,
        );
    } else {
        at(s, ind, &block, "h = residual + a");
        line(s, "del a");
        line(s, "residual = h");
        rms_norm(
            s,
            c,
            r,
            &m("post_attention_layernorm"),
            &p("ln2"),
            "h",
            "x",
            ind,
        );
    }
    if let Some(moe) = c.moe.as_ref().filter(|moe| moe.sparse[l as usize]) {
        let decode = call.cache == Cache::Append;
        super::moe::sparse_moe(s, c, moe, (b, t), l, (r.bf16_weights, decode), ind);
        at(s, ind, &block, "h = residual + d0");
        line(s, "del d0, residual, h_in");
        return;
    }
    if c.phi3 {
        // Phi3MLP: `gate, up = gate_up_proj(x).chunk(2, -1)`, `up * act(gate)`, down_proj
        lin(s, "gate_up", "mlp.gate_up_proj", "x", "gu");
        at(s, ind, &m("mlp"), "g0, u0 = gu.chunk(2, dim=-1)");
        at(s, ind, &m("mlp.activation_fn"), "g1 = g0.silu()");
        at(s, ind, &m("mlp"), "g2 = u0 * g1");
        line(s, "del g1, g0, u0");
        lin(s, "down", "mlp.down_proj", "g2", "d0");
        line(s, "del g2, gu, x");
        at(s, ind, &block, "h = residual + d0");
        line(s, "del d0, residual, h_in");
        return;
    }
    lin(s, "gate", "mlp.gate_proj", "x", "g0");
    at(
        s,
        ind,
        &m("mlp.act_fn"),
        if c.gemma {
            "g1 = g0.gelu()"
        } else {
            "g1 = g0.silu()"
        },
    );
    line(s, "del g0");
    lin(s, "up", "mlp.up_proj", "x", "u0");
    at(s, ind, &m("mlp"), "g2 = g1 * u0");
    line(s, "del g1, u0");
    lin(s, "down", "mlp.down_proj", "g2", "d0");
    line(s, "del g2, x");
    if c.sandwich {
        rms_norm(
            s,
            c,
            r,
            &m("post_feedforward_layernorm"),
            &p("ln4"),
            "d0",
            "dn",
            ind,
        );
        line(s, "del d0");
        at(s, ind, &block, "h = residual + dn");
        line(s, "del dn, residual, h_in");
        return;
    }
    at(s, ind, &block, "h = residual + d0");
    line(s, "del d0, residual, h_in");
}

/// Whether layer `l` attends through a sliding window (its cache a
/// `DynamicSlidingWindowLayer`).
pub(super) fn sliding_layer(c: &LlamaConfig, l: u64) -> bool {
    c.sliding_window.is_some() && c.sliding_layers.get(l as usize).copied().unwrap_or(false)
}

/// Whether any layer attends through a sliding window.
pub(super) fn any_sliding(c: &LlamaConfig) -> bool {
    (0..c.layers).any(|l| sliding_layer(c, l))
}

/// `sdpa_attention_forward` of `q1` against keys `k` and values `v` (the cache's): `y`, the
/// output as [B, T, H, D] made contiguous.
#[allow(clippy::too_many_arguments)]
fn attention(
    s: &mut String,
    c: &LlamaConfig,
    r: &Run,
    call: Call,
    l: u64,
    path: &str,
    k: &str,
    v: &str,
    ind: &str,
) {
    let (b, t) = (r.batch, call.t);
    let causal = call.causal();
    let (nh, nkv, hd) = (c.heads, c.kv_heads, c.head_dim);
    let rep = nh / nkv;
    let mut st: Vec<String> = Vec::new();
    // (a decode step past the window attends to the window's keys)
    let masked_decode = call.window && sliding_layer(c, l) && call.cache == Cache::Append;
    let kv = if masked_decode {
        c.sliding_window.unwrap_or(t)
    } else {
        t
    };
    // repeat_kv (the keys' length left to the tensor: a decode step's are the whole cache)
    let rk = |x: &str| {
        if rep > 1 {
            format!(
                "{x}.unsqueeze(2).expand({b}, {nkv}, {rep}, -1, {hd}).reshape({b}, {nh}, -1, {hd})"
            )
        } else {
            x.to_string()
        }
    };
    // the mask this layer's eager attention adds
    let mask = if window(c, l, t, r.eager).is_some() {
        "sliding_mask"
    } else {
        "causal_mask"
    };
    if !r.eager
        && (masked_decode || (window(c, l, t, false).is_some() && call.cache != Cache::Append))
    {
        // a mask for sdpa: transformers repeats k and v itself (no enable_gqa with a mask),
        // and SDPA turns the bool mask into one of the query's dtype, `where(mask, 0.0, -inf)`
        // over two scalars, which the kernel (memory-efficient for float32, cuDNN's for bf16)
        // keeps as its bias
        let qd = if r.bf16_weights { "bf16" } else { "float32" };
        st.extend([
            format!("ak = {}", rk(k)),
            format!("av = {}", rk(v)),
            format!("fz = zeros([], dtype={qd})"),
            format!("fi = full([], fill_value=-inf, dtype={qd})"),
            "fm = where(sliding_mask, fz, fi)".to_string(),
            "del fi, fz".to_string(),
        ]);
        if !r.bf16_weights && !kv.is_multiple_of(8) {
            // the memory-efficient kernel's `pad_bias`: the mask padded to the next multiple
            // of 8 keys and sliced back; the unpadded one goes before the kernel runs
            let tq = if masked_decode { 1 } else { t };
            st.extend([
                format!(
                    "fp0 = empty({b}, 1, {tq}, {}, dtype=float32)",
                    kv.div_ceil(8) * 8
                ),
                format!("fp = fp0[:, :, :, :{kv}]"),
                "del fm".to_string(),
                "y0 = scaled_dot_product_attention(q1, ak, av, is_causal=false, attn_mask=fp)"
                    .to_string(),
                "del fp, fp0, ak, av".to_string(),
            ]);
        } else {
            st.extend([
                "y0 = scaled_dot_product_attention(q1, ak, av, is_causal=false, attn_mask=fm)"
                    .to_string(),
                "del fm, ak, av".to_string(),
            ]);
        }
    } else if r.eager {
        // eager_attention_forward: repeat_kv, the scaled product, the mask, softmax, the product
        let scale = 1.0 / (hd as f64).sqrt();
        st.extend([
            format!("ak = {}", rk(k)),
            format!("av = {}", rk(v)),
            "att0 = q1 @ ak.transpose(2, 3)".to_string(),
            format!("att1 = att0 * {scale:?}"),
            "del att0".to_string(),
        ]);
        if let Some(cap) = c.attn_softcap {
            // Gemma-2's soft-capping: `tanh(scores / cap) * cap`
            st.extend([
                format!("atc0 = att1 / {cap:?}"),
                "del att1".to_string(),
                "atc1 = atc0.tanh()".to_string(),
                "del atc0".to_string(),
                format!("att1 = atc1 * {cap:?}"),
                "del atc1".to_string(),
            ]);
        }
        st.extend([format!("att2 = att1 + {mask}"), "del att1".to_string()]);
        if r.bf16_weights {
            // `softmax(x, dim=-1, dtype=torch.float32).to(query.dtype)`: a bf16 input is
            // converted first (the copy goes when softmax returns; its float32 output is
            // what softmax saves), then cast back
            st.extend([
                "attf0 = att2.float()".to_string(),
                "attf = softmax(attf0, -1)".to_string(),
                "del attf0".to_string(),
                "att = attf.bfloat16()".to_string(),
                "del att2, attf".to_string(),
            ]);
        } else {
            st.extend([
                "att = softmax(att2, -1)".to_string(),
                "del att2".to_string(),
            ]);
        }
        st.extend(["y0 = att @ av".to_string(), "del ak, av, att".to_string()]);
    } else if rep > 1 && (r.bf16_autocast || r.bf16_weights) {
        // bf16 with enable_gqa: cuDNN's kernel takes the groups itself
        st.push(format!(
            "y0 = scaled_dot_product_attention(q1, {k}, {v}, enable_gqa=true, is_causal={causal})"
        ));
    } else if rep > 1 {
        // PyTorch's math path with enable_gqa (float32)
        let sq = (1.0 / (hd as f64).sqrt()).sqrt();
        st.push(format!("aq = q1 * {sq:?}"));
        if causal {
            st.extend([
                format!("am0 = ones({t}, {t}, dtype=bool)"),
                "am1 = am0.tril()".to_string(),
                "del am0".to_string(),
                "az = zeros([])".to_string(),
                "ai = full([], fill_value=-inf)".to_string(),
                "am = where(am1, az, ai)".to_string(),
                "del ai, az, am1".to_string(),
            ]);
        }
        st.extend([
            format!(
                "ak = {k}.unsqueeze(2).expand({b}, {nkv}, {rep}, -1, {hd}).clone().flatten(1, 2)"
            ),
            format!(
                "av = {v}.unsqueeze(2).expand({b}, {nkv}, {rep}, -1, {hd}).clone().flatten(1, 2)"
            ),
            format!("aks = ak.transpose(-2, -1) * {sq:?}"),
            "att = aq @ aks".to_string(),
            "del aks".to_string(),
        ]);
        if causal {
            st.push("att.add_(am)".to_string());
        }
        st.extend([
            "att = safe_softmax(att, -1)".to_string(),
            "y0 = att @ av".to_string(),
            // C++'s locals in reverse order of declaration; the weights last (returned)
            if causal {
                "del ak, av, aq, am, att".to_string()
            } else {
                "del ak, av, aq, att".to_string()
            },
        ]);
    } else {
        st.push(format!(
            "y0 = scaled_dot_product_attention(q1, {k}, {v}, is_causal={causal})"
        ));
    }
    st.push("y = y0.transpose(1, 2).contiguous()".to_string());
    st.push("del y0".to_string());
    for x in st {
        at(s, ind, path, &x);
    }
}
