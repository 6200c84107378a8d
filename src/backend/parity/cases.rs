//! The harness's cases: every op the workloads use, each with its inputs (shapes, value
//! ranges, strided views, masks, indices) and the dtypes it runs in.

use crate::engine::op::norm::Norm;
use crate::engine::op::{Binary, Cmp, Fill, InPlace, Op, Unary};
use crate::engine::optim::OptimKind;
use crate::engine::DType;

#[path = "cases_more.rs"]
mod more;
use more::{integer_cases, select_cases, vision_cases};

/// An input of a case.
#[derive(Debug, Clone)]
pub(super) enum Arg {
    /// Floating, in the case's dtype, uniform in [lo, hi] and never 0; `grad`: requires grad;
    /// `t`: made with its last two dimensions swapped and passed transposed (a strided view).
    F {
        shape: Vec<usize>,
        lo: f64,
        hi: f64,
        grad: bool,
        t: bool,
    },
    /// int64 indices in [0, hi).
    Idx { shape: Vec<usize>, hi: usize },
    /// A bool mask, about half of it set.
    Mask { shape: Vec<usize> },
    /// The same tensor as input `i` (an op given one tensor twice).
    Same(usize),
}

fn f(shape: &[usize]) -> Arg {
    Arg::F {
        shape: shape.to_vec(),
        lo: -2.0,
        hi: 2.0,
        grad: true,
        t: false,
    }
}

fn f_in(shape: &[usize], lo: f64, hi: f64) -> Arg {
    Arg::F {
        shape: shape.to_vec(),
        lo,
        hi,
        grad: true,
        t: false,
    }
}

fn f_t(shape: &[usize]) -> Arg {
    Arg::F {
        shape: shape.to_vec(),
        lo: -2.0,
        hi: 2.0,
        grad: true,
        t: true,
    }
}

fn no_grad(a: Arg) -> Arg {
    match a {
        Arg::F {
            shape, lo, hi, t, ..
        } => Arg::F {
            shape,
            lo,
            hi,
            grad: false,
            t,
        },
        other => other,
    }
}

/// How a case runs its op.
#[derive(Debug, Clone)]
pub(super) enum Run {
    Apply(Op),
    Fill(Fill),
    /// A factory of this shape.
    FillShape(Fill, Vec<usize>),
    Cast(DType),
    Contiguous,
    Sum {
        mean: bool,
        dim: Option<i64>,
    },
    CrossEntropy,
    Sdpa {
        causal: bool,
        gqa: bool,
    },
    /// `scaled_dot_product_attention(q, k, v, attn_mask)` with the fourth input as an additive
    /// mask (not causal).
    SdpaMask,
    Optim(OptimKind),
    /// A clone of the first input changed in place (with the second as the operand).
    InPlace(InPlace),
    /// `x[:, start:end]` (a strided view whose gradient is scattered into zeros).
    Slice {
        dim: i64,
        start: i64,
        end: i64,
    },
    /// `x.expand(sizes)` (its gradient summed over the expanded dimensions).
    Expand(Vec<i64>),
    /// `torch.cat` of `x.chunk(3, -1)` in another order (split's gradient, cat's forward).
    ChunkCat,
}

/// One case: an op, its inputs, and the dtypes it runs in.
#[derive(Debug, Clone)]
pub struct Case {
    pub(super) op: String,
    pub(super) case: String,
    pub(super) run: Run,
    pub(super) args: Vec<Arg>,
    pub(super) dtypes: &'static [DType],
}

const BOTH: &[DType] = &[DType::F32, DType::BF16];
const F32: &[DType] = &[DType::F32];

fn case(op: &str, what: &str, run: Run, args: Vec<Arg>, dtypes: &'static [DType]) -> Case {
    Case {
        op: op.to_string(),
        case: what.to_string(),
        run,
        args,
        dtypes,
    }
}

/// Every case, in the order the report lists them.
pub fn cases() -> Vec<Case> {
    let (r, c) = (48usize, 129usize);
    let mut v = vec![
        case(
            "fill",
            "full(-2.75)",
            Run::Fill(Fill::Full(-2.75)),
            vec![],
            BOTH,
        ),
        case(
            "randn",
            "the cpu device's normals",
            Run::Fill(Fill::Randn),
            vec![],
            BOTH,
        ),
        case(
            "randn",
            "three blocks of 65,536 and more: [3, 65600]",
            Run::FillShape(Fill::Randn, vec![3, 65600]),
            vec![],
            BOTH,
        ),
        case(
            "rand",
            "the cpu device's uniforms",
            Run::Fill(Fill::Rand),
            vec![],
            BOTH,
        ),
        case(
            "arange",
            "from -3 by 0.25",
            Run::Fill(Fill::Arange {
                start: -3.0,
                step: 0.25,
            }),
            vec![],
            BOTH,
        ),
        case(
            "dropout",
            "p = 0.25 (the cpu device's elements kept)",
            Run::Apply(Op::Dropout { p: 0.25, seed: 0 }),
            vec![f(&[4, r, c])],
            BOTH,
        ),
    ];
    for u in Unary::ALL {
        if matches!(u, Unary::Tril | Unary::BitwiseNot) {
            continue;
        }
        let (lo, hi) = match u {
            Unary::Rsqrt | Unary::Sqrt => (0.05, 4.0),
            Unary::Exp => (-4.0, 4.0),
            _ => (-3.0, 3.0),
        };
        let x = f_in(&[r, c], lo, hi);
        v.push(case(
            u.name(),
            "contiguous",
            Run::Apply(Op::Unary(u)),
            vec![x.clone()],
            BOTH,
        ));
        if let Arg::F { shape, .. } = x {
            v.push(case(
                u.name(),
                "of a transposed view",
                Run::Apply(Op::Unary(u)),
                vec![Arg::F {
                    shape,
                    lo,
                    hi,
                    grad: true,
                    t: true,
                }],
                BOTH,
            ));
        }
    }
    for b in [Binary::Add, Binary::Sub, Binary::Mul, Binary::Div] {
        let rhs = match b {
            Binary::Div => f_in(&[c], 0.5, 2.0),
            _ => f(&[c]),
        };
        v.push(case(
            b.name(),
            "a transposed view and a broadcast row",
            Run::Apply(Op::Binary(b)),
            vec![f_t(&[r, c]), rhs],
            BOTH,
        ));
        v.push(case(
            b.name(),
            "same shape",
            Run::Apply(Op::Binary(b)),
            vec![f(&[r, c]), f_in(&[r, c], 0.5, 2.0)],
            BOTH,
        ));
        // (a number divided by a tensor keeps nothing for its gradient in the engine)
        let reversals: &[bool] = if b == Binary::Div {
            &[false]
        } else {
            &[false, true]
        };
        for &reversed in reversals {
            v.push(case(
                b.name(),
                if reversed {
                    "a number, reversed"
                } else {
                    "and a number"
                },
                Run::Apply(Op::Scalar {
                    op: b,
                    value: 1.75,
                    reversed,
                }),
                vec![f_in(&[r, c], 0.5, 2.0)],
                BOTH,
            ));
        }
    }
    v.extend([
        case(
            "pow",
            "x ** 2",
            Run::Apply(Op::Pow { exponent: 2.0 }),
            vec![f(&[r, c])],
            BOTH,
        ),
        case(
            "copy",
            "contiguous() of a transposed view",
            Run::Contiguous,
            vec![f_t(&[r, c])],
            BOTH,
        ),
        case(
            "to",
            "float32 to bf16",
            Run::Cast(DType::BF16),
            vec![f(&[r, c])],
            F32,
        ),
        case(
            "to",
            "bf16 to float32",
            Run::Cast(DType::F32),
            vec![f(&[r, c])],
            &[DType::BF16],
        ),
        case(
            "masked_fill",
            "a broadcast mask, -1e4",
            Run::Apply(Op::MaskedFill { value: -1e4 }),
            vec![f(&[4, r, c]), Arg::Mask { shape: vec![r, c] }],
            BOTH,
        ),
        case(
            "where",
            "a mask and two tensors",
            Run::Apply(Op::Where),
            vec![Arg::Mask { shape: vec![r, c] }, f(&[r, c]), f(&[c])],
            BOTH,
        ),
        case(
            "lt",
            "two tensors, one broadcast",
            Run::Apply(Op::Compare {
                cmp: Cmp::Lt,
                scalar: None,
            }),
            vec![no_grad(f(&[r, c])), no_grad(f(&[c]))],
            BOTH,
        ),
        case(
            "cat",
            "along the last dimension",
            Run::Apply(Op::Cat { dim: -1 }),
            vec![f(&[4, r, 32]), f_t(&[4, r, 17])],
            BOTH,
        ),
        case(
            "sum",
            "over the last dimension",
            Run::Sum {
                mean: false,
                dim: Some(-1),
            },
            vec![f(&[8, r, c])],
            BOTH,
        ),
        case(
            "mean",
            "over the first dimension",
            Run::Sum {
                mean: true,
                dim: Some(0),
            },
            vec![f(&[8, r, c])],
            BOTH,
        ),
        case(
            "sum",
            "of everything",
            Run::Sum {
                mean: false,
                dim: None,
            },
            vec![f(&[r, c])],
            BOTH,
        ),
    ]);
    v.extend([
        case(
            "pad",
            "(1, 2) on the last dimension, (0, 3) on the one before, -1.5",
            Run::Apply(Op::Pad {
                pads: vec![1, 2, 0, 3],
                value: -1.5,
            }),
            vec![f(&[4, r, c])],
            BOTH,
        ),
        case(
            "expand",
            "[2, 1, 3, 1, 16] to [2, 4, 3, 5, 16] (repeat_kv's; the gradient summed back)",
            Run::Expand(vec![2, 4, 3, 5, 16]),
            vec![f(&[2, 1, 3, 1, 16])],
            BOTH,
        ),
        case(
            "slice",
            "x[:, 5:70] (its gradient into zeros)",
            Run::Slice {
                dim: 1,
                start: 5,
                end: 70,
            },
            vec![f(&[r, c])],
            BOTH,
        ),
        case(
            "chunk",
            "three chunks of the last dimension, concatenated in another order",
            Run::ChunkCat,
            vec![f(&[4, r, 96])],
            BOTH,
        ),
    ]);
    let dims = |d: &[i64]| crate::engine::op::reduce::DimList::from_slice(d).expect("a few dims");
    v.extend([
        case(
            "mul",
            "one tensor by itself (its gradients accumulated)",
            Run::Apply(Op::Binary(Binary::Mul)),
            vec![f(&[r, c]), Arg::Same(0)],
            BOTH,
        ),
        case(
            "sum",
            "over dimensions 0 and 2 of a transposed view, keepdim",
            Run::Apply(Op::Reduce {
                mean: false,
                dims: dims(&[0, 2]),
                keepdim: true,
            }),
            vec![f_t(&[6, r, 17])],
            BOTH,
        ),
        case(
            "sum",
            "over dimension 0 of [2100, 7] (a block per output)",
            Run::Apply(Op::Reduce {
                mean: false,
                dims: dims(&[0]),
                keepdim: false,
            }),
            vec![f(&[2100, 7])],
            BOTH,
        ),
        case(
            "mean",
            "over the middle dimension",
            Run::Apply(Op::Reduce {
                mean: true,
                dims: dims(&[1]),
                keepdim: false,
            }),
            vec![f(&[6, r, 17])],
            BOTH,
        ),
        case(
            "add_",
            "in place, a broadcast row",
            Run::InPlace(InPlace::Tensor(Binary::Add)),
            vec![f(&[r, c]), f(&[c])],
            BOTH,
        ),
        case(
            "add_",
            "int64 in place, by a whole number (a counter)",
            Run::InPlace(InPlace::Scalar(Binary::Add, 3.0)),
            vec![Arg::Idx {
                shape: vec![r, c],
                hi: 1000,
            }],
            F32,
        ),
        case(
            "rsub",
            "int64, a whole number minus the tensor",
            Run::Apply(Op::Scalar {
                op: Binary::Sub,
                value: 7.0,
                reversed: true,
            }),
            vec![Arg::Idx {
                shape: vec![r, c],
                hi: 1000,
            }],
            F32,
        ),
        case(
            "mul_",
            "in place, by a number",
            Run::InPlace(InPlace::Scalar(Binary::Mul, -0.75)),
            vec![f(&[r, c])],
            BOTH,
        ),
        case(
            "masked_fill_",
            "in place",
            Run::InPlace(InPlace::MaskedFill(0.5)),
            vec![f(&[r, c]), Arg::Mask { shape: vec![c] }],
            BOTH,
        ),
        case(
            "copy_",
            "in place, from a transposed view",
            Run::InPlace(InPlace::Copy),
            vec![no_grad(f(&[r, c])), no_grad(f_t(&[r, c]))],
            BOTH,
        ),
    ]);
    for log in [false, true] {
        v.push(case(
            if log { "log_softmax" } else { "softmax" },
            "over the last dimension",
            Run::Apply(Op::Softmax {
                dim: -1,
                log,
                safe: false,
            }),
            vec![f_in(&[4, r, c], -6.0, 6.0)],
            BOTH,
        ));
    }
    for n in crate::engine::op::norm::EXAMPLES {
        let mut args = vec![f(&[4, r, c]), f(&[c])];
        if matches!(n, Norm::Layer { .. }) {
            args.push(f(&[c]));
        }
        v.push(case(
            n.name(),
            "over the last dimension, with weight",
            Run::Apply(Op::Norm(*n)),
            args,
            BOTH,
        ));
    }
    v.extend([
        case(
            "embedding",
            "1000 rows of 64",
            Run::Apply(Op::Embedding { strided: false }),
            vec![
                Arg::Idx {
                    shape: vec![4, 33],
                    hi: 1000,
                },
                f(&[1000, 64]),
            ],
            BOTH,
        ),
        case(
            "cross_entropy",
            "64 rows of 1000 classes",
            Run::CrossEntropy,
            vec![
                f_in(&[64, 1000], -4.0, 4.0),
                Arg::Idx {
                    shape: vec![64],
                    hi: 1000,
                },
            ],
            BOTH,
        ),
        case(
            "linear",
            "x [4, 33, 64], weight [96, 64], bias",
            Run::Apply(Op::Linear),
            vec![f(&[4, 33, 64]), f(&[96, 64]), f(&[96])],
            BOTH,
        ),
        case(
            "linear",
            "a transposed input, no bias",
            Run::Apply(Op::Linear),
            vec![f_t(&[100, 64]), f(&[96, 64])],
            BOTH,
        ),
        case(
            "addmm",
            "x [64, 96], weight [96, 80], bias",
            Run::Apply(Op::Addmm),
            vec![f(&[64, 96]), f(&[96, 80]), f(&[80])],
            BOTH,
        ),
        case(
            "matmul",
            "batched [4, 33, 48] @ [4, 48, 40]",
            Run::Apply(Op::Matmul),
            vec![f(&[4, 33, 48]), f(&[4, 48, 40])],
            BOTH,
        ),
        case(
            "matmul",
            "batched, the right one transposed",
            Run::Apply(Op::Matmul),
            vec![f(&[4, 33, 48]), f_t(&[4, 48, 40])],
            BOTH,
        ),
        case(
            "matmul",
            "a broadcast batch: [1, 33, 48] @ [4, 48, 40]",
            Run::Apply(Op::Matmul),
            vec![f(&[1, 33, 48]), f(&[4, 48, 40])],
            BOTH,
        ),
        case(
            "matmul",
            "a broadcast batch: [2, 3, 33, 48] @ [48, 40] transposed",
            Run::Apply(Op::Matmul),
            vec![f(&[2, 3, 33, 48]), f_t(&[48, 40])],
            BOTH,
        ),
    ]);
    for causal in [false, true] {
        v.push(case(
            "scaled_dot_product_attention",
            if causal {
                "[2, 4, 65, 32], causal"
            } else {
                "[2, 4, 65, 32]"
            },
            Run::Sdpa { causal, gqa: false },
            vec![f(&[2, 4, 65, 32]), f(&[2, 4, 65, 32]), f(&[2, 4, 65, 32])],
            BOTH,
        ));
    }
    // the tiled kernels' two widths over several blocks and a partial tile, transposed views,
    // and a head too wide for them (the path a block per row)
    v.push(case(
        "scaled_dot_product_attention",
        "[1, 3, 150, 96] (the 128-wide tiles), causal",
        Run::Sdpa {
            causal: true,
            gqa: false,
        },
        vec![
            f(&[1, 3, 150, 96]),
            f(&[1, 3, 150, 96]),
            f(&[1, 3, 150, 96]),
        ],
        BOTH,
    ));
    v.push(case(
        "scaled_dot_product_attention",
        "[2, 2, 70, 64], transposed views",
        Run::Sdpa {
            causal: false,
            gqa: false,
        },
        vec![
            f_t(&[2, 2, 70, 64]),
            f_t(&[2, 2, 70, 64]),
            f_t(&[2, 2, 70, 64]),
        ],
        BOTH,
    ));
    v.push(case(
        "scaled_dot_product_attention",
        "[1, 2, 40, 160] (a head wider than the tiles), causal",
        Run::Sdpa {
            causal: true,
            gqa: false,
        },
        vec![
            f(&[1, 2, 40, 160]),
            f(&[1, 2, 40, 160]),
            f(&[1, 2, 40, 160]),
        ],
        BOTH,
    ));
    v.push(case(
        "scaled_dot_product_attention",
        "grouped heads: q [2, 8, 40, 16], k and v [2, 2, 40, 16], causal",
        Run::Sdpa {
            causal: true,
            gqa: true,
        },
        vec![f(&[2, 8, 40, 16]), f(&[2, 2, 40, 16]), f(&[2, 2, 40, 16])],
        BOTH,
    ));
    for (what, d) in [("64", 64), ("128", 128)] {
        v.push(case(
            "scaled_dot_product_attention",
            &format!(
                "an additive mask [2, 1, 33, 40], q [2, 3, 33, {what}], k and v [2, 3, 40, {what}]"
            ),
            Run::SdpaMask,
            vec![
                f(&[2, 3, 33, d]),
                f(&[2, 3, 40, d]),
                f(&[2, 3, 40, d]),
                no_grad(f(&[2, 1, 33, 40])),
            ],
            BOTH,
        ));
    }
    v.extend(vision_cases());
    v.extend(integer_cases());
    v.extend(select_cases());
    for k in [
        OptimKind::Sgd,
        OptimKind::SgdMomentum,
        OptimKind::Adam,
        OptimKind::AdamW,
    ] {
        v.push(case(
            k.name(),
            "two steps on [48, 129] and [129]",
            Run::Optim(k),
            vec![f(&[r, c]), f(&[c])],
            // (Adam and AdamW also step a model held in bf16, its states bf16 too)
            if matches!(k, OptimKind::Adam | OptimKind::AdamW) {
                BOTH
            } else {
                F32
            },
        ));
    }
    v
}
