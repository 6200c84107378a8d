//! The engine's side of a mixture of experts' ops ([`crate::engine::op::routing`]): the ops
//! that hand their caller more than one tensor (`topk`, `sort`), `index_put_` outside
//! autograd, and `grouped_mm`, whose weight's layout decides its gradient's.

use super::op::Op;
use super::tensor::{EngineError, TensorId, Tensors};
use crate::backend::Device;

impl<S: Device> Tensors<S> {
    /// An op that returns its output and its extras (`topk`, `sort`: values, then indices).
    pub fn multi(&mut self, op: &Op, inputs: &[TensorId]) -> Result<Vec<TensorId>, EngineError> {
        let (out, extras) = self.simple_with(op.clone(), inputs, true)?;
        let mut all = vec![out];
        all.extend(extras);
        Ok(all)
    }

    /// `x[indices] = values` (rows of `x`) outside autograd: nothing allocated, `x`'s version
    /// bumped.
    pub fn index_put(
        &mut self,
        x: TensorId,
        indices: TensorId,
        values: TensorId,
    ) -> Result<(), EngineError> {
        if self.grad_enabled && (self.info(x).requires_grad || self.info(values).requires_grad) {
            return Err(EngineError::Invalid(
                "index_put_ of a tensor in the autograd graph is not modelled: run it under no_grad".into(),
            ));
        }
        let (xs, is, vs) = (self.shape(x), self.shape(indices), self.shape(values));
        let rows_ok = is.len() == 1
            && !xs.is_empty()
            && vs.first() == is.first()
            && vs.get(1..) == xs.get(1..);
        if !rows_ok || self.dtype(indices).is_floating() {
            return Err(EngineError::Invalid(format!(
                "index_put_ expects a 1-D integer index and values of its length by the destination's rows, got index {} ({}), values {} into {}",
                super::layout::Dims(is),
                self.dtype(indices).name(),
                super::layout::Dims(vs),
                super::layout::Dims(xs)
            )));
        }
        self.bump_version(x);
        self.launch(&Op::IndexPut, &[x, indices, values], &[x])
    }

    /// `torch._grouped_mm(x, w, offs)`: `w` as a parameter's `transpose(-2, -1)` gets its
    /// gradient made in that layout.
    pub fn grouped_mm(
        &mut self,
        x: TensorId,
        w: TensorId,
        offs: TensorId,
    ) -> Result<TensorId, EngineError> {
        let l = &self.info(w).layout;
        let w_t = l.ndim() == 3 && !l.is_contiguous() && {
            let swapped = l.transpose(-2, -1).map(|t| t.is_contiguous());
            swapped.unwrap_or(false)
        };
        self.simple(Op::GroupedMm { w_t }, &[x, w, offs])
    }
}
