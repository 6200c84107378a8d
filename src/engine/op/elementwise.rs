//! Elementwise ops: unary functions, binary arithmetic (with broadcasting), a tensor with a
//! Python scalar, and the in-place forms. Each carries its name, its kernel name and what its
//! backward keeps (PyTorch's `derivatives.yaml`); and the family's script functions: factories,
//! arithmetic, the unary functions (generated from [`Unary::ALL`]) and the in-place methods.

use super::script::{entries, Arg, Bound, Entry, Form, Made, Param as P, UNARY, X};
use super::{Op, Save};
use crate::engine::dtype::DType;
use crate::engine::TensorId;

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
    /// `1 / sqrt(x)` (Llama's RMSNorm).
    Rsqrt,
    Sqrt,
    /// `tril()`: the lower triangle (of a mask, say); saves nothing.
    Tril,
    /// `~x` / `bitwise_not()`; saves nothing.
    BitwiseNot,
}

impl Unary {
    pub const ALL: [Unary; 13] = [
        Unary::Neg,
        Unary::Sin,
        Unary::Cos,
        Unary::Exp,
        Unary::Relu,
        Unary::Gelu,
        Unary::Silu,
        Unary::Sigmoid,
        Unary::Tanh,
        Unary::Rsqrt,
        Unary::Sqrt,
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
            Unary::Rsqrt => "rsqrt",
            Unary::Sqrt => "sqrt",
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
            Unary::Rsqrt => "1 / sqrt(x) (saves its result; backward takes two temporaries)",
            Unary::Sqrt => "square root (saves its result)",
            Unary::Tril => "lower triangle of the last two dimensions",
            Unary::BitwiseNot => "~x (also logical_not)",
        }
    }

    /// derivatives.yaml: sin/cos/gelu/silu need the input; exp/relu/sigmoid/tanh/rsqrt/sqrt
    /// the result.
    pub fn saves(self) -> &'static [Save] {
        match self {
            Unary::Neg | Unary::Tril | Unary::BitwiseNot => &[],
            Unary::Sin | Unary::Cos | Unary::Gelu | Unary::Silu => &[Save::Input(0)],
            Unary::Exp
            | Unary::Relu
            | Unary::Sigmoid
            | Unary::Tanh
            | Unary::Rsqrt
            | Unary::Sqrt => &[Save::Output],
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
    /// `copy_(src)`, `src` broadcast (the kernel's second input); `x[...] = src` is one on a
    /// view.
    Copy,
    /// `masked_fill_(mask, value)` (the mask is the kernel's second input).
    MaskedFill(f64),
}

impl InPlace {
    /// The method names, as scripts call them.
    pub fn parse(name: &str) -> Option<&'static str> {
        const NAMES: [&str; 11] = [
            "add_", "sub_", "mul_", "div_", "relu_", "zero_", "fill_", "sin_", "exp_", "neg_",
            "copy_",
        ];
        NAMES.iter().copied().find(|n| *n == name)
    }
}

// The family's script functions and methods.

fn unary(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let u = Unary::parse(name).ok_or("not a unary op")?;
    Ok(Made::Op {
        op: Op::Unary(u),
        inputs: smallvec::smallvec![b.tensor(0).ok_or("expects a tensor")?],
    })
}

fn factory(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    // `torch.randn()` is a TypeError; `torch.randn([])` a 0-dim tensor
    if !b.list_given && name != "arange" {
        return Err(format!(
            "{name}() received an invalid combination of arguments - got (), but expected \
             (tuple of ints size): give the shape, e.g. {name}(2, 3) ({name}([]) is a 0-dim \
             tensor)"
        ));
    }
    let (fill, shape) = match name {
        "full" => {
            let v = b.float(1).ok_or("full expects (size, fill_value)")?;
            (Fill::Full(v), b.dims()?)
        }
        "arange" => {
            let (start, end, step) = match b.list[..] {
                [e] => (0.0, e, 1.0),
                [s, e] => (s, e, 1.0),
                [s, e, st] => (s, e, st),
                _ => return Err("arange expects (end), (start, end) or (start, end, step)".into()),
            };
            if step == 0.0 {
                return Err("arange step must be nonzero".into());
            }
            let n = ((end - start) / step).ceil().max(0.0) as usize;
            (Fill::Arange { start, step }, vec![n])
        }
        "randn" => (Fill::Randn, b.dims()?),
        "rand" => (Fill::Rand, b.dims()?),
        "zeros" => (Fill::Zeros, b.dims()?),
        "ones" => (Fill::Ones, b.dims()?),
        _ => (Fill::Empty, b.dims()?),
    };
    let dtype_at = if name == "full" { 2 } else { 1 };
    let default = if name == "arange" && b.list_ints {
        DType::I64
    } else {
        DType::F32
    };
    Ok(Made::Factory {
        fill,
        shape,
        dtype: b.dtype(dtype_at).unwrap_or(default),
        requires_grad: b.flag(dtype_at + 1),
    })
}

fn binary_fn(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let op = match name {
        "add" => Binary::Add,
        "sub" => Binary::Sub,
        "mul" => Binary::Mul,
        _ => Binary::Div,
    };
    Ok(Made::Op {
        op: Op::Binary(op),
        inputs: smallvec::smallvec![
            b.tensor(0).ok_or("expects a tensor")?,
            b.tensor(1).ok_or("expects two tensors")?,
        ],
    })
}

fn bitwise(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    Ok(Made::Op {
        op: Op::Bitwise {
            or: name == "bitwise_or",
        },
        inputs: smallvec::smallvec![
            b.tensor(0).ok_or("expects a tensor")?,
            b.tensor(1).ok_or("expects two tensors")?,
        ],
    })
}

fn pow(_: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    Ok(Made::Op {
        op: Op::Pow {
            exponent: b
                .float(1)
                .ok_or("pow expects (input, exponent), the exponent a number")?,
        },
        inputs: smallvec::smallvec![b.tensor(0).ok_or("expects a tensor")?],
    })
}

fn where_fn(_: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    Ok(Made::Op {
        op: Op::Where,
        inputs: smallvec::smallvec![
            b.tensor(0).ok_or("where expects a condition tensor")?,
            b.tensor(1).ok_or(
                "where expects tensors (make a number a 0-dim tensor: full([], fill_value=v))",
            )?,
            b.tensor(2).ok_or(
                "where expects tensors (make a number a 0-dim tensor: full([], fill_value=v))",
            )?,
        ],
    })
}

fn compare(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let cmp = super::Cmp::parse(name).ok_or("not a comparison")?;
    let x = b.tensor(0).ok_or("expects a tensor")?;
    match b.args.get(1) {
        Some(Arg::Tensor(y)) => Ok(Made::Op {
            op: Op::Compare { cmp, scalar: None },
            inputs: smallvec::smallvec![x, *y],
        }),
        _ => Ok(Made::Op {
            op: Op::Compare {
                cmp,
                scalar: Some(
                    b.float(1)
                        .ok_or("expects a tensor or a number to compare with")?,
                ),
            },
            inputs: smallvec::smallvec![x],
        }),
    }
}

fn cumsum(_: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    Ok(Made::Op {
        op: Op::Cumsum {
            dim: b.int(1).ok_or("cumsum expects a dim")?,
            dtype: b.dtype(2),
        },
        inputs: smallvec::smallvec![b.tensor(0).ok_or("expects a tensor")?],
    })
}

fn logical(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    Ok(Made::Op {
        op: Op::Logical {
            any: name == "any",
            dim: b.int(1),
        },
        inputs: smallvec::smallvec![b.tensor(0).ok_or("expects a tensor")?],
    })
}

fn inplace(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let name = InPlace::parse(name).ok_or("not in-place")?;
    Ok(Made::InPlace {
        name,
        x: b.tensor(0).ok_or("expects a tensor")?,
        operand: b.args.get(1).copied().filter(|a| *a != Arg::None),
    })
}

const SIZES: &[P] = &[
    P::Sizes("size"),
    P::DType("dtype"),
    P::Bool("requires_grad", false),
];
const FULL: &[P] = &[
    P::Sizes("size"),
    P::Float("fill_value", None),
    P::DType("dtype"),
    P::Bool("requires_grad", false),
];
const TWO: &[P] = &[X, P::Tensor("other")];
const CMP: &[P] = &[X, P::Operand("other")];
const INPLACE: &[P] = &[X, P::Operand("other")];

entries! {
    "randn", Function, SIZES, factory, "standard normal";
    "rand", Function, SIZES, factory, "uniform on [0, 1)";
    "zeros", Function, SIZES, factory, "zeros";
    "ones", Function, SIZES, factory, "ones";
    "empty", Function, SIZES, factory, "uninitialized";
    "full", Function, FULL, factory, "filled with fill_value";
    "arange", Function, &[P::Numbers("start_end_step"), P::DType("dtype"), P::Bool("requires_grad", false)], factory, "start, start + step, ... below end (int64 for integer arguments)";
    "pow", Both, &[X, P::Float("exponent", None)], pow, "x ** exponent, a number (also x ** 2; saves its input; backward takes two temporaries)";
    "le", Both, CMP, compare, "x <= other (a tensor, broadcast, or a number): a bool tensor";
    "lt", Both, CMP, compare, "x < other: a bool tensor";
    "ge", Both, CMP, compare, "x >= other: a bool tensor";
    "gt", Both, CMP, compare, "x > other: a bool tensor";
    "eq", Both, CMP, compare, "x == other: a bool tensor";
    "ne", Both, CMP, compare, "x != other: a bool tensor";
    "cumsum", Both, &[X, P::Int("dim", None), P::DType("dtype")], cumsum, "running sum along dim, in dtype if given (else int64 for an integer or bool input, whose int64 copy it takes)";
    "all", Both, &[X, P::OptInt("dim")], logical, "whether every element is nonzero (over dim, or everything): a bool tensor";
    "any", Both, &[X, P::OptInt("dim")], logical, "whether any element is nonzero (over dim, or everything): a bool tensor";
    "where", Function, &[P::Tensor("condition"), X, P::Tensor("other")], where_fn, "input where condition, else other, broadcast (keeps the condition)";
    "add", Both, TWO, binary_fn, "x + other, broadcast";
    "sub", Both, TWO, binary_fn, "x - other, broadcast";
    "mul", Both, TWO, binary_fn, "x * other, broadcast";
    "div", Both, TWO, binary_fn, "x / other, broadcast";
    "bitwise_and", Both, TWO, bitwise, "x & other of integer or bool tensors, broadcast (the wider integer type)";
    "bitwise_or", Both, TWO, bitwise, "x | other of integer or bool tensors, broadcast";
    "add_", Method, INPLACE, inplace, "in place: x += other (a tensor or number); in the autograd graph, its history rebased";
    "sub_", Method, INPLACE, inplace, "in place: x -= other; in the autograd graph too";
    "mul_", Method, INPLACE, inplace, "in place: x *= other; in the autograd graph by a number only";
    "div_", Method, INPLACE, inplace, "in place: x /= other; in the autograd graph by a number only";
    "fill_", Method, &[X, P::Float("value", None)], inplace, "in place: every element value; outside autograd only";
    "zero_", Method, UNARY, inplace, "in place: zeros; outside autograd only";
    "copy_", Method, INPLACE, inplace, "in place: src's values, broadcast (also x[...] = src); outside autograd only";
    "relu_", Method, UNARY, inplace, "in place: relu; in the autograd graph too (its backward keeps the result: no allocation)";
    "sin_", Method, UNARY, inplace, "in place: sine; outside autograd only";
    "exp_", Method, UNARY, inplace, "in place: exponential; in the autograd graph too (keeps the result)";
    "neg_", Method, UNARY, inplace, "in place: negation; in the autograd graph too";
}

/// The unary functions' entries, made from [`Unary::ALL`] (each a function and a method).
pub(super) fn unary_entries() -> &'static [Entry] {
    use std::sync::OnceLock;
    static U: OnceLock<Vec<Entry>> = OnceLock::new();
    U.get_or_init(|| {
        let mut names: Vec<&'static str> = Unary::ALL.iter().map(|u| u.name()).collect();
        names.extend(Unary::ALIASES.iter().map(|(a, _)| *a));
        names
            .into_iter()
            .map(|name| Entry {
                name,
                form: Form::Both,
                params: UNARY,
                doc: Unary::parse(name).expect("a unary op").doc(),
                make: unary,
            })
            .collect()
    })
}
