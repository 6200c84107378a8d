//! The worker's side of the parallel pickle reader ([`super`]): a chunk of the file, from
//! a frame start, decoded into the projection's columns: the first entry found by walking
//! opcodes, then entry after entry (a fast path for the usual shape, the general one
//! otherwise), memo fetches past the prefix and strings first seen deferred as fix-ups.

use super::*;

/// The bytes of the file from some offset, read in large pieces.
struct Window<'a> {
    file: &'a File,
    len: u64,
    base: u64,
    buf: Vec<u8>,
}

impl Window<'_> {
    /// At least `need` bytes from `off` (fewer only at the end of the file).
    fn at(&mut self, off: u64, need: usize) -> Option<&[u8]> {
        let have = self.base + self.buf.len() as u64;
        if off < self.base || off + need as u64 > have && have < self.len {
            let want = need
                .max(1 << 20)
                .min((self.len - off.min(self.len)) as usize);
            self.buf.resize(want, 0);
            let mut got = 0;
            while got < want {
                match read_at(self.file, &mut self.buf[got..], off + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return None,
                }
            }
            self.buf.truncate(got);
            self.base = off;
        }
        self.buf.get((off - self.base) as usize..)
    }
}

/// A cursor over bytes; every read is checked (`None` at the end).
pub(super) struct Cur<'b> {
    pub(super) b: &'b [u8],
    pub(super) i: usize,
}

impl<'b> Cur<'b> {
    #[inline(always)]
    fn u8(&mut self) -> Option<u8> {
        let x = *self.b.get(self.i)?;
        self.i += 1;
        Some(x)
    }
    #[inline(always)]
    fn take(&mut self, n: usize) -> Option<&'b [u8]> {
        let s = self.b.get(self.i..self.i.checked_add(n)?)?;
        self.i += n;
        Some(s)
    }
    #[inline(always)]
    fn le<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    /// The next opcode, after any FRAMEs (which may fall between any two opcodes).
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        loop {
            let x = *self.b.get(self.i)?;
            if x != 0x95 {
                return Some(x);
            }
            self.take(9)?;
        }
    }
}

/// The length of the opcode at `c` with its argument, for walking to a chunk's first entry;
/// `None` for the text opcodes (their arguments end at a newline) and anything unknown.
pub(super) fn op_len(c: &Cur) -> Option<usize> {
    let b = &c.b[c.i..];
    let u32_at = |k: usize| -> Option<usize> {
        Some(u32::from_le_bytes(b.get(k..k + 4)?.try_into().ok()?) as usize)
    };
    let u64_at = |k: usize| -> Option<usize> {
        usize::try_from(u64::from_le_bytes(b.get(k..k + 8)?.try_into().ok()?)).ok()
    };
    Some(match *b.first()? {
        b'('
        | b'.'
        | b'0'
        | b'1'
        | b'2'
        | b'N'
        | b'R'
        | b'Q'
        | b'a'
        | b'b'
        | b'd'
        | b'}'
        | b'e'
        | b'l'
        | b']'
        | b'o'
        | b's'
        | b't'
        | b')'
        | b'u'
        | 0x85..=0x89
        | 0x8f..=0x94
        | 0x97
        | 0x98 => 1,
        b'h' | b'K' | b'q' | 0x82 => 2,
        b'M' | 0x83 => 3,
        b'J' | b'j' | b'r' | 0x84 => 5,
        b'G' | 0x95 => 9,
        0x80 => 2,
        0x8a | b'C' | b'U' | 0x8c => 2 + usize::from(*b.get(1)?),
        0x8b | b'X' | b'B' | b'T' => u32_at(1)?.checked_add(5)?,
        0x8d | 0x8e | 0x96 => u64_at(1)?.checked_add(9)?,
        _ => return None,
    })
}

/// The first opcode at or after `i` in `b` that is not a FRAME, for [`Ctx::fast_entry`]:
/// `None` past byte 3,600 (so that what follows, at most 270 bytes, is in the 4,096 it has).
#[inline(always)]
fn skip_frames(b: &[u8], mut i: usize) -> Option<usize> {
    while *b.get(i)? == 0x95 {
        i += 9;
    }
    (i <= 3600).then_some(i)
}

/// An int opcode's value, when it fits in i64 (bigger ones are left to the driver).
#[inline(always)]
fn int_le(b: &[u8]) -> Option<i64> {
    if b.is_empty() || b.len() > 8 {
        return None;
    }
    let x = b.iter().rev().fold(0u64, |x, &c| x << 8 | u64::from(c));
    let unused = 64 - 8 * b.len() as u32;
    Some(((x << (unused % 64)) as i64) >> (unused % 64))
}

/// Why a worker stopped decoding an entry.
pub(super) enum Stop {
    /// Not something a worker decodes (the driver will).
    Decline,
    /// The bytes ran out before the entry did (more bytes may help).
    Short,
}

impl Ctx<'_> {
    pub(super) fn worker(&self, chunk_start: u64, chunk_end: u64) -> Option<Chunk> {
        let mut w = Window {
            file: self.file,
            len: self.len,
            base: 0,
            buf: Vec::new(),
        };
        let start = self.find_entry(&mut w, chunk_start, chunk_end)?;
        // about 75 bytes an entry: room for the chunk's rows at once
        let guess = ((chunk_end - chunk_start) / 64) as usize;
        let mut c = Chunk {
            start,
            end: start,
            rows: Projected {
                ints: Vec::with_capacity(guess * self.ni),
                strs: Vec::with_capacity(guess * self.ns),
                objs: Vec::with_capacity(guess * self.no),
                ni: self.ni,
                ns: self.ns,
                no: self.no,
                ..Projected::default()
            },
            ..Chunk::default()
        };
        let mut off = start;
        let mut pairs: Vec<(Value, LVal)> = Vec::with_capacity(16);
        let mut seen = Seen::default();
        while off < chunk_end {
            // the fast path: entries with the last one's keys, many per window
            if !seen.keys.is_empty() {
                if let Some(b) = w.at(off, 1 << 16) {
                    let lim = b.len().saturating_sub(4096);
                    let mut i = 0;
                    while i < lim && off + (i as u64) < chunk_end {
                        match self.fast_entry(&b[i..], &mut c, &seen) {
                            Some(n) => i += n,
                            None => break,
                        }
                    }
                    if i > 0 {
                        off += i as u64;
                        c.end = off;
                        continue;
                    }
                }
            }
            let mut need = 1 << 16;
            let r = loop {
                let Some(b) = w.at(off, need) else {
                    break None;
                };
                let short = b.len() < need;
                let mut cur = Cur { b, i: 0 };
                match cur.peek() {
                    Some(b'}') => {}
                    Some(b'e') => {
                        cur.i += 1;
                        match cur.peek() {
                            // the next APPENDS batch of the list (the driver's MARK guard
                            // catches a MARK that turns out to be closed by something else)
                            Some(b'(') => {
                                cur.i += 1;
                                break Some((cur.i, false));
                            }
                            Some(_) => break Some((cur.i, true)),
                            None => break None,
                        }
                    }
                    _ => break None,
                }
                let (defs, vals, strs) = (c.defs, c.vals.len(), c.strs.len());
                let undo = |c: &mut Chunk| {
                    c.defs = defs;
                    c.vals.truncate(vals);
                    c.strs.truncate(strs);
                };
                let ok = self.entry(&mut cur, &mut c, &mut pairs, &seen);
                // an entry is whole only if the next opcode is another entry or APPENDS (else
                // something like a further SETITEMS still belongs to it)
                let next = if ok.is_ok() { cur.peek() } else { None };
                match (ok, next) {
                    (Ok(()), Some(b'}' | b'e')) => {
                        self.commit(&mut c, &pairs, &mut seen);
                        break Some((cur.i, false));
                    }
                    (Err(Stop::Short), _) | (Ok(()), None) if !short && need < 1 << 24 => {
                        undo(&mut c);
                        need *= 16;
                    }
                    _ => {
                        undo(&mut c);
                        break None;
                    }
                }
            };
            // stopped early: what follows is the driver's
            let Some((n, ended)) = r else { break };
            off += n as u64;
            c.end = off;
            if ended {
                c.ended = true;
                break;
            }
        }
        Some(c)
    }

    /// One entry with exactly the keys of the last one, or the `e (` between two APPENDS
    /// batches, decoded from `b` (at least 4096 bytes) without a check that cannot fail and
    /// without the scratch of [`Ctx::entry`]; `None` (and nothing changed) for anything else,
    /// which the general path then reads. Returns the bytes consumed.
    #[inline(always)]
    pub(super) fn fast_entry(&self, b: &[u8], c: &mut Chunk, seen: &Seen) -> Option<usize> {
        let mut i = skip_frames(b, 0)?;
        if b[i] == b'e' {
            i = skip_frames(b, i + 1)?;
            return (b[i] == b'(').then_some(i + 1);
        }
        if b[i] != b'}' {
            return None;
        }
        i += 1;
        let memo_dict = b[i] == 0x94;
        i += usize::from(memo_dict);
        if b[i] != b'(' {
            return None;
        }
        i += 1;
        let row = c.rows.rows as usize;
        let p = &mut c.rows;
        let (ni, ns, no) = (p.ints.len(), p.strs.len(), p.objs.len());
        p.ints.extend(std::iter::repeat_n(NO_INT, self.ni));
        p.strs.extend(std::iter::repeat_n(NONE, self.ns));
        p.objs.extend(std::iter::repeat_n(NONE, self.no));
        let fetch = |x: usize| -> Option<Value> {
            if *self.memo_ok.get(x)? {
                *self.memo.get(x)?
            } else {
                None
            }
        };
        // a value's memo fetch: resolved when the prefix made it, else (`Err`) one past the
        // prefix, left for the splice as the general path leaves it
        let fetch_value = |x: usize| -> Option<Result<Value, u32>> {
            if x >= self.memo.len() {
                return u32::try_from(x).ok().map(Err);
            }
            fetch(x).map(Ok)
        };
        let fixes = c.fix.len();
        let u32_at = |k: usize| u32::from_le_bytes([b[k], b[k + 1], b[k + 2], b[k + 3]]);
        let ok = (|| {
            for (k, &slot) in seen.keys.iter().zip(&seen.slots) {
                i = skip_frames(b, i)?;
                let key = match b[i] {
                    b'h' => {
                        i += 2;
                        fetch(usize::from(b[i - 1]))?
                    }
                    b'j' => {
                        i += 5;
                        fetch(u32_at(i - 4) as usize)?
                    }
                    _ => return None,
                };
                if !same_key(key, *k) {
                    return None;
                }
                i = skip_frames(b, i)?;
                let v = match b[i] {
                    b'h' => {
                        i += 2;
                        fetch_value(usize::from(b[i - 1]))?
                    }
                    b'j' => {
                        i += 5;
                        fetch_value(u32_at(i - 4) as usize)?
                    }
                    b'K' => {
                        i += 2;
                        Ok(Value::Int(i64::from(b[i - 1])))
                    }
                    b'M' => {
                        i += 3;
                        Ok(Value::Int(i64::from(u16::from_le_bytes([
                            b[i - 2],
                            b[i - 1],
                        ]))))
                    }
                    b'J' => {
                        i += 5;
                        Ok(Value::Int(i64::from(u32_at(i - 4) as i32)))
                    }
                    0x8a => {
                        let n = usize::from(b[i + 1]);
                        i += 2 + n;
                        Ok(Value::Int(int_le(&b[i - n..i])?))
                    }
                    b'N' => {
                        i += 1;
                        Ok(Value::None)
                    }
                    _ => return None,
                };
                i = skip_frames(b, i)?;
                if b[i] == 0x94 {
                    return None; // a value memoized: the general path counts it
                }
                match v {
                    Ok(v) if slot != u8::MAX => p.set(row, usize::from(slot), v),
                    Ok(_) => {}
                    Err(x) => defer(&mut c.fix, row as u32, slot, LVal::Ref(x)),
                }
            }
            i = skip_frames(b, i)?;
            if b[i] != b'u' {
                return None;
            }
            i += 1;
            // whole only if another entry or APPENDS follows
            let j = skip_frames(b, i)?;
            matches!(b[j], b'}' | b'e').then_some(())
        })();
        if ok.is_none() {
            c.fix.truncate(fixes);
            let p = &mut c.rows;
            p.ints.truncate(ni);
            p.strs.truncate(ns);
            p.objs.truncate(no);
            return None;
        }
        c.rows.rows += 1;
        c.defs += u32::from(memo_dict);
        Some(i)
    }

    /// The first entry at or after `from` (a frame start) and before `to`: walking opcodes, a
    /// dict with the projection's marking key.
    fn find_entry(&self, w: &mut Window, from: u64, to: u64) -> Option<u64> {
        let mut off = from;
        let mut scratch = Chunk::default();
        let mut pairs = Vec::new();
        while off < to {
            let b = w.at(off, 1 << 16)?;
            if b.is_empty() {
                return None;
            }
            // an entry probed must lie whole in the window: stop short of its end
            let lim = if b.len() >= 1 << 16 {
                b.len() - 4096
            } else {
                b.len()
            };
            let mut i = 0;
            while i < lim {
                if b[i] == b'}' {
                    let mut probe = Cur { b, i };
                    if self
                        .entry(&mut probe, &mut scratch, &mut pairs, &Seen::default())
                        .is_ok()
                        && pairs.iter().any(|p| same_key(p.0, self.detect))
                    {
                        return Some(off + i as u64);
                    }
                }
                i = i.checked_add(op_len(&Cur { b, i })?)?;
                if off.saturating_add(i as u64) >= to {
                    return None;
                }
            }
            off += i as u64;
        }
        None
    }

    /// Decodes one entry `} [MEMOIZE] ( (key value)* u` at `cur` into `pairs`, counting its
    /// MEMOIZEs and keeping its new strings in `c`.
    pub(super) fn entry(
        &self,
        cur: &mut Cur,
        c: &mut Chunk,
        pairs: &mut Vec<(Value, LVal)>,
        seen: &Seen,
    ) -> Result<(), Stop> {
        pairs.clear();
        let short = |x: Option<u8>| x.ok_or(Stop::Short);
        if short(cur.u8())? != b'}' {
            return Err(Stop::Decline);
        }
        if short(cur.peek())? == 0x94 {
            cur.i += 1;
            c.defs += 1;
        }
        if short(cur.peek())? != b'(' {
            return Err(Stop::Decline);
        }
        cur.i += 1;
        let mut same = true;
        loop {
            if short(cur.peek())? == b'u' {
                cur.i += 1;
                return Ok(());
            }
            if pairs.len() >= INDEX_AT {
                return Err(Stop::Decline);
            }
            let k = match self.value(cur, c)? {
                LVal::V(k @ Value::Str(_)) => k,
                _ => return Err(Stop::Decline),
            };
            // keys in the order of the last entry's (distinct) need no check against each other
            same = same && seen.keys.get(pairs.len()).is_some_and(|&x| same_key(x, k));
            if !same && pairs.iter().any(|p| same_key(p.0, k)) {
                return Err(Stop::Decline);
            }
            let v = self.value(cur, c)?;
            pairs.push((k, v));
        }
    }
    /// One value: a scalar, a string, or a memo fetch; then its MEMOIZE, if any.
    #[inline(always)]
    fn value(&self, cur: &mut Cur, c: &mut Chunk) -> Result<LVal, Stop> {
        let op = cur.peek().ok_or(Stop::Short)?;
        cur.i += 1;
        let s = Stop::Short;
        let v = match op {
            b'h' => self.fetch(u32::from(cur.u8().ok_or(s)?))?,
            b'j' => self.fetch(u32::from_le_bytes(cur.le().ok_or(s)?))?,
            b'K' => LVal::V(Value::Int(i64::from(cur.u8().ok_or(s)?))),
            b'M' => LVal::V(Value::Int(i64::from(u16::from_le_bytes(
                cur.le().ok_or(s)?,
            )))),
            b'J' => LVal::V(Value::Int(i64::from(i32::from_le_bytes(
                cur.le().ok_or(s)?,
            )))),
            0x8a => {
                let n = cur.u8().ok_or(Stop::Short)?;
                let b = cur.take(usize::from(n)).ok_or(Stop::Short)?;
                LVal::V(Value::Int(int_le(b).ok_or(Stop::Decline)?))
            }
            b'G' => LVal::V(Value::Float(super::super::F64Bits::new(
                f64::from_be_bytes(cur.le().ok_or(s)?),
            ))),
            b'N' => LVal::V(Value::None),
            0x88 => LVal::V(Value::Bool(true)),
            0x89 => LVal::V(Value::Bool(false)),
            0x8c | b'X' => {
                let n = if op == 0x8c {
                    usize::from(cur.u8().ok_or(Stop::Short)?)
                } else {
                    u32::from_le_bytes(cur.le().ok_or(Stop::Short)?) as usize
                };
                let b = cur.take(n).ok_or(Stop::Short)?;
                // as the driver: lone surrogates replaced; other bytes that are not UTF-8
                // are left to the driver, which refuses them where they are
                let s = super::super::py_str(b).ok_or(Stop::Decline)?.into_owned();
                c.strs.push(s);
                LVal::S(c.strs.len() as u32 - 1)
            }
            _ => return Err(Stop::Decline),
        };
        if cur.peek().ok_or(Stop::Short)? == 0x94 {
            cur.i += 1;
            c.vals.push((c.defs, v));
            c.defs += 1;
        }
        Ok(v)
    }

    /// A memo fetch: resolved now when the prefix made it (and it is a value no later opcode
    /// can have changed), else left for the splice.
    #[inline(always)]
    fn fetch(&self, i: u32) -> Result<LVal, Stop> {
        let Some(slot) = self.memo.get(i as usize) else {
            return Ok(LVal::Ref(i));
        };
        match *slot {
            Some(v @ (Value::Int(_) | Value::Str(_) | Value::None | Value::Bool(_))) => {
                Ok(LVal::V(v))
            }
            Some(v @ Value::Float(_)) => Ok(LVal::V(v)),
            // lists (a stack of frames), tuples, bytes: shared by identity, never made rows
            Some(v @ Value::Obj(id)) => match self.objs.get(id.0 as usize).map(|n| &n.data) {
                Some(Data::List(_) | Data::Records(_) | Data::Tuple(_)) => Ok(LVal::V(v)),
                Some(Data::Bytes(_) | Data::BigInt(_)) => Ok(LVal::V(v)),
                _ => Err(Stop::Decline),
            },
            _ => Err(Stop::Decline),
        }
    }

    /// Adds the entry in `pairs` to the chunk as a row of the projection's columns.
    fn commit(&self, c: &mut Chunk, pairs: &[(Value, LVal)], seen: &mut Seen) {
        let row = c.rows.rows;
        c.rows.rows += 1;
        let p = &mut c.rows;
        p.ints.extend(std::iter::repeat_n(NO_INT, self.ni));
        p.strs.extend(std::iter::repeat_n(NONE, self.ns));
        p.objs.extend(std::iter::repeat_n(NONE, self.no));
        // the slots of the keys, as for the last entry when its keys were the same
        if seen.keys.len() != pairs.len()
            || !pairs.iter().zip(&seen.keys).all(|(p, &k)| same_key(p.0, k))
        {
            seen.keys.clear();
            seen.keys.extend(pairs.iter().map(|p| p.0));
            seen.slots.clear();
            seen.slots.extend(pairs.iter().map(|p| {
                self.slots
                    .iter()
                    .position(|s| same_key(*s, p.0))
                    .map_or(u8::MAX, |x| x as u8)
            }));
        }
        for (&(_, l), &slot) in pairs.iter().zip(&seen.slots) {
            match l {
                LVal::V(v) if slot != u8::MAX => p.set(row as usize, usize::from(slot), v),
                LVal::V(_) => {}
                l => defer(&mut c.fix, row, slot, l),
            }
        }
    }
}
