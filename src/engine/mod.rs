//! The tensor engine (issue 3, in progress): element types, layouts with PyTorch's view rules,
//! and tensors over storages that come from the caching allocator. Autograd, the ops and the
//! backends (sim, cpu, cuda) build on these next.
//!
//! - [`dtype`]: element types and their sizes.
//! - [`layout`]: shape, strides and offset; view, reshape, slice, select, transpose, permute,
//!   expand, split and chunk as ATen computes them.
//! - [`tensor`]: tensors and storages over the caching allocator, reference counted, with the
//!   memory category of each allocation in its tag stack.

pub mod autocast;
pub mod autograd;
pub mod backend;
pub mod dtype;
pub mod layout;
pub mod ops;
pub mod optim;
pub mod tensor;

pub use backend::{Backend, Buffer, SimBackend};
pub use dtype::DType;
pub use layout::{Layout, LayoutError};
pub use tensor::{Category, EngineError, TensorId, Tensors};
