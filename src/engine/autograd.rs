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
//! Backward runs ready nodes newest first (PyTorch's sequence-number order), allocates one
//! gradient per differentiable input, frees each incoming gradient after use and, unless
//! `retain_graph`, each node's saved tensors right after the node ran.

use std::collections::HashMap;

use super::dtype::DType;
use super::tensor::{Category, EngineError, TensorId, Tensors};
use crate::alloc::SegmentSource;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeId(pub u32);

/// Where an input's gradient goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Edge {
    /// The input needs no gradient.
    None,
    /// The input was made by this node.
    Node(NodeId),
    /// The input is a leaf requiring grad: accumulate into its `.grad` (handle held).
    Leaf(TensorId),
}

/// What an op's backward needs kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Save {
    /// Input `i`.
    Input(usize),
    /// Input `i`, only if input `j` requires grad (`a * b` keeps `b` for `a`'s gradient).
    InputFor(usize, usize),
    /// The op's output (saved without its grad_fn).
    Output,
}

/// An activation-checkpoint region: the nodes made inside it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Region {
    pub nodes: Vec<NodeId>,
    pub recomputed: bool,
}

/// Checkpoint state: the region being recorded, and all regions by id.
#[derive(Debug, Clone, Default)]
pub(crate) struct Checkpoints {
    pub current: Option<u32>,
    pub regions: Vec<Region>,
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub op: &'static str,
    pub saved: Vec<TensorId>,
    /// The version of each saved tensor's storage when it was saved.
    pub saved_versions: Vec<u32>,
    pub next: Vec<Edge>,
    /// Shape and dtype of each input: the shape of its gradient.
    pub input_meta: Vec<(Vec<usize>, DType)>,
    /// Creation order (backward runs the newest ready node first).
    pub seq: u64,
    refs: u32,
    live: bool,
    /// A backward without retain_graph already freed the saved tensors.
    pub released: bool,
    /// The node saved tensors when it was made (so it cannot run again once they are freed).
    pub had_saved: bool,
    /// The backward passes the incoming gradient through as a view (view, t, clone...) instead
    /// of allocating the input's gradient.
    pub passthrough: bool,
    /// The activation-checkpoint region the node was made in, if any.
    pub region: Option<u32>,
    /// In a checkpoint region: (shape, dtype) of each saved tensor dropped after the forward,
    /// to be recomputed when backward reaches the node.
    /// Tensors saved by several nodes (an op's output and the next op's input) share a key, so
    /// the recompute makes them once.
    pub deferred: Vec<(u32, Vec<usize>, DType)>,
}

impl<S: SegmentSource> Tensors<S> {
    /// Records `op` if grad mode is on and an input requires grad: the outputs get a grad_fn
    /// and require grad, and the node keeps what `saves` names.
    pub fn record(
        &mut self,
        op: &'static str,
        inputs: &[TensorId],
        outputs: &[TensorId],
        saves: &[Save],
    ) {
        if !self.grad_enabled || !inputs.iter().any(|&t| self.info(t).requires_grad) {
            return;
        }
        self.record_node(op, inputs, outputs, saves);
    }

    fn record_node(
        &mut self,
        op: &'static str,
        inputs: &[TensorId],
        outputs: &[TensorId],
        saves: &[Save],
    ) {
        let needs = |s: &Self, i: usize| s.info(inputs[i]).requires_grad;
        let mut saved = Vec::new();
        for s in saves {
            match *s {
                Save::Input(i) => saved.push(self.save(inputs[i])),
                Save::InputFor(i, j) => {
                    if needs(self, j) {
                        saved.push(self.save(inputs[i]));
                    }
                }
                Save::Output => {
                    for &o in outputs {
                        let l = self.info(o).layout.clone();
                        let h = self.view_with(o, l);
                        self.set_requires_grad(h, false);
                        self.recategorize(h, Category::Activation);
                        saved.push(h);
                    }
                }
            }
        }
        let mut next = Vec::with_capacity(inputs.len());
        let mut input_meta = Vec::with_capacity(inputs.len());
        for &t in inputs {
            let info = self.info(t);
            input_meta.push((info.layout.shape.clone(), info.dtype));
            let edge = match (info.grad_fn, info.requires_grad) {
                (Some(n), _) => {
                    self.node_mut(n).refs += 1;
                    Edge::Node(n)
                }
                (None, true) => Edge::Leaf(self.retain(t)),
                (None, false) => Edge::None,
            };
            next.push(edge);
        }
        self.seq += 1;
        let had_saved = !saved.is_empty();
        let saved_versions = saved.iter().map(|&t| self.version(t)).collect();
        let node = Node {
            op,
            saved,
            saved_versions,
            next,
            input_meta,
            seq: self.seq,
            refs: outputs.len() as u32,
            live: true,
            released: false,
            had_saved,
            passthrough: false,
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
        for &o in outputs {
            let info = self.info_mut(o);
            info.grad_fn = Some(NodeId(id));
            info.requires_grad = true;
        }
        if let Some(r) = self.checkpoint.current {
            self.checkpoint.regions[r as usize].nodes.push(NodeId(id));
        }
    }

    /// `checkpoint(fn, ...)` (non-reentrant) begins: ops from here on record their graph, but
    /// what they save is dropped when the region ends and recomputed in backward.
    pub fn checkpoint_enter(&mut self) -> Option<u32> {
        let prev = self.checkpoint.current;
        self.checkpoint.regions.push(Region::default());
        self.checkpoint.current = Some((self.checkpoint.regions.len() - 1) as u32);
        prev
    }

    /// Adds `t` (an op's extra output kept for backward: layer_norm's mean and rstd, a loss's
    /// weight total, attention's statistics) to what `node` saves, with its version, so a
    /// checkpoint region drops and recomputes it like any saved tensor.
    pub(crate) fn save_extra(&mut self, node: NodeId, t: TensorId) {
        let v = self.version(t);
        let n = self.node_mut(node);
        n.saved.push(t);
        n.saved_versions.push(v);
    }

    /// The region ends: every tensor its nodes saved that was made inside the region is
    /// released (remembering its shape); tensors from outside (the region's inputs, the
    /// parameters) stay saved, as the checkpoint keeps its inputs.
    pub fn checkpoint_exit(&mut self, prev: Option<u32>) {
        let Some(r) = self.checkpoint.current else {
            return;
        };
        self.checkpoint.current = prev;
        let nodes = self.checkpoint.regions[r as usize].nodes.clone();
        let mut keys: HashMap<u32, u32> = HashMap::new();
        for n in nodes {
            let (saved, versions) = {
                let node = self.node_mut(n);
                (
                    std::mem::take(&mut node.saved),
                    std::mem::take(&mut node.saved_versions),
                )
            };
            let mut keep = Vec::new();
            let mut keep_v = Vec::new();
            let mut deferred = Vec::new();
            for (t, v) in saved.into_iter().zip(versions) {
                if self.made_in_region(t) == Some(r) {
                    let n_keys = keys.len() as u32;
                    let key = *keys.entry(self.storage_index(t)).or_insert(n_keys);
                    deferred.push((key, self.shape(t).to_vec(), self.dtype(t)));
                    self.release(t);
                } else {
                    keep.push(t);
                    keep_v.push(v);
                }
            }
            let node = self.node_mut(n);
            node.saved = keep;
            node.saved_versions = keep_v;
            node.deferred = deferred;
        }
    }

    /// Backward reached a checkpointed node: recompute the region's forward once, making again
    /// every tensor its nodes had saved.
    fn recompute_region(&mut self, r: u32) -> Result<(), EngineError> {
        if std::mem::replace(&mut self.checkpoint.regions[r as usize].recomputed, true) {
            return Ok(());
        }
        self.alloc.recorder_mut().push_tag("checkpoint_recompute");
        let nodes = self.checkpoint.regions[r as usize].nodes.clone();
        let mut made: HashMap<u32, TensorId> = HashMap::new();
        for n in nodes {
            if !self.nodes[n.0 as usize].live {
                continue;
            }
            let deferred = std::mem::take(&mut self.node_mut(n).deferred);
            for (key, shape, dtype) in deferred {
                let t = match made.get(&key) {
                    Some(&t) => self.retain(t),
                    None => match self.empty(&shape, dtype, Category::Activation) {
                        Ok(t) => {
                            made.insert(key, t);
                            self.retain(t)
                        }
                        Err(e) => {
                            self.alloc.recorder_mut().pop_tag();
                            for (_, t) in made {
                                self.release(t);
                            }
                            return Err(e);
                        }
                    },
                };
                let v = self.version(t);
                let node = self.node_mut(n);
                node.saved.push(t);
                node.saved_versions.push(v);
            }
            // the recomputed forward runs on the autograd thread: its first `linear` with a
            // bias (addmm, through cuBLASLt) takes that thread's cuBLASLt workspace
            let node = &self.nodes[n.0 as usize];
            if node.op == "linear" && node.next.len() == 3 {
                if let Err(e) = self.ensure_cublas_workspace(true) {
                    self.alloc.recorder_mut().pop_tag();
                    for (_, t) in made {
                        self.release(t);
                    }
                    return Err(e);
                }
            }
        }
        // the nodes hold the recomputed tensors now
        for (_, t) in made {
            self.release(t);
        }
        self.alloc.recorder_mut().pop_tag();
        Ok(())
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
        for t in saved {
            self.release(t);
        }
        for e in next {
            match e {
                Edge::Node(m) => self.node_decref(m),
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
        r
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
        let mut pending: HashMap<NodeId, u32> = HashMap::new();
        let mut stack = vec![root_fn];
        let mut seen = vec![root_fn];
        while let Some(n) = stack.pop() {
            let node = &self.nodes[n.0 as usize];
            if node.released && node.had_saved {
                return Err(EngineError::Invalid(
                    "Trying to backward through the graph a second time (or directly access saved tensors after \
                     they have already been freed). Specify retain_graph=True if you need to backward a second time."
                        .into(),
                ));
            }
            for e in node.next.clone() {
                if let Edge::Node(m) = e {
                    *pending.entry(m).or_insert(0) += 1;
                    if !seen.contains(&m) {
                        seen.push(m);
                        stack.push(m);
                    }
                }
            }
        }
        let (shape, dtype) = (self.shape(root).to_vec(), self.dtype(root));
        let seed = self.empty(&shape, dtype, Category::Temporary)?;
        let mut buffers: HashMap<NodeId, TensorId> = HashMap::from([(root_fn, seed)]);
        let mut ready = vec![root_fn];
        while !ready.is_empty() {
            // newest ready node first
            let (i, _) = ready
                .iter()
                .enumerate()
                .max_by_key(|(_, n)| self.nodes[n.0 as usize].seq)
                .expect("non-empty");
            let n = ready.swap_remove(i);
            let grad_out = buffers.remove(&n).expect("a ready node has its gradient");
            if let Some(r) = self.nodes[n.0 as usize].region {
                if let Err(e) = self.recompute_region(r) {
                    self.release(grad_out);
                    for (_, g) in buffers.drain() {
                        self.release(g);
                    }
                    return Err(e);
                }
            }
            let stale = {
                let node = &self.nodes[n.0 as usize];
                node.saved
                    .iter()
                    .zip(&node.saved_versions)
                    .find(|(&t, &v)| self.version(t) != v)
                    .map(|(&t, &v)| (t, v, node.op))
            };
            if let Some((t, v, op)) = stale {
                self.release(grad_out);
                for (_, g) in buffers.drain() {
                    self.release(g);
                }
                return Err(EngineError::Invalid(format!(
                    "one of the variables needed for gradient computation has been modified by an inplace operation: \
                     [{} {}], which is saved by {op}, is at version {}; expected version {v} instead.",
                    self.dtype(t),
                    super::layout::Dims(self.shape(t)),
                    self.version(t)
                )));
            }
            let (next, meta, passthrough, op) = {
                let node = &self.nodes[n.0 as usize];
                (
                    node.next.clone(),
                    node.input_meta.clone(),
                    node.passthrough,
                    node.op,
                )
            };
            // gradients are tagged with the op whose backward made them
            self.alloc
                .recorder_mut()
                .push_tag(&format!("{op}_backward"));
            for (e, (shape, dtype)) in next.iter().zip(meta) {
                let cat = match e {
                    Edge::Leaf(t) if self.grad(*t).is_none() => Category::Gradient,
                    _ => Category::Temporary,
                };
                if *e == Edge::None {
                    continue;
                }
                let g = if passthrough {
                    self.view_with(grad_out, super::layout::Layout::contiguous(&shape))
                } else {
                    let g = self.empty(&shape, dtype, cat).and_then(|g| {
                        // the autograd thread's first matrix product takes its own cuBLAS
                        // workspace, right after that product's first output (backward's
                        // products are plain mm: no cuBLASLt)
                        if matches!(op, "matmul" | "linear") {
                            self.ensure_cublas_workspace(false)?;
                        }
                        Ok(g)
                    });
                    match g {
                        Ok(g) => g,
                        Err(e) => {
                            self.alloc.recorder_mut().pop_tag();
                            return Err(e);
                        }
                    }
                };
                match *e {
                    Edge::Node(m) => {
                        match buffers.get(&m) {
                            // a second contribution is summed into the first, in place
                            Some(_) => self.release(g),
                            None => {
                                buffers.insert(m, g);
                            }
                        }
                        let p = pending.get_mut(&m).expect("counted");
                        *p -= 1;
                        if *p == 0 {
                            ready.push(m);
                        }
                    }
                    Edge::Leaf(t) => match self.grad(t) {
                        None => self.info_mut(t).grad = Some(g),
                        Some(_) => self.release(g),
                    },
                    Edge::None => unreachable!(),
                }
            }
            // the memory-efficient attention kernel's backward computes, after its three
            // gradients, delta = (grad_out * out).sum(-1): a product the size of the output and
            // a [B, H, T] float32 sum, copied; the sum and the product are freed at once.
            // (Its transient workspace, freed before the kernel returns, is not modelled.)
            if op == "sdpa_efficient" {
                let shape = self.shape(grad_out).to_vec();
                let rows = shape[..shape.len().saturating_sub(1)].to_vec();
                let r = (|| {
                    let prod = self.empty(&shape, DType::F32, Category::Temporary)?;
                    let sum = self.empty(&rows, DType::F32, Category::Temporary)?;
                    let copy = self.empty(&rows, DType::F32, Category::Temporary)?;
                    self.release(sum);
                    self.release(prod);
                    self.release(copy);
                    Ok(())
                })();
                if let Err(e) = r {
                    self.alloc.recorder_mut().pop_tag();
                    return Err(e);
                }
            }
            self.alloc.recorder_mut().pop_tag();
            // the seed is the caller's (`grad_tensors`): it lives until backward returns
            if grad_out != seed {
                self.release(grad_out);
            }
            if !retain_graph {
                let node = self.node_mut(n);
                node.released = true;
                let saved = std::mem::take(&mut node.saved);
                for t in saved {
                    self.release(t);
                }
            }
        }
        self.release(seed);
        Ok(())
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
