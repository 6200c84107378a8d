//! The ops of convolutional vision models (torchvision's ResNets): `conv2d` (cuDNN, with the
//! workspaces it takes from the caching allocator), `batch_norm` in training (cuDNN's kernel:
//! a float32 mean and inverse std per channel kept for backward, the running statistics
//! updated in place), `max_pool2d` (its int64 indices kept), and `adaptive_avg_pool2d`.
//! Kernels are square, as torchvision's are: one size, stride, padding and dilation for both
//! spatial dimensions.

use super::grad::{FStep, Formula, GradPlan};
use super::script::{Bound, Entry, Form, Made, Param};
use super::{Extras, Meta, MetaRef, Op, Save};
use crate::engine::dtype::DType;
use crate::engine::layout::{Dims, LayoutError};
use crate::engine::TensorId;

/// `F.conv2d(x, weight, bias, stride, padding, dilation, groups)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv {
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
    pub groups: usize,
}

/// `F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNorm {
    pub training: bool,
    pub momentum: f64,
    pub eps: f64,
}

/// `F.max_pool2d(x, kernel_size, stride, padding)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
}

/// One spatial size after a window: `(n + 2p - d(k - 1) - 1) / s + 1`, or an error when the
/// window does not fit.
fn window_out(n: usize, k: usize, s: usize, p: usize, d: usize) -> Option<usize> {
    if n == 0 || k == 0 || s == 0 {
        return None;
    }
    let span = d.checked_mul(k - 1)?.checked_add(1)?;
    let padded = p.checked_mul(2)?.checked_add(n)?;
    (padded >= span).then(|| (padded - span) / s + 1)
}

impl Conv {
    /// The output shape `[N, K, Ho, Wo]` of `x` `[N, C, H, W]` and `w` `[K, C / groups, R, S]`,
    /// with PyTorch's checks.
    pub fn out_shape(&self, x: &[usize], w: &[usize]) -> Result<Vec<usize>, LayoutError> {
        let bad = |m: String| Err(LayoutError(m));
        if x.len() != 4 {
            return bad(format!(
                "conv2d expects a 4-D input [N, C, H, W], got {}",
                Dims(x)
            ));
        }
        if w.len() != 4 {
            return bad(format!(
                "conv2d expects a 4-D weight [K, C / groups, R, S], got {}",
                Dims(w)
            ));
        }
        if self.groups == 0
            || w[1].checked_mul(self.groups) != Some(x[1])
            || !w[0].is_multiple_of(self.groups)
        {
            return bad(format!(
                "Given groups={}, weight of size {}, expected input{} to have {} channels, but got {} channels instead",
                self.groups,
                Dims(w),
                Dims(x),
                w[1] * self.groups,
                x[1]
            ));
        }
        if x[2..].contains(&0) || w[2..].contains(&0) {
            return bad(format!(
                "conv2d needs positive spatial sizes, got input {} and weight {}",
                Dims(x),
                Dims(w)
            ));
        }
        let (ho, wo) = (
            window_out(x[2], w[2], self.stride, self.padding, self.dilation),
            window_out(x[3], w[3], self.stride, self.padding, self.dilation),
        );
        match (ho, wo) {
            (Some(ho), Some(wo)) if ho > 0 && wo > 0 => Ok(vec![x[0], w[0], ho, wo]),
            _ => bad(format!(
                "Calculated padded input size per channel: ({} x {}). Kernel size: ({} x {}). Kernel size can't be greater than actual input size",
                x[2] + 2 * self.padding,
                x[3] + 2 * self.padding,
                w[2],
                w[3]
            )),
        }
    }
}

impl Pool {
    pub fn out_shape(&self, x: &[usize]) -> Result<Vec<usize>, LayoutError> {
        if x.len() != 4 {
            return Err(LayoutError(format!(
                "max_pool2d expects a 4-D input [N, C, H, W], got {}",
                Dims(x)
            )));
        }
        if 2 * self.padding > self.kernel {
            return Err(LayoutError(format!(
                "pad should be at most half of effective kernel size, but got pad={}, kernel_size={}",
                self.padding, self.kernel
            )));
        }
        match (
            window_out(x[2], self.kernel, self.stride, self.padding, 1),
            window_out(x[3], self.kernel, self.stride, self.padding, 1),
        ) {
            (Some(h), Some(w)) if h > 0 && w > 0 => Ok(vec![x[0], x[1], h, w]),
            _ => Err(LayoutError(format!(
                "max_pool2d: the {}x{} window does not fit the input {}",
                self.kernel,
                self.kernel,
                Dims(x)
            ))),
        }
    }
}

/// The output and extras of the family's ops.
pub(super) fn outputs(op: &Op, ins: &[MetaRef]) -> Option<Result<(Meta, Extras), LayoutError>> {
    let x = ins.first()?;
    let r = match op {
        Op::Conv2d(c) => {
            let w = ins.get(1)?;
            let bias_ok = ins.get(2).is_none_or(|b| b.0 == [w.0[0]]);
            if !bias_ok {
                return Some(Err(LayoutError(format!(
                    "conv2d's bias must be [{}], got {}",
                    w.0.first().copied().unwrap_or(0),
                    Dims(ins[2].0)
                ))));
            }
            c.out_shape(x.0, w.0).map(|s| ((s, x.1), vec![]))
        }
        Op::BatchNorm(bn) => {
            if x.0.len() < 2 {
                return Some(Err(LayoutError(format!(
                    "batch_norm expects at least [N, C], got {}",
                    Dims(x.0)
                ))));
            }
            let c = x.0[1];
            if ins[1..].iter().any(|m| m.0 != [c]) {
                return Some(Err(LayoutError(format!(
                    "batch_norm's running statistics, weight and bias must each be [{c}]"
                ))));
            }
            let per_channel = x.0[0] * x.0[2..].iter().product::<usize>();
            if bn.training && per_channel <= 1 {
                return Some(Err(LayoutError(format!(
                    "Expected more than 1 value per channel when training, got input size {}",
                    Dims(x.0)
                ))));
            }
            // cuDNN's kernel keeps a float32 mean and inverse std per channel (training only)
            let stats = if bn.training {
                vec![(vec![c], DType::F32); 2]
            } else {
                vec![]
            };
            Ok(((x.0.to_vec(), x.1), stats))
        }
        Op::MaxPool2d(p) => p
            .out_shape(x.0)
            .map(|s| ((s.clone(), x.1), vec![(s, DType::I64)])),
        Op::AdaptiveAvgPool2d { out } => {
            if x.0.len() != 4 {
                return Some(Err(LayoutError(format!(
                    "adaptive_avg_pool2d expects a 4-D input [N, C, H, W], got {}",
                    Dims(x.0)
                ))));
            }
            if x.0[2] == 0 || x.0[3] == 0 {
                return Some(Err(LayoutError(format!(
                    "adaptive_avg_pool2d: expected non-empty spatial sizes, got input {}",
                    Dims(x.0)
                ))));
            }
            Ok(((vec![x.0[0], x.0[1], out[0], out[1]], x.1), vec![]))
        }
        _ => return None,
    };
    Some(r)
}

/// What the family's ops keep for backward, beyond their extras.
pub(super) fn saves(op: &Op) -> &'static [Save] {
    match op {
        // ConvolutionBackward0 keeps the input and the weight
        Op::Conv2d(_) => &[Save::Input(0), Save::Input(1)],
        // cuDNN's batch-norm backward reads the input and the weight (and the saved stats)
        Op::BatchNorm(_) => &[Save::Input(0), Save::Input(1)],
        Op::MaxPool2d(_) => &[Save::Input(0)],
        // to 1 x 1 PyTorch computes a mean over the plane (`mean_dim`), which keeps nothing
        Op::AdaptiveAvgPool2d { out: [1, 1] } => &[],
        Op::AdaptiveAvgPool2d { .. } => &[Save::Input(0)],
        _ => &[],
    }
}

/// Which of cuDNN's convolution computations a workspace is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvPass {
    Forward,
    /// The input's gradient (`backward_data`).
    Data,
    /// The weight's gradient (`backward_filter`).
    Filter,
}

/// The workspace cuDNN takes from the caching allocator for one convolution computation (0:
/// none). See [`super::cudnn_conv`].
pub fn conv_workspace(pass: ConvPass, c: &Conv, x: &[usize], w: &[usize], dtype: DType) -> u64 {
    super::cudnn_conv::workspace(pass, c, x, w, dtype)
}

/// The forward's workspace, taken after the output and freed before the op returns.
pub(super) fn forward_scratch(op: &Op, ins: &[MetaRef]) -> Vec<super::Step> {
    match (op, ins.first(), ins.get(1)) {
        (Op::Conv2d(c), Some(x), Some(w)) if c.out_shape(x.0, w.0).is_ok() => {
            let n = conv_workspace(ConvPass::Forward, c, x.0, w.0, x.1);
            bytes_then_free(n, 0)
        }
        _ => Vec::new(),
    }
}

fn bytes_then_free(n: u64, at: usize) -> Vec<super::Step> {
    if n == 0 {
        return Vec::new();
    }
    vec![
        super::Step::Alloc {
            shape: vec![n as usize],
            dtype: DType::U8,
            category: crate::trace::Category::Workspace,
        },
        super::Step::Free(at),
    ]
}

/// `convolution_backward`: the input's gradient, then its workspace (taken and given back),
/// then the weight's and its workspace, then the bias's (a sum of the incoming gradient).
pub(super) fn grad_plan(op: &Op, inputs: &[Meta]) -> GradPlan {
    let Op::Conv2d(c) = op else {
        return GradPlan::default();
    };
    let (x, w) = (&inputs[0], &inputs[1]);
    let with_ws = |slot: usize, pass: ConvPass| {
        let n = conv_workspace(pass, c, &x.0, &w.0, x.1);
        let mut steps = vec![FStep::Grad];
        if n > 0 {
            steps.push(FStep::Temp((vec![n as usize], DType::U8)));
            steps.push(FStep::Free(0));
        }
        Formula {
            slot,
            steps,
            full: None,
        }
    };
    let mut formulas = vec![with_ws(0, ConvPass::Data), with_ws(1, ConvPass::Filter)];
    if inputs.len() > 2 {
        formulas.push(Formula::plain(2));
    }
    GradPlan {
        formulas,
        ..GradPlan::default()
    }
}

fn conv(_: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let pos = |i: usize, name: &str, min: i64| -> Result<usize, String> {
        let v = b.int(i).unwrap_or(0);
        if v < min {
            return Err(format!("conv2d's {name} must be at least {min}, got {v}"));
        }
        Ok(v as usize)
    };
    let c = Conv {
        stride: pos(3, "stride", 1)?,
        padding: pos(4, "padding", 0)?,
        dilation: pos(5, "dilation", 1)?,
        groups: pos(6, "groups", 1)?,
    };
    let mut inputs = vec![b.tensor(0).ok_or("expects a tensor")?];
    inputs.push(b.tensor(1).ok_or("expects a weight")?);
    inputs.extend(b.tensor(2));
    Ok(Made::Op {
        op: Op::Conv2d(c),
        inputs: inputs.into(),
    })
}

fn batch_norm(_: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let t = |i: usize, what: &str| b.tensor(i).ok_or(format!("batch_norm needs {what}"));
    let training = b.flag(5);
    let momentum = b.float(6).unwrap_or(0.1);
    let eps = b.float(7).unwrap_or(1e-5);
    if eps.is_nan() || eps <= 0.0 {
        return Err(format!("batch_norm's eps must be positive, got {eps}"));
    }
    // inputs: x, weight, bias (the gradients' order), then the running statistics
    Ok(Made::Op {
        op: Op::BatchNorm(BatchNorm {
            training,
            momentum,
            eps,
        }),
        inputs: smallvec::smallvec![
            t(0, "an input")?,
            t(3, "a weight (affine batch norm)")?,
            t(4, "a bias (affine batch norm)")?,
            t(1, "running_mean")?,
            t(2, "running_var")?,
        ],
    })
}

fn max_pool(_: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let kernel = b.int(1).unwrap_or(0);
    let stride = b.int(2).unwrap_or(kernel);
    let padding = b.int(3).unwrap_or(0);
    if kernel < 1 || stride < 1 || padding < 0 {
        return Err(format!(
            "max_pool2d needs kernel_size >= 1, stride >= 1 and padding >= 0, got {kernel}, {stride}, {padding}"
        ));
    }
    Ok(Made::Op {
        op: Op::MaxPool2d(Pool {
            kernel: kernel as usize,
            stride: stride as usize,
            padding: padding as usize,
        }),
        inputs: smallvec::smallvec![b.tensor(0).ok_or("expects a tensor")?],
    })
}

fn adaptive_avg_pool(_: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let sizes = b.sizes()?;
    let out = match sizes[..] {
        [s] => [s, s],
        [h, w] => [h, w],
        _ => return Err("output_size is one size or [h, w]".into()),
    };
    if out.iter().any(|&s| s < 1) {
        return Err(format!("output_size must be positive, got {out:?}"));
    }
    Ok(Made::Op {
        op: Op::AdaptiveAvgPool2d {
            out: [out[0] as usize, out[1] as usize],
        },
        inputs: smallvec::smallvec![b.tensor(0).ok_or("expects a tensor")?],
    })
}

/// The script functions of the family.
pub(super) static ENTRIES: &[Entry] = &[
    Entry {
        name: "conv2d",
        form: Form::Function,
        params: &[
            Param::Tensor("input"),
            Param::Tensor("weight"),
            Param::OptTensor("bias"),
            Param::Int("stride", Some(1)),
            Param::Int("padding", Some(0)),
            Param::Int("dilation", Some(1)),
            Param::Int("groups", Some(1)),
        ],
        doc: "F.conv2d with a square kernel, cuDNN's workspaces taken and given back (keeps input and weight)",
        make: conv,
    },
    Entry {
        name: "batch_norm",
        form: Form::Function,
        params: &[
            Param::Tensor("input"),
            Param::Tensor("running_mean"),
            Param::Tensor("running_var"),
            Param::Tensor("weight"),
            Param::Tensor("bias"),
            Param::Bool("training", false),
            Param::Float("momentum", Some(0.1)),
            Param::Float("eps", Some(1e-5)),
        ],
        doc: "F.batch_norm over dim 1 (training: keeps input, weight and a float32 mean and inverse std per channel; updates the running statistics in place)",
        make: batch_norm,
    },
    Entry {
        name: "max_pool2d",
        form: Form::Function,
        params: &[
            Param::Tensor("input"),
            Param::Int("kernel_size", None),
            Param::OptInt("stride"),
            Param::Int("padding", Some(0)),
        ],
        doc: "F.max_pool2d with a square window (stride defaults to kernel_size; keeps input and its int64 indices)",
        make: max_pool,
    },
    Entry {
        name: "adaptive_avg_pool2d",
        form: Form::Function,
        params: &[Param::Tensor("input"), Param::Sizes("output_size")],
        doc: "F.adaptive_avg_pool2d to [h, w] (or one size for both)",
        make: adaptive_avg_pool,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_sizes_follow_pytorchs_formula() {
        let c = Conv {
            stride: 2,
            padding: 3,
            dilation: 1,
            groups: 1,
        };
        assert_eq!(
            c.out_shape(&[64, 3, 224, 224], &[64, 3, 7, 7]).unwrap(),
            vec![64, 64, 112, 112]
        );
        let p = Pool {
            kernel: 3,
            stride: 2,
            padding: 1,
        };
        assert_eq!(
            p.out_shape(&[64, 64, 112, 112]).unwrap(),
            vec![64, 64, 56, 56]
        );
        let g = Conv {
            stride: 1,
            padding: 1,
            dilation: 1,
            groups: 32,
        };
        assert_eq!(
            g.out_shape(&[2, 128, 56, 56], &[128, 4, 3, 3]).unwrap(),
            vec![2, 128, 56, 56]
        );
        assert!(g
            .out_shape(&[2, 128, 56, 56], &[128, 8, 3, 3])
            .unwrap_err()
            .0
            .contains("expected input[2, 128, 56, 56] to have 256 channels"));
        let big = Conv {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
        };
        assert!(big.out_shape(&[1, 3, 4, 4], &[8, 3, 5, 5]).is_err());
    }
}
