//! `GPT2LMHeadModel` (transformers 5.17) as line-language statements, op for op as the H200
//! traces show transformers running it:
//!
//! - `GPT2Model`: the token embedding; `cache_position` (an `arange` plus the cache's length)
//!   and `position_ids` from it; the position embedding ([1, T, E], broadcast in the sum); the
//!   embedding dropout; no causal mask (sdpa takes `is_causal`); a `DynamicCache` that keeps
//!   every layer's keys and values (`torch.cat` into the cache) until the output is dropped.
//! - Each `GPT2Block`: `ln_1`, `c_attn` (GPT-2's `Conv1D`: `addmm(b, x.view(-1, E), W)` with
//!   `W` as [in, out], then viewed back), `split` into q, k and v (views: their backward is one
//!   `cat`), the cache update, SDPA with `attn_pdrop` inside the kernel, `c_proj`, the residual
//!   dropout, the residual sum; `ln_2`, `c_fc`, the activation (`gelu_new`: NewGELUActivation's
//!   eight ops), `c_proj`, the dropout, the residual sum. The block's `attn_output` and
//!   `feed_forward_hidden_states` go when it returns.
//! - `ln_f`, then `lm_head` (the token embedding's weight when tied) and transformers'
//!   `ForCausalLMLoss` ([`super::train::causal_lm_loss`]).
//!
//! A dropout of probability 0 is its input (no kernel, no mask).

use std::fmt::Write as _;

use super::config_gpt2_bert::{Gelu, Gpt2Config};
use super::llama::Cache;
use super::train::{dropout, param, TRAINABLE};
use super::Run;
use crate::workload::preset::{at, optimizer_line};

/// `(variable, module path, parameter name, shape)` of every parameter, in `model.to()` order.
fn params(c: &Gpt2Config) -> Vec<(String, String, &'static str, Vec<u64>)> {
    let (e, i) = (c.hidden, c.inner);
    let mut p = vec![
        (
            "wte".to_string(),
            "transformer.wte".to_string(),
            "weight",
            vec![c.vocab, e],
        ),
        (
            "wpe".to_string(),
            "transformer.wpe".to_string(),
            "weight",
            vec![c.positions, e],
        ),
    ];
    for l in 0..c.layers {
        let m = |s: &str| format!("transformer.h.{l}.{s}");
        let mut two = |var: &str, path: &str, w: Vec<u64>, b: u64| {
            p.push((format!("l{l}_{var}_w"), m(path), "weight", w));
            p.push((format!("l{l}_{var}_b"), m(path), "bias", vec![b]));
        };
        two("ln1", "ln_1", vec![e], e);
        two("attn", "attn.c_attn", vec![e, 3 * e], 3 * e);
        two("aproj", "attn.c_proj", vec![e, e], e);
        two("ln2", "ln_2", vec![e], e);
        two("fc", "mlp.c_fc", vec![e, i], i);
        two("mproj", "mlp.c_proj", vec![i, e], e);
    }
    for (var, name) in [("lnf_w", "weight"), ("lnf_b", "bias")] {
        p.push((var.into(), "transformer.ln_f".into(), name, vec![e]));
    }
    p
}

/// The Conv1D layers of a block: (short name, module path, in, out), in module order.
fn convs(c: &Gpt2Config) -> [(&'static str, &'static str, u64, u64); 4] {
    let (e, i) = (c.hidden, c.inner);
    [
        ("attn", "attn.c_attn", e, 3 * e),
        ("aproj", "attn.c_proj", e, e),
        ("fc", "mlp.c_fc", e, i),
        ("mproj", "mlp.c_proj", i, e),
    ]
}

/// The module names `[model.lora] target_modules` may name (peft matches the last part of a
/// module's path: `c_proj` is the attention's and the MLP's).
pub(crate) const LORA_TARGETS: &[&str] = &["c_attn", "c_proj", "c_fc"];

/// The setup and body scripts.
pub(super) fn expand(c: &Gpt2Config, r: &Run) -> (String, String) {
    let s = setup(c, r);
    let fwd = |s: &mut String, ind: &str| forward(s, c, r, ind);
    (
        s,
        super::train::body(
            if r.checkpointing { 0 } else { c.layers },
            &[],
            r,
            super::train::CLONED_LABELS,
            &fwd,
            &[],
        ),
    )
}

/// The setup script: the parameters (bf16 with bf16 weights), LoRA's adapters, the optimizer.
pub(super) fn setup(c: &Gpt2Config, r: &Run) -> String {
    let mut s = String::new();
    let ps = params(c);
    // `model.to(torch.bfloat16)`: every parameter in bf16
    let dt = if r.bf16_weights { ", dtype=bf16" } else { "" };
    // peft freezes the base model
    let base = if r.lora.is_some() {
        format!("{dt}, requires_grad=false")
    } else {
        format!("{dt}{TRAINABLE}")
    };
    for (var, path, name, shape) in &ps {
        param(&mut s, var, path, name, shape, "randn", &base);
    }
    let mut list: Vec<String> = ps.iter().map(|(v, ..)| v.clone()).collect();
    if c.tie_embeddings {
        let _ = writeln!(s, "lm_head = wte");
    } else {
        let _ = writeln!(s, "scope \"lm_head\" {{");
        let _ = writeln!(
            s,
            "  lm_head = randn({}, {}{dt}, requires_grad={}, from=\"lm_head.weight\")",
            c.vocab,
            c.hidden,
            r.lora.is_none()
        );
        let _ = writeln!(s, "}}");
        list.push("lm_head".into());
    }
    if let Some(l) = &r.lora {
        // get_peft_model: each targeted Conv1D's lora_A ([r, in]) and lora_B ([out, r], zeros),
        // module by module, in the base weight's dtype; over bf16 weights (peft's
        // autocast_adapter_dtype) each is then cast to float32 in turn, the bf16 one freed
        list.clear();
        let mut adapters = Vec::new();
        for layer in 0..c.layers {
            for (name, path, inp, out) in convs(c) {
                if super::train::lora_for(r, path).is_none() {
                    continue;
                }
                let m = format!("transformer.h.{layer}.{path}");
                for (suffix, shape, fill) in
                    [("la", [l.r, inp], "randn"), ("lb", [out, l.r], "zeros")]
                {
                    let var = format!("l{layer}_{name}_{suffix}");
                    let module = format!(
                        "{m}.lora_{}.default",
                        if suffix == "la" { "A" } else { "B" }
                    );
                    if r.bf16_weights {
                        let v16 = format!("{var}_bf16");
                        param(&mut s, &v16, &module, "weight", &shape, fill, dt);
                    } else {
                        param(&mut s, &var, &module, "weight", &shape, fill, TRAINABLE);
                    }
                    adapters.push((var.clone(), module, shape, fill));
                    list.push(var);
                }
            }
        }
        if r.bf16_weights {
            for (var, module, shape, fill) in &adapters {
                param(&mut s, var, module, "weight", shape, fill, TRAINABLE);
                let _ = writeln!(s, "del {var}_bf16");
            }
        }
    }
    let list: Vec<&str> = list.iter().map(String::as_str).collect();
    optimizer_line(&mut s, r.optimizer, &list.join(", "));
    s
}

/// `GPT2Model.forward`, `lm_head` and (in training) the loss, leaving `logits` (and each
/// layer's cache `kc`, `vc`).
fn forward(s: &mut String, c: &Gpt2Config, r: &Run, outer: &str) {
    let t = r.seq;
    // under bf16 autocast the whole forward and the loss run in the region
    let inner = format!("{outer}  ");
    let ind = if r.bf16_autocast {
        let _ = writeln!(s, "{outer}autocast(dtype=bf16) {{");
        inner.as_str()
    } else {
        outer
    };
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    at(
        s,
        ind,
        "transformer.wte",
        "inputs_embeds = embedding(input_ids, wte)",
    );
    line(s, &format!("cp0 = arange({t})"));
    line(s, "cache_position = cp0 + 0");
    line(s, "del cp0");
    line(s, "position_ids = cache_position.unsqueeze(0)");
    at(
        s,
        ind,
        "transformer.wpe",
        "position_embeds = embedding(position_ids, wpe)",
    );
    at(
        s,
        ind,
        "transformer",
        "h0 = inputs_embeds + position_embeds",
    );
    if r.checkpointing {
        // no cache: create_causal_mask first looks for packed sequences in the positions
        super::masks::packed_sequences(s, r, ind);
    }
    if r.eager {
        // eager attention adds a float32 causal mask (sdpa takes `is_causal` instead)
        super::masks::eager_mask(s, r, "transformer.create_causal_mask", ind);
    }
    at(
        s,
        ind,
        "transformer.drop",
        &format!("h = {}", dropout("h0", c.embd_pdrop)),
    );
    line(s, "del h0");
    for l in 0..c.layers {
        if r.checkpointing {
            // GradientCheckpointingLayer: torch.utils.checkpoint(use_reentrant=False), holding
            // the block's tensor arguments (the positions) until its backward; no cache
            let held = if r.eager {
                // eager attention's mask is an argument too
                "cache_position, causal_mask"
            } else {
                "cache_position"
            };
            let _ = writeln!(s, "{ind}checkpoint({held}) {{");
            block(s, c, r, l, Cache::Off, &format!("{ind}  "));
            let _ = writeln!(s, "{ind}}}");
        } else {
            block(s, c, r, l, Cache::Fill, ind);
        }
    }
    final_norm(s, ind);
    // GPT2Model.forward's locals as the H200 traces free them
    line(
        s,
        "del position_ids, cache_position, inputs_embeds, position_embeds",
    );
    if r.eager {
        line(s, "del causal_mask");
    }
    at(s, ind, "lm_head", "logits = linear(h, lm_head)");
    if r.mode == "train" {
        super::train::causal_lm_loss(s, c.vocab, r, ind);
    }
    line(s, "del h");
    if r.bf16_autocast {
        let _ = writeln!(s, "{outer}}}");
    }
}

/// `ln_f` on the last block's output `h`, rebound to `h`.
fn final_norm(s: &mut String, ind: &str) {
    at(
        s,
        ind,
        "transformer.ln_f",
        "hf = layer_norm(h, lnf_w, lnf_b)",
    );
    let _ = writeln!(s, "{ind}h = hf");
    let _ = writeln!(s, "{ind}del hf");
}

/// One `GPT2Block`: `h` to `h`; keeps the layer's cache in `kc{l}`, `vc{l}` (filled, grown by
/// a decode step, or none under checkpointing); `train`: the dropouts are on.
fn block(s: &mut String, c: &Gpt2Config, r: &Run, l: u64, cache: Cache, ind: &str) {
    let train = r.mode == "train";
    let pd = |p: f64| if train { p } else { 0.0 };
    let t = if cache == Cache::Append { 1 } else { r.seq };
    let b = r.batch;
    let (e, nh, i) = (c.hidden, c.heads, c.inner);
    let hd = e / nh;
    let m = |x: &str| format!("transformer.h.{l}.{x}");
    let p = |x: &str| format!("l{l}_{x}");
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    // Conv1D: addmm over the rows, viewed back to [B, T, out]; with LoRA, peft's
    // `result + lora_B(lora_A(dropout(x))) * scaling` around it
    let conv = |s: &mut String, name: &str, path: &str, x: &str, inp: u64, out: u64, y: &str| {
        let product = format!(
            "addmm({}, {x}.view(-1, {inp}), {}).view({b}, {t}, {out})",
            p(&format!("{name}_b")),
            p(&format!("{name}_w"))
        );
        let Some(l) = super::train::lora_for(r, path) else {
            at(s, ind, &m(path), &format!("{y} = {product}"));
            return;
        };
        let (la, lb) = (p(&format!("{name}_la")), p(&format!("{name}_lb")));
        super::train::lora_linear(s, ind, &m(path), &product, x, (&la, &lb), (l, r), y);
    };
    // (the caller's `hidden_states` holds the block's input until the block returns)
    line(s, "hin = h");
    line(s, "residual = h");
    at(
        s,
        ind,
        &m("ln_1"),
        &format!("x = layer_norm(h, {}, {})", p("ln1_w"), p("ln1_b")),
    );
    let attn = m("attn");
    conv(s, "attn", "attn.c_attn", "x", e, 3 * e, "qkv");
    at(s, ind, &attn, &format!("q0, k0, v0 = qkv.split({e}, 2)"));
    // (the keys and values viewed as heads first, then the query: the order their views'
    // backward runs in)
    for (x, y) in [("k0", "k"), ("v0", "v"), ("q0", "q")] {
        at(
            s,
            ind,
            &attn,
            &format!("{y} = {x}.view({b}, {t}, {nh}, {hd}).transpose(1, 2)"),
        );
    }
    line(s, "del q0, k0, v0, qkv");
    let (kk, vv) = match cache {
        // no cache: the keys and values go to attention as they are
        Cache::Off => ("k".to_string(), "v".to_string()),
        Cache::Fill => {
            // past_key_values.update: `torch.cat` onto the layer's empty buffers, made in the
            // keys' dtype (bf16 under autocast)
            let kd = if r.bf16_weights || r.bf16_autocast {
                "bf16"
            } else {
                "float32"
            };
            at(s, ind, &attn, &format!("ce = empty(0, dtype={kd})"));
            at(s, ind, &attn, &format!("kc{l} = cat([ce, k], -2)"));
            at(s, ind, &attn, &format!("vc{l} = cat([ce, v], -2)"));
            at(s, ind, &attn, &format!("kv_cache(kc{l}, vc{l})"));
            line(s, "del ce, k, v");
            (format!("kc{l}"), format!("vc{l}"))
        }
        Cache::Append => {
            // a decode step: the grown cache replaces the old one, which goes at once
            at(s, ind, &attn, &format!("kc{l} = cat([kc{l}, k], -2)"));
            at(s, ind, &attn, &format!("vc{l} = cat([vc{l}, v], -2)"));
            at(s, ind, &attn, &format!("kv_cache(kc{l}, vc{l})"));
            line(s, "del k, v");
            (format!("kc{l}"), format!("vc{l}"))
        }
    };
    let drop = if pd(c.attn_pdrop) > 0.0 {
        format!(", dropout_p={:?}", c.attn_pdrop)
    } else {
        String::new()
    };
    // (a decode step's single query attends to every key: not causal)
    let causal = if t == 1 { ", is_causal=false" } else { "" };
    let scores = if r.eager {
        // eager_attention_forward: the scaled product (the query, a view of the fused
        // projection, copied for bmm), the mask added, softmax, the attention dropout
        let scale = 1.0 / (hd as f64).sqrt();
        let mut st = vec![
            format!("att0 = q @ {kk}.transpose(-1, -2)"),
            format!("att1 = att0 * {scale:?}"),
            "del att0".to_string(),
            "att2 = att1 + causal_mask".to_string(),
            "del att1".to_string(),
            "att3 = softmax(att2, -1)".to_string(),
            "del att2".to_string(),
        ];
        st.push(format!("att = {}", dropout("att3", pd(c.attn_pdrop))));
        st.extend([
            "del att3".to_string(),
            format!("y0 = att @ {vv}"),
            "del att".to_string(),
        ]);
        st
    } else {
        vec![format!(
            "y0 = scaled_dot_product_attention(q, {kk}, {vv}{drop}{causal})"
        )]
    };
    for st in scores {
        at(s, ind, &attn, &st);
    }
    for st in [
        // `attn_output.reshape(*input_shape, -1).contiguous()`: [B, T, E] for c_proj
        format!("y = y0.transpose(1, 2).contiguous().view({b}, {t}, {e})"),
        if cache == Cache::Off {
            "del y0, q, k, v".to_string()
        } else {
            "del y0".to_string()
        },
    ] {
        at(s, ind, &attn, &st);
    }
    conv(s, "aproj", "attn.c_proj", "y", e, e, "a0");
    line(s, "del y");
    at(
        s,
        ind,
        &m("attn.resid_dropout"),
        &format!("a = {}", dropout("a0", pd(c.resid_pdrop))),
    );
    line(s, "del a0");
    if cache != Cache::Off {
        // the query (a view of the fused projection) goes as the attention returns, after
        // its residual dropout
        line(s, "del q");
    }
    let blk = format!("transformer.h.{l}");
    at(s, ind, &blk, "h = a + residual");
    // (`hidden_states` rebound: ln_1's output goes unless autograd keeps it)
    line(s, "del x");
    line(s, "residual = h");
    at(
        s,
        ind,
        &m("ln_2"),
        &format!("x2 = layer_norm(h, {}, {})", p("ln2_w"), p("ln2_b")),
    );
    conv(s, "fc", "mlp.c_fc", "x2", e, i, "f");
    let act = m("mlp.act");
    match c.act {
        Gelu::New => {
            // 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
            for st in [
                "g0 = f * 0.5",
                "g1 = f.pow(3.0)",
                "g2 = g1 * 0.044715",
                "del g1",
                "g3 = f + g2",
                "del g2",
                "g4 = g3 * 0.7978845608028654",
                "del g3",
                "g5 = g4.tanh()",
                "del g4",
                "g6 = g5 + 1.0",
                "del g5",
                "g = g0 * g6",
                "del g0, g6",
            ] {
                at(s, ind, &act, st);
            }
        }
        Gelu::Fused => at(s, ind, &act, "g = f.gelu()"),
    }
    line(s, "del f");
    conv(s, "mproj", "mlp.c_proj", "g", i, e, "m0");
    line(s, "del g");
    at(
        s,
        ind,
        &m("mlp.dropout"),
        &format!("mo = {}", dropout("m0", pd(c.resid_pdrop))),
    );
    line(s, "del m0");
    at(s, ind, &blk, "h = residual + mo");
    line(s, "del x2");
    // the block's locals at its return: residual, attn_output, feed_forward_hidden_states
    line(s, "del residual, a, mo");
    line(s, "del hin");
}

/// `GPT2LMHeadModel.forward` in `generate` (eval mode: no dropout) on the model inputs
/// `mi_ids`, `mi_pos` and `mi_mask`: the token and position embeddings (the positions per row,
/// as generate passes them), `create_causal_mask`'s check of the all-ones 2-D mask (no 4-D
/// mask), the blocks filling the cache (the prefill) or growing it by a position (`decode`),
/// `ln_f`, and `lm_head` on the last position, leaving `logits`.
pub(super) fn generate_forward(s: &mut String, c: &Gpt2Config, r: &Run, decode: bool, ind: &str) {
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    at(
        s,
        ind,
        "transformer.wte",
        "inputs_embeds = embedding(mi_ids, wte)",
    );
    at(
        s,
        ind,
        "transformer.wpe",
        "position_embeds = embedding(mi_pos, wpe)",
    );
    at(s, ind, "transformer", "h = inputs_embeds + position_embeds");
    super::masks::all_ones_check(s, "transformer.create_causal_mask", ind);
    let cache = if decode { Cache::Append } else { Cache::Fill };
    for l in 0..c.layers {
        block(s, c, r, l, cache, ind);
    }
    final_norm(s, ind);
    line(s, "del inputs_embeds, position_embeds");
    // logits_to_keep=1: the last position only
    at(s, ind, "lm_head", "logits = linear(h[:, -1:, :], lm_head)");
    line(s, "del h");
}
