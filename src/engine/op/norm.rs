//! Normalizations over the last dimension: `layer_norm` (keeps its input, weight and bias and
//! a float32 mean and rstd per row). It runs in float32 under autocast.

use super::script::{Bound, Entry, Form, Made, Param};
use super::{CastPolicy, Extras, Meta, Op, Save};
use crate::engine::dtype::DType;
use crate::engine::layout::LayoutError;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Norm {
    /// `F.layer_norm(x, [d], w, b, eps)`.
    Layer { eps: f64 },
}

/// Every norm with its default attributes (the kernels' checks run each).
pub const EXAMPLES: &[Norm] = &[Norm::Layer { eps: 1e-5 }];

impl Norm {
    /// How many tensors it takes: the input, then its weight (and bias).
    pub fn inputs(self) -> usize {
        match self {
            Norm::Layer { .. } => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Norm::Layer { .. } => "layer_norm",
        }
    }

    pub fn kernels(self) -> (&'static str, &'static str) {
        match self {
            Norm::Layer { .. } => ("layer_norm", "layer_norm_backward"),
        }
    }

    pub fn autocast(self) -> CastPolicy {
        CastPolicy::Float32
    }

    /// The input, then the weight and bias given.
    pub fn saves(self, inputs: usize) -> Vec<Save> {
        (0..inputs).map(Save::Input).collect()
    }

    /// The output (the input's shape and dtype) and the float32 statistics per row: mean and
    /// rstd for layer_norm.
    pub fn outputs(self, x: &Meta) -> Result<(Meta, Extras), LayoutError> {
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
        };
        Ok((x.clone(), vec![stat; n]))
    }
}

fn make(name: &'static str, b: &Bound<u32>) -> Result<Made<u32>, String> {
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
        _ => return Err(format!("{name}: not a norm")),
    };
    let mut inputs = vec![x];
    inputs.extend(b.tensor(1));
    inputs.extend(b.tensor(2).filter(|_| name == "layer_norm"));
    Ok(Made::Op {
        op: Op::Norm(norm),
        inputs,
    })
}

/// The script functions of the family.
pub(super) static ENTRIES: &[Entry] = &[Entry {
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
}];
