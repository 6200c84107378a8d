//! Casts: `to(dtype)`, `float()`, `half()`, `bfloat16()`, `double()`: a new tensor in the
//! target dtype, or the tensor itself when it has that dtype already (autocast's casts are the
//! same op, [`super::Op::Cast`]).

use super::script::{entries, Bound, Entry, Form, Made, Param as P, UNARY, X};
use crate::engine::dtype::DType;
use crate::engine::TensorId;

fn cast(name: &'static str, b: &Bound<TensorId>) -> Result<Made<TensorId>, String> {
    let dtype = match name {
        "float" => Some(DType::F32),
        "half" => Some(DType::F16),
        "bfloat16" => Some(DType::BF16),
        "double" => Some(DType::F64),
        _ => b.dtype(1),
    };
    Ok(Made::To {
        x: b.tensor(0).ok_or("expects a tensor")?,
        dtype,
    })
}

entries! {
    "to", Method, &[X, P::DType("dtype")], cast, "a cast to dtype (itself if it has it)";
    "float", Method, UNARY, cast, "cast to float32";
    "half", Method, UNARY, cast, "cast to float16";
    "bfloat16", Method, UNARY, cast, "cast to bfloat16";
    "double", Method, UNARY, cast, "cast to float64";
}
