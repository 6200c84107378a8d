//! The llama-family decoders' configs (llama, qwen2/3, mistral, mixtral, qwen3_moe, gemma 1-3,
//! phi3) and which family a `config.json` is: every key is modelled, known not to change
//! memory, or refused by name. Missing keys take transformers' defaults for the model type.

use std::path::Path;

use serde_json::{Map, Value};

use super::config_keys::{check_architectures, config_dtype, flag, int, known_keys, prob};

/// A llama-family decoder, as `LlamaConfig` reads it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LlamaConfig {
    pub vocab: u64,
    pub hidden: u64,
    pub intermediate: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub tie_embeddings: bool,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// `torch_dtype`/`dtype` of the config, where it names one gpumem knows.
    pub dtype: Option<&'static str>,
    /// The special tokens `generate` makes tensors of.
    pub tokens: Tokens,
    /// Qwen2's and Qwen3's modelling code (its rotary embedding casts the frequencies before
    /// expanding them to the batch; llama's expands first).
    pub qwen2: bool,
    /// Qwen3's `q_norm` and `k_norm`: an RMSNorm over each head's dimension of the queries and
    /// keys, before the rotary embedding.
    pub qk_norm: bool,
    /// The config's `model_type` (for messages).
    pub model_type: &'static str,
    /// LongRoPE's `original_max_position_embeddings`: each forward of the rotary embedding
    /// first compares the largest position with it (the short factors below it).
    pub longrope: Option<u64>,
    /// Gemma's modelling: the embedding scaled by the square root of the hidden size (a
    /// device buffer), RMSNorm as `x * (1 + weight)` in float32, the GeGLU MLP
    /// (`gelu_pytorch_tanh`).
    pub gemma: bool,
    /// Which layers attend through `sliding_window` (one entry per layer).
    pub sliding_layers: Vec<bool>,
    /// Gemma-2's `attn_logit_softcapping`: eager attention's scores `tanh(s / c) * c`.
    pub attn_softcap: Option<f64>,
    /// Gemma-2's and Gemma-3's `final_logit_softcapping`: the logits `tanh(l / c) * c`.
    pub final_softcap: Option<f64>,
    /// Gemma-2's and Gemma-3's layers: norms after the attention and around the MLP too.
    pub sandwich: bool,
    /// Gemma-3: a rotary embedding per layer type (local and global bases).
    pub per_type_rope: bool,
    /// Phi-3's modelling: one `qkv_proj` and one `gate_up_proj` (sliced and chunked), the
    /// rotated queries and keys concatenated with their (empty) unrotated part.
    pub phi3: bool,
    /// Mistral's `sliding_window`: each query sees at most this many keys, itself included.
    pub sliding_window: Option<u64>,
    /// `max_position_embeddings`: the longest context the model was trained for (RoPE itself
    /// has no limit; gpumem warns past it).
    pub max_positions: Option<u64>,
    /// Mixtral's and Qwen3-MoE's sparse MLP blocks (None: every layer's MLP is dense).
    pub moe: Option<Moe>,
}

/// A mixture-of-experts MLP as transformers 5.17 builds it: a router (`gate`, [E, H]), the
/// experts' fused `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I], run by the default
/// `grouped_mm` experts implementation.
#[derive(Debug, Clone, PartialEq)]
pub struct Moe {
    pub experts: u64,
    pub top_k: u64,
    /// Each expert's intermediate size.
    pub intermediate: u64,
    /// The top-k weights divided by their sum (Mixtral always; Qwen3-MoE's `norm_topk_prob`).
    pub norm_topk: bool,
    /// Mixtral makes the router before the experts; Qwen3-MoE the experts first.
    pub router_first: bool,
    /// `output_router_logits`: each layer's router logits kept for the load-balancing loss
    /// added to the loss in training (Mixtral's `load_balancing_loss_func`).
    pub aux_loss: bool,
    /// `router_aux_loss_coef` (MixtralConfig's default 0.001).
    pub aux_coef: f64,
    /// Qwen3-MoE's router hands back its top-k weights in the logits' dtype
    /// (`router_top_value.to(router_logits.dtype)`); Mixtral's stay float32.
    pub weights_in_logits_dtype: bool,
    /// Which layers have the sparse block (Qwen3-MoE's `decoder_sparse_step` and
    /// `mlp_only_layers`; the others a dense MLP of `intermediate_size`).
    pub sparse: Vec<bool>,
}

/// A config's special tokens (`bos_token_id`, `eos_token_id`, `pad_token_id`): `generate`
/// makes each a tensor on the device, and with an end-of-sequence token adds its stopping
/// criterion and the minimum-length processors.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Tokens {
    pub bos: Option<u64>,
    /// `eos_token_id`: one id (a 0-dim tensor) or a list (1-D).
    pub eos: Option<Vec<u64>>,
    pub eos_list: bool,
    pub pad: Option<u64>,
}

/// The special tokens of `m`, the family's defaults where a key is absent (null: none).
pub(super) fn tokens(
    m: &Map<String, Value>,
    path: &Path,
    bos: Option<u64>,
    eos: Option<u64>,
) -> Result<Tokens, String> {
    let id = |v: &Value, key: &str| {
        v.as_u64().ok_or_else(|| {
            format!(
                "{}: '{key}' must be a token id (a non-negative integer), found {v}",
                path.display()
            )
        })
    };
    let one = |key: &str, default: Option<u64>| match m.get(key) {
        None => Ok(default),
        Some(Value::Null) => Ok(None),
        Some(v) => id(v, key).map(Some),
    };
    let (eos, eos_list) = match m.get("eos_token_id") {
        None => (eos.map(|e| vec![e]), false),
        Some(Value::Null) => (None, false),
        Some(Value::Array(a)) if a.is_empty() => (None, true),
        Some(Value::Array(a)) => (
            Some(
                a.iter()
                    .map(|v| id(v, "eos_token_id"))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            true,
        ),
        Some(v) => (Some(vec![id(v, "eos_token_id")?]), false),
    };
    Ok(Tokens {
        bos: one("bos_token_id", bos)?,
        eos,
        eos_list,
        pad: one("pad_token_id", None)?,
    })
}

/// A model family's config.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Family {
    Llama(Box<LlamaConfig>),
    Gpt2(super::config_gpt2_bert::Gpt2Config),
    Bert(super::config_gpt2_bert::BertConfig),
}

/// The config in `m` (read from `path`, for messages), by its `model_type`.
pub(super) fn family(m: &Map<String, Value>, path: &Path) -> Result<Family, String> {
    use super::config_gpt2_bert::{bert, gpt2};
    // a multimodal config (Gemma-3 4B and up, Qwen2-VL, Llava): the text model is one part of
    // what transformers loads, beside a vision tower gpumem does not model
    if let Some(text) = m.get("text_config").and_then(Value::as_object) {
        let outer = m.get("model_type").and_then(Value::as_str).unwrap_or("?");
        let inner = text
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("?");
        return Err(format!(
            "{}: 'text_config': a multimodal config (model_type \"{outer}\"), whose vision tower gpumem does not model; to measure its language model alone, save the text_config (model_type \"{inner}\") as a config.json of its own",
            path.display()
        ));
    }
    match m.get("model_type") {
        Some(Value::String(s)) if s == "gpt2" => gpt2(m, path).map(Family::Gpt2),
        Some(Value::String(s)) if s == "bert" => bert(m, path).map(Family::Bert),
        _ => llama(m, path).map(|c| Family::Llama(Box::new(c))),
    }
}

/// The refusal of a `model_type` gpumem has no model of.
fn not_modelled(path: &Path, model_type: &str) -> String {
    if matches!(
        model_type,
        "qwen2_moe" | "deepseek_v2" | "deepseek_v3" | "olmoe" | "gpt_oss"
    ) {
        return format!(
            "{}: model_type \"{model_type}\": its mixture-of-experts layers (its router and shared experts) are not modelled yet (mixtral and qwen3_moe are)",
            path.display()
        );
    }
    format!(
        "{}: model_type \"{model_type}\" is not a family gpumem models ({FAMILIES})",
        path.display()
    )
}

/// The `model_type`s gpumem models, as its messages list them.
pub const FAMILIES: &str =
    "llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma, gemma2, gemma3_text, phi3, gpt2 and bert";

/// The llama config in `m` (read from `path`, for messages).
pub(super) fn llama(m: &Map<String, Value>, path: &Path) -> Result<LlamaConfig, String> {
    let shown = path.display();
    let model_type = match m.get("model_type") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(format!("{shown}: 'model_type' must be a string")),
        None => return Err(format!("{shown}: no 'model_type' (one of {FAMILIES})")),
    };
    let mixtral = model_type == "mixtral";
    let qwen3_moe = model_type == "qwen3_moe";
    let qwen3 = model_type == "qwen3" || qwen3_moe;
    let gemma2 = model_type == "gemma2";
    let gemma3 = model_type == "gemma3_text";
    let gemma = model_type == "gemma" || gemma2 || gemma3;
    let phi3 = model_type == "phi3";
    // (Qwen3's and Gemma-2's rotary embeddings cast as Qwen2's does; Qwen3-MoE's, Gemma's
    // and Gemma-3's expand first, as llama's: their bf16 generation, recorded)
    let qwen2 = model_type == "qwen2" || (qwen3 && !qwen3_moe) || gemma2;
    let mistral = model_type == "mistral" || mixtral;
    match model_type {
        "llama" | "qwen2" | "qwen3" | "mistral" | "gemma" | "gemma2" | "gemma3_text" | "phi3"
        | "mixtral" | "qwen3_moe" => {}
        other => return Err(not_modelled(path, other)),
    }
    const MODELLED: &[&str] = &[
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "hidden_act",
        "rms_norm_eps",
        "rope_parameters",
        "rope_scaling",
        "rope_theta",
        "attention_dropout",
        "pretraining_tp",
        // qwen2
        "use_sliding_window",
        "sliding_window",
        "max_window_layers",
        "layer_types",
        // gemma's older name for hidden_act
        "hidden_activation",
        "partial_rotary_factor",
        // phi3: dropouts (0: nn.Dropout returns its input), LongRoPE's original length
        "resid_pdrop",
        "embd_pdrop",
        "original_max_position_embeddings",
        // gemma2 and gemma3
        "query_pre_attn_scalar",
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "sliding_window_pattern",
        "_sliding_window_pattern",
        "rope_local_base_freq",
        "cache_implementation",
        // mixtral and qwen3_moe
        "num_local_experts",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "norm_topk_prob",
        "decoder_sparse_step",
        "mlp_only_layers",
        "output_router_logits",
        "router_aux_loss_coef",
        "router_jitter_noise",
    ];
    known_keys(m, path, model_type, MODELLED, &[])?;
    let arch = match model_type {
        "qwen2" => "Qwen2ForCausalLM",
        "qwen3" => "Qwen3ForCausalLM",
        "gemma" => "GemmaForCausalLM",
        "gemma2" => "Gemma2ForCausalLM",
        "gemma3_text" => "Gemma3ForCausalLM",
        "phi3" => "Phi3ForCausalLM",
        "mistral" => "MistralForCausalLM",
        "mixtral" => "MixtralForCausalLM",
        "qwen3_moe" => "Qwen3MoeForCausalLM",
        _ => "LlamaForCausalLM",
    };
    check_architectures(m, path, model_type, &[arch])?;
    let int = |k: &str, d: u64| int(m, path, k, d);
    let flag = |k: &str, d: bool| flag(m, path, k, d);
    // LlamaConfig's and Qwen2Config's defaults
    // (GemmaConfig's defaults are Gemma-7B's)
    let hidden = int(
        "hidden_size",
        if gemma2 || gemma3 {
            2304
        } else if gemma || phi3 {
            3072
        } else {
            4096
        },
    )?;
    let heads = int(
        "num_attention_heads",
        if gemma2 || gemma3 {
            8
        } else if gemma {
            16
        } else {
            32
        },
    )?;
    // (MistralConfig's default: 8 key/value heads)
    let kv_heads = int(
        "num_key_value_heads",
        if mistral {
            8
        } else if gemma2 || gemma3 {
            4
        } else {
            heads
        },
    )?;
    if heads % kv_heads != 0 {
        return Err(format!(
            "{shown}: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
        ));
    }
    let head_dim = match m.get("head_dim") {
        None | Some(Value::Null) => {
            if hidden % heads != 0 {
                return Err(format!(
                    "{shown}: hidden_size ({hidden}) must be a multiple of num_attention_heads ({heads}), or give head_dim"
                ));
            }
            hidden / heads
        }
        Some(_) => int("head_dim", 1)?,
    };
    // (Qwen3Config's default head_dim is 128 whatever the hidden size)
    let head_dim = if qwen3 && m.get("head_dim").is_none_or(Value::is_null) {
        128
    } else if gemma && m.get("head_dim").is_none_or(Value::is_null) {
        256
    } else {
        head_dim
    };
    if head_dim % 2 != 0 {
        return Err(format!(
            "{shown}: head_dim ({head_dim}) must be even for rotary embeddings"
        ));
    }
    // Gemma's GeGLU: `gelu_pytorch_tanh` (and the exact `gelu`: one op, the same memory)
    let acts: &[&str] = if gemma {
        &["gelu_pytorch_tanh", "gelu"]
    } else {
        &["silu"]
    };
    for key in ["hidden_act", "hidden_activation"] {
        match m.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(a)) if acts.contains(&a.as_str()) => {}
            Some(other) => {
                return Err(format!(
                    "{shown}: {key} {other} is not modelled for {model_type} ({} is)",
                    acts.join(", ")
                ))
            }
        }
    }
    for key in ["resid_pdrop", "embd_pdrop"] {
        if prob(m, path, key, 0.0)? != 0.0 {
            return Err(format!(
                "{shown}: {key} above 0 is not modelled yet (a dropout's mask allocates; 0.0 is)"
            ));
        }
    }
    for key in ["rope_parameters", "rope_scaling"] {
        if let Some(Value::Object(r)) = m.get(key) {
            if let Some(f) = r.get("partial_rotary_factor") {
                if f.as_f64() != Some(1.0) {
                    return Err(format!(
                        "{shown}: '{key}' partial_rotary_factor {f} is not modelled yet (1.0 is)"
                    ));
                }
            }
        }
    }
    if let Some(f) = m.get("partial_rotary_factor") {
        if !f.is_null() && f.as_f64() != Some(1.0) {
            return Err(format!(
                "{shown}: partial_rotary_factor {f} is not modelled yet (1.0 is)"
            ));
        }
    }
    if int("pretraining_tp", 1)? != 1 {
        return Err(format!("{shown}: pretraining_tp > 1 is not modelled (its sliced products allocate differently)"));
    }
    match m.get("attention_dropout") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.as_f64() == Some(0.0) => {}
        Some(other) => {
            return Err(format!(
                "{shown}: attention_dropout {other} is not modelled yet (0.0 is)"
            ))
        }
    }
    for key in ["rope_parameters", "rope_scaling"] {
        if let Some(Value::Object(r)) = m.get(key) {
            // Gemma-3's per layer type: {"sliding_attention": {...}, "full_attention": {...}}
            let nested: Vec<(&str, &Map<String, Value>)> = r
                .iter()
                .filter_map(|(k, v)| v.as_object().map(|o| (k.as_str(), o)))
                .collect();
            let each: Vec<(&str, &Map<String, Value>)> = if nested.is_empty() {
                vec![("", r)]
            } else {
                nested
            };
            for (part, r) in each {
                let kind = r
                    .get("rope_type")
                    .or_else(|| r.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                // dynamic NTK recomputes its frequencies per forward (allocations of its own)
                if !matches!(kind, "default" | "linear" | "llama3" | "yarn" | "longrope") {
                    let at = if part.is_empty() {
                        String::new()
                    } else {
                        format!(" {part}")
                    };
                    return Err(format!(
                        "{shown}: '{key}'{at} rope_type \"{kind}\" is not modelled (default, linear, llama3, yarn and longrope are)"
                    ));
                }
            }
        }
    }
    // LongRoPE (Phi-3's 128k and Phi-3.5): its forward checks the positions against the
    // original context first (`dynamic_rope_update`)
    let longrope = ["rope_parameters", "rope_scaling"].iter().find_map(|key| {
        let r = m.get(*key)?.as_object()?;
        let kind = r.get("rope_type").or_else(|| r.get("type"))?.as_str()?;
        (kind == "longrope").then(|| {
            r.get("original_max_position_embeddings")
                .or_else(|| m.get("original_max_position_embeddings"))
                .or_else(|| m.get("max_position_embeddings"))
                .and_then(Value::as_u64)
                .unwrap_or(4096)
        })
    });
    // Mistral's window (its default 4096; null: none); Qwen2's only with use_sliding_window
    let sliding_window = if gemma2 || gemma3 {
        match m.get("sliding_window") {
            None => Some(4096),
            Some(Value::Null) => None,
            Some(_) => Some(int("sliding_window", 1)?),
        }
    } else if phi3 {
        match m.get("sliding_window") {
            None | Some(Value::Null) => None,
            Some(_) => Some(int("sliding_window", 1)?),
        }
    } else if mistral {
        match m.get("sliding_window") {
            None if mixtral => None,
            None => Some(4096),
            Some(Value::Null) => None,
            Some(_) => Some(int("sliding_window", 1)?),
        }
    } else {
        None
    };
    if flag("use_sliding_window", false)? {
        return Err(format!(
            "{shown}: use_sliding_window = true is not modelled yet (its sliding-window masks allocate)"
        ));
    }
    let layers = int(
        "num_hidden_layers",
        if gemma {
            if gemma2 || gemma3 {
                26
            } else {
                28
            }
        } else {
            32
        },
    )?;
    // which layers attend through the sliding window: `layer_types` where given, else the
    // family's rule (Gemma-2 every other layer from the first, Gemma-3 all but every
    // `sliding_window_pattern`-th, Mistral and Phi-3 every layer when a window is set)
    let sliding_layers: Vec<bool> = match m.get("layer_types") {
        Some(Value::Array(kinds)) => {
            if kinds.len() as u64 != layers {
                return Err(format!(
                    "{shown}: layer_types names {} layers, num_hidden_layers is {layers}",
                    kinds.len()
                ));
            }
            let mut v = Vec::new();
            for k in kinds {
                match k.as_str() {
                    Some("full_attention") => v.push(false),
                    Some("sliding_attention") if gemma2 || gemma3 => v.push(true),
                    _ => {
                        return Err(format!(
                            "{shown}: layer_types {k} is not modelled for {model_type} (full_attention{} is)",
                            if gemma2 || gemma3 { " and sliding_attention" } else { "" }
                        ))
                    }
                }
            }
            v
        }
        Some(Value::Null) | None if gemma2 => (0..layers).map(|i| (i + 1) % 2 != 0).collect(),
        Some(Value::Null) | None if gemma3 => {
            let pattern = match m
                .get("sliding_window_pattern")
                .or(m.get("_sliding_window_pattern"))
            {
                Some(v) if !v.is_null() => v.as_u64().filter(|&p| p >= 1).ok_or_else(|| {
                    format!("{shown}: sliding_window_pattern must be a positive integer, found {v}")
                })?,
                _ => 6,
            };
            (0..layers).map(|i| (i + 1) % pattern != 0).collect()
        }
        Some(Value::Null) | None => vec![sliding_window.is_some(); layers as usize],
        Some(other) => {
            return Err(format!(
                "{shown}: layer_types must be a list of attention kinds, found {other}"
            ))
        }
    };
    let sliding_layers = if sliding_window.is_some() {
        sliding_layers
    } else {
        vec![false; layers as usize]
    };
    let softcap = |key: &str, default: Option<f64>| -> Result<Option<f64>, String> {
        match m.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) if n.as_f64().is_some_and(|f| f > 0.0 && f.is_finite()) => {
                Ok(n.as_f64())
            }
            Some(other) => Err(format!(
                "{shown}: '{key}' must be a positive number or null, found {other}"
            )),
        }
    };
    let attn_softcap = softcap("attn_logit_softcapping", gemma2.then_some(50.0))?;
    let final_softcap = softcap("final_logit_softcapping", gemma2.then_some(30.0))?;
    if !(gemma2 || gemma3) && (attn_softcap.is_some() || final_softcap.is_some()) {
        return Err(format!(
            "{shown}: logit soft-capping is not part of {model_type}'s modelling"
        ));
    }
    let dtype = config_dtype(m);
    let moe = if mixtral || qwen3_moe {
        Some(moe(m, path, mixtral, layers)?)
    } else {
        None
    };
    Ok(LlamaConfig {
        moe,
        vocab: int(
            "vocab_size",
            match model_type {
                "qwen2" | "qwen3" => 151936,
                "gemma" | "gemma2" => 256000,
                "gemma3_text" => 262208,
                "phi3" => 32064,
                _ => 32000,
            },
        )?,
        hidden,
        intermediate: int(
            "intermediate_size",
            match model_type {
                "qwen2" | "qwen3" => 22016,
                "gemma" => 24576,
                "gemma2" | "gemma3_text" => 9216,
                "phi3" => 8192,
                "mistral" => 14336,
                _ => 11008,
            },
        )?,
        layers,
        sliding_layers,
        attn_softcap,
        final_softcap,
        sandwich: gemma2 || gemma3,
        per_type_rope: gemma3,
        heads,
        kv_heads,
        head_dim,
        tie_embeddings: flag("tie_word_embeddings", gemma)?,
        // Qwen2's q, k and v projections have biases, its o_proj none; Qwen3's follow
        // attention_bias, as llama's do
        qkv_bias: if model_type == "qwen2" {
            true
        } else {
            flag("attention_bias", false)?
        },
        o_bias: if model_type == "qwen2" {
            false
        } else {
            flag("attention_bias", false)?
        },
        model_type: match model_type {
            "gemma2" => "gemma2",
            "gemma3_text" => "gemma3_text",
            "qwen2" => "qwen2",
            "qwen3" => "qwen3",
            "mistral" => "mistral",
            "gemma" => "gemma",
            "phi3" => "phi3",
            "mixtral" => "mixtral",
            "qwen3_moe" => "qwen3_moe",
            _ => "llama",
        },
        qk_norm: qwen3 || gemma3,
        gemma,
        phi3,
        mlp_bias: flag("mlp_bias", false)?,
        dtype,
        qwen2,
        sliding_window,
        longrope,
        max_positions: match m.get("max_position_embeddings") {
            None | Some(Value::Null) => None,
            Some(_) => Some(int("max_position_embeddings", 1)?),
        },
        // LlamaConfig's and MistralConfig's defaults: bos 1, eos 2; Qwen2Config names none;
        // GemmaConfig bos 2, eos 1
        tokens: if gemma {
            tokens(m, path, Some(2), Some(1))?
        } else if phi3 {
            tokens(m, path, Some(1), Some(32000))?
        } else if qwen2 {
            tokens(m, path, None, None)?
        } else {
            tokens(m, path, Some(1), Some(2))?
        },
    })
}

/// The sparse MLP of a `mixtral` or `qwen3_moe` config of `layers` layers.
fn moe(m: &Map<String, Value>, path: &Path, mixtral: bool, layers: u64) -> Result<Moe, String> {
    let shown = path.display();
    let int = |k: &str, d: u64| int(m, path, k, d);
    let experts_key = if m.contains_key("num_experts") && !mixtral {
        "num_experts"
    } else {
        "num_local_experts"
    };
    // MixtralConfig's defaults: 8 experts, 2 per token; Qwen3MoeConfig's: 128 and 8
    let experts = int(experts_key, if mixtral { 8 } else { 128 })?;
    let top_k = int("num_experts_per_tok", if mixtral { 2 } else { 8 })?;
    if top_k == 0 || top_k > experts {
        return Err(format!(
            "{shown}: num_experts_per_tok ({top_k}) must be between 1 and {experts_key} ({experts})"
        ));
    }
    let aux = flag(m, path, "output_router_logits", false)?;
    if aux && !mixtral {
        return Err(format!(
            "{shown}: output_router_logits = true (the router's auxiliary loss) is modelled for mixtral only yet; false is"
        ));
    }
    if prob(m, path, "router_jitter_noise", 0.0)? != 0.0 {
        return Err(format!(
            "{shown}: router_jitter_noise above 0 is not modelled yet (its noise is a tensor per step); 0.0 is"
        ));
    }
    let intermediate = if mixtral {
        int("intermediate_size", 14336)?
    } else {
        int("moe_intermediate_size", 768)?
    };
    let step = if mixtral {
        1
    } else {
        int("decoder_sparse_step", 1)?
    };
    let only: Vec<u64> = match m.get("mlp_only_layers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_u64().filter(|&l| l < layers).ok_or_else(|| {
                    format!("{shown}: 'mlp_only_layers' must list layer indices below {layers}, found {v}")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(format!(
                "{shown}: 'mlp_only_layers' must be a list of layer indices, found {other}"
            ))
        }
    };
    if mixtral && !only.is_empty() {
        return Err(format!("{shown}: 'mlp_only_layers' is not a mixtral key"));
    }
    Ok(Moe {
        experts,
        top_k,
        intermediate,
        norm_topk: mixtral || flag(m, path, "norm_topk_prob", false)?,
        router_first: mixtral,
        weights_in_logits_dtype: !mixtral,
        aux_loss: aux,
        aux_coef: prob(m, path, "router_aux_loss_coef", 0.001)?,
        sparse: (0..layers)
            .map(|l| !only.contains(&l) && (l + 1) % step.max(1) == 0)
            .collect(),
    })
}
