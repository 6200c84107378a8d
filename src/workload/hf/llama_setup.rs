//! The setup script of a Llama-family model ([`super::llama`]): its parameters in the order
//! `model.to(device)` moves them, the rotary (and Gemma's embedding-scale) buffers, peft's
//! LoRA adapters, the distributed wrappers (DDP's `ddp_init`, FSDP2's `fsdp_init` over each
//! decoder layer then the root, the model built on the host with CPU offload or on the meta
//! device), and the optimizer over what it steps.

use std::fmt::Write as _;

use super::train::{param, TRAINABLE};
use super::{LlamaConfig, Run};
use crate::workload::preset::optimizer_line;

/// `(variable, module path, parameter name, shape)` of every parameter, in `model.to()`
/// order (each module's children first, then its own parameters).
fn params(c: &LlamaConfig) -> Vec<(String, String, &'static str, Vec<u64>)> {
    let h = c.hidden;
    let mut p = vec![(
        "embed".to_string(),
        "model.embed_tokens".to_string(),
        "weight",
        vec![c.vocab, h],
    )];
    for l in 0..c.layers {
        let m = |s: &str| format!("model.layers.{l}.{s}");
        let lin = |p: &mut Vec<_>, var: &str, path: &str, out: u64, inp: u64, bias: bool| {
            p.push((format!("l{l}_{var}_w"), m(path), "weight", vec![out, inp]));
            if bias {
                p.push((format!("l{l}_{var}_b"), m(path), "bias", vec![out]));
            }
        };
        let sparse = c.moe.as_ref().filter(|moe| moe.sparse[l as usize]);
        for (name, path, out, inp) in linears(c) {
            if sparse.is_some() && matches!(name, "gate" | "up" | "down") {
                continue;
            }
            let bias = match name {
                "gate" | "up" | "down" => c.mlp_bias,
                "o" => c.o_bias,
                _ => c.qkv_bias,
            };
            lin(&mut p, name, path, out, inp, bias);
            if name == "o" && c.qk_norm {
                let hd = c.head_dim;
                p.push((
                    format!("l{l}_qn"),
                    m("self_attn.q_norm"),
                    "weight",
                    vec![hd],
                ));
                p.push((
                    format!("l{l}_kn"),
                    m("self_attn.k_norm"),
                    "weight",
                    vec![hd],
                ));
            }
        }
        if let Some(moe) = sparse {
            // MixtralSparseMoeBlock makes its router first, Qwen3MoeSparseMoeBlock its experts
            let (e, i) = (moe.experts, moe.intermediate);
            let router = (
                format!("l{l}_router_w"),
                m("mlp.gate"),
                "weight",
                vec![e, h],
            );
            let experts = [
                (
                    format!("l{l}_gu_w"),
                    m("mlp.experts"),
                    "gate_up_proj",
                    vec![e, 2 * i, h],
                ),
                (
                    format!("l{l}_dn_w"),
                    m("mlp.experts"),
                    "down_proj",
                    vec![e, h, i],
                ),
            ];
            if moe.router_first {
                p.push(router);
                p.extend(experts);
            } else {
                p.extend(experts);
                p.push(router);
            }
        }
        p.push((format!("l{l}_ln1"), m("input_layernorm"), "weight", vec![h]));
        p.push((
            format!("l{l}_ln2"),
            m("post_attention_layernorm"),
            "weight",
            vec![h],
        ));
        if c.sandwich {
            p.push((
                format!("l{l}_ln3"),
                m("pre_feedforward_layernorm"),
                "weight",
                vec![h],
            ));
            p.push((
                format!("l{l}_ln4"),
                m("post_feedforward_layernorm"),
                "weight",
                vec![h],
            ));
        }
    }
    p.push(("norm".into(), "model.norm".into(), "weight", vec![h]));
    p
}

/// The linears of a decoder layer in module order: (short name, module path, out, in).
fn linears(c: &LlamaConfig) -> Vec<(&'static str, &'static str, u64, u64)> {
    let (h, q, kv, i) = (
        c.hidden,
        c.heads * c.head_dim,
        c.kv_heads * c.head_dim,
        c.intermediate,
    );
    if c.phi3 {
        // Phi3Attention makes o_proj before qkv_proj
        return vec![
            ("o", "self_attn.o_proj", h, q),
            ("qkv", "self_attn.qkv_proj", q + 2 * kv, h),
            ("gate_up", "mlp.gate_up_proj", 2 * i, h),
            ("down", "mlp.down_proj", h, i),
        ];
    }
    vec![
        ("q", "self_attn.q_proj", q, h),
        ("k", "self_attn.k_proj", kv, h),
        ("v", "self_attn.v_proj", kv, h),
        ("o", "self_attn.o_proj", h, q),
        ("gate", "mlp.gate_proj", i, h),
        ("up", "mlp.up_proj", i, h),
        ("down", "mlp.down_proj", h, i),
    ]
}

/// The module names `[model.lora] target_modules` may name for this config's family (with
/// `attention`, the attention's projections only).
pub(crate) fn lora_targets(c: &LlamaConfig, attention: bool) -> Vec<&'static str> {
    // (a sparse block's router and experts are no `nn.Linear`: peft's LoRA does not wrap them)
    let dense_mlp = c.moe.as_ref().is_none_or(|m| m.sparse.iter().any(|s| !s));
    linears(c)
        .into_iter()
        .filter(|(_, path, ..)| !attention || path.starts_with("self_attn."))
        .filter(|(_, path, ..)| dense_mlp || !path.starts_with("mlp."))
        .map(|(_, path, ..)| path.rsplit('.').next().unwrap_or(path))
        .collect()
}

/// LoRA's adapters: `(variable, module path, shape, zero-initialised)` of each targeted
/// linear's lora_A then lora_B, layer by layer in module order.
fn lora_params(c: &LlamaConfig, r: &Run) -> Vec<(String, String, Vec<u64>, bool)> {
    let Some(l) = &r.lora else {
        return Vec::new();
    };
    let mut v = Vec::new();
    for layer in 0..c.layers {
        let sparse = c.moe.as_ref().is_some_and(|m| m.sparse[layer as usize]);
        for (name, path, out, inp) in linears(c) {
            let module = path.rsplit('.').next().unwrap_or(path);
            if !l.targets.iter().any(|t| t == module) || (sparse && path.starts_with("mlp.")) {
                continue;
            }
            let m = format!("model.layers.{layer}.{path}");
            v.push((
                format!("l{layer}_{name}_la"),
                format!("{m}.lora_A.default"),
                vec![l.r, inp],
                false,
            ));
            v.push((
                format!("l{layer}_{name}_lb"),
                format!("{m}.lora_B.default"),
                vec![out, l.r],
                true,
            ));
        }
    }
    v
}

/// The setup script: the parameters, the rotary buffers, LoRA's adapters, the optimizer.
pub(super) fn setup(c: &LlamaConfig, r: &Run) -> String {
    let mut s = String::new();
    let ps = params(c);
    // `model.to(torch.bfloat16)`: every parameter and floating buffer in bf16
    // (under FSDP2's mixed precision the model is built in float32 and fully_shard casts
    // what the layers use; bf16 weights of its own are built in bf16)
    let dt = if r.bf16_weights && r.fsdp.as_ref().is_none_or(|f| f.weights_bf16) {
        ", dtype=bf16"
    } else {
        ""
    };
    // peft freezes the base model
    let trainable = r.lora.is_none();
    // (with FSDP2's CPU offload the model stays on the host: fully_shard moves only the
    // buffers to the device)
    let dev = match &r.fsdp {
        Some(f) if f.cpu_offload => ", device=\"cpu\"",
        // (built on meta: fully_shard, then `to_empty` makes only the shards)
        Some(f) if f.meta_init => ", device=\"meta\"",
        _ => "",
    };
    // (the buffers are made on the device either way, except with offload)
    let bdev = if r.fsdp.as_ref().is_some_and(|f| f.cpu_offload) {
        dev
    } else {
        ""
    };
    for (var, path, name, shape) in &ps {
        param(
            &mut s,
            var,
            path,
            name,
            shape,
            "randn",
            &format!("{dt}, requires_grad={trainable}{dev}"),
        );
    }
    if c.gemma {
        // the scaled embedding's `embed_scale` buffer: sqrt(hidden) as a 0-dim tensor
        let _ = writeln!(s, "scope \"model.embed_tokens\" {{");
        let _ = writeln!(
            s,
            "  embed_scale = full([], fill_value={:?}{dt}{bdev})",
            (c.hidden as f64).sqrt()
        );
        let _ = writeln!(s, "}}");
    }
    // the rotary embedding's buffers: inv_freq and original_inv_freq
    let _ = writeln!(s, "scope \"model.rotary_emb\" {{");
    let _ = writeln!(s, "  inv_freq = zeros({}{dt}{bdev})", c.head_dim / 2);
    let _ = writeln!(
        s,
        "  original_inv_freq = zeros({}{dt}{bdev})",
        c.head_dim / 2
    );
    let _ = writeln!(s, "}}");
    let mut list: Vec<&str> = ps.iter().map(|(v, ..)| v.as_str()).collect();
    if c.tie_embeddings {
        let _ = writeln!(s, "lm_head = embed");
    } else {
        let _ = writeln!(s, "scope \"lm_head\" {{");
        let _ = writeln!(
            s,
            "  lm_head = randn({}, {}{dt}, requires_grad={trainable}{dev}, from=\"lm_head.weight\")",
            c.vocab, c.hidden
        );
        let _ = writeln!(s, "}}");
        list.push("lm_head");
    }
    let adapters = lora_params(c, r);
    // (with LoRA under FSDP2: every parameter, the adapters after their base layer's)
    let mut fsdp_all: Option<Vec<&str>> = None;
    if r.lora.is_some() {
        // get_peft_model: each targeted linear's lora_A ([r, in], kaiming-uniform) and lora_B
        // ([out, r], zeros), in module order, on the base weight's device and in its dtype;
        // then (autocast_adapter_dtype, peft's default) adapters in bf16 are cast to float32,
        // one by one: the float32 copy made, the bf16 one freed
        // (where the base is: on the host or the meta device under FSDP2)
        let trainable = format!("{TRAINABLE}{dev}");
        for (var, path, shape, zero) in &adapters {
            let f = if *zero { "zeros" } else { "randn" };
            if r.bf16_weights {
                let v16 = format!("{var}_bf16");
                param(
                    &mut s,
                    &v16,
                    path,
                    "weight",
                    shape,
                    f,
                    &format!("{dt}{dev}"),
                );
            } else {
                param(&mut s, var, path, "weight", shape, f, &trainable);
            }
        }
        if r.bf16_weights {
            for (var, path, shape, zero) in &adapters {
                let f = if *zero { "zeros" } else { "randn" };
                param(&mut s, var, path, "weight", shape, f, &trainable);
                let _ = writeln!(s, "del {var}_bf16");
            }
        }
        // FSDP2 shards every parameter, frozen or not, in module order (`_get_managed_states`:
        // a peft wrapper's base layer, then its lora_A and lora_B); the rest take the adapters
        if r.fsdp.is_some() {
            let mut all = Vec::with_capacity(list.len() + adapters.len());
            for (i, v) in list.iter().enumerate() {
                all.push(*v);
                let Some((_, path, ..)) = ps.get(i) else {
                    continue;
                };
                let last_of_module = ps.get(i + 1).is_none_or(|(_, next, ..)| next != path);
                if last_of_module {
                    let lora = format!("{path}.lora_");
                    all.extend(
                        adapters
                            .iter()
                            .filter(|(_, ap, ..)| ap.starts_with(&lora))
                            .map(|(av, ..)| av.as_str()),
                    );
                }
            }
            fsdp_all = Some(all);
        }
        list = adapters.iter().map(|(v, ..)| v.as_str()).collect();
    }
    if let Some(d) = &r.ddp {
        // `DistributedDataParallel(model)`: its trainable parameters and registered buffers
        // (Gemma's embed_scale, the rotary embedding's inv_freq and original_inv_freq)
        let buffers = if c.gemma {
            "embed_scale, inv_freq, original_inv_freq"
        } else {
            "inv_freq, original_inv_freq"
        };
        let mut ws = if d.world_size > 1 {
            format!(", world_size={}", d.world_size)
        } else {
            String::new()
        };
        if d.bucket_view {
            ws.push_str(", gradient_as_bucket_view=true");
        }
        let _ = writeln!(
            s,
            "ddp_init([{}], [{buffers}], bucket_cap_mb={}{ws})",
            list.join(", "),
            d.bucket_cap_mb
        );
    }
    if let Some(z) = &r.zero {
        // `deepspeed.initialize(model=..., optimizer=...)` with a ZeRO stage: its optimizer
        // flattens and partitions the trainable parameters (the optimizer below is what it
        // wraps; it steps the float32 partition)
        let _ = writeln!(
            s,
            "zero_init([{}], stage={}, world_size={}, reduce_bucket_size={}, overlap_comm={}, offload_optimizer={})",
            list.join(", "),
            z.stage,
            z.world_size,
            z.reduce_bucket_size,
            z.overlap_comm,
            z.offload_optimizer
        );
    }
    if let Some(f) = &r.fsdp {
        // `fully_shard(layer)` for each decoder layer, then `fully_shard(model)`: the root
        // group holds the parameters left (the embedding, the final norm, lm_head)
        let mut groups: Vec<Vec<&str>> = (0..c.layers).map(|_| Vec::new()).collect();
        let mut root = Vec::new();
        for &v in fsdp_all.as_ref().unwrap_or(&list) {
            let layer = v
                .strip_prefix('l')
                .and_then(|rest| rest.split_once('_'))
                .and_then(|(n, _)| n.parse::<usize>().ok())
                .filter(|&n| n < groups.len());
            match layer {
                Some(n) => groups[n].push(v),
                None => root.push(v),
            }
        }
        groups.push(root);
        let groups: Vec<String> = groups
            .iter()
            .map(|g| format!("[{}]", g.join(", ")))
            .collect();
        let mut opts = String::new();
        if f.param_bf16 {
            opts.push_str(", param_dtype=bf16");
        }
        if let Some(rd) = f.reduce_dtype {
            let _ = write!(opts, ", reduce_dtype={rd}");
        }
        if !f.reshard_after_forward {
            opts.push_str(", reshard_after_forward=false");
        }
        if f.world_size > 1 {
            let _ = write!(opts, ", world_size={}", f.world_size);
        }
        if f.cpu_offload {
            // (the model was built on the host: the root moves the buffers too)
            let buffers = if c.gemma {
                "embed_scale, inv_freq, original_inv_freq"
            } else {
                "inv_freq, original_inv_freq"
            };
            let _ = write!(opts, ", buffers=[{buffers}], offload=true");
        }
        let _ = writeln!(s, "fsdp_init([{}]{opts})", groups.join(", "));
        let sharded = format!("fsdp_sharded([{}])", list.join(", "));
        crate::workload::preset::optimizer_over(&mut s, r.optimizer, &sharded);
        return s;
    }
    optimizer_line(&mut s, r.optimizer, &list.join(", "));
    s
}
