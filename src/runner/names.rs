//! Variables by slot: before a run, every name a script reads, assigns or deletes gets a slot
//! number, stored in its [`Ident`], so the runner's variables are a vector indexed by slot, not
//! a map hashed by name on every statement.
//!
//! Slots are given in the order names first appear (`[params]`, then `setup`, then `body`), so
//! the same script always gets the same slots: runs that share a script, in parallel too,
//! store the same numbers.
//!
//! A `scope "NAME"` block's name gets a slot of its own numbering the same way (one per
//! distinct name), so the runner keeps each scope's tag in a vector too.

use rustc_hash::FxHashMap;

use crate::workload::ast::{visit, BlockKind, ExprKind, Ident, Node, StmtKind, Workload};

/// The slots of a script's names.
pub(super) struct Names {
    /// Each variable name's slot.
    pub vars: FxHashMap<String, u32>,
    /// How many distinct scope names (their slots are `0..scopes`).
    pub scopes: usize,
}

/// The slot of every variable name and of every scope name of `w` (stored in its idents too).
pub(super) fn resolve(w: &Workload) -> Names {
    let mut slots = FxHashMap::default();
    let mut scopes = FxHashMap::default();
    for (k, _) in &w.params {
        slot(&mut slots, k);
    }
    let mut ident = |i: &Ident| {
        let s = slot(&mut slots, i.as_str());
        i.set_resolved(s);
    };
    for part in [&w.setup, &w.body] {
        visit(part, &mut |n| match n {
            // a called function's or method's name is not a variable
            Node::Expr(e) => {
                if let ExprKind::Name(i) = &e.kind {
                    ident(i)
                }
            }
            Node::Stmt(s) => match &s.kind {
                StmtKind::Assign { targets: names, .. } | StmtKind::Del(names) => {
                    names.iter().for_each(&mut ident)
                }
                StmtKind::Block {
                    kind: BlockKind::For { var, .. },
                    ..
                } => ident(var),
                StmtKind::Block {
                    kind: BlockKind::Checkpoint { hold },
                    ..
                } => hold.iter().for_each(&mut ident),
                StmtKind::Block {
                    kind: BlockKind::Scope(name),
                    ..
                } => name.set_resolved(slot(&mut scopes, name.as_str())),
                StmtKind::SetItem { .. } | StmtKind::Expr(_) | StmtKind::Block { .. } => {}
            },
        });
    }
    Names {
        vars: slots,
        scopes: scopes.len(),
    }
}

fn slot(slots: &mut FxHashMap<String, u32>, name: &str) -> u32 {
    let n = slots.len() as u32;
    *slots.entry(name.to_string()).or_insert(n)
}
