//! A safe, streaming reader (and, in [`super::pickle_write`], a small writer) of Python pickles,
//! for PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot` writes
//! `pickle.dump(snapshot_dict, f)`).
//!
//! **Safety.** Only data opcodes are read: None, bools, ints, floats, str, bytes, lists, tuples,
//! dicts and sets (read as lists). Every opcode that could import or run code or build an instance
//! (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT1/2/4, PERSID,
//! BINPERSID), out-of-band buffers and unknown opcodes are refused with a [`PickleError`] naming
//! the byte offset. Truncation, stack underflow, a missing MARK, an unknown memo index, nesting
//! deeper than [`MAX_DEPTH`] and unhashable dict keys are errors too; nothing panics, nothing
//! recurses, and no allocation is sized by a length read from the file (long strings are read
//! incrementally, so memory follows the bytes actually present).
//! Protocols 2 to 5 are read; protocol 0/1 text opcodes are refused. In protocols 2 and 3,
//! CPython writes bytes and sets with REDUCE, so those can only be read at protocol 4 or 5.
//!
//! **Sharing.** Objects live in an arena and are referred to by [`Value`]s (16 bytes, `Copy`).
//! A memoized object fetched again (BINGET) is the same object: the same `Value`, stored once, so
//! PyTorch's shared `frames` lists are recognised as shared, and mutations after sharing (an APPEND
//! to a fetched list) are seen through every reference, as in Python. `Value` is `Eq + Hash` by
//! identity for containers, so it can key a cache. Identity of mutated data can form cycles (a
//! list appended to itself), as in Python: walkers must track what they visited.
//!
//! **Memory.** A list whose items are dicts with the same key sequence (PyTorch's trace: millions
//! of dicts with the same 8 keys) is stored in *record* form: the keys once and the values in
//! typed columns (i32, i64, string id, object id, or general values when a column is mixed). Such
//! a dict is then [`Value::Row`]`(list, i)` and behaves as a dict (its memo entry is rewritten to
//! the row). Items that do not fit (another key sequence, not a dict, a dict referenced elsewhere)
//! are kept aside, in order, and a row given a new key later moves aside into a plain dict, so
//! nothing changes for the reader of the data. Strings are interned: each distinct string is
//! stored once and is a `u32` id. Reading a large snapshot takes less memory than its file
//! (about 0.8 times the file size at the peak, for 0.1 to 1 GB traces).
//!
//! **Speed.** The input goes through a 1 MiB buffer, an opcode loop without allocation for
//! scalars, and a fast path for the dicts of a trace (`Parser::dict_body`), which reads a whole
//! `EMPTY_DICT MEMOIZE MARK key value ... SETITEMS` at once: about 200 to 250 MB/s on a 2-core
//! VM, 7 to 8 times Python's `pickle.load`. [`read_file`] reads a file in chunks, on several
//! cores or on one: the trace's entries, cut at FRAME opcodes, are decoded by workers into the
//! columns a caller names (a [`Projection`]) while the ordinary parser reads the rest (see
//! `par.rs`); a whole `summary` of 0.8 to 1 GB takes 0.75 to 0.9 s on an H100 host's 16 cores,
//! and the chunks are faster than the ordinary parser on one core too.
//!
//! **API.** [`read`] (any `Read`, streamed) and [`from_slice`] give a [`Pickle`]: its
//! [`root`](Pickle::root), and for any [`Value`]: [`kind`](Pickle::kind), [`int`](Pickle::int),
//! [`int128`](Pickle::int128), [`float`](Pickle::float), [`bool`](Pickle::bool),
//! [`str`](Pickle::str), [`bytes`](Pickle::bytes), [`big_int_bytes`](Pickle::big_int_bytes),
//! [`len`](Pickle::len), [`item`](Pickle::item), [`items`](Pickle::items),
//! [`get`](Pickle::get) (str key), [`get_value`](Pickle::get_value) (any key),
//! [`entries`](Pickle::entries), [`obj_id`](Pickle::obj_id). Writing: [`write()`] of a [`W`].
//!
//! ```ignore
//! let p = gpumem::trace::pickle::read(std::fs::File::open("snapshot.pickle")?)?;
//! let traces = p.get(p.root(), "device_traces").unwrap();
//! for e in p.items(p.item(traces, 0).unwrap()) {
//!     let (action, addr) = (p.get(e, "action"), p.get(e, "addr").and_then(|v| p.int(v)));
//! }
//! ```

use rustc_hash::FxHashMap;
use std::io::Read;

pub use super::pickle_write::{write, W};
pub use access::Column;
pub use par::{read_file, Projected, Projection};

/// A pickled str's bytes as text, the way CPython's unpickler decodes them (UTF-8 with
/// "surrogatepass"): encoded lone surrogates (`ED A0..BF 80..BF`, which CPython writes for
/// them) are accepted and shown as U+FFFD; any other byte sequence that is not UTF-8 is `None`,
/// where Python raises UnicodeDecodeError.
pub(crate) fn py_str(b: &[u8]) -> Option<std::borrow::Cow<'_, str>> {
    let first = match std::str::from_utf8(b) {
        Ok(s) => return Some(std::borrow::Cow::Borrowed(s)),
        Err(e) => e,
    };
    let mut rest = &b[first.valid_up_to()..];
    loop {
        match rest {
            [0xED, 0xA0..=0xBF, 0x80..=0xBF, tail @ ..] => rest = tail,
            _ => return None,
        }
        match std::str::from_utf8(rest) {
            Ok(_) => return Some(String::from_utf8_lossy(b)),
            Err(e) => rest = &rest[e.valid_up_to()..],
        }
    }
}

/// The message for a str that [`py_str`] refuses.
pub(crate) const NOT_UTF8: &str =
    "a string that is not UTF-8 (Python's unpickler refuses it: UnicodeDecodeError)";

use input::Input;
use parse::Parser;
use store::{Col, Data, Node, Strings};

// The read API of [`Pickle`] (`root`, `kind`, `int`, ..., `get`, `entries`, `column`).
mod access;
// Filling containers while reading: appends, dict items, rows of record-form lists.
mod build;
// The buffered input and the reader's internal error type.
mod input;
// Python's equality and hashing of dict keys.
mod keys;
// Reading a large file on several cores: frames as cut points, a driver and workers.
mod par;
// The opcode loop, its fast path for the dicts of a trace, the stack and the memo.
mod parse;
// The arena: objects, record-form lists and their columns, interned strings, hash tables.
mod store;
#[cfg(test)]
mod tests;

/// Deepest nesting of containers accepted (deeper input is refused, so that code walking the
/// result recursively cannot overflow its stack), and the most MARKs open at once.
pub const MAX_DEPTH: u32 = 10_000;
/// Input buffer: large reads, and any string up to this size is parsed in place.
const BUF: usize = 1 << 20;
/// A dict of more entries gets a hash index (smaller ones are searched linearly).
const INDEX_AT: usize = 32;
/// `Node::memo` values: not memoized, or referenced more than once (never made a row).
const NO_MEMO: u32 = u32::MAX;
const SHARED: u32 = u32::MAX - 1;

/// Interned string id (index into the pickle's string table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StrId(u32);
/// Object id: a list, tuple, dict, bytes or big int of the pickle, by identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjId(u32);
/// A float stored as its bits, so that [`Value`] is `Eq` and `Hash` (compared bit for bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct F64Bits(u64);

impl StrId {
    pub fn index(self) -> u32 {
        self.0
    }
}
impl ObjId {
    pub fn index(self) -> u32 {
        self.0
    }
}
impl F64Bits {
    pub fn new(f: f64) -> Self {
        F64Bits(f.to_bits())
    }
    pub fn get(self) -> f64 {
        f64::from_bits(self.0)
    }
}

/// One value of a pickle, 16 bytes. Containers are referred to by identity (see the module doc).
/// `repr(u64)`: an 8-byte tag and an 8-byte payload, which the compiler copies as two words
/// (the default layout is copied byte-piecewise, stalling store forwarding: 40% slower reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u64)]
pub enum Value {
    None,
    Bool(bool),
    /// Any int that fits in i64 (bigger ones are [`Kind::BigInt`] objects).
    Int(i64),
    Float(F64Bits),
    Str(StrId),
    /// A list, tuple, dict, bytes or big int.
    Obj(ObjId),
    /// Row `i` of a list in record form: a dict.
    Row(ObjId, u32),
}

/// What a [`Value`] is, in Python's terms (sets and frozensets read as lists, bytearray as bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    None,
    Bool,
    Int,
    Float,
    Str,
    List,
    Tuple,
    Dict,
    Bytes,
    BigInt,
}

/// Why a pickle was refused. Display: `at byte N: message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PickleError {
    pub offset: u64,
    pub message: String,
}

impl std::fmt::Display for PickleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at byte {}: {}", self.offset, self.message)
    }
}
impl std::error::Error for PickleError {}

/// A pickle read into memory: the root value and the arena it refers to.
#[derive(Debug)]
pub struct Pickle {
    root: Value,
    objs: Vec<Node>,
    strs: Strings,
    /// Hash indexes of dicts with more than `INDEX_AT` entries, by object index.
    index: FxHashMap<u32, Vec<u32>>,
    /// Entries of trace lists read on several cores, as projected rows (see [`read_file`]).
    taken: Vec<par::Taken>,
}

/// Reads one pickle from `r`, incrementally (through a 1 MiB buffer; nothing past STOP is
/// needed, though up to a buffer's worth may have been read from `r`).
pub fn read(r: impl Read) -> Result<Pickle, PickleError> {
    let mut inp = Input::new(r, 0);
    let mut p = Parser::default();
    let root = p.run(&mut inp)?;
    Ok(finish(p, root))
}

/// The parser's result as a [`Pickle`].
fn finish(p: Parser, root: Value) -> Pickle {
    let mut objs = p.objs;
    for n in &mut objs {
        if let Data::Records(r) = &mut n.data {
            r.cols.iter_mut().for_each(Col::shrink);
        }
    }
    Pickle {
        root,
        objs,
        strs: p.strs,
        index: p.index,
        taken: p.taken,
    }
}

/// Reads one pickle from memory.
pub fn from_slice(b: &[u8]) -> Result<Pickle, PickleError> {
    read(b)
}
