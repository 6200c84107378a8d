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
//! - **Optimizer offload** (`offload_optimizer.device = "cpu"`, DeepSpeedCPUAdam): the
//!   optimizer's device is the host, so the overflow tracker, the float32 master, its pinned
//!   gradient and the (pinned) gradient partitions are made there and the device keeps the
//!   parameters' buffer and the bucket. Each reduced gradient is copied to its pinned
//!   partition and back to the device, where its float64 norm is taken and kept to the step
//!   (one scalar per parameter, on the reduce stream); in bf16 a float32 copy goes to the
//!   master's gradient. The step sums the kept norms in a few device scalars, runs Adam on
//!   the host (its state there) and copies the update into the parameters' buffer with no
//!   device temporary; no norm stays on the device.

use super::dtype::DType;
use super::graph::{Zero, ZeroOffload};
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
        if cfg.world != 1 {
            return Err(EngineError::Invalid(format!(
                "zero_init: stage 3 at world size {} is not modelled yet (world size 1 is)",
                cfg.world
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
        // `inf_or_nan_tracker` (on the host when the optimizer is offloaded), then the first
        // `dist.barrier()`'s byte (kept by c10d)
        let mut off = cfg.offload.then(ZeroOffload::default);
        if let Some(o) = off.as_mut() {
            o.host
                .push(self.host_empty(&[1], DType::Bool, Category::OptimizerState)?);
        } else {
            held.push(self.empty(&[1], DType::Bool, Category::OptimizerState)?);
        }
        held.push(self.empty(&[1], DType::Bool, Category::OptimizerState)?);
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
        // `_create_fp32_partitions`: the float32 master, a clone (in bf16 of its float32 copy);
        // offloaded, `.to("cpu", float32)` then the clone, both on the host (a blocking copy
        // that converts does so on the host: bf16 there first)
        let n = total as usize;
        let master = if off.is_some() {
            let staged = (dtype != DType::F32)
                .then(|| self.host_empty(&[n], dtype, Category::Temporary))
                .transpose()?;
            let converted = self.host_empty(&[n], DType::F32, Category::Temporary)?;
            if let Some(t) = staged {
                self.release(t);
            }
            let m = self.host_empty(&[n], DType::F32, Category::OptimizerState);
            self.release(converted);
            m?
        } else if dtype == DType::F32 {
            self.empty(&[n], DType::F32, Category::OptimizerState)?
        } else {
            let f = self.empty(&[n], DType::F32, Category::Temporary)?;
            let m = self.empty(&[n], DType::F32, Category::OptimizerState);
            self.release(f);
            m?
        };
        self.zero3_barrier()?;
        // `initialize_optimizer_states`: a zero float32 gradient of the sub-group, dropped;
        // offloaded, on the host, with the master's gradient made there (zeros, pinned, kept)
        if let Some(o) = off.as_mut() {
            let g = self.host_empty(&[n], DType::F32, Category::Temporary)?;
            o.host.push(self.pinned(n, DType::F32, Category::Gradient)?);
            self.release(g);
        } else {
            let g = self.empty(&[n], DType::F32, Category::Temporary)?;
            self.fill(g, Fill::Zeros)?;
            self.release(g);
        }
        self.zero3_barrier()?;
        // the reduction bucket and every partition's gradient, kept (offloaded: the
        // gradients in pinned host memory)
        let bucket = self.empty(&[cfg.bucket_elems as usize], dtype, Category::Gradient)?;
        let grads = if let Some(o) = off.as_mut() {
            o.host.push(self.pinned(n, dtype, Category::Gradient)?);
            None
        } else {
            let g = self.empty(&[n], dtype, Category::Gradient)?;
            self.fill(g, Fill::Zeros)?;
            Some(g)
        };
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
            grads,
            grads_fill: 0,
            state: Vec::new(),
            offload: off,
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
        if self.zero.as_ref().is_some_and(|z| z.offload.is_some()) {
            let was = std::mem::replace(&mut self.stream, REDUCE_STREAM);
            let r = self.zero3_offload_grads(pending);
            self.stream = was;
            r?;
        } else {
            for k in pending {
                let p = self.zero.as_ref().expect("under ZeRO").params[k];
                if let Some(g) = self.info_mut(p).grad.take() {
                    self.release(g);
                }
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

    /// `partition_grads` with the optimizer offloaded, on the reduce stream, for the
    /// bucket's parameters in `ds_id` order: each reduced gradient copied into its pinned
    /// host partition and back to the device (`grad_buffer.to(device)`, dropped when the next
    /// parameter's buffer replaces it, the last on return), its norm taken there and kept to
    /// the step (`_constant_buffered_norm2`), its float32 form (a temporary in bf16) copied
    /// into the master's pinned gradient, then `param.grad = None`.
    fn zero3_offload_grads(&mut self, mut pending: Vec<usize>) -> Result<(), EngineError> {
        pending.sort_unstable();
        let mut on_device: Option<TensorId> = None;
        for k in pending {
            let z = self.zero.as_ref().expect("under ZeRO");
            let (p, n, dtype) = (z.params[k], z.numel[k] as usize, z.dtype);
            if let Some(t) = on_device.take() {
                self.release(t);
            }
            on_device = Some(self.empty(&[n], dtype, Category::Gradient)?);
            let norm = self.zero3_buffered_norm(n)?;
            self.zero_offload_mut().norms.push(norm);
            if dtype != DType::F32 {
                let f = self.empty(&[n], DType::F32, Category::Temporary)?;
                self.release(f);
            }
            if let Some(g) = self.info_mut(p).grad.take() {
                self.release(g);
            }
        }
        if let Some(t) = on_device {
            self.release(t);
        }
        Ok(())
    }

    /// `_constant_buffered_norm2` of `n` elements: per chunk of 2.5e8 a float64 copy, its
    /// `norm(2)` and that squared (added in place after the first), then the square root,
    /// returned (the running sum goes on return).
    fn zero3_buffered_norm(&mut self, n: usize) -> Result<TensorId, EngineError> {
        const CHUNK: usize = 250_000_000;
        let mut sum: Option<TensorId> = None;
        let mut left = n;
        loop {
            let c = left.min(CHUNK);
            let d = self.empty(&[c], DType::F64, Category::Temporary)?;
            let norm = self.empty(&[], DType::F64, Category::Temporary);
            self.release(d);
            let norm = norm?;
            let sq = self.empty(&[], DType::F64, Category::Temporary);
            self.release(norm);
            let sq = sq?;
            match sum {
                None => sum = Some(sq),
                // `norm += ...`: in place, the squared chunk goes
                Some(_) => self.release(sq),
            }
            left -= c;
            if left == 0 {
                break;
            }
        }
        let root = self.empty(&[], DType::F64, Category::OptimizerState);
        if let Some(t) = sum {
            self.release(t);
        }
        root
    }

    /// `step()` with the optimizer offloaded (`complete_grad_norm_calculation_for_cpu_offload`,
    /// DeepSpeedCPUAdam on the host): the kept norms squared and summed (the first square
    /// added to 0.0 makes the sum), the sum as a float32 device tensor all-reduced, its
    /// square root, `mask_nan_or_inf_with_val_inplace`'s three flags and its -1.0, the norm
    /// taken to the host (no norm kept on the device); Adam's two states on the host at the
    /// first step; the update copied from the host into the parameters' buffer (no device
    /// temporary); `_post_step` drops the kept norms.
    fn zero3_step_offload(&mut self) -> Result<(), EngineError> {
        let kept = self.zero_offload_mut().norms.len();
        let mut total: Option<TensorId> = None;
        for _ in 0..kept {
            let sq = self.empty(&[], DType::F64, Category::Temporary)?;
            if total.is_none() {
                total = Some(self.empty(&[], DType::F64, Category::Temporary)?);
            }
            self.release(sq);
        }
        let cuda = self.empty(&[1], DType::F32, Category::Temporary)?;
        let root = self.empty(&[], DType::F32, Category::Temporary)?;
        if let Some(t) = total {
            self.release(t);
        }
        let mut flags = Vec::new();
        for _ in 0..3 {
            flags.push(self.empty(&[], DType::Bool, Category::Temporary)?);
        }
        flags.push(self.empty(&[], DType::F32, Category::Temporary)?);
        self.release_all(flags);
        self.release(root);
        self.release(cuda);
        self.zero_cpu_adam_step()
    }

    /// The stage-3 optimizer's `step()` (FusedAdam over the float32 master).
    pub(crate) fn zero3_step(&mut self) -> Result<(), EngineError> {
        if self.zero.as_ref().is_some_and(|z| z.offload.is_some()) {
            return self.zero3_step_offload();
        }
        let z = self.zero.as_ref().expect("under ZeRO");
        let (n, dtype, sizes) = (z.part as usize, z.dtype, z.numel.clone());
        // `_get_norm_groups` (each gradient's float64 copy, one at a time), then
        // `self._global_grad_norm = scaled_global_grad_norm / self.loss_scale` (float64)
        let held = self.zero_norm(&sizes, DType::F64, true)?;
        // `_prepare_fp32_grad_for_sub_group`: the gradients flattened, in float32
        let single = self.zero_flat_f32(n, dtype)?;
        // FusedAdam's states at the first step; `_release_sub_group`: the gradient goes
        self.zero_adam_states(n)?;
        self.release(single);
        self.release_all(held);
        Ok(())
    }
}
