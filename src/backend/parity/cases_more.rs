//! The harness's cases beyond the core ops ([`super`]): the selecting reductions and the
//! integer and bool ops of generation, and the vision presets' conv2d, batch_norm and pools.

use super::*;

/// The selecting reductions generation makes (greedy `argmax`, `any`/`all` of the finished
/// sequences, `max`): per thread and per block of threads (long rows), along a leading
/// dimension (a strided read), with ties (bf16, small ids).
pub(super) fn select_cases() -> Vec<Case> {
    let argmax = |dim: Option<i64>| {
        Run::Apply(Op::Argmax {
            dim,
            keepdim: false,
        })
    };
    let logical = |any: bool, dim: Option<i64>| Run::Apply(Op::Logical { any, dim });
    let ids = |shape: &[usize], hi: usize| Arg::Idx {
        shape: shape.to_vec(),
        hi,
    };
    let mask = |shape: &[usize]| Arg::Mask {
        shape: shape.to_vec(),
    };
    vec![
        case(
            "argmax",
            "[6, 129] along the last dimension",
            argmax(Some(-1)),
            vec![no_grad(f(&[6, 129]))],
            BOTH,
        ),
        case(
            "argmax",
            "[3, 2000] along the last dimension (a block per row)",
            argmax(Some(-1)),
            vec![no_grad(f(&[3, 2000]))],
            BOTH,
        ),
        case(
            "argmax",
            "[6, 129] over everything",
            argmax(None),
            vec![no_grad(f(&[6, 129]))],
            BOTH,
        ),
        case(
            "argmax",
            "int64 ids in [0, 5) along dimension 0 (ties: the first wins)",
            argmax(Some(0)),
            vec![ids(&[40, 7], 5)],
            F32,
        ),
        case(
            "any",
            "a mask along the last dimension",
            logical(true, Some(-1)),
            vec![mask(&[6, 3])],
            F32,
        ),
        case(
            "all",
            "a mask along the last dimension",
            logical(false, Some(-1)),
            vec![mask(&[6, 2])],
            F32,
        ),
        case(
            "all",
            "int64 ids in [0, 2) over everything, 3,000 of them (a block)",
            logical(false, None),
            vec![ids(&[3000], 2)],
            F32,
        ),
        case(
            "any",
            "int64 ids in [0, 2) over everything",
            logical(true, None),
            vec![ids(&[6, 129], 2)],
            F32,
        ),
        case(
            "max",
            "[6, 129] over everything",
            Run::Apply(Op::Max),
            vec![no_grad(f(&[6, 129]))],
            BOTH,
        ),
        case(
            "max",
            "[4, 1500] over everything (a block)",
            Run::Apply(Op::Max),
            vec![no_grad(f(&[4, 1500]))],
            BOTH,
        ),
        case(
            "tril",
            "[3, 9, 7] (and its gradient)",
            Run::Apply(Op::Unary(Unary::Tril)),
            vec![f(&[3, 9, 7])],
            BOTH,
        ),
        case(
            "tril",
            "a [7, 9] mask",
            Run::Apply(Op::Unary(Unary::Tril)),
            vec![mask(&[7, 9])],
            F32,
        ),
        case(
            "bitwise_not",
            "a mask",
            Run::Apply(Op::Unary(Unary::BitwiseNot)),
            vec![mask(&[6, 129])],
            F32,
        ),
        case(
            "bitwise_not",
            "int64 ids",
            Run::Apply(Op::Unary(Unary::BitwiseNot)),
            vec![ids(&[6, 129], 1000)],
            F32,
        ),
        case(
            "sum",
            "int64 ids along the last dimension (exact)",
            Run::Sum {
                mean: false,
                dim: Some(-1),
            },
            vec![ids(&[6, 129], 1000)],
            F32,
        ),
        case(
            "sum",
            "a mask, 3,000 elements (its int64 copy, a block)",
            Run::Sum {
                mean: false,
                dim: None,
            },
            vec![mask(&[3000])],
            F32,
        ),
        case(
            "pad",
            "int64 labels, (0, 1) with -100 (the loss's shifted labels)",
            Run::Apply(Op::Pad {
                pads: vec![0, 1],
                value: -100.0,
            }),
            vec![ids(&[6, 129], 1000)],
            F32,
        ),
    ]
}

/// What generation does to ids, positions and masks: int64 and bool, exact.
pub(super) fn integer_cases() -> Vec<Case> {
    let (r, c) = (6usize, 129usize);
    let ids = |shape: &[usize], hi: usize| Arg::Idx {
        shape: shape.to_vec(),
        hi,
    };
    let mask = |shape: &[usize]| Arg::Mask {
        shape: shape.to_vec(),
    };
    vec![
        case(
            "eq",
            "int64 ids against a whole number",
            Run::Apply(Op::Compare {
                cmp: Cmp::Eq,
                scalar: Some(3.0),
            }),
            vec![ids(&[r, c], 8)],
            F32,
        ),
        case(
            "lt",
            "int64 against int64, broadcast",
            Run::Apply(Op::Compare {
                cmp: Cmp::Lt,
                scalar: None,
            }),
            vec![ids(&[r, c], 50), ids(&[c], 50)],
            F32,
        ),
        case(
            "mul",
            "int64 by int64 (a mask of ids)",
            Run::Apply(Op::Binary(Binary::Mul)),
            vec![ids(&[r, c], 1000), ids(&[r, c], 2)],
            F32,
        ),
        case(
            "bitwise_and",
            "two masks, broadcast",
            Run::Apply(Op::Bitwise { or: false }),
            vec![mask(&[r, c]), mask(&[c])],
            F32,
        ),
        case(
            "bitwise_or",
            "int64 ids",
            Run::Apply(Op::Bitwise { or: true }),
            vec![ids(&[r, c], 1000), ids(&[r, c], 1000)],
            F32,
        ),
        case(
            "cumsum",
            "int64 over the last dimension (position ids)",
            Run::Apply(Op::Cumsum {
                dim: -1,
                dtype: None,
            }),
            vec![ids(&[r, c], 2)],
            F32,
        ),
        case(
            "cumsum",
            "a mask over the first dimension",
            Run::Apply(Op::Cumsum {
                dim: 0,
                dtype: None,
            }),
            vec![mask(&[r, c])],
            F32,
        ),
        case(
            "masked_fill",
            "int64 ids, a broadcast mask, by a whole number",
            Run::Apply(Op::MaskedFill { value: -7.0 }),
            vec![ids(&[r, c], 1000), mask(&[c])],
            F32,
        ),
        case(
            "cat",
            "int64 ids along the last dimension",
            Run::Apply(Op::Cat { dim: -1 }),
            vec![ids(&[r, 5], 1000), ids(&[r, 1], 1000)],
            F32,
        ),
        case(
            "isin",
            "int64 ids in 7 test ids",
            Run::Apply(Op::Isin),
            vec![ids(&[r, c], 40), ids(&[7], 40)],
            F32,
        ),
    ]
}

/// conv2d, batch_norm and the pools (the vision presets' ops).
pub(super) fn vision_cases() -> Vec<Case> {
    use crate::engine::op::vision::{BatchNorm, Conv, Pool};
    let conv = |stride, padding, dilation, groups| {
        Run::Apply(Op::Conv2d(Conv {
            stride,
            padding,
            dilation,
            groups,
        }))
    };
    let bn = |training| {
        Run::Apply(Op::BatchNorm(BatchNorm {
            training,
            momentum: 0.1,
            eps: 1e-5,
        }))
    };
    let stats = |c: usize| [no_grad(f(&[c])), no_grad(f_in(&[c], 0.5, 1.5))];
    let mut train = vec![f(&[4, 3, 5, 6]), f(&[3]), f(&[3])];
    train.extend(stats(3));
    let mut eval = vec![
        no_grad(f(&[4, 3, 5, 6])),
        no_grad(f(&[3])),
        no_grad(f(&[3])),
    ];
    eval.extend(stats(3));
    vec![
        case(
            "conv2d",
            "x [2, 6, 9, 11], weight [4, 3, 3, 3] in 2 groups, bias, stride 2, padding 1, dilation 2",
            conv(2, 1, 2, 2),
            vec![f(&[2, 6, 9, 11]), f(&[4, 3, 3, 3]), f(&[4])],
            BOTH,
        ),
        case(
            "conv2d",
            "x [2, 3, 8, 8], weight [5, 3, 3, 3], padding 1",
            conv(1, 1, 1, 1),
            vec![f(&[2, 3, 8, 8]), f(&[5, 3, 3, 3])],
            BOTH,
        ),
        case(
            "batch_norm",
            "training, [4, 3, 5, 6], weight, bias, running statistics",
            bn(true),
            train,
            F32,
        ),
        case(
            "batch_norm",
            "eval, [4, 3, 5, 6] (no gradient)",
            bn(false),
            eval,
            F32,
        ),
        case(
            "max_pool2d",
            "[2, 3, 9, 9], kernel 3, stride 2, padding 1",
            Run::Apply(Op::MaxPool2d(Pool {
                kernel: 3,
                stride: 2,
                padding: 1,
            })),
            vec![f(&[2, 3, 9, 9])],
            BOTH,
        ),
        case(
            "adaptive_avg_pool2d",
            "[2, 3, 7, 5] to [3, 2]",
            Run::Apply(Op::AdaptiveAvgPool2d { out: [3, 2] }),
            vec![f(&[2, 3, 7, 5])],
            BOTH,
        ),
        case(
            "adaptive_avg_pool2d",
            "[2, 3, 7, 5] to [1, 1]",
            Run::Apply(Op::AdaptiveAvgPool2d { out: [1, 1] }),
            vec![f(&[2, 3, 7, 5])],
            BOTH,
        ),
    ]
}
