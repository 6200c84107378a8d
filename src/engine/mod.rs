//! The tensor engine: element types, layouts with PyTorch's view rules, tensors over storages
//! that come from the caching allocator, the ops, autograd, autocast, checkpointing and the
//! optimizers. It decides what is allocated, saved and freed, exactly when PyTorch would; the
//! device it runs on ([`crate::backend`]) holds the data and runs the kernels.
//!
//! - [`dtype`]: element types and their sizes.
//! - [`layout`]: shape, strides and offset; view, reshape, slice, select, transpose, permute,
//!   expand, split and chunk as ATen computes them.
//! - [`op`]: every op, defined once (plain data: attributes, kernels, autocast policy, saves,
//!   backward); the script language's function table ([`op::script`]).
//! - [`graph`]: ids, graph nodes and saved tensors, checkpoint tapes, the autocast region: plain
//!   data, below everything that acts on it (the modules form no import cycle).
//! - [`tensor`]: tensors and storages over the caching allocator, reference counted, with the
//!   memory category of each allocation in its tag stack; kernel launches.
//! - [`exec`]: running ops forward (allocation order, kernels, the node each records).
//! - [`inplace`]: in-place ops, and the history they rebase in the autograd graph.
//! - [`autograd`]: recording nodes and backward (each op's [`op::GradPlan`] carried out).
//! - [`checkpoint`]: activation checkpoints: dropped in the forward, recomputed in backward.
//! - [`workspace`]: the CUDA libraries' workspaces and scratch, as named notes.
//! - [`reduction`]: the reduction kernel's staging buffer and semaphores, by its launch rule.
//! - [`autocast`]: casts and the cast cache of `torch.autocast`.
//! - [`optim`]: SGD, momentum, Adam and AdamW: state, temporaries, updates.
//! - [`fsdp`]: FSDP2's sharded and unsharded parameters and the hooks that move between them.
//! - [`zero`]: DeepSpeed ZeRO stages 1 and 2: the flat parameters, the float32 master
//!   partition, the gradient buckets and the partitioned step.

pub mod autocast;
pub mod autograd;
pub mod checkpoint;
pub mod dtype;
pub mod exec;
mod formulas;
pub mod fsdp;
pub mod graph;
pub mod inplace;
pub mod layout;
pub mod op;
pub mod optim;
pub mod reduction;
pub mod routing;
pub mod sdpa;
pub mod tensor;
pub mod workspace;
pub mod zero;
mod zero3;

pub use dtype::DType;

/// The device whose launch configurations the kernels' scratch follows (an H200, where the
/// ground truth was recorded): its streaming multiprocessors and resident threads per
/// multiprocessor. Grid sizes, and with them some buffers' sizes, are computed from these.
pub const SMS: usize = 132;
pub const THREADS_PER_SM: usize = 2048;
pub use layout::{Layout, LayoutError};
pub use tensor::{Category, EngineError, TensorId, Tensors};
