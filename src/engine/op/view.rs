//! Views and copies: `view`, `reshape`, `t`, `transpose`, `permute`, `expand`, `unsqueeze`
//! (new layouts over the same storage, allocating nothing; `reshape` copies when the strides do
//! not allow a view), `split`/`chunk` (views of the parts, whose backward concatenates),
//! `contiguous` (itself, or a copy) and `clone`.

use super::script::{Bound, Entry, Form, Made, Param, UNARY, X};
use super::{Back, Op};
use crate::engine::TensorId;

/// The view ops, by PyTorch's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewKind {
    View,
    Reshape,
    Unsqueeze,
    Squeeze,
    Flatten,
    T,
    Transpose,
    Permute,
    Expand,
    Index,
    /// `at::alias`: what Python indexing returns when every index is a full slice or an
    /// ellipsis (`x[..., :n]` of a last dimension of `n`): the same layout, a node whose
    /// backward hands the gradient through.
    Alias,
}

impl ViewKind {
    /// What its backward makes of the incoming gradient: a reshape back for the reshaping
    /// views, the gradient permuted back for `t` of a matrix, the gradient itself for `t` of
    /// a vector and for an `expand` to the same shape, else a fresh gradient scattered (and
    /// summed) through the view's layout.
    pub fn back(self, in_ndim: usize, same_shape: bool) -> Back {
        match self {
            ViewKind::View
            | ViewKind::Reshape
            | ViewKind::Unsqueeze
            | ViewKind::Squeeze
            | ViewKind::Flatten => Back::Reshape,
            ViewKind::T if in_ndim == 2 => Back::Permute(vec![1, 0]),
            ViewKind::T => Back::Pass,
            ViewKind::Expand if same_shape => Back::Pass,
            ViewKind::Alias => Back::Pass,
            _ => Back::Alloc,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ViewKind::View => "view",
            ViewKind::Reshape => "reshape",
            ViewKind::Unsqueeze => "unsqueeze",
            ViewKind::Squeeze => "squeeze",
            ViewKind::Flatten => "flatten",
            ViewKind::T => "t",
            ViewKind::Transpose => "transpose",
            ViewKind::Permute => "permute",
            ViewKind::Expand => "expand",
            ViewKind::Index => "index",
            ViewKind::Alias => "alias",
        }
    }
}

/// `cat(tensors, dim)` and `pad(input, pad, value)`: new tensors of a joined or padded shape.
fn join(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    match name {
        "stack" => {
            if b.tensors.is_empty() {
                return Err("stack expects a non-empty list of tensors".into());
            }
            Ok(Made::Stack {
                xs: b.tensors.clone(),
                dim: b.int(1).unwrap_or(0),
            })
        }
        "repeat_interleave" => {
            let repeats = b
                .int(1)
                .ok_or("repeat_interleave expects a number of repeats")?;
            if repeats < 0 {
                return Err(format!("repeats can not be negative, got {repeats}"));
            }
            Ok(Made::RepeatInterleave {
                x: b.tensor(0).ok_or("expects a tensor")?,
                repeats,
                dim: b
                    .int(2)
                    .ok_or("repeat_interleave needs dim (the flattened form is not modelled)")?,
            })
        }
        "cat" => {
            if b.tensors.is_empty() {
                return Err("torch.cat(): expected a non-empty list of Tensors".into());
            }
            Ok(Made::Op {
                op: Op::Cat {
                    dim: b.int(1).unwrap_or(0),
                },
                inputs: b.tensors.iter().copied().collect(),
            })
        }
        _ => Ok(Made::Op {
            op: Op::Pad {
                pads: b.sizes()?,
                value: b.float(2).unwrap_or(0.0),
            },
            inputs: smallvec::smallvec![b.tensor(0).ok_or("expects a tensor")?],
        }),
    }
}

fn make(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let x = b.tensor(0).ok_or("expects a tensor")?;
    let kind = match name {
        "view" => ViewKind::View,
        "reshape" => ViewKind::Reshape,
        "t" => ViewKind::T,
        "transpose" => ViewKind::Transpose,
        "permute" => ViewKind::Permute,
        "expand" => ViewKind::Expand,
        "unsqueeze" => ViewKind::Unsqueeze,
        "flatten" => {
            return Ok(Made::View {
                kind: ViewKind::Flatten,
                x,
                args: vec![b.int(1).unwrap_or(0), b.int(2).unwrap_or(-1)],
            })
        }
        "squeeze" => {
            return Ok(Made::View {
                kind: ViewKind::Squeeze,
                x,
                args: b.int(1).into_iter().collect(),
            })
        }
        "contiguous" => return Ok(Made::Contiguous(x)),
        "clone" => {
            return Ok(Made::Op {
                op: Op::Clone,
                inputs: smallvec::smallvec![x],
            })
        }
        "split" | "chunk" => {
            let size = b.int(1).filter(|n| *n > 0);
            let Some(size) = size else {
                return Err(format!("{name} expects a positive size"));
            };
            return Ok(Made::Split {
                chunk: name == "chunk",
                x,
                size,
                dim: b.int(2).unwrap_or(0),
            });
        }
        _ => return Err(format!("{name}: unknown")),
    };
    let args = if matches!(kind, ViewKind::T) {
        vec![]
    } else {
        b.sizes()?
    };
    match (kind, args.len()) {
        (ViewKind::Transpose, n) if n != 2 => Err("transpose expects two dimensions".into()),
        (ViewKind::Unsqueeze, n) if n != 1 => Err("unsqueeze expects one dimension".into()),
        _ => Ok(Made::View { kind, x, args }),
    }
}

const SHAPE: &[Param] = &[X, Param::Sizes("shape")];

const fn entry(name: &'static str, params: &'static [Param], doc: &'static str) -> Entry {
    Entry {
        name,
        form: Form::Method,
        params,
        doc,
        make,
    }
}

/// The script methods of the family.
pub(super) static ENTRIES: &[Entry] = &[
    entry("view", SHAPE, "a view with a new shape (-1 inferred)"),
    entry("reshape", SHAPE, "a view when strides allow, else a copy"),
    entry("t", UNARY, "transpose of a 2-D tensor"),
    entry(
        "transpose",
        &[X, Param::Sizes("dims")],
        "swap two dimensions",
    ),
    entry("permute", SHAPE, "reorder dimensions"),
    entry("expand", SHAPE, "broadcast to a shape (-1 keeps a size)"),
    entry(
        "unsqueeze",
        &[X, Param::Sizes("dim")],
        "a new dimension of size 1",
    ),
    entry(
        "flatten",
        &[
            X,
            Param::Int("start_dim", Some(0)),
            Param::Int("end_dim", Some(-1)),
        ],
        "dimensions start_dim..=end_dim as one (a view when strides allow, else a copy)",
    ),
    entry(
        "squeeze",
        &[X, Param::OptInt("dim")],
        "without dimensions of size 1 (all, or dim)",
    ),
    Entry {
        name: "cat",
        form: Form::Function,
        params: &[Param::Tensors("tensors"), Param::Int("dim", Some(0))],
        doc: "torch.cat: the tensors joined along dim, in the widest dtype (each one's gradient is a view; an empty 1-D tensor is skipped)",
        make: join,
    },
    Entry {
        name: "stack",
        form: Form::Function,
        params: &[Param::Tensors("tensors"), Param::Int("dim", Some(0))],
        doc: "torch.stack: the tensors joined along a new dim (cat of unsqueezed views: one output)",
        make: join,
    },
    Entry {
        name: "repeat_interleave",
        form: Form::Method,
        params: &[X, Param::Int("repeats", None), Param::OptInt("dim")],
        doc: "each slice along dim repeated `repeats` times in place (expand, then a flattening copy)",
        make: join,
    },
    Entry {
        name: "pad",
        form: Form::Function,
        params: &[X, Param::Sizes("pad"), Param::Float("value", Some(0.0))],
        doc: "F.pad, constant: pad = (before, after) pairs from the last dimension in",
        make: join,
    },
    entry("contiguous", UNARY, "itself when contiguous, else a copy"),
    entry("clone", UNARY, "a contiguous copy"),
    entry(
        "split",
        &[
            X,
            Param::Int("split_size", None),
            Param::Int("dim", Some(0)),
        ],
        "views of pieces of split_size along dim",
    ),
    entry(
        "chunk",
        &[X, Param::Int("chunks", None), Param::Int("dim", Some(0))],
        "views of n pieces along dim",
    ),
];
