//! Tensors and storages on a device whose every byte comes from the caching allocator.
//!
//! A storage is one allocation; a tensor is a storage plus a [`Layout`] and a [`DType`]. Views
//! share the storage and allocate nothing. Both are reference counted by the engine: a tensor
//! handle is held by whoever named it (a workload variable, later an autograd node); when the
//! last handle of the last tensor over a storage goes, the storage goes back to the allocator,
//! exactly when PyTorch's refcount would drop it.
//!
//! Every allocation is recorded under the allocator's current tag stack with its memory
//! [`Category`] pushed as the innermost tag, so reports can split memory by role.

use super::dtype::DType;
pub use super::graph::TensorId;
use super::graph::{Autocast, Checkpoints, Node, NodeId, TapeEvent, TapeRef};
use super::layout::{Layout, LayoutError};
use super::op::{Op, Role};
use crate::alloc::{CachingAllocator, OutOfMemory};
use crate::backend::{Buffer, Device, Launch, Pass};

pub use crate::trace::Category;

/// A kernel argument by value: address, layout, dtype.
pub(crate) type RawBuffer = (u64, Layout, DType);

#[derive(Debug, Clone)]
struct Storage {
    addr: u64,
    nbytes: u64,
    /// Bytes the allocator handed out for it (the block: rounded, maybe a whole segment).
    block: u64,
    /// Tensors over this storage.
    refs: u32,
    category: Category,
    live: bool,
    /// PyTorch's version counter: bumped by every in-place write to the storage.
    version: u32,
    /// The checkpoint region it was allocated in, if any.
    region: Option<u32>,
    /// Unique over the device's life (a storage slot is reused; its serial is not).
    serial: u64,
    /// In the host's pinned memory, not the device's (FSDP2's offloaded shards, their
    /// gradients and optimizer state): no allocator event, counted in `host_bytes`.
    host: bool,
    /// Of those, unified (managed) memory rather than pinned host memory (bitsandbytes' paged
    /// optimizer state, `cudaMallocManaged`): counted in `unified_bytes` instead.
    unified: bool,
}

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub storage: u32,
    pub layout: Layout,
    pub dtype: DType,
    pub requires_grad: bool,
    /// The autograd node that made it (None for leaves and tensors made without grad).
    pub grad_fn: Option<NodeId>,
    /// `.grad` of a leaf that requires grad.
    pub grad: Option<TensorId>,
    /// Which of its grad_fn's outputs it is.
    pub output_nr: u32,
    /// The tensor this view keeps alive (PyTorch's view base), released with it.
    pub base: Option<TensorId>,
    /// Handles held on this tensor.
    refs: u32,
    live: bool,
}

/// What can go wrong running an op.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    OutOfMemory(#[from] Box<OutOfMemory>),
    #[error("{0}")]
    Layout(#[from] LayoutError),
    #[error("{0}")]
    Invalid(String),
}

impl From<OutOfMemory> for EngineError {
    fn from(e: OutOfMemory) -> Self {
        EngineError::OutOfMemory(Box::new(e))
    }
}

/// Tensors and storages over one device's allocator.
#[derive(Debug, Clone)]
pub struct Tensors<S: Device> {
    /// Leaves in the order their gradient became final in backward, while `Some` (DDP's
    /// autograd hooks record it in its first iteration to rebuild its buckets).
    pub grad_ready: Option<Vec<TensorId>>,
    /// DDP's `gradient_as_bucket_view`: per parameter, its view of a bucket; once its gradient
    /// is final it is copied in and the view becomes its `.grad` (the gradient freed).
    pub grad_views: Option<std::collections::HashMap<TensorId, TensorId>>,
    pub alloc: CachingAllocator<S>,
    storages: Vec<Storage>,
    free_storages: Vec<u32>,
    tensors: Vec<TensorInfo>,
    free_tensors: Vec<u32>,
    /// Autograd nodes (see `autograd.rs`).
    pub(crate) nodes: Vec<Node>,
    pub(crate) free_nodes: Vec<u32>,
    /// Grad mode: false inside `no_grad`.
    pub grad_enabled: bool,
    /// Autograd nodes made so far (their sequence numbers).
    pub(crate) seq: u64,
    /// The cuBLAS workspace, once the first matrix product took it.
    pub workspace: Option<TensorId>,
    /// The cuBLASLt workspace (taken with the first cuBLAS one).
    pub lt_workspace: Option<TensorId>,
    /// The autograd thread's cuBLAS workspace, once backward's first matrix product took it.
    pub backward_workspace: Option<TensorId>,
    /// The autograd thread's cuBLASLt workspace, once a product with a bias ran there (a
    /// checkpointed region's recomputed `linear`).
    pub backward_lt_workspace: Option<TensorId>,
    /// True while backward runs: PyTorch runs it on the autograd thread, whose cuBLAS handles
    /// (and workspaces) are its own.
    pub(crate) on_autograd_thread: bool,
    /// Allocated bytes by category now (indexed by `Category as usize`).
    by_category: [u64; Category::ALL.len()],
    /// The highest allocated memory so far and the split by category at that moment.
    peak: (u64, [u64; Category::ALL.len()]),
    /// Autocast region state and cast cache.
    pub(crate) autocast: Autocast,
    /// Activation-checkpoint regions.
    pub(crate) checkpoint: Checkpoints,
    /// FSDP2's parameter groups and hooks, once `fully_shard` ran.
    pub(crate) fsdp: Option<Box<super::graph::Fsdp>>,
    /// DeepSpeed ZeRO stage 1 or 2 over the parameters ([`super::zero`]).
    pub(crate) zero: Option<Box<super::graph::Zero>>,
    /// Bytes of pinned host memory tensors hold now, and the most they held.
    pub(crate) host_bytes: (u64, u64),
    /// Unified (managed) memory held now and at most so far, outside the caching allocator.
    pub(crate) unified_bytes: (u64, u64),
    /// The stream new storages are allocated on (0, the default stream, but inside a side
    /// stream's work: FSDP's reduce-scatter output); the allocator keeps pools per stream.
    pub(crate) stream: crate::alloc::StreamId,
    /// Storages made so far (each one's serial).
    storage_serials: u64,
    /// Random draws made so far (factories, dropout): each draw's seed, so a data device
    /// draws the same numbers for the same workload.
    pub(crate) draws: u64,
    /// Whether the device computes (false on the simulated one: no launch is built).
    computes: bool,
}

impl<S: Device> Tensors<S> {
    /// Tensors and autograd nodes alive now (each costs the host a few hundred bytes, whatever
    /// its size on the device).
    pub fn live_objects(&self) -> usize {
        self.tensors.len() - self.free_tensors.len() + self.nodes.len() - self.free_nodes.len()
    }

    pub fn new(alloc: CachingAllocator<S>) -> Self {
        Tensors {
            storages: Vec::new(),
            free_storages: Vec::new(),
            tensors: Vec::new(),
            free_tensors: Vec::new(),
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            grad_enabled: true,
            seq: 0,
            workspace: None,
            backward_workspace: None,
            backward_lt_workspace: None,
            on_autograd_thread: false,
            lt_workspace: None,
            by_category: [0; Category::ALL.len()],
            peak: (0, [0; Category::ALL.len()]),
            autocast: Default::default(),
            checkpoint: Default::default(),
            fsdp: None,
            zero: None,
            stream: 0,
            host_bytes: (0, 0),
            unified_bytes: (0, 0),
            storage_serials: 0,
            draws: 0,
            grad_ready: None,
            grad_views: None,
            computes: alloc.source().computes(),
            alloc,
        }
    }

    /// Whether the device computes real values.
    pub fn computes(&self) -> bool {
        self.computes
    }

    /// The next seed for a random draw.
    pub(crate) fn next_seed(&mut self) -> u64 {
        self.draws += 1;
        self.draws
    }

    pub fn info(&self, t: TensorId) -> &TensorInfo {
        &self.tensors[t.0 as usize]
    }

    pub fn shape(&self, t: TensorId) -> &[usize] {
        &self.info(t).layout.shape
    }

    pub fn dtype(&self, t: TensorId) -> DType {
        self.info(t).dtype
    }

    /// Bytes the tensor's elements take (not its storage's).
    pub fn nbytes(&self, t: TensorId) -> u64 {
        self.info(t).layout.numel() as u64 * self.dtype(t).size()
    }

    /// The storage's device address (0 for an empty storage) and size.
    pub fn storage_of(&self, t: TensorId) -> (u64, u64, Category) {
        let s = &self.storages[self.info(t).storage as usize];
        (s.addr, s.nbytes, s.category)
    }

    /// Live tensors (handles held).
    pub fn live_tensors(&self) -> usize {
        self.tensors.iter().filter(|t| t.live).count()
    }

    /// A new contiguous tensor with a fresh storage of `numel * dtype.size()` bytes.
    pub fn empty(
        &mut self,
        shape: &[usize],
        dtype: DType,
        category: Category,
    ) -> Result<TensorId, EngineError> {
        let nbytes = crate::engine::layout::storage_nbytes(shape, dtype.size())?;
        let (addr, block) = self.malloc_counted(nbytes, category)?;
        let storage = Storage {
            addr,
            nbytes,
            block,
            refs: 0,
            category,
            live: true,
            version: 0,
            region: self.checkpoint.current,
            serial: self.storage_serials,
            host: false,
            unified: false,
        };
        // (a cuBLAS workspace belongs to its thread's handle, not to the region's forward)
        if let (Some(r), false) = (self.checkpoint.current, category == Category::Workspace) {
            let ev = TapeEvent::Alloc {
                serial: self.storage_serials,
                shape: shape.to_vec(),
                dtype,
                category,
            };
            self.checkpoint.regions[r as usize].tape.push(ev);
        }
        self.storage_serials += 1;
        Ok(self.contiguous_over(storage, shape, dtype))
    }

    /// A contiguous tensor of `shape` over a new storage slot holding `storage`.
    fn contiguous_over(&mut self, storage: Storage, shape: &[usize], dtype: DType) -> TensorId {
        let sid = match self.free_storages.pop() {
            Some(i) => {
                self.storages[i as usize] = storage;
                i
            }
            None => {
                self.storages.push(storage);
                (self.storages.len() - 1) as u32
            }
        };
        let t = self.new_tensor(sid, dtype, false);
        self.tensors[t.0 as usize].layout.set_contiguous(shape);
        t
    }

    /// A new contiguous tensor in pinned host memory (`torch.empty(..., pin_memory=True)`):
    /// no allocator event; its bytes count in [`Self::host_memory`].
    pub fn host_empty(
        &mut self,
        shape: &[usize],
        dtype: DType,
        category: Category,
    ) -> Result<TensorId, EngineError> {
        self.off_device(shape, dtype, category, false)
    }

    /// A host-side storage counted in pinned host memory, or (`unified`) in unified memory.
    fn off_device(
        &mut self,
        shape: &[usize],
        dtype: DType,
        category: Category,
        unified: bool,
    ) -> Result<TensorId, EngineError> {
        let t = self.memoryless(shape, dtype, category, true)?;
        let sid = self.info(t).storage as usize;
        self.storages[sid].unified = unified;
        let n = self.storages[sid].nbytes;
        let counter = if unified {
            &mut self.unified_bytes
        } else {
            &mut self.host_bytes
        };
        counter.0 += n;
        counter.1 = counter.1.max(counter.0);
        Ok(t)
    }

    /// `cudaMallocManaged` memory (bitsandbytes' `get_paged`): no allocator event; the driver
    /// pages it between host and device, so it is counted apart from both.
    pub fn unified_empty(
        &mut self,
        shape: &[usize],
        dtype: DType,
        category: Category,
    ) -> Result<TensorId, EngineError> {
        self.off_device(shape, dtype, category, true)
    }

    /// Unified memory held now and at most so far (bytes).
    pub fn unified_memory(&self) -> (u64, u64) {
        self.unified_bytes
    }

    /// A tensor whose storage holds no device memory: on the host (`host`) or nowhere (meta).
    fn memoryless(
        &mut self,
        shape: &[usize],
        dtype: DType,
        category: Category,
        host: bool,
    ) -> Result<TensorId, EngineError> {
        let nbytes = crate::engine::layout::storage_nbytes(shape, dtype.size())?;
        let storage = Storage {
            addr: 0,
            nbytes,
            block: 0,
            refs: 0,
            category,
            live: true,
            version: 0,
            region: None,
            serial: self.storage_serials,
            host,
            unified: false,
        };
        self.storage_serials += 1;
        Ok(self.contiguous_over(storage, shape, dtype))
    }

    /// A new contiguous tensor on the meta device (`torch.device("meta")`): shape and dtype,
    /// no memory anywhere; a storage that can grow on the device later (FSDP2's sharding of a
    /// model built on meta).
    pub fn meta_empty(
        &mut self,
        shape: &[usize],
        dtype: DType,
        category: Category,
    ) -> Result<TensorId, EngineError> {
        self.memoryless(shape, dtype, category, false)
    }

    /// Whether the tensor lives in host memory.
    pub fn is_host(&self, t: TensorId) -> bool {
        self.storages[self.info(t).storage as usize].host
    }

    /// A new contiguous tensor where `beside` lives (the host or the device).
    pub fn empty_beside(
        &mut self,
        beside: TensorId,
        shape: &[usize],
        dtype: DType,
        category: Category,
    ) -> Result<TensorId, EngineError> {
        if self.is_host(beside) {
            self.host_empty(shape, dtype, category)
        } else {
            self.empty(shape, dtype, category)
        }
    }

    /// Pinned host memory held now and at most so far (bytes).
    pub fn host_memory(&self) -> (u64, u64) {
        self.host_bytes
    }

    /// `nbytes` from the allocator on the current stream under `category`'s tag, counted in
    /// the category and the peak: the block's address and the bytes it took.
    fn malloc_counted(
        &mut self,
        nbytes: u64,
        category: Category,
    ) -> Result<(u64, u64), EngineError> {
        let rec = self.alloc.recorder_mut();
        rec.push_static(category.tag());
        let before = self.alloc.stats().allocated_bytes.all().current;
        let r = self.alloc.malloc(nbytes, self.stream);
        self.alloc.recorder_mut().pop_tag();
        let addr = r?;
        let block = (self.alloc.stats().allocated_bytes.all().current - before) as u64;
        self.by_category[category as usize] += block;
        let allocated = self.alloc.stats().allocated_bytes.all().current as u64;
        if allocated > self.peak.0 {
            self.peak = (allocated, self.by_category);
        }
        Ok((addr, block))
    }

    /// A new tensor over `storage`, its layout left to the caller to set. The slot's record
    /// is written in place (a freed tensor's layout keeps its inline room), not built and
    /// moved: tensors are made several times per allocator event.
    fn new_tensor(&mut self, storage: u32, dtype: DType, requires_grad: bool) -> TensorId {
        self.storages[storage as usize].refs += 1;
        let id = match self.free_tensors.pop() {
            Some(i) => i,
            None => {
                self.tensors.push(TensorInfo {
                    storage,
                    layout: Layout::contiguous(&[]),
                    dtype,
                    requires_grad,
                    grad_fn: None,
                    grad: None,
                    output_nr: 0,
                    base: None,
                    refs: 1,
                    live: true,
                });
                (self.tensors.len() - 1) as u32
            }
        };
        let info = &mut self.tensors[id as usize];
        info.storage = storage;
        info.dtype = dtype;
        info.requires_grad = requires_grad;
        info.grad_fn = None;
        info.grad = None;
        info.output_nr = 0;
        info.base = None;
        info.refs = 1;
        info.live = true;
        TensorId(id)
    }

    /// A view: a new tensor over the same storage with `layout`. Allocates nothing.
    pub fn view_with(&mut self, t: TensorId, layout: Layout) -> TensorId {
        let (storage, dtype, rg) = {
            let i = self.info(t);
            (i.storage, i.dtype, i.requires_grad)
        };
        let v = self.new_tensor(storage, dtype, rg);
        self.tensors[v.0 as usize].layout = layout;
        v
    }

    pub fn set_requires_grad(&mut self, t: TensorId, on: bool) {
        self.tensors[t.0 as usize].requires_grad = on;
    }

    /// A storage's role changed (e.g. a temporary is saved for backward: an activation).
    pub(crate) fn recategorize(&mut self, t: TensorId, to: Category) {
        let sid = self.info(t).storage as usize;
        let s = &mut self.storages[sid];
        if s.category != to {
            self.by_category[s.category as usize] -= s.block;
            self.by_category[to as usize] += s.block;
            s.category = to;
            let addr = s.addr;
            if s.block > 0 {
                // tell the trace, so analyses of it see the role the engine sees
                let rec = self.alloc.recorder_mut();
                rec.push_static(to.tag());
                rec.record(crate::trace::EventKind::Retag, addr, 0, 0);
                rec.pop_tag();
            }
        }
    }

    /// Moves storages to other blocks: each `(from, to, nbytes)` puts the live storage at
    /// address `from` at `to`, `nbytes` long, in the block the allocator has there (a
    /// generation's fast-forward made those blocks: [`crate::alloc::fastforward`]). Its
    /// tensors keep their shapes.
    pub(crate) fn relocate(&mut self, moves: &[(u64, u64, u64)]) {
        let to: rustc_hash::FxHashMap<u64, (u64, u64)> =
            moves.iter().map(|&(f, t, n)| (f, (t, n))).collect();
        for s in self.storages.iter_mut().filter(|s| s.live && !s.host) {
            if let Some(&(addr, nbytes)) = to.get(&s.addr) {
                let block = self.alloc.block_size_at(addr).unwrap_or(s.block);
                self.by_category[s.category as usize] -= s.block;
                self.by_category[s.category as usize] += block;
                s.addr = addr;
                s.nbytes = nbytes;
                s.block = block;
            }
        }
    }

    /// Allocated bytes by category now.
    pub fn by_category(&self) -> Vec<(Category, u64)> {
        Category::ALL
            .iter()
            .map(|&c| (c, self.by_category[c as usize]))
            .collect()
    }

    /// The highest allocated memory since the last [`Tensors::reset_peak`] and what it held, by
    /// category.
    pub fn peak_by_category(&self) -> (u64, Vec<(Category, u64)>) {
        (
            self.peak.0,
            Category::ALL
                .iter()
                .map(|&c| (c, self.peak.1[c as usize]))
                .collect(),
        )
    }

    pub fn reset_peak(&mut self) {
        let now = self.alloc.stats().allocated_bytes.all().current as u64;
        self.peak = (now, self.by_category);
    }

    /// Runs `op` forward on the device: its inputs, and its outputs followed by its extras.
    pub fn launch(
        &mut self,
        op: &Op,
        inputs: &[TensorId],
        outputs: &[TensorId],
    ) -> Result<(), EngineError> {
        if !self.computes {
            return Ok(());
        }
        self.tape_launch(op, Pass::Forward, inputs, outputs);
        self.run_launch(op, Pass::Forward, inputs, outputs, &[])
    }

    /// Runs the gradient of `op`'s input `input`: `inputs[0]` the incoming gradient (or, for a
    /// split, every part's), `output` the gradient to write, `saved` the node's tensors.
    pub(crate) fn launch_grad(
        &mut self,
        op: &Op,
        input: usize,
        inputs: &[TensorId],
        output: TensorId,
        saved: &[(Role, TensorId)],
    ) -> Result<(), EngineError> {
        if !self.computes {
            return Ok(());
        }
        self.run_launch(op, Pass::Grad { input }, inputs, &[output], saved)
    }

    fn run_launch(
        &mut self,
        op: &Op,
        pass: Pass,
        inputs: &[TensorId],
        outputs: &[TensorId],
        saved: &[(Role, TensorId)],
    ) -> Result<(), EngineError> {
        // the device lives in the allocator: the buffers' layouts are copied out of the
        // tensor table first (only data devices get here)
        let ins: Vec<_> = inputs.iter().map(|&t| self.raw(t)).collect();
        let outs: Vec<_> = outputs.iter().map(|&t| self.raw(t)).collect();
        let sv: Vec<_> = saved.iter().map(|&(r, t)| (r, self.raw(t))).collect();
        self.launch_raw(op, pass, &ins, &outs, &sv)
    }

    /// A tensor as a kernel argument: address, layout, dtype.
    pub(crate) fn raw(&self, t: TensorId) -> RawBuffer {
        let i = self.info(t);
        (
            self.storages[i.storage as usize].addr,
            i.layout.clone(),
            i.dtype,
        )
    }

    /// Runs a kernel on buffers given by address (a checkpoint's recompute replays them).
    pub(crate) fn launch_raw(
        &mut self,
        op: &Op,
        pass: Pass,
        ins: &[RawBuffer],
        outs: &[RawBuffer],
        saved: &[(Role, RawBuffer)],
    ) -> Result<(), EngineError> {
        fn buf(r: &RawBuffer) -> Buffer<'_> {
            Buffer {
                addr: r.0,
                layout: &r.1,
                dtype: r.2,
            }
        }
        let ins: Vec<Buffer> = ins.iter().map(buf).collect();
        let outs: Vec<Buffer> = outs.iter().map(buf).collect();
        let sv: Vec<(Role, Buffer)> = saved.iter().map(|(r, o)| (*r, buf(o))).collect();
        // the cuBLAS workspace of the launch's thread, as ensure_cublas_workspace took it
        // (the device gives it to the products)
        let ws = if self.on_autograd_thread {
            self.backward_workspace
        } else {
            self.workspace
        }
        .map(|t| self.raw(t));
        let l = Launch {
            op,
            pass,
            inputs: &ins,
            outputs: &outs,
            saved: &sv,
            workspace: ws.as_ref().map(buf),
        };
        let r = self.alloc.source_mut().launch(&l);
        r.map_err(|e| {
            EngineError::Invalid(format!(
                "{} device: {}: {e}",
                self.alloc.source().name(),
                op.name()
            ))
        })
    }

    /// Inside a checkpoint region on a data device, the forward's kernels go on the region's
    /// tape with their buffers (by storage serial when made in the region, else by address),
    /// so the recompute can run them again.
    fn tape_launch(&mut self, op: &Op, pass: Pass, inputs: &[TensorId], outputs: &[TensorId]) {
        let Some(r) = self.checkpoint.current else {
            return;
        };
        let tref = |s: &Self, t: TensorId| {
            let i = s.info(t);
            let st = &s.storages[i.storage as usize];
            let at = if st.region == Some(r) {
                TapeRef::Made(st.serial)
            } else {
                TapeRef::Outside(st.addr)
            };
            (at, i.layout.clone(), i.dtype)
        };
        let ins = inputs.iter().map(|&t| tref(self, t)).collect();
        let outs = outputs.iter().map(|&t| tref(self, t)).collect();
        let _ = pass;
        self.checkpoint.regions[r as usize]
            .tape
            .push(TapeEvent::Launch {
                op: op.clone(),
                inputs: ins,
                outputs: outs,
            });
    }

    /// A tensor's values (None on a device without data).
    pub fn read(&self, t: TensorId) -> Result<Option<Vec<f64>>, EngineError> {
        let (addr, layout, dtype) = self.raw(t);
        self.alloc
            .source()
            .read(&Buffer {
                addr,
                layout: &layout,
                dtype,
            })
            .map_err(EngineError::Invalid)
    }

    /// Writes values into a tensor (weights and batches from files; a no-op without data).
    pub fn write(&mut self, t: TensorId, values: &[f64]) -> Result<(), EngineError> {
        if !self.computes {
            return Ok(());
        }
        let i = self.info(t).clone();
        let b = Buffer {
            addr: self.storages[i.storage as usize].addr,
            layout: &i.layout,
            dtype: i.dtype,
        };
        self.alloc
            .source_mut()
            .write(&b, values)
            .map_err(EngineError::Invalid)
    }

    /// The checkpoint region the tensor's storage was allocated in.
    pub(crate) fn storage_serial(&self, t: TensorId) -> u64 {
        self.storages[self.info(t).storage as usize].serial
    }

    pub(crate) fn set_region(&mut self, t: TensorId, r: u32) {
        let sid = self.info(t).storage as usize;
        self.storages[sid].region = Some(r);
    }

    pub(crate) fn made_in_region(&self, t: TensorId) -> Option<u32> {
        self.storages[self.info(t).storage as usize].region
    }

    /// The storage's version counter (shared with every view of it).
    pub fn version(&self, t: TensorId) -> u32 {
        self.storages[self.info(t).storage as usize].version
    }

    /// An in-place op wrote into the tensor (`add_`, `relu_`...): nothing is allocated, but
    /// any node that saved this storage can no longer compute its gradient.
    pub fn bump_version(&mut self, t: TensorId) {
        let sid = self.info(t).storage as usize;
        self.storages[sid].version += 1;
    }

    pub(crate) fn info_mut(&mut self, t: TensorId) -> &mut TensorInfo {
        &mut self.tensors[t.0 as usize]
    }

    /// Whether the tensor is a leaf of the graph (made by the user, not by a recorded op).
    pub fn is_leaf(&self, t: TensorId) -> bool {
        self.info(t).grad_fn.is_none()
    }

    /// `.grad` of a leaf.
    pub fn grad(&self, t: TensorId) -> Option<TensorId> {
        self.info(t).grad
    }

    /// PyTorch's test before it reuses a gradient's memory in place: this is the only handle on
    /// the tensor, the tensor the only one on its storage, and its layout dense.
    pub(crate) fn sole_owner(&self, t: TensorId) -> bool {
        let i = self.info(t);
        i.refs == 1 && self.storages[i.storage as usize].refs == 1 && i.layout.is_dense()
    }

    /// Handles on the tensor.
    pub(crate) fn handles(&self, t: TensorId) -> u32 {
        self.info(t).refs
    }

    /// Another handle on the same tensor.
    pub fn retain(&mut self, t: TensorId) -> TensorId {
        self.tensors[t.0 as usize].refs += 1;
        t
    }

    /// [`Tensors::release`] for each handle, in order.
    pub fn release_all(&mut self, ts: impl IntoIterator<Item = TensorId>) {
        for t in ts {
            self.release(t);
        }
    }

    /// Drops a handle; the tensor goes with its last handle, its storage with its last tensor.
    pub fn release(&mut self, t: TensorId) {
        let info = &mut self.tensors[t.0 as usize];
        debug_assert!(info.live && info.refs > 0, "release of a dead tensor");
        info.refs -= 1;
        if info.refs > 0 {
            return;
        }
        info.live = false;
        let sid = info.storage;
        let (grad_fn, grad, base) = (info.grad_fn.take(), info.grad.take(), info.base.take());
        self.free_tensors.push(t.0);
        if let Some(g) = grad {
            self.release(g);
        }
        if let Some(n) = grad_fn {
            self.node_decref(n);
        }
        let s = &mut self.storages[sid as usize];
        s.refs -= 1;
        if s.refs == 0 && s.host {
            s.live = false;
            s.host = false;
            let n = s.nbytes;
            if std::mem::take(&mut s.unified) {
                self.unified_bytes.0 -= n;
            } else {
                self.host_bytes.0 -= n;
            }
            self.free_storages.push(sid);
        } else if s.refs == 0 {
            s.live = false;
            let addr = s.addr;
            if let (Some(r), Some(made)) = (self.checkpoint.current, s.region) {
                if r == made {
                    let serial = s.serial;
                    let ev = TapeEvent::Free { serial };
                    self.checkpoint.regions[r as usize].tape.push(ev);
                }
            }
            let s = &mut self.storages[sid as usize];
            self.by_category[s.category as usize] -= s.block;
            self.free_storages.push(sid);
            self.alloc
                .free(addr)
                .expect("a live storage's address is allocated");
        }
        if let Some(b) = base {
            self.release(b);
        }
    }

    /// `untyped_storage().resize_(0)` (FSDP's `free_storage`): the storage's memory goes back
    /// to the allocator now; its tensors stay, sized but without memory, until
    /// [`Self::storage_regrow`]. Nothing is freed again when they go.
    pub(crate) fn storage_drop(&mut self, t: TensorId) {
        let sid = self.info(t).storage as usize;
        let s = &mut self.storages[sid];
        if s.host {
            // (a host storage's memory goes back to the host)
            s.host = false;
            let n = s.nbytes;
            self.host_bytes.0 -= n;
            return;
        }
        if s.addr == 0 {
            return;
        }
        let (addr, block, category) = (s.addr, s.block, s.category);
        s.addr = 0;
        s.block = 0;
        self.by_category[category as usize] -= block;
        self.alloc
            .free(addr)
            .expect("a live storage's address is allocated");
    }

    /// `untyped_storage().resize_(n)` back from zero (FSDP's `alloc_storage`): fresh memory
    /// for the storage of `t`, sized by its layout and dtype now, under `category`.
    pub(crate) fn storage_regrow(
        &mut self,
        t: TensorId,
        category: Category,
    ) -> Result<(), EngineError> {
        let (shape, dtype) = (self.shape(t).to_vec(), self.dtype(t));
        let nbytes = crate::engine::layout::storage_nbytes(&shape, dtype.size())?;
        self.storage_regrow_bytes(t, nbytes, category)
    }

    /// [`Self::storage_regrow`] to `nbytes` (a view of a larger buffer: FSDP's unsharded
    /// parameter over its padded all-gather output).
    pub(crate) fn storage_regrow_bytes(
        &mut self,
        t: TensorId,
        nbytes: u64,
        category: Category,
    ) -> Result<(), EngineError> {
        let sid = self.info(t).storage as usize;
        if self.storages[sid].addr != 0 {
            return Ok(());
        }
        let (addr, block) = self.malloc_counted(nbytes, category)?;
        let s = &mut self.storages[sid];
        s.addr = addr;
        s.nbytes = nbytes;
        s.block = block;
        s.category = category;
        Ok(())
    }

    /// Changes the dtype of a tensor whose storage holds no memory now (FSDP's unsharded
    /// parameter in the mixed-precision policy's `param_dtype`).
    pub(crate) fn retype_dropped(&mut self, t: TensorId, dtype: DType) {
        debug_assert_eq!(self.storage_of(t).0, 0, "only a dropped storage is retyped");
        self.info_mut(t).dtype = dtype;
    }

    /// `contiguous()`: the tensor itself (another handle) when already contiguous, else a copy.
    pub fn contiguous(&mut self, t: TensorId, category: Category) -> Result<TensorId, EngineError> {
        if self.info(t).layout.is_contiguous() {
            return Ok(self.retain(t));
        }
        self.clone_tensor(t, category)
    }

    /// `clone()`: always a fresh contiguous copy.
    pub fn clone_tensor(
        &mut self,
        t: TensorId,
        category: Category,
    ) -> Result<TensorId, EngineError> {
        let (shape, dtype) = (self.shape(t).to_vec(), self.dtype(t));
        self.empty(&shape, dtype, category)
    }

    /// `reshape(shape)`: a view when the strides allow one, else a contiguous copy.
    pub fn reshape(
        &mut self,
        t: TensorId,
        shape: &[i64],
        category: Category,
    ) -> Result<TensorId, EngineError> {
        let (new_shape, view) = self.info(t).layout.reshape(shape)?;
        match view {
            Some(l) => Ok(self.view_with(t, l)),
            None => {
                let dtype = self.dtype(t);
                self.empty(&new_shape, dtype, category)
            }
        }
    }
}

/// What the engine's unit tests share.
#[cfg(test)]
pub(crate) mod testing {
    use super::Tensors;
    use crate::alloc::{AllocConf, SimAllocator, SimSource};
    use crate::units::GIB;

    /// A 24 GiB simulated device with PyTorch's default allocator settings.
    pub(crate) fn dev() -> Tensors<SimSource> {
        Tensors::new(SimAllocator::new(
            AllocConf::default(),
            SimSource::new(24 * GIB, 0),
        ))
    }

    /// Allocated bytes now.
    pub(crate) fn allocated(d: &Tensors<SimSource>) -> i64 {
        d.alloc.stats().allocated_bytes.all().current
    }
}

#[cfg(test)]
#[path = "tensor_tests.rs"]
mod tests;
