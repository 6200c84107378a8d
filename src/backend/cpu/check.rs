//! The CPU kernels against central finite differences: every unary op, every norm, binary
//! arithmetic with broadcasting, softmax and log_softmax, reductions, products, attention,
//! embedding and the loss, forward and backward on fresh random float64 inputs, run through
//! the engine exactly as a workload runs them (so the gradient plumbing is checked too).

use crate::alloc::{AllocConf, CachingAllocator, SimSource};
use crate::backend::cpu::CpuDevice;
use crate::engine::op::{norm, Binary, Fill, Op, Unary};
use crate::engine::{Category, DType, TensorId, Tensors};
use crate::units::GIB;

type Dev = Tensors<CpuDevice>;

fn dev() -> Dev {
    Tensors::new(CachingAllocator::new(
        AllocConf::default(),
        CpuDevice::new(SimSource::new(GIB, 0)),
    ))
}

fn values(d: &Dev, t: TensorId) -> Vec<f64> {
    d.read(t).unwrap().unwrap()
}

/// An input of `shape` with values from `f` (requires grad when asked).
fn input(d: &mut Dev, shape: &[usize], rg: bool, f: impl Fn(usize) -> f64) -> TensorId {
    let t = d
        .factory_fill(shape, DType::F64, rg, Category::Input, Fill::Empty)
        .unwrap();
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(f).collect();
    d.write(t, &v).unwrap();
    t
}

/// Pseudo-random values in [-1, 1] (never zeros, never ties).
fn noise(seed: usize) -> impl Fn(usize) -> f64 {
    move |i| {
        let x = ((i * 7919 + seed * 104_729) % 10_007) as f64 / 10_007.0;
        2.0 * x - 1.0 + 1e-3 * (i % 7) as f64
    }
}

/// `sum(f(inputs) * r)` for a fixed random `r`: its gradient is each input's `r`-weighted one.
fn objective(
    d: &mut Dev,
    f: &dyn Fn(&mut Dev, &[TensorId]) -> TensorId,
    ins: &[TensorId],
) -> TensorId {
    let out = f(d, ins);
    let shape = d.shape(out).to_vec();
    let r = input(d, &shape, false, noise(99));
    let prod = d.binary(Binary::Mul, out, r).unwrap();
    let loss = d.reduce(false, prod, None, false).unwrap();
    for t in [out, r, prod] {
        d.release(t);
    }
    loss
}

/// Checks the gradients of `f` with respect to the inputs marked differentiable.
fn check(name: &str, shapes: &[(Vec<usize>, bool)], f: &dyn Fn(&mut Dev, &[TensorId]) -> TensorId) {
    check_on(name, shapes, false, f)
}

/// [`check`], with inputs in (0.5, 1.5] when `positive` (square roots).
fn check_on(
    name: &str,
    shapes: &[(Vec<usize>, bool)],
    positive: bool,
    f: &dyn Fn(&mut Dev, &[TensorId]) -> TensorId,
) {
    let mut d = dev();
    let ins: Vec<TensorId> = shapes
        .iter()
        .enumerate()
        .map(|(k, (s, rg))| {
            let n = noise(k + 1);
            if positive {
                input(&mut d, s, *rg, move |i| 1.0 + 0.5 * n(i))
            } else {
                input(&mut d, s, *rg, n)
            }
        })
        .collect();
    let loss = objective(&mut d, f, &ins);
    d.backward(loss, false).unwrap();
    d.release(loss);
    d.grad_enabled = false;
    let h = 1e-6;
    for (k, (_, rg)) in shapes.iter().enumerate() {
        if !*rg {
            continue;
        }
        let g = values(
            &d,
            d.grad(ins[k])
                .unwrap_or_else(|| panic!("{name}: no grad for input {k}")),
        );
        let base = values(&d, ins[k]);
        let mut worst = 0f64;
        let scale = g.iter().fold(1e-3f64, |m, x| m.max(x.abs()));
        for i in 0..base.len() {
            let at = |x: f64, d: &mut Dev| {
                let mut v = base.clone();
                v[i] = x;
                d.write(ins[k], &v).unwrap();
                let l = objective(d, f, &ins);
                let val = values(d, l)[0];
                d.release(l);
                val
            };
            let fd = (at(base[i] + h, &mut d) - at(base[i] - h, &mut d)) / (2.0 * h);
            assert!(
                fd.is_finite() && g[i].is_finite(),
                "{name}: input {k}, element {i}: finite difference {fd}, gradient {}",
                g[i]
            );
            worst = worst.max((fd - g[i]).abs() / scale);
        }
        d.write(ins[k], &base).unwrap();
        assert!(
            worst < 1e-5,
            "{name}: input {k}'s gradient is off by {worst:e} of its largest"
        );
    }
}

#[test]
fn unary_ops_match_finite_differences() {
    for u in Unary::ALL {
        if matches!(u, Unary::BitwiseNot) {
            continue; // integers and booleans: no gradient
        }
        let positive = matches!(u, Unary::Rsqrt | Unary::Sqrt);
        check_on(u.name(), &[(vec![3, 5], true)], positive, &|d, i| {
            d.unary(u, i[0]).unwrap()
        });
    }
}

#[test]
fn norms_match_finite_differences() {
    for n in norm::EXAMPLES {
        // the input, then as many weight-shaped parameters as the norm takes
        let shapes = [(vec![4, 6], true), (vec![6], true), (vec![6], true)];
        check(n.name(), &shapes[..n.inputs()], &|d, i| {
            d.apply(&Op::Norm(*n), i).unwrap()
        });
    }
}

#[test]
fn arithmetic_softmax_reductions_match_finite_differences() {
    for b in [Binary::Add, Binary::Sub, Binary::Mul, Binary::Div] {
        check(
            b.name(),
            &[(vec![2, 3, 4], true), (vec![3, 1], true)],
            &|d, i| d.binary(b, i[0], i[1]).unwrap(),
        );
    }
    for log in [false, true] {
        check("softmax", &[(vec![3, 5], true)], &|d, i| {
            d.softmax(log, i[0], -1).unwrap()
        });
    }
    check("mean over a dim", &[(vec![3, 5], true)], &|d, i| {
        d.reduce(true, i[0], Some(0), true).unwrap()
    });
    check("scalar", &[(vec![4], true)], &|d, i| {
        d.scalar(Binary::Div, i[0], 3.0, false).unwrap()
    });
    check(
        "scalar add (the gradient passes)",
        &[(vec![4], true)],
        &|d, i| d.scalar(Binary::Add, i[0], 1e-6, false).unwrap(),
    );
    for e in [2.0, 3.0, 0.5] {
        check_on("pow", &[(vec![3, 4], true)], true, &|d, i| {
            d.apply(&Op::Pow { exponent: e }, i).unwrap()
        });
    }
    // elementwise outputs laid out like a transposed input, and broadcast gradients summed
    check(
        "mul of a transposed input and a broadcast one",
        &[(vec![4, 3], true), (vec![1, 4], true)],
        &|d, i| {
            let l = d.info(i[0]).layout.t().unwrap();
            let t = d.view_op(
                crate::engine::op::ViewKind::T,
                i[0],
                l,
                crate::engine::Layout::contiguous(&[]),
            );
            let y = d.binary(Binary::Mul, t, i[1]).unwrap();
            d.release(t);
            y
        },
    );
    check("safe_softmax", &[(vec![3, 5], true)], &|d, i| {
        d.apply(
            &Op::Softmax {
                dim: -1,
                log: false,
                safe: true,
            },
            i,
        )
        .unwrap()
    });
    check(
        "cat",
        &[(vec![2, 3, 2], true), (vec![2, 1, 2], true)],
        &|d, i| d.apply(&Op::Cat { dim: 1 }, i).unwrap(),
    );
    check("where", &[(vec![3, 4], true), (vec![4], true)], &|d, i| {
        let c = input(d, &[3, 4], false, |k| (k % 3 == 0) as u8 as f64);
        let c = {
            let b = d.cast_op(c, DType::Bool).unwrap();
            d.release(c);
            b
        };
        let y = d.apply(&Op::Where, &[c, i[0], i[1]]).unwrap();
        d.release(c);
        y
    });
    check("pad", &[(vec![2, 3], true)], &|d, i| {
        d.apply(
            &Op::Pad {
                pads: vec![1, 2, 0, 1],
                value: 0.5,
            },
            i,
        )
        .unwrap()
    });
}

#[test]
fn products_attention_and_losses_match_finite_differences() {
    check(
        "linear",
        &[(vec![2, 3, 4], true), (vec![5, 4], true), (vec![5], true)],
        &|d, i| d.linear(i[0], i[1], Some(i[2])).unwrap(),
    );
    check(
        "addmm",
        &[(vec![3, 4], true), (vec![4, 5], true), (vec![5], true)],
        &|d, i| d.addmm(i[0], i[1], i[2]).unwrap(),
    );
    check(
        "batched matmul",
        &[(vec![2, 3, 4], true), (vec![4, 5], true)],
        &|d, i| d.matmul(i[0], i[1]).unwrap(),
    );
    check(
        "sdpa",
        &[
            (vec![1, 2, 4, 3], true),
            (vec![1, 2, 4, 3], true),
            (vec![1, 2, 4, 3], true),
        ],
        &|d, i| d.sdpa(i[0], i[1], i[2]).unwrap(),
    );
    check(
        "sdpa with grouped-query heads",
        &[
            (vec![1, 4, 4, 3], true),
            (vec![1, 2, 4, 3], true),
            (vec![1, 2, 4, 3], true),
        ],
        &|d, i| d.sdpa_with(i[0], i[1], i[2], true, 0.0, true).unwrap(),
    );
    check(
        "sdpa with dropout",
        &[
            (vec![1, 2, 4, 3], true),
            (vec![1, 2, 4, 3], true),
            (vec![1, 2, 4, 3], true),
        ],
        // (every evaluation draws the same mask)
        &|d, i| {
            d.draws = 0;
            d.sdpa_with(i[0], i[1], i[2], false, 0.3, true).unwrap()
        },
    );
    check(
        "sdpa, not causal",
        &[
            (vec![1, 2, 4, 3], true),
            (vec![1, 2, 5, 3], true),
            (vec![1, 2, 5, 3], true),
        ],
        &|d, i| d.sdpa_with(i[0], i[1], i[2], false, 0.0, false).unwrap(),
    );
    check(
        "sdpa with an additive mask",
        &[
            (vec![1, 2, 4, 3], true),
            (vec![1, 2, 8, 3], true),
            (vec![1, 2, 8, 3], true),
            (vec![1, 1, 4, 8], false),
        ],
        &|d, i| {
            d.sdpa_full([i[0], i[1], i[2]], Some(i[3]), false, 0.0, false)
                .unwrap()
        },
    );
    check("log_softmax + nll", &[(vec![4, 6], true)], &|d, i| {
        let t = input(d, &[4], false, |k| ((k * 5) % 6) as f64);
        let t = {
            let c = d.cast_op(t, DType::I64).unwrap();
            d.release(t);
            c
        };
        let l = d.cross_entropy(i[0], t).unwrap();
        d.release(t);
        l
    });
}

#[test]
fn vision_ops_match_finite_differences() {
    use crate::engine::op::vision::{BatchNorm, Conv, Pool};
    use crate::engine::op::InPlace;
    let conv = |stride, padding, dilation, groups| {
        Op::Conv2d(Conv {
            stride,
            padding,
            dilation,
            groups,
        })
    };
    check(
        "conv2d, strided and padded, with a bias",
        &[
            (vec![2, 3, 6, 5], true),
            (vec![4, 3, 3, 3], true),
            (vec![4], true),
        ],
        &|d, i| d.apply(&conv(2, 1, 1, 1), i).unwrap(),
    );
    check(
        "conv2d, grouped and dilated",
        &[(vec![1, 4, 7, 7], true), (vec![6, 2, 3, 3], true)],
        &|d, i| d.apply(&conv(1, 2, 2, 2), i).unwrap(),
    );
    let bn = Op::BatchNorm(BatchNorm {
        training: true,
        momentum: 0.1,
        eps: 1e-5,
    });
    check(
        "batch_norm in training",
        &[
            (vec![3, 2, 4, 3], true),
            (vec![2], true),
            (vec![2], true),
            (vec![2], false),
            (vec![2], false),
        ],
        &|d, i| d.apply(&bn, i).unwrap(),
    );
    check("max_pool2d", &[(vec![2, 2, 7, 6], true)], &|d, i| {
        d.apply(
            &Op::MaxPool2d(Pool {
                kernel: 3,
                stride: 2,
                padding: 1,
            }),
            i,
        )
        .unwrap()
    });
    check(
        "adaptive_avg_pool2d, uneven windows",
        &[(vec![2, 3, 5, 7], true)],
        &|d, i| d.apply(&Op::AdaptiveAvgPool2d { out: [2, 3] }, i).unwrap(),
    );
    // ResNet's residual join: `out += identity; out.relu_()` on a tensor in the graph
    check(
        "in-place add_ and relu_ in the graph",
        &[(vec![2, 5], true), (vec![2, 5], true)],
        &|d, i| {
            let out = d.binary(Binary::Mul, i[0], i[0]).unwrap();
            let shifted = d.scalar(Binary::Sub, out, 0.3, false).unwrap();
            d.release(out);
            d.inplace(InPlace::Tensor(Binary::Add), shifted, Some(i[1]))
                .unwrap();
            d.inplace(InPlace::Unary(Unary::Relu), shifted, None)
                .unwrap();
            shifted
        },
    );
}

#[test]
fn batch_norm_updates_the_running_statistics() {
    use crate::engine::op::vision::BatchNorm;
    let mut d = dev();
    let x = input(&mut d, &[4, 2, 3, 3], false, noise(5));
    let w = input(&mut d, &[2], false, |_| 1.0);
    let b = input(&mut d, &[2], false, |_| 0.0);
    let rm = input(&mut d, &[2], false, |_| 0.0);
    let rv = input(&mut d, &[2], false, |_| 1.0);
    let bn = Op::BatchNorm(BatchNorm {
        training: true,
        momentum: 0.1,
        eps: 1e-5,
    });
    let y = d.apply(&bn, &[x, w, b, rm, rv]).unwrap();
    let xs = values(&d, x);
    for c in 0..2 {
        let vals: Vec<f64> = (0..4)
            .flat_map(|n| (0..9).map(move |i| (n * 2 + c) * 9 + i))
            .map(|k| xs[k])
            .collect();
        let mean = vals.iter().sum::<f64>() / 36.0;
        let var = vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / 35.0;
        assert!((values(&d, rm)[c] - 0.1 * mean).abs() < 1e-12);
        assert!((values(&d, rv)[c] - (0.9 + 0.1 * var)).abs() < 1e-12);
    }
    d.release(y);
}

/// An integer tensor of `vals` (indices, offsets), outside the graph.
fn ints(d: &mut Dev, shape: &[usize], dtype: DType, vals: &[f64]) -> TensorId {
    let t = d
        .factory_fill(shape, dtype, false, Category::Input, Fill::Empty)
        .unwrap();
    d.write(t, vals).unwrap();
    t
}

/// A mixture of experts' ops: topk and sort (their values' gradient scattered back), row
/// gathers with repeated rows (accumulated), the grouped product through a transposed
/// weight (both gradients), `x /= x.sum(-1, keepdim)` in place and `masked_fill_` in the
/// graph.
#[test]
fn routing_ops_match_finite_differences() {
    use crate::engine::op::InPlace;
    check("topk", &[(vec![3, 5], true)], &|d, i| {
        let v = d.multi(&Op::Topk { k: 2, dim: -1 }, &[i[0]]).unwrap();
        d.release(v[1]);
        v[0]
    });
    check("sort", &[(vec![2, 4], true)], &|d, i| {
        let v = d.multi(&Op::Sort { dim: 0 }, &[i[0]]).unwrap();
        d.release(v[1]);
        v[0]
    });
    check("index", &[(vec![5, 3], true)], &|d, i| {
        let idx = ints(d, &[6], DType::I64, &[4.0, 0.0, 4.0, 2.0, 1.0, 4.0]);
        let y = d.apply(&Op::Gather, &[i[0], idx]).unwrap();
        d.release(idx);
        y
    });
    check(
        "grouped_mm",
        &[(vec![6, 3], true), (vec![2, 4, 3], true)],
        &|d, i| {
            let offs = ints(d, &[2], DType::I32, &[2.0, 6.0]);
            let l = d.info(i[1]).layout.transpose(-2, -1).unwrap();
            let wt = d.permute_op(
                crate::engine::op::ViewKind::Transpose,
                i[1],
                l,
                vec![0, 2, 1],
            );
            let y = d.grouped_mm(i[0], wt, offs).unwrap();
            d.release(offs);
            d.release(wt);
            y
        },
    );
    check("div_ by its own sum", &[(vec![3, 2], true)], &|d, i| {
        let t = d.scalar(Binary::Mul, i[0], 2.0, false).unwrap();
        let s = d.reduce(false, t, Some(-1), true).unwrap();
        d.inplace(InPlace::Tensor(Binary::Div), t, Some(s)).unwrap();
        d.release(s);
        t
    });
    check("masked_fill_", &[(vec![2, 3], true)], &|d, i| {
        let t = d.scalar(Binary::Mul, i[0], 3.0, false).unwrap();
        let m = ints(d, &[2, 3], DType::Bool, &[1.0, 0.0, 0.0, 1.0, 0.0, 1.0]);
        d.inplace(InPlace::MaskedFill(0.0), t, Some(m)).unwrap();
        d.release(m);
        t
    });
}
