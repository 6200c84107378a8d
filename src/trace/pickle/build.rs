//! Filling containers while reading: APPEND(S) into lists (dicts become rows of a record-form
//! list), SETITEM(S) into dicts and rows, and the hash indexes of large dicts.

use super::input::{msg, R};
use super::keys::{key_eq, key_hash, same_key};
use super::parse::Parser;
use super::store::{probe, Aside, Col, Data, Node, Records};
use super::{ObjId, Value, INDEX_AT, MAX_DEPTH, NO_MEMO, SHARED};

impl Parser {
    #[inline]
    pub(super) fn depth(&self, v: Value) -> u32 {
        match v {
            Value::Obj(id) => self.objs[id.0 as usize].depth,
            Value::Row(l, _) => self.objs[l.0 as usize].depth.saturating_sub(1),
            _ => 0,
        }
    }

    /// Records that container `id` now holds values of depth `d`.
    #[inline(always)]
    fn deepen(&mut self, id: ObjId, d: u32) -> R<()> {
        if d >= MAX_DEPTH {
            return msg(format!("nests containers deeper than {MAX_DEPTH} levels"));
        }
        let n = &mut self.objs[id.0 as usize];
        n.depth = n.depth.max(d + 1);
        Ok(())
    }

    pub(super) fn append(&mut self, list: Value, v: Value) -> R<()> {
        let Value::Obj(lid) = list else {
            return msg("appends to something that is not a list");
        };
        self.deepen(lid, self.depth(v))?;
        // A dict referenced nowhere else can become a row of the list.
        if let Value::Obj(did) = v {
            let n = &self.objs[did.0 as usize];
            if n.memo != SHARED {
                if let Data::Dict(e) = &n.data {
                    if !e.is_empty() && e.len() <= INDEX_AT && self.make_row(lid, did)? {
                        return Ok(());
                    }
                }
            }
        }
        match &mut self.objs[lid.0 as usize].data {
            Data::List(items) => items.push(v),
            Data::Records(rec) => {
                let i = rec.len;
                rec.len = i
                    .checked_add(1)
                    .map_or_else(|| msg("makes a list too long"), Ok)?;
                rec.cols.iter_mut().for_each(Col::push_filler);
                rec.aside.push((i, Aside::Item(v)));
            }
            _ => return msg("appends to something that is not a list"),
        }
        Ok(())
    }

    /// Moves dict `did` into list `lid` as a row, if the list is empty or has the same keys.
    fn make_row(&mut self, lid: ObjId, did: ObjId) -> R<bool> {
        let (l, d) = (lid.0 as usize, did.0 as usize);
        let Data::Dict(entries) = &mut self.objs[d].data else {
            return Ok(false);
        };
        let entries = std::mem::take(entries);
        let row = match &mut self.objs[l].data {
            // The first dict of a list (after at most 8 other items, kept aside).
            Data::List(items) if items.len() <= 8 => {
                let n = items.len();
                let aside = items
                    .iter()
                    .enumerate()
                    .map(|(k, &v)| (k as u32, Aside::Item(v)));
                let aside = aside.collect();
                self.objs[l].data = Data::Records(Box::new(Records {
                    keys: entries.iter().map(|e| e.0).collect(),
                    cols: entries.iter().map(|e| Col::new(e.1, n)).collect(),
                    len: n as u32 + 1,
                    aside,
                }));
                Some(n as u32)
            }
            Data::Records(rec)
                if rec.keys.len() == entries.len()
                    && rec
                        .keys
                        .iter()
                        .zip(&entries)
                        .all(|(k, e)| same_key(*k, e.0)) =>
            {
                let i = rec.len;
                rec.len = i
                    .checked_add(1)
                    .map_or_else(|| msg("makes a list too long"), Ok)?;
                for (c, e) in rec.cols.iter_mut().zip(&entries) {
                    c.push(e.1);
                }
                Some(i)
            }
            _ => None,
        };
        let n = &mut self.objs[d];
        let mut entries = entries;
        let Some(i) = row else {
            n.data = Data::Dict(entries);
            return Ok(false);
        };
        // The dict's memo entry now names the row; its node is recycled.
        let m = n.memo as usize;
        entries.clear();
        *n = Node {
            depth: 1,
            memo: NO_MEMO,
            data: Data::Dict(entries),
        };
        if let Some(slot) = self.memo.get_mut(m) {
            if *slot == Some(Value::Obj(did)) {
                *slot = Some(Value::Row(lid, i));
            }
        } else if self.memo_far.get(&(m as u32)) == Some(&Value::Obj(did)) {
            self.memo_far.insert(m as u32, Value::Row(lid, i));
        }
        self.free_dicts.push(did.0);
        Ok(true)
    }

    /// SETITEMS: the pairs `stack[m..]` into `dict`.
    pub(super) fn setitems(&mut self, dict: Value, m: usize) -> R<()> {
        if !(self.stack.len() - m).is_multiple_of(2) {
            return msg("has a key without a value");
        }
        if let Value::Obj(id) = dict {
            if matches!(self.objs[id.0 as usize].data, Data::Dict(_)) {
                // A plain dict (the common case): check and measure all pairs, then insert.
                let (mut d, mut all_str) = (0, true);
                for p in self.stack[m..].chunks_exact(2) {
                    d = d.max(self.depth(p[0])).max(self.depth(p[1]));
                    all_str &= matches!(p[0], Value::Str(_));
                    if matches!(p[0], Value::Obj(_) | Value::Row(..)) {
                        key_hash(&self.objs, p[0])?; // refuses unhashable keys, as Python does
                    }
                }
                self.deepen(id, d)?;
                let pairs = &self.stack[m..];
                let n = pairs.len() / 2;
                let fresh = matches!(&self.objs[id.0 as usize].data, Data::Dict(e) if e.is_empty());
                // Dicts of a trace have the same keys as the last one, known to be distinct:
                // no need to check them against each other.
                let same = fresh
                    && n == self.last_keys.len()
                    && self
                        .last_keys
                        .iter()
                        .enumerate()
                        .all(|(j, &k)| same_key(pairs[2 * j], k));
                if let (true, Data::Dict(e)) = (same, &mut self.objs[id.0 as usize].data) {
                    e.reserve(n);
                    for p in pairs.chunks_exact(2) {
                        e.push((p[0], p[1]));
                    }
                    return Ok(());
                }
                for k in (m..self.stack.len()).step_by(2) {
                    self.dict_set(id.0, self.stack[k], self.stack[k + 1])?;
                }
                if let (true, true, Data::Dict(e)) =
                    (fresh, all_str, &self.objs[id.0 as usize].data)
                {
                    if e.len() == n && n <= INDEX_AT {
                        self.last_keys.clear();
                        self.last_keys.extend(e.iter().map(|x| x.0));
                    }
                }
                return Ok(());
            }
        }
        for k in (m..self.stack.len()).step_by(2) {
            self.setitem(dict, self.stack[k], self.stack[k + 1])?;
        }
        Ok(())
    }

    pub(super) fn setitem(&mut self, dict: Value, k: Value, v: Value) -> R<()> {
        if matches!(k, Value::Obj(_) | Value::Row(..)) {
            key_hash(&self.objs, k)?; // refuses unhashable keys, as Python does
        }
        let d = self.depth(k).max(self.depth(v));
        match dict {
            Value::Obj(id) if matches!(self.objs[id.0 as usize].data, Data::Dict(_)) => {
                self.deepen(id, d)?;
                self.dict_set(id.0, k, v)
            }
            Value::Row(lid, i) => {
                self.deepen(lid, d + 1)?;
                let Data::Records(rec) = &self.objs[lid.0 as usize].data else {
                    return msg("sets an item on a broken row");
                };
                match rec.aside(i) {
                    Some(Aside::Dict(did)) => {
                        self.deepen(ObjId(did), d)?;
                        return self.dict_set(did, k, v);
                    }
                    Some(Aside::Item(_)) => return msg("sets an item on a broken row"),
                    None => {}
                }
                let at = rec.keys.iter().position(|&x| key_eq(&self.objs, x, k));
                let Data::Records(rec) = &mut self.objs[lid.0 as usize].data else {
                    return msg("sets an item on a broken row");
                };
                if let Some(c) = at {
                    rec.cols[c].put(i as usize, v);
                    return Ok(());
                }
                // A key the other rows lack: this row moves aside into a plain dict.
                let cells = rec
                    .cols
                    .iter()
                    .map(|c| c.get(i as usize).unwrap_or(Value::None));
                let mut entries: Vec<(Value, Value)> =
                    rec.keys.iter().copied().zip(cells).collect();
                entries.push((k, v));
                let n = entries.len();
                let depth = self.objs[lid.0 as usize].depth;
                let Value::Obj(did) = self.new_obj(Data::Dict(entries), depth)? else {
                    return msg("sets an item on a broken row");
                };
                if let Data::Records(rec) = &mut self.objs[lid.0 as usize].data {
                    let at = rec.aside.partition_point(|a| a.0 < i);
                    rec.aside.insert(at, (i, Aside::Dict(did.0)));
                }
                if n > INDEX_AT {
                    self.reindex(did.0, n)?;
                }
                Ok(())
            }
            _ => msg("sets an item on something that is not a dict"),
        }
    }

    #[inline]
    fn dict_set(&mut self, did: u32, k: Value, v: Value) -> R<()> {
        // Fast path: a str key in a small dict (only a str can equal a str).
        if let (Value::Str(_), Data::Dict(e)) = (k, &mut self.objs[did as usize].data) {
            if e.len() < INDEX_AT {
                match e.iter_mut().find(|x| x.0 == k) {
                    Some(x) => x.1 = v,
                    None => e.push((k, v)),
                }
                return Ok(());
            }
        }
        let objs = &self.objs;
        let Data::Dict(entries) = &objs[did as usize].data else {
            return msg("sets an item on something that is not a dict");
        };
        let found = match self.index.get(&did).filter(|_| entries.len() > INDEX_AT) {
            Some(t) => {
                let h = key_hash(objs, k)?;
                probe(t, h, |p| key_eq(objs, entries[p as usize].0, k)).ok()
            }
            None => entries
                .iter()
                .position(|e| key_eq(objs, e.0, k))
                .map(|p| p as u32),
        };
        let Data::Dict(entries) = &mut self.objs[did as usize].data else {
            return msg("sets an item on something that is not a dict");
        };
        if let Some(p) = found {
            entries[p as usize].1 = v;
            return Ok(());
        }
        entries.push((k, v));
        let n = entries.len();
        if n > INDEX_AT {
            self.reindex(did, n)?;
        }
        Ok(())
    }

    /// Adds the last of `n` entries to dict `did`'s index, rebuilding it when it is half full.
    fn reindex(&mut self, did: u32, n: usize) -> R<()> {
        let mut t = self.index.remove(&did).unwrap_or_default();
        let from = if n * 2 > t.len() {
            t = vec![0; (n * 4).next_power_of_two()];
            0
        } else {
            n - 1
        };
        if let Data::Dict(entries) = &self.objs[did as usize].data {
            for (p, e) in entries.iter().enumerate().skip(from) {
                if let Err(slot) = probe(&t, key_hash(&self.objs, e.0)?, |_| false) {
                    t[slot] = p as u32 + 1;
                }
            }
        }
        self.index.insert(did, t);
        Ok(())
    }
}
