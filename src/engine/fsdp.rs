//! FSDP2 (`fully_shard`) as PyTorch 2.11 runs it, for memory: each parameter group's sharded
//! parameters (what the optimizer steps), its unsharded parameters (what the module computes
//! with, their storage resized to zero between uses), and the hooks that move between the two:
//! the unshard before a group's forward and backward, the reshard after them, and the
//! reduce-scatter of the gradients after the group's backward.
//!
//! What each step allocates and frees follows `torch/distributed/fsdp/_fully_shard/`
//! (`_fsdp_param_group.py`, `_fsdp_param.py`, `_fsdp_collectives.py`) and the H200 trace of
//! ../shared/groundtruth/dist1 (world size 1):
//!
//! - `fully_shard(module)`: the group's parameters (the root's buffers after them) moved to the
//!   device when on the host (`_move_states_to_device`); then per parameter, in order
//!   (`FSDPParam._init_sharded_param`), a new zeroed shard padded along dim 0 to a multiple of
//!   the world size, the rank's chunk copied in (with offload, copied to pinned host memory and
//!   the device shard freed); the original parameters go when `fully_shard` returns (its list
//!   of them, last first). The module's parameter becomes the unsharded one, without memory.
//! - unshard (`wait_for_unshard`; at world size 1 there is no all-gather, each parameter's
//!   output is filled from its shard directly): per parameter, with a `param_dtype` the shard
//!   cast to it, the previous parameter's cast freed, then the unsharded storage regrown
//!   (`alloc_storage`); the last cast goes as the hook returns.
//! - reshard (`free_storage`): each unsharded storage resized to zero, in order: after the
//!   group's forward (`reshard_after_forward`, the root's too: its forward ends with the loss)
//!   and after its backward.
//! - post-backward (`post_backward`, `foreach_reduce`): the unsharded gradients taken, the
//!   group resharded, the previous group's reduce-scatter input freed, the reduce-scatter input
//!   allocated (the padded gradients in `reduce_dtype`), `_chunk_cat`'s packed metadata copied
//!   to the device and freed, the unsharded gradients freed last first (`del`), the output (the
//!   shard's gradients) allocated in the reduce-scatter stream (its own pool): each sharded parameter's `.grad` is a view of it, so it goes
//!   with the last of them (`zero_grad`). The input is kept until the next group's
//!   post-backward, or the end of backward.
//! - with CPU offload (`CPUOffloadPolicy(pin_memory=True)`): the model is built on the host,
//!   the shards live in pinned host memory; each unshard copies a shard to the device first
//!   (freed once cast, or as the next parameter's comes); the reduce-scatter output goes back
//!   to the host (the device copy freed as `post_backward` returns), and the optimizer's state
//!   and step stay there.
//! - the pre-backward hook runs before the node that made the group's output; the post-backward
//!   one when the gradient of the group's input is complete (`RegisterPostBackwardFunction`, an
//!   alias node made at the group's forward); the root's post-backward, in the final callback,
//!   frees the last reduce-scatter input.

use super::dtype::DType;
pub use super::graph::FsdpPolicy;
use super::graph::{Fsdp, FsdpGroup as Group, NodeId};
use super::layout::Layout;
use super::op::ViewKind;
use super::tensor::{Category, EngineError, TensorId, Tensors};
use crate::backend::Device;

/// `_chunk_cat`'s CUDA kernel: bytes of a thread block's tile (128 threads x 16 bytes).
const CHUNK_CAT_TILE: u64 = 128 * 16;

/// The stream FSDP2's reduce-scatter output is allocated on (`comm_ctx.reduce_scatter_stream`).
const REDUCE_SCATTER_STREAM: crate::alloc::StreamId = 1;

/// The stream FSDP2's all-gather input and output are allocated on
/// (`comm_ctx.all_gather_copy_in_stream`; world size > 1).
const ALL_GATHER_COPY_IN_STREAM: crate::alloc::StreamId = 2;

/// `split_with_sizes_copy` sizes its grid by the device's multiprocessors and threads.
const H200_SMS: u64 = super::SMS as u64;
const H200_THREADS_PER_SM: u64 = super::THREADS_PER_SM as u64;

/// Padded shard shape: dim 0 split in `world` chunks, each the size of the first.
fn shard_shape(shape: &[usize], world: u64) -> Vec<usize> {
    let mut s = shape.to_vec();
    if let Some(d0) = s.first_mut() {
        *d0 = d0.div_ceil(world.max(1) as usize);
    }
    s
}

/// Bytes of `_chunk_cat`'s packed int64 metadata for gradients of these shapes into a buffer of
/// `dst` bytes per element, in `world` chunks: the source pointers, the block of each tile, the
/// start bytes and start blocks (one more each), the actual and padded sizes, and the blocks per
/// tensor.
pub fn chunk_cat_metadata_bytes(shapes: &[Vec<usize>], dst: u64, world: u64) -> u64 {
    let n = shapes.len() as u64;
    let blocks: u64 = shapes
        .iter()
        .map(|s| {
            let d0 = s.first().copied().unwrap_or(1) as u64;
            let trailing: u64 = s.iter().skip(1).map(|&d| d as u64).product();
            let padded_chunk = d0.div_ceil(world.max(1)) * trailing * dst;
            padded_chunk.div_ceil(CHUNK_CAT_TILE)
        })
        .sum();
    8 * (6 * n + 2 + blocks)
}

/// Bytes of `split_with_sizes_copy`'s packed int64 metadata (its CUDA fast path) copying an
/// all-gather output of `world` chunks into parameters taking `splits` bytes of each chunk:
/// the destination and source addresses, the chunk sizes, the split of each block and the
/// blocks' running sums. Blocks are sized so the grid stays within twice what the device holds
/// at once.
pub fn split_copy_metadata_bytes(splits: &[u64], world: u64) -> u64 {
    let n = splits.len() as u64;
    let tile = CHUNK_CAT_TILE;
    let first: u64 = splits.iter().map(|&b| b.div_ceil(tile)).sum();
    let max_blocks = H200_SMS * H200_THREADS_PER_SM / 128 * 2;
    let iter_factor = (first * world).div_ceil(max_blocks).max(1);
    let chunks_per_block = ((iter_factor as f64).sqrt().ceil() as u64).clamp(1, world.max(1));
    let iters_per_chunk = iter_factor.div_ceil(chunks_per_block);
    let blocks: u64 = splits
        .iter()
        .map(|&b| b.div_ceil(tile * iters_per_chunk))
        .sum();
    8 * (4 * n + 1 + blocks)
}

impl<S: Device> Tensors<S> {
    /// `fully_shard` on each group in turn (the layers, then the root: the parameters left),
    /// `groups` holding the module's parameters (float, leaves): each gets its shard, then
    /// becomes the unsharded parameter, its memory gone until the first unshard.
    pub fn fsdp_init(
        &mut self,
        groups: Vec<Vec<TensorId>>,
        root: usize,
        buffers: &[TensorId],
        policy: FsdpPolicy,
    ) -> Result<(), EngineError> {
        if self.fsdp.is_some() {
            return Err(EngineError::Invalid(
                "fully_shard: the model is sharded already".into(),
            ));
        }
        let mut out = Vec::new();
        for (gi, params) in groups.into_iter().enumerate() {
            // `_move_states_to_device`: what is on the host comes to the device first (the
            // root's buffers after its parameters)
            let moved: Vec<TensorId> = if gi == root {
                params.iter().chain(buffers).copied().collect()
            } else {
                params.clone()
            };
            for t in moved {
                if self.is_host(t) {
                    self.storage_drop(t);
                    let cat = self.storage_of(t).2;
                    self.tagged("fsdp.init", |d| d.storage_regrow(t, cat))?;
                }
            }
            let mut sharded = Vec::new();
            for &p in &params {
                let shape = shard_shape(self.shape(p), policy.world_size);
                let dtype = self.dtype(p);
                let sh = self.tagged("fsdp.shard", |d| {
                    let sh = d.factory_fill(
                        &shape,
                        dtype,
                        false,
                        Category::Parameter,
                        super::op::Fill::Zeros,
                    )?;
                    if !policy.offload {
                        return Ok(sh);
                    }
                    // `padded_sharded_param.cpu().pin_memory()`: the device shard goes
                    let h = d.host_empty(&shape, dtype, Category::Parameter);
                    d.release(sh);
                    h
                })?;
                self.set_requires_grad(sh, self.info(p).requires_grad);
                sharded.push(sh);
            }
            // the original parameters go with fully_shard's list of them, last first
            for &p in params.iter().rev() {
                self.storage_drop(p);
                if let Some(dt) = policy.param_dtype {
                    self.retype_dropped(p, dt);
                }
            }
            for &p in &params {
                self.retain(p);
            }
            out.push(Group {
                params,
                sharded,
                root: gi == root,
                unsharded: false,
                pre_backward: None,
                post_backward: None,
                all_gather: None,
                post_forward_indices: Vec::new(),
            });
        }
        self.fsdp = Some(Box::new(Fsdp {
            policy,
            groups: out,
            rs_input: None,
            all_gather_state: None,
            post_forward_order: Vec::new(),
        }));
        Ok(())
    }

    /// FSDP2's world size (None before `fsdp_init`).
    pub fn fsdp_world_size(&self) -> Option<u64> {
        self.fsdp.as_ref().map(|f| f.policy.world_size)
    }

    /// How many parameter groups FSDP2 wraps (0 before `fsdp_init`).
    pub fn fsdp_groups(&self) -> usize {
        self.fsdp.as_ref().map_or(0, |f| f.groups.len())
    }

    /// The sharded parameter of a parameter FSDP manages (the optimizer's), else itself.
    pub fn fsdp_sharded(&self, p: TensorId) -> TensorId {
        let Some(f) = &self.fsdp else { return p };
        for g in &f.groups {
            if let Some(i) = g.params.iter().position(|&q| q == p) {
                return g.sharded[i];
            }
        }
        p
    }

    /// Runs `f` with `tag` pushed on the allocator's tag stack.
    fn tagged<T>(
        &mut self,
        tag: &str,
        f: impl FnOnce(&mut Self) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        self.alloc.recorder_mut().push_tag(tag);
        let r = f(self);
        self.alloc.recorder_mut().pop_tag();
        r
    }

    fn fsdp_group(&self, g: usize) -> Result<&Group, EngineError> {
        self.fsdp
            .as_ref()
            .and_then(|f| f.groups.get(g))
            .ok_or_else(|| EngineError::Invalid(format!("no FSDP group {g}")))
    }

    /// FSDP2's forward hooks run inside a gradient checkpoint's region (HF's checkpointing
    /// wraps the module's whole `__call__`), but a recompute skips them (`_pre_forward` and
    /// `_post_forward` return at once in backward: the pre-backward hook has unsharded): what
    /// they allocate and free is not the region's, and is not replayed.
    fn outside_checkpoint<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let region = self.checkpoint.current.take();
        let r = f(self);
        self.checkpoint.current = region;
        r
    }

    /// The group's forward pre-hook: unshard, and (in grad mode) its input through the
    /// post-backward alias node. Returns what the module computes on.
    pub fn fsdp_pre_forward(
        &mut self,
        g: usize,
        input: Option<TensorId>,
    ) -> Result<Option<TensorId>, EngineError> {
        self.outside_checkpoint(|d| d.fsdp_pre_forward_hook(g, input))
    }

    fn fsdp_pre_forward_hook(
        &mut self,
        g: usize,
        input: Option<TensorId>,
    ) -> Result<Option<TensorId>, EngineError> {
        self.fsdp_group(g)?;
        self.fsdp_unshard(g)?;
        self.fsdp_wait_for_unshard(g, true)?;
        let Some(x) = input else { return Ok(None) };
        if !self.grad_enabled || !self.info(x).requires_grad {
            return Ok(Some(self.retain(x)));
        }
        let layout = self.info(x).layout.clone();
        let out = self.view_op(ViewKind::Alias, x, layout, Layout::contiguous(&[]));
        let hook = self
            .info(out)
            .grad_fn
            .map(|n| (n, self.nodes[n.0 as usize].seq));
        if let Some(f) = &mut self.fsdp {
            f.groups[g].post_backward = hook;
        }
        Ok(Some(out))
    }

    /// The group's forward post-hook: reshard (with `reshard_after_forward`, the root too), and
    /// the pre-backward hook on the node that made `output`.
    pub fn fsdp_post_forward(&mut self, g: usize, output: TensorId) -> Result<(), EngineError> {
        self.outside_checkpoint(|d| d.fsdp_post_forward_hook(g, output))
    }

    fn fsdp_post_forward_hook(&mut self, g: usize, output: TensorId) -> Result<(), EngineError> {
        let root = self.fsdp_group(g)?.root;
        if self
            .fsdp
            .as_ref()
            .is_some_and(|f| f.policy.reshard_after_forward)
        {
            self.fsdp_reshard(g);
        }
        if let Some(f) = &mut self.fsdp {
            let i = f.post_forward_order.len();
            f.post_forward_order.push(g);
            f.groups[g].post_forward_indices.push(i);
        }
        if root {
            // the root's post-forward flushes the last all-gather output
            if let Some(t) = self.fsdp.as_mut().and_then(|f| f.all_gather_state.take()) {
                self.release(t);
            }
        }
        let hook = self
            .info(output)
            .grad_fn
            .filter(|_| self.grad_enabled)
            .map(|n| (n, self.nodes[n.0 as usize].seq));
        if let Some(f) = &mut self.fsdp {
            f.groups[g].pre_backward = hook;
        }
        Ok(())
    }

    /// `unshard`: at world size 1 nothing (the copy is `wait_for_unshard`'s); above it the
    /// all-gather is issued, in the copy-in stream: the shards cast into one flat input with
    /// a `param_dtype` (or each copied to the device with offload), the output of every rank's
    /// shards, then the input freed.
    fn fsdp_unshard(&mut self, g: usize) -> Result<(), EngineError> {
        let (sharded, cast, offload, world) = {
            let f = self.fsdp.as_ref().expect("checked");
            let gr = &f.groups[g];
            if gr.unsharded || gr.all_gather.is_some() || f.policy.world_size == 1 {
                return Ok(());
            }
            (
                gr.sharded.clone(),
                f.policy.param_dtype,
                f.policy.offload,
                f.policy.world_size as usize,
            )
        };
        let numel: usize = sharded.iter().map(|&s| self.info(s).layout.numel()).sum();
        let orig = self.dtype(sharded[0]);
        // shards of several dtypes (frozen bf16 weights beside float32 LoRA adapters) are
        // gathered as bytes (`_get_all_gather_input_metadatas`: uint8 when the inputs'
        // dtypes differ)
        let mixed = cast.is_none() && sharded.iter().any(|&s| self.dtype(s) != orig);
        let (out_numel, dtype) = if mixed {
            let bytes: u64 = sharded
                .iter()
                .map(|&s| self.info(s).layout.numel() as u64 * self.dtype(s).size())
                .sum();
            (bytes as usize, DType::U8)
        } else {
            (numel, cast.unwrap_or(orig))
        };
        let was = std::mem::replace(&mut self.stream, ALL_GATHER_COPY_IN_STREAM);
        let r = self.tagged("fsdp.all_gather", |d| {
            let mut inputs = Vec::new();
            if offload {
                for &s in &sharded {
                    let shape = d.shape(s).to_vec();
                    let dt = d.dtype(s);
                    inputs.push(d.empty(&shape, dt, Category::Temporary)?);
                }
            } else if dtype != orig && !mixed {
                inputs.push(d.empty(&[numel], dtype, Category::Temporary)?);
            }
            let out = d.empty(&[out_numel * world], dtype, Category::Temporary);
            for t in inputs {
                d.release(t);
            }
            out
        });
        self.stream = was;
        let out = r?;
        if let Some(f) = &mut self.fsdp {
            f.groups[g].all_gather = Some(out);
        }
        Ok(())
    }

    /// `wait_for_unshard`: the unsharded parameters regrown and filled. At world size 1 from
    /// each shard (cast first to `param_dtype`, copied first with offload); above it from the
    /// all-gather output (`split_with_sizes_copy`, its packed metadata on the device a
    /// moment), the output then freed, or in forward kept until the next group's all-gather
    /// has been copied out (the previous one freed first).
    fn fsdp_wait_for_unshard(&mut self, g: usize, forward: bool) -> Result<(), EngineError> {
        let (params, sharded, cast, offload, world, pending) = {
            let f = self.fsdp.as_ref().expect("checked");
            let gr = &f.groups[g];
            if gr.unsharded {
                return Ok(());
            }
            (
                gr.params.clone(),
                gr.sharded.clone(),
                f.policy.param_dtype,
                f.policy.offload,
                f.policy.world_size,
                gr.all_gather,
            )
        };
        if forward {
            if let Some(t) = self.fsdp.as_mut().and_then(|f| f.all_gather_state.take()) {
                self.release(t);
            }
        }
        self.tagged("fsdp.unshard", |d| {
            let Some(out) = pending else {
                // world size 1
                let mut prev: Option<TensorId> = None;
                for (&p, &s) in params.iter().zip(&sharded) {
                    let shape = d.shape(s).to_vec();
                    // with offload, the shard copied to the device first
                    let copied = if offload {
                        Some(d.empty(&shape, d.dtype(s), Category::Temporary)?)
                    } else {
                        None
                    };
                    let input = match cast {
                        Some(dt) if dt != d.dtype(s) => {
                            let c = d.empty(&shape, dt, Category::Temporary);
                            if let Some(t) = copied {
                                d.release(t);
                            }
                            Some(c?)
                        }
                        _ => copied,
                    };
                    if let Some(old) = prev.take() {
                        d.release(old);
                    }
                    prev = input;
                    d.storage_regrow(p, Category::Parameter)?;
                }
                if let Some(old) = prev {
                    d.release(old);
                }
                return Ok(());
            };
            // (gathered as bytes, each parameter keeps its own dtype)
            let bytes_out = d.dtype(out) == DType::U8;
            let mut splits = Vec::new();
            for (&p, &s) in params.iter().zip(&sharded) {
                let n = d.info(s).layout.numel() as u64;
                let elem = if bytes_out {
                    d.dtype(s).size()
                } else {
                    d.dtype(out).size()
                };
                splits.push(n * elem);
                d.storage_regrow_bytes(p, n * world * elem, Category::Parameter)?;
            }
            let meta = split_copy_metadata_bytes(&splits, world);
            let m = d.empty(&[meta as usize], DType::U8, Category::Temporary)?;
            d.release(m);
            Ok(())
        })?;
        if let Some(f) = &mut self.fsdp {
            f.groups[g].unsharded = true;
            if let Some(out) = f.groups[g].all_gather.take() {
                if forward {
                    f.all_gather_state = Some(out);
                } else {
                    self.release(out);
                }
            }
        }
        Ok(())
    }

    /// Reshard: each unsharded parameter's storage resized to zero, in order.
    fn fsdp_reshard(&mut self, g: usize) {
        let Some(f) = &mut self.fsdp else { return };
        let gr = &mut f.groups[g];
        if !gr.unsharded {
            return;
        }
        gr.unsharded = false;
        let params = gr.params.clone();
        for p in params {
            self.storage_drop(p);
        }
    }

    /// Backward is about to run node `n`: a group's pre-backward hook unshards it.
    pub(crate) fn fsdp_before_node(&mut self, n: NodeId) -> Result<(), EngineError> {
        let seq = self.nodes[n.0 as usize].seq;
        let hit = self.fsdp.as_ref().and_then(|f| {
            f.groups
                .iter()
                .position(|g| g.pre_backward == Some((n, seq)))
        });
        if let Some(g) = hit {
            if let Some(f) = &mut self.fsdp {
                f.groups[g].pre_backward = None;
            }
            self.fsdp_unshard(g)?;
            self.fsdp_wait_for_unshard(g, false)?;
            // `_backward_prefetch`: the group whose forward ended before this one's
            let target = self.fsdp.as_mut().and_then(|f| {
                let i = f.groups[g].post_forward_indices.pop()?;
                let t = i.checked_sub(1)?;
                f.post_forward_order.get(t).copied()
            });
            if let Some(t) = target {
                self.fsdp_unshard(t)?;
            }
        }
        Ok(())
    }

    /// Backward ran node `n`: a group's post-backward alias node reduces its gradients.
    pub(crate) fn fsdp_after_node(&mut self, n: NodeId, seq: u64) -> Result<(), EngineError> {
        let hit = self.fsdp.as_ref().and_then(|f| {
            f.groups
                .iter()
                .position(|g| g.post_backward == Some((n, seq)))
        });
        if let Some(g) = hit {
            if let Some(f) = &mut self.fsdp {
                f.groups[g].post_backward = None;
            }
            self.fsdp_post_backward(g)?;
        }
        Ok(())
    }

    /// The final callback of backward: the groups still unsharded (the root) reduce their
    /// gradients, then the last reduce-scatter input goes.
    pub(crate) fn fsdp_final_callback(&mut self) -> Result<(), EngineError> {
        let n = self.fsdp.as_ref().map_or(0, |f| f.groups.len());
        // `all_states`: the root's state first, then the others in module order
        let root = self
            .fsdp
            .as_ref()
            .and_then(|f| f.groups.iter().position(|g| g.root));
        let order = root.into_iter().chain((0..n).filter(|&g| Some(g) != root));
        for g in order.collect::<Vec<_>>() {
            let unsharded = self.fsdp.as_ref().is_some_and(|f| f.groups[g].unsharded);
            if unsharded {
                self.fsdp_post_backward(g)?;
            }
            if let Some(f) = &mut self.fsdp {
                f.groups[g].pre_backward = None;
                f.groups[g].post_backward = None;
            }
        }
        if let Some(t) = self.fsdp.as_mut().and_then(|f| f.rs_input.take()) {
            self.release(t);
        }
        if let Some(f) = &mut self.fsdp {
            f.post_forward_order.clear();
            for gr in &mut f.groups {
                gr.post_forward_indices.clear();
            }
        }
        Ok(())
    }

    /// `post_backward`: reshard, then `foreach_reduce` into the sharded parameters' `.grad`.
    fn fsdp_post_backward(&mut self, g: usize) -> Result<(), EngineError> {
        let (params, sharded, policy) = {
            let f = self.fsdp.as_ref().expect("checked");
            let gr = &f.groups[g];
            (gr.params.clone(), gr.sharded.clone(), f.policy)
        };
        let mut with_grad = Vec::new();
        for (i, &p) in params.iter().enumerate() {
            if let Some(gt) = self.info_mut(p).grad.take() {
                with_grad.push((i, gt));
            }
        }
        self.fsdp_reshard(g);
        if with_grad.is_empty() {
            return Ok(());
        }
        self.tagged("fsdp.reduce_scatter", |d| {
            if let Some(t) = d.fsdp.as_mut().and_then(|f| f.rs_input.take()) {
                d.release(t);
            }
            let grad_dtype = d.dtype(with_grad[0].1);
            let reduce = policy.reduce_dtype.unwrap_or(grad_dtype);
            let shard_numel: usize = with_grad
                .iter()
                .map(|&(i, _)| d.info(sharded[i]).layout.numel())
                .sum();
            let world = policy.world_size as usize;
            let input = d.empty(&[shard_numel * world], reduce, Category::Temporary)?;
            // `torch._chunk_cat(grads, dim=0, num_chunks=world, out=input)`
            let shapes: Vec<Vec<usize>> = with_grad
                .iter()
                .map(|&(_, gt)| d.shape(gt).to_vec())
                .collect();
            let meta = chunk_cat_metadata_bytes(&shapes, reduce.size(), policy.world_size);
            let m = d.empty(&[meta as usize], DType::U8, Category::Temporary)?;
            d.release(m);
            // `del unsharded_grads`: a list, freed last first
            for &(_, gt) in with_grad.iter().rev() {
                d.release(gt);
            }
            // (allocated in the reduce-scatter stream: its own pool)
            // (allocated in the reduce-scatter stream: its own pool), then cast there to the
            // parameters' dtype if it differs (the reduce-dtype output freed as
            // `foreach_reduce` returns)
            let orig = d.dtype(sharded[with_grad[0].0]);
            let was = std::mem::replace(&mut d.stream, REDUCE_SCATTER_STREAM);
            let reduced = d.empty(&[shard_numel], reduce, Category::Gradient);
            let output = match reduced {
                Ok(r) if reduce != orig => {
                    let c = d.empty(&[shard_numel], orig, Category::Gradient);
                    d.release(r);
                    c
                }
                other => other,
            };
            d.stream = was;
            let output = output?;
            let mut offset = 0usize;
            for &(i, _) in &with_grad {
                let s = sharded[i];
                let mut l = Layout::contiguous(d.shape(s));
                l.offset = offset;
                offset += l.numel();
                let mut v = d.view_with(output, l);
                if policy.offload {
                    // `new_sharded_grad.to(cpu, non_blocking=True)`: into pinned host memory
                    let shape = d.shape(s).to_vec();
                    let h = d.host_empty(&shape, orig, Category::Gradient);
                    d.release(v);
                    v = match h {
                        Ok(h) => h,
                        Err(e) => {
                            d.release(output);
                            return Err(e);
                        }
                    };
                }
                match d.grad(s) {
                    None => d.info_mut(s).grad = Some(v),
                    Some(old) => {
                        // gradient accumulation: added into the existing shard gradient
                        let r = d.launch(&super::op::Op::Accumulate, &[v], &[old]);
                        d.release(v);
                        r?;
                    }
                }
            }
            d.release(output);
            if let Some(f) = &mut d.fsdp {
                f.rs_input = Some(input);
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `_chunk_cat`'s device copy of its metadata in the H200 trace of an FSDP2 Llama layer
    /// (q, k, v, o, gate, up, down, two norms; bf16 gradients into float32) and of its root
    /// (embedding, final norm, lm_head).
    #[test]
    fn chunk_cat_metadata_matches_the_h200_trace() {
        let layer = vec![
            vec![1024, 1024],
            vec![256, 1024],
            vec![256, 1024],
            vec![1024, 1024],
            vec![2816, 1024],
            vec![2816, 1024],
            vec![1024, 2816],
            vec![1024],
            vec![1024],
        ];
        assert_eq!(chunk_cat_metadata_bytes(&layer, 4, 1), 176_608);
        let root = vec![vec![32000, 1024], vec![1024], vec![32000, 1024]];
        assert_eq!(chunk_cat_metadata_bytes(&root, 4, 1), 1_024_176);
    }

    #[test]
    fn shards_pad_dim0_to_the_world_size() {
        assert_eq!(shard_shape(&[10, 3], 4), vec![3, 3]);
        assert_eq!(shard_shape(&[1024], 1), vec![1024]);
    }
}
