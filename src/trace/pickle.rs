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
//! VM, 7 to 8 times Python's `pickle.load`.
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

use rustc_hash::{FxHashMap, FxHasher};
use std::hash::Hasher;
use std::io::{self, Read};

pub use super::pickle_write::{write, W};

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
}

#[derive(Debug)]
struct Node {
    depth: u32,
    /// While reading: the memo slot holding this object, `NO_MEMO` or `SHARED`.
    memo: u32,
    data: Data,
}

#[derive(Debug)]
enum Data {
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
struct Records {
    keys: Box<[Value]>,
    cols: Box<[Col]>,
    len: u32,
    aside: Vec<(u32, Aside)>,
}

#[derive(Debug, Clone, Copy)]
enum Aside {
    Item(Value),
    Dict(u32),
}

#[derive(Debug)]
enum Col {
    I32(Vec<i32>),
    I64(Vec<i64>),
    Str(Vec<u32>),
    Obj(Vec<u32>),
    Any(Vec<Value>),
}

impl Col {
    /// A column of `v`'s type holding `fillers` fillers, then `v`.
    fn new(v: Value, fillers: usize) -> Col {
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

    fn len(&self) -> usize {
        match self {
            Col::I32(c) => c.len(),
            Col::I64(c) => c.len(),
            Col::Str(c) | Col::Obj(c) => c.len(),
            Col::Any(c) => c.len(),
        }
    }

    fn get(&self, i: usize) -> Option<Value> {
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
    fn put(&mut self, i: usize, v: Value) {
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
    fn push(&mut self, v: Value) {
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
    fn push_filler(&mut self) {
        match self {
            Col::I32(c) => c.push(0),
            Col::I64(c) => c.push(0),
            Col::Str(c) | Col::Obj(c) => c.push(0),
            Col::Any(c) => c.push(Value::None),
        }
    }

    fn shrink(&mut self) {
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
    fn aside(&self, i: u32) -> Option<Aside> {
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
struct Strings {
    text: String,
    /// `bounds[i]..bounds[i + 1]` is string `i` in `text`.
    bounds: Vec<usize>,
    table: Vec<u32>,
}

fn hash_bytes(b: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(b);
    h.finish()
}

/// Finds the entry for which `eq` holds (`Ok(id)`), or the empty slot where it would go.
fn probe(table: &[u32], hash: u64, mut eq: impl FnMut(u32) -> bool) -> Result<u32, usize> {
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
    fn get(&self, id: u32) -> &str {
        let i = id as usize;
        &self.text[self.bounds[i]..self.bounds[i + 1]]
    }

    fn find(&self, s: &str) -> Option<u32> {
        if self.table.is_empty() {
            return None;
        }
        probe(&self.table, hash_bytes(s.as_bytes()), |id| {
            self.get(id) == s
        })
        .ok()
    }

    fn intern(&mut self, s: &str) -> R<u32> {
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

// ---------------------------------------------------------------------------------------------
// Reading

/// Internal error: the input ended, a read failed, or `Msg` (completed with the opcode's name).
enum Fail {
    Eof,
    Io(io::Error),
    Msg(String),
}
/// Boxed, so that `R<Value>` is 16 bytes and comes back in registers (this matters for speed).
struct E(Box<Fail>);
type R<T> = Result<T, E>;

fn msg<T>(m: impl Into<String>) -> R<T> {
    Err(E(Box::new(Fail::Msg(m.into()))))
}

fn eof<T>() -> R<T> {
    Err(E(Box::new(Fail::Eof)))
}

fn io_err(e: io::Error) -> E {
    E(Box::new(Fail::Io(e)))
}

/// A buffered reader that tracks the absolute offset and parses short arguments in place.
struct Input<T> {
    r: T,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Absolute offset of `buf[0]`.
    base: u64,
    /// Strings longer than the buffer, read incrementally.
    big: Vec<u8>,
}

impl<T: Read> Input<T> {
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Makes `need` (at most `BUF`) bytes available at `pos`, or fails with `Eof`.
    #[cold]
    fn fill(&mut self, need: usize) -> R<()> {
        if self.pos + need > self.buf.len() {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        while self.end - self.pos < need {
            match self.r.read(&mut self.buf[self.end..]) {
                Ok(0) => return eof(),
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(e)),
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn byte(&mut self) -> R<u8> {
        if self.pos == self.end {
            self.fill(1)?;
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(b)
    }

    #[inline(always)]
    fn array<const N: usize>(&mut self) -> R<[u8; N]> {
        if self.end - self.pos < N {
            self.fill(N)?;
        }
        let mut a = [0u8; N];
        a.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        Ok(a)
    }

    /// The next `n` bytes. Lengths come from the file, so nothing is allocated from `n`: a
    /// long string grows with the bytes actually read, and a lying length ends in `Eof`.
    fn bytes(&mut self, n: u64) -> R<&[u8]> {
        if n <= BUF as u64 {
            let n = n as usize;
            if self.end - self.pos < n {
                self.fill(n)?;
            }
            self.pos += n;
            return Ok(&self.buf[self.pos - n..self.pos]);
        }
        self.big.clear();
        self.big.extend_from_slice(&self.buf[self.pos..self.end]);
        self.base += self.end as u64;
        (self.pos, self.end) = (0, 0);
        let want = n - self.big.len() as u64;
        let got = (&mut self.r).take(want).read_to_end(&mut self.big);
        let got = got.map_err(io_err)? as u64;
        self.base += got;
        if got < want {
            return eof();
        }
        Ok(&self.big)
    }
}

/// Reads one pickle from `r`, incrementally (through a 1 MiB buffer; nothing past STOP is
/// needed, though up to a buffer's worth may have been read from `r`).
pub fn read(r: impl Read) -> Result<Pickle, PickleError> {
    let mut inp = Input {
        r,
        buf: vec![0; BUF],
        pos: 0,
        end: 0,
        base: 0,
        big: Vec::new(),
    };
    let mut p = Parser::default();
    let root = p.run(&mut inp)?;
    let mut objs = p.objs;
    for n in &mut objs {
        if let Data::Records(r) = &mut n.data {
            r.cols.iter_mut().for_each(Col::shrink);
        }
    }
    Ok(Pickle {
        root,
        objs,
        strs: p.strs,
        index: p.index,
    })
}

/// Reads one pickle from memory.
pub fn from_slice(b: &[u8]) -> Result<Pickle, PickleError> {
    read(b)
}

#[derive(Default)]
struct Parser {
    objs: Vec<Node>,
    strs: Strings,
    index: FxHashMap<u32, Vec<u32>>,
    /// The memo: dense up to the highest index used compactly, sparse beyond.
    memo: Vec<Option<Value>>,
    memo_far: FxHashMap<u32, Value>,
    memo_len: u32,
    stack: Vec<Value>,
    marks: Vec<usize>,
    /// Dict nodes emptied when their contents became a row, reused by the next EMPTY_DICT.
    free_dicts: Vec<u32>,
    /// The str keys of the last dict filled by one SETITEMS (distinct).
    last_keys: Vec<Value>,
    /// Scratch of `dict_body`: the pairs read, and the values memoized, in order.
    pairs: Vec<(Value, Value)>,
    pending: Vec<Value>,
}

/// An opcode's name, as in pickletools.
#[rustfmt::skip]
fn op_name(op: u8) -> Option<&'static str> {
    Some(match op {
        b'(' => "MARK", b'.' => "STOP", b'0' => "POP", b'1' => "POP_MARK", b'2' => "DUP",
        b'F' => "FLOAT", b'I' => "INT", b'J' => "BININT", b'K' => "BININT1", b'L' => "LONG",
        b'M' => "BININT2", b'N' => "NONE", b'P' => "PERSID", b'Q' => "BINPERSID", b'R' => "REDUCE",
        b'S' => "STRING", b'T' => "BINSTRING", b'U' => "SHORT_BINSTRING", b'V' => "UNICODE",
        b'X' => "BINUNICODE", b'a' => "APPEND", b'b' => "BUILD", b'c' => "GLOBAL", b'd' => "DICT",
        b'}' => "EMPTY_DICT", b'e' => "APPENDS", b'g' => "GET", b'h' => "BINGET", b'i' => "INST",
        b'j' => "LONG_BINGET", b'l' => "LIST", b']' => "EMPTY_LIST", b'o' => "OBJ", b'p' => "PUT",
        b'q' => "BINPUT", b'r' => "LONG_BINPUT", b's' => "SETITEM", b't' => "TUPLE",
        b')' => "EMPTY_TUPLE", b'u' => "SETITEMS", b'G' => "BINFLOAT", b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES", 0x80 => "PROTO", 0x81 => "NEWOBJ", 0x82 => "EXT1",
        0x83 => "EXT2", 0x84 => "EXT4", 0x85 => "TUPLE1", 0x86 => "TUPLE2", 0x87 => "TUPLE3",
        0x88 => "NEWTRUE", 0x89 => "NEWFALSE", 0x8a => "LONG1", 0x8b => "LONG4",
        0x8c => "SHORT_BINUNICODE", 0x8d => "BINUNICODE8", 0x8e => "BINBYTES8",
        0x8f => "EMPTY_SET", 0x90 => "ADDITEMS", 0x91 => "FROZENSET", 0x92 => "NEWOBJ_EX",
        0x93 => "STACK_GLOBAL", 0x94 => "MEMOIZE", 0x95 => "FRAME", 0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER", 0x98 => "READONLY_BUFFER",
        _ => return None,
    })
}

/// Why an opcode the reader does not execute is refused.
fn refusal(op: u8) -> &'static str {
    match op {
        b'c' | 0x93 => "imports Python code; gpumem never runs code from a pickle",
        0x82..=0x84 => {
            "imports Python code (copyreg extension); gpumem never runs code from a pickle"
        }
        b'R' => "calls a Python callable; gpumem never runs code from a pickle",
        b'b' | b'i' | b'o' | 0x81 | 0x92 => {
            "builds a class instance, which runs Python code; gpumem never runs code from a pickle"
        }
        b'P' | b'Q' => "asks for a persistent (external) object, which gpumem never resolves",
        0x97 | 0x98 => "needs an out-of-band buffer, which gpumem does not accept",
        _ if op_name(op).is_none() => "is refused: the data is corrupt or is not a pickle",
        _ => {
            "is a protocol 0/1 text opcode, which gpumem does not read (write protocol 2 or newer)"
        }
    }
}

/// Decodes a little-endian two's complement int: an `Int` when it fits in i64.
#[inline]
fn int_from_le(b: &[u8]) -> Result<i64, Box<[u8]>> {
    let neg = b.last().is_some_and(|&x| x & 0x80 != 0);
    let pad = if neg { 0xff } else { 0 };
    // Drop sign-extension bytes, so equal ints have equal (minimal) encodings.
    let mut n = b.len();
    while n > 1 && b[n - 1] == pad && (b[n - 2] & 0x80 != 0) == neg {
        n -= 1;
    }
    if n <= 8 {
        // Shifts, not a copy into an array: a variable-length memcpy followed by an 8-byte
        // load stalls store forwarding, and LONG1 holds every address and time of a trace.
        let x = b[..n]
            .iter()
            .rev()
            .fold(0u64, |x, &c| x << 8 | u64::from(c));
        let unused = 64 - 8 * n as u32;
        Ok(((x << (unused % 64)) as i64) >> (unused % 64))
    } else {
        Err(b[..n].into())
    }
}

impl Parser {
    fn run<T: Read>(&mut self, inp: &mut Input<T>) -> Result<Value, PickleError> {
        loop {
            let at = inp.offset();
            let op = inp.byte();
            let (e, op) = match op {
                Ok(b'.') => match self.pop() {
                    Ok(root) => return Ok(root),
                    Err(e) => (e, Some(b'.')),
                },
                Ok(op) => match self.step(op, inp) {
                    Ok(()) => continue,
                    Err(e) => (e, Some(op)),
                },
                Err(e) => (e, None),
            };
            let what = match op.map(|op| (op, op_name(op))) {
                Some((op, Some(name))) => format!("opcode {name} (0x{op:02x})"),
                Some((op, None)) => format!("byte 0x{op:02x} (not a pickle opcode)"),
                None => String::new(),
            };
            let data_end = inp.base + inp.end as u64;
            return Err(match *e.0 {
                Fail::Eof if op.is_none() => PickleError {
                    offset: data_end,
                    message: "truncated pickle: the data ends before a STOP opcode".into(),
                },
                Fail::Eof => PickleError {
                    offset: data_end,
                    message: format!("truncated pickle: the data ends inside {what} at byte {at}"),
                },
                Fail::Io(err) => PickleError {
                    offset: at,
                    message: format!("read error: {err}"),
                },
                Fail::Msg(m) => PickleError {
                    offset: at,
                    message: format!("{what} {m}"),
                },
            });
        }
    }

    /// Executes one opcode (but STOP).
    #[inline(always)]
    fn step<T: Read>(&mut self, op: u8, inp: &mut Input<T>) -> R<()> {
        let v = match op {
            b'h' => self.fetch(u32::from(inp.byte()?))?,
            b'j' => self.fetch(u32::from_le_bytes(inp.array()?))?,
            0x94 => {
                let v = self.top()?;
                self.put(self.memo_len, v);
                return Ok(());
            }
            b'K' => Value::Int(i64::from(inp.byte()?)),
            b'M' => Value::Int(i64::from(u16::from_le_bytes(inp.array()?))),
            b'J' => Value::Int(i64::from(i32::from_le_bytes(inp.array()?))),
            0x8a => {
                let n = inp.byte()?;
                match int_from_le(inp.bytes(u64::from(n))?) {
                    Ok(i) => Value::Int(i),
                    Err(big) => self.new_obj(Data::BigInt(big), 1)?,
                }
            }
            0x8c => self.string(inp, |i| Ok(u64::from(i.byte()?)))?,
            b'X' => self.string(inp, |i| Ok(u64::from(u32::from_le_bytes(i.array()?))))?,
            0x8d => self.string(inp, |i| Ok(u64::from_le_bytes(i.array()?)))?,
            b'}' => loop {
                if !self.dict_body(inp)? {
                    let v = match self.free_dicts.pop() {
                        Some(id) => Value::Obj(ObjId(id)),
                        None => self.new_obj(Data::Dict(Vec::new()), 1)?,
                    };
                    self.stack.push(v);
                    return Ok(());
                }
                // Dicts read by the fast path often follow each other (in an APPENDS batch).
                if inp.pos == inp.end || inp.buf.get(inp.pos) != Some(&b'}') {
                    return Ok(());
                }
                inp.pos += 1;
            },
            b']' | 0x8f => self.new_obj(Data::List(Vec::new()), 1)?,
            b'(' => {
                if self.marks.len() >= MAX_DEPTH as usize {
                    return msg(format!("opens more than {MAX_DEPTH} MARKs at once"));
                }
                self.marks.push(self.stack.len());
                return Ok(());
            }
            b'u' => {
                let m = self.pop_mark()?;
                let dict = self.below(m)?;
                self.setitems(dict, m)?;
                self.stack.truncate(m);
                return Ok(());
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.setitem(self.top()?, k, v)?;
                return Ok(());
            }
            b'e' | 0x90 => {
                let m = self.pop_mark()?;
                let list = self.below(m)?;
                for k in m..self.stack.len() {
                    self.append(list, self.stack[k])?;
                }
                self.stack.truncate(m);
                return Ok(());
            }
            b'a' => {
                let v = self.pop()?;
                self.append(self.top()?, v)?;
                return Ok(());
            }
            b'G' => Value::Float(F64Bits::new(f64::from_be_bytes(inp.array()?))),
            0x88 => Value::Bool(true),
            0x89 => Value::Bool(false),
            b'N' => Value::None,
            0x95 => {
                inp.array::<8>()?; // frame length: frames need no special handling when streaming
                return Ok(());
            }
            0x80 => match inp.byte()? {
                0..=5 => return Ok(()),
                p => {
                    return msg(format!(
                        "asks for protocol {p}; gpumem reads protocols 2 to 5"
                    ))
                }
            },
            b')' => self.new_obj(Data::Tuple(Box::new([])), 1)?,
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                if self.stack.len() < self.fence() + n {
                    return msg("pops from an empty stack (stack underflow)");
                }
                let items: Box<[Value]> = self.stack.drain(self.stack.len() - n..).collect();
                self.tuple(Data::Tuple(items))?
            }
            b't' | 0x91 => {
                let m = self.pop_mark()?;
                let items: Vec<Value> = self.stack.drain(m..).collect();
                self.tuple(if op == b't' {
                    Data::Tuple(items.into())
                } else {
                    Data::List(items)
                })?
            }
            b'q' => {
                let (i, v) = (inp.byte()?, self.top()?);
                self.put(u32::from(i), v);
                return Ok(());
            }
            b'r' => {
                let (i, v) = (u32::from_le_bytes(inp.array()?), self.top()?);
                self.put(i, v);
                return Ok(());
            }
            b'p' => {
                let (i, v) = (text_index(inp)?, self.top()?);
                self.put(i, v);
                return Ok(());
            }
            b'g' => self.fetch(text_index(inp)?)?,
            b'C' | b'B' | 0x8e | 0x96 => {
                let n = match op {
                    b'C' => u64::from(inp.byte()?),
                    b'B' => u64::from(u32::from_le_bytes(inp.array()?)),
                    _ => u64::from_le_bytes(inp.array()?),
                };
                let b: Box<[u8]> = inp.bytes(n)?.into();
                self.new_obj(Data::Bytes(b), 1)?
            }
            0x8b => {
                let n = i32::from_le_bytes(inp.array()?);
                let n = u64::try_from(n).or_else(|_| msg("has a negative length"))?;
                match int_from_le(inp.bytes(n)?) {
                    Ok(i) => Value::Int(i),
                    Err(big) => self.new_obj(Data::BigInt(big), 1)?,
                }
            }
            b'0' => {
                // As CPython: POP right after a MARK discards the mark.
                if self.marks.last() == Some(&self.stack.len()) {
                    self.marks.pop();
                } else {
                    self.pop()?;
                }
                return Ok(());
            }
            b'1' => {
                let m = self.pop_mark()?;
                self.stack.truncate(m);
                return Ok(());
            }
            b'2' => {
                let v = self.top()?;
                self.mark_shared(v);
                v
            }
            _ => return msg(refusal(op)),
        };
        self.stack.push(v);
        Ok(())
    }

    /// One scalar or memo fetch at `b[i]` (for `dict_body`), with its length; `None` for any
    /// other opcode. At least 300 bytes follow `i`, so fixed-size reads cannot fail.
    #[inline(always)]
    fn scalar(&mut self, b: &[u8], i: usize) -> Option<(Value, usize)> {
        // A fixed-size window: its reads at constant offsets need no bounds checks.
        let w: &[u8; 264] = b.get(i..i + 264)?.try_into().ok()?;
        let a = |k: usize| w[1 + k];
        let u32_at = |k: usize| u32::from_le_bytes([a(k), a(k + 1), a(k + 2), a(k + 3)]);
        let u64_at = |k: usize| u64::from(u32_at(k)) | u64::from(u32_at(k + 4)) << 32;
        Some(match w[0] {
            b'h' => ((*self.memo.get(usize::from(a(0)))?)?, 2),
            b'j' => ((*self.memo.get(u32_at(0) as usize)?)?, 5),
            b'K' => (Value::Int(i64::from(a(0))), 2),
            b'M' => (Value::Int(i64::from(u16::from_le_bytes([a(0), a(1)]))), 3),
            b'J' => (Value::Int(i64::from(u32_at(0) as i32)), 5),
            0x8a if (1..=8).contains(&a(0)) => {
                // Sign-extends the n bytes read as part of 8 (no loop, no branch on n).
                let unused = 64 - 8 * u32::from(a(0));
                (
                    Value::Int(((u64_at(1) << unused) as i64) >> unused),
                    2 + usize::from(a(0)),
                )
            }
            0x8c => {
                let n = usize::from(a(0));
                let s = std::str::from_utf8(&w[2..2 + n]).ok()?;
                (Value::Str(StrId(self.strs.intern(s).ok()?)), 2 + n)
            }
            b'G' => (Value::Float(F64Bits(u64_at(0).swap_bytes())), 9),
            b'N' => (Value::None, 1),
            0x88 => (Value::Bool(true), 1),
            0x89 => (Value::Bool(false), 1),
            _ => return None,
        })
    }

    /// Fast path for the dicts of a trace (millions of them): reads `[MEMOIZE] MARK (key value)*
    /// SETITEMS` after an EMPTY_DICT in one go, when the keys are strs and the values scalars or
    /// memo fetches. It first decodes without effects, and gives up (leaving everything to the
    /// opcode loop) on anything else; only then applies the memo stores, as the loop would.
    fn dict_body<T: Read>(&mut self, inp: &mut Input<T>) -> R<bool> {
        if inp.end - inp.pos < 4096 && inp.fill(4096).is_err() {
            // The end of the input, or a read error that the opcode loop will meet again.
            return Ok(false);
        }
        let b = &inp.buf[inp.pos..inp.end];
        let base = self.memo.len();
        if b.len() < 4096 || self.memo_len as usize != base || !self.memo_far.is_empty() {
            return Ok(false); // the last bytes, or an unusual memo: the opcode loop
        }
        let memo_dict = b[0] == 0x94;
        let mut i = usize::from(memo_dict);
        if b[i] != b'(' {
            return Ok(false);
        }
        i += 1;
        let (mut pairs, mut pending) = (
            std::mem::take(&mut self.pairs),
            std::mem::take(&mut self.pending),
        );
        pairs.clear();
        pending.clear();
        let done = loop {
            // Two scalars with their MEMOIZEs fit in 520 bytes: stop before the end.
            if i + 600 > b.len() || pairs.len() > INDEX_AT {
                break false;
            }
            if b[i] == 0x95 {
                i += 9; // FRAME (CPython starts one before any key or value)
                continue;
            }
            if b[i] == b'u' {
                i += 1;
                break true;
            }
            // Keys and values are decoded at two sites, each with its own (well predicted) jumps.
            let Some((k, len)) = self.scalar(b, i) else {
                break false;
            };
            i += len;
            if b[i] == 0x94 {
                pending.push(k); // MEMOIZE: its index is taken now, stored at the end
                i += 1;
            }
            if b[i] == 0x95 {
                i += 9;
            }
            let Some((v, len)) = self.scalar(b, i) else {
                break false;
            };
            i += len;
            if b[i] == 0x94 {
                if !matches!(v, Value::Str(_)) {
                    break false;
                }
                pending.push(v);
                i += 1;
            }
            if !matches!(k, Value::Str(_)) {
                break false;
            }
            pairs.push((k, v));
        };
        let n = pairs.len();
        let same = n == self.last_keys.len()
            && pairs
                .iter()
                .zip(&self.last_keys)
                .all(|(p, k)| same_key(p.0, *k));
        let distinct =
            done && (same || (1..n).all(|j| pairs[..j].iter().all(|p| !same_key(p.0, pairs[j].0))));
        let depth = pairs.iter().map(|p| self.depth(p.1)).max().unwrap_or(0);
        let ok = distinct && depth < MAX_DEPTH;
        if ok {
            // Commit, in the order of the opcodes: the dict, its MEMOIZE, then its values'.
            let v = match self.free_dicts.pop() {
                Some(id) => Value::Obj(ObjId(id)),
                None => self.new_obj(Data::Dict(Vec::new()), 1)?,
            };
            self.stack.push(v);
            if memo_dict {
                self.put(self.memo_len, v);
            }
            for &v in &pending {
                self.put(self.memo_len, v);
            }
            for p in &pairs {
                self.mark_shared(p.1);
            }
            if !same {
                self.last_keys.clear();
                self.last_keys.extend(pairs.iter().map(|p| p.0));
            }
            if let Value::Obj(d) = v {
                let node = &mut self.objs[d.0 as usize];
                node.depth = node.depth.max(depth + 1);
                if let Data::Dict(e) = &mut node.data {
                    std::mem::swap(e, &mut pairs); // it is empty: its Vec becomes the scratch
                }
            }
            inp.pos += i;
        }
        self.pending = pending;
        self.pairs = pairs;
        Ok(ok)
    }

    fn string<T: Read>(
        &mut self,
        inp: &mut Input<T>,
        len: impl FnOnce(&mut Input<T>) -> R<u64>,
    ) -> R<Value> {
        let n = len(inp)?;
        let b = inp.bytes(n)?;
        // CPython writes lone surrogates ("surrogatepass"), which are not UTF-8: replaced.
        let id = match std::str::from_utf8(b) {
            Ok(s) => self.strs.intern(s)?,
            Err(_) => self.strs.intern(&String::from_utf8_lossy(b))?,
        };
        Ok(Value::Str(StrId(id)))
    }

    fn new_obj(&mut self, data: Data, depth: u32) -> R<Value> {
        let id = u32::try_from(self.objs.len())
            .ok()
            .filter(|&i| i < u32::MAX);
        let id = id.map_or_else(|| msg("makes more than 4 billion objects"), Ok)?;
        self.objs.push(Node {
            depth,
            memo: NO_MEMO,
            data,
        });
        Ok(Value::Obj(ObjId(id)))
    }

    /// A tuple (or frozenset) of the items in `data`, one level deeper than its deepest item.
    fn tuple(&mut self, data: Data) -> R<Value> {
        let items = match &data {
            Data::Tuple(t) => &t[..],
            Data::List(l) => &l[..],
            _ => &[],
        };
        let d = items.iter().map(|&v| self.depth(v)).max().unwrap_or(0);
        if d >= MAX_DEPTH {
            return msg(format!("nests containers deeper than {MAX_DEPTH} levels"));
        }
        self.new_obj(data, d + 1)
    }

    fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    #[inline(always)]
    fn pop(&mut self) -> R<Value> {
        if self.stack.len() > self.fence() {
            if let Some(v) = self.stack.pop() {
                return Ok(v);
            }
        }
        msg("pops from an empty stack (stack underflow)")
    }

    #[inline(always)]
    fn top(&self) -> R<Value> {
        match self.stack.last() {
            Some(&v) if self.stack.len() > self.fence() => Ok(v),
            _ => msg("needs a value on the stack, and it is empty (stack underflow)"),
        }
    }

    fn pop_mark(&mut self) -> R<usize> {
        match self.marks.pop() {
            Some(m) => Ok(m),
            None => msg("needs a MARK before it, and there is none"),
        }
    }

    /// The value just below a popped mark `m` (the container that APPENDS/SETITEMS fill).
    fn below(&self, m: usize) -> R<Value> {
        if m > self.fence() {
            Ok(self.stack[m - 1])
        } else {
            msg("has no container below its MARK (stack underflow)")
        }
    }

    fn mark_shared(&mut self, v: Value) {
        if let Value::Obj(id) = v {
            self.objs[id.0 as usize].memo = SHARED;
        }
    }

    #[inline(always)]
    fn fetch(&mut self, i: u32) -> R<Value> {
        match self.memo.get(i as usize) {
            Some(&Some(v)) => {
                self.mark_shared(v);
                Ok(v)
            }
            _ => self.fetch_far(i),
        }
    }

    #[cold]
    fn fetch_far(&mut self, i: u32) -> R<Value> {
        let Some(&v) = self.memo_far.get(&i) else {
            return msg(format!("fetches memo index {i}, which was never stored"));
        };
        self.mark_shared(v);
        Ok(v)
    }

    #[inline(always)]
    fn put(&mut self, i: u32, v: Value) {
        // MEMOIZE: the next index.
        if i as usize == self.memo.len() && i < SHARED && self.memo_far.is_empty() {
            if let Value::Obj(id) = v {
                let n = &mut self.objs[id.0 as usize];
                n.memo = if n.memo == NO_MEMO { i } else { SHARED };
            }
            self.memo.push(Some(v));
            self.memo_len += 1;
            return;
        }
        self.put_slow(i, v)
    }

    fn put_slow(&mut self, i: u32, v: Value) {
        if let Value::Obj(id) = v {
            let n = &mut self.objs[id.0 as usize];
            n.memo = if n.memo == NO_MEMO && i < SHARED {
                i
            } else {
                SHARED
            };
        }
        let k = i as usize;
        let new = if k < self.memo.len() {
            self.memo[k].replace(v).is_none()
        } else if k <= self.memo.len() + 1024 {
            // Compact growth (bounded per opcode); far indices go to the map.
            let old = self.memo.len();
            self.memo.resize(k + 1, None);
            for j in old..k {
                self.memo[j] = self.memo_far.remove(&(j as u32));
            }
            self.memo[k] = Some(v);
            self.memo_far.remove(&i).is_none()
        } else {
            self.memo_far.insert(i, v).is_none()
        };
        self.memo_len += u32::from(new);
    }

    #[inline]
    fn depth(&self, v: Value) -> u32 {
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

    fn append(&mut self, list: Value, v: Value) -> R<()> {
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
    fn setitems(&mut self, dict: Value, m: usize) -> R<()> {
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

    fn setitem(&mut self, dict: Value, k: Value, v: Value) -> R<()> {
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

/// Parses the decimal argument of the text opcodes PUT and GET (at most 10 digits).
fn text_index<T: Read>(inp: &mut Input<T>) -> R<u32> {
    let mut n: u64 = 0;
    for _ in 0..12 {
        match inp.byte()? {
            b'\n' => return u32::try_from(n).or_else(|_| msg("has a memo index over 2^32")),
            c @ b'0'..=b'9' => n = n * 10 + u64::from(c - b'0'),
            _ => break,
        }
    }
    msg("has a malformed decimal memo index")
}

/// `a == b` (identity), with a test of the usual case first: str keys, compared by id (the
/// derived `==` jumps on the variant, which a long sequence of key checks mispredicts).
#[inline(always)]
fn same_key(a: Value, b: Value) -> bool {
    match (a, b) {
        (Value::Str(x), Value::Str(y)) => x == y,
        _ => a == b,
    }
}

/// Python's `==` on dict keys: numbers by value (1 == 1.0 == True), strings by interned id,
/// tuples, bytes and big ints by content. Iterative, so deep tuples cannot overflow the stack.
#[inline]
fn key_eq(objs: &[Node], a: Value, b: Value) -> bool {
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
fn key_hash(objs: &[Node], v: Value) -> R<u64> {
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

// ---------------------------------------------------------------------------------------------
// Access

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
            .position(|k| matches!(k, Value::Str(s) if self.strs.get(s.0) == key))?;
        Some(Column {
            p: self,
            list,
            rec,
            col: &rec.cols[k],
            key,
        })
    }
}

/// One key's values over the rows of a record-form list (see [`Pickle::column`]).
pub struct Column<'a> {
    p: &'a Pickle,
    list: Value,
    rec: &'a Records,
    col: &'a Col,
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
        self.col.get(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value as J};

    /// Real PyTorch 2.11 snapshots (copies of the ground truth's).
    const SNAPS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/snapshots");
    const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/pickle");

    fn snapshot(name: &str) -> Option<Vec<u8>> {
        let b = std::fs::read(format!("{SNAPS}/{name}.pickle")).ok();
        if b.is_none() {
            eprintln!("{SNAPS}/{name}.pickle not found: skipping");
        }
        b
    }

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(format!("{FIX}/{name}")).unwrap()
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// The tagged JSON of fixtures/pickle/make_fixtures.py (`tagged`), from gpumem's reading.
    fn tagged(p: &Pickle, v: Value) -> J {
        let items = |v| J::Array(p.items(v).map(|x| tagged(p, x)).collect());
        match p.kind(v) {
            Kind::None => J::Null,
            Kind::Bool => J::Bool(p.bool(v).unwrap()),
            Kind::Int => J::from(p.int(v).unwrap()),
            Kind::Float => json!({"float": format!("{:016x}", p.float(v).unwrap().to_bits())}),
            Kind::Str => J::from(p.str(v).unwrap()),
            Kind::BigInt => json!({"bigint": hex(p.big_int_bytes(v).unwrap())}),
            Kind::Bytes => json!({"bytes": hex(p.bytes(v).unwrap())}),
            Kind::Tuple => json!({"tuple": items(v)}),
            Kind::List => items(v),
            Kind::Dict => {
                let e = p
                    .entries(v)
                    .map(|(k, x)| json!([tagged(p, k), tagged(p, x)]));
                json!({"dict": e.collect::<Vec<_>>()})
            }
        }
    }

    /// Python's reading of a file, in the same tagged JSON (None when python3 is absent).
    fn python_tagged(path: &str) -> Option<J> {
        let script = format!(
            "import sys, json, pickle, struct\n{}\nprint(json.dumps(tagged(pickle.load(open(sys.argv[1], 'rb')))))",
            std::fs::read_to_string(format!("{FIX}/make_fixtures.py"))
                .unwrap()
                .split("def tagged")
                .nth(1)
                .and_then(|s| s.split("\n\n").next())
                .map(|body| format!("def tagged{body}"))
                .unwrap()
        );
        let out = std::process::Command::new("python3")
            .args(["-c", &script, path])
            .output();
        match out {
            Ok(o) if o.status.success() => Some(serde_json::from_slice(&o.stdout).unwrap()),
            Ok(o) => panic!("python3 failed: {}", String::from_utf8_lossy(&o.stderr)),
            Err(_) => {
                eprintln!("python3 not found: skipping the comparison with Python");
                None
            }
        }
    }

    /// Lists, dicts and tuples reachable from the root, each counted once by identity.
    fn distinct(p: &Pickle) -> (usize, usize, usize) {
        let mut seen = std::collections::HashSet::new();
        let (mut todo, mut n) = (vec![p.root()], (0, 0, 0));
        while let Some(v) = todo.pop() {
            if !matches!(v, Value::Obj(_) | Value::Row(..)) || !seen.insert(v) {
                continue;
            }
            match p.kind(v) {
                Kind::List => n.0 += 1,
                Kind::Dict => n.1 += 1,
                Kind::Tuple => n.2 += 1,
                _ => {}
            }
            todo.extend(p.items(v));
            todo.extend(p.entries(v).flat_map(|(k, x)| [k, x]));
        }
        n
    }

    fn err(b: &[u8]) -> PickleError {
        match from_slice(b) {
            Ok(p) => panic!("accepted: {:?}", tagged(&p, p.root())),
            Err(e) => e,
        }
    }

    #[test]
    fn value_is_16_bytes() {
        assert!(std::mem::size_of::<Value>() <= 16);
        assert!(std::mem::size_of::<Option<Value>>() <= 16);
    }

    #[test]
    fn reads_the_mlp_snapshot_like_python() {
        let Some(b) = snapshot("snapshot_mlp_adam") else {
            return;
        };
        let p = from_slice(&b).unwrap();
        let r = p.root();
        let segs = p.get(r, "segments").unwrap();
        let trace = p.item(p.get(r, "device_traces").unwrap(), 0).unwrap();
        assert_eq!((p.len(segs), p.len(trace)), (Some(49), Some(784)));
        let int = |d, k| p.get(d, k).and_then(|v| p.int(v));
        let s0 = p.item(segs, 0).unwrap();
        assert_eq!(int(s0, "address"), Some(139812661100544));
        assert_eq!(int(s0, "total_size"), Some(67108864));
        assert_eq!(p.str(p.get(s0, "segment_type").unwrap()), Some("large"));
        let pool = p.get(s0, "segment_pool_id").unwrap();
        assert_eq!((p.kind(pool), p.len(pool)), (Kind::Tuple, Some(2)));
        assert_eq!(p.get(s0, "is_expandable"), Some(Value::Bool(false)));
        let b0 = p.item(p.get(s0, "blocks").unwrap(), 0).unwrap();
        assert_eq!(p.str(p.get(b0, "state").unwrap()), Some("inactive"));
        assert_eq!(int(b0, "requested_size"), Some(16384000));
        // Shared objects are one object: segments[0].blocks[0].frames is segments[0].frames, and
        // segments[8].blocks[0].frames is device_traces[0][202].frames (Python's `is`).
        assert_eq!(p.get(b0, "frames"), p.get(s0, "frames"));
        let b8 = p
            .item(p.get(p.item(segs, 8).unwrap(), "blocks").unwrap(), 0)
            .unwrap();
        let f = p.get(b8, "frames").unwrap();
        assert_eq!(Some(f), p.get(p.item(trace, 202).unwrap(), "frames"));
        assert_eq!((p.kind(f), p.len(f)), (Kind::List, Some(43)));
        assert_ne!(Some(f), p.get(p.item(trace, 201).unwrap(), "frames"));
        let e5 = p.item(trace, 5).unwrap();
        assert!(
            matches!(e5, Value::Row(..)),
            "trace entries are stored as rows"
        );
        assert_eq!(p.str(p.get(e5, "action").unwrap()), Some("free_requested"));
        assert_eq!(int(e5, "addr"), Some(139816001863680));
        assert_eq!(int(e5, "size"), Some(8388608));
        assert_eq!(int(e5, "time_us"), Some(1795934545513043));
        let fr = p.item(p.get(e5, "frames").unwrap(), 10).unwrap();
        assert_eq!(p.str(p.get(fr, "name").unwrap()), Some("forward"));
        assert_eq!(int(fr, "line"), Some(28));
        let keys: Vec<_> = p.entries(e5).map(|(k, _)| p.str(k).unwrap()).collect();
        assert_eq!(
            keys,
            [
                "action",
                "addr",
                "size",
                "stream",
                "time_us",
                "compile_context",
                "user_metadata",
                "frames"
            ]
        );
        let settings = p.get(r, "allocator_settings").unwrap();
        assert_eq!(
            p.get(settings, "garbage_collection_threshold"),
            Some(Value::Float(F64Bits::new(0.0)))
        );
        assert_eq!(int(settings, "max_split_size"), Some(-1));
        // As many distinct lists, dicts and tuples as Python has (by id()).
        assert_eq!(distinct(&p), (564, 1213, 49));
        if let Some(py) = python_tagged(&format!("{SNAPS}/snapshot_mlp_adam.pickle")) {
            assert!(py == tagged(&p, r), "differs from Python's pickle.load");
        }
    }

    #[test]
    fn reads_the_gpt_snapshot_like_python() {
        let Some(b) = snapshot("snapshot_gpt_tiny_math_adam") else {
            return;
        };
        let p = from_slice(&b).unwrap();
        let r = p.root();
        let trace = p.item(p.get(r, "device_traces").unwrap(), 0).unwrap();
        assert_eq!(p.len(p.get(r, "segments").unwrap()), Some(11));
        assert_eq!(p.len(trace), Some(1565));
        assert_eq!(
            p.str(p.get(p.item(trace, 0).unwrap(), "action").unwrap()),
            Some("alloc")
        );
        assert_eq!(distinct(&p), (1074, 2232, 11));
        if let Some(py) = python_tagged(&format!("{SNAPS}/snapshot_gpt_tiny_math_adam.pickle")) {
            assert!(py == tagged(&p, r), "differs from Python's pickle.load");
        }
    }

    #[test]
    fn protocols_2_to_5_read_the_same_values_as_python() {
        let want: J = serde_json::from_slice(&fixture("common.json")).unwrap();
        for proto in 2..=5 {
            let b = fixture(&format!("common_p{proto}.pickle"));
            assert_eq!(b[..2], [0x80, proto]);
            let p = from_slice(&b).unwrap();
            assert!(
                tagged(&p, p.root()) == want,
                "protocol {proto} differs from common.json"
            );
            let r = p.root();
            let shared = p.get(r, "shared").unwrap();
            let l = p.item(shared, 0).unwrap();
            assert_eq!(p.item(shared, 1), Some(l));
            assert_eq!(p.get(p.item(shared, 2).unwrap(), "again"), Some(l));
            let keys = p.get(r, "intkeys").unwrap();
            let one = p.str(p.get_value(keys, Value::Int(1)).unwrap());
            assert_eq!(one, Some("one"));
            assert_eq!(
                p.get_value(keys, Value::Float(F64Bits::new(1.0))),
                p.get_value(keys, Value::Bool(true))
            );
            let trace = p.get(r, "trace").unwrap();
            assert!(matches!(p.item(trace, 4), Some(Value::Row(..))));
            assert_eq!(
                p.get(p.item(trace, 5).unwrap(), "device_free"),
                Some(Value::Int(7))
            );
            let big = p.item(p.get(r, "big").unwrap(), 1).unwrap();
            assert_eq!(p.int128(big), Some((1i128 << 64) - 1));
        }
    }

    #[test]
    fn reads_bytes_sets_and_big_ints_like_python() {
        let want: J = serde_json::from_slice(&fixture("extras.json")).unwrap();
        let p = from_slice(&fixture("extras_p5.pickle")).unwrap();
        assert!(tagged(&p, p.root()) == want);
        assert_eq!(
            p.bytes(p.get(p.root(), "bytearray").unwrap()),
            Some(&b"xyz"[..])
        );
        let huge = p.get(p.root(), "huge").unwrap();
        assert_eq!(
            (p.kind(huge), p.int(huge), p.int128(huge)),
            (Kind::BigInt, None, None)
        );
    }

    #[test]
    fn refuses_a_reduce_payload_calling_os_system() {
        let e = err(&fixture("evil_reduce.pickle"));
        assert_eq!(
            e.to_string(),
            "at byte 28: opcode STACK_GLOBAL (0x93) imports Python code; gpumem never runs code from a pickle"
        );
    }

    #[test]
    fn refuses_a_class_instance() {
        let e = err(&fixture("instance.pickle"));
        assert_eq!(
            (e.offset, e.message.contains("GLOBAL (0x63) imports")),
            (2, true)
        );
        // Without its GLOBAL: NEWOBJ, then BUILD, each refused at its own offset.
        let e = err(b"\x80\x02N)\x81q\x01}b.");
        assert_eq!(e.offset, 4);
        assert!(
            e.message.contains("NEWOBJ (0x81) builds a class instance"),
            "{e}"
        );
        let e = err(b"\x80\x02N}b.");
        assert!(e.offset == 4 && e.message.contains("BUILD (0x62)"), "{e}");
    }

    #[test]
    fn refuses_every_opcode_that_could_run_code() {
        let ops = [
            (b'c', "GLOBAL"),
            (0x93, "STACK_GLOBAL"),
            (b'R', "REDUCE"),
            (b'b', "BUILD"),
            (b'i', "INST"),
            (b'o', "OBJ"),
            (0x81, "NEWOBJ"),
            (0x92, "NEWOBJ_EX"),
            (0x82, "EXT1"),
            (0x83, "EXT2"),
            (0x84, "EXT4"),
            (b'P', "PERSID"),
            (b'Q', "BINPERSID"),
            (0x97, "NEXT_BUFFER"),
            (0x98, "READONLY_BUFFER"),
            (b'S', "STRING"),
            (0xf0, "0xf0"),
        ];
        for (op, name) in ops {
            let e = err(&[0x80, 4, b'N', b'N', op, b'N', b'.']);
            assert_eq!(e.offset, 4, "{e}");
            assert!(e.message.contains(name) && e.message.contains("0x"), "{e}");
        }
        assert!(err(&[0x80, 4, b'N', 0xf0])
            .message
            .contains("not a pickle opcode"));
    }

    #[test]
    fn refuses_deep_nesting_without_overflowing() {
        let n = 100_000;
        let wrap = |body: Vec<u8>| [&[0x80, 4][..], &body, b"."].concat();
        let lists = wrap([vec![b']'; n], vec![b'a'; n - 1]].concat());
        let tuples = wrap([vec![b'N'], vec![0x85; n]].concat());
        let dicts = wrap([b"}".to_vec(), b"K\x01}".repeat(n - 1), b"s".repeat(n - 1)].concat());
        let marks = wrap(vec![b'('; n]);
        for b in [lists, tuples, dicts] {
            assert!(err(&b).message.contains("deeper than 10000"), "{}", err(&b));
        }
        assert!(err(&marks).message.contains("MARKs"));
        // 10_000 levels are fine.
        let ok = wrap([vec![b']'; 9_999], vec![b'a'; 9_998]].concat());
        assert_eq!(from_slice(&ok).map(|p| p.kind(p.root())), Ok(Kind::List));
    }

    #[test]
    fn truncated_input_is_an_error() {
        let Some(b) = snapshot("snapshot_mlp_adam") else {
            return;
        };
        let half = b.len() / 2;
        let e = err(&b[..half]);
        assert_eq!(e.offset, half as u64);
        assert!(e.message.starts_with("truncated pickle"), "{e}");
        for cut in (0..b.len()).step_by(977) {
            assert!(err(&b[..cut]).message.starts_with("truncated"));
        }
    }

    #[test]
    fn huge_length_fields_are_errors_not_allocations() {
        let mut b = vec![0x80, 4, 0x8d];
        b.extend_from_slice(&(1u64 << 60).to_le_bytes());
        let e = err(&b);
        assert_eq!(e.to_string(), "at byte 11: truncated pickle: the data ends inside opcode BINUNICODE8 (0x8d) at byte 2");
        for head in [
            &[0x8e][..],
            &[0x96],
            &[b'X', 0xff, 0xff, 0xff, 0xff],
            &[0x8b, 0xff, 0xff, 0xff, 0x7f],
        ] {
            let mut b = [&[0x80, 4], head].concat();
            b.resize(b.len() + 8, 0xff);
            b.extend(std::iter::repeat_n(b'a', 3 << 20)); // longer than the buffer, still short
            assert!(err(&b).message.starts_with("truncated"));
        }
        assert!(err(&[0x80, 4, 0x8b, 0, 0, 0, 0x80])
            .message
            .contains("negative length"));
    }

    #[test]
    fn malformed_stacks_and_memos_are_errors() {
        let cases: [(&[u8], &str); 10] = [
            (
                b"\x80\x04a.",
                "APPEND (0x61) pops from an empty stack (stack underflow)",
            ),
            (b"\x80\x04]e.", "APPENDS (0x65) needs a MARK"),
            (b"\x80\x04(e.", "has no container below its MARK"),
            (
                b"\x80\x04h\x05.",
                "fetches memo index 5, which was never stored",
            ),
            (
                b"\x80\x04](K\x01K\x02u.",
                "sets an item on something that is not a dict",
            ),
            (b"\x80\x04}(K\x01u.", "has a key without a value"),
            (b"\x80\x04}]K\x01s.", "unhashable key"),
            (b"\x80\x06N.", "asks for protocol 6"),
            (b"\x80\x04.", "pops from an empty stack"),
            (
                b"\x80\x04N\x85(Na.",
                "APPEND (0x61) needs a value on the stack",
            ),
        ];
        for (b, want) in cases {
            let e = err(b);
            assert!(e.message.contains(want), "{e} (wanted {want})");
        }
        // POP after a MARK discards the mark (as CPython does): this is [].
        assert_eq!(
            from_slice(b"\x80\x04](0.").map(|p| p.len(p.root())),
            Ok(Some(0))
        );
        assert_eq!(
            from_slice(b"\x80\x04Np1\ng1\n\x86.").map(|p| p.len(p.root())),
            Ok(Some(2))
        );
    }

    /// Python's pickle of a 25,000-entry trace with odd rows (other keys, a float in an int
    /// column, big ints, long strs, non-dict items, a last batch of one): 1.5 MB, so the fast path
    /// meets FRAMEs and buffer refills. Compared with Python's own reading, value for value.
    #[test]
    fn reads_a_large_irregular_trace_like_python() {
        let path =
            std::env::temp_dir().join(format!("gpumem-pickle-rows-{}.pickle", std::process::id()));
        let script = r#"
import pickle, random, sys
random.seed(7)
shared = [{"name": "f", "line": 1}]
rows = []
for i in range(25000):
    r = {"action": random.choice(["alloc", "free_requested", "free_completed"]),
         "addr": random.randrange(-2**70, 2**70) if i % 997 == 0 else random.randrange(0, 2**48),
         "size": random.choice([0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -1, -2**31, 2**40]),
         "stream": random.choice([0, 7]), "time_us": 1795934545512328 + i,
         "compile_context": "N/A", "user_metadata": random.choice(["", "x" * 300, "\u00e9%d" % i]),
         "frames": shared if i % 3 else [{"name": str(i), "line": i}]}
    if i % 101 == 0: r["extra"] = None
    if i % 211 == 0: r = {"action": "oom", "device_free": i}
    if i % 307 == 0: r["size"] = 1.5
    if i % 401 == 0: r["stream"] = True
    if i % 503 == 0: r = [i]
    rows.append(r)
obj = {"trace": rows, "again": rows[1500], "shared": shared, "refs": rows[:1001],
       "odd": [{"a": i} for i in range(1001)]}
pickle.dump(obj, open(sys.argv[1], "wb"))
"#;
        let made = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(&path)
            .status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("python3 not available: skipping");
            return;
        }
        let b = std::fs::read(&path).unwrap();
        let want = python_tagged(path.to_str().unwrap());
        let _ = std::fs::remove_file(&path);
        assert!(b.len() > 1 << 20, "{} bytes", b.len()); // more than a buffer
        let p = from_slice(&b).unwrap();
        let trace = p.get(p.root(), "trace").unwrap();
        assert!(matches!(p.item(trace, 24_999), Some(Value::Row(..))));
        assert_eq!(p.get(p.root(), "again"), p.item(trace, 1500));
        assert_eq!(
            p.item(p.get(p.root(), "refs").unwrap(), 1000),
            p.item(trace, 1000)
        );
        assert!(
            want.unwrap() == tagged(&p, p.root()),
            "differs from Python's pickle.load"
        );
        let trickled = read(Trickle(&b)).unwrap(); // no fast path: the opcode loop only
        assert!(tagged(&trickled, trickled.root()) == tagged(&p, p.root()));
    }

    /// The same shapes from gpumem's writer (no Python needed): CPython's batches of 1000,
    /// a last APPEND of one, other keys, and memoized (shared) dicts fetched again.
    #[test]
    fn reads_record_lists_with_odd_rows() {
        use std::rc::Rc;
        let s = |x: &str| W::Str(x.into());
        let row = |i: i64| match i % 5 {
            0 => W::Dict(vec![
                (s("a"), W::Int(i)),
                (s("b"), s("x")),
                (s("c"), W::Int(i << 40)),
            ]),
            1 => W::Dict(vec![
                (s("a"), W::Int(i)),
                (s("b"), W::Float(0.5)),
                (s("c"), W::None),
            ]),
            2 => W::Dict(vec![(s("a"), W::Int(i)), (s("c"), W::Int(1))]),
            3 => W::Int(i),
            _ => W::Dict(vec![
                (s("a"), W::Int(i)),
                (s("b"), W::Bool(true)),
                (s("c"), W::Int(-i)),
            ]),
        };
        let shared: Vec<Rc<W>> = (0..2001).map(|i| Rc::new(row(i))).collect();
        let w = W::Tuple(vec![
            W::List((0..2001).map(row).collect()),
            W::List(shared.iter().map(|r| W::Shared(r.clone())).collect()),
            W::List(shared.iter().rev().map(|r| W::Shared(r.clone())).collect()),
        ]);
        let mut b = Vec::new();
        write(&w, &mut b).unwrap();
        let p = from_slice(&b).unwrap();
        let (plain, memo, back) = (
            p.item(p.root(), 0).unwrap(),
            p.item(p.root(), 1).unwrap(),
            p.item(p.root(), 2).unwrap(),
        );
        for list in [plain, memo] {
            assert_eq!(p.len(list), Some(2001));
            for i in 0..2001 {
                let v = p.item(list, i as usize).unwrap();
                match i % 5 {
                    3 => assert_eq!(v, Value::Int(i)),
                    2 => assert_eq!(
                        (p.len(v), p.get(v, "b"), p.get(v, "c")),
                        (Some(2), None, Some(Value::Int(1)))
                    ),
                    k => {
                        assert_eq!(p.get(v, "a"), Some(Value::Int(i)));
                        let c = p.get(v, "c").unwrap();
                        assert_eq!(
                            c,
                            [
                                Value::Int(i << 40),
                                Value::None,
                                Value::None,
                                Value::None,
                                Value::Int(-i)
                            ][k as usize]
                        );
                    }
                }
            }
        }
        assert!(matches!(p.item(plain, 2000), Some(Value::Row(..))));
        for i in 0..2001 {
            assert_eq!(
                p.item(back, 2000 - i),
                p.item(memo, i),
                "one object, fetched again"
            );
        }
    }

    #[test]
    fn mutations_after_sharing_keep_python_semantics() {
        // {'a': L, 'b': L} then BINGET L, APPEND 7: both keys see [7].
        let p = from_slice(b"\x80\x04}\x94(\x8c\x01a\x94]\x94\x8c\x01b\x94h\x02uh\x02K\x07a0.")
            .unwrap();
        let (a, b) = (p.get(p.root(), "a").unwrap(), p.get(p.root(), "b").unwrap());
        assert_eq!(
            (a, p.len(a), p.item(b, 0)),
            (b, Some(1), Some(Value::Int(7)))
        );
        // Rows: L = [d1, d2] (two rows), M = [d1]; then d1['a'] = 9 and d2['c'] = 5 through the
        // memo. Python: ([{'a': 9, 'b': 2}, {'a': 3, 'b': 4, 'c': 5}], [{'a': 9, 'b': 2}]).
        let b = b"\x80\x04]\x94(}\x94(\x8c\x01a\x94K\x01\x8c\x01b\x94K\x02u}\x94(h\x02K\x03h\x03K\x04ue]\x94h\x01ah\x01\x8c\x01aK\ts0h\x04\x8c\x01cK\x05s0\x86.";
        let p = from_slice(b).unwrap();
        let (l, m) = (p.item(p.root(), 0).unwrap(), p.item(p.root(), 1).unwrap());
        let (d1, d2) = (p.item(l, 0).unwrap(), p.item(l, 1).unwrap());
        assert!(matches!(d1, Value::Row(..)));
        assert_eq!(
            (p.item(m, 0), p.get(d1, "a")),
            (Some(d1), Some(Value::Int(9)))
        );
        assert_eq!(
            (p.len(d2), p.get(d2, "c"), p.get(d2, "a")),
            (Some(3), Some(Value::Int(5)), Some(Value::Int(3)))
        );
        let keys: Vec<_> = p.entries(d2).map(|(k, _)| p.str(k).unwrap()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
    }

    /// Hands out at most 7 bytes per call, to cross the buffer's refills everywhere.
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = out.len().min(7).min(self.0.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn streams_from_a_reader_in_small_pieces() {
        let Some(b) = snapshot("snapshot_mlp_adam") else {
            return;
        };
        let (whole, trickled) = (from_slice(&b).unwrap(), read(Trickle(&b)).unwrap());
        assert!(tagged(&whole, whole.root()) == tagged(&trickled, trickled.root()));
        let long = [
            &[0x80, 4, 0x8d][..],
            &(3u64 << 20).to_le_bytes(),
            &vec![b'z'; 3 << 20],
            b".",
        ]
        .concat();
        let p = read(Trickle(&long)).unwrap();
        assert_eq!(p.str(p.root()).map(str::len), Some(3 << 20));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Random bytes, mostly opcodes (with random bytes as their arguments), to reach deep.
        #[test]
        fn random_bytes_never_panic(
            proto in 2u8..6,
            body in proptest::collection::vec(prop_oneof![
                3 => prop::sample::select(b"()]}eusa0120tK\x01hjqr\x94\x85\x86\x87\x88\x8a\x8cN.".to_vec()),
                1 => any::<u8>(),
            ], 0..2000),
        ) {
            let _ = from_slice(&[&[0x80, proto][..], &body].concat());
            let _ = from_slice(&body);
        }

        #[test]
        fn mutated_snapshots_never_panic(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let b = fixture("common_p4.pickle");
            let mut m = snapshot("snapshot_mlp_adam").unwrap_or(b);
            for (at, byte) in edits {
                let i = at.index(m.len());
                m[i] = byte;
            }
            let _ = from_slice(&m);
            let _ = from_slice(&m[..cut.index(m.len())]);
        }
    }

    /// Speed and peak memory on a big file: GPUMEM_PICKLE_BENCH=FILE cargo test --release
    /// --lib pickle::tests::bench -- --ignored --nocapture
    #[test]
    #[ignore]
    fn bench() {
        let Ok(path) = std::env::var("GPUMEM_PICKLE_BENCH") else {
            return;
        };
        let hwm = || {
            let s = std::fs::read_to_string("/proc/self/status").unwrap();
            let l = s
                .lines()
                .find(|l| l.starts_with("VmHWM"))
                .unwrap()
                .to_string();
            l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
        };
        let size = std::fs::metadata(&path).unwrap().len();
        let before = hwm();
        let t = std::time::Instant::now();
        let p = read(std::fs::File::open(&path).unwrap()).unwrap();
        let secs = t.elapsed().as_secs_f64();
        let trace = p
            .item(p.get(p.root(), "device_traces").unwrap(), 0)
            .unwrap();
        println!(
            "{path}: {size} bytes, {} entries, {secs:.3} s, {:.0} MB/s, peak RSS {} MB (before {} MB), peak/file {:.2}",
            p.len(trace).unwrap(),
            size as f64 / secs / 1e6,
            hwm() / 1_000_000,
            before / 1_000_000,
            hwm() as f64 / size as f64
        );
    }
}
