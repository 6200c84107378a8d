//! Autograd, for memory: which tensors a recorded op keeps for its backward, how long the
//! graph lives, and what backward allocates and frees.
//!
//! A node is made when an op runs with grad enabled and an input requires grad. It holds the
//! tensors the op's derivative needs (saved tensors, as PyTorch's `SavedVariable`s: an output
//! is saved without its grad_fn, so no cycle keeps the graph alive) and an edge per input: to
//! the node that made it, or to the leaf whose `.grad` it accumulates into (holding the leaf,
//! as `AccumulateGrad` does). Nodes are reference counted by the tensors they made and by the
//! nodes downstream; the graph, and every activation it saved, lives exactly as long as some
//! tensor made by it does: a `loss` kept in a list keeps the whole forward pass alive.
//!
//! Activation checkpoints (what a region's nodes drop and how backward recomputes them) are in
//! [`super::checkpoint`]; derivatives made of several ops and a node's scratch steps in
//! [`super::formulas`]; the CUDA libraries' scratch in [`super::workspace`].
//!
//! Backward runs ready nodes newest first (PyTorch's sequence-number order), allocates one
//! gradient per differentiable input, frees each incoming gradient after use and, unless
//! `retain_graph`, each node's saved tensors right after the node ran.

use rustc_hash::FxHashMap as HashMap;

/// A node's incoming gradients, one slot per output (most ops have one or two).
type GradSlots = smallvec::SmallVec<[Option<TensorId>; 2]>;

use super::dtype::DType;
use super::graph::{Edge, Node, NodeId, Saved};
pub use super::op::{Back, Save};
use super::op::{Binary, Fill, Op, Role};
use super::tensor::{Category, EngineError, TensorId, Tensors};
use crate::backend::Device;

/// Nodes whose gradients are all in, newest (highest sequence number) first.
#[derive(Default)]
struct Ready(std::collections::BinaryHeap<(u64, u32)>);

impl Ready {
    fn push<S: Device>(&mut self, t: &Tensors<S>, n: NodeId) {
        self.0.push((t.nodes[n.0 as usize].seq, n.0));
    }

    fn pop(&mut self) -> Option<NodeId> {
        self.0.pop().map(|(_, n)| NodeId(n))
    }
}

/// Gradients of leaves waiting for the rest of their contributions.
struct Leaves {
    pending: HashMap<TensorId, u32>,
    buffers: HashMap<TensorId, TensorId>,
}

impl<S: Device> Tensors<S> {
    /// Records `op` if grad mode is on and an input requires grad: the outputs get a grad_fn
    /// and require grad, and the node keeps what `saves` names.
    pub fn record(&mut self, op: &Op, inputs: &[TensorId], outputs: &[TensorId], saves: &[Save]) {
        if !self.grad_enabled || !inputs.iter().any(|&t| self.info(t).requires_grad) {
            return;
        }
        self.record_node(op, inputs, outputs, saves);
    }

    pub(crate) fn record_node(
        &mut self,
        op: &Op,
        inputs: &[TensorId],
        outputs: &[TensorId],
        saves: &[Save],
    ) {
        let needs = |s: &Self, i: usize| s.info(inputs[i]).requires_grad;
        let mut saved: Vec<(TensorId, Role)> = Vec::with_capacity(saves.len() + outputs.len());
        for s in saves {
            match *s {
                Save::Input(i) => saved.push((self.save(inputs[i]), Role::Input(i))),
                Save::InputFor(i, j) => {
                    if needs(self, j) {
                        saved.push((self.save(inputs[i]), Role::Input(i)));
                    }
                }
                Save::Output => {
                    for &o in outputs {
                        let l = self.info(o).layout.clone();
                        let h = self.view_with(o, l);
                        self.set_requires_grad(h, false);
                        self.recategorize(h, Category::Activation);
                        saved.push((h, Role::Output));
                    }
                }
            }
        }
        let in_ndim = inputs.first().map_or(0, |&t| self.info(t).layout.ndim());
        let same_shape = match (inputs.first(), outputs.first()) {
            (Some(&i), Some(&o)) => self.shape(i) == self.shape(o),
            _ => false,
        };
        let mut next = Vec::with_capacity(inputs.len());
        let mut input_meta = Vec::with_capacity(inputs.len());
        for &t in inputs {
            let info = self.info(t);
            input_meta.push((info.layout.shape.to_vec(), info.dtype));
            let edge = match (info.grad_fn, info.requires_grad) {
                (Some(n), _) => {
                    let slot = info.output_nr;
                    self.node_mut(n).refs += 1;
                    Edge::Node(n, slot)
                }
                (None, true) => Edge::Leaf(self.retain(t)),
                (None, false) => Edge::None,
            };
            next.push(edge);
        }
        // a checkpoint region's first node that saves anything takes what the region holds,
        // released first: PyTorch frees the checkpoint's arguments with the region's last
        // saved tensor (an RMSNorm's float32 cast saves nothing; its `pow` does)
        if let Some(r) = self.checkpoint.current.filter(|_| !saved.is_empty()) {
            let held = std::mem::take(&mut self.checkpoint.regions[r as usize].held);
            if !held.is_empty() {
                let mut all: Vec<(TensorId, Role)> =
                    held.into_iter().map(|t| (t, Role::Held)).collect();
                all.append(&mut saved);
                saved = all;
            }
        }
        self.seq += 1;
        let had_saved = !saved.is_empty();
        let saved = saved
            .into_iter()
            .map(|(t, role)| Saved {
                t,
                version: self.version(t),
                role,
            })
            .collect();
        let node = Node {
            op: op.clone(),
            saved,
            next,
            input_meta,
            seq: self.seq,
            refs: outputs.len() as u32,
            live: true,
            released: false,
            had_saved,
            back: op.back(in_ndim, same_shape),
            outputs: outputs.len() as u32,
            out_shapes: Vec::new(),
            region: self.checkpoint.current,
            deferred: Vec::new(),
        };
        let id = match self.free_nodes.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        for (k, &o) in outputs.iter().enumerate() {
            let info = self.info_mut(o);
            info.grad_fn = Some(NodeId(id));
            info.output_nr = k as u32;
            info.requires_grad = true;
        }
        if let Some(r) = self.checkpoint.current {
            self.checkpoint.regions[r as usize].nodes.push(NodeId(id));
            // Inside a (non-reentrant) checkpoint, the saved-tensor hooks keep nothing made in
            // the region: such a tensor goes as soon as nothing else holds it, and backward
            // recomputes it. What came from outside (the region's inputs, parameters) stays.
            let first_out = outputs.first().map(|&o| self.storage_serial(o));
            self.drop_region_saved(NodeId(id), r, true, first_out);
        }
    }

    /// Adds `t` (an op's extra output kept for backward: layer_norm's mean and rstd, a loss's
    /// weight total, attention's statistics) to what `node` saves, with its version, so a
    /// checkpoint region drops and recomputes it like any saved tensor.
    pub(crate) fn save_extra(&mut self, node: NodeId, t: TensorId, role: Role) {
        let region = self.nodes[node.0 as usize].region;
        if let Some(r) = region.filter(|&r| self.made_in_region(t) == Some(r)) {
            // a checkpoint's pack hook keeps only what is needed to recompute it
            let serial = self.storage_serial(t);
            let key = (serial, role, self.info(t).layout.clone());
            self.node_mut(node).deferred.push(key);
            self.checkpoint.regions[r as usize]
                .tape
                .push(super::graph::TapeEvent::Saved {
                    serial,
                    before: None,
                });
            self.release(t);
            return;
        }
        let version = self.version(t);
        self.node_mut(node).saved.push(Saved { t, version, role });
    }

    /// A handle for a node's saved tensors; a temporary saved for backward becomes an activation
    /// (parameters and inputs keep their category).
    fn save(&mut self, t: TensorId) -> TensorId {
        let (_, _, cat) = self.storage_of(t);
        if cat == Category::Temporary {
            self.recategorize(t, Category::Activation);
        }
        self.retain(t)
    }

    pub(crate) fn node_mut(&mut self, n: NodeId) -> &mut Node {
        &mut self.nodes[n.0 as usize]
    }

    /// Drops a reference to a node; the last one frees its saved tensors and its edges.
    pub(crate) fn node_decref(&mut self, n: NodeId) {
        let node = self.node_mut(n);
        node.refs -= 1;
        if node.refs > 0 {
            return;
        }
        node.live = false;
        let saved = std::mem::take(&mut node.saved);
        let next = std::mem::take(&mut node.next);
        self.free_nodes.push(n.0);
        for sv in saved {
            self.release(sv.t);
        }
        for e in next {
            match e {
                Edge::Node(m, _) => self.node_decref(m),
                Edge::Leaf(t) => self.release(t),
                Edge::None => {}
            }
        }
    }

    /// Tensors currently held by graph nodes as saved for backward.
    pub fn saved_tensors(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.live)
            .map(|n| n.saved.len())
            .sum()
    }

    /// `root.backward(retain_graph=...)` for a scalar (or any) root: allocates its gradient of
    /// ones, runs every reachable node, accumulates into leaves' `.grad`.
    pub fn backward(&mut self, root: TensorId, retain_graph: bool) -> Result<(), EngineError> {
        let was = std::mem::replace(&mut self.on_autograd_thread, true);
        let r = self.backward_on_autograd_thread(root, retain_graph);
        self.on_autograd_thread = was;
        r?;
        // DeepSpeed's engine reduces what is left once `loss.backward()` returns
        self.zero_after_backward()
    }

    fn backward_on_autograd_thread(
        &mut self,
        root: TensorId,
        retain_graph: bool,
    ) -> Result<(), EngineError> {
        let Some(root_fn) = self.info(root).grad_fn else {
            return Err(EngineError::Invalid(
                "element 0 of tensors does not require grad and does not have a grad_fn".into(),
            ));
        };
        // dependencies: how many gradient contributions each node waits for
        let mut pending: HashMap<NodeId, u32> = HashMap::default();
        let mut leaf_pending: HashMap<TensorId, u32> = HashMap::default();
        let mut stack = vec![root_fn];
        while let Some(n) = stack.pop() {
            let node = &self.nodes[n.0 as usize];
            if node.released && node.had_saved {
                return Err(EngineError::Invalid(
                    "Trying to backward through the graph a second time (or directly access saved tensors after \
                     they have already been freed). Specify retain_graph=True if you need to backward a second time."
                        .into(),
                ));
            }
            for k in 0..node.next.len() {
                match self.nodes[n.0 as usize].next[k] {
                    Edge::Node(m, _) => {
                        // the root is nobody's input: a node is new when its count starts
                        let count = pending.entry(m).or_insert(0);
                        *count += 1;
                        if *count == 1 {
                            stack.push(m);
                        }
                    }
                    Edge::Leaf(t) => *leaf_pending.entry(t).or_insert(0) += 1,
                    Edge::None => {}
                }
            }
        }
        let (shape, dtype) = (self.shape(root).to_vec(), self.dtype(root));
        let seed = self.empty(&shape, dtype, Category::Temporary)?;
        // `torch.ones_like(root)`
        if let Err(e) = self.fill(seed, Fill::Ones) {
            self.release(seed);
            return Err(e);
        }
        // the seed is the caller's (`grad_tensors`): it lives until backward returns, and the
        // root's buffer holds another handle on it
        let mut buffers: HashMap<NodeId, GradSlots> = HashMap::default();
        let root_slot = self.info(root).output_nr as usize;
        let mut first: GradSlots =
            smallvec::smallvec![None; self.nodes[root_fn.0 as usize].outputs as usize];
        first[root_slot] = Some(self.retain(seed));
        buffers.insert(root_fn, first);
        let mut ready = Ready::default();
        ready.push(self, root_fn);
        let mut leaves = Leaves {
            pending: leaf_pending,
            buffers: HashMap::default(),
        };
        let mut r = self.run_ready(
            &mut ready,
            &mut buffers,
            &mut pending,
            &mut leaves,
            retain_graph,
        );
        // the callbacks queued on the engine (FSDP's) run before backward returns
        if r.is_ok() && self.fsdp.is_some() {
            r = self.fsdp_final_callback();
        }
        for (_, slots) in buffers.drain() {
            for g in slots.into_iter().flatten() {
                self.release(g);
            }
        }
        for (_, g) in leaves.buffers.drain() {
            self.release(g);
        }
        self.release(seed);
        r
    }

    /// Runs ready nodes, newest first, until none is left; routes each input's gradient to the
    /// buffer of the node that made the input (or the leaf's `.grad`).
    fn run_ready(
        &mut self,
        ready: &mut Ready,
        buffers: &mut HashMap<NodeId, GradSlots>,
        pending: &mut HashMap<NodeId, u32>,
        leaves: &mut Leaves,
        retain_graph: bool,
    ) -> Result<(), EngineError> {
        while let Some(n) = ready.pop() {
            let seq = self.nodes[n.0 as usize].seq;
            if self.fsdp.is_some() {
                self.fsdp_before_node(n)?;
            }
            let mut grads = buffers.remove(&n).expect("a ready node has its gradient");
            let op = self.nodes[n.0 as usize].op.name();
            self.alloc.recorder_mut().push_backward(op);
            let out = self.run_node(n, &mut grads, retain_graph);
            self.alloc.recorder_mut().pop_tag();
            // (FSDP's post-backward is the function of its alias node)
            let out = match out.and_then(|o| {
                if self.fsdp.is_some() {
                    self.fsdp_after_node(n, seq).map(|()| o)
                } else {
                    Ok(o)
                }
            }) {
                Ok(out) => out,
                Err(e) => {
                    for g in grads.into_iter().flatten() {
                        self.release(g);
                    }
                    return Err(e);
                }
            };
            // what it saved from a recomputed checkpoint region goes as its function returns
            // (the recomputed tensors are held only by the function's unpacked locals); the
            // incoming gradients go then, then (without retain_graph) the rest it saved
            self.release_recomputed(n);
            for g in grads.into_iter().flatten() {
                self.release(g);
            }
            if !retain_graph {
                let node = self.node_mut(n);
                node.released = true;
                let saved = std::mem::take(&mut node.saved);
                for sv in saved {
                    self.release(sv.t);
                }
            }
            let mut out = out.into_iter();
            while let Some((e, g)) = out.next() {
                let r = match e {
                    Edge::Node(m, slot) => {
                        let outputs = self.nodes[m.0 as usize].outputs as usize;
                        let slots = buffers
                            .entry(m)
                            .or_insert_with(|| smallvec::smallvec![None; outputs]);
                        let r = match slots[slot as usize].take() {
                            None => Ok(g),
                            Some(old) => self.accumulate(old, g),
                        };
                        r.map(|acc| {
                            buffers.get_mut(&m).expect("inserted")[slot as usize] = Some(acc);
                            let p = pending.get_mut(&m).expect("counted");
                            *p -= 1;
                            if *p == 0 {
                                ready.push(self, m);
                            }
                        })
                    }
                    Edge::Leaf(t) => self.leaf_gradient(leaves, t, g),
                    Edge::None => unreachable!("no gradient is made for an input without one"),
                };
                if let Err(e) = r {
                    for (_, g) in out {
                        self.release(g);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// A gradient for a leaf. A leaf used by several ops (a tied embedding) gathers them in
    /// its input buffer first; with all of them in, `AccumulateGrad` runs.
    fn leaf_gradient(
        &mut self,
        leaves: &mut Leaves,
        t: TensorId,
        g: TensorId,
    ) -> Result<(), EngineError> {
        let g = match leaves.buffers.remove(&t) {
            None => g,
            Some(old) => self.accumulate(old, g)?,
        };
        let left = leaves.pending.get_mut(&t).expect("counted");
        *left -= 1;
        if *left > 0 {
            leaves.buffers.insert(t, g);
            return Ok(());
        }
        self.accumulate_grad(t, g)
    }

    /// A second gradient for the same input, summed as PyTorch 2.11's input buffer does: into
    /// the first when nothing else holds it or its storage, else into a new tensor (the H200
    /// traces: a tied embedding's weight gradient, which arrives first as a view of the
    /// product's output, is summed out of place; a residual stream's, in place).
    fn accumulate(&mut self, old: TensorId, new: TensorId) -> Result<TensorId, EngineError> {
        if self.sole_owner(old) {
            let r = self.launch(&Op::Accumulate, &[new], &[old]);
            self.release(new);
            return r.map(|_| old);
        }
        let (shape, dtype) = (self.shape(old).to_vec(), self.dtype(old));
        let sum = self.empty(&shape, dtype, Category::Temporary);
        let r = match &sum {
            Ok(s) => self.launch(&Op::Binary(Binary::Add), &[old, new], &[*s]),
            Err(_) => Ok(()),
        };
        self.release(old);
        self.release(new);
        r?;
        sum
    }

    /// `AccumulateGrad`: the first gradient of a leaf becomes its `.grad` when nothing else
    /// holds it and it is laid out like the leaf (else a copy does); later ones add in place.
    fn accumulate_grad(&mut self, leaf: TensorId, g: TensorId) -> Result<(), EngineError> {
        if let Some(old) = self.grad(leaf) {
            let r = self.launch(&Op::Accumulate, &[g], &[old]);
            self.release(g);
            return r;
        }
        let steal =
            self.handles(g) == 1 && self.info(g).layout.strides == self.info(leaf).layout.strides;
        let grad = if steal {
            if self.sole_owner(g) {
                self.recategorize(g, Category::Gradient);
            }
            g
        } else {
            let (shape, dtype) = (self.shape(leaf).to_vec(), self.dtype(leaf));
            let c = self.empty(&shape, dtype, Category::Gradient);
            let r = match &c {
                Ok(c) => self.launch(&Op::Copy, &[g], &[*c]),
                Err(_) => Ok(()),
            };
            self.release(g);
            r?;
            c?
        };
        self.info_mut(leaf).grad = Some(grad);
        if let Some(log) = &mut self.grad_ready {
            log.push(leaf);
        }
        // DDP's reducer hook with gradient_as_bucket_view: the gradient copied into the
        // bucket, the bucket's view made the gradient
        if let Some(&view) = self.grad_views.as_ref().and_then(|m| m.get(&leaf)) {
            let r = self.launch(&Op::Copy, &[grad], &[view]);
            self.release(grad);
            let v = self.retain(view);
            self.info_mut(leaf).grad = Some(v);
            r?;
        }
        if self.zero.is_some() {
            self.zero_grad_ready(leaf)?;
        }
        Ok(())
    }

    /// The node's saved tensors with their roles, for a backward kernel.
    pub(super) fn saved_roles(&self, n: NodeId) -> Vec<(Role, TensorId)> {
        self.nodes[n.0 as usize]
            .saved
            .iter()
            .map(|sv| (sv.role, sv.t))
            .collect()
    }

    /// One node's backward: checks and recomputes what it needs, then makes a gradient for each
    /// input that needs one, in the order PyTorch's derivative makes them. Returns them with
    /// their edges; the caller frees the incoming gradients.
    fn run_node(
        &mut self,
        n: NodeId,
        grads: &mut [Option<TensorId>],
        retain_graph: bool,
    ) -> Result<Vec<(Edge, TensorId)>, EngineError> {
        let _ = retain_graph;
        // a checkpoint recomputes its region when a node unpacks what it saved there: nodes
        // that saved nothing (a view's backward copying an expanded gradient) run before it
        let node = &self.nodes[n.0 as usize];
        let unpacks = !node.saved.is_empty() || !node.deferred.is_empty();
        if let (Some(r), true) = (node.region, unpacks) {
            self.recompute_region(r)?;
        }
        let stale = {
            let node = &self.nodes[n.0 as usize];
            node.saved
                .iter()
                .find(|sv| self.version(sv.t) != sv.version)
                .map(|sv| (sv.t, sv.version, node.op.name()))
        };
        if let Some((t, v, op)) = stale {
            return Err(EngineError::Invalid(format!(
                "one of the variables needed for gradient computation has been modified by an inplace operation: \
                 [{} {}], which is saved by {op}, is at version {}; expected version {v} instead.",
                self.dtype(t),
                super::layout::Dims(self.shape(t)),
                self.version(t)
            )));
        }
        // borrowed out of the node for the call (node_grads touches only its saved tensors and
        // split shapes), and put back
        let node = self.node_mut(n);
        let op = node.op.clone();
        let next = std::mem::take(&mut node.next);
        let meta = std::mem::take(&mut node.input_meta);
        let back = std::mem::replace(&mut node.back, Back::Alloc);
        let mut made: Vec<(Edge, TensorId)> = Vec::with_capacity(next.len());
        let r = self.node_grads(&op, &back, &next, &meta, grads, n, &mut made);
        let node = self.node_mut(n);
        node.next = next;
        node.input_meta = meta;
        node.back = back;
        if let Err(e) = r {
            for (_, g) in made {
                self.release(g);
            }
            return Err(e);
        }
        Ok(made)
    }

    /// The gradients of one node's inputs (pushed to `made` as they are allocated).
    #[allow(clippy::too_many_arguments)]
    fn node_grads(
        &mut self,
        op: &Op,
        back: &Back,
        next: &[Edge],
        meta: &[(Vec<usize>, DType)],
        grads: &mut [Option<TensorId>],
        n: NodeId,
        made: &mut Vec<(Edge, TensorId)>,
    ) -> Result<(), EngineError> {
        let cat_for = |s: &Self, e: &Edge| s.grad_category(e);
        if *back == Back::Split {
            // zeros for the parts no gradient reached, then one cat into the input's shape
            let shapes = self.nodes[n.0 as usize].out_shapes.clone();
            let mut zeros = Vec::new();
            let mut parts = Vec::new();
            for (k, g) in grads.iter().enumerate() {
                match g {
                    Some(g) => parts.push(*g),
                    None => match self.empty(&shapes[k], meta[0].1, Category::Temporary) {
                        Ok(z) => {
                            zeros.push(z);
                            parts.push(z);
                        }
                        Err(e) => {
                            for z in zeros {
                                self.release(z);
                            }
                            return Err(e);
                        }
                    },
                }
            }
            let mut r = Ok(());
            for &z in &zeros {
                r = r.and_then(|_| self.fill(z, Fill::Zeros));
            }
            let g = self.empty(&meta[0].0, meta[0].1, cat_for(self, &next[0]));
            if let Ok(g) = &g {
                r = r.and_then(|_| self.launch_grad(op, 0, &parts, *g, &[]));
            }
            for z in zeros {
                self.release(z);
            }
            let g = g?;
            made.push((next[0], g));
            return r;
        }
        let mut grad_out = grads[0].expect("a single-output node has its gradient");
        let mut copied = None;
        let release_copy = |s: &mut Self, c: Option<TensorId>| {
            if let Some(c) = c {
                s.release(c);
            }
        };
        match back {
            Back::Pass => {
                for (e, _) in next.iter().zip(meta) {
                    if *e != Edge::None {
                        made.push((*e, self.retain(grad_out)));
                    }
                }
                return Ok(());
            }
            Back::Reshape => {
                let (shape, dtype) = &meta[0];
                if next[0] != Edge::None {
                    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                    let (_, view) = self.info(grad_out).layout.reshape(&dims)?;
                    let g = match view {
                        Some(l) => self.grad_view(grad_out, l),
                        None => {
                            let g = self.empty(shape, *dtype, cat_for(self, &next[0]))?;
                            made.push((next[0], g));
                            return self.launch(&Op::Copy, &[grad_out], &[g]);
                        }
                    };
                    made.push((next[0], g));
                }
                return Ok(());
            }
            Back::Expand { dims, keepdim } => {
                let (shape, _) = &meta[0];
                if next[0] != Edge::None {
                    let mut l = self.info(grad_out).layout.clone();
                    if !keepdim {
                        let red = dims.reduced(shape.len())?;
                        for (d, _) in red.iter().enumerate().filter(|(_, r)| **r) {
                            l = l.unsqueeze(d as i64)?;
                        }
                    }
                    let sizes: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                    let l = l.expand(&sizes)?;
                    made.push((next[0], self.grad_view(grad_out, l)));
                }
                return Ok(());
            }
            Back::Permute(perm) => {
                if next[0] != Edge::None {
                    let mut inv = vec![0i64; perm.len()];
                    for (i, &p) in perm.iter().enumerate() {
                        inv[p] = i as i64;
                    }
                    let l = self.info(grad_out).layout.permute(&inv)?;
                    made.push((next[0], self.grad_view(grad_out, l)));
                }
                return Ok(());
            }
            Back::Add => {
                let (gshape, gdtype) = (self.shape(grad_out).to_vec(), self.dtype(grad_out));
                for (e, (shape, dtype)) in next.iter().zip(meta) {
                    if *e == Edge::None {
                        continue;
                    }
                    let g = if *shape == gshape && *dtype == gdtype {
                        self.retain(grad_out)
                    } else {
                        let g = self.empty(shape, *dtype, cat_for(self, e))?;
                        made.push((*e, g));
                        self.launch(&Op::SumTo, &[grad_out], &[g])?;
                        let dims = super::op::grad::sum_to_dims(&gshape, shape);
                        if !dims.is_empty() {
                            self.reduce_scratch(&gshape, &dims, *dtype)?;
                        }
                        continue;
                    };
                    made.push((*e, g));
                }
                return Ok(());
            }
            Back::Cat(dim) => {
                let l = self.info(grad_out).layout.clone();
                let d = super::layout::wrap_dim(*dim, l.ndim())?;
                let mut at = 0i64;
                let gdtype = self.dtype(grad_out);
                for (e, (shape, dtype)) in next.iter().zip(meta) {
                    if super::op::cat_skips(shape) {
                        continue;
                    }
                    let len = shape[d] as i64;
                    if *e != Edge::None {
                        let part = l.slice(d as i64, Some(at), Some(at + len), 1)?;
                        let v = self.grad_view(grad_out, part);
                        if *dtype == gdtype {
                            made.push((*e, v));
                        } else {
                            // `validate_outputs` casts it to the input's dtype
                            let c = self.empty(shape, *dtype, cat_for(self, e));
                            let c = match c {
                                Ok(c) => c,
                                Err(err) => {
                                    self.release(v);
                                    return Err(err);
                                }
                            };
                            made.push((*e, c));
                            let r = self.launch(&Op::Copy, &[v], &[c]);
                            self.release(v);
                            r?;
                        }
                    }
                    at += len;
                }
                return Ok(());
            }
            Back::Alloc | Back::Split => {}
        }
        let mut plan = op.grad_plan(meta, (self.shape(grad_out), self.dtype(grad_out)));
        if matches!(op, Op::Linear) && self.zero.as_ref().is_some_and(|z| z.stage == 3) {
            // ZeRO-3 replaces `F.linear` with `LinearFunctionForZeroStage3`, whose backward
            // makes the input's gradient first, then the weight's straight in its layout
            plan.reversed = false;
            plan.through_t = None;
        }
        if let Some(dims) = &plan.rows {
            let l = self.info(grad_out).layout.clone();
            if l.reshape(dims)?.1.is_none() {
                // (the reshape is its own node in PyTorch: the gradient it copied goes at once)
                let c = self.empty(&l.shape, self.dtype(grad_out), Category::Temporary)?;
                let r = self.launch(&Op::Copy, &[grad_out], &[c]);
                if let Err(e) = r {
                    self.release(c);
                    return Err(e);
                }
                if let Some(g) = grads[0].take() {
                    self.release(g);
                }
                copied = Some(c);
                grad_out = c;
            }
        }
        if !plan.formulas.is_empty() {
            let r = self.run_formulas(op, &plan.formulas, next, meta, grad_out, n, made);
            self.release_recomputed(n);
            release_copy(self, copied);
            return r;
        }
        let mut order: Vec<usize> = (0..next.len()).collect();
        if plan.reversed {
            order.reverse();
        }
        let mut unneeded = Vec::new();
        let r = (|| {
            for slot in order {
                let e = &next[slot];
                if *e == Edge::None {
                    if slot < plan.every_input {
                        let (shape, dtype) = &meta[slot];
                        unneeded.push(self.empty(shape, *dtype, Category::Temporary)?);
                    }
                    continue;
                }
                let (shape, dtype) = &meta[slot];
                let g = self.empty(shape, *dtype, cat_for(self, e))?;
                let g = if plan.through_t == Some(slot) || plan.reshaped.contains(&slot) {
                    let l = self.info(g).layout.clone();
                    let v = self.view_with(g, l);
                    self.info_mut(v).base = Some(g);
                    v
                } else {
                    g
                };
                let g = self.follow_layout(op, g, grad_out);
                let g = if plan.swapped == Some(slot) && shape.len() >= 2 {
                    let n = shape.len();
                    let mut made = shape.clone();
                    made.swap(n - 2, n - 1);
                    let l = super::layout::Layout::contiguous(&made).transpose(-2, -1)?;
                    let v = self.view_with(g, l);
                    self.release(g);
                    v
                } else {
                    g
                };
                let like = if plan.like_inputs && shape.len() == 4 {
                    self.nodes[n.0 as usize]
                        .saved
                        .iter()
                        .find(|sv| sv.role == Role::Input(slot))
                        .map(|sv| super::layout::stride_order(&self.info(sv.t).layout))
                } else {
                    None
                };
                let g = if let Some(order) = like {
                    let l = super::layout::dense_in_order(shape, &order);
                    if l.is_contiguous() {
                        g
                    } else {
                        let v = self.view_with(g, l);
                        self.release(g);
                        v
                    }
                } else if plan.bthd && shape.len() == 4 {
                    let (b, h, t, d) = (shape[0], shape[1], shape[2], shape[3]);
                    let l = super::layout::Layout::contiguous(&[b, t, h, d]).transpose(1, 2)?;
                    let v = self.view_with(g, l);
                    self.release(g);
                    v
                } else {
                    g
                };
                made.push((*e, g));
                self.run_scratch(&plan.each_scratch)?;
                if plan.cublas {
                    self.ensure_cublas_workspace(false)?;
                }
                if self.computes() {
                    let saved = self.saved_roles(n);
                    self.launch_grad(op, slot, &[grad_out], g, &saved)?;
                }
                if plan.column_sum == Some(slot) {
                    // (the bias's sum over rows is the engine's validate_outputs, after the
                    // function has returned)
                    self.release_recomputed(n);
                    let rows = self.info(grad_out).layout.numel() / shape[0].max(1);
                    self.column_sum_scratch(rows, shape[0])?;
                }
            }
            self.run_scratch(&plan.scratch)
        })();
        for g in unneeded {
            self.release(g);
        }
        // (the copy is the input of this node's function: it goes after the function returns)
        self.release_recomputed(n);
        release_copy(self, copied);
        r
    }

    /// Releases what node `n` saved from its checkpoint region once the region was recomputed.
    /// They go as the function's unpacked locals are destroyed: last unpacked first.
    pub(super) fn release_recomputed(&mut self, n: NodeId) {
        let Some(r) = self.nodes[n.0 as usize].region else {
            return;
        };
        if !self.checkpoint.regions[r as usize].recomputed {
            return;
        }
        let saved = std::mem::take(&mut self.node_mut(n).saved);
        let (mine, keep): (Vec<_>, Vec<_>) = saved
            .into_iter()
            .partition(|sv| self.made_in_region(sv.t) == Some(r));
        self.node_mut(n).saved = keep;
        for sv in mine.into_iter().rev() {
            self.release(sv.t);
        }
    }

    /// A gradient's category: a leaf's first `.grad` is a gradient, anything else on its way
    /// a temporary.
    pub(super) fn grad_category(&self, e: &Edge) -> Category {
        match e {
            Edge::Leaf(t) if self.grad(*t).is_none() => Category::Gradient,
            _ => Category::Temporary,
        }
    }

    /// An elementwise op's gradient of the incoming gradient's shape, laid out as
    /// TensorIterator lays out `grad * other`: like the incoming gradient when that one is
    /// permuted (a transposed head gradient stays transposed through an RMSNorm's backward,
    /// so the `view` before it copies, as on the H200), else contiguous as made.
    pub(super) fn follow_layout(&mut self, op: &Op, g: TensorId, grad_out: TensorId) -> TensorId {
        if !op.elementwise() {
            return g;
        }
        let lo = &self.info(grad_out).layout;
        if lo.is_contiguous() || !lo.is_dense() || self.info(g).layout.shape != lo.shape {
            return g;
        }
        let l = super::layout::elementwise_layout(&lo.shape, &[lo]);
        if l.is_contiguous() {
            return g;
        }
        let v = self.view_with(g, l);
        self.release(g);
        v
    }

    /// A view of a gradient made in backward (a reshape, a permute, a slice): like PyTorch's
    /// views it holds its base, so the storage has two owners and a second gradient for
    /// the same input is summed out of place.
    fn grad_view(&mut self, of: TensorId, l: super::layout::Layout) -> TensorId {
        let v = self.view_with(of, l);
        let base = self.retain(of);
        self.info_mut(v).base = Some(base);
        v
    }

    /// `x.detach()`: a view of the same storage outside the graph.
    pub fn detach(&mut self, t: TensorId) -> TensorId {
        let l = self.info(t).layout.clone();
        let d = self.view_with(t, l);
        self.set_requires_grad(d, false);
        d
    }

    /// `zero_grad(set_to_none=True)` for one tensor: drops its `.grad`.
    pub fn clear_grad(&mut self, t: TensorId) {
        if let Some(g) = self.info_mut(t).grad.take() {
            self.release(g);
        }
    }
}
