//! Reading a large pickle in chunks, on several cores or one, for lists of many small dicts
//! (PyTorch's traces).
//!
//! A PyTorch snapshot is mostly one list: the trace, millions of small dicts with the same
//! keys, written by CPython in protocol 4 or 5 with FRAME opcodes every 64 KiB. A frame starts
//! at an opcode boundary, so the file can be cut there without decoding it. The caller names
//! the keys it wants of each entry (a [`Projection`]); the reader:
//!
//! 1. indexes the frames (one 9-byte read per frame);
//! 2. reads sequentially, with the ordinary parser (the *driver*), until it is inside a list in
//!    record form whose dicts have the projection's key (`action`), so it knows the keys and
//!    every memo entry made so far (the *prefix*);
//! 3. cuts the rest at frame starts into chunks, and decodes the chunks on all cores. A worker
//!    finds the first entry of its chunk (walking opcodes from the frame start to a dict with
//!    that key), then decodes entries into the projection's typed columns until the first entry
//!    that starts at or past its chunk's end ([`worker`]). Memo fetches of the prefix are resolved at once;
//!    later ones, and strings first seen in the chunk, are fixed up afterwards. MEMOIZEs are
//!    counted, not numbered (the chunk's first memo index is not known yet). An entry it does
//!    not decode (a new stack of frames, an unusual opcode) ends its chunk early;
//! 4. the driver goes on sequentially and, each time it arrives exactly where a chunk begins in
//!    the state the chunk assumes (an open APPENDS batch of a trace list), takes the chunk:
//!    its entries become projected rows of that list ([`Pickle::projected`]) in place of dicts,
//!    its memo entries are numbered, and the driver continues after it. What no chunk covers
//!    (the prefix, whatever a worker declined, the end of the file) the driver reads itself, so
//!    each byte is decoded once;
//! 5. the fix-ups are resolved on all cores, against the finished memo.
//!
//! Projected rows give exactly what the dicts would: for an int key, [`Pickle::int`] of its
//! value (0 when absent or not an int); for a str key, the string; for an object key, the
//! object. The dicts themselves are not kept, so a memo fetch of one (which PyTorch never
//! writes) fails, and on that, on any other error, or on anything the driver cannot confirm,
//! the file is read again sequentially (which also gives the canonical error message). Tests
//! compare the two readers on every fixture.

use super::input::Input;
use super::keys::same_key;
use super::parse::Parser;
use super::store::{Data, Node};
use super::{ObjId, Pickle, PickleError, StrId, Value, INDEX_AT};
use std::fs::File;
use std::io::{self, Read};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The slot of a fix-up that only checks its memo fetch (the value of a key not projected).
const UNREAD: u16 = u16::MAX;

/// Reads `f` at `off` (positioned reads, so threads share one file handle).
fn read_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_at(f, buf, off)
    }
    #[cfg(windows)]
    {
        std::os::windows::fs::FileExt::seek_read(f, buf, off)
    }
}

/// A `Read` over a file from a position, by positioned reads.
pub(super) struct At<'a> {
    pub(super) file: &'a File,
    pub(super) pos: u64,
    /// Bytes read so far, for a progress display.
    pub(super) progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = read_at(self.file, buf, self.pos)?;
        self.pos += n as u64;
        if let Some(p) = self.progress {
            p(n as u64);
        }
        Ok(n)
    }
}

fn input<'a>(
    file: &'a File,
    pos: u64,
    progress: Option<&'a (dyn Fn(u64) + Sync)>,
) -> Input<At<'a>> {
    Input::new(
        At {
            file,
            pos,
            progress,
        },
        pos,
    )
}

/// Moves the driver's input to `off` (forgetting what it had buffered).
fn seek(inp: &mut Input<At<'_>>, off: u64) {
    inp.r.pos = off;
    inp.restart_at(off);
}

/// The offsets of the FRAME opcodes that follow each other from the start (after PROTO), up
/// to the first gap (CPython writes a large string or bytes outside frames; the index stops
/// there, and the rest is read by the driver).
fn frame_index(f: &File, len: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut head = [0u8; 2];
    if read_at(f, &mut head, 0).ok() != Some(2) || head[0] != 0x80 || head[1] < 4 {
        return out;
    }
    let mut off = 2u64;
    let mut h = [0u8; 9];
    while off + 9 <= len {
        if read_at(f, &mut h, off).ok() != Some(9) || h[0] != 0x95 {
            break;
        }
        out.push(off);
        let n = u64::from_le_bytes(h[1..9].try_into().expect("8 bytes"));
        off = match n.checked_add(9).and_then(|n| off.checked_add(n)) {
            Some(o) if o <= len => o,
            _ => break,
        };
    }
    out
}

/// The keys a caller wants of each entry of a trace list: `detect` marks such a list (its
/// dicts have that key); `ints`, `strs` and `objs` are read into typed columns.
#[derive(Debug, Clone, Copy)]
pub struct Projection {
    pub detect: &'static str,
    pub ints: &'static [&'static str],
    pub strs: &'static [&'static str],
    pub objs: &'static [&'static str],
}

/// A run of entries of a trace list, read into columns (row-major: `ints[row * ints_per_row
/// + k]` is int key `k` of the projection).
#[derive(Debug, Default)]
pub struct Projected {
    pub(super) rows: u32,
    pub(super) ints: Vec<i64>,
    pub(super) strs: Vec<u32>,
    pub(super) objs: Vec<u32>,
    pub(super) ni: usize,
    pub(super) ns: usize,
    pub(super) no: usize,
}

/// No value (the key is absent, or its value is not a str / not an object).
const NONE: u32 = u32::MAX;
/// No int (the key is absent, or its value is not an int). An int of this value (-2^63) reads
/// as absent too: no key a trace projects has a use for it.
const NO_INT: i64 = i64::MIN;

impl Projected {
    pub fn rows(&self) -> usize {
        self.rows as usize
    }
    /// Int key `k` of row `r`: its value (bools are 0 and 1), or `None` when the key is absent
    /// or its value is not an int.
    #[inline]
    pub fn int(&self, r: usize, k: usize) -> Option<i64> {
        match self.ints[r * self.ni + k] {
            NO_INT => None,
            i => Some(i),
        }
    }
    /// Str key `k` of row `r`, when it is a str.
    #[inline]
    pub fn str(&self, r: usize, k: usize) -> Option<Value> {
        match self.strs[r * self.ns + k] {
            NONE => None,
            s => Some(Value::Str(StrId(s))),
        }
    }
    /// Object key `k` of row `r`, when it is an object (list, tuple, dict, bytes, big int).
    #[inline]
    pub fn obj(&self, r: usize, k: usize) -> Option<Value> {
        match self.objs[r * self.no + k] {
            NONE => None,
            o => Some(Value::Obj(ObjId(o))),
        }
    }
    /// Str key `k` of row `r` as a string id (`u32::MAX` when it is not a str), for tables.
    #[inline]
    pub fn str_id(&self, r: usize, k: usize) -> u32 {
        self.strs[r * self.ns + k]
    }
    /// Object key `k` of row `r` as an object id (`u32::MAX` when it is not an object).
    #[inline]
    pub fn obj_id(&self, r: usize, k: usize) -> u32 {
        self.objs[r * self.no + k]
    }
    /// The value of an id from [`str_id`](Self::str_id).
    pub fn str_value(id: u32) -> Option<Value> {
        (id != NONE).then_some(Value::Str(StrId(id)))
    }
    /// The value of an id from [`obj_id`](Self::obj_id).
    pub fn obj_value(id: u32) -> Option<Value> {
        (id != NONE).then_some(Value::Obj(ObjId(id)))
    }
    fn set(&mut self, r: usize, slot: usize, v: Value) {
        if slot < self.ni {
            self.ints[r * self.ni + slot] = match v {
                Value::Int(i) => i,
                Value::Bool(b) => i64::from(b),
                _ => NO_INT,
            };
        } else if slot < self.ni + self.ns {
            self.strs[r * self.ns + slot - self.ni] = match v {
                Value::Str(s) => s.0,
                _ => NONE,
            };
        } else {
            self.objs[r * self.no + slot - self.ni - self.ns] = match v {
                Value::Obj(o) => o.0,
                _ => NONE,
            };
        }
    }
}

/// A value a worker read: resolved, or to be resolved when its chunk is taken.
#[derive(Clone, Copy, Debug)]
enum LVal {
    V(Value),
    /// A memo fetch past the prefix.
    Ref(u32),
    /// A string first seen in the chunk (index into `Chunk::strs`).
    S(u32),
}

/// A cell to fill once the memo is complete (12 bytes: a trace may have one per entry): the
/// row, the slot (or [`UNREAD`]), and a memo fetch past the prefix or a string first seen in
/// the chunk.
#[derive(Clone, Copy, Debug)]
struct Fix {
    row: u32,
    id: u32,
    slot: u16,
    string: bool,
}

impl Fix {
    fn lval(self) -> LVal {
        if self.string {
            LVal::S(self.id)
        } else {
            LVal::Ref(self.id)
        }
    }
}

/// Defers the cell of `row` in projection slot `slot` (`u8::MAX`: a key nobody reads), read as
/// `l`, to the fix-ups; a value needs none. Of a key nobody reads, only a memo fetch is kept:
/// it must still name an entry that exists, as the sequential reader requires.
fn defer(fix: &mut Vec<Fix>, row: u32, slot: u8, l: LVal) {
    let (id, string) = match l {
        LVal::S(i) => (i, true),
        LVal::Ref(i) => (i, false),
        LVal::V(_) => return,
    };
    let slot = match slot {
        u8::MAX if string => return,
        u8::MAX => UNREAD,
        s => u16::from(s),
    };
    fix.push(Fix {
        row,
        id,
        slot,
        string,
    });
}

/// What a worker decoded: the entries from `start` to `end` of the file.
#[derive(Debug, Default)]
struct Chunk {
    /// Offset of its first entry.
    start: u64,
    /// Where it stopped: the start of the entry after its last, or just after the APPENDS that
    /// ends the list (`ended`).
    end: u64,
    ended: bool,
    rows: Projected,
    /// Cells to fill once the memo is complete.
    fix: Vec<Fix>,
    /// MEMOIZEs in the chunk, and those of values (not of entry dicts): (index among the
    /// chunk's MEMOIZEs, value).
    defs: u32,
    vals: Vec<(u32, LVal)>,
    strs: Vec<String>,
}

/// A chunk taken by the driver, with what its fix-ups need.
#[derive(Debug)]
pub(super) struct Taken {
    pub(super) list: ObjId,
    /// Items of the list (as the parser holds them) before this chunk's rows.
    pub(super) after: u32,
    pub(super) rows: Projected,
    fix: Vec<Fix>,
    strs: Vec<u32>,
}

/// The keys of the last entry a worker read (distinct), and their slots in the projection
/// (`u8::MAX`: not wanted).
#[derive(Default)]
struct Seen {
    keys: Vec<Value>,
    slots: Vec<u8>,
}

/// What the workers share: the driver's state when it found the trace (read only).
struct Ctx<'a> {
    file: &'a File,
    len: u64,
    memo: &'a [Option<Value>],
    /// Whether a worker may take the value of each memo entry of the prefix as it is.
    memo_ok: Vec<bool>,
    objs: &'a [Node],
    /// The projection's keys by string id, in slot order (ints, strs, objs), and the key that
    /// marks an entry.
    slots: Vec<Value>,
    detect: Value,
    ni: usize,
    ns: usize,
    no: usize,
}

impl Parser {
    /// The list the driver is filling, if it is a trace: the container below the innermost
    /// MARK, in record form with the `detect` key, and the stack above the MARK holding only
    /// finished entries.
    fn trace_list(&self, detect: Value) -> Option<ObjId> {
        let m = *self.marks.last()?;
        let Value::Obj(lid) = *self.stack.get(m.checked_sub(1)?)? else {
            return None;
        };
        let Data::Records(rec) = &self.objs[lid.0 as usize].data else {
            return None;
        };
        if !rec.keys.contains(&detect) {
            return None;
        }
        if self.stack.len() == m {
            return Some(lid);
        }
        // a dict just opened (EMPTY_DICT) is empty until its SETITEMS
        match self.stack.last() {
            Some(&Value::Obj(d)) => match &self.objs[d.0 as usize].data {
                Data::Dict(e) if !e.is_empty() => Some(lid),
                _ => None,
            },
            _ => None,
        }
    }

    /// A value a worker read, now that the memo holds everything before it.
    fn resolve(&self, l: LVal, strs: &[u32]) -> Option<Value> {
        let v = match l {
            LVal::V(v) => v,
            LVal::S(i) => Value::Str(StrId(*strs.get(i as usize)?)),
            LVal::Ref(i) => match self.memo.get(i as usize) {
                Some(Some(v)) => *v,
                _ => *self.memo_far.get(&i)?,
            },
        };
        match v {
            Value::Row(..) => None,
            Value::Obj(id) if matches!(self.objs[id.0 as usize].data, Data::Dict(_)) => None,
            v => Some(v),
        }
    }

    /// Takes chunk `c`: the driver is where it begins.
    fn take(&mut self, c: Chunk, detect: Value) -> Option<()> {
        let lid = self.trace_list(detect)?;
        let m = *self.marks.last()?;
        // the batch read so far goes into the list now (APPENDS does the same, item by item);
        // the MARK stays, guarded: only an APPENDS may close it
        let items: Vec<Value> = self.stack.drain(m..).collect();
        for v in items {
            self.append(Value::Obj(lid), v).ok()?;
        }
        self.guard = Some(self.marks.len() - 1);
        let strs: Vec<u32> = c
            .strs
            .iter()
            .map(|s| self.strs.intern(s).ok())
            .collect::<Option<_>>()?;
        let base = self.memo_len;
        for &(k, l) in &c.vals {
            let v = self.resolve(l, &strs)?;
            self.put(base.checked_add(k)?, v);
        }
        self.memo_len = base.checked_add(c.defs).filter(|&n| n < super::SHARED)?;
        let after = match &self.objs[lid.0 as usize].data {
            Data::Records(r) => r.len,
            _ => return None,
        };
        if c.ended {
            // the APPENDS that closed the list: nothing is left above its MARK
            self.marks.pop();
            self.guard = None;
        }
        self.taken.push(Taken {
            list: lid,
            after,
            rows: c.rows,
            fix: c.fix,
            strs,
        });
        Some(())
    }
}

/// Reads the pickle in `file`, on up to `threads` cores for the trace lists that `projection`
/// describes, in chunks of about `chunk` bytes (on one core too: decoding a chunk's entries
/// straight into the projection's columns is faster than the general parser); the sequential
/// reader without a projection, for files of fewer than two chunks or without frames, and
/// whenever anything is unusual. `progress` is called with bytes read.
pub fn read_file(
    file: &File,
    threads: usize,
    chunk: u64,
    projection: Option<&Projection>,
    progress: Option<&(dyn Fn(u64) + Sync)>,
) -> Result<Pickle, PickleError> {
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if let Some(pr) = projection.filter(|_| len / 2 >= chunk) {
        if let Some(p) = try_parallel(file, len, threads, chunk, pr, progress) {
            return Ok(p);
        }
    }
    super::read(At {
        file,
        pos: 0,
        progress,
    })
}

fn try_parallel(
    file: &File,
    len: u64,
    threads: usize,
    chunk: u64,
    pr: &Projection,
    progress: Option<&(dyn Fn(u64) + Sync)>,
) -> Option<Pickle> {
    let frames = frame_index(file, len);
    if frames.len() < 4 {
        return None;
    }
    let mut inp = input(file, 0, progress);
    let mut p = Parser::default();
    // 1. the prefix, frame by frame, until the driver is inside a trace
    let mut fi = 0;
    let detect = loop {
        while fi < frames.len() && frames[fi] <= inp.offset() {
            fi += 1;
        }
        let &f = frames.get(fi)?; // no trace before the last frame: nothing to share out
        p.limit = f;
        match p.run_until(&mut inp) {
            Ok(None) => {}
            _ => return None, // a small pickle, or an error: the sequential reader says which
        }
        if let Some(id) = p.strs.find(pr.detect) {
            let d = Value::Str(StrId(id));
            if p.trace_list(d).is_some() {
                break d;
            }
        }
    };
    if !p.memo_far.is_empty() {
        return None;
    }
    // keys the file never wrote cannot match: a key of no string
    let key = |k: &str| p.strs.find(k).map_or(Value::None, |i| Value::Str(StrId(i)));
    let slots: Vec<Value> = pr
        .ints
        .iter()
        .chain(pr.strs)
        .chain(pr.objs)
        .map(|k| key(k))
        .collect();
    // 2. chunks at frame starts, decoded on all cores
    let mut bounds: Vec<u64> = Vec::new();
    for &f in &frames[fi..] {
        if bounds.last().is_none_or(|&last| f >= last + chunk) {
            bounds.push(f);
        }
    }
    let spans: Vec<(u64, u64)> = bounds
        .iter()
        .enumerate()
        .map(|(k, &b)| (b, bounds.get(k + 1).copied().unwrap_or(len)))
        .collect();
    let chunks: Vec<Mutex<Option<Chunk>>> = spans.iter().map(|_| Mutex::new(None)).collect();
    {
        let memo_ok: Vec<bool> = p
            .memo
            .iter()
            .map(|v| match v {
                Some(Value::Obj(id)) => matches!(
                    p.objs[id.0 as usize].data,
                    Data::List(_)
                        | Data::Records(_)
                        | Data::Tuple(_)
                        | Data::Bytes(_)
                        | Data::BigInt(_)
                ),
                Some(Value::Row(..)) | None => false,
                Some(_) => true,
            })
            .collect();
        let ctx = Ctx {
            file,
            len,
            memo_ok,
            memo: &p.memo,
            objs: &p.objs,
            slots,
            detect,
            ni: pr.ints.len(),
            ns: pr.strs.len(),
            no: pr.objs.len(),
        };
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..threads.min(spans.len()) {
                s.spawn(|| loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(a, b)) = spans.get(k) else { break };
                    let c = ctx.worker(a, b);
                    if let Some(pr) = progress {
                        pr(b - a);
                    }
                    *chunks[k].lock().unwrap_or_else(|e| e.into_inner()) = c;
                });
            }
        });
    }
    // 3. the driver, taking each chunk it arrives at
    inp.r.progress = None;
    for slot in &chunks {
        let Some(c) = slot.lock().ok()?.take() else {
            continue;
        };
        if c.end == c.start || inp.offset() > c.start || p.rewrites > 0 {
            continue;
        }
        p.limit = c.start;
        match p.run_until(&mut inp) {
            Ok(None) => {}
            Ok(Some(_)) | Err(_) => return None,
        }
        if inp.offset() != c.start {
            continue; // the worker's first entry was not where the driver is
        }
        let end = c.end;
        p.take(c, detect)?;
        seek(&mut inp, end);
    }
    p.limit = 0;
    // an error (the sequential reader gives its canonical message), or an early append undone
    let root = p.run_until(&mut inp).ok()??;
    // 4. fix-ups, on all cores, against the finished memo
    let mut taken = std::mem::take(&mut p.taken);
    let failed = std::sync::atomic::AtomicBool::new(false);
    {
        let next = AtomicUsize::new(0);
        let slots: Vec<Mutex<&mut Taken>> = taken.iter_mut().map(Mutex::new).collect();
        let p = &p;
        std::thread::scope(|s| {
            for _ in 0..threads.min(slots.len()) {
                s.spawn(|| loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(t) = slots.get(k) else { break };
                    let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                    let t = &mut **t;
                    for &f in &t.fix {
                        let (r, slot) = (f.row, f.slot);
                        match p.resolve(f.lval(), &t.strs) {
                            Some(_) if slot == UNREAD => {}
                            Some(v) => t.rows.set(r as usize, usize::from(slot), v),
                            None => failed.store(true, Ordering::Relaxed),
                        }
                    }
                    t.fix = Vec::new();
                });
            }
        });
    }
    if failed.into_inner() {
        return None;
    }
    p.taken = taken;
    Some(super::finish(p, root))
}

#[path = "par_worker.rs"]
mod worker;

#[cfg(test)]
#[path = "par_tests.rs"]
mod tests;
