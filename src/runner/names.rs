//! Variables by slot: before a run, every name a script reads, assigns or deletes gets a slot
//! number, stored in its [`Ident`], so the runner's variables are a vector indexed by slot, not
//! a map hashed by name on every statement.
//!
//! Slots are given in the order names first appear (`[params]`, then `setup`, then `body`), so
//! the same script always gets the same slots: runs that share a script, in parallel too,
//! store the same numbers.

use rustc_hash::FxHashMap;

use crate::workload::ast::{BlockKind, Expr, ExprKind, Ident, IndexItem, Stmt, StmtKind, Workload};

/// The slot of every variable name of `w` (stored in its idents too).
pub(super) fn resolve(w: &Workload) -> FxHashMap<String, u32> {
    let mut slots = FxHashMap::default();
    for (k, _) in &w.params {
        slot(&mut slots, k);
    }
    for s in w.setup.iter().chain(&w.body) {
        stmt(&mut slots, s);
    }
    slots
}

fn slot(slots: &mut FxHashMap<String, u32>, name: &str) -> u32 {
    let n = slots.len() as u32;
    *slots.entry(name.to_string()).or_insert(n)
}

fn ident(slots: &mut FxHashMap<String, u32>, i: &Ident) {
    let s = slot(slots, i.as_str());
    i.set_resolved(s);
}

fn stmt(slots: &mut FxHashMap<String, u32>, s: &Stmt) {
    match &s.kind {
        StmtKind::Assign { targets, value } => {
            expr(slots, value);
            for t in targets {
                ident(slots, t);
            }
        }
        StmtKind::SetItem { target, value } => {
            expr(slots, target);
            expr(slots, value);
        }
        StmtKind::Del(names) => {
            for n in names {
                ident(slots, n);
            }
        }
        StmtKind::Expr(e) => expr(slots, e),
        StmtKind::Block { kind, body } => {
            match kind {
                BlockKind::For { var, count } => {
                    expr(slots, count);
                    ident(slots, var);
                }
                BlockKind::Checkpoint { hold } => {
                    for n in hold {
                        ident(slots, n);
                    }
                }
                BlockKind::NoGrad
                | BlockKind::Autocast { .. }
                | BlockKind::Scope(_)
                | BlockKind::Phase(_) => {}
            }
            for s in body {
                stmt(slots, s);
            }
        }
    }
}

fn expr(slots: &mut FxHashMap<String, u32>, e: &Expr) {
    match &e.kind {
        ExprKind::Name(n) => ident(slots, n),
        ExprKind::Int(_)
        | ExprKind::Float(_)
        | ExprKind::Str(_)
        | ExprKind::Bool(_)
        | ExprKind::None => {}
        ExprKind::List(items) => {
            for i in items {
                expr(slots, i);
            }
        }
        ExprKind::Neg(x) => expr(slots, x),
        ExprKind::Binary { lhs, rhs, .. } => {
            expr(slots, lhs);
            expr(slots, rhs);
        }
        // a called function's name is not a variable
        ExprKind::Call { args, kwargs, .. } => {
            for a in args.iter().chain(kwargs.iter().map(|(_, v)| v)) {
                expr(slots, a);
            }
        }
        ExprKind::Method {
            recv, args, kwargs, ..
        } => {
            expr(slots, recv);
            for a in args.iter().chain(kwargs.iter().map(|(_, v)| v)) {
                expr(slots, a);
            }
        }
        ExprKind::Attr { recv, .. } => expr(slots, recv),
        ExprKind::Index { recv, items } => {
            expr(slots, recv);
            for it in items {
                match it {
                    IndexItem::Expr(x) => expr(slots, x),
                    IndexItem::Slice { start, stop, step } => {
                        for x in [start, stop, step].into_iter().flatten() {
                            expr(slots, x);
                        }
                    }
                    IndexItem::Ellipsis | IndexItem::NewAxis => {}
                }
            }
        }
    }
}
