//! DeepSpeed ZeRO stage 3 at world size 1, as DeepSpeed 0.19.6's
//! `DeepSpeedZeroOptimizer_Stage3` allocates for a model built normally and handed to
//! `deepspeed.initialize` (partitioned after the fact, not under `zero.Init`), with FusedAdam;
//! read from its source (fixtures/zero/ZERO3.md) and its recorded runs (fixtures/zero).
//! Above world size 1 each submodule's parameters are all-gathered before use; that is not
//! modelled (refused by name where the workload is read).
//!
//! - **Initialization** ([`Tensors::zero3_init`]): FusedAdam's overflow flag; per parameter
//!   its partition (`ds_tensor`, the whole parameter at world size 1) made and the parameter's
//!   own storage freed; the overflow tracker (a bool) and the first barrier's byte, kept;
//!   `defragment`: every partition freed, the cache emptied, one buffer of all of them
//!   (`lp_param_buffer`) made and each parameter a view of it; the float32 master (a clone of
//!   that buffer; in bf16 its float32 copy, then the clone); `initialize_optimizer_states`'
//!   float32 zero gradient, dropped; the reduction bucket (`reduce_bucket_size` elements of
//!   the parameters' dtype) and `grad_partitions_flat_buffer` (every partition's gradient),
//!   both kept; then each parameter gathered once while its gradient hook is set up (a copy,
//!   dropped).
//! - **Forward**: at world size 1 a submodule's fetch makes its parameters views of their
//!   partitions: nothing allocated. `F.linear` is DeepSpeed's `LinearFunctionForZeroStage3`:
//!   its backward makes the input's gradient before the weight's
//!   ([`super::autograd`]).
//! - **Backward**: each gradient, as it is final, copied into the bucket at its place (the
//!   autograd gradient goes, `param.grad` a view of the bucket); a bucket that would overflow
//!   is reduced first, and the rest once backward returns: the bucket's gradients
//!   concatenated into a new buffer on the reduce stream (more than one gradient), averaged
//!   and reduce-scattered in place, copied into their partitions' gradients, then the buffer
//!   freed.
//! - **Step** ([`Tensors::zero3_step`]): the gradient norm (each gradient's float64 copy,
//!   one at a time), `_global_grad_norm` (a float64 scalar kept to the next step), the
//!   partitions' gradients flattened (in bf16 then copied to float32), FusedAdam's two states
//!   at the first step, the update copied into the parameters' buffer, the float32 gradient
//!   freed.

use super::dtype::DType;
use super::graph::Zero;
use super::op::Fill;
use super::tensor::{Category, EngineError, TensorId, Tensors};
use super::zero::ZeroConfig;
use crate::backend::Device;

/// The stream DeepSpeed's ZeRO-3 reduces gradients on (`overlap_comm`, on for stage 3).
const REDUCE_STREAM: crate::alloc::StreamId = 1;

impl<S: Device> Tensors<S> {
    /// `deepspeed.initialize` with ZeRO stage 3 at world size 1 over `params` (trainable, in
    /// group order, one dtype); `overflow_buf` is FusedAdam's flag, made already.
    pub(crate) fn zero3_init(
        &mut self,
        params: Vec<TensorId>,
        cfg: ZeroConfig,
        overflow_buf: Option<TensorId>,
    ) -> Result<(), EngineError> {
        if cfg.world != 1 || cfg.offload {
            return Err(EngineError::Invalid(format!(
                "zero_init: stage 3 {} is not modelled yet (world size 1 without offload is)",
                if cfg.offload {
                    "with offload".to_string()
                } else {
                    format!("at world size {}", cfg.world)
                }
            )));
        }
        let dtype = self.dtype(params[0]);
        let (numel, offset, total) = self.zero_flat_layout(&params);
        // `Init(module=...)`: per parameter its partition, then `free_param` drops the
        // parameter's own storage
        for (k, &p) in params.iter().enumerate() {
            let ds = self.empty(&[numel[k] as usize], dtype, Category::Parameter)?;
            self.repoint(p, ds, 0);
            self.release(ds);
        }
        let mut held = Vec::new();
        // `inf_or_nan_tracker`, then the first `dist.barrier()`'s byte (kept by c10d)
        for _ in 0..2 {
            let t = self.empty(&[1], DType::Bool, Category::OptimizerState)?;
            held.push(t);
        }
        self.zero3_barrier_scratch()?;
        // `defragment`: the partitions copied to the host and freed, the cache emptied, one
        // buffer of them all on the device
        for &p in &params {
            self.storage_drop(p);
        }
        self.alloc.empty_cache();
        let lp = self.empty(&[total as usize], dtype, Category::Parameter)?;
        for (k, &p) in params.iter().enumerate() {
            self.repoint(p, lp, offset[k] as usize);
        }
        self.release(lp);
        // `_create_fp32_partitions`: the float32 master, a clone (in bf16 of its float32 copy)
        let n = total as usize;
        let master = if dtype == DType::F32 {
            self.empty(&[n], DType::F32, Category::OptimizerState)?
        } else {
            let f = self.empty(&[n], DType::F32, Category::Temporary)?;
            let m = self.empty(&[n], DType::F32, Category::OptimizerState);
            self.release(f);
            m?
        };
        self.zero3_barrier()?;
        // `initialize_optimizer_states`: a zero float32 gradient of the sub-group, dropped
        let g = self.empty(&[n], DType::F32, Category::Temporary)?;
        self.fill(g, Fill::Zeros)?;
        self.release(g);
        self.zero3_barrier()?;
        // the reduction bucket and every partition's gradient, kept
        let bucket = self.empty(&[cfg.bucket_elems as usize], dtype, Category::Gradient)?;
        let grads = self.empty(&[n], dtype, Category::Gradient)?;
        self.fill(grads, Fill::Zeros)?;
        // `create_reduce_and_remove_grad_hooks`: each parameter gathered (a copy) and
        // partitioned again
        for &k in &numel {
            let t = self.empty(&[k as usize], dtype, Category::Temporary)?;
            self.release(t);
        }
        if let Some(b) = overflow_buf {
            held.push(b);
        }
        let in_part = vec![true; params.len()];
        self.zero = Some(Box::new(Zero {
            stage: 3,
            world: 1,
            bucket_elems: cfg.bucket_elems,
            overlap: true,
            params,
            numel,
            offset,
            in_part,
            part: total,
            dtype,
            master,
            buckets: vec![bucket],
            fill: 0,
            pending: Vec::new(),
            grads: Some(grads),
            grads_fill: 0,
            state: Vec::new(),
            offload: None,
            overflow_buf: None,
            global_norm: None,
            held,
        }));
        Ok(())
    }

    /// A later `dist.barrier()`: a byte and a 4-byte tensor, each dropped.
    fn zero3_barrier(&mut self) -> Result<(), EngineError> {
        let t = self.empty(&[1], DType::Bool, Category::Temporary)?;
        self.release(t);
        self.zero3_barrier_scratch()
    }

    fn zero3_barrier_scratch(&mut self) -> Result<(), EngineError> {
        let t = self.empty(&[1], DType::I32, Category::Temporary)?;
        self.release(t);
        Ok(())
    }

    /// Parameter `k`'s gradient is final: copied into the bucket (reduced first when it
    /// would overflow), `param.grad` a view of it.
    pub(crate) fn zero3_grad_ready(&mut self, k: usize) -> Result<(), EngineError> {
        let z = self.zero.as_ref().expect("under ZeRO");
        let (n, fill, cap) = (z.numel[k], z.fill, z.bucket_elems);
        if fill > 0 && fill + n > cap {
            self.zero3_reduce()?;
        }
        let z = self.zero.as_mut().expect("under ZeRO");
        let (p, bucket, at) = (z.params[k], z.buckets[0], z.fill as usize);
        z.fill += n;
        z.pending.push(k);
        self.zero_regrad(p, bucket, at)
    }

    /// `__reduce_and_partition_ipg_grads`: the bucket's gradients concatenated on the reduce
    /// stream (when there are several), reduced in place, copied into their partitions'
    /// gradients, `param.grad = None`; the concatenation goes.
    pub(crate) fn zero3_reduce(&mut self) -> Result<(), EngineError> {
        let z = self.zero.as_ref().expect("under ZeRO");
        if z.pending.is_empty() {
            return Ok(());
        }
        let (fill, dtype, pending) = (z.fill as usize, z.dtype, z.pending.clone());
        let cat = if pending.len() > 1 {
            let was = std::mem::replace(&mut self.stream, REDUCE_STREAM);
            let t = self.empty(&[fill], dtype, Category::Temporary);
            self.stream = was;
            Some(t?)
        } else {
            None
        };
        for k in pending {
            let p = self.zero.as_ref().expect("under ZeRO").params[k];
            if let Some(g) = self.info_mut(p).grad.take() {
                self.release(g);
            }
        }
        if let Some(t) = cat {
            self.release(t);
        }
        let z = self.zero.as_mut().expect("under ZeRO");
        z.pending.clear();
        z.fill = 0;
        Ok(())
    }

    /// The stage-3 optimizer's `step()` (FusedAdam over the float32 master).
    pub(crate) fn zero3_step(&mut self) -> Result<(), EngineError> {
        let z = self.zero.as_ref().expect("under ZeRO");
        let (n, dtype, sizes) = (z.part as usize, z.dtype, z.numel.clone());
        // `_get_norm_groups` (each gradient's float64 copy, one at a time), then
        // `self._global_grad_norm = scaled_global_grad_norm / self.loss_scale` (float64)
        self.zero_norm(&sizes, DType::F64)?;
        // `_prepare_fp32_grad_for_sub_group`: the gradients flattened, in float32
        let single = self.zero_flat_f32(n, dtype)?;
        // FusedAdam's states at the first step; `_release_sub_group`: the gradient goes
        self.zero_adam_states(n)?;
        self.release(single);
        Ok(())
    }
}
