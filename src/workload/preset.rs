//! Model presets: `[model]` and `[train]` tables that describe a standard model and its loop in
//! a few lines. A preset is expanded into the same line-language statements a user would write
//! (so it runs on the same runner, with the same tags), following the model definitions and the
//! loop of ../shared/tools/reference_models.py: parameters created in `model.parameters()`
//! order, `F.relu(linear(x))` per layer, the loss as `cross_entropy(out.float(), y) / grad_accum`,
//! the step after the last micro-batch, then `zero_grad(set_to_none=True)`.
//!
//! `kind = "mlp"`: `MLPNet` (Linear+ReLU layers, a head). `kind = "gpt"`: `GPT` (token and
//! position embeddings, pre-norm blocks with fused qkv, `math` or `sdpa` attention, GELU MLP,
//! final LayerNorm, a head tied to the token embedding), each block inside `checkpoint` when
//! `checkpointing = true`. Variables die where the Python function's locals would.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use toml::{Spanned, Value};

use super::ast::Span;
use super::error::{PResult, SyntaxError};

/// The keys of `[model]`, per kind.
pub const MODEL_KEYS_MLP: &[&str] = &["kind", "d_in", "hidden", "layers", "d_out", "weights"];
pub const MODEL_KEYS_GPT: &[&str] = &[
    "kind",
    "vocab",
    "seq",
    "d_model",
    "heads",
    "layers",
    "attention",
    "weights",
];
/// The keys of `[train]`.
pub const TRAIN_KEYS: &[&str] = &[
    "batch",
    "iterations",
    "optimizer",
    "precision",
    "checkpointing",
    "grad_accum",
    "mode",
    "keep_loss",
    "retain_graph",
];

pub(crate) type Table = BTreeMap<String, Spanned<Value>>;

/// A preset expanded: the statements' source text and the iteration count.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Expanded {
    pub kind: &'static str,
    pub iterations: u32,
    pub setup: String,
    pub body: String,
    pub info: PresetInfo,
    /// `weights = "model.safetensors"`: the state_dict to load (as written, and where).
    pub weights: Option<(String, Span)>,
}

/// What a preset is set to, defaults included: what the remedies may change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresetInfo {
    /// `mlp` or `gpt`.
    pub kind: &'static str,
    /// Every integer key of `[model]` and `[train]` with its value.
    pub ints: Vec<(String, u64)>,
    pub optimizer: &'static str,
    pub bf16: bool,
    pub checkpointing: bool,
    /// `train`, `inference` or `eval-with-graph`.
    pub mode: &'static str,
    /// `keep_loss = "tensor"`.
    pub keep_tensor: bool,
    /// Whether the model is modelled under bf16 autocast (the remedy is offered only then).
    pub can_autocast: bool,
    /// A Hugging Face config trained in full (every weight, no LoRA): LoRA is a remedy.
    pub full_finetune: bool,
    /// Weights already in bf16 (a Hugging Face config's `dtype`).
    pub bf16_weights: bool,
    /// A generation's KV cache, where the model generates.
    pub kv_cache: Option<KvCacheInfo>,
    /// What a Hugging Face config's run assumes, in a line (mode, shapes, dtype, training,
    /// optimizer, attention, iterations).
    pub assumptions: Option<String>,
    /// A Hugging Face config's `max_position_embeddings` (the context it was trained for),
    /// where RoPE lets a longer sequence run.
    pub max_positions: Option<u64>,
    /// `[distributed]`, where the model is wrapped: what the sharding remedies may change.
    pub distributed: Option<DistributedInfo>,
    /// Combinations modelled from PyTorch's source but not yet checked against a recording
    /// ("FSDP2 with LoRA"): each is said with the figures.
    pub unrecorded: Vec<String>,
}

impl PresetInfo {
    /// What the run combines that is modelled from PyTorch's source but not yet checked
    /// against a recording, in a line (`run` warns with it, `fit` notes it).
    pub fn unrecorded_line(&self) -> Option<String> {
        (!self.unrecorded.is_empty()).then(|| {
            format!(
                "{} follows PyTorch 2.11's source but is not yet checked against a recording: \
                 take its figures as a model, not a measurement",
                self.unrecorded.join(" and ")
            )
        })
    }
}

/// A wrapped model's `[distributed]` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedInfo {
    /// `ddp`, `fsdp2`, `zero1`, `zero2` or `zero3`.
    pub strategy: &'static str,
    pub world_size: u64,
    pub reshard_after_forward: bool,
    pub cpu_offload: bool,
    pub param_bf16: bool,
    /// ZeRO's `reduce_bucket_size` in elements (`None` for DDP and FSDP2).
    pub reduce_bucket_size: Option<u64>,
}

impl DistributedInfo {
    /// Whether DeepSpeed ZeRO wraps the model (any stage).
    pub fn is_zero(&self) -> bool {
        self.strategy.starts_with("zero")
    }
}

/// How a generation's KV cache grows: bytes per token, what the prompt holds, and the
/// context the model was trained for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KvCacheInfo {
    /// Bytes per token of context over the whole batch and every layer (keys and values).
    pub bytes_per_token: u64,
    /// The same for one layer and one sample.
    pub bytes_per_token_per_layer: u64,
    pub layers: u64,
    pub batch: u64,
    /// The cache's dtype (`float32`, `bf16`).
    pub dtype: &'static str,
    /// The sliding window's length, where some layers' caches stop growing at it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<u64>,
    /// How many of the layers attend through the sliding window (Gemma-2 every other one,
    /// Gemma-3 five of six, Mistral v0.1 all); the others' caches grow with the context.
    pub sliding_layers: u64,
    /// The prompt's tokens.
    pub prompt: u64,
    /// `max_position_embeddings`, when the config gives it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_positions: Option<u64>,
}

impl KvCacheInfo {
    /// The cache's bytes at a context of `tokens` (every layer, the batch).
    pub fn bytes_at(&self, tokens: u64) -> u64 {
        let per_layer = self.bytes_per_token / self.layers.max(1);
        let (sliding, full) = match self.sliding_window {
            Some(w) => (self.sliding_layers.min(self.layers), tokens.min(w)),
            None => (0, 0),
        };
        per_layer
            .saturating_mul(self.layers - sliding)
            .saturating_mul(tokens)
            .saturating_add(per_layer.saturating_mul(sliding).saturating_mul(full))
    }
}

/// The integer keys of `[train]`.
/// The most micro-batches (iterations x grad_accum) a preset runs.
pub(crate) const MAX_MICRO_BATCHES: u64 = 100_000;

pub const TRAIN_INTS: &[&str] = &["batch", "iterations", "grad_accum"];

fn info(kind: &'static str, model: Vec<(&str, u64)>, t: &Train) -> PresetInfo {
    let mut ints: Vec<(String, u64)> = model.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    ints.push(("batch".into(), t.batch));
    ints.push(("iterations".into(), t.iterations as u64));
    ints.push(("grad_accum".into(), t.grad_accum));
    PresetInfo {
        kind,
        ints,
        optimizer: t.optimizer,
        bf16: t.bf16,
        checkpointing: t.checkpointing,
        mode: match t.mode {
            Mode::Train => "train",
            Mode::Inference => "inference",
            Mode::EvalWithGraph => "eval-with-graph",
        },
        keep_tensor: t.keep_tensor,
        full_finetune: false,
        bf16_weights: false,
        kv_cache: None,
        max_positions: None,
        assumptions: None,
        distributed: None,
        can_autocast: true,
        unrecorded: Vec::new(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Train,
    Inference,
    EvalWithGraph,
}

struct Train {
    batch: u64,
    iterations: u32,
    optimizer: &'static str,
    bf16: bool,
    checkpointing: bool,
    grad_accum: u64,
    mode: Mode,
    keep_tensor: bool,
    retain_graph: bool,
}

/// Reads one table's values, each error at the value (or at the table when a key is missing).
pub(super) struct Reader<'a> {
    pub(super) table: &'a Table,
    pub(super) name: &'static str,
    pub(super) at: Span,
    /// The workload has no such table (`table` is empty): missing keys say to add it.
    pub(super) absent: bool,
    pub(super) span: &'a dyn Fn(usize) -> Span,
}

impl Reader<'_> {
    pub(super) fn pos(&self, v: &Spanned<Value>) -> Span {
        (self.span)(v.span().start)
    }

    pub(super) fn check_keys(&self, known: &[&str], what: &str) -> PResult<()> {
        for (k, v) in self.table {
            if !known.contains(&k.as_str()) {
                return Err(SyntaxError::new(
                    self.pos(v),
                    format!(
                        "unknown key '{k}' in [{}]{what} (known: {})",
                        self.name,
                        known.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn int(&self, key: &str, default: Option<u64>, hint: &str) -> PResult<u64> {
        match self.table.get(key) {
            None => default.ok_or_else(|| {
                SyntaxError::new(
                    self.at,
                    if self.absent {
                        format!(
                            "the workload has no [{}] table, which needs '{key}' ({hint})",
                            self.name
                        )
                    } else {
                        format!("missing key '{key}' in [{}] ({hint})", self.name)
                    },
                )
            }),
            Some(v) => match v.get_ref() {
                Value::Integer(i) if *i >= 1 => {
                    let n = u64::try_from(*i).unwrap_or(1);
                    match super::limits::exceeded(key, n) {
                        None => Ok(n),
                        Some(why) => Err(SyntaxError::new(
                            self.pos(v),
                            format!("'{key}' in [{}] must be at most {why}", self.name),
                        )),
                    }
                }
                Value::Integer(i) => Err(SyntaxError::new(
                    self.pos(v),
                    format!("'{key}' in [{}] must be at least 1, found {i}", self.name),
                )),
                other => Err(SyntaxError::new(
                    self.pos(v),
                    format!(
                        "'{key}' in [{}] must be a positive integer, found {}",
                        self.name,
                        other.type_str()
                    ),
                )),
            },
        }
    }

    /// `iterations` (default 3): a positive integer that fits in 32 bits.
    pub(super) fn iterations(&self) -> PResult<u32> {
        let n = self.int("iterations", Some(3), "")?;
        u32::try_from(n).map_err(|_| {
            SyntaxError::new(
                self.table
                    .get("iterations")
                    .map_or(self.at, |v| self.pos(v)),
                format!(
                    "'iterations' in [{}] must be at most {}",
                    self.name,
                    u32::MAX
                ),
            )
        })
    }

    pub(super) fn choice(
        &self,
        key: &str,
        default: &'static str,
        allowed: &[&'static str],
    ) -> PResult<&'static str> {
        let Some(v) = self.table.get(key) else {
            return Ok(default);
        };
        let list = allowed
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ");
        match v.get_ref() {
            Value::String(s) => allowed.iter().copied().find(|a| a == s).ok_or_else(|| {
                SyntaxError::new(
                    self.pos(v),
                    format!(
                        "unknown {key} \"{s}\" in [{}]: expected one of {list}",
                        self.name
                    ),
                )
            }),
            other => Err(SyntaxError::new(
                self.pos(v),
                format!(
                    "'{key}' in [{}] must be a string (one of {list}), found {}",
                    self.name,
                    other.type_str()
                ),
            )),
        }
    }

    pub(super) fn flag(&self, key: &str) -> PResult<bool> {
        match self.table.get(key) {
            None => Ok(false),
            Some(v) => match v.get_ref() {
                Value::Boolean(b) => Ok(*b),
                other => Err(SyntaxError::new(
                    self.pos(v),
                    format!(
                        "'{key}' in [{}] must be true or false, found {}",
                        self.name,
                        other.type_str()
                    ),
                )),
            },
        }
    }
}

/// Expands `[model]` and `[train]`. `model_at`/`train_at` are the tables' positions (for
/// missing keys); `span` maps a byte offset of the file to a position.
pub(crate) fn expand(
    model: &Table,
    model_at: Span,
    train: Option<&Table>,
    train_at: Span,
    span: &dyn Fn(usize) -> Span,
) -> PResult<Expanded> {
    let m = Reader {
        table: model,
        name: "model",
        at: model_at,
        absent: false,
        span,
    };
    let kind = m.choice("kind", "", &["mlp", "gpt"])?;
    let weights = match model.get("weights") {
        None => None,
        Some(v) => match v.get_ref() {
            Value::String(p) if !p.is_empty() => Some((p.clone(), m.pos(v))),
            _ => {
                return Err(SyntaxError::new(
                    m.pos(v),
                    "'weights' in [model] must be the path of a safetensors file, as \
                     weights = \"model.safetensors\"",
                ))
            }
        },
    };
    if kind.is_empty() {
        return Err(SyntaxError::new(
            model_at,
            "missing key 'kind' in [model]: kind = \"mlp\" (d_in, hidden, layers, d_out) or \
             kind = \"gpt\" (vocab, seq, d_model, heads, layers, attention)",
        ));
    }
    let empty = Table::new();
    let t = Reader {
        table: train.unwrap_or(&empty),
        name: "train",
        // with no [train] table, a missing key is reported at [model]
        at: if train.is_some() { train_at } else { model_at },
        absent: train.is_none(),
        span,
    };
    t.check_keys(TRAIN_KEYS, "")?;
    let train = read_train(&t)?;
    match kind {
        "mlp" => {
            m.check_keys(MODEL_KEYS_MLP, " for kind = \"mlp\"")?;
            let d_in = m.int("d_in", None, "the input width, e.g. d_in = 1024")?;
            let hidden = m.int("hidden", None, "the hidden width, e.g. hidden = 4096")?;
            let layers = m.int("layers", None, "the number of hidden Linear+ReLU layers")?;
            let d_out = m.int("d_out", None, "the number of classes, e.g. d_out = 1000")?;
            if train.checkpointing {
                let v = train_value(&t, "checkpointing");
                return Err(SyntaxError::new(
                    v,
                    "checkpointing is per transformer block, for kind = \"gpt\"; an mlp \
                     preset has none (remove it or set it to false)",
                ));
            }
            Ok(Expanded {
                kind: "mlp",
                iterations: train.iterations,
                setup: mlp_setup(d_in, hidden, layers, d_out, train.optimizer),
                body: mlp_body(d_in, layers, &train),
                info: info(
                    "mlp",
                    vec![
                        ("d_in", d_in),
                        ("hidden", hidden),
                        ("layers", layers),
                        ("d_out", d_out),
                    ],
                    &train,
                ),
                weights,
            })
        }
        _ => {
            m.check_keys(MODEL_KEYS_GPT, " for kind = \"gpt\"")?;
            let g = Gpt {
                vocab: m.int("vocab", None, "the vocabulary size, e.g. vocab = 50257")?,
                seq: m.int("seq", None, "the sequence length, e.g. seq = 1024")?,
                d: m.int("d_model", None, "the model width, e.g. d_model = 768")?,
                heads: m.int("heads", None, "the attention heads, e.g. heads = 12")?,
                layers: m.int("layers", None, "the transformer blocks, e.g. layers = 12")?,
                math: m.choice("attention", "sdpa", &["math", "sdpa"])? == "math",
            };
            if !g.d.is_multiple_of(g.heads) {
                let at = model.get("heads").map_or(model_at, |v| m.pos(v));
                return Err(SyntaxError::new(
                    at,
                    format!(
                        "d_model ({}) must be a multiple of heads ({})",
                        g.d, g.heads
                    ),
                ));
            }
            Ok(Expanded {
                kind: "gpt",
                iterations: train.iterations,
                setup: gpt_setup(&g, train.optimizer),
                body: gpt_body(&g, &train),
                info: info(
                    "gpt",
                    vec![
                        ("vocab", g.vocab),
                        ("seq", g.seq),
                        ("d_model", g.d),
                        ("heads", g.heads),
                        ("layers", g.layers),
                    ],
                    &train,
                ),
                weights,
            })
        }
    }
}

struct Gpt {
    vocab: u64,
    seq: u64,
    d: u64,
    heads: u64,
    layers: u64,
    math: bool,
}

/// `(variable, module path, shape)` of every parameter, in `model.parameters()` order; the
/// head's weight is the token embedding's (tied), so it is not a parameter of its own.
fn gpt_params(g: &Gpt) -> Vec<(String, String, Vec<u64>)> {
    let d = g.d;
    let mut p = vec![
        ("wte".to_string(), "wte".to_string(), vec![g.vocab, d]),
        ("wpe".to_string(), "wpe".to_string(), vec![g.seq, d]),
    ];
    for i in 0..g.layers {
        for (name, shape) in [
            ("ln1_weight", vec![d]),
            ("ln1_bias", vec![d]),
            ("qkv_weight", vec![3 * d, d]),
            ("qkv_bias", vec![3 * d]),
            ("proj_weight", vec![d, d]),
            ("proj_bias", vec![d]),
            ("ln2_weight", vec![d]),
            ("ln2_bias", vec![d]),
            ("fc_weight", vec![4 * d, d]),
            ("fc_bias", vec![4 * d]),
            ("fc_proj_weight", vec![d, 4 * d]),
            ("fc_proj_bias", vec![d]),
        ] {
            let module = name.rsplit_once('_').map_or(name, |(m, _)| m);
            p.push((
                format!("b{i}_{name}"),
                format!("blocks.{i}.{module}"),
                shape,
            ));
        }
    }
    p.push(("ln_f_weight".into(), "ln_f".into(), vec![d]));
    p.push(("ln_f_bias".into(), "ln_f".into(), vec![d]));
    p
}

fn gpt_setup(g: &Gpt, optimizer: &str) -> String {
    let mut s = String::new();
    let params = gpt_params(g);
    for (var, path, shape) in &params {
        let dims = shape
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let suffix = if var.ends_with("_bias") {
            "bias"
        } else {
            "weight"
        };
        let _ = writeln!(s, "scope \"{path}\" {{");
        let _ = writeln!(
            s,
            "  {var} = randn({dims}, requires_grad=true, from=\"{path}.{suffix}\")"
        );
        let _ = writeln!(s, "}}");
    }
    let list = params
        .iter()
        .map(|(v, _, _)| v.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    optimizer_line(&mut s, optimizer, &list);
    s
}

pub(super) fn optimizer_line(s: &mut String, optimizer: &str, list: &str) {
    optimizer_over(s, optimizer, &format!("[{list}]"));
}

/// [`optimizer_line`] over a list expression (`fsdp_sharded([...])`).
pub(super) fn optimizer_over(s: &mut String, optimizer: &str, params: &str) {
    match optimizer {
        "none" => {}
        // the learning rates of ../shared/tools/reference_models.py; the rest PyTorch's defaults
        "sgd" => {
            let _ = writeln!(s, "opt = sgd({params}, lr=0.001)");
        }
        "sgd_momentum" => {
            let _ = writeln!(s, "opt = sgd({params}, lr=0.001, momentum=0.9)");
        }
        other => {
            let _ = writeln!(s, "opt = {other}({params}, lr=0.0001, foreach=true)");
        }
    }
}

/// Writes `stmt` under the tag of module `path` (each statement its own scope, so a tag is one
/// module path, `blocks.3.qkv`, not a nesting of them).
pub(super) fn at(s: &mut String, indent: &str, path: &str, stmt: &str) {
    let _ = writeln!(s, "{indent}scope \"{path}\" {{");
    let _ = writeln!(s, "{indent}  {stmt}");
    let _ = writeln!(s, "{indent}}}");
}

/// One transformer block, `x` to `x`, as reference_models.py's `Block.forward`: the
/// submodules' ops tagged `blocks.i.<module>`, the block's own ops `blocks.i`.
fn gpt_block(s: &mut String, g: &Gpt, t: &Train, i: u64, indent: &str) {
    let (b, tt, c, h) = (t.batch, g.seq, g.d, g.heads);
    let hd = c / h;
    let blk = format!("blocks.{i}");
    let m = |n: &str| format!("blocks.{i}.{n}");
    let p = |n: &str| format!("b{i}_{n}");
    let del = |s: &mut String, names: &str| {
        let _ = writeln!(s, "{indent}del {names}");
    };
    let ln = |n: &str, input: &str, out: &str| {
        format!(
            "{out} = layer_norm({input}, {}, {})",
            p(&format!("{n}_weight")),
            p(&format!("{n}_bias"))
        )
    };
    let lin = |n: &str, input: &str, out: &str| {
        format!(
            "{out} = linear({input}, {}, {})",
            p(&format!("{n}_weight")),
            p(&format!("{n}_bias"))
        )
    };
    // the caller's `x` holds the block's input until the block returns
    let _ = writeln!(s, "{indent}x_in = x");
    at(s, indent, &m("ln1"), &ln("ln1", "x", "t1"));
    at(s, indent, &m("qkv"), &lin("qkv", "t1", "t2"));
    del(s, "t1");
    at(s, indent, &blk, &format!("q, k, v = t2.split({c}, 2)"));
    del(s, "t2");
    for n in ["q", "k", "v"] {
        at(
            s,
            indent,
            &blk,
            &format!("{n} = {n}.view({b}, {tt}, {h}, {hd}).transpose(1, 2)"),
        );
    }
    if g.math {
        let scale = 1.0 / (hd as f64).sqrt();
        for stmt in [
            format!("att = (q @ k.transpose(2, 3)) * {scale:?}"),
            format!("mask = ones({tt}, {tt}, dtype=bool).tril()"),
            "att = att.masked_fill(mask.bitwise_not(), -inf)".to_string(),
            "att = softmax(att, -1)".to_string(),
            "y = att @ v".to_string(),
        ] {
            at(s, indent, &blk, &stmt);
        }
    } else {
        at(s, indent, &blk, "y = scaled_dot_product_attention(q, k, v)");
    }
    at(
        s,
        indent,
        &blk,
        &format!("y = y.transpose(1, 2).contiguous().view({b}, {tt}, {c})"),
    );
    at(s, indent, &m("proj"), &lin("proj", "y", "t3"));
    at(s, indent, &blk, "x = x + t3");
    del(s, "t3");
    at(s, indent, &m("ln2"), &ln("ln2", "x", "t4"));
    at(s, indent, &m("fc"), &lin("fc", "t4", "t5"));
    del(s, "t4");
    at(s, indent, &blk, "t6 = t5.gelu()");
    del(s, "t5");
    at(s, indent, &m("fc_proj"), &lin("fc_proj", "t6", "t7"));
    del(s, "t6");
    at(s, indent, &blk, "x = x + t7");
    del(s, "t7");
    // the function's locals die at its return
    if g.math {
        del(s, "q, k, v, att, mask, y");
    } else {
        del(s, "q, k, v, y");
    }
    del(s, "x_in");
}

fn gpt_forward(s: &mut String, g: &Gpt, t: &Train, indent: &str) {
    let _ = writeln!(s, "{indent}pos = arange({})", g.seq);
    let _ = writeln!(s, "{indent}scope \"wte\" {{");
    let _ = writeln!(s, "{indent}  e1 = embedding(idx, wte)");
    let _ = writeln!(s, "{indent}}}");
    let _ = writeln!(s, "{indent}scope \"wpe\" {{");
    let _ = writeln!(s, "{indent}  e2 = embedding(pos, wpe)");
    let _ = writeln!(s, "{indent}}}");
    let _ = writeln!(s, "{indent}x = e1 + e2");
    let _ = writeln!(s, "{indent}del e1, e2");
    for i in 0..g.layers {
        if t.checkpointing {
            let _ = writeln!(s, "{indent}checkpoint {{");
            gpt_block(s, g, t, i, &format!("{indent}  "));
            let _ = writeln!(s, "{indent}}}");
        } else {
            gpt_block(s, g, t, i, indent);
        }
    }
    let _ = writeln!(s, "{indent}scope \"ln_f\" {{");
    let _ = writeln!(s, "{indent}  t8 = layer_norm(x, ln_f_weight, ln_f_bias)");
    let _ = writeln!(s, "{indent}}}");
    let _ = writeln!(s, "{indent}scope \"head\" {{");
    let _ = writeln!(s, "{indent}  out = linear(t8, wte)");
    let _ = writeln!(s, "{indent}}}");
    let _ = writeln!(s, "{indent}del t8, pos, x");
}

fn gpt_body(g: &Gpt, t: &Train) -> String {
    let (b, tt, v) = (t.batch, g.seq, g.vocab);
    let mut s = String::new();
    for micro in 0..t.grad_accum {
        if t.grad_accum > 1 {
            let _ = writeln!(s, "# micro-batch {micro}");
        }
        let _ = writeln!(
            s,
            "idx = zeros({b}, {tt}, dtype=int64, from=\"data:input_ids\")"
        );
        let _ = writeln!(
            s,
            "tgt = zeros({b}, {tt}, dtype=int64, from=\"data:labels\")"
        );
        let (open, mut indent) = open_context(&mut s, t);
        gpt_forward(&mut s, g, t, &indent);
        match t.mode {
            Mode::Train => {
                let _ = writeln!(
                    s,
                    "{indent}loss = cross_entropy(out.view({}, {v}).float(), tgt.view({})) / {}",
                    b * tt,
                    b * tt,
                    t.grad_accum
                );
            }
            Mode::EvalWithGraph => {
                let _ = writeln!(
                    s,
                    "{indent}loss = cross_entropy(out.view({}, {v}), tgt.view({}))",
                    b * tt,
                    b * tt
                );
            }
            Mode::Inference => {}
        }
        close_context(&mut s, open, &mut indent);
        end_micro(&mut s, t, "idx, tgt");
    }
    end_step(&mut s, t);
    s
}

fn train_value(t: &Reader<'_>, key: &str) -> Span {
    t.table.get(key).map_or(t.at, |v| t.pos(v))
}

fn read_train(t: &Reader<'_>) -> PResult<Train> {
    let batch = t.int("batch", None, "the micro-batch size, e.g. batch = 8")?;
    let iterations = t.iterations()?;
    let optimizer = t.choice("optimizer", "adamw", crate::workload::OPTIMIZER_NAMES)?;
    let precision = t.choice("precision", "fp32", &["fp32", "bf16-autocast"])?;
    let mode = match t.choice("mode", "train", &["train", "inference", "eval-with-graph"])? {
        "train" => Mode::Train,
        "inference" => Mode::Inference,
        _ => Mode::EvalWithGraph,
    };
    let keep_tensor = t.choice("keep_loss", "item", &["item", "tensor"])? == "tensor";
    let retain_graph = t.flag("retain_graph")?;
    if retain_graph && mode != Mode::Train {
        return Err(SyntaxError::new(
            train_value(t, "retain_graph"),
            "retain_graph applies to backward, which only mode = \"train\" runs",
        ));
    }
    let grad_accum = t.int("grad_accum", Some(1), "")?;
    // each bounded alone, but they multiply: a micro-batch is a whole forward and backward
    let micro = (iterations as u64).saturating_mul(grad_accum);
    if micro > MAX_MICRO_BATCHES {
        return Err(SyntaxError::new(
            train_value(t, "grad_accum"),
            format!(
                "iterations x grad_accum is {micro} micro-batches, more than the {} gpumem runs: \
                 a few iterations show the memory of every one",
                crate::units::group_digits(MAX_MICRO_BATCHES)
            ),
        ));
    }
    Ok(Train {
        batch,
        iterations,
        optimizer,
        bf16: precision == "bf16-autocast",
        checkpointing: t.flag("checkpointing")?,
        grad_accum,
        mode,
        keep_tensor,
        retain_graph,
    })
}

/// Parameter variable names, in `model.parameters()` order: each layer's weight then bias,
/// then the head's.
fn mlp_params(layers: u64) -> Vec<(String, String)> {
    (0..layers)
        .map(|i| (format!("layers_{i}_weight"), format!("layers_{i}_bias")))
        .chain(std::iter::once(("head_weight".into(), "head_bias".into())))
        .collect()
}

fn mlp_setup(d_in: u64, hidden: u64, layers: u64, d_out: u64, optimizer: &str) -> String {
    let mut s = String::new();
    let params = mlp_params(layers);
    for (i, (w, b)) in params.iter().enumerate() {
        let i = i as u64;
        let (fan_in, fan_out) = match i {
            _ if i == layers => (hidden, d_out),
            0 => (d_in, hidden),
            _ => (hidden, hidden),
        };
        let path = if i == layers {
            "head".to_string()
        } else {
            format!("layers.{i}")
        };
        let _ = writeln!(s, "scope \"{path}\" {{");
        let _ = writeln!(
            s,
            "  {w} = randn({fan_out}, {fan_in}, requires_grad=true, from=\"{path}.weight\")"
        );
        let _ = writeln!(
            s,
            "  {b} = randn({fan_out}, requires_grad=true, from=\"{path}.bias\")"
        );
        let _ = writeln!(s, "}}");
    }
    let list = params
        .iter()
        .flat_map(|(w, b)| [w.as_str(), b.as_str()])
        .collect::<Vec<_>>()
        .join(", ");
    optimizer_line(&mut s, optimizer, &list);
    s
}

/// The forward pass, `out` from `x` (the function's locals freed at its return).
fn mlp_forward(s: &mut String, layers: u64, indent: &str) {
    let params = mlp_params(layers);
    let mut input = "x";
    for (i, (w, b)) in params.iter().enumerate() {
        if i as u64 == layers {
            let _ = writeln!(s, "{indent}scope \"head\" {{");
            let _ = writeln!(s, "{indent}  out = linear({input}, {w}, {b})");
            let _ = writeln!(s, "{indent}}}");
        } else {
            // `x = F.relu(l(x))`: the previous activation lives until the relu's output is
            // assigned, and the linear's output until the relu returns.
            let _ = writeln!(s, "{indent}scope \"layers.{i}\" {{");
            let _ = writeln!(s, "{indent}  z = linear({input}, {w}, {b})");
            let _ = writeln!(s, "{indent}}}");
            let _ = writeln!(s, "{indent}h = z.relu()");
            let _ = writeln!(s, "{indent}del z");
            input = "h";
        }
    }
    if layers > 0 {
        let _ = writeln!(s, "{indent}del h");
    }
}

/// Opens `phase "forward"` and the mode's and precision's blocks; returns how many it opened
/// and the indentation inside.
fn open_context(s: &mut String, t: &Train) -> (usize, String) {
    let _ = writeln!(s, "phase \"forward\" {{");
    let mut indent = String::from("  ");
    let mut open = 1;
    if t.mode == Mode::Inference {
        let _ = writeln!(s, "{indent}no_grad {{");
        indent.push_str("  ");
        open += 1;
    }
    if t.bf16 {
        let _ = writeln!(s, "{indent}autocast(dtype=bf16) {{");
        indent.push_str("  ");
        open += 1;
    }
    (open, indent)
}

fn close_context(s: &mut String, open: usize, indent: &mut String) {
    for _ in 0..open {
        indent.truncate(indent.len().saturating_sub(2));
        let _ = writeln!(s, "{indent}}}");
    }
}

/// After a micro-batch's forward: backward, what is kept of the loss, and the deletions of the
/// loop's locals (`inputs`: the input variables).
fn end_micro(s: &mut String, t: &Train, inputs: &str) {
    if t.mode == Mode::Train {
        let _ = writeln!(s, "loss.backward(retain_graph={})", t.retain_graph);
    }
    if t.mode != Mode::Inference {
        if t.keep_tensor || t.retain_graph {
            let _ = writeln!(s, "keep(loss)");
        } else {
            let _ = writeln!(s, "value = loss.item()");
        }
        let _ = writeln!(s, "del out, loss, {inputs}");
    } else {
        let _ = writeln!(s, "del out, {inputs}");
    }
}

fn end_step(s: &mut String, t: &Train) {
    if t.optimizer != "none" && t.mode != Mode::Inference {
        let _ = writeln!(s, "opt.step()");
        let _ = writeln!(s, "opt.zero_grad(set_to_none=true)");
    }
}

fn mlp_body(d_in: u64, layers: u64, t: &Train) -> String {
    let mut s = String::new();
    for micro in 0..t.grad_accum {
        if t.grad_accum > 1 {
            let _ = writeln!(s, "# micro-batch {micro}");
        }
        let _ = writeln!(s, "x = randn({}, {d_in}, from=\"data:x\")", t.batch);
        let _ = writeln!(
            s,
            "y = zeros({}, dtype=int64, from=\"data:labels\")",
            t.batch
        );
        let (open, mut indent) = open_context(&mut s, t);
        mlp_forward(&mut s, layers, &indent);
        match t.mode {
            Mode::Train => {
                let _ = writeln!(
                    s,
                    "{indent}loss = cross_entropy(out.float(), y) / {}",
                    t.grad_accum
                );
            }
            Mode::EvalWithGraph => {
                let _ = writeln!(s, "{indent}loss = cross_entropy(out, y)");
            }
            Mode::Inference => {}
        }
        close_context(&mut s, open, &mut indent);
        end_micro(&mut s, t, "x, y");
    }
    end_step(&mut s, t);
    s
}
