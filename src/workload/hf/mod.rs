//! Models from a Hugging Face `config.json`: `[model] hf_config = "config.json"` with
//! `[train]` (and `[generate]`) builds the model transformers builds from that config and runs
//! the loop of ../shared/tools/hf_models.py, expanded into the same line-language statements a
//! user would write, each op tagged with its module path (`model.layers.3.self_attn.q_proj`).
//!
//! The config is read whole; every key is either modelled, known not to change memory, or
//! refused by name (exit 2): gpumem never approximates a config it cannot model.
//!
//! Families: `llama`, `mistral`, `qwen2`, `qwen3`, `gemma`, `gemma2`, `gemma3_text` and
//! `phi3` ([`llama`]), `gpt2` ([`gpt2`]), `bert` ([`bert`]); the loop around them, the
//! causal-LM loss and peft's LoRA linear in [`train`]; `mode = "generate"` and its
//! `[generate]` table, `model.generate` for the decoder families and GPT-2, in [`generate`];
//! `[distributed]` (DDP, FSDP2, ZeRO) in [`distributed`].
//! Mixture-of-experts configs (`mixtral`, `qwen3_moe`) run in float32 with sdpa (training,
//! inference, generation; their bf16, checkpointed and eager runs are refused by name, not
//! recorded yet); multimodal configs are refused by name.

mod bert;
mod config;
mod config_gpt2_bert;
mod config_keys;
mod distributed;
mod generate;
mod gpt2;
mod llama;
mod llama_setup;
mod masks;
mod moe;
mod norms;
mod train;

use std::path::Path;

use toml::{Spanned, Value};

use super::ast::Span;
use super::error::{PResult, SyntaxError};
use super::preset::{Expanded, PresetInfo, Reader, Table};

pub(crate) use config::LlamaConfig;
use distributed::{distributed_run, Distributed};
pub(crate) use distributed::{Ddp, Fsdp2, ZeroRun};
pub(crate) use generate::Generate;

/// The keys of `[generate]`.
pub const GENERATE_KEYS: &[&str] = &["new_tokens", "min_new_tokens", "pad_token_id"];

/// The keys of `[model]` for a Hugging Face config.
pub const MODEL_KEYS: &[&str] = &[
    "hf_config",
    "attention",
    "dtype",
    "gradient_checkpointing",
    "lora",
];

/// The keys of `[model.lora]` (peft's `LoraConfig`).
pub const LORA_KEYS: &[&str] = &["r", "alpha", "dropout", "target_modules"];

/// peft's `get_peft_model(model, LoraConfig(r, lora_alpha, lora_dropout, target_modules))`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Lora {
    pub r: u64,
    pub alpha: f64,
    pub dropout: f64,
    pub targets: Vec<String>,
    /// `target_modules` as written, resolved against the family's linears once the config is
    /// read ([`Lora::resolve`]).
    pub spec: Targets,
}

/// `target_modules` as the workload gives it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Targets {
    /// Left out: peft's default for the model type (the query and value projections; Phi-3's
    /// fused `qkv_proj`).
    Default,
    /// peft's `"all-linear"`: every linear of the decoder layers (not the output head).
    AllLinear,
    /// gpumem's `"attention"`: every projection of the attention (the remedies' LoRA).
    Attention,
    Names(Vec<String>),
}

impl Lora {
    /// Resolves `target_modules` against the linears of the family (`linears`, in module
    /// order; `attention` the attention's, `default` peft's default), or names the module the
    /// family does not have.
    pub(crate) fn resolve(
        &mut self,
        linears: &[&str],
        attention: &[&str],
        default: &[&str],
        family: &str,
    ) -> Result<(), String> {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        self.targets = match &self.spec {
            Targets::Default => own(default),
            Targets::AllLinear => own(linears),
            Targets::Attention => own(attention),
            Targets::Names(n) => {
                if let Some(bad) = n.iter().find(|x| !linears.contains(&x.as_str())) {
                    return Err(format!(
                        "target_modules in [model.lora]: a {family} model has no linear named {bad:?} (its linears: {}; or \"all-linear\", \"attention\")",
                        linears.join(", ")
                    ));
                }
                n.clone()
            }
        };
        Ok(())
    }
}
/// The keys of `[train]` for a Hugging Face config.
pub const TRAIN_KEYS: &[&str] = &[
    "batch",
    "seq",
    "iterations",
    "optimizer",
    "precision",
    "mode",
    "grad_accum",
    "labels",
];

/// The LoRA that the out-of-memory remedies try in place of a full fine-tune: r 16 on the
/// attention's four projections (alpha 32, no dropout), as `[model.lora]` holds it.
pub(crate) fn attention_lora() -> Value {
    let mut t = toml::Table::new();
    t.insert("r".into(), Value::Integer(16));
    t.insert("alpha".into(), Value::Integer(32));
    t.insert("target_modules".into(), Value::String("attention".into()));
    Value::Table(t)
}

/// What the workload asks of the model and its loop.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub batch: u64,
    pub seq: u64,
    pub iterations: u32,
    /// Micro-batches of `batch` per optimizer step (`[train] grad_accum`, default 1): each
    /// forward and backward in turn, the loss divided by the count, then one step.
    pub grad_accum: u64,
    pub optimizer: &'static str,
    pub bf16_autocast: bool,
    /// `train`, `inference` or `generate`.
    pub mode: &'static str,
    /// With `mode = "generate"`: the `[generate]` table.
    pub generate: Option<Generate>,
    pub eager: bool,
    pub bf16_weights: bool,
    pub checkpointing: bool,
    pub lora: Option<Lora>,
    /// `[train] labels = "input_ids"`: the inputs themselves are the labels
    /// (`model(input_ids=x, labels=x)`, the loss read off the output: `out.loss.backward()`,
    /// `del out, x`); the default `"clone"` is hf_models.py's `x.clone()` and its `loss` name.
    pub labels_are_inputs: bool,
    /// `[distributed]` with DDP.
    pub ddp: Option<Ddp>,
    /// `[distributed]` with FSDP2.
    pub fsdp: Option<Fsdp2>,
    /// `[distributed]` with ZeRO stage 1 or 2.
    pub zero: Option<ZeroRun>,
    /// What this run combines that is modelled but not yet recorded (said with the figures).
    pub unrecorded: Vec<String>,
}

/// What a config's run assumes, in a line: the mode and shapes, the weights' dtype and how
/// they are trained, the optimizer, the attention and the iterations (`run` prints it under
/// its header, since a bare config leaves most of them to defaults).
fn assumptions(run: &Run) -> String {
    let mut parts = Vec::new();
    match (run.mode, &run.generate) {
        ("generate", Some(g)) => parts.push(format!(
            "generate (greedy, DynamicCache): batch {}, prompt {} + {} new tokens",
            run.batch, run.seq, g.new_tokens
        )),
        (mode, _) => parts.push(format!(
            "{}: batch {} x seq {}{}",
            if mode == "inference" {
                "inference (no_grad)"
            } else {
                mode
            },
            run.batch,
            run.seq,
            if run.grad_accum > 1 {
                format!(" x {} accumulated", run.grad_accum)
            } else {
                String::new()
            }
        )),
    }
    parts.push(format!(
        "{} weights",
        if run.bf16_weights { "bf16" } else { "float32" }
    ));
    if run.bf16_autocast {
        parts.push("bf16 autocast".into());
    }
    if run.mode == "train" {
        match &run.lora {
            Some(l) => parts.push(format!(
                "LoRA r {} (alpha {}) on {}, the base frozen",
                l.r,
                l.alpha,
                l.targets.join(", ")
            )),
            None => parts.push("every weight trained".into()),
        }
        if run.checkpointing {
            parts.push("gradient checkpointing".into());
        }
        parts.push(match run.optimizer {
            "adamw" => "AdamW".into(),
            "adam" => "Adam".into(),
            "none" => "no optimizer step".into(),
            other => other.to_string(),
        });
    }
    parts.push(format!(
        "{} attention",
        if run.eager { "eager" } else { "sdpa" }
    ));
    if let Some(d) = &run.ddp {
        parts.push(format!("DDP, world size {}", d.world_size));
    }
    if let Some(f) = &run.fsdp {
        parts.push(format!("FSDP2, world size {}", f.world_size));
    }
    if let Some(z) = &run.zero {
        parts.push(format!(
            "ZeRO stage {}, world size {}",
            z.stage, z.world_size
        ));
    }
    parts.push(format!(
        "{} iteration{}",
        run.iterations,
        if run.iterations == 1 { "" } else { "s" }
    ));
    parts.join(", ")
}

/// Is this `[model]` table a Hugging Face one?
pub(crate) fn is_hf(model: &Table) -> bool {
    model.contains_key("hf_config")
}

/// Expands `[model] hf_config = ...` and `[train]`. `base` is the workload's folder (the
/// config's path is relative to it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn expand(
    model: &Table,
    model_at: Span,
    train: Option<&Table>,
    train_at: Span,
    generate: Option<(&Table, Span)>,
    distributed: Option<(&Table, Span)>,
    base: &Path,
    span: &dyn Fn(usize) -> Span,
) -> PResult<Expanded> {
    let m = Reader {
        table: model,
        name: "model",
        at: model_at,
        absent: false,
        span,
    };
    m.check_keys(MODEL_KEYS, " for a Hugging Face config (hf_config)")?;
    let cfg_v = model.get("hf_config").expect("is_hf");
    let cfg_at = m.pos(cfg_v);
    let path = match cfg_v.get_ref() {
        Value::String(p) if !p.is_empty() => base.join(p),
        _ => {
            return Err(SyntaxError::new(
                cfg_at,
                "'hf_config' in [model] must be the path of a Hugging Face config.json (or of \
                 a folder holding one), as hf_config = \"config.json\"",
            ))
        }
    };
    let json = config_keys::read(&path).map_err(|m| SyntaxError::new(cfg_at, m))?;
    let empty = Table::new();
    let t = Reader {
        table: train.unwrap_or(&empty),
        name: "train",
        // with no [train] table, a missing key is reported at [model]
        at: if train.is_some() { train_at } else { model_at },
        absent: train.is_none(),
        span,
    };
    t.check_keys(TRAIN_KEYS, " for a Hugging Face config")?;
    let cfg = config::family(&json, &path).map_err(|m| SyntaxError::new(cfg_at, m))?;
    let cfg_dtype = match &cfg {
        config::Family::Llama(c) => c.dtype,
        config::Family::Gpt2(c) => c.dtype,
        config::Family::Bert(c) => c.dtype,
    };
    let dtype = match model.get("dtype") {
        // transformers loads a checkpoint in its own dtype; float16 is not modelled (its
        // sizes are bf16's, its kernels' are not checked): said, not run as float32
        None if cfg_dtype == Some("fp16") => {
            return Err(SyntaxError::new(
                cfg_at,
                format!(
                    "the config {}: key '{}': float16, which transformers loads as \
                     float16 and gpumem does not model: give the weights' dtype: dtype = \
                     \"bf16\" (--dtype bf16) has float16's sizes, 2 bytes a weight; dtype = \
                     \"fp32\" (--dtype fp32) loads them in float32",
                    path.display(),
                    // (the key that says it: `dtype` is read before `torch_dtype`)
                    if json.get("dtype").and_then(|v| v.as_str()).is_some() {
                        "dtype"
                    } else {
                        "torch_dtype"
                    }
                ),
            ));
        }
        None => cfg_dtype.unwrap_or("fp32"),
        Some(_) => m.choice("dtype", "fp32", &["fp32", "bf16"])?,
    };
    let iterations = t.iterations()?;
    let mut run = Run {
        batch: t.int("batch", None, "the batch size, e.g. batch = 4")?,
        seq: t.int("seq", None, "tokens per sample, e.g. seq = 1024")?,
        iterations,
        grad_accum: t.int(
            "grad_accum",
            Some(1),
            "micro-batches per step, e.g. grad_accum = 4",
        )?,
        optimizer: t.choice("optimizer", "adamw", crate::workload::OPTIMIZER_NAMES)?,
        bf16_autocast: t.choice("precision", "fp32", &["fp32", "bf16-autocast"])?
            == "bf16-autocast",
        mode: t.choice("mode", "train", &["train", "inference", "generate"])?,
        eager: m.choice("attention", "sdpa", &["sdpa", "eager"])? == "eager",
        bf16_weights: dtype == "bf16",
        checkpointing: m.flag("gradient_checkpointing")?,
        lora: lora(&m)?,
        generate: None,
        labels_are_inputs: t.choice("labels", "clone", &["clone", "input_ids"])? == "input_ids",
        ddp: None,
        fsdp: None,
        zero: None,
        unrecorded: Vec::new(),
    };
    // an encoder has no generation: say so before asking for [generate]
    if run.mode == "generate" && matches!(cfg, config::Family::Bert(_)) {
        return Err(SyntaxError::new(
            value_at(&t, "mode"),
            "generation (bert is an encoder) is not modelled: BertForMaskedLM and BertForSequenceClassification have no `generate`; run mode = \"train\" or \"inference\"",
        ));
    }
    run.generate = generate_table(&run, &t, generate, span)?;
    let micro = u64::from(run.iterations).saturating_mul(run.grad_accum);
    if micro > crate::workload::preset::MAX_MICRO_BATCHES {
        return Err(SyntaxError::new(
            value_at(&t, "grad_accum"),
            format!(
                "iterations x grad_accum is {micro} micro-batches, more than the {} gpumem runs: \
                 a few iterations show the memory of every one",
                crate::units::group_digits(crate::workload::preset::MAX_MICRO_BATCHES)
            ),
        ));
    }
    // training's settings change nothing without a backward: refused, not dropped
    if run.mode != "train" {
        if run.checkpointing {
            return Err(SyntaxError::new(
                value_at(&m, "gradient_checkpointing"),
                format!(
                    "gradient checkpointing applies to training: mode = \"{}\" runs no backward \
                     (transformers recomputes layers only while training), so it would change \
                     nothing; remove it, or train (mode = \"train\")",
                    run.mode
                ),
            ));
        }
        if t.table.contains_key("optimizer") && run.optimizer != "none" {
            return Err(SyntaxError::new(
                value_at(&t, "optimizer"),
                format!(
                    "an optimizer steps in training only: mode = \"{}\" has no optimizer step; \
                     remove it, or train (mode = \"train\")",
                    run.mode
                ),
            ));
        }
    }
    if run.grad_accum > 1 && run.mode != "train" {
        return Err(SyntaxError::new(
            value_at(&t, "grad_accum"),
            "grad_accum applies to training, which only mode = \"train\" runs",
        ));
    }
    if let Some(l) = &mut run.lora {
        // the family's linears, its attention's, and peft's default targets for it
        let (linears, attention, default, family): (Vec<&str>, Vec<&str>, &[&str], &str) =
            match &cfg {
                config::Family::Llama(c) => (
                    llama_setup::lora_targets(c, false),
                    llama_setup::lora_targets(c, true),
                    if c.phi3 {
                        &["qkv_proj"]
                    } else {
                        &["q_proj", "v_proj"]
                    },
                    c.model_type,
                ),
                config::Family::Gpt2(_) => (
                    gpt2::LORA_TARGETS.to_vec(),
                    vec!["c_attn", "c_proj"],
                    &["c_attn"],
                    "gpt2",
                ),
                config::Family::Bert(_) => {
                    if l.spec == Targets::AllLinear {
                        return Err(SyntaxError::new(
                            value_at(&m, "lora"),
                            "target_modules = \"all-linear\" is not modelled yet for bert (its dense layers); name query, key or value",
                        ));
                    }
                    (
                        bert::LORA_TARGETS.to_vec(),
                        bert::LORA_TARGETS.to_vec(),
                        &["query", "value"],
                        "bert (its self-attention's)",
                    )
                }
            };
        l.resolve(&linears, &attention, default, family)
            .map_err(|msg| SyntaxError::new(value_at(&m, "lora"), msg))?;
    }
    // bf16 from the config's own torch_dtype: how to run it in float32 instead
    let dtype_hint = |key: &str| {
        if key == "dtype" && model.get("dtype").is_none() {
            " (the config's torch_dtype; 'dtype' = \"fp32\", or --dtype fp32, runs it in float32)"
        } else {
            ""
        }
    };
    let unsupported = |key: &str, what: &str| -> PResult<()> {
        // the key's own line: [train]'s where it is written there, else [model]'s
        let in_train = key == "mode" || key == "precision" || t.table.contains_key(key);
        Err(SyntaxError::new(
            value_at(if in_train { &t } else { &m }, key),
            format!("{what} is not modelled yet (gpumem refuses what it has not matched against PyTorch rather than approximate it); remove '{key}' or set it to its default"),
        ))
    };
    if run.mode == "generate" {
        // (eager attention in a model with sliding layers would build the window's mask at
        // every step, and GPT-2's eager generation is another code path: neither modelled)
        let eager_refused = run.eager
            && match &cfg {
                config::Family::Llama(c) => llama::any_sliding(c),
                _ => true,
            };
        // (BERT's generation is refused before [generate] is read)
        let what = if eager_refused {
            Some((
                "attention",
                "generation with eager attention (for gpt2 or with sliding-window layers)",
            ))
        } else if run.bf16_autocast {
            Some(("precision", "generation under bf16 autocast"))
        } else if run.checkpointing {
            Some((
                "gradient_checkpointing",
                "gradient checkpointing in generation",
            ))
        } else {
            None
        };
        if let Some((key, what)) = what {
            unsupported(key, what)?;
        }
        if run.eager {
            run.unrecorded
                .push("generation with eager attention".to_string());
        }
        if run.lora.is_some() {
            // peft's forward around each targeted linear, its dropout the identity in eval
            run.unrecorded
                .push("generation with LoRA adapters".to_string());
        }
    }
    if let config::Family::Llama(c) = &cfg {
        // LongRoPE past its original context switches to the long factors, computing them on
        // the device the first time: not modelled
        if let Some(orig) = c.longrope {
            let longest = run.seq + run.generate.as_ref().map_or(0, |g| g.new_tokens);
            if longest > orig {
                return Err(SyntaxError::new(
                    value_at(&t, "seq"),
                    format!(
                        "{longest} positions are past LongRoPE's original_max_position_embeddings = {orig} (in {}): its long factors are not modelled yet; at most {orig} positions are",
                        path.display()
                    ),
                ));
            }
        }
    }
    let (family, positions) = match &cfg {
        config::Family::Llama(_) => ("llama", None),
        config::Family::Gpt2(c) => ("gpt2", Some((c.positions, "n_positions"))),
        config::Family::Bert(c) => ("bert", Some((c.positions, "max_position_embeddings"))),
    };
    if let config::Family::Llama(c) = &cfg {
        // a sliding window whose mask the forward makes (sdpa skips it below the window's
        // length: the layers attend as full ones), or any in generation, whose cache the window
        // trims
        let w = c.sliding_window.unwrap_or(u64::MAX);
        let sliding = c.sliding_layers.iter().any(|&x| x);
        if run.mode == "generate" && sliding {
            // generation within the window and past it (the last step attends to seq + new
            // - 1 positions; its mask is made from the 2-D mask and taken as a bias, by the
            // memory-efficient kernel in float32, padded to a multiple of 8 keys, by cuDNN in
            // bf16, whose decode step over more than 512 keys takes its split-key workspace;
            // the cache is trimmed), from a prompt shorter than the window or reaching it (the
            // prefill's window mask over the prompt, the cache its last `sliding_window - 1`
            // positions): every case runs
        } else if masks::sliding_mask_window(c, run.seq, run.eager).is_some() {
            // what the sliding windows are recorded with in training and inference: float32
            // with sdpa (Mistral, Gemma-3), plain or with LoRA, LoRA over bf16 weights, and
            // Gemma-2's eager attention; the other families' eager attention takes the same
            // window mask (made as Gemma-2's, in the embeddings' dtype), not recorded
            let bare = Run {
                bf16_weights: false,
                ..run.clone()
            };
            if let Some((key, what)) = beyond_recorded(&bare) {
                unsupported(
                    key,
                    &format!(
                        "{what}{} with a sliding window (sliding_window = {w} of {})",
                        dtype_hint(key),
                        c.model_type
                    ),
                )?;
            }
            if run.eager && !c.sandwich {
                run.unrecorded
                    .push("eager attention with a sliding window".to_string());
            }
        }
    }
    // a mixture-of-experts model with eager attention or autocast and another setting: named
    // whole in one warning (below), not part by part
    let moe_combined = matches!(&cfg, config::Family::Llama(c) if c.moe.is_some())
        && ((run.eager && (run.bf16_autocast || run.bf16_weights || run.checkpointing))
            || (run.bf16_autocast && run.checkpointing));
    if let config::Family::Llama(c) = &cfg {
        // the experts are matched against PyTorch with sdpa in float32 and in bf16 weights
        // (training, LoRA, inference and generation, whose decode steps switch to
        // batched_mm), with HF gradient checkpointing in float32, under bf16 autocast and
        // with eager attention in float32 (Mixtral's, H100 2026-12-05); eager attention or
        // autocast with another of these composes what each does, not recorded together
        if moe_combined {
            let parts: Vec<&str> = [
                (run.eager, "eager attention"),
                (run.bf16_weights, "bf16 weights"),
                (run.bf16_autocast, "bf16 autocast"),
                (run.checkpointing, "gradient checkpointing"),
            ]
            .iter()
            .filter_map(|&(on, what)| on.then_some(what))
            .collect();
            run.unrecorded.push(format!(
                "{} in a mixture-of-experts model ({})",
                parts.join(" with "),
                c.model_type
            ));
        }
    }
    if let Some((table, at)) = distributed {
        match distributed_run(table, at, span, &run, family)? {
            Distributed::Ddp(d) => run.ddp = Some(d),
            Distributed::Zero(z) => {
                let refused = if run.lora.is_some() {
                    Some(("lora", "ZeRO with LoRA"))
                } else if run.bf16_autocast {
                    Some(("precision", "ZeRO under bf16 autocast"))
                } else if run.grad_accum > 1 {
                    Some(("grad_accum", "ZeRO with gradient accumulation"))
                } else if run.optimizer != "adamw" && run.optimizer != "adam" {
                    Some((
                        "optimizer",
                        "ZeRO around an optimizer other than Adam or AdamW (DeepSpeed's FusedAdam is modelled)",
                    ))
                } else {
                    None
                };
                if let Some((key, what)) = refused {
                    unsupported(key, what)?;
                }
                run.zero = Some(z);
            }
            Distributed::Fsdp2(mut f) => {
                // the layers compute with the unsharded parameters in param_dtype, as with
                // bf16 weights (the buffers stay float32)
                f.weights_bf16 = run.bf16_weights;
                run.bf16_weights |= f.param_bf16;
                run.fsdp = Some(f);
            }
        }
        // LoRA and autocast inside DDP (the buckets hold the adapters' gradients alone) and
        // FSDP2 (frozen parameters gathered, only the adapters' gradients reduced) follow
        // PyTorch 2.11's source but are not recorded yet: said so with the figures
        let strategy = match (&run.ddp, &run.fsdp) {
            (Some(_), _) => Some("DDP"),
            (_, Some(_)) => Some("FSDP2"),
            _ => None,
        };
        if let Some(st) = strategy {
            if run.lora.is_some() {
                run.unrecorded.push(format!("{st} with LoRA"));
            }
            if run.bf16_autocast {
                run.unrecorded.push(format!("{st} under bf16 autocast"));
            }
        }
    }
    // (GPT-2 with bf16 weights: matched against PyTorch, LoRA or not)
    // (BERT over bf16 weights: tried against a recorded masked-LM LoRA case)
    let bf16_refused = run.bf16_weights && family != "gpt2" && family != "bert";
    // (GPT-2 under bf16 autocast: matched against PyTorch in training)
    let autocast_refused = run.bf16_autocast && family != "gpt2";
    // (GPT-2's eager attention: float32 training without checkpointing, with its default
    // scaling, matched against PyTorch)
    let gpt2_eager_recorded = match &cfg {
        config::Family::Gpt2(c) => {
            c.default_scaling
                && !run.bf16_weights
                && !run.bf16_autocast
                && !run.checkpointing
                && run.mode == "train"
        }
        _ => false,
    };
    let eager_refused = run.eager && !gpt2_eager_recorded;
    if family != "llama" && (eager_refused || autocast_refused || bf16_refused) {
        let (key, what) = if eager_refused {
            let what = if family == "gpt2" {
                "eager attention for gpt2 beyond float32 training without checkpointing, with \
                 the default scale_attn_weights"
                    .to_string()
            } else {
                format!("eager attention for {family}")
            };
            ("attention", what)
        } else if autocast_refused {
            ("precision", format!("bf16 autocast for {family}"))
        } else {
            ("dtype", format!("bf16 weights for {family}"))
        };
        unsupported(key, &what)?;
    }
    if run.bf16_weights && run.bf16_autocast && family == "gpt2" {
        // (GPT-2's layer norms run in float32 under autocast: over bf16 weights that casts
        // them, which no recording has checked)
        unsupported("precision", "bf16 weights under bf16 autocast for gpt2")?;
    }
    if run.bf16_weights && family == "llama" && !moe_combined {
        // Llama-style models: eager attention's `softmax(dtype=float32)` converts the bf16
        // scores first and saves its float32 output (ATen's half-to-float shortcut is for
        // float16 alone), and the mask is made in the embeddings' dtype; under autocast over
        // bf16 weights every cast is to the dtype a tensor has already (no copy), the norms
        // and the loss upcasting by hand as without it
        if run.eager {
            run.unrecorded
                .push("bf16 weights with eager attention".to_string());
        }
        if run.bf16_autocast {
            run.unrecorded
                .push("bf16 weights under bf16 autocast".to_string());
        }
    }
    if let Some((p, key)) = positions {
        if run.seq > p {
            return Err(SyntaxError::new(
                value_at(&t, "seq"),
                format!(
                    "seq = {} is longer than the model's {p} positions ({key} in {})",
                    run.seq,
                    path.display()
                ),
            ));
        }
        // learned absolute positions: the last token fed in a generation (the prompt, then
        // each generated token but the last) must have a row of the position embedding
        if let Some(g) = run.generate.as_ref().filter(|_| run.mode == "generate") {
            let last = run.seq + g.new_tokens.saturating_sub(1);
            if last > p {
                return Err(SyntaxError::new(
                    value_at(&t, "seq"),
                    format!(
                        "seq = {} prompt tokens and new_tokens = {} feed {last} positions, past \
                         the model's {p} ({key} in {}): its learned position embedding has no \
                         row past them (PyTorch raises an index error); at most {} new tokens \
                         follow this prompt",
                        run.seq,
                        g.new_tokens,
                        path.display(),
                        p + 1 - run.seq
                    ),
                ));
            }
        }
    }
    let (setup, body) = match &cfg {
        config::Family::Llama(c) if run.mode == "generate" => {
            let g = run.generate.as_ref().expect("checked with the mode");
            (
                llama_setup::setup(c, &run),
                generate::body(generate::Model::Llama(c), &run, g),
            )
        }
        config::Family::Gpt2(c) if run.mode == "generate" => {
            let g = run.generate.as_ref().expect("checked with the mode");
            (
                gpt2::setup(c, &run),
                generate::body(generate::Model::Gpt2(c), &run, g),
            )
        }
        config::Family::Llama(c) => llama::expand(c, &run),
        config::Family::Gpt2(c) => gpt2::expand(c, &run),
        config::Family::Bert(c) => bert::expand(c, &run),
    };
    let kind = family;
    let info = PresetInfo {
        kind,
        ints: {
            let mut ints = vec![
                ("batch".into(), run.batch),
                ("seq".into(), run.seq),
                ("iterations".into(), run.iterations as u64),
            ];
            if run.mode == "train" {
                ints.push(("grad_accum".into(), run.grad_accum));
            }
            if let Some(g) = &run.generate {
                ints.push(("new_tokens".into(), g.new_tokens));
            }
            ints
        },
        optimizer: run.optimizer,
        bf16: run.bf16_autocast,
        checkpointing: run.checkpointing,
        mode: run.mode,
        keep_tensor: false,
        full_finetune: run.mode == "train" && run.lora.is_none(),
        distributed: match (&run.ddp, &run.fsdp) {
            (Some(d), _) => Some(super::preset::DistributedInfo {
                strategy: "ddp",
                world_size: d.world_size,
                reshard_after_forward: true,
                cpu_offload: false,
                param_bf16: false,
                reduce_bucket_size: None,
            }),
            (None, Some(f)) => Some(super::preset::DistributedInfo {
                strategy: "fsdp2",
                world_size: f.world_size,
                reshard_after_forward: f.reshard_after_forward,
                cpu_offload: f.cpu_offload,
                param_bf16: f.param_bf16,
                reduce_bucket_size: None,
            }),
            (None, None) => run.zero.as_ref().map(|z| super::preset::DistributedInfo {
                strategy: match z.stage {
                    1 => "zero1",
                    2 => "zero2",
                    _ => "zero3",
                },
                world_size: z.world_size,
                reshard_after_forward: true,
                cpu_offload: z.offload_optimizer,
                param_bf16: false,
                reduce_bucket_size: Some(z.reduce_bucket_size),
            }),
        },
        bf16_weights: run.bf16_weights,
        assumptions: Some(assumptions(&run)),
        unrecorded: run.unrecorded.clone(),
        max_positions: match &cfg {
            config::Family::Llama(c) => c.max_positions,
            _ => None,
        },
        kv_cache: {
            // per layer and token: the key/value heads' width, the layers, the sliding window
            // and the positions the model has (GPT-2: every head, n_positions)
            let shape = match &cfg {
                config::Family::Llama(c) => Some((
                    c.kv_heads * c.head_dim,
                    c.layers,
                    c.sliding_window,
                    (0..c.layers)
                        .filter(|&l| llama::sliding_layer(c, l))
                        .count() as u64,
                    c.max_positions,
                )),
                config::Family::Gpt2(c) => Some((c.hidden, c.layers, None, 0, Some(c.positions))),
                config::Family::Bert(_) => None,
            };
            shape.filter(|_| run.mode == "generate").map(
                |(width, layers, sliding_window, sliding_layers, max_positions)| {
                    // the cache takes the keys' dtype: float32 unless the weights are bf16
                    let bytes = if run.bf16_weights { 2 } else { 4 };
                    let per_layer = 2 * width * bytes;
                    super::preset::KvCacheInfo {
                        bytes_per_token: per_layer * layers * run.batch,
                        bytes_per_token_per_layer: per_layer,
                        layers,
                        batch: run.batch,
                        dtype: if run.bf16_weights { "bf16" } else { "float32" },
                        sliding_window: sliding_window.filter(|_| sliding_layers > 0),
                        sliding_layers,
                        prompt: run.seq,
                        max_positions,
                    }
                },
            )
        },
        // what the checks above take under bf16 autocast
        can_autocast: match &cfg {
            config::Family::Llama(c) => masks::sliding_mask_window(c, run.seq, run.eager).is_none(),
            config::Family::Gpt2(_) => !run.eager,
            config::Family::Bert(_) => false,
        } && !run.bf16_weights
            && run.mode != "generate",
    };
    Ok(Expanded {
        kind,
        iterations: run.iterations,
        setup,
        body,
        info,
        weights: None,
    })
}

/// `[generate]`: needed with `mode = "generate"`, refused without it.
fn generate_table(
    run: &Run,
    t: &Reader<'_>,
    table: Option<(&Table, Span)>,
    span: &dyn Fn(usize) -> Span,
) -> PResult<Option<Generate>> {
    let Some((table, at)) = table else {
        if run.mode == "generate" {
            return Err(SyntaxError::new(
                value_at(t, "mode"),
                "mode = \"generate\" needs a [generate] table with new_tokens = N, the tokens to generate (a bare config: --new-tokens N)",
            ));
        }
        return Ok(None);
    };
    if run.mode != "generate" {
        return Err(SyntaxError::new(
            at,
            format!(
                "[generate] is read with mode = \"generate\" in [train] (the mode is \"{}\"): set the mode or remove [generate]",
                run.mode
            ),
        ));
    }
    let g = Reader {
        table,
        name: "generate",
        at,
        absent: false,
        span,
    };
    g.check_keys(GENERATE_KEYS, "")?;
    let new_tokens = g.int(
        "new_tokens",
        None,
        "the tokens to generate, e.g. new_tokens = 64",
    )?;
    // min_new_tokens and pad_token_id may be 0
    let count = |key: &str| -> PResult<Option<u64>> {
        match table.get(key) {
            None => Ok(None),
            Some(v) => match v.get_ref() {
                Value::Integer(i) if *i >= 0 => Ok(Some(*i as u64)),
                other => Err(SyntaxError::new(
                    g.pos(v),
                    format!("'{key}' in [generate] must be a non-negative integer, found {other}"),
                )),
            },
        }
    };
    let min_new_tokens = count("min_new_tokens")?.unwrap_or(new_tokens);
    if min_new_tokens > new_tokens {
        return Err(SyntaxError::new(
            value_at(&g, "min_new_tokens"),
            format!("min_new_tokens = {min_new_tokens} is more than new_tokens = {new_tokens}"),
        ));
    }
    Ok(Some(Generate {
        new_tokens,
        min_new_tokens,
        pad: count("pad_token_id")?,
    }))
}

fn value_at(r: &Reader<'_>, key: &str) -> Span {
    r.table.get(key).map_or(r.at, |v: &Spanned<Value>| r.pos(v))
}

/// `[model.lora]`: peft's defaults where a key is left out (r 8, alpha 8, dropout 0, the q and
/// v projections).
fn lora(m: &Reader<'_>) -> PResult<Option<Lora>> {
    let Some(v) = m.table.get("lora") else {
        return Ok(None);
    };
    let at = m.pos(v);
    let err = |msg: String| SyntaxError::new(at, msg);
    let Value::Table(t) = v.get_ref() else {
        return Err(err(
            "'lora' in [model] must be a table: [model.lora] with r, alpha, dropout, target_modules"
                .into(),
        ));
    };
    if let Some(k) = t.keys().find(|k| !LORA_KEYS.contains(&k.as_str())) {
        return Err(err(format!(
            "unknown key '{k}' in [model.lora] (known: {})",
            LORA_KEYS.join(", ")
        )));
    }
    let r = match t.get("r") {
        None => 8,
        Some(Value::Integer(i)) if *i >= 1 => *i as u64,
        Some(other) => {
            return Err(err(format!(
                "'r' in [model.lora] must be a positive integer, found {other}"
            )))
        }
    };
    let number = |key: &str, default: f64| -> PResult<f64> {
        match t.get(key) {
            None => Ok(default),
            Some(Value::Integer(i)) => Ok(*i as f64),
            Some(Value::Float(f)) => Ok(*f),
            Some(other) => Err(err(format!(
                "'{key}' in [model.lora] must be a number, found {other}"
            ))),
        }
    };
    let alpha = number("alpha", 8.0)?;
    if !(alpha.is_finite() && alpha > 0.0) {
        return Err(err(format!(
            "'alpha' in [model.lora] must be positive, found {alpha}"
        )));
    }
    let dropout = number("dropout", 0.0)?;
    if !(0.0..1.0).contains(&dropout) {
        return Err(err(format!(
            "'dropout' in [model.lora] must be at least 0 and below 1, found {dropout}"
        )));
    }
    let spec = match t.get("target_modules") {
        None => Targets::Default,
        Some(Value::String(k)) if k == "all-linear" => Targets::AllLinear,
        Some(Value::String(k)) if k == "attention" => Targets::Attention,
        Some(Value::Array(a)) if !a.is_empty() => {
            let mut out = Vec::new();
            for x in a {
                match x.as_str() {
                    Some(name) => out.push(name.to_string()),
                    None => {
                        return Err(err(format!(
                            "target_modules in [model.lora]: {x} is not a module name (a string)"
                        )))
                    }
                }
            }
            Targets::Names(out)
        }
        Some(other) => {
            return Err(err(format!(
                "'target_modules' in [model.lora] must be a non-empty list of module names, \"all-linear\" or \"attention\", found {other}"
            )))
        }
    };
    Ok(Some(Lora {
        r,
        alpha,
        dropout,
        targets: Vec::new(),
        spec,
    }))
}

/// The first setting of `run` beyond what the sliding windows were recorded with (float32
/// training or inference, sdpa or eager attention), as (key, what).
fn beyond_recorded(run: &Run) -> Option<(&'static str, &'static str)> {
    if run.checkpointing {
        Some(("gradient_checkpointing", "gradient checkpointing"))
    } else if run.bf16_autocast {
        Some(("precision", "bf16 autocast"))
    } else if run.bf16_weights {
        Some(("dtype", "bf16 weights"))
    } else {
        None
    }
}
