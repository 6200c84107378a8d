//! A snapshot document, read the same way whether it came from a pickle or from JSON: the
//! [`Doc`] trait that [`super::torch`] reads PyTorch's snapshot dict through, with its two
//! documents ([`PickleDoc`], whose trace may hold rows projected on several cores, and
//! [`JsonDoc`]) and the keys of a trace entry the parallel reader projects ([`TRACE`]).

use crate::trace::pickle::{Pickle, Projected, Projection, Value as PValue};

pub trait Doc<'a> {
    type V: Copy + PartialEq + 'a;
    fn get(&self, v: Self::V, key: &str) -> Option<Self::V>;
    fn int(&self, v: Self::V) -> Option<i64>;
    fn float(&self, v: Self::V) -> Option<f64>;
    fn boolean(&self, v: Self::V) -> Option<bool>;
    fn text(&self, v: Self::V) -> Option<&'a str>;
    fn is_list(&self, v: Self::V) -> bool;
    fn is_dict(&self, v: Self::V) -> bool;
    fn list(&self, v: Self::V) -> Box<dyn Iterator<Item = Self::V> + 'a>;
    /// An identity for shared objects (the same list twice gives the same number).
    fn identity(&self, v: Self::V) -> Option<usize>;
    /// Calls `f` with each string key and its value of a dict (one pass, for hot loops).
    fn visit(&self, dict: Self::V, f: &mut dyn FnMut(&str, Self::V));
    /// For a list of same-keyed dicts stored by columns: key `key` of row `i`, fast.
    #[allow(clippy::type_complexity)]
    fn column<'b>(
        &'b self,
        _list: Self::V,
        _key: &'b str,
    ) -> Option<Box<dyn Fn(usize) -> Option<Self::V> + 'b>> {
        None
    }
    /// How many entries of a list were read as projected rows ([`TRACE`]): none but for a
    /// pickle read on several cores.
    fn projected_rows(&self, _list: Self::V) -> usize {
        0
    }
    /// Those rows, moved out (so that each run is freed once converted), each run after that
    /// many of the list's own items.
    fn take_projected(&self, _list: Self::V) -> Vec<(usize, Projected)> {
        Vec::new()
    }
    /// A pickle value of projected rows as a value of this document.
    fn pickle_value(&self, _v: PValue) -> Option<Self::V> {
        None
    }
    /// For projected rows: how many objects and strings there are (ids are below these).
    fn id_bounds(&self) -> (usize, usize) {
        (0, 0)
    }
}

/// The keys of a trace entry that [`convert`] reads, for the parallel pickle reader.
pub const TRACE: Projection = Projection {
    detect: "action",
    ints: &["addr", "size", "stream", "time_us", "device_free"],
    strs: &["action", "user_metadata", "compile_context"],
    objs: &["frames"],
};

/// A pickle, with the projected rows taken out of it ([`Pickle::take_projected`]).
pub struct PickleDoc<'a>(pub &'a Pickle, pub Runs);

/// Projected rows by list: (list, items before, rows), taken once.
pub type Runs = std::cell::RefCell<Vec<(PValue, usize, Option<Projected>)>>;

impl<'a> PickleDoc<'a> {
    /// `p`, with the projected rows it held (`runs`, from [`Pickle::take_projected`]).
    pub fn new(p: &'a Pickle, runs: Vec<(PValue, usize, Projected)>) -> Self {
        PickleDoc(
            p,
            std::cell::RefCell::new(runs.into_iter().map(|(l, a, r)| (l, a, Some(r))).collect()),
        )
    }
}

impl<'a> Doc<'a> for PickleDoc<'a> {
    type V = PValue;
    fn get(&self, v: PValue, key: &str) -> Option<PValue> {
        self.0.get(v, key)
    }
    fn int(&self, v: PValue) -> Option<i64> {
        self.0.int(v)
    }
    fn float(&self, v: PValue) -> Option<f64> {
        self.0.float(v)
    }
    fn boolean(&self, v: PValue) -> Option<bool> {
        self.0.bool(v)
    }
    fn text(&self, v: PValue) -> Option<&'a str> {
        self.0.str(v)
    }
    fn is_list(&self, v: PValue) -> bool {
        matches!(
            self.0.kind(v),
            crate::trace::pickle::Kind::List | crate::trace::pickle::Kind::Tuple
        )
    }
    fn is_dict(&self, v: PValue) -> bool {
        self.0.kind(v) == crate::trace::pickle::Kind::Dict
    }
    fn list(&self, v: PValue) -> Box<dyn Iterator<Item = PValue> + 'a> {
        Box::new(self.0.items(v))
    }
    fn identity(&self, v: PValue) -> Option<usize> {
        self.0.obj_id(v).map(|i| i as usize)
    }
    fn visit(&self, dict: PValue, f: &mut dyn FnMut(&str, PValue)) {
        for (k, v) in self.0.entries(dict) {
            if let Some(k) = self.0.str(k) {
                f(k, v);
            }
        }
    }
    fn column<'b>(
        &'b self,
        list: PValue,
        key: &'b str,
    ) -> Option<Box<dyn Fn(usize) -> Option<PValue> + 'b>> {
        let c = self.0.column(list, key)?;
        Some(Box::new(move |i| c.get(i)))
    }
    fn projected_rows(&self, list: PValue) -> usize {
        self.1
            .borrow()
            .iter()
            .filter(|r| r.0 == list)
            .filter_map(|r| r.2.as_ref().map(|p| p.rows()))
            .sum()
    }
    fn take_projected(&self, list: PValue) -> Vec<(usize, Projected)> {
        self.1
            .borrow_mut()
            .iter_mut()
            .filter(|r| r.0 == list)
            .filter_map(|r| Some((r.1, r.2.take()?)))
            .collect()
    }
    fn pickle_value(&self, v: PValue) -> Option<PValue> {
        Some(v)
    }
    fn id_bounds(&self) -> (usize, usize) {
        self.0.id_bounds()
    }
}

pub struct JsonDoc;

impl<'a> Doc<'a> for JsonDoc {
    type V = &'a serde_json::Value;
    fn get(&self, v: Self::V, key: &str) -> Option<Self::V> {
        v.get(key)
    }
    fn int(&self, v: Self::V) -> Option<i64> {
        v.as_i64()
            .or_else(|| v.as_u64().map(|u| u as i64))
            .or_else(|| v.as_bool().map(i64::from))
    }
    fn float(&self, v: Self::V) -> Option<f64> {
        v.as_f64()
    }
    fn boolean(&self, v: Self::V) -> Option<bool> {
        v.as_bool()
    }
    fn text(&self, v: Self::V) -> Option<&'a str> {
        v.as_str()
    }
    fn is_list(&self, v: Self::V) -> bool {
        v.is_array()
    }
    fn is_dict(&self, v: Self::V) -> bool {
        v.is_object()
    }
    fn list(&self, v: Self::V) -> Box<dyn Iterator<Item = Self::V> + 'a> {
        match v.as_array() {
            Some(a) => Box::new(a.iter()),
            None => Box::new(std::iter::empty()),
        }
    }
    fn identity(&self, v: Self::V) -> Option<usize> {
        Some(v as *const serde_json::Value as usize)
    }
    fn visit(&self, dict: Self::V, f: &mut dyn FnMut(&str, Self::V)) {
        if let Some(m) = dict.as_object() {
            for (k, v) in m {
                f(k, v);
            }
        }
    }
}
