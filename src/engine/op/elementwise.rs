//! Elementwise ops: unary functions, binary arithmetic (with broadcasting), a tensor with a
//! Python scalar, and the in-place forms. Each carries its name, its kernel name and what its
//! backward keeps (PyTorch's `derivatives.yaml`).

use super::Save;

/// Elementwise unary functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unary {
    Neg,
    Sin,
    Cos,
    Exp,
    Relu,
    /// GELU, exact (erf) form, PyTorch's default.
    Gelu,
    /// `x * sigmoid(x)` (`F.silu`, Llama's MLP activation).
    Silu,
    Sigmoid,
    Tanh,
    /// `tril()`: the lower triangle (of a mask, say); saves nothing.
    Tril,
    /// `~x` / `bitwise_not()`; saves nothing.
    BitwiseNot,
}

impl Unary {
    pub const ALL: [Unary; 11] = [
        Unary::Neg,
        Unary::Sin,
        Unary::Cos,
        Unary::Exp,
        Unary::Relu,
        Unary::Gelu,
        Unary::Silu,
        Unary::Sigmoid,
        Unary::Tanh,
        Unary::Tril,
        Unary::BitwiseNot,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Unary::Neg => "neg",
            Unary::Sin => "sin",
            Unary::Cos => "cos",
            Unary::Exp => "exp",
            Unary::Relu => "relu",
            Unary::Gelu => "gelu",
            Unary::Silu => "silu",
            Unary::Sigmoid => "sigmoid",
            Unary::Tanh => "tanh",
            Unary::Tril => "tril",
            Unary::BitwiseNot => "bitwise_not",
        }
    }

    /// Other script names of some of them.
    pub const ALIASES: &'static [(&'static str, Unary)] = &[("logical_not", Unary::BitwiseNot)];

    /// The script names that reach it (the name, and aliases).
    pub fn parse(name: &str) -> Option<Unary> {
        Unary::ALIASES
            .iter()
            .find(|(a, _)| *a == name)
            .map(|(_, u)| *u)
            .or_else(|| Unary::ALL.into_iter().find(|u| u.name() == name))
    }

    /// What it computes, for `--help`.
    pub fn doc(self) -> &'static str {
        match self {
            Unary::Neg => "-x",
            Unary::Sin => "sine (saves its input)",
            Unary::Cos => "cosine (saves its input)",
            Unary::Exp => "exponential (saves its result)",
            Unary::Relu => "max(x, 0) (saves its result)",
            Unary::Gelu => "GELU, erf form (saves its input)",
            Unary::Silu => "x * sigmoid(x) (saves its input)",
            Unary::Sigmoid => "logistic (saves its result)",
            Unary::Tanh => "tanh (saves its result)",
            Unary::Tril => "lower triangle of the last two dimensions",
            Unary::BitwiseNot => "~x (also logical_not)",
        }
    }

    /// derivatives.yaml: sin/cos/gelu/silu need the input; exp/relu/sigmoid/tanh the result.
    pub fn saves(self) -> &'static [Save] {
        match self {
            Unary::Neg | Unary::Tril | Unary::BitwiseNot => &[],
            Unary::Sin | Unary::Cos | Unary::Gelu | Unary::Silu => &[Save::Input(0)],
            Unary::Exp | Unary::Relu | Unary::Sigmoid | Unary::Tanh => &[Save::Output],
        }
    }
}

/// Binary arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
}

impl Binary {
    pub fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
        }
    }

    /// `a * b` keeps `b` for `a`'s gradient and `a` for `b`'s; `a / b` keeps `b` (and `a` for
    /// `b`'s gradient); add and sub keep nothing.
    pub fn saves(self) -> &'static [Save] {
        match self {
            Binary::Add | Binary::Sub => &[],
            Binary::Mul => &[Save::InputFor(1, 0), Save::InputFor(0, 1)],
            Binary::Div => &[Save::Input(1), Save::InputFor(0, 1)],
        }
    }

    pub fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            Binary::Add => a + b,
            Binary::Sub => a - b,
            Binary::Mul => a * b,
            Binary::Div => a / b,
        }
    }
}

/// What a factory fills its tensor with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fill {
    /// Standard normal, from the device's generator (see `backend::cpu::rng`).
    Randn,
    /// Uniform on [0, 1).
    Rand,
    Zeros,
    Ones,
    /// Uninitialized memory: nothing is written.
    Empty,
    Full(f64),
    /// `start, start + step, ...`
    Arange {
        start: f64,
        step: f64,
    },
}

impl Fill {
    pub fn name(self) -> &'static str {
        match self {
            Fill::Randn => "randn",
            Fill::Rand => "rand",
            Fill::Zeros => "zeros",
            Fill::Ones => "ones",
            Fill::Empty => "empty",
            Fill::Full(_) => "full",
            Fill::Arange { .. } => "arange",
        }
    }
}

/// In-place ops: they write into their tensor's own storage and allocate nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InPlace {
    /// `x.add_(y)` (and sub_, mul_, div_) with a tensor operand (the kernel's second input).
    Tensor(Binary),
    /// `x.add_(2.0)` and friends with a Python scalar.
    Scalar(Binary, f64),
    Unary(Unary),
    /// `zero_()` and `fill_(v)`.
    Fill(f64),
}

impl InPlace {
    /// The method names, as scripts call them.
    pub fn parse(name: &str) -> Option<&'static str> {
        const NAMES: [&str; 10] = [
            "add_", "sub_", "mul_", "div_", "relu_", "zero_", "fill_", "sin_", "exp_", "neg_",
        ];
        NAMES.iter().copied().find(|n| *n == name)
    }
}
