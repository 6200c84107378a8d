//! The script language's tensor functions and methods, generated from the op definitions:
//! each entry names an op family, its parameters (from which the signature shown in `--help`,
//! the README and error messages is printed) and how bound arguments make the op. The runner
//! binds a call's arguments to the parameters and hands the result to the engine; nothing else
//! matches on op names.

use super::{Fill, Op, ViewKind};
use crate::engine::dtype::DType;
use crate::engine::TensorId;

/// How a script reaches an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `f(x, ...)` only.
    Function,
    /// `x.f(...)` only (the receiver is the first parameter).
    Method,
    /// Both.
    Both,
}

/// One parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Param {
    Tensor(&'static str),
    /// A tensor or `none`.
    OptTensor(&'static str),
    /// An integer, with a default (None: required).
    Int(&'static str, Option<i64>),
    /// An integer or `none` (the default).
    OptInt(&'static str),
    Float(&'static str, Option<f64>),
    Bool(&'static str, bool),
    /// Sizes: `f(2, 3)` or `f([2, 3])`; all remaining positional arguments.
    Sizes(&'static str),
    /// A dtype keyword (None: the op's own default).
    DType(&'static str),
    /// Numbers: all remaining positional arguments (arange's start, end, step).
    Numbers(&'static str),
    /// A tensor or a number (an in-place op's operand), or `none`.
    Operand(&'static str),
    /// A list of tensors (`cat([a, b])`).
    Tensors(&'static str),
    /// A dimension, a list of them (into the bound list), or `none` (every one).
    Dims(&'static str),
}

impl Param {
    pub fn name(&self) -> &'static str {
        match *self {
            Param::Tensor(n)
            | Param::OptTensor(n)
            | Param::Int(n, _)
            | Param::OptInt(n)
            | Param::Float(n, _)
            | Param::Bool(n, _)
            | Param::Sizes(n)
            | Param::DType(n)
            | Param::Numbers(n)
            | Param::Operand(n)
            | Param::Tensors(n)
            | Param::Dims(n) => n,
        }
    }

    fn shown(&self) -> String {
        match *self {
            Param::Tensor(n) => n.to_string(),
            Param::OptTensor(n) | Param::OptInt(n) | Param::Dims(n) => format!("{n}=none"),
            Param::Int(n, None) | Param::Float(n, None) => n.to_string(),
            Param::Int(n, Some(d)) => format!("{n}={d}"),
            Param::Float(n, Some(d)) => format!("{n}={d}"),
            Param::Bool(n, d) => format!("{n}={d}"),
            Param::Sizes(n) | Param::Numbers(n) => format!("*{n}"),
            Param::DType(n) => format!("{n}=..."),
            Param::Operand(n) => n.to_string(),
            Param::Tensors(n) => format!("[{n}]"),
        }
    }
}

/// A bound argument.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg<T> {
    Tensor(T),
    Int(i64),
    Float(f64),
    Bool(bool),
    DType(DType),
    None,
}

/// Arguments bound to an entry's parameters: one value per parameter, in order, plus the
/// sizes or numbers of a variadic parameter.
#[derive(Debug, Clone)]
pub struct Bound<T> {
    /// (inline: bound for every call of a script)
    pub args: smallvec::SmallVec<[Arg<T>; 6]>,
    pub list: Vec<f64>,
    /// Whether every number of `list` was written as an integer.
    pub list_ints: bool,
    /// Whether the variadic parameter was given at all (`f()` against `f([])`).
    pub list_given: bool,
    /// The tensors of a list parameter.
    pub tensors: Vec<T>,
}

impl<T> Default for Bound<T> {
    fn default() -> Self {
        Bound {
            args: smallvec::SmallVec::new(),
            list: Vec::new(),
            list_ints: true,
            list_given: false,
            tensors: Vec::new(),
        }
    }
}

impl<T: Copy> Bound<T> {
    pub fn tensor(&self, i: usize) -> Option<T> {
        match self.args.get(i) {
            Some(Arg::Tensor(t)) => Some(*t),
            _ => None,
        }
    }
    pub fn int(&self, i: usize) -> Option<i64> {
        match self.args.get(i) {
            Some(Arg::Int(v)) => Some(*v),
            Some(Arg::Bool(b)) => Some(*b as i64),
            _ => None,
        }
    }
    pub fn float(&self, i: usize) -> Option<f64> {
        match self.args.get(i) {
            Some(Arg::Int(v)) => Some(*v as f64),
            Some(Arg::Float(v)) => Some(*v),
            _ => None,
        }
    }
    pub fn flag(&self, i: usize) -> bool {
        matches!(self.args.get(i), Some(Arg::Bool(true)))
    }
    pub fn dtype(&self, i: usize) -> Option<DType> {
        match self.args.get(i) {
            Some(Arg::DType(d)) => Some(*d),
            _ => None,
        }
    }
    /// Integer sizes of the variadic parameter.
    pub fn sizes(&self) -> Result<Vec<i64>, String> {
        if !self.list_ints {
            return Err("sizes must be integers, as f(2, 3) or f([2, 3])".into());
        }
        Ok(self.list.iter().map(|&v| v as i64).collect())
    }
    pub(super) fn dims(&self) -> Result<Vec<usize>, String> {
        self.sizes()?
            .into_iter()
            .map(|d| usize::try_from(d).map_err(|_| format!("negative dimension {d}")))
            .collect()
    }
}

/// What a call makes, for the engine to run.
#[derive(Debug, Clone, PartialEq)]
pub enum Made<T> {
    /// An op over tensor inputs (autocast applies by the op's policy).
    Op {
        op: Op,
        inputs: smallvec::SmallVec<[T; 4]>,
    },
    /// A factory.
    Factory {
        fill: Fill,
        shape: Vec<usize>,
        dtype: DType,
        requires_grad: bool,
    },
    /// A view or reshape of `x` with integer arguments.
    View {
        kind: ViewKind,
        x: T,
        args: Vec<i64>,
    },
    /// `split`/`chunk`.
    Split {
        chunk: bool,
        x: T,
        size: i64,
        dim: i64,
    },
    /// The input itself (another handle): dropout outside training.
    Same(T),
    /// `contiguous()`: itself, or a copy.
    Contiguous(T),
    /// `cross_entropy(logits, target)`: log_softmax then nll_loss.
    CrossEntropy { logits: T, target: T },
    /// A cast to `dtype` (itself when it has that dtype already).
    To { x: T, dtype: Option<DType> },
    /// An in-place op on `x` (with an operand tensor or scalar).
    InPlace {
        name: &'static str,
        x: T,
        operand: Option<Arg<T>>,
    },
    /// `torch.stack(tensors, dim)`: each unsqueezed at `dim` (a view), then `cat` along it.
    Stack { xs: Vec<T>, dim: i64 },
    /// An op that gives its caller its extras too: `topk`, `sort` (values, indices).
    Multi {
        op: Op,
        inputs: smallvec::SmallVec<[T; 4]>,
    },
    /// `x.index_put_(indices, values)` outside autograd.
    IndexPut { x: T, indices: T, values: T },
    /// `x.masked_fill_(mask, value)`.
    MaskedFillInPlace { x: T, mask: T, value: f64 },
    /// `x.repeat_interleave(repeats, dim)` with a number of repeats: `unsqueeze(dim + 1)`,
    /// `expand`, then `flatten(dim, dim + 1)`, which copies.
    RepeatInterleave { x: T, repeats: i64, dim: i64 },
}

/// One script function or method.
pub struct Entry {
    pub name: &'static str,
    pub form: Form,
    pub params: &'static [Param],
    pub doc: &'static str,
    pub make: fn(&'static str, &Bound<TensorId>) -> Result<Made<TensorId>, String>,
}

impl Entry {
    /// `name(param, param=default, ...)`, for help and errors.
    pub fn signature(&self) -> String {
        let shown: Vec<String> = self.params.iter().map(Param::shown).collect();
        match self.form {
            Form::Method => format!("x.{}({})", self.name, shown[1..].join(", ")),
            _ => format!("{}({})", self.name, shown.join(", ")),
        }
    }
}

use Param as P;

pub(super) const X: P = P::Tensor("input");
pub(super) const UNARY: &[P] = &[X];

/// A family's table of script entries: name, form, parameters, what makes the op, doc.
macro_rules! entries {
    ($($name:literal, $form:ident, $params:expr, $make:ident, $doc:literal;)*) => {
        /// The script functions and methods of the family.
        pub(super) static ENTRIES: &[Entry] = &[$(Entry {
            name: $name,
            form: Form::$form,
            params: $params,
            doc: $doc,
            make: $make,
        }),*];
    };
}
pub(super) use entries;

pub(super) fn tensors(b: &Bound<TensorId>) -> smallvec::SmallVec<[TensorId; 4]> {
    b.args
        .iter()
        .filter_map(|a| match a {
            Arg::Tensor(t) => Some(*t),
            _ => None,
        })
        .collect()
}

/// Every entry, family by family.
pub fn all_entries() -> impl Iterator<Item = &'static Entry> {
    super::elementwise::unary_entries()
        .iter()
        .chain(super::elementwise::ENTRIES)
        .chain(super::reduce::ENTRIES)
        .chain(super::cast::ENTRIES)
        .chain(super::product::ENTRIES)
        .chain(super::attention::ENTRIES)
        .chain(super::softmax::ENTRIES)
        .chain(super::norm::ENTRIES)
        .chain(super::nn::ENTRIES)
        .chain(super::routing::ENTRIES)
        .chain(super::view::ENTRIES)
        .chain(super::vision::ENTRIES)
}

/// FNV-1a, for the fixed tables of names looked up on every script call (ours, not a
/// stranger's: no need for SipHash's resistance, whose cost showed in the simulation).
#[derive(Debug, Clone, Copy)]
pub struct NameHasher(u64);

impl Default for NameHasher {
    fn default() -> Self {
        NameHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map from the names of a fixed table.
pub type NameMap<V> =
    std::collections::HashMap<&'static str, V, std::hash::BuildHasherDefault<NameHasher>>;

/// The entry a function name (or, with `method`, a method name) reaches.
pub fn lookup(name: &str, method: bool) -> Option<&'static Entry> {
    use std::sync::OnceLock;
    static INDEX: OnceLock<NameMap<&'static Entry>> = OnceLock::new();
    let index = INDEX.get_or_init(|| all_entries().map(|e| (e.name, e)).collect());
    let e: &'static Entry = index.get(name)?;
    let ok = match e.form {
        Form::Both => true,
        Form::Function => !method,
        Form::Method => method,
    };
    ok.then_some(e)
}

/// The names a script can call as functions (`method = false`) or methods.
pub fn names(method: bool) -> Vec<&'static str> {
    all_entries()
        .filter(|e| match e.form {
            Form::Both => true,
            Form::Function => !method,
            Form::Method => method,
        })
        .map(|e| e.name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::op::Unary;

    #[test]
    fn every_name_is_one_entry_and_lookup_finds_each() {
        let mut seen = std::collections::BTreeSet::new();
        for e in all_entries() {
            assert!(seen.insert(e.name), "{} is defined twice", e.name);
            let method = e.form == Form::Method;
            assert!(std::ptr::eq(lookup(e.name, method).unwrap(), e));
        }
        assert!(lookup("no_such_op", false).is_none());
    }

    #[test]
    fn every_unary_op_is_callable_and_signatures_print() {
        for u in Unary::ALL {
            assert!(lookup(u.name(), false).is_some(), "{}", u.name());
            assert!(lookup(u.name(), true).is_some(), "{}", u.name());
        }
        assert_eq!(
            lookup("linear", false).unwrap().signature(),
            "linear(input, weight, bias=none)"
        );
        assert_eq!(
            lookup("masked_fill", true).unwrap().signature(),
            "x.masked_fill(mask, value)"
        );
        assert!(lookup("masked_fill", false).is_none());
        let mut seen = std::collections::HashSet::new();
        for e in all_entries() {
            assert!(seen.insert(e.name), "{} twice", e.name);
        }
    }
}
