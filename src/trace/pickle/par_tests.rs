//! The parallel reader's tests.

use super::worker::{op_len, Cur};
use super::*;
use proptest::prelude::*;

/// Bytes a worker may meet: mostly the opcodes of a trace entry (FRAME among them), any
/// byte sometimes.
fn bytes() -> impl Strategy<Value = Vec<u8>> {
    let op = prop_oneof![
        4 => prop::sample::select(vec![
            0x95u8, b'}', 0x94, b'(', b'u', b'e', b'h', b'j', b'K', b'M', b'J', 0x8a, b'N',
            0x8c, b'X', 0x8d, b'G',
        ]),
        1 => any::<u8>(),
    ];
    prop::collection::vec(op, 4096..6000)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Whatever the bytes, the worker's decoders and its walk to a first entry end (with
    /// a value or with `None`) and never read out of bounds or overflow, with and without
    /// a last entry's keys to match.
    #[test]
    fn worker_decoders_never_panic(b in bytes(), keys in 0usize..4) {
        let file = File::open(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
        let memo: Vec<Option<Value>> = (0..300)
            .map(|i| Some(if i % 2 == 0 { Value::Str(StrId(i)) } else { Value::Int(i64::from(i)) }))
            .collect();
        let ctx = Ctx {
            file: &file,
            len: b.len() as u64,
            memo_ok: vec![true; memo.len()],
            memo: &memo,
            objs: &[],
            slots: vec![Value::Str(StrId(0)), Value::Str(StrId(2))],
            detect: Value::Str(StrId(0)),
            ni: 1,
            ns: 1,
            no: 0,
        };
        let seen = Seen {
            keys: (0..keys as u32).map(|k| Value::Str(StrId(2 * k))).collect(),
            slots: (0..keys as u8).collect(),
        };
        let mut c = Chunk::default();
        c.rows.ni = 1;
        c.rows.ns = 1;
        // FRAME opcodes with no end in sight, from the start and inside an entry
        let frames = vec![0x95u8; 5000];
        prop_assert!(ctx.fast_entry(&frames, &mut c, &seen).is_none());
        let mut inside = vec![b'}', 0x94, b'('];
        inside.extend_from_slice(&frames);
        prop_assert!(ctx.fast_entry(&inside, &mut c, &seen).is_none());
        for start in [0, 1, 9, 100] {
            let _ = ctx.fast_entry(&b[start..], &mut c, &seen);
            let mut cur = Cur { b: &b, i: start };
            let _ = ctx.entry(&mut cur, &mut c, &mut Vec::new(), &seen);
            let mut i = start;
            while i < b.len() {
                match op_len(&Cur { b: &b, i }).and_then(|n| i.checked_add(n)) {
                    Some(j) => i = j,
                    None => break,
                }
            }
        }
    }
}

/// A FRAME header whose length would overflow ends the frame index instead.
#[test]
fn a_huge_frame_length_ends_the_index() {
    let dir = std::env::temp_dir().join(format!("gpumem-frames-{}", std::process::id()));
    let mut b = vec![0x80, 4, 0x95];
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    b.extend_from_slice(b"N.");
    std::fs::write(&dir, &b).unwrap();
    let f = File::open(&dir).unwrap();
    assert_eq!(frame_index(&f, b.len() as u64), vec![2]);
    std::fs::remove_file(&dir).unwrap();
}
