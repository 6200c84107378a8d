//! Named tensors as a safetensors file (float32): a run's captured gradients, for comparison
//! with PyTorch's.

use safetensors::tensor::{Dtype, TensorView};

use crate::analysis::record::NamedValues;
use crate::error::Error;

/// The bytes of a safetensors file holding `tensors` as float32.
pub fn safetensors(tensors: &[NamedValues]) -> Result<Vec<u8>, Error> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, shape, v)| {
            let b = v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect();
            (n.clone(), shape.clone(), b)
        })
        .collect();
    let mut views = Vec::with_capacity(bytes.len());
    for (n, shape, b) in &bytes {
        let view = TensorView::new(Dtype::F32, shape.clone(), b)
            .map_err(|e| Error::Output(std::io::Error::other(format!("tensor {n}: {e}"))))?;
        views.push((n.clone(), view));
    }
    safetensors::serialize(views, None)
        .map_err(|e| Error::Output(std::io::Error::other(format!("safetensors: {e}"))))
}
