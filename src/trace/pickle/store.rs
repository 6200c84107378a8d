//! The arena a [`Pickle`](super::Pickle) refers to: object nodes, lists of same-keyed dicts in
//! record form (typed columns), and the interned strings with their open-addressing hash table.

use super::input::{msg, R};
use super::{ObjId, StrId, Value, SHARED};
use rustc_hash::FxHasher;
use std::hash::Hasher;

#[derive(Debug)]
pub(super) struct Node {
    pub(super) depth: u32,
    /// While reading: the memo slot holding this object, `NO_MEMO` or `SHARED`.
    pub(super) memo: u32,
    pub(super) data: Data,
}

#[derive(Debug)]
pub(super) enum Data {
    List(Vec<Value>),
    Records(Box<Records>),
    Tuple(Box<[Value]>),
    Dict(Vec<(Value, Value)>),
    Bytes(Box<[u8]>),
    /// Little-endian two's complement, minimal, longer than 8 bytes.
    BigInt(Box<[u8]>),
}

/// A list of same-keyed dicts, stored by columns. `aside` holds, sorted by index, the items that
/// are not rows (`Item`) and the rows that were given other keys after the fact (`Dict`); their
/// column slots hold fillers.
#[derive(Debug)]
pub(super) struct Records {
    pub(super) keys: Box<[Value]>,
    pub(super) cols: Box<[Col]>,
    pub(super) len: u32,
    pub(super) aside: Vec<(u32, Aside)>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Aside {
    Item(Value),
    Dict(u32),
}

#[derive(Debug)]
pub(super) enum Col {
    I32(Vec<i32>),
    I64(Vec<i64>),
    Str(Vec<u32>),
    Obj(Vec<u32>),
    Any(Vec<Value>),
}

impl Col {
    /// A column of `v`'s type holding `fillers` fillers, then `v`.
    pub(super) fn new(v: Value, fillers: usize) -> Col {
        let mut c = match v {
            Value::Int(i) if i32::try_from(i).is_ok() => Col::I32(Vec::new()),
            Value::Int(_) => Col::I64(Vec::new()),
            Value::Str(_) => Col::Str(Vec::new()),
            Value::Obj(_) => Col::Obj(Vec::new()),
            _ => Col::Any(Vec::new()),
        };
        (0..fillers).for_each(|_| c.push_filler());
        c.push(v);
        c
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Col::I32(c) => c.len(),
            Col::I64(c) => c.len(),
            Col::Str(c) | Col::Obj(c) => c.len(),
            Col::Any(c) => c.len(),
        }
    }

    pub(super) fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Col::I32(c) => Value::Int(i64::from(*c.get(i)?)),
            Col::I64(c) => Value::Int(*c.get(i)?),
            Col::Str(c) => Value::Str(StrId(*c.get(i)?)),
            Col::Obj(c) => Value::Obj(ObjId(*c.get(i)?)),
            Col::Any(c) => *c.get(i)?,
        })
    }

    /// Stores `v` at `i` (`i == len` appends), changing the column's type when `v` needs it:
    /// i32 widens to i64, and any other mismatch makes the column general.
    pub(super) fn put(&mut self, i: usize, v: Value) {
        let fits = match (&mut *self, v) {
            (Col::I32(c), Value::Int(x)) => i32::try_from(x).map(|x| set(c, i, x)).is_ok(),
            (Col::I64(c), Value::Int(x)) => set(c, i, x),
            (Col::Str(c), Value::Str(s)) => set(c, i, s.0),
            (Col::Obj(c), Value::Obj(o)) => set(c, i, o.0),
            (Col::Any(c), v) => set(c, i, v),
            _ => false,
        };
        if !fits {
            *self = match self {
                Col::I32(c) if matches!(v, Value::Int(_)) => {
                    Col::I64(c.iter().map(|&x| i64::from(x)).collect())
                }
                _ => Col::Any((0..self.len()).filter_map(|k| self.get(k)).collect()),
            };
            self.put(i, v);
        }
    }

    #[inline(always)]
    pub(super) fn push(&mut self, v: Value) {
        match (&mut *self, v) {
            (Col::I32(c), Value::Int(x)) if x as i32 as i64 == x => c.push(x as i32),
            (Col::I64(c), Value::Int(x)) => c.push(x),
            (Col::Str(c), Value::Str(x)) => c.push(x.0),
            (Col::Obj(c), Value::Obj(x)) => c.push(x.0),
            (Col::Any(c), v) => c.push(v),
            _ => self.put(self.len(), v),
        }
    }

    /// A slot for an item kept aside, of the column's own type (never read).
    pub(super) fn push_filler(&mut self) {
        match self {
            Col::I32(c) => c.push(0),
            Col::I64(c) => c.push(0),
            Col::Str(c) | Col::Obj(c) => c.push(0),
            Col::Any(c) => c.push(Value::None),
        }
    }

    pub(super) fn shrink(&mut self) {
        match self {
            Col::I32(c) => c.shrink_to_fit(),
            Col::I64(c) => c.shrink_to_fit(),
            Col::Str(c) | Col::Obj(c) => c.shrink_to_fit(),
            Col::Any(c) => c.shrink_to_fit(),
        }
    }
}

/// `c[i] = x`, or a push when `i == c.len()`; returns true (for `Col::put`).
fn set<T>(c: &mut Vec<T>, i: usize, x: T) -> bool {
    match c.get_mut(i) {
        Some(slot) => *slot = x,
        None => c.push(x),
    }
    true
}

impl Records {
    pub(super) fn aside(&self, i: u32) -> Option<Aside> {
        if self.aside.is_empty() {
            return None;
        }
        let k = self.aside.binary_search_by_key(&i, |a| a.0).ok()?;
        Some(self.aside[k].1)
    }
}

// ---------------------------------------------------------------------------------------------
// Interned strings and open-addressing hash tables (ids + 1 in a power-of-two table, 0 = empty)

#[derive(Debug, Default)]
pub(super) struct Strings {
    text: String,
    /// `bounds[i]..bounds[i + 1]` is string `i` in `text`.
    pub(super) bounds: Vec<usize>,
    table: Vec<u32>,
}

fn hash_bytes(b: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(b);
    h.finish()
}

/// Finds the entry for which `eq` holds (`Ok(id)`), or the empty slot where it would go.
pub(super) fn probe(
    table: &[u32],
    hash: u64,
    mut eq: impl FnMut(u32) -> bool,
) -> Result<u32, usize> {
    let mask = table.len() - 1;
    let mut i = (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & mask;
    loop {
        match table[i] {
            0 => return Err(i),
            e if eq(e - 1) => return Ok(e - 1),
            _ => i = (i + 1) & mask,
        }
    }
}

impl Strings {
    pub(super) fn get(&self, id: u32) -> &str {
        let i = id as usize;
        &self.text[self.bounds[i]..self.bounds[i + 1]]
    }

    pub(super) fn find(&self, s: &str) -> Option<u32> {
        if self.table.is_empty() {
            return None;
        }
        probe(&self.table, hash_bytes(s.as_bytes()), |id| {
            self.get(id) == s
        })
        .ok()
    }

    pub(super) fn intern(&mut self, s: &str) -> R<u32> {
        if self.bounds.is_empty() {
            self.bounds.push(0);
        }
        let n = self.bounds.len() - 1;
        if n * 2 >= self.table.len() {
            let mut table = vec![0u32; (self.table.len() * 2).max(1024)];
            for id in 0..n as u32 {
                let h = hash_bytes(self.get(id).as_bytes());
                if let Err(slot) = probe(&table, h, |_| false) {
                    table[slot] = id + 1;
                }
            }
            self.table = table;
        }
        match probe(&self.table, hash_bytes(s.as_bytes()), |id| {
            self.get(id) == s
        }) {
            Ok(id) => Ok(id),
            Err(slot) => {
                let id = u32::try_from(n).ok().filter(|&i| i < SHARED);
                let id = id.map_or_else(|| msg("makes more than 4 billion strings"), Ok)?;
                self.text.push_str(s);
                self.bounds.push(self.text.len());
                self.table[slot] = id + 1;
                Ok(id)
            }
        }
    }
}
