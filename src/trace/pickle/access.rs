//! The read API of a [`Pickle`]: values, containers, dict lookup, and columns of record-form
//! lists.

use super::keys::{key_eq, key_hash};
use super::store::{probe, Aside, Col, Data, Records};
use super::{Kind, ObjId, Pickle, StrId, Value};

/// A dict as stored: plain entries (with the object's index), or a row of a list.
enum DictView<'a> {
    Plain(u32, &'a [(Value, Value)]),
    Row(&'a Records, usize),
}

impl Pickle {
    /// The value the pickle was made of (its top-level object).
    pub fn root(&self) -> Value {
        self.root
    }

    fn data(&self, id: ObjId) -> Option<&Data> {
        self.objs.get(id.0 as usize).map(|n| &n.data)
    }

    pub fn kind(&self, v: Value) -> Kind {
        match v {
            Value::None => Kind::None,
            Value::Bool(_) => Kind::Bool,
            Value::Int(_) => Kind::Int,
            Value::Float(_) => Kind::Float,
            Value::Str(_) => Kind::Str,
            Value::Row(..) => Kind::Dict,
            Value::Obj(id) => match self.data(id) {
                Some(Data::List(_) | Data::Records(_)) => Kind::List,
                Some(Data::Tuple(_)) => Kind::Tuple,
                Some(Data::Dict(_)) => Kind::Dict,
                Some(Data::Bytes(_)) => Kind::Bytes,
                Some(Data::BigInt(_)) => Kind::BigInt,
                None => Kind::None, // an id from another pickle
            },
        }
    }

    /// An int that fits in i64 (and a bool as 0 or 1).
    pub fn int(&self, v: Value) -> Option<i64> {
        match v {
            Value::Int(i) => Some(i),
            Value::Bool(b) => Some(i64::from(b)),
            _ => None,
        }
    }

    /// An int that fits in i128, big ones included (e.g. addresses above 2^63).
    pub fn int128(&self, v: Value) -> Option<i128> {
        match v {
            Value::Obj(id) => match self.data(id)? {
                Data::BigInt(b) if b.len() <= 16 => {
                    let pad = if b[b.len() - 1] & 0x80 != 0 { 0xff } else { 0 };
                    let mut a = [pad; 16];
                    a[..b.len()].copy_from_slice(b);
                    Some(i128::from_le_bytes(a))
                }
                _ => None,
            },
            _ => self.int(v).map(i128::from),
        }
    }

    /// A big int's minimal little-endian two's complement bytes.
    pub fn big_int_bytes(&self, v: Value) -> Option<&[u8]> {
        match v {
            Value::Obj(id) => match self.data(id)? {
                Data::BigInt(b) => Some(b),
                _ => None,
            },
            _ => None,
        }
    }

    /// A float, or an int converted.
    pub fn float(&self, v: Value) -> Option<f64> {
        match v {
            Value::Float(f) => Some(f.get()),
            Value::Int(i) => Some(i as f64),
            _ => None,
        }
    }

    pub fn bool(&self, v: Value) -> Option<bool> {
        match v {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn str(&self, v: Value) -> Option<&str> {
        match v {
            Value::Str(s) => self
                .strs
                .bounds
                .get(s.0 as usize + 1)
                .map(|_| self.strs.get(s.0)),
            _ => None,
        }
    }

    /// The contents of a bytes or bytearray object.
    pub fn bytes(&self, v: Value) -> Option<&[u8]> {
        match v {
            Value::Obj(id) => match self.data(id)? {
                Data::Bytes(b) => Some(b),
                _ => None,
            },
            _ => None,
        }
    }

    fn dict_view(&self, v: Value) -> Option<DictView<'_>> {
        match v {
            Value::Obj(id) => match self.data(id)? {
                Data::Dict(e) => Some(DictView::Plain(id.0, e)),
                _ => None,
            },
            Value::Row(l, i) => match self.data(l)? {
                Data::Records(rec) => match rec.aside(i) {
                    Some(Aside::Dict(d)) => self.dict_view(Value::Obj(ObjId(d))),
                    Some(Aside::Item(_)) => None,
                    None => Some(DictView::Row(rec, i as usize)),
                },
                _ => None,
            },
            _ => None,
        }
    }

    /// The number of items of a list or tuple, or of entries of a dict.
    pub fn len(&self, v: Value) -> Option<usize> {
        if let Value::Obj(id) = v {
            match self.data(id)? {
                Data::List(l) => return Some(l.len()),
                Data::Records(r) => return Some(r.len as usize),
                Data::Tuple(t) => return Some(t.len()),
                _ => {}
            }
        }
        match self.dict_view(v)? {
            DictView::Plain(_, e) => Some(e.len()),
            DictView::Row(rec, _) => Some(rec.keys.len()),
        }
    }

    /// Item `i` of a list or tuple.
    pub fn item(&self, v: Value, i: usize) -> Option<Value> {
        let Value::Obj(id) = v else { return None };
        match self.data(id)? {
            Data::List(l) => l.get(i).copied(),
            Data::Tuple(t) => t.get(i).copied(),
            Data::Records(rec) if i < rec.len as usize => match rec.aside(i as u32) {
                Some(Aside::Item(x)) => Some(x),
                _ => Some(Value::Row(id, i as u32)),
            },
            _ => None,
        }
    }

    /// The items of a list or tuple (nothing for anything else).
    pub fn items(&self, v: Value) -> impl Iterator<Item = Value> + '_ {
        let n = match self.kind(v) {
            Kind::List | Kind::Tuple => self.len(v).unwrap_or(0),
            _ => 0,
        };
        (0..n).filter_map(move |i| self.item(v, i))
    }

    /// The value of a dict's str key `key`.
    pub fn get(&self, dict: Value, key: &str) -> Option<Value> {
        let id = self.strs.find(key)?;
        self.get_value(dict, Value::Str(StrId(id)))
    }

    /// The value of a dict's key, of any hashable kind, with Python's equality (1 == 1.0 == True).
    pub fn get_value(&self, dict: Value, key: Value) -> Option<Value> {
        let objs = &self.objs;
        match self.dict_view(dict)? {
            DictView::Plain(id, e) => match self.index.get(&id) {
                Some(t) => {
                    let h = key_hash(objs, key).ok()?;
                    let p = probe(t, h, |p| key_eq(objs, e[p as usize].0, key)).ok()?;
                    Some(e[p as usize].1)
                }
                None => e.iter().find(|x| key_eq(objs, x.0, key)).map(|x| x.1),
            },
            DictView::Row(rec, i) => {
                let c = rec.keys.iter().position(|&k| key_eq(objs, k, key))?;
                rec.cols[c].get(i)
            }
        }
    }

    /// A dict's (key, value) pairs in insertion order (nothing for anything else).
    pub fn entries(&self, dict: Value) -> impl Iterator<Item = (Value, Value)> + '_ {
        let view = self.dict_view(dict);
        let n = match &view {
            Some(DictView::Plain(_, e)) => e.len(),
            Some(DictView::Row(rec, _)) => rec.keys.len(),
            None => 0,
        };
        (0..n).filter_map(move |k| match &view {
            Some(DictView::Plain(_, e)) => e.get(k).copied(),
            Some(DictView::Row(rec, i)) => Some((rec.keys[k], rec.cols[k].get(*i)?)),
            None => None,
        })
    }

    /// Entries of `list` that [`super::read_file`] read as projected rows instead of dicts, in
    /// order, each run with the number of the list's own items (as [`len`](Pickle::len) and
    /// [`item`](Pickle::item) give them) that come before it. The list's entries are its items
    /// with these runs inserted: empty for a list read sequentially.
    pub fn projected(&self, list: Value) -> Vec<(usize, &super::Projected)> {
        let Value::Obj(id) = list else {
            return Vec::new();
        };
        self.taken
            .iter()
            .filter(|t| t.list == id)
            .map(|t| (t.after as usize, &t.rows))
            .collect()
    }

    /// Moves the projected rows out of the pickle (for a reader that consumes them run by
    /// run): `(list, items before, rows)` in order. [`projected`](Pickle::projected) is empty
    /// afterwards.
    pub fn take_projected(&mut self) -> Vec<(Value, usize, super::Projected)> {
        std::mem::take(&mut self.taken)
            .into_iter()
            .map(|t| (Value::Obj(t.list), t.after as usize, t.rows))
            .collect()
    }

    /// How many objects and strings the pickle holds: ids of [`Projected`](super::Projected)
    /// rows are below these (for tables indexed by id).
    pub fn id_bounds(&self) -> (usize, usize) {
        (self.objs.len(), self.strs.bounds.len().saturating_sub(1))
    }

    /// The identity of an object (`Value::Obj`), for caching by identity. A dict stored as a row
    /// has none: use the `Value` itself (`Eq + Hash`, by identity) as the key for any object.
    pub fn obj_id(&self, v: Value) -> Option<u32> {
        match v {
            Value::Obj(id) => Some(id.0),
            _ => None,
        }
    }

    /// For a list stored in record form (a list of same-keyed dicts), the values of one key by
    /// row, read straight from its column: what `get(item(list, i), key)` gives, without a
    /// lookup per row. `None` when the list is not in record form or has no such key column.
    pub fn column<'a>(&'a self, list: Value, key: &'a str) -> Option<Column<'a>> {
        let Value::Obj(id) = list else { return None };
        let Some(Data::Records(rec)) = self.data(id) else {
            return None;
        };
        let k = rec
            .keys
            .iter()
            .position(|k| matches!(k, Value::Str(s) if self.strs.get(s.0) == key));
        // a key the rows lack may still be in the items kept aside (a trace's `oom` entries
        // carry `device_free`, which its alloc and free entries do not)
        if k.is_none() && rec.aside.is_empty() {
            return None;
        }
        Some(Column {
            p: self,
            list,
            rec,
            col: k.map(|k| &rec.cols[k]),
            key,
        })
    }
}

/// One key's values over the rows of a record-form list (see [`Pickle::column`]).
pub struct Column<'a> {
    p: &'a Pickle,
    list: Value,
    rec: &'a Records,
    /// `None`: no plain row has the key.
    col: Option<&'a Col>,
    key: &'a str,
}

impl Column<'_> {
    /// Rows (items) of the list.
    pub fn len(&self) -> usize {
        self.rec.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.rec.len == 0
    }

    /// The value in row `i`; for an item kept aside (not a plain row), the same as
    /// `get(item(list, i), key)`.
    #[inline]
    pub fn get(&self, i: usize) -> Option<Value> {
        if !self.rec.aside.is_empty() && self.rec.aside(i as u32).is_some() {
            let item = self.p.item(self.list, i)?;
            return self.p.get(item, self.key);
        }
        self.col?.get(i)
    }
}
