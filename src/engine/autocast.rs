//! Autocast (`torch.autocast`), for memory: which ops run in the low-precision dtype, which are
//! forced to float32, and the cast cache.
//!
//! Inside an autocast region, matrix products (`matmul`, `linear`, attention) cast their
//! floating inputs to the region's dtype; `softmax`, `log_softmax`, `layer_norm` and the losses
//! cast theirs to float32; everything else runs in its inputs' dtype. A cast is a new tensor
//! (recorded in the graph; it keeps nothing itself, but the op that consumes it may save it).
//! Casts of float32 leaf tensors that require grad (the parameters) to the low dtype are cached
//! for the whole region, as PyTorch's autocast cache does, so each weight is cast once per
//! forward (under `no_grad` too); the cache is emptied when the outermost region ends.

use super::dtype::DType;
pub use super::op::CastPolicy;
use super::op::Op;
use super::tensor::{EngineError, TensorId, Tensors};
use crate::backend::Device;

impl<S: Device> Tensors<S> {
    /// Enters an autocast region with `dtype` (bf16 or f16).
    pub fn autocast_enter(&mut self, dtype: DType) -> Option<DType> {
        let prev = self.autocast.dtype.replace(dtype);
        self.autocast.depth += 1;
        prev
    }

    /// Leaves a region, restoring `prev`; the outermost exit empties the cast cache.
    pub fn autocast_exit(&mut self, prev: Option<DType>) {
        self.autocast.dtype = prev;
        self.autocast.depth = self.autocast.depth.saturating_sub(1);
        if self.autocast.depth == 0 {
            let cached: Vec<TensorId> = std::mem::take(&mut self.autocast.cache)
                .into_values()
                .collect();
            for c in cached {
                self.release(c);
            }
        }
    }

    /// A handle on `t` in `dtype`: itself, a cached cast, or a new recorded cast.
    fn cast(&mut self, t: TensorId, dtype: DType) -> Result<TensorId, EngineError> {
        if self.dtype(t) == dtype || !self.dtype(t).is_floating() {
            return Ok(self.retain(t));
        }
        // PyTorch's rule (autocast_mode.h, cached_cast): a float32 leaf that requires grad, cast
        // to the low-precision dtype. Grad mode plays no part: under `no_grad` the weights'
        // copies are cached (and held) for the region just the same.
        let cacheable = self.dtype(t) == DType::F32
            && dtype != DType::F32
            && self.is_leaf(t)
            && self.info(t).requires_grad;
        if cacheable {
            if let Some(&c) = self.autocast.cache.get(&t) {
                return Ok(self.retain(c));
            }
        }
        let c = self.empty_preserving(t, dtype)?;
        self.launch(&Op::Cast, &[t], &[c])?;
        self.record(&Op::Cast, &[t], &[c], &[]);
        if cacheable {
            self.autocast.cache.insert(t, c);
            return Ok(self.retain(c));
        }
        Ok(c)
    }

    /// Runs `op` on `inputs` cast as the autocast region requires (unchanged outside one).
    pub fn autocast_op(
        &mut self,
        policy: CastPolicy,
        inputs: &[TensorId],
        op: impl FnOnce(&mut Self, &[TensorId]) -> Result<TensorId, EngineError>,
    ) -> Result<TensorId, EngineError> {
        self.autocast_op_in(policy, inputs, None, op)
    }

    /// [`Self::autocast_op`] for an op that holds its inputs in another order than its call
    /// takes them: `order` lists the held inputs' indices in the order PyTorch casts them
    /// (`torch.addmm(input, mat1, mat2)`, held as [mat1, mat2, input], casts mat2, mat1, input).
    pub fn autocast_op_in(
        &mut self,
        policy: CastPolicy,
        inputs: &[TensorId],
        order: Option<&[usize]>,
        op: impl FnOnce(&mut Self, &[TensorId]) -> Result<TensorId, EngineError>,
    ) -> Result<TensorId, EngineError> {
        let Some(region) = self.autocast.dtype else {
            return op(self, inputs);
        };
        let to = match policy {
            CastPolicy::Lower => region,
            CastPolicy::Float32 => DType::F32,
        };
        // PyTorch's autocast wrappers cast the arguments in one call expression, which GCC
        // evaluates right to left: `linear(x, w, b)` casts b, then w, then x (the traces show
        // it). The casts die in reverse order of their making: x's first.
        let reversed: smallvec::SmallVec<[usize; 4]> = (0..inputs.len()).rev().collect();
        let order = order.unwrap_or(&reversed);
        // (index held, cast), in the order of making
        let mut made: smallvec::SmallVec<[(usize, TensorId); 4]> = smallvec::SmallVec::new();
        for &k in order {
            match self.cast(inputs[k], to) {
                Ok(c) => made.push((k, c)),
                Err(e) => {
                    for (_, c) in made.into_iter().rev() {
                        self.release(c);
                    }
                    return Err(e);
                }
            }
        }
        let mut cast: smallvec::SmallVec<[TensorId; 4]> = inputs.into();
        for &(k, c) in &made {
            cast[k] = c;
        }
        let r = op(self, &cast);
        for (_, c) in made.into_iter().rev() {
            self.release(c);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocConf, SimAllocator, SimSource};
    use crate::engine::tensor::Category;
    use crate::units::GIB;

    #[test]
    fn weights_are_cast_once_per_region_and_freed_after() {
        let mut d = Tensors::new(SimAllocator::new(
            AllocConf::default(),
            SimSource::new(24 * GIB, 0),
        ));
        let w = d
            .factory(&[1024, 1024], DType::F32, true, Category::Parameter)
            .unwrap();
        let x = d
            .factory(&[64, 1024], DType::F32, false, Category::Input)
            .unwrap();
        let base = d.alloc.stats().allocated_bytes.all().current;
        let prev = d.autocast_enter(DType::BF16);
        let y1 = d
            .autocast_op(CastPolicy::Lower, &[x, w], |d, i| {
                d.linear(i[0], i[1], None)
            })
            .unwrap();
        assert_eq!(d.dtype(y1), DType::BF16);
        let after_one = d.alloc.stats().allocated_bytes.all().current;
        let y2 = d
            .autocast_op(CastPolicy::Lower, &[x, w], |d, i| {
                d.linear(i[0], i[1], None)
            })
            .unwrap();
        let after_two = d.alloc.stats().allocated_bytes.all().current;
        // the second product casts x again but reuses w's bf16 copy
        let x_bf16 = 64 * 1024 * 2;
        assert_eq!(after_two - after_one, x_bf16 + 64 * 1024 * 2);
        let s = d
            .autocast_op(CastPolicy::Float32, &[y1], |d, i| d.softmax(false, i[0], 1))
            .unwrap();
        assert_eq!(
            d.dtype(s),
            DType::F32,
            "softmax runs in float32 under autocast"
        );
        for t in [y1, y2, s] {
            d.release(t);
        }
        d.autocast_exit(prev);
        assert_eq!(d.saved_tensors(), 0);
        assert_eq!(
            d.alloc.stats().allocated_bytes.all().current - base,
            32 << 20,
            "only the cuBLAS workspace remains (bias-free products take no cuBLASLt one)"
        );
    }
}
