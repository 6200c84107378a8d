//! Activation checkpointing (`torch.utils.checkpoint`, non-reentrant), for memory and for
//! values: inside a region the nodes drop what they saved from it (the saved-tensor hooks keep
//! only what is needed to recompute it), and backward, reaching a node of the region, replays
//! the region's forward from its tape: the same allocations and frees in order, the cuBLAS
//! workspaces of the autograd thread at its first product, and on a data device the same
//! kernels (by storage serial, on the recomputed storages), stopping early after the last tensor
//! a node needs, as PyTorch does.

use std::collections::HashMap;

use super::dtype::DType;
use super::graph::{NodeId, Region, Saved, TapeEvent, TapeRef};
use super::layout::Layout;
use super::op::Role;
use super::tensor::{Category, EngineError, TensorId, Tensors};
use crate::backend::Device;

impl<S: Device> Tensors<S> {
    /// Releases what node `n` saved that was made in region `r` (or recomputed for it),
    /// remembering it for the recompute when `defer`.
    pub(crate) fn drop_region_saved(
        &mut self,
        n: NodeId,
        r: u32,
        defer: bool,
        first_out: Option<u64>,
    ) {
        let node = self.node_mut(n);
        let saved = std::mem::take(&mut node.saved);
        let mut keep = Vec::new();
        for sv in saved {
            if self.made_in_region(sv.t) != Some(r) {
                keep.push(sv);
                continue;
            }
            if defer {
                let serial = self.storage_serial(sv.t);
                let key = (serial, sv.role, self.info(sv.t).layout.clone());
                self.node_mut(n).deferred.push(key);
                let before = match sv.role {
                    Role::Input(_) => first_out.filter(|&o| o != serial),
                    _ => None,
                };
                self.checkpoint.regions[r as usize]
                    .tape
                    .push(TapeEvent::Saved { serial, before });
            }
            self.release(sv.t);
        }
        self.node_mut(n).saved = keep;
    }

    /// `checkpoint(fn, ...)` (non-reentrant) begins: ops from here on record their graph, but
    /// what they save is dropped when the region ends and recomputed in backward.
    pub fn checkpoint_enter(&mut self) -> Option<u32> {
        let prev = self.checkpoint.current;
        self.checkpoint.regions.push(Region::default());
        self.checkpoint.current = Some((self.checkpoint.regions.len() - 1) as u32);
        prev
    }

    /// [`Self::checkpoint_enter`], the region holding `held` (the function's arguments, which
    /// `torch.utils.checkpoint` keeps for the recompute) until its first node's backward.
    pub fn checkpoint_enter_holding(&mut self, held: &[TensorId]) -> Option<u32> {
        let prev = self.checkpoint_enter();
        let kept: Vec<TensorId> = held.iter().map(|&t| self.retain(t)).collect();
        if let Some(r) = self.checkpoint.current {
            self.checkpoint.regions[r as usize].held = kept;
        }
        prev
    }

    /// The region ends (its nodes dropped what they saved from inside it as they were made);
    /// what it held and gave no node goes.
    pub fn checkpoint_exit(&mut self, prev: Option<u32>) {
        if let Some(r) = self.checkpoint.current {
            let held = std::mem::take(&mut self.checkpoint.regions[r as usize].held);
            for t in held {
                self.release(t);
            }
            self.checkpoint.current = prev;
        }
    }

    /// Backward reached a checkpointed node: recompute the region's forward once, as PyTorch's
    /// non-reentrant checkpoint does: the forward's allocations and frees again, in order (the
    /// autograd thread's cuBLAS handles taking their workspaces at their first product), the
    /// tensors the nodes saved handed to them instead of freed, and the recompute stopped right
    /// after the last of those is made (early stop), what else it made freed then.
    pub(crate) fn recompute_region(&mut self, r: u32) -> Result<(), EngineError> {
        if std::mem::replace(&mut self.checkpoint.regions[r as usize].recomputed, true) {
            return Ok(());
        }
        self.alloc.recorder_mut().push_tag("checkpoint_recompute");
        let nodes = self.checkpoint.regions[r as usize].nodes.clone();
        let needed: std::collections::HashSet<u64> = nodes
            .iter()
            .filter(|n| self.nodes[n.0 as usize].live)
            .flat_map(|n| self.nodes[n.0 as usize].deferred.iter().map(|d| d.0))
            .collect();
        let tape = std::mem::take(&mut self.checkpoint.regions[r as usize].tape);
        // PyTorch stops once the last saved tensor is packed: an output after the op that
        // saves it, an input before the op allocates (autograd records saved inputs first).
        // `end`: how many taped events the recompute replays, found in one pass
        let mut alloc_at: HashMap<u64, usize> = HashMap::new();
        let mut end: Option<usize> = None;
        for (i, e) in tape.iter().enumerate() {
            match e {
                TapeEvent::Alloc { serial, .. } => {
                    alloc_at.insert(*serial, i);
                }
                TapeEvent::Saved { serial, before } if needed.contains(serial) => {
                    let stop = match before.and_then(|out| alloc_at.get(&out)) {
                        Some(&a) => a,
                        None => i + 1,
                    };
                    end = Some(end.map_or(stop, |e: usize| e.max(stop)));
                }
                _ => {}
            }
        }
        let end = end.or_else(|| {
            tape.iter()
                .rposition(
                    |e| matches!(e, TapeEvent::Alloc { serial, .. } if needed.contains(serial)),
                )
                .map(|l| l + 1)
        });
        let mut made: HashMap<u64, TensorId> = HashMap::new();
        let mut order: Vec<u64> = Vec::new();
        let mut result = Ok(());
        for e in tape.iter().take(end.unwrap_or(0)) {
            match e {
                TapeEvent::Alloc {
                    serial,
                    shape,
                    dtype,
                    category,
                } => {
                    let cat = if needed.contains(serial) {
                        Category::Activation
                    } else {
                        *category
                    };
                    match self.empty(shape, *dtype, cat) {
                        Ok(t) => {
                            // recomputed for the region (a node hands it over after its use)
                            self.set_region(t, r);
                            made.insert(*serial, t);
                            order.push(*serial);
                        }
                        Err(err) => {
                            result = Err(err);
                            break;
                        }
                    }
                }
                TapeEvent::Free { serial } => {
                    if !needed.contains(serial) {
                        if let Some(t) = made.remove(serial) {
                            self.release(t);
                        }
                    }
                }
                TapeEvent::Saved { .. } => {}
                TapeEvent::Product { with_bias } => {
                    if let Err(err) = self.ensure_cublas_workspace(*with_bias) {
                        result = Err(err);
                        break;
                    }
                }
                TapeEvent::Launch { .. } => {
                    if let Err(err) = self.replay_launch(e, &made) {
                        result = Err(err);
                        break;
                    }
                }
            }
        }
        // on a data device, the kernels after the last allocation that matters still write
        // what was allocated (layer_norm allocates its statistics, then runs): run those whose
        // every buffer still exists, allocating nothing
        if result.is_ok() && self.computes() {
            for e in tape.iter().skip(end.unwrap_or(0)) {
                if matches!(e, TapeEvent::Launch { .. }) {
                    if let Err(err) = self.replay_launch(e, &made) {
                        result = Err(err);
                        break;
                    }
                }
            }
        }
        // early stop: what the recompute made and no node saved goes now
        for serial in order.iter().rev() {
            if !needed.contains(serial) {
                if let Some(t) = made.remove(serial) {
                    self.release(t);
                }
            }
        }
        if result.is_ok() {
            for n in nodes {
                if !self.nodes[n.0 as usize].live {
                    continue;
                }
                let deferred = std::mem::take(&mut self.node_mut(n).deferred);
                for (key, role, layout) in deferred {
                    if let Some(&t) = made.get(&key) {
                        // the saved view of the recomputed storage
                        let t = self.view_with(t, layout);
                        self.set_requires_grad(t, false);
                        let version = self.version(t);
                        self.node_mut(n).saved.push(Saved { t, version, role });
                    }
                }
            }
        }
        // the nodes hold the recomputed tensors now
        for (_, t) in made {
            self.release(t);
        }
        self.alloc.recorder_mut().pop_tag();
        result
    }

    /// Runs a taped kernel again on the recomputed storages (skipped when one of them is not
    /// there: a launch only for what the early stop left out).
    fn replay_launch(
        &mut self,
        e: &TapeEvent,
        made: &HashMap<u64, TensorId>,
    ) -> Result<(), EngineError> {
        let TapeEvent::Launch {
            op,
            inputs,
            outputs,
        } = e
        else {
            return Ok(());
        };
        let resolve = |s: &Self, bufs: &[(TapeRef, Layout, DType)]| -> Option<Vec<_>> {
            bufs.iter()
                .map(|(at, l, d)| {
                    let addr = match at {
                        TapeRef::Outside(a) => *a,
                        TapeRef::Made(serial) => s.storage_of(*made.get(serial)?).0,
                    };
                    Some((addr, l.clone(), *d))
                })
                .collect()
        };
        let (Some(ins), Some(outs)) = (resolve(self, inputs), resolve(self, outputs)) else {
            return Ok(());
        };
        self.launch_raw(op, crate::backend::Pass::Forward, &ins, &outs, &[])
    }
}
