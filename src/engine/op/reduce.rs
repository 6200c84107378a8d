//! Reductions: `sum()` and `mean()`, over everything or one dimension (with `keepdim`). They
//! keep nothing for backward, whose gradient is the incoming one expanded back.

use super::script::{entries, Bound, Entry, Form, Made, Param as P, X};
use super::{Extras, Meta, MetaRef, Op};
use crate::engine::layout::{wrap_dim, LayoutError};

fn reduce(name: &'static str, b: &Bound<u32>) -> Result<Made<u32>, String> {
    let x = b.tensor(0).ok_or("expects a tensor")?;
    let op = Op::Reduce {
        mean: name == "mean",
        dim: b.int(1),
        keepdim: b.flag(2),
    };
    Ok(Made::Op {
        op,
        inputs: vec![x],
    })
}

const REDUCE: &[P] = &[X, P::OptInt("dim"), P::Bool("keepdim", false)];

entries! {
    "sum", Both, REDUCE, reduce, "sum, over everything or dim";
    "mean", Both, REDUCE, reduce, "mean, over everything or dim";
}

/// The reduced shape (the input's dtype): a scalar over everything, or `dim` removed (kept as
/// 1 with `keepdim`).
pub(super) fn outputs(
    x: MetaRef,
    dim: Option<i64>,
    keepdim: bool,
) -> Result<(Meta, Extras), LayoutError> {
    let mut shape = x.0.to_vec();
    match dim {
        None => shape.clear(),
        Some(d) => {
            let d = wrap_dim(d, shape.len())?;
            if keepdim {
                shape[d] = 1;
            } else {
                shape.remove(d);
            }
        }
    }
    Ok(((shape, x.1), vec![]))
}
