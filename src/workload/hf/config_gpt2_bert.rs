//! Reading a GPT-2 or BERT `config.json` (`GPT2Config`, `BertConfig`): every key modelled,
//! known not to change memory, or refused by name, as for the decoder families
//! ([`super::config`]).

use std::path::Path;

use serde_json::{Map, Value};

use super::config_keys::{check_architectures, config_dtype, flag, int, known_keys, prob};

/// GPT-2's activation, as transformers' `ACT2FN` computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gelu {
    /// `gelu_new`: NewGELUActivation's tanh formula in eight ops.
    New,
    /// `gelu` and `gelu_pytorch_tanh`: one `F.gelu`.
    Fused,
}

/// A `GPT2LMHeadModel`, as `GPT2Config` reads it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Gpt2Config {
    pub vocab: u64,
    pub positions: u64,
    pub hidden: u64,
    pub layers: u64,
    pub heads: u64,
    pub inner: u64,
    pub act: Gelu,
    pub resid_pdrop: f64,
    pub embd_pdrop: f64,
    pub attn_pdrop: f64,
    pub tie_embeddings: bool,
    pub dtype: Option<&'static str>,
    /// The special tokens `generate` makes tensors of (GPT2Config: bos and eos 50256).
    pub tokens: super::config::Tokens,
    /// `scale_attn_weights` on and `scale_attn_by_inverse_layer_idx` off (the defaults): the
    /// scaling eager attention was recorded with (sdpa's scale allocates nothing either way).
    pub default_scaling: bool,
}

/// The gpt2 config in `m`.
pub(super) fn gpt2(m: &Map<String, Value>, path: &Path) -> Result<Gpt2Config, String> {
    let shown = path.display();
    const MODELLED: &[&str] = &[
        "model_type",
        "vocab_size",
        "n_positions",
        "n_embd",
        "n_layer",
        "n_head",
        "n_inner",
        "activation_function",
        "resid_pdrop",
        "embd_pdrop",
        "attn_pdrop",
        "tie_word_embeddings",
        "add_cross_attention",
        "reorder_and_upcast_attn",
        // scaling only (SDPA's `scale`): no memory of its own
        "scale_attn_weights",
        "scale_attn_by_inverse_layer_idx",
        "layer_norm_epsilon",
    ];
    // GPT2DoubleHeadsModel's summary head and old generation settings: not GPT2LMHeadModel's
    const GPT2_INERT: &[&str] = &[
        "n_ctx",
        "summary_type",
        "summary_use_proj",
        "summary_activation",
        "summary_proj_to_labels",
        "summary_first_dropout",
        "task_specific_params",
    ];
    known_keys(m, path, "gpt2", MODELLED, GPT2_INERT)?;
    check_architectures(m, path, "gpt2", &["GPT2LMHeadModel"])?;
    if flag(m, path, "add_cross_attention", false)? {
        return Err(format!(
            "{shown}: add_cross_attention = true is not modelled (GPT2LMHeadModel without an encoder is)"
        ));
    }
    if flag(m, path, "reorder_and_upcast_attn", false)? {
        return Err(format!(
            "{shown}: reorder_and_upcast_attn = true is not modelled yet (its upcast attention allocates float32 scores)"
        ));
    }
    let act = match m.get("activation_function") {
        None | Some(Value::Null) => Gelu::New,
        Some(Value::String(a)) if a == "gelu_new" => Gelu::New,
        Some(Value::String(a)) if a == "gelu" || a == "gelu_pytorch_tanh" => Gelu::Fused,
        Some(other) => {
            return Err(format!(
                "{shown}: activation_function {other} is not modelled (gelu_new, gelu and gelu_pytorch_tanh are)"
            ))
        }
    };
    let hidden = int(m, path, "n_embd", 768)?;
    let heads = int(m, path, "n_head", 12)?;
    if hidden % heads != 0 {
        return Err(format!(
            "{shown}: n_embd ({hidden}) must be a multiple of n_head ({heads})"
        ));
    }
    Ok(Gpt2Config {
        vocab: int(m, path, "vocab_size", 50257)?,
        positions: int(m, path, "n_positions", 1024)?,
        hidden,
        layers: int(m, path, "n_layer", 12)?,
        heads,
        inner: int(m, path, "n_inner", 4 * hidden)?,
        act,
        resid_pdrop: prob(m, path, "resid_pdrop", 0.1)?,
        embd_pdrop: prob(m, path, "embd_pdrop", 0.1)?,
        attn_pdrop: prob(m, path, "attn_pdrop", 0.1)?,
        tie_embeddings: flag(m, path, "tie_word_embeddings", true)?,
        dtype: config_dtype(m),
        tokens: super::config::tokens(m, path, Some(50256), Some(50256))?,
        default_scaling: flag(m, path, "scale_attn_weights", true)?
            && !flag(m, path, "scale_attn_by_inverse_layer_idx", false)?,
    })
}

/// The head on a BERT encoder, from the config's `architectures` (none named: sequence
/// classification).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BertHead {
    /// `BertForSequenceClassification`: the pooler, dropout, a linear to `num_labels`.
    Classification,
    /// `BertForMaskedLM`: `cls.predictions` (dense, GELU, LayerNorm, the decoder to the
    /// vocabulary, tied to the word embeddings unless `tie_word_embeddings` is false).
    MaskedLm,
}

/// A `BertForSequenceClassification` or `BertForMaskedLM`, as `BertConfig` reads it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BertConfig {
    pub head: BertHead,
    /// The masked-LM decoder's weight is the word embeddings' (`tie_word_embeddings`).
    pub tie_embeddings: bool,
    pub vocab: u64,
    pub hidden: u64,
    pub layers: u64,
    pub heads: u64,
    pub intermediate: u64,
    pub positions: u64,
    pub type_vocab: u64,
    pub labels: u64,
    pub hidden_dropout: f64,
    pub attention_dropout: f64,
    pub classifier_dropout: f64,
    pub dtype: Option<&'static str>,
}

/// The bert config in `m`.
pub(super) fn bert(m: &Map<String, Value>, path: &Path) -> Result<BertConfig, String> {
    let shown = path.display();
    const MODELLED: &[&str] = &[
        "model_type",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "classifier_dropout",
        "max_position_embeddings",
        "type_vocab_size",
        "num_labels",
        "position_embedding_type",
        "is_decoder",
        "add_cross_attention",
        "layer_norm_eps",
        // the masked-LM head's decoder (the classifier has nothing to tie)
        "tie_word_embeddings",
    ];
    known_keys(m, path, "bert", MODELLED, &[])?;
    const HEADS: &[&str] = &["BertForSequenceClassification", "BertForMaskedLM"];
    check_architectures(m, path, "bert", HEADS)?;
    let head = match m.get("architectures").and_then(Value::as_array) {
        Some(a) if a.first().and_then(Value::as_str) == Some("BertForMaskedLM") => {
            BertHead::MaskedLm
        }
        _ => BertHead::Classification,
    };
    for key in ["is_decoder", "add_cross_attention"] {
        if flag(m, path, key, false)? {
            return Err(format!(
                "{shown}: {key} = true is not modelled (BERT as an encoder is)"
            ));
        }
    }
    match m.get("position_embedding_type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "absolute" => {}
        Some(other) => {
            return Err(format!(
                "{shown}: position_embedding_type {other} is not modelled (absolute is)"
            ))
        }
    }
    match m.get("hidden_act") {
        None | Some(Value::Null) => {}
        Some(Value::String(a)) if a == "gelu" => {}
        Some(other) => {
            return Err(format!(
                "{shown}: hidden_act {other} is not modelled (gelu is)"
            ))
        }
    }
    let hidden = int(m, path, "hidden_size", 768)?;
    let heads = int(m, path, "num_attention_heads", 12)?;
    if hidden % heads != 0 {
        return Err(format!(
            "{shown}: hidden_size ({hidden}) must be a multiple of num_attention_heads ({heads})"
        ));
    }
    // PretrainedConfig: num_labels, else as many as id2label names, else 2
    let labels = match (m.get("num_labels"), m.get("id2label")) {
        (Some(v), _) if !v.is_null() => int(m, path, "num_labels", 2)?,
        (_, Some(Value::Object(names))) if !names.is_empty() => names.len() as u64,
        _ => 2,
    };
    let hidden_dropout = prob(m, path, "hidden_dropout_prob", 0.1)?;
    Ok(BertConfig {
        head,
        tie_embeddings: flag(m, path, "tie_word_embeddings", true)?,
        vocab: int(m, path, "vocab_size", 30522)?,
        hidden,
        layers: int(m, path, "num_hidden_layers", 12)?,
        heads,
        intermediate: int(m, path, "intermediate_size", 3072)?,
        positions: int(m, path, "max_position_embeddings", 512)?,
        type_vocab: int(m, path, "type_vocab_size", 2)?,
        labels,
        hidden_dropout,
        attention_dropout: prob(m, path, "attention_probs_dropout_prob", 0.1)?,
        classifier_dropout: prob(m, path, "classifier_dropout", hidden_dropout)?,
        dtype: config_dtype(m),
    })
}
