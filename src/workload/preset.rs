//! Model presets: `[model]` and `[train]` tables that describe a standard model and its loop in
//! a few lines. A preset is expanded into the same line-language statements a user would write
//! (so it runs on the same runner, with the same tags), following the model definitions and the
//! loop of ../shared/tools/reference_models.py: parameters created in `model.parameters()`
//! order, `F.relu(linear(x))` per layer, the loss as `cross_entropy(out.float(), y) / grad_accum`,
//! the step after the last micro-batch, then `zero_grad(set_to_none=True)`.
//!
//! Built so far: `kind = "mlp"`. `kind = "gpt"` is refused with a clear error until its ops
//! match PyTorch's (issue 4).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use toml::{Spanned, Value};

use super::ast::Span;
use super::error::{PResult, SyntaxError};

/// The keys of `[model]`, per kind.
pub const MODEL_KEYS_MLP: &[&str] = &["kind", "d_in", "hidden", "layers", "d_out"];
pub const MODEL_KEYS_GPT: &[&str] = &[
    "kind",
    "vocab",
    "seq",
    "d_model",
    "heads",
    "layers",
    "attention",
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
struct Reader<'a> {
    table: &'a Table,
    name: &'static str,
    at: Span,
    span: &'a dyn Fn(usize) -> Span,
}

impl Reader<'_> {
    fn pos(&self, v: &Spanned<Value>) -> Span {
        (self.span)(v.span().start)
    }

    fn check_keys(&self, known: &[&str], what: &str) -> PResult<()> {
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

    fn int(&self, key: &str, default: Option<u64>, hint: &str) -> PResult<u64> {
        match self.table.get(key) {
            None => default.ok_or_else(|| {
                SyntaxError::new(
                    self.at,
                    format!("missing key '{key}' in [{}] ({hint})", self.name),
                )
            }),
            Some(v) => match v.get_ref() {
                Value::Integer(i) if *i >= 1 => Ok(u64::try_from(*i).unwrap_or(1)),
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

    fn choice(
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

    fn flag(&self, key: &str) -> PResult<bool> {
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
        span,
    };
    let kind = m.choice("kind", "", &["mlp", "gpt"])?;
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
        at: train_at,
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
            })
        }
        _ => {
            m.check_keys(MODEL_KEYS_GPT, " for kind = \"gpt\"")?;
            Err(SyntaxError::new(
                model_at,
                "kind = \"gpt\" presets are not available yet (they must first match PyTorch's \
                 allocations op by op); describe the model with [workload] setup and body, as \
                 fixtures/workloads/gpt2_small_adamw.toml does, or use kind = \"mlp\"",
            ))
        }
    }
}

fn train_value(t: &Reader<'_>, key: &str) -> Span {
    t.table.get(key).map_or(t.at, |v| t.pos(v))
}

fn read_train(t: &Reader<'_>) -> PResult<Train> {
    let batch = t.int("batch", None, "the micro-batch size, e.g. batch = 8")?;
    let iterations = t.int("iterations", Some(3), "")?;
    let iterations = u32::try_from(iterations).map_err(|_| {
        SyntaxError::new(
            train_value(t, "iterations"),
            format!("'iterations' in [train] must be at most {}", u32::MAX),
        )
    })?;
    let optimizer = t.choice(
        "optimizer",
        "adamw",
        &["sgd", "sgd_momentum", "adam", "adamw", "none"],
    )?;
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
    Ok(Train {
        batch,
        iterations,
        optimizer,
        bf16: precision == "bf16-autocast",
        checkpointing: t.flag("checkpointing")?,
        grad_accum: t.int("grad_accum", Some(1), "")?,
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
        let _ = writeln!(s, "  {w} = randn({fan_out}, {fan_in}, requires_grad=true)");
        let _ = writeln!(s, "  {b} = randn({fan_out}, requires_grad=true)");
        let _ = writeln!(s, "}}");
    }
    let list = params
        .iter()
        .flat_map(|(w, b)| [w.as_str(), b.as_str()])
        .collect::<Vec<_>>()
        .join(", ");
    match optimizer {
        "none" => {}
        "sgd" => {
            let _ = writeln!(s, "opt = sgd([{list}])");
        }
        "sgd_momentum" => {
            let _ = writeln!(s, "opt = sgd([{list}], momentum=0.9)");
        }
        other => {
            let _ = writeln!(s, "opt = {other}([{list}], foreach=true)");
        }
    }
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

fn mlp_body(d_in: u64, layers: u64, t: &Train) -> String {
    let mut s = String::new();
    for micro in 0..t.grad_accum {
        if t.grad_accum > 1 {
            let _ = writeln!(s, "# micro-batch {micro}");
        }
        let _ = writeln!(s, "x = randn({}, {d_in})", t.batch);
        let _ = writeln!(s, "y = zeros({}, dtype=int64)", t.batch);
        let _ = writeln!(s, "phase \"forward\" {{");
        let mut indent = String::from("  ");
        let mut close = 1;
        if t.mode == Mode::Inference {
            let _ = writeln!(s, "{indent}no_grad {{");
            indent.push_str("  ");
            close += 1;
        }
        if t.bf16 {
            let _ = writeln!(s, "{indent}autocast(dtype=bf16) {{");
            indent.push_str("  ");
            close += 1;
        }
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
        for _ in 0..close {
            indent.truncate(indent.len().saturating_sub(2));
            let _ = writeln!(s, "{indent}}}");
        }
        if t.mode == Mode::Train {
            let _ = writeln!(s, "loss.backward(retain_graph={})", t.retain_graph);
        }
        if t.mode != Mode::Inference {
            if t.keep_tensor || t.retain_graph {
                let _ = writeln!(s, "keep(loss)");
            } else {
                let _ = writeln!(s, "value = loss.item()");
            }
            let _ = writeln!(s, "del out, loss, x, y");
        } else {
            let _ = writeln!(s, "del out, x, y");
        }
    }
    if t.optimizer != "none" && t.mode != Mode::Inference {
        let _ = writeln!(s, "opt.step()");
        let _ = writeln!(s, "opt.zero_grad(set_to_none=true)");
    }
    s
}
