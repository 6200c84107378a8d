//! Reading a Hugging Face `config.json` and its keys, for every family: the file itself, the
//! keys that change nothing (at any value, or at one), the `architectures` check, and typed
//! readers of a key with transformers' default (an integer, a flag, a probability, the dtype).

use std::path::Path;

use serde_json::{Map, Value};

/// At most this much of a config file is read (real ones are a few KiB).
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Keys of real configs that change nothing gpumem measures (token ids, labels, generation
/// defaults, bookkeeping, initialisation).
const INERT: &[&str] = &[
    "_name_or_path",
    "architectures",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "id2label",
    "label2id",
    "initializer_range",
    "transformers_version",
    "use_cache",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "problem_type",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "max_position_embeddings",
    "torch_dtype",
    "dtype",
    "tie_encoder_decoder",
    "tokenizer_class",
    "auto_map",
    // more token ids, tokenizer and generation defaults (generate's arguments come from the
    // workload, not the config)
    "sep_token_id",
    "cls_token_id",
    "mask_token_id",
    "unk_token_id",
    "decoder_start_token_id",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "max_length",
    "min_length",
    "do_sample",
    "early_stopping",
    "num_beams",
    "num_beam_groups",
    "diversity_penalty",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "output_scores",
    "return_dict_in_generate",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "task_specific_params",
    "finetuning_task",
    "prefix",
    "torchscript",
    "use_bfloat16",
    "tf_legacy_loss",
    "pruned_heads",
    "_attn_implementation_autoset",
    "_num_labels",
    // a training script's flag saved with the model: transformers 5 does not act on it (the
    // workload's gradient_checkpointing, or --gradient-checkpointing, decides)
    "gradient_checkpointing",
];

/// Keys that change nothing at one value and are refused at any other: (key, inert value,
/// why another is refused).
const INERT_AT: &[(&str, &str, &str)] = &[
    (
        "use_mrope",
        "false",
        "multimodal rotary positions (Qwen2-VL's) are not modelled",
    ),
    (
        "use_bidirectional_attention",
        "false",
        "bidirectional attention (an encoder's mask) is not modelled",
    ),
];

/// The heads each family models, by the `architectures` class name's suffix after the
/// family's prefix: what an `architectures` entry must name (the first one decides).
pub(super) fn check_architectures(
    m: &Map<String, Value>,
    path: &Path,
    family: &str,
    modelled: &[&str],
) -> Result<(), String> {
    let Some(v) = m.get("architectures") else {
        return Ok(());
    };
    let names: Vec<&str> = match v {
        Value::Null => return Ok(()),
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => {
            return Err(format!(
                "{}: 'architectures' must be a list of class names, found {v}",
                path.display()
            ))
        }
    };
    let Some(first) = names.first() else {
        return Ok(());
    };
    if modelled.contains(first) {
        return Ok(());
    }
    Err(format!(
        "{}: 'architectures' names {first}, whose head gpumem does not model yet for a {family} \
         config; it models {} (name that class first to measure it instead)",
        path.display(),
        modelled.join(", ")
    ))
}

/// A config.json's object (or the one in a folder's config.json).
pub(super) fn read(path: &Path) -> Result<Map<String, Value>, String> {
    let path = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let shown = path.display();
    let meta =
        std::fs::metadata(&path).map_err(|e| format!("cannot read the config {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("the config {shown} is not a regular file"));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "the config {shown} is {} bytes; a Hugging Face config.json is a few KiB",
            meta.len()
        ));
    }
    let text = crate::input::read_text(&path, crate::input::Kind::Text)
        .map_err(|e| format!("cannot read the config {shown}: {e}"))?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(format!("the config {shown} is not a JSON object")),
        Err(e) => Err(format!(
            "the config {shown}: line {} column {}: invalid JSON: {e}",
            e.line(),
            e.column()
        )),
    }
}

/// Refuses any key of `m` that is neither modelled (`modelled`, `extra_inert`) nor inert.
pub(super) fn known_keys(
    m: &Map<String, Value>,
    path: &Path,
    family: &str,
    modelled: &[&str],
    extra_inert: &[&str],
) -> Result<(), String> {
    for (key, inert, why) in INERT_AT {
        if let Some(v) = m.get(*key) {
            if !v.is_null() && v.to_string().as_str() != *inert {
                return Err(format!(
                    "{}: '{key}' is {v}: {why} (gpumem models {key} = {inert})",
                    path.display()
                ));
            }
        }
    }
    let inert: Vec<&str> = m
        .keys()
        .map(String::as_str)
        .filter(|k| {
            INERT.contains(k) || extra_inert.contains(k) || INERT_AT.iter().any(|(n, _, _)| n == k)
        })
        .filter(|k| !modelled.contains(k))
        .collect();
    if !inert.is_empty() {
        tracing::debug!(
            config = %path.display(),
            keys = %inert.join(", "),
            "config keys that change no memory, read and left alone"
        );
    }
    let unknown: Vec<&str> = m
        .keys()
        .map(String::as_str)
        .filter(|k| {
            !modelled.contains(k)
                && !INERT.contains(k)
                && !extra_inert.contains(k)
                && !INERT_AT.iter().any(|(n, _, _)| n == k)
        })
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{}: gpumem cannot model the key{} {} of a {family} config (it models {})",
        path.display(),
        if unknown.len() > 1 { "s" } else { "" },
        unknown
            .iter()
            .map(|k| format!("'{k}'"))
            .collect::<Vec<_>>()
            .join(", "),
        modelled.join(", ")
    ))
}

/// A positive integer key, or its default when absent or null.
/// The keys that set a model's size: missing from a config, transformers takes its config
/// class's default (as gpumem does), which is seldom the model the user means.
const SIZE_KEYS: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
];

/// Warns, once per file and key, that a size key is missing and its default stands in.
fn warn_size_default(path: &Path, key: &str, default: u64) {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static WARNED: OnceLock<Mutex<HashSet<(std::path::PathBuf, String)>>> = OnceLock::new();
    if !SIZE_KEYS.contains(&key) {
        return;
    }
    let first = WARNED
        .get_or_init(Default::default)
        .lock()
        .map(|mut w| w.insert((path.to_path_buf(), key.to_string())))
        .unwrap_or(false);
    if first {
        tracing::warn!(
            "{}: no '{key}': transformers' default for this model_type, {default}, is used (set \
             it in the config if the model differs)",
            path.display()
        );
    }
}

pub(super) fn int(
    m: &Map<String, Value>,
    path: &Path,
    key: &str,
    default: u64,
) -> Result<u64, String> {
    match m.get(key) {
        None | Some(Value::Null) => {
            warn_size_default(path, key, default);
            Ok(default)
        }
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if v >= 1 => match super::super::limits::exceeded(key, v) {
                None => Ok(v),
                Some(why) => Err(format!("{}: '{key}' must be at most {why}", path.display())),
            },
            _ => Err(format!(
                "{}: '{key}' must be a positive integer, found {n}",
                path.display()
            )),
        },
        Some(other) => Err(format!(
            "{}: '{key}' must be a positive integer, found {other}",
            path.display()
        )),
    }
}

/// A boolean key, or its default when absent or null.
pub(super) fn flag(
    m: &Map<String, Value>,
    path: &Path,
    key: &str,
    default: bool,
) -> Result<bool, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!(
            "{}: '{key}' must be true or false, found {other}",
            path.display()
        )),
    }
}

/// A probability key (a dropout rate), or its default.
pub(super) fn prob(
    m: &Map<String, Value>,
    path: &Path,
    key: &str,
    default: f64,
) -> Result<f64, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(p) if (0.0..=1.0).contains(&p) => Ok(p),
            _ => Err(format!(
                "{}: '{key}' must be a probability between 0 and 1, found {n}",
                path.display()
            )),
        },
        Some(other) => Err(format!(
            "{}: '{key}' must be a probability between 0 and 1, found {other}",
            path.display()
        )),
    }
}

/// `torch_dtype`/`dtype`, where it names a dtype gpumem knows (`fp16`: one it knows of but
/// does not model, which loading refuses unless `dtype` says what to run).
pub(super) fn config_dtype(m: &Map<String, Value>) -> Option<&'static str> {
    ["dtype", "torch_dtype"]
        .iter()
        .find_map(|k| m.get(*k).and_then(Value::as_str))
        .and_then(|d| match d {
            "float32" => Some("fp32"),
            "bfloat16" => Some("bf16"),
            "float16" => Some("fp16"),
            _ => None,
        })
}
