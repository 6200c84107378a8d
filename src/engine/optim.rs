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
//! - torchao's low-bit `Adam8bit`/`AdamW8bit` and `Adam4bit`/`AdamW4bit` (`torchao.optim` 0.18)
//!   make a parameter's state at its first step, just before its update: for a parameter of
//!   at least 4,096 elements that is a whole number of blocks (256 elements for 8 bits, 128
//!   for 4), `exp_avg` then `exp_avg_sq` as a quantized subclass, each its uint8 codes (the
//!   parameter's shape; for 4 bits half as many bytes, flat), one float32 scale per block and
//!   its quantization map (256 or 16 float32, copied to the device per state); for any other
//!   parameter, two `zeros_like` of it, in its dtype. The update of each quantized parameter
//!   is `single_param_adam` under `torch.compile`, whose generated code (inductor, PyTorch
//!   2.11) allocates per state the new block scales and the state dequantized to float32,
//!   with 4 bits also its int64 codes; they go when the call returns (the free order below).
//!   Plain parameters' updates fuse into one kernel that allocates nothing. Dynamo's first
//!   trace in the process makes and drops a float32 scalar on the device. (H100 snapshots of
//!   fixtures/torchao, allocation by allocation, after a first run filled inductor's cache.)
//!   The first call of each compiled update (one graph per parameter shape and dtype) also
//!   times its kernels when its state has more than 8,448 blocks, even with inductor's cache
//!   warm: twice, each time allocating and dropping an L2-sized flush buffer (50 MiB). With
//!   the cache cold (the first run on a machine) the autotuner also clones the arguments it
//!   writes for every configuration it tries; that is not modelled.
//! - `zero_grad(set_to_none=True)` drops the gradients; with `False` they are zeroed in place.

use super::dtype::DType;
use super::op::LowBit;
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
    /// (torchao's maps are per state, in `state`.)
    pub qmaps: Vec<TensorId>,
    /// torchao: whether `torch.compile` has traced the update yet (dynamo's first trace in the
    /// process makes a float32 scalar on the device for its fake tensors and drops it).
    pub traced: bool,
    /// torchao: the (shape, dtype) of each parameter whose update has been compiled (one graph
    /// each: `torch.compile(..., dynamic=False)`).
    pub compiled: Vec<(Vec<usize>, DType)>,
}

/// bitsandbytes' `min_8bit_size`: smaller parameters keep 32-bit state.
const MIN_8BIT_SIZE: usize = 4096;
/// bitsandbytes' block size for the block-wise 8-bit state (one float32 maximum per block).
const BLOCK: usize = 256;
/// Entries of a quantization map (the dynamic 8-bit code, float32).
const QMAP_ENTRIES: usize = 256;
/// torchao's compiled update: the first call of a graph over more blocks than this times its
/// kernels (H100 recordings: none at 8,400 blocks or fewer, at 9,216 or more always; the bound
/// taken is 64 per multiprocessor of the H100's and H200's 132).
const BENCH_MIN_BLOCKS: usize = 64 * 132;
/// The buffer inductor's benchmarker fills to flush the L2 cache before each timing: the L2's
/// size, 50 MiB on an H100 and an H200.
const L2_FLUSH_BYTES: usize = 50 << 20;
/// Timings of a graph's first call with inductor's cache warm (each allocates the flush buffer
/// and drops it).
const BENCH_TIMINGS: usize = 2;
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
            traced: false,
            compiled: Vec::new(),
        }
    }

    /// `optimizer.step()`.
    pub fn step<S: Device>(&mut self, d: &mut Tensors<S>) -> Result<(), EngineError> {
        // parameters without a gradient are skipped, as PyTorch's `_init_group` does
        let with_grad: Vec<usize> = (0..self.params.len())
            .filter(|&i| d.grad(self.params[i]).is_some())
            .collect();
        if self.kind.simulated_only() && d.computes() {
            return Err(EngineError::Invalid(format!(
                "{}'s block-wise low-bit update runs on the simulated device only (--device sim, the default): it has no kernel on this device yet",
                self.kind.name()
            )));
        }
        if let Some(lb) = self.kind.torchao() {
            for &i in &with_grad {
                self.step_torchao(d, i, lb)?;
            }
            return Ok(());
        }
        if self.kind.eight_bit() {
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

    /// torchao's step of parameter `i`: its state at the first step (`_new_buffer`), then the
    /// compiled `single_param_adam`'s buffers.
    fn step_torchao<S: Device>(
        &mut self,
        d: &mut Tensors<S>,
        i: usize,
        lb: LowBit,
    ) -> Result<(), EngineError> {
        let p = self.params[i];
        let shape = d.shape(p).to_vec();
        let numel: usize = shape.iter().product();
        // "follow bitsandbytes, only quantize tensors >= 4096 values"
        let quantized = numel >= MIN_8BIT_SIZE && numel.is_multiple_of(lb.block);
        let blocks = numel / lb.block;
        if self.state[i].is_empty() {
            let made = |d: &mut Tensors<S>, shape: &[usize], dtype| {
                let s = d.empty_beside(p, shape, dtype, Category::OptimizerState)?;
                d.fill(s, Fill::Zeros)?;
                Ok::<_, EngineError>(s)
            };
            for _signed in [true, false] {
                if quantized {
                    let codes = if lb.bits == 8 {
                        shape.clone()
                    } else {
                        vec![numel / 2]
                    };
                    let c = made(d, &codes, DType::U8)?;
                    let sc = made(d, &[blocks], DType::F32)?;
                    // the map: `torch.tensor(list, device=...)`, kept by the state
                    let q = made(d, &[lb.qmap], DType::F32)?;
                    self.state[i].extend([c, sc, q]);
                } else {
                    let z = made(d, &shape, d.dtype(p))?;
                    self.state[i].push(z);
                }
            }
        }
        self.steps[i] += 1;
        if !self.traced {
            // `FakeTensorMode`'s `init_gpu_context`: `torch.empty(1, device=...)`, dropped
            self.traced = true;
            let t = d.empty_beside(p, &[1], DType::F32, Category::Temporary)?;
            d.release(t);
        }
        if !quantized {
            return Ok(());
        }
        // the compiled update's buffers, per state (exp_avg, exp_avg_sq): the new scales, then
        // the float32 states, then (4 bits) the int64 codes of the binary search
        let mut wanted = vec![
            (blocks, DType::F32),
            (blocks, DType::F32),
            (numel, DType::F32),
            (numel, DType::F32),
        ];
        if lb.bits == 4 {
            wanted.extend([(numel, DType::I64); 2]);
        }
        let mut bufs = Vec::with_capacity(wanted.len());
        let mut made = Ok(());
        for (n, dtype) in wanted {
            match d.empty_beside(p, &[n], dtype, Category::Temporary) {
                Ok(t) => bufs.push(t),
                Err(e) => {
                    made = Err(e);
                    break;
                }
            }
        }
        // the first call of this graph, inductor's cache warm: over enough blocks it times its
        // kernels, filling an L2-sized buffer before each timing
        let dtype = d.dtype(p);
        let whole_rows = shape.last().is_some_and(|l| l % lb.block == 0);
        if made.is_ok() && !self.compiled.iter().any(|g| g.0 == shape && g.1 == dtype) {
            self.compiled.push((shape, dtype));
            if blocks > BENCH_MIN_BLOCKS {
                for _ in 0..BENCH_TIMINGS {
                    match d.empty_beside(p, &[L2_FLUSH_BYTES], DType::U8, Category::Workspace) {
                        Ok(t) => d.release(t),
                        Err(e) => {
                            made = Err(e);
                            break;
                        }
                    }
                }
            }
        }
        if let Err(e) = made {
            for t in bufs {
                d.release(t);
            }
            return Err(e);
        }
        // the order inductor's code drops them in: 8 bits, the float32 states then the scales;
        // 4 bits, per state float32, codes and scale when the last dimension is a whole number
        // of blocks, else both scales first
        let order: &[usize] = match (lb.bits, whole_rows) {
            (8, _) => &[2, 3, 0, 1],
            (_, true) => &[2, 4, 0, 3, 5, 1],
            (_, false) => &[0, 1, 2, 4, 3, 5],
        };
        for &k in order {
            d.release(bufs[k]);
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
