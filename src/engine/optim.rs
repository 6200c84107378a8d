//! Optimizers, for memory: the state they create at their first step and the temporaries a
//! step allocates.
//!
//! - SGD keeps no state; with momentum, one buffer per parameter, made at the first step.
//! - Adam and AdamW make `exp_avg` and `exp_avg_sq` (zeros, parameter-sized) per parameter at
//!   the first step, in parameter order; their `step` counters live on the CPU.
//! - With `foreach` (PyTorch's default on CUDA), an Adam step allocates one parameter-sized
//!   temporary per parameter at once (`_foreach_sqrt` of `exp_avg_sq`) and frees them at the end
//!   of the step; without it, each parameter's update allocates two temporaries (`sqrt`, then the
//!   division) that are freed before the next parameter.
//! - bitsandbytes' `Adam8bit`/`AdamW8bit` (0.50, block-wise) make their state at the first
//!   step, parameter by parameter: for the first, the two quantization maps (256 float32 each,
//!   copied to the device once); for a parameter of at least `min_8bit_size` (4,096) elements,
//!   `state1` and `state2` as uint8 zeros of its size and `absmax1` and `absmax2`, one float32
//!   per block of 256; for a smaller one, two float32 states of its size. Their update is one
//!   kernel per parameter, in place: no temporaries. (The H200 traces of
//!   fixtures/opt8, allocation by allocation.) `PagedAdamW8bit` makes `state1` and `state2`
//!   of a parameter of at least 100,000 elements in unified memory (`get_state_buffer`'s
//!   `F.get_paged`): outside the caching allocator, counted apart; the rest as above.
//! - `zero_grad(set_to_none=True)` drops the gradients; with `False` they are zeroed in place.

use super::dtype::DType;
pub use super::op::OptimKind;
use super::op::{Fill, Hyper, Op, OptimStep};
use super::tensor::{Category, EngineError, TensorId, Tensors};
use crate::backend::Device;

#[derive(Debug, Clone)]
pub struct Optimizer {
    pub kind: OptimKind,
    pub foreach: bool,
    pub hyper: Hyper,
    /// Handles on the parameters.
    pub params: Vec<TensorId>,
    /// Per parameter, its state tensors (empty until the first step).
    pub state: Vec<Vec<TensorId>>,
    /// Per parameter, the steps it took (PyTorch's per-parameter `step`).
    pub steps: Vec<u64>,
    /// bitsandbytes' quantization maps on the device (the 8-bit optimizers' first step).
    pub qmaps: Vec<TensorId>,
}

/// bitsandbytes' `min_8bit_size`: smaller parameters keep 32-bit state.
const MIN_8BIT_SIZE: usize = 4096;
/// bitsandbytes' block size for the block-wise 8-bit state (one float32 maximum per block).
const BLOCK: usize = 256;
/// Entries of a quantization map (the dynamic 8-bit code, float32).
const QMAP_ENTRIES: usize = 256;
/// `get_state_buffer`: a paged optimizer's states of parameters this large go to unified
/// memory.
const PAGED_MIN_ELEMENTS: usize = 100_000;

impl Optimizer {
    /// An optimizer with PyTorch's default hyperparameters for `kind`.
    pub fn new(kind: OptimKind, params: Vec<TensorId>, foreach: bool) -> Self {
        Self::with_hyper(kind, params, foreach, Hyper::defaults(kind))
    }

    pub fn with_hyper(kind: OptimKind, params: Vec<TensorId>, foreach: bool, hyper: Hyper) -> Self {
        let state = vec![Vec::new(); params.len()];
        let steps = vec![0; params.len()];
        Optimizer {
            kind,
            foreach,
            hyper,
            params,
            state,
            steps,
            qmaps: Vec::new(),
        }
    }

    /// `optimizer.step()`.
    pub fn step<S: Device>(&mut self, d: &mut Tensors<S>) -> Result<(), EngineError> {
        // parameters without a gradient are skipped, as PyTorch's `_init_group` does
        let with_grad: Vec<usize> = (0..self.params.len())
            .filter(|&i| d.grad(self.params[i]).is_some())
            .collect();
        if self.kind.eight_bit() {
            if d.computes() {
                return Err(EngineError::Invalid(format!(
                    "{}'s block-wise 8-bit update runs on the simulated device only (--device sim, the default): it has no kernel on this device yet",
                    self.kind.name()
                )));
            }
            for &i in &with_grad {
                if self.state[i].is_empty() {
                    self.init_8bit(d, i)?;
                }
                self.steps[i] += 1;
            }
            return Ok(());
        }
        for &i in &with_grad {
            if self.state[i].is_empty() {
                let p = self.params[i];
                let (shape, dtype) = (d.shape(p).to_vec(), d.dtype(p));
                for _ in 0..self.kind.states() {
                    let s = d.empty_beside(p, &shape, dtype, Category::OptimizerState)?;
                    self.state[i].push(s);
                    // exp_avg and exp_avg_sq start at zeros (a momentum buffer is the first
                    // gradient, which the update writes)
                    if self.kind != OptimKind::SgdMomentum {
                        d.fill(s, Fill::Zeros)?;
                    }
                }
            }
        }
        for &i in &with_grad {
            self.steps[i] += 1;
            if d.computes() {
                let p = self.params[i];
                let g = d.grad(p).expect("has a gradient");
                let op = Op::OptimStep(OptimStep {
                    kind: self.kind,
                    hyper: self.hyper,
                    step: self.steps[i],
                });
                let mut outs = vec![p];
                outs.extend(&self.state[i]);
                d.launch(&op, &[g], &outs)?;
            }
        }
        if matches!(self.kind, OptimKind::Adam | OptimKind::AdamW) {
            if self.foreach {
                let mut temps = Vec::with_capacity(with_grad.len());
                for &i in &with_grad {
                    let p = self.params[i];
                    let (shape, dtype) = (d.shape(p).to_vec(), d.dtype(p));
                    match d.empty_beside(p, &shape, dtype, Category::Temporary) {
                        Ok(t) => temps.push(t),
                        Err(e) => {
                            for t in temps {
                                d.release(t);
                            }
                            return Err(e);
                        }
                    }
                }
                // a Python list (`exp_avg_sq_sqrt`): CPython drops its items last first
                for t in temps.into_iter().rev() {
                    d.release(t);
                }
            } else {
                for &i in &with_grad {
                    let p = self.params[i];
                    let (shape, dtype) = (d.shape(p).to_vec(), d.dtype(p));
                    let sqrt = d.empty_beside(p, &shape, dtype, Category::Temporary)?;
                    let denom = d.empty_beside(p, &shape, dtype, Category::Temporary);
                    d.release(sqrt);
                    d.release(denom?);
                }
            }
        }
        Ok(())
    }

    /// bitsandbytes' `init_state` for parameter `i` (the maps first, for the first one).
    fn init_8bit<S: Device>(&mut self, d: &mut Tensors<S>, i: usize) -> Result<(), EngineError> {
        let p = self.params[i];
        let numel: usize = d.shape(p).iter().product();
        let made = |d: &mut Tensors<S>, shape: Vec<usize>, dtype| {
            let s = d.empty_beside(p, &shape, dtype, Category::OptimizerState)?;
            d.fill(s, Fill::Zeros)?;
            Ok::<_, EngineError>(s)
        };
        if self.qmaps.is_empty() {
            for _ in 0..2 {
                let q = made(d, vec![QMAP_ENTRIES], DType::F32)?;
                self.qmaps.push(q);
            }
        }
        let shape = d.shape(p).to_vec();
        let paged = self.kind == OptimKind::PagedAdamW8bit && numel >= PAGED_MIN_ELEMENTS;
        if numel >= MIN_8BIT_SIZE {
            for _ in 0..2 {
                let s = if paged {
                    d.unified_empty(&shape, DType::U8, Category::OptimizerState)?
                } else {
                    made(d, shape.clone(), DType::U8)?
                };
                self.state[i].push(s);
            }
            for _ in 0..2 {
                let s = made(d, vec![numel.div_ceil(BLOCK)], DType::F32)?;
                self.state[i].push(s);
            }
        } else {
            for _ in 0..2 {
                let s = made(d, shape.clone(), DType::F32)?;
                self.state[i].push(s);
            }
        }
        Ok(())
    }

    /// `optimizer.zero_grad(set_to_none=...)`: drops the gradients, or zeros them in place.
    pub fn zero_grad<S: Device>(
        &self,
        d: &mut Tensors<S>,
        set_to_none: bool,
    ) -> Result<(), EngineError> {
        for &p in &self.params {
            if set_to_none {
                d.clear_grad(p);
            } else if let Some(g) = d.grad(p) {
                d.fill(g, Fill::Zeros)?;
            }
        }
        Ok(())
    }

    /// Gives back every handle (parameters and state).
    pub fn release<S: Device>(self, d: &mut Tensors<S>) {
        for s in self.state.into_iter().flatten().chain(self.qmaps) {
            d.release(s);
        }
        for p in self.params {
            d.release(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tensor::testing::*;
    use crate::engine::DType;

    #[test]
    fn adam_state_appears_at_the_first_step_and_foreach_temporaries_vanish() {
        let mut d = dev();
        let w = d
            .factory(&[1024, 1024], DType::F32, true, Category::Parameter)
            .unwrap();
        let b = d
            .factory(&[1024], DType::F32, true, Category::Parameter)
            .unwrap();
        let mut opt = Optimizer::new(OptimKind::AdamW, vec![d.retain(w), d.retain(b)], true);
        // no gradients yet: no state
        opt.step(&mut d).unwrap();
        assert!(opt.state.iter().all(|s| s.is_empty()));
        for p in [w, b] {
            let g = d
                .factory(
                    d.shape(p).to_vec().as_slice(),
                    DType::F32,
                    false,
                    Category::Gradient,
                )
                .unwrap();
            d.info_mut(p).grad = Some(g);
        }
        let before = d.alloc.stats().allocated_bytes.all().current;
        d.alloc.reset_peak_stats();
        opt.step(&mut d).unwrap();
        let s = d.alloc.stats();
        let params = (4 << 20) + 4096;
        assert_eq!(
            s.allocated_bytes.all().current - before,
            2 * params,
            "exp_avg and exp_avg_sq"
        );
        assert_eq!(
            s.allocated_bytes.all().peak - before,
            3 * params,
            "plus one foreach temporary each"
        );
        opt.zero_grad(&mut d, true).unwrap();
        assert!(d.grad(w).is_none());
        let before = d.alloc.stats().allocated_bytes.all().current;
        opt.step(&mut d).unwrap();
        assert_eq!(
            d.alloc.stats().allocated_bytes.all().current,
            before,
            "no gradients: nothing to do"
        );
        opt.release(&mut d);
    }
}
