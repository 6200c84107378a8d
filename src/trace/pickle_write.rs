//! A small pickle writer (protocol 4, no frames), re-exported by [`super::pickle`]: gpumem
//! writes PyTorch-style snapshots that Python's `pickle.load` and gpumem's reader both read.
//!
//! [`W::Shared`] is written once and memoized (MEMOIZE); later references to the same `Rc` are
//! BINGET/LONG_BINGET, so Python sees one object, as with PyTorch's shared `frames` lists. The
//! writer does not recurse (an explicit work stack), so deep values cannot overflow the stack.

use rustc_hash::FxHashMap;
use std::io::{self, Write};
use std::rc::Rc;

/// A value to write.
#[derive(Clone, Debug, PartialEq)]
pub enum W {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<W>),
    Tuple(Vec<W>),
    Dict(Vec<(W, W)>),
    /// Written once, then referenced by its memo index wherever the same `Rc` appears again.
    Shared(Rc<W>),
}

/// CPython's batch size for APPENDS/SETITEMS.
const BATCH: usize = 1000;

enum Task<'a> {
    Val(&'a W),
    Op(u8),
    /// Memoize the value just written, as the `Rc` at this address.
    Memo(*const W),
}

/// Writes `w` as a protocol 4 pickle.
pub fn write(w: &W, out: &mut impl Write) -> io::Result<()> {
    let mut buf: Vec<u8> = vec![0x80, 4];
    let mut memo: FxHashMap<*const W, u32> = FxHashMap::default();
    let mut todo = vec![Task::Val(w)];
    while let Some(t) = todo.pop() {
        if buf.len() >= 1 << 16 {
            out.write_all(&buf)?;
            buf.clear();
        }
        let w = match t {
            Task::Op(op) => {
                buf.push(op);
                continue;
            }
            Task::Memo(p) => {
                let n = u32::try_from(memo.len()).map_err(|_| io::Error::other("memo full"))?;
                memo.insert(p, n);
                buf.push(0x94); // MEMOIZE
                continue;
            }
            Task::Val(w) => w,
        };
        match w {
            W::None => buf.push(b'N'),
            W::Bool(b) => buf.push(if *b { 0x88 } else { 0x89 }),
            W::Int(i) => int(&mut buf, *i),
            W::Float(f) => {
                buf.push(b'G');
                buf.extend_from_slice(&f.to_be_bytes());
            }
            W::Str(s) => {
                let n = s.len();
                if n < 256 {
                    buf.extend_from_slice(&[0x8c, n as u8]);
                } else if let Ok(n) = u32::try_from(n) {
                    buf.push(b'X');
                    buf.extend_from_slice(&n.to_le_bytes());
                } else {
                    buf.push(0x8d);
                    buf.extend_from_slice(&(n as u64).to_le_bytes());
                }
                buf.extend_from_slice(s.as_bytes());
            }
            W::List(items) => {
                buf.push(b']');
                for chunk in items.chunks(BATCH).rev() {
                    todo.push(Task::Op(b'e'));
                    todo.extend(chunk.iter().rev().map(Task::Val));
                    todo.push(Task::Op(b'('));
                }
            }
            W::Dict(entries) => {
                buf.push(b'}');
                for chunk in entries.chunks(BATCH).rev() {
                    todo.push(Task::Op(b'u'));
                    for (k, v) in chunk.iter().rev() {
                        todo.push(Task::Val(v));
                        todo.push(Task::Val(k));
                    }
                    todo.push(Task::Op(b'('));
                }
            }
            W::Tuple(items) => match items.len() {
                0 => buf.push(b')'),
                n @ 1..=3 => {
                    todo.push(Task::Op(0x84 + n as u8)); // TUPLE1..TUPLE3
                    todo.extend(items.iter().rev().map(Task::Val));
                }
                _ => {
                    todo.push(Task::Op(b't'));
                    todo.extend(items.iter().rev().map(Task::Val));
                    todo.push(Task::Op(b'('));
                }
            },
            W::Shared(rc) => {
                let p = Rc::as_ptr(rc);
                match memo.get(&p) {
                    Some(&i) if i < 256 => buf.extend_from_slice(&[b'h', i as u8]),
                    Some(&i) => {
                        buf.push(b'j');
                        buf.extend_from_slice(&i.to_le_bytes());
                    }
                    None => {
                        todo.push(Task::Memo(p));
                        todo.push(Task::Val(rc));
                    }
                }
            }
        }
    }
    buf.push(b'.');
    out.write_all(&buf)
}

/// The smallest int opcode, as CPython chooses it.
fn int(buf: &mut Vec<u8>, i: i64) {
    if let Ok(b) = u8::try_from(i) {
        buf.extend_from_slice(&[b'K', b]);
    } else if let Ok(b) = u16::try_from(i) {
        buf.push(b'M');
        buf.extend_from_slice(&b.to_le_bytes());
    } else if let Ok(b) = i32::try_from(i) {
        buf.push(b'J');
        buf.extend_from_slice(&b.to_le_bytes());
    } else {
        // LONG1: minimal two's complement, little-endian.
        let b = i.to_le_bytes();
        let mut n = 8;
        while n > 1
            && ((b[n - 1] == 0 && b[n - 2] < 0x80) || (b[n - 1] == 0xff && b[n - 2] >= 0x80))
        {
            n -= 1;
        }
        buf.extend_from_slice(&[0x8a, n as u8]);
        buf.extend_from_slice(&b[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::super::pickle::{from_slice, Kind, Pickle, Value};
    use super::*;

    fn s(x: &str) -> W {
        W::Str(x.into())
    }

    /// A structure with the shapes of a snapshot: shared frames, rows, an odd row, big values.
    fn sample() -> W {
        let frames = Rc::new(W::List(vec![W::Dict(vec![
            (s("name"), s("forward")),
            (s("line"), W::Int(28)),
        ])]));
        let entry = |i: i64, action: &str| {
            W::Dict(vec![
                (s("action"), s(action)),
                (s("addr"), W::Int(0x7f00_0000_0000 + i)),
                (s("size"), W::Int(512 * i)),
                (s("frames"), W::Shared(frames.clone())),
            ])
        };
        let mut trace: Vec<W> = (0..1500).map(|i| entry(i, "alloc")).collect();
        trace.push(W::Dict(vec![
            (s("action"), s("oom")),
            (s("device_free"), W::Int(7)),
        ]));
        trace.push(W::Int(3));
        W::Dict(vec![
            (s("trace"), W::List(trace)),
            (s("frames_again"), W::Shared(frames.clone())),
            (s("t"), W::Tuple(vec![W::Int(0), W::Int(0)])),
            (s("t5"), W::Tuple((0..5).map(W::Int).collect())),
            (
                s("ints"),
                W::List(
                    [0, 255, 256, 65535, 65536, -1, i64::MIN, i64::MAX, 1 << 40]
                        .map(W::Int)
                        .to_vec(),
                ),
            ),
            (
                s("misc"),
                W::List(vec![
                    W::None,
                    W::Bool(true),
                    W::Bool(false),
                    W::Float(-2.5),
                    s(&"é".repeat(200)),
                ]),
            ),
        ])
    }

    /// The JSON Python's json.dumps gives for the same data (tuples as lists).
    fn to_json(p: &Pickle, v: Value) -> serde_json::Value {
        use serde_json::Value as J;
        match p.kind(v) {
            Kind::None => J::Null,
            Kind::Bool => J::Bool(p.bool(v).unwrap()),
            Kind::Int => J::from(p.int(v).unwrap()),
            Kind::Float => J::from(p.float(v).unwrap()),
            Kind::Str => J::from(p.str(v).unwrap()),
            Kind::List | Kind::Tuple => J::Array(p.items(v).map(|x| to_json(p, x)).collect()),
            Kind::Dict => J::Object(
                p.entries(v)
                    .map(|(k, x)| (p.str(k).unwrap().to_string(), to_json(p, x)))
                    .collect(),
            ),
            Kind::Bytes | Kind::BigInt => unreachable!(),
        }
    }

    #[test]
    fn writer_round_trips_through_the_reader_with_sharing() {
        let mut out = Vec::new();
        write(&sample(), &mut out).unwrap();
        let p = from_slice(&out).unwrap();
        let r = p.root();
        let trace = p.get(r, "trace").unwrap();
        assert_eq!(p.len(trace), Some(1502));
        let e = p.item(trace, 1499).unwrap();
        assert!(
            matches!(e, Value::Row(..)),
            "same-keyed dicts are stored as rows"
        );
        assert_eq!(
            p.get(e, "addr").and_then(|v| p.int(v)),
            Some(0x7f00_0000_0000 + 1499)
        );
        assert_eq!(
            p.str(p.get(p.item(trace, 1500).unwrap(), "action").unwrap()),
            Some("oom")
        );
        assert_eq!(p.item(trace, 1501), Some(Value::Int(3)));
        let frames = p.get(e, "frames").unwrap();
        assert_eq!(
            Some(frames),
            p.get(r, "frames_again"),
            "Shared is one object"
        );
        assert_eq!(p.get(p.item(trace, 0).unwrap(), "frames"), Some(frames));
        assert_eq!(p.kind(p.get(r, "t").unwrap()), Kind::Tuple);
        let ints: Vec<i64> = p
            .items(p.get(r, "ints").unwrap())
            .filter_map(|v| p.int(v))
            .collect();
        assert_eq!(
            ints,
            [0, 255, 256, 65535, 65536, -1, i64::MIN, i64::MAX, 1 << 40]
        );
        // Written once: the shared list's name appears once in the bytes.
        assert_eq!(out.windows(7).filter(|w| w == b"forward").count(), 1);
    }

    #[test]
    fn python_reads_what_the_writer_writes() {
        let path =
            std::env::temp_dir().join(format!("gpumem-pickle-w-{}.pickle", std::process::id()));
        let mut out = Vec::new();
        write(&sample(), &mut out).unwrap();
        std::fs::write(&path, &out).unwrap();
        let script = "import pickle,sys,json; d=pickle.load(open(sys.argv[1],'rb')); \
                      assert d['frames_again'] is d['trace'][0]['frames'] is d['trace'][1499]['frames']; \
                      print(json.dumps(d))";
        let run = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(&path)
            .output();
        let _ = std::fs::remove_file(&path);
        let Ok(run) = run else {
            eprintln!("python3 not found: skipping");
            return;
        };
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let py: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
        let p = from_slice(&out).unwrap();
        assert_eq!(py, to_json(&p, p.root()));
    }

    #[test]
    fn ints_use_the_smallest_opcode() {
        let enc = |i| {
            let mut b = Vec::new();
            int(&mut b, i);
            b
        };
        assert_eq!(enc(5), [b'K', 5]);
        assert_eq!(enc(300), [b'M', 44, 1]);
        assert_eq!(enc(-1), [b'J', 255, 255, 255, 255]);
        assert_eq!(enc(1 << 31), [0x8a, 5, 0, 0, 0, 0x80, 0]);
        assert_eq!(enc(-(1 << 31) - 1), [0x8a, 5, 0xff, 0xff, 0xff, 0x7f, 0xff]);
    }
}
