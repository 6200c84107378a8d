//! DeepSpeed ZeRO stages 1 and 2 on one rank, as DeepSpeed 0.19.6's `DeepSpeedZeroOptimizer`
//! (`deepspeed/runtime/zero/stage_1_and_2.py`) allocates, read from its source and checked
//! against four recordings at world size 1 (fixtures/zero: every recorded field to the byte).
//! Every rank holds the same except where padding falls; rank 0 is modelled.
//!
//! - **Initialization** ([`Tensors::zero_init`]): FusedAdam's overflow flag (an int32, made
//!   with the optimizer before ZeRO wraps it; none with DeepSpeedCPUAdam); the trainable
//!   parameters, in group order, flattened into one buffer of the parameters' dtype padded to a multiple of
//!   2 x world size (`flatten_dense_tensors_aligned`: the padding's zeros, the flat copy, then
//!   the padding gone); each parameter becomes a view of it and its own storage goes. The
//!   rank's partition (a 1/world-size slice) is cloned into a float32 master copy (in bf16, the
//!   clone first, then its float32 copy); `initialize_optimizer_states` makes a float32
//!   zero gradient of the partition and drops it. No optimizer state yet.
//! - **Backward**: the first gradient's hook allocates the reduction bucket,
//!   `reduce_bucket_size` elements of the parameters' dtype whatever the model's size (two
//!   with `overlap_comm`). Stage 2: each gradient, as it is final, is copied into the bucket
//!   (the autograd gradient goes); a full bucket is reduced first: averaged in place, its
//!   slices flattened into a temporary when they belong to several ranks (`torch.cat`),
//!   all-reduced, then the gradients of rank 0's partition copied into `grads_in_partition`
//!   (made at the first reduction: the partition's parameters in full), the others dropped.
//!   Stage 1 keeps the full gradients through backward and does the same walk, in parameter
//!   order, once backward returns. The last bucket is reduced and the bucket freed at the end.
//! - **Step** ([`Tensors::zero_step`]): the gradient norm (each partition gradient copied to
//!   float64 and dropped), `scaled_global_grad_norm` (a scalar alive to the step's end, with
//!   stage 3's `norm_groups`), `_global_grad_norm` (a float32 scalar kept to the next step; the
//!   engine holds the previous one until the optimizer's `step()` returns), the
//!   partition's gradients flattened into one tensor (and copied to float32 when they are not), `grads_in_partition` dropped, DeepSpeed's FusedAdam (its
//!   `exp_avg` and `exp_avg_sq` over the partition at the first step, no temporaries), the
//!   float32 gradient dropped; the update is copied back and all-gathered in place.
//! - **Optimizer offload** (`offload_optimizer.device = "cpu"`, [`ZeroConfig::offload`]): the
//!   master partition is made on the host (a device clone of the slice, converted on the
//!   host, pinned), with a pinned bit16 copy-back buffer, a pinned and a device staging
//!   buffer of the largest parameter, and the master's pinned float32 gradient, all kept. In
//!   backward the bucket is the same, but `grads_in_partition` is never made: each reduced
//!   gradient in the partition gets a float64 copy for its norm (the norm kept to the step),
//!   the inf/nan check over the whole gradient, and its float32 slice copied to the host;
//!   then it goes. The step runs DeepSpeedCPUAdam on the host (its state in pageable host
//!   memory) and copies the update into the flat parameters without a device temporary.
//!   Host bytes count in [`Tensors::host_memory`].

use super::dtype::DType;
use super::graph::{Zero, ZeroOffload};
use super::layout::Layout;
use super::op::Fill;
use super::tensor::{Category, EngineError, TensorId, Tensors};
use crate::backend::Device;

/// DeepSpeed's `nccl_start_alignment_factor`: the flat buffer is padded to this many ranks'
/// multiples.
const ALIGNMENT_FACTOR: u64 = 2;

/// What `zero_init` is given.
#[derive(Debug, Clone, Copy)]
pub struct ZeroConfig {
    /// 1, 2 or 3 (3: world size 1 only).
    pub stage: u8,
    pub world: u64,
    pub bucket_elems: u64,
    pub overlap: bool,
    /// `offload_optimizer.device = "cpu"` (pinned): DeepSpeedCPUAdam steps on the host.
    pub offload: bool,
}

impl<S: Device> Tensors<S> {
    /// `deepspeed.initialize` with ZeRO stage 1 or 2 over `params` (in group order).
    pub fn zero_init(&mut self, params: &[TensorId], cfg: ZeroConfig) -> Result<(), EngineError> {
        if self.zero.is_some() {
            return Err(EngineError::Invalid(
                "zero_init: the model is already under ZeRO".into(),
            ));
        }
        if !(1..=3).contains(&cfg.stage) || cfg.world == 0 || cfg.bucket_elems == 0 {
            return Err(EngineError::Invalid(format!(
                "zero_init: stage {} at world size {} with buckets of {} elements is not modelled (stages 1 to 3, world size and buckets at least 1)",
                cfg.stage, cfg.world, cfg.bucket_elems
            )));
        }
        let params: Vec<TensorId> = params
            .iter()
            .copied()
            .filter(|&p| self.info(p).requires_grad)
            .collect();
        let Some(&first) = params.first() else {
            return Err(EngineError::Invalid(
                "zero_init: no parameter requires grad".into(),
            ));
        };
        let dtype = self.dtype(first);
        if params.iter().any(|&p| self.dtype(p) != dtype) {
            return Err(EngineError::Invalid(
                "zero_init: parameters of several dtypes (one flat group per dtype) are not modelled".into(),
            ));
        }
        // `_configure_basic_optimizer` runs before ZeRO's: FusedAdam's overflow flag
        let overflow_buf = if cfg.offload {
            None
        } else {
            let b = self.empty(&[1], DType::I32, Category::OptimizerState)?;
            self.fill(b, Fill::Zeros)?;
            Some(b)
        };
        if cfg.stage == 3 {
            return self.zero3_init(params, cfg, overflow_buf);
        }
        let (numel, offset, total) = self.zero_flat_layout(&params);
        let align = ALIGNMENT_FACTOR * cfg.world;
        let padded = total.div_ceil(align) * align;
        // `align_dense_tensors`: a zeros tensor for the padding, then the flat copy
        let pad = if padded > total {
            let z = self.empty(&[(padded - total) as usize], dtype, Category::Temporary)?;
            self.fill(z, Fill::Zeros)?;
            Some(z)
        } else {
            None
        };
        let flat = self.empty(&[padded as usize], dtype, Category::Parameter);
        if let Some(z) = pad {
            self.release(z);
        }
        let flat = flat?;
        // `_update_model_bit16_weights`: each parameter a view of the flat buffer
        for (k, &p) in params.iter().enumerate() {
            self.repoint(p, flat, offset[k] as usize);
        }
        // (the views hold the flat storage from here)
        self.release(flat);
        let part = padded / cfg.world;
        let in_part = (0..params.len())
            .map(|k| offset[k] < part && numel[k] > 0)
            .collect();
        let (master, offload) = if cfg.offload {
            let largest = numel.iter().copied().max().unwrap_or(0);
            let (m, off) = self.zero_offload_init(dtype, part, largest)?;
            (m, Some(off))
        } else {
            (self.zero_master(dtype, part)?, None)
        };
        self.zero = Some(Box::new(Zero {
            stage: cfg.stage,
            world: cfg.world,
            bucket_elems: cfg.bucket_elems,
            overlap: cfg.overlap,
            params,
            numel,
            offset,
            in_part,
            part,
            dtype,
            master,
            buckets: Vec::new(),
            fill: 0,
            pending: Vec::new(),
            grads: None,
            grads_fill: 0,
            state: Vec::new(),
            offload,
            overflow_buf,
            global_norm: None,
            held: Vec::new(),
        }));
        Ok(())
    }

    /// The float32 master partition on the device (`.clone().float()` of the rank's slice),
    /// then `initialize_optimizer_states`' zero float32 gradient of it, dropped.
    fn zero_master(&mut self, dtype: DType, part: u64) -> Result<TensorId, EngineError> {
        let p = part as usize;
        let master = if dtype == DType::F32 {
            self.empty(&[p], DType::F32, Category::OptimizerState)?
        } else {
            let c = self.empty(&[p], dtype, Category::Temporary)?;
            let m = self.empty(&[p], DType::F32, Category::OptimizerState);
            self.release(c);
            m?
        };
        let g = self.empty(&[p], DType::F32, Category::Temporary)?;
        self.release(g);
        Ok(master)
    }

    /// The master partition and the buffers with the optimizer offloaded (`cpu_offload`,
    /// stage_1_and_2.py's `__init__`): the rank's slice cloned on the device and converted to
    /// float32 on the host (`.clone().to("cpu", float32)`: the device clone goes once the copy
    /// is made, no float32 copy on the device), pinned; a pinned bit16 buffer of the partition
    /// for the copy-back; then a pinned and a device buffer of the `largest` parameter's
    /// elements (`temp_grad_buffer_for_cpu_offload`, `temp_grad_buffer_for_gpu_offload`, both
    /// kept); `initialize_optimizer_states` pins a float32 gradient of the partition and keeps
    /// it.
    fn zero_offload_init(
        &mut self,
        dtype: DType,
        part: u64,
        largest: u64,
    ) -> Result<(TensorId, ZeroOffload), EngineError> {
        let p = part as usize;
        let mut off = ZeroOffload::default();
        // `partition.detach().clone().to(device="cpu", dtype=float32)`: the conversion on the
        // host (a bit16 copy, then float32), then `pin_memory()` copies it into pinned memory
        let clone = self.empty(&[p], dtype, Category::Temporary)?;
        let staged = self.host_empty(&[p], dtype, Category::Temporary)?;
        let pageable = self.host_empty(&[p], DType::F32, Category::OptimizerState)?;
        self.release(staged);
        self.release(clone);
        let master = self.host_empty(&[p], DType::F32, Category::OptimizerState)?;
        self.release(pageable);
        // `torch.full(..., device="cpu").pin_memory()`: the bit16 copy-back buffer
        off.host
            .push(self.pinned(p, dtype, Category::OptimizerState)?);
        // after the groups: the largest parameter's staging buffers, host (pinned) and device
        off.host
            .push(self.pinned(largest as usize, dtype, Category::Gradient)?);
        let gpu = self.empty(&[largest as usize], dtype, Category::Gradient)?;
        self.fill(gpu, Fill::Zeros)?;
        off.gpu_buffer = Some(gpu);
        // `initialize_optimizer_states`: the master's float32 gradient, pinned and kept
        off.host
            .push(self.pinned(p, DType::F32, Category::Gradient)?);
        Ok((master, off))
    }

    /// A host tensor made, then `.pin_memory()`'s pinned copy of it kept (the first goes).
    pub(super) fn pinned(
        &mut self,
        n: usize,
        dtype: DType,
        category: Category,
    ) -> Result<TensorId, EngineError> {
        let t = self.host_empty(&[n], dtype, category)?;
        let pin = self.host_empty(&[n], dtype, category);
        self.release(t);
        pin
    }

    /// Each parameter's elements, its offset in one flat buffer of them all, and the total.
    pub(super) fn zero_flat_layout(&self, params: &[TensorId]) -> (Vec<u64>, Vec<u64>, u64) {
        let numel: Vec<u64> = params
            .iter()
            .map(|&p| self.info(p).layout.numel() as u64)
            .collect();
        let mut offset = Vec::with_capacity(numel.len());
        let mut total = 0u64;
        for &n in &numel {
            offset.push(total);
            total += n;
        }
        (numel, offset, total)
    }

    /// `param.data = flat.narrow(0, offset, numel).view_as(param)`: the parameter's own
    /// storage goes (when nothing else holds it).
    pub(super) fn repoint(&mut self, t: TensorId, base: TensorId, offset: usize) {
        let shape = self.shape(t).to_vec();
        let mut l = Layout::contiguous(&shape);
        l.offset = offset;
        let v = self.view_with(base, l);
        let (ti, vi) = (t.0 as usize, v.0 as usize);
        let (a, b) = (self.info(t).storage, self.info(v).storage);
        let (la, lb) = (self.info(t).layout.clone(), self.info(v).layout.clone());
        self.info_mut(TensorId(ti as u32)).storage = b;
        self.info_mut(TensorId(ti as u32)).layout = lb;
        self.info_mut(TensorId(vi as u32)).storage = a;
        self.info_mut(TensorId(vi as u32)).layout = la;
        self.release(v);
    }

    /// The gradient hook of `leaf` (DeepSpeed's post-accumulate-grad hook): the bucket made at
    /// the first; under stage 2 the gradient copied into it, a full bucket reduced first.
    pub(crate) fn zero_grad_ready(&mut self, leaf: TensorId) -> Result<(), EngineError> {
        let Some(z) = self.zero.as_ref() else {
            return Ok(());
        };
        let Some(k) = z.params.iter().position(|&p| p == leaf) else {
            return Ok(());
        };
        if self.zero.as_ref().is_some_and(|z| z.stage == 3) {
            return self.zero3_grad_ready(k);
        }
        self.zero_setup_buckets()?;
        if self.zero.as_ref().is_some_and(|z| z.stage == 2) {
            self.zero_bucket_add(k)?;
        }
        Ok(())
    }

    /// `setup_buckets`: the reduction bucket(s), once per backward.
    fn zero_setup_buckets(&mut self) -> Result<(), EngineError> {
        let z = self.zero.as_ref().expect("under ZeRO");
        if !z.buckets.is_empty() {
            return Ok(());
        }
        let (n, dtype, count) = (
            z.bucket_elems as usize,
            z.dtype,
            if z.overlap { 2 } else { 1 },
        );
        for _ in 0..count {
            let b = self.empty(&[n], dtype, Category::Gradient)?;
            self.zero.as_mut().expect("under ZeRO").buckets.push(b);
        }
        Ok(())
    }

    /// `reduce_independent_p_g_buckets_and_remove_grads` for parameter `k`.
    fn zero_bucket_add(&mut self, k: usize) -> Result<(), EngineError> {
        let z = self.zero.as_ref().expect("under ZeRO");
        let (n, fill, cap) = (z.numel[k], z.fill, z.bucket_elems);
        if fill > 0 && fill + n > cap {
            self.zero_reduce_bucket()?;
        }
        let z = self.zero.as_mut().expect("under ZeRO");
        if n > cap {
            // reduced alone, from its own storage
            z.pending.push(k);
            let fill = z.fill;
            z.fill = n;
            let r = self.zero_reduce_bucket();
            self.zero.as_mut().expect("under ZeRO").fill = fill;
            return r;
        }
        let p = z.params[k];
        let bucket = z.buckets[0];
        let at = z.fill as usize;
        z.fill += n;
        z.pending.push(k);
        // the gradient copied into the bucket and made a view of it
        self.zero_regrad(p, bucket, at)
    }

    /// `param.grad` becomes a view of `into` at element `at` (the old gradient goes).
    pub(super) fn zero_regrad(
        &mut self,
        p: TensorId,
        into: TensorId,
        at: usize,
    ) -> Result<(), EngineError> {
        let shape = self.shape(p).to_vec();
        let mut l = Layout::contiguous(&shape);
        l.offset = at + self.info(into).layout.offset;
        let v = self.view_with(into, l);
        self.set_requires_grad(v, false);
        if let Some(old) = self.info_mut(p).grad.replace(v) {
            if self.computes() {
                self.launch(&super::op::Op::Copy, &[old], &[v])?;
            }
            self.release(old);
        }
        Ok(())
    }

    /// `reduce_ipg_grads`: the bucket averaged and all-reduced (a flattened temporary when its
    /// slices go to several ranks), then the partition's gradients into `grads_in_partition`
    /// and the others dropped.
    fn zero_reduce_bucket(&mut self) -> Result<(), EngineError> {
        let z = self.zero.as_ref().expect("under ZeRO");
        if z.pending.is_empty() {
            return Ok(());
        }
        let ranks = |k: usize| {
            let (a, b) = (z.offset[k], z.offset[k] + z.numel[k].max(1) - 1);
            (a / z.part, b / z.part)
        };
        let (lo, hi) = z
            .pending
            .iter()
            .map(|&k| ranks(k))
            .fold((u64::MAX, 0), |(l, h), (a, b)| (l.min(a), h.max(b)));
        if hi > lo {
            // `allreduce_bucket`'s `self.flatten(slices)`
            let t = self.empty(&[z.fill as usize], z.dtype, Category::Temporary)?;
            self.release(t);
        }
        let z = self.zero.as_ref().expect("under ZeRO");
        let pending = z.pending.clone();
        if z.offload.is_some() {
            for k in pending {
                self.zero_offload_grad(k)?;
            }
            let z = self.zero.as_mut().expect("under ZeRO");
            z.pending.clear();
            z.fill = 0;
            return Ok(());
        }
        if z.grads.is_none() && pending.iter().any(|&k| z.in_part[k]) {
            let n: u64 = (0..z.params.len())
                .filter(|&k| z.in_part[k])
                .map(|k| z.numel[k])
                .sum();
            let g = self.empty(&[n as usize], z.dtype, Category::Gradient)?;
            let z = self.zero.as_mut().expect("under ZeRO");
            z.grads = Some(g);
            z.grads_fill = 0;
        }
        for k in pending {
            let z = self.zero.as_ref().expect("under ZeRO");
            let p = z.params[k];
            if z.in_part[k] {
                let (g, at) = (z.grads.expect("made above"), z.grads_fill as usize);
                self.zero.as_mut().expect("under ZeRO").grads_fill += z.numel[k];
                self.zero_regrad(p, g, at)?;
            } else if let Some(old) = self.info_mut(p).grad.take() {
                self.release(old);
            }
        }
        let z = self.zero.as_mut().expect("under ZeRO");
        z.pending.clear();
        z.fill = 0;
        Ok(())
    }

    /// `copy_grads_in_partition` with the optimizer offloaded, at the accumulation boundary,
    /// for parameter `k` of a reduced bucket: a gradient outside rank 0's partition is
    /// dropped; one in it (its `n` elements there) gets `set_norm_for_param_grad_in_gpu` (a
    /// float64 copy of the slice, its norm kept to the step), `update_offload_overflow_tracker`
    /// (`_has_inf_or_nan` over the whole gradient: float32 copy when it is not, `isnan`,
    /// `isinf`, their `logical_or`, that as float32 for `max()`; the locals go on return, the
    /// scalar once tested) and `async_inplace_copy_grad_to_fp32_buffer_from_gpu` (the slice
    /// in float32 when it is not, copied to the pinned gradient), then `param.grad = None`.
    fn zero_offload_grad(&mut self, k: usize) -> Result<(), EngineError> {
        let z = self.zero.as_ref().expect("under ZeRO");
        let (p, dtype, full) = (z.params[k], z.dtype, z.numel[k] as usize);
        let n = z.numel[k].min(z.part.saturating_sub(z.offset[k])) as usize;
        let inside = z.in_part[k];
        if inside && self.grad(p).is_some() {
            let d = self.empty(&[n], DType::F64, Category::Temporary)?;
            let norm = self.empty(&[], DType::F64, Category::Temporary);
            self.release(d);
            let norm = norm?;
            let off = self.zero_offload_mut();
            off.norms.push(norm);
            let float_x = if dtype == DType::F32 {
                None
            } else {
                Some(self.empty(&[full], DType::F32, Category::Temporary)?)
            };
            let mut locals: Vec<TensorId> = float_x.into_iter().collect();
            for _ in 0..3 {
                locals.push(self.empty(&[full], DType::Bool, Category::Temporary)?);
            }
            let as_float = self.empty(&[full], DType::F32, Category::Temporary)?;
            let max = self.empty(&[], DType::F32, Category::Temporary);
            self.release(as_float);
            self.release_all(locals);
            self.release(max?);
            if dtype != DType::F32 {
                let f = self.empty(&[n], DType::F32, Category::Temporary)?;
                self.release(f);
            }
        }
        if let Some(old) = self.info_mut(p).grad.take() {
            self.release(old);
        }
        Ok(())
    }

    pub(super) fn zero_offload_mut(&mut self) -> &mut ZeroOffload {
        self.zero
            .as_mut()
            .and_then(|z| z.offload.as_mut())
            .expect("under ZeRO with offload")
    }

    /// What DeepSpeed's engine does once `loss.backward()` returns: stage 1 reduces every
    /// gradient now (parameter order), stage 2 the last bucket; the bucket goes.
    pub(crate) fn zero_after_backward(&mut self) -> Result<(), EngineError> {
        let Some(z) = self.zero.as_ref() else {
            return Ok(());
        };
        if z.stage == 3 {
            // (the bucket stays: ZeRO-3 keeps it for the run)
            return self.zero3_reduce();
        }
        if z.stage == 1 {
            let params = z.params.clone();
            for (k, &p) in params.iter().enumerate() {
                if self.grad(p).is_some() {
                    self.zero_setup_buckets()?;
                    self.zero_bucket_add(k)?;
                }
            }
        }
        self.zero_reduce_bucket()?;
        let z = self.zero.as_mut().expect("under ZeRO");
        let buckets = std::mem::take(&mut z.buckets);
        // (`_release_ipg_buffers`; the stale views of dropped gradients went with them)
        self.release_all(buckets);
        Ok(())
    }

    /// The ZeRO optimizer's `step()` (FusedAdam over the float32 partition).
    pub fn zero_step(&mut self) -> Result<(), EngineError> {
        let Some(z) = self.zero.as_ref() else {
            return Err(EngineError::Invalid("zero_step without zero_init".into()));
        };
        if z.stage == 3 {
            return self.zero3_step();
        }
        if z.offload.is_some() {
            return self.zero_step_offload();
        }
        let Some(grads) = z.grads else {
            // no gradient reached the partition: DeepSpeed steps nothing
            return Ok(());
        };
        let (part, dtype) = (z.part as usize, z.dtype);
        let sizes: Vec<u64> = (0..z.params.len())
            .filter(|&k| z.in_part[k])
            .map(|k| z.numel[k].min(z.part - z.offset[k]))
            .collect();
        // `get_grad_norm_direct`; `self._global_grad_norm = scaled_global_grad_norm /
        // prev_scale` (float32 here)
        let held = self.zero_norm(&sizes, DType::F32, false)?;
        // the partition's gradients flattened, in float32
        let single = self.zero_flat_f32(part, dtype)?;
        // `averaged_gradients = None`: the partition gradients go
        let params = self.zero.as_ref().expect("under ZeRO").params.clone();
        for p in params {
            if let Some(g) = self.info_mut(p).grad.take() {
                self.release(g);
            }
        }
        let z = self.zero.as_mut().expect("under ZeRO");
        z.grads = None;
        self.release(grads);
        self.zero_adam_states(part)?;
        self.release(single);
        self.release_all(held);
        Ok(())
    }

    /// The step's gradient norm: each gradient's float64 copy (`sizes` elements), one at a
    /// time; stage 3's `norm_groups` (one group norm, `group`) and `scaled_global_grad_norm`,
    /// locals of `step()`; then the new `_global_grad_norm` (a `dtype` scalar, kept until the
    /// next step). Returns what lives to the end of `step()`: the locals, then the previous
    /// `_global_grad_norm`, which the engine holds until `optimizer.step()` returns
    /// (`engine._global_grad_norm = optimizer._global_grad_norm`, engine.py:3455).
    pub(super) fn zero_norm(
        &mut self,
        sizes: &[u64],
        dtype: DType,
        group: bool,
    ) -> Result<Vec<TensorId>, EngineError> {
        for &n in sizes {
            let d = self.empty(&[n as usize], DType::F64, Category::Temporary)?;
            self.release(d);
        }
        let mut held = Vec::new();
        if group {
            held.push(self.empty(&[], DType::F64, Category::Temporary)?);
        }
        held.push(self.empty(&[], dtype, Category::Temporary)?);
        let norm = self.empty(&[1], dtype, Category::OptimizerState)?;
        let z = self.zero.as_mut().expect("under ZeRO");
        held.extend(z.global_norm.replace(norm));
        Ok(held)
    }

    /// The partition's gradients flattened (`n` elements of `dtype`), as float32: the same
    /// tensor in float32, else a float32 copy with the flat one dropped.
    pub(super) fn zero_flat_f32(
        &mut self,
        n: usize,
        dtype: DType,
    ) -> Result<TensorId, EngineError> {
        let flat = self.empty(&[n], dtype, Category::Temporary)?;
        if dtype == DType::F32 {
            return Ok(flat);
        }
        let f = self.empty(&[n], DType::F32, Category::Temporary);
        self.release(flat);
        f
    }

    /// FusedAdam's `exp_avg` and `exp_avg_sq` over `n` float32 elements beside the master, at
    /// the first step.
    pub(super) fn zero_adam_states(&mut self, n: usize) -> Result<(), EngineError> {
        if !self.zero.as_ref().expect("under ZeRO").state.is_empty() {
            return Ok(());
        }
        let master = self.zero.as_ref().expect("under ZeRO").master;
        for _ in 0..2 {
            let s = self.empty_beside(master, &[n], DType::F32, Category::OptimizerState)?;
            self.fill(s, Fill::Zeros)?;
            self.zero.as_mut().expect("under ZeRO").state.push(s);
        }
        Ok(())
    }

    /// `step()` with the optimizer offloaded: `has_overflow` (a one-byte device tensor
    /// all-reduced), the norm (`complete_grad_norm_calculation_for_cpu_offload`: the kept
    /// norms read, a one-element float32 device tensor all-reduced, the rest on the host),
    /// DeepSpeedCPUAdam on the host (its `exp_avg` and `exp_avg_sq` at the first step, in
    /// pageable host memory), the update copied through the pinned bit16 buffer straight into
    /// the flat parameters (no device temporary), then `reset_cpu_buffers` drops the norms.
    fn zero_step_offload(&mut self) -> Result<(), EngineError> {
        if self.zero_offload_mut().norms.is_empty() {
            // no gradient reached the partition: DeepSpeed steps nothing
            return Ok(());
        }
        let overflow = self.empty(&[1], DType::U8, Category::Temporary)?;
        self.release(overflow);
        let total = self.empty(&[1], DType::F32, Category::Temporary)?;
        self.release(total);
        self.zero_cpu_adam_step()
    }

    /// DeepSpeedCPUAdam's step on the host (its `exp_avg` and `exp_avg_sq` over the partition
    /// at the first step, in pageable host memory), then `reset_cpu_buffers`: the norms kept
    /// from backward go.
    pub(super) fn zero_cpu_adam_step(&mut self) -> Result<(), EngineError> {
        let part = self.zero.as_ref().expect("under ZeRO").part as usize;
        if self.zero.as_ref().expect("under ZeRO").state.is_empty() {
            for _ in 0..2 {
                let s = self.host_empty(&[part], DType::F32, Category::OptimizerState)?;
                self.zero.as_mut().expect("under ZeRO").state.push(s);
            }
        }
        let norms = std::mem::take(&mut self.zero_offload_mut().norms);
        self.release_all(norms);
        Ok(())
    }

    /// The ranks of the ZeRO group and its stage, when the model is under ZeRO.
    pub fn zero_world(&self) -> Option<(u8, u64)> {
        self.zero.as_ref().map(|z| (z.stage, z.world))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tensor::testing::*;

    #[test]
    fn stage2_holds_flat_master_and_a_full_size_bucket() {
        let mut d = dev();
        let w = d
            .empty(&[1000, 10], DType::F32, Category::Parameter)
            .unwrap();
        d.set_requires_grad(w, true);
        let b = d.empty(&[10], DType::F32, Category::Parameter).unwrap();
        d.set_requires_grad(b, true);
        let before = d.alloc.stats().allocated_bytes.all().current as u64;
        d.zero_init(
            &[w, b],
            ZeroConfig {
                stage: 2,
                world: 4,
                bucket_elems: 500_000_000,
                overlap: false,
                offload: false,
            },
        )
        .unwrap();
        // 10,010 elements padded to a multiple of 8: 10,016; the flat buffer replaces the
        // parameters, a quarter of it is the float32 master partition (2,504 elements);
        // FusedAdam's int32 overflow flag takes a 512-byte block
        let after = d.alloc.stats().allocated_bytes.all().current as u64;
        let flat = (10_016u64 * 4).div_ceil(512) * 512;
        let master = (2_504u64 * 4).div_ceil(512) * 512;
        let params = (10_000u64 * 4).div_ceil(512) * 512 + 512;
        assert_eq!(after, before - params + flat + master + 512);
        assert_eq!(d.zero_world(), Some((2, 4)));
    }
}
