//! Issue 6: `gpumem summary` on real PyTorch snapshots (pickle and JSON) and gpumem's own,
//! the safe unpickler's refusals, what-if replay, export to memory_viz and Perfetto (read
//! back), and `gpumem diff`.

use std::path::{Path, PathBuf};

mod common;
use common::{at_root, gpumem, root, run_json, u, Scratch};
use serde_json::Value;

fn expected() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(root().join("fixtures/snapshots/expected.json")).unwrap(),
    )
    .unwrap()
}

/// The state each real snapshot holds, as PyTorch's own `_memory_viz stats` sums it
/// (fixtures/snapshots/expected.json, computed with Python's pickle).
#[test]
fn issue6_real_pytorch_snapshots_summarize_to_pytorchs_own_figures() {
    let exp = expected();
    for (file, e) in exp["files"].as_object().unwrap() {
        let p = format!("fixtures/snapshots/{file}");
        let (code, v) = run_json(&["summary", &p]);
        assert_eq!(code, Some(0), "{file}");
        assert_eq!(v["format"], "torch_pickle");
        assert_eq!(v["segments"], e["segments"], "{file}");
        assert_eq!(v["reserved_bytes"], e["total_reserved"], "{file}");
        assert_eq!(v["allocated_bytes"], e["allocated_bytes"], "{file}");
        assert_eq!(
            v["requested_bytes"], e["total_allocated_requested"],
            "{file}"
        );
        assert_eq!(v["fragmentation"]["external"], e["free_external"], "{file}");
        assert_eq!(v["fragmentation"]["internal"], e["free_internal"], "{file}");
        assert_eq!(u(&v["trace"]["entries"]), u(&e["trace_entries"]), "{file}");
        assert_eq!(v["trace"]["allocs"], e["actions"]["alloc"], "{file}");
        assert_eq!(v["iterations_from"], "annotations", "{file}");
        // the process that wrote the snapshot measured its own peaks: the peak over the trace
        // equals its max_memory_reserved() to the byte, and max_memory_allocated() to the byte
        // or, where blocks from before the trace hide an unsplit remainder, within 0.01%
        if let Some(p) = e.get("same_process") {
            assert_eq!(v["trace"]["iterations"], p["iterations"], "{file}");
            assert_eq!(
                v["trace"]["peak_reserved_bytes"], p["max_memory_reserved"],
                "{file}"
            );
            let (ours, theirs) = (
                u(&v["peak_allocated_bytes"]) as f64,
                u(&p["max_memory_allocated"]) as f64,
            );
            assert!(
                (ours - theirs).abs() <= theirs * 1e-4,
                "{file}: {ours} vs {theirs}"
            );
        }
        let leaks = v["leaks"].as_array().unwrap();
        if file.contains("leak") {
            // the loss kept every iteration: one 512-byte block, as PyTorch's own figures grow
            assert_eq!(leaks.len(), 1, "{file}");
            assert_eq!(u(&leaks[0]["bytes_per_iteration"]), 512);
            assert_eq!(leaks[0]["first_iteration"], 0);
        } else {
            assert!(leaks.is_empty(), "{file}: {leaks:?}");
        }
    }
    // exact where the trace holds every block's segment
    for file in ["snapshot_mlp_adam.pickle", "snapshot_mlp_leak.pickle"] {
        let p = format!("fixtures/snapshots/{file}");
        let (_, v) = run_json(&["summary", &p]);
        assert_eq!(
            v["peak_allocated_bytes"], exp["files"][file]["same_process"]["max_memory_allocated"],
            "{file}"
        );
    }
    // sites are Python frames, innermost first
    let out = at_root(&["summary", "fixtures/snapshots/snapshot_mlp_adam.pickle"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("adam.py:"), "{text}");
    assert!(text.contains("fragmentation in the snapshot"));
    assert!(
        !text.contains("[C++]"),
        "C++ frames are folded without --stacks"
    );
    let out = at_root(&[
        "summary",
        "fixtures/snapshots/snapshot_mlp_adam.pickle",
        "--stacks",
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("[C++]"));
}

#[test]
fn issue6_the_same_snapshot_as_json_reads_the_same() {
    let s = Scratch::new("json");
    let j = s.path("snap.json");
    gpumem()
        .current_dir(root())
        .args([
            "export",
            "fixtures/snapshots/snapshot_gpt_tiny_math_adam.pickle",
            "--to",
            "torch-json",
            "-o",
        ])
        .arg(&j)
        .assert()
        .success();
    let (_, a) = run_json(&[
        "summary",
        "fixtures/snapshots/snapshot_gpt_tiny_math_adam.pickle",
    ]);
    let (_, b) = run_json(&["summary", j.to_str().unwrap()]);
    assert_eq!(b["format"], "torch_json");
    for k in [
        "reserved_bytes",
        "allocated_bytes",
        "segments",
        "peak_allocated_bytes",
        "fragmentation",
        "live_by_site",
        "trace",
    ] {
        assert_eq!(a[k], b[k], "{k}");
    }
    // a PyTorch snapshot dict written by hand, as JSON
    let tiny = s.path("tiny.json");
    std::fs::write(
        &tiny,
        r#"{"segments": [{"device": 0, "address": 1048576, "total_size": 2097152, "stream": 0,
            "segment_type": "small", "is_expandable": false,
            "blocks": [{"address": 1048576, "size": 1024, "requested_size": 1000, "state": "active_allocated", "frames": []},
                       {"address": 1049600, "size": 2096128, "requested_size": 0, "state": "inactive", "frames": []}]}],
            "device_traces": [[]]}"#,
    )
    .unwrap();
    let (code, v) = run_json(&["summary", tiny.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert_eq!(
        (
            u(&v["reserved_bytes"]),
            u(&v["allocated_bytes"]),
            u(&v["requested_bytes"])
        ),
        (2 << 20, 1024, 1000)
    );
    assert!(v["peak_allocated_bytes"].is_null());
}

#[test]
fn issue6_unsafe_or_broken_pickles_are_refused_and_do_nothing() {
    let s = Scratch::new("evil");
    let real = std::fs::read(root().join("fixtures/snapshots/snapshot_mlp_adam.pickle")).unwrap();
    let mut cases: Vec<(String, PathBuf)> = vec![
        // os.system via __reduce__, and a class instance (NEWOBJ + BUILD)
        (
            "reduce".into(),
            root().join("fixtures/pickle/evil_reduce.pickle"),
        ),
        (
            "instance".into(),
            root().join("fixtures/pickle/instance.pickle"),
        ),
    ];
    let mut write = |name: &str, bytes: Vec<u8>| {
        let p = s.path(name);
        std::fs::write(&p, bytes).unwrap();
        cases.push((name.to_string(), p));
    };
    write("truncated.pickle", real[..real.len() / 2].to_vec());
    // BINUNICODE8 claiming 2^60 bytes, then nothing
    let mut huge = vec![0x80, 4, 0x8d];
    huge.extend_from_slice(&(1u64 << 60).to_le_bytes());
    write("huge.pickle", huge);
    // a list nested a million deep
    let mut deep = vec![0x80, 2];
    deep.extend(std::iter::repeat_n(b']', 1_000_000));
    deep.extend(std::iter::repeat_n(b'a', 999_999));
    deep.push(b'.');
    write("deep.pickle", deep);
    write("garbage.pickle", vec![0x80, 4, 0xff, 0xfe, 0x00, 0x13]);
    for (name, p) in &cases {
        let out = gpumem().arg("summary").arg(p).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("pickle") && !err.contains("panicked"),
            "{name}: {err}"
        );
        assert!(out.stdout.is_empty(), "{name}");
    }
    assert!(!Path::new("/tmp/pwned").exists(), "a payload ran");
}

#[test]
fn issue6_what_if_replay_shows_expandable_segments_would_have_saved_the_run() {
    let s = Scratch::new("whatif");
    let snap = s.path("frag.json");
    gpumem()
        .current_dir(root())
        .args([
            "run",
            "fixtures/workloads/fragmentation_oom.toml",
            "--no-remedies",
            "--snapshot",
        ])
        .arg(&snap)
        .assert()
        .success();
    let p = snap.to_str().unwrap();
    // as recorded: the OOM happens again
    let (code, v) = run_json(&["replay", p]);
    assert_eq!(code, Some(1));
    assert_eq!(
        (u(&v["original"]["ooms"]), u(&v["replayed"]["ooms"])),
        (1, 1)
    );
    assert_eq!(
        v["original"]["peak_reserved"],
        v["replayed"]["peak_reserved"]
    );
    // with expandable segments it does not
    let (code, v) = run_json(&["replay", p, "--alloc-conf", "expandable_segments:True"]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(u(&v["replayed"]["ooms"]), 0);
    assert_eq!(v["ooms_avoided"].as_array().unwrap().len(), 1);
    // ... and the replayed peak is what running the workload with that setting gives
    let (_, run) = run_json(&[
        "run",
        "fixtures/workloads/fragmentation_oom.toml",
        "--no-remedies",
        "--alloc-conf",
        "expandable_segments:True",
    ]);
    assert_eq!(v["replayed"]["peak_reserved"], run["peak"]["peak_reserved"]);
    let out = gpumem()
        .args(["replay", p, "--alloc-conf", "expandable_segments:True"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("verdict: yes"));
    // a real PyTorch snapshot replayed with its own settings reserves what PyTorch reserved
    let (code, v) = run_json(&[
        "replay",
        "fixtures/snapshots/snapshot_mlp_adam.pickle",
        "--capacity",
        "139GiB",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(u(&v["original"]["peak_reserved"]), 2_673_868_800);
    assert_eq!(u(&v["replayed"]["peak_reserved"]), 2_673_868_800);
    // without a capacity a PyTorch snapshot without OOMs cannot say how big its device was:
    // the replay has no limit and says so (issue 15)
    let out = at_root(&["replay", "fixtures/snapshots/snapshot_mlp_adam.pickle"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("no memory limit") && text.contains("--capacity"),
        "{text}"
    );
}

#[test]
fn issue6_exports_read_back_and_keep_the_figures() {
    let s = Scratch::new("export");
    let run = s.path("run.json");
    gpumem()
        .current_dir(root())
        .args([
            "run",
            "fixtures/workloads/presets/mlp_adam.toml",
            "--snapshot",
        ])
        .arg(&run)
        .assert()
        .success();
    let (_, orig) = run_json(&["summary", run.to_str().unwrap()]);
    assert_eq!(orig["format"], "gpumem");
    for (to, file) in [
        ("memory-viz", "viz.pickle"),
        ("perfetto", "trace.json"),
        ("torch-json", "t.json"),
    ] {
        let f = s.path(file);
        gpumem()
            .args(["export", run.to_str().unwrap(), "--to", to, "-o"])
            .arg(&f)
            .assert()
            .success();
        if to == "perfetto" {
            // counters only, no copy of the snapshot: refused as a snapshot, saying what it is
            let out = gpumem().arg("summary").arg(&f).output().unwrap();
            assert_eq!(out.status.code(), Some(2));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("Perfetto"), "{err}");
            continue;
        }
        let (code, back) = run_json(&["summary", f.to_str().unwrap()]);
        assert_eq!(code, Some(0), "{to}");
        for k in [
            "reserved_bytes",
            "allocated_bytes",
            "requested_bytes",
            "segments",
            "peak_allocated_bytes",
        ] {
            assert_eq!(back[k], orig[k], "{to}: {k}");
        }
    }
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(s.path("trace.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let counters: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "allocated by category")
        .collect();
    assert!(!counters.is_empty());
    let last = counters.last().unwrap();
    for c in ["parameter", "optimizer_state"] {
        assert!(last["args"][c].as_u64().unwrap() > 0, "{c}: {last}");
    }
    assert!(events
        .iter()
        .any(|e| e["ph"] == "C" && e["name"] == "reserved"));
    assert!(events
        .iter()
        .any(|e| e["ph"] == "i" && e["name"] == "iter 1"));
}

#[test]
fn issue6_diff_shows_what_grew_and_why() {
    let (code, v) = run_json(&[
        "diff",
        "fixtures/workloads/presets/mlp_sgd.toml",
        "fixtures/workloads/presets/mlp_adam.toml",
    ]);
    assert_eq!(code, Some(0));
    let d = &v["diff"];
    let total = |name: &str| {
        d["totals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap()
    };
    let peak = total("peak allocated");
    assert_eq!(u(&peak["a"]), 1_087_648_768, "mlp_sgd's peak (PyTorch's)");
    assert_eq!(u(&peak["b"]), 2_584_629_248, "mlp_adam's peak (PyTorch's)");
    // Adam's two states are the biggest change at the peak
    let cats = d["categories_at_peak"].as_array().unwrap();
    assert_eq!(cats[0]["name"], "optimizer_state", "{cats:?}");
    assert_eq!(u(&cats[0]["a"]), 0);
    let out = at_root(&[
        "diff",
        "fixtures/workloads/presets/mlp_sgd.toml",
        "fixtures/workloads/presets/mlp_adam.toml",
        "--markdown",
    ]);
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(
        md.starts_with("### GPU memory: peak allocated 1.01 GiB → 2.41 GiB"),
        "{md}"
    );
    assert!(md.contains("|---|---:|---:|---:|---:|"));
    // (markdown escapes the underscore, which GitHub shows as written)
    assert!(md.contains("| optimizer\\_state | 0 B |"), "{md}");
}

/// Without annotations, iterations come from the trace repeating itself: the mlp_leak
/// snapshot with its `external_annotations` removed still shows 5 iterations and the leak.
#[test]
fn issue6_iterations_from_repetition_find_the_leak_without_annotations() {
    let s = Scratch::new("repetition");
    let j = s.path("snap.json");
    gpumem()
        .current_dir(root())
        .args([
            "export",
            "fixtures/snapshots/snapshot_mlp_leak.pickle",
            "--to",
            "torch-json",
            "-o",
        ])
        .arg(&j)
        .assert()
        .success();
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("external_annotations");
    let bare = s.path("bare.json");
    std::fs::write(&bare, serde_json::to_vec(&v).unwrap()).unwrap();
    let (code, out) = run_json(&["summary", bare.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert_eq!(out["iterations_from"], "repetition");
    assert_eq!(out["trace"]["iterations"], 5);
    let leaks = out["leaks"].as_array().unwrap();
    assert_eq!(leaks.len(), 1, "{leaks:?}");
    assert_eq!(u(&leaks[0]["bytes_per_iteration"]), 512);
}

/// `gpumem plot` on a PyTorch snapshot: memory walked back from the end state, stacked by the
/// sites holding most at the peak, the peak where the process had it.
#[test]
fn issue6_plot_draws_a_pytorch_snapshot_by_site() {
    let s = Scratch::new("plot");
    let svg = s.path("t.svg");
    gpumem()
        .current_dir(root())
        .args(["plot", "fixtures/snapshots/snapshot_mlp_adam.pickle", "-o"])
        .arg(&svg)
        .assert()
        .success();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains(r#"data-series="(allocated before the trace started)""#));
    assert!(text.contains(r#"data-series="adam.py:182:_init_group""#));
    assert!(text.contains(r#"data-label="iter 2""#));
    // 2,584,629,248 bytes: the process's max_memory_allocated()
    assert!(text.contains("peak 2.41 GiB"));
}

/// The parallel reader (frames cut into chunks, entries decoded on several cores, or on one)
/// gives what the sequential one gives: the same events, times, stacks, segments and
/// annotations for a trace grown from a real one (`grow_snapshot.py
/// fixtures/snapshots/snapshot_mlp_leak.pickle ... 8`, 7,279 entries in 10 frames) and for
/// every real snapshot; and it does take chunks.
#[test]
fn issue6_the_parallel_reader_reads_what_the_sequential_one_reads() {
    let grown = root().join("fixtures/snapshots/grown_mlp_leak_x8.pickle");
    let mut files = vec![grown.clone()];
    for e in std::fs::read_dir(root().join("fixtures/snapshots")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "pickle") && p != grown {
            files.push(p);
        }
    }
    for f in &files {
        // pieces larger than half the file: the sequential reader
        let one = gpumem::snapshot::load_with(f, 1, Some(u64::MAX)).unwrap();
        for (threads, chunk) in [(4, 64 << 10), (4, 200 << 10), (1, 64 << 10)] {
            let par = gpumem::snapshot::load_with(f, threads, Some(chunk)).unwrap();
            let at = format!("{} in pieces of {chunk} on {threads} cores", f.display());
            assert_eq!(one.events.len(), par.events.len(), "{at}");
            for (i, (a, b)) in one.events.iter().zip(&par.events).enumerate() {
                assert_eq!(
                    (a.kind(), a.addr, a.size(), a.stream),
                    (b.kind(), b.addr, b.size(), b.stream),
                    "{at}: event {i}"
                );
                // stacks are numbered in another order: compare them by their tags
                assert_eq!(
                    one.tags.resolve(a.stack),
                    par.tags.resolve(b.stack),
                    "{at}: event {i}"
                );
            }
            assert_eq!(one.times, par.times, "{at}");
            assert_eq!(one.segments.len(), par.segments.len(), "{at}");
            assert_eq!(one.skipped, par.skipped, "{at}");
            assert_eq!(one.annotations.len(), par.annotations.len(), "{at}");
            assert_eq!(one.iterations, par.iterations, "{at}");
        }
    }
    // the grown trace's entries were read by the workers, not by the driver
    let file = std::fs::File::open(&grown).unwrap();
    let p =
        gpumem::trace::pickle::read_file(&file, 4, 64 << 10, Some(&gpumem::snapshot::TRACE), None)
            .unwrap();
    let seq = gpumem::trace::pickle::read(std::fs::File::open(&grown).unwrap()).unwrap();
    let list = |p: &gpumem::trace::pickle::Pickle| {
        let t = p.get(p.root(), "device_traces").unwrap();
        p.item(t, 0).unwrap()
    };
    let runs = p.projected(list(&p));
    let rows: usize = runs.iter().map(|r| r.1.rows()).sum();
    assert!(runs.len() >= 5, "chunks taken: {}", runs.len());
    assert!(rows > 6000, "rows read by workers: {rows}");
    assert_eq!(
        p.len(list(&p)).unwrap() + rows,
        seq.len(list(&seq)).unwrap(),
        "every entry once"
    );
}

/// Broken input gives the same refusal whichever reader meets it (the parallel one hands
/// anything unusual to the sequential one, whose message is the canonical one).
#[test]
fn issue6_a_truncated_large_pickle_is_refused_the_same_way_in_parallel() {
    let tmp = Scratch::new("par-trunc");
    let bytes = std::fs::read(root().join("fixtures/snapshots/grown_mlp_leak_x8.pickle")).unwrap();
    for cut in [bytes.len() / 2, bytes.len() - 3, 300_001] {
        let p = tmp.path(&format!("cut{cut}.pickle"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let one = gpumem::snapshot::load_with(&p, 1, None)
            .unwrap_err()
            .to_string();
        let par = gpumem::snapshot::load_with(&p, 4, Some(64 << 10))
            .unwrap_err()
            .to_string();
        assert!(one.contains("truncated"), "{one}");
        assert_eq!(one, par);
        let o = gpumem()
            .args(["summary", p.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains(&one));
    }
}

/// A memo fetch of an entry never stored, in the value of a key the parallel reader does not
/// keep (`compile_context`), was accepted on several cores and refused on one (issue 16).
#[test]
#[allow(clippy::err_expect)] // expect_err would print the whole snapshot
fn issue16_a_memo_fetch_never_stored_is_refused_by_both_readers() {
    let tmp = Scratch::new("par-memo");
    let mut bytes =
        std::fs::read(root().join("fixtures/snapshots/grown_mlp_leak_x8.pickle")).unwrap();
    // `compile_context` is memo entry 444 in this file: its key fetched, then its value
    let key = [b'j', 0xbc, 0x01, 0x00, 0x00, b'j'];
    let at = bytes
        .windows(key.len())
        .rposition(|w| w == key)
        .expect("a compile_context value fetched from the memo");
    assert!(at > bytes.len() / 2, "in a worker's chunk");
    bytes[at + 6..at + 10].copy_from_slice(&0x7fff_fff0u32.to_le_bytes());
    let p = tmp.path("bad_memo.pickle");
    std::fs::write(&p, &bytes).unwrap();
    let one = gpumem::snapshot::load_with(&p, 1, None)
        .err()
        .expect("refused on one core")
        .to_string();
    let par = gpumem::snapshot::load_with(&p, 4, Some(64 << 10))
        .err()
        .expect("refused on four cores")
        .to_string();
    assert!(one.contains("memo"), "{one}");
    assert_eq!(one, par);
}

/// A protocol 4 pickle as CPython frames it: `body` cut into FRAMEs of about 64 KiB at the
/// opcode boundaries given (`cuts`, offsets into `body`).
fn framed(body: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut out = vec![0x80, 4];
    let mut start = 0;
    for &c in cuts.iter().chain([&body.len()]) {
        if c - start >= 64 << 10 || c == body.len() {
            out.push(0x95);
            out.extend_from_slice(&((c - start) as u64).to_le_bytes());
            out.extend_from_slice(&body[start..c]);
            start = c;
        }
    }
    out
}

/// A snapshot whose trace (6,000 entries, about 500 KB in FRAMEs) gives each entry a string of
/// its own in `user_metadata`, written as CPython writes it (every container and new str
/// memoized, a str seen before fetched from the memo); entry `bad` gets bytes that are not
/// UTF-8 there, and entry 10 an encoded lone surrogate, which CPython writes and reads back
/// ("surrogatepass").
fn snapshot_with_strings(bad: Option<usize>) -> Vec<u8> {
    struct P {
        b: Vec<u8>,
        memo: std::collections::HashMap<Vec<u8>, u32>,
        n: u32,
    }
    impl P {
        fn memoize(&mut self) {
            self.b.push(0x94);
            self.n += 1;
        }
        fn op(&mut self, op: u8) {
            self.b.push(op);
            if op == b'}' || op == b']' {
                self.memoize();
            }
        }
        fn s(&mut self, t: &[u8]) {
            if let Some(&i) = self.memo.get(t) {
                self.b.push(b'j');
                self.b.extend_from_slice(&i.to_le_bytes());
                return;
            }
            self.b.push(0x8c);
            self.b.push(t.len() as u8);
            self.b.extend_from_slice(t);
            self.memo.insert(t.to_vec(), self.n);
            self.memoize();
        }
    }
    let mut p = P {
        b: Vec::new(),
        memo: Default::default(),
        n: 0,
    };
    p.op(b'}');
    p.op(b'(');
    p.s(b"segments");
    p.op(b']');
    p.s(b"device_traces");
    p.op(b']');
    p.op(b']');
    let mut cuts = Vec::new();
    for i in 0..6000usize {
        cuts.push(p.b.len());
        // APPENDS in batches of 1,000, as CPython writes them
        if i % 1000 == 0 {
            if i > 0 {
                p.op(b'e');
            }
            p.op(b'(');
        }
        p.op(b'}');
        p.op(b'(');
        p.s(b"action");
        p.s(if i % 2 == 0 {
            b"alloc"
        } else {
            b"free_completed"
        });
        p.s(b"addr");
        p.op(b'J');
        p.b.extend_from_slice(&(0x1000_0000 + 512 * (i as i32 / 2)).to_le_bytes());
        p.s(b"size");
        p.b.extend_from_slice(b"M\x00\x02");
        p.s(b"stream");
        p.b.extend_from_slice(b"K\x00");
        p.s(b"frames");
        // one (empty) stack, shared by every entry, as in a snapshot of one call site
        match p.memo.get(&b"[]"[..]) {
            Some(&at) => {
                p.b.push(b'j');
                p.b.extend_from_slice(&at.to_le_bytes());
            }
            None => {
                let at = p.n;
                p.memo.insert(b"[]".to_vec(), at);
                p.op(b']');
            }
        }
        p.s(b"user_metadata");
        let mut text = format!("entry {i:05}").into_bytes();
        if i == 10 {
            text.extend_from_slice(b"\xed\xa0\x80");
        }
        if Some(i) == bad {
            text[0] = 0xff;
        }
        p.s(&text);
        p.op(b'u');
    }
    cuts.push(p.b.len());
    p.b.extend_from_slice(b"eau.");
    framed(&p.b, &cuts)
}

/// Python's unpickler refuses a str that is not UTF-8 (UnicodeDecodeError) but reads back the
/// lone surrogates it writes itself: so do both of gpumem's readers, with the same result.
#[test]
fn issue16_a_string_that_is_not_utf8_is_refused_by_both_readers() {
    let tmp = Scratch::new("par-utf8");
    let good = tmp.path("good.pickle");
    std::fs::write(&good, snapshot_with_strings(None)).unwrap();
    let one = gpumem::snapshot::load_with(&good, 1, None).expect("read on one core");
    let par = gpumem::snapshot::load_with(&good, 4, Some(4 << 10)).expect("read on four");
    assert_eq!(one.events.len(), 6000);
    assert_eq!(format!("{one:?}"), format!("{par:?}"));
    // in a worker's chunk, and in the driver's first frame
    for bad in [4500, 3] {
        let p = tmp.path(&format!("bad{bad}.pickle"));
        std::fs::write(&p, snapshot_with_strings(Some(bad))).unwrap();
        let one = gpumem::snapshot::load_with(&p, 1, None)
            .expect_err("refused on one core")
            .to_string();
        let par = gpumem::snapshot::load_with(&p, 4, Some(4 << 10))
            .expect_err("refused on four cores")
            .to_string();
        assert!(one.contains("not UTF-8"), "{one}");
        assert_eq!(one, par);
    }
}
