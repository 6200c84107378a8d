//! A PyTorch snapshot file as it is written, for exports that must lose nothing: the pickle's
//! (or the JSON's) own values, every key, frames as frames, turned into JSON or into a pickle
//! to write. Objects the pickle shares (PyTorch's frame lists are shared between a block and
//! its trace entries) stay shared in a pickle written back.

use std::rc::Rc;

use rustc_hash::FxHashMap;
use serde_json::Value as Json;

use crate::trace::pickle::{Kind, Pickle, Value};
use crate::trace::pickle_write::W;

/// How deep a document may nest (PyTorch's are a handful of levels deep).
const MAX_DEPTH: usize = 200;

/// A snapshot document: a pickle read whole, or JSON.
pub enum Raw {
    Pickle(Pickle),
    Json(Json),
}

impl Raw {
    /// The document as JSON (shared objects written out at each use, as `json.dump` does).
    /// Refused when that would hold more than [`MAX_JSON_VALUES`] values: a pickle whose
    /// objects are shared many times over grows without bound when written out.
    pub fn to_json(&self) -> Result<Json, String> {
        match self {
            Raw::Json(v) => Ok(v.clone()),
            Raw::Pickle(p) => {
                let n = expanded_len(p, p.root(), 0, &mut FxHashMap::default())?;
                if n > MAX_JSON_VALUES {
                    return Err(too_many_json_values(n));
                }
                pickle_json(p, p.root(), 0)
            }
        }
    }

    /// The document as a value to pickle. A bare list of segments
    /// (`torch.cuda.memory_snapshot()`) becomes the dict PyTorch's viewer reads.
    pub fn to_pickle_value(&self) -> Result<W, String> {
        let w = match self {
            Raw::Json(v) => json_w(v, 0)?,
            Raw::Pickle(p) => {
                let mut c = Converter {
                    p,
                    refs: FxHashMap::default(),
                    shared: FxHashMap::default(),
                    strings: FxHashMap::default(),
                };
                c.count(p.root(), 0)?;
                c.w(p.root(), 0)?
            }
        };
        Ok(match w {
            W::List(_) => W::Dict(vec![
                (W::Str("segments".into()), w),
                (W::Str("device_traces".into()), W::List(vec![])),
            ]),
            other => other,
        })
    }
}

/// The most values a JSON export may hold (about 2-4 GB of JSON): past it, the file's shared
/// objects would be written out once per use.
pub const MAX_JSON_VALUES: u64 = 64 << 20;

/// The error for a JSON export of `n` values.
pub fn too_many_json_values(n: u64) -> String {
    format!(
        "written as JSON this snapshot would hold {n} values, more than {MAX_JSON_VALUES}: \
         objects it shares (stacks shared by many blocks) are written out at every use in \
         JSON; export it with --to memory-viz, whose pickle keeps them shared"
    )
}

/// How many values `v` holds with every shared object counted at each use (as JSON writes
/// it), each object's count computed once; saturating.
fn expanded_len(
    p: &Pickle,
    v: Value,
    depth: usize,
    memo: &mut FxHashMap<Value, u64>,
) -> Result<u64, String> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    if let Some(&n) = memo.get(&v) {
        return Ok(n);
    }
    let mut n: u64 = 1;
    match p.kind(v) {
        Kind::List | Kind::Tuple => {
            for x in p.items(v) {
                n = n.saturating_add(expanded_len(p, x, depth + 1, memo)?);
            }
        }
        Kind::Dict => {
            for (_, x) in p.entries(v) {
                n = n.saturating_add(expanded_len(p, x, depth + 1, memo)?);
            }
        }
        Kind::Bytes => n = n.saturating_add(p.bytes(v).map_or(0, |b| b.len() as u64)),
        _ => return Ok(1),
    }
    memo.insert(v, n);
    Ok(n)
}

fn too_deep() -> String {
    format!("the document nests deeper than {MAX_DEPTH} levels")
}

fn key_text(p: &Pickle, k: Value) -> String {
    match p.str(k) {
        Some(s) => s.to_string(),
        None => match p.int(k) {
            Some(i) => i.to_string(),
            None => format!("{k:?}"),
        },
    }
}

fn pickle_json(p: &Pickle, v: Value, depth: usize) -> Result<Json, String> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    Ok(match p.kind(v) {
        Kind::None => Json::Null,
        Kind::Bool => Json::Bool(p.bool(v).unwrap_or(false)),
        Kind::Int => Json::from(p.int(v).unwrap_or(0)),
        Kind::BigInt => match p.int128(v) {
            Some(i) if i >= 0 && i <= u64::MAX as i128 => Json::from(i as u64),
            Some(i) => Json::from(i as f64),
            None => return Err("an integer wider than 128 bits".into()),
        },
        Kind::Float => {
            serde_json::Number::from_f64(p.float(v).unwrap_or(0.0)).map_or(Json::Null, Json::Number)
        }
        Kind::Str => Json::String(p.str(v).unwrap_or("").to_string()),
        Kind::Bytes => Json::Array(
            p.bytes(v)
                .unwrap_or(&[])
                .iter()
                .map(|b| Json::from(*b))
                .collect(),
        ),
        Kind::List | Kind::Tuple => Json::Array(
            p.items(v)
                .map(|x| pickle_json(p, x, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        Kind::Dict => {
            let mut m = serde_json::Map::new();
            for (k, x) in p.entries(v) {
                m.insert(key_text(p, k), pickle_json(p, x, depth + 1)?);
            }
            Json::Object(m)
        }
    })
}

/// A string, shared with its earlier uses when it is long enough for a memo reference to be
/// shorter than the text.
fn shared_str(strings: &mut FxHashMap<String, Rc<W>>, s: &str) -> W {
    if s.len() < 4 {
        return W::Str(s.to_string());
    }
    W::Shared(
        strings
            .entry(s.to_string())
            .or_insert_with(|| Rc::new(W::Str(s.to_string())))
            .clone(),
    )
}

/// JSON as a value to pickle: repeated strings and repeated lists (frame lists, written out in
/// full at each use in JSON) are written once and referenced after.
fn json_w(v: &Json, depth: usize) -> Result<W, String> {
    let mut strings = FxHashMap::default();
    let mut lists = FxHashMap::default();
    json_w_shared(v, depth, &mut strings, &mut lists)
}

fn json_w_shared(
    v: &Json,
    depth: usize,
    strings: &mut FxHashMap<String, Rc<W>>,
    lists: &mut FxHashMap<String, Rc<W>>,
) -> Result<W, String> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    // a list of dicts (a frame list) seen before, by its text
    let key = match v {
        Json::Array(a) if a.first().is_some_and(|x| x.is_object()) && depth > 1 => {
            let k = v.to_string();
            if let Some(r) = lists.get(&k) {
                return Ok(W::Shared(r.clone()));
            }
            Some(k)
        }
        _ => None,
    };
    let w = match v {
        Json::Null => W::None,
        Json::Bool(b) => W::Bool(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => W::Int(i),
            (None, Some(u)) => W::Int(u as i64),
            _ => W::Float(n.as_f64().unwrap_or(0.0)),
        },
        Json::String(s) => shared_str(strings, s),
        Json::Array(a) => W::List(
            a.iter()
                .map(|x| json_w_shared(x, depth + 1, strings, lists))
                .collect::<Result<_, _>>()?,
        ),
        Json::Object(m) => W::Dict(
            m.iter()
                .map(|(k, x)| {
                    Ok((
                        shared_str(strings, k),
                        json_w_shared(x, depth + 1, strings, lists)?,
                    ))
                })
                .collect::<Result<_, String>>()?,
        ),
    };
    Ok(match key {
        Some(k) => {
            let r = Rc::new(w);
            lists.insert(k, r.clone());
            W::Shared(r)
        }
        None => w,
    })
}

/// Pickle values to write, sharing what the pickle shared.
struct Converter<'p> {
    p: &'p Pickle,
    /// References to each object, by its id.
    refs: FxHashMap<u32, u32>,
    shared: FxHashMap<u32, Rc<W>>,
    /// Strings by content, written once each (a pickle memoizes repeated file names).
    strings: FxHashMap<String, Rc<W>>,
}

impl Converter<'_> {
    fn count(&mut self, v: Value, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(too_deep());
        }
        if let Some(id) = self.p.obj_id(v) {
            let n = self.refs.entry(id).or_insert(0);
            *n += 1;
            if *n > 1 {
                return Ok(()); // its contents were counted the first time
            }
        }
        match self.p.kind(v) {
            Kind::List | Kind::Tuple => {
                for x in self.p.items(v) {
                    self.count(x, depth + 1)?;
                }
            }
            Kind::Dict => {
                for (_, x) in self.p.entries(v) {
                    self.count(x, depth + 1)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn w(&mut self, v: Value, depth: usize) -> Result<W, String> {
        if depth > MAX_DEPTH {
            return Err(too_deep());
        }
        let id = self.p.obj_id(v).filter(|id| self.refs.get(id) > Some(&1));
        if let Some(r) = id.and_then(|id| self.shared.get(&id)) {
            return Ok(W::Shared(r.clone()));
        }
        let p = self.p;
        let w = match p.kind(v) {
            Kind::None => W::None,
            Kind::Bool => W::Bool(p.bool(v).unwrap_or(false)),
            Kind::Int => W::Int(p.int(v).unwrap_or(0)),
            Kind::BigInt => W::Int(
                p.int128(v)
                    .and_then(|i| i64::try_from(i).ok())
                    .ok_or("an integer beyond 64 bits")?,
            ),
            Kind::Float => W::Float(p.float(v).unwrap_or(0.0)),
            Kind::Str => return Ok(shared_str(&mut self.strings, p.str(v).unwrap_or(""))),
            Kind::Bytes => return Err("bytes in a snapshot are not written back".into()),
            Kind::List => W::List(
                p.items(v)
                    .map(|x| self.w(x, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            Kind::Tuple => W::Tuple(
                p.items(v)
                    .map(|x| self.w(x, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            Kind::Dict => W::Dict(
                p.entries(v)
                    .map(|(k, x)| Ok((self.w(k, depth + 1)?, self.w(x, depth + 1)?)))
                    .collect::<Result<_, String>>()?,
            ),
        };
        Ok(match id {
            Some(id) => {
                let r = Rc::new(w);
                self.shared.insert(id, r.clone());
                W::Shared(r)
            }
            None => w,
        })
    }
}
