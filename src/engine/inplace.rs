//! In-place ops (`x.add_(y)`, `x.relu_()`, `x.copy_(src)`, `x[...] = v`): nothing allocated, the
//! storage's version bumped, and, on a tensor in the autograd graph, its history rebased as
//! PyTorch rebases it: a node for the op takes the tensor's old grad_fn as its input and
//! becomes its grad_fn. Only ops whose derivative needs nothing the write destroys are taken
//! there; the others, in-place writes to views (PyTorch's CopySlices) and integer results of a
//! floating operand are refused with PyTorch's reason.

use super::layout::Dims;
use super::op::{Binary, InPlace, Op, Unary};
use super::tensor::{EngineError, TensorId, Tensors};
use crate::backend::Device;

/// An in-place op's method name, for messages.
fn inplace_name(op: InPlace) -> String {
    match op {
        InPlace::Tensor(b) | InPlace::Scalar(b, _) => format!("{}_", b.name()),
        InPlace::Unary(u) => format!("{}_", u.name()),
        InPlace::Fill(_) => "zero_/fill_".into(),
        InPlace::Copy => "copy_ (or slice assignment)".into(),
        InPlace::MaskedFill(_) => "masked_fill_".into(),
    }
}

impl<S: Device> Tensors<S> {
    /// An in-place op: nothing is allocated, the storage's version goes up (so a node that
    /// saved it can no longer compute its gradient), and the kernel writes into it. In the
    /// autograd graph (grad mode on, `x` or the operand requiring grad) the tensor's history
    /// is rebased as PyTorch does: a node for the op takes `x`'s old grad_fn as its input and
    /// becomes `x`'s grad_fn (`relu_` keeps its result, the same storage: no allocation).
    /// Only the ops whose derivative needs nothing the write destroys are taken there.
    pub fn inplace(
        &mut self,
        op: InPlace,
        x: TensorId,
        operand: Option<TensorId>,
    ) -> Result<(), EngineError> {
        if self.grad_enabled && self.is_leaf(x) && self.info(x).requires_grad {
            return Err(EngineError::Invalid(
                "a leaf Variable that requires grad is being used in an in-place operation.".into(),
            ));
        }
        let in_graph = self.grad_enabled
            && (self.info(x).requires_grad || operand.is_some_and(|o| self.info(o).requires_grad));
        let node_op = if in_graph {
            let eq = match op {
                InPlace::Unary(u @ (Unary::Relu | Unary::Exp | Unary::Neg)) => Some(Op::Unary(u)),
                InPlace::Tensor(b @ (Binary::Add | Binary::Sub | Binary::Div)) => {
                    Some(Op::Binary(b))
                }
                InPlace::MaskedFill(value) => Some(Op::MaskedFill { value }),
                InPlace::Scalar(b, value) => Some(Op::Scalar {
                    op: b,
                    value,
                    reversed: false,
                }),
                _ => None,
            };
            if !self.dtype(x).is_floating() {
                return Err(EngineError::Invalid(format!(
                    "result type Float can't be cast to the desired output type {} ({} of an integer tensor by a tensor that requires grad)",
                    self.dtype(x).name(),
                    inplace_name(op)
                )));
            }
            if eq.is_none() {
                // (copy_ records CopySlices in PyTorch; the others' derivatives read the
                // values the write destroys)
                return Err(EngineError::Invalid(format!(
                    "{} of a tensor in the autograd graph is not modelled: write it out of place, or run it under no_grad",
                    inplace_name(op)
                )));
            }
            // a differentiable view's base would need PyTorch's CopySlices
            let on_view = self.info(x).grad_fn.is_some_and(|n| {
                matches!(
                    self.nodes[n.0 as usize].op,
                    Op::View { .. } | Op::Split { .. }
                )
            });
            if on_view {
                return Err(EngineError::Invalid(format!(
                    "{} of a view of a tensor in the autograd graph is not modelled (PyTorch rebases the view's base with CopySlices): write it out of place, or on the base",
                    inplace_name(op)
                )));
            }
            eq
        } else {
            None
        };
        if let Some(o) = operand {
            let (xs, os) = (self.shape(x), self.shape(o));
            if super::op::broadcast(os, xs).as_deref() != Ok(xs) {
                return Err(EngineError::Invalid(format!(
                    "the source of size {} cannot be broadcast to the destination's {}",
                    Dims(os),
                    Dims(xs)
                )));
            }
        }
        // `x /= y` by a tensor needs x's old values for y's gradient: autograd's codegen keeps
        // a clone of them (`original_self`), taken before the write
        let original = match (node_op.as_ref(), operand) {
            (Some(Op::Binary(Binary::Div)), Some(o)) if self.info(o).requires_grad => {
                Some(self.original_self(x)?)
            }
            _ => None,
        };
        self.bump_version(x);
        let mut ins = vec![x];
        ins.extend(operand);
        if let Err(e) = self.launch(&Op::InPlace(op), &ins, &[x]) {
            if let Some(c) = original {
                self.release(c);
            }
            return Err(e);
        }
        if let Some(eq) = node_op {
            let old = self.info(x).grad_fn;
            match original {
                Some(c) => {
                    // the node's edge is x's history; what it keeps of `self` is the clone
                    let (nr, rg) = (self.info(x).output_nr, self.info(x).requires_grad);
                    let info = self.info_mut(c);
                    (info.grad_fn, info.output_nr, info.requires_grad) = (old, nr, rg);
                    let node_ins = [c, ins[1]];
                    self.record_node(&eq, &node_ins, &[x], eq.saves(2));
                    let info = self.info_mut(c);
                    (info.grad_fn, info.requires_grad) = (None, false);
                    self.release(c);
                }
                None => self.record_node(&eq, &ins, &[x], eq.saves(ins.len())),
            }
            // `x` now refers to the new node; the new node holds the old one
            if let Some(n) = old {
                self.node_decref(n);
            }
        }
        Ok(())
    }

    /// A copy of `x`'s values before an in-place write, outside the graph (an activation its
    /// node keeps).
    fn original_self(&mut self, x: TensorId) -> Result<TensorId, EngineError> {
        let shape = self.shape(x).to_vec();
        let c = self.empty(&shape, self.dtype(x), crate::trace::Category::Activation)?;
        if let Err(e) = self.launch(&Op::Copy, &[x], &[c]) {
            self.release(c);
            return Err(e);
        }
        Ok(c)
    }
}
