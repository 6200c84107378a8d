//! Python's `==` and hash on dict keys, over the arena.

use super::input::{msg, R};
use super::store::{Data, Node};
use super::Value;
use rustc_hash::FxHasher;
use std::hash::Hasher;

/// `a == b` (identity), with a test of the usual case first: str keys, compared by id (the
/// derived `==` jumps on the variant, which a long sequence of key checks mispredicts).
#[inline(always)]
pub(super) fn same_key(a: Value, b: Value) -> bool {
    match (a, b) {
        (Value::Str(x), Value::Str(y)) => x == y,
        _ => a == b,
    }
}

/// Python's `==` on dict keys: numbers by value (1 == 1.0 == True), strings by interned id,
/// tuples, bytes and big ints by content. Iterative, so deep tuples cannot overflow the stack.
#[inline]
pub(super) fn key_eq(objs: &[Node], a: Value, b: Value) -> bool {
    match (a, b) {
        _ if a == b => true,
        (Value::Str(_), _) | (_, Value::Str(_)) | (Value::None, _) | (_, Value::None) => false,
        _ => key_eq_slow(objs, a, b),
    }
}

fn key_eq_slow(objs: &[Node], a: Value, b: Value) -> bool {
    let mut todo = vec![(a, b)];
    while let Some((a, b)) = todo.pop() {
        if a == b {
            continue;
        }
        let eq = match (num(a), num(b), a, b) {
            (Some(x), Some(y), ..) => x == y,
            (_, _, Value::Obj(x), Value::Obj(y)) => {
                match (&objs[x.0 as usize].data, &objs[y.0 as usize].data) {
                    (Data::Tuple(x), Data::Tuple(y)) if x.len() == y.len() => {
                        todo.extend(x.iter().copied().zip(y.iter().copied()));
                        true
                    }
                    (Data::Bytes(x), Data::Bytes(y)) | (Data::BigInt(x), Data::BigInt(y)) => x == y,
                    _ => false,
                }
            }
            _ => false,
        };
        if !eq {
            return false;
        }
    }
    true
}

/// A number as an exact key: an integral float that fits i64 equals that int.
#[derive(PartialEq)]
enum Num {
    I(i64),
    F(u64),
}

fn num(v: Value) -> Option<Num> {
    Some(match v {
        Value::Bool(b) => Num::I(i64::from(b)),
        Value::Int(i) => Num::I(i),
        Value::Float(f) => {
            let x = f.get();
            if x.fract() == 0.0
                && (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&x)
            {
                Num::I(x as i64)
            } else {
                Num::F(f.0)
            }
        }
        _ => return None,
    })
}

/// A hash consistent with [`key_eq`]; fails on unhashable keys (lists, dicts), as Python does.
pub(super) fn key_hash(objs: &[Node], v: Value) -> R<u64> {
    let mut h = FxHasher::default();
    let mut todo = vec![v];
    while let Some(v) = todo.pop() {
        match (num(v), v) {
            (Some(Num::I(i)), _) => h.write_i64(i),
            (Some(Num::F(f)), _) => h.write_u64(f ^ 0x5555),
            (_, Value::None) => h.write_u8(1),
            (_, Value::Str(s)) => h.write_u64(u64::from(s.0) << 8 | 2),
            (_, Value::Obj(id)) => match &objs[id.0 as usize].data {
                Data::Tuple(t) => {
                    h.write_usize(t.len());
                    todo.extend(t.iter().copied());
                }
                Data::Bytes(b) | Data::BigInt(b) => h.write(b),
                _ => return msg("uses an unhashable key (a list or dict) in a dict"),
            },
            _ => return msg("uses an unhashable key (a dict) in a dict"),
        }
    }
    Ok(h.finish())
}
