//! Backward formulas: derivatives made of several ops ([`Formula`]), run step by step with
//! their temporaries, then each gradient made in a broadcast shape summed to its input's
//! shape (the engine's `validate_outputs`); and a node's scratch steps (allocations and frees
//! around its kernels). The rest of backward is in [`super::autograd`].

use super::dtype::DType;
use super::graph::{Edge, NodeId};
use super::op::{FStep, Formula, Op, Step};
use super::tensor::{Category, EngineError, TensorId, Tensors};
use crate::backend::Device;

impl<S: Device> Tensors<S> {
    /// Derivatives made of several ops: per input that needs a gradient, its temporaries
    /// around its gradient; then (the engine's `validate_outputs`) each gradient made in a
    /// broadcast shape summed to its input's, with the reduction's scratch.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_formulas(
        &mut self,
        op: &Op,
        formulas: &[Formula],
        next: &[Edge],
        meta: &[(Vec<usize>, DType)],
        grad_out: TensorId,
        n: NodeId,
        made: &mut Vec<(Edge, TensorId)>,
    ) -> Result<(), EngineError> {
        let cat_for = |s: &Self, e: &Edge| s.grad_category(e);
        // (index in `made`, formula) of the gradients still in a broadcast shape
        let mut full = Vec::new();
        for f in formulas {
            let e = next[f.slot];
            if e == Edge::None {
                continue;
            }
            let mut temps: Vec<Option<TensorId>> = Vec::new();
            let r: Result<(), EngineError> = (|| {
                for step in &f.steps {
                    match step {
                        FStep::Temp((shape, dtype)) => {
                            temps.push(Some(self.empty(shape, *dtype, Category::Temporary)?));
                        }
                        FStep::Free(k) => {
                            if let Some(t) = temps.get_mut(*k).and_then(Option::take) {
                                self.release(t);
                            }
                        }
                        FStep::Grad => {
                            let (shape, dtype) = f.full.as_ref().unwrap_or(&meta[f.slot]);
                            let cat = if f.full.is_some() {
                                Category::Temporary
                            } else {
                                cat_for(self, &e)
                            };
                            let g = self.empty(shape, *dtype, cat)?;
                            let g = if f.full.is_none() {
                                self.follow_layout(op, g, grad_out)
                            } else {
                                g
                            };
                            made.push((e, g));
                            // computed here, inside the function, while what the node saved
                            // (a checkpoint's recomputed tensors) still exists; a broadcast
                            // shape is summed to the input's below
                            if self.computes() {
                                let saved = self.saved_roles(n);
                                self.launch_grad(op, f.slot, &[grad_out], g, &saved)?;
                            }
                            if f.full.is_some() {
                                full.push((made.len() - 1, f));
                            }
                        }
                    }
                }
                Ok(())
            })();
            for t in temps.into_iter().rev().flatten() {
                self.release(t);
            }
            r?;
        }
        // the function returns: the broadcast gradients are summed after (validate_outputs)
        self.release_recomputed(n);
        full.sort_by_key(|(_, f)| f.slot);
        for (at, f) in full {
            let (shape, dtype) = &meta[f.slot];
            let (full_shape, full_dtype) = f.full.as_ref().expect("a fitted gradient");
            let e = made[at].0;
            if full_shape == shape {
                // the same shape in a wider dtype: computed there, then cast
                let g = self.empty(shape, *dtype, cat_for(self, &e))?;
                let whole = std::mem::replace(&mut made[at].1, g);
                let r = self.launch(&Op::Copy, &[whole], &[g]);
                self.release(whole);
                r?;
                continue;
            }
            let whole = made[at].1;
            // (on an error `made` holds the full-size one, which the caller frees)
            let g = self.empty(shape, *full_dtype, cat_for(self, &e))?;
            made[at].1 = g;
            let r: Result<(), EngineError> = (|| {
                self.launch(&Op::SumTo, &[whole], &[g])?;
                let full_shape = &f.full.as_ref().expect("a broadcast gradient").0;
                let dims = super::op::grad::sum_to_dims(full_shape, shape);
                self.reduce_scratch(full_shape, &dims, *full_dtype)
            })();
            self.release(whole);
            r?;
            if full_dtype != dtype {
                let g = made[at].1;
                let c = self.empty(shape, *dtype, cat_for(self, &e))?;
                made[at].1 = c;
                let r = self.launch(&Op::Copy, &[g], &[c]);
                self.release(g);
                r?;
            }
        }
        Ok(())
    }

    /// A backward kernel's scratch, step by step; on a refusal, what it holds goes (last
    /// taken first) and the error is returned.
    pub(crate) fn run_scratch(&mut self, steps: &[Step]) -> Result<(), EngineError> {
        let mut held: Vec<Option<TensorId>> = Vec::new();
        for s in steps {
            match s {
                Step::Alloc {
                    shape,
                    dtype,
                    category,
                } => match self.empty(shape, *dtype, *category) {
                    Ok(t) => held.push(Some(t)),
                    Err(e) => {
                        for t in held.into_iter().rev().flatten() {
                            self.release(t);
                        }
                        return Err(e);
                    }
                },
                Step::Free(k) => {
                    if let Some(t) = held.get_mut(*k).and_then(Option::take) {
                        self.release(t);
                    }
                }
            }
        }
        Ok(())
    }
}
