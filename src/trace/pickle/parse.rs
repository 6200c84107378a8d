//! The parser: the opcode loop (with the fast path for the dicts of a trace), the stack, the
//! marks and the memo. Filling containers is in [`super::build`].

use super::input::{msg, Fail, Input, E, R};
use super::keys::same_key;
use super::store::{Data, Node, Strings};
use super::{F64Bits, ObjId, PickleError, StrId, Value, INDEX_AT, MAX_DEPTH, NO_MEMO, SHARED};
use rustc_hash::FxHashMap;
use std::io::Read;

#[derive(Default)]
pub(super) struct Parser {
    pub(super) objs: Vec<Node>,
    pub(super) strs: Strings,
    pub(super) index: FxHashMap<u32, Vec<u32>>,
    /// The memo: dense up to the highest index used compactly, sparse beyond.
    pub(super) memo: Vec<Option<Value>>,
    pub(super) memo_far: FxHashMap<u32, Value>,
    pub(super) memo_len: u32,
    pub(super) stack: Vec<Value>,
    pub(super) marks: Vec<usize>,
    /// Dict nodes emptied when their contents became a row, reused by the next EMPTY_DICT.
    pub(super) free_dicts: Vec<u32>,
    /// The str keys of the last dict filled by one SETITEMS (distinct).
    pub(super) last_keys: Vec<Value>,
    /// Scratch of `dict_body`: the pairs read, and the values memoized, in order.
    pairs: Vec<(Value, Value)>,
    pending: Vec<Value>,
    /// `run_until` stops at the first opcode at or past this offset (0: no limit).
    pub(super) limit: u64,
    /// The index in `marks` of a MARK whose items were appended early by the parallel reader
    /// ([`super::par`]): only APPENDS may pop it, else the parallel read is abandoned.
    pub(super) guard: Option<usize>,
    /// Memo slots written over (BINPUT/PUT on a used index), which the parallel reader's
    /// workers could not have seen.
    pub(super) rewrites: u64,
    /// Runs of trace entries read by the parallel reader's workers, in order.
    pub(super) taken: Vec<super::par::Taken>,
}

/// The message of the error that abandons a parallel read (it is then read sequentially).
pub(super) const FUSED: &str = "undoes an early append of the parallel reader";

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
    pub(super) fn run<T: Read>(&mut self, inp: &mut Input<T>) -> Result<Value, PickleError> {
        self.limit = 0;
        self.run_until(inp).map(|r| r.expect("no limit"))
    }

    /// Runs until STOP (`Some(root)`), or until the next opcode starts at or past `self.limit`
    /// when that is not 0 (`None`).
    pub(super) fn run_until<T: Read>(
        &mut self,
        inp: &mut Input<T>,
    ) -> Result<Option<Value>, PickleError> {
        loop {
            let at = inp.offset();
            if self.limit != 0 && at >= self.limit {
                return Ok(None);
            }
            let op = inp.byte();
            let (e, op) = match op {
                Ok(b'.') if self.guard.is_some() => {
                    (E(Box::new(Fail::Msg(FUSED.into()))), Some(b'.'))
                }
                Ok(b'.') => match self.pop() {
                    Ok(root) => return Ok(Some(root)),
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
                if inp.pos == inp.end
                    || inp.buf.get(inp.pos) != Some(&b'}')
                    || self.limit != 0 && inp.offset() >= self.limit
                {
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
                if op == b'e' && self.guard == Some(self.marks.len().wrapping_sub(1)) {
                    self.guard = None;
                }
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
                    if self.guard == Some(self.marks.len() - 1) {
                        return msg(FUSED);
                    }
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
        let id = match super::py_str(b) {
            Some(s) => self.strs.intern(&s)?,
            None => return msg(super::NOT_UTF8),
        };
        Ok(Value::Str(StrId(id)))
    }

    pub(super) fn new_obj(&mut self, data: Data, depth: u32) -> R<Value> {
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
        if self.guard.is_some() && self.guard == Some(self.marks.len().wrapping_sub(1)) {
            return msg(FUSED);
        }
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
    pub(super) fn put(&mut self, i: u32, v: Value) {
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
            let new = self.memo[k].replace(v).is_none();
            self.rewrites += u64::from(!new);
            new
        } else if k <= self.memo.len() + 1024 {
            self.rewrites += u64::from(self.memo_far.contains_key(&i));
            // Compact growth (bounded per opcode); far indices go to the map.
            let old = self.memo.len();
            self.memo.resize(k + 1, None);
            for j in old..k {
                self.memo[j] = self.memo_far.remove(&(j as u32));
            }
            self.memo[k] = Some(v);
            self.memo_far.remove(&i).is_none()
        } else {
            let new = self.memo_far.insert(i, v).is_none();
            self.rewrites += u64::from(!new);
            new
        };
        self.memo_len += u32::from(new);
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
