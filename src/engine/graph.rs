//! What the engine records besides storages, as plain data: tensor and node ids, the autograd
//! graph (nodes, their edges and saved tensors), activation-checkpoint regions with the tapes
//! their recompute replays, the autocast region with its cast cache, and FSDP2's groups
//! (their sharded and unsharded parameters, hooks and pending collectives).
//!
//! The behaviour lives above: [`super::tensor`] (storages and views), [`super::autograd`]
//! (backward), [`super::checkpoint`], [`super::autocast`], [`super::fsdp`]. This module imports
//! none of them, so the engine's modules form no cycle.

use std::collections::BTreeMap;

use super::dtype::DType;
use super::layout::Layout;
use super::op::{Back, Op, Role};
use crate::trace::Category;

/// A tensor, by handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeId(pub u32);

/// Where an input's gradient goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Edge {
    /// The input needs no gradient.
    None,
    /// The input was made by this node, as its output number `.1`.
    Node(NodeId, u32),
    /// The input is a leaf requiring grad: accumulate into its `.grad` (handle held).
    Leaf(TensorId),
}

/// A tensor a node keeps for its backward.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Saved {
    pub t: TensorId,
    /// The version of its storage when it was saved.
    pub version: u32,
    pub role: Role,
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub op: Op,
    pub saved: Vec<Saved>,
    pub next: Vec<Edge>,
    /// Shape and dtype of each input: the shape of its gradient.
    pub input_meta: Vec<(Vec<usize>, DType)>,
    /// Creation order (backward runs the newest ready node first).
    pub seq: u64,
    pub(crate) refs: u32,
    pub(crate) live: bool,
    /// A backward without retain_graph already freed the saved tensors.
    pub released: bool,
    /// The node saved tensors when it was made (so it cannot run again once they are freed).
    pub had_saved: bool,
    /// What the backward makes of the incoming gradient (see [`Back`]).
    pub back: Back,
    /// How many outputs the op made (a split's parts); each has its own gradient slot.
    pub outputs: u32,
    /// A split's parts' shapes (for the zeros of parts no gradient reached).
    pub out_shapes: Vec<Vec<usize>>,
    /// The activation-checkpoint region the node was made in, if any.
    pub region: Option<u32>,
    /// In a checkpoint region: (shape, dtype) of each saved tensor dropped after the forward,
    /// to be recomputed when backward reaches the node.
    /// Tensors saved by several nodes (an op's output and the next op's input) share a key, so
    /// the recompute makes them once.
    /// Each with its role and the layout it was saved with (a view of the storage, as q, k and
    /// v are of the qkv product's output).
    pub deferred: Vec<(u64, Role, Layout)>,
}

/// An activation-checkpoint region: the nodes made inside it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Region {
    pub nodes: Vec<NodeId>,
    /// Tensors the region's function was called with, held (retained) until its first node's
    /// backward is done: moved to that node's saved tensors when it is recorded.
    pub held: Vec<TensorId>,
    pub recomputed: bool,
    /// The forward's allocations and frees inside the region, in order: what the recompute
    /// replays.
    pub tape: Vec<TapeEvent>,
}

/// One step of a checkpoint region's forward, for its recompute.
#[derive(Debug, Clone)]
pub(crate) enum TapeEvent {
    /// A storage made in the region (by its serial).
    Alloc {
        serial: u64,
        shape: Vec<usize>,
        dtype: DType,
        category: Category,
    },
    /// A storage made in the region went.
    Free { serial: u64 },
    /// A node of the region saved a storage made in it: its pack hook ran, after the op for
    /// an output, before it for an input (`before`: the op's first output's storage, whose
    /// allocation the hook preceded). The recompute's early stop comes at the last it needs.
    Saved { serial: u64, before: Option<u64> },
    /// A matrix product ran (with a bias: through cuBLASLt).
    Product { with_bias: bool },
    /// A kernel ran (data devices only): what the recompute runs again.
    Launch {
        op: Op,
        inputs: Vec<(TapeRef, Layout, DType)>,
        outputs: Vec<(TapeRef, Layout, DType)>,
    },
}

/// A kernel argument on a checkpoint's tape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TapeRef {
    /// A storage made in the region, by serial (its recomputed twin has another address).
    Made(u64),
    /// A storage from outside the region, by address (alive through the recompute: a node of
    /// the region holds it).
    Outside(u64),
}

/// Checkpoint state: the region being recorded, and all regions by id.
#[derive(Debug, Clone, Default)]
pub(crate) struct Checkpoints {
    pub current: Option<u32>,
    pub regions: Vec<Region>,
}

/// The autocast state: the region's dtype and the cast cache.
#[derive(Debug, Clone, Default)]
pub struct Autocast {
    pub dtype: Option<DType>,
    /// Nesting depth of autocast regions.
    pub depth: u32,
    pub(crate) cache: BTreeMap<TensorId, TensorId>,
}

/// How FSDP2 wraps the model: the `MixedPrecisionPolicy` and `reshard_after_forward`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsdpPolicy {
    pub world_size: u64,
    /// `param_dtype` (None: the parameters' own).
    pub param_dtype: Option<DType>,
    /// `reduce_dtype` (None: the parameter dtype the gradients come in).
    pub reduce_dtype: Option<DType>,
    pub reshard_after_forward: bool,
    /// `CPUOffloadPolicy(pin_memory=True)`: the shards, their gradients and the optimizer's
    /// step on the host.
    pub offload: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct FsdpGroup {
    /// The module's parameters: unsharded, their storage dropped between uses.
    pub params: Vec<TensorId>,
    /// The sharded parameters (the optimizer's).
    pub sharded: Vec<TensorId>,
    /// The root group (the parameters outside every wrapped layer): its post-backward runs in
    /// backward's final callback.
    pub root: bool,
    pub unsharded: bool,
    /// The node that made the group's output, with its sequence number: the pre-backward hook.
    pub pre_backward: Option<(NodeId, u64)>,
    /// The alias node on the group's input: the post-backward hook.
    pub post_backward: Option<(NodeId, u64)>,
    /// The all-gather output of an unshard issued and not yet copied out (world size > 1).
    pub all_gather: Option<TensorId>,
    /// Its indices in the post-forward order (the backward prefetch's targets).
    pub post_forward_indices: Vec<usize>,
}

/// The FSDP2 state of a model.
#[derive(Debug, Clone)]
pub(crate) struct Fsdp {
    pub policy: FsdpPolicy,
    pub groups: Vec<FsdpGroup>,
    /// The last reduce-scatter input, kept until the next post-backward or the end of backward.
    pub rs_input: Option<TensorId>,
    /// In forward, the previous group's all-gather output, freed after the next group's
    /// all-gather (`comm_ctx.all_gather_state`, world size > 1).
    pub all_gather_state: Option<TensorId>,
    /// The groups in the order their forward ended.
    pub post_forward_order: Vec<usize>,
}

/// DeepSpeed ZeRO stage 1 or 2 on one rank (plain state; the behaviour is
/// [`super::zero`]'s).
#[derive(Debug, Clone)]
pub(crate) struct Zero {
    /// 1: the optimizer state partitioned; 2: the gradients too.
    pub stage: u8,
    pub world: u64,
    /// `reduce_bucket_size` in elements.
    pub bucket_elems: u64,
    /// `overlap_comm`: two buckets.
    pub overlap: bool,
    /// The trainable parameters in group order, their sizes and offsets in the flat buffer.
    pub params: Vec<TensorId>,
    pub numel: Vec<u64>,
    pub offset: Vec<u64>,
    /// Whether each overlaps rank 0's partition `[0, part)`.
    pub in_part: Vec<bool>,
    /// Elements of each rank's partition.
    pub part: u64,
    pub dtype: super::dtype::DType,
    /// The float32 master partition (the flat parameters, `bit16_groups_flat`, live on in
    /// the parameters' views of it).
    pub master: TensorId,
    /// The reduction buckets while a backward fills them (`ipg_buffer`).
    pub buckets: Vec<TensorId>,
    /// Elements in the current bucket and the parameters they came from.
    pub fill: u64,
    pub pending: Vec<usize>,
    /// `grads_in_partition`: the partition's gradients, once a bucket was reduced.
    pub grads: Option<TensorId>,
    pub grads_fill: u64,
    /// The optimizer's `exp_avg` and `exp_avg_sq` over the partition (after the first step).
    pub state: Vec<TensorId>,
    /// `offload_optimizer` to the host: what it keeps ([`ZeroOffload`]).
    pub offload: Option<ZeroOffload>,
    /// FusedAdam's `_dummy_overflow_buf` (an int32 `[0]` made with the optimizer, before
    /// ZeRO flattens anything; none with DeepSpeedCPUAdam): held, never read.
    #[allow(dead_code)]
    pub overflow_buf: Option<TensorId>,
    /// `_global_grad_norm`: the last step's norm (a float32 scalar), kept until the next step
    /// replaces it.
    pub global_norm: Option<TensorId>,
    /// Small tensors kept for the run (ZeRO-3's overflow tracker and barrier byte): held,
    /// never read.
    #[allow(dead_code)]
    pub held: Vec<TensorId>,
}

/// ZeRO's optimizer offload (`offload_optimizer.device = "cpu"`): the float32 master
/// partition, its gradient and the bit16 copy-back buffer in pinned host memory, Adam's state
/// on the host, and on the device a staging buffer and each partition gradient's norm.
#[derive(Debug, Clone, Default)]
pub(crate) struct ZeroOffload {
    /// Host tensors held to the end (the master's gradient, the bit16 buffer, the pinned
    /// gradient staging buffer).
    pub host: Vec<TensorId>,
    /// `temp_grad_buffer_for_gpu_offload`: the largest parameter's elements, on the device.
    pub gpu_buffer: Option<TensorId>,
    /// `norm_for_param_grads`: a float64 scalar per partition gradient, until the step.
    pub norms: Vec<TensorId>,
}
