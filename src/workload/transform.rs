//! Changes to a workload that the out-of-memory diagnoser and `gpumem fit` try: integer
//! parameters, allocator settings, and the remedies a person would make to a training script
//! (bf16 autocast, activation checkpointing, SGD in place of Adam, `no_grad` around an
//! evaluation loop, `loss.item()` instead of keeping the loss).
//!
//! A preset (`[model]`/`[train]`) is changed through its tables before it is expanded, so a
//! remedy is exactly the preset a user would write. A script is changed statement by
//! statement: the result is the script a user would write by hand with the same change.

use super::ast::{BlockKind, Expr, ExprKind, Stmt, StmtKind};

/// Changes applied while loading a workload (see [`super::load_with`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// Integer parameters by name: a `[params]` entry of a script, or an integer key of a
    /// preset's `[model]` or `[train]` (`batch`, `layers`, `seq`, ...).
    pub params: Vec<(String, i64)>,
    /// `PYTORCH_CUDA_ALLOC_CONF` to use instead of the workload's (`--alloc-conf`).
    pub alloc_conf: Option<String>,
    /// The environment's allocator settings, (variable, value): used when neither
    /// `--alloc-conf` nor the workload's `alloc_conf` sets them, as PyTorch reads them.
    pub env_alloc_conf: Option<(String, String)>,
    /// Run the forward pass (a preset) or the body (a script) under bf16 autocast.
    pub bf16_autocast: bool,
    /// Checkpoint every transformer block (a `gpt` preset) or decoder layer (a Hugging Face
    /// config's `gradient_checkpointing`).
    pub checkpointing: bool,
    /// A Hugging Face config's weights in bf16 (`[model] dtype = "bf16"`).
    pub bf16_weights: bool,
    /// A Hugging Face config fine-tuned with LoRA (r 16 on the attention projections) instead
    /// of in full, where it has no `[model.lora]`.
    pub lora_attention: bool,
    /// Use plain SGD where the workload uses Adam or AdamW.
    pub sgd: bool,
    /// Use bitsandbytes' 8-bit Adam or AdamW where the workload uses PyTorch's.
    pub optim8bit: bool,
    /// Run an evaluation loop (no `backward`) under `no_grad`.
    pub no_grad_eval: bool,
    /// Keep `loss.item()` (a number) where the workload keeps the loss tensor.
    pub keep_item: bool,
    /// For a bare Hugging Face config: `key = value` lines (TOML values) of its `[model]`,
    /// `[model.lora]` and `[train]` tables (`gpumem run config.json --optimizer sgd`).
    pub hf_model: Vec<(String, String)>,
    pub hf_lora: Vec<(String, String)>,
    pub hf_train: Vec<(String, String)>,
    pub hf_distributed: Vec<(String, String)>,
    /// `[distributed]` keys set over the workload's own (TOML values; an empty one removes the
    /// key): the sharding remedies.
    pub distributed_set: Vec<(String, String)>,
}

impl Overrides {
    pub fn is_empty(&self) -> bool {
        *self == Overrides::default()
    }

    /// The value given for `name`, if any (the last one wins).
    pub fn param(&self, name: &str) -> Option<i64> {
        self.params
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }

    /// These overrides plus one more parameter value.
    pub fn with_param(&self, name: &str, value: i64) -> Overrides {
        let mut o = self.clone();
        o.params.retain(|(n, _)| n != name);
        o.params.push((name.to_string(), value));
        o
    }
}

/// Calls `f` on every expression, outermost first.
fn walk_exprs(stmts: &[Stmt], f: &mut dyn FnMut(&Expr)) {
    super::ast::visit(stmts, &mut |n| {
        if let super::ast::Node::Expr(e) = n {
            f(e)
        }
    });
}

/// Whether any statement calls the plain function `name`.
pub fn calls(stmts: &[Stmt], name: &str) -> bool {
    let mut found = false;
    walk_exprs(stmts, &mut |e| {
        if matches!(&e.kind, ExprKind::Call { func, .. } if func == name) {
            found = true;
        }
    });
    found
}

/// Whether any statement calls the method `name` (e.g. `backward`).
pub fn calls_method(stmts: &[Stmt], name: &str) -> bool {
    let mut found = false;
    walk_exprs(stmts, &mut |e| {
        if matches!(&e.kind, ExprKind::Method { name: n, .. } if n == name) {
            found = true;
        }
    });
    found
}

/// Whether any statement makes a tensor that requires grad (`requires_grad=true`, or
/// `.requires_grad_()`).
pub fn requires_grad(stmts: &[Stmt]) -> bool {
    let mut found = false;
    walk_exprs(stmts, &mut |e| match &e.kind {
        ExprKind::Call { kwargs, .. } | ExprKind::Method { kwargs, .. }
            if kwargs
                .iter()
                .any(|(k, v)| k == "requires_grad" && v.kind == ExprKind::Bool(true)) =>
        {
            found = true
        }
        ExprKind::Method { name, .. } if name == "requires_grad_" => found = true,
        _ => {}
    });
    found
}

/// Whether any statement multiplies matrices (`@`, `matmul`, `linear`, attention): what
/// autocast runs in lower precision.
pub fn multiplies_matrices(stmts: &[Stmt]) -> bool {
    let mut found = false;
    walk_exprs(stmts, &mut |e| match &e.kind {
        ExprKind::Binary {
            op: super::ast::BinOp::MatMul,
            ..
        } => found = true,
        ExprKind::Call { func, .. } | ExprKind::Method { name: func, .. }
            if matches!(
                func.as_str(),
                "matmul" | "mm" | "bmm" | "linear" | "scaled_dot_product_attention"
            ) =>
        {
            found = true
        }
        _ => {}
    });
    found
}

/// Whether any statement is inside a block of this kind.
pub fn has_block(stmts: &[Stmt], pred: &dyn Fn(&BlockKind) -> bool) -> bool {
    stmts.iter().any(|s| match &s.kind {
        StmtKind::Block { kind, body } => pred(kind) || has_block(body, pred),
        _ => false,
    })
}

/// The statements inside one block of `kind`, starting where the first one did.
pub fn wrap(stmts: Vec<Stmt>, kind: BlockKind) -> Vec<Stmt> {
    let Some(span) = stmts.first().map(|s| s.span) else {
        return stmts;
    };
    vec![Stmt {
        kind: StmtKind::Block { kind, body: stmts },
        span,
    }]
}

/// Rewrites every expression with `f` (innermost first).
fn map_exprs(stmts: &mut [Stmt], f: &dyn Fn(&mut Expr)) {
    fn expr(e: &mut Expr, f: &dyn Fn(&mut Expr)) {
        match &mut e.kind {
            ExprKind::List(items) => items.iter_mut().for_each(|i| expr(i, f)),
            ExprKind::Neg(x) => expr(x, f),
            ExprKind::Binary { lhs, rhs, .. } => {
                expr(lhs, f);
                expr(rhs, f);
            }
            ExprKind::Call { args, kwargs, .. } => {
                args.iter_mut().for_each(|a| expr(a, f));
                kwargs.iter_mut().for_each(|(_, a)| expr(a, f));
            }
            ExprKind::Method {
                recv, args, kwargs, ..
            } => {
                expr(recv, f);
                args.iter_mut().for_each(|a| expr(a, f));
                kwargs.iter_mut().for_each(|(_, a)| expr(a, f));
            }
            ExprKind::Attr { recv, .. } | ExprKind::Index { recv, .. } => expr(recv, f),
            _ => {}
        }
        f(e);
    }
    for s in stmts {
        match &mut s.kind {
            StmtKind::Assign { value, .. } => expr(value, f),
            StmtKind::SetItem { target, value } => {
                expr(target, f);
                expr(value, f);
            }
            StmtKind::Expr(e) => expr(e, f),
            StmtKind::Del(_) => {}
            StmtKind::Block { body, .. } => map_exprs(body, f),
        }
    }
}

/// `adam(...)` and `adamw(...)` become bitsandbytes' `adam8bit(...)` and `adamw8bit(...)`
/// with the same arguments.
pub fn adam_to_8bit(stmts: &mut [Stmt]) {
    map_exprs(stmts, &|e| {
        if let ExprKind::Call { func, .. } = &mut e.kind {
            if func == "adam" {
                *func = "adam8bit".into();
            } else if func == "adamw" {
                *func = "adamw8bit".into();
            }
        }
    });
}

/// `adam(...)` and `adamw(...)` become `sgd(...)` over the same parameters (Adam's keyword
/// arguments mean nothing to SGD; `foreach` stays).
pub fn adam_to_sgd(stmts: &mut [Stmt]) {
    map_exprs(stmts, &|e| {
        if let ExprKind::Call { func, kwargs, .. } = &mut e.kind {
            if func == "adam" || func == "adamw" {
                *func = "sgd".into();
                kwargs.retain(|(k, _)| k == "foreach");
            }
        }
    });
}

/// `keep(x)` becomes `x.item()`: a number is kept instead of the tensor and its graph.
pub fn keep_to_item(stmts: &mut [Stmt]) {
    map_exprs(stmts, &|e| {
        if let ExprKind::Call { func, args, kwargs } = &mut e.kind {
            if func == "keep" && args.len() == 1 && kwargs.is_empty() {
                let recv = args.pop().expect("one argument");
                e.kind = ExprKind::Method {
                    recv: Box::new(recv),
                    name: "item".into(),
                    args: Vec::new(),
                    kwargs: Vec::new(),
                };
            }
        }
    });
}
