//! Normalizations over the last dimension: `layer_norm` (keeps its input, weight and bias and
//! a float32 mean and rstd per row) and `rms_norm` (PyTorch's fused kernel: keeps its input and
//! weight and a float32 rstd per row). Both run in float32 under autocast.

use super::script::{Bound, Entry, Form, Made, Param};
use super::{CastPolicy, Extras, Meta, MetaRef, Op, Save};
use crate::engine::dtype::DType;
use crate::engine::layout::LayoutError;
use crate::engine::TensorId;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Norm {
    /// `F.layer_norm(x, [d], w, b, eps)`.
    Layer { eps: f64 },
    /// `F.rms_norm(x, [d], w, eps)`.
    Rms { eps: f64 },
}

/// Every norm with its default attributes (the kernels' checks run each).
pub const EXAMPLES: &[Norm] = &[Norm::Layer { eps: 1e-5 }, Norm::Rms { eps: 1e-6 }];

impl Norm {
    /// How many tensors it takes: the input, then its weight (and bias).
    pub fn inputs(self) -> usize {
        match self {
            Norm::Layer { .. } => 3,
            Norm::Rms { .. } => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Norm::Layer { .. } => "layer_norm",
            Norm::Rms { .. } => "rms_norm",
        }
    }

    pub fn kernels(self) -> (&'static str, &'static str) {
        match self {
            Norm::Layer { .. } => ("layer_norm", "layer_norm_backward"),
            Norm::Rms { .. } => ("rms_norm", "rms_norm_backward"),
        }
    }

    pub fn autocast(self) -> CastPolicy {
        CastPolicy::Float32
    }

    /// The input, then the weight and bias given.
    pub fn saves(self, inputs: usize) -> &'static [Save] {
        &[Save::Input(0), Save::Input(1), Save::Input(2)][..inputs.min(3)]
    }

    /// The output (the input's shape and dtype) and the float32 statistics per row: mean and
    /// rstd for layer_norm, rstd for rms_norm.
    pub fn outputs(self, x: MetaRef) -> Result<(Meta, Extras), LayoutError> {
        if x.0.is_empty() {
            return Err(LayoutError(format!(
                "{} needs at least one dimension",
                self.name()
            )));
        }
        let rows = x.0[..x.0.len() - 1].iter().product::<usize>();
        let stat = (vec![rows], DType::F32);
        let n = match self {
            Norm::Layer { .. } => 2,
            Norm::Rms { .. } => 1,
        };
        Ok(((x.0.to_vec(), x.1), vec![stat; n]))
    }
}

fn make(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let x = b.tensor(0).ok_or("expects a tensor")?;
    let norm = match name {
        "layer_norm" => {
            if b.tensor(1).is_none() && b.tensor(2).is_some() {
                return Err(
                    "layer_norm with a bias and no weight is not in gpumem's engine; pass both"
                        .into(),
                );
            }
            Norm::Layer {
                eps: b.float(3).unwrap_or(1e-5),
            }
        }
        _ => Norm::Rms {
            eps: b.float(2).unwrap_or(1e-6),
        },
    };
    let mut inputs: smallvec::SmallVec<[TensorId; 4]> = smallvec::smallvec![x];
    inputs.extend(b.tensor(1));
    inputs.extend(b.tensor(2).filter(|_| name == "layer_norm"));
    Ok(Made::Op {
        op: Op::Norm(norm),
        inputs,
    })
}

/// The script functions of the family.
pub(super) static ENTRIES: &[Entry] = &[
    Entry {
        name: "layer_norm",
        form: Form::Function,
        params: &[
            Param::Tensor("input"),
            Param::OptTensor("weight"),
            Param::OptTensor("bias"),
            Param::Float("eps", Some(1e-5)),
        ],
        doc: "F.layer_norm over the last dimension (keeps x, mean, rstd)",
        make,
    },
    Entry {
        name: "rms_norm",
        form: Form::Function,
        params: &[
            Param::Tensor("input"),
            Param::OptTensor("weight"),
            Param::Float("eps", Some(1e-6)),
        ],
        doc: "F.rms_norm over the last dimension (keeps x, weight, rstd)",
        make,
    },
];

#[cfg(test)]
mod tests {
    use crate::engine::op::{Norm, Op};
    use crate::engine::tensor::testing::dev;
    use crate::engine::{Category, DType};

    /// rms_norm keeps its input, its weight and a float32 rstd per row (PyTorch's fused
    /// kernel); without a graph the rstd goes at once.
    #[test]
    fn rms_norm_keeps_x_weight_and_rstd() {
        let mut d = dev();
        let x = d
            .factory(&[8, 128, 64], DType::BF16, false, Category::Input)
            .unwrap();
        let w = d
            .factory(&[64], DType::BF16, true, Category::Parameter)
            .unwrap();
        let y = d
            .apply(&Op::Norm(Norm::Rms { eps: 1e-6 }), &[x, w])
            .unwrap();
        assert_eq!(d.shape(y), &[8, 128, 64]);
        assert_eq!(d.saved_tensors(), 3, "x, weight, rstd");
        let act: u64 = d
            .by_category()
            .into_iter()
            .filter(|(c, _)| *c == Category::Activation)
            .map(|(_, b)| b)
            .sum();
        assert_eq!(act, 8 * 128 * 4, "a float32 rstd per row");
        d.release(y);
        d.grad_enabled = false;
        let y = d
            .apply(&Op::Norm(Norm::Rms { eps: 1e-6 }), &[x, w])
            .unwrap();
        assert_eq!(d.saved_tensors(), 0);
        d.release(y);
    }
}
