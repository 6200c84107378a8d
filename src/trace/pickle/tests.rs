use super::*;
use proptest::prelude::*;
use serde_json::{json, Value as J};
use std::io;

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
    assert_eq!(
        e.to_string(),
        "at byte 11: truncated pickle: the data ends inside opcode BINUNICODE8 (0x8d) at byte 2"
    );
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
    let p =
        from_slice(b"\x80\x04}\x94(\x8c\x01a\x94]\x94\x8c\x01b\x94h\x02uh\x02K\x07a0.").unwrap();
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

/// CPython's unpickler decodes strs as UTF-8 with "surrogatepass": the lone surrogates its
/// pickler writes come back, any other byte that is not UTF-8 is a UnicodeDecodeError.
#[test]
fn strings_that_are_not_utf8_are_refused_as_python_refuses_them() {
    // 'a\ud800b', as pickle.dumps writes it
    let p = from_slice(b"\x80\x04\x8c\x05a\xed\xa0\x80b\x94.").expect("a lone surrogate");
    assert_eq!(p.str(p.root()), Some("a\u{fffd}\u{fffd}\u{fffd}b"));
    for bad in [
        &b"\x80\x04\x8c\x02\xff\xfe."[..],
        b"\x80\x04X\x03\x00\x00\x00ab\xc3.",
        b"\x80\x04\x8c\x03\xed\x9f\x00.",
        b"\x80\x04\x8c\x04\xed\xa0\x80\xc0.",
    ] {
        assert!(err(bad).message.contains("not UTF-8"), "{}", hex(bad));
    }
    assert_eq!(super::py_str(b"\xed\xbf\xbf").map(|s| s.len()), Some(9));
    assert_eq!(
        super::py_str(b"ok\xf0\x9f\x98\x80").as_deref(),
        Some("ok\u{1f600}")
    );
}
