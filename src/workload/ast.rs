//! The parsed workload: the `[workload]` settings and the statements of `setup` and `body`.
//!
//! Every statement and expression carries a [`Span`]: where it starts in the TOML file (1-based
//! line and character column), not in the `setup`/`body` string.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::alloc::AllocConf;

/// A parsed and validated workload file. Nothing in it has been run.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// `name`: required, non-empty.
    pub name: String,
    /// `iterations`: how many times `body` runs (default 1, at least 1).
    pub iterations: u32,
    /// `capacity`: the simulated device's size in bytes, when given.
    pub capacity: Option<u64>,
    /// `alloc_conf`, parsed with PyTorch's syntax; the string as written is in
    /// [`AllocConf::raw`] (`""` when the key is absent, which gives PyTorch's defaults).
    pub alloc_conf: AllocConf,
    /// Where `alloc_conf` came from: `--alloc-conf`, `alloc_conf` (the workload),
    /// `PYTORCH_CUDA_ALLOC_CONF` or `PYTORCH_ALLOC_CONF` (the environment), or `default`.
    pub alloc_conf_from: String,
    /// `device`: where the workload is meant to run (default [`Device::Sim`]).
    pub device: Device,
    /// `description`: free text.
    pub description: Option<String>,
    /// `setup`: statements run once, before the first iteration.
    pub setup: Vec<Stmt>,
    /// `body`: statements run on every iteration.
    pub body: Vec<Stmt>,
    /// `[params]`: integer parameters, bound as names before `setup` runs (`randn(batch, 1024)`).
    pub params: Vec<(String, i64)>,
    /// For a `[model]` preset: what it is set to.
    pub preset: Option<super::preset::PresetInfo>,
    /// `[check]`: tolerances and budgets for `gpumem check` (empty when absent).
    pub check: super::check::CheckTable,
    /// `[model] weights`: a safetensors state_dict (relative to the workload file's folder).
    pub weights: Option<std::path::PathBuf>,
    /// `[data] file`: a safetensors file of batches (relative to the workload file's folder).
    pub data: Option<std::path::PathBuf>,
}

impl Workload {
    /// The integer parameters `--param` and `gpumem fit --param` may set: a script's
    /// `[params]`, or a preset's integer keys.
    pub fn integer_params(&self) -> Vec<(String, i64)> {
        match &self.preset {
            Some(p) => p.ints.iter().map(|(k, v)| (k.clone(), *v as i64)).collect(),
            None => self.params.clone(),
        }
    }

    /// The batch-size parameter, when the workload has one (`batch`, or `batch_size`).
    pub fn batch_param(&self) -> Option<(String, i64)> {
        let ints = self.integer_params();
        ["batch", "batch_size"]
            .iter()
            .find_map(|n| ints.iter().find(|(k, _)| k == n).cloned())
    }
}

/// The `device` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// gpumem's simulated device (no GPU needed).
    #[default]
    Sim,
    Cpu,
    Cuda,
}

impl Device {
    /// The spelling used in workload files.
    pub fn as_str(self) -> &'static str {
        match self {
            Device::Sim => "sim",
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a statement or expression starts in the TOML file: 1-based line and character column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Span {
    pub line: u32,
    pub col: u32,
}

impl Span {
    pub fn new(line: u32, col: u32) -> Self {
        Span { line, col }
    }

    /// `line L column C`, the location text of gpumem's input errors.
    pub fn location(self) -> String {
        format!("line {} column {}", self.line, self.col)
    }
}

impl fmt::Display for Span {
    /// `L:C`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// A name in a script: a variable (assigned, deleted, read, a loop's counter) or a function
/// or method called. It reads, compares and prints as its text; beside the text it keeps what
/// the runner resolved it to (a variable's slot, a call's entry), so that a statement run a
/// million times looks its names up once. Resolutions depend on the script alone, never on a
/// run's state, so runs sharing a script (in parallel too) store the same values.
pub struct Ident {
    text: String,
    resolved: AtomicU32,
}

impl Ident {
    const UNRESOLVED: u32 = u32::MAX;

    pub fn new(text: impl Into<String>) -> Self {
        Ident {
            text: text.into(),
            resolved: AtomicU32::new(Self::UNRESOLVED),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// What the runner stored with [`Ident::set_resolved`], if anything.
    #[inline]
    pub fn resolved(&self) -> Option<u32> {
        match self.resolved.load(Ordering::Relaxed) {
            Self::UNRESOLVED => None,
            v => Some(v),
        }
    }

    /// Stores a resolution (`u32::MAX` is not one).
    pub fn set_resolved(&self, v: u32) {
        debug_assert!(v != Self::UNRESOLVED);
        self.resolved.store(v, Ordering::Relaxed);
    }
}

impl Clone for Ident {
    fn clone(&self) -> Self {
        Ident {
            text: self.text.clone(),
            resolved: AtomicU32::new(self.resolved.load(Ordering::Relaxed)),
        }
    }
}

impl std::ops::Deref for Ident {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Names compare by their text (a resolved name equals the same name unresolved).
impl PartialEq for Ident {
    fn eq(&self, other: &Ident) -> bool {
        self.text == other.text
    }
}

impl PartialEq<str> for Ident {
    fn eq(&self, other: &str) -> bool {
        self.text == other
    }
}

impl PartialEq<&str> for Ident {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

impl From<String> for Ident {
    fn from(s: String) -> Self {
        Ident::new(s)
    }
}

impl From<&str> for Ident {
    fn from(s: &str) -> Self {
        Ident::new(s)
    }
}

/// A node of a script, as [`visit`] hands it out.
#[derive(Debug, Clone, Copy)]
pub enum Node<'a> {
    Stmt(&'a Stmt),
    Expr(&'a Expr),
}

/// Calls `f` on every statement and every expression of `stmts`, in source order, each node
/// before what it holds (a block's header expressions, such as a loop's count, before its
/// body).
pub fn visit<'a>(stmts: &'a [Stmt], f: &mut dyn FnMut(Node<'a>)) {
    fn expr<'a>(e: &'a Expr, f: &mut dyn FnMut(Node<'a>)) {
        f(Node::Expr(e));
        match &e.kind {
            ExprKind::List(items) => items.iter().for_each(|i| expr(i, f)),
            ExprKind::Neg(x) => expr(x, f),
            ExprKind::Binary { lhs, rhs, .. } => {
                expr(lhs, f);
                expr(rhs, f);
            }
            ExprKind::Call { args, kwargs, .. } => {
                args.iter().for_each(|a| expr(a, f));
                kwargs.iter().for_each(|(_, a)| expr(a, f));
            }
            ExprKind::Method {
                recv, args, kwargs, ..
            } => {
                expr(recv, f);
                args.iter().for_each(|a| expr(a, f));
                kwargs.iter().for_each(|(_, a)| expr(a, f));
            }
            ExprKind::Attr { recv, .. } => expr(recv, f),
            ExprKind::Index { recv, items } => {
                expr(recv, f);
                for i in items {
                    match i {
                        IndexItem::Expr(x) => expr(x, f),
                        IndexItem::Slice { start, stop, step } => {
                            for x in [start, stop, step].into_iter().flatten() {
                                expr(x, f);
                            }
                        }
                        IndexItem::Ellipsis | IndexItem::NewAxis => {}
                    }
                }
            }
            ExprKind::Name(_)
            | ExprKind::Int(_)
            | ExprKind::Float(_)
            | ExprKind::Str(_)
            | ExprKind::Bool(_)
            | ExprKind::None => {}
        }
    }
    for s in stmts {
        f(Node::Stmt(s));
        match &s.kind {
            StmtKind::Assign { value, .. } => expr(value, f),
            StmtKind::SetItem { target, value } => {
                expr(target, f);
                expr(value, f);
            }
            StmtKind::Expr(e) => expr(e, f),
            StmtKind::Del(_) => {}
            StmtKind::Block { kind, body } => {
                if let BlockKind::For { count, .. } = kind {
                    expr(count, f);
                }
                visit(body, f);
            }
        }
    }
}

/// One statement (one logical line, or a block with its lines).
#[derive(Debug, Clone, PartialEq)]
pub struct Stmt {
    pub kind: StmtKind,
    /// The statement's first character.
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StmtKind {
    /// `x = EXPR` (one target) or `a, b = EXPR` (several: the value is unpacked).
    Assign { targets: Vec<Ident>, value: Expr },
    /// `x[items] = EXPR`: the value copied into the indexed view of `x`, in place.
    SetItem { target: Expr, value: Expr },
    /// `del x` or `del x, y`.
    Del(Vec<Ident>),
    /// A bare expression, e.g. `loss.backward()` or `mark("after forward")`.
    Expr(Expr),
    /// `no_grad {` ... `}` and the other blocks.
    Block { kind: BlockKind, body: Vec<Stmt> },
}

/// The block statements. They nest.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockKind {
    /// `no_grad {`
    NoGrad,
    /// `autocast {`, `autocast(bf16) {` or `autocast(dtype=f16) {`; the dtype as written.
    Autocast { dtype: Option<String> },
    /// `checkpoint {`: activation checkpointing of the statements inside; `checkpoint(a, b) {`
    /// also holds tensors the region's function was called with (as
    /// `torch.utils.checkpoint(fn, *args)` does) until its backward is done.
    Checkpoint { hold: Vec<Ident> },
    /// `scope "encoder.layer3" {`: a module-path tag for what is allocated inside.
    /// (its [`Ident`] resolves to the scope's slot: `runner::names`)
    Scope(Ident),
    /// `phase "forward" {`: a phase tag for what is allocated inside.
    Phase(String),
    /// `for i in range(N) {`: the statements inside N times, `i` bound to 0, 1, ... N - 1.
    For { var: Ident, count: Expr },
}

impl fmt::Display for BlockKind {
    /// The block's header as written in a workload, without the `{`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockKind::NoGrad => f.write_str("no_grad"),
            BlockKind::Autocast { dtype: None } => f.write_str("autocast"),
            BlockKind::Autocast { dtype: Some(d) } => write!(f, "autocast({d})"),
            BlockKind::Checkpoint { hold } if hold.is_empty() => f.write_str("checkpoint"),
            BlockKind::Checkpoint { hold } => {
                let names: Vec<&str> = hold.iter().map(Ident::as_str).collect();
                write!(f, "checkpoint({})", names.join(", "))
            }
            BlockKind::Scope(s) => write!(f, "scope {}", quoted(s)),
            BlockKind::Phase(s) => write!(f, "phase {}", quoted(s)),
            BlockKind::For { var, count } => write!(f, "for {var} in range({count})"),
        }
    }
}

/// An expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    /// The expression's first character (for `a + b`, the `a`; for `x.f()`, the `x`).
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    Name(Ident),
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
    /// `none`
    None,
    /// `[a, b]`
    List(Vec<Expr>),
    /// `-x`
    Neg(Box<Expr>),
    Binary {
        op: BinOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    /// `f(args, k=v)`: a call of a plain name.
    Call {
        func: Ident,
        args: Vec<Expr>,
        kwargs: Vec<(String, Expr)>,
    },
    /// `recv.name(args, k=v)`
    Method {
        recv: Box<Expr>,
        name: Ident,
        args: Vec<Expr>,
        kwargs: Vec<(String, Expr)>,
    },
    /// `recv.name` (e.g. `x.T`, `x.shape`)
    Attr {
        recv: Box<Expr>,
        name: String,
    },
    /// `recv[items]`
    Index {
        recv: Box<Expr>,
        items: Vec<IndexItem>,
    },
}

/// One comma-separated item inside `x[...]`.
#[derive(Debug, Clone, PartialEq)]
pub enum IndexItem {
    /// `x[0]`, `x[i + 1]`
    Expr(Expr),
    /// `start:stop` or `start:stop:step`, any part omitted (`:`, `1:`, `::2`).
    Slice {
        start: Option<Expr>,
        stop: Option<Expr>,
        step: Option<Expr>,
    },
    /// `...`
    Ellipsis,
    /// `none`: a new axis of size 1.
    NewAxis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    /// `@`, matrix multiplication.
    MatMul,
    /// `**`, a power (right-associative, binding tighter than a unary minus on its left).
    Pow,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::MatMul => "@",
            BinOp::Pow => "**",
        }
    }

    /// Binding strength: `+ -` bind less tightly than `* / @`.
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Add | BinOp::Sub => PREC_SUM,
            BinOp::Mul | BinOp::Div | BinOp::MatMul => PREC_PRODUCT,
            BinOp::Pow => PREC_POWER,
        }
    }
}

impl fmt::Display for BinOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

const PREC_SUM: u8 = 1;
const PREC_PRODUCT: u8 = 2;
const PREC_UNARY: u8 = 3;
const PREC_POWER: u8 = 4;
const PREC_POSTFIX: u8 = 5;

impl Expr {
    pub fn new(kind: ExprKind, span: Span) -> Self {
        Expr { kind, span }
    }

    /// How tightly the printed form binds, to know where `Display` needs parentheses.
    fn precedence(&self) -> u8 {
        match &self.kind {
            ExprKind::Binary { op, .. } => op.precedence(),
            ExprKind::Neg(_) => PREC_UNARY,
            _ => PREC_POSTFIX,
        }
    }

    /// Writes `self`, in parentheses if it binds less tightly than `min`.
    fn fmt_at(&self, f: &mut fmt::Formatter<'_>, min: u8) -> fmt::Result {
        if self.precedence() < min {
            write!(f, "({self})")
        } else {
            write!(f, "{self}")
        }
    }
}

/// `"..."` with `\"` and `\\` escaped, as the line language reads strings.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn fmt_args(f: &mut fmt::Formatter<'_>, args: &[Expr], kwargs: &[(String, Expr)]) -> fmt::Result {
    f.write_str("(")?;
    let mut first = true;
    for a in args {
        if !first {
            f.write_str(", ")?;
        }
        first = false;
        write!(f, "{a}")?;
    }
    for (k, v) in kwargs {
        if !first {
            f.write_str(", ")?;
        }
        first = false;
        write!(f, "{k}={v}")?;
    }
    f.write_str(")")
}

impl fmt::Display for Expr {
    /// The expression in source form, with parentheses only where precedence needs them:
    /// parsing the output gives the same tree (spans aside).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ExprKind::Name(n) => f.write_str(n),
            ExprKind::Int(i) => write!(f, "{i}"),
            ExprKind::Float(x) => {
                // `{:?}` keeps a `.0` or exponent, so the text reads back as a float.
                if x.is_finite() {
                    write!(f, "{x:?}")
                } else {
                    write!(f, "{x}")
                }
            }
            ExprKind::Str(s) => f.write_str(&quoted(s)),
            ExprKind::Bool(b) => f.write_str(if *b { "true" } else { "false" }),
            ExprKind::None => f.write_str("none"),
            ExprKind::List(items) => {
                f.write_str("[")?;
                for (i, e) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{e}")?;
                }
                f.write_str("]")
            }
            ExprKind::Neg(e) => {
                f.write_str("-")?;
                e.fmt_at(f, PREC_UNARY)
            }
            ExprKind::Binary {
                op: BinOp::Pow,
                lhs,
                rhs,
            } => {
                // right-associative: a power on the left needs parentheses, and its right
                // operand may be a unary minus (`x ** -1`)
                lhs.fmt_at(f, PREC_POSTFIX)?;
                f.write_str(" ** ")?;
                rhs.fmt_at(f, PREC_UNARY)
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let p = op.precedence();
                lhs.fmt_at(f, p)?;
                write!(f, " {op} ")?;
                // Left-associative: a right operand of the same strength needs parentheses.
                rhs.fmt_at(f, p + 1)
            }
            ExprKind::Call { func, args, kwargs } => {
                f.write_str(func)?;
                fmt_args(f, args, kwargs)
            }
            ExprKind::Method {
                recv,
                name,
                args,
                kwargs,
            } => {
                recv.fmt_at(f, PREC_POSTFIX)?;
                write!(f, ".{name}")?;
                fmt_args(f, args, kwargs)
            }
            ExprKind::Attr { recv, name } => {
                recv.fmt_at(f, PREC_POSTFIX)?;
                write!(f, ".{name}")
            }
            ExprKind::Index { recv, items } => {
                recv.fmt_at(f, PREC_POSTFIX)?;
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
        }
    }
}

impl fmt::Display for IndexItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // a lone `none` would read back as a new axis
            IndexItem::Expr(e) if e.kind == ExprKind::None => write!(f, "({e})"),
            IndexItem::Expr(e) => write!(f, "{e}"),
            IndexItem::Slice { start, stop, step } => {
                if let Some(e) = start {
                    write!(f, "{e}")?;
                }
                f.write_str(":")?;
                if let Some(e) = stop {
                    write!(f, "{e}")?;
                }
                if let Some(e) = step {
                    write!(f, ":{e}")?;
                }
                Ok(())
            }
            IndexItem::Ellipsis => f.write_str("..."),
            IndexItem::NewAxis => f.write_str("none"),
        }
    }
}
